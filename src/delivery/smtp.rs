//! The SMTP client side of one hop, on mail-send's `SmtpClient`: connect,
//! TLS, EHLO and AUTH ([`open`]), then transactions that keep every
//! recipient's own reply ([`Session::transact`]), as many as the pool
//! sends on the session, and QUIT. mail-send's `send` stops at
//! the first refused recipient and its DATA adds a blank line to a message
//! that already ends in CRLF, so the transaction is written here.

use std::net::SocketAddr;
use std::time::Duration;

use mail_send::{Credentials, SmtpClient};
use smtp_proto::response::parser::ResponseReceiver;
use smtp_proto::{EXT_PIPELINING, EXT_START_TLS, EhloResponse, Response};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::{RcptResult, Status};
use crate::smtp_client::{describe, format_reply, mail_params, send_content};

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
/// session is good for afterwards (see `pool.rs`).
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

/// 421: the next hop is closing the connection (RFC 5321 3.8).
const CLOSING: u16 = 421;

impl Session {
    /// One transaction; every recipient gets its own result. The session
    /// stays open: the caller keeps it for the next message or [`quit`]s.
    ///
    /// [`quit`]: Session::quit
    pub async fn transact(
        &mut self,
        from: &str,
        recipients: &[String],
        content: &[u8],
        timeout: Duration,
    ) -> Transaction {
        match self {
            Session::Plain(c, caps) => {
                transaction(c, caps, from, recipients, content, timeout).await
            }
            Session::Tls(c, caps) => {
                transaction(c.as_mut(), caps, from, recipients, content, timeout).await
            }
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
async fn reset<T: AsyncRead + AsyncWrite + Unpin>(c: &mut SmtpClient<T>) -> bool {
    matches!(c.cmd(b"RSET\r\n").await, Ok(r) if (200..300).contains(&r.code))
}

/// The replies to MAIL and RCPT: already read as a pipelined group, or
/// one command at a time.
enum Replies {
    /// The replies read, and why the rest were not.
    Pipelined(
        std::vec::IntoIter<Response<String>>,
        Option<mail_send::Error>,
    ),
    OneByOne,
}

impl Replies {
    async fn next<T: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        c: &mut SmtpClient<T>,
        command: String,
    ) -> Result<Response<String>, mail_send::Error> {
        match self {
            Replies::Pipelined(replies, error) => replies
                .next()
                .ok_or_else(|| error.take().unwrap_or(mail_send::Error::UnparseableReply)),
            Replies::OneByOne => c.cmd(command).await,
        }
    }
}

/// Writes `group` at once and reads a reply per command. Unlike
/// mail-send's `cmds`, the replies read before a failure are kept, so a
/// 421 to MAIL keeps its words when the next hop then hangs up.
async fn pipelined<T: AsyncRead + AsyncWrite + Unpin>(
    c: &mut SmtpClient<T>,
    group: &[String],
) -> (Vec<Response<String>>, Option<mail_send::Error>) {
    let mut got = Vec::with_capacity(group.len());
    let timeout = c.timeout;
    let run = async {
        for command in group {
            c.stream.write_all(command.as_bytes()).await?;
        }
        c.stream.flush().await?;
        let mut buf = vec![0u8; 4096];
        let mut parser = ResponseReceiver::default();
        while got.len() < group.len() {
            let n = c.stream.read(&mut buf).await?;
            if n == 0 {
                return Err(mail_send::Error::UnparseableReply);
            }
            let mut bytes = buf[..n].iter();
            while got.len() < group.len() {
                match parser.parse(&mut bytes) {
                    Ok(reply) => {
                        got.push(reply);
                        parser.reset();
                    }
                    Err(smtp_proto::Error::NeedsMoreData { .. }) => break,
                    Err(_) => return Err(mail_send::Error::UnparseableReply),
                }
            }
        }
        Ok(())
    };
    let error = match tokio::time::timeout(timeout, run).await {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e),
        Err(_) => Some(mail_send::Error::Timeout),
    };
    (got, error)
}

async fn transaction<T: AsyncRead + AsyncWrite + Unpin>(
    c: &mut SmtpClient<T>,
    caps: &EhloResponse<String>,
    from: &str,
    rcpts: &[String],
    content: &[u8],
    timeout: Duration,
) -> Transaction {
    let lost = |rcpts: &[String], stage: &str, e: &mail_send::Error| {
        RcptResult::all(
            rcpts,
            Status::Deferred,
            &format!("{stage}: {}", describe(e)),
            None,
        )
    };
    let params = mail_params(caps, from, rcpts, content);
    let mail = format!("MAIL FROM:<{from}>{params}\r\n");
    let mut replies = if caps.has_capability(EXT_PIPELINING) {
        // RFC 2920: MAIL, every RCPT and DATA in one write, then their
        // replies in order: one round trip instead of two. The content
        // waits for them, so none is sent to a transaction that lost its
        // recipients (the next hop refuses DATA without one).
        let mut group = vec![mail.clone()];
        group.extend(rcpts.iter().map(|r| format!("RCPT TO:<{r}>\r\n")));
        group.push("DATA\r\n".into());
        let (got, error) = pipelined(c, &group).await;
        Replies::Pipelined(got.into_iter(), error)
    } else {
        Replies::OneByOne
    };
    match replies.next(c, mail).await {
        Ok(r) if (200..300).contains(&r.code) => {}
        Ok(r) if r.code == CLOSING => {
            let why = format_reply(&r);
            return Transaction::lost_before_data(RcptResult::all(
                rcpts,
                Status::Deferred,
                &why,
                None,
            ));
        }
        Ok(r) => {
            let clean = reset(c).await;
            // 530: the next hop wants AUTH we did not do. That is our
            // configuration to fix, not the sender's mail to bounce.
            let status = if r.code == 530 {
                Status::Deferred
            } else {
                status_of(r.code)
            };
            let results = RcptResult::all(rcpts, status, &format_reply(&r), None);
            return Transaction::done(results, clean);
        }
        Err(e) => return Transaction::lost_before_data(lost(rcpts, "MAIL FROM", &e)),
    }
    let mut results = Vec::with_capacity(rcpts.len());
    let mut accepted: Vec<String> = Vec::with_capacity(rcpts.len());
    // Refused ones keep their reply; the rest must be retried.
    let unanswered = |results: &[RcptResult]| -> Vec<String> {
        let done: Vec<&str> = results.iter().map(|r| r.recipient.as_str()).collect();
        rcpts
            .iter()
            .filter(|r| !done.contains(&r.as_str()))
            .cloned()
            .collect()
    };
    for rcpt in rcpts {
        match replies.next(c, format!("RCPT TO:<{rcpt}>\r\n")).await {
            Ok(r) if (200..300).contains(&r.code) => accepted.push(rcpt.clone()),
            Ok(r) if r.code == CLOSING => {
                let open = unanswered(&results);
                let why = format_reply(&r);
                results.extend(RcptResult::all(&open, Status::Deferred, &why, None));
                return Transaction::lost_before_data(results);
            }
            Ok(r) => results.push(RcptResult::new(rcpt, status_of(r.code), format_reply(&r))),
            Err(e) => {
                let open = unanswered(&results);
                results.extend(lost(&open, "RCPT TO", &e));
                return Transaction::lost_before_data(results);
            }
        }
    }
    if accepted.is_empty() {
        if let Replies::Pipelined(..) = replies {
            // DATA went out with the group. A next hop that answers it with
            // 354 anyway gets an empty message ended at once, and no trust.
            match replies.next(c, String::new()).await {
                Ok(r) if r.code == 354 => {
                    let _ = c.cmd(b".\r\n").await;
                    return Transaction::done(results, false);
                }
                Ok(_) => {}
                Err(_) => return Transaction::done(results, false),
            }
        }
        let clean = reset(c).await;
        return Transaction::done(results, clean);
    }
    match replies.next(c, "DATA\r\n".into()).await {
        Ok(r) if r.code == 354 => {}
        Ok(r) if r.code == CLOSING => {
            let why = format_reply(&r);
            results.extend(RcptResult::all(&accepted, Status::Deferred, &why, None));
            return Transaction::lost_before_data(results);
        }
        Ok(r) => {
            // Anything but 354 means the message was not sent; a stray 2xx
            // must not count as delivered, nor the session be trusted.
            let (status, clean) = match status_of(r.code) {
                Status::Delivered => (Status::Deferred, false),
                other => (other, reset(c).await),
            };
            results.extend(RcptResult::all(&accepted, status, &format_reply(&r), None));
            return Transaction::done(results, clean);
        }
        Err(e) => {
            results.extend(lost(&accepted, "DATA", &e));
            return Transaction::lost_before_data(results);
        }
    }
    // From here on the next hop may end up with the message: a failure is
    // recorded as deferred and never retried on another connection in
    // this attempt (only the idempotency key makes a resend harmless).
    if let Err(e) = send_content(&mut c.stream, content, timeout).await {
        results.extend(lost(&accepted, "message transfer", &e));
        return Transaction::done(results, false);
    }
    // RFC 5321 4.5.3.2.6: the reply to the final dot may take 10 minutes;
    // this is the moment a lost reply could duplicate a message, which the
    // idempotency key covers.
    let reusable = match tokio::time::timeout(timeout * 2, c.read()).await {
        Ok(Ok(r)) => {
            let why = format_reply(&r);
            results.extend(RcptResult::all(&accepted, status_of(r.code), &why, None));
            r.code != CLOSING
        }
        Ok(Err(e)) => {
            results.extend(lost(&accepted, "after DATA", &e));
            false
        }
        Err(_) => {
            results.extend(lost(&accepted, "after DATA", &mail_send::Error::Timeout));
            false
        }
    };
    Transaction::done(results, reusable)
}
