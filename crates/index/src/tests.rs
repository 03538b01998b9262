//! Table tests for the pure index: the seed 000 IP rules, service endpoints,
//! profiles, change sets and mesh hints.
//!
//! Fixtures are Kubernetes JSON, decoded by `Resource::from_value` as a source
//! would, built by the small builders at the bottom of this file.

use super::*;
use crate::resource::{Kind, ObjectKey, Resource};
use serde_json::{json, Value};
use std::{
    collections::{BTreeMap, HashSet},
    net::{Ipv4Addr, SocketAddrV4},
};

const NS: &str = "ns";
const T0: &str = "2024-01-01T00:00:00Z";
const T1: &str = "2024-01-02T00:00:00Z";
const T2: &str = "2024-01-03T00:00:00Z";

// === Seed 000: which pod owns an address ===

#[test]
fn ip_lookup_rules() {
    struct Case {
        name: &'static str,
        objects: Vec<Resource>,
        query: &'static str,
        /// What `pod_for_addr` answers.
        owner: Option<&'static str>,
        /// The pod `endpoints(Addr)` names (only a Running, Ready owner).
        serving: Option<&'static str>,
    }
    let node = "10.1.0.1";
    let cases = vec![
        Case {
            name: "running pod",
            objects: vec![pod("web", "10.0.0.1", "Running").r()],
            query: "10.0.0.1:8080",
            owner: Some("web"),
            serving: Some("web"),
        },
        Case {
            name: "pod IP matches on any port",
            objects: vec![pod("web", "10.0.0.1", "Running").port("http", 8080).r()],
            query: "10.0.0.1:1234",
            owner: Some("web"),
            serving: Some("web"),
        },
        Case {
            name: "unknown IP",
            objects: vec![pod("web", "10.0.0.1", "Running").r()],
            query: "10.0.0.2:8080",
            owner: None,
            serving: None,
        },
        Case {
            name: "running and terminating share an IP: the running one",
            objects: vec![
                pod("old", "10.0.0.1", "Running")
                    .created(T2)
                    .terminating()
                    .r(),
                pod("new", "10.0.0.1", "Running").created(T0).r(),
            ],
            query: "10.0.0.1:8080",
            owner: Some("new"),
            serving: Some("new"),
        },
        Case {
            name: "pending and terminating share an IP: the pending one",
            objects: vec![
                pod("old", "10.0.0.1", "Running").terminating().r(),
                pod("new", "10.0.0.1", "Pending").r(),
            ],
            query: "10.0.0.1:8080",
            owner: Some("new"),
            serving: None,
        },
        Case {
            name: "only a terminating pod: answered bare",
            objects: vec![pod("old", "10.0.0.1", "Running").terminating().r()],
            query: "10.0.0.1:8080",
            owner: None,
            serving: None,
        },
        Case {
            name: "succeeded pod never matches",
            objects: vec![pod("job", "10.0.0.1", "Succeeded").r()],
            query: "10.0.0.1:8080",
            owner: None,
            serving: None,
        },
        Case {
            name: "failed pod never matches",
            objects: vec![pod("job", "10.0.0.1", "Failed").r()],
            query: "10.0.0.1:8080",
            owner: None,
            serving: None,
        },
        Case {
            name: "succeeded and failed pods leave the IP to a running one",
            objects: vec![
                pod("a", "10.0.0.1", "Succeeded").created(T2).r(),
                pod("b", "10.0.0.1", "Failed").created(T2).r(),
                pod("c", "10.0.0.1", "Running").created(T0).r(),
            ],
            query: "10.0.0.1:8080",
            owner: Some("c"),
            serving: Some("c"),
        },
        Case {
            name: "running but not ready: owner, not serving",
            objects: vec![pod("web", "10.0.0.1", "Running").ready(false).r()],
            query: "10.0.0.1:8080",
            owner: Some("web"),
            serving: None,
        },
        Case {
            name: "second IP of a dual-stack pod",
            objects: vec![pod("web", "10.0.0.1", "Running")
                .ips(&["10.0.0.1", "fd00::1"])
                .r()],
            query: "[fd00::1]:8080",
            owner: Some("web"),
            serving: Some("web"),
        },
        Case {
            name: "hostNetwork pod on a port it declares",
            objects: vec![host_net_pod("exporter", node).port("metrics", 9100).r()],
            query: "10.1.0.1:9100",
            owner: Some("exporter"),
            serving: Some("exporter"),
        },
        Case {
            name: "hostNetwork pod on a hostPort it declares",
            objects: vec![host_net_pod("agent", node).host_port("", 8126, 8126).r()],
            query: "10.1.0.1:8126",
            owner: Some("agent"),
            serving: Some("agent"),
        },
        Case {
            name: "hostNetwork pod on a port it does not declare",
            objects: vec![host_net_pod("exporter", node).port("metrics", 9100).r()],
            query: "10.1.0.1:9101",
            owner: None,
            serving: None,
        },
        Case {
            name: "several hostNetwork pods on one node: each by its port",
            objects: vec![
                host_net_pod("exporter", node).port("metrics", 9100).r(),
                host_net_pod("kube-proxy", node).port("health", 10256).r(),
                host_net_pod("agent", node).host_port("apm", 8126, 8126).r(),
            ],
            query: "10.1.0.1:10256",
            owner: Some("kube-proxy"),
            serving: Some("kube-proxy"),
        },
        Case {
            name: "several hostNetwork pods on one node: an undeclared port",
            objects: vec![
                host_net_pod("exporter", node).port("metrics", 9100).r(),
                host_net_pod("kube-proxy", node).port("health", 10256).r(),
            ],
            query: "10.1.0.1:22",
            owner: None,
            serving: None,
        },
        Case {
            name: "terminating hostNetwork pod never matches",
            objects: vec![host_net_pod("exporter", node)
                .port("metrics", 9100)
                .terminating()
                .r()],
            query: "10.1.0.1:9100",
            owner: None,
            serving: None,
        },
        Case {
            name: "hostPort of a pod-network pod on its host IP",
            objects: vec![pod("ingress", "10.0.0.7", "Running")
                .host(node)
                .host_port("https", 443, 8443)
                .r()],
            query: "10.1.0.1:8443",
            owner: Some("ingress"),
            serving: Some("ingress"),
        },
        Case {
            name: "container port of a pod-network pod is not on its host IP",
            objects: vec![pod("ingress", "10.0.0.7", "Running")
                .host(node)
                .host_port("https", 443, 8443)
                .r()],
            query: "10.1.0.1:443",
            owner: None,
            serving: None,
        },
        Case {
            name: "pod-network pod with a hostPort still owns its pod IP",
            objects: vec![pod("ingress", "10.0.0.7", "Running")
                .host(node)
                .host_port("https", 443, 8443)
                .r()],
            query: "10.0.0.7:443",
            owner: Some("ingress"),
            serving: Some("ingress"),
        },
        Case {
            name: "pod-network pod without hostPort does not own its host IP",
            objects: vec![pod("web", "10.0.0.8", "Running")
                .host(node)
                .port("http", 8080)
                .r()],
            query: "10.1.0.1:8080",
            owner: None,
            serving: None,
        },
        Case {
            name: "a host port claim comes before a pod IP claim",
            objects: vec![
                host_net_pod("exporter", node).port("metrics", 9100).r(),
                pod("odd", node, "Running").created(T2).r(),
            ],
            query: "10.1.0.1:9100",
            owner: Some("exporter"),
            serving: Some("exporter"),
        },
        Case {
            name: "the pod IP claim on the node's other ports",
            objects: vec![
                host_net_pod("exporter", node).port("metrics", 9100).r(),
                pod("odd", node, "Running").created(T2).r(),
            ],
            query: "10.1.0.1:9101",
            owner: Some("odd"),
            serving: Some("odd"),
        },
    ];
    for case in cases {
        // Both arrival orders must give the same answer.
        for reversed in [false, true] {
            let mut objects = case.objects.clone();
            if reversed {
                objects.reverse();
            }
            let name = format!("{} (reversed: {reversed})", case.name);
            let mut index = Index::new(IndexConfig::default());
            let mut conflicts = Vec::new();
            for o in objects {
                conflicts.extend(index.apply(o).new_conflicts);
            }
            assert_eq!(conflicts, vec![], "{name}: no conflict");
            assert_eq!(index.sizes().conflicts, 0, "{name}: conflict count");

            let addr: SocketAddr = case.query.parse().unwrap();
            let owner = index.pod_for_addr(addr).map(|p| p.key.clone());
            assert_eq!(owner, case.owner.map(k), "{name}: pod_for_addr");

            let set = index.endpoints(&Target::Addr(addr));
            assert!(set.exists, "{name}: an address always exists");
            assert_eq!(set.endpoints.len(), 1, "{name}: one endpoint");
            let endpoint = &set.endpoints[&addr];
            assert_eq!(endpoint.pod, case.serving.map(k), "{name}: endpoint pod");
            match case.serving {
                Some(pod) => {
                    assert_eq!(endpoint.labels["pod"], pod, "{name}: pod label");
                    assert_eq!(set.labels, labels(&[("namespace", NS)]), "{name}");
                }
                None => {
                    assert_eq!(*endpoint, Endpoint::bare(addr), "{name}: bare endpoint");
                    assert_eq!(set.labels, labels(&[]), "{name}: no set labels");
                    assert_eq!(
                        index.profile(&Target::Addr(addr)),
                        ProfileView::Address {
                            addr,
                            opaque: false
                        },
                        "{name}: bare profile"
                    );
                }
            }
        }
    }
}

#[test]
fn ip_tie_is_settled_by_rank_in_any_order() {
    struct Case {
        name: &'static str,
        pods: Vec<Resource>,
        winner: &'static str,
        /// The live claimants reported in the conflict (none: no conflict).
        claimants: &'static [&'static str],
    }
    let ip = "10.0.0.1";
    let cases = vec![
        Case {
            name: "running beats pending, even when older",
            pods: vec![
                pod("run", ip, "Running").created(T0).r(),
                pod("pend", ip, "Pending").created(T2).r(),
            ],
            winner: "run",
            claimants: &["pend", "run"],
        },
        Case {
            name: "running beats unknown",
            pods: vec![
                pod("run", ip, "Running").created(T0).r(),
                pod("unk", ip, "Unknown").created(T2).r(),
            ],
            winner: "run",
            claimants: &["run", "unk"],
        },
        Case {
            name: "ready beats not ready, even when older",
            pods: vec![
                pod("ready", ip, "Running").created(T0).r(),
                pod("unready", ip, "Running").created(T2).ready(false).r(),
            ],
            winner: "ready",
            claimants: &["ready", "unready"],
        },
        Case {
            name: "newest creationTimestamp wins",
            pods: vec![
                pod("a-old", ip, "Running").created(T0).r(),
                pod("z-new", ip, "Running").created(T1).r(),
            ],
            winner: "z-new",
            claimants: &["a-old", "z-new"],
        },
        Case {
            name: "a pod with a creationTimestamp beats one without",
            pods: vec![
                pod("a-none", ip, "Running").no_created().r(),
                pod("z-dated", ip, "Running").created(T0).r(),
            ],
            winner: "z-dated",
            claimants: &["a-none", "z-dated"],
        },
        Case {
            name: "then the lexically first name",
            pods: vec![
                pod("web-b", ip, "Running").r(),
                pod("web-a", ip, "Running").r(),
            ],
            winner: "web-a",
            claimants: &["web-a", "web-b"],
        },
        Case {
            name: "three claimants",
            pods: vec![
                pod("c", ip, "Running").created(T1).r(),
                pod("a", ip, "Running").created(T2).ready(false).r(),
                pod("b", ip, "Pending").created(T2).r(),
            ],
            winner: "c",
            claimants: &["a", "b", "c"],
        },
        Case {
            name: "a terminating claimant is no claimant at all",
            pods: vec![
                pod("new", ip, "Pending").created(T0).r(),
                pod("old", ip, "Running").created(T2).terminating().r(),
            ],
            winner: "new",
            claimants: &[],
        },
    ];
    for case in cases {
        for order in permutations(case.pods.len()) {
            let name = format!("{} (order {order:?})", case.name);
            let mut index = Index::new(IndexConfig::default());
            let mut conflicts = Vec::new();
            for i in &order {
                conflicts.extend(index.apply(case.pods[*i].clone()).new_conflicts);
            }
            let addr: SocketAddr = format!("{ip}:80").parse().unwrap();
            let owner = index.pod_for_addr(addr).map(|p| p.key.clone());
            assert_eq!(owner, Some(k(case.winner)), "{name}: owner");
            let key = ConflictKey::PodIp(ip.parse().unwrap());
            match case.claimants {
                [] => assert_eq!(conflicts, vec![], "{name}: no conflict"),
                // Reported when the second claimant arrives, with both.
                [_, _] => assert_eq!(
                    conflicts,
                    vec![Conflict {
                        key,
                        pods: case.claimants.iter().map(|n| k(n)).collect(),
                        chosen: k(case.winner),
                    }],
                    "{name}: reported conflict"
                ),
                _ => {
                    let keys: Vec<&ConflictKey> = conflicts.iter().map(|c| &c.key).collect();
                    assert_eq!(keys, vec![&key], "{name}: reported once");
                    let mut first_two: Vec<ObjectKey> = order[..2]
                        .iter()
                        .map(|i| case.pods[*i].key().clone())
                        .collect();
                    first_two.sort();
                    assert_eq!(conflicts[0].pods, first_two, "{name}: claimants so far");
                }
            }
            assert_eq!(
                index.sizes().conflicts,
                usize::from(!case.claimants.is_empty()),
                "{name}: conflict count"
            );
            // Lookups never report anything and never change the answer.
            for _ in 0..3 {
                assert_eq!(index.pod_for_addr(addr).map(|p| p.key.clone()), owner);
                let _ = index.endpoints(&Target::Addr(addr));
                let _ = index.profile(&Target::Addr(addr));
            }
            assert_eq!(
                index.sizes().conflicts,
                usize::from(!case.claimants.is_empty()),
                "{name}: conflict count after lookups"
            );
        }
    }
}

/// One operation on the index.
#[derive(Clone)]
enum Op {
    Apply(Box<Resource>),
    Delete(Kind, ObjectKey),
    Reset(Kind, Vec<Resource>),
}

fn apply_op(r: Resource) -> Op {
    Op::Apply(Box::new(r))
}

fn run(index: &mut Index, op: Op) -> Changes {
    match op {
        Op::Apply(r) => index.apply(*r),
        Op::Delete(kind, key) => index.delete(kind, &key),
        Op::Reset(kind, objects) => index.reset(kind, objects),
    }
}

#[test]
fn ip_conflict_is_reported_once_per_appearance() {
    struct Step {
        op: Op,
        /// Keys reported in `Changes::new_conflicts` by this step.
        reported: Vec<ConflictKey>,
        /// `sizes().conflicts` after the step.
        conflicts: usize,
        /// `pod_for_addr(query)` after the step.
        owner: Option<&'static str>,
    }
    fn step(
        op: Op,
        reported: &[ConflictKey],
        conflicts: usize,
        owner: Option<&'static str>,
    ) -> Step {
        Step {
            op,
            reported: reported.to_vec(),
            conflicts,
            owner,
        }
    }
    struct Case {
        name: &'static str,
        query: &'static str,
        steps: Vec<Step>,
    }
    let ip = "10.0.0.1";
    let a = pod("a", ip, "Running").created(T0);
    let b = pod("b", ip, "Running").created(T1);
    let c = pod("c", ip, "Running").created(T2);
    const X: ConflictKey = ConflictKey::PodIp(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)));
    let apply = |p: &PodJson| apply_op(p.r());
    let delete = |name: &str| Op::Delete(Kind::Pod, k(name));
    let node = "10.1.0.1";
    let ing1 = pod("ing-1", "10.0.0.11", "Running")
        .created(T0)
        .host(node)
        .host_port("https", 443, 8443);
    let ing2 = pod("ing-2", "10.0.0.12", "Running")
        .created(T1)
        .host(node)
        .host_port("https", 443, 8443);
    const HP: ConflictKey = ConflictKey::HostPort(SocketAddr::V4(SocketAddrV4::new(
        Ipv4Addr::new(10, 1, 0, 1),
        8443,
    )));

    let cases = vec![
        Case {
            name: "not again on re-apply, reset or lookup; again after it went away",
            query: "10.0.0.1:80",
            steps: vec![
                step(apply(&a), &[], 0, Some("a")),
                step(apply(&b), &[X], 1, Some("b")),
                step(apply(&b), &[], 1, Some("b")),
                step(apply(&a), &[], 1, Some("b")),
                step(Op::Reset(Kind::Pod, vec![a.r(), b.r()]), &[], 1, Some("b")),
                step(delete("b"), &[], 0, Some("a")),
                step(delete("b"), &[], 0, Some("a")),
                step(apply(&b), &[X], 1, Some("b")),
            ],
        },
        Case {
            name: "an update to a claimant does not report the conflict again",
            query: "10.0.0.1:80",
            steps: vec![
                step(apply(&a), &[], 0, Some("a")),
                step(apply(&b), &[X], 1, Some("b")),
                step(
                    apply(&b.clone().labels(&[("app", "v2")])),
                    &[],
                    1,
                    Some("b"),
                ),
                step(apply(&b.clone().ready(false)), &[], 1, Some("a")),
                step(
                    apply(&a.clone().labels(&[("app", "v2")])),
                    &[],
                    1,
                    Some("a"),
                ),
            ],
        },
        Case {
            name: "a third claimant joins and leaves an existing conflict",
            query: "10.0.0.1:80",
            steps: vec![
                step(apply(&a), &[], 0, Some("a")),
                step(apply(&b), &[X], 1, Some("b")),
                step(apply(&c), &[], 1, Some("c")),
                step(delete("c"), &[], 1, Some("b")),
                step(delete("a"), &[], 0, Some("b")),
            ],
        },
        Case {
            name: "a claimant that starts terminating ends the conflict",
            query: "10.0.0.1:80",
            steps: vec![
                step(apply(&a), &[], 0, Some("a")),
                step(apply(&b), &[X], 1, Some("b")),
                step(apply(&b.clone().terminating()), &[], 0, Some("a")),
                step(apply(&c), &[X], 1, Some("c")),
                step(apply(&c.clone().phase("Succeeded")), &[], 0, Some("a")),
            ],
        },
        Case {
            name: "a reset that drops a claimant ends the conflict",
            query: "10.0.0.1:80",
            steps: vec![
                step(Op::Reset(Kind::Pod, vec![a.r(), b.r()]), &[X], 1, Some("b")),
                step(Op::Reset(Kind::Pod, vec![a.r()]), &[], 0, Some("a")),
                step(Op::Reset(Kind::Pod, vec![a.r(), b.r()]), &[X], 1, Some("b")),
                step(Op::Reset(Kind::Pod, vec![]), &[], 0, None),
            ],
        },
        Case {
            name: "two pods claiming one hostPort on a node",
            query: "10.1.0.1:8443",
            steps: vec![
                step(apply(&ing1), &[], 0, Some("ing-1")),
                step(apply(&ing2), &[HP], 1, Some("ing-2")),
                step(apply(&ing2), &[], 1, Some("ing-2")),
                step(delete("ing-2"), &[], 0, Some("ing-1")),
            ],
        },
    ];
    for case in cases {
        let mut index = Index::new(IndexConfig::default());
        let addr: SocketAddr = case.query.parse().unwrap();
        for (i, s) in case.steps.into_iter().enumerate() {
            let name = format!("{}: step {i}", case.name);
            let changes = run(&mut index, s.op);
            let reported: Vec<ConflictKey> = changes
                .new_conflicts
                .iter()
                .map(|c| c.key.clone())
                .collect();
            assert_eq!(reported, s.reported, "{name}: reported conflicts");
            assert_eq!(
                index.sizes().conflicts,
                s.conflicts,
                "{name}: conflict count"
            );
            let owner = index.pod_for_addr(addr).map(|p| p.key.clone());
            assert_eq!(owner, s.owner.map(k), "{name}: owner");
        }
    }
}

#[test]
fn reused_pod_ip_resolves_to_the_new_pod() {
    struct Case {
        name: &'static str,
        ops: Vec<Op>,
        owner: &'static str,
    }
    let ip = "10.0.0.1";
    let old = || {
        pod("old", ip, "Running")
            .created(T0)
            .labels(&[("app", "old"), ("tier", "legacy")])
            .sa("old-sa")
            .port("http", 8080)
    };
    let new = || {
        pod("new", ip, "Running")
            .created(T1)
            .labels(&[("app", "new")])
            .sa("new-sa")
            .port("http", 8080)
    };
    // A pod recreated under the same name (a StatefulSet's), with new labels.
    let same_name_new = || {
        pod("old", ip, "Running")
            .created(T1)
            .labels(&[("app", "new")])
            .sa("new-sa")
            .port("http", 8080)
    };
    let cases = vec![
        Case {
            name: "deleted, then a new pod gets the IP",
            ops: vec![
                apply_op(old().r()),
                Op::Delete(Kind::Pod, k("old")),
                apply_op(new().r()),
            ],
            owner: "new",
        },
        Case {
            name: "new pod arrives before the old one's delete",
            ops: vec![
                apply_op(old().r()),
                apply_op(old().terminating().r()),
                apply_op(new().r()),
                Op::Delete(Kind::Pod, k("old")),
            ],
            owner: "new",
        },
        Case {
            name: "old pod still listed as terminating",
            ops: vec![
                apply_op(old().r()),
                apply_op(new().r()),
                apply_op(old().terminating().r()),
            ],
            owner: "new",
        },
        Case {
            name: "old pod finished",
            ops: vec![
                apply_op(old().r()),
                apply_op(old().phase("Succeeded").r()),
                apply_op(new().r()),
            ],
            owner: "new",
        },
        Case {
            name: "same name recreated after a delete",
            ops: vec![
                apply_op(old().r()),
                Op::Delete(Kind::Pod, k("old")),
                apply_op(same_name_new().r()),
            ],
            owner: "old",
        },
        Case {
            name: "same name replaced without a delete (missed event)",
            ops: vec![apply_op(old().r()), apply_op(same_name_new().r())],
            owner: "old",
        },
    ];
    for case in cases {
        let name = case.name;
        let mut index = Index::new(IndexConfig::default());
        index.apply(
            svc("old-svc")
                .selector(&[("app", "old")])
                .port("http", 80, json!("http"))
                .r(),
        );
        index.apply(
            svc("new-svc")
                .selector(&[("app", "new")])
                .port("http", 80, json!("http"))
                .r(),
        );
        for op in case.ops {
            run(&mut index, op);
        }
        let addr: SocketAddr = format!("{ip}:8080").parse().unwrap();
        let pod = index.pod_for_addr(addr).expect("the IP has an owner");
        assert_eq!(pod.key, k(case.owner), "{name}: owner");
        assert_eq!(
            pod.labels,
            labels(&[("app", "new")]).into(),
            "{name}: labels"
        );
        assert_eq!(pod.service_account, "new-sa", "{name}: service account");
        assert_eq!(index.sizes().conflicts, 0, "{name}: no conflict");

        let set = index.endpoints(&Target::Addr(addr));
        assert_eq!(
            set.endpoints[&addr].labels,
            labels(&[("pod", case.owner), ("serviceaccount", "new-sa")]),
            "{name}: endpoint labels"
        );
        let old_svc = index.endpoints(&svc_target("old-svc", 80));
        assert_eq!(old_svc.endpoints.len(), 0, "{name}: old service is empty");
        let new_svc = index.endpoints(&svc_target("new-svc", 80));
        let addrs: Vec<SocketAddr> = new_svc.endpoints.keys().copied().collect();
        assert_eq!(addrs, vec![addr], "{name}: new service");
        assert_eq!(new_svc.endpoints[&addr].pod, Some(k(case.owner)), "{name}");
    }
}

// === Service endpoints ===

#[test]
fn service_endpoints() {
    type Labels = &'static [(&'static str, &'static str)];
    struct Case {
        name: &'static str,
        objects: Vec<Resource>,
        service: &'static str,
        port: u16,
        exists: bool,
        /// Endpoint address and its labels.
        want: Vec<(&'static str, Labels)>,
    }
    let web_pod = |name: &str, ip: &str| {
        pod(name, ip, "Running")
            .labels(&[("app", "web"), ("pod-template-hash", "5d8f9")])
            .owner("ReplicaSet", "web-5d8f9")
            .sa("web-sa")
            .port("http", 8080)
            .port("admin", 9990)
    };
    let web_svc = || {
        svc("web")
            .ip("10.96.0.10")
            .selector(&[("app", "web")])
            .port("http", 80, json!("http"))
            .port("admin", 9990, json!(9990))
    };
    let deploy_labels: Labels = &[
        ("deployment", "web"),
        ("pod", "web-5d8f9-a"),
        ("pod_template_hash", "5d8f9"),
        ("serviceaccount", "web-sa"),
        ("zone", "zone-a"),
    ];
    let cases = vec![
        Case {
            name: "slice: port by name, not-ready excluded, zone and pod labels",
            objects: vec![
                web_svc().r(),
                web_pod("web-5d8f9-a", "10.0.0.1").r(),
                web_pod("web-5d8f9-b", "10.0.0.2").r(),
                web_pod("web-5d8f9-c", "10.0.0.3").r(),
                slice("web-abc", "web")
                    .port("admin", 9990)
                    .port("http", 8080)
                    .endpoint(ep("10.0.0.1").zone("zone-a").pod("web-5d8f9-a"))
                    .endpoint(ep("10.0.0.2").zone("zone-b").pod("web-5d8f9-b"))
                    .endpoint(ep("10.0.0.3").zone("zone-a").pod("web-5d8f9-c").not_ready())
                    .r(),
            ],
            service: "web",
            port: 80,
            exists: true,
            want: vec![
                ("10.0.0.1:8080", deploy_labels),
                (
                    "10.0.0.2:8080",
                    &[
                        ("deployment", "web"),
                        ("pod", "web-5d8f9-b"),
                        ("pod_template_hash", "5d8f9"),
                        ("serviceaccount", "web-sa"),
                        ("zone", "zone-b"),
                    ],
                ),
            ],
        },
        Case {
            name: "slice: the second service port",
            objects: vec![
                web_svc().r(),
                web_pod("web-5d8f9-a", "10.0.0.1").r(),
                slice("web-abc", "web")
                    .port("http", 8080)
                    .port("admin", 9990)
                    .endpoint(ep("10.0.0.1").zone("zone-a").pod("web-5d8f9-a"))
                    .r(),
            ],
            service: "web",
            port: 9990,
            exists: true,
            want: vec![("10.0.0.1:9990", deploy_labels)],
        },
        Case {
            name: "slice: a port the slice does not list",
            objects: vec![
                web_svc().r(),
                slice("web-abc", "web")
                    .port("http", 8080)
                    .endpoint(ep("10.0.0.1"))
                    .r(),
            ],
            service: "web",
            port: 9990,
            exists: true,
            want: vec![],
        },
        Case {
            name: "slice: unnamed service port matches the unnamed slice port",
            objects: vec![
                svc("db").ip("10.96.0.20").port("", 5432, json!(15432)).r(),
                slice("db-1", "db")
                    .port("", 15432)
                    .endpoint(ep("10.0.0.9"))
                    .r(),
            ],
            service: "db",
            port: 5432,
            exists: true,
            want: vec![("10.0.0.9:15432", &[("zone", "")])],
        },
        Case {
            name: "slice: endpoints without a pod, and a pod the index lacks, are bare",
            objects: vec![
                web_svc().r(),
                slice("web-abc", "web")
                    .port("http", 8080)
                    .endpoint(ep("10.0.0.1").zone("zone-a"))
                    .endpoint(ep("10.0.0.2").pod("gone"))
                    .r(),
            ],
            service: "web",
            port: 80,
            exists: true,
            want: vec![
                ("10.0.0.1:8080", &[("zone", "zone-a")]),
                ("10.0.0.2:8080", &[("zone", "")]),
            ],
        },
        Case {
            name: "slice: several slices of one service, others' slices ignored",
            objects: vec![
                web_svc().r(),
                svc("api")
                    .selector(&[("app", "api")])
                    .port("http", 80, json!(8080))
                    .r(),
                slice("web-1", "web")
                    .port("http", 8080)
                    .endpoint(ep("10.0.0.1"))
                    .r(),
                slice("web-2", "web")
                    .port("http", 8081)
                    .endpoint(ep("10.0.0.2"))
                    .r(),
                slice("api-1", "api")
                    .port("http", 8080)
                    .endpoint(ep("10.0.0.3"))
                    .r(),
            ],
            service: "web",
            port: 80,
            exists: true,
            want: vec![
                ("10.0.0.1:8080", &[("zone", "")]),
                ("10.0.0.2:8081", &[("zone", "")]),
            ],
        },
        Case {
            name: "slice: takes precedence over the selector",
            objects: vec![
                web_svc().r(),
                web_pod("web-5d8f9-a", "10.0.0.1").r(),
                web_pod("web-5d8f9-b", "10.0.0.2").r(),
                slice("web-abc", "web")
                    .port("http", 8080)
                    .endpoint(ep("10.0.0.1").zone("zone-a").pod("web-5d8f9-a"))
                    .r(),
            ],
            service: "web",
            port: 80,
            exists: true,
            want: vec![("10.0.0.1:8080", deploy_labels)],
        },
        Case {
            name: "slice: owner labels of other controllers",
            objects: vec![
                svc("mixed").port("tcp", 7000, json!(7000)).r(),
                pod("db-0", "10.0.0.1", "Running")
                    .owner("StatefulSet", "db")
                    .r(),
                pod("migrate-x", "10.0.0.2", "Running")
                    .owner("Job", "migrate")
                    .r(),
                pod("rs-x", "10.0.0.3", "Running")
                    .labels(&[("pod-template-hash", "abc")])
                    .owner("ReplicaSet", "bare-rs")
                    .r(),
                slice("mixed-1", "mixed")
                    .port("tcp", 7000)
                    .endpoint(ep("10.0.0.1").pod("db-0"))
                    .endpoint(ep("10.0.0.2").pod("migrate-x"))
                    .endpoint(ep("10.0.0.3").pod("rs-x"))
                    .r(),
            ],
            service: "mixed",
            port: 7000,
            exists: true,
            want: vec![
                (
                    "10.0.0.1:7000",
                    &[
                        ("pod", "db-0"),
                        ("serviceaccount", "default"),
                        ("statefulset", "db"),
                        ("zone", ""),
                    ],
                ),
                (
                    "10.0.0.2:7000",
                    &[
                        ("k8s_job", "migrate"),
                        ("pod", "migrate-x"),
                        ("serviceaccount", "default"),
                        ("zone", ""),
                    ],
                ),
                (
                    "10.0.0.3:7000",
                    &[
                        ("pod", "rs-x"),
                        ("pod_template_hash", "abc"),
                        ("replicaset", "bare-rs"),
                        ("serviceaccount", "default"),
                        ("zone", ""),
                    ],
                ),
            ],
        },
        Case {
            name: "selector: only live, ready pods of the namespace with the named port",
            objects: vec![
                web_svc().r(),
                pod("ok", "10.0.0.1", "Running")
                    .labels(&[("app", "web")])
                    .port("http", 8080)
                    .r(),
                pod("other-port", "10.0.0.2", "Running")
                    .labels(&[("app", "web"), ("extra", "x")])
                    .port("http", 8081)
                    .r(),
                pod("unready", "10.0.0.3", "Running")
                    .labels(&[("app", "web")])
                    .port("http", 8080)
                    .ready(false)
                    .r(),
                pod("pending", "10.0.0.4", "Pending")
                    .labels(&[("app", "web")])
                    .port("http", 8080)
                    .r(),
                pod("dying", "10.0.0.5", "Running")
                    .labels(&[("app", "web")])
                    .port("http", 8080)
                    .terminating()
                    .r(),
                pod("done", "10.0.0.6", "Succeeded")
                    .labels(&[("app", "web")])
                    .port("http", 8080)
                    .r(),
                pod("no-named-port", "10.0.0.7", "Running")
                    .labels(&[("app", "web")])
                    .port("web", 8080)
                    .r(),
                pod("not-selected", "10.0.0.8", "Running")
                    .labels(&[("app", "api")])
                    .port("http", 8080)
                    .r(),
                pod_in("elsewhere", "ok", "10.0.0.9", "Running")
                    .labels(&[("app", "web")])
                    .port("http", 8080)
                    .r(),
            ],
            service: "web",
            port: 80,
            exists: true,
            want: vec![
                (
                    "10.0.0.1:8080",
                    &[("pod", "ok"), ("serviceaccount", "default"), ("zone", "")],
                ),
                (
                    "10.0.0.2:8081",
                    &[
                        ("pod", "other-port"),
                        ("serviceaccount", "default"),
                        ("zone", ""),
                    ],
                ),
            ],
        },
        Case {
            name: "selector: numeric targetPort",
            objects: vec![
                web_svc().r(),
                web_pod("web-5d8f9-a", "10.0.0.1").r(),
                pod("no-ports", "10.0.0.2", "Running")
                    .labels(&[("app", "web")])
                    .r(),
            ],
            service: "web",
            port: 9990,
            exists: true,
            want: vec![
                (
                    "10.0.0.1:9990",
                    &[
                        ("deployment", "web"),
                        ("pod", "web-5d8f9-a"),
                        ("pod_template_hash", "5d8f9"),
                        ("serviceaccount", "web-sa"),
                        ("zone", ""),
                    ],
                ),
                (
                    "10.0.0.2:9990",
                    &[
                        ("pod", "no-ports"),
                        ("serviceaccount", "default"),
                        ("zone", ""),
                    ],
                ),
            ],
        },
        Case {
            name: "unknown service",
            objects: vec![web_svc().r(), web_pod("web-5d8f9-a", "10.0.0.1").r()],
            service: "nope",
            port: 80,
            exists: false,
            want: vec![],
        },
        Case {
            name: "service in another namespace is another service",
            objects: vec![svc_in("elsewhere", "web").port("http", 80, json!(8080)).r()],
            service: "web",
            port: 80,
            exists: false,
            want: vec![],
        },
        Case {
            name: "no selector and no slices: exists, empty",
            objects: vec![
                svc("manual")
                    .ip("10.96.0.30")
                    .port("http", 80, json!(8080))
                    .r(),
                pod("p", "10.0.0.1", "Running")
                    .labels(&[("app", "manual")])
                    .r(),
            ],
            service: "manual",
            port: 80,
            exists: true,
            want: vec![],
        },
        Case {
            name: "empty selector selects nothing",
            objects: vec![
                svc("empty").selector(&[]).port("http", 80, json!(8080)).r(),
                pod("p", "10.0.0.1", "Running").labels(&[("app", "x")]).r(),
            ],
            service: "empty",
            port: 80,
            exists: true,
            want: vec![],
        },
        Case {
            name: "ExternalName: exists, empty",
            objects: vec![
                svc("ext")
                    .external_name("db.example.com")
                    .selector(&[("app", "web")])
                    .r(),
                web_pod("web-5d8f9-a", "10.0.0.1").r(),
                slice("ext-1", "ext")
                    .port("", 80)
                    .endpoint(ep("10.0.0.1"))
                    .r(),
            ],
            service: "ext",
            port: 80,
            exists: true,
            want: vec![],
        },
    ];
    for case in cases {
        let name = case.name;
        let mut index = Index::new(IndexConfig::default());
        for o in case.objects {
            index.apply(o);
        }
        let target = svc_target(case.service, case.port);
        let set = index.endpoints(&target);
        assert_eq!(set.exists, case.exists, "{name}: exists");
        let want_labels = if case.exists {
            labels(&[("namespace", NS), ("service", case.service)])
        } else {
            labels(&[])
        };
        assert_eq!(set.labels, want_labels, "{name}: set labels");
        let got: BTreeMap<SocketAddr, BTreeMap<String, String>> = set
            .endpoints
            .iter()
            .map(|(a, e)| (*a, e.labels.clone()))
            .collect();
        let want: BTreeMap<SocketAddr, BTreeMap<String, String>> = case
            .want
            .iter()
            .map(|(a, l)| (a.parse().unwrap(), labels(l)))
            .collect();
        assert_eq!(got, want, "{name}: endpoints");
        for (addr, e) in &set.endpoints {
            assert_eq!(e.addr, *addr, "{name}: endpoint addr");
            let pod = e.labels.get("pod").map(|p| k(p));
            assert_eq!(e.pod, pod, "{name}: endpoint pod");
            let zone = e.labels.get("zone").filter(|z| !z.is_empty()).cloned();
            assert_eq!(e.zone, zone, "{name}: endpoint zone");
        }

        // By cluster IP: exactly the same answer as by name.
        if let Some(svc) = index.service(&k(case.service)) {
            for ip in svc.cluster_ips.clone() {
                let by_addr = index.endpoints(&Target::Addr(SocketAddr::new(ip, case.port)));
                assert_eq!(by_addr, set, "{name}: by cluster IP {ip}");
            }
        }
    }
}

#[test]
fn dual_stack_cluster_ips_answer_alike() {
    let mut index = Index::new(IndexConfig::default());
    index.apply(
        svc("web")
            .ip("10.96.0.10")
            .ips(&["10.96.0.10", "fd00:96::10"])
            .selector(&[("app", "web")])
            .port("http", 80, json!(8080))
            .r(),
    );
    index.apply(
        pod("w", "10.0.0.1", "Running")
            .labels(&[("app", "web")])
            .r(),
    );
    let by_name = index.endpoints(&svc_target("web", 80));
    let addrs: Vec<SocketAddr> = by_name.endpoints.keys().copied().collect();
    assert_eq!(addrs, vec!["10.0.0.1:8080".parse().unwrap()]);
    for addr in ["10.96.0.10:80", "[fd00:96::10]:80"] {
        let target = Target::Addr(addr.parse().unwrap());
        assert_eq!(index.endpoints(&target), by_name, "{addr}");
        assert_eq!(
            index.profile(&target),
            ProfileView::Service {
                service: k("web"),
                port: 80,
                opaque: false,
                profile: None,
            },
            "{addr}"
        );
    }
}

// === Profiles ===

#[test]
fn profiles() {
    struct Case {
        name: &'static str,
        objects: Vec<Resource>,
        target: Target,
        want: ProfileView,
    }
    let service = |name: &str, port: u16, opaque: bool| ProfileView::Service {
        service: k(name),
        port,
        opaque,
        profile: None,
    };
    let addr = |s: &str| -> SocketAddr { s.parse().unwrap() };
    let pod_view = |name: &str, at: &str, sa: &str, opaque: bool| {
        let endpoint = Endpoint {
            addr: addr(at),
            labels: labels(&[("namespace", NS), ("pod", name), ("serviceaccount", sa)]),
            mesh: None,
            opaque,
            zone: None,
            hints_for_zones: vec![],
            pod: Some(k(name)),
        };
        ProfileView::Pod { endpoint, opaque }
    };
    let db = || {
        svc("db")
            .ip("10.96.0.40")
            .selector(&[("app", "db")])
            .port("mysql", 3306, json!(3306))
            .port("http", 80, json!(8080))
    };
    let annotated = |ports: &str| {
        svc("annotated")
            .ip("10.96.0.41")
            .annotate("config.linkerd.io/opaque-ports", ports)
            .port("mysql-alt", 3307, json!("mysql"))
            .port("http", 80, json!(8080))
            .port("grpc", 4050, json!(4050))
            .port("mysql", 3306, json!(3306))
    };
    let cases = vec![
        Case {
            name: "service, default opaque port",
            objects: vec![db().r()],
            target: svc_target("db", 3306),
            want: service("db", 3306, true),
        },
        Case {
            name: "service, default non-opaque port",
            objects: vec![db().r()],
            target: svc_target("db", 80),
            want: service("db", 80, false),
        },
        Case {
            name: "service by cluster IP",
            objects: vec![db().r()],
            target: Target::Addr(addr("10.96.0.40:3306")),
            want: service("db", 3306, true),
        },
        Case {
            name: "service, port in an annotated range",
            objects: vec![annotated("25,4000-4100").r()],
            target: svc_target("annotated", 4050),
            want: service("annotated", 4050, true),
        },
        Case {
            name: "service, annotated number",
            objects: vec![annotated("25,4000-4100").r()],
            target: svc_target("annotated", 25),
            want: service("annotated", 25, true),
        },
        Case {
            name: "service, the annotation replaces the defaults",
            objects: vec![annotated("25,4000-4100").r()],
            target: svc_target("annotated", 3306),
            want: service("annotated", 3306, false),
        },
        Case {
            name: "service, annotated service port name",
            objects: vec![annotated("mysql-alt").r()],
            target: svc_target("annotated", 3307),
            want: service("annotated", 3307, true),
        },
        Case {
            name: "service, port not named in the annotation",
            objects: vec![annotated("mysql-alt").r()],
            target: svc_target("annotated", 80),
            want: service("annotated", 80, false),
        },
        Case {
            name: "service, annotated by cluster IP",
            objects: vec![annotated("mysql-alt, 4000-4100").r()],
            target: Target::Addr(addr("10.96.0.41:4050")),
            want: service("annotated", 4050, true),
        },
        Case {
            name: "unknown service",
            objects: vec![db().r()],
            target: svc_target("nope", 3306),
            want: ProfileView::UnknownService,
        },
        Case {
            name: "running, ready pod",
            objects: vec![pod("web", "10.0.0.1", "Running").sa("web-sa").r()],
            target: Target::Addr(addr("10.0.0.1:8080")),
            want: pod_view("web", "10.0.0.1:8080", "web-sa", false),
        },
        Case {
            name: "pod on a default opaque port",
            objects: vec![pod("db-0", "10.0.0.2", "Running").r()],
            target: Target::Addr(addr("10.0.0.2:3306")),
            want: pod_view("db-0", "10.0.0.2:3306", "default", true),
        },
        Case {
            name: "pod with an opaque-ports annotation by name",
            objects: vec![pod("db-0", "10.0.0.2", "Running")
                .annotate("config.linkerd.io/opaque-ports", "pg")
                .port("pg", 5433)
                .r()],
            target: Target::Addr(addr("10.0.0.2:5433")),
            want: pod_view("db-0", "10.0.0.2:5433", "default", true),
        },
        Case {
            name: "pod annotation replaces the defaults",
            objects: vec![pod("db-0", "10.0.0.2", "Running")
                .annotate("config.linkerd.io/opaque-ports", "5433")
                .r()],
            target: Target::Addr(addr("10.0.0.2:3306")),
            want: pod_view("db-0", "10.0.0.2:3306", "default", false),
        },
        Case {
            name: "pending pod: bare address",
            objects: vec![pod("web", "10.0.0.1", "Pending").r()],
            target: Target::Addr(addr("10.0.0.1:8080")),
            want: ProfileView::Address {
                addr: addr("10.0.0.1:8080"),
                opaque: false,
            },
        },
        Case {
            name: "running, unready pod: bare address",
            objects: vec![pod("web", "10.0.0.1", "Running").ready(false).r()],
            target: Target::Addr(addr("10.0.0.1:3306")),
            want: ProfileView::Address {
                addr: addr("10.0.0.1:3306"),
                opaque: true,
            },
        },
        Case {
            name: "unknown IP",
            objects: vec![db().r(), pod("web", "10.0.0.1", "Running").r()],
            target: Target::Addr(addr("10.9.9.9:8080")),
            want: ProfileView::Address {
                addr: addr("10.9.9.9:8080"),
                opaque: false,
            },
        },
        Case {
            name: "unknown IP on a default opaque port",
            objects: vec![],
            target: Target::Addr(addr("10.9.9.9:6379")),
            want: ProfileView::Address {
                addr: addr("10.9.9.9:6379"),
                opaque: true,
            },
        },
    ];
    for case in cases {
        let mut index = Index::new(IndexConfig::default());
        for o in case.objects {
            index.apply(o);
        }
        assert_eq!(index.profile(&case.target), case.want, "{}", case.name);
    }
}

#[test]
fn pod_profile_waits_for_running_and_ready() {
    let addr: SocketAddr = "10.0.0.1:8080".parse().unwrap();
    let target = Target::Addr(addr);
    // (phase, ready, terminating) in the order a pod lives them.
    let steps: Vec<(&str, bool, bool, bool)> = vec![
        ("Pending", false, false, false),
        // A Ready condition alone is not enough.
        ("Pending", true, false, false),
        ("Unknown", true, false, false),
        ("Running", false, false, false),
        ("Running", true, false, true),
        ("Running", false, false, false),
        ("Running", true, false, true),
        ("Running", true, true, false),
    ];
    let mut index = Index::new(IndexConfig::default());
    for (i, (phase, ready, terminating, want_pod)) in steps.into_iter().enumerate() {
        let mut p = pod("web", "10.0.0.1", phase).ready(ready);
        if terminating {
            p = p.terminating();
        }
        let changes = index.apply(p.r());
        assert!(changes.affects(&target, &index), "step {i}: change is seen");
        let view = index.profile(&target);
        match (want_pod, view) {
            (true, ProfileView::Pod { endpoint, .. }) => {
                assert_eq!(endpoint.pod, Some(k("web")), "step {i}");
                assert_eq!(endpoint.labels["namespace"], NS, "step {i}");
            }
            (false, ProfileView::Address { addr: a, .. }) => assert_eq!(a, addr, "step {i}"),
            (_, other) => panic!("step {i}: unexpected {other:?}"),
        }
    }
}

// === Changes ===

#[test]
fn changes() {
    struct Case {
        name: &'static str,
        setup: Vec<Resource>,
        op: Op,
        services: &'static [&'static str],
        ips: &'static [&'static str],
        /// `(pods, services, endpoint_slices, slice_endpoints)` after the op.
        sizes: (usize, usize, usize, usize),
    }
    let web_pod = || {
        pod("web-1", "10.0.0.1", "Running")
            .labels(&[("app", "a")])
            .port("http", 8080)
    };
    let svcs = || {
        vec![
            svc("svc-a")
                .ip("10.96.0.1")
                .selector(&[("app", "a")])
                .port("http", 80, json!(8080))
                .r(),
            svc("svc-b")
                .ip("10.96.0.2")
                .selector(&[("app", "b")])
                .port("http", 80, json!(8080))
                .r(),
            svc("svc-c")
                .ip("10.96.0.3")
                .selector(&[("app", "c")])
                .port("http", 80, json!(8080))
                .r(),
        ]
    };
    let manual = || svc("manual").ip("10.96.0.9").port("http", 80, json!(8080));
    let manual_slice = || {
        slice("manual-1", "manual")
            .port("http", 8080)
            .endpoint(ep("10.0.0.5").pod("backend"))
            .endpoint(ep("10.0.0.6"))
    };
    let backend = || pod("backend", "10.0.0.5", "Running").labels(&[("app", "backend")]);
    let with = |mut v: Vec<Resource>, more: Vec<Resource>| {
        v.extend(more);
        v
    };
    let cases = vec![
        Case {
            name: "identical pod",
            setup: with(svcs(), vec![web_pod().r()]),
            op: apply_op(web_pod().r()),
            services: &[],
            ips: &[],
            sizes: (1, 3, 0, 0),
        },
        Case {
            name: "identical service",
            setup: svcs(),
            op: apply_op(svcs()[0].clone()),
            services: &[],
            ips: &[],
            sizes: (0, 3, 0, 0),
        },
        Case {
            name: "identical slice",
            setup: vec![manual().r(), manual_slice().r()],
            op: apply_op(manual_slice().r()),
            services: &[],
            ips: &[],
            sizes: (0, 1, 1, 2),
        },
        Case {
            name: "new pod touches its IP and the services selecting it",
            setup: svcs(),
            op: apply_op(web_pod().r()),
            services: &["svc-a"],
            ips: &["10.0.0.1"],
            sizes: (1, 3, 0, 0),
        },
        Case {
            name: "pod label change touches services of old and new labels",
            setup: with(svcs(), vec![web_pod().r()]),
            op: apply_op(web_pod().labels(&[("app", "b")]).r()),
            services: &["svc-a", "svc-b"],
            ips: &["10.0.0.1"],
            sizes: (1, 3, 0, 0),
        },
        Case {
            name: "pod readiness change touches the services selecting it",
            setup: with(svcs(), vec![web_pod().r()]),
            op: apply_op(web_pod().ready(false).r()),
            services: &["svc-a"],
            ips: &["10.0.0.1"],
            sizes: (1, 3, 0, 0),
        },
        Case {
            name: "pod in another namespace touches no service",
            setup: svcs(),
            op: apply_op(
                pod_in("other", "web-1", "10.0.0.1", "Running")
                    .labels(&[("app", "a")])
                    .r(),
            ),
            services: &[],
            ips: &["10.0.0.1"],
            sizes: (1, 3, 0, 0),
        },
        Case {
            name: "pod named by a slice touches the slice's service",
            setup: vec![manual().r(), manual_slice().r(), backend().r()],
            op: apply_op(backend().sa("other").r()),
            services: &["manual"],
            ips: &["10.0.0.5"],
            sizes: (1, 1, 1, 2),
        },
        Case {
            name: "hostPort pod touches its host IP",
            setup: vec![],
            op: apply_op(
                pod("ing", "10.0.0.7", "Running")
                    .host("10.1.0.1")
                    .host_port("https", 443, 8443)
                    .r(),
            ),
            services: &[],
            ips: &["10.0.0.7", "10.1.0.1"],
            sizes: (1, 0, 0, 0),
        },
        Case {
            name: "pod delete touches what the pod touched",
            setup: with(svcs(), vec![web_pod().r()]),
            op: Op::Delete(Kind::Pod, k("web-1")),
            services: &["svc-a"],
            ips: &["10.0.0.1"],
            sizes: (0, 3, 0, 0),
        },
        Case {
            name: "deleting an unknown object changes nothing",
            setup: with(svcs(), vec![web_pod().r()]),
            op: Op::Delete(Kind::Pod, k("nope")),
            services: &[],
            ips: &[],
            sizes: (1, 3, 0, 0),
        },
        Case {
            name: "slice change touches its service only",
            setup: vec![manual().r(), manual_slice().r(), backend().r()],
            op: apply_op(manual_slice().endpoint(ep("10.0.0.7")).r()),
            services: &["manual"],
            ips: &[],
            sizes: (1, 1, 1, 3),
        },
        Case {
            name: "slice delete touches its service",
            setup: vec![manual().r(), manual_slice().r()],
            op: Op::Delete(Kind::EndpointSlice, k("manual-1")),
            services: &["manual"],
            ips: &[],
            sizes: (0, 1, 0, 0),
        },
        Case {
            name: "service cluster IP change touches both IPs",
            setup: vec![manual().r()],
            op: apply_op(
                svc("manual")
                    .ip("10.96.0.99")
                    .port("http", 80, json!(8080))
                    .r(),
            ),
            services: &["manual"],
            ips: &["10.96.0.9", "10.96.0.99"],
            sizes: (0, 1, 0, 0),
        },
        Case {
            name: "service delete touches it and its cluster IP",
            setup: vec![manual().r(), manual_slice().r()],
            op: Op::Delete(Kind::Service, k("manual")),
            services: &["manual"],
            ips: &["10.96.0.9"],
            sizes: (0, 0, 1, 2),
        },
        Case {
            name: "reset with a missing pod deletes it",
            setup: with(
                svcs(),
                vec![
                    web_pod().r(),
                    pod("web-2", "10.0.0.2", "Running")
                        .labels(&[("app", "b")])
                        .r(),
                ],
            ),
            op: Op::Reset(Kind::Pod, vec![web_pod().r()]),
            services: &["svc-b"],
            ips: &["10.0.0.2"],
            sizes: (1, 3, 0, 0),
        },
        Case {
            name: "reset with identical pods",
            setup: with(svcs(), vec![web_pod().r(), backend().r()]),
            op: Op::Reset(Kind::Pod, vec![backend().r(), web_pod().r()]),
            services: &[],
            ips: &[],
            sizes: (2, 3, 0, 0),
        },
        Case {
            name: "reset with identical services",
            setup: with(svcs(), vec![web_pod().r()]),
            op: Op::Reset(Kind::Service, svcs()),
            services: &[],
            ips: &[],
            sizes: (1, 3, 0, 0),
        },
        Case {
            name: "reset with identical slices ignores other kinds",
            setup: vec![manual().r(), manual_slice().r(), backend().r()],
            op: Op::Reset(
                Kind::EndpointSlice,
                vec![manual_slice().r(), backend().sa("x").r()],
            ),
            services: &[],
            ips: &[],
            sizes: (1, 1, 1, 2),
        },
        Case {
            name: "reset with a missing service keeps its slices",
            setup: with(svcs(), vec![manual().r(), manual_slice().r()]),
            op: Op::Reset(Kind::Service, svcs()),
            services: &["manual"],
            ips: &["10.96.0.9"],
            sizes: (0, 3, 1, 2),
        },
        Case {
            name: "reset of slices to nothing",
            setup: vec![manual().r(), manual_slice().r()],
            op: Op::Reset(Kind::EndpointSlice, vec![]),
            services: &["manual"],
            ips: &[],
            sizes: (0, 1, 0, 0),
        },
    ];
    for case in cases {
        let name = case.name;
        let mut index = Index::new(IndexConfig::default());
        for o in case.setup {
            index.apply(o);
        }
        let changes = run(&mut index, case.op);
        let services: HashSet<ObjectKey> = case.services.iter().map(|n| k(n)).collect();
        let ips: HashSet<IpAddr> = case.ips.iter().map(|ip| ip.parse().unwrap()).collect();
        assert!(!changes.all, "{name}: not all");
        assert_eq!(changes.services, services, "{name}: services");
        assert_eq!(changes.ips, ips, "{name}: ips");
        assert_eq!(
            changes.is_empty(),
            services.is_empty() && ips.is_empty(),
            "{name}: is_empty"
        );
        assert!(changes.new_conflicts.is_empty(), "{name}: no conflicts");
        let (pods, svcs, slices, slice_endpoints) = case.sizes;
        assert_eq!(
            index.sizes(),
            IndexSizes {
                pods,
                services: svcs,
                endpoint_slices: slices,
                slice_endpoints,
                conflicts: 0,
            },
            "{name}: sizes"
        );
        assert_eq!(index.len(Kind::Pod), pods, "{name}: len(Pod)");
        assert_eq!(
            index.is_empty(),
            pods + svcs + slices == 0,
            "{name}: is_empty"
        );
    }
}

#[test]
fn reset_with_a_missing_pod_removes_it_from_answers() {
    let mut index = Index::new(IndexConfig::default());
    let keep = pod("keep", "10.0.0.1", "Running").labels(&[("app", "web")]);
    let gone = pod("gone", "10.0.0.2", "Running").labels(&[("app", "web")]);
    index.apply(
        svc("web")
            .selector(&[("app", "web")])
            .port("http", 80, json!(8080))
            .r(),
    );
    index.apply(keep.r());
    index.apply(gone.r());
    assert_eq!(index.endpoints(&svc_target("web", 80)).endpoints.len(), 2);

    let changes = index.reset(Kind::Pod, vec![keep.r()]);
    assert!(changes.affects(&svc_target("web", 80), &index));
    assert!(index.pod(&k("gone")).is_none());
    let addrs: Vec<SocketAddr> = index
        .endpoints(&svc_target("web", 80))
        .endpoints
        .into_keys()
        .collect();
    assert_eq!(addrs, vec!["10.0.0.1:8080".parse().unwrap()]);
    let addr: SocketAddr = "10.0.0.2:8080".parse().unwrap();
    assert!(index.pod_for_addr(addr).is_none());
}

#[test]
fn changes_affect_targets() {
    struct Case {
        name: &'static str,
        op: Op,
        /// Each target with whether the change affects it.
        targets: Vec<(Target, bool)>,
    }
    let web_slice = || {
        slice("web-1", "web")
            .port("http", 8080)
            .endpoint(ep("10.0.0.1").pod("web-a"))
    };
    let setup = || {
        vec![
            svc("web").ip("10.96.0.1").port("http", 80, json!(8080)).r(),
            svc("api")
                .ip("10.96.0.2")
                .selector(&[("app", "api")])
                .port("http", 80, json!(8080))
                .r(),
            web_slice().r(),
            pod("web-a", "10.0.0.1", "Running").r(),
            pod("api-a", "10.0.0.3", "Running")
                .labels(&[("app", "api")])
                .r(),
        ]
    };
    let addr = |s: &str| Target::Addr(s.parse().unwrap());
    let cases = vec![
        Case {
            name: "slice change",
            op: apply_op(web_slice().endpoint(ep("10.0.0.2")).r()),
            targets: vec![
                (addr("10.96.0.1:80"), true),
                (addr("10.96.0.1:8080"), true),
                (svc_target("web", 80), true),
                (addr("10.96.0.2:80"), false),
                (svc_target("api", 80), false),
                (addr("10.0.0.1:8080"), false),
                (addr("10.0.0.2:8080"), false),
            ],
        },
        Case {
            name: "slice delete",
            op: Op::Delete(Kind::EndpointSlice, k("web-1")),
            targets: vec![
                (addr("10.96.0.1:80"), true),
                (svc_target("web", 80), true),
                (addr("10.96.0.2:80"), false),
            ],
        },
        Case {
            name: "pod named by the slice changes",
            op: apply_op(pod("web-a", "10.0.0.1", "Running").sa("web").r()),
            targets: vec![
                (addr("10.0.0.1:8080"), true),
                (addr("10.96.0.1:80"), true),
                (svc_target("web", 80), true),
                (addr("10.96.0.2:80"), false),
                (addr("10.0.0.3:8080"), false),
            ],
        },
        Case {
            name: "selected pod changes",
            op: apply_op(
                pod("api-a", "10.0.0.3", "Running")
                    .labels(&[("app", "api")])
                    .ready(false)
                    .r(),
            ),
            targets: vec![
                (addr("10.0.0.3:8080"), true),
                (addr("10.96.0.2:80"), true),
                (svc_target("api", 80), true),
                (addr("10.96.0.1:80"), false),
                (svc_target("web", 80), false),
            ],
        },
        Case {
            name: "service deleted",
            op: Op::Delete(Kind::Service, k("api")),
            targets: vec![
                (addr("10.96.0.2:80"), true),
                (svc_target("api", 80), true),
                (addr("10.96.0.1:80"), false),
            ],
        },
    ];
    for case in cases {
        let mut index = Index::new(IndexConfig::default());
        for o in setup() {
            index.apply(o);
        }
        let before: Vec<(EndpointSet, ProfileView)> = case
            .targets
            .iter()
            .map(|(t, _)| (index.endpoints(t), index.profile(t)))
            .collect();
        let changes = run(&mut index, case.op);
        for ((target, want), before) in case.targets.iter().zip(before) {
            let name = format!("{}: {target:?}", case.name);
            assert_eq!(changes.affects(target, &index), *want, "{name}: affects");
            if !want {
                // What is not affected must indeed be unchanged.
                let after = (index.endpoints(target), index.profile(target));
                assert_eq!(after, before, "{name}: unchanged");
            }
        }
        let all = Changes {
            all: true,
            ..Default::default()
        };
        assert!(
            all.affects(&addr("10.9.9.9:1"), &index),
            "{}: all",
            case.name
        );
    }
}

// === Mesh hints ===

#[test]
fn mesh_hints() {
    struct Case {
        name: &'static str,
        pod: PodJson,
        port: u16,
        want: Option<MeshIdentity>,
    }
    let meshed = || {
        pod("web", "10.0.0.1", "Running")
            .labels(&[("linkerd.io/control-plane-ns", "linkerd")])
            .sa("web-sa")
            .port("http", 8080)
            .port("admin", 9990)
    };
    let identity = |inbound_port: Option<u16>| {
        Some(MeshIdentity {
            service_account: "web-sa".into(),
            namespace: NS.into(),
            control_plane_ns: "linkerd".into(),
            inbound_port,
        })
    };
    let skip = "config.linkerd.io/skip-inbound-ports";
    let cases = vec![
        Case {
            name: "meshed pod",
            pod: meshed(),
            port: 8080,
            want: identity(None),
        },
        Case {
            name: "meshed pod with the proxy's inbound port",
            pod: meshed().proxy("0.0.0.0:4143"),
            port: 8080,
            want: identity(Some(4143)),
        },
        Case {
            name: "IPv6 inbound listen address",
            pod: meshed().proxy("[::]:4143"),
            port: 8080,
            want: identity(Some(4143)),
        },
        Case {
            name: "inbound env on another container is not the proxy's",
            pod: meshed().container_env(
                "app",
                "LINKERD2_PROXY_INBOUND_LISTEN_ADDR",
                "0.0.0.0:4143",
            ),
            port: 8080,
            want: identity(None),
        },
        Case {
            name: "skipped port by number",
            pod: meshed().proxy("0.0.0.0:4143").annotate(skip, "8080"),
            port: 8080,
            want: None,
        },
        Case {
            name: "port not in the skip list",
            pod: meshed().proxy("0.0.0.0:4143").annotate(skip, "8080"),
            port: 9990,
            want: identity(Some(4143)),
        },
        Case {
            name: "skipped port by range",
            pod: meshed().annotate(skip, "9000-9999"),
            port: 9990,
            want: None,
        },
        Case {
            name: "skipped port by container port name",
            pod: meshed().annotate(skip, "25,admin"),
            port: 9990,
            want: None,
        },
        Case {
            name: "port name skips only its own port",
            pod: meshed().annotate(skip, "admin"),
            port: 8080,
            want: identity(None),
        },
        Case {
            name: "not meshed",
            pod: pod("web", "10.0.0.1", "Running")
                .sa("web-sa")
                .proxy("0.0.0.0:4143"),
            port: 8080,
            want: None,
        },
        Case {
            name: "empty control plane label is not meshed",
            pod: pod("web", "10.0.0.1", "Running").labels(&[("linkerd.io/control-plane-ns", "")]),
            port: 8080,
            want: None,
        },
    ];
    for case in cases {
        let name = case.name;
        let mut index = Index::new(IndexConfig::default());
        index.apply(
            svc("web")
                .ip("10.96.0.1")
                .selector(&[("app", "web")])
                .port("p", 80, json!(case.port))
                .r(),
        );
        index.apply(case.pod.labels(&[("app", "web")]).r());
        let addr = SocketAddr::new("10.0.0.1".parse().unwrap(), case.port);

        // By pod address, in Get and GetProfile.
        let set = index.endpoints(&Target::Addr(addr));
        assert_eq!(
            set.endpoints[&addr].mesh, case.want,
            "{name}: Get by address"
        );
        match index.profile(&Target::Addr(addr)) {
            ProfileView::Pod { endpoint, .. } => {
                assert_eq!(endpoint.mesh, case.want, "{name}: GetProfile by address");
                assert_eq!(endpoint.labels["namespace"], NS, "{name}");
            }
            other => panic!("{name}: unexpected profile {other:?}"),
        }
        // As a service endpoint.
        let set = index.endpoints(&svc_target("web", 80));
        assert_eq!(
            set.endpoints[&addr].mesh, case.want,
            "{name}: Get by service"
        );
        let cp = set.endpoints[&addr].labels.get("control_plane_ns").cloned();
        let want_cp = case.want.as_ref().map(|m| m.control_plane_ns.clone());
        if case.want.is_some() {
            assert_eq!(cp, want_cp, "{name}: control_plane_ns label");
        }
    }
}

// === Fixtures ===

fn k(name: &str) -> ObjectKey {
    ObjectKey::new(NS, name)
}

fn svc_target(name: &str, port: u16) -> Target {
    Target::Service {
        service: k(name),
        port,
    }
}

fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn decode(v: Value) -> Resource {
    match Resource::from_value(v.clone()) {
        Ok(Some(r)) => r,
        other => panic!("fixture does not decode: {other:?}\n{v:#}"),
    }
}

/// Every order of `0..n`.
fn permutations(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![vec![]];
    }
    let mut out = Vec::new();
    for rest in permutations(n - 1) {
        for at in 0..=rest.len() {
            let mut p = rest.clone();
            p.insert(at, n - 1);
            out.push(p);
        }
    }
    out
}

/// A Pod in Kubernetes JSON. Running pods are Ready unless told otherwise.
#[derive(Clone)]
struct PodJson(Value);

fn pod(name: &str, ip: &str, phase: &str) -> PodJson {
    pod_in(NS, name, ip, phase)
}

fn pod_in(ns: &str, name: &str, ip: &str, phase: &str) -> PodJson {
    let ready = if phase == "Running" { "True" } else { "False" };
    PodJson(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "namespace": ns,
            "name": name,
            "creationTimestamp": T0,
            "labels": {},
            "annotations": {},
        },
        "spec": {"containers": [{"name": "app", "ports": []}]},
        "status": {
            "phase": phase,
            "podIP": ip,
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": ready},
            ],
        },
    }))
}

/// A hostNetwork pod: its pod IP is its node's IP.
fn host_net_pod(name: &str, node_ip: &str) -> PodJson {
    let mut p = pod(name, node_ip, "Running").host(node_ip);
    p.0["spec"]["hostNetwork"] = json!(true);
    p
}

impl PodJson {
    fn r(&self) -> Resource {
        decode(self.0.clone())
    }

    fn labels(mut self, kv: &[(&str, &str)]) -> Self {
        for (k, v) in kv {
            self.0["metadata"]["labels"][*k] = json!(v);
        }
        self
    }

    fn annotate(mut self, k: &str, v: &str) -> Self {
        self.0["metadata"]["annotations"][k] = json!(v);
        self
    }

    fn created(mut self, ts: &str) -> Self {
        self.0["metadata"]["creationTimestamp"] = json!(ts);
        self
    }

    fn no_created(mut self) -> Self {
        if let Some(m) = self.0["metadata"].as_object_mut() {
            m.remove("creationTimestamp");
        }
        self
    }

    fn terminating(mut self) -> Self {
        self.0["metadata"]["deletionTimestamp"] = json!("2024-02-01T00:00:00Z");
        self
    }

    fn phase(mut self, phase: &str) -> Self {
        self.0["status"]["phase"] = json!(phase);
        self
    }

    fn ready(mut self, ready: bool) -> Self {
        let status = if ready { "True" } else { "False" };
        self.0["status"]["conditions"] = json!([{"type": "Ready", "status": status}]);
        self
    }

    fn ips(mut self, ips: &[&str]) -> Self {
        let list: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
        self.0["status"]["podIPs"] = Value::Array(list);
        self
    }

    fn host(mut self, host_ip: &str) -> Self {
        self.0["status"]["hostIP"] = json!(host_ip);
        self
    }

    fn sa(mut self, name: &str) -> Self {
        self.0["spec"]["serviceAccountName"] = json!(name);
        self
    }

    fn owner(mut self, kind: &str, name: &str) -> Self {
        self.0["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "apps/v1",
            "kind": kind,
            "name": name,
            "uid": "00000000-0000-0000-0000-000000000000",
            "controller": true,
        }]);
        self
    }

    fn push_port(mut self, port: Value) -> Self {
        self.0["spec"]["containers"][0]["ports"]
            .as_array_mut()
            .expect("ports is a list")
            .push(port);
        self
    }

    /// A container port; an empty name means unnamed.
    fn port(self, name: &str, container_port: u16) -> Self {
        self.host_port(name, container_port, 0)
    }

    /// A container port published on the node (`hostPort`, 0 for none).
    fn host_port(self, name: &str, container_port: u16, host_port: u16) -> Self {
        let mut port = json!({"containerPort": container_port, "protocol": "TCP"});
        if !name.is_empty() {
            port["name"] = json!(name);
        }
        if host_port != 0 {
            port["hostPort"] = json!(host_port);
        }
        self.push_port(port)
    }

    fn container_env(mut self, container: &str, env: &str, value: &str) -> Self {
        let containers = self.0["spec"]["containers"]
            .as_array_mut()
            .expect("containers is a list");
        let c = match containers.iter().position(|c| c["name"] == container) {
            Some(i) => &mut containers[i],
            None => {
                containers.push(json!({"name": container}));
                containers.last_mut().expect("just pushed")
            }
        };
        if !c["env"].is_array() {
            c["env"] = json!([]);
        }
        c["env"]
            .as_array_mut()
            .expect("env is a list")
            .push(json!({"name": env, "value": value}));
        self
    }

    /// Adds Linkerd's proxy container, listening inbound on `listen`.
    fn proxy(self, listen: &str) -> Self {
        self.container_env(
            "linkerd-proxy",
            "LINKERD2_PROXY_INBOUND_LISTEN_ADDR",
            listen,
        )
    }
}

#[test]
fn a_cluster_ip_claimed_twice_is_reported_once_while_it_lasts() {
    let key = |n: &str| ObjectKey::new(NS, n);
    let ip: IpAddr = "10.96.0.10".parse().expect("ip");
    let mut index = Index::default();
    assert!(index
        .apply(svc("b").ip("10.96.0.10").r())
        .new_cluster_ip_conflicts
        .is_empty());
    let ch = index.apply(svc("a").ip("10.96.0.10").r());
    assert_eq!(
        ch.new_cluster_ip_conflicts,
        vec![ClusterIpConflict {
            ip,
            services: vec![key("a"), key("b")],
            chosen: key("a"),
        }]
    );
    assert_eq!(
        index.service_for_ip(ip),
        Some(&key("a")),
        "the first by name answers"
    );
    // A third claimant while the conflict lasts, or a change to a claimant:
    // not reported again.
    assert!(index
        .apply(svc("c").ip("10.96.0.10").r())
        .new_cluster_ip_conflicts
        .is_empty());
    assert!(index
        .apply(svc("c").ip("10.96.0.10").annotate("x", "y").r())
        .new_cluster_ip_conflicts
        .is_empty());
    // Down to one claimant, the conflict is over; a new claim reports anew.
    for n in ["a", "c"] {
        assert!(index
            .delete(Kind::Service, &key(n))
            .new_cluster_ip_conflicts
            .is_empty());
    }
    assert_eq!(
        index
            .apply(svc("d").ip("10.96.0.10").r())
            .new_cluster_ip_conflicts
            .len(),
        1
    );
}

/// A Service in Kubernetes JSON: ClusterIP type, no selector, no ports.
struct SvcJson(Value);

fn svc(name: &str) -> SvcJson {
    svc_in(NS, name)
}

fn svc_in(ns: &str, name: &str) -> SvcJson {
    SvcJson(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"namespace": ns, "name": name, "annotations": {}},
        "spec": {"type": "ClusterIP", "ports": []},
    }))
}

impl SvcJson {
    fn r(&self) -> Resource {
        decode(self.0.clone())
    }

    fn ip(mut self, ip: &str) -> Self {
        self.0["spec"]["clusterIP"] = json!(ip);
        self
    }

    fn ips(mut self, ips: &[&str]) -> Self {
        self.0["spec"]["clusterIPs"] = json!(ips);
        self
    }

    fn selector(mut self, kv: &[(&str, &str)]) -> Self {
        self.0["spec"]["selector"] = json!(labels(kv));
        self
    }

    fn annotate(mut self, k: &str, v: &str) -> Self {
        self.0["metadata"]["annotations"][k] = json!(v);
        self
    }

    /// A service port; an empty name means unnamed.
    fn port(mut self, name: &str, port: u16, target: Value) -> Self {
        let mut p = json!({"port": port, "targetPort": target, "protocol": "TCP"});
        if !name.is_empty() {
            p["name"] = json!(name);
        }
        self.0["spec"]["ports"]
            .as_array_mut()
            .expect("ports is a list")
            .push(p);
        self
    }

    fn external_name(mut self, host: &str) -> Self {
        self.0["spec"]["type"] = json!("ExternalName");
        self.0["spec"]["externalName"] = json!(host);
        self
    }
}

/// An EndpointSlice in Kubernetes JSON, labelled with its service.
struct SliceJson(Value);

fn slice(name: &str, service: &str) -> SliceJson {
    SliceJson(json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "namespace": NS,
            "name": name,
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": "IPv4",
        "ports": [],
        "endpoints": [],
    }))
}

impl SliceJson {
    fn r(&self) -> Resource {
        decode(self.0.clone())
    }

    /// A slice port; an empty name means unnamed.
    fn port(mut self, name: &str, port: u16) -> Self {
        let mut p = json!({"port": port, "protocol": "TCP"});
        if !name.is_empty() {
            p["name"] = json!(name);
        }
        self.0["ports"]
            .as_array_mut()
            .expect("ports is a list")
            .push(p);
        self
    }

    fn endpoint(mut self, e: EpJson) -> Self {
        self.0["endpoints"]
            .as_array_mut()
            .expect("endpoints is a list")
            .push(e.0);
        self
    }
}

/// One endpoint of a slice, ready unless told otherwise.
struct EpJson(Value);

fn ep(ip: &str) -> EpJson {
    EpJson(json!({"addresses": [ip], "conditions": {"ready": true}}))
}

impl EpJson {
    fn not_ready(mut self) -> Self {
        self.0["conditions"]["ready"] = json!(false);
        self
    }

    fn zone(mut self, zone: &str) -> Self {
        self.0["zone"] = json!(zone);
        self
    }

    /// The pod behind the endpoint, in the slice's namespace.
    fn pod(mut self, name: &str) -> Self {
        self.0["targetRef"] = json!({"kind": "Pod", "name": name});
        self
    }
}
