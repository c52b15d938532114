//! The webhook outbox on PostgreSQL. PLACEHOLDER while it is being written:
//! every call says so (the daemon refuses `[[webhook]]` with this backend
//! until then).

use crate::store::outbox::{
    DisabledEndpoint, EndpointHealth, EventAttempt, EventStatus, OutboxAdmin, OutboxEvent,
    WebhookOutbox,
};
use crate::store::{BoxFuture, StoreError, UnixMillis};

use super::PgStore;

fn not_yet<T: Send + 'static>() -> BoxFuture<'static, Result<T, StoreError>> {
    Box::pin(async {
        Err(StoreError::Unavailable(
            "webhooks are not available with the PostgreSQL store yet".into(),
        ))
    })
}

impl WebhookOutbox for PgStore {
    fn claim_events(
        &self,
        _now: UnixMillis,
        _lease_until: UnixMillis,
        _limit: usize,
        _endpoints: Vec<String>,
    ) -> BoxFuture<'static, Result<Vec<OutboxEvent>, StoreError>> {
        not_yet()
    }
    fn record_event(
        &self,
        _attempt: EventAttempt,
    ) -> BoxFuture<'static, Result<EndpointHealth, StoreError>> {
        not_yet()
    }
    fn disable_endpoint(
        &self,
        _endpoint: String,
        _at: UnixMillis,
        _reason: String,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        not_yet()
    }
    fn next_event_due(
        &self,
        _endpoints: Vec<String>,
    ) -> BoxFuture<'static, Result<Option<UnixMillis>, StoreError>> {
        not_yet()
    }
    fn release_events(&self, _now: UnixMillis) -> BoxFuture<'static, Result<usize, StoreError>> {
        not_yet()
    }
    fn purge_events(
        &self,
        _before: UnixMillis,
        _limit: usize,
    ) -> BoxFuture<'static, Result<usize, StoreError>> {
        not_yet()
    }
    fn events_queued(&self) -> BoxFuture<'static, ()> {
        Box::pin(std::future::pending())
    }
}

pub struct PgOutboxAdmin;

impl PgOutboxAdmin {
    pub async fn connect(
        _url: &str,
        _ca_file: Option<&std::path::Path>,
    ) -> Result<Self, StoreError> {
        Err(StoreError::Unavailable(
            "webhooks are not available with the PostgreSQL store yet".into(),
        ))
    }
}

impl OutboxAdmin for PgOutboxAdmin {
    fn recent(
        &self,
        _endpoint: Option<&str>,
        _limit: usize,
    ) -> BoxFuture<'_, Result<Vec<EventStatus>, StoreError>> {
        not_yet()
    }
    fn redeliver_one<'a>(
        &'a self,
        _endpoint: Option<&'a str>,
        _webhook_id: &'a str,
        _now: UnixMillis,
    ) -> BoxFuture<'a, Result<usize, StoreError>> {
        not_yet()
    }
    fn redeliver_since<'a>(
        &'a self,
        _endpoint: &'a str,
        _since: UnixMillis,
        _now: UnixMillis,
    ) -> BoxFuture<'a, Result<usize, StoreError>> {
        not_yet()
    }
    fn enable<'a>(&'a self, _endpoint: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        not_yet()
    }
    fn disabled(&self) -> BoxFuture<'_, Result<Vec<DisabledEndpoint>, StoreError>> {
        not_yet()
    }
}
