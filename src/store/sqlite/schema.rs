//! Schema migrations, applied in order and recorded in `schema_version`.

use rusqlite::{Connection, Transaction, params};

/// One schema step: SQL, or code where SQL cannot compute a column.
enum Migration {
    Sql(&'static str),
    Code(fn(&Transaction<'_>) -> rusqlite::Result<()>),
}
use Migration::{Code, Sql};

/// Each entry upgrades the schema by one version. Never edit a released
/// entry: append a new one.
const MIGRATIONS: &[Migration] = &[
    // 1: the outbound queue (state apart from the body, so state updates
    //    don't rewrite message bytes) and the idempotency ledger.
    Sql("CREATE TABLE queue (
        id TEXT PRIMARY KEY,
        workspace TEXT NOT NULL,
        account TEXT NOT NULL,
        reverse_path TEXT NOT NULL,
        recipients TEXT NOT NULL,
        idempotency_key TEXT,
        size INTEGER NOT NULL,
        state TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt_at INTEGER,
        last_error TEXT,
        lease_until INTEGER,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
     );
     CREATE INDEX queue_due ON queue(state, next_attempt_at);
     CREATE TABLE message_body (
        queue_id TEXT PRIMARY KEY REFERENCES queue(id) ON DELETE CASCADE,
        trace TEXT NOT NULL,
        body BLOB NOT NULL
     );
     CREATE TABLE ledger (
        workspace TEXT NOT NULL,
        key TEXT NOT NULL,
        fingerprint BLOB NOT NULL,
        reply BLOB NOT NULL,
        queue_id TEXT,
        created_at INTEGER NOT NULL,
        expires_at INTEGER NOT NULL,
        PRIMARY KEY (workspace, key)
     ) WITHOUT ROWID;
     CREATE INDEX ledger_expiry ON ledger(expires_at);"),
    // 2: every delivery attempt, one row per recipient. A recipient whose
    //    latest row is delivered, failed or expired is done; the others are
    //    still pending, so a retry never resends to a delivered recipient.
    Sql("CREATE TABLE delivery_attempt (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        queue_id TEXT NOT NULL REFERENCES queue(id) ON DELETE CASCADE,
        recipient TEXT NOT NULL,
        at INTEGER NOT NULL,
        outcome TEXT NOT NULL,
        reply TEXT NOT NULL,
        next_hop TEXT
     );
     CREATE INDEX delivery_attempt_queue ON delivery_attempt(queue_id, id);"),
    // 3: the webhook outbox, one row per event and endpoint, written in the
    //    transaction of the state change it reports; and each endpoint's
    //    health (failing since, disabled).
    //    Plain rowid, not AUTOINCREMENT (which writes sqlite_sequence on
    //    every insert): an id is reused only after the newest row was
    //    purged, and purged rows are finished, held by no sender.
    Sql("CREATE TABLE webhook_outbox (
        id INTEGER PRIMARY KEY,
        webhook_id TEXT NOT NULL,
        endpoint TEXT NOT NULL,
        event_type TEXT NOT NULL,
        event_at INTEGER NOT NULL,
        workspace TEXT NOT NULL,
        queue_id TEXT,
        payload TEXT NOT NULL,
        state TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt_at INTEGER,
        lease_until INTEGER,
        last_status INTEGER,
        last_error TEXT,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL,
        UNIQUE (webhook_id, endpoint)
     );
     CREATE INDEX webhook_outbox_due ON webhook_outbox(state, next_attempt_at);
     CREATE INDEX webhook_outbox_endpoint ON webhook_outbox(endpoint, id);
     CREATE TABLE webhook_endpoint (
        name TEXT PRIMARY KEY,
        failing_since INTEGER,
        disabled_at INTEGER,
        disabled_reason TEXT
     );"),
    // 4: the ledger's rows in the order they are written (rowid), found
    //    through a narrow index of a 64-bit hash of (workspace, key).
    //    Keyed by (workspace, key) itself, every insert of a random key
    //    (UUID v4, as clients send them) dirtied its own leaf of a tree
    //    the size of the whole ledger, which the WAL and then the
    //    checkpoint wrote in full; rows appended in order fill pages
    //    whole, and the 16-byte index entries keep that tree an eighth of
    //    the size (issue 24). Uniqueness is the writer's: it holds the
    //    write lock while it checks and inserts.
    Code(ledger_by_key_hash),
    // 5: the console's lookups: a workspace's messages newest first, a
    //    message's webhook events. A message by its key goes through the
    //    ledger's `key_hash` index: a second index of random keys here
    //    would cost every acceptance another page write (issue 24).
    Sql("CREATE INDEX queue_workspace ON queue(workspace, id);
     CREATE INDEX webhook_outbox_queue ON webhook_outbox(queue_id);"),
    // 6: the ledger in time partitions (`ledger_partition`), read through
    //    the view `ledger`: an expired span is dropped whole instead of
    //    deleted entry by entry, each from a random page of the key index
    //    (issue 24).
    Code(ledger_in_partitions),
    // 7: the queue and the attempts keyed by what they are found by, and
    //    finished rows out of `queue_due`: 90 bytes less per delivered
    //    message (issue 24). See `compact_queue`.
    Code(compact_queue),
    // 8: new ledger entries staged in write order, merged into their
    //    partitions in key order (`ledger_staging`, issue 24).
    Code(super::ledger_staging::create),
    // 9: the MAIL FROM parameters a message is relayed under (REQUIRETLS),
    //    beside its body: read only with it, at delivery.
    Sql("ALTER TABLE message_body ADD COLUMN mail_params TEXT;"),
];

pub(super) fn migrate(conn: &mut Connection) -> rusqlite::Result<u32> {
    conn.execute_batch("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")?;
    let current: u32 = conn
        .query_row("SELECT MAX(version) FROM schema_version", [], |r| {
            r.get::<_, Option<u32>>(0)
        })?
        .unwrap_or(0);
    let mut version = current;
    // A step that rebuilds a table drops the old one, which with foreign
    // keys on would first delete its children (ON DELETE CASCADE). The
    // pragma is a no-op inside a transaction: set around the loop, and
    // each rebuild checks the keys itself before it commits.
    conn.pragma_update(None, "foreign_keys", "OFF")?;
    for (i, step) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let tx = conn.transaction()?;
        match step {
            Sql(sql) => tx.execute_batch(sql)?,
            Code(run) => run(&tx)?,
        }
        version = u32::try_from(i + 1).unwrap_or(u32::MAX);
        tx.execute(
            "INSERT INTO schema_version (version) VALUES (?1)",
            [version],
        )?;
        tx.commit()?;
    }
    conn.pragma_update(None, "foreign_keys", "ON")?;
    // The ledger's view names its partitions: built again on every open,
    // so a partition made by hand (a restore, a benchmark) is in it.
    let tx = conn.transaction()?;
    super::ledger_partition::rebuild_view(&tx)?;
    tx.commit()?;
    Ok(version)
}

/// Migration 4: the ledger rebuilt in acceptance order with `key_hash`.
fn ledger_by_key_hash(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "ALTER TABLE ledger RENAME TO ledger_by_key;
         DROP INDEX ledger_expiry;
         CREATE TABLE ledger (
            id INTEGER PRIMARY KEY,
            key_hash INTEGER NOT NULL,
            workspace TEXT NOT NULL,
            key TEXT NOT NULL,
            fingerprint BLOB NOT NULL,
            reply BLOB NOT NULL,
            queue_id TEXT,
            created_at INTEGER NOT NULL,
            expires_at INTEGER NOT NULL
         );",
    )?;
    {
        let mut read = tx.prepare(
            "SELECT workspace, key, fingerprint, reply, queue_id, created_at, expires_at
             FROM ledger_by_key ORDER BY created_at",
        )?;
        let mut write = tx.prepare(
            "INSERT INTO ledger (key_hash, workspace, key, fingerprint, reply, queue_id,
                                 created_at, expires_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )?;
        let mut rows = read.query([])?;
        while let Some(r) = rows.next()? {
            let workspace: String = r.get(0)?;
            let key: String = r.get(1)?;
            write.execute(params![
                super::ledger_key::hash(&key),
                workspace,
                key,
                r.get::<_, Vec<u8>>(2)?,
                r.get::<_, Vec<u8>>(3)?,
                r.get::<_, Option<String>>(4)?,
                r.get::<_, i64>(5)?,
                r.get::<_, i64>(6)?
            ])?;
        }
    }
    // Indexes after the copy: built once from sorted input.
    tx.execute_batch(
        "CREATE INDEX ledger_key ON ledger(key_hash);
         CREATE INDEX ledger_expiry ON ledger(expires_at);
         DROP TABLE ledger_by_key;",
    )
}

/// Migration 6: every entry copied into its partition, in acceptance order.
fn ledger_in_partitions(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch("ALTER TABLE ledger RENAME TO ledger_unpartitioned;")?;
    {
        let mut read = tx.prepare(
            "SELECT key_hash, workspace, key, fingerprint, reply, queue_id,
                    created_at, expires_at
             FROM ledger_unpartitioned ORDER BY id",
        )?;
        let mut rows = read.query([])?;
        while let Some(r) = rows.next()? {
            let created_at: i64 = r.get(6)?;
            let expires_at: i64 = r.get(7)?;
            let table = super::ledger_partition::table_for(tx, created_at, expires_at)?;
            tx.prepare_cached(&super::ledger_partition::insert_sql(&table))?
                .execute(params![
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, Vec<u8>>(3)?,
                    r.get::<_, Vec<u8>>(4)?,
                    r.get::<_, Option<String>>(5)?,
                    created_at,
                    expires_at
                ])?;
        }
    }
    // `migrate` builds the view (`ledger`) again after the last step.
    tx.execute_batch("DROP TABLE ledger_unpartitioned;")
}

/// Migration 7. The queue becomes `WITHOUT ROWID`, keyed by its id: a
/// rowid table kept a second tree of every id (28 bytes a message) beside
/// the rows. Ids sort in acceptance order, so rows are still appended.
/// Attempts are keyed by `(queue_id, id)`, which replaces their
/// `delivery_attempt_queue` index (32 bytes an attempt); `id` now counts
/// a message's attempt rows (rows copied here keep their old, larger,
/// still increasing ids). `queue_due` keeps only rows with a next attempt:
/// finished rows have none (24 bytes a message), and every query of live
/// rows names `next_attempt_at IS NOT NULL`, so SQLite may use it. It has
/// `created_at` too, so the depth gauges' oldest age reads the index
/// alone: a row found by its id in a `WITHOUT ROWID` table is a search by
/// text key, and one per live row took the count of 1,400,000 queued
/// messages to 1.4 s (every 2 s).
fn compact_queue(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE queue_compact (
            id TEXT PRIMARY KEY,
            workspace TEXT NOT NULL,
            account TEXT NOT NULL,
            reverse_path TEXT NOT NULL,
            recipients TEXT NOT NULL,
            idempotency_key TEXT,
            size INTEGER NOT NULL,
            state TEXT NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            next_attempt_at INTEGER,
            last_error TEXT,
            lease_until INTEGER,
            created_at INTEGER NOT NULL,
            updated_at INTEGER NOT NULL
         ) WITHOUT ROWID;
         INSERT INTO queue_compact (id, workspace, account, reverse_path, recipients,
                                    idempotency_key, size, state, attempts, next_attempt_at,
                                    last_error, lease_until, created_at, updated_at)
           SELECT id, workspace, account, reverse_path, recipients, idempotency_key, size,
                  state, attempts, next_attempt_at, last_error, lease_until, created_at,
                  updated_at
           FROM queue ORDER BY id;
         CREATE TABLE delivery_attempt_compact (
            queue_id TEXT NOT NULL REFERENCES queue(id) ON DELETE CASCADE,
            id INTEGER NOT NULL,
            recipient TEXT NOT NULL,
            at INTEGER NOT NULL,
            outcome TEXT NOT NULL,
            reply TEXT NOT NULL,
            next_hop TEXT,
            PRIMARY KEY (queue_id, id)
         ) WITHOUT ROWID;
         INSERT INTO delivery_attempt_compact (queue_id, id, recipient, at, outcome, reply,
                                               next_hop)
           SELECT queue_id, id, recipient, at, outcome, reply, next_hop
           FROM delivery_attempt ORDER BY queue_id, id;
         DROP TABLE delivery_attempt;
         DROP TABLE queue;
         ALTER TABLE queue_compact RENAME TO queue;
         ALTER TABLE delivery_attempt_compact RENAME TO delivery_attempt;
         CREATE INDEX queue_due ON queue(state, next_attempt_at, created_at)
           WHERE next_attempt_at IS NOT NULL;
         CREATE INDEX queue_workspace ON queue(workspace, id);",
    )?;
    let broken: i64 = tx.query_row("SELECT COUNT(*) FROM pragma_foreign_key_check", [], |r| {
        r.get(0)
    })?;
    if broken > 0 {
        return Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY),
            Some(format!(
                "migration 7: {broken} rows refer to a queue row that is not there"
            )),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::tests::strings;
    use super::*;

    fn latest() -> u32 {
        u32::try_from(MIGRATIONS.len()).expect("few")
    }

    /// Applies the first `n` migrations, as a binary of that version did.
    fn migrated_to(n: usize) -> Connection {
        let mut conn = Connection::open_in_memory().expect("db");
        conn.execute_batch("CREATE TABLE schema_version (version INTEGER NOT NULL)")
            .expect("version table");
        for (i, step) in MIGRATIONS.iter().enumerate().take(n) {
            let tx = conn.transaction().expect("tx");
            match step {
                Sql(sql) => tx.execute_batch(sql).expect("old step"),
                Code(run) => run(&tx).expect("old step"),
            }
            tx.execute(
                "INSERT INTO schema_version VALUES (?1)",
                [i64::try_from(i + 1).expect("small")],
            )
            .expect("version");
            tx.commit().expect("commit");
        }
        conn
    }

    fn plan(conn: &Connection, sql: &str) -> String {
        conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .expect("explain")
            .query_map([], |r| r.get::<_, String>(3))
            .expect("rows")
            .collect::<Result<Vec<_>, _>>()
            .expect("plan")
            .join("; ")
    }

    /// Migration 7 keeps every queue row, body and attempt (attempts in
    /// their order, the next one numbered after them), keeps deleting a
    /// queue row's children with it, and leaves finished rows out of
    /// `queue_due` while the depth count and the claim still use it.
    #[test]
    fn migration_7_keeps_the_queue_and_its_attempts() {
        let mut conn = migrated_to(6);
        conn.pragma_update(None, "foreign_keys", "ON").expect("fk");
        conn.execute_batch(
            "INSERT INTO queue (id, workspace, account, reverse_path, recipients, idempotency_key,
                                size, state, attempts, next_attempt_at, created_at, updated_at)
             VALUES ('B2', 'w', 'a', 's@x', 'r@y', 'k2', 9, 'deferred', 1, 5000, 100, 200),
                    ('A1', 'w', 'a', 's@x', 'r@y', 'k1', 9, 'delivered', 1, NULL, 50, 60),
                    ('C3', 'v', 'a', 's@x', 'r@y', NULL, 9, 'queued', 0, 300, 300, 300);
             INSERT INTO message_body VALUES ('B2', 'T', x'42'), ('C3', 'T', x'43');
             INSERT INTO delivery_attempt (queue_id, recipient, at, outcome, reply)
             VALUES ('A1', 'r@y', 60, 'delivered', '250 ok'),
                    ('B2', 'r@y', 150, 'deferred', '451 first'),
                    ('B2', 'r@y', 200, 'deferred', '451 second');",
        )
        .expect("version 6 rows");
        assert_eq!(migrate(&mut conn).expect("migrate"), latest());

        let queue: Vec<(String, String, Option<i64>)> = conn
            .prepare("SELECT id, state, next_attempt_at FROM queue ORDER BY id")
            .expect("prepare")
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows");
        assert_eq!(
            queue,
            [
                ("A1".into(), "delivered".into(), None),
                ("B2".into(), "deferred".into(), Some(5000)),
                ("C3".into(), "queued".into(), Some(300)),
            ]
        );
        let schema: String = conn
            .query_row(
                "SELECT sql FROM sqlite_schema WHERE name = 'queue'",
                [],
                |r| r.get(0),
            )
            .expect("schema");
        assert!(schema.contains("WITHOUT ROWID"), "{schema}");

        let tx = conn.transaction().expect("tx");
        super::super::delivery_queue::insert_attempt(
            &tx,
            "B2",
            "r@y",
            300,
            "delivered",
            "250 third",
            None,
        )
        .expect("attempt");
        tx.commit().expect("commit");
        let replies = strings(
            &conn,
            "SELECT reply FROM delivery_attempt WHERE queue_id = 'B2' ORDER BY id",
        );
        assert_eq!(replies, ["451 first", "451 second", "250 third"]);

        let in_due: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM queue INDEXED BY queue_due WHERE next_attempt_at IS NOT NULL",
                [],
                |r| r.get(0),
            )
            .expect("count");
        assert_eq!(in_due, 2, "the delivered row is not in queue_due");
        let count = plan(
            &conn,
            "SELECT COUNT(*) FROM queue WHERE state = 'queued' AND next_attempt_at IS NOT NULL",
        );
        assert!(count.contains("queue_due"), "{count}");
        let due = plan(
            &conn,
            "SELECT id FROM queue WHERE state = 'queued' AND next_attempt_at <= 5 \
             ORDER BY next_attempt_at LIMIT 3",
        );
        assert!(due.contains("queue_due"), "{due}");
        // The depth gauges' oldest age: the index alone, no row read by id.
        let oldest = plan(
            &conn,
            "SELECT MIN(created_at) FROM queue WHERE next_attempt_at IS NOT NULL \
             AND state IN ('queued', 'deferred', 'delivering')",
        );
        assert!(oldest.contains("COVERING INDEX queue_due"), "{oldest}");

        conn.execute("DELETE FROM queue WHERE id = 'B2'", [])
            .expect("delete");
        let children: i64 = conn
            .query_row(
                "SELECT (SELECT COUNT(*) FROM message_body WHERE queue_id = 'B2')
                      + (SELECT COUNT(*) FROM delivery_attempt WHERE queue_id = 'B2')",
                [],
                |r| r.get(0),
            )
            .expect("count");
        assert_eq!(children, 0, "a queue row's body and attempts go with it");
        let left: i64 = conn
            .query_row("SELECT COUNT(*) FROM delivery_attempt", [], |r| r.get(0))
            .expect("count");
        assert_eq!(left, 1, "other messages' attempts stay");
    }

    /// A lookup with nothing staged: the partitions' entries.
    fn lookup(
        conn: &Connection,
        workspace: &str,
        key: &str,
        now: i64,
    ) -> rusqlite::Result<Option<crate::store::LedgerEntry>> {
        let nothing_staged = std::sync::Mutex::default();
        super::super::ledger_staging::lookup(conn, &nothing_staged, workspace, key, now)
    }

    /// A database made by a binary before migration 4 keeps every ledger
    /// entry through migrations 4 (key hash) and 6 (partitions), found by
    /// its key, in acceptance order, until its partition is purged.
    #[test]
    fn migrations_4_and_6_keep_every_ledger_entry() {
        let mut conn = migrated_to(3);
        let hour = 3_600_000;
        for (key, created) in [
            ("b-key", 2_000),
            ("a-key", 1_000),
            ("c-key", 3_000),
            ("late-key", hour + 1),
        ] {
            conn.execute(
                "INSERT INTO ledger VALUES ('default', ?1, ?2, ?3, 'Q1', ?4, ?4 + 10800000)",
                params![
                    key,
                    vec![7u8; 32],
                    format!("250 {key}").into_bytes(),
                    created
                ],
            )
            .expect("old row");
        }
        assert_eq!(migrate(&mut conn).expect("migrate"), latest());
        let order = strings(&conn, "SELECT key FROM ledger_p3600_3 ORDER BY id");
        assert_eq!(order, ["a-key", "b-key", "c-key"]);
        let found = lookup(&conn, "default", "b-key", 5_000)
            .expect("lookup")
            .expect("entry");
        assert_eq!(found.reply, b"250 b-key");
        assert_eq!(found.fingerprint, [7u8; 32]);
        assert!(
            lookup(&conn, "other", "b-key", 5_000)
                .expect("lookup")
                .is_none(),
            "another workspace's key is another entry"
        );
        assert!(
            lookup(&conn, "default", "late-key", 5_000)
                .expect("lookup")
                .is_some(),
            "the next span's entry is in its own partition"
        );
        // Run again: nothing to do.
        assert_eq!(migrate(&mut conn).expect("again"), latest());
        // The first span ends at 4 h: its three entries go, the next stays.
        let tx = conn.transaction().expect("tx");
        assert_eq!(
            super::super::ledger_partition::purge(&tx, 4 * hour, 100).expect("purge"),
            3
        );
        assert_eq!(
            super::super::ledger_partition::purge(&tx, 4 * hour, 100).expect("purge"),
            0
        );
        tx.commit().expect("commit");
        let tables: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM sqlite_schema WHERE name LIKE 'ledger_p%'",
                [],
                |r| r.get(0),
            )
            .expect("count");
        assert_eq!(tables, 2, "the next span's table and its index remain");
        assert!(
            lookup(&conn, "default", "late-key", 4 * hour)
                .expect("lookup")
                .is_some()
        );
    }
}
