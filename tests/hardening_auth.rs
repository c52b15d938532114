//! Issue 8, authentication: bounded password hashing, brute-force
//! throttling and bans, and log lines a client cannot forge. Against the
//! real daemon; clients pick their source address on 127.0.0.0/8 so that
//! one test can play several hosts.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

mod common;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use base64::Engine;
use common::{Client, Daemon, Options};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpSocket, TcpStream};

/// A line-level SMTP client bound to a chosen loopback source address.
struct Host {
    io: BufReader<TcpStream>,
}

impl Host {
    async fn connect_from(source: &str, server: SocketAddr) -> (Host, Reply) {
        let socket = TcpSocket::new_v4().expect("socket");
        let ip: IpAddr = source.parse().expect("source ip");
        socket.bind(SocketAddr::new(ip, 0)).expect("bind source");
        let stream = socket.connect(server).await.expect("connect");
        let mut host = Host {
            io: BufReader::new(stream),
        };
        let greeting = host.reply().await;
        (host, greeting)
    }

    /// Connects, expects the 220 greeting, and says EHLO.
    async fn ready(source: &str, server: SocketAddr) -> Host {
        let (mut host, greeting) = Self::connect_from(source, server).await;
        assert_eq!(greeting.code, 220, "{greeting:?}");
        let ehlo = host.cmd("EHLO client.test").await;
        assert_eq!(ehlo.code, 250, "{ehlo:?}");
        host
    }

    async fn reply(&mut self) -> Reply {
        let mut text = String::new();
        loop {
            let mut line = String::new();
            let n = tokio::time::timeout(Duration::from_secs(60), self.io.read_line(&mut line))
                .await
                .expect("reply within 60 s")
                .unwrap_or(0);
            if n == 0 {
                return Reply { code: 0, text };
            }
            text.push_str(&line);
            if line.as_bytes().get(3) != Some(&b'-') {
                let code = line.get(..3).and_then(|c| c.parse().ok()).unwrap_or(0);
                return Reply { code, text };
            }
        }
    }

    async fn cmd(&mut self, line: &str) -> Reply {
        let io = self.io.get_mut();
        io.write_all(format!("{line}\r\n").as_bytes())
            .await
            .expect("write");
        self.reply().await
    }

    async fn auth_plain(&mut self, user: &str, password: &str) -> Reply {
        let token =
            base64::engine::general_purpose::STANDARD.encode(format!("\0{user}\0{password}"));
        self.cmd(&format!("AUTH PLAIN {token}")).await
    }

    /// The server closed the connection (EOF or reset).
    async fn closed(&mut self) -> bool {
        let mut line = String::new();
        matches!(
            tokio::time::timeout(Duration::from_secs(10), self.io.read_line(&mut line)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }
}

#[derive(Debug)]
struct Reply {
    /// 0: the connection closed instead.
    code: u16,
    text: String,
}

fn auth_options(auth_extra: &str) -> Options {
    Options {
        auth_extra: auth_extra.into(),
        ..Options::default()
    }
}

/// Finding "memory from wrong passwords": checks run on a fixed set of
/// hashing threads behind a bounded queue. With one thread and a queue of
/// one, a burst of wrong passwords is partly shed with a 454 and a log line
/// instead of queueing without bound, and right passwords still work.
#[tokio::test]
async fn wrong_password_burst_beyond_the_hash_queue_gets_454() {
    let d = Daemon::start(auth_options(
        "hash_threads = 1\nhash_queue = 1\nfailure_delay = \"0s\"\nmax_failure_delay = \"0s\"\n\
         max_failures_per_ip = 1000\nmax_failures_per_account = 1000\n",
    ));
    let server = d.plain;
    let mut hosts = Vec::new();
    for _ in 0..24 {
        hosts.push(Host::ready("127.0.0.1", server).await);
    }
    // Send every AUTH first, then read: they all hit the queue at once.
    let token = base64::engine::general_purpose::STANDARD.encode("\0alice\0wrong");
    for h in &mut hosts {
        h.io.get_mut()
            .write_all(format!("AUTH PLAIN {token}\r\n").as_bytes())
            .await
            .expect("write");
    }
    let mut codes = Vec::new();
    for h in &mut hosts {
        let r = h.reply().await;
        if r.code == 454 {
            assert!(
                r.text
                    .starts_with("454 4.7.0 Temporary authentication failure"),
                "{r:?}"
            );
        }
        codes.push(r.code);
    }
    assert!(codes.iter().all(|c| *c == 535 || *c == 454), "{codes:?}");
    assert!(codes.contains(&454), "nothing shed: {codes:?}");
    assert!(codes.contains(&535), "nothing checked: {codes:?}");
    let log = d.log();
    assert!(
        log.lines()
            .any(|l| l.contains("password hashing queue full") && l.contains("peer=127.0.0.1")),
        "{log}"
    );
    // Right passwords still work, the second time from the success cache.
    for _ in 0..2 {
        let mut h = Host::ready("127.0.0.1", server).await;
        let r = h.auth_plain("alice", "alice-pw").await;
        assert_eq!(r.code, 235, "{r:?}");
    }
}

/// Finding "brute force is not throttled": reconnecting guesses get a
/// growing delay before the 535, then the address is banned (421 at
/// connect and at AUTH, even with the right password) until ban_time is
/// over.
#[tokio::test]
async fn reconnecting_guesses_are_delayed_then_banned_until_ban_time() {
    let d = Daemon::start(auth_options(
        "failure_delay = \"300ms\"\nmax_failure_delay = \"600ms\"\n\
         max_failures_per_ip = 3\nmax_failures_per_account = 100\nban_time = \"3s\"\n",
    ));
    let server = d.plain;
    let mut early = Host::ready("127.0.0.7", server).await;
    for expected_delay in [300, 600, 600] {
        let mut h = Host::ready("127.0.0.7", server).await;
        let started = Instant::now();
        let r = h.auth_plain("bob", "guess").await;
        assert_eq!(r.code, 535, "{r:?}");
        assert!(
            started.elapsed() >= Duration::from_millis(expected_delay),
            "535 after {:?}, expected a delay of at least {expected_delay} ms",
            started.elapsed()
        );
    }

    // Banned: refused at connect...
    let (mut h, greeting) = Host::connect_from("127.0.0.7", server).await;
    assert!(
        greeting.text.starts_with("421 4.7.0"),
        "banned address greeted with {greeting:?}"
    );
    assert!(h.closed().await);
    // ...and at AUTH on a connection opened before the ban, right password
    // or not.
    let r = early.auth_plain("bob", "bob-pw").await;
    assert!(r.text.starts_with("421 4.7.0"), "{r:?}");
    assert!(early.closed().await);
    // Another address is not affected.
    let mut other = Host::ready("127.0.0.8", server).await;
    assert_eq!(other.auth_plain("bob", "bob-pw").await.code, 235);

    let log = d.log();
    assert!(
        log.lines()
            .any(|l| l.contains("client address banned") && l.contains("peer=127.0.0.7")),
        "{log}"
    );
    assert!(log.contains("connection refused: address banned"), "{log}");

    // After ban_time the right password works again.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (mut h, greeting) = Host::connect_from("127.0.0.7", server).await;
        if greeting.code == 220 {
            assert_eq!(h.cmd("EHLO client.test").await.code, 250);
            let r = h.auth_plain("bob", "bob-pw").await;
            assert_eq!(r.code, 235, "{r:?}");
            break;
        }
        assert!(Instant::now() < deadline, "ban never ended");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Failing on someone's account name locks it, but not for addresses that
/// logged in as it recently: an attacker cannot lock the real user out.
#[tokio::test]
async fn account_lock_spares_addresses_that_logged_in_before() {
    let d = Daemon::start(auth_options(
        "failure_delay = \"0s\"\nmax_failure_delay = \"0s\"\n\
         max_failures_per_ip = 100\nmax_failures_per_account = 3\nban_time = \"30s\"\n",
    ));
    let server = d.plain;
    let mut owner = Host::ready("127.0.0.3", server).await;
    assert_eq!(owner.auth_plain("bob", "bob-pw").await.code, 235);
    for _ in 0..3 {
        let mut attacker = Host::ready("127.0.0.4", server).await;
        assert_eq!(attacker.auth_plain("bob", "guess").await.code, 535);
    }
    let mut stranger = Host::ready("127.0.0.5", server).await;
    let r = stranger.auth_plain("bob", "bob-pw").await;
    assert!(r.text.starts_with("454 4.7.0"), "{r:?}");
    // Only that account: the same client may log in as another.
    assert_eq!(stranger.auth_plain("alice", "alice-pw").await.code, 235);
    let mut owner = Host::ready("127.0.0.3", server).await;
    assert_eq!(owner.auth_plain("bob", "bob-pw").await.code, 235);
    let log = d.log();
    assert!(log.contains("account locked"), "{log}");
    assert!(
        log.lines()
            .any(|l| l.contains("authentication refused: account locked")
                && l.contains("peer=127.0.0.5")),
        "{log}"
    );
}

/// Trusted-network clients are never delayed or banned.
#[tokio::test]
async fn trusted_network_is_never_throttled() {
    let d = Daemon::start(Options {
        trusted_network: Some(("127.0.0.2/32", "local")),
        ..auth_options(
            "failure_delay = \"20s\"\nmax_failure_delay = \"20s\"\n\
             max_failures_per_ip = 2\nmax_failures_per_account = 2\nban_time = \"15m\"\n",
        )
    });
    let server = d.plain;
    let started = Instant::now();
    for _ in 0..4 {
        let mut h = Host::ready("127.0.0.2", server).await;
        assert_eq!(h.auth_plain("carol", "guess").await.code, 535);
    }
    // One delayed reply alone would take 20 s.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "trusted client was delayed: {:?}",
        started.elapsed()
    );
    let mut h = Host::ready("127.0.0.2", server).await;
    assert_eq!(h.auth_plain("carol", "carol-pw").await.code, 235);
    assert!(!d.log().contains("banned"), "{}", d.log());
}

/// Finding "log injection": a user name with a newline, a forged log line
/// and an ANSI escape is logged escaped, on the real failure line, which
/// names the real peer.
#[tokio::test]
async fn auth_user_name_cannot_forge_log_lines() {
    let d = Daemon::start(auth_options(
        "failure_delay = \"0s\"\nmax_failure_delay = \"0s\"\n",
    ));
    let forged = "2031-01-01T00:00:00.000000Z  INFO smtp_once: authentication failed peer=1.2.3.4";
    let user = format!("x\n{forged}\n\x1b[31mred");
    let mut h = Host::ready("127.0.0.1", d.plain).await;
    assert_eq!(h.auth_plain(&user, "pw").await.code, 535);
    // AUTH LOGIN takes the user name through its own path.
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    assert_eq!(h.cmd("AUTH LOGIN").await.code, 334);
    assert_eq!(h.cmd(&b64(&user)).await.code, 334);
    assert_eq!(h.cmd(&b64("pw")).await.code, 535);

    let log = d.log();
    assert!(!log.contains('\x1b'), "raw ESC in the log:\n{log}");
    assert!(
        !log.lines().any(|l| l.starts_with("2031-01-01")),
        "forged line in the log:\n{log}"
    );
    let failures: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("authentication failed"))
        .collect();
    assert_eq!(failures.len(), 2, "{log}");
    for line in failures {
        // The first peer= is the real one; the forged text stays inside the
        // quoted, escaped user field.
        assert!(
            line.split("peer=")
                .nth(1)
                .is_some_and(|rest| rest.starts_with("127.0.0.1 ")),
            "{line}"
        );
        assert!(line.contains(r#"user="x\n2031"#), "{line}");
    }
}

/// Checks in flight count against an address's budget so that parallel
/// guesses can't slip past it, but only failures ban: an application that
/// opens many connections at once with the right password is never banned.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_parallel_logins_with_the_right_password_are_never_banned() {
    let d = Daemon::start(Options::default());
    let mut tasks = Vec::new();
    for _ in 0..40 {
        let addr = d.plain;
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await;
            c.ehlo().await;
            c.auth_plain("bob", "bob-pw").await.code
        }));
    }
    for t in tasks {
        assert_eq!(t.await.expect("task"), 235);
    }
    assert!(!d.log().contains("banned"), "{}", d.log());
}
