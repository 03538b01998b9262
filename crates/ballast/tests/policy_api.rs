//! `ballast destination`'s policy APIs as a process, over real gRPC:
//! OutboundPolicies answers for services and addresses, following route
//! edits (a split, a route broken on purpose); InboundServerPolicies
//! answers for a deny default with one authorization.

use ballast_testsupport as support;

use linkerd2_proxy_api::{
    inbound::{
        authn::{permit_mesh_tls, Permit},
        inbound_server_policies_client::InboundServerPoliciesClient,
        proxy_protocol::Kind as InKind,
        PortSpec,
    },
    meta::metadata::Kind as MetaKind,
    net::TcpAddress,
    outbound::{
        backend, http_route::distribution, outbound_policies_client::OutboundPoliciesClient,
        proxy_protocol::Kind as OutKind, traffic_spec::Target, HttpRoute, OutboundPolicy,
        TrafficSpec,
    },
};
use std::{net::SocketAddr, path::Path};
use support::{
    eventually,
    manifests::{docs, service, PodSpec},
    next, write_atomic, Controller,
};
use tonic::{transport::Channel, Code};

const WORKLOAD: &str = r#"{"ns":"shop","pod":"client"}"#;

async fn channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connect to the controller")
}

fn by_addr(addr: &str) -> TrafficSpec {
    let addr: SocketAddr = addr.parse().unwrap();
    TrafficSpec {
        source_workload: WORKLOAD.into(),
        target: Some(Target::Addr(TcpAddress::from(addr))),
    }
}

fn by_authority(authority: &str) -> TrafficSpec {
    TrafficSpec {
        source_workload: WORKLOAD.into(),
        target: Some(Target::Authority(authority.into())),
    }
}

fn cluster(dir: &Path) {
    let mut all = vec![
        service("shop", "web", "127.0.0.100", 80, 8080),
        service("shop", "web-v2", "127.0.0.101", 80, 8080),
    ];
    all.push(PodSpec::new("shop", "web-a", "web", "127.0.1.1", 8080).yaml());
    all.push(PodSpec::new("shop", "web-b", "web-v2", "127.0.1.2", 8080).yaml());
    write_atomic(&dir.join("cluster.yaml"), &docs(&all));
}

fn split_route(v1: &str, v2: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n\
         metadata: {{name: canary, namespace: shop}}\n\
         spec:\n  parentRefs: [{{group: core, kind: Service, name: web, port: 80}}]\n\
         \x20 rules:\n  - matches: [{{path: {{type: PathPrefix, value: /}}}}]\n\
         \x20   backendRefs: [{{name: {v1}, port: 80, weight: 90}}, {{name: {v2}, port: 80, weight: 10}}]\n\
         \x20   timeouts: {{request: 2s}}\n"
    )
}

fn http_routes(p: &OutboundPolicy) -> &[HttpRoute] {
    match p.protocol.as_ref().and_then(|p| p.kind.as_ref()) {
        Some(OutKind::Detect(d)) => &d.http1.as_ref().expect("http1").routes,
        other => panic!("expected protocol detection, got {other:?}"),
    }
}

fn route_name(r: &HttpRoute) -> String {
    match r.metadata.as_ref().and_then(|m| m.kind.as_ref()) {
        Some(MetaKind::Default(name)) => format!("default:{name}"),
        Some(MetaKind::Resource(res)) => format!("{}/{}", res.kind, res.name),
        None => "none".into(),
    }
}

/// (Destination path, weight) of each backend of a route's first rule.
fn backends(r: &HttpRoute) -> Vec<(String, u32)> {
    let dist = r.rules[0].backends.as_ref().and_then(|d| d.kind.as_ref());
    let path = |b: &linkerd2_proxy_api::outbound::Backend| match &b.kind {
        Some(backend::Kind::Balancer(p)) => {
            match p.discovery.as_ref().and_then(|d| d.kind.as_ref()) {
                Some(backend::endpoint_discovery::Kind::Dst(d)) => d.path.clone(),
                None => panic!("balancer without discovery"),
            }
        }
        other => panic!("expected a balancer, got {other:?}"),
    };
    match dist {
        Some(distribution::Kind::FirstAvailable(f)) => f
            .backends
            .iter()
            .map(|b| (path(b.backend.as_ref().unwrap()), 1))
            .collect(),
        Some(distribution::Kind::RandomAvailable(r)) => r
            .backends
            .iter()
            .map(|b| {
                (
                    path(b.backend.as_ref().unwrap().backend.as_ref().unwrap()),
                    b.weight,
                )
            })
            .collect(),
        other => panic!("unexpected distribution {other:?}"),
    }
}

#[tokio::test]
async fn outbound_policy_follows_a_split_and_a_route_broken_on_purpose() {
    let dir = tempfile::tempdir().unwrap();
    cluster(dir.path());
    let c = Controller::start(dir.path(), &[]).await;

    // Linkerd's proxies dial the policy port; Ballast's the Destination port.
    let mut on_policy_port = OutboundPoliciesClient::new(channel(c.policy).await);
    let mut on_grpc_port = OutboundPoliciesClient::new(channel(c.grpc).await);
    let mut watch = on_policy_port
        .watch(by_addr("127.0.0.100:80"))
        .await
        .expect("watch a service's cluster IP")
        .into_inner();

    let first = next(&mut watch).await;
    let routes = http_routes(&first);
    assert_eq!(
        routes.iter().map(route_name).collect::<Vec<_>>(),
        ["default:http"]
    );
    assert_eq!(
        backends(&routes[0]),
        [("web.shop.svc.cluster.local:80".to_string(), 1)]
    );
    let backend = match &routes[0].rules[0].backends.as_ref().unwrap().kind {
        Some(distribution::Kind::FirstAvailable(f)) => f.backends[0].backend.clone().unwrap(),
        other => panic!("{other:?}"),
    };
    let queue = backend.queue.expect("queue");
    assert_eq!(queue.capacity, 100);
    assert_eq!(queue.failfast_timeout.unwrap().seconds, 3);
    match backend.kind {
        Some(backend::Kind::Balancer(b)) => assert!(b.load.is_some(), "peak-EWMA parameters"),
        other => panic!("{other:?}"),
    }
    // By authority, on the other port, the same answer.
    let by_name = on_grpc_port
        .get(by_authority("web.shop.svc.cluster.local:80"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(by_name, first);

    // A 90/10 split is attached: the watch sees it.
    write_atomic(
        &dir.path().join("route.yaml"),
        &split_route("web", "web-v2"),
    );
    let split = next(&mut watch).await;
    let routes = http_routes(&split);
    assert_eq!(
        routes.iter().map(route_name).collect::<Vec<_>>(),
        ["HTTPRoute/canary"]
    );
    assert_eq!(
        backends(&routes[0]),
        [
            ("web.shop.svc.cluster.local:80".to_string(), 90),
            ("web-v2.shop.svc.cluster.local:80".to_string(), 10)
        ]
    );
    let timeouts = routes[0].rules[0].timeouts.unwrap();
    assert_eq!(timeouts.request.unwrap().seconds, 2);

    // Broken on purpose (a backend that does not exist): left out, named in
    // the log and counted; the service is served by its default route.
    write_atomic(
        &dir.path().join("route.yaml"),
        &split_route("web", "web-v3"),
    );
    let broken = next(&mut watch).await;
    assert_eq!(
        http_routes(&broken)
            .iter()
            .map(route_name)
            .collect::<Vec<_>>(),
        ["default:http"]
    );
    eventually("the broken route in the log", || async {
        c.logs_containing("Route left out")
            .iter()
            .any(|l| l.contains("shop/canary") && l.contains("shop/web-v3"))
            .then_some(())
    })
    .await;
    assert_eq!(
        c.metric("policy_route_problems_total{reason=\"backend_not_found\"}")
            .await,
        Some(1.0)
    );
    assert_eq!(
        c.metric("policy_invalid_routes{reason=\"backend_not_found\"}")
            .await,
        Some(1.0)
    );

    // Fixed: served again, and no longer counted as invalid.
    write_atomic(
        &dir.path().join("route.yaml"),
        &split_route("web", "web-v2"),
    );
    assert_eq!(next(&mut watch).await, split);
    assert_eq!(
        c.metric("policy_invalid_routes{reason=\"backend_not_found\"}")
            .await,
        Some(0.0)
    );
}

/// The `failure_accrual` both HTTP protocols of an answer carry (they
/// must agree).
fn failure_accrual(p: &OutboundPolicy) -> Option<linkerd2_proxy_api::outbound::FailureAccrual> {
    match p.protocol.as_ref().and_then(|p| p.kind.as_ref()) {
        Some(OutKind::Detect(d)) => {
            let one = d.http1.as_ref().expect("http1").failure_accrual;
            assert_eq!(one, d.http2.as_ref().expect("http2").failure_accrual);
            one
        }
        other => panic!("expected protocol detection, got {other:?}"),
    }
}

#[tokio::test]
async fn outbound_policy_carries_a_services_failure_accrual() {
    use linkerd2_proxy_api::outbound::failure_accrual::Kind;
    let dir = tempfile::tempdir().unwrap();
    let annotated = |annotations: &str| {
        service("shop", "web", "127.0.0.100", 80, 8080).replace(
            "metadata: {name: web, namespace: shop}",
            &format!("metadata: {{name: web, namespace: shop, annotations: {{{annotations}}}}}"),
        )
    };
    let write = |annotations: &str| {
        let all = vec![
            annotated(annotations),
            PodSpec::new("shop", "web-a", "web", "127.0.1.1", 8080).yaml(),
        ];
        write_atomic(&dir.path().join("cluster.yaml"), &docs(&all));
    };
    write("balancer.linkerd.io/failure-accrual: consecutive");
    let c = Controller::start(dir.path(), &[]).await;
    let mut client = OutboundPoliciesClient::new(channel(c.policy).await);
    let mut watch = client
        .watch(by_addr("127.0.0.100:80"))
        .await
        .expect("watch")
        .into_inner();
    // Linkerd's defaults: 7 failures, penalties from 1 s to 1 m, jitter 0.5.
    let first = next(&mut watch).await;
    let Some(Kind::ConsecutiveFailures(c1)) = failure_accrual(&first).and_then(|f| f.kind) else {
        panic!("consecutive failure accrual: {first:?}")
    };
    assert_eq!(c1.max_failures, 7);
    let backoff = c1.backoff.expect("backoff");
    assert_eq!(backoff.min_backoff.expect("min").seconds, 1);
    assert_eq!(backoff.max_backoff.expect("max").seconds, 60);
    assert_eq!(backoff.jitter_ratio, 0.5);

    write(
        "balancer.linkerd.io/failure-accrual: consecutive, \
         balancer.linkerd.io/failure-accrual-consecutive-max-failures: '3', \
         balancer.linkerd.io/failure-accrual-consecutive-min-penalty: 250ms, \
         balancer.linkerd.io/failure-accrual-consecutive-max-penalty: 10s, \
         balancer.linkerd.io/failure-accrual-consecutive-jitter-ratio: '0'",
    );
    let tuned = next(&mut watch).await;
    let Some(Kind::ConsecutiveFailures(c2)) = failure_accrual(&tuned).and_then(|f| f.kind) else {
        panic!("consecutive failure accrual: {tuned:?}")
    };
    assert_eq!(c2.max_failures, 3);
    let backoff = c2.backoff.expect("backoff");
    assert_eq!(backoff.min_backoff.expect("min").nanos, 250_000_000);
    assert_eq!(backoff.max_backoff.expect("max").seconds, 10);
    assert_eq!(backoff.jitter_ratio, 0.0);

    // Unreadable annotations turn it off (as Linkerd's controller does), and
    // the answer is otherwise the same.
    write(
        "balancer.linkerd.io/failure-accrual: consecutive, \
         balancer.linkerd.io/failure-accrual-consecutive-min-penalty: soon",
    );
    let off = next(&mut watch).await;
    assert_eq!(failure_accrual(&off), None);
    assert_eq!(http_routes(&off), http_routes(&first));
}

#[tokio::test]
async fn outbound_policy_refuses_what_it_cannot_answer() {
    let dir = tempfile::tempdir().unwrap();
    cluster(dir.path());
    let c = Controller::start(dir.path(), &[]).await;
    let mut client = OutboundPoliciesClient::new(channel(c.policy).await);

    // An address no service owns is forwarded to as it is.
    let forward = client
        .get(by_addr("192.0.2.7:443"))
        .await
        .unwrap()
        .into_inner();
    let routes = http_routes(&forward);
    match &routes[0].rules[0].backends.as_ref().unwrap().kind {
        Some(distribution::Kind::FirstAvailable(f)) => {
            match &f.backends[0].backend.as_ref().unwrap().kind {
                Some(backend::Kind::Forward(addr)) => {
                    let a = SocketAddr::try_from(addr.addr.unwrap()).unwrap();
                    assert_eq!(a, "192.0.2.7:443".parse::<SocketAddr>().unwrap());
                }
                other => panic!("expected a forward backend, got {other:?}"),
            }
        }
        other => panic!("{other:?}"),
    }

    let unknown = client
        .get(by_authority("nothing.shop.svc.cluster.local:80"))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    let garbage = client
        .watch(TrafficSpec {
            source_workload: WORKLOAD.into(),
            target: None,
        })
        .await
        .unwrap_err();
    assert_eq!(garbage.code(), Code::InvalidArgument);
    let bad_authority = client.get(by_authority("::::")).await.unwrap_err();
    assert_eq!(bad_authority.code(), Code::InvalidArgument);
}

fn inbound_policy_objects(dir: &Path) {
    let objects = [
        "apiVersion: policy.linkerd.io/v1beta3\nkind: Server\n\
         metadata: {name: web-http, namespace: shop}\n\
         spec: {podSelector: {matchLabels: {app: web}}, port: http, proxyProtocol: HTTP/1}\n"
            .to_string(),
        "apiVersion: policy.linkerd.io/v1alpha1\nkind: MeshTLSAuthentication\n\
         metadata: {name: client-a, namespace: shop}\n\
         spec: {identities: [client-a.shop.serviceaccount.identity.linkerd.cluster.local]}\n"
            .to_string(),
    ];
    write_atomic(&dir.join("server.yaml"), &docs(&objects));
    write_atomic(
        &dir.join("authz.yaml"),
        "apiVersion: policy.linkerd.io/v1alpha1\nkind: AuthorizationPolicy\n\
         metadata: {name: allow-client-a, namespace: shop}\n\
         spec:\n  targetRef: {group: policy.linkerd.io, kind: Server, name: web-http}\n\
         \x20 requiredAuthenticationRefs: [{group: policy.linkerd.io, kind: MeshTLSAuthentication, name: client-a}]\n",
    );
}

#[tokio::test]
async fn inbound_policy_denies_by_default_and_admits_one_identity() {
    let dir = tempfile::tempdir().unwrap();
    cluster(dir.path());
    inbound_policy_objects(dir.path());
    let c = Controller::start(dir.path(), &["--default-inbound-policy", "deny"]).await;
    let mut client = InboundServerPoliciesClient::new(channel(c.policy).await);
    let spec = |port| PortSpec {
        workload: r#"{"ns":"shop","pod":"web-a"}"#.into(),
        port,
    };

    let mut watch = client.watch_port(spec(8080)).await.unwrap().into_inner();
    let server = next(&mut watch).await;
    assert_eq!(server.labels["kind"], "server");
    assert_eq!(server.labels["name"], "web-http");
    assert!(matches!(
        server.protocol.as_ref().and_then(|p| p.kind.as_ref()),
        Some(InKind::Http1(_))
    ));
    assert_eq!(server.authorizations.len(), 1);
    let authz = &server.authorizations[0];
    assert!(
        !authz.networks.is_empty(),
        "Linkerd's proxies need networks"
    );
    match authz
        .authentication
        .as_ref()
        .and_then(|a| a.permit.as_ref())
    {
        Some(Permit::MeshTls(m)) => match &m.clients {
            Some(permit_mesh_tls::Clients::Identities(ids)) => {
                let names: Vec<_> = ids.identities.iter().map(|i| i.name.as_str()).collect();
                assert_eq!(
                    names,
                    ["client-a.shop.serviceaccount.identity.linkerd.cluster.local"]
                );
                assert!(ids.suffixes.is_empty());
            }
            other => panic!("{other:?}"),
        },
        other => panic!("expected mesh TLS, got {other:?}"),
    }

    // A port no Server selects: the deny default, no authorization at all.
    let other = client.get_port(spec(9090)).await.unwrap().into_inner();
    assert_eq!(other.labels["kind"], "default");
    assert_eq!(other.labels["name"], "deny");
    assert!(other.authorizations.is_empty());

    // The authorization goes: the server now admits no one.
    std::fs::remove_file(dir.path().join("authz.yaml")).unwrap();
    let revoked = next(&mut watch).await;
    assert!(revoked.authorizations.is_empty());

    let unknown = client
        .get_port(PortSpec {
            workload: "shop:nobody".into(),
            port: 8080,
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    for (workload, port) in [
        ("shop", 8080),
        (r#"{"ns":"shop","pod":"web-a"}"#, 0),
        ("", 80),
    ] {
        let err = client
            .get_port(PortSpec {
                workload: workload.into(),
                port,
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{workload} {port}");
    }
}

#[tokio::test]
async fn get_profile_serves_a_service_profile_and_follows_it() {
    let dir = tempfile::tempdir().unwrap();
    cluster(dir.path());
    let c = Controller::start(dir.path(), &[]).await;
    let mut profiles = c
        .get_profile("web.shop.svc.cluster.local:80")
        .await
        .unwrap();
    let first = next(&mut profiles).await;
    assert!(first.routes.is_empty(), "no profile yet: {first:?}");

    write_atomic(
        &dir.path().join("profile.yaml"),
        "apiVersion: linkerd.io/v1alpha2\nkind: ServiceProfile\n\
         metadata: {name: web.shop.svc.cluster.local, namespace: shop}\n\
         spec:\n  routes:\n  - name: GET /api\n    condition: {method: GET, pathRegex: /api/.*}\n\
         \x20   isRetryable: true\n    timeout: 250ms\n\
         \x20   responseClasses: [{condition: {status: {min: 500, max: 599}}, isFailure: true}]\n\
         \x20 retryBudget: {retryRatio: 0.5, minRetriesPerSecond: 3, ttl: 5s}\n\
         \x20 dstOverrides: [{authority: web-v2.shop.svc.cluster.local:80, weight: 1}]\n",
    );
    let profiled = next(&mut profiles).await;
    assert_eq!(profiled.routes.len(), 1);
    let route = &profiled.routes[0];
    assert_eq!(route.metrics_labels["route"], "GET /api");
    assert!(route.is_retryable);
    assert_eq!(route.timeout.unwrap().nanos, 250_000_000);
    assert!(route.response_classes[0].is_failure);
    let budget = profiled.retry_budget.unwrap();
    assert_eq!(
        (budget.retry_ratio, budget.min_retries_per_second),
        (0.5, 3)
    );
    assert_eq!(
        profiled.dst_overrides[0].authority,
        "web-v2.shop.svc.cluster.local:80"
    );
    assert_eq!(profiled.dst_overrides[0].weight, 1000);

    // A broken edit (a bad regex) is refused; the last good profile stays.
    write_atomic(
        &dir.path().join("profile.yaml"),
        "apiVersion: linkerd.io/v1alpha2\nkind: ServiceProfile\n\
         metadata: {name: web.shop.svc.cluster.local, namespace: shop}\n\
         spec:\n  routes:\n  - name: bad\n    condition: {pathRegex: \"([\"}\n",
    );
    eventually("the broken profile named in the log", || async {
        (!c.logs_containing("pathRegex").is_empty()).then_some(())
    })
    .await;
    let mut again = c
        .get_profile("web.shop.svc.cluster.local:80")
        .await
        .unwrap();
    assert_eq!(
        next(&mut again).await,
        profiled,
        "the last good profile is kept"
    );
    std::fs::remove_file(dir.path().join("profile.yaml")).unwrap();
    let removed = next(&mut profiles).await;
    assert!(removed.routes.is_empty());
}

/// The same answers from the Kubernetes source (testkit's API server).
#[tokio::test]
async fn policy_answers_from_the_kubernetes_source() {
    use serde_json::json;
    let api = ballast_testkit::ApiServer::start().await;
    let tmp = tempfile::tempdir().unwrap();
    let kubeconfig = api.write_kubeconfig(tmp.path()).display().to_string();
    for (name, ip) in [("web", "127.0.0.100"), ("web-v2", "127.0.0.101")] {
        api.apply(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"clusterIP": ip, "selector": {"app": name},
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}
        }));
    }
    api.apply(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-a", "namespace": "shop", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "main", "ports": [{"name": "http", "containerPort": 8080}]}]},
        "status": {"phase": "Running", "podIP": "127.0.1.1",
                   "conditions": [{"type": "Ready", "status": "True"}]}
    }));
    let route = |v2: &str| {
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "canary", "namespace": "shop"},
            "spec": {"parentRefs": [{"group": "core", "kind": "Service", "name": "web", "port": 80}],
                     "rules": [{"backendRefs": [{"name": "web", "port": 80, "weight": 90},
                                                {"name": v2, "port": 80, "weight": 10}]}]}
        })
    };
    api.apply(route("web-v2"));
    api.apply(json!({
        "apiVersion": "policy.linkerd.io/v1beta3", "kind": "Server",
        "metadata": {"name": "web-http", "namespace": "shop"},
        "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "port": 8080}
    }));
    api.apply(json!({
        "apiVersion": "policy.linkerd.io/v1alpha1", "kind": "AuthorizationPolicy",
        "metadata": {"name": "allow-a", "namespace": "shop"},
        "spec": {"targetRef": {"group": "policy.linkerd.io", "kind": "Server", "name": "web-http"},
                 "requiredAuthenticationRefs": [{"kind": "ServiceAccount", "name": "client-a"}]}
    }));
    let c = Controller::start_with(&[
        "--kubeconfig".to_string(),
        kubeconfig,
        "--default-inbound-policy".to_string(),
        "deny".to_string(),
    ])
    .await;

    let mut outbound = OutboundPoliciesClient::new(channel(c.policy).await);
    let mut watch = outbound
        .watch(by_addr("127.0.0.100:80"))
        .await
        .unwrap()
        .into_inner();
    let split = next(&mut watch).await;
    assert_eq!(
        backends(&http_routes(&split)[0]),
        [
            ("web.shop.svc.cluster.local:80".to_string(), 90),
            ("web-v2.shop.svc.cluster.local:80".to_string(), 10)
        ]
    );
    // Broken on purpose through the API: left out, the default route served.
    api.apply(route("web-v3"));
    let broken = next(&mut watch).await;
    assert_eq!(
        http_routes(&broken)
            .iter()
            .map(route_name)
            .collect::<Vec<_>>(),
        ["default:http"]
    );

    let mut inbound = InboundServerPoliciesClient::new(channel(c.policy).await);
    let server = inbound
        .get_port(PortSpec {
            workload: "shop:web-a".into(),
            port: 8080,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(server.labels["name"], "web-http");
    match server.authorizations[0]
        .authentication
        .as_ref()
        .and_then(|a| a.permit.as_ref())
    {
        Some(Permit::MeshTls(m)) => match &m.clients {
            Some(permit_mesh_tls::Clients::Identities(ids)) => assert_eq!(
                ids.identities[0].name,
                "client-a.shop.serviceaccount.identity.linkerd.cluster.local"
            ),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}
