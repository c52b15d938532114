//! The SQLite ledger in time partitions, dropped whole once expired.
//!
//! An entry lives in the table of its expiry's span, `ledger_p<W>_<N>`:
//! entries expiring in `[N·W, (N+1)·W)` seconds, `W` a fixed step chosen
//! from the entry's retention so that about four spans are live at once.
//! Readers see the live spans through the view `ledger` (a `UNION ALL` of
//! every partition that has its key index, and the staged entries not yet
//! merged into one: `ledger_staging`); each partition's arm is searched
//! through that partition's `key_hash` index.
//!
//! Why: deleting expired entries one by one removed each from a random page
//! of the key index, as costly as an acceptance (10 million expired entries
//! purged flat out took acceptance from thousands to ~600 msgs/s, issue 24).
//! A partition whose whole span has passed holds nothing live: its key index
//! is dropped in one step (out of the view in the same transaction) and its
//! rows, stored in acceptance order, are deleted from the front in batches
//! that touch consecutive pages only, then the empty table is dropped.

use rusqlite::{OptionalExtension, Transaction, params};

use crate::store::{NewLedgerEntry, UnixMillis};

/// Span steps, seconds. The widest that is at most a third of the
/// retention: 3 h keeps 1 h spans (four live at once), a week 1 d spans,
/// a retention of seconds (tests) spans of a second.
const STEPS: &[i64] = &[1, 10, 60, 300, 900, 3_600, 21_600, 86_400];

const PREFIX: &str = "ledger_p";

/// The columns of every partition and of the view, in this order.
const COLUMNS: &str =
    "id, key_hash, workspace, key, fingerprint, reply, queue_id, created_at, expires_at";

/// A partition's name, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Partition {
    pub(super) name: String,
    /// The end of its span: every entry in it has expired from then on.
    pub(super) until: UnixMillis,
}

impl Partition {
    /// The partition of an entry written at `created_at` that expires at
    /// `expires_at`.
    pub(super) fn of(created_at: UnixMillis, expires_at: UnixMillis) -> Self {
        let retention_s = expires_at.saturating_sub(created_at).max(0) / 1000;
        let step = STEPS
            .iter()
            .copied()
            .rev()
            .find(|s| s.saturating_mul(3) <= retention_s)
            .unwrap_or(STEPS[0]);
        let span = expires_at.max(0) / 1000 / step;
        Partition {
            name: format!("{PREFIX}{step}_{span}"),
            until: (span + 1).saturating_mul(step).saturating_mul(1000),
        }
    }

    /// `None` for a name that is not a partition's.
    fn named(name: String) -> Option<Self> {
        let (step, span) = name.strip_prefix(PREFIX)?.split_once('_')?;
        let step: i64 = step.parse().ok().filter(|s| *s > 0)?;
        let span: i64 = span.parse().ok()?;
        let until = span.checked_add(1)?.checked_mul(step)?.checked_mul(1000)?;
        Some(Partition { name, until })
    }

    fn index(&self) -> String {
        format!("{}_key", self.name)
    }
}

/// Every partition, and whether it is still in the view (has its index).
fn partitions(tx: &Transaction<'_>) -> rusqlite::Result<Vec<(Partition, bool)>> {
    let mut stmt = tx.prepare_cached(
        "SELECT t.name, EXISTS (SELECT 1 FROM sqlite_schema i
                                WHERE i.type = 'index' AND i.name = t.name || '_key')
         FROM sqlite_schema t WHERE t.type = 'table' AND t.name LIKE 'ledger\\_p%' ESCAPE '\\'",
    )?;
    let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, bool>(1)?)))?;
    let mut found = Vec::new();
    for row in rows {
        let (name, indexed) = row?;
        if let Some(p) = Partition::named(name) {
            found.push((p, indexed));
        }
    }
    found.sort_by(|a, b| a.0.until.cmp(&b.0.until).then(a.0.name.cmp(&b.0.name)));
    Ok(found)
}

/// The table an entry is written to, created (and added to the view) the
/// first time a span is used.
pub(super) fn table_for(
    tx: &Transaction<'_>,
    created_at: UnixMillis,
    expires_at: UnixMillis,
) -> rusqlite::Result<String> {
    let p = Partition::of(created_at, expires_at);
    if !table_exists(tx, &p.name)? {
        tx.execute_batch(&format!(
            "{}; CREATE INDEX {index} ON {name}(key_hash);",
            create_sql(&p.name),
            name = p.name,
            index = p.index(),
        ))?;
        rebuild_view(tx)?;
    }
    Ok(p.name)
}

fn table_exists(tx: &Transaction<'_>, name: &str) -> rusqlite::Result<bool> {
    let found: Option<i64> = tx
        .prepare_cached("SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = ?1")?
        .query_row([name], |r| r.get(0))
        .optional()?;
    Ok(found.is_some())
}

/// `CREATE TABLE name` with a partition's columns (the staging table's
/// too: entries move from it as they are).
pub(super) fn create_sql(name: &str) -> String {
    format!(
        "CREATE TABLE {name} (
            id INTEGER PRIMARY KEY,
            key_hash INTEGER NOT NULL,
            workspace TEXT NOT NULL,
            key TEXT NOT NULL,
            fingerprint BLOB NOT NULL,
            reply BLOB NOT NULL,
            queue_id TEXT,
            created_at INTEGER NOT NULL,
            expires_at INTEGER NOT NULL
         )"
    )
}

/// The insert of one entry into partition `table`, parameters in the order
/// key_hash, workspace, key, fingerprint, reply, queue_id, created_at,
/// expires_at.
pub(super) fn insert_sql(table: &str) -> String {
    format!(
        "INSERT INTO {table} (key_hash, workspace, key, fingerprint, reply, queue_id,
                              created_at, expires_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
    )
}

/// Whether the view `ledger` (staged entries included) has a live entry
/// of the key at the entry's creation: the operators' check before a
/// write (the writer's is `ledger_staging::find`).
pub(super) fn held(tx: &Transaction<'_>, hash: i64, l: &NewLedgerEntry) -> rusqlite::Result<bool> {
    let held: Option<i64> = tx
        .prepare_cached(
            "SELECT 1 FROM ledger
             WHERE key_hash = ?1 AND workspace = ?2 AND key = ?3 AND expires_at > ?4",
        )?
        .query_row(params![hash, l.workspace, l.key, l.entry.created_at], |r| {
            r.get(0)
        })
        .optional()?;
    Ok(held.is_some())
}

/// Writes the entry into `table` (a partition, or the staging table).
pub(super) fn write_entry(
    tx: &Transaction<'_>,
    table: &str,
    hash: i64,
    l: &NewLedgerEntry,
) -> rusqlite::Result<()> {
    let e = &l.entry;
    tx.prepare_cached(&insert_sql(table))?.execute(params![
        hash,
        l.workspace,
        l.key,
        &e.fingerprint[..],
        super::ledger_reply::pack(&e.reply, e.queue_id.as_deref()),
        e.queue_id,
        e.created_at,
        e.expires_at
    ])?;
    Ok(())
}

/// The two views of the ledger, written only when they change:
/// `ledger_indexed`, every partition that still has its key index (what
/// the writer and the lookups search by hash, beside the staged entries'
/// map), and `ledger`, the same and the staging table (`ledger_staging`),
/// for everyone else. A schema change makes every connection prepare its
/// ledger statements again (SQLite does it on the next step), which
/// happens once per span.
pub(super) fn rebuild_view(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    let arms: Vec<String> = partitions(tx)?
        .into_iter()
        .filter(|(_, indexed)| *indexed)
        .map(|(p, _)| format!("SELECT {COLUMNS} FROM {}", p.name))
        .collect();
    let mut all = arms.clone();
    if table_exists(tx, super::ledger_staging::TABLE)? {
        all.push(super::ledger_staging::view_arm(COLUMNS));
    }
    write_view(tx, "ledger_indexed", &arms)?;
    write_view(tx, "ledger", &all)
}

/// `CREATE VIEW name` as the `UNION ALL` of `arms`, unless it is so already.
fn write_view(tx: &Transaction<'_>, name: &str, arms: &[String]) -> rusqlite::Result<()> {
    let body = if arms.is_empty() {
        // No entry yet: the right columns, no rows.
        "SELECT NULL AS id, NULL AS key_hash, NULL AS workspace, NULL AS key,
                NULL AS fingerprint, NULL AS reply, NULL AS queue_id,
                NULL AS created_at, NULL AS expires_at WHERE 0"
            .to_owned()
    } else {
        arms.join(" UNION ALL ")
    };
    let wanted = format!("CREATE VIEW {name} AS {body}");
    // Unchanged: nothing written, so a node restarting on a full disk
    // still opens (its acceptances then get the storage error, not a
    // daemon that cannot start).
    let current: Option<String> = tx
        .query_row(
            "SELECT sql FROM sqlite_schema WHERE type = 'view' AND name = ?1",
            [name],
            |r| r.get(0),
        )
        .optional()?;
    if current.as_deref() == Some(wanted.as_str()) {
        return Ok(());
    }
    tx.execute_batch(&format!("DROP VIEW IF EXISTS {name}; {wanted};"))
}

/// Removes up to `limit` entries of partitions whose span ended by `now`,
/// oldest first; 0 when none is left.
pub(super) fn purge(
    tx: &Transaction<'_>,
    now: UnixMillis,
    limit: usize,
) -> rusqlite::Result<usize> {
    let batch = limit.max(1);
    for (p, indexed) in partitions(tx)? {
        if p.until > now {
            break;
        }
        if indexed {
            // Out of the view first, then the index: nothing can look here.
            tx.execute_batch(&format!("DROP INDEX {};", p.index()))?;
            rebuild_view(tx)?;
        }
        // Rows in id order sit on consecutive pages: this batch frees
        // whole leaves without touching any other page.
        let n = tx.execute(
            &format!(
                "DELETE FROM {name} WHERE id < (SELECT MIN(id) FROM {name}) + ?1",
                name = p.name
            ),
            params![i64::try_from(batch).unwrap_or(i64::MAX)],
        )?;
        if n < batch {
            // Drained: the empty table goes too (a few pages).
            tx.execute_batch(&format!("DROP TABLE {};", p.name))?;
        }
        if n > 0 {
            return Ok(n);
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_hours_keep_hour_spans() {
        let hour = 3_600_000;
        let p = Partition::of(0, 3 * hour + 5);
        assert_eq!(p.name, "ledger_p3600_3");
        assert_eq!(p.until, 4 * hour);
        // A week: day spans; three minutes: minute spans; under three
        // seconds: second spans.
        assert_eq!(Partition::of(0, 7 * 24 * hour).name, "ledger_p86400_7");
        assert_eq!(Partition::of(0, 180_000).name, "ledger_p60_3");
        assert_eq!(Partition::of(1000, 1100).name, "ledger_p1_1");
    }

    #[test]
    fn an_unchanged_view_is_not_written_again() {
        let mut conn = rusqlite::Connection::open_in_memory().expect("db");
        let tx = conn.transaction().expect("tx");
        table_for(&tx, 0, 3 * 3_600_000).expect("partition");
        let version = |tx: &Transaction<'_>| -> i64 {
            tx.query_row("PRAGMA schema_version", [], |r| r.get(0))
                .expect("version")
        };
        let before = version(&tx);
        rebuild_view(&tx).expect("rebuild");
        assert_eq!(version(&tx), before, "nothing changed, nothing written");
        table_for(&tx, 0, 4 * 3_600_000).expect("another partition");
        assert!(version(&tx) > before);
    }

    #[test]
    fn only_partition_names_parse() {
        assert_eq!(
            Partition::named("ledger_p60_2".into()).map(|p| p.until),
            Some(180_000)
        );
        for other in [
            "ledger",
            "ledger_p",
            "ledger_p60",
            "ledger_p0_1",
            "ledger_px_1",
            "ledger_p60_x",
        ] {
            assert!(Partition::named(other.into()).is_none(), "{other}");
        }
    }
}
