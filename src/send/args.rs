//! `smtp-once send`'s command line, sendmail-compatible where sendmail has
//! a say (`-t`, `-f`, `-i`, `-oi`, recipients as arguments), and the
//! settings it turns into. Parsed here rather than by the top-level parser
//! so that a usage error exits 64 (EX_USAGE), as sendmail callers expect.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use mail_send::Credentials;

use super::Failure;
use super::client::{SendTls, Server};
use super::exit::Exit;

/// Submit one message (on stdin) so that it is accepted once, however
/// often the connection fails; or resend what an earlier run kept.
#[derive(Parser, Debug)]
#[command(name = "smtp-once send", version)]
pub(super) struct SendArgs {
    /// Recipients from the To, Cc and Bcc headers (the Bcc header is removed
    /// before sending), added to any given as arguments.
    #[arg(short = 't')]
    pub extract_recipients: bool,
    /// Envelope sender (default: the From: address); "" or "<>" for none.
    #[arg(short = 'f', value_name = "ADDR")]
    pub from: Option<String>,
    /// Accepted and ignored: a lone "." line never ends the input here.
    #[arg(short = 'i')]
    pub ignore_dots: bool,
    /// Sendmail option; only -oi (same as -i) is accepted.
    #[arg(short = 'o', value_name = "OPTION")]
    pub sendmail_options: Vec<String>,
    /// The submission server.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:587")]
    pub server: String,
    /// starttls (required, port 587 style), implicit (port 465 style) or
    /// none (plaintext, local development only).
    #[arg(long, value_enum, default_value_t = SendTls::Starttls)]
    pub tls: SendTls,
    /// Trust the certificates in this PEM file instead of the system's.
    #[arg(long, value_name = "PATH")]
    pub ca_file: Option<PathBuf>,
    /// Log in as NAME; the password comes from SMTP_ONCE_PASSWORD or
    /// --password-file, never from a flag.
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
    /// A file whose first line is the password for --user.
    #[arg(long, value_name = "PATH", requires = "user")]
    pub password_file: Option<PathBuf>,
    /// The key, when the message has no X-Bird-Idempotency-Key header
    /// (default: a new UUID v4, written into the message).
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
    /// Where messages wait until the server's final answer (default
    /// $XDG_STATE_HOME/smtp-once/spool, else ~/.local/state/smtp-once/spool).
    #[arg(long, value_name = "DIR")]
    pub spool: Option<PathBuf>,
    /// How long this run keeps retrying before it exits 75 with the message
    /// kept in the spool (e.g. 30s, 2m, 1h).
    #[arg(long, value_name = "DURATION", default_value = "2m", value_parser = parse_duration)]
    pub deadline: Duration,
    /// Resend every message in the spool (same bytes, same key), then exit;
    /// reads no stdin. For cron.
    #[arg(long, conflicts_with_all = ["recipients", "extract_recipients", "from", "idempotency_key"])]
    pub flush: bool,
    /// Envelope recipients (with -t, added to the headers' ones).
    #[arg(value_name = "RECIPIENT")]
    pub recipients: Vec<String>,
}

impl SendArgs {
    /// Parses `smtp-once send`'s arguments (without the program and
    /// subcommand names).
    pub(super) fn parse_from_args(args: Vec<OsString>) -> Result<SendArgs, clap::Error> {
        SendArgs::try_parse_from(std::iter::once(OsString::from("smtp-once send")).chain(args))
    }

    /// Checks what clap cannot: sendmail options, the key's shape.
    pub(super) fn check(&self) -> Result<(), Failure> {
        if let Some(o) = self.sendmail_options.iter().find(|o| o.as_str() != "i") {
            return Err(Failure::new(
                Exit::Usage,
                format!("-o{o}: only -oi is supported"),
            ));
        }
        if let Some(key) = &self.idempotency_key {
            super::message::check_key(key)
                .map_err(|why| Failure::new(Exit::Usage, format!("--idempotency-key {why}")))?;
        }
        if self.ca_file.is_some() && self.tls == SendTls::None {
            return Err(Failure::new(
                Exit::Usage,
                "--ca-file needs --tls starttls or --tls implicit",
            ));
        }
        Ok(())
    }

    pub(super) fn spool_dir(&self) -> Result<PathBuf, Failure> {
        match &self.spool {
            Some(dir) => Ok(dir.clone()),
            None => super::spool::default_dir().ok_or_else(|| {
                Failure::new(
                    Exit::Config,
                    "no spool folder: set --spool, XDG_STATE_HOME or HOME",
                )
            }),
        }
    }

    /// The server and how to reach it.
    pub(super) fn server(&self) -> Result<Server, Failure> {
        let default_port = if self.tls == SendTls::Implicit {
            465
        } else {
            587
        };
        let (host, port) = crate::net::split_host_port(&self.server, default_port)
            .map_err(|e| Failure::new(Exit::Usage, format!("--server {e}")))?;
        let connector = match self.tls {
            SendTls::None => None,
            _ => Some(self.connector()?),
        };
        let credentials = match &self.user {
            Some(user) => Some(Credentials::new(user.clone(), self.password()?)),
            None => None,
        };
        Ok(Server {
            host,
            port,
            tls: self.tls,
            connector,
            credentials,
            helo: helo_name(),
        })
    }

    fn connector(&self) -> Result<tokio_rustls::TlsConnector, Failure> {
        if let Some(path) = &self.ca_file {
            readable(path, "--ca-file")?;
        }
        super::client::connector(self.ca_file.as_deref())
            .map_err(|e| Failure::new(Exit::Config, format!("--ca-file {e}")))
    }

    fn password(&self) -> Result<String, Failure> {
        if let Some(path) = &self.password_file {
            readable(path, "--password-file")?;
            let text = std::fs::read_to_string(path).map_err(|e| {
                Failure::new(
                    Exit::NoInput,
                    format!("--password-file {}: {e}", path.display()),
                )
            })?;
            let line = text.lines().next().unwrap_or_default();
            if line.is_empty() {
                return Err(Failure::new(
                    Exit::Config,
                    format!("--password-file {}: empty first line", path.display()),
                ));
            }
            return Ok(line.to_owned());
        }
        match std::env::var("SMTP_ONCE_PASSWORD") {
            Ok(p) if !p.is_empty() => Ok(p),
            _ => Err(Failure::new(
                Exit::Config,
                "--user needs a password: set SMTP_ONCE_PASSWORD or give --password-file",
            )),
        }
    }
}

fn readable(path: &Path, flag: &str) -> Result<(), Failure> {
    std::fs::File::open(path)
        .map(drop)
        .map_err(|e| Failure::new(Exit::NoInput, format!("{flag} {}: {e}", path.display())))
}

/// `30s`, `2m`, `1h`, `500ms`.
pub(super) fn parse_duration(text: &str) -> Result<Duration, String> {
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: expected a number and a unit (ms, s, m, h)"))?;
    let unit_ms = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(format!("{text:?}: the unit must be ms, s, m or h")),
    };
    n.checked_mul(unit_ms)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?}: too long"))
}

/// Our name in EHLO: the host name when it is a plain domain.
fn helo_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| {
            !h.is_empty()
                && h.len() <= 253
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        })
        .unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<SendArgs, clap::Error> {
        SendArgs::parse_from_args(args.iter().map(OsString::from).collect())
    }

    #[test]
    fn sendmail_style_arguments() {
        let a = parse(&["-t", "-oi", "-fme@example.test", "x@example.net"]).unwrap();
        assert!(a.extract_recipients);
        assert_eq!(a.from.as_deref(), Some("me@example.test"));
        assert_eq!(a.recipients, ["x@example.net"]);
        a.check().unwrap();
        let a = parse(&["-ti", "-f", "me@example.test", "--", "y@example.net"]).unwrap();
        assert!(a.extract_recipients && a.ignore_dots);
        assert_eq!(a.recipients, ["y@example.net"]);
        assert_eq!(a.deadline, Duration::from_secs(120));
        assert_eq!(a.tls, SendTls::Starttls);
        assert!(parse(&["-oem", "x@example.net"]).unwrap().check().is_err());
        assert!(parse(&["--flush", "x@example.net"]).is_err());
        assert!(parse(&["--password", "pw"]).is_err());
        assert!(parse(&["--password-file", "f"]).is_err(), "needs --user");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("2").is_err());
        assert!(parse_duration("m").is_err());
        assert!(parse_duration("1d").is_err());
    }
}
