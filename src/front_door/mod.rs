//! The front door: the one accept loop every listener goes through (SMTP,
//! implicit TLS, the HTTP API, metrics, and whatever comes next). A
//! listener is given its limits here and cannot skip them:
//!
//! - bans: an address banned after authentication failures on any channel
//!   is turned away before anything is read ([`ClientPolicy`]);
//! - connections per client address, all listeners together ([`per_ip`];
//!   trusted networks exempt);
//! - connections per listener kind ([`Gate`]), with idle reads cut short
//!   while that cap is reached ([`load`]);
//! - refusals with bounded work, worded for the listener's protocol
//!   ([`refuse`]), inside TLS on implicit-TLS ports;
//! - accept errors (out of descriptors) paused and logged without flooding.
//!
//! What happens after admission (TLS handshake deadline, header and body
//! deadlines) is each protocol's driver's job, with the helpers in
//! [`timed`] and [`http`].

mod accept_errors;
pub mod http;
pub mod load;
pub mod per_ip;
pub mod refuse;
pub mod timed;
pub mod write_deadline;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use accept_errors::AcceptErrors;
use load::Load;
use per_ip::{PerIpLimit, PerIpSlot};
use refuse::Refuser;
pub use refuse::{Refusal, Wording};

/// Who may come in at all, fed by every channel's authentication failures.
pub trait ClientPolicy: Send + Sync {
    /// Banned after too many failures: turned away at connect time.
    fn is_banned(&self, ip: IpAddr) -> bool;
    /// A trusted network: exempt from the per-address cap (Postfix exempts
    /// `$mynetworks` from its client limits too).
    fn is_exempt(&self, ip: IpAddr) -> bool;
}

/// What every listener of a node shares.
pub struct Door {
    policy: Arc<dyn ClientPolicy>,
    /// `limits.max_connections_per_ip`, counted over every listener.
    per_ip: PerIpLimit,
    /// Refusals under way, across listeners.
    refusals: Arc<Semaphore>,
    pub tls_handshake_timeout: Duration,
    pub write_timeout: Duration,
}

impl Door {
    pub fn new(
        policy: Arc<dyn ClientPolicy>,
        max_connections_per_ip: usize,
        tls_handshake_timeout: Duration,
        write_timeout: Duration,
    ) -> Arc<Self> {
        Arc::new(Self {
            policy,
            per_ip: PerIpLimit::new(max_connections_per_ip),
            refusals: Arc::new(Semaphore::new(refuse::MAX_REFUSALS_IN_PROGRESS)),
            tls_handshake_timeout,
            write_timeout,
        })
    }
}

/// The connection cap of one kind of listener (every SMTP port shares
/// one, the API has its own, metrics its own), so that a flood on one
/// cannot lock the others out.
pub struct Gate {
    load: Load,
}

impl Gate {
    pub fn new(max_connections: usize) -> Arc<Self> {
        Arc::new(Self {
            load: Load::new(Arc::new(Semaphore::new(max_connections))),
        })
    }

    /// The cap is reached: idle connections should give their slot back.
    pub fn at_cap(&self) -> bool {
        self.load.at_cap()
    }

    /// Resolves the next time a client is turned away for want of a slot.
    pub async fn cap_reached(&self) {
        self.load.cap_reached().await;
    }
}

/// One listener: its socket, its gate, how it words a refusal.
pub struct Entrance {
    /// For log lines: `smtp`, `http`, `metrics`.
    pub name: &'static str,
    pub gate: Arc<Gate>,
    pub wording: Wording,
    /// Some on an implicit-TLS listener: refusals go inside TLS.
    pub tls: Option<TlsAcceptor>,
}

/// A connection let in, with the slots it holds until it is dropped.
pub struct Admitted {
    pub stream: TcpStream,
    pub peer: SocketAddr,
    /// The client is on a trusted network.
    pub exempt: bool,
    pub gate: Arc<Gate>,
    slots: Slots,
}

impl Admitted {
    /// Gives the slots back (the connection is over).
    pub fn into_parts(self) -> (TcpStream, SocketAddr, Slots) {
        (self.stream, self.peer, self.slots)
    }
}

/// The cap and per-address slots of one connection; dropping frees them.
pub struct Slots {
    _cap: tokio::sync::OwnedSemaphorePermit,
    _per_ip: Option<PerIpSlot>,
}

/// Accepts on `socket` until `shutdown`, lets each connection in through
/// the door's checks and hands it to `handler`; then waits up to `grace`
/// for the connections to end and aborts the rest.
pub async fn serve<H, F>(
    socket: TcpListener,
    door: Arc<Door>,
    entrance: Entrance,
    handler: H,
    mut shutdown: watch::Receiver<bool>,
    grace: Duration,
) where
    H: Fn(Admitted) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let refuser = Refuser {
        tls: entrance.tls.clone(),
        wording: entrance.wording,
        handshake_timeout: door.tls_handshake_timeout,
        write_timeout: door.write_timeout,
        in_progress: door.refusals.clone(),
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
                accept_errors.failed(entrance.name, &e);
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
        match admit(&door, &entrance.gate, peer) {
            Ok((slots, exempt)) => {
                let admitted = Admitted {
                    stream,
                    peer,
                    exempt,
                    gate: entrance.gate.clone(),
                    slots,
                };
                connections.spawn(handler(admitted));
            }
            Err(refusal) => {
                refusal.log(entrance.name, peer);
                if refusal == Refusal::Busy {
                    entrance.gate.load.turned_away();
                }
                if let Some(task) = refuser.refuse(stream, refusal) {
                    connections.spawn(task);
                }
            }
        }
    }
    drop(socket);
    let drain = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(grace, drain).await.is_err() {
        tracing::warn!(
            listener = entrance.name,
            "shutdown grace period over; closing remaining connections"
        );
        connections.shutdown().await;
    }
}

/// The checks, in order: ban, per-address cap, listener cap.
fn admit(door: &Door, gate: &Gate, peer: SocketAddr) -> Result<(Slots, bool), Refusal> {
    if door.policy.is_banned(peer.ip()) {
        return Err(Refusal::Banned);
    }
    let exempt = door.policy.is_exempt(peer.ip());
    let per_ip = if exempt {
        None
    } else {
        Some(door.per_ip.try_acquire(peer.ip()).ok_or(Refusal::PerIp)?)
    };
    let cap = gate
        .load
        .permits()
        .try_acquire_owned()
        .map_err(|_| Refusal::Busy)?;
    Ok((
        Slots {
            _cap: cap,
            _per_ip: per_ip,
        },
        exempt,
    ))
}
