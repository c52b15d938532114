//! The `smtp-once` command line: one binary, one subcommand per job.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use crate::config::{Config, StoreBackend};
use crate::delivery::Worker;
use crate::metrics_http::MetricsServer;
use crate::server::Server;
use crate::store::postgres::{PgOptions, PgStore};
use crate::store::sqlite::SqliteStore;
use crate::store::{DeliveryQueue, StatusReader, Store, WebhookOutbox};
use queue::QueueCommand;

mod help;
pub(crate) mod queue;

#[derive(Parser, Debug)]
#[command(
    name = "smtp-once",
    version,
    about = "SMTP submission relay with exactly-once acceptance",
    help_template = help::template()
)]
pub struct Cli {
    /// Log lines on stderr as text (default) or one JSON object per line,
    /// for log shippers (journald, Loki, Vector...).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the relay daemon (listeners, ledger and queue, delivery worker).
    Serve {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Validate a config file and list every problem by key.
    CheckConfig {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Read a password on stdin and print its argon2id PHC string.
    HashPassword,
    /// Make an HTTP API key for an account.
    ///
    /// Prints the token once (give it to the application) and the
    /// `api_key_hash` line for the account's [[user]].
    NewApiKey,
    /// Show one message's state, attempts and last error.
    Status {
        #[arg(long, short)]
        config: PathBuf,
        queue_id: String,
    },
    /// List the queue, one line per message.
    Queue {
        #[arg(long, short)]
        config: PathBuf,
        /// Only messages in this state (queued, deferred, delivering, delivered, failed, expired, held).
        #[arg(long)]
        state: Option<String>,
        /// Only this workspace's messages.
        #[arg(long)]
        workspace: Option<String>,
        /// Only messages accepted longer ago than this (e.g. 2h, 3d).
        #[arg(long, value_name = "DURATION")]
        older_than: Option<String>,
        /// Only messages accepted within this (e.g. 15m).
        #[arg(long, value_name = "DURATION")]
        newer_than: Option<String>,
        #[arg(long, default_value_t = 1000)]
        limit: usize,
    },
    /// Submit a message from stdin, sendmail style, accepted exactly once.
    ///
    /// However often the connection fails, the message is accepted once
    /// (`smtp-once send --help`).
    #[command(disable_help_flag = true)]
    Send {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Load generator: submit messages over SMTP and report msgs/s and latency.
    Bench(crate::bench::BenchArgs),
    /// Make queued or deferred messages due now.
    Retry {
        #[arg(long, short)]
        config: PathBuf,
        /// Every queued and deferred message.
        #[arg(long, conflicts_with = "queue_ids")]
        all: bool,
        #[arg(required_unless_present = "all")]
        queue_ids: Vec<String>,
    },
    /// Stop delivery attempts for messages until `release`.
    Hold {
        #[arg(long, short)]
        config: PathBuf,
        #[arg(required = true)]
        queue_ids: Vec<String>,
    },
    /// Put held messages back in the queue, due now.
    Release {
        #[arg(long, short)]
        config: PathBuf,
        #[arg(required = true)]
        queue_ids: Vec<String>,
    },
    /// Stop messages for good, keeping their history (recipients
    /// delivered stay delivered); `DELETE /v1/messages/{id}` in the API.
    Cancel {
        #[arg(long, short)]
        config: PathBuf,
        #[arg(required = true)]
        queue_ids: Vec<String>,
    },
    /// Remove messages from the queue for good.
    Delete {
        #[arg(long, short)]
        config: PathBuf,
        #[arg(required = true)]
        queue_ids: Vec<String>,
    },
    /// Webhook events: list deliveries, redeliver, re-enable an endpoint.
    Webhooks {
        #[command(subcommand)]
        command: crate::webhook::ops::WebhooksCommand,
    },
    /// Make a DKIM signing key and the DNS record to publish.
    ///
    /// Writes the private key (mode 0600) and prints the DNS TXT record to
    /// publish and the [[dkim]] entry for the config.
    DkimKeygen {
        /// The signing domain (d=), e.g. example.com.
        #[arg(long)]
        domain: String,
        /// The selector (s=): the record goes at <selector>._domainkey.<domain>.
        #[arg(long)]
        selector: String,
        #[arg(long, value_enum, default_value_t = KeyAlgorithm::Rsa)]
        algorithm: KeyAlgorithm,
        /// RSA key size, 2048 to 4096 bits [default: 2048].
        #[arg(long)]
        bits: Option<usize>,
        /// Where to write the private key; never over an existing file
        /// [default: ./<selector>.<domain>.pem].
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

/// `dkim-keygen --algorithm`: RSA for every verifier, Ed25519 (RFC 8463)
/// as a second signature beside it.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyAlgorithm {
    Rsa,
    Ed25519,
}

pub fn run(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Serve { config } => serve(config, cli.log_format),
        Command::CheckConfig { config } => check_config(config),
        Command::HashPassword => hash_password(),
        Command::NewApiKey => {
            let (token, hash) = crate::http::keys::new_token();
            println!("token (shown once; the config keeps only its hash):\n  {token}");
            println!("add to the account's [[user]] section:\n  api_key_hash = \"{hash}\"");
            Ok(())
        }
        Command::Status { config, queue_id } => {
            queue::run(&config, QueueCommand::Status(&queue_id))
        }
        Command::Queue {
            config,
            state,
            workspace,
            older_than,
            newer_than,
            limit,
        } => queue::run(
            &config,
            QueueCommand::List {
                state: state.as_deref(),
                workspace,
                older_than: older_than.as_deref(),
                newer_than: newer_than.as_deref(),
                limit,
            },
        ),
        Command::Bench(args) => bench(args),
        Command::Send { args } => return crate::send::run(args),
        Command::Retry {
            config,
            all,
            queue_ids,
        } => queue::run(
            &config,
            if all {
                QueueCommand::RetryAll
            } else {
                QueueCommand::Retry(&queue_ids)
            },
        ),
        Command::Hold { config, queue_ids } => queue::run(&config, QueueCommand::Hold(&queue_ids)),
        Command::Release { config, queue_ids } => {
            queue::run(&config, QueueCommand::Release(&queue_ids))
        }
        Command::Cancel { config, queue_ids } => {
            queue::run(&config, QueueCommand::Cancel(&queue_ids))
        }
        Command::Delete { config, queue_ids } => {
            queue::run(&config, QueueCommand::Delete(&queue_ids))
        }
        Command::Webhooks { command } => crate::webhook::ops::run(command),
        Command::DkimKeygen {
            domain,
            selector,
            algorithm,
            bits,
            out,
        } => dkim_keygen(&domain, &selector, algorithm, bits, out),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("smtp-once: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Crates whose debug and trace records carry SQL parameters: tokio-postgres
/// logs every statement's parameters at debug, message bodies, keys and
/// addresses included. They are held at `info` whatever `RUST_LOG` says,
/// even when it names them: message content never reaches the log.
const SQL_CRATES: [&str; 4] = [
    "tokio_postgres",
    "postgres_protocol",
    "postgres_types",
    "deadpool",
];

/// The cap on [`SQL_CRATES`], applied after `RUST_LOG`'s filter: a record
/// passes only when both let it through.
fn sql_cap() -> tracing_subscriber::filter::Targets {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    SQL_CRATES
        .iter()
        .fold(Targets::new().with_default(LevelFilter::TRACE), |t, c| {
            t.with_target(*c, LevelFilter::INFO)
        })
}

fn init_logging(format: LogFormat) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .finish()
            .with(sql_cap())
            .try_init(),
        // One object per line: timestamp, level, target, and the event's
        // fields (message included) at the top level.
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .finish()
            .with(sql_cap())
            .try_init(),
    };
}

fn serve(path: PathBuf, log_format: LogFormat) -> Result<(), String> {
    init_logging(log_format);
    let config = Config::load(&path).map_err(|e| e.to_string())?;
    match crate::fd_limit::raise_to_hard_limit() {
        Ok(limit) => {
            if let Some(warning) = crate::fd_limit::shortfall(limit, config.max_connections) {
                tracing::warn!("{warning}");
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start runtime: {e}"))?;
    tracing::info!(node_id = %config.node_id, "starting");
    match &config.store {
        StoreBackend::Sqlite => {
            let store = Arc::new(SqliteStore::open(&config.data_dir).map_err(|e| e.to_string())?);
            tracing::info!(db = %store.db_path().display(), "ledger and queue open");
            runtime.block_on(run_node(&config, store.clone()))?;
            drop(runtime);
            match Arc::try_unwrap(store) {
                Ok(store) => store.close(),
                Err(_) => tracing::warn!("store still in use at exit"),
            }
        }
        StoreBackend::Postgres(pg) => runtime.block_on(async {
            let store = Arc::new(
                PgStore::open(PgOptions {
                    url: &pg.url,
                    pool_size: pg.pool_size,
                    ca_file: pg.ca_file.as_deref(),
                    node_id: &config.node_id,
                })
                .await
                .map_err(|e| e.to_string())?,
            );
            run_node(&config, store.clone()).await?;
            store.close();
            Ok::<(), String>(())
        })?,
    }
    tracing::info!("stopped");
    Ok(())
}

/// Runs the delivery worker and the server on one store until a signal.
async fn run_node<S: Store + DeliveryQueue + StatusReader + WebhookOutbox>(
    config: &Config,
    store: Arc<S>,
) -> Result<(), String> {
    // Producers hand fresh events to this node's sender through it.
    let (handoff, inbox) = crate::webhook::handoff::open(&config.webhooks);
    let router = crate::webhook::Router::new(&config.webhooks).with_handoff(handoff);
    // The worker first: a delivery setting that cannot work (DNS, TLS
    // roots, outbox folder) stops the daemon before it accepts mail.
    let worker = Worker::start(config, store.clone(), router.clone())
        .await
        .map_err(|e| e.to_string())?;
    let webhooks = crate::webhook::Sender::start(
        &config.webhooks,
        store.clone(),
        config.delivery.keep_finished,
        inbox,
    )
    .await
    .map_err(|e| e.to_string())?;
    // One front door for every listener: failed logins and wrong API keys
    // feed the same bans, and every message body counts against one budget.
    let auth = Arc::new(crate::server::authenticator(config).map_err(|e| e.to_string())?);
    let door = crate::front_door::Door::new(
        auth.clone(),
        config.limits.max_connections_per_ip,
        config.limits.tls_handshake_timeout,
        config.limits.write_timeout,
    );
    let budget = crate::budget::InFlightBudget::new(
        config.limits.max_bytes_in_flight,
        config.limits.max_bytes_in_flight_per_account,
    );
    let metrics = match &config.metrics {
        Some(settings) => Some(
            MetricsServer::start(
                crate::metrics_http::MetricsOptions {
                    addr: settings.addr,
                    token: settings.token.clone(),
                },
                store.clone(),
                door.clone(),
            )
            .await
            .map_err(|e| e.to_string())?,
        ),
        None => None,
    };
    let acceptor = Arc::new(crate::server::acceptor(
        config,
        store.clone(),
        router.clone(),
    )?);
    let http = match &config.http {
        Some(settings) => {
            // The API's queue actions on their own connection, as the
            // CLI's: a long action never waits behind acceptances.
            let admin = crate::cli::queue::open(config)
                .await
                .map_err(|e| format!("cannot open the queue for the API's actions: {e}"))?;
            let front = crate::http::Front {
                door: door.clone(),
                auth: auth.clone(),
                budget: budget.clone(),
                admin: Arc::from(admin),
                webhooks: router,
            };
            Some(
                crate::http::start(config, settings, acceptor.clone(), store.clone(), front)
                    .await?,
            )
        }
        None => None,
    };
    let server = Server::start(config, store, acceptor, auth, door, budget).await?;
    // Registered before the lines below: a SIGTERM sent as soon as a script
    // sees them must stop us gracefully, not kill us by the default action.
    let stop = stop_signal();
    if let Some(metrics) = &metrics {
        // Before the listening lines, which tests and scripts wait for.
        println!("smtp-once metrics on {}", metrics.addr);
    }
    for (addr, listener) in server.addrs.iter().zip(&config.listeners) {
        // A stable line on stdout that scripts and tests wait for.
        println!("smtp-once listening on {addr} ({:?})", listener.tls);
    }
    if let Some(http) = &http {
        println!("smtp-once http on {}", http.addr);
    }
    let _ = std::io::stdout().flush();
    stop.await;
    tracing::info!("stopping: finishing in-flight transactions and deliveries");
    let http_stopped = async {
        if let Some(http) = http {
            http.shutdown().await;
        }
    };
    tokio::join!(server.shutdown(), worker.shutdown(), http_stopped);
    // After the worker: its last records may have written events.
    if let Some(webhooks) = webhooks {
        webhooks.shutdown().await;
    }
    // Last, so /readyz and /metrics see the whole shutdown.
    if let Some(metrics) = metrics {
        metrics.shutdown().await;
    }
    Ok(())
}

/// Resolves at SIGTERM or SIGINT. The handlers are installed when this is
/// called, not when it is first polled.
fn stop_signal() -> impl Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    async move {
        match (term, int) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
}

fn check_config(path: PathBuf) -> Result<(), String> {
    let config = Config::load(&path).map_err(|e| e.to_string())?;
    println!(
        "{}: ok ({} listener(s), {} user(s), {} trusted network(s), {} DKIM key(s), data in {})",
        path.display(),
        config.listeners.len(),
        config.users.len(),
        config.trusted_networks.len(),
        config.dkim.len(),
        config.data_dir.display()
    );
    Ok(())
}

fn dkim_keygen(
    domain: &str,
    selector: &str,
    algorithm: KeyAlgorithm,
    bits: Option<usize>,
    out: Option<PathBuf>,
) -> Result<(), String> {
    use crate::dkim::keygen::{self, Algorithm};
    let domain = crate::dkim::signer::check_domain(domain).map_err(|e| format!("--domain {e}"))?;
    crate::dkim::signer::check_selector(selector).map_err(|e| format!("--selector {e}"))?;
    let algorithm = match (algorithm, bits) {
        (KeyAlgorithm::Rsa, bits) => Algorithm::Rsa {
            bits: bits.unwrap_or(2048),
        },
        (KeyAlgorithm::Ed25519, None) => Algorithm::Ed25519,
        (KeyAlgorithm::Ed25519, Some(_)) => {
            return Err("--bits is for RSA keys; Ed25519 keys have one size".into());
        }
    };
    let out = out.unwrap_or_else(|| PathBuf::from(format!("{selector}.{domain}.pem")));
    let key = keygen::generate(algorithm).map_err(|e| e.to_string())?;
    keygen::write(&key, &out).map_err(|e| e.to_string())?;
    // The config reads a relative path from its own folder, which is
    // rarely where this ran: give it the absolute one.
    let path = std::fs::canonicalize(&out).unwrap_or(out);
    let path_toml = toml::Value::String(path.display().to_string());
    println!(
        "wrote the private key to {} (mode 0600)\n\n\
         publish this DNS TXT record:\n\n{}\n\n\
         and add to the config:\n\n\
         [[dkim]]\ndomain = \"{domain}\"\nselector = \"{selector}\"\nprivate_key = {path_toml}",
        path.display(),
        keygen::zone_record(&domain, selector, &key.record),
    );
    Ok(())
}

fn hash_password() -> Result<(), String> {
    let stdin = std::io::stdin();
    // On a terminal: no echo, and typed twice since it cannot be seen.
    // Otherwise (`echo -n pw | smtp-once hash-password`): one plain line.
    let password = if stdin.is_terminal() {
        let hidden = |prompt| {
            crate::terminal::read_hidden_line(prompt)
                .map_err(|e| format!("cannot read the password without echo: {e}"))
        };
        let first = hidden("Password: ")?;
        if first.is_empty() {
            return Err("empty password".into());
        }
        if hidden("Again: ")? != first {
            return Err("the two passwords differ; nothing printed".into());
        }
        first
    } else {
        let mut line = String::new();
        stdin
            .lock()
            .read_line(&mut line)
            .map_err(|e| format!("cannot read password from stdin: {e}"))?;
        let password = line.trim_end_matches(['\r', '\n']).to_string();
        if password.is_empty() {
            return Err("empty password on stdin".into());
        }
        password
    };
    println!("{}", crate::auth::hash_password(&password)?);
    Ok(())
}

fn bench(args: crate::bench::BenchArgs) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start runtime: {e}"))?;
    runtime
        .block_on(crate::bench::run_cli(args))
        .map_err(|e| format!("bench: {e}"))
}

#[cfg(test)]
mod tests {
    use tracing::Level;

    #[test]
    fn sql_crates_stay_at_info_whatever_rust_log_says() {
        let cap = super::sql_cap();
        assert!(!cap.would_enable("tokio_postgres::query", &Level::DEBUG));
        assert!(!cap.would_enable("deadpool_postgres", &Level::TRACE));
        assert!(cap.would_enable("tokio_postgres::connection", &Level::INFO));
        assert!(cap.would_enable("smtp_once::accept", &Level::TRACE));
    }
}
