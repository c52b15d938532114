//! The webhook outbox on PostgreSQL, shared by every node: events are
//! inserted by the acceptance and record jobs themselves (same
//! transaction); senders claim them with `FOR UPDATE SKIP LOCKED` stamped
//! `leased_by = node_id` and record them as writer jobs. As in
//! `delivery_queue.rs`, every stored time is the database's
//! (`smtp_once_now()`): the node's times arrive as waits from its clock and
//! leave as times on it.

use deadpool_postgres::ClientWrapper;

use super::housekeeping::age_of;
use super::writer::{Job, PgResult};
use super::{PgStore, classify, i64_of};
use crate::store::outbox::{EndpointHealth, EventAttempt, EventNext, NewEvent, OutboxEvent};
use crate::store::{BoxFuture, StoreError, UnixMillis, WebhookOutbox, now_millis};

/// The events of `$n` (a `text[]` of endpoint names) whose endpoint is not
/// disabled.
fn open_endpoints(n: u8) -> String {
    format!(
        "endpoint = ANY(${n}) AND NOT EXISTS (SELECT 1 FROM webhook_endpoint d
           WHERE d.name = webhook_outbox.endpoint AND d.disabled_at IS NOT NULL)"
    )
}

/// Writes `events` as columns ($1..$8, see [`EventColumns`]) in one
/// statement: pending and due at once, or (with a `lease_ms`) already
/// leased to `$9` (a node), whose sender gets them in memory. An event
/// already written (same id and endpoint) is left as it is.
pub(super) const INSERT_EVENTS: &str =
    "INSERT INTO webhook_outbox (webhook_id, endpoint, event_type, event_at, workspace,
                                 queue_id, payload, state, attempts, next_attempt_at,
                                 lease_until, leased_by, created_at, updated_at)
     SELECT e.id, e.endpoint, e.type, e.at, e.workspace, e.queue_id, e.payload,
            CASE WHEN e.lease IS NULL THEN 'pending' ELSE 'sending' END, 0, t,
            t + e.lease, CASE WHEN e.lease IS NOT NULL THEN $9 END, t, t
     FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[],
                 $6::text[], $7::text[], $8::bigint[])
            AS e(id, endpoint, type, at, workspace, queue_id, payload, lease),
          smtp_once_now() AS t
     ON CONFLICT (webhook_id, endpoint) DO NOTHING";

/// Events as the arrays of [`INSERT_EVENTS`].
pub(super) struct EventColumns {
    ids: Vec<String>,
    endpoints: Vec<String>,
    types: Vec<String>,
    at: Vec<i64>,
    workspaces: Vec<String>,
    queue_ids: Vec<Option<String>>,
    payloads: Vec<String>,
    leases: Vec<Option<i64>>,
}

impl EventColumns {
    pub(super) fn of(events: &[NewEvent]) -> Self {
        let column = |f: fn(&NewEvent) -> String| events.iter().map(f).collect::<Vec<_>>();
        Self {
            ids: column(|e| e.webhook_id.clone()),
            endpoints: column(|e| e.endpoint.clone()),
            types: column(|e| e.event_type.clone()),
            at: events.iter().map(|e| e.at).collect(),
            workspaces: column(|e| e.workspace.clone()),
            queue_ids: events.iter().map(|e| e.queue_id.clone()).collect(),
            payloads: column(|e| e.payload.clone()),
            leases: events.iter().map(|e| e.lease_ms).collect(),
        }
    }

    /// `$1..$9`, with `node` as the holder of leased events.
    pub(super) fn params<'a>(
        &'a self,
        node: &'a String,
    ) -> [&'a (dyn tokio_postgres::types::ToSql + Sync); 9] {
        [
            &self.ids,
            &self.endpoints,
            &self.types,
            &self.at,
            &self.workspaces,
            &self.queue_ids,
            &self.payloads,
            &self.leases,
            node,
        ]
    }
}

/// Writes `events` ([`INSERT_EVENTS`]).
pub(super) async fn insert_events(
    c: &ClientWrapper,
    events: &[NewEvent],
    node: &str,
) -> PgResult<()> {
    if events.is_empty() {
        return Ok(());
    }
    let columns = EventColumns::of(events);
    let node = node.to_owned();
    let stmt = c.prepare_cached(INSERT_EVENTS).await?;
    c.execute(&stmt, &columns.params(&node)).await?;
    Ok(())
}

/// Leases due events, oldest due first: pending ones due by now and
/// `sending` ones whose lease ended (a dead node's). Each kind is locked
/// up to `limit` (skipping rows another node holds), then the oldest
/// `limit` of both are leased; a row locked but not picked is only skipped
/// by other nodes until this batch commits.
async fn claim_on(
    c: &ClientWrapper,
    lease: i64,
    node: &str,
    limit: i64,
    endpoints: &[String],
) -> PgResult<Vec<OutboxEvent>> {
    let sql = format!(
        "WITH due AS (
           SELECT id, next_attempt_at AS t FROM webhook_outbox
           WHERE state = 'pending' AND next_attempt_at <= smtp_once_now() AND {open}
           ORDER BY next_attempt_at LIMIT $4 FOR UPDATE SKIP LOCKED),
         expired AS (
           SELECT id, lease_until AS t FROM webhook_outbox
           WHERE state = 'sending' AND lease_until <= smtp_once_now() AND {open}
           ORDER BY lease_until LIMIT $4 FOR UPDATE SKIP LOCKED),
         picked AS (
           SELECT id FROM (SELECT * FROM due UNION ALL SELECT * FROM expired) d
           ORDER BY t LIMIT $4)
         UPDATE webhook_outbox w SET state = 'sending', lease_until = smtp_once_now() + $1,
           leased_by = $2, updated_at = smtp_once_now()
         FROM picked WHERE w.id = picked.id
         RETURNING w.id, w.webhook_id, w.endpoint, w.event_type, w.payload, w.attempts,
                   w.event_at",
        open = open_endpoints(3)
    );
    let rows = c
        .query(
            &c.prepare_cached(&sql).await?,
            &[&lease, &node, &endpoints, &limit],
        )
        .await?;
    let mut events: Vec<((i64, i64), OutboxEvent)> = rows
        .iter()
        .map(|r| {
            let attempts: i32 = r.get(5);
            (
                (r.get::<_, i64>(6), r.get::<_, i64>(0)),
                OutboxEvent {
                    webhook_id: r.get(1),
                    endpoint: r.get(2),
                    event_type: r.get(3),
                    payload: r.get(4),
                    attempts: u32::try_from(attempts).unwrap_or(0),
                },
            )
        })
        .collect();
    // Oldest event first, so a receiver mostly sees them in order.
    events.sort_by_key(|(at_and_id, _)| *at_and_id);
    Ok(events.into_iter().map(|(_, e)| e).collect())
}

/// The attempt, the end of its lease and the endpoint's health in one
/// statement: a success clears `failing_since`, a failure sets it if it is
/// not set, `disable` disables. The health comes back on the node's clock.
async fn record_on(c: &ClientWrapper, a: &EventAttempt) -> PgResult<EndpointHealth> {
    let (state, next) = match a.next {
        EventNext::Delivered => ("delivered", None),
        EventNext::RetryAt(at) => ("pending", Some(at)),
        EventNext::Failed => ("failed", None),
    };
    // The node's retry time, as a wait from its clock.
    let wait = next.map(|t| t - a.at);
    let status = a.status.map(i32::from);
    let stmt = c
        .prepare_cached(
            "WITH attempt AS (
               UPDATE webhook_outbox SET state = $2, attempts = attempts + 1,
                 next_attempt_at = smtp_once_now() + $3::bigint, lease_until = NULL,
                 leased_by = NULL, last_status = $4, last_error = $5,
                 updated_at = smtp_once_now()
               WHERE webhook_id = $1 AND endpoint = $6)
             INSERT INTO webhook_endpoint AS h (name, failing_since, disabled_at, disabled_reason)
             VALUES ($6,
                     CASE WHEN $2 = 'delivered' THEN NULL ELSE smtp_once_now() END,
                     CASE WHEN $7::text IS NOT NULL THEN smtp_once_now() END,
                     $7::text)
             ON CONFLICT (name) DO UPDATE SET
               failing_since = CASE WHEN $2 = 'delivered' THEN NULL
                                    ELSE COALESCE(h.failing_since, excluded.failing_since) END,
               disabled_at = COALESCE(excluded.disabled_at, h.disabled_at),
               disabled_reason = CASE WHEN excluded.disabled_at IS NOT NULL
                                      THEN excluded.disabled_reason ELSE h.disabled_reason END
             RETURNING failing_since - smtp_once_now(), disabled_at IS NOT NULL",
        )
        .await?;
    let row = c
        .query_one(
            &stmt,
            &[
                &a.webhook_id,
                &state,
                &wait,
                &status,
                &a.error,
                &a.endpoint,
                &a.disable,
            ],
        )
        .await?;
    // In: how long ago, on the database's clock.
    let failing_for: Option<i64> = row.get(0);
    Ok(EndpointHealth {
        failing_since: failing_for.map(|ago| a.at.saturating_add(ago)),
        disabled: row.get(1),
    })
}

impl WebhookOutbox for PgStore {
    fn claim_events(
        &self,
        now: UnixMillis,
        lease_until: UnixMillis,
        limit: usize,
        endpoints: Vec<String>,
    ) -> BoxFuture<'static, Result<Vec<OutboxEvent>, StoreError>> {
        let lease = (lease_until - now).max(1);
        let node = self.node_id.clone();
        let limit = i64_of(limit);
        self.submit(Job::new(false, String::new(), move |c| {
            let (node, endpoints) = (node.clone(), endpoints.clone());
            Box::pin(async move { claim_on(c, lease, &node, limit, &endpoints).await })
        }))
    }

    fn record_event(
        &self,
        attempt: EventAttempt,
    ) -> BoxFuture<'static, Result<EndpointHealth, StoreError>> {
        let attempt = std::sync::Arc::new(attempt);
        self.submit(Job::new(false, String::new(), move |c| {
            let a = attempt.clone();
            Box::pin(async move { record_on(c, &a).await })
        }))
    }

    /// At the database's time, like every stored time.
    fn unclaim_event(
        &self,
        webhook_id: String,
        endpoint: String,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        self.submit(Job::new(false, String::new(), move |c| {
            let (webhook_id, endpoint) = (webhook_id.clone(), endpoint.clone());
            Box::pin(async move {
                c.execute(
                    "UPDATE webhook_outbox SET state = 'pending', lease_until = NULL,
                       leased_by = NULL, next_attempt_at = smtp_once_now(),
                       updated_at = smtp_once_now()
                     WHERE webhook_id = $1 AND endpoint = $2 AND state = 'sending'",
                    &[&webhook_id, &endpoint],
                )
                .await
                .map(|_| ())
            })
        }))
    }

    fn disable_endpoint(
        &self,
        endpoint: String,
        _at: UnixMillis,
        reason: String,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        self.submit(Job::new(false, String::new(), move |c| {
            let (endpoint, reason) = (endpoint.clone(), reason.clone());
            Box::pin(async move {
                c.execute(
                    "INSERT INTO webhook_endpoint (name, disabled_at, disabled_reason)
                     VALUES ($1, smtp_once_now(), $2)
                     ON CONFLICT (name) DO UPDATE SET
                       disabled_at = excluded.disabled_at,
                       disabled_reason = excluded.disabled_reason",
                    &[&endpoint, &reason],
                )
                .await?;
                Ok(())
            })
        }))
    }

    fn next_event_due(
        &self,
        endpoints: Vec<String>,
    ) -> BoxFuture<'static, Result<Option<UnixMillis>, StoreError>> {
        let pool = self.pool.clone();
        Box::pin(async move {
            let c = PgStore::reader(&pool).await?;
            let sql = format!(
                "SELECT LEAST(
                   (SELECT MIN(next_attempt_at) FROM webhook_outbox
                    WHERE state = 'pending' AND {open}),
                   (SELECT MIN(lease_until) FROM webhook_outbox
                    WHERE state = 'sending' AND {open})) - smtp_once_now()",
                open = open_endpoints(1)
            );
            let stmt = c.prepare_cached(&sql).await.map_err(|e| classify(&e))?;
            let row = c
                .query_one(&stmt, &[&endpoints])
                .await
                .map_err(|e| classify(&e))?;
            // In: how long from now, on the database's clock.
            let wait: Option<i64> = row.get(0);
            Ok(wait.map(|w| now_millis().saturating_add(w)))
        })
    }

    /// This node's leases only: the others' belong to live nodes. The
    /// event stays due at its old time.
    fn release_events(&self, _now: UnixMillis) -> BoxFuture<'static, Result<usize, StoreError>> {
        let node = self.node_id.clone();
        self.submit(Job::new(false, String::new(), move |c| {
            let node = node.clone();
            Box::pin(async move {
                let n = c
                    .execute(
                        "UPDATE webhook_outbox SET state = 'pending', lease_until = NULL,
                            leased_by = NULL
                         WHERE state = 'sending' AND leased_by = $1",
                        &[&node],
                    )
                    .await?;
                Ok(usize::try_from(n).unwrap_or(usize::MAX))
            })
        }))
    }

    fn purge_events(
        &self,
        before: UnixMillis,
        limit: usize,
    ) -> BoxFuture<'static, Result<usize, StoreError>> {
        self.purge(
            "DELETE FROM webhook_outbox WHERE id IN (SELECT id FROM webhook_outbox
               WHERE state IN ('delivered', 'failed')
                 AND updated_at <= smtp_once_now() - $1 LIMIT $2)",
            vec![age_of(before), i64_of(limit)],
        )
    }

    fn events_queued(&self) -> BoxFuture<'static, ()> {
        let events = self.wakers.events.clone();
        Box::pin(async move { events.notified().await })
    }
}
