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
    let conn = match open_connection(db_path, false) {
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
        let mode = if stopping || big {
            "RESTART"
        } else {
            "PASSIVE"
        };
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
                if let Err(e) = checkpoint(&conn, mode) {
                    tracing::warn!(error = %e, mode, "WAL checkpoint failed");
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

fn checkpoint(conn: &Connection, mode: &str) -> rusqlite::Result<()> {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |_| Ok(()))
}

fn wal_path(db_path: &Path) -> PathBuf {
    let mut p = db_path.as_os_str().to_owned();
    p.push("-wal");
    PathBuf::from(p)
}
