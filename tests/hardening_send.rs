//! `smtp-once send --flush` against the real daemon when something other
//! than the message is refused: the spool keeps what the server never
//! judged.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::{BIN, Daemon, Options};
use tokio::io::AsyncWriteExt;

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// `smtp-once send` as alice with `password` (without AUTH when empty),
/// in plaintext.
async fn send(
    server: SocketAddr,
    spool: &Path,
    password: &str,
    args: &[&str],
    stdin: &[u8],
) -> Run {
    let user: &[&str] = if password.is_empty() {
        &[]
    } else {
        &["--user", "alice"]
    };
    let mut child = tokio::process::Command::new(BIN)
        .arg("send")
        .args(["--tls", "none"])
        .args(user)
        .arg("--server")
        .arg(server.to_string())
        .arg("--spool")
        .arg(spool)
        .args(args)
        .env("SMTP_ONCE_PASSWORD", password)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn smtp-once send");
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin).await.expect("write stdin");
    drop(input);
    let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("send finished within 120 s")
        .expect("wait");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn spooled(spool: &Path) -> Vec<PathBuf> {
    match std::fs::read_dir(spool) {
        Ok(dir) => dir.map(|e| e.expect("dirent").path()).collect(),
        Err(_) => Vec::new(),
    }
}

/// A cron `--flush` with a stale password gets 535 to AUTH. That refuses
/// the login, not the message: the spooled message (which may never have
/// reached the server) stays for the next flush instead of being deleted.
#[tokio::test]
async fn a_flush_refused_at_auth_keeps_the_spool() {
    let tmp = tempfile::tempdir().expect("tmp");
    let spool = tmp.path().join("spool");
    let down = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port");
    let message = b"From: alice@example.test\nTo: dest@example.net\nSubject: s\n\nbody\n";
    let r = send(
        down,
        &spool,
        "alice-pw",
        &["--deadline", "2s", "dest@example.net"],
        message,
    )
    .await;
    assert_eq!(r.code, Some(75), "{r:?}");
    assert_eq!(spooled(&spool).len(), 1, "{r:?}");

    let d = Daemon::start(Options::default());
    let r = send(d.plain, &spool, "not-the-password", &["--flush"], b"").await;
    assert_eq!(r.code, Some(77), "{r:?}");
    assert!(r.stderr.contains("535"), "{r:?}");
    assert_eq!(
        spooled(&spool).len(),
        1,
        "kept after the AUTH refusal: {r:?}"
    );
    assert_eq!(d.queue_count(), 0);

    let r = send(d.plain, &spool, "alice-pw", &["--flush"], b"").await;
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(r.stdout.starts_with("queued as "), "{r:?}");
    assert_eq!(d.queue_count(), 1);
    assert!(spooled(&spool).is_empty(), "{:?}", spooled(&spool));
}

/// The same for a flush without AUTH from an address the server no longer
/// trusts: `530` to MAIL refuses the session, not the message.
#[tokio::test]
async fn a_flush_refused_for_want_of_auth_keeps_the_spool() {
    let tmp = tempfile::tempdir().expect("tmp");
    let spool = tmp.path().join("spool");
    let down = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port");
    let message = b"From: app@example.test\nTo: dest@example.net\nSubject: s\n\nbody\n";
    let r = send(
        down,
        &spool,
        "",
        &["--deadline", "2s", "dest@example.net"],
        message,
    )
    .await;
    assert_eq!(r.code, Some(75), "{r:?}");

    let untrusted = Daemon::start(Options::default());
    let r = send(untrusted.plain, &spool, "", &["--flush"], b"").await;
    assert!(r.stderr.contains("530"), "{r:?}");
    assert_eq!(spooled(&spool).len(), 1, "kept after the 530: {r:?}");
    assert_eq!(untrusted.queue_count(), 0);

    let trusted = Daemon::start(Options {
        trusted_network: Some(("127.0.0.0/8", "local")),
        ..Options::default()
    });
    let r = send(trusted.plain, &spool, "", &["--flush"], b"").await;
    assert_eq!(r.code, Some(0), "{r:?}");
    assert_eq!(trusted.queue_count(), 1);
    assert!(spooled(&spool).is_empty(), "{:?}", spooled(&spool));
}
