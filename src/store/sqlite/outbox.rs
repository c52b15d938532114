//! The webhook outbox on SQLite: events are inserted by the acceptance and
//! record jobs themselves (same transaction), claimed and recorded by the
//! sender as writer jobs; `OutboxDb` is the operators' own connection.

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension, Transaction, params};

use super::delivery_queue::read_blocking;
use super::{DB_FILE, SqliteStore, classify, writer};
use crate::store::outbox::{
    DisabledEndpoint, EndpointBacklog, EndpointHealth, EventAttempt, EventNext, EventStatus,
    OutboxAdmin, OutboxEvent, RECENT_FOR_ERRORS, WebhookOutbox,
};
use crate::store::{BoxFuture, StoreError, UnixMillis};

/// Endpoint names may hold any character but a newline (config checks),
/// so a newline-delimited list is matched exactly by `instr`.
fn name_list(names: &[String]) -> String {
    names.join("\n")
}

const IN_LIST: &str = "instr(char(10) || ?LIST || char(10), char(10) || endpoint || char(10)) > 0
     AND endpoint NOT IN (SELECT name FROM webhook_endpoint WHERE disabled_at IS NOT NULL)";

fn filtered(sql: &str, list_param: &str) -> String {
    sql.replace("?FILTER", &IN_LIST.replace("?LIST", list_param))
}

fn claim_on(
    tx: &Transaction<'_>,
    now: UnixMillis,
    lease_until: UnixMillis,
    limit: i64,
    endpoints: &str,
) -> rusqlite::Result<Vec<OutboxEvent>> {
    let sql = filtered(
        "UPDATE webhook_outbox SET state = 'sending', lease_until = ?2, updated_at = ?1
         WHERE id IN (SELECT id FROM (
             SELECT id, due FROM (SELECT id, next_attempt_at AS due FROM webhook_outbox
               WHERE state = 'pending' AND next_attempt_at <= ?1 AND ?FILTER
               ORDER BY next_attempt_at LIMIT ?3)
             UNION ALL
             SELECT id, due FROM (SELECT id, lease_until AS due FROM webhook_outbox
               WHERE state = 'sending' AND lease_until <= ?1 AND ?FILTER LIMIT ?3))
           ORDER BY due LIMIT ?3)
         RETURNING id, webhook_id, endpoint, event_type, payload, attempts, event_at",
        "?4",
    );
    let mut stmt = tx.prepare_cached(&sql)?;
    let mut rows = stmt
        .query_map(params![now, lease_until, limit, endpoints], |r| {
            Ok((
                (r.get::<_, i64>(6)?, r.get::<_, i64>(0)?),
                OutboxEvent {
                    webhook_id: r.get(1)?,
                    endpoint: r.get(2)?,
                    event_type: r.get(3)?,
                    payload: r.get(4)?,
                    attempts: r.get(5)?,
                },
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    // Oldest event first, so a receiver mostly sees them in order.
    rows.sort_by_key(|(at_and_id, _)| *at_and_id);
    Ok(rows.into_iter().map(|(_, e)| e).collect())
}

fn record_on(tx: &Transaction<'_>, a: &EventAttempt) -> rusqlite::Result<EndpointHealth> {
    let (state, next) = match a.next {
        EventNext::Delivered => ("delivered", None),
        EventNext::RetryAt(at) => ("pending", Some(at)),
        EventNext::Failed => ("failed", None),
    };
    tx.prepare_cached(
        "UPDATE webhook_outbox SET state = ?2, attempts = attempts + 1, next_attempt_at = ?3,
            lease_until = NULL, last_status = ?4, last_error = ?5, updated_at = ?6
         WHERE webhook_id = ?1 AND endpoint = ?7",
    )?
    .execute(params![
        a.webhook_id,
        state,
        next,
        a.status,
        a.error,
        a.at,
        a.endpoint
    ])?;
    if a.next == EventNext::Delivered && a.disable.is_none() {
        tx.prepare_cached(
            "UPDATE webhook_endpoint SET failing_since = NULL
             WHERE name = ?1 AND failing_since IS NOT NULL",
        )?
        .execute([&a.endpoint])?;
        // Healthy: nothing to read back (the hot path, one event in all).
        return Ok(EndpointHealth::default());
    } else {
        tx.prepare_cached(
            "INSERT INTO webhook_endpoint (name, failing_since) VALUES (?1, ?2)
             ON CONFLICT (name) DO UPDATE SET
               failing_since = COALESCE(webhook_endpoint.failing_since, excluded.failing_since)",
        )?
        .execute(params![a.endpoint, a.at])?;
    }
    if let Some(reason) = &a.disable {
        disable_on(tx, &a.endpoint, a.at, reason)?;
    }
    let health = tx
        .prepare_cached("SELECT failing_since, disabled_at FROM webhook_endpoint WHERE name = ?1")?
        .query_row([&a.endpoint], |r| {
            Ok(EndpointHealth {
                failing_since: r.get(0)?,
                disabled: r.get::<_, Option<i64>>(1)?.is_some(),
            })
        })
        .optional()?;
    Ok(health.unwrap_or_default())
}

fn disable_on(
    tx: &Transaction<'_>,
    endpoint: &str,
    at: UnixMillis,
    reason: &str,
) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT INTO webhook_endpoint (name, disabled_at, disabled_reason) VALUES (?1, ?2, ?3)
         ON CONFLICT (name) DO UPDATE SET
           disabled_at = excluded.disabled_at, disabled_reason = excluded.disabled_reason",
    )?
    .execute(params![endpoint, at, reason])?;
    Ok(())
}

fn next_due_on(conn: &Connection, endpoints: &str) -> rusqlite::Result<Option<UnixMillis>> {
    let sql = filtered(
        "SELECT MIN(t) FROM (
           SELECT MIN(next_attempt_at) AS t FROM webhook_outbox WHERE state = 'pending' AND ?FILTER
           UNION ALL
           SELECT MIN(lease_until) FROM webhook_outbox WHERE state = 'sending' AND ?FILTER)",
        "?1",
    );
    conn.prepare_cached(&sql)?
        .query_row([endpoints], |r| r.get(0))
}

fn purge_on(tx: &Transaction<'_>, before: UnixMillis, limit: i64) -> rusqlite::Result<usize> {
    tx.prepare_cached(
        "DELETE FROM webhook_outbox WHERE id IN (
           SELECT id FROM webhook_outbox WHERE state IN ('delivered', 'failed')
             AND updated_at <= ?1 LIMIT ?2)",
    )?
    .execute(params![before, limit])
}

impl WebhookOutbox for SqliteStore {
    fn claim_events(
        &self,
        now: UnixMillis,
        lease_until: UnixMillis,
        limit: usize,
        endpoints: Vec<String>,
    ) -> BoxFuture<'static, Result<Vec<OutboxEvent>, StoreError>> {
        let endpoints = name_list(&endpoints);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.submit(writer::Job::new(false, move |tx| {
            claim_on(tx, now, lease_until, limit, &endpoints)
        }))
    }

    fn record_event(
        &self,
        attempt: EventAttempt,
    ) -> BoxFuture<'static, Result<EndpointHealth, StoreError>> {
        self.submit(writer::Job::new(false, move |tx| record_on(tx, &attempt)))
    }

    fn unclaim_event(
        &self,
        webhook_id: String,
        endpoint: String,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let now = crate::store::now_millis();
        self.submit(writer::Job::new(false, move |tx| {
            tx.prepare_cached(
                "UPDATE webhook_outbox SET state = 'pending', lease_until = NULL,
                    next_attempt_at = ?2, updated_at = ?2
                 WHERE webhook_id = ?1 AND endpoint = ?3 AND state = 'sending'",
            )?
            .execute(params![webhook_id, now, endpoint])
            .map(|_| ())
        }))
    }

    fn disable_endpoint(
        &self,
        endpoint: String,
        at: UnixMillis,
        reason: String,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        self.submit(writer::Job::new(false, move |tx| {
            disable_on(tx, &endpoint, at, &reason)
        }))
    }

    fn next_event_due(
        &self,
        endpoints: Vec<String>,
    ) -> BoxFuture<'static, Result<Option<UnixMillis>, StoreError>> {
        let endpoints = name_list(&endpoints);
        let readers = self.readers.clone();
        Box::pin(read_blocking(readers, move |conn| {
            next_due_on(conn, &endpoints)
        }))
    }

    fn release_events(&self, _now: UnixMillis) -> BoxFuture<'static, Result<usize, StoreError>> {
        // One process per data directory: every lease is ours or a dead
        // process's. The event stays due at its old time.
        self.submit(writer::Job::new(false, |tx| {
            tx.execute(
                "UPDATE webhook_outbox SET state = 'pending', lease_until = NULL
                 WHERE state = 'sending'",
                [],
            )
        }))
    }

    fn purge_events(
        &self,
        before: UnixMillis,
        limit: usize,
    ) -> BoxFuture<'static, Result<usize, StoreError>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.submit(writer::Job::new(false, move |tx| {
            purge_on(tx, before, limit)
        }))
    }

    fn events_queued(&self) -> BoxFuture<'static, ()> {
        let events = self.wakers.events.clone();
        Box::pin(async move { events.notified().await })
    }
}

/// The operators' own connection to a daemon's database (`smtp-once
/// webhooks ...`): short transactions that wait for the daemon's writer.
pub struct OutboxDb {
    conn: Mutex<Connection>,
}

impl OutboxDb {
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        let path = data_dir.join(DB_FILE);
        if !path.exists() {
            return Err(StoreError::Unavailable(format!(
                "no database at {} (has the daemon run with this data_dir?)",
                path.display()
            )));
        }
        let conn = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(classify)?;
        super::plan_once(&conn).map_err(classify)?;
        conn.busy_timeout(Duration::from_secs(5))
            .map_err(classify)?;
        // Never checkpoint from here: the daemon's checkpoint thread does.
        conn.pragma_update(None, "wal_autocheckpoint", 0)
            .map_err(classify)?;
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        let mut conn = self
            .conn
            .lock()
            .map_err(|_| StoreError::Transient("connection poisoned".into()))?;
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(classify)?;
        let value = f(&tx).map_err(classify)?;
        tx.commit().map_err(classify)?;
        Ok(value)
    }
}

impl OutboxDb {
    /// A read on the connection, outside any write transaction (the
    /// console's pages must not take the database's write lock).
    fn read<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T, StoreError> {
        let conn = self
            .conn
            .lock()
            .map_err(|_| StoreError::Transient("connection poisoned".into()))?;
        f(&conn).map_err(classify)
    }
}

pub(crate) fn event_status(r: &rusqlite::Row<'_>) -> rusqlite::Result<EventStatus> {
    Ok(EventStatus {
        webhook_id: r.get(0)?,
        endpoint: r.get(1)?,
        event_type: r.get(2)?,
        at: r.get(3)?,
        queue_id: r.get(4)?,
        state: r.get(5)?,
        attempts: r.get(6)?,
        next_attempt_at: r.get(7)?,
        last_status: r.get(8)?,
        last_error: r.get(9)?,
    })
}

const STATUS_COLUMNS: &str =
    "webhook_id, endpoint, event_type, event_at, queue_id, state, attempts,
     next_attempt_at, last_status, last_error";

impl OutboxAdmin for OutboxDb {
    fn recent(
        &self,
        endpoint: Option<&str>,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<EventStatus>, StoreError>> {
        let endpoint = endpoint.map(str::to_owned);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        Box::pin(async move {
            self.with(|tx| {
                tx.prepare(&format!(
                    "SELECT {STATUS_COLUMNS} FROM webhook_outbox
                     WHERE ?1 IS NULL OR endpoint = ?1 ORDER BY id DESC LIMIT ?2"
                ))?
                .query_map(params![endpoint, limit], event_status)?
                .collect()
            })
        })
    }

    fn redeliver_one<'a>(
        &'a self,
        endpoint: Option<&'a str>,
        webhook_id: &'a str,
        now: UnixMillis,
    ) -> BoxFuture<'a, Result<usize, StoreError>> {
        Box::pin(async move {
            self.with(|tx| {
                tx.execute(
                    "UPDATE webhook_outbox SET state = 'pending', attempts = 0,
                        next_attempt_at = ?3, lease_until = NULL, updated_at = ?3
                     WHERE webhook_id = ?2 AND (?1 IS NULL OR endpoint = ?1)
                       AND state <> 'sending'",
                    params![endpoint, webhook_id, now],
                )
            })
        })
    }

    fn redeliver_since<'a>(
        &'a self,
        endpoint: &'a str,
        since: UnixMillis,
        now: UnixMillis,
    ) -> BoxFuture<'a, Result<usize, StoreError>> {
        Box::pin(async move {
            self.with(|tx| {
                tx.execute(
                    "UPDATE webhook_outbox SET state = 'pending', attempts = 0,
                        next_attempt_at = ?3, lease_until = NULL, updated_at = ?3
                     WHERE endpoint = ?1 AND event_at >= ?2 AND state <> 'sending'",
                    params![endpoint, since, now],
                )
            })
        })
    }

    fn enable<'a>(&'a self, endpoint: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            self.with(|tx| {
                let changed = tx.execute(
                    "UPDATE webhook_endpoint SET disabled_at = NULL, disabled_reason = NULL,
                        failing_since = NULL
                     WHERE name = ?1 AND disabled_at IS NOT NULL",
                    [endpoint],
                )?;
                Ok(changed > 0)
            })
        })
    }

    fn disabled(&self) -> BoxFuture<'_, Result<Vec<DisabledEndpoint>, StoreError>> {
        Box::pin(async move {
            self.with(|tx| {
                tx.prepare(
                    "SELECT name, disabled_at, disabled_reason FROM webhook_endpoint
                     WHERE disabled_at IS NOT NULL ORDER BY name",
                )?
                .query_map([], |r| {
                    Ok(DisabledEndpoint {
                        endpoint: r.get(0)?,
                        at: r.get(1)?,
                        reason: r.get::<_, Option<String>>(2)?.unwrap_or_default(),
                    })
                })?
                .collect()
            })
        })
    }

    fn for_message<'a>(
        &'a self,
        queue_id: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<EventStatus>, StoreError>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        Box::pin(async move {
            self.read(|conn| {
                conn.prepare_cached(&format!(
                    "SELECT {STATUS_COLUMNS} FROM webhook_outbox
                     WHERE queue_id = ?1 ORDER BY id DESC LIMIT ?2"
                ))?
                .query_map(params![queue_id, limit], event_status)?
                .collect()
            })
        })
    }

    fn backlog(
        &self,
        endpoints: Vec<String>,
    ) -> BoxFuture<'_, Result<Vec<EndpointBacklog>, StoreError>> {
        Box::pin(async move {
            self.read(|conn| {
                let mut out = Vec::with_capacity(endpoints.len());
                for endpoint in endpoints {
                    let waiting: i64 = conn
                        .prepare_cached(
                            "SELECT COUNT(*) FROM webhook_outbox
                             WHERE state IN ('pending', 'sending') AND endpoint = ?1",
                        )?
                        .query_row([&endpoint], |r| r.get(0))?;
                    let failing_since: Option<i64> = conn
                        .prepare_cached(
                            "SELECT failing_since FROM webhook_endpoint WHERE name = ?1",
                        )?
                        .query_row([&endpoint], |r| r.get(0))
                        .optional()?
                        .flatten();
                    let last_error = conn
                        .prepare_cached(
                            "SELECT updated_at, last_error FROM (
                                SELECT updated_at, last_error FROM webhook_outbox
                                WHERE endpoint = ?1 ORDER BY id DESC LIMIT ?2
                             ) WHERE last_error IS NOT NULL ORDER BY updated_at DESC LIMIT 1",
                        )?
                        .query_row(params![endpoint, RECENT_FOR_ERRORS], |r| {
                            Ok((r.get(0)?, r.get(1)?))
                        })
                        .optional()?;
                    out.push(EndpointBacklog {
                        endpoint,
                        waiting: waiting.unsigned_abs(),
                        failing_since,
                        last_error,
                    });
                }
                Ok(out)
            })
        })
    }
}

#[cfg(test)]
#[path = "outbox_tests.rs"]
mod tests;
