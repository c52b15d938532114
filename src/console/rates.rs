//! The overview's rates: the daemon's own counters (`metrics::totals`)
//! sampled every 10 s into a ring of one hour, and the chart drawn from it
//! as inline SVG (no script, no Prometheus).

use std::collections::VecDeque;
use std::sync::Mutex;

use maud::{Markup, html};

use crate::metrics::Totals;

/// One hour of 10-second samples, and one more for the first difference.
pub const KEEP: usize = 361;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub at: i64,
    pub totals: Totals,
}

#[derive(Default)]
pub struct Rates {
    ring: Mutex<VecDeque<Sample>>,
}

impl Rates {
    pub fn record(&self, at: i64, totals: Totals) {
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        if ring.len() >= KEEP {
            ring.pop_front();
        }
        ring.push_back(Sample { at, totals });
    }

    pub fn samples(&self) -> Vec<Sample> {
        self.ring
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .copied()
            .collect()
    }
}

/// Per minute over the last minute (or what there is of it): accepted,
/// delivered. `None` before two samples.
pub fn last_minute(samples: &[Sample]) -> Option<(f64, f64)> {
    let last = samples.last()?;
    let first = samples
        .iter()
        .rev()
        .find(|s| last.at - s.at >= 60_000)
        .or_else(|| samples.first())?;
    per_minute(first, last)
}

fn per_minute(a: &Sample, b: &Sample) -> Option<(f64, f64)> {
    let ms = b.at - a.at;
    if ms <= 0 {
        return None;
    }
    #[allow(clippy::cast_precision_loss)] // counts and ms far below 2^53
    let scale = 60_000.0 / ms as f64;
    #[allow(clippy::cast_precision_loss)]
    let rate = |x: u64, y: u64| y.saturating_sub(x) as f64 * scale;
    Some((
        rate(a.totals.accepted, b.totals.accepted),
        rate(a.totals.delivered, b.totals.delivered),
    ))
}

const W: f64 = 600.0;
const H: f64 = 160.0;
const PAD: f64 = 30.0;

/// The last hour's per-minute rates as two lines, accepted and delivered,
/// on a time axis that always spans the hour.
pub fn chart(samples: &[Sample]) -> Markup {
    let points: Vec<(i64, f64, f64)> = samples
        .windows(2)
        .filter_map(|w| per_minute(&w[0], &w[1]).map(|(a, d)| (w[1].at, a, d)))
        .collect();
    let end = samples.last().map_or(0, |s| s.at);
    let start = end - 3_600_000;
    let top = points
        .iter()
        .map(|(_, a, d)| a.max(*d))
        .fold(1.0_f64, f64::max)
        .ceil();
    #[allow(clippy::cast_precision_loss)]
    let x = |at: i64| PAD + (at - start) as f64 / 3_600_000.0 * (W - 2.0 * PAD);
    let y = |v: f64| H - PAD - v / top * (H - 2.0 * PAD);
    let line = |pick: fn(&(i64, f64, f64)) -> f64| {
        points
            .iter()
            .map(|p| format!("{:.1},{:.1}", x(p.0), y(pick(p))))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let accepted = line(|p| p.1);
    let delivered = line(|p| p.2);
    html! {
        svg #chart viewBox={"0 0 " (W) " " (H)} role="img" aria-labelledby="chart-title chart-desc"
            xmlns="http://www.w3.org/2000/svg" {
            title #chart-title { "Messages per minute, last hour" }
            desc #chart-desc {
                "Accepted (solid line) and delivered (dashed line) per minute, sampled every 10 seconds; "
                "the scale tops at " (top) " per minute."
            }
            line x1=(PAD) y1=(H - PAD) x2=(W - PAD) y2=(H - PAD) class="axis" {}
            line x1=(PAD) y1=(PAD) x2=(PAD) y2=(H - PAD) class="axis" {}
            text x=(PAD - 4.0) y=(PAD + 4.0) text-anchor="end" class="tick" { (top) }
            text x=(PAD - 4.0) y=(H - PAD) text-anchor="end" class="tick" { "0" }
            text x=(PAD) y=(H - 8.0) class="tick" { "−60 min" }
            text x=(W - PAD) y=(H - 8.0) text-anchor="end" class="tick" { "now" }
            @if !points.is_empty() {
                polyline class="accepted" points=(accepted) {}
                polyline class="delivered" points=(delivered) {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64, accepted: u64, delivered: u64) -> Sample {
        Sample {
            at: s * 1000,
            totals: Totals {
                accepted,
                delivered,
                ..Totals::default()
            },
        }
    }

    #[test]
    fn the_ring_keeps_an_hour() {
        let r = Rates::default();
        for i in 0..400 {
            r.record(i * 10_000, Totals::default());
        }
        let s = r.samples();
        assert_eq!(s.len(), KEEP);
        assert_eq!(s[0].at, 39 * 10_000);
    }

    #[test]
    fn rates_are_per_minute() {
        let s = [at(0, 0, 0), at(30, 10, 5), at(60, 20, 10)];
        assert_eq!(last_minute(&s), Some((20.0, 10.0)));
        assert_eq!(last_minute(&s[..1]), None);
        let svg = chart(&s).into_string();
        assert!(
            svg.contains("id=\"chart\"") && svg.contains("polyline"),
            "{svg}"
        );
    }
}
