//! Threads of our own for the CPU work on a message (MIME walk, parse,
//! fingerprint, `From:` check), so that it never runs on an async worker:
//! a large message would stall every other connection on that worker, and a
//! deep one could exhaust the worker's 2 MiB stack and abort the process.
//!
//! The MIME limits keep mail-parser's recursion shallow (100 levels by
//! default, never more than `MAX_MIME_DEPTH_CEILING`); these threads' large
//! stack is the second line: on 64 MiB a debug build parsed and dropped
//! 100,000 nested `message/rfc822` levels (2 MiB overflowed at ~33,000 in a
//! release build). And whatever a job does, a panic stays inside the job (its
//! caller gets [`ParsePoolError::JobFailed`]).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// Stack of each pool thread (reserved address space; only what is used is
/// backed by memory).
pub const STACK_SIZE: usize = 64 * 1024 * 1024;

type Job = Box<dyn FnOnce() + Send>;

#[derive(Debug, thiserror::Error)]
pub enum ParsePoolError {
    #[error("cannot start analysis thread: {0}")]
    Spawn(std::io::Error),
    #[error("the analysis pool has stopped")]
    Stopped,
    #[error("the analysis of the message failed (panic)")]
    JobFailed,
}

/// A fixed set of threads taking jobs from one queue. Dropping the pool lets
/// the threads finish their current job and exit.
pub struct ParsePool {
    jobs: mpsc::Sender<Job>,
}

impl ParsePool {
    /// Starts `threads` threads (at least one).
    pub fn start(threads: usize) -> Result<Self, ParsePoolError> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("smtp-once-parse-{i}"))
                .stack_size(STACK_SIZE)
                .spawn(move || work(&rx))
                .map_err(ParsePoolError::Spawn)?;
        }
        Ok(Self { jobs: tx })
    }

    /// One thread per core, at least two, at most eight: the work is CPU
    /// bound, more threads would only queue inside the kernel instead.
    pub fn default_threads() -> usize {
        std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .clamp(2, 8)
    }

    /// Runs `f` on a pool thread and waits for its result without blocking
    /// the async worker.
    pub async fn run<T, F>(&self, f: F) -> Result<T, ParsePoolError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move || {
            // The receiver may be gone (connection dropped): nothing to do.
            let _ = tx.send(f());
        });
        self.jobs.send(job).map_err(|_| ParsePoolError::Stopped)?;
        // A job that panicked dropped its sender.
        rx.await.map_err(|_| ParsePoolError::JobFailed)
    }
}

fn work(jobs: &Mutex<mpsc::Receiver<Job>>) {
    loop {
        let job = {
            let queue = jobs
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match queue.recv() {
                Ok(job) => job,
                Err(_) => return,
            }
        };
        // The panic message goes to stderr through the default hook; the
        // thread lives on for the next job.
        let _ = catch_unwind(AssertUnwindSafe(job));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn runs_jobs_and_survives_panics() {
        let pool = ParsePool::start(1).expect("pool");
        assert_eq!(pool.run(|| 6 * 7).await.expect("job"), 42);
        let failed = pool.run(|| -> u32 { panic!("boom") }).await;
        assert!(matches!(failed, Err(ParsePoolError::JobFailed)));
        // The one thread is still there.
        assert_eq!(pool.run(|| 1).await.expect("job"), 1);
    }

    #[tokio::test]
    async fn jobs_get_the_large_stack() {
        let pool = ParsePool::start(1).expect("pool");
        // 16 MiB on the stack would overflow a default 2 MiB thread.
        let n = pool
            .run(|| {
                let buf = [1u8; 16 * 1024 * 1024];
                std::hint::black_box(&buf)
                    .iter()
                    .map(|&b| usize::from(b))
                    .sum::<usize>()
            })
            .await
            .expect("job");
        assert_eq!(n, 16 * 1024 * 1024);
    }

    #[tokio::test]
    async fn the_issue_message_parses_on_the_pool_stack_even_unchecked() {
        // Belt and braces: without the MIME limits, 33,000 nested
        // `message/rfc822` parts overflow a 2 MiB stack; here they do not
        // (a debug build measured up to 100,000 levels on 64 MiB).
        let mut m = b"Content-Type: multipart/mixed; boundary=B\r\n\r\n--B\r\n".to_vec();
        for _ in 0..33_000 {
            m.extend_from_slice(b"Content-Type: message/rfc822\r\n\r\n");
        }
        m.extend_from_slice(b"\r\n--B--\r\n");
        let pool = ParsePool::start(1).expect("pool");
        let parsed = pool
            .run(move || {
                mail_parser::MessageParser::default()
                    .parse(&m[..])
                    .is_some()
            })
            .await
            .expect("job");
        assert!(parsed);
    }
}
