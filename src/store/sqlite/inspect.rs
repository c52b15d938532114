//! Reading a queue row and its attempts, shared by the status API
//! (`status.rs`) and the operator commands (`admin.rs`).

use rusqlite::{Connection, Row};

use crate::store::{AttemptRecord, MessageState, MessageStatus};

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
