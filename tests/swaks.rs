//! Runs every `tests/swaks/*.sh` script (swaks is the tool our users test
//! relays with) against one real daemon. swaks must be installed: the
//! README's test command (`scripts/test.sh`) installs it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

mod common;

use std::process::Command;

use common::{Daemon, Options, repo_path};

#[test]
fn swaks_scripts() {
    let found = Command::new("swaks").arg("--version").output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "swaks is not installed: run scripts/test.sh (it installs swaks) or apt-get install swaks"
    );
    let d = Daemon::start(Options {
        allow_plaintext: false,
        max_message_size: 100_000,
        ..Options::default()
    });
    let mut scripts: Vec<_> = std::fs::read_dir(repo_path("tests/swaks"))
        .expect("tests/swaks")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "sh") && !p.ends_with("lib.sh"))
        .collect();
    scripts.sort();
    assert!(scripts.len() >= 10, "scripts missing: {scripts:?}");
    let mut failed = Vec::new();
    for script in &scripts {
        let out = Command::new("bash")
            .arg(script)
            .env("PLAIN", d.plain.to_string())
            .env("STARTTLS", d.starttls.to_string())
            .env("IMPLICIT", d.implicit.to_string())
            .env("USER", "alice")
            .env("PASS", "alice-pw")
            .output()
            .expect("run bash");
        let name = script
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        print!("{name}:\n{}", String::from_utf8_lossy(&out.stdout));
        if !out.status.success() {
            eprintln!("{}", String::from_utf8_lossy(&out.stderr));
            failed.push(name);
        }
    }
    assert!(
        failed.is_empty(),
        "swaks scripts failed: {failed:?}\ndaemon log:\n{}",
        d.log()
    );
}
