//! The metric families, on the ground floor so that every layer (store,
//! auth, delivery, server, accept) can count without knowing the others or
//! the listener that serves them (`metrics_http.rs`).
//!
//! One process-wide [`Metrics`], reached through [`global`]: a daemon is one
//! process, the counting points sit deep inside threads and tasks that
//! several front ends share (the store's writer thread, the auth
//! throttle, the delivery worker), and passing an `Arc<Metrics>` through
//! every constructor would widen signatures that have nothing else to do
//! with metrics. Each update is a relaxed atomic add, whether or not a
//! `[metrics]` listener serves them. Tests that check the text output build
//! their own `Metrics::new()`.
//!
//! Low cardinality by construction: every label value is a `&'static str`
//! from a fixed set (an enum's `as_str`), never a user, key or address, and
//! every value of every set is there from the first scrape.
//!
//! [`text`]: the Prometheus text format 0.0.4 beside OpenMetrics.

mod text;

pub use text::Format;

use std::sync::OnceLock;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// Where a submission came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    Smtp,
    Http,
}

impl Channel {
    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Smtp => "smtp",
            Channel::Http => "http",
        }
    }
}

/// What a submission came to (one per reply).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Committed and queued (`250` / `202`).
    Accepted,
    /// A retry under a known key got the stored reply again.
    Replayed,
    /// A known key with a different message (E01005).
    Conflict,
    /// The key's first submission is still running (E01004).
    InProgress,
    /// A bad key or message refused before the ledger (E01001, MIME limits).
    Invalid,
    /// The store could not be reached or failed (E01033, `451`).
    Unavailable,
    /// Refused by policy (sender not allowed, stored `553`).
    Rejected,
}

impl Outcome {
    pub const ALL: [Outcome; 7] = [
        Outcome::Accepted,
        Outcome::Replayed,
        Outcome::Conflict,
        Outcome::InProgress,
        Outcome::Invalid,
        Outcome::Unavailable,
        Outcome::Rejected,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Accepted => "accepted",
            Outcome::Replayed => "replayed",
            Outcome::Conflict => "conflict",
            Outcome::InProgress => "in_progress",
            Outcome::Invalid => "invalid",
            Outcome::Unavailable => "unavailable",
            Outcome::Rejected => "rejected",
        }
    }
}

/// Why an AUTH attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    /// Wrong name or password.
    Invalid,
    /// The client address is banned after too many failures.
    IpBanned,
    /// The account is locked for this address after too many failures.
    AccountLocked,
}

impl AuthFailure {
    pub const ALL: [AuthFailure; 3] = [
        AuthFailure::Invalid,
        AuthFailure::IpBanned,
        AuthFailure::AccountLocked,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AuthFailure::Invalid => "invalid",
            AuthFailure::IpBanned => "ip_banned",
            AuthFailure::AccountLocked => "account_locked",
        }
    }
}

/// The queue states shown as `smtp_once_queue_messages{state}`: messages
/// still in the queue (finished ones are not queue depth).
pub const QUEUE_STATES: [&str; 4] = ["queued", "deferred", "delivering", "held"];

/// The outcomes of `smtp_once_delivery_attempts_total`: the delivery
/// plan's recipient outcomes (`delivery::plan::Outcome::as_str`), which
/// this ground-floor module cannot name.
pub const DELIVERY_OUTCOMES: [&str; 4] = ["delivered", "deferred", "failed", "expired"];

/// The outcomes of `smtp_once_webhook_attempts_total`.
pub const WEBHOOK_OUTCOMES: [&str; 3] = ["delivered", "retry", "failed"];

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SubmissionLabels {
    channel: &'static str,
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ChannelLabel {
    channel: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AuthFailureLabels {
    channel: &'static str,
    reason: &'static str,
}

fn latency_histogram() -> Histogram {
    // 0.5 ms .. ~16 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// Typed handles on every family, and the registry that renders them.
pub struct Metrics {
    registry: Registry,
    submissions: Family<SubmissionLabels, Counter>,
    submission_seconds: Family<ChannelLabel, Histogram, fn() -> Histogram>,
    commit_batch: Histogram,
    queue_messages: Family<StateLabel, Gauge>,
    oldest_queued_seconds: Gauge<f64, AtomicU64>,
    queue_count_seconds: Gauge<f64, AtomicU64>,
    delivery_attempts: Family<OutcomeLabel, Counter>,
    webhook_attempts: Family<OutcomeLabel, Counter>,
    connections_active: Gauge,
    connections: Counter,
    auth_failures: Family<AuthFailureLabels, Counter>,
    backlog_messages: Gauge,
    inflow_wait_seconds: Counter<f64, AtomicU64>,
    ledger_purged: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("smtp_once");
        let submissions = Family::<SubmissionLabels, Counter>::default();
        registry.register(
            "submissions",
            "Submissions by channel (smtp, http) and outcome",
            submissions.clone(),
        );
        let submission_seconds =
            Family::<ChannelLabel, Histogram, fn() -> Histogram>::new_with_constructor(
                latency_histogram,
            );
        registry.register_with_unit(
            "submission_latency",
            "From the end of the message (SMTP end of data, HTTP request body) to the reply being ready",
            Unit::Seconds,
            submission_seconds.clone(),
        );
        // Powers of two up to the writers' MAX_BATCH (256).
        let commit_batch = Histogram::new(exponential_buckets(1.0, 2.0, 9));
        registry.register(
            "commit_batch_jobs",
            "Jobs (acceptances, claims, records, purges) per group-committed store transaction",
            commit_batch.clone(),
        );
        let queue_messages = Family::<StateLabel, Gauge>::default();
        registry.register(
            "queue_messages",
            "Messages in the queue by state, counted every 2 s in the background (less often when a count takes over 0.2 s)",
            queue_messages.clone(),
        );
        let oldest_queued_seconds = Gauge::<f64, AtomicU64>::default();
        registry.register_with_unit(
            "queue_oldest_age",
            "Age of the oldest message waiting for delivery (queued, deferred or delivering); 0 when none",
            Unit::Seconds,
            oldest_queued_seconds.clone(),
        );
        let queue_count_seconds = Gauge::<f64, AtomicU64>::default();
        registry.register_with_unit(
            "queue_count",
            "How long the last count of the queue by state took (done in the background, not by a scrape)",
            Unit::Seconds,
            queue_count_seconds.clone(),
        );
        let delivery_attempts = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "delivery_attempts",
            "Recipient results of delivery attempts by outcome (delivered, deferred, failed, expired)",
            delivery_attempts.clone(),
        );
        let webhook_attempts = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "webhook_attempts",
            "Webhook POSTs by what they led to (delivered, retry, failed)",
            webhook_attempts.clone(),
        );
        let connections_active = Gauge::default();
        registry.register(
            "smtp_connections_active",
            "SMTP connections open now (refused ones not counted)",
            connections_active.clone(),
        );
        let connections = Counter::default();
        registry.register(
            "smtp_connections",
            "SMTP connections admitted since start",
            connections.clone(),
        );
        let auth_failures = Family::<AuthFailureLabels, Counter>::default();
        registry.register(
            "auth_failures",
            "Failed authentications by channel (smtp: AUTH, http: API key) and reason (invalid, ip_banned, account_locked)",
            auth_failures.clone(),
        );
        let backlog_messages = Gauge::default();
        registry.register(
            "backlog_messages",
            "Messages waiting for delivery (queued or delivering) as this node estimates them: acceptance waits while it is over [relay] max_backlog",
            backlog_messages.clone(),
        );
        let inflow_wait_seconds = Counter::<f64, AtomicU64>::default();
        registry.register_with_unit(
            "inflow_wait",
            "Time acceptances spent waiting for room in the relay's backlog ([relay] in_flow_delay)",
            Unit::Seconds,
            inflow_wait_seconds.clone(),
        );
        let ledger_purged = Counter::default();
        registry.register(
            "ledger_purged",
            "Expired ledger entries removed by the housekeeping purge",
            ledger_purged.clone(),
        );
        let metrics = Metrics {
            registry,
            ledger_purged,
            backlog_messages,
            inflow_wait_seconds,
            submissions,
            submission_seconds,
            commit_batch,
            queue_messages,
            oldest_queued_seconds,
            queue_count_seconds,
            delivery_attempts,
            webhook_attempts,
            connections_active,
            connections,
            auth_failures,
        };
        // Every series that is known in advance shows from the first
        // scrape, at zero, so that rate() and alerts see a start.
        for channel in [Channel::Smtp, Channel::Http] {
            for reason in AuthFailure::ALL {
                let _ = metrics.auth_failures.get_or_create(&AuthFailureLabels {
                    channel: channel.as_str(),
                    reason: reason.as_str(),
                });
            }
            for outcome in Outcome::ALL {
                let _ = metrics.submissions.get_or_create(&SubmissionLabels {
                    channel: channel.as_str(),
                    outcome: outcome.as_str(),
                });
            }
        }
        for channel in [Channel::Smtp, Channel::Http] {
            let _ = metrics.submission_seconds.get_or_create(&ChannelLabel {
                channel: channel.as_str(),
            });
        }
        for state in QUEUE_STATES {
            let _ = metrics.queue_messages.get_or_create(&StateLabel { state });
        }
        for outcome in DELIVERY_OUTCOMES {
            let _ = metrics
                .delivery_attempts
                .get_or_create(&OutcomeLabel { outcome });
        }
        for outcome in WEBHOOK_OUTCOMES {
            let _ = metrics
                .webhook_attempts
                .get_or_create(&OutcomeLabel { outcome });
        }
        metrics
    }

    /// Renders every family in OpenMetrics text (`# EOF` ended).
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }

    /// Renders every family in `format`.
    pub fn render_as(&self, format: Format) -> Result<String, std::fmt::Error> {
        let openmetrics = self.render()?;
        Ok(match format {
            Format::OpenMetrics => openmetrics,
            Format::Text => text::from_openmetrics(&openmetrics),
        })
    }

    /// One submission's outcome, counted once per reply.
    pub fn submission(&self, channel: Channel, outcome: Outcome) {
        self.submissions
            .get_or_create(&SubmissionLabels {
                channel: channel.as_str(),
                outcome: outcome.as_str(),
            })
            .inc();
    }

    /// SMTP: from the end of DATA/BDAT LAST to the reply being ready.
    pub fn end_of_data_seconds(&self, seconds: f64) {
        self.submission_seconds(Channel::Smtp, seconds);
    }

    /// HTTP: from the request body read to the response being ready.
    pub fn request_seconds(&self, seconds: f64) {
        self.submission_seconds(Channel::Http, seconds);
    }

    fn submission_seconds(&self, channel: Channel, seconds: f64) {
        self.submission_seconds
            .get_or_create(&ChannelLabel {
                channel: channel.as_str(),
            })
            .observe(seconds);
    }

    /// A store transaction committed with `jobs` jobs in it.
    pub fn commit_batch(&self, jobs: usize) {
        // usize to f64: exact up to 2^53, far beyond any batch.
        #[allow(clippy::cast_precision_loss)]
        self.commit_batch.observe(jobs as f64);
    }

    /// The queue's depth as last read: `counts` per state (states from
    /// [`QUEUE_STATES`]; a missing one is 0), and the oldest waiting
    /// message's age.
    pub fn queue_depth(&self, counts: &[(&'static str, u64)], oldest_seconds: f64) {
        for state in QUEUE_STATES {
            let n = counts
                .iter()
                .find(|(s, _)| *s == state)
                .map_or(0, |(_, n)| *n);
            self.queue_messages
                .get_or_create(&StateLabel { state })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.oldest_queued_seconds.set(oldest_seconds);
    }

    /// The backlog estimate an acceptance last compared with its limit.
    pub fn backlog(&self, messages: u64) {
        self.backlog_messages
            .set(i64::try_from(messages).unwrap_or(i64::MAX));
    }

    /// An acceptance waited this long for room in the backlog.
    pub fn inflow_wait(&self, seconds: f64) {
        self.inflow_wait_seconds.inc_by(seconds);
    }

    /// Expired ledger entries removed by one purge batch.
    pub fn ledger_purged(&self, entries: usize) {
        self.ledger_purged
            .inc_by(u64::try_from(entries).unwrap_or(u64::MAX));
    }

    /// How long the last read of the queue's depth took.
    pub fn queue_count_seconds(&self, seconds: f64) {
        self.queue_count_seconds.set(seconds);
    }

    /// One recipient's result in a delivery attempt (`Outcome::as_str` of
    /// the delivery plan: delivered, deferred, failed, expired).
    pub fn delivery_attempt(&self, outcome: &'static str) {
        // A new outcome belongs in DELIVERY_OUTCOMES, to show from the start.
        debug_assert!(DELIVERY_OUTCOMES.contains(&outcome), "{outcome}");
        self.delivery_attempts
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    /// One webhook POST: delivered, retry (scheduled again) or failed (the
    /// schedule is exhausted).
    pub fn webhook_attempt(&self, outcome: &'static str) {
        debug_assert!(WEBHOOK_OUTCOMES.contains(&outcome), "{outcome}");
        self.webhook_attempts
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    pub fn connection_opened(&self) {
        self.connections.inc();
        self.connections_active.inc();
    }

    pub fn connection_closed(&self) {
        self.connections_active.dec();
    }

    /// Counts a connection as open until the guard is dropped (also when
    /// its task is aborted at the end of the shutdown grace).
    pub fn connection(&'static self) -> ConnectionGuard {
        self.connection_opened();
        ConnectionGuard { metrics: self }
    }

    pub fn auth_failure(&self, channel: Channel, reason: AuthFailure) {
        self.auth_failures
            .get_or_create(&AuthFailureLabels {
                channel: channel.as_str(),
                reason: reason.as_str(),
            })
            .inc();
    }
}

/// The counters the console's overview samples (its own chart of the last
/// hour, no Prometheus needed): running totals since the process started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Submissions committed and queued, every channel.
    pub accepted: u64,
    /// Recipients delivered.
    pub delivered: u64,
    /// Failed logins and wrong API keys (wrong credentials, locked
    /// accounts), every channel.
    pub auth_failures: u64,
    /// Attempts refused because the address was banned.
    pub banned_refusals: u64,
}

impl Metrics {
    /// The running totals of [`Totals`].
    pub fn totals(&self) -> Totals {
        let mut t = Totals::default();
        for channel in [Channel::Smtp, Channel::Http] {
            t.accepted += self
                .submissions
                .get_or_create(&SubmissionLabels {
                    channel: channel.as_str(),
                    outcome: Outcome::Accepted.as_str(),
                })
                .get();
            for reason in AuthFailure::ALL {
                let n = self
                    .auth_failures
                    .get_or_create(&AuthFailureLabels {
                        channel: channel.as_str(),
                        reason: reason.as_str(),
                    })
                    .get();
                if reason == AuthFailure::IpBanned {
                    t.banned_refusals += n;
                } else {
                    t.auth_failures += n;
                }
            }
        }
        t.delivered = self
            .delivery_attempts
            .get_or_create(&OutcomeLabel {
                outcome: "delivered",
            })
            .get();
        t
    }
}

/// See [`Metrics::connection`].
pub struct ConnectionGuard {
    metrics: &'static Metrics,
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.metrics.connection_closed();
    }
}

/// The process's metrics (see the module comment for why one per process).
pub fn global() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line starting with {prefix:?} in:\n{text}"))
    }

    fn value(text: &str, series: &str) -> f64 {
        let l = line(text, &format!("{series} "));
        l.rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("bad value in {l:?}"))
    }

    #[test]
    fn every_known_series_starts_at_zero() {
        let text = Metrics::new().render().expect("render");
        assert_eq!(
            value(
                &text,
                r#"smtp_once_submissions_total{channel="http",outcome="in_progress"}"#
            ),
            0.0
        );
        assert_eq!(
            value(&text, r#"smtp_once_queue_messages{state="held"}"#),
            0.0
        );
        assert_eq!(value(&text, "smtp_once_smtp_connections_active"), 0.0);
        assert!(text.contains("# TYPE smtp_once_commit_batch_jobs histogram"));
        assert!(text.contains("# UNIT smtp_once_queue_oldest_age_seconds seconds"));
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn updates_show_in_the_text_format() {
        let m = Metrics::new();
        m.submission(Channel::Smtp, Outcome::Accepted);
        m.submission(Channel::Smtp, Outcome::Accepted);
        m.submission(Channel::Http, Outcome::Replayed);
        m.end_of_data_seconds(0.003);
        m.commit_batch(3);
        m.commit_batch(200);
        m.queue_depth(&[("queued", 5), ("deferred", 2)], 12.5);
        m.delivery_attempt("delivered");
        m.connection_opened();
        m.connection_opened();
        m.connection_closed();
        m.auth_failure(Channel::Smtp, AuthFailure::Invalid);
        let text = m.render().expect("render");
        let v = |s: &str| value(&text, s);
        assert_eq!(
            v(r#"smtp_once_submissions_total{channel="smtp",outcome="accepted"}"#),
            2.0
        );
        assert_eq!(
            v(r#"smtp_once_submissions_total{channel="http",outcome="replayed"}"#),
            1.0
        );
        assert_eq!(
            v(r#"smtp_once_submission_latency_seconds_count{channel="smtp"}"#),
            1.0
        );
        assert_eq!(
            v(r#"smtp_once_submission_latency_seconds_bucket{le="0.004",channel="smtp"}"#),
            1.0
        );
        assert_eq!(v("smtp_once_commit_batch_jobs_count"), 2.0);
        assert_eq!(v("smtp_once_commit_batch_jobs_sum"), 203.0);
        assert_eq!(v(r#"smtp_once_commit_batch_jobs_bucket{le="4.0"}"#), 1.0);
        assert_eq!(v(r#"smtp_once_queue_messages{state="queued"}"#), 5.0);
        assert_eq!(v(r#"smtp_once_queue_messages{state="delivering"}"#), 0.0);
        assert_eq!(v("smtp_once_queue_oldest_age_seconds"), 12.5);
        assert_eq!(
            v(r#"smtp_once_delivery_attempts_total{outcome="delivered"}"#),
            1.0
        );
        assert_eq!(v("smtp_once_smtp_connections_active"), 1.0);
        assert_eq!(v("smtp_once_smtp_connections_total"), 2.0);
        assert_eq!(
            v(r#"smtp_once_auth_failures_total{channel="smtp",reason="invalid"}"#),
            1.0
        );
    }

    #[test]
    fn the_text_format_names_every_family_with_help_and_type() {
        let m = Metrics::new();
        m.delivery_attempt("delivered");
        let text = m.render_as(Format::Text).expect("render");
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
        let typed: Vec<(&str, &str)> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE ")?.split_once(' '))
            .collect();
        assert_eq!(typed.len(), 14, "one TYPE per family:\n{text}");
        for (name, kind) in &typed {
            assert!(text.contains(&format!("# HELP {name} ")), "{name}");
            assert_eq!(
                kind.ends_with("counter"),
                name.ends_with("_total"),
                "{name}"
            );
        }
        // Every sample belongs to a family named before it.
        for sample in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(
                typed.iter().any(|(name, _)| sample.starts_with(name)),
                "{sample}"
            );
        }
        assert!(text.contains("smtp_once_webhook_attempts_total{outcome=\"retry\"} 0\n"));
        assert!(text.contains("smtp_once_delivery_attempts_total{outcome=\"expired\"} 0\n"));
    }

    #[test]
    fn no_label_carries_anything_but_fixed_words() {
        let m = Metrics::new();
        m.auth_failure(Channel::Smtp, AuthFailure::IpBanned);
        m.delivery_attempt("deferred");
        let text = m.render().expect("render");
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            if let Some(labels) = l.split('{').nth(1) {
                assert!(
                    !labels.contains('@'),
                    "an address-like label value in {l:?}"
                );
            }
        }
    }
}
