//! Queue ids: 11 characters of Crockford base32 over a strictly increasing
//! microsecond clock, so they are short, unique in a process, and sort in
//! acceptance order.

use std::sync::atomic::{AtomicU64, Ordering};

const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
static LAST: AtomicU64 = AtomicU64::new(0);

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
    encode(value)
}

fn encode(mut value: u64) -> String {
    let mut out = [b'0'; 11];
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
    fn ids_are_unique_and_sorted() {
        let ids: Vec<String> = (0..10_000).map(|_| next()).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]));
        assert!(ids.iter().all(|id| id.len() == 11));
    }

    #[test]
    fn encoding_is_fixed_width_and_ordered() {
        assert_eq!(encode(0), "00000000000");
        assert_eq!(encode(31), "0000000000Z");
        assert!(encode(1 << 40) > encode((1 << 40) - 1));
    }
}
