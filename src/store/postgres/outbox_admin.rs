//! The operators' own connection to the shared outbox (`smtp-once webhooks
//! ...`), usable while nodes run: no node id, no writer; each change is a
//! short transaction that also NOTIFYs the senders, so a redelivered event
//! goes out at once on whichever node is free.

use tokio_postgres::types::ToSql;

use super::own_connection::OwnConnection;
use super::{EVENTS_CHANNEL, classify};
use crate::store::outbox::{
    DisabledEndpoint, EndpointBacklog, EventStatus, OutboxAdmin, RECENT_FOR_ERRORS,
};
use crate::store::{BoxFuture, StoreError, UnixMillis};

pub struct PgOutboxAdmin {
    /// Connected again when the connection was lost (the console's lives
    /// as long as the daemon).
    conn: OwnConnection,
}

const STATUS_COLUMNS: &str = "webhook_id, endpoint, event_type, event_at, queue_id, state,
     attempts, next_attempt_at, last_status, last_error";

fn event_status(r: &tokio_postgres::Row) -> EventStatus {
    let attempts: i32 = r.get(6);
    let last_status: Option<i32> = r.get(8);
    EventStatus {
        webhook_id: r.get(0),
        endpoint: r.get(1),
        event_type: r.get(2),
        at: r.get(3),
        queue_id: r.get(4),
        state: r.get(5),
        attempts: u32::try_from(attempts).unwrap_or(0),
        next_attempt_at: r.get(7),
        last_status: last_status.and_then(|s| u16::try_from(s).ok()),
        last_error: r.get(9),
    }
}

impl PgOutboxAdmin {
    /// Connects with the store's settings (TLS with `ca_file`, timeouts).
    pub async fn connect(url: &str, ca_file: Option<&std::path::Path>) -> Result<Self, StoreError> {
        Ok(Self {
            conn: OwnConnection::connect(url, ca_file, "webhooks admin").await?,
        })
    }

    /// Runs `sql` in a transaction that NOTIFYs the senders if it changed
    /// a row (delivered on COMMIT).
    async fn change(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<usize, StoreError> {
        let mut client = self.conn.client().await?;
        let tx = client.transaction().await.map_err(|e| classify(&e))?;
        let n = tx.execute(sql, params).await.map_err(|e| classify(&e))?;
        if n > 0 {
            tx.batch_execute(&format!("NOTIFY {EVENTS_CHANNEL}"))
                .await
                .map_err(|e| classify(&e))?;
        }
        tx.commit().await.map_err(|e| classify(&e))?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }
}

impl OutboxAdmin for PgOutboxAdmin {
    fn recent(
        &self,
        endpoint: Option<&str>,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<EventStatus>, StoreError>> {
        let endpoint = endpoint.map(str::to_owned);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        Box::pin(async move {
            let client = self.conn.client().await?;
            let rows = client
                .query(
                    &format!(
                        "SELECT {STATUS_COLUMNS} FROM webhook_outbox
                         WHERE $1::text IS NULL OR endpoint = $1 ORDER BY id DESC LIMIT $2"
                    ),
                    &[&endpoint, &limit],
                )
                .await
                .map_err(|e| classify(&e))?;
            Ok(rows.iter().map(event_status).collect())
        })
    }

    /// Due now on the database's clock (`now` is the operator's).
    fn redeliver_one<'a>(
        &'a self,
        endpoint: Option<&'a str>,
        webhook_id: &'a str,
        _now: UnixMillis,
    ) -> BoxFuture<'a, Result<usize, StoreError>> {
        Box::pin(async move {
            self.change(
                "UPDATE webhook_outbox SET state = 'pending', attempts = 0,
                    next_attempt_at = smtp_once_now(), lease_until = NULL, leased_by = NULL,
                    updated_at = smtp_once_now()
                 WHERE webhook_id = $2 AND ($1::text IS NULL OR endpoint = $1)
                   AND state <> 'sending'",
                &[&endpoint, &webhook_id],
            )
            .await
        })
    }

    fn redeliver_since<'a>(
        &'a self,
        endpoint: &'a str,
        since: UnixMillis,
        _now: UnixMillis,
    ) -> BoxFuture<'a, Result<usize, StoreError>> {
        Box::pin(async move {
            self.change(
                "UPDATE webhook_outbox SET state = 'pending', attempts = 0,
                    next_attempt_at = smtp_once_now(), lease_until = NULL, leased_by = NULL,
                    updated_at = smtp_once_now()
                 WHERE endpoint = $1 AND event_at >= $2 AND state <> 'sending'",
                &[&endpoint, &since],
            )
            .await
        })
    }

    fn enable<'a>(&'a self, endpoint: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let changed = self
                .change(
                    "UPDATE webhook_endpoint SET disabled_at = NULL, disabled_reason = NULL,
                        failing_since = NULL
                     WHERE name = $1 AND disabled_at IS NOT NULL",
                    &[&endpoint],
                )
                .await?;
            Ok(changed > 0)
        })
    }

    fn disabled(&self) -> BoxFuture<'_, Result<Vec<DisabledEndpoint>, StoreError>> {
        Box::pin(async move {
            let client = self.conn.client().await?;
            let rows = client
                .query(
                    "SELECT name, disabled_at, disabled_reason FROM webhook_endpoint
                     WHERE disabled_at IS NOT NULL ORDER BY name",
                    &[],
                )
                .await
                .map_err(|e| classify(&e))?;
            Ok(rows
                .iter()
                .map(|r| DisabledEndpoint {
                    endpoint: r.get(0),
                    at: r.get(1),
                    reason: r.get::<_, Option<String>>(2).unwrap_or_default(),
                })
                .collect())
        })
    }

    fn for_message<'a>(
        &'a self,
        queue_id: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<EventStatus>, StoreError>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        Box::pin(async move {
            let client = self.conn.client().await?;
            let rows = client
                .query(
                    &format!(
                        "SELECT {STATUS_COLUMNS} FROM webhook_outbox
                         WHERE queue_id = $1 ORDER BY id DESC LIMIT $2"
                    ),
                    &[&queue_id, &limit],
                )
                .await
                .map_err(|e| classify(&e))?;
            Ok(rows.iter().map(event_status).collect())
        })
    }

    fn backlog(
        &self,
        endpoints: Vec<String>,
    ) -> BoxFuture<'_, Result<Vec<EndpointBacklog>, StoreError>> {
        Box::pin(async move {
            let client = self.conn.client().await?;
            let mut out = Vec::with_capacity(endpoints.len());
            for endpoint in endpoints {
                let row = client
                    .query_one(
                        "SELECT
                           (SELECT COUNT(*) FROM webhook_outbox
                            WHERE state IN ('pending', 'sending') AND endpoint = $1),
                           (SELECT failing_since FROM webhook_endpoint WHERE name = $1),
                           e.updated_at, e.last_error
                         FROM (SELECT 1) one LEFT JOIN LATERAL (
                           SELECT updated_at, last_error FROM (
                             SELECT updated_at, last_error FROM webhook_outbox
                             WHERE endpoint = $1 ORDER BY id DESC LIMIT $2
                           ) recent WHERE last_error IS NOT NULL
                           ORDER BY updated_at DESC LIMIT 1
                         ) e ON true",
                        &[&endpoint, &RECENT_FOR_ERRORS],
                    )
                    .await
                    .map_err(|e| classify(&e))?;
                let waiting: i64 = row.get(0);
                let at: Option<i64> = row.get(2);
                let error: Option<String> = row.get(3);
                out.push(EndpointBacklog {
                    endpoint,
                    waiting: waiting.unsigned_abs(),
                    failing_since: row.get(1),
                    last_error: at.zip(error),
                });
            }
            Ok(out)
        })
    }
}
