//! The `smtp-once-bench` binary as a user runs it: its help, its refusals
//! of bad arguments, and a run with no server to talk to.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

use std::net::TcpListener;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_smtp-once-bench");

fn run(args: &[&str]) -> (Output, String, String) {
    let out = Command::new(BIN).args(args).output().expect("run bench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stdout, stderr)
}

#[test]
fn help_names_the_binary_and_its_options() {
    let (out, stdout, _) = run(&["--help"]);
    assert!(out.status.success());
    assert!(
        stdout.contains("Usage: smtp-once-bench [OPTIONS]"),
        "{stdout}"
    );
    for option in ["--server", "--connections", "--key-style", "--json"] {
        assert!(stdout.contains(option), "{option}: {stdout}");
    }
}

#[test]
fn bad_arguments_are_refused_before_connecting() {
    let (out, _, stderr) = run(&["--bogus"]);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let (out, _, stderr) = run(&["-c", "0"]);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr,
        "smtp-once: bench: invalid arguments: --connections must be at least 1\n"
    );
}

#[test]
fn no_server_is_a_failure_with_the_reason() {
    // A port just freed: nothing listens there.
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let server = format!("127.0.0.1:{port}");
    let (out, stdout, stderr) = run(&["--server", &server, "-c", "1", "-n", "1", "--quiet"]);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains(
            "smtp-once: bench: no message got a reply (10 connection errors; last: connect to"
        ),
        "{stderr}"
    );
}
