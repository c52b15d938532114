//! The operators' view of the queue (`smtp-once status|queue|retry|hold|
//! release|delete`), the same on every backend. In plain values: the store
//! decides what a state allows and says why it refused in [`AdminError`];
//! the CLI words it.
//!
//! Each mutation is one short transaction on the message's row, usable
//! while nodes deliver: none of them can make a worker send a message
//! twice. Times are the store's clock (SQLite: this host's; PostgreSQL:
//! the database's), as for leases.

use super::{BoxFuture, MessageDetail, MessageState, MessageStatus, StoreError, UnixMillis};

/// Which messages [`QueueAdmin::list`] returns: in queue-id (acceptance)
/// order, after the cursor `after`, at most `limit`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListFilter {
    pub state: Option<MessageState>,
    pub workspace: Option<String>,
    /// Accepted at or after this time.
    pub created_from: Option<UnixMillis>,
    /// Accepted before this time.
    pub created_before: Option<UnixMillis>,
    /// The last queue id of the previous page.
    pub after: Option<String>,
    pub limit: usize,
}

/// The operator action an [`AdminError::State`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminAction {
    Retry,
    Hold,
    Release,
    Delete,
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
    #[error("{id}: cannot {action:?} a message that is {}", state.as_str())]
    State {
        id: String,
        state: MessageState,
        action: AdminAction,
    },
    #[error("{id}: has an unknown state {state:?}")]
    UnknownState { id: String, state: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What each backend implements (SQLite: `sqlite::SqliteQueueAdmin`;
/// PostgreSQL: `postgres::PgQueueAdmin`).
pub trait QueueAdmin: Send + Sync {
    fn list(&self, filter: ListFilter) -> BoxFuture<'_, Result<Vec<MessageStatus>, StoreError>>;

    /// The message and every attempt, oldest first.
    fn show<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<MessageDetail, AdminError>>;

    /// Makes a queued or deferred message due now; returns its state.
    fn retry<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<MessageState, AdminError>>;

    /// Makes every queued and deferred message not yet due, due now;
    /// returns how many.
    fn retry_all(&self) -> BoxFuture<'_, Result<usize, StoreError>>;

    /// Queued, deferred or delivering → held (held stays held). An attempt
    /// in flight finishes; if it leaves recipients pending, the message
    /// stays held.
    fn hold<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<MessageState, AdminError>>;

    /// Held → queued (never attempted) or deferred, returned; due now, or
    /// when a running attempt's lease ends, so two attempts never overlap.
    fn release<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<MessageState, AdminError>>;

    /// Removes the message, its body and its attempts, unless it is
    /// `delivering` under a live lease ([`AdminError::LiveLease`]).
    fn delete<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), AdminError>>;
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
    match (action, state) {
        (AdminAction::Retry, Queued | Deferred) => Ok(state),
        (AdminAction::Retry, _) => Err(refuse()),
        (AdminAction::Hold, Queued | Deferred | Delivering | Held) => Ok(Held),
        (AdminAction::Hold, _) => Err(refuse()),
        (AdminAction::Release, Held) => Ok(Held),
        (AdminAction::Release, _) => Err(refuse()),
        (AdminAction::Delete, Delivering) => match lease {
            Some((node, until)) => Err(AdminError::LiveLease {
                id: id.to_owned(),
                node,
                until,
            }),
            None => Ok(state),
        },
        (AdminAction::Delete, _) => Ok(state),
    }
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
    }
}
