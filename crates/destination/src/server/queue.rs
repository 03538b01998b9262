//! One stream's bounded queue of ready gRPC frames, and the HTTP body that
//! drains it.
//!
//! The stream's task puts frames in ([`QueueSender`]); hyper takes them out
//! as the client's flow control allows ([`QueueBody`]). Frames are shared
//! bytes (encoded once for every stream of a subscription), so a queued
//! frame costs a reference, and the body hands it to HTTP/2 without a copy
//! or an encode buffer of its own. The status that ends the stream comes
//! after the frames queued before it, as trailers.

use bytes::Bytes;
use http::HeaderMap;
use http_body::Frame;
use std::{
    collections::VecDeque,
    future::poll_fn,
    pin::Pin,
    sync::{Arc, Mutex, MutexGuard},
    task::{Context, Poll, Waker},
    time::Duration,
};
use tonic::Status;

struct Queue {
    state: Mutex<State>,
    capacity: usize,
}

#[derive(Default)]
struct State {
    frames: VecDeque<Bytes>,
    /// The status that ends the stream once `frames` are sent.
    end: Option<Status>,
    /// Trailers were sent: nothing follows.
    ended: bool,
    /// The body was dropped: the client left or the connection closed.
    body_gone: bool,
    body_waker: Option<Waker>,
    sender_waker: Option<Waker>,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding it; a poisoned queue is still whole.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A queue of at most `capacity` frames.
pub fn queue(capacity: usize) -> (QueueSender, QueueBody) {
    let q = Arc::new(Queue {
        state: Mutex::new(State::default()),
        capacity: capacity.max(1),
    });
    (QueueSender(q.clone()), QueueBody(q))
}

/// What became of a frame offered to the queue.
#[derive(Debug, PartialEq, Eq)]
pub enum Sent {
    Queued,
    /// The body is gone; nothing will be read.
    Gone,
    /// The queue stayed full for the whole wait.
    Full,
}

/// The stream task's end of the queue. Dropping it ends the stream with
/// status OK, unless [`QueueSender::finish`] named another.
pub struct QueueSender(Arc<Queue>);

impl QueueSender {
    /// Queues `frame`, waiting at most `wait` for room.
    pub async fn send(&self, frame: Bytes, wait: Duration) -> Sent {
        let mut frame = Some(frame);
        let room = poll_fn(|cx| {
            let mut s = self.0.lock();
            if s.body_gone {
                return Poll::Ready(Sent::Gone);
            }
            if s.frames.len() < self.0.capacity {
                if let Some(frame) = frame.take() {
                    s.frames.push_back(frame);
                }
                if let Some(w) = s.body_waker.take() {
                    w.wake();
                }
                return Poll::Ready(Sent::Queued);
            }
            s.sender_waker = Some(cx.waker().clone());
            Poll::Pending
        });
        tokio::time::timeout(wait, room).await.unwrap_or(Sent::Full)
    }

    /// Resolves once the body is gone.
    pub async fn closed(&self) {
        poll_fn(|cx| {
            let mut s = self.0.lock();
            if s.body_gone {
                return Poll::Ready(());
            }
            s.sender_waker = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    /// Ends the stream with `status` after the frames already queued.
    pub fn finish(self, status: Status) {
        let mut s = self.0.lock();
        s.end.get_or_insert(status);
        if let Some(w) = s.body_waker.take() {
            w.wake();
        }
    }

    #[cfg(test)]
    pub fn queued(&self) -> usize {
        self.0.lock().frames.len()
    }
}

impl Drop for QueueSender {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.end.get_or_insert_with(|| Status::ok(""));
        if let Some(w) = s.body_waker.take() {
            w.wake();
        }
    }
}

/// The response body of one stream: its queued frames, then the trailers.
pub struct QueueBody(Arc<Queue>);

impl http_body::Body for QueueBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let mut s = self.0.lock();
        if let Some(frame) = s.frames.pop_front() {
            if s.frames.is_empty() && s.frames.capacity() > 8 {
                // A burst (a large answer) is over: give its slots back.
                s.frames = VecDeque::new();
            }
            if let Some(w) = s.sender_waker.take() {
                w.wake();
            }
            return Poll::Ready(Some(Ok(Frame::data(frame))));
        }
        if let Some(status) = s.end.take() {
            s.ended = true;
            let mut trailers = HeaderMap::new();
            if status.add_header(&mut trailers).is_err() {
                trailers.insert(Status::GRPC_STATUS, (status.code() as i32).into());
            }
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        if s.ended {
            return Poll::Ready(None);
        }
        s.body_waker = Some(cx.waker().clone());
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        let s = self.0.lock();
        s.ended && s.frames.is_empty()
    }
}

impl Drop for QueueBody {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.body_gone = true;
        s.frames.clear();
        if let Some(w) = s.sender_waker.take() {
            w.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn frame(n: u8) -> Bytes {
        Bytes::from(vec![n])
    }

    #[tokio::test(start_paused = true)]
    async fn frames_then_the_closing_status_in_order() {
        let (tx, mut body) = queue(2);
        assert_eq!(
            tx.send(frame(1), Duration::from_secs(1)).await,
            Sent::Queued
        );
        assert_eq!(
            tx.send(frame(2), Duration::from_secs(1)).await,
            Sent::Queued
        );
        // Full: the sender waits out its wait, and the queue stays bounded.
        let started = tokio::time::Instant::now();
        assert_eq!(tx.send(frame(3), Duration::from_secs(1)).await, Sent::Full);
        assert_eq!(started.elapsed(), Duration::from_secs(1));
        assert_eq!(tx.queued(), 2);
        tx.finish(Status::resource_exhausted("did not read"));

        let mut got = Vec::new();
        while let Some(Ok(f)) = body.frame().await {
            match f.into_data() {
                Ok(d) => got.push(d[0]),
                Err(f) => {
                    let t = f.into_trailers().unwrap();
                    let status = Status::from_header_map(&t).unwrap();
                    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
                    got.push(0);
                }
            }
        }
        assert_eq!(got, vec![1, 2, 0]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_makes_room_for_a_waiting_sender() {
        let (tx, mut body) = queue(1);
        assert_eq!(
            tx.send(frame(1), Duration::from_secs(1)).await,
            Sent::Queued
        );
        let read = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let first = body.frame().await;
            (first, body)
        });
        assert_eq!(
            tx.send(frame(2), Duration::from_secs(1)).await,
            Sent::Queued
        );
        let (first, mut body) = read.await.unwrap();
        assert_eq!(first.unwrap().unwrap().into_data().unwrap()[0], 1);
        drop(tx);
        assert_eq!(
            body.frame().await.unwrap().unwrap().into_data().unwrap()[0],
            2
        );
        let t = body
            .frame()
            .await
            .unwrap()
            .unwrap()
            .into_trailers()
            .unwrap();
        assert_eq!(Status::from_header_map(&t).unwrap().code(), tonic::Code::Ok);
        assert!(body.frame().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_body_releases_the_sender() {
        let (tx, body) = queue(1);
        assert_eq!(
            tx.send(frame(1), Duration::from_secs(1)).await,
            Sent::Queued
        );
        let waiting = tokio::spawn(async move {
            let sent = tx.send(frame(2), Duration::from_secs(60)).await;
            tx.closed().await;
            sent
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(body);
        assert_eq!(waiting.await.unwrap(), Sent::Gone);
    }
}
