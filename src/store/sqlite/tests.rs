//! The SQLite store on a real file: atomic ledger+queue commits, group
//! commit keeping one row per key, expiry, and the data-directory lock.

use super::SqliteStore;
use crate::store::{
    Acceptance, CommitOutcome, LedgerEntry, NewLedgerEntry, NewMessage, Store, StoreError,
};

/// The first column of every row `sql` returns, as text.
pub(super) fn strings(conn: &rusqlite::Connection, sql: &str) -> Vec<String> {
    conn.prepare(sql)
        .expect("prepare")
        .query_map([], |r| r.get(0))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows")
}

pub(super) fn acceptance(id: &str, key: Option<&str>, now: i64, ttl: i64) -> Acceptance {
    Acceptance {
        ledger: key.map(|k| NewLedgerEntry {
            workspace: "ws".into(),
            key: k.into(),
            entry: LedgerEntry {
                fingerprint: [7; 32],
                reply: format!("250 2.0.0 Ok: queued as {id}\r\n").into_bytes(),
                queue_id: Some(id.into()),
                created_at: now,
                expires_at: now + ttl,
            },
        }),
        message: Some(NewMessage {
            id: id.into(),
            workspace: "ws".into(),
            account: "a".into(),
            reverse_path: "a@b.test".into(),
            recipients: vec!["c@d.test".into()],
            idempotency_key: key.map(str::to_owned),
            trace: "Received: x\r\n".into(),
            body: b"Subject: s\r\n\r\nbody\r\n".to_vec(),
            mail_params: None,
            created_at: now,
        }),
        events: Vec::new(),
    }
}

/// Runs empty batches (a merge step before each) until no ledger entry is
/// staged: a merge started by then has moved everything.
pub(super) async fn settle_merges(store: &SqliteStore) {
    let conn = rusqlite::Connection::open(store.db_path()).expect("open");
    for _ in 0..100 {
        let staged: i64 = conn
            .query_row("SELECT COUNT(*) FROM ledger_staging", [], |r| r.get(0))
            .expect("count");
        if staged == 0 {
            return;
        }
        store.ready().await.expect("ready");
    }
    panic!("the merge did not end");
}

fn queue_rows(store: &SqliteStore) -> i64 {
    let conn = rusqlite::Connection::open(store.db_path()).expect("open");
    conn.query_row("SELECT COUNT(*) FROM queue", [], |r| r.get(0))
        .expect("count")
}

#[tokio::test]
async fn same_key_in_one_batch_commits_once() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = SqliteStore::open(dir.path()).expect("open");
    // Sent back to back, these land in the writer's channel together and
    // are committed in one transaction.
    let futures: Vec<_> = (0..50)
        .map(|i| store.commit(acceptance(&format!("id{i:03}"), Some("k"), 1000, 10_000)))
        .collect();
    let mut outcomes = Vec::new();
    for f in futures {
        outcomes.push(f.await.expect("commit"));
    }
    let committed = outcomes
        .iter()
        .filter(|o| **o == CommitOutcome::Committed)
        .count();
    assert_eq!(committed, 1, "{outcomes:?}");
    assert_eq!(queue_rows(&store), 1);
    let entry = store
        .lookup("ws", "k", 1001)
        .await
        .expect("lookup")
        .expect("entry");
    assert_eq!(entry.queue_id.as_deref(), Some("id000"));
    assert!(
        store
            .lookup("other", "k", 1001)
            .await
            .expect("lookup")
            .is_none()
    );
}

#[tokio::test]
async fn many_keys_batched_all_commit() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = SqliteStore::open(dir.path()).expect("open");
    let futures: Vec<_> = (0..600)
        .map(|i| {
            store.commit(acceptance(
                &format!("m{i:04}"),
                Some(&format!("k{i}")),
                5,
                100,
            ))
        })
        .collect();
    for f in futures {
        assert_eq!(f.await.expect("commit"), CommitOutcome::Committed);
    }
    assert_eq!(queue_rows(&store), 600);
}

#[tokio::test]
async fn expired_entry_is_absent_replaced_and_purged() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = SqliteStore::open(dir.path()).expect("open");
    let first = store.commit(acceptance("a1", Some("k"), 1000, 100)).await;
    assert_eq!(first.expect("commit"), CommitOutcome::Committed);
    assert!(store.lookup("ws", "k", 1099).await.expect("l").is_some());
    assert!(
        store.lookup("ws", "k", 1100).await.expect("l").is_none(),
        "expired at expires_at"
    );
    // A live entry blocks; an expired one is replaced.
    let blocked = store.commit(acceptance("a2", Some("k"), 1050, 100)).await;
    assert_eq!(blocked.expect("commit"), CommitOutcome::KeyTaken);
    let replaced = store.commit(acceptance("a3", Some("k"), 1200, 100)).await;
    assert_eq!(replaced.expect("commit"), CommitOutcome::Committed);
    assert_eq!(
        queue_rows(&store),
        2,
        "a blocked commit writes no queue row"
    );
    store
        .commit(acceptance("b1", Some("k2"), 0, 10))
        .await
        .expect("commit");
    // Entries leave with their partition (a second's span here) once the
    // whole span has expired: b1's span ends at 1 s, the other two's
    // (the replaced one included) at 2 s.
    assert_eq!(store.purge_expired(999, 10).await.expect("purge"), 0);
    assert_eq!(store.purge_expired(1_999, 10).await.expect("purge"), 1);
    assert_eq!(store.purge_expired(2_000, 1).await.expect("purge"), 1);
    assert_eq!(store.purge_expired(2_000, 10).await.expect("purge"), 1);
    assert_eq!(store.purge_expired(2_000, 10).await.expect("purge"), 0);
    assert_eq!(queue_rows(&store), 3, "purge never removes queue rows");
}

/// A key is one entry across partitions: an entry written in one hour's
/// span still blocks the key from a later span until it expires, and a
/// purge of an older span (index dropped, rows going in batches) leaves
/// the live entries of the others found.
#[tokio::test]
async fn a_live_entry_in_another_partition_holds_its_key() {
    const HOUR: i64 = 3_600_000;
    let dir = tempfile::tempdir().expect("tmp");
    let store = SqliteStore::open(dir.path()).expect("open");
    let commit = |id: &'static str, key: &'static str, now: i64| {
        store.commit(acceptance(id, Some(key), now, 3 * HOUR))
    };
    // Spans by expiry: 3 h (ledger_p3600_3) and 5 h (ledger_p3600_5).
    assert_eq!(
        commit("q1", "k", 0).await.expect("c"),
        CommitOutcome::Committed
    );
    assert_eq!(
        commit("q2", "old", 10).await.expect("c"),
        CommitOutcome::Committed
    );
    assert_eq!(
        commit("q3", "k", 2 * HOUR).await.expect("c"),
        CommitOutcome::KeyTaken,
        "the entry in the 3 h span is live at 2 h"
    );
    assert_eq!(
        commit("q4", "k2", 2 * HOUR).await.expect("c"),
        CommitOutcome::Committed
    );
    // At 3 h + 1 ms "k" has expired: taken again, into the 6 h span.
    assert_eq!(
        commit("q5", "k", 3 * HOUR + 1).await.expect("c"),
        CommitOutcome::Committed
    );
    let found = store
        .lookup("ws", "k", 3 * HOUR + 2)
        .await
        .expect("l")
        .expect("entry");
    assert_eq!(found.queue_id.as_deref(), Some("q5"));
    // The 3 h span ends at 4 h: its two entries go, one per call here.
    assert_eq!(store.purge_expired(4 * HOUR, 1).await.expect("purge"), 1);
    assert!(
        store
            .lookup("ws", "k2", 4 * HOUR)
            .await
            .expect("l")
            .is_some(),
        "the 5 h span's entry while the 3 h span is half purged"
    );
    assert_eq!(store.purge_expired(4 * HOUR, 1).await.expect("purge"), 1);
    assert_eq!(store.purge_expired(4 * HOUR, 1).await.expect("purge"), 0);
    assert_eq!(
        store
            .lookup("ws", "k", 4 * HOUR)
            .await
            .expect("l")
            .map(|e| e.queue_id),
        Some(Some("q5".into()))
    );
    // q5's entry reaches its partition with the merge under way.
    settle_merges(&store).await;
    let conn = rusqlite::Connection::open(store.db_path()).expect("open");
    let tables = strings(
        &conn,
        "SELECT name FROM sqlite_schema WHERE type = 'table' AND name LIKE 'ledger_p%' ORDER BY name",
    );
    assert_eq!(
        tables,
        ["ledger_p3600_5", "ledger_p3600_6"],
        "the 3 h span's table is gone"
    );
    assert_eq!(queue_rows(&store), 4, "purge never removes queue rows");
}

#[tokio::test]
async fn one_process_per_data_dir() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = SqliteStore::open(dir.path()).expect("open");
    match SqliteStore::open(dir.path()) {
        Err(StoreError::Unavailable(msg)) => assert!(msg.contains("in use"), "{msg}"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("second store opened the same data dir"),
    }
    store.close();
    SqliteStore::open(dir.path()).expect("reopen after close");
}

#[tokio::test]
async fn writer_gone_is_unavailable() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = SqliteStore::open(dir.path()).expect("open");
    store.stop_writer_for_test();
    let err = store.commit(acceptance("x", Some("k"), 0, 10)).await;
    assert!(matches!(err, Err(StoreError::Unavailable(_))), "{err:?}");
}

#[tokio::test]
async fn a_moved_data_dir_is_unavailable_until_it_is_back() {
    let tmp = tempfile::tempdir().expect("tmp");
    let data = tmp.path().join("data");
    let store = SqliteStore::open(&data).expect("open");
    let ok = store.commit(acceptance("Q1", Some("k1"), 1, 1000)).await;
    assert!(matches!(ok, Ok(CommitOutcome::Committed)), "{ok:?}");

    let moved = tmp.path().join("moved");
    std::fs::rename(&data, &moved).expect("mv");
    let refused = store.commit(acceptance("Q2", Some("k2"), 1, 1000)).await;
    assert!(
        matches!(refused, Err(StoreError::Unavailable(_))),
        "{refused:?}"
    );
    let lookup = store.lookup("ws", "k1", 2).await;
    assert!(
        matches!(lookup, Err(StoreError::Unavailable(_))),
        "{lookup:?}"
    );

    std::fs::rename(&moved, &data).expect("mv back");
    let ok = store.commit(acceptance("Q3", Some("k3"), 1, 1000)).await;
    assert!(matches!(ok, Ok(CommitOutcome::Committed)), "{ok:?}");
    assert!(store.lookup("ws", "k1", 2).await.expect("lookup").is_some());
    assert_eq!(queue_rows(&store), 2, "nothing written while it was away");
}

#[tokio::test]
async fn ready_and_queue_depth() {
    use crate::store::MessageState;
    let dir = tempfile::tempdir().expect("tmp");
    let store = SqliteStore::open(dir.path()).expect("open");
    store.ready().await.expect("ready");
    let empty = store.queue_depth().await.expect("depth");
    assert!(empty.counts.is_empty(), "{empty:?}");
    assert_eq!(empty.oldest_age_ms, None);
    let created = crate::store::now_millis() - 5_000;
    for id in ["Q1", "Q2"] {
        store
            .commit(acceptance(id, None, created, 10_000))
            .await
            .expect("commit");
    }
    let depth = store.queue_depth().await.expect("depth");
    assert_eq!(depth.counts, [(MessageState::Queued, 2)]);
    let age = depth.oldest_age_ms.expect("an oldest message");
    assert!((5_000..60_000).contains(&age), "{age}");
    // No writer, not ready: the probe goes the acceptances' way.
    store.stop_writer_for_test();
    assert!(matches!(
        store.ready().await,
        Err(StoreError::Unavailable(_))
    ));
}

/// Issue 24: a WAL that grew past `journal_size_limit` under a burst is cut
/// back once a checkpoint has reset it, instead of keeping its peak size.
#[test]
fn a_grown_wal_is_cut_back_after_it_restarts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("wal-test.db");
    let conn = super::open_connection(&path, false).expect("open");
    conn.pragma_update(None, "wal_autocheckpoint", 0)
        .expect("no autocheckpoint");
    conn.execute_batch("CREATE TABLE blob (b BLOB)")
        .expect("table");
    let chunk = vec![7u8; 1024 * 1024];
    conn.execute_batch("BEGIN").expect("begin");
    for _ in 0..(super::WAL_SIZE_LIMIT / (1024 * 1024) + 8) {
        conn.execute("INSERT INTO blob VALUES (?1)", [&chunk])
            .expect("insert");
    }
    conn.execute_batch("COMMIT").expect("commit");
    let wal = dir.path().join("wal-test.db-wal");
    let grown = std::fs::metadata(&wal).expect("wal").len();
    assert!(grown > super::WAL_SIZE_LIMIT as u64, "{grown}");
    conn.query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(()))
        .expect("checkpoint");
    // The next write starts the WAL over, and truncates it to the limit.
    conn.execute("DELETE FROM blob WHERE rowid = 1", [])
        .expect("write");
    let after = std::fs::metadata(&wal).expect("wal").len();
    assert!(after <= super::WAL_SIZE_LIMIT as u64, "{after}");
}

/// Issue 24: a RESTART holds every writer off while it waits for readers.
/// The checkpointer's gives up quickly while a long read runs (a queue
/// count, an operator's listing), so acceptance is not held with it, and
/// restarts the WAL on a later round, once the read has ended.
#[test]
fn a_restart_does_not_wait_out_a_long_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("restart.db");
    let writer = super::open_connection(&path, false).expect("writer");
    writer
        .pragma_update(None, "wal_autocheckpoint", 0)
        .expect("no autocheckpoint");
    writer
        .execute_batch("CREATE TABLE t (n INTEGER); INSERT INTO t VALUES (1);")
        .expect("table");
    let reader = super::open_connection(&path, true).expect("reader");
    reader.execute_batch("BEGIN").expect("begin");
    let seen: i64 = reader
        .query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
        .expect("read");
    assert_eq!(seen, 1);
    writer
        .execute("INSERT INTO t VALUES (2)", [])
        .expect("a write after the read began");

    let checkpointer = super::checkpoint::open_checkpoint_connection(&path).expect("open");
    let started = std::time::Instant::now();
    let restarted = super::checkpoint::checkpoint_round(&checkpointer, true).expect("round");
    let held = started.elapsed();
    assert!(!restarted, "a reader is on the WAL: no restart yet");
    // The store's busy timeout is 2 s; the restart gave up long before.
    assert!(held < super::BUSY_TIMEOUT / 2, "held writers for {held:?}");
    writer
        .busy_timeout(std::time::Duration::ZERO)
        .expect("no wait");
    writer
        .execute("INSERT INTO t VALUES (3)", [])
        .expect("the write lock is free again at once");

    reader.execute_batch("COMMIT").expect("read ends");
    assert!(
        super::checkpoint::checkpoint_round(&checkpointer, true).expect("round"),
        "with the read over, the WAL restarts"
    );
    let rows: i64 = writer
        .query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
        .expect("count");
    assert_eq!(rows, 3);
}
