//! Table tests for policy answers: routes attached to Services, invalid
//! routes left out and reported once, inbound servers, default policies and
//! authorizations, and the changes that reach each answer.

use super::*;
use crate::{resource::DefaultPolicy, Index, IndexConfig, Target};
use serde_json::{json, Value};
use std::net::SocketAddr;

const NS: &str = "shop";

fn decode(v: Value) -> Resource {
    Resource::from_value(v)
        .unwrap_or_else(|e| panic!("invalid fixture: {e}"))
        .expect("a kind the index reads")
}

fn service(name: &str, ip: &str) -> Resource {
    decode(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": NS, "name": name},
        "spec": {"clusterIP": ip, "selector": {"app": name},
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}
    }))
}

fn pod(name: &str, ip: &str, labels: Value, annotations: Value) -> Resource {
    decode(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": NS, "name": name, "labels": labels, "annotations": annotations},
        "spec": {"containers": [{"name": "app", "ports": [{"name": "http", "containerPort": 8080}]}]},
        "status": {"phase": "Running", "podIP": ip,
                   "conditions": [{"type": "Ready", "status": "True"}]}
    }))
}

fn http_route(name: &str, created: &str, parent: &str, backends: Value) -> Resource {
    decode(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"namespace": NS, "name": name, "creationTimestamp": created},
        "spec": {"parentRefs": [{"group": "core", "kind": "Service", "name": parent, "port": 80}],
                 "rules": [{"backendRefs": backends}]}
    }))
}

fn key(name: &str) -> ObjectKey {
    ObjectKey::new(NS, name)
}

fn svc_target(name: &str) -> Target {
    Target::Service {
        service: key(name),
        port: 80,
    }
}

fn routes_of(view: &OutboundView) -> Vec<String> {
    match view {
        OutboundView::Service(s) => s
            .http_routes
            .iter()
            .map(|r| r.key.name.to_string())
            .collect(),
        other => panic!("not a service answer: {other:?}"),
    }
}

#[test]
fn routes_attach_to_their_parent_port_in_gateway_order() {
    let mut index = Index::new(IndexConfig::default());
    index.apply(service("web", "10.96.0.10"));
    index.apply(service("web-v2", "10.96.0.11"));
    index.apply(http_route(
        "newer",
        "2024-01-02T00:00:00Z",
        "web",
        json!([{"name": "web", "port": 80}]),
    ));
    index.apply(http_route(
        "older",
        "2024-01-01T00:00:00Z",
        "web",
        json!([{"name": "web-v2", "port": 80}]),
    ));

    let by_name = index.outbound_policy(&svc_target("web"));
    assert_eq!(routes_of(&by_name), ["older", "newer"]);
    // By cluster IP, the same answer.
    let by_ip = index.outbound_policy(&Target::Addr("10.96.0.10:80".parse().unwrap()));
    assert_eq!(by_ip, by_name);
    // Another port of the Service carries none of them.
    let other_port = index.outbound_policy(&Target::Service {
        service: key("web"),
        port: 81,
    });
    assert!(routes_of(&other_port).is_empty());
    // The backend Service has no routes of its own.
    assert!(routes_of(&index.outbound_policy(&svc_target("web-v2"))).is_empty());
}

#[test]
fn a_route_with_a_missing_backend_is_left_out_reported_once_and_restored() {
    let mut index = Index::new(IndexConfig::default());
    index.apply(service("web", "10.96.0.10"));
    let ch = index.apply(http_route(
        "split",
        "2024-01-01T00:00:00Z",
        "web",
        json!([{"name": "web", "port": 80, "weight": 90}, {"name": "canary", "port": 80, "weight": 10}]),
    ));
    assert_eq!(ch.route_problems.len(), 1, "{:?}", ch.route_problems);
    assert_eq!(ch.route_problems[0].reason, "backend_not_found");
    assert!(ch.route_problems[0].detail.contains("shop/canary"));
    assert!(routes_of(&index.outbound_policy(&svc_target("web"))).is_empty());
    assert!(ch.affects_outbound(&svc_target("web"), &index));

    // An unrelated change does not report it again.
    let ch = index.apply(service("other", "10.96.0.12"));
    assert!(ch.route_problems.is_empty());

    // The backend appears: the route is served, and the parent's answer is
    // among those the change reaches.
    let ch = index.apply(service("canary", "10.96.0.13"));
    assert!(ch.affects_outbound(&svc_target("web"), &index));
    assert_eq!(
        routes_of(&index.outbound_policy(&svc_target("web"))),
        ["split"]
    );
    assert_eq!(index.policy().problems().count(), 0);

    // And goes again.
    let ch = index.delete(Kind::Service, &key("canary"));
    assert_eq!(ch.route_problems.len(), 1);
    assert!(routes_of(&index.outbound_policy(&svc_target("web"))).is_empty());
}

#[test]
fn a_route_for_a_missing_parent_is_reported() {
    let mut index = Index::new(IndexConfig::default());
    let ch = index.apply(http_route(
        "orphan",
        "2024-01-01T00:00:00Z",
        "nowhere",
        json!([]),
    ));
    assert_eq!(ch.route_problems.len(), 1);
    assert_eq!(ch.route_problems[0].reason, "parent_not_found");
    index.apply(service("nowhere", "10.96.0.20"));
    assert_eq!(
        routes_of(&index.outbound_policy(&svc_target("nowhere"))),
        ["orphan"]
    );
}

#[test]
fn route_changes_reach_only_their_parents() {
    let mut index = Index::new(IndexConfig::default());
    index.apply(service("web", "10.96.0.10"));
    index.apply(service("api", "10.96.0.11"));
    let ch = index.apply(http_route("r", "2024-01-01T00:00:00Z", "web", json!([])));
    assert!(ch.affects_outbound(&svc_target("web"), &index));
    assert!(!ch.affects_outbound(&svc_target("api"), &index));
    // Endpoint subscriptions do not see route changes.
    assert!(!ch.affects(&svc_target("web"), &index));
    // Deleting it reaches the parent again.
    let ch = index.delete(Kind::HttpRoute, &key("r"));
    assert!(ch.affects_outbound(&svc_target("web"), &index));
    // A Linkerd HTTPRoute of the same name is another object.
    let linkerd = decode(json!({
        "apiVersion": "policy.linkerd.io/v1beta3", "kind": "HTTPRoute",
        "metadata": {"namespace": NS, "name": "r"},
        "spec": {"parentRefs": [{"group": "core", "kind": "Service", "name": "web", "port": 80}]}
    }));
    index.apply(linkerd);
    index.apply(http_route("r", "2024-01-01T00:00:00Z", "web", json!([])));
    assert_eq!(
        routes_of(&index.outbound_policy(&svc_target("web"))).len(),
        2
    );
    index.reset(Kind::HttpRoute, vec![]);
    assert_eq!(
        routes_of(&index.outbound_policy(&svc_target("web"))).len(),
        1
    );
}

#[test]
fn addresses_without_a_service_are_forwarded_with_the_pods_identity() {
    let mut index = Index::new(IndexConfig::default());
    index.apply(pod(
        "web-1",
        "10.0.0.5",
        json!({"app": "web", "linkerd.io/control-plane-ns": "linkerd"}),
        json!({}),
    ));
    let addr: SocketAddr = "10.0.0.5:8080".parse().unwrap();
    match index.outbound_policy(&Target::Addr(addr)) {
        OutboundView::Forward {
            addr: a, endpoint, ..
        } => {
            assert_eq!(a, addr);
            assert!(
                endpoint.and_then(|e| e.mesh).is_some(),
                "meshed pod identity"
            );
        }
        other => panic!("{other:?}"),
    }
    let outside: SocketAddr = "192.0.2.1:443".parse().unwrap();
    assert!(matches!(
        index.outbound_policy(&Target::Addr(outside)),
        OutboundView::Forward { endpoint: None, .. }
    ));
    assert_eq!(
        index.outbound_policy(&svc_target("missing")),
        OutboundView::UnknownService
    );
}

fn server(name: &str, port: Value, selector: Value) -> Resource {
    decode(json!({
        "apiVersion": "policy.linkerd.io/v1beta3", "kind": "Server",
        "metadata": {"namespace": NS, "name": name},
        "spec": {"podSelector": selector, "port": port, "proxyProtocol": "HTTP/1"}
    }))
}

fn authz(name: &str, target: Value, refs: Value) -> Resource {
    decode(json!({
        "apiVersion": "policy.linkerd.io/v1alpha1", "kind": "AuthorizationPolicy",
        "metadata": {"namespace": NS, "name": name},
        "spec": {"targetRef": target, "requiredAuthenticationRefs": refs}
    }))
}

fn mtls(name: &str, identities: Value) -> Resource {
    decode(json!({
        "apiVersion": "policy.linkerd.io/v1alpha1", "kind": "MeshTLSAuthentication",
        "metadata": {"namespace": NS, "name": name},
        "spec": {"identities": identities}
    }))
}

#[test]
fn default_policy_comes_from_pod_then_namespace_then_config() {
    let mut index = Index::new(IndexConfig {
        default_inbound_policy: DefaultPolicy::ClusterAuthenticated,
        ..IndexConfig::default()
    });
    index.apply(pod("a", "10.0.0.1", json!({}), json!({})));
    index.apply(pod(
        "b",
        "10.0.0.2",
        json!({}),
        json!({"config.linkerd.io/default-inbound-policy": "deny"}),
    ));
    let view = |index: &Index, name: &str| index.inbound_policy(&key(name), 8080).expect("pod");

    let a = view(&index, "a");
    assert_eq!(
        a.server,
        ServerRef::Default(DefaultPolicy::ClusterAuthenticated)
    );
    assert_eq!(a.authorizations.len(), 1);
    assert!(
        matches!(&a.authorizations[0].authn, Authn::MeshTls { suffixes, .. } if suffixes == &[String::new()])
    );
    assert_eq!(
        a.authorizations[0].networks.len(),
        5,
        "Linkerd's cluster networks"
    );
    assert_eq!(a.protocol, InboundProtocol::Detect);

    let b = view(&index, "b");
    assert_eq!(b.server, ServerRef::Default(DefaultPolicy::Deny));
    assert!(b.authorizations.is_empty());

    let ch = index.apply(decode(json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": NS, "annotations": {"config.linkerd.io/default-inbound-policy": "audit"}}
    })));
    assert!(ch.affects_inbound(&key("a")));
    let a = view(&index, "a");
    assert_eq!(a.server, ServerRef::Default(DefaultPolicy::Audit));
    assert_eq!(a.authorizations[0].meta, AuthzRef::Default("audit"));
    assert_eq!(a.authorizations[0].authn, Authn::Unauthenticated);
    // The pod's own annotation still wins.
    assert_eq!(
        view(&index, "b").server,
        ServerRef::Default(DefaultPolicy::Deny)
    );
    assert!(index.inbound_policy(&key("nobody"), 80).is_none());
}

#[test]
fn a_server_with_one_authorization_admits_one_identity() {
    let mut index = Index::new(IndexConfig::default());
    index.apply(pod("web-1", "10.0.0.5", json!({"app": "web"}), json!({})));
    index.apply(server(
        "web-http",
        json!("http"),
        json!({"matchLabels": {"app": "web"}}),
    ));
    let policy = authz(
        "allow-client",
        json!({"group": "policy.linkerd.io", "kind": "Server", "name": "web-http"}),
        json!([{"group": "policy.linkerd.io", "kind": "MeshTLSAuthentication", "name": "client"}]),
    );
    index.apply(policy);

    // The authentication does not exist yet: the policy grants nothing.
    let view = index.inbound_policy(&key("web-1"), 8080).unwrap();
    assert_eq!(view.server, ServerRef::Server(key("web-http")));
    assert_eq!(view.protocol, InboundProtocol::Http1);
    assert!(view.authorizations.is_empty());

    let ch = index.apply(mtls(
        "client",
        json!(["client.shop.serviceaccount.identity.linkerd.cluster.local"]),
    ));
    assert!(ch.affects_inbound(&key("web-1")));
    let view = index.inbound_policy(&key("web-1"), 8080).unwrap();
    assert_eq!(view.authorizations.len(), 1);
    assert_eq!(
        view.authorizations[0].meta,
        AuthzRef::Policy(key("allow-client"))
    );
    assert_eq!(
        view.authorizations[0].authn,
        Authn::MeshTls {
            identities: vec!["client.shop.serviceaccount.identity.linkerd.cluster.local".into()],
            suffixes: vec![],
        }
    );
    // Another port of the pod is not the Server's: the default applies.
    let other = index.inbound_policy(&key("web-1"), 9090).unwrap();
    assert_eq!(
        other.server,
        ServerRef::Default(DefaultPolicy::AllUnauthenticated)
    );
    // A pod the selector does not pick keeps the default.
    index.apply(pod("db-1", "10.0.0.6", json!({"app": "db"}), json!({})));
    let db = index.inbound_policy(&key("db-1"), 8080).unwrap();
    assert_eq!(
        db.server,
        ServerRef::Default(DefaultPolicy::AllUnauthenticated)
    );
}

#[test]
fn service_account_references_name_linkerds_identity() {
    let mut index = Index::new(IndexConfig {
        trust_domain: "example.org".into(),
        ..IndexConfig::default()
    });
    index.apply(pod("web-1", "10.0.0.5", json!({"app": "web"}), json!({})));
    index.apply(server(
        "web-http",
        json!(8080),
        json!({"matchLabels": {"app": "web"}}),
    ));
    index.apply(authz(
        "by-sa",
        json!({"group": "policy.linkerd.io", "kind": "Server", "name": "web-http"}),
        json!([{"kind": "ServiceAccount", "name": "client", "namespace": "other"}]),
    ));
    let view = index.inbound_policy(&key("web-1"), 8080).unwrap();
    assert_eq!(
        view.authorizations[0].authn,
        Authn::MeshTls {
            identities: vec!["client.other.serviceaccount.identity.linkerd.example.org".into()],
            suffixes: vec![],
        }
    );
}

#[test]
fn inbound_routes_carry_their_own_authorizations() {
    let mut index = Index::new(IndexConfig::default());
    index.apply(pod("web-1", "10.0.0.5", json!({"app": "web"}), json!({})));
    index.apply(server(
        "web-http",
        json!(8080),
        json!({"matchLabels": {"app": "web"}}),
    ));
    index.apply(decode(json!({
        "apiVersion": "policy.linkerd.io/v1beta3", "kind": "HTTPRoute",
        "metadata": {"namespace": NS, "name": "admin"},
        "spec": {"parentRefs": [{"group": "policy.linkerd.io", "kind": "Server", "name": "web-http"}],
                 "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/admin"}}]}]}
    })));
    index.apply(authz(
        "admin-open",
        json!({"group": "policy.linkerd.io", "kind": "HTTPRoute", "name": "admin"}),
        json!([]),
    ));
    let view = index.inbound_policy(&key("web-1"), 8080).unwrap();
    assert_eq!(view.routes.len(), 1);
    assert_eq!(view.routes[0].route.key, key("admin"));
    assert_eq!(view.routes[0].authorizations.len(), 1);
    assert_eq!(
        view.routes[0].authorizations[0].authn,
        Authn::Unauthenticated
    );
    assert!(
        view.authorizations.is_empty(),
        "the route's policy is not the server's"
    );
    // Inbound routes never reach outbound answers or route problems.
    assert_eq!(index.policy().problems().count(), 0);
}

#[test]
fn a_service_profile_reaches_its_services_profile_answer() {
    let mut index = Index::new(IndexConfig::default());
    index.apply(service("web", "10.96.0.10"));
    let profile = decode(json!({
        "apiVersion": "linkerd.io/v1alpha2", "kind": "ServiceProfile",
        "metadata": {"namespace": NS, "name": "web.shop.svc.cluster.local"},
        "spec": {"routes": [{"name": "GET /", "condition": {"method": "GET"}, "isRetryable": true}]}
    }));
    let ch = index.apply(profile);
    assert!(
        ch.affects(&svc_target("web"), &index),
        "the profile's service is touched"
    );
    match index.profile(&svc_target("web")) {
        crate::ProfileView::Service {
            profile: Some(p), ..
        } => {
            assert_eq!(p.routes[0].name, "GET /");
            assert!(p.routes[0].is_retryable);
        }
        other => panic!("{other:?}"),
    }
    // A profile named for another domain describes nothing here.
    index.apply(decode(json!({
        "apiVersion": "linkerd.io/v1alpha2", "kind": "ServiceProfile",
        "metadata": {"namespace": NS, "name": "api.shop.svc.example.org"},
        "spec": {}
    })));
    let ch = index.delete(Kind::ServiceProfile, &key("web.shop.svc.cluster.local"));
    assert!(ch.affects(&svc_target("web"), &index));
    assert!(matches!(
        index.profile(&svc_target("web")),
        crate::ProfileView::Service { profile: None, .. }
    ));
}
