//! `Get`: the endpoints of one target, as a latest-value watch.

use super::snapshot::{self, Held, Kind};
use super::{
    control::ControlPlane, stream, AbortOnDrop, Endpoint, EndpointSet, LastKnown, SetState,
};
use crate::metrics::{empty_label, DstWorkload, WorkloadLabels};
use linkerd2_proxy_api::destination::{
    destination_client::DestinationClient, protocol_hint, tls_identity, update, GetDestination,
    NoEndpoints, ProtocolHint, TlsIdentity, Update, WeightedAddr, WeightedAddrSet,
};
use prost::Message;
use std::{
    collections::BTreeMap, collections::HashMap, net::SocketAddr, sync::Arc, time::Duration,
};
use tokio::sync::watch;

/// The endpoint set being built from a stream of updates. Pure: no IO.
#[derive(Debug)]
pub struct ResolveState {
    endpoints: BTreeMap<SocketAddr, Endpoint>,
    state: SetState,
    max_endpoints: usize,
    /// Adds dropped because the set was at its bound.
    pub dropped: u64,
}

impl ResolveState {
    pub fn new(max_endpoints: usize) -> Self {
        Self {
            endpoints: BTreeMap::new(),
            state: SetState::Pending,
            max_endpoints,
            dropped: 0,
        }
    }

    /// Starts from a set known before (the stream's first update will
    /// replace it, as a Reset).
    pub fn seeded(max_endpoints: usize, set: &EndpointSet) -> Self {
        Self {
            endpoints: set.endpoints.iter().map(|e| (e.addr, e.clone())).collect(),
            state: set.state.clone(),
            max_endpoints,
            dropped: 0,
        }
    }

    /// Applies one update; `reset` marks the first update of a stream, which
    /// replaces the whole set. Returns whether the set changed.
    pub fn apply(&mut self, update: Update, reset: bool) -> bool {
        let before = (self.state.clone(), self.endpoints.len());
        let mut changed = false;
        match update.update {
            Some(update::Update::Add(set)) => {
                if reset && !self.endpoints.is_empty() {
                    self.endpoints.clear();
                    changed = true;
                }
                let namespace = set.metric_labels.get("namespace");
                let service = set.metric_labels.get("service");
                for addr in set.addrs {
                    // The bound is checked before anything is made of the
                    // address: a flood of adds costs no allocations.
                    let known = socket_of(&addr).map(|a| self.endpoints.contains_key(&a));
                    if known == Some(false) && self.endpoints.len() >= self.max_endpoints {
                        self.dropped += 1;
                        continue;
                    }
                    let Some(endpoint) = endpoint(addr, namespace, service) else {
                        continue;
                    };
                    if self.endpoints.get(&endpoint.addr) != Some(&endpoint) {
                        self.endpoints.insert(endpoint.addr, endpoint);
                        changed = true;
                    }
                }
                self.state = SetState::Known;
            }
            Some(update::Update::Remove(set)) => {
                // A Remove cannot tell the whole set, even as a first
                // update: take out what it names and keep the rest.
                for addr in set.addrs {
                    if let Ok(addr) = SocketAddr::try_from(addr) {
                        changed |= self.endpoints.remove(&addr).is_some();
                    }
                }
                self.state = SetState::Known;
            }
            Some(update::Update::NoEndpoints(none)) => {
                changed |= !self.endpoints.is_empty();
                self.endpoints.clear();
                self.state = if none.exists {
                    SetState::Known
                } else {
                    SetState::DoesNotExist
                };
            }
            None => {}
        }
        changed || before != (self.state.clone(), self.endpoints.len())
    }

    pub fn fail(&mut self, reason: &str) {
        self.endpoints.clear();
        self.state = SetState::Invalid(Arc::from(reason));
    }

    pub fn snapshot(&self) -> EndpointSet {
        EndpointSet {
            state: self.state.clone(),
            endpoints: self.endpoints.values().cloned().collect(),
        }
    }
}

fn label(labels: &HashMap<String, String>, key: &str, default: Option<&String>) -> Arc<str> {
    match labels.get(key).or(default) {
        Some(v) if !v.is_empty() => Arc::from(v.as_str()),
        _ => empty_label(),
    }
}

/// The workload labels of an endpoint, from the keys the controller sends
/// (Linkerd's: the owner's kind, `serviceaccount`, `pod_template_hash`).
fn workload(labels: &HashMap<String, String>) -> DstWorkload {
    let get = |key| label(labels, key, None);
    let w = WorkloadLabels {
        dst_deployment: get("deployment"),
        dst_statefulset: get("statefulset"),
        dst_daemonset: get("daemonset"),
        dst_replicaset: get("replicaset"),
        // Linkerd's controller says `k8s_job` (`job` is Prometheus' own
        // label); older ones said `job`.
        dst_k8s_job: label(labels, "k8s_job", labels.get("job")),
        dst_serviceaccount: get("serviceaccount"),
        dst_pod_template_hash: get("pod_template_hash"),
    };
    let none = DstWorkload::none();
    if w == *none.0 {
        // Shares the one empty set: most endpoints outside Kubernetes.
        none
    } else {
        DstWorkload(Arc::new(w))
    }
}

/// The usable address of an endpoint from the wire.
fn socket_of(addr: &WeightedAddr) -> Option<SocketAddr> {
    let socket = SocketAddr::try_from(addr.addr?).ok()?;
    (socket.port() != 0).then_some(socket)
}

/// An endpoint from the wire, or `None` when it has no usable address.
pub(super) fn endpoint(
    addr: WeightedAddr,
    namespace: Option<&String>,
    service: Option<&String>,
) -> Option<Endpoint> {
    let socket = socket_of(&addr)?;
    Some(Endpoint {
        addr: socket,
        weight: addr.weight.max(1),
        namespace: label(&addr.metric_labels, "namespace", namespace),
        service: label(&addr.metric_labels, "service", service),
        pod: label(&addr.metric_labels, "pod", None),
        workload: workload(&addr.metric_labels),
        identity: tls_identity(&addr),
        h2_hint: h2_hint(&addr),
        opaque_port: opaque_port(&addr),
    })
}

pub(super) fn h2_hint(addr: &WeightedAddr) -> bool {
    matches!(
        addr.protocol_hint
            .as_ref()
            .and_then(|h| h.protocol.as_ref()),
        Some(protocol_hint::Protocol::H2(_))
    )
}

pub(super) fn opaque_port(addr: &WeightedAddr) -> Option<u16> {
    addr.protocol_hint
        .as_ref()
        .and_then(|h| h.opaque_transport.as_ref())
        .and_then(|o| u16::try_from(o.inbound_port).ok())
        .filter(|p| *p != 0)
}

/// The DNS-like identity the controller gives an endpoint; a malformed one
/// is no identity (the connection is then plaintext, and labelled so).
pub(super) fn tls_identity(addr: &WeightedAddr) -> Option<ballast_meshtls::IdentityName> {
    match addr.tls_identity.as_ref()?.strategy.as_ref()? {
        tls_identity::Strategy::DnsLikeIdentity(d) => {
            ballast_meshtls::IdentityName::parse(&d.name).ok()
        }
        tls_identity::Strategy::UriLikeIdentity(_) => None,
    }
}

/// An endpoint as the controller would send it: [`endpoint`] reads it back
/// as the same endpoint (the snapshot keeps endpoints this way).
fn to_wire(e: &Endpoint) -> WeightedAddr {
    let labels = crate::metrics::controller_labels(&e.namespace, &e.service, &e.pod, &e.workload)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let hint = (e.h2_hint || e.opaque_port.is_some()).then(|| ProtocolHint {
        protocol: e
            .h2_hint
            .then_some(protocol_hint::Protocol::H2(protocol_hint::H2 {})),
        opaque_transport: e.opaque_port.map(|p| protocol_hint::OpaqueTransport {
            inbound_port: u32::from(p),
        }),
    });
    WeightedAddr {
        addr: Some(e.addr.into()),
        weight: e.weight,
        metric_labels: labels,
        tls_identity: e.identity.as_ref().map(|i| TlsIdentity {
            strategy: Some(tls_identity::Strategy::DnsLikeIdentity(
                tls_identity::DnsLikeIdentity {
                    name: i.as_str().to_string(),
                },
            )),
            server_name: None,
        }),
        protocol_hint: hint,
        ..Default::default()
    }
}

/// A set as one update that, first on a stream, makes the same set again;
/// `None` for a set the controller has not given.
pub(super) fn set_update(set: &EndpointSet) -> Option<Update> {
    let update = match set.state {
        SetState::Known if !set.endpoints.is_empty() => update::Update::Add(WeightedAddrSet {
            addrs: set.endpoints.iter().map(to_wire).collect(),
            metric_labels: HashMap::new(),
        }),
        SetState::Known => update::Update::NoEndpoints(NoEndpoints { exists: true }),
        SetState::DoesNotExist => update::Update::NoEndpoints(NoEndpoints { exists: false }),
        SetState::Pending | SetState::Invalid(_) => return None,
    };
    Some(Update {
        update: Some(update),
    })
}

/// A target's endpoints, kept current by a background stream that lives as
/// long as this handle (and its clones).
#[derive(Clone, Debug)]
pub struct Resolution {
    rx: watch::Receiver<Arc<EndpointSet>>,
    _task: Arc<AbortOnDrop>,
}

impl Resolution {
    pub(crate) fn spawn(
        control: ControlPlane,
        authority: &Arc<str>,
        max_endpoints: usize,
        last_known: Arc<LastKnown>,
    ) -> Self {
        let seed = last_known.open(authority);
        // Nothing in memory: the snapshot's set, if the controller stays
        // silent for the wait.
        let restored = match seed {
            Some(_) => None,
            None => control.restored(Kind::Endpoints, authority),
        };
        let restored_age = restored.as_ref().map_or(Duration::ZERO, |(_, r)| r.age);
        let mut state = match &seed {
            Some(set) => ResolveState::seeded(max_endpoints, set),
            None => ResolveState::new(max_endpoints),
        };
        let (tx, rx) = watch::channel(seed.unwrap_or_else(|| Arc::new(EndpointSet::pending())));
        let path = authority.to_string();
        let key = authority.clone();
        let task = tokio::spawn(async move {
            let metrics = control.metrics.clone();
            metrics.discovery.resolutions.inc();
            let _gauge = ResolutionGauge(metrics.clone());
            let _in_use = InUse(last_known.clone(), key.clone());
            let alive = Arc::new(());
            let serving = std::sync::Mutex::new(None);
            let request = GetDestination {
                scheme: "k8s".into(),
                path: path.clone(),
                context_token: control.config.context_token.clone(),
            };
            let max_message = control.config.max_message_bytes;
            let follow = stream::follow(
                &control,
                "get",
                |channel| {
                    let request = request.clone();
                    async move {
                        DestinationClient::new(channel)
                            .max_decoding_message_size(max_message)
                            .get(request)
                            .await
                    }
                },
                |update: Update, reset| {
                    snapshot::answered(&serving);
                    let dropped = state.dropped;
                    if state.apply(update, reset) {
                        let set = Arc::new(state.snapshot());
                        last_known.heard(&key, Some(set.clone()));
                        if let Some(book) = &control.book {
                            book.record(
                                Kind::Endpoints,
                                &key,
                                Held::Endpoints(set.clone()),
                                &alive,
                            );
                        }
                        tx.send_replace(set);
                    } else {
                        last_known.heard(&key, None);
                    }
                    if state.dropped > dropped {
                        metrics
                            .discovery
                            .endpoints_dropped_total
                            .inc_by(state.dropped - dropped);
                        tracing::warn!(
                            authority = %path,
                            dropped = state.dropped - dropped,
                            max = max_endpoints,
                            "target has more endpoints than --max-endpoints-per-target; extra endpoints dropped"
                        );
                    }
                },
            );
            let from_snapshot = snapshot::serve_after_wait(
                restored,
                Kind::Endpoints,
                &serving,
                || tx.borrow().state == SetState::Pending,
                |message| {
                    let Ok(update) = Update::decode(message) else {
                        return false;
                    };
                    let mut restored = ResolveState::new(max_endpoints);
                    restored.apply(update, true);
                    let set = Arc::new(restored.snapshot());
                    last_known.restored(&key, set.clone(), restored_age);
                    tx.send_replace(set);
                    true
                },
            );
            let status = tokio::select! {
                status = follow => status,
                never = from_snapshot => match never {},
            };
            drop(serving);
            tracing::warn!(authority = %path, code = ?status.code(), "the controller refused this target");
            let reason: String = status.message().chars().take(128).collect();
            state.fail(&reason);
            tx.send_replace(Arc::new(state.snapshot()));
        });
        Self {
            rx,
            _task: Arc::new(AbortOnDrop(task.abort_handle())),
        }
    }

    /// A resolution that never changes: for targets known without asking.
    pub fn fixed(set: EndpointSet) -> Self {
        let (tx, rx) = watch::channel(Arc::new(set));
        // Nothing will ever be sent; keep the sender alive with the task.
        let task = tokio::spawn(async move {
            tx.closed().await;
        });
        Self {
            rx,
            _task: Arc::new(AbortOnDrop(task.abort_handle())),
        }
    }

    /// A resolution the test changes by hand through the returned sender.
    #[cfg(test)]
    pub fn manual(set: EndpointSet) -> (watch::Sender<Arc<EndpointSet>>, Self) {
        let (tx, rx) = watch::channel(Arc::new(set));
        let task = tokio::spawn(std::future::pending::<()>());
        let resolution = Self {
            rx,
            _task: Arc::new(AbortOnDrop(task.abort_handle())),
        };
        (tx, resolution)
    }

    pub fn watch(&self) -> watch::Receiver<Arc<EndpointSet>> {
        self.rx.clone()
    }

    pub fn current(&self) -> Arc<EndpointSet> {
        self.rx.borrow().clone()
    }
}

/// Marks the target in use in the last-known memory while its stream task
/// lives (it may be aborted at any point).
struct InUse(Arc<LastKnown>, Arc<str>);

impl Drop for InUse {
    fn drop(&mut self) {
        self.0.close(&self.1);
    }
}

struct ResolutionGauge(Arc<crate::metrics::Metrics>);

impl Drop for ResolutionGauge {
    fn drop(&mut self) {
        self.0.discovery.resolutions.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use linkerd2_proxy_api::{
        destination::{AddrSet, NoEndpoints, WeightedAddrSet},
        net::TcpAddress,
    };

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("socket address")
    }

    fn add(addrs: &[&str]) -> Update {
        Update {
            update: Some(update::Update::Add(WeightedAddrSet {
                addrs: addrs
                    .iter()
                    .map(|a| WeightedAddr {
                        addr: Some(TcpAddress::from(addr(a))),
                        weight: 10_000,
                        metric_labels: [("pod".to_string(), format!("pod-{a}"))].into(),
                        ..Default::default()
                    })
                    .collect(),
                metric_labels: [
                    ("namespace".to_string(), "shop".to_string()),
                    ("service".to_string(), "web".to_string()),
                ]
                .into(),
            })),
        }
    }

    fn remove(addrs: &[&str]) -> Update {
        Update {
            update: Some(update::Update::Remove(AddrSet {
                addrs: addrs.iter().map(|a| TcpAddress::from(addr(a))).collect(),
            })),
        }
    }

    fn none(exists: bool) -> Update {
        Update {
            update: Some(update::Update::NoEndpoints(NoEndpoints { exists })),
        }
    }

    fn addrs(s: &ResolveState) -> Vec<String> {
        s.snapshot()
            .endpoints
            .iter()
            .map(|e| e.addr.to_string())
            .collect()
    }

    #[test]
    fn updates_follow_linkerd_semantics() {
        // (updates with their reset flag, expected addresses, expected state)
        type Case = (Vec<(Update, bool)>, Vec<&'static str>, SetState);
        let cases: Vec<Case> = vec![
            (vec![], vec![], SetState::Pending),
            (
                vec![(add(&["10.0.0.1:80", "10.0.0.2:80"]), true)],
                vec!["10.0.0.1:80", "10.0.0.2:80"],
                SetState::Known,
            ),
            (
                vec![
                    (add(&["10.0.0.1:80", "10.0.0.2:80"]), true),
                    (remove(&["10.0.0.1:80"]), false),
                    (add(&["10.0.0.3:80"]), false),
                ],
                vec!["10.0.0.2:80", "10.0.0.3:80"],
                SetState::Known,
            ),
            // A new stream's first Add replaces the set (Reset).
            (
                vec![
                    (add(&["10.0.0.1:80", "10.0.0.2:80"]), true),
                    (add(&["10.0.0.3:80"]), true),
                ],
                vec!["10.0.0.3:80"],
                SetState::Known,
            ),
            // A Remove first only removes.
            (
                vec![
                    (add(&["10.0.0.1:80", "10.0.0.2:80"]), true),
                    (remove(&["10.0.0.2:80"]), true),
                ],
                vec!["10.0.0.1:80"],
                SetState::Known,
            ),
            (
                vec![(add(&["10.0.0.1:80"]), true), (none(true), true)],
                vec![],
                SetState::Known,
            ),
            (vec![(none(false), true)], vec![], SetState::DoesNotExist),
            (
                vec![(none(false), true), (add(&["10.0.0.1:80"]), false)],
                vec!["10.0.0.1:80"],
                SetState::Known,
            ),
            // Port 0 is no endpoint.
            (vec![(add(&["10.0.0.1:0"]), true)], vec![], SetState::Known),
        ];
        for (i, (updates, want, want_state)) in cases.into_iter().enumerate() {
            let mut s = ResolveState::new(100);
            for (u, reset) in updates {
                s.apply(u, reset);
            }
            assert_eq!(addrs(&s), want, "case {i}");
            assert_eq!(s.snapshot().state, want_state, "case {i}");
        }
    }

    #[test]
    fn labels_come_from_the_address_then_the_set() {
        let mut s = ResolveState::new(10);
        s.apply(add(&["10.0.0.1:80"]), true);
        let e = &s.snapshot().endpoints[0];
        assert_eq!(&*e.pod, "pod-10.0.0.1:80");
        assert_eq!(&*e.namespace, "shop");
        assert_eq!(&*e.service, "web");
        assert_eq!(e.weight, 10_000);
    }

    #[test]
    fn workload_labels_come_from_the_keys_the_controller_sends() {
        let with = |pairs: &[(&str, &str)]| {
            let mut u = add(&["10.0.0.1:80"]);
            if let Some(update::Update::Add(set)) = &mut u.update {
                for (k, v) in pairs {
                    set.addrs[0]
                        .metric_labels
                        .insert(k.to_string(), v.to_string());
                }
            }
            let mut s = ResolveState::new(10);
            s.apply(u, true);
            s.snapshot().endpoints[0].workload.clone()
        };
        let w = with(&[
            ("deployment", "web"),
            ("serviceaccount", "web-sa"),
            ("pod_template_hash", "5d8f9"),
            ("zone", ""),
        ]);
        assert_eq!(&*w.0.dst_deployment, "web");
        assert_eq!(&*w.0.dst_serviceaccount, "web-sa");
        assert_eq!(&*w.0.dst_pod_template_hash, "5d8f9");
        assert_eq!(&*w.0.dst_statefulset, "");
        assert_eq!(&*with(&[("statefulset", "db")]).0.dst_statefulset, "db");
        assert_eq!(&*with(&[("daemonset", "agent")]).0.dst_daemonset, "agent");
        assert_eq!(
            &*with(&[("replicaset", "bare-rs")]).0.dst_replicaset,
            "bare-rs"
        );
        assert_eq!(&*with(&[("k8s_job", "migrate")]).0.dst_k8s_job, "migrate");
        assert_eq!(&*with(&[("job", "migrate")]).0.dst_k8s_job, "migrate");
        // No workload labels: the one shared empty set, no allocation.
        assert!(Arc::ptr_eq(&with(&[]).0, &DstWorkload::none().0));
    }

    #[test]
    fn the_set_is_bounded_and_drops_are_counted() {
        let mut s = ResolveState::new(2);
        assert!(s.apply(add(&["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"]), true));
        assert_eq!(addrs(&s), vec!["10.0.0.1:80", "10.0.0.2:80"]);
        assert_eq!(s.dropped, 1);
        // Updating a known endpoint at the bound is not a drop.
        s.apply(add(&["10.0.0.1:80"]), false);
        assert_eq!(s.dropped, 1);
    }

    #[test]
    fn a_set_written_as_one_update_reads_back_the_same() {
        let mut u = add(&["10.0.0.1:80", "10.0.0.2:8080"]);
        if let Some(update::Update::Add(set)) = &mut u.update {
            let a = &mut set.addrs[0];
            a.weight = 7;
            for (k, v) in [
                ("deployment", "web"),
                ("serviceaccount", "web-sa"),
                ("k8s_job", "j"),
            ] {
                a.metric_labels.insert(k.to_string(), v.to_string());
            }
            a.tls_identity = Some(TlsIdentity {
                strategy: Some(tls_identity::Strategy::DnsLikeIdentity(
                    tls_identity::DnsLikeIdentity {
                        name: "web.shop.serviceaccount.identity.ballast.cluster.local".into(),
                    },
                )),
                server_name: None,
            });
            a.protocol_hint = Some(ProtocolHint {
                protocol: Some(protocol_hint::Protocol::H2(protocol_hint::H2 {})),
                opaque_transport: Some(protocol_hint::OpaqueTransport { inbound_port: 4143 }),
            });
        }
        let mut s = ResolveState::new(10);
        s.apply(u, true);
        let set = s.snapshot();
        assert!(set.endpoints[0].identity.is_some() && set.endpoints[0].h2_hint);
        let mut again = ResolveState::new(10);
        again.apply(set_update(&set).expect("a known set"), true);
        assert_eq!(again.snapshot(), set);

        for (state, want) in [
            (SetState::Known, SetState::Known),
            (SetState::DoesNotExist, SetState::DoesNotExist),
        ] {
            let empty = EndpointSet {
                state,
                endpoints: Vec::new(),
            };
            let mut again = ResolveState::new(10);
            again.apply(set_update(&empty).expect("said"), true);
            assert_eq!(again.snapshot().state, want);
        }
        assert!(set_update(&EndpointSet::pending()).is_none());
    }

    #[test]
    fn an_unchanged_update_reports_no_change() {
        let mut s = ResolveState::new(10);
        assert!(s.apply(add(&["10.0.0.1:80"]), true));
        assert!(!s.apply(add(&["10.0.0.1:80"]), false));
        assert!(!s.apply(remove(&["10.0.0.9:80"]), false));
    }
}
