//! Ground floor: the wall clock as a value, so that what depends on the
//! time (ledger retention, delivery leases, the retry schedule) can be
//! driven by a test without sleeping. Imports no crate module.
//!
//! Milliseconds since the Unix epoch, the same `i64` the store calls
//! `UnixMillis`. Only "now" comes from here: timers and timeouts stay on
//! tokio's monotonic clock.

use std::fmt::Debug;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub type UnixMillis = i64;

/// Where "now" comes from.
pub trait Clock: Send + Sync + Debug {
    fn now_millis(&self) -> UnixMillis;
}

/// The system's wall clock: what the daemon runs on.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_millis(&self) -> UnixMillis {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, millis)
    }
}

/// A clock that moves only when told to (tests). Shared through an `Arc`,
/// so the test keeps a handle on the clock it gave away.
#[derive(Debug)]
pub struct ManualClock {
    now: AtomicI64,
}

impl ManualClock {
    pub fn starting_at(now: UnixMillis) -> Self {
        Self {
            now: AtomicI64::new(now),
        }
    }

    /// Starts at the system clock's now, so that times it stamps look like
    /// real ones (and rows written with either clock sort sensibly).
    pub fn starting_now() -> Self {
        Self::starting_at(SystemClock.now_millis())
    }

    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(millis(by), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_millis(&self) -> UnixMillis {
        self.now.load(Ordering::SeqCst)
    }
}

fn millis(d: Duration) -> UnixMillis {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_advanced() {
        let clock = ManualClock::starting_at(1_000);
        assert_eq!(clock.now_millis(), 1_000);
        assert_eq!(clock.now_millis(), 1_000);
        clock.advance(Duration::from_millis(1_500));
        assert_eq!(clock.now_millis(), 2_500);
    }

    #[test]
    fn system_clock_is_after_2020() {
        // 2020-01-01T00:00:00Z: a clock at 0 (the error fallback) fails.
        assert!(SystemClock.now_millis() > 1_577_836_800_000);
    }
}
