//! `mode = "mx"`: direct delivery to each recipient domain's mail
//! exchangers (RFC 5321 5.1), one transaction per domain, with
//! opportunistic STARTTLS.
//!
//! DNS sits behind the small [`Resolver`] trait so the routing rules (MX
//! preference order, implicit MX, null MX) are tested with made-up answers.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use hickory_resolver::TokioResolver;
use hickory_resolver::proto::rr::RData;

use super::connection_pool::{Conn, ConnectionPool, Mail, PoolSettings};
use super::outgoing::Outgoing;
use super::smtp::{self, ClientSettings, Security};
use super::{DeliveryError, RcptResult, Status, domain_of};
use crate::store::BoxFuture;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MxRecord {
    pub preference: u16,
    /// Without the trailing dot; empty for the root (a null MX).
    pub exchange: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MxAnswer {
    Records(Vec<MxRecord>),
    /// The domain exists but has no MX records.
    NoRecords,
    /// NXDOMAIN.
    NoDomain,
}

/// A DNS failure that may pass (timeout, SERVFAIL): try again later.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("DNS: {0}")]
pub struct DnsError(pub String);

pub trait Resolver: Send + Sync + 'static {
    fn mx<'a>(&'a self, domain: &'a str) -> BoxFuture<'a, Result<MxAnswer, DnsError>>;
    /// A and AAAA; empty when the name has none (or does not exist).
    fn ips<'a>(&'a self, host: &'a str) -> BoxFuture<'a, Result<Vec<IpAddr>, DnsError>>;
}

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

pub struct MxTransport {
    resolver: Arc<dyn Resolver>,
    port: u16,
    tls: tokio_rustls::TlsConnector,
    settings: ClientSettings,
    /// Open sessions per MX host, reused across messages and domains.
    pool: ConnectionPool,
}

impl MxTransport {
    pub fn new(
        resolver: Arc<dyn Resolver>,
        port: u16,
        settings: ClientSettings,
    ) -> Result<Self, DeliveryError> {
        let tls = super::tls::unverified()
            .map_err(|e| DeliveryError::Setup(format!("relay TLS: {e}")))?;
        Ok(Self {
            resolver,
            port,
            tls,
            settings,
            pool: ConnectionPool::new(PoolSettings::default()),
        })
    }

    /// Connection reuse as configured (the default otherwise).
    pub fn with_pool(mut self, settings: PoolSettings) -> Self {
        self.pool = ConnectionPool::new(settings);
        self
    }

    /// Closes the pooled sessions with QUIT (shutdown).
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Delivers to recipients that all share one domain.
    pub async fn deliver(&self, msg: &Outgoing, recipients: &[String]) -> Vec<RcptResult> {
        let all = |status, why: &str| RcptResult::all(recipients, status, why, None);
        let Some(domain) = recipients.first().and_then(|r| domain_of(r)) else {
            return all(Status::Failed, "550 5.1.3 recipient address has no domain");
        };
        let hosts =
            if let Some(literal) = domain.strip_prefix('[').and_then(|d| d.strip_suffix(']')) {
                // A domain literal (RFC 5321 4.1.3) names the host directly.
                let ip = match literal.get(..5) {
                    Some(tag) if tag.eq_ignore_ascii_case("IPv6:") => {
                        literal.get(5..).unwrap_or_default()
                    }
                    _ => literal,
                };
                match ip.parse::<IpAddr>() {
                    Ok(ip) => {
                        return self
                            .try_host(msg, recipients, &domain, &[ip])
                            .await
                            .unwrap_or_else(|e| all(Status::Deferred, &e));
                    }
                    Err(_) => return all(Status::Failed, "550 5.1.2 bad address literal"),
                }
            } else {
                match self
                    .resolver
                    .mx(&domain)
                    .await
                    .map(|a| route(&domain, a, seed()))
                {
                    Err(e) => return all(Status::Deferred, &format!("451 4.4.3 {e}")),
                    Ok(Route::NullMx) => {
                        return all(
                            Status::Failed,
                            &format!("556 5.1.10 {domain} accepts no mail (null MX, RFC 7505)"),
                        );
                    }
                    Ok(Route::NoDomain) => {
                        return all(
                            Status::Failed,
                            &format!("550 5.1.2 domain {domain} does not exist"),
                        );
                    }
                    Ok(Route::Hosts { hosts, .. }) => hosts,
                }
            };
        let mut last = None;
        let mut any_address = false;
        for host in &hosts {
            let ips = match self.resolver.ips(host).await {
                Ok(ips) => ips,
                Err(e) => {
                    last = Some(format!("{host}: {e}"));
                    any_address = true; // unknown, so not a permanent failure
                    continue;
                }
            };
            if ips.is_empty() {
                continue;
            }
            any_address = true;
            match self.try_host(msg, recipients, host, &ips).await {
                Ok(results) => return results,
                Err(e) => last = Some(e),
            }
        }
        if !any_address {
            return all(
                Status::Failed,
                &format!("550 5.4.4 no address for any mail exchanger of {domain}"),
            );
        }
        all(
            Status::Deferred,
            &last.unwrap_or_else(|| format!("no mail exchanger of {domain} answered")),
        )
    }

    /// One transaction with `host`: on a pooled session to it, or with the
    /// first of its addresses that answers.
    async fn try_host(
        &self,
        msg: &Outgoing,
        recipients: &[String],
        host: &str,
        ips: &[IpAddr],
    ) -> Result<Vec<RcptResult>, String> {
        let content = msg.bytes_for(recipients);
        let mail = Mail {
            from: &msg.reverse_path,
            recipients,
            content: &content,
        };
        let key = format!("{host}:{}", self.port);
        self.pool.send(&key, &mail, || self.open(host, ips)).await
    }

    async fn open(&self, host: &str, ips: &[IpAddr]) -> Result<Conn, String> {
        let opportunistic = Security::Opportunistic(self.tls.clone());
        let mut last = format!("{host}: no address");
        for ip in ips {
            let addr = SocketAddr::new(*ip, self.port);
            let mut session = smtp::open(addr, host, &opportunistic, None, &self.settings).await;
            if let Err(e) = &session
                && e.tls
            {
                // A broken TLS stack must not stop delivery that plaintext
                // would complete: opportunistic means exactly that.
                tracing::info!(%host, %addr, error = %e, "STARTTLS failed; retrying without TLS");
                session = smtp::open(addr, host, &Security::Plain, None, &self.settings).await;
            }
            match session {
                Ok(session) => return Ok(Conn::new(session, host, addr, self.settings.timeout)),
                Err(e) => last = format!("{host} [{addr}]: {e}"),
            }
        }
        Err(last)
    }
}

/// The system resolver (`/etc/resolv.conf`), through hickory.
pub struct SystemResolver(TokioResolver);

impl SystemResolver {
    pub fn new() -> Result<Self, String> {
        let resolver = TokioResolver::builder_tokio()
            .map_err(|e| format!("DNS resolver: {e}"))?
            .build()
            .map_err(|e| format!("DNS resolver: {e}"))?;
        Ok(Self(resolver))
    }
}

/// Absolute, so the search list never turns `example.com` into
/// `example.com.corp.local`.
fn fqdn(name: &str) -> String {
    if name.ends_with('.') {
        name.to_owned()
    } else {
        format!("{name}.")
    }
}

impl Resolver for SystemResolver {
    fn mx<'a>(&'a self, domain: &'a str) -> BoxFuture<'a, Result<MxAnswer, DnsError>> {
        Box::pin(async move {
            match self.0.mx_lookup(fqdn(domain)).await {
                Ok(lookup) => Ok(MxAnswer::Records(
                    lookup
                        .answers()
                        .iter()
                        .filter_map(|r| match &r.data {
                            RData::MX(mx) => Some(MxRecord {
                                preference: mx.preference,
                                exchange: mx.exchange.to_ascii().trim_end_matches('.').to_owned(),
                            }),
                            _ => None,
                        })
                        .collect(),
                )),
                Err(e) if e.is_nx_domain() => Ok(MxAnswer::NoDomain),
                Err(e) if e.is_no_records_found() => Ok(MxAnswer::NoRecords),
                Err(e) => Err(DnsError(e.to_string())),
            }
        })
    }

    fn ips<'a>(&'a self, host: &'a str) -> BoxFuture<'a, Result<Vec<IpAddr>, DnsError>> {
        Box::pin(async move {
            match self.0.lookup_ip(fqdn(host)).await {
                Ok(lookup) => Ok(lookup.iter().collect()),
                Err(e) if e.is_nx_domain() || e.is_no_records_found() => Ok(Vec::new()),
                Err(e) => Err(DnsError(e.to_string())),
            }
        })
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
