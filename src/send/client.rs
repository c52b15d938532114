//! One submission attempt: connect, TLS, EHLO and AUTH on mail-send's
//! `SmtpClient`, then `smtp_client`'s transaction (MAIL, RCPT, DATA and the
//! reply to the final dot), sorted into what
//! the retry loop needs to know: accepted (and whether it was a replay),
//! refused for good, or worth another try.

use std::time::Duration;

use mail_send::{Credentials, SmtpClient};
use smtp_proto::{EXT_START_TLS, EhloResponse, Response};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::exit::Exit;
use super::spool::Envelope;
use super::trust;
use crate::smtp_client::io::{self, Timeouts};
use crate::smtp_client::transaction::{self as client, Body, Options, Outcome};
use crate::smtp_client::{ClientError, describe, format_reply, mail_params};

/// How `smtp-once send` reaches the server (`--tls`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum SendTls {
    /// STARTTLS, required.
    Starttls,
    /// TLS from the first byte (port 465 style).
    Implicit,
    /// Plaintext (local development only).
    None,
}

/// Where and how to submit.
pub(super) struct Server {
    pub host: String,
    pub port: u16,
    pub tls: SendTls,
    pub connector: Option<TlsConnector>,
    pub credentials: Option<Credentials<String>>,
    /// Our name in EHLO.
    pub helo: String,
}

/// The outcome of one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Attempt {
    /// 2xx to the final dot.
    Accepted {
        queue_id: Option<String>,
        replay: bool,
        reply: String,
    },
    /// A 5xx: the server's final word.
    Refused {
        stage: Stage,
        /// The command refused, e.g. `MAIL FROM:<a@example.net>`.
        what: String,
        reply: String,
        exit: Exit,
    },
    /// Nothing to retry will change: no STARTTLS or no usable AUTH offered,
    /// or a server certificate we do not trust.
    Unusable(String),
    /// Connection lost, timeout or a 4xx.
    Temporary {
        why: String,
        /// The final dot went out: the server may have queued it.
        after_dot: bool,
    },
}

/// A client TLS connector trusting `ca_file`, or the system's roots.
pub(super) fn connector(ca_file: Option<&std::path::Path>) -> Result<TlsConnector, String> {
    crate::tls::client_connector(ca_file)
}

/// The exit code for a 5xx at `stage`.
pub(super) fn refusal_exit(stage: Stage, r: &Response<String>) -> Exit {
    match (r.code, r.esc) {
        (530 | 534 | 535 | 538 | 553, _) | (_, [5, 7, _]) => Exit::NoPerm,
        (552, _) | (_, [5, 6, _]) => Exit::DataErr,
        _ if stage == Stage::Message => Exit::DataErr,
        _ => Exit::Unavailable,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    Connect,
    Mail,
    Rcpt,
    Data,
    Message,
}

fn temporary(why: String) -> Attempt {
    Attempt::Temporary {
        why,
        after_dot: false,
    }
}

/// A reply that is not the hoped-for one: 5xx refused, else temporary.
fn unwelcome(stage: Stage, what: &str, r: &Response<String>) -> Attempt {
    let reply = format_reply(r);
    if (500..600).contains(&r.code) {
        Attempt::Refused {
            stage,
            what: what.to_owned(),
            exit: refusal_exit(stage, r),
            reply,
        }
    } else {
        temporary(format!("{what}: {reply}"))
    }
}

/// One attempt; `timeout` bounds each step.
pub(super) async fn attempt(
    server: &Server,
    env: &Envelope,
    message: &[u8],
    timeout: Duration,
) -> Attempt {
    let stream = match connect(server, timeout).await {
        Ok(s) => s,
        Err(why) => return temporary(why),
    };
    let mut client = SmtpClient { stream, timeout };
    match (server.tls, &server.connector) {
        (SendTls::Implicit, Some(connector)) => {
            match client.into_tls(connector, &server.host).await {
                Ok(mut tls) => session(&mut tls, server, env, message, timeout).await,
                Err(e) => tls_failure("TLS", &e, server),
            }
        }
        (SendTls::Starttls, Some(connector)) => {
            let caps = match greet(&mut client, server, timeout).await {
                Ok(caps) => caps,
                Err(a) => return a,
            };
            if !caps.has_capability(EXT_START_TLS) {
                return Attempt::Unusable(format!(
                    "{}:{} does not offer STARTTLS (use --tls implicit for a port 465 style listener)",
                    server.host, server.port
                ));
            }
            match client.start_tls(connector, &server.host).await {
                Ok(mut tls) => {
                    let caps = match ehlo(&mut tls, server).await {
                        Ok(caps) => caps,
                        Err(a) => return a,
                    };
                    transaction_after_auth(&mut tls, &caps, server, env, message, timeout).await
                }
                Err(e) => tls_failure("STARTTLS", &e, server),
            }
        }
        _ => session(&mut client, server, env, message, timeout).await,
    }
}

/// A failed handshake: a certificate we do not trust ends the run (a
/// retry meets the same certificate); anything else is worth another try.
fn tls_failure(what: &str, e: &mail_send::Error, server: &Server) -> Attempt {
    match trust::permanent(e, &server.host) {
        Some(why) => Attempt::Unusable(why),
        None => temporary(format!("{what}: {}", describe(e))),
    }
}

async fn connect(server: &Server, timeout: Duration) -> Result<TcpStream, String> {
    let target = format!("{}:{}", server.host, server.port);
    let addrs: Vec<_> = tokio::time::timeout(
        timeout,
        tokio::net::lookup_host((server.host.as_str(), server.port)),
    )
    .await
    .map_err(|_| format!("resolve {target}: timed out"))?
    .map_err(|e| format!("resolve {target}: {e}"))?
    .collect();
    let mut last = format!("resolve {target}: no address");
    for addr in addrs {
        match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Ok(Err(e)) => last = format!("connect to {target} ({addr}): {e}"),
            Err(_) => last = format!("connect to {target} ({addr}): timed out"),
        }
    }
    Err(last)
}

/// Greeting, EHLO, AUTH and the transaction on an established stream.
async fn session<T: AsyncRead + AsyncWrite + Unpin>(
    c: &mut SmtpClient<T>,
    server: &Server,
    env: &Envelope,
    message: &[u8],
    timeout: Duration,
) -> Attempt {
    let caps = match greet(c, server, timeout).await {
        Ok(caps) => caps,
        Err(a) => return a,
    };
    transaction_after_auth(c, &caps, server, env, message, timeout).await
}

async fn greet<T: AsyncRead + AsyncWrite + Unpin>(
    c: &mut SmtpClient<T>,
    server: &Server,
    timeout: Duration,
) -> Result<EhloResponse<String>, Attempt> {
    let reply = tokio::time::timeout(timeout, c.read())
        .await
        .map_err(|_| temporary("greeting: timed out".into()))?
        .map_err(|e| temporary(format!("greeting: {}", describe(&e))))?;
    if !(200..300).contains(&reply.code) {
        return Err(unwelcome(Stage::Connect, "greeting", &reply));
    }
    ehlo(c, server).await
}

async fn ehlo<T: AsyncRead + AsyncWrite + Unpin>(
    c: &mut SmtpClient<T>,
    server: &Server,
) -> Result<EhloResponse<String>, Attempt> {
    c.ehlo(&server.helo).await.map_err(|e| match e {
        mail_send::Error::UnexpectedReply(r) => unwelcome(Stage::Connect, "EHLO", &r),
        e => temporary(format!("EHLO: {}", describe(&e))),
    })
}

async fn transaction_after_auth<T: AsyncRead + AsyncWrite + Unpin>(
    c: &mut SmtpClient<T>,
    caps: &EhloResponse<String>,
    server: &Server,
    env: &Envelope,
    message: &[u8],
    timeout: Duration,
) -> Attempt {
    if let Some(credentials) = &server.credentials {
        match c.authenticate(credentials, caps).await {
            Ok(_) => {}
            Err(
                mail_send::Error::AuthenticationFailed(r) | mail_send::Error::UnexpectedReply(r),
            ) => {
                return unwelcome(Stage::Connect, "AUTH", &r);
            }
            Err(mail_send::Error::UnsupportedAuthMechanism) => {
                return Attempt::Unusable(format!(
                    "{}:{} offers no AUTH mechanism we can use here (AUTH may be offered only over TLS)",
                    server.host, server.port
                ));
            }
            Err(e) => return temporary(format!("AUTH: {}", describe(&e))),
        }
    }
    let outcome = transaction(&mut c.stream, caps, env, message, timeout).await;
    if !matches!(outcome, Attempt::Temporary { .. }) {
        c.timeout = c.timeout.min(Duration::from_secs(5));
        let _ = c.cmd(b"QUIT\r\n").await;
    }
    outcome
}

async fn transaction<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    caps: &EhloResponse<String>,
    env: &Envelope,
    message: &[u8],
    timeout: Duration,
) -> Attempt {
    let params = mail_params(caps, &env.from, &env.to, message, false);
    // One command at a time, and all or nothing: a message that cannot
    // reach every recipient is not sent, so a retry always sends the same
    // envelope.
    let options = Options {
        pipelining: false,
        all_or_nothing: true,
    };
    let txn = client::Transaction::new(&env.from, &params, &env.to, Body::Raw(message), options);
    let timeouts = Timeouts {
        command: timeout,
        final_reply: timeout,
    };
    let mail = format!("MAIL FROM:<{}>", env.from);
    let rcpt = |index: usize| format!("RCPT TO:<{}>", env.to[index]);
    match io::run(stream, txn, timeouts).await.finished.outcome {
        // "Authentication required" refuses the session, like a refused
        // AUTH, and says nothing about the message.
        Outcome::MailRefused(r) if r.code == 530 => unwelcome(Stage::Connect, &mail, &r),
        Outcome::MailRefused(r) => unwelcome(Stage::Mail, &mail, &r),
        Outcome::RcptRefused { index, reply } => {
            let _ = io::command(stream, b"RSET\r\n", timeout).await;
            unwelcome(Stage::Rcpt, &rcpt(index), &reply)
        }
        // Only without a recipient, which the spool never holds.
        Outcome::NoRecipients { .. } => Attempt::Unusable("no recipients".into()),
        Outcome::DataRefused(r) => unwelcome(Stage::Data, "DATA", &r),
        Outcome::Sent(r) if (200..300).contains(&r.code) => accepted(&r),
        Outcome::Sent(r) if (500..600).contains(&r.code) => {
            unwelcome(Stage::Message, "message", &r)
        }
        Outcome::Sent(r) => Attempt::Temporary {
            why: format!("message: {}", format_reply(&r)),
            after_dot: true,
        },
        Outcome::Lost { stage, error } => {
            let (what, after_dot) = match stage {
                client::Stage::Mail => (mail, false),
                client::Stage::Rcpt(index) => (rcpt(index), false),
                client::Stage::Data | client::Stage::EmptyMessage => ("DATA".into(), false),
                // The last block carries the dot: it may have gone out.
                client::Stage::Message => ("sending the message".into(), true),
                client::Stage::FinalReply => ("reply to the final dot".into(), true),
            };
            let why = match error {
                ClientError::Timeout if stage == client::Stage::FinalReply => "timed out".into(),
                e => e.to_string(),
            };
            Attempt::Temporary {
                why: format!("{what}: {why}"),
                after_dot,
            }
        }
    }
}

/// A 2xx to the final dot: the queue id, and the replay marker line.
fn accepted(r: &Response<String>) -> Attempt {
    let mut lines = r.message.lines();
    let replay = lines
        .next()
        .is_some_and(|l| l.trim().eq_ignore_ascii_case("Idempotency-Replay: true"));
    let queue_id = r
        .message
        .lines()
        .last()
        .and_then(|l| l.split("queued as ").nth(1))
        .map(|id| id.trim().to_owned())
        .filter(|id| !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric()));
    Attempt::Accepted {
        queue_id,
        replay,
        reply: format_reply(r),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(code: u16, esc: [u8; 3], message: &str) -> Response<String> {
        Response {
            code,
            esc,
            message: message.into(),
        }
    }

    #[test]
    fn a_replay_is_recognised_and_its_queue_id_read() {
        let r = reply(
            250,
            [2, 0, 0],
            "Idempotency-Replay: true\nOk: queued as 01ABCDEFGHJ",
        );
        assert_eq!(
            accepted(&r),
            Attempt::Accepted {
                queue_id: Some("01ABCDEFGHJ".into()),
                replay: true,
                reply: "250 2.0.0 Idempotency-Replay: true / Ok: queued as 01ABCDEFGHJ".into(),
            }
        );
        let r = reply(250, [2, 0, 0], "Ok: queued as 01ABCDEFGHJ");
        assert!(matches!(
            accepted(&r),
            Attempt::Accepted {
                replay: false,
                queue_id: Some(_),
                ..
            }
        ));
    }

    #[test]
    fn refusals_map_to_sysexits() {
        let at = |stage, code, esc| refusal_exit(stage, &reply(code, esc, "x"));
        assert_eq!(at(Stage::Mail, 553, [5, 7, 1]), Exit::NoPerm);
        assert_eq!(at(Stage::Connect, 535, [5, 7, 8]), Exit::NoPerm);
        assert_eq!(at(Stage::Mail, 530, [5, 7, 0]), Exit::NoPerm);
        assert_eq!(at(Stage::Message, 550, [5, 6, 0]), Exit::DataErr);
        assert_eq!(at(Stage::Message, 554, [5, 6, 0]), Exit::DataErr);
        assert_eq!(at(Stage::Message, 550, [0, 0, 0]), Exit::DataErr);
        assert_eq!(at(Stage::Rcpt, 550, [5, 1, 1]), Exit::Unavailable);
        assert_eq!(at(Stage::Connect, 554, [0, 0, 0]), Exit::Unavailable);
    }

    #[test]
    fn server_text_is_escaped_for_the_terminal() {
        let r = reply(550, [5, 0, 0], "bad\u{1b}[31m");
        assert_eq!(format_reply(&r), "550 5.0.0 bad\\u{1b}[31m");
    }
}
