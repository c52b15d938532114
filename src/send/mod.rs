//! `smtp-once send`: a sendmail-compatible client that never sends twice.
//!
//! The message gets its idempotency key once (its own, `--idempotency-key`,
//! or a new UUID v4 written into it), is spooled durably with its envelope
//! before the first attempt, and every attempt, in this run or a later
//! `--flush`, sends those same bytes: if an earlier attempt was accepted
//! and its reply lost, the server answers with a replay instead of queueing
//! a second copy. An entry leaves the spool only after a 2xx or a 5xx.
//!
//! Client side only: it uses the ground floor (`address`, `net`, `tls`,
//! `private_fs`) and never the server or the delivery worker.

mod args;
mod client;
mod exit;
mod message;
mod retry;
mod spool;
mod trust;

use std::ffi::OsString;
use std::io::Read;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::address::{ForwardPath, ReversePath};
use args::SendArgs;
use client::{Attempt, Stage};
pub use exit::Exit;
use message::MessageError;
use spool::{Entry, Envelope, Spool};

/// Why a run stops early, with its exit code.
#[derive(Debug)]
pub struct Failure {
    pub exit: Exit,
    pub message: String,
}

impl Failure {
    fn new(exit: Exit, message: impl Into<String>) -> Self {
        Self {
            exit,
            message: message.into(),
        }
    }
}

/// Entries older than this may have outlived the server's ledger entry
/// (`[idempotency] retention`, 3 h by default): resending them is no
/// longer sure to replay.
const RETENTION_WARNING: Duration = Duration::from_secs(3 * 3600);

/// `smtp-once send ARGS...`: the arguments after the subcommand name.
pub fn run(args: Vec<OsString>) -> ExitCode {
    let args = match SendArgs::parse_from_args(args) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                Exit::Usage
            } else {
                Exit::Ok
            }
            .into();
        }
    };
    let result = args.check().and_then(|()| {
        if args.flush {
            flush(&args)
        } else {
            send(&args)
        }
    });
    match result {
        Ok(exit) => exit.into(),
        Err(f) => {
            eprintln!("smtp-once send: {}", f.message);
            f.exit.into()
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(Exit::Config, format!("cannot start runtime: {e}")))
}

/// One message from stdin.
fn send(args: &SendArgs) -> Result<Exit, Failure> {
    let server = args.server()?;
    let spool_dir = args.spool_dir()?;
    let mut input = Vec::new();
    std::io::stdin()
        .lock()
        .read_to_end(&mut input)
        .map_err(|e| Failure::new(Exit::NoInput, format!("cannot read stdin: {e}")))?;
    let prepared = message::prepare(
        &input,
        args.idempotency_key.as_deref(),
        args.extract_recipients,
    )
    .map_err(|e| match e {
        MessageError::Empty => Failure::new(Exit::NoInput, e.to_string()),
        e => Failure::new(Exit::DataErr, e.to_string()),
    })?;
    let envelope = envelope(args, &prepared)?;
    let runtime = runtime()?;
    let spool =
        Spool::open(&spool_dir).map_err(|e| Failure::new(Exit::CantCreat, e.to_string()))?;
    let entry = spool
        .add(envelope, prepared.bytes)
        .map_err(|e| Failure::new(Exit::CantCreat, e.to_string()))?;
    let deadline = Instant::now() + args.deadline;
    let settled = runtime.block_on(retry::until_settled(
        &server,
        &entry.envelope,
        &entry.message,
        deadline,
    ));
    Ok(settle(&spool, entry, settled, false))
}

/// The envelope: `-f` or the From: address; the arguments' recipients and
/// with `-t` the headers'.
fn envelope(args: &SendArgs, prepared: &message::Prepared) -> Result<Envelope, Failure> {
    let from = match (&args.from, &prepared.from) {
        (Some(f), _) => f.trim_start_matches('<').trim_end_matches('>').to_owned(),
        (None, Some(f)) => f.clone(),
        (None, None) => {
            return Err(Failure::new(
                Exit::DataErr,
                "the message has no From: address; give the envelope sender with -f ADDR",
            ));
        }
    };
    ReversePath::parse(&from).map_err(|e| {
        let exit = if args.from.is_some() {
            Exit::Usage
        } else {
            Exit::DataErr
        };
        Failure::new(exit, format!("envelope sender {from:?}: {e}"))
    })?;
    let mut to: Vec<String> = Vec::new();
    for r in &args.recipients {
        ForwardPath::parse(r)
            .map_err(|e| Failure::new(Exit::Usage, format!("recipient {r:?}: {e}")))?;
        if !to.contains(r) {
            to.push(r.clone());
        }
    }
    for r in &prepared.header_recipients {
        if !to.contains(r) {
            to.push(r.clone());
        }
    }
    if to.is_empty() {
        let hint = if args.extract_recipients {
            "no recipients: To, Cc and Bcc are empty and none were given as arguments"
        } else {
            "no recipients: give them as arguments, or -t to read To, Cc and Bcc"
        };
        return Err(Failure::new(Exit::Usage, hint));
    }
    Ok(Envelope {
        user: args.user.clone().unwrap_or_default(),
        key: prepared.key.clone(),
        from,
        to,
    })
}

/// Resends every entry no other process holds, oldest first.
fn flush(args: &SendArgs) -> Result<Exit, Failure> {
    let spool_dir = args.spool_dir()?;
    let Some(spool) =
        Spool::existing(&spool_dir).map_err(|e| Failure::new(Exit::CantCreat, e.to_string()))?
    else {
        return Ok(Exit::Ok);
    };
    let entries = spool
        .take_all()
        .map_err(|e| Failure::new(Exit::CantCreat, e.to_string()))?;
    if entries.is_empty() {
        return Ok(Exit::Ok);
    }
    let server = args.server()?;
    let user = args.user.clone().unwrap_or_default();
    let runtime = runtime()?;
    let deadline = Instant::now() + args.deadline;
    let mut kept: Option<Exit> = None;
    let mut refused: Option<Exit> = None;
    let mut tried = false;
    for entry in entries {
        let entry = match entry {
            Ok(e) => e,
            Err(e) => {
                eprintln!("smtp-once send: {e}; left in place");
                kept.get_or_insert(Exit::TempFail);
                continue;
            }
        };
        let name = entry.path.display().to_string();
        if entry.envelope.user != user {
            eprintln!(
                "smtp-once send: {name} was spooled for account {:?}: flush it with --user {:?} (a key belongs to its account's workspace); kept",
                entry.envelope.user, entry.envelope.user
            );
            kept.get_or_insert(Exit::TempFail);
            continue;
        }
        if tried && Instant::now() >= deadline {
            eprintln!("smtp-once send: --deadline reached; {name} kept");
            kept.get_or_insert(Exit::TempFail);
            continue;
        }
        if entry.age > RETENTION_WARNING {
            eprintln!(
                "smtp-once send: warning: {name} was spooled {} h ago; if that is longer than the server's idempotency retention (3 h by default), this resend may be a second copy",
                entry.age.as_secs() / 3600
            );
        }
        tried = true;
        let settled = runtime.block_on(retry::until_settled(
            &server,
            &entry.envelope,
            &entry.message,
            deadline,
        ));
        // An entry from an earlier run may have been accepted already.
        match settle(&spool, entry, settled, true) {
            Exit::Ok => {}
            e @ (Exit::TempFail | Exit::Config) => {
                kept.get_or_insert(e);
            }
            e => {
                refused.get_or_insert(e);
            }
        }
    }
    Ok(kept.or(refused).unwrap_or(Exit::Ok))
}

/// Reports the outcome, removes the entry after a final word, and gives
/// the exit code. `maybe_sent`: an earlier run may have delivered it.
fn settle(spool: &Spool, entry: Entry, settled: retry::Settled, maybe_sent: bool) -> Exit {
    let remove = |spool: &Spool, entry: Entry| {
        if let Err(e) = spool.remove(entry) {
            // A later --flush resends it and gets a replay.
            eprintln!("smtp-once send: warning: {e}");
        }
    };
    let kept = |entry: &Entry, why: &str| {
        eprintln!(
            "smtp-once send: gave up for now ({why}); the message is kept in {} and `smtp-once send --flush` resends it (same bytes, same key)",
            entry.path.display()
        );
    };
    match settled.last {
        // A refused greeting, EHLO or AUTH (a stale password in a cron
        // flush) says nothing about the message: one that may be on the
        // server already, or may never have reached it, is not dropped.
        Attempt::Refused {
            stage: Stage::Connect,
            what,
            reply,
            exit,
        } if maybe_sent || settled.after_dot => {
            eprintln!("smtp-once send: refused at {what}: {reply}");
            kept(&entry, &format!("{what} refused before the message"));
            exit
        }
        Attempt::Accepted {
            queue_id,
            replay,
            reply,
        } => {
            let replay = if replay { " (replay)" } else { "" };
            match queue_id {
                Some(id) => println!("queued as {id}{replay}"),
                None => println!("accepted: {reply}{replay}"),
            }
            remove(spool, entry);
            Exit::Ok
        }
        Attempt::Refused {
            stage,
            what,
            reply,
            exit,
        } => {
            eprintln!("smtp-once send: refused at {what}: {reply}");
            if (maybe_sent || settled.after_dot) && stage != Stage::Message {
                // The refusal came before the message this time; an earlier
                // attempt whose reply was lost may have been accepted.
                eprintln!(
                    "smtp-once send: warning: an earlier attempt sent the whole message and lost the reply; it may have been accepted (key {:?})",
                    entry.envelope.key
                );
            }
            remove(spool, entry);
            exit
        }
        Attempt::Unusable(why) if !maybe_sent && !settled.after_dot => {
            // No attempt got as far as the message: nothing was sent.
            eprintln!("smtp-once send: {why}; nothing was sent");
            remove(spool, entry);
            Exit::Config
        }
        Attempt::Unusable(why) => {
            kept(&entry, &why);
            Exit::Config
        }
        Attempt::Temporary { why, .. } => {
            kept(&entry, &why);
            Exit::TempFail
        }
    }
}
