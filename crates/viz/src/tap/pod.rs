//! One tapped proxy: `Tap/Observe` opened at most once per window with the
//! window's share of the tap's rate as its `limit`, reopened when the proxy
//! ends it, retried with backoff when it cannot be reached. A failure is
//! said once (a notice naming the pod), not once per retry.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ballast_meshtls::IdentityName;
use linkerd2_proxy_api::tap::{self as proto, tap_client::TapClient, ObserveRequest};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Each proxy stream carries at most `limit` requests per window; the
/// proxy ends it then, and it is reopened when the window is over.
pub const RATE_WINDOW: Duration = Duration::from_secs(1);
/// Longest wait between attempts at a pod that cannot be tapped.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// HTTP/2 pings on a tap connection, and how long one may go unanswered.
const KEEPALIVE: Duration = Duration::from_secs(10);
/// Largest Tap event accepted from a proxy (headers are not asked for).
const MAX_EVENT_BYTES: usize = 1024 * 1024;

/// What a pod task tells the tap's driver.
#[derive(Debug)]
pub enum PodMsg {
    Event(usize, Box<proto::TapEvent>),
    /// The pod's stream ended; what it had in flight will not finish.
    Ended(usize),
    /// A line for the client.
    Notice(String),
}

/// A Tap API: opens a stream of events.
pub trait Observer: Send + 'static {
    type Events: Events;
    fn observe(
        &mut self,
        request: ObserveRequest,
    ) -> impl Future<Output = Result<Self::Events, tonic::Status>> + Send;
}

/// One open Tap stream.
pub trait Events: Send + 'static {
    /// The next event; `None` when the proxy ended the stream.
    fn next(
        &mut self,
    ) -> impl Future<Output = Result<Option<proto::TapEvent>, tonic::Status>> + Send;
}

/// The wait before attempt `failures + 1`: 1, 2, 4 ... 30 s.
pub fn backoff(failures: u32) -> Duration {
    let secs = 1u64 << failures.saturating_sub(1).min(5);
    Duration::from_secs(secs).min(MAX_BACKOFF)
}

/// Errors that retrying will not mend.
fn is_final(status: &tonic::Status) -> bool {
    use tonic::Code;
    matches!(
        status.code(),
        Code::PermissionDenied
            | Code::Unauthenticated
            | Code::Unimplemented
            | Code::InvalidArgument
    )
}

/// A status as one short line.
pub fn status_text(status: &tonic::Status) -> String {
    let message: String = status
        .message()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(200)
        .collect();
    if message.is_empty() {
        format!("{:?}", status.code())
    } else {
        format!("{:?}: {message}", status.code())
    }
}

/// Taps one pod until the driver goes away (its channel closes) or the pod
/// refuses for good. `label` names it in notices.
pub async fn run<O: Observer>(
    index: usize,
    label: String,
    mut observer: O,
    request: ObserveRequest,
    tx: mpsc::Sender<PodMsg>,
) {
    let mut failures: u32 = 0;
    loop {
        let opened_at = Instant::now();
        let status = match observer.observe(request.clone()).await {
            Ok(mut events) => {
                if failures > 0
                    && tx
                        .send(PodMsg::Notice(format!("pod {label}: tapping again")))
                        .await
                        .is_err()
                {
                    return;
                }
                failures = 0;
                let ended = loop {
                    match events.next().await {
                        Ok(Some(event)) => {
                            if tx
                                .send(PodMsg::Event(index, Box::new(event)))
                                .await
                                .is_err()
                            {
                                return;
                            }
                        }
                        Ok(None) => break None,
                        Err(status) => break Some(status),
                    }
                };
                if tx.send(PodMsg::Ended(index)).await.is_err() {
                    return;
                }
                ended
            }
            Err(status) => Some(status),
        };
        match status {
            None => {
                // The proxy ended the stream at its limit: the window's
                // share is spent; reopen when the window is over.
                tokio::time::sleep_until(opened_at + RATE_WINDOW).await;
            }
            Some(status) => {
                let last = is_final(&status);
                if failures == 0 || last {
                    let retry = if last {
                        "; not retried".to_string()
                    } else {
                        "; retrying with backoff".to_string()
                    };
                    let line = format!("pod {label}: cannot tap: {}{retry}", status_text(&status));
                    if tx.send(PodMsg::Notice(line)).await.is_err() {
                        return;
                    }
                }
                if last {
                    return;
                }
                failures = failures.saturating_add(1);
                tokio::time::sleep(backoff(failures)).await;
            }
        }
    }
}

/// How a pod's tap port is dialled.
#[derive(Clone)]
pub struct Dial {
    pub addr: SocketAddr,
    pub connect_timeout: Duration,
    /// mTLS: viz's client config and the name the proxy must prove.
    pub tls: Option<(Arc<rustls::ClientConfig>, IdentityName)>,
}

/// The proxy's Tap API over a lazily connected gRPC channel.
pub struct GrpcObserver {
    client: TapClient<tonic::transport::Channel>,
}

impl GrpcObserver {
    pub fn new(dial: Dial) -> Result<Self, String> {
        let Dial {
            addr,
            connect_timeout,
            tls,
        } = dial;
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| format!("invalid address {addr}: {e}"))?
            // A proxy that vanished without closing its connection is
            // noticed (and retried) rather than waited on forever.
            .http2_keep_alive_interval(KEEPALIVE)
            .keep_alive_timeout(KEEPALIVE);
        let channel =
            ballast_meshtls::io::lazy_channel(endpoint, addr.to_string(), tls, connect_timeout);
        Ok(Self {
            client: TapClient::new(channel).max_decoding_message_size(MAX_EVENT_BYTES),
        })
    }
}

impl Observer for GrpcObserver {
    type Events = tonic::Streaming<proto::TapEvent>;
    fn observe(
        &mut self,
        request: ObserveRequest,
    ) -> impl Future<Output = Result<Self::Events, tonic::Status>> + Send {
        let mut client = self.client.clone();
        async move {
            client
                .observe(request)
                .await
                .map(tonic::Response::into_inner)
        }
    }
}

impl Events for tonic::Streaming<proto::TapEvent> {
    fn next(
        &mut self,
    ) -> impl Future<Output = Result<Option<proto::TapEvent>, tonic::Status>> + Send {
        self.message()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::sync::Mutex;

    /// Answers each `observe` with the next scripted outcome: a stream of
    /// `n` events then its end, or an error. Records when each call came.
    #[derive(Clone)]
    struct Script {
        outcomes: Arc<Mutex<VecDeque<Result<usize, tonic::Status>>>>,
        calls: Arc<Mutex<Vec<Instant>>>,
        /// When the script runs out: a stream that never ends.
        then_hang: bool,
    }

    struct Scripted {
        left: Option<usize>,
    }

    impl Events for Scripted {
        fn next(
            &mut self,
        ) -> impl Future<Output = Result<Option<proto::TapEvent>, tonic::Status>> + Send {
            let next = match &mut self.left {
                Some(0) => Some(Ok(None)),
                Some(n) => {
                    *n -= 1;
                    Some(Ok(Some(proto::TapEvent::default())))
                }
                None => None,
            };
            async move {
                match next {
                    Some(r) => r,
                    None => std::future::pending().await,
                }
            }
        }
    }

    impl Observer for Script {
        type Events = Scripted;
        fn observe(
            &mut self,
            _: ObserveRequest,
        ) -> impl Future<Output = Result<Scripted, tonic::Status>> + Send {
            self.calls.lock().expect("lock").push(Instant::now());
            let next = self.outcomes.lock().expect("lock").pop_front();
            let hang = self.then_hang;
            async move {
                match next {
                    Some(Ok(n)) => Ok(Scripted { left: Some(n) }),
                    Some(Err(s)) => Err(s),
                    None if hang => Ok(Scripted { left: None }),
                    None => Err(tonic::Status::unavailable("script over")),
                }
            }
        }
    }

    fn script(outcomes: Vec<Result<usize, tonic::Status>>, then_hang: bool) -> Script {
        Script {
            outcomes: Arc::new(Mutex::new(outcomes.into())),
            calls: Arc::default(),
            then_hang,
        }
    }

    async fn drain(rx: &mut mpsc::Receiver<PodMsg>, until: Duration) -> Vec<PodMsg> {
        let mut got = Vec::new();
        let deadline = Instant::now() + until;
        while let Ok(Some(m)) = tokio::time::timeout_at(deadline, rx.recv()).await {
            got.push(m);
        }
        got
    }

    #[test]
    fn backoff_doubles_to_thirty_seconds() {
        let secs: Vec<u64> = (1..=8).map(|f| backoff(f).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 30, 30, 30]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_spent_stream_is_reopened_once_per_window() {
        let s = script(vec![Ok(2), Ok(2), Ok(2)], true);
        let (tx, mut rx) = mpsc::channel(64);
        let start = Instant::now();
        let task = tokio::spawn(run(
            0,
            "demo/a".into(),
            s.clone(),
            ObserveRequest::default(),
            tx,
        ));
        let got = drain(&mut rx, Duration::from_millis(3500)).await;
        let events = got
            .iter()
            .filter(|m| matches!(m, PodMsg::Event(0, _)))
            .count();
        assert_eq!(events, 6);
        let calls: Vec<Duration> = s
            .calls
            .lock()
            .expect("lock")
            .iter()
            .map(|t| *t - start)
            .collect();
        // Opened at 0, 1, 2 and 3 s: never twice within a window.
        assert_eq!(calls.len(), 4, "{calls:?}");
        for pair in calls.windows(2) {
            assert!(pair[1] - pair[0] >= RATE_WINDOW, "{calls:?}");
        }
        assert!(!got.iter().any(|m| matches!(m, PodMsg::Notice(_))));
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn an_unreachable_pod_is_said_once_and_retried_with_backoff() {
        let down = || Err(tonic::Status::unavailable("connection refused"));
        let s = script(vec![down(), down(), down(), Ok(1)], true);
        let (tx, mut rx) = mpsc::channel(64);
        let start = Instant::now();
        let task = tokio::spawn(run(
            3,
            "demo/b".into(),
            s.clone(),
            ObserveRequest::default(),
            tx,
        ));
        let got = drain(&mut rx, Duration::from_secs(10)).await;
        let notices: Vec<&String> = got
            .iter()
            .filter_map(|m| match m {
                PodMsg::Notice(n) => Some(n),
                _ => None,
            })
            .collect();
        assert_eq!(notices.len(), 2, "{notices:?}");
        assert!(
            notices[0].contains("pod demo/b: cannot tap: Unavailable: connection refused"),
            "{}",
            notices[0]
        );
        assert!(notices[0].contains("retrying"), "{}", notices[0]);
        assert_eq!(notices[1], "pod demo/b: tapping again");
        let calls: Vec<u64> = s
            .calls
            .lock()
            .expect("lock")
            .iter()
            .map(|t| (*t - start).as_secs())
            .collect();
        // Attempts at 0, then after 1, 2 and 4 s.
        assert_eq!(calls[..4], [0, 1, 3, 7]);
        assert_eq!(
            got.iter()
                .filter(|m| matches!(m, PodMsg::Event(3, _)))
                .count(),
            1
        );
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_is_final() {
        let s = script(
            vec![Err(tonic::Status::permission_denied("not viz"))],
            false,
        );
        let (tx, mut rx) = mpsc::channel(64);
        run(1, "demo/c".into(), s.clone(), ObserveRequest::default(), tx).await;
        let got = drain(&mut rx, Duration::from_secs(1)).await;
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            matches!(&got[0], PodMsg::Notice(n) if n.contains("PermissionDenied: not viz") && n.contains("not retried"))
        );
        assert_eq!(s.calls.lock().expect("lock").len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_task_ends_when_the_driver_is_gone() {
        let s = script(vec![Ok(1_000_000)], false);
        let (tx, rx) = mpsc::channel(1);
        let task = tokio::spawn(run(0, "demo/d".into(), s, ObserveRequest::default(), tx));
        drop(rx);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("ended")
            .expect("no panic");
    }
}
