//! Drives one [`Session`] over a socket: reads into the session, flushes
//! replies when the input is drained (PIPELINING batches them), and carries
//! out the session's actions (TLS upgrade, AUTH check, acceptance). Every
//! handshake, read and write is bounded in time (`[limits]`).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use crate::accept::channel::KeySource;
use crate::smtp::reply::Reply;
use crate::smtp::session::{Action, Session};

use super::Shared;
use super::deadline::{Budget, Expiry, Progress};
use super::wording::Smtp;
use crate::front_door::load::IDLE_TIMEOUT_AT_CAP;
use crate::front_door::timed::{self, ConnectionError};

/// Bytes requested from the socket per read.
const READ_CHUNK: usize = 16 * 1024;

enum Exit {
    Closed,
    StartTls,
}

pub async fn handle(
    stream: TcpStream,
    peer: SocketAddr,
    mut session: Session,
    implicit_tls: bool,
    shared: Arc<Shared>,
    shutdown: watch::Receiver<bool>,
) {
    let tls = shared.tls.as_ref().map(|c| TlsAcceptor::from(c.clone()));
    let handshake_timeout = shared.tls_handshake_timeout;
    let write_timeout = shared.write_timeout;
    let result: Result<(), ConnectionError> = async {
        if implicit_tls {
            let acceptor =
                tls.ok_or_else(|| std::io::Error::other("implicit TLS without certificate"))?;
            let mut stream = timed::handshake(acceptor, stream, handshake_timeout).await?;
            session.greet();
            drive(&mut stream, &mut session, &shared, shutdown, peer).await?;
            timed::shutdown(&mut stream, write_timeout).await;
            return Ok(());
        }
        let mut stream = stream;
        session.greet();
        match drive(&mut stream, &mut session, &shared, shutdown.clone(), peer).await? {
            Exit::Closed => Ok(()),
            Exit::StartTls => {
                let acceptor =
                    tls.ok_or_else(|| std::io::Error::other("STARTTLS without certificate"))?;
                let mut stream = timed::handshake(acceptor, stream, handshake_timeout).await?;
                session.tls_started();
                drive(&mut stream, &mut session, &shared, shutdown, peer).await?;
                timed::shutdown(&mut stream, write_timeout).await;
                Ok(())
            }
        }
    }
    .await;
    match result {
        Ok(()) => {}
        Err(e @ ConnectionError::HandshakeTimeout(_)) => {
            tracing::info!(%peer, error = %e, "TLS handshake timed out; connection closed");
        }
        Err(e @ ConnectionError::WriteTimeout(_)) => {
            tracing::info!(%peer, error = %e, "write timed out; connection closed");
        }
        Err(e @ ConnectionError::Io(_)) => {
            tracing::info!(%peer, error = %e, "connection ended with an error");
        }
    }
}

async fn drive<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    session: &mut Session,
    shared: &Shared,
    mut shutdown: watch::Receiver<bool>,
    peer: SocketAddr,
) -> Result<Exit, ConnectionError> {
    let mut budget = Budget::new(shared.time_limits, Instant::now());
    loop {
        match session.advance() {
            Action::NeedInput => {
                let replied = session.has_output();
                flush(stream, session, shared).await?;
                let progress = Progress {
                    replied,
                    in_data: session.in_data(),
                    in_message: session.in_message(),
                };
                let now = Instant::now();
                budget.update(now, progress);
                let (deadline, expiry) = budget.next_deadline(now, progress);
                let wait = Wait {
                    deadline,
                    expiry,
                    started: now,
                    in_data: progress.in_data,
                };
                match read_more(stream, session, shared, &mut shutdown, wait).await {
                    Read::Data => {}
                    Read::Eof => return Ok(Exit::Closed),
                    Read::Failed(e) => return Err(e.into()),
                    Read::ShuttingDown => {
                        session.shutting_down();
                        flush(stream, session, shared).await?;
                        return Ok(Exit::Closed);
                    }
                    Read::Expired(expiry) => {
                        expired(stream, session, shared, expiry, peer).await?;
                        return Ok(Exit::Closed);
                    }
                }
            }
            Action::StartTls => {
                flush(stream, session, shared).await?;
                return Ok(Exit::StartTls);
            }
            Action::Authenticate { username, password } => {
                // Logs its own outcome, with the peer and escaped strings.
                let peer = session.peer().ip();
                let verdict = shared.auth.authenticate(peer, &username, &password).await;
                // The failure delay: only this connection waits, holding
                // no hashing thread.
                if !verdict.reply_delay.is_zero() {
                    tokio::time::sleep(verdict.reply_delay).await;
                }
                session.auth_result(verdict.outcome);
            }
            Action::Submit(submission) => {
                // Runs to completion even if shutdown starts meanwhile: the
                // commit finishes and its reply is sent.
                let started = std::time::Instant::now();
                let reply = shared
                    .acceptor
                    .accept_via(*submission, &Smtp, KeySource::MessageHeader)
                    .await;
                crate::metrics::global().end_of_data_seconds(started.elapsed().as_secs_f64());
                session.submission_done(&reply);
            }
            Action::Close => {
                flush(stream, session, shared).await?;
                return Ok(Exit::Closed);
            }
        }
    }
}

/// One read's limits.
struct Wait {
    deadline: Instant,
    expiry: Expiry,
    started: Instant,
    in_data: bool,
}

enum Read {
    Data,
    Eof,
    Failed(std::io::Error),
    /// The daemon is stopping and the session is between commands.
    ShuttingDown,
    Expired(Expiry),
}

/// Reads into the session's input until `wait.deadline`, which moves up
/// to `IDLE_TIMEOUT_AT_CAP` after the read began if the connection cap is
/// (or becomes) reached meanwhile.
async fn read_more<S: AsyncRead + Unpin>(
    stream: &mut S,
    session: &mut Session,
    shared: &Shared,
    shutdown: &mut watch::Receiver<bool>,
    wait: Wait,
) -> Read {
    let mut expiry = wait.expiry;
    let mut deadline = wait.deadline;
    let at_cap_deadline = wait.started + IDLE_TIMEOUT_AT_CAP;
    let shorten = |deadline: &mut Instant, expiry: &mut Expiry| {
        if at_cap_deadline < *deadline {
            *deadline = at_cap_deadline;
            *expiry = Expiry::IdleAtCap;
        }
    };
    if shared.gate.at_cap() {
        shorten(&mut deadline, &mut expiry);
    }
    let buf = session.input();
    if buf.capacity() - buf.len() < READ_CHUNK / 4 {
        buf.reserve(READ_CHUNK);
    }
    let read = stream.read_buf(buf);
    tokio::pin!(read);
    let timer = tokio::time::sleep_until(deadline);
    tokio::pin!(timer);
    loop {
        tokio::select! {
            read = &mut read => return match read {
                Ok(0) => Read::Eof,
                Ok(_) => Read::Data,
                Err(e) => Read::Failed(e),
            },
            _ = &mut timer => return Read::Expired(expiry),
            _ = shutdown.wait_for(|stop| *stop), if !wait.in_data => return Read::ShuttingDown,
            _ = shared.gate.cap_reached() => {
                shorten(&mut deadline, &mut expiry);
                timer.as_mut().reset(deadline);
            }
        }
    }
}

/// A read deadline passed: say which limit with a `421` and log it.
async fn expired<S: AsyncWrite + Unpin>(
    stream: &mut S,
    session: &mut Session,
    shared: &Shared,
    expiry: Expiry,
    peer: SocketAddr,
) -> Result<(), ConnectionError> {
    let limits = &shared.time_limits;
    // The command budget runs from the previous reply; with nothing of the
    // next command received, the client is just idle.
    let expiry = match expiry {
        Expiry::CommandTimeLimit if !session.has_partial_command() => Expiry::Idle,
        other => other,
    };
    let reply = match expiry {
        Expiry::Idle => {
            tracing::info!(%peer, "idle timeout");
            session.timed_out();
            return flush(stream, session, shared).await;
        }
        Expiry::IdleAtCap => {
            tracing::info!(
                %peer,
                timeout = ?IDLE_TIMEOUT_AT_CAP,
                "idle timeout while the connection cap is reached"
            );
            session.timed_out();
            return flush(stream, session, shared).await;
        }
        Expiry::CommandTimeLimit => {
            tracing::info!(
                %peer,
                limit = ?limits.command_time_limit,
                "command time limit exceeded; closing connection"
            );
            Reply::new(
                421,
                "4.4.2",
                "Command time limit exceeded, closing connection",
            )
        }
        Expiry::MessageTimeLimit => {
            tracing::info!(
                %peer,
                limit = ?limits.message_time_limit,
                "message time limit exceeded; closing connection"
            );
            Reply::new(
                421,
                "4.4.2",
                "Message time limit exceeded, closing connection",
            )
        }
    };
    let mut out = Vec::new();
    reply.write_to(&mut out);
    timed::write_all(stream, &out, shared.write_timeout).await
}

/// Writes the session's pending replies, within `write_timeout`: a client
/// that never reads them must not hold the connection for ever.
async fn flush<S: AsyncWrite + Unpin>(
    stream: &mut S,
    session: &mut Session,
    shared: &Shared,
) -> Result<(), ConnectionError> {
    if session.has_output() {
        let out = session.take_output();
        timed::write_all(stream, &out, shared.write_timeout).await?;
    }
    Ok(())
}
