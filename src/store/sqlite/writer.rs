//! The single writer thread. rusqlite is synchronous, so the write
//! connection lives on its own thread fed by a channel and runs the shared
//! batch loop (`store::batch`): group commit, one fsync per batch. Here:
//! the transaction, and the data directory's identity around it.

use std::time::{Duration, Instant};

use rusqlite::{Connection, Transaction, params};
use tokio::sync::{mpsc, oneshot};

use super::classify;
use super::identity::DataDirIdentity;
use super::ledger_staging::{self, SharedStaged};
use super::{ledger_key, ledger_partition};
use crate::store::batch::{self, Answer, Answers, Pending, Reply, Wakers};
use crate::store::{
    Acceptance, CommitOutcome, NewEvent, NewLedgerEntry, NewMessage, StoreError, UnixMillis,
};

/// One write (see `batch::Job`), a closure over the transaction.
pub(crate) type Job = batch::Job<dyn Work>;

pub(crate) trait Work: Answer {
    /// Runs inside the batch's transaction. May run twice: a batch that
    /// fails is rolled back and each job retried alone.
    fn apply(&mut self, tx: &Transaction<'_>) -> rusqlite::Result<()>;
}

impl<T, F> Work for Pending<T, F>
where
    T: Send,
    F: FnMut(&Transaction<'_>) -> rusqlite::Result<T> + Send,
{
    fn apply(&mut self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        self.reply.keep((self.write)(tx)?);
        Ok(())
    }
}

impl Job {
    /// A write and the receiver of its result.
    pub(crate) fn new<T, F>(
        queues_mail: bool,
        write: F,
    ) -> (Self, oneshot::Receiver<Result<T, StoreError>>)
    where
        T: Send + 'static,
        F: FnMut(&Transaction<'_>) -> rusqlite::Result<T> + Send + 'static,
    {
        let (reply, rx) = Reply::channel();
        let work = Box::new(Pending {
            write,
            reply,
            order: (),
        });
        (Job::of(work, queues_mail), rx)
    }

    pub(super) fn commit(
        acceptance: Acceptance,
        staged: SharedStaged,
    ) -> (Self, oneshot::Receiver<Result<CommitOutcome, StoreError>>) {
        let queues_mail = acceptance.message.is_some();
        let queues_events = !acceptance.events.is_empty();
        Job::with_events(
            Job::new(queues_mail, move |tx| {
                apply_acceptance(tx, &staged, &acceptance)
            }),
            queues_events,
        )
    }

    pub(crate) fn purge(
        now: UnixMillis,
        limit: usize,
    ) -> (Self, oneshot::Receiver<Result<usize, StoreError>>) {
        Job::new(false, move |tx| purge_expired(tx, now, limit))
    }
}

pub(super) fn run(
    conn: Connection,
    jobs: mpsc::UnboundedReceiver<Job>,
    identity: DataDirIdentity,
    wakers: Wakers,
    staged: SharedStaged,
) {
    let mut writer = Writer {
        conn,
        identity,
        gone: false,
        staged,
        merge: None,
        merge_failed_at: None,
    };
    batch::run_blocking(jobs, &wakers, |batch| writer.write(batch));
    tracing::debug!("ledger writer stopped");
}

struct Writer {
    conn: Connection,
    identity: DataDirIdentity,
    /// The data directory was gone at the last batch.
    gone: bool,
    /// Ledger entries not yet merged into their partitions.
    staged: SharedStaged,
    /// The merge of staged entries under way, a slice per batch.
    merge: Option<ledger_staging::Merge>,
    /// When the last merge step failed: the next waits `MERGE_RETRY`.
    merge_failed_at: Option<Instant>,
}

/// A merge that failed (a full disk) is not tried again before every
/// batch: the entries stay staged and found meanwhile.
const MERGE_RETRY: Duration = Duration::from_secs(1);

impl Writer {
    /// A commit into a file that is no longer on disk is lost at the next
    /// start: refuse instead. Checked before the batch (to write nothing
    /// into a deleted file) and again after COMMIT, before any answer goes
    /// out, so an `rm -rf` during the commit gets a 451 too. The same file
    /// back in place (a folder moved back) is ours again.
    fn write(&mut self, batch: &mut Vec<Job>) -> Answers<dyn Work> {
        let mut answers = Vec::new();
        let checked = self.identity.check().and_then(|()| {
            self.merge_if_due();
            answers = execute_batch(&mut self.conn, &self.staged, batch);
            self.identity.check()
        });
        match checked {
            Ok(()) => {
                if self.gone {
                    tracing::warn!("the database is back at its path; accepting mail again");
                    self.gone = false;
                }
                answers
            }
            Err(why) => {
                if !self.gone {
                    tracing::error!(
                        "data directory gone: {why}; refusing mail (451) until the same files are back or the daemon restarts"
                    );
                    self.gone = true;
                }
                batch.extend(answers.into_iter().map(|(job, _)| job));
                batch::refused(batch, || {
                    StoreError::Unavailable(format!("data directory gone: {why}"))
                })
            }
        }
    }

    /// One step of moving the staged ledger entries into their partitions
    /// (`ledger_staging`), when a merge is under way or due, before the
    /// batch: the batch waits for it as it would for a slow commit.
    fn merge_if_due(&mut self) {
        if self
            .merge_failed_at
            .is_some_and(|at| at.elapsed() < MERGE_RETRY)
        {
            return;
        }
        if self.merge.is_none()
            && ledger_staging::lock(&self.staged).merge_due(crate::store::now_millis())
        {
            self.merge = ledger_staging::start_merge(&self.staged);
        }
        let Some(merge) = &mut self.merge else {
            return;
        };
        match ledger_staging::merge_step(&mut self.conn, &self.staged, merge) {
            Ok(ledger_staging::Step::Moved) => self.merge_failed_at = None,
            Ok(ledger_staging::Step::Done(merged)) => {
                self.merge_failed_at = None;
                self.merge = None;
                tracing::debug!(
                    entries = merged.entries,
                    steps = merged.steps,
                    ms = merged.busy.as_millis(),
                    "staged ledger entries merged into their partitions"
                );
            }
            Err(e) => {
                self.merge_failed_at = Some(Instant::now());
                tracing::warn!(error = %e, "merging staged ledger entries failed; they stay staged and are found there");
            }
        }
    }
}

/// Commits the batch; each job with its error, if it failed. Answers
/// nobody: the caller does, once it knows the file is still ours.
fn execute_batch(
    conn: &mut Connection,
    staged: &SharedStaged,
    batch: &mut Vec<Job>,
) -> Answers<dyn Work> {
    match apply_all(conn, staged, batch) {
        Ok(()) => batch::committed(batch),
        Err(e) => {
            // One bad job must not fail its neighbours: retry each alone,
            // so only the job that really fails gets the error.
            tracing::warn!(error = %e, jobs = batch.len(), "batch commit failed; retrying jobs one by one");
            batch
                .drain(..)
                .map(|job| {
                    let mut single = [job];
                    let result = apply_all(conn, staged, &mut single);
                    let [job] = single;
                    (job, result.err().map(classify))
                })
                .collect()
        }
    }
}

/// One transaction over `jobs`. The ledger entries they staged count
/// once it commits, and are forgotten if it does not.
fn apply_all(
    conn: &mut Connection,
    staged: &SharedStaged,
    jobs: &mut [Job],
) -> rusqlite::Result<()> {
    let result = (|| {
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        for job in jobs.iter_mut() {
            job.work.apply(&tx)?;
        }
        tx.commit()
    })();
    let mut staged = ledger_staging::lock(staged);
    match result {
        Ok(()) => staged.publish(),
        Err(_) => staged.discard(),
    }
    drop(staged);
    result?;
    crate::metrics::global().commit_batch(jobs.len());
    Ok(())
}

fn apply_acceptance(
    tx: &Transaction<'_>,
    staged: &SharedStaged,
    a: &Acceptance,
) -> rusqlite::Result<CommitOutcome> {
    if let Some(l) = &a.ledger
        && !ledger_staging::insert(tx, staged, l)?
    {
        return Ok(CommitOutcome::KeyTaken);
    }
    if let Some(m) = &a.message {
        insert_message(tx, m)?;
    }
    insert_events(tx, &a.events)?;
    Ok(CommitOutcome::Committed)
}

/// Writes a ledger entry into its partition unless a live one holds the
/// key (`false`, nothing written); an expired one stays in its partition
/// until that is purged. The operators' idempotent changes (`admin`);
/// acceptances stage theirs (`ledger_staging::insert`).
pub(crate) fn insert_ledger(tx: &Transaction<'_>, l: &NewLedgerEntry) -> rusqlite::Result<bool> {
    // Check, then write: unique because every writer (the acceptances'
    // thread, the operators' `admin` connection) holds the database's
    // write lock. The view `ledger` has the staged entries too.
    let hash = ledger_key::hash(&l.key);
    if ledger_partition::held(tx, hash, l)? {
        return Ok(false);
    }
    let table = ledger_partition::table_for(tx, l.entry.created_at, l.entry.expires_at)?;
    ledger_partition::write_entry(tx, &table, hash, l)?;
    Ok(true)
}

/// Writes a queue row and its body, due at once. The one place queue rows
/// are created: acceptances here, bounces from the delivery worker.
pub(crate) fn insert_message(tx: &Transaction<'_>, m: &NewMessage) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT INTO queue (id, workspace, account, reverse_path, recipients, idempotency_key,
                            size, state, attempts, next_attempt_at, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'queued', 0, ?8, ?8, ?8)",
    )?
    .execute(params![
        m.id,
        m.workspace,
        m.account,
        m.reverse_path,
        m.recipients.join("\n"),
        m.idempotency_key,
        i64::try_from(m.trace.len() + m.body.len()).unwrap_or(i64::MAX),
        m.created_at
    ])?;
    tx.prepare_cached(
        "INSERT INTO message_body (queue_id, trace, body, mail_params) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![m.id, m.trace, m.body, m.mail_params])?;
    Ok(())
}

/// Writes `events` as pending rows, due at once. An event already written
/// (same id and endpoint) is left as it is.
pub(crate) fn insert_events(tx: &Transaction<'_>, events: &[NewEvent]) -> rusqlite::Result<()> {
    if events.is_empty() {
        return Ok(());
    }
    let mut stmt = tx.prepare_cached(
        "INSERT INTO webhook_outbox (webhook_id, endpoint, event_type, event_at, workspace,
                                     queue_id, payload, state, next_attempt_at, lease_until,
                                     created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7,
                 CASE WHEN ?8 IS NULL THEN 'pending' ELSE 'sending' END, ?4, ?4 + ?8, ?4, ?4)
         ON CONFLICT (webhook_id, endpoint) DO NOTHING",
    )?;
    for e in events {
        stmt.execute(params![
            e.webhook_id,
            e.endpoint,
            e.event_type,
            e.at,
            e.workspace,
            e.queue_id,
            e.payload,
            e.lease_ms
        ])?;
    }
    Ok(())
}

fn purge_expired(tx: &Transaction<'_>, now: UnixMillis, limit: usize) -> rusqlite::Result<usize> {
    ledger_partition::purge(tx, now, limit)
}
