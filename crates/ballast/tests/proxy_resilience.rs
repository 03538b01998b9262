//! `ballast proxy` while its controller is away: last-known endpoints keep
//! serving, unknown targets fail fast without piling up connections, the
//! proxy converges when the controller returns, and reconnects follow the
//! capped, jittered backoff schedule however many targets want answers.

use ballast_testsupport as support;

use http::StatusCode;
use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};
use support::{
    proxy::{authority, get, pods_of, start_backends, Cluster, Http1, Mesh, Proxy, H2, WEB_PORT},
    Controller, DEADLINE,
};

/// Sends requests until every backend of the mesh has answered at least once,
/// so the proxy knows (and has used) every endpoint.
async fn until_every_backend_answered(mesh: &Mesh) {
    let started = Instant::now();
    let mut conn = Http1::connect(mesh.proxy.outbound).await.unwrap();
    while mesh.counts().contains(&0) {
        assert!(
            started.elapsed() < DEADLINE,
            "not every backend answered: {:?}",
            mesh.counts()
        );
        let a = conn.get(&mesh.web(), "/").await.unwrap();
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
    }
}

async fn kill(controller: &mut Controller) {
    controller.signal("KILL");
    controller.wait(Duration::from_secs(10)).await;
}

/// Failures seen by concurrent clients: a count and the first few messages.
#[derive(Default)]
struct Failures {
    count: AtomicU64,
    first: Mutex<Vec<String>>,
}

impl Failures {
    fn record(&self, what: String) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first.lock().unwrap();
        if first.len() < 10 {
            first.push(what);
        }
    }

    fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    fn report(&self) -> String {
        self.first.lock().unwrap().join("\n")
    }
}

#[tokio::test]
async fn a_known_target_keeps_working_for_30s_after_the_controller_is_killed() {
    // Bound: zero failed requests over the whole 30 s outage, from three
    // kinds of client, at least 600 requests in all.
    const OUTAGE: Duration = Duration::from_secs(30);
    const PACE: Duration = Duration::from_millis(25);
    let mut mesh = Mesh::start(3, &[]).await;
    until_every_backend_answered(&mesh).await;
    kill(&mut mesh.controller).await;

    let before = mesh.counts();
    let end = Instant::now() + OUTAGE;
    let web = mesh.web();
    let outbound = mesh.proxy.outbound;
    let failures = Arc::new(Failures::default());
    let sent = Arc::new(AtomicU64::new(0));
    let mut clients = tokio::task::JoinSet::new();
    for kind in ["http1 keep-alive", "http2", "http1 new connection each"] {
        let (web, failures, sent) = (web.clone(), failures.clone(), sent.clone());
        clients.spawn(async move {
            let mut h1 = None;
            let mut h2 = None;
            while Instant::now() < end {
                let answer = match kind {
                    "http1 keep-alive" => {
                        if h1.is_none() {
                            h1 = Http1::connect(outbound).await.ok();
                        }
                        match h1.as_mut() {
                            Some(c) => c.get(&web, "/").await,
                            None => Err("cannot connect".to_string()),
                        }
                    }
                    "http2" => {
                        if h2.is_none() {
                            h2 = H2::connect(outbound).await.ok();
                        }
                        match h2.as_ref() {
                            Some(c) => c.get(&web, "/").await,
                            None => Err("cannot connect".to_string()),
                        }
                    }
                    _ => get(outbound, &web, "/").await,
                };
                sent.fetch_add(1, Ordering::Relaxed);
                match answer {
                    Ok(a) if a.status == StatusCode::OK => {}
                    Ok(a) => failures.record(format!("{kind}: {} {:?}", a.status, a.headers)),
                    Err(e) => {
                        failures.record(format!("{kind}: {e}"));
                        h1 = None;
                        h2 = None;
                    }
                }
                tokio::time::sleep(PACE).await;
            }
        });
    }
    while let Some(joined) = clients.join_next().await {
        joined.unwrap();
    }
    let sent = sent.load(Ordering::Relaxed);
    assert_eq!(
        failures.count(),
        0,
        "{} of {sent} requests failed during the outage; first:\n{}\nproxy log:\n{}",
        failures.count(),
        failures.report(),
        mesh.proxy.process.log()
    );
    assert!(sent >= 600, "only {sent} requests sent in {OUTAGE:?}");
    let after = mesh.counts();
    for ((b, was), now) in mesh.backends.iter().zip(&before).zip(&after) {
        assert!(now > was, "{} got no traffic during the outage", b.name());
    }
}

#[tokio::test]
async fn unknown_targets_fail_fast_and_connections_stay_bounded_while_the_controller_is_down() {
    // Bounds: each request for a never-seen target is answered 503 with
    // `l5d-proxy-error` within the 1 s failfast timeout plus 1 s margin, and
    // the proxy's open descriptors never exceed its baseline plus two per
    // client (the open connection and the one just closed by the client,
    // which a busy proxy may not have reaped yet) plus 20. Each client opens
    // a connection per request, about 300 in all, so a proxy that kept them
    // (or one per target) would exceed it many times over.
    const FAILFAST: Duration = Duration::from_secs(1);
    const MARGIN: Duration = Duration::from_secs(1);
    const CLIENTS: usize = 50;
    const RUN: Duration = Duration::from_secs(6);
    const FD_SLACK: usize = 20;
    let mut mesh = Mesh::start(1, &["--http-failfast-timeout", "1s"]).await;
    kill(&mut mesh.controller).await;
    let baseline = mesh.proxy.open_fds();

    let stop = Arc::new(AtomicBool::new(false));
    let pid = mesh.proxy.pid();
    let sampler = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut most = 0;
            while !stop.load(Ordering::Relaxed) {
                let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
                    .map(|d| d.count())
                    .unwrap_or(0);
                most = most.max(fds);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            most
        })
    };

    let failures = Arc::new(Failures::default());
    let answered = Arc::new(AtomicU64::new(0));
    let slowest = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + RUN;
    let outbound = mesh.proxy.outbound;
    let mut clients = tokio::task::JoinSet::new();
    for client in 0..CLIENTS {
        let (failures, answered, slowest) = (failures.clone(), answered.clone(), slowest.clone());
        clients.spawn(async move {
            let mut n = 0;
            while Instant::now() < end {
                n += 1;
                let target = authority(&format!("gone-{client}-{n}"), WEB_PORT);
                let started = Instant::now();
                match get(outbound, &target, "/").await {
                    Ok(a) => {
                        let took = started.elapsed();
                        answered.fetch_add(1, Ordering::Relaxed);
                        slowest.fetch_max(took.as_micros() as u64, Ordering::Relaxed);
                        if a.status != StatusCode::SERVICE_UNAVAILABLE
                            || a.header("l5d-proxy-error").is_none()
                            || took >= FAILFAST + MARGIN
                        {
                            failures.record(format!(
                                "{target}: {} after {took:?}, headers {:?}",
                                a.status, a.headers
                            ));
                        }
                    }
                    Err(e) => failures.record(format!("{target}: {e}")),
                }
            }
        });
    }
    while let Some(joined) = clients.join_next().await {
        joined.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let most = sampler.await.unwrap();
    let answered = answered.load(Ordering::Relaxed);
    assert_eq!(
        failures.count(),
        0,
        "{} requests were not a fast 503 with l5d-proxy-error; first:\n{}\nproxy log:\n{}",
        failures.count(),
        failures.report(),
        mesh.proxy.process.log()
    );
    assert!(
        answered >= (CLIENTS * 3) as u64,
        "only {answered} answers in {RUN:?} from {CLIENTS} clients"
    );
    let limit = baseline + 2 * CLIENTS + FD_SLACK;
    eprintln!(
        "{answered} fast 503s; descriptors: baseline {baseline}, most {most}, limit {limit}; slowest 503 {:?}",
        Duration::from_micros(slowest.load(Ordering::Relaxed))
    );
    assert!(
        most <= limit,
        "the proxy held {most} descriptors (baseline {baseline}, limit {limit})"
    );
    // And they are let go once the clients are gone.
    let started = Instant::now();
    loop {
        let now = mesh.proxy.open_fds();
        if now <= baseline + 5 {
            break;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "{now} descriptors still open after the clients left (baseline {baseline})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Restarts the controller on `addr` (where a killed one listened).
async fn restart(cluster: &Cluster, addr: SocketAddr) -> Controller {
    Controller::start_with(&[
        "--manifests".to_string(),
        cluster.path().display().to_string(),
        "--addr".to_string(),
        addr.to_string(),
    ])
    .await
}

#[tokio::test]
async fn when_the_controller_returns_the_proxy_converges_to_the_current_endpoints() {
    let cluster = Cluster::new();
    let backends = start_backends("web", 4).await;
    let all = pods_of(&backends);
    cluster.pods("web", &all[..3]);
    cluster.service("web", "web", "127.0.0.100", WEB_PORT);
    let controller = Controller::start(cluster.path(), &[]).await;
    let addr = controller.grpc;
    let proxy = Proxy::start(addr, &["--control-backoff-max", "1s"]).await;
    let mut mesh = Mesh {
        cluster,
        backends,
        controller,
        proxy,
    };
    mesh.wait_for_route(&mesh.web()).await;
    let started = Instant::now();
    let mut conn = Http1::connect(mesh.proxy.outbound).await.unwrap();
    while mesh.counts()[..3].contains(&0) {
        if started.elapsed() >= DEADLINE {
            // Say why an endpoint was never chosen: not ready (a connect
            // failed and is backing off), never discovered, or outcosted.
            let m = mesh.proxy.metrics().await;
            let web = mesh.web();
            let state = |s| {
                m.sum(
                    "balancer_endpoints",
                    &[("authority", web.as_str()), ("endpoint_state", s)],
                )
            };
            panic!(
                "a, b, c not all used: {:?}; balancer endpoints ready {}, pending {}\nproxy log:\n{}",
                mesh.counts(),
                state("ready"),
                state("pending"),
                mesh.proxy.process.log()
            );
        }
        conn.get(&mesh.web(), "/").await.unwrap();
    }

    kill(&mut mesh.controller).await;
    // While it is away, web-c leaves and web-d arrives.
    mesh.cluster
        .pods("web", &[all[0].clone(), all[1].clone(), all[3].clone()]);
    let before = mesh.counts();
    for _ in 0..60 {
        let a = conn.get(&mesh.web(), "/").await.unwrap();
        assert_eq!(
            a.status,
            StatusCode::OK,
            "last-known endpoints serve: {a:?}"
        );
    }
    assert_eq!(
        mesh.counts()[3],
        before[3],
        "nobody told the proxy of web-d yet"
    );

    mesh.controller = restart(&mesh.cluster, addr).await;
    let restarted = mesh.counts();
    // Converged: the proxy balances over three ready endpoints, web-d has
    // answered since the restart, and a batch of 60 requests gave web-c none.
    // (Which of the three serves a given batch is the balancer's business:
    // peak-EWMA steers away from an endpoint for seconds after one slow
    // answer, so no per-endpoint share is asserted here.)
    let web = mesh.web();
    let balancer = [("authority", web.as_str())];
    let started = Instant::now();
    loop {
        let before = mesh.counts();
        for _ in 0..60 {
            let a = conn.get(&web, "/").await.unwrap();
            assert_eq!(a.status, StatusCode::OK, "{a:?}");
        }
        let after = mesh.counts();
        let m = mesh.proxy.metrics().await;
        let ready = m.sum(
            "balancer_endpoints",
            &[balancer[0], ("endpoint_state", "ready")],
        );
        let pending = m.sum(
            "balancer_endpoints",
            &[balancer[0], ("endpoint_state", "pending")],
        );
        if after[2] == before[2] && after[3] > restarted[3] && ready == 3.0 && pending == 0.0 {
            break;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "not converged {DEADLINE:?} after the controller returned: counts {after:?}, \
             balancer endpoints ready {ready}, pending {pending}\nproxy log:\n{}",
            mesh.proxy.process.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // And it stays converged, on fresh connections too.
    let before = mesh.counts();
    for i in 0..300 {
        let a = if i % 3 == 0 {
            get(mesh.proxy.outbound, &web, "/").await
        } else {
            conn.get(&web, "/").await
        };
        let a = a.unwrap();
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
        assert_ne!(
            a.backend(),
            Some("web-c"),
            "request {i} went to the removed endpoint"
        );
    }
    let after = mesh.counts();
    assert_eq!(after[2], before[2], "web-c got traffic after convergence");
    assert_eq!(
        after.iter().sum::<u64>() - before.iter().sum::<u64>(),
        300,
        "each request answered once"
    );
}

/// The most connection attempts the schedule allows in `window`: retry `n`
/// waits at least `(1 - jitter) * min(initial * 2^n, max)` (crates/backoff's
/// equal jitter), and the shortest waits come first.
fn most_attempts(window: Duration, initial: Duration, max: Duration, jitter: f64) -> u64 {
    let mut spent = Duration::ZERO;
    let mut attempts = 1;
    let mut base = initial;
    loop {
        spent += base.mul_f64(1.0 - jitter);
        if spent > window {
            return attempts;
        }
        attempts += 1;
        base = (base * 2).min(max);
    }
}

/// Runs a proxy resolving `targets` distinct services, kills its controller,
/// then counts the TCP connections the proxy opens to a listener on the
/// controller's address that accepts and closes at once, over `window`.
async fn reconnects_in(targets: usize, window: Duration) -> u64 {
    let cluster = Cluster::new();
    let backends = start_backends("web", 2).await;
    cluster.pods("web", &pods_of(&backends));
    let mut authorities = Vec::new();
    for i in 0..targets {
        let name = format!("web-{i}");
        cluster.service(&name, "web", &format!("127.0.0.{}", 100 + i), WEB_PORT);
        authorities.push(authority(&name, WEB_PORT));
    }
    let mut controller = Controller::start(cluster.path(), &[]).await;
    let addr = controller.grpc;
    let proxy = Proxy::start(
        addr,
        &[
            "--control-backoff-min",
            "100ms",
            "--control-backoff-max",
            "1s",
        ],
    )
    .await;
    for a in &authorities {
        let started = Instant::now();
        while !matches!(get(proxy.outbound, a, "/").await, Ok(r) if r.status == StatusCode::OK) {
            assert!(started.elapsed() < DEADLINE, "no route to {a}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // Keep every target in use, so the proxy keeps wanting its endpoints.
    let stop = Arc::new(AtomicBool::new(false));
    let driver = {
        let stop = stop.clone();
        let outbound = proxy.outbound;
        tokio::spawn(async move {
            let mut failed = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for a in &authorities {
                    if !matches!(get(outbound, a, "/").await, Ok(r) if r.status == StatusCode::OK) {
                        failed += 1;
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            failed
        })
    };

    kill(&mut controller).await;
    let started = Instant::now();
    let listener = loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => break l,
            Err(e) => {
                assert!(
                    started.elapsed() < DEADLINE,
                    "cannot bind {addr} again: {e}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let end = tokio::time::Instant::now() + window;
    let mut accepted = 0;
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(end) => break,
            a = listener.accept() => {
                if a.is_ok() {
                    accepted += 1;
                }
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let failed = driver.await.unwrap();
    eprintln!("{targets} target(s): {accepted} reconnects in {window:?}, {failed} failed requests");
    drop(proxy);
    accepted
}

#[tokio::test]
async fn reconnects_follow_the_backoff_schedule_whatever_the_number_of_targets() {
    // Bounds: with --control-backoff-min 100ms --control-backoff-max 1s, over
    // 10 s the proxy connects at most `most_attempts` times (+2 for attempts in
    // flight at the window's edges) and at least 4 times, and a proxy
    // resolving 8 targets at most twice (+2) as often as one resolving 1.
    const WINDOW: Duration = Duration::from_secs(10);
    let most = most_attempts(
        WINDOW,
        Duration::from_millis(100),
        Duration::from_secs(1),
        0.5,
    ) + 2;
    let (one, eight) = tokio::join!(reconnects_in(1, WINDOW), reconnects_in(8, WINDOW));
    for (targets, n) in [(1, one), (8, eight)] {
        assert!(
            (4..=most).contains(&n),
            "{targets} target(s): {n} connections in {WINDOW:?}, expected 4..={most}"
        );
    }
    assert!(
        eight <= 2 * one + 2,
        "reconnects grow with targets: {one} for 1 target, {eight} for 8"
    );
}

#[test]
fn the_schedule_bound_is_what_the_flags_allow() {
    // 50 + 100 + 200 + 400 ms, then 500 ms each: 22 waits fit in 10 s.
    assert_eq!(
        most_attempts(
            Duration::from_secs(10),
            Duration::from_millis(100),
            Duration::from_secs(1),
            0.5
        ),
        23
    );
}
