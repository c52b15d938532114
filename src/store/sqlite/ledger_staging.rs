//! New ledger entries, appended with no key index and merged into their
//! partitions in key order.
//!
//! Why: a UUID v4 key falls on a random leaf of its partition's `key_hash`
//! index. Inserted one at a time, every acceptance dirtied a leaf of its
//! own, which the WAL took whole and the checkpoint copied again; as the
//! index outgrew what one checkpoint round could write once, acceptance
//! slowed by a quarter on the way to 2M entries (issue 24). So the writer
//! appends new entries to `ledger_staging` (consecutive pages, nothing
//! random) and finds them through an in-memory map of their key hashes.
//! Every `MERGE_AT` entries, or once the oldest is `MERGE_AFTER` old or has
//! expired, it moves them all into their partitions in `key_hash` order,
//! so a leaf is written once per merge however many of its keys arrived.
//!
//! Who sees what:
//! - The writer holds the key: it checks the map (entries committed and
//!   those of its open transaction) and the partitions before it appends.
//! - In-process lookups read the map's candidates by id, then the
//!   partitions: an entry that a merge moved in between is found there.
//! - Everyone else (the operators' connections) reads the view `ledger`,
//!   whose staging arm is a scan of at most `MERGE_AT` rows, and writes
//!   straight into the partitions, where the writer's check finds it.
//!
//! After a restart the map is read back from the table.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, Transaction, params};

use super::{ledger_key, ledger_partition, ledger_reply};
use crate::store::{LedgerEntry, NewLedgerEntry, UnixMillis};

pub(super) const TABLE: &str = "ledger_staging";

/// Entries merged at once. A merge writes each index leaf that one of them
/// falls on, once: at 2M entries (some 11,000 leaves) 65,536 keys cost a
/// sixth of a page write each, where one at a time cost a page and more.
/// The map holds them in about 5 MiB.
const MERGE_AT: usize = 65_536;
/// A quiet node merges too, so operators' scans of the staging table
/// stay short and entries reach their partitions' expiry soon.
const MERGE_AFTER: Duration = Duration::from_secs(60);

/// The staging table's columns, as the partitions' (`ledger_partition`).
pub(super) const CREATE: &str = "CREATE TABLE ledger_staging (
        id INTEGER PRIMARY KEY,
        key_hash INTEGER NOT NULL,
        workspace TEXT NOT NULL,
        key TEXT NOT NULL,
        fingerprint BLOB NOT NULL,
        reply BLOB NOT NULL,
        queue_id TEXT,
        created_at INTEGER NOT NULL,
        expires_at INTEGER NOT NULL
     )";

/// When a staged entry was written and when it expires: which partition
/// it is merged into.
#[derive(Debug, Clone, Copy)]
struct Life {
    created_at: UnixMillis,
    expires_at: UnixMillis,
}

/// The staged entries' key hashes, shared by the writer and the lookups.
#[derive(Debug, Default)]
pub(super) struct StagedKeys {
    /// Committed entries by (key_hash, id): in merge order.
    committed: BTreeMap<(i64, i64), Life>,
    /// Appended by the writer's open transaction: published at its commit,
    /// dropped at its rollback.
    pending: Vec<((i64, i64), Life)>,
    /// The oldest `created_at` and the soonest `expires_at` committed.
    oldest: UnixMillis,
    soonest_expiry: UnixMillis,
}

pub(super) type SharedStaged = Arc<Mutex<StagedKeys>>;

/// The map, whatever a thread that panicked holding it left: every change
/// to it is a single insert, append or clear, never half done.
pub(super) fn lock(staged: &Mutex<StagedKeys>) -> MutexGuard<'_, StagedKeys> {
    staged.lock().unwrap_or_else(PoisonError::into_inner)
}

impl StagedKeys {
    /// The table's entries, after a restart.
    pub(super) fn load(conn: &Connection) -> rusqlite::Result<Self> {
        let mut staged = StagedKeys {
            oldest: UnixMillis::MAX,
            soonest_expiry: UnixMillis::MAX,
            ..StagedKeys::default()
        };
        let mut stmt =
            conn.prepare("SELECT key_hash, id, created_at, expires_at FROM ledger_staging")?;
        let rows = stmt.query_map([], |r| {
            Ok((
                (r.get(0)?, r.get(1)?),
                Life {
                    created_at: r.get(2)?,
                    expires_at: r.get(3)?,
                },
            ))
        })?;
        for row in rows {
            let (at, life) = row?;
            staged.add(at, life);
        }
        Ok(staged)
    }

    fn add(&mut self, at: (i64, i64), life: Life) {
        self.oldest = self.oldest.min(life.created_at);
        self.soonest_expiry = self.soonest_expiry.min(life.expires_at);
        self.committed.insert(at, life);
    }

    /// Ids of staged rows whose key has this hash (committed, and written by
    /// the writer's open transaction).
    fn candidates(&self, hash: i64) -> Vec<i64> {
        let committed = self
            .committed
            .range((hash, i64::MIN)..=(hash, i64::MAX))
            .map(|(&(_, id), _)| id);
        let pending = self
            .pending
            .iter()
            .filter(|((h, _), _)| *h == hash)
            .map(|&((_, id), _)| id);
        committed.chain(pending).collect()
    }

    /// The open transaction committed: its entries count from now on.
    pub(super) fn publish(&mut self) {
        for (at, life) in std::mem::take(&mut self.pending) {
            self.add(at, life);
        }
    }

    /// The open transaction rolled back: its entries were never written.
    pub(super) fn discard(&mut self) {
        self.pending.clear();
    }

    /// Whether the entries should move to their partitions now.
    pub(super) fn merge_due(&self, now: UnixMillis) -> bool {
        let age = i64::try_from(MERGE_AFTER.as_millis()).unwrap_or(i64::MAX);
        self.committed.len() >= MERGE_AT
            || (!self.committed.is_empty()
                && (self.oldest <= now.saturating_sub(age) || self.soonest_expiry <= now))
    }
}

/// The staged row `id` if it is the live entry of (workspace, key).
fn staged_entry(
    conn: &Connection,
    id: i64,
    workspace: &str,
    key: &str,
    now: UnixMillis,
) -> rusqlite::Result<Option<LedgerEntry>> {
    conn.prepare_cached(
        "SELECT fingerprint, reply, queue_id, created_at, expires_at FROM ledger_staging
         WHERE id = ?1 AND workspace = ?2 AND key = ?3 AND expires_at > ?4",
    )?
    .query_row(params![id, workspace, key, now], entry_of)
    .optional()
}

/// The live entry of (workspace, key): staged, or in its partition.
pub(super) fn lookup(
    conn: &Connection,
    staged: &Mutex<StagedKeys>,
    workspace: &str,
    key: &str,
    now: UnixMillis,
) -> rusqlite::Result<Option<LedgerEntry>> {
    let hash = ledger_key::hash(key);
    // Candidates first, the partitions after, each read a later snapshot
    // than the one before: an entry merged away from staging meanwhile is
    // in its partition by the time that is read.
    let candidates = lock(staged).candidates(hash);
    for id in candidates {
        if let Some(entry) = staged_entry(conn, id, workspace, key, now)? {
            return Ok(Some(entry));
        }
    }
    conn.prepare_cached(
        "SELECT fingerprint, reply, queue_id, created_at, expires_at FROM ledger_indexed
         WHERE key_hash = ?4 AND workspace = ?1 AND key = ?2 AND expires_at > ?3",
    )?
    .query_row(params![workspace, key, now, hash], entry_of)
    .optional()
}

fn entry_of(row: &rusqlite::Row<'_>) -> rusqlite::Result<LedgerEntry> {
    let fp: Vec<u8> = row.get(0)?;
    let mut fingerprint = [0u8; 32];
    if fp.len() == 32 {
        fingerprint.copy_from_slice(&fp);
    }
    let queue_id: Option<String> = row.get(2)?;
    Ok(LedgerEntry {
        fingerprint,
        reply: ledger_reply::unpack(row.get(1)?, queue_id.as_deref()),
        queue_id,
        created_at: row.get(3)?,
        expires_at: row.get(4)?,
    })
}

/// The writer's insert: appends the entry unless a live one holds the key
/// (`false`, nothing written). Unique because the writer holds the write
/// lock, and every other writer writes into the partitions, which are
/// checked here too.
pub(super) fn insert(
    tx: &Transaction<'_>,
    staged: &Mutex<StagedKeys>,
    l: &NewLedgerEntry,
) -> rusqlite::Result<bool> {
    let hash = ledger_key::hash(&l.key);
    let e = &l.entry;
    let mut staged = lock(staged);
    for id in staged.candidates(hash) {
        if staged_entry(tx, id, &l.workspace, &l.key, e.created_at)?.is_some() {
            return Ok(false);
        }
    }
    let held: Option<i64> = tx
        .prepare_cached(
            "SELECT 1 FROM ledger_indexed
             WHERE key_hash = ?1 AND workspace = ?2 AND key = ?3 AND expires_at > ?4",
        )?
        .query_row(params![hash, l.workspace, l.key, e.created_at], |r| {
            r.get(0)
        })
        .optional()?;
    if held.is_some() {
        return Ok(false);
    }
    tx.prepare_cached(&ledger_partition::insert_sql(TABLE))?
        .execute(params![
            hash,
            l.workspace,
            l.key,
            &e.fingerprint[..],
            ledger_reply::pack(&e.reply, e.queue_id.as_deref()),
            e.queue_id,
            e.created_at,
            e.expires_at
        ])?;
    staged.pending.push((
        (hash, tx.last_insert_rowid()),
        Life {
            created_at: e.created_at,
            expires_at: e.expires_at,
        },
    ));
    Ok(true)
}

/// Moves every staged entry into its partition, in `key_hash` order, in
/// one transaction; the map forgets them once it commits. The table is
/// read, not the map: whatever is in it is moved, never dropped unmoved.
pub(super) fn merge(conn: &mut Connection, staged: &Mutex<StagedKeys>) -> rusqlite::Result<usize> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    // Rows in id order sit on consecutive pages: one pass, sorted here.
    let mut entries: Vec<((i64, i64), Life)> = tx
        .prepare_cached("SELECT key_hash, id, created_at, expires_at FROM ledger_staging")?
        .query_map([], |r| {
            Ok((
                (r.get(0)?, r.get(1)?),
                Life {
                    created_at: r.get(2)?,
                    expires_at: r.get(3)?,
                },
            ))
        })?
        .collect::<rusqlite::Result<_>>()?;
    let Some(last) = entries.iter().map(|&((_, id), _)| id).max() else {
        return Ok(0);
    };
    entries.sort_unstable_by_key(|&(at, _)| at);
    let mut tables: HashMap<String, String> = HashMap::new();
    for &((_, id), life) in &entries {
        let name = ledger_partition::Partition::of(life.created_at, life.expires_at).name;
        let table = match tables.get(&name) {
            Some(t) => t.clone(),
            None => {
                let t = ledger_partition::table_for(&tx, life.created_at, life.expires_at)?;
                tables.insert(name, t.clone());
                t
            }
        };
        tx.prepare_cached(&move_sql(&table))?.execute([id])?;
    }
    tx.execute("DELETE FROM ledger_staging WHERE id <= ?1", [last])?;
    tx.commit()?;
    let mut staged = lock(staged);
    let rest: Vec<_> = std::mem::take(&mut staged.committed)
        .into_iter()
        .filter(|&((_, id), _)| id > last)
        .collect();
    staged.oldest = UnixMillis::MAX;
    staged.soonest_expiry = UnixMillis::MAX;
    for (at, life) in rest {
        staged.add(at, life);
    }
    Ok(entries.len())
}

/// Copies staged row `?1` into `table`.
fn move_sql(table: &str) -> String {
    format!(
        "INSERT INTO {table} (key_hash, workspace, key, fingerprint, reply, queue_id,
                              created_at, expires_at)
         SELECT key_hash, workspace, key, fingerprint, reply, queue_id, created_at, expires_at
         FROM ledger_staging WHERE id = ?1"
    )
}

#[cfg(test)]
#[path = "staging_tests.rs"]
mod tests;
