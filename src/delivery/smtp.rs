//! The SMTP client side of one hop, on mail-send's `SmtpClient`: connect,
//! TLS, EHLO and AUTH ([`open`]), then transactions that keep every
//! recipient's own reply ([`Session::transact`]), as many as the pool
//! sends on the session, and QUIT. mail-send's `send` stops at
//! the first refused recipient and its DATA adds a blank line to a message
//! that already ends in CRLF, so the transaction is `smtp_client`'s; this
//! file turns its outcome into each recipient's result.

use std::net::SocketAddr;
use std::time::Duration;

use mail_send::{Credentials, SmtpClient};
use smtp_proto::{EXT_PIPELINING, EXT_START_TLS, EhloResponse};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::connection_pool::Mail;
use super::{RcptResult, Status};
use crate::smtp_client::io::{self, Timeouts};
use crate::smtp_client::transaction::{
    self as client, Body, CLOSING, Finished, Options, Outcome, Stage,
};
use crate::smtp_client::{ClientError, describe, format_reply, mail_params};

#[derive(Clone)]
pub struct ClientSettings {
    /// Our name in EHLO.
    pub helo: String,
    /// Per command, and per block of the message transfer.
    pub timeout: Duration,
}

#[derive(Clone)]
pub enum Security {
    Plain,
    /// STARTTLS, and refuse to go on without it.
    StartTls(TlsConnector),
    /// STARTTLS when offered; plaintext otherwise.
    Opportunistic(TlsConnector),
    /// TLS from the first byte (port 465 style).
    Implicit(TlsConnector),
}

/// Why no transaction could start. Always temporary for the message: a
/// host that is down or misconfigured may be fixed before `max_age`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SetupError {
    pub message: String,
    /// Failed while negotiating TLS: opportunistic TLS retries in plaintext.
    pub tls: bool,
}

impl SetupError {
    fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            tls: false,
        }
    }

    fn tls(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            tls: true,
        }
    }
}

/// A greeted session, ready for MAIL.
pub enum Session {
    Plain(SmtpClient<TcpStream>, EhloResponse<String>),
    // Boxed: a TLS stream is ten times the size of a TCP one.
    Tls(Box<SmtpClient<TlsStream<TcpStream>>>, EhloResponse<String>),
}

/// The status a reply code gives the recipients it applies to.
pub fn status_of(code: u16) -> Status {
    match code {
        200..=299 => Status::Delivered,
        500..=599 => Status::Failed,
        // 4xx, and anything unexpected here: try again later.
        _ => Status::Deferred,
    }
}

pub async fn open(
    addr: SocketAddr,
    tls_name: &str,
    security: &Security,
    credentials: Option<&Credentials<String>>,
    s: &ClientSettings,
) -> Result<Session, SetupError> {
    let stream = tokio::time::timeout(s.timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| SetupError::new(format!("connect to {addr}: timed out")))?
        .map_err(|e| SetupError::new(format!("connect to {addr}: {e}")))?;
    let _ = stream.set_nodelay(true);
    let mut client = SmtpClient {
        stream,
        timeout: s.timeout,
    };
    let connector = match security {
        Security::Implicit(connector) => {
            let mut tls = client
                .into_tls(connector, tls_name)
                .await
                .map_err(|e| SetupError::tls(format!("TLS: {}", describe(&e))))?;
            greeting(&mut tls, s.timeout).await?;
            let caps = ehlo(&mut tls, &s.helo).await?;
            authenticate(&mut tls, &caps, credentials).await?;
            return Ok(Session::Tls(Box::new(tls), caps));
        }
        Security::Plain => None,
        Security::StartTls(c) | Security::Opportunistic(c) => Some(c),
    };
    greeting(&mut client, s.timeout).await?;
    let caps = ehlo(&mut client, &s.helo).await?;
    match connector {
        Some(connector) if caps.has_capability(EXT_START_TLS) => {
            let mut tls = client
                .start_tls(connector, tls_name)
                .await
                .map_err(|e| SetupError::tls(format!("STARTTLS: {}", describe(&e))))?;
            let caps = ehlo(&mut tls, &s.helo).await?;
            authenticate(&mut tls, &caps, credentials).await?;
            Ok(Session::Tls(Box::new(tls), caps))
        }
        Some(_) if matches!(security, Security::StartTls(_)) => {
            Err(SetupError::new("STARTTLS required but not offered"))
        }
        _ => {
            authenticate(&mut client, &caps, credentials).await?;
            Ok(Session::Plain(client, caps))
        }
    }
}

async fn greeting<T: AsyncRead + AsyncWrite + Unpin>(
    client: &mut SmtpClient<T>,
    timeout: Duration,
) -> Result<(), SetupError> {
    let reply = tokio::time::timeout(timeout, client.read())
        .await
        .map_err(|_| SetupError::new("greeting: timed out"))?
        .map_err(|e| SetupError::new(format!("greeting: {}", describe(&e))))?;
    if (200..300).contains(&reply.code) {
        Ok(())
    } else {
        Err(SetupError::new(format!(
            "greeting: {}",
            format_reply(&reply)
        )))
    }
}

async fn ehlo<T: AsyncRead + AsyncWrite + Unpin>(
    client: &mut SmtpClient<T>,
    helo: &str,
) -> Result<EhloResponse<String>, SetupError> {
    client
        .ehlo(helo)
        .await
        .map_err(|e| SetupError::new(format!("EHLO: {}", describe(&e))))
}

async fn authenticate<T: AsyncRead + AsyncWrite + Unpin>(
    client: &mut SmtpClient<T>,
    caps: &EhloResponse<String>,
    credentials: Option<&Credentials<String>>,
) -> Result<(), SetupError> {
    if let Some(credentials) = credentials {
        client
            .authenticate(credentials, caps)
            .await
            .map_err(|e| SetupError::new(format!("AUTH: {}", describe(&e))))?;
    }
    Ok(())
}

/// How one transaction ended: the per-recipient results, and what the
/// session is good for afterwards (see `connection_pool.rs`).
#[derive(Debug)]
pub struct Transaction {
    pub results: Vec<RcptResult>,
    /// Between transactions with every reply understood: may carry another.
    pub reusable: bool,
    /// The connection failed (I/O error, timeout, unparseable reply, 421)
    /// before any byte of the message was written: the next hop cannot
    /// have it, so it may be sent again on another connection.
    pub lost_before_data: bool,
}

impl Transaction {
    fn done(results: Vec<RcptResult>, reusable: bool) -> Self {
        Self {
            results,
            reusable,
            lost_before_data: false,
        }
    }

    fn lost_before_data(results: Vec<RcptResult>) -> Self {
        Self {
            results,
            reusable: false,
            lost_before_data: true,
        }
    }
}

impl Session {
    /// How the session is secured, for the record: `plaintext`, or the TLS
    /// version and cipher and how the peer was authenticated (`auth`:
    /// `none`, `verified`, `dane-ee`, `dane-ta`).
    pub fn security(&self, auth: &str) -> String {
        match self {
            Session::Plain(..) => "plaintext".into(),
            Session::Tls(c, _) => {
                let (_, conn) = c.stream.get_ref();
                let version = conn
                    .protocol_version()
                    .map_or("TLS".into(), |v| format!("{v:?}"));
                let cipher = conn
                    .negotiated_cipher_suite()
                    .map_or(String::new(), |s| format!(" {:?}", s.suite()));
                format!("{version}{cipher} auth={auth}")
            }
        }
    }

    /// One transaction; every recipient gets its own result. The session
    /// stays open: the caller keeps it for the next message or [`quit`]s.
    ///
    /// [`quit`]: Session::quit
    pub async fn transact(&mut self, mail: &Mail<'_>, timeout: Duration) -> Transaction {
        match self {
            Session::Plain(c, caps) => transaction(&mut c.stream, caps, mail, timeout).await,
            Session::Tls(c, caps) => transaction(&mut c.stream, caps, mail, timeout).await,
        }
    }

    /// Over TLS and offering REQUIRETLS (RFC 8689 4.2.1): the only kind
    /// of session a REQUIRETLS message may be sent on, once its TLS was
    /// authenticated.
    pub fn takes_requiretls(&self) -> bool {
        match self {
            Session::Plain(..) => false,
            Session::Tls(_, caps) => caps.has_capability(smtp_proto::EXT_REQUIRE_TLS),
        }
    }

    /// Ends the session politely (QUIT, a short wait for the reply).
    pub async fn quit(self) {
        match self {
            Session::Plain(mut c, _) => quit(&mut c).await,
            Session::Tls(mut c, _) => quit(c.as_mut()).await,
        }
    }
}

async fn quit<T: AsyncRead + AsyncWrite + Unpin>(c: &mut SmtpClient<T>) {
    c.timeout = c.timeout.min(Duration::from_secs(5));
    let _ = c.cmd(b"QUIT\r\n").await;
}

/// RSET after a transaction that stopped half way; true if the session is
/// clean again.
async fn reset<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, timeout: Duration) -> bool {
    matches!(io::command(stream, b"RSET\r\n", timeout).await, Ok(r) if (200..300).contains(&r.code))
}

async fn transaction<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    caps: &EhloResponse<String>,
    mail: &Mail<'_>,
    timeout: Duration,
) -> Transaction {
    let (from, rcpts, content) = (mail.from, mail.recipients, mail.content);
    let params = mail_params(caps, from, rcpts, content, mail.require_tls);
    let options = Options {
        pipelining: caps.has_capability(EXT_PIPELINING),
        all_or_nothing: false,
    };
    let txn = client::Transaction::new(from, &params, rcpts, Body::Raw(content), options);
    // RFC 5321 4.5.3.2.6: the reply to the final dot may take 10 minutes;
    // this is the moment a lost reply could duplicate a message, which the
    // idempotency key covers.
    let timeouts = Timeouts {
        command: timeout,
        final_reply: timeout * 2,
    };
    let run = io::run(stream, txn, timeouts).await;
    let (results, after) = results_of(rcpts, &run.finished);
    match after {
        After::Done { reusable } => Transaction::done(results, reusable),
        After::Reset => Transaction::done(results, reset(stream, timeout).await),
        After::LostBeforeData => Transaction::lost_before_data(results),
    }
}

/// What becomes of the session once the results are known.
#[derive(Debug, PartialEq, Eq)]
enum After {
    Done {
        reusable: bool,
    },
    /// RSET: reusable if it is answered 2xx.
    Reset,
    /// The connection failed before any byte of the message was written.
    LostBeforeData,
}

/// Every recipient's result from a finished transaction: those the next
/// hop refused first, each with its own reply, then the others.
fn results_of(rcpts: &[String], finished: &Finished) -> (Vec<RcptResult>, After) {
    let all = |names: &[String], status, why: &str| RcptResult::all(names, status, why, None);
    let lost = |stage: &str, e: &ClientError| format!("{stage}: {e}");
    // The refused, and the rest sharing one status and reply.
    let rest = |status, why: &str| {
        let (mut results, others) = split(rcpts, finished, None);
        results.extend(all(&others, status, why));
        results
    };
    match &finished.outcome {
        Outcome::MailRefused(r) if r.code == CLOSING => (
            all(rcpts, Status::Deferred, &format_reply(r)),
            After::LostBeforeData,
        ),
        Outcome::MailRefused(r) => {
            // 530: the next hop wants AUTH we did not do. That is our
            // configuration to fix, not the sender's mail to bounce.
            let status = match r.code {
                530 => Status::Deferred,
                code => status_of(code),
            };
            (all(rcpts, status, &format_reply(r)), After::Reset)
        }
        Outcome::Lost {
            stage: Stage::Mail,
            error,
        } => (
            all(rcpts, Status::Deferred, &lost("MAIL FROM", error)),
            After::LostBeforeData,
        ),
        // Only a 421 stops the recipients here: the rest must be retried.
        Outcome::RcptRefused { index, reply } => {
            let (mut results, open) = split(rcpts, finished, Some(*index));
            results.extend(all(&open, Status::Deferred, &format_reply(reply)));
            (results, After::LostBeforeData)
        }
        Outcome::Lost {
            stage: Stage::Rcpt(_),
            error,
        } => (
            rest(Status::Deferred, &lost("RCPT TO", error)),
            After::LostBeforeData,
        ),
        // A next hop that opened DATA anyway got an empty message ended at
        // once, and no trust; so does one that failed to answer it.
        Outcome::NoRecipients { data: Some(r) } if r.code == 354 => (
            split(rcpts, finished, None).0,
            After::Done { reusable: false },
        ),
        Outcome::Lost {
            stage: Stage::EmptyMessage,
            ..
        } => (
            split(rcpts, finished, None).0,
            After::Done { reusable: false },
        ),
        Outcome::NoRecipients { .. } => (split(rcpts, finished, None).0, After::Reset),
        Outcome::Lost {
            stage: Stage::Data,
            error,
        } => {
            // No recipient accepted: the pipelined DATA of an empty
            // transaction went unanswered.
            if !(0..rcpts.len()).any(|i| finished.accepted(i)) {
                return (
                    split(rcpts, finished, None).0,
                    After::Done { reusable: false },
                );
            }
            (
                rest(Status::Deferred, &lost("DATA", error)),
                After::LostBeforeData,
            )
        }
        Outcome::DataRefused(r) if r.code == CLOSING => (
            rest(Status::Deferred, &format_reply(r)),
            After::LostBeforeData,
        ),
        // Anything but 354 means the message was not sent; a stray 2xx must
        // not count as delivered, nor the session be trusted.
        Outcome::DataRefused(r) => match status_of(r.code) {
            Status::Delivered => (
                rest(Status::Deferred, &format_reply(r)),
                After::Done { reusable: false },
            ),
            status => (rest(status, &format_reply(r)), After::Reset),
        },
        // From here on the next hop may end up with the message: a failure
        // is recorded as deferred and never retried on another connection
        // in this attempt (only the idempotency key makes a resend
        // harmless).
        Outcome::Lost {
            stage: Stage::Message,
            error,
        } => (
            rest(Status::Deferred, &lost("message transfer", error)),
            After::Done { reusable: false },
        ),
        Outcome::Lost {
            stage: Stage::FinalReply,
            error,
        } => (
            rest(Status::Deferred, &lost("after DATA", error)),
            After::Done { reusable: false },
        ),
        Outcome::Sent(r) => (
            rest(status_of(r.code), &format_reply(r)),
            After::Done {
                reusable: r.code != CLOSING,
            },
        ),
    }
}

/// The recipients the next hop refused, each with its own reply, and the
/// others (accepted, or never answered) in envelope order. `open`: a
/// refusal that counts among the others (the 421 that stopped them).
fn split(
    rcpts: &[String],
    finished: &Finished,
    open: Option<usize>,
) -> (Vec<RcptResult>, Vec<String>) {
    let mut refused = Vec::new();
    let mut others = Vec::new();
    for (index, rcpt) in rcpts.iter().enumerate() {
        match finished.rcpt_replies.get(index) {
            Some(Some(r)) if !(200..300).contains(&r.code) && open != Some(index) => {
                refused.push(RcptResult::new(rcpt, status_of(r.code), format_reply(r)));
            }
            _ => others.push(rcpt.clone()),
        }
    }
    (refused, others)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::smtp_client::reply::Reply;

    fn reply(code: u16) -> Reply {
        Reply {
            code,
            esc: [0, 0, 0],
            message: "x".into(),
        }
    }

    fn rcpts() -> Vec<String> {
        vec!["a@x".into(), "b@x".into(), "c@x".into()]
    }

    fn statuses(results: &[RcptResult]) -> Vec<(&str, Status)> {
        results
            .iter()
            .map(|r| (r.recipient.as_str(), r.status))
            .collect()
    }

    #[test]
    fn the_refused_keep_their_reply_and_the_rest_share_the_final_one() {
        let finished = Finished {
            outcome: Outcome::Sent(reply(250)),
            rcpt_replies: vec![Some(reply(250)), Some(reply(550)), Some(reply(450))],
        };
        let (results, after) = results_of(&rcpts(), &finished);
        assert_eq!(
            statuses(&results),
            [
                ("b@x", Status::Failed),
                ("c@x", Status::Deferred),
                ("a@x", Status::Delivered)
            ]
        );
        assert_eq!(after, After::Done { reusable: true });
    }

    #[test]
    fn a_421_to_a_recipient_defers_it_and_every_one_not_refused() {
        let finished = Finished {
            outcome: Outcome::RcptRefused {
                index: 1,
                reply: reply(421),
            },
            rcpt_replies: vec![Some(reply(550)), Some(reply(421)), None],
        };
        let (results, after) = results_of(&rcpts(), &finished);
        assert_eq!(
            statuses(&results),
            [
                ("a@x", Status::Failed),
                ("b@x", Status::Deferred),
                ("c@x", Status::Deferred)
            ]
        );
        assert_eq!(after, After::LostBeforeData);
    }

    #[test]
    fn a_stray_2xx_to_data_is_no_delivery_and_no_trust() {
        let finished = Finished {
            outcome: Outcome::DataRefused(reply(250)),
            rcpt_replies: vec![Some(reply(250)); 3],
        };
        let (results, after) = results_of(&rcpts(), &finished);
        assert!(results.iter().all(|r| r.status == Status::Deferred));
        assert_eq!(after, After::Done { reusable: false });
    }

    #[test]
    fn a_refused_mail_is_reset_and_530_is_ours_to_fix() {
        for (code, status) in [(550, Status::Failed), (530, Status::Deferred)] {
            let finished = Finished {
                outcome: Outcome::MailRefused(reply(code)),
                rcpt_replies: vec![None; 3],
            };
            let (results, after) = results_of(&rcpts(), &finished);
            assert!(results.iter().all(|r| r.status == status));
            assert_eq!(after, After::Reset);
        }
    }
}
