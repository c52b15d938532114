//! `[relay]`: where accepted mail goes (`Relay`: a folder, a smarthost or
//! the recipients' MX hosts) and how the delivery worker runs (`Delivery`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::listener::{SmtpTls, parse_tls_mode};
use super::problems::Problems;
use super::resolve;

/// Every key is optional: the defaults are `RawRelay::default()`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawRelay {
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
    pub insecure_skip_verify: bool,
    /// Waits after a failed attempt: the n-th deferral waits the n-th entry,
    /// later ones the last entry.
    pub retry_schedule: Vec<String>,
    /// Age at which a still-deferred recipient expires (and bounces).
    pub max_age: String,
    /// How long delivered, failed and expired messages stay in the queue
    /// (for `status`) before the worker removes them and their bodies.
    pub keep_finished: String,
    /// Keep a finished message's body (and trace) for `keep_finished` too;
    /// by default it is removed when the last recipient reaches a final
    /// state, and only the row and its attempts stay.
    pub keep_bodies: bool,
    /// Messages delivered at the same time, in total.
    pub workers: usize,
    /// Concurrent transactions to one destination (smarthost or MX domain).
    pub max_per_destination: usize,
    /// Open connections kept per destination between transactions
    /// (default: max_per_destination).
    pub pool_size: Option<usize>,
    /// Accept and queue, deliver nothing (maintenance, or measuring
    /// acceptance alone); the queue is delivered once unset and restarted.
    pub paused: bool,
    /// Messages waiting for delivery (queued or delivering) above which a
    /// new message waits before it is accepted (0: never wait).
    pub max_backlog: u64,
    /// The longest such a wait lasts (Postfix's `in_flow_delay`): then the
    /// message is accepted anyway, so a stalled relay slows clients down
    /// without refusing them.
    pub in_flow_delay: String,
    /// Messages sent over one outbound connection before it is closed
    /// (1: a new connection for every message).
    pub max_messages_per_connection: usize,
    /// An open outbound connection unused this long is closed.
    pub connection_idle_timeout: String,
    /// How long a claimed message belongs to the worker that claimed it.
    pub lease: String,
    /// How often the worker looks for newly accepted messages.
    pub poll_interval: String,
    /// Per SMTP command (connect, each reply, the message transfer).
    pub timeout: String,
    /// The port MX hosts are contacted on (25; another one only for tests).
    pub mx_port: u16,
    /// `mx` mode: the recursive DNS servers to ask (`ip:port` or `ip`),
    /// instead of `/etc/resolv.conf`'s. DANE trusts their AD flag only
    /// when they are on loopback (a local validating resolver).
    pub dns_servers: Vec<String>,
    /// `mx` mode: PEM file of the roots that `verify` (and MTA-STS) check
    /// MX certificates against, instead of the system's.
    pub mx_ca_file: Option<PathBuf>,
    /// `mx` mode: the TLS level for a domain with no entry in `tls_policy`.
    pub tls_default: String,
    /// `mx` mode: TLS level per recipient domain (Postfix's
    /// `smtp_tls_policy_maps`): none, may, encrypt, verify, dane, dane-only.
    pub tls_policy: std::collections::BTreeMap<String, String>,
    /// `mx` mode: honour MTA-STS policies (RFC 8461) for domains at the
    /// `dane` level.
    pub mta_sts: bool,
    /// The port MTA-STS policies are fetched from (443; another one only
    /// for tests).
    pub mta_sts_port: u16,
    /// `mx` mode: send TLS-RPT (RFC 8460) reports to domains that ask.
    pub tls_rpt: bool,
    /// How often reports are sent (a day; less only for tests).
    pub tls_rpt_interval: String,
    /// TEST ONLY: sleep this long after the next hop answered DATA and
    /// before recording the outcome, so a test can kill the process there.
    pub delivery_test_pause_after_send: Option<String>,
}

impl Default for RawRelay {
    fn default() -> Self {
        Self {
            mode: "file".into(),
            dir: None,
            smarthost: None,
            tls: None,
            username: None,
            password: None,
            ca_file: None,
            insecure_skip_verify: false,
            // Roughly doubling, capped at 4h: quick recovery from a blip,
            // little load on a host that is down for long.
            retry_schedule: ["1m", "2m", "4m", "8m", "16m", "32m", "1h", "2h", "4h"]
                .map(String::from)
                .to_vec(),
            max_age: "5d".into(),
            keep_finished: "7d".into(),
            keep_bodies: false,
            // Postfix's own defaults (default_process_limit, and
            // default_destination_concurrency_limit): enough to keep a
            // local smarthost busy on 2 cores, still polite to a remote MX.
            workers: 100,
            max_per_destination: 20,
            pool_size: None,
            paused: false,
            // About ten seconds of the relay's work on this machine: enough
            // to keep every worker busy, little enough that acceptance
            // follows delivery within seconds.
            max_backlog: 20_000,
            in_flow_delay: "1s".into(),
            max_messages_per_connection: 100,
            connection_idle_timeout: "30s".into(),
            lease: "30m".into(),
            poll_interval: "1s".into(),
            timeout: "5m".into(),
            mx_port: 25,
            dns_servers: Vec::new(),
            mx_ca_file: None,
            tls_default: "dane".into(),
            tls_policy: Default::default(),
            mta_sts: true,
            mta_sts_port: 443,
            tls_rpt: false,
            tls_rpt_interval: "24h".into(),
            delivery_test_pause_after_send: None,
        }
    }
}

#[derive(Debug, Clone)]
pub enum Relay {
    File {
        dir: PathBuf,
    },
    Smarthost {
        host: String,
        tls: SmtpTls,
        username: Option<String>,
        password: Option<String>,
    },
    Mx,
}

/// How the delivery worker runs, whatever the relay mode.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub retry_schedule: Vec<Duration>,
    pub max_age: Duration,
    pub keep_finished: Duration,
    pub keep_bodies: bool,
    pub workers: usize,
    pub max_per_destination: usize,
    pub pool_size: usize,
    pub paused: bool,
    /// 0 when paused: nothing would make room.
    pub max_backlog: u64,
    pub in_flow_delay: Duration,
    pub max_messages_per_connection: usize,
    pub connection_idle_timeout: Duration,
    pub lease: Duration,
    pub poll_interval: Duration,
    pub timeout: Duration,
    pub mx_port: u16,
    /// Empty: `/etc/resolv.conf`'s.
    pub dns_servers: Vec<std::net::SocketAddr>,
    /// Roots for `verify` (a CA file, or the system's).
    pub mx_trust: TlsTrust,
    pub tls_policy: TlsPolicy,
    pub mta_sts: bool,
    pub mta_sts_port: u16,
    pub tls_rpt: bool,
    pub tls_rpt_interval: Duration,
    /// Certificate check for a smarthost reached over TLS.
    pub smarthost_trust: TlsTrust,
    /// TEST ONLY (`relay.delivery_test_pause_after_send`).
    pub test_pause_after_send: Duration,
}

/// How much TLS a recipient domain's MX hosts must offer (`mx` mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsLevel {
    /// Plaintext, even when STARTTLS is offered.
    None,
    /// STARTTLS when offered, unverified; plaintext otherwise (RFC 7435).
    May,
    /// STARTTLS required, certificate not verified.
    Encrypt,
    /// STARTTLS required, certificate verified against the roots and the
    /// MX host name.
    Verify,
    /// DANE where DNSSEC-validated TLSA records are published, `may`
    /// elsewhere (the default).
    Dane,
    /// DANE required: without usable TLSA records, defer.
    DaneOnly,
}

impl TlsLevel {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "none" => Self::None,
            "may" => Self::May,
            "encrypt" => Self::Encrypt,
            "verify" => Self::Verify,
            "dane" => Self::Dane,
            "dane-only" => Self::DaneOnly,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::May => "may",
            Self::Encrypt => "encrypt",
            Self::Verify => "verify",
            Self::Dane => "dane",
            Self::DaneOnly => "dane-only",
        }
    }
}

/// `tls_default` and the per-domain `tls_policy`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsPolicy {
    pub default: TlsLevel,
    /// Lowercase domain names, without a trailing dot.
    pub domains: std::collections::BTreeMap<String, TlsLevel>,
}

impl TlsPolicy {
    pub fn level_for(&self, domain: &str) -> TlsLevel {
        let domain = domain.trim_end_matches('.').to_ascii_lowercase();
        self.domains.get(&domain).copied().unwrap_or(self.default)
    }
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

/// `mode` and what it needs. After a problem the relay is `Mx`, a stand-in
/// for a config that is refused anyway.
pub(super) fn check_relay(r: &RawRelay, base: &Path, p: &mut Problems) -> Relay {
    match r.mode.as_str() {
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
                .map_or(Some(SmtpTls::StartTls), parse_tls_mode);
            if tls.is_none() {
                p.add("relay.tls", "must be none, starttls or implicit");
            }
            match &r.smarthost {
                Some(host) => Relay::Smarthost {
                    host: host.clone(),
                    tls: tls.unwrap_or(SmtpTls::StartTls),
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
    }
}

pub(super) fn check_delivery(r: &RawRelay, base: &Path, p: &mut Problems) -> Delivery {
    let retry_schedule = check_retry_schedule(&r.retry_schedule, p);
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
    check_counts(r, p);
    let smarthost_trust = check_smarthost_trust(r, base, p);
    let mx_trust = match &r.mx_ca_file {
        Some(file) => {
            let file = resolve(base, file);
            if let Err(e) = crate::tls::load_roots(&file) {
                p.add("relay.mx_ca_file", e);
            }
            TlsTrust::CaFile(file)
        }
        None => TlsTrust::System,
    };
    let dns_servers = check_dns_servers(&r.dns_servers, p);
    let tls_policy = check_tls_policy(r, p);
    let tls_rpt_interval = p.duration("relay.tls_rpt_interval", &r.tls_rpt_interval);
    if tls_rpt_interval.is_zero() {
        p.add("relay.tls_rpt_interval", "must be greater than 0");
    }
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
    let in_flow_delay = p.duration("relay.in_flow_delay", &r.in_flow_delay);
    // A client waits for its reply meanwhile: well within any client's
    // end-of-data timeout (RFC 5321 suggests 10 minutes).
    if in_flow_delay > Duration::from_secs(60) {
        p.add("relay.in_flow_delay", "must be at most 60s");
    }
    Delivery {
        retry_schedule,
        max_age,
        keep_finished,
        keep_bodies: r.keep_bodies,
        workers: r.workers,
        max_per_destination: r.max_per_destination,
        pool_size: r.pool_size.unwrap_or(r.max_per_destination),
        paused: r.paused,
        max_backlog: if r.paused { 0 } else { r.max_backlog },
        in_flow_delay,
        max_messages_per_connection: r.max_messages_per_connection,
        connection_idle_timeout,
        lease,
        poll_interval,
        timeout,
        mx_port: r.mx_port,
        dns_servers,
        mx_trust,
        tls_policy,
        mta_sts: r.mta_sts,
        mta_sts_port: r.mta_sts_port,
        tls_rpt: r.tls_rpt,
        tls_rpt_interval,
        smarthost_trust,
        test_pause_after_send,
    }
}

/// `ip:port`, or an `ip` meaning port 53.
fn check_dns_servers(servers: &[String], p: &mut Problems) -> Vec<std::net::SocketAddr> {
    let mut out = Vec::new();
    for (i, s) in servers.iter().enumerate() {
        let parsed = s
            .parse::<std::net::SocketAddr>()
            .ok()
            .or_else(|| s.parse::<std::net::IpAddr>().ok().map(|ip| (ip, 53).into()));
        match parsed {
            Some(addr) => out.push(addr),
            None => p.add(
                format!("relay.dns_servers[{i}]"),
                format!("{s:?} must be an IP address, with or without :port"),
            ),
        }
    }
    out
}

fn check_tls_policy(r: &RawRelay, p: &mut Problems) -> TlsPolicy {
    const LEVELS: &str = "must be none, may, encrypt, verify, dane or dane-only";
    let default = TlsLevel::parse(&r.tls_default).unwrap_or_else(|| {
        p.add("relay.tls_default", format!("{:?} {LEVELS}", r.tls_default));
        TlsLevel::Dane
    });
    let mut domains = std::collections::BTreeMap::new();
    for (domain, level) in &r.tls_policy {
        let key = format!("relay.tls_policy.{domain:?}");
        let name = domain.trim_end_matches('.').to_ascii_lowercase();
        let valid = !name.is_empty()
            && name.split('.').all(|l| {
                !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            });
        if !valid {
            p.add(key.clone(), "must be a domain name");
        }
        match TlsLevel::parse(level) {
            Some(level) => {
                domains.insert(name, level);
            }
            None => p.add(key, format!("{level:?} {LEVELS}")),
        }
    }
    TlsPolicy { default, domains }
}

fn check_retry_schedule(schedule: &[String], p: &mut Problems) -> Vec<Duration> {
    if schedule.is_empty() {
        p.add("relay.retry_schedule", "needs at least one duration");
    }
    schedule
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
        .collect()
}

/// The worker's counts, and the port: each sizes something (semaphores,
/// pools) that zero or a huge number would break.
fn check_counts(r: &RawRelay, p: &mut Problems) {
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
    if r.mta_sts_port == 0 {
        p.add("relay.mta_sts_port", "must be a port number");
    }
}

/// `ca_file` (loaded, so a bad file is named here) or
/// `insecure_skip_verify`, not both.
fn check_smarthost_trust(r: &RawRelay, base: &Path, p: &mut Problems) -> TlsTrust {
    match (&r.ca_file, r.insecure_skip_verify) {
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
    }
}
