//! The PostgreSQL store: several nodes on one database, exactly once across
//! them. A unique constraint on `(workspace, key)` is the source of truth;
//! the ledger entry and the queue row go in one transaction, group-committed
//! by each node's writer; an acceptance still in flight on another node
//! holds its uncommitted ledger row, which a second node's insert waits for
//! and then finds taken (E01004), and which a crashed node's dropped
//! connection releases by itself. Times come from the database's clock.

mod queue;
mod schema;
mod writer;

use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::{ClientWrapper, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio::sync::{Notify, mpsc, oneshot};

use super::{
    Acceptance, BoxFuture, CommitOutcome, LedgerEntry, NewMessage, Store, StoreError, UnixMillis,
};
use writer::{Job, PgResult};

/// How long a caller waits for a connection (or for one to be made)
/// before the ledger counts as unavailable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Purges run on one node at a time (transaction advisory lock).
const HOUSEKEEPING_LOCK: i64 = 0x736d_7470_6875_7367; // "smtphusg"

pub struct PgStore {
    pool: Pool,
    jobs: Mutex<Option<mpsc::UnboundedSender<Job>>>,
    queued: Arc<Notify>,
    node_id: String,
}

/// Plain values, so configuration can hand them over without this module
/// knowing the config types.
pub struct PgOptions<'a> {
    pub url: &'a str,
    pub pool_size: usize,
    pub ca_file: Option<&'a std::path::Path>,
    pub node_id: &'a str,
}

impl PgStore {
    /// Connects, migrates the schema (one node at a time; refuses a schema
    /// newer than this binary) and starts the writer.
    pub async fn open(o: PgOptions<'_>) -> Result<Self, StoreError> {
        let config = tokio_postgres::Config::from_str(o.url)
            .map_err(|e| StoreError::Unavailable(format!("store.url: {e}")))?;
        let tls = crate::tls::client_config(o.ca_file).map_err(StoreError::Unavailable)?;
        let manager = Manager::from_config(
            config,
            tokio_postgres_rustls::MakeRustlsConnect::new(tls),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(o.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(CONNECT_TIMEOUT))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .recycle_timeout(Some(CONNECT_TIMEOUT))
            .build()
            .map_err(|e| StoreError::Unavailable(format!("PostgreSQL pool: {e}")))?;
        let mut client = pool
            .get()
            .await
            .map_err(|e| StoreError::Unavailable(format!("cannot connect to PostgreSQL: {e}")))?;
        let version = schema::migrate(&mut client).await?;
        drop(client);
        tracing::info!(
            schema_version = version,
            node_id = o.node_id,
            "PostgreSQL store open"
        );
        let (jobs, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(Notify::new());
        tokio::spawn(writer::run(pool.clone(), rx, queued.clone()));
        Ok(Self {
            pool,
            jobs: Mutex::new(Some(jobs)),
            queued,
            node_id: o.node_id.to_owned(),
        })
    }

    /// Stops the writer after the jobs already sent.
    pub fn close(&self) {
        if let Ok(mut jobs) = self.jobs.lock() {
            jobs.take();
        }
    }

    fn submit<T: Send + 'static>(
        &self,
        (job, answer): (Job, oneshot::Receiver<Result<T, StoreError>>),
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        let stopped = || StoreError::Unavailable("PostgreSQL writer has stopped".into());
        let sent = self.jobs.lock().map_err(|_| stopped()).and_then(|jobs| {
            jobs.as_ref()
                .ok_or_else(stopped)?
                .send(job)
                .map_err(|_| stopped())
        });
        Box::pin(async move {
            sent?;
            answer.await.map_err(|_| stopped())?
        })
    }

    /// A pooled connection for reads.
    async fn reader(pool: &Pool) -> Result<deadpool_postgres::Object, StoreError> {
        pool.get()
            .await
            .map_err(|e| StoreError::Unavailable(format!("PostgreSQL unreachable: {e}")))
    }
}

/// The error's words, with the server's message when there is one.
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

/// A lost or refused connection is "unavailable"; a failed statement is a
/// transient failure of that attempt.
pub(crate) fn classify(e: &tokio_postgres::Error) -> StoreError {
    if e.is_closed() || e.as_db_error().is_none() {
        StoreError::Unavailable(describe(e))
    } else {
        StoreError::Transient(describe(e))
    }
}

async fn apply_acceptance(c: &ClientWrapper, a: &Acceptance) -> PgResult<CommitOutcome> {
    if let Some(l) = &a.ledger {
        let ttl = l.entry.expires_at - l.entry.created_at;
        // Replace an entry only once it has expired; a row another node has
        // inserted but not committed makes this wait for that commit.
        let changed = c
            .execute(
                &c.prepare_cached(
                    "INSERT INTO ledger (workspace, key, fingerprint, reply, queue_id, created_at, expires_at)
                     VALUES ($1, $2, $3, $4, $5, smtp_once_now(), smtp_once_now() + $6)
                     ON CONFLICT (workspace, key) DO UPDATE SET
                       fingerprint = excluded.fingerprint, reply = excluded.reply,
                       queue_id = excluded.queue_id, created_at = excluded.created_at,
                       expires_at = excluded.expires_at
                     WHERE ledger.expires_at <= excluded.created_at",
                )
                .await?,
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
        if changed == 0 {
            return Ok(CommitOutcome::KeyTaken);
        }
    }
    if let Some(m) = &a.message {
        insert_message(c, m).await?;
    }
    Ok(CommitOutcome::Committed)
}

/// A queue row and its body, due at once (database time).
async fn insert_message(c: &ClientWrapper, m: &NewMessage) -> PgResult<()> {
    let size = i64::try_from(m.trace.len() + m.body.len()).unwrap_or(i64::MAX);
    c.execute(
        &c.prepare_cached(
            "INSERT INTO queue (id, workspace, account, reverse_path, recipients, idempotency_key,
                                size, state, attempts, next_attempt_at, created_at, updated_at)
             SELECT $1, $2, $3, $4, $5, $6, $7, 'queued', 0, t, t, t FROM smtp_once_now() AS t",
        )
        .await?,
        &[
            &m.id,
            &m.workspace,
            &m.account,
            &m.reverse_path,
            &m.recipients.join("\n"),
            &m.idempotency_key,
            &size,
        ],
    )
    .await?;
    c.execute(
        &c.prepare_cached("INSERT INTO message_body (queue_id, trace, body) VALUES ($1, $2, $3)")
            .await?,
        &[&m.id, &m.trace, &m.body],
    )
    .await?;
    Ok(())
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

impl Store for PgStore {
    fn lookup<'a>(
        &'a self,
        workspace: &'a str,
        key: &'a str,
        _now: UnixMillis,
    ) -> BoxFuture<'a, Result<Option<LedgerEntry>, StoreError>> {
        Box::pin(async move {
            let c = Self::reader(&self.pool).await?;
            let stmt = c
                .prepare_cached(
                    "SELECT fingerprint, reply, queue_id, created_at, expires_at FROM ledger
                     WHERE workspace = $1 AND key = $2 AND expires_at > smtp_once_now()",
                )
                .await
                .map_err(|e| classify(&e))?;
            let row = c
                .query_opt(&stmt, &[&workspace, &key])
                .await
                .map_err(|e| classify(&e))?;
            Ok(row.map(|r| {
                let fp: Vec<u8> = r.get(0);
                let mut fingerprint = [0u8; 32];
                if fp.len() == 32 {
                    fingerprint.copy_from_slice(&fp);
                }
                LedgerEntry {
                    fingerprint,
                    reply: r.get(1),
                    queue_id: r.get(2),
                    created_at: r.get(3),
                    expires_at: r.get(4),
                }
            }))
        })
    }

    fn commit(
        &self,
        acceptance: Acceptance,
    ) -> BoxFuture<'static, Result<CommitOutcome, StoreError>> {
        let order = acceptance
            .ledger
            .as_ref()
            .map(|l| format!("{}\n{}", l.workspace, l.key))
            .unwrap_or_default();
        let queues_mail = acceptance.message.is_some();
        let acceptance = Arc::new(acceptance);
        self.submit(Job::new(queues_mail, order, move |c| {
            let a = acceptance.clone();
            Box::pin(async move { apply_acceptance(c, &a).await })
        }))
    }

    fn purge_expired(
        &self,
        _now: UnixMillis,
        limit: usize,
    ) -> BoxFuture<'static, Result<usize, StoreError>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.submit(Job::new(false, String::new(), move |c| {
            Box::pin(async move {
                if !housekeeping_turn(c).await? {
                    return Ok(0);
                }
                let n = c
                    .execute(
                        "DELETE FROM ledger WHERE (workspace, key) IN
                           (SELECT workspace, key FROM ledger
                            WHERE expires_at <= smtp_once_now() LIMIT $1)",
                        &[&limit],
                    )
                    .await?;
                Ok(usize::try_from(n).unwrap_or(usize::MAX))
            })
        }))
    }
}
