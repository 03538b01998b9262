//! The proxy benchmark's tables: medians over rounds with min-max, the
//! proxies' latency as added to the direct path of the same round.

use super::{Measured, Opts, Round, Target};

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

fn cpu_at(m: &Measured, rate: u32) -> Option<f64> {
    m.fixed
        .iter()
        .find(|(r, _, _)| *r == rate)
        .and_then(|(_, _, c)| *c)
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
                cpu.map(|c| format!(" {c:.4} cpu-s/1k")).unwrap_or_default(),
                if f.failed > 0 {
                    format!(" FAILED {}", f.failed)
                } else {
                    String::new()
                }
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let kib = |v: Option<u64>| v.map(|k| mb(k as f64)).unwrap_or_else(|| "-".into());
    println!(
        "round {round} {:<8} {lat}; max {:.0} rps{}{}; rss idle {} load {} hwm {}{}; foreign {:.2} cores{}",
        m.target.name(),
        m.max.rps,
        m.max_core_busy
            .map(|b| format!(" (proxy core {:.0}%)", b * 100.0))
            .unwrap_or_default(),
        if m.max.failed > 0 {
            format!(" FAILED {}", m.max.failed)
        } else {
            String::new()
        },
        kib(m.rss_idle_kib),
        kib(m.rss_load_kib),
        kib(m.hwm_kib),
        m.idle_conn_bytes
            .map(|b| format!(", {:.1} KB per idle conn", b / 1000.0))
            .unwrap_or_default(),
        m.foreign.cores(),
        if m.foreign.rustc { " (rustc ran)" } else { "" },
    );
}

/// The tables, in Markdown.
pub fn print(o: &Opts, targets: &[Target], rounds: &[Round], discarded: usize) {
    let proxies: Vec<Target> = targets
        .iter()
        .copied()
        .filter(|t| *t != Target::Direct)
        .collect();
    let has_direct = targets.contains(&Target::Direct);
    println!();
    println!(
        "{} rounds (alternating {}), {} discarded as disturbed; {} s per run; \
         oha {} connections, wrk -t1 -c{}",
        rounds.len(),
        targets
            .iter()
            .map(|t| t.name())
            .collect::<Vec<_>>()
            .join(", "),
        discarded,
        o.duration.as_secs(),
        o.connections,
        o.wrk_connections
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

    for &rate in &o.rates {
        header(&format!("at {} rps (oha, latency-corrected)", rate));
        type Pick = fn(&super::Fixed) -> f64;
        let rows: [(&str, Pick); 3] = [
            ("p50", |f| f.p50_us),
            ("p99", |f| f.p99_us),
            ("p99.9", |f| f.p999_us),
        ];
        for (name, pick) in rows {
            let mut line = format!("| {name} |");
            for &t in targets {
                let cell = if t == Target::Direct || !has_direct {
                    show(over(rounds, t, |m| fixed_at(m, rate).map(pick)), us)
                } else {
                    show(added(rounds, t, |m| fixed_at(m, rate).map(pick)), added_us)
                };
                line += &format!(" {cell} |");
            }
            println!("{line}");
        }
        let mut line = String::from("| achieved rps |");
        for &t in targets {
            line += &format!(
                " {} |",
                show(
                    over(rounds, t, |m| fixed_at(m, rate).map(|f| f.achieved_rps)),
                    |x| format!("{x:.0}")
                )
            );
        }
        println!("{line}");
        let mut line = String::from("| proxy CPU s per 1k requests |");
        for &t in targets {
            line += &format!(
                " {} |",
                show(over(rounds, t, |m| cpu_at(m, rate)), |x| format!("{x:.4}"))
            );
        }
        println!("{line}");
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
    type Row = (
        &'static str,
        fn(&Measured) -> Option<f64>,
        fn(f64) -> String,
    );
    let rows: [Row; 10] = [
        (
            "max req/s (wrk -t1 -c64)",
            |m| Some(m.max.rps),
            |x| format!("{x:.0}"),
        ),
        (
            "proxy core busy during max",
            |m| m.max_core_busy,
            |x| format!("{:.0}%", x * 100.0),
        ),
        (
            "proxy CPU s per 1k requests at max",
            |m| m.max_cpu_per_1k,
            |x| format!("{x:.4}"),
        ),
        (
            "RSS idle (after warm-up)",
            |m| m.rss_idle_kib.map(|k| k as f64),
            mb,
        ),
        (
            "of which anonymous (RssAnon)",
            |m| m.anon_idle_kib.map(|k| k as f64),
            mb,
        ),
        (
            "RSS under load (mid max-rate run)",
            |m| m.rss_load_kib.map(|k| k as f64),
            mb,
        ),
        (
            "of which anonymous (RssAnon)",
            |m| m.anon_load_kib.map(|k| k as f64),
            mb,
        ),
        ("RSS after load", |m| m.rss_after_kib.map(|k| k as f64), mb),
        ("peak RSS (VmHWM)", |m| m.hwm_kib.map(|k| k as f64), mb),
        (
            "memory per idle keep-alive connection",
            |m| m.idle_conn_bytes,
            |b| format!("{:.1} KB", b / 1000.0),
        ),
    ];
    for (name, pick, f) in rows {
        let mut line = format!("| {name} |");
        for &t in targets {
            line += &format!(" {} |", show(over(rounds, t, pick), f));
        }
        println!("{line}");
    }
    let failed: u64 = rounds
        .iter()
        .flat_map(|r| &r.measured)
        .map(|m| m.max.failed)
        .sum();
    if failed > 0 {
        println!("\n{failed} requests failed under wrk (non-2xx or socket errors)");
    }

    if proxies.contains(&Target::Ballast) {
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
        if proxies.contains(&Target::Haproxy) {
            let b = over(rounds, Target::Ballast, |m| Some(m.max.rps));
            let h = over(rounds, Target::Haproxy, |m| Some(m.max.rps));
            verdict(
                "max req/s on one core >= haproxy's",
                b.zip(h)
                    .map(|(b, h)| (b.0 >= h.0, format!("{:.0} vs {:.0}", b.0, h.0))),
            );
        }
        let idle = over(rounds, Target::Ballast, |m| {
            m.rss_idle_kib.map(|k| k as f64)
        });
        let anon = over(rounds, Target::Ballast, |m| {
            m.anon_idle_kib.map(|k| k as f64)
        });
        verdict(
            "idle RSS < 5 MB",
            idle.map(|s| {
                let anon = anon.map(|a| format!(", of which anonymous {}", mb(a.0)));
                (
                    s.0 * 1024.0 < 5e6,
                    format!("{}{}", mb(s.0), anon.unwrap_or_default()),
                )
            }),
        );
    }
}

fn verdict(what: &str, v: Option<(bool, String)>) {
    match v {
        Some((true, figure)) => println!("- {what}: met ({figure})"),
        Some((false, figure)) => println!("- {what}: MISSED ({figure})"),
        None => println!("- {what}: not measured"),
    }
}
