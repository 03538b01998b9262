//! Kubernetes source benchmark (not a test).
//!
//! Serves PODS pods in SERVICES services (10 per service by default) and
//! ROUTES HTTPRoutes (each with a Service as its parentRef, a weighted split
//! over it and a Service of its namespace) from testkit's API server
//! emulation, starts `ballast destination --kubeconfig` on it, and reports
//! API requests per start (LISTs, their pages and WATCHes, kind by kind),
//! time to ready, RSS and RSS per pod, then forces a relist (410 Gone) and
//! reports the peak RSS during it against the steady state. The same cluster
//! is also written as manifests and loaded by the manifests source, side by
//! side.
//!
//! It fails when a controller did not serve: one that exited, fewer watches
//! than the kinds it reads (`WATCHED_RESOURCES`), no LIST or WATCH, no
//! relist after the 410, an RSS read as zero.

use ballast_bench::{allocated, pod_of, rss, service, start};
use ballast_source_kube::WATCHED_RESOURCES;
use ballast_testkit::ApiServer;
use serde_json::json;
use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

const USAGE: &str =
    "Usage: kube-bench [--ballast PATH] [--pods N] [--services N (default: PODS / 10)] \
[--routes N] [--page-size N]";

struct Opts {
    ballast: PathBuf,
    pods: usize,
    /// None: one per 10 pods.
    services: Option<usize>,
    routes: usize,
    page_size: u32,
}

fn opts() -> anyhow::Result<Opts> {
    let mut o = Opts {
        ballast: PathBuf::from("target/release/ballast"),
        pods: 10_000,
        services: None,
        routes: 0,
        page_size: 500,
    };
    let mut args = ballast_bench::flags(USAGE);
    while let Some(flag) = args.next_flag() {
        match flag.as_str() {
            "--ballast" => o.ballast = args.value()?.into(),
            "--pods" => o.pods = args.parse()?,
            "--services" => o.services = Some(args.parse()?),
            "--routes" => o.routes = args.parse()?,
            "--page-size" => o.page_size = args.parse()?,
            other => return Err(args.unknown(other)),
        }
    }
    Ok(o)
}

/// The generated cluster's shape: services, pods per service, routes.
#[derive(Clone, Copy)]
struct Shape {
    services: usize,
    per_service: usize,
    routes: usize,
}

impl Shape {
    fn pods(&self) -> usize {
        self.services * self.per_service
    }

    /// The parent Service of route `r` (spread evenly, service 0 first).
    fn route_parent(&self, r: usize) -> usize {
        r * self.services / self.routes.max(1)
    }
}

/// HTTPRoute `r`, as the API server returns it (scale-bench's and
/// policy-bench's shape): a path and header match, a weighted split over its
/// parent Service and one of the same namespace, a timeout.
fn route(shape: &Shape, r: usize) -> serde_json::Value {
    let s = shape.route_parent(r);
    let other = (s + 10) % shape.services;
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": format!("svc-{s}-route"), "namespace": format!("ns-{}", s % 10),
                     "creationTimestamp": "2026-11-01T10:00:00Z", "generation": 1},
        "spec": {
            "parentRefs": [{"group": "core", "kind": "Service", "name": format!("svc-{s}"), "port": 80}],
            "rules": [{
                "matches": [{"path": {"type": "PathPrefix", "value": "/api"},
                             "headers": [{"name": "x-tenant", "value": format!("t{s}")}]}],
                "backendRefs": [{"name": format!("svc-{s}"), "port": 80, "weight": 90},
                                {"name": format!("svc-{other}"), "port": 80, "weight": 10}],
                "timeouts": {"request": "2s"},
            }],
        },
    })
}

/// The group of a request's path: `/api/v1/...` is the core group (``),
/// `/apis/GROUP/VERSION/...` is GROUP.
fn group_of(path: &str) -> &str {
    match path.strip_prefix("/apis/") {
        Some(rest) => rest.split('/').next().unwrap_or(""),
        None => "",
    }
}

fn manifests(dir: &Path, shape: &Shape) -> anyhow::Result<()> {
    let per = shape.per_service;
    for s in 0..shape.services {
        let mut docs = vec![service(s)];
        docs.extend((s * per..s * per + per).map(|n| pod_of(n, per)));
        docs.extend(
            (0..shape.routes)
                .filter(|r| shape.route_parent(*r) == s)
                .map(|r| route(shape, r)),
        );
        let text = docs
            .iter()
            .map(|d| serde_json::to_string(d).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n---\n");
        std::fs::write(dir.join(format!("svc-{s}.yaml")), text)?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let o = opts()?;
    anyhow::ensure!(
        o.ballast.exists(),
        "{} not found: build it with `cargo build --release -p ballast`",
        o.ballast.display()
    );
    let services = o.services.unwrap_or(o.pods / 10);
    anyhow::ensure!(
        services >= 1 && o.pods >= services,
        "--pods must be at least --services (10 by default: 10 per service)"
    );
    anyhow::ensure!(
        o.routes <= services,
        "--routes: at most one per service ({services})"
    );
    anyhow::ensure!(o.page_size >= 1, "--page-size must be at least 1");
    let shape = Shape {
        services,
        per_service: o.pods / services,
        routes: o.routes,
    };
    // The controller opens one watch per kind it reads.
    let watched = WATCHED_RESOURCES.len();
    let api = ApiServer::start().await;
    let tmp = tempfile::tempdir()?;
    let kubeconfig = api.write_kubeconfig(tmp.path()).display().to_string();
    for s in 0..shape.services {
        api.apply(service(s));
    }
    for n in 0..shape.pods() {
        api.apply(pod_of(n, shape.per_service));
    }
    for r in 0..shape.routes {
        api.apply(route(&shape, r));
    }
    let empty_api = ApiServer::start().await;
    let empty_dir = tempfile::tempdir()?;
    let empty_kubeconfig = empty_api
        .write_kubeconfig(empty_dir.path())
        .display()
        .to_string();

    let kube_args = |kc: &str| {
        vec![
            "--kubeconfig".to_string(),
            kc.to_string(),
            "--kube-page-size".to_string(),
            o.page_size.to_string(),
        ]
    };
    let (mut empty, _) = start(&o.ballast, &kube_args(&empty_kubeconfig)).await?;
    let before = api.requests().len();
    let (mut full, ready) = start(&o.ballast, &kube_args(&kubeconfig)).await?;
    anyhow::ensure!(
        api.wait_for_watches(watched, Duration::from_secs(60)).await,
        "the controller opened {} watches, not {watched} (one per kind), within 60 s",
        api.open_watches()
    );
    let started: Vec<_> = api.requests().split_off(before);
    let per_start = started.len();
    // Kind by kind: LISTs begun (no `continue`), LIST requests (pages),
    // WATCHes, objects served.
    let per_kind: Vec<(String, usize, usize, usize, usize)> = WATCHED_RESOURCES
        .iter()
        .map(|&(group, _, plural)| {
            let of = |verb: &'static str| {
                started.iter().filter(move |r| {
                    r.verb == verb
                        && r.resource.as_deref() == Some(plural)
                        && group_of(&r.path) == group
                })
            };
            let objects = if group == "policy.linkerd.io" && plural == "httproutes" {
                // None generated (testkit counts by plural: Gateway API's).
                0
            } else {
                api.objects(plural)
            };
            let name = if group.is_empty() {
                plural.to_string()
            } else {
                format!("{plural}.{group}")
            };
            (
                name,
                of("list").filter(|r| r.param("continue").is_none()).count(),
                of("list").count(),
                of("watch").count(),
                objects,
            )
        })
        .collect();
    let lists: usize = per_kind.iter().map(|k| k.2).sum();
    let watches: usize = per_kind.iter().map(|k| k.3).sum();
    anyhow::ensure!(
        lists > 0 && watches > 0,
        "the controller read nothing from the API server ({lists} LIST, {watches} WATCH)"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let empty_pid = empty.pid();
    let full_pid = full.pid();
    let (empty_rss, _) = rss(empty_pid);
    let (steady, hwm_load) = rss(full_pid);
    let (empty_alloc, steady_alloc) = (allocated(&empty.admin).await, allocated(&full.admin).await);
    // What the index holds: the routes counted valid, every kind loaded.
    let (_, page) = ballast_bench::http_get(&full.admin, "/metrics").await;
    let index: Vec<String> = page
        .lines()
        .filter(|l| {
            l.starts_with("destination_index_objects{") || l.starts_with("policy_invalid_routes")
        })
        .map(str::to_string)
        .collect();

    // A relist: history lost while the watches are cut. The peak is measured
    // from here: writing 5 to clear_refs resets VmHWM (Linux).
    let hwm_reset = std::fs::write(format!("/proc/{full_pid}/clear_refs"), "5").is_ok();
    let lists_before = api.count("list", "pods");
    api.stall(true);
    api.cut_watches();
    // One change while the watches are down, so that their last
    // resourceVersion is older than what remains of history.
    let mut changed = pod_of(0, shape.per_service);
    changed["metadata"]["labels"]["bench"] = json!("relist");
    api.apply(changed);
    api.expire_history();
    api.stall(false);
    let relist_started = Instant::now();
    // Checked every second: a controller that exited never relists.
    loop {
        let relisted = api
            .wait_until(Duration::from_secs(1), |a| {
                a.count("list", "pods") > lists_before && a.open_watches() == watched
            })
            .await;
        if relisted {
            break;
        }
        full.running()?;
        anyhow::ensure!(
            relist_started.elapsed() < Duration::from_secs(300),
            "no relist within 300 s ({} pod LISTs since the cut, {} of {watched} watches open)",
            api.count("list", "pods") - lists_before,
            api.open_watches()
        );
    }
    // The watch reopens once the relist is applied; let it settle.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let relist_took = relist_started.elapsed();
    let relists = api.count("list", "pods") - lists_before;
    let (after_relist, hwm_relist) = rss(full_pid);
    full.running()?;
    empty.running()?;
    anyhow::ensure!(
        empty_rss > 0 && steady > 0 && after_relist > 0,
        "RSS not measured (a controller gone from /proc)"
    );
    drop(full);
    drop(empty);

    // The manifests source on the same cluster.
    let dir = tempfile::tempdir()?;
    manifests(dir.path(), &shape)?;
    let empty_m = tempfile::tempdir()?;
    let m_args = |d: &Path| vec!["--manifests".to_string(), d.display().to_string()];
    let (mut m_empty, _) = start(&o.ballast, &m_args(empty_m.path())).await?;
    let (mut m_full, m_ready) = start(&o.ballast, &m_args(dir.path())).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (m_empty_rss, _) = rss(m_empty.pid());
    let (m_rss, m_hwm) = rss(m_full.pid());
    m_full.running()?;
    m_empty.running()?;
    anyhow::ensure!(
        m_empty_rss > 0 && m_rss > 0,
        "RSS not measured (a controller gone from /proc)"
    );

    let mb = |kib: u64| format!("{:.1} MB", kib as f64 / 1024.0);
    let per_pod = |full: u64, empty: u64| {
        format!(
            "{:.2} KB",
            full.saturating_sub(empty) as f64 * 1.024 / shape.pods() as f64
        )
    };
    println!(
        "{} pods in {} services ({} each), {} HTTPRoutes, LIST page size {}",
        shape.pods(),
        shape.services,
        shape.per_service,
        shape.routes,
        o.page_size
    );
    println!();
    println!("| | Kubernetes source (testkit) | manifests source |");
    println!("|---|---|---|");
    println!("| API requests per start | {per_start} ({lists} LIST pages, {watches} WATCH) | 0 |");
    println!(
        "| time to ready | {:.0} ms | {:.0} ms |",
        ready.as_secs_f64() * 1e3,
        m_ready.as_secs_f64() * 1e3
    );
    println!(
        "| RSS, empty cluster | {} | {} |",
        mb(empty_rss),
        mb(m_empty_rss)
    );
    println!("| RSS after load | {} | {} |", mb(steady), mb(m_rss));
    println!(
        "| allocated (jemalloc), empty / after load | {} / {} | |",
        mb(empty_alloc),
        mb(steady_alloc)
    );
    println!(
        "| RSS growth per pod | {} | {} |",
        per_pod(steady, empty_rss),
        per_pod(m_rss, m_empty_rss)
    );
    println!(
        "| peak RSS during load (VmHWM) | {} | {} |",
        mb(hwm_load),
        mb(m_hwm)
    );
    println!(
        "| relist after 410 Gone | {relists} pod LIST pages, {:.0} ms (incl. 2 s settle) | |",
        relist_took.as_secs_f64() * 1e3
    );
    println!("| RSS after a relist | {} | |", mb(after_relist));
    println!(
        "| peak RSS during the relist{} / steady | {} / {} = {:.2}x | |",
        if hwm_reset {
            ""
        } else {
            " (or load; VmHWM not resettable)"
        },
        mb(hwm_relist),
        mb(steady),
        hwm_relist as f64 / steady.max(1) as f64
    );
    println!();
    println!("API requests of one start, kind by kind (a LIST is its first page and the pages its `continue` tokens asked for):");
    println!();
    println!("| kind | objects | LISTs | LIST requests (pages) | WATCHes |");
    println!("|---|---|---|---|---|");
    for (name, lists, pages, watches, objects) in &per_kind {
        println!("| {name} | {objects} | {lists} | {pages} | {watches} |");
    }
    let other = per_start - lists - watches;
    println!("| (other requests: discovery, version) | | | {other} | |");
    println!();
    println!("The controller's index after load: {}", index.join("; "));
    Ok(())
}
