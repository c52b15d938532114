//! Issue 20 finding 13 (second half): `RUST_LOG=debug` with PostgreSQL
//! logged every SQL parameter, message bodies included. The real binary on
//! a fresh PostgreSQL database, at debug and at trace, takes a message over
//! SMTP and HTTP and relays it; nothing of it may show on stderr.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

mod common;

use std::sync::Arc;

use common::http::Request;
use common::pg::TestDb;
use common::{Client, Daemon, Options, Store, api_token, wait_until};

/// `marker` as a `[u8]` debug-prints it (how a bytea parameter is logged).
fn as_bytes_debug(marker: &str) -> String {
    let list = format!("{:?}", marker.as_bytes());
    list.trim_matches(['[', ']']).to_owned()
}

// Issue 20 finding 13: SQL parameters (body, key) never reach
// the log, at any level RUST_LOG asks for, even naming tokio_postgres.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_parameters_never_reach_the_log() {
    for rust_log in ["debug", "trace,tokio_postgres=trace"] {
        let d = Daemon::start(Options {
            store: Store::Postgres(Arc::new(TestDb::create())),
            extra: "[http]\naddr = \"127.0.0.1:0\"\n".into(),
            env: vec![("RUST_LOG", rust_log)],
            ..Options::default()
        });
        let marker = "zq7secretmarker";
        // Not in a recipient: the worker logs those at info, by design.
        let rcpt = "r@example.net".to_owned();

        let mut c = Client::login(d.plain, "bob").await;
        let msg = format!(
            "From: bob@example.test\r\nTo: {rcpt}\r\nX-Bird-Idempotency-Key: {marker}-smtp\r\n\
             Subject: s\r\n\r\nbody {marker}\r\n"
        );
        let r = c.submit("bob@example.test", &[&rcpt], msg.as_bytes()).await;
        assert_eq!(r.code, 250, "{r:?}");
        c.quit().await;

        let json = serde_json::json!({
            "from": "bob@example.test", "to": [rcpt], "subject": "s", "text": format!("body {marker}"),
        });
        let r = Request::new("POST", "/v1/messages")
            .bearer(&api_token("bob"))
            .header("Idempotency-Key", &format!("{marker}-http"))
            .body("application/json", json.to_string().as_bytes())
            .send(d.http.expect("http listener"))
            .await;
        assert_eq!(r.status, 202, "{r:?}");

        // Both relayed (file mode): the worker's queries ran too.
        wait_until("both messages relayed", 10, || {
            let n = std::fs::read_dir(d.outbox()).ok()?.count();
            (n >= 2).then_some(())
        })
        .await;
        let log = d.log();
        assert!(
            log.contains("DEBUG"),
            "RUST_LOG={rust_log} was not in effect:\n{log}"
        );
        assert!(
            !log.contains(marker),
            "RUST_LOG={rust_log}: the marker is in the log:\n{log}"
        );
        assert!(
            !log.contains(&as_bytes_debug(marker)),
            "RUST_LOG={rust_log}: the body's bytes are in the log"
        );
        assert!(!log.contains("with parameters"), "RUST_LOG={rust_log}");
    }
}
