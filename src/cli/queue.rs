//! `smtp-once status|queue|retry|hold|release|cancel|delete`: the operator
//! commands on the configured store (the SQLite file, or PostgreSQL from
//! any host), all through `store::QueueAdmin`, so both print the same. An
//! action that changes a message writes its webhook event
//! (`message.held`, ...) in the same transaction, as the API's do.

use std::path::Path;

use crate::config::{Config, StoreBackend};
use crate::delivery::status_text::format_delivery;
use crate::store::{
    AdminAction, AdminError, Change, ListFilter, MessageState, MessageStatus, QueueAdmin, Record,
    Recorder, StoreError,
};
use crate::time::rfc5322_date;
use crate::webhook::Router;

/// One operator command, as parsed.
pub(crate) enum QueueCommand<'a> {
    Status(&'a str),
    List {
        state: Option<&'a str>,
        workspace: Option<String>,
        /// Accepted longer ago than this duration.
        older_than: Option<&'a str>,
        /// Accepted within this duration.
        newer_than: Option<&'a str>,
        limit: usize,
    },
    RetryAll,
    Retry(&'a [String]),
    Hold(&'a [String]),
    Release(&'a [String]),
    Cancel(&'a [String]),
    Delete(&'a [String]),
}

pub(crate) fn run(config: &Path, command: QueueCommand<'_>) -> Result<(), String> {
    // Check the arguments before touching the store.
    let state = match &command {
        QueueCommand::List { state: Some(s), .. } => Some(MessageState::parse(s).ok_or_else(|| {
            format!("--state {s:?}: use queued, deferred, delivering, delivered, failed, expired, held or cancelled")
        })?),
        _ => None,
    };
    let mut filter = ListFilter {
        state,
        ..ListFilter::default()
    };
    if let QueueCommand::List {
        workspace,
        older_than,
        newer_than,
        limit,
        ..
    } = &command
    {
        let now = crate::store::now_millis();
        let ago = |flag: &str, value: &str| {
            crate::config::parse_duration(value)
                .map(|d| now.saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)))
                .map_err(|e| format!("{flag} {value:?}: {e}"))
        };
        filter.workspace = workspace.clone();
        filter.created_before = older_than.map(|v| ago("--older-than", v)).transpose()?;
        filter.created_from = newer_than.map(|v| ago("--newer-than", v)).transpose()?;
        filter.limit = *limit;
    }
    let config = Config::load(config).map_err(|e| e.to_string())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start runtime: {e}"))?;
    runtime.block_on(async {
        let admin = open(&config).await.map_err(|e| e.to_string())?;
        let admin = admin.as_ref();
        let webhooks = &Router::new(&config.webhooks);
        match command {
            QueueCommand::Status(id) => {
                let (m, attempts) = admin.show(id).await.map_err(|e| words(&e))?;
                print!("{}", format_status(&m));
                print!("{}", format_delivery(&m.recipients, &attempts));
                Ok(())
            }
            QueueCommand::List { .. } => list(admin, filter).await,
            QueueCommand::RetryAll => {
                let n = admin.retry_all().await.map_err(|e| e.to_string())?;
                println!("{n} message(s) due now");
                Ok(())
            }
            QueueCommand::Retry(ids) => {
                for_each(ids, |id| async move {
                    let state = act(admin, webhooks, AdminAction::Retry, id).await?;
                    Ok(format!("{id}: {}, due now", state.as_str()))
                })
                .await
            }
            QueueCommand::Hold(ids) => {
                for_each(ids, |id| async move {
                    act(admin, webhooks, AdminAction::Hold, id).await?;
                    Ok(format!("{id}: held"))
                })
                .await
            }
            QueueCommand::Release(ids) => {
                for_each(ids, |id| async move {
                    let state = act(admin, webhooks, AdminAction::Release, id).await?;
                    Ok(format!("{id}: released ({}), due now", state.as_str()))
                })
                .await
            }
            QueueCommand::Cancel(ids) => {
                for_each(ids, |id| async move {
                    act(admin, webhooks, AdminAction::Cancel, id).await?;
                    Ok(format!("{id}: cancelled"))
                })
                .await
            }
            QueueCommand::Delete(ids) => {
                for_each(ids, |id| async move {
                    act(admin, webhooks, AdminAction::Delete, id).await?;
                    Ok(format!("{id}: deleted"))
                })
                .await
            }
        }
    })
}

/// One action with the events it causes, in one transaction.
async fn act(
    admin: &dyn QueueAdmin,
    webhooks: &Router,
    action: AdminAction,
    id: &str,
) -> Result<MessageState, AdminError> {
    let webhooks = webhooks.clone();
    let recorder: Recorder = Box::new(move |outcome| Record {
        ledger: None,
        events: outcome
            .as_ref()
            .map_or_else(|_| Vec::new(), |done| webhooks.acted(done, "cli")),
    });
    let change = Change {
        recorder: Some(recorder),
        ..Change::plain(action, id)
    };
    let done = admin.apply(change).await??;
    Ok(done.state)
}

/// The configured store's admin: the SQLite file beside a running daemon,
/// or a connection of its own to PostgreSQL.
pub(crate) async fn open(config: &Config) -> Result<Box<dyn QueueAdmin>, StoreError> {
    Ok(match &config.store {
        StoreBackend::Sqlite => Box::new(crate::store::sqlite::SqliteQueueAdmin::open(
            &config.data_dir,
        )?),
        StoreBackend::Postgres(pg) => Box::new(
            crate::store::postgres::PgQueueAdmin::connect(&pg.url, pg.ca_file.as_deref()).await?,
        ),
    })
}

async fn list(admin: &dyn QueueAdmin, filter: ListFilter) -> Result<(), String> {
    let messages = admin.list(filter).await.map_err(|e| e.to_string())?;
    for m in &messages {
        let error = match (&m.last_error, m.state) {
            (Some(e), s) if s != MessageState::Delivered => {
                format!(" error={:?}", e.chars().take(100).collect::<String>())
            }
            _ => String::new(),
        };
        println!(
            "{} {:<10} attempts={} size={} from=<{}> to={}{error}",
            m.id,
            m.state.as_str(),
            m.attempts,
            m.size,
            m.reverse_path,
            m.recipients.join(",")
        );
    }
    eprintln!("{} message(s)", messages.len());
    Ok(())
}

/// Applies `f` to every id, printing each result; fails if any failed.
async fn for_each<'a, F, Fut>(ids: &'a [String], f: F) -> Result<(), String>
where
    F: Fn(&'a str) -> Fut,
    Fut: std::future::Future<Output = Result<String, AdminError>>,
{
    let mut failed = 0;
    for id in ids {
        match f(id).await {
            Ok(line) => println!("{line}"),
            Err(e) => {
                eprintln!("smtp-once: {}", words(&e));
                failed += 1;
            }
        }
    }
    match failed {
        0 => Ok(()),
        n => Err(format!("{n} of {} message(s) not changed", ids.len())),
    }
}

/// What the operator reads when the store refused.
pub(crate) fn words(e: &AdminError) -> String {
    use MessageState::{Delivering, Held};
    match e {
        AdminError::State { id, state, action } => {
            let why = match (action, state) {
                (_, MessageState::Cancelled) => "is cancelled".to_owned(),
                (AdminAction::Retry, Delivering) => "is being delivered right now".to_owned(),
                (AdminAction::Retry, Held) => "is held; release it to deliver it".to_owned(),
                (AdminAction::Release, s) => format!("is {}, not held", s.as_str()),
                (_, s) => format!("is {}: nothing left to deliver", s.as_str()),
            };
            format!("{id}: {why}")
        }
        AdminError::LiveLease { id, node, until } => {
            let by = node
                .as_deref()
                .map_or(String::new(), |n| format!(" by node {n}"));
            format!(
                "{id}: is being delivered right now{by} (lease until {}); hold it first",
                rfc5322_date(until / 1000)
            )
        }
        other => other.to_string(),
    }
}

pub(crate) fn format_status(m: &MessageStatus) -> String {
    let next = m
        .next_attempt_at
        .filter(|_| matches!(m.state, MessageState::Queued | MessageState::Deferred))
        .map_or("-".to_string(), |t| rfc5322_date(t / 1000));
    format!(
        "queue id:     {}\nstate:        {}\nworkspace:    {}\naccount:      {}\nfrom:         <{}>\nrecipients:   {}\nsize:         {} bytes\naccepted:     {}\nattempts:     {}\nnext attempt: {}\nlast error:   {}\n",
        m.id,
        m.state.as_str(),
        m.workspace,
        m.account,
        m.reverse_path,
        m.recipients.join(", "),
        m.size,
        rfc5322_date(m.created_at / 1000),
        m.attempts,
        next,
        m.last_error.as_deref().unwrap_or("-"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use MessageState::Held;

    #[test]
    fn refusals_read_as_before() {
        let state = |action, state| AdminError::State {
            id: "Q".into(),
            state,
            action,
        };
        assert_eq!(
            words(&state(AdminAction::Retry, Held)),
            "Q: is held; release it to deliver it"
        );
        assert_eq!(
            words(&state(AdminAction::Retry, MessageState::Delivering)),
            "Q: is being delivered right now"
        );
        assert_eq!(
            words(&state(AdminAction::Release, MessageState::Deferred)),
            "Q: is deferred, not held"
        );
        assert_eq!(
            words(&state(AdminAction::Hold, MessageState::Delivered)),
            "Q: is delivered: nothing left to deliver"
        );
        assert_eq!(
            words(&AdminError::NotFound("Q".into())),
            "no message with queue id Q"
        );
        let live = AdminError::LiveLease {
            id: "Q".into(),
            node: Some("n2".into()),
            until: 0,
        };
        assert!(
            words(&live).starts_with("Q: is being delivered right now by node n2 (lease until")
        );
        assert!(words(&live).ends_with("; hold it first"));
    }
}
