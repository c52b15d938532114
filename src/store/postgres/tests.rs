//! The PostgreSQL store against the real server on 127.0.0.1:5432 (trust
//! auth), each test in a database of its own: two stores stand for two
//! nodes.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::{PgOptions, PgStore};
use crate::store::{
    Acceptance, AttemptOutcome, CommitOutcome, DeliveryQueue, LedgerEntry, MessageState,
    NewLedgerEntry, NewMessage, Store, StoreError, now_millis,
};

const SERVER: &str = "postgres://postgres@127.0.0.1:5432";

/// A fresh database; dropped when the test ends (best effort).
struct TestDb {
    name: String,
}

impl TestDb {
    async fn new() -> TestDb {
        static N: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "smtp_once_unit_{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        );
        let admin = admin().await;
        // One statement per call: several in one string share a
        // transaction block, which DROP/CREATE DATABASE refuse.
        for sql in [
            format!("DROP DATABASE IF EXISTS {name}"),
            format!("CREATE DATABASE {name}"),
        ] {
            admin
                .batch_execute(&sql)
                .await
                .expect("create database (is PostgreSQL running on 127.0.0.1:5432?)");
        }
        TestDb { name }
    }

    fn url(&self) -> String {
        format!("{SERVER}/{}", self.name)
    }

    async fn node(&self, id: &str) -> PgStore {
        let url = self.url();
        PgStore::open(PgOptions {
            url: &url,
            pool_size: 4,
            ca_file: None,
            node_id: id,
        })
        .await
        .expect("open store")
    }

    async fn sql(&self) -> tokio_postgres::Client {
        connect(&self.url()).await
    }

    async fn drop_db(self) {
        let admin = admin().await;
        let _ = admin
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .await;
    }
}

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    client
}

async fn admin() -> tokio_postgres::Client {
    connect(&format!("{SERVER}/postgres")).await
}

fn acceptance(id: &str, key: Option<&str>, body: &str) -> Acceptance {
    let now = now_millis();
    Acceptance {
        ledger: key.map(|k| NewLedgerEntry {
            workspace: "ws".into(),
            key: k.into(),
            entry: LedgerEntry {
                fingerprint: [7; 32],
                reply: format!("250 2.0.0 Ok: queued as {id}\r\n").into_bytes(),
                queue_id: Some(id.into()),
                created_at: now,
                expires_at: now + 3_600_000,
            },
        }),
        message: Some(NewMessage {
            id: id.into(),
            workspace: "ws".into(),
            account: "a".into(),
            reverse_path: "a@b.test".into(),
            recipients: vec!["c@d.test".into(), "e@f.test".into()],
            idempotency_key: key.map(str::to_owned),
            trace: "Received: x\r\n".into(),
            body: body.as_bytes().to_vec(),
            mail_params: None,
            created_at: now,
        }),
        events: Vec::new(),
    }
}

async fn count(c: &tokio_postgres::Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).await.expect("count").get(0)
}

#[tokio::test]
async fn one_key_raced_from_two_nodes_commits_once() {
    let db = TestDb::new().await;
    let (a, b) = (db.node("a").await, db.node("b").await);
    let mut commits = Vec::new();
    for i in 0..16 {
        let node = if i % 2 == 0 { &a } else { &b };
        commits.push(node.commit(acceptance(&format!("Q{i}"), Some("k"), "same")));
    }
    let outcomes = futures_util::future::join_all(commits).await;
    let committed = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(CommitOutcome::Committed)))
        .count();
    let taken = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(CommitOutcome::KeyTaken)))
        .count();
    assert_eq!((committed, taken), (1, 15), "{outcomes:?}");
    let sql = db.sql().await;
    assert_eq!(count(&sql, "SELECT COUNT(*) FROM queue").await, 1);
    assert_eq!(count(&sql, "SELECT COUNT(*) FROM message_body").await, 1);
    let entry = a
        .lookup("ws", "k", 0)
        .await
        .expect("lookup")
        .expect("entry");
    let row: String = sql
        .query_one("SELECT id FROM queue", &[])
        .await
        .expect("row")
        .get(0);
    assert_eq!(entry.queue_id, Some(row), "the ledger names the queued row");
    // Without a key, every message is its own row; a stored rejection is
    // a ledger entry alone.
    a.commit(acceptance("N1", None, "x")).await.expect("commit");
    let mut rejection = acceptance("R1", Some("rejected"), "x");
    rejection.message = None;
    assert_eq!(
        b.commit(rejection).await.expect("commit"),
        CommitOutcome::Committed
    );
    assert_eq!(count(&sql, "SELECT COUNT(*) FROM queue").await, 2);
    assert_eq!(count(&sql, "SELECT COUNT(*) FROM ledger").await, 2);
    db.drop_db().await;
}

#[tokio::test]
async fn an_expired_entry_is_replaced_by_the_database_clock() {
    let db = TestDb::new().await;
    let a = db.node("a").await;
    let mut first = acceptance("E1", Some("k"), "one");
    if let Some(l) = first.ledger.as_mut() {
        // A node whose clock is an hour ahead cannot make an entry live
        // longer: only the ttl counts, on the database's clock.
        l.entry.created_at += 3_600_000;
        l.entry.expires_at = l.entry.created_at + 50;
    }
    a.commit(first).await.expect("commit");
    assert!(a.lookup("ws", "k", 0).await.expect("lookup").is_some());
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(
        a.lookup("ws", "k", 0).await.expect("lookup").is_none(),
        "expired"
    );
    assert_eq!(
        a.commit(acceptance("E2", Some("k"), "two"))
            .await
            .expect("commit"),
        CommitOutcome::Committed
    );
    assert_eq!(a.purge_expired(0, 100).await.expect("purge"), 0);
    db.drop_db().await;
}

#[tokio::test]
async fn two_nodes_claim_apart_and_a_dead_nodes_lease_passes_on() {
    let db = TestDb::new().await;
    let (a, b) = (db.node("a").await, db.node("b").await);
    for i in 0..10 {
        a.commit(acceptance(&format!("M{i}"), None, "m"))
            .await
            .expect("commit");
    }
    let now = now_millis();
    let (ca, cb) = tokio::join!(
        a.claim(now, now + 60_000, 6, vec![]),
        b.claim(now, now + 60_000, 6, vec![])
    );
    let (ca, cb) = (ca.expect("claim a"), cb.expect("claim b"));
    assert_eq!(ca.len() + cb.len(), 10, "all claimed, by one node each");
    assert!(ca.iter().all(|m| !cb.iter().any(|n| n.id == m.id)));
    assert!(ca.iter().all(|m| m.body == b"m" && m.recipients.len() == 2));
    // Leases held: nothing more to claim.
    assert!(
        b.claim(now, now + 60_000, 10, vec![])
            .await
            .expect("claim")
            .is_empty()
    );

    // a records one, then dies with the rest leased for 1 ms; b's renewal
    // only touches b's own leases.
    let done = &ca[0];
    let outcome = AttemptOutcome {
        id: done.id.clone(),
        at: now,
        rows: done
            .recipients
            .iter()
            .map(|r| crate::store::AttemptRow {
                recipient: r.clone(),
                outcome: "delivered",
                reply: "250 ok".into(),
                next_hop: None,
            })
            .collect(),
        state: MessageState::Delivered,
        next_attempt_at: None,
        last_error: None,
        bounce: None,
        events: Vec::new(),
        keep_body: true,
    };
    assert_eq!(
        a.record(outcome).await.expect("record"),
        Some(MessageState::Delivered)
    );
    let a_ids: Vec<String> = ca[1..].iter().map(|m| m.id.clone()).collect();
    assert_eq!(
        a.renew(a_ids.clone(), 0, 1).await.expect("renew"),
        a_ids.len()
    );
    assert_eq!(
        b.renew(a_ids.clone(), 0, 60_000).await.expect("renew"),
        0,
        "not b's leases"
    );
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let now = now_millis();
    let taken = b.claim(now, now + 60_000, 10, vec![]).await.expect("claim");
    let mut taken: Vec<String> = taken.into_iter().map(|m| m.id).collect();
    taken.sort();
    let mut expected = a_ids.clone();
    expected.sort();
    assert_eq!(taken, expected, "a's expired leases, and only those");

    // b stops: its leases go back, a's delivered message stays delivered.
    let released = b.release_all(0).await.expect("release");
    assert_eq!(released, 10 - 1);
    let sql = db.sql().await;
    assert_eq!(
        count(
            &sql,
            "SELECT COUNT(*) FROM queue WHERE state = 'queued' AND leased_by IS NULL"
        )
        .await,
        9
    );
    assert_eq!(
        count(&sql, "SELECT COUNT(*) FROM delivery_attempt").await,
        2
    );
    assert!(a.next_due(vec![]).await.expect("due").is_some());
    db.drop_db().await;
}

/// Held while node a delivers it, then released: the message is due when
/// a's lease ends, but a is still delivering and renews that lease. No
/// other node may claim it while the lease runs (found in issue 22's
/// review: the claim of due rows looked at next_attempt_at only).
#[tokio::test]
async fn a_released_message_is_not_claimed_under_a_live_lease() {
    use crate::store::admin::QueueAdmin;
    let db = TestDb::new().await;
    let (a, b) = (db.node("a").await, db.node("b").await);
    let admin = super::admin::PgQueueAdmin::connect(&db.url(), None)
        .await
        .expect("admin");
    a.commit(acceptance("M0", None, "m")).await.expect("commit");
    let now = now_millis();
    let claimed = a.claim(now, now + 2_000, 1, vec![]).await.expect("claim");
    assert_eq!(claimed.len(), 1);
    admin.hold("M0").await.expect("hold");
    admin.release("M0").await.expect("release");
    // a keeps delivering past the lease it had at the release.
    for _ in 0..6 {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let now = now_millis();
        a.renew(vec!["M0".into()], now, now + 2_000)
            .await
            .expect("renew");
        let now = now_millis();
        let taken = b.claim(now, now + 60_000, 10, vec![]).await.expect("claim");
        assert!(
            taken.is_empty(),
            "node b claimed a message node a is still delivering"
        );
    }
    db.drop_db().await;
}

#[tokio::test]
async fn a_schema_newer_than_the_binary_is_refused() {
    let db = TestDb::new().await;
    db.node("a").await.close();
    db.sql()
        .await
        .batch_execute("INSERT INTO schema_version (version) VALUES (999)")
        .await
        .expect("insert");
    let url = db.url();
    let refused = PgStore::open(PgOptions {
        url: &url,
        pool_size: 2,
        ca_file: None,
        node_id: "b",
    })
    .await;
    match refused {
        Err(StoreError::Unavailable(why)) => {
            assert!(why.contains("newer than this smtp-once"), "{why}")
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("opened a newer schema"),
    }
    db.drop_db().await;
}

#[tokio::test]
async fn an_unreachable_server_is_unavailable() {
    let refused = PgStore::open(PgOptions {
        url: "postgres://postgres@127.0.0.1:1/none",
        pool_size: 2,
        ca_file: None,
        node_id: "a",
    })
    .await;
    assert!(matches!(refused, Err(StoreError::Unavailable(_))));
}

#[tokio::test]
async fn mail_queued_on_one_node_wakes_the_others() {
    let db = TestDb::new().await;
    let (a, b) = (db.node("a").await, db.node("b").await);
    // b's LISTEN may not be in place yet: commit on a until b wakes.
    let woke = async {
        let mut n = 0;
        loop {
            a.commit(acceptance(&format!("W{n}"), None, "w"))
                .await
                .expect("commit");
            n += 1;
            if tokio::time::timeout(std::time::Duration::from_millis(300), b.queued())
                .await
                .is_ok()
            {
                return n;
            }
        }
    };
    let commits = tokio::time::timeout(std::time::Duration::from_secs(10), woke)
        .await
        .expect("b is woken by a's commits");
    assert!(commits <= 10, "{commits} commits before b woke");
    db.drop_db().await;
}

#[tokio::test]
async fn ready_and_queue_depth_then_not_ready_once_the_database_is_gone() {
    let db = TestDb::new().await;
    let store = db.node("a").await;
    store.ready().await.expect("ready");
    assert_eq!(store.queue_depth().await.expect("depth").counts, []);
    store
        .commit(acceptance("Q1", Some("k"), "body"))
        .await
        .expect("commit");
    let depth = store.queue_depth().await.expect("depth");
    assert_eq!(depth.counts, [(MessageState::Queued, 1)]);
    assert!(
        depth
            .oldest_age_ms
            .is_some_and(|ms| (0..60_000).contains(&ms))
    );
    db.drop_db().await; // WITH (FORCE): the writer's connection is cut
    let probe = store.ready().await;
    assert!(
        matches!(probe, Err(StoreError::Unavailable(_))),
        "{probe:?}"
    );
    store.close();
}

// Issue 22 item 5: the count and the oldest age are one statement now (one
// scan instead of two); the same answer: each live state, and the oldest
// age over queued, deferred and delivering only (not held, not done).
#[tokio::test]
async fn queue_depth_counts_live_states_and_ages_only_waiting_ones() {
    let db = TestDb::new().await;
    let store = db.node("a").await;
    db.sql()
        .await
        .batch_execute(
            "INSERT INTO queue (id, workspace, account, reverse_path, recipients, size, state,
                                created_at, updated_at)
             SELECT id, 'w', 'a', 's@x', 'r@y', 1, state, smtp_once_now() - age, 0
             FROM (VALUES ('Q1', 'queued', 5000), ('Q2', 'queued', 1000),
                          ('D1', 'deferred', 20000), ('H1', 'held', 9000000),
                          ('F1', 'delivered', 9000000)) AS v(id, state, age)",
        )
        .await
        .expect("rows");
    let mut depth = store.queue_depth().await.expect("depth");
    depth.counts.sort_by_key(|(s, _)| s.as_str());
    assert_eq!(
        depth.counts,
        [
            (MessageState::Deferred, 1),
            (MessageState::Held, 1),
            (MessageState::Queued, 2)
        ]
    );
    let age = depth.oldest_age_ms.expect("an oldest");
    assert!((20_000..80_000).contains(&age), "{age}: the deferred one");
    store.close();
    db.drop_db().await;
}

#[tokio::test]
async fn a_second_live_node_with_the_same_id_is_refused() {
    let db = TestDb::new().await;
    let first = db.node("same").await;
    let url = db.url();
    let open = || {
        PgStore::open(PgOptions {
            url: &url,
            pool_size: 2,
            ca_file: None,
            node_id: "same",
        })
    };
    match open().await {
        Err(StoreError::Unavailable(why)) => assert!(why.contains("in use"), "{why}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("two live nodes share an id"),
    }
    // Once the first is gone (a crash drops its connection the same way),
    // the id is free again.
    first.close();
    let again = wait_for(open).await;
    again.close();
    db.drop_db().await;
}

#[tokio::test]
async fn a_lock_held_elsewhere_is_unavailable_after_the_lock_timeout() {
    let db = TestDb::new().await;
    let a = db.node("a").await;
    let mut other = db.sql().await;
    let tx = other.transaction().await.expect("begin");
    tx.batch_execute("LOCK TABLE ledger IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("lock");
    let started = std::time::Instant::now();
    let looked = a.lookup("ws", "k", 0).await;
    assert!(
        matches!(looked, Err(StoreError::Unavailable(_))),
        "{looked:?}"
    );
    let committed = a.commit(acceptance("L1", Some("k"), "x")).await;
    assert!(
        matches!(committed, Err(StoreError::Unavailable(_))),
        "{committed:?}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    tx.rollback().await.expect("rollback");
    assert_eq!(
        a.commit(acceptance("L2", Some("k"), "x"))
            .await
            .expect("commit"),
        CommitOutcome::Committed
    );
    db.drop_db().await;
}

/// Retries `open` for a few seconds (the server notices a closed
/// connection a moment later).
async fn wait_for<F, Fut>(open: F) -> PgStore
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<PgStore, StoreError>>,
{
    for _ in 0..50 {
        if let Ok(store) = open().await {
            return store;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("the node id stayed taken");
}

#[path = "outbox_tests.rs"]
mod outbox;

#[tokio::test]
async fn purges_delete_past_rows_up_to_their_limit_one_node_at_a_time() {
    let db = TestDb::new().await;
    let a = db.node("a").await;
    for i in 0..3 {
        let (id, key) = (format!("P{i}"), format!("k{i}"));
        a.commit(acceptance(&id, Some(&key), "m"))
            .await
            .expect("commit");
    }
    let sql = db.sql().await;
    sql.batch_execute(
        "UPDATE ledger SET expires_at = smtp_once_now() - 1;
         UPDATE queue SET state = 'delivered', updated_at = smtp_once_now() - 3600000",
    )
    .await
    .expect("age the rows");
    let lock = &super::housekeeping::HOUSEKEEPING_LOCK;
    // Another node is purging: this one deletes nothing.
    sql.execute("SELECT pg_advisory_lock($1)", &[lock])
        .await
        .expect("lock");
    assert_eq!(a.purge_expired(0, 10).await.expect("purge"), 0);
    assert_eq!(a.purge_finished(now_millis(), 10).await.expect("purge"), 0);
    sql.execute("SELECT pg_advisory_unlock($1)", &[lock])
        .await
        .expect("unlock");
    assert_eq!(a.purge_expired(0, 2).await.expect("purge"), 2);
    assert_eq!(a.purge_expired(0, 10).await.expect("purge"), 1);
    assert_eq!(count(&sql, "SELECT COUNT(*) FROM ledger").await, 0);
    // Finished an hour ago: not older than two hours, older than a minute.
    let hours_ago = now_millis() - 7_200_000;
    assert_eq!(a.purge_finished(hours_ago, 10).await.expect("purge"), 0);
    let minute_ago = now_millis() - 60_000;
    assert_eq!(a.purge_finished(minute_ago, 2).await.expect("purge"), 2);
    assert_eq!(a.purge_finished(minute_ago, 10).await.expect("purge"), 1);
    assert_eq!(count(&sql, "SELECT COUNT(*) FROM queue").await, 0);
    assert_eq!(count(&sql, "SELECT COUNT(*) FROM message_body").await, 0);
    db.drop_db().await;
}
