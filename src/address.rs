//! Envelope addresses (RFC 5321 4.1.2, with RFC 6531's UTF-8), kept in the
//! exact form the client wrote them. What we check (`allowed_senders`),
//! store and relay is that text, quotes and escapes included: a parser that
//! unquotes `"a> ENVID=x"@d` and a writer that emits the result unquoted
//! would let a client add ESMTP parameters at the next hop.
//!
//! Anything that could not be written back into `MAIL FROM:<...>` or
//! `RCPT TO:<...>` safely is refused here: control characters (CR, LF, NUL,
//! ...), spaces or `<`/`>` outside quotes, unbalanced quotes, empty parts,
//! over-long parts.
//!
//! Ground floor: used by the inbound session, `auth`, the `Received:`
//! header and delivery, and depends on none of them.

use std::borrow::Cow;
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

/// RFC 5321 4.5.3.1.1.
pub const MAX_LOCAL_PART: usize = 64;
/// RFC 5321 4.5.3.1.2.
pub const MAX_DOMAIN: usize = 255;
/// RFC 5321 4.5.3.1.3: a path with its angle brackets.
pub const MAX_PATH: usize = 256;
const MAX_LABEL: usize = 63;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    #[error("address is empty")]
    Empty,
    #[error("address must be enclosed in <>")]
    NotBracketed,
    #[error("no closing '>'")]
    Unclosed,
    #[error("unbalanced quote")]
    UnbalancedQuote,
    #[error("control character (CR, LF, NUL, TAB, ...) in address")]
    Control,
    #[error("address is not valid UTF-8")]
    NotUtf8,
    #[error("address has no @domain")]
    NoDomain,
    #[error("empty local part")]
    EmptyLocalPart,
    #[error("local part longer than 64 octets")]
    LocalPartTooLong,
    #[error("address longer than 256 octets")]
    TooLong,
    #[error("character not allowed in an unquoted local part")]
    BadLocalPart,
    #[error("invalid escape in quoted local part")]
    BadEscape,
    #[error("invalid domain")]
    BadDomain,
    #[error("domain longer than 255 octets")]
    DomainTooLong,
    #[error("invalid address literal (use [192.0.2.1] or [IPv6:2001:db8::1])")]
    BadLiteral,
    #[error("invalid source route")]
    BadSourceRoute,
    #[error("<postmaster> without a domain is a recipient, not a sender")]
    PostmasterSender,
}

/// A mailbox `local-part@domain`, as the client wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Address {
    text: String,
    /// The `@` between local part and domain (the last one: a quoted local
    /// part may contain `@`, a domain never does).
    at: usize,
}

/// For fuzzing and callers outside SMTP: a mailbox, without brackets.
pub fn parse(text: &str) -> Result<Address, AddressError> {
    Address::parse(text)
}

impl Address {
    /// `local-part "@" ( domain / address-literal )`, without brackets or
    /// source route.
    pub fn parse(text: &str) -> Result<Self, AddressError> {
        if text.is_empty() {
            return Err(AddressError::Empty);
        }
        if text.chars().any(char::is_control) {
            return Err(AddressError::Control);
        }
        if text.len() + 2 > MAX_PATH {
            return Err(AddressError::TooLong);
        }
        let local_end = local_part_len(text)?;
        let rest = &text[local_end..];
        let Some(domain) = rest.strip_prefix('@') else {
            return Err(if rest.is_empty() {
                AddressError::NoDomain
            } else {
                AddressError::BadLocalPart
            });
        };
        if local_end > MAX_LOCAL_PART {
            return Err(AddressError::LocalPartTooLong);
        }
        check_domain(domain)?;
        Ok(Self {
            text: text.to_owned(),
            at: local_end,
        })
    }

    /// The exact text to put between `<` and `>`.
    pub fn as_smtp(&self) -> &str {
        &self.text
    }

    /// As written: quotes and escapes kept.
    pub fn local_part(&self) -> &str {
        &self.text[..self.at]
    }

    /// As written: a domain name or an address literal in brackets.
    pub fn domain(&self) -> &str {
        &self.text[self.at + 1..]
    }

    pub fn is_quoted(&self) -> bool {
        self.text.starts_with('"')
    }

    /// The local part's value: a quoted string without its quotes and
    /// backslashes (`"a\"b"` is `a"b`), a dot-string as is. `"abc"@d` and
    /// `abc@d` are the same mailbox.
    pub fn local_value(&self) -> Cow<'_, str> {
        let local = self.local_part();
        let Some(inner) = local.strip_prefix('"').and_then(|l| l.strip_suffix('"')) else {
            return Cow::Borrowed(local);
        };
        let mut value = String::with_capacity(inner.len());
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            if c == '\\' {
                value.extend(chars.next());
            } else {
                value.push(c);
            }
        }
        Cow::Owned(value)
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// What `MAIL FROM:<...>` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReversePath {
    /// `<>`: bounces and other notifications.
    Null,
    Mailbox(Address),
}

impl ReversePath {
    /// The text between the brackets; an RFC 5321 source route in front of
    /// the mailbox is accepted and dropped (4.1.1.3: MUST accept, SHOULD
    /// ignore).
    pub fn parse(inner: &str) -> Result<Self, AddressError> {
        if inner.is_empty() {
            return Ok(Self::Null);
        }
        if inner.eq_ignore_ascii_case("postmaster") {
            return Err(AddressError::PostmasterSender);
        }
        mailbox_after_route(inner).map(Self::Mailbox)
    }

    /// The exact text between the brackets: empty for `<>`.
    pub fn as_smtp(&self) -> &str {
        match self {
            Self::Null => "",
            Self::Mailbox(a) => a.as_smtp(),
        }
    }
}

/// What `RCPT TO:<...>` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForwardPath {
    /// `<postmaster>` without a domain (RFC 5321 4.5.1), in the case the
    /// client wrote it.
    Postmaster(String),
    Mailbox(Address),
}

impl ForwardPath {
    /// The text between the brackets, source route allowed and dropped.
    pub fn parse(inner: &str) -> Result<Self, AddressError> {
        if inner.is_empty() {
            return Err(AddressError::Empty);
        }
        if inner.eq_ignore_ascii_case("postmaster") {
            return Ok(Self::Postmaster(inner.to_owned()));
        }
        mailbox_after_route(inner).map(Self::Mailbox)
    }

    pub fn as_smtp(&self) -> &str {
        match self {
            Self::Postmaster(p) => p,
            Self::Mailbox(a) => a.as_smtp(),
        }
    }
}

impl fmt::Display for ForwardPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_smtp())
    }
}

impl fmt::Display for ReversePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_smtp())
    }
}

/// Splits `<path>rest` at the `>` that closes the path (one inside a
/// quoted string does not), returning the text between the brackets and
/// what follows. Only finds the end; the grammar is checked by the parsers
/// above.
pub fn split_bracketed(input: &[u8]) -> Result<(&str, &[u8]), AddressError> {
    let Some(body) = input.strip_prefix(b"<") else {
        return Err(AddressError::NotBracketed);
    };
    let mut in_quote = false;
    let mut i = 0;
    while let Some(&b) = body.get(i) {
        match b {
            b'\r' | b'\n' | 0 => {
                let line_end = matches!(&body[i..], b"\r\n" | b"\n");
                return Err(match (line_end, in_quote) {
                    (false, _) => AddressError::Control,
                    (true, true) => AddressError::UnbalancedQuote,
                    (true, false) => AddressError::Unclosed,
                });
            }
            b'\\' if in_quote => i += 1,
            b'"' => in_quote = !in_quote,
            b'>' if !in_quote => {
                let inner = std::str::from_utf8(&body[..i]).map_err(|_| AddressError::NotUtf8)?;
                return Ok((inner, &body[i + 1..]));
            }
            _ => {}
        }
        i += 1;
    }
    Err(if in_quote {
        AddressError::UnbalancedQuote
    } else {
        AddressError::Unclosed
    })
}

/// `[ A-d-l ":" ] Mailbox`.
fn mailbox_after_route(inner: &str) -> Result<Address, AddressError> {
    if inner.len() + 2 > MAX_PATH {
        return Err(AddressError::TooLong);
    }
    if !inner.starts_with('@') {
        return Address::parse(inner);
    }
    // A route holds domains only, so the first ':' ends it.
    let (route, mailbox) = inner.split_once(':').ok_or(AddressError::BadSourceRoute)?;
    for hop in route.split(',') {
        let domain = hop.strip_prefix('@').ok_or(AddressError::BadSourceRoute)?;
        check_domain(domain).map_err(|_| AddressError::BadSourceRoute)?;
    }
    Address::parse(mailbox)
}

/// Length of the local part at the start of `text`: a quoted string, or a
/// dot-string up to the `@`.
fn local_part_len(text: &str) -> Result<usize, AddressError> {
    let bytes = text.as_bytes();
    if bytes.first() == Some(&b'"') {
        let mut i = 1;
        loop {
            match bytes.get(i) {
                None => return Err(AddressError::UnbalancedQuote),
                Some(b'"') if i == 1 => return Err(AddressError::EmptyLocalPart),
                Some(b'"') => return Ok(i + 1),
                // quoted-pairSMTP: a backslash and one printable ASCII or space.
                Some(b'\\') => match bytes.get(i + 1) {
                    Some(0x20..=0x7e) => i += 2,
                    None => return Err(AddressError::UnbalancedQuote),
                    Some(_) => return Err(AddressError::BadEscape),
                },
                // qtextSMTP: printable ASCII and space, UTF-8 (RFC 6531).
                Some(0x20..=0x7e) | Some(0x80..) => i += 1,
                Some(_) => return Err(AddressError::Control),
            }
        }
    }
    let end = text.find('@').unwrap_or(text.len());
    let local = &text[..end];
    if local.is_empty() {
        return Err(AddressError::EmptyLocalPart);
    }
    if !local
        .split('.')
        .all(|atom| !atom.is_empty() && atom.bytes().all(is_atext))
    {
        return Err(AddressError::BadLocalPart);
    }
    Ok(end)
}

/// RFC 5322 atext, plus UTF-8 (RFC 6531).
fn is_atext(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-/=?^_`{|}~".contains(&b) || b >= 0x80
}

/// `Domain / address-literal`.
fn check_domain(domain: &str) -> Result<(), AddressError> {
    if let Some(literal) = domain.strip_prefix('[') {
        let literal = literal.strip_suffix(']').ok_or(AddressError::BadLiteral)?;
        let ok = match literal.get(..5) {
            Some(tag) if tag.eq_ignore_ascii_case("IPv6:") => {
                literal[5..].parse::<Ipv6Addr>().is_ok()
            }
            _ => literal.parse::<Ipv4Addr>().is_ok(),
        };
        return if ok {
            Ok(())
        } else {
            Err(AddressError::BadLiteral)
        };
    }
    if domain.is_empty() {
        return Err(AddressError::NoDomain);
    }
    if domain.len() > MAX_DOMAIN {
        return Err(AddressError::DomainTooLong);
    }
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.len() <= MAX_LABEL
            && !label.starts_with('-')
            && !label.ends_with('-')
            // Let-dig and '-' (RFC 5321), U-labels (RFC 6531), and '_' as
            // found in real host names.
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b >= 0x80)
    };
    if domain.split('.').all(label_ok) {
        Ok(())
    } else {
        Err(AddressError::BadDomain)
    }
}

#[cfg(test)]
#[path = "address_tests.rs"]
mod tests;
