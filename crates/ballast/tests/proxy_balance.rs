//! How `ballast proxy` spreads HTTP requests over a service's endpoints:
//! evenly among equals, away from a slow one.

use ballast_testsupport as support;

use http::StatusCode;
use std::time::Duration;
use support::proxy::{Http1, Mesh};

/// Sends `total` GETs for `authority` through `outbound` from `workers`
/// concurrent keep-alive connections; panics on any answer but 200.
async fn load(outbound: std::net::SocketAddr, authority: &str, total: usize, workers: usize) {
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..workers {
        let authority = authority.to_string();
        let share = total / workers + usize::from(w < total % workers);
        tasks.spawn(async move {
            let mut conn = Http1::connect(outbound).await.unwrap();
            for _ in 0..share {
                let a = conn.get(&authority, "/").await.unwrap();
                assert_eq!(a.status, StatusCode::OK, "{a:?}");
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.unwrap();
    }
}

/// The tests here measure shares of traffic, which CPU contention on a small
/// machine skews: they take turns.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn deltas(before: &[u64], after: &[u64]) -> Vec<u64> {
    after.iter().zip(before).map(|(a, b)| a - b).collect()
}

#[tokio::test]
async fn three_equal_endpoints_all_share_the_load() {
    // How evenly equal endpoints share is the balancer's unit test's to show,
    // on the paused clock (each of three gets 20-47%). Here, over real
    // sockets on a shared machine, the run lasts about 0.4 s: one scheduling
    // stall of ~100 ms raises an endpoint's latency estimate for a good part
    // of it. Measured with both cores busy: [229, 137, 234], [206, 195, 199],
    // [201, 210, 189], and once in CI [160, 286, 154] (no endpoint starved,
    // none herded onto). What holds under load, and is asserted here: every
    // endpoint stays in rotation, with a tenth of the requests at least.
    const TOTAL: u64 = 600;
    const LOW: u64 = TOTAL / 10;
    const HIGH: u64 = TOTAL - 2 * LOW;
    let _turn = ONE_AT_A_TIME.lock().await;
    let mesh = Mesh::start(3, &[]).await;
    let before = mesh.counts();
    load(mesh.proxy.outbound, &mesh.web(), TOTAL as usize, 4).await;
    let got = deltas(&before, &mesh.counts());
    eprintln!("{TOTAL} requests over three equal endpoints: {got:?}");
    assert_eq!(
        got.iter().sum::<u64>(),
        TOTAL,
        "every request reached a backend once"
    );
    for (backend, n) in mesh.backends.iter().zip(&got) {
        assert!(
            (LOW..=HIGH).contains(n),
            "{} got {n} of {TOTAL} requests, outside {LOW}..={HIGH}; all: {got:?}",
            backend.name()
        );
    }
}

#[tokio::test]
async fn a_slow_endpoint_gets_clearly_less_traffic_under_load() {
    // Bound: with one endpoint 50 ms slower, over 600 requests from 16
    // concurrent connections it gets less than half of what either fast one gets.
    const TOTAL: usize = 600;
    let _turn = ONE_AT_A_TIME.lock().await;
    let mesh = Mesh::start(3, &[]).await;
    // Every endpoint has answered once at full speed, so the balancer knows all three.
    load(mesh.proxy.outbound, &mesh.web(), 30, 3).await;
    let slow = &mesh.backends[2];
    slow.set_delay(Duration::from_millis(50));
    let before = mesh.counts();
    load(mesh.proxy.outbound, &mesh.web(), TOTAL, 16).await;
    let got = deltas(&before, &mesh.counts());
    eprintln!("{TOTAL} requests, the third endpoint 50 ms slower: {got:?}");
    let (fast_a, fast_b, slow_n) = (got[0], got[1], got[2]);
    assert!(
        slow_n * 2 < fast_a && slow_n * 2 < fast_b,
        "slow {} got {slow_n}, fast ones {fast_a} and {fast_b}: not less than half",
        slow.name()
    );
}

#[tokio::test]
async fn one_slow_answer_sets_an_endpoint_aside_for_a_moment_not_for_half_a_minute() {
    // What made equal endpoints look unequal on a busy machine: one answer
    // delayed by scheduling raised an endpoint's peak-EWMA, and with
    // Linkerd's fixed 10 s decay P2C kept it aside for seconds. Measured
    // with the old balancer, 3 s after one 40 ms answer: 0 of 600 requests
    // (0, 5 and 118 with the machine's two cores busy); now 191 to 211.
    // Bound: at least 150 of 600 (a quarter).
    const TOTAL: usize = 600;
    const AFTER: Duration = Duration::from_secs(3);
    let _turn = ONE_AT_A_TIME.lock().await;
    let mesh = Mesh::start(3, &[]).await;
    // Pooled connections to every endpoint, so that the slow answer is
    // measured (a new connection's first exchange is not).
    load(mesh.proxy.outbound, &mesh.web(), 60, 4).await;
    let slow = &mesh.backends[0];
    slow.set_delay(Duration::from_millis(40));
    let before = slow.requests();
    let mut conn = Http1::connect(mesh.proxy.outbound).await.unwrap();
    let started = std::time::Instant::now();
    while slow.requests() == before {
        assert!(
            started.elapsed() < support::DEADLINE,
            "the slowed endpoint was never chosen"
        );
        let a = conn.get(&mesh.web(), "/").await.unwrap();
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
    }
    slow.set_delay(Duration::ZERO);
    drop(conn);
    tokio::time::sleep(AFTER).await;
    let counts = mesh.counts();
    load(mesh.proxy.outbound, &mesh.web(), TOTAL, 4).await;
    let got = deltas(&counts, &mesh.counts());
    eprintln!("{TOTAL} requests, {AFTER:?} after one slow answer from the first: {got:?}");
    assert!(
        got[0] >= 150,
        "{} got {} of {TOTAL}, {AFTER:?} after one slow answer: {got:?}",
        slow.name(),
        got[0]
    );
}
