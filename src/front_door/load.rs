//! Whether the connection cap is reached. When it is, connections that sit
//! idle are the cheapest thing to give back: every read wait is cut to
//! [`IDLE_TIMEOUT_AT_CAP`] (Postfix does the same under stress,
//! `smtpd_timeout = ${stress?10}`), so clients spread over many addresses
//! that connect and say nothing cannot hold every slot for the whole
//! command timeout.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;

/// The per-read wait while the cap is reached.
pub const IDLE_TIMEOUT_AT_CAP: Duration = Duration::from_secs(10);

/// Waiting reads are woken at most this often: a flood of turned-away
/// connections must not turn into a flood of wake-ups of every session.
const WAKE_AT_MOST_EVERY: Duration = Duration::from_secs(1);

pub struct Load {
    permits: Arc<Semaphore>,
    cap_reached: Notify,
    last_wake: Mutex<Option<Instant>>,
}

impl Load {
    pub fn new(permits: Arc<Semaphore>) -> Self {
        Self {
            permits,
            cap_reached: Notify::new(),
            last_wake: Mutex::new(None),
        }
    }

    /// The permits that count connections against `max_connections`.
    pub fn permits(&self) -> Arc<Semaphore> {
        self.permits.clone()
    }

    pub fn at_cap(&self) -> bool {
        self.permits.available_permits() == 0
    }

    /// A client was turned away for want of a slot: wake every waiting
    /// read so it shortens its wait.
    pub fn turned_away(&self) {
        let now = Instant::now();
        let mut last = self
            .last_wake
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if last.is_some_and(|at| now.duration_since(at) < WAKE_AT_MOST_EVERY) {
            return;
        }
        *last = Some(now);
        drop(last);
        self.cap_reached.notify_waiters();
    }

    /// Resolves at the next [`Load::turned_away`].
    pub async fn cap_reached(&self) {
        self.cap_reached.notified().await;
    }
}
