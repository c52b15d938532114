//! The `smtp-once` command line: one binary, one subcommand per job. This
//! file holds the clap definitions and the dispatch; each job's work is in
//! its own file: `serve` (the composition root and `check-config`),
//! `queue` (status and the queue actions), `webhooks`, `keys`
//! (`dkim-keygen`, `hash-password`, `new-api-key`), and `bench`, which
//! runs the `smtp-once-bench` binary. Nothing outside `cli/` imports it but
//! `main.rs`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use queue::QueueCommand;

mod bench;
mod help;
mod housekeeping;
mod keys;
mod logging;
pub(crate) mod queue;
pub mod serve;
mod webhooks;

pub use bench::BENCH_BINARY;
pub use keys::KeyAlgorithm;
pub use webhooks::WebhooksCommand;

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
    ///
    /// Runs `smtp-once-bench` from this binary's folder with the same
    /// arguments (`smtp-once bench --help`).
    #[command(disable_help_flag = true)]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
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
        command: WebhooksCommand,
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

pub fn run(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Serve { config } => serve::serve(config, cli.log_format),
        Command::CheckConfig { config } => serve::check_config(config),
        Command::HashPassword => keys::hash_password(),
        Command::NewApiKey => keys::new_api_key(),
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
        Command::Bench { args } => return bench::forward(args),
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
        Command::Webhooks { command } => webhooks::run(command),
        Command::DkimKeygen {
            domain,
            selector,
            algorithm,
            bits,
            out,
        } => keys::dkim_keygen(&domain, &selector, algorithm, bits, out),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("smtp-once: {message}");
            ExitCode::FAILURE
        }
    }
}
