//! Socket work with an upper bound on its duration: a client that stops
//! reading, or never finishes a TLS handshake, must not hold a task (and a
//! connection slot) for ever.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// Why a connection ended early.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error("TLS handshake timed out after {0:?}")]
    HandshakeTimeout(Duration),
    #[error("write timed out after {0:?}: the client is not reading")]
    WriteTimeout(Duration),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// The server side of a TLS handshake, within `limit`.
pub async fn handshake<IO>(
    acceptor: TlsAcceptor,
    stream: IO,
    limit: Duration,
) -> Result<TlsStream<IO>, ConnectionError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    match tokio::time::timeout(limit, acceptor.accept(stream)).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(ConnectionError::HandshakeTimeout(limit)),
    }
}

/// Writes and flushes `bytes` within `limit`.
pub async fn write_all<S: AsyncWrite + Unpin>(
    stream: &mut S,
    bytes: &[u8],
    limit: Duration,
) -> Result<(), ConnectionError> {
    let write = async {
        stream.write_all(bytes).await?;
        stream.flush().await
    };
    match tokio::time::timeout(limit, write).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(ConnectionError::WriteTimeout(limit)),
    }
}

/// Closes the write side (TLS close_notify) within `limit`; errors are of
/// no interest at this point, the connection is ending either way.
pub async fn shutdown<S: AsyncWrite + Unpin>(stream: &mut S, limit: Duration) {
    let _ = tokio::time::timeout(limit, stream.shutdown()).await;
}
