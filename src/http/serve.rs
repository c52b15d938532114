//! The API's accept loop, plaintext or TLS with the `[tls]` certificate.
//! Written out (rather than `axum::serve`) for what an internet-facing
//! listener needs: a connection cap, a TLS handshake deadline, a deadline
//! for each request's headers (a client that trickles them holds nothing
//! for long), and a graceful stop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

pub struct Limits {
    pub max_connections: usize,
    pub tls_handshake_timeout: Duration,
    pub header_read_timeout: Duration,
}

pub async fn run(
    listener: TcpListener,
    app: Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
) {
    let tls = tls.map(tokio_rustls::TlsAcceptor::from);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let limits = Arc::new(limits);
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|s| *s) => break,
        };
        while connections.try_join_next().is_some() {}
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors and the like: wait, don't spin.
                tracing::warn!(error = %e, "HTTP accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::warn!(%peer, "HTTP connection refused: too many connections");
            continue; // dropped: closed at once
        };
        let _ = tcp.set_nodelay(true);
        let (app, tls, limits, stop) = (app.clone(), tls.clone(), limits.clone(), stop.clone());
        connections.spawn(async move {
            let _slot = slot;
            match tls {
                None => serve_one(tcp, peer, app, &limits, stop).await,
                Some(acceptor) => {
                    match tokio::time::timeout(limits.tls_handshake_timeout, acceptor.accept(tcp))
                        .await
                    {
                        Ok(Ok(stream)) => serve_one(stream, peer, app, &limits, stop).await,
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "HTTP TLS handshake failed")
                        }
                        Err(_) => tracing::debug!(%peer, "HTTP TLS handshake timed out"),
                    }
                }
            }
        });
    }
    // Stop taking connections; those open finish their request.
    while connections.join_next().await.is_some() {}
}

async fn serve_one<S>(
    stream: S,
    peer: SocketAddr,
    app: Router,
    limits: &Limits,
    mut stop: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = TowerToHyperService::new(app.layer(axum::Extension(ConnectInfo(peer))));
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    tokio::select! {
        result = connection.as_mut() => {
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "HTTP connection ended with an error");
            }
        }
        // The guard `wait_for` returns must not live across the awaits.
        () = async { let _ = stop.wait_for(|s| *s).await; } => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
    }
}
