//! What `mx` mode asks of DNS, behind the small [`Resolver`] trait (so the
//! routing rules can be tested with made-up answers too), and its one
//! real implementation on [`DnsClient`]. Every answer says whether it was
//! DNSSEC-validated: DANE is used only when the MX, address and TLSA
//! answers all were (RFC 7672 2.2).

use std::net::IpAddr;

use hickory_proto::rr::{RData, RecordType};

use super::dane::Tlsa;
use super::dns::DnsClient;
pub use super::dns::DnsError;
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

/// An answer, and whether a trusted validating resolver vouched for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Secured<T> {
    pub value: T,
    pub secure: bool,
}

impl<T> Secured<T> {
    /// An answer from a source that proves nothing (tests, literals).
    pub fn insecure(value: T) -> Self {
        Self {
            value,
            secure: false,
        }
    }
}

pub trait Resolver: Send + Sync + 'static {
    fn mx<'a>(&'a self, domain: &'a str) -> BoxFuture<'a, Result<Secured<MxAnswer>, DnsError>>;
    /// A and AAAA; empty when the name has none (or does not exist).
    fn ips<'a>(&'a self, host: &'a str) -> BoxFuture<'a, Result<Secured<Vec<IpAddr>>, DnsError>>;
    /// TLSA records at `name` (`_25._tcp.<mx host>`); empty when none.
    fn tlsa<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Secured<Vec<Tlsa>>, DnsError>>;
    /// TXT records at `name`, each one's strings joined; empty when none.
    fn txt<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Secured<Vec<String>>, DnsError>>;
}

/// The most TLSA records of one name considered (a hostile zone could
/// publish thousands, each tried against every certificate).
const MAX_TLSA: usize = 16;
/// The same for TXT records, and the longest one kept (bytes).
const MAX_TXT: usize = 16;
const MAX_TXT_LEN: usize = 4096;

impl Resolver for DnsClient {
    fn mx<'a>(&'a self, domain: &'a str) -> BoxFuture<'a, Result<Secured<MxAnswer>, DnsError>> {
        Box::pin(async move {
            let a = self.lookup(domain, RecordType::MX).await?;
            let value = if a.no_domain {
                MxAnswer::NoDomain
            } else if a.records.is_empty() {
                MxAnswer::NoRecords
            } else {
                MxAnswer::Records(
                    a.records
                        .iter()
                        .filter_map(|r| match r {
                            RData::MX(mx) => Some(MxRecord {
                                preference: mx.preference,
                                exchange: mx.exchange.to_ascii().trim_end_matches('.').to_owned(),
                            }),
                            _ => None,
                        })
                        .collect(),
                )
            };
            Ok(Secured {
                value,
                secure: a.secure,
            })
        })
    }

    fn ips<'a>(&'a self, host: &'a str) -> BoxFuture<'a, Result<Secured<Vec<IpAddr>>, DnsError>> {
        Box::pin(async move {
            let (v4, v6) = tokio::join!(
                self.lookup(host, RecordType::A),
                self.lookup(host, RecordType::AAAA)
            );
            // One family failing is no reason to give up on the other.
            let (v4, v6) = match (v4, v6) {
                (Err(e), Err(_)) => return Err(e),
                (Ok(a), Err(_)) | (Err(_), Ok(a)) => (a, None),
                (Ok(a), Ok(b)) => (a, Some(b)),
            };
            let secure = v4.secure && v6.as_ref().is_none_or(|b| b.secure);
            let ips = v4
                .records
                .iter()
                .chain(v6.iter().flat_map(|b| b.records.iter()))
                .filter_map(|r| match r {
                    RData::A(a) => Some(IpAddr::V4(a.0)),
                    RData::AAAA(a) => Some(IpAddr::V6(a.0)),
                    _ => None,
                })
                .collect();
            Ok(Secured { value: ips, secure })
        })
    }

    fn tlsa<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Secured<Vec<Tlsa>>, DnsError>> {
        Box::pin(async move {
            let a = self.lookup(name, RecordType::TLSA).await?;
            let records = a
                .records
                .iter()
                .filter_map(|r| match r {
                    RData::TLSA(t) => Some(Tlsa {
                        usage: u8::from(t.cert_usage),
                        selector: u8::from(t.selector),
                        matching: u8::from(t.matching),
                        data: t.cert_data.clone(),
                    }),
                    _ => None,
                })
                .take(MAX_TLSA)
                .collect();
            Ok(Secured {
                value: records,
                secure: a.secure,
            })
        })
    }

    fn txt<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Secured<Vec<String>>, DnsError>> {
        Box::pin(async move {
            let a = self.lookup(name, RecordType::TXT).await?;
            let records = a
                .records
                .iter()
                .filter_map(|r| match r {
                    RData::TXT(t) => {
                        let joined: Vec<u8> =
                            t.txt_data.iter().flat_map(|s| s.iter().copied()).collect();
                        (joined.len() <= MAX_TXT_LEN)
                            .then(|| String::from_utf8_lossy(&joined).into_owned())
                    }
                    _ => None,
                })
                .take(MAX_TXT)
                .collect();
            Ok(Secured {
                value: records,
                secure: a.secure,
            })
        })
    }
}
