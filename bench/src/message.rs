//! Pre-built message bytes. Everything except the per-message key header and
//! Message-ID is rendered (and dot-stuffed) once, so sending a message costs a
//! few integer formats plus one memcpy.

use std::time::{SystemTime, UNIX_EPOCH};

/// Body line length in characters, excluding CRLF (RFC 5322 recommends <= 78).
const LINE_CHARS: usize = 76;
const LINE_BYTES: usize = LINE_CHARS + 2;
/// Printable filler; rotated per line so the body is not one repeated line.
const FILLER: &[u8] = b"The quick brown fox jumps over the lazy dog 0123456789 smtp-once bench. ";

/// How the bench's idempotency keys look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum KeyStyle {
    /// UUID v4-shaped (version and variant bits set), spread over the whole
    /// key space as real clients' keys are: derived from the run's prefix,
    /// the connection and the sequence number by SHA-256, so a run with the
    /// same `--key-prefix` sends the same keys again.
    #[default]
    Uuid,
    /// `<prefix>-<connection>-<sequence>`: keys that sort together, landing
    /// in a few hot spots of the ledger's index (the best case for it).
    Sequential,
}

pub(super) struct MessageTemplate {
    prefix: Vec<u8>,
    style: KeyStyle,
    /// `false` for `--no-key`: the key header is left out entirely.
    with_key: bool,
    /// Static headers, blank line, dot-stuffed body and the final ".\r\n".
    tail: Vec<u8>,
}

impl MessageTemplate {
    /// `size` is the target size of the message itself (headers + body, before
    /// dot-stuffing and without the terminating ".").
    pub(super) fn new(
        prefix: &str,
        style: KeyStyle,
        with_key: bool,
        from: &str,
        to: &str,
        size: usize,
        date: &str,
    ) -> Self {
        let mut headers = Vec::with_capacity(256);
        for (name, value) in [
            ("From", from),
            ("To", to),
            ("Subject", "smtp-once bench"),
            ("Date", date),
            ("MIME-Version", "1.0"),
            ("Content-Type", "text/plain; charset=us-ascii"),
        ] {
            headers.extend_from_slice(name.as_bytes());
            headers.extend_from_slice(b": ");
            headers.extend_from_slice(value.as_bytes());
            headers.extend_from_slice(b"\r\n");
        }
        headers.extend_from_slice(b"\r\n");

        let mut this = Self {
            prefix: prefix.as_bytes().to_vec(),
            style,
            with_key,
            tail: Vec::new(),
        };
        // Per-message headers vary by a few digits; sizing from (0, 0) is close enough.
        let mut probe = Vec::new();
        this.render_head(0, 0, &mut probe);
        let body_len = size.saturating_sub(probe.len() + headers.len());

        let mut tail = headers;
        tail.reserve(body_len + body_len / 64 + 8);
        push_body(&mut tail, body_len);
        tail.extend_from_slice(b".\r\n");
        this.tail = tail;
        this
    }

    /// Writes the complete DATA payload (including the terminating ".\r\n")
    /// for message `seq` of connection `conn` into `buf`. Deterministic, so a
    /// replay of the same (conn, seq) produces identical bytes.
    pub(super) fn render(&self, conn: usize, seq: u64, buf: &mut Vec<u8>) {
        buf.clear();
        self.render_head(conn, seq, buf);
        buf.extend_from_slice(&self.tail);
    }

    fn render_head(&self, conn: usize, seq: u64, buf: &mut Vec<u8>) {
        if self.with_key {
            buf.extend_from_slice(b"X-Bird-Idempotency-Key: ");
            self.push_key(conn, seq, buf);
            buf.extend_from_slice(b"\r\n");
        }
        buf.extend_from_slice(b"Message-ID: <");
        self.push_key(conn, seq, buf);
        buf.extend_from_slice(b"@bench.smtp-once.invalid>\r\n");
    }

    fn push_key(&self, conn: usize, seq: u64, buf: &mut Vec<u8>) {
        match self.style {
            KeyStyle::Sequential => {
                buf.extend_from_slice(&self.prefix);
                buf.push(b'-');
                push_u64(buf, conn as u64);
                buf.push(b'-');
                push_u64(buf, seq);
            }
            KeyStyle::Uuid => push_uuid(&self.prefix, conn, seq, buf),
        }
    }
}

/// Appends `len` bytes of CRLF-terminated lines (each <= LINE_CHARS chars),
/// dot-stuffed. Every 10th line deliberately starts with "." so the server's
/// un-stuffing is exercised on every run.
fn push_body(out: &mut Vec<u8>, len: usize) {
    // Each line needs at least one char plus CRLF.
    if len < 3 {
        return;
    }
    let lines = len.div_ceil(LINE_BYTES);
    let chars = len - 2 * lines;
    let (base, extra) = (chars / lines, chars % lines);
    for i in 0..lines {
        let n = base + usize::from(i < extra);
        let start = out.len();
        for j in 0..n {
            out.push(FILLER[(i * 7 + j) % FILLER.len()]);
        }
        if i % 10 == 1 {
            out[start] = b'.';
        }
        if out[start] == b'.' {
            // RFC 5321 4.5.2 transparency.
            out.insert(start, b'.');
        }
        out.extend_from_slice(b"\r\n");
    }
}

/// A UUID v4-shaped key for `(prefix, conn, seq)`: 16 bytes of their
/// SHA-256 with the version (4) and variant (10xx) bits set, as
/// `xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx`.
fn push_uuid(prefix: &[u8], conn: usize, seq: u64, buf: &mut Vec<u8>) {
    use sha2::{Digest, Sha256};
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut h = Sha256::new();
    h.update(prefix);
    h.update((conn as u64).to_le_bytes());
    h.update(seq.to_le_bytes());
    let digest = h.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    for (i, b) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            buf.push(b'-');
        }
        buf.push(HEX[usize::from(b >> 4)]);
        buf.push(HEX[usize::from(b & 0x0f)]);
    }
}

/// Allocation-free decimal formatting.
fn push_u64(buf: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    buf.extend_from_slice(&digits[i..]);
}

/// RFC 5322 date of "now" in UTC, computed once per run.
pub(super) fn rfc5322_now() -> String {
    smtp_once::time::rfc5322_date(now_secs())
}

/// Unix seconds now (0 for a clock before 1970, which only shows in the
/// `Date:` header).
fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Random-enough run prefix without a `rand` dependency: std's `RandomState`
/// is seeded from OS randomness once per process.
pub(super) fn random_prefix() -> String {
    use std::hash::{BuildHasher, RandomState};
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut v = RandomState::new().hash_one((nanos, std::process::id()));
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut s = String::from("b");
    for _ in 0..10 {
        s.push(char::from(ALPHABET[(v % 36) as usize]));
        v /= 36;
    }
    s
}

/// Tiny xorshift PRNG for the replay decision: no dependency, no locking.
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Self {
        // splitmix64 step so nearby seeds diverge; never zero.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Self((z ^ (z >> 31)) | 1)
    }

    pub(super) fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform in [0, 1).
    pub(super) fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform-ish in [0, n); n > 0. Modulo bias is irrelevant here.
    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unstuff_body(msg: &[u8]) -> Vec<Vec<u8>> {
        let text = msg.strip_suffix(b".\r\n").expect("terminator");
        text.split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| l.strip_suffix(b"\r").expect("CRLF").to_vec())
            .collect()
    }

    #[test]
    fn size_lines_and_stuffing() {
        for size in [0usize, 100, 300, 1000, 4096, 65_536] {
            let t = MessageTemplate::new(
                "pfx",
                KeyStyle::Sequential,
                true,
                "a@b.test",
                "c@d.test",
                size,
                "x",
            );
            let mut buf = Vec::new();
            t.render(3, 17, &mut buf);
            let lines = unstuff_body(&buf);
            let mut real = 0;
            for l in &lines {
                assert!(l.len() <= 78, "line too long: {}", l.len());
                let l = if l.starts_with(b".") {
                    assert!(l.starts_with(b".."), "unstuffed dot line");
                    &l[1..]
                } else {
                    &l[..]
                };
                real += l.len() + 2;
            }
            if size >= 300 {
                assert!(real.abs_diff(size) <= 4, "size {size} got {real}");
            }
            assert!(buf.starts_with(b"X-Bird-Idempotency-Key: pfx-3-17\r\n"));
        }
    }

    #[test]
    fn render_is_deterministic() {
        let t = MessageTemplate::new("p", KeyStyle::Uuid, true, "a@b.test", "c@d.test", 2000, "x");
        let (mut a, mut b) = (Vec::new(), Vec::new());
        t.render(1, 5, &mut a);
        t.render(2, 9, &mut b);
        t.render(1, 5, &mut b);
        assert_eq!(a, b);
        let t = MessageTemplate::new(
            "p",
            KeyStyle::Sequential,
            false,
            "a@b.test",
            "c@d.test",
            2000,
            "x",
        );
        t.render(1, 5, &mut a);
        assert!(a.starts_with(b"Message-ID: <p-1-5@"));
        assert!(!a.windows(9).any(|w| w == b"X-Bird-Id"));
    }

    #[test]
    fn uuid_keys_are_v4_shaped_spread_and_repeatable() {
        let key = |prefix: &str, conn, seq| {
            let mut buf = Vec::new();
            push_uuid(prefix.as_bytes(), conn, seq, &mut buf);
            String::from_utf8(buf).expect("ascii")
        };
        let k = key("p", 1, 5);
        let parts: Vec<&str> = k.split('-').collect();
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12],
            "{k}"
        );
        assert!(
            uuid::Uuid::parse_str(&k).is_ok_and(|u| u.get_version_num() == 4),
            "{k}"
        );
        assert!(
            matches!(parts[3].as_bytes()[0], b'8' | b'9' | b'a' | b'b'),
            "{k}"
        );
        assert_eq!(key("p", 1, 5), k, "the same run prefix gives the same key");
        assert_ne!(key("q", 1, 5), k);
        // Consecutive messages do not share a leading hex digit by rule:
        // over 256 of them every first digit turns up.
        let firsts: std::collections::HashSet<u8> =
            (0..256).map(|s| key("p", 0, s).as_bytes()[0]).collect();
        assert_eq!(firsts.len(), 16);
    }

    #[test]
    fn u64_format() {
        for n in [0u64, 7, 10, 12345, u64::MAX] {
            let mut b = Vec::new();
            push_u64(&mut b, n);
            assert_eq!(b, n.to_string().as_bytes());
        }
    }
}
