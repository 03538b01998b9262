//! The viz collector's reading of a proxy's `/metrics` page (Prometheus
//! text or OpenMetrics), and of Prometheus's `/federate`, then the mesh
//! state fed with what it read.
//!
//! Input: any bytes, as a page.
//! Properties: never a panic; a page read keeps at most its bound of
//! samples; a garbage line appended to a page with samples changes
//! nothing it kept; every sample line read as written (the tests' reader)
//! stays within the bound, and a page so read is one the viz reads too;
//! the mesh fed the page (twice, and once as a federated answer) answers
//! every query with sane figures (successes ≤ requests, a success rate in
//! [0, 1], a finite non-negative rate).
#![no_main]

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};

use ballast_vizcore::api::{Golden, ResourceRef};
use ballast_vizcore::expo::{parse, parse_federated, samples, Limits};
use ballast_vizcore::mesh::{Mesh, MeshConfig, StatQuery};
use ballast_vizcore::targets::{PodTarget, Snapshot};
use libfuzzer_sys::fuzz_target;

const LIMITS: Limits = Limits {
    max_series: 2_000,
    max_line_bytes: 4_096,
};

fuzz_target!(|data: &[u8]| {
    let page = parse(data, &LIMITS, Some(4191));
    if let Ok(p) = &page {
        assert!(p.len() <= LIMITS.max_series);
    }
    // A page with samples stays one; (one with none but garbage is not a
    // page at all).
    if let Some(p) = page.as_ref().ok().filter(|p| !p.is_empty()) {
        let mut more = data.to_vec();
        more.extend_from_slice(b"\nresponse_total{direction=\"inbound\" \xff\"garbage\n");
        let again = parse(&more, &LIMITS, Some(4191)).expect("a garbage line more is still a page");
        assert_eq!(again.len(), p.len());
    }
    // Every family read (the tests' reader), by the same grammar: bounded,
    // and a page it reads is one `parse` reads.
    if let Ok(all) = samples(data, &LIMITS) {
        assert!(all.len() <= LIMITS.max_series);
        assert!(page.is_ok(), "samples read a page parse did not: {page:?}");
    }
    let federated = parse_federated(data, &LIMITS, &|_, _| Some(4191));
    if let Ok(pods) = &federated {
        assert!(pods.iter().map(|(_, p)| p.len()).sum::<usize>() <= LIMITS.max_series);
    }

    let pod = ResourceRef {
        kind: "pod".into(),
        namespace: "demo".into(),
        name: "web-1".into(),
    };
    let workload = ResourceRef {
        kind: "deployment".into(),
        namespace: "demo".into(),
        name: "web".into(),
    };
    let snapshot = Snapshot {
        meshed: vec![PodTarget {
            pod: pod.clone(),
            workload: Some(workload.clone()),
            ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            admin_port: 4191,
            tap_port: 4190,
            service_account: "default".into(),
        }],
        pods_per_workload: HashMap::from([(workload.clone(), 2)]),
    };
    let mut mesh = Mesh::new(MeshConfig {
        interval_secs: 10,
        history_points: 4,
        max_pods: 10,
    });
    let mut at = 0;
    let mut cycle = |mesh: &mut Mesh, page: Option<ballast_vizcore::expo::Page>| {
        at += 10_000; // Unix ms: a cycle every 10 s
        mesh.begin_cycle(&snapshot);
        match page {
            Some(p) => mesh.record_page(&pod, at, p),
            None => mesh.record_failure(&pod, at, "unreadable".into(), Some(10)),
        }
        mesh.end_cycle(at, 1.0);
    };
    cycle(&mut mesh, page.ok());
    cycle(&mut mesh, parse(data, &LIMITS, Some(4191)).ok());
    if let Ok(pods) = federated {
        for (_, p) in pods {
            cycle(&mut mesh, Some(p));
        }
    }
    cycle(&mut mesh, None);

    let sane = |g: &Golden| {
        assert!(g.successes <= g.requests, "{g:?}");
        assert!(g.rps.is_finite() && g.rps >= 0.0, "{g:?}");
        assert!(
            g.success_rate.is_none_or(|r| (0.0..=1.0).contains(&r)),
            "{g:?}"
        );
    };
    for row in mesh.overview(at).namespaces {
        sane(&row.golden);
    }
    for kind in ["ns", "deploy", "po", "svc", "rt", "sts", "ds", "job", "rs"] {
        let q = StatQuery {
            kind: kind.into(),
            ..StatQuery::default()
        };
        for row in mesh.stat(&q, at).expect("a known kind").rows {
            sane(&row.golden);
            let _ = mesh.workload(&row.resource, at);
        }
        if kind != "rt" {
            for e in mesh.edges(kind, None, at).expect("a known kind").edges {
                sane(&e.golden);
            }
        }
    }
    for r in mesh.routes(None, None, at).expect("all routes").rows {
        sane(&r.golden);
    }
    let _ = mesh.pods(None, at);
    let _ = mesh.heap_bytes();
});
