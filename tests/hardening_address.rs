//! Envelope addresses end to end (issue 8): the real daemon relays through
//! a smarthost that is a tiny SMTP server recording the raw MAIL and RCPT
//! lines. A quoted local part must reach it with its quotes, never as an
//! ESMTP parameter; what cannot be relayed safely is refused at MAIL/RCPT;
//! `<postmaster>` and address literals are accepted and relayed.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Client, Daemon, Options, message};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// One transaction as the next hop saw it.
#[derive(Debug, Clone, Default)]
struct Seen {
    mail: String,
    rcpts: Vec<String>,
    data: String,
}

/// A minimal next hop on its own thread: accepts everything and records
/// the command lines byte for byte (CR and all, CRLF removed).
struct Recorder {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Recorder {
    fn start() -> Recorder {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let shared = seen.clone();
        let addr = common::spawn_server("127.0.0.1:0", move |stream| {
            let seen = shared.clone();
            async move {
                let _ = record(stream, seen).await;
            }
        });
        Recorder { addr, seen }
    }

    async fn wait_for_one(&self) -> Seen {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = self.seen.lock().expect("lock").first() {
                return s.clone();
            }
            assert!(Instant::now() < deadline, "nothing relayed within 30s");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

async fn record(stream: tokio::net::TcpStream, seen: Arc<Mutex<Vec<Seen>>>) -> std::io::Result<()> {
    let (r, mut w) = stream.into_split();
    let mut r = BufReader::new(r);
    w.write_all(b"220 recorder ESMTP\r\n").await?;
    let mut txn = Seen::default();
    loop {
        let mut raw = Vec::new();
        if r.read_until(b'\n', &mut raw).await? == 0 {
            return Ok(());
        }
        let line = String::from_utf8_lossy(raw.strip_suffix(b"\r\n").unwrap_or(&raw)).into_owned();
        let verb = line.get(..4).unwrap_or_default().to_ascii_uppercase();
        let reply = match verb.as_str() {
            "EHLO" => "250-recorder\r\n250-8BITMIME\r\n250-SMTPUTF8\r\n250 SIZE 100000000",
            "MAIL" => {
                txn = Seen {
                    mail: line,
                    ..Seen::default()
                };
                "250 2.1.0 Ok"
            }
            "RCPT" => {
                txn.rcpts.push(line);
                "250 2.1.5 Ok"
            }
            "DATA" => {
                w.write_all(b"354 go ahead\r\n").await?;
                let Some(data) = common::read_data_body(&mut r).await? else {
                    return Ok(());
                };
                txn.data = String::from_utf8_lossy(&data).into_owned();
                seen.lock().expect("lock").push(std::mem::take(&mut txn));
                "250 2.0.0 recorded"
            }
            "QUIT" => {
                w.write_all(b"221 2.0.0 Bye\r\n").await?;
                return Ok(());
            }
            _ => "250 2.0.0 Ok",
        };
        w.write_all(format!("{reply}\r\n").as_bytes()).await?;
    }
}

fn daemon(recorder: &Recorder) -> Daemon {
    Daemon::start(Options {
        relay: Some(format!(
            "[relay]\nmode = \"smarthost\"\nsmarthost = \"{}\"\ntls = \"none\"\n",
            recorder.addr
        )),
        extra: "retry_schedule = [\"200ms\"]\npoll_interval = \"50ms\"\n".into(),
        ..Options::default()
    })
}

/// The path of a relayed `MAIL FROM:<...>` / `RCPT TO:<...>` line as a
/// quote-aware next hop reads it, and the names of the parameters after it.
fn path_and_params(line: &str) -> (String, Vec<String>) {
    let start = line.find('<').expect("a path") + 1;
    let (mut in_quote, mut escaped) = (false, false);
    let mut end = None;
    for (i, c) in line[start..].char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_quote => escaped = true,
            '"' => in_quote = !in_quote,
            '>' if !in_quote => {
                end = Some(start + i);
                break;
            }
            _ => {}
        }
    }
    let end = end.expect("a closed path");
    let params = line[end + 1..]
        .split_whitespace()
        .map(|p| p.split('=').next().unwrap_or(p).to_ascii_uppercase())
        .collect();
    (line[start..end].to_string(), params)
}

/// Sends one message; every command must get `250` (`354` for DATA).
async fn send(c: &mut Client, from: &str, rcpts: &[&str]) {
    let r = c.cmd(&format!("MAIL FROM:<{from}>")).await;
    assert_eq!(r.code, 250, "MAIL FROM:<{from}>: {r:?}");
    for rcpt in rcpts {
        let r = c.cmd(&format!("RCPT TO:<{rcpt}>")).await;
        assert_eq!(r.code, 250, "RCPT TO:<{rcpt}>: {r:?}");
    }
    let r = c.cmd("DATA").await;
    assert_eq!(r.code, 354, "{r:?}");
    c.send(&common::dot_stuff(&message(None, "hello"))).await;
    let r = c.read_reply().await;
    assert_eq!(r.code, 250, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quoted_local_parts_are_relayed_with_quotes_never_as_parameters() {
    let recorder = Recorder::start();
    let d = daemon(&recorder);
    // alice may send as *@example.test only.
    let mut c = Client::login(d.plain, "alice").await;
    // Its domain is example.test: allowed, and the next hop must see that.
    let sender = "\"ceo@victim.test> ENVID=x\"@example.test";
    let rcpt = "\"x@other.test> NOTIFY=NEVER ORCPT=rfc822;ceo@victim.test\"@example.net";
    send(&mut c, sender, &[rcpt]).await;
    // Quoted the other way round, the address is in victim.test.
    let r = c
        .cmd("MAIL FROM:<\"alice@example.test\"@victim.test>")
        .await;
    assert_eq!(r.code, 553, "{r:?}");
    c.quit().await;

    let seen = recorder.wait_for_one().await;
    let (path, params) = path_and_params(&seen.mail);
    assert_eq!(path, sender, "{:?}", seen.mail);
    assert!(
        params.iter().all(|p| p == "SIZE" || p == "BODY"),
        "parameter injected into {:?}",
        seen.mail
    );
    assert_eq!(seen.rcpts, [format!("RCPT TO:<{rcpt}>")]);
    let (path, params) = path_and_params(&seen.rcpts[0]);
    assert_eq!((path.as_str(), params.len()), (rcpt, 0));
    // The Received: header names the recipient exactly, quotes included.
    assert!(
        seen.data.contains(&format!("\tfor <{rcpt}>;\r\n")),
        "{}",
        seen.data
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addresses_that_cannot_be_relayed_safely_are_refused_at_mail_and_rcpt() {
    let recorder = Recorder::start();
    let d = daemon(&recorder);
    let mut c = Client::login(d.plain, "bob").await;
    for bad in [
        "\"x\rRSET\"@example.test",
        "\"x\0y\"@example.test",
        "\"x\ty\"@example.test",
        "\"unbalanced@example.test",
        "two words@example.test",
        "postmaster",
    ] {
        let r = c.cmd(&format!("MAIL FROM:<{bad}>")).await;
        assert!(r.has("501 5.1.7 "), "MAIL FROM:<{bad:?}>: {r:?}");
    }
    let r = c.cmd("MAIL FROM:<bob@example.test>").await;
    assert_eq!(r.code, 250, "{r:?}");
    for bad in [
        "\"x\rRSET\"@example.net",
        "\"x\0y\"@example.net",
        "\"unbalanced@example.net",
        "a b@example.net",
        "",
    ] {
        let r = c.cmd(&format!("RCPT TO:<{bad}>")).await;
        assert!(r.has("501 5.1.3 "), "RCPT TO:<{bad:?}>: {r:?}");
    }
    c.quit().await;
    assert_eq!(d.queue_count(), 0, "nothing was accepted");
    let log = d.log();
    assert!(log.contains("MAIL refused: bad sender address"), "{log}");
    assert!(log.contains("RCPT refused: bad recipient address"), "{log}");
    // Client text is logged escaped: the CR never reaches the log raw.
    assert!(log.contains(r#"\"x\rRSET\"@example.net"#), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postmaster_and_address_literals_are_accepted_and_relayed() {
    let recorder = Recorder::start();
    let d = daemon(&recorder);
    let mut c = Client::login(d.plain, "bob").await;
    let rcpts = ["postmaster", "PostMaster", "a@[127.0.0.1]", "b@[IPv6:::1]"];
    send(&mut c, "bob@[127.0.0.1]", &rcpts).await;
    c.quit().await;

    let seen = recorder.wait_for_one().await;
    assert!(
        seen.mail.starts_with("MAIL FROM:<bob@[127.0.0.1]>"),
        "{:?}",
        seen.mail
    );
    let want: Vec<String> = rcpts.iter().map(|r| format!("RCPT TO:<{r}>")).collect();
    assert_eq!(seen.rcpts, want);
}
