//! What one attempt's per-recipient results mean for the message: which
//! recipients are done, when to try the others again, and the message's new
//! state. Pure functions, so the retry policy is tested without sockets.

use std::time::Duration;

use super::{RcptResult, Status};
use crate::store::{MessageState, UnixMillis};

#[derive(Debug, Clone)]
pub struct Policy {
    pub retry_schedule: Vec<Duration>,
    pub max_age: Duration,
}

/// A recipient's outcome as recorded in `delivery_attempt.outcome`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Delivered,
    Deferred,
    Failed,
    /// Still deferred when the message reached `max_age`.
    Expired,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Delivered => "delivered",
            Outcome::Deferred => "deferred",
            Outcome::Failed => "failed",
            Outcome::Expired => "expired",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "delivered" => Outcome::Delivered,
            "deferred" => Outcome::Deferred,
            "failed" => Outcome::Failed,
            "expired" => Outcome::Expired,
            _ => return None,
        })
    }

    /// Done for good: never attempted again.
    pub fn is_final(self) -> bool {
        self != Outcome::Deferred
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptRow {
    pub recipient: String,
    pub outcome: Outcome,
    pub reply: String,
    pub next_hop: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub rows: Vec<AttemptRow>,
    /// Delivered, Failed, Expired (no recipient left) or Deferred.
    pub state: MessageState,
    pub next_attempt_at: Option<UnixMillis>,
    pub last_error: Option<String>,
}

impl Plan {
    /// Recipients that reached failed or expired in this attempt: the
    /// subject of a bounce.
    pub fn bounced(&self) -> impl Iterator<Item = &AttemptRow> {
        self.rows
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Failed | Outcome::Expired))
    }
}

/// The wait after the `nth` (1-based) failed attempt: the schedule's entry,
/// or its last entry once the schedule is exhausted.
pub fn backoff(schedule: &[Duration], nth: u32) -> Duration {
    let i = usize::try_from(nth.saturating_sub(1)).unwrap_or(usize::MAX);
    schedule
        .get(i)
        .or(schedule.last())
        .copied()
        .unwrap_or(Duration::from_secs(60))
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Plans the message's next state after an attempt.
///
/// `attempt` is this attempt's number (1 for the first); `earlier` are the
/// final outcomes of recipients done in earlier attempts.
pub fn plan(
    policy: &Policy,
    created_at: UnixMillis,
    attempt: u32,
    earlier: &[Outcome],
    results: Vec<RcptResult>,
    now: UnixMillis,
) -> Plan {
    let expires_at = created_at.saturating_add(millis(policy.max_age));
    let expired = now >= expires_at;
    let rows: Vec<AttemptRow> = results
        .into_iter()
        .map(|r| AttemptRow {
            outcome: match r.status {
                Status::Delivered => Outcome::Delivered,
                Status::Failed => Outcome::Failed,
                Status::Deferred if expired => Outcome::Expired,
                Status::Deferred => Outcome::Deferred,
            },
            recipient: r.recipient,
            reply: r.reply,
            next_hop: r.next_hop,
        })
        .collect();
    let last_error = rows
        .iter()
        .find(|r| r.outcome != Outcome::Delivered)
        .map(|r| format!("<{}>: {}", r.recipient, r.reply));
    if rows.iter().any(|r| r.outcome == Outcome::Deferred) {
        // One last try right at max_age rather than none after it.
        let next = now
            .saturating_add(millis(backoff(&policy.retry_schedule, attempt)))
            .min(expires_at);
        return Plan {
            rows,
            state: MessageState::Deferred,
            next_attempt_at: Some(next),
            last_error,
        };
    }
    let all = || {
        earlier
            .iter()
            .copied()
            .chain(rows.iter().map(|r| r.outcome))
    };
    let state = if all().all(|o| o == Outcome::Delivered) {
        MessageState::Delivered
    } else if all().any(|o| o == Outcome::Failed) {
        MessageState::Failed
    } else {
        MessageState::Expired
    };
    Plan {
        rows,
        state,
        next_attempt_at: None,
        last_error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000;

    fn policy() -> Policy {
        Policy {
            retry_schedule: vec![Duration::from_secs(60), Duration::from_secs(300)],
            max_age: Duration::from_secs(3600),
        }
    }

    fn r(rcpt: &str, status: Status) -> RcptResult {
        RcptResult::new(rcpt, status, format!("reply for {rcpt}"))
    }

    #[test]
    fn backoff_follows_the_schedule_then_repeats_its_last_entry() {
        let s = policy().retry_schedule;
        assert_eq!(backoff(&s, 1), Duration::from_secs(60));
        assert_eq!(backoff(&s, 2), Duration::from_secs(300));
        assert_eq!(backoff(&s, 9), Duration::from_secs(300));
        assert_eq!(backoff(&[], 1), Duration::from_secs(60));
    }

    #[test]
    fn all_delivered() {
        let p = plan(&policy(), 0, 1, &[], vec![r("a@x", Status::Delivered)], 10);
        assert_eq!(p.state, MessageState::Delivered);
        assert_eq!(p.next_attempt_at, None);
        assert_eq!(p.last_error, None);
        assert_eq!(p.bounced().count(), 0);
    }

    #[test]
    fn a_deferred_recipient_keeps_the_message_deferred_with_backoff() {
        let results = vec![r("a@x", Status::Delivered), r("b@x", Status::Deferred)];
        let p = plan(&policy(), 0, 2, &[], results, 10 * MIN);
        assert_eq!(p.state, MessageState::Deferred);
        assert_eq!(p.next_attempt_at, Some(15 * MIN));
        assert_eq!(p.last_error.as_deref(), Some("<b@x>: reply for b@x"));
        assert_eq!(p.rows[0].outcome, Outcome::Delivered);
    }

    #[test]
    fn the_last_retry_is_at_max_age_then_deferred_recipients_expire() {
        let p = plan(
            &policy(),
            0,
            5,
            &[],
            vec![r("a@x", Status::Deferred)],
            58 * MIN,
        );
        assert_eq!(p.next_attempt_at, Some(60 * MIN));
        let p = plan(
            &policy(),
            0,
            6,
            &[],
            vec![r("a@x", Status::Deferred)],
            60 * MIN,
        );
        assert_eq!(p.state, MessageState::Expired);
        assert_eq!(p.rows[0].outcome, Outcome::Expired);
        assert_eq!(p.bounced().count(), 1);
    }

    #[test]
    fn a_permanent_failure_is_final_at_once_and_bounces() {
        let results = vec![r("a@x", Status::Failed)];
        let p = plan(&policy(), 0, 1, &[Outcome::Delivered], results, 1);
        assert_eq!(p.state, MessageState::Failed);
        assert_eq!(
            p.bounced()
                .map(|r| r.recipient.as_str())
                .collect::<Vec<_>>(),
            ["a@x"]
        );
    }

    #[test]
    fn earlier_outcomes_count_for_the_final_state() {
        let p = plan(
            &policy(),
            0,
            3,
            &[Outcome::Failed],
            vec![r("b@x", Status::Delivered)],
            1,
        );
        assert_eq!(p.state, MessageState::Failed);
        assert_eq!(
            p.bounced().count(),
            0,
            "the earlier failure bounced already"
        );
        let p = plan(
            &policy(),
            0,
            3,
            &[Outcome::Expired],
            vec![r("b@x", Status::Delivered)],
            1,
        );
        assert_eq!(p.state, MessageState::Expired);
    }
}
