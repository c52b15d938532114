//! The node's single writer: one connection, fed by a channel; every job
//! waiting when a transaction starts joins it (group commit), and each
//! caller gets its answer only after COMMIT. As with SQLite, acceptances,
//! claims, records and purges all go through it.

use std::sync::Arc;

use deadpool_postgres::{ClientWrapper, Object, Pool};
use tokio::sync::{Notify, mpsc, oneshot};

use super::{EVENTS_CHANNEL, QUEUED_CHANNEL, classify, describe, unreachable};
use crate::store::{BoxFuture, StoreError};

/// Upper bound on jobs per transaction, to bound latency and memory.
const MAX_BATCH: usize = 256;

pub type PgResult<T> = Result<T, tokio_postgres::Error>;

pub struct Job {
    work: Box<dyn Work>,
    /// The job may put a message in the queue: wake the delivery worker
    /// after the commit.
    queues_mail: bool,
    /// The job may write webhook events: wake the webhook senders after
    /// the commit.
    queues_events: bool,
    /// Jobs that lock ledger rows go in key order, so two nodes' batches
    /// never wait on each other in a circle.
    order: String,
}

trait Work: Send {
    /// Runs inside the batch's transaction. May run twice: a batch that
    /// fails is rolled back and each job retried alone.
    fn apply<'a>(&'a mut self, c: &'a ClientWrapper) -> BoxFuture<'a, PgResult<()>>;
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
    F: for<'c> FnMut(&'c ClientWrapper) -> BoxFuture<'c, PgResult<T>> + Send,
{
    fn apply<'a>(&'a mut self, c: &'a ClientWrapper) -> BoxFuture<'a, PgResult<()>> {
        Box::pin(async move {
            self.value = Some((self.write)(c).await?);
            Ok(())
        })
    }

    fn finish(self: Box<Self>, error: Option<StoreError>) {
        let _ = self.reply.send(crate::store::job_result(error, self.value));
    }
}

impl Job {
    pub fn new<T, F>(
        queues_mail: bool,
        order: String,
        write: F,
    ) -> (Self, oneshot::Receiver<Result<T, StoreError>>)
    where
        T: Send + 'static,
        F: for<'c> FnMut(&'c ClientWrapper) -> BoxFuture<'c, PgResult<T>> + Send + 'static,
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
                order,
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
}

/// Who to wake on this node after a commit: the delivery worker (mail
/// queued) and the webhook sender (events written).
#[derive(Clone, Default)]
pub struct Wakers {
    pub mail: Arc<Notify>,
    pub events: Arc<Notify>,
}

pub async fn run(pool: Pool, mut jobs: mpsc::UnboundedReceiver<Job>, wakers: Wakers) {
    let mut conn: Option<Object> = None;
    let mut down = false;
    let mut batch: Vec<Job> = Vec::with_capacity(MAX_BATCH);
    while let Some(first) = jobs.recv().await {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        batch.sort_by(|a, b| a.order.cmp(&b.order));
        if conn.as_ref().is_none_or(|c| c.is_closed()) {
            conn = match pool.get().await {
                Ok(c) => Some(c),
                Err(e) => {
                    if !down {
                        tracing::error!(error = %e, "PostgreSQL unreachable; refusing mail (451) until it is back");
                        down = true;
                    }
                    let why = format!("PostgreSQL unreachable: {e}");
                    for job in batch.drain(..) {
                        job.work.finish(Some(StoreError::Unavailable(why.clone())));
                    }
                    continue;
                }
            };
        }
        let Some(c) = conn.as_ref() else { continue };
        if down {
            tracing::warn!("PostgreSQL is back; accepting mail again");
            down = false;
        }
        let answers = execute_batch(c, &mut batch).await;
        if c.is_closed() {
            conn = None; // reconnect for the next batch
        }
        let (mut woke_worker, mut woke_sender) = (false, false);
        for (job, error) in answers {
            if job.queues_mail && error.is_none() && !woke_worker {
                wakers.mail.notify_one();
                woke_worker = true;
            }
            if job.queues_events && error.is_none() && !woke_sender {
                wakers.events.notify_one();
                woke_sender = true;
            }
            job.work.finish(error);
        }
    }
    tracing::debug!("PostgreSQL writer stopped");
}

async fn execute_batch(c: &ClientWrapper, batch: &mut Vec<Job>) -> Vec<(Job, Option<StoreError>)> {
    match apply_all(c, batch).await {
        Ok(()) => batch.drain(..).map(|job| (job, None)).collect(),
        Err(e) if unreachable(&e) => {
            // COMMIT's answer may be what was lost: the batch may or may
            // not be in. Unavailable (451) is true either way, and a
            // client's retry then finds the replay or a free key. A lock
            // that did not come in time would not come for each job alone
            // either: no one-by-one retry.
            let why = format!("PostgreSQL unavailable: {}", describe(&e));
            tracing::warn!("{why}");
            batch
                .drain(..)
                .map(|job| (job, Some(StoreError::Unavailable(why.clone()))))
                .collect()
        }
        Err(e) => {
            tracing::warn!(error = %describe(&e), jobs = batch.len(), "batch failed; retrying jobs one by one");
            let mut out = Vec::with_capacity(batch.len());
            for job in batch.drain(..) {
                let mut single = [job];
                let result = apply_all(c, &mut single).await;
                let [job] = single;
                out.push((job, result.err().map(|e| classify(&e))));
            }
            out
        }
    }
}

/// Every job's statements go out pipelined (tokio-postgres sends each
/// request as soon as its future is polled, and the server runs them in
/// order), so a batch costs a few round trips, not a few per job. Their
/// order within the batch does not matter: a node never has two jobs for
/// one key at once (the in-progress claim). BEGIN is answered before any
/// job is sent, and COMMIT waits for every job's answer: sent after a
/// failed statement it would be a silent ROLLBACK.
async fn apply_all(c: &ClientWrapper, jobs: &mut [Job]) -> PgResult<()> {
    c.batch_execute("BEGIN").await?;
    let mut notify = String::new();
    if jobs.iter().any(|job| job.queues_mail) {
        notify.push_str(&format!("NOTIFY {QUEUED_CHANNEL};"));
    }
    if jobs.iter().any(|job| job.queues_events) {
        notify.push_str(&format!("NOTIFY {EVENTS_CHANNEL};"));
    }
    let (results, notified) = tokio::join!(
        futures_util::future::join_all(jobs.iter_mut().map(|job| job.work.apply(c))),
        async {
            // Other nodes' workers and senders wake on COMMIT (see
            // `listen`).
            if notify.is_empty() {
                Ok(())
            } else {
                c.batch_execute(&notify).await
            }
        }
    );
    if let Some(e) = results.into_iter().find_map(Result::err).or(notified.err()) {
        let _ = c.batch_execute("ROLLBACK").await;
        return Err(e);
    }
    c.batch_execute("COMMIT").await?;
    crate::metrics::global().commit_batch(jobs.len());
    Ok(())
}
