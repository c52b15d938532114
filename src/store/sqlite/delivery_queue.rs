//! The delivery queue on SQLite: claims, records, releases and purges run
//! as jobs of the one writer thread (group-committed with acceptances);
//! loading claimed messages and finding the next due time use readers.

use std::collections::HashMap;
use std::sync::Arc;

use rusqlite::{Connection, OptionalExtension, Transaction, params};

use super::writer::insert_events;
use super::{Readers, SqliteStore, insert_message, writer};
use crate::store::delivery_queue::{after_attempt, is_final};
use crate::store::{
    AttemptOutcome, BoxFuture, ClaimedMessage, DeliveryQueue, MessageState, StoreError, UnixMillis,
};

// `queue_due` holds live rows only (schema migration 7): those with a
// next attempt. Every query of live rows names `next_attempt_at IS NOT
// NULL`, or SQLite would not use it. (`plan_once` keeps SQLite from
// preparing them again when their parameters change.)

/// `'delivering'` rows go back to the state they were claimed from.
const UNCLAIMED_STATE: &str = "CASE WHEN attempts > 0 THEN 'deferred' ELSE 'queued' END";

/// Ids are base32, so a newline-delimited list is matched exactly by
/// `instr`; the list is as long as the worker's concurrency.
fn id_list(ids: &[String]) -> String {
    ids.join("\n")
}

fn limit_param(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// One index range per state (`queue_due` is (state, next_attempt_at),
/// live rows only), each cut to `limit`: finished rows pile up in the same
/// table until they are purged, and an OR across states would scan them.
const CLAIM: &str = "UPDATE queue SET state = 'delivering', lease_until = ?2, updated_at = ?1
         WHERE id IN (SELECT id FROM (
             SELECT id, due FROM (SELECT id, next_attempt_at AS due FROM queue
               WHERE next_attempt_at IS NOT NULL AND state = 'queued' AND next_attempt_at <= ?1
                 AND instr(char(10) || ?4 || char(10), char(10) || id || char(10)) = 0
               ORDER BY next_attempt_at LIMIT ?3)
             UNION ALL
             SELECT id, due FROM (SELECT id, next_attempt_at AS due FROM queue
               WHERE next_attempt_at IS NOT NULL AND state = 'deferred' AND next_attempt_at <= ?1
                 AND instr(char(10) || ?4 || char(10), char(10) || id || char(10)) = 0
               ORDER BY next_attempt_at LIMIT ?3)
             UNION ALL
             SELECT id, due FROM (SELECT id, lease_until AS due FROM queue
               WHERE next_attempt_at IS NOT NULL AND state = 'delivering' AND lease_until <= ?1
                 AND instr(char(10) || ?4 || char(10), char(10) || id || char(10)) = 0
               LIMIT ?3))
           ORDER BY due LIMIT ?3)
         RETURNING id, next_attempt_at";

fn claim_on(
    tx: &Transaction<'_>,
    now: UnixMillis,
    lease_until: UnixMillis,
    limit: usize,
    skip: &str,
) -> rusqlite::Result<Vec<String>> {
    let mut stmt = tx.prepare_cached(CLAIM)?;
    let mut claimed = stmt
        .query_map(params![now, lease_until, limit_param(limit), skip], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, Option<i64>>(1)?))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    claimed.sort_by_key(|(_, due)| *due);
    Ok(claimed.into_iter().map(|(id, _)| id).collect())
}

fn load_on(conn: &Connection, id: &str) -> rusqlite::Result<Option<ClaimedMessage>> {
    let row = conn
        .prepare_cached(
            "SELECT q.reverse_path, q.recipients, q.idempotency_key, q.workspace, q.created_at,
                    q.attempts, b.trace, b.body, b.mail_params
             FROM queue q JOIN message_body b ON b.queue_id = q.id WHERE q.id = ?1",
        )?
        .query_row([id], |r| {
            let recipients: String = r.get(1)?;
            Ok(ClaimedMessage {
                id: id.to_owned(),
                reverse_path: r.get(0)?,
                recipients: recipients.lines().map(str::to_owned).collect(),
                idempotency_key: r.get(2)?,
                workspace: r.get(3)?,
                created_at: r.get(4)?,
                attempts: r.get(5)?,
                trace: r.get(6)?,
                body: r.get(7)?,
                mail_params: r.get(8)?,
                latest_outcomes: Vec::new(),
            })
        })
        .optional()?;
    let Some(mut msg) = row else {
        return Ok(None);
    };
    if msg.attempts > 0 {
        msg.latest_outcomes = latest_outcomes(conn, id)?;
    }
    Ok(Some(msg))
}

pub(super) fn latest_outcomes(
    conn: &Connection,
    id: &str,
) -> rusqlite::Result<Vec<(String, String)>> {
    let mut stmt = conn.prepare_cached(
        "SELECT recipient, outcome FROM delivery_attempt WHERE queue_id = ?1 ORDER BY id",
    )?;
    let mut latest = HashMap::new();
    for row in stmt.query_map([id], |r| Ok((r.get::<_, String>(0)?, r.get(1)?)))? {
        let (recipient, outcome): (String, String) = row?;
        latest.insert(recipient, outcome);
    }
    Ok(latest.into_iter().collect())
}

fn record_on(tx: &Transaction<'_>, o: &AttemptOutcome) -> rusqlite::Result<Option<MessageState>> {
    let current: Option<String> = tx
        .prepare_cached("SELECT state FROM queue WHERE id = ?1")?
        .query_row([&o.id], |r| r.get(0))
        .optional()?;
    let Some(current) = current else {
        return Ok(None);
    };
    for row in &o.rows {
        insert_attempt(
            tx,
            &o.id,
            &row.recipient,
            o.at,
            row.outcome,
            &row.reply,
            row.next_hop.as_deref(),
        )?;
    }
    let state = after_attempt(o.state, &current);
    // An attempt that only delivered keeps an earlier failure visible,
    // unless the whole message is now delivered.
    tx.prepare_cached(
        "UPDATE queue SET state = ?2, attempts = attempts + 1, next_attempt_at = ?3,
            last_error = CASE WHEN ?4 IS NOT NULL THEN ?4
                              WHEN ?2 = 'delivered' THEN NULL ELSE last_error END,
            lease_until = NULL, updated_at = ?5
         WHERE id = ?1",
    )?
    .execute(params![
        o.id,
        state.as_str(),
        o.next_attempt_at,
        o.last_error,
        o.at
    ])?;
    // Finished: nothing will send it again (`relay.keep_bodies`).
    if is_final(state) && !o.keep_body {
        tx.prepare_cached("DELETE FROM message_body WHERE queue_id = ?1")?
            .execute([&o.id])?;
    }
    if let Some(bounce) = &o.bounce {
        insert_message(tx, bounce)?;
    }
    insert_events(tx, &o.events)?;
    Ok(Some(state))
}

const LAST_ATTEMPT: &str = "SELECT COALESCE(MAX(id), 0) FROM delivery_attempt WHERE queue_id = ?1";
const INSERT_ATTEMPT: &str =
    "INSERT INTO delivery_attempt (queue_id, id, recipient, at, outcome, reply, next_hop)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";

/// One recipient's attempt row, numbered after the message's earlier ones
/// (the table is keyed by `(queue_id, id)`, schema migration 7). Delivery
/// records here, operators' cancellations in `admin`.
pub(super) fn insert_attempt(
    tx: &Transaction<'_>,
    queue_id: &str,
    recipient: &str,
    at: UnixMillis,
    outcome: &str,
    reply: &str,
    next_hop: Option<&str>,
) -> rusqlite::Result<()> {
    // Two statements: the number as a subquery of the INSERT made SQLite
    // prepare the INSERT again at every execution.
    let last: i64 = tx
        .prepare_cached(LAST_ATTEMPT)?
        .query_row([queue_id], |r| r.get(0))?;
    tx.prepare_cached(INSERT_ATTEMPT)?.execute(params![
        queue_id,
        last + 1,
        recipient,
        at,
        outcome,
        reply,
        next_hop
    ])?;
    Ok(())
}

fn release_all_on(tx: &Transaction<'_>, now: UnixMillis) -> rusqlite::Result<usize> {
    // Held during an attempt that will never record: nothing waits for
    // that lease.
    tx.execute(
        "UPDATE queue SET lease_until = NULL
         WHERE next_attempt_at IS NOT NULL AND state = 'held' AND lease_until IS NOT NULL",
        [],
    )?;
    tx.execute(
        &format!(
            "UPDATE queue SET state = {UNCLAIMED_STATE}, lease_until = NULL,
                next_attempt_at = ?1, updated_at = ?1
             WHERE next_attempt_at IS NOT NULL AND state = 'delivering'"
        ),
        [now],
    )
}

fn purge_finished_on(
    tx: &Transaction<'_>,
    before: UnixMillis,
    limit: usize,
) -> rusqlite::Result<usize> {
    // Oldest first, in id order, which is acceptance order: finished rows
    // are in no index since migration 7. The walk stops at the first row
    // accepted after `before`: a row finished by then was accepted by
    // then, and one that sorts later (an id from a clock that stepped) is
    // reached once `before` has passed it.
    let mut ids = Vec::new();
    let mut stmt = tx.prepare_cached(
        "SELECT id, state IN ('delivered', 'failed', 'expired', 'cancelled'),
                    updated_at, created_at
             FROM queue ORDER BY id",
    )?;
    let mut rows = stmt.query([])?;
    while ids.len() < limit
        && let Some(r) = rows.next()?
    {
        let (finished, updated_at, created_at): (bool, i64, i64) =
            (r.get(1)?, r.get(2)?, r.get(3)?);
        if created_at > before {
            break;
        }
        if finished && updated_at <= before {
            ids.push(r.get::<_, String>(0)?);
        }
    }
    drop(rows);
    drop(stmt);
    for id in &ids {
        tx.execute("DELETE FROM delivery_attempt WHERE queue_id = ?1", [id])?;
        tx.execute("DELETE FROM message_body WHERE queue_id = ?1", [id])?;
        tx.execute("DELETE FROM queue WHERE id = ?1", [id])?;
    }
    Ok(ids.len())
}

const NEXT_DUE: &str = "SELECT MIN(t) FROM (
           SELECT MIN(next_attempt_at) AS t FROM queue
             WHERE next_attempt_at IS NOT NULL AND state = 'queued'
           UNION ALL
           SELECT MIN(next_attempt_at) FROM queue
             WHERE next_attempt_at IS NOT NULL AND state = 'deferred'
           UNION ALL
           SELECT MIN(lease_until) FROM queue
             WHERE next_attempt_at IS NOT NULL AND state = 'delivering'
             AND instr(char(10) || ?1 || char(10), char(10) || id || char(10)) = 0)";

fn next_due_on(conn: &Connection, skip: &str) -> rusqlite::Result<Option<UnixMillis>> {
    conn.prepare_cached(NEXT_DUE)?
        .query_row([skip], |r| r.get(0))
}

/// Runs a read on the blocking pool: a batch of claimed bodies can be large.
pub(super) async fn read_blocking<T: Send + 'static>(
    readers: Arc<Readers>,
    f: impl FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(move || readers.read(f))
        .await
        .map_err(|e| StoreError::Transient(format!("reader task failed: {e}")))?
}

impl DeliveryQueue for SqliteStore {
    fn claim(
        &self,
        now: UnixMillis,
        lease_until: UnixMillis,
        limit: usize,
        skip: Vec<String>,
    ) -> BoxFuture<'static, Result<Vec<ClaimedMessage>, StoreError>> {
        let skip = id_list(&skip);
        let claimed = self.submit(writer::Job::new(false, move |tx| {
            claim_on(tx, now, lease_until, limit, &skip)
        }));
        let readers = self.readers.clone();
        Box::pin(async move {
            let ids = claimed.await?;
            if ids.is_empty() {
                return Ok(Vec::new());
            }
            // Loaded after COMMIT: a reader sees the claim. A message that
            // fails to load keeps its lease and is tried when it expires.
            read_blocking(readers, move |conn| {
                let mut out = Vec::with_capacity(ids.len());
                for id in &ids {
                    out.extend(load_on(conn, id)?);
                }
                Ok(out)
            })
            .await
        })
    }

    fn record(
        &self,
        outcome: AttemptOutcome,
    ) -> BoxFuture<'static, Result<Option<MessageState>, StoreError>> {
        let queues_mail = outcome.bounce.is_some();
        let queues_events = !outcome.events.is_empty();
        self.submit(writer::Job::with_events(
            writer::Job::new(queues_mail, move |tx| record_on(tx, &outcome)),
            queues_events,
        ))
    }

    fn renew(
        &self,
        ids: Vec<String>,
        _now: UnixMillis,
        lease_until: UnixMillis,
    ) -> BoxFuture<'static, Result<usize, StoreError>> {
        let ids = id_list(&ids);
        self.submit(writer::Job::new(false, move |tx| {
            tx.prepare_cached(
                "UPDATE queue SET lease_until = ?1
                 WHERE next_attempt_at IS NOT NULL AND state = 'delivering'
                   AND instr(char(10) || ?2 || char(10), char(10) || id || char(10)) > 0",
            )?
            .execute(params![lease_until, ids])
        }))
    }

    fn next_due(
        &self,
        skip: Vec<String>,
    ) -> BoxFuture<'static, Result<Option<UnixMillis>, StoreError>> {
        let readers = self.readers.clone();
        let skip = id_list(&skip);
        Box::pin(read_blocking(readers, move |conn| next_due_on(conn, &skip)))
    }

    fn release_all(&self, now: UnixMillis) -> BoxFuture<'static, Result<usize, StoreError>> {
        self.submit(writer::Job::new(false, move |tx| release_all_on(tx, now)))
    }

    fn purge_finished(
        &self,
        before: UnixMillis,
        limit: usize,
    ) -> BoxFuture<'static, Result<usize, StoreError>> {
        self.submit(writer::Job::new(false, move |tx| {
            purge_finished_on(tx, before, limit)
        }))
    }

    fn queued(&self) -> BoxFuture<'static, ()> {
        let queued = self.wakers.mail.clone();
        Box::pin(async move { queued.notified().await })
    }
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
