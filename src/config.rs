//! The TOML configuration: parsed strictly (`deny_unknown_fields`), then
//! validated into typed settings. Every problem is reported with the key it
//! belongs to, so `check-config` can list them all at once: unknown keys,
//! values of the wrong type and missing keys included (see `parse_raw`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::auth::{AuthSettings, Cidr, SenderPattern, ThrottleSettings};

mod dkim;
mod http;
mod parse;
mod store;
mod webhook;
pub use dkim::RawDkim;
pub use http::{HttpSettings, RawHttp};
use parse::{drop_repeats, parse_raw};
pub use store::{PostgresSettings, RawStore, StoreBackend};
pub use webhook::{RawWebhook, WebhookEndpoint, redacted_url};

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

/// `[metrics]`: the listener for /metrics, /healthz and /readyz.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMetrics {
    pub addr: String,
    /// When set, `/metrics` wants `Authorization: Bearer <token>`
    /// (`/healthz` and `/readyz` stay open for probes).
    #[serde(default)]
    pub token: Option<String>,
}

/// `[metrics]`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsSettings {
    pub addr: SocketAddr,
    pub token: Option<String>,
}

/// Defences against hostile clients (docs/configuration.md). Each default is
/// what a production submission port on the internet needs.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    /// Connections at once from one client IP (Postfix: 50).
    #[serde(default = "default_max_connections_per_ip")]
    pub max_connections_per_ip: usize,
    /// A TLS handshake (implicit or after STARTTLS) must finish within this.
    #[serde(default = "default_tls_handshake_timeout")]
    pub tls_handshake_timeout: String,
    /// A whole command line must arrive within this, however it trickles.
    #[serde(default = "default_command_time_limit")]
    pub command_time_limit: String,
    /// A whole message (DATA or all BDAT chunks) must arrive within this.
    #[serde(default = "default_message_time_limit")]
    pub message_time_limit: String,
    /// A reply must be taken by the client within this.
    #[serde(default = "default_write_timeout")]
    pub write_timeout: String,
    /// NOOP, RSET, VRFY, HELP and the like per session (Postfix: 100).
    #[serde(default = "default_max_junk_commands")]
    pub max_junk_commands: u32,
    /// Message bytes held in memory by all sessions together.
    #[serde(default = "default_max_bytes_in_flight")]
    pub max_bytes_in_flight: u64,
    /// Message bytes held in memory by one account's sessions.
    #[serde(default = "default_max_bytes_in_flight_per_account")]
    pub max_bytes_in_flight_per_account: u64,
    /// MIME nesting depth (Postfix `mime_nesting_limit`: 100).
    #[serde(default = "default_max_mime_depth")]
    pub max_mime_depth: usize,
    /// MIME parts in one message.
    #[serde(default = "default_max_mime_parts")]
    pub max_mime_parts: usize,
}

impl Default for RawLimits {
    fn default() -> Self {
        Self {
            max_connections_per_ip: default_max_connections_per_ip(),
            tls_handshake_timeout: default_tls_handshake_timeout(),
            command_time_limit: default_command_time_limit(),
            message_time_limit: default_message_time_limit(),
            write_timeout: default_write_timeout(),
            max_junk_commands: default_max_junk_commands(),
            max_bytes_in_flight: default_max_bytes_in_flight(),
            max_bytes_in_flight_per_account: default_max_bytes_in_flight_per_account(),
            max_mime_depth: default_max_mime_depth(),
            max_mime_parts: default_max_mime_parts(),
        }
    }
}

fn default_max_connections_per_ip() -> usize {
    50
}
fn default_tls_handshake_timeout() -> String {
    "10s".into()
}
fn default_command_time_limit() -> String {
    "5m".into()
}
fn default_message_time_limit() -> String {
    "10m".into()
}
fn default_write_timeout() -> String {
    "1m".into()
}
fn default_max_junk_commands() -> u32 {
    100
}
fn default_max_bytes_in_flight() -> u64 {
    512 * 1024 * 1024
}
fn default_max_bytes_in_flight_per_account() -> u64 {
    128 * 1024 * 1024
}
fn default_max_mime_depth() -> usize {
    100
}
fn default_max_mime_parts() -> usize {
    10_000
}

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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawListener {
    pub addr: String,
    #[serde(default = "default_tls_mode")]
    pub tls: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// `[auth]`: plaintext AUTH, and the defences around password checks
/// (docs/configuration.md, `[auth]`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuth {
    #[serde(default)]
    pub allow_plaintext: bool,
    /// Threads running argon2 checks, each reusing its own memory.
    #[serde(default = "default_hash_threads")]
    pub hash_threads: usize,
    /// Checks that may wait for a hashing thread; beyond, 454 4.7.0.
    #[serde(default = "default_hash_queue")]
    pub hash_queue: usize,
    /// Wait before a 535 (Dovecot: 2 s), doubled per recent failure of the
    /// client address up to `max_failure_delay`.
    #[serde(default = "default_failure_delay")]
    pub failure_delay: String,
    #[serde(default = "default_max_failure_delay")]
    pub max_failure_delay: String,
    /// Failures from one address (IPv6: one /64) before it is banned.
    #[serde(default = "default_max_failures_per_ip")]
    pub max_failures_per_ip: u32,
    /// Failures on one account name before it is locked for addresses that
    /// have not logged in as it recently.
    #[serde(default = "default_max_failures_per_account")]
    pub max_failures_per_account: u32,
    /// How long a ban lasts, and how long failures are remembered.
    #[serde(default = "default_ban_time")]
    pub ban_time: String,
}

impl Default for RawAuth {
    fn default() -> Self {
        Self {
            allow_plaintext: false,
            hash_threads: default_hash_threads(),
            hash_queue: default_hash_queue(),
            failure_delay: default_failure_delay(),
            max_failure_delay: default_max_failure_delay(),
            max_failures_per_ip: default_max_failures_per_ip(),
            max_failures_per_account: default_max_failures_per_account(),
            ban_time: default_ban_time(),
        }
    }
}

fn default_hash_threads() -> usize {
    2
}
fn default_hash_queue() -> usize {
    64
}
fn default_failure_delay() -> String {
    "2s".into()
}
fn default_max_failure_delay() -> String {
    "15s".into()
}
fn default_max_failures_per_ip() -> u32 {
    10
}
fn default_max_failures_per_account() -> u32 {
    30
}
fn default_ban_time() -> String {
    "15m".into()
}

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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawIdempotency {
    #[serde(default = "default_retention")]
    pub retention: String,
    #[serde(default = "default_purge_interval")]
    pub purge_interval: String,
    /// Top-level headers whose values the fingerprint leaves out.
    #[serde(default = "default_volatile_headers")]
    pub volatile_headers: Vec<String>,
    /// Top-level trace fields a keyed message's identity leaves out.
    #[serde(default = "default_transit_headers")]
    pub transit_headers: Vec<String>,
    /// Headers an SMTP message's key is read from, first present wins.
    #[serde(default = "default_key_headers")]
    pub key_headers: Vec<String>,
}

impl Default for RawIdempotency {
    fn default() -> Self {
        Self {
            retention: default_retention(),
            purge_interval: default_purge_interval(),
            volatile_headers: default_volatile_headers(),
            transit_headers: default_transit_headers(),
            key_headers: default_key_headers(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRelay {
    #[serde(default = "default_relay_mode")]
    pub mode: String,
    pub dir: Option<PathBuf>,
    pub smarthost: Option<String>,
    pub tls: Option<String>,
    pub username: Option<String>,
    pub password: Option<String>,
    /// Smarthost: PEM file of the certificates to trust instead of the
    /// system's roots (e.g. a private CA, or the dev certificate in tests).
    pub ca_file: Option<PathBuf>,
    /// Smarthost: skip certificate verification. Loopback testing only.
    #[serde(default)]
    pub insecure_skip_verify: bool,
    /// Waits after a failed attempt: the n-th deferral waits the n-th entry,
    /// later ones the last entry.
    #[serde(default = "default_retry_schedule")]
    pub retry_schedule: Vec<String>,
    /// Age at which a still-deferred recipient expires (and bounces).
    #[serde(default = "default_max_age")]
    pub max_age: String,
    /// How long delivered, failed and expired messages stay in the queue
    /// (for `status`) before the worker removes them and their bodies.
    #[serde(default = "default_keep_finished")]
    pub keep_finished: String,
    /// Messages delivered at the same time, in total.
    #[serde(default = "default_workers")]
    pub workers: usize,
    /// Concurrent transactions to one destination (smarthost or MX domain).
    #[serde(default = "default_max_per_destination")]
    pub max_per_destination: usize,
    /// Open connections kept per destination between transactions
    /// (default: max_per_destination).
    #[serde(default)]
    pub pool_size: Option<usize>,
    /// Accept and queue, deliver nothing (maintenance, or measuring
    /// acceptance alone); the queue is delivered once unset and restarted.
    #[serde(default)]
    pub paused: bool,
    /// Messages sent over one outbound connection before it is closed
    /// (1: a new connection for every message).
    #[serde(default = "default_max_messages_per_connection")]
    pub max_messages_per_connection: usize,
    /// An open outbound connection unused this long is closed.
    #[serde(default = "default_connection_idle_timeout")]
    pub connection_idle_timeout: String,
    /// How long a claimed message belongs to the worker that claimed it.
    #[serde(default = "default_lease")]
    pub lease: String,
    /// How often the worker looks for newly accepted messages.
    #[serde(default = "default_poll_interval")]
    pub poll_interval: String,
    /// Per SMTP command (connect, each reply, the message transfer).
    #[serde(default = "default_smtp_timeout")]
    pub timeout: String,
    /// The port MX hosts are contacted on (25; another one only for tests).
    #[serde(default = "default_mx_port")]
    pub mx_port: u16,
    /// TEST ONLY: sleep this long after the next hop answered DATA and
    /// before recording the outcome, so a test can kill the process there.
    #[serde(default)]
    pub delivery_test_pause_after_send: Option<String>,
}

impl Default for RawRelay {
    fn default() -> Self {
        Self {
            mode: default_relay_mode(),
            dir: None,
            smarthost: None,
            tls: None,
            username: None,
            password: None,
            ca_file: None,
            insecure_skip_verify: false,
            retry_schedule: default_retry_schedule(),
            max_age: default_max_age(),
            keep_finished: default_keep_finished(),
            workers: default_workers(),
            max_per_destination: default_max_per_destination(),
            pool_size: None,
            paused: false,
            max_messages_per_connection: default_max_messages_per_connection(),
            connection_idle_timeout: default_connection_idle_timeout(),
            lease: default_lease(),
            poll_interval: default_poll_interval(),
            timeout: default_smtp_timeout(),
            mx_port: default_mx_port(),
            delivery_test_pause_after_send: None,
        }
    }
}

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
fn default_tls_mode() -> String {
    "none".into()
}
fn default_retention() -> String {
    "3h".into()
}
fn default_volatile_headers() -> Vec<String> {
    vec!["Date".into(), "Message-ID".into()]
}
fn default_transit_headers() -> Vec<String> {
    crate::idempotency::transit::DEFAULT_TRANSIT_HEADERS
        .map(String::from)
        .to_vec()
}

fn default_key_headers() -> Vec<String> {
    vec!["X-Bird-Idempotency-Key".into()]
}
fn default_purge_interval() -> String {
    "60s".into()
}
fn default_relay_mode() -> String {
    "file".into()
}
/// Roughly doubling, capped at 4h: quick recovery from a blip, little load
/// on a host that is down for long.
fn default_retry_schedule() -> Vec<String> {
    ["1m", "2m", "4m", "8m", "16m", "32m", "1h", "2h", "4h"]
        .map(String::from)
        .to_vec()
}
fn default_max_age() -> String {
    "5d".into()
}
fn default_keep_finished() -> String {
    "7d".into()
}
/// Postfix's own defaults (default_process_limit, and
/// default_destination_concurrency_limit): enough to keep a local
/// smarthost busy on 2 cores, still polite to a remote MX.
fn default_workers() -> usize {
    100
}
fn default_max_per_destination() -> usize {
    20
}
fn default_max_messages_per_connection() -> usize {
    100
}
fn default_connection_idle_timeout() -> String {
    "30s".into()
}
fn default_lease() -> String {
    "30m".into()
}
fn default_poll_interval() -> String {
    "1s".into()
}
fn default_smtp_timeout() -> String {
    "5m".into()
}
fn default_mx_port() -> u16 {
    25
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

/// Deepest `limits.max_mime_depth` allowed: the parse threads' stacks are
/// sized with room to spare for this.
pub const MAX_MIME_DEPTH_CEILING: usize = 10_000;

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
}

/// How the delivery worker runs, whatever the relay mode.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub retry_schedule: Vec<Duration>,
    pub max_age: Duration,
    pub keep_finished: Duration,
    pub workers: usize,
    pub max_per_destination: usize,
    pub pool_size: usize,
    pub paused: bool,
    pub max_messages_per_connection: usize,
    pub connection_idle_timeout: Duration,
    pub lease: Duration,
    pub poll_interval: Duration,
    pub timeout: Duration,
    pub mx_port: u16,
    /// Certificate check for a smarthost reached over TLS.
    pub smarthost_trust: TlsTrust,
    /// TEST ONLY (`relay.delivery_test_pause_after_send`).
    pub test_pause_after_send: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsTrust {
    /// The operating system's trust store.
    System,
    /// Only the certificates in this PEM file.
    CaFile(PathBuf),
    /// No verification at all (loopback testing).
    InsecureSkipVerify,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    None,
    StartTls,
    Implicit,
}

#[derive(Debug, Clone)]
pub struct Listener {
    pub addr: SocketAddr,
    pub tls: TlsMode,
}

#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
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

#[derive(Debug, Clone)]
pub enum Relay {
    File {
        dir: PathBuf,
    },
    Smarthost {
        host: String,
        tls: TlsMode,
        username: Option<String>,
        password: Option<String>,
    },
    Mx,
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
            let config = validate(raw, path, &base, &mut problems);
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

#[derive(Default)]
struct Problems(Vec<String>);

impl Problems {
    fn add(&mut self, key: impl std::fmt::Display, message: impl std::fmt::Display) {
        self.0.push(format!("{key}: {message}"));
    }

    /// Counts that size a semaphore, which panics above its maximum.
    fn at_most_permits(&mut self, key: &str, n: usize) {
        let max = tokio::sync::Semaphore::MAX_PERMITS;
        if n > max {
            self.add(key, format!("must be at most {max}"));
        }
    }

    fn duration(&mut self, key: &str, value: &str) -> Duration {
        parse_duration(value).unwrap_or_else(|e| {
            self.add(key, e);
            Duration::ZERO
        })
    }
}

fn resolve(base: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

fn parse_tls_mode(value: &str) -> Option<TlsMode> {
    match value {
        "none" => Some(TlsMode::None),
        "starttls" => Some(TlsMode::StartTls),
        "implicit" => Some(TlsMode::Implicit),
        _ => None,
    }
}

fn validate(raw: RawConfig, path: &Path, base: &Path, p: &mut Problems) -> Config {
    let s = &raw.server;
    if s.hostname.trim().is_empty() || s.hostname.contains(char::is_whitespace) {
        p.add("server.hostname", "must be a host name without spaces");
    }
    if s.max_message_size == 0 {
        p.add("server.max_message_size", "must be greater than 0");
    }
    if s.max_recipients == 0 {
        p.add("server.max_recipients", "must be greater than 0");
    }
    if s.max_connections == 0 {
        p.add("server.max_connections", "must be greater than 0");
    }
    p.at_most_permits("server.max_connections", s.max_connections);
    let command_timeout = p.duration("server.command_timeout", &s.command_timeout);
    let data_timeout = p.duration("server.data_timeout", &s.data_timeout);
    let shutdown_grace = p.duration("server.shutdown_grace", &s.shutdown_grace);

    if raw.listeners.is_empty() {
        p.add("listener", "at least one [[listener]] is required");
    }
    let mut listeners = Vec::new();
    for (i, l) in raw.listeners.iter().enumerate() {
        let addr = l.addr.parse::<SocketAddr>();
        let tls = parse_tls_mode(&l.tls);
        if addr.is_err() {
            p.add(
                format!("listener[{i}].addr"),
                format!("{:?} is not an address like 127.0.0.1:2587", l.addr),
            );
        }
        if tls.is_none() {
            p.add(
                format!("listener[{i}].tls"),
                format!("{:?} must be none, starttls or implicit", l.tls),
            );
        }
        if let (Ok(addr), Some(tls)) = (addr, tls) {
            if tls != TlsMode::None && raw.tls.is_none() {
                p.add(
                    format!("listener[{i}].tls"),
                    "needs a [tls] section with cert and key",
                );
            }
            listeners.push(Listener { addr, tls });
        }
    }

    let tls = raw.tls.as_ref().map(|t| TlsFiles {
        cert: resolve(base, &t.cert),
        key: resolve(base, &t.key),
    });
    if let Some(files) = &tls
        && let Err(e) = crate::tls::load_server_config(&files.cert, &files.key)
    {
        p.add("tls", e);
    }

    let mut users = Vec::new();
    for (i, u) in raw.users.iter().enumerate() {
        if let Err(e) = check_label(&u.name) {
            p.add(format!("user[{i}].name"), e);
        }
        if raw.users[..i].iter().any(|o| o.name == u.name) {
            p.add(
                format!("user[{i}].name"),
                format!("{:?} is defined twice", u.name),
            );
        }
        if let Err(e) = check_label(&u.workspace) {
            p.add(format!("user[{i}].workspace"), e);
        }
        if let Err(e) = crate::auth::check_password_hash(&u.password_hash) {
            p.add(format!("user[{i}].password_hash"), e);
        }
        let allowed_senders = u.allowed_senders.as_ref().map(|list| {
            list.iter()
                .enumerate()
                .filter_map(|(j, pat)| match SenderPattern::parse(pat) {
                    Ok(pat) => Some(pat),
                    Err(e) => {
                        p.add(format!("user[{i}].allowed_senders[{j}]"), e);
                        None
                    }
                })
                .collect()
        });
        let api_key_hash = u.api_key_hash.as_deref().and_then(|h| {
            http::parse_api_key_hash(h)
                .map_err(|e| p.add(format!("user[{i}].api_key_hash"), e))
                .ok()
        });
        if let Some(hash) = api_key_hash
            && users.iter().any(|o: &User| o.api_key_hash == Some(hash))
        {
            p.add(
                format!("user[{i}].api_key_hash"),
                "the same API key is given to another user",
            );
        }
        let operator = match u.role.as_deref() {
            None | Some("workspace") => false,
            Some("operator") => true,
            Some(other) => {
                p.add(
                    format!("user[{i}].role"),
                    format!("{other:?} is not a role: \"workspace\" (the default) or \"operator\""),
                );
                false
            }
        };
        users.push(User {
            name: u.name.clone(),
            password_hash: u.password_hash.clone(),
            workspace: u.workspace.clone(),
            allowed_senders,
            api_key_hash,
            operator,
        });
    }

    let mut trusted_networks = Vec::new();
    for (i, t) in raw.trusted_networks.iter().enumerate() {
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
    if users.is_empty() && trusted_networks.is_empty() {
        p.add(
            "user",
            "no [[user]] and no [[trusted_network]]: nobody could submit",
        );
    }

    let retention = p.duration("idempotency.retention", &raw.idempotency.retention);
    if retention.is_zero() {
        p.add("idempotency.retention", "must be greater than 0");
    }
    let purge_interval = p.duration(
        "idempotency.purge_interval",
        &raw.idempotency.purge_interval,
    );
    for name in &raw.idempotency.volatile_headers {
        if !is_field_name(name) {
            p.add(
                "idempotency.volatile_headers",
                format!("{name:?} is not a header name (printable ASCII, no spaces or colon)"),
            );
        }
    }
    check_key_headers(p, &raw.idempotency.key_headers);

    for name in &raw.idempotency.transit_headers {
        if !is_field_name(name.strip_suffix('*').unwrap_or(name)) {
            p.add(
                "idempotency.transit_headers",
                format!(
                    "{name:?} is not a header name or a prefix with a trailing * \
                     (printable ASCII, no spaces or colon)"
                ),
            );
        }
    }

    let r = &raw.relay;
    let relay = match r.mode.as_str() {
        "file" => match &r.dir {
            Some(dir) => Relay::File {
                dir: resolve(base, dir),
            },
            None => {
                p.add("relay.dir", "required when relay.mode = \"file\"");
                Relay::Mx
            }
        },
        "smarthost" => {
            let tls = r
                .tls
                .as_deref()
                .map_or(Some(TlsMode::StartTls), parse_tls_mode);
            if tls.is_none() {
                p.add("relay.tls", "must be none, starttls or implicit");
            }
            match &r.smarthost {
                Some(host) => Relay::Smarthost {
                    host: host.clone(),
                    tls: tls.unwrap_or(TlsMode::StartTls),
                    username: r.username.clone(),
                    password: r.password.clone(),
                },
                None => {
                    p.add(
                        "relay.smarthost",
                        "required when relay.mode = \"smarthost\"",
                    );
                    Relay::Mx
                }
            }
        }
        "mx" => Relay::Mx,
        other => {
            p.add(
                "relay.mode",
                format!("{other:?} must be file, smarthost or mx"),
            );
            Relay::Mx
        }
    };
    let delivery = validate_delivery(r, base, p);
    let limits = validate_limits(&raw.limits, p);
    let store = store::validate_store(&raw.store, base, p);
    let http = http::validate_http(raw.http.as_ref(), raw.tls.is_some(), p);
    let node_id = store::node_id(s.node_id.as_deref(), p);
    let auth = validate_auth(&raw.auth, p);
    let webhooks = webhook::validate_webhooks(&raw.webhooks, base, p);
    let workspaces: std::collections::BTreeSet<&str> = raw
        .users
        .iter()
        .map(|u| u.workspace.as_str())
        .chain(raw.trusted_networks.iter().map(|t| t.workspace.as_str()))
        .collect();
    let dkim = dkim::validate_dkim(&raw.dkim, base, &workspaces, p);
    check_unsigned_key_headers(p, &raw.dkim, &raw.idempotency.key_headers);
    let metrics = raw.metrics.as_ref().and_then(|m| {
        let addr = m.addr.parse::<SocketAddr>();
        if addr.is_err() {
            p.add(
                "metrics.addr",
                format!("{:?} is not an address like 127.0.0.1:9187", m.addr),
            );
        }
        if let Some(token) = &m.token
            && (token.len() < 16 || !token.bytes().all(|b| b.is_ascii_graphic()))
        {
            p.add(
                "metrics.token",
                "must be at least 16 visible ASCII characters (no spaces)",
            );
        }
        addr.ok().map(|addr| MetricsSettings {
            addr,
            token: m.token.clone(),
        })
    });

    Config {
        path: path.to_path_buf(),
        hostname: s.hostname.clone(),
        received_auth_header: s.received_auth_header,
        data_dir: resolve(base, &s.data_dir),
        node_id,
        store,
        http,
        max_message_size: usize::try_from(s.max_message_size).unwrap_or(usize::MAX),
        max_recipients: s.max_recipients,
        max_connections: s.max_connections,
        command_timeout,
        data_timeout,
        max_bad_commands: s.max_bad_commands,
        shutdown_grace,
        listeners,
        tls,
        allow_plaintext_auth: raw.auth.allow_plaintext,
        auth,
        users,
        trusted_networks,
        retention,
        purge_interval,
        volatile_headers: raw.idempotency.volatile_headers.clone(),
        transit_headers: raw.idempotency.transit_headers.clone(),
        key_headers: raw.idempotency.key_headers.clone(),
        relay,
        delivery,
        limits,
        metrics,
        webhooks,
        dkim,
    }
}

fn validate_auth(a: &RawAuth, p: &mut Problems) -> AuthSettings {
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

/// Account names and workspaces end up in replies, logs and the
/// `Received:` header: printable, no spaces, at most 255 bytes.
/// Whether `name` can be a header field name (RFC 5322: printable ASCII
/// except the colon, at least one character).
/// `[idempotency] key_headers`: a client migrating from another provider
/// keeps sending its own key header (issue 21 item 2).
fn check_key_headers(p: &mut Problems, names: &[String]) {
    const KEY: &str = "idempotency.key_headers";
    if names.is_empty() {
        p.add(
            KEY,
            "must name at least one header (the default is [\"X-Bird-Idempotency-Key\"])",
        );
    }
    for (i, name) in names.iter().enumerate() {
        if !is_field_name(name) {
            p.add(
                KEY,
                format!("{name:?} is not a header name (printable ASCII, no spaces or colon)"),
            );
        } else if names.iter().take(i).any(|n| n.eq_ignore_ascii_case(name)) {
            p.add(KEY, format!("{name:?} is listed twice"));
        }
    }
}

/// A key header is removed from the relayed copy (only
/// X-Bird-Idempotency-Key goes on): a signature over one would break.
/// X-Bird-Idempotency-Key itself is refused by the signer's own check.
fn check_unsigned_key_headers(p: &mut Problems, dkim: &[RawDkim], key_headers: &[String]) {
    for (i, d) in dkim.iter().enumerate() {
        for (j, h) in d.headers.iter().flatten().enumerate() {
            let is_key = key_headers.iter().any(|k| k.eq_ignore_ascii_case(h));
            if is_key && !h.eq_ignore_ascii_case("X-Bird-Idempotency-Key") {
                p.add(
                    format!("dkim[{i}].headers[{j}]"),
                    format!(
                        "{h} cannot be signed: it is in [idempotency] key_headers, \
                         so the relayed copy leaves it out"
                    ),
                );
            }
        }
    }
}

fn is_field_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| (0x21..=0x7e).contains(&b) && b != b':')
}

fn check_label(value: &str) -> Result<(), String> {
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

fn validate_limits(l: &RawLimits, p: &mut Problems) -> Limits {
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
    }
}

fn validate_delivery(r: &RawRelay, base: &Path, p: &mut Problems) -> Delivery {
    if r.retry_schedule.is_empty() {
        p.add("relay.retry_schedule", "needs at least one duration");
    }
    let retry_schedule: Vec<Duration> = r
        .retry_schedule
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let key = format!("relay.retry_schedule[{i}]");
            let d = p.duration(&key, d);
            if d.is_zero() {
                p.add(key, "must be greater than 0");
            }
            d
        })
        .collect();
    let max_age = p.duration("relay.max_age", &r.max_age);
    let keep_finished = p.duration("relay.keep_finished", &r.keep_finished);
    let lease = p.duration("relay.lease", &r.lease);
    let poll_interval = p.duration("relay.poll_interval", &r.poll_interval);
    let timeout = p.duration("relay.timeout", &r.timeout);
    let connection_idle_timeout =
        p.duration("relay.connection_idle_timeout", &r.connection_idle_timeout);
    for (key, d) in [
        ("relay.connection_idle_timeout", connection_idle_timeout),
        ("relay.max_age", max_age),
        ("relay.keep_finished", keep_finished),
        ("relay.poll_interval", poll_interval),
        ("relay.timeout", timeout),
    ] {
        if d.is_zero() {
            p.add(key, "must be greater than 0");
        }
    }
    // A delivery is cut off at half the lease, so the lease must leave
    // room for at least a couple of SMTP round trips.
    if lease < timeout * 2 {
        p.add("relay.lease", "must be at least twice relay.timeout");
    }
    if r.workers == 0 {
        p.add("relay.workers", "must be greater than 0");
    }
    if r.max_per_destination == 0 {
        p.add("relay.max_per_destination", "must be greater than 0");
    }
    p.at_most_permits("relay.workers", r.workers);
    p.at_most_permits("relay.max_per_destination", r.max_per_destination);
    if let Some(size) = r.pool_size {
        p.at_most_permits("relay.pool_size", size);
    }
    if r.max_messages_per_connection == 0 {
        p.add(
            "relay.max_messages_per_connection",
            "must be greater than 0",
        );
    }
    if r.mx_port == 0 {
        p.add("relay.mx_port", "must be a port number");
    }
    let smarthost_trust = match (&r.ca_file, r.insecure_skip_verify) {
        (Some(_), true) => {
            p.add(
                "relay.insecure_skip_verify",
                "cannot be combined with relay.ca_file",
            );
            TlsTrust::System
        }
        (Some(file), false) => {
            let file = resolve(base, file);
            if let Err(e) = crate::tls::load_roots(&file) {
                p.add("relay.ca_file", e);
            }
            TlsTrust::CaFile(file)
        }
        (None, true) => TlsTrust::InsecureSkipVerify,
        (None, false) => TlsTrust::System,
    };
    if r.username.is_some() != r.password.is_some() {
        p.add(
            "relay.password",
            "relay.username and relay.password go together",
        );
    }
    if let (Some(host), "smarthost") = (&r.smarthost, r.mode.as_str())
        && let Err(e) = crate::net::split_host_port(host, 25)
    {
        p.add("relay.smarthost", e);
    }
    let test_pause_after_send = r
        .delivery_test_pause_after_send
        .as_deref()
        .map_or(Duration::ZERO, |d| {
            p.duration("relay.delivery_test_pause_after_send", d)
        });
    Delivery {
        retry_schedule,
        max_age,
        keep_finished,
        workers: r.workers,
        max_per_destination: r.max_per_destination,
        pool_size: r.pool_size.unwrap_or(r.max_per_destination),
        paused: r.paused,
        max_messages_per_connection: r.max_messages_per_connection,
        connection_idle_timeout,
        lease,
        poll_interval,
        timeout,
        mx_port: r.mx_port,
        smarthost_trust,
        test_pause_after_send,
    }
}

/// Parses `90s`, `5m`, `3h`, `2d`, `250ms`, or a combination such as `1h30m`.
pub fn parse_duration(value: &str) -> Result<Duration, String> {
    let v = value.trim();
    if v.is_empty() {
        return Err("empty duration (use e.g. 30s, 5m, 3h)".into());
    }
    let mut total = Duration::ZERO;
    let mut rest = v;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!("{value:?} is not a duration like 30s, 5m or 3h"));
        }
        let n: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("{value:?}: number too large"))?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let part = match unit {
            "ms" => Some(Duration::from_millis(n)),
            "s" => Some(Duration::from_secs(n)),
            "m" => n.checked_mul(60).map(Duration::from_secs),
            "h" => n.checked_mul(3600).map(Duration::from_secs),
            "d" => n.checked_mul(86400).map(Duration::from_secs),
            _ => return Err(format!("{value:?}: unit must be ms, s, m, h or d")),
        };
        total = part
            .and_then(|part| total.checked_add(part))
            .filter(|t| *t <= MAX_DURATION)
            .ok_or_else(|| format!("{value:?}: longer than 100 years"))?;
    }
    Ok(total)
}

/// The longest duration a setting may have: far beyond any real use, and
/// short enough that adding it to a clock or doubling it cannot overflow.
const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 86400);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("3h"), Ok(Duration::from_secs(10800)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("3 hours").is_err());
        assert!(parse_duration("h").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("999999999999999999d").is_err());
        assert!(parse_duration("18446744073709551615s1s").is_err());
    }

    #[test]
    fn problems_are_reported_by_key() {
        let text = r#"
[server]
hostname = "relay.test"
data_dir = "data"
command_timeout = "soon"

[[listener]]
addr = "nowhere"
tls = "starttls"

[[user]]
name = "a"
password_hash = "plain"
workspace = "w"
allowed_senders = ["@@"]

[relay]
mode = "pigeon"
"#;
        let err = Config::from_toml(Path::new("/tmp/x.toml"), text).unwrap_err();
        let ConfigError::Invalid { problems, .. } = err else {
            panic!("expected Invalid, got {err}");
        };
        let keys: Vec<&str> = problems
            .iter()
            .map(|p| p.split(':').next().unwrap_or(""))
            .collect();
        for key in [
            "server.command_timeout",
            "listener[0].addr",
            "user[0].password_hash",
            "user[0].allowed_senders[0]",
            "relay.mode",
        ] {
            assert!(keys.contains(&key), "{key} missing from {problems:?}");
        }
    }

    /// Durations feed `Instant + d` in every session and `d * 2` in
    /// validation: one that overflows must be a problem by key, never a
    /// panic in check-config or in each connection's task.
    #[test]
    fn absurd_durations_are_refused_by_key() {
        assert!(parse_duration("9999999999999999999h").is_err());
        assert!(parse_duration("18446744073709551615s1s").is_err());
        let base = "[server]\nhostname = \"h\"\ndata_dir = \"d\"\n[[listener]]\naddr = \"127.0.0.1:0\"\n\
                    [[trusted_network]]\ncidr = \"127.0.0.1\"\nworkspace = \"w\"\n";
        for (extra, key) in [
            (
                "[limits]\ncommand_time_limit = \"200000000000000d\"\n",
                "limits.command_time_limit: ",
            ),
            (
                "[relay]\nmode = \"mx\"\ntimeout = \"200000000000000d\"\n",
                "relay.timeout: ",
            ),
            (
                "[idempotency]\nretention = \"18446744073709551615s1s\"\n",
                "idempotency.retention: ",
            ),
        ] {
            let err = Config::from_toml(Path::new("x.toml"), &format!("{base}{extra}"))
                .map(|_| ())
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{key} missing from {err}");
        }
    }

    /// These size tokio semaphores, which panic above MAX_PERMITS: for
    /// relay.workers inside the delivery task, leaving a daemon that
    /// accepts mail and never delivers it.
    #[test]
    fn counts_that_size_semaphores_are_bounded() {
        let huge = 3_000_000_000_000_000_000u64;
        let text = format!(
            "[server]\nhostname = \"h\"\ndata_dir = \"d\"\nmax_connections = {huge}\n\
             [[listener]]\naddr = \"127.0.0.1:0\"\n\
             [[trusted_network]]\ncidr = \"127.0.0.1\"\nworkspace = \"w\"\n\
             [relay]\nmode = \"mx\"\nworkers = {huge}\nmax_per_destination = {huge}\n"
        );
        let err = Config::from_toml(Path::new("x.toml"), &text)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        for key in [
            "server.max_connections: must be at most",
            "relay.workers: must be at most",
            "relay.max_per_destination: must be at most",
        ] {
            assert!(err.contains(key), "{key} missing from {err}");
        }
    }

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

    #[test]
    fn transit_headers_default_and_checked_by_key() {
        let base = "[server]\nhostname = \"h\"\ndata_dir = \"d\"\n[[listener]]\naddr = \"127.0.0.1:0\"\n\
                    [[trusted_network]]\ncidr = \"127.0.0.1\"\nworkspace = \"w\"\n[relay]\nmode = \"mx\"\n";
        let load = |extra: &str| Config::from_toml(Path::new("x.toml"), &format!("{base}{extra}"));
        let defaults = load("").map(|c| c.transit_headers);
        assert_eq!(
            defaults.map_err(|e| e.to_string()).map(|d| d.join(",")),
            Ok(
                "Received,Return-Path,X-Received,Delivered-To,X-Original-To,\
                DKIM-Signature,ARC-*,Authentication-Results"
                    .to_owned()
            )
        );
        let none = load("[idempotency]\ntransit_headers = []\n").map(|c| c.transit_headers);
        assert_eq!(none.ok(), Some(Vec::new()));
        let err =
            load("[idempotency]\ntransit_headers = [\"X-Trace-*\", \"*\", \"A B\", \"X:*\"]\n")
                .map(|_| ())
                .unwrap_err()
                .to_string();
        for bad in ["\"*\" is not", "\"A B\" is not", "\"X:*\" is not"] {
            assert!(
                err.contains(&format!("idempotency.transit_headers: {bad}")),
                "{bad} missing from {err}"
            );
        }
        assert!(!err.contains("X-Trace-*\" is not"), "{err}");
    }

    #[test]
    fn volatile_headers_default_and_checked_by_key() {
        let base = "[server]\nhostname = \"h\"\ndata_dir = \"d\"\n[[listener]]\naddr = \"127.0.0.1:0\"\n\
                    [[trusted_network]]\ncidr = \"127.0.0.1\"\nworkspace = \"w\"\n[relay]\nmode = \"mx\"\n";
        let load = |extra: &str| Config::from_toml(Path::new("x.toml"), &format!("{base}{extra}"));
        let defaults = load("").map(|c| c.volatile_headers);
        assert_eq!(
            defaults.map_err(|e| e.to_string()),
            Ok(vec!["Date".into(), "Message-ID".into()])
        );
        let strict = load("[idempotency]\nvolatile_headers = []\n").map(|c| c.volatile_headers);
        assert_eq!(strict.ok(), Some(Vec::new()));
        let err =
            load("[idempotency]\nvolatile_headers = [\"Date\", \"Message ID\", \"X:Y\", \"\"]\n")
                .map(|_| ())
                .unwrap_err()
                .to_string();
        for bad in ["\"Message ID\" is not", "\"X:Y\" is not", "\"\" is not"] {
            assert!(
                err.contains(&format!("idempotency.volatile_headers: {bad}")),
                "{bad} missing from {err}"
            );
        }
        assert!(!err.contains("\"Date\" is not"), "{err}");
    }

    /// Issue 21 item 2: `[idempotency] key_headers` defaults to ours and is
    /// checked by key.
    #[test]
    fn key_headers_default_and_checked_by_key() {
        let base = "[server]\nhostname = \"h\"\ndata_dir = \"d\"\n[[listener]]\naddr = \"127.0.0.1:0\"\n\
                    [[trusted_network]]\ncidr = \"127.0.0.1\"\nworkspace = \"w\"\n[relay]\nmode = \"mx\"\n";
        let load = |extra: &str| Config::from_toml(Path::new("x.toml"), &format!("{base}{extra}"));
        let defaults = load("").map(|c| c.key_headers);
        assert_eq!(
            defaults.map_err(|e| e.to_string()),
            Ok(vec!["X-Bird-Idempotency-Key".into()])
        );
        let ok =
            load("[idempotency]\nkey_headers = [\"X-Idempotency-Key\", \"Idempotency-Key\"]\n");
        assert_eq!(
            ok.map(|c| c.key_headers).map_err(|e| e.to_string()),
            Ok(vec!["X-Idempotency-Key".into(), "Idempotency-Key".into()])
        );
        let err = |extra: &str| load(extra).map(|_| ()).unwrap_err().to_string();
        let empty = err("[idempotency]\nkey_headers = []\n");
        assert!(
            empty.contains("idempotency.key_headers: must name at least one header"),
            "{empty}"
        );
        let bad = err(
            "[idempotency]\nkey_headers = [\"Idempotency-Key\", \"Idempotency Key\", \"\", \"idempotency-key\"]\n",
        );
        for needle in [
            "idempotency.key_headers: \"Idempotency Key\" is not a header name",
            "idempotency.key_headers: \"\" is not a header name",
            "idempotency.key_headers: \"idempotency-key\" is listed twice",
        ] {
            assert!(bad.contains(needle), "{needle} missing from {bad}");
        }
        assert!(!bad.contains("\"Idempotency-Key\" is"), "{bad}");
        // A listed key header leaves the relayed copy: it cannot be signed.
        let signed = err(
            "[idempotency]\nkey_headers = [\"X-Bird-Idempotency-Key\", \"X-Idempotency-Key\"]\n\
             [[dkim]]\ndomain = \"example.test\"\nselector = \"s\"\nprivate_key = \"missing.pem\"\n\
             headers = [\"Subject\", \"x-idempotency-key\"]\n",
        );
        assert!(
            signed.contains("dkim[0].headers[1]: x-idempotency-key cannot be signed"),
            "{signed}"
        );
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let text = "[server]\nhostname = \"h\"\ndata_dir = \"d\"\nmax_mesage_size = 1\n";
        let err = Config::from_toml(Path::new("x.toml"), text).unwrap_err();
        assert!(err.to_string().contains("max_mesage_size"), "{err}");
    }

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
