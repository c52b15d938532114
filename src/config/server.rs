//! `[server]`: the node's name, folder and per-session limits. Its
//! `node_id` is checked with `[store]` (`store.rs`), which it names nodes for.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::problems::Problems;
use super::resolve;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    pub hostname: String,
    pub data_dir: PathBuf,
    /// Names this node in delivery leases and logs (default: host name).
    pub node_id: Option<String>,
    #[serde(default = "default_max_message_size")]
    pub max_message_size: u64,
    #[serde(default = "default_max_recipients")]
    pub max_recipients: usize,
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// RFC 5321 4.5.3.2.7: the server waits at least 5 minutes for a command.
    #[serde(default = "default_command_timeout")]
    pub command_timeout: String,
    /// Between data blocks; RFC 5321 4.5.3.2.5 asks clients for 3 minutes.
    #[serde(default = "default_data_timeout")]
    pub data_timeout: String,
    #[serde(default = "default_max_bad_commands")]
    pub max_bad_commands: u32,
    /// How long SIGTERM waits for in-flight sessions before closing them.
    #[serde(default = "default_shutdown_grace")]
    pub shutdown_grace: String,
    /// Name the submitting account and workspace in `Received:` (every
    /// recipient sees it; Postfix's `smtpd_sasl_authenticated_header`).
    #[serde(default)]
    pub received_auth_header: bool,
}

// `hostname` and `data_dir` are required, so the section has no `Default`:
// each optional key names its default here, once.
fn default_max_message_size() -> u64 {
    26_214_400
}
fn default_max_recipients() -> usize {
    100
}
fn default_max_connections() -> usize {
    1000
}
fn default_command_timeout() -> String {
    "5m".into()
}
fn default_data_timeout() -> String {
    "3m".into()
}
fn default_max_bad_commands() -> u32 {
    20
}
fn default_shutdown_grace() -> String {
    "30s".into()
}

/// `[server]`, checked (the `Config` carries these as its own fields).
pub(super) struct Server {
    pub(super) hostname: String,
    pub(super) received_auth_header: bool,
    pub(super) data_dir: PathBuf,
    pub(super) max_message_size: usize,
    pub(super) max_recipients: usize,
    pub(super) max_connections: usize,
    pub(super) command_timeout: Duration,
    pub(super) data_timeout: Duration,
    pub(super) max_bad_commands: u32,
    pub(super) shutdown_grace: Duration,
}

pub(super) fn check(s: &RawServer, base: &Path, p: &mut Problems) -> Server {
    if s.hostname.trim().is_empty() || s.hostname.contains(char::is_whitespace) {
        p.add("server.hostname", "must be a host name without spaces");
    }
    for (key, n) in [
        ("server.max_message_size", s.max_message_size),
        ("server.max_recipients", s.max_recipients as u64),
        ("server.max_connections", s.max_connections as u64),
    ] {
        if n == 0 {
            p.add(key, "must be greater than 0");
        }
    }
    p.at_most_permits("server.max_connections", s.max_connections);
    Server {
        hostname: s.hostname.clone(),
        received_auth_header: s.received_auth_header,
        data_dir: resolve(base, &s.data_dir),
        max_message_size: usize::try_from(s.max_message_size).unwrap_or(usize::MAX),
        max_recipients: s.max_recipients,
        max_connections: s.max_connections,
        command_timeout: p.duration("server.command_timeout", &s.command_timeout),
        data_timeout: p.duration("server.data_timeout", &s.data_timeout),
        max_bad_commands: s.max_bad_commands,
        shutdown_grace: p.duration("server.shutdown_grace", &s.shutdown_grace),
    }
}
