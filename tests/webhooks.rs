//! Delivery-status webhooks end to end: the real binary, real TCP, and the
//! example receiver (`examples/webhook_receiver.py`) as a child process,
//! which verifies every request with the reference `standardwebhooks`
//! package and absorbs redeliveries by `webhook-id`.
//!
//! Needs python3 and `pip3 install standardwebhooks==1.1.0`
//! (`scripts/test.sh` installs it): without it these tests fail, they do
//! not skip.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

mod common;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::webhook::{Receiver, closed_port, endpoint_toml, secret};
use common::{Client, Daemon, Options, Store, message, wait_until};

const FROM: &str = "alice@example.test";
const TO: &str = "dest@example.net";
/// Short retries so that failures and their retries take well under a
/// second each.
const FAST: &str = "retry_schedule = [\"0s\", \"300ms\", \"300ms\", \"300ms\"]\n";
/// Retries for about 20 s: long enough to outlive a daemon restart.
const PATIENT: &str = "retry_schedule = [\"0s\", \"1s\", \"1s\", \"1s\", \"1s\", \"1s\", \"1s\", \
    \"1s\", \"1s\", \"1s\", \"1s\", \"1s\", \"1s\", \"1s\", \"1s\", \"1s\", \"1s\", \"1s\", \
    \"1s\", \"1s\", \"1s\"]\n";

// ---------------------------------------------------------------- helpers

/// A daemon (SQLite, or PostgreSQL in the second pass; file-mode relay) with these
/// `[[webhook]]` sections.
fn daemon(webhooks: &str) -> Daemon {
    Daemon::start(Options {
        extra: webhooks.to_owned(),
        store: Store::FromEnv,
        ..Options::default()
    })
}

/// Submits one message as alice; returns its queue id (asserts 250).
async fn submit(d: &Daemon, key: &str) -> String {
    let mut c = Client::login(d.plain, "alice").await;
    let r = c
        .submit(FROM, &[TO], &message(Some(key), &format!("body of {key}")))
        .await;
    c.quit().await;
    assert_eq!(r.code, 250, "{r:?}");
    r.queue_id().expect("queue id")
}

/// A scratch folder for receiver databases.
fn scratch() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// Runs `smtp-once webhooks ARGS --config ...`; asserts success; stdout.
fn webhooks_cli(d: &Daemon, args: &[&str]) -> String {
    let mut all = vec!["webhooks"];
    all.extend_from_slice(args);
    let out = d.cli(&all);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "webhooks {args:?} failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `webhooks list` rows: webhook-id -> state (pending, sending, delivered,
/// failed), for the lines that are events.
fn listed_states(d: &Daemon, endpoint: &str) -> HashMap<String, String> {
    webhooks_cli(d, &["list", "--endpoint", endpoint, "--limit", "1000"])
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 3 && f[1].starts_with("msg_")).then(|| (f[1].to_owned(), f[3].to_owned()))
        })
        .collect()
}

/// Waits until `webhooks list` shows `n` events of `endpoint`, all
/// delivered; returns their webhook-ids. The receiver writes its receipt
/// before it answers, so its receipts are complete by then.
async fn wait_for_delivered(d: &Daemon, endpoint: &str, n: usize) -> HashSet<String> {
    wait_until(
        &format!("{n} events of {endpoint} listed as delivered"),
        30,
        || {
            let s = listed_states(d, endpoint);
            (s.len() == n && s.values().all(|v| v == "delivered")).then(|| s.into_keys().collect())
        },
    )
    .await
}

/// Waits until the receiver holds `n` jobs (and no more show up at once).
async fn wait_jobs(r: &Receiver, n: usize, secs: u64) -> Vec<common::webhook::Job> {
    wait_until(&format!("{n} jobs at the receiver"), secs, || {
        let jobs = r.jobs();
        assert!(jobs.len() <= n, "more jobs than events: {jobs:#?}");
        (jobs.len() == n).then_some(jobs)
    })
    .await
}

/// Asserts every job has its own webhook-id.
fn assert_distinct_ids(jobs: &[common::webhook::Job]) {
    let ids: HashSet<_> = jobs.iter().map(|j| &j.webhook_id).collect();
    assert_eq!(ids.len(), jobs.len(), "{jobs:#?}");
}

/// Files in the file-mode relay's outbox (one per delivered message).
fn relayed(d: &Daemon) -> usize {
    std::fs::read_dir(d.outbox()).map_or(0, |dir| {
        dir.filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "eml"))
            .count()
    })
}

/// A TCP endpoint that accepts connections, reads nothing and never
/// answers. Returns its address and how many connections it took.
fn hung_endpoint() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().map_while(Result::ok) {
            count.fetch_add(1, Ordering::SeqCst);
            held.push(stream); // kept open, never answered
        }
    });
    (addr, accepted)
}

/// A TCP endpoint that answers every request `200` and then streams an
/// endless chunked body as fast as it can. Returns its address and the
/// number of its connections whose stream the client cut off.
fn flooding_endpoint() -> (SocketAddr, Arc<AtomicUsize>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let cut_off = Arc::new(AtomicUsize::new(0));
    let count = cut_off.clone();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().map_while(Result::ok) {
            let count = count.clone();
            std::thread::spawn(move || {
                let mut request = [0u8; 8192];
                let _ = stream.read(&mut request);
                let chunk = format!("10000\r\n{}\r\n", "x".repeat(0x10000));
                let mut out = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
                while stream.write_all(&out).is_ok() {
                    out = chunk.clone().into_bytes();
                }
                count.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    (addr, cut_off)
}

// ---------------------------------------------------------------- tests

/// (a) Signatures verify with the reference implementation, and the
/// payload carries the message's facts; a receiver with another secret
/// refuses everything (401) and stores nothing, so the verification is real.
#[tokio::test]
async fn events_verify_with_the_reference_implementation_and_carry_the_facts() {
    let dir = scratch();
    let good = Receiver::start(&secret(1), &dir.path().join("good.db"), 0, &[]);
    let wrong = Receiver::start(&secret(2), &dir.path().join("wrong.db"), 0, &[]);
    let d = daemon(&format!(
        "{}{}",
        endpoint_toml("good", &good.url(), &secret(1), FAST),
        endpoint_toml("wrong", &wrong.url(), &secret(1), FAST),
    ));
    let queue_id = submit(&d, "wh-facts-1").await;

    let jobs = wait_jobs(&good, 2, 30).await;
    assert_distinct_ids(&jobs);
    let of = |t: &str| {
        jobs.iter()
            .find(|j| j.event_type == t)
            .unwrap_or_else(|| panic!("no {t} in {jobs:#?}"))
    };
    let accepted = &of("message.accepted").payload;
    assert_eq!(accepted["type"], "message.accepted");
    assert_eq!(accepted["data"]["queue_id"], queue_id.as_str());
    assert_eq!(accepted["data"]["workspace"], "acme");
    assert_eq!(accepted["data"]["idempotency_key"], "wh-facts-1");
    assert_eq!(accepted["data"]["recipients"], serde_json::json!([TO]));
    assert_eq!(accepted["data"]["attempt"], 0);
    let delivered = &of("message.delivered").payload;
    assert_eq!(delivered["data"]["queue_id"], queue_id.as_str());
    assert_eq!(delivered["data"]["workspace"], "acme");
    assert_eq!(delivered["data"]["idempotency_key"], "wh-facts-1");
    assert_eq!(delivered["data"]["recipient"], TO);
    assert_eq!(delivered["data"]["attempt"], 1);
    assert!(
        delivered["timestamp"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z'))
    );
    assert_eq!(
        good.state(&queue_id, TO).as_deref(),
        Some("message.delivered")
    );
    wait_for_delivered(&d, "good", 2).await;
    assert_eq!(good.receipts_with(204), 2);

    // The wrong secret: both events arrive, each is refused, none stored.
    wait_until("both events refused by the wrong receiver", 30, || {
        (wrong.receipts_with(401) >= 2).then_some(())
    })
    .await;
    assert_eq!(wrong.receipts(), wrong.receipts_with(401));
    assert!(wrong.jobs().is_empty());
}

/// (b) An endpoint answering 500 twice gets the event a third time, with
/// the same webhook-id, and stores it once.
#[tokio::test]
async fn failed_attempts_are_retried_with_the_same_webhook_id() {
    let dir = scratch();
    let r = Receiver::start(
        &secret(3),
        &dir.path().join("r.db"),
        0,
        &["--fail-first", "2"],
    );
    let d = daemon(&endpoint_toml(
        "flaky",
        &r.url(),
        &secret(3),
        &format!("{FAST}events = [\"message.accepted\"]\nmax_in_flight = 1\n"),
    ));
    submit(&d, "wh-retry-1").await;
    let jobs = wait_jobs(&r, 1, 30).await;
    let id = &jobs[0].webhook_id;
    // Recorded as delivered: the 2xx was sent, so its receipt is written.
    wait_for_delivered(&d, "flaky", 1).await;
    assert_eq!(r.receipts_for(id), 3, "two 500s, then the 2xx");
    assert_eq!(r.receipts_with(500), 2);
    assert_eq!(r.receipts(), 3);
}

/// HTTPS endpoints: verified against `ca_file` (here the dev certificate,
/// its own root), or else the system's roots, which do not know it: that
/// endpoint gets nothing (a TLS error, retried), never an unverified POST.
#[tokio::test]
async fn https_endpoints_are_verified_against_their_roots() {
    let dir = scratch();
    let cert = common::repo_path("certs/dev-cert.pem");
    let key = common::repo_path("certs/dev-key.pem");
    let (cert, key) = (cert.to_string_lossy(), key.to_string_lossy());
    let r = Receiver::start(
        &secret(6),
        &dir.path().join("r.db"),
        0,
        &["--tls-cert", &cert, "--tls-key", &key],
    );
    let url = r.url().replace("http://", "https://");
    let hooks = endpoint_toml(
        "trusted",
        &url,
        &secret(6),
        &format!("ca_file = \"{cert}\"\nevents = [\"message.accepted\"]\n"),
    ) + &endpoint_toml(
        "unknown-ca",
        &url,
        &secret(6),
        &format!("{FAST}events = [\"message.accepted\"]\n"),
    );
    let d = daemon(&hooks);
    submit(&d, "wh-tls-1").await;
    let jobs = wait_jobs(&r, 1, 30).await;
    assert_eq!(jobs[0].event_type, "message.accepted");
    wait_for_delivered(&d, "trusted", 1).await;
    // The unverified endpoint's attempts fail in the handshake.
    let listed = wait_until("the unknown-CA endpoint's attempts fail", 30, || {
        let out = webhooks_cli(&d, &["list", "--endpoint", "unknown-ca"]);
        out.contains("TLS").then_some(out)
    })
    .await;
    assert!(!listed.contains("delivered"), "{listed}");
    assert_eq!(r.receipts(), 1, "only the verified endpoint's POST arrived");
}

/// (c) kill -9 of smtp-once after the receiver committed an event but
/// before smtp-once recorded the answer: after a restart on the same data
/// directory the event is sent again with the same webhook-id, and the
/// receiver absorbs the duplicate (one job, two receipts or more).
#[tokio::test]
async fn a_crash_before_the_answer_is_recorded_redelivers_the_same_webhook_id() {
    let dir = scratch();
    let mut r = Receiver::start(
        &secret(4),
        &dir.path().join("r.db"),
        0,
        &["--hold-after-commit", "5"],
    );
    let mut d = daemon(&endpoint_toml(
        "crashy",
        &r.url(),
        &secret(4),
        &format!("{FAST}events = [\"message.accepted\"]\n"),
    ));
    submit(&d, "wh-crash-1").await;
    let line = r.wait_line("committed ", 30);
    let id = line["committed ".len()..].to_owned();
    d.kill9(); // the receiver holds its answer: nothing recorded yet
    d.spawn();

    wait_until("the redelivery (and the held answer)", 30, || {
        (r.receipts_for(&id) >= 2).then_some(())
    })
    .await;
    let jobs = r.jobs();
    assert_eq!(jobs.len(), 1, "{jobs:#?}");
    assert_eq!(jobs[0].webhook_id, id);
    // The redelivery met the stored id: answered 200 as a duplicate.
    assert!(r.receipts_with(200) >= 1);
    assert_eq!(
        wait_for_delivered(&d, "crashy", 1).await,
        HashSet::from([id])
    );
}

/// (d) Events wait in the outbox while the endpoint is down, across a
/// restart of the daemon, and all arrive once it is up.
#[tokio::test]
async fn the_outbox_survives_restarts_while_the_endpoint_is_down() {
    let dir = scratch();
    let port = closed_port();
    let url = format!("http://127.0.0.1:{port}/hooks");
    let mut d = daemon(&endpoint_toml("down", &url, &secret(5), PATIENT));
    for i in 0..3 {
        submit(&d, &format!("wh-down-{i}")).await;
    }
    // All three relayed (so their delivered events exist too) and at least
    // one attempt failed.
    wait_until("3 messages relayed", 30, || {
        (relayed(&d) == 3).then_some(())
    })
    .await;
    wait_until("6 events in the outbox", 30, || {
        (d.count("SELECT COUNT(*) FROM webhook_outbox") == 6).then_some(())
    })
    .await;
    wait_until("a failed attempt", 30, || {
        (d.count("SELECT COUNT(*) FROM webhook_outbox WHERE attempts > 0") > 0).then_some(())
    })
    .await;
    assert_eq!(
        d.count("SELECT COUNT(*) FROM webhook_outbox WHERE state = 'delivered'"),
        0
    );
    let status = d.terminate();
    assert!(status.success(), "{status:?}\n{}", d.log());

    let r = Receiver::start(&secret(5), &dir.path().join("r.db"), port, &[]);
    d.spawn();
    let jobs = wait_jobs(&r, 6, 40).await;
    assert_distinct_ids(&jobs);
    let types: Vec<_> = jobs.iter().map(|j| j.event_type.as_str()).collect();
    assert_eq!(
        types.iter().filter(|t| **t == "message.accepted").count(),
        3,
        "{types:?}"
    );
    assert_eq!(
        types.iter().filter(|t| **t == "message.delivered").count(),
        3,
        "{types:?}"
    );
}

/// (e) An endpoint answering 410 Gone is disabled: it gets no further
/// requests; `webhooks list` says so; `webhooks enable` turns it back on
/// and the events that waited arrive.
#[tokio::test]
async fn a_410_disables_the_endpoint_until_enabled() {
    let dir = scratch();
    let db = dir.path().join("r.db");
    let mut gone = Receiver::start(&secret(6), &db, 0, &["--status-always", "410"]);
    let port = gone.addr.port();
    let d = daemon(&endpoint_toml(
        "gone",
        &gone.url(),
        &secret(6),
        // One request at a time: exactly one request meets the 410.
        &format!("{FAST}max_in_flight = 1\n"),
    ));
    submit(&d, "wh-gone-0").await;
    wait_until("the first 410", 30, || {
        (gone.receipts_with(410) == 1).then_some(())
    })
    .await;
    wait_until("the endpoint listed as disabled", 20, || {
        webhooks_cli(&d, &["list"])
            .contains("endpoint \"gone\" DISABLED")
            .then_some(())
    })
    .await;
    for i in 1..3 {
        submit(&d, &format!("wh-gone-{i}")).await;
    }
    // All three relayed: their delivered events are written; none is sent.
    wait_until("3 messages relayed", 30, || {
        (relayed(&d) == 3).then_some(())
    })
    .await;
    wait_until("6 events in the outbox", 30, || {
        (d.count("SELECT COUNT(*) FROM webhook_outbox") == 6).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await; // three sender polls
    assert_eq!(gone.receipts(), 1, "requests to a disabled endpoint");

    // A working receiver on the same port and database, then enable.
    gone.kill();
    let r = Receiver::start(&secret(6), &db, port, &[]);
    let out = webhooks_cli(&d, &["enable", "--endpoint", "gone"]);
    assert!(out.contains("enabled"), "{out}");
    let jobs = wait_jobs(&r, 6, 30).await;
    assert_distinct_ids(&jobs);
    assert!(!webhooks_cli(&d, &["list"]).contains("DISABLED"));
}

/// (f) Operator commands: `list` shows delivered events; `redeliver --id`
/// sends that event again with its webhook-id (the receiver absorbs it);
/// `redeliver --since 1h --endpoint` sends every event again.
#[tokio::test]
async fn operators_list_and_redeliver_with_the_same_webhook_id() {
    let dir = scratch();
    let r = Receiver::start(&secret(7), &dir.path().join("r.db"), 0, &[]);
    let d = daemon(&endpoint_toml("ops", &r.url(), &secret(7), FAST));
    submit(&d, "wh-ops-1").await;
    submit(&d, "wh-ops-2").await;
    let jobs = wait_jobs(&r, 4, 30).await;
    let ids: Vec<String> = jobs.iter().map(|j| j.webhook_id.clone()).collect();
    let listed = wait_for_delivered(&d, "ops", 4).await;
    assert_eq!(listed, ids.iter().cloned().collect::<HashSet<_>>());

    // One event again.
    let one = &ids[0];
    assert_eq!(r.receipts_for(one), 1);
    let out = webhooks_cli(&d, &["redeliver", "--id", one]);
    assert!(out.starts_with("1 event"), "{out}");
    wait_until("the redelivery of one event", 20, || {
        (r.receipts_for(one) == 2).then_some(())
    })
    .await;
    assert_eq!(r.jobs().len(), 4, "a redelivery is no new job");

    // Every event of the endpoint since an hour ago.
    let out = webhooks_cli(&d, &["redeliver", "--since", "1h", "--endpoint", "ops"]);
    assert!(out.starts_with("4 event"), "{out}");
    wait_until("every event again", 20, || {
        ids.iter()
            .all(|id| r.receipts_for(id) == if id == one { 3 } else { 2 })
            .then_some(())
    })
    .await;
    assert_eq!(r.jobs().len(), 4);
    wait_for_delivered(&d, "ops", 4).await;
}

/// (g) `check-config` names a bad secret by its place and fails.
#[test]
fn check_config_reports_a_bad_secret() {
    use base64::Engine;
    let short = format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode([1u8; 16])
    );
    let unprefixed = base64::engine::general_purpose::STANDARD.encode([1u8; 32]);
    for (bad, why) in [
        (short.as_str(), "16 bytes"),
        (unprefixed.as_str(), "whsec_"),
    ] {
        let dir = scratch();
        let text = common::config_text(
            &Options {
                extra: endpoint_toml("bad", "http://127.0.0.1:9/hooks", bad, ""),
                store: Store::FromEnv,
                ..Options::default()
            },
            dir.path(),
        );
        let path = dir.path().join("c.toml");
        std::fs::write(&path, text).expect("write config");
        let out = std::process::Command::new(common::BIN)
            .args(["check-config", "--config"])
            .arg(&path)
            .output()
            .expect("run check-config");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad}: {stderr}");
        let line = stderr
            .lines()
            .find(|l| l.trim_start().starts_with("webhook[0].secret:"))
            .unwrap_or_else(|| panic!("no webhook[0].secret problem for {bad}:\n{stderr}"));
        assert!(line.contains(why), "{line}");
    }
}

/// (h) An endpoint that accepts and never answers slows neither
/// acceptance nor delivery: 20 messages are all accepted and relayed while
/// its requests hang.
#[tokio::test]
async fn a_hung_endpoint_slows_nothing_else() {
    let (addr, connections) = hung_endpoint();
    let d = daemon(&endpoint_toml(
        "hung",
        &format!("http://{addr}/hooks"),
        &secret(8),
        &format!("timeout = \"2s\"\n{PATIENT}"),
    ));
    let mut c = Client::login(d.plain, "alice").await;
    for i in 0..20 {
        let key = format!("wh-hung-{i}");
        let r = c
            .submit(FROM, &[TO], &message(Some(&key), &format!("body {i}")))
            .await;
        assert_eq!(r.code, 250, "message {i}: {r:?}");
    }
    c.quit().await;
    wait_until("20 messages relayed", 30, || {
        (relayed(&d) == 20).then_some(())
    })
    .await;
    assert!(
        connections.load(Ordering::SeqCst) > 0,
        "the endpoint was never called"
    );
    assert_eq!(
        d.count("SELECT COUNT(*) FROM webhook_outbox WHERE state = 'delivered'"),
        0
    );
}

/// An endpoint that answers 200 and then sends an endless body: the
/// sender reads at most 64 KiB of it, counts the 200, and drops the
/// connection (never buffering what is left); acceptance and delivery go on.
#[tokio::test]
async fn an_endless_response_body_is_cut_off() {
    let (addr, cut_off) = flooding_endpoint();
    let d = daemon(&endpoint_toml(
        "flood",
        &format!("http://{addr}/hooks"),
        &secret(10),
        "events = [\"message.accepted\"]\ntimeout = \"10s\"\n",
    ));
    submit(&d, "wh-flood-1").await;
    submit(&d, "wh-flood-2").await;
    wait_for_delivered(&d, "flood", 2).await;
    wait_until("the endpoint's streams cut off", 20, || {
        (cut_off.load(Ordering::SeqCst) >= 2).then_some(())
    })
    .await;
    wait_until("both messages relayed", 20, || {
        (relayed(&d) == 2).then_some(())
    })
    .await;
}

/// Issue 20 finding 10: a webhook without `name` was named by its whole
/// URL, so a `?token=` in it showed in the daemon's log and in `webhooks
/// list`. Its name is now the URL without query, and neither shows the
/// token; a URL with `user:password@` is refused without printing either.
#[tokio::test]
async fn issue_20_finding_10_a_token_in_the_url_is_never_shown() {
    let dir = scratch();
    let gone = Receiver::start(
        &secret(9),
        &dir.path().join("r.db"),
        0,
        &["--status-always", "410"],
    );
    let url = format!("{}?token=s3cret", gone.url());
    let d = daemon(&format!(
        "\n[[webhook]]\nurl = \"{url}\"\nsecret = \"{}\"\n{FAST}max_in_flight = 1\n",
        secret(9)
    ));
    submit(&d, "wh-token-1").await;
    // The 410 disables the endpoint: logged and listed by its name.
    let name = gone.url();
    let listed = wait_until("the endpoint listed as disabled", 30, || {
        let out = webhooks_cli(&d, &["list"]);
        out.contains(&format!("endpoint {name:?} DISABLED"))
            .then_some(out)
    })
    .await;
    assert!(
        listed.contains(&format!("endpoint {name:?} last")),
        "{listed}"
    );
    let log = d.log();
    assert!(log.contains("webhook endpoint disabled"), "{log}");
    for shown in [&listed, &log] {
        assert!(!shown.contains("s3cret"), "{shown}");
    }
    let out = webhooks_cli(&d, &["list", "--endpoint", &name]);
    assert!(out.contains("message.accepted"), "{out}");
    assert!(!out.contains("s3cret"), "{out}");

    // User info is refused, and the refusal shows neither it nor the token.
    let text = common::config_text(
        &Options {
            extra: format!(
                "\n[[webhook]]\nurl = \"http://user:pw7Zq@127.0.0.1:9/hooks?token=s3cret\"\nsecret = \"{}\"\n",
                secret(9)
            ),
            store: Store::Sqlite,
            ..Options::default()
        },
        dir.path(),
    );
    let path = dir.path().join("c.toml");
    std::fs::write(&path, text).expect("write config");
    let (ok, out) = common::check_config(&path);
    assert!(!ok, "{out}");
    assert!(
        out.contains(
            "webhook[0].url: \"http://127.0.0.1:9/hooks\" needs a host, and no user:password@"
        ),
        "{out}"
    );
    // A password no temporary folder's random name can contain ("pw" was
    // one: /tmp/.tmptOpwr8 failed this once).
    assert!(!out.contains("s3cret") && !out.contains("pw7Zq"), "{out}");
}
