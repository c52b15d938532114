//! Schema migrations, applied in order and recorded in `schema_version`.

use rusqlite::Connection;

/// Each entry upgrades the schema by one version. Never edit a released
/// entry: append a new one.
const MIGRATIONS: &[&str] = &[
    // 1: the outbound queue (state apart from the body, so state updates
    //    don't rewrite message bytes) and the idempotency ledger.
    "CREATE TABLE queue (
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
     CREATE INDEX ledger_expiry ON ledger(expires_at);",
    // 2: every delivery attempt, one row per recipient. A recipient whose
    //    latest row is delivered, failed or expired is done; the others are
    //    still pending, so a retry never resends to a delivered recipient.
    "CREATE TABLE delivery_attempt (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        queue_id TEXT NOT NULL REFERENCES queue(id) ON DELETE CASCADE,
        recipient TEXT NOT NULL,
        at INTEGER NOT NULL,
        outcome TEXT NOT NULL,
        reply TEXT NOT NULL,
        next_hop TEXT
     );
     CREATE INDEX delivery_attempt_queue ON delivery_attempt(queue_id, id);",
    // 3: the webhook outbox, one row per event and endpoint, written in the
    //    transaction of the state change it reports; and each endpoint's
    //    health (failing since, disabled).
    //    Plain rowid, not AUTOINCREMENT (which writes sqlite_sequence on
    //    every insert): an id is reused only after the newest row was
    //    purged, and purged rows are finished, held by no sender.
    "CREATE TABLE webhook_outbox (
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
     );",
    // 4: the console's lookups: a message by its key (any workspace), a
    //    workspace's messages newest first, a message's webhook events.
    "CREATE INDEX queue_key ON queue(idempotency_key);
     CREATE INDEX queue_workspace ON queue(workspace, id);
     CREATE INDEX webhook_outbox_queue ON webhook_outbox(queue_id);",
];

pub(super) fn migrate(conn: &mut Connection) -> rusqlite::Result<u32> {
    conn.execute_batch("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")?;
    let current: u32 = conn
        .query_row("SELECT MAX(version) FROM schema_version", [], |r| {
            r.get::<_, Option<u32>>(0)
        })?
        .unwrap_or(0);
    let mut version = current;
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        version = u32::try_from(i + 1).unwrap_or(u32::MAX);
        tx.execute(
            "INSERT INTO schema_version (version) VALUES (?1)",
            [version],
        )?;
        tx.commit()?;
    }
    Ok(version)
}
