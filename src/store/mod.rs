//! Durable state behind small traits, one per path: `Store` (acceptance:
//! the idempotency ledger and the outbound queue, always written together),
//! `DeliveryQueue` (delivery) and `StatusReader` (the HTTP API), with
//! `sqlite` (one node, embedded) and `postgres` (several nodes) side by side.

pub mod admin;
#[cfg(test)]
mod admin_tests;
mod batch;
pub mod delivery_queue;
pub mod outbox;
pub mod postgres;
pub mod queue_id;
pub mod sqlite;

pub use admin::{
    AdminAction, AdminError, Change, Done, ListFilter, MessageContent, QueueAdmin, Record, Recorder,
};
pub use delivery_queue::{AttemptOutcome, AttemptRow, ClaimedMessage, DeliveryQueue};
pub use outbox::{NewEvent, WebhookOutbox};

use std::future::Future;
use std::pin::Pin;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Milliseconds since the Unix epoch.
pub type UnixMillis = i64;

pub fn now_millis() -> UnixMillis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store cannot be reached at all (locked by another process,
    /// missing or read-only file, writer gone): nothing was executed.
    #[error("ledger unavailable: {0}")]
    Unavailable(String),
    /// The operation failed part-way (I/O error, disk full); it was rolled
    /// back and may be retried.
    #[error("storage failure: {0}")]
    Transient(String),
    #[error("{0}")]
    NotFound(String),
}

/// A live ledger entry: what a retry under the same key is compared with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerEntry {
    pub fingerprint: [u8; 32],
    /// The complete reply lines sent the first time (CRLF-terminated).
    pub reply: Vec<u8>,
    pub queue_id: Option<String>,
    pub created_at: UnixMillis,
    pub expires_at: UnixMillis,
}

#[cfg(test)]
impl LedgerEntry {
    /// An entry whose first answer was `250 ... queued as X`, for tests.
    pub fn queued_as_x(fingerprint_byte: u8) -> Self {
        Self {
            fingerprint: [fingerprint_byte; 32],
            reply: b"250 2.0.0 Ok: queued as X\r\n".to_vec(),
            queue_id: Some("X".into()),
            created_at: 0,
            expires_at: 1,
        }
    }
}

#[derive(Debug, Clone)]
pub struct NewLedgerEntry {
    pub workspace: String,
    pub key: String,
    pub entry: LedgerEntry,
}

/// An accepted message, as it enters the outbound queue.
#[derive(Debug, Clone)]
pub struct NewMessage {
    pub id: String,
    pub workspace: String,
    pub account: String,
    pub reverse_path: String,
    pub recipients: Vec<String>,
    pub idempotency_key: Option<String>,
    /// The header lines we prepend: our `Received:`, then the message's
    /// `DKIM-Signature:`s if it was signed (made once, at acceptance, so
    /// every relay attempt sends them unchanged). Stored apart so the body
    /// is never copied to prepend them.
    pub trace: String,
    pub body: Vec<u8>,
    /// The MAIL FROM parameters the relay honours and passes on
    /// (`REQUIRETLS`), as text; `None` for none. The store keeps it as is.
    pub mail_params: Option<String>,
    pub created_at: UnixMillis,
}

/// What one acceptance writes, atomically: a ledger entry (when the message
/// had a key), a queue row (unless it was a stored rejection), or both.
#[derive(Debug, Clone)]
pub struct Acceptance {
    pub ledger: Option<NewLedgerEntry>,
    pub message: Option<NewMessage>,
    /// Webhook events caused by this acceptance (the outbox): written with
    /// it or not at all.
    pub events: Vec<NewEvent>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitOutcome {
    Committed,
    /// A live entry for the key already exists; nothing was written.
    KeyTaken,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageState {
    Queued,
    Deferred,
    Delivering,
    Delivered,
    Failed,
    Expired,
    Held,
    /// Cancelled before every recipient had a final outcome (`DELETE
    /// /v1/messages/{id}`, `smtp-once cancel`): never attempted again;
    /// recipients delivered before stay delivered.
    Cancelled,
}

impl MessageState {
    pub fn as_str(self) -> &'static str {
        match self {
            MessageState::Queued => "queued",
            MessageState::Deferred => "deferred",
            MessageState::Delivering => "delivering",
            MessageState::Delivered => "delivered",
            MessageState::Failed => "failed",
            MessageState::Expired => "expired",
            MessageState::Held => "held",
            MessageState::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => MessageState::Queued,
            "deferred" => MessageState::Deferred,
            "delivering" => MessageState::Delivering,
            "delivered" => MessageState::Delivered,
            "failed" => MessageState::Failed,
            "expired" => MessageState::Expired,
            "held" => MessageState::Held,
            "cancelled" => MessageState::Cancelled,
            _ => return None,
        })
    }
}

/// What `smtp-once status` and `queue` show.
#[derive(Debug, Clone)]
pub struct MessageStatus {
    pub id: String,
    pub state: MessageState,
    pub workspace: String,
    pub account: String,
    pub reverse_path: String,
    pub recipients: Vec<String>,
    pub size: u64,
    pub attempts: u32,
    pub last_error: Option<String>,
    pub created_at: UnixMillis,
    pub next_attempt_at: Option<UnixMillis>,
}

/// The storage contract. Implementations must make `commit` atomic and
/// durable before it resolves: a `250` is sent right after.
pub trait Store: Send + Sync + 'static {
    /// The live (unexpired at `now`) entry for `(workspace, key)`.
    fn lookup<'a>(
        &'a self,
        workspace: &'a str,
        key: &'a str,
        now: UnixMillis,
    ) -> BoxFuture<'a, Result<Option<LedgerEntry>, StoreError>>;

    /// Writes the ledger entry and queue row in one durable transaction.
    /// An expired entry for the same key is replaced.
    fn commit(
        &self,
        acceptance: Acceptance,
    ) -> BoxFuture<'static, Result<CommitOutcome, StoreError>>;

    /// Removes up to `limit` entries expired at `now`; returns how many.
    fn purge_expired(
        &self,
        now: UnixMillis,
        limit: usize,
    ) -> BoxFuture<'static, Result<usize, StoreError>>;

    /// A trivial write transaction through the writer (nothing written):
    /// `Ok` when the store would commit an acceptance now. `/readyz`.
    fn ready(&self) -> BoxFuture<'static, Result<(), StoreError>>;

    /// Messages still in the queue per state, and how long the oldest one
    /// waiting for delivery has waited. A read; the metrics listener runs
    /// it in the background every few seconds.
    fn queue_depth(&self) -> BoxFuture<'static, Result<QueueDepth, StoreError>>;
}

/// What [`Store::queue_depth`] reads.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueDepth {
    /// Messages per state, for `queued`, `deferred`, `delivering` and
    /// `held` (a state with none may be missing).
    pub counts: Vec<(MessageState, u64)>,
    /// Age of the oldest `queued`, `deferred` or `delivering` message, by
    /// the store's clock; `None` when there is none.
    pub oldest_age_ms: Option<i64>,
}

/// A message as the status API shows it: its row and its attempts.
pub type MessageDetail = (MessageStatus, Vec<AttemptRecord>);

/// What the HTTP API shows of messages, always within one workspace.
pub trait StatusReader: Send + Sync + 'static {
    /// The message and its attempts, if it exists in `workspace` (another
    /// workspace's message is `None`, as if it did not exist).
    fn message_in(
        &self,
        workspace: &str,
        id: &str,
    ) -> BoxFuture<'static, Result<Option<MessageDetail>, StoreError>>;

    /// Up to `limit` messages of `workspace` with queue ids after `after`,
    /// in queue-id (acceptance) order, optionally of one state.
    fn list(
        &self,
        workspace: &str,
        state: Option<MessageState>,
        after: Option<String>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<MessageStatus>, StoreError>>;
}

/// One recipient's result in one delivery attempt, as `delivery_attempt`
/// holds it (read by `status`).
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    pub at: UnixMillis,
    pub recipient: String,
    /// delivered, deferred, failed or expired.
    pub outcome: String,
    /// The next hop's reply, or what went wrong.
    pub reply: String,
    pub next_hop: Option<String>,
}
