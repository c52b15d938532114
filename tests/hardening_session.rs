//! Issue 8, the session's share: content smuggling, NUL bytes, empty and
//! BINARYMIME messages, the junk-command limit and the in-flight memory
//! budget, each against the real daemon.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

mod common;

use common::{Client, Daemon, Options, message};

/// A message of about `size` bytes in CRLF lines, from bob.
fn big_message(key: &str, size: usize) -> Vec<u8> {
    let head = format!(
        "From: bob@example.test\r\nTo: dest@example.net\r\nSubject: big\r\nX-Bird-Idempotency-Key: {key}\r\n\r\n"
    );
    let line = format!("{}\r\n", "x".repeat(998));
    let mut m = head.into_bytes();
    while m.len() + line.len() <= size {
        m.extend_from_slice(line.as_bytes());
    }
    m
}

/// MAIL and RCPT for `user`, both expected to succeed.
async fn open_transaction(c: &mut Client, from: &str) {
    let r = c.cmd(&format!("MAIL FROM:<{from}>")).await;
    assert_eq!(r.code, 250, "{r:?}");
    let r = c.cmd("RCPT TO:<dest@example.net>").await;
    assert_eq!(r.code, 250, "{r:?}");
}

async fn bdat(c: &mut Client, chunk: &[u8], last: bool) -> common::Reply {
    let mut bytes = format!(
        "BDAT {}{}\r\n",
        chunk.len(),
        if last { " LAST" } else { "" }
    )
    .into_bytes();
    bytes.extend_from_slice(chunk);
    c.send(&bytes).await;
    c.read_reply().await
}

// ------------------------------------------------------------ smuggling

#[tokio::test]
async fn transaction_smuggled_behind_dot_cr_cr_lf_is_never_queued() {
    let d = Daemon::start(Options::default());
    for end in [&b".\r\r\n"[..], b".\n", b"\n.\r\n"] {
        let mut c = Client::login(d.plain, "bob").await;
        open_transaction(&mut c, "bob@example.test").await;
        assert_eq!(c.cmd("DATA").await.code, 354);
        let mut bytes = b"Subject: first\r\n\r\nline\r\n".to_vec();
        bytes.extend_from_slice(end);
        bytes.extend_from_slice(
            b"MAIL FROM:<bob@example.test>\r\nRCPT TO:<victim@example.net>\r\nDATA\r\nSubject: smuggled\r\n\r\nbody\r\n.\r\n",
        );
        c.send(&bytes).await;
        let r = c.read_reply().await;
        assert_eq!(r.code, 554, "{end:?}: {r:?}");
        assert!(r.has("5.6.0"), "{r:?}");
        assert!(
            c.is_closed().await,
            "{end:?}: the connection must close after a bare CR/LF"
        );
    }
    assert_eq!(d.queue_count(), 0, "nothing smuggled was queued");
    assert!(
        d.log()
            .contains("message refused: bare CR or LF in content; closing the connection"),
        "{}",
        d.log()
    );
}

#[tokio::test]
async fn bare_cr_or_lf_in_bdat_is_refused_and_closes() {
    let d = Daemon::start(Options::default());
    let cases: [&[u8]; 3] = [
        b"Subject: x\r\n\r\nline\r.\r\nMAIL FROM:<a@b>\r\n",
        b"Subject: x\r\n\r\nline\n.\nmore\r\n",
        b"Subject: x\r\n\r\nends with CR\r",
    ];
    for content in cases {
        let mut c = Client::login(d.plain, "bob").await;
        open_transaction(&mut c, "bob@example.test").await;
        let r = bdat(&mut c, content, true).await;
        assert_eq!(r.code, 554, "{content:?}: {r:?}");
        assert!(r.has("5.6.0"), "{r:?}");
        assert!(c.is_closed().await, "{content:?}: connection left open");
    }
    // In a first chunk, before LAST: refused right after that chunk.
    let mut c = Client::login(d.plain, "bob").await;
    open_transaction(&mut c, "bob@example.test").await;
    let r = bdat(&mut c, b"Subject: x\r\n\r\nbare\nlf\r\n", false).await;
    assert_eq!(r.code, 554, "{r:?}");
    assert!(c.is_closed().await);
    assert_eq!(d.queue_count(), 0);
}

// ------------------------------------------------------ NUL and empty

#[tokio::test]
async fn nul_bytes_in_the_body_are_refused() {
    let d = Daemon::start(Options::default());
    let mut c = Client::login(d.plain, "bob").await;
    let mut m = message(None, "before");
    m.extend_from_slice(b"nul\0here\r\n");
    let r = c
        .submit("bob@example.test", &["dest@example.net"], &m)
        .await;
    assert_eq!(r.code, 554, "{r:?}");
    assert!(r.has("5.6.0") && r.has("NUL"), "{r:?}");
    // Not a framing problem: the session goes on.
    assert_eq!(c.cmd("NOOP").await.code, 250);
    open_transaction(&mut c, "bob@example.test").await;
    let r = bdat(&mut c, &m, true).await;
    assert_eq!(r.code, 554, "{r:?}");
    assert_eq!(d.queue_count(), 0);
    assert!(d.log().contains("NUL byte in content"), "{}", d.log());
}

#[tokio::test]
async fn bdat_0_last_alone_is_refused_as_empty() {
    let d = Daemon::start(Options::default());
    let mut c = Client::login(d.plain, "bob").await;
    open_transaction(&mut c, "bob@example.test").await;
    let r = bdat(&mut c, b"", true).await;
    assert_eq!(r.code, 554, "{r:?}");
    assert!(r.has("5.6.0") && r.has("empty"), "{r:?}");
    assert_eq!(d.queue_count(), 0);
    // After chunks with content, BDAT 0 LAST ends a normal message.
    open_transaction(&mut c, "bob@example.test").await;
    let m = message(None, "chunked");
    assert_eq!(bdat(&mut c, &m, false).await.code, 250);
    let r = bdat(&mut c, b"", true).await;
    assert_eq!(r.code, 250, "{r:?}");
    assert_eq!(d.queue_count(), 1);
    assert!(d.log().contains("message rejected: empty"), "{}", d.log());
}

#[tokio::test]
async fn body_binarymime_is_refused_8bitmime_is_not() {
    let d = Daemon::start(Options::default());
    let mut c = Client::login(d.plain, "bob").await;
    let ehlo = c.ehlo().await;
    assert!(!ehlo.has("BINARYMIME"), "not offered: {ehlo:?}");
    let r = c.cmd("MAIL FROM:<bob@example.test> BODY=BINARYMIME").await;
    assert!(r.code == 555 || r.code == 504, "{r:?}");
    assert!(r.has("5.5.4"), "{r:?}");
    let r = c.cmd("MAIL FROM:<bob@example.test> BODY=8BITMIME").await;
    assert_eq!(r.code, 250, "{r:?}");
    assert!(d.log().contains("BINARYMIME"), "{}", d.log());
}

// --------------------------------------------------------------- junk

#[tokio::test]
async fn junk_commands_beyond_the_default_limit_close_the_session() {
    let d = Daemon::start(Options::default());
    let mut c = Client::login(d.plain, "bob").await; // its EHLO is junk #1
    let kinds = ["NOOP", "VRFY bob", "RSET", "HELP"];
    let batch: String = (0..200).map(|i| format!("{}\r\n", kinds[i % 4])).collect();
    c.send(batch.as_bytes()).await;
    let mut answered = 0;
    let last = loop {
        let r = c.read_reply().await;
        if r.code >= 400 {
            break r;
        }
        answered += 1;
    };
    assert_eq!(answered, 99, "default limit 100, EHLO included");
    assert_eq!(last.code, 421, "{last:?}");
    assert!(last.has("4.7.0 Too many commands"), "{last:?}");
    assert!(c.is_closed().await);
    assert!(d.log().contains("too many commands"), "{}", d.log());
}

#[tokio::test]
async fn an_accepted_message_resets_the_junk_count() {
    let d = Daemon::start(Options {
        extra: "[limits]\nmax_junk_commands = 10\n".into(),
        ..Options::default()
    });
    let mut c = Client::login(d.plain, "bob").await;
    for round in 0..3 {
        for _ in 0..8 {
            assert_eq!(c.cmd("NOOP").await.code, 250, "round {round}");
        }
        let m = message(Some(&format!("junk-{round}")), "body");
        let r = c
            .submit("bob@example.test", &["dest@example.net"], &m)
            .await;
        assert_eq!(r.code, 250, "{r:?}");
    }
    for _ in 0..10 {
        assert_eq!(c.cmd("NOOP").await.code, 250);
    }
    assert_eq!(c.cmd("NOOP").await.code, 421);
}

// ------------------------------------------------------ memory budget

/// Holds `size` bytes of an unfinished message in the daemon (one BDAT
/// chunk, acknowledged, so the bytes are known to be in).
async fn hold(d: &Daemon, user: &str, key: &str, size: usize) -> (Client, Vec<u8>) {
    let mut c = Client::login(d.plain, user).await;
    open_transaction(&mut c, &format!("{user}@example.test")).await;
    let m = big_message(key, size + 50_000);
    let r = bdat(&mut c, &m[..size], false).await;
    assert_eq!(r.code, 250, "{r:?}");
    (c, m[size..].to_vec())
}

#[tokio::test]
async fn global_in_flight_budget_refuses_the_message_over_it_with_452() {
    let d = Daemon::start(Options {
        extra: "[limits]\nmax_bytes_in_flight = 2000000\n".into(),
        ..Options::default()
    });
    let (mut a, rest_a) = hold(&d, "bob", "held-a", 600_000).await;
    let (mut b, rest_b) = hold(&d, "carol", "held-b", 600_000).await;
    // 2 x 600 kB held: a third message of 900 kB does not fit.
    let mut c = Client::login(d.plain, "bob").await;
    let over = big_message("over", 900_000);
    let r = c
        .submit("bob@example.test", &["dest@example.net"], &over)
        .await;
    assert_eq!(r.code, 452, "{r:?}");
    assert!(r.has("4.3.1 Insufficient system storage"), "{r:?}");
    assert_eq!(c.cmd("NOOP").await.code, 250, "the session goes on");
    // The held messages still complete.
    assert_eq!(bdat(&mut a, &rest_a, true).await.code, 250);
    assert_eq!(bdat(&mut b, &rest_b, true).await.code, 250);
    // Their bytes are back: the same 900 kB message now goes through.
    let r = c
        .submit("bob@example.test", &["dest@example.net"], &over)
        .await;
    assert_eq!(r.code, 250, "{r:?}");
    assert_eq!(d.queue_count(), 3);
    assert!(
        d.log().contains("in-flight memory budget used up"),
        "{}",
        d.log()
    );
}

#[tokio::test]
async fn per_account_in_flight_budget_holds_one_account_not_the_others() {
    let d = Daemon::start(Options {
        extra: "[limits]\nmax_bytes_in_flight_per_account = 1000000\n".into(),
        ..Options::default()
    });
    let (mut held, rest) = hold(&d, "bob", "bob-held", 600_000).await;
    let m = big_message("second", 600_000);
    let mut bob = Client::login(d.plain, "bob").await;
    let r = bob
        .submit("bob@example.test", &["dest@example.net"], &m)
        .await;
    assert_eq!(r.code, 452, "bob is over his share: {r:?}");
    let mut carol = Client::login(d.plain, "carol").await;
    let r = carol
        .submit("carol@example.test", &["dest@example.net"], &m)
        .await;
    assert_eq!(r.code, 250, "carol has her own share: {r:?}");
    assert_eq!(bdat(&mut held, &rest, true).await.code, 250);
    let r = bob
        .submit("bob@example.test", &["dest@example.net"], &m)
        .await;
    assert_eq!(r.code, 250, "bob's share is free again: {r:?}");
}

#[tokio::test]
async fn empty_bdat_chunks_count_as_junk() {
    let d = Daemon::start(Options {
        extra: "[limits]\nmax_junk_commands = 10\n".into(),
        ..Options::default()
    });
    let mut c = Client::login(d.plain, "bob").await; // EHLO: junk #1
    open_transaction(&mut c, "bob@example.test").await;
    c.send("BDAT 0\r\n".repeat(50).as_bytes()).await;
    for _ in 0..9 {
        let r = c.read_reply().await;
        assert_eq!(r.code, 250, "{r:?}");
    }
    let r = c.read_reply().await;
    assert_eq!(r.code, 421, "{r:?}");
    assert!(c.is_closed().await);
}
