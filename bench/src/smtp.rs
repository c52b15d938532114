//! The bench's SMTP client: session setup by hand (EHLO, STARTTLS or
//! implicit TLS, AUTH PLAIN) on `smtp_client::io`'s commands, then
//! `smtp_client`'s transaction, pipelined when offered, one at a time.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::timeout;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::BenchError;
use smtp_once::smtp_client::io::{self as client_io, Timeouts};
use smtp_once::smtp_client::reply::{self, Reply as FullReply};
use smtp_once::smtp_client::transaction::{Body, CLOSING, Options, Outcome, Transaction};
use smtp_once::smtp_client::{ClientError, format_reply};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Generous: a loaded server on the same 2 cores may stall for a while.
const REPLY_TIMEOUT: Duration = Duration::from_secs(60);
const TIMEOUTS: Timeouts = Timeouts {
    command: REPLY_TIMEOUT,
    final_reply: REPLY_TIMEOUT,
};
const EHLO_NAME: &str = "bench.smtp-once.invalid";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TlsMode {
    None,
    StartTls,
    Implicit,
}

/// Everything a connection needs, built once per run and shared.
pub(super) struct SessionConfig {
    pub(super) addr: String,
    pub(super) server_name: ServerName<'static>,
    pub(super) tls: TlsMode,
    pub(super) connector: Option<TlsConnector>,
    /// Complete "AUTH PLAIN <base64>\r\n" line.
    pub(super) auth_line: Option<Vec<u8>>,
    pub(super) from: String,
    /// The one recipient.
    pub(super) to: Vec<String>,
}

/// Plain TCP or TLS; an enum instead of `Box<dyn>` so STARTTLS can take the
/// TCP stream back out.
pub(super) enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// One reply as the bench counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Reply {
    pub(super) code: u16,
    /// Reply carried `Idempotency-Replay: true`.
    pub(super) replay: bool,
}

impl Reply {
    fn of(r: &FullReply) -> Self {
        Self {
            code: r.code,
            replay: contains_replay_marker(r.message.as_bytes()),
        }
    }
}

/// Result of one message transaction.
#[derive(Debug, Clone, Copy)]
pub(super) struct TxnResult {
    /// The reply that decided the message's fate (final DATA reply, or the
    /// first failing MAIL/RCPT/DATA reply).
    pub(super) reply: Reply,
    /// From writing the message to reading the final reply; only when the
    /// message content was actually sent.
    pub(super) latency: Option<Duration>,
    /// Server said 421: it is closing the connection, so reconnect.
    pub(super) closing: bool,
}

impl From<ClientError> for BenchError {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Io(e) => BenchError::Io(e),
            ClientError::Timeout => BenchError::Timeout("server reply"),
            ClientError::NoReply => BenchError::Closed,
        }
    }
}

pub(super) struct Conn {
    stream: Stream,
    pipelining: bool,
}

impl Conn {
    pub(super) async fn connect(cfg: &SessionConfig) -> Result<Self, BenchError> {
        let tcp = timeout(CONNECT_TIMEOUT, TcpStream::connect(&cfg.addr))
            .await
            .map_err(|_| BenchError::Timeout("TCP connect"))?
            .map_err(|source| BenchError::Connect {
                addr: cfg.addr.clone(),
                source,
            })?;
        // Pipelined writes are small and latency is measured: no Nagle.
        tcp.set_nodelay(true)?;
        let stream = if cfg.tls == TlsMode::Implicit {
            Stream::Tls(Box::new(handshake(cfg, tcp).await?))
        } else {
            Stream::Plain(tcp)
        };
        let mut conn = Conn {
            stream,
            pipelining: false,
        };
        conn.expect("greeting", b"", 220).await?;
        let ehlo = conn.ehlo().await?;

        if cfg.tls == TlsMode::StartTls {
            if !reply::offers(&ehlo, "STARTTLS") {
                return Err(BenchError::NoStartTls);
            }
            let answer =
                client_io::exchange(&mut conn.stream, b"STARTTLS\r\n", REPLY_TIMEOUT).await?;
            if answer.reply.code != 220 {
                return Err(unexpected("STARTTLS", &answer.reply));
            }
            // Anything sent along with the reply came before the handshake
            // and must not be trusted (CVE-2011-0411-style injection).
            if answer.trailing {
                return Err(BenchError::Protocol(
                    "server sent data after the STARTTLS reply".into(),
                ));
            }
            let Stream::Plain(tcp) = conn.stream else {
                return Err(BenchError::Protocol("STARTTLS on a TLS stream".into()));
            };
            conn = Conn {
                stream: Stream::Tls(Box::new(handshake(cfg, tcp).await?)),
                pipelining: false,
            };
            conn.ehlo().await?;
        }

        if let Some(line) = &cfg.auth_line {
            conn.expect("AUTH PLAIN", line, 235).await?;
        }
        Ok(conn)
    }

    async fn ehlo(&mut self) -> Result<FullReply, BenchError> {
        let command = format!("EHLO {EHLO_NAME}\r\n");
        let reply = self.expect("EHLO", command.as_bytes(), 250).await?;
        self.pipelining = reply::offers(&reply, "PIPELINING");
        Ok(reply)
    }

    /// Sends one message: MAIL/RCPT/DATA (pipelined when offered), then the
    /// pre-built payload, which must already end in ".\r\n".
    pub(super) async fn transaction(
        &mut self,
        cfg: &SessionConfig,
        payload: &[u8],
    ) -> Result<TxnResult, BenchError> {
        let options = Options {
            pipelining: self.pipelining,
            all_or_nothing: false,
        };
        let txn = Transaction::new(&cfg.from, "", &cfg.to, Body::Stuffed(payload), options);
        let run = client_io::run(&mut self.stream, txn, TIMEOUTS).await;
        match run.finished.outcome {
            Outcome::Sent(r) => Ok(TxnResult {
                reply: Reply::of(&r),
                latency: run.message_started.map(|start| start.elapsed()),
                closing: r.code == CLOSING,
            }),
            Outcome::Lost { error, .. } => Err(error.into()),
            // No transaction open: nothing to reset.
            Outcome::MailRefused(r) => Ok(rejected(&r)),
            // A 421 to RCPT: reset only when each command waited for its
            // reply (as the bench always did).
            Outcome::RcptRefused { reply, .. } => {
                if !self.pipelining {
                    self.rset().await?;
                }
                Ok(rejected(&reply))
            }
            Outcome::NoRecipients { .. } => {
                self.rset().await?;
                let refusal = run.finished.rcpt_replies.into_iter().flatten().next();
                let refusal = refusal.ok_or(BenchError::Closed)?;
                Ok(rejected(&refusal))
            }
            Outcome::DataRefused(r) if r.code == CLOSING => Ok(rejected(&r)),
            Outcome::DataRefused(r) => {
                // Clear the open transaction before the next MAIL.
                self.rset().await?;
                Ok(rejected(&r))
            }
        }
    }

    async fn rset(&mut self) -> Result<(), BenchError> {
        self.expect("RSET", b"RSET\r\n", 250).await.map(drop)
    }

    /// Best-effort polite goodbye; errors are irrelevant at this point.
    pub(super) async fn quit(mut self) {
        let _ = client_io::command(&mut self.stream, b"QUIT\r\n", Duration::from_secs(2)).await;
        let _ = self.stream.shutdown().await;
    }

    /// Sends `command` (none: just read) and requires `code` back.
    async fn expect(
        &mut self,
        what: &'static str,
        command: &[u8],
        code: u16,
    ) -> Result<FullReply, BenchError> {
        let reply = client_io::command(&mut self.stream, command, REPLY_TIMEOUT).await?;
        if reply.code != code {
            return Err(unexpected(what, &reply));
        }
        Ok(reply)
    }
}

fn unexpected(command: &'static str, reply: &FullReply) -> BenchError {
    BenchError::UnexpectedReply {
        command,
        reply: format_reply(reply),
    }
}

async fn handshake(
    cfg: &SessionConfig,
    tcp: TcpStream,
) -> Result<TlsStream<TcpStream>, BenchError> {
    let connector = cfg
        .connector
        .as_ref()
        .ok_or_else(|| BenchError::Protocol("TLS requested but no connector configured".into()))?;
    let tls = timeout(
        CONNECT_TIMEOUT,
        connector.connect(cfg.server_name.clone(), tcp),
    )
    .await
    .map_err(|_| BenchError::Timeout("TLS handshake"))??;
    Ok(tls)
}

fn rejected(reply: &FullReply) -> TxnResult {
    TxnResult {
        reply: Reply::of(reply),
        latency: None,
        closing: reply.code == CLOSING,
    }
}

pub(super) fn contains_replay_marker(reply: &[u8]) -> bool {
    const MARKER: &[u8] = b"idempotency-replay: true";
    reply
        .windows(MARKER.len())
        .any(|w| w.eq_ignore_ascii_case(MARKER))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_marker() {
        assert!(contains_replay_marker(
            b"250-2.0.0 Idempotency-Replay: true\r\n250 2.0.0 Ok: queued as X\r\n"
        ));
        assert!(!contains_replay_marker(b"250 2.0.0 Ok: queued as X\r\n"));
    }
}
