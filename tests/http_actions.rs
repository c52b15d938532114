//! Issue 22 items 3-4: the API's queue actions (`DELETE /v1/messages/{id}`,
//! `POST /v1/messages/{id}/retry|hold|release`) against the real binary, on
//! SQLite and on PostgreSQL: the seeds' table for each (replay byte for
//! byte, a different request under the key, a key in flight, a ledger that
//! cannot be read), workspace isolation and the operator role, a cancel
//! refused under a live lease and allowed once it ends, and the webhook
//! events each action causes.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::http::{Request, Response, submit_raw};
use common::pg::TestDb;
use common::webhook::{Receiver, endpoint_toml, secret};
use common::{
    Daemon, OPERATOR_TOKEN, Options, Store, api_token, operator_user, stalling_next_hop, wait_until,
};

const RAW: &str = "message/rfc822";

fn raw_message(subject: &str) -> Vec<u8> {
    format!(
        "From: Alice <alice@example.test>\r\nTo: r@example.net\r\nSubject: {subject}\r\n\r\nHello.\r\n"
    )
    .into_bytes()
}

async fn submit(api: std::net::SocketAddr, subject: &str) -> String {
    let envelope = ("alice@example.test", "r@example.net");
    submit_raw(api, "alice", envelope, None, &raw_message(subject)).await
}

fn action<'a>(method: &'a str, path: &'a str, token: &str, key: Option<&str>) -> Request<'a> {
    let mut r = Request::new(method, path).bearer(token);
    if let Some(k) = key {
        r = r.header("Idempotency-Key", k);
    }
    r
}

async fn state_of(api: std::net::SocketAddr, id: &str) -> String {
    let r = Request::new("GET", &format!("/v1/messages/{id}"))
        .bearer(&api_token("alice"))
        .send(api)
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    r.json()["state"].as_str().expect("state").to_owned()
}

async fn wait_state(api: std::net::SocketAddr, id: &str, wants: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let state = state_of(api, id).await;
        if state == wants {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{id}: still {state}, waiting for {wants}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn code(r: &Response) -> (u16, String) {
    (r.status, r.json()["code"].as_str().unwrap_or("").to_owned())
}

/// Holds the message's row (PostgreSQL) or the database's write lock
/// (SQLite) from a foreign connection, so an action on it waits.
enum Lock {
    Sqlite(rusqlite::Connection),
    Pg(tokio_postgres::Client),
}

impl Lock {
    async fn take(d: &Daemon, id: &str) -> Lock {
        match &d.pg {
            Some(db) => {
                let c = db.client().await;
                c.batch_execute(&format!(
                    "BEGIN; SELECT 1 FROM queue WHERE id = '{id}' FOR UPDATE"
                ))
                .await
                .expect("lock");
                Lock::Pg(c)
            }
            None => {
                let c = d.db();
                c.execute_batch("BEGIN IMMEDIATE").expect("lock");
                Lock::Sqlite(c)
            }
        }
    }

    async fn release(self) {
        match self {
            Lock::Sqlite(c) => c.execute_batch("ROLLBACK").expect("unlock"),
            Lock::Pg(c) => c.batch_execute("ROLLBACK").await.expect("unlock"),
        }
    }
}

async fn script(store: Store) {
    let dir = tempfile::tempdir().expect("tempdir");
    let receiver = Receiver::start(&secret(9), &dir.path().join("hooks.db"), 0, &[]);
    let (port, open) = stalling_next_hop();
    let d = Daemon::start(Options {
        relay: Some(format!(
            "[relay]\nmode = \"smarthost\"\nsmarthost = \"127.0.0.1:{port}\"\ntls = \"none\"\n\
             retry_schedule = [\"1h\"]\npoll_interval = \"50ms\"\n"
        )),
        extra: format!(
            "[http]\naddr = \"127.0.0.1:0\"\n{}{}",
            endpoint_toml(
                "ops",
                &receiver.url(),
                &secret(9),
                "events = [\"message.cancelled\", \"message.held\", \"message.released\", \"message.retried\"]"
            ),
            operator_user()
        ),
        store,
        ..Options::default()
    });
    let api = d.http.expect("http listener");
    let alice = api_token("alice");

    // An attempt holds M1 (the next hop says nothing): a cancel is refused
    // with a retry-later answer that is not stored under its key.
    let m1 = submit(api, "m1").await;
    wait_state(api, &m1, "delivering").await;
    let cancel_path = format!("/v1/messages/{m1}");
    let refused = action("DELETE", &cancel_path, &alice, Some("c1"))
        .send(api)
        .await;
    assert_eq!(code(&refused), (409, "Delivering".into()), "{refused:?}");
    assert_eq!(refused.header("retry-after"), Some("5"));
    open.send(true).expect("open the next hop");
    wait_state(api, &m1, "deferred").await;

    // Hold: done, then replayed byte for byte under its key.
    let hold_path = format!("/v1/messages/{m1}/hold");
    let held = action("POST", &hold_path, &alice, Some("h1"))
        .send(api)
        .await;
    assert_eq!(held.status, 200, "{held:?}");
    assert_eq!(
        (
            held.json()["state"].as_str(),
            held.json()["changed"].as_bool()
        ),
        (Some("held"), Some(true))
    );
    assert!(!held.is_replay());
    let again = action("POST", &hold_path, &alice, Some("h1"))
        .send(api)
        .await;
    assert_eq!((again.status, again.is_replay()), (200, true));
    assert_eq!(again.body, held.body, "the stored answer, byte for byte");
    // The same key for another request: E01005 (path, then body).
    let release_path = format!("/v1/messages/{m1}/release");
    let other = action("POST", &release_path, &alice, Some("h1"))
        .send(api)
        .await;
    assert_eq!(code(&other), (409, "E01005".into()));
    let with_body = action("POST", &hold_path, &alice, Some("h1"))
        .body("application/json", b"{\"reason\":\"x\"}")
        .send(api)
        .await;
    assert_eq!(code(&with_body), (409, "E01005".into()));
    // A submission's key is the same key space.
    let used = Request::new(
        "POST",
        "/v1/messages?from=alice%40example.test&to=r%40example.net",
    )
    .bearer(&alice)
    .header("Idempotency-Key", "h1")
    .body(RAW, &raw_message("m9"))
    .send(api)
    .await;
    assert_eq!(code(&used), (409, "E01005".into()));

    // A refusal is stored too: releasing a message that is not held.
    let m2 = submit(api, "m2").await;
    wait_state(api, &m2, "deferred").await;
    let not_held = format!("/v1/messages/{m2}/release");
    let r = action("POST", &not_held, &alice, Some("r2"))
        .send(api)
        .await;
    assert_eq!(code(&r), (409, "InvalidState".into()), "{r:?}");
    let r2 = action("POST", &not_held, &alice, Some("r2"))
        .send(api)
        .await;
    assert_eq!((r2.status, r2.is_replay(), &r2.body), (409, true, &r.body));

    // A key in flight: the first request waits on a foreign lock, the
    // second gets E01004; the first then completes.
    let lock = Lock::take(&d, &m1).await;
    let first = tokio::spawn({
        let path = release_path.clone();
        let token = alice.clone();
        async move { action("POST", &path, &token, Some("f1")).send(api).await }
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    let second = action("POST", &release_path, &alice, Some("f1"))
        .send(api)
        .await;
    assert_eq!(code(&second), (409, "E01004".into()), "{second:?}");
    lock.release().await;
    let first = first.await.expect("first request");
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.json()["state"], "deferred");

    // Another workspace: 404 for every action and for GET, as if absent.
    let carol = api_token("carol");
    for (method, path) in [
        ("DELETE", cancel_path.clone()),
        ("POST", hold_path.clone()),
        ("POST", format!("/v1/messages/{m1}/retry")),
        ("GET", cancel_path.clone()),
    ] {
        let r = action(method, &path, &carol, None).send(api).await;
        assert_eq!(code(&r), (404, "NotFound".into()), "{method} {path}");
    }
    // The operator sees and acts on every workspace.
    let listed = action("GET", "/v1/messages?workspace=acme", OPERATOR_TOKEN, None)
        .send(api)
        .await;
    assert_eq!(listed.status, 200, "{listed:?}");
    assert_eq!(listed.json()["messages"].as_array().map(Vec::len), Some(2));
    let own_only = action("GET", "/v1/messages?workspace=acme", &carol, None)
        .send(api)
        .await;
    assert_eq!(own_only.status, 400);
    let r = action("POST", &hold_path, OPERATOR_TOKEN, Some("o1"))
        .send(api)
        .await;
    assert_eq!((r.status, r.json()["state"].as_str()), (200, Some("held")));

    // The cancel refused earlier goes through under the same key now.
    let cancelled = action("DELETE", &cancel_path, &alice, Some("c1"))
        .send(api)
        .await;
    assert_eq!(cancelled.status, 200, "{cancelled:?}");
    assert!(!cancelled.is_replay());
    assert_eq!(cancelled.json()["state"], "cancelled");
    assert_eq!(
        cancelled.json()["cancelled_recipients"],
        serde_json::json!(["r@example.net"])
    );
    let detail = action("GET", &cancel_path, &alice, None).send(api).await;
    assert_eq!(detail.json()["recipients"][0]["outcome"], "cancelled");
    let retry = action("POST", &format!("/v1/messages/{m1}/retry"), &alice, None)
        .send(api)
        .await;
    assert_eq!(code(&retry), (409, "InvalidState".into()));

    // The ledger cannot be read: E01033, nothing done, nothing stored.
    d.hide_ledger();
    let hold2 = format!("/v1/messages/{m2}/hold");
    let down = action("POST", &hold2, &alice, Some("d1")).send(api).await;
    assert_eq!(code(&down), (503, "E01033".into()), "{down:?}");
    d.restore_ledger();
    assert_eq!(state_of(api, &m2).await, "deferred");
    let up = action("POST", &hold2, &alice, Some("d1")).send(api).await;
    assert_eq!((up.status, up.is_replay()), (200, false));

    // Each change that changed something is an event: hold (alice), the
    // release in flight, the operator's hold, the cancel, the last hold.
    let jobs = wait_until("five action events", 30, || {
        let jobs = receiver.jobs();
        (jobs.len() >= 5).then_some(jobs)
    })
    .await;
    let mut seen: Vec<(String, String)> = jobs
        .iter()
        .map(|j| {
            (
                j.event_type.clone(),
                j.payload["data"]["actor"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    // Sent as they come due, several at a time: in any order.
    seen.sort();
    let wants = [
        ("message.cancelled", "api:alice"),
        ("message.held", "api:alice"),
        ("message.held", "api:alice"),
        ("message.held", "api:olga"),
        ("message.released", "api:alice"),
    ];
    assert_eq!(
        seen,
        wants.map(|(t, a)| (t.to_owned(), a.to_owned())),
        "{jobs:?}"
    );
    let cancel = jobs
        .iter()
        .find(|j| j.event_type == "message.cancelled")
        .expect("cancel event");
    assert_eq!(cancel.queue_id.as_deref(), Some(m1.as_str()));
    assert_eq!(
        cancel.payload["data"]["recipients"],
        serde_json::json!(["r@example.net"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_actions_follow_the_seeds_on_sqlite() {
    script(Store::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_actions_follow_the_seeds_on_postgres() {
    script(Store::Postgres(Arc::new(TestDb::create()))).await;
}

/// The action routes read their bodies as submissions do: more than 16 KiB
/// is a 413 that stores nothing under the key, and a body that never
/// finishes is a 408 at the request deadline.
#[tokio::test]
async fn action_bodies_are_bounded_and_timed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let d = Daemon::start(Options {
        relay: Some("[relay]\nmode = \"smarthost\"\nsmarthost = \"127.0.0.1:9\"\ntls = \"none\"\npaused = true\n".into()),
        extra: "[http]\naddr = \"127.0.0.1:0\"\n\n[limits]\ncommand_time_limit = \"1s\"\nmessage_time_limit = \"2s\"\n".into(),
        store: Store::Sqlite,
        ..Options::default()
    });
    let api = d.http.expect("http listener");
    let alice = api_token("alice");
    let id = submit(api, "bounded").await;
    let path = format!("/v1/messages/{id}/hold");

    let big = vec![b'x'; 17 * 1024];
    let refused = action("POST", &path, &alice, Some("big-1"))
        .body("application/json", &big)
        .send(api)
        .await;
    assert_eq!(refused.status, 413, "{refused:?}");
    assert_eq!(state_of(api, &id).await, "queued", "nothing done");
    // Nothing was stored under the key: the same key with a small body acts.
    let held = action("POST", &path, &alice, Some("big-1")).send(api).await;
    assert_eq!(held.status, 200, "{held:?}");
    assert!(!held.is_replay());
    assert_eq!(state_of(api, &id).await, "held");

    // A body that never finishes: 408 within the deadline, nothing done.
    let mut slow = tokio::net::TcpStream::connect(api).await.expect("connect");
    let head = format!(
        "POST /v1/messages/{id}/release HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {alice}\r\n\
         Idempotency-Key: slow-1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{"
    );
    slow.write_all(head.as_bytes()).await.expect("write");
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), slow.read(&mut buf))
        .await
        .expect("answered within 10 s")
        .expect("read");
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert_eq!(state_of(api, &id).await, "held", "the release never ran");
}
