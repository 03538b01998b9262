//! Kubernetes source benchmark (not a test).
//!
//! Serves PODS pods (10 per service) from testkit's API server emulation,
//! starts `ballast destination --kubeconfig` on it, and reports API requests
//! per start, time to ready, RSS and RSS per pod, then forces a relist (410
//! Gone) and reports the peak RSS during it against the steady state. The same
//! cluster is also written as manifests and loaded by the manifests source,
//! side by side.
//!
//! It fails when a controller did not serve: one that exited, fewer watches
//! than the kinds it reads (`WATCHED_RESOURCES`), no LIST or WATCH, no
//! relist after the 410, an RSS read as zero.

use ballast_bench::{pod, rss, service, start};
use ballast_source_kube::WATCHED_RESOURCES;
use ballast_testkit::ApiServer;
use serde_json::json;
use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

const USAGE: &str = "Usage: kube-bench [--ballast PATH] [--pods N] [--page-size N]";

struct Opts {
    ballast: PathBuf,
    pods: usize,
    page_size: u32,
}

fn opts() -> anyhow::Result<Opts> {
    let mut o = Opts {
        ballast: PathBuf::from("target/release/ballast"),
        pods: 10_000,
        page_size: 500,
    };
    let mut args = ballast_bench::flags(USAGE);
    while let Some(flag) = args.next_flag() {
        match flag.as_str() {
            "--ballast" => o.ballast = args.value()?.into(),
            "--pods" => o.pods = args.parse()?,
            "--page-size" => o.page_size = args.parse()?,
            other => return Err(args.unknown(other)),
        }
    }
    Ok(o)
}

fn manifests(dir: &Path, pods: usize) -> anyhow::Result<()> {
    for s in 0..pods / 10 {
        let mut docs = vec![service(s)];
        docs.extend((s * 10..s * 10 + 10).map(pod));
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
    anyhow::ensure!(o.pods >= 10, "--pods must be at least 10 (10 per service)");
    anyhow::ensure!(o.page_size >= 1, "--page-size must be at least 1");
    // The controller opens one watch per kind it reads.
    let watched = WATCHED_RESOURCES.len();
    let api = ApiServer::start().await;
    let tmp = tempfile::tempdir()?;
    let kubeconfig = api.write_kubeconfig(tmp.path()).display().to_string();
    for s in 0..o.pods / 10 {
        api.apply(service(s));
    }
    for n in 0..o.pods {
        api.apply(pod(n));
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
    let per_start = api.requests().len() - before;
    let lists: usize = ["pods", "services", "endpointslices"]
        .iter()
        .map(|k| api.count("list", k))
        .sum();
    let watches: usize = ["pods", "services", "endpointslices"]
        .iter()
        .map(|k| api.count("watch", k))
        .sum();
    anyhow::ensure!(
        lists > 0 && watches > 0,
        "the controller read nothing from the API server ({lists} LIST, {watches} WATCH)"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let empty_pid = empty.pid();
    let full_pid = full.pid();
    let (empty_rss, _) = rss(empty_pid);
    let (steady, hwm_load) = rss(full_pid);

    // A relist: history lost while the watches are cut. The peak is measured
    // from here: writing 5 to clear_refs resets VmHWM (Linux).
    let hwm_reset = std::fs::write(format!("/proc/{full_pid}/clear_refs"), "5").is_ok();
    let lists_before = api.count("list", "pods");
    api.stall(true);
    api.cut_watches();
    // One change while the watches are down, so that their last
    // resourceVersion is older than what remains of history.
    let mut changed = pod(0);
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
    manifests(dir.path(), o.pods)?;
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
            full.saturating_sub(empty) as f64 * 1.024 / o.pods as f64
        )
    };
    println!(
        "{} pods in {} services, LIST page size {}",
        o.pods,
        o.pods / 10,
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
    Ok(())
}
