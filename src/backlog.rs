//! The relay's backlog as this node sees it, and acceptance that waits for
//! room in it (issue 24: a relay that keeps up).
//!
//! Acceptance alone runs faster than delivery on the same cores, so under
//! sustained full load the queue of mail waiting for its first attempt
//! grew without end. Like Postfix's `in_flow_delay`, an acceptance that
//! finds the backlog over `[relay] max_backlog` waits (at most
//! `in_flow_delay`) before it commits: the clients' own connections slow
//! down to the rate the relay delivers, and nothing is refused.
//!
//! The backlog is messages `queued` or `delivering`: deferred and held mail
//! waits by design and does not count. The store is counted every few
//! seconds (`resample`); between counts this node's own acceptances and
//! finished attempts move the estimate, so the wait reacts within
//! milliseconds, and another node's work or an operator's command is
//! corrected by the next count.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How often a waiting acceptance looks again.
const STEP: Duration = Duration::from_millis(10);

#[derive(Debug)]
pub struct Backlog {
    /// 0: no limit (the relay paused, or the operator's choice).
    limit: u64,
    max_wait: Duration,
    /// The store's count at the last `resample`.
    counted: AtomicU64,
    accepted_since: AtomicU64,
    finished_since: AtomicU64,
}

impl Backlog {
    pub fn new(limit: u64, max_wait: Duration) -> Self {
        Self {
            limit,
            max_wait,
            counted: AtomicU64::new(0),
            accepted_since: AtomicU64::new(0),
            finished_since: AtomicU64::new(0),
        }
    }

    /// No limit: acceptance never waits.
    pub fn unlimited() -> Self {
        Self::new(0, Duration::ZERO)
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Messages waiting for delivery now, by the last count and what this
    /// node did since.
    pub fn estimate(&self) -> u64 {
        let up = self.counted.load(Ordering::Relaxed) + self.accepted_since.load(Ordering::Relaxed);
        up.saturating_sub(self.finished_since.load(Ordering::Relaxed))
    }

    /// A fresh count of `queued` + `delivering` from the store.
    pub fn resample(&self, waiting: u64) {
        self.counted.store(waiting, Ordering::Relaxed);
        self.accepted_since.store(0, Ordering::Relaxed);
        self.finished_since.store(0, Ordering::Relaxed);
    }

    /// A message was committed to the queue here.
    pub fn accepted(&self) {
        self.accepted_since.fetch_add(1, Ordering::Relaxed);
    }

    /// An attempt here took a message out of `queued`/`delivering`
    /// (delivered, deferred, failed, expired).
    pub fn finished(&self) {
        self.finished_since.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether a new message would go on without waiting.
    pub fn has_room(&self) -> bool {
        self.limit == 0 || self.estimate() < self.limit
    }

    /// Waits until the backlog is under its limit, or `max_wait` passed;
    /// returns how long it waited (zero when there was room).
    pub async fn room(&self) -> Duration {
        if self.has_room() {
            return Duration::ZERO;
        }
        let started = tokio::time::Instant::now();
        loop {
            let waited = started.elapsed();
            if waited >= self.max_wait || self.estimate() < self.limit {
                return waited;
            }
            tokio::time::sleep(STEP.min(self.max_wait - waited)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_follows_this_node_between_counts() {
        let b = Backlog::new(10, Duration::from_secs(1));
        b.resample(5);
        b.accepted();
        b.accepted();
        b.finished();
        assert_eq!(b.estimate(), 6);
        b.resample(2);
        assert_eq!(b.estimate(), 2);
        // More finished than counted (another node's mail): never below 0.
        b.finished();
        b.finished();
        b.finished();
        assert_eq!(b.estimate(), 0);
    }

    // Real time, lower bounds only: a slow machine waits longer, never less.
    #[tokio::test]
    async fn room_waits_for_deliveries_then_at_most_max_wait() {
        let b = std::sync::Arc::new(Backlog::new(3, Duration::from_millis(400)));
        b.resample(2);
        assert_eq!(b.room().await, Duration::ZERO, "under the limit: no wait");
        b.accepted();
        // Over the limit until a delivery finishes 100 ms later.
        let finisher = {
            let b = b.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                b.finished();
            })
        };
        let waited = b.room().await;
        assert!(waited >= Duration::from_millis(100), "{waited:?}");
        finisher.await.expect("finisher");
        assert_eq!(b.estimate(), 2);
        // Nothing finishes: the wait ends at max_wait, and the message goes on.
        b.accepted();
        let waited = b.room().await;
        assert!(waited >= Duration::from_millis(400), "{waited:?}");
        assert_eq!(b.estimate(), 3, "waiting counts nothing");
    }

    #[tokio::test]
    async fn no_limit_never_waits() {
        let b = Backlog::unlimited();
        for _ in 0..100 {
            b.accepted();
        }
        assert_eq!(b.room().await, Duration::ZERO);
    }
}
