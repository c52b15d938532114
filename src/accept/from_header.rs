//! The `From:` check for accounts limited to some senders
//! (`allowed_senders`): the message must have exactly one `From:` header,
//! it must parse as an RFC 5322 mailbox list, and every mailbox in it must be
//! an allowed sender.
//!
//! Readers disagree on messages outside that: with two `From:` headers some
//! show the first and some the last; `a@x\0b@y` or `a@x@y` are read as
//! different addresses by different parsers. So anything this strict parser
//! does not read as plain mailboxes is refused, never guessed at.
//!
//! What counts as a `From:` header: any top-level field whose name is `from`
//! once whitespace and leading colons are dropped, case-insensitively (some
//! parsers, mail-parser among them, read `Fr om :` or `:From:` as `From`).
//! The grammar accepted (RFC 5322 section 3.4, without the obsolete forms):
//! a comma-separated list of `addr-spec` or `[display-name] <addr-spec>`,
//! with comments and folding whitespace around them; a display name of
//! atoms, quoted strings and dots; `addr-spec` as dot-atom or quoted-string
//! `@` dot-atom or domain literal, with nothing inside it. UTF-8 is allowed
//! (RFC 6532); control characters are not. Group syntax is refused.

use crate::auth::{Account, Submitter};
use crate::message::headers::header_section_len;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FromError {
    #[error("Message has no From: address")]
    Missing,
    #[error("Message has more than one From: header ({0})")]
    Repeated(usize),
    #[error("From: header has no address")]
    NoAddress,
    #[error("From: header cannot be parsed: {0}")]
    Malformed(&'static str),
    #[error("From: address <{0}> not allowed")]
    NotAllowed(String),
}

/// An account may not send this message's `From:`: who, and why. Each
/// front words it (SMTP `553 5.7.1`, HTTP `403 SenderNotAllowed`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SenderRefusal {
    pub account: String,
    pub error: FromError,
}

impl SenderRefusal {
    /// The reason in words, naming the account.
    pub fn words(&self) -> String {
        match &self.error {
            FromError::NotAllowed(_) => format!("{} for account {}", self.error, self.account),
            _ => format!(
                "{}; account {} must send as an allowed sender, in one From: header",
                self.error, self.account
            ),
        }
    }
}

/// For accounts limited to some senders: why the message's `From:` is not
/// acceptable, if it is not.
pub fn rejection(submitter: &Submitter, content: &[u8]) -> Option<SenderRefusal> {
    let Submitter::Account(account) = submitter else {
        return None;
    };
    account.allowed_senders.as_ref()?;
    let error = check(account, content).err()?;
    Some(SenderRefusal {
        account: account.name.clone(),
        error,
    })
}

/// Every mailbox of the one `From:` header, checked against the account.
pub fn check(account: &Account, content: &[u8]) -> Result<(), FromError> {
    for address in mailboxes(&sole_value(content)?)? {
        if !account.may_send_as(&address) {
            return Err(FromError::NotAllowed(address));
        }
    }
    Ok(())
}

/// The domain of the first mailbox of the one `From:` header, as written
/// (a domain literal keeps its brackets): what DKIM signing is chosen by.
/// Read with the same strict parser as the check, so a message it would
/// refuse is never signed for a domain that another reader would not see.
pub fn first_domain(content: &[u8]) -> Result<String, FromError> {
    let first = mailboxes(&sole_value(content)?)?
        .into_iter()
        .next()
        .ok_or(FromError::NoAddress)?;
    // The domain has no `@` (dot-atom or literal), a quoted local part may.
    first
        .rsplit_once('@')
        .map(|(_, domain)| domain.to_owned())
        .ok_or(FromError::Malformed("address without @"))
}

/// The unfolded value of the one `From:` header (none or several: refused).
fn sole_value(content: &[u8]) -> Result<Vec<u8>, FromError> {
    let mut values = from_values(content);
    match values.len() {
        0 => Err(FromError::Missing),
        1 => Ok(values.pop().unwrap_or_default()),
        n => Err(FromError::Repeated(n)),
    }
}

/// The unfolded values of every `From:`-like field of the top-level header
/// section.
fn from_values(content: &[u8]) -> Vec<Vec<u8>> {
    let section = content
        .get(..header_section_len(content))
        .unwrap_or_default();
    let mut values: Vec<Vec<u8>> = Vec::new();
    let mut in_from = false;
    for line in section.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        match line.first() {
            None => break,
            Some(b' ' | b'\t') => {
                // Unfolding drops the line break and keeps the whitespace.
                if in_from && let Some(v) = values.last_mut() {
                    v.extend_from_slice(line);
                }
                continue;
            }
            Some(_) => {}
        }
        in_from = false;
        let start = line
            .iter()
            .position(|&b| b != b':' && !b.is_ascii_whitespace())
            .unwrap_or(line.len());
        let rest = line.get(start..).unwrap_or_default();
        let Some(colon) = rest.iter().position(|&b| b == b':') else {
            continue;
        };
        let name = rest.get(..colon).unwrap_or_default();
        let is_from = name
            .iter()
            .filter(|b| !b.is_ascii_whitespace())
            .map(u8::to_ascii_lowercase)
            .eq(b"from".iter().copied());
        if is_from {
            values.push(rest.get(colon + 1..).unwrap_or_default().to_vec());
            in_from = true;
        }
    }
    values
}

/// The addresses of an unfolded `From:` value (`local@domain`, the local part
/// as written, quotes included).
fn mailboxes(value: &[u8]) -> Result<Vec<String>, FromError> {
    if value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return Err(FromError::Malformed("control character"));
    }
    if std::str::from_utf8(value).is_err() {
        return Err(FromError::Malformed("not UTF-8"));
    }
    let mut c = Cursor { s: value, i: 0 };
    c.skip_cfws()?;
    if c.peek().is_none() {
        return Err(FromError::NoAddress);
    }
    let mut out = Vec::new();
    loop {
        out.push(c.mailbox()?);
        match c.peek() {
            None => return Ok(out),
            Some(b',') => c.i += 1,
            Some(_) => return Err(FromError::Malformed("text after an address")),
        }
    }
}

struct Cursor<'a> {
    s: &'a [u8],
    i: usize,
}

fn is_atext(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-/=?^_`{|}~".contains(&b) || b >= 0x80
}

fn is_dtext(b: u8) -> bool {
    matches!(b, 33..=90 | 94..=126)
}

impl Cursor<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn slice(&self, from: usize) -> String {
        String::from_utf8_lossy(self.s.get(from..self.i).unwrap_or_default()).into_owned()
    }

    /// Whitespace and (nested) comments.
    fn skip_cfws(&mut self) -> Result<(), FromError> {
        loop {
            match self.peek() {
                Some(b' ' | b'\t') => self.i += 1,
                Some(b'(') => {
                    let mut depth = 0usize;
                    loop {
                        match self.peek() {
                            None => return Err(FromError::Malformed("unclosed comment")),
                            Some(b'\\') => self.i += 1,
                            Some(b'(') => depth += 1,
                            Some(b')') => {
                                depth -= 1;
                                if depth == 0 {
                                    self.i += 1;
                                    break;
                                }
                            }
                            Some(_) => {}
                        }
                        self.i += 1;
                    }
                }
                _ => return Ok(()),
            }
        }
    }

    fn atom(&mut self) -> bool {
        let start = self.i;
        while self.peek().is_some_and(is_atext) {
            self.i += 1;
        }
        self.i > start
    }

    fn dot_atom(&mut self) -> Result<(), FromError> {
        loop {
            if !self.atom() {
                return Err(FromError::Malformed("empty or invalid address part"));
            }
            if self.peek() != Some(b'.') {
                return Ok(());
            }
            self.i += 1;
        }
    }

    fn quoted_string(&mut self) -> Result<(), FromError> {
        self.i += 1;
        loop {
            match self.peek() {
                None => return Err(FromError::Malformed("unclosed quoted string")),
                Some(b'"') => {
                    self.i += 1;
                    return Ok(());
                }
                Some(b'\\') => self.i += 2,
                Some(_) => self.i += 1,
            }
        }
    }

    fn addr_spec(&mut self) -> Result<String, FromError> {
        let start = self.i;
        if self.peek() == Some(b'"') {
            self.quoted_string()?;
        } else {
            self.dot_atom()?;
        }
        if self.peek() != Some(b'@') {
            return Err(FromError::Malformed("address without @"));
        }
        self.i += 1;
        if self.peek() == Some(b'[') {
            self.i += 1;
            while self.peek().is_some_and(is_dtext) {
                self.i += 1;
            }
            if self.peek() != Some(b']') {
                return Err(FromError::Malformed("invalid domain literal"));
            }
            self.i += 1;
        } else {
            self.dot_atom()?;
        }
        Ok(self.slice(start))
    }

    /// `addr-spec` or `[display-name] <addr-spec>`, with the CFWS after it.
    fn mailbox(&mut self) -> Result<String, FromError> {
        self.skip_cfws()?;
        let start = self.i;
        if let Ok(address) = self.addr_spec() {
            self.skip_cfws()?;
            if matches!(self.peek(), None | Some(b',')) {
                return Ok(address);
            }
        }
        self.i = start;
        // A display name (possibly empty), then the angle address.
        loop {
            self.skip_cfws()?;
            match self.peek() {
                Some(b'<') => break,
                Some(b'"') => self.quoted_string()?,
                Some(b'.') => self.i += 1,
                Some(b) if is_atext(b) => {
                    self.atom();
                }
                Some(b':') => return Err(FromError::Malformed("group syntax")),
                Some(_) => return Err(FromError::Malformed("unexpected character")),
                None => return Err(FromError::Malformed("a name without an address")),
            }
        }
        self.i += 1;
        let address = self.addr_spec()?;
        if self.peek() != Some(b'>') {
            return Err(FromError::Malformed("unclosed <"));
        }
        self.i += 1;
        self.skip_cfws()?;
        Ok(address)
    }
}

#[cfg(test)]
#[path = "from_header_tests.rs"]
mod tests;
