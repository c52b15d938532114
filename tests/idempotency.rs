//! Exactly-once acceptance against the real daemon: every row of the SPEC
//! section 4 table, workspaces, fingerprints, concurrency, lost replies,
//! kill -9, restart, retention and an unreachable ledger. Runs on SQLite, and
//! on PostgreSQL under `SMTP_ONCE_TEST_STORE=postgres` (scripts/test.sh runs
//! both).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{Client, Daemon, Options, message};

const FROM: &str = "alice@example.test";
const TO: &[&str] = &["dest@example.net"];

/// A foreign transaction holding a lock on the store: SQLite's `BEGIN
/// IMMEDIATE` (the write lock; readers go on), or on PostgreSQL `LOCK TABLE
/// ledger` in `pg_mode` (`EXCLUSIVE`: reads go on, writes wait; `ACCESS
/// EXCLUSIVE`: reads wait too).
enum Blocker {
    Sqlite(rusqlite::Connection),
    Pg(tokio_postgres::Client),
}

impl Blocker {
    async fn hold(d: &Daemon, pg_mode: &str) -> Blocker {
        match &d.pg {
            Some(db) => {
                let c = db.client().await;
                c.batch_execute(&format!("BEGIN; LOCK TABLE ledger IN {pg_mode} MODE"))
                    .await
                    .expect("lock");
                Blocker::Pg(c)
            }
            None => {
                let c = d.db();
                c.execute_batch("BEGIN IMMEDIATE").expect("lock");
                Blocker::Sqlite(c)
            }
        }
    }

    async fn release(self) {
        match self {
            Blocker::Sqlite(c) => c.execute_batch("ROLLBACK").expect("unlock"),
            Blocker::Pg(c) => c.batch_execute("ROLLBACK").await.expect("unlock"),
        }
    }
}

async fn send_as(d: &Daemon, user: &str, from: &str, rcpts: &[&str], m: &[u8]) -> common::Reply {
    let mut c = Client::login(d.plain, user).await;
    let r = c.submit(from, rcpts, m).await;
    c.quit().await;
    r
}

#[tokio::test]
async fn first_replay_conflict_and_no_key() {
    let d = Daemon::start(Options::default());
    let m = message(Some("welcome-user/usr_abc123"), "hello");
    let first = send_as(&d, "alice", FROM, TO, &m).await;
    assert_eq!(first.code, 250, "{first:?}");
    assert!(!first.is_replay());
    let id = first.queue_id().expect("queue id");

    let replay = send_as(&d, "alice", FROM, TO, &m).await;
    assert_eq!(replay.code, 250);
    assert_eq!(replay.lines[0], "250-2.0.0 Idempotency-Replay: true");
    assert_eq!(
        replay.raw,
        format!("250-2.0.0 Idempotency-Replay: true\r\n{}", first.raw),
        "the stored reply, byte for byte, after the marker"
    );
    assert_eq!(replay.queue_id(), Some(id.clone()));

    let other = message(Some("welcome-user/usr_abc123"), "hello, changed");
    let conflict = send_as(&d, "alice", FROM, TO, &other).await;
    assert_eq!(conflict.code, 550, "{conflict:?}");
    assert!(conflict.has("E01005") && conflict.has("5.6.0"));

    // Without a key, identical messages are separate operations.
    let plain = message(None, "no key");
    let a = send_as(&d, "alice", FROM, TO, &plain).await;
    let b = send_as(&d, "alice", FROM, TO, &plain).await;
    assert_ne!(a.queue_id(), b.queue_id());
    assert_eq!(d.queue_count(), 3);
    assert_eq!(d.queue_ids_for_key("welcome-user/usr_abc123"), [id]);
    let log = d.log();
    assert!(log.contains("replayed stored reply") && log.contains("E01005"));
    assert!(
        !log.contains("welcome-user/usr_abc123"),
        "keys are logged as hashes only"
    );
}

/// A small message goes straight to its commit and learns that its key is
/// held from it; a big one (over 32 KiB) is looked up first. Both answer
/// alike: the stored reply, or E01005 for another message.
#[tokio::test]
async fn small_and_big_messages_replay_and_conflict_alike() {
    let d = Daemon::start(Options::default());
    for (key, size) in [("small-one", 100), ("big-one", 40 * 1024)] {
        let body = "b".repeat(size);
        let m = message(Some(key), &body);
        let first = send_as(&d, "alice", FROM, TO, &m).await;
        assert_eq!(first.code, 250, "{key}: {first:?}");
        let replay = send_as(&d, "alice", FROM, TO, &m).await;
        assert!(replay.is_replay(), "{key}: {replay:?}");
        assert_eq!(replay.queue_id(), first.queue_id(), "{key}");
        let other = message(Some(key), &format!("{body}, changed"));
        let conflict = send_as(&d, "alice", FROM, TO, &other).await;
        assert!(
            conflict.code == 550 && conflict.has("E01005"),
            "{key}: {conflict:?}"
        );
        assert_eq!(d.queue_ids_for_key(key).len(), 1, "{key}");
    }
    assert_eq!(d.queue_count(), 2);
    assert_eq!(d.log().matches("replayed stored reply").count(), 2);
    assert_eq!(d.log().matches("E01005").count(), 2);
}

#[tokio::test]
async fn key_validation_errors() {
    let d = Daemon::start(Options::default());
    let ok_key: String = "日".repeat(255);
    let r = send_as(&d, "alice", FROM, TO, &message(Some(&ok_key), "255 chars")).await;
    assert_eq!(r.code, 250, "255 multibyte characters are valid: {r:?}");
    let long_key: String = "k".repeat(256);
    let r = send_as(&d, "alice", FROM, TO, &message(Some(&long_key), "256")).await;
    assert_eq!(r.code, 554, "{r:?}");
    assert!(r.has("E01001"));

    let twice = b"From: alice@example.test\r\nX-Bird-Idempotency-Key: a\r\nx-bird-idempotency-key:  b\r\n\r\nbody\r\n";
    let r = send_as(&d, "alice", FROM, TO, twice).await;
    assert_eq!(r.code, 554, "{r:?}");
    assert!(r.has("E01001"));
    let same = b"From: alice@example.test\r\nX-Bird-Idempotency-Key: a\r\nX-BIRD-IDEMPOTENCY-KEY:\r\n  a\r\n\r\nbody\r\n";
    let r = send_as(&d, "alice", FROM, TO, same).await;
    assert_eq!(r.code, 250, "same value twice (folded) is fine: {r:?}");
    // Rejections are not stored: the key is still free.
    let r = send_as(&d, "alice", FROM, TO, &message(Some(&long_key[..200]), "x")).await;
    assert_eq!(r.code, 250);
    assert_eq!(d.queue_count(), 3);
}

#[tokio::test]
async fn key_in_progress_gets_e01004() {
    let d = Daemon::start(Options::default());
    // Hold the database write lock so the first commit waits in the writer.
    let blocker = Blocker::hold(&d, "EXCLUSIVE").await;
    let m = message(Some("slow-key"), "slow");
    let mut first = Client::login(d.plain, "alice").await;
    first.cmd(&format!("MAIL FROM:<{FROM}>")).await;
    first.cmd("RCPT TO:<dest@example.net>").await;
    first.cmd("DATA").await;
    first.send(&common::dot_stuff(&m)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let second = send_as(&d, "alice", FROM, TO, &m).await;
    assert_eq!(second.code, 451, "{second:?}");
    assert!(second.has("E01004") && second.has("4.5.0"));

    blocker.release().await;
    let r = first.read_reply().await;
    assert_eq!(r.code, 250, "{r:?}");
    let again = send_as(&d, "alice", FROM, TO, &m).await;
    assert!(again.is_replay(), "{again:?}");
    assert_eq!(d.queue_count(), 1);
}

#[tokio::test]
async fn transient_commit_failure_releases_the_key() {
    let d = Daemon::start(Options::default());
    let m = message(Some("fails-once"), "body");
    if d.pg.is_some() {
        d.execute(
            "CREATE FUNCTION fail_once() RETURNS trigger LANGUAGE plpgsql
               AS $$ BEGIN RAISE EXCEPTION 'simulated I/O failure'; END $$;
             CREATE TRIGGER fail_once BEFORE INSERT ON queue
               FOR EACH ROW EXECUTE FUNCTION fail_once();",
        );
    } else {
        d.execute(
            "CREATE TRIGGER fail_once BEFORE INSERT ON queue
             BEGIN SELECT RAISE(FAIL, 'simulated I/O failure'); END;",
        );
    }
    let r = send_as(&d, "alice", FROM, TO, &m).await;
    assert_eq!(r.code, 451, "{r:?}");
    assert!(r.has("4.3.0"));
    assert!(
        !r.has("E01033"),
        "a failure while committing is not 'unavailable'"
    );
    assert_eq!(d.queue_count(), 0);
    let ledger = d.count("SELECT COUNT(*) FROM ledger");
    assert_eq!(ledger, 0, "4xx replies are never stored");

    d.execute(if d.pg.is_some() {
        "DROP TRIGGER fail_once ON queue"
    } else {
        "DROP TRIGGER fail_once"
    });
    let r = send_as(&d, "alice", FROM, TO, &m).await;
    assert_eq!(r.code, 250, "{r:?}");
    assert!(!r.is_replay(), "the retry is processed as new");
    assert_eq!(d.queue_count(), 1);
}

#[tokio::test]
async fn unreachable_ledger_gets_e01033_and_queues_nothing() {
    let d = Daemon::start(Options::default());
    let m = message(Some("k-unavailable"), "x");
    // A foreign process holds the lock past the store's wait (SQLite's busy
    // timeout; on PostgreSQL a lock that even reads of the ledger wait for).
    let blocker = Blocker::hold(&d, "ACCESS EXCLUSIVE").await;
    let r = tokio::time::timeout(Duration::from_secs(20), send_as(&d, "alice", FROM, TO, &m))
        .await
        .expect("a reply within 20 s while a foreign transaction holds the lock");
    assert_eq!(r.code, 451, "{r:?}");
    assert!(r.has("E01033") && r.has("4.3.0"), "{r:?}");
    blocker.release().await;
    assert_eq!(d.queue_count(), 0);

    // The ledger cannot be read at all.
    d.hide_ledger();
    let r = send_as(&d, "alice", FROM, TO, &m).await;
    assert!(r.code == 451 && r.has("E01033"), "{r:?}");
    assert_eq!(d.queue_count(), 0);
    d.restore_ledger();

    let r = send_as(&d, "alice", FROM, TO, &m).await;
    assert_eq!(r.code, 250, "{r:?}");
    assert!(!r.is_replay());
    assert!(d.log().contains("E01033"));
}

#[tokio::test]
async fn stored_permanent_rejection_is_replayed() {
    let d = Daemon::start(Options::default());
    let bad = b"From: mallory@elsewhere.test\r\nX-Bird-Idempotency-Key: from-check\r\n\r\nhi\r\n";
    let r = send_as(&d, "alice", FROM, TO, bad).await;
    assert_eq!(r.code, 553, "{r:?}");
    assert!(r.has("5.7.1"));
    let again = send_as(&d, "alice", FROM, TO, bad).await;
    assert_eq!(again.lines[0], "553-5.7.1 Idempotency-Replay: true");
    assert_eq!(again.last(), r.last());
    let fixed = b"From: alice@example.test\r\nX-Bird-Idempotency-Key: from-check\r\n\r\nhi\r\n";
    let r = send_as(&d, "alice", FROM, TO, fixed).await;
    assert_eq!(r.code, 550, "a corrected message needs a new key: {r:?}");
    assert!(r.has("E01005"));
    // A restricted account must name an allowed sender in From: at all.
    let no_from = b"To: dest@example.net\r\nX-Bird-Idempotency-Key: no-from\r\n\r\nhi\r\n";
    let r = send_as(&d, "alice", FROM, TO, no_from).await;
    assert_eq!(r.code, 553, "{r:?}");
    assert!(r.has("no From: address"), "{r:?}");
    assert!(send_as(&d, "alice", FROM, TO, no_from).await.is_replay());
    // MAIL FROM outside the account's senders is refused before any key.
    let mut c = Client::login(d.plain, "alice").await;
    let r = c.cmd("MAIL FROM:<mallory@elsewhere.test>").await;
    assert_eq!(r.code, 553, "{r:?}");
    assert_eq!(d.queue_count(), 0);
}

#[tokio::test]
async fn workspaces_isolate_keys() {
    let d = Daemon::start(Options::default());
    let m = message(Some("shared-key"), "same bytes");
    let alice = send_as(&d, "alice", FROM, TO, &m).await;
    let bob = send_as(&d, "bob", FROM, TO, &m).await;
    assert!(
        bob.is_replay(),
        "alice and bob share workspace acme: {bob:?}"
    );
    assert_eq!(bob.queue_id(), alice.queue_id());
    let carol = send_as(&d, "carol", FROM, TO, &m).await;
    assert_eq!(carol.code, 250);
    assert!(!carol.is_replay(), "globex never sees acme's reply");
    assert_ne!(carol.queue_id(), alice.queue_id());
    let carol_other = send_as(&d, "carol", FROM, TO, &message(Some("shared-key"), "x")).await;
    assert!(carol_other.has("E01005"));
    assert_eq!(d.queue_ids_for_key("shared-key").len(), 2);
}

fn multipart(boundary: &str, parts: &[&str], header_space: &str) -> Vec<u8> {
    let mut m = format!(
        "From: alice@example.test\r\nX-Bird-Idempotency-Key: mime-key\r\nMIME-Version: 1.0\r\nContent-Type: multipart/mixed;{header_space}boundary=\"{boundary}\"\r\n\r\n"
    );
    for p in parts {
        m.push_str(&format!("--{boundary}\r\n{p}\r\n"));
    }
    m.push_str(&format!("--{boundary}--\r\n"));
    m.into_bytes()
}

#[tokio::test]
async fn fingerprint_rules_end_to_end() {
    let d = Daemon::start(Options::default());
    let a = "Content-Type: text/plain\r\n\r\nfirst part";
    let b = "Content-Type: application/pdf; name=\"x.pdf\"\r\nContent-Disposition: attachment; filename=\"x.pdf\"\r\n\r\nJVBERi0x";
    let rcpts = &["one@example.net", "two@example.net"];
    let original = send_as(&d, "alice", FROM, rcpts, &multipart("b1", &[a, b], " ")).await;
    assert_eq!(original.code, 250);
    let reordered = send_as(
        &d,
        "alice",
        FROM,
        rcpts,
        &multipart("zz-other", &[b, a], " "),
    )
    .await;
    assert!(
        reordered.is_replay(),
        "boundary and part order don't count: {reordered:?}"
    );
    let rcpt_order = send_as(
        &d,
        "alice",
        FROM,
        &["two@example.net", "one@example.net"],
        &multipart("b1", &[a, b], " "),
    )
    .await;
    assert!(rcpt_order.is_replay(), "recipient order doesn't count");
    let ws = send_as(&d, "alice", FROM, rcpts, &multipart("b1", &[a, b], "  ")).await;
    assert!(ws.has("E01005"), "header whitespace counts: {ws:?}");
    let renamed = b.replace(
        "x.pdf\"\r\nContent-Disposition: attachment; filename=\"x.pdf",
        "x.pdf\"\r\nContent-Disposition: attachment; filename=\"y.pdf",
    );
    let r = send_as(
        &d,
        "alice",
        FROM,
        rcpts,
        &multipart("b1", &[a, &renamed], " "),
    )
    .await;
    assert!(r.has("E01005"), "filename counts: {r:?}");
    let r = send_as(
        &d,
        "alice",
        FROM,
        &["one@example.net"],
        &multipart("b1", &[a, b], " "),
    )
    .await;
    assert!(r.has("E01005"), "recipient set counts: {r:?}");
    assert_eq!(d.queue_count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_same_key_queues_exactly_once() {
    let d = Daemon::start(Options::default());
    let m = message(Some("race-key"), "raced");
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let addr = d.plain;
        let m = m.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = Client::login(addr, "bob").await;
            c.submit(FROM, TO, &m).await
        }));
    }
    let mut fresh = 0;
    let mut ids = std::collections::HashSet::new();
    for t in tasks {
        let r = t.await.expect("task");
        match r.code {
            250 if r.is_replay() => {
                ids.insert(r.queue_id().expect("id"));
            }
            250 => {
                fresh += 1;
                ids.insert(r.queue_id().expect("id"));
            }
            451 => assert!(r.has("E01004"), "{r:?}"),
            _ => panic!("unexpected reply {r:?}"),
        }
    }
    assert_eq!(fresh, 1, "exactly one fresh acceptance");
    assert_eq!(ids.len(), 1, "every replay names the same queue id");
    assert_eq!(d.queue_ids_for_key("race-key").len(), 1);
    assert_eq!(d.queue_count(), 1);
}

#[tokio::test]
async fn lost_reply_retry_is_a_replay() {
    let d = Daemon::start(Options::default());
    let m = message(Some("lost-reply"), "did it arrive?");
    let c = Client::login(d.plain, "bob").await;
    c.submit_and_vanish(FROM, TO, &m).await;
    // The retry comes while or after the first commit runs.
    let deadline = Instant::now() + Duration::from_secs(10);
    let r = loop {
        let r = send_as(&d, "bob", FROM, TO, &m).await;
        if r.code != 451 || Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(r.code, 250, "{r:?}");
    assert_eq!(d.queue_ids_for_key("lost-reply").len(), 1);
    assert_eq!(d.queue_count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_under_load_then_every_key_retried() {
    let mut d = Daemon::start(Options::default());
    const CLIENTS: usize = 6;
    const PER_CLIENT: usize = 300;
    fn key(c: usize, i: usize) -> String {
        format!("load-{c}-{i}")
    }
    fn msg(c: usize, i: usize) -> Vec<u8> {
        message(Some(&key(c, i)), &format!("client {c} message {i}"))
    }

    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let addr = d.plain;
        tasks.push(tokio::spawn(async move {
            let mut acked = HashMap::new();
            let Some(mut client) = try_login(addr).await else {
                return acked;
            };
            for i in 0..PER_CLIENT {
                match try_submit(&mut client, &msg(c, i)).await {
                    Some(r) if r.code == 250 => {
                        acked.insert(key(c, i), r.queue_id().expect("id"));
                    }
                    _ => break,
                }
            }
            acked
        }));
    }
    // Let the load run, then kill mid-flight.
    let deadline = Instant::now() + Duration::from_secs(60);
    while d.queue_count() < 200 {
        assert!(Instant::now() < deadline, "load did not progress");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    d.kill9();
    let mut acked: HashMap<String, String> = HashMap::new();
    for t in tasks {
        acked.extend(t.await.expect("task"));
    }
    assert!(
        !acked.is_empty(),
        "some messages were acknowledged before the kill"
    );
    assert!(
        acked.len() < CLIENTS * PER_CLIENT,
        "the kill landed mid-flight ({} acked)",
        acked.len()
    );

    d.spawn();
    let acked = std::sync::Arc::new(acked);
    let mut retries = Vec::new();
    for c in 0..CLIENTS {
        let (addr, acked) = (d.plain, acked.clone());
        retries.push(tokio::spawn(async move {
            let mut client = Client::login(addr, "bob").await;
            for i in 0..PER_CLIENT {
                let r = client.submit(FROM, TO, &msg(c, i)).await;
                assert_eq!(r.code, 250, "{r:?}");
                if let Some(original) = acked.get(&key(c, i)) {
                    assert!(r.is_replay(), "acknowledged key {} must replay", key(c, i));
                    assert_eq!(r.queue_id().as_ref(), Some(original));
                }
            }
        }));
    }
    for t in retries {
        t.await.expect("retry task");
    }
    let dupes = d.count(
        "SELECT COUNT(*) FROM (SELECT idempotency_key FROM queue GROUP BY idempotency_key HAVING COUNT(*) > 1) AS twice",
    );
    assert_eq!(dupes, 0, "no key has two queue rows");
    assert_eq!(d.queue_count(), (CLIENTS * PER_CLIENT) as i64);
}

async fn try_login(addr: std::net::SocketAddr) -> Option<Client> {
    tokio::time::timeout(Duration::from_secs(5), Client::login(addr, "bob"))
        .await
        .ok()
}

/// Like `submit`, but a dropped connection is `None` instead of a panic.
async fn try_submit(c: &mut Client, m: &[u8]) -> Option<common::Reply> {
    let mut batch = format!("MAIL FROM:<{FROM}>\r\nRCPT TO:<{}>\r\nDATA\r\n", TO[0]).into_bytes();
    batch.extend_from_slice(&common::dot_stuff(m));
    c.send_checked(&batch).await.ok()?;
    for _ in 0..3 {
        c.try_read_reply().await?;
    }
    c.try_read_reply().await
}

#[tokio::test]
async fn ledger_survives_restart() {
    let mut d = Daemon::start(Options::default());
    let m = message(Some("restart-key"), "persist me");
    let first = send_as(&d, "alice", FROM, TO, &m).await;
    let status = d.terminate();
    assert!(status.success());
    d.spawn();
    let again = send_as(&d, "alice", FROM, TO, &m).await;
    assert!(again.is_replay(), "{again:?}");
    assert_eq!(again.queue_id(), first.queue_id());
}

#[tokio::test]
async fn retention_expiry_and_purge() {
    let d = Daemon::start(Options {
        retention: "1s".into(),
        purge_interval: "200ms".into(),
        ..Options::default()
    });
    let first = send_as(&d, "alice", FROM, TO, &message(Some("short-lived"), "one")).await;
    assert_eq!(first.code, 250);
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let second = send_as(&d, "alice", FROM, TO, &message(Some("short-lived"), "two")).await;
    assert_eq!(
        second.code, 250,
        "an expired key is a new operation: {second:?}"
    );
    assert!(!second.is_replay());
    assert_ne!(second.queue_id(), first.queue_id());
    // The purge removes expired entries in the background.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = d.count("SELECT COUNT(*) FROM ledger");
        if n == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "expired ledger rows were not purged"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        d.queue_count(),
        2,
        "purging the ledger never touches the queue"
    );
}

/// The retention window on the acceptor's clock, in process (SQLite): the
/// entry replays up to its last millisecond and a retry from then on is a
/// new operation. `retention_expiry_and_purge` checks the same against the
/// daemon (and the purge loop) on the wall clock, by sleeping.
#[tokio::test]
async fn retention_window_ends_on_the_acceptors_clock() {
    use smtp_once::accept::channel::KeySource;
    use smtp_once::auth::Submitter;
    use smtp_once::server::wording::Smtp;
    use smtp_once::submission::Submission;

    let dir = tempfile::tempdir().expect("tempdir");
    let config = common::in_process::config(dir.path(), "[idempotency]\nretention = \"1h\"\n");
    let store = common::in_process::store(&config);
    let clock = common::in_process::clock();
    let acceptor = smtp_once::cli::serve::acceptor(&config, store, Default::default())
        .expect("acceptor")
        .with_clock(clock.clone());
    let submit = |body: &str| {
        let sub = Submission {
            submitter: Submitter::TrustedNetwork {
                workspace: "acme".into(),
            },
            helo: "client.test".into(),
            peer: "127.0.0.1:2525".parse().expect("peer"),
            tls: false,
            reverse_path: FROM.into(),
            recipients: TO.iter().map(|r| r.to_string()).collect(),
            content: message(Some("retained"), body),
            options: Default::default(),
        };
        let acceptor = &acceptor;
        async move {
            let raw = acceptor
                .accept_via(sub, &Smtp, KeySource::MessageHeader)
                .await;
            String::from_utf8(raw).expect("utf-8 reply")
        }
    };
    let first = submit("one").await;
    assert!(first.starts_with("250 2.0.0 Ok: queued as "), "{first}");

    clock.advance(Duration::from_millis(3_600_000 - 1));
    let replay = submit("one").await;
    assert_eq!(
        replay,
        format!("250-2.0.0 Idempotency-Replay: true\r\n{first}"),
        "still within the retention window"
    );
    let conflict = submit("two").await;
    assert!(conflict.contains("E01005"), "{conflict}");

    clock.advance(Duration::from_millis(1));
    let anew = submit("two").await;
    assert!(
        anew.starts_with("250 2.0.0 Ok: queued as "),
        "an expired key is a new operation: {anew}"
    );
    assert_ne!(anew, first, "a new queue id");
}
