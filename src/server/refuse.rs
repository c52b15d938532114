//! Turning a connection away with a `421`, with bounded work: a refused
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

impl Refusal {
    fn reply(self) -> &'static [u8] {
        match self {
            Refusal::Busy => b"421 4.7.0 Too many connections, try again later\r\n",
            Refusal::PerIp => b"421 4.7.0 Too many connections from your address\r\n",
            Refusal::Banned => {
                b"421 4.7.0 Too many failed logins from your address, try again later\r\n"
            }
        }
    }

    pub fn log(self, peer: SocketAddr) {
        match self {
            Refusal::Busy => tracing::warn!(%peer, "connection refused: too many connections"),
            Refusal::PerIp => tracing::warn!(
                %peer,
                "connection refused: too many connections from this address"
            ),
            Refusal::Banned => tracing::info!(
                %peer,
                "connection refused: address banned after authentication failures"
            ),
        }
    }
}

/// How a refusal is carried out.
pub struct Refuser {
    /// Some on an implicit-TLS listener: the `421` goes inside TLS, never
    /// as plaintext a TLS client would take for a broken handshake.
    pub tls: Option<TlsAcceptor>,
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
        let tls = self.tls.clone();
        let (handshake_timeout, write_timeout) = (self.handshake_timeout, self.write_timeout);
        Some(async move {
            let reply = refusal.reply();
            match tls {
                None => {
                    let mut stream = stream;
                    if timed::write_all(&mut stream, reply, write_timeout)
                        .await
                        .is_ok()
                    {
                        timed::shutdown(&mut stream, write_timeout).await;
                    }
                }
                Some(acceptor) => {
                    if let Ok(mut stream) =
                        timed::handshake(acceptor, stream, handshake_timeout).await
                        && timed::write_all(&mut stream, reply, write_timeout)
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
