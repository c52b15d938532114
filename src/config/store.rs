//! `[store]` and `server.node_id`: where the ledger and queue live. SQLite
//! in `data_dir` by default (one node); PostgreSQL when several nodes share
//! the work.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::Deserialize;

use super::problems::Problems;
use super::resolve;

/// Every key is optional: the defaults are `RawStore::default()`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawStore {
    pub backend: String,
    /// libpq-style URL, `postgres://user@host:port/db?sslmode=require`.
    pub url: Option<String>,
    /// Connections per node (the writer's included).
    pub pool_size: usize,
    /// Trust roots for the database's certificate (default: the system's).
    pub ca_file: Option<PathBuf>,
}

impl Default for RawStore {
    fn default() -> Self {
        Self {
            backend: "sqlite".into(),
            url: None,
            pool_size: 8,
            ca_file: None,
        }
    }
}

/// `[store]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreBackend {
    /// `data_dir/smtp-once.db`, locked to one process.
    Sqlite,
    Postgres(PostgresSettings),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresSettings {
    pub url: String,
    pub pool_size: usize,
    pub ca_file: Option<PathBuf>,
}

pub(super) fn check(raw: &RawStore, base: &Path, p: &mut Problems) -> StoreBackend {
    match raw.backend.as_str() {
        "sqlite" => {
            if raw.url.is_some() {
                p.add("store.url", "only for backend = \"postgres\"");
            }
            StoreBackend::Sqlite
        }
        "postgres" => {
            let url = raw.url.clone().unwrap_or_default();
            if url.is_empty() {
                p.add(
                    "store.url",
                    "required with backend = \"postgres\" (postgres://user@host:5432/db)",
                );
            } else if let Err(e) = tokio_postgres::Config::from_str(&url) {
                // The URL may hold a password: say what is wrong, not it.
                p.add("store.url", format!("not a PostgreSQL URL: {e}"));
            }
            if raw.pool_size < 2 {
                p.add(
                    "store.pool_size",
                    "must be at least 2 (the writer and a reader)",
                );
            }
            p.at_most_permits("store.pool_size", raw.pool_size);
            StoreBackend::Postgres(PostgresSettings {
                url,
                pool_size: raw.pool_size,
                ca_file: raw.ca_file.as_ref().map(|f| resolve(base, f)),
            })
        }
        other => {
            p.add(
                "store.backend",
                format!("{other:?} must be \"sqlite\" or \"postgres\""),
            );
            StoreBackend::Sqlite
        }
    }
}

/// `server.node_id`, or the machine's host name: names this node in
/// delivery leases and logs, so it must differ between nodes.
pub(super) fn node_id(configured: Option<&str>, p: &mut Problems) -> String {
    match configured {
        Some(id) if id.is_empty() || id.len() > 64 || id.contains(char::is_whitespace) => {
            p.add(
                "server.node_id",
                "must be 1 to 64 characters without spaces",
            );
            String::new()
        }
        Some(id) => id.to_owned(),
        None => rustix::system::uname()
            .nodename()
            .to_string_lossy()
            .into_owned(),
    }
}
