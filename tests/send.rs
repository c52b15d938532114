//! `smtp-once send` against the real daemon: the client process over real
//! TCP (and TLS), and in-test proxies that lose the reply to the final dot
//! after the server committed the message.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{BIN, Daemon, Options};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

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

impl Run {
    /// The id from `queued as ID` (and whether it said replay).
    fn queued(&self) -> (String, bool) {
        let line = self
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("queued as "))
            .unwrap_or_else(|| panic!("no queue id: {self:?}"));
        match line.strip_suffix(" (replay)") {
            Some(id) => (id.to_owned(), true),
            None => (line.to_owned(), false),
        }
    }
}

/// `smtp-once send` as alice to `server` in plaintext.
fn command(server: SocketAddr, spool: &Path, args: &[&str]) -> tokio::process::Command {
    command_as(server, spool, Some(("alice", "alice-pw")), args)
}

/// `smtp-once send` to `server` in plaintext, as `login` (name, password)
/// or without AUTH.
fn command_as(
    server: SocketAddr,
    spool: &Path,
    login: Option<(&str, &str)>,
    args: &[&str],
) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(BIN);
    c.arg("send")
        .args(["--tls", "none", "--server"])
        .arg(server.to_string())
        .arg("--spool")
        .arg(spool);
    if let Some((user, password)) = login {
        c.args(["--user", user]).env("SMTP_ONCE_PASSWORD", password);
    }
    c.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    c
}

async fn run(c: tokio::process::Command, stdin: &[u8]) -> Run {
    run_within(c, stdin, Duration::from_secs(120)).await
}

async fn run_within(mut c: tokio::process::Command, stdin: &[u8], limit: Duration) -> Run {
    let mut child = c.spawn().expect("spawn smtp-once send");
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin).await.expect("write stdin");
    drop(input);
    let out = tokio::time::timeout(limit, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("send still running after {limit:?}"))
        .expect("wait");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

async fn send(server: SocketAddr, spool: &Path, args: &[&str], stdin: &[u8]) -> Run {
    run(command(server, spool, args), stdin).await
}

async fn flush(server: SocketAddr, spool: &Path) -> Run {
    send(server, spool, &["--flush"], b"").await
}

/// A loopback address where nothing listens (the port was free a moment
/// ago): the daemon is "down".
fn nothing_listening() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
}

/// Spool entries (and anything else) left in the folder.
fn spooled(spool: &Path) -> Vec<PathBuf> {
    match std::fs::read_dir(spool) {
        Ok(dir) => dir.map(|e| e.expect("dirent").path()).collect(),
        Err(_) => Vec::new(),
    }
}

/// An LF-ended message (as scripts write them) without a key.
fn lf_message(to: &str, body: &str) -> Vec<u8> {
    format!("From: Alice <alice@example.test>\nTo: {to}\nSubject: send test\n\n{body}\n")
        .into_bytes()
}

fn stored(d: &Daemon, id: &str) -> (String, String, String) {
    d.db()
        .query_row(
            "SELECT q.idempotency_key, q.recipients, CAST(b.body AS TEXT)
             FROM queue q JOIN message_body b ON b.queue_id = q.id WHERE q.id = ?1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .expect("queued message")
}

fn assert_uuid_v4(key: &str) {
    let b = key.as_bytes();
    assert_eq!(b.len(), 36, "{key:?}");
    assert_eq!(b[14], b'4', "version 4: {key:?}");
    assert!(
        matches!(b[19], b'8' | b'9' | b'a' | b'b'),
        "variant: {key:?}"
    );
}

#[tokio::test]
async fn plain_send_prints_the_queue_id_and_the_key_is_generated_once() {
    let d = Daemon::start(Options::default());
    let tmp = tempfile::tempdir().expect("tmp");
    let spool = tmp.path().join("spool");
    let r = send(
        d.plain,
        &spool,
        &["-oi", "dest@example.net"],
        &lf_message("dest@example.net", "hello\n.\nstill the body"),
    )
    .await;
    assert_eq!(r.code, Some(0), "{r:?}");
    let (id, replay) = r.queued();
    assert!(!replay, "{r:?}");
    assert_eq!(d.queue_count(), 1);
    let (key, rcpts, body) = stored(&d, &id);
    assert_uuid_v4(&key);
    assert_eq!(d.queue_ids_for_key(&key), [id]);
    assert!(
        body.starts_with(&format!("X-Bird-Idempotency-Key: {key}\r\n")),
        "{body:?}"
    );
    assert!(
        body.contains("\r\nhello\r\n.\r\nstill the body\r\n"),
        "{body:?}"
    );
    assert_eq!(rcpts, "dest@example.net");
    assert!(spooled(&spool).is_empty(), "{:?}", spooled(&spool));
}

#[tokio::test]
async fn starttls_with_ca_file_password_file_and_the_default_spool() {
    let d = Daemon::start(Options {
        allow_plaintext: false,
        ..Options::default()
    });
    let tmp = tempfile::tempdir().expect("tmp");
    let pw = tmp.path().join("pw");
    std::fs::write(&pw, "alice-pw\n").expect("password file");
    let state = tmp.path().join("state");
    let mut c = tokio::process::Command::new(BIN);
    c.arg("send")
        .args(["--user", "alice", "--password-file"])
        .arg(&pw)
        .arg("--ca-file")
        .arg(common::repo_path("certs/dev-cert.pem"))
        .arg("--server")
        .arg(d.starttls.to_string())
        .args(["--idempotency-key", "tls-order-1", "dest@example.net"])
        .env("XDG_STATE_HOME", &state)
        .env_remove("SMTP_ONCE_PASSWORD")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let r = run(c, &lf_message("dest@example.net", "over TLS")).await;
    assert_eq!(r.code, Some(0), "{r:?}");
    let (id, _) = r.queued();
    assert_eq!(d.queue_ids_for_key("tls-order-1"), [id]);
    let spool = state.join("smtp-once/spool");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&spool)
            .expect("default spool")
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o700);
    assert!(spooled(&spool).is_empty());
}

/// What the first proxied connection does once the final dot has gone
/// through and the server has answered it (so the message is committed).
enum AfterDot {
    /// Drop the client without its reply.
    Drop,
    /// Keep the reply and the connection; tell the test, which kills the
    /// client.
    Hold(oneshot::Sender<String>),
}

/// A TCP proxy to `upstream`. The first connection loses the reply to its
/// final dot as `after` says; later ones pass through.
async fn proxy(upstream: SocketAddr, after: AfterDot) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let mut after = Some(after);
        loop {
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            let Ok(server) = TcpStream::connect(upstream).await else {
                return;
            };
            match after.take() {
                Some(after) => {
                    tokio::spawn(lose_reply(client, server, after));
                }
                None => {
                    tokio::spawn(async move {
                        let (mut c, mut s) = (client, server);
                        let _ = tokio::io::copy_bidirectional(&mut c, &mut s).await;
                    });
                }
            }
        }
    });
    addr
}

async fn lose_reply(mut client: TcpStream, mut server: TcpStream, after: AfterDot) {
    let mut upward: Vec<u8> = Vec::new();
    let mut dot_sent = false;
    let mut reply: Vec<u8> = Vec::new();
    let mut cbuf = [0u8; 16 * 1024];
    let mut sbuf = [0u8; 4096];
    loop {
        tokio::select! {
            n = client.read(&mut cbuf), if !dot_sent => {
                let Ok(n @ 1..) = n else { return };
                if server.write_all(&cbuf[..n]).await.is_err() {
                    return;
                }
                upward.extend_from_slice(&cbuf[..n]);
                dot_sent = upward.windows(5).any(|w| w == b"\r\n.\r\n");
            }
            n = server.read(&mut sbuf) => {
                let Ok(n @ 1..) = n else { return };
                if !dot_sent {
                    if client.write_all(&sbuf[..n]).await.is_err() {
                        return;
                    }
                    continue;
                }
                // The reply to the final dot: committed, and kept from the client.
                reply.extend_from_slice(&sbuf[..n]);
                let text = String::from_utf8_lossy(&reply).into_owned();
                let complete = text.ends_with("\r\n")
                    && text.trim_end().lines().last().is_some_and(|l| l.as_bytes().get(3) == Some(&b' '));
                if !complete {
                    continue;
                }
                match after {
                    AfterDot::Drop => return,
                    AfterDot::Hold(tx) => {
                        let _ = tx.send(text);
                        // Until the client is gone.
                        let _ = client.read(&mut cbuf).await;
                        return;
                    }
                }
            }
        }
    }
}

#[tokio::test]
async fn a_lost_reply_is_retried_and_replayed_once() {
    let d = Daemon::start(Options::default());
    let tmp = tempfile::tempdir().expect("tmp");
    let spool = tmp.path().join("spool");
    let via = proxy(d.plain, AfterDot::Drop).await;
    let r = send(
        via,
        &spool,
        &["dest@example.net"],
        &lf_message("dest@example.net", "reply lost once"),
    )
    .await;
    assert_eq!(r.code, Some(0), "{r:?}");
    let (id, replay) = r.queued();
    assert!(replay, "the retry is answered with the replay: {r:?}");
    assert!(r.stderr.contains("attempt 1 failed"), "{r:?}");
    assert_eq!(d.queue_count(), 1, "exactly one message queued");
    let (key, _, _) = stored(&d, &id);
    assert_eq!(d.queue_ids_for_key(&key), [id]);
    assert!(spooled(&spool).is_empty(), "{:?}", spooled(&spool));
}

#[tokio::test]
async fn kill_9_before_the_reply_then_flush_queues_exactly_one() {
    let d = Daemon::start(Options::default());
    let tmp = tempfile::tempdir().expect("tmp");
    let spool = tmp.path().join("spool");
    let (tx, rx) = oneshot::channel();
    let via = proxy(d.plain, AfterDot::Hold(tx)).await;
    let mut child = command(via, &spool, &["dest@example.net"])
        .spawn()
        .expect("spawn");
    let mut input = child.stdin.take().expect("stdin");
    input
        .write_all(&lf_message("dest@example.net", "killed while waiting"))
        .await
        .expect("stdin");
    drop(input);
    let held = tokio::time::timeout(Duration::from_secs(60), rx)
        .await
        .expect("final dot within 60 s")
        .expect("proxy");
    assert!(held.starts_with("250 "), "{held:?}");
    child.kill().await.expect("kill -9");
    let status = child.wait().await.expect("wait");
    assert_eq!(status.code(), None, "killed by a signal");
    assert_eq!(d.queue_count(), 1, "the first attempt was committed");
    assert_eq!(spooled(&spool).len(), 1, "kept in the spool");

    let r = flush(d.plain, &spool).await;
    assert_eq!(r.code, Some(0), "{r:?}");
    let (id, replay) = r.queued();
    assert!(replay, "{r:?}");
    assert!(
        held.contains(&format!("queued as {id}")),
        "{held:?} vs {id}"
    );
    assert_eq!(d.queue_count(), 1, "exactly one message queued");
    assert!(spooled(&spool).is_empty(), "{:?}", spooled(&spool));
}

#[tokio::test]
async fn daemon_down_exits_75_and_keeps_the_message_for_flush() {
    let tmp = tempfile::tempdir().expect("tmp");
    let spool = tmp.path().join("spool");
    let down = nothing_listening();
    let started = Instant::now();
    let r = send(
        down,
        &spool,
        &["--deadline", "3s", "dest@example.net"],
        &lf_message("dest@example.net", "while the daemon is down"),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(r.code, Some(75), "{r:?}");
    assert!(r.stdout.is_empty(), "{r:?}");
    assert!(r.stderr.contains("--flush"), "{r:?}");
    // It retried before giving up (how often depends on the jittered waits
    // against the 3 s deadline, so count attempts, not time).
    assert!(
        r.stderr.contains("attempt 1 failed"),
        "{r:?} after {took:?}"
    );
    assert_eq!(spooled(&spool).len(), 1);

    let d = Daemon::start(Options::default());
    let r = flush(d.plain, &spool).await;
    assert_eq!(r.code, Some(0), "{r:?}");
    let (id, replay) = r.queued();
    assert!(!replay, "{r:?}");
    assert_eq!(d.queue_count(), 1);
    let (key, _, _) = stored(&d, &id);
    assert_uuid_v4(&key);
    assert!(spooled(&spool).is_empty(), "{:?}", spooled(&spool));
    // Nothing left: a second flush does nothing, quietly.
    let r = flush(d.plain, &spool).await;
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(r.stdout.is_empty() && r.stderr.is_empty(), "{r:?}");
    assert_eq!(d.queue_count(), 1);
}

#[tokio::test]
async fn dash_t_sends_to_bcc_and_removes_the_bcc_header() {
    let d = Daemon::start(Options::default());
    let tmp = tempfile::tempdir().expect("tmp");
    let spool = tmp.path().join("spool");
    let message = "From: Alice <alice@example.test>\n\
                   To: One <one@example.net>\n\
                   Cc: two@example.net\n\
                   Bcc: hidden@example.net,\n secret@example.net\n\
                   Subject: -t\n\
                   \n\
                   body\n";
    let r = send(d.plain, &spool, &["-t", "-i"], message.as_bytes()).await;
    assert_eq!(r.code, Some(0), "{r:?}");
    let (id, _) = r.queued();
    let (_, rcpts, body) = stored(&d, &id);
    let mut rcpts: Vec<&str> = rcpts.lines().collect();
    rcpts.sort_unstable();
    assert_eq!(
        rcpts,
        [
            "hidden@example.net",
            "one@example.net",
            "secret@example.net",
            "two@example.net"
        ]
    );
    // No Bcc field (not "bcc" anywhere: a generated id is hex and may hold it).
    assert!(
        !body
            .lines()
            .any(|l| l.to_ascii_lowercase().starts_with("bcc:")),
        "{body:?}"
    );
    assert!(
        !body.contains("hidden@") && !body.contains("secret@"),
        "{body:?}"
    );
    assert!(body.contains("\r\nCc: two@example.net\r\n"), "{body:?}");
}

#[tokio::test]
async fn a_refused_sender_exits_77_with_the_reply_and_empties_the_spool() {
    let d = Daemon::start(Options::default());
    let tmp = tempfile::tempdir().expect("tmp");
    let spool = tmp.path().join("spool");
    let r = send(
        d.plain,
        &spool,
        &["-f", "intruder@evil.test", "dest@example.net"],
        &lf_message("dest@example.net", "not allowed"),
    )
    .await;
    assert_eq!(r.code, Some(77), "{r:?}");
    assert!(r.stdout.is_empty(), "{r:?}");
    assert!(
        r.stderr.contains("MAIL FROM:<intruder@evil.test>") && r.stderr.contains("553 5.7.1"),
        "{r:?}"
    );
    assert!(spooled(&spool).is_empty(), "{:?}", spooled(&spool));
    assert_eq!(d.queue_count(), 0);
}

#[tokio::test]
async fn input_errors_exit_before_anything_is_spooled() {
    let tmp = tempfile::tempdir().expect("tmp");
    let spool = tmp.path().join("spool");
    let nowhere: SocketAddr = "127.0.0.1:1".parse().expect("addr");
    let bare_cr = send(
        nowhere,
        &spool,
        &["x@example.net"],
        b"Subject: a\r\n\r\nb\rc\n",
    )
    .await;
    assert_eq!(bare_cr.code, Some(65), "{bare_cr:?}");
    let empty = send(nowhere, &spool, &["x@example.net"], b"").await;
    assert_eq!(empty.code, Some(66), "{empty:?}");
    let usage = send(nowhere, &spool, &["--no-such-flag"], b"x").await;
    assert_eq!(usage.code, Some(64), "{usage:?}");
    let no_rcpt = send(nowhere, &spool, &[], &lf_message("x@example.net", "b")).await;
    assert_eq!(no_rcpt.code, Some(64), "{no_rcpt:?}");
    assert!(spooled(&spool).is_empty());
}

#[tokio::test]
async fn implicit_tls_and_a_listener_without_starttls() {
    let d = Daemon::start(Options::default());
    let tmp = tempfile::tempdir().expect("tmp");
    let spool = tmp.path().join("spool");
    let cert = common::repo_path("certs/dev-cert.pem");
    let cert = cert.to_str().expect("utf-8 path");
    let tls = |server: SocketAddr, mode: &str| {
        let mut c = tokio::process::Command::new(BIN);
        c.arg("send")
            .args([
                "--tls",
                mode,
                "--ca-file",
                cert,
                "--user",
                "bob",
                "--server",
            ])
            .arg(server.to_string())
            .arg("--spool")
            .arg(&spool)
            .args(["-f", "bob@example.org", "dest@example.net"])
            .env("SMTP_ONCE_PASSWORD", "bob-pw")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        c
    };
    let r = run(
        tls(d.implicit, "implicit"),
        &lf_message("dest@example.net", "implicit"),
    )
    .await;
    assert_eq!(r.code, Some(0), "{r:?}");
    r.queued();
    // The plaintext listener offers no STARTTLS: no retry can fix that, and
    // nothing was sent, so nothing is kept.
    let r = run(
        tls(d.plain, "starttls"),
        &lf_message("dest@example.net", "never sent"),
    )
    .await;
    assert_eq!(r.code, Some(78), "{r:?}");
    assert!(r.stderr.contains("does not offer STARTTLS"), "{r:?}");
    assert!(!r.stderr.contains("attempt 1 failed"), "not retried: {r:?}");
    assert!(spooled(&spool).is_empty(), "{:?}", spooled(&spool));
    assert_eq!(d.queue_count(), 1);
}

/// Issue 21 item 3: a server certificate the client does not trust (the
/// dev certificate without `--ca-file`: UnknownIssuer) is configuration, not
/// the network. `send` must not retry it for its two-minute deadline: exit
/// 78 at once, say that `--ca-file` fixes it, keep nothing in the spool. The
/// same command with `--ca-file` sends.
#[tokio::test]
async fn an_untrusted_certificate_is_a_config_error_at_once() {
    let d = Daemon::start(Options::default());
    let tmp = tempfile::tempdir().expect("tmp");
    let spool = tmp.path().join("spool");
    let cert = common::repo_path("certs/dev-cert.pem");
    let tls = |server: SocketAddr, mode: &str, ca_file: bool| {
        let mut c = tokio::process::Command::new(BIN);
        c.arg("send")
            .args(["--tls", mode, "--user", "bob", "--server"]);
        // "localhost" is in the certificate: only the issuer is unknown.
        c.arg(format!("localhost:{}", server.port()))
            .arg("--spool")
            .arg(&spool)
            .args(["-f", "bob@example.org", "dest@example.net"])
            .env("SMTP_ONCE_PASSWORD", "bob-pw")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if ca_file {
            c.arg("--ca-file").arg(&cert);
        }
        c
    };
    for (server, mode) in [(d.implicit, "implicit"), (d.starttls, "starttls")] {
        let started = Instant::now();
        let r = run_within(
            tls(server, mode, false),
            &lf_message("dest@example.net", "untrusted"),
            Duration::from_secs(30),
        )
        .await;
        assert_eq!(r.code, Some(78), "{mode}: {r:?}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{mode}: took {:?}",
            started.elapsed()
        );
        assert!(r.stderr.contains("not trusted (UnknownIssuer)"), "{r:?}");
        assert!(r.stderr.contains("--ca-file PATH"), "{r:?}");
        assert!(!r.stderr.contains("retrying"), "not retried: {r:?}");
        assert!(spooled(&spool).is_empty(), "{:?}", spooled(&spool));
        let r = run(
            tls(server, mode, true),
            &lf_message("dest@example.net", "trusted"),
        )
        .await;
        assert_eq!(r.code, Some(0), "{mode}: {r:?}");
        r.queued();
        assert!(spooled(&spool).is_empty(), "{:?}", spooled(&spool));
    }
    assert_eq!(d.queue_count(), 2);
}

/// A cron `--flush` with a stale password gets 535 to AUTH. That refuses
/// the login, not the message: the spooled message (which may never have
/// reached the server) stays for the next flush instead of being deleted.
#[tokio::test]
async fn a_flush_refused_at_auth_keeps_the_spool() {
    let tmp = tempfile::tempdir().expect("tmp");
    let spool = tmp.path().join("spool");
    let down = nothing_listening();
    let message = b"From: alice@example.test\nTo: dest@example.net\nSubject: s\n\nbody\n";
    let r = send(
        down,
        &spool,
        &["--deadline", "2s", "dest@example.net"],
        message,
    )
    .await;
    assert_eq!(r.code, Some(75), "{r:?}");
    assert_eq!(spooled(&spool).len(), 1, "{r:?}");

    let d = Daemon::start(Options::default());
    let stale = command_as(
        d.plain,
        &spool,
        Some(("alice", "not-the-password")),
        &["--flush"],
    );
    let r = run(stale, b"").await;
    assert_eq!(r.code, Some(77), "{r:?}");
    assert!(r.stderr.contains("535"), "{r:?}");
    assert_eq!(
        spooled(&spool).len(),
        1,
        "kept after the AUTH refusal: {r:?}"
    );
    assert_eq!(d.queue_count(), 0);

    let r = flush(d.plain, &spool).await;
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
    let down = nothing_listening();
    let message = b"From: app@example.test\nTo: dest@example.net\nSubject: s\n\nbody\n";
    let no_auth = command_as(
        down,
        &spool,
        None,
        &["--deadline", "2s", "dest@example.net"],
    );
    let r = run(no_auth, message).await;
    assert_eq!(r.code, Some(75), "{r:?}");

    let untrusted = Daemon::start(Options::default());
    let r = run(command_as(untrusted.plain, &spool, None, &["--flush"]), b"").await;
    assert!(r.stderr.contains("530"), "{r:?}");
    assert_eq!(spooled(&spool).len(), 1, "kept after the 530: {r:?}");
    assert_eq!(untrusted.queue_count(), 0);

    let trusted = Daemon::start(Options {
        trusted_network: Some(("127.0.0.0/8", "local")),
        ..Options::default()
    });
    let r = run(command_as(trusted.plain, &spool, None, &["--flush"]), b"").await;
    assert_eq!(r.code, Some(0), "{r:?}");
    assert_eq!(trusted.queue_count(), 1);
    assert!(spooled(&spool).is_empty(), "{:?}", spooled(&spool));
}
