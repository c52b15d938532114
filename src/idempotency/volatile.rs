//! Top-level headers whose values the fingerprint leaves out (SPEC section 3).
//!
//! Mail libraries stamp `Date:` and `Message-ID:` afresh every time a message
//! is built, so an application that rebuilds its message for a retry sends
//! different bytes under the same key. Only the *value* of such a field stops
//! counting: its name as written, its position among the other fields, the
//! colon and the line break that ends the field still count, and so does
//! every other byte of the message. The value is everything after the colon
//! up to that line break, folded continuation lines included (the span that
//! [`field_spans`] gives). Only the top-level header section is concerned,
//! never the headers of a MIME part or of an attached message.

use std::ops::Range;

use crate::message::headers::field_spans;

/// The default `[idempotency] volatile_headers`.
pub const DEFAULT_VOLATILE_HEADERS: [&str; 2] = ["Date", "Message-ID"];

/// Header names (compared ASCII case-insensitively) whose values do not
/// count in the fingerprint. Empty: strict byte identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolatileHeaders {
    names: Vec<String>,
}

impl Default for VolatileHeaders {
    fn default() -> Self {
        Self::new(DEFAULT_VOLATILE_HEADERS)
    }
}

impl VolatileHeaders {
    pub fn new<S: Into<String>>(names: impl IntoIterator<Item = S>) -> Self {
        Self {
            names: names.into_iter().map(Into::into).collect(),
        }
    }

    /// Strict byte identity: every header value counts.
    pub const fn none() -> Self {
        Self { names: Vec::new() }
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    pub fn contains(&self, name: &[u8]) -> bool {
        self.names
            .iter()
            .any(|n| n.as_bytes().eq_ignore_ascii_case(name))
    }

    /// The value spans (positions in `header`) of the volatile fields in the
    /// header block at the start of `header`, in order.
    pub(crate) fn value_spans(&self, header: &[u8]) -> Vec<Range<usize>> {
        if self.is_empty() {
            return Vec::new();
        }
        field_spans(header)
            .filter(|f| header.get(f.name.clone()).is_some_and(|n| self.contains(n)))
            .map(|f| f.value)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_cover_folded_values_case_insensitively() {
        let m = b"date: Mon\r\n 1 Dec\r\nSubject: x\r\nMESSAGE-ID:<a@b>\r\n\r\nDate: body\r\n";
        let v = VolatileHeaders::default();
        let spans: Vec<&[u8]> = v.value_spans(m).into_iter().map(|r| &m[r]).collect();
        assert_eq!(spans, vec![&b" Mon\r\n 1 Dec"[..], &b"<a@b>"[..]]);
        assert!(VolatileHeaders::none().value_spans(m).is_empty());
    }
}
