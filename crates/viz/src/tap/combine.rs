//! A proxy's Tap stream says each request three times (request init,
//! response init, response end); the API says it once. The combiner keys
//! the parts by (pod, stream id) and emits one [`TapEvent`] at the end, with
//! a bounded number of requests waiting for theirs.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ballast_vizcore::api::{ResourceRef, TapEvent};
use linkerd2_proxy_api::http_types::scheme;
use linkerd2_proxy_api::tap::{self as proto, eos, tap_event};

/// Requests waiting for their response per tap, by default; past it the
/// oldest is emitted as it is, with error `incomplete`.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1024;

/// A tapped pod as events name it.
#[derive(Clone, Debug)]
pub struct PodInfo {
    pub pod: ResourceRef,
    pub workload: Option<ResourceRef>,
    /// Its proxy's identity, when identity is on.
    pub identity: Option<String>,
}

impl PodInfo {
    /// `namespace/name`.
    pub fn label(&self) -> String {
        format!("{}/{}", self.pod.namespace, self.pod.name)
    }

    fn workload_name(&self) -> String {
        workload_name(self.workload.as_ref().unwrap_or(&self.pod))
    }
}

/// `deployment/web`: a peer's workload as events show it.
pub fn workload_name(r: &ResourceRef) -> String {
    format!("{}/{}", r.kind, r.name)
}

/// Meshed pods' workloads by IP, to name an inbound request's source.
pub type Peers = Arc<HashMap<IpAddr, String>>;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    pod: usize,
    base: u32,
    stream: u64,
}

struct Pending {
    seq: u64,
    event: TapEvent,
}

/// What the combiner did with one proxy event, for the caller's counters.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pushed {
    /// Requests emitted before their end because too many were waiting.
    pub evicted: usize,
    /// Parts whose request was not (or no longer) waiting; dropped.
    pub orphans: usize,
}

pub struct Combiner {
    max_in_flight: usize,
    peers: Peers,
    next_seq: u64,
    waiting: HashMap<Key, Pending>,
    /// Arrival order of `waiting`, oldest first.
    order: BTreeMap<u64, Key>,
}

impl Combiner {
    pub fn new(max_in_flight: usize, peers: Peers) -> Self {
        Self {
            max_in_flight: max_in_flight.max(1),
            peers,
            next_seq: 0,
            waiting: HashMap::new(),
            order: BTreeMap::new(),
        }
    }

    /// Workload names by address, read again as pods come and go.
    pub fn set_peers(&mut self, peers: Peers) {
        self.peers = peers;
    }

    /// Requests waiting for their response end.
    pub fn in_flight(&self) -> usize {
        self.waiting.len()
    }

    /// Takes one event of pod `index`; completed requests go to `out`.
    pub fn push(
        &mut self,
        index: usize,
        pod: &PodInfo,
        event: proto::TapEvent,
        out: &mut Vec<TapEvent>,
    ) -> Pushed {
        let mut pushed = Pushed::default();
        let Some(tap_event::Event::Http(http)) = &event.event else {
            pushed.orphans += 1;
            return pushed;
        };
        use tap_event::http::Event as H;
        match &http.event {
            Some(H::RequestInit(init)) => {
                let key = key(index, init.id.as_ref());
                let mut combined = self.base(pod, &event);
                combined.id = id_text(init.id.as_ref());
                combined.method = method_text(init.method.as_ref());
                combined.scheme = scheme_text(init.scheme.as_ref());
                combined.authority = init.authority.clone();
                combined.path = init.path.clone();
                let seq = self.next_seq;
                self.next_seq += 1;
                if let Some(old) = self.waiting.insert(
                    key,
                    Pending {
                        seq,
                        event: combined,
                    },
                ) {
                    // A proxy restart can reuse an id: the old one is over.
                    self.order.remove(&old.seq);
                    out.push(incomplete(
                        old.event,
                        "incomplete: its stream id was reused",
                    ));
                    pushed.evicted += 1;
                }
                self.order.insert(seq, key);
                while self.waiting.len() > self.max_in_flight {
                    let Some((_, oldest)) = self.order.pop_first() else {
                        break;
                    };
                    if let Some(p) = self.waiting.remove(&oldest) {
                        out.push(incomplete(
                            p.event,
                            "incomplete: too many requests in flight to wait for its response",
                        ));
                        pushed.evicted += 1;
                    }
                }
            }
            Some(H::ResponseInit(rsp)) => {
                match self.waiting.get_mut(&key(index, rsp.id.as_ref())) {
                    Some(p) => {
                        p.event.status = u16::try_from(rsp.http_status).ok();
                        p.event.latency_ms = rsp.since_request_init.as_ref().map(millis);
                    }
                    None => pushed.orphans += 1,
                }
            }
            Some(H::ResponseEnd(end)) => match self.waiting.remove(&key(index, end.id.as_ref())) {
                Some(p) => {
                    self.order.remove(&p.seq);
                    let mut e = p.event;
                    e.duration_ms = end.since_request_init.as_ref().map(millis);
                    e.response_bytes = Some(end.response_bytes);
                    match end.eos.as_ref().and_then(|eos| eos.end.as_ref()) {
                        Some(eos::End::GrpcStatusCode(code)) => e.grpc_status = Some(*code),
                        Some(eos::End::ResetErrorCode(code)) => {
                            e.error = Some(format!("stream reset (HTTP/2 error code {code})"));
                        }
                        None => {}
                    }
                    out.push(e);
                }
                None => pushed.orphans += 1,
            },
            None => pushed.orphans += 1,
        }
        pushed
    }

    /// Pod `index`'s stream ended: what it had waiting is emitted as is.
    pub fn end_pod(&mut self, index: usize, reason: &str, out: &mut Vec<TapEvent>) -> usize {
        let keys: Vec<(u64, Key)> = self
            .order
            .iter()
            .filter(|(_, k)| k.pod == index)
            .map(|(s, k)| (*s, *k))
            .collect();
        for (seq, key) in &keys {
            self.order.remove(seq);
            if let Some(p) = self.waiting.remove(key) {
                out.push(incomplete(p.event, reason));
            }
        }
        keys.len()
    }

    /// Everything waiting, oldest first, as is.
    pub fn finish(&mut self, reason: &str, out: &mut Vec<TapEvent>) -> usize {
        let n = self.order.len();
        while let Some((_, key)) = self.order.pop_first() {
            if let Some(p) = self.waiting.remove(&key) {
                out.push(incomplete(p.event, reason));
            }
        }
        n
    }

    /// The parts every event of a request shares: who, where, TLS.
    fn base(&self, pod: &PodInfo, event: &proto::TapEvent) -> TapEvent {
        let empty = HashMap::new();
        let src_labels = event.source_meta.as_ref().map_or(&empty, |m| &m.labels);
        let dst_labels = event
            .destination_meta
            .as_ref()
            .map_or(&empty, |m| &m.labels);
        let source = event.source.and_then(socket_addr);
        let destination = event.destination.and_then(socket_addr);
        let from_peers =
            |addr: Option<SocketAddr>| addr.and_then(|a| self.peers.get(&a.ip()).cloned());
        let inbound = event.proxy_direction == tap_event::ProxyDirection::Inbound as i32;
        let outbound = event.proxy_direction == tap_event::ProxyDirection::Outbound as i32;
        let mut e = TapEvent {
            proxy: pod.label(),
            direction: if inbound {
                "inbound"
            } else if outbound {
                "outbound"
            } else {
                "unknown"
            }
            .to_string(),
            source: source.map_or_else(String::new, |a| a.to_string()),
            destination: destination.map_or_else(String::new, |a| a.to_string()),
            ..TapEvent::default()
        };
        if inbound {
            e.tls = src_labels.get("tls").is_some_and(|t| t == "true");
            e.source_identity = src_labels
                .get("client_id")
                .filter(|c| !c.is_empty())
                .cloned();
            e.source_workload = from_peers(source);
            e.destination_identity = pod.identity.clone().filter(|_| e.tls);
            e.destination_workload = Some(pod.workload_name());
        } else {
            e.tls = dst_labels.get("tls").is_some_and(|t| t == "true");
            e.source_identity = pod.identity.clone().filter(|_| e.tls);
            e.source_workload = Some(pod.workload_name());
            e.destination_identity = dst_labels
                .get("server_id")
                .filter(|s| !s.is_empty())
                .cloned();
            e.destination_workload = dst_workload(dst_labels).or_else(|| from_peers(destination));
        }
        e
    }
}

/// The destination's workload from its metric labels (`dst_*` without the
/// prefix): its owner, else its pod, else the Service.
fn dst_workload(labels: &HashMap<String, String>) -> Option<String> {
    for (label, kind) in [
        ("deployment", "deployment"),
        ("statefulset", "statefulset"),
        ("daemonset", "daemonset"),
        ("k8s_job", "job"),
        ("replicaset", "replicaset"),
        ("pod", "pod"),
        ("service", "service"),
    ] {
        if let Some(name) = labels.get(label).filter(|n| !n.is_empty()) {
            return Some(format!("{kind}/{name}"));
        }
    }
    None
}

fn incomplete(mut e: TapEvent, reason: &str) -> TapEvent {
    if e.error.is_none() {
        e.error = Some(reason.to_string());
    }
    e
}

fn key(pod: usize, id: Option<&tap_event::http::StreamId>) -> Key {
    Key {
        pod,
        base: id.map_or(0, |i| i.base),
        stream: id.map_or(0, |i| i.stream),
    }
}

fn id_text(id: Option<&tap_event::http::StreamId>) -> String {
    id.map_or_else(|| "0:0".to_string(), |i| format!("{}:{}", i.base, i.stream))
}

fn method_text(m: Option<&linkerd2_proxy_api::http_types::HttpMethod>) -> String {
    m.and_then(|m| m.r#type.clone())
        .and_then(|t| http::Method::try_from(t).ok())
        .map_or_else(String::new, |m| m.to_string())
}

fn scheme_text(s: Option<&linkerd2_proxy_api::http_types::Scheme>) -> String {
    match s.and_then(|s| s.r#type.as_ref()) {
        Some(scheme::Type::Registered(r)) if *r == scheme::Registered::Http as i32 => "http".into(),
        Some(scheme::Type::Registered(r)) if *r == scheme::Registered::Https as i32 => {
            "https".into()
        }
        Some(scheme::Type::Unregistered(s)) => s.chars().take(32).collect(),
        _ => String::new(),
    }
}

fn socket_addr(a: linkerd2_proxy_api::net::TcpAddress) -> Option<SocketAddr> {
    SocketAddr::try_from(a).ok()
}

/// A protobuf duration in milliseconds; a negative or absurd one is 0 or
/// capped rather than trusted.
fn millis(d: &prost_types::Duration) -> f64 {
    let secs = d.seconds.clamp(0, 365 * 24 * 3600) as f64;
    let nanos = f64::from(d.nanos.clamp(0, 999_999_999));
    secs * 1000.0 + nanos / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;
    use linkerd2_proxy_api::http_types::HttpMethod;
    use linkerd2_proxy_api::net::TcpAddress;
    use tap_event::http::{RequestInit, ResponseEnd, ResponseInit, StreamId};

    fn pod() -> PodInfo {
        PodInfo {
            pod: ResourceRef {
                kind: "pod".into(),
                namespace: "demo".into(),
                name: "load-1".into(),
            },
            workload: Some(ResourceRef {
                kind: "deployment".into(),
                namespace: "demo".into(),
                name: "load".into(),
            }),
            identity: Some("default.demo.serviceaccount.identity.linkerd.cluster.local".into()),
        }
    }

    fn http(
        direction: tap_event::ProxyDirection,
        event: tap_event::http::Event,
        dst_labels: &[(&str, &str)],
    ) -> proto::TapEvent {
        proto::TapEvent {
            source: Some(TcpAddress::from(
                "10.0.0.1:5000".parse::<SocketAddr>().expect("a"),
            )),
            destination: Some(TcpAddress::from(
                "10.0.0.9:8080".parse::<SocketAddr>().expect("a"),
            )),
            source_meta: Some(tap_event::EndpointMeta {
                labels: [
                    ("tls", "true"),
                    (
                        "client_id",
                        "web.demo.serviceaccount.identity.linkerd.cluster.local",
                    ),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            }),
            destination_meta: Some(tap_event::EndpointMeta {
                labels: dst_labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            }),
            proxy_direction: direction as i32,
            event: Some(tap_event::Event::Http(tap_event::Http {
                event: Some(event),
            })),
            ..Default::default()
        }
    }

    fn id(stream: u64) -> Option<StreamId> {
        Some(StreamId { base: 7, stream })
    }

    fn init(stream: u64, path: &str) -> tap_event::http::Event {
        tap_event::http::Event::RequestInit(RequestInit {
            id: id(stream),
            method: Some(HttpMethod::from(http::Method::GET)),
            scheme: Some("http".into()),
            authority: "web.demo.svc.cluster.local".into(),
            path: path.into(),
            headers: None,
        })
    }

    fn rsp(stream: u64, status: u32) -> tap_event::http::Event {
        tap_event::http::Event::ResponseInit(ResponseInit {
            id: id(stream),
            since_request_init: Some(prost_types::Duration {
                seconds: 0,
                nanos: 1_500_000,
            }),
            http_status: status,
            headers: None,
        })
    }

    fn end(stream: u64, eos: Option<eos::End>) -> tap_event::http::Event {
        tap_event::http::Event::ResponseEnd(ResponseEnd {
            id: id(stream),
            since_request_init: Some(prost_types::Duration {
                seconds: 1,
                nanos: 2_000_000,
            }),
            since_response_init: None,
            response_bytes: 42,
            eos: eos.map(|end| proto::Eos { end: Some(end) }),
            trailers: None,
        })
    }

    const OUT: tap_event::ProxyDirection = tap_event::ProxyDirection::Outbound;
    const IN: tap_event::ProxyDirection = tap_event::ProxyDirection::Inbound;

    #[test]
    fn three_parts_make_one_event() {
        let mut c = Combiner::new(8, Arc::default());
        let mut out = Vec::new();
        let labels = [
            ("tls", "true"),
            ("server_id", "web.id"),
            ("deployment", "web"),
            ("pod", "web-1"),
        ];
        c.push(0, &pod(), http(OUT, init(1, "/a"), &labels), &mut out);
        c.push(0, &pod(), http(OUT, rsp(1, 200), &labels), &mut out);
        assert!(out.is_empty());
        assert_eq!(c.in_flight(), 1);
        c.push(
            0,
            &pod(),
            http(OUT, end(1, Some(eos::End::GrpcStatusCode(0))), &labels),
            &mut out,
        );
        assert_eq!(c.in_flight(), 0);
        let e = out.pop().expect("one event");
        assert_eq!(
            e,
            TapEvent {
                proxy: "demo/load-1".into(),
                id: "7:1".into(),
                direction: "outbound".into(),
                source: "10.0.0.1:5000".into(),
                source_identity: pod().identity,
                source_workload: Some("deployment/load".into()),
                destination: "10.0.0.9:8080".into(),
                destination_identity: Some("web.id".into()),
                destination_workload: Some("deployment/web".into()),
                tls: true,
                method: "GET".into(),
                scheme: "http".into(),
                authority: "web.demo.svc.cluster.local".into(),
                path: "/a".into(),
                status: Some(200),
                grpc_status: Some(0),
                latency_ms: Some(1.5),
                duration_ms: Some(1002.0),
                response_bytes: Some(42),
                error: None,
            }
        );
    }

    #[test]
    fn inbound_names_the_client_and_the_pod() {
        let mut peers = HashMap::new();
        peers.insert(
            "10.0.0.1".parse().expect("ip"),
            "deployment/web".to_string(),
        );
        let mut c = Combiner::new(8, Arc::new(peers));
        let mut out = Vec::new();
        c.push(0, &pod(), http(IN, init(2, "/"), &[]), &mut out);
        c.push(
            0,
            &pod(),
            http(IN, end(2, Some(eos::End::ResetErrorCode(8))), &[]),
            &mut out,
        );
        let e = out.pop().expect("event");
        assert_eq!(e.direction, "inbound");
        assert!(e.tls);
        assert_eq!(
            e.source_identity.as_deref(),
            Some("web.demo.serviceaccount.identity.linkerd.cluster.local")
        );
        assert_eq!(e.source_workload.as_deref(), Some("deployment/web"));
        assert_eq!(e.destination_workload.as_deref(), Some("deployment/load"));
        assert_eq!(e.destination_identity, pod().identity);
        assert_eq!(e.status, None);
        assert_eq!(
            e.error.as_deref(),
            Some("stream reset (HTTP/2 error code 8)")
        );
    }

    #[test]
    fn streams_of_different_pods_do_not_mix() {
        let mut c = Combiner::new(8, Arc::default());
        let mut out = Vec::new();
        c.push(0, &pod(), http(OUT, init(1, "/zero"), &[]), &mut out);
        c.push(1, &pod(), http(OUT, init(1, "/one"), &[]), &mut out);
        c.push(1, &pod(), http(OUT, end(1, None), &[]), &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].path, "/one");
        assert_eq!(c.in_flight(), 1);
        // Pod 0's stream ends with its request still waiting.
        assert_eq!(
            c.end_pod(0, "incomplete: the proxy's stream ended", &mut out),
            1
        );
        assert_eq!(out[1].path, "/zero");
        assert_eq!(
            out[1].error.as_deref(),
            Some("incomplete: the proxy's stream ended")
        );
        assert_eq!(c.in_flight(), 0);
    }

    #[test]
    fn the_oldest_waiting_request_is_evicted_past_the_bound() {
        let mut c = Combiner::new(3, Arc::default());
        let mut out = Vec::new();
        for i in 0..3 {
            c.push(
                0,
                &pod(),
                http(OUT, init(i, &format!("/{i}")), &[]),
                &mut out,
            );
        }
        assert!(out.is_empty());
        let pushed = c.push(0, &pod(), http(OUT, init(3, "/3"), &[]), &mut out);
        assert_eq!(pushed.evicted, 1);
        assert_eq!(c.in_flight(), 3);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].path, "/0");
        assert!(out[0]
            .error
            .as_deref()
            .is_some_and(|e| e.starts_with("incomplete")));
        // The evicted request's end is an orphan now, dropped.
        let pushed = c.push(0, &pod(), http(OUT, end(0, None), &[]), &mut out);
        assert_eq!(pushed.orphans, 1);
        assert_eq!(out.len(), 1);
        assert_eq!(c.finish("incomplete: the tap ended", &mut out), 3);
        let paths: Vec<&str> = out.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["/0", "/1", "/2", "/3"]);
    }

    #[test]
    fn hostile_parts_are_dropped_not_trusted() {
        let mut c = Combiner::new(8, Arc::default());
        let mut out = Vec::new();
        let empty = proto::TapEvent::default();
        assert_eq!(c.push(0, &pod(), empty, &mut out).orphans, 1);
        let mut weird = http(OUT, init(1, "/"), &[]);
        weird.source = None;
        c.push(0, &pod(), weird, &mut out);
        let mut bad_end = http(OUT, end(1, None), &[]);
        if let Some(tap_event::Event::Http(tap_event::Http {
            event: Some(tap_event::http::Event::ResponseEnd(e)),
        })) = bad_end.event.as_mut()
        {
            e.since_request_init = Some(prost_types::Duration {
                seconds: -5,
                nanos: -1,
            });
        }
        c.push(0, &pod(), bad_end, &mut out);
        let e = out.pop().expect("event");
        assert_eq!(e.source, "");
        assert_eq!(e.duration_ms, Some(0.0));
        assert_eq!(e.destination_workload, None);
    }
}
