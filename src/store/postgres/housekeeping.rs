//! Purges of rows past their time (expired ledger entries, finished queue
//! rows, sent webhook events), one node at a time: each runs as a writer
//! job that deletes only if its transaction takes the housekeeping
//! advisory lock, so the other nodes' purges that turn delete nothing.

use deadpool_postgres::ClientWrapper;
use tokio_postgres::types::ToSql;

use super::PgStore;
use super::writer::{Job, PgResult};
use crate::store::{BoxFuture, StoreError, UnixMillis, now_millis};

/// Purges run on one node at a time (transaction advisory lock).
pub(super) const HOUSEKEEPING_LOCK: i64 = 0x736d_7470_6875_7367; // "smtphusg"

impl PgStore {
    /// Runs the bounded `DELETE` `sql` with `params` through the writer if
    /// no other node is purging; the rows deleted (0 if one is).
    pub(super) fn purge(
        &self,
        sql: &'static str,
        params: Vec<i64>,
    ) -> BoxFuture<'static, Result<usize, StoreError>> {
        self.submit(Job::new(false, String::new(), move |c| {
            let params = params.clone();
            Box::pin(async move {
                if !housekeeping_turn(c).await? {
                    return Ok(0);
                }
                let params: Vec<&(dyn ToSql + Sync)> =
                    params.iter().map(|p| p as &(dyn ToSql + Sync)).collect();
                let n = c.execute(sql, &params).await?;
                Ok(usize::try_from(n).unwrap_or(usize::MAX))
            })
        }))
    }
}

/// A time of this node's clock as an age, so that the database's clock
/// decides what is old enough.
pub(super) fn age_of(before: UnixMillis) -> i64 {
    now_millis().saturating_sub(before)
}

/// True if this transaction may do housekeeping (no other node is).
async fn housekeeping_turn(c: &ClientWrapper) -> PgResult<bool> {
    Ok(c.query_one(
        "SELECT pg_try_advisory_xact_lock($1)",
        &[&HOUSEKEEPING_LOCK],
    )
    .await?
    .get(0))
}
