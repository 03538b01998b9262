//! The installed mesh beyond the webhook: `ballast inject`'s output applied
//! instead of the webhook's work, a Gateway API HTTPRoute splitting a
//! Service's traffic (and the split shifted), and an AuthorizationPolicy
//! admitting only one client identity, each on `ballast install`'s output in
//! the cluster in a box (see installed_mesh.rs).
//!
//! Needs root, iproute2, iptables, util-linux and curl; see installed_mesh.rs.
//! Run alone: `cargo build -p ballast-sidecar && cargo test -p ballast --test
//! installed_policy`.

#[path = "installed/cluster.rs"]
mod cluster;

use ballast_testkit::AdmissionOutcome;
use cluster::{backend_objects, binaries, caller_objects, can_run, emojivoto, ClusterBox};
use serde_json::{json, Value};
use std::{
    process::Stdio,
    time::{Duration, Instant},
};
use tokio::io::AsyncWriteExt;

const NS: &str = "emojivoto";

fn identity(sa: &str) -> String {
    format!("{sa}.{NS}.serviceaccount.identity.ballast.cluster.local")
}

/// The names of a pod's containers (`containers` or `initContainers`).
fn container_names(pod: &Value, list: &str) -> Vec<String> {
    pod["spec"][list]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str().map(String::from))
        .collect()
}

/// The lines of `log` after its first `skip` lines.
fn lines_after(log: &str, skip: usize) -> Vec<&str> {
    log.lines().skip(skip).collect()
}

/// The `fail URL` lines of a caller's log that come after an `ok URL` line
/// for the same URL: a path that worked and then failed. (Failures before a
/// path's first success are start-up: a caller may start before its target
/// has a ready endpoint, and its proxy fails fast until one is.)
fn fails_after_first_ok(log: &str) -> Vec<&str> {
    let mut worked = std::collections::HashSet::new();
    let mut fails = Vec::new();
    for line in log.lines() {
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("ok"), Some(url)) => {
                worked.insert(url);
            }
            (Some("fail"), Some(url)) if worked.contains(url) => fails.push(line),
            _ => {}
        }
    }
    fails
}

/// Test 1: `ballast inject` (reading the trust anchors from the installed
/// ConfigMap through the API server) makes the pods the webhook would have
/// made: with the namespace not annotated, the webhook patches nothing, every
/// pod becomes Ready with its proxy, requests flow, and every edge is mutual
/// TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inject_output_applied_instead_of_the_webhook_talks_over_mutual_tls() {
    if !can_run() {
        return;
    }
    let (ballast, _) = binaries();
    let cluster = ClusterBox::installed().await;
    let app = emojivoto().replace("  annotations: {linkerd.io/inject: enabled}\n", "");
    assert!(
        !app.contains("linkerd.io/inject"),
        "the namespace annotation is removed:\n{app}"
    );

    let configmap_reads = |cluster: &ClusterBox| {
        cluster
            .api
            .requests()
            .iter()
            .filter(|r| r.resource.as_deref() == Some("configmaps"))
            .count()
    };
    let reads_before = configmap_reads(&cluster);
    let mut inject = tokio::process::Command::new(&ballast)
        .args(["inject", "--kubeconfig"])
        .arg(cluster.kubeconfig())
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ballast inject runs");
    let mut stdin = inject.stdin.take().expect("stdin");
    stdin.write_all(app.as_bytes()).await.expect("write stdin");
    drop(stdin);
    let out = tokio::time::timeout(Duration::from_secs(60), inject.wait_with_output())
        .await
        .expect("ballast inject ends within 60s")
        .expect("ballast inject's output");
    let injected = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "ballast inject: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        configmap_reads(&cluster) > reads_before,
        "ballast inject read the trust anchors' ConfigMap through the API server"
    );
    let trust_roots = cluster
        .api
        .get("configmaps", "ballast", "linkerd-identity-trust-roots")
        .expect("the installed trust roots ConfigMap");
    let anchors = trust_roots["data"]["ca-bundle.crt"]
        .as_str()
        .expect("ca-bundle.crt");
    let first_pem_line = anchors
        .lines()
        .find(|l| !l.starts_with("-----") && !l.is_empty())
        .expect("a PEM body");
    assert!(
        injected.contains(first_pem_line),
        "the injected manifests carry the installed trust anchors"
    );

    let app_started = Instant::now();
    cluster.apply(&injected).await;
    cluster
        .wait_deployments_ready(NS, Duration::from_secs(120))
        .await;
    eprintln!(
        "injected application ready {:.1}s after it was applied",
        app_started.elapsed().as_secs_f64()
    );

    // The pods were created injected, and the webhook patched none of them.
    for app in ["web", "emoji", "voting", "vote-bot"] {
        let pods = cluster.pods_of(NS, app);
        assert!(!pods.is_empty(), "{app} has pods");
        for pod in pods {
            let containers = container_names(&pod, "containers");
            let inits = container_names(&pod, "initContainers");
            assert!(
                containers.iter().any(|c| c == "linkerd-proxy")
                    && inits.iter().any(|c| c == "linkerd-init"),
                "{app}: {containers:?} {inits:?}"
            );
            assert_eq!(
                containers.iter().filter(|c| *c == "linkerd-proxy").count(),
                1,
                "{app}: one proxy: {containers:?}"
            );
        }
    }
    let patched: Vec<String> = cluster
        .api
        .admission_calls()
        .iter()
        .filter(|c| c.resource == "pods" && c.namespace == NS)
        .filter(|c| matches!(c.outcome, AdmissionOutcome::Allowed { patched: true }))
        .map(|c| format!("{} {}", c.namespace, c.name))
        .collect();
    assert!(
        patched.is_empty(),
        "the webhook patched pods of the unannotated namespace: {patched:?}"
    );

    // Requests flow: each caller's log says ok, over and over.
    for app in ["web", "vote-bot"] {
        let flowing = cluster
            .wait_for_log(NS, app, "caller", Duration::from_secs(90), |log| {
                log.matches("ok ").count() >= 20
            })
            .await;
        assert!(
            flowing,
            "{app}'s requests did not flow: {}\n{}",
            cluster.log_of(NS, app, "caller"),
            cluster.describe(NS)
        );
    }

    // Every edge is mutual TLS, by the callers' proxies' own counters.
    for (app, targets) in [("web", vec!["emoji", "voting"]), ("vote-bot", vec!["web"])] {
        for target in targets {
            let (secured, open) = cluster.outbound_mtls_to(NS, app, &identity(target)).await;
            assert!(
                secured,
                "{app} -> {target} is not mutual TLS to {}:\n{open}",
                identity(target)
            );
        }
    }
    for app in ["web", "vote-bot"] {
        let log = cluster.log_of(NS, app, "caller");
        let fails = fails_after_first_ok(&log);
        assert!(fails.is_empty(), "{app}: {fails:?}\n{log}");
    }
}

/// A Gateway API HTTPRoute on Service `web` port 80 sending `web` and
/// `web-canary` these weights.
fn split_route(web: u32, canary: u32) -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "web-split", "namespace": NS},
        "spec": {
            "parentRefs": [{"group": "core", "kind": "Service", "name": "web", "port": 80}],
            "rules": [{
                "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                "backendRefs": [
                    {"name": "web", "port": 80, "weight": web},
                    {"name": "web-canary", "port": 80, "weight": canary},
                ],
            }],
        },
    })
}

/// Who answered each request of a caller printing `ok URL BODY` or
/// `fail URL`: the body's name, or `fail`.
fn answers(lines: &[&str]) -> Vec<String> {
    lines
        .iter()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            match words.next() {
                Some("ok") => Some(words.nth(1).unwrap_or("(empty)").to_string()),
                Some("fail") => Some("fail".to_string()),
                _ => None,
            }
        })
        .collect()
}

fn count(answers: &[String], who: &str) -> usize {
    answers.iter().filter(|a| *a == who).count()
}

/// Test 2: an HTTPRoute created through the API server while vote-bot calls
/// `web` splits its requests between `web` and `web-canary` with no failed
/// request, and the split changed to 0/100 sends them all to `web-canary`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_httproute_split_applies_and_shifts_while_requests_flow() {
    if !can_run() {
        return;
    }
    let cluster = ClusterBox::installed().await;
    // vote-bot's caller prints who answered (a backend's body is its name).
    let mut docs: Vec<Value> = serde_saphyr::from_multiple(&emojivoto()).expect("emojivoto parses");
    let script = "while :; do u=http://web.emojivoto.svc.cluster.local/; \
                  if b=$(curl -sf -m 5 $u); then echo ok $u $b; else echo fail $u; fi; \
                  sleep 0.2; done";
    let mut changed = false;
    for doc in docs.iter_mut() {
        if doc["kind"] == "Deployment" && doc["metadata"]["name"] == "vote-bot" {
            for c in doc["spec"]["template"]["spec"]["containers"]
                .as_array_mut()
                .into_iter()
                .flatten()
            {
                if c["name"] == "caller" {
                    c["args"] = json!([script]);
                    changed = true;
                }
            }
        }
    }
    assert!(changed, "vote-bot has a caller container");
    cluster
        .create_all(docs.into_iter().filter(Value::is_object).collect())
        .await;
    cluster.create_all(backend_objects(NS, "web-canary")).await;
    cluster
        .wait_deployments_ready(NS, Duration::from_secs(120))
        .await;

    let log = || cluster.log_of(NS, "vote-bot", "caller");
    let flowing = cluster
        .wait_for_log(NS, "vote-bot", "caller", Duration::from_secs(90), |log| {
            count(&answers(&log.lines().collect::<Vec<_>>()), "web") >= 10
        })
        .await;
    assert!(
        flowing,
        "vote-bot's requests did not flow: {}\n{}",
        log(),
        cluster.describe(NS)
    );
    let before = answers(&log().lines().collect::<Vec<_>>());
    assert_eq!(
        count(&before, "web-canary"),
        0,
        "without a route, web alone answers: {before:?}"
    );

    // 50/50: both answer.
    let mark = log().lines().count();
    let route_mark = mark;
    let route_at = Instant::now();
    cluster
        .api
        .create(split_route(50, 50))
        .await
        .expect("the HTTPRoute is created");
    let split = cluster
        .wait_for_log(NS, "vote-bot", "caller", Duration::from_secs(90), |log| {
            let a = answers(&lines_after(log, mark));
            count(&a, "web") >= 5 && count(&a, "web-canary") >= 5
        })
        .await;
    let after = answers(&lines_after(&log(), mark));
    assert!(
        split,
        "the 50/50 split did not reach both backends: {after:?}\n{}",
        cluster.describe(NS)
    );
    eprintln!(
        "50/50 split in use {:.1}s after the route was created: web {}, web-canary {}",
        route_at.elapsed().as_secs_f64(),
        count(&after, "web"),
        count(&after, "web-canary")
    );

    // 0/100: web-canary alone, from some request on.
    let mark = log().lines().count();
    let shift_at = Instant::now();
    cluster
        .api
        .update(split_route(0, 100))
        .await
        .expect("the HTTPRoute is updated");
    let shifted = cluster
        .wait_for_log(NS, "vote-bot", "caller", Duration::from_secs(90), |log| {
            let a = answers(&lines_after(log, mark));
            a.len() >= 20 && a[a.len() - 20..].iter().all(|w| w == "web-canary")
        })
        .await;
    assert!(
        shifted,
        "the 0/100 split did not take effect: {:?}\n{}",
        answers(&lines_after(&log(), mark)),
        cluster.describe(NS)
    );
    eprintln!(
        "0/100 split in use {:.1}s after the route was changed",
        shift_at.elapsed().as_secs_f64()
    );
    let mark = log().lines().count();
    let more = cluster
        .wait_for_log(NS, "vote-bot", "caller", Duration::from_secs(60), |log| {
            answers(&lines_after(log, mark)).len() >= 20
        })
        .await;
    let last = answers(&lines_after(&log(), mark));
    assert!(more, "vote-bot stopped calling: {last:?}");
    assert!(
        last.iter().all(|w| w == "web-canary"),
        "after the shift, web-canary alone answers: {last:?}"
    );
    let vote_bot = log();
    let since_route = answers(&lines_after(&vote_bot, route_mark));
    let fails = fails_after_first_ok(&vote_bot);
    assert!(
        count(&since_route, "fail") == 0 && fails.is_empty(),
        "no request failed once web answered: {fails:?}\n{vote_bot}\n{}",
        cluster.describe(NS)
    );
    // vote-bot reached web-canary over mutual TLS too.
    let (secured, open) = cluster
        .outbound_mtls_to(NS, "vote-bot", &identity("web-canary"))
        .await;
    assert!(secured, "vote-bot -> web-canary is not mutual TLS:\n{open}");
}

/// A caller printing `code STATUS` for each request to voting (`000` when no
/// HTTP answer came).
fn status_caller() -> &'static str {
    "while :; do echo code $(curl -s -o /dev/null -m 5 -w '%{http_code}' \
     http://voting.emojivoto.svc.cluster.local/); sleep 0.2; done"
}

/// The status codes a [`status_caller`] printed after its first `skip` lines.
fn codes(log: &str, skip: usize) -> Vec<String> {
    lines_after(log, skip)
        .iter()
        .filter_map(|l| l.strip_prefix("code "))
        .map(|c| c.trim().to_string())
        .collect()
}

/// Test 3: a Server on voting's port 8080 with an AuthorizationPolicy
/// requiring a MeshTLSAuthentication of web's identity alone: web's requests
/// to voting still succeed; a meshed caller with another service account
/// gets 403 from voting's proxy, and an unmeshed caller is refused too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authorization_policy_admits_only_the_named_identity() {
    if !can_run() {
        return;
    }
    let cluster = ClusterBox::installed().await;
    cluster.apply(&emojivoto()).await;
    cluster
        .create_all(caller_objects(NS, "intruder", status_caller(), json!({})))
        .await;
    cluster
        .create_all(caller_objects(
            NS,
            "outsider",
            status_caller(),
            json!({"linkerd.io/inject": "disabled"}),
        ))
        .await;
    cluster
        .wait_deployments_ready(NS, Duration::from_secs(120))
        .await;
    let has_proxy = |app: &str| {
        cluster
            .pods_of(NS, app)
            .iter()
            .all(|p| container_names(p, "containers").contains(&"linkerd-proxy".to_string()))
    };
    assert!(has_proxy("intruder"), "intruder is meshed");
    assert!(!has_proxy("outsider"), "outsider is not meshed");

    // Without a Server, the default policy (all-unauthenticated) admits all.
    for app in ["intruder", "outsider"] {
        let admitted = cluster
            .wait_for_log(NS, app, "caller", Duration::from_secs(90), |log| {
                codes(log, 0).iter().filter(|c| *c == "200").count() >= 3
            })
            .await;
        assert!(
            admitted,
            "{app} is not admitted before the policy: {:?}\n{}",
            codes(&cluster.log_of(NS, app, "caller"), 0),
            cluster.describe(NS)
        );
    }
    let web_log = || cluster.log_of(NS, "web", "caller");
    assert!(
        web_log().contains("ok http://voting."),
        "web calls voting: {}",
        web_log()
    );

    // The policy: authentication and authorization first, the Server last,
    // so no moment has a Server without its authorization.
    let web_mark = web_log().lines().count();
    let marks: Vec<usize> = ["intruder", "outsider"]
        .iter()
        .map(|app| cluster.log_of(NS, app, "caller").lines().count())
        .collect();
    let policy_at = Instant::now();
    cluster
        .create_all(cluster::only_identity_to(NS, "voting", &identity("web")))
        .await;

    // The meshed intruder gets 403 from voting's proxy, from some request on.
    let denied = cluster
        .wait_for_log(NS, "intruder", "caller", Duration::from_secs(90), |log| {
            let c = codes(log, marks[0]);
            c.len() >= 5 && c[c.len() - 5..].iter().all(|c| c == "403")
        })
        .await;
    assert!(
        denied,
        "intruder is not denied 403: {:?}\n{}",
        codes(&cluster.log_of(NS, "intruder", "caller"), marks[0]),
        cluster.describe(NS)
    );
    eprintln!(
        "the policy denied intruder {:.1}s after it was created",
        policy_at.elapsed().as_secs_f64()
    );
    // The unmeshed outsider is refused too.
    let refused = cluster
        .wait_for_log(NS, "outsider", "caller", Duration::from_secs(90), |log| {
            let c = codes(log, marks[1]);
            c.len() >= 5 && c[c.len() - 5..].iter().all(|c| c != "200")
        })
        .await;
    let outsider_codes = codes(&cluster.log_of(NS, "outsider", "caller"), marks[1]);
    assert!(
        refused,
        "outsider is not refused: {outsider_codes:?}\n{}",
        cluster.describe(NS)
    );
    eprintln!(
        "outsider's answers since the policy: {:?}",
        outsider_codes.iter().rev().take(5).collect::<Vec<_>>()
    );

    // From then on: web still reaches voting, the others never do.
    let web_now = web_log().lines().count();
    let now: Vec<usize> = ["intruder", "outsider"]
        .iter()
        .map(|app| cluster.log_of(NS, app, "caller").lines().count())
        .collect();
    let more = cluster
        .wait_for_log(NS, "web", "caller", Duration::from_secs(60), |log| {
            lines_after(log, web_now)
                .iter()
                .filter(|l| l.starts_with("ok http://voting."))
                .count()
                >= 10
        })
        .await;
    assert!(
        more,
        "web's requests to voting stopped succeeding: {:?}\n{}",
        lines_after(&web_log(), web_now),
        cluster.describe(NS)
    );
    let intruder = codes(&cluster.log_of(NS, "intruder", "caller"), now[0]);
    let outsider = codes(&cluster.log_of(NS, "outsider", "caller"), now[1]);
    assert!(
        !intruder.is_empty() && intruder.iter().all(|c| c == "403"),
        "intruder: {intruder:?}"
    );
    assert!(
        !outsider.is_empty() && outsider.iter().all(|c| c != "200"),
        "outsider: {outsider:?}"
    );
    let web_after = web_log();
    let web_fails: Vec<&str> = lines_after(&web_after, web_mark)
        .into_iter()
        .filter(|l| l.starts_with("fail http://voting."))
        .collect();
    assert!(
        web_fails.is_empty() && fails_after_first_ok(&web_after).is_empty(),
        "web's requests failed: {web_fails:?}\n{web_after}"
    );
    // voting's proxy counted the denials.
    let (status, metrics) = cluster
        .get((cluster.pod_ip(NS, "voting"), 4191).into(), "/metrics")
        .await
        .expect("voting's proxy /metrics");
    assert_eq!(status, 200);
    let denials: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("inbound_http_authz_deny_total"))
        .collect();
    assert!(
        !denials.is_empty(),
        "voting's proxy counts its denials:\n{}",
        metrics
            .lines()
            .filter(|l| l.contains("authz"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
