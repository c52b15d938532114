//! `smtp-once webhooks list | redeliver | enable`: the operators' view of
//! the outbox, usable while the daemon runs (SQLite: a connection of its
//! own; PostgreSQL: a client of its own).

use std::path::PathBuf;

use clap::Subcommand;

use crate::config::{Config, StoreBackend, parse_duration};
use crate::store::now_millis;
use crate::store::outbox::{EventStatus, OutboxAdmin};
use crate::time::{parse_rfc3339_utc, rfc3339_millis};

#[derive(Subcommand, Debug)]
pub enum WebhooksCommand {
    /// Recent events per endpoint with their delivery status, newest first,
    /// and the endpoints that are disabled.
    List {
        #[arg(long, short)]
        config: PathBuf,
        /// Only this endpoint (its `name`, default: its URL without the
        /// query).
        #[arg(long)]
        endpoint: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Send events again, with their original `webhook-id`: one event
    /// (`--id`) or every event of an endpoint since a time (`--since`).
    Redeliver {
        #[arg(long, short)]
        config: PathBuf,
        #[arg(long)]
        endpoint: Option<String>,
        /// The event's webhook-id.
        #[arg(long, conflicts_with = "since", required_unless_present = "since")]
        id: Option<String>,
        /// A time (2026-12-01T10:00:00Z) or how long ago (2h); needs --endpoint.
        #[arg(long, requires = "endpoint")]
        since: Option<String>,
    },
    /// Turn a disabled endpoint back on; its waiting events are sent.
    Enable {
        #[arg(long, short)]
        config: PathBuf,
        #[arg(long)]
        endpoint: String,
    },
}

pub(super) fn run(command: WebhooksCommand) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start runtime: {e}"))?;
    runtime.block_on(run_async(command))
}

fn config_path(c: &WebhooksCommand) -> &PathBuf {
    match c {
        WebhooksCommand::List { config, .. }
        | WebhooksCommand::Redeliver { config, .. }
        | WebhooksCommand::Enable { config, .. } => config,
    }
}

async fn open_admin(config: &Config) -> Result<Box<dyn OutboxAdmin>, String> {
    match &config.store {
        StoreBackend::Sqlite => Ok(Box::new(
            crate::store::sqlite::OutboxDb::open(&config.data_dir).map_err(|e| e.to_string())?,
        )),
        StoreBackend::Postgres(pg) => Ok(Box::new(
            crate::store::postgres::PgOutboxAdmin::connect(&pg.url, pg.ca_file.as_deref())
                .await
                .map_err(|e| e.to_string())?,
        )),
    }
}

/// The endpoint must be one the config names: a typo would otherwise match
/// nothing and say so only as "0 events".
fn known_endpoint(config: &Config, name: &str) -> Result<(), String> {
    if config.webhooks.iter().any(|w| w.name == name) {
        return Ok(());
    }
    let names: Vec<_> = config.webhooks.iter().map(|w| w.name.as_str()).collect();
    Err(format!(
        "no [[webhook]] named {name:?} in the config (names: {})",
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        }
    ))
}

fn since_millis(text: &str, now: i64) -> Result<i64, String> {
    if let Some(at) = parse_rfc3339_utc(text) {
        return Ok(at);
    }
    let ago = parse_duration(text).map_err(|_| {
        format!(
            "--since {text:?} is neither a time like 2026-12-01T10:00:00Z nor a duration like 2h"
        )
    })?;
    Ok(now.saturating_sub(i64::try_from(ago.as_millis()).unwrap_or(i64::MAX)))
}

async fn run_async(command: WebhooksCommand) -> Result<(), String> {
    let config = Config::load(config_path(&command)).map_err(|e| e.to_string())?;
    let admin = open_admin(&config).await?;
    let err = |e: crate::store::StoreError| e.to_string();
    match command {
        WebhooksCommand::List {
            endpoint, limit, ..
        } => {
            if let Some(name) = &endpoint {
                known_endpoint(&config, name)?;
            }
            for d in admin.disabled().await.map_err(err)? {
                println!(
                    "endpoint {:?} DISABLED since {}: {}",
                    shown(&d.endpoint),
                    rfc3339_millis(d.at),
                    d.reason
                );
            }
            let events = admin
                .recent(endpoint.as_deref(), limit)
                .await
                .map_err(err)?;
            if events.is_empty() {
                println!("no events");
            }
            for e in &events {
                println!("{}", line(e));
            }
        }
        WebhooksCommand::Redeliver {
            endpoint,
            id,
            since,
            ..
        } => {
            if let Some(name) = &endpoint {
                known_endpoint(&config, name)?;
            }
            let now = now_millis();
            let n = match (id, since, endpoint.as_deref()) {
                (Some(id), _, endpoint) => admin.redeliver_one(endpoint, &id, now).await,
                (None, Some(since), Some(endpoint)) => {
                    let since = since_millis(&since, now)?;
                    admin.redeliver_since(endpoint, since, now).await
                }
                _ => return Err("give --id, or --since with --endpoint".into()),
            }
            .map_err(err)?;
            if n == 0 {
                return Err("no event matched (an event being sent right now is skipped)".into());
            }
            println!("{n} event delivery(s) due now, with their original webhook-id");
        }
        WebhooksCommand::Enable { endpoint, .. } => {
            known_endpoint(&config, &endpoint)?;
            if admin.enable(&endpoint).await.map_err(err)? {
                println!("endpoint {endpoint:?} enabled; its waiting events are sent now");
            } else {
                println!("endpoint {endpoint:?} was not disabled");
            }
        }
    }
    Ok(())
}

/// An endpoint's name as stored. Before names were taken from the
/// redacted URL, an unnamed endpoint's was its whole URL, token and all:
/// rows written then are shown redacted too.
fn shown(endpoint: &str) -> String {
    if endpoint.starts_with("http://") || endpoint.starts_with("https://") {
        crate::config::redacted_url(endpoint)
    } else {
        endpoint.to_owned()
    }
}

fn line(e: &EventStatus) -> String {
    let last = match (e.last_status, &e.last_error) {
        (Some(code), _) if (200..300).contains(&code) => format!("HTTP {code}"),
        (_, Some(error)) => error.clone(),
        (Some(code), None) => format!("HTTP {code}"),
        (None, None) => "-".into(),
    };
    let next = e
        .next_attempt_at
        .filter(|_| e.state == "pending")
        .map_or(String::new(), |t| format!(" next {}", rfc3339_millis(t)));
    format!(
        "{} {} {:<17} {:<9} attempts {} queue {} endpoint {:?} last {:?}{next}",
        rfc3339_millis(e.at),
        e.webhook_id,
        e.event_type,
        e.state,
        e.attempts,
        e.queue_id.as_deref().unwrap_or("-"),
        shown(&e.endpoint),
        last
    )
}
