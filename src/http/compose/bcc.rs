//! `Bcc:` out of a raw message whose envelope the request gives (`?to=`):
//! the header would otherwise go to every recipient, telling each one who
//! else got a blind copy (Gmail's API strips it the same way).

/// The message with every top-level `Bcc:` field removed, its folded
/// continuation lines with it; every other byte is kept as it was.
pub(super) fn strip_bcc(content: Vec<u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(content.len());
    let mut rest = &content[..];
    let mut dropping = false;
    while !rest.is_empty() {
        let len = memchr::memchr(b'\n', rest).map_or(rest.len(), |i| i + 1);
        let (line, after) = rest.split_at(len);
        if matches!(line, b"\r\n" | b"\n") {
            // The end of the header section: the body is kept whole.
            break;
        }
        let continuation = matches!(line.first(), Some(b' ' | b'\t'));
        if !continuation {
            dropping = is_bcc(line);
        }
        if !dropping {
            out.extend_from_slice(line);
        }
        rest = after;
    }
    out.extend_from_slice(rest);
    out
}

/// `Bcc:` in any case, with the obsolete whitespace before the colon
/// (RFC 5322 4.5.1) that parsers accept.
fn is_bcc(line: &[u8]) -> bool {
    let Some(colon) = memchr::memchr(b':', line) else {
        return false;
    };
    line[..colon].trim_ascii_end().eq_ignore_ascii_case(b"bcc")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bcc_goes_with_its_continuation_and_nothing_else_changes() {
        let message = b"From: a@x.test\r\nBcc: b@x.test,\r\n c@x.test\r\nTo: d@x.test\r\n\
            bcc : e@x.test\r\nSubject: Bcc: in a subject\r\n\tstays\r\n\r\n\
            Bcc: in the body stays\r\n";
        assert_eq!(
            strip_bcc(message.to_vec()),
            b"From: a@x.test\r\nTo: d@x.test\r\nSubject: Bcc: in a subject\r\n\tstays\r\n\r\n\
            Bcc: in the body stays\r\n"
        );
    }

    #[test]
    fn a_message_without_bcc_is_unchanged() {
        for message in [
            &b"From: a@x.test\r\nX-Bcc: kept\r\nBccx: kept\r\n\r\nbody"[..],
            b"From: a@x.test\r\n",
            b"no header section at all",
            b"",
            b"From: a@x.test\nTo: b\n\nbare LF is the content rule's business\n",
        ] {
            assert_eq!(strip_bcc(message.to_vec()), message);
        }
        assert_eq!(
            strip_bcc(b"Bcc: last header, no body".to_vec()),
            b"",
            "the header section may end the message"
        );
    }
}
