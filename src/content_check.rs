//! The one content rule for every channel (SMTP DATA and BDAT, the HTTP
//! API): lines end with CRLF, and there are no NUL bytes. A bare CR or LF is the ambiguity that SMTP
//! smuggling exploits between relays (`\n.\n`, `.\r\r\n`, `\r.\r\n`): one
//! hop sees the end of the message where the next sees more content. NUL
//! bytes are not text (RFC 5322 2.3) and many next hops mangle them.
//!
//! The SMTP session runs it over the bytes as they come off the wire (for
//! DATA still dot-stuffed: stuffing never changes which CR and LF are
//! paired), so it also covers a message that is being discarded, and a bad
//! message stops being stored as soon as it is known to be bad. The
//! acceptance pipeline runs it again over the message as stored, whatever
//! channel it came in on. Ground floor: no front, no store.

/// What is wrong with a message's content, at which byte of the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentFault {
    /// A CR not followed by LF, or an LF not preceded by CR. The client's
    /// idea of where the message ends may differ from ours, so nothing it
    /// sends afterwards can be trusted.
    BareLineEnding {
        offset: usize,
    },
    Nul {
        offset: usize,
    },
}

impl ContentFault {
    /// The reply text for the fault, the same whichever channel saw it.
    pub fn smtp_text(&self) -> &'static str {
        match self {
            Self::BareLineEnding { .. } => {
                "Message contains a bare CR or LF; lines must end with CRLF"
            }
            Self::Nul { .. } => "Message contains a NUL byte",
        }
    }
}

impl std::fmt::Display for ContentFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::BareLineEnding { offset } => write!(
                f,
                "the message has a bare CR or LF at byte {offset}: lines must end in CRLF"
            ),
            Self::Nul { offset } => write!(f, "the message has a NUL byte at byte {offset}"),
        }
    }
}

/// Streaming checker: feed it every byte of one message, in any chunks.
#[derive(Debug, Default)]
pub struct ContentCheck {
    /// Bytes fed so far.
    seen: usize,
    /// The last byte fed was a CR, so the next one must be LF.
    after_cr: bool,
    first_bare: Option<usize>,
    first_nul: Option<usize>,
}

impl ContentCheck {
    pub fn new() -> Self {
        Self::default()
    }

    /// Checks the next bytes of the message.
    pub fn feed(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        if self.after_cr && bytes[0] != b'\n' {
            self.bare_at(self.seen - 1);
        }
        for i in memchr::memchr3_iter(b'\r', b'\n', 0, bytes) {
            match bytes[i] {
                b'\r' => {
                    if bytes.get(i + 1).is_some_and(|&b| b != b'\n') {
                        self.bare_at(self.seen + i);
                    }
                }
                b'\n' => {
                    let after_cr = match i {
                        0 => self.after_cr,
                        _ => bytes[i - 1] == b'\r',
                    };
                    if !after_cr {
                        self.bare_at(self.seen + i);
                    }
                }
                _ => {
                    if self.first_nul.is_none() {
                        self.first_nul = Some(self.seen + i);
                    }
                }
            }
        }
        self.after_cr = bytes.last() == Some(&b'\r');
        self.seen += bytes.len();
    }

    /// The message is complete: a CR at its very end is bare.
    pub fn finish(&mut self) {
        if std::mem::take(&mut self.after_cr) {
            self.bare_at(self.seen - 1);
        }
    }

    /// The worst fault found so far: a bare line ending before a NUL.
    pub fn fault(&self) -> Option<ContentFault> {
        match (self.first_bare, self.first_nul) {
            (Some(offset), _) => Some(ContentFault::BareLineEnding { offset }),
            (None, Some(offset)) => Some(ContentFault::Nul { offset }),
            (None, None) => None,
        }
    }

    fn bare_at(&mut self, offset: usize) {
        if self.first_bare.is_none() {
            self.first_bare = Some(offset);
        }
    }
}

/// Whole-buffer form of the check, for complete content.
pub fn check_content(data: &[u8]) -> Result<(), ContentFault> {
    let mut check = ContentCheck::new();
    check.feed(data);
    check.finish();
    check.fault().map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ContentFault::*;

    #[test]
    fn finds_bare_line_endings_and_nul() {
        assert_eq!(check_content(b"a\r\nb\r\n"), Ok(()));
        assert_eq!(check_content(b""), Ok(()));
        assert_eq!(check_content(b"a\nb"), Err(BareLineEnding { offset: 1 }));
        assert_eq!(check_content(b"\nb"), Err(BareLineEnding { offset: 0 }));
        assert_eq!(check_content(b"a\rb"), Err(BareLineEnding { offset: 1 }));
        assert_eq!(check_content(b"a\r\r\n"), Err(BareLineEnding { offset: 1 }));
        assert_eq!(check_content(b"abc\r"), Err(BareLineEnding { offset: 3 }));
        assert_eq!(
            check_content(b"a\r\n\r.\r\n"),
            Err(BareLineEnding { offset: 3 })
        );
        assert_eq!(check_content(b"ab\0c\r\n"), Err(Nul { offset: 2 }));
        assert_eq!(
            check_content(b"\0\r\n.\r\r\n"),
            Err(BareLineEnding { offset: 4 }),
            "a bare line ending outranks an earlier NUL"
        );
    }

    #[test]
    fn every_split_gives_the_same_verdict() {
        let cases: &[&[u8]] = &[
            b"line\r\nnext\r\n.\r\n",
            b"line\r\n.\r\r\nMAIL FROM:<x>\r\n",
            b"a\rb\r\n",
            b"a\r\n\nb",
            b"a\0\r\n",
            b"x\r",
        ];
        for &case in cases {
            let whole = check_content(case);
            for cut in 0..=case.len() {
                let mut check = ContentCheck::new();
                check.feed(&case[..cut]);
                check.feed(&case[cut..]);
                check.finish();
                assert_eq!(
                    check.fault().map_or(Ok(()), Err),
                    whole,
                    "{case:?} cut {cut}"
                );
            }
        }
    }

    #[test]
    fn a_crlf_split_across_chunks_is_good_and_a_trailing_cr_waits() {
        let mut check = ContentCheck::new();
        check.feed(b"line\r");
        assert_eq!(check.fault(), None, "the LF may still come");
        check.feed(b"\nnext\r\n");
        check.finish();
        assert_eq!(check.fault(), None);
        let mut check = ContentCheck::new();
        check.feed(b"line\r");
        check.finish();
        assert_eq!(check.fault(), Some(BareLineEnding { offset: 4 }));
    }
}
