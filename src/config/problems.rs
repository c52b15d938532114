//! `Problems`: what a config check found, each as `key: message`. Every
//! section's check writes into one, so `check-config` lists them all at once.
//! The floor of `config/`: it imports no section.

use std::fmt::Display;
use std::time::Duration;

use super::duration::parse_duration;

/// The problems found so far, each as `key: message`.
#[derive(Default)]
pub(super) struct Problems(pub(super) Vec<String>);

impl Problems {
    pub(super) fn add(&mut self, key: impl Display, message: impl Display) {
        self.0.push(format!("{key}: {message}"));
    }

    /// Counts that size a semaphore, which panics above its maximum.
    pub(super) fn at_most_permits(&mut self, key: &str, n: usize) {
        let max = tokio::sync::Semaphore::MAX_PERMITS;
        if n > max {
            self.add(key, format!("must be at most {max}"));
        }
    }

    /// The duration `value` says; zero after a problem (so later checks
    /// run on a value that cannot overflow).
    pub(super) fn duration(&mut self, key: &str, value: &str) -> Duration {
        parse_duration(value).unwrap_or_else(|e| {
            self.add(key, e);
            Duration::ZERO
        })
    }
}
