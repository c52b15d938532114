//! Issue 9's command-line papercuts, through the real binary: `bench` fails
//! when nothing was accepted and labels replays unambiguously,
//! `check-config` lists unknown keys with every other problem, and
//! `hash-password` reads without echo on a terminal; and issue 21's
//! grouped `--help`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use argon2::{Argon2, PasswordVerifier};
use common::{BIN, Daemon, Options};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `smtp-once bench` runs this binary from `smtp-once`'s folder. A
/// workspace-wide `cargo test` builds it beside `BIN` before any test runs;
/// `cargo test --test cli_papercuts` alone does not, so it says how.
fn bench_binary() -> PathBuf {
    let path = Path::new(BIN).with_file_name(smtp_once::cli::BENCH_BINARY);
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build -p smtp-once-bench` (or the whole \
         `cargo test --all-targets`)",
        path.display()
    );
    path
}

fn bench(daemon: &Daemon, extra: &[&str]) -> Output {
    bench_binary();
    Command::new(BIN)
        .args(["bench", "--quiet", "-c", "2", "-n", "6", "--size", "500"])
        .arg("--server")
        .arg(daemon.plain.to_string())
        .args(extra)
        .output()
        .expect("run bench")
}

#[test]
fn bench_fails_when_nothing_was_accepted() {
    // No --auth and no trusted network: the daemon answers MAIL with 530.
    let daemon = Daemon::start(Options::default());
    let out = bench(&daemon, &[]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stdout.contains("replies             530=6\n"), "{stdout}");
    assert!(stdout.contains("accepted            0\n"), "{stdout}");
    assert!(
        stderr.contains("bench: no message was accepted: all 6 refused (530=6)"),
        "{stderr}"
    );
    assert!(stderr.contains("--auth"), "{stderr}");

    // --json: the report stays parseable on stdout, the exit status says it.
    let out = bench(&daemon, &["--json"]);
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(report["accepted"], 0);
    assert_eq!(report["replies"]["530"], 6);
    assert_eq!(daemon.queue_count(), 0);
}

/// The bench is its own binary: `smtp-once bench --help` shows the bench's
/// own options through the forwarder, under the command the user typed.
#[test]
fn bench_help_comes_from_the_bench_binary() {
    bench_binary();
    let out = Command::new(BIN)
        .args(["bench", "--help"])
        .output()
        .expect("run bench --help");
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        stdout.contains("Usage: smtp-once bench [OPTIONS]"),
        "{stdout}"
    );
    assert!(stdout.contains("--key-style <KEY_STYLE>"), "{stdout}");
    assert!(
        !stdout.contains("[ARGS]"),
        "the forwarder's own help: {stdout}"
    );
}

/// `smtp-once` alone in a folder, as it would be in a hard link next to
/// `BIN` (same file system, so no 200 MB copy).
fn lone_smtp_once() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let exe = dir.path().join("smtp-once");
    if std::fs::hard_link(BIN, &exe).is_err() {
        std::fs::copy(BIN, &exe).expect("copy smtp-once");
    }
    (dir, exe)
}

#[test]
fn bench_without_its_binary_says_which_is_missing() {
    let (dir, exe) = lone_smtp_once();
    let out = Command::new(&exe)
        .args(["bench", "-n", "1"])
        .output()
        .expect("run");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let missing = dir.path().join("smtp-once-bench");
    assert!(
        stderr.contains(&format!(
            "smtp-once: bench: smtp-once-bench is not installed beside smtp-once: no {}",
            missing.display()
        )),
        "{stderr}"
    );
}

/// Every argument reaches the bench as written (hyphens, `--help`, odd
/// values), and its exit code comes back.
#[test]
fn bench_forwards_arguments_and_exit_code() {
    use std::os::unix::fs::PermissionsExt;
    let (dir, exe) = lone_smtp_once();
    let stub = dir.path().join("smtp-once-bench");
    std::fs::write(&stub, "#!/bin/sh\nprintf '%s\\n' \"$@\"\nexit 7\n").expect("stub");
    std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let args = [
        "-c",
        "2",
        "--json",
        "--help",
        "--to=a b@x",
        "-",
        "--",
        "last",
    ];
    // A fork elsewhere in this process may hold the stub open for writing
    // until its exec: ETXTBSY ("Text file busy") for a moment.
    let mut tries = 0;
    let out = loop {
        let out = Command::new(&exe)
            .arg("bench")
            .args(args)
            .output()
            .expect("run");
        tries += 1;
        if tries == 20 || !text(&out.stderr).contains("Text file busy") {
            break out;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    let lines: Vec<String> = text(&out.stdout).lines().map(str::to_owned).collect();
    assert_eq!(lines, args, "{lines:?}");
}

#[test]
fn bench_labels_server_replays_apart_from_client_repeats() {
    let daemon = Daemon::start(Options::default());
    let args = ["--auth", "alice:alice-pw", "--key-prefix", "papercuts"];
    let first = bench(&daemon, &args);
    assert!(first.status.success(), "{}", text(&first.stderr));
    // The same prefix again: every key is known, so every message replays,
    // though the client repeated nothing itself.
    let second = bench(&daemon, &args);
    let stdout = text(&second.stdout);
    assert!(second.status.success(), "{}", text(&second.stderr));
    assert!(stdout.contains("replies             250=6\n"), "{stdout}");
    assert!(stdout.contains("accepted            6\n"), "{stdout}");
    assert!(stdout.contains("replayed by server  6\n"), "{stdout}");
    assert!(stdout.contains("repeats sent        0\n"), "{stdout}");
    assert!(!stdout.contains("replay="), "{stdout}");
    assert!(text(&second.stderr).is_empty(), "{}", text(&second.stderr));
    assert_eq!(daemon.queue_count(), 6);

    let json = bench(&daemon, &[&args[..], &["--json"]].concat());
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).expect("json");
    assert_eq!(report["replayed_by_server"], 6);
    assert_eq!(report["repeats_sent"], 0);
    assert!(report.get("replays_sent").is_none(), "{report}");
    assert!(report["replies"].get("replay").is_none(), "{report}");
}

#[test]
fn check_config_lists_unknown_keys_with_every_other_problem() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("typos.toml");
    let hash = smtp_once::auth::hash_password("pw").expect("hash");
    let config = format!(
        r#"
[server]
hostname = "relay.test"
data_dir = "data"
max_mesage_size = 1000
max_connections = "lots"

[[listener]]
addr = "127.0.0.1:2587"

[[user]]
name = "a"
password_hash = "{hash}"
workspace = "w"

[[user]]
name = "b"
pasword_hash = "{hash}"
workspace = "w"

[limits]
foo = 1

[relay]
mode = "pigeon"
"#
    );
    std::fs::write(&path, config).expect("write");
    let out = Command::new(BIN)
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .expect("run");
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    for line in [
        "has 6 problem(s):",
        "\n  server.max_mesage_size: unknown key\n",
        "\n  user[1].pasword_hash: unknown key\n",
        "\n  user[1].password_hash: missing (required)\n",
        "\n  limits.foo: unknown key\n",
        "\n  server.max_connections: invalid type: string \"lots\", expected usize\n",
        "\n  relay.mode: \"pigeon\" must be file, smarthost or mx\n",
    ] {
        assert!(stderr.contains(line), "{line:?} missing from:\n{stderr}");
    }
}

fn hash_password(stdin: &[u8]) -> Output {
    let mut child = Command::new(BIN)
        .arg("hash-password")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin)
        .expect("write");
    child.wait_with_output().expect("wait")
}

fn verifies(hash: &str, password: &str) -> bool {
    Argon2::default()
        .verify_password(password.as_bytes(), hash.trim())
        .is_ok()
}

#[test]
fn hash_password_reads_a_plain_line_from_a_pipe() {
    // `echo -n pw | smtp-once hash-password`: no newline, no prompt.
    let out = hash_password(b"pw");
    let hash = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(verifies(&hash, "pw"), "{hash}");
    assert!(text(&out.stderr).is_empty(), "{}", text(&out.stderr));
    // One line, its ending (LF or CRLF) not part of the password.
    let hash = text(&hash_password(b"s3cret\r\nignored\n").stdout);
    assert!(verifies(&hash, "s3cret"), "{hash}");
    let out = hash_password(b"");
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("empty password"));
}

/// The program under a pseudo-terminal (util-linux `script`): what the
/// terminal shows arrives on `rx`, what is typed goes to `stdin`.
struct Terminal {
    child: std::process::Child,
    rx: mpsc::Receiver<Vec<u8>>,
    screen: String,
}

impl Terminal {
    fn start(command: &str) -> Option<Terminal> {
        let mut child = Command::new("script")
            .args(["-qec", command, "/dev/null"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let mut stdout = child.stdout.take()?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = stdout.read(&mut buf) {
                if tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        Some(Terminal {
            child,
            rx,
            screen: String::new(),
        })
    }

    /// Waits until the screen shows `text` (generous: a slow CI machine).
    fn wait_for(&mut self, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.screen.contains(text) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(bytes) => self.screen.push_str(&String::from_utf8_lossy(&bytes)),
                Err(_) => panic!("{text:?} never shown; screen: {:?}", self.screen),
            }
        }
    }

    fn type_line(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        stdin.write_all(line.as_bytes()).expect("type");
        stdin.write_all(b"\n").expect("type");
        stdin.flush().expect("flush");
    }

    /// Reads the rest of the screen and the exit status.
    fn finish(mut self) -> (String, std::process::ExitStatus) {
        let status = self.child.wait().expect("wait");
        while let Ok(bytes) = self.rx.recv_timeout(Duration::from_secs(5)) {
            self.screen.push_str(&String::from_utf8_lossy(&bytes));
        }
        (self.screen, status)
    }
}

#[test]
fn hash_password_on_a_terminal_hides_the_password_and_asks_twice() {
    let command = format!("{BIN} hash-password");
    // `script` is in Debian's essential bsdutils: a machine without it
    // fails here rather than skipping.
    let mut term = Terminal::start(&command).expect("util-linux `script`");
    term.wait_for("Password: ");
    term.type_line("tty-s3cret");
    term.wait_for("Again: ");
    term.type_line("tty-s3cret");
    let (screen, status) = term.finish();
    assert!(status.success(), "{screen:?}");
    assert!(!screen.contains("tty-s3cret"), "echoed: {screen:?}");
    let hash = screen
        .split_whitespace()
        .find(|w| w.starts_with("$argon2id$"))
        .unwrap_or_else(|| panic!("no hash on {screen:?}"));
    assert!(verifies(hash, "tty-s3cret"), "{screen:?}");

    // Two different entries: nothing printed, a clear reason, exit 1.
    let mut term = Terminal::start(&command).expect("script");
    term.wait_for("Password: ");
    term.type_line("first-pw");
    term.wait_for("Again: ");
    term.type_line("second-pw");
    let (screen, status) = term.finish();
    assert_eq!(status.code(), Some(1), "{screen:?}");
    assert!(screen.contains("the two passwords differ"), "{screen:?}");
    assert!(!screen.contains("$argon2id$"), "{screen:?}");
    assert!(!screen.contains("-pw"), "echoed: {screen:?}");
}

/// Issue 21 item 6: `smtp-once --help` lists every subcommand once, under
/// a group heading (serve, submit, operate, keys, bench), with a line
/// saying what it is for. The names come from the command definition, so
/// a new subcommand left out of the groups lands under "Other:" and fails
/// here.
#[test]
fn help_lists_every_subcommand_once_under_its_group() {
    use clap::CommandFactory;
    let out = Command::new(BIN)
        .arg("--help")
        .output()
        .expect("run --help");
    assert!(out.status.success(), "{out:?}");
    let help = text(&out.stdout);
    let headings = ["Serve:", "Submit:", "Operate:", "Keys:", "Bench:"];
    for h in headings {
        assert_eq!(
            help.lines().filter(|l| *l == h).count(),
            1,
            "heading {h}:\n{help}"
        );
    }
    assert!(
        !help.contains("Other:"),
        "a subcommand has no group:\n{help}"
    );
    assert!(
        !help.contains("\nCommands:"),
        "clap's flat list is gone:\n{help}"
    );
    let cli = smtp_once::cli::Cli::command();
    let names: Vec<&str> = cli
        .get_subcommands()
        .map(|c| c.get_name())
        .filter(|n| *n != "help")
        .collect();
    assert!(names.len() >= 14, "{names:?}");
    for name in names {
        let lines: Vec<&str> = help
            .lines()
            .filter(|l| l.split_whitespace().next() == Some(name))
            .collect();
        assert_eq!(lines.len(), 1, "`{name}` once:\n{help}");
        let about = lines[0].trim_start().trim_start_matches(name).trim();
        assert!(!about.is_empty(), "`{name}` has a line:\n{help}");
        // Under a heading: the nearest heading line above it is a group.
        let at = help.find(lines[0]).expect("line");
        let heading = help[..at]
            .lines()
            .rev()
            .find(|l| l.ends_with(':') && !l.starts_with(' '))
            .unwrap_or_default();
        assert!(headings.contains(&heading), "`{name}` under {heading:?}");
    }
}

/// Issue 21 item 6: the release binary was 123 MB because `[profile.release]`
/// carried `debug = 1`. Release ships without debuginfo (20 MB); the
/// symbols for perf live in `[profile.profiling]`, which benches/README.md
/// names.
#[test]
fn release_is_lean_and_profiling_keeps_the_symbols() {
    let manifest = std::fs::read_to_string(common::repo_path("Cargo.toml")).expect("Cargo.toml");
    let manifest: toml::Table = manifest.parse().expect("toml");
    let profile = |name: &str| manifest["profile"][name].as_table().cloned();
    let release = profile("release").expect("[profile.release]");
    let no_debug = |v: &toml::Value| {
        matches!(v, toml::Value::Integer(0) | toml::Value::Boolean(false))
            || v.as_str() == Some("none")
    };
    assert!(release.get("debug").is_none_or(no_debug), "{release:?}");
    assert!(
        matches!(
            release.get("strip").and_then(|s| s.as_str()),
            Some("debuginfo" | "symbols")
        ) || release.get("strip").and_then(|s| s.as_bool()) == Some(true),
        "{release:?}"
    );
    let profiling = profile("profiling").expect("[profile.profiling]");
    assert_eq!(profiling["inherits"].as_str(), Some("release"));
    assert!(!no_debug(&profiling["debug"]), "{profiling:?}");
    let readme = std::fs::read_to_string(common::repo_path("benches/README.md")).expect("readme");
    assert!(readme.contains("--profile profiling"));
}
