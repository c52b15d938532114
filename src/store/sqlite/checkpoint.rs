//! WAL checkpoints off the commit path. SQLite's automatic checkpoint runs
//! inside whichever commit crosses the threshold, adding a database-file
//! write and fsync to that batch's latency; here a separate connection
//! copies WAL frames back in the background instead.

use std::path::PathBuf;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::Connection;

use super::open_connection;

const INTERVAL: Duration = Duration::from_millis(250);
/// Past this WAL size, wait for a moment without writers so the WAL can
/// restart from its beginning instead of growing under steady load.
const WAL_RESTART_BYTES: u64 = 128 * 1024 * 1024;

pub struct Checkpointer {
    stop: mpsc::Sender<()>,
    handle: JoinHandle<()>,
}

impl Checkpointer {
    pub fn spawn(db_path: PathBuf) -> std::io::Result<Self> {
        let (stop, stopped) = mpsc::channel::<()>();
        let handle = std::thread::Builder::new()
            .name("ledger-checkpoint".into())
            .spawn(move || run(&db_path, &stopped))?;
        Ok(Self { stop, handle })
    }

    pub fn stop(self) {
        drop(self.stop);
        let _ = self.handle.join();
    }
}

fn run(db_path: &std::path::Path, stopped: &mpsc::Receiver<()>) {
    let conn = match open_connection(db_path, false) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "checkpoint connection failed; WAL will grow until restart");
            return;
        }
    };
    let wal = wal_path(db_path);
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
        if let Err(e) = checkpoint(&conn, mode) {
            tracing::warn!(error = %e, mode, "WAL checkpoint failed");
        }
        if stopping {
            return;
        }
    }
}

fn checkpoint(conn: &Connection, mode: &str) -> rusqlite::Result<()> {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |_| Ok(()))
}

fn wal_path(db_path: &std::path::Path) -> PathBuf {
    let mut p = db_path.as_os_str().to_owned();
    p.push("-wal");
    PathBuf::from(p)
}
