//! `StatusReader` on SQLite: reader connections on the blocking pool.

use rusqlite::{OptionalExtension, params};

use super::SqliteStore;
use super::delivery_queue::read_blocking;
use super::inspect::{COLUMNS, attempts_on, status_from_row};
use crate::store::{
    BoxFuture, MessageDetail, MessageState, MessageStatus, StatusReader, StoreError,
};

impl StatusReader for SqliteStore {
    fn message_in(
        &self,
        workspace: &str,
        id: &str,
    ) -> BoxFuture<'static, Result<Option<MessageDetail>, StoreError>> {
        let readers = self.readers.clone();
        let (workspace, id) = (workspace.to_owned(), id.to_owned());
        Box::pin(read_blocking(readers, move |conn| {
            let Some(status) = conn
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM queue WHERE id = ?1 AND workspace = ?2"
                ))?
                .query_row(params![id, workspace], status_from_row)
                .optional()?
            else {
                return Ok(None);
            };
            let attempts = attempts_on(conn, &id)?;
            Ok(Some((status, attempts)))
        }))
    }

    fn list(
        &self,
        workspace: &str,
        state: Option<MessageState>,
        after: Option<String>,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<MessageStatus>, StoreError>> {
        let readers = self.readers.clone();
        let workspace = workspace.to_owned();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        Box::pin(read_blocking(readers, move |conn| {
            conn.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM queue
                         WHERE workspace = ?1 AND (?2 IS NULL OR state = ?2) AND id > ?3
                         ORDER BY id LIMIT ?4"
            ))?
            .query_map(
                params![
                    workspace,
                    state.map(MessageState::as_str),
                    after.unwrap_or_default(),
                    limit
                ],
                status_from_row,
            )?
            .collect()
        }))
    }
}
