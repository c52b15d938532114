//! Total time budgets for one session, on top of the per-read idle
//! timeouts: a command line must be complete within `command_time_limit`
//! of the previous reply, and a message body (all of DATA, or every BDAT
//! chunk up to LAST) within `message_time_limit` of its start. Per-read
//! timeouts alone let a client that sends one byte every few seconds keep a
//! session for ever.

use std::time::Duration;

use tokio::time::Instant;

/// The limits a session is held to.
#[derive(Debug, Clone, Copy)]
pub struct TimeLimits {
    /// Longest wait for one read between commands.
    pub command_timeout: Duration,
    /// Longest wait for one read inside a message body.
    pub data_timeout: Duration,
    pub command_time_limit: Duration,
    pub message_time_limit: Duration,
}

/// Which limit ends the next read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expiry {
    /// Nothing arrived for a whole per-read timeout.
    Idle,
    /// Nothing arrived for the short per-read timeout that applies while
    /// the connection cap is reached (`load.rs`).
    IdleAtCap,
    CommandTimeLimit,
    MessageTimeLimit,
}

/// Where the session's budgets started.
#[derive(Debug)]
pub(super) struct Budget {
    limits: TimeLimits,
    command_started: Instant,
    message_started: Option<Instant>,
}

/// What the driver knows about the session before a read.
#[derive(Debug, Clone, Copy)]
pub(super) struct Progress {
    /// Replies were written since the last read: a command completed.
    pub replied: bool,
    /// Inside a DATA or BDAT body (the data timeout applies to reads).
    pub in_data: bool,
    /// A message is under way (inside a body, or between BDAT chunks).
    pub in_message: bool,
}

impl Budget {
    pub(super) fn new(limits: TimeLimits, now: Instant) -> Self {
        Self {
            limits,
            command_started: now,
            message_started: None,
        }
    }

    /// The session's state after replies went out and before the next
    /// read: restarts the clocks that a completed command or message ends.
    pub(super) fn update(&mut self, now: Instant, progress: Progress) {
        if progress.replied {
            self.command_started = now;
        }
        if !progress.in_message {
            self.message_started = None;
        } else if self.message_started.is_none() {
            self.message_started = Some(now);
        }
    }

    /// When the next read must be done by, and which limit that is.
    pub(super) fn next_deadline(&self, now: Instant, progress: Progress) -> (Instant, Expiry) {
        let l = &self.limits;
        let mut best = if progress.in_data {
            (now + l.data_timeout, Expiry::Idle)
        } else {
            let idle = (now + l.command_timeout, Expiry::Idle);
            let command = (
                self.command_started + l.command_time_limit,
                Expiry::CommandTimeLimit,
            );
            if command.0 < idle.0 { command } else { idle }
        };
        if let Some(started) = self.message_started {
            let message = started + l.message_time_limit;
            if message < best.0 {
                best = (message, Expiry::MessageTimeLimit);
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn limits() -> TimeLimits {
        TimeLimits {
            command_timeout: 300 * S,
            data_timeout: 120 * S,
            command_time_limit: 10 * S,
            message_time_limit: 60 * S,
        }
    }

    fn progress(replied: bool, in_data: bool, in_message: bool) -> Progress {
        Progress {
            replied,
            in_data,
            in_message,
        }
    }

    #[test]
    fn a_command_must_finish_within_its_budget_across_reads() {
        let t0 = Instant::now();
        let mut b = Budget::new(limits(), t0);
        let p = progress(false, false, false);
        // A trickle of bytes: each read is quick, the budget keeps running.
        b.update(t0 + 4 * S, p);
        assert_eq!(
            b.next_deadline(t0 + 4 * S, p),
            (t0 + 10 * S, Expiry::CommandTimeLimit)
        );
        // A reply restarts it.
        let replied = progress(true, false, false);
        b.update(t0 + 8 * S, replied);
        assert_eq!(
            b.next_deadline(t0 + 8 * S, replied),
            (t0 + 18 * S, Expiry::CommandTimeLimit)
        );
    }

    #[test]
    fn idle_timeout_wins_when_shorter() {
        let t0 = Instant::now();
        let mut l = limits();
        l.command_timeout = 2 * S;
        let b = Budget::new(l, t0);
        let p = progress(false, false, false);
        assert_eq!(b.next_deadline(t0, p), (t0 + 2 * S, Expiry::Idle));
    }

    #[test]
    fn a_message_budget_spans_data_reads_and_bdat_chunks() {
        let t0 = Instant::now();
        let mut b = Budget::new(limits(), t0);
        let body = progress(true, true, true);
        b.update(t0, body);
        assert_eq!(b.next_deadline(t0 + 50 * S, body).0, t0 + 60 * S);
        assert_eq!(
            b.next_deadline(t0 + 50 * S, body).1,
            Expiry::MessageTimeLimit
        );
        // Between BDAT chunks: the command budget and the message budget.
        let between = progress(true, false, true);
        b.update(t0 + 55 * S, between);
        assert_eq!(
            b.next_deadline(t0 + 55 * S, between),
            (t0 + 60 * S, Expiry::MessageTimeLimit)
        );
        // The message is done: its budget is gone.
        let done = progress(true, false, false);
        b.update(t0 + 59 * S, done);
        assert_eq!(
            b.next_deadline(t0 + 59 * S, done),
            (t0 + 69 * S, Expiry::CommandTimeLimit)
        );
    }
}
