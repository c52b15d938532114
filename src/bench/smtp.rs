//! Minimal SMTP client: session setup (EHLO, STARTTLS / implicit TLS, AUTH
//! PLAIN) and one pipelined MAIL/RCPT/DATA transaction at a time.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use rustls_pki_types::ServerName;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::timeout;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::BenchError;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Generous: a loaded server on the same 2 cores may stall for a while.
const REPLY_TIMEOUT: Duration = Duration::from_secs(60);
/// Guards against a broken server making us buffer without bound.
const MAX_REPLY_BYTES: usize = 64 * 1024;
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
    pub(super) mail_cmd: Vec<u8>,
    pub(super) rcpt_cmd: Vec<u8>,
    /// MAIL + RCPT + DATA in one buffer for a single pipelined write.
    pub(super) pipelined_cmds: Vec<u8>,
}

impl SessionConfig {
    pub(super) fn commands(from: &str, to: &str) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
        let mail = format!("MAIL FROM:<{from}>\r\n").into_bytes();
        let rcpt = format!("RCPT TO:<{to}>\r\n").into_bytes();
        let mut all = Vec::with_capacity(mail.len() + rcpt.len() + 6);
        all.extend_from_slice(&mail);
        all.extend_from_slice(&rcpt);
        all.extend_from_slice(b"DATA\r\n");
        (mail, rcpt, all)
    }
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

/// One parsed (possibly multi-line) reply. The text stays in `Conn::reply`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Reply {
    pub(super) code: u16,
    /// Reply carried `Idempotency-Replay: true`.
    pub(super) replay: bool,
}

impl Reply {
    fn positive(self) -> bool {
        (200..300).contains(&self.code)
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

pub(super) struct Conn {
    io: BufReader<Stream>,
    /// Text of the last reply read (all lines), reused across replies.
    reply: Vec<u8>,
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
            io: BufReader::with_capacity(16 * 1024, stream),
            reply: Vec::with_capacity(512),
            pipelining: false,
        };
        conn.expect("greeting", 220).await?;
        conn.ehlo().await?;

        if cfg.tls == TlsMode::StartTls {
            if !conn.has_capability("STARTTLS") {
                return Err(BenchError::NoStartTls);
            }
            conn.send(b"STARTTLS\r\n").await?;
            conn.expect("STARTTLS", 220).await?;
            // Anything already buffered was sent before the handshake and
            // must not be trusted (CVE-2011-0411-style injection).
            if !conn.io.buffer().is_empty() {
                return Err(BenchError::Protocol(
                    "server sent data after the STARTTLS reply".into(),
                ));
            }
            let tcp = match conn.io.into_inner() {
                Stream::Plain(tcp) => tcp,
                Stream::Tls(_) => {
                    return Err(BenchError::Protocol("STARTTLS on a TLS stream".into()));
                }
            };
            conn = Conn {
                io: BufReader::with_capacity(
                    16 * 1024,
                    Stream::Tls(Box::new(handshake(cfg, tcp).await?)),
                ),
                reply: conn.reply,
                pipelining: false,
            };
            conn.ehlo().await?;
        }

        if let Some(line) = &cfg.auth_line {
            conn.send(line).await?;
            conn.expect("AUTH PLAIN", 235).await?;
        }
        Ok(conn)
    }

    async fn ehlo(&mut self) -> Result<(), BenchError> {
        self.send(format!("EHLO {EHLO_NAME}\r\n").as_bytes())
            .await?;
        self.expect("EHLO", 250).await?;
        self.pipelining = self.has_capability("PIPELINING");
        Ok(())
    }

    /// Looks for `keyword` as the first word of any line of the last reply.
    fn has_capability(&self, keyword: &str) -> bool {
        self.reply.split(|&b| b == b'\n').any(|line| {
            let line = line.get(4..).unwrap_or(&[]);
            let word_end = line
                .iter()
                .position(|b| b.is_ascii_whitespace())
                .unwrap_or(line.len());
            line[..word_end].eq_ignore_ascii_case(keyword.as_bytes())
        })
    }

    /// Sends one message: MAIL/RCPT/DATA (pipelined when offered), then the
    /// pre-built payload, which must already end in ".\r\n".
    pub(super) async fn transaction(
        &mut self,
        cfg: &SessionConfig,
        payload: &[u8],
    ) -> Result<TxnResult, BenchError> {
        let (mail, rcpt, data) = if self.pipelining {
            self.send(&cfg.pipelined_cmds).await?;
            let mail = self.read_reply().await?;
            let rcpt = self.read_reply().await?;
            let data = self.read_reply().await?;
            (mail, rcpt, data)
        } else {
            self.send(&cfg.mail_cmd).await?;
            let mail = self.read_reply().await?;
            if !mail.positive() {
                return Ok(rejected(mail));
            }
            self.send(&cfg.rcpt_cmd).await?;
            let rcpt = self.read_reply().await?;
            if !rcpt.positive() {
                self.rset().await?;
                return Ok(rejected(rcpt));
            }
            self.send(b"DATA\r\n").await?;
            let data = self.read_reply().await?;
            (mail, rcpt, data)
        };

        let envelope_ok = mail.positive() && rcpt.positive();
        if data.code == 354 && envelope_ok {
            let start = Instant::now();
            self.send(payload).await?;
            let reply = self.read_reply().await?;
            return Ok(TxnResult {
                reply,
                latency: Some(start.elapsed()),
                closing: reply.code == 421,
            });
        }

        // Some envelope step failed. Report the first failure.
        let failed = [mail, rcpt, data]
            .into_iter()
            .find(|r| !r.positive() && r.code != 354)
            .unwrap_or(data);
        if failed.code == 421 {
            return Ok(rejected(failed));
        }
        if data.code == 354 {
            // RFC 2920 3.1: DATA was accepted without valid recipients; an
            // empty message must still be terminated.
            self.send(b".\r\n").await?;
            self.read_reply().await?;
        }
        if mail.positive() {
            // Clear the open transaction before the next MAIL.
            self.rset().await?;
        }
        Ok(rejected(failed))
    }

    async fn rset(&mut self) -> Result<(), BenchError> {
        self.send(b"RSET\r\n").await?;
        self.expect("RSET", 250).await.map(drop)
    }

    /// Best-effort polite goodbye; errors are irrelevant at this point.
    pub(super) async fn quit(mut self) {
        if self.send(b"QUIT\r\n").await.is_ok() {
            let _ = timeout(Duration::from_secs(2), self.read_reply_inner()).await;
        }
        let _ = self.io.get_mut().shutdown().await;
    }

    async fn send(&mut self, bytes: &[u8]) -> Result<(), BenchError> {
        let io = self.io.get_mut();
        io.write_all(bytes).await?;
        // No-op for TCP; pushes pending TLS records.
        io.flush().await?;
        Ok(())
    }

    async fn expect(&mut self, what: &'static str, code: u16) -> Result<Reply, BenchError> {
        let reply = self.read_reply().await?;
        if reply.code != code {
            return Err(BenchError::UnexpectedReply {
                command: what,
                reply: String::from_utf8_lossy(&self.reply).trim_end().to_string(),
            });
        }
        Ok(reply)
    }

    pub(super) async fn read_reply(&mut self) -> Result<Reply, BenchError> {
        timeout(REPLY_TIMEOUT, self.read_reply_inner())
            .await
            .map_err(|_| BenchError::Timeout("server reply"))?
    }

    async fn read_reply_inner(&mut self) -> Result<Reply, BenchError> {
        self.reply.clear();
        loop {
            let line_start = self.reply.len();
            self.read_line().await?;
            let line = &self.reply[line_start..];
            let code = parse_code(line).ok_or_else(|| {
                BenchError::Protocol(format!(
                    "malformed reply line {:?}",
                    String::from_utf8_lossy(line).trim_end()
                ))
            })?;
            // "250-" continues; "250 " or a bare "250" ends the reply.
            if line.get(3) != Some(&b'-') {
                return Ok(Reply {
                    code,
                    replay: contains_replay_marker(&self.reply),
                });
            }
        }
    }

    /// Appends one line (including "\n") to `self.reply`, reading as needed.
    async fn read_line(&mut self) -> Result<(), BenchError> {
        loop {
            let buf = self.io.fill_buf().await?;
            if buf.is_empty() {
                return Err(BenchError::Closed);
            }
            let (take, done) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (i + 1, true),
                None => (buf.len(), false),
            };
            self.reply.extend_from_slice(&buf[..take]);
            self.io.consume(take);
            if done {
                return Ok(());
            }
            if self.reply.len() > MAX_REPLY_BYTES {
                return Err(BenchError::Protocol("reply too long".into()));
            }
        }
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

fn rejected(reply: Reply) -> TxnResult {
    TxnResult {
        reply,
        latency: None,
        closing: reply.code == 421,
    }
}

fn parse_code(line: &[u8]) -> Option<u16> {
    let digits = line.get(..3)?;
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    match line.get(3) {
        None | Some(b' ' | b'-' | b'\r' | b'\n') => {}
        Some(_) => return None,
    }
    Some(
        digits
            .iter()
            .fold(0u16, |acc, d| acc * 10 + u16::from(d - b'0')),
    )
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
    fn codes() {
        assert_eq!(parse_code(b"250 ok\r\n"), Some(250));
        assert_eq!(parse_code(b"250-x\r\n"), Some(250));
        assert_eq!(parse_code(b"250\r\n"), Some(250));
        assert_eq!(parse_code(b"25x ok\r\n"), None);
        assert_eq!(parse_code(b"2500\r\n"), None);
        assert_eq!(parse_code(b"25"), None);
    }

    #[test]
    fn replay_marker() {
        assert!(contains_replay_marker(
            b"250-2.0.0 Idempotency-Replay: true\r\n250 2.0.0 Ok: queued as X\r\n"
        ));
        assert!(!contains_replay_marker(b"250 2.0.0 Ok: queued as X\r\n"));
    }
}
