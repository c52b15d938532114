//! Process-level defences: the daemon raises its own open-file limit, so a
//! low soft limit from the service manager cannot cap connections early.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::{BIN, Daemon, Options};

/// (soft, hard) open-file limits of a process, as /proc shows them.
fn nofile(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("Max open files line");
    let mut values = line.split_whitespace().skip(3);
    let soft = values.next().expect("soft value").to_owned();
    let hard = values.next().expect("hard value").to_owned();
    (soft, hard)
}

#[test]
fn serve_raises_a_low_open_file_soft_limit_to_the_hard_limit() {
    // A daemon only to write a config and a data dir; then run our own
    // instance under a soft limit of 256.
    let mut daemon = Daemon::start(Options::default());
    daemon.kill9();
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("ulimit -Sn 256 && exec \"$0\" serve --config \"$1\"")
        .arg(BIN)
        .arg(&daemon.config_path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let stdout = child.stdout.take().expect("stdout");
    let listening = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|l| l.starts_with("smtp-once listening on"));
    assert!(listening, "daemon did not start");
    let (soft, hard) = nofile(child.id());
    let _ = child.kill();
    let _ = child.wait();
    assert_ne!(soft, "256", "soft limit left at 256");
    assert_eq!(soft, hard);
}
