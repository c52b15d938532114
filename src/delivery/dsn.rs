//! Delivery status notifications (RFC 3464): the `multipart/report` sent
//! back to the envelope sender when recipients fail for good. It is queued
//! like any message, with the null reverse-path `<>` so that its own failure
//! never produces another one.

use std::borrow::Cow;

use super::plan::{AttemptRow, Outcome};
use crate::address::ForwardPath;
use crate::message::headers::header_section_len;
use crate::store::UnixMillis;
use crate::time::rfc5322_date;

pub struct Bounce<'a> {
    pub hostname: &'a str,
    /// The failed message.
    pub queue_id: &'a str,
    /// Its envelope sender: the recipient of the notification.
    pub sender: &'a str,
    pub arrival: UnixMillis,
    pub now: UnixMillis,
    pub failures: &'a [AttemptRow],
    /// The failed message as stored (trace + body); its header is returned.
    pub original: &'a [u8],
    /// The notification's own queue id.
    pub dsn_id: &'a str,
}

/// RFC 3463 status: the reply's enhanced code when it has one of the right
/// class, otherwise a generic one.
fn status(row: &AttemptRow) -> String {
    let code = row.reply.split_whitespace().nth(1).filter(|c| {
        c.split('.').count() == 3
            && c.split('.')
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    });
    match (row.outcome, code) {
        (Outcome::Failed, Some(c)) if c.starts_with("5.") => c.to_owned(),
        (Outcome::Expired, Some(c)) if c.starts_with("4.") => c.to_owned(),
        (Outcome::Expired, _) => "4.4.7".to_owned(),
        _ => "5.0.0".to_owned(),
    }
}

/// An address as stored, or escaped if it is not one we would relay (it
/// came from the queue, not from a checked session).
fn shown(address: &str) -> Cow<'_, str> {
    match ForwardPath::parse(address) {
        Ok(_) => Cow::Borrowed(address),
        Err(_) => Cow::Owned(format!("{address:?}")),
    }
}

/// Keeps every line of the report within RFC 5322's 998 characters.
fn clip(s: &str) -> String {
    let one_line = s.replace(['\r', '\n'], " ");
    match one_line.char_indices().nth(900) {
        Some((i, _)) => format!("{}...", one_line.get(..i).unwrap_or_default()),
        None => one_line,
    }
}

fn is_smtp_reply(reply: &str) -> bool {
    matches!(reply.as_bytes(), [a, b, c, b' ', ..] if [a, b, c].iter().all(|d| d.is_ascii_digit()))
}

/// The host part of a next hop recorded as `host [addr]`.
fn hop_host(hop: &str) -> &str {
    hop.split(' ').next().unwrap_or(hop)
}

pub fn build(b: &Bounce<'_>) -> Vec<u8> {
    let boundary = format!("=_smtp-once-report-{}", b.dsn_id);
    let headers = b
        .original
        .get(..header_section_len(b.original))
        .unwrap_or(b.original);
    // Without the blank line that ended them.
    let headers = match headers.strip_suffix(b"\r\n") {
        Some(h) if h.ends_with(b"\r\n") => h,
        _ => headers,
    };
    let date = rfc5322_date(b.now / 1000);
    let mut out = format!(
        "From: Mail Delivery System <MAILER-DAEMON@{host}>\r\n\
         To: <{to}>\r\n\
         Subject: Undelivered Mail Returned to Sender\r\n\
         Date: {date}\r\n\
         Message-ID: <{id}.dsn@{host}>\r\n\
         Auto-Submitted: auto-replied\r\n\
         MIME-Version: 1.0\r\n\
         Content-Type: multipart/report; report-type=delivery-status;\r\n\
         \tboundary=\"{boundary}\"\r\n\
         \r\n\
         This is a delivery status notification (RFC 3464).\r\n\
         \r\n\
         --{boundary}\r\n\
         Content-Type: text/plain; charset=utf-8\r\n\
         Content-Transfer-Encoding: 8bit\r\n\
         \r\n\
         This is the mail system at {host}.\r\n\
         \r\n\
         Your message {queue_id} could not be delivered to the following\r\n\
         recipient(s). It was not, and will not be, delivered to them.\r\n\
         \r\n",
        host = b.hostname,
        to = shown(b.sender),
        id = b.dsn_id,
        queue_id = b.queue_id,
    );
    for f in b.failures {
        let why = if f.outcome == Outcome::Expired {
            "gave up after retrying: "
        } else {
            ""
        };
        out.push_str(&format!(
            "<{}>: {why}{}\r\n",
            shown(&f.recipient),
            clip(&f.reply)
        ));
    }
    out.push_str(&format!(
        "\r\n--{boundary}\r\n\
         Content-Type: message/delivery-status\r\n\
         \r\n\
         Reporting-MTA: dns; {host}\r\n\
         X-Smtp-Once-Queue-ID: {queue_id}\r\n\
         Arrival-Date: {arrival}\r\n",
        host = b.hostname,
        queue_id = b.queue_id,
        arrival = rfc5322_date(b.arrival / 1000),
    ));
    for f in b.failures {
        out.push_str(&format!(
            "\r\nFinal-Recipient: rfc822; {}\r\nAction: failed\r\nStatus: {}\r\n",
            shown(&f.recipient),
            status(f)
        ));
        if let Some(hop) = f.next_hop.as_deref() {
            out.push_str(&format!("Remote-MTA: dns; {}\r\n", hop_host(hop)));
        }
        let kind = if is_smtp_reply(&f.reply) {
            "smtp"
        } else {
            "X-smtp-once"
        };
        out.push_str(&format!("Diagnostic-Code: {kind}; {}\r\n", clip(&f.reply)));
        out.push_str(&format!("Last-Attempt-Date: {date}\r\n"));
    }
    out.push_str(&format!(
        "\r\n--{boundary}\r\n\
         Content-Type: text/rfc822-headers\r\n\
         \r\n"
    ));
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(headers);
    bytes.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use mail_parser::MimeHeaders;

    fn row(rcpt: &str, outcome: Outcome, reply: &str) -> AttemptRow {
        AttemptRow {
            recipient: rcpt.into(),
            outcome,
            reply: reply.into(),
            next_hop: Some("mx.example.net [192.0.2.1:25]".into()),
        }
    }

    #[test]
    fn report_structure() {
        let failures = [
            row("a@example.net", Outcome::Failed, "550 5.1.1 No such user"),
            row(
                "b@example.net",
                Outcome::Expired,
                "connect to 192.0.2.1:25: refused",
            ),
        ];
        let original = b"Received: from x\r\n\tby y; date\r\nSubject: hello\r\n\r\nsecret body\r\n";
        let dsn = build(&Bounce {
            hostname: "relay.test",
            queue_id: "Q1",
            sender: "alice@example.test",
            arrival: 0,
            now: 1000,
            failures: &failures,
            original,
            dsn_id: "Q2",
        });
        let text = String::from_utf8(dsn).unwrap();
        let parsed = mail_parser::MessageParser::new()
            .parse(text.as_bytes())
            .expect("parses");
        assert_eq!(
            parsed.content_type().map(|c| c.subtype()),
            Some(Some("report"))
        );
        assert_eq!(parsed.parts.len(), 4, "root + 3 parts: {text}");
        for needle in [
            "To: <alice@example.test>",
            "report-type=delivery-status",
            "Final-Recipient: rfc822; a@example.net\r\nAction: failed\r\nStatus: 5.1.1\r\n",
            "Remote-MTA: dns; mx.example.net\r\n",
            "Diagnostic-Code: smtp; 550 5.1.1 No such user",
            "Final-Recipient: rfc822; b@example.net\r\nAction: failed\r\nStatus: 4.4.7\r\n",
            "Diagnostic-Code: X-smtp-once; connect to",
            "Content-Type: text/rfc822-headers\r\n\r\nReceived: from x\r\n\tby y; date\r\nSubject: hello\r\n\r\n--",
        ] {
            assert!(text.contains(needle), "{needle:?} missing from\n{text}");
        }
        assert!(!text.contains("secret body"), "only the header is returned");
        assert!(text.lines().all(|l| l.len() <= 998));
    }
}
