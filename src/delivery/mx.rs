//! `mode = "mx"`: direct delivery to each recipient domain's mail
//! exchangers (RFC 5321 5.1), one transaction per domain, with
//! opportunistic STARTTLS.
//!
//! DNS sits behind the small [`Resolver`] trait so the routing rules (MX
//! preference order, implicit MX, null MX) are tested with made-up answers.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use super::connection_pool::{Conn, ConnectionPool, Mail, PoolSettings};
use super::dane::{self, Tlsa};
use super::mta_sts::fetch::Fetcher;
use super::mta_sts::{Mode, MtaSts, Policy};
use super::outgoing::Outgoing;
pub use super::resolver::{DnsError, MxAnswer, MxRecord, Resolver, Secured};
use super::smtp::{self, ClientSettings, Security};
use super::smtp::{Session, SetupError};
use super::tls_rpt as rpt;
use super::{DeliveryError, REQUIRETLS_REFUSED, RcptResult, Status, domain_of};
use crate::config::{TlsLevel, TlsPolicy, TlsTrust};

/// Where mail for a domain goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Hosts in the order to try them.
    Hosts {
        hosts: Vec<String>,
        implicit: bool,
    },
    /// RFC 7505: the domain accepts no mail.
    NullMx,
    NoDomain,
}

/// Applies RFC 5321 5.1 and RFC 7505 to an MX answer. Hosts of equal
/// preference are ordered by `seed`, which callers vary to spread load.
pub fn route(domain: &str, answer: MxAnswer, seed: u64) -> Route {
    match answer {
        MxAnswer::NoDomain => Route::NoDomain,
        // No MX: the domain itself is the implicit MX.
        MxAnswer::NoRecords => Route::Hosts {
            hosts: vec![domain.to_owned()],
            implicit: true,
        },
        MxAnswer::Records(records) if records.is_empty() => Route::Hosts {
            hosts: vec![domain.to_owned()],
            implicit: true,
        },
        MxAnswer::Records(records) if records.iter().any(|r| r.exchange.is_empty()) => {
            Route::NullMx
        }
        MxAnswer::Records(mut records) => {
            records.sort_by_key(|r| (r.preference, mix(seed, &r.exchange)));
            let mut hosts: Vec<String> = Vec::with_capacity(records.len());
            for r in records {
                let host = r.exchange.to_ascii_lowercase();
                if !hosts.contains(&host) {
                    hosts.push(host);
                }
            }
            Route::Hosts {
                hosts,
                implicit: false,
            }
        }
    }
}

/// FNV-1a of the name, salted: a cheap shuffle key for equal preferences.
fn mix(seed: u64, name: &str) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::from(d.subsec_nanos()))
}

/// What `mx` mode needs to know besides DNS: the port, the TLS policy, and
/// who we are (so mail never loops back to this relay).
#[derive(Debug, Clone)]
pub struct MxSettings {
    pub port: u16,
    pub policy: TlsPolicy,
    /// Roots for `verify`.
    pub trust: TlsTrust,
    /// `server.hostname`: an MX of this name is this relay.
    pub hostname: String,
    /// The SMTP listeners' addresses: an MX address among them is this relay.
    pub listeners: Vec<SocketAddr>,
    /// MTA-STS for domains at the `dane` level; `None`: off.
    pub mta_sts: Option<StsSettings>,
    /// Count sessions under DANE and MTA-STS for TLS-RPT.
    pub tls_rpt: bool,
}

#[derive(Debug, Clone)]
pub struct StsSettings {
    /// Where policies are fetched (443; another one only for tests).
    pub port: u16,
    /// The fetch's whole deadline.
    pub deadline: std::time::Duration,
    /// The cache kept across restarts.
    pub cache_file: Option<std::path::PathBuf>,
}

impl MxSettings {
    /// Port `port`, the default policy, system roots, nobody's listeners.
    pub fn new(port: u16) -> Self {
        Self {
            port,
            policy: TlsPolicy {
                default: TlsLevel::Dane,
                domains: Default::default(),
            },
            trust: TlsTrust::System,
            hostname: String::new(),
            listeners: Vec::new(),
            mta_sts: None,
            tls_rpt: false,
        }
    }

    /// RFC 5321 5.1 (and Postfix's "mail for ... loops back to myself"):
    /// this relay must never be one of its own next hops.
    fn is_self(&self, host: &str, ip: Option<IpAddr>) -> bool {
        if !self.hostname.is_empty() && host.eq_ignore_ascii_case(&self.hostname) {
            return true;
        }
        ip.is_some_and(|ip| {
            self.listeners.iter().any(|l| {
                l.port() == self.port
                    && (l.ip() == ip || (l.ip().is_unspecified() && ip.is_loopback()))
            })
        })
    }
}

/// How one MX host is reached, from the domain's TLS level and its DNS.
#[derive(Debug, Clone)]
enum Plan {
    Plain,
    /// STARTTLS if offered, plaintext if not or if the handshake fails.
    Opportunistic,
    /// STARTTLS or nothing; any certificate.
    Encrypt,
    /// STARTTLS or nothing; a certificate for the host from the roots.
    Verify,
    /// STARTTLS or nothing; a certificate the TLSA records vouch for.
    Dane(Vec<Tlsa>),
    /// An MTA-STS policy: `Verify`, recorded as `mta-sts`; in `testing`
    /// mode a failure falls back to `may` (and is reported).
    Sts {
        policy: Policy,
        testing: bool,
    },
}

impl Plan {
    /// Sessions opened under different plans are never mixed in the pool.
    fn tag(&self) -> &'static str {
        match self {
            Plan::Plain => "plain",
            Plan::Opportunistic => "may",
            Plan::Encrypt => "encrypt",
            Plan::Verify => "verify",
            Plan::Dane(_) => "dane",
            Plan::Sts { testing: false, .. } => "mta-sts",
            Plan::Sts { testing: true, .. } => "mta-sts-testing",
        }
    }

    /// TLS that authenticates the MX host: what REQUIRETLS needs.
    fn authenticates(&self) -> bool {
        matches!(
            self,
            Plan::Verify | Plan::Dane(_) | Plan::Sts { testing: false, .. }
        )
    }
}

/// MX hosts (and DANE connectors) tracked at once; beyond, the idle go.
const MAX_TRACKED: usize = 10_000;

pub struct MxTransport {
    resolver: Arc<dyn Resolver>,
    mx: MxSettings,
    unverified: tokio_rustls::TlsConnector,
    verified: tokio_rustls::TlsConnector,
    settings: ClientSettings,
    sts: Option<MtaSts>,
    /// TLS-RPT's counts (`relay.tls_rpt`).
    reports: Option<Arc<rpt::Collector>>,
    /// Sessions at once per MX host (the pool's size): `host_slot`.
    per_host: usize,
    host_slots: std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Semaphore>>>,
    dane_connectors: std::sync::Mutex<
        std::collections::HashMap<String, (tokio_rustls::TlsConnector, dane::Matched)>,
    >,
    /// Open sessions per MX host, reused across messages and domains.
    pool: ConnectionPool,
}

/// The recipients' common outcome when no host could be used.
fn all(recipients: &[String], status: Status, why: &str) -> Vec<RcptResult> {
    RcptResult::all(recipients, status, why, None)
}

impl MxTransport {
    pub fn new(
        resolver: Arc<dyn Resolver>,
        mx: MxSettings,
        settings: ClientSettings,
    ) -> Result<Self, DeliveryError> {
        let unverified = super::tls::unverified()
            .map_err(|e| DeliveryError::Setup(format!("relay TLS: {e}")))?;
        let verified = super::tls::connector(&mx.trust)
            .map_err(|e| DeliveryError::Setup(format!("relay TLS (mx_ca_file): {e}")))?;
        let sts = mx.mta_sts.as_ref().map(|s| {
            let fetcher = Fetcher {
                tls: verified.clone(),
                port: s.port,
                deadline: s.deadline,
            };
            MtaSts::new(resolver.clone(), fetcher, s.cache_file.clone())
        });
        let reports = mx.tls_rpt.then(Default::default);
        Ok(Self {
            resolver,
            mx,
            unverified,
            verified,
            settings,
            sts,
            reports,
            per_host: PoolSettings::default().max_idle,
            host_slots: Default::default(),
            dane_connectors: Default::default(),
            pool: ConnectionPool::new(PoolSettings::default()),
        })
    }

    /// Connection reuse as configured (the default otherwise).
    pub fn with_pool(mut self, settings: PoolSettings) -> Self {
        self.per_host = settings.max_idle.max(1);
        self.pool = ConnectionPool::new(settings);
        self
    }

    /// A slot for one session to `host`. Many domains can share one MX
    /// host (a provider's), and the worker limits each domain alone:
    /// without this, their sessions beyond the pool's size would each be
    /// opened (TCP, STARTTLS) for one message and closed after it.
    async fn host_slot(&self, host: &str) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let slot = {
            let mut slots = self.host_slots.lock().ok()?;
            if slots.len() >= MAX_TRACKED {
                slots.retain(|_, s| Arc::strong_count(s) > 1);
            }
            slots
                .entry(host.to_owned())
                .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(self.per_host)))
                .clone()
        };
        slot.acquire_owned().await.ok()
    }

    /// One DANE connector per host and TLSA set, kept: its sessions resume
    /// (a resumed session was verified against these very records).
    fn dane_connector(
        &self,
        host: &str,
        domain: &str,
        records: &[Tlsa],
    ) -> Result<(tokio_rustls::TlsConnector, dane::Matched), String> {
        let key = std::iter::once(host.to_owned())
            .chain(records.iter().map(Tlsa::text))
            .collect::<Vec<_>>()
            .join(" ");
        let mut cache = self
            .dane_connectors
            .lock()
            .map_err(|_| "451 4.7.5 DANE: connector cache poisoned".to_string())?;
        if let Some(found) = cache.get(&key) {
            return Ok(found.clone());
        }
        let matched = dane::Matched::default();
        let names = vec![host.to_owned(), domain.to_owned()];
        let connector = dane::connector(records.to_vec(), names, matched.clone())
            .map_err(|e| format!("451 4.7.5 DANE: {e}"))?;
        if cache.len() >= MAX_TRACKED {
            cache.clear();
        }
        cache.insert(key, (connector.clone(), matched.clone()));
        Ok((connector, matched))
    }

    /// Closes the pooled sessions with QUIT (shutdown).
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Delivers to recipients that all share one domain.
    pub async fn deliver(&self, msg: &Outgoing, recipients: &[String]) -> Vec<RcptResult> {
        let Some(domain) = recipients.first().and_then(|r| domain_of(r)) else {
            return all(
                recipients,
                Status::Failed,
                "550 5.1.3 recipient address has no domain",
            );
        };
        if let Some(literal) = domain.strip_prefix('[').and_then(|d| d.strip_suffix(']')) {
            return self
                .deliver_to_literal(msg, recipients, &domain, literal)
                .await;
        }
        let require_tls = msg.options.require_tls;
        let level = match self.mx.policy.level_for(&domain) {
            // RFC 8689 5: the sender asks that the recipient domain's own
            // TLS policies (DANE, MTA-STS) not stop this message; the
            // operator's levels still hold. REQUIRETLS overrides it.
            TlsLevel::Dane if !require_tls && msg.tls_not_required() => TlsLevel::May,
            level => level,
        };
        let (hosts, mx_secure) = match self.resolver.mx(&domain).await {
            Err(e) => return all(recipients, Status::Deferred, &format!("451 4.4.3 {e}")),
            Ok(answer) => match route(&domain, answer.value, seed()) {
                Route::NullMx => {
                    return all(
                        recipients,
                        Status::Failed,
                        &format!("556 5.1.10 {domain} accepts no mail (null MX, RFC 7505)"),
                    );
                }
                Route::NoDomain => {
                    return all(
                        recipients,
                        Status::Failed,
                        &format!("550 5.1.2 domain {domain} does not exist"),
                    );
                }
                Route::Hosts { hosts, .. } => (hosts, answer.secure),
            },
        };
        let sts = match (&self.sts, level) {
            (Some(sts), TlsLevel::Dane) => sts.policy_for(&domain).await,
            _ => None,
        };
        let enforce = sts.as_ref().is_some_and(|p| p.mode == Mode::Enforce);
        let sts_plan = sts.as_ref().filter(|p| p.mode != Mode::None);
        let hosts = match &sts {
            Some(p) if p.mode != Mode::None => {
                let (allowed, refused): (Vec<String>, Vec<String>) =
                    hosts.into_iter().partition(|h| p.allows(h));
                if !refused.is_empty() {
                    tracing::warn!(%domain, mode = ?p.mode, refused = ?refused, mx = %p.patterns(), "MX hosts not in the domain's MTA-STS policy");
                }
                if enforce && allowed.is_empty() {
                    let why = format!(
                        "451 4.7.5 MTA-STS policy of {domain} (enforce): no MX host ({}) matches mx: {}",
                        refused.join(", "),
                        p.patterns()
                    );
                    return all(recipients, Status::Deferred, &why);
                }
                if enforce {
                    allowed
                } else {
                    allowed.into_iter().chain(refused).collect()
                }
            }
            _ => hosts,
        };
        let mut last = None;
        let mut any_address = false;
        // Every host refused for want of what REQUIRETLS needs: a bounce.
        let mut requiretls_only = true;
        for host in &hosts {
            let ips = match self.resolver.ips(host).await {
                Ok(ips) => ips,
                Err(e) => {
                    last = Some(format!("451 4.4.3 {host}: {e}"));
                    any_address = true; // unknown, so not a permanent failure
                    continue;
                }
            };
            let us = self.mx.is_self(host, None)
                || ips.value.iter().any(|ip| self.mx.is_self(host, Some(*ip)));
            if us {
                // We are this MX: hosts of lower preference are backups of
                // ours, never to be tried (RFC 5321 5.1).
                tracing::warn!(%domain, %host, "MX host is this relay: mail would loop");
                let why = format!(
                    "550 5.4.6 mail for {domain} loops back to myself (MX {host} is this relay)"
                );
                return match last {
                    Some(earlier) => all(recipients, Status::Deferred, &earlier),
                    None => all(recipients, Status::Failed, &why),
                };
            }
            if ips.value.is_empty() {
                continue;
            }
            any_address = true;
            let plan = match self
                .plan(level, host, mx_secure && ips.secure, sts_plan)
                .await
            {
                Ok(plan) if require_tls && !plan.authenticates() => {
                    last = Some(format!(
                        "{REQUIRETLS_REFUSED} REQUIRETLS: no DANE, MTA-STS or verified TLS for MX {host} (TLS policy {} for {domain})",
                        plan.tag()
                    ));
                    continue;
                }
                Ok(plan) => plan,
                Err(why) => {
                    requiretls_only = false;
                    last = Some(why);
                    continue;
                }
            };
            match self
                .try_host(msg, recipients, host, &domain, &ips.value, &plan)
                .await
            {
                Ok(results) => return results,
                Err(e) => {
                    requiretls_only &= e.starts_with(REQUIRETLS_REFUSED);
                    last = Some(e);
                }
            }
        }
        if let Some(why) = last.as_deref().filter(|_| require_tls && requiretls_only) {
            return all(recipients, Status::Failed, why);
        }
        if !any_address {
            return all(
                recipients,
                Status::Failed,
                &format!("550 5.4.4 no address for any mail exchanger of {domain}"),
            );
        }
        all(
            recipients,
            Status::Deferred,
            &last.unwrap_or_else(|| format!("451 4.4.1 no mail exchanger of {domain} answered")),
        )
    }

    /// A domain literal (RFC 5321 4.1.3) names the host directly: no DNS,
    /// so no DANE; `may` unless the policy asks for less.
    async fn deliver_to_literal(
        &self,
        msg: &Outgoing,
        recipients: &[String],
        domain: &str,
        literal: &str,
    ) -> Vec<RcptResult> {
        let ip = match literal.get(..5) {
            Some(tag) if tag.eq_ignore_ascii_case("IPv6:") => literal.get(5..).unwrap_or_default(),
            _ => literal,
        };
        let Ok(ip) = ip.parse::<IpAddr>() else {
            return all(recipients, Status::Failed, "550 5.1.2 bad address literal");
        };
        if self.mx.is_self(domain, Some(ip)) {
            let why = format!("550 5.4.6 mail for {domain} loops back to myself");
            return all(recipients, Status::Failed, &why);
        }
        let plan = match self.mx.policy.level_for(domain) {
            TlsLevel::None => Plan::Plain,
            TlsLevel::Encrypt => Plan::Encrypt,
            TlsLevel::Verify => Plan::Verify,
            TlsLevel::DaneOnly => {
                let why = format!(
                    "451 4.7.5 TLS policy dane-only for {domain}: an address literal has no TLSA records"
                );
                return all(recipients, Status::Deferred, &why);
            }
            TlsLevel::May | TlsLevel::Dane => Plan::Opportunistic,
        };
        if msg.options.require_tls && !plan.authenticates() {
            let why = format!(
                "{REQUIRETLS_REFUSED} REQUIRETLS: an address literal has no DANE or MTA-STS (TLS policy {} for {domain})",
                plan.tag()
            );
            return all(recipients, Status::Failed, &why);
        }
        self.try_host(msg, recipients, domain, domain, &[ip], &plan)
            .await
            .unwrap_or_else(|e| {
                let status = if e.starts_with(REQUIRETLS_REFUSED) {
                    Status::Failed
                } else {
                    Status::Deferred
                };
                all(recipients, status, &e)
            })
    }

    /// The plan for `host` under `level`. `Err`: this host can't be used
    /// now (its TLSA lookup failed, or `dane-only` found no DANE).
    /// `secure`: the MX and address answers were DNSSEC-validated, so the
    /// host's TLSA records can be trusted (RFC 7672 2.2).
    /// `sts`: the domain has an `enforce` MTA-STS policy, which applies
    /// where DANE does not (DANE wins, RFC 8461 2).
    async fn plan(
        &self,
        level: TlsLevel,
        host: &str,
        secure: bool,
        sts: Option<&Policy>,
    ) -> Result<Plan, String> {
        let fallback = match level {
            TlsLevel::None => return Ok(Plan::Plain),
            TlsLevel::May => return Ok(Plan::Opportunistic),
            TlsLevel::Encrypt => return Ok(Plan::Encrypt),
            TlsLevel::Verify => return Ok(Plan::Verify),
            TlsLevel::Dane if sts.is_some() => match sts {
                Some(p) => Plan::Sts {
                    policy: p.clone(),
                    testing: p.mode == Mode::Testing,
                },
                None => Plan::Opportunistic,
            },
            TlsLevel::Dane => Plan::Opportunistic,
            TlsLevel::DaneOnly => {
                if !secure {
                    return Err(format!(
                        "451 4.7.5 TLS policy dane-only: the DNS answers for MX {host} are not DNSSEC-validated"
                    ));
                }
                Plan::Encrypt
            }
        };
        if !secure {
            return Ok(fallback);
        }
        let name = format!("_{}._tcp.{host}", self.mx.port);
        match self.resolver.tlsa(&name).await {
            // RFC 7672 2.2: a failed (or bogus) TLSA lookup makes the host
            // unusable; plaintext would be what an attacker wants.
            Err(e) => Err(format!(
                "451 4.7.5 DANE: TLSA lookup for {host} failed: {e}"
            )),
            Ok(tlsa) if tlsa.secure && !tlsa.value.is_empty() => {
                if tlsa.value.iter().any(Tlsa::usable) {
                    Ok(Plan::Dane(tlsa.value))
                } else {
                    // RFC 7672 3.1: unusable records still mean "TLS here".
                    Ok(Plan::Encrypt)
                }
            }
            Ok(_) if level == TlsLevel::DaneOnly => Err(format!(
                "451 4.7.5 TLS policy dane-only: no DNSSEC-validated TLSA records at {name}"
            )),
            Ok(_) => Ok(fallback),
        }
    }

    /// One transaction with `host`: on a pooled session to it, or with the
    /// first of its addresses that answers.
    async fn try_host(
        &self,
        msg: &Outgoing,
        recipients: &[String],
        host: &str,
        domain: &str,
        ips: &[IpAddr],
        plan: &Plan,
    ) -> Result<Vec<RcptResult>, String> {
        let content = msg.bytes_for(recipients);
        let require_tls = msg.options.require_tls;
        let mail = Mail {
            from: &msg.reverse_path,
            recipients,
            content: &content,
            require_tls,
        };
        let _slot = self.host_slot(host).await;
        let rt = if require_tls { "/requiretls" } else { "" };
        let key = format!("{host}:{}/{}{rt}", self.mx.port, plan.tag());
        self.pool
            .send(&key, &mail, || {
                self.open(host, domain, ips, plan, require_tls)
            })
            .await
    }

    /// TLS-RPT: a session under DANE or MTA-STS succeeded, or failed in its
    /// TLS (STARTTLS missing, a certificate refused).
    fn report(
        &self,
        plan: &Plan,
        domain: &str,
        host: &str,
        addr: SocketAddr,
        session: &Result<Session, SetupError>,
    ) {
        let Some(collector) = &self.reports else {
            return;
        };
        let policy = match plan {
            Plan::Dane(records) => rpt::Policy {
                kind: rpt::PolicyType::Tlsa,
                strings: records.iter().map(Tlsa::text).collect(),
            },
            Plan::Sts { policy, .. } => rpt::Policy {
                kind: rpt::PolicyType::Sts,
                strings: policy.lines(),
            },
            _ => return,
        };
        match session {
            Ok(_) => collector.success(domain, &policy),
            Err(e) if e.tls || e.message.contains("STARTTLS") => {
                let failure = rpt::Failure {
                    result_type: rpt::result_type(policy.kind, &e.message).to_owned(),
                    mx_host: host.to_owned(),
                    ip: Some(addr.ip()),
                };
                collector.failure(domain, &policy, failure);
            }
            Err(_) => {}
        }
    }

    /// What the TLS-RPT reporter needs, when reports are on.
    pub fn tls_reporting(&self) -> Option<rpt::reporter::Parts> {
        self.reports.as_ref().map(|c| rpt::reporter::Parts {
            collector: c.clone(),
            resolver: self.resolver.clone(),
            tls: self.verified.clone(),
        })
    }

    /// `require_tls`: a session whose host does not offer REQUIRETLS is
    /// closed unused (RFC 8689 4.2.1).
    async fn open(
        &self,
        host: &str,
        domain: &str,
        ips: &[IpAddr],
        plan: &Plan,
        require_tls: bool,
    ) -> Result<Conn, String> {
        let mut last = format!("{host}: no address");
        for ip in ips {
            let addr = SocketAddr::new(*ip, self.mx.port);
            let mut matched = dane::Matched::default();
            let (security, auth) = match plan {
                Plan::Plain => (Security::Plain, "none"),
                Plan::Opportunistic => (Security::Opportunistic(self.unverified.clone()), "none"),
                Plan::Encrypt => (Security::StartTls(self.unverified.clone()), "none"),
                Plan::Verify => (Security::StartTls(self.verified.clone()), "verified"),
                Plan::Sts { .. } => (Security::StartTls(self.verified.clone()), "mta-sts"),
                Plan::Dane(records) => {
                    let (connector, m) = self.dane_connector(host, domain, records)?;
                    matched = m;
                    (Security::StartTls(connector), "dane")
                }
            };
            let mut session = smtp::open(addr, host, &security, None, &self.settings).await;
            self.report(plan, domain, host, addr, &session);
            if let Err(e) = &session
                && (e.tls || e.message.contains("STARTTLS"))
                && matches!(plan, Plan::Sts { testing: true, .. })
            {
                // `testing`: reported above; delivered as without a policy.
                tracing::info!(%domain, %host, %addr, error = %e, "MTA-STS testing: the policy would refuse this host");
                let may = Security::Opportunistic(self.unverified.clone());
                session = smtp::open(addr, host, &may, None, &self.settings).await;
            }
            if let Err(e) = &session
                && e.tls
                && matches!(plan, Plan::Opportunistic | Plan::Sts { testing: true, .. })
            {
                // A broken TLS stack must not stop delivery that plaintext
                // would complete: opportunistic means exactly that.
                tracing::info!(%host, %addr, error = %e, "STARTTLS failed; retrying without TLS");
                session = smtp::open(addr, host, &Security::Plain, None, &self.settings).await;
            }
            match session {
                Ok(session) if require_tls && !session.takes_requiretls() => {
                    session.quit().await;
                    last = format!(
                        "{REQUIRETLS_REFUSED} REQUIRETLS: MX {host} [{addr}] does not offer REQUIRETLS"
                    );
                }
                Ok(session) => {
                    let auth = matched.get().copied().unwrap_or(auth);
                    let hop = format!("{host} [{addr}] {}", session.security(auth));
                    return Ok(Conn::new(session, &hop, self.settings.timeout));
                }
                Err(e) => {
                    let reason = match plan {
                        Plan::Plain | Plan::Opportunistic => String::new(),
                        Plan::Sts { testing: false, .. } => {
                            format!(" (MTA-STS policy of {domain}: enforce)")
                        }
                        p => format!(" (TLS policy {} for {domain})", p.tag()),
                    };
                    last = format!("{host} [{addr}]: {e}{reason}");
                }
            }
        }
        Err(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mx(preference: u16, exchange: &str) -> MxRecord {
        MxRecord {
            preference,
            exchange: exchange.into(),
        }
    }

    fn hosts(r: Route) -> Vec<String> {
        match r {
            Route::Hosts { hosts, .. } => hosts,
            other => panic!("expected hosts, got {other:?}"),
        }
    }

    #[test]
    fn lower_preference_first() {
        let answer = MxAnswer::Records(vec![
            mx(20, "b.example"),
            mx(5, "a.example"),
            mx(10, "C.example"),
        ]);
        for seed in 0..20 {
            assert_eq!(
                hosts(route("example", answer.clone(), seed)),
                ["a.example", "c.example", "b.example"]
            );
        }
    }

    #[test]
    fn equal_preferences_are_spread() {
        let answer = MxAnswer::Records(vec![
            mx(10, "a.example"),
            mx(10, "b.example"),
            mx(20, "z.example"),
        ]);
        let firsts: std::collections::HashSet<String> = (0..64)
            .map(|seed| hosts(route("example", answer.clone(), seed))[0].clone())
            .collect();
        assert_eq!(firsts.len(), 2, "{firsts:?}");
        for seed in 0..64 {
            assert_eq!(
                hosts(route("example", answer.clone(), seed))[2],
                "z.example"
            );
        }
    }

    #[test]
    fn no_mx_means_the_domain_itself() {
        assert_eq!(
            route("example.org", MxAnswer::NoRecords, 0),
            Route::Hosts {
                hosts: vec!["example.org".into()],
                implicit: true
            }
        );
    }

    #[test]
    fn null_mx_and_missing_domain() {
        assert_eq!(
            route("example.org", MxAnswer::Records(vec![mx(0, "")]), 0),
            Route::NullMx
        );
        assert_eq!(route("example.org", MxAnswer::NoDomain, 0), Route::NoDomain);
    }
}
