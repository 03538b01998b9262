//! A Kubernetes API server emulation serving the real list/watch protocol over HTTP/1.1.
//!
//! See [`ApiServer`].

mod admission;
mod handler;
mod patch;
mod resources;
mod selector;
mod service_proxy;
mod status;
mod store;
mod watch;
mod write;

pub use admission::{AdmissionCall, AdmissionOutcome, ServiceDialer, ServiceRef, MAX_ANSWER};
pub use handler::MAX_BODY;
pub(crate) use selector::label_selector_matches;
pub use write::{ApiError, DeleteOptions, MAX_OBJECTS};

/// Does the emulation serve this resource type (`group` `""` is core)?
/// A client's watch of a type it does not serve gets 404.
pub fn serves(group: &str, plural: &str) -> bool {
    resources::RESOURCES
        .iter()
        .any(|r| r.group == group && r.plural == plural)
}

/// Every served resource plural, with whether it is namespaced: what the garbage
/// collector and the namespace controller walk.
/// A plural two groups share is walked once, as the first (Gateway API's
/// `httproutes`; Linkerd's are not collected).
pub(crate) fn served_plurals() -> Vec<(&'static str, bool)> {
    let mut plurals: Vec<(&'static str, bool)> = Vec::new();
    for r in resources::RESOURCES {
        if !plurals.iter().any(|(p, _)| *p == r.plural) {
            plurals.push((r.plural, r.namespaced));
        }
    }
    plurals
}

/// The plural and scope (namespaced?) of the type with this `apiVersion` and `kind`.
pub(crate) fn plural_of_kind(api_version: &str, kind: &str) -> Option<(&'static str, bool)> {
    resources::by_kind(api_version, kind).map(|r| {
        let rt = &resources::RESOURCES[r];
        (rt.plural, rt.namespaced)
    })
}

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, watch as latest};
use tokio::task::JoinHandle;

use store::{Change, Store};

/// Settings fixed when an [`ApiServer`] starts (the first two can be changed later).
#[derive(Debug, Clone)]
pub struct Settings {
    /// How many changes are retained for watches to resume from and for list pages to
    /// be read at (default 1000). Older resourceVersions are answered 410 Gone.
    pub history_limit: usize,
    /// How often a watch that asked for bookmarks gets one (default 1s).
    pub bookmark_interval: Duration,
    /// How many changes one watch may fall behind before it is closed, as the real
    /// API server closes unresponsive watchers (default 1024).
    pub watch_buffer: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            history_limit: 1000,
            bookmark_interval: Duration::from_secs(1),
            watch_buffer: 1024,
        }
    }
}

/// One request the server received, recorded before it was answered (faulted and
/// stalled requests included).
#[derive(Debug, Clone)]
pub struct RequestRecord {
    /// HTTP method, e.g. `GET`.
    pub method: String,
    /// Kubernetes verb: `list`, `watch`, `get`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`; `get` also for non-resource paths such as `/version`.
    pub verb: String,
    /// Resource plural (`pods`), when the path names a served resource.
    pub resource: Option<String>,
    /// Namespace from the path; `None` for all-namespaces requests.
    pub namespace: Option<String>,
    /// Object name from the path, for single-object requests.
    pub name: Option<String>,
    /// Request path without the query.
    pub path: String,
    /// The raw query string (empty when none).
    pub query: String,
    /// When the request arrived.
    pub at: Instant,
}

impl RequestRecord {
    /// The decoded value of one query parameter, e.g. `param("resourceVersion")`.
    pub fn param(&self, key: &str) -> Option<String> {
        form_urlencoded::parse(self.query.as_bytes())
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.into_owned())
    }
}

/// State shared by the handle, the accept loop, connections and watch streams.
pub(crate) struct Shared {
    pub store: Mutex<Store>,
    pub events: broadcast::Sender<Arc<Change>>,
    pub requests: Mutex<Vec<RequestRecord>>,
    pub fault: Mutex<Option<(u16, Option<u64>)>>,
    pub refuse: latest::Sender<bool>,
    pub stall: latest::Sender<bool>,
    pub cut: latest::Sender<u64>,
    pub shutdown: latest::Sender<bool>,
    pub bookmark_interval: latest::Sender<Duration>,
    /// Bumped on every observable change, for [`ApiServer::wait_until`].
    pub changes: latest::Sender<u64>,
    /// The revision of the last stored change, for [`ApiServer::changes`].
    pub revision: latest::Sender<u64>,
    pub open_watches: AtomicUsize,
    /// Tokens `POST .../tokenreviews` authenticates: token to (username, audiences).
    pub tokens: Mutex<std::collections::HashMap<String, (String, Vec<String>)>>,
    /// Every admission webhook call, for [`ApiServer::admission_calls`].
    pub admission_calls: Mutex<Vec<AdmissionCall>>,
    /// How webhooks named by Service are reached; none: such calls fail to connect.
    pub dialer: Mutex<Option<ServiceDialer>>,
    /// When a watch first handed an event line to its connection since
    /// [`ApiServer::mark_watch_lines`]; `None` until one did.
    pub first_line_out: Mutex<Option<Instant>>,
}

impl Shared {
    /// Sends a change to watches and to [`ApiServer::changes`]; called under the store
    /// lock, so watches see changes in revision order.
    pub fn publish(&self, change: Arc<Change>) {
        self.revision.send_replace(change.rv);
        let _ = self.events.send(change);
    }

    pub fn notify(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A Kubernetes API server emulation on `127.0.0.1`, for the real kube client.
///
/// It serves `pods` and `services` (core `v1`), `endpointslices`
/// (`discovery.k8s.io/v1`), the policy resources the destination controller watches,
/// what `ballast check` reads: `namespaces`, `nodes`, `configmaps`, `secrets`,
/// `serviceaccounts` (core `v1`), `deployments` (`apps/v1`), `clusterroles` and
/// `clusterrolebindings` (`rbac.authorization.k8s.io/v1`) and
/// `customresourcedefinitions` (`apiextensions.k8s.io/v1`); and what a cluster runs:
/// `replicasets` (`apps/v1`), `mutatingwebhookconfigurations` and
/// `validatingwebhookconfigurations` (`admissionregistration.k8s.io/v1`),
/// `poddisruptionbudgets` (`policy/v1`), `roles` and `rolebindings`, `events` (core).
/// Namespaced types are served in one namespace and across namespaces; cluster-scoped
/// ones (Namespace, Node, the cluster RBAC types, CRDs, webhook configurations) at
/// `/{plural}[/{name}]`, and are stored without a namespace:
///
/// - **LIST** with `limit`/`continue` (pages are consistent reads at the first page's
///   resourceVersion; a token older than the retained history is 410 Expired),
///   `resourceVersion` with `resourceVersionMatch` (`NotOlderThan`, `Exact`, or unset;
///   `0` and unset read the latest state), `labelSelector` and `fieldSelector`.
///   Items omit `apiVersion`/`kind`, as the real API's do.
/// - **WATCH** (`watch=true`): newline-delimited JSON events over a chunked response,
///   replaying retained changes after `resourceVersion`; a compacted resourceVersion
///   gets one `ERROR` event with a 410 `Status`, then the stream ends; no or `0`
///   resourceVersion (or `sendInitialEvents=true`) starts with synthetic `ADDED`
///   events for the current objects; `allowWatchBookmarks=true` gets `BOOKMARK`
///   events every [`Settings::bookmark_interval`] (and the `k8s.io/initial-events-end`
///   bookmark after initial events when `sendInitialEvents=true`); `timeoutSeconds`
///   ends the stream cleanly.
/// - **GET** of one object, `/version`, `/api`, `/apis`, `/api/v1`,
///   `/apis/discovery.k8s.io[/v1]`, `/healthz`.
/// - **TokenReview** (`POST /apis/authentication.k8s.io/v1/tokenreviews`): tokens
///   added with [`ApiServer::add_token`] authenticate as their user when the review
///   asks for one of their audiences (or none); otherwise the answer carries the
///   API server's `token audiences ... is invalid` error. Unknown tokens are not
///   authenticated.
/// - **Service proxy** (`GET /api/v1/namespaces/NS/services/NAME[:PORT]/proxy/PATH`):
///   sent on to the Service over plain HTTP through the dialer the cluster installs
///   ([`ApiServer::set_service_dialer`]), the answer streamed back.
///
/// - **Writes** as the API server makes them: POST (create; 409 `AlreadyExists`), PUT
///   (replace; a `metadata.resourceVersion` other than the stored one is 409
///   `Conflict`), PATCH (`application/merge-patch+json`, `json-patch+json`,
///   `strategic-merge-patch+json` as a merge patch, `apply-patch+yaml` as
///   create-or-merge), DELETE (`gracePeriodSeconds`, `propagationPolicy`, query or
///   `DeleteOptions` body) and DELETE of a collection; `dryRun=All` (query, or a
///   `DeleteOptions` body's `dryRun`) checks, admits and answers without storing; `.../NAME/status` reads and
///   writes only the status of the types that have one, and writes of the object keep
///   its stored status. Bodies are read up to [`MAX_BODY`] (413 beyond). Every refusal
///   is a `Status`. Creates and updates go through admission (see [`ApiServer::create`]).
///   Deleting a scheduled Pod with a grace period marks it (`deletionTimestamp`) for
///   its kubelet, which removes it with [`ApiServer::delete_now`]; deleting a Namespace
///   turns it Terminating for the namespace controller
///   ([`crate::cluster::controllers`]).
///
/// [`ApiServer::apply`] and [`ApiServer::delete`] write as etcd would, without
/// admission or defaulting, for tests that plant objects exactly. All types share one
/// resourceVersion counter, as etcd's revision is shared. Every request is recorded
/// before it is answered.
///
/// Dropping the server stops it and abruptly closes every connection and stream.
pub struct ApiServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl ApiServer {
    /// Starts a server with default [`Settings`] on `127.0.0.1`, on a port the OS picks.
    ///
    /// # Panics
    /// If no loopback port can be bound.
    pub async fn start() -> ApiServer {
        ApiServer::start_with(Settings::default()).await
    }

    /// Starts a server with these settings.
    ///
    /// # Panics
    /// If no loopback port can be bound.
    pub async fn start_with(settings: Settings) -> ApiServer {
        let listener = match TcpListener::bind(("127.0.0.1", 0)).await {
            Ok(l) => l,
            Err(e) => panic!("ballast-testkit: cannot bind 127.0.0.1:0: {e}"),
        };
        let addr = match listener.local_addr() {
            Ok(a) => a,
            Err(e) => panic!("ballast-testkit: no local address for the listener: {e}"),
        };
        let (events, _) = broadcast::channel(settings.watch_buffer.max(1));
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::new(settings.history_limit)),
            events,
            requests: Mutex::new(Vec::new()),
            fault: Mutex::new(None),
            refuse: latest::Sender::new(false),
            stall: latest::Sender::new(false),
            cut: latest::Sender::new(0),
            shutdown: latest::Sender::new(false),
            bookmark_interval: latest::Sender::new(settings.bookmark_interval),
            changes: latest::Sender::new(0),
            revision: latest::Sender::new(0),
            open_watches: AtomicUsize::new(0),
            tokens: Mutex::new(std::collections::HashMap::new()),
            admission_calls: Mutex::new(Vec::new()),
            dialer: Mutex::new(None),
            first_line_out: Mutex::new(None),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        ApiServer {
            addr,
            shared,
            accept,
        }
    }

    /// A token that TokenReviews authenticate as `username` for `audiences`.
    pub fn add_token(&self, token: &str, username: &str, audiences: &[&str]) {
        lock(&self.shared.tokens).insert(
            token.to_string(),
            (
                username.to_string(),
                audiences.iter().map(|a| a.to_string()).collect(),
            ),
        );
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Writes `dir/kubeconfig`: one cluster at [`ApiServer::url`], no auth, namespace
    /// `default`; loadable by `kube::config::Kubeconfig::read_from` or `KUBECONFIG`.
    ///
    /// # Panics
    /// If the file cannot be written.
    pub fn write_kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\n\
             kind: Config\n\
             clusters:\n\
             - name: ballast-testkit\n  cluster:\n    server: {url}\n\
             users:\n\
             - name: ballast-testkit\n  user: {{}}\n\
             contexts:\n\
             - name: ballast-testkit\n  context:\n    cluster: ballast-testkit\n    user: ballast-testkit\n    namespace: default\n\
             current-context: ballast-testkit\n",
            url = self.url()
        );
        if let Err(e) = std::fs::write(&path, text) {
            panic!("ballast-testkit: cannot write {}: {e}", path.display());
        }
        path
    }

    /// Creates or replaces an object, found by `apiVersion`, `kind`,
    /// `metadata.namespace` (default `default`) and `metadata.name`. Sets
    /// `metadata.resourceVersion`, and `uid` and `creationTimestamp` unless given (a
    /// replace keeps the stored ones). Replacing an object with identical content
    /// changes nothing, as on the real API. Returns the stored object.
    ///
    /// # Panics
    /// If the type is not served or the object has no name; see [`ApiServer::try_apply`].
    #[track_caller]
    pub fn apply(&self, obj: Value) -> Value {
        match self.try_apply(obj) {
            Ok(v) => v,
            Err(e) => panic!("ballast-testkit: {e}"),
        }
    }

    /// Forgets when a watch last handed out an event line, so that
    /// [`ApiServer::first_watch_line_since_mark`] tells the next one: a
    /// benchmark's clock for when a change left the API server.
    pub fn mark_watch_lines(&self) {
        *lock(&self.shared.first_line_out) = None;
    }

    /// When a watch first handed an event line to its connection (for hyper to
    /// write) since [`ApiServer::mark_watch_lines`]; `None` if none has.
    pub fn first_watch_line_since_mark(&self) -> Option<Instant> {
        *lock(&self.shared.first_line_out)
    }

    /// [`ApiServer::apply`], with the reason as an error instead of a panic.
    pub fn try_apply(&self, obj: Value) -> Result<Value, String> {
        let stored = {
            let mut store = lock(&self.shared.store);
            let (stored, change) = store.apply(obj)?;
            if let Some(change) = change {
                self.shared.publish(change);
            }
            stored
        };
        self.shared.notify();
        Ok((*stored).clone())
    }

    /// Deletes an object; false when there was none (or the type is not served).
    /// Cluster-scoped objects are named with namespace `""`.
    pub fn delete(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> bool {
        let Some(resource) = resources::by_kind(api_version, kind) else {
            return false;
        };
        let deleted = {
            let mut store = lock(&self.shared.store);
            let change = store.delete(resource, &(namespace.to_string(), name.to_string()));
            let deleted = change.is_some();
            if let Some(change) = change {
                self.shared.publish(change);
            }
            deleted
        };
        self.shared.notify();
        deleted
    }

    /// Creates an object as a POST does: defaults (a Pod's `Pending` phase, a
    /// Namespace's `kubernetes.io/metadata.name` label, a Service's cluster IP from
    /// 10.96.0.0/16, `metadata.generation`), then mutating and validating admission
    /// webhooks, then storage. The type is found by `apiVersion` and `kind`.
    pub async fn create(&self, obj: Value) -> Result<Value, ApiError> {
        let resource = resource_of(&obj)?;
        let namespace = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .map(String::from);
        write::create(&self.shared, resource, namespace.as_deref(), obj, false).await
    }

    /// Replaces an object as a PUT does (the stored status is kept where the type has a
    /// status subresource; a given `metadata.resourceVersion` must be current, else
    /// 409), through admission.
    pub async fn update(&self, obj: Value) -> Result<Value, ApiError> {
        let resource = resource_of(&obj)?;
        write::update(
            &self.shared,
            resource,
            None,
            None,
            obj,
            write::Part::Object,
            false,
        )
        .await
    }

    /// Replaces only the status of an object, as a PUT of `.../status` does (a given
    /// `metadata.resourceVersion` must be current, else 409).
    pub async fn update_status(&self, obj: Value) -> Result<Value, ApiError> {
        let resource = resource_of(&obj)?;
        if !resources::has_status(resource) {
            return Err(ApiError::new(404, "the type has no status subresource"));
        }
        write::update(
            &self.shared,
            resource,
            None,
            None,
            obj,
            write::Part::Status,
            false,
        )
        .await
    }

    /// Applies a JSON merge patch to an object (namespace `""` for cluster-scoped
    /// types), as a PATCH does, through admission.
    pub async fn patch_merge(
        &self,
        plural: &str,
        namespace: &str,
        name: &str,
        patch: Value,
    ) -> Result<Value, ApiError> {
        let resource = plural_of(plural)?;
        write::patch(
            &self.shared,
            resource,
            &(namespace.to_string(), name.to_string()),
            patch::PatchType::Merge,
            &patch,
            write::Part::Object,
            false,
        )
        .await
        .map(|(v, _)| v)
    }

    /// Deletes an object as a DELETE does: a scheduled Pod with a grace period is
    /// only marked (see [`DeleteOptions`]), a Namespace turns Terminating, anything
    /// else goes at once. Returns the object as last stored.
    pub fn delete_with(
        &self,
        plural: &str,
        namespace: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Value, ApiError> {
        let resource = plural_of(plural)?;
        write::delete(&self.shared, resource, namespace, name, opts, false)
    }

    /// Removes an object for good at once, whatever its kind and marks (the kubelet's
    /// last word on a terminated Pod, the namespace controller's on an emptied
    /// Namespace). Returns its last state; `None` when there was none.
    pub fn delete_now(&self, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        let resource = resources::by_plural(plural)?;
        write::remove_now(
            &self.shared,
            resource,
            &(namespace.to_string(), name.to_string()),
        )
    }

    /// Installs how webhooks named by `clientConfig.service` are reached: given the
    /// Service's namespace, name and port, a connected stream to one of its pods. The
    /// TLS server name checked is `NAME.NAMESPACE.svc`.
    pub fn set_service_dialer<F, Fut>(&self, dial: F)
    where
        F: Fn(ServiceRef) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = std::io::Result<TcpStream>> + Send + 'static,
    {
        let dialer: ServiceDialer = Arc::new(move |svc| Box::pin(dial(svc)));
        *lock(&self.shared.dialer) = Some(dialer);
    }

    /// Every admission webhook call so far (the last 10,000), in call order.
    pub fn admission_calls(&self) -> Vec<AdmissionCall> {
        lock(&self.shared.admission_calls).clone()
    }

    /// A receiver of the revision of the last stored change: it changes whenever an
    /// object is created, changed or deleted (and only then); what in-process
    /// controllers wait on.
    pub fn changes(&self) -> latest::Receiver<u64> {
        self.shared.revision.subscribe()
    }

    /// The stored object, as GET would return it (namespace `""` for cluster-scoped types).
    pub fn get(&self, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        let resource = resources::by_plural(plural)?;
        let store = lock(&self.shared.store);
        store
            .get(resource, &(namespace.to_string(), name.to_string()))
            .map(|o| (*o).clone())
    }

    /// How many objects of this type (plural, e.g. `pods`) are stored.
    pub fn objects(&self, plural: &str) -> usize {
        resources::by_plural(plural).map_or(0, |r| lock(&self.shared.store).len(r))
    }

    /// Every stored object of this type (plural, e.g. `pods`), in namespace and name
    /// order; empty when the type is not served.
    pub fn list(&self, plural: &str) -> Vec<Value> {
        let Some(resource) = resources::by_plural(plural) else {
            return Vec::new();
        };
        let store = lock(&self.shared.store);
        store
            .page(resource, store.rv(), None, None, 0, |_| true)
            .map(|p| p.items.iter().map(|o| (**o).clone()).collect())
            .unwrap_or_default()
    }

    /// Every stored object of this type reduced to `{"metadata": ...}`: what the
    /// garbage collector reads, without copying specs (CRDs are large).
    pub(crate) fn metadata_list(&self, plural: &str) -> Vec<Value> {
        let Some(resource) = resources::by_plural(plural) else {
            return Vec::new();
        };
        let store = lock(&self.shared.store);
        store
            .page(resource, store.rv(), None, None, 0, |_| true)
            .map(|p| {
                p.items
                    .iter()
                    .map(|o| serde_json::json!({"metadata": o.get("metadata").cloned().unwrap_or_default()}))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The current resourceVersion (the revision of the last change).
    pub fn resource_version(&self) -> String {
        lock(&self.shared.store).rv().to_string()
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<RequestRecord> {
        lock(&self.shared.requests).clone()
    }

    /// How many requests had this verb (`list`, `watch`, `get`, ...) on this resource
    /// plural (`pods`).
    pub fn count(&self, verb: &str, plural: &str) -> usize {
        lock(&self.shared.requests)
            .iter()
            .filter(|r| r.verb == verb && r.resource.as_deref() == Some(plural))
            .count()
    }

    /// How many watch streams are open now.
    pub fn open_watches(&self) -> usize {
        self.shared.open_watches.load(Ordering::SeqCst)
    }

    /// Waits until exactly `n` watch streams are open; false if the deadline passed.
    pub async fn wait_for_watches(&self, n: usize, deadline: Duration) -> bool {
        self.wait_until(deadline, |s| s.open_watches() == n).await
    }

    /// Waits until at least `n` requests with this verb on this plural were received;
    /// false if the deadline passed.
    pub async fn wait_for_requests(
        &self,
        verb: &str,
        plural: &str,
        n: usize,
        deadline: Duration,
    ) -> bool {
        self.wait_until(deadline, |s| s.count(verb, plural) >= n)
            .await
    }

    /// Waits until `cond` holds, re-checking whenever a request arrives, a watch opens
    /// or closes, or an object changes; false if the deadline passed first.
    pub async fn wait_until(
        &self,
        deadline: Duration,
        mut cond: impl FnMut(&ApiServer) -> bool,
    ) -> bool {
        let mut changes = self.shared.changes.subscribe();
        let until = tokio::time::Instant::now() + deadline;
        loop {
            if cond(self) {
                return true;
            }
            match tokio::time::timeout_at(until, changes.changed()).await {
                Ok(Ok(())) => {}
                _ => return cond(self),
            }
        }
    }

    /// While on, new connections are accepted and closed at once, and open connections
    /// (with their watches) are dropped: clients see connection errors.
    pub fn refuse_connections(&self, on: bool) {
        self.shared.refuse.send_replace(on);
    }

    /// While `Some((code, retry_after_secs))`, every request is answered with that
    /// status code, a `Status` body and, when given, `Retry-After`. Open watches are
    /// not affected; see [`ApiServer::cut_watches`].
    pub fn fail_with(&self, status: Option<(u16, Option<u64>)>) {
        *lock(&self.shared.fault) = status;
    }

    /// Ends every open watch stream now, abruptly (no final chunk), as a lost
    /// connection would.
    pub fn cut_watches(&self) {
        self.shared.cut.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// While on, new requests are recorded but not answered; they are answered (as the
    /// server then stands) when it is turned off.
    pub fn stall(&self, on: bool) {
        self.shared.stall.send_replace(on);
    }

    /// Forgets all retained history, as an etcd compaction does: watches and list
    /// pages at any older resourceVersion get 410 Gone; the current one still works.
    pub fn expire_history(&self) {
        lock(&self.shared.store).expire_history();
    }

    /// How often watches get bookmarks; applies to open watches too.
    pub fn set_bookmark_interval(&self, d: Duration) {
        self.shared.bookmark_interval.send_replace(d);
    }

    /// How many changes are retained; lowering it compacts at once.
    pub fn set_history_limit(&self, n: usize) {
        lock(&self.shared.store).set_history_limit(n);
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.shared.shutdown.send_replace(true);
        self.accept.abort();
    }
}

fn resource_of(obj: &Value) -> Result<usize, ApiError> {
    let text = |k: &str| obj.get(k).and_then(Value::as_str).unwrap_or("");
    resources::by_kind(text("apiVersion"), text("kind")).ok_or_else(|| {
        ApiError::new(
            404,
            format!(
                "the server could not find the requested resource (apiVersion {:?} kind {:?})",
                selector::bounded(text("apiVersion")),
                selector::bounded(text("kind"))
            ),
        )
    })
}

fn plural_of(plural: &str) -> Result<usize, ApiError> {
    resources::by_plural(plural).ok_or_else(|| {
        ApiError::new(
            404,
            format!(
                "the server could not find the requested resource ({})",
                selector::bounded(plural)
            ),
        )
    })
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.subscribe();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _)) => {
                if *shared.refuse.borrow() {
                    drop(stream);
                    continue;
                }
                tokio::spawn(serve_connection(stream, shared.clone()));
            }
            Err(e) => {
                // Out of file descriptors and the like: pause rather than spin.
                tracing::debug!(error = %e, "testkit api server: accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

async fn serve_connection(stream: TcpStream, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let mut shutdown = shared.shutdown.subscribe();
    let mut refuse = shared.refuse.subscribe();
    let svc_shared = shared.clone();
    let svc = service_fn(move |req| handler::handle(svc_shared.clone(), req));
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .serve_connection(TokioIo::new(stream), svc);
    tokio::select! {
        res = conn => {
            if let Err(e) = res {
                tracing::trace!(error = %e, "testkit api server: connection ended");
            }
        }
        _ = shutdown.wait_for(|s| *s) => {}
        _ = refuse.wait_for(|r| *r) => {}
    }
}
