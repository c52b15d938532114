//! `QueueAdmin` on PostgreSQL: the operators' own connection to the shared
//! queue, usable from any host while nodes deliver. Each mutation locks the
//! message's row (`FOR UPDATE`, so it waits for a claim or a record in
//! progress), decides on the database's clock (`smtp_once_now()`, as
//! leases do), and NOTIFYs the workers when it made a message due.

use tokio::sync::Mutex;
use tokio_postgres::Transaction;

use super::status::{COLUMNS, attempt_of, status_of};
use super::{QUEUED_CHANNEL, classify, connect_one};
use crate::store::admin::{AdminAction, AdminError, ListFilter, QueueAdmin, decide};
use crate::store::{BoxFuture, MessageDetail, MessageState, MessageStatus, StoreError};

pub struct PgQueueAdmin {
    /// Behind a lock: a transaction needs the client to itself.
    client: Mutex<tokio_postgres::Client>,
}

/// The locked row, as the decision needs it.
struct Current {
    state: MessageState,
    attempts: i32,
    /// `(leased_by, lease_until)` while the lease is live.
    live_lease: Option<(Option<String>, i64)>,
}

fn db(e: tokio_postgres::Error) -> AdminError {
    AdminError::Store(classify(&e))
}

impl PgQueueAdmin {
    /// Connects with the store's settings (TLS with `ca_file`, timeouts).
    pub async fn connect(url: &str, ca_file: Option<&std::path::Path>) -> Result<Self, StoreError> {
        let client = connect_one(url, ca_file, "queue admin").await?;
        Ok(Self {
            client: Mutex::new(client),
        })
    }
}

/// The message's row, locked until the transaction ends.
async fn locked(tx: &Transaction<'_>, id: &str) -> Result<Current, AdminError> {
    let row = tx
        .query_opt(
            "SELECT state, attempts, leased_by, lease_until,
                    COALESCE(lease_until > smtp_once_now(), false)
             FROM queue WHERE id = $1 FOR UPDATE",
            &[&id],
        )
        .await
        .map_err(db)?
        .ok_or_else(|| AdminError::NotFound(id.to_owned()))?;
    let state: String = row.get(0);
    let state = MessageState::parse(&state).ok_or_else(|| AdminError::UnknownState {
        id: id.to_owned(),
        state,
    })?;
    let live: bool = row.get(4);
    let until: Option<i64> = row.get(3);
    Ok(Current {
        state,
        attempts: row.get(1),
        live_lease: until.filter(|_| live).map(|u| (row.get(2), u)),
    })
}

/// Commits; when the change made a message due, the workers are woken
/// (NOTIFY is delivered on COMMIT).
async fn commit(tx: Transaction<'_>, made_due: bool) -> Result<(), tokio_postgres::Error> {
    if made_due {
        tx.batch_execute(&format!("NOTIFY {QUEUED_CHANNEL}"))
            .await?;
    }
    tx.commit().await
}

impl QueueAdmin for PgQueueAdmin {
    fn list(&self, filter: ListFilter) -> BoxFuture<'_, Result<Vec<MessageStatus>, StoreError>> {
        Box::pin(async move {
            let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
            let state = filter.state.map(MessageState::as_str);
            let after = filter.after.unwrap_or_default();
            let client = self.client.lock().await;
            let rows = client
                .query(
                    &format!(
                        "SELECT {COLUMNS} FROM queue
                         WHERE ($1::text IS NULL OR state = $1)
                           AND ($2::text IS NULL OR workspace = $2)
                           AND ($3::bigint IS NULL OR created_at >= $3)
                           AND ($4::bigint IS NULL OR created_at < $4)
                           AND id > $5
                         ORDER BY id LIMIT $6"
                    ),
                    &[
                        &state,
                        &filter.workspace,
                        &filter.created_from,
                        &filter.created_before,
                        &after,
                        &limit,
                    ],
                )
                .await
                .map_err(|e| classify(&e))?;
            Ok(rows.iter().map(status_of).collect())
        })
    }

    fn show<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<MessageDetail, AdminError>> {
        Box::pin(async move {
            let mut client = self.client.lock().await;
            // One snapshot: the row and its attempts agree.
            let tx = client
                .build_transaction()
                .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .await
                .map_err(db)?;
            let row = tx
                .query_opt(
                    &format!("SELECT {COLUMNS} FROM queue WHERE id = $1"),
                    &[&id],
                )
                .await
                .map_err(db)?
                .ok_or_else(|| AdminError::NotFound(id.to_owned()))?;
            let attempts = tx
                .query(
                    "SELECT at, recipient, outcome, reply, next_hop FROM delivery_attempt
                     WHERE queue_id = $1 ORDER BY id",
                    &[&id],
                )
                .await
                .map_err(db)?
                .iter()
                .map(attempt_of)
                .collect();
            tx.commit().await.map_err(db)?;
            Ok((status_of(&row), attempts))
        })
    }

    fn retry<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<MessageState, AdminError>> {
        Box::pin(async move {
            let mut client = self.client.lock().await;
            let tx = client.transaction().await.map_err(db)?;
            let current = locked(&tx, id).await?;
            let state = decide(id, AdminAction::Retry, current.state, None)?;
            tx.execute(
                "UPDATE queue SET next_attempt_at = smtp_once_now(),
                    updated_at = smtp_once_now() WHERE id = $1",
                &[&id],
            )
            .await
            .map_err(db)?;
            commit(tx, true).await.map_err(db)?;
            Ok(state)
        })
    }

    fn retry_all(&self) -> BoxFuture<'_, Result<usize, StoreError>> {
        Box::pin(async move {
            let mut client = self.client.lock().await;
            let tx = client.transaction().await.map_err(|e| classify(&e))?;
            let n = tx
                .execute(
                    "UPDATE queue SET next_attempt_at = smtp_once_now(), updated_at = smtp_once_now()
                     WHERE state IN ('queued', 'deferred') AND next_attempt_at > smtp_once_now()",
                    &[],
                )
                .await
                .map_err(|e| classify(&e))?;
            if n > 0 {
                tx.batch_execute(&format!("NOTIFY {QUEUED_CHANNEL}"))
                    .await
                    .map_err(|e| classify(&e))?;
            }
            tx.commit().await.map_err(|e| classify(&e))?;
            Ok(usize::try_from(n).unwrap_or(usize::MAX))
        })
    }

    fn hold<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<MessageState, AdminError>> {
        Box::pin(async move {
            let mut client = self.client.lock().await;
            let tx = client.transaction().await.map_err(db)?;
            let current = locked(&tx, id).await?;
            let state = decide(id, AdminAction::Hold, current.state, None)?;
            if current.state != MessageState::Held {
                // The lease stays with its node: its running attempt
                // records into the held row, which stays held.
                tx.execute(
                    "UPDATE queue SET state = 'held', updated_at = smtp_once_now() WHERE id = $1",
                    &[&id],
                )
                .await
                .map_err(db)?;
            }
            commit(tx, false).await.map_err(db)?;
            Ok(state)
        })
    }

    fn release<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<MessageState, AdminError>> {
        Box::pin(async move {
            let mut client = self.client.lock().await;
            let tx = client.transaction().await.map_err(db)?;
            let current = locked(&tx, id).await?;
            decide(id, AdminAction::Release, current.state, None)?;
            let back = if current.attempts > 0 {
                MessageState::Deferred
            } else {
                MessageState::Queued
            };
            // Due no earlier than the end of a lease still running
            // (GREATEST skips a NULL lease).
            tx.execute(
                "UPDATE queue SET state = $2,
                    next_attempt_at = GREATEST(lease_until, smtp_once_now()),
                    updated_at = smtp_once_now()
                 WHERE id = $1",
                &[&id, &back.as_str()],
            )
            .await
            .map_err(db)?;
            commit(tx, true).await.map_err(db)?;
            Ok(back)
        })
    }

    fn delete<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), AdminError>> {
        Box::pin(async move {
            let mut client = self.client.lock().await;
            let tx = client.transaction().await.map_err(db)?;
            let current = locked(&tx, id).await?;
            decide(id, AdminAction::Delete, current.state, current.live_lease)?;
            // Body and attempts go with the row (ON DELETE CASCADE).
            tx.execute("DELETE FROM queue WHERE id = $1", &[&id])
                .await
                .map_err(db)?;
            commit(tx, false).await.map_err(db)?;
            Ok(())
        })
    }
}
