//! Issue 22 item 2: the operator commands (`queue`, `status`, `hold`,
//! `retry`, `release`, `delete`, `retry --all`) of the real binary against
//! a running daemon, on SQLite and on PostgreSQL: one script, two stores,
//! and the same transcript (queue ids, dates, ports and sizes aside).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

mod common;

use std::sync::Arc;

use common::pg::TestDb;
use common::{Client, Daemon, Options, Store, message, wait_until};

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

async fn submit(d: &Daemon, body: &str) -> String {
    let mut c = Client::login(d.plain, "bob").await;
    let r = c
        .submit("bob@example.test", &["r@example.net"], &message(None, body))
        .await;
    assert_eq!(r.code, 250, "{r:?}");
    c.quit().await;
    r.queue_id().expect("queue id")
}

/// One command: its exit status, stdout and stderr as one block.
fn run(d: &Daemon, args: &[&str]) -> String {
    let out = d.cli(args);
    format!(
        "$ {}\nexit {}\n{}{}",
        args.join(" "),
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

async fn wait_status(d: &Daemon, id: &str, wants: &str) {
    wait_until(&format!("{id}: {wants}"), 20, || {
        run(d, &["status", id]).contains(wants).then_some(())
    })
    .await;
}

/// What differs between two runs by nature: the ids, dates (fixed-width
/// RFC 5322), the closed port, message sizes (the trace header holds the
/// id and date, same length, but stay safe).
fn normalised(text: &str, ids: &[(&str, &str)], port: u16) -> String {
    let mut s = text.to_owned();
    for (id, name) in ids {
        s = s.replace(id, name);
    }
    s = s.replace(&format!(":{port}"), ":PORT");
    while let Some(at) = s.find(" +0000") {
        let start = at.saturating_sub(25);
        s.replace_range(start..at + 6, "DATE");
    }
    s.lines()
        .map(|l| match l.find("size") {
            Some(i) => {
                let (head, tail) = l.split_at(i);
                let tail: String = tail
                    .chars()
                    .map(|c| if c.is_ascii_digit() { 'N' } else { c })
                    .collect();
                let tail = tail
                    .replace("NN", "N")
                    .replace("NN", "N")
                    .replace("NN", "N");
                format!("{head}{tail}")
            }
            None => l.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

async fn script(store: Store) -> String {
    let port = free_port();
    let d = Daemon::start(Options {
        relay: Some(format!(
            "[relay]\nmode = \"smarthost\"\nsmarthost = \"127.0.0.1:{port}\"\ntls = \"none\"\n"
        )),
        // Long backoff: only the operator's commands bring a message back.
        extra: "retry_schedule = [\"1h\"]\npoll_interval = \"50ms\"\n".into(),
        store,
        ..Options::default()
    });
    let m1 = submit(&d, "m1").await;
    let m2 = submit(&d, "m2").await;
    wait_status(&d, &m1, "state:        deferred").await;
    wait_status(&d, &m2, "state:        deferred").await;
    let mut out = String::new();
    for args in [
        vec!["queue"],
        vec!["status", &m1],
        vec!["hold", &m1],
        vec!["queue", "--state", "held"],
        vec!["queue", "--workspace", "globex"],
        vec!["queue", "--workspace", "acme", "--newer-than", "1h"],
        vec!["queue", "--older-than", "1h"],
        vec!["retry", &m1],
        vec!["release", &m2],
        vec!["hold", &m1, "NOPE"],
        vec!["release", &m1],
    ] {
        out.push_str(&run(&d, &args));
    }
    // The release made it due: one more attempt, deferred again.
    wait_status(&d, &m1, "attempts:     2").await;
    wait_status(&d, &m1, "state:        deferred").await;
    for args in [
        vec!["delete", &m2],
        vec!["status", &m2],
        vec!["delete", "NOPE"],
        vec!["retry", "--all"],
    ] {
        out.push_str(&run(&d, &args));
    }
    normalised(&out, &[(&m1, "M1"), (&m2, "M2")], port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_commands_print_the_same_on_sqlite_and_postgres() {
    let on_sqlite = script(Store::Sqlite).await;
    let on_postgres = script(Store::Postgres(Arc::new(TestDb::create()))).await;
    // What the operator sees, checked once (the SQLite run, as before).
    for wants in [
        "$ queue\nexit 0\nM1 deferred   attempts=1",
        "state:        deferred",
        "per recipient:\n  <r@example.net>  pending",
        "$ hold M1\nexit 0\nM1: held\n",
        "$ queue --state held\nexit 0\nM1 held",
        "$ queue --workspace globex\nexit 0\n0 message(s)\n",
        "$ queue --workspace acme --newer-than 1h\nexit 0\nM1 held",
        "2 message(s)\n$ queue --older-than 1h\nexit 0\n0 message(s)\n",
        "$ retry M1\nexit 1\nsmtp-once: M1: is held; release it to deliver it\n",
        "$ release M2\nexit 1\nsmtp-once: M2: is deferred, not held\n",
        "smtp-once: no message with queue id NOPE\nsmtp-once: 1 of 2 message(s) not changed",
        "$ release M1\nexit 0\nM1: released (deferred), due now\n",
        "$ delete M2\nexit 0\nM2: deleted\n",
        "$ status M2\nexit 1\nsmtp-once: no message with queue id M2\n",
        "$ retry --all\nexit 0\n1 message(s) due now",
    ] {
        assert!(on_sqlite.contains(wants), "{wants:?} in\n{on_sqlite}");
    }
    assert_eq!(on_postgres, on_sqlite);
}
