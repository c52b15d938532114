//! Issue 8, MIME and From: hardening, against the real daemon:
//! - a deeply nested message (33,000 `message/rfc822` levels) is refused with
//!   a 554 instead of overflowing a stack and killing the process;
//! - a 2,000,000-part message is refused (the parts limit), and another
//!   client's NOOP is answered while a heavy message within the limits is
//!   being analysed (the analysis runs off the async workers);
//! - the `From:` check sees every `From:` header and refuses what it cannot
//!   parse.
//!
//! The figures the issue asks for (NOOP latency, the daemon's peak RSS) are
//! printed; run with `--nocapture` to see them. They are never asserted.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

mod common;

use std::time::{Duration, Instant};

use common::{Client, Daemon, Options, Reply};

const FROM: &str = "alice@example.test";
const TO: &str = "dest@example.net";

fn big_options() -> Options {
    Options {
        max_message_size: 30_000_000,
        // One async worker: if the analysis of a message ran on it, nothing
        // else could run meanwhile, which the NOOP tests below would see.
        env: vec![("TOKIO_WORKER_THREADS", "1")],
        ..Options::default()
    }
}

/// `multipart/mixed` whose one part is `message/rfc822`, itself an empty
/// `message/rfc822`, `levels` deep (the reproduction).
fn nested_rfc822(key: &str, levels: usize) -> Vec<u8> {
    let mut m = format!(
        "From: Alice <alice@example.test>\r\nX-Bird-Idempotency-Key: {key}\r\n\
         Content-Type: multipart/mixed; boundary=B\r\n\r\n--B\r\n"
    )
    .into_bytes();
    for _ in 0..levels {
        m.extend_from_slice(b"Content-Type: message/rfc822\r\n\r\n");
    }
    m.extend_from_slice(b"\r\n--B--\r\n");
    m
}

/// A `multipart/mixed` message with `parts` parts of `part_body` each.
fn many_parts(key: &str, parts: usize, part_body: &str) -> Vec<u8> {
    let head = format!(
        "From: Alice <alice@example.test>\r\nX-Bird-Idempotency-Key: {key}\r\n\
         Content-Type: multipart/mixed; boundary=B\r\n\r\n"
    );
    let part = format!("--B\r\n\r\n{part_body}\r\n");
    let mut m = Vec::with_capacity(head.len() + parts * part.len() + 16);
    m.extend_from_slice(head.as_bytes());
    for _ in 0..parts {
        m.extend_from_slice(part.as_bytes());
    }
    m.extend_from_slice(b"--B--\r\n");
    m
}

/// Peak resident set size of the daemon (VmHWM), in KiB.
fn peak_rss_kib(d: &Daemon) -> u64 {
    let pid = d.child.as_ref().expect("daemon running").id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Waits until the kernel holds no unsent or unread byte on any TCP
/// connection to `port` on loopback: the daemon has read everything sent to
/// it so far. Linux only (`/proc/net/tcp`).
async fn wait_until_daemon_read_everything(port: u16) {
    // Generous: a debug build reads 20 MB slowly on a loaded 2-core machine
    // (seen: over 120 s while a benchmark ran beside the suite).
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
        let busy = table.lines().skip(1).any(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let port_of = |addr: &str| {
                addr.rsplit(':')
                    .next()
                    .and_then(|p| u16::from_str_radix(p, 16).ok())
            };
            // Bytes still on their way to the daemon: unsent on the
            // client's side, or unread on the daemon's. Bytes waiting for
            // the client (the daemon's reply) mean it has read everything.
            let (tx, rx) = cols
                .get(4)
                .and_then(|q| q.split_once(':'))
                .unwrap_or(("0", "0"));
            let pending = |q: &str| u64::from_str_radix(q, 16).unwrap_or(0) > 0;
            let daemon_side = cols.get(1).and_then(|a| port_of(a)) == Some(port);
            let client_side = cols.get(2).and_then(|a| port_of(a)) == Some(port);
            (daemon_side && pending(rx)) || (client_side && pending(tx))
        });
        if !busy {
            return;
        }
        assert!(Instant::now() < deadline, "daemon did not read its input");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// MAIL, RCPT and DATA, then the whole dot-stuffed message, without waiting
/// for the final reply.
async fn send_message(c: &mut Client, message: &[u8]) {
    let r = c.cmd(&format!("MAIL FROM:<{FROM}>")).await;
    assert_eq!(r.code, 250, "{r:?}");
    let r = c.cmd(&format!("RCPT TO:<{TO}>")).await;
    assert_eq!(r.code, 250, "{r:?}");
    let r = c.cmd("DATA").await;
    assert_eq!(r.code, 354, "{r:?}");
    c.send(&common::dot_stuff(message)).await;
}

/// Sends `message` on `a`; once the daemon has read all of it, sends a NOOP
/// on `b`. Returns which reply came first (`true`: the NOOP, while `a`'s
/// message was still being processed), the NOOP's latency and `a`'s reply.
async fn noop_during(
    d: &Daemon,
    a: &mut Client,
    b: &mut Client,
    message: &[u8],
) -> (bool, Duration, Reply) {
    send_message(a, message).await;
    wait_until_daemon_read_everything(d.plain.port()).await;
    let sent = Instant::now();
    b.send(b"NOOP\r\n").await;
    // Biased: if both replies are there, `a`'s counts as first, so the
    // NOOP wins only if it really came back while `a` was still waiting.
    let (noop_first, a_reply) = tokio::select! {
        biased;
        r = a.read_reply() => (false, Some(r)),
        r = b.read_reply() => {
            assert_eq!(r.code, 250, "{r:?}");
            (true, None)
        }
    };
    if !noop_first {
        let r = b.read_reply().await;
        assert_eq!(r.code, 250, "{r:?}");
    }
    let latency = sent.elapsed();
    let reply = match a_reply {
        Some(r) => r,
        None => a.read_reply().await,
    };
    (noop_first, latency, reply)
}

#[tokio::test]
async fn deep_rfc822_nesting_is_refused_and_the_daemon_lives_on() {
    let d = Daemon::start(Options {
        max_message_size: 2_000_000,
        ..Options::default()
    });
    let m = nested_rfc822("deep-1", 33_000);
    let mut c = Client::login(d.plain, "alice").await;
    let r = c.submit(FROM, &[TO], &m).await;
    assert_eq!(r.code, 554, "{r:?}");
    assert!(r.has("5.6.0") && r.has("MIME nesting"), "{r:?}");
    // The same session and a new one are served.
    assert_eq!(c.cmd("NOOP").await.code, 250);
    let mut fresh = Client::connect(d.plain).await;
    assert_eq!(fresh.cmd("NOOP").await.code, 250);
    // Not stored under the key: the identical retry is refused again, not
    // replayed, and nothing was queued.
    let again = c.submit(FROM, &[TO], &m).await;
    assert_eq!(again.code, 554, "{again:?}");
    assert!(!again.is_replay(), "{again:?}");
    assert_eq!(d.queue_count(), 0);
    let log = d.log();
    assert!(log.contains("refused: MIME limits"), "{log}");
    // Unkeyed, and without multipart around it, the same depth is refused.
    let plain: Vec<u8> = {
        let mut m = b"From: alice@example.test\r\n".to_vec();
        for _ in 0..200 {
            m.extend_from_slice(b"Content-Type: message/rfc822\r\n\r\n");
        }
        m
    };
    let r = c.submit(FROM, &[TO], &plain).await;
    assert_eq!(r.code, 554, "{r:?}");
    // A normal keyed multipart message is still accepted.
    let ok = many_parts("fine-1", 3, "hello");
    assert_eq!(c.submit(FROM, &[TO], &ok).await.code, 250);
}

#[tokio::test]
async fn two_million_parts_are_refused_without_stalling_others() {
    let d = Daemon::start(big_options());
    let m = many_parts("parts-2m", 2_000_000, "x");
    let rss_idle = peak_rss_kib(&d);
    let mut a = Client::login(d.plain, "alice").await;
    let mut b = Client::connect(d.plain).await;
    b.ehlo().await;
    let started = Instant::now();
    let (noop_first, noop_latency, reply) = noop_during(&d, &mut a, &mut b, &m).await;
    let total = started.elapsed();
    let rss_peak = peak_rss_kib(&d);
    println!(
        "2,000,000-part message ({} bytes): reply {:?} after {total:?}; other client's NOOP \
         answered in {noop_latency:?} ({}); daemon VmHWM {rss_idle} KiB idle -> {rss_peak} KiB",
        m.len(),
        reply.last(),
        if noop_first {
            "before the reply"
        } else {
            "after the reply"
        },
    );
    assert_eq!(reply.code, 554, "{reply:?}");
    assert!(reply.has("5.6.0") && reply.has("MIME parts"), "{reply:?}");
    assert_eq!(d.queue_count(), 0);
    assert_eq!(a.cmd("NOOP").await.code, 250);
}

#[tokio::test]
async fn noop_is_answered_while_a_heavy_message_is_analysed() {
    let d = Daemon::start(big_options());
    // 9,000 parts of 2 KB: within the limits, 18 MB to parse and hash.
    let body =
        "0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz\r\n".repeat(27);
    let m = many_parts("heavy-1", 9_000, &body);
    let mut a = Client::login(d.plain, "alice").await;
    let first = a.submit(FROM, &[TO], &m).await;
    assert_eq!(first.code, 250, "{first:?}");
    // The identical retry: fingerprint, ledger read, replay. Nothing in that
    // path waits on anything, so on the daemon's one async worker the NOOP
    // could only come first if the analysis ran somewhere else.
    let mut b = Client::connect(d.plain).await;
    b.ehlo().await;
    let rss_before = peak_rss_kib(&d);
    let (noop_first, noop_latency, reply) = noop_during(&d, &mut a, &mut b, &m).await;
    println!(
        "heavy message within limits ({} bytes, 9,000 parts): other client's NOOP answered in \
         {noop_latency:?}, {}; daemon VmHWM {rss_before} KiB -> {} KiB",
        m.len(),
        if noop_first {
            "while the message was being analysed"
        } else {
            "only after the message's reply"
        },
        peak_rss_kib(&d),
    );
    assert!(noop_first, "the NOOP waited for the other client's message");
    assert!(reply.is_replay(), "{reply:?}");
    assert_eq!(reply.last(), first.last());
}

#[tokio::test]
async fn boundaries_that_never_occur_are_refused_not_searched_for_ever() {
    // Each multipart whose boundary never occurs sends mail-parser to the
    // end of the message and back: 2,000 of them before 2 MB took mail-parser
    // 65 s in a debug build. Refused by the MIME walk instead.
    let d = Daemon::start(Options {
        max_message_size: 5_000_000,
        ..Options::default()
    });
    let mut m = String::from(
        "From: alice@example.test\r\nX-Bird-Idempotency-Key: dead-ends\r\n\
         Content-Type: multipart/mixed; boundary=B\r\n\r\n",
    );
    for _ in 0..2_000 {
        m.push_str("--B\r\nContent-Type: multipart/mixed; boundary=nowhere\r\n\r\nx\r\n");
    }
    m.push_str("--B\r\n\r\n");
    m.push_str(&"y".repeat(2_000_000));
    m.push_str("\r\n--B--\r\n");
    let mut c = Client::login(d.plain, "alice").await;
    let r = c.submit(FROM, &[TO], m.as_bytes()).await;
    assert_eq!(r.code, 554, "{r:?}");
    assert!(r.has("5.6.0") && r.has("too costly"), "{r:?}");
    assert_eq!(c.cmd("NOOP").await.code, 250);
}

/// Submits `headers` + a short body as alice (allowed `*@example.test`).
async fn send_from(d: &Daemon, headers: &str) -> Reply {
    let mut c = Client::login(d.plain, "alice").await;
    let m = format!("{headers}To: {TO}\r\nSubject: from test\r\n\r\nhi\r\n");
    c.submit(FROM, &[TO], m.as_bytes()).await
}

#[tokio::test]
async fn from_header_must_be_one_parseable_allowed_header() {
    let d = Daemon::start(Options::default());
    let refused = [
        // Two From: headers: some readers show the first, some the last.
        (
            "From: evil@victim.test\r\nFrom: a@example.test\r\n",
            "more than one",
        ),
        (
            "From: a@example.test\r\nfrom: evil@victim.test\r\n",
            "more than one",
        ),
        (
            "From : evil@victim.test\r\nFrom: a@example.test\r\n",
            "more than one",
        ),
        // NUL, two @, no address, trailing junk.
        (
            "From: evil@victim.test@example.test\r\n",
            "cannot be parsed",
        ),
        ("From: \r\n", "no address"),
        ("From: Alice\r\n", "cannot be parsed"),
        (
            "From: <evil@victim.test>a@example.test\r\n",
            "cannot be parsed",
        ),
        ("From: a@example.test\x01\r\n", "cannot be parsed"),
        ("From: undisclosed:;\r\n", "cannot be parsed"),
        // Parseable, but one mailbox is not allowed.
        (
            "From: Alice <alice@example.test>, Mallory <evil@victim.test>\r\n",
            "not allowed",
        ),
        ("To: x@example.test\r\n", "no From: address"),
    ];
    for (headers, words) in refused {
        let r = send_from(&d, headers).await;
        assert_eq!(r.code, 553, "{headers:?}: {r:?}");
        assert!(r.has("5.7.1") && r.has(words), "{headers:?}: {r:?}");
    }
    // A NUL byte never gets as far as the From: check: the session refuses
    // it in any message.
    let r = send_from(&d, "From: evil@victim.test\0a@example.test\r\n").await;
    assert_eq!(r.code, 554, "{r:?}");
    assert!(r.has("NUL"), "{r:?}");
    let accepted = [
        "From: alice@example.test\r\n",
        "From: Alice <alice@example.test>\r\n",
        "From: \"Smith, Alice\" <alice@example.test>\r\n",
        "From: Alice Q. Public <alice@example.test>\r\n",
        "From: alice@example.test (Alice)\r\n",
        "From: =?utf-8?q?Al=C3=AFce?= <alice@example.test>\r\n",
        "From: Alice <alice@example.test>,\r\n Bob <bob@example.test>\r\n",
        "From:<alice@EXAMPLE.test>\r\n",
    ];
    for headers in accepted {
        let r = send_from(&d, headers).await;
        assert_eq!(r.code, 250, "{headers:?}: {r:?}");
    }
    let log = d.log();
    assert!(log.contains("From: header not allowed"), "{log}");
}
