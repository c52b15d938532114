//! `mode = "smarthost"`: every message goes to one configured host, over
//! STARTTLS, implicit TLS, or (testing only) plaintext, with optional AUTH.

use mail_send::Credentials;

use super::connection_pool::{Conn, ConnectionPool, Mail, PoolSettings};
use super::outgoing::Outgoing;
use super::smtp::{self, ClientSettings, Security};
use super::{DeliveryError, REQUIRETLS_REFUSED, RcptResult, Status};
use crate::config::{SmtpTls, TlsTrust};

pub struct SmarthostTransport {
    /// `host:port` as connected to.
    addr: String,
    /// The host alone: TLS server name and destination name.
    host: String,
    security: Security,
    /// How the smarthost's certificate is checked, for the record.
    auth: &'static str,
    credentials: Option<Credentials<String>>,
    settings: ClientSettings,
    /// Open sessions to the smarthost, reused message after message.
    pool: ConnectionPool,
}

/// Splits `host[:port]`; the port defaults by TLS mode.
pub fn split_host_port(value: &str, tls: SmtpTls) -> Result<(String, u16), String> {
    let default = match tls {
        SmtpTls::Implicit => 465,
        SmtpTls::StartTls => 587,
        SmtpTls::None => 25,
    };
    crate::net::split_host_port(value, default)
}

impl SmarthostTransport {
    pub fn new(
        host: &str,
        tls: SmtpTls,
        credentials: Option<(String, String)>,
        trust: &TlsTrust,
        settings: ClientSettings,
        pool: PoolSettings,
    ) -> Result<Self, DeliveryError> {
        let (name, port) = split_host_port(host, tls)
            .map_err(|e| DeliveryError::Setup(format!("relay.smarthost: {e}")))?;
        let connector = || tls_connector(trust);
        let security = match tls {
            SmtpTls::None => Security::Plain,
            SmtpTls::StartTls => Security::StartTls(connector()?),
            SmtpTls::Implicit => Security::Implicit(connector()?),
        };
        let addr = if name.contains(':') {
            format!("[{name}]:{port}")
        } else {
            format!("{name}:{port}")
        };
        Ok(Self {
            addr,
            host: name,
            security,
            auth: match trust {
                TlsTrust::InsecureSkipVerify => "none",
                TlsTrust::System | TlsTrust::CaFile(_) => "verified",
            },
            credentials: credentials.map(|(u, p)| Credentials::new(u, p)),
            settings,
            pool: ConnectionPool::new(pool),
        })
    }

    pub fn name(&self) -> &str {
        &self.host
    }

    pub async fn deliver(&self, msg: &Outgoing, recipients: &[String]) -> Vec<RcptResult> {
        let require_tls = msg.options.require_tls;
        let verified = !matches!(self.security, Security::Plain) && self.auth == "verified";
        if require_tls && !verified {
            // RFC 8689 4.2.1: never to a hop whose TLS proves nothing.
            let why = format!(
                "{REQUIRETLS_REFUSED} REQUIRETLS: the smarthost {} is not reached over verified TLS",
                self.addr
            );
            return RcptResult::all(recipients, Status::Failed, &why, Some(&self.addr));
        }
        let content = msg.bytes_for(recipients);
        let mail = Mail {
            from: &msg.reverse_path,
            recipients,
            content: &content,
            require_tls,
        };
        let key = if require_tls {
            format!("{}/requiretls", self.addr)
        } else {
            self.addr.clone()
        };
        match self.pool.send(&key, &mail, || self.open(require_tls)).await {
            Ok(results) => results,
            Err(why) => {
                let status = if why.starts_with(REQUIRETLS_REFUSED) {
                    Status::Failed
                } else {
                    Status::Deferred
                };
                RcptResult::all(recipients, status, &why, Some(&self.addr))
            }
        }
    }

    /// A new session with the first address of the smarthost that answers;
    /// for a REQUIRETLS message, one that offers REQUIRETLS.
    async fn open(&self, require_tls: bool) -> Result<Conn, String> {
        let addrs: Vec<std::net::SocketAddr> = tokio::net::lookup_host(&self.addr)
            .await
            .map_err(|e| format!("cannot resolve {}: {e}", self.addr))?
            .collect();
        let mut last = format!("no address for {}", self.addr);
        for addr in addrs {
            match smtp::open(
                addr,
                &self.host,
                &self.security,
                self.credentials.as_ref(),
                &self.settings,
            )
            .await
            {
                Ok(session) if require_tls && !session.takes_requiretls() => {
                    session.quit().await;
                    return Err(format!(
                        "{REQUIRETLS_REFUSED} REQUIRETLS: the smarthost {} [{addr}] does not offer REQUIRETLS",
                        self.host
                    ));
                }
                Ok(session) => {
                    let hop = format!("{} [{addr}] {}", self.host, session.security(self.auth));
                    return Ok(Conn::new(session, &hop, self.settings.timeout));
                }
                Err(e) => last = e.message,
            }
        }
        Err(last)
    }

    /// Closes the pooled sessions with QUIT (shutdown).
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

fn tls_connector(trust: &TlsTrust) -> Result<tokio_rustls::TlsConnector, DeliveryError> {
    super::tls::connector(trust).map_err(|e| DeliveryError::Setup(format!("relay TLS: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_port() {
        let hp = |v, t| split_host_port(v, t);
        assert_eq!(
            hp("smtp.example.net:2525", SmtpTls::StartTls),
            Ok(("smtp.example.net".into(), 2525))
        );
        assert_eq!(
            hp("smtp.example.net", SmtpTls::StartTls),
            Ok(("smtp.example.net".into(), 587))
        );
        assert_eq!(
            hp("smtp.example.net", SmtpTls::Implicit),
            Ok(("smtp.example.net".into(), 465))
        );
        assert_eq!(hp("[::1]:25", SmtpTls::None), Ok(("::1".into(), 25)));
        assert!(hp("host:0", SmtpTls::None).is_err());
        assert!(hp(":25", SmtpTls::None).is_err());
    }
}
