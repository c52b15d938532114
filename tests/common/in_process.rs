//! The pipeline and the delivery worker in the test's own process, on a
//! real SQLite file, reading "now" from a `ManualClock`: time-dependent
//! behaviour (retention, leases, the retry schedule) is driven by advancing
//! the clock instead of sleeping. SQLite only: PostgreSQL stamps leases
//! and ledger expiry with the database's clock (`smtp_once_now()`), which
//! no test clock moves.

use std::path::Path;
use std::sync::Arc;

use smtp_once::clock::{ManualClock, UnixMillis};
use smtp_once::config::Config;
use smtp_once::store::sqlite::SqliteStore;
use smtp_once::store::{Acceptance, CommitOutcome, NewMessage, Store};

/// A node's configuration in `dir`: one plaintext listener (never bound
/// here), the test network trusted into workspace `acme`, and `sections`
/// (`[idempotency]`, `[relay]`, ...) as given; without a `[relay]`, file
/// mode into `dir/outbox`.
pub(crate) fn config(dir: &Path, sections: &str) -> Config {
    let relay = if sections.contains("[relay]") {
        String::new()
    } else {
        format!(
            "[relay]\nmode = \"file\"\ndir = \"{}\"\n",
            dir.join("outbox").display()
        )
    };
    let text = format!(
        "[server]\nhostname = \"relay.test\"\ndata_dir = \"{}\"\n\n\
         [[listener]]\naddr = \"127.0.0.1:0\"\ntls = \"none\"\n\n\
         [auth]\nallow_plaintext = true\n\n\
         [[trusted_network]]\ncidr = \"127.0.0.1/32\"\nworkspace = \"acme\"\n\n\
         {sections}\n{relay}",
        dir.join("data").display()
    );
    let path = dir.join("smtp-once.toml");
    Config::from_toml(&path, &text).unwrap_or_else(|e| panic!("config: {e}\n{text}"))
}

/// The node's SQLite store, opened as the daemon opens it.
pub(crate) fn store(config: &Config) -> Arc<SqliteStore> {
    Arc::new(SqliteStore::open(&config.data_dir).expect("open store"))
}

/// A clock at the system's now, moved only by the test.
pub(crate) fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::starting_now())
}

/// Queues a message for `to` as accepted at `created_at` (due then), the
/// way an acceptance writes it.
pub(crate) async fn queue_message(store: &SqliteStore, id: &str, to: &str, created_at: UnixMillis) {
    let outcome = store
        .commit(Acceptance {
            ledger: None,
            message: Some(NewMessage {
                id: id.into(),
                workspace: "acme".into(),
                account: "bob".into(),
                reverse_path: "bob@example.test".into(),
                recipients: vec![to.into()],
                idempotency_key: None,
                trace: String::new(),
                body: crate::common::message(None, id),
                mail_params: None,
                created_at,
            }),
            events: Vec::new(),
        })
        .await
        .expect("commit");
    assert_eq!(outcome, CommitOutcome::Committed);
}

/// A queue row as the worker left it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Row {
    pub state: String,
    pub attempts: i64,
    pub next_attempt_at: Option<UnixMillis>,
}

pub(crate) fn row(config: &Config, id: &str) -> Row {
    let db = rusqlite::Connection::open(config.data_dir.join("smtp-once.db")).expect("open db");
    db.busy_timeout(std::time::Duration::from_secs(10))
        .expect("busy timeout");
    db.query_row(
        "SELECT state, attempts, next_attempt_at FROM queue WHERE id = ?1",
        [id],
        |r| {
            Ok(Row {
                state: r.get(0)?,
                attempts: r.get(1)?,
                next_attempt_at: r.get(2)?,
            })
        },
    )
    .expect("queue row")
}
