//! `policy-bench`: the policy API's cost in the controller.
//!
//! - Memory per route: 1,000 Services with no route, then with
//!   `--routes-per-service` HTTPRoutes each, idle and with every Service's
//!   outbound policy watched once; the difference per route.
//! - Fan-out: `--watchers` Watch streams (proxies) on one Service's outbound
//!   policy; its route is rewritten `--rounds` times, and the time from the
//!   write to each stream's new answer is recorded.
//!
//! - Routes on the request path: requests per second (wrk) and latency at a
//!   fixed rate (oha) through `ballast proxy` to nginx with 0, 10 and 100
//!   HTTPRoutes on the target (the request matching the last, catch-all
//!   one), next to nginx directly.
//!
//! It fails when a measured process did not serve: a controller or proxy
//! that exited, a Watch stream refused or without its first answer, a
//! route change that reached no stream, memory figures not read, a run with
//! no request answered 200, or any failed request.
//!
//! Build first: `cargo build --release -p ballast -p ballast-bench`. The
//! routes section needs nginx, wrk and oha (`--skip-proxy` leaves it out).

use ballast_bench::{load, servers};

use ballast_bench::{memory, percentile, start, write_atomic, Controller, Memory};
use linkerd2_proxy_api::{
    net::TcpAddress,
    outbound::{outbound_policies_client::OutboundPoliciesClient, traffic_spec, TrafficSpec},
};
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};
use tokio::sync::mpsc;
use tonic::transport::Channel;

#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const USAGE: &str = "Usage: policy-bench [--ballast PATH] [--services N] \
[--routes-per-service N] [--watchers N] [--rounds N] [--skip-proxy] [--oha PATH] [--rate N] \
[--seconds N]";

struct Opts {
    ballast: PathBuf,
    services: usize,
    routes_per_service: usize,
    watchers: usize,
    rounds: usize,
    skip_proxy: bool,
    oha: PathBuf,
    rate: u32,
    seconds: u64,
}

fn opts() -> anyhow::Result<Opts> {
    let mut o = Opts {
        ballast: PathBuf::from("target/release/ballast"),
        services: 1_000,
        routes_per_service: 10,
        watchers: 1_000,
        rounds: 30,
        skip_proxy: false,
        oha: PathBuf::from("oha"),
        rate: 2_000,
        seconds: 10,
    };
    let mut args = ballast_bench::flags(USAGE);
    while let Some(flag) = args.next_flag() {
        match flag.as_str() {
            "--skip-proxy" => o.skip_proxy = true,
            "--ballast" => o.ballast = args.value()?.into(),
            "--services" => o.services = args.parse()?,
            "--routes-per-service" => o.routes_per_service = args.parse()?,
            "--watchers" => o.watchers = args.parse()?,
            "--rounds" => o.rounds = args.parse()?,
            "--oha" => o.oha = args.value()?.into(),
            "--rate" => o.rate = args.parse()?,
            "--seconds" => o.seconds = args.parse()?,
            other => return Err(args.unknown(other)),
        }
    }
    Ok(o)
}

fn cluster_ip(i: usize) -> String {
    format!("10.96.{}.{}", i / 250, i % 250 + 1)
}

fn service_yaml(i: usize) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: svc-{i}, namespace: ns-{ns}}}\n\
         spec:\n  clusterIP: {ip}\n  selector: {{app: svc-{i}}}\n  ports: [{{name: http, port: 80, targetPort: 8080}}]\n\
         ---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc-{i}-canary, namespace: ns-{ns}}}\n\
         spec:\n  clusterIP: None\n  selector: {{app: svc-{i}-canary}}\n  ports: [{{name: http, port: 80, targetPort: 8080}}]\n",
        ns = i % 10,
        ip = cluster_ip(i)
    )
}

/// `n` HTTPRoutes on service `i`, each a path match with a weighted split;
/// `generation` moves the weights (a real change of the answer).
fn routes_yaml(i: usize, n: usize, generation: usize) -> String {
    let canary = generation % 100;
    (0..n)
        .map(|r| {
            format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n\
                 metadata: {{name: svc-{i}-r{r}, namespace: ns-{ns}}}\n\
                 spec:\n  parentRefs: [{{group: core, kind: Service, name: svc-{i}, port: 80}}]\n\
                 \x20 rules:\n  - matches: [{{path: {{type: PathPrefix, value: /api/v{r}}}, headers: [{{name: x-tenant, value: t{r}}}]}}]\n\
                 \x20   backendRefs: [{{name: svc-{i}, port: 80, weight: {main}}}, {{name: svc-{i}-canary, port: 80, weight: {canary}}}]\n\
                 \x20   timeouts: {{request: 2s}}\n",
                ns = i % 10,
                main = 100 - canary,
            )
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

fn write_cluster(dir: &Path, o: &Opts, routes: usize) -> anyhow::Result<()> {
    for i in 0..o.services {
        write_atomic(&dir.join(format!("svc-{i}.yaml")), &service_yaml(i))?;
        if routes > 0 {
            write_atomic(
                &dir.join(format!("routes-{i}.yaml")),
                &routes_yaml(i, routes, 0),
            )?;
        }
    }
    Ok(())
}

fn spec(i: usize) -> TrafficSpec {
    let addr: SocketAddr = format!("{}:80", cluster_ip(i)).parse().expect("an address");
    TrafficSpec {
        source_workload: r#"{"ns":"bench","pod":"client"}"#.into(),
        target: Some(traffic_spec::Target::Addr(TcpAddress::from(addr))),
    }
}

/// Opens Watch streams, 100 per connection as proxies spread them; each
/// reports the arrival time of every answer after its first.
struct Watchers {
    clients: Vec<OutboundPoliciesClient<Channel>>,
    opened: usize,
    /// Each stream's first answer, or why it had none.
    first_tx: mpsc::UnboundedSender<Result<(), String>>,
    first_rx: mpsc::UnboundedReceiver<Result<(), String>>,
    arrivals_tx: mpsc::UnboundedSender<Instant>,
    firsts: usize,
}

impl Watchers {
    fn new(arrivals_tx: mpsc::UnboundedSender<Instant>) -> Self {
        let (first_tx, first_rx) = mpsc::unbounded_channel();
        Self {
            clients: Vec::new(),
            opened: 0,
            first_tx,
            first_rx,
            arrivals_tx,
            firsts: 0,
        }
    }

    async fn open(&mut self, c: &Controller, service: usize) -> anyhow::Result<()> {
        if self.opened.is_multiple_of(100) {
            let ch = Channel::from_shared(format!("http://{}", c.grpc))?
                .connect()
                .await?;
            self.clients.push(OutboundPoliciesClient::new(ch));
        }
        let mut client = self.clients[self.opened / 100].clone();
        self.opened += 1;
        let (first, arrivals) = (self.first_tx.clone(), self.arrivals_tx.clone());
        tokio::spawn(async move {
            let resp = match client.watch(spec(service)).await {
                Ok(resp) => resp,
                Err(e) => {
                    let _ = first.send(Err(format!("Watch refused: {e}")));
                    return;
                }
            };
            let mut stream = resp.into_inner();
            match stream.message().await {
                Ok(Some(_)) => {
                    let _ = first.send(Ok(()));
                }
                other => {
                    let _ = first.send(Err(format!("no first answer: {other:?}")));
                    return;
                }
            }
            while let Ok(Some(_)) = stream.message().await {
                let _ = arrivals.send(Instant::now());
            }
        });
        Ok(())
    }

    async fn wait_first(&mut self) -> anyhow::Result<()> {
        while self.firsts < self.opened {
            tokio::time::timeout(Duration::from_secs(60), self.first_rx.recv())
                .await
                .map_err(|_| {
                    anyhow::anyhow!(
                        "{} of {} Watch streams had their first answer; none more in 60 s",
                        self.firsts,
                        self.opened
                    )
                })?
                .ok_or_else(|| anyhow::anyhow!("a stream ended"))?
                .map_err(|e| anyhow::anyhow!("a Watch stream: {e}"))?;
            self.firsts += 1;
        }
        Ok(())
    }
}

fn kb_per(before: Memory, after: Memory, n: usize) -> (f64, f64) {
    let per = |a: u64, b: u64| b.saturating_sub(a) as f64 * 1024.0 / 1000.0 / n.max(1) as f64;
    (
        per(before.rss, after.rss),
        per(before.allocated, after.allocated),
    )
}

async fn settle() {
    // The admin server samples jemalloc once a second.
    tokio::time::sleep(Duration::from_millis(1500)).await;
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let o = opts()?;
    anyhow::ensure!(
        o.ballast.exists(),
        "{} not found: build it first with `cargo build --release -p ballast`",
        o.ballast.display()
    );
    anyhow::ensure!(
        o.services >= 1 && o.routes_per_service >= 1 && o.watchers >= 1 && o.rounds >= 1,
        "nothing to measure: --services, --routes-per-service, --watchers and --rounds \
         must be at least 1"
    );
    let args = |dir: &Path| vec!["--manifests".to_string(), dir.display().to_string()];

    // === memory per route ===
    let bare = tempfile::tempdir()?;
    write_cluster(bare.path(), &o, 0)?;
    let routed = tempfile::tempdir()?;
    write_cluster(routed.path(), &o, o.routes_per_service)?;
    let routes = o.services * o.routes_per_service;

    let (mut bare_c, _) = start(&o.ballast, &args(bare.path())).await?;
    let (mut routed_c, routed_ready) = start(&o.ballast, &args(routed.path())).await?;
    settle().await;
    let (bare_idle, routed_idle) = (
        memory(&bare_c)
            .await
            .measured("the controller without routes")?,
        memory(&routed_c)
            .await
            .measured("the controller with routes")?,
    );
    let (mut bare_w, mut routed_w) = (
        Watchers::new(mpsc::unbounded_channel().0),
        Watchers::new(mpsc::unbounded_channel().0),
    );
    for i in 0..o.services {
        bare_w.open(&bare_c, i).await?;
        routed_w.open(&routed_c, i).await?;
    }
    bare_w.wait_first().await?;
    routed_w.wait_first().await?;
    settle().await;
    let (bare_watched, routed_watched) = (
        memory(&bare_c)
            .await
            .measured("the controller without routes")?,
        memory(&routed_c)
            .await
            .measured("the controller with routes")?,
    );
    bare_c.running()?;
    routed_c.running()?;
    drop((bare_w, routed_w, bare_c, routed_c));

    println!("## Controller memory per route");
    println!();
    println!(
        "{} Services; {} HTTPRoutes ({} per Service, each a path and header match, a weighted \
         split over two backends, a timeout). Ready with routes in {}.",
        o.services,
        routes,
        o.routes_per_service,
        ms(routed_ready)
    );
    println!();
    println!("| | no routes | with routes | per route (RSS / allocated) |");
    println!("|---|---|---|---|");
    for (name, a, b) in [
        ("idle (routes in the index)", bare_idle, routed_idle),
        (
            "every Service's policy watched once",
            bare_watched,
            routed_watched,
        ),
    ] {
        let (rss, alloc) = kb_per(a, b, routes);
        println!(
            "| {name} | {} KiB / {} KiB | {} KiB / {} KiB | {rss:.2} KB / {alloc:.2} KB |",
            a.rss, a.allocated, b.rss, b.allocated
        );
    }
    println!();

    // === fan-out ===
    let dir = tempfile::tempdir()?;
    write_cluster(dir.path(), &o, 1)?;
    let (mut c, _) = start(&o.ballast, &args(dir.path())).await?;
    let (arrivals_tx, mut arrivals) = mpsc::unbounded_channel();
    let mut watchers = Watchers::new(arrivals_tx);
    settle().await;
    let before = memory(&c).await.measured("the controller")?;
    for _ in 0..o.watchers {
        watchers.open(&c, 0).await?;
    }
    watchers.wait_first().await?;
    settle().await;
    let after = memory(&c).await.measured("the controller with streams")?;
    let mut per_stream = Vec::new();
    let mut until_last = Vec::new();
    for round in 1..=o.rounds {
        let t0 = Instant::now();
        write_atomic(&dir.path().join("routes-0.yaml"), &routes_yaml(0, 1, round))?;
        let mut last = t0;
        for got in 0..o.watchers {
            let at = tokio::time::timeout(Duration::from_secs(10), arrivals.recv())
                .await
                .map_err(|_| {
                    anyhow::anyhow!(
                        "route change {round}: {got} of {} streams had the new answer; \
                         none more in 10 s",
                        o.watchers
                    )
                })?
                .ok_or_else(|| anyhow::anyhow!("streams ended"))?;
            per_stream.push(at - t0);
            last = last.max(at);
        }
        until_last.push(last - t0);
        // Let the manifests source's rescan pass before the next write.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.running()?;
    drop(watchers);
    drop(c);
    per_stream.sort();
    until_last.sort();
    let (rss, alloc) = kb_per(before, after, o.watchers);
    println!(
        "## Policy fan-out: a route change reaching {} watching proxies",
        o.watchers
    );
    println!();
    println!(
        "{} Watch streams on one Service's outbound policy (100 per connection), its HTTPRoute \
         rewritten {} times (the split's weights move); from the file's write (the manifests \
         source's reaction included) to each stream's new answer. Memory per open stream: \
         {rss:.2} KB RSS, {alloc:.2} KB allocated.",
        o.watchers, o.rounds
    );
    println!();
    println!("| | p50 | p99 | max |");
    println!("|---|---|---|---|");
    for (name, v) in [
        ("per stream", &per_stream),
        ("until the last stream", &until_last),
    ] {
        println!(
            "| {name} | {} | {} | {} |",
            ms(percentile(v, 0.5)),
            ms(percentile(v, 0.99)),
            ms(percentile(v, 1.0))
        );
    }
    if !o.skip_proxy {
        println!();
        routes_on_the_path(&o).await?;
    }
    Ok(())
}

/// `n` routes on the bench's `backend` Service: `n - 1` that this bench's
/// requests do not match (an exact path each, with a header), then the
/// catch-all `all-N` they do.
fn path_routes(n: usize) -> String {
    let mut docs: Vec<String> = (0..n.saturating_sub(1))
        .map(|r| {
            format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n\
                 metadata: {{name: r{r}, namespace: bench, creationTimestamp: \"2026-01-01T00:00:00Z\"}}\n\
                 spec:\n  parentRefs: [{{group: core, kind: Service, name: backend, port: 80}}]\n\
                 \x20 rules:\n  - matches: [{{path: {{type: Exact, value: /r{r}}}, headers: [{{name: x-route, value: r{r}}}]}}]\n\
                 \x20   backendRefs: [{{name: backend, port: 80}}]\n"
            )
        })
        .collect();
    if n > 0 {
        docs.push(format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n\
             metadata: {{name: all-{n}, namespace: bench, creationTimestamp: \"2026-01-01T00:00:00Z\"}}\n\
             spec:\n  parentRefs: [{{group: core, kind: Service, name: backend, port: 80}}]\n\
             \x20 rules:\n  - matches: [{{path: {{type: PathPrefix, value: /}}}}]\n\
             \x20   backendRefs: [{{name: backend, port: 80}}]\n"
        ));
    }
    docs.join("---\n")
}

/// Waits until the proxy's answers come through route `name` (its route
/// metrics say so); `c` is its controller.
async fn wait_for_route(
    proxy: &mut servers::Server,
    c: &mut Controller,
    name: &str,
) -> anyhow::Result<()> {
    let admin = proxy.admin.clone().unwrap_or_default();
    let started = Instant::now();
    let waited = async {
        let mut conn = load::Conn::open(&proxy.addr).await?;
        loop {
            conn.get(servers::SERVICE_HOST).await?;
            let (_, text) = ballast_bench::http_get(&admin, "/metrics").await;
            let hit = text.lines().any(|l| {
                l.starts_with("outbound_http_route_request_statuses_total")
                    && l.contains(&format!("route_name=\"{name}\""))
            });
            if hit {
                return anyhow::Ok(());
            }
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(30),
                "the proxy never used route {name}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    .await;
    // Why it failed: a process that exited says more than its symptom.
    if let Err(e) = waited {
        ballast_bench::running(&mut proxy.child, "ballast proxy")?;
        c.running()?;
        return Err(e.context(format!("route {name} through the proxy at {}", proxy.addr)));
    }
    Ok(())
}

async fn routes_on_the_path(o: &Opts) -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let nginx = servers::nginx(tmp.path(), 0, 1024).await?;
    let manifests = tmp.path().join("cluster");
    std::fs::create_dir_all(&manifests)?;
    let backend_port: u16 = nginx.addr.rsplit(':').next().unwrap_or("0").parse()?;
    servers::write_manifests(&manifests, backend_port, backend_port, false)?;
    let (mut c, _) = start(
        &o.ballast,
        &["--manifests".to_string(), manifests.display().to_string()],
    )
    .await?;
    let mut proxy = servers::ballast(&servers::BallastArgs {
        ballast: &o.ballast,
        destination: &c.grpc,
        core: 1,
        inbound: "127.0.0.1:0".into(),
        forward_port: None,
        max_connections: 1024,
        extra: &[],
    })
    .await?;
    let duration = Duration::from_secs(o.seconds);
    let run = |addr: String, host: &'static str| {
        let oha = o.oha.clone();
        let rate = o.rate;
        async move {
            let fixed = load::oha(&load::OhaArgs {
                oha: &oha,
                core: 0,
                addr: &addr,
                host,
                rate,
                connections: 16,
                duration,
            })
            .await?;
            let max = load::wrk(0, &addr, host, 16, duration).await?;
            anyhow::Ok((fixed, max))
        }
    };
    // Warm both paths first (connections, allocator, the proxy's caches):
    // the first measured configuration must not pay for them.
    run(nginx.addr.clone(), "b").await?;
    wait_for_route(&mut proxy, &mut c, "http").await?;
    run(proxy.addr.clone(), servers::SERVICE_HOST).await?;
    let direct = run(nginx.addr.clone(), "b").await?;
    let mut rows = vec![("nginx directly".to_string(), direct.clone())];
    for n in [0usize, 10, 100] {
        write_atomic(&manifests.join("routes.yaml"), &path_routes(n))?;
        let route = if n == 0 {
            "http".to_string()
        } else {
            format!("all-{n}")
        };
        wait_for_route(&mut proxy, &mut c, &route).await?;
        let measured = run(proxy.addr.clone(), servers::SERVICE_HOST).await?;
        rows.push((format!("through the proxy, {n} routes"), measured));
    }
    println!("## Routes on the request path");
    println!();
    println!(
        "`ballast proxy` (core 1) in explicit mode to nginx; oha at {} requests/s for {} s \
         over 16 keep-alive connections, then wrk at its maximum for {} s (both on core 0). \
         With N routes the request matches the last (a catch-all after N - 1 exact paths \
         with a header); 0 routes is the Service's default route.",
        o.rate, o.seconds, o.seconds
    );
    println!();
    println!("| | p50 | p99 | p99 added over nginx | failed | max requests/s |");
    println!("|---|---|---|---|---|---|");
    for (name, (fixed, max)) in &rows {
        println!(
            "| {name} | {:.0} µs | {:.0} µs | {:+.0} µs | {} | {:.0} |",
            fixed.p50_us,
            fixed.p99_us,
            fixed.p99_us - direct.0.p99_us,
            fixed.failed + max.failed,
            max.rps
        );
    }
    ballast_bench::running(&mut proxy.child, "ballast proxy")?;
    c.running()?;
    drop((proxy, c, nginx));
    // wrk's timeouts are slowness, not failures.
    let failed: u64 = rows
        .iter()
        .map(|(_, (fixed, max))| fixed.failed + max.errors())
        .sum();
    anyhow::ensure!(
        failed == 0,
        "{failed} requests failed (non-200 answers or errors): see the table"
    );
    Ok(())
}
