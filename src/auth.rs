//! Who may submit: accounts with argon2id passwords, trusted networks, and
//! the sender addresses each account may use.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use argon2::{Argon2, PasswordHash, PasswordVerifier};
use tokio::sync::Semaphore;

use crate::address::ReversePath;
use crate::config::Config;

/// The identity a message is submitted under; its workspace scopes
/// idempotency keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Submitter {
    Account(Arc<Account>),
    TrustedNetwork { workspace: String },
}

impl Submitter {
    pub fn workspace(&self) -> &str {
        match self {
            Submitter::Account(a) => &a.workspace,
            Submitter::TrustedNetwork { workspace } => workspace,
        }
    }

    /// How the account is named in logs and the `Received:` header.
    pub fn name(&self) -> &str {
        match self {
            Submitter::Account(a) => &a.name,
            Submitter::TrustedNetwork { .. } => "(trusted network)",
        }
    }

    pub fn is_authenticated(&self) -> bool {
        matches!(self, Submitter::Account(_))
    }

    pub fn may_send_as(&self, address: &str) -> bool {
        match self {
            Submitter::Account(a) => a.may_send_as(address),
            Submitter::TrustedNetwork { .. } => true,
        }
    }

    /// The envelope sender check: see [`SenderPattern::matches_path`].
    pub fn may_send_as_path(&self, path: &ReversePath) -> bool {
        match self {
            Submitter::Account(a) => a.may_send_as_path(path),
            Submitter::TrustedNetwork { .. } => true,
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub workspace: String,
    pub allowed_senders: Option<Vec<SenderPattern>>,
}

impl Account {
    pub fn may_send_as(&self, address: &str) -> bool {
        match &self.allowed_senders {
            None => true,
            Some(patterns) => patterns.iter().any(|p| p.matches(address)),
        }
    }

    pub fn may_send_as_path(&self, path: &ReversePath) -> bool {
        match &self.allowed_senders {
            None => true,
            Some(patterns) => patterns.iter().any(|p| p.matches_path(path)),
        }
    }
}

/// A sender address pattern: `*` matches any run of characters, compared
/// case-insensitively (`*@example.test`, `billing@acme.test`, `*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SenderPattern(String);

impl SenderPattern {
    pub fn parse(pattern: &str) -> Result<Self, String> {
        let p = pattern.trim();
        let valid = p == "*" || (p.matches('@').count() == 1 && !p.ends_with('@'));
        if p.is_empty() || !valid || p.contains(char::is_whitespace) {
            return Err(format!(
                "{pattern:?} is not a sender pattern like \"*@example.test\" or \"*\""
            ));
        }
        Ok(Self(p.to_ascii_lowercase()))
    }

    pub fn matches(&self, address: &str) -> bool {
        glob_match(self.0.as_bytes(), address.to_ascii_lowercase().as_bytes())
    }

    /// An envelope sender, split at its real `@` (the one outside quotes):
    /// the pattern's domain must match the domain as written, and its local
    /// part the local part's value (`"a@b> x"@d` has the value `a@b> x` and
    /// the domain `d`; `"bob"@d` is `bob@d`). Both ignore ASCII case. So a
    /// quoted local part can never move an address into another domain.
    /// `<>` matches only a pattern of stars.
    pub fn matches_path(&self, path: &ReversePath) -> bool {
        let ReversePath::Mailbox(address) = path else {
            return glob_match(self.0.as_bytes(), b"");
        };
        let Some((local, domain)) = self.0.split_once('@') else {
            // `*`: any sender.
            return glob_match(self.0.as_bytes(), address.as_smtp().as_bytes());
        };
        glob_match(
            domain.as_bytes(),
            address.domain().to_ascii_lowercase().as_bytes(),
        ) && glob_match(
            local.as_bytes(),
            address.local_value().to_ascii_lowercase().as_bytes(),
        )
    }
}

/// Iterative `*` glob: linear backtracking to the last star.
fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// An address range such as `127.0.0.0/8` or `::1/128`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || format!("{text:?} is not a network like 127.0.0.0/8");
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let network: IpAddr = addr.trim().parse().map_err(|_| bad())?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p.trim().parse::<u8>().map_err(|_| bad())?,
            None => max,
        };
        if prefix > max {
            return Err(bad());
        }
        Ok(Self { network, prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.network, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// Checks that a `password_hash` is an argon2 PHC string.
pub fn check_password_hash(hash: &str) -> Result<(), String> {
    match PasswordHash::new(hash) {
        Ok(h) if h.algorithm.as_str().starts_with("argon2") => Ok(()),
        Ok(h) => Err(format!(
            "algorithm {} is not argon2 (use `smtp-once hash-password`)",
            h.algorithm
        )),
        Err(e) => Err(format!(
            "not a PHC string ({e}); create one with `smtp-once hash-password`"
        )),
    }
}

/// Produces the PHC string for `[[user]].password_hash`.
pub fn hash_password(password: &str) -> Result<String, String> {
    use argon2::PasswordHasher;
    Argon2::default()
        .hash_password(password.as_bytes())
        .map(|h| h.to_string())
        .map_err(|e| e.to_string())
}

struct Credential {
    account: Arc<Account>,
    password_hash: String,
}

/// The account directory. Verification runs on the blocking pool behind a
/// semaphore: one argon2id check costs tens of ms and ~19 MiB.
pub struct Authenticator {
    accounts: HashMap<String, Credential>,
    trusted: Vec<(crate::auth::Cidr, String)>,
    permits: Semaphore,
}

/// Verified against for unknown user names, so the timing does not reveal
/// which names exist.
const DUMMY_HASH: &str = "$argon2id$v=19$m=19456,t=2,p=1$c210cC1vbmNlLWR1bW15$0t3pQH7kC2RVH1xvH3lqJm3nqAqRxdKjD0z6SgY0V3A";

impl Authenticator {
    pub fn from_config(config: &Config) -> Self {
        let accounts = config
            .users
            .iter()
            .map(|u| {
                let account = Arc::new(Account {
                    name: u.name.clone(),
                    workspace: u.workspace.clone(),
                    allowed_senders: u.allowed_senders.clone(),
                });
                (
                    u.name.clone(),
                    Credential {
                        account,
                        password_hash: u.password_hash.clone(),
                    },
                )
            })
            .collect();
        let trusted = config
            .trusted_networks
            .iter()
            .map(|t| (t.cidr, t.workspace.clone()))
            .collect();
        Self {
            accounts,
            trusted,
            permits: Semaphore::new(2),
        }
    }

    /// The workspace of the first trusted network containing `ip`.
    pub fn trusted_workspace(&self, ip: IpAddr) -> Option<String> {
        self.trusted
            .iter()
            .find(|(cidr, _)| cidr.contains(ip))
            .map(|(_, ws)| ws.clone())
    }

    pub async fn verify(&self, username: &str, password: &str) -> Option<Arc<Account>> {
        let credential = self.accounts.get(username);
        let hash = credential.map_or(DUMMY_HASH, |c| c.password_hash.as_str());
        let _permit = self.permits.acquire().await.ok()?;
        let (hash, password) = (hash.to_owned(), password.to_owned());
        let ok = tokio::task::spawn_blocking(move || {
            PasswordHash::new(&hash)
                .map(|h| {
                    Argon2::default()
                        .verify_password(password.as_bytes(), &h)
                        .is_ok()
                })
                .unwrap_or(false)
        })
        .await
        .unwrap_or(false);
        match credential {
            Some(c) if ok => Some(c.account.clone()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sender_patterns() {
        let p = SenderPattern::parse("*@Example.test").unwrap();
        assert!(p.matches("alice@example.test"));
        assert!(p.matches("ALICE@EXAMPLE.TEST"));
        assert!(!p.matches("alice@example.test.evil"));
        assert!(!p.matches("alice@other.test"));
        let exact = SenderPattern::parse("billing@acme.test").unwrap();
        assert!(exact.matches("billing@acme.test"));
        assert!(!exact.matches("xbilling@acme.test"));
        assert!(SenderPattern::parse("*").unwrap().matches(""));
        assert!(SenderPattern::parse("@@").is_err());
        assert!(SenderPattern::parse("").is_err());
    }

    #[test]
    fn envelope_senders_match_by_domain_and_local_value() {
        let path = |t: &str| ReversePath::parse(t).expect(t);
        let any_in = SenderPattern::parse("*@Example.test").unwrap();
        assert!(any_in.matches_path(&path("alice@EXAMPLE.test")));
        // Quoted, it stays a mailbox in example.test whatever it contains.
        assert!(any_in.matches_path(&path("\"ceo@victim.test> ENVID=x\"@example.test")));
        assert!(!any_in.matches_path(&path("\"x@example.test\"@victim.test")));
        assert!(!any_in.matches_path(&path("a@example.test.victim.test")));
        assert!(!any_in.matches_path(&ReversePath::Null));
        assert!(!any_in.matches_path(&path("a@[127.0.0.1]")));
        let exact = SenderPattern::parse("billing@acme.test").unwrap();
        assert!(exact.matches_path(&path("Billing@acme.test")));
        assert!(exact.matches_path(&path("\"billing\"@acme.test")));
        assert!(!exact.matches_path(&path("\"billing@acme.test\"@evil.test")));
        assert!(!exact.matches_path(&path("\"billing x\"@acme.test")));
        let star = SenderPattern::parse("*").unwrap();
        assert!(star.matches_path(&ReversePath::Null));
        assert!(star.matches_path(&path("\"a b\"@c.test")));
    }

    #[test]
    fn cidrs() {
        let c = Cidr::parse("127.0.0.0/8").unwrap();
        assert!(c.contains("127.1.2.3".parse().unwrap()));
        assert!(c.contains("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!c.contains("10.0.0.1".parse().unwrap()));
        assert!(
            Cidr::parse("0.0.0.0/0")
                .unwrap()
                .contains("8.8.8.8".parse().unwrap())
        );
        assert!(Cidr::parse("::1").unwrap().contains("::1".parse().unwrap()));
        assert!(Cidr::parse("1.2.3.4/33").is_err());
        assert!(Cidr::parse("nope").is_err());
    }

    #[test]
    fn hashes_round_trip() {
        let hash = hash_password("s3cret").unwrap();
        assert!(check_password_hash(&hash).is_ok());
        assert!(check_password_hash("plain").is_err());
        assert!(check_password_hash(DUMMY_HASH).is_ok());
    }
}
