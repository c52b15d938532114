//! [`DnsClient`] against hostile DNS servers. Each test starts its own fake
//! server on 127.0.0.1 (UDP, and TCP on the same port when it needs one),
//! counts the queries it sees, and bounds every lookup by [`NEVER`]: a
//! lookup that hangs fails the test instead of hanging it.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, CNAME, MX, SOA};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};

use super::{Answer, DnsClient, DnsError, MAX_CNAME_HOPS};

/// Per try of one server: a lookup that gets nothing takes 2 × this.
const TRY: Duration = Duration::from_millis(300);
/// Longer than any lookup may take: reaching it is a hang.
const NEVER: Duration = Duration::from_secs(10);

/// The datagrams to send back for the `n`th (from 1) UDP query.
type UdpFn = Arc<dyn Fn(&Message, usize) -> Vec<Vec<u8>> + Send + Sync>;
/// The bytes to write back for the `n`th (from 1) TCP query.
type TcpFn = Arc<dyn Fn(&Message, usize) -> Tcp + Send + Sync>;

/// What the fake server writes on a TCP connection.
struct Tcp {
    bytes: Vec<u8>,
    /// Keep the connection open afterwards (until the client drops it), so
    /// that a short write is a stall and not an early end of stream.
    hold: bool,
}

struct Server {
    addr: SocketAddr,
    udp: Arc<AtomicUsize>,
    tcp: Arc<AtomicUsize>,
}

impl Server {
    fn udp_queries(&self) -> usize {
        self.udp.load(Ordering::SeqCst)
    }

    fn tcp_queries(&self) -> usize {
        self.tcp.load(Ordering::SeqCst)
    }

    fn client(&self) -> DnsClient {
        DnsClient::new(vec![self.addr], TRY).unwrap()
    }
}

async fn serve_udp(
    udp: impl Fn(&Message, usize) -> Vec<Vec<u8>> + Send + Sync + 'static,
) -> Server {
    start(IpAddr::from([127, 0, 0, 1]), Arc::new(udp), None).await
}

async fn serve_both(
    udp: impl Fn(&Message, usize) -> Vec<Vec<u8>> + Send + Sync + 'static,
    tcp: impl Fn(&Message, usize) -> Tcp + Send + Sync + 'static,
) -> Server {
    start(
        IpAddr::from([127, 0, 0, 1]),
        Arc::new(udp),
        Some(Arc::new(tcp)),
    )
    .await
}

async fn start(ip: IpAddr, udp: UdpFn, tcp: Option<TcpFn>) -> Server {
    // The client retries over TCP on the UDP port: find one free for both.
    let (socket, listener) = loop {
        let socket = UdpSocket::bind((ip, 0)).await.unwrap();
        if tcp.is_none() {
            break (socket, None);
        }
        let port = socket.local_addr().unwrap().port();
        if let Ok(listener) = TcpListener::bind((ip, port)).await {
            break (socket, Some(listener));
        }
    };
    let addr = socket.local_addr().unwrap();
    let udp_count = Arc::new(AtomicUsize::new(0));
    let tcp_count = Arc::new(AtomicUsize::new(0));
    let count = udp_count.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_535];
        loop {
            let Ok((n, peer)) = socket.recv_from(&mut buf).await else {
                return;
            };
            let Ok(query) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let n = count.fetch_add(1, Ordering::SeqCst) + 1;
            for datagram in udp(&query, n) {
                let _ = socket.send_to(&datagram, peer).await;
            }
        }
    });
    if let (Some(listener), Some(tcp)) = (listener, tcp) {
        let count = tcp_count.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let (tcp, count) = (tcp.clone(), count.clone());
                tokio::spawn(async move {
                    let Ok(len) = stream.read_u16().await else {
                        return;
                    };
                    let mut body = vec![0u8; usize::from(len)];
                    if stream.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    let Ok(query) = Message::from_vec(&body) else {
                        return;
                    };
                    let n = count.fetch_add(1, Ordering::SeqCst) + 1;
                    let reply = tcp(&query, n);
                    let _ = stream.write_all(&reply.bytes).await;
                    let _ = stream.flush().await;
                    if reply.hold {
                        let mut rest = [0u8; 512];
                        while matches!(stream.read(&mut rest).await, Ok(n) if n > 0) {}
                    }
                });
            }
        });
    }
    Server {
        addr,
        udp: udp_count,
        tcp: tcp_count,
    }
}

fn name(s: &str) -> Name {
    let mut n = Name::from_ascii(s).unwrap();
    n.set_fqdn(true);
    n
}

/// The question of a query.
fn qname(q: &Message) -> Name {
    q.queries.first().unwrap().name().clone()
}

/// A NOERROR response to `q`, echoing its id and question, no records.
fn reply(q: &Message) -> Message {
    let mut m = Message::response(q.metadata.id, q.metadata.op_code);
    m.metadata.recursion_desired = q.metadata.recursion_desired;
    m.metadata.recursion_available = true;
    m.add_queries(q.queries.clone());
    m
}

fn mx(owner: &Name, preference: u16, exchange: &str) -> Record {
    Record::from_rdata(
        owner.clone(),
        300,
        RData::MX(MX::new(preference, name(exchange))),
    )
}

fn cname(owner: &str, target: &str) -> Record {
    Record::from_rdata(name(owner), 300, RData::CNAME(CNAME(name(target))))
}

/// `q` answered with `records`.
fn answer(q: &Message, records: Vec<Record>) -> Message {
    let mut m = reply(q);
    m.add_answers(records);
    m
}

fn bytes(m: &Message) -> Vec<u8> {
    m.to_vec().unwrap()
}

/// One DNS message over TCP: a two-byte length, then the message.
fn framed(m: &Message) -> Vec<u8> {
    let body = bytes(m);
    let mut out = u16::try_from(body.len()).unwrap().to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

/// The MX exchanges of an answer, in order.
fn exchanges(a: &Answer) -> Vec<String> {
    a.records
        .iter()
        .map(|r| match r {
            RData::MX(mx) => mx.exchange.to_string(),
            other => panic!("not an MX record: {other:?}"),
        })
        .collect()
}

async fn lookup(client: &DnsClient, n: &str, rtype: RecordType) -> Result<Answer, DnsError> {
    tokio::time::timeout(NEVER, client.lookup(n, rtype))
        .await
        .expect("the lookup hung")
}

/// A lookup that must fail: its error's text.
async fn failure(client: &DnsClient, n: &str) -> String {
    match lookup(client, n, RecordType::MX).await {
        Ok(a) => panic!("{n}: accepted {a:?}"),
        Err(e) => e.to_string(),
    }
}

fn assert_timed_out(err: &str) {
    assert!(
        err.contains("no answer from") && err.contains("in time"),
        "{err}"
    );
}

// 1. A normal answer, with and without AD.

#[tokio::test]
async fn answer_with_ad_from_loopback_is_secure() {
    let server = serve_udp(|q, _| {
        let owner = qname(q);
        let mut m = answer(
            q,
            vec![
                mx(&owner, 10, "mx1.example."),
                mx(&owner, 20, "mx2.example."),
            ],
        );
        m.metadata.authentic_data = true;
        vec![bytes(&m)]
    })
    .await;
    let a = lookup(&server.client(), "example.", RecordType::MX)
        .await
        .unwrap();
    assert_eq!(exchanges(&a), ["mx1.example.", "mx2.example."]);
    assert!(matches!(a.records.first(), Some(RData::MX(m)) if m.preference == 10));
    assert!(a.secure, "AD from a loopback server is trusted");
    assert!(!a.no_domain);
    assert_eq!(server.udp_queries(), 1);
}

#[tokio::test]
async fn answer_without_ad_is_not_secure() {
    let server = serve_udp(|q, _| {
        let owner = qname(q);
        vec![bytes(&answer(q, vec![mx(&owner, 10, "mx1.example.")]))]
    })
    .await;
    let a = lookup(&server.client(), "example", RecordType::MX)
        .await
        .unwrap();
    assert_eq!(exchanges(&a), ["mx1.example."]);
    assert!(!a.secure);
}

#[tokio::test]
async fn secure_needs_ad_on_every_answer_of_a_chain() {
    // a's answer (a CNAME b) carries AD, b's answer (the MX) does not.
    let server = serve_udp(|q, _| {
        let m = if qname(q) == name("a.example.") {
            let mut m = answer(q, vec![cname("a.example.", "b.example.")]);
            m.metadata.authentic_data = true;
            m
        } else {
            answer(q, vec![mx(&qname(q), 10, "mx.example.")])
        };
        vec![bytes(&m)]
    })
    .await;
    let a = lookup(&server.client(), "a.example.", RecordType::MX)
        .await
        .unwrap();
    assert_eq!(exchanges(&a), ["mx.example."]);
    assert!(!a.secure);
    assert_eq!(server.udp_queries(), 2);
}

/// AD is trusted from loopback only. Needs a local address that is not
/// loopback (the route to a documentation address); skipped without one.
#[tokio::test]
async fn ad_from_a_server_off_loopback_is_not_trusted() {
    let probe = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    let ip = ["192.0.2.1:53", "8.8.8.8:53"].iter().find_map(|to| {
        probe.connect(to).ok()?;
        Some(probe.local_addr().ok()?.ip()).filter(|ip| !ip.is_loopback() && !ip.is_unspecified())
    });
    let Some(ip) = ip else {
        eprintln!("no local address off loopback: skipped");
        return;
    };
    let udp: UdpFn = Arc::new(|q, _| {
        let mut m = answer(q, vec![mx(&qname(q), 10, "mx.example.")]);
        m.metadata.authentic_data = true;
        vec![bytes(&m)]
    });
    let server = start(ip, udp, None).await;
    let a = lookup(&server.client(), "example.", RecordType::MX)
        .await
        .unwrap();
    assert_eq!(exchanges(&a), ["mx.example."]);
    assert!(!a.secure, "AD from {ip} must not be trusted");
}

// 2. The wrong message id, or the wrong source.

#[tokio::test]
async fn wrong_id_then_silence_is_a_timeout() {
    let server = serve_udp(|q, n| {
        if n > 1 {
            return vec![];
        }
        let mut m = answer(q, vec![mx(&qname(q), 10, "evil.example.")]);
        m.metadata.id = q.metadata.id.wrapping_add(1);
        vec![bytes(&m)]
    })
    .await;
    let err = failure(&server.client(), "example.").await;
    assert_timed_out(&err);
    // Both rounds asked, neither took the forged answer.
    assert_eq!(server.udp_queries(), 2);
}

#[tokio::test]
async fn wrong_id_is_skipped_for_the_real_answer() {
    let server = serve_udp(|q, _| {
        let mut forged = answer(q, vec![mx(&qname(q), 10, "evil.example.")]);
        forged.metadata.id ^= 0x8000;
        let real = answer(q, vec![mx(&qname(q), 10, "mx.example.")]);
        vec![bytes(&forged), bytes(&real)]
    })
    .await;
    let a = lookup(&server.client(), "example.", RecordType::MX)
        .await
        .unwrap();
    assert_eq!(exchanges(&a), ["mx.example."]);
    assert_eq!(server.udp_queries(), 1);
}

#[tokio::test]
async fn answer_from_another_port_is_ignored() {
    // The forger knows the id and the question, but sends from another
    // port than the server's: the connected socket drops it.
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let forger = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        while let Ok((n, peer)) = socket.recv_from(&mut buf).await {
            let Ok(q) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let forged = answer(&q, vec![mx(&qname(&q), 10, "evil.example.")]);
            let _ = forger.send_to(&bytes(&forged), peer).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            let real = answer(&q, vec![mx(&qname(&q), 10, "mx.example.")]);
            let _ = socket.send_to(&bytes(&real), peer).await;
        }
    });
    let client = DnsClient::new(vec![addr], TRY).unwrap();
    let a = lookup(&client, "example.", RecordType::MX).await.unwrap();
    assert_eq!(exchanges(&a), ["mx.example."]);
}

// 3. An answer to another question.

#[tokio::test]
async fn answers_to_other_questions_are_ignored() {
    type Forge = fn(&Message) -> Message;
    let forgeries: [(&str, Forge); 5] = [
        ("another name", |q| {
            let mut m = answer(q, vec![mx(&name("other.example."), 10, "evil.example.")]);
            m.queries.clear();
            m.add_query(hickory_proto::op::Query::query(
                name("other.example."),
                RecordType::MX,
            ));
            m
        }),
        ("another type", |q| {
            let mut m = reply(q);
            m.queries.clear();
            m.add_query(hickory_proto::op::Query::query(qname(q), RecordType::A));
            m.add_answer(Record::from_rdata(
                qname(q),
                300,
                RData::A(A::new(192, 0, 2, 66)),
            ));
            m
        }),
        ("a query, not a response", |q| {
            let mut m = answer(q, vec![mx(&qname(q), 10, "evil.example.")]);
            m.metadata.message_type = MessageType::Query;
            m
        }),
        ("no question", |q| {
            let mut m = answer(q, vec![mx(&qname(q), 10, "evil.example.")]);
            m.queries.clear();
            m
        }),
        ("two questions", |q| {
            let mut m = answer(q, vec![mx(&qname(q), 10, "evil.example.")]);
            m.add_query(hickory_proto::op::Query::query(
                name("other.example."),
                RecordType::MX,
            ));
            m
        }),
    ];
    for (what, forge) in forgeries {
        let server = serve_udp(move |q, _| vec![bytes(&forge(q))]).await;
        let err = failure(&server.client(), "example.").await;
        assert_timed_out(&err);
        assert_eq!(server.udp_queries(), 2, "{what}");
    }
}

// 4. Garbage.

/// Datagrams that are not an answer to anything, some with the right id.
fn garbage(q: &Message) -> Vec<Vec<u8>> {
    let id = q.metadata.id.to_be_bytes();
    let real = bytes(&answer(q, vec![mx(&qname(q), 10, "evil.example.")]));
    vec![
        b"this is not a DNS message at all".to_vec(),
        vec![],
        vec![0xff],
        vec![0xff; 12],
        // The right id, QR, one question and 65535 answers: then nothing.
        vec![id[0], id[1], 0x81, 0x80, 0, 1, 0xff, 0xff, 0, 0, 0, 0],
        // The real answer, cut short.
        real.get(..real.len() - 5).unwrap().to_vec(),
        // A name that points at itself.
        vec![
            id[0], id[1], 0x81, 0x80, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 15, 0, 1,
        ],
        (0..=255u8).cycle().take(4000).collect(),
    ]
}

#[tokio::test]
async fn garbage_and_empty_datagrams_are_ignored() {
    let server = serve_udp(|q, _| garbage(q)).await;
    let err = failure(&server.client(), "example.").await;
    assert_timed_out(&err);
    assert_eq!(server.udp_queries(), 2);
}

#[tokio::test]
async fn garbage_before_the_answer_does_not_abort_the_wait() {
    let server = serve_udp(|q, _| {
        let mut out = garbage(q);
        out.push(bytes(&answer(q, vec![mx(&qname(q), 10, "mx.example.")])));
        out
    })
    .await;
    let a = lookup(&server.client(), "example.", RecordType::MX)
        .await
        .unwrap();
    assert_eq!(exchanges(&a), ["mx.example."]);
    assert_eq!(server.udp_queries(), 1);
}

// 5. and 6. Truncation, and TCP.

/// `q` answered with one record and TC set, as a UDP server does when the
/// whole answer does not fit.
fn truncated(q: &Message) -> Vec<Vec<u8>> {
    let mut m = answer(q, vec![mx(&qname(q), 10, "udp.example.")]);
    m.metadata.truncation = true;
    vec![bytes(&m)]
}

#[tokio::test]
async fn truncated_udp_answer_is_asked_again_over_tcp() {
    let server = serve_both(
        |q, _| truncated(q),
        |q, _| {
            let owner = qname(q);
            let mut m = answer(
                q,
                (1..=3)
                    .map(|i| mx(&owner, i, &format!("tcp{i}.example.")))
                    .collect(),
            );
            m.metadata.authentic_data = true;
            Tcp {
                bytes: framed(&m),
                hold: false,
            }
        },
    )
    .await;
    let a = lookup(&server.client(), "example.", RecordType::MX)
        .await
        .unwrap();
    assert_eq!(
        exchanges(&a),
        ["tcp1.example.", "tcp2.example.", "tcp3.example."]
    );
    assert!(a.secure, "the AD bit of the TCP answer");
    assert_eq!((server.udp_queries(), server.tcp_queries()), (1, 1));
}

#[tokio::test]
async fn tcp_length_without_the_message_is_bounded_by_the_timeout() {
    let server = serve_both(
        |q, _| truncated(q),
        |_, _| Tcp {
            // 65535 bytes announced, 3 sent, then nothing.
            bytes: vec![0xff, 0xff, 1, 2, 3],
            hold: true,
        },
    )
    .await;
    let started = Instant::now();
    let err = failure(&server.client(), "example.").await;
    assert_timed_out(&err);
    assert!(started.elapsed() < 3 * 2 * TRY, "{:?}", started.elapsed());
    assert_eq!((server.udp_queries(), server.tcp_queries()), (2, 2));
}

#[tokio::test]
async fn tcp_answer_cut_short_is_an_error() {
    let server = serve_both(
        |q, _| truncated(q),
        |_, _| Tcp {
            bytes: vec![0xff, 0xff, 1, 2, 3],
            hold: false,
        },
    )
    .await;
    let err = failure(&server.client(), "example.").await;
    assert!(err.contains("eof"), "{err}");
    assert_eq!(server.tcp_queries(), 2);
}

#[tokio::test]
async fn tcp_garbage_is_an_error() {
    let server = serve_both(
        |q, _| truncated(q),
        |_, _| Tcp {
            bytes: [&[0, 20][..], &[0xff; 20]].concat(),
            hold: true,
        },
    )
    .await;
    let err = failure(&server.client(), "example.").await;
    assert!(err.contains("unreadable answer"), "{err}");
}

#[tokio::test]
async fn tcp_answer_to_another_question_is_an_error() {
    let server = serve_both(
        |q, _| truncated(q),
        |q, _| {
            let mut m = answer(q, vec![mx(&qname(q), 10, "evil.example.")]);
            m.metadata.id = q.metadata.id.wrapping_add(1);
            Tcp {
                bytes: framed(&m),
                hold: true,
            }
        },
    )
    .await;
    let err = failure(&server.client(), "example.").await;
    assert!(err.contains("another question"), "{err}");
}

#[tokio::test]
async fn truncated_answer_without_tcp_is_an_error() {
    // Nothing listens on the TCP port: refused, not accepted truncated.
    let server = serve_udp(|q, _| truncated(q)).await;
    let err = failure(&server.client(), "example.").await;
    assert!(err.contains(&server.addr.to_string()), "{err}");
    assert!(!err.contains("in time"), "refused, not timed out: {err}");
    assert_eq!(server.udp_queries(), 2);
}

// 7. CNAME loops and long chains.

fn assert_cname_error(err: &str) {
    assert!(
        err.contains(&format!(
            "CNAME chain loops or is longer than {MAX_CNAME_HOPS}"
        )),
        "{err}"
    );
}

#[tokio::test]
async fn cname_loop_in_one_answer_is_an_error() {
    let server = serve_udp(|q, _| {
        vec![bytes(&answer(
            q,
            vec![
                cname("a.example.", "b.example."),
                cname("b.example.", "a.example."),
            ],
        ))]
    })
    .await;
    let err = failure(&server.client(), "a.example.").await;
    assert_cname_error(&err);
    assert!(err.contains("a.example."), "{err}");
    assert_eq!(server.udp_queries(), 1);
}

#[tokio::test]
async fn cname_loop_off_the_start_in_one_answer_is_an_error() {
    // a -> b -> c -> b: the loop does not come back to the name asked.
    let server = serve_udp(|q, _| {
        vec![bytes(&answer(
            q,
            vec![
                cname("a.example.", "b.example."),
                cname("b.example.", "c.example."),
                cname("c.example.", "b.example."),
            ],
        ))]
    })
    .await;
    let err = failure(&server.client(), "a.example.").await;
    assert_cname_error(&err);
    assert_eq!(server.udp_queries(), 1);
}

/// One answer with a chain of `hops` CNAMEs from h0 and the MX at its end.
fn chain_in_one_answer(q: &Message, hops: usize) -> Message {
    let mut records: Vec<Record> = (0..hops)
        .map(|i| cname(&format!("h{i}.example."), &format!("h{}.example.", i + 1)))
        .collect();
    records.push(mx(&name(&format!("h{hops}.example.")), 10, "mx.example."));
    answer(q, records)
}

#[tokio::test]
async fn cname_chain_in_one_answer_is_followed_up_to_the_limit() {
    let server = serve_udp(|q, _| vec![bytes(&chain_in_one_answer(q, MAX_CNAME_HOPS))]).await;
    let a = lookup(&server.client(), "h0.example.", RecordType::MX)
        .await
        .unwrap();
    assert_eq!(exchanges(&a), ["mx.example."]);
    assert_eq!(server.udp_queries(), 1);

    let server = serve_udp(|q, _| vec![bytes(&chain_in_one_answer(q, MAX_CNAME_HOPS + 1))]).await;
    assert_cname_error(&failure(&server.client(), "h0.example.").await);
    assert_eq!(server.udp_queries(), 1);
}

#[tokio::test]
async fn cname_loop_across_answers_is_an_error() {
    // a.example. CNAME b.example. in one answer, b CNAME a in the next.
    let server = serve_udp(|q, _| {
        let target = if qname(q) == name("a.example.") {
            "b.example."
        } else {
            "a.example."
        };
        vec![bytes(&answer(
            q,
            vec![cname(&qname(q).to_string(), target)],
        ))]
    })
    .await;
    let err = failure(&server.client(), "a.example.").await;
    assert_cname_error(&err);
    assert_eq!(server.udp_queries(), 2);
}

/// hN CNAME h(N+1) for every N below `end`, and the MX at h`end`: one
/// answer per query, so the client must ask for each next name.
fn chain_across_answers(q: &Message, end: usize) -> Vec<Vec<u8>> {
    let asked = qname(q).to_string();
    let i: usize = asked
        .strip_prefix('h')
        .and_then(|s| s.strip_suffix(".example."))
        .and_then(|s| s.parse().ok())
        .unwrap();
    let m = if i < end {
        answer(q, vec![cname(&asked, &format!("h{}.example.", i + 1))])
    } else {
        answer(q, vec![mx(&qname(q), 10, "mx.example.")])
    };
    vec![bytes(&m)]
}

#[tokio::test]
async fn cname_chain_across_answers_is_followed_up_to_the_limit() {
    let server = serve_udp(|q, _| chain_across_answers(q, MAX_CNAME_HOPS)).await;
    let a = lookup(&server.client(), "h0.example.", RecordType::MX)
        .await
        .unwrap();
    assert_eq!(exchanges(&a), ["mx.example."]);
    assert_eq!(server.udp_queries(), MAX_CNAME_HOPS + 1);
}

#[tokio::test]
async fn endless_cname_chain_across_answers_is_an_error_after_a_few_queries() {
    let server = serve_udp(|q, _| chain_across_answers(q, usize::MAX)).await;
    let err = failure(&server.client(), "h0.example.").await;
    assert_cname_error(&err);
    let asked = server.udp_queries();
    assert!(asked <= MAX_CNAME_HOPS + 2, "{asked} queries");
    assert_eq!(asked, MAX_CNAME_HOPS + 1);
}

#[tokio::test]
async fn long_chains_in_each_of_many_answers_stay_bounded() {
    // Every answer carries MAX_CNAME_HOPS CNAMEs and ends at a new name:
    // the queries are still bounded by the number of answers followed.
    let server = serve_udp(|q, _| {
        let asked = qname(q).to_string();
        let records = (0..MAX_CNAME_HOPS)
            .map(|i| {
                let from = if i == 0 {
                    asked.clone()
                } else {
                    format!("x{i}.{asked}")
                };
                cname(&from, &format!("x{}.{asked}", i + 1))
            })
            .collect();
        vec![bytes(&answer(q, records))]
    })
    .await;
    let err = failure(&server.client(), "example.").await;
    assert_cname_error(&err);
    assert_eq!(server.udp_queries(), MAX_CNAME_HOPS + 1);
}

// 8. A huge answer.

/// `q` answered with `count` MX records. They share one exchange name, so
/// that every name compresses to a pointer (under 16 bytes a record): 2000
/// distinct names would not fit the 64 KiB of a message, and hickory's
/// encoder would silently drop the records past that.
fn many_mx(q: &Message, count: u16) -> Message {
    let owner = qname(q);
    let m = answer(
        q,
        (0..count).map(|i| mx(&owner, i, "mx.example.")).collect(),
    );
    let sent = Message::from_vec(&bytes(&m)).unwrap();
    assert_eq!(
        sent.answers.len(),
        usize::from(count),
        "the fake server's message"
    );
    m
}

/// The preferences of an answer's MX records, in order.
fn preferences(a: &Answer) -> Vec<u16> {
    a.records
        .iter()
        .map(|r| match r {
            RData::MX(mx) => mx.preference,
            other => panic!("not an MX record: {other:?}"),
        })
        .collect()
}

#[tokio::test]
async fn two_thousand_mx_over_tcp_are_all_returned() {
    let server = serve_both(
        |q, _| truncated(q),
        |q, _| Tcp {
            bytes: framed(&many_mx(q, 2000)),
            hold: false,
        },
    )
    .await;
    let a = lookup(&server.client(), "example.", RecordType::MX)
        .await
        .unwrap();
    // No cap here: resolver.rs caps what it keeps (TLSA); MX are all kept.
    assert_eq!(preferences(&a), (0..2000).collect::<Vec<u16>>());
    assert_eq!((server.udp_queries(), server.tcp_queries()), (1, 1));
}

#[tokio::test]
async fn two_thousand_mx_in_one_datagram_are_all_returned() {
    // A server that ignores the EDNS size we advertise: about 32 KB in one
    // datagram, which fits the client's 64 KiB buffer on loopback.
    let server = serve_udp(|q, _| vec![bytes(&many_mx(q, 2000))]).await;
    let a = lookup(&server.client(), "example.", RecordType::MX)
        .await
        .unwrap();
    assert_eq!(a.records.len(), 2000);
    assert_eq!(server.udp_queries(), 1);
}

// 9. Response codes.

#[tokio::test]
async fn servfail_and_refused_are_errors_naming_the_code() {
    for (code, text) in [
        (ResponseCode::ServFail, "Server Failure"),
        (ResponseCode::Refused, "Query Refused"),
        (ResponseCode::FormErr, "Form Error"),
    ] {
        let server = serve_udp(move |q, _| {
            let mut m = reply(q);
            m.metadata.response_code = code;
            vec![bytes(&m)]
        })
        .await;
        let client = server.client();
        let err = failure(&client, "example.").await;
        assert!(err.contains(text), "{err}");
        assert!(err.contains(&server.addr.to_string()), "{err}");
        assert_eq!(server.udp_queries(), 2, "{code}: both rounds");
        // A failure is not cached: the next lookup asks again.
        failure(&client, "example.").await;
        assert_eq!(server.udp_queries(), 4, "{code}");
    }
}

#[tokio::test]
async fn servfail_falls_back_to_the_next_server_at_once() {
    let failing = serve_udp(|q, _| {
        let mut m = reply(q);
        m.metadata.response_code = ResponseCode::ServFail;
        vec![bytes(&m)]
    })
    .await;
    let working =
        serve_udp(|q, _| vec![bytes(&answer(q, vec![mx(&qname(q), 10, "mx.example.")]))]).await;
    let client = DnsClient::new(vec![failing.addr, working.addr], TRY).unwrap();
    let started = Instant::now();
    let a = lookup(&client, "example.", RecordType::MX).await.unwrap();
    assert_eq!(exchanges(&a), ["mx.example."]);
    assert_eq!((failing.udp_queries(), working.udp_queries()), (1, 1));
    // On the SERVFAIL itself, not after waiting out the first server.
    assert!(started.elapsed() < TRY, "{:?}", started.elapsed());
}

#[tokio::test]
async fn servfail_without_the_question_is_ignored_like_any_stray_datagram() {
    // What Message::error_msg builds: the right id, no question. It cannot
    // be told from a forgery, so the client waits the try out instead.
    let failing = serve_udp(|q, _| {
        vec![bytes(&Message::error_msg(
            q.metadata.id,
            OpCode::Query,
            ResponseCode::ServFail,
        ))]
    })
    .await;
    let err = failure(&failing.client(), "example.").await;
    assert_timed_out(&err);
    assert_eq!(failing.udp_queries(), 2);
}

#[tokio::test]
async fn nxdomain_is_an_answer() {
    let server = serve_udp(|q, _| {
        let mut m = reply(q);
        m.metadata.response_code = ResponseCode::NXDomain;
        vec![bytes(&m)]
    })
    .await;
    let a = lookup(&server.client(), "nowhere.example.", RecordType::MX)
        .await
        .unwrap();
    assert!(a.no_domain);
    assert!(a.records.is_empty());
    assert_eq!(server.udp_queries(), 1);
}

#[tokio::test]
async fn no_records_is_an_empty_answer() {
    let server = serve_udp(|q, _| vec![bytes(&reply(q))]).await;
    let a = lookup(&server.client(), "example.", RecordType::MX)
        .await
        .unwrap();
    assert!(!a.no_domain);
    assert!(a.records.is_empty());
}

// 10. The cache.

#[tokio::test]
async fn second_lookup_within_the_ttl_is_from_the_cache() {
    let server =
        serve_udp(|q, _| vec![bytes(&answer(q, vec![mx(&qname(q), 10, "mx.example.")]))]).await;
    let client = server.client();
    let first = lookup(&client, "example.", RecordType::MX).await.unwrap();
    let second = lookup(&client, "EXAMPLE", RecordType::MX).await.unwrap();
    assert_eq!(first, second);
    assert_eq!(server.udp_queries(), 1);
    // Another type is another question.
    lookup(&client, "example.", RecordType::A).await.unwrap();
    assert_eq!(server.udp_queries(), 2);
}

#[tokio::test]
async fn ttl_zero_is_not_cached() {
    let server = serve_udp(|q, _| {
        let mut record = mx(&qname(q), 10, "mx.example.");
        record.ttl = 0;
        vec![bytes(&answer(q, vec![record]))]
    })
    .await;
    let client = server.client();
    lookup(&client, "example.", RecordType::MX).await.unwrap();
    lookup(&client, "example.", RecordType::MX).await.unwrap();
    assert_eq!(server.udp_queries(), 2);
}

#[tokio::test]
async fn negative_answers_are_cached_for_the_soa_minimum() {
    let server = serve_udp(|q, _| {
        let mut m = reply(q);
        m.metadata.response_code = ResponseCode::NXDomain;
        let soa = SOA::new(
            name("ns.example."),
            name("hostmaster.example."),
            1,
            3600,
            600,
            86_400,
            300,
        );
        m.add_authority(Record::from_rdata(name("example."), 300, RData::SOA(soa)));
        vec![bytes(&m)]
    })
    .await;
    let client = server.client();
    assert!(
        lookup(&client, "nowhere.example.", RecordType::MX)
            .await
            .unwrap()
            .no_domain
    );
    assert!(
        lookup(&client, "nowhere.example.", RecordType::MX)
            .await
            .unwrap()
            .no_domain
    );
    assert_eq!(server.udp_queries(), 1);
}

#[tokio::test]
async fn a_cname_is_not_kept_past_its_ttl() {
    // a CNAME b with TTL 0, and b's MX (TTL 300) in its own answer: the
    // second lookup asks for a again (b's MX comes from the cache).
    let server = serve_udp(|q, _| {
        let m = if qname(q) == name("a.example.") {
            let mut record = cname("a.example.", "b.example.");
            record.ttl = 0;
            answer(q, vec![record])
        } else {
            answer(q, vec![mx(&qname(q), 10, "mx.example.")])
        };
        vec![bytes(&m)]
    })
    .await;
    let client = server.client();
    for _ in 0..2 {
        let a = lookup(&client, "a.example.", RecordType::MX).await.unwrap();
        assert_eq!(exchanges(&a), ["mx.example."]);
    }
    assert_eq!(server.udp_queries(), 3);
}

#[tokio::test]
async fn records_for_other_names_are_neither_returned_nor_cached() {
    // a's answer also carries an MX for b: a is answered with its own
    // records only, and b is still asked for.
    let server = serve_udp(|q, _| {
        let mut records = vec![mx(&qname(q), 10, &format!("mx.{}", qname(q)))];
        if qname(q) == name("a.example.") {
            records.push(mx(&name("b.example."), 10, "evil.example."));
        }
        vec![bytes(&answer(q, records))]
    })
    .await;
    let client = server.client();
    let a = lookup(&client, "a.example.", RecordType::MX).await.unwrap();
    assert_eq!(exchanges(&a), ["mx.a.example."]);
    let b = lookup(&client, "b.example.", RecordType::MX).await.unwrap();
    assert_eq!(exchanges(&b), ["mx.b.example."]);
    assert_eq!(server.udp_queries(), 2);
}

// The rest.

#[test]
fn no_server_is_an_error() {
    assert!(DnsClient::new(vec![], TRY).is_err());
}

#[tokio::test]
async fn a_bad_name_is_an_error_without_a_query() {
    let server = serve_udp(|q, _| vec![bytes(&reply(q))]).await;
    let label = "x".repeat(64);
    let err = lookup(&server.client(), &label, RecordType::MX)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("bad name"), "{err}");
    assert_eq!(server.udp_queries(), 0);
}
