//! Storage faults against the real daemon: the data directory deleted or
//! moved while running, file modes whatever the umask, and a full disk on a
//! real (tmpfs) filesystem. Runs as root (mount); a test that cannot mount
//! fails rather than skips.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is the test failing

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{BIN, Client, Daemon, Options, message, wait_until};

const FAST: &str = "retry_schedule = [\"200ms\"]\npoll_interval = \"50ms\"\n";

async fn submit(d: &Daemon, key: Option<&str>, body: &str) -> common::Reply {
    let mut c = Client::login(d.plain, "bob").await;
    let r = c
        .submit(
            "bob@example.test",
            &["dest@example.net"],
            &message(key, body),
        )
        .await;
    c.quit().await;
    r
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

fn attempts_logged(d: &Daemon, id: &str) -> usize {
    d.log()
        .lines()
        .filter(|l| l.contains("delivery attempt") && l.contains(id))
        .count()
}

/// Starts the daemon again on its config, through `sh` so that it runs
/// under `umask`; the child is the daemon itself (`exec`).
fn respawn_with_umask(d: &mut Daemon, umask: &str) {
    d.kill9();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&d.stderr_path)
        .expect("log file");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "umask {umask} && exec \"$0\" serve --config \"$1\""
        ))
        .arg(BIN)
        .arg(&d.config_path)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("spawn smtp-once");
    let stdout = child.stdout.take().expect("stdout");
    d.child = Some(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut addrs = Vec::new();
    while addrs.len() < 3 {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("daemon did not start; log:\n{}", d.log()));
        if let Some(rest) = line.strip_prefix("smtp-once listening on ") {
            let addr = rest.split(' ').next().expect("addr");
            addrs.push(addr.parse().expect("socket addr"));
        }
    }
    (d.plain, d.starttls, d.implicit) = (addrs[0], addrs[1], addrs[2]);
    d.addrs = addrs;
}

// ------------------------------------------------ data directory removed

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_data_dir_refuses_mail_instead_of_losing_it() {
    // A smarthost nobody listens on: every attempt is deferred and retried
    // every 200 ms, so the log shows whether the worker still claims.
    let dead_port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let mut d = Daemon::start(Options {
        relay: Some(format!(
            "[relay]\nmode = \"smarthost\"\nsmarthost = \"127.0.0.1:{}\"\ntls = \"none\"\ntimeout = \"2s\"\n{FAST}",
            dead_port
        )),
        ..Options::default()
    });
    let before = submit(&d, Some("before-rm"), "one").await;
    assert!(!before.is_replay());
    assert_eq!(before.code, 250, "{before:?}");
    let id = before.queue_id().expect("queue id");
    wait_until("a few deferred attempts", 20, || {
        (attempts_logged(&d, &id) >= 2).then_some(())
    })
    .await;

    std::fs::remove_dir_all(d.data_dir()).expect("rm -rf data_dir");

    // Not even a replay: its message went with the directory.
    let again = submit(&d, Some("before-rm"), "one").await;
    assert_eq!(again.code, 451, "a replay after rm -rf: {again:?}");
    for i in 0..3 {
        let keyed = submit(&d, Some(&format!("after-rm-{i}")), "two").await;
        assert_eq!(keyed.code, 451, "keyed mail after rm -rf: {keyed:?}");
        assert!(keyed.has("E01033") && keyed.has("4.3.0"), "{keyed:?}");
        let unkeyed = submit(&d, None, "three").await;
        assert_eq!(unkeyed.code, 451, "unkeyed mail after rm -rf: {unkeyed:?}");
    }
    let data = d.data_dir().display().to_string();
    assert!(
        d.log()
            .lines()
            .any(|l| l.contains("ERROR") && l.contains(&data) && l.contains("gone")),
        "an error line names the data directory:\n{}",
        d.log()
    );

    // The delivery side stops claiming from the deleted database.
    wait_until("the worker to notice", 20, || {
        d.log()
            .lines()
            .any(|l| l.contains("ERROR") && l.contains("delivery paused"))
            .then_some(())
    })
    .await;
    let settled = attempts_logged(&d, &id);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        attempts_logged(&d, &id) <= settled + 1,
        "the worker kept claiming from the deleted database:\n{}",
        d.log()
    );

    // A restart starts on a new database; nothing that got a 250 after the
    // deletion was lost, because nothing got a 250.
    d.restart();
    assert_eq!(d.queue_count(), 0);
    let r = submit(&d, Some("after-restart"), "four").await;
    assert_eq!(r.code, 250, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moved_data_dir_refuses_until_it_is_back() {
    let mut d = Daemon::start(Options::default());
    let r = submit(&d, Some("m1"), "one").await;
    assert_eq!(r.code, 250, "{r:?}");
    let moved = d.dir.path().join("data.moved");
    std::fs::rename(d.data_dir(), &moved).expect("mv data_dir");
    let r = submit(&d, Some("m2"), "two").await;
    assert_eq!(r.code, 451, "while moved away: {r:?}");
    // Another database at the same path is not ours either.
    std::fs::create_dir(d.data_dir()).expect("mkdir");
    std::fs::write(d.data_dir().join("smtp-once.db"), b"").expect("empty db");
    let r = submit(&d, Some("m2"), "two").await;
    assert_eq!(r.code, 451, "with another file in its place: {r:?}");
    std::fs::remove_dir_all(d.data_dir()).expect("rm");
    std::fs::rename(&moved, d.data_dir()).expect("mv back");
    let r = submit(&d, Some("m3"), "three").await;
    assert_eq!(r.code, 250, "once the directory is back: {r:?}");
    d.restart();
    assert_eq!(d.queue_ids_for_key("m1").len(), 1);
    assert_eq!(d.queue_ids_for_key("m3").len(), 1);
    assert!(d.queue_ids_for_key("m2").is_empty());
}

// ------------------------------------------------------------ file modes

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_private_whatever_the_umask() {
    let mut d = Daemon::start(Options::default());
    d.kill9();
    std::fs::remove_dir_all(d.data_dir()).expect("rm data");
    let _ = std::fs::remove_dir_all(d.outbox());
    respawn_with_umask(&mut d, "000");
    let r = submit(&d, Some("modes-1"), "secret").await;
    assert_eq!(r.code, 250, "{r:?}");
    let id = r.queue_id().expect("queue id");
    let eml = d.outbox().join(format!("{id}.eml"));
    wait_until("the .eml", 20, || eml.exists().then_some(())).await;

    let data = d.data_dir();
    assert_eq!(mode(&data), 0o700, "data_dir");
    for f in [
        "smtp-once.db",
        "smtp-once.db-wal",
        "smtp-once.db-shm",
        "smtp-once.lock",
    ] {
        assert_eq!(mode(&data.join(f)), 0o600, "{f}");
    }
    assert_eq!(mode(&d.outbox()), 0o700, "outbox");
    assert_eq!(mode(&eml), 0o600, ".eml");

    // Looser modes from an earlier version or an operator's chmod: our
    // files are tightened; the folders (which may be shared with other
    // things) are left as set, with a warning.
    d.kill9();
    chmod(&data, 0o755);
    for f in ["smtp-once.db", "smtp-once.db-wal", "smtp-once.db-shm"] {
        if data.join(f).exists() {
            chmod(&data.join(f), 0o644);
        }
    }
    chmod(&data.join("smtp-once.lock"), 0o666);
    chmod(&d.outbox(), 0o777);
    respawn_with_umask(&mut d, "000");
    let r = submit(&d, Some("modes-2"), "secret").await;
    assert_eq!(r.code, 250, "{r:?}");
    let id = r.queue_id().expect("queue id");
    let eml = d.outbox().join(format!("{id}.eml"));
    wait_until("the .eml", 20, || eml.exists().then_some(())).await;
    assert_eq!(mode(&data), 0o755, "data_dir left as the operator set it");
    for f in [
        "smtp-once.db",
        "smtp-once.db-wal",
        "smtp-once.db-shm",
        "smtp-once.lock",
    ] {
        assert_eq!(mode(&data.join(f)), 0o600, "{f} tightened");
    }
    assert_eq!(
        mode(&d.outbox()),
        0o777,
        "outbox left as the operator set it"
    );
    assert_eq!(mode(&eml), 0o600, ".eml");
    for (folder, mode) in [(d.outbox(), "0777"), (data, "0755")] {
        let folder = folder.display().to_string();
        assert!(
            d.log()
                .lines()
                .any(|l| l.contains("WARN") && l.contains(&folder) && l.contains(mode)),
            "a warning names {folder}:\n{}",
            d.log()
        );
    }
}

/// In a data directory other users can write to, a lock or database
/// name planted as a symlink must not make the daemon chmod or open the
/// target: it refuses to start and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_planted_in_a_shared_data_dir_is_refused() {
    let mut d = Daemon::start(Options::default());
    d.kill9();
    let data = d.data_dir();
    std::fs::remove_dir_all(&data).expect("rm data");
    std::fs::create_dir(&data).expect("mkdir");
    chmod(&data, 0o777);
    let victim = d.dir.path().join("victim");
    std::fs::write(&victim, b"precious").expect("victim");
    chmod(&victim, 0o644);
    for planted in ["smtp-once.lock", "smtp-once.db"] {
        let link = data.join(planted);
        std::os::unix::fs::symlink(&victim, &link).expect("plant");
        let mut child = Command::new(BIN)
            .args(["serve", "--config"])
            .arg(&d.config_path)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stderr = String::new();
        if let Some(mut e) = child.stderr.take() {
            use std::io::Read;
            let _ = e.read_to_string(&mut stderr);
        }
        assert!(
            status.is_some_and(|s| !s.success()),
            "started over a planted {planted}: {stderr}"
        );
        assert!(
            stderr.contains(planted) && stderr.contains("symlink"),
            "{stderr}"
        );
        assert_eq!(mode(&victim), 0o644, "{planted}: the target's mode");
        assert_eq!(
            std::fs::read_to_string(&victim).expect("victim"),
            "precious"
        );
        std::fs::remove_file(&link).expect("unplant");
    }
}

/// A local user who can write to a shared outbox plants the temporary
/// name of a message (its queue id is in the 250) as a symlink: the daemon
/// must not write the message through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_planted_in_the_outbox_is_not_followed() {
    let d = Daemon::start(Options {
        extra: FAST.to_string(),
        ..Options::default()
    });
    let outbox = d.outbox();
    let away = d.dir.path().join("outbox.away");
    std::fs::rename(&outbox, &away).expect("mv outbox");
    std::fs::write(&outbox, b"not a folder").expect("block the outbox");
    let r = submit(&d, Some("planted"), "secret").await;
    assert_eq!(r.code, 250, "{r:?}");
    let id = r.queue_id().expect("queue id");
    wait_until("a deferred attempt", 20, || {
        (attempts_logged(&d, &id) >= 1).then_some(())
    })
    .await;

    let victim = d.dir.path().join("victim");
    std::fs::write(&victim, b"precious").expect("victim");
    std::fs::remove_file(&outbox).expect("unblock");
    std::os::unix::fs::symlink(&victim, away.join(format!(".{id}.eml.tmp"))).expect("plant");
    std::fs::rename(&away, &outbox).expect("mv back");

    let eml = outbox.join(format!("{id}.eml"));
    wait_until("the .eml", 20, || eml.exists().then_some(())).await;
    assert_eq!(
        std::fs::read_to_string(&victim).expect("victim"),
        "precious",
        "written through the symlink"
    );
    let meta = std::fs::symlink_metadata(&eml).expect("eml");
    assert!(meta.file_type().is_file(), "{id}.eml is a regular file");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
}

// ------------------------------------------------------------- full disk

/// A tmpfs mounted for the test, detached on drop (lazily: the daemon may
/// still hold files open).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).expect("mount point");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "this test needs `mount -t tmpfs` (root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Writes zeros until the filesystem is full.
fn fill(path: &Path) {
    let mut f = std::fs::File::create(path).expect("filler");
    let chunk = vec![0u8; 16 * 1024];
    while f.write_all(&chunk).is_ok() {}
    while f.write_all(&chunk[..512]).is_ok() {}
    let _ = f.sync_all();
}

/// The disk fills while a long read (a backup, say) holds back WAL
/// checkpoints, so the WAL holds more than is later freed; one delivery
/// waits to be recorded meanwhile. Freeing 2 MiB must bring 250s back at
/// once and let that record land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_disk_recovers_as_soon_as_space_is_back() {
    let mut d = Daemon::start(Options {
        extra: format!("{FAST}delivery_test_pause_after_send = \"6s\"\n"),
        ..Options::default()
    });
    d.kill9();
    std::fs::remove_dir_all(d.data_dir()).expect("rm data");
    let mount = Tmpfs::mount(&d.data_dir(), "16m");
    d.spawn();

    let reader = d.db();
    reader.execute_batch("BEGIN").expect("begin");
    let _: i64 = reader
        .query_row("SELECT COUNT(*) FROM queue", [], |r| r.get(0))
        .expect("read");

    // Delivered (the .eml is on another filesystem), then the worker
    // pauses before recording; the disk fills meanwhile.
    let r = submit(&d, Some("in-flight"), "delivered while full").await;
    assert_eq!(r.code, 250, "{r:?}");
    let in_flight = r.queue_id().expect("queue id");
    let mut accepted = vec![in_flight.clone()];
    wait_until("the in-flight delivery", 20, || {
        d.log().contains("test pause after send").then_some(())
    })
    .await;
    let big = "x".repeat(500_000);
    for i in 0..8 {
        let r = submit(&d, Some(&format!("big-{i}")), &big).await;
        assert_eq!(r.code, 250, "{r:?}");
        accepted.push(r.queue_id().expect("queue id"));
    }
    let two_mib = mount.0.join("two-mib");
    std::fs::write(&two_mib, vec![0u8; 2 << 20]).expect("2 MiB");
    let filler = mount.0.join("filler");
    fill(&filler);
    reader.execute_batch("COMMIT").expect("end the long read");
    drop(reader);

    let mut refused = None;
    for i in 0..50 {
        let r = submit(&d, Some(&format!("full-{i}")), "small").await;
        match r.code {
            250 => accepted.push(r.queue_id().expect("queue id")),
            451 => {
                refused = Some(r);
                break;
            }
            _ => panic!("unexpected reply on a full disk: {r:?}"),
        }
    }
    let refused = refused.expect("a full disk gives a 451");
    assert!(refused.has("4.3.0"), "{refused:?}");
    wait_until("the record to fail on the full disk", 30, || {
        d.log().contains("cannot record delivery").then_some(())
    })
    .await;
    // Longer than a few quick retries of the record.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let state: String = d
        .db()
        .query_row("SELECT state FROM queue WHERE id = ?1", [&in_flight], |r| {
            r.get(0)
        })
        .expect("row");
    assert_eq!(state, "delivering", "the record cannot land while full");

    std::fs::remove_file(&two_mib).expect("free 2 MiB");
    let freed = Instant::now();
    let mut first_250 = None;
    while freed.elapsed() < Duration::from_secs(30) {
        let r = submit(&d, Some("after-free"), "space is back").await;
        if r.code == 250 {
            first_250 = Some(freed.elapsed());
            accepted.push(r.queue_id().expect("queue id"));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let first_250 = first_250
        .unwrap_or_else(|| panic!("no 250 within 30 s of freeing 2 MiB; log:\n{}", d.log()));
    let recorded = wait_until("the in-flight message to leave delivering", 30, || {
        let (state, attempts): (String, i64) = d
            .db()
            .query_row(
                "SELECT state, attempts FROM queue WHERE id = ?1",
                [&in_flight],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .expect("row");
        (state != "delivering").then_some((state, attempts, freed.elapsed()))
    })
    .await;
    println!(
        "figures: first 250 {first_250:?} after freeing 2 MiB; the pending record landed after {:?}",
        recorded.2
    );
    assert_eq!(
        (recorded.0.as_str(), recorded.1),
        ("delivered", 1),
        "delivered once, recorded once"
    );

    // Everything that got a 250 is kept and delivered, the in-flight
    // message exactly once.
    std::fs::remove_file(&filler).expect("free the rest");
    for id in &accepted {
        wait_until(&format!("{id} delivered"), 60, || {
            let state: String = d
                .db()
                .query_row("SELECT state FROM queue WHERE id = ?1", [id], |r| r.get(0))
                .expect("row");
            (state == "delivered").then_some(())
        })
        .await;
        assert!(d.outbox().join(format!("{id}.eml")).exists(), "{id}");
    }
    assert_eq!(attempts_logged(&d, &in_flight), 1, "{}", d.log());
    let temps: Vec<_> = std::fs::read_dir(d.outbox())
        .expect("outbox")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(temps.is_empty(), "temporary files left: {temps:?}");
}

/// A restart while the disk is full (a crash, or an operator restarting
/// to "fix" it) must come up answering 451, then take back the leases of
/// the previous run and deliver as soon as there is room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_on_a_full_disk_comes_up_and_recovers() {
    let mut d = Daemon::start(Options {
        extra: format!("{FAST}delivery_test_pause_after_send = \"30s\"\n"),
        ..Options::default()
    });
    d.kill9();
    std::fs::remove_dir_all(d.data_dir()).expect("rm data");
    let mount = Tmpfs::mount(&d.data_dir(), "4m");
    d.spawn();
    let r = submit(&d, Some("leased"), "killed mid-delivery").await;
    assert_eq!(r.code, 250, "{r:?}");
    let id = r.queue_id().expect("queue id");
    wait_until("the delivery", 20, || {
        d.log().contains("test pause after send").then_some(())
    })
    .await;
    d.kill9(); // leaves the message `delivering` under a 30-minute lease
    let filler = mount.0.join("filler");
    fill(&filler);

    // Without the pause this time: the next delivery records at once.
    let config = std::fs::read_to_string(&d.config_path).expect("config");
    let config = config.replace("delivery_test_pause_after_send = \"30s\"\n", "");
    std::fs::write(&d.config_path, config).expect("config");
    d.spawn();
    let r = submit(&d, Some("while-full"), "full").await;
    assert_eq!(r.code, 451, "{r:?}");

    std::fs::remove_file(&filler).expect("free the space");
    let freed = Instant::now();
    let r = loop {
        let r = submit(&d, Some("after-free"), "space is back").await;
        if r.code == 250 || freed.elapsed() > Duration::from_secs(30) {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(r.code, 250, "{r:?}");
    let eml = d.outbox().join(format!("{id}.eml"));
    wait_until("the leased message to be delivered", 30, || {
        let state: String = d
            .db()
            .query_row("SELECT state FROM queue WHERE id = ?1", [&id], |r| r.get(0))
            .expect("row");
        (state == "delivered").then_some(())
    })
    .await;
    assert!(eml.exists());
    println!(
        "figure: leased message of the previous run delivered {:?} after freeing space",
        freed.elapsed()
    );
}
