//! Watch streams: newline-delimited JSON events over a chunked response, fed by the
//! broadcast of changes.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Response};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::{json, Value};
use tokio::sync::{broadcast, watch as latest};
use tokio::time::{sleep_until, Instant};

use super::handler::{parse_rv, Query};
use super::resources::RESOURCES;
use super::selector::Filter;
use super::status::{self, failure, Body};
use super::store::{Change, ChangeType, ReadError};
use super::{lock, Shared};

/// How long a watch lasts when the client gives no `timeoutSeconds` (the API
/// server's `--min-request-timeout`).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

/// Where a watch starts.
enum Start {
    /// Synthetic ADDED events for the current objects first; with the
    /// `initial-events-end` bookmark after them when asked by `sendInitialEvents`.
    Initial { end_bookmark: bool },
    /// At the current revision, no initial events.
    Now,
    /// Replaying the retained changes after this revision.
    After(u64),
}

fn json_line(value: &Value) -> Bytes {
    let mut bytes = serde_json::to_vec(value).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

fn bookmark(resource: usize, rv: u64, initial_end: bool) -> Bytes {
    let rt = &RESOURCES[resource];
    let mut metadata = json!({ "resourceVersion": rv.to_string() });
    if initial_end {
        metadata["annotations"] = json!({ "k8s.io/initial-events-end": "true" });
    }
    json_line(&json!({
        "type": "BOOKMARK",
        "object": { "kind": rt.kind, "apiVersion": rt.api_version(), "metadata": metadata },
    }))
}

/// What one watch sends for a change: objects entering or leaving its selection are
/// ADDED or DELETED, as the API server's watch cache reports them.
fn event_line(
    change: &Change,
    resource: usize,
    namespace: Option<&str>,
    filter: &Filter,
) -> Option<Bytes> {
    if change.resource != resource || namespace.is_some_and(|ns| change.key.0 != ns) {
        return None;
    }
    let now = change.kind != ChangeType::Deleted && filter.matches(&change.object);
    let before = change.prev.as_ref().is_some_and(|p| filter.matches(p));
    let kind = match (change.kind, before, now) {
        (ChangeType::Added, _, true) => ChangeType::Added,
        (ChangeType::Modified, true, true) => ChangeType::Modified,
        (ChangeType::Modified, false, true) => ChangeType::Added,
        (ChangeType::Modified | ChangeType::Deleted, true, false) => ChangeType::Deleted,
        _ => return None,
    };
    Some(json_line(
        &json!({ "type": kind.as_str(), "object": &*change.object }),
    ))
}

fn ndjson(body: Body) -> Response<Body> {
    let mut res = Response::new(body);
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

/// Answers a watch request.
pub(crate) fn start(
    shared: &Arc<Shared>,
    resource: usize,
    namespace: Option<String>,
    filter: Filter,
    q: &Query,
) -> Response<Body> {
    let initial_events = q.send_initial_events;
    if initial_events == Some(true) {
        if q.resource_version_match.as_deref() != Some("NotOlderThan") {
            return failure(
                400,
                "sendInitialEvents is forbidden for watch unless resourceVersionMatch is set to NotOlderThan",
            );
        }
        if !q.allow_watch_bookmarks {
            return failure(
                400,
                "sendInitialEvents requires setting allowWatchBookmarks to true",
            );
        }
    } else if q.resource_version_match.is_some() {
        return failure(
            400,
            "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
        );
    }
    let rv = match q.resource_version.as_deref() {
        None | Some("0") => None,
        Some(v) => match parse_rv(v) {
            Ok(n) => Some(n),
            Err(e) => return failure(400, &e),
        },
    };
    let start = match (initial_events, rv) {
        (Some(true), _) => Start::Initial { end_bookmark: true },
        (Some(false), None) => Start::Now,
        (None, None) => Start::Initial {
            end_bookmark: false,
        },
        (_, Some(n)) => Start::After(n),
    };

    let mut pending = VecDeque::new();
    let store = lock(&shared.store);
    let current = store.rv();
    match start {
        Start::Initial { end_bookmark } => {
            if let Some(n) = rv.filter(|n| *n > current) {
                return status::too_large(n, current);
            }
            let page = store.page(resource, current, namespace.as_deref(), None, 0, |o| {
                filter.matches(o)
            });
            for obj in page.map(|p| p.items).unwrap_or_default() {
                pending.push_back(json_line(&json!({ "type": "ADDED", "object": &*obj })));
            }
            if end_bookmark {
                pending.push_back(bookmark(resource, current, true));
            }
        }
        Start::Now => {}
        Start::After(n) => match store.check(n) {
            Err(ReadError::Expired { requested, oldest }) => {
                drop(store);
                let status = status::status(
                    410,
                    "Expired",
                    &format!("too old resource version: {requested} ({oldest})"),
                );
                let line = json_line(&json!({ "type": "ERROR", "object": status }));
                return ndjson(status::full(line));
            }
            Err(ReadError::TooLarge { requested, current }) => {
                return status::too_large(requested, current)
            }
            Ok(()) => {
                for change in store.changes_after(n) {
                    if let Some(line) = event_line(&change, resource, namespace.as_deref(), &filter)
                    {
                        pending.push_back(line);
                    }
                }
            }
        },
    }
    // Subscribed under the store lock: every later change arrives on `rx`, none twice.
    let rx = shared.events.subscribe();
    drop(store);

    let timeout = q
        .timeout_seconds
        .map_or(DEFAULT_TIMEOUT, Duration::from_secs);
    shared.open_watches.fetch_add(1, Ordering::SeqCst);
    shared.notify();
    let stream = WatchStream {
        shared: shared.clone(),
        resource,
        namespace,
        filter,
        pending,
        rx,
        last_rv: current,
        bookmarks: q.allow_watch_bookmarks,
        interval: shared.bookmark_interval.subscribe(),
        last_bookmark: Instant::now(),
        deadline: Instant::now() + timeout,
        cut: shared.cut.subscribe(),
        shutdown: shared.shutdown.subscribe(),
        done: false,
    };
    let frames = futures_util::stream::unfold(stream, |mut s| async move {
        let frame = s.next().await?;
        Some((frame, s))
    });
    ndjson(StreamBody::new(frames).boxed_unsync())
}

/// One open watch. Counted in `open_watches` until dropped (by hyper, when the
/// response ends or the connection goes).
struct WatchStream {
    shared: Arc<Shared>,
    resource: usize,
    namespace: Option<String>,
    filter: Filter,
    pending: VecDeque<Bytes>,
    rx: broadcast::Receiver<Arc<Change>>,
    /// The newest revision this watch has seen (of any type): what a bookmark says.
    last_rv: u64,
    bookmarks: bool,
    interval: latest::Receiver<Duration>,
    last_bookmark: Instant,
    deadline: Instant,
    cut: latest::Receiver<u64>,
    shutdown: latest::Receiver<bool>,
    done: bool,
}

impl WatchStream {
    /// The next chunk; `None` ends the response cleanly, an error aborts it.
    async fn next(&mut self) -> Option<Result<Frame<Bytes>, io::Error>> {
        loop {
            if self.done {
                return None;
            }
            if let Some(line) = self.pending.pop_front() {
                return Some(Ok(Frame::data(line)));
            }
            let next_bookmark = self.last_bookmark + *self.interval.borrow();
            tokio::select! {
                biased;
                _ = self.cut.changed() => {
                    self.done = true;
                    return Some(Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "watch cut by the test",
                    )));
                }
                _ = self.shutdown.wait_for(|s| *s) => {
                    self.done = true;
                    return Some(Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "api server stopped",
                    )));
                }
                _ = sleep_until(self.deadline) => {
                    self.done = true;
                }
                received = self.rx.recv() => match received {
                    Ok(change) => {
                        self.last_rv = self.last_rv.max(change.rv);
                        if let Some(line) = event_line(
                            &change,
                            self.resource,
                            self.namespace.as_deref(),
                            &self.filter,
                        ) {
                            super::lock(&self.shared.first_line_out)
                                .get_or_insert_with(std::time::Instant::now);
                            self.pending.push_back(line);
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        // Like the API server closing an unresponsive watcher: the
                        // client re-watches from the last revision it saw.
                        tracing::debug!(missed, "testkit api server: closing a watch that fell behind");
                        self.done = true;
                    }
                    Err(broadcast::error::RecvError::Closed) => self.done = true,
                },
                _ = sleep_until(next_bookmark), if self.bookmarks => {
                    self.pending.push_back(bookmark(self.resource, self.last_rv, false));
                    self.last_bookmark = Instant::now();
                }
                _ = self.interval.changed() => {}
            }
        }
    }
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        self.shared.open_watches.fetch_sub(1, Ordering::SeqCst);
        self.shared.notify();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api_server::resources::by_plural;
    use crate::api_server::store::Store;

    fn pod(name: &str, app: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "ns", "labels": {"app": app}}})
    }

    fn event_type(line: Option<Bytes>) -> Option<String> {
        let v: Value = serde_json::from_slice(&line?).ok()?;
        v["type"].as_str().map(str::to_string)
    }

    #[test]
    fn selection_changes_become_adds_and_deletes() {
        let pods = by_plural("pods").unwrap_or(0);
        let web = Filter::parse(Some("app=web"), None, &[]).expect("selector");
        let mut s = Store::new(10);
        let mut types = Vec::new();
        for obj in [
            pod("a", "web"),
            pod("a", "api"),
            pod("a", "web"),
            pod("a", "web2"),
        ] {
            let (_, change) = s.apply(obj).expect("apply");
            let change = change.expect("a change");
            types.push(event_type(event_line(&change, pods, None, &web)));
        }
        s.apply(pod("a", "web")).expect("apply");
        let deleted = s.delete(pods, &("ns".into(), "a".into())).expect("deleted");
        types.push(event_type(event_line(&deleted, pods, None, &web)));
        types.push(event_type(event_line(&deleted, pods, Some("other"), &web)));
        let services = by_plural("services").unwrap_or(0);
        types.push(event_type(event_line(&deleted, services, None, &web)));
        let want = [
            Some("ADDED"),
            Some("DELETED"),
            Some("ADDED"),
            Some("DELETED"),
            Some("DELETED"),
            None,
            None,
        ];
        assert_eq!(types, want.map(|t| t.map(str::to_string)));
    }
}
