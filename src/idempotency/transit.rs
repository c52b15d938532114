//! Trace and transit header fields, which the fingerprint of a keyed message
//! leaves out entirely (SPEC section 3).
//!
//! `Received:`, `DKIM-Signature:`, `Authentication-Results:` and the like
//! are added by the hops a message passes, not by its author: an
//! application that retries through a local Postfix reaches us with a fresh
//! `Received:` line (another queue id, another time) each time, and a retry
//! that takes another path may carry more, fewer or other such fields. So,
//! unlike a volatile header (whose value alone stops counting), a transit
//! field does not count at all: name, value, count and position. The
//! fingerprint is taken of the message with those fields cut out of the
//! top-level header section, exactly as if they had never been there. Part
//! headers and attached messages are the author's and stay strict.

use std::borrow::Cow;
use std::ops::Range;

use crate::message::headers::field_spans;

/// The default `[idempotency] transit_headers`.
pub const DEFAULT_TRANSIT_HEADERS: [&str; 8] = [
    "Received",
    "Return-Path",
    "X-Received",
    "Delivered-To",
    "X-Original-To",
    "DKIM-Signature",
    "ARC-*",
    "Authentication-Results",
];

/// Header names (compared ASCII case-insensitively; a trailing `*` matches
/// every name that starts with what precedes it) of the fields left out of
/// a keyed message's identity. Empty: every field counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransitHeaders {
    names: Vec<String>,
}

impl Default for TransitHeaders {
    fn default() -> Self {
        Self::new(DEFAULT_TRANSIT_HEADERS)
    }
}

impl TransitHeaders {
    pub fn new<S: Into<String>>(names: impl IntoIterator<Item = S>) -> Self {
        Self {
            names: names.into_iter().map(Into::into).collect(),
        }
    }

    /// Every field counts (the rule before transit headers existed).
    pub const fn none() -> Self {
        Self { names: Vec::new() }
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    pub fn contains(&self, name: &[u8]) -> bool {
        self.names.iter().any(|pattern| matches(pattern, name))
    }

    /// Whether the top-level header section of `content` has a transit field.
    pub fn occur_in(&self, content: &[u8]) -> bool {
        !self.field_spans(content).is_empty()
    }

    /// `content` with every transit field of its top-level header section
    /// removed, each with its folded lines and the line break that ends it.
    /// Borrowed (no copy) when there is none.
    pub fn strip<'a>(&self, content: &'a [u8]) -> Cow<'a, [u8]> {
        let cuts = self.field_spans(content);
        if cuts.is_empty() {
            return Cow::Borrowed(content);
        }
        let removed: usize = cuts.iter().map(Range::len).sum();
        let mut kept = Vec::with_capacity(content.len().saturating_sub(removed));
        let mut pos = 0;
        for cut in cuts {
            kept.extend_from_slice(content.get(pos..cut.start).unwrap_or_default());
            pos = cut.end;
        }
        kept.extend_from_slice(content.get(pos..).unwrap_or_default());
        Cow::Owned(kept)
    }

    /// The whole extent (name to line break included) of each transit field
    /// in the header block at the start of `content`, in order.
    fn field_spans(&self, content: &[u8]) -> Vec<Range<usize>> {
        if self.is_empty() {
            return Vec::new();
        }
        field_spans(content)
            .filter(|f| {
                content
                    .get(f.name.clone())
                    .is_some_and(|n| self.contains(n))
            })
            .map(|f| f.name.start..line_end(content, f.value.end))
            .collect()
    }
}

/// Whether `name` is matched by `pattern` (case-insensitive; a trailing `*`
/// is a prefix match).
fn matches(pattern: &str, name: &[u8]) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name
            .get(..prefix.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(prefix.as_bytes())),
        None => pattern.as_bytes().eq_ignore_ascii_case(name),
    }
}

/// Just past the line break after `value_end` (a field's value ends where
/// its last line's `\r\n` or `\n` starts), or the end of `buf`.
fn line_end(buf: &[u8], value_end: usize) -> usize {
    buf.get(value_end..)
        .and_then(|rest| rest.iter().position(|&b| b == b'\n'))
        .map_or(buf.len(), |i| value_end + i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stripped(m: &str) -> String {
        String::from_utf8_lossy(&TransitHeaders::default().strip(m.as_bytes())).into_owned()
    }

    #[test]
    fn removes_whole_fields_folded_lines_included() {
        let m = "Received: from a\r\n\tby b; Tue, 1 Dec 2026\r\nSubject: x\r\n\
                 dkim-signature: v=1;\r\n b=abc\r\nARC-Seal: i=1\r\n\
                 arc-message-signature: i=1\r\nFrom: a@b\r\n\r\nReceived: body\r\n";
        assert_eq!(
            stripped(m),
            "Subject: x\r\nFrom: a@b\r\n\r\nReceived: body\r\n"
        );
        // Bare LF line ends and a last field without a line break.
        assert_eq!(
            stripped("Subject: x\nReturn-Path: <a>\n\nb"),
            "Subject: x\n\nb"
        );
        assert_eq!(stripped("Subject: x\r\nX-Received: y"), "Subject: x\r\n");
    }

    #[test]
    fn nothing_to_strip_borrows() {
        let m = b"Subject: x\r\nX-Receivedx: y\r\nARC: z\r\n\r\nbody";
        assert!(matches!(
            TransitHeaders::default().strip(m),
            Cow::Borrowed(_)
        ));
        assert!(!TransitHeaders::default().occur_in(m));
        assert!(TransitHeaders::default().occur_in(b"Subject: x\r\nReceived: y\r\n"));
        let none = TransitHeaders::none();
        assert!(matches!(
            none.strip(b"Received: x\r\n\r\n"),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn prefix_and_case() {
        let t = TransitHeaders::new(["X-Trace-*", "received"]);
        assert!(t.contains(b"x-trace-id"));
        assert!(t.contains(b"X-TRACE-"));
        assert!(!t.contains(b"X-Trace"));
        assert!(t.contains(b"RECEIVED"));
        assert!(!t.contains(b"Received-SPF"));
    }
}
