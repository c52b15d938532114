//! The SMTP front's words for what the acceptance pipeline decided: reply
//! lines, the replay marker and the `E01005` text. The pipeline itself
//! (`accept`) and the idempotency rules (`idempotency`) return typed
//! outcomes; the words live with the front that speaks them.

use crate::accept::channel::ChannelWording;
use crate::accept::from_header::SenderRefusal;
use crate::content_check::ContentFault;
use crate::message::key_header::IdempotencyKeyError;
use crate::message::mime_limits::MimeLimitError;
use crate::smtp::reply::Reply;
use crate::store::LedgerEntry;

/// The SMTP wording: reply lines.
pub struct Smtp;

impl ChannelWording for Smtp {
    fn metric(&self) -> crate::metrics::Channel {
        crate::metrics::Channel::Smtp
    }

    fn accepted(&self, queue_id: &str) -> Vec<u8> {
        Reply::new(250, "2.0.0", &format!("Ok: queued as {queue_id}")).to_bytes()
    }

    fn sender_refused(&self, refusal: &SenderRefusal) -> Vec<u8> {
        Reply::new(553, "5.7.1", &refusal.words()).to_bytes()
    }

    fn replay(&self, stored: &[u8]) -> Vec<u8> {
        replay_reply(stored)
    }

    fn conflict(&self, entry: &LedgerEntry) -> Vec<u8> {
        conflict_reply(entry)
    }

    fn in_progress(&self) -> Vec<u8> {
        Reply::new(
            451,
            "4.5.0",
            "E01004 RequestInProgress: try again shortly with the same key and message",
        )
        .to_bytes()
    }

    fn unavailable(&self) -> Vec<u8> {
        Reply::new(
            451,
            "4.3.0",
            "E01033 IdempotencyUnavailable: message not accepted, retry",
        )
        .to_bytes()
    }

    fn storage_failure(&self) -> Vec<u8> {
        Reply::new(
            451,
            "4.3.0",
            "Temporary storage failure: message not accepted, retry",
        )
        .to_bytes()
    }

    fn bad_key(&self, error: &IdempotencyKeyError) -> Vec<u8> {
        Reply::new(554, "5.6.0", &format!("E01001 ValidationError: {error}")).to_bytes()
    }

    fn over_limits(&self, error: &MimeLimitError) -> Vec<u8> {
        Reply::new(
            554,
            "5.6.0",
            &format!("Message refused: {error} (server limit)"),
        )
        .to_bytes()
    }

    fn too_many_hops(&self, count: usize, limit: usize) -> Vec<u8> {
        // Postfix: "554 5.4.6 Too many hops".
        Reply::new(
            554,
            "5.4.6",
            &format!(
                "Too many hops: {count} Received: header fields, the limit is {limit} (mail loop?)"
            ),
        )
        .to_bytes()
    }

    fn content_refused(&self, fault: &ContentFault) -> Vec<u8> {
        // What the session answers at DATA or BDAT for the same bytes.
        Reply::new(554, "5.6.0", fault.smtp_text()).to_bytes()
    }

    fn analysis_failed(&self) -> Vec<u8> {
        Reply::new(
            451,
            "4.3.0",
            "Temporary failure analysing the message: not accepted, retry",
        )
        .to_bytes()
    }

    fn signing_failed(&self) -> Vec<u8> {
        Reply::new(
            451,
            "4.3.0",
            "Temporary failure signing the message (DKIM): not accepted, retry",
        )
        .to_bytes()
    }
}

/// The stored reply, byte for byte, preceded by the replay marker line in
/// the stored reply's own code, so a client reading only the last line sees
/// exactly what it saw the first time.
pub fn replay_reply(stored: &[u8]) -> Vec<u8> {
    let code = stored.get(..3).unwrap_or(b"250");
    let esc = stored
        .get(4..)
        .and_then(|rest| rest.split(|&b| b == b' ' || b == b'\r').next())
        .filter(|esc| is_enhanced_code(esc))
        .unwrap_or(b"2.0.0");
    let mut out = Vec::with_capacity(stored.len() + 40);
    out.extend_from_slice(code);
    out.push(b'-');
    out.extend_from_slice(esc);
    out.extend_from_slice(b" Idempotency-Replay: true\r\n");
    out.extend_from_slice(stored);
    out
}

/// `550 5.6.0 E01005`, naming what the key already belongs to (in the
/// submitter's own workspace: the lookup is per workspace), so that an
/// application can reconcile: the queue id of the first message, or the code
/// of the stored rejection.
pub fn conflict_reply(entry: &LedgerEntry) -> Vec<u8> {
    let what = match &entry.queue_id {
        Some(id) => format!("a different message (queued as {id})"),
        None => match entry
            .reply
            .get(..3)
            .filter(|c| c.iter().all(u8::is_ascii_digit))
        {
            Some(code) => format!(
                "a message that was rejected ({})",
                String::from_utf8_lossy(code)
            ),
            None => "a message that was rejected".to_owned(),
        },
    };
    format!("550 5.6.0 E01005 IdempotencyKeyReuse: key already used for {what}\r\n").into_bytes()
}

fn is_enhanced_code(s: &[u8]) -> bool {
    let parts: Vec<&[u8]> = s.split(|&b| b == b'.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.iter().all(u8::is_ascii_digit))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(fp: u8) -> LedgerEntry {
        LedgerEntry::queued_as_x(fp)
    }

    #[test]
    fn conflict_names_the_queue_id_or_the_rejection() {
        assert_eq!(
            conflict_reply(&entry(1)),
            b"550 5.6.0 E01005 IdempotencyKeyReuse: key already used for a different message (queued as X)\r\n"
        );
        let rejected = LedgerEntry {
            reply: b"553 5.7.1 From not allowed\r\n".to_vec(),
            queue_id: None,
            ..entry(1)
        };
        assert_eq!(
            conflict_reply(&rejected),
            b"550 5.6.0 E01005 IdempotencyKeyReuse: key already used for a message that was rejected (553)\r\n"
        );
    }

    #[test]
    fn replay_marker_takes_the_stored_code() {
        assert_eq!(
            replay_reply(b"250 2.0.0 Ok: queued as X\r\n"),
            b"250-2.0.0 Idempotency-Replay: true\r\n250 2.0.0 Ok: queued as X\r\n"
        );
        assert_eq!(
            replay_reply(b"553 5.7.1 From not allowed\r\n"),
            b"553-5.7.1 Idempotency-Replay: true\r\n553 5.7.1 From not allowed\r\n"
        );
    }
}
