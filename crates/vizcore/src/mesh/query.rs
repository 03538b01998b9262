//! The answers: the state as the api's owned types, sorted by namespace
//! and name.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::num::NonZeroU64;

use super::track::{cycle_secs, History, Track, Window};
use super::{
    kind, EdgeKey, EdgeState, Health, Key, Mesh, QueryError, Resource, RouteKey, RouteState,
    StatQuery, DEFAULT_WINDOW_SECS,
};
use crate::api::*;

/// `deploy`, `deployments`, `po`, `svc`, `ns`, `sts`, `ds`, `rt` ... to the api kind names.
pub fn canonical_kind(s: &str) -> Result<&'static str, QueryError> {
    Ok(match s.to_ascii_lowercase().as_str() {
        "ns" | "namespace" | "namespaces" => "namespace",
        "deploy" | "deployment" | "deployments" | "deploys" => "deployment",
        "sts" | "statefulset" | "statefulsets" => "statefulset",
        "ds" | "daemonset" | "daemonsets" => "daemonset",
        "job" | "jobs" => "job",
        "rs" | "replicaset" | "replicasets" => "replicaset",
        "po" | "pod" | "pods" => "pod",
        "svc" | "service" | "services" => "service",
        "rt" | "route" | "routes" => "route",
        _ => return Err(QueryError::UnknownKind(s.to_string())),
    })
}

/// A window in whole cycles.
#[derive(Clone, Copy, Debug)]
struct WindowSpec {
    cycles: usize,
    /// The nominal length (cycles × interval).
    secs: u64,
}

/// Which side of a resource its row shows.
struct Side<'a> {
    source: &'static str,
    track: Option<&'a Track>,
}

fn sort_rows(rows: &mut [StatRow]) {
    rows.sort_by(|a, b| {
        (&a.resource.namespace, &a.resource.name, &a.resource.kind).cmp(&(
            &b.resource.namespace,
            &b.resource.name,
            &b.resource.kind,
        ))
    });
}

fn sort_edges(edges: &mut [Edge]) {
    let key = |e: &Edge| {
        (
            e.src.namespace.clone(),
            e.src.name.clone(),
            e.dst.namespace.clone(),
            e.dst.name.clone(),
        )
    };
    edges.sort_by_key(key);
}

fn sort_routes(rows: &mut [RouteRow]) {
    rows.sort_by(|a, b| {
        (
            &a.parent.namespace,
            &a.parent.name,
            a.parent_port,
            &a.route.namespace,
            &a.route.name,
            &a.route.kind,
        )
            .cmp(&(
                &b.parent.namespace,
                &b.parent.name,
                b.parent_port,
                &b.route.namespace,
                &b.route.name,
                &b.route.kind,
            ))
    });
}

/// A route as a stat row's resource: kind `route`, in the route's
/// namespace (the parent's for a default route), `[default]` for a
/// proxy's default route.
fn route_ref(key: &RouteKey) -> ResourceRef {
    let namespace = if key.route.namespace.is_empty() {
        &key.parent.namespace
    } else {
        &key.route.namespace
    };
    let name = if &*key.route.kind == "default" {
        "[default]".to_string()
    } else {
        key.route.name.to_string()
    };
    ResourceRef {
        kind: kind::ROUTE.into(),
        namespace: namespace.to_string(),
        name,
    }
}

impl Mesh {
    fn window(&self, secs: Option<u64>) -> WindowSpec {
        let interval = self.config.interval();
        let secs = secs.unwrap_or(DEFAULT_WINDOW_SECS).max(1);
        let cycles = usize::try_from(secs.div_ceil(interval))
            .unwrap_or(usize::MAX)
            .clamp(1, self.config.max_window());
        WindowSpec {
            cycles,
            secs: cycles as u64 * interval,
        }
    }

    /// Seconds the newest `cycles` cycles covered (a thing younger than
    /// the window is measured over its own life, as Prometheus's `rate`
    /// over a young series is).
    fn covered_secs(&self, cycles: usize) -> f64 {
        let interval = self.config.interval();
        let have = cycles.min(self.times.len());
        if have == 0 {
            return (cycles.max(1) as u64 * interval) as f64;
        }
        (self.times.len() - have..self.times.len())
            .map(|i| cycle_secs(&self.times, i, interval))
            .sum()
    }

    fn golden<H: History>(&self, track: Option<&H>, w: &WindowSpec) -> Golden {
        let mut sum = Window::default();
        let mut cycles = w.cycles;
        if let Some(t) = track {
            t.add_window(w.cycles, &mut sum, &self.bounds);
            cycles = cycles.min(t.len()).max(1);
        }
        sum.golden(self.covered_secs(cycles))
    }

    fn spark(&self, track: Option<&Track>) -> Spark {
        let empty = Track::default();
        track
            .unwrap_or(&empty)
            .spark(&self.times, self.config.interval(), &self.bounds)
    }

    fn side<'a>(key: &Key, r: &'a Resource) -> Side<'a> {
        if *key.kind != *kind::SERVICE && r.answering > 0 {
            if let Some(t) = &r.inbound {
                return Side {
                    source: "inbound",
                    track: Some(t),
                };
            }
        }
        match &r.clients {
            Some(t) => Side {
                source: "clients",
                track: Some(t),
            },
            None => Side {
                source: "none",
                track: None,
            },
        }
    }

    fn stat_row(&self, key: &Key, r: &Resource, w: &WindowSpec) -> StatRow {
        let mut side = Self::side(key, r);
        // A namespace whose meshed pods served nothing (only meshed clients,
        // calling pods without a proxy) shows what those clients saw, as a
        // workload without an answering proxy does.
        if *key.kind == *kind::NAMESPACE
            && side.source == "inbound"
            && self.golden(side.track, w).requests == 0
        {
            if let Some(t) = &r.clients {
                side = Side {
                    source: "clients",
                    track: Some(t),
                };
            }
        }
        StatRow {
            resource: key.to_ref(),
            meshed_pods: r.meshed,
            // A pod row is one pod, meshed or not (an unmeshed one is known
            // only from its clients' labels).
            total_pods: if *key.kind == *kind::POD {
                1
            } else {
                r.total.max(r.meshed)
            },
            unreachable_pods: r.unreachable,
            source: side.source.into(),
            golden: self.golden(side.track, w),
            tcp_connections: (side.source == "inbound").then_some(r.tcp_open),
            spark: self.spark(side.track),
        }
    }

    fn route_row(&self, key: &RouteKey, r: &RouteState, w: &WindowSpec) -> RouteRow {
        RouteRow {
            route: key.route.to_ref(),
            parent: key.parent.to_ref(),
            parent_port: key.port,
            golden: self.golden(Some(&r.track), w),
            spark: self.spark(Some(&r.track)),
        }
    }

    fn edge<H: History>(&self, key: &EdgeKey, e: &EdgeState<H>, w: &WindowSpec) -> Edge {
        let cycle = self.cycle;
        let in_window = |c: Option<NonZeroU64>| {
            c.is_some_and(|c| cycle.saturating_sub(c.get()) < w.cycles as u64)
        };
        let tls = &e.tls;
        let mtls = match (tls.last_mtls, tls.last_plain) {
            (Some(_), None) => true,
            (Some(m), Some(p)) => p < m && !in_window(Some(p)),
            (None, _) => false,
        };
        let no_tls_reason = if mtls {
            String::new()
        } else if tls.last_plain.is_some() {
            if in_window(tls.last_mtls) && in_window(tls.last_plain) {
                "mixed".into()
            } else {
                tls.seen
                    .as_ref()
                    .and_then(|s| s.plain_reason.as_deref())
                    .unwrap_or("unknown")
                    .to_string()
            }
        } else {
            "unknown".into()
        };
        Edge {
            src: key.src.to_ref(),
            dst: key.dst.to_ref(),
            server_id: tls
                .last_mtls
                .and(tls.seen.as_ref())
                .and_then(|s| s.server_id.as_deref())
                .map(str::to_string),
            mtls,
            no_tls_reason,
            golden: self.golden(Some(&e.track), w),
        }
    }

    /// The collector's state and every namespace's row (default window).
    pub fn overview(&self, now: u64) -> OverviewResponse {
        let (mut ok, mut unreachable) = (0u32, 0u32);
        for p in self.pods.values() {
            match p.health {
                Health::Ok => ok += 1,
                Health::Unreachable => unreachable += 1,
                Health::Pending => {}
            }
        }
        let w = self.window(None);
        let mut namespaces: Vec<StatRow> = self
            .resources
            .iter()
            .filter(|(k, _)| *k.kind == *kind::NAMESPACE)
            .map(|(k, r)| self.stat_row(k, r, &w))
            .collect();
        sort_rows(&mut namespaces);
        OverviewResponse {
            generated_at: now,
            collector: CollectorStatus {
                source: self.source.clone(),
                interval_secs: self.config.interval_secs,
                history_points: u32::try_from(self.config.history_points).unwrap_or(u32::MAX),
                pods_known: u32::try_from(self.pods.len() + self.over_limit.len())
                    .unwrap_or(u32::MAX),
                pods_ok: ok,
                pods_unreachable: unreachable,
                last_cycle_ms: self.last_cycle_ms,
                last_cycle_at: self.last_cycle_at,
            },
            namespaces,
        }
    }

    /// Rows of one kind (`route`: one per route and parent), filtered by
    /// namespace and name; a name that matches nothing is `NotFound`.
    pub fn stat(&self, q: &StatQuery, now: u64) -> Result<StatResponse, QueryError> {
        let kind = canonical_kind(&q.kind)?;
        let w = self.window(q.window_secs);
        let ns = q.namespace.as_deref();
        let name = q.name.as_deref();
        let mut rows: Vec<StatRow> = if kind == kind::ROUTE {
            self.routes
                .iter()
                .map(|(k, r)| {
                    let mut row = StatRow {
                        resource: route_ref(k),
                        source: "clients".into(),
                        golden: self.golden(Some(&r.track), &w),
                        spark: self.spark(Some(&r.track)),
                        ..StatRow::default()
                    };
                    if ns.is_some_and(|ns| ns != &*k.parent.namespace) {
                        row.resource.kind.clear();
                    }
                    row
                })
                .filter(|row| !row.resource.kind.is_empty())
                .filter(|row| name.is_none_or(|n| n == row.resource.name))
                .collect()
        } else {
            self.resources
                .iter()
                .filter(|(k, _)| *k.kind == *kind)
                .filter(|(k, _)| ns.is_none_or(|ns| ns == &*k.namespace))
                .filter(|(k, _)| name.is_none_or(|n| n == &*k.name))
                .map(|(k, r)| self.stat_row(k, r, &w))
                .collect()
        };
        if let (Some(name), true) = (name, rows.is_empty()) {
            return Err(QueryError::NotFound(ResourceRef {
                kind: kind.into(),
                namespace: ns.unwrap_or_default().into(),
                name: name.into(),
            }));
        }
        sort_rows(&mut rows);
        Ok(StatResponse {
            kind: kind.into(),
            namespace: q.namespace.clone(),
            window_secs: w.secs,
            interval_secs: self.config.interval_secs,
            generated_at: now,
            rows,
        })
    }

    /// Edges of the default window: `pod` pod to pod (counts, no
    /// latency), `namespace` summed by namespaces, any other kind the
    /// workload edges with that kind at one end.
    pub fn edges(
        &self,
        kind: &str,
        namespace: Option<&str>,
        now: u64,
    ) -> Result<EdgesResponse, QueryError> {
        let kind = canonical_kind(kind)?;
        let w = self.window(None);
        let touches = |k: &EdgeKey| {
            namespace.is_none_or(|ns| ns == &*k.src.namespace || ns == &*k.dst.namespace)
        };
        let mut edges: Vec<Edge> = match kind {
            kind::POD => self
                .pod_edges
                .iter()
                .filter(|(k, _)| touches(k))
                .map(|(k, e)| self.edge(k, e, &w))
                .collect(),
            kind::NAMESPACE => self.namespace_edges(&w, namespace),
            _ => self
                .edges
                .iter()
                .filter(|(k, _)| *k.src.kind == *kind || *k.dst.kind == *kind)
                .filter(|(k, _)| touches(k))
                .map(|(k, e)| self.edge(k, e, &w))
                .collect(),
        };
        sort_edges(&mut edges);
        Ok(EdgesResponse {
            kind: kind.into(),
            namespace: namespace.map(str::to_string),
            generated_at: now,
            edges,
        })
    }

    /// Workload edges summed by the namespaces at their ends; an edge of
    /// namespaces is mutual TLS when every one of its edges is.
    fn namespace_edges(&self, w: &WindowSpec, namespace: Option<&str>) -> Vec<Edge> {
        struct Sum {
            window: Window,
            cycles: usize,
            mtls: bool,
            server_id: Option<String>,
            reason: String,
        }
        let mut sums: HashMap<(String, String), Sum> = HashMap::new();
        for (k, e) in &self.edges {
            if k.dst.namespace.is_empty() {
                continue;
            }
            let (src, dst) = (k.src.namespace.to_string(), k.dst.namespace.to_string());
            if namespace.is_some_and(|ns| ns != src && ns != dst) {
                continue;
            }
            let one = self.edge(k, e, w);
            let sum = sums.entry((src, dst)).or_insert_with(|| Sum {
                window: Window::default(),
                cycles: 1,
                mtls: true,
                server_id: None,
                reason: String::new(),
            });
            e.track.add_window(w.cycles, &mut sum.window, &self.bounds);
            sum.cycles = sum.cycles.max(e.track.len().min(w.cycles));
            sum.mtls &= one.mtls;
            if sum.server_id.is_none() {
                sum.server_id = one.server_id;
            }
            if !one.mtls {
                sum.reason = if sum.reason.is_empty() || sum.reason == one.no_tls_reason {
                    one.no_tls_reason
                } else {
                    "mixed".into()
                };
            }
        }
        sums.into_iter()
            .map(|((src, dst), s)| {
                let ns = |n: String| ResourceRef {
                    kind: kind::NAMESPACE.into(),
                    namespace: n.clone(),
                    name: n,
                };
                Edge {
                    src: ns(src),
                    dst: ns(dst),
                    server_id: s.server_id,
                    mtls: s.mtls,
                    no_tls_reason: s.reason,
                    golden: s.window.golden(self.covered_secs(s.cycles)),
                }
            })
            .collect()
    }

    /// Routes by parent: all, or those of `svc/NAME` (`service/NAME`);
    /// another kind is `BadTarget`.
    pub fn routes(
        &self,
        target: Option<&str>,
        namespace: Option<&str>,
        now: u64,
    ) -> Result<RoutesResponse, QueryError> {
        let service = match target {
            None => None,
            Some(t) => {
                let Some((kind, name)) = t.split_once('/') else {
                    return Err(QueryError::BadTarget(t.to_string()));
                };
                if canonical_kind(kind)? != kind::SERVICE || name.is_empty() {
                    return Err(QueryError::BadTarget(t.to_string()));
                }
                Some(name)
            }
        };
        let w = self.window(None);
        let mut rows: Vec<RouteRow> = self
            .routes
            .iter()
            .filter(|(k, _)| {
                service.is_none_or(|s| *k.parent.kind == *kind::SERVICE && s == &*k.parent.name)
            })
            .filter(|(k, _)| namespace.is_none_or(|ns| ns == &*k.parent.namespace))
            .map(|(k, r)| self.route_row(k, r, &w))
            .collect();
        sort_routes(&mut rows);
        Ok(RoutesResponse {
            target: target.map(str::to_string),
            namespace: namespace.map(str::to_string),
            generated_at: now,
            rows,
        })
    }

    /// One resource's page: its row, its pods, the edges into and out of
    /// it, the routes of the services it serves and of those it calls.
    pub fn workload(&self, r: &ResourceRef, now: u64) -> Result<WorkloadResponse, QueryError> {
        let kind = canonical_kind(&r.kind)?;
        let wanted = ResourceRef {
            kind: kind.into(),
            namespace: if kind == kind::NAMESPACE {
                r.name.clone()
            } else {
                r.namespace.clone()
            },
            name: r.name.clone(),
        };
        let not_found = || QueryError::NotFound(wanted.clone());
        if kind == kind::ROUTE {
            return Err(not_found());
        }
        let key = self.strings.find_key(&wanted).ok_or_else(not_found)?;
        let res = self.resources.get(&key).ok_or_else(not_found)?;
        let w = self.window(None);
        let stat = self.stat_row(&key, res, &w);
        let is_ns = kind == kind::NAMESPACE;
        let ns = &*key.namespace;

        let mut pods: Vec<StatRow> = if kind == kind::POD || kind == kind::SERVICE {
            Vec::new()
        } else {
            self.resources
                .iter()
                .filter(|(k, _)| *k.kind == *kind::POD)
                .filter(|(k, p)| {
                    if is_ns {
                        &*k.namespace == ns
                    } else {
                        p.owner.as_ref() == Some(&key)
                    }
                })
                .map(|(k, p)| self.stat_row(k, p, &w))
                .collect()
        };
        sort_rows(&mut pods);

        let served: Vec<&Key> = self
            .backends
            .iter()
            .filter(|(_, b)| b.workloads.contains(&key))
            .map(|(svc, _)| svc)
            .collect();
        let this = &key;
        let is_dst = |k: &EdgeKey| {
            if is_ns {
                &*k.dst.namespace == ns
            } else {
                &k.dst == this
            }
        };
        let is_src = |k: &EdgeKey| {
            if is_ns {
                &*k.src.namespace == ns
            } else {
                &k.src == this
            }
        };
        let (mut inbound, mut outbound) = if kind == kind::POD {
            (
                self.edges_where(&self.pod_edges, is_dst, &w),
                self.edges_where(&self.pod_edges, is_src, &w),
            )
        } else {
            (
                self.edges_where(&self.edges, is_dst, &w),
                self.edges_where(&self.edges, is_src, &w),
            )
        };
        sort_edges(&mut inbound);
        sort_edges(&mut outbound);

        let client = if kind == kind::POD {
            res.owner.as_ref().unwrap_or(&key)
        } else {
            &key
        };
        let mut routes: Vec<RouteRow> = self
            .routes
            .iter()
            .filter(|(k, r)| {
                if is_ns {
                    &*k.parent.namespace == ns
                } else {
                    k.parent == key || served.contains(&&k.parent) || r.clients.contains(client)
                }
            })
            .map(|(k, r)| self.route_row(k, r, &w))
            .collect();
        sort_routes(&mut routes);
        Ok(WorkloadResponse {
            generated_at: now,
            stat,
            pods,
            inbound,
            outbound,
            routes,
        })
    }

    /// The edges of `edges` whose key `wanted`.
    fn edges_where<H: History>(
        &self,
        edges: &HashMap<EdgeKey, EdgeState<H>>,
        wanted: impl Fn(&EdgeKey) -> bool,
        w: &WindowSpec,
    ) -> Vec<Edge> {
        edges
            .iter()
            .filter(|(k, _)| wanted(k))
            .map(|(k, e)| self.edge(k, e, w))
            .collect()
    }

    /// Every meshed pod of the last snapshot, recorded or over the limit.
    pub fn pods(&self, namespace: Option<&str>, now: u64) -> PodsResponse {
        let mut pods: Vec<PodStatus> = self
            .pods
            .iter()
            .filter(|(k, _)| namespace.is_none_or(|ns| ns == &*k.namespace))
            .map(|(k, p)| PodStatus {
                pod: k.to_ref(),
                workload: p.workload.as_ref().map(Key::to_ref),
                addr: SocketAddr::new(p.ip, p.admin_port).to_string(),
                state: match p.health {
                    Health::Ok => "ok",
                    Health::Unreachable => "unreachable",
                    Health::Pending => "pending",
                }
                .into(),
                last_error: p.failing.as_ref().map(|f| f.error.to_string()),
                last_scrape_at: p.last_attempt_at(),
                consecutive_failures: p.failing.as_ref().map_or(0, |f| f.failures),
                next_attempt_in_secs: p
                    .failing
                    .as_ref()
                    .and_then(|f| f.next_attempt_at)
                    .map(|t| t.saturating_sub(now)),
            })
            .collect();
        let max = self.config.max_pods;
        pods.extend(
            self.over_limit
                .iter()
                .filter(|k| namespace.is_none_or(|ns| ns == &*k.namespace))
                .map(|k| PodStatus {
                    pod: k.to_ref(),
                    state: "over_limit".into(),
                    last_error: Some(format!(
                        "not scraped: more than --max-pods {max} meshed pods"
                    )),
                    ..PodStatus::default()
                }),
        );
        pods.sort_by(|a, b| a.pod.cmp(&b.pod));
        PodsResponse {
            generated_at: now,
            pods,
        }
    }
}
