//! Console sessions, in memory: the cookie carries a random 32-byte token,
//! the map keeps only its SHA-256 (a leaked map or log line cannot be
//! replayed as a cookie). Bounded (the oldest session goes first), with an
//! idle and an absolute expiry. Each session has its own form token (CSRF),
//! compared in constant time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::auth::{Account, Submitter};
use crate::http::keys::Caller;

/// The session cookie's name.
pub const COOKIE: &str = "smtp_once_console";
/// The sign-in form's own token cookie (before any session exists).
pub const LOGIN_COOKIE: &str = "smtp_once_console_login";

/// Sessions kept at most; a new one beyond this evicts the oldest.
pub const MAX_SESSIONS: usize = 10_000;
/// Unused this long, a session ends.
pub const IDLE: Duration = Duration::from_secs(30 * 60);
/// Used or not, a session ends this long after sign-in.
pub const ABSOLUTE: Duration = Duration::from_secs(12 * 60 * 60);

/// Who is signed in, and the token every form of theirs must carry.
#[derive(Clone)]
pub struct Session {
    pub account: Arc<Account>,
    pub operator: bool,
    pub csrf: String,
    started: Instant,
    last_seen: Instant,
}

impl Session {
    /// The caller the API's code expects (scope, actor name).
    pub fn caller(&self) -> Caller {
        Caller {
            submitter: Submitter::Account(self.account.clone()),
            operator: self.operator,
        }
    }

    pub fn name(&self) -> &str {
        &self.account.name
    }

    /// `None`: every workspace (an operator).
    pub fn scope(&self) -> Option<&str> {
        (!self.operator).then_some(self.account.workspace.as_str())
    }
}

pub struct Sessions {
    map: Mutex<HashMap<[u8; 32], Session>>,
    max: usize,
}

impl Default for Sessions {
    fn default() -> Self {
        Self::new(MAX_SESSIONS)
    }
}

impl Sessions {
    pub fn new(max: usize) -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            max: max.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<[u8; 32], Session>> {
        // A panic cannot leave the map half-changed: every change is one
        // insert or remove.
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new session for `account`; the cookie value to send.
    pub fn start(&self, account: Arc<Account>, operator: bool) -> String {
        let token = random_token();
        let now = Instant::now();
        let session = Session {
            account,
            operator,
            csrf: random_token(),
            started: now,
            last_seen: now,
        };
        let mut map = self.lock();
        if map.len() >= self.max {
            map.retain(|_, s| live(s, now));
        }
        if map.len() >= self.max
            && let Some(oldest) = map.iter().min_by_key(|(_, s)| s.started).map(|(k, _)| *k)
        {
            map.remove(&oldest);
        }
        map.insert(hash(&token), session);
        token
    }

    /// The live session of this cookie value, its idle clock restarted.
    pub fn get(&self, token: &str) -> Option<Session> {
        let key = hash(token);
        let now = Instant::now();
        let mut map = self.lock();
        let session = map.get_mut(&key)?;
        if !live(session, now) {
            map.remove(&key);
            return None;
        }
        session.last_seen = now;
        Some(session.clone())
    }

    /// Signs out: the session is gone, whatever copy of the cookie remains.
    pub fn end(&self, token: &str) {
        self.lock().remove(&hash(token));
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn live(s: &Session, now: Instant) -> bool {
    now.duration_since(s.last_seen) < IDLE && now.duration_since(s.started) < ABSOLUTE
}

fn hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// 32 random bytes (two v4 UUIDs: the OS's generator, as API keys use),
/// hex.
pub fn random_token() -> String {
    let mut out = String::with_capacity(64);
    for _ in 0..2 {
        for b in uuid::Uuid::new_v4().as_bytes() {
            out.push_str(&format!("{b:02x}"));
        }
    }
    out
}

/// Whether two tokens are equal, in time that depends only on their
/// lengths.
pub fn same_token(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub fn cookie<'a>(headers: &'a axum::http::HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account(name: &str) -> Arc<Account> {
        Arc::new(Account {
            name: name.into(),
            workspace: "w".into(),
            allowed_senders: None,
        })
    }

    #[test]
    fn a_token_finds_its_session_until_signed_out() {
        let s = Sessions::new(10);
        let t = s.start(account("a"), false);
        assert_eq!(t.len(), 64);
        let got = s.get(&t).expect("live");
        assert_eq!((got.name(), got.scope()), ("a", Some("w")));
        assert!(s.get("0".repeat(64).as_str()).is_none());
        s.end(&t);
        assert!(s.get(&t).is_none());
    }

    #[test]
    fn the_oldest_session_is_evicted_at_the_bound() {
        let s = Sessions::new(2);
        let first = s.start(account("a"), false);
        let second = s.start(account("b"), true);
        let third = s.start(account("c"), false);
        assert_eq!(s.len(), 2);
        assert!(s.get(&first).is_none());
        assert!(s.get(&second).is_some() && s.get(&third).is_some());
        assert_eq!(s.get(&second).map(|x| x.scope().is_none()), Some(true));
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(same_token("abc", "abc"));
        assert!(!same_token("abc", "abd") && !same_token("abc", "ab") && !same_token("", "a"));
        assert_ne!(random_token(), random_token());
    }

    #[test]
    fn cookies_are_found_by_name() {
        let mut h = axum::http::HeaderMap::new();
        h.insert(
            axum::http::header::COOKIE,
            axum::http::HeaderValue::from_static("x=1; smtp_once_console=abc; y=2"),
        );
        assert_eq!(cookie(&h, COOKIE), Some("abc"));
        assert_eq!(cookie(&h, LOGIN_COOKIE), None);
    }
}
