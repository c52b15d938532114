//! DKIM signing through the real binary: keys made by `smtp-once
//! dkim-keygen`, messages submitted over SMTP (and HTTP) to a daemon with
//! `[[dkim]]`, and what it relays checked by two verifiers: dkimpy
//! (`tests/dkim_verify.py`, an independent implementation) and mail-auth's
//! own, each given only the TXT records that dkim-keygen printed.
//!
//! Signed once, at acceptance: a retried relay attempt sends the very same
//! bytes, so a next hop that deduplicates by key and content (a second
//! smtp-once) replays instead of refusing E01005.
//!
//! Needs python3, `pip3 install dkimpy==1.1.8 pynacl==1.6.2` and openssl
//! (scripts/test.sh installs the Python packages); fails without them.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

mod common;

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::http::Request;
use common::tiny::{Tiny, accept_all};
use common::{BIN, Client, Daemon, Options, api_token, repo_path, wait_until};
use mail_auth::common::parse::TxtRecordParser;
use mail_auth::common::verify::DomainKey;
use mail_auth::{
    AuthenticatedMessage, DkimResult, MessageAuthenticator, Parameters, ResolverCache, Txt,
};

/// Fast retries and polling (lines inside `[relay]`).
const FAST: &str = "retry_schedule = [\"200ms\"]\npoll_interval = \"50ms\"\n";

/// The test config has two workspaces (alice and bob in acme, carol in
/// globex), so every key says whose mail it signs.
const ACME: &str = "workspace = \"acme\"\n";

// ------------------------------------------------------------------ keys

/// A key made by `smtp-once dkim-keygen`, and what it printed (the TXT
/// record the verifiers are given).
struct Key {
    file: PathBuf,
    printed: PathBuf,
}

fn keygen(dir: &Path, domain: &str, selector: &str, algorithm: &str) -> Key {
    let file = dir.join(format!("{selector}.{domain}.pem"));
    let out = Command::new(BIN)
        .args(["dkim-keygen", "--domain", domain, "--selector", selector])
        .args(["--algorithm", algorithm, "--out"])
        .arg(&file)
        .output()
        .expect("run dkim-keygen");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mode = std::fs::metadata(&file)
        .expect("key file")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "the private key is the owner's only");
    assert!(
        stdout.contains(&format!("{selector}._domainkey.{domain}. IN TXT (")),
        "{stdout}"
    );
    assert!(stdout.contains("[[dkim]]\n"), "{stdout}");
    let printed = dir.join(format!("{selector}.{domain}.txt"));
    std::fs::write(&printed, &stdout).expect("save the record");
    Key { file, printed }
}

fn dkim_entry(domain: &str, selector: &str, key: &Key, extra: &str) -> String {
    format!(
        "\n[[dkim]]\ndomain = \"{domain}\"\nselector = \"{selector}\"\nprivate_key = \"{}\"\n{extra}",
        key.file.display()
    )
}

/// `(name, value)` of each TXT record in dkim-keygen's output: the quoted
/// strings between the parentheses, joined, as a resolver joins them.
fn records(printed: &[&Path]) -> Vec<(String, String)> {
    printed
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).expect("printed record");
            let (head, rest) = text.split_once(" IN TXT (").expect("a TXT record");
            let name = head.lines().last().expect("record name").to_owned();
            let strings = rest.split_once(')').expect("closing parenthesis").0;
            let value: String = strings.split('"').skip(1).step_by(2).collect();
            (name, value)
        })
        .collect()
}

// ------------------------------------------------------------- verifiers

/// dkimpy's verdict: whether every signature passed, and its report.
fn dkimpy(message: &[u8], printed: &[&Path]) -> (bool, String) {
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("message.eml");
    std::fs::write(&file, message).expect("write message");
    let out = Command::new("python3")
        .arg(repo_path("tests/dkim_verify.py"))
        .arg(&file)
        .args(printed)
        .output()
        .expect("python3 (and pip3 install dkimpy==1.1.8 pynacl==1.6.2)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("pass ") || text.contains("fail ") || text.contains("no DKIM-Signature"),
        "tests/dkim_verify.py did not run:\n{text}"
    );
    (out.status.success(), text)
}

/// mail-auth's TXT cache, filled with the published records only.
struct Published(Mutex<HashMap<Box<str>, Txt>>);

impl ResolverCache<Box<str>, Txt> for Published {
    fn get<Q>(&self, name: &Q) -> Option<Txt>
    where
        Box<str>: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.0.lock().expect("lock").get(name).cloned()
    }

    fn remove<Q>(&self, name: &Q) -> Option<Txt>
    where
        Box<str>: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.0.lock().expect("lock").remove(name)
    }

    fn insert(&self, name: Box<str>, value: Txt, _: Instant) {
        self.0.lock().expect("lock").insert(name, value);
    }
}

/// mail-auth's verdict, `(d=/s=, passed)` per signature.
async fn mail_auth(message: &[u8], printed: &[&Path]) -> Vec<(String, bool)> {
    let cache = Published(Mutex::new(HashMap::new()));
    for (name, value) in records(printed) {
        let key = DomainKey::parse(value.as_bytes()).expect("a DKIM key record");
        cache.insert(
            name.into_boxed_str(),
            key.into(),
            Instant::now() + Duration::from_secs(3600),
        );
    }
    // Never asked: every name the signatures need is in the cache.
    let resolver = MessageAuthenticator::new_cloudflare().expect("resolver");
    let parsed = AuthenticatedMessage::parse(message).expect("parsable message");
    let outputs = resolver
        .verify_dkim(Parameters::new(&parsed).with_txt_cache(&cache))
        .await;
    outputs
        .iter()
        .map(|o| {
            let who = o
                .signature()
                .map_or("?".to_owned(), |s| format!("{}/{}", s.d, s.s));
            (who, matches!(o.result(), DkimResult::Pass))
        })
        .collect()
}

/// Both verifiers pass every signature; returns the `d=/s=` list.
async fn verified(message: &[u8], printed: &[&Path]) -> Vec<String> {
    let (ok, report) = dkimpy(message, printed);
    assert!(
        ok,
        "dkimpy does not verify:\n{report}\n{}",
        String::from_utf8_lossy(message)
    );
    let results = mail_auth(message, printed).await;
    assert!(
        !results.is_empty() && results.iter().all(|(_, ok)| *ok),
        "mail-auth: {results:?}\n{}",
        String::from_utf8_lossy(message)
    );
    results.into_iter().map(|(who, _)| who).collect()
}

// ------------------------------------------------------------- messages

fn header_section(message: &[u8]) -> String {
    let text = String::from_utf8_lossy(message);
    text.split("\r\n\r\n").next().unwrap_or_default().to_owned()
}

fn signatures(message: &[u8]) -> Vec<String> {
    let headers = header_section(message)
        .replace("\r\n\t", " ")
        .replace("\r\n ", " ");
    headers
        .lines()
        .filter(|l| l.to_ascii_lowercase().starts_with("dkim-signature:"))
        .map(str::to_owned)
        .collect()
}

/// The lowercased names in a signature's `h=`.
fn h_tag(signature: &str) -> Vec<String> {
    let compact: String = signature.chars().filter(|c| !c.is_whitespace()).collect();
    compact
        .split(';')
        .find_map(|t| t.strip_prefix("h="))
        .expect("h=")
        .split(':')
        .map(str::to_ascii_lowercase)
        .collect()
}

fn mail(from: &str, key: Option<&str>, body: &str) -> Vec<u8> {
    let key = key
        .map(|k| format!("X-Bird-Idempotency-Key: {k}\r\n"))
        .unwrap_or_default();
    format!(
        "From: {from}\r\nTo: dest@example.net\r\nSubject: signed once\r\n\
         Message-ID: <{body}@example.test>\r\nDate: Tue, 01 Dec 2026 10:00:00 +0000\r\n{key}\r\n\
         {body}\r\nA second line, with  two spaces.\r\n"
    )
    .into_bytes()
}

async fn submit(d: &Daemon, user: &str, from: &str, message: &[u8]) -> String {
    let mut c = Client::login(d.plain, user).await;
    let r = c.submit(from, &["dest@example.net"], message).await;
    assert_eq!(r.code, 250, "{r:?}");
    c.quit().await;
    r.queue_id().expect("queue id")
}

/// The `.eml` a file-mode daemon wrote for `id`.
async fn relayed_file(d: &Daemon, id: &str) -> Vec<u8> {
    let path = d.outbox().join(format!("{id}.eml"));
    wait_until(&format!("{id}.eml"), 20, || std::fs::read(&path).ok()).await
}

/// Submits a keyless message as `user` (MAIL FROM `from`, `From: header`)
/// and returns it as the file relay wrote it.
async fn submitted_and_relayed(d: &Daemon, user: &str, from: &str, header: &str) -> Vec<u8> {
    let id = submit(d, user, from, &mail(header, None, from)).await;
    relayed_file(d, &id).await
}

fn assert_unsigned(message: &[u8]) {
    assert!(
        signatures(message).is_empty(),
        "{}",
        String::from_utf8_lossy(message)
    );
}

fn state(d: &Daemon, id: &str) -> String {
    d.db()
        .query_row("SELECT state FROM queue WHERE id = ?1", [id], |r| r.get(0))
        .expect("queue row")
}

// ------------------------------------------------------------------ tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_message_verifies_with_dkimpy_and_mail_auth() {
    let keys = tempfile::tempdir().expect("tmp");
    let rsa = keygen(keys.path(), "example.test", "rsa", "rsa");
    let ed = keygen(keys.path(), "example.test", "ed", "ed25519");
    let d = Daemon::start(Options {
        extra: format!(
            "{FAST}\n[http]\naddr = \"127.0.0.1:0\"\n{}{}",
            dkim_entry("example.test", "rsa", &rsa, ACME),
            dkim_entry("example.test", "ed", &ed, ACME),
        ),
        ..Options::default()
    });
    let printed = [rsa.printed.as_path(), ed.printed.as_path()];

    let id = submit(
        &d,
        "alice",
        "alice@example.test",
        &mail("Alice <alice@example.test>", Some("dkim-1"), "one"),
    )
    .await;
    let out = relayed_file(&d, &id).await;
    let sigs = signatures(&out);
    assert_eq!(
        sigs.len(),
        2,
        "RSA and Ed25519 (RFC 8463):\n{}",
        header_section(&out)
    );
    let text = String::from_utf8_lossy(&out);
    // File mode writes Return-Path and X-Envelope-To first.
    let received = text
        .find("Received: from client.test")
        .expect("our Received:");
    assert!(
        text.find("DKIM-Signature:") > Some(received),
        "stored after our Received: {text}"
    );
    for sig in &sigs {
        assert!(sig.contains("c=relaxed/relaxed;"), "{sig}");
        let h = h_tag(sig);
        assert_eq!(
            h.iter().filter(|n| *n == "from").count(),
            2,
            "From oversigned: {h:?}"
        );
        for own in ["x-bird-idempotency-key", "received", "dkim-signature"] {
            assert!(!h.iter().any(|n| n == own), "{own} in h=: {h:?}");
        }
    }
    assert_eq!(
        verified(&out, &printed).await,
        ["example.test/rsa", "example.test/ed"]
    );
    assert!(
        text.contains("X-Bird-Idempotency-Key: dkim-1\r\n"),
        "{text}"
    );
    // The verifiers do check: one changed byte in a signed header fails both.
    let tampered = text.replace("Subject: signed once", "Subject: signed twice");
    let (ok, report) = dkimpy(tampered.as_bytes(), &printed);
    assert!(!ok && report.matches("fail ").count() == 2, "{report}");
    let results = mail_auth(tampered.as_bytes(), &printed).await;
    assert!(results.iter().all(|(_, ok)| !ok), "{results:?}");
    assert!(
        d.log().contains("dkim=example.test/rsa,example.test/ed"),
        "{}",
        d.log()
    );

    // A replay signs nothing and queues nothing.
    let again = submit(
        &d,
        "alice",
        "alice@example.test",
        &mail("Alice <alice@example.test>", Some("dkim-1"), "one"),
    )
    .await;
    assert_eq!(again, id);
    assert_eq!(d.queue_count(), 1);

    // The HTTP API submits through the same pipeline, so it signs too.
    let body = "From: Bob <bob@example.test>\r\nTo: dest@example.net\r\nSubject: over http\r\n\r\nHello.\r\n";
    let r = Request::new("POST", "/v1/messages")
        .bearer(&api_token("bob"))
        .header("Idempotency-Key", "dkim-http-1")
        .body("message/rfc822", body.as_bytes())
        .send(d.http.expect("http listener"))
        .await;
    assert_eq!(r.status, 202, "{r:?}");
    let id = r.json()["id"].as_str().expect("id").to_owned();
    let out = relayed_file(&d, &id).await;
    assert_eq!(
        verified(&out, &printed).await,
        ["example.test/rsa", "example.test/ed"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_attempt_and_its_retry_send_identical_signed_bytes() {
    let keys = tempfile::tempdir().expect("tmp");
    let rsa = keygen(keys.path(), "example.test", "rsa", "rsa");
    let ed = keygen(keys.path(), "example.test", "ed", "ed25519");
    let next_hop = Tiny::start_with(
        "127.0.0.1:0".parse().expect("addr"),
        accept_all(),
        Arc::new(|nth| match nth {
            1 => "451 4.3.0 Try again later".into(),
            _ => "250 2.0.0 tiny queued".into(),
        }),
        Duration::ZERO,
    );
    // The retry comes over a second later, so a signature made afresh for
    // it would carry another t= (and differ): equal bytes prove sign-once.
    let d = Daemon::start(Options {
        relay: Some(format!(
            "[relay]\nmode = \"smarthost\"\nsmarthost = \"{}\"\ntls = \"none\"\n\
             retry_schedule = [\"1500ms\"]\npoll_interval = \"50ms\"\n",
            next_hop.addr
        )),
        extra: format!(
            "{}{}",
            dkim_entry("example.test", "rsa", &rsa, ACME),
            dkim_entry("example.test", "ed", &ed, ACME),
        ),
        ..Options::default()
    });
    let id = submit(
        &d,
        "bob",
        "bob@example.test",
        &mail("bob@example.test", None, "retried"),
    )
    .await;
    wait_until("delivered", 20, || {
        (state(&d, &id) == "delivered").then_some(())
    })
    .await;

    let txns = next_hop.txns();
    assert_eq!(txns.len(), 2, "{txns:?}");
    assert!(
        txns[0].reply.starts_with("451") && txns[1].reply.starts_with("250"),
        "{txns:?}"
    );
    assert_eq!(
        String::from_utf8_lossy(&txns[0].data),
        String::from_utf8_lossy(&txns[1].data),
        "the retry is the same message, signature and all"
    );
    assert_eq!(signatures(&txns[1].data).len(), 2);
    let printed = [rsa.printed.as_path(), ed.printed.as_path()];
    assert_eq!(
        verified(&txns[1].data, &printed).await,
        ["example.test/rsa", "example.test/ed"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_from_domain_and_the_workspace_choose_the_key() {
    let keys = tempfile::tempdir().expect("tmp");
    let parent = keygen(keys.path(), "example.test", "ed", "ed25519");
    let acme_only = keygen(keys.path(), "other.test", "acme", "ed25519");
    let d = Daemon::start(Options {
        extra: format!(
            "{FAST}{}{}",
            dkim_entry("example.test", "ed", &parent, ACME),
            dkim_entry("other.test", "acme", &acme_only, "workspace = \"acme\"\n"),
        ),
        ..Options::default()
    });

    // No key for the domain: relayed unsigned.
    assert_unsigned(&submitted_and_relayed(&d, "bob", "bob@nokey.test", "bob@nokey.test").await);

    // A subdomain is signed by its parent's key.
    let out =
        submitted_and_relayed(&d, "bob", "x@mail.example.test", "X <x@Mail.Example.test>").await;
    assert_eq!(
        verified(&out, &[parent.printed.as_path()]).await,
        ["example.test/ed"]
    );

    // bob is in workspace acme, carol in globex: the filtered key signs
    // acme's mail only.
    let out = submitted_and_relayed(&d, "bob", "bob@other.test", "bob@other.test").await;
    assert_eq!(
        verified(&out, &[acme_only.printed.as_path()]).await,
        ["other.test/acme"]
    );
    assert_unsigned(
        &submitted_and_relayed(&d, "carol", "carol@other.test", "carol@other.test").await,
    );
    assert!(d.log().contains("dkim=-"), "{}", d.log());
}

#[test]
fn check_config_names_a_bad_key_file_and_unsignable_headers() {
    let dir = tempfile::tempdir().expect("tmp");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(
        &garbage,
        "-----BEGIN PRIVATE KEY-----\nnot base64 at all!\n-----END PRIVATE KEY-----\n",
    )
    .expect("write");
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "nothing here\n").expect("write");
    let short = dir.path().join("rsa1024.pem");
    let openssl = Command::new("openssl")
        .args(["genrsa", "-out"])
        .arg(&short)
        .arg("1024")
        .output()
        .expect("openssl");
    assert!(
        openssl.status.success(),
        "{}",
        String::from_utf8_lossy(&openssl.stderr)
    );
    // Only the owner may read a key (finding 11): these are refused for
    // what they hold, not for their mode.
    for file in [&garbage, &empty, &short] {
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    }
    let good = keygen(dir.path(), "example.test", "ok", "ed25519");

    let check = |entry: &str| {
        let path = dir.path().join("check.toml");
        let text = common::config_text(
            &Options {
                extra: entry.to_owned(),
                ..Options::default()
            },
            dir.path(),
        );
        std::fs::write(&path, text).expect("config");
        common::check_config(&path)
    };
    let entry = |file: &Path, extra: &str| {
        format!(
            "\n[[dkim]]\ndomain = \"example.test\"\nselector = \"s\"\nprivate_key = \"{}\"\n{ACME}{extra}",
            file.display()
        )
    };
    let missing = dir.path().join("missing.pem");
    for (file, why) in [
        (&garbage, "is not valid PEM"),
        (&empty, "holds no private key"),
        (&missing, "cannot read it: No such file or directory"),
        (
            &short,
            "is an RSA key of 1024 bits; DKIM needs at least 2048",
        ),
    ] {
        let (ok, text) = check(&entry(file, ""));
        assert!(!ok, "{text}");
        let want = format!("dkim[0].private_key: {}: {why}", file.display());
        assert!(text.contains(&want), "{want:?} missing from:\n{text}");
    }

    let (ok, text) = check(&entry(
        &good.file,
        "headers = [\"Subject\", \"X-Bird-Idempotency-Key\"]\n",
    ));
    assert!(!ok, "{text}");
    assert!(
        text.contains("dkim[0].headers[1]: X-Bird-Idempotency-Key cannot be signed"),
        "{text}"
    );
    let (ok, text) = check(&entry(&good.file, ""));
    assert!(ok && text.contains("1 DKIM key(s)"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_kill_9_is_deduplicated_by_the_next_smtp_once() {
    let keys = tempfile::tempdir().expect("tmp");
    let rsa = keygen(keys.path(), "example.test", "rsa", "rsa");
    let ed = keygen(keys.path(), "example.test", "ed", "ed25519");
    let b = Daemon::start(Options::default());
    let mut a = Daemon::start(Options {
        relay: Some(format!(
            "[relay]\nmode = \"smarthost\"\nsmarthost = \"{}\"\ntls = \"none\"\nusername = \"bob\"\npassword = \"bob-pw\"\n",
            b.plain
        )),
        extra: format!(
            "poll_interval = \"50ms\"\ndelivery_test_pause_after_send = \"60s\"\n{}{}",
            dkim_entry("example.test", "rsa", &rsa, ACME),
            dkim_entry("example.test", "ed", &ed, ACME),
        ),
        ..Options::default()
    });
    let keyed = submit(
        &a,
        "bob",
        "bob@example.test",
        &mail("bob@example.test", Some("chain-dkim-1"), "keyed"),
    )
    .await;
    let unkeyed = submit(
        &a,
        "bob",
        "bob@example.test",
        &mail("bob@example.test", None, "unkeyed"),
    )
    .await;
    wait_until("B to accept both", 20, || {
        (b.queue_count() == 2).then_some(())
    })
    .await;
    // A has B's 250s and sits in the test pause, before recording them.
    assert_eq!(state(&a, &keyed), "delivering");
    assert_eq!(state(&a, &unkeyed), "delivering");
    // Over a second later, a signature made afresh for the repeated attempt
    // would carry another t=, so B would see another message under the
    // same key (E01005) and A would send it again under the queue-id key.
    tokio::time::sleep(Duration::from_millis(1100)).await;

    a.kill9();
    a.respawn_without_test_pause();
    for id in [&keyed, &unkeyed] {
        wait_until(&format!("{id} delivered"), 20, || {
            (state(&a, id) == "delivered").then_some(())
        })
        .await;
    }
    assert_eq!(b.queue_count(), 2, "B holds exactly one copy of each");
    assert_eq!(
        b.log().matches("replayed stored reply").count(),
        2,
        "{}",
        b.log()
    );
    assert!(!b.log().contains("E01005"), "{}", b.log());
    assert!(
        !a.log().contains("retrying under the queue-id key"),
        "{}",
        a.log()
    );
    assert_eq!(b.queue_ids_for_key("chain-dkim-1").len(), 1);
    assert_eq!(
        b.queue_ids_for_key(&format!("smtp-once-{unkeyed}")).len(),
        1
    );

    // What B holds is still A's signed message.
    let printed = [rsa.printed.as_path(), ed.printed.as_path()];
    for key in ["chain-dkim-1".to_owned(), format!("smtp-once-{unkeyed}")] {
        let id = b.queue_ids_for_key(&key).remove(0);
        let body: Vec<u8> = b
            .db()
            .query_row(
                "SELECT body FROM message_body WHERE queue_id = ?1",
                [&id],
                |r| r.get(0),
            )
            .expect("B's copy");
        assert_eq!(
            verified(&body, &printed).await,
            ["example.test/rsa", "example.test/ed"]
        );
    }
}

// ------------------------------------------------- issue 20: tenancy, keys

/// `config` (the default test config with `extra`) in `dir`, and its path.
fn write_config(dir: &Path, extra: &str) -> PathBuf {
    let path = dir.join("check.toml");
    let text = common::config_text(
        &Options {
            extra: extra.to_owned(),
            ..Options::default()
        },
        dir,
    );
    std::fs::write(&path, text).expect("config");
    path
}

/// Runs `smtp-once serve` on `config` and expects it to exit with an error
/// within 20 s (a daemon that starts is killed and fails the test); returns
/// what it wrote.
fn serve_refuses(config: &Path) -> String {
    let mut child = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(config)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn smtp-once serve");
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("serve started with {}", config.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    assert!(!out.status.success(), "serve exited 0");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Issue 20 finding 7: one tenant's mail was signed with another tenant's
/// domain. Workspace acme ("wa") owns a.test; carol, in globex ("wc") and
/// without `allowed_senders`, sends `From: ceo@a.test`: relayed unsigned,
/// while bob's (acme) is signed. A key bound to no workspace, which before
/// the fix signed carol's mail as a.test, is refused by check-config and
/// serve while the config has two workspaces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_20_finding_7_a_key_signs_only_its_own_workspaces_mail() {
    let keys = tempfile::tempdir().expect("tmp");
    let a = keygen(keys.path(), "a.test", "s", "ed25519");
    let d = Daemon::start(Options {
        extra: format!("{FAST}{}", dkim_entry("a.test", "s", &a, ACME)),
        ..Options::default()
    });
    let foreign = submitted_and_relayed(&d, "carol", "carol@globex.test", "CEO <ceo@a.test>").await;
    assert_unsigned(&foreign);
    assert!(
        !String::from_utf8_lossy(&foreign).contains("d=a.test"),
        "{}",
        String::from_utf8_lossy(&foreign)
    );
    let own = submitted_and_relayed(&d, "bob", "bob@a.test", "CEO <ceo@a.test>").await;
    assert_eq!(verified(&own, &[a.printed.as_path()]).await, ["a.test/s"]);
    drop(d);

    let dir = tempfile::tempdir().expect("tmp");
    let unbound = write_config(dir.path(), &dkim_entry("a.test", "s", &a, ""));
    let want = "dkim[0].workspace: missing: the config has several workspaces (acme, globex)";
    let hint = "add workspace = \"<the workspace that owns a.test>\"";
    let (ok, text) = common::check_config(&unbound);
    assert!(!ok && text.contains(want) && text.contains(hint), "{text}");
    let text = serve_refuses(&unbound);
    assert!(text.contains(want), "{text}");

    let listed = write_config(
        dir.path(),
        &dkim_entry("a.test", "s", &a, "workspaces = [\"acme\", \"globex\"]\n"),
    );
    let (ok, text) = common::check_config(&listed);
    assert!(ok, "{text}");
    let typo = write_config(
        dir.path(),
        &dkim_entry("a.test", "s", &a, "workspace = \"acmee\"\n"),
    );
    let (ok, text) = common::check_config(&typo);
    assert!(
        !ok && text.contains("dkim[0].workspace: \"acmee\" is no workspace"),
        "{text}"
    );
}

/// Issue 20 finding 11: a 0644 private key loaded silently. check-config
/// and serve refuse a key its group or others can read, and say how to
/// fix it; 0600 (what dkim-keygen writes) loads.
#[test]
fn issue_20_finding_11_a_key_others_can_read_is_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    let key = keygen(dir.path(), "example.test", "s", "ed25519");
    let config = write_config(dir.path(), &dkim_entry("example.test", "s", &key, ACME));
    let chmod = |mode: u32| {
        std::fs::set_permissions(&key.file, std::fs::Permissions::from_mode(mode)).expect("chmod");
    };
    for mode in [0o644, 0o640] {
        chmod(mode);
        let want = format!(
            "dkim[0].private_key: {path}: is readable by its group or others (mode {mode:04o})",
            path = key.file.display()
        );
        let hint = format!("chmod 600 {}", key.file.display());
        let (ok, text) = common::check_config(&config);
        assert!(
            !ok && text.contains(&want) && text.contains(&hint),
            "{text}"
        );
        let text = serve_refuses(&config);
        assert!(text.contains(&want) && text.contains(&hint), "{text}");
    }
    chmod(0o600);
    let (ok, text) = common::check_config(&config);
    assert!(ok && text.contains("1 DKIM key(s)"), "{text}");
}
