//! Seed 000 on the installed whole: the destination controller, in the
//! memory limit it is installed with (which the box's kubelet applies as the
//! container's memory cgroup, as a node does), refuses a flood of streams
//! instead of being OOM-killed. Its own test binary: the flood takes the
//! machine's CPU for half a minute, which the timed fault tests beside it
//! would feel.
//!
//! Needs root, iproute2, iptables, util-linux and curl; see installed_mesh.rs.
//! Run alone: `cargo build -p ballast-sidecar && cargo test -p ballast --test
//! installed_seed000 -- --nocapture`.

#[path = "installed/cluster.rs"]
mod cluster;

use cluster::{can_run, ClusterBox};
use serde_json::json;
use std::time::{Duration, Instant};

/// `series` on the admin port of the destination controller's pod `pod`.
async fn destination_metric(cluster: &ClusterBox, pod: &str, series: &str) -> Option<f64> {
    cluster
        .control_plane_metric("ballast-destination", 9996, series)
        .await
        .into_iter()
        .find(|(name, _)| name == pod)
        .and_then(|(_, v)| v)
}

/// Services of the flood below, each with its own EndpointSlice.
const FLOOD_SERVICES: usize = 100;
const FLOOD_ENDPOINTS: usize = 5;

/// Seed 000 in the installed whole: the destination controller installed
/// with a 64Mi memory limit (`--destination-memory-limit`, which the box's
/// kubelet applies as the container's memory cgroup, as a node does) is
/// flooded with Get, GetProfile and OutboundPolicies.Watch streams for
/// 100 Services until it refuses them. It refuses with RESOURCE_EXHAUSTED
/// and the retry hint, counts what it refused, is never OOM-killed or
/// restarted, and takes streams again once the clients leave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_streams_is_refused_by_the_installed_destination_controller_never_oom_killed() {
    use linkerd2_proxy_api::{
        destination::{destination_client::DestinationClient, update::Update},
        outbound::{outbound_policies_client::OutboundPoliciesClient, traffic_spec, TrafficSpec},
    };
    use std::net::SocketAddr;

    /// Refusals seen before the clients stop opening streams.
    const REFUSALS: usize = 200;
    /// Streams tried at most: far more than 48 MiB (75% of 64Mi) holds.
    const MAX_STREAMS: usize = 40_000;

    if !can_run() {
        return;
    }
    // The stream limits raised out of the way: what refuses is memory.
    let cluster = ClusterBox::installed_by(
        &[
            "--destination-memory-limit",
            "64Mi",
            "--destination-max-streams",
            "100000",
        ],
        |rendered| rendered,
    )
    .await;
    cluster
        .api
        .apply(json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "shop"}}));
    for s in 0..FLOOD_SERVICES {
        cluster.api.apply(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": format!("svc-{s}"), "namespace": "shop"},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
        }));
        let endpoints: Vec<serde_json::Value> = (0..FLOOD_ENDPOINTS)
            .map(|p| {
                json!({"addresses": [format!("10.{}.{}.{}", 100 + s / 250, s % 250, p + 1)],
                       "conditions": {"ready": true}})
            })
            .collect();
        cluster.api.apply(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("svc-{s}-a"), "namespace": "shop",
                         "labels": {"kubernetes.io/service-name": format!("svc-{s}")}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": endpoints,
        }));
    }
    let pod = cluster
        .api
        .list("pods")
        .into_iter()
        .find(|p| {
            p["metadata"]["namespace"] == "ballast"
                && p["metadata"]["labels"]["app.kubernetes.io/name"] == "ballast-destination"
        })
        .expect("a destination pod");
    let name = pod["metadata"]["name"].as_str().unwrap_or("").to_string();
    let ip: std::net::IpAddr = pod["status"]["podIP"]
        .as_str()
        .and_then(|ip| ip.parse().ok())
        .expect("the destination pod's IP");
    let grpc = SocketAddr::new(ip, 8086);
    let authority = |s: usize| format!("svc-{s}.shop.svc.cluster.local:80");

    // The controller has the whole cluster: the last Service's endpoints.
    let deadline = Instant::now() + Duration::from_secs(60);
    let probe = cluster.grpc_channel(grpc).await;
    loop {
        let mut stream = DestinationClient::new(probe.clone())
            .get(ballast_testsupport::req(&authority(FLOOD_SERVICES - 1)))
            .await
            .expect("a Get stream")
            .into_inner();
        let first = tokio::time::timeout(Duration::from_secs(10), stream.message()).await;
        if let Ok(Ok(Some(u))) = &first {
            if matches!(&u.update, Some(Update::Add(a)) if a.addrs.len() == FLOOD_ENDPOINTS) {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the controller never had svc-{}'s endpoints: {first:?}",
            FLOOD_SERVICES - 1
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // A connection takes at most 1,000 concurrent streams.
    let mut channels = Vec::new();
    for _ in 0..MAX_STREAMS / 1_000 + 4 {
        channels.push(cluster.grpc_channel(grpc).await);
    }
    let not_restarted = |cluster: &ClusterBox| {
        let p = cluster.api.get("pods", "ballast", &name).expect("the pod");
        let status = &p["status"]["containerStatuses"][0];
        assert_eq!(
            status["restartCount"], 0,
            "the destination controller restarted: {status}"
        );
        assert!(status["state"]["running"].is_object(), "{status}");
    };
    let mut open: Vec<Box<dyn std::any::Any + Send>> = Vec::new();
    let mut refused = Vec::new();
    for i in 0..MAX_STREAMS {
        let channel = channels[i % channels.len()].clone();
        let target = authority(i / 3 % FLOOD_SERVICES);
        let opened: Result<Box<dyn std::any::Any + Send>, tonic::Status> = match i % 3 {
            0 => DestinationClient::new(channel)
                .get(ballast_testsupport::req(&target))
                .await
                .map(|r| Box::new(r.into_inner()) as _),
            1 => DestinationClient::new(channel)
                .get_profile(ballast_testsupport::req(&target))
                .await
                .map(|r| Box::new(r.into_inner()) as _),
            _ => OutboundPoliciesClient::new(channel)
                .watch(TrafficSpec {
                    source_workload: r#"{"ns":"shop","pod":"client"}"#.into(),
                    target: Some(traffic_spec::Target::Authority(target)),
                })
                .await
                .map(|r| Box::new(r.into_inner()) as _),
        };
        match opened {
            Ok(stream) => open.push(stream),
            Err(status) => {
                assert_eq!(
                    status.code(),
                    tonic::Code::ResourceExhausted,
                    "stream {i}: {status:?}"
                );
                refused.push(status);
                if refused.len() >= REFUSALS {
                    break;
                }
            }
        }
        if i % 2_000 == 0 {
            not_restarted(&cluster);
        }
    }
    let by_memory = refused
        .iter()
        .filter(|s| ballast_testsupport::shed_by_memory(s))
        .count();
    eprintln!(
        "flood: {} streams open, {} refused ({by_memory} by memory)",
        open.len(),
        refused.len()
    );
    assert!(
        refused.len() >= REFUSALS,
        "the controller took all {} streams: it never refused",
        open.len()
    );
    assert!(
        by_memory > 0,
        "no refusal carried the retry hint: {:?}",
        refused.first()
    );
    not_restarted(&cluster);
    let mut counted = 0.0;
    for api in ["Get", "GetProfile", "OutboundPolicies.Watch"] {
        let series = format!("memory_refused_total{{api=\"{api}\"}}");
        counted += destination_metric(&cluster, &name, &series)
            .await
            .unwrap_or(0.0);
    }
    assert!(
        counted >= by_memory as f64,
        "memory_refused_total counts {counted}, the clients saw {by_memory}"
    );

    // The clients leave: the pressure ends and streams are taken again.
    drop(open);
    drop(channels);
    let deadline = Instant::now() + Duration::from_secs(60);
    while destination_metric(&cluster, &name, "memory_pressure").await != Some(0.0) {
        assert!(
            Instant::now() < deadline,
            "memory pressure did not end after the clients left"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let mut again = DestinationClient::new(probe)
        .get(ballast_testsupport::req(&authority(0)))
        .await
        .expect("a stream is taken again")
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), again.message()).await;
    assert!(matches!(first, Ok(Ok(Some(_)))), "{first:?}");
    not_restarted(&cluster);
}
