//! The HTTP API over real TCP against the real binary: the seeds' table
//! over HTTP, a key shared with SMTP, JSON bodies, workspace isolation on
//! GET, a same-key storm over HTTP and SMTP at once, and a kill -9 after
//! COMMIT followed by the retry.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

mod common;

use common::http::Request;
use common::{Client, Daemon, Options, api_token, message, wait_until};

const RAW: &str = "message/rfc822";

fn raw_message(subject: &str) -> Vec<u8> {
    format!(
        "From: Alice <alice@example.test>\r\nTo: bob@example.net\r\nSubject: {subject}\r\n\r\nHello.\r\n"
    )
    .into_bytes()
}

fn post<'a>(user: &str, key: Option<&str>, body: &[u8]) -> Request<'a> {
    let mut r = Request::new("POST", "/v1/messages")
        .bearer(&api_token(user))
        .body(RAW, body);
    if let Some(k) = key {
        r = r.header("Idempotency-Key", k);
    }
    r
}

fn daemon() -> Daemon {
    Daemon::start(Options {
        extra: "[http]\naddr = \"127.0.0.1:0\"\n".into(),
        ..Options::default()
    })
}

#[tokio::test]
async fn the_seeds_table_over_http() {
    let d = daemon();
    let api = d.http.expect("http listener");

    let first = post("alice", Some("k1"), &raw_message("one"))
        .send(api)
        .await;
    assert_eq!(first.status, 202, "{first:?}");
    let id = first.json()["id"].as_str().expect("id").to_owned();
    assert_eq!(first.json()["status"], "queued");
    assert!(!first.is_replay());

    let again = post("alice", Some("k1"), &raw_message("one"))
        .send(api)
        .await;
    assert_eq!((again.status, again.is_replay()), (202, true));
    assert_eq!(again.body, first.body, "the stored body, byte for byte");

    let other = post("alice", Some("k1"), &raw_message("two"))
        .send(api)
        .await;
    assert_eq!(
        (other.status, other.json()["code"].as_str()),
        (409, Some("E01005"))
    );

    let long = "k".repeat(256);
    let bad = post("alice", Some(&long), &raw_message("x"))
        .send(api)
        .await;
    assert_eq!(
        (bad.status, bad.json()["code"].as_str()),
        (422, Some("E01001"))
    );

    // The same request to another path or with other query parameters is
    // a different request.
    let query = Request::new("POST", "/v1/messages?to=bob%40example.net")
        .bearer(&api_token("alice"))
        .header("Idempotency-Key", "k1")
        .body(RAW, &raw_message("one"))
        .send(api)
        .await;
    assert_eq!(
        (query.status, query.json()["code"].as_str()),
        (409, Some("E01005"))
    );

    // Without a key, every request is queued.
    for _ in 0..2 {
        assert_eq!(
            post("alice", None, &raw_message("nokey"))
                .send(api)
                .await
                .status,
            202
        );
    }

    let unauthorized = post("nobody", Some("k2"), &raw_message("x"))
        .send(api)
        .await;
    assert_eq!(unauthorized.status, 401);
    assert_eq!(unauthorized.header("www-authenticate"), Some("Bearer"));

    // alice may send only as *@example.test.
    let forbidden = Request::new("POST", "/v1/messages?from=x%40elsewhere.test&to=b%40y.test")
        .bearer(&api_token("alice"))
        .header("Idempotency-Key", "k3")
        .body(RAW, &raw_message("x"))
        .send(api)
        .await;
    assert_eq!(forbidden.status, 403, "{forbidden:?}");

    let too_big = post("bob", Some("k4"), &vec![b'a'; 1_100_000])
        .send(api)
        .await;
    assert_eq!(too_big.status, 413);

    let wrong_type = Request::new("POST", "/v1/messages")
        .bearer(&api_token("bob"))
        .body("text/plain", b"hi")
        .send(api)
        .await;
    assert_eq!(wrong_type.status, 415);

    let garbage = post("bob", Some("k5"), b"no headers here").send(api).await;
    assert_eq!(garbage.status, 400, "{garbage:?}");

    // Exactly one queue row for k1, and 2 without a key.
    assert_eq!(d.queue_ids_for_key("k1"), [id]);
    assert_eq!(d.queue_count(), 3);
}

#[tokio::test]
async fn a_key_used_over_smtp_is_taken_for_http_too() {
    let d = daemon();
    let api = d.http.expect("http listener");
    let mut smtp = Client::login(d.plain, "alice").await;
    let reply = smtp
        .submit(
            "alice@example.test",
            &["bob@example.net"],
            &message(Some("shared"), "smtp"),
        )
        .await;
    assert!(reply.last().starts_with("250"), "{reply:?}");
    let http = post("alice", Some("shared"), &raw_message("http"))
        .send(api)
        .await;
    assert_eq!(
        (http.status, http.json()["code"].as_str()),
        (409, Some("E01005"))
    );
    // And the other way round: an HTTP key refuses an SMTP message.
    let first = post("alice", Some("from-http"), &raw_message("h"))
        .send(api)
        .await;
    assert_eq!(first.status, 202);
    let reply = smtp
        .submit(
            "alice@example.test",
            &["bob@example.net"],
            &message(Some("from-http"), "s"),
        )
        .await;
    assert!(reply.last().contains("E01005"), "{reply:?}");
    assert_eq!(d.queue_count(), 2);
}

#[tokio::test]
async fn json_bodies_are_built_queued_once_and_replayed() {
    let d = daemon();
    let api = d.http.expect("http listener");
    let body =
        br#"{"from": "alice@example.test", "to": ["bob@example.net"], "bcc": ["carol@example.net"],
                    "subject": "Built", "text": "plain", "html": "<p>rich</p>"}"#;
    let send = || {
        Request::new("POST", "/v1/messages")
            .bearer(&api_token("alice"))
            .header("Idempotency-Key", "json-1")
            .body("application/json", body)
    };
    let first = send().send(api).await;
    assert_eq!(first.status, 202, "{first:?}");
    // mail-builder gives every build a fresh Date, Message-ID and MIME
    // boundary: the identity is the JSON, so the retry is still a replay.
    let again = send().send(api).await;
    assert_eq!(
        (again.status, again.is_replay(), &again.body),
        (202, true, &first.body)
    );
    let id = first.json()["id"].as_str().expect("id").to_owned();
    let file = d.outbox().join(format!("{id}.eml"));
    let relayed = wait_until("relayed to the outbox", 20, || std::fs::read(&file).ok()).await;
    let text = String::from_utf8_lossy(&relayed);
    assert!(
        text.contains("Subject: Built") && text.contains("<p>rich</p>"),
        "{text}"
    );
    // The file hop records the envelope (X-Envelope-To); no Bcc: header.
    assert!(text.contains("carol@example.net"), "{text}");
    assert!(
        !text.to_ascii_lowercase().contains("\nbcc:"),
        "Bcc stays in the envelope: {text}"
    );
}

#[tokio::test]
async fn status_is_shown_only_within_the_callers_workspace() {
    let d = daemon();
    let api = d.http.expect("http listener");
    let mut ids = Vec::new();
    for i in 0..3 {
        let r = post(
            "alice",
            Some(&format!("s{i}")),
            &raw_message(&format!("m{i}")),
        )
        .send(api)
        .await;
        ids.push(r.json()["id"].as_str().expect("id").to_owned());
    }
    let get = |user: &str, target: String| {
        let token = api_token(user);
        async move { Request::new("GET", &target).bearer(&token).send(api).await }
    };
    let mine = get("bob", format!("/v1/messages/{}", ids[0])).await;
    assert_eq!(mine.status, 200, "same workspace (acme)");
    let state = mine.json()["state"].as_str().expect("state").to_owned();
    assert!(["queued", "delivering", "delivered"].contains(&state.as_str()));
    assert_eq!(mine.json()["recipients"][0]["address"], "bob@example.net");
    let theirs = get("carol", format!("/v1/messages/{}", ids[0])).await;
    assert_eq!(
        theirs.status, 404,
        "another workspace's id does not exist for globex"
    );

    // Pages with a cursor, in acceptance order.
    let page = get("alice", "/v1/messages?limit=2".into()).await;
    let json = page.json();
    let listed: Vec<&str> = json["messages"]
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(listed, [ids[0].as_str(), ids[1].as_str()]);
    let cursor = json["next_cursor"].as_str().expect("cursor").to_owned();
    let rest = get("alice", format!("/v1/messages?limit=2&cursor={cursor}")).await;
    assert_eq!(rest.json()["messages"][0]["id"], ids[2].as_str());
    assert!(rest.json()["next_cursor"].is_null());
    assert_eq!(
        get("carol", "/v1/messages".into()).await.json()["messages"],
        serde_json::json!([])
    );
    assert_eq!(
        get("alice", "/v1/messages?state=nope".into()).await.status,
        400
    );
    assert_eq!(
        Request::new("GET", "/v1/messages").send(api).await.status,
        401
    );
}

#[tokio::test]
async fn a_same_key_storm_over_http_and_smtp_leaves_one_message() {
    let d = daemon();
    let api = d.http.expect("http listener");
    let mut tasks = Vec::new();
    for i in 0..24 {
        tasks.push(tokio::spawn(async move {
            let r = post("bob", Some("storm"), &raw_message("storm"))
                .send(api)
                .await;
            (i, r.status, r.is_replay(), r.body)
        }));
    }
    let plain = d.plain;
    let mut smtp_tasks = Vec::new();
    for _ in 0..8 {
        smtp_tasks.push(tokio::spawn(async move {
            let mut c = Client::login(plain, "bob").await;
            c.submit(
                "bob@example.net",
                &["x@example.net"],
                &message(Some("storm"), "smtp"),
            )
            .await
            .last()
            .to_owned()
        }));
    }
    let mut queued = 0;
    for t in tasks {
        let (_, status, replay, body) = t.await.expect("task");
        match status {
            202 if !replay => queued += 1,
            202 => {}
            409 => {
                let code: serde_json::Value = serde_json::from_slice(&body).expect("json");
                assert!(["E01004", "E01005"].contains(&code["code"].as_str().unwrap_or("")));
            }
            other => panic!("unexpected {other}"),
        }
    }
    for t in smtp_tasks {
        let last = t.await.expect("task");
        if last.starts_with("250") {
            queued += 1;
        } else {
            assert!(last.contains("E01004") || last.contains("E01005"), "{last}");
        }
    }
    assert_eq!(queued, 1, "one first acceptance in all");
    assert_eq!(d.queue_count(), 1);
}

#[tokio::test]
async fn a_kill_after_commit_then_the_retry_gets_the_replay() {
    let mut d = daemon();
    let api = d.http.expect("http listener");
    let unread = post("alice", Some("crash"), &raw_message("crash"))
        .send_and_hold(api)
        .await;
    wait_until("committed", 20, || (d.queue_count() == 1).then_some(())).await;
    d.kill9();
    drop(unread);
    d.restart();
    let api = d.http.expect("http listener after restart");
    let retry = post("alice", Some("crash"), &raw_message("crash"))
        .send(api)
        .await;
    assert_eq!((retry.status, retry.is_replay()), (202, true), "{retry:?}");
    assert_eq!(d.queue_ids_for_key("crash").len(), 1);
    assert_eq!(
        retry.json()["id"].as_str(),
        d.queue_ids_for_key("crash").first().map(String::as_str)
    );
}

#[tokio::test]
async fn https_with_the_tls_certificate_and_slow_clients_are_cut_off() {
    let d = Daemon::start(Options {
        extra: "[http]\naddr = \"127.0.0.1:0\"\ntls = true\n\n[limits]\ncommand_time_limit = \"1s\"\nmessage_time_limit = \"2s\"\n".into(),
        ..Options::default()
    });
    let api = d.http.expect("http listener");
    let r = post("bob", Some("tls-1"), &raw_message("over tls"))
        .send_tls(api)
        .await;
    assert_eq!(r.status, 202, "{r:?}");

    // Headers trickled in: the connection is closed at the header deadline.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tcp = tokio::net::TcpStream::connect(api).await.expect("connect");
    let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
    let mut slow = common::tls_connector()
        .connect(name, tcp)
        .await
        .expect("tls");
    slow.write_all(b"POST /v1/messages HTTP/1.1\r\nHost: t\r\n")
        .await
        .expect("write");
    let started = std::time::Instant::now();
    let mut buf = Vec::new();
    let closed = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        slow.read_to_end(&mut buf),
    )
    .await;
    assert!(closed.is_ok(), "still open after 10 s");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));

    // A body that never finishes: 408 at the request deadline.
    let tcp = tokio::net::TcpStream::connect(api).await.expect("connect");
    let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
    let mut slow = common::tls_connector()
        .connect(name, tcp)
        .await
        .expect("tls");
    let head = format!(
        "POST /v1/messages HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {}\r\n\
         Content-Type: message/rfc822\r\nContent-Length: 1000\r\n\r\nFrom: a",
        api_token("bob")
    );
    slow.write_all(head.as_bytes()).await.expect("write");
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(std::time::Duration::from_secs(10), slow.read(&mut buf))
        .await
        .expect("answered within 10 s")
        .expect("read");
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert_eq!(d.queue_count(), 1);
}

/// Every error is the JSON `{"code", "message"}` shape, also those axum
/// would answer itself: a body over the router's limit, an id that does
/// not decode, an unknown path, a method a path does not take.
#[tokio::test]
async fn errors_outside_the_pipeline_are_json_too() {
    let d = Daemon::start(Options {
        extra: "[http]\naddr = \"127.0.0.1:0\"\n".into(),
        max_message_size: 10_000,
        ..Options::default()
    });
    let api = d.http.expect("http listener");
    let token = api_token("alice");

    // Over max_message_size plus the 64 KiB allowed for framing.
    let huge = post("alice", None, &vec![b'a'; 100_000]).send(api).await;
    assert_eq!(
        (huge.status, huge.json()["code"].as_str()),
        (413, Some("TooLarge")),
        "{huge:?}"
    );
    let cases = [
        ("GET", "/v1/messages/%FF", 400, "BadRequest"),
        ("GET", "/v1/messages/", 404, "NotFound"),
        ("GET", "/v1/nothing", 404, "NotFound"),
        ("DELETE", "/v1/messages", 405, "MethodNotAllowed"),
    ];
    for (method, target, status, code) in cases {
        let r = Request::new(method, target).bearer(&token).send(api).await;
        assert_eq!(r.header("content-type"), Some("application/json"), "{r:?}");
        assert_eq!((r.status, r.json()["code"].as_str()), (status, Some(code)));
        if status == 405 {
            assert_eq!(r.header("allow"), Some("POST,GET,HEAD"));
        }
    }

    // The document it serves is the one checked in, and it is JSON.
    let doc = Request::new("GET", "/v1/openapi.json").send(api).await;
    assert_eq!(doc.status, 200);
    assert_eq!(doc.json()["openapi"], "3.0.3");
    assert!(doc.json()["paths"]["/v1/messages/{id}"]["get"].is_object());
}

/// The hostile shapes a body can take go through the same limits as on
/// SMTP: MIME nested past `max_mime_depth` is refused unparsed (422, not
/// stored), more recipients than `max_recipients` is a 400, and neither
/// queues anything.
#[tokio::test]
async fn deep_mime_and_too_many_recipients_are_refused_over_http() {
    let d = Daemon::start(Options {
        extra: "[http]\naddr = \"127.0.0.1:0\"\n\n[limits]\nmax_mime_depth = 5\n".into(),
        ..Options::default()
    });
    let api = d.http.expect("http listener");
    let mut deep = String::from("From: alice@example.test\r\nTo: bob@example.net\r\n");
    for level in 0..50 {
        deep.push_str(&format!(
            "Content-Type: multipart/mixed; boundary=\"b{level}\"\r\n\r\n--b{level}\r\n"
        ));
    }
    deep.push_str("\r\ninner\r\n");
    let r = post("alice", Some("deep"), deep.as_bytes()).send(api).await;
    assert_eq!(
        (r.status, r.json()["code"].as_str()),
        (422, Some("MimeLimits")),
        "{r:?}"
    );
    // Not stored under the key: the same key is free for a sane message.
    let ok = post("alice", Some("deep"), &raw_message("sane"))
        .send(api)
        .await;
    assert_eq!(ok.status, 202, "{ok:?}");

    let to: String = (0..11).map(|i| format!("&to=r{i}%40example.net")).collect();
    let many = Request::new(
        "POST",
        &format!("/v1/messages?from=alice%40example.test{to}"),
    )
    .bearer(&api_token("alice"))
    .body(RAW, &raw_message("many"))
    .send(api)
    .await;
    assert_eq!(many.status, 400, "{many:?}");
    assert_eq!(d.queue_count(), 1);
}
