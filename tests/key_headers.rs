//! Issue 21 item 2: "Migrating from another provider means rewriting every
//! client." With `[idempotency] key_headers`, a client that sends
//! `X-Idempotency-Key` (JetEmail) or `Idempotency-Key` keeps its keys at
//! smtp-once, and the next hop still gets exactly one
//! `X-Bird-Idempotency-Key`. Real binary, real TCP, real SQLite file, the
//! file-mode outbox as the next hop.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

mod common;

use common::{Client, Daemon, Options, Reply, wait_until};

const FROM: &str = "bob@example.test";
const TO: &[&str] = &["r@example.net"];

fn daemon(key_headers: Option<&str>) -> Daemon {
    Daemon::start(Options {
        idempotency_extra: key_headers
            .map(|k| format!("key_headers = {k}\n"))
            .unwrap_or_default(),
        ..Options::default()
    })
}

fn message(key_lines: &str, subject: &str) -> Vec<u8> {
    format!("From: {FROM}\r\nTo: r@example.net\r\n{key_lines}Subject: {subject}\r\n\r\nHello.\r\n")
        .into_bytes()
}

async fn send(d: &Daemon, m: &[u8]) -> Reply {
    let mut c = Client::login(d.plain, "bob").await;
    let r = c.submit(FROM, TO, m).await;
    c.quit().await;
    r
}

/// The relayed file for `id`, once the worker has written it.
async fn relayed(d: &Daemon, id: &str) -> String {
    let path = d.outbox().join(format!("{id}.eml"));
    let bytes = wait_until("the relayed file", 10, || std::fs::read(&path).ok()).await;
    String::from_utf8(bytes).expect("utf-8")
}

/// The header lines (unfolded names only) called `name`, case-insensitively.
fn fields<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    let head = text.split("\r\n\r\n").next().unwrap_or_default();
    head.split("\r\n")
        .filter(|l| {
            l.split_once(':')
                .is_some_and(|(n, _)| n.trim().eq_ignore_ascii_case(name))
        })
        .collect()
}

// Issue 21 item 2: before, `X-Idempotency-Key` was just another header:
// the second submission was a second message (no replay), and the config
// key was refused as unknown. Now it is the key, relayed as ours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_header_is_the_key_and_leaves_as_ours() {
    let d = daemon(Some(
        r#"["X-Bird-Idempotency-Key", "X-Idempotency-Key", "Idempotency-Key"]"#,
    ));
    let m = message("X-Idempotency-Key: k1\r\n", "jetemail");
    let first = send(&d, &m).await;
    assert_eq!(first.code, 250, "{first:?}");
    assert!(!first.is_replay(), "{first:?}");
    let id = first.queue_id().expect("queue id");

    let again = send(&d, &m).await;
    assert_eq!(again.code, 250, "{again:?}");
    assert!(again.is_replay(), "{again:?}");
    assert_eq!(again.queue_id(), Some(id.clone()));
    assert_eq!(d.queue_ids_for_key("k1"), std::slice::from_ref(&id));

    // Another message under the same key: E01005.
    let other = send(&d, &message("X-Idempotency-Key: k1\r\n", "changed")).await;
    assert_eq!(other.code, 550, "{other:?}");
    assert!(other.has("E01005"), "{other:?}");

    // Two keys in one message, under two listed names: E01001, said why.
    let two = send(
        &d,
        &message("Idempotency-Key: k2\r\nX-Idempotency-Key: k3\r\n", "two"),
    )
    .await;
    assert_eq!(two.code, 554, "{two:?}");
    assert!(two.has("5.6.0") && two.has("E01001"), "{two:?}");
    assert!(
        two.has("X-Idempotency-Key and Idempotency-Key carry different keys"),
        "{two:?}"
    );
    // The same key under two names is one key.
    let same = send(
        &d,
        &message("Idempotency-Key: k4\r\nX-Idempotency-Key: k4\r\n", "same"),
    )
    .await;
    assert_eq!(same.code, 250, "{same:?}");
    let same_id = same.queue_id().expect("queue id");
    assert_eq!(d.queue_ids_for_key("k4"), std::slice::from_ref(&same_id));

    // The next hop sees one key, in X-Bird-Idempotency-Key, and none of
    // the other names (it could read another key from them).
    for (id, key) in [(&id, "k1"), (&same_id, "k4")] {
        let file = relayed(&d, id).await;
        assert_eq!(
            fields(&file, "X-Bird-Idempotency-Key"),
            [format!("X-Bird-Idempotency-Key: {key}")],
            "{file}"
        );
        assert!(fields(&file, "X-Idempotency-Key").is_empty(), "{file}");
        assert!(fields(&file, "Idempotency-Key").is_empty(), "{file}");
        assert!(file.ends_with("Hello.\r\n"), "{file}");
    }
}

// Issue 21 item 2, the default: only X-Bird-Idempotency-Key is a key, so
// nothing changes for a client that sends another header for other reasons.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_other_key_headers_are_ordinary_headers() {
    let d = daemon(None);
    let m = message("X-Idempotency-Key: k1\r\n", "default");
    let a = send(&d, &m).await;
    let b = send(&d, &m).await;
    assert_eq!((a.code, b.code), (250, 250), "{a:?} {b:?}");
    assert!(!b.is_replay(), "{b:?}");
    assert_ne!(a.queue_id(), b.queue_id());
    let id = a.queue_id().expect("queue id");
    let file = relayed(&d, &id).await;
    assert_eq!(
        fields(&file, "X-Idempotency-Key"),
        ["X-Idempotency-Key: k1"]
    );
    assert_eq!(
        fields(&file, "X-Bird-Idempotency-Key"),
        [format!("X-Bird-Idempotency-Key: smtp-once-{id}")]
    );
}

// Issue 21 item 2: check-config names the key of a bad list.
#[test]
fn check_config_names_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = Options {
        idempotency_extra: "key_headers = [\"Idempotency Key\", \"X-A\", \"x-a\"]\n".into(),
        ..Options::default()
    };
    let path = dir.path().join("smtp-once.toml");
    std::fs::write(&path, common::config_text(&options, dir.path())).expect("write");
    let (ok, out) = common::check_config(&path);
    assert!(!ok, "{out}");
    assert!(
        out.contains("idempotency.key_headers: \"Idempotency Key\" is not a header name"),
        "{out}"
    );
    assert!(
        out.contains("idempotency.key_headers: \"x-a\" is listed twice"),
        "{out}"
    );
}
