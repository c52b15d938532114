//! The webhook outbox on a real SQLite file: events only with their state
//! change, claims and leases, records and endpoint health, the wake-up, the
//! operators' connection.

use std::time::Duration;

use super::super::SqliteStore;
use super::OutboxDb;
use crate::store::outbox::{EventAttempt, EventNext, NewEvent, OutboxAdmin, WebhookOutbox};
use crate::store::{
    Acceptance, AttemptOutcome, CommitOutcome, DeliveryQueue, LedgerEntry, MessageState,
    NewLedgerEntry, NewMessage, Store,
};

fn event(id: &str, endpoint: &str, at: i64) -> NewEvent {
    NewEvent {
        webhook_id: id.into(),
        endpoint: endpoint.into(),
        event_type: "message.accepted".into(),
        at,
        workspace: "w".into(),
        queue_id: Some("Q1".into()),
        payload: format!("{{\"id\":\"{id}\"}}"),
        lease_ms: None,
    }
}

fn acceptance(key: &str, events: Vec<NewEvent>) -> Acceptance {
    Acceptance {
        ledger: Some(NewLedgerEntry {
            workspace: "w".into(),
            key: key.into(),
            entry: LedgerEntry {
                fingerprint: [1; 32],
                reply: b"250 ok\r\n".to_vec(),
                queue_id: Some("Q1".into()),
                created_at: 100,
                expires_at: 10_000_000,
            },
        }),
        message: Some(NewMessage {
            id: "Q1".into(),
            workspace: "w".into(),
            account: "a".into(),
            reverse_path: "s@x".into(),
            recipients: vec!["r@y".into()],
            idempotency_key: Some(key.into()),
            trace: "T".into(),
            body: b"B".to_vec(),
            mail_params: None,
            created_at: 100,
        }),
        events,
    }
}

fn count(store: &SqliteStore, sql: &str) -> i64 {
    let conn = rusqlite::Connection::open(store.db_path()).expect("open");
    conn.query_row(sql, [], |r| r.get(0)).expect("count")
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

fn attempt(webhook_id: &str, at: i64, next: EventNext, status: Option<u16>) -> EventAttempt {
    EventAttempt {
        webhook_id: webhook_id.into(),
        endpoint: "e1".into(),
        at,
        status,
        error: None,
        next,
        disable: None,
    }
}

#[tokio::test]
async fn events_are_written_with_their_acceptance_and_not_when_the_key_is_taken() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = SqliteStore::open(dir.path()).expect("store");
    let first = acceptance(
        "k",
        vec![event("msg_1", "e1", 100), event("msg_1", "e2", 100)],
    );
    assert_eq!(
        store.commit(first).await.expect("commit"),
        CommitOutcome::Committed
    );
    let mut again = acceptance("k", vec![event("msg_2", "e1", 100)]);
    if let Some(m) = again.message.as_mut() {
        m.id = "Q2".into();
    }
    assert_eq!(
        store.commit(again).await.expect("commit"),
        CommitOutcome::KeyTaken
    );
    assert_eq!(count(&store, "SELECT COUNT(*) FROM webhook_outbox"), 2);
    assert_eq!(
        count(
            &store,
            "SELECT COUNT(*) FROM webhook_outbox WHERE webhook_id = 'msg_2'"
        ),
        0
    );
}

#[tokio::test]
async fn a_record_writes_its_events_unless_the_message_was_deleted() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = SqliteStore::open(dir.path()).expect("store");
    store
        .commit(acceptance("k", Vec::new()))
        .await
        .expect("commit");
    let outcome = |id: &str, ev: &str| AttemptOutcome {
        id: id.into(),
        at: 200,
        rows: Vec::new(),
        state: MessageState::Delivered,
        next_attempt_at: None,
        last_error: None,
        bounce: None,
        events: vec![event(ev, "e1", 200)],
        keep_body: true,
    };
    assert!(
        store
            .record(outcome("Q1", "msg_d"))
            .await
            .expect("record")
            .is_some()
    );
    assert!(
        store
            .record(outcome("GONE", "msg_x"))
            .await
            .expect("record")
            .is_none()
    );
    assert_eq!(
        count(
            &store,
            "SELECT COUNT(*) FROM webhook_outbox WHERE webhook_id = 'msg_d'"
        ),
        1
    );
    assert_eq!(
        count(
            &store,
            "SELECT COUNT(*) FROM webhook_outbox WHERE webhook_id = 'msg_x'"
        ),
        0
    );
}

#[tokio::test]
async fn claims_lease_due_events_of_the_given_endpoints_once() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = SqliteStore::open(dir.path()).expect("store");
    let events = vec![
        event("msg_b", "e1", 300),
        event("msg_a", "e1", 200),
        event("msg_c", "e2", 100),
    ];
    store.commit(acceptance("k", events)).await.expect("commit");
    // Not due yet at 150 for e1.
    let early = store.claim_events(150, 1000, 10, names(&["e1"])).await;
    assert!(early.expect("claim").is_empty());
    let claimed = store
        .claim_events(400, 1000, 10, names(&["e1"]))
        .await
        .expect("claim");
    let ids: Vec<_> = claimed.iter().map(|e| e.webhook_id.as_str()).collect();
    assert_eq!(ids, ["msg_a", "msg_b"], "oldest event first, e2 untouched");
    assert!(claimed.iter().all(|e| e.attempts == 0));
    // Leased: not claimed again before the lease ends, claimed after.
    let again = store.claim_events(500, 2000, 10, names(&["e1"])).await;
    assert!(again.expect("claim").is_empty());
    assert_eq!(
        store
            .claim_events(1000, 3000, 10, names(&["e1"]))
            .await
            .expect("claim")
            .len(),
        2
    );
    // At start, leases are given back and the events are due again.
    assert_eq!(store.release_events(1001).await.expect("release"), 2);
    assert_eq!(
        store.next_event_due(names(&["e1"])).await.expect("due"),
        Some(200)
    );
}

/// Events handed to this node's sender in memory are written leased to it:
/// no claim takes them while the lease lasts, a record finds them by
/// `webhook-id`, and a restart gives back those whose POST never happened.
#[tokio::test]
async fn handed_over_events_are_written_leased_and_released_at_start() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = SqliteStore::open(dir.path()).expect("store");
    let mut handed = event("msg_h", "e1", 100);
    handed.lease_ms = Some(300_000);
    let events = vec![handed, event("msg_p", "e1", 100)];
    store.commit(acceptance("k", events)).await.expect("commit");
    assert_eq!(
        count(
            &store,
            "SELECT COUNT(*) FROM webhook_outbox
             WHERE webhook_id = 'msg_h' AND state = 'sending' AND lease_until = 300100"
        ),
        1
    );
    let claimed = store
        .claim_events(200, 1000, 10, names(&["e1"]))
        .await
        .expect("claim");
    let ids: Vec<_> = claimed.iter().map(|e| e.webhook_id.as_str()).collect();
    assert_eq!(ids, ["msg_p"], "the leased event is not claimed");
    store
        .record_event(attempt("msg_h", 300, EventNext::Delivered, Some(204)))
        .await
        .expect("record by webhook-id");
    assert_eq!(
        count(
            &store,
            "SELECT COUNT(*) FROM webhook_outbox
             WHERE webhook_id = 'msg_h' AND state = 'delivered' AND attempts = 1"
        ),
        1
    );
    // A handed-over event whose POST never happened (a crash): released at
    // start, claimed like any other.
    let mut lost = event("msg_l", "e1", 400);
    lost.lease_ms = Some(300_000);
    let mut second = acceptance("k2", vec![lost]);
    if let Some(m) = second.message.as_mut() {
        m.id = "Q2".into();
    }
    store.commit(second).await.expect("commit");
    assert!(
        store
            .claim_events(500, 1000, 10, names(&["e1"]))
            .await
            .expect("claim")
            .is_empty()
    );
    assert_eq!(store.release_events(600).await.expect("release"), 2);
    let again = store
        .claim_events(700, 1000, 10, names(&["e1"]))
        .await
        .expect("claim");
    let ids: Vec<_> = again.iter().map(|e| e.webhook_id.as_str()).collect();
    assert_eq!(ids, ["msg_p", "msg_l"]);
}

#[tokio::test]
async fn records_move_events_and_endpoint_health() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = SqliteStore::open(dir.path()).expect("store");
    let events = vec![event("msg_1", "e1", 100), event("msg_2", "e1", 100)];
    store.commit(acceptance("k", events)).await.expect("commit");
    let claimed = store
        .claim_events(100, 1000, 10, names(&["e1"]))
        .await
        .expect("claim");
    let (r1, r2) = (
        claimed[0].webhook_id.as_str(),
        claimed[1].webhook_id.as_str(),
    );

    let h = store
        .record_event(attempt(r1, 110, EventNext::RetryAt(5000), Some(500)))
        .await
        .expect("record");
    assert_eq!(h.failing_since, Some(110));
    let h = store
        .record_event(attempt(r2, 120, EventNext::RetryAt(5000), None))
        .await
        .expect("record");
    assert_eq!(h.failing_since, Some(110), "the first failure counts");
    assert_eq!(
        store.next_event_due(names(&["e1"])).await.expect("due"),
        Some(5000)
    );
    let claimed = store
        .claim_events(5000, 9000, 10, names(&["e1"]))
        .await
        .expect("claim");
    assert!(claimed.iter().all(|e| e.attempts == 1));
    let h = store
        .record_event(attempt(r1, 5001, EventNext::Delivered, Some(204)))
        .await
        .expect("record");
    assert_eq!(h.failing_since, None, "a success clears the failure");

    // A 410: disabled, its event kept pending but never claimed.
    let mut gone = attempt(r2, 5002, EventNext::RetryAt(5002), Some(410));
    gone.disable = Some("410".into());
    assert!(store.record_event(gone).await.expect("record").disabled);
    assert!(
        store
            .claim_events(9000, 10_000, 10, names(&["e1"]))
            .await
            .expect("claim")
            .is_empty()
    );
    assert_eq!(
        store.next_event_due(names(&["e1"])).await.expect("due"),
        None
    );

    // The operators' connection: list, re-enable, redeliver.
    let admin = OutboxDb::open(dir.path()).expect("admin");
    let disabled = admin.disabled().await.expect("disabled");
    assert_eq!(disabled.len(), 1);
    assert_eq!(disabled[0].endpoint, "e1");
    assert!(admin.enable("e1").await.expect("enable"));
    assert!(!admin.enable("e1").await.expect("enable"));
    let listed = admin.recent(Some("e1"), 10).await.expect("recent");
    let states: Vec<_> = listed
        .iter()
        .map(|e| (e.webhook_id.as_str(), e.state.as_str(), e.attempts))
        .collect();
    assert_eq!(states, [("msg_2", "pending", 2), ("msg_1", "delivered", 2)]);
    assert_eq!(
        admin
            .redeliver_one(None, "msg_1", 7000)
            .await
            .expect("redo"),
        1
    );
    let claimed = store
        .claim_events(7000, 9000, 10, names(&["e1"]))
        .await
        .expect("claim");
    let mut ids: Vec<_> = claimed.iter().map(|e| e.webhook_id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["msg_1", "msg_2"], "same webhook-id, sent again");
    assert!(
        claimed
            .iter()
            .any(|e| e.webhook_id == "msg_1" && e.attempts == 0)
    );
}

#[tokio::test]
async fn purges_only_finished_events_and_wakes_the_sender() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = std::sync::Arc::new(SqliteStore::open(dir.path()).expect("store"));
    let waiting = {
        let store = store.clone();
        tokio::spawn(async move { store.events_queued().await })
    };
    tokio::task::yield_now().await;
    let events = vec![event("msg_1", "e1", 100), event("msg_2", "e1", 100)];
    store.commit(acceptance("k", events)).await.expect("commit");
    tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("woken by the commit")
        .expect("task");
    let claimed = store
        .claim_events(100, 1000, 10, names(&["e1"]))
        .await
        .expect("claim");
    store
        .record_event(attempt(
            &claimed[0].webhook_id,
            200,
            EventNext::Failed,
            Some(500),
        ))
        .await
        .expect("record");
    assert_eq!(store.purge_events(199, 10).await.expect("purge"), 0);
    assert_eq!(store.purge_events(200, 10).await.expect("purge"), 1);
    assert_eq!(count(&store, "SELECT COUNT(*) FROM webhook_outbox"), 1);
}

#[tokio::test]
async fn the_console_reads_a_messages_events_and_each_endpoints_backlog() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = SqliteStore::open(dir.path()).expect("store");
    let events = vec![event("msg_1", "e1", 100), event("msg_2", "e2", 100)];
    store.commit(acceptance("k", events)).await.expect("commit");
    let claimed = store
        .claim_events(100, 1000, 10, names(&["e1"]))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 1);
    let mut failed = attempt("msg_1", 110, EventNext::RetryAt(5000), Some(500));
    failed.error = Some("HTTP 500".into());
    store.record_event(failed).await.expect("record");

    let admin = OutboxDb::open(dir.path()).expect("admin");
    let mut of_q1: Vec<_> = admin
        .for_message("Q1", 10)
        .await
        .expect("events")
        .into_iter()
        .map(|e| e.webhook_id)
        .collect();
    of_q1.sort();
    assert_eq!(of_q1, ["msg_1", "msg_2"]);
    assert!(
        admin
            .for_message("Q2", 10)
            .await
            .expect("events")
            .is_empty()
    );
    let backlog = admin
        .backlog(names(&["e1", "e2", "e3"]))
        .await
        .expect("backlog");
    let shown: Vec<_> = backlog
        .iter()
        .map(|b| {
            (
                b.endpoint.as_str(),
                b.waiting,
                b.failing_since,
                b.last_error.as_ref().map(|(_, e)| e.as_str()),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            ("e1", 1, Some(110), Some("HTTP 500")),
            ("e2", 1, None, None),
            ("e3", 0, None, None)
        ]
    );
}
