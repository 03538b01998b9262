//! The body of a request the proxy sends: the client's body streamed as it
//! comes, or, for a request that may be retried, a body that keeps a copy of
//! what it streamed (up to a bound) so that a later try can send it again.
//!
//! A retryable request's first try streams the client's body and copies
//! each chunk; once the copy would pass `max_bytes` it is dropped and the
//! request can no longer be retried (Linkerd's rule: a body larger than the
//! route's `max_request_bytes` is sent once). A try may be made again only
//! when the first one read the whole body: a response that came before the
//! body was read leaves nothing whole to replay.

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use prometheus_client::metrics::gauge::Gauge;
use std::{
    pin::Pin,
    sync::{Arc, Mutex},
    task::{ready, Context, Poll},
};

/// What a request carries to an endpoint.
#[derive(Debug)]
pub enum RequestBody {
    /// The client's body, as it arrives.
    Incoming(Incoming),
    /// A retryable request's body: the client's, copied as it streams, or
    /// the copy sent again.
    Replay(ReplayBody),
}

impl From<Incoming> for RequestBody {
    fn from(body: Incoming) -> Self {
        Self::Incoming(body)
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            Self::Incoming(b) => Pin::new(b).poll_frame(cx),
            Self::Replay(b) => Pin::new(b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Incoming(b) => b.is_end_stream(),
            Self::Replay(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Incoming(b) => b.size_hint(),
            Self::Replay(b) => b.size_hint(),
        }
    }
}

/// The copy of a body, shared by the try that streams it and the ones that
/// send it again.
#[derive(Debug)]
struct Kept {
    chunks: Vec<Bytes>,
    bytes: usize,
    /// Bytes kept by every body of the process (a metric); this copy's
    /// share is taken back when it is dropped.
    held: Gauge,
    trailers: Option<HeaderMap>,
    /// The body outgrew the bound: the copy was dropped.
    capped: bool,
    /// The client's body was read to its end.
    complete: bool,
}

impl Kept {
    fn drop_copy(&mut self) {
        self.held.dec_by(self.bytes as i64);
        self.bytes = 0;
        self.chunks = Vec::new();
        self.trailers = None;
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        self.drop_copy();
    }
}

/// A body that can be sent again; see the module's description.
#[derive(Debug)]
pub struct ReplayBody<B = Incoming> {
    copy: Arc<Mutex<Kept>>,
    max_bytes: usize,
    source: Source<B>,
}

#[derive(Debug)]
enum Source<B> {
    /// The first try: reads the client's body.
    Client(B),
    /// A later try: the next chunk of the copy to send, then the trailers.
    Copy { next: usize, trailers_sent: bool },
}

/// Makes the bodies of later tries of one request.
#[derive(Clone, Debug)]
pub struct Replay {
    copy: Arc<Mutex<Kept>>,
}

impl Replay {
    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.copy.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A body to send again, when the whole body was read and kept.
    pub fn body<B>(&self) -> Option<ReplayBody<B>> {
        let copy = self.lock();
        (copy.complete && !copy.capped).then(|| ReplayBody {
            copy: self.copy.clone(),
            max_bytes: 0,
            source: Source::Copy {
                next: 0,
                trailers_sent: false,
            },
        })
    }

    /// Whether the body outgrew the bound (so the request is never retried).
    pub fn is_capped(&self) -> bool {
        self.lock().capped
    }
}

impl<B: Body<Data = Bytes> + Unpin> ReplayBody<B> {
    /// Wraps a client's body for a retryable request (and returns what makes
    /// the bodies of its later tries), or gives it back when its announced
    /// length already passes `max_bytes`.
    ///
    /// `held` counts the bytes kept, while they are.
    pub fn new(body: B, max_bytes: usize, held: Gauge) -> Result<(Self, Replay), B> {
        if body.size_hint().lower() > max_bytes as u64 {
            return Err(body);
        }
        let copy = Arc::new(Mutex::new(Kept {
            // A body known to be empty may never be polled.
            complete: body.is_end_stream(),
            held,
            chunks: Vec::new(),
            bytes: 0,
            trailers: None,
            capped: false,
        }));
        let first = Self {
            copy: copy.clone(),
            max_bytes,
            source: Source::Client(body),
        };
        Ok((first, Replay { copy }))
    }
}

impl<B> ReplayBody<B> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.copy.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn keep(&self, frame: &Frame<Bytes>) {
        let mut copy = self.lock();
        if copy.capped {
            return;
        }
        if let Some(data) = frame.data_ref() {
            if copy.bytes + data.len() > self.max_bytes {
                copy.capped = true;
                copy.drop_copy();
                return;
            }
            copy.bytes += data.len();
            copy.held.inc_by(data.len() as i64);
            copy.chunks.push(data.clone());
        } else if let Some(trailers) = frame.trailers_ref() {
            copy.trailers = Some(trailers.clone());
        }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for ReplayBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        match &mut this.source {
            Source::Client(body) => {
                let frame = ready!(Pin::new(&mut *body).poll_frame(cx));
                // A body of known length ends with its last frame: its
                // sender need not poll again to see the end.
                let ended = body.is_end_stream();
                match &frame {
                    Some(Ok(f)) => this.keep(f),
                    Some(Err(_)) => {
                        let mut copy = this.lock();
                        copy.capped = true;
                        copy.drop_copy();
                    }
                    None => {}
                }
                if frame.is_none() || ended {
                    this.lock().complete = true;
                }
                Poll::Ready(frame)
            }
            Source::Copy {
                next,
                trailers_sent,
            } => {
                let copy = this.copy.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(chunk) = copy.chunks.get(*next) {
                    *next += 1;
                    return Poll::Ready(Some(Ok(Frame::data(chunk.clone()))));
                }
                if !*trailers_sent {
                    *trailers_sent = true;
                    if let Some(t) = &copy.trailers {
                        return Poll::Ready(Some(Ok(Frame::trailers(t.clone()))));
                    }
                }
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.source {
            Source::Client(body) => body.is_end_stream(),
            Source::Copy {
                next,
                trailers_sent,
            } => {
                let copy = self.lock();
                *next >= copy.chunks.len() && (*trailers_sent || copy.trailers.is_none())
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.source {
            Source::Client(body) => body.size_hint(),
            Source::Copy { next, .. } => {
                let copy = self.lock();
                let left: usize = copy.chunks.iter().skip(*next).map(Bytes::len).sum();
                SizeHint::with_exact(left as u64)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};
    use std::convert::Infallible;

    type Chunks = StreamBody<
        futures_util::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>,
    >;

    fn body(chunks: &[&'static str], trailers: bool) -> Chunks {
        let mut frames: Vec<Result<Frame<Bytes>, Infallible>> = chunks
            .iter()
            .map(|c| Ok(Frame::data(Bytes::from_static(c.as_bytes()))))
            .collect();
        if trailers {
            let mut t = HeaderMap::new();
            t.insert("grpc-status", http::HeaderValue::from_static("0"));
            frames.push(Ok(Frame::trailers(t)));
        }
        StreamBody::new(futures_util::stream::iter(frames))
    }

    async fn read<B: Body<Data = Bytes> + Unpin>(b: B) -> (Vec<u8>, Option<HeaderMap>)
    where
        B::Error: std::fmt::Debug,
    {
        let collected = b.collect().await.expect("body");
        let trailers = collected.trailers().cloned();
        (collected.to_bytes().to_vec(), trailers)
    }

    #[tokio::test]
    async fn a_body_read_whole_within_the_bound_is_sent_again_with_its_trailers() {
        let held = Gauge::default();
        let (first, replay) =
            ReplayBody::new(body(&["ab", "cd"], true), 4, held.clone()).expect("fits");
        assert!(
            replay.body::<Chunks>().is_none(),
            "nothing is whole before it was read"
        );
        let (bytes, trailers) = read(first).await;
        assert_eq!(bytes, b"abcd");
        assert!(trailers.is_some());
        let again = replay.body::<Chunks>().expect("whole and kept");
        let (bytes, trailers) = read(again).await;
        assert_eq!(bytes, b"abcd");
        assert_eq!(
            trailers.and_then(|t| t.get("grpc-status").cloned()),
            Some(http::HeaderValue::from_static("0"))
        );
        assert_eq!(held.get(), 4, "the copy is counted while kept");
        let third = replay.body::<Chunks>().expect("still kept");
        assert_eq!(
            read(third).await.0,
            b"abcd",
            "a body is replayed as often as asked"
        );
        drop(replay);
        assert_eq!(held.get(), 0, "uncounted with the last body");
    }

    #[tokio::test]
    async fn a_body_that_outgrows_the_bound_is_streamed_whole_but_never_replayed() {
        let held = Gauge::default();
        let (first, replay) = ReplayBody::new(body(&["ab", "cd", "e"], false), 4, held.clone())
            .expect("no length announced");
        assert_eq!(
            read(first).await.0,
            b"abcde",
            "the first try gets all of it"
        );
        assert!(replay.is_capped());
        assert!(replay.body::<Chunks>().is_none());
        assert!(replay.lock().chunks.is_empty(), "the copy was dropped");
        assert_eq!(held.get(), 0, "and uncounted");
    }

    #[tokio::test]
    async fn a_body_of_known_length_is_whole_at_its_last_frame() {
        let full = http_body_util::Full::new(Bytes::from_static(b"1234"));
        let (mut first, replay) = ReplayBody::new(full, 4, Gauge::default()).expect("fits");
        let frame = first.frame().await.expect("a frame").expect("data");
        assert_eq!(frame.data_ref().map(|d| d.len()), Some(4));
        let again = replay.body::<http_body_util::Full<Bytes>>();
        assert!(again.is_some(), "whole without polling past the end");
    }

    #[tokio::test]
    async fn a_body_announced_larger_than_the_bound_is_handed_back() {
        let full = http_body_util::Full::new(Bytes::from_static(b"12345"));
        assert!(ReplayBody::new(full, 4, Gauge::default()).is_err());
        let full = http_body_util::Full::new(Bytes::from_static(b"1234"));
        assert!(ReplayBody::new(full, 4, Gauge::default()).is_ok());
    }

    #[tokio::test]
    async fn an_empty_body_is_whole_before_it_is_polled() {
        let empty = http_body_util::Empty::<Bytes>::new();
        let (_first, replay) = ReplayBody::new(empty, 0, Gauge::default()).expect("fits");
        let again = replay
            .body::<http_body_util::Empty<Bytes>>()
            .expect("complete at once");
        assert!(again.is_end_stream());
        assert!(read(again).await.0.is_empty());
    }
}
