//! Turning a connection away (`421` on SMTP, `503`/`429` on HTTP), with
//! bounded work: a refused
//! client must not be able to hold a task for long, nor, in numbers, make
//! refusals pile up.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

use super::timed;

/// Refusals in progress at once; beyond this, connections are closed
/// without a reply (an implicit-TLS refusal may take a handshake timeout).
pub const MAX_REFUSALS_IN_PROGRESS: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `max_connections` reached.
    Busy,
    /// `limits.max_connections_per_ip` reached for this client.
    PerIp,
    /// The client address is banned after too many failed logins.
    Banned,
}

/// How a listener's protocol says "not now".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wording {
    /// A `421` reply line.
    Smtp,
    /// A complete HTTP/1.1 response with a JSON error and `Retry-After`,
    /// then the connection closes.
    Http,
}

impl Refusal {
    fn reply(self, wording: Wording) -> Vec<u8> {
        match (wording, self) {
            (Wording::Smtp, Refusal::Busy) => {
                b"421 4.7.0 Too many connections, try again later\r\n".to_vec()
            }
            (Wording::Smtp, Refusal::PerIp) => {
                b"421 4.7.0 Too many connections from your address\r\n".to_vec()
            }
            (Wording::Smtp, Refusal::Banned) => {
                b"421 4.7.0 Too many failed logins from your address, try again later\r\n".to_vec()
            }
            (Wording::Http, Refusal::Busy) => http_refusal(
                "503 Service Unavailable",
                1,
                "TooManyConnections",
                "too many connections, try again later",
            ),
            (Wording::Http, Refusal::PerIp) => http_refusal(
                "429 Too Many Requests",
                1,
                "TooManyConnections",
                "too many connections from your address",
            ),
            (Wording::Http, Refusal::Banned) => http_refusal(
                "429 Too Many Requests",
                60,
                "Banned",
                "too many authentication failures from your address, try again later",
            ),
        }
    }

    pub fn log(self, listener: &str, peer: SocketAddr) {
        match self {
            Refusal::Busy => {
                tracing::warn!(%peer, listener, "connection refused: too many connections")
            }
            Refusal::PerIp => tracing::warn!(
                %peer,
                listener,
                "connection refused: too many connections from this address"
            ),
            Refusal::Banned => tracing::info!(
                %peer,
                listener,
                "connection refused: address banned after authentication failures"
            ),
        }
    }
}

/// A whole HTTP/1.1 response that ends the connection.
fn http_refusal(status: &str, retry_after_secs: u32, code: &str, message: &str) -> Vec<u8> {
    let body = format!(r#"{{"code":"{code}","message":"{message}"}}"#);
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nRetry-After: {retry_after_secs}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// How a refusal is carried out.
pub struct Refuser {
    /// Some on an implicit-TLS listener: the `421` goes inside TLS, never
    /// as plaintext a TLS client would take for a broken handshake.
    pub tls: Option<TlsAcceptor>,
    pub wording: Wording,
    pub handshake_timeout: Duration,
    pub write_timeout: Duration,
    pub in_progress: Arc<Semaphore>,
}

impl Refuser {
    /// The task that answers `stream` with the refusal, or `None` when too
    /// many refusals are already under way: then the connection is simply
    /// closed.
    pub fn refuse(
        &self,
        stream: TcpStream,
        refusal: Refusal,
    ) -> Option<impl Future<Output = ()> + Send + 'static> {
        let Ok(slot) = self.in_progress.clone().try_acquire_owned() else {
            tracing::debug!("refusal dropped: too many refusals in progress");
            return None;
        };
        let (tls, wording) = (self.tls.clone(), self.wording);
        let (handshake_timeout, write_timeout) = (self.handshake_timeout, self.write_timeout);
        Some(async move {
            let reply = refusal.reply(wording);
            match tls {
                None => {
                    let mut stream = stream;
                    if timed::write_all(&mut stream, &reply, write_timeout)
                        .await
                        .is_ok()
                    {
                        timed::shutdown(&mut stream, write_timeout).await;
                    }
                }
                Some(acceptor) => {
                    if let Ok(mut stream) =
                        timed::handshake(acceptor, stream, handshake_timeout).await
                        && timed::write_all(&mut stream, &reply, write_timeout)
                            .await
                            .is_ok()
                    {
                        timed::shutdown(&mut stream, write_timeout).await;
                    }
                }
            }
            drop(slot);
        })
    }
}
