//! The delivery side's view of durable state: claim due messages with a
//! lease, record what an attempt did, give leases back. In plain values
//! (strings, states, times): the store knows no SMTP or delivery type.
//!
//! Every write goes through the same writer as acceptances, so the two
//! paths never fight over one lock and share each fsync.

use super::{BoxFuture, MessageState, NewEvent, NewMessage, StoreError, UnixMillis};

/// A claimed message with everything an attempt needs.
#[derive(Debug, Clone)]
pub struct ClaimedMessage {
    pub id: String,
    pub workspace: String,
    pub reverse_path: String,
    pub recipients: Vec<String>,
    pub idempotency_key: Option<String>,
    /// Our prepended header lines as stored: `Received:`, then any
    /// `DKIM-Signature:`s made at acceptance. Relayed as they are.
    pub trace: String,
    pub body: Vec<u8>,
    /// `NewMessage::mail_params`.
    pub mail_params: Option<String>,
    pub created_at: UnixMillis,
    /// Attempts recorded before this one.
    pub attempts: u32,
    /// Each recipient's latest recorded outcome (`delivered`, `deferred`,
    /// `failed`, `expired`).
    pub latest_outcomes: Vec<(String, String)>,
}

/// One recipient's row of an attempt.
#[derive(Debug, Clone)]
pub struct AttemptRow {
    pub recipient: String,
    pub outcome: &'static str,
    pub reply: String,
    pub next_hop: Option<String>,
}

/// What one attempt changes, written in one transaction: its rows, the
/// message's new state, and a bounce to queue, if any.
#[derive(Debug, Clone)]
pub struct AttemptOutcome {
    pub id: String,
    pub at: UnixMillis,
    pub rows: Vec<AttemptRow>,
    pub state: MessageState,
    pub next_attempt_at: Option<UnixMillis>,
    pub last_error: Option<String>,
    pub bounce: Option<NewMessage>,
    /// Webhook events caused by this attempt, written with its record.
    pub events: Vec<NewEvent>,
    /// Keep the body when this attempt finishes the message (delivered,
    /// failed or expired); otherwise it is removed in the same transaction,
    /// and the row and its attempts stay until `keep_finished`.
    pub keep_body: bool,
}

pub trait DeliveryQueue: Send + Sync + 'static {
    /// Leases up to `limit` due messages (queued or deferred and due, or
    /// with an expired lease) until `lease_until`, oldest due first, and
    /// loads them. Messages in `skip` (attempts still in flight here, even
    /// past their lease) are never claimed.
    fn claim(
        &self,
        now: UnixMillis,
        lease_until: UnixMillis,
        limit: usize,
        skip: Vec<String>,
    ) -> BoxFuture<'static, Result<Vec<ClaimedMessage>, StoreError>>;

    /// Records an attempt durably and ends its lease. Returns the state
    /// written (an operator's hold during the attempt sticks unless the
    /// attempt finished the message), or `None` when the message was
    /// deleted meanwhile.
    fn record(
        &self,
        outcome: AttemptOutcome,
    ) -> BoxFuture<'static, Result<Option<MessageState>, StoreError>>;

    /// Extends the leases of `ids` (attempts still running here) to
    /// `lease_until`, so a slow delivery is not started a second time
    /// elsewhere. Returns how many were renewed.
    fn renew(
        &self,
        ids: Vec<String>,
        now: UnixMillis,
        lease_until: UnixMillis,
    ) -> BoxFuture<'static, Result<usize, StoreError>>;

    /// When the next message becomes due (an expired lease counts, except
    /// for the messages in `skip`).
    fn next_due(
        &self,
        skip: Vec<String>,
    ) -> BoxFuture<'static, Result<Option<UnixMillis>, StoreError>>;

    /// Gives back every lease this node holds, due at `now` (at start and
    /// after the worker stopped). On a single-node store that is every
    /// lease.
    fn release_all(&self, now: UnixMillis) -> BoxFuture<'static, Result<usize, StoreError>>;

    /// Removes up to `limit` delivered, failed or expired messages (row,
    /// body, attempts) last changed at or before `before`. Ledger entries
    /// stay until they expire, so a retry still gets its replay.
    fn purge_finished(
        &self,
        before: UnixMillis,
        limit: usize,
    ) -> BoxFuture<'static, Result<usize, StoreError>>;

    /// Resolves once a message was queued (accepted, or a bounce) since the
    /// previous call returned: the worker claims it at once, not on a
    /// timer.
    fn queued(&self) -> BoxFuture<'static, ()>;
}

/// The state an attempt's outcome leaves, given the row's state when it is
/// recorded (the same rule on every backend): an operator's hold during the
/// attempt sticks unless the attempt finished the message, and a cancel
/// always sticks (a cancel is refused under a live lease, so this is an
/// attempt whose lease ran out).
pub(crate) fn after_attempt(outcome: MessageState, current: &str) -> MessageState {
    if current == MessageState::Cancelled.as_str() {
        MessageState::Cancelled
    } else if outcome == MessageState::Deferred && current == MessageState::Held.as_str() {
        MessageState::Held
    } else {
        outcome
    }
}

/// Whether a message in `state` is finished: no attempt will need its body.
pub(crate) fn is_final(state: MessageState) -> bool {
    matches!(
        state,
        MessageState::Delivered
            | MessageState::Failed
            | MessageState::Expired
            | MessageState::Cancelled
    )
}
