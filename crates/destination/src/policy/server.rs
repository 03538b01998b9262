//! The gRPC services: `OutboundPolicies` and `InboundServerPolicies`.
//!
//! A Watch stream sends the subscription's latest message whenever it
//! changes. At most one message waits for a client: when it reads slowly,
//! HTTP/2 flow control stops the stream from being polled, the producer
//! waits, and what it sends next is whatever is latest then.

use super::{PolicyMetrics, PolicyStore, PolicyWatch};
use crate::{authority, index::Target, resource::ObjectKey};
use futures_util::Stream;
use linkerd2_proxy_api::{
    inbound::{
        self,
        inbound_server_policies_server::{InboundServerPolicies, InboundServerPoliciesServer},
        PortSpec,
    },
    outbound::{
        self,
        outbound_policies_server::{OutboundPolicies, OutboundPoliciesServer},
        traffic_spec, TrafficSpec,
    },
};
use std::{net::SocketAddr, pin::Pin, sync::Arc};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tonic::{Request, Response, Status};

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
}

type WatchStream<M> = Pin<Box<dyn Stream<Item = Result<M, Status>> + Send>>;

impl PolicyService {
    pub fn new(
        policy: Arc<PolicyStore>,
        max_streams: usize,
        max_request_bytes: usize,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        Self {
            policy,
            streams: Arc::new(Semaphore::new(max_streams)),
            shutdown,
            max_request_bytes,
        }
    }

    pub fn outbound_server(&self) -> OutboundPoliciesServer<Self> {
        OutboundPoliciesServer::new(self.clone()).max_decoding_message_size(self.max_request_bytes)
    }

    pub fn inbound_server(&self) -> InboundServerPoliciesServer<Self> {
        InboundServerPoliciesServer::new(self.clone())
            .max_decoding_message_size(self.max_request_bytes)
    }

    fn permit(&self) -> Result<OwnedSemaphorePermit, Status> {
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
    fn stream<M: Clone + Send + Sync + 'static>(
        &self,
        mut watch: PolicyWatch<M>,
        api: &'static str,
        permit: OwnedSemaphorePermit,
    ) -> Result<WatchStream<M>, Status> {
        let first = watch
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
        };
        let mut shutdown = self.shutdown.clone();
        let s = async_stream(move |tx| async move {
            let _open = open;
            if !tx.send(Ok((*first).clone())).await {
                return;
            }
            loop {
                tokio::select! {
                    biased;
                    () = stopped(&mut shutdown) => return,
                    next = watch.changed() => match next {
                        Ok(Some(msg)) => {
                            if !tx.send(Ok((*msg).clone())).await {
                                return;
                            }
                        }
                        Ok(None) => {
                            let _ = tx.send(Err(Status::not_found("target no longer exists"))).await;
                            return;
                        }
                        Err(()) => return,
                    },
                }
            }
        });
        Ok(s)
    }
}

async fn stopped(rx: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns must not live across the caller's awaits.
    let _ = rx.wait_for(|s| *s).await.map(|_| ());
}

/// Keeps a stream counted and its permit held while it lives.
struct OpenStream {
    gauge: prometheus_client::metrics::gauge::Gauge,
    _permit: OwnedSemaphorePermit,
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// A stream driven by a producer task that hands over one item at a time:
/// the producer waits until the consumer took the previous item (a
/// rendezvous of capacity one), so nothing accumulates for a slow reader.
fn async_stream<M, F, Fut>(produce: F) -> WatchStream<M>
where
    M: Send + 'static,
    F: FnOnce(Sender<M>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let task = tokio::spawn(produce(Sender(tx)));
    Box::pin(ProducedStream {
        rx: tokio_stream::wrappers::ReceiverStream::new(rx),
        task,
    })
}

struct Sender<M>(tokio::sync::mpsc::Sender<Result<M, Status>>);

impl<M> Sender<M> {
    /// False when the consumer is gone.
    async fn send(&self, item: Result<M, Status>) -> bool {
        self.0.send(item).await.is_ok()
    }
}

struct ProducedStream<M> {
    rx: tokio_stream::wrappers::ReceiverStream<Result<M, Status>>,
    task: tokio::task::JoinHandle<()>,
}

impl<M> Stream for ProducedStream<M> {
    type Item = Result<M, Status>;

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        Pin::new(&mut self.rx).poll_next(cx)
    }
}

impl<M> Drop for ProducedStream<M> {
    fn drop(&mut self) {
        // The client went away: release the subscription now.
        self.task.abort();
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

#[tonic::async_trait]
impl OutboundPolicies for PolicyService {
    async fn get(
        &self,
        req: Request<TrafficSpec>,
    ) -> Result<Response<outbound::OutboundPolicy>, Status> {
        let target = self.outbound_target(req.into_inner())?;
        let mut watch = self.policy.watch_outbound(target);
        let msg = watch
            .current()
            .ok_or_else(|| Status::not_found("no such service"))?;
        Ok(Response::new((*msg).clone()))
    }

    type WatchStream = WatchStream<outbound::OutboundPolicy>;

    async fn watch(
        &self,
        req: Request<TrafficSpec>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let target = self.outbound_target(req.into_inner())?;
        let permit = self.permit()?;
        let watch = self.policy.watch_outbound(target);
        self.stream(watch, "outbound", permit).map(Response::new)
    }
}

#[tonic::async_trait]
impl InboundServerPolicies for PolicyService {
    async fn get_port(&self, req: Request<PortSpec>) -> Result<Response<inbound::Server>, Status> {
        let (pod, port) = inbound_key(req.get_ref())?;
        let mut watch = self.policy.watch_inbound(pod, port);
        let msg = watch
            .current()
            .ok_or_else(|| Status::not_found("no such pod"))?;
        Ok(Response::new((*msg).clone()))
    }

    type WatchPortStream = WatchStream<inbound::Server>;

    async fn watch_port(
        &self,
        req: Request<PortSpec>,
    ) -> Result<Response<Self::WatchPortStream>, Status> {
        let (pod, port) = inbound_key(req.get_ref())?;
        let permit = self.permit()?;
        let watch = self.policy.watch_inbound(pod, port);
        self.stream(watch, "inbound", permit).map(Response::new)
    }
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
