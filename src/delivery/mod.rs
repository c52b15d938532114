//! Outbound delivery: the worker that takes accepted messages from the
//! queue and relays them to the next hop, exactly once per recipient.
//!
//! The path of one message (see `ARCHITECTURE.md`):
//! `queue` row (queued/deferred) → [`worker`] claims it with a lease →
//! [`content`] builds the bytes to relay (trace + idempotency key + body) →
//! the [`transport::Transport`] of the relay mode ([`file`], [`smarthost`],
//! [`mx`]) runs one transaction per destination → [`plan`] turns the
//! per-recipient replies into the message's next state → [`attempt`] makes
//! it what the worker records: attempts, state and any [`dsn`] bounce, in
//! one transaction.

pub mod attempt;
pub mod connection_pool;
pub mod content;
pub mod dane;
pub mod dns;
pub mod dsn;
pub mod file;
pub mod https;
pub mod mta_sts;
pub mod mx;
pub mod outgoing;
pub mod plan;
pub mod resolver;
pub mod smarthost;
pub mod smtp;
pub mod status_text;
pub mod tls;
pub mod tls_rpt;
pub mod transport;
pub mod worker;

pub use worker::Worker;

/// The start of every reason a REQUIRETLS message could not go to a hop
/// (RFC 8689 4.2.1): when it is every hop's, the message bounces.
pub const REQUIRETLS_REFUSED: &str = "550 5.7.30";

/// What happened to one recipient in one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// The next hop took responsibility (2xx after DATA).
    Delivered,
    /// Try again later: a 4xx reply, or the next hop could not be reached.
    Deferred,
    /// Never try again: a 5xx reply, or no route can ever exist.
    Failed,
}

/// One recipient's result from a transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RcptResult {
    pub recipient: String,
    pub status: Status,
    /// The SMTP reply (`250 2.0.0 Ok`) or a description of the error.
    pub reply: String,
    /// Where it went or was tried: a host, a socket address, or a file.
    pub next_hop: Option<String>,
}

impl RcptResult {
    pub fn new(recipient: &str, status: Status, reply: impl Into<String>) -> Self {
        Self {
            recipient: recipient.to_owned(),
            status,
            reply: reply.into(),
            next_hop: None,
        }
    }

    pub fn via(mut self, hop: Option<String>) -> Self {
        self.next_hop = hop;
        self
    }

    /// The same outcome for every recipient of a transaction.
    pub fn all(recipients: &[String], status: Status, reply: &str, hop: Option<&str>) -> Vec<Self> {
        recipients
            .iter()
            .map(|r| RcptResult::new(r, status, reply).via(hop.map(str::to_owned)))
            .collect()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DeliveryError {
    #[error("{0}")]
    Setup(String),
}

/// Address domain, lowercased; an address without `@` has none.
pub fn domain_of(address: &str) -> Option<String> {
    address
        .rsplit_once('@')
        .map(|(_, d)| d.to_ascii_lowercase())
        .filter(|d| !d.is_empty())
}

#[cfg(test)]
mod tests {
    use crate::config::{Config, ConfigError, TlsTrust};
    use std::path::Path;
    use std::time::Duration;

    const BASE: &str = "[server]\nhostname = \"h\"\ndata_dir = \"d\"\n[[listener]]\naddr = \"127.0.0.1:1\"\n\
                        [[trusted_network]]\ncidr = \"127.0.0.0/8\"\nworkspace = \"w\"\n";

    fn load(relay: &str) -> Result<Config, ConfigError> {
        Config::from_toml(
            Path::new("/etc/smtp-once/x.toml"),
            &format!("{BASE}[relay]\n{relay}"),
        )
    }

    #[test]
    fn delivery_defaults() {
        let c = load("mode = \"mx\"").expect("valid");
        let d = c.delivery;
        assert_eq!(d.max_age, Duration::from_secs(5 * 86400));
        assert_eq!(d.retry_schedule.first(), Some(&Duration::from_secs(60)));
        assert_eq!(
            d.retry_schedule.last(),
            Some(&Duration::from_secs(4 * 3600))
        );
        assert_eq!((d.workers, d.max_per_destination, d.mx_port), (100, 20, 25));
        assert_eq!((d.pool_size, d.paused), (20, false));
        assert_eq!(
            (d.max_messages_per_connection, d.connection_idle_timeout),
            (100, Duration::from_secs(30))
        );
        assert_eq!(d.smarthost_trust, TlsTrust::System);
        assert!(d.test_pause_after_send.is_zero());
    }

    #[test]
    fn tls_policy_and_dns_servers_are_checked_by_key() {
        let c = load(
            "mode = \"mx\"\ndns_servers = [\"127.0.0.1:5353\", \"::1\"]\n\
             tls_policy = { \"Partner.Example.\" = \"verify\", \"legacy.example\" = \"none\" }\n",
        )
        .expect("valid");
        let d = c.delivery;
        assert_eq!(d.dns_servers.len(), 2);
        assert_eq!(d.dns_servers[1].port(), 53);
        assert_eq!(d.tls_policy.default, crate::config::TlsLevel::Dane);
        assert_eq!(
            d.tls_policy.level_for("partner.example"),
            crate::config::TlsLevel::Verify
        );
        assert_eq!(
            d.tls_policy.level_for("other.example"),
            crate::config::TlsLevel::Dane
        );
        assert!(d.mta_sts && d.mta_sts_port == 443);
        let err = load(
            "mode = \"mx\"\ndns_servers = [\"dns.example\"]\ntls_default = \"strict\"\n\
             tls_policy = { \"a b\" = \"dane\", \"x.example\" = \"maybe\" }\nmta_sts_port = 0\n\
             mx_ca_file = \"/nonexistent.pem\"\n",
        )
        .expect_err("invalid");
        let text = err.to_string();
        for key in [
            "relay.dns_servers[0]:",
            "relay.tls_default:",
            "relay.tls_policy.\"a b\":",
            "relay.tls_policy.\"x.example\":",
            "relay.mta_sts_port:",
            "relay.mx_ca_file:",
        ] {
            assert!(text.contains(key), "{key} missing from {text}");
        }
    }

    #[test]
    fn delivery_keys_are_checked() {
        let err = load(
            "mode = \"smarthost\"\nsmarthost = \"h:0\"\nusername = \"u\"\nretry_schedule = []\n\
             max_age = \"0s\"\nlease = \"1m\"\nworkers = 0\nca_file = \"/nonexistent.pem\"\n\
             max_messages_per_connection = 0\nconnection_idle_timeout = \"0s\"\n",
        )
        .expect_err("invalid");
        let text = err.to_string();
        for key in [
            "relay.smarthost",
            "relay.password",
            "relay.retry_schedule",
            "relay.max_age",
            "relay.lease",
            "relay.workers",
            "relay.ca_file",
            "relay.max_messages_per_connection",
            "relay.connection_idle_timeout",
        ] {
            assert!(
                text.contains(&format!("{key}:")),
                "{key} missing from {text}"
            );
        }
    }
}
