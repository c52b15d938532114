//! The PostgreSQL schema: the same tables and columns as SQLite's, times
//! in Unix milliseconds from the database's clock (`smtp_once_now()`), so
//! no node's clock decides an expiry or a lease.

use tokio_postgres::Client;

use crate::store::StoreError;

/// Each entry upgrades the schema by one version. Never edit a released
/// entry: append a new one.
const MIGRATIONS: &[&str] = &[
    // 1: ledger, queue, bodies, attempts, and the clock.
    "CREATE FUNCTION smtp_once_now() RETURNS bigint
       AS $$ SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint $$
       LANGUAGE sql VOLATILE;
     CREATE TABLE queue (
        id TEXT PRIMARY KEY,
        workspace TEXT NOT NULL,
        account TEXT NOT NULL,
        reverse_path TEXT NOT NULL,
        recipients TEXT NOT NULL,
        idempotency_key TEXT,
        size BIGINT NOT NULL,
        state TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt_at BIGINT,
        last_error TEXT,
        lease_until BIGINT,
        leased_by TEXT,
        created_at BIGINT NOT NULL,
        updated_at BIGINT NOT NULL
     );
     CREATE INDEX queue_due ON queue (next_attempt_at) WHERE state IN ('queued', 'deferred');
     CREATE INDEX queue_leased ON queue (lease_until) WHERE state = 'delivering';
     CREATE INDEX queue_finished ON queue (updated_at) WHERE state IN ('delivered', 'failed', 'expired');
     CREATE TABLE message_body (
        queue_id TEXT PRIMARY KEY REFERENCES queue(id) ON DELETE CASCADE,
        trace TEXT NOT NULL,
        body BYTEA NOT NULL
     );
     CREATE TABLE ledger (
        workspace TEXT NOT NULL,
        key TEXT NOT NULL,
        fingerprint BYTEA NOT NULL,
        reply BYTEA NOT NULL,
        queue_id TEXT,
        created_at BIGINT NOT NULL,
        expires_at BIGINT NOT NULL,
        PRIMARY KEY (workspace, key)
     );
     CREATE INDEX ledger_expiry ON ledger (expires_at);
     CREATE TABLE delivery_attempt (
        id BIGSERIAL PRIMARY KEY,
        queue_id TEXT NOT NULL REFERENCES queue(id) ON DELETE CASCADE,
        recipient TEXT NOT NULL,
        at BIGINT NOT NULL,
        outcome TEXT NOT NULL,
        reply TEXT NOT NULL,
        next_hop TEXT
     );
     CREATE INDEX delivery_attempt_queue ON delivery_attempt (queue_id, id);",
    // 2: the webhook outbox, one row per event and endpoint, written in the
    //    transaction of the state change it reports (leased like the queue,
    //    `leased_by` included); and each endpoint's health.
    "CREATE TABLE webhook_outbox (
        id BIGSERIAL PRIMARY KEY,
        webhook_id TEXT NOT NULL,
        endpoint TEXT NOT NULL,
        event_type TEXT NOT NULL,
        event_at BIGINT NOT NULL,
        workspace TEXT NOT NULL,
        queue_id TEXT,
        payload TEXT NOT NULL,
        state TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt_at BIGINT,
        lease_until BIGINT,
        leased_by TEXT,
        last_status INTEGER,
        last_error TEXT,
        created_at BIGINT NOT NULL,
        updated_at BIGINT NOT NULL,
        UNIQUE (webhook_id, endpoint)
     );
     CREATE INDEX webhook_outbox_due ON webhook_outbox (state, next_attempt_at);
     CREATE INDEX webhook_outbox_endpoint ON webhook_outbox (endpoint, id);
     CREATE TABLE webhook_endpoint (
        name TEXT PRIMARY KEY,
        failing_since BIGINT,
        disabled_at BIGINT,
        disabled_reason TEXT
     );",
    // 3: cancelled messages are finished too: purged after keep_finished.
    "DROP INDEX queue_finished;
     CREATE INDEX queue_finished ON queue (updated_at)
        WHERE state IN ('delivered', 'failed', 'expired', 'cancelled');",
    // 4: the console's lookups: a message by its key (any workspace), a
    //    workspace's messages newest first, a message's webhook events.
    "CREATE INDEX queue_key ON queue (idempotency_key) WHERE idempotency_key IS NOT NULL;
     CREATE INDEX queue_workspace ON queue (workspace, id);
     CREATE INDEX webhook_outbox_queue ON webhook_outbox (queue_id) WHERE queue_id IS NOT NULL;",
    // 5: the MAIL FROM parameters a message is relayed under (REQUIRETLS),
    //    beside its body: read only with it, at delivery.
    "ALTER TABLE message_body ADD COLUMN mail_params TEXT;",
];

/// Serialises migrations across nodes (session advisory lock).
const MIGRATION_LOCK: i64 = 0x736d_7470_6f6e_6365; // "smtponce"

/// Brings the schema up to this binary's version, one node at a time.
/// Refuses a schema newer than the binary: an older node must not write
/// into tables it does not know.
pub(super) async fn migrate(client: &mut Client) -> Result<u32, StoreError> {
    let fail = |what: &str, e: tokio_postgres::Error| {
        StoreError::Unavailable(format!("cannot {what}: {}", super::describe(&e)))
    };
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(|e| fail("lock the schema for migration", e))?;
    let result = migrate_locked(client).await;
    let _ = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await;
    result
}

async fn migrate_locked(client: &mut Client) -> Result<u32, StoreError> {
    let fail = |what: &str, e: tokio_postgres::Error| {
        StoreError::Unavailable(format!("cannot {what}: {}", super::describe(&e)))
    };
    client
        .batch_execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        .await
        .map_err(|e| fail("create schema_version", e))?;
    let current: Option<i32> = client
        .query_one("SELECT MAX(version) FROM schema_version", &[])
        .await
        .map_err(|e| fail("read schema_version", e))?
        .get(0);
    let current = u32::try_from(current.unwrap_or(0)).unwrap_or(0);
    let known = u32::try_from(MIGRATIONS.len()).unwrap_or(u32::MAX);
    if current > known {
        return Err(StoreError::Unavailable(format!(
            "the database schema is version {current}, newer than this smtp-once knows ({known}): \
             upgrade smtp-once on this node"
        )));
    }
    let mut version = current;
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let tx = client
            .transaction()
            .await
            .map_err(|e| fail("begin a migration", e))?;
        tx.batch_execute(sql)
            .await
            .map_err(|e| fail(&format!("migrate to version {}", i + 1), e))?;
        version = u32::try_from(i + 1).unwrap_or(u32::MAX);
        let v = i32::try_from(version).unwrap_or(i32::MAX);
        tx.execute("INSERT INTO schema_version (version) VALUES ($1)", &[&v])
            .await
            .map_err(|e| fail("record the schema version", e))?;
        tx.commit()
            .await
            .map_err(|e| fail("commit a migration", e))?;
    }
    Ok(version)
}
