//! `[[user]]` and `[[trusted_network]]`: who may submit, and into which
//! workspace.

use std::collections::BTreeSet;

use serde::Deserialize;

use super::problems::Problems;
use crate::auth::{Cidr, SenderPattern};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUser {
    pub name: String,
    pub password_hash: String,
    pub workspace: String,
    #[serde(default)]
    pub allowed_senders: Option<Vec<String>>,
    /// SHA-256 of the account's HTTP API token (`smtp-once new-api-key`).
    pub api_key_hash: Option<String>,
    /// `"workspace"` (the default: its own workspace only) or
    /// `"operator"` (the API reads and acts on every workspace's messages).
    #[serde(default)]
    pub role: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTrustedNetwork {
    pub cidr: String,
    pub workspace: String,
}

#[derive(Debug, Clone)]
pub struct User {
    pub name: String,
    pub password_hash: String,
    pub workspace: String,
    /// `None`: any sender.
    pub allowed_senders: Option<Vec<SenderPattern>>,
    /// SHA-256 of the HTTP API token, if the account may use the API.
    pub api_key_hash: Option<[u8; 32]>,
    /// `role = "operator"`: over the API, every workspace's messages.
    pub operator: bool,
}

#[derive(Debug, Clone)]
pub struct TrustedNetwork {
    pub cidr: Cidr,
    pub workspace: String,
}

pub(super) fn check_users(raw: &[RawUser], p: &mut Problems) -> Vec<User> {
    let mut users: Vec<User> = Vec::new();
    for (i, u) in raw.iter().enumerate() {
        let key = |field: &str| format!("user[{i}].{field}");
        if let Err(e) = check_label(&u.name) {
            p.add(key("name"), e);
        }
        if raw[..i].iter().any(|o| o.name == u.name) {
            p.add(key("name"), format!("{:?} is defined twice", u.name));
        }
        if let Err(e) = check_label(&u.workspace) {
            p.add(key("workspace"), e);
        }
        if let Err(e) = crate::auth::check_password_hash(&u.password_hash) {
            p.add(key("password_hash"), e);
        }
        let allowed_senders = u.allowed_senders.as_ref().map(|list| {
            list.iter()
                .enumerate()
                .filter_map(|(j, pat)| {
                    SenderPattern::parse(pat)
                        .map_err(|e| p.add(format!("user[{i}].allowed_senders[{j}]"), e))
                        .ok()
                })
                .collect()
        });
        let api_key_hash = u.api_key_hash.as_deref().and_then(|h| {
            parse_api_key_hash(h)
                .map_err(|e| p.add(key("api_key_hash"), e))
                .ok()
        });
        if let Some(hash) = api_key_hash
            && users.iter().any(|o| o.api_key_hash == Some(hash))
        {
            p.add(
                key("api_key_hash"),
                "the same API key is given to another user",
            );
        }
        let operator = is_operator(u.role.as_deref())
            .map_err(|e| p.add(key("role"), e))
            .unwrap_or(false);
        users.push(User {
            name: u.name.clone(),
            password_hash: u.password_hash.clone(),
            workspace: u.workspace.clone(),
            allowed_senders,
            api_key_hash,
            operator,
        });
    }
    users
}

/// `role`: whether the account is an operator (default: a workspace's).
fn is_operator(role: Option<&str>) -> Result<bool, String> {
    match role {
        None | Some("workspace") => Ok(false),
        Some("operator") => Ok(true),
        Some(other) => Err(format!(
            "{other:?} is not a role: \"workspace\" (the default) or \"operator\""
        )),
    }
}

/// `api_key_hash`: the SHA-256 of the token, 64 hex digits, as
/// `smtp-once new-api-key` prints it.
fn parse_api_key_hash(value: &str) -> Result<[u8; 32], String> {
    let bytes = value.as_bytes();
    if bytes.len() != 64 {
        return Err("must be 64 hexadecimal digits (from `smtp-once new-api-key`)".into());
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks(2).enumerate() {
        let text = std::str::from_utf8(pair).map_err(|_| "not hexadecimal".to_owned())?;
        out[i] = u8::from_str_radix(text, 16).map_err(|_| "not hexadecimal".to_owned())?;
    }
    Ok(out)
}

pub(super) fn check_trusted_networks(
    raw: &[RawTrustedNetwork],
    p: &mut Problems,
) -> Vec<TrustedNetwork> {
    let mut trusted_networks = Vec::new();
    for (i, t) in raw.iter().enumerate() {
        if let Err(e) = check_label(&t.workspace) {
            p.add(format!("trusted_network[{i}].workspace"), e);
        }
        match Cidr::parse(&t.cidr) {
            Ok(cidr) => trusted_networks.push(TrustedNetwork {
                cidr,
                workspace: t.workspace.clone(),
            }),
            Err(e) => p.add(format!("trusted_network[{i}].cidr"), e),
        }
    }
    trusted_networks
}

/// Counts only the entries that passed their checks: a relay whose one
/// network is mistyped would accept from nobody either.
pub(super) fn check_someone_can_submit(
    users: &[User],
    trusted_networks: &[TrustedNetwork],
    p: &mut Problems,
) {
    if users.is_empty() && trusted_networks.is_empty() {
        p.add(
            "user",
            "no [[user]] and no [[trusted_network]]: nobody could submit",
        );
    }
}

/// Every workspace named by a `[[user]]` or `[[trusted_network]]` entry.
pub(super) fn workspaces<'a>(
    users: &'a [RawUser],
    trusted_networks: &'a [RawTrustedNetwork],
) -> BTreeSet<&'a str> {
    users
        .iter()
        .map(|u| u.workspace.as_str())
        .chain(trusted_networks.iter().map(|t| t.workspace.as_str()))
        .collect()
}

/// Account names and workspaces end up in replies, logs and the
/// `Received:` header: printable, no spaces, at most 255 bytes.
pub(super) fn check_label(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("must not be empty".into());
    }
    if value.len() > 255 {
        return Err("must be at most 255 bytes".into());
    }
    if value.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(format!(
            "{value:?} must not contain spaces or control characters"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::Config;

    #[test]
    fn names_and_workspaces_are_printable() {
        let text = "[server]\nhostname = \"h\"\ndata_dir = \"d\"\n[[listener]]\naddr = \"127.0.0.1:0\"\n\
                    [[user]]\nname = \"a\\r\\nb\"\npassword_hash = \"x\"\nworkspace = \"w s\"\n\
                    [[trusted_network]]\ncidr = \"127.0.0.1\"\nworkspace = \"\\u001b[31m\"\n";
        let err = Config::from_toml(Path::new("x.toml"), text)
            .unwrap_err()
            .to_string();
        for key in [
            "user[0].name: \"a\\r\\nb\" must not contain",
            "user[0].workspace: \"w s\" must not contain",
            "trusted_network[0].workspace: \"\\u{1b}[31m\" must not contain",
        ] {
            assert!(err.contains(key), "{key} missing from {err}");
        }
    }
}
