//! A stub resolver for delivery: asks the configured recursive servers (or
//! `/etc/resolv.conf`'s) over UDP, then TCP when the answer is truncated,
//! and keeps the one bit a general-purpose resolver library hides: whether
//! the server vouched for the answer with the AD flag (RFC 4035 3.2.3).
//! DANE needs that bit for the MX, address and TLSA answers alike.
//!
//! The AD flag is trusted only from a server on loopback, the way glibc's
//! `trust-ad` and Postfix's `smtp_dns_support_level = dnssec` expect a
//! local validating resolver: any other path could be forged.
//!
//! Everything from the network is bounded: one message of at most 64 KiB,
//! at most [`MAX_CNAME_HOPS`] CNAMEs within one answer and as many further
//! queries for a chain a server left unfinished, a cache of at most
//! [`CACHE_ENTRIES`] answers, each query under its own deadline.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

/// A chain longer than this is treated as a loop (Postfix stops at 8 too).
pub const MAX_CNAME_HOPS: usize = 8;
/// Distinct (name, type) answers kept; the cache starts over when full.
pub const CACHE_ENTRIES: usize = 10_000;
/// The longest an answer is kept, whatever its TTL says.
const MAX_CACHE_TTL: Duration = Duration::from_secs(3600);
/// How long "no such name" and "no such record" are kept without an SOA.
const NEGATIVE_TTL: Duration = Duration::from_secs(60);
/// EDNS payload we advertise: the DNS flag day 2020 value, no fragments.
const EDNS_PAYLOAD: u16 = 1232;

/// A failure that may pass (timeout, SERVFAIL, a broken answer): the
/// recipients are deferred, never bounced, on it. A validating resolver
/// answers SERVFAIL for a bogus (forged or broken) signed answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("DNS: {0}")]
pub struct DnsError(pub String);

/// What the servers said about one name and type, after any CNAMEs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The records of the asked type at the end of the chain.
    pub records: Vec<RData>,
    /// NXDOMAIN at the end of the chain.
    pub no_domain: bool,
    /// Every response on the way carried a trusted AD flag.
    pub secure: bool,
}

/// An answer, the end of its chain when that is another name, and until when.
type Cached = (Instant, Answer, Option<Name>);

pub struct DnsClient {
    servers: Vec<SocketAddr>,
    /// Per try of one server; a lookup tries each server twice at most.
    timeout: Duration,
    cache: Mutex<HashMap<(Name, RecordType), Cached>>,
}

impl DnsClient {
    pub fn new(servers: Vec<SocketAddr>, timeout: Duration) -> Result<Self, String> {
        if servers.is_empty() {
            return Err("no DNS server to ask".into());
        }
        Ok(Self {
            servers,
            timeout,
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// The servers of `/etc/resolv.conf`, on port 53.
    pub fn system(timeout: Duration) -> Result<Self, String> {
        let (config, _) = hickory_resolver::system_conf::read_system_conf()
            .map_err(|e| format!("DNS resolver (/etc/resolv.conf): {e}"))?;
        let servers = config
            .name_servers()
            .iter()
            .map(|ns| SocketAddr::new(ns.ip, 53))
            .collect::<Vec<_>>();
        let mut unique = Vec::new();
        for s in servers {
            if !unique.contains(&s) {
                unique.push(s);
            }
        }
        Self::new(unique, timeout)
    }

    /// The servers asked, in order.
    pub fn servers(&self) -> &[SocketAddr] {
        &self.servers
    }

    /// Records of `rtype` at `name` (absolute; no search list), CNAMEs
    /// followed.
    pub async fn lookup(&self, name: &str, rtype: RecordType) -> Result<Answer, DnsError> {
        let mut current = absolute(name)?;
        let mut secure = true;
        let mut seen = vec![current.clone()];
        loop {
            let (answer, next) = self.lookup_one(&current, rtype).await?;
            secure &= answer.secure;
            match next {
                // The server left the chain unfinished: ask for its end.
                Some(target) if answer.records.is_empty() && !answer.no_domain => {
                    if seen.len() > MAX_CNAME_HOPS || seen.contains(&target) {
                        return Err(DnsError(format!(
                            "{rtype} {name}: CNAME chain loops or is longer than {MAX_CNAME_HOPS}"
                        )));
                    }
                    seen.push(target.clone());
                    current = target;
                }
                _ => return Ok(Answer { secure, ..answer }),
            }
        }
    }

    /// One question, from the cache or the servers: its answer, and the
    /// name a CNAME chain in it ended at when that is not `name`.
    async fn lookup_one(
        &self,
        name: &Name,
        rtype: RecordType,
    ) -> Result<(Answer, Option<Name>), DnsError> {
        let key = (name.clone(), rtype);
        let cached = self.cache.lock().ok().and_then(|c| {
            c.get(&key)
                .filter(|(until, ..)| *until > Instant::now())
                .cloned()
        });
        if let Some((_, answer, next)) = cached {
            return Ok((answer, next));
        }
        let response = self.ask(name, rtype).await?;
        let (answer, end, ttl) = read_answer(name, rtype, &response)?;
        let next = (end != *name).then_some(end);
        if let Ok(mut cache) = self.cache.lock() {
            if cache.len() >= CACHE_ENTRIES {
                cache.clear();
            }
            cache.insert(key, (Instant::now() + ttl, answer.clone(), next.clone()));
        }
        Ok((answer, next))
    }

    /// Each server in turn, twice round, until one answers.
    async fn ask(&self, name: &Name, rtype: RecordType) -> Result<Message, DnsError> {
        let mut last = String::new();
        for _round in 0..2 {
            for server in &self.servers {
                match tokio::time::timeout(self.timeout, exchange(*server, name, rtype)).await {
                    Ok(Ok(mut m)) => {
                        // AD means something only from a server we trust.
                        m.metadata.authentic_data &= server.ip().is_loopback();
                        match m.metadata.response_code {
                            ResponseCode::NoError | ResponseCode::NXDomain => return Ok(m),
                            code => last = format!("{rtype} {name}: {code} from {server}"),
                        }
                    }
                    Ok(Err(e)) => last = format!("{rtype} {name}: {e} ({server})"),
                    Err(_) => last = format!("{rtype} {name}: no answer from {server} in time"),
                }
            }
        }
        Err(DnsError(last))
    }
}

fn absolute(name: &str) -> Result<Name, DnsError> {
    let mut n = Name::from_ascii(name).map_err(|e| DnsError(format!("bad name {name:?}: {e}")))?;
    n.set_fqdn(true);
    Ok(n)
}

/// The records of `rtype` at the end of the CNAME chain from `name`, that
/// end, and how long the answer may be kept.
fn read_answer(
    name: &Name,
    rtype: RecordType,
    m: &Message,
) -> Result<(Answer, Name, Duration), DnsError> {
    let mut end = name.clone();
    let mut min_ttl = u32::MAX;
    for hop in 0..=MAX_CNAME_HOPS {
        let cname = m.answers.iter().find_map(|r| match &r.data {
            RData::CNAME(c) if rtype != RecordType::CNAME && r.name == end => {
                Some((c.0.clone(), r.ttl))
            }
            _ => None,
        });
        let Some((target, ttl)) = cname else { break };
        if hop == MAX_CNAME_HOPS || target == *name {
            return Err(DnsError(format!(
                "{rtype} {name}: CNAME chain loops or is longer than {MAX_CNAME_HOPS}"
            )));
        }
        min_ttl = min_ttl.min(ttl);
        end = target;
    }
    let records: Vec<RData> = m
        .answers
        .iter()
        .filter(|r| r.name == end && r.data.record_type() == rtype)
        .map(|r| {
            min_ttl = min_ttl.min(r.ttl);
            r.data.clone()
        })
        .collect();
    let ttl = if records.is_empty() {
        m.authorities
            .iter()
            .find_map(|r| match &r.data {
                RData::SOA(soa) => Some(Duration::from_secs(u64::from(soa.minimum.min(r.ttl)))),
                _ => None,
            })
            .unwrap_or(NEGATIVE_TTL)
            // and no longer than the CNAMEs on the way (u32::MAX if none).
            .min(Duration::from_secs(u64::from(min_ttl)))
    } else {
        Duration::from_secs(u64::from(min_ttl))
    };
    let answer = Answer {
        records,
        no_domain: m.metadata.response_code == ResponseCode::NXDomain,
        secure: m.metadata.authentic_data,
    };
    Ok((answer, end, ttl.min(MAX_CACHE_TTL)))
}

/// One query to one server: UDP, and TCP when the answer was truncated.
async fn exchange(server: SocketAddr, name: &Name, rtype: RecordType) -> Result<Message, String> {
    let id = random_id();
    let query = query_bytes(id, name, rtype)?;
    let bind: SocketAddr = match server.ip() {
        IpAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(bind).await.map_err(|e| e.to_string())?;
    socket.connect(server).await.map_err(|e| e.to_string())?;
    socket.send(&query).await.map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 65_535];
    let m = loop {
        let n = socket.recv(&mut buf).await.map_err(|e| e.to_string())?;
        // Anything that is not the answer to this question is ignored,
        // as a spoofing attempt or a late answer to an earlier one.
        if let Ok(m) = Message::from_vec(buf.get(..n).unwrap_or_default())
            && answers(&m, id, name, rtype)
        {
            break m;
        }
    };
    if !m.metadata.truncation {
        return Ok(m);
    }
    let mut tcp = TcpStream::connect(server)
        .await
        .map_err(|e| e.to_string())?;
    let len = u16::try_from(query.len()).map_err(|_| "query too long".to_string())?;
    let mut framed = len.to_be_bytes().to_vec();
    framed.extend_from_slice(&query);
    tcp.write_all(&framed).await.map_err(|e| e.to_string())?;
    let len = usize::from(tcp.read_u16().await.map_err(|e| e.to_string())?);
    let mut body = vec![0u8; len];
    tcp.read_exact(&mut body).await.map_err(|e| e.to_string())?;
    let m = Message::from_vec(&body).map_err(|e| format!("unreadable answer: {e}"))?;
    if answers(&m, id, name, rtype) {
        Ok(m)
    } else {
        Err("an answer to another question".into())
    }
}

fn answers(m: &Message, id: u16, name: &Name, rtype: RecordType) -> bool {
    m.metadata.id == id
        && m.metadata.message_type == MessageType::Response
        && m.queries.len() == 1
        && m.queries
            .first()
            .is_some_and(|q| q.query_type() == rtype && q.name() == name)
}

fn query_bytes(id: u16, name: &Name, rtype: RecordType) -> Result<Vec<u8>, String> {
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    // RFC 6840 5.7: AD in a query asks for AD in the answer; DO asks for
    // the signatures, which a validating stub would need and some
    // resolvers want before they set AD at all.
    m.metadata.authentic_data = true;
    m.add_query(Query::query(name.clone(), rtype));
    let mut edns = Edns::new();
    edns.set_max_payload(EDNS_PAYLOAD);
    edns.set_dnssec_ok(true);
    m.set_edns(edns);
    m.to_vec().map_err(|e| e.to_string())
}

fn random_id() -> u16 {
    let b = uuid::Uuid::new_v4().into_bytes();
    u16::from_be_bytes([b[0], b[1]])
}

#[cfg(test)]
#[path = "dns_tests.rs"]
mod dns_tests;
