//! The `Received:` trace header (RFC 5321 4.4) prepended to every accepted
//! message, after the fingerprint was taken.
//!
//! It travels to every recipient, so it names the submitting account and
//! workspace only when `[server] received_auth_header` asks for it (Postfix:
//! `smtpd_sasl_authenticated_header`, off by default). The header is not
//! part of any fingerprint: it is stored beside the body, in the trace.

use crate::address::ForwardPath;
use crate::store::UnixMillis;
use crate::submission::Submission;
use crate::time::rfc5322_date;

/// What the `Received:` header says beyond the hop itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TraceOptions {
    /// Name the account and workspace that submitted the message.
    pub auth: bool,
}

pub(super) fn received_header(
    sub: &Submission,
    hostname: &str,
    queue_id: &str,
    now: UnixMillis,
    options: TraceOptions,
) -> String {
    // RFC 3848 protocol names.
    let protocol = match (sub.tls, sub.submitter.is_authenticated()) {
        (true, true) => "ESMTPSA",
        (true, false) => "ESMTPS",
        (false, true) => "ESMTPA",
        (false, false) => "ESMTP",
    };
    let helo: String = sub
        .helo
        .chars()
        .filter(|c| c.is_ascii_graphic())
        .take(255)
        .collect();
    let mut h = format!(
        "Received: from {helo} ([{}])\r\n\tby {hostname} (smtp-once) with {protocol} id {queue_id}",
        sub.peer.ip(),
    );
    if options.auth {
        h.push_str(&format!(
            "\r\n\t(account {}, workspace {})",
            sub.submitter.name(),
            sub.submitter.workspace(),
        ));
    }
    // The recipient exactly as accepted (quotes kept), and only if it is
    // one the session would accept: never a line break in a header.
    if let [single] = sub.recipients.as_slice()
        && ForwardPath::parse(single).is_ok()
    {
        h.push_str(&format!("\r\n\tfor <{single}>"));
    }
    h.push_str(&format!(";\r\n\t{}\r\n", rfc5322_date(now / 1000)));
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_account_is_named_only_when_asked() {
        let sub = Submission {
            submitter: crate::auth::Submitter::TrustedNetwork {
                workspace: "acme".into(),
            },
            helo: "client.test".into(),
            peer: "192.0.2.1:25".parse().unwrap(),
            tls: false,
            reverse_path: "a@x.test".into(),
            recipients: vec!["b@y.test".into()],
            content: Vec::new(),
            options: Default::default(),
        };
        let quiet = received_header(&sub, "relay.test", "Q1", 0, TraceOptions::default());
        assert_eq!(
            quiet,
            "Received: from client.test ([192.0.2.1])\r\n\tby relay.test (smtp-once) with ESMTP id Q1\r\n\t\
             for <b@y.test>;\r\n\tThu, 01 Jan 1970 00:00:00 +0000\r\n"
        );
        let named = received_header(&sub, "relay.test", "Q1", 0, TraceOptions { auth: true });
        assert!(
            named.contains(
                "id Q1\r\n\t(account (trusted network), workspace acme)\r\n\tfor <b@y.test>;"
            ),
            "{named}"
        );
    }
}
