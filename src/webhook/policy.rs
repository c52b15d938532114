//! What an attempt's answer means for the event and the endpoint: pure
//! functions, so the retry rules are tested without sockets.

use std::time::Duration;

use crate::store::UnixMillis;
use crate::store::outbox::EventNext;

/// How one POST ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The endpoint answered with this status (and `Retry-After`, if any).
    Status {
        code: u16,
        retry_after: Option<Duration>,
    },
    /// No answer: connection refused, TLS failure, timeout.
    NoAnswer(String),
}

/// The longest `Retry-After` honoured: a receiver cannot park an event
/// for longer than the schedule's longest wait.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);

/// What to record: the event's next step, and a reason to disable the
/// endpoint (a `410 Gone`).
pub fn judge(
    answer: &Answer,
    attempts_before: u32,
    schedule: &[Duration],
    now: UnixMillis,
    jitter: f64,
) -> (EventNext, Option<String>) {
    if let Answer::Status { code, .. } = answer
        && (200..300).contains(code)
    {
        return (EventNext::Delivered, None);
    }
    // Kept pending (not failed) so that re-enabling the endpoint delivers
    // it; a disabled endpoint's events are never claimed meanwhile.
    if let Answer::Status { code: 410, .. } = answer {
        return (
            EventNext::RetryAt(now),
            Some("the endpoint answered 410 Gone".into()),
        );
    }
    // The schedule's entry i is the wait before attempt i+1.
    let next_index = attempts_before as usize + 1;
    let Some(wait) = schedule.get(next_index) else {
        return (EventNext::Failed, None);
    };
    let mut wait = wait.mul_f64(jitter.clamp(0.5, 1.5));
    if let Answer::Status {
        code: 429 | 503,
        retry_after: Some(asked),
    } = answer
    {
        wait = wait.max((*asked).min(MAX_RETRY_AFTER));
    }
    let wait_ms = i64::try_from(wait.as_millis()).unwrap_or(i64::MAX);
    (EventNext::RetryAt(now.saturating_add(wait_ms)), None)
}

/// `Retry-After` in seconds (the HTTP-date form counts as absent).
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// A factor in 0.8..1.2: attempts of many events failing together spread
/// out instead of returning in one burst.
pub fn jitter() -> f64 {
    let r = uuid::Uuid::new_v4().as_u64_pair().0;
    // One division of an integer in 8,000..=12,000: `0.8 + 0.4` would be
    // 1.2000000000000002, just out of the range (a 1-in-4,001 flake).
    (8_000 + r % 4_001) as f64 / 10_000.0
}

/// The endpoint failed for longer than `disable_after`.
pub fn failing_too_long(
    failing_since: Option<UnixMillis>,
    now: UnixMillis,
    disable_after: Duration,
) -> bool {
    let limit = i64::try_from(disable_after.as_millis()).unwrap_or(i64::MAX);
    failing_since.is_some_and(|since| now.saturating_sub(since) >= limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn status(code: u16) -> Answer {
        Answer::Status {
            code,
            retry_after: None,
        }
    }

    #[test]
    fn success_failure_and_exhaustion() {
        let schedule = [secs(0), secs(5), secs(300)];
        assert_eq!(
            judge(&status(204), 0, &schedule, 1000, 1.0).0,
            EventNext::Delivered
        );
        assert_eq!(
            judge(&status(500), 0, &schedule, 1000, 1.0).0,
            EventNext::RetryAt(6000)
        );
        assert_eq!(
            judge(&Answer::NoAnswer("timeout".into()), 1, &schedule, 1000, 1.0).0,
            EventNext::RetryAt(301_000)
        );
        assert_eq!(
            judge(&status(500), 2, &schedule, 1000, 1.0).0,
            EventNext::Failed
        );
        // Redirects are not followed: a failure like any other.
        assert_eq!(
            judge(&status(301), 0, &schedule, 0, 1.0).0,
            EventNext::RetryAt(5000)
        );
    }

    #[test]
    fn gone_disables_and_keeps_the_event() {
        let (next, disable) = judge(&status(410), 0, &[secs(0)], 7, 1.0);
        assert_eq!(next, EventNext::RetryAt(7));
        assert!(disable.is_some());
    }

    #[test]
    fn retry_after_is_honoured_on_429_and_503_only() {
        let schedule = [secs(0), secs(5)];
        let asked = |code| Answer::Status {
            code,
            retry_after: Some(secs(120)),
        };
        assert_eq!(
            judge(&asked(429), 0, &schedule, 0, 1.0).0,
            EventNext::RetryAt(120_000)
        );
        assert_eq!(
            judge(&asked(503), 0, &schedule, 0, 1.0).0,
            EventNext::RetryAt(120_000)
        );
        assert_eq!(
            judge(&asked(500), 0, &schedule, 0, 1.0).0,
            EventNext::RetryAt(5000)
        );
        let huge = Answer::Status {
            code: 429,
            retry_after: Some(secs(10 * 86400)),
        };
        assert_eq!(
            judge(&huge, 0, &schedule, 0, 1.0).0,
            EventNext::RetryAt(86_400_000)
        );
        assert_eq!(parse_retry_after(" 30 "), Some(secs(30)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
    }

    #[test]
    fn jitter_stays_in_range_and_disabling_waits_for_the_limit() {
        for _ in 0..100 {
            let j = jitter();
            assert!((0.8..=1.2).contains(&j), "{j}");
        }
        let day = secs(86400);
        assert!(!failing_too_long(None, 10, day));
        assert!(!failing_too_long(Some(0), 86_399_999, day));
        assert!(failing_too_long(Some(0), 86_400_000, day));
    }
}
