//! Issue 24, a relay that keeps up: a new message waits while the relay's
//! backlog is over `[relay] max_backlog`, at most `in_flow_delay`, and is
//! then accepted anyway; once deliveries make room, nothing waits. Against
//! the real daemon, a next hop that holds its connections, and /metrics.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::http::Request;
use common::{Client, Daemon, Options, Store, message, stalling_next_hop, wait_until};

async fn send(c: &mut Client, n: usize) -> common::Reply {
    let m = message(Some(&format!("backlog-{n}")), &format!("message {n}"));
    c.submit("alice@example.test", &["r@example.net"], &m).await
}

async fn metric(d: &Daemon, name: &str) -> f64 {
    let r = Request::new("GET", "/metrics")
        .send(d.metrics.expect("metrics listener"))
        .await;
    assert_eq!(r.status, 200);
    let text = String::from_utf8_lossy(&r.body).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{text}"))
}

#[tokio::test]
async fn acceptance_waits_for_room_then_goes_on() {
    let (port, open) = stalling_next_hop();
    let d = Daemon::start(Options {
        relay: Some(format!(
            "[relay]\nmode = \"smarthost\"\nsmarthost = \"127.0.0.1:{port}\"\ntls = \"none\"\n\
             retry_schedule = [\"1h\"]\npoll_interval = \"50ms\"\n\
             max_backlog = 2\nin_flow_delay = \"1500ms\"\n"
        )),
        extra: "[metrics]\naddr = \"127.0.0.1:0\"\n".into(),
        store: Store::Sqlite,
        ..Options::default()
    });
    let wait_total = "smtp_once_inflow_wait_seconds_total";
    let mut c = Client::login(d.plain, "alice").await;

    // Two messages fill the backlog (the next hop holds their attempts):
    // neither waited.
    for n in 0..2 {
        let r = send(&mut c, n).await;
        assert_eq!(r.code, 250, "{r:?}");
    }
    assert_eq!(metric(&d, wait_total).await, 0.0);

    // The third finds it full: it waits the whole in_flow_delay, then is
    // accepted and queued all the same.
    let started = Instant::now();
    let r = send(&mut c, 2).await;
    assert_eq!(r.code, 250, "a full backlog slows, never refuses: {r:?}");
    assert!(started.elapsed() >= Duration::from_millis(1400));
    let waited = metric(&d, wait_total).await;
    assert!((1.4..3.0).contains(&waited), "{waited}");
    assert_eq!(d.queue_count(), 3);

    // A retry of an accepted message is a replay: looked up before any
    // wait (it queues nothing), so it does not wait for room.
    let r = send(&mut c, 0).await;
    assert!(r.is_replay(), "{r:?}");
    assert_eq!(metric(&d, wait_total).await, waited, "a replay never waits");
    assert_eq!(d.queue_count(), 3);

    // The next hop lets go: the attempts end deferred (deferred mail does
    // not count), there is room again, and the next message does not wait.
    open.send(true).expect("open");
    wait_until("three deferred", 30, || {
        (d.count("SELECT COUNT(*) FROM queue WHERE state = 'deferred'") == 3).then_some(())
    })
    .await;
    let r = send(&mut c, 3).await;
    assert_eq!(r.code, 250, "{r:?}");
    assert_eq!(metric(&d, wait_total).await, waited, "no wait with room");
    c.quit().await;
}
