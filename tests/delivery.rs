//! Outbound delivery over real processes and sockets: file mode, a
//! smarthost (a second smtp-once, or the tiny SMTP server of
//! `common/tiny.rs`),
//! exactly once across `kill -9`, MX routing with a made-up resolver,
//! bounces, operator commands and shutdown.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

mod common;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::tiny::{Tiny, Txn, accept_all};
use common::{Client, Daemon, Options, message, wait_until};
use smtp_once::delivery::dane::Tlsa;
use smtp_once::delivery::mx::{
    DnsError, MxAnswer, MxRecord, MxSettings, MxTransport, Resolver, Secured,
};
use smtp_once::delivery::outgoing::Outgoing;
use smtp_once::delivery::smtp::ClientSettings;
use smtp_once::delivery::{RcptResult, Status};
use smtp_once::store::BoxFuture;

/// Fast retries and polling, so the suite never waits on production timers.
const FAST: &str = "retry_schedule = [\"200ms\"]\npoll_interval = \"50ms\"\n";

fn smarthost(addr: impl std::fmt::Display, creds: Option<(&str, &str)>) -> String {
    let mut s = format!("[relay]\nmode = \"smarthost\"\nsmarthost = \"{addr}\"\ntls = \"none\"\n");
    if let Some((user, password)) = creds {
        s.push_str(&format!(
            "username = \"{user}\"\npassword = \"{password}\"\n"
        ));
    }
    s
}

/// A loopback port nobody listens on (until a test starts a server there).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

fn state(d: &Daemon, id: &str) -> (String, i64) {
    d.db()
        .query_row(
            "SELECT state, attempts FROM queue WHERE id = ?1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("queue row")
}

async fn wait_state(d: &Daemon, id: &str, want: &str) -> i64 {
    wait_until(&format!("{id} to be {want}"), 20, || {
        let (s, attempts) = state(d, id);
        (s == want).then_some(attempts)
    })
    .await
}

fn stored(d: &Daemon, id: &str) -> (String, Vec<u8>) {
    d.db()
        .query_row(
            "SELECT trace, body FROM message_body WHERE queue_id = ?1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("stored message")
}

/// Queue rows with the null reverse-path: the bounces.
fn bounces(d: &Daemon) -> Vec<(String, String, String)> {
    let db = d.db();
    let mut stmt = db
        .prepare("SELECT id, recipients, state FROM queue WHERE reverse_path = '' ORDER BY id")
        .expect("prepare");
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("query")
        .map(|r| r.expect("row"))
        .collect()
}

fn cli(d: &Daemon, args: &[&str]) -> (bool, String, String) {
    let out = d.cli(args);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn status(d: &Daemon, id: &str) -> String {
    let (ok, out, err) = cli(d, &["status", id]);
    assert!(ok, "status {id}: {err}");
    out
}

async fn submit(d: &Daemon, user: &str, from: &str, rcpts: &[&str], msg: &[u8]) -> String {
    let mut c = Client::login(d.plain, user).await;
    let r = c.submit(from, rcpts, msg).await;
    assert_eq!(r.code, 250, "{r:?}");
    c.quit().await;
    r.queue_id().expect("queue id")
}

fn key_of(data: &[u8]) -> Option<String> {
    smtp_once::message::key_header::extract_key(data).expect("valid key")
}

// ------------------------------------------------------------------ tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_mode_writes_each_message_once_and_atomically() {
    let mut d = Daemon::start(Options {
        extra: FAST.into(),
        ..Options::default()
    });
    let rcpts = ["x@example.net", "y@example.org"];
    let keyed = message(Some("file-k1"), "one");
    let mut ids = Vec::new();
    for msg in [
        keyed.clone(),
        message(None, "two"),
        message(None, ".dot\r\n..two dots"),
    ] {
        ids.push(submit(&d, "bob", "bob@example.test", &rcpts, &msg).await);
    }
    // A retry of the keyed message is a replay, not a second message.
    assert_eq!(
        submit(&d, "bob", "bob@example.test", &rcpts, &keyed).await,
        ids[0]
    );
    for id in &ids {
        assert_eq!(wait_state(&d, id, "delivered").await, 1);
    }

    let outbox = d.outbox();
    let files = || {
        let mut names: Vec<String> = std::fs::read_dir(&outbox)
            .expect("outbox")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let mut expected: Vec<String> = ids.iter().map(|id| format!("{id}.eml")).collect();
    expected.sort();
    assert_eq!(
        files(),
        expected,
        "one file per message, no temporary files"
    );
    for (i, id) in ids.iter().enumerate() {
        let (trace, body) = stored(&d, id);
        let key_header = if i == 0 {
            String::new() // the submitter's key is in the body already
        } else {
            format!("X-Bird-Idempotency-Key: smtp-once-{id}\r\n")
        };
        let expected = [
            "Return-Path: <bob@example.test>\r\nX-Envelope-To: <x@example.net>,\r\n\t<y@example.org>\r\n".as_bytes(),
            trace.as_bytes(),
            key_header.as_bytes(),
            &body,
        ]
        .concat();
        let file = std::fs::read(d.outbox().join(format!("{id}.eml"))).expect("eml");
        assert_eq!(
            String::from_utf8_lossy(&file),
            String::from_utf8_lossy(&expected)
        );
    }

    // Delivered stays delivered across a restart: nothing is written again.
    let before: Vec<_> = ids
        .iter()
        .map(|id| {
            std::fs::metadata(d.outbox().join(format!("{id}.eml")))
                .expect("meta")
                .modified()
                .expect("mtime")
        })
        .collect();
    d.restart();
    tokio::time::sleep(Duration::from_millis(400)).await;
    for (id, mtime) in ids.iter().zip(before) {
        assert_eq!(state(&d, id), ("delivered".into(), 1));
        let now = std::fs::metadata(d.outbox().join(format!("{id}.eml")))
            .expect("meta")
            .modified()
            .expect("mtime");
        assert_eq!(now, mtime, "{id} rewritten after restart");
    }
    assert_eq!(files(), expected);

    let out = status(&d, &ids[0]);
    assert!(out.contains("state:        delivered"), "{out}");
    assert!(
        out.contains("<x@example.net>  delivered  250 2.0.0 written"),
        "{out}"
    );
    assert!(out.contains("last reply:   <"), "{out}");
    let (ok, out, _) = cli(&d, &["queue", "--state", "delivered"]);
    assert!(ok);
    assert_eq!(out.lines().count(), 3, "{out}");
    let (_, out, _) = cli(&d, &["queue", "--state", "deferred"]);
    assert_eq!(out.lines().count(), 0, "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smarthost_down_is_deferred_then_retry_delivers_once() {
    let port = free_port();
    let a = Daemon::start(Options {
        relay: Some(smarthost(
            format!("127.0.0.1:{port}"),
            Some(("bob", "bob-pw")),
        )),
        // Long backoff: only the operator's retry brings it back early.
        extra: "retry_schedule = [\"1h\"]\npoll_interval = \"50ms\"\n".into(),
        ..Options::default()
    });
    let msg = message(Some("sh-1"), "via smarthost");
    let id = submit(&a, "bob", "bob@example.test", &["r@example.net"], &msg).await;
    assert_eq!(wait_state(&a, &id, "deferred").await, 1);
    let out = status(&a, &id);
    assert!(out.contains("state:        deferred"), "{out}");
    assert!(!out.contains("next attempt: -"), "{out}");
    assert!(
        out.contains(&format!(
            "last error:   <r@example.net>: connect to 127.0.0.1:{port}"
        )),
        "{out}"
    );
    assert!(out.contains("<r@example.net>  pending"), "{out}");
    let (_, listed, _) = cli(&a, &["queue", "--state", "deferred"]);
    assert!(
        listed.starts_with(&id) && listed.contains("error="),
        "{listed}"
    );

    let b = Daemon::start(Options {
        plain_addr: Some(format!("127.0.0.1:{port}")),
        ..Options::default()
    });
    let (ok, out, err) = cli(&a, &["retry", &id]);
    assert!(ok, "{err}");
    assert!(out.contains("due now"), "{out}");
    assert_eq!(wait_state(&a, &id, "delivered").await, 2);

    let in_b = b.queue_ids_for_key("sh-1");
    assert_eq!(in_b.len(), 1, "exactly one copy in B");
    let (a_trace, a_body) = stored(&a, &id);
    let (_, b_body) = stored(&b, &in_b[0]);
    assert_eq!(
        b_body,
        [a_trace.as_bytes(), &a_body].concat(),
        "relayed unchanged: A's trace + body"
    );
    let out = status(&a, &id);
    assert!(out.contains(&format!("queued as {}", in_b[0])), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smarthost_over_starttls_and_implicit_tls() {
    let b = Daemon::start(Options {
        allow_plaintext: false,
        ..Options::default()
    });
    let cert = common::repo_path("certs/dev-cert.pem");
    let relays = [
        // Verified against the dev certificate (it names 127.0.0.1).
        (
            b.starttls,
            format!("tls = \"starttls\"\nca_file = \"{}\"\n", cert.display()),
        ),
        (
            b.implicit,
            "tls = \"implicit\"\ninsecure_skip_verify = true\n".to_string(),
        ),
    ];
    for (i, (addr, tls)) in relays.iter().enumerate() {
        let relay = format!(
            "[relay]\nmode = \"smarthost\"\nsmarthost = \"{addr}\"\nusername = \"bob\"\npassword = \"bob-pw\"\n{tls}"
        );
        let a = Daemon::start(Options {
            relay: Some(relay),
            extra: FAST.into(),
            ..Options::default()
        });
        let key = format!("tls-{i}");
        let id = submit(
            &a,
            "bob",
            "bob@example.test",
            &["r@example.net"],
            &message(Some(&key), "tls"),
        )
        .await;
        wait_state(&a, &id, "delivered").await;
        let in_b = b.queue_ids_for_key(&key);
        assert_eq!(in_b.len(), 1);
        let (trace, _) = stored(&b, &in_b[0]);
        assert!(trace.contains("with ESMTPSA id"), "TLS and AUTH: {trace}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipients_refused_for_now_are_retried_alone_under_their_own_key() {
    let b = Daemon::start(Options {
        max_recipients: 1,
        ..Options::default()
    });
    let a = Daemon::start(Options {
        relay: Some(smarthost(b.plain, Some(("bob", "bob-pw")))),
        extra: FAST.into(),
        ..Options::default()
    });
    let msg = message(Some("part-1"), "two recipients");
    let id = submit(
        &a,
        "bob",
        "bob@example.test",
        &["r1@example.net", "r2@example.net"],
        &msg,
    )
    .await;
    assert_eq!(wait_state(&a, &id, "delivered").await, 2);

    let db = b.db();
    let mut stmt = db
        .prepare("SELECT recipients, idempotency_key FROM queue ORDER BY id")
        .expect("prepare");
    let rows: Vec<(String, String)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("query")
        .map(|r| r.expect("row"))
        .collect();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0], ("r1@example.net".into(), "part-1".into()));
    assert_eq!(rows[1].0, "r2@example.net");
    assert!(rows[1].1.starts_with("part-1/"), "{rows:?}");

    let out = status(&a, &id);
    assert!(
        out.contains("<r2@example.net>  deferred via 127.0.0.1 ["),
        "{out}"
    );
    assert!(out.contains(": 452 4.5.3 Too many recipients"), "{out}");
    assert!(
        out.contains("<r2@example.net>  delivered  250 2.0.0"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_failure_bounces_to_the_sender_once() {
    let b = Daemon::start(Options::default());
    // B only lets alice send as *@example.test.
    let a = Daemon::start(Options {
        relay: Some(smarthost(b.plain, Some(("alice", "alice-pw")))),
        extra: FAST.into(),
        ..Options::default()
    });
    let id = submit(
        &a,
        "bob",
        "bob@other.test",
        &["r@example.net"],
        &message(None, "refused"),
    )
    .await;
    assert_eq!(wait_state(&a, &id, "failed").await, 1);
    let out = status(&a, &id);
    assert!(out.contains("state:        failed"), "{out}");
    assert!(
        out.contains(
            "last error:   <r@example.net>: 553 5.7.1 Sender <bob@other.test> not allowed"
        ),
        "{out}"
    );

    let dsn = wait_until("a bounce", 10, || bounces(&a).into_iter().next()).await;
    assert_eq!(
        dsn.1, "bob@other.test",
        "the bounce goes to the envelope sender"
    );
    let (_, body) = stored(&a, &dsn.0);
    let text = String::from_utf8_lossy(&body);
    for needle in [
        "Content-Type: multipart/report; report-type=delivery-status;",
        "Final-Recipient: rfc822; r@example.net",
        "Action: failed",
        "Status: 5.7.1",
        "Diagnostic-Code: smtp; 553 5.7.1",
        &format!("X-Smtp-Once-Queue-ID: {id}"),
        "Content-Type: text/rfc822-headers",
    ] {
        assert!(text.contains(needle), "{needle:?} missing:\n{text}");
    }
    // B refuses the bounce too (alice may not send as <>), and that
    // failure must not bounce again.
    wait_state(&a, &dsn.0, "failed").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(bounces(&a).len(), 1, "never a bounce of a bounce");
    assert_eq!(a.queue_count(), 2);
    assert_eq!(b.queue_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_recipient_outcomes_against_a_tiny_server() {
    let tiny = Tiny::start(
        "127.0.0.1:0".parse().expect("addr"),
        Arc::new(|rcpt, nth| match (rcpt, nth) {
            ("bad@example.net", _) => "550 5.1.1 No such user".into(),
            ("later@example.net", 1) => "451 4.2.0 Mailbox busy, try later".into(),
            _ => "250 2.1.5 Ok".into(),
        }),
        Duration::ZERO,
    );
    let a = Daemon::start(Options {
        relay: Some(smarthost(tiny.addr, None)),
        extra: FAST.into(),
        ..Options::default()
    });
    let rcpts = ["ok@example.net", "bad@example.net", "later@example.net"];
    let id = submit(
        &a,
        "bob",
        "bob@example.test",
        &rcpts,
        &message(None, "mixed"),
    )
    .await;
    assert_eq!(wait_state(&a, &id, "failed").await, 2);

    let txns = tiny.txns();
    let mine: Vec<&Txn> = txns
        .iter()
        .filter(|t| t.from == "bob@example.test")
        .collect();
    assert_eq!(mine.len(), 2, "{txns:?}");
    assert_eq!(mine[0].rcpts, ["ok@example.net"]);
    assert_eq!(mine[1].rcpts, ["later@example.net"]);
    let (k1, k2) = (key_of(&mine[0].data), key_of(&mine[1].data));
    assert_eq!(k1.as_deref(), Some(format!("smtp-once-{id}").as_str()));
    assert!(
        k2.as_deref()
            .is_some_and(|k| k.starts_with(&format!("smtp-once-{id}/"))),
        "{k2:?}"
    );
    assert!(mine[0].data.starts_with(b"Received: from client.test"));

    let out = status(&a, &id);
    assert!(
        out.contains("last error:   <bad@example.net>: 550 5.1.1"),
        "the failure stays visible:\n{out}"
    );
    for line in [
        "<ok@example.net>     delivered  250 2.0.0 tiny queued",
        "<bad@example.net>    failed     550 5.1.1 No such user",
        "<later@example.net>  delivered  250 2.0.0 tiny queued",
    ] {
        assert!(out.contains(line), "{line:?} missing:\n{out}");
    }

    // One bounce, for the failed recipient only, relayed with <>.
    let dsn_txn = wait_until("the bounce at the smarthost", 10, || {
        tiny.txns().into_iter().find(|t| t.from.is_empty())
    })
    .await;
    assert_eq!(dsn_txn.rcpts, ["bob@example.test"]);
    let text = String::from_utf8_lossy(&dsn_txn.data);
    assert!(
        text.contains("Final-Recipient: rfc822; bad@example.net"),
        "{text}"
    );
    assert!(!text.contains("Final-Recipient: rfc822; later@"), "{text}");
    assert_eq!(bounces(&a).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_the_next_hop_accepted_then_retried_leaves_one_copy() {
    let b = Daemon::start(Options::default());
    let mut a = Daemon::start(Options {
        relay: Some(smarthost(b.plain, Some(("bob", "bob-pw")))),
        extra: "poll_interval = \"50ms\"\ndelivery_test_pause_after_send = \"60s\"\n".into(),
        ..Options::default()
    });
    let keyed = submit(
        &a,
        "bob",
        "bob@example.test",
        &["r@example.net"],
        &message(Some("chain-1"), "one"),
    )
    .await;
    let unkeyed = submit(
        &a,
        "bob",
        "bob@example.test",
        &["r@example.net"],
        &message(None, "two"),
    )
    .await;
    wait_until("B to accept both", 20, || {
        (b.queue_count() == 2).then_some(())
    })
    .await;
    // A got B's 250 and sits in the test pause, before recording it.
    assert_eq!(state(&a, &keyed).0, "delivering");
    assert!(status(&a, &unkeyed).contains("state:        delivering"));

    a.kill9();
    a.respawn_without_test_pause();
    for id in [&keyed, &unkeyed] {
        assert_eq!(wait_state(&a, id, "delivered").await, 1);
        let out = status(&a, id);
        assert!(
            out.contains("Idempotency-Replay: true"),
            "B replayed its reply:\n{out}"
        );
    }
    assert_eq!(b.queue_count(), 2, "B holds exactly one copy of each");
    assert_eq!(
        b.log().matches("replayed stored reply").count(),
        2,
        "{}",
        b.log()
    );
    assert_eq!(b.queue_ids_for_key("chain-1").len(), 1);
    assert_eq!(
        b.queue_ids_for_key(&format!("smtp-once-{unkeyed}")).len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_from_two_workspaces_reaches_the_next_hop_twice() {
    // B scopes keys by A's one relay account, so A's two workspaces share
    // one key space there; the second message must not bounce as E01005.
    let b = Daemon::start(Options::default());
    let a = Daemon::start(Options {
        relay: Some(smarthost(b.plain, Some(("bob", "bob-pw")))),
        extra: FAST.into(),
        ..Options::default()
    });
    let key = "shared-across-workspaces";
    let acme = submit(
        &a,
        "alice",
        "alice@example.test",
        &["r@example.net"],
        &message(Some(key), "from acme"),
    )
    .await;
    wait_state(&a, &acme, "delivered").await;
    let globex = submit(
        &a,
        "carol",
        "carol@globex.test",
        &["r@example.net"],
        &message(Some(key), "from globex"),
    )
    .await;
    wait_state(&a, &globex, "delivered").await;
    assert_eq!(b.queue_count(), 2, "both messages reached B");
    assert_eq!(b.queue_ids_for_key(key).len(), 1);
    assert_eq!(
        b.queue_ids_for_key(&format!("smtp-once-{globex}")).len(),
        1,
        "the second went under the queue-id key"
    );
    assert!(bounces(&a).is_empty(), "nothing bounced");
    assert!(a.log().contains("retrying under the queue-id key"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_hold_release_retry_and_delete() {
    let port = free_port();
    let a = Daemon::start(Options {
        relay: Some(smarthost(format!("127.0.0.1:{port}"), None)),
        extra: "retry_schedule = [\"1h\"]\npoll_interval = \"50ms\"\n".into(),
        ..Options::default()
    });
    let m1 = submit(
        &a,
        "bob",
        "bob@example.test",
        &["r@example.net"],
        &message(None, "m1"),
    )
    .await;
    let m2 = submit(
        &a,
        "bob",
        "bob@example.test",
        &["r@example.net"],
        &message(None, "m2"),
    )
    .await;
    wait_state(&a, &m1, "deferred").await;
    wait_state(&a, &m2, "deferred").await;

    let (ok, out, _) = cli(&a, &["hold", &m1]);
    assert!(ok && out.contains("held"), "{out}");
    let (_, out, _) = cli(&a, &["queue", "--state", "held"]);
    assert!(out.starts_with(&m1) && out.lines().count() == 1, "{out}");
    assert!(status(&a, &m1).contains("state:        held"));
    let (ok, _, err) = cli(&a, &["retry", &m1]);
    assert!(!ok && err.contains("is held; release it"), "{err}");
    let (ok, _, err) = cli(&a, &["release", &m2]);
    assert!(!ok && err.contains("not held"), "{err}");

    let (ok, out, err) = cli(&a, &["release", &m1]);
    assert!(ok, "{err}");
    assert!(out.contains("released (deferred), due now"), "{out}");
    wait_until("another attempt after release", 10, || {
        (state(&a, &m1) == ("deferred".into(), 2)).then_some(())
    })
    .await;

    let (ok, out, err) = cli(&a, &["delete", &m2]);
    assert!(ok && out.contains("deleted"), "{out}{err}");
    let (ok, _, err) = cli(&a, &["status", &m2]);
    assert!(!ok && err.contains("no message with queue id"), "{err}");
    assert_eq!(a.queue_count(), 1);

    let (ok, out, _) = cli(&a, &["retry", "--all"]);
    assert!(ok && out.contains("1 message(s) due now"), "{out}");
    wait_until("an attempt after retry --all", 10, || {
        (state(&a, &m1).1 == 3).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferred_past_max_age_expires_and_bounces() {
    let port = free_port();
    let a = Daemon::start(Options {
        relay: Some(smarthost(format!("127.0.0.1:{port}"), None)),
        extra: format!("{FAST}max_age = \"1s\"\n"),
        ..Options::default()
    });
    let id = submit(
        &a,
        "bob",
        "bob@example.test",
        &["r@example.net"],
        &message(None, "old"),
    )
    .await;
    wait_state(&a, &id, "expired").await;
    let out = status(&a, &id);
    assert!(out.contains("state:        expired"), "{out}");
    assert!(out.contains("<r@example.net>  expired"), "{out}");
    let dsn = bounces(&a).into_iter().next().expect("a bounce");
    let (_, body) = stored(&a, &dsn.0);
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.contains("Status: 4.4.7") && text.contains("gave up after retrying"),
        "{text}"
    );
    // The bounce cannot be delivered either; it expires without bouncing.
    wait_state(&a, &dsn.0, "expired").await;
    assert_eq!(bounces(&a).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_a_delivery_in_flight_finish() {
    let tiny = Tiny::start(
        "127.0.0.1:0".parse().expect("addr"),
        accept_all(),
        Duration::from_millis(1500),
    );
    let mut a = Daemon::start(Options {
        relay: Some(smarthost(tiny.addr, None)),
        extra: FAST.into(),
        ..Options::default()
    });
    let id = submit(
        &a,
        "bob",
        "bob@example.test",
        &["r@example.net"],
        &message(None, "slow"),
    )
    .await;
    wait_until("the transfer to start", 10, || {
        (tiny.data_started.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await;
    let exit = tokio::task::block_in_place(|| a.terminate());
    assert!(exit.success(), "{exit:?}");
    assert_eq!(state(&a, &id), ("delivered".into(), 1));
    assert_eq!(tiny.txns().len(), 1);
    let log = a.log();
    assert!(
        log.contains("waiting for deliveries in flight") && log.contains("delivery worker stopped"),
        "{log}"
    );
}

// ------------------------------------------------------------------ mx

#[derive(Default)]
struct FakeDns {
    mx: HashMap<&'static str, Result<MxAnswer, DnsError>>,
    ips: HashMap<&'static str, Vec<IpAddr>>,
}

impl Resolver for FakeDns {
    fn mx<'a>(&'a self, domain: &'a str) -> BoxFuture<'a, Result<Secured<MxAnswer>, DnsError>> {
        Box::pin(async move {
            self.mx
                .get(domain)
                .cloned()
                .unwrap_or(Ok(MxAnswer::NoDomain))
                .map(Secured::insecure)
        })
    }

    fn ips<'a>(&'a self, host: &'a str) -> BoxFuture<'a, Result<Secured<Vec<IpAddr>>, DnsError>> {
        Box::pin(async move {
            Ok(Secured::insecure(
                self.ips.get(host).cloned().unwrap_or_default(),
            ))
        })
    }

    fn tlsa<'a>(&'a self, _name: &'a str) -> BoxFuture<'a, Result<Secured<Vec<Tlsa>>, DnsError>> {
        Box::pin(async move { Ok(Secured::insecure(Vec::new())) })
    }

    fn txt<'a>(&'a self, _name: &'a str) -> BoxFuture<'a, Result<Secured<Vec<String>>, DnsError>> {
        Box::pin(async move { Ok(Secured::insecure(Vec::new())) })
    }
}

fn records(list: &[(u16, &str)]) -> Result<MxAnswer, DnsError> {
    Ok(MxAnswer::Records(
        list.iter()
            .map(|(preference, exchange)| MxRecord {
                preference: *preference,
                exchange: exchange.to_string(),
            })
            .collect(),
    ))
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

fn outgoing(recipients: &[&str]) -> Outgoing {
    Outgoing {
        id: "MXTEST00001".into(),
        reverse_path: "bob@example.test".into(),
        recipients: recipients.iter().map(|r| r.to_string()).collect(),
        idempotency_key: None,
        trace: "Received: from test by relay.test; date\r\n".into(),
        body: message(None, "mx"),
        options: Default::default(),
        key_headers: Default::default(),
    }
}

fn settings() -> ClientSettings {
    ClientSettings {
        helo: "relay.test".into(),
        timeout: Duration::from_secs(10),
    }
}

async fn mx_deliver(t: &MxTransport, rcpts: &[&str]) -> Vec<RcptResult> {
    let msg = outgoing(rcpts);
    t.deliver(&msg, &msg.recipients).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mx_routing_to_loopback_servers() {
    // Two servers on one port, told apart by address: the preferred
    // exchanger on 127.0.0.2, the backup on 127.0.0.1.
    let backup = Tiny::start(
        "127.0.0.1:0".parse().expect("addr"),
        accept_all(),
        Duration::ZERO,
    );
    let port = backup.addr.port();
    let primary = Tiny::start(
        SocketAddr::new(ip("127.0.0.2"), port),
        accept_all(),
        Duration::ZERO,
    );
    let mut dns = FakeDns::default();
    dns.mx.insert(
        "example.net",
        records(&[(20, "backup.example.net"), (10, "mx1.example.net")]),
    );
    dns.mx.insert(
        "dead-primary.example",
        records(&[(10, "down.example"), (20, "backup.example.net")]),
    );
    dns.mx.insert("implicit.example", Ok(MxAnswer::NoRecords));
    dns.mx.insert("null.example", records(&[(0, "")]));
    dns.mx
        .insert("noaddr.example", records(&[(10, "ghost.example")]));
    dns.mx
        .insert("servfail.example", Err(DnsError("SERVFAIL".into())));
    // mx1's first address refuses connections; the second one answers.
    dns.ips
        .insert("mx1.example.net", vec![ip("127.0.0.3"), ip("127.0.0.2")]);
    dns.ips.insert("backup.example.net", vec![ip("127.0.0.1")]);
    dns.ips.insert("down.example", vec![ip("127.0.0.3")]);
    dns.ips.insert("implicit.example", vec![ip("127.0.0.1")]);
    let t = MxTransport::new(Arc::new(dns), MxSettings::new(port), settings()).expect("transport");

    let r = mx_deliver(&t, &["a@example.net", "b@EXAMPLE.net"]).await;
    assert!(r.iter().all(|r| r.status == Status::Delivered), "{r:?}");
    assert_eq!(
        r[0].next_hop.as_deref(),
        Some(format!("mx1.example.net [127.0.0.2:{port}] plaintext").as_str())
    );
    assert_eq!(
        primary.txns().len(),
        1,
        "lowest preference first, one transaction for the domain"
    );
    assert_eq!(primary.txns()[0].rcpts, ["a@example.net", "b@EXAMPLE.net"]);

    let r = mx_deliver(&t, &["c@dead-primary.example"]).await;
    assert_eq!(r[0].status, Status::Delivered, "{r:?}");
    let r = mx_deliver(&t, &["d@implicit.example"]).await;
    assert_eq!(r[0].status, Status::Delivered, "implicit MX: {r:?}");
    assert_eq!(
        r[0].next_hop.as_deref(),
        Some(format!("implicit.example [127.0.0.1:{port}] plaintext").as_str())
    );
    assert_eq!(backup.txns().len(), 2);

    let r = mx_deliver(&t, &["e@null.example"]).await;
    assert_eq!(r[0].status, Status::Failed, "{r:?}");
    assert!(r[0].reply.starts_with("556 5.1.10"), "{r:?}");
    let r = mx_deliver(&t, &["f@nx.example"]).await;
    assert!(
        r[0].status == Status::Failed && r[0].reply.starts_with("550 5.1.2"),
        "{r:?}"
    );
    let r = mx_deliver(&t, &["g@noaddr.example"]).await;
    assert!(
        r[0].status == Status::Failed && r[0].reply.contains("5.4.4"),
        "{r:?}"
    );
    let r = mx_deliver(&t, &["h@servfail.example"]).await;
    assert!(
        r[0].status == Status::Deferred && r[0].reply.contains("SERVFAIL"),
        "{r:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mx_uses_starttls_when_offered() {
    let b = Daemon::start(Options {
        trusted_network: Some(("127.0.0.0/8", "mx-in")),
        ..Options::default()
    });
    let mut dns = FakeDns::default();
    dns.mx
        .insert("tls.example", records(&[(10, "mx.tls.example")]));
    dns.ips.insert("mx.tls.example", vec![ip("127.0.0.1")]);
    let t = MxTransport::new(
        Arc::new(dns),
        MxSettings::new(b.starttls.port()),
        settings(),
    )
    .expect("transport");
    let r = mx_deliver(&t, &["a@tls.example"]).await;
    assert_eq!(r[0].status, Status::Delivered, "{r:?}");
    let ids = b.queue_ids_for_key("smtp-once-MXTEST00001");
    assert_eq!(ids.len(), 1);
    let (trace, _) = stored(&b, &ids[0]);
    assert!(trace.contains("with ESMTPS id"), "TLS was used: {trace}");
}

// ------------------------------------------- in process, on a test clock

/// A worker in this process on `config`'s SQLite store, reading "now" from
/// `clock`.
async fn worker_on(
    config: &smtp_once::config::Config,
    store: Arc<smtp_once::store::sqlite::SqliteStore>,
    clock: Arc<smtp_once::clock::ManualClock>,
) -> smtp_once::delivery::worker::Worker {
    smtp_once::delivery::worker::Worker::start_with_clock(
        config,
        store,
        smtp_once::webhook::Router::default(),
        Arc::new(smtp_once::backlog::Backlog::unlimited()),
        clock,
    )
    .await
    .expect("worker")
}

/// Waits (polling the file, never on a timer of the worker's) until `id`'s
/// row satisfies `done`.
async fn wait_row(
    config: &smtp_once::config::Config,
    id: &str,
    what: &str,
    done: impl Fn(&common::in_process::Row) -> bool,
) -> common::in_process::Row {
    wait_until(&format!("{id}: {what}"), 20, || {
        let row = common::in_process::row(config, id);
        done(&row).then_some(row)
    })
    .await
}

/// The retry schedule on the worker's clock: each next attempt is due
/// exactly one step of `retry_schedule` after the attempt before it, and
/// is not made a millisecond earlier. Daemon tests use a 200 ms schedule
/// on the wall clock instead (`FAST`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_attempts_follow_the_retry_schedule_on_the_workers_clock() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = common::in_process::config(
        dir.path(),
        &format!(
            "{}retry_schedule = [\"1h\", \"2h\"]\npoll_interval = \"20ms\"\n",
            smarthost(format!("127.0.0.1:{}", free_port()), None)
        ),
    );
    let store = common::in_process::store(&config);
    let clock = common::in_process::clock();
    let worker = worker_on(&config, store.clone(), clock.clone()).await;
    let t0 = smtp_once::clock::Clock::now_millis(&*clock);
    const HOUR: i64 = 3_600_000;

    common::in_process::queue_message(&store, "M1", "r@example.net", t0).await;
    let first = wait_row(&config, "M1", "first attempt", |r| r.attempts == 1).await;
    assert_eq!(first.state, "deferred", "the smarthost is down");
    assert_eq!(first.next_attempt_at, Some(t0 + HOUR), "first step: 1h");

    // A millisecond early: not due. A message queued now shows that the
    // worker claimed at this time (and left M1 alone).
    clock.advance(Duration::from_millis(HOUR as u64 - 1));
    let probe_at = t0 + HOUR - 1;
    common::in_process::queue_message(&store, "P1", "r@example.net", probe_at).await;
    wait_row(&config, "P1", "the probe's attempt", |r| r.attempts == 1).await;
    assert_eq!(
        common::in_process::row(&config, "M1").attempts,
        1,
        "not yet due"
    );

    clock.advance(Duration::from_millis(1));
    let second = wait_row(&config, "M1", "second attempt", |r| r.attempts == 2).await;
    assert_eq!(second.state, "deferred");
    assert_eq!(
        second.next_attempt_at,
        Some(t0 + HOUR + 2 * HOUR),
        "second step: 2h after the second attempt"
    );
    // The last step repeats.
    clock.advance(Duration::from_millis(2 * HOUR as u64));
    let third = wait_row(&config, "M1", "third attempt", |r| r.attempts == 3).await;
    assert_eq!(third.next_attempt_at, Some(t0 + 3 * HOUR + 2 * HOUR));
    worker.shutdown().await;
}

/// A lease that ran out is claimed again on the worker's clock: a message
/// another claimant took (a node that died mid-delivery) waits while its
/// lease lasts, and is delivered once it has ended. On SQLite the worker
/// takes back every lease at start, so the claim is made after it started
/// (for a message due later than the worker's now, so the worker cannot
/// take it first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_is_claimed_again_on_the_workers_clock() {
    use smtp_once::store::DeliveryQueue;

    let dir = tempfile::tempdir().expect("tempdir");
    let config = common::in_process::config(
        dir.path(),
        "[relay]\nmode = \"file\"\ndir = \"outbox\"\npoll_interval = \"20ms\"\n",
    );
    let (store, clock) = (
        common::in_process::store(&config),
        common::in_process::clock(),
    );
    let worker = worker_on(&config, store.clone(), clock.clone()).await;
    let t0 = smtp_once::clock::Clock::now_millis(&*clock);
    const MINUTE: i64 = 60_000;
    const LEASE: i64 = 30 * MINUTE;

    common::in_process::queue_message(&store, "L1", "r@example.net", t0 + MINUTE).await;
    let taken = store
        .claim(t0 + MINUTE, t0 + MINUTE + LEASE, 10, Vec::new())
        .await
        .expect("claim");
    assert_eq!(taken.len(), 1, "the other claimant has it");

    // Due, but leased until t0 + 31 min.
    clock.advance(Duration::from_millis((MINUTE + LEASE - 1) as u64));
    common::in_process::queue_message(&store, "P1", "r@example.net", t0).await;
    wait_row(&config, "P1", "the probe's delivery", |r| {
        r.state == "delivered"
    })
    .await;
    let leased = common::in_process::row(&config, "L1");
    assert_eq!((leased.state.as_str(), leased.attempts), ("delivering", 0));

    clock.advance(Duration::from_millis(1));
    let done = wait_row(&config, "L1", "delivery after the lease", |r| {
        r.state == "delivered"
    })
    .await;
    assert_eq!(done.attempts, 1);
    let written = dir.path().join("outbox").join("L1.eml");
    assert!(written.exists(), "delivered by this worker");
    worker.shutdown().await;
}

/// Issue 24: by default a delivered message's body leaves with its last
/// recipient's final outcome (the row and its history stay for `status`),
/// and an identical retry under its key is still a replay.
#[tokio::test]
async fn a_delivered_message_keeps_no_body_by_default() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Daemon::start(Options {
        relay: Some(format!(
            "[relay]\nmode = \"file\"\ndir = \"{}\"\nkeep_bodies = false\n",
            dir.path().display()
        )),
        extra: FAST.into(),
        store: common::Store::Sqlite,
        ..Options::default()
    });
    let rcpts = ["x@example.net"];
    let keyed = message(Some("body-goes-k1"), "one");
    let id = submit(&d, "bob", "bob@example.test", &rcpts, &keyed).await;
    assert_eq!(wait_state(&d, &id, "delivered").await, 1);
    let bodies = d.count(&format!(
        "SELECT COUNT(*) FROM message_body WHERE queue_id = '{id}'"
    ));
    assert_eq!(bodies, 0, "the body went with the delivery");
    assert_eq!(d.queue_count(), 1, "the row stays for status");
    assert_eq!(
        submit(&d, "bob", "bob@example.test", &rcpts, &keyed).await,
        id,
        "a retry is still answered from the ledger"
    );
    let status = d.cli(&["status", &id]);
    assert!(status.status.success(), "{status:?}");
    assert!(String::from_utf8_lossy(&status.stdout).contains("state:        delivered"));
}
