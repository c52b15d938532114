//! The webhook outbox on PostgreSQL: events in the transaction of their
//! state change, claims shared by nodes, endpoint health, the operators'
//! connection. Two stores stand for two nodes, as in `tests.rs`.

use std::time::Duration;

use super::super::{PgOutboxAdmin, PgStore};
use super::{TestDb, acceptance, count};
use crate::store::outbox::{EventAttempt, EventNext, NewEvent, OutboxAdmin, OutboxEvent};
use crate::store::{
    AttemptOutcome, CommitOutcome, DeliveryQueue, MessageState, Store, WebhookOutbox, now_millis,
};

fn event(id: &str, endpoint: &str) -> NewEvent {
    NewEvent {
        webhook_id: id.into(),
        endpoint: endpoint.into(),
        event_type: "message.accepted".into(),
        at: now_millis(),
        workspace: "ws".into(),
        queue_id: None,
        payload: format!("{{\"id\":\"{id}\"}}"),
        lease_ms: None,
    }
}

/// `n` events for endpoint `ep`, committed with one keyless acceptance.
async fn events(store: &PgStore, id: &str, ep: &str, n: usize) {
    let mut a = acceptance(id, None, "x");
    a.events = (0..n).map(|i| event(&format!("{id}-{i}"), ep)).collect();
    store.commit(a).await.expect("commit");
}

async fn claim(store: &PgStore, lease_ms: i64, limit: usize, ep: &str) -> Vec<OutboxEvent> {
    let now = now_millis();
    store
        .claim_events(now, now + lease_ms, limit, vec![ep.into()])
        .await
        .expect("claim events")
}

fn attempt(e: &OutboxEvent, status: u16, next: EventNext) -> EventAttempt {
    EventAttempt {
        webhook_id: e.webhook_id.clone(),
        endpoint: e.endpoint.clone(),
        at: now_millis(),
        status: Some(status),
        error: (status >= 300).then(|| format!("HTTP {status}")),
        next,
        disable: None,
    }
}

fn ids(events: &[OutboxEvent]) -> Vec<String> {
    let mut ids: Vec<String> = events.iter().map(|e| e.webhook_id.clone()).collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn events_commit_with_their_acceptance_and_not_when_the_key_was_taken() {
    let db = TestDb::new().await;
    let a = db.node("a").await;
    let mut first = acceptance("K1", Some("k"), "x");
    first.events = vec![event("ev-1", "hook")];
    assert_eq!(
        a.commit(first).await.expect("commit"),
        CommitOutcome::Committed
    );
    tokio::time::timeout(Duration::from_secs(1), a.events_queued())
        .await
        .expect("this node's sender is woken");
    let mut again = acceptance("K2", Some("k"), "x");
    again.events = vec![event("ev-2", "hook")];
    assert_eq!(
        a.commit(again).await.expect("commit"),
        CommitOutcome::KeyTaken
    );
    // The same event twice is one row.
    let mut dup = acceptance("K3", None, "x");
    dup.events = vec![event("ev-1", "hook"), event("ev-1", "other")];
    a.commit(dup).await.expect("commit");
    let sql = db.sql().await;
    let rows = sql
        .query(
            "SELECT webhook_id, endpoint, state, attempts FROM webhook_outbox ORDER BY id",
            &[],
        )
        .await
        .expect("rows");
    let rows: Vec<(String, String, String, i32)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    let row = |id: &str, ep: &str| (id.to_owned(), ep.to_owned(), "pending".to_owned(), 0);
    assert_eq!(rows, [row("ev-1", "hook"), row("ev-1", "other")]);
    db.drop_db().await;
}

#[tokio::test]
async fn a_record_writes_events_only_while_the_message_exists() {
    let db = TestDb::new().await;
    let a = db.node("a").await;
    a.commit(acceptance("R1", None, "x")).await.expect("commit");
    a.commit(acceptance("R2", None, "x")).await.expect("commit");
    let now = now_millis();
    let claimed = a.claim(now, now + 60_000, 10, vec![]).await.expect("claim");
    assert_eq!(claimed.len(), 2);
    let outcome = |id: &str| AttemptOutcome {
        id: id.into(),
        at: now,
        rows: Vec::new(),
        state: MessageState::Delivered,
        next_attempt_at: None,
        last_error: None,
        bounce: None,
        events: vec![event(&format!("done-{id}"), "hook")],
        keep_body: true,
    };
    let sql = db.sql().await;
    sql.execute("DELETE FROM queue WHERE id = 'R1'", &[])
        .await
        .expect("delete");
    assert_eq!(a.record(outcome("R1")).await.expect("record"), None);
    assert_eq!(
        a.record(outcome("R2")).await.expect("record"),
        Some(MessageState::Delivered)
    );
    let written: Vec<String> = sql
        .query("SELECT webhook_id FROM webhook_outbox", &[])
        .await
        .expect("rows")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(written, ["done-R2"], "no event for the deleted message");
    db.drop_db().await;
}

/// An event handed to node a's sender in memory is written leased to a:
/// node b's claims skip it while the lease lasts, a's record finds it by
/// `webhook-id`, and a's restart (release) makes a lost one due for all.
#[tokio::test]
async fn handed_over_events_are_leased_to_their_node() {
    let db = TestDb::new().await;
    let (a, b) = (db.node("a").await, db.node("b").await);
    let mut commit = acceptance("H1", None, "x");
    let mut handed = event("ev-h", "hook");
    handed.lease_ms = Some(60_000);
    let mut lost = event("ev-l", "hook");
    lost.lease_ms = Some(60_000);
    commit.events = vec![handed, lost, event("ev-p", "hook")];
    a.commit(commit).await.expect("commit");
    let sql = db.sql().await;
    assert_eq!(
        count(
            &sql,
            "SELECT COUNT(*) FROM webhook_outbox
             WHERE state = 'sending' AND leased_by = 'a' AND lease_until > smtp_once_now()"
        )
        .await,
        2
    );
    assert_eq!(ids(&claim(&b, 60_000, 10, "hook").await), ["ev-p"]);
    let mut done = attempt(&claim_free("ev-h"), 204, EventNext::Delivered);
    done.endpoint = "hook".into();
    a.record_event(done).await.expect("record");
    assert_eq!(
        count(
            &sql,
            "SELECT COUNT(*) FROM webhook_outbox
             WHERE webhook_id = 'ev-h' AND state = 'delivered' AND leased_by IS NULL"
        )
        .await,
        1
    );
    // a restarts: its lost hand-over is due again, for any node.
    assert_eq!(a.release_events(0).await.expect("release"), 1);
    assert_eq!(ids(&claim(&b, 60_000, 10, "hook").await), ["ev-l"]);
    db.drop_db().await;
}

/// The event as the sender holds it after a hand-over.
fn claim_free(id: &str) -> OutboxEvent {
    OutboxEvent {
        webhook_id: id.into(),
        endpoint: "hook".into(),
        event_type: "message.accepted".into(),
        payload: String::new(),
        attempts: 0,
    }
}

#[tokio::test]
async fn two_nodes_claim_apart_release_their_own_and_take_over_a_dead_nodes() {
    let db = TestDb::new().await;
    let (a, b) = (db.node("a").await, db.node("b").await);
    events(&a, "E", "hook", 10).await;
    events(&a, "X", "elsewhere", 1).await;
    let (ca, cb) = tokio::join!(claim(&a, 60_000, 6, "hook"), claim(&b, 60_000, 6, "hook"));
    assert_eq!(ca.len() + cb.len(), 10, "all claimed");
    assert!(
        ca.iter()
            .all(|e| !cb.iter().any(|f| f.webhook_id == e.webhook_id))
    );
    assert!(ca.iter().chain(&cb).all(|e| e.endpoint == "hook"));
    assert!(
        claim(&b, 60_000, 10, "hook").await.is_empty(),
        "leases held"
    );

    // a stops: only its own leases go back, due as before.
    assert_eq!(a.release_events(0).await.expect("release"), ca.len());
    let sql = db.sql().await;
    assert_eq!(
        count(
            &sql,
            "SELECT COUNT(*) FROM webhook_outbox WHERE state = 'sending' AND leased_by = 'b'"
        )
        .await,
        i64::try_from(cb.len()).expect("len")
    );
    assert_eq!(ids(&claim(&a, 60_000, 10, "hook").await), ids(&ca));

    // b dies with its leases ending: a takes them over when they expire.
    let b_ids: Vec<String> = cb.iter().map(|e| e.webhook_id.clone()).collect();
    sql.execute(
        "UPDATE webhook_outbox SET lease_until = smtp_once_now() - 1 WHERE leased_by = 'b'",
        &[],
    )
    .await
    .expect("expire b's leases");
    let due = a.next_event_due(vec!["hook".into()]).await.expect("due");
    assert!(due.is_some_and(|t| t <= now_millis() + 1_000), "{due:?}");
    let taken = claim(&a, 60_000, 10, "hook").await;
    let mut expected = b_ids;
    expected.sort();
    assert_eq!(ids(&taken), expected, "b's expired leases, and only those");
    assert_eq!(
        count(
            &sql,
            "SELECT COUNT(*) FROM webhook_outbox WHERE endpoint = 'hook' AND leased_by = 'a'"
        )
        .await,
        10
    );
    db.drop_db().await;
}

#[tokio::test]
async fn records_keep_the_endpoints_health_and_a_disabled_endpoint_waits() {
    let db = TestDb::new().await;
    let a = db.node("a").await;
    events(&a, "H", "hook", 3).await;
    let claimed = claim(&a, 60_000, 3, "hook").await;
    assert_eq!(claimed.len(), 3);
    assert!(claimed.iter().all(|e| e.attempts == 0));

    let before = now_millis();
    let retry_at = now_millis() + 60_000;
    let first = a
        .record_event(attempt(&claimed[0], 500, EventNext::RetryAt(retry_at)))
        .await
        .expect("record");
    let since = first
        .failing_since
        .expect("failing since the first failure");
    assert!((before - 1_000..=now_millis() + 1_000).contains(&since));
    assert!(!first.disabled);
    let second = a
        .record_event(attempt(&claimed[1], 503, EventNext::Failed))
        .await
        .expect("record");
    let since_again = second.failing_since.expect("still failing");
    assert!((since_again - since).abs() < 1_000, "kept, not moved");
    let ok = a
        .record_event(attempt(&claimed[2], 200, EventNext::Delivered))
        .await
        .expect("record");
    assert_eq!(ok.failing_since, None, "cleared by a success");
    let sql = db.sql().await;
    let states: Vec<(String, i32, Option<i32>, bool)> = sql
        .query(
            "SELECT state, attempts, last_status, leased_by IS NULL FROM webhook_outbox
             ORDER BY webhook_id",
            &[],
        )
        .await
        .expect("rows")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(
        states,
        [
            ("pending".into(), 1, Some(500), true),
            ("failed".into(), 1, Some(503), true),
            ("delivered".into(), 1, Some(200), true),
        ]
    );
    // The retry waits its time (as a wait on the database's clock).
    let due = a.next_event_due(vec!["hook".into()]).await.expect("due");
    assert!(due.is_some_and(|t| (t - retry_at).abs() < 5_000), "{due:?}");

    // A 410: disabled in the same record; its events are neither claimed
    // nor due until an operator enables it again.
    events(&a, "D", "hook", 1).await;
    let [gone] =
        <[OutboxEvent; 1]>::try_from(claim(&a, 60_000, 10, "hook").await).expect("one due event");
    let mut last = attempt(&gone, 410, EventNext::Failed);
    last.disable = Some("410 Gone".into());
    let health = a.record_event(last).await.expect("record");
    assert!(health.disabled && health.failing_since.is_some());
    events(&a, "W", "hook", 1).await;
    assert!(claim(&a, 60_000, 10, "hook").await.is_empty());
    assert_eq!(
        a.next_event_due(vec!["hook".into()]).await.expect("due"),
        None
    );
    let admin = PgOutboxAdmin::connect(&db.url(), None)
        .await
        .expect("admin");
    let disabled = admin.disabled().await.expect("disabled");
    assert_eq!(disabled.len(), 1);
    assert_eq!(
        (disabled[0].endpoint.as_str(), disabled[0].reason.as_str()),
        ("hook", "410 Gone")
    );
    assert!(admin.enable("hook").await.expect("enable"));
    assert!(!admin.enable("hook").await.expect("enable"), "not disabled");
    assert_eq!(
        ids(&claim(&a, 60_000, 10, "hook").await),
        ["W-0".to_owned()]
    );

    // disable_endpoint (failing too long) works on its own as well.
    a.disable_endpoint("hook".into(), now_millis(), "failing for 24 h".into())
        .await
        .expect("disable");
    assert_eq!(admin.disabled().await.expect("disabled").len(), 1);
    db.drop_db().await;
}

#[tokio::test]
async fn events_written_on_one_node_wake_the_others_sender() {
    let db = TestDb::new().await;
    let (a, b) = (db.node("a").await, db.node("b").await);
    // b's LISTEN may not be in place yet: write on a until b wakes. b's
    // own mail waker must not be what wakes it.
    let woke = async {
        let mut n = 0;
        loop {
            let mut only_events = acceptance(&format!("N{n}"), None, "x");
            only_events.message = None;
            only_events.events = vec![event(&format!("n-{n}"), "hook")];
            a.commit(only_events).await.expect("commit");
            n += 1;
            if tokio::time::timeout(Duration::from_millis(300), b.events_queued())
                .await
                .is_ok()
            {
                return n;
            }
        }
    };
    let commits = tokio::time::timeout(Duration::from_secs(10), woke)
        .await
        .expect("b's sender is woken by a's events");
    assert!(commits <= 10, "{commits} commits before b woke");
    db.drop_db().await;
}

#[tokio::test]
async fn operators_list_and_redeliver_and_redeliveries_wake_the_senders() {
    let db = TestDb::new().await;
    let a = db.node("a").await;
    events(&a, "L", "hook", 2).await;
    events(&a, "M", "other", 1).await;
    let claimed = claim(&a, 60_000, 10, "hook").await;
    for e in &claimed {
        a.record_event(attempt(e, 500, EventNext::Failed))
            .await
            .expect("record");
    }
    let admin = PgOutboxAdmin::connect(&db.url(), None)
        .await
        .expect("admin");
    let all = admin.recent(None, 10).await.expect("recent");
    assert_eq!(all.len(), 3);
    assert_eq!(all[0].webhook_id, "M-0", "newest first");
    let hook = admin.recent(Some("hook"), 1).await.expect("recent");
    assert_eq!(hook.len(), 1);
    assert_eq!(
        (
            hook[0].state.as_str(),
            hook[0].attempts,
            hook[0].last_status
        ),
        ("failed", 1, Some(500))
    );
    assert_eq!(hook[0].last_error.as_deref(), Some("HTTP 500"));

    // Drain the wake-ups so far, then a redelivery wakes the sender (the
    // LISTEN may still be starting: retry the redelivery until it does).
    while tokio::time::timeout(Duration::from_millis(50), a.events_queued())
        .await
        .is_ok()
    {}
    let woke = async {
        loop {
            let n = admin
                .redeliver_one(Some("hook"), "L-0", now_millis())
                .await
                .expect("redeliver");
            assert_eq!(n, 1);
            if tokio::time::timeout(Duration::from_millis(300), a.events_queued())
                .await
                .is_ok()
            {
                return;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), woke)
        .await
        .expect("the redelivery wakes the sender");
    assert_eq!(
        admin
            .redeliver_one(None, "nope", now_millis())
            .await
            .expect("redeliver"),
        0
    );
    let since = now_millis() - 3_600_000;
    assert_eq!(
        admin
            .redeliver_since("hook", since, now_millis())
            .await
            .expect("redeliver since"),
        2
    );
    let again = claim(&a, 60_000, 10, "hook").await;
    assert_eq!(ids(&again), ["L-0".to_owned(), "L-1".to_owned()]);
    assert!(again.iter().all(|e| e.attempts == 0), "attempts reset");
    // A leased event is not redelivered under its sender.
    assert_eq!(
        admin
            .redeliver_since("hook", since, now_millis())
            .await
            .expect("redeliver since"),
        0
    );
    db.drop_db().await;
}

#[tokio::test]
async fn finished_events_are_purged_after_their_time() {
    let db = TestDb::new().await;
    let a = db.node("a").await;
    events(&a, "P", "hook", 3).await;
    let claimed = claim(&a, 60_000, 10, "hook").await;
    a.record_event(attempt(&claimed[0], 200, EventNext::Delivered))
        .await
        .expect("record");
    a.record_event(attempt(&claimed[1], 500, EventNext::Failed))
        .await
        .expect("record");
    assert_eq!(
        a.purge_events(now_millis() - 60_000, 10)
            .await
            .expect("purge"),
        0,
        "too recent"
    );
    assert_eq!(
        a.purge_events(now_millis() + 1_000, 10)
            .await
            .expect("purge"),
        2
    );
    let sql = db.sql().await;
    assert_eq!(
        count(
            &sql,
            "SELECT COUNT(*) FROM webhook_outbox WHERE state = 'sending'"
        )
        .await,
        1,
        "the one in flight stays"
    );
    db.drop_db().await;
}

#[tokio::test]
async fn the_console_reads_a_messages_events_and_each_endpoints_backlog() {
    let db = TestDb::new().await;
    let a = db.node("a").await;
    let mut accepted = acceptance("C", None, "x");
    accepted.events = ["hook", "other"]
        .iter()
        .enumerate()
        .map(|(i, ep)| NewEvent {
            queue_id: Some("C".into()),
            ..event(&format!("C-{i}"), ep)
        })
        .collect();
    a.commit(accepted).await.expect("commit");
    let claimed = claim(&a, 60_000, 10, "hook").await;
    a.record_event(attempt(
        &claimed[0],
        500,
        EventNext::RetryAt(now_millis() + 60_000),
    ))
    .await
    .expect("record");
    let admin = PgOutboxAdmin::connect(&db.url(), None)
        .await
        .expect("admin");
    let mut of_c: Vec<_> = admin
        .for_message("C", 10)
        .await
        .expect("events")
        .into_iter()
        .map(|e| e.webhook_id)
        .collect();
    of_c.sort();
    assert_eq!(of_c, ["C-0", "C-1"]);
    assert!(admin.for_message("D", 10).await.expect("events").is_empty());
    let backlog = admin
        .backlog(vec!["hook".into(), "other".into(), "none".into()])
        .await
        .expect("backlog");
    let shown: Vec<_> = backlog
        .iter()
        .map(|b| {
            (
                b.endpoint.as_str(),
                b.waiting,
                b.failing_since.is_some(),
                b.last_error.as_ref().map(|(_, e)| e.as_str()),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            ("hook", 1, true, Some("HTTP 500")),
            ("other", 1, false, None),
            ("none", 0, false, None)
        ]
    );
}

/// The console's outbox connection lives as long as the daemon: a lost
/// connection (a database restart, a terminated backend) fails the request
/// under way at most, and the next one connects again.
#[tokio::test]
async fn the_operators_connection_comes_back_after_it_was_lost() {
    let db = TestDb::new().await;
    let a = db.node("a").await;
    events(&a, "R", "hook", 1).await;
    let admin = PgOutboxAdmin::connect(&db.url(), None)
        .await
        .expect("admin");
    assert_eq!(admin.recent(None, 10).await.expect("events").len(), 1);
    let sql = db.sql().await;
    let ended = count(
        &sql,
        "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .await;
    assert!(ended >= 1, "the admin's backend was among them");
    // Its end reaches the client asynchronously: the first request after
    // may still fail; within a few it has connected again.
    let mut again = None;
    for _ in 0..20 {
        if let Ok(events) = admin.recent(None, 10).await {
            again = Some(events.len());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(again, Some(1), "the admin never connected again");
    drop(a);
    db.drop_db().await;
}
