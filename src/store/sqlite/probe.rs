//! What `/readyz` and `/metrics` ask of the SQLite store: a no-op writer
//! job (the same lock, identity checks and COMMIT as an acceptance) and the
//! queue's depth, read on a reader connection.

use rusqlite::Connection;

use crate::store::{MessageState, QueueDepth, UnixMillis};

/// The queue's live states, counted over the `queue_due (state, ...)`
/// index, and the oldest waiting message.
pub(super) fn queue_depth_on(conn: &Connection, now: UnixMillis) -> rusqlite::Result<QueueDepth> {
    let mut counts = Vec::new();
    let mut stmt = conn.prepare_cached(
        "SELECT state, COUNT(*) FROM queue
         WHERE state IN ('queued', 'deferred', 'delivering', 'held') GROUP BY state",
    )?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        let state: String = row.get(0)?;
        let n: i64 = row.get(1)?;
        if let Some(state) = MessageState::parse(&state) {
            counts.push((state, u64::try_from(n).unwrap_or(0)));
        }
    }
    let oldest: Option<i64> = conn
        .prepare_cached(
            "SELECT MIN(created_at) FROM queue
             WHERE state IN ('queued', 'deferred', 'delivering')",
        )?
        .query_row([], |r| r.get(0))?;
    Ok(QueueDepth {
        counts,
        oldest_age_ms: oldest.map(|t| now.saturating_sub(t).max(0)),
    })
}
