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
