//! Mutual TLS benchmark (not a test): two Ballast proxies in a row (client
//! -> proxy A outbound -> proxy B inbound -> nginx), plaintext against mutual
//! TLS, side by side in one run.
//!
//! - `plain`: both proxies with `--identity-disabled`;
//! - `mtls`: both with identities from a `ballast identity` the benchmark
//!   starts (`ballast identity generate` makes its PKI); A dials B in mutual
//!   TLS 1.3 for B's identity. The controller runs with
//!   `--disable-h2-upgrade`, so both paths carry HTTP/1.1 between the proxies
//!   and only TLS differs.
//!
//! The four proxies are pinned to one core (`--proxy-core`, 1); nginx, the
//! controllers and the load to the other (`--load-core`, 0). Per round, per
//! target, per rate (`--rates`, 1000,5000): `oha --latency-correction` over
//! 16 keep-alive connections for `--duration` (10 s): p50 and p99, and the
//! CPU seconds A and B used per 1,000 requests. Medians over `--rounds` (3).
//!
//! Then, on proxy B alone: full mutual TLS handshakes per second of B's CPU
//! (64 concurrent clients with certificates of their own, each connecting,
//! handshaking and closing, for `--duration`); and memory per idle
//! connection: `--idle-connections` (1000) connections to B's inbound
//! listener, each having made one request, settled `--idle-settle` (15 s):
//! VmRSS and jemalloc allocated growth / N, plaintext (to the plain B) and
//! mutual TLS (to the mTLS B).
//!
//! It fails when a measured process did not serve: a proxy, the identity
//! controller or the destination controller that exited, a run with no
//! request answered 200, any failed request, no full handshake completed or
//! one refused (handshakes that time out are counted, not failed), memory
//! figures not read.
//!
//! Needs nginx, `oha` (`cargo install --locked oha`), taskset and prlimit,
//! and `cargo build --release -p ballast`. Run from the workspace root:
//!
//!   cargo run --release -p ballast-bench --bin mtls-bench -- [--ballast target/release/ballast]
//!       [--rounds 3] [--duration 10] [--rates 1000,5000] [--idle-connections 1000]

use ballast_bench::{load, servers, system};

use ballast_bench::{is_error_line, spawn_listening};
use ballast_certify as certify;
use ballast_meshtls::{pem, tls, IdentityName};
use hyper_util::rt::TokioIo;
use load::OhaArgs;
use servers::{BallastArgs, Server};
use std::{
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};
use system::cpu_ticks;
use tokio::process::Command;

const NS: &str = "bench";
const PLAIN_HOST: &str = "plain.bench.svc.cluster.local";
const MTLS_HOST: &str = "mtls.bench.svc.cluster.local";

const USAGE: &str = "Usage: mtls-bench [--ballast PATH] [--oha PATH] [--rounds N] \
[--duration SECS] [--rates 1000,5000] [--idle-connections N] [--idle-settle SECS] \
[--proxy-core N] [--load-core N]";

struct Opts {
    ballast: PathBuf,
    oha: PathBuf,
    rounds: usize,
    duration: Duration,
    rates: Vec<u32>,
    idle: usize,
    idle_settle: Duration,
    proxy_core: u32,
    load_core: u32,
}

fn opts() -> anyhow::Result<Opts> {
    let mut o = Opts {
        ballast: PathBuf::from("target/release/ballast"),
        oha: PathBuf::from("oha"),
        rounds: 3,
        duration: Duration::from_secs(10),
        rates: vec![1000, 5000],
        idle: 1000,
        idle_settle: Duration::from_secs(15),
        proxy_core: 1,
        load_core: 0,
    };
    let mut args = ballast_bench::flags(USAGE);
    while let Some(flag) = args.next_flag() {
        match flag.as_str() {
            "--ballast" => o.ballast = args.value()?.into(),
            "--oha" => o.oha = args.value()?.into(),
            "--rounds" => o.rounds = args.parse()?,
            "--duration" => o.duration = Duration::from_secs(args.parse()?),
            "--rates" => {
                o.rates = args
                    .value()?
                    .split(',')
                    .map(|r| r.trim().parse())
                    .collect::<Result<_, _>>()?
            }
            "--idle-connections" => o.idle = args.parse()?,
            "--idle-settle" => o.idle_settle = Duration::from_secs(args.parse()?),
            "--proxy-core" => o.proxy_core = args.parse()?,
            "--load-core" => o.load_core = args.parse()?,
            other => return Err(args.unknown(other)),
        }
    }
    Ok(o)
}

fn identity(sa: &str) -> IdentityName {
    IdentityName::for_service_account(sa, NS, "linkerd", "cluster.local").expect("a valid name")
}

/// A `ballast` subcommand on the load core, and the address it names after
/// `marker` in its log.
async fn start(
    o: &Opts,
    args: &[String],
    marker: &str,
) -> anyhow::Result<(tokio::process::Child, String)> {
    let name = format!("ballast {}", args.first().map_or("", String::as_str));
    let mut cmd = Command::new("taskset");
    cmd.args(["-c", &o.load_core.to_string()])
        .arg(&o.ballast)
        .args(args)
        .env("BALLAST_LOG", "info");
    let listening = spawn_listening(&name, &mut cmd, [marker], is_error_line);
    let (child, [addr]) = tokio::time::timeout(Duration::from_secs(30), listening)
        .await
        .map_err(|_| anyhow::anyhow!("{args:?}: no {marker:?} in 30 s"))??;
    Ok((child, addr))
}

fn pod_yaml(name: &str, port: u16, meshed: bool) -> String {
    let (labels, sa) = if meshed {
        (
            format!("{{app: {name}, linkerd.io/control-plane-ns: linkerd}}"),
            "  serviceAccountName: server\n",
        )
    } else {
        (format!("{{app: {name}}}"), "")
    };
    let ip = if name == "plain" { 20 } else { 21 };
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {NS}}}\n\
         spec:\n  clusterIP: 10.96.0.{ip}\n  selector: {{app: {name}}}\n  ports: [{{name: http, port: 80, targetPort: {port}}}]\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}-0\n  namespace: {NS}\n  labels: {labels}\n\
         spec:\n{sa}  containers: [{{name: app, ports: [{{name: http, containerPort: {port}}}]}}]\n\
         status:\n  phase: Running\n  podIP: 127.0.0.1\n  hostIP: 127.0.0.1\n  conditions: [{{type: Ready, status: \"True\"}}]\n"
    )
}

fn token_secret(sa: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\ntype: kubernetes.io/service-account-token\nmetadata:\n  name: {sa}\n  namespace: {NS}\n  annotations: {{kubernetes.io/service-account.name: {sa}}}\nstringData: {{token: tok-{sa}}}\n"
    )
}

struct Pair {
    a: Server,
    b: Server,
    host: &'static str,
}

#[derive(Default, Clone, Copy)]
struct Run {
    p50_us: f64,
    p99_us: f64,
    rps: f64,
    cpu_per_1k: f64,
    failed: u64,
}

async fn measure(o: &Opts, pair: &Pair, rate: u32, tck: f64) -> anyhow::Result<Run> {
    let before = cpu_ticks(pair.a.pid()) + cpu_ticks(pair.b.pid());
    let r = load::oha(&OhaArgs {
        oha: &o.oha,
        core: o.load_core,
        addr: &pair.a.addr,
        host: pair.host,
        rate,
        connections: 16,
        duration: o.duration,
    })
    .await?;
    let used =
        (cpu_ticks(pair.a.pid()) + cpu_ticks(pair.b.pid())).saturating_sub(before) as f64 / tck;
    let requests = (r.ok + r.failed).max(1) as f64;
    Ok(Run {
        p50_us: r.p50_us,
        p99_us: r.p99_us,
        rps: r.achieved_rps,
        cpu_per_1k: used / requests * 1000.0,
        failed: r.failed,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// A mutual TLS client config holding a certificate for `sa` from the CA.
async fn client_tls(
    ca: &str,
    anchors: &Path,
    sa: &str,
    token: &Path,
) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let roots = tls::root_store(&pem::certificates(&std::fs::read(anchors)?)?)?;
    let channel = certify::channel(ca, None, roots.clone(), Duration::from_secs(5))
        .map_err(anyhow::Error::msg)?;
    let mut client = linkerd2_proxy_api::identity::identity_client::IdentityClient::new(channel);
    let key = certify::LocalKey::generate(identity(sa))?;
    let config = certify::CertifyConfig {
        token_file: token.to_owned(),
        roots: roots.clone(),
        min_refresh: certify::DEFAULT_MIN_REFRESH,
        max_refresh: certify::DEFAULT_MAX_REFRESH,
        backoff: Default::default(),
        request_timeout: Duration::from_secs(10),
    };
    let creds = certify::certify_once(&mut client, &key, &config).await?;
    let store = tls::CertStore::new();
    store.set(creds);
    Ok(tls::client_config(roots, Some(store), &[])?)
}

/// Full handshakes against `addr` (SNI `name`) from `clients` tasks for
/// `duration`.
struct Handshakes {
    done: u64,
    /// Refused or broken handshakes (the first error kept).
    failed: u64,
    first_error: Option<String>,
    /// Not done within 5 s: slowness, counted apart.
    timed_out: u64,
}

async fn handshakes(
    addr: &str,
    name: &IdentityName,
    config: Arc<rustls::ClientConfig>,
    clients: usize,
    duration: Duration,
) -> Handshakes {
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let timed_out = Arc::new(AtomicU64::new(0));
    let first_error = Arc::new(std::sync::Mutex::new(None));
    let stop = Instant::now() + duration;
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (ok, failed, timed_out, first_error, config, name, addr) = (
            ok.clone(),
            failed.clone(),
            timed_out.clone(),
            first_error.clone(),
            config.clone(),
            name.clone(),
            addr.to_string(),
        );
        tasks.push(tokio::spawn(async move {
            while Instant::now() < stop {
                let done = async {
                    let tcp = tokio::net::TcpStream::connect(&addr).await?;
                    let tls = ballast_meshtls::io::connect(tcp, Some((&config, &name))).await?;
                    drop(tls);
                    std::io::Result::Ok(())
                };
                match tokio::time::timeout(Duration::from_secs(5), done).await {
                    Ok(Ok(())) => {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(Err(e)) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        if let Ok(mut first) = first_error.lock() {
                            first.get_or_insert_with(|| e.to_string());
                        }
                    }
                    Err(_) => {
                        timed_out.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let first_error = first_error.lock().ok().and_then(|mut e| e.take());
    Handshakes {
        done: ok.load(Ordering::Relaxed),
        failed: failed.load(Ordering::Relaxed),
        first_error,
        timed_out: timed_out.load(Ordering::Relaxed),
    }
}

type Idle = Vec<(
    hyper::client::conn::http1::SendRequest<http_body_util::Empty<bytes::Bytes>>,
    tokio::task::JoinHandle<()>,
)>;

/// `n` connections to `addr` (TLS for `tls`), each having made one request.
async fn open_idle(
    addr: &str,
    host: &str,
    n: usize,
    tls: Option<(&Arc<rustls::ClientConfig>, &IdentityName)>,
) -> anyhow::Result<Idle> {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let io = ballast_meshtls::io::connect(tcp, tls).await?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
        let task = tokio::spawn(async move {
            let _ = conn.await;
        });
        let req = http::Request::get("/")
            .header(http::header::HOST, host)
            .body(http_body_util::Empty::new())?;
        let rsp = send.send_request(req).await?;
        anyhow::ensure!(rsp.status() == 200, "idle setup: {}", rsp.status());
        http_body_util::BodyExt::collect(rsp.into_body()).await?;
        conns.push((send, task));
    }
    Ok(conns)
}

async fn allocated(b: &Server) -> anyhow::Result<f64> {
    system::metric(
        b.admin.as_deref().unwrap_or(""),
        "process_memory_allocated_bytes",
    )
    .await
    .ok_or_else(|| anyhow::anyhow!("proxy B's /metrics has no process_memory_allocated_bytes"))
}

fn vm_rss_kib(pid: u32) -> u64 {
    ballast_bench::rss(pid).0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let o = opts()?;
    anyhow::ensure!(
        o.ballast.exists(),
        "{} not found: build it first with `cargo build --release -p ballast`",
        o.ballast.display()
    );
    let tck = system::clock_ticks();
    system::raise_nofile(65_536);
    let dir = tempfile::tempdir()?;
    let pki = dir.path().join("pki");
    let out = Command::new(&o.ballast)
        .args(["identity", "generate", "--out"])
        .arg(&pki)
        .output()
        .await?;
    anyhow::ensure!(
        out.status.success(),
        "identity generate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let anchors = pki.join("ca.crt");
    let tokens = dir.path().join("tokens");
    std::fs::create_dir_all(&tokens)?;
    std::fs::write(
        tokens.join("t.yaml"),
        ["client", "server", "loadgen"]
            .map(token_secret)
            .join("---\n"),
    )?;
    for sa in ["client", "server", "loadgen"] {
        std::fs::write(dir.path().join(format!("{sa}.token")), format!("tok-{sa}"))?;
    }
    let s = |v: &str| v.to_string();
    let (mut ca_child, ca) = start(
        &o,
        &[
            s("identity"),
            s("--addr"),
            s("127.0.0.1:0"),
            s("--admin-addr"),
            s("127.0.0.1:0"),
            s("--issuer-dir"),
            pki.join("issuer").display().to_string(),
            s("--trust-anchors"),
            anchors.display().to_string(),
            s("--manifests"),
            tokens.display().to_string(),
            s("--client-burst"),
            s("100000"),
            s("--client-rate"),
            s("100000"),
        ],
        "identity gRPC listening on ",
    )
    .await?;

    let nginx_dir = dir.path().join("nginx");
    std::fs::create_dir_all(&nginx_dir)?;
    let nginx = servers::nginx(&nginx_dir, o.load_core, o.idle * 2 + 1024).await?;
    let nginx_port: u16 = nginx.addr.rsplit(':').next().unwrap_or("0").parse()?;

    let identity_flags = |sa: &str| -> Vec<String> {
        vec![
            s("--identity-trust-anchors"),
            anchors.display().to_string(),
            s("--identity-addr"),
            ca.clone(),
            s("--identity-token-file"),
            dir.path().join(format!("{sa}.token")).display().to_string(),
            s("--pod-namespace"),
            s(NS),
            s("--pod-service-account"),
            s(sa),
        ]
    };
    let max_connections = o.idle * 2 + 1024;
    let proxy = |destination: String, forward: Option<u16>, extra: Vec<String>| {
        let ballast = o.ballast.clone();
        async move {
            servers::ballast(&BallastArgs {
                ballast: &ballast,
                destination: &destination,
                core: o.proxy_core,
                inbound: s("127.0.0.1:0"),
                forward_port: forward,
                max_connections,
                extra: &extra,
            })
            .await
        }
    };
    let nowhere = s("127.0.0.1:1");
    let b_plain = proxy(nowhere.clone(), Some(nginx_port), vec![]).await?;
    let b_mtls = proxy(nowhere.clone(), Some(nginx_port), identity_flags("server")).await?;
    let port_of = |addr: &Option<String>| -> u16 {
        addr.as_deref()
            .and_then(|a| a.rsplit(':').next()?.parse().ok())
            .unwrap_or(0)
    };
    let manifests = dir.path().join("cluster");
    std::fs::create_dir_all(&manifests)?;
    std::fs::write(
        manifests.join("plain.yaml"),
        pod_yaml("plain", port_of(&b_plain.inbound), false),
    )?;
    std::fs::write(
        manifests.join("mtls.yaml"),
        pod_yaml("mtls", port_of(&b_mtls.inbound), true),
    )?;
    let (mut dst_child, dst) = start(
        &o,
        &[
            s("destination"),
            s("--addr"),
            s("127.0.0.1:0"),
            s("--admin-addr"),
            s("127.0.0.1:0"),
            s("--policy-addr"),
            s("127.0.0.1:0"),
            s("--manifests"),
            manifests.display().to_string(),
            s("--disable-h2-upgrade"),
        ],
        "destination gRPC listening on ",
    )
    .await?;
    let a_plain = proxy(dst.clone(), None, vec![]).await?;
    let a_mtls = proxy(dst.clone(), None, identity_flags("client")).await?;
    let mut pairs = [
        (
            "plain",
            Pair {
                a: a_plain,
                b: b_plain,
                host: PLAIN_HOST,
            },
        ),
        (
            "mtls",
            Pair {
                a: a_mtls,
                b: b_mtls,
                host: MTLS_HOST,
            },
        ),
    ];
    for (name, p) in &mut pairs {
        let answered =
            servers::wait_ok(&p.a.addr, p.host, &mut p.a.child, Duration::from_secs(30)).await;
        if let Err(e) = answered {
            // Proxy B behind it, exited, is the cause of A's errors.
            ballast_bench::running(&mut p.b.child, &format!("{name} proxy B"))?;
            anyhow::bail!("{name}: {e}");
        }
    }
    println!("machine: {}", system::machine());
    println!("ballast: {}", o.ballast.display());

    // Latency and CPU, rounds alternating the targets.
    let mut runs: Vec<Vec<Vec<Run>>> = vec![vec![Vec::new(); o.rates.len()]; pairs.len()];
    for round in 0..o.rounds {
        for (ri, &rate) in o.rates.iter().enumerate() {
            for (pi, (name, pair)) in pairs.iter().enumerate() {
                let r = measure(&o, pair, rate, tck).await?;
                println!(
                    "round {round} {name:5} {rate:>5} rps: p50 {:>6.0} us  p99 {:>6.0} us  achieved {:>6.0}  cpu/1k {:.4} s  failed {}",
                    r.p50_us, r.p99_us, r.rps, r.cpu_per_1k, r.failed
                );
                runs[pi][ri].push(r);
            }
        }
    }
    println!("\n| rate | path | p50 (us) | p99 (us) | CPU s per 1k requests (A+B) |");
    println!("|---|---|---|---|---|");
    for (ri, rate) in o.rates.iter().enumerate() {
        for (pi, (name, _)) in pairs.iter().enumerate() {
            let rs = &runs[pi][ri];
            println!(
                "| {rate} | {name} | {:.0} | {:.0} | {:.4} |",
                median(rs.iter().map(|r| r.p50_us).collect()),
                median(rs.iter().map(|r| r.p99_us).collect()),
                median(rs.iter().map(|r| r.cpu_per_1k).collect()),
            );
        }
        let m = |pi: usize, f: fn(&Run) -> f64| median(runs[pi][ri].iter().map(f).collect());
        println!(
            "| {rate} | mTLS added | {:+.0} | {:+.0} | {:+.4} |",
            m(1, |r| r.p50_us) - m(0, |r| r.p50_us),
            m(1, |r| r.p99_us) - m(0, |r| r.p99_us),
            m(1, |r| r.cpu_per_1k) - m(0, |r| r.cpu_per_1k),
        );
    }

    // Full handshakes on B's one core.
    let mtls_b = &pairs[1].1.b;
    let b_addr = mtls_b.inbound.clone().unwrap_or_default();
    let loadgen = client_tls(&ca, &anchors, "loadgen", &dir.path().join("loadgen.token")).await?;
    let server_name = identity("server");
    let before = cpu_ticks(mtls_b.pid());
    let started = Instant::now();
    let h = handshakes(&b_addr, &server_name, loadgen.clone(), 64, o.duration).await;
    let wall = started.elapsed().as_secs_f64();
    let cpu = cpu_ticks(mtls_b.pid()).saturating_sub(before) as f64 / tck;
    let done = h.done;
    println!(
        "\nhandshakes: {done} in {wall:.1} s ({:.0}/s, {} failed, {} timed out); proxy B used {cpu:.2} CPU s: {:.0} full handshakes per CPU second",
        done as f64 / wall,
        h.failed,
        h.timed_out,
        done as f64 / cpu.max(1e-3)
    );
    anyhow::ensure!(
        h.failed == 0,
        "{} mutual TLS handshakes with proxy B failed; the first: {}",
        h.failed,
        h.first_error.unwrap_or_default()
    );
    anyhow::ensure!(done > 0, "no mutual TLS handshake with proxy B completed");

    // Memory per idle connection to B: plaintext, then mutual TLS.
    let mut idle_rows = Vec::new();
    for (name, pair, tls) in [
        ("plain", &pairs[0].1, None),
        ("mtls", &pairs[1].1, Some((&loadgen, &server_name))),
    ] {
        let b = &pair.b;
        let addr = b.inbound.clone().unwrap_or_default();
        // Warm-up: the first connections size the pools.
        drop(open_idle(&addr, pair.host, 10, tls).await?);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (rss0, alloc0) = (vm_rss_kib(b.pid()), allocated(b).await?);
        let conns = open_idle(&addr, pair.host, o.idle, tls).await?;
        tokio::time::sleep(o.idle_settle).await;
        let (rss1, alloc1) = (vm_rss_kib(b.pid()), allocated(b).await?);
        anyhow::ensure!(
            rss0 > 0 && rss1 > 0,
            "{name}: proxy B's RSS not read (gone from /proc)"
        );
        let n = conns.len() as f64;
        idle_rows.push((
            name,
            (rss1 as f64 - rss0 as f64) * 1024.0 / n,
            (alloc1 - alloc0) / n,
        ));
        drop(conns);
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    println!("\n| idle connections to proxy B's inbound (N = {}) | VmRSS per connection | allocated per connection |", o.idle);
    println!("|---|---|---|");
    for (name, rss, alloc) in idle_rows {
        println!(
            "| {name} | {:.2} KB | {:.2} KB |",
            rss / 1000.0,
            alloc / 1000.0
        );
    }
    // Every process served to the end: the figures above are theirs.
    for (name, pair) in &mut pairs {
        ballast_bench::running(&mut pair.a.child, &format!("{name} proxy A"))?;
        ballast_bench::running(&mut pair.b.child, &format!("{name} proxy B"))?;
    }
    ballast_bench::running(&mut ca_child, "ballast identity")?;
    ballast_bench::running(&mut dst_child, "ballast destination")?;
    let failed: u64 = runs.iter().flatten().flatten().map(|r| r.failed).sum();
    anyhow::ensure!(
        failed == 0,
        "{failed} requests failed (non-200 answers or errors): see the rounds above"
    );
    let _ = nginx;
    Ok(())
}
