//! The node's housekeeping loop started by `serve`: expired ledger entries
//! purged every `purge_interval`, in small batches, until shutdown.
//! (The delivery worker and the webhook sender purge their own finished
//! rows.)

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::store::{Store, now_millis};

/// The running purge loop and the switch that stops it.
pub(super) struct LedgerPurge {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl LedgerPurge {
    pub(super) fn start(store: Arc<dyn Store>, interval: Duration) -> LedgerPurge {
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(purge_loop(store, interval, stopped));
        LedgerPurge { stop, task }
    }

    /// Returns once the loop has ended: at most the batch in progress is
    /// finished.
    pub(super) async fn shutdown(self) {
        let _ = self.stop.send(true);
        if let Err(e) = self.task.await {
            tracing::warn!(error = %e, "ledger purge task ended abnormally");
        }
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
        let started = tokio::time::Instant::now();
        let mut purged = 0usize;
        let mut pace = Pace::new();
        loop {
            let batch_started = tokio::time::Instant::now();
            match store.purge_expired(now_millis(), BATCH).await {
                Ok(n) if n > 0 => {
                    purged += n;
                    crate::metrics::global().ledger_purged(n);
                    let pause = pace.pause(n, batch_started.elapsed());
                    if !pause.is_zero() {
                        tokio::select! {
                            _ = tokio::time::sleep(pause) => {}
                            _ = shutdown.wait_for(|stop| *stop) => return,
                        }
                    }
                }
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
        if purged > 0 {
            let seconds = started.elapsed().as_secs_f64();
            tracing::info!(purged, seconds, "expired ledger entries removed");
        }
    }
}

/// Each purged entry costs the writer about what an acceptance does (a
/// random page of the key index: measured, 10 million expired entries purged
/// flat out took acceptance from thousands to ~600 msgs/s with a p99 of
/// 0.6 s). While mail is accepted, the purge takes only what keeps up with
/// expiry with room to catch up: twice the acceptance rate (every expired
/// entry was accepted one retention ago), at least `FLOOR` per second.
/// Idle, it runs flat out.
struct Pace {
    window_started: tokio::time::Instant,
    accepted_then: u64,
    /// Acceptances per second over the last full window.
    rate: f64,
}

/// Entries per second the purge may always take.
const FLOOR: f64 = 2_000.0;
const WINDOW: Duration = Duration::from_secs(1);

impl Pace {
    fn new() -> Self {
        Self {
            window_started: tokio::time::Instant::now(),
            accepted_then: crate::metrics::global().totals().accepted,
            rate: 0.0,
        }
    }

    /// The pause owed after purging `n` entries in `took`.
    fn pause(&mut self, n: usize, took: Duration) -> Duration {
        let elapsed = self.window_started.elapsed();
        if elapsed >= WINDOW {
            let accepted = crate::metrics::global().totals().accepted;
            // Counts to f64: exact far beyond any real count.
            #[allow(clippy::cast_precision_loss)]
            let delta = accepted.saturating_sub(self.accepted_then) as f64;
            self.rate = delta / elapsed.as_secs_f64();
            self.window_started = tokio::time::Instant::now();
            self.accepted_then = accepted;
        }
        owed(n, took, self.rate)
    }
}

/// How long `n` entries purged in `took` must take in all while mail is
/// accepted at `accept_rate` per second (zero when none is).
fn owed(n: usize, took: Duration, accept_rate: f64) -> Duration {
    if accept_rate < 1.0 {
        return Duration::ZERO;
    }
    let allowed = (2.0 * accept_rate).max(FLOOR);
    #[allow(clippy::cast_precision_loss)]
    let due = Duration::from_secs_f64(n as f64 / allowed);
    due.saturating_sub(took)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_purge_keeps_to_twice_the_acceptance_rate() {
        // Idle: flat out.
        assert_eq!(owed(500, Duration::from_millis(10), 0.0), Duration::ZERO);
        // 1,000 acceptances/s: at most 2,000 entries/s (the floor), so 500
        // take 250 ms in all, 240 of them a pause.
        assert_eq!(
            owed(500, Duration::from_millis(10), 1_000.0),
            Duration::from_millis(240)
        );
        // 5,000/s: 10,000 entries/s, 50 ms per 500.
        assert_eq!(
            owed(500, Duration::from_millis(10), 5_000.0),
            Duration::from_millis(40)
        );
        // A batch slower than its share owes nothing more.
        assert_eq!(
            owed(500, Duration::from_millis(80), 5_000.0),
            Duration::ZERO
        );
    }
}
