//! What both stores' writers share, whatever the database: callers hand
//! jobs to one writer per node through a channel; each batch takes every
//! job waiting (up to `MAX_BATCH`) into one transaction (group commit);
//! each caller gets its answer only after COMMIT, and the delivery worker
//! and the webhook sender are woken at most once a batch. Nothing sleeps
//! to collect a batch, so a lone job commits at once. How a batch is
//! written stays with each backend: `sqlite/writer.rs` (rusqlite on a
//! thread of its own), `postgres/writer.rs` (pipelined on a task).

use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, mpsc, oneshot};

use super::{BoxFuture, StoreError};

/// Upper bound on jobs per transaction, to bound latency and memory.
pub(crate) const MAX_BATCH: usize = 256;

/// Who to wake after a commit: the delivery worker (mail queued) and the
/// webhook sender (events written).
#[derive(Clone, Default)]
pub(crate) struct Wakers {
    pub(crate) mail: Arc<Notify>,
    pub(crate) events: Arc<Notify>,
}

/// What a backend's job does once its batch is settled.
pub(crate) trait Answer: Send {
    /// Answers the waiting caller, only after COMMIT. A caller that went
    /// away no longer needs the answer; the commit stands either way.
    fn finish(self: Box<Self>, error: Option<StoreError>);
}

/// One write: acceptances, delivery claims and outcomes, purges alike, so
/// the two paths share one lock holder and one commit per batch. `W` is
/// the backend's work, run inside its transaction.
pub(crate) struct Job<W: ?Sized> {
    pub(crate) work: Box<W>,
    /// The job may put a message in the queue: the delivery worker is woken
    /// after the commit.
    pub(crate) queues_mail: bool,
    /// The job may write webhook events: the webhook sender is woken.
    pub(crate) queues_events: bool,
}

impl<W: ?Sized + Answer> Job<W> {
    pub(crate) fn of(work: Box<W>, queues_mail: bool) -> Self {
        Job {
            work,
            queues_mail,
            queues_events: false,
        }
    }

    /// Marks the job as one that writes webhook events (if `yes`).
    pub(crate) fn with_events<T>(
        (mut job, rx): (Self, oneshot::Receiver<T>),
        yes: bool,
    ) -> (Self, oneshot::Receiver<T>) {
        job.queues_events = yes;
        (job, rx)
    }

    fn finish(self, error: Option<StoreError>) {
        self.work.finish(error);
    }
}

/// A job as a backend's `Work`: its write (a closure over the backend's
/// transaction), its answer, and the order the backend gives it within a
/// batch, if it orders batches (PostgreSQL: a key; SQLite: `()`).
pub(crate) struct Pending<T, F, O = ()> {
    pub(crate) write: F,
    pub(crate) reply: Reply<T>,
    pub(crate) order: O,
}

impl<T: Send, F: Send, O: Send> Answer for Pending<T, F, O> {
    fn finish(self: Box<Self>, error: Option<StoreError>) {
        self.reply.send(error);
    }
}

/// A job's answer: the value its write produced, sent once the batch is
/// settled.
pub(crate) struct Reply<T> {
    value: Option<T>,
    to: oneshot::Sender<Result<T, StoreError>>,
}

impl<T> Reply<T> {
    pub(crate) fn channel() -> (Self, oneshot::Receiver<Result<T, StoreError>>) {
        let (to, rx) = oneshot::channel();
        (Reply { value: None, to }, rx)
    }

    /// Keeps what the write produced. A job may run twice (a failed batch
    /// is retried job by job): the last run's value is the one sent.
    pub(crate) fn keep(&mut self, value: T) {
        self.value = Some(value);
    }

    pub(crate) fn send(self, error: Option<StoreError>) {
        let answer = match (error, self.value) {
            (Some(e), _) => Err(e),
            (None, Some(v)) => Ok(v),
            (None, None) => Err(StoreError::Transient("job was not applied".into())),
        };
        let _ = self.to.send(answer);
    }
}

/// Each job of a batch with its error, if it failed.
pub(crate) type Answers<W> = Vec<(Job<W>, Option<StoreError>)>;

/// The whole batch committed.
pub(crate) fn committed<W: ?Sized>(batch: &mut Vec<Job<W>>) -> Answers<W> {
    batch.drain(..).map(|job| (job, None)).collect()
}

/// The whole batch refused with the same error.
pub(crate) fn refused<W: ?Sized>(
    batch: &mut Vec<Job<W>>,
    error: impl Fn() -> StoreError,
) -> Answers<W> {
    batch.drain(..).map(|job| (job, Some(error()))).collect()
}

/// How a backend writes one batch (on a task): in one transaction, or job
/// by job after a failure. Answers nobody: the loop does.
pub(crate) trait WriteBatch {
    type Work: ?Sized + Answer;
    async fn write(&mut self, batch: &mut Vec<Job<Self::Work>>) -> Answers<Self::Work>;
}

/// The writer's loop on a task, until every sender is gone.
pub(crate) async fn run<B: WriteBatch>(
    mut writer: B,
    mut jobs: mpsc::UnboundedReceiver<Job<B::Work>>,
    wakers: Wakers,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while let Some(first) = jobs.recv().await {
        gather(first, &mut jobs, &mut batch);
        answer(writer.write(&mut batch).await, &wakers);
    }
}

/// The writer's loop on a thread of its own (a synchronous driver), until
/// every sender is gone.
pub(crate) fn run_blocking<W: ?Sized + Answer>(
    mut jobs: mpsc::UnboundedReceiver<Job<W>>,
    wakers: &Wakers,
    mut write: impl FnMut(&mut Vec<Job<W>>) -> Answers<W>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while let Some(first) = jobs.blocking_recv() {
        gather(first, &mut jobs, &mut batch);
        answer(write(&mut batch), wakers);
    }
}

/// The first job and every one already waiting, up to `MAX_BATCH`.
fn gather<J>(first: J, jobs: &mut mpsc::UnboundedReceiver<J>, batch: &mut Vec<J>) {
    batch.push(first);
    while batch.len() < MAX_BATCH {
        match jobs.try_recv() {
            Ok(job) => batch.push(job),
            Err(_) => break,
        }
    }
}

/// Answers every job, waking the worker and the sender once each if a job
/// that succeeded calls for it.
fn answer<W: ?Sized + Answer>(answers: Answers<W>, wakers: &Wakers) {
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

/// The store's end of its writer's channel.
pub(crate) struct JobSender<J> {
    sender: Mutex<Option<mpsc::UnboundedSender<J>>>,
    /// The writer's name in the error once it has stopped.
    writer: &'static str,
}

impl<J> JobSender<J> {
    pub(crate) fn channel(writer: &'static str) -> (Self, mpsc::UnboundedReceiver<J>) {
        let (sender, rx) = mpsc::unbounded_channel();
        let sender = Mutex::new(Some(sender));
        (JobSender { sender, writer }, rx)
    }

    /// Hands a job to the writer now and returns its answer, which comes
    /// after COMMIT. Sent before the future is polled, so the future does
    /// not borrow the store.
    pub(crate) fn submit<T: Send + 'static>(
        &self,
        (job, answer): (J, oneshot::Receiver<Result<T, StoreError>>),
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        let sent = self.send(job);
        let writer = self.writer;
        Box::pin(async move {
            sent?;
            answer.await.map_err(|_| stopped(writer))?
        })
    }

    fn send(&self, job: J) -> Result<(), StoreError> {
        let sender = self.sender.lock().map_err(|_| stopped(self.writer))?;
        sender
            .as_ref()
            .ok_or_else(|| stopped(self.writer))?
            .send(job)
            .map_err(|_| stopped(self.writer))
    }

    /// Stops the writer after the jobs already sent: it ends once it has
    /// answered them.
    pub(crate) fn close(&self) {
        if let Ok(mut sender) = self.sender.lock() {
            sender.take();
        }
    }
}

fn stopped(writer: &str) -> StoreError {
    StoreError::Unavailable(format!("{writer} has stopped"))
}
