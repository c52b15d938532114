//! Replies read from bytes as they arrive: one reply may span several
//! reads, one read may hold several replies (a pipelined group).

use smtp_proto::Response;
use smtp_proto::response::parser::ResponseReceiver;

/// A whole reply: code, enhanced status code (`[0, 0, 0]` when none) and
/// its lines' text joined with `\n`.
pub type Reply = Response<String>;

/// Not an SMTP reply (or one over smtp-proto's 4,096 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unparseable reply")]
pub struct Unparseable;

/// smtp-proto's incremental parser, the one mail-send reads with, so a
/// reply reads the same on every client path.
#[derive(Default)]
pub struct ReplyReader {
    parser: ResponseReceiver,
}

impl ReplyReader {
    /// The next whole reply from the front of `bytes`, which is advanced
    /// past what was read. `Ok(None)`: `bytes` ended inside a reply; the
    /// part read is kept for the next call.
    pub fn next(&mut self, bytes: &mut &[u8]) -> Result<Option<Reply>, Unparseable> {
        if bytes.is_empty() {
            return Ok(None);
        }
        let mut iter = bytes.iter();
        let parsed = self.parser.parse(&mut iter);
        *bytes = iter.as_slice();
        match parsed {
            Ok(reply) => {
                self.parser.reset();
                Ok(Some(reply))
            }
            Err(smtp_proto::Error::NeedsMoreData { .. }) => Ok(None),
            Err(_) => Err(Unparseable),
        }
    }
}

/// Whether a `250` EHLO reply names `keyword` at the start of a line.
pub fn offers(ehlo: &Reply, keyword: &str) -> bool {
    ehlo.message.lines().any(|line| {
        line.split_ascii_whitespace()
            .next()
            .is_some_and(|word| word.eq_ignore_ascii_case(keyword))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(reader: &mut ReplyReader, mut bytes: &[u8]) -> Vec<Reply> {
        let mut out = Vec::new();
        while let Some(r) = reader.next(&mut bytes).expect("parses") {
            out.push(r);
        }
        assert!(bytes.is_empty());
        out
    }

    #[test]
    fn a_multi_line_reply_split_across_reads_is_one_reply() {
        let mut reader = ReplyReader::default();
        assert!(all(&mut reader, b"250-2.0.0 first\r\n25").is_empty());
        assert!(all(&mut reader, b"0-sec").is_empty());
        let got = all(&mut reader, b"ond\r\n250 2.0.0 last\r\n");
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].code, got[0].esc), (250, [2, 0, 0]));
        assert_eq!(got[0].message, "first\nsecond\nlast");
    }

    #[test]
    fn one_read_may_hold_several_replies() {
        let mut reader = ReplyReader::default();
        let got = all(&mut reader, b"250 ok\r\n550 5.1.1 no\r\n354 go\r\n");
        let codes: Vec<u16> = got.iter().map(|r| r.code).collect();
        assert_eq!(codes, [250, 550, 354]);
        assert_eq!(got[1].esc, [5, 1, 1]);
    }

    #[test]
    fn garbage_is_refused() {
        let mut reader = ReplyReader::default();
        let mut bytes: &[u8] = b"hello\r\n";
        assert_eq!(reader.next(&mut bytes), Err(Unparseable));
    }

    #[test]
    fn capabilities_are_read_from_the_ehlo_lines() {
        let mut reader = ReplyReader::default();
        let got = all(
            &mut reader,
            b"250-mx.example\r\n250-PIPELINING\r\n250 AUTH PLAIN\r\n",
        );
        assert!(offers(&got[0], "pipelining"));
        assert!(offers(&got[0], "AUTH"));
        assert!(!offers(&got[0], "STARTTLS"));
    }
}
