//! Policies for the shared fake controller
//! (`ballast_testsupport::fake_controller`) to serve, built the way the
//! controller builds them, and a small HTTP/1 backend whose answers the
//! request path chooses.

#![allow(dead_code)]

use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use linkerd2_proxy_api::{
    http_route as hr, meta,
    outbound::{self as out, OutboundPolicy},
};
use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};
use tokio::{net::TcpListener, task::JoinHandle};

pub const NS: &str = "shop";

pub fn authority(name: &str) -> String {
    format!("{name}.{NS}.svc.cluster.local:80")
}

fn service_meta(name: &str) -> Option<meta::Metadata> {
    Some(meta::Metadata {
        kind: Some(meta::metadata::Kind::Resource(meta::Resource {
            group: "core".into(),
            kind: "Service".into(),
            name: name.into(),
            namespace: NS.into(),
            section: String::new(),
            port: 80,
        })),
    })
}

/// A protobuf duration, of whatever type the field wants.
pub fn dur<T: TryFrom<Duration>>(d: Duration) -> Option<T>
where
    T::Error: std::fmt::Debug,
{
    Some(T::try_from(d).unwrap())
}

/// A backend: the Service `name` (port 80), balanced over what `Get` says
/// of its path.
pub fn backend(name: &str) -> out::Backend {
    out::Backend {
        metadata: service_meta(name),
        queue: Some(out::Queue {
            capacity: 100,
            failfast_timeout: dur(Duration::from_secs(3)),
        }),
        kind: Some(out::backend::Kind::Balancer(out::backend::BalanceP2c {
            discovery: Some(out::backend::EndpointDiscovery {
                kind: Some(out::backend::endpoint_discovery::Kind::Dst(
                    out::backend::endpoint_discovery::DestinationGet {
                        path: authority(name),
                    },
                )),
            }),
            load: Some(out::backend::balance_p2c::Load::PeakEwma(
                out::backend::balance_p2c::PeakEwma {
                    default_rtt: dur(Duration::from_millis(30)),
                    decay: dur(Duration::from_secs(10)),
                },
            )),
        })),
    }
}

fn route_backend(name: &str) -> out::http_route::RouteBackend {
    out::http_route::RouteBackend {
        backend: Some(backend(name)),
        filters: vec![],
        ..Default::default()
    }
}

/// Backends by weight.
pub fn split(weights: &[(&str, u32)]) -> out::http_route::Distribution {
    out::http_route::Distribution {
        kind: Some(out::http_route::distribution::Kind::RandomAvailable(
            out::http_route::distribution::RandomAvailable {
                backends: weights
                    .iter()
                    .map(|(name, weight)| out::http_route::WeightedRouteBackend {
                        backend: Some(route_backend(name)),
                        weight: *weight,
                    })
                    .collect(),
            },
        )),
    }
}

/// One backend.
pub fn to(name: &str) -> out::http_route::Distribution {
    out::http_route::Distribution {
        kind: Some(out::http_route::distribution::Kind::FirstAvailable(
            out::http_route::distribution::FirstAvailable {
                backends: vec![route_backend(name)],
            },
        )),
    }
}

pub fn prefix(p: &str) -> hr::HttpRouteMatch {
    hr::HttpRouteMatch {
        path: Some(hr::PathMatch {
            kind: Some(hr::path_match::Kind::Prefix(p.into())),
        }),
        ..Default::default()
    }
}

pub fn exact(p: &str) -> hr::HttpRouteMatch {
    hr::HttpRouteMatch {
        path: Some(hr::PathMatch {
            kind: Some(hr::path_match::Kind::Exact(p.into())),
        }),
        ..Default::default()
    }
}

pub fn with_header(mut m: hr::HttpRouteMatch, name: &str, value: &str) -> hr::HttpRouteMatch {
    m.headers.push(hr::HeaderMatch {
        name: name.into(),
        value: Some(hr::header_match::Value::Exact(value.as_bytes().to_vec())),
    });
    m
}

/// A rule taking `matches` to `backends`.
pub fn rule(
    matches: Vec<hr::HttpRouteMatch>,
    backends: out::http_route::Distribution,
) -> out::http_route::Rule {
    out::http_route::Rule {
        matches,
        backends: Some(backends),
        ..Default::default()
    }
}

/// The policy of the Service `parent` with one HTTPRoute `route` of
/// `rules`, for HTTP/1 and HTTP/2 alike, as Linkerd's controller sends it.
pub fn policy(parent: &str, route: &str, rules: Vec<out::http_route::Rule>) -> OutboundPolicy {
    let route = out::HttpRoute {
        metadata: Some(meta::Metadata {
            kind: Some(meta::metadata::Kind::Resource(meta::Resource {
                group: "gateway.networking.k8s.io".into(),
                kind: "HTTPRoute".into(),
                name: route.into(),
                namespace: NS.into(),
                ..Default::default()
            })),
        }),
        hosts: vec![],
        rules,
    };
    OutboundPolicy {
        metadata: service_meta(parent),
        protocol: Some(out::ProxyProtocol {
            kind: Some(out::proxy_protocol::Kind::Detect(
                out::proxy_protocol::Detect {
                    timeout: dur(Duration::from_secs(10)),
                    opaque: Some(out::proxy_protocol::Opaque { routes: vec![] }),
                    http1: Some(out::proxy_protocol::Http1 {
                        routes: vec![route.clone()],
                        failure_accrual: None,
                    }),
                    http2: Some(out::proxy_protocol::Http2 {
                        routes: vec![route],
                        failure_accrual: None,
                    }),
                },
            )),
        }),
    }
}

/// Path-driven answers: `/slow` waits 5 s; `/trickle` sends its body's
/// second chunk 5 s after its first; `/status/N` answers N;
/// `/flaky/K/ID` answers 503 to the first K requests of that ID, then 200;
/// `/fail-on/NAME` answers 500 from the backend NAME, 200 from others.
/// Every answer names the backend (`x-backend`) and echoes `x-added`.
pub struct TestBackend {
    pub addr: SocketAddr,
    pub name: String,
    requests: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl TestBackend {
    pub async fn start(name: &str, ip: &str) -> TestBackend {
        let listener = TcpListener::bind(format!("{ip}:0")).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicU64::new(0));
        let flaky: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
        let (n, name_) = (requests.clone(), name.to_string());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (n, name, flaky) = (n.clone(), name_.clone(), flaky.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let (n, name, flaky) = (n.clone(), name.clone(), flaky.clone());
                        async move {
                            n.fetch_add(1, Ordering::Relaxed);
                            let path = req.uri().path().to_string();
                            let added = req.headers().get("x-added").cloned();
                            // Read the whole body, as a server would.
                            let body = req
                                .into_body()
                                .collect()
                                .await
                                .map(|b| b.to_bytes().len())
                                .unwrap_or(0);
                            let status = if path.strip_prefix("/fail-on/") == Some(name.as_str()) {
                                StatusCode::INTERNAL_SERVER_ERROR
                            } else {
                                answer(&path, &flaky).await
                            };
                            let text = Bytes::from(format!("{name} read {body}\n"));
                            let body = if path.starts_with("/trickle") {
                                trickle(text)
                            } else {
                                Full::new(text).boxed()
                            };
                            let mut rsp = Response::new(body);
                            *rsp.status_mut() = status;
                            rsp.headers_mut().insert("x-backend", name.parse().unwrap());
                            if let Some(v) = added {
                                rsp.headers_mut().insert("x-seen-added", v);
                            }
                            Ok::<_, std::convert::Infallible>(rsp)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        TestBackend {
            addr,
            name: name.to_string(),
            requests,
            task,
        }
    }

    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}

type AnyBody = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

/// A body whose first chunk comes at once and whose second 5 s later.
fn trickle(first: Bytes) -> AnyBody {
    let chunks = futures_util::stream::unfold(0, move |n| {
        let first = first.clone();
        async move {
            match n {
                0 => Some((Ok(hyper::body::Frame::data(first)), 1)),
                1 => {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    Some((
                        Ok(hyper::body::Frame::data(Bytes::from_static(b"late\n"))),
                        2,
                    ))
                }
                _ => None,
            }
        }
    });
    http_body_util::StreamBody::new(chunks).boxed()
}

async fn answer(path: &str, flaky: &Mutex<HashMap<String, u64>>) -> StatusCode {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        ["slow", ..] => {
            tokio::time::sleep(Duration::from_secs(5)).await;
            StatusCode::OK
        }
        ["status", code, ..] => code
            .parse::<u16>()
            .ok()
            .and_then(|c| StatusCode::from_u16(c).ok())
            .unwrap_or(StatusCode::BAD_REQUEST),
        ["flaky", k, id, ..] => {
            let k: u64 = k.parse().unwrap_or(0);
            let mut seen = flaky.lock().unwrap();
            let n = seen.entry(id.to_string()).or_insert(0);
            *n += 1;
            if *n <= k {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::OK
            }
        }
        _ => StatusCode::OK,
    }
}

impl Drop for TestBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The policy of an opaque Service port whose one route goes to `backend`.
pub fn opaque_policy(parent: &str, backend_name: &str) -> OutboundPolicy {
    let route = out::OpaqueRoute {
        metadata: None,
        rules: vec![out::opaque_route::Rule {
            backends: Some(out::opaque_route::Distribution {
                kind: Some(out::opaque_route::distribution::Kind::FirstAvailable(
                    out::opaque_route::distribution::FirstAvailable {
                        backends: vec![out::opaque_route::RouteBackend {
                            backend: Some(backend(backend_name)),
                            filters: vec![],
                        }],
                    },
                )),
            }),
            filters: vec![],
        }],
    };
    OutboundPolicy {
        metadata: service_meta(parent),
        protocol: Some(out::ProxyProtocol {
            kind: Some(out::proxy_protocol::Kind::Opaque(
                out::proxy_protocol::Opaque {
                    routes: vec![route],
                },
            )),
        }),
    }
}
