//! Real clients' retries (issue 9): an application that rebuilds its message
//! for a retry gets a fresh `Date:` and `Message-ID:` from its mail library.
//! Under the same key that is the same message (SPEC section 3): replayed,
//! one queue row, and the copy stored and relayed is the first one. A real
//! change under a used key is E01005 naming what the key belongs to.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

mod common;

use std::process::Command;
use std::time::Duration;

use common::{Client, Daemon, Options, wait_until};

const FROM: &str = "alice@example.test";
const TO: &[&str] = &["dest@example.net"];

/// Builds the message with Python's own API on every attempt (fresh
/// `formatdate()` and `make_msgid()`), sends it with `send_message`, the
/// call an application writes, and prints one JSON line per attempt: the
/// final DATA reply (or the SMTPDataError) and the Message-ID it sent.
const PYTHON_RETRY: &str = r#"
import json, smtplib, sys, time
from email.message import EmailMessage
from email.utils import formatdate, make_msgid

host, port, key, subject = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

class Recording(smtplib.SMTP):
    def data(self, msg):
        self.last = super().data(msg)
        return self.last

def build(subject):
    m = EmailMessage()
    m["From"] = "alice@example.test"
    m["To"] = "dest@example.net"
    m["Subject"] = subject
    m["Date"] = formatdate()
    m["Message-ID"] = make_msgid()
    m["X-Bird-Idempotency-Key"] = key
    m.set_content("Your invoice is attached.\n")
    return m

for attempt, subject in enumerate(subject.split("|")):
    if attempt:
        time.sleep(1.1)
    m = build(subject)
    with Recording(host, port) as s:
        s.login("alice", "alice-pw")
        try:
            s.send_message(m)
            code, resp = s.last
        except smtplib.SMTPDataError as e:
            code, resp = e.smtp_code, e.smtp_error
    print(json.dumps({"code": code, "reply": resp.decode(), "message_id": m["Message-ID"]}))
"#;

struct Attempt {
    code: u64,
    reply: String,
    message_id: String,
}

/// Runs the Python client: one attempt per `|`-separated subject.
fn python_attempts(d: &Daemon, key: &str, subjects: &str) -> Vec<Attempt> {
    let out = Command::new("python3")
        .args([
            "-c",
            PYTHON_RETRY,
            &d.plain.ip().to_string(),
            &d.plain.port().to_string(),
            key,
            subjects,
        ])
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "python client failed: {}\ndaemon log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).expect("json line");
            Attempt {
                code: v["code"].as_u64().expect("code"),
                reply: v["reply"].as_str().expect("reply").to_owned(),
                message_id: v["message_id"].as_str().expect("message id").to_owned(),
            }
        })
        .collect()
}

fn queued_id(reply: &str) -> String {
    reply
        .rsplit("queued as ")
        .next()
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// The message bytes stored for `id` (what the worker relays).
fn stored_body(d: &Daemon, id: &str) -> String {
    let body: Vec<u8> = d
        .db()
        .query_row(
            "SELECT body FROM message_body WHERE queue_id = ?1",
            [id],
            |r| r.get(0),
        )
        .expect("stored body");
    String::from_utf8_lossy(&body).into_owned()
}

#[tokio::test]
async fn python_rebuilt_retry_is_replayed_and_the_first_copy_relayed() {
    let d = Daemon::start(Options::default());
    let a = python_attempts(&d, "py-invoice-42", "Invoice 42|Invoice 42");
    assert_eq!(a.len(), 2);
    assert_eq!(a[0].code, 250, "first: {}", a[0].reply);
    assert_ne!(
        a[0].message_id, a[1].message_id,
        "the library made a new id"
    );
    assert_eq!(a[1].code, 250, "rebuilt retry: {}", a[1].reply);
    // smtplib joins the reply's lines with "\n".
    let lines: Vec<&str> = a[1].reply.lines().collect();
    assert_eq!(lines.first(), Some(&"2.0.0 Idempotency-Replay: true"));
    let id = queued_id(&a[0].reply);
    assert_eq!(queued_id(&a[1].reply), id);
    assert_eq!(d.queue_count(), 1);
    // The copy stored and relayed is the first attempt's.
    let stored = stored_body(&d, &id);
    assert!(stored.contains(&a[0].message_id), "{stored}");
    assert!(!stored.contains(&a[1].message_id), "{stored}");
    let eml = d.outbox().join(format!("{id}.eml"));
    let relayed = wait_until("the relayed copy", 30, || std::fs::read(&eml).ok()).await;
    let relayed = String::from_utf8_lossy(&relayed);
    assert!(relayed.contains(&a[0].message_id), "{relayed}");
    assert!(!relayed.contains(&a[1].message_id), "{relayed}");
}

/// swaks with a fixed subject (its default one carries the time); swaks
/// stamps Date and Message-Id itself on every run.
fn swaks(d: &Daemon, subject: &str, key: &str) -> String {
    let out = Command::new("swaks")
        .args([
            "--server",
            &d.plain.ip().to_string(),
            "--port",
            &d.plain.port().to_string(),
            "--helo",
            "swaks.test",
            "--auth",
            "PLAIN",
            "--auth-user",
            "alice",
            "--auth-password",
            "alice-pw",
            "--from",
            FROM,
            "--to",
            TO[0],
            "--timeout",
            "30",
            "--header",
            &format!("Subject: {subject}"),
            "--header",
            &format!("X-Bird-Idempotency-Key: {key}"),
        ])
        .output()
        .expect("swaks is installed (scripts/test.sh installs it)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The server's lines after DATA in a swaks transcript (`<-` in plaintext,
/// `<**` for an error reply).
fn data_reply(transcript: &str) -> Vec<String> {
    let lines: Vec<&str> = transcript.lines().collect();
    let end = lines
        .iter()
        .position(|l| l.trim_start().starts_with("-> .") || l.trim_start() == "->  .")
        .unwrap_or(0);
    lines[end..]
        .iter()
        .map(|l| l.trim_start())
        .filter_map(|l| l.strip_prefix("<-").or_else(|| l.strip_prefix("<**")))
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.starts_with("221"))
        .collect()
}

#[tokio::test]
async fn swaks_run_twice_is_replayed() {
    let d = Daemon::start(Options::default());
    let first = swaks(&d, "weekly report", "swaks-rebuilt-1");
    let first_reply = data_reply(&first);
    assert!(
        first_reply
            .last()
            .is_some_and(|l| l.contains("Ok: queued as")),
        "{first}"
    );
    let id = queued_id(first_reply.last().map_or("", String::as_str));
    std::thread::sleep(Duration::from_millis(1100));
    let second = swaks(&d, "weekly report", "swaks-rebuilt-1");
    assert_eq!(
        data_reply(&second),
        vec![
            "250-2.0.0 Idempotency-Replay: true".to_owned(),
            format!("250 2.0.0 Ok: queued as {id}"),
        ],
        "{second}\ndaemon log:\n{}",
        d.log()
    );
    assert_eq!(d.queue_count(), 1);
}

#[tokio::test]
async fn subject_whitespace_is_a_conflict_naming_the_first_queue_id() {
    let d = Daemon::start(Options::default());
    let a = python_attempts(&d, "py-ws", "Invoice 42|Invoice  42");
    assert_eq!(a[0].code, 250, "{}", a[0].reply);
    let id = queued_id(&a[0].reply);
    assert_eq!(a[1].code, 550, "{}", a[1].reply);
    assert_eq!(
        a[1].reply,
        format!(
            "5.6.0 E01005 IdempotencyKeyReuse: key already used for a different message (queued as {id})"
        )
    );
    assert_eq!(d.queue_count(), 1);
}

#[tokio::test]
async fn strict_byte_identity_when_no_header_is_volatile() {
    let d = Daemon::start(Options {
        idempotency_extra: "volatile_headers = []".into(),
        ..Options::default()
    });
    let a = python_attempts(&d, "py-strict", "Invoice 42|Invoice 42");
    assert_eq!(a[0].code, 250, "{}", a[0].reply);
    assert_eq!(a[1].code, 550, "{}", a[1].reply);
    assert!(a[1].reply.contains("E01005"), "{}", a[1].reply);
    assert_eq!(d.queue_count(), 1);
}

#[tokio::test]
async fn conflict_with_a_stored_rejection_says_so() {
    let d = Daemon::start(Options::default());
    let bad =
        b"From: mallory@elsewhere.test\r\nX-Bird-Idempotency-Key: rejected-once\r\n\r\nhi\r\n";
    let mut c = Client::login(d.plain, "alice").await;
    let r = c.submit(FROM, TO, bad).await;
    assert_eq!(r.code, 553, "{r:?}");
    let fixed = b"From: alice@example.test\r\nX-Bird-Idempotency-Key: rejected-once\r\n\r\nhi\r\n";
    let r = c.submit(FROM, TO, fixed).await;
    assert_eq!(
        r.raw,
        "550 5.6.0 E01005 IdempotencyKeyReuse: key already used for a message that was rejected (553)\r\n"
    );
    c.quit().await;
    assert_eq!(d.queue_count(), 0);
}

#[tokio::test]
async fn entries_stored_strictly_still_replay_identical_bytes() {
    // An entry stored under `volatile_headers = []` holds the strict
    // fingerprint, the same as every entry stored before the rule existed:
    // after the switch to the default (an upgrade), an identical retry
    // must still replay.
    let mut d = Daemon::start(Options {
        idempotency_extra: "volatile_headers = []".into(),
        ..Options::default()
    });
    let built = |date: &str| {
        format!(
            "From: alice@example.test\r\nDate: {date}\r\nMessage-ID: <m1@example.test>\r\n\
             X-Bird-Idempotency-Key: upgrade-1\r\n\r\nbody\r\n"
        )
        .into_bytes()
    };
    let m = built("Tue, 01 Dec 2026 03:00:00 +0000");
    let mut c = Client::login(d.plain, "alice").await;
    let first = c.submit(FROM, TO, &m).await;
    c.quit().await;
    assert_eq!(first.code, 250, "{first:?}");
    let id = first.queue_id().expect("queue id");

    let config = std::fs::read_to_string(&d.config_path).expect("config");
    std::fs::write(&d.config_path, config.replace("volatile_headers = []", "")).expect("config");
    d.restart();

    let mut c = Client::login(d.plain, "alice").await;
    let again = c.submit(FROM, TO, &m).await;
    assert!(again.is_replay(), "{again:?}\n{}", d.log());
    assert_eq!(again.queue_id().as_deref(), Some(id.as_str()));
    // A rebuilt retry of an entry stored strictly is still a conflict.
    let rebuilt = c
        .submit(FROM, TO, &built("Tue, 01 Dec 2026 03:00:02 +0000"))
        .await;
    c.quit().await;
    assert!(rebuilt.has(&format!("(queued as {id})")), "{rebuilt:?}");
    assert_eq!(d.queue_count(), 1);
}
