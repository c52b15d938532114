//! Per-connection counters, merged once at the end so the hot path never
//! takes a lock.

use std::collections::BTreeMap;

use serde::Serialize;

#[derive(Default)]
pub(super) struct ConnStats {
    pub(super) latencies_us: Vec<u32>,
    pub(super) codes: BTreeMap<u16, u64>,
    /// Replies carrying `Idempotency-Replay: true`.
    pub(super) replayed_by_server: u64,
    /// Messages the client deliberately sent again (`--repeat`).
    pub(super) repeats_sent: u64,
    pub(super) errors: u64,
    pub(super) last_error: Option<String>,
}

impl ConnStats {
    pub(super) fn merge(&mut self, other: ConnStats) {
        self.latencies_us.extend_from_slice(&other.latencies_us);
        for (code, n) in other.codes {
            *self.codes.entry(code).or_default() += n;
        }
        self.replayed_by_server += other.replayed_by_server;
        self.repeats_sent += other.repeats_sent;
        self.errors += other.errors;
        if other.last_error.is_some() {
            self.last_error = other.last_error;
        }
    }
}

#[derive(Serialize, Debug, Clone, Copy, Default, PartialEq)]
pub struct LatencyMs {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl LatencyMs {
    /// Nearest-rank percentiles; sorts `us` in place.
    pub(super) fn from_micros(us: &mut [u32]) -> Self {
        if us.is_empty() {
            return Self::default();
        }
        us.sort_unstable();
        let at = |p: f64| {
            let rank = (p * us.len() as f64).ceil() as usize;
            f64::from(us[rank.clamp(1, us.len()) - 1]) / 1000.0
        };
        Self {
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            max: at(1.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let mut v: Vec<u32> = (1..=100).rev().map(|i| i * 1000).collect();
        let l = LatencyMs::from_micros(&mut v);
        assert_eq!(l.p50, 50.0);
        assert_eq!(l.p90, 90.0);
        assert_eq!(l.p99, 99.0);
        assert_eq!(l.max, 100.0);
        assert_eq!(LatencyMs::from_micros(&mut []), LatencyMs::default());
        let l = LatencyMs::from_micros(&mut [7000]);
        assert_eq!((l.p50, l.max), (7.0, 7.0));
    }
}
