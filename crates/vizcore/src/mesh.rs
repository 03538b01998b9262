//! The mesh's state: what the proxies' pages add up to, cycle by cycle.
//!
//! Per meshed pod, the last value of every counter series kept from its
//! page (sorted by series id, zeros left out; about 11 bytes a series, see
//! `LastValues`), so that the next page
//! gives deltas: a counter lower than before was reset (the proxy
//! restarted, or dropped and re-made the series) and its delta is its new
//! value; a series not seen before counts from zero. A pod's first page,
//! and its first after more than [`REBASELINE_AFTER_CYCLES`] cycles without
//! one, only sets the baseline (what it counted meanwhile is not put into
//! one cycle).
//!
//! Each page's deltas are folded at once into per-cycle sums of the
//! resources they concern; [`Mesh::end_cycle`] turns those into one point
//! per resource (a ring of `history_points`, a few bytes a point: see
//! `track`), edge and route. A resource's figures come from two sides:
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
use std::net::IpAddr;
use std::num::NonZeroU64;
use std::sync::Arc;

use crate::api::ResourceRef;
use crate::expo::{Direction, Page, Peer, What};
use crate::targets::Snapshot;
use track::{Acc, Bounds, Counts, History, Keep, Track};

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
    /// What edges last saw of TLS, shared.
    tls: HashSet<Arc<TlsSeen>>,
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

    fn tls_seen(&mut self, seen: TlsSeen) -> Arc<TlsSeen> {
        if let Some(found) = self.tls.get(&seen) {
            return found.clone();
        }
        let arc = Arc::new(seen);
        self.tls.insert(arc.clone());
        arc
    }

    fn gc(&mut self) {
        self.tls.retain(|t| Arc::strong_count(t) > 1);
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
            + table_bytes(self.tls.capacity(), size_of::<Arc<TlsSeen>>())
            + self.tls.len() * (size_of::<TlsSeen>() + 16)
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

/// Every histogram bound (`le`, f64 bits) a kept counter was seen with,
/// mesh-wide, so that a pod's last values name it in a byte or two. Never
/// shrinks; at most [`MAX_LES`] (buckets of others are kept by series id).
#[derive(Debug, Default)]
struct Les {
    index: HashMap<u64, u16>,
}

/// Most distinct `le` the mesh keeps an index for (a proxy's histograms
/// have about 40 together).
const MAX_LES: usize = u16::MAX as usize;

impl Les {
    fn index(&mut self, le: u64) -> Option<u16> {
        if let Some(i) = self.index.get(&le) {
            return Some(*i);
        }
        if self.index.len() >= MAX_LES {
            return None;
        }
        let i = self.index.len() as u16;
        self.index.insert(le, i);
        Some(i)
    }

    fn heap_bytes(&self) -> usize {
        table_bytes(self.index.capacity(), 8 + 2)
    }
}

/// One histogram bucket's last value: its series, its `le`'s index.
#[derive(Clone, Copy, Debug, PartialEq)]
struct LastBucket {
    series: u64,
    le: u16,
    value: f64,
}

/// A pod's counters at its last page, as bytes: first the counters that
/// are not histogram buckets, sorted by series id, each its id (8 bytes)
/// and its value; then the buckets by series (sorted by series id, then
/// `le`): the series id, how many, and per bucket its `le` index and value
/// (a varint each). A value is a varint of `value << 1` for a whole number
/// under 2^63 (what counters are), else `1` and the f64 (8 bytes). About
/// 11 bytes a counter, 3 a bucket.
#[derive(Debug, Default)]
struct LastValues(Box<[u8]>);

impl LastValues {
    /// Replaces these values, in place when they take as many bytes as
    /// before (the same series, most often): a pod's counters are not made
    /// anew each cycle.
    fn set(&mut self, counters: &[Last], buckets: &[LastBucket]) {
        let new = Self::build(counters, buckets);
        if new.0.len() == self.0.len() {
            self.0.copy_from_slice(&new.0);
        } else {
            *self = new;
        }
    }

    fn build(counters: &[Last], buckets: &[LastBucket]) -> Self {
        let mut out = Vec::with_capacity(counters.len() * 11 + buckets.len() * 4 + 8);
        put_varint(&mut out, counters.len() as u64);
        for l in counters {
            out.extend_from_slice(&l.id.to_le_bytes());
            put_value(&mut out, l.value);
        }
        for group in buckets.chunk_by(|a, b| a.series == b.series) {
            out.extend_from_slice(&group[0].series.to_le_bytes());
            put_varint(&mut out, group.len() as u64);
            for b in group {
                put_varint(&mut out, u64::from(b.le));
                put_value(&mut out, b.value);
            }
        }
        Self(out.into_boxed_slice())
    }

    /// The counters, then the buckets.
    fn read(&self) -> (LastIter<'_>, BucketIter<'_>) {
        let mut bytes = &self.0[..];
        let n = take_varint(&mut bytes).unwrap_or(0) as usize;
        let mut rest = bytes;
        for _ in 0..n {
            if rest.split_first_chunk::<8>().is_none() {
                break;
            }
            rest = &rest[8..];
            if take_value(&mut rest).is_none() {
                break;
            }
        }
        let counters = &bytes[..bytes.len() - rest.len()];
        (
            LastIter { bytes: counters },
            BucketIter {
                bytes: rest,
                series: 0,
                left: 0,
            },
        )
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        let (counters, buckets) = self.read();
        counters.count() + buckets.count()
    }

    fn heap_bytes(&self) -> usize {
        self.0.len()
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn take_varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for (i, b) in bytes.iter().enumerate().take(10) {
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            *bytes = &bytes[i + 1..];
            return Some(v);
        }
    }
    None
}

/// A value: a whole number under 2^63 as a varint of it `<< 1`, else `1`
/// and its f64.
fn put_value(out: &mut Vec<u8>, value: f64) {
    let whole = value as u64;
    if whole < 1 << 63 && whole as f64 == value {
        put_varint(out, whole << 1);
    } else {
        out.push(1);
        out.extend_from_slice(&value.to_le_bytes());
    }
}

fn take_value(bytes: &mut &[u8]) -> Option<f64> {
    let v = take_varint(bytes)?;
    if v & 1 == 0 {
        return Some((v >> 1) as f64);
    }
    let (f, rest) = bytes.split_first_chunk::<8>()?;
    *bytes = rest;
    Some(f64::from_le_bytes(*f))
}

/// The counters of [`LastValues`] in order.
struct LastIter<'a> {
    bytes: &'a [u8],
}

impl Iterator for LastIter<'_> {
    type Item = Last;

    fn next(&mut self) -> Option<Last> {
        let (id, mut rest) = self.bytes.split_first_chunk::<8>()?;
        let id = u64::from_le_bytes(*id);
        let value = take_value(&mut rest)?;
        self.bytes = rest;
        Some(Last { id, value })
    }
}

/// The buckets of [`LastValues`] in order.
struct BucketIter<'a> {
    bytes: &'a [u8],
    series: u64,
    left: u64,
}

impl Iterator for BucketIter<'_> {
    type Item = LastBucket;

    fn next(&mut self) -> Option<LastBucket> {
        while self.left == 0 {
            let (series, mut rest) = self.bytes.split_first_chunk::<8>()?;
            self.series = u64::from_le_bytes(*series);
            self.left = take_varint(&mut rest)?;
            self.bytes = rest;
        }
        let mut rest = self.bytes;
        let le = take_varint(&mut rest)? as u16;
        let value = take_value(&mut rest)?;
        self.bytes = rest;
        self.left -= 1;
        Some(LastBucket {
            series: self.series,
            le,
            value,
        })
    }
}

/// What a failing pod shows: why, how many times in a row, when it is
/// tried again. Apart, as most pods answer.
#[derive(Debug)]
struct Failing {
    error: Box<str>,
    failures: u32,
    /// When the collector means to try it again.
    next_attempt_at: Option<u64>,
}

#[derive(Debug)]
struct PodState {
    workload: Option<Key>,
    ip: IpAddr,
    admin_port: u16,
    health: Health,
    last: LastValues,
    last_ok_cycle: Option<NonZeroU64>,
    /// Unix seconds plus one (so that zero is a time).
    last_attempt_at: Option<NonZeroU64>,
    failing: Option<Box<Failing>>,
    /// Inbound connections open at the last page.
    tcp_in_open: u64,
}

impl PodState {
    fn new(ip: IpAddr, admin_port: u16) -> Self {
        Self {
            workload: None,
            ip,
            admin_port,
            health: Health::Pending,
            last: LastValues::default(),
            last_ok_cycle: None,
            last_attempt_at: None,
            failing: None,
            tcp_in_open: 0,
        }
    }

    fn last_attempt_at(&self) -> Option<u64> {
        self.last_attempt_at.map(|t| t.get() - 1)
    }

    fn heap_bytes(&self) -> usize {
        self.last.heap_bytes()
            + self
                .failing
                .as_ref()
                .map_or(0, |f| std::mem::size_of::<Failing>() + f.error.len())
    }
}

/// The recorded pods, sorted by namespace and name: no table's empty
/// slots, a binary search to find one.
#[derive(Debug, Default)]
struct Pods {
    list: Vec<(Key, PodState)>,
}

impl Pods {
    fn find(&self, namespace: &str, name: &str) -> Option<usize> {
        self.list
            .binary_search_by(|(k, _)| (&*k.namespace, &*k.name).cmp(&(namespace, name)))
            .ok()
    }

    fn len(&self) -> usize {
        self.list.len()
    }

    fn iter(&self) -> impl Iterator<Item = (&Key, &PodState)> {
        self.list.iter().map(|(k, p)| (k, p))
    }

    fn values(&self) -> impl Iterator<Item = &PodState> {
        self.list.iter().map(|(_, p)| p)
    }

    fn heap_bytes(&self) -> usize {
        self.list.capacity() * std::mem::size_of::<(Key, PodState)>()
            + self.values().map(PodState::heap_bytes).sum::<usize>()
    }
}

/// One resource: its two sides' tracks, and this cycle's pod counts.
#[derive(Debug, Default)]
struct Resource {
    inbound: Option<Track>,
    clients: Option<Track>,
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
        let track = |t: &Option<Track>| t.as_ref().map_or(0, Track::heap_bytes);
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
    /// Cycles (from 1).
    last_mtls: Option<NonZeroU64>,
    last_plain: Option<NonZeroU64>,
    /// The server identity and why not mTLS, last seen: shared by every
    /// edge that saw the same (interned in [`Strings`]).
    seen: Option<Arc<TlsSeen>>,
}

#[derive(Debug, Default, PartialEq, Eq, Hash)]
struct TlsSeen {
    server_id: Option<Arc<str>>,
    plain_reason: Option<Arc<str>>,
}

/// An edge's history (a [`Track`]; pod-to-pod edges keep [`Counts`]).
#[derive(Debug)]
struct EdgeState<H = Track> {
    track: H,
    seen: u64,
    tls: EdgeTls,
}

impl<H: History> EdgeState<H> {
    fn heap_bytes(&self) -> usize {
        self.track.heap_bytes()
    }
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
    pods: Pods,
    /// Meshed pods past `max_pods`.
    over_limit: Vec<Key>,
    resources: HashMap<Key, Resource>,
    edges: HashMap<EdgeKey, EdgeState>,
    pod_edges: HashMap<EdgeKey, EdgeState<Counts>>,
    routes: HashMap<RouteKey, RouteState>,
    backends: HashMap<Key, Backends>,
    acc: CycleAcc,
    /// Latency bucket bounds of every track.
    bounds: Bounds,
    /// Histogram bounds of the pods' last values.
    les: Les,
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
            pods: Pods::default(),
            over_limit: Vec::new(),
            resources: HashMap::new(),
            edges: HashMap::new(),
            pod_edges: HashMap::new(),
            routes: HashMap::new(),
            backends: HashMap::new(),
            acc: CycleAcc::default(),
            bounds: Bounds::default(),
            les: Les::default(),
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
        self.over_limit.clear();
        let mut old = std::mem::take(&mut self.pods.list);
        let mut list = Vec::with_capacity(snapshot.meshed.len().min(self.config.max_pods));
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
            let fresh = PodState::new(target.ip, target.admin_port);
            let mut pod = match old.binary_search_by(|(k, _)| {
                (&*k.namespace, &*k.name).cmp(&(&*key.namespace, &*key.name))
            }) {
                Ok(at) => std::mem::replace(&mut old[at].1, fresh),
                Err(_) => fresh,
            };
            pod.workload = workload;
            (pod.ip, pod.admin_port) = (target.ip, target.admin_port);
            list.push((key, pod));
        }
        // Pods gone from the snapshot are dropped with their counters.
        drop(old);
        list.sort_by(|(a, _), (b, _)| (&*a.namespace, &*a.name).cmp(&(&*b.namespace, &*b.name)));
        list.dedup_by(|(a, _), (b, _)| a == b);
        self.pods.list = list;
        self.workloads.clear();
        for (w, n) in &snapshot.pods_per_workload {
            let workload = self.strings.key(&w.kind, &w.namespace, &w.name);
            self.workloads.push(WorkloadPods { workload, pods: *n });
        }
    }

    fn pod_index(&self, pod: &ResourceRef) -> Option<usize> {
        self.pods.find(&pod.namespace, &pod.name)
    }

    /// One pod's page, read at `at_ms` (Unix ms). A pod not among this
    /// cycle's recorded pods is ignored (counted: [`Mesh::ignored_pages`]).
    pub fn record_page(&mut self, pod: &ResourceRef, at_ms: u64, page: Page) {
        let Some(i) = self.pod_index(pod) else {
            self.ignored_pages += 1;
            return;
        };
        let at = at_ms / 1000;
        self.reads_ms += u128::from(at_ms);
        self.reads += 1;
        let cycle = self.cycle;
        // Buckets by series and `le` (those whose `le` has an index).
        let mut bucket_keys: Vec<((u64, u16), u32)> = Vec::new();
        let mut keyed = vec![false; page.samples.len()];
        for (i, s) in page.samples.iter().enumerate() {
            let Some((series, le)) = s.bucket else {
                continue;
            };
            if let Some(le) = self.les.index(le) {
                bucket_keys.push(((series, le), i as u32));
                keyed[i] = true;
            }
        }
        bucket_keys.sort_unstable_by_key(|b| b.0);
        let (key, state) = &mut self.pods.list[i];
        let key = key.clone();
        let baseline = state
            .last_ok_cycle
            .is_some_and(|c| cycle.saturating_sub(c.get()) <= REBASELINE_AFTER_CYCLES);
        let mut acc = PageAcc {
            dsts: vec![None; page.dsts.len()],
            routes: vec![None; page.routes.len()],
            ..PageAcc::default()
        };
        // Deltas first, by series (counters by id, buckets by series and
        // `le`), then folded in the page's order.
        let delta = |prev: Option<f64>, value: f64| match prev {
            _ if !baseline => 0,
            Some(p) if value >= p => count(value - p),
            // Reset (or new): all of it is new.
            _ => count(value),
        };
        let mut deltas = vec![0u64; page.samples.len()];
        let mut counters = Vec::with_capacity(page.samples.len());
        let (old_counters, old_buckets) = state.last.read();
        let mut old = old_counters.peekable();
        for (i, s) in page.samples.iter().enumerate() {
            if s.what.is_gauge() {
                deltas[i] = count(s.value);
            } else if !keyed[i] {
                while old.next_if(|l| l.id < s.id).is_some() {}
                let prev = old.next_if(|l| l.id == s.id).map(|l| l.value);
                deltas[i] = delta(prev, s.value);
                counters.push(Last {
                    id: s.id,
                    value: s.value,
                });
            }
        }
        let mut old = old_buckets.peekable();
        let mut buckets = Vec::with_capacity(bucket_keys.len());
        for &(key, i) in &bucket_keys {
            let s = &page.samples[i as usize];
            let (series, le) = key;
            while old.next_if(|o| (o.series, o.le) < key).is_some() {}
            let prev = old.next_if(|o| (o.series, o.le) == key).map(|o| o.value);
            deltas[i as usize] = delta(prev, s.value);
            buckets.push(LastBucket {
                series,
                le,
                value: s.value,
            });
        }
        drop(old);
        for (s, n) in page.samples.iter().zip(&deltas) {
            acc.add(&page, &s.what, *n);
        }
        state.last.set(&counters, &buckets);
        state.last_ok_cycle = NonZeroU64::new(cycle);
        state.last_attempt_at = NonZeroU64::new(at.saturating_add(1));
        state.health = Health::Ok;
        state.failing = None;
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
        let Some(i) = self.pod_index(pod) else {
            return;
        };
        let at = at_ms / 1000;
        let state = &mut self.pods.list[i].1;
        state.health = Health::Unreachable;
        state.last_attempt_at = NonZeroU64::new(at.saturating_add(1));
        // An error message is shown, not stored at any length.
        let mut error = error;
        if error.len() > 512 {
            let mut cut = 512;
            while !error.is_char_boundary(cut) {
                cut -= 1;
            }
            error.truncate(cut);
        }
        let failures = state
            .failing
            .as_ref()
            .map_or(0, |f| f.failures)
            .saturating_add(1);
        state.failing = Some(Box::new(Failing {
            error: error.into_boxed_str(),
            failures,
            next_attempt_at: next_attempt_in_secs.map(|s| at.saturating_add(s)),
        }));
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
            &mut self.strings,
        );
        fold_edges(
            &mut self.pod_edges,
            acc.pod_edges,
            self.config.pod_edge_keep(),
            cycle,
            max,
            &mut dropped,
            &mut self.bounds,
            &mut self.strings,
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
        let pods = self.pods.heap_bytes();
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
                .map(EdgeState::heap_bytes)
                .sum::<usize>()
            + self
                .pod_edges
                .values()
                .map(EdgeState::heap_bytes)
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
            + self.les.heap_bytes()
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
fn push(track: &mut Option<Track>, acc: Option<&Acc>, keep: Keep, bounds: &mut Bounds) {
    match track {
        Some(t) => t.push(acc, keep, bounds),
        None => {
            if let Some(acc) = acc {
                let mut t = Track::new(keep);
                t.push(Some(acc), keep, bounds);
                *track = Some(t);
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn fold_edges<H: History>(
    edges: &mut HashMap<EdgeKey, EdgeState<H>>,
    mut acc: HashMap<EdgeKey, EdgeAcc>,
    keep: Keep,
    cycle: u64,
    max: usize,
    dropped: &mut u64,
    bounds: &mut Bounds,
    strings: &mut Strings,
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
                    track: H::default(),
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
            // Kept as the mesh's own strings (a page's die with it), the
            // pair shared: thousands of edges see a few identities.
            let (mut server_id, mut reason) = e.tls.seen.as_deref().map_or((None, None), |s| {
                (s.server_id.clone(), s.plain_reason.clone())
            });
            if seen.mtls {
                e.tls.last_mtls = NonZeroU64::new(cycle);
                if let Some(id) = &a.tls.server_id {
                    server_id = Some(strings.intern(id));
                }
            }
            if seen.plain {
                e.tls.last_plain = NonZeroU64::new(cycle);
                reason = a.tls.plain_reason.as_deref().map(|r| strings.intern(r));
            }
            let now = TlsSeen {
                server_id,
                plain_reason: reason,
            };
            if e.tls.seen.as_deref() != Some(&now) {
                e.tls.seen = (now != TlsSeen::default()).then(|| strings.tls_seen(now));
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
