//! WAL checkpoints off the commit path. SQLite's automatic checkpoint runs
//! inside whichever commit crosses the threshold, adding a database-file
//! write and fsync to that batch's latency; here a separate connection
//! copies WAL frames back in the background instead.
//!
//! On a full disk a checkpoint cannot finish, but it still grows the
//! database file as far as the space goes and keeps that space. Freed space
//! then went to a checkpoint that failed again instead of to the next
//! commit, so a disk with a few MiB free again kept refusing mail (and
//! delivery records) until enough was freed for the whole WAL. So a
//! checkpoint waits until the filesystem has room for the growth it needs;
//! meanwhile commits append to the WAL with whatever space there is.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::Connection;

use super::open_connection;

const INTERVAL: Duration = Duration::from_millis(250);
/// Past this WAL size, wait for a moment without writers so the WAL can
/// restart from its beginning instead of growing under steady load.
pub(super) const WAL_RESTART_BYTES: u64 = 128 * 1024 * 1024;
/// How long a RESTART may wait for the writer's commit and then for
/// readers. SQLite holds the write lock from the first wait to the end, so
/// every acceptance waits with it: with the store's 2 s, a long read (the
/// queue count at 2,000,000 queued, 0.36 s; an operator's listing) held
/// acceptance still until it ended, up to half a second at a time under
/// load (issue 24). Failing fast, the restart is tried again next round;
/// the WAL grows a little meanwhile.
const RESTART_WAIT: Duration = Duration::from_millis(20);
/// At shutdown there is no acceptance to hold up: the last checkpoint
/// waits as long as any statement would.
const FINAL_WAIT: Duration = super::BUSY_TIMEOUT;

pub(super) struct Checkpointer {
    stop: mpsc::Sender<()>,
    handle: JoinHandle<()>,
}

impl Checkpointer {
    pub(super) fn spawn(db_path: PathBuf) -> std::io::Result<Self> {
        let (stop, stopped) = mpsc::channel::<()>();
        let handle = std::thread::Builder::new()
            .name("ledger-checkpoint".into())
            .spawn(move || run(&db_path, &stopped))?;
        Ok(Self { stop, handle })
    }

    pub(super) fn stop(self) {
        drop(self.stop);
        let _ = self.handle.join();
    }
}

fn run(db_path: &Path, stopped: &mpsc::Receiver<()>) {
    let conn = match open_checkpoint_connection(db_path) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "checkpoint connection failed; WAL will grow until restart");
            return;
        }
    };
    let wal = wal_path(db_path);
    let mut postponed = false;
    loop {
        let stopping = !matches!(
            stopped.recv_timeout(INTERVAL),
            Err(mpsc::RecvTimeoutError::Timeout)
        );
        let big = std::fs::metadata(&wal).is_ok_and(|m| m.len() > WAL_RESTART_BYTES);
        if stopping {
            let _ = conn.busy_timeout(FINAL_WAIT);
        }
        match room_for_checkpoint(&conn, db_path) {
            Room::Short { needed, free } => {
                if !postponed {
                    tracing::warn!(
                        needed, free, db = %db_path.display(),
                        "WAL checkpoint postponed until the disk has room for it"
                    );
                    postponed = true;
                }
            }
            Room::Enough => {
                if postponed {
                    tracing::info!("disk has room again; WAL checkpoints resume");
                    postponed = false;
                }
                if let Err(e) = checkpoint_round(&conn, stopping || big) {
                    tracing::warn!(error = %e, "WAL checkpoint failed");
                }
            }
        }
        if stopping {
            return;
        }
    }
}

enum Room {
    Enough,
    Short { needed: u64, free: u64 },
}

/// Whether the filesystem can take the database file's growth that
/// copying every WAL frame back needs. Unknown counts as enough: then the
/// checkpoint itself finds out.
fn room_for_checkpoint(conn: &Connection, db_path: &Path) -> Room {
    let pragma = |name: &str| {
        conn.query_row(&format!("PRAGMA {name}"), [], |r| r.get::<_, i64>(0))
            .ok()
            .and_then(|v| u64::try_from(v).ok())
    };
    let (Some(pages), Some(page_size), Ok(meta), Ok(fs)) = (
        pragma("page_count"),
        pragma("page_size"),
        std::fs::metadata(db_path),
        rustix::fs::statvfs(db_path),
    ) else {
        return Room::Enough;
    };
    let needed = pages.saturating_mul(page_size).saturating_sub(meta.len());
    let free = fs.f_bavail.saturating_mul(fs.f_frsize);
    if needed > free {
        Room::Short { needed, free }
    } else {
        Room::Enough
    }
}

/// One round: frames copied back without blocking anyone, then, when the
/// WAL should start over, a RESTART, which has little left to copy while
/// it holds writers off (for at most the connection's busy timeout, per
/// wait). `false` when a reader or the writer kept it from finishing.
pub(super) fn checkpoint_round(conn: &Connection, restart: bool) -> rusqlite::Result<bool> {
    let copied = checkpoint(conn, "PASSIVE")?;
    if restart {
        return checkpoint(conn, "RESTART");
    }
    Ok(copied)
}

/// The checkpointer's connection: waits [`RESTART_WAIT`] on locks, not the
/// store's [`super::BUSY_TIMEOUT`].
pub(super) fn open_checkpoint_connection(db_path: &Path) -> rusqlite::Result<Connection> {
    let conn = open_connection(db_path, false)?;
    conn.busy_timeout(RESTART_WAIT)?;
    Ok(conn)
}

/// `false` when the checkpoint stopped short (SQLite's busy flag).
fn checkpoint(conn: &Connection, mode: &str) -> rusqlite::Result<bool> {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
        r.get::<_, i64>(0)
    })
    .map(|busy| busy == 0)
}

fn wal_path(db_path: &Path) -> PathBuf {
    let mut p = db_path.as_os_str().to_owned();
    p.push("-wal");
    PathBuf::from(p)
}
