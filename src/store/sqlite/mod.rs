//! The single-node store: one SQLite file in WAL mode with
//! `synchronous = FULL` (a commit is on disk before it returns), one writer
//! thread, and a small pool of reader connections.

mod admin;
mod checkpoint;
mod delivery_queue;
mod identity;
mod inspect;
mod ledger_key;
mod ledger_partition;
mod ledger_reply;
mod ledger_staging;
mod outbox;
mod probe;
mod schema;
mod status;
#[cfg(test)]
mod tests;
mod writer;

pub use admin::SqliteQueueAdmin;
pub use identity::FileIdentity;
pub use outbox::OutboxDb;
pub(crate) use writer::insert_message;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OpenFlags};
use tokio::sync::oneshot;

use crate::private_fs;
use identity::DataDirIdentity;

use super::batch::{JobSender, Wakers};
use super::{
    Acceptance, BoxFuture, CommitOutcome, LedgerEntry, QueueDepth, Store, StoreError, UnixMillis,
};

pub const DB_FILE: &str = "smtp-once.db";
/// SQLite's companions of the database file (same mode as the database).
const DB_COMPANIONS: [&str; 2] = ["-wal", "-shm"];
const LOCK_FILE: &str = "smtp-once.lock";
/// How long a statement waits on a lock held by someone else before the
/// ledger counts as unavailable.
pub(super) const BUSY_TIMEOUT: Duration = Duration::from_secs(2);
const MAX_IDLE_READERS: usize = 8;

pub struct SqliteStore {
    db_path: PathBuf,
    jobs: JobSender<writer::Job>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    checkpointer: Mutex<Option<checkpoint::Checkpointer>>,
    readers: Arc<Readers>,
    /// Signalled after a commit that queued mail (see `DeliveryQueue::queued`)
    /// or wrote webhook events (`WebhookOutbox::events_queued`).
    wakers: Wakers,
    /// The database and lock files this store has open.
    identity: DataDirIdentity,
    /// The key hashes of ledger entries not yet merged into a partition.
    staged: ledger_staging::SharedStaged,
    /// Held for the life of the store: one process per data directory.
    _lock: File,
}

impl SqliteStore {
    /// Opens (creating and migrating if needed) the store in `data_dir` and
    /// takes its exclusive lock.
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        private_data_dir(data_dir)?;
        let lock_path = data_dir.join(LOCK_FILE);
        let cannot_open = |p: &Path, e: std::io::Error| {
            StoreError::Unavailable(format!("cannot open {}: {e}", p.display()))
        };
        let lock = private_fs::open_file(&lock_path).map_err(|e| cannot_open(&lock_path, e))?;
        lock.try_lock().map_err(|_| {
            StoreError::Unavailable(format!(
                "{} is in use by another smtp-once process (lock {} is held)",
                data_dir.display(),
                lock_path.display()
            ))
        })?;
        let db_path = data_dir.join(DB_FILE);
        // SQLite would create the database as 0644 and give the -wal and
        // -shm files the database's mode: create it 0600 first (an empty
        // file is an empty database), and tighten files an older version
        // left readable.
        private_fs::open_file(&db_path).map_err(|e| cannot_open(&db_path, e))?;
        for suffix in DB_COMPANIONS {
            let path = companion(&db_path, suffix);
            private_fs::tighten(&path, private_fs::FILE_MODE).map_err(|e| cannot_open(&path, e))?;
        }
        let mut conn = open_connection(&db_path, false).map_err(classify)?;
        let identity = DataDirIdentity {
            files: vec![
                FileIdentity::of(&db_path).map_err(|e| cannot_open(&db_path, e))?,
                FileIdentity::of_open(&lock, &lock_path).map_err(|e| cannot_open(&lock_path, e))?,
            ],
        };
        schema::migrate(&mut conn).map_err(classify)?;
        let staged = Arc::new(Mutex::new(
            ledger_staging::StagedKeys::load(&conn).map_err(classify)?,
        ));
        // Checkpoints run on their own thread (see checkpoint.rs).
        conn.pragma_update(None, "wal_autocheckpoint", 0)
            .map_err(classify)?;
        // The writer's merges sort staged ledger entries in a TEMP table
        // (`ledger_staging`): in a file, not in the process's memory (the
        // bundled SQLite keeps temp tables in memory by default).
        conn.pragma_update(None, "temp_store", "FILE")
            .map_err(classify)?;
        let checkpointer = checkpoint::Checkpointer::spawn(db_path.clone())
            .map_err(|e| StoreError::Unavailable(format!("cannot start checkpoint thread: {e}")))?;
        let (jobs, rx) = JobSender::channel("ledger writer");
        let wakers = Wakers::default();
        let handle = std::thread::Builder::new()
            .name("ledger-writer".into())
            .spawn({
                let identity = identity.clone();
                let wakers = wakers.clone();
                let staged = staged.clone();
                move || writer::run(conn, rx, identity, wakers, staged)
            })
            .map_err(|e| StoreError::Unavailable(format!("cannot start writer thread: {e}")))?;
        Ok(Self {
            db_path: db_path.clone(),
            jobs,
            writer: Mutex::new(Some(handle)),
            checkpointer: Mutex::new(Some(checkpointer)),
            readers: Arc::new(Readers {
                db_path,
                idle: Mutex::new(Vec::new()),
            }),
            wakers,
            identity,
            staged,
            _lock: lock,
        })
    }

    pub fn db_path(&self) -> &Path {
        &self.db_path
    }

    /// Hands a job to the writer (see `JobSender::submit`).
    fn submit<T: Send + 'static>(
        &self,
        job: (writer::Job, oneshot::Receiver<Result<T, StoreError>>),
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        self.jobs.submit(job)
    }

    /// Stops the writer after the jobs already sent, and waits for it.
    pub fn close(self) {
        self.stop_writer();
    }

    fn stop_writer(&self) {
        self.jobs.close();
        let handle = self.writer.lock().ok().and_then(|mut h| h.take());
        if let Some(handle) = handle {
            let _ = handle.join();
        }
        let checkpointer = self.checkpointer.lock().ok().and_then(|mut c| c.take());
        if let Some(checkpointer) = checkpointer {
            checkpointer.stop();
        }
    }

    #[cfg(test)]
    pub(crate) fn stop_writer_for_test(&self) {
        self.stop_writer();
    }
}

/// Read-only WAL connections, kept open between reads. A reader never
/// waits for the writer.
struct Readers {
    db_path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

impl Readers {
    fn read<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T, StoreError> {
        let pooled = self.idle.lock().ok().and_then(|mut pool| pool.pop());
        let conn = match pooled {
            Some(conn) => conn,
            None => open_connection(&self.db_path, true).map_err(classify)?,
        };
        let result = f(&conn).map_err(classify);
        // A connection that failed may be broken: only a good one goes back.
        if result.is_ok()
            && let Ok(mut pool) = self.idle.lock()
            && pool.len() < MAX_IDLE_READERS
        {
            pool.push(conn);
        }
        result
    }
}

/// Creates the data directory 0700. An existing one keeps its mode: it may
/// be a folder shared with other things (even `/tmp` by mistake), and
/// chmod on it could break them; the files in it are 0600 either way.
fn private_data_dir(data_dir: &Path) -> Result<(), StoreError> {
    let failed = |e: std::io::Error| {
        StoreError::Unavailable(format!("cannot create {}: {e}", data_dir.display()))
    };
    if !private_fs::create_dir(data_dir).map_err(failed)?
        && let Some(mode) = private_fs::shared_mode(data_dir).map_err(failed)?
    {
        tracing::warn!(
            data_dir = %data_dir.display(),
            "data_dir is mode {mode:04o}: other users can enter it (the files in it are 0600); left as set"
        );
    }
    Ok(())
}

/// `smtp-once.db-wal` and friends.
fn companion(db_path: &Path, suffix: &str) -> PathBuf {
    let mut p = db_path.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

const STATEMENT_CACHE: usize = 128;

/// `journal_size_limit`: the WAL file's size kept after a reset. The
/// checkpoint thread restarts the WAL once it passes `WAL_RESTART_BYTES`,
/// so a smaller limit would only make every restart under steady load
/// shrink the file and grow it again; this one cuts back what a burst
/// left beyond it.
const WAL_SIZE_LIMIT: i64 = checkpoint::WAL_RESTART_BYTES as i64;

fn open_connection(path: &Path, read_only: bool) -> rusqlite::Result<Connection> {
    let flags = if read_only {
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX
    } else {
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
    };
    let conn = Connection::open_with_flags(path, flags)?;
    plan_once(&conn)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // The writer runs the statements of acceptance, delivery and the
    // webhook outbox, well over rusqlite's default of 16: evicted ones would
    // be parsed again on every batch.
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    if !read_only {
        conn.pragma_update(None, "journal_mode", "WAL")?;
        // FULL: a commit survives power loss, which a 250 promises.
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        // A WAL that grew under a burst is cut back to this after the
        // checkpoint that resets it, instead of keeping its peak size
        // on disk for good.
        conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT)?;
    }
    Ok(conn)
}

/// Plans that do not depend on bound values (SQLite's query planner
/// stability guarantee). Without it, SQLite prepares a statement again
/// whenever a parameter that it compared with a partial index's condition
/// (`queue_due`'s) changes: every claim's "now", 2.6 % of the writer's time
/// parsing SQL under relay load (issue 24).
pub(super) fn plan_once(conn: &Connection) -> rusqlite::Result<()> {
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    Ok(())
}

/// Sorts SQLite failures into "cannot reach the ledger" and "this attempt
/// failed".
pub(crate) fn classify(e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(
            ErrorCode::DatabaseBusy
            | ErrorCode::DatabaseLocked
            | ErrorCode::CannotOpen
            | ErrorCode::ReadOnly
            | ErrorCode::NotADatabase
            | ErrorCode::DatabaseCorrupt
            | ErrorCode::PermissionDenied,
        ) => StoreError::Unavailable(e.to_string()),
        _ => StoreError::Transient(e.to_string()),
    }
}

impl Store for SqliteStore {
    fn lookup<'a>(
        &'a self,
        workspace: &'a str,
        key: &'a str,
        now: UnixMillis,
    ) -> BoxFuture<'a, Result<Option<LedgerEntry>, StoreError>> {
        Box::pin(async move {
            // A replay from a deleted database would repeat a 250 for a
            // message that is already lost.
            self.identity
                .check()
                .map_err(|why| StoreError::Unavailable(format!("data directory gone: {why}")))?;
            // A point read by primary key on a WAL reader never waits for
            // the writer, so it runs inline rather than on the blocking pool.
            self.readers
                .read(|conn| ledger_staging::lookup(conn, &self.staged, workspace, key, now))
        })
    }

    fn commit(
        &self,
        acceptance: Acceptance,
    ) -> BoxFuture<'static, Result<CommitOutcome, StoreError>> {
        self.submit(writer::Job::commit(acceptance, self.staged.clone()))
    }

    fn purge_expired(
        &self,
        now: UnixMillis,
        limit: usize,
    ) -> BoxFuture<'static, Result<usize, StoreError>> {
        self.submit(writer::Job::purge(now, limit))
    }

    fn ready(&self) -> BoxFuture<'static, Result<(), StoreError>> {
        // BEGIN IMMEDIATE and COMMIT with the identity checks around them:
        // what an acceptance needs, without writing anything.
        self.submit(writer::Job::new(false, |_tx| Ok(())))
    }

    fn queue_depth(&self) -> BoxFuture<'static, Result<QueueDepth, StoreError>> {
        let readers = self.readers.clone();
        Box::pin(delivery_queue::read_blocking(readers, |conn| {
            probe::queue_depth_on(conn, super::now_millis())
        }))
    }
}
