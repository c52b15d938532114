//! The small async driver: a [`Transaction`] carried out over any stream,
//! and single commands (greeting, RSET, QUIT) around it.

use std::future::Future;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::ClientError;
use super::reply::{Reply, ReplyReader};
use super::transaction::{Finished, Stage, Step, Transaction};

#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// A round of commands with their replies, and each block of the
    /// message.
    pub command: Duration,
    /// The reply to the final dot (RFC 5321 4.5.3.2.6 allows 10 minutes).
    pub final_reply: Duration,
}

#[derive(Debug)]
pub struct Run {
    pub finished: Finished,
    /// When the first byte of the message was handed to the stream.
    pub message_started: Option<Instant>,
}

/// Carries out `txn` on `stream`. Failures end up in the outcome.
pub async fn run<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    mut txn: Transaction<'_>,
    timeouts: Timeouts,
) -> Run {
    let mut buf = vec![0u8; 4096];
    let mut message_started = None;
    loop {
        let done = match txn.next() {
            Step::Commands(commands) => {
                timed(timeouts.command, async {
                    write(stream, &commands).await?;
                    read_owed(stream, &mut txn, &mut buf).await
                })
                .await
            }
            Step::Message(block) => {
                message_started.get_or_insert_with(Instant::now);
                timed(timeouts.command, write(stream, block)).await
            }
            Step::Await(stage) => {
                let limit = match stage {
                    Stage::FinalReply => timeouts.final_reply,
                    _ => timeouts.command,
                };
                timed(limit, read_owed(stream, &mut txn, &mut buf)).await
            }
            Step::Done(finished) => {
                return Run {
                    finished,
                    message_started,
                };
            }
        };
        if let Err(e) = done {
            txn.handle_error(e);
        }
    }
}

async fn read_owed<S: AsyncRead + Unpin>(
    stream: &mut S,
    txn: &mut Transaction<'_>,
    buf: &mut [u8],
) -> Result<(), ClientError> {
    while txn.wants_reply() {
        let n = stream.read(buf).await?;
        if n == 0 {
            return Err(ClientError::NoReply);
        }
        txn.handle_input(&buf[..n]);
    }
    Ok(())
}

/// A reply, and whether more bytes came behind it in the same read.
#[derive(Debug)]
pub struct Answer {
    pub reply: Reply,
    /// The server spoke out of turn (after STARTTLS's 220: an injection
    /// attempt, CVE-2011-0411).
    pub trailing: bool,
}

/// Writes `command` (if any) and reads one reply, within `timeout`. Bytes
/// after the reply are dropped, as mail-send does.
pub async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    command: &[u8],
    timeout: Duration,
) -> Result<Answer, ClientError> {
    timed(timeout, async {
        if !command.is_empty() {
            write(stream, command).await?;
        }
        let mut reader = ReplyReader::default();
        let mut buf = [0u8; 1024];
        loop {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Err(ClientError::NoReply);
            }
            let mut bytes = &buf[..n];
            let reply = reader.next(&mut bytes).map_err(|_| ClientError::NoReply)?;
            if let Some(reply) = reply {
                let trailing = !bytes.is_empty();
                return Ok(Answer { reply, trailing });
            }
        }
    })
    .await
}

/// One command and its reply within `timeout`.
pub async fn command<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    command: &[u8],
    timeout: Duration,
) -> Result<Reply, ClientError> {
    exchange(stream, command, timeout).await.map(|a| a.reply)
}

async fn write<S: AsyncWrite + Unpin>(stream: &mut S, bytes: &[u8]) -> Result<(), ClientError> {
    stream.write_all(bytes).await?;
    // A no-op on TCP; pushes TLS records out.
    stream.flush().await?;
    Ok(())
}

async fn timed<T>(
    limit: Duration,
    work: impl Future<Output = Result<T, ClientError>>,
) -> Result<T, ClientError> {
    tokio::time::timeout(limit, work)
        .await
        .map_err(|_| ClientError::Timeout)?
}
