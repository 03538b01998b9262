//! The collector: every `--scrape-interval`, on a fixed schedule, the meshed
//! pods of the index are scraped (at most `--scrape-concurrency` at once,
//! each within `--scrape-timeout`) and their pages recorded into the
//! [`Mesh`], or, with `--prometheus-url`, one federation page is.
//!
//! Pages are fetched and parsed on tasks of their own, outside the mesh's
//! lock; the lock is held only to record a parsed page (and by the API's
//! queries). A pod whose scrape fails is retried after 1, 2, 4 ... intervals
//! (at most `--max-backoff-intervals`, 30), each delay jittered down by up to
//! half, differently per pod, so pods that failed together (a node lost) are
//! not retried together; meanwhile the mesh shows it unreachable with the
//! reason and the time to its next attempt.

use ballast_admin::{MemoryBudget, Pressure};
use std::collections::HashMap;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ballast_serve::GaugeGuard;
use ballast_vizcore::api::ResourceRef;
use ballast_vizcore::expo::{self, Limits, Page, PageParser};
use ballast_vizcore::mesh::Mesh;
use ballast_vizcore::targets::PodTarget;
use bytes::Bytes;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::metrics::VizMetrics;
use crate::prometheus::Federation;
use crate::scrape::{self, FetchError};
use crate::Targets;

pub const DEFAULT_SCRAPE_INTERVAL: Duration = Duration::from_secs(10);
pub const DEFAULT_SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);
pub const DEFAULT_SCRAPE_CONCURRENCY: usize = 64;
pub const DEFAULT_MAX_PAGE_BYTES: usize = 8 * 1024 * 1024;
pub const DEFAULT_MAX_PODS: usize = 10_000;
pub const DEFAULT_MAX_BACKOFF_INTERVALS: u32 = 30;
/// Pages fetched whole (a [`Fetch`] without its own [`Fetch::fetch_page`])
/// up to this size are parsed on the scrape's own task; larger ones on the
/// blocking pool, so a big page never stalls a runtime worker. ([`HttpFetch`]
/// parses each read buffer, [`SCRAPE_READ_BUFFER_BYTES`], as it comes.) The
/// parser reads ~108 MB/s (release build, a 430 KB page of a proxy with 30
/// destinations: 4 ms), so the inline case holds a worker 2.5 ms at most,
/// less than a hop to the blocking pool costs for the usual 10-100 KiB page.
pub const INLINE_PARSE_BYTES: usize = 256 * 1024;

/// The collector's settings (each a flag of `ballast viz`).
#[derive(Clone, Debug)]
pub struct CollectorConfig {
    pub interval: Duration,
    /// Per scrape, connect to last byte; less than `interval`.
    pub timeout: Duration,
    /// Scrapes in flight at most.
    pub concurrency: usize,
    /// A larger page is a failed scrape; the read stops there.
    pub max_page_bytes: usize,
    /// Meshed pods scraped at most (the first by namespace and name); the
    /// rest are counted in `viz_pods_over_limit`.
    pub max_pods: usize,
    /// The longest backoff of a failing pod, in intervals.
    pub max_backoff_intervals: u32,
    /// The parser's bounds.
    pub limits: Limits,
    /// The process's memory budget: near its limit pods not scraped yet
    /// are not taken on; at it, a twentieth of the scraped pods is let go
    /// each cycle (the last by namespace and name).
    pub memory: MemoryBudget,
}

impl Default for CollectorConfig {
    fn default() -> Self {
        Self {
            interval: DEFAULT_SCRAPE_INTERVAL,
            timeout: DEFAULT_SCRAPE_TIMEOUT,
            concurrency: DEFAULT_SCRAPE_CONCURRENCY,
            max_page_bytes: DEFAULT_MAX_PAGE_BYTES,
            max_pods: DEFAULT_MAX_PODS,
            max_backoff_intervals: DEFAULT_MAX_BACKOFF_INTERVALS,
            limits: Limits::default(),
            memory: MemoryBudget::unstarted(None),
        }
    }
}

/// Unix seconds, read from tokio's clock (so paused-clock tests move it)
/// anchored to the wall clock at start.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    unix_at_start: Duration,
    start: Instant,
}

impl Clock {
    pub fn new() -> Self {
        Self {
            unix_at_start: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default(),
            start: Instant::now(),
        }
    }

    pub fn now_unix(&self) -> u64 {
        (self.unix_at_start + self.start.elapsed()).as_secs()
    }

    /// Unix milliseconds: when a page was read, at the resolution rates need.
    pub fn now_unix_ms(&self) -> u64 {
        u64::try_from((self.unix_at_start + self.start.elapsed()).as_millis()).unwrap_or(u64::MAX)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

/// Why a scrape gave no page, as the mesh shows it.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("unreadable page: {0}")]
    Parse(#[from] expo::ParseError),
    /// The parser's task ended without an answer (it panicked).
    #[error("the page parser failed")]
    ParserFailed,
}

impl ScrapeError {
    /// The `result` label of `viz_scrapes_total`.
    pub fn result_label(&self) -> &'static str {
        match self {
            ScrapeError::Fetch(e) => e.result_label(),
            ScrapeError::Timeout(_) => "timeout",
            ScrapeError::Parse(_) | ScrapeError::ParserFailed => "parse_error",
        }
    }
}

pub type FetchFuture = Pin<Box<dyn Future<Output = Result<Bytes, FetchError>> + Send>>;

/// A page fetched and parsed: the body's bytes read (also when the page
/// was cut at the bound, or did not parse), and the page.
pub type PageFuture = Pin<Box<dyn Future<Output = (usize, Result<Page, ScrapeError>)> + Send>>;

/// The size of a scrape's read buffer: what a scrape holds of its page
/// while the parser reads it (hyper's own buffer grows to about 400 KiB,
/// and the page was held whole besides).
pub const SCRAPE_READ_BUFFER_BYTES: usize = 16 * 1024;

/// How one pod's page is fetched: an HTTP GET of its proxy's `/metrics`
/// ([`HttpFetch`]), or a fake in tests. The collector bounds its time.
pub trait Fetch: Send + Sync + 'static {
    fn fetch(&self, target: &PodTarget, max_bytes: usize) -> FetchFuture;

    /// The page, parsed. By default [`Fetch::fetch`] then [`parse`];
    /// [`HttpFetch`] parses the body as it arrives.
    fn fetch_page(&self, target: &PodTarget, max_bytes: usize, limits: Limits) -> PageFuture {
        let body = self.fetch(target, max_bytes);
        let admin_port = target.admin_port;
        Box::pin(async move {
            match body.await {
                Ok(body) => (body.len(), parse(body, limits, admin_port).await),
                Err(error) => (read_of(&error), Err(error.into())),
            }
        })
    }
}

/// Bytes a failed fetch read (a page cut at the bound).
fn read_of(error: &FetchError) -> usize {
    match error {
        FetchError::TooLarge { read, .. } => *read,
        _ => 0,
    }
}

/// `GET http://IP:ADMIN_PORT/metrics`.
#[derive(Clone, Copy, Debug, Default)]
pub struct HttpFetch;

/// A page parsed as its body arrives.
struct Parsing(PageParser);

impl scrape::BodySink for Parsing {
    fn data(&mut self, piece: &[u8]) {
        self.0.feed(piece);
    }
}

impl Fetch for HttpFetch {
    fn fetch(&self, target: &PodTarget, max_bytes: usize) -> FetchFuture {
        let addr = SocketAddr::new(target.ip, target.admin_port);
        Box::pin(async move { scrape::get(addr, &addr.to_string(), "/metrics", max_bytes).await })
    }

    fn fetch_page(&self, target: &PodTarget, max_bytes: usize, limits: Limits) -> PageFuture {
        let addr = SocketAddr::new(target.ip, target.admin_port);
        let admin_port = target.admin_port;
        Box::pin(async move {
            let mut parsing = Parsing(PageParser::new(limits, Some(admin_port)));
            let read = scrape::get_into(
                addr,
                &addr.to_string(),
                "/metrics",
                max_bytes,
                Some(SCRAPE_READ_BUFFER_BYTES),
                &mut parsing,
            )
            .await;
            match read {
                // A page that does not parse is still one whose bytes were
                // read whole: a page over the bound is `too_large` first.
                Ok(read) => (read, parsing.0.finish().map_err(ScrapeError::from)),
                Err(error) => (read_of(&error), Err(error.into())),
            }
        })
    }
}

/// Where pages come from.
pub enum Source {
    /// Each meshed pod's proxy.
    Scrape(Arc<dyn Fetch>),
    /// One Prometheus' `/federate`.
    Prometheus(Federation),
}

/// A pod's scrape history as the schedule needs it.
#[derive(Clone, Copy, Debug, Default)]
struct PodState {
    /// Failures in a row (0: the last scrape answered, or none yet).
    failures: u32,
    /// The first cycle it is scraped again.
    next_cycle: u64,
    /// A scrape of it has answered at least once since it appeared.
    answered: bool,
}

/// Each scraped pod's [`PodState`], sorted by namespace and name: two
/// short strings and 16 bytes a pod, no table, found by a binary search.
#[derive(Debug, Default)]
struct Schedules {
    list: Vec<(Box<str>, Box<str>, PodState)>,
}

impl Schedules {
    fn find(&self, pod: &ResourceRef) -> Option<usize> {
        self.list
            .binary_search_by(|(ns, name, _)| {
                (&**ns, &**name).cmp(&(pod.namespace.as_str(), pod.name.as_str()))
            })
            .ok()
    }

    fn get(&self, pod: &ResourceRef) -> Option<&PodState> {
        self.find(pod).map(|i| &self.list[i].2)
    }

    fn get_mut(&mut self, pod: &ResourceRef) -> Option<&mut PodState> {
        self.find(pod).map(|i| &mut self.list[i].2)
    }

    fn contains(&self, pod: &ResourceRef) -> bool {
        self.find(pod).is_some()
    }

    fn len(&self) -> usize {
        self.list.len()
    }

    fn values(&self) -> impl Iterator<Item = &PodState> {
        self.list.iter().map(|(_, _, s)| s)
    }

    /// The pods of `targets`, with what is known of each; the others are
    /// forgotten with their backoff.
    fn renew(&mut self, targets: &[PodTarget]) {
        let same = targets.len() == self.list.len()
            && targets.iter().zip(&self.list).all(|(t, (ns, name, _))| {
                t.pod.namespace.as_str() == &**ns && t.pod.name.as_str() == &**name
            });
        if same {
            return;
        }
        let mut list: Vec<(Box<str>, Box<str>, PodState)> = targets
            .iter()
            .map(|t| {
                let state = self.get(&t.pod).copied().unwrap_or_default();
                (
                    t.pod.namespace.as_str().into(),
                    t.pod.name.as_str().into(),
                    state,
                )
            })
            .collect();
        list.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        list.dedup_by(|a, b| (&a.0, &a.1) == (&b.0, &b.1));
        self.list = list;
    }
}

/// The collector, shared with the server (the mesh and readiness).
pub struct Collector {
    config: CollectorConfig,
    mesh: Arc<Mutex<Mesh>>,
    targets: Targets,
    source: Source,
    metrics: VizMetrics,
    clock: Clock,
    ready: Arc<AtomicBool>,
    pods: Schedules,
    /// Cycles run so far; backoffs count in cycles.
    cycle: u64,
}

/// Locks the mesh; a panic elsewhere while it was held leaves state that is
/// still well-formed (each call is one update), so poisoning is ignored.
pub fn lock(mesh: &Mutex<Mesh>) -> MutexGuard<'_, Mesh> {
    mesh.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Collector {
    pub fn new(
        config: CollectorConfig,
        mesh: Arc<Mutex<Mesh>>,
        targets: Targets,
        source: Source,
        metrics: VizMetrics,
        clock: Clock,
    ) -> Self {
        let name = match source {
            Source::Scrape(_) => "scrape",
            Source::Prometheus(_) => "prometheus",
        };
        lock(&mesh).set_source(name);
        Self {
            config,
            mesh,
            targets,
            source,
            metrics,
            clock,
            ready: Arc::new(AtomicBool::new(false)),
            pods: Schedules::default(),
            cycle: 0,
        }
    }

    /// Set once the first cycle has completed (`/ready`).
    pub fn ready_flag(&self) -> Arc<AtomicBool> {
        self.ready.clone()
    }

    /// Runs cycles on the fixed schedule (start + k × interval) until
    /// `shutdown`. A cycle longer than the interval makes the ticks it
    /// overlapped be skipped (the next cycle starts at the next tick of the
    /// schedule, not at once) and is counted in `viz_scrape_cycles_overrun`.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        let mut shutdown = pin!(shutdown);
        let start = Instant::now();
        let interval = self.config.interval.as_nanos().max(1);
        let mut tick: u128 = 0;
        loop {
            let at =
                start + Duration::from_nanos(u64::try_from(interval * tick).unwrap_or(u64::MAX));
            tokio::select! {
                biased;
                () = &mut shutdown => return,
                () = tokio::time::sleep_until(at) => {}
            }
            tokio::select! {
                biased;
                () = &mut shutdown => return,
                () = self.cycle() => {}
            }
            let elapsed = start.elapsed().as_nanos();
            let next = elapsed.div_ceil(interval).max(tick + 1);
            if next > tick + 1 {
                self.metrics.cycles_overrun.inc();
                tracing::warn!(
                    took = ?Duration::from_nanos(u64::try_from(elapsed - interval * tick).unwrap_or(u64::MAX)),
                    interval = ?self.config.interval,
                    skipped = u64::try_from(next - tick - 1).unwrap_or(u64::MAX),
                    "scrape cycle overran the interval; skipping to the next tick"
                );
            }
            tick = next;
        }
    }

    /// One cycle: the pods of now, their due scrapes, one history point.
    pub async fn cycle(&mut self) {
        let started = Instant::now();
        let mut snapshot = (self.targets)();
        self.relieve_memory(&mut snapshot.meshed);
        let over = snapshot.meshed.len().saturating_sub(self.config.max_pods);
        self.metrics
            .pods_over_limit
            .set(i64::try_from(over).unwrap_or(i64::MAX));
        // The mesh keeps the same first `max_pods` (the snapshot is sorted)
        // and lists the rest as over the limit.
        lock(&self.mesh).begin_cycle(&snapshot);
        snapshot.meshed.truncate(self.config.max_pods);
        // Pods gone from the index are forgotten with their backoff.
        self.pods.renew(&snapshot.meshed);

        match &self.source {
            Source::Scrape(fetch) => {
                let fetch = fetch.clone();
                self.scrape_all(&fetch, &snapshot.meshed).await;
            }
            Source::Prometheus(federation) => {
                let result = federation.fetch(&self.metrics, &snapshot.meshed).await;
                self.record_federation(&snapshot.meshed, result);
            }
        }

        let took = started.elapsed();
        let at = self.clock.now_unix_ms();
        let heap = {
            let mut mesh = lock(&self.mesh);
            mesh.end_cycle(at, took.as_secs_f64() * 1000.0);
            mesh.heap_bytes()
        };
        // What the cycle needed and no longer does (its read buffers and
        // parses, the snapshot, the cycle's sums) goes back to the kernel
        // now, not over the allocator's decay time: between cycles the
        // process holds what it keeps.
        drop(snapshot);
        ballast_admin::release_unused_memory();
        self.metrics
            .mesh_heap_bytes
            .set(i64::try_from(heap).unwrap_or(i64::MAX));
        self.metrics.cycle_duration.set(took.as_secs_f64());
        self.metrics.cycles.inc();
        let (mut ok, mut unreachable) = (0, 0);
        for state in self.pods.values() {
            if state.failures > 0 {
                unreachable += 1;
            } else if state.answered {
                ok += 1;
            }
        }
        self.metrics.set_pods("ok", ok);
        self.metrics.set_pods("unreachable", unreachable);
        self.metrics
            .set_pods("pending", self.pods.len() - ok - unreachable);
        self.cycle += 1;
        self.ready.store(true, Ordering::Release);
    }

    /// Under memory pressure, only pods already scraped stay (the others
    /// are refused, counted each cycle as `memory_refused_total{api="scrape"}`);
    /// at the limit, a twentieth of those (one at least) is let go too,
    /// counted as `memory_closed_total{api="scrape"}`.
    fn relieve_memory(&self, meshed: &mut Vec<PodTarget>) {
        let memory = &self.config.memory;
        let pressure = memory.pressure();
        if pressure == Pressure::Normal {
            return;
        }
        let listed = meshed.len();
        meshed.retain(|t| self.pods.contains(&t.pod));
        memory.refused("scrape", (listed - meshed.len()) as u64);
        if pressure == Pressure::Closing {
            let known = meshed.len().min(self.config.max_pods);
            let keep = known.saturating_sub((known / 20).max(1));
            memory.closed("scrape", known.saturating_sub(keep) as u64);
            meshed.truncate(keep);
        }
    }

    async fn scrape_all(&mut self, fetch: &Arc<dyn Fetch>, targets: &[PodTarget]) {
        let cycle = self.cycle;
        let due: Vec<&PodTarget> = targets
            .iter()
            .filter(|t| self.pods.get(&t.pod).is_none_or(|s| s.next_cycle <= cycle))
            .collect();
        let mut due = due.into_iter();
        let mut running = JoinSet::new();
        let concurrency = self.config.concurrency.max(1);
        loop {
            while running.len() < concurrency {
                let Some(target) = due.next() else { break };
                let guard = GaugeGuard::new(&self.metrics.scrapes_in_flight);
                running.spawn(scrape_one(
                    fetch.clone(),
                    target.pod.clone(),
                    target.clone(),
                    self.config.clone(),
                    self.metrics.clone(),
                    guard,
                ));
            }
            let Some(done) = running.join_next().await else {
                break;
            };
            match done {
                Ok((pod, result)) => self.record(pod, result),
                // A scrape task does not panic on a peer's bytes; if one
                // did, its pod is simply not recorded this cycle.
                Err(error) => tracing::error!(%error, "scrape task failed"),
            }
        }
    }

    fn record(&mut self, pod: ResourceRef, result: Result<Page, ScrapeError>) {
        // The page's time is when it arrived: a slow pod's late page is
        // stamped late, and no other pod's is.
        let at = self.clock.now_unix_ms();
        let Some(state) = self.pods.get_mut(&pod) else {
            return;
        };
        match result {
            Ok(page) => {
                self.metrics.scrape_result("ok");
                *state = PodState {
                    failures: 0,
                    next_cycle: 0,
                    answered: true,
                };
                lock(&self.mesh).record_page(&pod, at, page);
            }
            Err(error) => {
                self.metrics.scrape_result(error.result_label());
                state.failures = state.failures.saturating_add(1);
                let delay =
                    backoff_intervals(&pod, state.failures, self.config.max_backoff_intervals);
                state.next_cycle = self.cycle + u64::from(delay);
                let next_in =
                    u64::from(delay).saturating_mul(self.config.interval.as_secs().max(1));
                tracing::debug!(pod = %pod.name, namespace = %pod.namespace, %error, failures = state.failures, "scrape failed");
                lock(&self.mesh).record_failure(&pod, at, error.to_string(), Some(next_in));
            }
        }
    }

    fn record_federation(
        &mut self,
        targets: &[PodTarget],
        result: Result<Vec<(ResourceRef, Page)>, ScrapeError>,
    ) {
        let at = self.clock.now_unix_ms();
        match result {
            Ok(pages) => {
                self.metrics.scrape_result("ok");
                // Whether Prometheus says which proxies it reaches: with no
                // `up` of the proxy job at all (a scrape job of another
                // name), every pod is taken as reached.
                let reports_up = pages.iter().any(|(_, p)| p.prometheus_up().is_some());
                let mut pages: HashMap<ResourceRef, Page> = pages.into_iter().collect();
                let mut mesh = lock(&self.mesh);
                for target in targets {
                    let page = pages.remove(&target.pod).unwrap_or_default();
                    let down = match page.prometheus_up() {
                        Some(false) => Some("prometheus: its last scrape of this proxy failed (up 0)"),
                        None if reports_up => Some("prometheus: no scrape target for this proxy (not discovered yet, or not scraped)"),
                        // A pod with nothing of interest yet: an empty
                        // page, not a failure.
                        _ => None,
                    };
                    let state = self.pods.get_mut(&target.pod);
                    match down {
                        None => {
                            mesh.record_page(&target.pod, at, page);
                            if let Some(state) = state {
                                *state = PodState {
                                    failures: 0,
                                    next_cycle: 0,
                                    answered: true,
                                };
                            }
                        }
                        Some(reason) => {
                            let next_in = self.config.interval.as_secs().max(1);
                            mesh.record_failure(&target.pod, at, reason.to_string(), Some(next_in));
                            if let Some(state) = state {
                                state.failures = state.failures.saturating_add(1);
                            }
                        }
                    }
                }
            }
            Err(error) => {
                self.metrics.scrape_result(error.result_label());
                tracing::warn!(%error, "cannot read Prometheus' federation page");
                let reason = format!("prometheus: {error}");
                let next_in = self.config.interval.as_secs().max(1);
                let mut mesh = lock(&self.mesh);
                for target in targets {
                    mesh.record_failure(&target.pod, at, reason.clone(), Some(next_in));
                    if let Some(state) = self.pods.get_mut(&target.pod) {
                        state.failures = state.failures.saturating_add(1);
                    }
                }
            }
        }
    }
}

/// Fetches and parses one pod's page within the timeout; the parse happens
/// here, on the scrape's task (as the body arrives, a read buffer at a
/// time, with [`HttpFetch`]), never under the mesh's lock.
async fn scrape_one(
    fetch: Arc<dyn Fetch>,
    pod: ResourceRef,
    target: PodTarget,
    config: CollectorConfig,
    metrics: VizMetrics,
    _in_flight: GaugeGuard,
) -> (ResourceRef, Result<Page, ScrapeError>) {
    let started = Instant::now();
    let fetched = tokio::time::timeout(
        config.timeout,
        fetch.fetch_page(&target, config.max_page_bytes, config.limits),
    )
    .await;
    metrics
        .scrape_duration
        .observe(started.elapsed().as_secs_f64());
    match fetched {
        Err(_) => (pod, Err(ScrapeError::Timeout(config.timeout))),
        Ok((read, page)) => {
            metrics.scrape_bytes.inc_by(read as u64);
            (pod, page)
        }
    }
}

/// Parses `body`, the page of a proxy whose admin port is `admin_port`:
/// inline when small, on the blocking pool when large.
pub async fn parse(body: Bytes, limits: Limits, admin_port: u16) -> Result<Page, ScrapeError> {
    let admin = Some(admin_port);
    if body.len() <= INLINE_PARSE_BYTES {
        return expo::parse(&body, &limits, admin).map_err(ScrapeError::from);
    }
    match tokio::task::spawn_blocking(move || expo::parse(&body, &limits, admin)).await {
        Ok(parsed) => parsed.map_err(ScrapeError::from),
        Err(error) => {
            tracing::error!(%error, "page parser task failed");
            Err(ScrapeError::ParserFailed)
        }
    }
}

/// How many intervals a pod waits after its `failures`-th failure in a row:
/// 1, 2, 4 ... capped at `max`, then lowered by up to half of it, by an
/// amount fixed per pod and failure count (so pods that failed together
/// spread out, and a test can predict it).
pub fn backoff_intervals(pod: &ResourceRef, failures: u32, max: u32) -> u32 {
    let max = max.max(1);
    let base = 1u32
        .checked_shl(failures.saturating_sub(1))
        .unwrap_or(u32::MAX)
        .min(max);
    let span = base / 2;
    if span == 0 {
        return base;
    }
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    pod.hash(&mut hasher);
    failures.hash(&mut hasher);
    base - (hasher.finish() % (u64::from(span) + 1)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use ballast_vizcore::mesh::MeshConfig;
    use ballast_vizcore::targets::Snapshot;
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::atomic::AtomicUsize;

    fn pod(name: &str) -> PodTarget {
        PodTarget {
            pod: ResourceRef {
                kind: "pod".into(),
                namespace: "ns".into(),
                name: name.into(),
            },
            workload: None,
            ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            admin_port: 4191,
            tap_port: 4190,
            service_account: "default".into(),
        }
    }

    #[test]
    fn schedules_keep_each_pods_state_while_it_stays_and_find_it_by_name() {
        let mut s = Schedules::default();
        let targets: Vec<PodTarget> = ["c", "a", "b"].iter().map(|n| pod(n)).collect();
        s.renew(&targets);
        assert_eq!(s.len(), 3);
        let names: Vec<&str> = s.list.iter().map(|(_, n, _)| &**n).collect();
        assert_eq!(names, ["a", "b", "c"]);
        s.get_mut(&pod("b").pod).expect("b").failures = 4;
        assert!(!s.contains(&pod("d").pod));
        let other_ns = ResourceRef {
            namespace: "other".into(),
            ..pod("b").pod
        };
        assert!(s.get(&other_ns).is_none());
        // The same pods again: nothing is made anew.
        let before = s.list.as_ptr();
        let sorted: Vec<PodTarget> = ["a", "b", "c"].iter().map(|n| pod(n)).collect();
        s.renew(&sorted);
        assert_eq!(s.list.as_ptr(), before);
        // One gone, one new: the state of those that stay is kept.
        s.renew(&[pod("b"), pod("d")]);
        assert_eq!(s.len(), 2);
        assert_eq!(s.get(&pod("b").pod).map(|p| p.failures), Some(4));
        assert_eq!(s.get(&pod("d").pod).map(|p| p.failures), Some(0));
        assert!(s.get(&pod("a").pod).is_none());
        assert_eq!(s.values().map(|p| p.failures).sum::<u32>(), 4);
    }

    /// How each fake pod answers.
    #[derive(Clone, Copy)]
    enum Behaviour {
        Answer { after: Duration },
        Fail,
        Hang,
    }

    /// Records every fetch (pod, when) and the most fetches in flight at once.
    struct Fake {
        behaviour: HashMap<String, Behaviour>,
        start: Instant,
        calls: Mutex<Vec<(String, Duration)>>,
        in_flight: AtomicUsize,
        max_in_flight: AtomicUsize,
    }

    impl Fake {
        fn new(pods: &[(&str, Behaviour)]) -> Arc<Self> {
            Arc::new(Self {
                behaviour: pods.iter().map(|(n, b)| (n.to_string(), *b)).collect(),
                start: Instant::now(),
                calls: Mutex::new(Vec::new()),
                in_flight: AtomicUsize::new(0),
                max_in_flight: AtomicUsize::new(0),
            })
        }

        fn calls_of(&self, name: &str) -> Vec<Duration> {
            self.calls
                .lock()
                .unwrap()
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(_, t)| *t)
                .collect()
        }
    }

    struct InFlight(Arc<Fake>);
    impl Drop for InFlight {
        fn drop(&mut self) {
            self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
    }

    struct FakeFetch(Arc<Fake>);

    impl Fetch for FakeFetch {
        fn fetch(&self, target: &PodTarget, _max: usize) -> FetchFuture {
            let fake = self.0.clone();
            let name = target.pod.name.clone();
            fake.calls
                .lock()
                .unwrap()
                .push((name.clone(), fake.start.elapsed()));
            let now = fake.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            fake.max_in_flight.fetch_max(now, Ordering::SeqCst);
            let behaviour = fake.behaviour[&name];
            Box::pin(async move {
                let _held = InFlight(fake);
                match behaviour {
                    Behaviour::Answer { after } => {
                        tokio::time::sleep(after).await;
                        Ok(Bytes::from_static(b"# EOF\n"))
                    }
                    Behaviour::Fail => Err(FetchError::Connect(std::io::Error::new(
                        std::io::ErrorKind::ConnectionRefused,
                        "refused",
                    ))),
                    Behaviour::Hang => std::future::pending().await,
                }
            })
        }
    }

    fn collector(fake: &Arc<Fake>, config: CollectorConfig) -> (Collector, VizMetrics) {
        let names: Vec<String> = {
            let mut n: Vec<String> = fake.behaviour.keys().cloned().collect();
            n.sort();
            n
        };
        let targets: Targets = Arc::new(move || Snapshot {
            meshed: names.iter().map(|n| pod(n)).collect(),
            ..Snapshot::default()
        });
        let metrics = VizMetrics::default();
        let mesh = Arc::new(Mutex::new(Mesh::new(MeshConfig {
            max_pods: config.max_pods,
            ..MeshConfig::default()
        })));
        let c = Collector::new(
            config,
            mesh,
            targets,
            Source::Scrape(Arc::new(FakeFetch(fake.clone()))),
            metrics.clone(),
            Clock::new(),
        );
        (c, metrics)
    }

    fn count(metrics: &VizMetrics, result: &'static str) -> u64 {
        metrics
            .scrapes
            .get_or_create(&crate::metrics::ResultLabels { result })
            .get()
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[tokio::test(start_paused = true)]
    async fn cycles_start_on_a_fixed_schedule_whatever_the_scrapes_take() {
        let fake = Fake::new(&[("slow", Behaviour::Answer { after: secs(3) })]);
        let (c, metrics) = collector(&fake, CollectorConfig::default());
        tokio::spawn(c.run(tokio::time::sleep(secs(45))))
            .await
            .unwrap();
        // Started at 0, 10, 20, 30, 40: not 0, 13, 26 (interval after finish).
        assert_eq!(
            fake.calls_of("slow"),
            [0, 10, 20, 30, 40].map(secs).to_vec()
        );
        assert_eq!(metrics.cycles.get(), 5);
        assert_eq!(metrics.cycles_overrun.get(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cycle_that_overruns_skips_the_ticks_it_overlapped_and_is_counted() {
        let fake = Fake::new(&[("slower", Behaviour::Answer { after: secs(15) })]);
        let config = CollectorConfig {
            timeout: secs(20),
            ..CollectorConfig::default()
        };
        let (c, metrics) = collector(&fake, config);
        tokio::spawn(c.run(tokio::time::sleep(secs(61))))
            .await
            .unwrap();
        // Each cycle takes 15 s: the tick at 10 is skipped, the next starts at 20.
        assert_eq!(fake.calls_of("slower"), [0, 20, 40, 60].map(secs).to_vec());
        assert_eq!(metrics.cycles.get(), 3);
        assert_eq!(metrics.cycles_overrun.get(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_pod_costs_one_slot_for_the_timeout_and_others_are_scraped() {
        let mut pods = vec![("hang", Behaviour::Hang)];
        let names: Vec<String> = (0..10).map(|i| format!("ok-{i}")).collect();
        for n in &names {
            pods.push((
                n.as_str(),
                Behaviour::Answer {
                    after: Duration::from_millis(100),
                },
            ));
        }
        let fake = Fake::new(&pods);
        let config = CollectorConfig {
            concurrency: 3,
            ..CollectorConfig::default()
        };
        let (mut c, metrics) = collector(&fake, config);
        let started = Instant::now();
        c.cycle().await;
        // Ten answers at 100 ms, two slots free meanwhile: 500 ms of them;
        // the hanging one ends the cycle at its 5 s timeout, no later.
        assert_eq!(started.elapsed(), secs(5));
        assert_eq!(count(&metrics, "ok"), 10);
        assert_eq!(count(&metrics, "timeout"), 1);
        assert_eq!(fake.max_in_flight.load(Ordering::SeqCst), 3);
        assert_eq!(
            fake.in_flight.load(Ordering::SeqCst),
            0,
            "the hung fetch was dropped"
        );
        assert_eq!(metrics.scrapes_in_flight.get(), 0);
        assert_eq!(
            metrics
                .pods
                .get_or_create(&crate::metrics::StateLabels { state: "ok" })
                .get(),
            10
        );
        assert_eq!(
            metrics
                .pods
                .get_or_create(&crate::metrics::StateLabels {
                    state: "unreachable"
                })
                .get(),
            1
        );
        assert!(c.ready_flag().load(Ordering::Acquire));
        let pods = lock(&c.mesh).pods(None, c.clock.now_unix());
        let hang = pods
            .pods
            .iter()
            .find(|p| p.pod.name == "hang")
            .expect("the hanging pod is listed");
        assert_eq!(hang.state, "unreachable");
        assert_eq!(hang.last_error.as_deref(), Some("no answer within 5s"));
        assert_eq!(hang.consecutive_failures, 1);
        assert_eq!(hang.next_attempt_in_secs, Some(10));
        let ok = pods.pods.iter().filter(|p| p.state == "ok").count();
        assert_eq!(ok, 10);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_pod_backs_off_by_doubling_intervals_up_to_the_cap() {
        let fake = Fake::new(&[
            (
                "good",
                Behaviour::Answer {
                    after: Duration::ZERO,
                },
            ),
            ("bad", Behaviour::Fail),
        ]);
        let config = CollectorConfig {
            max_backoff_intervals: 8,
            ..CollectorConfig::default()
        };
        let (mut c, metrics) = collector(&fake, config);
        let cycles = 60u64;
        for _ in 0..cycles {
            c.cycle().await;
            tokio::time::advance(secs(10)).await;
        }
        let interval = secs(10);
        let good = fake.calls_of("good");
        assert_eq!(
            good.len() as u64,
            cycles,
            "a healthy pod is scraped every cycle"
        );
        let bad: Vec<u64> = fake
            .calls_of("bad")
            .iter()
            .map(|t| t.as_secs() / interval.as_secs())
            .collect();
        // The gaps are exactly the schedule's, which is 1, then 1..=2,
        // 2..=4, 4..=8 and stays within 4..=8.
        let bad_pod = pod("bad").pod;
        let mut want = vec![0u64];
        let mut failures = 0;
        while let Some(&last) = want.last() {
            failures += 1;
            let next = last + u64::from(backoff_intervals(&bad_pod, failures, 8));
            if next >= cycles {
                break;
            }
            want.push(next);
        }
        assert_eq!(bad, want);
        let gaps: Vec<u64> = bad.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(gaps[0], 1);
        for (i, gap) in gaps.iter().enumerate() {
            let base = (1u64 << i).min(8);
            assert!((base.div_ceil(2)..=base).contains(gap), "gap {i} = {gap}");
        }
        assert!(
            bad.len() < 15,
            "no storm: {} attempts in {cycles} cycles",
            bad.len()
        );
        assert_eq!(count(&metrics, "connect_error"), bad.len() as u64);
    }

    /// Pods that answer at once.
    fn answering<'a>(names: &[&'a str]) -> Vec<(&'a str, Behaviour)> {
        names
            .iter()
            .map(|n| {
                (
                    *n,
                    Behaviour::Answer {
                        after: Duration::ZERO,
                    },
                )
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn pods_past_the_limit_are_not_scraped_and_are_counted() {
        let names = ["a", "b", "c", "d", "e"];
        let fake = Fake::new(&answering(&names));
        let config = CollectorConfig {
            max_pods: 3,
            ..CollectorConfig::default()
        };
        let (mut c, metrics) = collector(&fake, config);
        c.cycle().await;
        for (n, want) in [("a", 1), ("b", 1), ("c", 1), ("d", 0), ("e", 0)] {
            assert_eq!(fake.calls_of(n).len(), want, "{n}");
        }
        assert_eq!(metrics.pods_over_limit.get(), 2);
        assert_eq!(lock(&c.mesh).pods_over_limit(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn under_memory_pressure_new_pods_are_refused_and_at_the_limit_some_let_go() {
        let names = ["a", "b", "c", "d", "e"];
        let fake = Fake::new(&answering(&names));
        let memory = MemoryBudget::unstarted(Some(64 << 20));
        let config = CollectorConfig {
            interval: Duration::from_secs(1),
            memory: memory.clone(),
            ..CollectorConfig::default()
        };
        let (mut c, _metrics) = collector(&fake, config);
        memory.set(Pressure::Refusing);
        c.cycle().await;
        for n in names {
            assert!(fake.calls_of(n).is_empty(), "{n} taken on under pressure");
        }
        assert_eq!(lock(&c.mesh).pods_recorded(), 0);
        memory.set(Pressure::Normal);
        c.cycle().await;
        assert_eq!(lock(&c.mesh).pods_recorded(), 5);
        memory.set(Pressure::Closing);
        tokio::time::advance(Duration::from_secs(1)).await;
        c.cycle().await;
        // A twentieth of five, one at least: the last one goes.
        assert_eq!(lock(&c.mesh).pods_recorded(), 4);
        assert_eq!(
            fake.calls_of("e").len(),
            1,
            "e was let go, not scraped again"
        );
        assert_eq!(fake.calls_of("a").len(), 2);
    }

    #[test]
    fn backoff_is_jittered_per_pod_within_half_of_the_capped_doubling() {
        let pods: Vec<ResourceRef> = (0..200).map(|i| pod(&format!("p{i}")).pod).collect();
        for failures in 1..40 {
            let base = 1u32.checked_shl(failures - 1).unwrap_or(u32::MAX).min(30);
            let delays: Vec<u32> = pods
                .iter()
                .map(|p| backoff_intervals(p, failures, 30))
                .collect();
            for d in &delays {
                assert!(
                    (base.div_ceil(2)..=base).contains(d),
                    "failures {failures}: {d}"
                );
            }
            if base >= 8 {
                let distinct: std::collections::HashSet<_> = delays.iter().collect();
                assert!(
                    distinct.len() > base as usize / 4,
                    "spread at {failures}: {distinct:?}"
                );
            }
        }
        assert_eq!(backoff_intervals(&pods[0], 1, 30), 1);
        assert_eq!(backoff_intervals(&pods[0], 1, 0), 1);
    }
}
