//! A stream whose writes must make progress within a deadline. hyper has
//! no write timeout: a client that sends requests (pipelined, or a large
//! response's worth) and never reads the answers would hold its connection
//! and slot for ever once the socket buffers are full. SMTP has
//! `limits.write_timeout` for the same reason; HTTP connections get it
//! through this wrapper.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

pub struct WriteDeadline<S> {
    inner: S,
    limit: Duration,
    /// Armed while a write is pending; reset by any progress.
    timer: Pin<Box<Sleep>>,
    armed: bool,
}

impl<S> WriteDeadline<S> {
    pub fn new(inner: S, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            timer: Box::pin(tokio::time::sleep(limit)),
            armed: false,
        }
    }

    /// What the inner stream answered, with the clock: progress stops
    /// it, `pending` starts it (if it is not running), and `pending` after
    /// it ran out is the timeout error.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.armed = false;
            return polled;
        }
        if !self.armed {
            self.timer.as_mut().reset(Instant::now() + self.limit);
            self.armed = true;
        }
        match self.timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "write timed out after {:?}: the client is not reading",
                    self.limit
                ),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(cx, polled)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.watch(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.watch(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn a_reader_that_never_reads_fails_the_write() {
        let (client, _server) = tokio::io::duplex(64);
        let mut stream = WriteDeadline::new(client, Duration::from_millis(100));
        let started = std::time::Instant::now();
        let result = stream.write_all(&[0u8; 4096]).await;
        let e = result.expect_err("the peer reads nothing");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[tokio::test]
    async fn a_slow_but_steady_reader_is_fine() {
        use tokio::io::AsyncReadExt;
        let (client, mut server) = tokio::io::duplex(64);
        let reader = tokio::spawn(async move {
            let mut got = 0;
            let mut buf = [0u8; 64];
            while got < 1024 {
                tokio::time::sleep(Duration::from_millis(5)).await;
                got += server.read(&mut buf).await.expect("read");
            }
        });
        let mut stream = WriteDeadline::new(client, Duration::from_millis(100));
        stream
            .write_all(&[0u8; 1024])
            .await
            .expect("progress all along");
        reader.await.expect("reader");
    }
}
