//! Hostile clients at the connection layer (issue 8): silent TLS
//! connections, one address taking every slot, slow commands and messages,
//! clients that never read, and the accept loop out of file descriptors.
//! Every test runs the real daemon with small limits and prints the
//! measured time to cut a client off.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{Client, Daemon, Options};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// A TCP connection from a chosen loopback source address (127.0.0.0/8
/// is all loopback on Linux), so tests can be "another client".
async fn connect_from(source: &str, addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    let source: SocketAddr = format!("{source}:0").parse().expect("source addr");
    socket.bind(source).expect("bind source address");
    socket.connect(addr).await.expect("connect")
}

async fn tls_from(
    source: &str,
    addr: SocketAddr,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = connect_from(source, addr).await;
    let name = rustls_pki_types::ServerName::try_from("relay.example.test").expect("name");
    common::tls_connector().connect(name, tcp).await
}

/// Reads until EOF, an error, or `limit`; returns the bytes and whether
/// the peer closed.
async fn read_until_closed<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
    limit: Duration,
) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + limit;
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (out, true),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => return (out, false),
        }
    }
}

async fn wait_for_log(d: &Daemon, needle: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if d.log().contains(needle) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

fn limits(lines: &str) -> Options {
    Options {
        // The junk-command limit would cut NOOP floods first; these tests
        // are about the time limits.
        extra: format!("[limits]\nmax_junk_commands = 1000000000\n{lines}"),
        ..Options::default()
    }
}

/// Generous bound for a cut-off: 3x the limit plus 5 s (slow CI).
fn bound(limit: Duration) -> Duration {
    limit * 3 + Duration::from_secs(5)
}

#[tokio::test]
async fn silent_implicit_tls_connection_is_closed_after_handshake_timeout() {
    let d = Daemon::start(limits("tls_handshake_timeout = \"1s\"\n"));
    let start = Instant::now();
    let mut tcp = TcpStream::connect(d.implicit).await.expect("connect");
    let (bytes, closed) = read_until_closed(&mut tcp, bound(Duration::from_secs(1))).await;
    let took = start.elapsed();
    println!("silent implicit-TLS connection closed after {took:?} (limit 1s)");
    assert!(closed, "silent TLS connection still open after {took:?}");
    assert!(
        bytes.is_empty(),
        "nothing may be sent before TLS: {bytes:?}"
    );
    assert!(
        wait_for_log(&d, "TLS handshake timed out").await,
        "{}",
        d.log()
    );
}

#[tokio::test]
async fn silent_client_after_starttls_is_closed_after_handshake_timeout() {
    let d = Daemon::start(limits("tls_handshake_timeout = \"1s\"\n"));
    let mut c = Client::connect(d.starttls).await;
    c.ehlo().await;
    assert_eq!(c.cmd("STARTTLS").await.code, 220);
    let start = Instant::now();
    // Say nothing: no ClientHello.
    assert!(c.is_closed().await, "connection still open after STARTTLS");
    let took = start.elapsed();
    println!("silent client after STARTTLS closed after {took:?} (limit 1s)");
    assert!(took < bound(Duration::from_secs(1)), "took {took:?}");
    assert!(
        wait_for_log(&d, "TLS handshake timed out").await,
        "{}",
        d.log()
    );
}

#[tokio::test]
async fn one_address_cannot_take_every_slot_on_the_implicit_port() {
    let d = Daemon::start(Options {
        max_connections: 10,
        ..limits("max_connections_per_ip = 4\n")
    });
    // 10 silent connections from 127.0.0.1: before the fix they held the
    // whole cap, for ever.
    let mut silent = Vec::new();
    for _ in 0..10 {
        silent.push(connect_from("127.0.0.1", d.implicit).await);
    }
    assert!(
        wait_for_log(&d, "too many connections from this address").await,
        "{}",
        d.log()
    );
    // Another client is still served.
    let mut tls = tokio::time::timeout(Duration::from_secs(10), tls_from("127.0.0.2", d.implicit))
        .await
        .expect("handshake in time")
        .expect("TLS handshake from 127.0.0.2");
    let mut buf = [0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(10), tls.read(&mut buf))
        .await
        .expect("greeting in time")
        .expect("read greeting");
    let greeting = String::from_utf8_lossy(&buf[..n]);
    assert!(greeting.starts_with("220 "), "{greeting:?}");
    drop(silent);
}

#[tokio::test]
async fn over_the_per_address_limit_gets_421_on_the_plaintext_port() {
    let d = Daemon::start(limits("max_connections_per_ip = 2\n"));
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(Client::connect(d.plain).await);
    }
    let mut third = TcpStream::connect(d.plain).await.expect("connect");
    let (bytes, closed) = read_until_closed(&mut third, Duration::from_secs(10)).await;
    assert!(closed);
    assert_eq!(
        String::from_utf8_lossy(&bytes),
        "421 4.7.0 Too many connections from your address\r\n"
    );
    assert!(
        wait_for_log(&d, "too many connections from this address").await,
        "{}",
        d.log()
    );
    // Another address is not affected.
    let mut other = connect_from("127.0.0.2", d.plain).await;
    let mut buf = [0u8; 256];
    let n = other.read(&mut buf).await.expect("greeting");
    assert!(buf[..n].starts_with(b"220 "));
    // A freed slot can be used again.
    held.pop();
    tokio::time::sleep(Duration::from_millis(300)).await;
    Client::connect(d.plain).await.quit().await;
}

#[tokio::test]
async fn trusted_networks_are_exempt_from_the_per_address_limit() {
    let d = Daemon::start(Options {
        trusted_network: Some(("127.0.0.3/32", "acme")),
        ..limits("max_connections_per_ip = 2\n")
    });
    let mut held = Vec::new();
    for _ in 0..5 {
        let mut s = connect_from("127.0.0.3", d.plain).await;
        let mut buf = [0u8; 256];
        let n = s.read(&mut buf).await.expect("greeting");
        assert!(
            buf[..n].starts_with(b"220 "),
            "{:?}",
            String::from_utf8_lossy(&buf[..n])
        );
        held.push(s);
    }
}

#[tokio::test]
async fn over_the_cap_on_the_implicit_port_gets_no_plaintext_421() {
    let d = Daemon::start(Options {
        max_connections: 2,
        ..limits("tls_handshake_timeout = \"2s\"\n")
    });
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(Client::connect_implicit_tls(d.implicit).await);
    }
    // A raw TCP client over the cap: not one plaintext byte.
    let mut raw = TcpStream::connect(d.implicit).await.expect("connect");
    let (bytes, _) = read_until_closed(&mut raw, bound(Duration::from_secs(2))).await;
    assert!(
        !bytes.starts_with(b"421"),
        "plaintext reply on an implicit-TLS port: {:?}",
        String::from_utf8_lossy(&bytes)
    );
    assert!(bytes.is_empty(), "{bytes:?}");
    // A TLS client over the cap reads the 421 inside TLS.
    let mut tls = tls_from("127.0.0.2", d.implicit)
        .await
        .expect("handshake even when refused");
    let (bytes, closed) = read_until_closed(&mut tls, Duration::from_secs(10)).await;
    assert!(closed);
    assert_eq!(
        String::from_utf8_lossy(&bytes),
        "421 4.7.0 Too many connections, try again later\r\n"
    );
}

/// Sends `bytes` one at a time, `gap` apart, until the server closes;
/// returns what the server sent and how long it took.
async fn trickle(stream: &mut TcpStream, bytes: &[u8], gap: Duration, limit: Duration) -> Vec<u8> {
    let start = Instant::now();
    let mut received = Vec::new();
    for b in bytes.iter().cycle() {
        if start.elapsed() > limit {
            break;
        }
        if stream.write_all(&[*b]).await.is_err() {
            break;
        }
        let mut buf = [0u8; 1024];
        match tokio::time::timeout(gap, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => received.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
        if received.ends_with(b"\r\n") && received.starts_with(b"421") {
            break;
        }
    }
    received
}

async fn logged_in(d: &Daemon) -> TcpStream {
    use base64::Engine;
    let mut s = TcpStream::connect(d.plain).await.expect("connect");
    let token = base64::engine::general_purpose::STANDARD.encode("\0alice\0alice-pw");
    s.write_all(format!("EHLO c.test\r\nAUTH PLAIN {token}\r\n").as_bytes())
        .await
        .expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&got).contains("235 ") {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("login reply in time")
            .expect("read");
        assert!(n > 0, "closed: {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    s
}

#[tokio::test]
async fn slow_command_line_is_cut_off() {
    let limit = Duration::from_secs(2);
    let d = Daemon::start(limits("command_time_limit = \"2s\"\n"));
    let mut s = logged_in(&d).await;
    let start = Instant::now();
    // One byte every 300 ms: each read is quick, the line never ends.
    let got = trickle(
        &mut s,
        b"NOOP xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
        Duration::from_millis(300),
        bound(limit) + Duration::from_secs(5),
    )
    .await;
    let took = start.elapsed();
    println!("slow command cut off after {took:?} (command_time_limit 2s)");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("421 4.4.2 "), "{text:?} after {took:?}");
    assert!(took < bound(limit), "took {took:?}");
    assert!(wait_for_log(&d, "command time limit exceeded").await);
}

#[tokio::test]
async fn slow_data_body_is_cut_off() {
    let limit = Duration::from_secs(2);
    let d = Daemon::start(limits("message_time_limit = \"2s\"\n"));
    let mut s = logged_in(&d).await;
    s.write_all(b"MAIL FROM:<alice@example.test>\r\nRCPT TO:<d@example.net>\r\nDATA\r\n")
        .await
        .expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&got).contains("354 ") {
        let n = s.read(&mut buf).await.expect("read");
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    let start = Instant::now();
    // Whole lines, one every 300 ms: the body never ends.
    let got = trickle(
        &mut s,
        b"Subject: slow\r\n",
        Duration::from_millis(20),
        bound(limit) + Duration::from_secs(5),
    )
    .await;
    let took = start.elapsed();
    println!("slow DATA body cut off after {took:?} (message_time_limit 2s)");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("421 4.4.2 "), "{text:?} after {took:?}");
    assert!(took < bound(limit), "took {took:?}");
    assert!(wait_for_log(&d, "message time limit exceeded").await);
}

#[tokio::test]
async fn slow_bdat_chunk_sequence_is_cut_off() {
    let limit = Duration::from_secs(2);
    let d = Daemon::start(limits("message_time_limit = \"2s\"\n"));
    let mut s = logged_in(&d).await;
    s.write_all(b"MAIL FROM:<alice@example.test>\r\nRCPT TO:<d@example.net>\r\n")
        .await
        .expect("write");
    let start = Instant::now();
    // Many small chunks, each answered at once, the last never sent.
    let mut received = Vec::new();
    let mut buf = [0u8; 1024];
    while start.elapsed() < bound(limit) + Duration::from_secs(5) {
        if s.write_all(b"BDAT 4\r\nab\r\n").await.is_err() {
            break;
        }
        match tokio::time::timeout(Duration::from_millis(300), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => received.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
        if String::from_utf8_lossy(&received).contains("421 ") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let took = start.elapsed();
    println!("slow BDAT sequence cut off after {took:?} (message_time_limit 2s)");
    let text = String::from_utf8_lossy(&received);
    assert!(text.contains("421 4.4.2 "), "{text:?} after {took:?}");
    assert!(took < bound(limit), "took {took:?}");
    assert!(wait_for_log(&d, "message time limit exceeded").await);
}

#[tokio::test]
async fn client_that_never_reads_replies_is_cut_off() {
    let limit = Duration::from_secs(2);
    let d = Daemon::start(limits("write_timeout = \"2s\"\n"));
    let mut s = Client::connect(d.plain).await;
    s.ehlo().await;
    let start = Instant::now();
    // Pipeline NOOPs as fast as possible and never read a reply.
    let batch = b"NOOP\r\n".repeat(10_000);
    let mut sent = 0usize;
    let writer = async {
        loop {
            s.send_checked(&batch).await?;
            sent += batch.len();
        }
    };
    let result: Result<std::io::Result<()>, _> =
        tokio::time::timeout(bound(limit) + Duration::from_secs(10), writer).await;
    let took = start.elapsed();
    println!(
        "client that never reads cut off after {took:?} (write_timeout 2s, {} KiB sent)",
        sent / 1024
    );
    assert!(
        matches!(result, Ok(Err(_))),
        "server still reading after {took:?}"
    );
    assert!(
        took < bound(limit) + Duration::from_secs(5),
        "took {took:?}"
    );
    assert!(wait_for_log(&d, "write timed out").await, "{}", d.log());
}

#[tokio::test]
async fn silent_refused_tls_clients_do_not_pile_up() {
    // Many silent connections over the cap on the implicit port: each
    // refusal is bounded by the handshake timeout, and the daemon still
    // serves once the holders leave.
    let d = Daemon::start(Options {
        max_connections: 2,
        ..limits("tls_handshake_timeout = \"1s\"\n")
    });
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(Client::connect_implicit_tls(d.implicit).await);
    }
    let mut silent = Vec::new();
    for _ in 0..50 {
        silent.push(TcpStream::connect(d.implicit).await.expect("connect"));
    }
    let start = Instant::now();
    for s in &mut silent {
        let (bytes, closed) = read_until_closed(s, bound(Duration::from_secs(1))).await;
        assert!(closed && bytes.is_empty(), "{bytes:?}");
    }
    println!(
        "50 silent refused connections all closed within {:?}",
        start.elapsed()
    );
    drop(held);
    tokio::time::sleep(Duration::from_millis(300)).await;
    Client::connect_implicit_tls(d.implicit).await.quit().await;
}

#[tokio::test]
async fn accept_out_of_file_descriptors_does_not_flood_the_log() {
    let d = Daemon::start(Options {
        max_connections: 1000,
        ..limits("max_connections_per_ip = 1000\n")
    });
    let pid = d.child.as_ref().expect("running").id();
    // Lower the running daemon's descriptor limit so that accept() fails.
    // prlimit is in Debian's essential util-linux: fail, never skip.
    let status = std::process::Command::new("prlimit")
        .args(["--pid", &pid.to_string(), "--nofile=64:64"])
        .status()
        .expect("prlimit (util-linux)");
    assert!(status.success());
    let mut held = Vec::new();
    for _ in 0..100 {
        held.push(TcpStream::connect(d.plain).await.expect("connect"));
    }
    assert!(wait_for_log(&d, "accept failed").await, "{}", d.log());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let lines = d.log().matches("accept failed").count();
    println!("{lines} 'accept failed' log lines in ~3 s out of descriptors");
    assert!(
        lines <= 5,
        "accept errors flood the log: {lines} lines in 3 s"
    );
    // Once descriptors are free again, clients are served.
    drop(held);
    let c = tokio::time::timeout(Duration::from_secs(15), Client::connect(d.plain))
        .await
        .expect("served after recovery");
    c.quit().await;
}

#[tokio::test]
async fn half_closed_client_still_gets_every_reply_then_the_close() {
    // A client that pipelines and then shuts down its sending side must get
    // all its replies, and the server must then end the session promptly
    // (not wait for an idle timeout on a socket that can't send).
    let d = Daemon::start(limits(""));
    let mut s = TcpStream::connect(d.plain).await.expect("connect");
    s.write_all(b"EHLO c.test\r\nNOOP\r\nNOOP\r\n")
        .await
        .expect("write");
    s.shutdown().await.expect("half-close");
    let start = Instant::now();
    let (bytes, closed) = read_until_closed(&mut s, Duration::from_secs(10)).await;
    let text = String::from_utf8_lossy(&bytes);
    assert!(closed, "still open after half-close: {text:?}");
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(text.starts_with("220 "), "{text:?}");
    assert_eq!(text.matches("250 2.0.0 Ok\r\n").count(), 2, "{text:?}");
}

#[tokio::test]
async fn silent_clients_from_many_addresses_lose_their_slots_when_the_cap_is_reached() {
    // The per-address limit does not stop many addresses (an IPv6 /56 has
    // 256 /64s) from holding every slot with greeted, silent connections
    // for the whole command timeout (5 min). At the cap, idle reads are
    // cut to 10 s.
    let d = Daemon::start(Options {
        max_connections: 3,
        ..limits("max_connections_per_ip = 1\n")
    });
    let mut silent = Vec::new();
    for source in ["127.0.0.11", "127.0.0.12", "127.0.0.13"] {
        let mut s = connect_from(source, d.plain).await;
        let mut buf = [0u8; 256];
        let n = s.read(&mut buf).await.expect("greeting");
        assert!(buf[..n].starts_with(b"220 "));
        silent.push(s);
    }
    let start = Instant::now();
    let served = async {
        loop {
            let mut s = connect_from("127.0.0.20", d.plain).await;
            let mut buf = [0u8; 256];
            if let Ok(n) = s.read(&mut buf).await
                && buf[..n].starts_with(b"220 ")
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(40), served)
        .await
        .expect("a new client is served once idle connections are cut");
    println!(
        "new client served {:?} after the cap was reached",
        start.elapsed()
    );
    assert!(wait_for_log(&d, "idle timeout while the connection cap is reached").await);
    for s in &mut silent {
        let (bytes, closed) = read_until_closed(s, Duration::from_secs(5)).await;
        assert!(closed);
        assert!(String::from_utf8_lossy(&bytes).starts_with("421 4.4.2 "));
    }
}

#[tokio::test]
async fn tls_client_that_never_reads_replies_is_cut_off() {
    let limit = Duration::from_secs(2);
    let d = Daemon::start(limits("write_timeout = \"2s\"\n"));
    let mut s = Client::connect_implicit_tls(d.implicit).await;
    s.ehlo().await;
    let start = Instant::now();
    let batch = b"NOOP\r\n".repeat(10_000);
    let writer = async {
        loop {
            s.send_checked(&batch).await?;
        }
    };
    let result: Result<std::io::Result<()>, _> =
        tokio::time::timeout(bound(limit) + Duration::from_secs(10), writer).await;
    let took = start.elapsed();
    println!("TLS client that never reads cut off after {took:?} (write_timeout 2s)");
    assert!(
        matches!(result, Ok(Err(_))),
        "server still reading after {took:?}"
    );
    assert!(wait_for_log(&d, "write timed out").await, "{}", d.log());
}
