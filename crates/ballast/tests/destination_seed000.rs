//! Seed 000 over the wire: pods sharing an IP never make a lookup fail, and
//! never flood clients or logs.

use ballast_testsupport as support;
use support::shed_by_memory;

use support::{
    manifests::{docs, PodSpec},
    next,
    updates::{seen, Seen},
    write_atomic, Controller,
};

/// The highest anonymous resident memory of a process, read every 2 ms on a
/// thread of its own until [`AnonPeak::stop`]: what the controller's budget
/// holds under `--memory-limit` (the budget itself reads every 10 ms).
struct AnonPeak {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl AnonPeak {
    fn start(pid: u32) -> Self {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let status = format!("/proc/{pid}/status");
        let thread = std::thread::spawn(move || {
            let mut peak = 0;
            while !stopped.load(Ordering::Relaxed) {
                if let Some(anon) = support::proc_bytes(&status, "RssAnon") {
                    peak = peak.max(anon);
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            peak
        });
        Self { stop, thread }
    }

    /// The peak in bytes (0 if never read).
    fn stop(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().expect("the sampler thread")
    }
}

/// Services in the clusters of the memory cgroup tests, each with
/// `PODS_PER_SERVICE` pods.
const SERVICES: usize = 2_000;
const PODS_PER_SERVICE: usize = 5;

/// An address `10.base.x.y`, the `i`th of its range (`i` under 64,000).
fn ip(base: u8, i: usize) -> String {
    format!("10.{base}.{}.{}", i / 250, i % 250 + 1)
}

/// Writes `services` Services `svc-N` in namespace `shop`, each with `pods`
/// pods `svc-N-P` on port 8080, 100 Services a file (a file holds at most
/// 1,024 documents).
fn write_cluster(dir: &std::path::Path, services: usize, pods: usize) {
    use support::manifests::service;
    for file in 0..services.div_ceil(100) {
        let mut parts = Vec::new();
        for s in file * 100..((file + 1) * 100).min(services) {
            let name = format!("svc-{s}");
            parts.push(service("shop", &name, &ip(96, s), 80, 8080));
            for p in 0..pods {
                let (pod, pod_ip) = (format!("{name}-{p}"), ip(1, s * pods + p));
                parts.push(PodSpec::new("shop", &pod, &name, &pod_ip, 8080).yaml());
            }
        }
        write_atomic(&dir.join(format!("cluster-{file}.yaml")), &docs(&parts));
    }
}

/// A controller in a memory cgroup of `limit` bytes, with `env`, over the
/// cluster of [`write_cluster`], loaded whole; `None` where no memory
/// cgroup can be made (said).
async fn loaded_in_cgroup(
    limit: u64,
    env: &[(&str, &str)],
) -> Option<(support::cgroup::MemoryCgroup, tempfile::TempDir, Controller)> {
    let cgroup = match support::cgroup::MemoryCgroup::create(limit) {
        Ok(cgroup) => cgroup,
        Err(why) => {
            support::proxy::netns::cannot_run("controller in a memory cgroup", &why);
            return None;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    write_cluster(dir.path(), SERVICES, PODS_PER_SERVICE);
    let c = Controller::start_in(
        &cgroup,
        &["--manifests".into(), dir.path().display().to_string()],
        env,
    )
    .await;
    match seen(next(&mut c.get("svc-1999.shop.svc.cluster.local:80").await.unwrap()).await) {
        Seen::Add(eps) => assert_eq!(eps.len(), PODS_PER_SERVICE, "the whole cluster is loaded"),
        other => panic!("expected the last Service's endpoints, got {other:?}"),
    }
    Some((cgroup, dir, c))
}

/// `n` HTTP/2 connections to the controller's gRPC port (each takes at most
/// 1,000 concurrent streams).
async fn connect(c: &Controller, n: usize) -> Vec<tonic::transport::Channel> {
    let mut channels = Vec::with_capacity(n);
    for _ in 0..n {
        channels.push(
            tonic::transport::Channel::from_shared(format!("http://{}", c.grpc))
                .unwrap()
                .connect()
                .await
                .expect("connect"),
        );
    }
    channels
}

/// The controller still runs, and the kernel killed nothing in its cgroup.
fn alive_and_never_killed(c: &mut Controller, cgroup: &support::cgroup::MemoryCgroup) {
    assert!(
        c.process.child.try_wait().expect("wait").is_none(),
        "the controller died"
    );
    assert_eq!(
        cgroup.oom_kills(),
        0,
        "the kernel killed a process in the cgroup"
    );
}

/// The `pod` label `Get(IP:PORT)` answers with, or `None` for a bare address.
async fn pod_at(c: &Controller, addr: &str) -> Option<String> {
    let mut s = c.get(addr).await.unwrap();
    match seen(next(&mut s).await) {
        Seen::Add(eps) => {
            assert_eq!(eps.len(), 1, "{addr}: one endpoint");
            let (got, labels) = eps.into_iter().next().unwrap();
            assert_eq!(got.to_string(), addr);
            labels.get("pod").cloned()
        }
        other => panic!("{addr}: expected an add, got {other:?}"),
    }
}

async fn profile_pod_at(c: &Controller, addr: &str) -> Option<String> {
    let p = next(&mut c.get_profile(addr).await.unwrap()).await;
    p.endpoint
        .expect("endpoint")
        .metric_labels
        .get("pod")
        .cloned()
}

#[tokio::test]
async fn every_seed_000_case_resolves_without_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut terminating = PodSpec::new("prod", "queues-old", "queues", "127.0.5.3", 8080);
    terminating.terminating = true;
    terminating.created = "2026-01-01T00:00:00Z";
    let mut running = PodSpec::new("prod", "web-new", "web", "127.0.5.3", 8080);
    running.created = "2026-01-02T00:00:00Z";
    let mut lonely_terminating = PodSpec::new("prod", "gone", "gone", "127.0.5.4", 8080);
    lonely_terminating.terminating = true;
    let mut succeeded = PodSpec::new("prod", "job-done", "job", "127.0.5.5", 8080);
    succeeded.phase = "Succeeded";
    let mut failed = PodSpec::new("prod", "job-failed", "job", "127.0.5.6", 8080);
    failed.phase = "Failed";
    let host_pod = |name: &'static str, port: u16| {
        let mut p = PodSpec::new("kube-system", name, name, "127.0.9.1", port);
        p.host_network = true;
        p.host_ip = "127.0.9.1";
        p.yaml()
    };
    let mut older = PodSpec::new("prod", "dup-older", "dup", "127.0.5.7", 8080);
    older.created = "2026-01-01T00:00:00Z";
    let mut newer = PodSpec::new("prod", "dup-newer", "dup", "127.0.5.7", 8080);
    newer.created = "2026-01-03T00:00:00Z";
    write_atomic(
        &dir.path().join("pods.yaml"),
        &docs(&[
            terminating.yaml(),
            running.yaml(),
            lonely_terminating.yaml(),
            succeeded.yaml(),
            failed.yaml(),
            host_pod("node-exporter", 9100),
            host_pod("kube-proxy", 10249),
            older.yaml(),
            newer.yaml(),
        ]),
    );
    let c = Controller::start(dir.path(), &[]).await;

    // Terminating and Running share an IP: the Running pod, on both APIs.
    assert_eq!(
        pod_at(&c, "127.0.5.3:8080").await.as_deref(),
        Some("web-new")
    );
    assert_eq!(
        profile_pod_at(&c, "127.0.5.3:8080").await.as_deref(),
        Some("web-new")
    );
    // Terminating, Succeeded or Failed alone: no pod, the address itself.
    for addr in ["127.0.5.4:8080", "127.0.5.5:8080", "127.0.5.6:8080"] {
        assert_eq!(pod_at(&c, addr).await, None, "{addr}");
        assert_eq!(profile_pod_at(&c, addr).await, None, "{addr}");
    }
    // hostNetwork pods on one node IP: each owns its port; other ports, none.
    assert_eq!(
        pod_at(&c, "127.0.9.1:9100").await.as_deref(),
        Some("node-exporter")
    );
    assert_eq!(
        pod_at(&c, "127.0.9.1:10249").await.as_deref(),
        Some("kube-proxy")
    );
    assert_eq!(pod_at(&c, "127.0.9.1:22").await, None);

    // Two live pods on one IP: the newer, every time; one conflict, logged once.
    for _ in 0..50 {
        assert_eq!(
            pod_at(&c, "127.0.5.7:8080").await.as_deref(),
            Some("dup-newer")
        );
    }
    assert_eq!(c.metric("destination_ip_conflicts").await, Some(1.0));
    assert_eq!(
        c.metric("destination_ip_conflicts_seen_total").await,
        Some(1.0)
    );
    // The conflict gauge and counter are two families of a valid page.
    if let Some(page) = support::openmetrics::check_page(c.admin, "destination controller").await {
        page.assert_has("destination_ip_conflicts", "gauge");
        page.assert_has("destination_ip_conflicts_seen", "counter");
    }
    assert_eq!(c.logs_containing("Several live pods").len(), 1);
    let line = &c.logs_containing("Several live pods")[0];
    assert!(line.len() < 500, "the conflict log line is short: {line}");
}

#[tokio::test]
async fn a_reused_ip_resolves_to_the_new_pod_with_no_stale_data() {
    let dir = tempfile::tempdir().unwrap();
    write_atomic(
        &dir.path().join("old.yaml"),
        &PodSpec::new("prod", "old-pod", "old", "127.0.6.1", 8080).yaml(),
    );
    let c = Controller::start(dir.path(), &[]).await;
    let mut profile = c.get_profile("127.0.6.1:8080").await.unwrap();
    let p = next(&mut profile).await;
    assert_eq!(p.endpoint.unwrap().metric_labels["pod"], "old-pod");
    let mut get = c.get("127.0.6.1:8080").await.unwrap();
    next(&mut get).await;

    // The old pod is deleted and its IP given to a new pod.
    std::fs::remove_file(dir.path().join("old.yaml")).unwrap();
    write_atomic(
        &dir.path().join("new.yaml"),
        &PodSpec::new("prod", "new-pod", "new", "127.0.6.1", 8080).yaml(),
    );
    // The profile stream moves to the new pod (maybe through a bare address
    // while neither pod exists).
    let labels = loop {
        let p = next(&mut profile).await;
        let labels = p.endpoint.expect("endpoint").metric_labels;
        if labels.get("pod").map(String::as_str) == Some("new-pod") {
            break labels;
        }
    };
    assert_eq!(labels["namespace"], "prod");
    assert!(!labels.values().any(|v| v == "old-pod"));

    // The Get stream moves to the new pod too: its last add carries new-pod.
    loop {
        match seen(next(&mut get).await) {
            Seen::Add(eps) => {
                let l = eps.values().next().unwrap();
                if l.get("pod").map(String::as_str) == Some("new-pod") {
                    break;
                }
            }
            Seen::Remove(_) | Seen::NoEndpoints { .. } => {}
        }
    }
    assert_eq!(
        pod_at(&c, "127.0.6.1:8080").await.as_deref(),
        Some("new-pod")
    );
}

/// Seed 000 by another road: streams, not pods. A controller (in 4 KiB
/// pages, as `ballast destination` runs by itself) in a 64 MiB
/// memory cgroup (its --memory-limit left to the default, 75% of that)
/// serving 2,000 Services of 5 pods each, while clients open Get,
/// GetProfile, OutboundPolicies.Watch and WatchPort streams for distinct
/// targets until it refuses: it refuses with RESOURCE_EXHAUSTED and a retry
/// hint, the kernel never kills it, and once the clients leave it takes
/// streams again.
#[tokio::test]
async fn a_controller_in_a_memory_cgroup_refuses_streams_instead_of_dying() {
    refuses_streams_in_a_memory_cgroup(64 << 20, &[]).await;
}

/// The same with the heap in transparent huge pages, as `ballast install`
/// renders it by default: the kernel charges a 2 MiB page
/// whole from its first touch, more than the allocator counts, and the
/// budget must see it. In 128 MiB: in 64, the loaded cluster alone is past
/// the point of refusal with huge pages. Where the kernel gives no huge
/// pages, said and the rest run as above.
#[tokio::test]
async fn a_controller_with_its_heap_in_huge_pages_refuses_streams_instead_of_dying() {
    let (key, value) = ballast_install::HEAP_HUGE_PAGES_ENV;
    refuses_streams_in_a_memory_cgroup(128 << 20, &[(key, value)]).await;
}

async fn refuses_streams_in_a_memory_cgroup(limit: u64, env: &[(&str, &str)]) {
    use linkerd2_proxy_api::{
        destination::destination_client::DestinationClient,
        inbound::{inbound_server_policies_client::InboundServerPoliciesClient, PortSpec},
        outbound::{outbound_policies_client::OutboundPoliciesClient, traffic_spec, TrafficSpec},
    };
    use support::eventually;
    use tonic::Code;

    /// Refusals seen before the clients stop opening streams.
    const REFUSALS: usize = 200;
    /// One stream of each kind per Service, one inbound per pod.
    const PER_PASS: usize = 4 * SERVICES + SERVICES * PODS_PER_SERVICE;
    /// Streams tried at most, each target twice: far more than 128 MiB can
    /// hold at 1-5 KiB each, so the controller must refuse well before.
    const MAX_STREAMS: usize = 2 * PER_PASS;

    let Some((cgroup, _dir, mut c)) = loaded_in_cgroup(limit, env).await else {
        return;
    };
    assert_eq!(
        c.metric("memory_limit_bytes").await,
        Some((limit * 3 / 4) as f64),
        "the default limit is 75% of the cgroup's"
    );

    // A connection takes at most 1,000 concurrent streams.
    let channels = connect(&c, MAX_STREAMS.div_ceil(1_000) + 4).await;
    let mut open: Vec<Box<dyn std::any::Any + Send>> = Vec::new();
    let mut refused = Vec::new();
    let anon_peak = AnonPeak::start(c.pid());
    for i in 0..MAX_STREAMS {
        let channel = channels[i % channels.len()].clone();
        let j = i % PER_PASS;
        let (s, kind) = (j % SERVICES, j / SERVICES);
        let authority = format!("svc-{s}.shop.svc.cluster.local:80");
        let opened: Result<Box<dyn std::any::Any + Send>, tonic::Status> = match kind {
            0 => DestinationClient::new(channel)
                .get(support::req(&authority))
                .await
                .map(|r| Box::new(r.into_inner()) as _),
            1 => DestinationClient::new(channel)
                .get_profile(support::req(&authority))
                .await
                .map(|r| Box::new(r.into_inner()) as _),
            2 => OutboundPoliciesClient::new(channel)
                .watch(TrafficSpec {
                    source_workload: r#"{"ns":"shop","pod":"client"}"#.into(),
                    target: Some(traffic_spec::Target::Authority(authority)),
                })
                .await
                .map(|r| Box::new(r.into_inner()) as _),
            _ => {
                let pod = j - 3 * SERVICES;
                InboundServerPoliciesClient::new(channel)
                    .watch_port(PortSpec {
                        workload: format!(
                            r#"{{"ns":"shop","pod":"svc-{}-{}"}}"#,
                            pod / PODS_PER_SERVICE % SERVICES,
                            pod % PODS_PER_SERVICE
                        ),
                        port: 8080,
                    })
                    .await
                    .map(|r| Box::new(r.into_inner()) as _)
            }
        };
        match opened {
            Ok(stream) => open.push(stream),
            Err(status) => {
                assert_eq!(
                    status.code(),
                    Code::ResourceExhausted,
                    "stream {i} (kind {kind}): {status:?}"
                );
                refused.push(status);
                if refused.len() >= REFUSALS {
                    break;
                }
            }
        }
        if i % 500 == 0 {
            assert!(
                c.process.child.try_wait().expect("wait").is_none(),
                "the controller died after {} streams: {:?}",
                open.len(),
                c.process.logs_containing("")
            );
        }
    }
    let pressure = c.metric("memory_pressure").await;
    let anon_peak = anon_peak.stop();
    let huge = support::proc_bytes(&format!("/proc/{}/smaps_rollup", c.pid()), "AnonHugePages");
    println!(
        "open streams: {}, refused: {}, cgroup peak {} KiB, pressure {pressure:?}, \
         huge pages {:?} KiB",
        open.len(),
        refused.len(),
        cgroup.peak() / 1024,
        huge.map(|b| b / 1024)
    );
    if !env.is_empty() {
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        if thp.contains("[never]") || thp.is_empty() {
            eprintln!("transparent huge pages are off on this machine ({thp:?}): not checked");
        } else {
            assert!(
                huge.is_some_and(|b| b > 0),
                "{env:?} gave the controller no huge pages (THP: {thp:?})"
            );
        }
    }
    assert!(
        refused.len() >= REFUSALS,
        "the controller took all {} streams (peak {} KiB of {} KiB): it never refused",
        open.len(),
        cgroup.peak() / 1024,
        limit / 1024
    );
    let memory_refusals = refused.iter().filter(|s| shed_by_memory(s)).count();
    assert!(
        memory_refusals > 0,
        "no refusal carried the retry hint: {:?}",
        refused.first()
    );
    assert!(pressure.is_some_and(|p| p >= 1.0), "{pressure:?}");
    alive_and_never_killed(&mut c, &cgroup);
    let memory_limit = limit / 4 * 3;
    let anonymous = support::proc_bytes(&format!("/proc/{}/status", c.pid()), "RssAnon");
    println!(
        "anonymous memory: peak {} KiB, at the end {:?} KiB, --memory-limit {} KiB",
        anon_peak / 1024,
        anonymous.map(|b| b / 1024),
        memory_limit / 1024
    );
    // The process's anonymous memory stayed under its --memory-limit
    // throughout, in 4 KiB pages and in huge pages alike.
    assert!(
        anon_peak > 0 && anon_peak < memory_limit,
        "the controller's anonymous memory went past its --memory-limit ({} KiB): {} KiB",
        memory_limit / 1024,
        anon_peak / 1024
    );
    if env.is_empty() {
        // What the kernel charged stayed under the controller's own limit
        // (--memory-limit, 75% of the cgroup's), the binary's pages and the
        // sockets' buffers included.
        assert!(
            cgroup.peak() < memory_limit,
            "the cgroup's memory went past the controller's --memory-limit ({} KiB): {} KiB",
            memory_limit / 1024,
            cgroup.peak() / 1024
        );
    } else {
        // With huge pages the cgroup's charge runs a few MiB past the
        // process's own memory (measured up to 102 MiB against a 96 MiB
        // --memory-limit, 89 MiB anonymous): a huge page partly handed back
        // stays charged whole until the kernel splits it, which it does
        // when the cgroup needs the memory. What holds is the container's
        // own limit: the kernel never reached it.
        assert!(
            cgroup.peak() < limit,
            "the cgroup reached its limit ({} KiB): {} KiB",
            limit / 1024,
            cgroup.peak() / 1024
        );
    }
    let mut counted = 0.0;
    for api in [
        "Get",
        "GetProfile",
        "OutboundPolicies.Watch",
        "InboundServerPolicies.WatchPort",
    ] {
        let series = format!("memory_refused_total{{api=\"{api}\"}}");
        counted += c.metric(&series).await.unwrap_or(0.0);
    }
    assert!(
        counted >= memory_refusals as f64,
        "memory_refused_total counts {counted}, the clients saw {memory_refusals}"
    );

    // The clients leave: memory falls, and streams are taken again.
    drop(open);
    drop(channels);
    eventually("memory pressure back to normal", || async {
        c.metric("memory_pressure").await == Some(0.0)
    })
    .await;
    let mut again = c
        .get("svc-0.shop.svc.cluster.local:80")
        .await
        .expect("a stream is taken again");
    let _ = next(&mut again).await;
    assert_eq!(cgroup.oom_kills(), 0);
    c.signal("TERM");
    assert!(c.wait(std::time::Duration::from_secs(20)).await.success());
}

/// The cluster grows while the controller is at its limit: what it holds
/// for the streams it has (the index, each subscription's answers) grows
/// past the closing point (95% of `--memory-limit`), streams are closed
/// with RESOURCE_EXHAUSTED and the retry hint (the costliest per stream
/// first: the closing step's unit tests check the order), memory stays
/// under `--memory-limit` throughout, and the streams it keeps follow the
/// changes.
#[tokio::test]
async fn a_cluster_growing_at_the_limit_has_streams_closed_and_stays_under_it() {
    use futures_util::FutureExt;
    use linkerd2_proxy_api::destination::{destination_client::DestinationClient, Update};
    use support::eventually;
    use tonic::Streaming;

    const LIMIT: u64 = 64 << 20;
    const MEMORY_LIMIT: u64 = LIMIT / 4 * 3;
    /// Refusals seen before the clients stop opening streams.
    const REFUSALS: usize = 50;
    /// Pods a file of the growth adds, spread over the Services.
    const GROWTH_FILE: usize = 100;
    /// Pods added at most: far more than what frees room for them.
    const GROWTH_MAX: usize = 60_000;

    let Some((cgroup, dir, mut c)) = loaded_in_cgroup(LIMIT, &[]).await else {
        return;
    };

    // Get streams, Service after Service, until the controller refuses.
    let channels = connect(&c, 24).await;
    let mut open: Vec<(usize, Streaming<Update>)> = Vec::new();
    let mut refused = 0;
    for i in 0..channels.len() * 1_000 {
        let s = i % SERVICES;
        let authority = format!("svc-{s}.shop.svc.cluster.local:80");
        match DestinationClient::new(channels[i % channels.len()].clone())
            .get(support::req(&authority))
            .await
        {
            Ok(r) => open.push((s, r.into_inner())),
            Err(status) => {
                assert!(shed_by_memory(&status), "stream {i}: {status:?}");
                refused += 1;
                if refused >= REFUSALS {
                    break;
                }
            }
        }
    }
    assert!(
        refused >= REFUSALS,
        "never refused ({} streams)",
        open.len()
    );
    let opened = open.len();

    // The cluster grows: pods join every Service, a file at a time, until
    // the closing step has closed streams.
    let anon_peak = AnonPeak::start(c.pid());
    let mut added = vec![0usize; SERVICES];
    let mut closed = 0.0;
    let mut file = 0;
    while closed == 0.0 {
        assert!(
            file * GROWTH_FILE < GROWTH_MAX,
            "{} pods added and no stream closed (pressure {:?})",
            file * GROWTH_FILE,
            c.metric("memory_pressure").await
        );
        let mut parts = Vec::new();
        for k in file * GROWTH_FILE..(file + 1) * GROWTH_FILE {
            let s = k % SERVICES;
            let pod = format!("svc-{s}-grown-{}", added[s]);
            added[s] += 1;
            parts.push(PodSpec::new("shop", &pod, &format!("svc-{s}"), &ip(2, k), 8080).yaml());
        }
        write_atomic(
            &dir.path().join(format!("grown-{file}.yaml")),
            &docs(&parts),
        );
        file += 1;
        assert!(
            c.process.child.try_wait().expect("wait").is_none(),
            "the controller died after {} pods added: {:?}",
            file * GROWTH_FILE,
            c.process.logs_containing("")
        );
        // At the pace the controller takes them: the Pods known, or
        // streams closed meanwhile.
        let pods = (SERVICES * PODS_PER_SERVICE + file * GROWTH_FILE) as f64;
        closed = eventually("the grown pods known, or streams closed", || async {
            let known = c.metric("destination_index_objects{kind=\"Pod\"}").await;
            let closed = c
                .metric("memory_closed_total{api=\"Get\"}")
                .await
                .unwrap_or(0.0);
            (known == Some(pods) || closed > 0.0).then_some(closed)
        })
        .await;
    }
    // Closing stops once memory is back under the closing point.
    eventually("memory pressure below closing", || async {
        c.metric("memory_pressure").await.is_some_and(|p| p <= 1.0)
    })
    .await;
    let anon_peak = anon_peak.stop();
    let closed = c
        .metric("memory_closed_total{api=\"Get\"}")
        .await
        .unwrap_or(0.0);
    println!(
        "Get streams opened {opened}, pods added {}, streams closed {closed}, \
         anonymous peak {} KiB, cgroup peak {} KiB, --memory-limit {} KiB",
        file * GROWTH_FILE,
        anon_peak / 1024,
        cgroup.peak() / 1024,
        MEMORY_LIMIT / 1024
    );
    alive_and_never_killed(&mut c, &cgroup);
    assert!(
        anon_peak > 0 && anon_peak < MEMORY_LIMIT,
        "anonymous memory went past --memory-limit ({} KiB): {} KiB",
        MEMORY_LIMIT / 1024,
        anon_peak / 1024
    );
    // The cgroup's charge counts more than the process's memory (the
    // binary's pages, the sockets' buffers: measured 2 MiB more here),
    // what the 25% between --memory-limit and the container's limit is for.
    assert!(
        cgroup.peak() < LIMIT,
        "the cgroup reached its limit ({} KiB): {} KiB",
        LIMIT / 1024,
        cgroup.peak() / 1024
    );
    assert!(
        closed < opened as f64,
        "every stream was closed ({closed} of {opened})"
    );

    // What the clients see: the closed streams ended with the budget's
    // answer; the others follow their Service to its last pod.
    let mut ended = 0;
    let mut kept = Vec::new();
    for (s, mut stream) in open {
        let mut endpoints = std::collections::BTreeSet::new();
        let mut end = None;
        while let Some(next) = stream.message().now_or_never() {
            match next {
                Ok(Some(update)) => seen(update).apply_to(&mut endpoints),
                Ok(None) => panic!("svc-{s}'s stream ended without a status"),
                Err(status) => {
                    end = Some(status);
                    break;
                }
            }
        }
        match end {
            Some(status) => {
                assert!(shed_by_memory(&status), "svc-{s}'s stream: {status:?}");
                ended += 1;
            }
            None if kept.len() < 3 && added[s] > 0 => kept.push((s, stream, endpoints)),
            None => {}
        }
    }
    assert!(
        ended > 0,
        "no client saw its stream closed ({closed} counted)"
    );
    assert!(
        ended as f64 <= closed,
        "{ended} streams ended, {closed} counted as closed"
    );
    assert!(!kept.is_empty(), "no stream kept");
    for (s, mut stream, mut endpoints) in kept {
        let want = PODS_PER_SERVICE + added[s];
        while endpoints.len() != want {
            seen(next(&mut stream).await).apply_to(&mut endpoints);
        }
    }
    c.signal("TERM");
    assert!(c.wait(std::time::Duration::from_secs(20)).await.success());
}
