//! The delivery queue on a real SQLite file: leases, in-flight skips,
//! records (holds, deletions, bounces), purges and the wake-up on queued
//! mail.

use std::time::Duration;

use super::super::SqliteStore;
use super::{CLAIM, INSERT_ATTEMPT, LAST_ATTEMPT, NEXT_DUE, claim_on, insert_attempt, next_due_on};
use crate::store::{
    Acceptance, AttemptOutcome, AttemptRow, DeliveryQueue, MessageState, NewMessage, Store,
};

fn setup() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().expect("tmp");
    let store = SqliteStore::open(dir.path()).expect("store");
    sql(
        &store,
        "INSERT INTO queue (id, workspace, account, reverse_path, recipients, size, state,
                            attempts, next_attempt_at, created_at, updated_at)
         VALUES ('Q1', 'w', 'a', 's@x', 'r1@y\nr2@y', 1, 'queued', 0, 100, 100, 100);
         INSERT INTO message_body (queue_id, trace, body) VALUES ('Q1', 'T', x'42');",
    );
    (dir, store)
}

fn sql(store: &SqliteStore, batch: &str) {
    let conn = rusqlite::Connection::open(store.db_path()).expect("open");
    conn.execute_batch(batch).expect("sql");
}

fn state_of(store: &SqliteStore, id: &str) -> (String, Option<i64>) {
    let conn = rusqlite::Connection::open(store.db_path()).expect("open");
    conn.query_row(
        "SELECT state, next_attempt_at FROM queue WHERE id = ?1",
        [id],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .expect("row")
}

async fn claim_ids(store: &SqliteStore, now: i64, until: i64, skip: &[&str]) -> Vec<String> {
    let skip = skip.iter().map(|s| (*s).to_owned()).collect();
    store
        .claim(now, until, 10, skip)
        .await
        .expect("claim")
        .into_iter()
        .map(|m| m.id)
        .collect()
}

fn attempt(
    id: &str,
    at: i64,
    rows: &[(&str, &'static str)],
    state: MessageState,
) -> AttemptOutcome {
    AttemptOutcome {
        id: id.into(),
        at,
        rows: rows
            .iter()
            .map(|(rcpt, outcome)| AttemptRow {
                recipient: (*rcpt).into(),
                outcome,
                reply: format!("reply for {rcpt}"),
                next_hop: Some("hop".into()),
            })
            .collect(),
        state,
        next_attempt_at: (state == MessageState::Deferred).then_some(at + 1000),
        last_error: None,
        bounce: None,
        events: Vec::new(),
        keep_body: true,
    }
}

#[tokio::test]
async fn a_lease_keeps_others_away_until_it_expires() {
    let (_dir, store) = setup();
    assert!(
        claim_ids(&store, 99, 1000, &[]).await.is_empty(),
        "not due yet"
    );
    let claimed = store.claim(100, 1000, 10, vec![]).await.expect("claim");
    assert_eq!(claimed.len(), 1);
    let msg = &claimed[0];
    assert_eq!(
        (msg.id.as_str(), msg.body.as_slice(), msg.recipients.len()),
        ("Q1", &b"B"[..], 2),
        "claimed messages come loaded"
    );
    assert!(claim_ids(&store, 999, 2000, &[]).await.is_empty(), "leased");
    assert_eq!(store.next_due(vec![]).await.expect("due"), Some(1000));
    assert_eq!(
        claim_ids(&store, 1000, 3000, &[]).await,
        ["Q1"],
        "lease expired"
    );
    assert!(
        claim_ids(&store, 3000, 4000, &["Q1"]).await.is_empty(),
        "lease expired but its attempt is still in flight here"
    );
    assert_eq!(store.next_due(vec!["Q1".into()]).await.expect("due"), None);
    assert_eq!(claim_ids(&store, 3000, 4000, &["Q0"]).await, ["Q1"]);
    assert_eq!(store.release_all(1500).await.expect("release"), 1);
    assert_eq!(state_of(&store, "Q1"), ("queued".into(), Some(1500)));
}

#[tokio::test]
async fn a_record_ends_the_lease_and_final_recipients_come_back_as_done() {
    let (_dir, store) = setup();
    claim_ids(&store, 100, 1000, &[]).await;
    let first = attempt(
        "Q1",
        200,
        &[("r1@y", "delivered"), ("r2@y", "deferred")],
        MessageState::Deferred,
    );
    assert_eq!(
        store.record(first).await.expect("record"),
        Some(MessageState::Deferred)
    );
    assert_eq!(state_of(&store, "Q1"), ("deferred".into(), Some(1200)));
    let again = store.claim(1200, 5000, 10, vec![]).await.expect("claim");
    let mut latest = again[0].latest_outcomes.clone();
    latest.sort();
    assert_eq!(
        latest,
        [
            ("r1@y".to_owned(), "delivered".to_owned()),
            ("r2@y".to_owned(), "deferred".to_owned())
        ]
    );
    assert_eq!(again[0].attempts, 1);

    // Held while the attempt ran: a deferral keeps it held.
    sql(&store, "UPDATE queue SET state = 'held' WHERE id = 'Q1'");
    let second = attempt("Q1", 1400, &[("r2@y", "deferred")], MessageState::Deferred);
    assert_eq!(
        store.record(second.clone()).await.expect("record"),
        Some(MessageState::Held)
    );
    sql(
        &store,
        "DELETE FROM delivery_attempt; DELETE FROM message_body; DELETE FROM queue;",
    );
    assert_eq!(
        store.record(second).await.expect("record"),
        None,
        "deleted meanwhile"
    );
}

#[tokio::test]
async fn a_bounce_is_queued_with_the_record_and_wakes_the_worker() {
    let (_dir, store) = setup();
    claim_ids(&store, 100, 1000, &[]).await;
    // Consume any wake-up the setup left.
    let _ = tokio::time::timeout(Duration::from_millis(10), store.queued()).await;
    let mut failed = attempt(
        "Q1",
        200,
        &[("r1@y", "failed"), ("r2@y", "failed")],
        MessageState::Failed,
    );
    failed.bounce = Some(NewMessage {
        id: "DSN1".into(),
        workspace: "w".into(),
        account: "MAILER-DAEMON".into(),
        reverse_path: String::new(),
        recipients: vec!["s@x".into()],
        idempotency_key: None,
        trace: "T".into(),
        body: b"bounce".to_vec(),
        mail_params: None,
        created_at: 200,
    });
    store.record(failed).await.expect("record");
    tokio::time::timeout(Duration::from_secs(5), store.queued())
        .await
        .expect("the record that queued a bounce wakes the worker");
    assert_eq!(state_of(&store, "DSN1"), ("queued".into(), Some(200)));
    assert_eq!(state_of(&store, "Q1").0, "failed");
}

#[tokio::test]
async fn an_accepted_message_wakes_the_worker() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = SqliteStore::open(dir.path()).expect("store");
    assert!(
        tokio::time::timeout(Duration::from_millis(50), store.queued())
            .await
            .is_err(),
        "nothing queued yet"
    );
    let waiting = store.queued();
    let message = NewMessage {
        id: "A1".into(),
        workspace: "w".into(),
        account: "a".into(),
        reverse_path: "s@x".into(),
        recipients: vec!["r@y".into()],
        idempotency_key: None,
        trace: "T".into(),
        body: b"hi".to_vec(),
        mail_params: None,
        created_at: 100,
    };
    store
        .commit(Acceptance {
            ledger: None,
            message: Some(message),
            events: Vec::new(),
        })
        .await
        .expect("commit");
    tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("woken after the commit");
}

#[tokio::test]
async fn finished_messages_are_purged_after_keep_finished() {
    let (_dir, store) = setup();
    sql(
        &store,
        "INSERT INTO queue (id, workspace, account, reverse_path, recipients, size, state,
                            attempts, next_attempt_at, created_at, updated_at)
         VALUES ('D1', 'w', 'a', 's@x', 'r@y', 1, 'delivered', 1, NULL, 100, 200),
                ('F1', 'w', 'a', 's@x', 'r@y', 1, 'failed', 1, NULL, 100, 300),
                ('D2', 'w', 'a', 's@x', 'r@y', 1, 'delivered', 1, NULL, 100, 900),
                ('H1', 'w', 'a', 's@x', 'r@y', 1, 'held', 0, 100, 100, 100);
         INSERT INTO message_body (queue_id, trace, body)
           VALUES ('D1', 'T', x'42'), ('F1', 'T', x'42'), ('D2', 'T', x'42'), ('H1', 'T', x'42');
         INSERT INTO delivery_attempt (queue_id, id, recipient, at, outcome, reply)
           VALUES ('D1', 1, 'r@y', 200, 'delivered', '250 ok');",
    );
    assert_eq!(store.purge_finished(500, 1).await.expect("purge"), 1);
    assert_eq!(store.purge_finished(500, 10).await.expect("purge"), 1);
    assert_eq!(store.purge_finished(500, 10).await.expect("purge"), 0);
    let conn = rusqlite::Connection::open(store.db_path()).expect("open");
    let left = super::super::tests::strings(&conn, "SELECT id FROM queue ORDER BY id");
    assert_eq!(left, ["D2", "H1", "Q1"], "recent, unfinished and held stay");
    let orphans: i64 = conn
        .query_row(
            "SELECT (SELECT COUNT(*) FROM message_body WHERE queue_id NOT IN (SELECT id FROM queue))
                  + (SELECT COUNT(*) FROM delivery_attempt WHERE queue_id NOT IN (SELECT id FROM queue))",
            [],
            |r| r.get(0),
        )
        .expect("count");
    assert_eq!(orphans, 0, "bodies and attempts go with their rows");
}

/// Every claim binds a new "now". The statements that run for every
/// message or claim are prepared once: SQLite prepared the claim again at
/// each run, having compared its parameters with `queue_due`'s condition,
/// and the attempt's INSERT when it held its number as a subquery (issue
/// 24: 2.6 % of the writer's time, parsing).
#[test]
fn live_queries_are_prepared_once() {
    use rusqlite::StatementStatus;
    let mut conn = rusqlite::Connection::open_in_memory().expect("db");
    super::super::plan_once(&conn).expect("config");
    super::super::schema::migrate(&mut conn).expect("schema");
    conn.execute_batch(
        "INSERT INTO queue (id, workspace, account, reverse_path, recipients, size, state,
                            attempts, next_attempt_at, created_at, updated_at)
         VALUES ('Q1', 'w', 'a', 's@x', 'r@y', 1, 'queued', 0, 100, 100, 100),
                ('Q2', 'w', 'a', 's@x', 'r@y', 1, 'queued', 0, 250, 100, 100);",
    )
    .expect("rows");
    for now in [100, 200, 300, 400] {
        let tx = conn.transaction().expect("tx");
        claim_on(&tx, now, now + 50, 1, "").expect("claim");
        insert_attempt(&tx, "Q1", "r@y", now, "deferred", "451 later", None).expect("attempt");
        tx.commit().expect("commit");
        next_due_on(&conn, "Q2").expect("next due");
        super::super::probe::queue_depth_on(&conn, now).expect("depth");
    }
    let attempts: i64 = conn
        .query_row(
            "SELECT MAX(id) FROM delivery_attempt WHERE queue_id = 'Q1'",
            [],
            |r| r.get(0),
        )
        .expect("attempts");
    assert_eq!(attempts, 4, "numbered 1 to 4");
    for sql in [
        CLAIM,
        LAST_ATTEMPT,
        INSERT_ATTEMPT,
        NEXT_DUE,
        super::super::probe::COUNT,
    ] {
        let stmt = conn.prepare_cached(sql).expect("cached");
        assert_eq!(stmt.get_status(StatementStatus::RePrepare), 0, "{sql}");
        assert!(stmt.get_status(StatementStatus::VmStep) > 0, "ran: {sql}");
    }
}
