//! IO adapters: a stream that replays the bytes read for detection, and
//! byte counting for the `tcp_*_bytes_total` metrics.

use bytes::{Buf, Bytes};
use prometheus_client::metrics::counter::Counter;
use std::{
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A stream whose first bytes were already read; they are read again first.
#[derive(Debug)]
pub struct Prefixed<T> {
    prefix: Bytes,
    inner: T,
}

impl<T> Prefixed<T> {
    pub fn new(prefix: Bytes, inner: T) -> Self {
        Self { prefix, inner }
    }

    /// Puts `bytes`, read before anything still unread, back in front.
    pub fn rewind(&mut self, bytes: Bytes) {
        if bytes.is_empty() {
            return;
        }
        self.prefix = if self.prefix.is_empty() {
            bytes
        } else {
            let mut joined = Vec::with_capacity(bytes.len() + self.prefix.len());
            joined.extend_from_slice(&bytes);
            joined.extend_from_slice(&self.prefix);
            Bytes::from(joined)
        };
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Prefixed<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.prefix.has_remaining() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            if !self.prefix.has_remaining() {
                // Frees the detection buffer: the connection may live long.
                self.prefix = Bytes::new();
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Prefixed<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        b: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, b)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Counts bytes read from and written to a stream. The counters are series
/// handles: holding them keeps the series exported.
#[derive(Debug)]
pub struct Counted<T> {
    inner: T,
    read: Arc<Counter>,
    written: Arc<Counter>,
}

impl<T> Counted<T> {
    pub fn new(inner: T, read: Arc<Counter>, written: Arc<Counter>) -> Self {
        Self {
            inner,
            read,
            written,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Counted<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len().saturating_sub(before);
        if n > 0 {
            self.read.inc_by(n as u64);
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Counted<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        b: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, b);
        if let Poll::Ready(Ok(n)) = r {
            self.written.inc_by(n as u64);
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = r {
            self.written.inc_by(n as u64);
        }
        r
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Reads into a buffer until `decide` answers, the bound is reached, the
/// peer closes, or `timeout` passes; returns the answer (if any) and every
/// byte read.
pub async fn read_until<T, R>(
    io: &mut T,
    timeout: std::time::Duration,
    max: usize,
    mut decide: impl FnMut(&[u8]) -> Option<R>,
) -> std::io::Result<(Option<R>, Bytes)>
where
    T: AsyncRead + Unpin,
{
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::with_capacity(512);
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(r) = decide(&buf) {
            return Ok((Some(r), Bytes::from(buf)));
        }
        if buf.len() >= max {
            return Ok((None, Bytes::from(buf)));
        }
        if buf.len() == buf.capacity() {
            buf.reserve((buf.capacity() * 2).min(max) - buf.len());
        }
        match tokio::time::timeout_at(deadline, io.read_buf(&mut buf)).await {
            Ok(Ok(0)) | Err(_) => return Ok((None, Bytes::from(buf))),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(e),
        }
    }
}

/// Reads the first bytes of a connection until `detect` decides (it always
/// does by its bound), the client stops sending, or `timeout` passes (then
/// it is opaque).
pub async fn read_prefix<T: AsyncRead + Unpin>(
    io: &mut T,
    timeout: std::time::Duration,
) -> io::Result<(crate::detect::Protocol, Bytes)> {
    use crate::detect::{detect, Protocol, MAX_DETECT_BYTES};
    let (protocol, prefix) = read_until(io, timeout, MAX_DETECT_BYTES, detect).await?;
    Ok((protocol.unwrap_or(Protocol::Opaque), prefix))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn rewound_bytes_come_before_the_unread_prefix_and_the_stream() {
        let stream: &[u8] = b"-stream";
        let mut io = Prefixed::new(Bytes::from_static(b"abcdef"), stream);
        let mut first = [0u8; 2];
        io.read_exact(&mut first).await.expect("read");
        assert_eq!(&first, b"ab");
        io.rewind(Bytes::from_static(b"xy"));
        io.rewind(Bytes::new());
        let mut rest = String::new();
        io.read_to_string(&mut rest).await.expect("read");
        assert_eq!(rest, "xycdef-stream");

        let mut io = Prefixed::new(Bytes::new(), stream);
        io.rewind(Bytes::from_static(b"z"));
        let mut all = String::new();
        io.read_to_string(&mut all).await.expect("read");
        assert_eq!(all, "z-stream");
    }
}
