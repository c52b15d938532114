//! What `/readyz` and `/metrics` ask of the PostgreSQL store: `SELECT 1`
//! inside a writer transaction (the node's writer connection, BEGIN and
//! COMMIT as for an acceptance) and the queue's depth, on a pooled
//! connection, by the database's clock.

use deadpool_postgres::ClientWrapper;

use super::classify;
use crate::store::{MessageState, QueueDepth, StoreError};

pub(super) async fn select_one(c: &ClientWrapper) -> Result<(), tokio_postgres::Error> {
    c.batch_execute("SELECT 1").await
}

pub(super) async fn queue_depth_on(c: &ClientWrapper) -> Result<QueueDepth, StoreError> {
    let rows = c
        .query(
            "SELECT state, COUNT(*) FROM queue
             WHERE state IN ('queued', 'deferred', 'delivering', 'held') GROUP BY state",
            &[],
        )
        .await
        .map_err(|e| classify(&e))?;
    let counts = rows
        .iter()
        .filter_map(|r| {
            let state: String = r.get(0);
            let n: i64 = r.get(1);
            Some((MessageState::parse(&state)?, u64::try_from(n).unwrap_or(0)))
        })
        .collect();
    let oldest_age_ms: Option<i64> = c
        .query_one(
            "SELECT smtp_once_now() - MIN(created_at) FROM queue
             WHERE state IN ('queued', 'deferred', 'delivering')",
            &[],
        )
        .await
        .map_err(|e| classify(&e))?
        .get(0);
    Ok(QueueDepth {
        counts,
        oldest_age_ms: oldest_age_ms.map(|ms| ms.max(0)),
    })
}
