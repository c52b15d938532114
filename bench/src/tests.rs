//! End-to-end tests of `run()` against a tiny in-process SMTP server.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::*;

/// Throwaway self-signed P-256 certificate for these tests only.
const TEST_CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBmzCCAUCgAwIBAgIUYQ2sZ2KvXl6l6hwLWtOXcQhoGcIwCgYIKoZIzj0EAwIw
FTETMBEGA1UEAwwKYmVuY2gudGVzdDAgFw0yNjExMzAyMDA5NDFaGA8yMTI2MTEw
NjIwMDk0MVowFTETMBEGA1UEAwwKYmVuY2gudGVzdDBZMBMGByqGSM49AgEGCCqG
SM49AwEHA0IABLyMXTofUyixy6H3OtZT3EFaLm0erkZk+0JvxWxuBiQImMuF9dUs
Dh6yaB1XAISQRR0SkEBrBt0A/KlVp6+7BXijbDBqMB0GA1UdDgQWBBRcbvuULP9+
RImCSkRwCo8HySsd6DAfBgNVHSMEGDAWgBRcbvuULP9+RImCSkRwCo8HySsd6DAa
BgNVHREEEzARgglsb2NhbGhvc3SHBH8AAAEwDAYDVR0TAQH/BAIwADAKBggqhkjO
PQQDAgNJADBGAiEAnFu9KBimiSinjeDfIE6pQbPZzkkSN9EguZuehcB8YJsCIQDY
NQII0h71vaCfh+LJ9PCmzez+y9zTvuYlj/3bm8qLbA==
-----END CERTIFICATE-----
";
const TEST_KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgM/W2WfmoPNKGYFAP
wVtqCw9Lw9/aUoxLebiW2Fo0xFyhRANCAAS8jF06H1Moscuh9zrWU9xBWi5tHq5G
ZPtCb8VsbgYkCJjLhfXVLA4esmgdVwCEkEUdEpBAawbdAPypVaevuwV4
-----END PRIVATE KEY-----
";

#[derive(Clone, Copy, Default, PartialEq)]
enum ServerTls {
    #[default]
    None,
    StartTls,
    Implicit,
}

#[derive(Clone, Copy, Default)]
struct ServerOpts {
    tls: ServerTls,
    pipelining: bool,
    /// Drop the connection (no final reply) when this many messages have
    /// been received on it.
    drop_after: Option<usize>,
    /// Required AUTH PLAIN token (base64), if any.
    auth: Option<&'static str>,
    /// Refuse every n-th MAIL FROM on a connection (1: all) with this reply.
    refuse_mail: Option<(usize, &'static str)>,
}

/// A received message, un-stuffed, without the terminating ".".
#[derive(Clone)]
struct Received {
    key: Option<String>,
    bytes: Vec<u8>,
    tls: bool,
}

struct TestServer {
    addr: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
}

impl TestServer {
    async fn start(opts: ServerOpts) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let received = Arc::new(Mutex::new(Vec::new()));
        let queue_id = Arc::new(AtomicU64::new(0));
        let acceptor = tls_acceptor();
        let rx = received.clone();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                // Replies are written one per command; without this, Nagle
                // plus delayed ACKs stall each pipelined batch by ~40 ms.
                let _ = tcp.set_nodelay(true);
                let (rx, qid, acceptor) = (rx.clone(), queue_id.clone(), acceptor.clone());
                tokio::spawn(async move {
                    if opts.tls == ServerTls::Implicit {
                        if let Ok(tls) = acceptor.accept(tcp).await {
                            let _ = serve(BufReader::new(tls), opts, true, rx, qid).await;
                        }
                        return;
                    }
                    let plain = serve(BufReader::new(tcp), opts, false, rx.clone(), qid.clone());
                    if let Ok(Some(io)) = plain.await
                        && let Ok(tls) = acceptor.accept(io.into_inner()).await
                    {
                        let _ = serve(BufReader::new(tls), opts, true, rx, qid).await;
                    }
                });
            }
        });
        TestServer { addr, received }
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().expect("lock").clone()
    }
}

fn tls_acceptor() -> TlsAcceptor {
    let cert = CertificateDer::from_pem_slice(TEST_CERT.as_bytes()).expect("cert");
    let key = PrivateKeyDer::from_pem_slice(TEST_KEY.as_bytes()).expect("key");
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(vec![cert], key)
    .expect("server config");
    TlsAcceptor::from(Arc::new(config))
}

/// Serves one SMTP session. Returns `Ok(Some(stream))` when the client
/// asked for STARTTLS so the caller can upgrade and call again.
async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    mut io: BufReader<S>,
    opts: ServerOpts,
    tls: bool,
    received: Arc<Mutex<Vec<Received>>>,
    queue_id: Arc<AtomicU64>,
) -> std::io::Result<Option<BufReader<S>>> {
    // After STARTTLS there is no new greeting.
    let upgraded = tls && opts.tls == ServerTls::StartTls;
    if !upgraded {
        io.write_all(b"220 test ESMTP\r\n").await?;
    }
    let mut seen_keys = HashSet::new();
    let mut count = 0usize;
    let mut mails = 0usize;
    // Inside a mail transaction (after an accepted MAIL).
    let mut in_txn = false;
    let mut line = Vec::new();
    loop {
        line.clear();
        if io.read_until(b'\n', &mut line).await? == 0 {
            return Ok(None);
        }
        let cmd = String::from_utf8_lossy(&line).to_ascii_uppercase();
        let reply: Vec<u8> = if cmd.starts_with("EHLO") {
            let mut r = b"250-test\r\n".to_vec();
            if opts.pipelining {
                r.extend_from_slice(b"250-PIPELINING\r\n");
            }
            if opts.tls == ServerTls::StartTls && !tls {
                r.extend_from_slice(b"250-STARTTLS\r\n");
            }
            r.extend_from_slice(b"250 AUTH PLAIN\r\n");
            r
        } else if cmd.starts_with("STARTTLS") {
            io.write_all(b"220 go ahead\r\n").await?;
            io.flush().await?;
            return Ok(Some(io));
        } else if cmd.starts_with("AUTH PLAIN ") {
            let token = String::from_utf8_lossy(&line[11..]).trim().to_string();
            if opts.auth == Some(token.as_str()) {
                b"235 ok\r\n".to_vec()
            } else {
                b"535 bad\r\n".to_vec()
            }
        } else if cmd.starts_with("MAIL")
            && let Some((every, refusal)) = opts.refuse_mail
            && {
                mails += 1;
                mails.is_multiple_of(every)
            }
        {
            in_txn = false;
            format!("{refusal}\r\n").into_bytes()
        } else if (cmd.starts_with("RCPT") || cmd.starts_with("DATA")) && !in_txn {
            b"503 5.5.1 MAIL first\r\n".to_vec()
        } else if cmd.starts_with("MAIL") || cmd.starts_with("RCPT") || cmd.starts_with("RSET") {
            in_txn = !cmd.starts_with("RSET");
            b"250 ok\r\n".to_vec()
        } else if cmd.starts_with("DATA") {
            in_txn = false;
            io.write_all(b"354 go\r\n").await?;
            let mut msg = Vec::new();
            loop {
                line.clear();
                if io.read_until(b'\n', &mut line).await? == 0 {
                    return Ok(None);
                }
                if line == b".\r\n" {
                    break;
                }
                let l = line.strip_prefix(b".").unwrap_or(&line);
                msg.extend_from_slice(l);
            }
            count += 1;
            let key = String::from_utf8_lossy(&msg)
                .lines()
                .find_map(|l| l.strip_prefix("X-Bird-Idempotency-Key: "))
                .map(str::to_string);
            received.lock().expect("lock").push(Received {
                key: key.clone(),
                bytes: msg,
                tls,
            });
            if opts.drop_after == Some(count) {
                return Ok(None);
            }
            let qid = queue_id.fetch_add(1, Ordering::Relaxed);
            // The replay marker is per connection here, which is enough for
            // the bench's per-connection replays.
            match key {
                Some(k) if !seen_keys.insert(k.clone()) => format!(
                    "250-2.0.0 Idempotency-Replay: true\r\n250 2.0.0 Ok: queued as {qid}\r\n"
                )
                .into_bytes(),
                _ => format!("250 2.0.0 Ok: queued as {qid}\r\n").into_bytes(),
            }
        } else if cmd.starts_with("QUIT") {
            io.write_all(b"221 bye\r\n").await?;
            return Ok(None);
        } else {
            b"500 what\r\n".to_vec()
        };
        io.write_all(&reply).await?;
    }
}

fn args(addr: SocketAddr, connections: usize, messages: u64) -> BenchArgs {
    BenchArgs {
        server: addr.to_string(),
        connections,
        messages,
        duration: None,
        size: 4096,
        repeat: 0.0,
        no_key: false,
        starttls: false,
        implicit_tls: false,
        auth: None,
        from: "bench@example.test".into(),
        to: "sink@example.test".into(),
        key_prefix: None,
        key_style: KeyStyle::Sequential,
        json: false,
        quiet: true,
    }
}

fn distinct_keys(received: &[Received]) -> HashMap<String, Vec<u8>> {
    let mut keys: HashMap<String, Vec<u8>> = HashMap::new();
    for r in received {
        let k = r.key.clone().expect("key header");
        if let Some(prev) = keys.get(&k) {
            assert_eq!(prev, &r.bytes, "replay of {k} is not byte-identical");
        }
        keys.insert(k, r.bytes.clone());
    }
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_unique_messages() {
    let server = TestServer::start(ServerOpts {
        pipelining: true,
        ..Default::default()
    })
    .await;
    let report = run(args(server.addr, 4, 200)).await.expect("run");
    assert_eq!(report.messages, 200);
    assert_eq!(report.replies.get("250"), Some(&200));
    assert_eq!(report.replies.get("replay"), None);
    assert_eq!(report.errors, 0);
    assert!(report.latency_ms.max >= report.latency_ms.p50);
    let received = server.received();
    assert_eq!(received.len(), 200);
    assert_eq!(distinct_keys(&received).len(), 200);
    for r in &received {
        // Un-stuffed size matches --size (key digits vary slightly).
        assert!(r.bytes.len().abs_diff(4096) <= 4, "size {}", r.bytes.len());
        assert!(r.bytes.split(|&b| b == b'\n').any(|l| l.starts_with(b".")));
    }
    let json = report.to_json().expect("json");
    assert!(json.contains("\"msgs_per_sec\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeat_reuses_keys_with_identical_bytes() {
    let server = TestServer::start(ServerOpts {
        pipelining: true,
        ..Default::default()
    })
    .await;
    let mut a = args(server.addr, 4, 200);
    a.repeat = 0.5;
    let report = run(a).await.expect("run");
    assert_eq!(report.replies.get("250"), Some(&200));
    let received = server.received();
    assert_eq!(received.len(), 200);
    let distinct = distinct_keys(&received).len() as u64;
    assert!(distinct < 200, "distinct {distinct}");
    assert_eq!(200 - distinct, report.repeats_sent);
    assert_eq!(report.replayed_by_server, report.repeats_sent);
    assert_eq!(report.accepted, 200);
    // The reply map holds reply codes only; replays are labelled apart.
    assert_eq!(report.replies.len(), 1, "{:?}", report.replies);
    let text = report.human();
    let n = report.repeats_sent;
    assert!(
        text.contains(&format!("replayed by server  {n}\n")),
        "{text}"
    );
    assert!(
        text.contains(&format!("repeats sent        {n}\n")),
        "{text}"
    );
    assert!(!text.contains("replay="), "{text}");
    let json: serde_json::Value =
        serde_json::from_str(&report.to_json().expect("json")).expect("parse");
    assert_eq!(json["replayed_by_server"], n);
    assert_eq!(json["repeats_sent"], n);
    assert_eq!(json["accepted"], 200);
    assert!(json.get("replays_sent").is_none());
    assert!(report.verdict().is_ok());
    assert_eq!(report.warning(), None);
}

/// Every message refused, over a healthy connection: the run reports the
/// codes but fails, naming them.
async fn all_refused(pipelining: bool, refusal: &'static str, code: &str) -> BenchError {
    let server = TestServer::start(ServerOpts {
        pipelining,
        refuse_mail: Some((1, refusal)),
        ..Default::default()
    })
    .await;
    let report = run(args(server.addr, 2, 10)).await.expect("run");
    assert_eq!(report.messages, 10);
    assert_eq!(report.replies.get(code), Some(&10), "{:?}", report.replies);
    assert_eq!((report.accepted, report.errors), (0, 0));
    assert_eq!(report.refused(), 10);
    assert!(server.received().is_empty());
    let mut a = args(server.addr, 2, 10);
    a.json = true;
    let cli = run_cli(a).await;
    assert!(
        matches!(cli, Err(BenchError::NothingAccepted { .. })),
        "{cli:?}"
    );
    report.verdict().expect_err("nothing accepted must fail")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_accepted_530_fails_with_a_hint() {
    let err = all_refused(false, "530 5.7.0 Authentication required", "530").await;
    let msg = err.to_string();
    assert!(
        msg.contains("no message was accepted: all 10 refused (530=10)"),
        "{msg}"
    );
    assert!(msg.contains("--auth"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_accepted_553_fails() {
    let err = all_refused(true, "553 5.7.1 Sender not allowed", "553").await;
    let msg = err.to_string();
    assert!(msg.contains("all 10 refused (553=10)"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn some_refused_warns_per_code() {
    let server = TestServer::start(ServerOpts {
        pipelining: true,
        refuse_mail: Some((2, "553 5.7.1 Sender not allowed")),
        ..Default::default()
    })
    .await;
    let report = run(args(server.addr, 1, 10)).await.expect("run");
    assert_eq!(report.replies.get("250"), Some(&5), "{:?}", report.replies);
    assert_eq!(report.replies.get("553"), Some(&5));
    assert_eq!(report.accepted, 5);
    assert!(report.verdict().is_ok());
    let warning = report.warning().expect("warning");
    assert!(
        warning.contains("5 of 10 messages refused (553=5)"),
        "{warning}"
    );
    assert_eq!(server.received().len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_without_pipelining_and_without_key() {
    let server = TestServer::start(ServerOpts::default()).await;
    let mut a = args(server.addr, 2, 50);
    a.no_key = true;
    a.size = 300;
    let report = run(a).await.expect("run");
    assert_eq!(report.replies.get("250"), Some(&50));
    let received = server.received();
    assert_eq!(received.len(), 50);
    assert!(received.iter().all(|r| r.key.is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_and_retries_after_drop() {
    let server = TestServer::start(ServerOpts {
        pipelining: true,
        drop_after: Some(30),
        ..Default::default()
    })
    .await;
    let report = run(args(server.addr, 2, 100)).await.expect("run");
    assert_eq!(report.replies.get("250"), Some(&100));
    assert!(report.errors >= 2, "errors {}", report.errors);
    // Dropped messages were re-sent with the same key and bytes.
    let received = server.received();
    assert!(received.len() > 100);
    assert_eq!(distinct_keys(&received).len(), 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starttls_with_auth() {
    let server = TestServer::start(ServerOpts {
        tls: ServerTls::StartTls,
        pipelining: true,
        auth: Some("AHVzZXIAcGFzcw=="), // "\0user\0pass"
        ..Default::default()
    })
    .await;
    let mut a = args(server.addr, 2, 20);
    a.starttls = true;
    a.auth = Some("user:pass".into());
    let report = run(a).await.expect("run");
    assert_eq!(report.replies.get("250"), Some(&20));
    assert!(server.received().iter().all(|r| r.tls));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn implicit_tls() {
    let server = TestServer::start(ServerOpts {
        tls: ServerTls::Implicit,
        pipelining: true,
        ..Default::default()
    })
    .await;
    let mut a = args(server.addr, 2, 20);
    a.implicit_tls = true;
    let report = run(a).await.expect("run");
    assert_eq!(report.replies.get("250"), Some(&20));
    assert_eq!(server.received().len(), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duration_mode() {
    let server = TestServer::start(ServerOpts {
        pipelining: true,
        ..Default::default()
    })
    .await;
    let mut a = args(server.addr, 2, 0);
    a.duration = Some(1);
    a.size = 512;
    let report = run(a).await.expect("run");
    assert!(report.messages > 0);
    assert!(report.seconds >= 1.0 && report.seconds < 5.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_rejected_is_an_error() {
    let server = TestServer::start(ServerOpts {
        auth: Some("nope"),
        ..Default::default()
    })
    .await;
    let mut a = args(server.addr, 1, 5);
    a.auth = Some("user:pass".into());
    match run(a).await {
        Err(BenchError::AllFailed { errors, last }) => {
            assert_eq!(errors, u64::from(MAX_CONSECUTIVE_FAILURES));
            assert!(last.contains("535"), "{last}");
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn progress_templates_parse() {
    assert!(ProgressStyle::with_template(BAR_TEMPLATE).is_ok());
    assert!(ProgressStyle::with_template(SPINNER_TEMPLATE).is_ok());
}

#[tokio::test]
async fn invalid_args() {
    let addr: SocketAddr = "127.0.0.1:1".parse().expect("addr");
    let mut a = args(addr, 1, 1);
    a.repeat = 1.5;
    assert!(matches!(run(a).await, Err(BenchError::InvalidArgs(_))));
    let mut a = args(addr, 1, 1);
    a.starttls = true;
    a.implicit_tls = true;
    assert!(matches!(run(a).await, Err(BenchError::InvalidArgs(_))));
    let mut a = args(addr, 1, 1);
    a.key_prefix = Some("bad key".into());
    assert!(matches!(run(a).await, Err(BenchError::InvalidArgs(_))));
    let mut a = args(addr, 1, 1);
    a.server = "nohost".into();
    assert!(matches!(run(a).await, Err(BenchError::InvalidArgs(_))));
}

/// Manual throughput smoke test (client and toy server share the CPU):
/// `cargo test --release throughput -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn throughput_smoke() {
    let server = TestServer::start(ServerOpts {
        pipelining: true,
        ..Default::default()
    })
    .await;
    let report = run(args(server.addr, 8, 50_000)).await.expect("run");
    report.print_human();
    assert_eq!(report.replies.get("250"), Some(&50_000));
}
