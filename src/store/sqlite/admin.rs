//! `QueueAdmin` on SQLite: the operators' own connection to the file, used
//! while the daemon runs (WAL; each mutation one `IMMEDIATE` transaction,
//! so it waits for the writer's batch instead of racing it).

use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension, Transaction, params};

use super::inspect::{COLUMNS, attempts_on, status_from_row};
use super::{DB_FILE, classify};
use crate::store::admin::{AdminAction, AdminError, ListFilter, QueueAdmin, decide};
use crate::store::{
    BoxFuture, MessageDetail, MessageState, MessageStatus, StoreError, UnixMillis, now_millis,
};

const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

pub struct SqliteQueueAdmin {
    conn: Mutex<Connection>,
}

/// A message's state and lease end, as the row holds them.
struct Current {
    state: MessageState,
    lease_until: Option<UnixMillis>,
    attempts: i64,
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
            conn: Mutex::new(conn),
        })
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave a transaction open
        // (rusqlite rolls back on drop), so a poisoned lock is still usable.
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the message's current row inside a write transaction;
    /// commits only when `f` succeeds.
    fn change<T>(
        &self,
        id: &str,
        f: impl FnOnce(&Transaction<'_>, Current, UnixMillis) -> Result<T, AdminError>,
    ) -> Result<T, AdminError> {
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(classify)?;
        let row: Option<(String, Option<UnixMillis>, i64)> = tx
            .query_row(
                "SELECT state, lease_until, attempts FROM queue WHERE id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()
            .map_err(classify)?;
        let (state, lease_until, attempts) =
            row.ok_or_else(|| AdminError::NotFound(id.to_owned()))?;
        let state = MessageState::parse(&state).ok_or_else(|| AdminError::UnknownState {
            id: id.to_owned(),
            state,
        })?;
        let current = Current {
            state,
            lease_until,
            attempts,
        };
        let value = f(&tx, current, now_millis())?;
        tx.commit().map_err(classify)?;
        Ok(value)
    }
}

fn db(e: rusqlite::Error) -> AdminError {
    AdminError::Store(classify(e))
}

impl QueueAdmin for SqliteQueueAdmin {
    fn list(&self, filter: ListFilter) -> BoxFuture<'_, Result<Vec<MessageStatus>, StoreError>> {
        Box::pin(async move {
            let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
            let conn = self.conn();
            conn.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM queue
                 WHERE (?1 IS NULL OR state = ?1) AND (?2 IS NULL OR workspace = ?2)
                   AND (?3 IS NULL OR created_at >= ?3) AND (?4 IS NULL OR created_at < ?4)
                   AND id > ?5
                 ORDER BY id LIMIT ?6"
            ))
            .and_then(|mut stmt| {
                stmt.query_map(
                    params![
                        filter.state.map(MessageState::as_str),
                        filter.workspace,
                        filter.created_from,
                        filter.created_before,
                        filter.after.unwrap_or_default(),
                        limit
                    ],
                    status_from_row,
                )?
                .collect()
            })
            .map_err(classify)
        })
    }

    fn show<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<MessageDetail, AdminError>> {
        Box::pin(async move {
            let conn = self.conn();
            let status = conn
                .query_row(
                    &format!("SELECT {COLUMNS} FROM queue WHERE id = ?1"),
                    [id],
                    status_from_row,
                )
                .optional()
                .map_err(db)?
                .ok_or_else(|| AdminError::NotFound(id.to_owned()))?;
            let attempts = attempts_on(&conn, id).map_err(db)?;
            Ok((status, attempts))
        })
    }

    fn retry<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<MessageState, AdminError>> {
        Box::pin(async move {
            self.change(id, |tx, current, now| {
                let state = decide(id, AdminAction::Retry, current.state, None)?;
                tx.execute(
                    "UPDATE queue SET next_attempt_at = ?2, updated_at = ?2 WHERE id = ?1",
                    params![id, now],
                )
                .map_err(db)?;
                Ok(state)
            })
        })
    }

    fn retry_all(&self) -> BoxFuture<'_, Result<usize, StoreError>> {
        Box::pin(async move {
            self.conn()
                .execute(
                    "UPDATE queue SET next_attempt_at = ?1, updated_at = ?1
                     WHERE state IN ('queued', 'deferred') AND next_attempt_at > ?1",
                    [now_millis()],
                )
                .map_err(classify)
        })
    }

    fn hold<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<MessageState, AdminError>> {
        Box::pin(async move {
            self.change(id, |tx, current, now| {
                let state = decide(id, AdminAction::Hold, current.state, None)?;
                if current.state != MessageState::Held {
                    // The lease stays: a running attempt still owns it.
                    tx.execute(
                        "UPDATE queue SET state = 'held', updated_at = ?2 WHERE id = ?1",
                        params![id, now],
                    )
                    .map_err(db)?;
                }
                Ok(state)
            })
        })
    }

    fn release<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<MessageState, AdminError>> {
        Box::pin(async move {
            self.change(id, |tx, current, now| {
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
                Ok(back)
            })
        })
    }

    fn delete<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), AdminError>> {
        Box::pin(async move {
            self.change(id, |tx, current, now| {
                // One node: the lease is this host's worker's.
                let live = current.lease_until.filter(|l| *l > now).map(|l| (None, l));
                decide(id, AdminAction::Delete, current.state, live)?;
                for sql in [
                    "DELETE FROM delivery_attempt WHERE queue_id = ?1",
                    "DELETE FROM message_body WHERE queue_id = ?1",
                    "DELETE FROM queue WHERE id = ?1",
                ] {
                    tx.execute(sql, [id]).map_err(db)?;
                }
                Ok(())
            })
        })
    }
}
