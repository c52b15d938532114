//! The queue counted in one place: every [`COUNT_EVERY`] (less often for a
//! queue that is slow to count) the store's
//! messages by state (and the oldest waiting) feed both the `/metrics`
//! gauges and the backlog bound's estimate. A count reads every live row
//! (0.1 to 0.3 s at a million), so it runs in the background and only once
//! for every reader of it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::backlog::Backlog;
use crate::metrics::{self, QUEUE_STATES};
use crate::store::{MessageState, Store};

/// How often the queue is counted. Between counts the backlog estimate
/// moves with this node's own acceptances and attempts; docs/operations.md
/// says this figure.
pub const COUNT_EVERY: Duration = Duration::from_secs(2);

/// A count takes at most a fiftieth of one core: a queue that takes over
/// 40 ms to count (about 200,000 live messages on SQLite) is counted less
/// often than every [`COUNT_EVERY`], so that counting a queue that grows
/// never slows the acceptances that grow it. Issue 24: at 2,000,000 queued
/// a count took 0.36 s; paced at a tenth of a core it was still 6 % of the
/// daemon's CPU in the last window of acceptance alone (1 % in the first),
/// on 2 cores that the clients share.
const COUNT_SHARE: u32 = 50;

/// The wait before the next count, after one that took `took`.
fn pause_after(took: Duration) -> Duration {
    COUNT_EVERY.max(took.saturating_mul(COUNT_SHARE))
}

/// Longest one count may take; a store that does not answer leaves the
/// last figures in place (its trouble shows on /readyz and in acceptances).
const STORE_TIMEOUT: Duration = Duration::from_secs(5);

/// The running count and the switch that stops it.
pub struct QueueCount {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl QueueCount {
    /// Counts once before returning (a first scrape shows the real queue,
    /// not zeros), then again after each pause ([`pause_after`] the last
    /// count's length) until [`QueueCount::shutdown`].
    pub async fn start(store: Arc<dyn Store>, backlog: Arc<Backlog>) -> Self {
        let mut took = count(&store, &backlog).await;
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = tokio::time::sleep(pause_after(took)) => {}
                    _ = stopped.wait_for(|stop| *stop) => return,
                }
                took = count(&store, &backlog).await;
            }
        });
        QueueCount { stop, task }
    }

    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// Counts once, and returns how long the store took.
async fn count(store: &Arc<dyn Store>, backlog: &Backlog) -> Duration {
    let m = metrics::global();
    let started = Instant::now();
    let depth = tokio::time::timeout(STORE_TIMEOUT, store.queue_depth()).await;
    let took = started.elapsed();
    m.queue_count_seconds(took.as_secs_f64());
    tracing::debug!(seconds = took.as_secs_f64(), "queue counted");
    let depth = match depth {
        Ok(Ok(depth)) => depth,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "cannot count the queue");
            return took;
        }
        Err(_) => {
            tracing::debug!("counting the queue timed out");
            return took;
        }
    };
    let counts: Vec<(&'static str, u64)> = depth
        .counts
        .iter()
        .map(|(state, n)| (state.as_str(), *n))
        .filter(|(state, _)| QUEUE_STATES.contains(state))
        .collect();
    // Milliseconds to seconds: exact far beyond any queue's age.
    #[allow(clippy::cast_precision_loss)]
    let oldest = depth.oldest_age_ms.map_or(0.0, |ms| ms as f64 / 1000.0);
    m.queue_depth(&counts, oldest);
    if backlog.limit() > 0 {
        let waiting = depth
            .counts
            .iter()
            .filter(|(state, _)| matches!(state, MessageState::Queued | MessageState::Delivering))
            .map(|(_, n)| n)
            .sum();
        backlog.resample(waiting);
        m.backlog(waiting);
    }
    took
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_count_waits_fifty_times_its_length() {
        assert_eq!(pause_after(Duration::from_millis(30)), COUNT_EVERY);
        assert_eq!(pause_after(Duration::from_millis(40)), COUNT_EVERY);
        assert_eq!(
            pause_after(Duration::from_millis(360)),
            Duration::from_millis(18_000)
        );
        assert_eq!(pause_after(Duration::MAX), Duration::MAX);
    }
}
