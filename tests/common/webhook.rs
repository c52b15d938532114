//! The example webhook receiver (`examples/webhook_receiver.py`, which
//! verifies with the reference `standardwebhooks` package) as a child
//! process, and readers of its SQLite file.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use base64::Engine;

/// A valid endpoint secret: `whsec_` + base64 of 32 bytes of `byte`.
pub(crate) fn secret(byte: u8) -> String {
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode([byte; 32])
    )
}

/// A `[[webhook]]` section named `name` for `url`; `extra` lines go inside.
pub(crate) fn endpoint_toml(name: &str, url: &str, secret: &str, extra: &str) -> String {
    format!("\n[[webhook]]\nname = \"{name}\"\nurl = \"{url}\"\nsecret = \"{secret}\"\n{extra}\n")
}

/// A loopback port that nothing listens on (bound, then released).
pub(crate) fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// One stored job (an event the receiver processed).
#[derive(Debug, Clone)]
pub(crate) struct Job {
    pub webhook_id: String,
    pub event_type: String,
    pub queue_id: Option<String>,
    pub payload: serde_json::Value,
}

/// A running `examples/webhook_receiver.py`; killed on drop.
pub(crate) struct Receiver {
    child: Option<Child>,
    pub addr: SocketAddr,
    pub db: PathBuf,
    lines: mpsc::Receiver<String>,
    stderr: PathBuf,
}

impl Receiver {
    /// Starts the receiver with `secret` on `db` (created if missing),
    /// port `port` (0: any), and extra flags (the test knobs); waits for
    /// its `listening on` line. Fails the test if python3 or the
    /// `standardwebhooks` package is missing.
    pub(crate) fn start(secret: &str, db: &Path, port: u16, flags: &[&str]) -> Receiver {
        let stderr = db.with_extension(format!("{port}.stderr"));
        let log = std::fs::File::create(&stderr).expect("receiver stderr");
        let mut child = Command::new("python3")
            .arg(super::repo_path("examples/webhook_receiver.py"))
            .args(["--secret", secret, "--port", &port.to_string(), "--db"])
            .arg(db)
            .args(flags)
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("python3 (and pip3 install standardwebhooks==1.1.0)");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut r = Receiver {
            child: Some(child),
            addr: "127.0.0.1:1".parse().expect("addr"),
            db: db.to_path_buf(),
            lines,
            stderr,
        };
        let line = r.wait_line("listening on ", 20);
        r.addr = line["listening on ".len()..]
            .parse()
            .expect("receiver addr");
        r
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}/hooks", self.addr)
    }

    /// The next stdout line starting with `prefix` (earlier lines are
    /// skipped); fails the test after `secs`.
    pub(crate) fn wait_line(&mut self, prefix: &str, secs: u64) -> String {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return line,
                Ok(_) => {}
                Err(_) => panic!(
                    "no {prefix:?} line from the receiver within {secs} s; its stderr:\n{}",
                    std::fs::read_to_string(&self.stderr).unwrap_or_default()
                ),
            }
        }
    }

    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn conn(&self) -> rusqlite::Connection {
        let c = rusqlite::Connection::open(&self.db).expect("open receiver db");
        c.busy_timeout(Duration::from_secs(10)).expect("busy");
        c
    }

    fn count(&self, sql: &str, params: impl rusqlite::Params) -> i64 {
        self.conn()
            .query_row(sql, params, |r| r.get(0))
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Requests received (every attempt, whatever the answer).
    pub(crate) fn receipts(&self) -> i64 {
        self.count("SELECT COUNT(*) FROM receipt", [])
    }

    /// Requests received carrying this webhook-id.
    pub(crate) fn receipts_for(&self, id: &str) -> i64 {
        self.count("SELECT COUNT(*) FROM receipt WHERE webhook_id = ?1", [id])
    }

    /// Requests answered with `status`.
    pub(crate) fn receipts_with(&self, status: u16) -> i64 {
        self.count("SELECT COUNT(*) FROM receipt WHERE status = ?1", [status])
    }

    /// Jobs stored, oldest first.
    pub(crate) fn jobs(&self) -> Vec<Job> {
        let c = self.conn();
        let mut stmt = c
            .prepare("SELECT webhook_id, event_type, queue_id, payload FROM job ORDER BY id")
            .expect("prepare");
        stmt.query_map([], |r| {
            let payload: String = r.get(3)?;
            Ok(Job {
                webhook_id: r.get(0)?,
                event_type: r.get(1)?,
                queue_id: r.get(2)?,
                payload: serde_json::from_str(&payload).expect("payload JSON"),
            })
        })
        .expect("query")
        .map(|r| r.expect("row"))
        .collect()
    }

    /// The receiver's state of (queue id, recipient): the newest event type.
    pub(crate) fn state(&self, queue_id: &str, recipient: &str) -> Option<String> {
        self.conn()
            .query_row(
                "SELECT state FROM message_state WHERE queue_id = ?1 AND recipient = ?2",
                [queue_id, recipient],
                |r| r.get(0),
            )
            .ok()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.kill();
    }
}
