//! `GetProfile`: what an address is (a service's cluster IP, a pod, or
//! neither) and whether its port is opaque, as a latest-value watch.

use super::{
    control::ControlPlane,
    snapshot::{self, Held, Kind},
    stream, AbortOnDrop, Endpoint,
};
use linkerd2_proxy_api::destination::{
    destination_client::DestinationClient, DestinationProfile, GetDestination,
};
use prost::Message;
use std::{net::SocketAddr, sync::Arc, time::Duration};
use tokio::sync::watch;

/// The parts of a profile the proxy acts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    /// The service this address belongs to (`name.ns.svc.cluster.local`),
    /// when it is a service's cluster IP.
    pub service: Option<Arc<str>>,
    /// The pod behind this address, when it is one.
    pub endpoint: Option<Endpoint>,
    /// The port is marked opaque: no protocol detection.
    pub opaque: bool,
}

impl Profile {
    pub fn from_wire(p: DestinationProfile) -> Self {
        let name = p.fully_qualified_name.trim_end_matches('.');
        let endpoint = p.endpoint.and_then(|e| {
            let identity = super::resolve::tls_identity(&e);
            let (h2_hint, opaque_port) =
                (super::resolve::h2_hint(&e), super::resolve::opaque_port(&e));
            let labels = e.metric_labels;
            let addr = SocketAddr::try_from(e.addr?).ok()?;
            let get = |k: &str| Arc::from(labels.get(k).map(String::as_str).unwrap_or(""));
            Some(Endpoint {
                addr,
                weight: e.weight.max(1),
                namespace: get("namespace"),
                service: get("service"),
                pod: get("pod"),
                workload: crate::metrics::DstWorkload::none(),
                identity,
                h2_hint,
                opaque_port,
            })
        });
        Self {
            service: (!name.is_empty()).then(|| Arc::from(name)),
            // Only a pod is an endpoint; a bare address comes back as itself.
            endpoint: endpoint.filter(|e| !e.pod.is_empty()),
            opaque: p.opaque_protocol,
        }
    }
}

/// Publishes `profile` unless it is the one already published.
fn publish(tx: &watch::Sender<Option<Arc<Profile>>>, profile: Profile) {
    tx.send_if_modified(|current| {
        if current.as_deref() == Some(&profile) {
            return false;
        }
        *current = Some(Arc::new(profile));
        true
    });
}

/// The profile of one address, kept current while this handle lives.
#[derive(Clone, Debug)]
pub struct ProfileWatch {
    rx: watch::Receiver<Option<Arc<Profile>>>,
    _task: Arc<AbortOnDrop>,
}

impl ProfileWatch {
    pub(crate) fn spawn(control: ControlPlane, addr: SocketAddr) -> Self {
        let (tx, rx) = watch::channel(None);
        let request = GetDestination {
            scheme: "k8s".into(),
            path: addr.to_string(),
            context_token: control.config.context_token.clone(),
        };
        let max_message = control.config.max_message_bytes;
        let key: Arc<str> = Arc::from(addr.to_string());
        let restored = control.restored(Kind::Profile, &key);
        let task = tokio::spawn(async move {
            let alive = Arc::new(());
            let serving = std::sync::Mutex::new(None);
            let follow = stream::follow(
                &control,
                "get_profile",
                |channel| {
                    let request = request.clone();
                    async move {
                        DestinationClient::new(channel)
                            .max_decoding_message_size(max_message)
                            .get_profile(request)
                            .await
                    }
                },
                |profile: DestinationProfile, _| {
                    snapshot::answered(&serving);
                    if let Some(book) = &control.book {
                        let held = Held::Encoded(profile.encode_to_vec().into());
                        book.record(Kind::Profile, &key, held, &alive);
                    }
                    publish(&tx, Profile::from_wire(profile));
                },
            );
            let from_snapshot = snapshot::serve_after_wait(
                restored,
                Kind::Profile,
                &serving,
                || tx.borrow().is_none(),
                |message| match DestinationProfile::decode(message) {
                    Ok(profile) => {
                        publish(&tx, Profile::from_wire(profile));
                        true
                    }
                    Err(_) => false,
                },
            );
            let status = tokio::select! {
                status = follow => status,
                never = from_snapshot => match never {},
            };
            drop(serving);
            tracing::debug!(%addr, code = ?status.code(), "the controller has no profile for this address");
            // A final answer: route without a profile.
            tx.send_replace(Some(Arc::new(Profile {
                service: None,
                endpoint: None,
                opaque: false,
            })));
        });
        Self {
            rx,
            _task: Arc::new(AbortOnDrop(task.abort_handle())),
        }
    }

    /// The profile, waiting at most `timeout` for the first one.
    pub async fn get(&self, timeout: Duration) -> Option<Arc<Profile>> {
        let mut rx = self.rx.clone();
        let wait = async move {
            rx.wait_for(Option::is_some)
                .await
                .ok()
                .and_then(|p| p.clone())
        };
        tokio::time::timeout(timeout, wait).await.ok().flatten()
    }
}
