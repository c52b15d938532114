//! `smtp-once-bench` (also run as `smtp-once bench`): a cheap SMTP load
//! generator for the relay. A package of its own: it uses the relay's
//! library only for its ground floor (`smtp_client`'s transaction and
//! commands, `tls::encrypt_only_config`, `time::rfc5322_date`), and the
//! library carries no bench code.
//!
//! It shares the 2-core machine with the server, so the client does as
//! little as possible per message: payloads are pre-built, buffers reused,
//! stats kept per connection and merged once, and the progress bar is fed
//! from an atomic counter by a slow ticker instead of per message.

mod message;
mod smtp;
mod stats;
#[cfg(test)]
mod tests;
mod tls;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

pub use self::message::KeyStyle;
use self::message::{MessageTemplate, Rng};
use self::smtp::{Conn, SessionConfig, TlsMode};
use self::stats::ConnStats;
pub use self::stats::LatencyMs;

/// Consecutive connection failures after which a connection gives up.
const MAX_CONSECUTIVE_FAILURES: u32 = 10;
const RECONNECT_PAUSE: Duration = Duration::from_millis(200);
const PROGRESS_INTERVAL: Duration = Duration::from_millis(250);
const BAR_TEMPLATE: &str =
    "{elapsed_precise} [{wide_bar}] {human_pos}/{human_len} msgs  {per_sec:0}";
const SPINNER_TEMPLATE: &str = "{elapsed_precise} {human_pos} msgs  {per_sec:0}";

#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// host:port of the SMTP server
    #[arg(long, default_value = "127.0.0.1:2587")]
    pub server: String,
    /// number of concurrent persistent connections
    #[arg(long, short = 'c', default_value_t = 8)]
    pub connections: usize,
    /// total messages (ignored if --duration is given)
    #[arg(long, short = 'n', default_value_t = 10000)]
    pub messages: u64,
    /// run for this many seconds instead of a message count
    #[arg(long)]
    pub duration: Option<u64>,
    /// message size in bytes (body padded to reach it)
    #[arg(long, default_value_t = 4096)]
    pub size: usize,
    /// share of messages (0.0..=1.0) sent again: an already-sent message, same key and bytes (the server should answer with a replay)
    #[arg(long, default_value_t = 0.0)]
    pub repeat: f64,
    /// send messages without an idempotency key
    #[arg(long)]
    pub no_key: bool,
    /// upgrade with STARTTLS (accepts any certificate: bench only)
    #[arg(long)]
    pub starttls: bool,
    /// connect with TLS from the start (accepts any certificate: bench only)
    #[arg(long)]
    pub implicit_tls: bool,
    /// AUTH PLAIN credentials user:password
    #[arg(long)]
    pub auth: Option<String>,
    #[arg(long, default_value = "bench@example.test")]
    pub from: String,
    #[arg(long, default_value = "sink@example.test")]
    pub to: String,
    /// Key prefix (default: random). With a fixed prefix every message is
    /// determined by it, so a second run with the same prefix measures replays.
    #[arg(long)]
    pub key_prefix: Option<String>,
    /// uuid (default: UUID v4-shaped keys over the whole key space, as
    /// real clients send) or sequential (`<prefix>-<conn>-<seq>`)
    #[arg(long, value_enum, default_value_t = KeyStyle::Uuid)]
    pub key_style: KeyStyle,
    /// machine-readable summary on stdout
    #[arg(long)]
    pub json: bool,
    /// no progress bar
    #[arg(long)]
    pub quiet: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("invalid arguments: {0}")]
    InvalidArgs(String),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("connect to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    #[error("timed out waiting for {0}")]
    Timeout(&'static str),
    #[error("connection closed by server or unparseable reply")]
    Closed,
    #[error("server does not offer STARTTLS")]
    NoStartTls,
    #[error("unexpected reply to {command}: {reply}")]
    UnexpectedReply {
        command: &'static str,
        reply: String,
    },
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("bench worker failed: {0}")]
    Worker(String),
    #[error("no message got a reply ({errors} connection errors; last: {last})")]
    AllFailed { errors: u64, last: String },
    #[error("no message was accepted: all {messages} refused ({refusals}){hint}")]
    NothingAccepted {
        messages: u64,
        refusals: String,
        hint: &'static str,
    },
}

#[derive(Serialize, Debug)]
pub struct BenchReport {
    /// Messages that got a final reply (any code).
    pub messages: u64,
    pub seconds: f64,
    /// `messages / seconds`: refusals count too, so read it with `accepted`.
    pub msgs_per_sec: f64,
    /// From writing the message body to reading the final reply.
    pub latency_ms: LatencyMs,
    /// Reply code ("250", "530", ...) -> count, one per message.
    pub replies: BTreeMap<String, u64>,
    /// Messages that got a 2xx reply (replays included).
    pub accepted: u64,
    /// What the server answered: 2xx replies carrying
    /// `Idempotency-Replay: true` (the key was already accepted).
    pub replayed_by_server: u64,
    /// What the client meant: messages deliberately sent again with an
    /// already-used key (`--repeat`). Retries after a connection error are
    /// not counted here.
    pub repeats_sent: u64,
    /// Connection-level failures (connect, TLS, I/O, timeouts, protocol).
    pub errors: u64,
}

impl BenchReport {
    pub fn print_human(&self) {
        print!("{}", self.human());
    }

    /// The text summary. "replayed by server" is what the server answered,
    /// "repeats sent" what the client meant to send again.
    pub fn human(&self) -> String {
        let l = &self.latency_ms;
        format!(
            "messages            {}\n\
             seconds             {:.3}\n\
             msgs/sec            {:.1}\n\
             latency ms          p50 {:.3}  p90 {:.3}  p99 {:.3}  max {:.3}\n\
             replies             {}\n\
             accepted            {}\n\
             replayed by server  {}\n\
             repeats sent        {}\n\
             errors              {}\n",
            self.messages,
            self.seconds,
            self.msgs_per_sec,
            l.p50,
            l.p90,
            l.p99,
            l.max,
            format_codes(&self.replies),
            self.accepted,
            self.replayed_by_server,
            self.repeats_sent,
            self.errors,
        )
    }

    pub fn to_json(&self) -> Result<String, BenchError> {
        Ok(serde_json::to_string_pretty(self)?)
    }

    /// Messages whose final reply was not 2xx.
    pub fn refused(&self) -> u64 {
        self.messages - self.accepted.min(self.messages)
    }

    /// The non-2xx part of `replies`, e.g. `530=10  553=2`.
    fn refusals(&self) -> String {
        let refused: BTreeMap<String, u64> = self
            .replies
            .iter()
            .filter(|(code, _)| !code.starts_with('2'))
            .map(|(code, n)| (code.clone(), *n))
            .collect();
        format_codes(&refused)
    }

    /// A line for stderr when some (not all) messages were refused.
    pub fn warning(&self) -> Option<String> {
        if self.refused() == 0 || self.accepted == 0 {
            return None;
        }
        Some(format!(
            "warning: {} of {} messages refused ({}); msgs/sec counts them too",
            self.refused(),
            self.messages,
            self.refusals()
        ))
    }

    /// The run failed when messages got replies but none was accepted: the
    /// msgs/sec figure would then measure refusals, not submissions.
    pub fn verdict(&self) -> Result<(), BenchError> {
        if self.messages > 0 && self.accepted == 0 {
            return Err(BenchError::NothingAccepted {
                messages: self.messages,
                refusals: self.refusals(),
                hint: refusal_hint(&self.replies),
            });
        }
        Ok(())
    }
}

fn format_codes(codes: &BTreeMap<String, u64>) -> String {
    codes
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("  ")
}

/// A pointer for the refusals a newcomer meets first.
fn refusal_hint(replies: &BTreeMap<String, u64>) -> &'static str {
    if replies.contains_key("530") {
        "; 530: the server wants AUTH first, pass --auth user:password (and --starttls if it needs TLS)"
    } else {
        "; the server's log says why"
    }
}

/// Runs the bench and prints the summary as `--json` asks: what the
/// binary calls. The report is printed even when the run failed
/// (nothing accepted), then the error says why.
pub async fn run_cli(args: BenchArgs) -> Result<(), BenchError> {
    let json = args.json;
    let report = run(args).await?;
    if json {
        println!("{}", report.to_json()?);
    } else {
        report.print_human();
    }
    if let Some(warning) = report.warning() {
        eprintln!("bench: {warning}");
    }
    report.verdict()
}

/// State shared by all connection tasks; read-only except the atomics.
struct Shared {
    session: SessionConfig,
    template: MessageTemplate,
    /// `None` in `--duration` mode.
    total: Option<u64>,
    deadline: Option<Instant>,
    claimed: AtomicU64,
    done: AtomicU64,
    repeat: f64,
    seed: u64,
    bar: ProgressBar,
}

/// One message slot taken from the shared counter.
#[derive(Clone, Copy)]
struct Job {
    seq: u64,
    /// A deliberate repeat of an already-sent message.
    repeat: bool,
}

impl Shared {
    fn expired(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// Claims the next message slot, or `None` when the run is over. Fresh
    /// messages are numbered by the global counter, so the set of keys of a
    /// run does not depend on how messages spread over connections (a second
    /// run with the same prefix replays every key); `sent` remembers this
    /// connection's fresh numbers for `--repeat`.
    fn claim(&self, rng: &mut Rng, sent: &mut Vec<u64>) -> Option<Job> {
        if self.expired() {
            return None;
        }
        let n = self.claimed.fetch_add(1, Ordering::Relaxed);
        if self.total.is_some_and(|t| n >= t) {
            return None;
        }
        if !sent.is_empty() && self.repeat > 0.0 && rng.next_f64() < self.repeat {
            let pick = usize::try_from(rng.below(sent.len() as u64)).unwrap_or(0);
            return Some(Job {
                seq: sent[pick.min(sent.len() - 1)],
                repeat: true,
            });
        }
        sent.push(n);
        Some(Job {
            seq: n,
            repeat: false,
        })
    }

    fn log(&self, msg: String) {
        // suspend() keeps the bar from being garbled by the line.
        self.bar.suspend(|| eprintln!("bench: {msg}"));
    }
}

pub async fn run(args: BenchArgs) -> Result<BenchReport, BenchError> {
    let connections = args.connections;
    let shared = Arc::new(build_shared(&args)?);

    let start = Instant::now();
    let ticker = {
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(PROGRESS_INTERVAL);
            loop {
                tick.tick().await;
                shared.bar.set_position(shared.done.load(Ordering::Relaxed));
            }
        })
    };
    let workers: Vec<_> = (0..connections)
        .map(|id| tokio::spawn(worker(id, shared.clone())))
        .collect();

    let mut total = ConnStats::default();
    let mut join_error = None;
    for w in workers {
        match w.await {
            Ok(stats) => total.merge(stats),
            Err(e) => join_error = Some(e.to_string()),
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    ticker.abort();
    shared.bar.finish_and_clear();
    if let Some(e) = join_error {
        return Err(BenchError::Worker(e));
    }

    let messages: u64 = total.codes.values().sum();
    if messages == 0 && total.errors > 0 {
        return Err(BenchError::AllFailed {
            errors: total.errors,
            last: total.last_error.unwrap_or_default(),
        });
    }
    let replies: BTreeMap<String, u64> = total
        .codes
        .iter()
        .map(|(code, n)| (code.to_string(), *n))
        .collect();
    let accepted = total
        .codes
        .iter()
        .filter(|(code, _)| (200..300).contains(*code))
        .map(|(_, n)| n)
        .sum();
    Ok(BenchReport {
        messages,
        seconds,
        msgs_per_sec: if seconds > 0.0 {
            messages as f64 / seconds
        } else {
            0.0
        },
        latency_ms: LatencyMs::from_micros(&mut total.latencies_us),
        replies,
        accepted,
        replayed_by_server: total.replayed_by_server,
        repeats_sent: total.repeats_sent,
        errors: total.errors,
    })
}

/// One persistent connection: sends messages until the run is over,
/// reconnecting after failures.
async fn worker(id: usize, shared: Arc<Shared>) -> ConnStats {
    let mut stats = ConnStats::default();
    let mut rng = Rng::new(shared.seed ^ (id as u64).wrapping_mul(0x2545_F491_4F6C_DD1D));
    let mut payload = Vec::new();
    let mut sent: Vec<u64> = Vec::new();
    // A claimed message whose transaction broke; retried on the next
    // connection so count mode still sends exactly `messages` messages.
    let mut pending: Option<Job> = None;
    let mut failures = 0u32;

    'connect: loop {
        if failures > 0 {
            if failures >= MAX_CONSECUTIVE_FAILURES {
                shared.log(format!(
                    "connection {id}: giving up after {failures} consecutive failures"
                ));
                break;
            }
            tokio::time::sleep(RECONNECT_PAUSE).await;
        }
        if shared.expired() {
            break;
        }
        let mut conn = match Conn::connect(&shared.session).await {
            Ok(c) => c,
            Err(e) => {
                record_failure(&shared, &mut stats, &mut failures, id, e);
                continue;
            }
        };
        loop {
            let job = match pending.take() {
                Some(job) if !shared.expired() => job,
                _ => match shared.claim(&mut rng, &mut sent) {
                    Some(job) => job,
                    None => {
                        conn.quit().await;
                        break 'connect;
                    }
                },
            };
            shared.template.render(0, job.seq, &mut payload);
            match conn.transaction(&shared.session, &payload).await {
                Ok(res) => {
                    failures = 0;
                    *stats.codes.entry(res.reply.code).or_default() += 1;
                    stats.replayed_by_server += u64::from(res.reply.replay);
                    stats.repeats_sent += u64::from(job.repeat);
                    if let Some(l) = res.latency {
                        stats
                            .latencies_us
                            .push(u32::try_from(l.as_micros()).unwrap_or(u32::MAX));
                    }
                    shared.done.fetch_add(1, Ordering::Relaxed);
                    if res.closing {
                        // 421: the server is closing the channel.
                        continue 'connect;
                    }
                }
                Err(e) => {
                    pending = Some(job);
                    record_failure(&shared, &mut stats, &mut failures, id, e);
                    continue 'connect;
                }
            }
        }
    }
    stats
}

fn record_failure(
    shared: &Shared,
    stats: &mut ConnStats,
    failures: &mut u32,
    id: usize,
    e: BenchError,
) {
    *failures += 1;
    stats.errors += 1;
    let msg = e.to_string();
    shared.log(format!("connection {id}: {msg}"));
    stats.last_error = Some(msg);
}

fn build_shared(args: &BenchArgs) -> Result<Shared, BenchError> {
    let bad = |m: String| Err(BenchError::InvalidArgs(m));
    if args.connections == 0 {
        return bad("--connections must be at least 1".into());
    }
    if !(0.0..=1.0).contains(&args.repeat) {
        return bad("--repeat must be within 0.0..=1.0".into());
    }
    if args.duration == Some(0) {
        return bad("--duration must be at least 1 second".into());
    }
    if args.starttls && args.implicit_tls {
        return bad("--starttls and --implicit-tls are mutually exclusive".into());
    }
    for (flag, addr) in [("--from", &args.from), ("--to", &args.to)] {
        if addr.is_empty()
            || addr
                .bytes()
                .any(|b| b.is_ascii_whitespace() || b.is_ascii_control() || b == b'<' || b == b'>')
        {
            return bad(format!("{flag} must be a bare address, got {addr:?}"));
        }
    }
    let prefix = match &args.key_prefix {
        Some(p) => {
            if p.is_empty()
                || p.len() > 64
                || !p
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
            {
                return bad("--key-prefix must be 1-64 chars of [A-Za-z0-9._-]".into());
            }
            p.clone()
        }
        None => message::random_prefix(),
    };

    let host = match args.server.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => host,
        _ => return bad(format!("--server must be host:port, got {:?}", args.server)),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let tls = match (args.starttls, args.implicit_tls) {
        (true, _) => TlsMode::StartTls,
        (_, true) => TlsMode::Implicit,
        _ => TlsMode::None,
    };
    let connector = match tls {
        TlsMode::None => None,
        _ => Some(tls::insecure_connector()?),
    };
    let auth_line = match &args.auth {
        Some(creds) => {
            let Some((user, pass)) = creds.split_once(':') else {
                return bad("--auth must be user:password".into());
            };
            let token =
                base64::engine::general_purpose::STANDARD.encode(format!("\0{user}\0{pass}"));
            Some(format!("AUTH PLAIN {token}\r\n").into_bytes())
        }
        None => None,
    };
    let session = SessionConfig {
        addr: args.server.clone(),
        server_name: tls::server_name(host)?,
        tls,
        connector,
        auth_line,
        from: args.from.clone(),
        to: vec![args.to.clone()],
    };
    // With a chosen key prefix the messages are fully determined by it, so
    // a second run with the same prefix measures replays.
    let date = match &args.key_prefix {
        Some(_) => smtp_once::time::rfc5322_date(0),
        None => message::rfc5322_now(),
    };
    let template = MessageTemplate::new(
        &prefix,
        args.key_style,
        !args.no_key,
        &args.from,
        &args.to,
        args.size,
        &date,
    );

    let (total, deadline) = match args.duration {
        Some(secs) => (None, Some(Instant::now() + Duration::from_secs(secs))),
        None => (Some(args.messages), None),
    };
    Ok(Shared {
        session,
        template,
        total,
        deadline,
        claimed: AtomicU64::new(0),
        done: AtomicU64::new(0),
        repeat: args.repeat,
        seed: prefix.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        }),
        bar: progress_bar(args, total),
    })
}

fn progress_bar(args: &BenchArgs, total: Option<u64>) -> ProgressBar {
    if args.quiet || args.json {
        return ProgressBar::hidden();
    }
    // stderr target draws nothing when stderr is not a terminal.
    let (bar, template) = match total {
        Some(n) => (
            ProgressBar::with_draw_target(Some(n), ProgressDrawTarget::stderr()),
            BAR_TEMPLATE,
        ),
        None => (
            ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
            SPINNER_TEMPLATE,
        ),
    };
    let style = ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.with_style(style)
}
