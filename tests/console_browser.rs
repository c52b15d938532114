//! Issue 25: the web console in a real browser. A daemon with the console,
//! a next hop that greylists one recipient (so a message stays deferred,
//! with the next hop's reply in its attempts), and the example webhook
//! receiver (so message.held and message.released are delivered); then
//! `tests/console/browser.mjs` drives Debian's chromium through
//! playwright-core: sign in, find the message by its key, its attempts,
//! hold and release through their confirmation pages, the webhook events
//! on the message page, sign out; another workspace cannot see or act on
//! it; posts without the form token are refused; the operator's overview
//! and webhook pages; the list and the message on a phone's screen, where
//! a message submitted meanwhile appears in the open list by its refresh.
//! Screenshots go to `target/console-screenshots/`.
//!
//! Needs node, `tests/console/node_modules` (`npm ci --prefix
//! tests/console`) and `/usr/bin/chromium`: without them it fails, it does
//! not skip (scripts/test.sh installs them).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::http::{Request, submit_raw};
use common::pg::TestDb;
use common::tiny::Tiny;
use common::webhook::{Receiver, endpoint_toml, secret};
use common::{Daemon, Options, Store, api_token, operator_user, repo_path};

const CHROMIUM: &str = "/usr/bin/chromium";
/// The key of the message the browser looks for.
const KEY: &str = "order-1042-receipt";
/// The recipient the next hop greylists: its message stays deferred.
const GREYLISTED: &str = "later@example.net";

/// A next hop that accepts every recipient but `GREYLISTED`, which it
/// asks to try again later, every time.
fn next_hop() -> Tiny {
    Tiny::start(
        "127.0.0.1:0".parse().expect("addr"),
        Arc::new(|rcpt: &str, _| {
            if rcpt == GREYLISTED {
                "451 4.7.1 Greylisted, please try again later".to_string()
            } else {
                "250 2.1.5 Ok".to_string()
            }
        }),
        Duration::ZERO,
    )
}

fn daemon(store: Store, hop: &Tiny, receiver: &Receiver) -> Daemon {
    let hooks = endpoint_toml(
        "ops",
        &receiver.url(),
        &secret(9),
        "events = [\"message.held\", \"message.released\", \"message.delivered\", \"message.deferred\"]",
    );
    Daemon::start(Options {
        relay: Some(format!(
            "[relay]\nmode = \"smarthost\"\nsmarthost = \"{}\"\ntls = \"none\"\n\
             retry_schedule = [\"1h\"]\npoll_interval = \"50ms\"\n",
            hop.addr
        )),
        extra: format!(
            "[http]\naddr = \"127.0.0.1:0\"\nconsole = true\n{hooks}{}",
            operator_user()
        ),
        store,
        ..Options::default()
    })
}

/// Submits through the API as `user`; the queue id.
async fn submit(
    http: SocketAddr,
    user: &str,
    from: &str,
    to: &str,
    subject: &str,
    key: &str,
) -> String {
    let message = format!(
        "From: <{from}>\r\nTo: <{to}>\r\nSubject: {subject}\r\nMessage-ID: <{key}@example.test>\r\n\r\n\
         Hello from the console's browser test.\r\n"
    );
    submit_raw(http, user, (from, to), Some(key), message.as_bytes()).await
}

async fn wait_state(http: SocketAddr, user: &str, id: &str, wants: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = Request::new("GET", &format!("/v1/messages/{id}"))
            .bearer(&api_token(user))
            .send(http)
            .await;
        if r.json()["state"] == wants {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{id}: never {wants}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Where the screenshots go: `<target>/console-screenshots/` beside this
/// test's binary (`<target>/debug/deps/console_browser-…`).
fn screenshot_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.ancestors()
        .nth(3)
        .map_or_else(|| repo_path("target"), Path::to_path_buf)
        .join("console-screenshots")
}

/// What the browser needs, or a failure that says how to get it.
fn require_browser() {
    assert!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is missing: apt-get install chromium (scripts/test.sh does)"
    );
    assert!(
        repo_path("tests/console/node_modules/playwright-core").is_dir(),
        "tests/console/node_modules is missing: npm ci --prefix tests/console (scripts/test.sh does)"
    );
}

/// Fills the store (a deferred message with `KEY` and a few delivered ones
/// in alice's workspace, one in carol's), runs the browser script, and
/// checks its answer and its screenshots.
async fn browse(store: Store, label: &str, core_only: bool) {
    require_browser();
    let dir = tempfile::tempdir().expect("tempdir");
    let receiver = Receiver::start(&secret(9), &dir.path().join("hooks.db"), 0, &[]);
    let hop = next_hop();
    let d = daemon(store, &hop, &receiver);
    let http = d.http.expect("http listener");

    for (n, to) in ["ann@example.net", "bo@example.net", "cy@example.net"]
        .iter()
        .enumerate()
    {
        let id = submit(
            http,
            "alice",
            "alice@example.test",
            to,
            &format!("Receipt for order {}", 1039 + n),
            &format!("order-{}-receipt", 1039 + n),
        )
        .await;
        wait_state(http, "alice", &id, "delivered").await;
    }
    let theirs = submit(
        http,
        "carol",
        "carol@globex.test",
        "dee@example.net",
        "Invoice 7",
        "invoice-7",
    )
    .await;
    wait_state(http, "carol", &theirs, "delivered").await;
    let id = submit(
        http,
        "alice",
        "alice@example.test",
        GREYLISTED,
        "Receipt for order 1042",
        KEY,
    )
    .await;
    wait_state(http, "alice", &id, "deferred").await;

    let shots = screenshot_dir();
    let mut script = tokio::process::Command::new("node");
    script
        .arg(repo_path("tests/console/browser.mjs"))
        .env("CONSOLE_URL", format!("http://{http}"))
        .env("CONSOLE_SHOTS", &shots)
        .env("CONSOLE_KEY", KEY)
        .env("CONSOLE_ACCOUNT_1", "alice:alice-pw")
        .env("CONSOLE_ACCOUNT_2", "carol:carol-pw")
        .env("CONSOLE_OPERATOR", "olga:olga-pw")
        .env("CONSOLE_API_TOKEN_1", api_token("alice"))
        .env("CONSOLE_API_FROM_1", "alice@example.test")
        .env("CONSOLE_CHROMIUM", CHROMIUM)
        .env("CONSOLE_LABEL", label)
        .env("CONSOLE_CORE_ONLY", if core_only { "1" } else { "0" })
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(300), script.output())
        .await
        .expect("the browser script finished within 5 minutes")
        .expect("node runs (apt-get install nodejs npm)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "browser.mjs failed ({}):\n{stderr}\n{stdout}\ndaemon log:\n{}",
        out.status,
        d.log()
    );
    let result: serde_json::Value = stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .map(|j| serde_json::from_str(j).expect("RESULT is JSON"))
        .unwrap_or_else(|| panic!("no RESULT line:\n{stdout}"));
    assert_eq!(
        result["id"],
        id.as_str(),
        "the browser found another message"
    );

    let mut expected = vec![
        "login",
        "overview-workspace",
        "list",
        "list-by-key",
        "message",
        "forbidden",
        "confirm-hold",
        "message-held",
        "message-events",
        "events",
        "not-found",
    ];
    if !core_only {
        expected.extend(["overview", "webhooks", "phone-list", "phone-message"]);
    }
    for name in expected {
        let file = shots.join(format!("{label}{name}.png"));
        let bytes = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(
            bytes.len() > 1000 && bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
            "{} is not a PNG ({} bytes)",
            file.display(),
            bytes.len()
        );
    }

    // What the browser did, seen from the store: held, then released (and
    // nothing else: no forged post acted), by the console as alice.
    let jobs = receiver.jobs();
    let mut acted: Vec<&str> = jobs
        .iter()
        .filter(|j| j.queue_id.as_deref() == Some(id.as_str()))
        .map(|j| j.event_type.as_str())
        .filter(|t| matches!(*t, "message.held" | "message.released"))
        .collect();
    acted.sort_unstable();
    assert_eq!(acted, ["message.held", "message.released"], "{jobs:?}");
    assert!(
        jobs.iter()
            .filter(|j| j.event_type == "message.held")
            .all(|j| j.payload["data"]["actor"] == "console:alice"),
        "{jobs:?}"
    );
}

/// One browser at a time: two Chromiums and their daemons side by side on
/// a 2-core machine made one run outlast its 5-minute bound.
static ONE_BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_chromium_on_sqlite() {
    let _one = ONE_BROWSER.lock().await;
    browse(Store::Sqlite, "", false).await;
}

/// The core flow again on PostgreSQL (no operator pages, no phone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_chromium_on_postgres() {
    let _one = ONE_BROWSER.lock().await;
    browse(Store::Postgres(Arc::new(TestDb::create())), "pg-", true).await;
}
