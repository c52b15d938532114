//! The single writer thread. rusqlite is synchronous, so the write
//! connection lives on its own thread fed by a channel; every job waiting
//! when a transaction starts joins it (group commit): one fsync for the
//! batch, then each waiting session gets its answer. Nothing sleeps to
//! collect a batch, so a lone job commits at once.

use std::sync::Arc;

use rusqlite::{Connection, Transaction, params};
use tokio::sync::{Notify, mpsc, oneshot};

use super::classify;
use super::identity::DataDirIdentity;
use crate::store::{
    Acceptance, CommitOutcome, NewEvent, NewLedgerEntry, NewMessage, StoreError, UnixMillis,
};

/// Upper bound on jobs per transaction, to bound latency and memory.
pub const MAX_BATCH: usize = 256;

/// One write: acceptances, delivery claims and outcomes, purges alike, so
/// the two paths share one lock holder and one fsync per batch.
pub struct Job {
    work: Box<dyn Work>,
    /// The job may put a message in the queue: the delivery worker is woken
    /// after the commit.
    queues_mail: bool,
    /// The job may write webhook events: the webhook sender is woken.
    queues_events: bool,
}

/// Who to wake after a commit: the delivery worker (mail queued) and the
/// webhook sender (events written).
#[derive(Clone, Default)]
pub struct Wakers {
    pub mail: Arc<Notify>,
    pub events: Arc<Notify>,
}

trait Work: Send {
    /// Runs inside the batch's transaction. May run twice: a batch that
    /// fails is rolled back and each job retried alone.
    fn apply(&mut self, tx: &Transaction<'_>) -> rusqlite::Result<()>;
    /// Answers the waiting caller, only after COMMIT. A caller that went
    /// away no longer needs the answer; the commit stands either way.
    fn finish(self: Box<Self>, error: Option<StoreError>);
}

struct Pending<T, F> {
    write: F,
    value: Option<T>,
    reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<T, F> Work for Pending<T, F>
where
    T: Send,
    F: FnMut(&Transaction<'_>) -> rusqlite::Result<T> + Send,
{
    fn apply(&mut self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        self.value = Some((self.write)(tx)?);
        Ok(())
    }

    fn finish(self: Box<Self>, error: Option<StoreError>) {
        let _ = self.reply.send(crate::store::job_result(error, self.value));
    }
}

impl Job {
    /// A write and the receiver of its result.
    pub fn new<T, F>(
        queues_mail: bool,
        write: F,
    ) -> (Self, oneshot::Receiver<Result<T, StoreError>>)
    where
        T: Send + 'static,
        F: FnMut(&Transaction<'_>) -> rusqlite::Result<T> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        let work = Box::new(Pending {
            write,
            value: None,
            reply,
        });
        (
            Job {
                work,
                queues_mail,
                queues_events: false,
            },
            rx,
        )
    }

    /// Marks the job as one that writes webhook events (if `yes`).
    pub fn with_events<T>(
        (mut job, rx): (Self, oneshot::Receiver<T>),
        yes: bool,
    ) -> (Self, oneshot::Receiver<T>) {
        job.queues_events = yes;
        (job, rx)
    }

    pub fn commit(
        acceptance: Acceptance,
    ) -> (Self, oneshot::Receiver<Result<CommitOutcome, StoreError>>) {
        let queues_mail = acceptance.message.is_some();
        let queues_events = !acceptance.events.is_empty();
        Job::with_events(
            Job::new(queues_mail, move |tx| apply_acceptance(tx, &acceptance)),
            queues_events,
        )
    }

    pub fn purge(
        now: UnixMillis,
        limit: usize,
    ) -> (Self, oneshot::Receiver<Result<usize, StoreError>>) {
        Job::new(false, move |tx| purge_expired(tx, now, limit))
    }

    fn finish(self, error: Option<StoreError>) {
        self.work.finish(error);
    }
}

pub fn run(
    mut conn: Connection,
    mut jobs: mpsc::UnboundedReceiver<Job>,
    identity: DataDirIdentity,
    wakers: Wakers,
) {
    let mut batch: Vec<Job> = Vec::with_capacity(MAX_BATCH);
    let mut gone = false;
    while let Some(first) = jobs.blocking_recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        // A commit into a file that is no longer on disk is lost at the
        // next start: refuse instead. Checked before the batch (to write
        // nothing into a deleted file) and again after COMMIT, before any
        // answer goes out, so an `rm -rf` during the commit gets a 451
        // too. The same file back in place (a folder moved back) is ours
        // again.
        let mut answers = Vec::new();
        let checked = identity.check().and_then(|()| {
            answers = execute_batch(&mut conn, &mut batch);
            identity.check()
        });
        match checked {
            Ok(()) => {
                if gone {
                    tracing::warn!("the database is back at its path; accepting mail again");
                    gone = false;
                }
                let (mut woke_worker, mut woke_sender) = (false, false);
                for (job, error) in answers {
                    if job.queues_mail && error.is_none() && !woke_worker {
                        // A stored permit if the worker is busy: never lost.
                        wakers.mail.notify_one();
                        woke_worker = true;
                    }
                    if job.queues_events && error.is_none() && !woke_sender {
                        wakers.events.notify_one();
                        woke_sender = true;
                    }
                    job.finish(error);
                }
            }
            Err(why) => {
                if !gone {
                    tracing::error!(
                        "data directory gone: {why}; refusing mail (451) until the same files are back or the daemon restarts"
                    );
                    gone = true;
                }
                let error = || StoreError::Unavailable(format!("data directory gone: {why}"));
                let jobs = batch
                    .drain(..)
                    .chain(answers.into_iter().map(|(job, _)| job));
                jobs.for_each(|job| job.finish(Some(error())));
            }
        }
    }
    tracing::debug!("ledger writer stopped");
}

/// Commits the batch; each job with its error, if it failed. Answers
/// nobody: the caller does, once it knows the file is still ours.
fn execute_batch(conn: &mut Connection, batch: &mut Vec<Job>) -> Vec<(Job, Option<StoreError>)> {
    match apply_all(conn, batch) {
        Ok(()) => batch.drain(..).map(|job| (job, None)).collect(),
        Err(e) => {
            // One bad job must not fail its neighbours: retry each alone,
            // so only the job that really fails gets the error.
            tracing::warn!(error = %e, jobs = batch.len(), "batch commit failed; retrying jobs one by one");
            batch
                .drain(..)
                .map(|job| {
                    let mut single = [job];
                    let result = apply_all(conn, &mut single);
                    let [job] = single;
                    (job, result.err().map(classify))
                })
                .collect()
        }
    }
}

fn apply_all(conn: &mut Connection, jobs: &mut [Job]) -> rusqlite::Result<()> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    for job in jobs.iter_mut() {
        job.work.apply(&tx)?;
    }
    tx.commit()?;
    crate::metrics::global().commit_batch(jobs.len());
    Ok(())
}

fn apply_acceptance(tx: &Transaction<'_>, a: &Acceptance) -> rusqlite::Result<CommitOutcome> {
    if let Some(l) = &a.ledger
        && !insert_ledger(tx, l)?
    {
        return Ok(CommitOutcome::KeyTaken);
    }
    if let Some(m) = &a.message {
        insert_message(tx, m)?;
    }
    insert_events(tx, &a.events)?;
    Ok(CommitOutcome::Committed)
}

/// Writes a ledger entry, replacing one only once it has expired; `false`
/// (nothing written) when a live one holds the key. Acceptances here, the
/// operators' idempotent changes in `admin`.
pub(crate) fn insert_ledger(tx: &Transaction<'_>, l: &NewLedgerEntry) -> rusqlite::Result<bool> {
    let changed = tx
        .prepare_cached(
            "INSERT INTO ledger (workspace, key, fingerprint, reply, queue_id, created_at, expires_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (workspace, key) DO UPDATE SET
               fingerprint = excluded.fingerprint, reply = excluded.reply,
               queue_id = excluded.queue_id, created_at = excluded.created_at,
               expires_at = excluded.expires_at
             WHERE ledger.expires_at <= excluded.created_at",
        )?
        .execute(params![
            l.workspace,
            l.key,
            &l.entry.fingerprint[..],
            l.entry.reply,
            l.entry.queue_id,
            l.entry.created_at,
            l.entry.expires_at
        ])?;
    Ok(changed > 0)
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
    tx.prepare_cached("INSERT INTO message_body (queue_id, trace, body) VALUES (?1, ?2, ?3)")?
        .execute(params![m.id, m.trace, m.body])?;
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
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    tx.prepare_cached(
        "DELETE FROM ledger WHERE (workspace, key) IN
           (SELECT workspace, key FROM ledger WHERE expires_at <= ?1 LIMIT ?2)",
    )?
    .execute(params![now, limit])
}
