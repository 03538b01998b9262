//! A controller that serves what the test says, however unreasonable:
//! `Get` answers by path (one endpoint set, or a script of `Add` messages
//! of any size, the proxy's own listeners included), and (unless started
//! without it) `OutboundPolicies.Watch` answers by target authority that
//! the test can change while streams are open. One fake for every proxy
//! test that needs a controller it can steer.

use futures_util::{Stream, StreamExt};
use linkerd2_proxy_api::{
    destination::{
        destination_server::{Destination, DestinationServer},
        update, DestinationProfile, GetDestination, Update, WeightedAddr, WeightedAddrSet,
    },
    outbound::{
        self as out,
        outbound_policies_server::{OutboundPolicies, OutboundPoliciesServer},
        OutboundPolicy, TrafficSpec,
    },
};
use std::{
    collections::HashMap,
    net::{Ipv4Addr, SocketAddr},
    pin::Pin,
    sync::{Arc, Mutex},
};
use tokio::{net::TcpListener, sync::watch, task::JoinHandle};
use tonic::{transport::server::TcpIncoming, Status};

type Stream_<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// What a `Get` for one path is answered by [`FakeController::answer`]:
/// one `Add` message per entry, then the stream stays open.
pub type Script = Vec<Vec<SocketAddr>>;

#[derive(Clone, Default)]
struct State {
    /// The `Get` answer of each path: these updates, then nothing more.
    answers: Arc<Mutex<HashMap<String, Vec<Update>>>>,
    policies: Arc<Mutex<HashMap<String, watch::Sender<Option<OutboundPolicy>>>>>,
    /// The `source_workload` of every Watch received.
    sources: Arc<Mutex<Vec<String>>>,
    /// The path of every Get received, in order.
    gets: Arc<Mutex<Vec<String>>>,
}

impl State {
    fn policy(&self, authority: &str) -> watch::Receiver<Option<OutboundPolicy>> {
        let mut all = self.policies.lock().unwrap();
        all.entry(authority.to_string())
            .or_insert_with(|| watch::channel(None).0)
            .subscribe()
    }
}

/// An `Add` of `addrs`, weight 10,000 each; with `labels`, the set carries
/// `namespace="shop"` and each address `pod="pod-IP"`.
fn add(addrs: &[SocketAddr], labels: bool) -> Update {
    let pod = |a: &SocketAddr| {
        if labels {
            [("pod".to_string(), format!("pod-{}", a.ip()))].into()
        } else {
            HashMap::new()
        }
    };
    Update {
        update: Some(update::Update::Add(WeightedAddrSet {
            addrs: addrs
                .iter()
                .map(|a| WeightedAddr {
                    addr: Some((*a).into()),
                    weight: 10_000,
                    metric_labels: pod(a),
                    ..Default::default()
                })
                .collect(),
            metric_labels: if labels {
                [("namespace".to_string(), "shop".to_string())].into()
            } else {
                HashMap::new()
            },
        })),
    }
}

#[tonic::async_trait]
impl Destination for State {
    type GetStream = Stream_<Update>;

    async fn get(
        &self,
        req: tonic::Request<GetDestination>,
    ) -> Result<tonic::Response<Self::GetStream>, Status> {
        let path = req.into_inner().path;
        self.gets.lock().unwrap().push(path.clone());
        let Some(updates) = self.answers.lock().unwrap().get(&path).cloned() else {
            return Err(Status::not_found(format!("no endpoints for {path}")));
        };
        let updates = futures_util::stream::iter(updates.into_iter().map(Ok))
            .chain(futures_util::stream::pending());
        Ok(tonic::Response::new(Box::pin(updates)))
    }

    type GetProfileStream = Stream_<DestinationProfile>;

    async fn get_profile(
        &self,
        _req: tonic::Request<GetDestination>,
    ) -> Result<tonic::Response<Self::GetProfileStream>, Status> {
        Err(Status::unimplemented("no profiles here"))
    }
}

#[tonic::async_trait]
impl OutboundPolicies for State {
    async fn get(
        &self,
        _req: tonic::Request<TrafficSpec>,
    ) -> Result<tonic::Response<OutboundPolicy>, Status> {
        Err(Status::unimplemented("watch only"))
    }

    type WatchStream = Stream_<OutboundPolicy>;

    async fn watch(
        &self,
        req: tonic::Request<TrafficSpec>,
    ) -> Result<tonic::Response<Self::WatchStream>, Status> {
        let spec = req.into_inner();
        self.sources.lock().unwrap().push(spec.source_workload);
        // Policies are filed by authority, or by `IP:PORT` for addresses.
        let authority = match spec.target {
            Some(out::traffic_spec::Target::Authority(a)) => a,
            Some(out::traffic_spec::Target::Addr(a)) => SocketAddr::try_from(a)
                .map_err(|_| Status::invalid_argument("a bad address"))?
                .to_string(),
            None => return Err(Status::invalid_argument("no target")),
        };
        let rx = self.policy(&authority);
        let stream = futures_util::stream::unfold((rx, true), |(mut rx, first)| async move {
            if !first && rx.changed().await.is_err() {
                return None;
            }
            let mut rx = rx;
            let current = rx.wait_for(Option::is_some).await.ok()?.clone()?;
            Some((Ok(current), (rx, false)))
        });
        Ok(tonic::Response::new(Box::pin(stream)))
    }
}

/// A running fake controller on 127.0.0.1; stops when dropped.
pub struct FakeController {
    pub addr: SocketAddr,
    state: State,
    task: JoinHandle<()>,
}

impl FakeController {
    /// With `policies`, it serves `OutboundPolicies`; without, a Watch is
    /// answered `UNIMPLEMENTED` (tonic's answer for an unknown service).
    pub async fn start(policies: bool) -> FakeController {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = State::default();
        let mut router =
            tonic::transport::Server::builder().add_service(DestinationServer::new(state.clone()));
        if policies {
            router = router.add_service(OutboundPoliciesServer::new(state.clone()));
        }
        let task = tokio::spawn(async move {
            let _ = router
                .serve_with_incoming(TcpIncoming::from(listener))
                .await;
        });
        FakeController { addr, state, task }
    }

    /// Answers `Get` for `path` with one `Add` of `addrs` (no labels).
    pub fn endpoints(&self, path: &str, addrs: &[SocketAddr]) {
        self.set_answer(path, vec![add(addrs, false)]);
    }

    /// Answers `Get` for `path` (`NAME.NS.svc.cluster.local:PORT`) with
    /// `script`: one labelled `Add` per entry.
    pub fn answer(&self, path: &str, script: Script) {
        self.set_answer(path, script.iter().map(|addrs| add(addrs, true)).collect());
    }

    fn set_answer(&self, path: &str, updates: Vec<Update>) {
        self.state
            .answers
            .lock()
            .unwrap()
            .insert(path.to_string(), updates);
    }

    /// Sets (or changes, for open streams too) the policy of `authority`.
    pub fn policy(&self, authority: &str, policy: OutboundPolicy) {
        let mut all = self.state.policies.lock().unwrap();
        let tx = all
            .entry(authority.to_string())
            .or_insert_with(|| watch::channel(None).0);
        tx.send_replace(Some(policy));
    }

    /// The `source_workload` of every Watch received so far.
    pub fn sources(&self) -> Vec<String> {
        self.state.sources.lock().unwrap().clone()
    }

    /// The paths of the Gets received so far.
    pub fn gets(&self) -> Vec<String> {
        self.state.gets.lock().unwrap().clone()
    }
}

impl Drop for FakeController {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `n` distinct loopback addresses on a port nothing listens on, so that a
/// connection to any of them is refused at once.
pub fn refused_endpoints(n: usize) -> Vec<SocketAddr> {
    (0..n)
        .map(|i| {
            let i = i as u32 + 1;
            let ip = Ipv4Addr::new(127, 10 + (i >> 16) as u8, (i >> 8) as u8, i as u8);
            SocketAddr::new(ip.into(), 9)
        })
        .collect()
}
