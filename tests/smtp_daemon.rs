//! The submission daemon over real sockets: TLS, AUTH, limits, BDAT,
//! PIPELINING, durability of the queue, shutdown, and the operator CLI.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

mod common;

use std::time::Duration;

use common::{Client, Daemon, Options, message};
use tokio::io::AsyncReadExt;

#[tokio::test]
async fn starttls_auth_plain_then_queued_with_trace_header() {
    let d = Daemon::start(Options {
        allow_plaintext: false,
        ..Options::default()
    });
    let mut c = Client::connect(d.starttls).await;
    let ehlo = c.ehlo().await;
    assert!(ehlo.has("STARTTLS"));
    assert!(
        !ehlo.has("AUTH"),
        "AUTH must not be offered before TLS: {ehlo:?}"
    );
    c.starttls().await;
    let ehlo = c.ehlo().await;
    for ext in [
        "PIPELINING",
        "SIZE 1000000",
        "8BITMIME",
        "SMTPUTF8",
        "ENHANCEDSTATUSCODES",
        "CHUNKING",
        "AUTH PLAIN LOGIN",
    ] {
        assert!(ehlo.has(ext), "{ext} missing from {ehlo:?}");
    }
    assert!(!ehlo.has("STARTTLS"));
    assert_eq!(c.auth_plain("alice", "alice-pw").await.code, 235);
    let r = c
        .submit(
            "alice@example.test",
            &["dest@example.net"],
            &message(None, "hello"),
        )
        .await;
    assert_eq!(r.code, 250, "{r:?}");
    let id = r.queue_id().expect("queue id");
    c.quit().await;

    let (trace, body): (String, Vec<u8>) = d
        .db()
        .query_row(
            "SELECT trace, body FROM message_body WHERE queue_id = ?1",
            [&id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("stored message");
    assert!(trace.starts_with("Received: from client.test"), "{trace}");
    assert!(trace.contains("with ESMTPSA id"), "{trace}");
    // Issue 20 finding 12: the account is not named by default.
    assert!(!trace.contains("account alice"), "{trace}");
    assert_eq!(body, message(None, "hello"));
}

#[tokio::test]
async fn auth_is_refused_without_tls_unless_allowed() {
    let d = Daemon::start(Options {
        allow_plaintext: false,
        ..Options::default()
    });
    let mut c = Client::connect(d.plain).await;
    c.ehlo().await;
    let r = c.auth_plain("alice", "alice-pw").await;
    assert_eq!(r.code, 538, "{r:?}");
}

#[tokio::test]
async fn auth_login_and_wrong_password() {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let d = Daemon::start(Options::default());
    let mut c = Client::connect(d.plain).await;
    c.ehlo().await;
    assert_eq!(c.cmd("AUTH LOGIN").await.code, 334);
    assert_eq!(c.cmd(&b64("bob")).await.code, 334);
    let r = c.cmd(&b64("wrong")).await;
    assert_eq!(r.code, 535, "{r:?}");
    assert!(r.has("5.7.8"));
    assert_eq!(c.cmd("AUTH LOGIN").await.code, 334);
    assert_eq!(c.cmd(&b64("bob")).await.code, 334);
    assert_eq!(c.cmd(&b64("bob-pw")).await.code, 235);
    let r = c.cmd("AUTH PLAIN AGFsaWNlAGFsaWNlLXB3").await;
    assert_eq!(r.code, 503, "already authenticated: {r:?}");
}

#[tokio::test]
async fn implicit_tls_submission() {
    let d = Daemon::start(Options::default());
    let mut c = Client::connect_implicit_tls(d.implicit).await;
    let ehlo = c.ehlo().await;
    assert!(!ehlo.has("STARTTLS"));
    assert_eq!(c.auth_plain("carol", "carol-pw").await.code, 235);
    let r = c
        .submit(
            "carol@globex.test",
            &["x@example.net"],
            &message(None, "tls"),
        )
        .await;
    assert_eq!(r.code, 250, "{r:?}");
    assert_eq!(d.queue_count(), 1);
}

#[tokio::test]
async fn mail_without_auth_is_refused_and_never_relays() {
    let d = Daemon::start(Options::default());
    let mut c = Client::connect(d.plain).await;
    c.ehlo().await;
    let r = c.cmd("MAIL FROM:<x@example.test>").await;
    assert_eq!(r.code, 530, "{r:?}");
    assert!(r.has("5.7.0"));
    let r = c.cmd("RCPT TO:<victim@example.net>").await;
    assert_eq!(r.code, 503, "{r:?}");
    assert_eq!(c.cmd("DATA").await.code, 503);
    assert_eq!(d.queue_count(), 0);
}

#[tokio::test]
async fn trusted_network_submits_without_auth() {
    let d = Daemon::start(Options {
        trusted_network: Some(("127.0.0.0/8", "local")),
        ..Options::default()
    });
    let mut c = Client::connect(d.plain).await;
    c.ehlo().await;
    let r = c
        .submit(
            "app@anything.test",
            &["x@example.net"],
            &message(None, "trusted"),
        )
        .await;
    assert_eq!(r.code, 250, "{r:?}");
    let ws: String = d
        .db()
        .query_row("SELECT workspace FROM queue", [], |r| r.get(0))
        .expect("row");
    assert_eq!(ws, "local");
}

#[tokio::test]
async fn pipelined_commands_get_all_replies_in_order() {
    let d = Daemon::start(Options::default());
    let mut c = Client::login(d.plain, "bob").await;
    let mut batch = b"MAIL FROM:<bob@example.test>\r\nRCPT TO:<a@example.net>\r\nRCPT TO:<b@example.net>\r\nDATA\r\n".to_vec();
    batch.extend_from_slice(&common::dot_stuff(&message(None, "pipelined")));
    batch.extend_from_slice(b"NOOP\r\nQUIT\r\n");
    c.send(&batch).await;
    let codes: Vec<u16> = {
        let mut v = Vec::new();
        for _ in 0..7 {
            v.push(c.read_reply().await.code);
        }
        v
    };
    assert_eq!(codes, [250, 250, 250, 354, 250, 250, 221]);
    assert_eq!(d.queue_count(), 1);
}

#[tokio::test]
async fn size_limit_at_mail_and_while_receiving() {
    let d = Daemon::start(Options {
        max_message_size: 2000,
        ..Options::default()
    });
    let mut c = Client::login(d.plain, "bob").await;
    let r = c.cmd("MAIL FROM:<bob@example.test> SIZE=5000").await;
    assert_eq!(r.code, 552, "{r:?}");
    assert!(r.has("5.3.4"));
    let big = message(None, &"x".repeat(70).repeat(40).chars().collect::<String>());
    let r = c.submit("bob@example.test", &["a@example.net"], &big).await;
    assert_eq!(r.code, 552, "{r:?}");
    // The session is still usable after the oversized message.
    let r = c
        .submit(
            "bob@example.test",
            &["a@example.net"],
            &message(None, "small"),
        )
        .await;
    assert_eq!(r.code, 250, "{r:?}");
    assert_eq!(d.queue_count(), 1);
}

#[tokio::test]
async fn recipient_limit_and_line_length() {
    let d = Daemon::start(Options {
        max_recipients: 2,
        ..Options::default()
    });
    let mut c = Client::login(d.plain, "bob").await;
    assert_eq!(c.cmd("MAIL FROM:<bob@example.test>").await.code, 250);
    assert_eq!(c.cmd("RCPT TO:<a@example.net>").await.code, 250);
    assert_eq!(c.cmd("RCPT TO:<b@example.net>").await.code, 250);
    let r = c.cmd("RCPT TO:<c@example.net>").await;
    assert_eq!(r.code, 452, "{r:?}");
    assert!(r.has("4.5.3"));
    let r = c.cmd(&format!("NOOP {}", "y".repeat(600))).await;
    assert_eq!(r.code, 500, "{r:?}");
    assert!(r.has("5.5.2"));
    assert_eq!(c.cmd("NOOP").await.code, 250);
}

#[tokio::test]
async fn bare_lf_in_data_is_rejected() {
    let d = Daemon::start(Options::default());
    let mut c = Client::login(d.plain, "bob").await;
    assert_eq!(c.cmd("MAIL FROM:<bob@example.test>").await.code, 250);
    assert_eq!(c.cmd("RCPT TO:<a@example.net>").await.code, 250);
    assert_eq!(c.cmd("DATA").await.code, 354);
    // The smuggling pattern: a bare-LF "end of data" followed by a command.
    c.send(b"Subject: x\r\n\r\nhello\n.\nMAIL FROM:<evil@x>\r\n.\r\n")
        .await;
    let r = c.read_reply().await;
    assert_eq!(r.code, 554, "{r:?}");
    assert_eq!(d.queue_count(), 0);
}

#[tokio::test]
async fn bdat_chunks_over_a_raw_socket() {
    let d = Daemon::start(Options::default());
    let mut c = Client::login(d.plain, "bob").await;
    let m = message(Some("bdat-1"), "chunked body");
    let (a, b) = m.split_at(20);
    let mut batch = b"MAIL FROM:<bob@example.test>\r\nRCPT TO:<a@example.net>\r\n".to_vec();
    batch.extend_from_slice(format!("BDAT {}\r\n", a.len()).as_bytes());
    batch.extend_from_slice(a);
    batch.extend_from_slice(format!("BDAT {} LAST\r\n", b.len()).as_bytes());
    batch.extend_from_slice(b);
    c.send(&batch).await;
    assert_eq!(c.read_reply().await.code, 250);
    assert_eq!(c.read_reply().await.code, 250);
    let chunk = c.read_reply().await;
    assert_eq!(chunk.code, 250, "{chunk:?}");
    let last = c.read_reply().await;
    assert_eq!(last.code, 250, "{last:?}");
    let id = last.queue_id().expect("queued");
    let body: Vec<u8> = d
        .db()
        .query_row(
            "SELECT body FROM message_body WHERE queue_id = ?1",
            [&id],
            |r| r.get(0),
        )
        .expect("body");
    assert_eq!(
        body, m,
        "BDAT content is stored exactly, without dot handling"
    );
    // BDAT without a transaction still consumes its chunk.
    c.send(b"BDAT 5 LAST\r\nhelloNOOP\r\n").await;
    assert_eq!(c.read_reply().await.code, 503);
    assert_eq!(c.read_reply().await.code, 250);
}

#[tokio::test]
async fn too_many_bad_commands_disconnects() {
    let d = Daemon::start(Options::default());
    let mut c = Client::connect(d.plain).await;
    let mut last = 0;
    for _ in 0..25 {
        c.send(b"BOGUS\r\n").await;
        match c.try_read_reply().await {
            Some(r) => last = r.code,
            None => break,
        }
        if last == 421 {
            break;
        }
    }
    assert_eq!(last, 421);
    assert!(c.is_closed().await);
    let log = d.log();
    assert!(
        log.contains("bad command") && log.contains("500 5.5.1 Unknown command"),
        "every bad command is logged with its reply:\n{log}"
    );
    assert!(log.contains("too many bad commands, disconnecting"));
}

#[tokio::test]
async fn idle_timeout_closes_with_421() {
    let d = Daemon::start(Options {
        command_timeout: "1s".into(),
        ..Options::default()
    });
    let mut c = Client::connect(d.plain).await;
    let r = c.read_reply().await;
    assert_eq!(r.code, 421, "{r:?}");
    assert!(r.has("4.4.2"));
}

#[tokio::test]
async fn connection_cap_refuses_extra_connections() {
    let d = Daemon::start(Options {
        max_connections: 2,
        ..Options::default()
    });
    let _a = Client::connect(d.plain).await;
    let _b = Client::connect(d.plain).await;
    let mut extra = tokio::net::TcpStream::connect(d.plain)
        .await
        .expect("connect");
    let mut buf = vec![0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(10), extra.read(&mut buf))
        .await
        .expect("reply")
        .expect("read");
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(text.starts_with("421"), "{text}");
}

#[tokio::test]
async fn accepted_mail_survives_kill_and_sigterm_is_clean() {
    let mut d = Daemon::start(Options::default());
    let mut c = Client::login(d.plain, "bob").await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let r = c
            .submit(
                "bob@example.test",
                &["a@example.net"],
                &message(None, &format!("m{i}")),
            )
            .await;
        assert_eq!(r.code, 250);
        ids.push(r.queue_id().expect("id"));
    }
    drop(c);
    d.kill9();
    d.spawn();
    assert_eq!(
        d.queue_count(),
        5,
        "every acknowledged message survives kill -9"
    );
    let status = d.terminate();
    assert!(status.success(), "SIGTERM exits cleanly: {status:?}");
    assert!(d.log().contains("stopped"));
    // The operator CLI reads the queue without the daemon.
    let out = d.cli(&["status", &ids[0]]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    // The delivery worker (file mode) may have delivered it already.
    assert!(
        text.contains(&ids[0])
            && (text.contains("state:        queued") || text.contains("state:        delivered")),
        "{text}"
    );
    let out = d.cli(&["queue"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 5, "{text}");
    let out = d.cli(&["status", "NOPE"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no message with queue id NOPE"));
}

#[tokio::test]
async fn sigterm_finishes_the_in_flight_commit() {
    let mut d = Daemon::start(Options::default());
    let mut idle = Client::login(d.plain, "bob").await;
    // Hold the write lock so the commit is still running at SIGTERM.
    let blocker = d.db();
    blocker.execute_batch("BEGIN IMMEDIATE").expect("lock");
    let mut busy = Client::login(d.plain, "bob").await;
    busy.cmd("MAIL FROM:<bob@example.test>").await;
    busy.cmd("RCPT TO:<a@example.net>").await;
    busy.cmd("DATA").await;
    busy.send(&common::dot_stuff(&message(Some("in-flight"), "finish me")))
        .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    d.signal_term();
    let r = idle.read_reply().await;
    assert_eq!(
        r.code, 421,
        "idle session told the service is stopping: {r:?}"
    );
    assert!(r.has("4.3.2"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    blocker.execute_batch("ROLLBACK").expect("unlock");
    let r = busy.read_reply().await;
    assert_eq!(r.code, 250, "in-flight commit finished: {r:?}");
    assert!(d.wait_exit().success());
    assert_eq!(d.queue_count(), 1);
}

#[tokio::test]
async fn second_daemon_on_same_data_dir_refuses_to_start() {
    let d = Daemon::start(Options::default());
    let out = std::process::Command::new(common::BIN)
        .args(["serve", "--config"])
        .arg(&d.config_path)
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use by another smtp-once process"), "{err}");
}

#[tokio::test]
async fn example_config_runs_with_its_demo_account() {
    // config.example.toml as shipped, with only its loopback ports made
    // ephemeral and its relative paths (certs, data) pointed at real places.
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::create_dir(dir.path().join("certs")).expect("certs dir");
    for f in ["dev-cert.pem", "dev-key.pem"] {
        std::fs::copy(
            common::repo_path(&format!("certs/{f}")),
            dir.path().join("certs").join(f),
        )
        .expect("copy cert");
    }
    let example =
        std::fs::read_to_string(common::repo_path("config.example.toml")).expect("example");
    let text = example
        .replace("127.0.0.1:2587", "127.0.0.1:0")
        .replace("127.0.0.1:2465", "127.0.0.1:0")
        .replace("127.0.0.1:8025", "127.0.0.1:0");
    let d = Daemon::with_config(dir, &text);
    let mut c = Client::connect(d.addrs[0]).await;
    c.ehlo().await;
    c.starttls().await;
    c.ehlo().await;
    let r = c.auth_plain("demo", "demo-password").await;
    assert_eq!(r.code, 235, "the README's demo password works: {r:?}");
    let m = b"From: you@example.test\r\nX-Bird-Idempotency-Key: example-1\r\n\r\nhi\r\n";
    let r = c
        .submit("you@example.test", &["someone@example.net"], m)
        .await;
    assert_eq!(r.code, 250, "{r:?}");
    let id = r.queue_id().expect("id");
    let eml = d.dir.path().join("data/outbox").join(format!("{id}.eml"));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !eml.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "{} never written",
            eml.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut tls = Client::connect_implicit_tls(d.addrs[1]).await;
    tls.ehlo().await;
    assert_eq!(tls.auth_plain("demo", "demo-password").await.code, 235);
}

#[test]
fn check_config_reports_problems_by_key() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[server]\nhostname = \"h\"\ndata_dir = \"d\"\n[[listener]]\naddr = \"x\"\n[relay]\nmode = \"file\"\n",
    )
    .expect("write");
    let out = std::process::Command::new(common::BIN)
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("listener[0].addr"), "{err}");
    assert!(err.contains("relay.dir"), "{err}");
    let ok = std::process::Command::new(common::BIN)
        .args(["check-config", "--config"])
        .arg(common::repo_path("config.example.toml"))
        .output()
        .expect("run");
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
}
