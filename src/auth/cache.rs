//! A short-lived memory of *successful* logins, so a client that
//! reconnects for every message does not pay an argon2 check each time.
//! Failures are never remembered: that would be a table an attacker fills.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use argon2::password_hash::phc::Salt;
use sha2::{Digest, Sha256};

use super::Account;

/// How long a verified user/password pair is trusted without hashing.
pub(super) const SUCCESS_TTL: Duration = Duration::from_secs(5 * 60);
/// Entries at most (each ~100 bytes).
pub(super) const SUCCESS_CAPACITY: usize = 4096;

/// The account a key proved, and until when.
type Entry = (Arc<Account>, Instant);

pub(super) struct SuccessCache {
    /// Per-process random salt: the keys are useless outside this process.
    salt: Salt,
    entries: Mutex<HashMap<[u8; 32], Entry>>,
}

impl SuccessCache {
    pub(super) fn new() -> Self {
        Self {
            salt: Salt::generate(),
            entries: Mutex::new(HashMap::new()),
        }
    }

    pub(super) fn get(&self, user: &str, password: &str, now: Instant) -> Option<Arc<Account>> {
        let key = self.key(user, password);
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        match entries.get(&key) {
            Some((account, expires)) if *expires > now => Some(account.clone()),
            Some(_) => {
                entries.remove(&key);
                None
            }
            None => None,
        }
    }

    pub(super) fn insert(&self, user: &str, password: &str, account: Arc<Account>, now: Instant) {
        let key = self.key(user, password);
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.len() >= SUCCESS_CAPACITY && !entries.contains_key(&key) {
            entries.retain(|_, (_, expires)| *expires > now);
            if entries.len() >= SUCCESS_CAPACITY {
                return; // only an optimisation: skip rather than evict
            }
        }
        entries.insert(key, (account, now + SUCCESS_TTL));
    }

    fn key(&self, user: &str, password: &str) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(self.salt.as_ref());
        // The length keeps ("ab", "c") and ("a", "bc") apart.
        h.update((user.len() as u64).to_le_bytes());
        h.update(user.as_bytes());
        h.update(password.as_bytes());
        h.finalize().into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account() -> Arc<Account> {
        Arc::new(Account {
            name: "ab".into(),
            workspace: "w".into(),
            allowed_senders: None,
        })
    }

    #[test]
    fn remembers_until_the_ttl() {
        let cache = SuccessCache::new();
        let now = Instant::now();
        cache.insert("ab", "c", account(), now);
        assert!(cache.get("ab", "c", now).is_some());
        assert!(cache.get("a", "bc", now).is_none());
        assert!(cache.get("ab", "C", now).is_none());
        assert!(cache.get("ab", "c", now + SUCCESS_TTL).is_none());
    }

    #[test]
    fn stays_bounded() {
        let cache = SuccessCache::new();
        let now = Instant::now();
        for i in 0..SUCCESS_CAPACITY + 10 {
            cache.insert("ab", &i.to_string(), account(), now);
        }
        let len = cache.entries.lock().unwrap().len();
        assert_eq!(len, SUCCESS_CAPACITY);
    }
}
