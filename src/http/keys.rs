//! API keys: `Authorization: Bearer <token>`, where the config holds only
//! the token's SHA-256 (`[[user]] api_key_hash`). Every account's hash is
//! compared in constant time, so the time taken says nothing about which
//! bytes matched.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::auth::{Account, Submitter};

/// An account with a token, and whether it is an operator's
/// (`role = "operator"`: every workspace's messages).
pub struct KeyedAccount {
    pub hash: [u8; 32],
    pub account: Arc<Account>,
    pub operator: bool,
}

pub struct ApiKeys {
    accounts: Vec<KeyedAccount>,
}

/// Who made a request.
#[derive(Clone)]
pub struct Caller {
    pub submitter: Submitter,
    pub operator: bool,
}

impl Caller {
    /// The workspace whose messages the caller may see and act on; `None`:
    /// every workspace (an operator).
    pub fn scope(&self) -> Option<&str> {
        (!self.operator).then(|| self.submitter.workspace())
    }
}

impl ApiKeys {
    pub fn new(accounts: Vec<KeyedAccount>) -> Self {
        Self { accounts }
    }

    /// The account whose token this is.
    pub fn caller(&self, token: &str) -> Option<Caller> {
        let hash: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for keyed in &self.accounts {
            if constant_time_eq(&keyed.hash, &hash) {
                found = Some(keyed);
            }
        }
        found.map(|k| Caller {
            submitter: Submitter::Account(k.account.clone()),
            operator: k.operator,
        })
    }
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A new token (256 random bits, URL-safe base64 with a prefix that says
/// what it is) and its hash for the config.
pub fn new_token() -> (String, String) {
    use base64::Engine;
    let mut bytes = [0u8; 32];
    bytes[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    bytes[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    let token = format!(
        "so_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    );
    let hash = Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    (token, hash)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_finds_its_account_and_nothing_else_does() {
        let (token, hash) = new_token();
        let mut stored = [0u8; 32];
        for (i, b) in stored.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hash[2 * i..2 * i + 2], 16).expect("hex");
        }
        let account = Arc::new(Account {
            name: "app".into(),
            workspace: "w".into(),
            allowed_senders: None,
        });
        let keys = ApiKeys::new(vec![KeyedAccount {
            hash: stored,
            account,
            operator: false,
        }]);
        let caller = keys.caller(&token).expect("found");
        assert_eq!(caller.submitter.name(), "app");
        assert_eq!(caller.scope(), Some("w"));
        assert!(keys.caller("so_wrong").is_none());
        assert!(keys.caller(&token[..token.len() - 1]).is_none());
        assert_ne!(new_token().0, token, "random");
    }
}
