//! The PostgreSQL store: several nodes on one database, exactly once across
//! them. A unique constraint on `(workspace, key)` is the source of truth;
//! the ledger entry and the queue row go in one transaction, group-committed
//! by each node's writer; an acceptance still in flight on another node
//! holds its uncommitted ledger row, which a second node's insert waits for
//! and then finds taken (E01004), and which a crashed node's dropped
//! connection releases by itself. Times come from the database's clock.

mod admin;
mod delivery_queue;
mod housekeeping;
mod outbox;
mod outbox_admin;
mod own_connection;
mod probe;
mod schema;
mod status;
mod writer;

pub use admin::PgQueueAdmin;
pub use outbox_admin::PgOutboxAdmin;

use std::str::FromStr;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use deadpool_postgres::{ClientWrapper, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio::sync::{mpsc, oneshot};

use super::batch::{JobSender, Wakers};
use super::{
    Acceptance, BoxFuture, CommitOutcome, LedgerEntry, NewMessage, QueueDepth, Store, StoreError,
    UnixMillis,
};
use writer::{Job, PgResult};

/// How long a caller waits for a connection (or for one to be made)
/// before the ledger counts as unavailable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

pub struct PgStore {
    pool: Pool,
    jobs: JobSender<Job>,
    /// Woken when any node queued mail (`queued`) or wrote webhook events
    /// (`events_queued`).
    wakers: Wakers,
    node_id: String,
    /// LISTENs for mail and events queued by any node (see `listen`).
    listener: tokio::task::JoinHandle<()>,
    /// Holds this node's id (see `hold_node_id`) for the life of the store.
    node_lock: tokio::task::JoinHandle<()>,
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
        let (config, tls) = session_config(o.url, o.ca_file)?;
        let manager = Manager::from_config(
            config.clone(),
            tls.clone(),
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
        warn_without_autovacuum(&client).await;
        drop(client);
        let node_lock = hold_node_id(&config, &tls, o.node_id).await?;
        tracing::info!(
            schema_version = version,
            node_id = o.node_id,
            "PostgreSQL store open"
        );
        let (jobs, rx) = JobSender::channel("PostgreSQL writer");
        let wakers = Wakers::default();
        tokio::spawn(writer::run(pool.clone(), rx, wakers.clone()));
        let listener = tokio::spawn(listen(config, tls, wakers.clone()));
        Ok(Self {
            pool,
            jobs,
            wakers,
            node_id: o.node_id.to_owned(),
            listener,
            node_lock,
        })
    }

    /// Stops the writer after the jobs already sent.
    pub fn close(&self) {
        self.jobs.close();
        self.listener.abort();
        self.node_lock.abort();
    }

    fn submit<T: Send + 'static>(
        &self,
        job: (Job, oneshot::Receiver<Result<T, StoreError>>),
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        self.jobs.submit(job)
    }

    /// A pooled connection for reads.
    async fn reader(pool: &Pool) -> Result<deadpool_postgres::Object, StoreError> {
        pool.get()
            .await
            .map_err(|e| StoreError::Unavailable(format!("PostgreSQL unreachable: {e}")))
    }
}

/// One connection of its own for an operator command (`PgQueueAdmin`,
/// `PgOutboxAdmin`), with the store's settings; its driver task ends when
/// the client is dropped. `what` names it in the log.
/// The queue's rows change state several times each: without autovacuum
/// their dead versions pile up and every claim walks them (measured: the
/// relayed rate fell from 365 to 120 msgs/s within six minutes, 160,000
/// dead rows in `queue`). Said once at start; the server's setting is the
/// operator's.
async fn warn_without_autovacuum(client: &tokio_postgres::Client) {
    if let Ok(row) = client
        .query_one("SELECT current_setting('autovacuum')", &[])
        .await
        && row.try_get::<_, String>(0).is_ok_and(|v| v == "off")
    {
        tracing::warn!(
            "PostgreSQL has autovacuum = off: the queue's dead rows will pile up and slow delivery; \
             turn it on (the default) or VACUUM the queue, message_body and webhook_outbox tables often"
        );
    }
}

async fn connect_one(
    url: &str,
    ca_file: Option<&std::path::Path>,
    what: &'static str,
) -> Result<tokio_postgres::Client, StoreError> {
    let (config, tls) = session_config(url, ca_file)?;
    let (client, connection) = config.connect(tls).await.map_err(|e| {
        StoreError::Unavailable(format!("cannot connect to PostgreSQL: {}", describe(&e)))
    })?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %describe(&e), "{what} connection ended");
        }
    });
    Ok(client)
}

/// The connection settings every connection of this store uses (the
/// operators' `PgOutboxAdmin` included): `url` plus the lock and statement
/// timeouts, and TLS (with `ca_file`'s roots if given).
fn session_config(
    url: &str,
    ca_file: Option<&std::path::Path>,
) -> Result<
    (
        tokio_postgres::Config,
        tokio_postgres_rustls::MakeRustlsConnect,
    ),
    StoreError,
> {
    let mut config = tokio_postgres::Config::from_str(url)
        .map_err(|e| StoreError::Unavailable(format!("store.url: {e}")))?;
    // A lock held elsewhere (an operator's LOCK TABLE, a stuck session)
    // makes a statement fail after this, as SQLite's busy timeout does,
    // so a client gets E01033 instead of waiting forever.
    let options = format!(
        "{} -c lock_timeout={} -c statement_timeout={}",
        config.get_options().unwrap_or_default(),
        LOCK_TIMEOUT.as_millis(),
        STATEMENT_TIMEOUT.as_millis()
    );
    config.options(options.trim());
    let tls = tokio_postgres_rustls::MakeRustlsConnect::new(
        crate::tls::client_config(ca_file).map_err(StoreError::Unavailable)?,
    );
    Ok((config, tls))
}

/// The channel a commit that queued mail notifies (inside its transaction,
/// so it is delivered only on COMMIT).
pub(crate) const QUEUED_CHANNEL: &str = "smtp_once_queued";

/// The channel a commit that wrote webhook events notifies (also inside
/// its transaction), as do the operators' redeliveries.
pub(crate) const EVENTS_CHANNEL: &str = "smtp_once_events";

/// Wakes this node's worker when any node queued mail, so a message
/// accepted on one node is picked up at once by whichever is free, and
/// its webhook sender when any node wrote events. On a lost connection it
/// reconnects; meanwhile `poll_interval` (and the sender's next due time)
/// still apply.
async fn listen(
    config: tokio_postgres::Config,
    tls: tokio_postgres_rustls::MakeRustlsConnect,
    wakers: Wakers,
) {
    loop {
        match config.connect(tls.clone()).await {
            Ok((client, mut conn)) => {
                let (tx, mut rx) = mpsc::unbounded_channel();
                let driver = tokio::spawn(async move {
                    while let Some(message) = std::future::poll_fn(|cx| conn.poll_message(cx)).await
                    {
                        match message {
                            Ok(tokio_postgres::AsyncMessage::Notification(n)) => {
                                if tx.send(n.channel() == EVENTS_CHANNEL).is_err() {
                                    return;
                                }
                            }
                            Ok(_) => {}
                            Err(_) => return,
                        }
                    }
                });
                match client
                    .batch_execute(&format!("LISTEN {QUEUED_CHANNEL}; LISTEN {EVENTS_CHANNEL}"))
                    .await
                {
                    Ok(()) => {
                        while let Some(events) = rx.recv().await {
                            if events {
                                wakers.events.notify_one();
                            } else {
                                wakers.mail.notify_one();
                            }
                        }
                    }
                    Err(e) => tracing::debug!(error = %describe(&e), "LISTEN failed"),
                }
                driver.abort();
            }
            Err(e) => tracing::debug!(error = %describe(&e), "LISTEN connection failed"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Statements wait at most this long for a lock (SQLite's busy timeout).
const LOCK_TIMEOUT: Duration = Duration::from_secs(2);
/// And take at most this long in all.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(60);
/// `pg_advisory_lock(class, id)` class for node ids.
const NODE_ID_LOCK_CLASS: i32 = 0x736f; // "so"

/// Takes a session advisory lock on `node_id` on a connection of its own,
/// held until the process ends (the server releases it when the connection
/// drops, a crash included). Two live nodes with one id would give back
/// each other's delivery leases at start and send those messages twice, so
/// the second one refuses to start.
async fn hold_node_id(
    config: &tokio_postgres::Config,
    tls: &tokio_postgres_rustls::MakeRustlsConnect,
    node_id: &str,
) -> Result<tokio::task::JoinHandle<()>, StoreError> {
    let (client, connection) = config.connect(tls.clone()).await.map_err(|e| {
        StoreError::Unavailable(format!("cannot connect to PostgreSQL: {}", describe(&e)))
    })?;
    let driver = tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::error!(error = %describe(&e), "lost the connection that holds this node's id");
        }
    });
    let held: bool = client
        .query_one(
            "SELECT pg_try_advisory_lock($1, hashtext($2))",
            &[&NODE_ID_LOCK_CLASS, &node_id],
        )
        .await
        .map_err(|e| StoreError::Unavailable(format!("cannot lock the node id: {}", describe(&e))))?
        .get(0);
    if !held {
        driver.abort();
        return Err(StoreError::Unavailable(format!(
            "node_id {node_id:?} is in use by another running node on this database: \
             give each node its own server.node_id"
        )));
    }
    // The client must live as long as the lock: it moves into the task.
    Ok(tokio::spawn(async move {
        let _client = client;
        let _ = driver.await;
    }))
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
    if unreachable(e) {
        StoreError::Unavailable(describe(e))
    } else {
        StoreError::Transient(describe(e))
    }
}

/// The server cannot do the work now: the connection is gone, or a lock or
/// the statement deadline ran out (lock_not_available, query_canceled).
pub(crate) fn unreachable(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    e.is_closed()
        || match e.as_db_error() {
            None => true,
            Some(db) => {
                *db.code() == SqlState::LOCK_NOT_AVAILABLE || *db.code() == SqlState::QUERY_CANCELED
            }
        }
}

/// One statement per acceptance (ledger entry, queue row and body as
/// data-modifying CTEs), so a batch of them is pipelined in one round trip.
/// `node`: the holder of the events written already leased.
async fn apply_acceptance(
    c: &ClientWrapper,
    a: &Acceptance,
    node: &str,
) -> PgResult<CommitOutcome> {
    // Replace a ledger entry only once it has expired; a row another node
    // has inserted but not committed makes this wait for that commit.
    const LEDGER: &str = "l AS (
          INSERT INTO ledger (workspace, key, fingerprint, reply, queue_id, created_at, expires_at)
          VALUES ($1, $2, $3, $4, $5, smtp_once_now(), smtp_once_now() + $6)
          ON CONFLICT (workspace, key) DO UPDATE SET
            fingerprint = excluded.fingerprint, reply = excluded.reply,
            queue_id = excluded.queue_id, created_at = excluded.created_at,
            expires_at = excluded.expires_at
          WHERE ledger.expires_at <= excluded.created_at
          RETURNING 1)";
    // $n.. of the message; `gate` makes it depend on the ledger insert.
    fn message_cte(first: usize, gate: &str) -> String {
        let p = |i: usize| format!("${}", first + i);
        format!(
            "q AS (
               INSERT INTO queue (id, workspace, account, reverse_path, recipients,
                                  idempotency_key, size, state, attempts, next_attempt_at,
                                  created_at, updated_at)
               SELECT {}, {}, {}, {}, {}, {}, {}, 'queued', 0, t, t, t
               FROM smtp_once_now() AS t {gate}
               RETURNING id),
             b AS (INSERT INTO message_body (queue_id, trace, body, mail_params)
                   SELECT id, {}, {}, {} FROM q)",
            p(0),
            p(1),
            p(2),
            p(3),
            p(4),
            p(5),
            p(6),
            p(7),
            p(8),
            p(9)
        )
    }
    let ledger = a.ledger.as_ref().map(|l| {
        (
            l,
            &l.entry.fingerprint[..],
            l.entry.expires_at - l.entry.created_at,
        )
    });
    let message = a.message.as_ref().map(|m| {
        (
            m,
            m.recipients.join("\n"),
            i64::try_from(m.trace.len() + m.body.len()).unwrap_or(i64::MAX),
        )
    });
    let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = Vec::with_capacity(16);
    if let Some((l, fp, ttl)) = &ledger {
        params.extend([
            &l.workspace as &(dyn tokio_postgres::types::ToSql + Sync),
            &l.key,
            fp,
            &l.entry.reply,
            &l.entry.queue_id,
            ttl,
        ]);
    }
    if let Some((m, recipients, size)) = &message {
        params.extend([
            &m.id as &(dyn tokio_postgres::types::ToSql + Sync),
            &m.workspace,
            &m.account,
            &m.reverse_path,
            recipients,
            &m.idempotency_key,
            size,
            &m.trace,
            &m.body,
            &m.mail_params,
        ]);
    }
    // The three statements are built once per process, not per acceptance.
    static BOTH: LazyLock<String> = LazyLock::new(|| {
        format!(
            "WITH {LEDGER}, {} SELECT COUNT(*) FROM l",
            message_cte(7, "WHERE EXISTS (SELECT 1 FROM l)")
        )
    });
    static LEDGER_ONLY: LazyLock<String> =
        LazyLock::new(|| format!("WITH {LEDGER} SELECT COUNT(*) FROM l"));
    static MESSAGE_ONLY: LazyLock<String> =
        LazyLock::new(|| format!("WITH {} SELECT COUNT(*) FROM q", message_cte(1, "")));
    let sql: &str = match (&ledger, &message) {
        (Some(_), Some(_)) => &BOTH,
        (Some(_), None) => &LEDGER_ONLY,
        (None, Some(_)) => &MESSAGE_ONLY,
        (None, None) => {
            outbox::insert_events(c, &a.events, node).await?;
            return Ok(CommitOutcome::Committed);
        }
    };
    let row = c.query_one(&c.prepare_cached(sql).await?, &params).await?;
    let written: i64 = row.get(0);
    if ledger.is_some() && written == 0 {
        // The key is taken: nothing was written, so nothing to report.
        return Ok(CommitOutcome::KeyTaken);
    }
    // In the same transaction as the rows they report.
    outbox::insert_events(c, &a.events, node).await?;
    Ok(CommitOutcome::Committed)
}

/// A queue row and its body, due at once (database time): bounces.
async fn insert_message(c: &ClientWrapper, m: &NewMessage) -> PgResult<()> {
    apply_acceptance(
        c,
        &Acceptance {
            ledger: None,
            message: Some(m.clone()),
            events: Vec::new(),
        },
        "",
    )
    .await
    .map(|_| ())
}

/// A count or limit as a query parameter.
fn i64_of(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
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
        let queues_events = !acceptance.events.is_empty();
        let acceptance = Arc::new(acceptance);
        let node = Arc::new(self.node_id.clone());
        self.submit(Job::with_events(
            Job::new(queues_mail, order, move |c| {
                let (a, node) = (acceptance.clone(), node.clone());
                Box::pin(async move { apply_acceptance(c, &a, &node).await })
            }),
            queues_events,
        ))
    }

    fn purge_expired(
        &self,
        _now: UnixMillis,
        limit: usize,
    ) -> BoxFuture<'static, Result<usize, StoreError>> {
        self.purge(
            "DELETE FROM ledger WHERE (workspace, key) IN
               (SELECT workspace, key FROM ledger
                WHERE expires_at <= smtp_once_now() LIMIT $1)",
            vec![i64_of(limit)],
        )
    }

    fn ready(&self) -> BoxFuture<'static, Result<(), StoreError>> {
        // Through the writer: its connection, BEGIN, COMMIT.
        self.submit(Job::new(false, String::new(), |c| {
            Box::pin(probe::select_one(c))
        }))
    }

    fn queue_depth(&self) -> BoxFuture<'static, Result<QueueDepth, StoreError>> {
        let pool = self.pool.clone();
        Box::pin(async move {
            let mut c = Self::reader(&pool).await?;
            probe::queue_depth_on(&mut c).await
        })
    }
}

#[cfg(test)]
mod tests;
