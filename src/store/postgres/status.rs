//! `StatusReader` on PostgreSQL: pooled connections.

use tokio_postgres::Row;

use super::{PgStore, classify};
use crate::store::{
    AttemptRecord, BoxFuture, MessageDetail, MessageState, MessageStatus, StatusReader, StoreError,
};

pub(super) const COLUMNS: &str =
    "id, state, workspace, account, reverse_path, recipients, size, attempts,
                       last_error, created_at, next_attempt_at";

pub(super) fn status_of(r: &Row) -> MessageStatus {
    let state: String = r.get(1);
    let recipients: String = r.get(5);
    let size: i64 = r.get(6);
    let attempts: i32 = r.get(7);
    MessageStatus {
        id: r.get(0),
        state: MessageState::parse(&state).unwrap_or(MessageState::Queued),
        workspace: r.get(2),
        account: r.get(3),
        reverse_path: r.get(4),
        recipients: recipients.lines().map(str::to_owned).collect(),
        size: size.unsigned_abs(),
        attempts: u32::try_from(attempts).unwrap_or(0),
        last_error: r.get(8),
        created_at: r.get(9),
        next_attempt_at: r.get(10),
    }
}

pub(super) fn attempt_of(r: &Row) -> AttemptRecord {
    AttemptRecord {
        at: r.get(0),
        recipient: r.get(1),
        outcome: r.get(2),
        reply: r.get(3),
        next_hop: r.get(4),
    }
}

impl StatusReader for PgStore {
    fn message_in(
        &self,
        workspace: &str,
        id: &str,
    ) -> BoxFuture<'static, Result<Option<MessageDetail>, StoreError>> {
        let pool = self.pool.clone();
        let (workspace, id) = (workspace.to_owned(), id.to_owned());
        Box::pin(async move {
            let c = PgStore::reader(&pool).await?;
            let sql = format!("SELECT {COLUMNS} FROM queue WHERE id = $1 AND workspace = $2");
            let Some(row) = c
                .query_opt(&sql, &[&id, &workspace])
                .await
                .map_err(|e| classify(&e))?
            else {
                return Ok(None);
            };
            let attempts = c
                .query(
                    "SELECT at, recipient, outcome, reply, next_hop FROM delivery_attempt
                     WHERE queue_id = $1 ORDER BY id",
                    &[&id],
                )
                .await
                .map_err(|e| classify(&e))?
                .iter()
                .map(attempt_of)
                .collect();
            Ok(Some((status_of(&row), attempts)))
        })
    }

    fn list(
        &self,
        workspace: &str,
        state: Option<MessageState>,
        after: Option<String>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<MessageStatus>, StoreError>> {
        let pool = self.pool.clone();
        let workspace = workspace.to_owned();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        Box::pin(async move {
            let c = PgStore::reader(&pool).await?;
            let sql = format!(
                "SELECT {COLUMNS} FROM queue
                 WHERE workspace = $1 AND ($2::text IS NULL OR state = $2) AND id > $3
                 ORDER BY id LIMIT $4"
            );
            let state = state.map(MessageState::as_str);
            let rows = c
                .query(
                    &sql,
                    &[&workspace, &state, &after.unwrap_or_default(), &limit],
                )
                .await
                .map_err(|e| classify(&e))?;
            Ok(rows.iter().map(status_of).collect())
        })
    }
}
