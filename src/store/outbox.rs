//! The webhook outbox: delivery-status events written in the same
//! transaction as the state change that causes them (an acceptance, an
//! attempt's record), then sent by the webhook sender. In plain values
//! (names, JSON text, times): the store knows no webhook or HTTP type.
//!
//! One row per event and endpoint; `webhook_id` is the event's stable id,
//! the same on every retry and on a manual redelivery.

use super::{BoxFuture, StoreError, UnixMillis};

/// An event to write with its state change, for one endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    pub webhook_id: String,
    pub endpoint: String,
    pub event_type: String,
    /// When the state change happened (the payload says the same).
    pub at: UnixMillis,
    pub workspace: String,
    pub queue_id: Option<String>,
    /// The JSON body, exactly as it is sent and signed.
    pub payload: String,
    /// `Some(ms)`: written already leased to this node's sender for that
    /// long (`sending`), because it is handed to the sender in memory
    /// after the commit; `None`: `pending`, for a claim.
    pub lease_ms: Option<i64>,
}

/// A claimed event: leased to this sender until its attempt is recorded.
/// `(webhook_id, endpoint)` names its row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEvent {
    pub webhook_id: String,
    pub endpoint: String,
    pub event_type: String,
    pub payload: String,
    /// Attempts recorded before this one.
    pub attempts: u32,
}

/// What to do with an event after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventNext {
    /// The endpoint answered 2xx: done.
    Delivered,
    /// Try again at this time.
    RetryAt(UnixMillis),
    /// The schedule is exhausted: kept (listable, redeliverable), not sent.
    Failed,
}

/// One attempt's result, written in one transaction with the endpoint's
/// health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventAttempt {
    pub webhook_id: String,
    pub endpoint: String,
    pub at: UnixMillis,
    /// The HTTP status, if the endpoint answered.
    pub status: Option<u16>,
    /// What went wrong (timeout, connection refused, a non-2xx answer).
    pub error: Option<String>,
    pub next: EventNext,
    /// Disable the endpoint with this reason (a 410, or failing too long).
    pub disable: Option<String>,
}

/// An endpoint's health after an attempt was recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EndpointHealth {
    /// Since when every attempt failed (`None` after a success).
    pub failing_since: Option<UnixMillis>,
    pub disabled: bool,
}

/// An outbox row as the operator commands list it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventStatus {
    pub webhook_id: String,
    pub endpoint: String,
    pub event_type: String,
    pub at: UnixMillis,
    pub queue_id: Option<String>,
    /// pending, sending, delivered or failed.
    pub state: String,
    pub attempts: u32,
    pub next_attempt_at: Option<UnixMillis>,
    pub last_status: Option<u16>,
    pub last_error: Option<String>,
}

/// An endpoint as the console's overview shows it: events waiting, and
/// its latest error among its recent events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointBacklog {
    pub endpoint: String,
    /// Events pending or being sent.
    pub waiting: u64,
    /// When the endpoint began failing, if it is failing now.
    pub failing_since: Option<UnixMillis>,
    /// The latest error among its last [`RECENT_FOR_ERRORS`] events, and
    /// when it was recorded.
    pub last_error: Option<(UnixMillis, String)>,
}

/// How many of an endpoint's latest events are searched for its last
/// error: a bounded read however many events it delivered without one.
pub const RECENT_FOR_ERRORS: i64 = 1000;

/// A disabled endpoint: when and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DisabledEndpoint {
    pub endpoint: String,
    pub at: UnixMillis,
    pub reason: String,
}

/// The sender's view of the outbox.
pub trait WebhookOutbox: Send + Sync + 'static {
    /// Leases up to `limit` due events (pending and due, or sending with
    /// an expired lease) of the given `endpoints` that are not disabled,
    /// oldest due first, until `lease_until`.
    fn claim_events(
        &self,
        now: UnixMillis,
        lease_until: UnixMillis,
        limit: usize,
        endpoints: Vec<String>,
    ) -> BoxFuture<'static, Result<Vec<OutboxEvent>, StoreError>>;

    /// Records an attempt, ends its lease, updates the endpoint's health
    /// (and disables it if asked), all in one transaction.
    fn record_event(
        &self,
        attempt: EventAttempt,
    ) -> BoxFuture<'static, Result<EndpointHealth, StoreError>>;

    /// Gives a claimed event back untried (its endpoint was disabled while
    /// it waited for a slot): due now, attempts unchanged.
    fn unclaim_event(
        &self,
        webhook_id: String,
        endpoint: String,
    ) -> BoxFuture<'static, Result<(), StoreError>>;

    /// Disables `endpoint` (it failed for too long); its events wait.
    fn disable_endpoint(
        &self,
        endpoint: String,
        at: UnixMillis,
        reason: String,
    ) -> BoxFuture<'static, Result<(), StoreError>>;

    /// When the next event of `endpoints` becomes due (an expired lease
    /// counts); disabled endpoints' events do not.
    fn next_event_due(
        &self,
        endpoints: Vec<String>,
    ) -> BoxFuture<'static, Result<Option<UnixMillis>, StoreError>>;

    /// Gives back this node's event leases (at start and at shutdown).
    fn release_events(&self, now: UnixMillis) -> BoxFuture<'static, Result<usize, StoreError>>;

    /// Removes up to `limit` delivered or failed events last changed at or
    /// before `before`.
    fn purge_events(
        &self,
        before: UnixMillis,
        limit: usize,
    ) -> BoxFuture<'static, Result<usize, StoreError>>;

    /// Resolves once an event was written since the previous call returned.
    fn events_queued(&self) -> BoxFuture<'static, ()>;
}

/// The operator commands' view (`smtp-once webhooks ...`), usable while the
/// daemon runs.
pub trait OutboxAdmin {
    /// The latest `limit` events of `endpoint` (all endpoints if `None`),
    /// newest first.
    fn recent(
        &self,
        endpoint: Option<&str>,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<EventStatus>, StoreError>>;

    /// Makes the event `webhook_id` (of `endpoint`, or of every endpoint)
    /// due again now, with its attempts reset; same `webhook_id`.
    fn redeliver_one<'a>(
        &'a self,
        endpoint: Option<&'a str>,
        webhook_id: &'a str,
        now: UnixMillis,
    ) -> BoxFuture<'a, Result<usize, StoreError>>;

    /// Makes every event of `endpoint` with an event time at or after
    /// `since` due again now.
    fn redeliver_since<'a>(
        &'a self,
        endpoint: &'a str,
        since: UnixMillis,
        now: UnixMillis,
    ) -> BoxFuture<'a, Result<usize, StoreError>>;

    /// Re-enables `endpoint`; false if it was not disabled.
    fn enable<'a>(&'a self, endpoint: &'a str) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Endpoints currently disabled.
    fn disabled(&self) -> BoxFuture<'_, Result<Vec<DisabledEndpoint>, StoreError>>;

    /// The events of the message `queue_id` (to every endpoint), newest
    /// first, at most `limit` (the `webhook_outbox_queue` index).
    fn for_message<'a>(
        &'a self,
        queue_id: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<EventStatus>, StoreError>>;

    /// Each of `endpoints`' backlog and latest error.
    fn backlog(
        &self,
        endpoints: Vec<String>,
    ) -> BoxFuture<'_, Result<Vec<EndpointBacklog>, StoreError>>;
}
