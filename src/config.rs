//! The TOML configuration: parsed strictly (`deny_unknown_fields`), then
//! validated into typed settings. Every problem is reported with the key it
//! belongs to, so `check-config` can list them all at once: unknown keys,
//! values of the wrong type and missing keys included (see `parse_raw`).
//!
//! Layout: `parse.rs` turns the TOML table into `RawConfig`; `check.rs`
//! collects the problems and runs each section's `check` in turn; each
//! section's file (`server`, `listener`, `users`, `auth`, `idempotency`,
//! `relay`, `limits`, `store`, `http`, `metrics`, `webhook`, `dkim`) holds
//! its raw struct with its defaults, its checked struct and its `check`.
//! Config knows no transport or listener: for files and addresses it calls
//! only the ground floor (`tls`, `net`, `dkim`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::auth::AuthSettings;

mod auth;
mod check;
mod dkim;
mod duration;
mod http;
mod idempotency;
mod limits;
mod listener;
mod metrics;
mod parse;
mod problems;
mod relay;
mod server;
mod store;
mod users;
mod webhook;
pub use auth::RawAuth;
pub use dkim::RawDkim;
pub use duration::parse_duration;
pub use http::{HttpSettings, RawHttp};
pub use idempotency::RawIdempotency;
pub use limits::{Limits, MAX_MIME_DEPTH_CEILING, RawLimits};
pub use listener::{Listener, RawListener, RawTls, SmtpTls, TlsFiles};
pub use metrics::{MetricsSettings, RawMetrics};
pub use relay::{Delivery, RawRelay, Relay, TlsLevel, TlsPolicy, TlsTrust};
pub use server::RawServer;
pub use store::{PostgresSettings, RawStore, StoreBackend};
pub use users::{RawTrustedNetwork, RawUser, TrustedNetwork, User};
pub use webhook::{RawWebhook, WebhookEndpoint, redacted_url};

use parse::{drop_repeats, parse_raw};
use problems::Problems;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{path} has {} problem(s):\n  {}", problems.len(), problems.join("\n  "))]
    Invalid {
        path: PathBuf,
        problems: Vec<String>,
    },
}

/// The file as written. Paths are relative to the config file's folder.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    pub server: RawServer,
    #[serde(default, rename = "listener")]
    pub listeners: Vec<RawListener>,
    pub tls: Option<RawTls>,
    #[serde(default)]
    pub auth: RawAuth,
    #[serde(default, rename = "user")]
    pub users: Vec<RawUser>,
    #[serde(default, rename = "trusted_network")]
    pub trusted_networks: Vec<RawTrustedNetwork>,
    #[serde(default)]
    pub idempotency: RawIdempotency,
    #[serde(default)]
    pub relay: RawRelay,
    #[serde(default)]
    pub limits: RawLimits,
    #[serde(default)]
    pub store: RawStore,
    pub http: Option<RawHttp>,
    /// No section: no metrics listener.
    pub metrics: Option<RawMetrics>,
    #[serde(default, rename = "webhook")]
    pub webhooks: Vec<RawWebhook>,
    #[serde(default, rename = "dkim")]
    pub dkim: Vec<RawDkim>,
}

/// Validated settings the daemon runs on.
#[derive(Debug, Clone)]
pub struct Config {
    pub path: PathBuf,
    pub hostname: String,
    /// `[server] received_auth_header`: the account in `Received:`.
    pub received_auth_header: bool,
    pub data_dir: PathBuf,
    pub node_id: String,
    pub store: StoreBackend,
    /// `[http]`: the HTTP API listener, if any.
    pub http: Option<HttpSettings>,
    pub max_message_size: usize,
    pub max_recipients: usize,
    pub max_connections: usize,
    pub command_timeout: Duration,
    pub data_timeout: Duration,
    pub max_bad_commands: u32,
    pub shutdown_grace: Duration,
    pub listeners: Vec<Listener>,
    pub tls: Option<TlsFiles>,
    pub allow_plaintext_auth: bool,
    pub auth: AuthSettings,
    pub users: Vec<User>,
    pub trusted_networks: Vec<TrustedNetwork>,
    pub retention: Duration,
    pub purge_interval: Duration,
    /// `[idempotency] volatile_headers`: header names, valid field names.
    pub volatile_headers: Vec<String>,
    /// `[idempotency] transit_headers`: header names, each valid or a valid
    /// prefix with a trailing `*`.
    pub transit_headers: Vec<String>,
    /// `[idempotency] key_headers`: valid field names, at least one, no
    /// two alike (case-insensitively), in priority order.
    pub key_headers: Vec<String>,
    pub relay: Relay,
    pub delivery: Delivery,
    pub limits: Limits,
    /// `[metrics] addr`; `None` without the section.
    pub metrics: Option<MetricsSettings>,
    /// `[[webhook]]` endpoints for delivery-status events.
    pub webhooks: Vec<WebhookEndpoint>,
    /// `[[dkim]]` keys, loaded, in the file's order.
    pub dkim: Vec<crate::dkim::DomainSigner>,
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml(path, &text)
    }

    pub fn from_toml(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::Parse {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
        let base = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let mut structural = Problems::default();
        let parsed = parse_raw(table, &mut structural);
        let mut problems = Problems::default();
        let config = parsed.map(|(raw, reported)| {
            let config = check::check(raw, path, &base, &mut problems);
            drop_repeats(&mut problems, &reported);
            config
        });
        structural.0.append(&mut problems.0);
        match config {
            Some(config) if structural.0.is_empty() => Ok(config),
            _ => Err(ConfigError::Invalid {
                path: path.to_path_buf(),
                problems: structural.0,
            }),
        }
    }
}

/// `p` as written, or relative to the config file's folder `base`.
fn resolve(base: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}
