//! The operators' view of the queue (`smtp-once status|queue|retry|hold|
//! release|cancel|delete`, and the API's message routes), the same on every
//! backend. In plain values: the store decides what a state allows and says
//! why it refused in [`AdminError`]; the CLI and the API word it.
//!
//! Each mutation is one short transaction on the message's row, usable
//! while nodes deliver: none of them can make a worker send a message
//! twice. What the caller records with it (an idempotency ledger entry, the
//! webhook events it causes) is built from its outcome by a [`Recorder`]
//! and written in the same transaction: a change is never committed without
//! its record, nor a record without its change. Times are the store's
//! clock (SQLite: this host's; PostgreSQL: the database's), as for leases.

use super::{
    BoxFuture, MessageDetail, MessageState, MessageStatus, NewEvent, NewLedgerEntry, StoreError,
    UnixMillis,
};

/// Which messages [`QueueAdmin::list`] returns: in queue-id (acceptance)
/// order (newest first with `newest_first`), after the cursor `after` in
/// that order, at most `limit`. Paging walks the primary key: no OFFSET,
/// no count, so a page costs the same at any depth of the queue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListFilter {
    pub state: Option<MessageState>,
    pub workspace: Option<String>,
    /// Accepted at or after this time.
    pub created_from: Option<UnixMillis>,
    /// Accepted before this time.
    pub created_before: Option<UnixMillis>,
    /// Only messages with one recipient containing this text (ASCII case
    /// ignored).
    pub recipient: Option<String>,
    /// Only messages whose reverse-path contains this text (ASCII case
    /// ignored).
    pub sender: Option<String>,
    /// Only messages submitted under this idempotency key (exact; the
    /// `queue_key` index).
    pub key: Option<String>,
    /// Newest first: `after` is then the smallest id of the previous page.
    pub newest_first: bool,
    /// The last queue id of the previous page.
    pub after: Option<String>,
    pub limit: usize,
}

/// What the console's message page shows beside the status: the key, the
/// trace (our `Received:` and any `DKIM-Signature:`) and the stored body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageContent {
    pub idempotency_key: Option<String>,
    /// Empty, with `body`, once the body is gone (delivered to every
    /// recipient, without `relay.keep_bodies`).
    pub trace: String,
    pub body: Vec<u8>,
    pub body_kept: bool,
}

/// An operator action on one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminAction {
    Retry,
    Hold,
    Release,
    /// Stops a message for good, keeping its row and history.
    Cancel,
    /// Removes the row, its body and its history.
    Delete,
}

impl AdminAction {
    pub fn as_str(self) -> &'static str {
        match self {
            AdminAction::Retry => "retry",
            AdminAction::Hold => "hold",
            AdminAction::Release => "release",
            AdminAction::Cancel => "cancel",
            AdminAction::Delete => "delete",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("no message with queue id {0}")]
    NotFound(String),
    /// An attempt holds a live lease on the message (`node`: who, when the
    /// store knows; `until`: the lease's end on the store's clock).
    #[error("{id}: is being delivered right now")]
    LiveLease {
        id: String,
        node: Option<String>,
        until: UnixMillis,
    },
    /// The message's state does not allow the action.
    #[error("{id}: cannot {} a message that is {}", action.as_str(), state.as_str())]
    State {
        id: String,
        state: MessageState,
        action: AdminAction,
    },
    #[error("{id}: has an unknown state {state:?}")]
    UnknownState { id: String, state: String },
    /// The record's ledger entry found its key taken by another writer
    /// (another node) since it was looked up: nothing was changed.
    #[error("the idempotency key was used concurrently; nothing was changed")]
    KeyTaken,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One operator action on one message.
pub struct Change {
    pub action: AdminAction,
    pub id: String,
    /// Only a message of this workspace (another's is [`AdminError::NotFound`],
    /// as if it did not exist); `None`: any (an operator).
    pub workspace: Option<String>,
    /// Who acted, for the history of a cancelled message.
    pub actor: String,
    /// What to write with the change, from its outcome.
    pub recorder: Option<Recorder>,
}

impl Change {
    /// The action on any workspace's message, recording nothing.
    pub fn plain(action: AdminAction, id: &str) -> Self {
        Self {
            action,
            id: id.to_owned(),
            workspace: None,
            actor: "operator".into(),
            recorder: None,
        }
    }
}

/// What a change did, as its reply and its events are built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    pub id: String,
    pub workspace: String,
    pub idempotency_key: Option<String>,
    pub action: AdminAction,
    /// The state before and after (`Delete`: after is the state before).
    pub before: MessageState,
    pub state: MessageState,
    /// The recipients without a final outcome when it acted (a cancel
    /// stopped these; a delete reports none).
    pub pending: Vec<String>,
    /// When, on the store's clock.
    pub at: UnixMillis,
}

impl Done {
    /// Whether anything changed (a hold of a held message, a cancel of a
    /// cancelled one, change nothing and cause no event).
    pub fn changed(&self) -> bool {
        self.before != self.state || matches!(self.action, AdminAction::Retry | AdminAction::Delete)
    }
}

/// What a change writes with itself: built from its outcome (refusals
/// included: a stored `409` is a ledger entry without a change), written in
/// its transaction, or the change is rolled back.
#[derive(Debug, Default)]
pub struct Record {
    pub ledger: Option<NewLedgerEntry>,
    pub events: Vec<NewEvent>,
}

/// Builds a change's [`Record`] from its outcome; runs inside the store's
/// transaction, so it must not block or wait.
pub type Recorder = Box<dyn FnOnce(&Result<Done, AdminError>) -> Record + Send + Sync>;

/// What each backend implements (SQLite: `sqlite::SqliteQueueAdmin`;
/// PostgreSQL: `postgres::PgQueueAdmin`).
pub trait QueueAdmin: Send + Sync {
    fn list(&self, filter: ListFilter) -> BoxFuture<'_, Result<Vec<MessageStatus>, StoreError>>;

    /// The message and every attempt, oldest first.
    fn show<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<MessageDetail, AdminError>>;

    /// The message's key, trace and body, whatever its workspace (the
    /// caller checked it with `show` or `StatusReader::message_in`);
    /// `None` when it is gone.
    fn content<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<MessageContent>, StoreError>>;

    /// Makes every queued and deferred message not yet due, due now;
    /// returns how many.
    fn retry_all(&self) -> BoxFuture<'_, Result<usize, StoreError>>;

    /// One action, as [`decide`] allows it, in one transaction with its
    /// record. `Err` only when the store failed (nothing was written);
    /// a refusal is `Ok(Err(_))`, written with its record.
    ///
    /// - `Retry`: a queued or deferred message due now.
    /// - `Hold`: queued, deferred or delivering → held (held stays held).
    ///   An attempt in flight finishes; if it leaves recipients pending,
    ///   the message stays held.
    /// - `Release`: held → queued (never attempted) or deferred; due now,
    ///   or when a running attempt's lease ends, so two attempts never
    ///   overlap.
    /// - `Cancel`: → cancelled, unless an attempt holds a live lease;
    ///   each recipient without a final outcome gets a `cancelled` one
    ///   (in [`Done::pending`]).
    /// - `Delete`: removes the message, its body and its attempts, unless
    ///   it is `delivering` under a live lease.
    fn apply(&self, change: Change) -> BoxFuture<'_, Result<Result<Done, AdminError>, StoreError>>;

    fn act<'a>(
        &'a self,
        action: AdminAction,
        id: &'a str,
    ) -> BoxFuture<'a, Result<MessageState, AdminError>> {
        Box::pin(async move {
            let done = self.apply(Change::plain(action, id)).await??;
            Ok(done.state)
        })
    }

    /// [`AdminAction::Retry`], recording nothing.
    fn retry<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<MessageState, AdminError>> {
        self.act(AdminAction::Retry, id)
    }

    /// [`AdminAction::Hold`], recording nothing.
    fn hold<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<MessageState, AdminError>> {
        self.act(AdminAction::Hold, id)
    }

    /// [`AdminAction::Release`], recording nothing.
    fn release<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<MessageState, AdminError>> {
        self.act(AdminAction::Release, id)
    }

    /// [`AdminAction::Delete`], recording nothing.
    fn delete<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), AdminError>> {
        Box::pin(async move { self.act(AdminAction::Delete, id).await.map(|_| ()) })
    }
}

/// What a state allows, the same rules on every backend; `Ok` is the state
/// the action leaves (for `Release`, resolved by the backend from the
/// attempts). `lease` is the live lease, if any.
pub fn decide(
    id: &str,
    action: AdminAction,
    state: MessageState,
    lease: Option<(Option<String>, UnixMillis)>,
) -> Result<MessageState, AdminError> {
    use MessageState::*;
    let refuse = || AdminError::State {
        id: id.to_owned(),
        state,
        action,
    };
    let live = |node, until| AdminError::LiveLease {
        id: id.to_owned(),
        node,
        until,
    };
    match (action, state) {
        (AdminAction::Retry, Queued | Deferred) => Ok(state),
        (AdminAction::Retry, _) => Err(refuse()),
        (AdminAction::Hold, Queued | Deferred | Delivering | Held) => Ok(Held),
        (AdminAction::Hold, _) => Err(refuse()),
        (AdminAction::Release, Held) => Ok(Held),
        (AdminAction::Release, _) => Err(refuse()),
        (AdminAction::Cancel, Delivered | Failed | Expired) => Err(refuse()),
        // A running attempt may still deliver: say so rather than claim a
        // cancel that it could overtake.
        (AdminAction::Cancel, _) => match lease {
            Some((node, until)) if state != Cancelled => Err(live(node, until)),
            _ => Ok(Cancelled),
        },
        (AdminAction::Delete, Delivering) => match lease {
            Some((node, until)) => Err(live(node, until)),
            None => Ok(state),
        },
        (AdminAction::Delete, _) => Ok(state),
    }
}

/// Of `recipients`, those whose latest outcome (`latest`: recipient →
/// outcome of its last attempt) is not final: none yet, or deferred.
pub(crate) fn not_final(
    recipients: &[String],
    latest: &std::collections::HashMap<String, String>,
) -> Vec<String> {
    recipients
        .iter()
        .filter(|r| {
            !matches!(
                latest.get(*r).map(String::as_str),
                Some("delivered" | "failed" | "expired" | "cancelled")
            )
        })
        .cloned()
        .collect()
}

/// Ids of messages accepted at or after `from` are at least this: an age
/// filter walks the ids from there instead of the whole queue. An hour
/// early, since ids carry the accepting node's clock and nodes' clocks may
/// disagree (or step back); the exact `created_at` condition stays.
pub(crate) fn first_id_from(from: super::UnixMillis) -> String {
    const CLOCK_MARGIN_MS: i64 = 3_600_000;
    super::queue_id::lower_bound(from.saturating_sub(CLOCK_MARGIN_MS))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_each_state_allows() {
        use MessageState::*;
        let ok = |a, s| decide("Q", a, s, None).is_ok();
        assert!(ok(AdminAction::Retry, Deferred) && ok(AdminAction::Retry, Queued));
        for s in [Held, Delivering, Delivered, Failed, Expired] {
            assert!(!ok(AdminAction::Retry, s), "{s:?}");
        }
        for s in [Queued, Deferred, Delivering, Held] {
            assert!(ok(AdminAction::Hold, s), "{s:?}");
        }
        assert!(!ok(AdminAction::Hold, Delivered));
        assert!(ok(AdminAction::Release, Held) && !ok(AdminAction::Release, Deferred));
        assert!(ok(AdminAction::Delete, Delivering) && ok(AdminAction::Delete, Failed));
        let live = decide(
            "Q",
            AdminAction::Delete,
            Delivering,
            Some((Some("n1".into()), 5)),
        );
        assert!(matches!(live, Err(AdminError::LiveLease { until: 5, .. })));
        // A lease on a held message does not stop its deletion.
        assert!(decide("Q", AdminAction::Delete, Held, Some((None, 5))).is_ok());
        for s in [Queued, Deferred, Held, Delivering, Cancelled] {
            assert_eq!(
                decide("Q", AdminAction::Cancel, s, None).ok(),
                Some(Cancelled)
            );
        }
        for s in [Delivered, Failed, Expired] {
            assert!(!ok(AdminAction::Cancel, s), "{s:?}");
        }
        // A live lease stops a cancel in any state an attempt runs in.
        for s in [Delivering, Held] {
            let r = decide("Q", AdminAction::Cancel, s, Some((None, 5)));
            assert!(matches!(r, Err(AdminError::LiveLease { .. })), "{s:?}");
        }
    }
}
