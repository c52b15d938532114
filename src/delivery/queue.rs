//! The delivery side's own connection to the queue database. The
//! acceptance path writes through its writer thread; this connection only
//! claims, records and releases, in short transactions (SQLite serializes
//! writers, and a long one here would delay acceptances). Synchronous:
//! callers run it on the blocking pool.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};

use super::DeliveryError;
use super::outgoing::Outgoing;
use super::plan::{Outcome, Plan};
use crate::store::sqlite::{DB_FILE, FileIdentity};
use crate::store::{MessageState, NewMessage, UnixMillis};

const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

pub struct QueueDb {
    conn: Mutex<Connection>,
    /// The database file this connection has open, to notice that it was
    /// deleted or replaced before claiming anything from it.
    identity: FileIdentity,
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

/// `'delivering'` rows go back to the state they were claimed from.
const UNCLAIMED_STATE: &str = "CASE WHEN attempts > 0 THEN 'deferred' ELSE 'queued' END";

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
        let identity = FileIdentity::of(&path).map_err(|e| {
            DeliveryError::Unavailable(format!("cannot open {}: {e}", path.display()))
        })?;
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
            identity,
        })
    }

    pub(crate) fn conn(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave a transaction open
        // (rusqlite rolls back on drop), so a poisoned lock is still usable.
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gives back every claimed message. Only for a single node: at startup
    /// (no other process can hold a lease on this data directory) and after
    /// the worker stopped.
    pub fn release_all(&self, now: UnixMillis) -> Result<usize, DeliveryError> {
        let conn = self.conn();
        // Held during an attempt that will never record: `release` need
        // not wait for that lease.
        conn.execute(
            "UPDATE queue SET lease_until = NULL WHERE state = 'held' AND lease_until IS NOT NULL",
            [],
        )?;
        Ok(conn.execute(
            &format!(
                "UPDATE queue SET state = {UNCLAIMED_STATE}, lease_until = NULL,
                    next_attempt_at = ?1, updated_at = ?1
                 WHERE state = 'delivering'"
            ),
            [now],
        )?)
    }

    /// Removes up to `limit` delivered, failed or expired messages (row,
    /// body and attempts) last changed at or before `before`. Their ledger
    /// entries stay until they expire, so a retry still gets its replay.
    pub fn purge_finished(&self, before: UnixMillis, limit: usize) -> Result<usize, DeliveryError> {
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let ids: Vec<String> = {
            let mut stmt = tx.prepare_cached(
                "SELECT id FROM queue WHERE state IN ('delivered', 'failed', 'expired')
                   AND updated_at <= ?1 LIMIT ?2",
            )?;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            stmt.query_map(params![before, limit], |r| r.get(0))?
                .collect::<Result<_, _>>()?
        };
        for id in &ids {
            tx.execute("DELETE FROM delivery_attempt WHERE queue_id = ?1", [id])?;
            tx.execute("DELETE FROM message_body WHERE queue_id = ?1", [id])?;
            tx.execute("DELETE FROM queue WHERE id = ?1", [id])?;
        }
        tx.commit()?;
        Ok(ids.len())
    }

    /// When the next message becomes due (a lease expiring counts, except
    /// the leases of messages still `in_flight` here, which `claim` skips).
    pub fn next_due(&self, in_flight: &[String]) -> Result<Option<UnixMillis>, DeliveryError> {
        let in_flight = in_flight.join("\n");
        Ok(self.conn().query_row(
            "SELECT MIN(t) FROM (
               SELECT MIN(next_attempt_at) AS t FROM queue WHERE state IN ('queued', 'deferred')
               UNION ALL
               SELECT MIN(lease_until) FROM queue WHERE state = 'delivering'
                 AND instr(char(10) || ?1 || char(10), char(10) || id || char(10)) = 0)",
            [in_flight],
            |r| r.get(0),
        )?)
    }

    /// Claims up to `limit` due messages until `lease_until`; returns their
    /// ids, oldest due first. Messages still `in_flight` here (an attempt
    /// whose outcome is not recorded yet, even past its lease) are never
    /// claimed again.
    pub fn claim(
        &self,
        now: UnixMillis,
        lease_until: UnixMillis,
        limit: usize,
        in_flight: &[String],
    ) -> Result<Vec<String>, DeliveryError> {
        // Claiming from a deleted database would deliver mail whose
        // outcome is lost with it.
        self.identity.check().map_err(DeliveryError::Unavailable)?;
        let conn = self.conn();
        let due: bool = conn.query_row(
            "SELECT EXISTS(SELECT 1 FROM queue
               WHERE (state IN ('queued', 'deferred') AND next_attempt_at <= ?1)
                  OR (state = 'delivering' AND lease_until <= ?1))",
            [now],
            |r| r.get(0),
        )?;
        if !due {
            // Nothing to do: don't take the write lock from acceptances.
            return Ok(Vec::new());
        }
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        // Ids are base32, so a newline-delimited list is matched exactly.
        let in_flight = in_flight.join("\n");
        let mut stmt = conn.prepare_cached(
            "UPDATE queue SET state = 'delivering', lease_until = ?2, updated_at = ?1
             WHERE id IN (SELECT id FROM queue
               WHERE ((state IN ('queued', 'deferred') AND next_attempt_at <= ?1)
                   OR (state = 'delivering' AND lease_until <= ?1))
                 AND instr(char(10) || ?4 || char(10), char(10) || id || char(10)) = 0
               ORDER BY next_attempt_at LIMIT ?3)
             RETURNING id, next_attempt_at",
        )?;
        let mut claimed = stmt
            .query_map(params![now, lease_until, limit, in_flight], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, Option<i64>>(1)?))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        claimed.sort_by_key(|(_, due)| *due);
        Ok(claimed.into_iter().map(|(id, _)| id).collect())
    }

    pub fn load(&self, id: &str) -> Result<Option<Loaded>, DeliveryError> {
        let conn = self.conn();
        let row = conn
            .query_row(
                "SELECT q.reverse_path, q.recipients, q.idempotency_key, q.workspace, q.created_at,
                        q.attempts, b.trace, b.body
                 FROM queue q JOIN message_body b ON b.queue_id = q.id WHERE q.id = ?1",
                [id],
                |r| {
                    let recipients: String = r.get(1)?;
                    Ok(Loaded {
                        msg: Outgoing {
                            id: id.to_owned(),
                            reverse_path: r.get(0)?,
                            recipients: recipients.lines().map(str::to_owned).collect(),
                            idempotency_key: r.get(2)?,
                            trace: r.get(6)?,
                            body: r.get(7)?,
                        },
                        workspace: r.get(3)?,
                        created_at: r.get(4)?,
                        attempts: r.get(5)?,
                        done: HashMap::new(),
                    })
                },
            )
            .optional()?;
        let Some(mut loaded) = row else {
            return Ok(None);
        };
        loaded.done = final_outcomes(&conn, id)?;
        Ok(Some(loaded))
    }

    /// Records an attempt: its rows, the message's new state and any bounce,
    /// in one transaction. Returns the state written, or `None` when the
    /// message was deleted meanwhile.
    pub fn record(
        &self,
        id: &str,
        plan: &Plan,
        now: UnixMillis,
        bounce: Option<&NewMessage>,
    ) -> Result<Option<MessageState>, DeliveryError> {
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let current: Option<String> = tx
            .query_row("SELECT state FROM queue WHERE id = ?1", [id], |r| r.get(0))
            .optional()?;
        let Some(current) = current else {
            return Ok(None);
        };
        {
            let mut insert = tx.prepare_cached(
                "INSERT INTO delivery_attempt (queue_id, recipient, at, outcome, reply, next_hop)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?;
            for row in &plan.rows {
                insert.execute(params![
                    id,
                    row.recipient,
                    now,
                    row.outcome.as_str(),
                    row.reply,
                    row.next_hop
                ])?;
            }
        }
        // An operator's hold during the attempt sticks unless it finished
        // the message.
        let state =
            if plan.state == MessageState::Deferred && current == MessageState::Held.as_str() {
                MessageState::Held
            } else {
                plan.state
            };
        // An attempt that only delivered keeps an earlier failure visible,
        // unless the whole message is now delivered.
        tx.execute(
            "UPDATE queue SET state = ?2, attempts = attempts + 1, next_attempt_at = ?3,
                last_error = CASE WHEN ?4 IS NOT NULL THEN ?4
                                  WHEN ?2 = 'delivered' THEN NULL ELSE last_error END,
                lease_until = NULL, updated_at = ?5
             WHERE id = ?1",
            params![
                id,
                state.as_str(),
                plan.next_attempt_at,
                plan.last_error,
                now
            ],
        )?;
        if let Some(m) = bounce {
            crate::store::sqlite::insert_message(&tx, m)?;
        }
        tx.commit()?;
        Ok(Some(state))
    }
}

/// Latest outcome per recipient, for those that are done.
fn final_outcomes(conn: &Connection, id: &str) -> Result<HashMap<String, Outcome>, DeliveryError> {
    let mut stmt = conn.prepare_cached(
        "SELECT recipient, outcome FROM delivery_attempt WHERE queue_id = ?1 ORDER BY id",
    )?;
    let mut latest = HashMap::new();
    let rows = stmt.query_map([id], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
    })?;
    for row in rows {
        let (rcpt, outcome) = row?;
        if let Some(outcome) = Outcome::parse(&outcome) {
            latest.insert(rcpt, outcome);
        }
    }
    latest.retain(|_, o: &mut Outcome| o.is_final());
    Ok(latest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::RcptResult;
    use crate::delivery::Status;
    use crate::delivery::plan::{Policy, plan};
    use crate::store::sqlite::SqliteStore;

    fn setup() -> (tempfile::TempDir, QueueDb) {
        let dir = tempfile::tempdir().expect("tmp");
        SqliteStore::open(dir.path()).expect("store").close();
        let db = QueueDb::open(dir.path()).expect("queue db");
        db.conn()
            .execute_batch(
                "INSERT INTO queue (id, workspace, account, reverse_path, recipients, size, state,
                                    attempts, next_attempt_at, created_at, updated_at)
                 VALUES ('Q1', 'w', 'a', 's@x', 'r1@y\nr2@y', 1, 'queued', 0, 100, 100, 100);
                 INSERT INTO message_body (queue_id, trace, body) VALUES ('Q1', 'T', x'42');",
            )
            .expect("insert");
        (dir, db)
    }

    #[test]
    fn finished_messages_are_purged_after_keep_finished() {
        let (_dir, db) = setup();
        db.conn()
            .execute_batch(
                "INSERT INTO queue (id, workspace, account, reverse_path, recipients, size, state,
                                    attempts, next_attempt_at, created_at, updated_at)
                 VALUES ('D1', 'w', 'a', 's@x', 'r@y', 1, 'delivered', 1, NULL, 100, 200),
                        ('F1', 'w', 'a', 's@x', 'r@y', 1, 'failed', 1, NULL, 100, 300),
                        ('D2', 'w', 'a', 's@x', 'r@y', 1, 'delivered', 1, NULL, 100, 900),
                        ('H1', 'w', 'a', 's@x', 'r@y', 1, 'held', 0, NULL, 100, 100);
                 INSERT INTO message_body (queue_id, trace, body)
                   VALUES ('D1', 'T', x'42'), ('F1', 'T', x'42'), ('D2', 'T', x'42'), ('H1', 'T', x'42');
                 INSERT INTO delivery_attempt (queue_id, recipient, at, outcome, reply)
                   VALUES ('D1', 'r@y', 200, 'delivered', '250 ok');",
            )
            .expect("insert");
        assert_eq!(db.purge_finished(500, 1).expect("purge"), 1);
        assert_eq!(db.purge_finished(500, 10).expect("purge"), 1);
        assert_eq!(db.purge_finished(500, 10).expect("purge"), 0);
        let conn = db.conn();
        let left: Vec<String> = conn
            .prepare("SELECT id FROM queue ORDER BY id")
            .expect("prepare")
            .query_map([], |r| r.get(0))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows");
        assert_eq!(left, ["D2", "H1", "Q1"], "recent, unfinished and held stay");
        let orphans: i64 = conn
            .query_row(
                "SELECT (SELECT COUNT(*) FROM message_body WHERE queue_id NOT IN (SELECT id FROM queue))
                      + (SELECT COUNT(*) FROM delivery_attempt WHERE queue_id NOT IN (SELECT id FROM queue))",
                [],
                |r| r.get(0),
            )
            .expect("count");
        assert_eq!(orphans, 0, "bodies and attempts go with their rows");
    }

    #[test]
    fn a_lease_keeps_others_away_until_it_expires() {
        let (_dir, db) = setup();
        assert!(
            db.claim(99, 1000, 10, &[]).expect("claim").is_empty(),
            "not due yet"
        );
        assert_eq!(db.claim(100, 1000, 10, &[]).expect("claim"), ["Q1"]);
        assert!(
            db.claim(999, 2000, 10, &[]).expect("claim").is_empty(),
            "leased"
        );
        assert_eq!(db.next_due(&[]).expect("due"), Some(1000));
        assert_eq!(
            db.claim(1000, 3000, 10, &[]).expect("claim"),
            ["Q1"],
            "lease expired"
        );
        assert!(
            db.claim(3000, 4000, 10, &["Q1".to_owned()])
                .expect("claim")
                .is_empty(),
            "lease expired but its attempt is still in flight here"
        );
        assert_eq!(
            db.claim(3000, 4000, 10, &["Q0".to_owned()]).expect("claim"),
            ["Q1"]
        );
        assert_eq!(db.release_all(1500).expect("release"), 1);
        let (state, next): (String, i64) = db
            .conn()
            .query_row("SELECT state, next_attempt_at FROM queue", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .expect("row");
        assert_eq!((state.as_str(), next), ("queued", 1500));
    }

    /// A record waiting for disk space can outlast the lease; the worker
    /// does not claim that message again, so its expired lease must not
    /// count as due either, or the loop wakes every 10 ms until it lands.
    #[test]
    fn an_attempt_in_flight_past_its_lease_is_not_due() {
        let (_dir, db) = setup();
        assert_eq!(db.claim(100, 1000, 10, &[]).expect("claim"), ["Q1"]);
        let in_flight = ["Q1".to_owned()];
        assert!(
            db.claim(3000, 4000, 10, &in_flight)
                .expect("claim")
                .is_empty()
        );
        assert_eq!(db.next_due(&in_flight).expect("due"), None);
        assert_eq!(db.next_due(&[]).expect("due"), Some(1000));
    }

    #[test]
    fn delivered_recipients_are_never_pending_again() {
        let (_dir, db) = setup();
        db.claim(100, 1000, 10, &[]).expect("claim");
        let policy = Policy {
            retry_schedule: vec![Duration::from_secs(1)],
            max_age: Duration::from_secs(3600),
        };
        let results = vec![
            RcptResult::new("r1@y", Status::Delivered, "250 ok"),
            RcptResult::new("r2@y", Status::Deferred, "451 later"),
        ];
        let p = plan(&policy, 100, 1, &[], results, 200);
        assert_eq!(
            db.record("Q1", &p, 200, None).expect("record"),
            Some(MessageState::Deferred)
        );
        let loaded = db.load("Q1").expect("load").expect("row");
        assert_eq!(loaded.pending(), ["r2@y"]);
        assert_eq!(loaded.attempts, 1);

        // Held while the next attempt runs: a deferral keeps it held.
        db.claim(1200, 5000, 10, &[]).expect("claim");
        db.hold("Q1", 1300).expect("hold");
        let p = plan(
            &policy,
            100,
            2,
            &[Outcome::Delivered],
            vec![RcptResult::new("r2@y", Status::Deferred, "451")],
            1400,
        );
        assert_eq!(
            db.record("Q1", &p, 1400, None).expect("record"),
            Some(MessageState::Held)
        );
        db.delete("Q1", 1500).expect("delete");
        assert_eq!(
            db.record("Q1", &p, 1600, None).expect("record"),
            None,
            "deleted meanwhile"
        );
    }
}
