//! The relay modes behind one interface: which destination a recipient
//! belongs to (the unit of per-destination concurrency and of one SMTP
//! transaction), and delivery of a message to a destination's recipients.

use super::connection_pool::PoolSettings;
use super::dns::DnsClient;
use super::file::FileTransport;
use super::mx::{MxSettings, MxTransport, StsSettings};
use super::outgoing::Outgoing;
use super::smarthost::SmarthostTransport;
use super::smtp::ClientSettings;
use super::{DeliveryError, RcptResult, Status, domain_of};
use crate::address::{ForwardPath, ReversePath};
use crate::config::{Config, Relay};

/// Per try of one DNS server (each is tried twice at most).
const DNS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

pub enum Transport {
    File(FileTransport),
    Smarthost(SmarthostTransport),
    // Boxed: the MX transport (DNS, MTA-STS cache) is twice the others.
    Mx(Box<MxTransport>),
}

impl Transport {
    pub fn from_config(config: &Config) -> Result<Self, DeliveryError> {
        let settings = ClientSettings {
            helo: config.hostname.clone(),
            timeout: config.delivery.timeout,
        };
        let d = &config.delivery;
        let pool = PoolSettings {
            max_idle: d.pool_size,
            max_messages: d.max_messages_per_connection,
            idle_timeout: d.connection_idle_timeout,
        };
        Ok(match &config.relay {
            Relay::File { dir } => Transport::File(FileTransport::new(dir)?),
            Relay::Smarthost {
                host,
                tls,
                username,
                password,
            } => Transport::Smarthost(SmarthostTransport::new(
                host,
                *tls,
                username.clone().zip(password.clone()),
                &config.delivery.smarthost_trust,
                settings,
                pool,
            )?),
            Relay::Mx => {
                let resolver = if d.dns_servers.is_empty() {
                    DnsClient::system(DNS_TIMEOUT)
                } else {
                    DnsClient::new(d.dns_servers.clone(), DNS_TIMEOUT)
                }
                .map_err(DeliveryError::Setup)?;
                let mx = MxSettings {
                    port: d.mx_port,
                    policy: d.tls_policy.clone(),
                    trust: d.mx_trust.clone(),
                    hostname: config.hostname.clone(),
                    listeners: config.listeners.iter().map(|l| l.addr).collect(),
                    mta_sts: d.mta_sts.then(|| StsSettings {
                        port: d.mta_sts_port,
                        // RFC 8461 3.3 suggests a minute at most.
                        deadline: d.timeout.min(std::time::Duration::from_secs(60)),
                        cache_file: Some(config.data_dir.join("mta-sts-policies.json")),
                    }),
                    tls_rpt: d.tls_rpt,
                };
                Transport::Mx(Box::new(
                    MxTransport::new(std::sync::Arc::new(resolver), mx, settings)?.with_pool(pool),
                ))
            }
        })
    }

    /// Recipients with the same destination go in one transaction and
    /// share its concurrency limit.
    pub fn destination(&self, recipient: &str) -> String {
        match self {
            Transport::File(_) => "file".into(),
            Transport::Smarthost(s) => s.name().to_owned(),
            Transport::Mx(_) => domain_of(recipient).unwrap_or_default(),
        }
    }

    /// TLS-RPT's counts and what sending reports needs (`mx` mode with
    /// `relay.tls_rpt`).
    pub fn tls_reporting(&self) -> Option<super::tls_rpt::reporter::Parts> {
        match self {
            Transport::Mx(t) => t.tls_reporting(),
            _ => None,
        }
    }

    /// Closes open outbound sessions with QUIT (shutdown).
    pub async fn close(&self) {
        match self {
            Transport::File(_) => {}
            Transport::Smarthost(t) => t.close().await,
            Transport::Mx(t) => t.close().await,
        }
    }

    /// Every transport writes the addresses as stored into MAIL FROM, RCPT
    /// TO or header lines, so an address that could not be written back
    /// safely fails here for good, whatever put it in the queue.
    pub async fn deliver(&self, msg: &Outgoing, recipients: &[String]) -> Vec<RcptResult> {
        if let Err(e) = ReversePath::parse(&msg.reverse_path) {
            tracing::warn!(queue_id = %msg.id, sender = ?msg.reverse_path, reason = %e, "not relayed: unsafe sender address");
            let why = format!(
                "550 5.1.7 sender address {:?} cannot be relayed safely: {e}",
                msg.reverse_path
            );
            return RcptResult::all(recipients, Status::Failed, &why, None);
        }
        let mut refused = Vec::new();
        let mut safe = Vec::with_capacity(recipients.len());
        for rcpt in recipients {
            match ForwardPath::parse(rcpt) {
                Ok(_) => safe.push(rcpt.clone()),
                Err(e) => {
                    tracing::warn!(queue_id = %msg.id, recipient = ?rcpt, reason = %e, "not relayed: unsafe recipient address");
                    let why = format!(
                        "550 5.1.3 recipient address {rcpt:?} cannot be relayed safely: {e}"
                    );
                    refused.push(RcptResult::new(rcpt, Status::Failed, why));
                }
            }
        }
        if safe.is_empty() {
            return refused;
        }
        let mut results = match self {
            Transport::File(t) => t.deliver(msg, &safe).await,
            Transport::Smarthost(t) => t.deliver(msg, &safe).await,
            Transport::Mx(t) => t.deliver(msg, &safe).await,
        };
        results.extend(refused);
        for r in &mut results {
            looped_back(msg, r);
        }
        results
    }
}

/// A next hop that answers with our own queue id is this relay (or a
/// copy of its ledger) replaying the message to itself: nothing was
/// delivered, and trying again would only loop again.
fn looped_back(msg: &Outgoing, r: &mut RcptResult) {
    if r.status != Status::Delivered {
        return;
    }
    let ours = r
        .reply
        .split(|c: char| !c.is_ascii_alphanumeric())
        .any(|word| word == msg.id);
    if ours {
        tracing::warn!(queue_id = %msg.id, hop = ?r.next_hop, reply = %r.reply, "next hop answered with our own queue id: mail loops back to this relay");
        r.status = Status::Failed;
        r.reply = format!(
            "554 5.4.6 mail loops back to myself: the next hop answered with this message's own queue id ({})",
            r.reply
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::file::FileTransport;

    fn outgoing(from: &str, recipients: &[&str]) -> Outgoing {
        Outgoing {
            id: "Q1".into(),
            reverse_path: from.into(),
            recipients: recipients.iter().map(|r| r.to_string()).collect(),
            idempotency_key: None,
            trace: "Received: test\r\n".into(),
            body: b"Subject: x\r\n\r\nbody\r\n".to_vec(),
            options: Default::default(),
            key_headers: Default::default(),
        }
    }

    /// Defence in depth: a queue row with an address that acceptance would
    /// have refused never reaches the next hop.
    #[tokio::test]
    async fn unsafe_addresses_in_the_queue_fail_and_are_never_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let t = Transport::File(FileTransport::new(dir.path()).expect("file transport"));
        let bad = [
            "x@y.test> NOTIFY=NEVER",
            "a@b.test\r\nRSET",
            "\"open@b.test",
        ];
        let mut all = vec!["ok@b.test"];
        all.extend(bad);
        let msg = outgoing("s@a.test", &all);
        let results = t.deliver(&msg, &msg.recipients).await;
        assert_eq!(results.len(), 4);
        for r in &results {
            let good = r.recipient == "ok@b.test";
            let want = if good {
                Status::Delivered
            } else {
                Status::Failed
            };
            assert_eq!(r.status, want, "{r:?}");
            assert!(
                good || r.reply.contains("cannot be relayed safely"),
                "{r:?}"
            );
            assert!(!r.reply.contains('\r') && !r.reply.contains('\n'));
        }
        let file = std::fs::read_to_string(dir.path().join("Q1.eml")).expect("written");
        assert!(file.contains("X-Envelope-To: <ok@b.test>\r\n"), "{file}");
        assert!(!file.contains("NOTIFY") && !file.contains("RSET"), "{file}");

        let msg = outgoing("s@a.test>\r\nX-Injected: 1", &["ok@b.test"]);
        std::fs::remove_file(dir.path().join("Q1.eml")).expect("remove");
        let results = t.deliver(&msg, &msg.recipients).await;
        assert_eq!(results[0].status, Status::Failed, "{results:?}");
        assert!(results[0].reply.starts_with("550 5.1.7 sender address"));
        assert!(!dir.path().join("Q1.eml").exists());
    }
}
