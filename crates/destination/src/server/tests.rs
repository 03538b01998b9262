//! Streams over a real store, read through their response bodies, on
//! tokio's paused clock.

use super::*;
use crate::{
    index::{Index, IndexConfig},
    resource::Resource,
    store::Op,
};
use ballast_testkit::eventually_sync;
use bytes::Bytes;
use http_body_util::BodyExt;
use linkerd2_proxy_api::destination::{update, Update};
use prometheus_client::metrics::gauge::Gauge;
use prost::Message;
use serde_json::json;
use std::{collections::BTreeSet, net::SocketAddr};

/// Bound on a wait on the paused clock (time that passes only as the
/// runtime idles).
const UNTIL: Duration = Duration::from_secs(10);

fn resource(v: serde_json::Value) -> Resource {
    Resource::from_value(v).unwrap().unwrap()
}

fn service() -> Op {
    Op::Apply(resource(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "ns"},
        "spec": {"clusterIP": "10.96.0.1", "selector": {"app": "web"},
                 "ports": [{"port": 80, "targetPort": 8080}]},
    })))
}

fn pod(name: &str, ip: &str) -> Op {
    Op::Apply(resource(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "main", "ports": [{"containerPort": 8080}]}]},
        "status": {"phase": "Running", "podIP": ip,
                   "conditions": [{"type": "Ready", "status": "True"}]},
    })))
}

fn delete_pod(name: &str) -> Op {
    Op::Delete(
        crate::resource::Kind::Pod,
        crate::resource::ObjectKey::new("ns", name),
    )
}

struct Setup {
    store: Arc<Store>,
    service: DestinationService,
    stop: watch::Sender<bool>,
}

fn setup(queue: usize) -> Setup {
    let store = Store::new(Index::new(IndexConfig::default()), Metrics::default());
    store.update(vec![service(), pod("web-1", "10.0.0.1")]);
    let (stop, shutdown) = watch::channel(false);
    let config = ServerConfig {
        stream_queue: queue,
        ..Default::default()
    };
    let service = DestinationService::new(store.clone(), config, shutdown);
    Setup {
        store,
        service,
        stop,
    }
}

fn get() -> GetDestination {
    GetDestination {
        scheme: "k8s".into(),
        path: "web.ns.svc.cluster.local:80".into(),
        context_token: String::new(),
    }
}

enum Read {
    Message(Bytes),
    End(Status),
}

async fn read(body: &mut StreamBody<EndpointSet>) -> Read {
    let frame = body.frame().await.expect("a frame").expect("no error");
    match frame.into_data() {
        Ok(data) => Read::Message(data),
        Err(frame) => Read::End(Status::from_header_map(&frame.into_trailers().unwrap()).unwrap()),
    }
}

async fn update(body: &mut StreamBody<EndpointSet>) -> Update {
    match read(body).await {
        Read::Message(data) => {
            // A whole gRPC frame: uncompressed, then the length.
            assert_eq!(data[0], 0);
            let len = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
            assert_eq!(len, data.len() - 5);
            Update::decode(&data[5..]).unwrap()
        }
        Read::End(status) => panic!("stream ended: {status:?}"),
    }
}

fn sock(a: &linkerd2_proxy_api::net::TcpAddress) -> SocketAddr {
    SocketAddr::try_from(*a).unwrap()
}

/// What a client holds, by Linkerd's rules (the first message of a stream
/// starts from nothing).
fn apply(held: &mut BTreeSet<SocketAddr>, u: &Update) {
    match u.update.as_ref().unwrap() {
        update::Update::Add(set) => {
            held.extend(set.addrs.iter().map(|a| sock(a.addr.as_ref().unwrap())))
        }
        update::Update::Remove(set) => {
            for a in &set.addrs {
                held.remove(&sock(a));
            }
        }
        update::Update::NoEndpoints(_) => held.clear(),
    }
}

fn addrs(list: &[&str]) -> BTreeSet<SocketAddr> {
    list.iter().map(|a| a.parse().unwrap()).collect()
}

fn gauge(
    family: &prometheus_client::metrics::family::Family<crate::metrics::MethodLabel, Gauge>,
) -> i64 {
    family.get_or_create(&Metrics::method("Get")).get()
}

#[tokio::test(start_paused = true)]
async fn first_the_whole_set_then_changes_shared_by_every_stream() {
    let s = setup(8);
    let mut one = s.service.get(&get()).unwrap();
    let mut two = s.service.get(&get()).unwrap();
    let mut held = BTreeSet::new();
    apply(&mut held, &update(&mut one).await);
    assert_eq!(held, addrs(&["10.0.0.1:8080"]));
    let _ = update(&mut two).await;
    assert_eq!(gauge(&s.store.metrics().subscriptions), 1);

    s.store.update(vec![pod("web-2", "10.0.0.2")]);
    let (a, b) = match (read(&mut one).await, read(&mut two).await) {
        (Read::Message(a), Read::Message(b)) => (a, b),
        _ => panic!("expected messages"),
    };
    assert_eq!(a.as_ptr(), b.as_ptr(), "one encoding, shared");
    apply(&mut held, &Update::decode(&a[5..]).unwrap());
    assert_eq!(held, addrs(&["10.0.0.1:8080", "10.0.0.2:8080"]));

    // A stream opened now starts from the whole current set.
    let mut three = s.service.get(&get()).unwrap();
    let mut fresh = BTreeSet::new();
    apply(&mut fresh, &update(&mut three).await);
    assert_eq!(fresh, held);
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_is_not_read_is_cut_and_its_subscription_freed() {
    let s = setup(8);
    let wait = ServerConfig::default().stream_send_wait;
    let mut idle = s.service.get(&get()).unwrap();
    let mut reader = s.service.get(&get()).unwrap();
    let _ = update(&mut idle).await;
    let _ = update(&mut reader).await;
    // `idle` is never polled again; `reader` takes every change.
    s.store.update(vec![pod("web-2", "10.0.0.2")]);
    let _ = update(&mut reader).await;
    tokio::time::advance(wait / 2).await;
    s.store.update(vec![pod("web-3", "10.0.0.3")]);
    let _ = update(&mut reader).await;
    let overflows = || counter(&s.store.metrics().stream_overflows_total);
    assert_eq!(overflows(), 0, "still within the wait of web-2's change");

    // Past the wait since the first change `idle` lacks: the next change
    // cuts it, and only it.
    tokio::time::advance(wait).await;
    s.store.update(vec![pod("web-4", "10.0.0.4")]);
    let _ = update(&mut reader).await;
    assert_eq!(overflows(), 1);
    assert_eq!(gauge(&s.store.metrics().subscriptions), 1);
    drop(reader);
    assert_eq!(
        gauge(&s.store.metrics().subscriptions),
        0,
        "the cut stream no longer holds the subscription, though its body lives"
    );
    assert_eq!(gauge(&s.store.metrics().streams), 1, "open until it ends");
    // The client, reading at last, finds only the status.
    match read(&mut idle).await {
        Read::End(status) => {
            assert_eq!(status.code(), tonic::Code::ResourceExhausted);
            assert!(status.message().contains("did not read"));
        }
        Read::Message(_) => panic!("a cut stream sends nothing more"),
    }
    assert!(idle.frame().await.is_none());
    assert_eq!(gauge(&s.store.metrics().streams), 0);
    // A new stream on the same target starts a new subscription.
    let mut again = s.service.get(&get()).unwrap();
    let mut held = BTreeSet::new();
    apply(&mut held, &update(&mut again).await);
    assert_eq!(held.len(), 4);
    drop((idle, again));
    assert_eq!(gauge(&s.store.metrics().subscriptions), 0);
}

#[tokio::test(start_paused = true)]
async fn a_waiting_body_is_woken_by_a_change_and_by_shutdown() {
    let s = setup(8);
    let mut body = s.service.get(&get()).unwrap();
    let _ = update(&mut body).await;
    // Nothing new: the body waits (hyper would park its task).
    assert!(
        tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .is_err(),
        "nothing to send"
    );
    let waiting = tokio::spawn(async move {
        let u = update(&mut body).await;
        (u, body)
    });
    tokio::task::yield_now().await;
    s.store.update(vec![pod("web-2", "10.0.0.2")]);
    let (u, mut body) = waiting.await.unwrap();
    let mut held = addrs(&["10.0.0.1:8080"]);
    apply(&mut held, &u);
    assert_eq!(held, addrs(&["10.0.0.1:8080", "10.0.0.2:8080"]));

    let waiting = tokio::spawn(async move { read(&mut body).await });
    tokio::task::yield_now().await;
    s.stop.send_replace(true);
    match waiting.await.unwrap() {
        Read::End(status) => assert_eq!(status.code(), tonic::Code::Ok),
        Read::Message(_) => panic!("expected the end"),
    }
    assert_eq!(gauge(&s.store.metrics().subscriptions), 0);
    assert_eq!(gauge(&s.store.metrics().streams), 0);
}

/// Reads until nothing comes for a while.
async fn drain(body: &mut StreamBody<EndpointSet>, held: &mut BTreeSet<SocketAddr>) {
    while let Ok(u) = tokio::time::timeout(Duration::from_millis(100), update(body)).await {
        apply(held, &u);
    }
}

fn counter(
    family: &prometheus_client::metrics::family::Family<
        crate::metrics::MethodLabel,
        prometheus_client::metrics::counter::Counter,
    >,
) -> u64 {
    family.get_or_create(&Metrics::method("Get")).get()
}

#[tokio::test(start_paused = true)]
async fn a_slow_reader_catches_up_to_the_latest_set() {
    let s = setup(crate::feed::MAX_HISTORY);
    let mut body = s.service.get(&get()).unwrap();
    let mut held = BTreeSet::new();
    apply(&mut held, &update(&mut body).await);
    let mut want = addrs(&["10.0.0.1:8080"]);
    let mut next = 2;
    // Changes come faster than the stream reads (it is not polled between
    // them); the reader then takes what it lacks from the shared history.
    let mut changes = |n: usize, want: &mut BTreeSet<SocketAddr>| {
        for _ in 0..n {
            let i = next;
            next += 1;
            let ip = |i: usize| format!("10.0.{}.{}", i / 200, i % 200 + 1);
            s.store.update(vec![pod(&format!("web-{i}"), &ip(i))]);
            want.insert(format!("{}:8080", ip(i)).parse().unwrap());
            if i % 3 == 0 {
                s.store.update(vec![delete_pod(&format!("web-{}", i - 1))]);
                want.remove(&format!("{}:8080", ip(i - 1)).parse().unwrap());
            }
        }
    };

    // Within the shared history: replayed from it.
    changes(10, &mut want);
    drain(&mut body, &mut held).await;
    assert_eq!(held, want);
    assert_eq!(counter(&s.store.metrics().stream_resyncs_total), 0);

    // Further behind than the history keeps: a reset and the whole set.
    changes(3 * crate::feed::MAX_HISTORY, &mut want);
    drain(&mut body, &mut held).await;
    assert_eq!(held, want);
    assert_eq!(counter(&s.store.metrics().stream_resyncs_total), 1);
    assert_eq!(counter(&s.store.metrics().stream_overflows_total), 0);
}

#[tokio::test(start_paused = true)]
async fn a_client_that_leaves_or_a_shutdown_frees_the_subscription() {
    let s = setup(8);
    let mut leaving = s.service.get(&get()).unwrap();
    let _ = update(&mut leaving).await;
    drop(leaving);
    eventually_sync("the subscription is freed", UNTIL, || {
        gauge(&s.store.metrics().subscriptions) == 0
    })
    .await;

    let mut staying = s.service.get(&get()).unwrap();
    let _ = update(&mut staying).await;
    s.stop.send_replace(true);
    match read(&mut staying).await {
        Read::End(status) => assert_eq!(status.code(), tonic::Code::Ok),
        Read::Message(_) => panic!("expected the end"),
    }
    eventually_sync("the subscription is freed", UNTIL, || {
        gauge(&s.store.metrics().subscriptions) == 0
    })
    .await;
    assert_eq!(gauge(&s.store.metrics().streams), 0);
}

#[tokio::test(start_paused = true)]
async fn bad_requests_are_refused_by_name() {
    let s = setup(8);
    let mut req = get();
    req.path = "not a path".into();
    let err = s.service.get(&req).err().unwrap();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert_eq!(gauge(&s.store.metrics().subscriptions), 0);
}

/// The memory budget's closing step: the costliest streams per stream go
/// first (a policy stream, then a lone address stream), each ends with
/// RESOURCE_EXHAUSTED and the retry hint, and the rest keep their updates.
#[tokio::test(start_paused = true)]
async fn the_closing_step_closes_the_costliest_streams_first() {
    use crate::policy::{PolicyConfig, PolicyMetrics, PolicyService, PolicyStore};
    use futures_util::StreamExt;
    use linkerd2_proxy_api::outbound::{traffic_spec, TrafficSpec};

    let s = setup(64);
    let budget = ballast_admin::MemoryBudget::unstarted(Some(64 << 20));
    let policy = PolicyStore::new(
        s.store.clone(),
        PolicyConfig::default(),
        PolicyMetrics::default(),
    );
    let policy_service = PolicyService::new(
        policy.clone(),
        100,
        16 * 1024,
        budget.clone(),
        s.stop.subscribe(),
    );
    let mut watch = policy_service
        .watch(TrafficSpec {
            source_workload: "ns:client".into(),
            target: Some(traffic_spec::Target::Authority(
                "web.ns.svc.cluster.local:80".into(),
            )),
        })
        .expect("a policy stream");
    watch.next().await.expect("a first answer").expect("ok");
    // Twenty streams share the service's subscription; one watches an
    // address alone.
    let mut shared = Vec::new();
    for _ in 0..20 {
        let mut body = s.service.get(&get()).expect("a stream");
        update(&mut body).await;
        shared.push(body);
    }
    let mut lone = s
        .service
        .get(&GetDestination {
            path: "10.0.0.1:8080".into(),
            ..get()
        })
        .expect("a stream");
    update(&mut lone).await;

    let hinted = |status: &Status| {
        status.code() == tonic::Code::ResourceExhausted
            && status
                .metadata()
                .get(RETRY_PUSHBACK_KEY)
                .is_some_and(|v| v.to_str().ok() == Some("5000"))
    };
    // The stores' counts, which the round takes its share of.
    assert_eq!((s.store.open_streams(), policy.open_streams()), (21, 1));
    // 22 streams: a round closes 5% of them, one subscription here.
    assert_eq!(crate::shed::round(&s.store, &policy, &budget), 1);
    let ended = watch.next().await.expect("the policy stream's end");
    assert!(ended.as_ref().is_err_and(hinted), "{ended:?}");
    assert!(watch.next().await.is_none());
    assert_eq!(crate::shed::round(&s.store, &policy, &budget), 1);
    match read(&mut lone).await {
        Read::End(status) => assert!(hinted(&status), "{status:?}"),
        Read::Message(_) => panic!("the lone stream was not closed"),
    }
    assert_eq!((s.store.open_streams(), policy.open_streams()), (20, 0));
    // The shared subscription's streams still follow changes.
    s.store.update(vec![pod("web-2", "10.0.0.2")]);
    for body in &mut shared {
        update(body).await;
    }
    let mut registry = prometheus_client::registry::Registry::default();
    budget.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
    for line in [
        "memory_closed_total{api=\"OutboundPolicies.Watch\"} 1",
        "memory_closed_total{api=\"Get\"} 1",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
    // A closed subscription is gone: a new stream makes a fresh one.
    let mut again = s
        .service
        .get(&GetDestination {
            path: "10.0.0.1:8080".into(),
            ..get()
        })
        .expect("a stream");
    update(&mut again).await;
    assert_eq!(s.store.open_streams(), 21);
    drop(shared);
    assert_eq!(s.store.open_streams(), 1, "streams dropped leave the count");
    drop(s.stop);
}
