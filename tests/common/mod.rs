//! Test harness: the real `smtp-once` binary on ephemeral loopback ports with
//! a real SQLite file in a temporary folder, and a small SMTP client over
//! real TCP and TLS (trusting the dev certificate in `certs/`).
#![allow(dead_code)]

pub(crate) mod dns_rig;
pub(crate) mod http;
pub(crate) mod in_process;
pub(crate) mod mx_host;
pub(crate) mod pg;
pub(crate) mod policy_server;
pub(crate) mod tiny;
pub(crate) mod webhook;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_smtp-once");

/// Test accounts: (name, password, workspace, allowed_senders).
pub(crate) const USERS: &[(&str, &str, &str, Option<&str>)] = &[
    ("alice", "alice-pw", "acme", Some("*@example.test")),
    ("bob", "bob-pw", "acme", None),
    ("carol", "carol-pw", "globex", None),
];

fn user_hashes() -> &'static Vec<String> {
    static HASHES: OnceLock<Vec<String>> = OnceLock::new();
    HASHES.get_or_init(|| {
        USERS
            .iter()
            .map(|(_, pw, _, _)| smtp_once::auth::hash_password(pw).expect("hash"))
            .collect()
    })
}

#[derive(Clone)]
pub(crate) struct Options {
    pub retention: String,
    pub purge_interval: String,
    pub max_message_size: usize,
    pub max_recipients: usize,
    pub max_connections: usize,
    pub command_timeout: String,
    pub allow_plaintext: bool,
    pub trusted_network: Option<(&'static str, &'static str)>,
    pub extra: String,
    /// Lines inside `[auth]` (other sections can go in `extra`).
    pub auth_extra: String,
    /// Lines inside `[idempotency]`.
    pub idempotency_extra: String,
    /// Replaces the whole `[relay]` section (default: file mode into
    /// `outbox/`); `extra` is appended after it either way.
    pub relay: Option<String>,
    /// A fixed address for the plaintext listener (default: ephemeral).
    pub plain_addr: Option<String>,
    /// Extra environment for the daemon process (e.g. `TOKIO_WORKER_THREADS`).
    pub env: Vec<(&'static str, &'static str)>,
    /// Global flags before `serve` (e.g. `--log-format json`).
    pub global_args: Vec<&'static str>,
    /// Where the ledger and queue live (default: SQLite in the data
    /// directory, or a fresh PostgreSQL database under
    /// `SMTP_ONCE_TEST_STORE=postgres`).
    pub store: Store,
    /// `[server] node_id`.
    pub node_id: Option<String>,
}

/// The store a test daemon runs on.
#[derive(Clone, Default)]
pub(crate) enum Store {
    /// SQLite, or PostgreSQL when `SMTP_ONCE_TEST_STORE=postgres`.
    #[default]
    FromEnv,
    /// SQLite whatever the environment says.
    Sqlite,
    /// This database (several daemons can share one).
    Postgres(Arc<pg::TestDb>),
}

impl Default for Options {
    fn default() -> Self {
        Self {
            retention: "3h".into(),
            purge_interval: "60s".into(),
            max_message_size: 1_000_000,
            max_recipients: 10,
            max_connections: 100,
            command_timeout: "5m".into(),
            allow_plaintext: true,
            trusted_network: None,
            extra: String::new(),
            auth_extra: String::new(),
            idempotency_extra: String::new(),
            relay: None,
            plain_addr: None,
            env: Vec::new(),
            global_args: Vec::new(),
            store: Store::FromEnv,
            node_id: None,
        }
    }
}

pub(crate) struct Daemon {
    pub child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub config_path: PathBuf,
    /// Plaintext listener (AUTH allowed there when `allow_plaintext`).
    pub plain: SocketAddr,
    pub starttls: SocketAddr,
    pub implicit: SocketAddr,
    /// Every bound listener, in the order of the config file.
    pub addrs: Vec<SocketAddr>,
    /// The HTTP API's address, when the config has `[http]`.
    pub http: Option<SocketAddr>,
    pub stderr_path: PathBuf,
    pub env: Vec<(&'static str, &'static str)>,
    /// The `[metrics]` listener, when the config has one ("smtp-once
    /// metrics on ADDR", printed before the listening lines).
    pub metrics: Option<SocketAddr>,
    pub global_args: Vec<&'static str>,
    /// The PostgreSQL database this daemon uses, if any (SQLite otherwise).
    pub pg: Option<Arc<pg::TestDb>>,
}

pub(crate) fn repo_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

impl Daemon {
    pub(crate) fn start(mut options: Options) -> Daemon {
        let dir = tempfile::tempdir().expect("tempdir");
        if matches!(options.store, Store::FromEnv) && pg::enabled_by_env() {
            options.store = Store::Postgres(Arc::new(pg::TestDb::create()));
        }
        let text = config_text(&options, dir.path());
        let mut d = Self::prepare(dir, &text, options.env, options.global_args);
        if let Store::Postgres(db) = options.store {
            d.pg = Some(db);
        }
        d.spawn();
        d
    }

    /// Runs the binary on `text` as its config file, in `dir`. Listener
    /// addresses in the order of the file are in `addrs`.
    pub(crate) fn with_config(dir: tempfile::TempDir, text: &str) -> Daemon {
        Self::with_config_args(dir, text, Vec::new(), Vec::new())
    }

    fn with_config_args(
        dir: tempfile::TempDir,
        text: &str,
        env: Vec<(&'static str, &'static str)>,
        global_args: Vec<&'static str>,
    ) -> Daemon {
        let mut d = Self::prepare(dir, text, env, global_args);
        d.spawn();
        d
    }

    fn prepare(
        dir: tempfile::TempDir,
        text: &str,
        env: Vec<(&'static str, &'static str)>,
        global_args: Vec<&'static str>,
    ) -> Daemon {
        let config_path = dir.path().join("smtp-once.toml");
        std::fs::write(&config_path, text).expect("write config");
        Daemon {
            addrs: Vec::new(),
            http: None,
            child: None,
            stderr_path: dir.path().join("daemon.log"),
            dir,
            config_path,
            plain: "127.0.0.1:1".parse().expect("addr"),
            starttls: "127.0.0.1:1".parse().expect("addr"),
            implicit: "127.0.0.1:1".parse().expect("addr"),
            env,
            metrics: None,
            global_args,
            pg: None,
        }
    }

    pub(crate) fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Where the default `[relay]` (file mode) writes messages.
    pub(crate) fn outbox(&self) -> PathBuf {
        self.dir.path().join("outbox")
    }

    /// Starts the binary on the existing config and data directory and
    /// waits until every listener is bound.
    pub(crate) fn spawn(&mut self) {
        // Fresh ephemeral ports each time: rewrite listener addresses to :0.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.stderr_path)
            .expect("log file");
        let mut child = Command::new(BIN)
            .args(&self.global_args)
            .args(["serve", "--config"])
            .arg(&self.config_path)
            .env("RUST_LOG", "info")
            .envs(self.env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("spawn smtp-once");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let config_text = std::fs::read_to_string(&self.config_path).expect("config");
        let want = config_text.matches("[[listener]]").count();
        let want_http = config_text.contains("\n[http]");
        let mut addrs = Vec::new();
        let mut http = None;
        while addrs.len() < want || (want_http && http.is_none()) {
            let line = rx
                .recv_timeout(Duration::from_secs(20))
                .unwrap_or_else(|_| panic!("daemon did not start; log:\n{}", self.log()));
            if let Some(rest) = line.strip_prefix("smtp-once metrics on ") {
                self.metrics = Some(rest.trim().parse::<SocketAddr>().expect("metrics addr"));
            }
            if let Some(rest) = line.strip_prefix("smtp-once listening on ") {
                let addr = rest.split(' ').next().expect("addr");
                addrs.push(addr.parse::<SocketAddr>().expect("socket addr"));
            }
            if let Some(rest) = line.strip_prefix("smtp-once http on ") {
                http = Some(rest.trim().parse::<SocketAddr>().expect("http addr"));
            }
        }
        if let [plain, starttls, implicit] = addrs[..] {
            (self.plain, self.starttls, self.implicit) = (plain, starttls, implicit);
        }
        self.addrs = addrs;
        self.http = http;
        self.child = Some(child);
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// After `kill9`: starts again on the same data directory with
    /// `relay.delivery_test_pause_after_send = "60s"` taken out of its
    /// config, so the repeated attempt runs to its record.
    pub(crate) fn respawn_without_test_pause(&mut self) {
        let config = std::fs::read_to_string(&self.config_path).expect("config");
        std::fs::write(
            &self.config_path,
            config.replace("delivery_test_pause_after_send = \"60s\"\n", ""),
        )
        .expect("config");
        self.spawn();
    }

    pub(crate) fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill(); // SIGKILL
            let _ = child.wait();
        }
    }

    /// Sends SIGTERM without waiting.
    pub(crate) fn signal_term(&self) {
        let child = self.child.as_ref().expect("running daemon");
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// SIGTERM, then wait for a clean exit.
    pub(crate) fn terminate(&mut self) -> std::process::ExitStatus {
        self.signal_term();
        self.wait_exit()
    }

    /// Waits (up to 30 s) for the daemon process to exit.
    pub(crate) fn wait_exit(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running daemon");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "daemon did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(crate) fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// The SQLite database (a daemon on PostgreSQL has none: see `pg`).
    pub(crate) fn db(&self) -> rusqlite::Connection {
        assert!(
            self.pg.is_none(),
            "this daemon runs on PostgreSQL ({}): use `pg` or `count`",
            self.pg.as_ref().map_or("", |db| db.name.as_str())
        );
        let conn =
            rusqlite::Connection::open(self.data_dir().join("smtp-once.db")).expect("open db");
        conn.busy_timeout(Duration::from_secs(10))
            .expect("busy timeout");
        conn
    }

    /// The one integer of a query such as `SELECT COUNT(*) FROM ...`
    /// (SQL that SQLite and PostgreSQL both read), on this daemon's store.
    pub(crate) fn count(&self, sql: &str) -> i64 {
        match &self.pg {
            Some(db) => pg::block_on(db.count(sql)),
            None => self
                .db()
                .query_row(sql, [], |r| r.get(0))
                .unwrap_or_else(|e| panic!("{sql}: {e}")),
        }
    }

    /// Runs SQL (statements separated by `;`) on this daemon's store.
    pub(crate) fn execute(&self, sql: &str) {
        match &self.pg {
            Some(db) => pg::block_on(db.execute(sql)),
            None => self
                .db()
                .execute_batch(sql)
                .unwrap_or_else(|e| panic!("{sql}: {e}")),
        }
    }

    /// Makes the ledger unreadable (every lookup and insert fails) until
    /// [`Daemon::restore_ledger`]: PostgreSQL's table, or SQLite's view over
    /// its partitions, renamed `ledger_gone`.
    /// Every way to the ledger gone: on SQLite its two views, `ledger` (the
    /// operators') and `ledger_indexed` (which acceptance searches beside
    /// its staged entries).
    pub(crate) fn hide_ledger(&self) {
        self.rename_ledger("ledger", "ledger_gone");
        if self.pg.is_none() {
            self.rename_ledger("ledger_indexed", "ledger_indexed_gone");
        }
    }

    pub(crate) fn restore_ledger(&self) {
        self.rename_ledger("ledger_gone", "ledger");
        if self.pg.is_none() {
            self.rename_ledger("ledger_indexed_gone", "ledger_indexed");
        }
    }

    fn rename_ledger(&self, from: &str, to: &str) {
        if self.pg.is_some() {
            return self.execute(&format!("ALTER TABLE {from} RENAME TO {to}"));
        }
        // SQLite renames no view: the same view again under the new name.
        let db = self.db();
        let sql: String = db
            .query_row(
                "SELECT sql FROM sqlite_schema WHERE type = 'view' AND name = ?1",
                [from],
                |r| r.get(0),
            )
            .unwrap_or_else(|e| panic!("view {from}: {e}"));
        let renamed = sql.replacen(&format!("VIEW {from} "), &format!("VIEW {to} "), 1);
        db.execute_batch(&format!("DROP VIEW {from}; {renamed};"))
            .unwrap_or_else(|e| panic!("rename view {from}: {e}"));
    }

    pub(crate) fn queue_count(&self) -> i64 {
        self.count("SELECT COUNT(*) FROM queue")
    }

    pub(crate) fn queue_ids_for_key(&self, key: &str) -> Vec<String> {
        if let Some(db) = &self.pg {
            return pg::block_on(db.queue_ids_for_key(key));
        }
        let db = self.db();
        let mut stmt = db
            .prepare("SELECT id FROM queue WHERE idempotency_key = ?1 ORDER BY id")
            .expect("prepare");
        stmt.query_map([key], |r| r.get(0))
            .expect("query")
            .map(|r| r.expect("row"))
            .collect()
    }

    /// Runs the CLI against this daemon's config.
    pub(crate) fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(BIN)
            .args(args)
            .arg("--config")
            .arg(&self.config_path)
            .output()
            .expect("run cli")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The HTTP API token of a test account (its hash is in the config).
pub(crate) fn api_token(user: &str) -> String {
    format!("so_test_token_of_{user}")
}

/// The API token of `olga`, the operator account `operator_user` adds.
pub(crate) const OPERATOR_TOKEN: &str = "so_test_token_of_olga_the_operator";

/// An operator account (`role = "operator"`, workspace `ops`, password
/// `olga-pw`, API key `OPERATOR_TOKEN`) beside the usual test users: TOML
/// to append to a config.
pub(crate) fn operator_user() -> String {
    let hash = smtp_once::auth::hash_password("olga-pw").expect("hash");
    format!(
        "\n[[user]]\nname = \"olga\"\npassword_hash = \"{hash}\"\nworkspace = \"ops\"\n\
         role = \"operator\"\napi_key_hash = \"{}\"\n",
        api_key_hash(OPERATOR_TOKEN)
    )
}

fn api_key_hash(token: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The config file `Daemon::start` writes for `o` in `dir`.
pub(crate) fn config_text(o: &Options, dir: &Path) -> String {
    let mut users = String::new();
    for ((name, _, workspace, senders), hash) in USERS.iter().zip(user_hashes()) {
        users.push_str(&format!(
            "[[user]]\nname = \"{name}\"\npassword_hash = \"{hash}\"\nworkspace = \"{workspace}\"\n\
             api_key_hash = \"{}\"\n",
            api_key_hash(&api_token(name))
        ));
        if let Some(s) = senders {
            users.push_str(&format!("allowed_senders = [\"{s}\"]\n"));
        }
    }
    let mut relay = o.relay.clone().unwrap_or_else(|| {
        format!(
            "[relay]\nmode = \"file\"\ndir = \"{}\"",
            dir.join("outbox").display()
        )
    });
    // Tests read the stored message after its delivery: keep bodies
    // unless the test sets `keep_bodies` itself.
    if !relay.contains("keep_bodies") {
        relay.push_str("\nkeep_bodies = true\n");
    }
    let plain_addr = o.plain_addr.as_deref().unwrap_or("127.0.0.1:0");
    let node_id = o
        .node_id
        .as_ref()
        .map(|n| format!("node_id = \"{n}\"\n"))
        .unwrap_or_default();
    let store = match &o.store {
        Store::Postgres(db) => db.store_section(),
        Store::FromEnv | Store::Sqlite => String::new(),
    };
    let trusted = o
        .trusted_network
        .map(|(cidr, ws)| format!("[[trusted_network]]\ncidr = \"{cidr}\"\nworkspace = \"{ws}\"\n"))
        .unwrap_or_default();
    format!(
        r#"[server]
hostname = "relay.test"
data_dir = "{data}"
max_message_size = {size}
max_recipients = {rcpts}
max_connections = {conns}
command_timeout = "{timeout}"
shutdown_grace = "10s"
{node_id}
[[listener]]
addr = "{plain_addr}"
tls = "none"

[[listener]]
addr = "127.0.0.1:0"
tls = "starttls"

[[listener]]
addr = "127.0.0.1:0"
tls = "implicit"

[tls]
cert = "{cert}"
key = "{key}"

[auth]
allow_plaintext = {plain}
{auth_extra}

{users}
{trusted}
[idempotency]
retention = "{retention}"
purge_interval = "{purge}"
{idempotency_extra}

{relay}
{extra}
{store}"#,
        data = dir.join("data").display(),
        size = o.max_message_size,
        rcpts = o.max_recipients,
        conns = o.max_connections,
        timeout = o.command_timeout,
        cert = repo_path("certs/dev-cert.pem").display(),
        key = repo_path("certs/dev-key.pem").display(),
        plain = o.allow_plaintext,
        retention = o.retention,
        purge = o.purge_interval,
        extra = o.extra,
        auth_extra = o.auth_extra,
        idempotency_extra = o.idempotency_extra,
    )
}

/// Runs `smtp-once check-config --config PATH`: whether it passed, and
/// its stdout and stderr together.
pub(crate) fn check_config(path: &Path) -> (bool, String) {
    let out = Command::new(BIN)
        .args(["check-config", "--config"])
        .arg(path)
        .output()
        .expect("run check-config");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Runs one of the tests' own servers on `bind`, on a thread with its own
/// runtime (so it outlives no test runtime and needs none): every accepted
/// connection is handed to `on_connection`, whose future runs as a task.
/// Returns the bound address.
pub(crate) fn spawn_server<A, F, Fut>(bind: A, on_connection: F) -> SocketAddr
where
    A: std::net::ToSocketAddrs,
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = std::net::TcpListener::bind(bind).expect("bind test server");
    listener.set_nonblocking(true).expect("nonblocking");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(on_connection(stream));
            }
        });
    });
    addr
}

/// For the tests' own SMTP servers: the DATA body up to the lone dot,
/// dot-unstuffed; `None` if the client hung up first.
/// A next hop that holds every connection open, saying nothing, until
/// `open` turns true; then it closes each one at once (the attempt is
/// deferred).
pub(crate) fn stalling_next_hop() -> (u16, tokio::sync::watch::Sender<bool>) {
    let (open, opened) = tokio::sync::watch::channel(false);
    let addr = spawn_server("127.0.0.1:0", move |mut stream: tokio::net::TcpStream| {
        let mut opened = opened.clone();
        async move {
            let _ = opened.wait_for(|o| *o).await;
            let _ = tokio::io::AsyncWriteExt::shutdown(&mut stream).await;
        }
    });
    (addr.port(), open)
}

pub(crate) async fn read_data_body<R: tokio::io::AsyncBufRead + Unpin>(
    r: &mut R,
) -> std::io::Result<Option<Vec<u8>>> {
    use tokio::io::AsyncBufReadExt;
    let mut data = Vec::new();
    loop {
        let mut l = Vec::new();
        if r.read_until(b'\n', &mut l).await? == 0 {
            return Ok(None);
        }
        if l == b".\r\n" {
            return Ok(Some(data));
        }
        data.extend_from_slice(l.strip_prefix(b".").unwrap_or(&l));
    }
}

/// Polls `f` every 25 ms until it gives a value; fails the test after `secs`.
pub(crate) async fn wait_until<T>(what: &str, secs: u64, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

// ---------------------------------------------------------------- client

pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

#[derive(Debug, Clone)]
pub(crate) struct Reply {
    pub code: u16,
    pub lines: Vec<String>,
    pub raw: String,
}

impl Reply {
    pub(crate) fn last(&self) -> &str {
        self.lines.last().map_or("", String::as_str)
    }
    pub(crate) fn has(&self, needle: &str) -> bool {
        self.raw.contains(needle)
    }
    pub(crate) fn is_replay(&self) -> bool {
        self.lines
            .first()
            .is_some_and(|l| l.contains("Idempotency-Replay: true"))
    }
    /// The queue id from `... queued as ID`.
    pub(crate) fn queue_id(&self) -> Option<String> {
        self.last()
            .split("queued as ")
            .nth(1)
            .map(|s| s.trim().to_string())
    }
}

pub(crate) struct Client {
    io: Option<Box<dyn Io>>,
    buf: Vec<u8>,
    pub greeting: Reply,
}

pub(crate) fn tls_connector() -> tokio_rustls::TlsConnector {
    let pem = std::fs::read(repo_path("certs/dev-cert.pem")).expect("dev cert");
    let mut roots = rustls::RootCertStore::empty();
    use rustls_pki_types::pem::PemObject;
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(&pem) {
        roots.add(cert.expect("pem")).expect("add root");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

async fn tls_wrap(tcp: Box<dyn Io>) -> Box<dyn Io> {
    let name = rustls_pki_types::ServerName::try_from("relay.example.test").expect("name");
    let tls = tls_connector()
        .connect(name, tcp)
        .await
        .expect("TLS handshake");
    Box::new(tls)
}

impl Client {
    pub(crate) async fn connect(addr: SocketAddr) -> Client {
        let tcp = TcpStream::connect(addr).await.expect("connect");
        Self::over(Box::new(tcp)).await
    }

    pub(crate) async fn connect_implicit_tls(addr: SocketAddr) -> Client {
        let tcp = TcpStream::connect(addr).await.expect("connect");
        Self::over(tls_wrap(Box::new(tcp)).await).await
    }

    async fn over(io: Box<dyn Io>) -> Client {
        let mut c = Client {
            io: Some(io),
            buf: Vec::new(),
            greeting: Reply {
                code: 0,
                lines: vec![],
                raw: String::new(),
            },
        };
        c.greeting = c.read_reply().await;
        assert_eq!(c.greeting.code, 220, "greeting {:?}", c.greeting);
        c
    }

    fn io(&mut self) -> &mut Box<dyn Io> {
        self.io.as_mut().expect("connection open")
    }

    pub(crate) async fn send(&mut self, bytes: &[u8]) {
        let io = self.io();
        io.write_all(bytes).await.expect("write");
        io.flush().await.expect("flush");
    }

    /// Like `send`, but reports a dropped connection instead of panicking.
    pub(crate) async fn send_checked(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        let io = self
            .io
            .as_mut()
            .ok_or_else(|| std::io::Error::other("closed"))?;
        io.write_all(bytes).await?;
        io.flush().await
    }

    /// Reads one complete (possibly multi-line) reply.
    pub(crate) async fn read_reply(&mut self) -> Reply {
        self.try_read_reply().await.expect("reply before EOF")
    }

    pub(crate) async fn try_read_reply(&mut self) -> Option<Reply> {
        let mut lines = Vec::new();
        let mut raw = String::new();
        loop {
            let pos = loop {
                if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                    break pos;
                }
                let mut chunk = [0u8; 4096];
                let n = tokio::time::timeout(Duration::from_secs(30), self.io().read(&mut chunk))
                    .await
                    .expect("reply within 30s")
                    .ok()?;
                if n == 0 {
                    return None;
                }
                self.buf.extend_from_slice(&chunk[..n]);
            };
            let line: Vec<u8> = self.buf.drain(..=pos).collect();
            let line = String::from_utf8_lossy(&line).into_owned();
            raw.push_str(&line);
            let trimmed = line.trim_end().to_string();
            let last = trimmed.as_bytes().get(3) != Some(&b'-');
            lines.push(trimmed);
            if last {
                let code = lines[0].get(..3).and_then(|c| c.parse().ok()).unwrap_or(0);
                return Some(Reply { code, lines, raw });
            }
        }
    }

    pub(crate) async fn cmd(&mut self, line: &str) -> Reply {
        self.send(format!("{line}\r\n").as_bytes()).await;
        self.read_reply().await
    }

    pub(crate) async fn ehlo(&mut self) -> Reply {
        let r = self.cmd("EHLO client.test").await;
        assert_eq!(r.code, 250, "{r:?}");
        r
    }

    pub(crate) async fn starttls(&mut self) {
        let r = self.cmd("STARTTLS").await;
        assert_eq!(r.code, 220, "{r:?}");
        let io = self.io.take().expect("io");
        self.io = Some(tls_wrap(io).await);
        self.buf.clear();
    }

    pub(crate) async fn auth_plain(&mut self, user: &str, password: &str) -> Reply {
        use base64::Engine;
        let token =
            base64::engine::general_purpose::STANDARD.encode(format!("\0{user}\0{password}"));
        self.cmd(&format!("AUTH PLAIN {token}")).await
    }

    /// EHLO + AUTH PLAIN on a plaintext connection (allow_plaintext).
    pub(crate) async fn login(addr: SocketAddr, user: &str) -> Client {
        let mut c = Client::connect(addr).await;
        c.ehlo().await;
        let pw = USERS.iter().find(|u| u.0 == user).expect("known user").1;
        let r = c.auth_plain(user, pw).await;
        assert_eq!(r.code, 235, "{r:?}");
        c
    }

    /// MAIL, RCPT..., DATA, the dot-stuffed message, and the final reply.
    pub(crate) async fn submit(&mut self, from: &str, rcpts: &[&str], message: &[u8]) -> Reply {
        let r = self.cmd(&format!("MAIL FROM:<{from}>")).await;
        if r.code != 250 {
            return r;
        }
        for rcpt in rcpts {
            let r = self.cmd(&format!("RCPT TO:<{rcpt}>")).await;
            assert_eq!(r.code, 250, "{r:?}");
        }
        let r = self.cmd("DATA").await;
        assert_eq!(r.code, 354, "{r:?}");
        self.send(&dot_stuff(message)).await;
        self.read_reply().await
    }

    /// Sends everything up to and including the final dot, then drops the
    /// connection without reading the reply (the lost-reply case).
    pub(crate) async fn submit_and_vanish(mut self, from: &str, rcpts: &[&str], message: &[u8]) {
        let mut batch = format!("MAIL FROM:<{from}>\r\n");
        for rcpt in rcpts {
            batch.push_str(&format!("RCPT TO:<{rcpt}>\r\n"));
        }
        batch.push_str("DATA\r\n");
        self.send(batch.as_bytes()).await;
        for _ in 0..rcpts.len() + 2 {
            self.read_reply().await;
        }
        self.send(&dot_stuff(message)).await;
        drop(self.io.take());
    }

    pub(crate) async fn quit(mut self) {
        self.send(b"QUIT\r\n").await;
        let _ = self.try_read_reply().await;
    }

    /// True once the server has closed the connection.
    pub(crate) async fn is_closed(&mut self) -> bool {
        let mut b = [0u8; 64];
        matches!(
            tokio::time::timeout(Duration::from_secs(10), self.io().read(&mut b)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }
}

/// Dot-stuffs a CRLF message and appends the terminating `.`.
pub(crate) fn dot_stuff(message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(message.len() + 8);
    let mut at_line_start = true;
    for &b in message {
        if at_line_start && b == b'.' {
            out.push(b'.');
        }
        out.push(b);
        at_line_start = b == b'\n';
    }
    if !message.ends_with(b"\r\n") {
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b".\r\n");
    out
}

/// A small RFC 5322 message from alice@example.test.
pub(crate) fn message(key: Option<&str>, body: &str) -> Vec<u8> {
    let mut m = String::from(
        "From: Alice <alice@example.test>\r\nTo: dest@example.net\r\nSubject: test\r\nMessage-ID: <fixed@example.test>\r\n",
    );
    if let Some(k) = key {
        m.push_str(&format!("X-Bird-Idempotency-Key: {k}\r\n"));
    }
    m.push_str("\r\n");
    m.push_str(body);
    m.push_str("\r\n");
    m.into_bytes()
}
