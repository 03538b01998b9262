//! What one pod costs in memory, stage by stage (not a test).
//!
//! Decodes N generated pods (shaped as the API server sends them) into the
//! index's projection, then holds them in the index, and reports the bytes
//! jemalloc holds per pod after each stage. It fails when a stage's
//! allocated bytes did not grow (statistics not read) or the index does not
//! hold the N pods.
//!
//! Usage: index-memory [N]

use ballast_bench::pod;
use ballast_store::{
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

fn main() -> anyhow::Result<()> {
    let n: usize = match std::env::args().nth(1) {
        None => 10_000,
        Some(a) if a == "--help" || a == "-h" => {
            println!("Usage: index-memory [N (10000)]");
            return Ok(());
        }
        Some(a) => a
            .parse()
            .map_err(|e| anyhow::anyhow!("N {a:?}: {e}\nUsage: index-memory [N (10000)]"))?,
    };
    anyhow::ensure!(n >= 1, "nothing to measure: N must be at least 1");
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
    // Each stage holds the pods: zero growth is jemalloc's statistics not
    // read (or the pods not held), not a cost of nothing.
    anyhow::ensure!(
        decoded > base && indexed > decoded && held > base,
        "jemalloc stats.allocated did not grow with the pods \
         (base {base}, decoded {decoded}, indexed {indexed}, held {held} bytes)"
    );
    let held_pods = index.pods().count();
    anyhow::ensure!(held_pods == n, "the index holds {held_pods} pods, not {n}");
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
    Ok(())
}
