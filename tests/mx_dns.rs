//! `mode = "mx"` against a real DNS: Knot serving signed and unsigned test
//! zones, Unbound validating them (`common/dns_rig.rs`), and MX hosts that
//! are real SMTP servers on 127.0.x.y (`common/mx_host.rs`), some with TLS
//! certificates from a test CA. Every MX rule of `docs/delivery.md`, DANE
//! (DANE-EE, DANE-TA, bogus and insecure answers), the per-domain TLS
//! policy, and mail that would loop back to the relay itself.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

mod common;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use common::dns_rig::{DnsRig, Signing, Zone};
use common::mx_host::{Behaviour, MxHost, TestCa};
use common::{Client, Daemon, Options, Store, message, wait_until};

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

fn at(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse::<IpAddr>().expect("ip"), port)
}

/// A daemon in `mx` mode asking `rig`, MX hosts on `port`, its plaintext
/// listener on 127.0.0.1:`port` (so an MX that is 127.0.0.1 is itself).
fn relay(rig: &DnsRig, port: u16, extra: &str) -> Daemon {
    Daemon::start(Options {
        store: Store::Sqlite,
        plain_addr: Some(format!("127.0.0.1:{port}")),
        relay: Some(format!(
            "[relay]\nmode = \"mx\"\nmx_port = {port}\ndns_servers = [\"{}\"]\n\
             retry_schedule = [\"300ms\"]\npoll_interval = \"50ms\"\ntimeout = \"4s\"\nlease = \"1m\"\n{extra}",
            rig.resolver
        )),
        ..Options::default()
    })
}

async fn send(d: &Daemon, rcpt: &str) -> String {
    let mut c = Client::login(d.plain, "bob").await;
    let r = c
        .submit("bob@example.test", &[rcpt], &message(None, rcpt))
        .await;
    assert_eq!(r.code, 250, "{r:?}");
    c.quit().await;
    r.queue_id().expect("queue id")
}

/// The message's state once its first attempt is recorded, and that
/// attempt's reply and next hop.
async fn first_attempt(d: &Daemon, id: &str) -> (String, String, String) {
    wait_until(&format!("an attempt of {id}"), 30, || {
        d.db()
            .query_row(
                "SELECT q.state, a.reply, COALESCE(a.next_hop, '') FROM queue q
                 JOIN delivery_attempt a ON a.queue_id = q.id
                 WHERE q.id = ?1 ORDER BY a.id LIMIT 1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .ok()
    })
    .await
}

/// Waits for the first attempt; asserts its outcome and that its reply
/// (and hop) contain `needle`.
async fn expect(d: &Daemon, id: &str, state: &str, needle: &str) -> (String, String) {
    let (s, reply, hop) = first_attempt(d, id).await;
    // A deferred message may be mid-retry ("delivering"): never delivered.
    let s = if s == "delivering" {
        "deferred".into()
    } else {
        s
    };
    assert_eq!(s, state, "{id}: {reply} via {hop}\n{}", d.log());
    assert!(
        reply.contains(needle) || hop.contains(needle),
        "{id}: {needle:?} not in {reply:?} via {hop:?}"
    );
    (reply, hop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mx_rule_through_a_real_resolver() {
    let dir = tempfile::tempdir().unwrap();
    let rig = DnsRig::start(
        dir.path(),
        &[
            Zone::new(
                "rules.test",
                Signing::Insecure,
                &[
                    "pref MX 20 b.pref",
                    "pref MX 10 a.pref",
                    "a.pref A 127.0.1.1",
                    "b.pref A 127.0.1.2",
                    "eq MX 10 e1.eq",
                    "eq MX 10 e2.eq",
                    "e1.eq A 127.0.1.11",
                    "e2.eq A 127.0.1.12",
                    "implicit A 127.0.1.3",
                    "nullmx MX 0 .",
                    "alias CNAME pref",
                    "viacname MX 10 mxalias.viacname",
                    "mxalias.viacname CNAME a.pref",
                    "loop1 CNAME loop2",
                    "loop2 CNAME loop1",
                    "dual MX 10 host.dual",
                    "host.dual A 127.0.1.9",
                    "host.dual AAAA ::1",
                    "busy MX 10 m421.busy",
                    "busy MX 20 ok.busy",
                    "m421.busy A 127.0.1.4",
                    "ok.busy A 127.0.1.5",
                    "refused MX 10 dead.refused",
                    "refused MX 20 ok.refused",
                    "dead.refused A 127.0.1.6",
                    "ok.refused A 127.0.1.5",
                    "noaddr MX 10 ghost.noaddr",
                    "self MX 10 relay.self",
                    "relay.self A 127.0.0.1",
                    "backup MX 10 dead.backup",
                    "backup MX 20 relay.backup",
                    "dead.backup A 127.0.1.6",
                    "relay.backup A 127.0.0.1",
                ],
            ),
            Zone::new(
                "broken.test",
                Signing::Bogus,
                &["@ MX 10 mx", "mx A 127.0.1.1"],
            ),
        ],
    );
    let port = free_port();
    let a = MxHost::start(at("127.0.1.1", port), Behaviour::plain());
    let b = MxHost::start(at("127.0.1.2", port), Behaviour::plain());
    let e1 = MxHost::start(at("127.0.1.11", port), Behaviour::plain());
    let e2 = MxHost::start(at("127.0.1.12", port), Behaviour::plain());
    let implicit = MxHost::start(at("127.0.1.3", port), Behaviour::plain());
    let v6 = MxHost::start(at("::1", port), Behaviour::plain());
    let m421 = MxHost::start(
        at("127.0.1.4", port),
        Behaviour::greeting("421 4.3.2 too busy"),
    );
    let ok = MxHost::start(at("127.0.1.5", port), Behaviour::plain());
    let d = relay(&rig, port, "");

    // Preference order: the lowest first, the backup untouched.
    let id = send(&d, "u@pref.rules.test").await;
    expect(&d, &id, "delivered", "a.pref.rules.test [127.0.1.1").await;
    assert_eq!((a.received().len(), b.received().len()), (1, 0));

    // A CNAME in front of the domain, and an MX name that is a CNAME.
    for rcpt in ["u@alias.rules.test", "u@viacname.rules.test"] {
        let id = send(&d, rcpt).await;
        expect(&d, &id, "delivered", "[127.0.1.1").await;
    }
    assert_eq!(a.received().len(), 3);

    // Implicit MX: no MX records, the domain's own address.
    let id = send(&d, "u@implicit.rules.test").await;
    expect(&d, &id, "delivered", "[127.0.1.3").await;
    assert_eq!(implicit.received().len(), 1);

    // A and AAAA: the IPv4 address refuses, ::1 takes it.
    let id = send(&d, "u@dual.rules.test").await;
    expect(&d, &id, "delivered", "[[::1]").await;
    assert_eq!(v6.received().len(), 1);

    // A 421 greeting, and a refused connection: the next MX, same attempt.
    for rcpt in ["u@busy.rules.test", "u@refused.rules.test"] {
        let id = send(&d, rcpt).await;
        expect(&d, &id, "delivered", "[127.0.1.5").await;
        let attempts: i64 = d.count(&format!("SELECT attempts FROM queue WHERE id = '{id}'"));
        assert_eq!(attempts, 1, "{rcpt}: moved on within the first attempt");
    }
    assert_eq!(ok.received().len(), 2);
    assert!(m421.connections() >= 1 && m421.received().is_empty());

    // Permanent: null MX, no such domain, no address for any MX.
    let id = send(&d, "u@nullmx.rules.test").await;
    expect(&d, &id, "failed", "556 5.1.10").await;
    let id = send(&d, "u@nosuch.rules.test").await;
    expect(&d, &id, "failed", "550 5.1.2").await;
    let id = send(&d, "u@noaddr.rules.test").await;
    expect(&d, &id, "failed", "550 5.4.4").await;

    // Temporary: a bogus zone (SERVFAIL from the validator), a CNAME loop.
    let id = send(&d, "u@broken.test").await;
    expect(&d, &id, "deferred", "451 4.4.3").await;
    let id = send(&d, "u@loop1.rules.test").await;
    expect(&d, &id, "deferred", "451 4.4.3").await;

    // The relay as its own MX: bounced with 5.4.6, never "delivered";
    // as a backup MX behind a dead primary: deferred, never sent to.
    let id = send(&d, "u@self.rules.test").await;
    expect(&d, &id, "failed", "5.4.6").await;
    let id = send(&d, "u@backup.rules.test").await;
    expect(&d, &id, "deferred", "dead.backup.rules.test").await;
    for domain in ["self", "backup"] {
        let sql =
            format!("SELECT COUNT(*) FROM queue WHERE recipients LIKE '%@{domain}.rules.test%'");
        assert_eq!(d.count(&sql), 1, "the relay queued a copy to itself");
    }

    // Equal preferences: both hosts get mail, over 16 messages.
    for i in 0..16 {
        let id = send(&d, &format!("u{i}@eq.rules.test")).await;
        expect(&d, &id, "delivered", ".eq.rules.test").await;
    }
    let (n1, n2) = (e1.received().len(), e2.received().len());
    assert_eq!(n1 + n2, 16);
    assert!(
        n1 > 0 && n2 > 0,
        "equal preferences were not shuffled: {n1} / {n2}"
    );
    drop(rig);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dane_and_tls_policy_cannot_be_downgraded() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let ca = TestCa::new("smtp-once rig CA");
    let other_ca = TestCa::new("somebody else's CA");
    let ee = other_ca.issue(&["whatever.example"]); // DANE-EE ignores names
    let ta = ca.issue(&["mx-ta.secure.test"]);
    let ta_wrong_name = ca.issue(&["elsewhere.example"]);
    let impostor = other_ca.issue(&["mx-wrong.secure.test"]);
    let verified = ca.issue(&["mx-verify.open.test"]);
    let verified_wrong = ca.issue(&["not-this-one.example"]);
    let tlsa = |host: &str, rdata: &str| format!("_{port}._tcp.{host} TLSA {rdata}");
    let rig = DnsRig::start(
        dir.path(),
        &[
            Zone::new(
                "secure.test",
                Signing::Secure,
                &[
                    "ee MX 10 mx-ee",
                    "mx-ee A 127.0.2.1",
                    &tlsa("mx-ee", &ee.tlsa_ee_spki_sha256()),
                    "ee512 MX 10 mx-ee512",
                    "mx-ee512 A 127.0.2.1",
                    &tlsa("mx-ee512", &ee.tlsa_ee_cert_sha512()),
                    "ta MX 10 mx-ta",
                    "mx-ta A 127.0.2.2",
                    &tlsa("mx-ta", &ca.tlsa_ta_cert_sha256()),
                    "strip MX 10 mx-strip",
                    "mx-strip A 127.0.2.3",
                    &tlsa("mx-strip", &ee.tlsa_ee_spki_sha256()),
                    "wrong MX 10 mx-wrong",
                    "mx-wrong A 127.0.2.4",
                    &tlsa("mx-wrong", &ee.tlsa_ee_spki_sha256()),
                    "taname MX 10 mx-taname",
                    "mx-taname A 127.0.2.5",
                    &tlsa("mx-taname", &ca.tlsa_ta_cert_sha256()),
                    "bogus MX 10 mx-bogus",
                    "mx-bogus A 127.0.2.6",
                    "notlsa MX 10 mx-notlsa",
                    "mx-notlsa A 127.0.2.3",
                ],
            ),
            // Only the TLSA record is bogus: its own zone, a wrong anchor.
            Zone::new(
                &format!("_{port}._tcp.mx-bogus.secure.test"),
                Signing::Bogus,
                &[&format!("@ TLSA {}", ee.tlsa_ee_spki_sha256())],
            ),
            Zone::new(
                "open.test",
                Signing::Insecure,
                &[
                    // TLSA in an unsigned zone proves nothing: ignored.
                    "insecure MX 10 mx-insecure",
                    "mx-insecure A 127.0.2.3",
                    &tlsa("mx-insecure", &ee.tlsa_ee_spki_sha256()),
                    "verify MX 10 mx-verify",
                    "mx-verify A 127.0.2.7",
                    "verifybad MX 10 mx-verifybad",
                    "mx-verifybad A 127.0.2.8",
                    "encrypt MX 10 mx-encrypt",
                    "mx-encrypt A 127.0.2.3",
                    "daneonly MX 10 mx-daneonly",
                    "mx-daneonly A 127.0.2.1",
                    "none MX 10 mx-none",
                    "mx-none A 127.0.2.1",
                ],
            ),
        ],
    );
    let ee_host = MxHost::start(at("127.0.2.1", port), Behaviour::tls(&ee));
    let ta_host = MxHost::start(at("127.0.2.2", port), Behaviour::tls(&ta));
    // Offers no STARTTLS at all: an attacker stripped it from EHLO.
    let stripped = MxHost::start(at("127.0.2.3", port), Behaviour::plain());
    let wrong = MxHost::start(at("127.0.2.4", port), Behaviour::tls(&impostor));
    let taname = MxHost::start(at("127.0.2.5", port), Behaviour::tls(&ta_wrong_name));
    let bogus = MxHost::start(at("127.0.2.6", port), Behaviour::tls(&ee));
    let verify = MxHost::start(at("127.0.2.7", port), Behaviour::tls(&verified));
    let verifybad = MxHost::start(at("127.0.2.8", port), Behaviour::tls(&verified_wrong));
    let ca_file = ca.write(dir.path());
    let d = relay(
        &rig,
        port,
        &format!(
            "mx_ca_file = \"{}\"\ntls_policy = {{ \"verify.open.test\" = \"verify\", \
             \"verifybad.open.test\" = \"verify\", \"encrypt.open.test\" = \"encrypt\", \
             \"daneonly.open.test\" = \"dane-only\", \"none.open.test\" = \"none\" }}\n",
            ca_file.display()
        ),
    );

    // DANE-EE by key (SHA-256) and by certificate (SHA-512); DANE-TA.
    let id = send(&d, "u@ee.secure.test").await;
    expect(&d, &id, "delivered", "auth=dane-ee").await;
    let id = send(&d, "u@ee512.secure.test").await;
    expect(&d, &id, "delivered", "auth=dane-ee").await;
    assert!(ee_host.received().iter().all(|m| m.tls) && ee_host.received().len() == 2);
    let id = send(&d, "u@ta.secure.test").await;
    let (_, hop) = expect(&d, &id, "delivered", "auth=dane-ta").await;
    assert!(hop.contains("TLSv1_3") || hop.contains("TLSv1_2"), "{hop}");
    assert!(ta_host.received().iter().all(|m| m.tls) && ta_host.received().len() == 1);

    // The attacks: STARTTLS stripped, an impostor's certificate, a CA
    // certificate for another name, a bogus TLSA answer. Deferred with the
    // reason, and not one byte of any message reached those hosts.
    let id = send(&d, "u@strip.secure.test").await;
    expect(&d, &id, "deferred", "STARTTLS required").await;
    let id = send(&d, "u@wrong.secure.test").await;
    expect(&d, &id, "deferred", "TLS policy dane").await;
    let id = send(&d, "u@taname.secure.test").await;
    expect(&d, &id, "deferred", "TLS policy dane").await;
    let id = send(&d, "u@bogus.secure.test").await;
    expect(
        &d,
        &id,
        "deferred",
        "TLSA lookup for mx-bogus.secure.test failed",
    )
    .await;

    // Signed, but no TLSA for the host: opportunistic (plaintext here).
    let id = send(&d, "u@notlsa.secure.test").await;
    expect(&d, &id, "delivered", "plaintext").await;
    // Unsigned zone: its TLSA record is ignored, delivered in plaintext.
    let id = send(&d, "u@insecure.open.test").await;
    expect(&d, &id, "delivered", "plaintext").await;

    // Per-domain policy: verify, encrypt, dane-only, none.
    let id = send(&d, "u@verify.open.test").await;
    expect(&d, &id, "delivered", "auth=verified").await;
    assert_eq!(verify.received().len(), 1);
    let id = send(&d, "u@verifybad.open.test").await;
    expect(&d, &id, "deferred", "TLS policy verify").await;
    let id = send(&d, "u@encrypt.open.test").await;
    expect(&d, &id, "deferred", "STARTTLS required").await;
    let id = send(&d, "u@daneonly.open.test").await;
    expect(&d, &id, "deferred", "dane-only").await;
    let id = send(&d, "u@none.open.test").await;
    expect(&d, &id, "delivered", "plaintext").await;

    // Let the deferred ones retry a few times; still nothing arrives.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (name, host) in [
        ("wrong", &wrong),
        ("taname", &taname),
        ("bogus", &bogus),
        ("verifybad", &verifybad),
    ] {
        assert!(host.received().is_empty(), "{name} got mail over bad TLS");
    }
    // The stripped host got only what no policy protected: notlsa,
    // insecure; never strip's or encrypt's.
    let got: Vec<String> = stripped
        .received()
        .iter()
        .flat_map(|m| m.rcpts.clone())
        .collect();
    got.iter()
        .for_each(|r| assert!(!r.contains("strip.") && !r.contains("encrypt."), "{got:?}"));
    assert_eq!(got.len(), 2, "{got:?}");
    // mx-ee (none.open.test under `none`) took it in plaintext.
    assert!(
        ee_host
            .received()
            .iter()
            .any(|m| !m.tls && m.rcpts == ["u@none.open.test"])
    );
    drop(rig);
}

/// A message that has made more hops than `limits.max_hops` (50, as
/// Postfix's `hopcount_limit`) is looping between relays: 554 5.4.6,
/// nothing queued; 50 hops still pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_with_51_received_fields_is_refused_as_a_loop() {
    let d = Daemon::start(Options {
        store: Store::Sqlite,
        ..Options::default()
    });
    let with_hops = |n: usize, key: &str| {
        let mut m = String::new();
        for i in 0..n {
            m.push_str(&format!(
                "Received: from hop{i}.example by hop{}.example; Mon, 7 Dec 2026 10:00:00 +0000\r\n",
                i + 1
            ));
        }
        let mut m = m.into_bytes();
        m.extend_from_slice(&message(Some(key), "looping"));
        m
    };
    let mut c = Client::login(d.plain, "bob").await;
    let r = c
        .submit(
            "bob@example.test",
            &["r@example.net"],
            &with_hops(51, "hops-51"),
        )
        .await;
    assert_eq!(r.code, 554, "{r:?}");
    assert!(r.has("5.4.6") && r.has("Too many hops"), "{r:?}");
    let r = c
        .submit(
            "bob@example.test",
            &["r@example.net"],
            &with_hops(50, "hops-50"),
        )
        .await;
    assert_eq!(r.code, 250, "{r:?}");
    c.quit().await;
    assert_eq!(d.queue_count(), 1);
    assert!(d.log().contains("refused: too many hops"), "{}", d.log());
}

/// MTA-STS (RFC 8461) through the rig: policies served over HTTPS by
/// `common/policy_server.rs` with the test CA's certificates, for an
/// unsigned zone (so DANE does not apply). `enforce` allows only the
/// policy's MX hosts over verified TLS and is kept across a restart;
/// `testing` and `none` deliver; a policy server that redirects, streams
/// without end, stalls or sends HTML gives no policy, within the fetch's
/// deadline, and the mail goes out as without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mta_sts_enforce_testing_none_and_hostile_policy_servers() {
    use common::policy_server::{PolicyServer, Serve};
    let dir = tempfile::tempdir().unwrap();
    let (port, https) = (free_port(), free_port());
    let ca = TestCa::new("smtp-once rig CA");
    let other_ca = TestCa::new("somebody else's CA");
    let policy = |mode: &str, mx: &str| {
        format!("version: STSv1\r\nmode: {mode}\r\nmx: {mx}\r\nmax_age: 86400\r\n")
    };
    // (domain, policy server behaviour, MX host ip, MX behaviour)
    let plain = Behaviour::plain();
    let good = |host: &str| Behaviour::tls(&ca.issue(&[host]));
    let cases: Vec<(&str, Serve, &str, Behaviour)> = vec![
        (
            "enf",
            Serve::Policy(policy("enforce", "mx.enf.sts.test")),
            "127.0.3.10",
            good("mx.enf.sts.test"),
        ),
        (
            "wild",
            Serve::Policy(policy("enforce", "*.wild.sts.test")),
            "127.0.3.11",
            good("mx.wild.sts.test"),
        ),
        (
            "strip",
            Serve::Policy(policy("enforce", "mx.strip.sts.test")),
            "127.0.3.12",
            plain.clone(),
        ),
        (
            "badcert",
            Serve::Policy(policy("enforce", "mx.badcert.sts.test")),
            "127.0.3.13",
            Behaviour::tls(&other_ca.issue(&["mx.badcert.sts.test"])),
        ),
        (
            "mismatch",
            Serve::Policy(policy("enforce", "good.example")),
            "127.0.3.14",
            good("mx.mismatch.sts.test"),
        ),
        (
            "testing",
            Serve::Policy(policy("testing", "mx.testing.sts.test")),
            "127.0.3.15",
            plain.clone(),
        ),
        (
            "none",
            Serve::Policy("version: STSv1\r\nmode: none\r\nmax_age: 60\r\n".into()),
            "127.0.3.16",
            plain.clone(),
        ),
        ("redirect", Serve::Redirect, "127.0.3.17", plain.clone()),
        ("endless", Serve::Endless, "127.0.3.18", plain.clone()),
        ("stall", Serve::Stall, "127.0.3.19", plain.clone()),
        (
            "html",
            Serve::WrongType(policy("enforce", "mx.html.sts.test")),
            "127.0.3.20",
            plain.clone(),
        ),
    ];
    let mut records = Vec::new();
    for (i, (name, _, mx_ip, _)) in cases.iter().enumerate() {
        records.push(format!("_mta-sts.{name} TXT \"v=STSv1; id=20261207\""));
        records.push(format!("mta-sts.{name} A 127.0.4.{}", i + 1));
        records.push(format!("{name} MX 10 mx.{name}"));
        records.push(format!("mx.{name} A {mx_ip}"));
    }
    let refs: Vec<&str> = records.iter().map(String::as_str).collect();
    let rig = DnsRig::start(
        dir.path(),
        &[Zone::new("sts.test", Signing::Insecure, &refs)],
    );
    let mut servers = Vec::new();
    let mut hosts = Vec::new();
    for (i, (name, serve, mx_ip, mx)) in cases.iter().enumerate() {
        let cert = ca.issue(&[&format!("mta-sts.{name}.sts.test")]);
        let ip = format!("127.0.4.{}", i + 1);
        servers.push(PolicyServer::start(at(&ip, https), &cert, serve.clone()));
        hosts.push(MxHost::start(at(mx_ip, port), mx.clone()));
    }
    let host = |name: &str| &hosts[cases.iter().position(|c| c.0 == name).unwrap()];
    let server = |name: &str| &servers[cases.iter().position(|c| c.0 == name).unwrap()];
    let ca_file = ca.write(dir.path());
    let mut d = relay(
        &rig,
        port,
        &format!(
            "mx_ca_file = \"{}\"\nmta_sts_port = {https}\n",
            ca_file.display()
        ),
    );

    let id = send(&d, "u@enf.sts.test").await;
    expect(&d, &id, "delivered", "auth=mta-sts").await;
    let id = send(&d, "u@wild.sts.test").await;
    expect(&d, &id, "delivered", "auth=mta-sts").await;
    let id = send(&d, "u@strip.sts.test").await;
    expect(
        &d,
        &id,
        "deferred",
        "MTA-STS policy of strip.sts.test: enforce",
    )
    .await;
    let id = send(&d, "u@badcert.sts.test").await;
    expect(
        &d,
        &id,
        "deferred",
        "MTA-STS policy of badcert.sts.test: enforce",
    )
    .await;
    let id = send(&d, "u@mismatch.sts.test").await;
    expect(
        &d,
        &id,
        "deferred",
        "no MX host (mx.mismatch.sts.test) matches mx: good.example",
    )
    .await;
    for name in ["testing", "none", "redirect", "endless", "stall", "html"] {
        let id = send(&d, &format!("u@{name}.sts.test")).await;
        expect(&d, &id, "delivered", "plaintext").await;
        assert_eq!(host(name).received().len(), 1, "{name}");
    }
    let log = d.log();
    for why in [
        "redirects are not followed",
        "at most 65536 bytes",
        "no policy within",
        "Content-Type is not text/plain",
    ] {
        assert!(log.contains(why), "{why:?} not logged:\n{log}");
    }
    for name in ["strip", "badcert", "mismatch"] {
        assert!(
            host(name).received().is_empty(),
            "{name} got mail against its policy"
        );
    }
    assert!(host("enf").received().iter().all(|m| m.tls));

    // The same TXT id: no new fetch; and after a restart the policy comes
    // from the saved cache, still without one.
    assert_eq!(server("enf").requests(), 1);
    let id = send(&d, "u2@enf.sts.test").await;
    expect(&d, &id, "delivered", "auth=mta-sts").await;
    d.restart();
    let id = send(&d, "u3@enf.sts.test").await;
    expect(&d, &id, "delivered", "auth=mta-sts").await;
    assert_eq!(
        server("enf").requests(),
        1,
        "the cached policy was fetched again"
    );
    assert_eq!(host("enf").received().len(), 3);
    drop(rig);
}

/// A REQUIRETLS submission over STARTTLS: MAIL, RCPT, DATA by hand.
async fn send_requiretls(d: &Daemon, rcpt: &str, body: &[u8]) -> String {
    let mut c = Client::connect(d.starttls).await;
    c.ehlo().await;
    c.starttls().await;
    let ehlo = c.ehlo().await;
    assert!(ehlo.has("REQUIRETLS"), "offered over TLS: {ehlo:?}");
    let r = c.auth_plain("bob", "bob-pw").await;
    assert_eq!(r.code, 235, "{r:?}");
    let r = c.cmd("MAIL FROM:<bob@example.test> REQUIRETLS").await;
    assert_eq!(r.code, 250, "{r:?}");
    let r = c.cmd(&format!("RCPT TO:<{rcpt}>")).await;
    assert_eq!(r.code, 250, "{r:?}");
    let r = c.cmd("DATA").await;
    assert_eq!(r.code, 354, "{r:?}");
    c.send(&common::dot_stuff(body)).await;
    let r = c.read_reply().await;
    assert_eq!(r.code, 250, "{r:?}");
    c.quit().await;
    r.queue_id().expect("queue id")
}

/// RFC 8689 end to end: REQUIRETLS is offered only over TLS (555 before,
/// as every parameter of an extension not offered); a REQUIRETLS message
/// goes only to an MX authenticated by DANE (or MTA-STS) that offers
/// REQUIRETLS, which is told; otherwise it bounces with 5.7.30 and the
/// host gets nothing. `TLS-Required: No` lets an ordinary message past a
/// DANE failure. Over HTTP, `require_tls` does what the parameter does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requiretls_is_kept_or_the_message_bounces() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let ca = TestCa::new("smtp-once rig CA");
    let cert = ca.issue(&["mx.example"]);
    let other = TestCa::new("another CA").issue(&["mx-bad.rt.test"]);
    let tlsa = |host: &str, c: &common::mx_host::HostCert| {
        format!("_{port}._tcp.{host} TLSA {}", c.tlsa_ee_spki_sha256())
    };
    let rig = DnsRig::start(
        dir.path(),
        &[
            Zone::new(
                "rt.test",
                Signing::Secure,
                &[
                    "ok MX 10 mx-ok",
                    "mx-ok A 127.0.5.1",
                    &tlsa("mx-ok", &cert),
                    "norequire MX 10 mx-norequire",
                    "mx-norequire A 127.0.5.2",
                    &tlsa("mx-norequire", &cert),
                    "bad MX 10 mx-bad",
                    "mx-bad A 127.0.5.4",
                    &tlsa("mx-bad", &cert),
                ],
            ),
            Zone::new(
                "plain.test",
                Signing::Insecure,
                &["@ MX 10 mx", "mx A 127.0.5.3"],
            ),
        ],
    );
    let ok = MxHost::start(at("127.0.5.1", port), Behaviour::requiretls(&cert));
    let norequire = MxHost::start(at("127.0.5.2", port), Behaviour::tls(&cert));
    let plain = MxHost::start(at("127.0.5.3", port), Behaviour::requiretls(&cert));
    let bad = MxHost::start(at("127.0.5.4", port), Behaviour::tls(&other));
    let d = relay(
        &rig,
        port,
        "keep_bodies = true\n\n[http]\naddr = \"127.0.0.1:0\"\n",
    );

    // Not offered before STARTTLS: 555, and the session goes on.
    let mut c = Client::login(d.plain, "bob").await;
    let r = c.cmd("MAIL FROM:<bob@example.test> REQUIRETLS").await;
    assert_eq!(r.code, 555, "{r:?}");
    assert!(r.has("5.5.4") && r.has("only after STARTTLS"), "{r:?}");
    // Every other parameter the parser knows whose extension is not
    // offered: 555 naming it, never a silent 250.
    for (param, name) in [
        ("RET=HDRS", "RET"),
        ("ENVID=x1", "ENVID"),
        ("BY=120;R", "BY"),
        ("MTRK=abc:60", "MTRK"),
        ("HOLDFOR=60", "HOLDFOR"),
        ("HOLDUNTIL=2026-12-08T10:00:00Z", "HOLDUNTIL"),
        ("MT-PRIORITY=3", "MT-PRIORITY"),
        ("BODY=BINARYMIME", "BODY=BINARYMIME"),
        ("CONPERM", "CONPERM"),
    ] {
        let r = c
            .cmd(&format!("MAIL FROM:<bob@example.test> {param}"))
            .await;
        assert_eq!(r.code, 555, "{param}: {r:?}");
        assert!(r.has(name), "{param}: {r:?}");
    }
    let r = c
        .cmd("MAIL FROM:<bob@example.test> SIZE=100 BODY=8BITMIME")
        .await;
    assert_eq!(r.code, 250, "{r:?}");
    for param in [
        "NOTIFY=NEVER",
        "ORCPT=rfc822;a@b.test",
        "RRVS=2026-12-08T10:00:00Z",
        "CONNEG",
    ] {
        let r = c.cmd(&format!("RCPT TO:<u@ok.rt.test> {param}")).await;
        assert_eq!(r.code, 555, "{param}: {r:?}");
    }
    c.quit().await;

    // DANE, and the MX offers REQUIRETLS: delivered, REQUIRETLS passed on.
    let id = send_requiretls(&d, "u@ok.rt.test", &message(None, "secret")).await;
    expect(&d, &id, "delivered", "auth=dane-ee").await;
    let got = ok.received();
    assert_eq!(got.len(), 1);
    assert!(
        got[0].tls && got[0].mail.contains("REQUIRETLS"),
        "{:?}",
        got[0].mail
    );

    // DANE, but the MX does not offer REQUIRETLS; no DANE or MTA-STS at
    // all: bounced with 5.7.30, nothing sent.
    let id = send_requiretls(&d, "u@norequire.rt.test", &message(None, "secret")).await;
    expect(&d, &id, "failed", "550 5.7.30").await;
    let id = send_requiretls(&d, "u@plain.test", &message(None, "secret")).await;
    expect(&d, &id, "failed", "550 5.7.30").await;
    assert!(norequire.received().is_empty() && plain.received().is_empty());
    // Each bounce went back to the sender (a DSN naming 5.7.30).
    wait_until("the bounces", 20, || {
        (d.count("SELECT COUNT(*) FROM queue WHERE reverse_path = ''") == 2).then_some(())
    })
    .await;

    // TLS-Required: No: an impostor's certificate under TLSA no longer
    // holds the message back; without it, it does.
    let id = send(&d, "u@bad.rt.test").await;
    expect(&d, &id, "deferred", "TLS policy dane").await;
    let mut body = b"TLS-Required: No\r\n".to_vec();
    body.extend_from_slice(&message(None, "anyway"));
    let mut c = Client::login(d.plain, "bob").await;
    let r = c
        .submit("bob@example.test", &["v@bad.rt.test"], &body)
        .await;
    c.quit().await;
    let id = r.queue_id().expect("queued");
    expect(&d, &id, "delivered", "auth=none").await;
    assert!(bad.received().iter().any(|m| m.rcpts == ["v@bad.rt.test"]));
    assert!(!bad.received().iter().any(|m| m.rcpts == ["u@bad.rt.test"]));

    // Over HTTP: the JSON field.
    let http = d.http.expect("http listener");
    let json = br#"{"from": "bob@example.test", "to": ["w@plain.test"], "subject": "s", "text": "secret", "require_tls": true}"#;
    let r = common::http::Request::new("POST", "/v1/messages")
        .bearer(&common::api_token("bob"))
        .header("Idempotency-Key", "rt-http-1")
        .body("application/json", json)
        .send(http)
        .await;
    assert_eq!(r.status, 202, "{:?}", r.json());
    let id = r.json()["id"].as_str().expect("id").to_string();
    expect(&d, &id, "failed", "550 5.7.30").await;
    assert!(plain.received().is_empty());
    drop(rig);
}

/// TLS-RPT (RFC 8460) through the rig: a domain with DANE publishes
/// `_smtp._tls` with an https and a mailto address; one MX presents an
/// impostor's certificate (refused under its TLSA record), the next takes
/// the message. After `tls_rpt_interval` the report, one success and one
/// `validation-failure` naming that MX, is POSTed gzipped to the https
/// address and mailed, through the relay's own queue, to the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_rpt_reports_sessions_by_https_and_by_mail() {
    use common::policy_server::{PolicyServer, Serve};
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let (port, https) = (free_port(), free_port());
    let ca = TestCa::new("smtp-once rig CA");
    let good = ca.issue(&["mx-good.d.rpt.test"]);
    let impostor = TestCa::new("another CA").issue(&["mx-bad.d.rpt.test"]);
    let tlsa = |host: &str| format!("_{port}._tcp.{host} TLSA {}", good.tlsa_ee_spki_sha256());
    let rua = format!(
        "_smtp._tls.d TXT \"v=TLSRPTv1; rua=https://collector.rpt.test:{https}/tlsrpt,mailto:tls@reports.test\""
    );
    let rig = DnsRig::start(
        dir.path(),
        &[
            Zone::new(
                "rpt.test",
                Signing::Secure,
                &[
                    "d MX 10 mx-bad.d",
                    "d MX 20 mx-good.d",
                    "mx-bad.d A 127.0.6.1",
                    "mx-good.d A 127.0.6.2",
                    &tlsa("mx-bad.d"),
                    &tlsa("mx-good.d"),
                    &rua,
                    "collector A 127.0.6.3",
                ],
            ),
            Zone::new(
                "reports.test",
                Signing::Insecure,
                &["@ MX 10 mx", "mx A 127.0.6.4"],
            ),
        ],
    );
    let bad = MxHost::start(at("127.0.6.1", port), Behaviour::tls(&impostor));
    let _good = MxHost::start(at("127.0.6.2", port), Behaviour::tls(&good));
    let inbox = MxHost::start(at("127.0.6.4", port), Behaviour::plain());
    let collector = PolicyServer::start(
        at("127.0.6.3", https),
        &ca.issue(&["collector.rpt.test"]),
        Serve::Collect,
    );
    let d = relay(
        &rig,
        port,
        &format!(
            "mx_ca_file = \"{}\"\ntls_rpt = true\ntls_rpt_interval = \"2s\"\n",
            ca.write(dir.path()).display()
        ),
    );
    let id = send(&d, "u@d.rpt.test").await;
    expect(&d, &id, "delivered", "[127.0.6.2").await;
    assert!(bad.received().is_empty());

    let (head, body) = wait_until("a report POSTed", 30, || {
        collector.bodies().into_iter().next()
    })
    .await;
    assert!(head.starts_with("POST /tlsrpt "), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/tlsrpt+gzip"),
        "{head}"
    );
    let mut json = String::new();
    flate2::read::GzDecoder::new(&body[..])
        .read_to_string(&mut json)
        .expect("gzip");
    let report: serde_json::Value = serde_json::from_str(&json).expect("json");
    assert_eq!(report["organization-name"], "relay.test", "{report}");
    let policy = &report["policies"][0];
    assert_eq!(policy["policy"]["policy-type"], "tlsa", "{report}");
    assert_eq!(policy["policy"]["policy-domain"], "d.rpt.test");
    assert_eq!(
        policy["summary"]["total-successful-session-count"], 1,
        "{report}"
    );
    assert_eq!(
        policy["summary"]["total-failure-session-count"], 1,
        "{report}"
    );
    let failure = &policy["failure-details"][0];
    assert_eq!(failure["result-type"], "validation-failure", "{report}");
    assert_eq!(failure["receiving-mx-hostname"], "mx-bad.d.rpt.test");
    assert_eq!(failure["receiving-ip"], "127.0.6.1");

    let mail = wait_until("a report by mail", 30, || {
        inbox.received().into_iter().next()
    })
    .await;
    let text = String::from_utf8_lossy(&mail.data).to_string();
    assert_eq!(mail.rcpts, ["tls@reports.test"]);
    for want in [
        "report-type=\"tlsrpt\"",
        "TLS-Report-Domain: d.rpt.test",
        "TLS-Required: No",
        "Content-Type: application/tlsrpt+gzip",
    ] {
        assert!(text.contains(want), "{want:?} not in\n{text}");
    }
    drop(rig);
}

/// One MX host serving many domains (a provider's) gets at most
/// `pool_size` sessions at once, each carrying message after message,
/// even when the worker runs more transactions than that for its domains:
/// no connection (and DANE handshake) per message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_mx_host_for_many_domains_reuses_its_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cert = TestCa::new("smtp-once rig CA").issue(&["mx.shared.test"]);
    let mut records = vec![
        "mx A 127.0.7.1".to_string(),
        format!("_{port}._tcp.mx TLSA {}", cert.tlsa_ee_spki_sha256()),
    ];
    for i in 0..10 {
        records.push(format!("d{i} MX 10 mx"));
    }
    let refs: Vec<&str> = records.iter().map(String::as_str).collect();
    let rig = DnsRig::start(
        dir.path(),
        &[Zone::new("shared.test", Signing::Secure, &refs)],
    );
    let host = MxHost::start(at("127.0.7.1", port), Behaviour::tls(&cert));
    let d = relay(&rig, port, "pool_size = 2\n");
    let mut clients = Vec::new();
    for c in 0..4 {
        let plain = d.plain;
        clients.push(tokio::spawn(async move {
            let mut client = Client::login(plain, "bob").await;
            for i in 0..10 {
                let rcpt = format!("u{c}x{i}@d{i}.shared.test");
                let r = client
                    .submit("bob@example.test", &[&rcpt], &message(None, &rcpt))
                    .await;
                assert_eq!(r.code, 250, "{r:?}");
            }
            client.quit().await;
        }));
    }
    for c in clients {
        c.await.unwrap();
    }
    wait_until("all 40 delivered", 60, || {
        (host.received().len() == 40).then_some(())
    })
    .await;
    assert!(host.received().iter().all(|m| m.tls));
    let delivered =
        d.count("SELECT COUNT(*) FROM delivery_attempt WHERE next_hop LIKE '%auth=dane-ee'");
    assert_eq!(delivered, 40);
    assert!(
        host.connections() <= 4,
        "{} connections for 40 messages through a pool of 2",
        host.connections()
    );
    drop(rig);
}

/// MTA-STS: the policy is fetched again when, and only when, the
/// `_mta-sts` TXT record's id changes (RFC 8461 5.1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mta_sts_policy_is_fetched_again_when_the_txt_id_changes() {
    use common::policy_server::{PolicyServer, Serve};
    let dir = tempfile::tempdir().unwrap();
    let (port, https) = (free_port(), free_port());
    let ca = TestCa::new("smtp-once rig CA");
    let rig = DnsRig::start(
        dir.path(),
        &[Zone::new(
            "ids.test",
            Signing::Insecure,
            &[
                "_mta-sts 1 TXT \"v=STSv1; id=one\"",
                "mta-sts A 127.0.8.1",
                "@ MX 10 mx",
                "mx A 127.0.8.2",
            ],
        )],
    );
    let policy = "version: STSv1\r\nmode: enforce\r\nmx: mx.ids.test\r\nmax_age: 86400\r\n";
    let server = PolicyServer::start(
        at("127.0.8.1", https),
        &ca.issue(&["mta-sts.ids.test"]),
        Serve::Policy(policy.into()),
    );
    let _mx = MxHost::start(
        at("127.0.8.2", port),
        Behaviour::tls(&ca.issue(&["mx.ids.test"])),
    );
    let d = relay(
        &rig,
        port,
        &format!(
            "mx_ca_file = \"{}\"\nmta_sts_port = {https}\n",
            ca.write(dir.path()).display()
        ),
    );
    for (i, id) in ["one", "one", "two"].iter().enumerate() {
        if i == 2 {
            rig.set(
                "ids.test",
                "_mta-sts",
                1,
                "TXT",
                &format!("\"v=STSv1; id={id}\""),
            );
            // Past the TTL of 1 s, in Unbound's cache and ours.
            tokio::time::sleep(Duration::from_millis(2500)).await;
        }
        let msg = send(&d, &format!("u{i}@ids.test")).await;
        expect(&d, &msg, "delivered", "auth=mta-sts").await;
    }
    assert_eq!(
        server.requests(),
        2,
        "fetched for id one, not again, then for id two"
    );
    drop(rig);
}
