//! Logging of accept failures without flooding the log.

use std::time::Duration;

/// Accept failures (EMFILE, ENFILE, ENOBUFS) repeat every pause while they
/// last: log the first, then a summary at most every 10 s, so that running
/// out of descriptors doesn't also fill the disk with log lines.
#[derive(Default)]
pub(super) struct AcceptErrors {
    since_logged: u64,
    last_logged: Option<tokio::time::Instant>,
}

impl AcceptErrors {
    const EVERY: Duration = Duration::from_secs(10);

    pub(super) fn failed(&mut self, listener: &str, error: &std::io::Error) {
        let now = tokio::time::Instant::now();
        if self
            .last_logged
            .is_some_and(|at| now.duration_since(at) < Self::EVERY)
        {
            self.since_logged += 1;
            return;
        }
        tracing::warn!(
            %error,
            listener,
            repeated = self.since_logged,
            "accept failed; pausing accepts"
        );
        self.since_logged = 0;
        self.last_logged = Some(now);
    }

    pub(super) fn recovered(&mut self) {
        if self.last_logged.take().is_some() {
            tracing::info!(repeated = self.since_logged, "accepting connections again");
            self.since_logged = 0;
        }
    }
}
