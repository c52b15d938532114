//! Issue 21 item 1: "Postfix in front breaks retries". An application that
//! sends through a local MTA reaches us with a fresh `Received:` line on
//! every attempt; under the same key that is the same message (SPEC
//! section 3: trace and transit fields are not part of the identity). And
//! the MTA's bounces (`MAIL FROM:<>`) are accepted from an authenticated
//! or trusted client, so a refusal is not silently lost.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Client, Daemon, Options, wait_until};

const FROM: &str = "alice@example.test";
const TO: &[&str] = &["dest@example.net"];

/// The author's message, as the application builds it.
const AUTHOR: &str = "From: alice@example.test\r\nTo: dest@example.net\r\n\
                      Date: Tue, 01 Dec 2026 03:00:00 +0000\r\n\
                      Message-ID: <m1@example.test>\r\nSubject: invoice 42\r\n\
                      X-Bird-Idempotency-Key: {key}\r\n\r\nYour invoice.\r\n";

fn author(key: &str) -> String {
    AUTHOR.replace("{key}", key)
}

/// What a Postfix hop puts in front: its own queue id and time each time.
fn received(queue_id: &str, second: u8) -> String {
    format!(
        "Received: from app.example.test (localhost [127.0.0.1])\r\n\
         \tby mta.example.test (Postfix) with ESMTP id {queue_id}\r\n\
         \tfor <dest@example.net>; Tue, 01 Dec 2026 03:00:{second:02} +0000 (UTC)\r\n"
    )
}

// Issue 21 item 1 (trace headers): the same keyed message through a hop
// twice, with another Received line (and a DKIM signature the second time),
// is a replay of the first, not E01005.
#[tokio::test]
async fn trace_headers_added_by_a_hop_do_not_make_a_conflict() {
    let d = Daemon::start(Options::default());
    let mut c = Client::login(d.plain, "alice").await;
    let first = format!("{}{}", received("4QABC1", 1), author("via-mta-1"));
    let r1 = c.submit(FROM, TO, first.as_bytes()).await;
    assert_eq!(r1.code, 250, "{r1:?}");
    let id = r1.queue_id().expect("queue id");

    let second = format!(
        "DKIM-Signature: v=1; a=rsa-sha256; d=example.test; s=s1;\r\n\tb=abc\r\n{}{}{}",
        received("4QXYZ9", 7),
        received("4QXYZ8", 6),
        author("via-mta-1")
    );
    let r2 = c.submit(FROM, TO, second.as_bytes()).await;
    assert!(r2.is_replay(), "{r2:?}\n{}", d.log());
    assert_eq!(r2.queue_id().as_deref(), Some(id.as_str()));
    // Without any trace field at all: the same request too.
    let r3 = c.submit(FROM, TO, author("via-mta-1").as_bytes()).await;
    assert!(r3.is_replay(), "{r3:?}");
    // The author's own fields still count.
    let changed = format!("{}{}", received("4QXYZ7", 9), author("via-mta-1"))
        .replace("invoice 42", "invoice 43");
    let r4 = c.submit(FROM, TO, changed.as_bytes()).await;
    assert!(r4.has("E01005"), "{r4:?}");
    c.quit().await;
    assert_eq!(d.queue_count(), 1);
}

// Issue 21 item 1: `transit_headers = []` keeps every field counting, and
// an entry stored that way (or before the rule existed) still replays for a
// byte-identical retry after the switch to the default.
#[tokio::test]
async fn entries_stored_with_trace_headers_counting_still_replay() {
    let mut d = Daemon::start(Options {
        idempotency_extra: "transit_headers = []".into(),
        ..Options::default()
    });
    let m = format!("{}{}", received("4QOLD1", 1), author("upgrade-trace"));
    let mut c = Client::login(d.plain, "alice").await;
    let first = c.submit(FROM, TO, m.as_bytes()).await;
    assert_eq!(first.code, 250, "{first:?}");
    let id = first.queue_id().expect("queue id");
    let other_hop = format!("{}{}", received("4QOLD2", 2), author("upgrade-trace"));
    let strict = c.submit(FROM, TO, other_hop.as_bytes()).await;
    assert!(strict.has("E01005"), "{strict:?}");
    c.quit().await;

    let config = std::fs::read_to_string(&d.config_path).expect("config");
    std::fs::write(&d.config_path, config.replace("transit_headers = []", "")).expect("config");
    d.restart();

    let mut c = Client::login(d.plain, "alice").await;
    let again = c.submit(FROM, TO, m.as_bytes()).await;
    assert!(again.is_replay(), "{again:?}\n{}", d.log());
    assert_eq!(again.queue_id().as_deref(), Some(id.as_str()));
    c.quit().await;
    assert_eq!(d.queue_count(), 1);
}

// Issue 21 item 1 (bounces): `MAIL FROM:<>` from an account limited to
// `*@example.test` was `553`, so the bounce a Postfix in front sends when it
// gives up was lost. It is accepted now; the `From:` header rule still
// applies, and without authentication it is still `530`.
#[tokio::test]
async fn null_reverse_path_is_accepted_from_an_authenticated_account() {
    let d = Daemon::start(Options::default());
    let bounce = b"From: MAILER-DAEMON@example.test (Mail Delivery System)\r\n\
                   To: alice@example.test\r\nSubject: Undelivered Mail Returned to Sender\r\n\
                   Content-Type: text/plain\r\n\r\nThis is the mail system.\r\n";
    let mut c = Client::login(d.plain, "alice").await;
    let r = c.submit("", &["alice@example.test"], bounce).await;
    assert_eq!(r.code, 250, "{r:?}\n{}", d.log());
    // The From: header is still the account's to answer for.
    let forged = b"From: ceo@victim.test\r\nTo: x@example.net\r\n\r\nhi\r\n";
    let r = c.submit("", TO, forged).await;
    assert_eq!(r.code, 553, "{r:?}");
    c.quit().await;

    let mut anon = Client::connect(d.plain).await;
    anon.ehlo().await;
    let r = anon.cmd("MAIL FROM:<>").await;
    assert_eq!(r.code, 530, "{r:?}");
    anon.quit().await;
    assert_eq!(d.queue_count(), 1);
    let stored: String = d
        .db()
        .query_row("SELECT reverse_path FROM queue", [], |r| r.get(0))
        .expect("queued bounce");
    assert_eq!(stored, "");
}

// ---------------------------------------------------------------- Postfix

/// A private Postfix instance (its own config, queue and data directories,
/// smtpd on a free loopback port), as benches/compare.sh runs one, whose
/// only way out is `relayhost`. Stopped on drop. Needs root and Debian's
/// `postfix` package (scripts/test.sh installs it).
struct Postfix {
    base: PathBuf,
    smtpd: std::net::SocketAddr,
}

impl Postfix {
    fn start(base: &Path, relayhost: std::net::SocketAddr) -> Postfix {
        let smtpd = free_port();
        for d in ["etc", "queue", "data"] {
            std::fs::create_dir_all(base.join(d)).expect("postfix dirs");
        }
        // Postfix's daemons run as `postfix` and must reach the queue.
        for dir in base.ancestors().take(2) {
            let _ = Command::new("chmod").arg("755").arg(dir).status();
        }
        let chown = Command::new("chown")
            .args(["postfix"])
            .arg(base.join("data"))
            .status()
            .expect("chown");
        assert!(chown.success());
        let b = base.display();
        std::fs::write(
            base.join("etc/main.cf"),
            format!(
                "compatibility_level = 3.6\n\
                 config_directory = {b}/etc\nqueue_directory = {b}/queue\n\
                 data_directory = {b}/data\nmail_owner = postfix\nsetgid_group = postdrop\n\
                 maillog_file = {b}/maillog\nmaillog_file_prefixes = {b}\n\
                 myhostname = mta.example.test\nmydomain = example.test\nmyorigin = $myhostname\n\
                 mydestination =\ninet_interfaces = loopback-only\ninet_protocols = ipv4\n\
                 mynetworks = 127.0.0.0/8\n\
                 smtpd_relay_restrictions = permit_mynetworks, reject\n\
                 smtpd_recipient_restrictions = permit_mynetworks, reject\n\
                 relayhost = [{}]:{}\nsmtp_tls_security_level = none\n\
                 alias_maps =\nalias_database =\nlocal_recipient_maps =\nbiff = no\n\
                 smtpd_peername_lookup = no\nsmtputf8_enable = no\nin_flow_delay = 0\n",
                relayhost.ip(),
                relayhost.port()
            ),
        )
        .expect("main.cf");
        std::fs::write(
            base.join("etc/master.cf"),
            format!(
                "{smtpd} inet n - n - - smtpd\n\
                 pickup unix n - n 60 1 pickup\ncleanup unix n - n - 0 cleanup\n\
                 qmgr unix n - n 300 1 qmgr\nrewrite unix - - n - - trivial-rewrite\n\
                 bounce unix - - n - 0 bounce\ndefer unix - - n - 0 bounce\n\
                 trace unix - - n - 0 bounce\nverify unix - - n - 1 verify\n\
                 flush unix n - n 1000? 0 flush\nproxymap unix - - n - - proxymap\n\
                 proxywrite unix - - n - 1 proxymap\nsmtp unix - - n - - smtp\n\
                 relay unix - - n - - smtp\nshowq unix n - n - - showq\n\
                 error unix - - n - - error\nretry unix - - n - - error\n\
                 discard unix - - n - - discard\nanvil unix - - n - 1 anvil\n\
                 scache unix - - n - 1 scache\npostlog unix-dgram n - n - 1 postlogd\n"
            ),
        )
        .expect("master.cf");
        let pf = Postfix {
            base: base.to_owned(),
            smtpd,
        };
        for args in [&["check"][..], &["start"][..]] {
            let out = pf.postfix(args);
            assert!(
                out.status.success(),
                "postfix {args:?}: {}{}\nmaillog:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                pf.maillog()
            );
        }
        pf
    }

    fn postfix(&self, args: &[&str]) -> std::process::Output {
        Command::new("/usr/sbin/postfix")
            .arg("-c")
            .arg(self.base.join("etc"))
            .args(args)
            .output()
            .expect("/usr/sbin/postfix (scripts/test.sh installs the postfix package)")
    }

    fn maillog(&self) -> String {
        std::fs::read_to_string(self.base.join("maillog")).unwrap_or_default()
    }

    /// Messages in Postfix's queue, whatever their state.
    fn queued(&self) -> usize {
        ["maildrop", "incoming", "active", "deferred", "hold"]
            .iter()
            .map(|q| files_under(&self.base.join("queue").join(q)))
            .sum()
    }
}

impl Drop for Postfix {
    fn drop(&mut self) {
        let _ = self.postfix(&["stop"]);
    }
}

fn files_under(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => files_under(&e.path()),
            Ok(_) => 1,
            Err(_) => 0,
        })
        .sum()
}

fn free_port() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

fn outbox_files(d: &Daemon) -> Vec<PathBuf> {
    std::fs::read_dir(d.outbox())
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

// Issue 21 item 1: a real Postfix relaying into smtp-once (relayhost, the
// loopback as a trusted network). The application hands the same keyed
// message to its local Postfix twice, as it would on a retry; Postfix puts a
// fresh Received: line in front each time. Before the fix the second was
// E01005 and Postfix bounced it; now it is a replay, the next hop holds the
// message once, and Postfix's queue is empty with no bounce.
#[tokio::test]
async fn the_same_message_twice_through_postfix_is_one_message() {
    let d = Daemon::start(Options {
        trusted_network: Some(("127.0.0.0/8", "acme")),
        ..Options::default()
    });
    let work = tempfile::tempdir().expect("tempdir");
    let pf = Postfix::start(&work.path().join("postfix"), d.plain);
    let message = author("through-postfix-1");
    for attempt in 1..=2 {
        let mut c = Client::connect(pf.smtpd).await;
        c.ehlo().await;
        let r = c.submit(FROM, TO, message.as_bytes()).await;
        assert_eq!(r.code, 250, "attempt {attempt}: {r:?}\n{}", pf.maillog());
        c.quit().await;
        let _ = pf.postfix(&["flush"]);
        // Relayed (or bounced) and logged: the queue is empty again.
        wait_until("Postfix to relay", 60, || {
            (pf.queued() == 0 && pf.maillog().matches(" status=").count() >= attempt).then_some(())
        })
        .await;
    }
    let maillog = pf.maillog();
    let log = d.log();
    assert_eq!(
        maillog.matches("status=sent").count(),
        2,
        "both relayed to smtp-once\n{maillog}\nsmtp-once:\n{log}"
    );
    assert!(!maillog.contains("status=bounced"), "{maillog}");
    assert!(
        !maillog.contains("sender non-delivery notification"),
        "{maillog}"
    );
    assert_eq!(log.matches("replayed stored reply").count(), 1, "{log}");
    assert!(!log.contains("E01005"), "{log}");
    assert_eq!(d.queue_count(), 1, "one message, no bounce\n{log}");
    let relayed = wait_until("the relay to the outbox", 30, || {
        let files = outbox_files(&d);
        (!files.is_empty()).then_some(files)
    })
    .await;
    assert_eq!(relayed.len(), 1, "{relayed:?}");
    let body = std::fs::read_to_string(&relayed[0]).expect("outbox file");
    assert!(body.contains("by mta.example.test (Postfix)"), "{body}");
    assert!(body.contains("Subject: invoice 42"), "{body}");
}
