//! The `services/proxy` subresource: `GET /api/v1/namespaces/NS/services/NAME[:PORT]/proxy/PATH`
//! is sent on to the Service (through the dialer the cluster installs, as for
//! webhooks) over plain HTTP/1.1, and its answer streamed back, as `kubectl proxy`
//! and dashboards reach in-cluster HTTP servers. `PORT` is a Service port's number
//! or name (the first port when left out); an `https:` scheme prefix is refused.
//! Only GET and HEAD are forwarded.

use std::sync::Arc;
use std::time::Duration;

use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use super::admission::ServiceRef;
use super::resources;
use super::status::{failure, Body};
use super::{lock, Shared};

/// How long the Service may take to answer with a head.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// A parsed proxy path: the Service, the port as given, and the rest of the path.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Target {
    namespace: String,
    name: String,
    port: Option<String>,
    path: String,
}

/// The target of a `services/.../proxy` path, if `path` is one.
pub(crate) fn parse(path: &str) -> Option<Result<Target, String>> {
    let rest = path.strip_prefix("/api/v1/namespaces/")?;
    let (namespace, rest) = rest.split_once("/services/")?;
    let (service, rest) = rest.split_once("/proxy").unwrap_or((rest, ""));
    if !path.contains("/proxy") || namespace.contains('/') || service.contains('/') {
        return None;
    }
    if !(rest.is_empty() || rest.starts_with('/')) {
        return None;
    }
    let parts: Vec<&str> = service.split(':').collect();
    let (name, port) = match parts.as_slice() {
        [name] => (*name, None),
        [name, port] => (*name, Some(*port)),
        ["http", name, port] => (*name, Some(*port)),
        [scheme, _, _] => {
            return Some(Err(format!(
                "scheme {scheme:?} is not proxied here (plain http only)"
            )))
        }
        _ => return Some(Err(format!("bad service reference {service:?}"))),
    };
    let port = port.filter(|p| !p.is_empty()).map(str::to_string);
    Some(Ok(Target {
        namespace: namespace.to_string(),
        name: name.to_string(),
        port,
        path: if rest.is_empty() {
            "/".into()
        } else {
            rest.into()
        },
    }))
}

/// Forwards `req` to the Service `target` names; failures are `Status` answers
/// (404 no such Service or port, 503 cannot reach it), as the API server's are.
pub(crate) async fn forward(
    shared: &Arc<Shared>,
    target: Target,
    req: Request<Incoming>,
) -> Response<Body> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return failure(405, "only GET and HEAD are proxied");
    }
    let service = resources::by_plural("services").and_then(|r| {
        lock(&shared.store)
            .get(r, &(target.namespace.clone(), target.name.clone()))
            .map(|o| (*o).clone())
    });
    let Some(service) = service else {
        return failure(404, &format!("services \"{}\" not found", target.name));
    };
    let ports = service["spec"]["ports"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let port = ports.iter().find(|p| match &target.port {
        None => true,
        Some(wanted) => {
            p["name"].as_str() == Some(wanted.as_str())
                || p["port"].as_u64().map(|n| n.to_string()).as_deref() == Some(wanted.as_str())
        }
    });
    let Some(port) = port
        .and_then(|p| p["port"].as_u64())
        .and_then(|p| u16::try_from(p).ok())
    else {
        return failure(
            404,
            &format!(
                "no port {:?} on service {}/{}",
                target.port, target.namespace, target.name
            ),
        );
    };
    let Some(dialer) = lock(&shared.dialer).clone() else {
        return failure(503, "no service dialer installed");
    };
    let unavailable = |e: String| {
        failure(
            503,
            &format!(
                "error trying to reach service {}/{}:{port}: {e}",
                target.namespace, target.name
            ),
        )
    };
    let tcp = match dialer(ServiceRef {
        namespace: target.namespace.clone(),
        name: target.name.clone(),
        port,
    })
    .await
    {
        Ok(tcp) => tcp,
        Err(e) => return unavailable(e.to_string()),
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await {
        Ok(pair) => pair,
        Err(e) => return unavailable(e.to_string()),
    };
    tokio::spawn(conn);
    let path_and_query = match req.uri().query() {
        Some(q) => format!("{}?{q}", target.path),
        None => target.path.clone(),
    };
    let mut upstream = Request::builder()
        .method(req.method().clone())
        .uri(path_and_query)
        .header(
            header::HOST,
            format!("{}.{}.svc:{port}", target.name, target.namespace),
        );
    for name in [header::ACCEPT, header::ACCEPT_ENCODING, header::USER_AGENT] {
        if let Some(v) = req.headers().get(&name) {
            upstream = upstream.header(name, v);
        }
    }
    let Ok(upstream) = upstream.body(Empty::<bytes::Bytes>::new()) else {
        return failure(400, "bad path");
    };
    let answer = match tokio::time::timeout(ANSWER_TIMEOUT, sender.send_request(upstream)).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => return unavailable(e.to_string()),
        Err(_) => return unavailable(format!("no answer in {ANSWER_TIMEOUT:?}")),
    };
    let (parts, body) = answer.into_parts();
    let mut res = Response::new(body.map_err(std::io::Error::other).boxed_unsync());
    *res.status_mut() =
        StatusCode::from_u16(parts.status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    for (name, value) in &parts.headers {
        // Hop-by-hop headers stay on their hop.
        if !matches!(
            name.as_str(),
            "connection" | "keep-alive" | "transfer-encoding" | "upgrade" | "te" | "trailer"
        ) {
            res.headers_mut().append(name, value.clone());
        }
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(ns: &str, name: &str, port: Option<&str>, path: &str) -> Target {
        Target {
            namespace: ns.into(),
            name: name.into(),
            port: port.map(String::from),
            path: path.into(),
        }
    }

    #[test]
    fn proxy_paths_name_the_service_port_and_rest() {
        let cases = [
            (
                "/api/v1/namespaces/b/services/viz:8084/proxy/",
                target("b", "viz", Some("8084"), "/"),
            ),
            (
                "/api/v1/namespaces/b/services/viz/proxy",
                target("b", "viz", None, "/"),
            ),
            (
                "/api/v1/namespaces/b/services/http:viz:http/proxy/api/stat",
                target("b", "viz", Some("http"), "/api/stat"),
            ),
        ];
        for (path, want) in cases {
            assert_eq!(parse(path), Some(Ok(want)), "{path}");
        }
        assert!(matches!(
            parse("/api/v1/namespaces/b/services/https:viz:443/proxy/"),
            Some(Err(_))
        ));
        for not_proxy in [
            "/api/v1/namespaces/b/services/viz",
            "/api/v1/namespaces/b/pods/viz/proxy/",
            "/api/v1/namespaces/b/services/viz/proxyx",
        ] {
            assert_eq!(parse(not_proxy), None, "{not_proxy}");
        }
    }
}
