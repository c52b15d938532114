//! MIME limits checked before any MIME parse: nesting depth, number of parts,
//! boundary length and scanning work (`[limits] max_mime_depth`,
//! `max_mime_parts`).
//!
//! mail-parser builds nested `message/rfc822` parts as nested `Message`
//! values and drops them recursively, so a message nested a few ten thousand
//! levels deep overflows a thread's stack and aborts the process, whatever
//! catches panics. mail-parser has no depth limit of its own, so this module
//! walks the message the way `MessageParser::parse` does (mail-parser 0.11.9,
//! `parsers/message.rs`), keeping only what decides the structure: a stack of
//! open containers and their boundaries, and counters. It uses mail-parser's
//! own header parser for every part's header block, so it reads each
//! `Content-Type` and `Content-Transfer-Encoding` exactly as the parse will,
//! and `memchr::memmem` for delimiter searches (the same first match as
//! mail-parser's byte loops, which also accept a delimiter mid-line). It
//! builds no tree: the loop is iterative, and allocates one header list and
//! one delimiter per open multipart. The one recursion is mail-parser's own
//! for base64/quoted-printable encoded `message/*` parts, which it decodes and
//! parses at most three levels deep (`MAX_NESTED_ENCODED`); it is mirrored
//! here with the same bound, so this walk's own stack stays constant.
//!
//! Counting stops as soon as a limit is passed, so a hostile message costs at
//! most `max_mime_parts` header blocks before it is refused.
//!
//! Besides the configured limits, two ceilings that no real mail reaches keep
//! the cost of mail-parser's byte-at-a-time searches in proportion to the
//! message size:
//! - a multipart whose boundary never occurs makes mail-parser scan to the end
//!   of the message and come back; thousands of those in a large message are
//!   quadratic. Such failed searches may add up to [`WORK_FACTOR`] times the
//!   message size;
//! - at every `--` in a part mail-parser compares the whole boundary, so a
//!   long boundary over a body of dashes is quadratic too: boundaries are
//!   limited to [`MAX_BOUNDARY_LEN`] bytes (RFC 2046 allows 70).
//!
//! Pinned to mail-parser `=0.11.9` like the fingerprint: an upgrade must be
//! checked against this walk (the tests below compare both on samples).

use mail_parser::parsers::MessageStream;
use mail_parser::{GetHeader, HeaderName, HeaderValue, MessageParser};
use memchr::memmem;

/// mail-parser's `MAX_NESTED_ENCODED`: how deep it parses encoded `message/*`
/// parts inside each other.
const MAX_NESTED_ENCODED: usize = 3;

/// Longest multipart boundary parsed; RFC 2046 allows 70 characters.
pub const MAX_BOUNDARY_LEN: usize = 256;

/// Failed delimiter searches may scan this many times the message size.
pub const WORK_FACTOR: usize = 8;

/// The configured ceilings (`[limits] max_mime_depth`, `max_mime_parts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MimeLimits {
    /// Containers (multiparts and `message/*` parts) open at once.
    pub max_depth: usize,
    /// Parts in the whole message, nested messages included.
    pub max_parts: usize,
}

impl Default for MimeLimits {
    /// Postfix's `mime_nesting_limit` (100) and 10,000 parts.
    fn default() -> Self {
        Self {
            max_depth: 100,
            max_parts: 10_000,
        }
    }
}

/// What the walk measured (for a message within the limits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MimeShape {
    /// Most containers open at once: 0 for a message without MIME structure,
    /// 1 for a flat multipart.
    pub depth: usize,
    /// Parts, the top-level header block included.
    pub parts: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MimeLimitError {
    #[error("MIME nesting deeper than {0} levels")]
    TooDeep(usize),
    #[error("more than {0} MIME parts")]
    TooManyParts(usize),
    #[error("MIME boundary longer than {MAX_BOUNDARY_LEN} bytes")]
    BoundaryTooLong,
    #[error("MIME structure too costly to parse (boundaries that never occur)")]
    TooCostly,
}

/// Content that passed [`check`]: only this may be handed to mail-parser's
/// full parse.
#[derive(Debug, Clone, Copy)]
pub struct WithinLimits<'a> {
    content: &'a [u8],
    shape: MimeShape,
}

impl<'a> WithinLimits<'a> {
    pub fn content(&self) -> &'a [u8] {
        self.content
    }

    pub fn shape(&self) -> MimeShape {
        self.shape
    }
}

/// Walks `content`'s MIME structure as mail-parser would and refuses it as
/// soon as it passes a limit.
pub fn check<'a>(
    content: &'a [u8],
    limits: &MimeLimits,
) -> Result<WithinLimits<'a>, MimeLimitError> {
    let mut walk = Walk {
        parser: MessageParser::default(),
        limits: *limits,
        shape: MimeShape::default(),
        work_left: content
            .len()
            .saturating_mul(WORK_FACTOR)
            .saturating_add(1 << 16),
    };
    walk.message(content, MAX_NESTED_ENCODED, 0)?;
    Ok(WithinLimits {
        content,
        shape: walk.shape,
    })
}

/// mail-parser's `MimeType`, reduced to what changes the structure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `message/rfc822`, `message/global`, or a digest part without
    /// Content-Type: its body is a message.
    Message,
    /// `multipart/digest`: parts without Content-Type are messages.
    Digest,
    Other,
}

/// One open container (mail-parser's `MessageParserState`).
struct Open {
    kind: Kind,
    /// `--` + boundary, while the container's delimiter is being looked for.
    delimiter: Option<Vec<u8>>,
    /// Index of the container's part in its message's part list.
    part_id: usize,
}

/// A stack entry: the container that was open, and for a `message/*` push
/// the number of parts its message had (mail-parser stacks the message).
struct Saved {
    open: Open,
    message_parts: Option<usize>,
}

struct Walk {
    parser: MessageParser,
    limits: MimeLimits,
    shape: MimeShape,
    work_left: usize,
}

enum Encoding {
    None,
    Base64,
    QuotedPrintable,
}

impl Walk {
    /// mail-parser's `parse_` for `raw`, `encoded_depth` levels of encoded
    /// messages still to parse, `base` containers already open around it.
    fn message(
        &mut self,
        raw: &[u8],
        encoded_depth: usize,
        base: usize,
    ) -> Result<(), MimeLimitError> {
        let mut pos = 0;
        let mut open = Open {
            kind: Kind::Message,
            delimiter: None,
            part_id: 0,
        };
        let mut stack: Vec<Saved> = Vec::new();
        // Parts in the message being filled (mail-parser's `message.parts`).
        let mut message_parts = 0;
        let mut headers = Vec::new();

        'outer: loop {
            headers.clear();
            let mut stream = MessageStream::new(raw.get(pos..).unwrap_or_default());
            let complete = stream.parse_headers(&self.parser, &mut headers);
            if !complete {
                if !headers.is_empty() {
                    // A header block cut off by the end: still one part.
                    self.count_part()?;
                }
                break;
            }
            pos += stream.offset();
            self.count_part()?;

            let content_type = headers
                .header_value(&HeaderName::ContentType)
                .and_then(|c| c.as_content_type());
            let (is_multipart, mut kind) = match content_type {
                Some(ct) => match ct.ctype() {
                    "multipart" if ct.subtype() == Some("digest") => (true, Kind::Digest),
                    "multipart" => (true, Kind::Other),
                    "message" if matches!(ct.subtype(), Some("rfc822" | "global")) => {
                        (false, Kind::Message)
                    }
                    _ => (false, Kind::Other),
                },
                None if open.kind == Kind::Digest => (false, Kind::Message),
                None => (false, Kind::Other),
            };

            if is_multipart
                && let Some(boundary) = content_type.and_then(|c| c.attribute("boundary"))
            {
                let boundary = boundary.as_bytes();
                if boundary.len() > MAX_BOUNDARY_LEN {
                    return Err(MimeLimitError::BoundaryTooLong);
                }
                let mut delimiter = Vec::with_capacity(boundary.len() + 2);
                delimiter.extend_from_slice(b"--");
                delimiter.extend_from_slice(boundary);
                match (!boundary.is_empty())
                    .then(|| find(raw, pos, &delimiter))
                    .flatten()
                {
                    Some(after) => {
                        let part_id = message_parts;
                        message_parts += 1;
                        let outer = std::mem::replace(
                            &mut open,
                            Open {
                                kind,
                                delimiter: Some(delimiter),
                                part_id,
                            },
                        );
                        stack.push(Saved {
                            open: outer,
                            message_parts: None,
                        });
                        self.check_depth(base + stack.len())?;
                        pos = skip_crlf(raw, after);
                        continue;
                    }
                    None => {
                        if !boundary.is_empty() {
                            // mail-parser searched to the end and came back.
                            self.spend(raw.len() - pos)?;
                        }
                        kind = Kind::Other;
                    }
                }
            }

            let encoding = match headers.header_value(&HeaderName::ContentTransferEncoding) {
                Some(HeaderValue::Text(e)) if e.eq_ignore_ascii_case("base64") => Encoding::Base64,
                Some(HeaderValue::Text(e)) if e.eq_ignore_ascii_case("quoted-printable") => {
                    Encoding::QuotedPrintable
                }
                _ => Encoding::None,
            };

            if kind == Kind::Message && matches!(encoding, Encoding::None) {
                // The part's body is a message parsed in place.
                let part_id = message_parts;
                message_parts += 1;
                let inner = Open {
                    kind: Kind::Message,
                    delimiter: open.delimiter.take(),
                    part_id,
                };
                let outer = std::mem::replace(&mut open, inner);
                stack.push(Saved {
                    open: outer,
                    message_parts: Some(message_parts),
                });
                message_parts = 0;
                self.check_depth(base + stack.len())?;
                continue;
            }

            // A leaf. Its end is the first delimiter of the open container,
            // whatever its encoding: mail-parser's decoders stop there too, or
            // fail and fall back to searching for it.
            message_parts += 1;
            // An encoded message is decoded and parsed by mail-parser (up to
            // MAX_NESTED_ENCODED deep): so is it here.
            let decoded = if kind == Kind::Message && encoded_depth > 0 {
                let mut stream = MessageStream::new(raw.get(pos..).unwrap_or_default());
                let boundary = open
                    .delimiter
                    .as_deref()
                    .and_then(|d| d.get(2..))
                    .unwrap_or_default();
                let (end, bytes) = match encoding {
                    Encoding::Base64 => stream.decode_base64_mime(boundary),
                    Encoding::QuotedPrintable => stream.decode_quoted_printable_mime(boundary),
                    // Unencoded messages were opened in place above.
                    Encoding::None => (usize::MAX, Default::default()),
                };
                (end != usize::MAX).then_some(bytes)
            } else {
                None
            };
            pos = match &open.delimiter {
                Some(delimiter) => find(raw, pos, delimiter).unwrap_or_else(|| {
                    open.delimiter = None;
                    raw.len()
                }),
                None => raw.len(),
            };
            if let Some(bytes) = decoded {
                // The encoded message counts as one more open container.
                let depth = base + stack.len() + 1;
                self.check_depth(depth)?;
                self.message(&bytes, encoded_depth - 1, depth)?;
            }

            if open.delimiter.is_none() {
                // Without a delimiter every leaf runs to the end.
                break;
            }
            loop {
                if open.kind == Kind::Message {
                    // A nested message ended with its parent's delimiter.
                    match stack.pop() {
                        Some(Saved {
                            open: mut outer,
                            message_parts: Some(parts),
                        }) => {
                            outer.delimiter = open.delimiter.take();
                            open = outer;
                            message_parts = parts;
                        }
                        _ => break 'outer,
                    }
                }
                let (closing, next) = is_multipart_end(raw, pos);
                pos = next;
                if !closing {
                    break;
                }
                if open.part_id >= message_parts {
                    break 'outer;
                }
                let Some(saved) = stack.pop() else {
                    break 'outer;
                };
                open = saved.open;
                let Some(delimiter) = &open.delimiter else {
                    break 'outer;
                };
                match find(raw, pos, delimiter) {
                    Some(after) => pos = after,
                    None => break 'outer,
                }
            }
        }
        Ok(())
    }

    fn count_part(&mut self) -> Result<(), MimeLimitError> {
        self.shape.parts += 1;
        if self.shape.parts > self.limits.max_parts {
            return Err(MimeLimitError::TooManyParts(self.limits.max_parts));
        }
        Ok(())
    }

    fn check_depth(&mut self, depth: usize) -> Result<(), MimeLimitError> {
        self.shape.depth = self.shape.depth.max(depth);
        if depth > self.limits.max_depth {
            return Err(MimeLimitError::TooDeep(self.limits.max_depth));
        }
        Ok(())
    }

    fn spend(&mut self, bytes: usize) -> Result<(), MimeLimitError> {
        self.work_left = self
            .work_left
            .checked_sub(bytes)
            .ok_or(MimeLimitError::TooCostly)?;
        Ok(())
    }
}

/// Position just after the first `delimiter` at or after `from`.
fn find(raw: &[u8], from: usize, delimiter: &[u8]) -> Option<usize> {
    let at = memmem::find(raw.get(from..)?, delimiter)?;
    Some(from + at + delimiter.len())
}

/// mail-parser's `skip_crlf` at `pos`: the new position.
fn skip_crlf(raw: &[u8], pos: usize) -> usize {
    let mut stream = MessageStream::new(raw.get(pos..).unwrap_or_default());
    stream.skip_crlf();
    pos + stream.offset()
}

/// mail-parser's `is_multipart_end` at `pos`: whether a close delimiter's
/// `--` follows, and the new position.
fn is_multipart_end(raw: &[u8], pos: usize) -> (bool, usize) {
    let mut stream = MessageStream::new(raw.get(pos..).unwrap_or_default());
    let closing = stream.is_multipart_end();
    (closing, pos + stream.offset())
}

#[cfg(test)]
#[path = "mime_limits_tests.rs"]
mod tests;
