//! The balancer on tokio's paused clock, with latencies injected: choice,
//! failfast and the bounded wait.

use super::*;
use crate::discovery::Endpoint;
use prometheus_client::registry::Registry;
use rand::{rngs::StdRng, SeedableRng};
use std::net::SocketAddr;

fn addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, i as u8 + 1], 80))
}

fn set(n: usize) -> EndpointSet {
    EndpointSet {
        state: SetState::Known,
        endpoints: (0..n)
            .map(|i| Endpoint {
                weight: 10_000,
                ..Endpoint::bare(addr(i))
            })
            .collect(),
    }
}

fn config(failfast: Duration, queue: usize) -> BalanceConfig {
    BalanceConfig {
        failfast_timeout: failfast,
        queue_capacity: queue,
        connect_backoff: crate::config::default_connect_backoff(),
    }
}

struct Fixture {
    balancer: Arc<Balancer<()>>,
    updates: watch::Sender<Arc<EndpointSet>>,
    registry: Registry,
}

fn balancer(initial: EndpointSet, config: BalanceConfig) -> Fixture {
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let (updates, resolution) = Resolution::manual(initial);
    let balancer = Arc::new(Balancer::new(
        TargetName {
            authority: Arc::from("web.shop.svc.cluster.local:80"),
            direction: Direction::outbound,
            protocol: BalancerProtocol::Http,
        },
        resolution,
        config,
        metrics,
        Arc::new(OwnListeners::new(vec![])),
        Arc::new(|| ()),
    ));
    Fixture {
        balancer,
        updates,
        registry,
    }
}

/// How an injected endpoint answers.
#[derive(Clone, Copy)]
struct Latency {
    base: Duration,
    jitter: Duration,
    /// One request in this many takes `spike` (a busy host's hiccup).
    spike_every: u32,
    spike: Duration,
}

impl Latency {
    fn sample(&self, rng: &mut StdRng) -> Duration {
        if self.spike_every > 0 && rng.random_range(0..self.spike_every) == 0 {
            return self.spike;
        }
        self.base + self.jitter.mul_f64(rng.random::<f64>())
    }
}

/// Sends `total` requests from `concurrency` clients, each endpoint
/// answering after its injected latency; returns requests per endpoint.
async fn run(
    balancer: &Arc<Balancer<()>>,
    latencies: &[Latency],
    total: usize,
    concurrency: usize,
) -> Vec<usize> {
    let counts = Arc::new(Mutex::new(vec![0usize; latencies.len()]));
    let left = Arc::new(std::sync::atomic::AtomicUsize::new(total));
    let mut clients = Vec::new();
    for c in 0..concurrency {
        let (balancer, counts, left) = (balancer.clone(), counts.clone(), left.clone());
        let latencies = latencies.to_vec();
        clients.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(c as u64);
            while left
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
            {
                let deadline = Instant::now() + Duration::from_secs(3);
                let e = balancer.select(deadline).await.expect("an endpoint");
                let i = (0..latencies.len())
                    .find(|&i| addr(i) == e.endpoint.addr)
                    .expect("a known endpoint");
                let in_flight = e.start();
                tokio::time::sleep(latencies[i].sample(&mut rng)).await;
                in_flight.observe();
                counts.lock().expect("counts")[i] += 1;
            }
        }));
    }
    for c in clients {
        c.await.expect("client");
    }
    let counts = counts.lock().expect("counts").clone();
    counts
}

const EQUAL_NOISY: Latency = Latency {
    base: Duration::from_micros(250),
    jitter: Duration::from_micros(300),
    spike_every: 50,
    spike: Duration::from_millis(20),
};

#[tokio::test(start_paused = true)]
async fn equal_endpoints_with_noise_share_a_light_load_evenly() {
    // Three equal endpoints: a few hundred µs, and one answer in 50 takes
    // 20 ms (a busy host). Before the noise floor, the tie rule and the scaled
    // decay, P2C kept most of the load on one endpoint and starved another
    // for the 10 s a single spike takes to decay (see the closing note of
    // issue 9 for the measured split).
    // "Equal" endpoints differ a little in practice (a warmer cache, another
    // core): 250, 320 and 400 µs at base.
    let near_equal = [0, 70, 150].map(|extra| Latency {
        base: EQUAL_NOISY.base + Duration::from_micros(extra),
        ..EQUAL_NOISY
    });
    let f = balancer(set(3), config(Duration::from_secs(3), 100));
    for concurrency in [1, 4] {
        let got = run(&f.balancer, &near_equal, 3000, concurrency).await;
        eprintln!("concurrency {concurrency}, three equal noisy endpoints: {got:?}");
        for n in &got {
            // A spike still sets an endpoint aside for about a second of
            // this run (five decay windows), so the bound is a fifth to
            // under a half; herding (the old 62 / 228 / 310 of 600) is far
            // outside it.
            assert!(
                (600..=1400).contains(n),
                "concurrency {concurrency}: each of three equal endpoints should get 600..=1400 of 3000: {got:?}"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_slow_endpoint_gets_clearly_less_under_load() {
    let fast = Latency {
        spike_every: 0,
        ..EQUAL_NOISY
    };
    let slow = Latency {
        base: Duration::from_millis(50),
        ..fast
    };
    let f = balancer(set(3), config(Duration::from_secs(3), 100));
    let got = run(&f.balancer, &[fast, fast, slow], 3000, 16).await;
    eprintln!("two fast endpoints and one 50 ms slower: {got:?}");
    assert!(
        got[2] * 10 < got[0] && got[2] * 10 < got[1],
        "the 50 ms endpoint should get under a tenth of either fast one's share: {got:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_spike_is_forgotten_within_the_scaled_decay() {
    // One endpoint has answered once in 20 ms; the others in 300 µs. After
    // a few hundred typical round trips it is chosen again.
    let f = balancer(set(2), config(Duration::from_secs(3), 100));
    let endpoints = f.balancer.endpoints();
    for _ in 0..32 {
        for e in &endpoints {
            let in_flight = e.start();
            tokio::time::advance(Duration::from_micros(300)).await;
            in_flight.observe();
        }
    }
    let slow = endpoints[0].start();
    tokio::time::advance(Duration::from_millis(20)).await;
    slow.observe();
    drop(slow);
    let now = Instant::now();
    assert!(endpoints[0].cost(now) > endpoints[1].cost(now) * TIE_RATIO);
    let decay = decay_for(f.balancer.target.typical.get());
    assert!(decay < Duration::from_secs(1), "decay {decay:?}");
    // 20 ms decays below the tie margin (a quarter of the 1 ms floor) in
    // ln(80) < 5 windows.
    tokio::time::advance(decay * 5).await;
    let now = Instant::now();
    assert!(
        endpoints[0].cost(now) < endpoints[1].cost(now) * TIE_RATIO,
        "after five decay windows the spike is within noise"
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_waits_for_the_first_endpoint_then_gets_it() {
    let f = balancer(EndpointSet::pending(), config(Duration::from_secs(3), 10));
    let b = f.balancer.clone();
    let waiter = tokio::spawn(async move {
        let e = b.select(Instant::now() + Duration::from_secs(3)).await?;
        Ok::<_, BalanceError>((e.endpoint.addr, Instant::now()))
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t = Instant::now();
    f.updates.send_replace(Arc::new(set(1)));
    let (got, at) = waiter.await.expect("waiter").expect("an endpoint");
    assert_eq!(got, addr(0));
    assert!(at - t < Duration::from_millis(10), "woken by the publish");
}

#[tokio::test(start_paused = true)]
async fn with_nothing_ready_requests_fail_at_the_deadline_then_at_once() {
    let f = balancer(EndpointSet::pending(), config(Duration::from_secs(3), 10));
    let start = Instant::now();
    let e = f
        .balancer
        .select(start + Duration::from_secs(3))
        .await
        .expect_err("nothing ready");
    assert_eq!(e, BalanceError::Failfast);
    assert_eq!(Instant::now() - start, Duration::from_secs(3));
    let again = Instant::now();
    let e = f
        .balancer
        .select(again + Duration::from_secs(3))
        .await
        .expect_err("in failfast");
    assert_eq!(e, BalanceError::Failfast);
    assert_eq!(Instant::now(), again, "failfast answers at once");
    // An endpoint ends failfast.
    f.updates.send_replace(Arc::new(set(1)));
    tokio::task::yield_now().await;
    let picked = f
        .balancer
        .select(Instant::now() + Duration::from_secs(3))
        .await;
    assert!(picked.is_ok(), "{picked:?}");
}

#[tokio::test(start_paused = true)]
async fn the_wait_queue_is_bounded() {
    let f = balancer(EndpointSet::pending(), config(Duration::from_secs(3), 2));
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut waiters = Vec::new();
    for _ in 0..2 {
        let b = f.balancer.clone();
        waiters.push(tokio::spawn(
            async move { b.select(deadline).await.map(|_| ()) },
        ));
    }
    tokio::task::yield_now().await;
    let third = f.balancer.select(deadline).await;
    assert_eq!(third.map(|_| ()), Err(BalanceError::QueueFull));
    for w in waiters {
        assert_eq!(w.await.expect("waiter"), Err(BalanceError::Failfast));
    }
}

#[tokio::test(start_paused = true)]
async fn a_service_that_does_not_exist_is_answered_at_once() {
    let f = balancer(EndpointSet::pending(), config(Duration::from_secs(3), 10));
    let b = f.balancer.clone();
    let start = Instant::now();
    let waiter = tokio::spawn(async move { b.select(start + Duration::from_secs(3)).await });
    tokio::task::yield_now().await;
    f.updates.send_replace(Arc::new(EndpointSet {
        state: SetState::DoesNotExist,
        endpoints: vec![],
    }));
    let got = waiter.await.expect("waiter").map(|_| ());
    assert_eq!(got, Err(BalanceError::NotFound));
    assert!(Instant::now() - start < Duration::from_millis(10));
}

#[tokio::test(start_paused = true)]
async fn endpoints_in_backoff_are_skipped_and_return_when_it_passes() {
    let f = balancer(set(2), config(Duration::from_secs(3), 10));
    let endpoints = f.balancer.endpoints();
    endpoints[0].connect_failed();
    for _ in 0..50 {
        let e = f
            .balancer
            .select(Instant::now() + Duration::from_secs(3))
            .await
            .expect("one is ready");
        assert_eq!(e.endpoint.addr, endpoints[1].endpoint.addr);
    }
    endpoints[1].connect_failed();
    // Both in backoff: the request waits for the first retry time.
    let start = Instant::now();
    let e = f
        .balancer
        .select(start + Duration::from_secs(3))
        .await
        .expect("ready after backoff");
    let waited = Instant::now() - start;
    assert!(
        waited > Duration::ZERO && waited <= Duration::from_millis(600),
        "waited {waited:?} for a connect backoff of at most 500 ms"
    );
    e.connect_succeeded();
}

fn gauge_lines(registry: &Registry) -> Vec<String> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).expect("encode");
    text.lines()
        .filter(|l| l.starts_with("balancer_endpoints{"))
        .map(str::to_string)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn gauges_follow_the_set_and_backoff_and_leave_with_the_balancer() {
    let f = balancer(set(3), config(Duration::from_secs(3), 10));
    let has = |lines: &[String], state: &str, n: i64| {
        lines.iter().any(|l| {
            l.contains(&format!("endpoint_state=\"{state}\"")) && l.ends_with(&format!(" {n}"))
        })
    };
    let lines = gauge_lines(&f.registry);
    assert!(
        has(&lines, "ready", 3) && has(&lines, "pending", 0),
        "{lines:?}"
    );
    f.balancer.endpoints()[0].connect_failed();
    f.balancer.endpoints()[0].connect_failed();
    let lines = gauge_lines(&f.registry);
    assert!(
        has(&lines, "ready", 2) && has(&lines, "pending", 1),
        "{lines:?}"
    );
    f.updates.send_replace(Arc::new(set(1)));
    tokio::task::yield_now().await;
    let lines = gauge_lines(&f.registry);
    assert!(
        has(&lines, "ready", 0) && has(&lines, "pending", 1),
        "{lines:?}"
    );
    let Fixture {
        balancer,
        updates,
        registry,
    } = f;
    drop(updates);
    drop(balancer);
    tokio::task::yield_now().await;
    let lines = gauge_lines(&registry);
    assert!(
        has(&lines, "ready", 0) && has(&lines, "pending", 0),
        "{lines:?}"
    );
}

fn accrual(max_failures: u32, min: Duration, max: Duration) -> Arc<FailureAccrual> {
    Arc::new(FailureAccrual {
        max_failures,
        backoff: BackoffConfig {
            initial: min,
            max,
            factor: 2.0,
            jitter: 0.0,
            reset_after: Duration::from_secs(24 * 3600),
        },
    })
}

/// `n` endpoints under failure accrual: `max_failures` in a row earn a
/// penalty of 1 s, doubling up to 4 s.
fn accruing(n: usize, max_failures: u32) -> Fixture {
    let f = balancer(set(n), config(Duration::from_secs(3), 100));
    f.balancer.set_failure_accrual(Some(&accrual(
        max_failures,
        Duration::from_secs(1),
        Duration::from_secs(4),
    )));
    f
}

/// The endpoint `select` chooses now, by index.
async fn chosen(b: &Balancer<()>) -> Option<usize> {
    let e = b.select(Instant::now()).await.ok()?;
    (0..8).find(|&i| addr(i) == e.endpoint.addr)
}

#[tokio::test(start_paused = true)]
async fn failure_accrual_holds_a_failing_endpoint_back_for_growing_penalties() {
    let f = accruing(2, 3);
    let b = &f.balancer;
    let endpoints = b.endpoints();
    let bad = &endpoints[0];
    // Two failures, a success: the count starts again.
    bad.response_ended(false);
    bad.response_ended(false);
    bad.response_ended(true);
    bad.response_ended(false);
    bad.response_ended(false);
    assert!(
        !bad.is_penalised(Instant::now()),
        "4 failures, never 3 in a row"
    );
    // The third in a row: held back for the first penalty (1 s).
    bad.response_ended(false);
    assert!(bad.is_penalised(Instant::now()));
    for _ in 0..50 {
        assert_eq!(
            chosen(b).await,
            Some(1),
            "only the other endpoint is chosen"
        );
    }
    // Answers to requests sent before the penalty do not lengthen it.
    bad.response_ended(false);
    tokio::time::advance(Duration::from_millis(1_001)).await;
    assert!(
        !bad.is_penalised(Instant::now()),
        "the first penalty is 1 s"
    );
    // On probation: one failure earns the next penalty (2 s).
    bad.response_ended(false);
    assert!(bad.is_penalised(Instant::now()));
    tokio::time::advance(Duration::from_millis(1_500)).await;
    assert!(
        bad.is_penalised(Instant::now()),
        "the second penalty is longer"
    );
    tokio::time::advance(Duration::from_millis(501)).await;
    assert!(!bad.is_penalised(Instant::now()));
    // A success ends probation and the schedule: three failures again
    // before the next penalty, which is the first's length.
    bad.response_ended(true);
    bad.response_ended(false);
    bad.response_ended(false);
    assert!(!bad.is_penalised(Instant::now()));
    bad.response_ended(false);
    assert!(bad.is_penalised(Instant::now()));
    tokio::time::advance(Duration::from_millis(1_001)).await;
    assert!(!bad.is_penalised(Instant::now()));
    assert_eq!(
        b.target.gauges.penalties.get(),
        3,
        "each penalty counted in balancer_endpoint_penalties_total"
    );
}

#[tokio::test(start_paused = true)]
async fn after_a_penalty_one_probe_at_a_time_goes_to_the_endpoint() {
    let f = accruing(2, 1);
    let b = &f.balancer;
    let endpoints = b.endpoints();
    let (bad, good) = (endpoints[0].clone(), endpoints[1].clone());
    bad.response_ended(false);
    tokio::time::advance(Duration::from_millis(1_001)).await;
    assert!(!bad.is_penalised(Instant::now()));
    // The other is busier, so cost alone would choose the probed one.
    let _busy = (0..4).map(|_| good.start()).collect::<Vec<_>>();
    // The penalty is over: the endpoint may be chosen, for one request.
    let probe = bad.start();
    for _ in 0..50 {
        assert_eq!(chosen(b).await, Some(1), "not while the probe is out");
    }
    // The probe succeeds: probation ends and so does the limit.
    drop(probe);
    bad.response_ended(true);
    let (_one, _two) = (bad.start(), bad.start());
    assert_eq!(
        chosen(b).await,
        Some(0),
        "the cheaper again, two requests out"
    );

    // Alone and probing: a waiting request gets it when the probe ends.
    let f = accruing(1, 1);
    let b = f.balancer.clone();
    let e = b.endpoints()[0].clone();
    e.response_ended(false);
    tokio::time::advance(Duration::from_millis(1_001)).await;
    let probe = e.start();
    let waiting = {
        let b = b.clone();
        tokio::spawn(async move { b.select(Instant::now() + Duration::from_secs(3)).await })
    };
    tokio::time::advance(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "waits while the probe is out");
    drop(probe);
    e.response_ended(true);
    tokio::time::advance(PROBE_RECHECK * 2).await;
    let got = waiting.await.expect("task").expect("the endpoint");
    assert_eq!(got.endpoint.addr, addr(0));
}

#[tokio::test(start_paused = true)]
async fn without_failure_accrual_failures_never_hold_an_endpoint_back() {
    let f = balancer(set(1), config(Duration::from_secs(3), 100));
    let b = &f.balancer;
    let e = b.endpoints()[0].clone();
    for _ in 0..100 {
        e.response_ended(false);
    }
    assert!(!e.is_penalised(Instant::now()));
    assert_eq!(chosen(b).await, Some(0));
    // Turned on, then off again by a new policy: the endpoint held back by
    // the first stays so until its penalty ends, and is not again.
    b.set_failure_accrual(Some(&accrual(
        1,
        Duration::from_secs(1),
        Duration::from_secs(1),
    )));
    e.response_ended(false);
    assert!(e.is_penalised(Instant::now()));
    // Every endpoint held back: requests wait (up to failfast) for one.
    let waiting = {
        let b = b.clone();
        tokio::spawn(async move { b.select(Instant::now() + Duration::from_secs(3)).await })
    };
    tokio::time::advance(Duration::from_millis(1_001)).await;
    let got = waiting
        .await
        .expect("task")
        .expect("the endpoint, after its penalty");
    assert_eq!(got.endpoint.addr, addr(0));
    b.set_failure_accrual(None);
    for _ in 0..10 {
        e.response_ended(false);
    }
    assert!(!e.is_penalised(Instant::now()));
}
