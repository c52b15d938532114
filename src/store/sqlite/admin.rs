//! `QueueAdmin` on SQLite: the operators' own connection to the file, used
//! while the daemon runs (WAL; each mutation one `IMMEDIATE` transaction,
//! so it waits for the writer's batch instead of racing it). Every call runs
//! on the blocking pool: a busy wait must not stall an async worker of the
//! daemon (the API's routes use it).

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension, Transaction, params};

use super::delivery_queue::{insert_attempt, latest_outcomes};
use super::inspect::{COLUMNS, attempts_on, status_from_row};
use super::writer::{insert_events, insert_ledger};
use super::{DB_FILE, classify};
use crate::store::admin::{
    AdminAction, AdminError, Change, Done, ListFilter, MessageContent, QueueAdmin, Record, decide,
};
use crate::store::delivery_queue::is_final;
use crate::store::{
    BoxFuture, MessageDetail, MessageState, MessageStatus, StoreError, UnixMillis, now_millis,
};

const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

pub struct SqliteQueueAdmin {
    conn: Arc<Mutex<Connection>>,
}

/// The message's row, as the decision and the record need it.
struct Current {
    state: MessageState,
    lease_until: Option<UnixMillis>,
    attempts: i64,
    workspace: String,
    idempotency_key: Option<String>,
    recipients: Vec<String>,
}

impl SqliteQueueAdmin {
    /// Opens the existing database (the daemon created and migrated it).
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        let path = data_dir.join(DB_FILE);
        if !path.exists() {
            return Err(StoreError::Unavailable(format!(
                "no queue database at {} (has the daemon run with this data_dir?)",
                path.display()
            )));
        }
        let conn = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(classify)?;
        let setup = |conn: &Connection| -> rusqlite::Result<bool> {
            super::plan_once(conn)?;
            conn.busy_timeout(BUSY_TIMEOUT)?;
            conn.pragma_update(None, "journal_mode", "WAL")?;
            // The daemon's checkpoint thread copies the WAL back, and only
            // when the disk has room for it (checkpoint.rs): never here.
            conn.pragma_update(None, "wal_autocheckpoint", 0)?;
            // FULL: a change survives power loss, so a deleted or held
            // message is never attempted after a restart.
            conn.pragma_update(None, "synchronous", "FULL")?;
            conn.pragma_update(None, "foreign_keys", "ON")?;
            conn.query_row(
                "SELECT EXISTS(SELECT 1 FROM sqlite_master WHERE name = 'delivery_attempt')",
                [],
                |r| r.get(0),
            )
        };
        if !setup(&conn).map_err(classify)? {
            return Err(StoreError::Unavailable(
                "the queue database predates delivery; start the daemon once to migrate it".into(),
            ));
        }
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// Runs `f` on the connection on the blocking pool.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> T + Send + 'static,
    ) -> Result<T, StoreError> {
        let conn = Arc::clone(&self.conn);
        tokio::task::spawn_blocking(move || f(&mut lock(&conn)))
            .await
            .map_err(|e| StoreError::Transient(format!("queue admin task failed: {e}")))
    }
}

fn lock(conn: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
    // A panic while holding the lock cannot leave a transaction open
    // (rusqlite rolls back on drop), so a poisoned lock is still usable.
    conn.lock().unwrap_or_else(|e| e.into_inner())
}

fn db(e: rusqlite::Error) -> AdminError {
    AdminError::Store(classify(e))
}

/// The change and its record in one transaction; a refusal is written with
/// its record too (its ledger entry), a store failure writes nothing.
fn apply_on(conn: &mut Connection, change: Change) -> Result<Result<Done, AdminError>, StoreError> {
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(classify)?;
    let outcome = act_on(&tx, &change, now_millis());
    if let Err(AdminError::Store(e)) = outcome {
        return Err(e);
    }
    let record = change.recorder.map(|r| r(&outcome)).unwrap_or_default();
    match write_record(&tx, &record) {
        Ok(true) => {}
        // Dropping the transaction rolls the change back.
        Ok(false) => return Ok(Err(AdminError::KeyTaken)),
        Err(e) => return Err(classify(e)),
    }
    tx.commit().map_err(classify)?;
    Ok(outcome)
}

/// `false` when the ledger entry's key was taken meanwhile.
fn write_record(tx: &Transaction<'_>, record: &Record) -> rusqlite::Result<bool> {
    if let Some(l) = &record.ledger
        && !insert_ledger(tx, l)?
    {
        return Ok(false);
    }
    insert_events(tx, &record.events)?;
    Ok(true)
}

fn current(tx: &Transaction<'_>, change: &Change) -> Result<Current, AdminError> {
    let id = change.id.as_str();
    // The state stays text until the workspace check: another workspace's
    // message is not found whatever its state.
    let row: Option<(String, Current)> = tx
        .query_row(
            "SELECT state, lease_until, attempts, workspace, idempotency_key, recipients
             FROM queue WHERE id = ?1",
            [id],
            |r| {
                let recipients: String = r.get(5)?;
                Ok((
                    r.get(0)?,
                    Current {
                        state: MessageState::Queued,
                        lease_until: r.get(1)?,
                        attempts: r.get(2)?,
                        workspace: r.get(3)?,
                        idempotency_key: r.get(4)?,
                        recipients: recipients.lines().map(str::to_owned).collect(),
                    },
                ))
            },
        )
        .optional()
        .map_err(db)?;
    let (state, current) = row
        .filter(|(_, c)| change.workspace.as_ref().is_none_or(|w| *w == c.workspace))
        .ok_or_else(|| AdminError::NotFound(id.to_owned()))?;
    let state = MessageState::parse(&state).ok_or_else(|| AdminError::UnknownState {
        id: id.to_owned(),
        state,
    })?;
    Ok(Current { state, ..current })
}

fn act_on(tx: &Transaction<'_>, change: &Change, now: UnixMillis) -> Result<Done, AdminError> {
    let id = change.id.as_str();
    let current = current(tx, change)?;
    // One node: a lease is this host's worker's.
    let live = current.lease_until.filter(|l| *l > now).map(|l| (None, l));
    let pending = match change.action {
        AdminAction::Delete => Vec::new(),
        _ => without_final_outcome(tx, id, &current.recipients).map_err(db)?,
    };
    let state = match change.action {
        AdminAction::Retry => {
            let state = decide(id, AdminAction::Retry, current.state, None)?;
            tx.execute(
                "UPDATE queue SET next_attempt_at = ?2, updated_at = ?2 WHERE id = ?1",
                params![id, now],
            )
            .map_err(db)?;
            state
        }
        AdminAction::Hold => {
            let state = decide(id, AdminAction::Hold, current.state, None)?;
            if current.state != MessageState::Held {
                // The lease stays: a running attempt still owns it.
                tx.execute(
                    "UPDATE queue SET state = 'held', updated_at = ?2 WHERE id = ?1",
                    params![id, now],
                )
                .map_err(db)?;
            }
            state
        }
        AdminAction::Release => {
            decide(id, AdminAction::Release, current.state, None)?;
            let back = if current.attempts > 0 {
                MessageState::Deferred
            } else {
                MessageState::Queued
            };
            let due = current.lease_until.map_or(now, |l| l.max(now));
            tx.execute(
                "UPDATE queue SET state = ?2, next_attempt_at = ?3, updated_at = ?4
                 WHERE id = ?1",
                params![id, back.as_str(), due, now],
            )
            .map_err(db)?;
            back
        }
        AdminAction::Cancel => {
            let state = decide(id, AdminAction::Cancel, current.state, live)?;
            if current.state != MessageState::Cancelled {
                let reply = format!("cancelled by {}", change.actor);
                for recipient in &pending {
                    insert_attempt(tx, id, recipient, now, "cancelled", &reply, None)
                        .map_err(db)?;
                }
                tx.execute(
                    "UPDATE queue SET state = 'cancelled', lease_until = NULL, updated_at = ?2
                     WHERE id = ?1",
                    params![id, now],
                )
                .map_err(db)?;
            }
            state
        }
        AdminAction::Delete => {
            let state = decide(id, AdminAction::Delete, current.state, live)?;
            for sql in [
                "DELETE FROM delivery_attempt WHERE queue_id = ?1",
                "DELETE FROM message_body WHERE queue_id = ?1",
                "DELETE FROM queue WHERE id = ?1",
            ] {
                tx.execute(sql, [id]).map_err(db)?;
            }
            state
        }
    };
    Ok(Done {
        id: id.to_owned(),
        workspace: current.workspace,
        idempotency_key: current.idempotency_key,
        action: change.action,
        before: current.state,
        state,
        pending,
        at: now,
    })
}

/// The recipients whose latest outcome is not final (none yet, or
/// deferred), in envelope order.
fn without_final_outcome(
    tx: &Transaction<'_>,
    id: &str,
    recipients: &[String],
) -> rusqlite::Result<Vec<String>> {
    let latest = latest_outcomes(tx, id)?.into_iter().collect();
    Ok(crate::store::admin::not_final(recipients, &latest))
}

/// The statement for `filter`, with only the conditions it sets: SQLite
/// plans a statement before its values are bound, so a `?1 IS NULL OR`
/// around a condition would keep it from using an index (the key's, or
/// the primary key's range for the cursor). Paging walks the primary key.
fn list_query(filter: ListFilter) -> (String, Vec<rusqlite::types::Value>) {
    use rusqlite::types::Value;
    let mut conditions: Vec<&str> = Vec::new();
    let mut values: Vec<Value> = Vec::new();
    let mut add = |condition, value: Value| {
        conditions.push(condition);
        values.push(value);
    };
    if let Some(state) = filter.state {
        // With a key or an age, the key's index or the id range leads:
        // `queue_due` by state would walk every delivered row (165 ms at
        // 300,000 rows, against 0.2).
        let condition = if filter.key.is_some() || filter.created_from.is_some() {
            "+state = ?"
        } else if is_final(state) {
            // Finished rows are in no index but the ids (migration 7):
            // the walk in id order finds them, as common as they are.
            "state = ?"
        } else {
            // Live rows are few, and all in the partial `queue_due`,
            // which SQLite uses only when a term names its condition.
            "next_attempt_at IS NOT NULL AND state = ?"
        };
        add(condition, Value::Text(state.as_str().to_owned()));
    }
    if let Some(workspace) = filter.workspace {
        // With a key, the ledger's key index must lead (a key has one or
        // a few rows; a workspace may have millions): `+` keeps SQLite,
        // which has no statistics here, from walking `queue_workspace`.
        let condition = if filter.key.is_some() {
            "+workspace = ?"
        } else {
            "workspace = ?"
        };
        add(condition, Value::Text(workspace));
    }
    if let Some(from) = filter.created_from {
        add("created_at >= ?", Value::Integer(from));
        add(
            "id >= ?",
            Value::Text(crate::store::admin::first_id_from(from)),
        );
    }
    if let Some(before) = filter.created_before {
        add("created_at < ?", Value::Integer(before));
    }
    if let Some(key) = filter.key {
        // Through the ledger's index of key hashes (any workspace): the
        // key's entries while they live (`[idempotency] retention`), each
        // naming its queue row; the queue row's own key confirms it.
        add(
            "id IN (SELECT queue_id FROM ledger WHERE key_hash = ?)",
            Value::Integer(super::ledger_key::hash(&key)),
        );
        add("idempotency_key = ?", Value::Text(key));
    }
    if let Some(recipient) = filter.recipient {
        add(
            "instr(lower(recipients), lower(?)) > 0",
            Value::Text(recipient),
        );
    }
    if let Some(sender) = filter.sender {
        add(
            "instr(lower(reverse_path), lower(?)) > 0",
            Value::Text(sender),
        );
    }
    match (filter.after, filter.newest_first) {
        (Some(after), true) => add("id < ?", Value::Text(after)),
        (Some(after), false) => add("id > ?", Value::Text(after)),
        (None, _) => {}
    }
    let order = if filter.newest_first { "DESC" } else { "ASC" };
    let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
    values.push(Value::Integer(limit));
    let condition = if conditions.is_empty() {
        "1".to_owned()
    } else {
        conditions.join(" AND ")
    };
    (
        format!("SELECT {COLUMNS} FROM queue WHERE {condition} ORDER BY id {order} LIMIT ?"),
        values,
    )
}

impl QueueAdmin for SqliteQueueAdmin {
    fn list(&self, filter: ListFilter) -> BoxFuture<'_, Result<Vec<MessageStatus>, StoreError>> {
        Box::pin(async move {
            self.blocking(move |conn| {
                let (sql, values) = list_query(filter);
                conn.prepare_cached(&sql)
                    .and_then(|mut stmt| {
                        stmt.query_map(rusqlite::params_from_iter(values.iter()), status_from_row)?
                            .collect()
                    })
                    .map_err(classify)
            })
            .await?
        })
    }

    fn show<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<MessageDetail, AdminError>> {
        let id = id.to_owned();
        Box::pin(async move {
            self.blocking(move |conn| {
                let status = conn
                    .query_row(
                        &format!("SELECT {COLUMNS} FROM queue WHERE id = ?1"),
                        [&id],
                        status_from_row,
                    )
                    .optional()
                    .map_err(db)?
                    .ok_or_else(|| AdminError::NotFound(id.clone()))?;
                let attempts = attempts_on(conn, &id).map_err(db)?;
                Ok((status, attempts))
            })
            .await?
        })
    }

    fn content<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<MessageContent>, StoreError>> {
        let id = id.to_owned();
        Box::pin(async move {
            self.blocking(move |conn| {
                conn.query_row(
                    "SELECT q.idempotency_key, b.trace, b.body
                     FROM queue q LEFT JOIN message_body b ON b.queue_id = q.id
                     WHERE q.id = ?1",
                    [&id],
                    |r| {
                        let body: Option<Vec<u8>> = r.get(2)?;
                        Ok(MessageContent {
                            idempotency_key: r.get(0)?,
                            trace: r.get::<_, Option<String>>(1)?.unwrap_or_default(),
                            body_kept: body.is_some(),
                            body: body.unwrap_or_default(),
                        })
                    },
                )
                .optional()
                .map_err(classify)
            })
            .await?
        })
    }

    fn retry_all(&self) -> BoxFuture<'_, Result<usize, StoreError>> {
        Box::pin(async move {
            self.blocking(|conn| {
                conn.execute(
                    "UPDATE queue SET next_attempt_at = ?1, updated_at = ?1
                     WHERE state IN ('queued', 'deferred') AND next_attempt_at > ?1",
                    [now_millis()],
                )
                .map_err(classify)
            })
            .await?
        })
    }

    fn apply(&self, change: Change) -> BoxFuture<'_, Result<Result<Done, AdminError>, StoreError>> {
        Box::pin(async move { self.blocking(move |conn| apply_on(conn, change)).await? })
    }
}
