//! One delivery attempt's view of the queue: what a claimed message means
//! to an attempt ([`Loaded`]) and what an attempt writes back
//! ([`outcome`]). The daemon's worker claims and records through the store's writer
//! (`store::DeliveryQueue`); the operator commands go through
//! `store::QueueAdmin`.

use std::collections::HashMap;

use super::outgoing::Outgoing;
use super::plan::{Outcome, Plan};
use crate::store::{AttemptOutcome, AttemptRow, ClaimedMessage, NewEvent, NewMessage, UnixMillis};

/// A claimed message with what delivery needs.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub msg: Outgoing,
    pub workspace: String,
    pub created_at: UnixMillis,
    pub attempts: u32,
    /// Recipients done in earlier attempts, with how they ended.
    pub done: HashMap<String, Outcome>,
}

impl From<ClaimedMessage> for Loaded {
    fn from(m: ClaimedMessage) -> Self {
        // Only final outcomes count as done: a deferred recipient is
        // pending again.
        let done = m
            .latest_outcomes
            .iter()
            .filter_map(|(rcpt, o)| Some((rcpt.clone(), Outcome::parse(o)?)))
            .filter(|(_, o)| o.is_final())
            .collect();
        Loaded {
            msg: Outgoing {
                id: m.id,
                reverse_path: m.reverse_path,
                recipients: m.recipients,
                idempotency_key: m.idempotency_key,
                trace: m.trace,
                body: m.body,
                options: crate::submission::MailOptions::from_stored(m.mail_params.as_deref()),
                // The worker sets the configured ones.
                key_headers: Default::default(),
            },
            workspace: m.workspace,
            created_at: m.created_at,
            attempts: m.attempts,
            done,
        }
    }
}

/// What an attempt writes back, in the store's terms.
pub fn outcome(
    id: &str,
    plan: &Plan,
    at: UnixMillis,
    bounce: Option<NewMessage>,
    events: Vec<NewEvent>,
    keep_body: bool,
) -> AttemptOutcome {
    AttemptOutcome {
        id: id.to_owned(),
        at,
        rows: plan
            .rows
            .iter()
            .map(|r| AttemptRow {
                recipient: r.recipient.clone(),
                outcome: r.outcome.as_str(),
                reply: r.reply.clone(),
                next_hop: r.next_hop.clone(),
            })
            .collect(),
        state: plan.state,
        next_attempt_at: plan.next_attempt_at,
        last_error: plan.last_error.clone(),
        bounce,
        events,
        keep_body,
    }
}

impl Loaded {
    pub fn pending(&self) -> Vec<String> {
        self.msg
            .recipients
            .iter()
            .filter(|r| !self.done.contains_key(*r))
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_final_outcomes_are_done() {
        let claimed = ClaimedMessage {
            id: "Q1".into(),
            workspace: "w".into(),
            reverse_path: "s@x".into(),
            recipients: vec!["a@y".into(), "b@y".into(), "c@y".into(), "d@y".into()],
            idempotency_key: None,
            trace: String::new(),
            body: Vec::new(),
            mail_params: None,
            created_at: 1,
            attempts: 2,
            latest_outcomes: vec![
                ("a@y".into(), "delivered".into()),
                ("b@y".into(), "deferred".into()),
                ("c@y".into(), "failed".into()),
                ("d@y".into(), "something else".into()),
            ],
        };
        let loaded = Loaded::from(claimed);
        assert_eq!(loaded.pending(), ["b@y", "d@y"]);
        assert_eq!(loaded.attempts, 2);
    }
}
