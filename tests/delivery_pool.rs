//! Persistent outbound connections (issue 10, item 2): the real daemon in
//! smarthost mode relays to a sink written here that counts connections,
//! transactions per connection and QUITs, and records every message key it
//! received. Faults the sink can play: close a connection after its first
//! message, answer 421 to the second MAIL, vanish after the second dot.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Client, Daemon, Options, message, wait_until};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    /// Replies 250 to the first message, then closes: the pooled session
    /// is dead before its next use.
    CloseAfterFirstMessage,
    /// The second MAIL on a connection gets `421` and the connection ends.
    Refuse421OnSecondMail,
    /// Reads the second message up to its dot, then closes unanswered.
    DropAfterSecondDot,
}

/// What the sink saw on one connection.
#[derive(Debug, Clone, Default)]
struct ConnLog {
    /// Messages answered with 250.
    delivered: usize,
    last_delivery: Option<Instant>,
    quit_at: Option<Instant>,
}

#[derive(Default)]
struct Seen {
    conns: Vec<ConnLog>,
    /// The key of every message whose final dot arrived, answered or not.
    keys: Vec<String>,
    faults: usize,
}

struct Sink {
    addr: SocketAddr,
    seen: Arc<Mutex<Seen>>,
}

impl Sink {
    fn start(fault: Fault) -> Sink {
        Sink::start_on("127.0.0.1:0", fault)
    }

    fn start_on(bind: &str, fault: Fault) -> Sink {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let shared = seen.clone();
        let addr = common::spawn_server(bind, move |stream| {
            let seen = shared.clone();
            let index = {
                let mut s = seen.lock().expect("lock");
                s.conns.push(ConnLog::default());
                s.conns.len() - 1
            };
            async move {
                let _ = serve(stream, seen, index, fault).await;
            }
        });
        Sink { addr, seen }
    }

    fn conns(&self) -> Vec<ConnLog> {
        self.seen.lock().expect("lock").conns.clone()
    }

    fn keys(&self) -> Vec<String> {
        self.seen.lock().expect("lock").keys.clone()
    }

    fn faults(&self) -> usize {
        self.seen.lock().expect("lock").faults
    }
}

async fn serve(
    stream: tokio::net::TcpStream,
    seen: Arc<Mutex<Seen>>,
    index: usize,
    fault: Fault,
) -> std::io::Result<()> {
    let (r, mut w) = stream.into_split();
    let mut r = BufReader::new(r);
    w.write_all(b"220 sink ESMTP\r\n").await?;
    let (mut mails, mut dots) = (0, 0);
    loop {
        let mut line = Vec::new();
        if r.read_until(b'\n', &mut line).await? == 0 {
            return Ok(());
        }
        let verb = String::from_utf8_lossy(line.get(..4).unwrap_or_default()).to_ascii_uppercase();
        let reply = match verb.as_str() {
            "EHLO" => "250-sink\r\n250-8BITMIME\r\n250 SIZE 10000000",
            "MAIL" => {
                mails += 1;
                if fault == Fault::Refuse421OnSecondMail && mails == 2 {
                    seen.lock().expect("lock").faults += 1;
                    w.write_all(b"421 4.3.2 Service shutting down\r\n").await?;
                    return Ok(());
                }
                "250 2.1.0 Ok"
            }
            "RCPT" => "250 2.1.5 Ok",
            "DATA" => {
                w.write_all(b"354 go ahead\r\n").await?;
                let Some(data) = common::read_data_body(&mut r).await? else {
                    return Ok(());
                };
                dots += 1;
                let key = smtp_once::message::key_header::extract_key(&data)
                    .expect("valid key")
                    .unwrap_or_default();
                let vanish = {
                    let mut s = seen.lock().expect("lock");
                    s.keys.push(key);
                    let vanish = fault == Fault::DropAfterSecondDot && dots == 2;
                    if vanish {
                        s.faults += 1;
                    } else {
                        s.conns[index].delivered += 1;
                        s.conns[index].last_delivery = Some(Instant::now());
                    }
                    vanish
                };
                if vanish {
                    return Ok(());
                }
                if fault == Fault::CloseAfterFirstMessage {
                    w.write_all(b"250 2.0.0 queued\r\n").await?;
                    seen.lock().expect("lock").faults += 1;
                    return Ok(());
                }
                "250 2.0.0 queued"
            }
            "RSET" | "NOOP" => "250 2.0.0 Ok",
            "QUIT" => {
                seen.lock().expect("lock").conns[index].quit_at = Some(Instant::now());
                w.write_all(b"221 2.0.0 Bye\r\n").await?;
                return Ok(());
            }
            _ => "502 5.5.1 Unknown command",
        };
        w.write_all(format!("{reply}\r\n").as_bytes()).await?;
    }
}

fn relay(sink: &Sink, extra: &str) -> Option<String> {
    Some(format!(
        "[relay]\nmode = \"smarthost\"\nsmarthost = \"{}\"\ntls = \"none\"\n\
         retry_schedule = [\"1h\"]\npoll_interval = \"50ms\"\n{extra}",
        sink.addr
    ))
}

fn states(d: &Daemon) -> Vec<(String, String, i64)> {
    let db = d.db();
    let mut stmt = db
        .prepare("SELECT id, state, attempts FROM queue ORDER BY id")
        .expect("prepare");
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("query")
        .map(|r| r.expect("row"))
        .collect()
}

async fn wait_all(d: &Daemon, n: usize, state: &str) -> Vec<(String, String, i64)> {
    wait_until(&format!("{n} messages {state}"), 60, || {
        let all = states(d);
        (all.len() == n && all.iter().all(|(_, s, _)| s == state)).then_some(all)
    })
    .await
}

/// Submits `keys.len()` messages over one client connection.
async fn submit_all(d: &Daemon, keys: &[String]) {
    let mut c = Client::login(d.plain, "bob").await;
    for key in keys {
        let r = c
            .submit(
                "bob@example.test",
                &["r@example.net"],
                &message(Some(key), "pooled"),
            )
            .await;
        assert_eq!(r.code, 250, "{r:?}");
    }
    c.quit().await;
}

fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// Every key exactly once at the sink.
fn assert_once(sink: &Sink, keys: &[String]) {
    let mut got = sink.keys();
    got.sort();
    let mut want = keys.to_vec();
    want.sort();
    assert_eq!(got, want, "each message exactly once at the sink");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_messages_share_few_connections() {
    let sink = Sink::start(Fault::None);
    let d = Daemon::start(Options {
        relay: relay(&sink, "max_per_destination = 2\n"),
        ..Options::default()
    });
    let keys = keys("many", 30);
    submit_all(&d, &keys).await;
    let done = wait_all(&d, 30, "delivered").await;
    assert!(done.iter().all(|(_, _, a)| *a == 1), "{done:?}");
    assert_once(&sink, &keys);
    let conns = sink.conns();
    assert!(
        conns.len() <= 2,
        "at most max_per_destination connections, got {}: {conns:?}",
        conns.len()
    );
    assert_eq!(conns.iter().map(|c| c.delivered).sum::<usize>(), 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_messages_per_connection_is_respected() {
    let sink = Sink::start(Fault::None);
    let d = Daemon::start(Options {
        relay: relay(
            &sink,
            "max_per_destination = 1\nmax_messages_per_connection = 5\n",
        ),
        ..Options::default()
    });
    let keys = keys("cap", 12);
    submit_all(&d, &keys).await;
    wait_all(&d, 12, "delivered").await;
    assert_once(&sink, &keys);
    let conns = sink.conns();
    assert!(conns.iter().all(|c| c.delivered <= 5), "{conns:?}");
    assert!(conns.iter().any(|c| c.delivered > 1), "reused: {conns:?}");
    assert_eq!(conns.len(), 3, "12 messages at 5 a connection: {conns:?}");
    // The used-up ones end with QUIT, not a dropped socket.
    let full: Vec<&ConnLog> = conns.iter().filter(|c| c.delivered == 5).collect();
    assert_eq!(full.len(), 2, "{conns:?}");
    assert!(full.iter().all(|c| c.quit_at.is_some()), "{conns:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_with_quit_after_the_idle_timeout() {
    let sink = Sink::start(Fault::None);
    let d = Daemon::start(Options {
        relay: relay(&sink, "connection_idle_timeout = \"1s\"\n"),
        ..Options::default()
    });
    submit_all(&d, &keys("idle", 1)).await;
    wait_all(&d, 1, "delivered").await;
    let conn = wait_until("QUIT after the idle timeout", 20, || {
        sink.conns().into_iter().find(|c| c.quit_at.is_some())
    })
    .await;
    let (sent, quit) = (
        conn.last_delivery.expect("a delivery"),
        conn.quit_at.expect("quit"),
    );
    let idle = quit.duration_since(sent);
    // Kept open for the next message, then closed by the sweep alone.
    assert!(idle >= Duration::from_millis(900), "closed after {idle:?}");
    assert!(idle < Duration::from_secs(15), "closed after {idle:?}");
    assert_eq!(sink.conns().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_pooled_connections_with_quit() {
    let sink = Sink::start(Fault::None);
    let mut d = Daemon::start(Options {
        relay: relay(&sink, ""),
        ..Options::default()
    });
    submit_all(&d, &keys("bye", 1)).await;
    wait_all(&d, 1, "delivered").await;
    assert!(sink.conns()[0].quit_at.is_none(), "kept open for reuse");
    let exit = tokio::task::block_in_place(|| d.terminate());
    assert!(exit.success(), "{exit:?}");
    wait_until("QUIT at shutdown", 10, || sink.conns()[0].quit_at).await;
}

/// Messages one after another, so each finds the previous one's session.
async fn one_by_one(d: &Daemon, keys: &[String]) {
    for (i, key) in keys.iter().enumerate() {
        submit_all(d, std::slice::from_ref(key)).await;
        wait_all(d, i + 1, "delivered").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_connection_closed_by_the_next_hop_is_replaced() {
    let sink = Sink::start(Fault::CloseAfterFirstMessage);
    let d = Daemon::start(Options {
        relay: relay(&sink, "max_per_destination = 1\n"),
        ..Options::default()
    });
    let keys = keys("closed", 4);
    one_by_one(&d, &keys).await;
    let done = states(&d);
    assert!(
        done.iter().all(|(_, s, a)| s == "delivered" && *a == 1),
        "delivered in the first attempt: {done:?}"
    );
    assert_once(&sink, &keys);
    assert_eq!(sink.conns().len(), 4);
    assert!(
        d.log().matches("retrying on a new connection").count() >= 3,
        "{}",
        d.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_421_on_a_reused_connection_is_retried_on_a_fresh_one() {
    let sink = Sink::start(Fault::Refuse421OnSecondMail);
    let d = Daemon::start(Options {
        relay: relay(&sink, "max_per_destination = 1\n"),
        ..Options::default()
    });
    let keys = keys("421", 4);
    one_by_one(&d, &keys).await;
    let done = states(&d);
    assert!(
        done.iter().all(|(_, s, a)| s == "delivered" && *a == 1),
        "{done:?}"
    );
    assert_once(&sink, &keys);
    assert!(sink.faults() >= 3, "the sink refused reuse");
    assert!(d.log().contains("421 4.3.2"), "{}", d.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_lost_after_the_dot_is_not_retried_in_the_same_attempt() {
    let sink = Sink::start(Fault::DropAfterSecondDot);
    let d = Daemon::start(Options {
        relay: relay(&sink, "max_per_destination = 1\n"),
        ..Options::default()
    });
    let keys = keys("dot", 2);
    submit_all(&d, &keys[..1]).await;
    wait_all(&d, 1, "delivered").await;
    submit_all(&d, &keys[1..]).await;
    let second = wait_until("the second message deferred", 30, || {
        states(&d).into_iter().find(|(_, s, _)| s == "deferred")
    })
    .await;
    assert_eq!(second.2, 1, "one attempt: {second:?}");
    // Nothing else goes out: no resend on a fresh connection.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(sink.conns().len(), 1, "{:?}", sink.conns());
    assert_once(&sink, &keys);
    let out = d.cli(&["status", &second.0]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("after DATA"), "{text}");
}

/// Figures, not a timed assertion: `cargo test --test delivery_pool
/// reuse_figures -- --ignored --nocapture`. 1,000 messages wait in the
/// queue (the sink is down), then the sink starts and `retry --all` lets
/// them go: the time until all are delivered and the connections opened,
/// with one connection per message (`max_messages_per_connection = 1`,
/// the old behaviour) and with the pool's defaults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn reuse_figures() {
    const N: usize = 1000;
    for cap in ["1", "100"] {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("bind")
            .local_addr()
            .expect("addr")
            .port();
        let d = Daemon::start(Options {
            relay: Some(format!(
                "[relay]\nmode = \"smarthost\"\nsmarthost = \"127.0.0.1:{port}\"\ntls = \"none\"\n\
                 retry_schedule = [\"1h\"]\npoll_interval = \"50ms\"\nmax_messages_per_connection = {cap}\n"
            )),
            ..Options::default()
        });
        submit_all(&d, &keys("fig", N)).await;
        wait_all(&d, N, "deferred").await;
        let sink = Sink::start_on(&format!("127.0.0.1:{port}"), Fault::None);
        let start = Instant::now();
        let out = d.cli(&["retry", "--all"]);
        assert!(out.status.success());
        wait_all(&d, N, "delivered").await;
        let took = start.elapsed();
        assert_eq!(sink.keys().len(), N);
        println!(
            "max_messages_per_connection = {cap}: {N} messages delivered in {:.2}s ({:.0} msgs/s), {} connections",
            took.as_secs_f64(),
            N as f64 / took.as_secs_f64(),
            sink.conns().len()
        );
    }
}
