//! `POST /v1/messages` bodies into an envelope and a message: raw MIME
//! (`message/rfc822`) with the envelope from the query or the headers, or
//! JSON built into MIME with mail-builder.

mod bcc;

use std::borrow::Cow;

use mail_builder::MessageBuilder;
use mail_builder::headers::raw::Raw;
use mail_builder::headers::text::Text;
use serde::Deserialize;

use crate::address::{ForwardPath, ReversePath};

#[derive(Debug)]
pub struct Composed {
    pub reverse_path: String,
    pub recipients: Vec<String>,
    pub content: Vec<u8>,
    pub options: crate::submission::MailOptions,
}

#[derive(Debug, thiserror::Error)]
pub enum ComposeError {
    #[error("{0}")]
    Invalid(String),
}

fn invalid(message: impl Into<String>) -> ComposeError {
    ComposeError::Invalid(message.into())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonMessage {
    pub from: String,
    #[serde(default)]
    pub to: Vec<String>,
    #[serde(default)]
    pub cc: Vec<String>,
    #[serde(default)]
    pub bcc: Vec<String>,
    #[serde(default)]
    pub subject: Option<String>,
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub html: Option<String>,
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    /// REQUIRETLS (RFC 8689), as over SMTP.
    #[serde(default)]
    pub require_tls: bool,
}

/// Headers a JSON request may not set: the builder writes them from the
/// fields, and the relay's own trace and key headers are not the client's.
const RESERVED: &[&str] = &[
    "from",
    "to",
    "cc",
    "bcc",
    "subject",
    "content-type",
    "content-transfer-encoding",
    "mime-version",
    "received",
    "x-bird-idempotency-key",
];

/// Header names the builder checks by exact spelling before stamping its
/// own: a client's `date` or `message-id` is written under this spelling,
/// so that it replaces the stamped one instead of adding a second.
const STAMPED: &[&str] = &["Date", "Message-ID"];

/// Longer header names are refused: mail-builder's RFC 2047 writer starts a
/// value on a new line without folding whitespace when the name alone fills
/// the first line, which would make the value a header of its own.
const MAX_HEADER_NAME: usize = 64;
/// RFC 5322 2.1.1: a line of a message is at most 998 characters.
const MAX_LINE: usize = 998;

/// `hostname` is the relay's `server.hostname`: the right-hand side of the
/// `Message-ID` made for the message (when the request gives none).
pub fn from_json(body: &[u8], hostname: &str) -> Result<Composed, ComposeError> {
    let m: JsonMessage =
        serde_json::from_slice(body).map_err(|e| invalid(format!("JSON body: {e}")))?;
    let reverse_path = reverse_path(&m.from, "from")?;
    // Header lines carry the addresses as validated (no control, space or
    // bracket outside quotes, source route dropped), never the raw strings.
    let mut lists: [(&str, Vec<String>); 3] = [("to", vec![]), ("cc", vec![]), ("bcc", vec![])];
    for ((field, paths), given) in lists.iter_mut().zip([&m.to, &m.cc, &m.bcc]) {
        for address in given {
            paths.push(forward_path(address, field)?);
        }
    }
    let [(_, to), (_, cc), (_, bcc)] = lists;
    let recipients: Vec<String> = to.iter().chain(&cc).chain(&bcc).cloned().collect();
    if recipients.is_empty() {
        return Err(invalid("no recipient: give at least one of to, cc, bcc"));
    }
    if m.text.is_none() && m.html.is_none() {
        return Err(invalid("no body: give text, html or both"));
    }
    let mut builder = MessageBuilder::new().from(reverse_path.as_str());
    if !to.is_empty() {
        builder = builder.to(to.iter().map(String::as_str).collect::<Vec<_>>());
    }
    if !cc.is_empty() {
        builder = builder.cc(cc.iter().map(String::as_str).collect::<Vec<_>>());
    }
    if let Some(subject) = &m.subject {
        header_text("subject", subject)?;
        // `Text`: RFC 2047-encoded when not plain ASCII.
        builder = builder.subject(subject.as_str());
    }
    let mut stamped_given = Vec::new();
    for (name, value) in &m.headers {
        let valid_name = !name.is_empty()
            && name.len() <= MAX_HEADER_NAME
            && name.bytes().all(|b| b.is_ascii_graphic() && b != b':');
        if !valid_name {
            return Err(invalid(format!(
                "header {name:?}: not a valid header name (1 to {MAX_HEADER_NAME} visible \
                 ASCII characters, no colon)"
            )));
        }
        if RESERVED.contains(&name.to_ascii_lowercase().as_str()) {
            return Err(invalid(format!(
                "header {name:?} is set from the message's fields or by the relay"
            )));
        }
        header_text(&format!("header {name:?}"), value)?;
        let name = match STAMPED.iter().find(|s| s.eq_ignore_ascii_case(name)) {
            Some(stamped) if stamped_given.contains(stamped) => {
                return Err(invalid(format!("header {stamped:?} is given twice")));
            }
            Some(stamped) => {
                stamped_given.push(stamped);
                (*stamped).to_owned()
            }
            None => name.clone(),
        };
        // Folded at whitespace only: a longer word would make a line over
        // RFC 5322's 998 characters, which next hops cut or refuse.
        let longest_word = value.split([' ', '\t']).map(str::len).max().unwrap_or(0);
        if value.is_ascii() && longest_word + name.len() + 2 > MAX_LINE {
            return Err(invalid(format!(
                "header {name:?}: a word of {longest_word} characters does not fit in one \
                 header line ({MAX_LINE} characters at most)"
            )));
        }
        builder = if value.is_ascii() {
            // As given (folded at whitespace only): structured values such
            // as `List-Unsubscribe: <https://...>` stay intact.
            builder.header(name, Raw::new(value.clone()))
        } else {
            builder.header(name, Text::new(value.clone()))
        };
    }
    if !stamped_given.contains(&"Message-ID") {
        builder = builder.message_id(message_id(hostname));
    }
    if let Some(text) = &m.text {
        builder = builder.text_body(body_text("text", text)?);
    }
    if let Some(html) = &m.html {
        builder = builder.html_body(body_text("html", html)?);
    }
    let content = builder
        .write_to_vec()
        .map_err(|e| invalid(format!("cannot build the message: {e}")))?;
    Ok(Composed {
        reverse_path,
        recipients,
        content,
        options: crate::submission::MailOptions {
            require_tls: m.require_tls,
        },
    })
}

/// A fresh `Message-ID` right-hand side under the relay's own name (not the
/// OS host name mail-builder would use).
fn message_id(hostname: &str) -> String {
    format!("{}@{hostname}", uuid::Uuid::now_v7().simple())
}

/// Text that goes into a header: no control character but TAB. CR and LF
/// would end the header and start another (header injection); NUL, DEL and
/// the C1 controls are not text (RFC 5322 2.2). Non-ASCII is fine: the
/// builder encodes it (RFC 2047).
fn header_text(field: &str, value: &str) -> Result<(), ComposeError> {
    match value.chars().position(|c| c.is_control() && c != '\t') {
        None => Ok(()),
        Some(at) => {
            let c = value.chars().nth(at).map_or(0, u32::from);
            Err(invalid(format!(
                "{field}: control character U+{c:04X} at character {at}: header text cannot \
                 hold CR, LF, NUL or other control characters"
            )))
        }
    }
}

/// A `text` or `html` body with every line ending (CRLF, bare LF, bare CR)
/// made CRLF, as the content rule wants; NUL is refused (not text).
fn body_text<'a>(field: &str, text: &'a str) -> Result<Cow<'a, str>, ComposeError> {
    if let Some(at) = text.find('\0') {
        return Err(invalid(format!(
            "{field}: NUL character at byte {at}: the body must be text"
        )));
    }
    if !text.contains(['\r', '\n']) {
        return Ok(Cow::Borrowed(text));
    }
    let mut out = String::with_capacity(text.len() + text.len() / 32);
    let mut rest = text;
    while let Some(at) = rest.find(['\r', '\n']) {
        out.push_str(&rest[..at]);
        out.push_str("\r\n");
        let skip = if rest[at..].starts_with("\r\n") { 2 } else { 1 };
        rest = &rest[at + skip..];
    }
    out.push_str(rest);
    Ok(Cow::Owned(out))
}

/// A raw message; the envelope from `from` and `to` when given, else from
/// its `From:`, `To:` and `Cc:` headers.
pub fn from_raw(
    content: Vec<u8>,
    from: Option<&str>,
    to: &[String],
) -> Result<Composed, ComposeError> {
    let parsed = mail_parser::MessageParser::new().parse_headers(&content);
    let reverse_path = match from {
        Some(from) => reverse_path(from, "from")?,
        None => {
            let address = parsed
                .as_ref()
                .and_then(|m| m.from())
                .and_then(|a| a.first())
                .and_then(|a| a.address())
                .ok_or_else(|| invalid("no ?from= and no From: address in the message"))?;
            reverse_path(address, "From:")?
        }
    };
    let mut recipients = Vec::new();
    if to.is_empty() {
        let Some(m) = parsed.as_ref() else {
            return Err(invalid("no ?to= and the message's headers cannot be read"));
        };
        if m.bcc().is_some() {
            return Err(invalid(
                "the message has a Bcc: header: give every recipient with ?to= and remove it",
            ));
        }
        for list in [m.to(), m.cc()].into_iter().flatten() {
            for address in list.iter().filter_map(|a| a.address()) {
                recipients.push(forward_path(address, "To:/Cc:")?);
            }
        }
    } else {
        for address in to {
            recipients.push(forward_path(address, "to")?);
        }
    }
    if recipients.is_empty() {
        return Err(invalid("no recipient: give ?to= or To:/Cc: headers"));
    }
    // With ?to= the envelope is the request's: a Bcc: header would only
    // show every recipient who was blind-copied.
    let content = if to.is_empty() {
        content
    } else {
        bcc::strip_bcc(content)
    };
    Ok(Composed {
        reverse_path,
        recipients,
        content,
        options: Default::default(),
    })
}

fn reverse_path(address: &str, field: &str) -> Result<String, ComposeError> {
    ReversePath::parse(address)
        .map(|p| p.as_smtp().to_owned())
        .map_err(|e| invalid(format!("{field}: {address:?}: {e}")))
}

fn forward_path(address: &str, field: &str) -> Result<String, ComposeError> {
    ForwardPath::parse(address)
        .map(|p| p.as_smtp().to_owned())
        .map_err(|e| invalid(format!("{field}: {address:?}: {e}")))
}

#[cfg(test)]
#[path = "compose_tests.rs"]
mod tests;
