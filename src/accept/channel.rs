//! How a channel (SMTP, HTTP) words what the acceptance pipeline decided,
//! and where it takes the idempotency key from. The pipeline, the claims
//! and the ledger are the same for both; only the bytes differ. What
//! `accepted` and `sender_refused` return is what the ledger stores and a
//! replay gives back byte for byte, so one channel's entries are never
//! replayed on the other: their fingerprints differ (see `KeySource`).

use crate::idempotency::decision::{conflict_reply, replay_reply};
use crate::idempotency::key::KeyError;
use crate::idempotency::mime_limits::MimeLimitError;
use crate::smtp::content_check::ContentFault;
use crate::smtp::reply::Reply;
use crate::store::LedgerEntry;

/// Where the key comes from, and what else the identity holds.
#[derive(Debug, Clone)]
pub enum KeySource {
    /// SMTP: the message's `X-Bird-Idempotency-Key` header.
    MessageHeader,
    /// HTTP: the `Idempotency-Key` request header (as sent, not yet
    /// validated) and the request line (method, path, query) that is part
    /// of the request's identity with the body. `body` is the body's own
    /// hash when the message was built from it (JSON), so that identity does
    /// not depend on the built message's fresh Date, Message-ID and MIME
    /// boundaries; `None` when the body is the message (raw MIME: its
    /// fingerprint ignores boundaries and part order).
    Request {
        key: Option<String>,
        line: String,
        body: Option<[u8; 32]>,
    },
}

pub trait Channel: Send + Sync {
    /// Which channel, for the submissions metric.
    fn metric(&self) -> crate::metrics::Channel;
    /// The answer for a queued message (stored under its key).
    fn accepted(&self, queue_id: &str) -> Vec<u8>;
    /// A `From:` header the account may not use: `reply` is the SMTP
    /// wording (stored under its key).
    fn sender_refused(&self, reply: &Reply) -> Vec<u8>;
    /// A stored answer given again.
    fn replay(&self, stored: &[u8]) -> Vec<u8>;
    /// E01005: the key belongs to a different request.
    fn conflict(&self, entry: &LedgerEntry) -> Vec<u8>;
    /// E01004: the key's first request is still running.
    fn in_progress(&self) -> Vec<u8>;
    /// E01033: the ledger cannot be reached; nothing was done.
    fn unavailable(&self) -> Vec<u8>;
    /// The commit failed part-way and was rolled back.
    fn storage_failure(&self) -> Vec<u8>;
    /// E01001: the key is not valid.
    fn bad_key(&self, error: &KeyError) -> Vec<u8>;
    /// The MIME structure is over the server's limits.
    fn over_limits(&self, error: &MimeLimitError) -> Vec<u8>;
    /// The content breaks the one content rule (bare CR or LF, NUL).
    fn content_refused(&self, fault: &ContentFault) -> Vec<u8>;
    /// The message could not be analysed (an internal failure).
    fn analysis_failed(&self) -> Vec<u8>;
    /// The DKIM signature could not be made; nothing was queued.
    fn signing_failed(&self) -> Vec<u8>;
}

/// The SMTP wording: reply lines.
pub struct Smtp;

impl Channel for Smtp {
    fn metric(&self) -> crate::metrics::Channel {
        crate::metrics::Channel::Smtp
    }

    fn accepted(&self, queue_id: &str) -> Vec<u8> {
        Reply::new(250, "2.0.0", &format!("Ok: queued as {queue_id}")).to_bytes()
    }

    fn sender_refused(&self, reply: &Reply) -> Vec<u8> {
        reply.to_bytes()
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

    fn bad_key(&self, error: &KeyError) -> Vec<u8> {
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
