//! A Destination server that answers what the test tells it, however
//! unreasonable: endpoint sets of any size, in chunks or in one message,
//! including the proxy's own listeners.

use futures_util::Stream;
use linkerd2_proxy_api::destination::{
    destination_server::{Destination, DestinationServer},
    update, DestinationProfile, GetDestination, Update, WeightedAddr, WeightedAddrSet,
};
use std::{
    collections::HashMap,
    net::{Ipv4Addr, SocketAddr},
    pin::Pin,
    sync::{Arc, Mutex},
};
use tokio::{net::TcpListener, task::JoinHandle};
use tonic::{transport::server::TcpIncoming, Request, Response, Status};

/// What a `Get` for one path is answered: these `Add` messages, then the
/// stream stays open.
pub type Script = Vec<Vec<SocketAddr>>;

#[derive(Clone, Default)]
struct Answers {
    scripts: Arc<Mutex<HashMap<String, Script>>>,
}

type Updates = Pin<Box<dyn Stream<Item = Result<Update, Status>> + Send>>;
type Profiles = Pin<Box<dyn Stream<Item = Result<DestinationProfile, Status>> + Send>>;

fn add(addrs: &[SocketAddr]) -> Update {
    let mut labels = HashMap::new();
    labels.insert("namespace".to_string(), "shop".to_string());
    Update {
        update: Some(update::Update::Add(WeightedAddrSet {
            addrs: addrs
                .iter()
                .map(|a| WeightedAddr {
                    addr: Some((*a).into()),
                    weight: 10_000,
                    metric_labels: [("pod".to_string(), format!("pod-{}", a.ip()))]
                        .into_iter()
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            metric_labels: labels,
        })),
    }
}

#[tonic::async_trait]
impl Destination for Answers {
    type GetStream = Updates;

    async fn get(&self, req: Request<GetDestination>) -> Result<Response<Updates>, Status> {
        let path = req.into_inner().path;
        let Some(script) = self.scripts.lock().unwrap().get(&path).cloned() else {
            return Err(Status::not_found(format!("no script for {path}")));
        };
        let updates = futures_util::stream::iter(script.into_iter().map(|addrs| Ok(add(&addrs))))
            .chain(futures_util::stream::pending());
        Ok(Response::new(Box::pin(updates)))
    }

    type GetProfileStream = Profiles;

    async fn get_profile(
        &self,
        _req: Request<GetDestination>,
    ) -> Result<Response<Profiles>, Status> {
        Err(Status::unimplemented("no profiles here"))
    }
}

use futures_util::StreamExt;

/// A running fake controller; stops when dropped.
pub struct FakeDestination {
    pub addr: SocketAddr,
    answers: Answers,
    task: JoinHandle<()>,
}

impl FakeDestination {
    pub async fn start() -> FakeDestination {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let answers = Answers::default();
        let service = DestinationServer::new(answers.clone());
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(TcpIncoming::from(listener))
                .await;
        });
        FakeDestination {
            addr,
            answers,
            task,
        }
    }

    /// Answers `Get` for `path` (`NAME.NS.svc.cluster.local:PORT`) with `script`.
    pub fn answer(&self, path: &str, script: Script) {
        self.answers
            .scripts
            .lock()
            .unwrap()
            .insert(path.to_string(), script);
    }
}

impl Drop for FakeDestination {
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
