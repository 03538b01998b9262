//! The gRPC services: `OutboundPolicies` and `InboundServerPolicies`.
//!
//! A Watch stream sends the subscription's latest message whenever it
//! changes. It has no task and no queue: the response body polls the shared
//! answer when the client has room, so a slow reader gets whatever is latest
//! then, and one that never reads holds only its stream's state. Answers
//! are whole gRPC frames encoded once per change and shared by every stream
//! (`grpc.rs` serves them by hand; tonic's generated server would encode
//! each again per stream, in an 8 KiB buffer of its own).

use super::{PolicyMetrics, PolicyStore, PolicyWatch};
use crate::{authority, index::Target, resource::ObjectKey};
use ballast_admin::MemoryBudget;
use ballast_store::latest::LatestReader;
use bytes::Bytes;
use futures_util::Stream;
use linkerd2_proxy_api::{
    inbound::PortSpec,
    outbound::{traffic_spec, TrafficSpec},
};
use std::{
    future::Future,
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, Waker},
};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tonic::Status;

/// Concurrent policy Watch streams (both APIs) before new ones are refused
/// with `RESOURCE_EXHAUSTED`. A proxy holds one per outbound target and one
/// per inbound port.
pub const DEFAULT_MAX_POLICY_STREAMS: u32 = 20_000;

/// Both policy services over one [`PolicyStore`].
#[derive(Clone)]
pub struct PolicyService {
    policy: Arc<PolicyStore>,
    streams: Arc<Semaphore>,
    shutdown: watch::Receiver<bool>,
    max_request_bytes: usize,
    memory: MemoryBudget,
}

impl PolicyService {
    pub fn new(
        policy: Arc<PolicyStore>,
        max_streams: usize,
        max_request_bytes: usize,
        memory: MemoryBudget,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        Self {
            policy,
            streams: Arc::new(Semaphore::new(max_streams)),
            shutdown,
            max_request_bytes,
            memory,
        }
    }

    /// `OutboundPolicies` as a tower service for tonic's router.
    pub fn outbound_server(&self) -> super::grpc::OutboundGrpc {
        super::grpc::OutboundGrpc::new(self.clone())
    }

    /// `InboundServerPolicies` as a tower service for tonic's router.
    pub fn inbound_server(&self) -> super::grpc::InboundGrpc {
        super::grpc::InboundGrpc::new(self.clone())
    }

    /// Largest request message accepted.
    pub fn max_request_bytes(&self) -> usize {
        self.max_request_bytes
    }

    /// `OutboundPolicies.Get`: the current answer as a gRPC frame.
    pub fn get(&self, spec: TrafficSpec) -> Result<Bytes, Status> {
        let target = self.outbound_target(spec)?;
        self.policy
            .watch_outbound(target)
            .current()
            .ok_or_else(|| Status::not_found("no such service"))
    }

    /// `OutboundPolicies.Watch`: the answers as gRPC frames.
    pub fn watch(&self, spec: TrafficSpec) -> Result<Answers, Status> {
        let target = self.outbound_target(spec)?;
        let permit = self.permit("OutboundPolicies.Watch")?;
        let watch = self.policy.watch_outbound(target);
        self.stream(watch, "outbound", permit)
    }

    /// `InboundServerPolicies.GetPort`: the current answer as a gRPC frame.
    pub fn get_port(&self, spec: &PortSpec) -> Result<Bytes, Status> {
        let (pod, port) = inbound_key(spec)?;
        self.policy
            .watch_inbound(pod, port)
            .current()
            .ok_or_else(|| Status::not_found("no such pod"))
    }

    /// `InboundServerPolicies.WatchPort`: the answers as gRPC frames.
    pub fn watch_port(&self, spec: &PortSpec) -> Result<Answers, Status> {
        let (pod, port) = inbound_key(spec)?;
        let permit = self.permit("InboundServerPolicies.WatchPort")?;
        let watch = self.policy.watch_inbound(pod, port);
        self.stream(watch, "inbound", permit)
    }

    fn permit(&self, api: &'static str) -> Result<OwnedSemaphorePermit, Status> {
        if self.memory.refuse(api) {
            return Err(crate::server::memory_refusal());
        }
        self.streams.clone().try_acquire_owned().map_err(|_| {
            self.policy.metrics().streams_refused_total.inc();
            Status::resource_exhausted("too many policy streams; retry later")
        })
    }

    fn outbound_target(&self, spec: TrafficSpec) -> Result<Target, Status> {
        match spec.target {
            None => Err(Status::invalid_argument("target is required")),
            Some(traffic_spec::Target::Addr(addr)) => {
                let addr = SocketAddr::try_from(addr)
                    .map_err(|_| Status::invalid_argument("target address is not an IP address"))?;
                if addr.port() == 0 {
                    return Err(Status::invalid_argument("target port must not be zero"));
                }
                Ok(Target::Addr(addr))
            }
            Some(traffic_spec::Target::Authority(a)) => {
                authority::parse(&a, &self.policy.config().mesh.cluster_domain)
                    .map_err(|e| Status::invalid_argument(e.to_string()))
            }
        }
    }

    /// A stream of the watch's answers, first the current one; it ends
    /// with NOT_FOUND when the target goes, or cleanly at shutdown.
    fn stream(
        &self,
        watch: PolicyWatch,
        api: &'static str,
        permit: OwnedSemaphorePermit,
    ) -> Result<Answers, Status> {
        let PolicyWatch { mut rx, _guard } = watch;
        let first = rx
            .current()
            .ok_or_else(|| Status::not_found("no such target"))?;
        let gauge = self
            .policy
            .metrics()
            .streams
            .get_or_create(&PolicyMetrics::api(api))
            .clone();
        gauge.inc();
        let open = OpenStream {
            gauge,
            _permit: permit,
            _subscription: _guard,
        };
        let shutdown = self.shutdown.clone();
        let mut shutdown_wait = shutdown.clone();
        let stopped = async move {
            // The guard `wait_for` returns must not outlive this future's poll.
            let _ = shutdown_wait.wait_for(|s| *s).await.map(|_| ());
        };
        // No task and no queue per stream: the response body polls the
        // subscription's latest answer when the client has room for it.
        Ok(Answers {
            first: Some(first),
            changes: rx,
            stopped: Box::pin(stopped),
            stopped_waker: None,
            shutdown,
            done: false,
            _open: open,
        })
    }
}

/// A Watch stream's answers: the current one, then each new one, until the
/// target goes (`NOT_FOUND`), the controller stops (a clean end) or sheds
/// the stream for memory (`RESOURCE_EXHAUSTED` with a retry hint). One
/// state machine rather than a stack of stream combinators: it is polled
/// once per stream per change. Its messages are whole gRPC frames shared
/// with every other stream on its subscription; the response body holds
/// it inline (`crate::server::ResponseBody`).
pub struct Answers {
    first: Option<Bytes>,
    /// The subscription's answer; it ends (`None`) when the stream is shed.
    changes: LatestReader<Option<Bytes>>,
    /// Shutdown.
    stopped: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// The waker `stopped` was last polled with: while it is the same and
    /// the shutdown watch did not change, `stopped` is not polled again
    /// (each poll of it takes a lock shared by every stream).
    stopped_waker: Option<Waker>,
    shutdown: watch::Receiver<bool>,
    done: bool,
    /// The stream's count, permit and subscription.
    _open: OpenStream,
}

impl Answers {
    /// Whether `stopped` must be polled: never polled with this waker, or
    /// the watch it waits on changed (this receiver never marks a value
    /// seen, so a change stays visible).
    fn may_have_stopped(&self, cx: &Context<'_>) -> bool {
        !self
            .stopped_waker
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
            || self.shutdown.has_changed().unwrap_or(true)
    }

    /// The end of a stream whose answers stopped: shed, or a clean end.
    fn end(&mut self) -> Option<Result<Bytes, Status>> {
        self.done = true;
        self.changes
            .is_closed()
            .then(|| Err(crate::server::memory_closed()))
    }
}

impl Stream for Answers {
    type Item = Result<Bytes, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        if this.may_have_stopped(cx) {
            if this.stopped.as_mut().poll(cx).is_ready() {
                return Poll::Ready(this.end());
            }
            this.stopped_waker = Some(cx.waker().clone());
        }
        if let Some(first) = this.first.take() {
            if this.changes.is_closed() {
                return Poll::Ready(this.end());
            }
            return Poll::Ready(Some(Ok(first)));
        }
        match this.changes.poll_changed(cx) {
            Poll::Ready(Some(Some(frame))) => Poll::Ready(Some(Ok(frame))),
            Poll::Ready(Some(None)) => {
                this.done = true;
                Poll::Ready(Some(Err(Status::not_found("target no longer exists"))))
            }
            Poll::Ready(None) => Poll::Ready(this.end()),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Keeps a stream counted and its permit held while it lives.
struct OpenStream {
    gauge: prometheus_client::metrics::gauge::Gauge,
    _permit: OwnedSemaphorePermit,
    _subscription: super::Guard,
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// Linkerd's workload names: `{"ns":"NS","pod":"NAME"}` or `NS:NAME`.
pub fn parse_workload(s: &str) -> Result<ObjectKey, Status> {
    #[derive(serde::Deserialize)]
    struct Workload {
        ns: String,
        pod: Option<String>,
    }
    let bad = || Status::invalid_argument("workload must be {\"ns\":NS,\"pod\":NAME} or NS:NAME");
    if s.len() > 512 {
        return Err(bad());
    }
    let (ns, pod) = if s.trim_start().starts_with('{') {
        let w: Workload = serde_json::from_str(s).map_err(|_| bad())?;
        (w.ns, w.pod.ok_or_else(bad)?)
    } else {
        let (ns, pod) = s.split_once(':').ok_or_else(bad)?;
        (ns.to_string(), pod.to_string())
    };
    if ns.is_empty() || pod.is_empty() {
        return Err(bad());
    }
    Ok(ObjectKey::new(ns, pod))
}

fn inbound_key(spec: &PortSpec) -> Result<(ObjectKey, u16), Status> {
    let pod = parse_workload(&spec.workload)?;
    let port = u16::try_from(spec.port)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| Status::invalid_argument("port must be in 1..=65535"))?;
    Ok((pod, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_parse_in_both_of_linkerds_forms() {
        let k = ObjectKey::new("shop", "web-1");
        assert_eq!(parse_workload(r#"{"ns":"shop","pod":"web-1"}"#).unwrap(), k);
        assert_eq!(parse_workload("shop:web-1").unwrap(), k);
        for bad in [
            "",
            "shop",
            ":web",
            "shop:",
            r#"{"ns":"shop"}"#,
            "{",
            &"x".repeat(600),
        ] {
            assert_eq!(
                parse_workload(bad).unwrap_err().code(),
                tonic::Code::InvalidArgument,
                "{bad}"
            );
        }
    }
}

#[cfg(test)]
mod answers_tests {
    use super::*;
    use crate::{
        index::{Index, IndexConfig},
        metrics::Metrics,
        policy::{Key, PolicyConfig},
        resource::Resource,
        store::{Op, Store},
    };
    use futures_util::{FutureExt, StreamExt};
    use serde_json::json;
    use tonic::Code;

    fn web() -> Op {
        Op::Apply(
            Resource::from_value(json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"namespace": "a", "name": "web"},
                "spec": {"clusterIP": "10.96.0.1", "selector": {"app": "web"},
                         "ports": [{"port": 80, "targetPort": 8080}]},
            }))
            .unwrap()
            .unwrap(),
        )
    }

    struct World {
        store: Arc<Store>,
        policy: Arc<PolicyStore>,
        service: PolicyService,
        stop: watch::Sender<bool>,
    }

    fn world() -> World {
        let store = Store::new(Index::new(IndexConfig::default()), Metrics::default());
        store.update(vec![web()]);
        let policy = PolicyStore::new(
            store.clone(),
            PolicyConfig::default(),
            PolicyMetrics::default(),
        );
        let (stop, shutdown) = watch::channel(false);
        let service = PolicyService::new(
            policy.clone(),
            10,
            16 << 10,
            MemoryBudget::unstarted(None),
            shutdown,
        );
        World {
            store,
            policy,
            service,
            stop,
        }
    }

    fn to_web() -> TrafficSpec {
        TrafficSpec {
            source_workload: "test".into(),
            target: Some(traffic_spec::Target::Authority(
                "web.a.svc.cluster.local:80".into(),
            )),
        }
    }

    fn open_streams(w: &World) -> i64 {
        w.policy
            .metrics()
            .streams
            .get_or_create(&PolicyMetrics::api("outbound"))
            .get()
    }

    /// The next item, which must be there already.
    fn ready(s: &mut Answers) -> Option<Result<Bytes, Status>> {
        s.next().now_or_never().expect("an item is ready")
    }

    #[tokio::test]
    async fn the_first_answer_then_each_change_then_not_found_when_the_target_goes() {
        let w = world();
        let mut s = w.service.watch(to_web()).unwrap();
        assert_eq!(open_streams(&w), 1);
        let first = ready(&mut s).unwrap().unwrap();
        assert!(s.next().now_or_never().is_none(), "nothing new yet");
        w.store.update(vec![Op::Apply(
            Resource::from_value(json!({
                "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                "metadata": {"name": "r", "namespace": "a"},
                "spec": {"parentRefs": [{"group": "core", "kind": "Service", "name": "web", "port": 80}],
                         "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]},
            }))
            .unwrap()
            .unwrap(),
        )]);
        let changed = ready(&mut s).unwrap().unwrap();
        assert_ne!(changed, first);
        w.store.update(vec![Op::Delete(
            crate::resource::Kind::Service,
            ObjectKey::new("a", "web"),
        )]);
        let gone = ready(&mut s).unwrap().unwrap_err();
        assert_eq!(gone.code(), Code::NotFound, "{gone:?}");
        assert!(ready(&mut s).is_none(), "nothing after the status");
        drop(s);
        assert_eq!(open_streams(&w), 0, "the stream's count is released");
    }

    #[tokio::test]
    async fn shutdown_ends_a_stream_cleanly() {
        let w = world();
        let mut s = w.service.watch(to_web()).unwrap();
        ready(&mut s).unwrap().unwrap();
        assert!(s.next().now_or_never().is_none());
        w.stop.send_replace(true);
        assert!(ready(&mut s).is_none(), "a clean end, no status");
    }

    #[tokio::test]
    async fn a_parked_stream_polled_again_is_still_woken_by_shutdown_and_shedding() {
        use futures_util::task::ArcWake;
        use std::sync::atomic::{AtomicUsize, Ordering};
        struct Count(AtomicUsize);
        impl ArcWake for Count {
            fn wake_by_ref(c: &Arc<Self>) {
                c.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        for shed in [false, true] {
            let w = world();
            let mut s = w.service.watch(to_web()).unwrap();
            ready(&mut s).unwrap().unwrap();
            let count = Arc::new(Count(AtomicUsize::new(0)));
            let waker = futures_util::task::waker(count.clone());
            let mut cx = Context::from_waker(&waker);
            // Parked, then polled again with the same waker: the second poll
            // does not register again, and must not need to.
            assert!(Pin::new(&mut s).poll_next(&mut cx).is_pending());
            assert!(Pin::new(&mut s).poll_next(&mut cx).is_pending());
            if shed {
                let target = Target::Service {
                    service: ObjectKey::new("a", "web"),
                    port: 80,
                };
                assert_eq!(w.policy.shed(&Key::Outbound(target)), 1);
            } else {
                w.stop.send_replace(true);
            }
            assert!(count.0.load(Ordering::SeqCst) > 0, "woken (shed: {shed})");
            match Pin::new(&mut s).poll_next(&mut cx) {
                Poll::Ready(None) => assert!(!shed, "a shed stream ends with a status"),
                Poll::Ready(Some(Err(status))) => {
                    assert!(shed);
                    assert_eq!(status.code(), Code::ResourceExhausted);
                }
                other => panic!("not ended (shed: {shed}): {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn a_shed_stream_ends_with_resource_exhausted() {
        let w = world();
        let mut s = w.service.watch(to_web()).unwrap();
        ready(&mut s).unwrap().unwrap();
        let target = Target::Service {
            service: ObjectKey::new("a", "web"),
            port: 80,
        };
        assert_eq!(w.policy.shed(&Key::Outbound(target)), 1);
        let shed = ready(&mut s).unwrap().unwrap_err();
        assert_eq!(shed.code(), Code::ResourceExhausted, "{shed:?}");
        assert!(ready(&mut s).is_none());
    }
}
