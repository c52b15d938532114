//! `QueueAdmin` on PostgreSQL: the operators' own connection to the shared
//! queue, usable from any host while nodes deliver. Each mutation locks the
//! message's row (`FOR UPDATE`, so it waits for a claim or a record in
//! progress), decides on the database's clock (`smtp_once_now()`, as
//! leases do), and NOTIFYs the workers when it made a message due.

use tokio::sync::MappedMutexGuard;
use tokio_postgres::Transaction;

use super::outbox::{EventColumns, INSERT_EVENTS};
use super::own_connection::OwnConnection;
use super::status::{COLUMNS, attempt_of, status_of};
use super::{QUEUED_CHANNEL, classify};
use crate::store::admin::{
    AdminAction, AdminError, Change, Done, ListFilter, MessageContent, QueueAdmin, Record, decide,
    not_final,
};
use crate::store::{BoxFuture, MessageDetail, MessageState, MessageStatus, StoreError};

pub struct PgQueueAdmin {
    /// Connected again when the connection was lost (the API's admin lives
    /// as long as the daemon).
    conn: OwnConnection,
}

/// The locked row, as the decision and the record need it.
struct Current {
    state: MessageState,
    attempts: i32,
    /// `(leased_by, lease_until)` while the lease is live.
    live_lease: Option<(Option<String>, i64)>,
    workspace: String,
    idempotency_key: Option<String>,
    recipients: Vec<String>,
    now: i64,
}

fn db(e: tokio_postgres::Error) -> AdminError {
    AdminError::Store(classify(&e))
}

impl PgQueueAdmin {
    /// Connects with the store's settings (TLS with `ca_file`, timeouts).
    pub async fn connect(url: &str, ca_file: Option<&std::path::Path>) -> Result<Self, StoreError> {
        Ok(Self {
            conn: OwnConnection::connect(url, ca_file, "queue admin").await?,
        })
    }

    /// The client, connected again if its connection was lost.
    async fn client(&self) -> Result<MappedMutexGuard<'_, tokio_postgres::Client>, StoreError> {
        self.conn.client().await
    }
}

/// The message's row, locked until the transaction ends; another
/// workspace's is not found.
async fn locked(tx: &Transaction<'_>, change: &Change) -> Result<Current, AdminError> {
    let id = change.id.as_str();
    let row = tx
        .query_opt(
            "SELECT state, attempts, leased_by, lease_until,
                    COALESCE(lease_until > smtp_once_now(), false),
                    workspace, idempotency_key, recipients, smtp_once_now()
             FROM queue WHERE id = $1 FOR UPDATE",
            &[&id],
        )
        .await
        .map_err(db)?
        .filter(|r| {
            change
                .workspace
                .as_ref()
                .is_none_or(|w| *w == r.get::<_, String>(5))
        })
        .ok_or_else(|| AdminError::NotFound(id.to_owned()))?;
    let state: String = row.get(0);
    let state = MessageState::parse(&state).ok_or_else(|| AdminError::UnknownState {
        id: id.to_owned(),
        state,
    })?;
    let live: bool = row.get(4);
    let until: Option<i64> = row.get(3);
    let recipients: String = row.get(7);
    Ok(Current {
        state,
        attempts: row.get(1),
        live_lease: until.filter(|_| live).map(|u| (row.get(2), u)),
        workspace: row.get(5),
        idempotency_key: row.get(6),
        recipients: recipients.lines().map(str::to_owned).collect(),
        now: row.get(8),
    })
}

/// The change on the locked row; `Ok(made_due)` with what it did.
async fn act_on(tx: &Transaction<'_>, change: &Change) -> Result<(Done, bool), AdminError> {
    let id = change.id.as_str();
    let current = locked(tx, change).await?;
    let pending = match change.action {
        AdminAction::Delete => Vec::new(),
        _ => {
            let latest = tx
                .query(
                    "SELECT recipient, outcome FROM delivery_attempt
                     WHERE queue_id = $1 ORDER BY id",
                    &[&id],
                )
                .await
                .map_err(db)?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
            not_final(&current.recipients, &latest)
        }
    };
    let (state, made_due) = match change.action {
        AdminAction::Retry => {
            let state = decide(id, AdminAction::Retry, current.state, None)?;
            tx.execute(
                "UPDATE queue SET next_attempt_at = smtp_once_now(),
                    updated_at = smtp_once_now() WHERE id = $1",
                &[&id],
            )
            .await
            .map_err(db)?;
            (state, true)
        }
        AdminAction::Hold => {
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
            (state, false)
        }
        AdminAction::Release => {
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
            (back, true)
        }
        AdminAction::Cancel => {
            let state = decide(
                id,
                AdminAction::Cancel,
                current.state,
                current.live_lease.clone(),
            )?;
            if current.state != MessageState::Cancelled {
                let reply = format!("cancelled by {}", change.actor);
                tx.execute(
                    "INSERT INTO delivery_attempt (queue_id, recipient, at, outcome, reply)
                     SELECT $1, r, smtp_once_now(), 'cancelled', $3 FROM unnest($2::text[]) AS r",
                    &[&id, &pending, &reply],
                )
                .await
                .map_err(db)?;
                tx.execute(
                    "UPDATE queue SET state = 'cancelled', lease_until = NULL, leased_by = NULL,
                        updated_at = smtp_once_now() WHERE id = $1",
                    &[&id],
                )
                .await
                .map_err(db)?;
            }
            (state, false)
        }
        AdminAction::Delete => {
            let state = decide(
                id,
                AdminAction::Delete,
                current.state,
                current.live_lease.clone(),
            )?;
            // Body and attempts go with the row (ON DELETE CASCADE).
            tx.execute("DELETE FROM queue WHERE id = $1", &[&id])
                .await
                .map_err(db)?;
            (state, false)
        }
    };
    let done = Done {
        id: id.to_owned(),
        workspace: current.workspace,
        idempotency_key: current.idempotency_key,
        action: change.action,
        before: current.state,
        state,
        pending,
        at: current.now,
    };
    Ok((done, made_due))
}

/// `false` when the ledger entry's key was taken meanwhile (by another
/// node's commit, which this insert waited for).
async fn write_record(
    tx: &Transaction<'_>,
    record: &Record,
) -> Result<bool, tokio_postgres::Error> {
    if let Some(l) = &record.ledger {
        // As an acceptance's ledger insert (`apply_acceptance`): replace
        // an entry only once it has expired.
        let ttl = l.entry.expires_at - l.entry.created_at;
        let written = tx
            .execute(
                "INSERT INTO ledger (workspace, key, fingerprint, reply, queue_id, created_at, expires_at)
                 VALUES ($1, $2, $3, $4, $5, smtp_once_now(), smtp_once_now() + $6)
                 ON CONFLICT (workspace, key) DO UPDATE SET
                   fingerprint = excluded.fingerprint, reply = excluded.reply,
                   queue_id = excluded.queue_id, created_at = excluded.created_at,
                   expires_at = excluded.expires_at
                 WHERE ledger.expires_at <= excluded.created_at",
                &[
                    &l.workspace,
                    &l.key,
                    &&l.entry.fingerprint[..],
                    &l.entry.reply,
                    &l.entry.queue_id,
                    &ttl,
                ],
            )
            .await?;
        if written == 0 {
            return Ok(false);
        }
    }
    if !record.events.is_empty() {
        let columns = EventColumns::of(&record.events);
        let node = String::new();
        tx.execute(INSERT_EVENTS, &columns.params(&node)).await?;
    }
    Ok(true)
}

/// The change and its record in one transaction (see `SqliteQueueAdmin`).
async fn apply_on(
    client: &mut tokio_postgres::Client,
    change: Change,
) -> Result<Result<Done, AdminError>, StoreError> {
    let tx = client.transaction().await.map_err(|e| classify(&e))?;
    let (outcome, made_due) = match act_on(&tx, &change).await {
        Ok((done, made_due)) => (Ok(done), made_due),
        Err(AdminError::Store(e)) => return Err(e),
        Err(refused) => (Err(refused), false),
    };
    let record = change.recorder.map(|r| r(&outcome)).unwrap_or_default();
    // Dropping the transaction rolls the change back.
    if !write_record(&tx, &record).await.map_err(|e| classify(&e))? {
        return Ok(Err(AdminError::KeyTaken));
    }
    // NOTIFY is delivered on COMMIT: the workers wake for a message due.
    if made_due {
        tx.batch_execute(&format!("NOTIFY {QUEUED_CHANNEL}"))
            .await
            .map_err(|e| classify(&e))?;
    }
    tx.commit().await.map_err(|e| classify(&e))?;
    Ok(outcome)
}

type SqlValue = Box<dyn tokio_postgres::types::ToSql + Sync + Send>;

/// The statement for `filter`, with only the conditions it sets (as on
/// SQLite: each one then plainly usable by its index). Paging walks the
/// primary key.
fn list_query(filter: ListFilter) -> (String, Vec<SqlValue>) {
    let mut conditions: Vec<String> = Vec::new();
    let mut values: Vec<SqlValue> = Vec::new();
    let mut add = |condition: &str, value: SqlValue| {
        values.push(value);
        conditions.push(condition.replace('?', &format!("${}", values.len())));
    };
    if let Some(state) = filter.state {
        add("state = ?", Box::new(state.as_str()));
    }
    if let Some(workspace) = filter.workspace {
        add("workspace = ?", Box::new(workspace));
    }
    if let Some(from) = filter.created_from {
        add("created_at >= ?", Box::new(from));
        add(
            "id >= ?",
            Box::new(crate::store::admin::first_id_from(from)),
        );
    }
    if let Some(before) = filter.created_before {
        add("created_at < ?", Box::new(before));
    }
    if let Some(key) = filter.key {
        add("idempotency_key = ?", Box::new(key));
    }
    if let Some(recipient) = filter.recipient {
        add(
            "strpos(lower(recipients), lower(?)) > 0",
            Box::new(recipient),
        );
    }
    if let Some(sender) = filter.sender {
        add(
            "strpos(lower(reverse_path), lower(?)) > 0",
            Box::new(sender),
        );
    }
    match (filter.after, filter.newest_first) {
        (Some(after), true) => add("id < ?", Box::new(after)),
        (Some(after), false) => add("id > ?", Box::new(after)),
        (None, _) => {}
    }
    let order = if filter.newest_first { "DESC" } else { "ASC" };
    let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
    values.push(Box::new(limit));
    let condition = if conditions.is_empty() {
        "true".to_owned()
    } else {
        conditions.join(" AND ")
    };
    let sql = format!(
        "SELECT {COLUMNS} FROM queue WHERE {condition} ORDER BY id {order} LIMIT ${}",
        values.len()
    );
    (sql, values)
}

impl QueueAdmin for PgQueueAdmin {
    fn list(&self, filter: ListFilter) -> BoxFuture<'_, Result<Vec<MessageStatus>, StoreError>> {
        Box::pin(async move {
            let (sql, values) = list_query(filter);
            let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = values
                .iter()
                .map(|v| v.as_ref() as &(dyn tokio_postgres::types::ToSql + Sync))
                .collect();
            let client = self.client().await?;
            let rows = client
                .query(&sql, &params)
                .await
                .map_err(|e| classify(&e))?;
            Ok(rows.iter().map(status_of).collect())
        })
    }

    fn content<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<MessageContent>, StoreError>> {
        Box::pin(async move {
            let client = self.client().await?;
            let row = client
                .query_opt(
                    "SELECT q.idempotency_key, b.trace, b.body
                     FROM queue q LEFT JOIN message_body b ON b.queue_id = q.id
                     WHERE q.id = $1",
                    &[&id],
                )
                .await
                .map_err(|e| classify(&e))?;
            Ok(row.map(|r| {
                let body: Option<Vec<u8>> = r.get(2);
                MessageContent {
                    idempotency_key: r.get(0),
                    trace: r.get::<_, Option<String>>(1).unwrap_or_default(),
                    body_kept: body.is_some(),
                    body: body.unwrap_or_default(),
                }
            }))
        })
    }

    fn show<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<MessageDetail, AdminError>> {
        Box::pin(async move {
            let mut client = self.client().await?;
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

    fn retry_all(&self) -> BoxFuture<'_, Result<usize, StoreError>> {
        Box::pin(async move {
            let mut client = self.client().await?;
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

    fn apply(&self, change: Change) -> BoxFuture<'_, Result<Result<Done, AdminError>, StoreError>> {
        Box::pin(async move {
            let mut client = self.client().await?;
            apply_on(&mut client, change).await
        })
    }
}
