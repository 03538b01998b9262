//! The mesh's state: what the proxies' pages add up to, cycle by cycle.
//!
//! Per meshed pod, the last value of every counter series kept from its
//! page (sorted `(id, value)` pairs, zeros left out), so that the next page
//! gives deltas: a counter lower than before was reset (the proxy
//! restarted, or dropped and re-made the series) and its delta is its new
//! value; a series not seen before counts from zero. A pod's first page,
//! and its first after more than [`REBASELINE_AFTER_CYCLES`] cycles without
//! one, only sets the baseline (what it counted meanwhile is not put into
//! one cycle).
//!
//! Each page's deltas are folded at once into per-cycle sums of the
//! resources they concern; [`Mesh::end_cycle`] turns those into one point
//! per resource (a ring of `history_points`), edge and route. A resource's
//! figures come from two sides:
//!
//! - `inbound`: its own meshed pods' `direction="inbound"` series (a
//!   namespace: all its meshed pods');
//! - `clients`: what meshed clients' outbound series with the matching
//!   `dst_*` label counted (services only ever have this side).
//!
//! A row shows `inbound` while one of its meshed pods answered its last
//! scrape, else `clients` when there are any, else `none`.
//!
//! Bounds (all written down here, all counted when hit):
//! - pods: `max_pods` (the first of the snapshot, sorted by pod);
//! - points per resource and route: `history_points`; a window:
//!   [`MAX_WINDOW_INTERVALS`] cycles (latency buckets are kept for those
//!   only); edges keep only the default window ([`DEFAULT_WINDOW_SECS`]),
//!   pod-to-pod edges without latency;
//! - resources, edges, pod edges, routes: [`MeshConfig::max_entries`] each
//!   (beyond, new ones are not made: [`Mesh::dropped_entries`]);
//! - anything (resource, edge, route) not seen for `history_points` cycles
//!   is forgotten, and its strings with it.

mod query;
mod track;

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;

use crate::api::ResourceRef;
use crate::expo::{Direction, Page, Peer, What};
use crate::targets::Snapshot;
use track::{Acc, Bounds, Keep, Track};

pub use query::canonical_kind;

/// The default window of a figure, in seconds (rounded up to whole cycles).
pub const DEFAULT_WINDOW_SECS: u64 = 60;
/// The longest window, in cycles: 5 minutes at the default 10 s. Latency
/// buckets are kept this long per resource, edge and route.
pub const MAX_WINDOW_INTERVALS: usize = 30;
/// A pod without a page for more cycles than this starts over from a
/// baseline: what it counted meanwhile is not put into one cycle.
pub const REBASELINE_AFTER_CYCLES: u64 = 3;
/// Client workloads remembered per route, and backing workloads per
/// service (for a workload's page).
const MAX_ASSOCIATIONS: usize = 32;

/// How the mesh keeps time and bounds itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MeshConfig {
    /// Seconds between scrape cycles (default 10).
    pub interval_secs: u64,
    /// Points of history per resource (default 90: 15 minutes at 10 s).
    pub history_points: usize,
    /// Most pods recorded (default 10,000); the rest are counted, not
    /// scraped, and listed as `over_limit`.
    pub max_pods: usize,
}

impl Default for MeshConfig {
    fn default() -> Self {
        Self {
            interval_secs: 10,
            history_points: 90,
            max_pods: 10_000,
        }
    }
}

impl MeshConfig {
    /// Most resources, and also most edges, pod edges and routes, kept:
    /// `8 × max_pods`, at least 10,000 (80,000 by default).
    pub fn max_entries(&self) -> usize {
        self.max_pods.saturating_mul(8).max(10_000)
    }

    fn interval(&self) -> u64 {
        self.interval_secs.max(1)
    }

    fn history(&self) -> usize {
        self.history_points.max(1)
    }

    /// The longest window in cycles.
    fn max_window(&self) -> usize {
        MAX_WINDOW_INTERVALS.min(self.history())
    }

    fn resource_keep(&self) -> Keep {
        Keep {
            points: self.history(),
            bucket_points: self.max_window(),
        }
    }

    /// The default window in cycles: what edges keep (the edges API has
    /// no window of its own).
    fn default_window(&self) -> usize {
        usize::try_from(DEFAULT_WINDOW_SECS.div_ceil(self.interval()))
            .unwrap_or(usize::MAX)
            .clamp(1, self.max_window())
    }

    fn edge_keep(&self) -> Keep {
        Keep {
            points: self.default_window(),
            bucket_points: self.default_window(),
        }
    }

    /// Pod-to-pod edges keep counts only (no latency).
    fn pod_edge_keep(&self) -> Keep {
        Keep {
            points: self.default_window(),
            bucket_points: 0,
        }
    }
}

/// `GET /api/stat`'s question.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatQuery {
    pub kind: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// Default [`DEFAULT_WINDOW_SECS`]; at most [`MAX_WINDOW_INTERVALS`]
    /// cycles.
    pub window_secs: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("unknown resource kind {0:?} (namespace, deployment, statefulset, daemonset, job, replicaset, pod, service, route)")]
    UnknownKind(String),
    #[error("{}/{} not found in namespace {:?}", .0.kind, .0.name, .0.namespace)]
    NotFound(ResourceRef),
    #[error("bad target {0:?}: expected svc/NAME")]
    BadTarget(String),
}

/// Kinds as the api names them.
pub(crate) mod kind {
    pub const NAMESPACE: &str = "namespace";
    pub const POD: &str = "pod";
    pub const SERVICE: &str = "service";
    pub const ROUTE: &str = "route";
    pub const AUTHORITY: &str = "authority";
}

/// A resource by kind, namespace and name, interned: a key is one pointer
/// however many maps hold it. A namespace's namespace is itself.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Key(Arc<KeyData>);

#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct KeyData {
    pub kind: Arc<str>,
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

impl std::ops::Deref for Key {
    type Target = KeyData;
    fn deref(&self) -> &KeyData {
        &self.0
    }
}

impl std::borrow::Borrow<KeyData> for Key {
    fn borrow(&self) -> &KeyData {
        &self.0
    }
}

impl Key {
    pub fn to_ref(&self) -> ResourceRef {
        ResourceRef {
            kind: self.kind.to_string(),
            namespace: self.namespace.to_string(),
            name: self.name.to_string(),
        }
    }
}

/// Interned strings: every label value and name the state holds is one
/// `Arc<str>` however many keys use it; unused ones go each cycle.
#[derive(Debug, Default)]
struct Strings {
    set: HashSet<Arc<str>>,
    keys: HashSet<Key>,
}

impl Strings {
    fn intern(&mut self, s: &str) -> Arc<str> {
        if let Some(found) = self.set.get(s) {
            return found.clone();
        }
        let arc: Arc<str> = Arc::from(s);
        self.set.insert(arc.clone());
        arc
    }

    fn find(&self, s: &str) -> Option<Arc<str>> {
        self.set.get(s).cloned()
    }

    fn key(&mut self, kind: &str, namespace: &str, name: &str) -> Key {
        let namespace = if kind == kind::NAMESPACE {
            name
        } else {
            namespace
        };
        let data = KeyData {
            kind: self.intern(kind),
            namespace: self.intern(namespace),
            name: self.intern(name),
        };
        if let Some(found) = self.keys.get(&data) {
            return found.clone();
        }
        let key = Key(Arc::new(data));
        self.keys.insert(key.clone());
        key
    }

    /// The key of `r` if every string of it is known (else nothing has it).
    fn find_key(&self, r: &ResourceRef) -> Option<Key> {
        let namespace = if r.kind == kind::NAMESPACE {
            &r.name
        } else {
            &r.namespace
        };
        self.find_key_of(&r.kind, namespace, &r.name)
    }

    fn find_key_of(&self, kind: &str, namespace: &str, name: &str) -> Option<Key> {
        let data = KeyData {
            kind: self.find(kind)?,
            namespace: self.find(namespace)?,
            name: self.find(name)?,
        };
        self.keys.get(&data).cloned()
    }

    fn gc(&mut self) {
        self.keys.retain(|k| Arc::strong_count(&k.0) > 1);
        self.set.retain(|s| Arc::strong_count(s) > 1);
    }

    fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        // An `Arc` allocation: two counts and the value.
        table_bytes(self.set.capacity(), size_of::<Arc<str>>())
            + self.set.iter().map(|s| s.len() + 16).sum::<usize>()
            + table_bytes(self.keys.capacity(), size_of::<Key>())
            + self.keys.len() * (size_of::<KeyData>() + 16)
    }
}

/// The bytes of a std hash table of `capacity` entries of `entry` bytes:
/// a power of two of buckets (at most 7/8 full), a control byte each.
fn table_bytes(capacity: usize, entry: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    let buckets = (capacity.saturating_mul(8) / 7).next_power_of_two();
    buckets * (entry + 1) + 16
}

/// Traffic from one thing to another.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct EdgeKey {
    pub src: Key,
    pub dst: Key,
}

/// One route of one parent, from one protocol's route metrics.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct RouteKey {
    pub grpc: bool,
    pub parent: Key,
    pub port: Option<u16>,
    /// Kind `HTTPRoute`, `GRPCRoute`, `default`, ...
    pub route: Key,
}

/// A pod's last scrape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Health {
    Pending,
    Ok,
    Unreachable,
}

/// The last value of one counter series.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Last {
    id: u64,
    value: f64,
}

#[derive(Debug)]
struct PodState {
    workload: Option<Key>,
    addr: Box<str>,
    /// Sorted by id.
    last: Vec<Last>,
    last_ok_cycle: Option<u64>,
    last_attempt_at: Option<u64>,
    health: Health,
    last_error: Option<Box<str>>,
    failures: u32,
    /// When the collector means to try a failing pod again.
    next_attempt_at: Option<u64>,
    /// Inbound connections open at the last page.
    tcp_in_open: u64,
}

impl PodState {
    fn heap_bytes(&self) -> usize {
        self.last.capacity() * std::mem::size_of::<Last>()
            + self.addr.len()
            + self.last_error.as_ref().map_or(0, |e| e.len())
    }
}

/// One resource: its two sides' tracks, and this cycle's pod counts.
#[derive(Debug, Default)]
struct Resource {
    inbound: Option<Box<Track>>,
    clients: Option<Box<Track>>,
    seen: u64,
    /// A pod's workload.
    owner: Option<Key>,
    meshed: u32,
    total: u32,
    unreachable: u32,
    answering: u32,
    tcp_open: u64,
}

impl Resource {
    fn heap_bytes(&self) -> usize {
        let track = |t: &Option<Box<Track>>| {
            t.as_ref()
                .map_or(0, |t| std::mem::size_of::<Track>() + t.heap_bytes())
        };
        track(&self.inbound) + track(&self.clients)
    }
}

/// Connections seen on an edge in one cycle, by TLS.
#[derive(Clone, Debug, Default)]
struct TlsAcc {
    opened_mtls: u64,
    opened_plain: u64,
    open_mtls: u64,
    open_plain: u64,
    server_id: Option<Arc<str>>,
    plain_reason: Option<Arc<str>>,
}

impl TlsAcc {
    fn add(&mut self, tls: &crate::expo::Tls, opened: u64, open: u64) {
        if tls.mtls {
            self.opened_mtls += opened;
            self.open_mtls += open;
            if self.server_id.is_none() && !tls.detail.is_empty() {
                self.server_id = Some(tls.detail.clone());
            }
        } else {
            self.opened_plain += opened;
            self.open_plain += open;
            self.plain(&tls.detail);
        }
    }

    fn plain(&mut self, reason: &Arc<str>) {
        match &self.plain_reason {
            None => self.plain_reason = Some(reason.clone()),
            Some(r) if r == reason => {}
            Some(_) => self.plain_reason = Some(Arc::from("mixed")),
        }
    }

    fn merge(&mut self, o: &TlsAcc) {
        self.opened_mtls += o.opened_mtls;
        self.opened_plain += o.opened_plain;
        self.open_mtls += o.open_mtls;
        self.open_plain += o.open_plain;
        if self.server_id.is_none() {
            self.server_id.clone_from(&o.server_id);
        }
        if let Some(r) = &o.plain_reason {
            self.plain(r);
        }
    }

    /// What this cycle says about the edge's TLS: connections opened, else
    /// those still open.
    fn observed(&self) -> Option<TlsObserved> {
        let (mtls, plain) = if self.opened_mtls + self.opened_plain > 0 {
            (self.opened_mtls, self.opened_plain)
        } else {
            (self.open_mtls, self.open_plain)
        };
        (mtls + plain > 0).then_some(TlsObserved {
            mtls: mtls > 0,
            plain: plain > 0,
        })
    }
}

struct TlsObserved {
    mtls: bool,
    plain: bool,
}

/// What an edge's TLS was, last seen.
#[derive(Debug, Default)]
struct EdgeTls {
    last_mtls: Option<u64>,
    last_plain: Option<u64>,
    /// The server identity and why not mTLS, last seen; one allocation
    /// for the two, most edges having neither.
    seen: Option<Box<TlsSeen>>,
}

#[derive(Debug, Default)]
struct TlsSeen {
    server_id: Option<Arc<str>>,
    plain_reason: Option<Arc<str>>,
}

#[derive(Debug)]
struct EdgeState {
    track: Track,
    seen: u64,
    tls: EdgeTls,
}

#[derive(Debug)]
struct RouteState {
    track: Track,
    seen: u64,
    /// Client workloads (or pods), at most [`MAX_ASSOCIATIONS`].
    clients: Vec<Key>,
}

/// Workloads seen behind a service (from clients' `dst_*` labels).
#[derive(Debug, Default)]
struct Backends {
    workloads: Vec<Key>,
    seen: u64,
}

/// This cycle's sums, folded into points at its end.
#[derive(Debug, Default)]
struct CycleAcc {
    resources: HashMap<Key, SidesAcc>,
    edges: HashMap<EdgeKey, EdgeAcc>,
    pod_edges: HashMap<EdgeKey, EdgeAcc>,
    routes: HashMap<RouteKey, RouteAcc>,
}

#[derive(Debug, Default)]
struct SidesAcc {
    inbound: Option<Acc>,
    clients: Option<Acc>,
    owner: Option<Key>,
}

#[derive(Clone, Debug, Default)]
struct EdgeAcc {
    acc: Acc,
    tls: TlsAcc,
}

#[derive(Debug, Default)]
struct RouteAcc {
    acc: Acc,
    clients: Vec<Key>,
}

impl CycleAcc {
    fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        table_bytes(
            self.resources.capacity(),
            size_of::<Key>() + size_of::<SidesAcc>(),
        ) + table_bytes(
            self.edges.capacity(),
            size_of::<EdgeKey>() + size_of::<EdgeAcc>(),
        ) + table_bytes(
            self.pod_edges.capacity(),
            size_of::<EdgeKey>() + size_of::<EdgeAcc>(),
        ) + table_bytes(
            self.routes.capacity(),
            size_of::<RouteKey>() + size_of::<RouteAcc>(),
        ) + self
            .resources
            .values()
            .map(|s| {
                s.inbound.as_ref().map_or(0, Acc::heap_bytes)
                    + s.clients.as_ref().map_or(0, Acc::heap_bytes)
            })
            .sum::<usize>()
            + self
                .edges
                .values()
                .chain(self.pod_edges.values())
                .map(|e| e.acc.heap_bytes())
                .sum::<usize>()
    }
}

/// What a pod adds to its resources' counts.
struct PodCount {
    pod: Key,
    workload: Option<Key>,
    health: Health,
    tcp: u64,
}

/// A workload of the snapshot and its live pods.
#[derive(Debug)]
struct WorkloadPods {
    workload: Key,
    pods: u32,
}

/// The mesh's state; see the module's doc.
#[derive(Debug)]
pub struct Mesh {
    config: MeshConfig,
    source: String,
    strings: Strings,
    /// The current (or last) cycle's number, from 1.
    cycle: u64,
    /// Each of the last `history_points` cycles' time (Unix ms): when its
    /// pages were read, on average. Rates divide by the differences, so a
    /// pod that hangs (and so ends its cycle late) moves no one's figures.
    times: VecDeque<u64>,
    /// The current cycle's page read times, summed, and how many.
    reads_ms: u128,
    reads: u64,
    last_cycle_ms: Option<f64>,
    last_cycle_at: Option<u64>,
    workloads: Vec<WorkloadPods>,
    pods: HashMap<Key, PodState>,
    /// Meshed pods past `max_pods`.
    over_limit: Vec<Key>,
    resources: HashMap<Key, Resource>,
    edges: HashMap<EdgeKey, EdgeState>,
    pod_edges: HashMap<EdgeKey, EdgeState>,
    routes: HashMap<RouteKey, RouteState>,
    backends: HashMap<Key, Backends>,
    acc: CycleAcc,
    /// Latency bucket bounds of every track.
    bounds: Bounds,
    dropped_entries: u64,
    ignored_pages: u64,
}

/// The keys a destination of a page rolls up to.
struct DstKeys {
    workload: Option<Key>,
    pod: Option<Key>,
    service: Option<Key>,
    namespace: Option<Key>,
    /// Workload, else service, else authority.
    edge: Option<Key>,
    /// Pod, else `edge`.
    pod_edge: Option<Key>,
}

/// One page's sums, by its own tables' indices, before they are folded
/// into the cycle's.
#[derive(Default)]
struct PageAcc {
    inbound: Acc,
    tcp_in_open: u64,
    dsts: Vec<Option<EdgeAcc>>,
    routes: Vec<Option<Acc>>,
}

impl PageAcc {
    fn dst(&mut self, i: u32) -> Option<&mut EdgeAcc> {
        self.dsts
            .get_mut(i as usize)
            .map(|d| d.get_or_insert_with(EdgeAcc::default))
    }

    fn route(&mut self, i: u32) -> Option<&mut Acc> {
        self.routes
            .get_mut(i as usize)
            .map(|r| r.get_or_insert_with(Acc::default))
    }

    fn add(&mut self, page: &Page, what: &What, n: u64) {
        use Direction::{Inbound, Outbound};
        match *what {
            What::Response {
                dir: Inbound,
                success,
                ..
            } => self.inbound.responses(n, success),
            What::Latency {
                dir: Inbound,
                lo,
                hi,
                ..
            } => self.inbound.bucket(lo, hi, n),
            What::Response {
                dir: Outbound,
                dst,
                success,
            } => {
                if let Some(d) = self.dst(dst) {
                    d.acc.responses(n, success);
                }
            }
            What::Latency {
                dir: Outbound,
                dst,
                lo,
                hi,
            } => {
                if let Some(d) = self.dst(dst) {
                    d.acc.bucket(lo, hi, n);
                }
            }
            What::TcpOpened {
                dir: Outbound,
                peer: Peer::Dst,
                dst,
                tls,
            } => {
                if let (Some(t), Some(d)) = (page.tls.get(tls as usize), self.dst(dst)) {
                    d.tls.add(t, n, 0);
                }
            }
            What::TcpOpen {
                dir: Outbound,
                peer: Peer::Dst,
                dst,
                tls,
            } => {
                if let (Some(t), Some(d)) = (page.tls.get(tls as usize), self.dst(dst)) {
                    d.tls.add(t, 0, n);
                }
            }
            What::TcpOpen {
                dir: Inbound,
                peer: Peer::Src,
                ..
            } => self.tcp_in_open += n,
            What::RouteStatus { route, success } => {
                if let Some(r) = self.route(route) {
                    r.responses(n, success);
                }
            }
            What::RouteLatency { route, lo, hi } => {
                if let Some(r) = self.route(route) {
                    r.bucket(lo, hi, n);
                }
            }
            What::TcpOpened { .. } | What::TcpOpen { .. } => {}
        }
    }
}

/// A counter's delta as a count.
fn count(v: f64) -> u64 {
    // `as` saturates and maps NaN to 0.
    v.round() as u64
}

impl Mesh {
    /// An empty mesh; figures come after two pages of a pod.
    pub fn new(config: MeshConfig) -> Self {
        Self {
            config,
            source: "scrape".into(),
            strings: Strings::default(),
            cycle: 0,
            times: VecDeque::new(),
            reads_ms: 0,
            reads: 0,
            last_cycle_ms: None,
            last_cycle_at: None,
            workloads: Vec::new(),
            pods: HashMap::new(),
            over_limit: Vec::new(),
            resources: HashMap::new(),
            edges: HashMap::new(),
            pod_edges: HashMap::new(),
            routes: HashMap::new(),
            backends: HashMap::new(),
            acc: CycleAcc::default(),
            bounds: Bounds::default(),
            dropped_entries: 0,
            ignored_pages: 0,
        }
    }

    pub fn config(&self) -> &MeshConfig {
        &self.config
    }

    /// Starts a cycle with the pods of `snapshot`: the first `max_pods` are
    /// recorded (the collector scrapes the same ones), pods gone from it
    /// are dropped with their counters.
    pub fn begin_cycle(&mut self, snapshot: &Snapshot) {
        self.cycle += 1;
        self.acc = CycleAcc::default();
        let mut keep = HashSet::with_capacity(snapshot.meshed.len().min(self.config.max_pods));
        self.over_limit.clear();
        for (i, target) in snapshot.meshed.iter().enumerate() {
            let key = self
                .strings
                .key(kind::POD, &target.pod.namespace, &target.pod.name);
            if i >= self.config.max_pods {
                self.over_limit.push(key);
                continue;
            }
            let workload = target
                .workload
                .as_ref()
                .map(|w| self.strings.key(&w.kind, &w.namespace, &w.name));
            let addr = SocketAddr::new(target.ip, target.admin_port).to_string();
            let pod = self.pods.entry(key.clone()).or_insert_with(|| PodState {
                workload: None,
                addr: Box::from(""),
                last: Vec::new(),
                last_ok_cycle: None,
                last_attempt_at: None,
                health: Health::Pending,
                last_error: None,
                failures: 0,
                next_attempt_at: None,
                tcp_in_open: 0,
            });
            pod.workload = workload;
            if *pod.addr != *addr {
                pod.addr = addr.into_boxed_str();
            }
            keep.insert(key);
        }
        self.pods.retain(|k, _| keep.contains(k));
        self.workloads.clear();
        for (w, n) in &snapshot.pods_per_workload {
            let workload = self.strings.key(&w.kind, &w.namespace, &w.name);
            self.workloads.push(WorkloadPods { workload, pods: *n });
        }
    }

    fn pod_key(&self, pod: &ResourceRef) -> Option<Key> {
        let key = self
            .strings
            .find_key_of(kind::POD, &pod.namespace, &pod.name)?;
        self.pods.contains_key(&key).then_some(key)
    }

    /// One pod's page, read at `at_ms` (Unix ms). A pod not among this
    /// cycle's recorded pods is ignored (counted: [`Mesh::ignored_pages`]).
    pub fn record_page(&mut self, pod: &ResourceRef, at_ms: u64, page: Page) {
        let Some(key) = self.pod_key(pod) else {
            self.ignored_pages += 1;
            return;
        };
        let at = at_ms / 1000;
        self.reads_ms += u128::from(at_ms);
        self.reads += 1;
        let cycle = self.cycle;
        let Some(state) = self.pods.get_mut(&key) else {
            return;
        };
        let baseline = state
            .last_ok_cycle
            .is_some_and(|c| cycle.saturating_sub(c) <= REBASELINE_AFTER_CYCLES);
        let mut acc = PageAcc {
            dsts: vec![None; page.dsts.len()],
            routes: vec![None; page.routes.len()],
            ..PageAcc::default()
        };
        let old = std::mem::take(&mut state.last);
        let mut last = Vec::with_capacity(page.samples.len());
        let mut j = 0;
        for s in &page.samples {
            let n = if s.what.is_gauge() {
                count(s.value)
            } else {
                while old.get(j).is_some_and(|l| l.id < s.id) {
                    j += 1;
                }
                let prev = old.get(j).filter(|l| l.id == s.id).map(|l| l.value);
                last.push(Last {
                    id: s.id,
                    value: s.value,
                });
                match prev {
                    _ if !baseline => 0,
                    Some(p) if s.value >= p => count(s.value - p),
                    // Reset (or new): all of it is new.
                    _ => count(s.value),
                }
            };
            acc.add(&page, &s.what, n);
        }
        last.shrink_to_fit();
        state.last = last;
        state.last_ok_cycle = Some(cycle);
        state.last_attempt_at = Some(at);
        state.health = Health::Ok;
        state.last_error = None;
        state.failures = 0;
        state.next_attempt_at = None;
        state.tcp_in_open = acc.tcp_in_open;
        // A baseline page counts nothing: no thing gets a point from it.
        if baseline {
            let workload = state.workload.clone();
            self.fold_page(&key, workload, &page, acc);
        }
    }

    /// Adds one page's sums to the cycle's.
    fn fold_page(&mut self, pod: &Key, workload: Option<Key>, page: &Page, acc: PageAcc) {
        let namespace = self.strings.key(kind::NAMESPACE, "", &pod.namespace);
        let src = workload.clone().unwrap_or_else(|| pod.clone());
        let cycle = &mut self.acc;
        for k in [Some(pod.clone()), workload, Some(namespace)]
            .into_iter()
            .flatten()
        {
            let side = cycle.resources.entry(k).or_default();
            side.inbound
                .get_or_insert_with(Acc::default)
                .merge(&acc.inbound);
        }
        for (i, d) in acc.dsts.iter().enumerate() {
            let (Some(d), Some(dst)) = (d, page.dsts.get(i)) else {
                continue;
            };
            let keys = dst_keys(&mut self.strings, dst);
            for k in [&keys.workload, &keys.pod, &keys.service, &keys.namespace]
                .into_iter()
                .flatten()
            {
                let side = cycle.resources.entry(k.clone()).or_default();
                side.clients.get_or_insert_with(Acc::default).merge(&d.acc);
                if Some(k) == keys.pod.as_ref() && keys.workload.is_some() {
                    side.owner.clone_from(&keys.workload);
                }
            }
            if let Some(dst) = keys.edge {
                let e = cycle.edges.entry(EdgeKey {
                    src: src.clone(),
                    dst,
                });
                let e = e.or_default();
                e.acc.merge(&d.acc);
                e.tls.merge(&d.tls);
            }
            if let Some(dst) = keys.pod_edge {
                let e = cycle.pod_edges.entry(EdgeKey {
                    src: pod.clone(),
                    dst,
                });
                let e = e.or_default();
                e.acc.requests += d.acc.requests;
                e.acc.successes += d.acc.successes;
                e.tls.merge(&d.tls);
            }
            if let (Some(svc), Some(w)) = (keys.service, keys.workload) {
                let b = self.backends.entry(svc).or_default();
                b.seen = self.cycle;
                if !b.workloads.contains(&w) && b.workloads.len() < MAX_ASSOCIATIONS {
                    b.workloads.push(w);
                }
            }
        }
        for (i, r) in acc.routes.iter().enumerate() {
            let (Some(r), Some(route)) = (r, page.routes.get(i)) else {
                continue;
            };
            let parent_kind = route.parent_kind.to_ascii_lowercase();
            let key = RouteKey {
                grpc: route.grpc,
                parent: self
                    .strings
                    .key(&parent_kind, &route.parent_namespace, &route.parent_name),
                port: route.parent_port,
                route: self.strings.key(
                    &route.route_kind,
                    &route.route_namespace,
                    &route.route_name,
                ),
            };
            let entry = cycle.routes.entry(key).or_default();
            entry.acc.merge(r);
            if !entry.clients.contains(&src) && entry.clients.len() < MAX_ASSOCIATIONS {
                entry.clients.push(src.clone());
            }
        }
    }

    /// A pod's scrape failed at `at_ms` (Unix ms): it shows as
    /// unreachable, and why.
    pub fn record_failure(
        &mut self,
        pod: &ResourceRef,
        at_ms: u64,
        error: String,
        next_attempt_in_secs: Option<u64>,
    ) {
        let Some(key) = self.pod_key(pod) else {
            return;
        };
        let at = at_ms / 1000;
        if let Some(state) = self.pods.get_mut(&key) {
            state.health = Health::Unreachable;
            state.last_attempt_at = Some(at);
            state.failures = state.failures.saturating_add(1);
            // An error message is shown, not stored at any length.
            let mut error = error;
            if error.len() > 512 {
                let mut cut = 512;
                while !error.is_char_boundary(cut) {
                    cut -= 1;
                }
                error.truncate(cut);
            }
            state.last_error = Some(error.into_boxed_str());
            state.next_attempt_at = next_attempt_in_secs.map(|s| at.saturating_add(s));
        }
    }

    /// Ends the cycle: one point per resource, edge and route; forgets
    /// what was not seen for `history_points` cycles.
    /// `at_ms` (Unix ms) is when the cycle ended: its time when no page was
    /// read in it.
    pub fn end_cycle(&mut self, at_ms: u64, cycle_ms: f64) {
        let cycle = self.cycle;
        let history = self.config.history();
        let read = match self.reads {
            0 => at_ms,
            n => u64::try_from(self.reads_ms / u128::from(n)).unwrap_or(at_ms),
        };
        (self.reads_ms, self.reads) = (0, 0);
        // Strictly after the cycle before, so that no cycle covers no time.
        let stamp = match self.times.back() {
            Some(&prev) => read.max(prev + 1),
            None => read,
        };
        let at = at_ms / 1000;
        self.times.push_back(stamp);
        while self.times.len() > history {
            self.times.pop_front();
        }
        self.last_cycle_ms = Some(cycle_ms);
        self.last_cycle_at = Some(at);
        let max = self.config.max_entries();
        let acc = std::mem::take(&mut self.acc);

        // Pod counts of this cycle.
        for r in self.resources.values_mut() {
            r.meshed = 0;
            r.total = 0;
            r.unreachable = 0;
            r.answering = 0;
            r.tcp_open = 0;
        }
        let mut dropped = 0u64;
        for w in &self.workloads {
            let ns = self.strings.key(kind::NAMESPACE, "", &w.workload.namespace);
            if let Some(r) =
                resource_entry(&mut self.resources, &w.workload, cycle, max, &mut dropped)
            {
                r.total += w.pods;
            }
            if let Some(r) = resource_entry(&mut self.resources, &ns, cycle, max, &mut dropped) {
                r.total += w.pods;
            }
        }
        let pods: Vec<PodCount> = self
            .pods
            .iter()
            .map(|(k, p)| PodCount {
                pod: k.clone(),
                workload: p.workload.clone(),
                health: p.health,
                tcp: p.tcp_in_open,
            })
            .collect();
        for PodCount {
            pod,
            workload,
            health,
            tcp,
        } in pods
        {
            let ns = self.strings.key(kind::NAMESPACE, "", &pod.namespace);
            let pod_total = u32::from(workload.is_none());
            let owner = workload.clone();
            for (k, total) in [(Some(pod), 1), (workload, 0), (Some(ns), pod_total)] {
                let Some(k) = k else { continue };
                let is_pod = *k.kind == *kind::POD;
                let Some(r) = resource_entry(&mut self.resources, &k, cycle, max, &mut dropped)
                else {
                    continue;
                };
                if is_pod {
                    r.owner.clone_from(&owner);
                }
                r.meshed += 1;
                r.total += total;
                match health {
                    Health::Ok => {
                        r.answering += 1;
                        r.tcp_open += tcp;
                    }
                    Health::Unreachable => r.unreachable += 1,
                    Health::Pending => {}
                }
            }
        }

        // The cycle's sums into points.
        let mut sides = acc.resources;
        for key in sides.keys() {
            resource_entry(&mut self.resources, key, cycle, max, &mut dropped);
        }
        let keep = self.config.resource_keep();
        for (key, r) in self.resources.iter_mut() {
            let side = sides.remove(key);
            let (inbound, clients, owner) = match side {
                Some(s) => (s.inbound, s.clients, s.owner),
                None => (None, None, None),
            };
            if r.owner.is_none() {
                r.owner = owner;
            }
            push(&mut r.inbound, inbound.as_ref(), keep, &mut self.bounds);
            push(&mut r.clients, clients.as_ref(), keep, &mut self.bounds);
        }
        fold_edges(
            &mut self.edges,
            acc.edges,
            self.config.edge_keep(),
            cycle,
            max,
            &mut dropped,
            &mut self.bounds,
        );
        fold_edges(
            &mut self.pod_edges,
            acc.pod_edges,
            self.config.pod_edge_keep(),
            cycle,
            max,
            &mut dropped,
            &mut self.bounds,
        );
        let mut routes = acc.routes;
        for (key, r) in routes.iter() {
            if !self.routes.contains_key(key) && self.routes.len() >= max {
                dropped += 1;
                continue;
            }
            let state = self
                .routes
                .entry(key.clone())
                .or_insert_with(|| RouteState {
                    track: Track::new(keep),
                    seen: cycle,
                    clients: Vec::new(),
                });
            state.seen = cycle;
            for c in &r.clients {
                if !state.clients.contains(c) && state.clients.len() < MAX_ASSOCIATIONS {
                    state.clients.push(c.clone());
                }
            }
        }
        for (key, state) in self.routes.iter_mut() {
            let r = routes.remove(key);
            state
                .track
                .push(r.as_ref().map(|r| &r.acc), keep, &mut self.bounds);
        }
        self.dropped_entries += dropped;

        // Forget what has not been seen for the whole history.
        let stale = |seen: u64| cycle.saturating_sub(seen) >= history as u64;
        self.resources.retain(|_, r| !stale(r.seen));
        self.edges.retain(|_, e| !stale(e.seen));
        self.pod_edges.retain(|_, e| !stale(e.seen));
        self.routes.retain(|_, r| !stale(r.seen));
        self.backends.retain(|_, b| !stale(b.seen));
        self.strings.gc();
    }

    /// Where pages come from: `scrape` or `prometheus` (shown in the
    /// overview).
    pub fn set_source(&mut self, source: &str) {
        self.source = source.to_string();
    }

    /// Resources, edges and routes not made because their bound was hit.
    pub fn dropped_entries(&self) -> u64 {
        self.dropped_entries
    }

    /// Pages of pods not recorded this cycle (not in the snapshot, or past
    /// `max_pods`).
    pub fn ignored_pages(&self) -> u64 {
        self.ignored_pages
    }

    /// Meshed pods not recorded because of `max_pods`.
    pub fn pods_over_limit(&self) -> usize {
        self.over_limit.len()
    }

    /// Pods recorded.
    pub fn pods_recorded(&self) -> usize {
        self.pods.len()
    }

    /// An estimate of the heap the state holds, for a gauge and the
    /// benchmark: every map's and vector's capacity, every track, every
    /// interned string.
    pub fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        fn map<K, V>(m: &HashMap<K, V>) -> usize {
            table_bytes(m.capacity(), size_of::<K>() + size_of::<V>())
        }
        let pods: usize =
            map(&self.pods) + self.pods.values().map(PodState::heap_bytes).sum::<usize>();
        let resources = map(&self.resources)
            + self
                .resources
                .values()
                .map(Resource::heap_bytes)
                .sum::<usize>();
        let edges = map(&self.edges)
            + map(&self.pod_edges)
            + self
                .edges
                .values()
                .chain(self.pod_edges.values())
                .map(|e| {
                    e.track.heap_bytes() + e.tls.seen.as_ref().map_or(0, |_| size_of::<TlsSeen>())
                })
                .sum::<usize>();
        let routes = map(&self.routes)
            + self
                .routes
                .values()
                .map(|r| r.track.heap_bytes() + r.clients.capacity() * size_of::<Key>())
                .sum::<usize>();
        let backends = map(&self.backends)
            + self
                .backends
                .values()
                .map(|b| b.workloads.capacity() * size_of::<Key>())
                .sum::<usize>();
        pods + resources
            + edges
            + routes
            + backends
            + self.strings.heap_bytes()
            + self.bounds.heap_bytes()
            + self.acc.heap_bytes()
            + self.times.capacity() * size_of::<u64>()
            + self.workloads.capacity() * size_of::<WorkloadPods>()
            + self.over_limit.capacity() * size_of::<Key>()
            + self.source.capacity()
    }
}

/// The resource of `key`, made if there is room; seen this cycle.
fn resource_entry<'a>(
    resources: &'a mut HashMap<Key, Resource>,
    key: &Key,
    cycle: u64,
    max: usize,
    dropped: &mut u64,
) -> Option<&'a mut Resource> {
    if !resources.contains_key(key) && resources.len() >= max {
        *dropped += 1;
        return None;
    }
    let r = resources.entry(key.clone()).or_default();
    r.seen = cycle;
    Some(r)
}

/// Pushes this cycle's point onto a side's track; a side gets a track the
/// first cycle it has something.
fn push(track: &mut Option<Box<Track>>, acc: Option<&Acc>, keep: Keep, bounds: &mut Bounds) {
    match track {
        Some(t) => t.push(acc, keep, bounds),
        None => {
            if let Some(acc) = acc {
                let mut t = Box::new(Track::new(keep));
                t.push(Some(acc), keep, bounds);
                *track = Some(t);
            }
        }
    }
}

fn fold_edges(
    edges: &mut HashMap<EdgeKey, EdgeState>,
    mut acc: HashMap<EdgeKey, EdgeAcc>,
    keep: Keep,
    cycle: u64,
    max: usize,
    dropped: &mut u64,
    bounds: &mut Bounds,
) {
    for key in acc.keys() {
        if !edges.contains_key(key) {
            if edges.len() >= max {
                *dropped += 1;
                continue;
            }
            edges.insert(
                key.clone(),
                EdgeState {
                    track: Track::new(keep),
                    seen: cycle,
                    tls: EdgeTls::default(),
                },
            );
        }
    }
    for (key, e) in edges.iter_mut() {
        let Some(a) = acc.remove(key) else {
            e.track.push(None, keep, bounds);
            continue;
        };
        e.seen = cycle;
        e.track.push(Some(&a.acc), keep, bounds);
        if let Some(seen) = a.tls.observed() {
            if seen.mtls {
                e.tls.last_mtls = Some(cycle);
                if a.tls.server_id.is_some() {
                    e.tls.seen.get_or_insert_default().server_id = a.tls.server_id.clone();
                }
            }
            if seen.plain {
                e.tls.last_plain = Some(cycle);
                e.tls
                    .seen
                    .get_or_insert_default()
                    .plain_reason
                    .clone_from(&a.tls.plain_reason);
            }
        }
    }
}

fn dst_keys(strings: &mut Strings, dst: &crate::expo::Dst) -> DstKeys {
    let ns = &*dst.namespace;
    let known = !ns.is_empty();
    let workload = dst
        .workload
        .as_ref()
        .filter(|_| known)
        .map(|(kind, name)| strings.key(kind.as_str(), ns, name));
    let pod = (known && !dst.pod.is_empty()).then(|| strings.key(kind::POD, ns, &dst.pod));
    let service =
        (known && !dst.service.is_empty()).then(|| strings.key(kind::SERVICE, ns, &dst.service));
    let namespace = known.then(|| strings.key(kind::NAMESPACE, "", ns));
    let edge = workload.clone().or_else(|| service.clone()).or_else(|| {
        (!dst.authority.is_empty()).then(|| strings.key(kind::AUTHORITY, "", &dst.authority))
    });
    let pod_edge = pod.clone().or_else(|| edge.clone());
    DstKeys {
        workload,
        pod,
        service,
        namespace,
        edge,
        pod_edge,
    }
}

#[cfg(test)]
mod tests;
