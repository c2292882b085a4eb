//! A connection whose writes fail once they make no progress for a while: a client that stops
//! reading its answer (a full socket buffer) would otherwise hold its connection, its task and one
//! of `http.max_connections` forever.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// `inner` with a bound on how long a write (or flush) may stay blocked.
pub(super) struct WriteTimeout<S> {
    inner: S,
    timeout: Duration,
    /// Runs while a write is blocked; reset by any progress.
    stalled: Pin<Box<Sleep>>,
    blocked: bool,
}

impl<S> WriteTimeout<S> {
    pub(super) fn new(inner: S, timeout: Duration) -> WriteTimeout<S> {
        WriteTimeout {
            inner,
            timeout,
            stalled: Box::pin(tokio::time::sleep(timeout)),
            blocked: false,
        }
    }

    /// Account for the result of a write-side poll: progress clears the clock, a block starts it
    /// (once) and fails with `TimedOut` when it runs out.
    fn check<T>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if poll.is_ready() {
            self.blocked = false;
            return poll;
        }
        if !self.blocked {
            self.blocked = true;
            let deadline = Instant::now() + self.timeout;
            self.stalled.as_mut().reset(deadline);
        }
        match self.stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client did not read the answer in time",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteTimeout<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.check(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.check(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_flush(cx);
        self.check(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.check(cx, poll)
    }
}
