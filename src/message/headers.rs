//! Ground floor: a scanner for a message's header section (or a MIME
//! part's header block): where it ends ([`header_section_len`]) and where
//! each well-formed field's name and value lie ([`field_spans`],
//! [`top_level_headers`]). Used by the key extraction, the fingerprint's
//! volatile and transit headers, the `From:` check, the relayed copy and
//! DSNs. Imports no crate module.
//!
//! Hand-written rather than mail-parser: it runs on every accepted message,
//! so it must be cheap (it only walks the header section and never
//! allocates) and it must be safe on arbitrary bytes (no panics: every
//! access goes through `get` or iterators).
//!
//! Line endings: SMTP content should use CRLF, but a bare LF is accepted as a
//! line ending too, so a message with LF-only line endings still has its
//! header section end at the first empty line instead of running into the body.

use std::ops::Range;

/// Iterates the top-level header fields: (name, raw value bytes including
/// folding) — used by key extraction and by the fingerprint to find
/// Content-Type.
///
/// The value is everything after the colon up to the line break that ends the
/// field (folding line breaks inside are kept, nothing is trimmed). Lines that
/// are not well-formed fields (no colon, empty name or a name with spaces or
/// control characters, a continuation line with no field before it) are
/// skipped. Iteration stops at the first empty line.
pub fn top_level_headers(message: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    field_spans(message).filter_map(move |f| Some((message.get(f.name)?, message.get(f.value)?)))
}

/// Byte offset where the body starts (after the blank line), or
/// `message.len()` if there is no blank line.
/// How many `Received:` fields the top-level header has: the hops the
/// message has made (RFC 5321 6.3 counts them to detect loops).
pub fn received_count(message: &[u8]) -> usize {
    top_level_headers(message)
        .filter(|(name, _)| name.eq_ignore_ascii_case(b"Received"))
        .count()
}

pub fn header_section_len(message: &[u8]) -> usize {
    let mut pos = 0;
    while let Some(line) = next_line(message, pos) {
        if line.content.is_empty() {
            return line.next;
        }
        pos = line.next;
    }
    message.len()
}

/// Position of one header field inside the scanned buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FieldSpan {
    /// The field name (trailing SP/HT before the colon excluded).
    pub(crate) name: Range<usize>,
    /// After the colon up to, excluding, the line break that ends the field.
    pub(crate) value: Range<usize>,
}

/// Header fields of the header block at the start of `buf` (a whole message,
/// or a MIME part's header bytes), as positions into `buf`.
pub(crate) fn field_spans(buf: &[u8]) -> FieldSpans<'_> {
    FieldSpans {
        buf,
        pos: 0,
        done: false,
    }
}

pub(crate) struct FieldSpans<'a> {
    buf: &'a [u8],
    /// Start of the next unread line.
    pos: usize,
    done: bool,
}

impl Iterator for FieldSpans<'_> {
    type Item = FieldSpan;

    fn next(&mut self) -> Option<FieldSpan> {
        while !self.done {
            let Some(line) = next_line(self.buf, self.pos) else {
                self.done = true;
                break;
            };
            self.pos = line.next;
            if line.content.is_empty() {
                // The empty line that ends the header section.
                self.done = true;
                break;
            }
            if is_wsp(self.buf.get(line.content.start)) {
                // Continuation of a line that was not a valid field.
                continue;
            }
            let Some((name, colon)) = field_name(self.buf, &line.content) else {
                continue;
            };
            let mut value_end = line.content.end;
            // Continuation lines start with SP/HT; they can never be the empty
            // terminating line, so this agrees with `header_section_len`.
            while is_wsp(self.buf.get(self.pos)) {
                let Some(cont) = next_line(self.buf, self.pos) else {
                    break;
                };
                value_end = cont.content.end;
                self.pos = cont.next;
            }
            return Some(FieldSpan {
                name,
                value: colon + 1..value_end,
            });
        }
        None
    }
}

struct Line {
    /// The line without its terminating "\n" or "\r\n".
    content: Range<usize>,
    /// Start of the following line (or `buf.len()`).
    next: usize,
}

/// The line starting at `pos`, or `None` at the end of `buf`.
fn next_line(buf: &[u8], pos: usize) -> Option<Line> {
    let rest = buf.get(pos..).filter(|r| !r.is_empty())?;
    let (len, next) = match rest.iter().position(|&b| b == b'\n') {
        Some(i) => (i, pos + i + 1),
        None => (rest.len(), buf.len()),
    };
    let line = rest.get(..len).unwrap_or_default();
    let len = if line.last() == Some(&b'\r') {
        len - 1
    } else {
        len
    };
    Some(Line {
        content: pos..pos + len,
        next,
    })
}

/// Name range and colon position of a field line, if the line is a
/// well-formed field (RFC 5322 printable ASCII name; obsolete whitespace
/// before the colon tolerated).
fn field_name(buf: &[u8], content: &Range<usize>) -> Option<(Range<usize>, usize)> {
    let line = buf.get(content.clone())?;
    let colon = line.iter().position(|&b| b == b':')?;
    let name = line.get(..colon)?;
    let name_len = name.len() - name.iter().rev().take_while(|&&b| is_wsp(Some(&b))).count();
    let name = name.get(..name_len)?;
    if name.is_empty() || !name.iter().all(|&b| (0x21..=0x7e).contains(&b)) {
        return None;
    }
    Some((
        content.start..content.start + name_len,
        content.start + colon,
    ))
}

fn is_wsp(b: Option<&u8>) -> bool {
    matches!(b, Some(b' ' | b'\t'))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn header_helpers() {
        let msg = b"A: 1\r\nB:\r\n two\r\n\r\nbody";
        let fields: Vec<_> = top_level_headers(msg).collect();
        assert_eq!(
            fields,
            vec![(&b"A"[..], &b" 1"[..]), (&b"B"[..], &b"\r\n two"[..])]
        );
        assert_eq!(header_section_len(msg), msg.len() - 4);
        assert_eq!(header_section_len(b"A: 1\n\nbody"), 6);
        assert_eq!(header_section_len(b"A: 1\r\n"), 6);
        assert_eq!(header_section_len(b"\r\nbody"), 2);
        assert_eq!(header_section_len(b""), 0);
    }

    /// Header sections every reader of raw headers must survive (cut
    /// lines, bare CR/LF, invalid UTF-8); `key_header`'s tests use them too.
    pub(crate) const GARBAGE: [&[u8]; 10] = [
        b"",
        b"\r",
        b"\n",
        b"\r\n\r\n",
        b":",
        b"\xff\xfe\xfd",
        b"X-Bird-Idempotency-Key:\r",
        b"X-Bird-Idempotency-Key:\r\n \r",
        b" \t\r\n\t",
        b"X-Bird-Idempotency-Key: \xc3",
    ];

    #[test]
    fn garbage_never_panics() {
        for s in GARBAGE {
            let _ = header_section_len(s);
            let _ = top_level_headers(s).count();
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let len = header_section_len(&bytes);
            prop_assert!(len <= bytes.len());
            for (name, value) in top_level_headers(&bytes) {
                prop_assert!(!name.is_empty());
                prop_assert!(value.len() <= bytes.len());
            }
        }

        #[test]
        fn header_like_bytes_never_panic(
            lines in proptest::collection::vec("[ \t]?[A-Za-z:-]{0,30}[ \t:]{0,3}[\\x00-\\x7f]{0,20}(\r\n|\n|\r)?", 0..12)
        ) {
            let msg = lines.concat();
            prop_assert!(header_section_len(msg.as_bytes()) <= msg.len());
        }
    }
}
