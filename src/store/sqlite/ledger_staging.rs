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
//! expired, it moves them all into their partitions in `key_hash` order, a
//! slice before each batch (`merge_step`), so a leaf is written once per
//! merge however many of its keys arrived.
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
/// falls on, once: at 2M entries (some 11,000 leaves) 131,072 keys cost a
/// twelfth of a page write each, where one at a time cost a page and
/// more. The map of that many keys is a few MiB (the daemon's RSS at 2M
/// entries: 32-35 MiB, against 22-24 without it).
const MERGE_AT: usize = 131_072;
/// Keys moved per step of a merge: one step waits before a batch (tens of
/// milliseconds at 2M entries).
const SLICE: i64 = 8_192;
/// A quiet node merges too, so the operators' scans of the staging table
/// stay short and an entry that expired leaves with its partition.
const MERGE_AFTER: Duration = Duration::from_secs(60);

/// Schema migration 8: the staging table, with the partitions' columns.
pub(super) fn create(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(&ledger_partition::create_sql(TABLE))
}

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
    find(conn, staged, ledger_key::hash(key), workspace, key, now)
}

/// `lookup` by a key's hash: the lookups' read and the writer's check.
fn find(
    conn: &Connection,
    staged: &Mutex<StagedKeys>,
    hash: i64,
    workspace: &str,
    key: &str,
    now: UnixMillis,
) -> rusqlite::Result<Option<LedgerEntry>> {
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
    // Only this thread changes the map, and `find` holds its lock only to
    // read it, not across the statements, so lookups never wait on those.
    if find(tx, staged, hash, &l.workspace, &l.key, e.created_at)?.is_some() {
        return Ok(false);
    }
    ledger_partition::write_entry(tx, TABLE, hash, l)?;
    lock(staged).pending.push((
        (hash, tx.last_insert_rowid()),
        Life {
            created_at: e.created_at,
            expires_at: e.expires_at,
        },
    ));
    Ok(true)
}

/// A merge under way: the entries staged up to id `last`, copied sorted
/// by key into a temporary table (the first step), moved from there into
/// their partitions `SLICE` at a time, one step before each batch, and
/// deleted from the staging table together at the end. Slices bound the
/// time a batch waits however large the partitions' indexes grow, and
/// together they write each index leaf once, as one transaction would:
/// consecutive slices cover consecutive key ranges.
#[derive(Debug)]
pub(super) struct Merge {
    last: i64,
    /// Rows in the sorted copy, once it is made.
    sorted: Option<i64>,
    /// The copy's rows moved so far (its rowids run from 1).
    moved: i64,
    /// Steps taken and the time they held the writer, for the log.
    steps: u32,
    busy: Duration,
}

/// What a merge step did.
pub(super) enum Step {
    /// A step done; more to go.
    Moved,
    /// Every entry is in its partition and gone from staging.
    Done(Merged),
}

/// A merge that ended: entries moved, in how many steps, and how long
/// they held the writer altogether.
#[derive(Debug)]
pub(super) struct Merged {
    pub(super) entries: i64,
    pub(super) steps: u32,
    pub(super) busy: Duration,
}

/// A merge of every entry staged so far, if there is any.
pub(super) fn start_merge(staged: &Mutex<StagedKeys>) -> Option<Merge> {
    let last = lock(staged).committed.keys().map(|&(_, id)| id).max()?;
    Some(Merge {
        last,
        sorted: None,
        moved: 0,
        steps: 0,
        busy: Duration::ZERO,
    })
}

/// The next step of `merge`, in one transaction: the sorted copy, a
/// slice, or the end (the staged rows deleted and the map's entries
/// dropped once that commits).
///
/// A slice copies a row unless its partition has it already (a merge cut
/// short by a crash is started again from the first entry), and the view
/// `ledger` leaves out staged rows that have their copy, so nobody counts
/// an entry twice while the merge runs. The sorted copy is a TEMP table
/// (the writer's connection keeps those in a file): gone with a crash,
/// made again by the next merge.
pub(super) fn merge_step(
    conn: &mut Connection,
    staged: &Mutex<StagedKeys>,
    merge: &mut Merge,
) -> rusqlite::Result<Step> {
    let started = std::time::Instant::now();
    merge.steps += 1;
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let step = match merge.sorted {
        None => {
            tx.execute_batch("DROP TABLE IF EXISTS temp.ledger_merge")?;
            tx.execute(
                "CREATE TEMP TABLE ledger_merge AS
                 SELECT key_hash, workspace, key, fingerprint, reply, queue_id,
                        created_at, expires_at
                 FROM ledger_staging WHERE id <= ?1 ORDER BY key_hash, id",
                [merge.last],
            )?;
            let rows = tx.query_row("SELECT COUNT(*) FROM temp.ledger_merge", [], |r| r.get(0))?;
            tx.commit()?;
            merge.sorted = Some(rows);
            Step::Moved
        }
        Some(rows) if merge.moved < rows => {
            let to = move_slice(&tx, merge.moved)?;
            tx.commit()?;
            merge.moved = to;
            Step::Moved
        }
        Some(rows) => {
            tx.execute("DELETE FROM ledger_staging WHERE id <= ?1", [merge.last])?;
            tx.execute_batch("DROP TABLE temp.ledger_merge")?;
            tx.commit()?;
            forget(staged, merge.last);
            Step::Done(Merged {
                entries: rows,
                steps: merge.steps,
                busy: merge.busy + started.elapsed(),
            })
        }
    };
    merge.busy += started.elapsed();
    Ok(step)
}

/// Copies the sorted copy's rows after `from` (up to `SLICE` of them) into
/// their partitions: a statement per run of rows bound for the same one.
/// The last row copied.
fn move_slice(tx: &Transaction<'_>, from: i64) -> rusqlite::Result<i64> {
    let rows: Vec<(i64, Life)> = tx
        .prepare_cached(
            "SELECT rowid, created_at, expires_at FROM temp.ledger_merge
             WHERE rowid > ?1 ORDER BY rowid LIMIT ?2",
        )?
        .query_map(params![from, SLICE], |r| {
            Ok((
                r.get(0)?,
                Life {
                    created_at: r.get(1)?,
                    expires_at: r.get(2)?,
                },
            ))
        })?
        .collect::<rusqlite::Result<_>>()?;
    let mut tables: HashMap<String, String> = HashMap::new();
    let mut run: Option<(String, i64, i64)> = None;
    for &(rowid, life) in &rows {
        let name = ledger_partition::Partition::of(life.created_at, life.expires_at).name;
        let table = match tables.get(&name) {
            Some(t) => t.clone(),
            None => {
                let t = ledger_partition::table_for(tx, life.created_at, life.expires_at)?;
                tables.insert(name, t.clone());
                t
            }
        };
        run = match run {
            Some((t, first, _)) if t == table => Some((t, first, rowid)),
            Some((t, first, end)) => {
                copy_rows(tx, &t, first, end)?;
                Some((table, rowid, rowid))
            }
            None => Some((table, rowid, rowid)),
        };
    }
    if let Some((t, first, end)) = run {
        copy_rows(tx, &t, first, end)?;
    }
    Ok(rows.last().map_or(from, |&(rowid, _)| rowid))
}

/// Copies the sorted copy's rows `first..=end` into `table`, each unless
/// `table` has it already.
fn copy_rows(tx: &Transaction<'_>, table: &str, first: i64, end: i64) -> rusqlite::Result<()> {
    tx.prepare_cached(&format!(
        "INSERT INTO {table} (key_hash, workspace, key, fingerprint, reply, queue_id,
                              created_at, expires_at)
         SELECT key_hash, workspace, key, fingerprint, reply, queue_id, created_at, expires_at
         FROM temp.ledger_merge m
         WHERE m.rowid BETWEEN ?1 AND ?2 AND NOT EXISTS (
             SELECT 1 FROM {table} t
             WHERE t.key_hash = m.key_hash AND t.workspace = m.workspace
               AND t.key = m.key AND t.created_at = m.created_at)"
    ))?
    .execute([first, end])?;
    Ok(())
}

/// The map after a merge's end: the entries staged after it began.
fn forget(staged: &Mutex<StagedKeys>, last: i64) {
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
}

/// The view `ledger`'s arm for staged entries: those not yet copied into
/// their partition (see `merge_step`).
pub(super) fn view_arm(columns: &str) -> String {
    format!(
        "SELECT {columns} FROM ledger_staging s WHERE NOT EXISTS (
             SELECT 1 FROM ledger_indexed i
             WHERE i.key_hash = s.key_hash AND i.workspace = s.workspace
               AND i.key = s.key AND i.created_at = s.created_at)"
    )
}

#[cfg(test)]
#[path = "staging_tests.rs"]
mod tests;
