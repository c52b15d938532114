//! The delivery side of the queue: what a claimed message means to an
//! attempt ([`Loaded`]), what an attempt writes back ([`outcome`]), and the
//! operators' own connection ([`QueueDb`], for `retry`/`hold`/`release`/
//! `delete` from the CLI while the daemon runs). The daemon's worker claims
//! and records through the store's writer (`store::DeliveryQueue`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::DeliveryError;
use super::outgoing::Outgoing;
use super::plan::{Outcome, Plan};
use crate::store::sqlite::DB_FILE;
use crate::store::{AttemptOutcome, AttemptRow, ClaimedMessage, NewEvent, NewMessage, UnixMillis};

const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

pub struct QueueDb {
    conn: Mutex<Connection>,
}

/// A claimed message with what delivery needs.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub msg: Outgoing,
    pub workspace: String,
    pub created_at: UnixMillis,
    pub attempts: u32,
    /// Recipients done in earlier attempts, with how they ended.
    pub done: HashMap<String, Outcome>,
}

impl From<ClaimedMessage> for Loaded {
    fn from(m: ClaimedMessage) -> Self {
        // Only final outcomes count as done: a deferred recipient is
        // pending again.
        let done = m
            .latest_outcomes
            .iter()
            .filter_map(|(rcpt, o)| Some((rcpt.clone(), Outcome::parse(o)?)))
            .filter(|(_, o)| o.is_final())
            .collect();
        Loaded {
            msg: Outgoing {
                id: m.id,
                reverse_path: m.reverse_path,
                recipients: m.recipients,
                idempotency_key: m.idempotency_key,
                trace: m.trace,
                body: m.body,
                // The worker sets the configured ones.
                key_headers: Default::default(),
            },
            workspace: m.workspace,
            created_at: m.created_at,
            attempts: m.attempts,
            done,
        }
    }
}

/// What an attempt writes back, in the store's terms.
pub fn outcome(
    id: &str,
    plan: &Plan,
    at: UnixMillis,
    bounce: Option<NewMessage>,
    events: Vec<NewEvent>,
) -> AttemptOutcome {
    AttemptOutcome {
        id: id.to_owned(),
        at,
        rows: plan
            .rows
            .iter()
            .map(|r| AttemptRow {
                recipient: r.recipient.clone(),
                outcome: r.outcome.as_str(),
                reply: r.reply.clone(),
                next_hop: r.next_hop.clone(),
            })
            .collect(),
        state: plan.state,
        next_attempt_at: plan.next_attempt_at,
        last_error: plan.last_error.clone(),
        bounce,
        events,
    }
}

impl Loaded {
    pub fn pending(&self) -> Vec<String> {
        self.msg
            .recipients
            .iter()
            .filter(|r| !self.done.contains_key(*r))
            .cloned()
            .collect()
    }
}

impl QueueDb {
    /// Opens the existing database (the store created and migrated it).
    pub fn open(data_dir: &Path) -> Result<Self, DeliveryError> {
        let path = data_dir.join(DB_FILE);
        if !path.exists() {
            return Err(DeliveryError::Unavailable(format!(
                "no queue database at {} (has the daemon run with this data_dir?)",
                path.display()
            )));
        }
        let conn = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        // The daemon's checkpoint thread copies the WAL back, and does so
        // only when the disk has room for it (see the store's
        // checkpoint.rs); a checkpoint inside a commit here would take
        // space freed on a full disk before any commit could use it.
        conn.pragma_update(None, "wal_autocheckpoint", 0)?;
        // FULL: a recorded delivery survives power loss, so it is never
        // repeated after a restart.
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        let has_attempts: bool = conn.query_row(
            "SELECT EXISTS(SELECT 1 FROM sqlite_master WHERE name = 'delivery_attempt')",
            [],
            |r| r.get(0),
        )?;
        if !has_attempts {
            return Err(DeliveryError::Unavailable(
                "the queue database predates delivery; start the daemon once to migrate it".into(),
            ));
        }
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }

    pub(crate) fn conn(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave a transaction open
        // (rusqlite rolls back on drop), so a poisoned lock is still usable.
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_final_outcomes_are_done() {
        let claimed = ClaimedMessage {
            id: "Q1".into(),
            workspace: "w".into(),
            reverse_path: "s@x".into(),
            recipients: vec!["a@y".into(), "b@y".into(), "c@y".into(), "d@y".into()],
            idempotency_key: None,
            trace: String::new(),
            body: Vec::new(),
            created_at: 1,
            attempts: 2,
            latest_outcomes: vec![
                ("a@y".into(), "delivered".into()),
                ("b@y".into(), "deferred".into()),
                ("c@y".into(), "failed".into()),
                ("d@y".into(), "something else".into()),
            ],
        };
        let loaded = Loaded::from(claimed);
        assert_eq!(loaded.pending(), ["b@y", "d@y"]);
        assert_eq!(loaded.attempts, 2);
    }
}
