//! Issue 21 item 1: "Postfix in front breaks retries". An application that
//! sends through a local MTA reaches us with a fresh `Received:` line on
//! every attempt; under the same key that is the same message (SPEC
//! section 3: trace and transit fields are not part of the identity). And
//! the MTA's bounces (`MAIL FROM:<>`) are accepted from an authenticated
//! or trusted client, so a refusal is not silently lost.

mod common;

use common::{Client, Daemon, Options};

const FROM: &str = "alice@example.test";
const TO: &[&str] = &["dest@example.net"];

/// The author's message, as the application builds it.
const AUTHOR: &str = "From: alice@example.test\r\nTo: dest@example.net\r\n\
                      Date: Tue, 01 Dec 2026 03:00:00 +0000\r\n\
                      Message-ID: <m1@example.test>\r\nSubject: invoice 42\r\n\
                      X-Bird-Idempotency-Key: {key}\r\n\r\nYour invoice.\r\n";

fn author(key: &str) -> String {
    AUTHOR.replace("{key}", key)
}

/// What a Postfix hop puts in front: its own queue id and time each time.
fn received(queue_id: &str, second: u8) -> String {
    format!(
        "Received: from app.example.test (localhost [127.0.0.1])\r\n\
         \tby mta.example.test (Postfix) with ESMTP id {queue_id}\r\n\
         \tfor <dest@example.net>; Tue, 01 Dec 2026 03:00:{second:02} +0000 (UTC)\r\n"
    )
}

// Issue 21 item 1 (trace headers): the same keyed message through a hop
// twice, with another Received line (and a DKIM signature the second time),
// is a replay of the first, not E01005.
#[tokio::test]
async fn trace_headers_added_by_a_hop_do_not_make_a_conflict() {
    let d = Daemon::start(Options::default());
    let mut c = Client::login(d.plain, "alice").await;
    let first = format!("{}{}", received("4QABC1", 1), author("via-mta-1"));
    let r1 = c.submit(FROM, TO, first.as_bytes()).await;
    assert_eq!(r1.code, 250, "{r1:?}");
    let id = r1.queue_id().expect("queue id");

    let second = format!(
        "DKIM-Signature: v=1; a=rsa-sha256; d=example.test; s=s1;\r\n\tb=abc\r\n{}{}{}",
        received("4QXYZ9", 7),
        received("4QXYZ8", 6),
        author("via-mta-1")
    );
    let r2 = c.submit(FROM, TO, second.as_bytes()).await;
    assert!(r2.is_replay(), "{r2:?}\n{}", d.log());
    assert_eq!(r2.queue_id().as_deref(), Some(id.as_str()));
    // Without any trace field at all: the same request too.
    let r3 = c.submit(FROM, TO, author("via-mta-1").as_bytes()).await;
    assert!(r3.is_replay(), "{r3:?}");
    // The author's own fields still count.
    let changed = format!("{}{}", received("4QXYZ7", 9), author("via-mta-1"))
        .replace("invoice 42", "invoice 43");
    let r4 = c.submit(FROM, TO, changed.as_bytes()).await;
    assert!(r4.has("E01005"), "{r4:?}");
    c.quit().await;
    assert_eq!(d.queue_count(), 1);
}

// Issue 21 item 1: `transit_headers = []` keeps every field counting, and
// an entry stored that way (or before the rule existed) still replays for a
// byte-identical retry after the switch to the default.
#[tokio::test]
async fn entries_stored_with_trace_headers_counting_still_replay() {
    let mut d = Daemon::start(Options {
        idempotency_extra: "transit_headers = []".into(),
        ..Options::default()
    });
    let m = format!("{}{}", received("4QOLD1", 1), author("upgrade-trace"));
    let mut c = Client::login(d.plain, "alice").await;
    let first = c.submit(FROM, TO, m.as_bytes()).await;
    assert_eq!(first.code, 250, "{first:?}");
    let id = first.queue_id().expect("queue id");
    let other_hop = format!("{}{}", received("4QOLD2", 2), author("upgrade-trace"));
    let strict = c.submit(FROM, TO, other_hop.as_bytes()).await;
    assert!(strict.has("E01005"), "{strict:?}");
    c.quit().await;

    let config = std::fs::read_to_string(&d.config_path).expect("config");
    std::fs::write(&d.config_path, config.replace("transit_headers = []", "")).expect("config");
    d.restart();

    let mut c = Client::login(d.plain, "alice").await;
    let again = c.submit(FROM, TO, m.as_bytes()).await;
    assert!(again.is_replay(), "{again:?}\n{}", d.log());
    assert_eq!(again.queue_id().as_deref(), Some(id.as_str()));
    c.quit().await;
    assert_eq!(d.queue_count(), 1);
}

// Issue 21 item 1 (bounces): `MAIL FROM:<>` from an account limited to
// `*@example.test` was `553`, so the bounce a Postfix in front sends when it
// gives up was lost. It is accepted now; the `From:` header rule still
// applies, and without authentication it is still `530`.
#[tokio::test]
async fn null_reverse_path_is_accepted_from_an_authenticated_account() {
    let d = Daemon::start(Options::default());
    let bounce = b"From: MAILER-DAEMON@example.test (Mail Delivery System)\r\n\
                   To: alice@example.test\r\nSubject: Undelivered Mail Returned to Sender\r\n\
                   Content-Type: text/plain\r\n\r\nThis is the mail system.\r\n";
    let mut c = Client::login(d.plain, "alice").await;
    let r = c.submit("", &["alice@example.test"], bounce).await;
    assert_eq!(r.code, 250, "{r:?}\n{}", d.log());
    // The From: header is still the account's to answer for.
    let forged = b"From: ceo@victim.test\r\nTo: x@example.net\r\n\r\nhi\r\n";
    let r = c.submit("", TO, forged).await;
    assert_eq!(r.code, 553, "{r:?}");
    c.quit().await;

    let mut anon = Client::connect(d.plain).await;
    anon.ehlo().await;
    let r = anon.cmd("MAIL FROM:<>").await;
    assert_eq!(r.code, 530, "{r:?}");
    anon.quit().await;
    assert_eq!(d.queue_count(), 1);
    let stored: String = d
        .db()
        .query_row("SELECT reverse_path FROM queue", [], |r| r.get(0))
        .expect("queued bounce");
    assert_eq!(stored, "");
}
