//! Issue 11: several `smtp-once serve` processes (nodes) on one PostgreSQL
//! database. Real daemons on the local PostgreSQL 15 (127.0.0.1:5432), each
//! test on a fresh database of its own: a same-key storm spread over three
//! nodes, `kill -9` of a node under load, delivery across three nodes into a
//! fourth smtp-once with a node killed mid-relay, backends terminated under
//! load, and the configuration and schema-version checks.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

mod common;

use std::collections::{HashMap, HashSet};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::pg::{TestDb, wait_for};
use common::{BIN, Client, Daemon, Options, Reply, Store, dot_stuff, message};

const FROM: &str = "bob@example.test";
const TO: &str = "r@example.net";

/// The load tests take turns: three or four daemons and PostgreSQL on a
/// two-core machine are enough for one test at a time.
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn node_name(n: usize) -> String {
    format!("node-{n}")
}

/// Node `n` on `db`; `relay` replaces the default `[relay]` (file mode).
fn node(db: &Arc<TestDb>, n: usize, relay: Option<String>) -> Daemon {
    Daemon::start(Options {
        store: Store::Postgres(db.clone()),
        node_id: Some(node_name(n)),
        relay,
        ..Options::default()
    })
}

fn now_ms() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock");
    i64::try_from(since.as_millis()).expect("ms")
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

/// Submits `m` on `c` until a `250`, waiting out `451 E01004` (the first
/// attempt of a killed node may still be rolling back) for up to 10 s.
/// Any other reply fails the test.
async fn submit_until_250(c: &mut Client, what: &str, m: &[u8]) -> Reply {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = c.submit(FROM, &[TO], m).await;
        match r.code {
            250 => return r,
            451 if r.has("E01004") && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            _ => panic!("{what}: {r:?}"),
        }
    }
}

/// key -> queue id in the database.
async fn ids_by_key(db: &TestDb) -> HashMap<String, String> {
    db.client()
        .await
        .query(
            "SELECT idempotency_key, id FROM queue WHERE idempotency_key IS NOT NULL",
            &[],
        )
        .await
        .expect("ids")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// The warnings and errors in a daemon's log (the last 20), for failure
/// messages.
fn log_problems(log: &std::path::Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .filter(|l| !l.contains("test pause after send") && !l.contains("TEST ONLY"))
        .collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

fn assert_once_each(rows: &HashMap<String, i64>) {
    let twice: Vec<_> = rows.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "keys with more than one queue row: {twice:?}"
    );
}

// ------------------------------------------------------------------- a

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_storm_over_three_nodes_queues_once() {
    let _turn = HEAVY.lock().await;
    let started = Instant::now();
    const KEY: &str = "storm-key";
    const EACH: usize = 48;
    let db = Arc::new(TestDb::create());
    let nodes: Vec<Daemon> = (1..=3).map(|n| node(&db, n, None)).collect();
    let original = message(Some(KEY), "storm: the original");
    let changed = message(Some(KEY), "storm: a changed message under the same key");

    // Every client logs in first; then all submit at once.
    let barrier = Arc::new(tokio::sync::Barrier::new(2 * EACH));
    let mut tasks = Vec::new();
    for i in 0..2 * EACH {
        let is_original = i % 2 == 0;
        let m = if is_original { &original } else { &changed }.clone();
        let (n, addr, barrier) = (i % 3, nodes[i % 3].plain, barrier.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = Client::login(addr, "bob").await;
            barrier.wait().await;
            let r = c.submit(FROM, &[TO], &m).await;
            (is_original, n, r)
        }));
    }
    let mut replies = Vec::new();
    for t in tasks {
        replies.push(t.await.expect("client task"));
    }

    let fresh: Vec<_> = replies
        .iter()
        .filter(|(_, _, r)| r.code == 250 && !r.is_replay())
        .collect();
    assert_eq!(
        fresh.len(),
        1,
        "exactly one first acceptance over three nodes: {fresh:?}"
    );
    let (winner_original, _, first) = fresh[0];
    let winner_id = first.queue_id().expect("queue id");
    // (fresh, replay, E01004, E01005) per node.
    let mut per_node = [(0, 0, 0, 0); 3];
    for (is_original, n, r) in &replies {
        let same = is_original == winner_original;
        match r.code {
            250 if !r.is_replay() => per_node[*n].0 += 1,
            250 => {
                assert!(same, "a replay for the other message: {r:?}");
                assert_eq!(r.queue_id().as_ref(), Some(&winner_id), "{r:?}");
                per_node[*n].1 += 1;
            }
            451 if r.has("E01004") => per_node[*n].2 += 1,
            550 if r.has("E01005") => {
                assert!(!same, "E01005 for the identical message: {r:?}");
                assert!(r.has(&winner_id), "E01005 names the first queue id: {r:?}");
                per_node[*n].3 += 1;
            }
            _ => panic!("unexpected reply from node-{}: {r:?}", n + 1),
        }
    }
    eprintln!(
        "storm of {} over 3 nodes: (fresh, replay, E01004, E01005) per node {per_node:?}, {:?}",
        2 * EACH,
        started.elapsed()
    );
    assert_eq!(
        db.queue_ids_for_key(KEY).await,
        std::slice::from_ref(&winner_id)
    );
    assert_eq!(db.queue_count().await, 1, "one queue row in all");
    assert_eq!(db.count("SELECT COUNT(*) FROM ledger").await, 1);

    // Settled: each node replays the winner and refuses the other message.
    let (same, other) = if *winner_original {
        (&original, &changed)
    } else {
        (&changed, &original)
    };
    for d in &nodes {
        let mut c = Client::login(d.plain, "bob").await;
        let r = c.submit(FROM, &[TO], same).await;
        assert!(r.is_replay() && r.has(&winner_id), "{r:?}");
        let r = c.submit(FROM, &[TO], other).await;
        assert!(r.code == 550 && r.has("E01005"), "{r:?}");
        c.quit().await;
    }
    assert_eq!(db.queue_count().await, 1);
}

// ------------------------------------------------------------------- b

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_a_node_under_load_then_every_key_retried_elsewhere() {
    let _turn = HEAVY.lock().await;
    let started = Instant::now();
    const CLIENTS: usize = 6;
    const PER_CLIENT: usize = 100;
    const TOTAL: usize = CLIENTS * PER_CLIENT;
    fn key(c: usize, i: usize) -> String {
        format!("nodes-load-{c}-{i}")
    }
    fn msg(c: usize, i: usize) -> Vec<u8> {
        message(Some(&key(c, i)), &format!("client {c} message {i}"))
    }
    let db = Arc::new(TestDb::create());
    let mut nodes: Vec<Daemon> = (1..=3).map(|n| node(&db, n, None)).collect();
    // Client c submits to node c % 3 on one connection; node-1 is killed.
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let (addr, log) = (nodes[c % 3].plain, nodes[c % 3].stderr_path.clone());
        tasks.push(tokio::spawn(async move {
            let mut acked = HashMap::new();
            let mut client = Client::login(addr, "bob").await;
            for i in 0..PER_CLIENT {
                match try_submit(&mut client, &msg(c, i)).await {
                    Some(r) => {
                        assert_eq!(
                            r.code,
                            250,
                            "{} from node-{}: {r:?}\n{}",
                            key(c, i),
                            c % 3 + 1,
                            log_problems(&log)
                        );
                        acked.insert(key(c, i), r.queue_id().expect("id"));
                    }
                    None => break,
                }
            }
            acked
        }));
    }
    wait_for("the load to progress", 60, || async {
        (db.queue_count().await >= (TOTAL / 4) as i64).then_some(())
    })
    .await;
    nodes[0].kill9();
    let mut acked: HashMap<String, String> = HashMap::new();
    let mut acked_by_client = [0; CLIENTS];
    for (c, t) in tasks.into_iter().enumerate() {
        let a = t.await.expect("client task");
        acked_by_client[c] = a.len();
        acked.extend(a);
    }
    eprintln!(
        "killed node-1 after {:?}; acknowledged per client {acked_by_client:?}",
        started.elapsed()
    );
    for (c, &n) in acked_by_client.iter().enumerate() {
        if c % 3 == 0 {
            assert!(
                n < PER_CLIENT,
                "the kill landed while client {c} was still sending to node-1"
            );
        } else {
            assert_eq!(n, PER_CLIENT, "node-{} lived on", c % 3 + 1);
        }
    }

    // Every acknowledged key is there exactly once, under the id it got.
    let rows = db.rows_per_key().await;
    assert_once_each(&rows);
    let ids = ids_by_key(&db).await;
    for (k, id) in &acked {
        assert_eq!(ids.get(k), Some(id), "acknowledged {k} is in the queue");
    }

    // Node-1's clients retry what got no 250, through node-2 and node-3.
    let acked = Arc::new(acked);
    let survivors = [nodes[1].plain, nodes[2].plain];
    let mut retries = Vec::new();
    for c in (0..CLIENTS).filter(|c| c % 3 == 0) {
        let (addr, acked) = (survivors[c % 2], acked.clone());
        retries.push(tokio::spawn(async move {
            let mut client = Client::login(addr, "bob").await;
            let (mut replays, mut firsts) = (0, 0);
            for i in (0..PER_CLIENT).filter(|&i| !acked.contains_key(&key(c, i))) {
                let r = submit_until_250(&mut client, &key(c, i), &msg(c, i)).await;
                if r.is_replay() {
                    replays += 1;
                } else {
                    firsts += 1;
                }
            }
            client.quit().await;
            (replays, firsts)
        }));
    }
    let (mut replays, mut firsts) = (0, 0);
    for t in retries {
        let (r, f) = t.await.expect("retry task");
        (replays, firsts) = (replays + r, firsts + f);
    }
    eprintln!("retried through survivors: {replays} replays, {firsts} first acceptances");
    let rows = db.rows_per_key().await;
    assert_once_each(&rows);
    assert_eq!(rows.len(), TOTAL, "every key queued");
    assert_eq!(db.queue_count().await, TOTAL as i64);

    // No key is stuck: a retry of every key is a replay of its one row.
    let ids = Arc::new(ids_by_key(&db).await);
    let mut finals = Vec::new();
    for c in 0..CLIENTS {
        let (addr, ids) = (survivors[c % 2], ids.clone());
        finals.push(tokio::spawn(async move {
            let mut client = Client::login(addr, "bob").await;
            for i in 0..PER_CLIENT {
                let r = client.submit(FROM, &[TO], &msg(c, i)).await;
                assert!(r.is_replay(), "{} is a replay: {r:?}", key(c, i));
                assert_eq!(r.queue_id().as_ref(), ids.get(&key(c, i)), "{r:?}");
            }
            client.quit().await;
        }));
    }
    for t in finals {
        t.await.expect("final retry task");
    }
    assert_eq!(db.queue_count().await, TOTAL as i64);
    eprintln!("done in {:?}", started.elapsed());
}

// ------------------------------------------------------------------- c

/// Keys in the sink's (SQLite) queue, with the number of rows each.
fn sink_rows_per_key(sink: &Daemon) -> HashMap<String, i64> {
    let db = sink.db();
    let mut stmt = db
        .prepare("SELECT COALESCE(idempotency_key, ''), COUNT(*) FROM queue GROUP BY 1")
        .expect("prepare");
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("query")
        .map(|r| r.expect("row"))
        .collect()
}

/// Live leases per node: node id -> messages it is delivering now.
async fn live_leases(db: &TestDb) -> HashMap<String, i64> {
    db.client()
        .await
        .query(
            "SELECT COALESCE(leased_by, ''), COUNT(*) FROM queue
             WHERE state = 'delivering' AND lease_until > $1 GROUP BY 1",
            &[&now_ms()],
        )
        .await
        .expect("leases")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_over_three_nodes_survives_kill_9_of_one() {
    let _turn = HEAVY.lock().await;
    let started = Instant::now();
    const CLIENTS: usize = 3;
    const PER_CLIENT: usize = 50;
    const TOTAL: usize = CLIENTS * PER_CLIENT;
    fn key(c: usize, i: usize) -> String {
        format!("nodes-relay-{c}-{i}")
    }
    fn msg(c: usize, i: usize) -> Vec<u8> {
        message(Some(&key(c, i)), &format!("client {c} message {i}"))
    }
    let sink = Daemon::start(Options {
        store: Store::Sqlite,
        ..Options::default()
    });
    // The pause after the sink's 250 widens the window in which a killed
    // node has relayed a message without recording it.
    let relay = relay_to(&sink, "6s", "3s", "200ms");
    let db = Arc::new(TestDb::create());
    let mut nodes: Vec<Daemon> = (1..=3).map(|n| node(&db, n, Some(relay.clone()))).collect();

    // One client per node, paced so that submission goes on while the
    // nodes relay. A client whose node dies stops there.
    let mut tasks = Vec::new();
    for (c, d) in nodes.iter().enumerate() {
        let (addr, log) = (d.plain, d.stderr_path.clone());
        tasks.push(tokio::spawn(async move {
            let mut acked = HashSet::new();
            let mut client = Client::login(addr, "bob").await;
            for i in 0..PER_CLIENT {
                match try_submit(&mut client, &msg(c, i)).await {
                    Some(r) => {
                        assert_eq!(r.code, 250, "{}: {r:?}\n{}", key(c, i), log_problems(&log));
                        acked.insert(key(c, i));
                    }
                    None => break,
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            acked
        }));
    }

    // Kill the node with the most live leases once every node has relayed
    // and the sink holds a fifth of the run.
    let mut seen = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let victim = loop {
        let leases = live_leases(&db).await;
        seen.extend(leases.keys().cloned());
        if seen.len() == 3 && sink_rows_per_key(&sink).len() >= TOTAL / 5 {
            let busiest = leases.into_iter().max_by_key(|(_, n)| *n);
            if let Some(n) = busiest.and_then(|(id, _)| (1..=3).find(|&n| node_name(n) == id)) {
                break n;
            }
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for all three nodes to relay (seen leases of {seen:?})"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    nodes[victim - 1].kill9();
    let kill_ms = now_ms();
    let orphaned: Vec<(String, i64)> = db
        .client()
        .await
        .query(
            "SELECT id, lease_until FROM queue WHERE state = 'delivering' AND leased_by = $1",
            &[&node_name(victim)],
        )
        .await
        .expect("orphaned leases")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let at_sink_at_kill = sink_rows_per_key(&sink).len();
    let mut acked = HashSet::new();
    let mut acked_by_client = [0; CLIENTS];
    for (c, t) in tasks.into_iter().enumerate() {
        let a = t.await.expect("client task");
        acked_by_client[c] = a.len();
        acked.extend(a);
    }
    eprintln!(
        "killed node-{victim} after {:?} holding {} leases; sink held {at_sink_at_kill}; acknowledged per client {acked_by_client:?}",
        started.elapsed(),
        orphaned.len()
    );
    assert!(
        !orphaned.is_empty(),
        "node-{victim} was delivering when killed"
    );

    // Its client resends what got no 250 through a surviving node.
    let survivor = nodes[victim % 3].plain;
    let mut client = Client::login(survivor, "bob").await;
    let c = victim - 1;
    for i in (0..PER_CLIENT).filter(|&i| !acked.contains(&key(c, i))) {
        submit_until_250(&mut client, &key(c, i), &msg(c, i)).await;
    }
    client.quit().await;

    wait_for("every message delivered", 60, || async {
        let states = db.states().await;
        (states.len() == TOTAL && states.values().all(|s| s == "delivered")).then_some(())
    })
    .await;
    eprintln!("all {TOTAL} delivered after {:?}", started.elapsed());

    let rows = db.rows_per_key().await;
    assert_once_each(&rows);
    assert_eq!(
        db.queue_count().await,
        TOTAL as i64,
        "one row per key, no bounce"
    );
    let at_sink = sink_rows_per_key(&sink);
    assert_once_each(&at_sink);
    let all: HashSet<String> = (0..CLIENTS)
        .flat_map(|c| (0..PER_CLIENT).map(move |i| key(c, i)))
        .collect();
    assert_eq!(at_sink.keys().cloned().collect::<HashSet<_>>(), all);
    assert_eq!(
        sink.queue_count(),
        TOTAL as i64,
        "the sink has each key once"
    );

    // The killed node's messages were taken over, and only once their
    // leases had run out (a row it committed just before dying aside).
    let updated: HashMap<String, i64> = db
        .client()
        .await
        .query("SELECT id, updated_at FROM queue", &[])
        .await
        .expect("updated_at")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    for (id, lease_until) in &orphaned {
        let at = updated[id];
        assert!(
            at < kill_ms || at >= *lease_until,
            "{id}, leased by the killed node until {lease_until}, was recorded at {at}: taken over before its lease ran out"
        );
    }
    eprintln!(
        "sink replayed {} relays; done in {:?}",
        sink.log().matches("replayed stored reply").count(),
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_longer_than_its_lease_is_renewed_not_taken_over() {
    let _turn = HEAVY.lock().await;
    let started = Instant::now();
    let sink = Daemon::start(Options {
        store: Store::Sqlite,
        ..Options::default()
    });
    // The test pause holds the delivering node for 5 s after the sink's
    // 250, well past the 2 s lease: only renewal keeps the other node from
    // claiming the message and relaying it again.
    let relay = relay_to(&sink, "2s", "1s", "5s");
    let db = Arc::new(TestDb::create());
    let nodes: Vec<Daemon> = (1..=2).map(|n| node(&db, n, Some(relay.clone()))).collect();
    let mut c = Client::login(nodes[0].plain, "bob").await;
    let r = c
        .submit(
            FROM,
            &[TO],
            &message(Some("slow-relay"), "longer than a lease"),
        )
        .await;
    assert_eq!(r.code, 250, "{r:?}");
    let id = r.queue_id().expect("queue id");
    c.quit().await;

    // Watch the lease while the delivery runs: one holder throughout,
    // pushed forward past its first end.
    let lease = |db: Arc<TestDb>, id: String| async move {
        db.client()
            .await
            .query_opt(
                "SELECT leased_by, lease_until FROM queue WHERE id = $1 AND state = 'delivering'",
                &[&id],
            )
            .await
            .expect("lease")
            .map(|r| (r.get::<_, Option<String>>(0), r.get::<_, i64>(1)))
    };
    let (holder, first_until) = wait_for("a node to claim the message", 10, || {
        lease(db.clone(), id.clone())
    })
    .await;
    let last_until = Arc::new(std::sync::atomic::AtomicI64::new(first_until));
    let states = wait_for("the message delivered", 20, || {
        let (db, id, holder) = (db.clone(), id.clone(), holder.clone());
        let last_until = last_until.clone();
        async move {
            match lease(db.clone(), id).await {
                Some((by, until)) => {
                    assert_eq!(by, holder, "the lease changed hands during the delivery");
                    last_until.fetch_max(until, std::sync::atomic::Ordering::Relaxed);
                    None
                }
                None => Some(db.states().await),
            }
        }
    })
    .await;
    assert_eq!(
        states.get("slow-relay").map(String::as_str),
        Some("delivered")
    );
    let last_until = last_until.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "delivered by {holder:?} after {:?}; lease pushed from {first_until} to {last_until}",
        started.elapsed()
    );
    assert!(
        last_until >= first_until + 2000,
        "the lease was renewed while delivering ({first_until} -> {last_until})"
    );
    let log = sink.log();
    assert_eq!(log.matches("accepted workspace").count(), 1, "{log}");
    assert_eq!(
        log.matches("replayed stored reply").count(),
        0,
        "relayed once only: {log}"
    );
    assert_eq!(sink.queue_count(), 1);
}

// ------------------------------------------------------------------- d

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_backends_under_load_lose_and_double_nothing() {
    let _turn = HEAVY.lock().await;
    let started = Instant::now();
    const CLIENTS: usize = 4;
    const PER_CLIENT: usize = 40;
    const TOTAL: usize = CLIENTS * PER_CLIENT;
    fn key(c: usize, i: usize) -> String {
        format!("nodes-terminated-{c}-{i}")
    }
    fn msg(c: usize, i: usize) -> Vec<u8> {
        message(Some(&key(c, i)), &format!("client {c} message {i}"))
    }
    /// Submits until a 250; every other reply must be `451 ... E01033`.
    async fn submit_through(
        c: &mut Client,
        what: &str,
        m: &[u8],
        log: &std::path::Path,
    ) -> (Reply, usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut unavailable = 0;
        loop {
            let r = c.submit(FROM, &[TO], m).await;
            match r.code {
                250 => return (r, unavailable),
                451 if r.has("E01033") => {
                    unavailable += 1;
                    assert!(Instant::now() < deadline, "{what}: still E01033 after 20 s");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                _ => panic!(
                    "{what}: only 250 or 451 E01033 while backends die: {r:?}\n{}",
                    log_problems(log)
                ),
            }
        }
    }

    let db = Arc::new(TestDb::create());
    let nodes: Vec<Daemon> = (1..=2).map(|n| node(&db, n, None)).collect();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let (addr, log) = (nodes[c % 2].plain, nodes[c % 2].stderr_path.clone());
        tasks.push(tokio::spawn(async move {
            let mut client = Client::login(addr, "bob").await;
            let (mut acked, mut unavailable, mut replays) = (HashMap::new(), 0, 0);
            for i in 0..PER_CLIENT {
                let (r, n) = submit_through(&mut client, &key(c, i), &msg(c, i), &log).await;
                unavailable += n;
                replays += usize::from(r.is_replay());
                acked.insert(key(c, i), r.queue_id().expect("id"));
            }
            client.quit().await;
            (acked, unavailable, replays)
        }));
    }
    // Terminate every backend of the database, again and again, while the
    // clients submit.
    let mut terminated = 0;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        terminated += db.terminate_backends().await;
    }
    let (mut acked, mut unavailable, mut replays) = (HashMap::new(), 0, 0);
    for t in tasks {
        let (a, u, r) = t.await.expect("client task");
        acked.extend(a);
        (unavailable, replays) = (unavailable + u, replays + r);
    }
    eprintln!(
        "{terminated} backends terminated; {unavailable} E01033 replies, {replays} replays; {:?}",
        started.elapsed()
    );
    assert!(terminated > 0, "backends were terminated");

    let rows = db.rows_per_key().await;
    assert_once_each(&rows);
    assert_eq!(rows.len(), TOTAL);
    assert_eq!(db.queue_count().await, TOTAL as i64, "nothing doubled");
    let ids = ids_by_key(&db).await;
    for (k, id) in &acked {
        assert_eq!(ids.get(k), Some(id), "acknowledged {k} is there, once");
    }

    // Once more with idle pools: each node recovers by itself.
    let killed = db.terminate_backends().await;
    for (n, d) in nodes.iter().enumerate() {
        let m = message(Some(&format!("after-terminate-{n}")), "again");
        let took = Instant::now();
        let r = wait_for("a submission to succeed again", 15, || async {
            let mut c = Client::login(d.plain, "bob").await;
            let r = c.submit(FROM, &[TO], &m).await;
            c.quit().await;
            match r.code {
                250 => Some(r),
                451 if r.has("E01033") => None,
                _ => panic!("only 250 or 451 E01033: {r:?}"),
            }
        })
        .await;
        assert!(!r.is_replay(), "{r:?}");
        eprintln!(
            "node-{}: 250 again {:?} after {killed} idle backends were terminated",
            n + 1,
            took.elapsed()
        );
    }
    assert_eq!(db.queue_count().await, TOTAL as i64 + 2);
}

// ------------------------------------------------------------------- e

/// Runs `serve` on `config` until it exits (at most 20 s); its status and
/// everything it printed.
fn serve_until_exit(config: &std::path::Path) -> (std::process::ExitStatus, String) {
    let dir = config.parent().expect("folder");
    let log = dir.join("refused.log");
    let mut child = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(config)
        .env("RUST_LOG", "info")
        .stdout(std::fs::File::create(dir.join("refused.out")).expect("out"))
        .stderr(std::fs::File::create(&log).expect("log"))
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn serve");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "serve kept running; log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = std::fs::read_to_string(dir.join("refused.out")).unwrap_or_default()
        + &std::fs::read_to_string(&log).unwrap_or_default();
    (status, out)
}

#[tokio::test]
async fn store_url_is_checked_and_a_newer_schema_is_refused() {
    let db = Arc::new(TestDb::create());
    let options = Options {
        store: Store::Postgres(db.clone()),
        node_id: Some(node_name(1)),
        ..Options::default()
    };

    // check-config: the good URL passes, a malformed one is named by key.
    let dir = tempfile::tempdir().expect("tempdir");
    let good = common::config_text(&options, dir.path());
    let path = dir.path().join("good.toml");
    std::fs::write(&path, &good).expect("config");
    let (passed, text) = common::check_config(&path);
    assert!(passed, "a PostgreSQL config passes: {text}");
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, good.replace(&db.url, "not a url")).expect("config");
    let (passed, text) = common::check_config(&path);
    assert!(!passed, "a malformed URL fails: {text}");
    assert!(
        text.contains("store.url"),
        "the problem named by key: {text}"
    );

    // serve creates the schema, and refuses one newer than it knows.
    let mut d = Daemon::start(options);
    let known = db
        .count("SELECT MAX(version)::bigint FROM schema_version")
        .await;
    assert!(known >= 1, "serve created the schema");
    assert!(d.terminate().success());
    db.execute("INSERT INTO schema_version (version) VALUES (999)")
        .await;
    let (status, log) = serve_until_exit(&d.config_path);
    assert!(!status.success(), "serve refused to start: {log}");
    assert!(
        log.contains("999") && log.to_lowercase().contains("schema"),
        "the message names the schema version: {log}"
    );
    assert!(
        !log.contains("smtp-once listening on"),
        "no listener was opened: {log}"
    );
    assert_eq!(
        db.count("SELECT MAX(version)::bigint FROM schema_version")
            .await,
        999,
        "the newer schema is left alone"
    );
}

/// A `[relay]` section that relays to `sink` as bob, with this lease,
/// per-command timeout and test pause after the sink's 250.
fn relay_to(sink: &Daemon, lease: &str, timeout: &str, pause_after_send: &str) -> String {
    format!(
        "[relay]\nmode = \"smarthost\"\nsmarthost = \"{}\"\ntls = \"none\"\n\
         username = \"bob\"\npassword = \"bob-pw\"\nlease = \"{lease}\"\ntimeout = \"{timeout}\"\n\
         poll_interval = \"50ms\"\nretry_schedule = [\"200ms\"]\n\
         delivery_test_pause_after_send = \"{pause_after_send}\"\n",
        sink.plain
    )
}

/// Issue 13 across nodes: two nodes on one database, both sending to one
/// endpoint (the example receiver, which verifies every signature with the
/// reference package). Every event arrives, and each `webhook-id` is POSTed
/// exactly once: claims with `FOR UPDATE SKIP LOCKED` give each event to one
/// node's sender. Messages are submitted through both nodes, so events are
/// written by both and both senders claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_send_each_webhook_event_once() {
    use common::webhook::{Receiver, endpoint_toml, secret};
    let _turn = HEAVY.lock().await;
    const MESSAGES: usize = 30;
    let dir = tempfile::tempdir().expect("tmp");
    let receiver = Receiver::start(&secret(9), &dir.path().join("r.db"), 0, &[]);
    let db = Arc::new(TestDb::create());
    let hook = endpoint_toml("app", &receiver.url(), &secret(9), "max_in_flight = 4\n");
    let nodes: Vec<Daemon> = (1..=2)
        .map(|n| {
            Daemon::start(Options {
                store: Store::Postgres(db.clone()),
                node_id: Some(node_name(n)),
                extra: hook.clone(),
                ..Options::default()
            })
        })
        .collect();
    let mut clients = Vec::new();
    for n in &nodes {
        clients.push(Client::login(n.plain, "bob").await);
    }
    for i in 0..MESSAGES {
        let m = message(Some(&format!("wh-nodes-{i}")), &format!("message {i}"));
        submit_until_250(&mut clients[i % 2], "webhook message", &m).await;
    }
    // accepted + delivered per message.
    let events = 2 * MESSAGES;
    wait_for("every event delivered", 60, || async {
        let delivered = db
            .count("SELECT COUNT(*) FROM webhook_outbox WHERE state = 'delivered'")
            .await;
        (delivered == i64::try_from(events).expect("n")).then_some(())
    })
    .await;
    let jobs = receiver.jobs();
    let ids: HashSet<_> = jobs.iter().map(|j| j.webhook_id.clone()).collect();
    assert_eq!(jobs.len(), events, "one job per event");
    assert_eq!(ids.len(), events, "distinct webhook-ids");
    for id in &ids {
        assert_eq!(
            receiver.receipts_for(id),
            1,
            "{id} was POSTed more than once"
        );
    }
    assert_eq!(
        receiver.receipts(),
        i64::try_from(events).expect("n"),
        "no request beyond one per event"
    );
}
