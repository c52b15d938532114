//! Staged ledger entries (`ledger_staging`) on a real file: they hold their
//! key and replay before and after their merge, across a restart, against
//! the operators' connection, and while lookups race the merge.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::super::SqliteStore;
use super::super::tests::{acceptance, settle_merges, strings};
use crate::store::{CommitOutcome, Store, now_millis};

const HOUR: i64 = 3_600_000;

fn count(store: &SqliteStore, sql: &str) -> i64 {
    let conn = rusqlite::Connection::open(store.db_path()).expect("open");
    conn.query_row(sql, [], |r| r.get(0)).expect("count")
}

/// Commits an entry written two minutes ago by the clock, which makes a
/// merge due, then runs empty batches (a merge step before each) until the
/// staging table is empty.
async fn merge_all(store: &SqliteStore) {
    let old = now_millis() - 2 * 60_000;
    store
        .commit(acceptance("old", Some("old-key"), old, 3 * HOUR))
        .await
        .expect("commit");
    settle_merges(store).await;
}

/// Entries written now stay staged (no merge is due for a minute): found
/// through the map, holding their key, read by the view `ledger`, and
/// read back from the table after a restart.
#[tokio::test]
async fn staged_entries_hold_their_keys_across_a_restart() {
    let dir = tempfile::tempdir().expect("tmp");
    let now = now_millis();
    {
        let store = SqliteStore::open(dir.path()).expect("open");
        for i in 0..20 {
            let outcome = store
                .commit(acceptance(
                    &format!("s{i:02}"),
                    Some(&format!("k{i}")),
                    now,
                    3 * HOUR,
                ))
                .await
                .expect("commit");
            assert_eq!(outcome, CommitOutcome::Committed);
        }
        assert_eq!(count(&store, "SELECT COUNT(*) FROM ledger_staging"), 20);
        assert_eq!(count(&store, "SELECT COUNT(*) FROM ledger_indexed"), 0);
        assert_eq!(count(&store, "SELECT COUNT(*) FROM ledger"), 20);
        store.close();
    }
    let store = SqliteStore::open(dir.path()).expect("reopen");
    let entry = store
        .lookup("ws", "k7", now + 1)
        .await
        .expect("lookup")
        .expect("a staged entry is found after a restart");
    assert_eq!(entry.queue_id.as_deref(), Some("s07"));
    assert!(
        store
            .lookup("other", "k7", now + 1)
            .await
            .expect("l")
            .is_none()
    );
    let again = store
        .commit(acceptance("again", Some("k7"), now + 2, 3 * HOUR))
        .await
        .expect("commit");
    assert_eq!(
        again,
        CommitOutcome::KeyTaken,
        "the staged entry holds its key"
    );
    assert_eq!(count(&store, "SELECT COUNT(*) FROM queue"), 20);
}

/// A merge moves every staged entry into its partition in key-hash order
/// (rowids ascending with the hash), empties the table, and the keys stay
/// held and found.
#[tokio::test]
async fn a_merge_moves_entries_into_their_partition_in_key_order() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = SqliteStore::open(dir.path()).expect("open");
    let now = now_millis();
    for i in 0..200 {
        store
            .commit(acceptance(
                &format!("m{i:03}"),
                Some(&format!("key-{i}")),
                now,
                3 * HOUR,
            ))
            .await
            .expect("commit");
    }
    assert_eq!(count(&store, "SELECT COUNT(*) FROM ledger_staging"), 200);
    merge_all(&store).await;
    assert_eq!(count(&store, "SELECT COUNT(*) FROM ledger_indexed"), 201);
    let conn = rusqlite::Connection::open(store.db_path()).expect("open");
    let partitions = strings(
        &conn,
        "SELECT name FROM sqlite_schema WHERE type = 'table' AND name LIKE 'ledger_p%'",
    );
    for table in partitions {
        let hashes: Vec<i64> = conn
            .prepare(&format!("SELECT key_hash FROM {table} ORDER BY id"))
            .expect("prepare")
            .query_map([], |r| r.get(0))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows");
        assert!(
            hashes.windows(2).all(|w| w[0] <= w[1]),
            "{table} written in key-hash order"
        );
    }
    for i in [0, 99, 199] {
        let key = format!("key-{i}");
        let entry = store
            .lookup("ws", &key, now + 1)
            .await
            .expect("lookup")
            .expect("merged entry found");
        assert_eq!(entry.queue_id, Some(format!("m{i:03}")));
        let again = store
            .commit(acceptance("again", Some(&key), now + 1, 3 * HOUR))
            .await
            .expect("commit");
        assert_eq!(again, CommitOutcome::KeyTaken);
    }
    assert_eq!(count(&store, "SELECT COUNT(*) FROM queue"), 201);
}

/// The operators' connection writes into the partitions and checks the
/// staged entries through the view: neither side takes the other's key.
#[tokio::test]
async fn the_operators_connection_and_the_writer_see_each_others_keys() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = SqliteStore::open(dir.path()).expect("open");
    let now = now_millis();
    store
        .commit(acceptance("w1", Some("staged-key"), now, 3 * HOUR))
        .await
        .expect("commit");
    let mut conn = rusqlite::Connection::open(store.db_path()).expect("open");
    let tx = conn.transaction().expect("tx");
    let entry = |key: &str| crate::store::NewLedgerEntry {
        workspace: "ws".into(),
        key: key.into(),
        entry: crate::store::LedgerEntry {
            fingerprint: [1; 32],
            reply: b"250 operator\r\n".to_vec(),
            queue_id: None,
            created_at: now,
            expires_at: now + 3 * HOUR,
        },
    };
    assert!(
        !super::super::writer::insert_ledger(&tx, &entry("staged-key")).expect("insert"),
        "a staged entry holds its key against the operators' write"
    );
    assert!(super::super::writer::insert_ledger(&tx, &entry("operator-key")).expect("insert"));
    tx.commit().expect("commit");
    let outcome = store
        .commit(acceptance("w2", Some("operator-key"), now + 1, 3 * HOUR))
        .await
        .expect("commit");
    assert_eq!(
        outcome,
        CommitOutcome::KeyTaken,
        "the operators' entry holds its key"
    );
    assert_eq!(count(&store, "SELECT COUNT(*) FROM queue"), 1);
}

/// Lookups of committed keys never miss while merges move them: every
/// commit here starts a merge of the ones before (they are a minute old).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_find_every_committed_key_while_merges_move_them() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = Arc::new(SqliteStore::open(dir.path()).expect("open"));
    let then = now_millis() - 2 * 60_000;
    let committed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (store, committed, done) = (store.clone(), committed.clone(), done.clone());
        tokio::spawn(async move {
            let mut looked = 0u64;
            while !done.load(Ordering::Acquire) {
                let n = committed.load(Ordering::Acquire);
                for i in n.saturating_sub(5)..n {
                    let found = store
                        .lookup("ws", &format!("race-{i}"), then + 1)
                        .await
                        .expect("lookup");
                    assert!(found.is_some(), "race-{i} committed but not found");
                    looked += 1;
                }
                tokio::task::yield_now().await;
            }
            looked
        })
    };
    for i in 0..300 {
        let outcome = store
            .commit(acceptance(
                &format!("r{i:03}"),
                Some(&format!("race-{i}")),
                then,
                3 * HOUR,
            ))
            .await
            .expect("commit");
        assert_eq!(outcome, CommitOutcome::Committed);
        committed.store(i + 1, Ordering::Release);
    }
    done.store(true, Ordering::Release);
    let looked = reader.await.expect("reader");
    assert!(looked > 0);
    assert_eq!(count(&store, "SELECT COUNT(*) FROM ledger"), 300);
    assert_eq!(count(&store, "SELECT COUNT(*) FROM queue"), 300);
}

/// A batch that fails is rolled back and its jobs retried one by one: the
/// entries the failed attempt staged are forgotten with it, so the job
/// that fails holds no key and a merge moves each row once.
#[tokio::test]
async fn a_failed_batch_stages_nothing() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = SqliteStore::open(dir.path()).expect("open");
    let now = now_millis();
    // Sent back to back, in one batch: the second reuses the first's queue
    // id, so the batch fails and each is retried alone.
    let first = store.commit(acceptance("same-id", Some("first-key"), now, 3 * HOUR));
    let second = store.commit(acceptance("same-id", Some("second-key"), now, 3 * HOUR));
    assert_eq!(first.await.expect("first"), CommitOutcome::Committed);
    assert!(second.await.is_err(), "a duplicate queue id fails its job");
    assert_eq!(count(&store, "SELECT COUNT(*) FROM ledger_staging"), 1);
    // The next entry takes the row id the failed one had: a stale id in
    // the map would name it under the failed key's hash.
    for (id, key) in [("third-id", "third-key"), ("second-id", "second-key")] {
        let outcome = store
            .commit(acceptance(id, Some(key), now + 1, 3 * HOUR))
            .await
            .expect("commit");
        assert_eq!(
            outcome,
            CommitOutcome::Committed,
            "the failed job held no key"
        );
    }
    // Merge and count each row once.
    merge_all(&store).await;
    assert_eq!(count(&store, "SELECT COUNT(*) FROM ledger"), 4);
    assert_eq!(
        count(&store, "SELECT COUNT(DISTINCT key) FROM ledger_indexed"),
        4
    );
}

/// A merge cut short by a crash leaves rows both staged and copied: the
/// view counts them once, and the next merge copies nothing twice.
#[tokio::test]
async fn a_row_already_copied_is_counted_and_merged_once() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = SqliteStore::open(dir.path()).expect("open");
    let now = now_millis();
    for (id, key) in [("c1", "copied-key"), ("c2", "staged-key")] {
        store
            .commit(acceptance(id, Some(key), now, 3 * HOUR))
            .await
            .expect("commit");
    }
    {
        // What a first slice did before the crash: one row copied.
        let mut conn = rusqlite::Connection::open(store.db_path()).expect("open");
        let tx = conn.transaction().expect("tx");
        let table =
            super::super::ledger_partition::table_for(&tx, now, now + 3 * HOUR).expect("partition");
        tx.execute(
            &format!(
                "INSERT INTO {table} (key_hash, workspace, key, fingerprint, reply, queue_id,
                                      created_at, expires_at)
                 SELECT key_hash, workspace, key, fingerprint, reply, queue_id, created_at,
                        expires_at
                 FROM ledger_staging WHERE key = 'copied-key'"
            ),
            [],
        )
        .expect("copy");
        tx.commit().expect("commit");
    }
    assert_eq!(count(&store, "SELECT COUNT(*) FROM ledger_staging"), 2);
    assert_eq!(
        count(&store, "SELECT COUNT(*) FROM ledger"),
        2,
        "each entry once"
    );
    merge_all(&store).await;
    assert_eq!(
        count(
            &store,
            "SELECT COUNT(*) FROM ledger_indexed WHERE key = 'copied-key'"
        ),
        1
    );
    assert_eq!(count(&store, "SELECT COUNT(*) FROM ledger"), 3);
    let entry = store
        .lookup("ws", "copied-key", now + 1)
        .await
        .expect("lookup")
        .expect("entry");
    assert_eq!(entry.queue_id.as_deref(), Some("c1"));
}
