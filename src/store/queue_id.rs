//! Queue ids: 15 characters of Crockford base32: 11 over a strictly
//! increasing microsecond clock (unique in a process, sorting in acceptance
//! order), then 4 drawn at random once per process (20 bits), so that nodes
//! sharing one PostgreSQL queue do not make the same id in the same
//! microsecond.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};

const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
static LAST: AtomicU64 = AtomicU64::new(0);
/// This process's suffix.
static PROCESS_TAG: LazyLock<String> = LazyLock::new(|| {
    let random = uuid::Uuid::new_v4().as_u128();
    let tag = u64::try_from(random & 0xF_FFFF).unwrap_or(0);
    encode(tag, 4)
});

pub fn next() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    // Never repeat, even if the clock stalls or steps back within a run.
    let mut prev = LAST.load(Ordering::Relaxed);
    let value = loop {
        let candidate = now.max(prev + 1);
        match LAST.compare_exchange_weak(prev, candidate, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => break candidate,
            Err(actual) => prev = actual,
        }
    };
    let mut id = encode(value, 11);
    id.push_str(&PROCESS_TAG);
    id
}

/// A lower bound of the ids of messages accepted at or after `at_ms` (Unix
/// milliseconds): the time part alone, which sorts before every id that
/// starts with it. Ids carry the accepting process's clock, rows their
/// `created_at`: callers take a margin and keep the exact time condition,
/// the bound only narrows the index range an age filter walks.
pub fn lower_bound(at_ms: i64) -> String {
    let micros = u64::try_from(at_ms.max(0))
        .unwrap_or(0)
        .saturating_mul(1000);
    encode(micros, 11)
}

fn encode(mut value: u64, width: usize) -> String {
    let mut out = vec![b'0'; width];
    for slot in out.iter_mut().rev() {
        *slot = ALPHABET[(value & 31) as usize];
        value >>= 5;
    }
    out.iter().map(|&b| b as char).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lower_bound_sorts_before_every_later_id() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(0))
            .unwrap_or(0);
        let id = next();
        assert!(lower_bound(now - 1) <= id, "{} {id}", lower_bound(now - 1));
        assert!(lower_bound(now + 60_000) > id);
    }

    #[test]
    fn ids_are_unique_and_sorted() {
        let ids: Vec<String> = (0..10_000).map(|_| next()).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]));
        assert!(ids.iter().all(|id| id.len() == 15));
        assert!(
            ids.iter().all(|id| id[11..] == ids[0][11..]),
            "one tag per process"
        );
    }

    #[test]
    fn encoding_is_fixed_width_and_ordered() {
        assert_eq!(encode(0, 11), "00000000000");
        assert_eq!(encode(31, 11), "0000000000Z");
        assert!(encode(1 << 40, 11) > encode((1 << 40) - 1, 11));
        assert_eq!(encode(0xF_FFFF, 4), "ZZZZ");
    }
}
