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
        let done = match txn.poll() {
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

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncBufReadExt, BufReader};

    use super::*;
    use crate::smtp_client::transaction::{Body, Options, Outcome};

    /// A server over an in-memory pipe that answers each line from
    /// `answers` (the message lines get none until the dot), and returns
    /// every byte it read.
    async fn scripted(
        server: tokio::io::DuplexStream,
        answers: &'static [&'static str],
    ) -> Vec<u8> {
        let (read, mut write) = tokio::io::split(server);
        let mut read = BufReader::new(read);
        let mut seen = Vec::new();
        let mut answers = answers.iter();
        let mut in_message = false;
        loop {
            let mut line = Vec::new();
            if read.read_until(b'\n', &mut line).await.unwrap_or(0) == 0 {
                return seen;
            }
            seen.extend_from_slice(&line);
            if in_message && line != b".\r\n" {
                continue;
            }
            let Some(answer) = answers.next() else {
                return seen;
            };
            in_message = answer.starts_with("354");
            if write.write_all(answer.as_bytes()).await.is_err() {
                return seen;
            }
        }
    }

    #[tokio::test]
    async fn one_command_at_a_time_over_a_stream() {
        let (mut client, server) = tokio::io::duplex(1024);
        let server = tokio::spawn(scripted(
            server,
            &[
                "250 ok\r\n",
                "550 5.1.1 no\r\n",
                "250 ok\r\n",
                "354 go\r\n",
                "250 queued\r\n",
            ],
        ));
        let rcpts = vec!["a@x".to_string(), "b@x".to_string()];
        let options = Options {
            pipelining: false,
            all_or_nothing: false,
        };
        let txn = Transaction::new("s@y", "", &rcpts, Body::Raw(b".m\r\n"), options);
        let timeouts = Timeouts {
            command: Duration::from_secs(5),
            final_reply: Duration::from_secs(5),
        };
        let run = run(&mut client, txn, timeouts).await;
        assert!(matches!(run.finished.outcome, Outcome::Sent(ref r) if r.code == 250));
        assert!(run.message_started.is_some());
        drop(client);
        let seen = server.await.expect("server task");
        assert_eq!(
            String::from_utf8_lossy(&seen),
            "MAIL FROM:<s@y>\r\nRCPT TO:<a@x>\r\nRCPT TO:<b@x>\r\nDATA\r\n..m\r\n.\r\n"
        );
    }

    #[tokio::test]
    async fn a_silent_server_times_out_at_the_reply_owed() {
        let (mut client, _server) = tokio::io::duplex(1024);
        let rcpts = vec!["a@x".to_string()];
        let txn = Transaction::new("s@y", "", &rcpts, Body::Raw(b"m\r\n"), Options::default());
        let timeouts = Timeouts {
            command: Duration::from_millis(50),
            final_reply: Duration::from_millis(50),
        };
        let run = run(&mut client, txn, timeouts).await;
        assert!(matches!(
            run.finished.outcome,
            Outcome::Lost {
                stage: Stage::Mail,
                error: ClientError::Timeout
            }
        ));
    }
}
