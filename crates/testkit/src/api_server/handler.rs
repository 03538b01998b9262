//! One request: record it, apply test faults, route it, answer it.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use http::{Method, Request, Response};
use hyper::body::Incoming;
use serde_json::{json, Value};

use super::patch::{self, PatchType};
use super::resources::{self, Route, RESOURCES};
use super::selector::{bounded, Filter};
use super::service_proxy;
use super::status::{self, failure, json_response, Body};
use super::store::{Key, ReadError};
use super::write::{self, ApiError, DeleteOptions, Part};
use super::{lock, watch, RequestRecord, Shared};

const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";

/// Reviews a token as the API server's authenticator does for bound
/// service-account tokens.
async fn token_review(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    use http_body_util::BodyExt;
    let limited = http_body_util::Limited::new(req.into_body(), 64 * 1024);
    let body = match limited.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return failure(400, &format!("cannot read the body: {e}")),
    };
    let review: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return failure(400, &format!("not a TokenReview: {e}")),
    };
    let token = review["spec"]["token"].as_str().unwrap_or("");
    let wanted: Vec<String> = review["spec"]["audiences"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let known = lock(&shared.tokens).get(token).cloned();
    let status = match known {
        None => json!({"authenticated": false, "error": "invalid bearer token"}),
        Some((username, audiences)) => {
            let ok = wanted.is_empty() || wanted.iter().any(|w| audiences.contains(w));
            if ok {
                json!({"authenticated": true, "user": {"username": username}, "audiences": audiences})
            } else {
                json!({
                    "authenticated": false,
                    "error": format!("[invalid bearer token, token audiences {audiences:?} is invalid for the target audiences {wanted:?}]")
                })
            }
        }
    };
    json_response(
        201,
        &json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "metadata": {"creationTimestamp": null},
            "spec": review["spec"],
            "status": status,
        }),
    )
}

/// The query parameters the list and watch verbs read.
#[derive(Debug, Default)]
pub(crate) struct Query {
    pub watch: bool,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<String>,
    pub limit: usize,
    pub continue_token: Option<String>,
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    pub timeout_seconds: Option<u64>,
    pub allow_watch_bookmarks: bool,
    pub send_initial_events: Option<bool>,
}

/// Go's `strconv.ParseBool`, which the API server uses for flags.
fn parse_bool(key: &str, v: &str) -> Result<bool, String> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(format!("{key}: invalid boolean {:?}", bounded(v))),
    }
}

impl Query {
    pub fn parse(raw: &str) -> Result<Query, String> {
        let mut q = Query::default();
        for (k, v) in form_urlencoded::parse(raw.as_bytes()) {
            let non_empty = |v: &str| (!v.is_empty()).then(|| v.to_string());
            match &*k {
                "watch" => q.watch = parse_bool("watch", &v)?,
                "resourceVersion" => q.resource_version = non_empty(&v),
                "resourceVersionMatch" => q.resource_version_match = non_empty(&v),
                "continue" => q.continue_token = non_empty(&v),
                "labelSelector" => q.label_selector = non_empty(&v),
                "fieldSelector" => q.field_selector = non_empty(&v),
                "allowWatchBookmarks" => {
                    q.allow_watch_bookmarks = parse_bool("allowWatchBookmarks", &v)?
                }
                "sendInitialEvents" => {
                    q.send_initial_events = Some(parse_bool("sendInitialEvents", &v)?)
                }
                "limit" => {
                    let n: i64 = v
                        .parse()
                        .map_err(|_| format!("limit: invalid integer {:?}", bounded(&v)))?;
                    q.limit = usize::try_from(n.max(0)).unwrap_or(usize::MAX);
                }
                "timeoutSeconds" => {
                    let n: i64 = v.parse().map_err(|_| {
                        format!("timeoutSeconds: invalid integer {:?}", bounded(&v))
                    })?;
                    q.timeout_seconds = (n > 0).then_some(n as u64);
                }
                // Unknown parameters are ignored, as the API server ignores most.
                _ => {}
            }
        }
        Ok(q)
    }
}

/// A resourceVersion parameter as a revision; the error is a 400 message.
pub(crate) fn parse_rv(v: &str) -> Result<u64, String> {
    v.parse()
        .map_err(|_| format!("invalid resource version: {:?}", bounded(v)))
}

fn verb(method: &Method, route: &Route, watch: bool) -> &'static str {
    match (method, route) {
        (&Method::GET, Route::Collection { .. } | Route::Object { .. }) if watch => "watch",
        (&Method::GET, Route::Collection { .. }) => "list",
        (&Method::GET | &Method::HEAD, _) => "get",
        (&Method::POST, _) => "create",
        (&Method::PUT, _) => "update",
        (&Method::PATCH, _) => "patch",
        (&Method::DELETE, Route::Collection { .. }) => "deletecollection",
        (&Method::DELETE, _) => "delete",
        _ => "other",
    }
}

pub(crate) async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_string();
    let raw_query = req.uri().query().unwrap_or("").to_string();
    let route = resources::route(&path);
    let query = Query::parse(&raw_query);
    let watch_flag = query.as_ref().is_ok_and(|q| q.watch);
    let (namespace, name) = match &route {
        Route::Collection { namespace, .. } => (namespace.clone(), None),
        Route::Object {
            namespace, name, ..
        }
        | Route::Status {
            namespace, name, ..
        } => (
            (!namespace.is_empty()).then(|| namespace.clone()),
            Some(name.clone()),
        ),
        _ => (None, None),
    };
    lock(&shared.requests).push(RequestRecord {
        method: req.method().to_string(),
        verb: verb(req.method(), &route, watch_flag).to_string(),
        resource: route.resource().map(|r| RESOURCES[r].plural.to_string()),
        namespace,
        name,
        path: path.clone(),
        query: raw_query,
        at: Instant::now(),
    });
    shared.notify();

    let mut stall = shared.stall.subscribe();
    let _ = stall.wait_for(|on| !*on).await;
    let fault = *lock(&shared.fault);
    if let Some((code, retry_after)) = fault {
        return Ok(status::fault(code, retry_after));
    }
    if let Some(target) = service_proxy::parse(&path) {
        return Ok(match target {
            Ok(target) => service_proxy::forward(&shared, target, req).await,
            Err(e) => failure(400, &e),
        });
    }
    if req.method() == Method::POST && path == TOKEN_REVIEWS {
        return Ok(token_review(&shared, req).await);
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return Ok(write_request(&shared, route, req).await);
    }
    let query = match query {
        Ok(q) => q,
        Err(e) => return Ok(failure(400, &e)),
    };
    Ok(match route {
        Route::NotFound => failure(404, "the server could not find the requested resource"),
        Route::Version => json_response(200, &version()),
        Route::Health => {
            let mut res = Response::new(status::full("ok"));
            res.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/plain"),
            );
            res
        }
        Route::CoreVersions => json_response(
            200,
            &json!({
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]
            }),
        ),
        Route::Groups => json_response(200, &groups()),
        Route::Group(group) => json_response(200, &group_doc(group)),
        Route::Resources { group, version } => json_response(200, &resource_list(group, version)),
        Route::Collection {
            resource,
            namespace,
        } => {
            let filter = match Filter::parse(
                query.label_selector.as_deref(),
                query.field_selector.as_deref(),
                RESOURCES[resource].field_labels,
            ) {
                Ok(f) => f,
                Err(e) => return Ok(failure(400, &e)),
            };
            if query.watch {
                watch::start(&shared, resource, namespace, filter, &query)
            } else {
                list(&shared, resource, namespace.as_deref(), &filter, &query)
            }
        }
        Route::Object {
            resource,
            namespace,
            name,
        } => {
            if query.watch {
                // The deprecated single-object watch: a watch with a name selector.
                let filter = match Filter::parse(
                    query.label_selector.as_deref(),
                    None,
                    RESOURCES[resource].field_labels,
                ) {
                    Ok(f) => f.with_name(&name),
                    Err(e) => return Ok(failure(400, &e)),
                };
                return Ok(watch::start(
                    &shared,
                    resource,
                    Some(namespace),
                    filter,
                    &query,
                ));
            }
            get(&shared, resource, namespace, name)
        }
        Route::Status {
            resource,
            namespace,
            name,
        } => get(&shared, resource, namespace, name),
    })
}

/// The most bytes of a request body read, as the real API server's 3 MiB limit.
pub const MAX_BODY: usize = 3 * 1024 * 1024;

/// The body, or the refusal's code and message.
async fn read_body(req: Request<Incoming>) -> Result<bytes::Bytes, (u16, String)> {
    use http_body_util::BodyExt;
    match http_body_util::Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
    {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err((
            413,
            format!("the request body is larger than {MAX_BODY} bytes"),
        )),
        Err(e) => Err((400, format!("cannot read the body: {e}"))),
    }
}

/// The body as JSON; the error is a 400's message.
fn parse_json(body: &[u8]) -> Result<Value, String> {
    serde_json::from_slice(body)
        .map_err(|e| format!("the body is not a JSON object: {}", bounded(&e.to_string())))
}

/// A refused write as a `Status` with `details` naming the object.
fn refused(resource: usize, name: &str, e: &ApiError) -> Response<Body> {
    let rt = &RESOURCES[resource];
    let mut body = e.to_status();
    body["details"] = json!({"name": bounded(name), "kind": rt.plural});
    if !rt.group.is_empty() {
        body["details"]["group"] = json!(rt.group);
    }
    json_response(e.code, &body)
}

/// The delete options of the query and of a `DeleteOptions` body (the body wins),
/// and whether the body asks for a dry run (`dryRun: ["All"]`).
fn delete_options(raw_query: &str, body: &[u8]) -> Result<(DeleteOptions, bool), String> {
    let mut opts = DeleteOptions::default();
    let mut dry_run = false;
    for (k, v) in form_urlencoded::parse(raw_query.as_bytes()) {
        match &*k {
            "gracePeriodSeconds" => {
                opts.grace_period_seconds = Some(v.parse().map_err(|_| {
                    format!("gracePeriodSeconds: invalid integer {:?}", bounded(&v))
                })?)
            }
            "propagationPolicy" => opts.propagation_policy = Some(v.into_owned()),
            _ => {}
        }
    }
    if !body.iter().all(u8::is_ascii_whitespace) {
        let v: Value = serde_json::from_slice(body)
            .map_err(|e| format!("the body is not DeleteOptions: {e}"))?;
        if let Some(g) = v.get("gracePeriodSeconds").filter(|g| !g.is_null()) {
            opts.grace_period_seconds =
                Some(g.as_i64().ok_or("gracePeriodSeconds: not an integer")?);
        }
        if let Some(p) = v.get("propagationPolicy").and_then(Value::as_str) {
            opts.propagation_policy = Some(p.to_string());
        }
        dry_run = v
            .get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|d| d.iter().any(|x| x == "All"));
    }
    if let Some(p) = &opts.propagation_policy {
        if !matches!(p.as_str(), "Background" | "Foreground" | "Orphan") {
            return Err(format!(
                "propagationPolicy: unsupported value {:?}: supported values: \"Orphan\", \"Background\", \"Foreground\"",
                bounded(p)
            ));
        }
    }
    Ok((opts, dry_run))
}

/// POST, PUT, PATCH and DELETE on resources.
async fn write_request(
    shared: &Arc<Shared>,
    route: Route,
    req: Request<Incoming>,
) -> Response<Body> {
    let method = req.method().clone();
    let raw_query = req.uri().query().unwrap_or("").to_string();
    let content_type = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = match read_body(req).await {
        Ok(b) => b,
        Err((code, message)) => return failure(code, &message),
    };
    let mut dry_run = false;
    for (k, v) in form_urlencoded::parse(raw_query.as_bytes()) {
        match (&*k, &*v) {
            ("dryRun", "All") => dry_run = true,
            ("dryRun", "") => {}
            ("dryRun", other) => {
                return failure(
                    400,
                    &format!(
                        "dryRun: unsupported value {:?}: supported values: \"All\"",
                        bounded(other)
                    ),
                )
            }
            _ => {}
        }
    }
    let ok = |code: u16, v: &Value| json_response(code, v);
    match (method, route) {
        (_, Route::NotFound) => failure(404, "the server could not find the requested resource"),
        (
            Method::POST,
            Route::Collection {
                resource,
                namespace,
            },
        ) => {
            let obj = match parse_json(&body) {
                Ok(v) => v,
                Err(e) => return failure(400, &e),
            };
            let name = obj
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            match write::create(shared, resource, namespace.as_deref(), obj, dry_run).await {
                Ok(v) => ok(201, &v),
                Err(e) => refused(resource, &name, &e),
            }
        }
        (Method::PUT, route @ (Route::Object { .. } | Route::Status { .. })) => {
            let part = if matches!(route, Route::Status { .. }) {
                Part::Status
            } else {
                Part::Object
            };
            let (Route::Object {
                resource,
                namespace,
                name,
            }
            | Route::Status {
                resource,
                namespace,
                name,
            }) = route
            else {
                return failure(404, "the server could not find the requested resource");
            };
            let obj = match parse_json(&body) {
                Ok(v) => v,
                Err(e) => return failure(400, &e),
            };
            let ns = RESOURCES[resource].namespaced.then_some(namespace.as_str());
            match write::update(shared, resource, ns, Some(&name), obj, part, dry_run).await {
                Ok(v) => ok(200, &v),
                Err(e) => refused(resource, &name, &e),
            }
        }
        (Method::PATCH, route @ (Route::Object { .. } | Route::Status { .. })) => {
            let part = if matches!(route, Route::Status { .. }) {
                Part::Status
            } else {
                Part::Object
            };
            let (Route::Object {
                resource,
                namespace,
                name,
            }
            | Route::Status {
                resource,
                namespace,
                name,
            }) = route
            else {
                return failure(404, "the server could not find the requested resource");
            };
            let Some(kind) = PatchType::from_content_type(&content_type) else {
                return failure(
                    415,
                    &format!(
                        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {:?})",
                        bounded(&content_type)
                    ),
                );
            };
            let patch = match patch::parse_body(kind, &body) {
                Ok(p) => p,
                Err(e) => return failure(400, &e),
            };
            match write::patch(
                shared,
                resource,
                &(namespace, name.clone()),
                kind,
                &patch,
                part,
                dry_run,
            )
            .await
            {
                Ok((v, created)) => ok(if created { 201 } else { 200 }, &v),
                Err(e) => refused(resource, &name, &e),
            }
        }
        (
            Method::DELETE,
            Route::Object {
                resource,
                namespace,
                name,
            },
        ) => {
            let (opts, body_dry_run) = match delete_options(&raw_query, &body) {
                Ok(o) => o,
                Err(e) => return failure(400, &e),
            };
            let dry_run = dry_run || body_dry_run;
            match write::delete(shared, resource, &namespace, &name, &opts, dry_run) {
                Ok(v) => ok(200, &v),
                Err(e) => refused(resource, &name, &e),
            }
        }
        (
            Method::DELETE,
            Route::Collection {
                resource,
                namespace,
            },
        ) => delete_collection(
            shared,
            resource,
            namespace.as_deref(),
            &raw_query,
            &body,
            dry_run,
        ),
        _ => failure(
            405,
            "the server does not allow this method on the requested resource",
        ),
    }
}

/// DELETE on a collection: deletes each selected object as a DELETE of it would.
fn delete_collection(
    shared: &Arc<Shared>,
    resource: usize,
    namespace: Option<&str>,
    raw_query: &str,
    body: &[u8],
    dry_run: bool,
) -> Response<Body> {
    let (query, (opts, body_dry_run)) =
        match (Query::parse(raw_query), delete_options(raw_query, body)) {
            (Ok(q), Ok(o)) => (q, o),
            (Err(e), _) | (_, Err(e)) => return failure(400, &e),
        };
    let filter = match Filter::parse(
        query.label_selector.as_deref(),
        query.field_selector.as_deref(),
        RESOURCES[resource].field_labels,
    ) {
        Ok(f) => f,
        Err(e) => return failure(400, &e),
    };
    let keys: Vec<(String, String)> = {
        let store = lock(&shared.store);
        store
            .page(resource, store.rv(), namespace, None, 0, |o| {
                filter.matches(o)
            })
            .map(|p| {
                p.items
                    .iter()
                    .map(|o| {
                        let m = |k: &str| {
                            o.pointer(&format!("/metadata/{k}"))
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .to_string()
                        };
                        (m("namespace"), m("name"))
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut items = Vec::new();
    for (ns, name) in keys {
        if let Ok(v) = write::delete(shared, resource, &ns, &name, &opts, dry_run || body_dry_run) {
            items.push(v);
        }
    }
    let rt = &RESOURCES[resource];
    json_response(
        200,
        &json!({
            "kind": rt.list_kind(),
            "apiVersion": rt.api_version(),
            "metadata": {"resourceVersion": lock(&shared.store).rv().to_string()},
            "items": items,
        }),
    )
}

fn get(shared: &Shared, resource: usize, namespace: String, name: String) -> Response<Body> {
    let rt = &RESOURCES[resource];
    let found = lock(&shared.store).get(resource, &(namespace, name.clone()));
    match found {
        Some(obj) => json_response(200, &obj),
        None => {
            let mut body = status::status(
                404,
                "NotFound",
                &format!("{} {:?} not found", rt.plural, bounded(&name)),
            );
            body["details"] = json!({"name": bounded(&name), "kind": rt.plural});
            if !rt.group.is_empty() {
                body["details"]["group"] = json!(rt.group);
            }
            json_response(404, &body)
        }
    }
}

/// A continue token: opaque to clients (hex of `[rv, namespace, name]`).
fn encode_continue(rv: u64, key: &Key) -> String {
    let json = json!([rv, key.0, key.1]).to_string();
    json.bytes().map(|b| format!("{b:02x}")).collect()
}

fn decode_continue(token: &str) -> Option<(u64, Key)> {
    if !token.len().is_multiple_of(2) || !token.is_ascii() {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&token[i..i + 2], 16).ok())
        .collect();
    let (rv, ns, name): (u64, String, String) = serde_json::from_slice(&bytes?).ok()?;
    Some((rv, (ns, name)))
}

fn list(
    shared: &Shared,
    resource: usize,
    namespace: Option<&str>,
    filter: &Filter,
    q: &Query,
) -> Response<Body> {
    let rt = &RESOURCES[resource];
    let store = lock(&shared.store);
    let current = store.rv();
    let (at, after) = if let Some(token) = &q.continue_token {
        if q.resource_version.is_some() {
            return failure(
                400,
                "specifying resource version is not allowed when using continue",
            );
        }
        match decode_continue(token) {
            Some((rv, key)) => (rv, Some(key)),
            None => {
                return failure(
                    400,
                    "continue key is not valid: not a token this server issued",
                )
            }
        }
    } else {
        let rv = q.resource_version.as_deref();
        let rv_match = q.resource_version_match.as_deref();
        let exact = match (rv, rv_match) {
            (None, None) => None,
            (None, Some(_)) => {
                return failure(
                    400,
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                )
            }
            (Some("0"), Some("Exact")) => {
                return failure(
                    400,
                    "resourceVersionMatch \"Exact\" is forbidden for resourceVersion \"0\"",
                )
            }
            (Some("0"), None | Some("NotOlderThan")) => None,
            (Some(v), m @ (None | Some("NotOlderThan") | Some("Exact"))) => {
                let n = match parse_rv(v) {
                    Ok(n) => n,
                    Err(e) => return failure(400, &e),
                };
                // Unset match with a limit is a legacy exact read; without, not-older-than.
                let is_exact = m == Some("Exact") || (m.is_none() && q.limit > 0);
                if is_exact {
                    Some(n)
                } else if n > current {
                    return status::too_large(n, current);
                } else {
                    None
                }
            }
            (Some(_), Some(m)) => {
                return failure(
                    400,
                    &format!("resourceVersionMatch: unsupported value {:?}", bounded(m)),
                )
            }
        };
        (exact.unwrap_or(current), None)
    };
    let page = match store.page(resource, at, namespace, after.as_ref(), q.limit, |o| {
        filter.matches(o)
    }) {
        Ok(p) => p,
        Err(ReadError::TooLarge { requested, current }) => {
            return status::too_large(requested, current)
        }
        Err(ReadError::Expired { requested, oldest }) => {
            let message = if q.continue_token.is_some() {
                "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.".to_string()
            } else {
                format!("too old resource version: {requested} ({oldest})")
            };
            return json_response(410, &status::status(410, "Expired", &message));
        }
    };
    drop(store);
    let mut metadata = json!({ "resourceVersion": at.to_string() });
    if let Some(next) = &page.next {
        metadata["continue"] = json!(encode_continue(at, next));
        if filter.is_empty() {
            metadata["remainingItemCount"] = json!(page.remaining);
        }
    }
    let items: Vec<Value> = page
        .items
        .iter()
        .map(|o| {
            let mut o = (**o).clone();
            if let Some(m) = o.as_object_mut() {
                m.remove("apiVersion");
                m.remove("kind");
            }
            o
        })
        .collect();
    json_response(
        200,
        &json!({
            "kind": rt.list_kind(),
            "apiVersion": rt.api_version(),
            "metadata": metadata,
            "items": items,
        }),
    )
}

fn version() -> Value {
    json!({
        "major": "1",
        "minor": "37",
        "gitVersion": "v1.37.0-ballast-testkit",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.25.0",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

fn group_doc(group: &str) -> Value {
    let version = resources::named_groups()
        .into_iter()
        .find(|(g, _)| *g == group)
        .map_or("v1", |(_, v)| v);
    let gv = json!({"groupVersion": format!("{group}/{version}"), "version": version});
    json!({
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": [gv.clone()],
        "preferredVersion": gv,
    })
}

fn groups() -> Value {
    let groups: Vec<Value> = resources::named_groups()
        .into_iter()
        .map(|(g, _)| {
            let mut doc = group_doc(g);
            if let Some(m) = doc.as_object_mut() {
                m.remove("kind");
                m.remove("apiVersion");
            }
            doc
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn resource_list(group: &str, version: &str) -> Value {
    let mut resources: Vec<Value> = Vec::new();
    for (i, r) in RESOURCES.iter().enumerate() {
        if r.group != group || r.version != version {
            continue;
        }
        resources.push(json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
            "shortNames": r.short_names,
        }));
        if resources::has_status(i) {
            resources.push(json!({
                "name": format!("{}/status", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip_and_junk_is_refused() {
        let key = ("ns\"1".to_string(), "p\n1".to_string());
        let token = encode_continue(42, &key);
        assert_eq!(decode_continue(&token), Some((42, key)));
        for junk in ["", "zz", "abc", "7b7d", "é", "5b312c322c335d"] {
            assert_eq!(decode_continue(junk), None, "{junk}");
        }
    }

    #[test]
    fn queries_parse_like_the_api_server() {
        let q = Query::parse(
            "watch=1&resourceVersion=12&timeoutSeconds=5&allowWatchBookmarks=true&limit=2&x=y",
        )
        .expect("parses");
        assert!(q.watch && q.allow_watch_bookmarks);
        assert_eq!(q.resource_version.as_deref(), Some("12"));
        assert_eq!((q.timeout_seconds, q.limit), (Some(5), 2));
        for bad in [
            "watch=yes",
            "limit=x",
            "timeoutSeconds=1.5",
            "sendInitialEvents=maybe",
        ] {
            assert!(Query::parse(bad).is_err(), "{bad}");
        }
    }
}
