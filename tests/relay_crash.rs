//! Issue 10: after a `kill -9` during a sustained relay run no message is
//! lost and none is relayed twice to a next hop that honours the key. Two
//! real daemons, A relaying to B (a second smtp-once as A's smarthost);
//! clients keep submitting to A while A relays, and A is killed in the
//! middle of it. Runs on SQLite, and on PostgreSQL (A and B each on a
//! database of its own) under `SMTP_ONCE_TEST_STORE=postgres`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

mod common;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Client, Daemon, Options, Reply, dot_stuff, message, wait_until};
use tokio::sync::RwLock;

const CLIENTS: usize = 4;
const PER_CLIENT: usize = 75;
const TOTAL: usize = CLIENTS * PER_CLIENT;
/// Messages per client connection before QUIT and a new connection.
const PER_CONNECTION: usize = 10;
/// Between two messages of one client, so that submission is still going on
/// while A relays (pacing, not an assertion).
const PACE: Duration = Duration::from_millis(20);
const FROM: &str = "bob@example.test";
const TO: &str = "r@example.net";
/// Fast polling and retries for A. The test pause widens the crash window
/// between B's `250` and A's record of it, so that the kill surely lands
/// with messages inside it; it is removed before the restart.
const RELAY_EXTRA: &str = "poll_interval = \"50ms\"\nretry_schedule = [\"200ms\"]\n";
const PAUSE: &str = "delivery_test_pause_after_send = \"150ms\"\n";

fn key(c: usize, i: usize) -> String {
    format!("relay-crash-{c}-{i}")
}

fn msg(c: usize, i: usize) -> Vec<u8> {
    message(Some(&key(c, i)), &format!("client {c} message {i}"))
}

/// One row per key of `SELECT idempotency_key, <value> FROM queue ...`.
fn per_key<T: rusqlite::types::FromSql>(d: &Daemon, sql: &str) -> HashMap<String, T> {
    let db = d.db();
    let mut stmt = db.prepare(sql).expect("prepare");
    stmt.query_map([], |r| {
        Ok((
            r.get::<_, Option<String>>(0)?.unwrap_or_default(),
            r.get(1)?,
        ))
    })
    .expect("query")
    .map(|r| r.expect("row"))
    .collect()
}

/// Keys in a daemon's queue, with the number of rows each.
fn rows_per_key(d: &Daemon) -> HashMap<String, i64> {
    if let Some(db) = &d.pg {
        return common::pg::block_on(db.rows_per_key());
    }
    per_key(
        d,
        "SELECT idempotency_key, COUNT(*) FROM queue GROUP BY idempotency_key",
    )
}

/// A's queue: key -> state.
fn states(d: &Daemon) -> HashMap<String, String> {
    if let Some(db) = &d.pg {
        return common::pg::block_on(db.states());
    }
    per_key(d, "SELECT idempotency_key, state FROM queue")
}

/// Keys B holds that A has not recorded as delivered: B's `250` came, A's
/// record of it did not (yet).
fn in_crash_window(at_b: &HashMap<String, i64>, at_a: &HashMap<String, String>) -> usize {
    at_b.keys()
        .filter(|k| at_a.get(*k).is_some_and(|s| s != "delivered"))
        .count()
}

/// MAIL, RCPT, DATA and the message pipelined; a dropped connection is
/// `None` instead of a panic.
async fn try_submit(c: &mut Client, m: &[u8]) -> Option<Reply> {
    let mut batch = format!("MAIL FROM:<{FROM}>\r\nRCPT TO:<{TO}>\r\nDATA\r\n").into_bytes();
    batch.extend_from_slice(&dot_stuff(m));
    c.send_checked(&batch).await.ok()?;
    for _ in 0..3 {
        c.try_read_reply().await?;
    }
    c.try_read_reply().await
}

/// One client of the first run: its messages in order, `PER_CONNECTION` per
/// connection, until A dies. Returns the keys that got a `250`. New
/// connections are opened under the read side of `killed`, so none is
/// attempted after the kill (the harness's login panics on a refused
/// connection); an open one just sees the connection drop.
async fn first_run(addr: SocketAddr, c: usize, killed: Arc<RwLock<bool>>) -> HashSet<String> {
    let mut acked = HashSet::new();
    let mut i = 0;
    'connections: while i < PER_CLIENT {
        let mut client = {
            let killed = killed.read().await;
            if *killed {
                break;
            }
            Client::login(addr, "bob").await
        };
        for _ in 0..PER_CONNECTION.min(PER_CLIENT - i) {
            let Some(r) = try_submit(&mut client, &msg(c, i)).await else {
                break 'connections;
            };
            assert_eq!(r.code, 250, "{} before the kill: {r:?}", key(c, i));
            acked.insert(key(c, i));
            i += 1;
            tokio::time::sleep(PACE).await;
        }
        if client.send_checked(b"QUIT\r\n").await.is_ok() {
            let _ = client.try_read_reply().await;
        }
    }
    acked
}

/// One client after the restart: every one of its messages that got no
/// `250`, again. Returns how many were replays (committed before the kill,
/// reply lost).
async fn retry_run(addr: SocketAddr, c: usize, acked: Arc<HashSet<String>>) -> usize {
    let missing: Vec<usize> = (0..PER_CLIENT)
        .filter(|&i| !acked.contains(&key(c, i)))
        .collect();
    let mut replays = 0;
    for chunk in missing.chunks(PER_CONNECTION) {
        let mut client = Client::login(addr, "bob").await;
        for &i in chunk {
            let r = client.submit(FROM, &[TO], &msg(c, i)).await;
            assert_eq!(r.code, 250, "retry of {}: {r:?}", key(c, i));
            replays += usize::from(r.is_replay());
        }
        client.quit().await;
    }
    replays
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_relay_loses_nothing_and_relays_nothing_twice() {
    let started = Instant::now();
    let b = Daemon::start(Options::default());
    let mut a = Daemon::start(Options {
        relay: Some(format!(
            "[relay]\nmode = \"smarthost\"\nsmarthost = \"{}\"\ntls = \"none\"\nusername = \"bob\"\npassword = \"bob-pw\"\n",
            b.plain
        )),
        extra: format!("{RELAY_EXTRA}{PAUSE}"),
        ..Options::default()
    });

    let killed = Arc::new(RwLock::new(false));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| tokio::spawn(first_run(a.plain, c, killed.clone())))
        .collect();

    // Kill A once B holds a quarter of the run and some of what B holds is
    // still unrecorded at A.
    wait_until("B to hold a quarter of the run", 30, || {
        let at_b = rows_per_key(&b);
        (at_b.len() >= TOTAL / 4 && in_crash_window(&at_b, &states(&a)) > 0).then_some(())
    })
    .await;
    {
        let mut killed = killed.write().await;
        a.kill9();
        *killed = true;
    }
    let at_kill = started.elapsed();

    // A's database is frozen now; B can only have gained since.
    let at_b = rows_per_key(&b);
    let at_a = states(&a);
    let window = in_crash_window(&at_b, &at_a);
    let mut acked = HashSet::new();
    for t in clients {
        acked.extend(t.await.expect("client task"));
    }
    let not_delivered_at_a = at_a.values().filter(|s| *s != "delivered").count();
    eprintln!(
        "at the kill ({at_kill:?}): {} acknowledged by A, {} rows at A ({not_delivered_at_a} not yet delivered), {} at B, {window} at B but unrecorded at A",
        acked.len(),
        at_a.len(),
        at_b.len()
    );
    assert!(
        at_b.len() >= TOTAL / 4 && at_b.len() < TOTAL,
        "the kill landed mid-relay: B held {} of {TOTAL}",
        at_b.len()
    );
    assert!(
        not_delivered_at_a > 0,
        "A still had messages to relay at the kill"
    );
    assert!(
        window > 0,
        "some messages were at B but not yet recorded as delivered by A"
    );
    assert!(
        acked.iter().all(|k| at_a.contains_key(k)),
        "every 250 from A was committed before the kill"
    );

    // Restart A on the same data directory, without the test pause.
    let config = std::fs::read_to_string(&a.config_path).expect("config");
    std::fs::write(&a.config_path, config.replace(PAUSE, "")).expect("config");
    a.spawn();
    let acked = Arc::new(acked);
    let retries: Vec<_> = (0..CLIENTS)
        .map(|c| tokio::spawn(retry_run(a.plain, c, acked.clone())))
        .collect();
    let mut replays = 0;
    for t in retries {
        replays += t.await.expect("retry task");
    }

    wait_until("A to record every message delivered", 60, || {
        let at_a = states(&a);
        (at_a.len() == TOTAL && at_a.values().all(|s| s == "delivered")).then_some(())
    })
    .await;
    eprintln!(
        "resubmitted {} ({replays} replays); all delivered after {:?}",
        TOTAL - acked.len(),
        started.elapsed()
    );

    // A: one delivered row per key, nothing else (no bounce).
    let at_a = states(&a);
    let all: HashSet<String> = (0..CLIENTS)
        .flat_map(|c| (0..PER_CLIENT).map(move |i| key(c, i)))
        .collect();
    assert_eq!(a.queue_count(), TOTAL as i64, "A: one row per key");
    assert_eq!(at_a.keys().cloned().collect::<HashSet<_>>(), all);
    // B: exactly one row per key, every acknowledged key among them.
    let at_b = rows_per_key(&b);
    let twice: Vec<_> = at_b.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "relayed twice to B: {twice:?}");
    assert_eq!(b.queue_count(), TOTAL as i64, "B: one row per message");
    assert_eq!(at_b.keys().cloned().collect::<HashSet<_>>(), all);
    let lost: Vec<_> = acked.iter().filter(|k| !at_b.contains_key(*k)).collect();
    assert!(lost.is_empty(), "acknowledged by A, missing at B: {lost:?}");
    // What was inside the window went to B again and was replayed there.
    let b_replays = b.log().matches("replayed stored reply").count();
    assert!(
        b_replays >= window,
        "B replayed {b_replays}, fewer than the {window} resent from the crash window"
    );
}
