//! Message fingerprint: SHA-256 over the envelope and the content (SPEC
//! section 3). Two submissions with the same idempotency key are the same
//! message exactly when their fingerprints are equal.
//!
//! What counts:
//! - the reverse-path exactly as given (case preserved);
//! - the *set* of recipients (sorted and deduplicated, compared exactly);
//! - the content byte for byte, except the MIME multipart structure: for a
//!   `multipart/*` message (nested multiparts too) the boundary string and the
//!   order of the parts do not count. Everything else does: every header
//!   (whitespace included, only the boundary parameter's value is left out),
//!   preamble, epilogue, delimiter transport padding and every part's bytes;
//! - and except the values of the volatile top-level headers
//!   ([`VolatileHeaders`], by default `Date` and `Message-ID`), which mail
//!   libraries stamp afresh on every attempt. Such a field is hashed with its
//!   value (after the colon up to the line break that ends the field, folded
//!   lines included) replaced by a fixed marker: its name as written, its
//!   position, the colon and the line break count. Part headers and the
//!   headers of attached messages stay strict. A message without any volatile
//!   field hashes exactly as before the rule existed (stored fingerprints stay
//!   valid), one with them under its own tag;
//! - and, for a keyed message ([`keyed_fingerprint`]), except the trace and
//!   transit fields ([`TransitHeaders`], `Received`, `DKIM-Signature`, ...):
//!   they are cut out of the top-level header section whole before anything
//!   else, so the message hashes exactly as if a hop had never added them.
//!
//! Framing: each hash input starts with a tag and every variable-length field
//! is preceded by its length (u64, little endian), so different inputs cannot
//! feed the same byte stream to the hasher by shifting bytes between fields.
//!
//! Caveats:
//! - The canonical MIME form depends on how mail-parser (pinned `=0.11.9`)
//!   splits the message. Upgrading it may change fingerprints of unusual
//!   messages: bump `VERSION_TAG` with such an upgrade.
//! - Malformed multipart messages (mail-parser's parts do not tile the message
//!   as a tree, nesting deeper than `MAX_MIME_DEPTH`, no boundary) are hashed
//!   raw: deterministic, but a reordered retry of such a message differs.
//! - mail-parser only ever sees content that passed the MIME limits
//!   (`mime_limits::check`): its recursion on deep nesting would overflow the
//!   stack. The acceptor checks the configured limits and refuses messages
//!   over them before fingerprinting ([`fingerprint_checked`]); [`fingerprint`]
//!   checks the default limits itself and hashes anything over them raw.
//! - mail-parser's `debug_assert!`s fire on some malformed input when debug
//!   assertions are on; we catch the panic and hash raw, while a release build
//!   parses on. To get the same fingerprints in all builds (and no panic
//!   message on stderr in tests), set in the crate's Cargo.toml (the test
//!   profile inherits it):
//!   `[profile.dev.package.mail-parser]`
//!   `debug-assertions = false` and `overflow-checks = false`.

use std::borrow::Cow;
use std::ops::Range;

use mail_parser::{Message, MessageParser, MimeHeaders, PartType};
use sha2::{Digest, Sha256};

use super::transit::TransitHeaders;
use super::volatile::VolatileHeaders;
use crate::message::headers::{field_spans, top_level_headers};
use crate::message::mime_limits::{self, MimeLimits, WithinLimits};

pub type Fingerprint = [u8; 32];

/// Bump when anything below changes: stored fingerprints become incomparable.
const VERSION_TAG: &[u8] = b"smtp-once-fp-v1";

/// Content hashed byte for byte.
const CONTENT_RAW: u8 = 0;
/// Content hashed through the canonical MIME tree.
const CONTENT_MIME: u8 = 1;
/// Canonical hash of a non-multipart MIME part (message/rfc822 included).
const NODE_LEAF: u8 = 2;
/// Canonical hash of a multipart MIME part.
const NODE_MULTIPART: u8 = 3;
/// Content hashed byte for byte, volatile header values replaced by markers.
const CONTENT_RAW_VOLATILE: u8 = 4;
/// The root multipart part, volatile header values replaced by markers.
const NODE_MULTIPART_VOLATILE: u8 = 5;

/// Part headers below the root: every value counts.
static STRICT: VolatileHeaders = VolatileHeaders::none();

/// What a cut out of hashed header bytes stood for: the marker hashed in
/// its place (only written when a header has a volatile cut, so headers
/// without one hash as before the rule existed).
#[derive(Clone, Copy)]
enum Cut {
    Boundary = 0,
    Volatile = 1,
}

/// Deeper multipart nesting is hashed raw: it bounds our recursion on hostile
/// input (mail-parser itself does not limit multipart depth) and real mail
/// never comes close.
const MAX_MIME_DEPTH: usize = 32;

/// SHA-256 over the envelope and the content (SPEC section 3), for content
/// not yet checked against the MIME limits: content over the default limits
/// is hashed raw, never parsed.
pub fn fingerprint(
    reverse_path: &str,
    recipients: &[String],
    content: &[u8],
    volatile: &VolatileHeaders,
) -> Fingerprint {
    let within = if is_multipart(content) {
        mime_limits::check(content, &MimeLimits::default()).ok()
    } else {
        None
    };
    hash(reverse_path, recipients, content, within.as_ref(), volatile)
}

/// SHA-256 over the envelope and content that passed the MIME limits.
pub fn fingerprint_checked(
    reverse_path: &str,
    recipients: &[String],
    content: &WithinLimits<'_>,
    volatile: &VolatileHeaders,
) -> Fingerprint {
    hash(
        reverse_path,
        recipients,
        content.content(),
        Some(content),
        volatile,
    )
}

/// The identity of a keyed message (SPEC section 3): the fingerprint of
/// `content` (which passed `limits`) with its top-level `transit` fields
/// removed. Without any, exactly [`fingerprint_checked`]. With some, the
/// rest is checked against `limits` again before mail-parser sees it (only
/// a transit `Content-Type` could change the structure); if it fails, it is
/// hashed raw: deterministic, only ever more sensitive.
pub fn keyed_fingerprint(
    reverse_path: &str,
    recipients: &[String],
    content: &WithinLimits<'_>,
    limits: &MimeLimits,
    volatile: &VolatileHeaders,
    transit: &TransitHeaders,
) -> Fingerprint {
    match transit.strip(content.content()) {
        Cow::Borrowed(_) => fingerprint_checked(reverse_path, recipients, content, volatile),
        Cow::Owned(author) => {
            let within = if is_multipart(&author) {
                mime_limits::check(&author, limits).ok()
            } else {
                None
            };
            hash(reverse_path, recipients, &author, within.as_ref(), volatile)
        }
    }
}

fn hash(
    reverse_path: &str,
    recipients: &[String],
    content: &[u8],
    within: Option<&WithinLimits<'_>>,
    volatile: &VolatileHeaders,
) -> Fingerprint {
    let mut h = Sha256::new();
    put(&mut h, VERSION_TAG);
    put(&mut h, reverse_path.as_bytes());

    let mut rcpts: Vec<&str> = recipients.iter().map(String::as_str).collect();
    rcpts.sort_unstable();
    rcpts.dedup();
    put_len(&mut h, rcpts.len());
    for r in rcpts {
        put(&mut h, r.as_bytes());
    }

    match within.and_then(|w| canonical_mime_hash(w, volatile)) {
        Some(root) => {
            h.update([CONTENT_MIME]);
            h.update(root);
        }
        None => {
            let cuts: Vec<(Range<usize>, Cut)> = volatile
                .value_spans(content)
                .into_iter()
                .map(|r| (r, Cut::Volatile))
                .collect();
            if cuts.is_empty() {
                h.update([CONTENT_RAW]);
                put(&mut h, content);
            } else {
                h.update([CONTENT_RAW_VOLATILE]);
                put_with_cuts(&mut h, content, &cuts, true);
            }
        }
    }
    h.finalize().into()
}

/// Canonical hash of a multipart message, or `None` when the content is to be
/// hashed raw: not multipart (the fast path: no MIME parsing at all), or
/// mail-parser's view of it is not a clean tree of byte ranges covering the
/// whole message (malformed input). Falling back to raw bytes only ever makes
/// fingerprints *more* sensitive, never lets two different messages match.
fn canonical_mime_hash(within: &WithinLimits<'_>, volatile: &VolatileHeaders) -> Option<[u8; 32]> {
    let content = within.content();
    if !is_multipart(content) {
        return None;
    }
    // mail-parser 0.11.9 has `debug_assert!(false, ..)`s on some malformed
    // structures (the property tests hit one), which panic in builds with
    // debug assertions; release builds compile them out. A panic here means
    // "no usable structure": hash raw instead of failing the transaction.
    // (No help under `panic = "abort"`; see the module caveats.)
    let msg = std::panic::catch_unwind(|| MessageParser::default().parse(content))
        .ok()
        .flatten()?;
    let root = msg.parts.first()?;
    if root.offset_header != 0 || !matches!(root.body, PartType::Multipart(_)) {
        return None;
    }
    Canon {
        msg: &msg,
        raw: content,
        volatile,
    }
    .node(0, content.len(), 0)
}

/// Whether a top-level Content-Type is `multipart/...`.
fn is_multipart(content: &[u8]) -> bool {
    top_level_headers(content).any(|(name, value)| {
        name.eq_ignore_ascii_case(b"Content-Type")
            && value
                .trim_ascii_start()
                .get(..b"multipart/".len())
                .is_some_and(|t| t.eq_ignore_ascii_case(b"multipart/"))
    })
}

struct Canon<'m, 'x> {
    msg: &'m Message<'x>,
    raw: &'x [u8],
    /// Applies to the root's header only (the top-level header section).
    volatile: &'m VolatileHeaders,
}

impl Canon<'_, '_> {
    /// Canonical hash of part `id`, whose bytes are `raw[offset_header..end]`.
    ///
    /// mail-parser's offsets (verified by experiment and its source, 0.11.9):
    /// `offset_header` is just after the delimiter line (after transport
    /// padding and its CRLF); `offset_body` is just after the empty line ending
    /// the part's headers; for a leaf, message/rfc822 or nested multipart,
    /// `offset_end` is the start of the CRLF that precedes the next delimiter
    /// (that CRLF belongs to the delimiter, RFC 2046), whether the next
    /// delimiter is `--B` or the close `--B--` (mail-parser also accepts `--B`
    /// mid-line; then `offset_end` is at the `--`). So a part's bytes do not depend
    /// on its position, and everything between two parts (CRLF, delimiter,
    /// padding, CRLF), before the first part (preamble) and after the last
    /// (close delimiter, epilogue) is a "gap" hashed in position order with
    /// the boundary string cut out. The root's own `offset_end` is not used:
    /// the root always extends to the end of the message.
    fn node(&self, id: usize, end: usize, depth: usize) -> Option<[u8; 32]> {
        let part = self.msg.parts.get(id)?;
        let body_start = part.offset_body as usize;
        let header = self.raw.get(part.offset_header as usize..body_start)?;
        let body = self.raw.get(body_start..end)?;

        let mut h = Sha256::new();
        let PartType::Multipart(children) = &part.body else {
            h.update([NODE_LEAF]);
            put(&mut h, header);
            put(&mut h, body);
            return Some(h.finalize().into());
        };

        if depth >= MAX_MIME_DEPTH {
            return None;
        }
        let boundary = part.content_type()?.attribute("boundary")?.as_bytes();
        if boundary.is_empty() {
            return None;
        }

        let mut gaps = Vec::with_capacity(children.len() + 1);
        let mut hashes = Vec::with_capacity(children.len());
        let mut cursor = body_start;
        let mut prev = id;
        for &child in children {
            let child = child as usize;
            // Ids are assigned in document order, so children of a sane tree
            // have strictly increasing ids above the parent's; checking it
            // also rules out cycles.
            if child <= prev {
                return None;
            }
            prev = child;
            let c = self.msg.parts.get(child)?;
            let (c_start, c_end) = (c.offset_header as usize, c.offset_end as usize);
            // Children must tile the body in order, inside the parent.
            if c_end > end {
                return None;
            }
            gaps.push(self.raw.get(cursor..c_start)?);
            hashes.push(self.node(child, c_end, depth + 1)?);
            cursor = c_end;
        }
        gaps.push(self.raw.get(cursor..end)?);
        // The order of the parts does not count.
        hashes.sort_unstable();

        let volatile = if id == 0 { self.volatile } else { &STRICT };
        put_multipart_header(&mut h, header, boundary, volatile)?;
        put_len(&mut h, hashes.len());
        let mut delimiter = Vec::with_capacity(boundary.len() + 2);
        delimiter.extend_from_slice(b"--");
        delimiter.extend_from_slice(boundary);
        for gap in gaps {
            put_split(&mut h, gap, &delimiter);
        }
        for child in hashes {
            h.update(child);
        }
        Some(h.finalize().into())
    }
}

/// Hashes a multipart part's node tag and header bytes with the value of the
/// boundary parameter of Content-Type cut out: `boundary="abc"`,
/// `boundary="xyz"` and `boundary=xyz` all hash as `boundary=`. Only a value
/// equal to the boundary mail-parser actually used is cut, so no other
/// parameter can be ignored. The values of `volatile` fields are cut too
/// (a volatile Content-Type whole, boundary included).
fn put_multipart_header(
    h: &mut Sha256,
    header: &[u8],
    boundary: &[u8],
    volatile: &VolatileHeaders,
) -> Option<()> {
    let mut cuts = Vec::new();
    let mut boundaries = Vec::new();
    for field in field_spans(header) {
        let name = header.get(field.name.clone())?;
        if volatile.contains(name) {
            cuts.push((field.value, Cut::Volatile));
        } else if name.eq_ignore_ascii_case(b"Content-Type") {
            boundaries.clear();
            boundary_values(
                header,
                field.value.start,
                field.value.end,
                boundary,
                &mut boundaries,
            )?;
            cuts.extend(boundaries.iter().map(|&(s, e)| (s..e, Cut::Boundary)));
        }
    }
    let has_volatile = cuts.iter().any(|(_, c)| matches!(c, Cut::Volatile));
    h.update([if has_volatile {
        NODE_MULTIPART_VOLATILE
    } else {
        NODE_MULTIPART
    }]);
    put_with_cuts(h, header, &cuts, has_volatile);
    Some(())
}

/// Hashes `bytes` as the pieces between `cuts` (in order, disjoint). With
/// `marked`, each cut's kind is hashed after the piece before it; without,
/// every cut is a boundary value (the encoding from before volatile headers).
/// The cuts come from `field_spans` over `bytes`, so they are in range.
fn put_with_cuts(h: &mut Sha256, bytes: &[u8], cuts: &[(Range<usize>, Cut)], marked: bool) {
    put_len(h, cuts.len() + 1);
    let mut pos = 0;
    for (range, cut) in cuts {
        put(h, bytes.get(pos..range.start).unwrap_or_default());
        if marked {
            h.update([*cut as u8]);
        }
        pos = range.end;
    }
    put(h, bytes.get(pos..).unwrap_or_default());
}

/// Appends to `cuts` the ranges (absolute in `buf`) of every `boundary`
/// parameter value in the Content-Type value `buf[start..end]` that equals
/// `boundary` (quoted-string compared unescaped). Quoted strings and comments
/// are skipped, so `name="x;boundary=y"` is not mistaken for a parameter.
fn boundary_values(
    buf: &[u8],
    start: usize,
    end: usize,
    boundary: &[u8],
    cuts: &mut Vec<(usize, usize)>,
) -> Option<()> {
    let v = buf.get(start..end)?;
    let at = |i: usize| v.get(i).copied();
    let skip_fws = |mut i: usize| {
        while matches!(at(i), Some(b' ' | b'\t' | b'\r' | b'\n')) {
            i += 1;
        }
        i
    };
    let mut i = 0;
    while let Some(b) = at(i) {
        match b {
            b'"' => i = skip_quoted(v, i).1,
            b'(' => i = skip_comment(v, i),
            b';' => {
                let name_start = skip_fws(i + 1);
                let mut j = name_start;
                while at(j).is_some_and(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_') {
                    j += 1;
                }
                let is_boundary = v
                    .get(name_start..j)
                    .is_some_and(|n| n.eq_ignore_ascii_case(b"boundary"));
                i = j;
                if !is_boundary {
                    continue;
                }
                let eq = skip_fws(j);
                if at(eq) != Some(b'=') {
                    continue;
                }
                let value_start = skip_fws(eq + 1);
                let (value, value_end) = if at(value_start) == Some(b'"') {
                    skip_quoted(v, value_start)
                } else {
                    let mut k = value_start;
                    while at(k).is_some_and(|c| {
                        !c.is_ascii_whitespace() && !c.is_ascii_control() && !b";(\"".contains(&c)
                    }) {
                        k += 1;
                    }
                    (v.get(value_start..k)?.to_vec(), k)
                };
                if value == boundary {
                    cuts.push((start + value_start, start + value_end));
                }
                i = value_end;
            }
            _ => i += 1,
        }
    }
    Some(())
}

/// Skips the quoted-string starting at `v[open] == '"'`; returns its unescaped
/// content and the index after the closing quote (or `v.len()` if unclosed).
fn skip_quoted(v: &[u8], open: usize) -> (Vec<u8>, usize) {
    let mut out = Vec::new();
    let mut i = open + 1;
    while let Some(&b) = v.get(i) {
        match b {
            b'"' => return (out, i + 1),
            b'\\' => {
                if let Some(&e) = v.get(i + 1) {
                    out.push(e);
                }
                i += 2;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    (out, v.len())
}

/// Skips the (nestable) comment starting at `v[open] == '('`.
fn skip_comment(v: &[u8], open: usize) -> usize {
    let mut depth = 0usize;
    let mut i = open;
    while let Some(&b) = v.get(i) {
        match b {
            b'\\' => i += 1,
            b'(' => depth += 1,
            b')' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    v.len()
}

/// Hashes `gap` as the list of pieces between occurrences of `delimiter`
/// (`--` + boundary): the delimiter lines' positions and everything around
/// them count, the boundary string does not.
fn put_split(h: &mut Sha256, gap: &[u8], delimiter: &[u8]) {
    let mut pieces = Vec::new();
    let mut rest = gap;
    while let Some(i) = find(rest, delimiter) {
        pieces.push(rest.get(..i).unwrap_or_default());
        rest = rest.get(i + delimiter.len()..).unwrap_or_default();
    }
    pieces.push(rest);
    put_len(h, pieces.len());
    for p in pieces {
        put(h, p);
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

fn put(h: &mut Sha256, bytes: &[u8]) {
    put_len(h, bytes.len());
    h.update(bytes);
}

fn put_len(h: &mut Sha256, n: usize) {
    h.update((n as u64).to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The canonical hash under the default MIME limits.
    fn canonical(content: &[u8]) -> Option<[u8; 32]> {
        canonical_mime_hash(
            &mime_limits::check(content, &MimeLimits::default()).ok()?,
            &VolatileHeaders::default(),
        )
    }

    /// The fingerprint under the default volatile headers (the daemon's
    /// default), so every strictness test below holds with the rule on.
    fn fingerprint(r: &str, rcpts: &[String], content: &[u8]) -> Fingerprint {
        super::fingerprint(r, rcpts, content, &VolatileHeaders::default())
    }

    fn rcpts(r: &[&str]) -> Vec<String> {
        r.iter().map(|s| s.to_string()).collect()
    }

    fn fp(content: &str) -> Fingerprint {
        fingerprint(
            "a@example.com",
            &rcpts(&["b@example.com"]),
            content.as_bytes(),
        )
    }

    /// Asserts the message goes through the canonical MIME path, so that the
    /// tests below cannot pass by accident through the raw fallback.
    fn assert_mime(content: &str) {
        assert!(
            canonical(content.as_bytes()).is_some(),
            "expected the MIME path for {content:?}"
        );
    }

    /// A multipart message with `boundary` around `parts` (each part is its
    /// headers, an empty line and its body).
    fn multipart(ctype: &str, boundary: &str, parts: &[&str]) -> String {
        let mut m = format!(
            "From: a@example.com\r\nSubject: test\r\nMIME-Version: 1.0\r\n\
             Content-Type: {ctype}; boundary=\"{boundary}\"\r\n\r\n\
             This is a MIME message.\r\n"
        );
        for p in parts {
            m.push_str(&format!("--{boundary}\r\n{p}\r\n"));
        }
        m.push_str(&format!("--{boundary}--\r\nepilogue\r\n"));
        m
    }

    /// A nested multipart part (no trailing CRLF: the caller adds it).
    fn nested(boundary: &str, parts: &[&str]) -> String {
        let mut m = format!("Content-Type: multipart/alternative; boundary={boundary}\r\n\r\n");
        for p in parts {
            m.push_str(&format!("--{boundary}\r\n{p}\r\n"));
        }
        m.push_str(&format!("--{boundary}--"));
        m
    }

    const P1: &str = "Content-Type: text/plain; charset=utf-8\r\n\r\nHello, world.\r\nSecond line.";
    const P2: &str = "Content-Type: text/html\r\n\r\n<p>Hello</p>\r\n";
    const P3: &str = "Content-Type: application/pdf; name=\"a.pdf\"\r\n\
                      Content-Disposition: attachment; filename=\"a.pdf\"\r\n\
                      Content-Transfer-Encoding: base64\r\n\r\nJVBERi0xLjQK\r\nAAAA";
    const MSG: &str = "Content-Type: message/rfc822\r\n\r\nSubject: inner\r\n\r\ninner body";

    #[test]
    fn sha2_output_is_32_bytes_and_stable() {
        let a = fp("Subject: x\r\n\r\nbody");
        assert_eq!(a, fp("Subject: x\r\n\r\nbody"));
        assert_ne!(a, [0u8; 32]);
    }

    #[test]
    fn recipient_order_and_duplicates_irrelevant() {
        let c = b"Subject: x\r\n\r\nbody";
        let a = fingerprint("s@x", &rcpts(&["a@x", "b@x", "c@x"]), c);
        assert_eq!(a, fingerprint("s@x", &rcpts(&["c@x", "a@x", "b@x"]), c));
        assert_eq!(
            a,
            fingerprint("s@x", &rcpts(&["b@x", "a@x", "c@x", "a@x"]), c)
        );
    }

    #[test]
    fn recipient_set_matters() {
        let c = b"Subject: x\r\n\r\nbody";
        let a = fingerprint("s@x", &rcpts(&["a@x", "b@x"]), c);
        assert_ne!(a, fingerprint("s@x", &rcpts(&["a@x"]), c));
        assert_ne!(a, fingerprint("s@x", &rcpts(&["a@x", "b@x", "c@x"]), c));
        // Compared exactly: case counts.
        assert_ne!(a, fingerprint("s@x", &rcpts(&["A@x", "b@x"]), c));
        // Framing: moving bytes between recipients is a different set.
        assert_ne!(
            fingerprint("s@x", &rcpts(&["ab", "c"]), c),
            fingerprint("s@x", &rcpts(&["a", "bc"]), c)
        );
    }

    #[test]
    fn reverse_path_matters() {
        let c = b"Subject: x\r\n\r\nbody";
        let r = rcpts(&["a@x"]);
        assert_ne!(fingerprint("s@x", &r, c), fingerprint("S@x", &r, c));
        assert_ne!(fingerprint("s@x", &r, c), fingerprint("", &r, c));
        // Framing between reverse-path and recipients.
        assert_ne!(
            fingerprint("s@x", &rcpts(&["a@x"]), c),
            fingerprint("s@xa@x", &[], c)
        );
    }

    #[test]
    fn plain_content_any_byte_counts() {
        let a = fp("Subject: hello\r\n\r\nbody\r\n");
        assert_ne!(a, fp("Subject:  hello\r\n\r\nbody\r\n"));
        assert_ne!(a, fp("Subject: hello \r\n\r\nbody\r\n"));
        assert_ne!(a, fp("subject: hello\r\n\r\nbody\r\n"));
        assert_ne!(a, fp("Subject: hello\r\n\r\nbody"));
        assert_ne!(a, fp("Subject: hello\r\n\r\nBody\r\n"));
    }

    #[test]
    fn multipart_header_whitespace_counts() {
        let a = fp(&multipart("multipart/mixed", "B1", &[P1, P2]));
        let top = multipart("multipart/mixed", "B1", &[P1, P2])
            .replace("Subject: test", "Subject:  test");
        assert_ne!(a, fp(&top));
        let ctype = multipart("multipart/mixed", "B1", &[P1, P2])
            .replace("mixed; boundary", "mixed;  boundary");
        assert_ne!(a, fp(&ctype));
        let part_hdr = P1.replace("text/plain;", "text/plain; ");
        assert_ne!(a, fp(&multipart("multipart/mixed", "B1", &[&part_hdr, P2])));
    }

    #[test]
    fn boundary_rename_same() {
        let a = fp(&multipart("multipart/mixed", "abc", &[P1, P2, P3]));
        assert_eq!(
            a,
            fp(&multipart("multipart/mixed", "xyz-123456", &[P1, P2, P3]))
        );
        // Quoted or not is part of writing the boundary.
        let unquoted = multipart("multipart/mixed", "abc", &[P1, P2, P3])
            .replace("boundary=\"abc\"", "boundary=abc");
        assert_eq!(a, fp(&unquoted));
        // Folded Content-Type, boundary on the continuation line.
        let folded = |b: &str| {
            multipart("multipart/mixed", b, &[P1, P2])
                .replace("mixed; boundary", "mixed;\r\n\tboundary")
        };
        assert_eq!(fp(&folded("one")), fp(&folded("two")));
        // But the rest of the Content-Type header still counts.
        assert_ne!(a, fp(&multipart("multipart/related", "abc", &[P1, P2, P3])));
    }

    #[test]
    fn boundary_rename_nested_same() {
        let a = fp(&multipart(
            "multipart/mixed",
            "outer1",
            &[&nested("in1", &[P1, P2]), P3],
        ));
        let b = fp(&multipart(
            "multipart/mixed",
            "outer2",
            &[&nested("in2", &[P1, P2]), P3],
        ));
        assert_eq!(a, b);
    }

    #[test]
    fn test_messages_take_the_mime_path() {
        assert_mime(&multipart("multipart/mixed", "B", &[P1, P2, P3, MSG]));
        assert_mime(&multipart(
            "multipart/mixed",
            "B",
            &[&nested("N", &[P1, P2]), P3],
        ));
        assert_mime(&multipart("multipart/mixed", "B", &[P1]));
        let empty_parts = ["Content-Type: text/plain\r\n\r\n", "\r\njust body"];
        assert_mime(&multipart("multipart/mixed", "B", &empty_parts));
        // Non-multipart content never gets parsed.
        assert!(canonical(b"Content-Type: text/plain\r\n\r\n--B\r\n").is_none());
        assert!(canonical(b"Subject: x\r\n\r\nbody").is_none());
    }

    #[test]
    fn reorder_lf_only_same() {
        let a = multipart("multipart/mixed", "B", &[P1, P2, MSG]).replace("\r\n", "\n");
        let b = multipart("multipart/mixed", "C", &[MSG, P1, P2]).replace("\r\n", "\n");
        assert_mime(&a);
        assert_eq!(fp(&a), fp(&b));
        // LF-only and CRLF versions are different bytes.
        assert_ne!(
            fp(&a),
            fp(&multipart("multipart/mixed", "B", &[P1, P2, MSG]))
        );
    }

    #[test]
    fn reorder_two_parts_same() {
        assert_eq!(
            fp(&multipart("multipart/mixed", "B", &[P1, P2])),
            fp(&multipart("multipart/mixed", "B", &[P2, P1]))
        );
    }

    #[test]
    fn reorder_three_parts_same() {
        let a = fp(&multipart("multipart/mixed", "B", &[P1, P2, P3]));
        // The last part moves to the middle and to the front, and back.
        assert_eq!(a, fp(&multipart("multipart/mixed", "B", &[P1, P3, P2])));
        assert_eq!(a, fp(&multipart("multipart/mixed", "B", &[P3, P1, P2])));
        assert_eq!(a, fp(&multipart("multipart/mixed", "C", &[P2, P3, P1])));
        // Different from the plain concatenation of the same bytes.
        assert_ne!(a, fp(&multipart("multipart/mixed", "B", &[P1, P2])));
    }

    #[test]
    fn reorder_parts_ending_in_crlf_or_empty() {
        let ends_crlf = "Content-Type: text/plain\r\n\r\nline\r\n\r\n";
        let empty = "Content-Type: text/plain\r\n\r\n";
        let no_headers = "\r\njust body";
        let a = fp(&multipart(
            "multipart/mixed",
            "B",
            &[ends_crlf, empty, no_headers],
        ));
        assert_eq!(
            a,
            fp(&multipart(
                "multipart/mixed",
                "B",
                &[no_headers, ends_crlf, empty]
            ))
        );
        assert_eq!(
            a,
            fp(&multipart(
                "multipart/mixed",
                "B",
                &[empty, no_headers, ends_crlf]
            ))
        );
    }

    #[test]
    fn reorder_message_rfc822_part_same() {
        let a = fp(&multipart("multipart/mixed", "B", &[P1, MSG, P2]));
        assert_eq!(a, fp(&multipart("multipart/mixed", "B", &[P1, P2, MSG])));
        assert_eq!(a, fp(&multipart("multipart/mixed", "B", &[MSG, P2, P1])));
        let changed = MSG.replace("inner body", "inner bodY");
        assert_ne!(
            a,
            fp(&multipart("multipart/mixed", "B", &[P1, &changed, P2]))
        );
    }

    #[test]
    fn reorder_nested_same() {
        let n12 = nested("N", &[P1, P2]);
        let n21 = nested("N", &[P2, P1]);
        let a = fp(&multipart("multipart/mixed", "B", &[&n12, P3]));
        // Inside the nested part.
        assert_eq!(a, fp(&multipart("multipart/mixed", "B", &[&n21, P3])));
        // The nested part itself moves last, with its children reordered too.
        assert_eq!(a, fp(&multipart("multipart/mixed", "B", &[P3, &n21])));
        // Three levels, reordered at every level.
        let deep_a = nested("D", &[P1, &nested("E", &[P2, P3])]);
        let deep_b = nested("D2", &[&nested("E2", &[P3, P2]), P1]);
        assert_eq!(
            fp(&multipart("multipart/mixed", "B", &[&deep_a, MSG])),
            fp(&multipart("multipart/mixed", "C", &[MSG, &deep_b]))
        );
        // A part moved from the nested level to the top level is different.
        assert_ne!(
            a,
            fp(&multipart(
                "multipart/mixed",
                "B",
                &[&nested("N", &[P1]), P2, P3]
            ))
        );
    }

    #[test]
    fn part_content_byte_change_differs() {
        let a = fp(&multipart("multipart/mixed", "B", &[P1, P2, P3]));
        let p2 = P2.replace("Hello", "Hellp");
        assert_ne!(a, fp(&multipart("multipart/mixed", "B", &[P1, &p2, P3])));
        let p3 = P3.replace("AAAA", "AAAB");
        assert_ne!(a, fp(&multipart("multipart/mixed", "B", &[P1, P2, &p3])));
        // A trailing CRLF added to the body of a part.
        let p1 = format!("{P1}\r\n");
        assert_ne!(a, fp(&multipart("multipart/mixed", "B", &[&p1, P2, P3])));
    }

    #[test]
    fn part_header_change_differs() {
        let a = fp(&multipart("multipart/mixed", "B", &[P1, P2, P3]));
        let p1 = P1.replace("charset=utf-8", "charset=UTF-8");
        assert_ne!(a, fp(&multipart("multipart/mixed", "B", &[&p1, P2, P3])));
        let p2 = P2.replace("Content-Type: text/html", "Content-Type:  text/html");
        assert_ne!(a, fp(&multipart("multipart/mixed", "B", &[P1, &p2, P3])));
    }

    #[test]
    fn filename_change_differs() {
        let a = fp(&multipart("multipart/mixed", "B", &[P1, P3]));
        let p3 = P3.replace("filename=\"a.pdf\"", "filename=\"b.pdf\"");
        assert_ne!(a, fp(&multipart("multipart/mixed", "B", &[P1, &p3])));
    }

    #[test]
    fn preamble_epilogue_and_padding_count() {
        let m = multipart("multipart/mixed", "B", &[P1, P2]);
        let a = fp(&m);
        assert_ne!(a, fp(&m.replace("This is a MIME", "This is a mime")));
        assert_ne!(a, fp(&m.replace("epilogue", "epilogue2")));
        // Transport padding after a delimiter.
        assert_ne!(a, fp(&m.replacen("--B\r\n", "--B \r\n", 2)));
    }

    #[test]
    fn other_boundary_like_parameters_count() {
        // Only the value of the boundary mail-parser uses is left out.
        let a = multipart("multipart/mixed", "B", &[P1, P2]);
        let b = a.replace("boundary=\"B\"", "boundary=\"B\"; x-boundary=\"one\"");
        let c = a.replace("boundary=\"B\"", "boundary=\"B\"; x-boundary=\"two\"");
        assert_ne!(fp(&b), fp(&c));
        let d = a.replace("boundary=\"B\"", "boundary=\"B\"; name=\";boundary=one\"");
        let e = a.replace("boundary=\"B\"", "boundary=\"B\"; name=\";boundary=two\"");
        assert_ne!(fp(&d), fp(&e));
    }

    #[test]
    fn multipart_without_boundary_hashed_raw() {
        // Declared multipart without a boundary: hashed raw, still stable.
        let m = "Content-Type: multipart/mixed\r\n\r\n--B\r\n\r\nx\r\n--B--\r\n";
        assert_eq!(fp(m), fp(m));
        assert_ne!(fp(m), fp(&m.replace("--B", "--C")));
    }

    #[test]
    fn malformed_multipart_never_panics() {
        let samples = [
            "Content-Type: multipart/mixed; boundary=B\r\n\r\n",
            "Content-Type: multipart/mixed; boundary=B\r\n\r\n--B",
            "Content-Type: multipart/mixed; boundary=B\r\n\r\n--B\r\n",
            "Content-Type: multipart/mixed; boundary=B\r\n\r\n--B--",
            "Content-Type: multipart/mixed; boundary=B\r\n\r\n--B\r\nContent-Type: multipart/mixed; boundary=C\r\n\r\n--C\r\n--B--",
            "Content-Type: multipart/mixed; boundary=B\r\n\r\n--B\r\nContent-Type: message/rfc822\r\n\r\n--B--",
            "Content-Type: multipart/mixed; boundary=\"\"\r\n\r\n----\r\n",
            "Content-Type: multipart/mixed; boundary=\"B\r\n\r\n--B\r\n",
            "Content-Type: multipart/x; boundary=B(\r\n\r\n",
            "Content-Type: multipart/",
            "content-type:multipart/mixed;boundary=-\r\n\r\n---\r\n\r\n-----\r\n",
        ];
        for s in samples {
            let _ = fp(s);
        }
    }

    #[test]
    fn mail_parser_debug_assert_is_contained() {
        // Found by `arbitrary_multipart_bytes_never_panic`: trips
        // `debug_assert!(false, "Invalid part ID, could not find multipart.")`
        // in mail-parser 0.11.9 when debug assertions are on.
        let m = "Content-Type: multipart/mixed; boundary=B\r\n\r\n\
                 --BContent-Type: message/rfc822\r\n--C\r\n\r\n\
                 Content-Type: message/rfc822\r\n\r\n\r\n--B--";
        assert_eq!(fp(m), fp(m));
    }

    #[test]
    fn deep_nesting_falls_back_without_overflow() {
        let mut m = String::new();
        for i in 0..200 {
            m.push_str(&format!(
                "Content-Type: multipart/mixed; boundary=b{i}\r\n\r\n--b{i}\r\n"
            ));
        }
        m.push_str("\r\nleaf\r\n");
        for i in (0..200).rev() {
            m.push_str(&format!("--b{i}--\r\n"));
        }
        assert!(canonical(m.as_bytes()).is_none());
        assert_eq!(fp(&m), fp(&m));
    }

    // ---- volatile top-level headers ----

    fn fp_with(content: &str, volatile: &VolatileHeaders) -> Fingerprint {
        super::fingerprint(
            "a@example.com",
            &rcpts(&["b@example.com"]),
            content.as_bytes(),
            volatile,
        )
    }

    /// A plain message as a library would build it.
    fn built(date: &str, id: &str) -> String {
        format!(
            "From: a@example.com\r\nDate: {date}\r\nSubject: report\r\n\
             Message-ID: {id}\r\nX-Bird-Idempotency-Key: k1\r\n\r\nbody\r\n"
        )
    }

    const DATE1: &str = "Tue, 01 Dec 2026 02:55:15 +0000";
    const DATE2: &str = "Tue, 01 Dec 2026 02:55:17 -0000";

    #[test]
    fn volatile_values_do_not_count() {
        let a = fp(&built(DATE1, "<1.2@host>"));
        assert_eq!(a, fp(&built(DATE2, "<3.4@other-host>")));
        // Any value, the empty one and a folded one included.
        assert_eq!(a, fp(&built("", "<x>")));
        assert_eq!(a, fp(&built("Tue, 01 Dec 2026\r\n 02:55:15 +0000", "<x>")));
        assert_eq!(a, fp(&built(DATE1, "\r\n\t<folded@host>")));
        // The header name is compared without case.
        let v = VolatileHeaders::new(["date", "MESSAGE-id"]);
        assert_eq!(
            fp_with(&built(DATE1, "<a>"), &v),
            fp_with(&built(DATE2, "<b>"), &v)
        );
    }

    #[test]
    fn strict_when_no_volatile_headers() {
        let strict = VolatileHeaders::none();
        assert_ne!(
            fp_with(&built(DATE1, "<a>"), &strict),
            fp_with(&built(DATE2, "<a>"), &strict)
        );
        assert_ne!(
            fp_with(&built(DATE1, "<a>"), &strict),
            fp_with(&built(DATE1, "<b>"), &strict)
        );
        // Only the configured names are volatile.
        let mailer = VolatileHeaders::new(["X-Mailer"]);
        let m = |mailer: &str, date: &str| format!("X-Mailer: {mailer}\r\nDate: {date}\r\n\r\nb");
        assert_eq!(
            fp_with(&m("a 1", DATE1), &mailer),
            fp_with(&m("b 2", DATE1), &mailer)
        );
        assert_ne!(
            fp_with(&m("a 1", DATE1), &mailer),
            fp_with(&m("a 1", DATE2), &mailer)
        );
    }

    #[test]
    fn messages_without_volatile_fields_hash_as_before() {
        // Stored fingerprints stay valid: no volatile field, no change.
        for m in [
            "Subject: x\r\n\r\nbody".to_string(),
            multipart("multipart/mixed", "B", &[P1, P2, MSG]),
        ] {
            assert_eq!(fp(&m), fp_with(&m, &VolatileHeaders::none()));
        }
        // With one, the content takes another tag than its strict hash.
        let m = built(DATE1, "<a>");
        assert_ne!(fp(&m), fp_with(&m, &VolatileHeaders::none()));
    }

    #[test]
    fn volatile_names_and_positions_count() {
        let a = fp(&built(DATE1, "<a>"));
        // Absent.
        assert_ne!(
            a,
            fp(&built(DATE1, "<a>").replace(&format!("Date: {DATE1}\r\n"), ""))
        );
        // Moved after Subject.
        let moved = built(DATE1, "<a>").replace(
            &format!("Date: {DATE1}\r\nSubject: report\r\n"),
            &format!("Subject: report\r\nDate: {DATE1}\r\n"),
        );
        assert_ne!(a, fp(&moved));
        // The name as written, and space before the colon.
        assert_ne!(a, fp(&built(DATE1, "<a>").replace("Date:", "DATE:")));
        assert_ne!(a, fp(&built(DATE1, "<a>").replace("Date:", "Date :")));
        // Twice.
        let twice = built(DATE1, "<a>").replace("Subject:", &format!("Date: {DATE1}\r\nSubject:"));
        assert_ne!(a, fp(&twice));
        // The line break that ends the field.
        assert_ne!(
            a,
            fp(&built(DATE1, "<a>").replacen("\r\nSubject", "\nSubject", 1))
        );
        // A value cannot swallow the next field.
        let other = "From: a@example.com\r\nDate: x\r\nSubject: other\r\n\
                     Message-ID: <a>\r\nX-Bird-Idempotency-Key: k1\r\n\r\nbody\r\n";
        assert_ne!(a, fp(other));
    }

    #[test]
    fn other_headers_and_body_stay_strict() {
        let a = fp(&built(DATE1, "<a>"));
        let b = built(DATE2, "<b>");
        assert_ne!(a, fp(&b.replace("Subject: report", "Subject:  report")));
        assert_ne!(a, fp(&b.replace("Subject: report", "Subject: report ")));
        assert_ne!(a, fp(&b.replace("From: a@", "From:  a@")));
        assert_ne!(a, fp(&b.replace("body", "bodY")));
        // A Date: line in the body is body.
        let with_body = |d: &str| format!("Date: {DATE1}\r\n\r\nDate: {d}\r\n");
        assert_ne!(fp(&with_body("1")), fp(&with_body("2")));
        // Without a blank line everything is header section.
        assert_eq!(fp("Subject: x\r\nDate: 1"), fp("Subject: x\r\nDate: 2"));
    }

    #[test]
    fn multipart_top_level_volatile_part_headers_strict() {
        let top = |date: &str, id: &str, boundary: &str, parts: &[&str]| {
            multipart("multipart/mixed", boundary, parts).replace(
                "Subject: test\r\n",
                &format!("Subject: test\r\nDate: {date}\r\nMessage-ID: {id}\r\n"),
            )
        };
        let a = top(DATE1, "<a>", "B", &[P1, P2]);
        assert_mime(&a);
        let af = fp(&a);
        // Values, boundary and order together.
        assert_eq!(af, fp(&top(DATE2, "<b>", "C", &[P2, P1])));
        // Top-level names and the rest of the top-level header still count.
        assert_ne!(af, fp(&a.replace("Date:", "date:")));
        assert_ne!(
            af,
            fp(&top(DATE2, "<b>", "B", &[P1, P2]).replace("Subject: test", "Subject:  test"))
        );
        // Part headers are strict, Date and Message-ID included.
        let part = |date: &str| format!("Date: {date}\r\nContent-Type: text/plain\r\n\r\nx");
        assert_ne!(
            fp(&top(DATE1, "<a>", "B", &[&part(DATE1), P2])),
            fp(&top(DATE1, "<a>", "B", &[&part(DATE2), P2]))
        );
        // So are nested parts and attached messages.
        let inner = |id: &str| nested("N", &[&format!("Message-ID: {id}\r\n\r\nx"), P2]);
        assert_ne!(
            fp(&top(DATE1, "<a>", "B", &[&inner("<1>"), P1])),
            fp(&top(DATE1, "<a>", "B", &[&inner("<2>"), P1]))
        );
        let attached =
            |d: &str| format!("Content-Type: message/rfc822\r\n\r\nDate: {d}\r\n\r\ninner");
        assert_ne!(
            fp(&top(DATE1, "<a>", "B", &[&attached(DATE1), P1])),
            fp(&top(DATE1, "<a>", "B", &[&attached(DATE2), P1]))
        );
        // Folded top-level value.
        assert_eq!(af, fp(&top("Tue, 01 Dec\r\n 2026", "<a>", "B", &[P1, P2])));
    }

    #[test]
    fn volatile_content_type_is_cut_whole() {
        let v = VolatileHeaders::new(["Content-Type"]);
        let a = multipart("multipart/mixed", "B", &[P1, P2]);
        let b = multipart("multipart/mixed", "C", &[P2, P1]);
        assert_eq!(fp_with(&a, &v), fp_with(&b, &v));
        assert_ne!(
            fp_with(&a, &v),
            fp_with(&a.replace("Subject: test", "Subject: tesT"), &v)
        );
    }

    // ---- transit headers (keyed messages) ----

    /// The keyed identity under the daemon's defaults.
    fn keyed(content: &str) -> Fingerprint {
        let limits = MimeLimits::default();
        let within = mime_limits::check(content.as_bytes(), &limits).expect("within limits");
        keyed_fingerprint(
            "a@example.com",
            &rcpts(&["b@example.com"]),
            &within,
            &limits,
            &VolatileHeaders::default(),
            &TransitHeaders::default(),
        )
    }

    fn received(id: &str) -> String {
        format!(
            "Received: from app.example.com (localhost [127.0.0.1])\r\n\
             \tby mx.example.com (Postfix) with ESMTP id {id}\r\n\
             \tfor <b@example.com>; Tue, 01 Dec 2026 02:55:1{} +0000\r\n",
            id.len() % 10
        )
    }

    const DKIM: &str = "DKIM-Signature: v=1; a=rsa-sha256; d=example.com; s=s1;\r\n\tb=abc\r\n";

    #[test]
    fn transit_fields_do_not_count_for_a_keyed_message() {
        let author = built(DATE1, "<a@host>");
        let a = keyed(&author);
        // Added by a hop, one or more, at the top.
        assert_eq!(a, keyed(&format!("{}{author}", received("4Q1"))));
        assert_eq!(
            a,
            keyed(&format!(
                "{}{}{DKIM}{author}",
                received("4Q2AB"),
                received("X")
            ))
        );
        // Reordered, and with another retry's Date and Message-ID.
        assert_eq!(
            keyed(&format!(
                "{}{DKIM}{}{author}",
                received("1"),
                received("22")
            )),
            keyed(&format!(
                "{DKIM}{}{}{}",
                received("333"),
                received("4444"),
                built(DATE2, "<b@other>")
            ))
        );
        // Between the author's fields too, and every default name.
        let everywhere = author.replace(
            "Subject:",
            "Return-Path: <a@example.com>\r\nX-Received: by 2002:a05\r\n\
             Delivered-To: b@example.com\r\nX-Original-To: b@example.com\r\n\
             ARC-Seal: i=1; cv=none\r\nARC-Message-Signature: i=1\r\n\
             ARC-Authentication-Results: i=1\r\nAuthentication-Results: mx; spf=pass\r\n\
             Subject:",
        );
        assert_eq!(a, keyed(&everywhere));
        // A message without any hashes as the plain fingerprint (entries
        // stored before the rule stay valid).
        assert_eq!(a, fp(&author));
    }

    #[test]
    fn the_authors_fields_still_count_for_a_keyed_message() {
        let author = built(DATE1, "<a@host>");
        let a = keyed(&format!("{}{author}", received("1")));
        let other = |m: &str| keyed(&format!("{}{m}", received("2")));
        assert_ne!(
            a,
            other(&author.replace("Subject: report", "Subject: Report"))
        );
        assert_ne!(a, other(&author.replace("body", "bodY")));
        // A trace-like field in the body, or in a part, is content.
        let body = |r: &str| keyed(&format!("{author}{}", received(r)));
        assert_ne!(body("1"), body("22"));
        let part = |r: &str| {
            multipart(
                "multipart/mixed",
                "B",
                &[&format!("{}\r\nx", received(r)), P2],
            )
        };
        assert_mime(&part("1"));
        assert_ne!(keyed(&part("1")), keyed(&part("22")));
        // ... while the top-level ones of a multipart message do not count.
        let top = |r: &str, b: &str| {
            format!(
                "{}{}",
                received(r),
                multipart("multipart/mixed", b, &[P1, P2])
            )
        };
        assert_eq!(keyed(&top("1", "B")), keyed(&top("22", "C")));
    }

    #[test]
    fn transit_fields_count_in_the_plain_fingerprint() {
        // Unkeyed messages are never compared, and a configured empty list
        // keeps them counting: the plain fingerprint sees every field.
        let author = built(DATE1, "<a@host>");
        assert_ne!(fp(&author), fp(&format!("{}{author}", received("1"))));
        let limits = MimeLimits::default();
        let m = format!("{}{author}", received("1"));
        let within = mime_limits::check(m.as_bytes(), &limits).expect("within limits");
        let v = VolatileHeaders::default();
        let r = rcpts(&["b@example.com"]);
        assert_eq!(
            keyed_fingerprint(
                "a@example.com",
                &r,
                &within,
                &limits,
                &v,
                &TransitHeaders::none()
            ),
            fp(&m)
        );
    }

    // ---- property tests ----

    /// Safe content: no uppercase letters, so `--` + an uppercase boundary
    /// can never appear inside a part.
    const SAFE: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789 .,-";

    #[derive(Debug, Clone)]
    struct Part {
        header: String,
        body: String,
    }

    impl Part {
        fn render(&self) -> String {
            format!(
                "Content-Type: text/plain\r\nX-Part:{}\r\n\r\n{}",
                self.header, self.body
            )
        }
    }

    fn safe_string(min: usize, max: usize) -> impl Strategy<Value = String> {
        proptest::collection::vec(
            prop_oneof![
                8 => proptest::sample::select(SAFE).prop_map(|b| (b as char).to_string()),
                1 => Just("\r\n".to_string()),
            ],
            min..max,
        )
        .prop_map(|v| v.concat())
    }

    fn part() -> impl Strategy<Value = Part> {
        ("[a-z0-9 ]{0,12}", safe_string(1, 40)).prop_map(|(header, body)| Part { header, body })
    }

    fn render(boundary: &str, parts: &[Part]) -> String {
        let rendered: Vec<String> = parts.iter().map(Part::render).collect();
        let refs: Vec<&str> = rendered.iter().map(String::as_str).collect();
        multipart("multipart/mixed", boundary, &refs)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn boundary_and_order_do_not_count(
            parts in proptest::collection::vec(part(), 1..5),
            perm_seed in proptest::collection::vec(any::<u8>(), 5),
            b1 in "[A-Z]{1,20}",
            b2 in "[A-Z0-9]{0,5}[A-Z]{1,20}",
        ) {
            let mut shuffled = parts.clone();
            // Deterministic permutation derived from the seed.
            let mut keyed: Vec<(u8, Part)> = perm_seed.into_iter().zip(shuffled.drain(..)).collect();
            keyed.sort_by_key(|(k, _)| *k);
            let shuffled: Vec<Part> = keyed.into_iter().map(|(_, p)| p).collect();
            let original = render(&b1, &parts);
            prop_assert!(canonical(original.as_bytes()).is_some());
            prop_assert_eq!(fp(&original), fp(&render(&b2, &shuffled)));
        }

        #[test]
        fn shuffle_with_prop_shuffle(
            (parts, shuffled) in proptest::collection::vec(part(), 2..5)
                .prop_flat_map(|p| (Just(p.clone()), Just(p).prop_shuffle())),
            b in "[A-Z]{1,20}",
        ) {
            prop_assert_eq!(fp(&render(&b, &parts)), fp(&render(&b, &shuffled)));
        }

        #[test]
        fn one_body_byte_counts(
            parts in proptest::collection::vec(part(), 1..5),
            which in any::<prop::sample::Index>(),
            pos in any::<prop::sample::Index>(),
            with in proptest::sample::select(SAFE),
            b in "[A-Z]{1,20}",
        ) {
            let mut changed = parts.clone();
            let p = &mut changed[which.index(parts.len())];
            let mut bytes = p.body.clone().into_bytes();
            let i = pos.index(bytes.len());
            prop_assume!(bytes[i] != with);
            bytes[i] = with;
            p.body = String::from_utf8(bytes).expect("ascii");
            prop_assert_ne!(fp(&render(&b, &parts)), fp(&render(&b, &changed)));
        }

        #[test]
        fn one_header_space_counts(
            parts in proptest::collection::vec(part(), 1..5),
            which in any::<prop::sample::Index>(),
            b in "[A-Z]{1,20}",
        ) {
            let mut changed = parts.clone();
            changed[which.index(parts.len())].header.insert(0, ' ');
            prop_assert_ne!(fp(&render(&b, &parts)), fp(&render(&b, &changed)));
        }

        #[test]
        fn only_volatile_values_are_left_out(
            fields in proptest::collection::vec(
                (proptest::sample::select(&["Date", "Message-ID", "Subject", "From", "X-Custom"][..]),
                 "[ -~]{0,20}", "[ -~]{0,20}", any::<bool>()),
                1..8,
            ),
            which in any::<prop::sample::Index>(),
        ) {
            let render = |second: bool| {
                let mut m = String::new();
                for (name, v1, v2, fold) in &fields {
                    let v = if second && ["Date", "Message-ID"].contains(name) { v2 } else { v1 };
                    let fold = if *fold { "\r\n " } else { "" };
                    m.push_str(&format!("{name}: {v}{fold}x\r\n"));
                }
                m.push_str("\r\nbody\r\n");
                m
            };
            let first = render(false);
            prop_assert_eq!(fp(&first), fp(&render(true)));
            // A space added to any field's value: equal exactly when volatile.
            let (name, v1, _, fold) = &fields[which.index(fields.len())];
            let fold = if *fold { "\r\n " } else { "" };
            let line = format!("{name}: {v1}{fold}x\r\n");
            let changed = first.replacen(&line, &format!("{name}:  {v1}{fold}x\r\n"), 1);
            if ["Date", "Message-ID"].contains(name) {
                prop_assert_eq!(fp(&first), fp(&changed));
            } else {
                prop_assert_ne!(fp(&first), fp(&changed));
            }
        }

        #[test]
        fn arbitrary_multipart_bytes_never_panic(
            tail in proptest::collection::vec(
                prop_oneof![
                    Just(b"--B".to_vec()), Just(b"--B--".to_vec()), Just(b"\r\n".to_vec()),
                    Just(b"Content-Type: multipart/mixed; boundary=C\r\n".to_vec()),
                    Just(b"Content-Type: message/rfc822\r\n".to_vec()),
                    Just(b"--C".to_vec()),
                    proptest::collection::vec(any::<u8>(), 0..8),
                ],
                0..40,
            )
        ) {
            let mut m = b"Content-Type: multipart/mixed; boundary=B\r\n\r\n".to_vec();
            m.extend(tail.concat());
            let _ = fingerprint("a", &[], &m);
        }
    }
}
