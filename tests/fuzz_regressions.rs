//! Every crash the fuzzers found, replayed in-process through the fuzz
//! targets' own glue (no fuzzer needed): each file under
//! `tests/fuzz_regressions/<target>/` must run without a panic.
//!
//! To add one: copy the artifact from `fuzz/artifacts/<target>/` into the
//! target's folder here under a name that says what it is.
//! `FUZZ_REPLAY_DIR=fuzz/corpus` replays a whole fuzz corpus instead
//! (`<dir>/<target>/*`), e.g. to check a fix against a campaign's inputs.
//! `SMTP_ONCE_FUZZ_TRACE=1` (with `-- --nocapture`) prints each session's
//! dialogue.
//! A stack overflow aborts this whole test binary instead of failing one
//! test: the abort message names the thread (`fuzz_regressions::<target>`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

#[path = "../fuzz/src/glue.rs"]
mod glue;

use std::path::PathBuf;

fn replay(target: &str, run: fn(&[u8])) {
    let root = std::env::var("FUZZ_REPLAY_DIR").unwrap_or("tests/fuzz_regressions".into());
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(root)
        .join(target);
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .map(|e| e.expect("read tests/fuzz_regressions entry").path())
            .filter(|p| p.is_file())
            .collect(),
        // No crash recorded for this target yet.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => panic!("{}: {e}", dir.display()),
    };
    files.sort();
    let mut failed = Vec::new();
    for file in &files {
        let input = std::fs::read(file).expect("read regression input");
        eprintln!("replaying {}", file.display());
        if std::panic::catch_unwind(|| run(&input)).is_err() {
            failed.push(file.display().to_string());
        }
    }
    assert!(failed.is_empty(), "inputs that still fail: {failed:#?}");
}

#[test]
fn session() {
    replay("session", glue::session);
}

#[test]
fn key() {
    replay("key", glue::key);
}

#[test]
fn fingerprint() {
    replay("fingerprint", glue::fingerprint);
}

#[test]
fn config() {
    replay("config", glue::config);
}

#[test]
fn address() {
    replay("address", glue::address);
}

#[test]
fn compose() {
    replay("compose", glue::compose);
}
