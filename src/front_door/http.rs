//! One admitted connection served as HTTP/1.1 (the API, metrics, and the
//! console to come): the TLS handshake within its deadline, a deadline for
//! each request's headers (an idle keep-alive connection waiting for its
//! next request included), each response write within its deadline (a
//! client that stops reading is cut), idle connections closed while the
//! listener's cap is reached, and a graceful stop.

use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use super::Admitted;
use super::timed;
use super::write_deadline::WriteDeadline;

/// How a listener's HTTP connections are bounded.
#[derive(Clone)]
pub struct HttpConnection {
    pub app: Router,
    /// Some: HTTPS.
    pub tls: Option<TlsAcceptor>,
    pub tls_handshake_timeout: Duration,
    /// A request's headers must be complete within this of the moment the
    /// connection starts waiting for them.
    pub header_read_timeout: Duration,
    /// Each write of a response must make progress within this.
    pub write_timeout: Duration,
}

impl HttpConnection {
    /// Serves `admitted` until the client closes, a deadline passes, or
    /// `stop`; its slots are held until then.
    pub async fn serve(self, admitted: Admitted, stop: watch::Receiver<bool>) {
        let gate = admitted.gate.clone();
        let (tcp, peer, slots) = admitted.into_parts();
        let app = self.app.layer(axum::Extension(ConnectInfo(peer)));
        let timeouts = (self.header_read_timeout, self.write_timeout);
        match self.tls {
            None => drive(tcp, app, timeouts, &gate, stop).await,
            Some(acceptor) => {
                match timed::handshake(acceptor, tcp, self.tls_handshake_timeout).await {
                    Ok(stream) => drive(stream, app, timeouts, &gate, stop).await,
                    Err(e) => tracing::debug!(%peer, error = %e, "HTTP TLS handshake failed"),
                }
            }
        }
        drop(slots);
    }
}

async fn drive<S>(
    stream: S,
    app: Router,
    (header_read_timeout, write_timeout): (Duration, Duration),
    gate: &super::Gate,
    mut stop: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = TowerToHyperService::new(app);
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .serve_connection(
            TokioIo::new(WriteDeadline::new(stream, write_timeout)),
            service,
        );
    tokio::pin!(connection);
    // Whether the connection was already asked to end after its request.
    let mut ending = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                match result {
                    Ok(()) => {}
                    Err(e) if e.is_timeout() => {
                        tracing::info!("HTTP connection closed: request headers too slow");
                    }
                    Err(e) if timed_out_writing(&e) => {
                        tracing::info!(error = %e, "HTTP connection closed: write timed out, the client is not reading");
                    }
                    Err(e) => tracing::debug!(error = %e, "HTTP connection ended with an error"),
                }
                return;
            }
            // The guard `wait_for` returns must not live across the awaits.
            () = async { let _ = stop.wait_for(|s| *s).await; }, if !ending => {
                connection.as_mut().graceful_shutdown();
                ending = true;
            }
            // Someone was turned away for want of a slot: an idle keep-alive
            // connection closes now, one with a request finishes it first.
            () = gate.cap_reached(), if !ending => {
                connection.as_mut().graceful_shutdown();
                ending = true;
            }
        }
    }
}

/// The connection failed because [`WriteDeadline`] ran out.
fn timed_out_writing(e: &hyper::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return io.kind() == std::io::ErrorKind::TimedOut;
        }
        source = cause.source();
    }
    false
}
