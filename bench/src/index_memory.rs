//! What one pod costs in memory, stage by stage (not a test).
//!
//! Decodes N generated pods (shaped as the API server sends them) into the
//! index's projection, then holds them in the index, and reports the bytes
//! jemalloc holds per pod after each stage.
//!
//! Usage: index-memory [N]

use ballast_bench::pod;
use ballast_destination::{
    index::{Index, IndexConfig},
    resource::Resource,
};
use tikv_jemalloc_ctl::{epoch, stats};

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn allocated() -> usize {
    let _ = epoch::advance();
    stats::allocated::read().unwrap_or(0)
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let base = allocated();
    let mut pods = Vec::with_capacity(n);
    for i in 0..n {
        match Resource::from_value(pod(i)) {
            Ok(Some(r)) => pods.push(r),
            other => panic!("pod {i} did not decode: {other:?}"),
        }
    }
    let decoded = allocated();
    let mut index = Index::new(IndexConfig::default());
    for p in pods.iter().cloned() {
        index.apply(p);
    }
    let indexed = allocated();
    drop(pods);
    let held = allocated();
    let per = |a: usize, b: usize| (b.saturating_sub(a)) as f64 / n as f64;
    println!("{n} pods");
    println!("| stage | bytes per pod |");
    println!("|---|---|");
    println!(
        "| decoded projection (Arc<Pod>) | {:.0} |",
        per(base, decoded)
    );
    println!("| index maps on top | {:.0} |", per(decoded, indexed));
    println!(
        "| index alone, projections shared | {:.0} |",
        per(base, held)
    );
}
