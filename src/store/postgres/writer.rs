//! The node's single writer: one connection on a task of its own, running
//! the shared batch loop (`store::batch`): group commit, each caller
//! answered only after COMMIT. As with SQLite, acceptances, claims,
//! records and purges all go through it. Here: the connection, the order
//! of a batch's jobs and the pipelined transaction.

use deadpool_postgres::{ClientWrapper, Object, Pool};
use tokio::sync::{mpsc, oneshot};

use super::{EVENTS_CHANNEL, QUEUED_CHANNEL, classify, describe, unreachable};
use crate::store::batch::{self, Answer, Answers, Pending, Reply, Wakers, WriteBatch};
use crate::store::{BoxFuture, StoreError};

pub(super) type PgResult<T> = Result<T, tokio_postgres::Error>;

/// One write (see `batch::Job`), a closure over the connection.
pub(crate) type Job = batch::Job<dyn Work>;

pub(crate) trait Work: Answer {
    /// Runs inside the batch's transaction. May run twice: a batch that
    /// fails is rolled back and each job retried alone.
    fn apply<'a>(&'a mut self, c: &'a ClientWrapper) -> BoxFuture<'a, PgResult<()>>;
    /// Jobs that lock ledger rows go in key order, so two nodes' batches
    /// never wait on each other in a circle.
    fn order(&self) -> &str;
}

impl<T, F> Work for Pending<T, F, String>
where
    T: Send,
    F: for<'c> FnMut(&'c ClientWrapper) -> BoxFuture<'c, PgResult<T>> + Send,
{
    fn apply<'a>(&'a mut self, c: &'a ClientWrapper) -> BoxFuture<'a, PgResult<()>> {
        Box::pin(async move {
            self.reply.keep((self.write)(c).await?);
            Ok(())
        })
    }

    fn order(&self) -> &str {
        &self.order
    }
}

impl Job {
    pub(crate) fn new<T, F>(
        queues_mail: bool,
        order: String,
        write: F,
    ) -> (Self, oneshot::Receiver<Result<T, StoreError>>)
    where
        T: Send + 'static,
        F: for<'c> FnMut(&'c ClientWrapper) -> BoxFuture<'c, PgResult<T>> + Send + 'static,
    {
        let (reply, rx) = Reply::channel();
        let work = Box::new(Pending {
            write,
            reply,
            order,
        });
        (Job::of(work, queues_mail), rx)
    }
}

pub(crate) async fn run(pool: Pool, jobs: mpsc::UnboundedReceiver<Job>, wakers: Wakers) {
    let writer = Writer {
        pool,
        conn: None,
        down: false,
    };
    batch::run(writer, jobs, wakers).await;
    tracing::debug!("PostgreSQL writer stopped");
}

struct Writer {
    pool: Pool,
    /// Kept from batch to batch; a new one once it is closed.
    conn: Option<Object>,
    /// PostgreSQL was unreachable at the last batch.
    down: bool,
}

impl WriteBatch for Writer {
    type Work = dyn Work;

    async fn write(&mut self, batch: &mut Vec<Job>) -> Answers<dyn Work> {
        batch.sort_by(|a, b| a.work.order().cmp(b.work.order()));
        let c = match self.connection().await {
            Ok(c) => c,
            Err(why) => return batch::refused(batch, || StoreError::Unavailable(why.clone())),
        };
        let answers = execute_batch(c, batch).await;
        if c.is_closed() {
            self.conn = None; // reconnect for the next batch
        }
        answers
    }
}

impl Writer {
    /// The writer's connection, made anew if it was closed; why not, if
    /// PostgreSQL cannot be reached.
    async fn connection(&mut self) -> Result<&Object, String> {
        let conn = match self.conn.take() {
            Some(c) if !c.is_closed() => c,
            // A closed connection is let go only once a new one is there.
            closed => match self.pool.get().await {
                Ok(c) => c,
                Err(e) => {
                    self.conn = closed;
                    if !self.down {
                        tracing::error!(error = %e, "PostgreSQL unreachable; refusing mail (451) until it is back");
                        self.down = true;
                    }
                    return Err(format!("PostgreSQL unreachable: {e}"));
                }
            },
        };
        if self.down {
            tracing::warn!("PostgreSQL is back; accepting mail again");
            self.down = false;
        }
        Ok(self.conn.insert(conn))
    }
}

async fn execute_batch(c: &ClientWrapper, batch: &mut Vec<Job>) -> Answers<dyn Work> {
    match apply_all(c, batch).await {
        Ok(()) => batch::committed(batch),
        Err(e) if unreachable(&e) => {
            // COMMIT's answer may be what was lost: the batch may or may
            // not be in. Unavailable (451) is true either way, and a
            // client's retry then finds the replay or a free key. A lock
            // that did not come in time would not come for each job alone
            // either: no one-by-one retry.
            let why = format!("PostgreSQL unavailable: {}", describe(&e));
            tracing::warn!("{why}");
            batch::refused(batch, || StoreError::Unavailable(why.clone()))
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
