//! The SMTP listeners (plain, STARTTLS, implicit TLS) behind the
//! [`front_door`](crate::front_door) (caps, bans, refusals) and their
//! graceful shutdown. The node they serve (acceptor, authenticator, door,
//! budget) is built by `cli/serve.rs`.

pub mod connection;
mod deadline;
pub mod wording;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::accept::Acceptor;
use crate::auth::Authenticator;
use crate::budget::InFlightBudget;
use crate::config::{Config, SmtpTls};
use crate::smtp::session::{Session, SessionConfig};

use crate::front_door::{Door, Entrance, Gate, Wording};
use deadline::TimeLimits;

/// What every connection task shares.
pub struct Shared {
    pub acceptor: Arc<Acceptor>,
    pub auth: Arc<Authenticator>,
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub time_limits: TimeLimits,
    pub tls_handshake_timeout: Duration,
    pub write_timeout: Duration,
    /// The SMTP ports' `max_connections` and per-address caps.
    pub gate: Arc<Gate>,
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
        acceptor: Arc<Acceptor>,
        auth: Arc<Authenticator>,
        door: Arc<Door>,
        budget: Arc<InFlightBudget>,
    ) -> Result<Server, String> {
        crate::tls::install_crypto_provider();
        let tls = match &config.tls {
            Some(files) => Some(crate::tls::load_server_config(&files.cert, &files.key)?),
            None => None,
        };
        let shared = Arc::new(Shared {
            acceptor,
            auth,
            tls: tls.clone(),
            time_limits: TimeLimits {
                command_timeout: config.command_timeout,
                data_timeout: config.data_timeout,
                command_time_limit: config.limits.command_time_limit,
                message_time_limit: config.limits.message_time_limit,
            },
            tls_handshake_timeout: config.limits.tls_handshake_timeout,
            write_timeout: config.limits.write_timeout,
            gate: Gate::new(config.max_connections),
        });
        let (shutdown, shutdown_rx) = watch::channel(false);
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
                starttls_offered: listener.tls == SmtpTls::StartTls && tls.is_some(),
                max_junk_commands: config.limits.max_junk_commands,
                budget: budget.clone(),
            });
            tasks.spawn(accept_loop(
                socket,
                listener.tls == SmtpTls::Implicit,
                session_config,
                shared.clone(),
                door.clone(),
                shutdown_rx.clone(),
                config.shutdown_grace,
            ));
        }
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
    door: Arc<Door>,
    shutdown: watch::Receiver<bool>,
    grace: Duration,
) {
    let entrance = Entrance {
        name: "smtp",
        gate: shared.gate.clone(),
        wording: Wording::Smtp,
        tls: if implicit_tls {
            shared.tls.clone().map(tokio_rustls::TlsAcceptor::from)
        } else {
            None
        },
    };
    let stop = shutdown.clone();
    let handler = move |admitted: crate::front_door::Admitted| {
        let trusted_workspace = if admitted.exempt {
            shared.auth.trusted_workspace(admitted.peer.ip())
        } else {
            None
        };
        let (stream, peer, slots) = admitted.into_parts();
        let session = Session::new(config.clone(), peer, trusted_workspace, implicit_tls);
        let handle = connection::handle(
            stream,
            peer,
            session,
            implicit_tls,
            shared.clone(),
            stop.clone(),
        );
        // Counted until the task ends or is aborted after the grace period.
        let counted = crate::metrics::global().connection();
        async move {
            handle.await;
            // The caps count a connection until its task ends.
            drop(slots);
            drop(counted);
        }
    };
    crate::front_door::serve(socket, door, entrance, handler, shutdown, grace).await;
}
