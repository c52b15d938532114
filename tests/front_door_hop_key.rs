//! What the next hop sees of an HTTP or SMTP submission, over real TCP
//! against the real binary relaying to the tiny SMTP server of
//! `common/tiny.rs`: the `X-Bird-Idempotency-Key` (issue 20 finding 6) and
//! the `Received:` header (issue 20 finding 12).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::http::{Request, Response};
use common::tiny::{Tiny, Txn, accept_all};
use common::{Client, Daemon, Options, api_token, wait_until};

/// Fast retries and polling, so the suite never waits on production timers.
const FAST: &str = "retry_schedule = [\"200ms\"]\npoll_interval = \"50ms\"\n";

/// A daemon relaying to `tiny`, with `server_extra` lines in `[server]`.
fn daemon(tiny: &Tiny, server_extra: &str) -> Daemon {
    let options = Options {
        relay: Some(format!(
            "[relay]\nmode = \"smarthost\"\nsmarthost = \"{}\"\ntls = \"none\"\n{FAST}",
            tiny.addr
        )),
        extra: "[http]\naddr = \"127.0.0.1:0\"\n".into(),
        ..Options::default()
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let text = common::config_text(&options, dir.path()).replacen(
        "[server]\n",
        &format!("[server]\n{server_extra}\n"),
        1,
    );
    Daemon::with_config(dir, &text)
}

fn tiny() -> Tiny {
    Tiny::start(
        "127.0.0.1:0".parse().expect("addr"),
        accept_all(),
        Duration::ZERO,
    )
}

async fn post(d: &Daemon, key: Option<&str>, target: &str, ctype: &str, body: &[u8]) -> Response {
    let mut r = Request::new("POST", target)
        .bearer(&api_token("bob"))
        .body(ctype, body);
    if let Some(k) = key {
        r = r.header("Idempotency-Key", k);
    }
    r.send(d.http.expect("http listener")).await
}

fn queued(r: &Response) -> String {
    assert_eq!(r.status, 202, "{r:?} {}", String::from_utf8_lossy(&r.body));
    r.json()["id"].as_str().expect("id").to_owned()
}

fn json(subject: &str) -> Vec<u8> {
    serde_json::json!({
        "from": "bob@example.test",
        "to": ["r@example.net"],
        "subject": subject,
        "text": "hello",
    })
    .to_string()
    .into_bytes()
}

/// The transactions the tiny server read for the message with `subject`.
async fn relayed(tiny: &Tiny, subject: &str, want: usize) -> Vec<Txn> {
    let needle = format!("Subject: {subject}\r\n");
    let found = wait_until("the relayed message", 10, || {
        let mine: Vec<Txn> = tiny
            .txns()
            .into_iter()
            .filter(|t| String::from_utf8_lossy(&t.data).contains(&needle))
            .collect();
        (mine.len() >= want).then_some(mine)
    })
    .await;
    // Nothing more comes for it (a second copy would show by now).
    tokio::time::sleep(Duration::from_millis(400)).await;
    let again = tiny
        .txns()
        .into_iter()
        .filter(|t| String::from_utf8_lossy(&t.data).contains(&needle))
        .count();
    assert_eq!(again, found.len(), "relayed again");
    found
}

/// Every `X-Bird-Idempotency-Key` value in the header section.
fn keys(data: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(data);
    let head = text.split("\r\n\r\n").next().unwrap_or_default();
    head.split("\r\n")
        .filter_map(|l| l.split_once(':'))
        .filter(|(n, _)| n.eq_ignore_ascii_case("X-Bird-Idempotency-Key"))
        .map(|(_, v)| v.trim().to_owned())
        .collect()
}

fn received(data: &[u8]) -> String {
    let text = String::from_utf8_lossy(data);
    let start = text.find("Received:").expect("a Received: header");
    let rest = &text[start..];
    let end = rest.find(";\r\n").expect("end of Received:");
    rest[..end].to_owned()
}

// Issue 20 finding 6: a JSON submission under `Idempotency-Key` was relayed
// with no `X-Bird-Idempotency-Key` at all, and a raw one under whatever key
// header its body carried. Now the next hop always gets exactly one key:
// the request's `Idempotency-Key`, or `smtp-once-<queue-id>` without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_http_submission_reaches_the_next_hop_with_the_ledgers_key() {
    let tiny = tiny();
    let d = daemon(&tiny, "");
    let msgs = "/v1/messages";
    let raw_to = "/v1/messages?to=r%40example.net";

    // JSON with Idempotency-Key: that key.
    let id = queued(
        &post(
            &d,
            Some("json-k"),
            msgs,
            "application/json",
            &json("json-keyed"),
        )
        .await,
    );
    let txns = relayed(&tiny, "json-keyed", 1).await;
    assert_eq!(keys(&txns[0].data), ["json-k"], "{id}");

    // JSON without: smtp-once-<queue-id>.
    let id = queued(&post(&d, None, msgs, "application/json", &json("json-bare")).await);
    let txns = relayed(&tiny, "json-bare", 1).await;
    assert_eq!(keys(&txns[0].data), [format!("smtp-once-{id}")]);

    // Raw with Idempotency-Key and another key in the body: the request's.
    let raw = |subject: &str| {
        format!(
            "From: bob@example.test\r\nTo: r@example.net\r\nX-Bird-Idempotency-Key: chosen-by-client\r\n\
             Subject: {subject}\r\n\r\nHello.\r\n"
        )
        .into_bytes()
    };
    queued(
        &post(
            &d,
            Some("raw-k"),
            raw_to,
            "message/rfc822",
            &raw("raw-keyed"),
        )
        .await,
    );
    let txns = relayed(&tiny, "raw-keyed", 1).await;
    assert_eq!(keys(&txns[0].data), ["raw-k"]);

    // Raw without Idempotency-Key, a key in the body: replaced by the
    // queue id's, never relayed.
    let id = queued(&post(&d, None, raw_to, "message/rfc822", &raw("raw-bare")).await);
    let txns = relayed(&tiny, "raw-bare", 1).await;
    assert_eq!(keys(&txns[0].data), [format!("smtp-once-{id}")]);
    assert!(!String::from_utf8_lossy(&txns[0].data).contains("chosen-by-client"));

    // The same request again is a replay: same answer, nothing relayed
    // twice (`relayed` checks that no second copy comes).
    let first = post(
        &d,
        Some("json-k"),
        msgs,
        "application/json",
        &json("json-keyed"),
    )
    .await;
    assert!(first.is_replay(), "{first:?}");
    relayed(&tiny, "json-keyed", 1).await;
    let again = post(
        &d,
        Some("raw-k"),
        raw_to,
        "message/rfc822",
        &raw("raw-keyed"),
    )
    .await;
    assert!(again.is_replay(), "{again:?}");
    relayed(&tiny, "raw-keyed", 1).await;
}

// Issue 20 finding 6, the per-hop rule for HTTP mail: a retry to only some
// of the recipients carries `<Idempotency-Key>/<hash>`, the body's own key
// header still gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_retry_of_http_mail_carries_the_subset_key() {
    let tiny = Tiny::start(
        "127.0.0.1:0".parse().expect("addr"),
        Arc::new(|rcpt, nth| match (rcpt, nth) {
            ("later@example.net", 1) => "451 4.2.0 Mailbox busy, try later".into(),
            _ => "250 2.1.5 Ok".into(),
        }),
        Duration::ZERO,
    );
    let d = daemon(&tiny, "");
    let body = b"From: bob@example.test\r\nX-Bird-Idempotency-Key: chosen-by-client\r\n\
                 Subject: partial\r\n\r\nHello.\r\n";
    queued(
        &post(
            &d,
            Some("order-7"),
            "/v1/messages?to=ok%40example.net&to=later%40example.net",
            "message/rfc822",
            body,
        )
        .await,
    );
    let txns = relayed(&tiny, "partial", 2).await;
    assert_eq!(txns[0].rcpts, ["ok@example.net"]);
    assert_eq!(keys(&txns[0].data), ["order-7"]);
    assert_eq!(txns[1].rcpts, ["later@example.net"]);
    let k2 = keys(&txns[1].data);
    assert_eq!(k2.len(), 1, "{k2:?}");
    // printf 'later@example.net\n' | sha256sum | cut -c1-12
    use sha2::{Digest, Sha256};
    let hash: String = Sha256::digest(b"later@example.net\n")[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(k2[0], format!("order-7/{hash}"));
}

// Issue 20 finding 12: `Received:` told every recipient the account and
// workspace that sent the message. Left out by default, as Postfix does
// unless `smtpd_sasl_authenticated_header = yes`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn received_names_the_account_only_when_configured() {
    for (n, (setting, shown)) in [
        ("", false),
        ("received_auth_header = false", false),
        ("received_auth_header = true", true),
    ]
    .into_iter()
    .enumerate()
    {
        let tiny = tiny();
        let d = daemon(&tiny, setting);
        let mut c = Client::login(d.plain, "bob").await;
        let subject = format!("smtp-{n}");
        let msg = format!(
            "From: bob@example.test\r\nTo: r@example.net\r\nSubject: {subject}\r\n\r\nx\r\n"
        );
        let r = c
            .submit("bob@example.test", &["r@example.net"], msg.as_bytes())
            .await;
        assert_eq!(r.code, 250, "{r:?}");
        c.quit().await;
        queued(
            &post(
                &d,
                None,
                "/v1/messages",
                "application/json",
                &json(&format!("http-{n}")),
            )
            .await,
        );
        for subject in [subject, format!("http-{n}")] {
            let txns = relayed(&tiny, &subject, 1).await;
            let header = received(&txns[0].data);
            assert!(header.contains("by relay.test (smtp-once)"), "{header}");
            assert_eq!(
                header.contains("(account bob, workspace acme)"),
                shown,
                "{setting:?}: {header}"
            );
            assert_eq!(header.contains("acme"), shown, "{setting:?}: {header}");
        }
    }
}
