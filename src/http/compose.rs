//! `POST /v1/messages` bodies into an envelope and a message: raw MIME
//! (`message/rfc822`) with the envelope from the query or the headers, or
//! JSON built into MIME with mail-builder.

use std::borrow::Cow;

use mail_builder::MessageBuilder;
use mail_builder::headers::raw::Raw;
use serde::Deserialize;

use crate::address::{ForwardPath, ReversePath};

#[derive(Debug)]
pub struct Composed {
    pub reverse_path: String,
    pub recipients: Vec<String>,
    pub content: Vec<u8>,
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

pub fn from_json(body: &[u8]) -> Result<Composed, ComposeError> {
    let m: JsonMessage =
        serde_json::from_slice(body).map_err(|e| invalid(format!("JSON body: {e}")))?;
    let reverse_path = reverse_path(&m.from, "from")?;
    let mut recipients = Vec::new();
    for (field, list) in [("to", &m.to), ("cc", &m.cc), ("bcc", &m.bcc)] {
        for address in list {
            recipients.push(forward_path(address, field)?);
        }
    }
    if recipients.is_empty() {
        return Err(invalid("no recipient: give at least one of to, cc, bcc"));
    }
    if m.text.is_none() && m.html.is_none() {
        return Err(invalid("no body: give text, html or both"));
    }
    let mut builder = MessageBuilder::new().from(m.from.as_str());
    if !m.to.is_empty() {
        builder = builder.to(m.to.iter().map(String::as_str).collect::<Vec<_>>());
    }
    if !m.cc.is_empty() {
        builder = builder.cc(m.cc.iter().map(String::as_str).collect::<Vec<_>>());
    }
    if let Some(subject) = &m.subject {
        builder = builder.subject(subject.as_str());
    }
    for (name, value) in &m.headers {
        let valid_name =
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_graphic() && b != b':');
        if !valid_name || value.contains(['\r', '\n']) {
            return Err(invalid(format!("header {name:?}: not a valid header")));
        }
        if RESERVED.contains(&name.to_ascii_lowercase().as_str()) {
            return Err(invalid(format!(
                "header {name:?} is set from the message's fields or by the relay"
            )));
        }
        builder = builder.header(Cow::Owned(name.clone()), Raw::new(value.clone()));
    }
    if let Some(text) = &m.text {
        builder = builder.text_body(text.as_str());
    }
    if let Some(html) = &m.html {
        builder = builder.html_body(html.as_str());
    }
    let content = builder
        .write_to_vec()
        .map_err(|e| invalid(format!("cannot build the message: {e}")))?;
    Ok(Composed {
        reverse_path,
        recipients,
        content,
    })
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
    Ok(Composed {
        reverse_path,
        recipients,
        content,
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
mod tests {
    use super::*;

    #[test]
    fn json_becomes_mime_with_bcc_only_in_the_envelope() {
        let c = from_json(
            br#"{"from": "app@example.test", "to": ["a@x.test"], "bcc": ["b@x.test"],
                 "subject": "Hi", "text": "hello", "headers": {"X-Tag": "t1"}}"#,
        )
        .expect("composed");
        assert_eq!(c.reverse_path, "app@example.test");
        assert_eq!(c.recipients, ["a@x.test", "b@x.test"]);
        let text = String::from_utf8_lossy(&c.content);
        assert!(text.contains("Subject: Hi"), "{text}");
        assert!(text.contains("X-Tag: t1"), "{text}");
        assert!(!text.to_ascii_lowercase().contains("bcc"), "{text}");
    }

    #[test]
    fn bad_json_is_refused_with_a_reason() {
        for (body, why) in [
            (&br#"{"from": "a@x.test", "text": "t"}"#[..], "no recipient"),
            (br#"{"from": "a@x.test", "to": ["b@x.test"]}"#, "no body"),
            (br#"{"from": "not an address", "to": ["b@x.test"], "text": "t"}"#, "from"),
            (
                br#"{"from": "a@x.test", "to": ["b@x.test"], "text": "t", "headers": {"Bcc": "c@x.test"}}"#,
                "Bcc",
            ),
            (
                br#"{"from": "a@x.test", "to": ["b@x.test"], "text": "t", "headers": {"X-A": "1\r\nBcc: c@x.test"}}"#,
                "not a valid header",
            ),
            (br#"{"from": 5}"#, "JSON body"),
        ] {
            let e = from_json(body).expect_err("refused").to_string();
            assert!(e.contains(why), "{e}");
        }
    }

    #[test]
    fn raw_envelope_from_query_or_headers() {
        let msg = b"From: A <a@x.test>\r\nTo: b@x.test, C <c@x.test>\r\nSubject: s\r\n\r\nbody\r\n"
            .to_vec();
        let c = from_raw(msg.clone(), None, &[]).expect("from headers");
        assert_eq!(
            (c.reverse_path.as_str(), c.recipients.len()),
            ("a@x.test", 2)
        );
        let c = from_raw(msg, Some("s@x.test"), &["d@x.test".into()]).expect("from query");
        assert_eq!(c.recipients, ["d@x.test"]);
        let bcc = b"From: a@x.test\r\nBcc: z@x.test\r\n\r\nbody\r\n".to_vec();
        assert!(from_raw(bcc, None, &[]).is_err());
    }
}
