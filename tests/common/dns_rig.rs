//! A real DNS for the MX tests, from Debian's packages: Knot serves the
//! test zones on a free loopback port, signing those that ask for it with
//! DNSSEC, and Unbound validates on another port, with a trust anchor per
//! signed zone. The daemon under test is pointed at Unbound
//! (`relay.dns_servers`), exactly as a production relay is pointed at a
//! local validating resolver.
//!
//! A zone is `Secure` (signed, its DS as Unbound's anchor), `Insecure`
//! (unsigned, no anchor: answers come without AD) or `Bogus` (signed, but
//! Unbound holds a DS that does not match: every answer is SERVFAIL, as
//! for a forged one). Each test starts its own rig, so no cache is shared.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Signing {
    Secure,
    Insecure,
    Bogus,
}

pub(crate) struct Zone {
    pub name: String,
    pub signing: Signing,
    /// Zone-file lines after the SOA and NS, names relative to the zone.
    pub records: Vec<String>,
}

impl Zone {
    pub(crate) fn new(name: &str, signing: Signing, records: &[&str]) -> Zone {
        Zone {
            name: name.into(),
            signing,
            records: records.iter().map(|r| r.to_string()).collect(),
        }
    }
}

pub(crate) struct DnsRig {
    /// Unbound: what the daemon asks.
    pub resolver: SocketAddr,
    // Fields drop in order: Unbound stops before Knot.
    _unbound: Proc,
    _knot: Proc,
    dir: PathBuf,
}

/// A child process killed (and reaped) when dropped, even by a panic
/// half way through starting the rig.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

fn need(cmd: &str) -> PathBuf {
    for dir in ["/usr/sbin", "/usr/bin", "/sbin", "/bin"] {
        let p = Path::new(dir).join(cmd);
        if p.exists() {
            return p;
        }
    }
    panic!("{cmd} not found: scripts/test.sh installs knot and unbound");
}

fn wait_tcp(addr: SocketAddr, what: &str, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(
            Instant::now() < deadline,
            "{what} did not start on {addr}: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl DnsRig {
    pub(crate) fn start(dir: &Path, zones: &[Zone]) -> DnsRig {
        let dir = dir.join("dns");
        std::fs::create_dir_all(dir.join("kdb")).expect("dns dir");
        let (knot_port, unbound_port) = (free_port(), free_port());
        let mut knot_conf = format!(
            "server:\n    listen: 127.0.0.1@{knot_port}\n    rundir: {d}\n    user: root:root\n\
             database:\n    storage: {d}/kdb\n\
             log:\n  - target: stderr\n    any: info\n\
             policy:\n  - id: rig\n    algorithm: ecdsap256sha256\n    single-type-signing: on\n\
             template:\n  - id: default\n    storage: {d}\n    file: \"%s.zone\"\n    zonefile-sync: -1\n    journal-content: none\n\
             zone:\n",
            d = dir.display()
        );
        for z in zones {
            let mut text = format!(
                "$ORIGIN {n}.\n$TTL 300\n@ SOA ns.{n}. admin.{n}. 1 3600 600 86400 60\n@ NS ns.{n}.\nns A 127.0.0.1\n",
                n = z.name
            );
            for r in &z.records {
                text.push_str(r);
                text.push('\n');
            }
            std::fs::write(dir.join(format!("{}.zone", z.name)), text).expect("zone file");
            knot_conf.push_str(&format!("  - domain: {}\n", z.name));
            if z.signing != Signing::Insecure {
                knot_conf.push_str("    dnssec-signing: on\n    dnssec-policy: rig\n");
            }
        }
        let knot_path = dir.join("knot.conf");
        std::fs::write(&knot_path, knot_conf).expect("knot.conf");
        let knot_log = dir.join("knot.log");
        let knot = Proc(
            Command::new(need("knotd"))
                .arg("-c")
                .arg(&knot_path)
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&knot_log).expect("log"))
                .spawn()
                .expect("knotd"),
        );
        wait_tcp(
            SocketAddr::from(([127, 0, 0, 1], knot_port)),
            "knotd",
            &knot_log,
        );

        let mut unbound_conf = format!(
            "server:\n    interface: 127.0.0.1@{unbound_port}\n    port: {unbound_port}\n\
             do-not-query-localhost: no\n    username: \"\"\n    chroot: \"\"\n    directory: \"{d}\"\n\
             pidfile: \"{d}/unbound.pid\"\n    use-syslog: no\n    logfile: \"\"\n    verbosity: 1\n\
             do-ip6: no\n    module-config: \"validator iterator\"\n    val-log-level: 2\n\
             local-zone: \"test.\" nodefault\n    aggressive-nsec: no\n",
            d = dir.display()
        );
        for z in zones {
            match z.signing {
                Signing::Insecure => {}
                Signing::Secure => {
                    let ds = ds_of(&knot_path, &z.name);
                    unbound_conf.push_str(&format!("    trust-anchor: \"{ds}\"\n"));
                }
                Signing::Bogus => {
                    let ds = ds_of(&knot_path, &z.name);
                    unbound_conf.push_str(&format!("    trust-anchor: \"{}\"\n", corrupt(&ds)));
                }
            }
        }
        for z in zones {
            unbound_conf.push_str(&format!(
                "stub-zone:\n    name: \"{}\"\n    stub-addr: 127.0.0.1@{knot_port}\n",
                z.name
            ));
        }
        let unbound_path = dir.join("unbound.conf");
        std::fs::write(&unbound_path, unbound_conf).expect("unbound.conf");
        let unbound_log = dir.join("unbound.log");
        let unbound = Proc(
            Command::new(need("unbound"))
                .arg("-d")
                .arg("-c")
                .arg(&unbound_path)
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&unbound_log).expect("log"))
                .spawn()
                .expect("unbound"),
        );
        let resolver = SocketAddr::from(([127, 0, 0, 1], unbound_port));
        wait_tcp(resolver, "unbound", &unbound_log);
        DnsRig {
            resolver,
            _unbound: unbound,
            _knot: knot,
            dir,
        }
    }

    /// Replaces the `rtype` records at `owner` (relative to `zone`) with one
    /// of `rdata` and `ttl`, through knotc: Knot re-signs the zone.
    pub(crate) fn set(&self, zone: &str, owner: &str, ttl: u32, rtype: &str, rdata: &str) {
        let conf = self.dir.join("knot.conf");
        let knotc = |args: &[&str]| {
            let out = Command::new(need("knotc"))
                .arg("-c")
                .arg(&conf)
                .args(args)
                .output()
                .expect("knotc");
            assert!(
                out.status.success(),
                "knotc {args:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        };
        knotc(&["zone-begin", zone]);
        knotc(&["zone-unset", zone, owner, rtype]);
        knotc(&["zone-set", zone, owner, &ttl.to_string(), rtype, rdata]);
        knotc(&["zone-commit", zone]);
    }

    /// Knot's and Unbound's logs, for a failing assertion's message.
    pub(crate) fn logs(&self) -> String {
        let read = |f: &str| std::fs::read_to_string(self.dir.join(f)).unwrap_or_default();
        format!(
            "--- knot\n{}\n--- unbound\n{}",
            read("knot.log"),
            read("unbound.log")
        )
    }
}

/// The zone's first DS record, once Knot has made its key.
fn ds_of(knot_conf: &Path, zone: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = Command::new(need("keymgr"))
            .arg("-c")
            .arg(knot_conf)
            .arg(zone)
            .arg("ds")
            .output()
            .expect("keymgr");
        let text = String::from_utf8_lossy(&out.stdout);
        if let Some(line) = text.lines().find(|l| l.contains(" DS ")) {
            return line.trim().to_string();
        }
        assert!(Instant::now() < deadline, "no DS for {zone}: {text}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The same DS with its digest changed: the zone's signatures no longer
/// chain to the anchor, so the validator calls every answer bogus.
fn corrupt(ds: &str) -> String {
    let mut fields: Vec<String> = ds.split_whitespace().map(String::from).collect();
    if let Some(digest) = fields.last_mut() {
        let flipped: String = digest
            .chars()
            .map(|c| if c == '0' { '1' } else { '0' })
            .collect();
        *digest = flipped;
    }
    fields.join(" ")
}
