//! PostgreSQL for the tests: the local server (127.0.0.1:5432, trust auth,
//! user `postgres`), a fresh database per test that is dropped again at the
//! end, and async helpers that read a node's queue there. Every helper opens
//! its own connection, so a test that terminates backends never breaks its
//! own reads.
#![allow(dead_code)]

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio_postgres::NoTls;

/// The server, without a database.
pub(crate) const SERVER: &str = "postgres://postgres@127.0.0.1:5432";
/// `SMTP_ONCE_TEST_STORE=postgres` runs every `Daemon::start` on a fresh
/// PostgreSQL database instead of SQLite.
pub(crate) const ENV: &str = "SMTP_ONCE_TEST_STORE";

pub(crate) fn enabled_by_env() -> bool {
    std::env::var(ENV).is_ok_and(|v| v.eq_ignore_ascii_case("postgres"))
}

/// Runs `fut` to completion on a thread of its own with its own runtime, so
/// that sync code (the harness's `queue_count`, `Drop`) can use the async
/// client from inside a test's runtime.
pub(crate) fn block_on<F>(fut: F) -> F::Output
where
    F: Future + Send,
    F::Output: Send,
{
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime")
                .block_on(fut)
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
    })
}

/// A connection, its driver spawned on the current runtime.
pub(crate) async fn try_connect(
    url: &str,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let mut config: tokio_postgres::Config = url.parse()?;
    config.connect_timeout(Duration::from_secs(5));
    let (client, connection) = config.connect(NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

pub(crate) async fn connect(url: &str) -> tokio_postgres::Client {
    try_connect(url)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {url}: {e} (is the server running?)"))
}

/// A database of its own for one test (`smtp_once_t_<pid>_<n>`), dropped
/// (with any connection left to it) when the last handle goes.
pub(crate) struct TestDb {
    pub name: String,
    pub url: String,
}

impl TestDb {
    pub(crate) fn create() -> TestDb {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "smtp_once_t_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        block_on(async {
            let admin = connect(&format!("{SERVER}/postgres")).await;
            drop_leftovers(&admin).await;
            admin
                .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .await
                .expect("drop old test database");
            admin
                .batch_execute(&format!("CREATE DATABASE {name}"))
                .await
                .expect("create test database");
        });
        let url = format!("{SERVER}/{name}");
        TestDb { name, url }
    }

    /// The `[store]` section for a daemon on this database.
    pub(crate) fn store_section(&self) -> String {
        format!(
            "[store]\nbackend = \"postgres\"\nurl = \"{}\"\npool_size = 8\n",
            self.url
        )
    }

    pub(crate) async fn client(&self) -> tokio_postgres::Client {
        connect(&self.url).await
    }

    pub(crate) async fn execute(&self, sql: &str) {
        self.client()
            .await
            .batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// The one `bigint` of a query such as `SELECT COUNT(*) FROM ...`.
    pub(crate) async fn count(&self, sql: &str) -> i64 {
        let row = self
            .client()
            .await
            .query_one(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        row.get(0)
    }

    pub(crate) async fn queue_count(&self) -> i64 {
        self.count("SELECT COUNT(*) FROM queue").await
    }

    pub(crate) async fn queue_ids_for_key(&self, key: &str) -> Vec<String> {
        self.client()
            .await
            .query(
                "SELECT id FROM queue WHERE idempotency_key = $1 ORDER BY id",
                &[&key],
            )
            .await
            .expect("queue ids")
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    /// Keys in the queue, with the number of rows each.
    pub(crate) async fn rows_per_key(&self) -> HashMap<String, i64> {
        self.client()
            .await
            .query(
                "SELECT COALESCE(idempotency_key, ''), COUNT(*) FROM queue GROUP BY 1",
                &[],
            )
            .await
            .expect("rows per key")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }

    /// key -> state (one row per key assumed; see `rows_per_key`).
    pub(crate) async fn states(&self) -> HashMap<String, String> {
        self.client()
            .await
            .query(
                "SELECT COALESCE(idempotency_key, ''), state FROM queue",
                &[],
            )
            .await
            .expect("states")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }

    /// Terminates every other connection to this database; returns how
    /// many were terminated.
    pub(crate) async fn terminate_backends(&self) -> usize {
        let sql = format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = '{}' AND pid <> pg_backend_pid()",
            self.name
        );
        self.client()
            .await
            .query(&sql, &[])
            .await
            .expect("terminate backends")
            .iter()
            .filter(|r| r.get::<_, bool>(0))
            .count()
    }
}

/// Drops the test databases of processes that are gone (a run that was
/// killed before its databases were dropped), once per process.
async fn drop_leftovers(admin: &tokio_postgres::Client) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    let mut first = false;
    ONCE.call_once(|| first = true);
    if !first {
        return;
    }
    let Ok(rows) = admin
        .query(
            "SELECT datname FROM pg_database WHERE datname LIKE 'smtp\\_once\\_t\\_%'",
            &[],
        )
        .await
    else {
        return;
    };
    for row in rows {
        let name: String = row.get(0);
        let pid = name.split('_').nth(3).and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists()) {
            let _ = admin
                .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .await;
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Best effort: a database left behind is dropped by the next run.
        block_on(async move {
            let dropped = match try_connect(&format!("{SERVER}/postgres")).await {
                Ok(admin) => admin
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            if let Err(e) = dropped {
                eprintln!("test database {name} not dropped: {e}");
            }
        });
    }
}

/// `wait_until` for async conditions: polls `f` every 50 ms until it gives
/// a value; fails the test after `secs`.
pub(crate) async fn wait_for<T, F, Fut>(what: &str, secs: u64, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
