//! `MAIL FROM:<path> [params]` and `RCPT TO:<path> [params]`. The path is
//! read from the raw line here, byte for byte ([`crate::address`]); the
//! parameters are left to smtp-proto, as for every other command. Its own
//! path parser unquotes quoted local parts (so `"a> ENVID=x"@d` would be
//! relayed as a parameter) and refuses `<postmaster>` and address literals.

use smtp_proto::{Error as ParseError, Request};

use super::params::{self, Extension};
use crate::address::{AddressError, ForwardPath, ReversePath, split_bracketed};

const MAIL_SYNTAX: &str = "MAIL FROM:<reverse-path> [parameters]";
const RCPT_SYNTAX: &str = "RCPT TO:<forward-path> [parameters]";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Mail,
    Rcpt,
}

/// The line's command word, if it is MAIL or RCPT (in any case).
pub fn verb(line: &[u8]) -> Option<Verb> {
    let line = skip_blanks(line);
    let end = line
        .iter()
        .position(u8::is_ascii_whitespace)
        .unwrap_or(line.len());
    let word = &line[..end];
    if word.eq_ignore_ascii_case(b"MAIL") {
        Some(Verb::Mail)
    } else if word.eq_ignore_ascii_case(b"RCPT") {
        Some(Verb::Rcpt)
    } else {
        None
    }
}

#[derive(Debug)]
pub struct MailArgs {
    pub path: ReversePath,
    /// `SIZE=`, 0 when not given.
    pub size: usize,
    /// `REQUIRETLS` (RFC 8689).
    pub require_tls: bool,
    /// Every parameter given, with its extension (`smtp::params`).
    pub params: Vec<(&'static str, Extension)>,
}

#[derive(Debug)]
pub struct RcptArgs {
    pub path: ForwardPath,
    pub params: Vec<(&'static str, Extension)>,
}

#[derive(Debug)]
pub enum CommandError {
    /// Command syntax or a parameter: answered like any other parse error.
    Syntax(ParseError),
    /// The path is malformed or could not be relayed safely.
    Path {
        error: AddressError,
        /// What the client sent from the `<` on, for the log (escape it).
        text: String,
    },
}

pub fn parse_mail(line: &[u8]) -> Result<MailArgs, CommandError> {
    let (inner, rest) = split(line, b"MAIL", b"FROM", MAIL_SYNTAX)?;
    let path = ReversePath::parse(inner).map_err(|error| path_error(error, inner.as_bytes()))?;
    let line = stand_in_line(b"MAIL FROM:<>", rest);
    match Request::parse(&mut line.iter()) {
        Ok(Request::Mail { from }) => Ok(MailArgs {
            path,
            size: from.size,
            require_tls: from.flags & smtp_proto::MAIL_REQUIRETLS != 0,
            params: params::mail_params(&from),
        }),
        Ok(_) => Err(syntax(MAIL_SYNTAX)),
        Err(e) => Err(CommandError::Syntax(e)),
    }
}

pub fn parse_rcpt(line: &[u8]) -> Result<RcptArgs, CommandError> {
    let (inner, rest) = split(line, b"RCPT", b"TO", RCPT_SYNTAX)?;
    let path = ForwardPath::parse(inner).map_err(|error| path_error(error, inner.as_bytes()))?;
    let line = stand_in_line(b"RCPT TO:<>", rest);
    match Request::parse(&mut line.iter()) {
        Ok(Request::Rcpt { to }) => Ok(RcptArgs {
            path,
            params: params::rcpt_params(&to),
        }),
        Ok(_) => Err(syntax(RCPT_SYNTAX)),
        Err(e) => Err(CommandError::Syntax(e)),
    }
}

/// `VERB KEYWORD:<path>rest` with the blanks smtp-proto also tolerates
/// (`MAIL FROM: <a@b>`), into the text between the brackets and the rest.
fn split<'a>(
    line: &'a [u8],
    verb: &[u8],
    keyword: &[u8],
    syntax_text: &'static str,
) -> Result<(&'a str, &'a [u8]), CommandError> {
    let after_verb = strip_prefix_ignore_case(skip_blanks(line), verb)
        .filter(|rest| rest.first().is_some_and(|&b| b == b' ' || b == b'\t'))
        .ok_or_else(|| syntax(syntax_text))?;
    let after_colon = strip_prefix_ignore_case(skip_blanks(after_verb), keyword)
        .map(skip_blanks)
        .and_then(|rest| rest.strip_prefix(b":"))
        .map(skip_blanks)
        .filter(|rest| rest.starts_with(b"<"))
        .ok_or_else(|| syntax(syntax_text))?;
    split_bracketed(after_colon).map_err(|error| path_error(error, after_colon))
}

/// smtp-proto parses the parameters behind a stand-in path, so they are
/// checked exactly as before.
fn stand_in_line(stand_in: &[u8], rest: &[u8]) -> Vec<u8> {
    let mut line = Vec::with_capacity(stand_in.len() + rest.len());
    line.extend_from_slice(stand_in);
    line.extend_from_slice(rest);
    line
}

fn path_error(error: AddressError, text: &[u8]) -> CommandError {
    let text = text.strip_suffix(b"\n").unwrap_or(text);
    let text = text.strip_suffix(b"\r").unwrap_or(text);
    CommandError::Path {
        error,
        text: String::from_utf8_lossy(text).into_owned(),
    }
}

fn syntax(syntax: &'static str) -> CommandError {
    CommandError::Syntax(ParseError::SyntaxError { syntax })
}

fn skip_blanks(bytes: &[u8]) -> &[u8] {
    let start = bytes
        .iter()
        .position(|&b| b != b' ' && b != b'\t')
        .unwrap_or(bytes.len());
    &bytes[start..]
}

fn strip_prefix_ignore_case<'a>(bytes: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    let head = bytes.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &bytes[prefix.len()..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mail(line: &str) -> Result<MailArgs, CommandError> {
        parse_mail(line.as_bytes())
    }

    fn rcpt(line: &str) -> Result<RcptArgs, CommandError> {
        parse_rcpt(line.as_bytes())
    }

    #[test]
    fn verbs() {
        assert_eq!(verb(b"MAIL FROM:<a@b>\r\n"), Some(Verb::Mail));
        assert_eq!(verb(b"  rcpt to:<a@b>\r\n"), Some(Verb::Rcpt));
        assert_eq!(verb(b"MAIL\r\n"), Some(Verb::Mail));
        assert_eq!(verb(b"MAILX FROM:<a@b>\r\n"), None);
        assert_eq!(verb(b"NOOP\r\n"), None);
    }

    #[test]
    fn paths_are_kept_exactly_and_parameters_still_parsed() {
        let m = mail("MAIL FROM:<\"ceo@victim.test> ENVID=x\"@example.test> SIZE=42\r\n")
            .expect("valid");
        assert_eq!(
            m.path.as_smtp(),
            "\"ceo@victim.test> ENVID=x\"@example.test"
        );
        assert_eq!(m.size, 42);
        let m = mail("mail from: <a@b.test> BODY=8BITMIME SMTPUTF8\r\n").expect("valid");
        assert_eq!((m.path.as_smtp(), m.size), ("a@b.test", 0));
        assert_eq!(
            mail("MAIL  FROM : <>\r\n").expect("null").path,
            ReversePath::Null
        );
        let r = rcpt("RCPT TO:<\"x> NOTIFY=NEVER\"@example.net>\r\n").expect("valid");
        assert_eq!(r.path.as_smtp(), "\"x> NOTIFY=NEVER\"@example.net");
        for (line, want) in [
            ("RCPT TO:<postmaster>\r\n", "postmaster"),
            ("RCPT TO:<PostMaster>\r\n", "PostMaster"),
            ("RCPT TO:<a@[127.0.0.1]>\r\n", "a@[127.0.0.1]"),
            ("RCPT TO:<a@[IPv6:::1]> NOTIFY=NEVER\r\n", "a@[IPv6:::1]"),
            ("RCPT TO:<@r.test:a@b.test>\r\n", "a@b.test"),
        ] {
            assert_eq!(rcpt(line).expect(line).path.as_smtp(), want);
        }
    }

    #[test]
    fn refusals() {
        let path_err = |r: Result<MailArgs, CommandError>| match r {
            Err(CommandError::Path { error, .. }) => error,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            path_err(mail("MAIL FROM:<\"x\rRSET\"@example.test>\r\n")),
            AddressError::Control
        );
        assert_eq!(
            path_err(mail("MAIL FROM:<\"abc@example.test>\r\n")),
            AddressError::UnbalancedQuote
        );
        assert_eq!(
            path_err(mail("MAIL FROM:<postmaster>\r\n")),
            AddressError::PostmasterSender
        );
        assert_eq!(
            path_err(mail("MAIL FROM:<a b@c.test>\r\n")),
            AddressError::BadLocalPart
        );
        assert!(matches!(
            rcpt("RCPT TO:<>\r\n"),
            Err(CommandError::Path {
                error: AddressError::Empty,
                ..
            })
        ));
        for line in [
            "MAIL FROM:a@b\r\n",
            "MAIL\r\n",
            "MAIL TO:<a@b>\r\n",
            "MAILFROM:<a@b>\r\n",
        ] {
            assert!(
                matches!(
                    mail(line),
                    Err(CommandError::Syntax(ParseError::SyntaxError { .. }))
                ),
                "{line:?}"
            );
        }
        assert!(matches!(
            mail("MAIL FROM:<a@b.test> FROBNICATE\r\n"),
            Err(CommandError::Syntax(
                ParseError::UnsupportedParameter { .. }
            ))
        ));
        assert!(matches!(
            rcpt("RCPT TO:<a@b.test> NOTIFY=SOMETIMES\r\n"),
            Err(CommandError::Syntax(_))
        ));
    }
}
