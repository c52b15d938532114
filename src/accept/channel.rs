//! How a channel words what the acceptance pipeline decided
//! ([`ChannelWording`]; each front implements it in its own words:
//! `server::wording` for SMTP, `http::channel` for HTTP), and where it takes
//! the idempotency key from. The pipeline, the claims and the ledger are the
//! same for both; only the bytes differ. What
//! `accepted` and `sender_refused` return is what the ledger stores and a
//! replay gives back byte for byte, so one channel's entries are never
//! replayed on the other: their fingerprints differ (see `KeySource`).

use crate::content_check::ContentFault;
use crate::message::key_header::IdempotencyKeyError;
use crate::message::mime_limits::MimeLimitError;
use crate::store::LedgerEntry;

use super::from_header::SenderRefusal;

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

/// A front's words for the pipeline's outcomes. (The channel itself, as a
/// metrics label, is `metrics::Channel`.)
pub trait ChannelWording: Send + Sync {
    /// Which channel, for the submissions metric.
    fn metric(&self) -> crate::metrics::Channel;
    /// The answer for a queued message (stored under its key).
    fn accepted(&self, queue_id: &str) -> Vec<u8>;
    /// A `From:` header the account may not use (stored under its key).
    fn sender_refused(&self, refusal: &SenderRefusal) -> Vec<u8>;
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
    fn bad_key(&self, error: &IdempotencyKeyError) -> Vec<u8>;
    /// The MIME structure is over the server's limits.
    fn over_limits(&self, error: &MimeLimitError) -> Vec<u8>;
    /// The content breaks the one content rule (bare CR or LF, NUL).
    fn content_refused(&self, fault: &ContentFault) -> Vec<u8>;
    /// More `Received:` fields than `limit`: a mail loop.
    fn too_many_hops(&self, count: usize, limit: usize) -> Vec<u8>;
    /// The message could not be analysed (an internal failure).
    fn analysis_failed(&self) -> Vec<u8>;
    /// The DKIM signature could not be made; nothing was queued.
    fn signing_failed(&self) -> Vec<u8>;
}
