//! The daemon: listeners, the connection cap, graceful shutdown, and the
//! background purge of expired ledger entries.

pub mod connection;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use crate::accept::Acceptor;
use crate::auth::Authenticator;
use crate::config::{Config, TlsMode};
use crate::smtp::session::{Session, SessionConfig};
use crate::store::{Store, now_millis};

/// What every connection task shares.
pub struct Shared {
    pub acceptor: Acceptor,
    pub auth: Authenticator,
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub command_timeout: Duration,
    pub data_timeout: Duration,
}

/// A running daemon: its bound addresses and a handle to stop it.
pub struct Server {
    pub addrs: Vec<SocketAddr>,
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<()>,
}

impl Server {
    /// Binds every listener and starts accepting.
    pub async fn start(config: &Config, store: Arc<dyn Store>) -> Result<Server, String> {
        crate::tls::install_crypto_provider();
        let tls = match &config.tls {
            Some(files) => Some(crate::tls::load_server_config(&files.cert, &files.key)?),
            None => None,
        };
        let shared = Arc::new(Shared {
            acceptor: Acceptor::new(
                store.clone(),
                config.retention,
                config.hostname.clone(),
                &config.limits,
            )?,
            auth: Authenticator::from_config(config),
            tls: tls.clone(),
            command_timeout: config.command_timeout,
            data_timeout: config.data_timeout,
        });
        let (shutdown, shutdown_rx) = watch::channel(false);
        let permits = Arc::new(Semaphore::new(config.max_connections));
        let mut tasks = JoinSet::new();
        let mut addrs = Vec::new();
        for listener in &config.listeners {
            let socket = TcpListener::bind(listener.addr)
                .await
                .map_err(|e| format!("cannot listen on {}: {e}", listener.addr))?;
            let addr = socket.local_addr().map_err(|e| e.to_string())?;
            tracing::info!(%addr, tls = ?listener.tls, "listening");
            addrs.push(addr);
            let session_config = Arc::new(SessionConfig {
                hostname: config.hostname.clone(),
                max_message_size: config.max_message_size,
                max_recipients: config.max_recipients,
                max_bad_commands: config.max_bad_commands,
                allow_plaintext_auth: config.allow_plaintext_auth,
                starttls_offered: listener.tls == TlsMode::StartTls && tls.is_some(),
            });
            tasks.spawn(accept_loop(
                socket,
                listener.tls == TlsMode::Implicit,
                session_config,
                shared.clone(),
                permits.clone(),
                shutdown_rx.clone(),
                config.shutdown_grace,
            ));
        }
        tasks.spawn(purge_loop(store, config.purge_interval, shutdown_rx));
        Ok(Server {
            addrs,
            shutdown,
            tasks,
        })
    }

    /// Stops accepting, lets in-flight sessions finish (idle ones get a
    /// `421`), and returns when every connection has ended.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        while self.tasks.join_next().await.is_some() {}
    }
}

#[allow(clippy::too_many_arguments)]
async fn accept_loop(
    socket: TcpListener,
    implicit_tls: bool,
    config: Arc<SessionConfig>,
    shared: Arc<Shared>,
    permits: Arc<Semaphore>,
    mut shutdown: watch::Receiver<bool>,
    grace: Duration,
) {
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = socket.accept() => accepted,
            _ = shutdown.wait_for(|stop| *stop) => break,
            // Reap finished connections so the set doesn't grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tracing::warn!(%peer, "connection refused: too many connections");
            connections.spawn(refuse(stream));
            continue;
        };
        let session = Session::new(
            config.clone(),
            peer,
            shared.auth.trusted_workspace(peer.ip()),
            implicit_tls,
        );
        let handle = connection::handle(
            stream,
            session,
            implicit_tls,
            shared.clone(),
            shutdown.clone(),
        );
        connections.spawn(async move {
            handle.await;
            // The cap counts a connection until its task ends.
            drop(permit);
        });
    }
    drop(socket);
    let drain = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(grace, drain).await.is_err() {
        tracing::warn!("shutdown grace period over; closing remaining connections");
        connections.shutdown().await;
    }
}

async fn refuse(mut stream: tokio::net::TcpStream) {
    use tokio::io::AsyncWriteExt;
    let _ = stream
        .write_all(b"421 4.7.0 Too many connections, try again later\r\n")
        .await;
    let _ = stream.shutdown().await;
}

async fn purge_loop(
    store: Arc<dyn Store>,
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    const BATCH: usize = 500;
    let interval = interval.max(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        // Small batches keep each write transaction short, so acceptances
        // never queue behind a large delete.
        loop {
            match store.purge_expired(now_millis(), BATCH).await {
                Ok(n) if n > 0 => tracing::debug!(purged = n, "expired ledger entries removed"),
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "ledger purge failed");
                    break;
                }
            }
            if *shutdown.borrow() {
                return;
            }
        }
    }
}
