//! Drives one [`Session`] over a socket: reads into the session, flushes
//! replies when the input is drained (PIPELINING batches them), and carries
//! out the session's actions (TLS upgrade, AUTH check, acceptance).

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::smtp::session::{Action, Session};

use super::Shared;

/// Bytes requested from the socket per read.
const READ_CHUNK: usize = 16 * 1024;

enum Exit {
    Closed,
    StartTls,
}

pub async fn handle(
    stream: TcpStream,
    mut session: Session,
    implicit_tls: bool,
    shared: Arc<Shared>,
    shutdown: watch::Receiver<bool>,
) {
    let peer = stream.peer_addr().ok();
    let tls = shared.tls.as_ref().map(|c| TlsAcceptor::from(c.clone()));
    let result: std::io::Result<()> = async {
        if implicit_tls {
            let acceptor =
                tls.ok_or_else(|| std::io::Error::other("implicit TLS without certificate"))?;
            let mut stream = acceptor.accept(stream).await?;
            session.greet();
            drive(&mut stream, &mut session, &shared, shutdown).await?;
            stream.shutdown().await.ok();
            return Ok(());
        }
        let mut stream = stream;
        session.greet();
        match drive(&mut stream, &mut session, &shared, shutdown.clone()).await? {
            Exit::Closed => Ok(()),
            Exit::StartTls => {
                let acceptor =
                    tls.ok_or_else(|| std::io::Error::other("STARTTLS without certificate"))?;
                let mut stream = acceptor.accept(stream).await?;
                session.tls_started();
                drive(&mut stream, &mut session, &shared, shutdown).await?;
                stream.shutdown().await.ok();
                Ok(())
            }
        }
    }
    .await;
    if let Err(e) = result {
        tracing::info!(?peer, error = %e, "connection ended with an error");
    }
}

async fn drive<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    session: &mut Session,
    shared: &Shared,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<Exit> {
    loop {
        match session.advance() {
            Action::NeedInput => {
                flush(stream, session).await?;
                let in_data = session.in_data();
                let timeout = if in_data {
                    shared.data_timeout
                } else {
                    shared.command_timeout
                };
                let buf = session.input();
                if buf.capacity() - buf.len() < READ_CHUNK / 4 {
                    buf.reserve(READ_CHUNK);
                }
                let read = tokio::select! {
                    read = tokio::time::timeout(timeout, stream.read_buf(buf)) => Some(read),
                    _ = shutdown.wait_for(|stop| *stop), if !in_data => None,
                };
                let Some(read) = read else {
                    session.shutting_down();
                    flush(stream, session).await?;
                    return Ok(Exit::Closed);
                };
                match read {
                    Ok(Ok(0)) => return Ok(Exit::Closed),
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => return Err(e),
                    Err(_) => {
                        tracing::info!("idle timeout");
                        session.timed_out();
                        flush(stream, session).await?;
                        return Ok(Exit::Closed);
                    }
                }
            }
            Action::StartTls => {
                flush(stream, session).await?;
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
                let reply = shared.acceptor.accept(*submission).await;
                session.submission_done(&reply);
            }
            Action::Close => {
                flush(stream, session).await?;
                return Ok(Exit::Closed);
            }
        }
    }
}

async fn flush<S: AsyncWrite + Unpin>(
    stream: &mut S,
    session: &mut Session,
) -> std::io::Result<()> {
    if session.has_output() {
        let out = session.take_output();
        stream.write_all(&out).await?;
        stream.flush().await?;
    }
    Ok(())
}
