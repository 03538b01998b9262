//! The proxy benchmark's tables: medians over rounds with min-max, the
//! proxies' latency as added to the direct path of the same round, process
//! figures summed over a path's proxies and per proxy.

use super::{Idle, Measured, Opts, Round, Target};

/// Median, min, max.
fn stat(mut v: Vec<f64>) -> Option<(f64, f64, f64)> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    let median = if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    };
    Some((median, v[0], v[v.len() - 1]))
}

fn show(s: Option<(f64, f64, f64)>, f: impl Fn(f64) -> String) -> String {
    match s {
        Some((m, lo, hi)) if lo == hi => f(m),
        Some((m, lo, hi)) => format!("{} ({}–{})", f(m), f(lo), f(hi)),
        None => String::new(),
    }
}

fn us(x: f64) -> String {
    format!("{x:.0} µs")
}

fn added_us(x: f64) -> String {
    format!("{x:+.0} µs")
}

fn mb(kib: f64) -> String {
    format!("{:.1} MB", kib * 1024.0 / 1e6)
}

fn of(round: &Round, t: Target) -> Option<&Measured> {
    round.measured.iter().find(|m| m.target == t)
}

/// A per-round figure of target `t`, over rounds.
fn over(
    rounds: &[Round],
    t: Target,
    f: impl Fn(&Measured) -> Option<f64>,
) -> Option<(f64, f64, f64)> {
    stat(rounds.iter().filter_map(|r| f(of(r, t)?)).collect())
}

/// A figure of `t` minus the same figure of the direct path, round by round.
fn added(
    rounds: &[Round],
    t: Target,
    f: impl Fn(&Measured) -> Option<f64>,
) -> Option<(f64, f64, f64)> {
    stat(
        rounds
            .iter()
            .filter_map(|r| Some(f(of(r, t)?)? - f(of(r, Target::Direct)?)?))
            .collect(),
    )
}

fn fixed_at(m: &Measured, rate: u32) -> Option<&super::Fixed> {
    m.fixed
        .iter()
        .find(|(r, _, _)| *r == rate)
        .map(|(_, f, _)| f)
}

fn cpu_at(m: &Measured, rate: u32) -> &[f64] {
    m.fixed
        .iter()
        .find(|(r, _, _)| *r == rate)
        .map(|(_, _, c)| c.as_slice())
        .unwrap_or(&[])
}

/// Sum over a path's proxy processes; `None` on the direct path.
fn sum(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum())
}

fn kib_f(v: &[u64]) -> Vec<f64> {
    v.iter().map(|&k| k as f64).collect()
}

/// Which proxy processes a row shows: all of them summed, or one hop.
#[derive(Clone, Copy)]
enum Part {
    All,
    Hop(usize),
}

impl Part {
    fn pick(self, v: &[f64], hops: usize) -> Option<f64> {
        match self {
            Part::All => sum(v),
            // A one-hop path has no separate hop rows: its figure is the total.
            Part::Hop(i) if hops > 1 => v.get(i).copied(),
            Part::Hop(_) => None,
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Part::All => "",
            Part::Hop(0) => ", proxy A (client side)",
            Part::Hop(_) => ", proxy B (backend side)",
        }
    }
}

fn per_proc(v: &[f64], f: impl Fn(f64) -> String) -> String {
    match v.len() {
        0 => String::new(),
        1 => f(v[0]),
        _ => format!(
            "{} (A {} + B {})",
            f(v.iter().sum()),
            f(v[0]),
            v[1..].iter().map(|x| f(*x)).collect::<Vec<_>>().join(" + ")
        ),
    }
}

/// One line per target per round, as it is measured.
pub fn print_line(round: usize, m: &Measured) {
    let lat = m
        .fixed
        .iter()
        .map(|(rate, f, cpu)| {
            format!(
                "{}k: {:.0}/{:.0}/{:.0} µs{}{}",
                rate / 1000,
                f.p50_us,
                f.p99_us,
                f.p999_us,
                if cpu.is_empty() {
                    String::new()
                } else {
                    format!(" {} cpu-s/1k", per_proc(cpu, |c| format!("{c:.4}")))
                },
                if f.failed > 0 {
                    format!(" FAILED {}", f.failed)
                } else {
                    String::new()
                }
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let kib = |v: &[u64]| {
        if v.is_empty() {
            "-".to_string()
        } else {
            per_proc(&kib_f(v), mb)
        }
    };
    println!(
        "round {round} {:<12} {lat}; max {:.0} rps{}{}; rss idle {} load {} hwm {}; foreign {:.2} cores{}",
        m.target.name(),
        m.max.rps,
        if m.max_core_busy.is_empty() {
            String::new()
        } else {
            format!(
                " (proxy core {})",
                per_proc(&m.max_core_busy, |b| format!("{:.0}%", b * 100.0))
            )
        },
        if m.max.failed > 0 {
            format!(" FAILED {}", m.max.failed)
        } else {
            String::new()
        },
        kib(&m.rss_idle_kib),
        kib(&m.rss_load_kib),
        kib(&m.hwm_kib),
        m.foreign.cores(),
        if m.foreign.rustc { " (rustc ran)" } else { "" },
    );
}

/// One line per idle-connection measurement.
pub fn print_idle(round: usize, t: Target, idle: &Idle) {
    println!(
        "round {round} {:<12} {} idle connections: {:.2} KB RSS per connection{}",
        t.name(),
        idle.n,
        idle.rss_bytes / 1000.0,
        idle.allocated_bytes
            .map(|a| format!(", {:.2} KB allocated per connection", a / 1000.0))
            .unwrap_or_default()
    );
}

fn idle_at(m: &Measured, n: usize) -> Option<&Idle> {
    m.idle.iter().find(|i| i.n == n)
}

fn idle_side(t: Target) -> &'static str {
    match t {
        Target::Ballast | Target::Haproxy => "outbound / frontend, one hop",
        Target::Ballast2 => "proxy B's inbound listener",
        Target::Direct | Target::Haproxy2 => "",
    }
}

/// The tables, in Markdown.
pub fn print(o: &Opts, targets: &[Target], rounds: &[Round], discarded: usize) {
    let has_direct = targets.contains(&Target::Direct);
    let two_hops = targets.iter().any(|t| t.hops() > 1);
    let parts: Vec<Part> = if two_hops {
        vec![Part::All, Part::Hop(0), Part::Hop(1)]
    } else {
        vec![Part::All]
    };
    println!();
    println!(
        "{} rounds (alternating {}), {} discarded as disturbed; {} s per run; \
         oha {} connections, wrk -t1 -c{}; every proxy on core {}",
        rounds.len(),
        targets
            .iter()
            .map(|t| t.name())
            .collect::<Vec<_>>()
            .join(", "),
        discarded,
        o.duration.as_secs(),
        o.connections,
        o.wrk_connections,
        o.proxy_core,
    );
    let header = |first: &str| {
        let mut h = format!("| {first} |");
        let mut sep = String::from("|---|");
        for t in targets {
            h += &format!(" {} |", t.name());
            sep += "---|";
        }
        println!("\n{h}\n{sep}");
    };
    let row = |name: String, cell: &dyn Fn(Target) -> String| {
        let mut line = format!("| {name} |");
        for &t in targets {
            line += &format!(" {} |", cell(t));
        }
        println!("{line}");
    };

    for &rate in &o.rates {
        header(&format!("at {} rps (oha, latency-corrected)", rate));
        type Pick = fn(&super::Fixed) -> f64;
        let rows: [(&str, Pick); 3] = [
            ("p50", |f| f.p50_us),
            ("p99", |f| f.p99_us),
            ("p99.9", |f| f.p999_us),
        ];
        for (name, pick) in rows {
            row(name.to_string(), &|t| {
                if t == Target::Direct || !has_direct {
                    show(over(rounds, t, |m| fixed_at(m, rate).map(pick)), us)
                } else {
                    show(added(rounds, t, |m| fixed_at(m, rate).map(pick)), added_us)
                }
            });
        }
        row("achieved rps".into(), &|t| {
            show(
                over(rounds, t, |m| fixed_at(m, rate).map(|f| f.achieved_rps)),
                |x| format!("{x:.0}"),
            )
        });
        for &part in &parts {
            row(
                format!("proxy CPU s per 1k requests{}", part.suffix()),
                &|t| {
                    show(
                        over(rounds, t, |m| part.pick(cpu_at(m, rate), m.target.hops())),
                        |x| format!("{x:.4}"),
                    )
                },
            );
        }
        let failed: u64 = rounds
            .iter()
            .flat_map(|r| &r.measured)
            .filter_map(|m| fixed_at(m, rate))
            .map(|f| f.failed)
            .sum();
        if failed > 0 {
            println!("\n{failed} requests failed at {rate} rps (non-200 or errors)");
        }
        // The backend and the client share one core: past some rate they,
        // not the proxy, set the latency of every path.
        if let Some((p50, _, _)) = over(rounds, Target::Direct, |m| {
            fixed_at(m, rate).map(|f| f.p50_us)
        }) {
            if p50 > 1_000.0 {
                println!(
                    "\nAt {rate} rps the load core is saturated (direct p50 {:.1} ms): \
                     these latencies measure the client and backend, not the proxies.",
                    p50 / 1000.0
                );
            }
        }
    }
    if has_direct {
        println!("\n(proxy columns: added to the direct path of the same round)");
    }

    header("maximum rate, memory");
    row(
        format!("max req/s (wrk -t1 -c{})", o.wrk_connections),
        &|t| show(over(rounds, t, |m| Some(m.max.rps)), |x| format!("{x:.0}")),
    );
    type Row = (&'static str, fn(&Measured) -> Vec<f64>, fn(f64) -> String);
    let rows: [Row; 8] = [
        (
            "proxy core busy during max",
            |m| m.max_core_busy.clone(),
            |x| format!("{:.0}%", x * 100.0),
        ),
        (
            "proxy CPU s per 1k requests at max",
            |m| m.max_cpu_per_1k.clone(),
            |x| format!("{x:.4}"),
        ),
        ("RSS idle (after warm-up)", |m| kib_f(&m.rss_idle_kib), mb),
        (
            "anonymous RSS idle (RssAnon)",
            |m| kib_f(&m.anon_idle_kib),
            mb,
        ),
        (
            "RSS under load (mid max-rate run)",
            |m| kib_f(&m.rss_load_kib),
            mb,
        ),
        ("anonymous RSS under load", |m| kib_f(&m.anon_load_kib), mb),
        ("RSS after load", |m| kib_f(&m.rss_after_kib), mb),
        ("peak RSS (VmHWM)", |m| kib_f(&m.hwm_kib), mb),
    ];
    for (name, pick, f) in rows {
        for &part in &parts {
            row(format!("{name}{}", part.suffix()), &|t| {
                show(over(rounds, t, |m| part.pick(&pick(m), m.target.hops())), f)
            });
        }
    }
    let failed: u64 = rounds
        .iter()
        .flat_map(|r| &r.measured)
        .map(|m| m.max.failed)
        .sum();
    if failed > 0 {
        println!("\n{failed} requests failed under wrk (non-2xx or socket errors)");
    }
    if two_hops {
        println!(
            "\n(two-hop columns: the first row of each figure sums proxies A and B; \
             RSS sums count each process's own copy of shared program pages)"
        );
    }

    let idle_targets: Vec<Target> = targets
        .iter()
        .copied()
        .filter(|t| !idle_side(*t).is_empty())
        .collect();
    if !o.idle_connections.is_empty() && !idle_targets.is_empty() {
        let mut h = String::from("| memory per idle keep-alive connection |");
        let mut sep = String::from("|---|");
        for t in &idle_targets {
            h += &format!(" {} ({}) |", t.name(), idle_side(*t));
            sep += "---|";
        }
        println!("\n{h}\n{sep}");
        let kb = |b: f64| format!("{:.2} KB", b / 1000.0);
        for &n in &o.idle_connections {
            for (what, alloc) in [
                ("VmRSS growth / N", false),
                ("jemalloc allocated growth / N", true),
            ] {
                let mut line = format!("| {what}, N = {n} |");
                for &t in &idle_targets {
                    let s = over(rounds, t, |m| {
                        let i = idle_at(m, n)?;
                        if alloc {
                            i.allocated_bytes
                        } else {
                            Some(i.rss_bytes)
                        }
                    });
                    line += &format!(" {} |", show(s, kb));
                }
                println!("{line}");
            }
        }
    }

    if targets.contains(&Target::Ballast) {
        let target_rate = if o.rates.contains(&5_000) {
            5_000
        } else {
            o.rates[o.rates.len() / 2]
        };
        println!("\nTargets (Ballast, medians):");
        if has_direct {
            let p99 = added(rounds, Target::Ballast, |m| {
                fixed_at(m, target_rate).map(|f| f.p99_us)
            });
            verdict(
                &format!("added p99 at {target_rate} rps < 100 µs"),
                p99.map(|s| (s.0 < 100.0, added_us(s.0))),
            );
        }
        if targets.contains(&Target::Haproxy) {
            let b = over(rounds, Target::Ballast, |m| Some(m.max.rps));
            let h = over(rounds, Target::Haproxy, |m| Some(m.max.rps));
            verdict(
                "max req/s on one core >= haproxy's",
                b.zip(h)
                    .map(|(b, h)| (b.0 >= h.0, format!("{:.0} vs {:.0}", b.0, h.0))),
            );
        }
        let idle = over(rounds, Target::Ballast, |m| sum(&kib_f(&m.rss_idle_kib)));
        let anon = over(rounds, Target::Ballast, |m| sum(&kib_f(&m.anon_idle_kib)));
        verdict(
            "idle RSS <= 5 MB",
            idle.map(|s| {
                let anon = anon.map(|a| format!(", of which anonymous {}", mb(a.0)));
                (
                    s.0 * 1024.0 <= 5e6,
                    format!("{}{}", mb(s.0), anon.unwrap_or_default()),
                )
            }),
        );
        for t in [Target::Ballast, Target::Ballast2] {
            for &n in &o.idle_connections {
                let r = over(rounds, t, |m| Some(idle_at(m, n)?.rss_bytes));
                let a = over(rounds, t, |m| idle_at(m, n)?.allocated_bytes);
                if r.is_none() {
                    continue;
                }
                verdict(
                    &format!(
                        "memory per idle connection <= 2 KB ({}, N = {n})",
                        idle_side(t)
                    ),
                    r.map(|r| {
                        (
                            r.0 <= 2_000.0,
                            format!(
                                "{:.2} KB RSS{}",
                                r.0 / 1000.0,
                                a.map(|a| format!(", {:.2} KB allocated", a.0 / 1000.0))
                                    .unwrap_or_default()
                            ),
                        )
                    }),
                );
            }
        }
    }
}

fn verdict(what: &str, v: Option<(bool, String)>) {
    match v {
        Some((true, figure)) => println!("- {what}: met ({figure})"),
        Some((false, figure)) => println!("- {what}: MISSED ({figure})"),
        None => println!("- {what}: not measured"),
    }
}
