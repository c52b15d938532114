//! The daemon: listeners, the connection caps (global and per client
//! address), refusals, graceful shutdown, and the background purge of
//! expired ledger entries.

mod accept_errors;
pub mod connection;
mod deadline;
mod load;
mod per_ip;
mod refuse;
mod timed;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use crate::accept::Acceptor;
use crate::auth::{AuthError, Authenticator, NewAccount};
use crate::config::{Config, TlsMode};
use crate::smtp::budget::InFlightBudget;
use crate::smtp::session::{Session, SessionConfig};
use crate::store::{Store, now_millis};

use accept_errors::AcceptErrors;
use deadline::TimeLimits;
use load::Load;
use per_ip::PerIpLimit;
use refuse::{Refusal, Refuser};

/// The acceptance pipeline for a node's configuration, shared by every
/// channel; `webhooks` routes its `message.accepted` events.
pub fn acceptor(
    config: &Config,
    store: Arc<dyn Store>,
    webhooks: crate::webhook::Router,
) -> Result<Acceptor, String> {
    Acceptor::new(
        store,
        config.retention,
        config.hostname.clone(),
        &config.limits,
        crate::idempotency::volatile::VolatileHeaders::new(config.volatile_headers.iter().cloned()),
    )
    .map(|a| {
        a.with_webhooks(webhooks)
            .with_dkim(crate::dkim::Signers::new(config.dkim.clone()))
            .with_trace(crate::trace::TraceOptions {
                auth: config.received_auth_header,
            })
    })
}

/// The account directory from `[[user]]`, `[[trusted_network]]` and `[auth]`.
fn authenticator(config: &Config) -> Result<Authenticator, AuthError> {
    let accounts = config
        .users
        .iter()
        .map(|u| NewAccount {
            name: u.name.clone(),
            password_hash: u.password_hash.clone(),
            workspace: u.workspace.clone(),
            allowed_senders: u.allowed_senders.clone(),
        })
        .collect();
    let trusted = config
        .trusted_networks
        .iter()
        .map(|t| (t.cidr, t.workspace.clone()))
        .collect();
    Authenticator::new(accounts, trusted, &config.auth)
}

/// What every connection task shares.
pub struct Shared {
    pub acceptor: Arc<Acceptor>,
    pub auth: Authenticator,
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub time_limits: TimeLimits,
    pub tls_handshake_timeout: Duration,
    pub write_timeout: Duration,
    /// Connections per client address (trusted networks are exempt).
    pub per_ip: PerIpLimit,
    /// Refusals under way, across listeners.
    pub refusals: Arc<Semaphore>,
    /// The `max_connections` cap and whether it is reached.
    pub load: Load,
}

/// A running daemon: its bound addresses and a handle to stop it.
pub struct Server {
    pub addrs: Vec<SocketAddr>,
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<()>,
}

impl Server {
    /// Binds every listener and starts accepting.
    /// `acceptor` is shared with the HTTP API: one set of in-progress
    /// claims per node for both channels.
    pub async fn start(
        config: &Config,
        store: Arc<dyn Store>,
        acceptor: Arc<Acceptor>,
    ) -> Result<Server, String> {
        crate::tls::install_crypto_provider();
        let tls = match &config.tls {
            Some(files) => Some(crate::tls::load_server_config(&files.cert, &files.key)?),
            None => None,
        };
        let shared = Arc::new(Shared {
            acceptor,
            auth: authenticator(config).map_err(|e| e.to_string())?,
            tls: tls.clone(),
            time_limits: TimeLimits {
                command_timeout: config.command_timeout,
                data_timeout: config.data_timeout,
                command_time_limit: config.limits.command_time_limit,
                message_time_limit: config.limits.message_time_limit,
            },
            tls_handshake_timeout: config.limits.tls_handshake_timeout,
            write_timeout: config.limits.write_timeout,
            per_ip: PerIpLimit::new(config.limits.max_connections_per_ip),
            refusals: Arc::new(Semaphore::new(refuse::MAX_REFUSALS_IN_PROGRESS)),
            load: Load::new(Arc::new(Semaphore::new(config.max_connections))),
        });
        let (shutdown, shutdown_rx) = watch::channel(false);
        // One budget for every listener's sessions.
        let budget = InFlightBudget::new(
            config.limits.max_bytes_in_flight,
            config.limits.max_bytes_in_flight_per_account,
        );
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
                max_junk_commands: config.limits.max_junk_commands,
                budget: budget.clone(),
            });
            tasks.spawn(accept_loop(
                socket,
                listener.tls == TlsMode::Implicit,
                session_config,
                shared.clone(),
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

async fn accept_loop(
    socket: TcpListener,
    implicit_tls: bool,
    config: Arc<SessionConfig>,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
    grace: Duration,
) {
    let refuser = Refuser {
        tls: if implicit_tls {
            shared.tls.clone().map(tokio_rustls::TlsAcceptor::from)
        } else {
            None
        },
        handshake_timeout: shared.tls_handshake_timeout,
        write_timeout: shared.write_timeout,
        in_progress: shared.refusals.clone(),
    };
    let mut accept_errors = AcceptErrors::default();
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
                accept_errors.failed(&e);
                // EMFILE and friends: back off instead of spinning, but keep
                // reaping so that finished connections free descriptors.
                let pause = tokio::time::sleep(Duration::from_millis(50));
                tokio::pin!(pause);
                loop {
                    tokio::select! {
                        _ = &mut pause => break,
                        Some(_) = connections.join_next(), if !connections.is_empty() => {}
                    }
                }
                continue;
            }
        };
        accept_errors.recovered();
        let _ = stream.set_nodelay(true);
        if shared.auth.is_banned(peer.ip()) {
            refuse(&refuser, &mut connections, stream, peer, Refusal::Banned);
            continue;
        }
        let trusted_workspace = shared.auth.trusted_workspace(peer.ip());
        // Trusted networks are our own senders (Postfix exempts $mynetworks
        // by default too); everyone else counts per address.
        let per_ip = if trusted_workspace.is_some() {
            None
        } else {
            match shared.per_ip.try_acquire(peer.ip()) {
                Some(slot) => Some(slot),
                None => {
                    refuse(&refuser, &mut connections, stream, peer, Refusal::PerIp);
                    continue;
                }
            }
        };
        let Ok(permit) = shared.load.permits().try_acquire_owned() else {
            refuse(&refuser, &mut connections, stream, peer, Refusal::Busy);
            shared.load.turned_away();
            continue;
        };
        let session = Session::new(config.clone(), peer, trusted_workspace, implicit_tls);
        let handle = connection::handle(
            stream,
            peer,
            session,
            implicit_tls,
            shared.clone(),
            shutdown.clone(),
        );
        // Counted until the task ends or is aborted after the grace period.
        let counted = crate::metrics::global().connection();
        connections.spawn(async move {
            handle.await;
            // The caps count a connection until its task ends.
            drop(permit);
            drop(per_ip);
            drop(counted);
        });
    }
    drop(socket);
    let drain = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(grace, drain).await.is_err() {
        tracing::warn!("shutdown grace period over; closing remaining connections");
        connections.shutdown().await;
    }
}

fn refuse(
    refuser: &Refuser,
    connections: &mut JoinSet<()>,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    refusal: Refusal,
) {
    refusal.log(peer);
    if let Some(task) = refuser.refuse(stream, refusal) {
        connections.spawn(task);
    }
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
