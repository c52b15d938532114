//! `[limits]`: defences against hostile clients (docs/configuration.md).
//! Each default is what a production submission port on the internet needs.

use std::time::Duration;

use serde::Deserialize;

use super::problems::Problems;

/// Deepest `limits.max_mime_depth` allowed: the parse threads' stacks are
/// sized with room to spare for this.
pub const MAX_MIME_DEPTH_CEILING: usize = 10_000;

/// Every key is optional: the defaults are `RawLimits::default()`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawLimits {
    /// Connections at once from one client IP.
    pub max_connections_per_ip: usize,
    /// A TLS handshake (implicit or after STARTTLS) must finish within this.
    pub tls_handshake_timeout: String,
    /// A whole command line must arrive within this, however it trickles.
    pub command_time_limit: String,
    /// A whole message (DATA or all BDAT chunks) must arrive within this.
    pub message_time_limit: String,
    /// A reply must be taken by the client within this.
    pub write_timeout: String,
    /// NOOP, RSET, VRFY, HELP and the like per session.
    pub max_junk_commands: u32,
    /// Message bytes held in memory by all sessions together.
    pub max_bytes_in_flight: u64,
    /// Message bytes held in memory by one account's sessions.
    pub max_bytes_in_flight_per_account: u64,
    /// MIME nesting depth.
    pub max_mime_depth: usize,
    /// MIME parts in one message.
    pub max_mime_parts: usize,
    /// `Received:` header fields a message may arrive with (loops).
    pub max_hops: usize,
}

impl Default for RawLimits {
    fn default() -> Self {
        Self {
            // Postfix: 50.
            max_connections_per_ip: 50,
            tls_handshake_timeout: "10s".into(),
            command_time_limit: "5m".into(),
            message_time_limit: "10m".into(),
            write_timeout: "1m".into(),
            // Postfix: 100.
            max_junk_commands: 100,
            max_bytes_in_flight: 512 * 1024 * 1024,
            max_bytes_in_flight_per_account: 128 * 1024 * 1024,
            // Postfix `mime_nesting_limit`: 100.
            max_mime_depth: 100,
            max_mime_parts: 10_000,
            // Postfix `hopcount_limit`: 50.
            max_hops: 50,
        }
    }
}

/// `[limits]`, validated.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_connections_per_ip: usize,
    pub tls_handshake_timeout: Duration,
    pub command_time_limit: Duration,
    pub message_time_limit: Duration,
    pub write_timeout: Duration,
    pub max_junk_commands: u32,
    pub max_bytes_in_flight: usize,
    pub max_bytes_in_flight_per_account: usize,
    pub max_mime_depth: usize,
    pub max_mime_parts: usize,
    pub max_hops: usize,
}

pub(super) fn check(l: &RawLimits, p: &mut Problems) -> Limits {
    let tls_handshake_timeout =
        p.duration("limits.tls_handshake_timeout", &l.tls_handshake_timeout);
    let command_time_limit = p.duration("limits.command_time_limit", &l.command_time_limit);
    let message_time_limit = p.duration("limits.message_time_limit", &l.message_time_limit);
    let write_timeout = p.duration("limits.write_timeout", &l.write_timeout);
    for (key, d) in [
        ("limits.tls_handshake_timeout", tls_handshake_timeout),
        ("limits.command_time_limit", command_time_limit),
        ("limits.message_time_limit", message_time_limit),
        ("limits.write_timeout", write_timeout),
    ] {
        if d.is_zero() {
            p.add(key, "must be greater than 0");
        }
    }
    for (key, n) in [
        (
            "limits.max_connections_per_ip",
            l.max_connections_per_ip as u64,
        ),
        ("limits.max_junk_commands", u64::from(l.max_junk_commands)),
        ("limits.max_bytes_in_flight", l.max_bytes_in_flight),
        (
            "limits.max_bytes_in_flight_per_account",
            l.max_bytes_in_flight_per_account,
        ),
        ("limits.max_mime_depth", l.max_mime_depth as u64),
        ("limits.max_mime_parts", l.max_mime_parts as u64),
        ("limits.max_hops", l.max_hops as u64),
    ] {
        if n == 0 {
            p.add(key, "must be greater than 0");
        }
    }
    if l.max_mime_depth > MAX_MIME_DEPTH_CEILING {
        p.add(
            "limits.max_mime_depth",
            format!("must be at most {MAX_MIME_DEPTH_CEILING}"),
        );
    }
    let bytes = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    Limits {
        max_connections_per_ip: l.max_connections_per_ip,
        tls_handshake_timeout,
        command_time_limit,
        message_time_limit,
        write_timeout,
        max_junk_commands: l.max_junk_commands,
        max_bytes_in_flight: bytes(l.max_bytes_in_flight),
        max_bytes_in_flight_per_account: bytes(l.max_bytes_in_flight_per_account),
        max_mime_depth: l.max_mime_depth,
        max_mime_parts: l.max_mime_parts,
        max_hops: l.max_hops,
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::Config;

    #[test]
    fn limits_are_checked_by_key() {
        let text = "[server]\nhostname = \"h\"\ndata_dir = \"d\"\n[[listener]]\naddr = \"127.0.0.1:0\"\n\
                    [[trusted_network]]\ncidr = \"127.0.0.1\"\nworkspace = \"w\"\n\
                    [limits]\nmax_mime_depth = 10001\nmax_connections_per_ip = 0\nwrite_timeout = \"0s\"\n\
                    command_time_limit = \"99999999999999d\"\n";
        let err = Config::from_toml(Path::new("x.toml"), text)
            .unwrap_err()
            .to_string();
        for key in [
            "limits.max_mime_depth: must be at most 10000",
            "limits.max_connections_per_ip: must be greater than 0",
            "limits.write_timeout: must be greater than 0",
            "limits.command_time_limit: \"99999999999999d\": longer than 100 years",
        ] {
            assert!(err.contains(key), "{key} missing from {err}");
        }
    }
}
