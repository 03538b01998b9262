//! `OutboundPolicies.Watch`: a target's routes and backends, as a
//! latest-value watch over the one controller connection.
//!
//! A controller that does not implement the API (`UNIMPLEMENTED`), or that
//! refuses the target (`INVALID_ARGUMENT`), gets the proxy's routing without
//! policy for that target, for good (the stream is not opened again). Any
//! other failure keeps the last policy and opens the stream again after the
//! control plane's backoff ([`super::stream::follow`]).

use super::{
    control::ControlPlane,
    snapshot::{self, Held, Kind},
    stream, AbortOnDrop, Endpoint,
};
use linkerd2_proxy_api::{
    destination::WeightedAddr,
    outbound::{outbound_policies_client::OutboundPoliciesClient, OutboundPolicy, TrafficSpec},
};
use prost::Message;
use std::{
    fmt::Display,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};
use tokio::sync::watch;

/// What the controller has said of a target's policy.
#[derive(Debug)]
pub enum PolicyState<T> {
    /// No answer yet.
    Pending,
    /// The newest valid policy.
    Known(Arc<T>),
    /// The controller has no policy API, or none for this target: route as
    /// without policy.
    Fallback,
}

impl<T> Clone for PolicyState<T> {
    fn clone(&self) -> Self {
        match self {
            Self::Pending => Self::Pending,
            Self::Known(p) => Self::Known(p.clone()),
            Self::Fallback => Self::Fallback,
        }
    }
}

/// Turns a message into the policy the proxy acts on; a message it cannot
/// act on is refused (the last policy stays).
pub type ConvertPolicy<T, E> = fn(OutboundPolicy) -> Result<T, E>;

/// One target's policy, kept current while this handle lives.
#[derive(Debug)]
pub struct PolicyWatch<T> {
    rx: watch::Receiver<PolicyState<T>>,
    /// Set once a wait for the first answer ran out: later callers do not
    /// wait again (the controller may never answer for this target).
    waited: AtomicBool,
    /// The stream's task and the gauge's count (none in tests).
    _task: Option<(AbortOnDrop, OpenWatch)>,
}

/// Counts the watch in `outbound_policy_watches` while it lives.
#[derive(Debug)]
struct OpenWatch(Arc<crate::metrics::Metrics>);

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.0.outbound_policy.watches.dec();
    }
}

impl<T: Send + Sync + 'static> PolicyWatch<T> {
    pub(crate) fn spawn<E: Display + 'static>(
        control: ControlPlane,
        spec: TrafficSpec,
        convert: ConvertPolicy<T, E>,
    ) -> Self {
        let (tx, rx) = watch::channel(PolicyState::Pending);
        let max_message = control.config.max_message_bytes;
        control.metrics.outbound_policy.watches.inc();
        let open = OpenWatch(control.metrics.clone());
        let target = describe(&spec);
        let key: Arc<str> = Arc::from(snapshot_key(&spec));
        let restored = control.restored(Kind::Outbound, &key);
        let task = tokio::spawn(async move {
            let alive = Arc::new(());
            let serving = std::sync::Mutex::new(None);
            let follow = stream::follow(
                &control,
                "outbound_policy",
                |channel| {
                    let spec = spec.clone();
                    async move {
                        OutboundPoliciesClient::new(channel)
                            .max_decoding_message_size(max_message)
                            .watch(spec)
                            .await
                    }
                },
                |message: OutboundPolicy, _| {
                    snapshot::answered(&serving);
                    let encoded = control.book.as_ref().map(|_| message.encode_to_vec());
                    match convert(message) {
                        Ok(policy) => {
                            if let (Some(book), Some(encoded)) = (&control.book, encoded) {
                                book.record(
                                    Kind::Outbound,
                                    &key,
                                    Held::Encoded(encoded.into()),
                                    &alive,
                                );
                            }
                            tx.send_replace(PolicyState::Known(Arc::new(policy)));
                        }
                        Err(error) => {
                            let error: String = error.to_string().chars().take(256).collect();
                            tracing::warn!(%target, %error, "refused an outbound policy; keeping the last one");
                        }
                    }
                },
            );
            let from_snapshot = snapshot::serve_after_wait(
                restored,
                Kind::Outbound,
                &serving,
                || matches!(*tx.borrow(), PolicyState::Pending),
                |message| match OutboundPolicy::decode(message).map(convert) {
                    Ok(Ok(policy)) => {
                        tx.send_replace(PolicyState::Known(Arc::new(policy)));
                        true
                    }
                    _ => false,
                },
            );
            let status = tokio::select! {
                status = follow => status,
                never = from_snapshot => match never {},
            };
            drop(serving);
            tracing::debug!(%target, code = ?status.code(), "no outbound policy: routing without one");
            tx.send_replace(PolicyState::Fallback);
        });
        Self {
            rx,
            waited: AtomicBool::new(false),
            _task: Some((AbortOnDrop(task.abort_handle()), open)),
        }
    }
}

impl<T> PolicyWatch<T> {
    /// A watch the caller feeds (tests).
    #[cfg(test)]
    pub(crate) fn manual() -> (watch::Sender<PolicyState<T>>, Self) {
        let (tx, rx) = watch::channel(PolicyState::Pending);
        let w = Self {
            rx,
            waited: AtomicBool::new(false),
            _task: None,
        };
        (tx, w)
    }

    /// The policy now, waiting at most `timeout` for the first answer (only
    /// the first caller to find none waits).
    pub async fn get(&self, timeout: Duration) -> PolicyState<T> {
        let now = self.current();
        if !matches!(now, PolicyState::Pending) || self.waited.load(Ordering::Relaxed) {
            return now;
        }
        let mut rx = self.rx.clone();
        let answered = async move {
            rx.wait_for(|s| !matches!(s, PolicyState::Pending))
                .await
                .map(|s| s.clone())
                .ok()
        };
        match tokio::time::timeout(timeout, answered).await {
            Ok(Some(state)) => state,
            _ => {
                self.waited.store(true, Ordering::Relaxed);
                self.current()
            }
        }
    }

    /// The policy now.
    pub fn current(&self) -> PolicyState<T> {
        self.rx.borrow().clone()
    }

    /// Notified when the policy changes.
    pub fn changes(&self) -> watch::Receiver<PolicyState<T>> {
        self.rx.clone()
    }
}

/// A target as the snapshot names it: its whole spec, so two specs never
/// share an entry.
fn snapshot_key(spec: &TrafficSpec) -> String {
    use linkerd2_proxy_api::outbound::traffic_spec::Target;
    let target = match &spec.target {
        Some(Target::Authority(a)) => format!("authority:{a}"),
        Some(Target::Addr(a)) => match std::net::SocketAddr::try_from(*a) {
            Ok(a) => format!("addr:{a}"),
            Err(_) => "addr:invalid".into(),
        },
        None => "none".into(),
    };
    format!("{target} from {}", spec.source_workload)
}

/// A short description of a target, for logs.
fn describe(spec: &TrafficSpec) -> String {
    use linkerd2_proxy_api::outbound::traffic_spec::Target;
    match &spec.target {
        Some(Target::Authority(a)) => a.chars().take(256).collect(),
        Some(Target::Addr(a)) => std::net::SocketAddr::try_from(*a)
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "an invalid address".into()),
        None => "no target".into(),
    }
}

/// The endpoint a `Forward` backend names, as the Destination API would
/// describe it; `None` without a usable address.
pub fn forward_endpoint(addr: WeightedAddr) -> Option<Endpoint> {
    super::resolve::endpoint(addr, None, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(w: &PolicyState<u32>) -> Option<u32> {
        match w {
            PolicyState::Known(p) => Some(**p),
            _ => None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_answer_is_awaited_within_the_timeout_and_only_once() {
        let (tx, watch) = PolicyWatch::<u32>::manual();
        let timeout = Duration::from_millis(500);
        let started = tokio::time::Instant::now();
        let answer = tokio::spawn({
            let tx = tx.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                tx.send_replace(PolicyState::Known(Arc::new(7)));
            }
        });
        assert_eq!(known(&watch.get(timeout).await), Some(7));
        assert_eq!(started.elapsed(), Duration::from_millis(200));
        answer.await.expect("sent");

        // A target never answered: the first caller waits the timeout, the
        // next ones not at all; a later answer is seen at once.
        let (tx, watch) = PolicyWatch::<u32>::manual();
        let started = tokio::time::Instant::now();
        assert!(matches!(watch.get(timeout).await, PolicyState::Pending));
        assert_eq!(started.elapsed(), timeout);
        assert!(matches!(watch.get(timeout).await, PolicyState::Pending));
        assert_eq!(started.elapsed(), timeout, "no second wait");
        tx.send_replace(PolicyState::Known(Arc::new(1)));
        assert_eq!(known(&watch.get(timeout).await), Some(1));
        // The newest value wins; a fallback is final.
        tx.send_replace(PolicyState::Known(Arc::new(2)));
        assert_eq!(known(&watch.current()), Some(2));
        tx.send_replace(PolicyState::Fallback);
        assert!(matches!(watch.get(timeout).await, PolicyState::Fallback));
    }
}
