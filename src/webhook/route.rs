//! Which events a state change causes, for which endpoints, and their JSON
//! payloads: built by the acceptance pipeline and the delivery worker, then
//! written by the store in the state change's own transaction (the outbox).
//! Those the sender has room for are written leased to it and handed over
//! after the commit (`handoff`).

use serde_json::json;

use super::handoff::{self, Direct, Handoff, Handover};
use crate::config::WebhookEndpoint;
use crate::event_type::EventType;
use crate::store::outbox::OutboxEvent;
use crate::store::{AdminAction, Done, NewEvent, UnixMillis};
use crate::time::rfc3339_millis;

/// The configured endpoints' filters. Empty: no event is ever written.
#[derive(Clone, Default)]
pub struct Router {
    endpoints: Vec<WebhookEndpoint>,
    /// This node's sender, if it runs: fresh events go to it directly.
    handoff: Option<Handoff>,
}

/// A state change's events: the rows for its transaction, and what to hand
/// to the sender once that transaction committed.
#[derive(Default)]
pub struct Routed {
    pub events: Vec<NewEvent>,
    pub handover: Handover,
}

/// A message accepted into the queue.
pub struct Accepted<'a> {
    pub queue_id: &'a str,
    pub workspace: &'a str,
    pub idempotency_key: Option<&'a str>,
    pub recipients: &'a [String],
    pub at: UnixMillis,
}

/// One recipient's outcome in one delivery attempt.
pub struct Attempted<'a> {
    pub queue_id: &'a str,
    pub workspace: &'a str,
    pub idempotency_key: Option<&'a str>,
    pub recipient: &'a str,
    /// delivered, deferred, failed or expired.
    pub outcome: &'a str,
    pub reply: &'a str,
    pub next_hop: Option<&'a str>,
    /// 1 for the first attempt.
    pub attempt: u32,
    pub at: UnixMillis,
}

/// A new event id: the `webhook-id` every delivery of the event carries.
/// UUID v7 (milliseconds first, then random): ids written one after the
/// other land side by side in the outbox's `(webhook_id, endpoint)` index,
/// where random ones would each dirty a page of their own.
fn new_webhook_id() -> String {
    format!("msg_{}", uuid::Uuid::now_v7().simple())
}

impl Router {
    pub fn new(endpoints: &[WebhookEndpoint]) -> Self {
        Self {
            endpoints: endpoints.to_vec(),
            handoff: None,
        }
    }

    /// Hands fresh events to this node's sender (see `handoff`).
    pub fn with_handoff(mut self, handoff: Handoff) -> Self {
        self.handoff = Some(handoff);
        self
    }

    fn start(&self) -> Routed {
        Routed {
            events: Vec::new(),
            handover: self.handoff.as_ref().map(Handover::new).unwrap_or_default(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }

    /// One row per endpoint that wants the event; the payload is built only
    /// if one does.
    fn route(
        &self,
        event: EventType,
        workspace: &str,
        queue_id: &str,
        at: UnixMillis,
        data: impl FnOnce() -> serde_json::Value,
        out: &mut Routed,
    ) {
        let mut wanted = self
            .endpoints
            .iter()
            .filter(|e| e.wants(event, workspace))
            .peekable();
        if wanted.peek().is_none() {
            return;
        }
        let payload = json!({
            "type": event.as_str(),
            "timestamp": rfc3339_millis(at),
            "data": data(),
        })
        .to_string();
        let webhook_id = new_webhook_id();
        for e in wanted {
            let permit = self.handoff.as_ref().and_then(|h| h.take(&e.name));
            out.events.push(NewEvent {
                webhook_id: webhook_id.clone(),
                endpoint: e.name.clone(),
                event_type: event.as_str().to_owned(),
                at,
                workspace: workspace.to_owned(),
                queue_id: Some(queue_id.to_owned()),
                payload: payload.clone(),
                lease_ms: permit.as_ref().map(|_| handoff::lease_ms()),
            });
            if let Some(permit) = permit {
                out.handover.push(Direct {
                    event: OutboxEvent {
                        webhook_id: webhook_id.clone(),
                        endpoint: e.name.clone(),
                        event_type: event.as_str().to_owned(),
                        payload: payload.clone(),
                        attempts: 0,
                    },
                    permit,
                });
            }
        }
    }

    pub fn accepted(&self, m: &Accepted<'_>) -> Routed {
        let mut out = self.start();
        self.route(
            EventType::Accepted,
            m.workspace,
            m.queue_id,
            m.at,
            || {
                json!({
                    "queue_id": m.queue_id,
                    "workspace": m.workspace,
                    "idempotency_key": m.idempotency_key,
                    "recipients": m.recipients,
                    "attempt": 0,
                })
            },
            &mut out,
        );
        out
    }

    /// The events of an operator's action (`actor`: `api:<account>` or
    /// `cli`), when it changed something; a delete causes none (the
    /// message is gone). Written `pending` for a claim, never handed over
    /// in memory: the change is committed on the operator's own connection
    /// (any node, or the CLI), where no sender waits for it.
    pub fn acted(&self, done: &Done, actor: &str) -> Vec<NewEvent> {
        let event = match done.action {
            AdminAction::Cancel => EventType::Cancelled,
            AdminAction::Hold => EventType::Held,
            AdminAction::Release => EventType::Released,
            AdminAction::Retry => EventType::Retried,
            AdminAction::Delete => return Vec::new(),
        };
        if !done.changed() {
            return Vec::new();
        }
        let mut out = Routed::default();
        let pending = Router {
            endpoints: self.endpoints.clone(),
            handoff: None,
        };
        pending.route(
            event,
            &done.workspace,
            &done.id,
            done.at,
            || {
                // `recipients`: those it concerns, the ones without a final
                // outcome (a cancel's, the ones it stopped); recipients
                // delivered before keep their `message.delivered`.
                json!({
                    "queue_id": done.id,
                    "workspace": done.workspace,
                    "idempotency_key": done.idempotency_key,
                    "recipients": done.pending,
                    "state": done.state.as_str(),
                    "actor": actor,
                })
            },
            &mut out,
        );
        out.events
    }

    /// The events of one attempt, one per recipient row.
    pub fn attempted<'a>(&self, rows: impl IntoIterator<Item = Attempted<'a>>) -> Routed {
        let mut out = self.start();
        for r in rows {
            let Some(event) = EventType::of_outcome(r.outcome) else {
                continue;
            };
            self.route(
                event,
                r.workspace,
                r.queue_id,
                r.at,
                || {
                    json!({
                        "queue_id": r.queue_id,
                        "workspace": r.workspace,
                        "idempotency_key": r.idempotency_key,
                        "recipient": r.recipient,
                        "reply": r.reply,
                        "next_hop": r.next_hop,
                        "attempt": r.attempt,
                    })
                },
                &mut out,
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::store::MessageState;

    fn endpoint(name: &str, events: Option<Vec<EventType>>, ws: Option<&str>) -> WebhookEndpoint {
        WebhookEndpoint {
            name: name.into(),
            url: "http://127.0.0.1:1/".into(),
            secrets: vec![vec![1; 32]],
            events,
            workspace: ws.map(str::to_owned),
            timeout: Duration::from_secs(15),
            max_in_flight: 4,
            disable_after: Duration::from_secs(86400),
            retry_schedule: vec![Duration::ZERO],
            ca_file: None,
        }
    }

    fn attempt<'a>(outcome: &'a str, rcpt: &'a str) -> Attempted<'a> {
        Attempted {
            queue_id: "Q1",
            workspace: "ws",
            idempotency_key: Some("k1"),
            recipient: rcpt,
            outcome,
            reply: "250 2.0.0 ok",
            next_hop: Some("mx.example:25"),
            attempt: 2,
            at: 1_796_069_194_007,
        }
    }

    #[test]
    fn filters_by_type_and_workspace_and_shares_one_id_across_endpoints() {
        let router = Router::new(&[
            endpoint("all", None, None),
            endpoint("bounces", Some(vec![EventType::Bounced]), None),
            endpoint("other-ws", None, Some("other")),
        ]);
        let events = router
            .attempted([attempt("failed", "a@x"), attempt("delivered", "b@x")])
            .events;
        let names: Vec<_> = events
            .iter()
            .map(|e| (e.endpoint.as_str(), e.event_type.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("all", "message.bounced"),
                ("bounces", "message.bounced"),
                ("all", "message.delivered"),
            ]
        );
        assert_eq!(events[0].webhook_id, events[1].webhook_id);
        assert_ne!(events[0].webhook_id, events[2].webhook_id);
        assert!(events[0].webhook_id.starts_with("msg_"));
    }

    #[test]
    fn payload_carries_the_attempt_facts() {
        let router = Router::new(&[endpoint("all", None, None)]);
        let events = router.attempted([attempt("deferred", "a@x")]).events;
        let v: serde_json::Value = serde_json::from_str(&events[0].payload).expect("json");
        assert_eq!(v["type"], "message.deferred");
        assert_eq!(v["timestamp"], "2026-11-30T20:06:34.007Z");
        assert_eq!(v["data"]["queue_id"], "Q1");
        assert_eq!(v["data"]["workspace"], "ws");
        assert_eq!(v["data"]["idempotency_key"], "k1");
        assert_eq!(v["data"]["recipient"], "a@x");
        assert_eq!(v["data"]["reply"], "250 2.0.0 ok");
        assert_eq!(v["data"]["attempt"], 2);
        assert_eq!(events[0].at, 1_796_069_194_007);
    }

    #[test]
    fn an_operator_action_is_a_pending_event_naming_its_actor() {
        let router = Router::new(&[
            endpoint("ops", Some(vec![EventType::Cancelled]), None),
            endpoint("bounces", Some(vec![EventType::Bounced]), None),
        ]);
        let done = |action, before| Done {
            id: "Q1".into(),
            workspace: "ws".into(),
            idempotency_key: Some("k1".into()),
            action,
            before,
            state: MessageState::Cancelled,
            pending: vec!["b@x".into()],
            at: 1_796_069_194_007,
        };
        let events = router.acted(
            &done(AdminAction::Cancel, MessageState::Deferred),
            "api:alice",
        );
        assert_eq!(events.len(), 1);
        assert_eq!(
            (events[0].endpoint.as_str(), events[0].lease_ms),
            ("ops", None)
        );
        let v: serde_json::Value = serde_json::from_str(&events[0].payload).expect("json");
        assert_eq!(v["type"], "message.cancelled");
        assert_eq!(v["data"]["actor"], "api:alice");
        assert_eq!(v["data"]["recipients"], json!(["b@x"]));
        // Nothing changed, nothing wanted, or nothing left: no event.
        let again = done(AdminAction::Cancel, MessageState::Cancelled);
        assert!(router.acted(&again, "cli").is_empty());
        let held = done(AdminAction::Hold, MessageState::Queued);
        assert!(router.acted(&held, "cli").is_empty());
    }

    #[test]
    fn no_endpoint_no_event() {
        let router = Router::new(&[endpoint("ws", None, Some("other"))]);
        let rcpts = vec!["a@x".to_owned()];
        let accepted = Accepted {
            queue_id: "Q",
            workspace: "ws",
            idempotency_key: None,
            recipients: &rcpts,
            at: 1,
        };
        assert!(router.accepted(&accepted).events.is_empty());
        assert!(Router::default().is_empty());
    }
}
