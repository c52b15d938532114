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
    // About 10 ms of the writer's time: consecutive pages of a partition
    // whose span has ended (store::sqlite::ledger_partition).
    const BATCH: usize = 5_000;
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

/// While mail is accepted the purge takes a tenth of the writer's time (a
/// pause nine times each batch's length), or more when a tenth would remove
/// fewer than four entries per acceptance: expiry is kept up with whatever
/// a purged entry costs. Flat out it took the writer from acceptances
/// (before time partitions, 10 million expired entries purged flat out held
/// acceptance at ~600 msgs/s with a p99 of 0.6 s). Idle, it runs flat out.
struct Pace {
    window_started: tokio::time::Instant,
    accepted_then: u64,
    /// Acceptances per second over the last full window.
    rate: f64,
}

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

/// The pause after `n` entries purged in `took` while mail is accepted at
/// `accept_rate` per second: the shorter of a tenth's share and what four
/// entries per acceptance allow (none when idle).
fn owed(n: usize, took: Duration, accept_rate: f64) -> Duration {
    if accept_rate < 1.0 {
        return Duration::ZERO;
    }
    let by_share = took * 9;
    #[allow(clippy::cast_precision_loss)]
    let by_rate = Duration::from_secs_f64(n as f64 / (4.0 * accept_rate)).saturating_sub(took);
    by_share.min(by_rate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_purge_takes_a_tenth_or_four_entries_per_acceptance() {
        let batch = Duration::from_millis(10);
        assert_eq!(owed(5_000, batch, 0.0), Duration::ZERO, "idle: flat out");
        // 1,000 acceptances/s: four per acceptance would allow 1.25 s per
        // 5,000; a tenth's share is the 90 ms pause.
        assert_eq!(owed(5_000, batch, 1_000.0), Duration::from_millis(90));
        // 100,000/s: a tenth would purge 50,000/s, under 400,000/s: the
        // pause shrinks to what four per acceptance need (12.5 ms in all).
        assert_eq!(owed(5_000, batch, 100_000.0), Duration::from_micros(2_500));
        // A batch slower than that owes nothing.
        assert_eq!(
            owed(5_000, Duration::from_millis(20), 100_000.0),
            Duration::ZERO
        );
    }
}
