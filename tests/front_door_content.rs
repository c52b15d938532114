//! Issue 20, the content findings of the HTTP API against the real daemon:
//! header injection through JSON fields (finding 1), the content rule for
//! every channel (finding 2), `Bcc:` in a raw message under `?to=`
//! (finding 9) and the `Message-ID` host (finding 13, first half).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

mod common;

use common::http::{Request, Response};
use common::{Daemon, Options, api_token, wait_until};
use smtp_once::content_check::check_content;

fn daemon() -> Daemon {
    Daemon::start(Options {
        extra: "[http]\naddr = \"127.0.0.1:0\"\n".into(),
        ..Options::default()
    })
}

async fn post_json(d: &Daemon, body: &serde_json::Value) -> Response {
    Request::new("POST", "/v1/messages")
        .bearer(&api_token("alice"))
        .body("application/json", body.to_string().as_bytes())
        .send(d.http.expect("http listener"))
        .await
}

async fn post_raw(d: &Daemon, query: &str, message: &[u8]) -> Response {
    let target = format!("/v1/messages{query}");
    Request::new("POST", &target)
        .bearer(&api_token("alice"))
        .body("message/rfc822", message)
        .send(d.http.expect("http listener"))
        .await
}

/// The relayed file of an accepted request (the default relay writes each
/// message into `outbox/`).
async fn relayed(d: &Daemon, accepted: &Response) -> Vec<u8> {
    assert_eq!(accepted.status, 202, "{accepted:?}");
    let id = accepted.json()["id"].as_str().expect("id").to_owned();
    let file = d.outbox().join(format!("{id}.eml"));
    wait_until("relayed to the outbox", 20, || std::fs::read(&file).ok()).await
}

fn outbox_files(d: &Daemon) -> usize {
    std::fs::read_dir(d.outbox()).map_or(0, |dir| dir.count())
}

fn code(r: &Response) -> (u16, String) {
    (
        r.status,
        r.json()["code"].as_str().unwrap_or_default().to_owned(),
    )
}

fn message(r: &Response) -> String {
    r.json()["message"].as_str().unwrap_or_default().to_owned()
}

/// Issue 20 finding 1: `subject` was passed to mail-builder unchecked (the
/// issue's request got 202 and relayed the attacker's `Reply-To:` and
/// body); custom header values let NUL and other controls through. Now
/// every field that becomes header text refuses controls with a 400 naming
/// the field, and nothing is queued.
#[tokio::test]
async fn header_injection_through_json_fields_is_refused() {
    let d = daemon();
    let base =
        serde_json::json!({"from": "alice@example.test", "to": ["bob@example.net"], "text": "t"});
    let mut attacks = Vec::new();
    for subject in [
        "Order\r\nReply-To: attacker@evil.test\r\nContent-Type: text/html\r\n\r\n<b>hi</b>",
        "Order\nReply-To: attacker@evil.test",
        "Order\u{0}",
        "Order\u{85}Reply-To: attacker@evil.test",
    ] {
        let mut body = base.clone();
        body["subject"] = subject.into();
        attacks.push((body, "subject"));
    }
    for value in ["v\u{0}", "v\u{7f}", "v\u{1b}[31m", "v\rBcc: z@evil.test"] {
        let mut body = base.clone();
        body["headers"] = serde_json::json!({ "X-Tag": value });
        attacks.push((body, "header \"X-Tag\""));
    }
    for (body, field) in attacks {
        let r = post_json(&d, &body).await;
        assert_eq!(code(&r), (400, "BadRequest".into()), "{body}: {r:?}");
        let why = message(&r);
        assert!(why.starts_with(field) && why.contains("control"), "{why}");
    }
    assert_eq!(d.queue_count(), 0, "nothing queued");

    // Text without controls still goes through, non-ASCII RFC 2047-encoded.
    let mut body = base.clone();
    body["subject"] = "Größe\tL".into();
    body["headers"] = serde_json::json!({ "X-Tag": "naïve", "X-Plain": "a b" });
    let file = relayed(&d, &post_json(&d, &body).await).await;
    let text = String::from_utf8_lossy(&file);
    let head = text.split("\r\n\r\n").next().unwrap_or_default();
    assert!(head.is_ascii(), "{head}");
    assert!(head.contains("\r\nSubject: =?utf-8?"), "{head}");
    assert!(head.contains("\r\nX-Tag: =?utf-8?"), "{head}");
    assert!(head.contains("\r\nX-Plain: a b\r\n"), "{head}");
    assert!(!text.contains("Reply-To"), "{text}");
}

/// Issue 20 finding 2: the HTTP API skipped the smuggling rule: a raw body
/// with `hello\r.\r\n` was accepted and relayed undotted. Now the pipeline
/// applies the content rule for every channel: 422 `BadContent`, nothing
/// queued or relayed.
#[tokio::test]
async fn raw_bodies_with_bare_line_ends_or_nul_are_refused() {
    let d = daemon();
    let head = "From: alice@example.test\r\nTo: bob@example.net\r\nSubject: s\r\n\r\n";
    for body in [
        "hello\r.\r\nMAIL FROM:<x@evil.test>\r\n",
        "hello\n.\nRCPT TO:<x@evil.test>\n",
        "line\r\n.\r\r\n",
        "nul\0here\r\n",
    ] {
        let r = post_raw(&d, "", format!("{head}{body}").as_bytes()).await;
        assert_eq!(code(&r), (422, "BadContent".into()), "{body:?}: {r:?}");
        assert!(message(&r).contains("at byte"), "{r:?}");
    }
    // Bare LF all through, headers included.
    let r = post_raw(
        &d,
        "",
        b"From: alice@example.test\nTo: bob@example.net\n\nhi\n",
    )
    .await;
    assert_eq!(code(&r), (422, "BadContent".into()), "{r:?}");
    assert!(message(&r).contains("CRLF"), "{r:?}");
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(
        (d.queue_count(), outbox_files(&d)),
        (0, 0),
        "nothing queued or relayed"
    );
    assert!(d.log().contains("refused: content rule"), "a log line");
}

/// Issue 20 finding 2: JSON `text` and `html` with bare LF or CR are
/// relayed with CRLF line ends (they went out with bare ones), and a NUL
/// in them is a 400.
#[tokio::test]
async fn json_bodies_get_crlf_line_ends_and_nul_is_refused() {
    let d = daemon();
    let r = post_json(
        &d,
        &serde_json::json!({"from": "alice@example.test", "to": ["bob@example.net"],
            "text": "one\ntwo\rhello\r.\r\nend\n", "html": "<p>a</p>\n<p>b</p>"}),
    )
    .await;
    let file = relayed(&d, &r).await;
    assert_eq!(
        check_content(&file),
        Ok(()),
        "{}",
        String::from_utf8_lossy(&file)
    );
    let text = String::from_utf8_lossy(&file);
    assert!(
        text.contains("one\r\ntwo\r\nhello\r\n.\r\nend\r\n"),
        "{text}"
    );
    assert!(text.contains("<p>a</p>\r\n<p>b</p>"), "{text}");

    for field in ["text", "html"] {
        let r = post_json(
            &d,
            &serde_json::json!({"from": "alice@example.test", "to": ["bob@example.net"],
                field: "a\u{0}b"}),
        )
        .await;
        assert_eq!(code(&r), (400, "BadRequest".into()), "{r:?}");
        assert!(message(&r).starts_with(&format!("{field}: NUL")), "{r:?}");
    }
    assert_eq!(d.queue_count(), 1);
}

/// Issue 20 finding 9: a raw message with `?to=` relayed its `Bcc:` header
/// to every recipient. Now every top-level `Bcc:` field (with its folded
/// lines) is removed and every other byte is relayed as sent.
#[tokio::test]
async fn bcc_of_a_raw_message_under_to_is_not_relayed() {
    let d = daemon();
    let sent = b"From: alice@example.test\r\nTo: bob@example.net\r\nBcc: secret@example.net,\r\n\
        \tother@example.net\r\nSubject: s\r\nbcc: again@example.net\r\n\r\nBcc: in the body\r\n";
    let kept = b"From: alice@example.test\r\nTo: bob@example.net\r\nSubject: s\r\n\r\n\
        Bcc: in the body\r\n";
    let r = post_raw(
        &d,
        "?to=bob%40example.net&to=secret%40example.net&to=other%40example.net",
        sent,
    )
    .await;
    let file = relayed(&d, &r).await;
    assert!(file.ends_with(kept), "{}", String::from_utf8_lossy(&file));
    let text = String::from_utf8_lossy(&file);
    assert!(
        text.contains("<secret@example.net>"),
        "still a recipient: {text}"
    );
}

/// Issue 20 finding 13: the API's `Message-ID` used the OS host name; now
/// it is under `server.hostname` (`relay.test` in the test config).
#[tokio::test]
async fn the_message_id_is_under_the_configured_hostname() {
    let d = daemon();
    let r = post_json(
        &d,
        &serde_json::json!({"from": "alice@example.test", "to": ["bob@example.net"], "text": "t"}),
    )
    .await;
    let file = relayed(&d, &r).await;
    let text = String::from_utf8_lossy(&file);
    let id = text
        .lines()
        .find_map(|l| l.strip_prefix("Message-ID: "))
        .unwrap_or_else(|| panic!("no Message-ID: {text}"));
    assert!(id.starts_with('<') && id.ends_with("@relay.test>"), "{id}");
}
