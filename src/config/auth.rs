//! `[auth]`: plaintext AUTH, and the defences around password checks
//! (docs/configuration.md, `[auth]`).

use serde::Deserialize;

use super::problems::Problems;
use crate::auth::{AuthSettings, ThrottleSettings};

/// Every key is optional: the defaults are `RawAuth::default()`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawAuth {
    pub allow_plaintext: bool,
    /// Threads running argon2 checks, each reusing its own memory.
    pub hash_threads: usize,
    /// Checks that may wait for a hashing thread; beyond, 454 4.7.0.
    pub hash_queue: usize,
    /// Wait before a 535 (Dovecot: 2 s), doubled per recent failure of the
    /// client address up to `max_failure_delay`.
    pub failure_delay: String,
    pub max_failure_delay: String,
    /// Failures from one address (IPv6: one /64) before it is banned.
    pub max_failures_per_ip: u32,
    /// Failures on one account name before it is locked for addresses that
    /// have not logged in as it recently.
    pub max_failures_per_account: u32,
    /// How long a ban lasts, and how long failures are remembered.
    pub ban_time: String,
}

impl Default for RawAuth {
    fn default() -> Self {
        Self {
            allow_plaintext: false,
            hash_threads: 2,
            hash_queue: 64,
            failure_delay: "2s".into(),
            max_failure_delay: "15s".into(),
            max_failures_per_ip: 10,
            max_failures_per_account: 30,
            ban_time: "15m".into(),
        }
    }
}

/// `allow_plaintext` is not here: the `Config` carries it as
/// `allow_plaintext_auth`.
pub(super) fn check(a: &RawAuth, p: &mut Problems) -> AuthSettings {
    let failure_delay = p.duration("auth.failure_delay", &a.failure_delay);
    let max_failure_delay = p.duration("auth.max_failure_delay", &a.max_failure_delay);
    let ban_time = p.duration("auth.ban_time", &a.ban_time);
    if max_failure_delay < failure_delay {
        p.add(
            "auth.max_failure_delay",
            "must be at least auth.failure_delay",
        );
    }
    if ban_time.is_zero() {
        p.add("auth.ban_time", "must be greater than 0");
    }
    if !(1..=64).contains(&a.hash_threads) {
        p.add("auth.hash_threads", "must be between 1 and 64");
    }
    for (key, n) in [
        ("auth.max_failures_per_ip", a.max_failures_per_ip),
        ("auth.max_failures_per_account", a.max_failures_per_account),
    ] {
        if n == 0 {
            p.add(key, "must be greater than 0");
        }
    }
    AuthSettings {
        hash_threads: a.hash_threads,
        hash_queue: a.hash_queue,
        throttle: ThrottleSettings {
            failure_delay,
            max_failure_delay,
            max_failures_per_ip: a.max_failures_per_ip,
            max_failures_per_account: a.max_failures_per_account,
            ban_time,
        },
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use crate::config::{Config, ConfigError};

    fn with_auth(auth: &str) -> Result<Config, ConfigError> {
        let text = format!(
            "[server]\nhostname = \"h\"\ndata_dir = \"d\"\n\
             [[listener]]\naddr = \"127.0.0.1:0\"\ntls = \"none\"\n\
             [auth]\n{auth}\n\
             [[trusted_network]]\ncidr = \"127.0.0.0/8\"\nworkspace = \"w\"\n\
             [relay]\nmode = \"mx\"\n"
        );
        Config::from_toml(Path::new("/tmp/x.toml"), &text)
    }

    #[test]
    fn auth_section_defaults() {
        let a = with_auth("").unwrap().auth;
        assert_eq!((a.hash_threads, a.hash_queue), (2, 64));
        let t = a.throttle;
        assert_eq!(t.failure_delay, Duration::from_secs(2));
        assert_eq!(t.max_failure_delay, Duration::from_secs(15));
        assert_eq!(
            (t.max_failures_per_ip, t.max_failures_per_account),
            (10, 30)
        );
        assert_eq!(t.ban_time, Duration::from_secs(15 * 60));
    }

    #[test]
    fn auth_section_problems_are_reported_by_key() {
        let err = with_auth(
            "hash_threads = 0\nfailure_delay = \"10s\"\nmax_failure_delay = \"1s\"\n\
             max_failures_per_ip = 0\nban_time = \"0s\"\n",
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        for key in [
            "auth.hash_threads",
            "auth.max_failure_delay",
            "auth.max_failures_per_ip",
            "auth.ban_time",
        ] {
            assert!(err.contains(key), "{key} missing from {err}");
        }
    }
}
