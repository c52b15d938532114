//! Read-only access for the operator commands (`status`, `queue`). It takes
//! no lock, so it works while the daemon runs (WAL readers never block).

use std::path::Path;

use rusqlite::{Connection, OptionalExtension, Row, params};

use super::{DB_FILE, classify, open_connection};
use crate::store::{AttemptRecord, MessageState, MessageStatus, StoreError};

pub struct Inspector {
    conn: Connection,
}

pub(super) const COLUMNS: &str =
    "id, state, workspace, account, reverse_path, recipients, size, attempts,
                       last_error, created_at, next_attempt_at";

pub(super) fn status_from_row(row: &Row<'_>) -> rusqlite::Result<MessageStatus> {
    let state: String = row.get(1)?;
    let recipients: String = row.get(5)?;
    Ok(MessageStatus {
        id: row.get(0)?,
        state: MessageState::parse(&state).unwrap_or(MessageState::Queued),
        workspace: row.get(2)?,
        account: row.get(3)?,
        reverse_path: row.get(4)?,
        recipients: recipients.lines().map(str::to_owned).collect(),
        size: row.get::<_, i64>(6)?.max(0).unsigned_abs(),
        attempts: row.get(7)?,
        last_error: row.get(8)?,
        created_at: row.get(9)?,
        next_attempt_at: row.get(10)?,
    })
}

impl Inspector {
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        let path = data_dir.join(DB_FILE);
        if !path.exists() {
            return Err(StoreError::Unavailable(format!(
                "no queue database at {} (has the daemon run with this data_dir?)",
                path.display()
            )));
        }
        let conn = open_connection(&path, true).map_err(classify)?;
        Ok(Self { conn })
    }

    pub fn message(&self, id: &str) -> Result<MessageStatus, StoreError> {
        self.conn
            .query_row(
                &format!("SELECT {COLUMNS} FROM queue WHERE id = ?1"),
                [id],
                status_from_row,
            )
            .optional()
            .map_err(classify)?
            .ok_or_else(|| StoreError::NotFound(format!("no message with queue id {id}")))
    }

    /// Messages in queue-id (acceptance) order, optionally of one state.
    pub fn messages(
        &self,
        state: Option<MessageState>,
        limit: usize,
    ) -> Result<Vec<MessageStatus>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT {COLUMNS} FROM queue WHERE (?1 IS NULL OR state = ?1) ORDER BY id LIMIT ?2"
            ))
            .map_err(classify)?;
        let rows = stmt
            .query_map(
                params![state.map(MessageState::as_str), limit],
                status_from_row,
            )
            .map_err(classify)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(classify)
    }

    /// The stored message as it will be relayed: trace header + body.
    pub fn raw_message(&self, id: &str) -> Result<Vec<u8>, StoreError> {
        let (trace, mut body): (String, Vec<u8>) = self
            .conn
            .query_row(
                "SELECT trace, body FROM message_body WHERE queue_id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(classify)?
            .ok_or_else(|| StoreError::NotFound(format!("no message with queue id {id}")))?;
        let mut raw = trace.into_bytes();
        raw.append(&mut body);
        Ok(raw)
    }

    pub fn count(&self) -> Result<u64, StoreError> {
        self.conn
            .query_row("SELECT COUNT(*) FROM queue", [], |r| r.get::<_, i64>(0))
            .map(i64::unsigned_abs)
            .map_err(classify)
    }

    /// Every delivery attempt of a message, oldest first (none for a
    /// database that predates delivery).
    pub fn attempts(&self, id: &str) -> Result<Vec<AttemptRecord>, StoreError> {
        let has_table: bool = self
            .conn
            .query_row(
                "SELECT EXISTS(SELECT 1 FROM sqlite_master WHERE name = 'delivery_attempt')",
                [],
                |r| r.get(0),
            )
            .map_err(classify)?;
        if !has_table {
            return Ok(Vec::new());
        }
        attempts_on(&self.conn, id).map_err(classify)
    }
}

/// A message's delivery attempts, oldest first.
pub(super) fn attempts_on(conn: &Connection, id: &str) -> rusqlite::Result<Vec<AttemptRecord>> {
    conn.prepare_cached(
        "SELECT at, recipient, outcome, reply, next_hop FROM delivery_attempt
         WHERE queue_id = ?1 ORDER BY id",
    )?
    .query_map([id], |r| {
        Ok(AttemptRecord {
            at: r.get(0)?,
            recipient: r.get(1)?,
            outcome: r.get(2)?,
            reply: r.get(3)?,
            next_hop: r.get(4)?,
        })
    })?
    .collect()
}
