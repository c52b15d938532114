//! The message as `smtp-once send` will submit it, every retry the same
//! bytes: CRLF line endings, the idempotency key in the header section,
//! and with `-t` the recipients read from To/Cc/Bcc and the Bcc field gone.
//!
//! The key is found the way the server finds it (top-level header section,
//! unfolded, trimmed, empty values ignored), so that a key we see is a key
//! the server sees.

use std::ops::Range;

use mail_parser::{HeaderName, HeaderValue, MessageParser};

/// The header that carries the idempotency key (any case).
pub(super) const KEY_HEADER: &str = "X-Bird-Idempotency-Key";
/// The server's limit, in characters.
pub(super) const MAX_KEY_CHARS: usize = 255;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum MessageError {
    #[error("no message on stdin")]
    Empty,
    #[error(
        "line {0} has a carriage return that does not end the line (a bare CR); \
         the message was not sent rather than guessing what it means"
    )]
    LoneCr(usize),
    #[error("line {0} has a NUL byte, which SMTP cannot carry")]
    Nul(usize),
    #[error("the message's {KEY_HEADER} {0}")]
    BadKey(String),
    #[error("{0} header: {1:?} is not an address that can be sent to")]
    BadHeaderAddress(&'static str, String),
}

/// The message ready for the spool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Prepared {
    /// CRLF throughout, ending in CRLF, key header included.
    pub bytes: Vec<u8>,
    pub key: String,
    /// Where the key came from.
    pub key_source: KeySource,
    /// The first address of `From:`, the default envelope sender.
    pub from: Option<String>,
    /// With `-t`: the To, Cc and Bcc addresses, in order, without repeats.
    pub header_recipients: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KeySource {
    Message,
    Option,
    Generated,
}

/// Turns the input into the message to send. `key` is `--idempotency-key`,
/// used only when the message has none; `extract_recipients` is `-t`.
pub(super) fn prepare(
    input: &[u8],
    key: Option<&str>,
    extract_recipients: bool,
) -> Result<Prepared, MessageError> {
    let mut bytes = normalise(input)?;
    let header_len = header_section_len(&bytes);
    let fields = fields(&bytes[..header_len]);

    let own_key = message_key(&bytes, &fields)?;
    let (from, header_recipients) = addresses(&bytes[..header_len], extract_recipients)?;
    if extract_recipients {
        let bcc: Vec<Range<usize>> = fields
            .iter()
            .filter(|f| bytes[f.name.clone()].eq_ignore_ascii_case(b"bcc"))
            .map(|f| f.whole.clone())
            .collect();
        // From the end, so the earlier ranges stay valid.
        for range in bcc.into_iter().rev() {
            bytes.drain(range);
        }
    }

    let (key, key_source) = match (own_key, key) {
        (Some(k), _) => (k, KeySource::Message),
        (None, Some(k)) => (k.to_owned(), KeySource::Option),
        (None, None) => (uuid::Uuid::new_v4().to_string(), KeySource::Generated),
    };
    if key_source != KeySource::Message {
        // On top, like a trace field: the header section starts at byte 0
        // whatever the message looks like.
        let line = format!("{KEY_HEADER}: {key}\r\n");
        bytes.splice(0..0, line.into_bytes());
    }
    Ok(Prepared {
        bytes,
        key,
        key_source,
        from,
        header_recipients,
    })
}

/// Checks a key given with `--idempotency-key` the way the server would.
pub(super) fn check_key(key: &str) -> Result<(), String> {
    let chars = key.chars().count();
    if key.trim() != key || key.is_empty() {
        return Err("is empty or has spaces around it".into());
    }
    if key.chars().any(char::is_control) {
        return Err("has a control character".into());
    }
    if chars > MAX_KEY_CHARS {
        return Err(format!(
            "is longer than {MAX_KEY_CHARS} characters ({chars})"
        ));
    }
    Ok(())
}

/// LF and CRLF become CRLF; a CR anywhere else is refused, as is NUL. The
/// result ends in CRLF.
pub(super) fn normalise(input: &[u8]) -> Result<Vec<u8>, MessageError> {
    if input.is_empty() {
        return Err(MessageError::Empty);
    }
    let mut out = Vec::with_capacity(input.len() + input.len() / 32 + 2);
    let mut line = 1;
    let mut i = 0;
    while let Some(&b) = input.get(i) {
        match b {
            b'\r' if input.get(i + 1) == Some(&b'\n') => {
                out.extend_from_slice(b"\r\n");
                i += 1;
                line += 1;
            }
            b'\r' => return Err(MessageError::LoneCr(line)),
            b'\n' => {
                out.extend_from_slice(b"\r\n");
                line += 1;
            }
            0 => return Err(MessageError::Nul(line)),
            _ => out.push(b),
        }
        i += 1;
    }
    if !out.ends_with(b"\r\n") {
        out.extend_from_slice(b"\r\n");
    }
    Ok(out)
}

/// Length of the header section, its blank line included (the whole
/// message when there is no blank line). `bytes` is CRLF-normalised.
fn header_section_len(bytes: &[u8]) -> usize {
    if bytes.starts_with(b"\r\n") {
        return 2;
    }
    memchr::memmem::find(bytes, b"\r\n\r\n").map_or(bytes.len(), |p| p + 4)
}

/// One header field: its name and the whole field, continuation lines and
/// the final CRLF included.
#[derive(Debug, Clone)]
struct Field {
    name: Range<usize>,
    value: Range<usize>,
    whole: Range<usize>,
}

/// The well-formed fields of a CRLF header section (as the server reads
/// them: a line without a colon or with a bad name is skipped).
fn fields(header: &[u8]) -> Vec<Field> {
    let mut out: Vec<Field> = Vec::new();
    let mut pos = 0;
    // Whether the previous line was a field a continuation may extend.
    let mut open = false;
    while pos < header.len() {
        let end = memchr::memmem::find(&header[pos..], b"\r\n").map_or(header.len(), |p| pos + p);
        let next = (end + 2).min(header.len());
        let line = &header[pos..end];
        if line.is_empty() {
            break;
        }
        if matches!(line.first(), Some(b' ' | b'\t')) {
            if open && let Some(last) = out.last_mut() {
                last.value.end = end;
                last.whole.end = next;
            }
        } else if let Some(colon) = memchr::memchr(b':', line) {
            let name = trim_end_wsp(&line[..colon]);
            open = !name.is_empty() && name.iter().all(|b| b.is_ascii_graphic());
            if open {
                out.push(Field {
                    name: pos..pos + name.len(),
                    value: pos + colon + 1..end,
                    whole: pos..next,
                });
            }
        } else {
            open = false;
        }
        pos = next;
    }
    out
}

fn trim_end_wsp(s: &[u8]) -> &[u8] {
    let n = s.iter().rposition(|b| !matches!(b, b' ' | b'\t'));
    &s[..n.map_or(0, |n| n + 1)]
}

/// The message's own key: unfolded and trimmed; empty fields carry none.
fn message_key(bytes: &[u8], fields: &[Field]) -> Result<Option<String>, MessageError> {
    let mut key: Option<String> = None;
    for f in fields {
        if !bytes[f.name.clone()].eq_ignore_ascii_case(KEY_HEADER.as_bytes()) {
            continue;
        }
        let unfolded: Vec<u8> = bytes[f.value.clone()]
            .iter()
            .copied()
            .filter(|b| !matches!(b, b'\r' | b'\n'))
            .collect();
        let value = std::str::from_utf8(&unfolded)
            .map_err(|_| MessageError::BadKey("is not valid UTF-8".into()))?
            .trim_matches([' ', '\t']);
        if value.is_empty() {
            continue;
        }
        let chars = value.chars().count();
        if chars > MAX_KEY_CHARS {
            return Err(MessageError::BadKey(format!(
                "is longer than {MAX_KEY_CHARS} characters ({chars})"
            )));
        }
        match &key {
            Some(prev) if prev != value => {
                return Err(MessageError::BadKey(
                    "appears more than once with different values".into(),
                ));
            }
            Some(_) => {}
            None => key = Some(value.to_owned()),
        }
    }
    Ok(key)
}

/// The first `From:` address, and with `-t` the To/Cc/Bcc addresses.
fn addresses(
    header: &[u8],
    extract_recipients: bool,
) -> Result<(Option<String>, Vec<String>), MessageError> {
    let Some(parsed) = MessageParser::new().parse_headers(header) else {
        return Ok((None, Vec::new()));
    };
    let from = parsed
        .from()
        .and_then(|a| a.first())
        .and_then(|a| a.address())
        .map(str::to_owned);
    let mut recipients: Vec<String> = Vec::new();
    if extract_recipients {
        for (label, name) in [
            ("To", HeaderName::To),
            ("Cc", HeaderName::Cc),
            ("Bcc", HeaderName::Bcc),
        ] {
            for value in parsed.header_values(name) {
                let HeaderValue::Address(list) = value else {
                    continue;
                };
                for addr in list.iter() {
                    let Some(a) = addr.address() else { continue };
                    if crate::address::ForwardPath::parse(a).is_err() {
                        return Err(MessageError::BadHeaderAddress(label, a.to_owned()));
                    }
                    if !recipients.iter().any(|r| r == a) {
                        recipients.push(a.to_owned());
                    }
                }
            }
        }
    }
    Ok((from, recipients))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_endings_become_crlf_and_a_bare_cr_is_refused() {
        assert_eq!(normalise(b"a\nb\r\nc").unwrap(), b"a\r\nb\r\nc\r\n");
        assert_eq!(normalise(b"a\r\n").unwrap(), b"a\r\n");
        assert_eq!(normalise(b"a\r\nb\rc\n"), Err(MessageError::LoneCr(2)));
        assert_eq!(normalise(b"a\r"), Err(MessageError::LoneCr(1)));
        assert_eq!(normalise(b"a\0"), Err(MessageError::Nul(1)));
        assert_eq!(normalise(b""), Err(MessageError::Empty));
        // A lone "." is an ordinary line here (sendmail -i).
        assert_eq!(normalise(b"x\n.\ny\n").unwrap(), b"x\r\n.\r\ny\r\n");
    }

    #[test]
    fn a_generated_key_is_a_uuid_v4_written_on_top() {
        let p = prepare(b"From: a@example.test\nSubject: s\n\nbody\n", None, false).unwrap();
        assert_eq!(p.key_source, KeySource::Generated);
        let uuid = uuid::Uuid::parse_str(&p.key).unwrap();
        assert_eq!(uuid.get_version_num(), 4);
        let want = format!(
            "X-Bird-Idempotency-Key: {}\r\nFrom: a@example.test\r\nSubject: s\r\n\r\nbody\r\n",
            p.key
        );
        assert_eq!(String::from_utf8(p.bytes).unwrap(), want);
        assert_eq!(p.from.as_deref(), Some("a@example.test"));
    }

    #[test]
    fn the_messages_own_key_wins_and_is_kept_as_is() {
        let input = b"x-bird-idempotency-key:\r\n  order-1 \r\nSubject: s\r\n\r\nb\r\n";
        let p = prepare(input, Some("other"), false).unwrap();
        assert_eq!(p.key, "order-1");
        assert_eq!(p.key_source, KeySource::Message);
        assert_eq!(p.bytes, input);
        // An empty field carries no key: the option's is added.
        let p = prepare(b"X-Bird-Idempotency-Key:\r\n\r\nb\r\n", Some("k2"), false).unwrap();
        assert_eq!(p.key, "k2");
        assert!(p.bytes.starts_with(b"X-Bird-Idempotency-Key: k2\r\n"));
        // A key in the body is not a key.
        let p = prepare(b"S: s\r\n\r\nX-Bird-Idempotency-Key: no\r\n", None, false).unwrap();
        assert_eq!(p.key_source, KeySource::Generated);
    }

    #[test]
    fn conflicting_or_long_keys_are_refused() {
        let two = b"X-Bird-Idempotency-Key: a\r\nX-Bird-Idempotency-Key: b\r\n\r\nx\r\n";
        assert!(matches!(
            prepare(two, None, false),
            Err(MessageError::BadKey(_))
        ));
        let same = b"X-Bird-Idempotency-Key: a\r\nX-Bird-Idempotency-Key: a\r\n\r\nx\r\n";
        assert_eq!(prepare(same, None, false).unwrap().key, "a");
        let long = format!("X-Bird-Idempotency-Key: {}\r\n\r\nx\r\n", "k".repeat(256));
        assert!(prepare(long.as_bytes(), None, false).is_err());
        assert!(check_key("ok-key/1").is_ok());
        assert!(check_key("").is_err());
        assert!(check_key(" a").is_err());
        assert!(check_key("a\nb").is_err());
        assert!(check_key(&"k".repeat(256)).is_err());
    }

    #[test]
    fn dash_t_reads_to_cc_bcc_and_drops_every_bcc_field() {
        let input = "From: \"Me\" <me@example.test>\n\
                     To: A <a@example.net>, b@example.net\n\
                     Cc: team: c@example.net, a@example.net;\n\
                     Bcc: hidden@example.net,\n  \"Other\" <hidden2@example.net>\n\
                     Subject: hi\n\
                     bcc: third@example.net\n\
                     \n\
                     Bcc: not-a-header@example.net\n";
        let p = prepare(input.as_bytes(), Some("k"), true).unwrap();
        assert_eq!(
            p.header_recipients,
            [
                "a@example.net",
                "b@example.net",
                "c@example.net",
                "hidden@example.net",
                "hidden2@example.net",
                "third@example.net"
            ]
        );
        assert_eq!(p.from.as_deref(), Some("me@example.test"));
        let text = String::from_utf8(p.bytes).unwrap();
        assert_eq!(
            text,
            "X-Bird-Idempotency-Key: k\r\nFrom: \"Me\" <me@example.test>\r\n\
             To: A <a@example.net>, b@example.net\r\n\
             Cc: team: c@example.net, a@example.net;\r\n\
             Subject: hi\r\n\r\nBcc: not-a-header@example.net\r\n"
        );
        // Without -t nothing is read or removed.
        let p = prepare(input.as_bytes(), Some("k"), false).unwrap();
        assert!(p.header_recipients.is_empty());
        assert!(String::from_utf8(p.bytes).unwrap().contains("Bcc: hidden"));
    }

    #[test]
    fn header_addresses_that_cannot_be_sent_to_are_refused() {
        let input = b"To: \"a b\" <x y@example.net>\r\n\r\nb\r\n";
        assert!(matches!(
            prepare(input, None, true),
            Err(MessageError::BadHeaderAddress("To", _))
        ));
    }
}
