//! What the demo shows while it runs and when it ends: on a terminal a table
//! redrawn in place; elsewhere one plain line per second. Rendering is pure
//! (text in, text out) so it can be tested; [`View`] only decides when and
//! how to write it.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use crate::load::{Counts, Snapshot};
use crate::scenario::{DemoOutcome, StepReport};

/// How progress is shown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ViewMode {
    /// A live table when stdout is a terminal, plain lines otherwise.
    #[default]
    Auto,
    /// The live table, redrawn with ANSI escapes.
    Live,
    /// One line per second.
    Plain,
}

/// Plain lines are written at most this often.
const PLAIN_EVERY: Duration = Duration::from_secs(1);
const BAR_WIDTH: usize = 20;
/// Widest line of the live table, so it fits an 80-column terminal (a
/// wrapped line would throw off the redraw).
const LIVE_WIDTH: usize = 79;

const BOLD: &str = "\x1b[1m";
const DIM: &str = "\x1b[2m";
const RED: &str = "\x1b[31m";
const GREEN: &str = "\x1b[32m";
const RESET: &str = "\x1b[0m";

/// Everything one frame shows.
pub struct Progress<'a> {
    /// The step's label (`a`, `b`, ...) and title.
    pub step: &'a str,
    pub title: &'a str,
    /// What is happening now, in a sentence.
    pub note: &'a str,
    pub elapsed: Duration,
    /// How long the step lasts, or its deadline when it waits for something.
    pub planned: Duration,
    /// Backends shown first, in this order; others follow by name.
    pub backends: &'a [String],
    /// Everything since traffic started.
    pub total: &'a Snapshot,
    /// The recent window, and how many seconds it covers.
    pub recent: &'a Snapshot,
    pub recent_secs: f64,
    pub last_error: Option<&'a str>,
}

/// Writes frames and messages to stdout.
pub struct View {
    live: bool,
    /// Lines of the frame on screen, to be redrawn over.
    drawn: usize,
    last_plain: Option<Instant>,
}

impl View {
    pub fn new(mode: ViewMode) -> View {
        let live = match mode {
            ViewMode::Auto => std::io::stdout().is_terminal(),
            ViewMode::Live => true,
            ViewMode::Plain => false,
        };
        View {
            live,
            drawn: 0,
            last_plain: None,
        }
    }

    pub fn is_live(&self) -> bool {
        self.live
    }

    /// Shows the current state: redraws the table, or writes a plain line
    /// if a second has passed since the last one.
    pub fn show(&mut self, progress: &Progress<'_>) {
        if self.live {
            let frame = render_live(progress);
            let mut text = self.erase();
            for line in &frame {
                text.push_str(line);
                text.push('\n');
            }
            self.drawn = frame.len();
            write_out(&text);
        } else {
            let due = self
                .last_plain
                .is_none_or(|last| last.elapsed() >= PLAIN_EVERY);
            if due {
                self.last_plain = Some(Instant::now());
                write_out(&format!("{}\n", render_plain(progress)));
            }
        }
    }

    /// Writes a message line; on a terminal it goes above the table, which
    /// is redrawn below it by the next [`View::show`].
    pub fn say(&mut self, message: &str) {
        let mut text = self.erase();
        self.drawn = 0;
        text.push_str(message);
        text.push('\n');
        write_out(&text);
    }

    /// Writes the closing summary; the last frame is left on screen above it.
    pub fn summary(&mut self, outcome: &DemoOutcome) {
        self.drawn = 0;
        write_out(&render_summary(outcome, self.live));
    }

    /// The escapes that move back over the frame on screen and clear it.
    fn erase(&self) -> String {
        if self.live && self.drawn > 0 {
            // Cursor to the start of the line `drawn` lines up, then clear
            // to the end of the screen.
            format!("\x1b[{}F\x1b[J", self.drawn)
        } else {
            String::new()
        }
    }
}

fn write_out(text: &str) {
    let mut out = std::io::stdout().lock();
    // A closed stdout (a pipe whose reader left) must not stop the demo.
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

/// The live table, one string per line.
pub fn render_live(p: &Progress<'_>) -> Vec<String> {
    let mut lines = Vec::new();
    let fraction = if p.planned.is_zero() {
        1.0
    } else {
        (p.elapsed.as_secs_f64() / p.planned.as_secs_f64()).clamp(0.0, 1.0)
    };
    let filled = (fraction * BAR_WIDTH as f64).round() as usize;
    lines.push(format!(
        "{BOLD}step {:<3}{RESET} {:<32} [{}{}] {:>5.1} / {:.1} s",
        p.step,
        cut(p.title, 32),
        "█".repeat(filled),
        "░".repeat(BAR_WIDTH - filled),
        p.elapsed.as_secs_f64(),
        p.planned.as_secs_f64(),
    ));
    lines.push(format!("{DIM}{}{RESET}", cut(p.note, LIVE_WIDTH)));
    lines.push(String::new());
    lines.push(format!(
        "{BOLD}{:<10} {:>9} {:>8} {:>9} {:>10} {:>10}{RESET}",
        "backend", "requests", "rps", "success", "p50", "p99"
    ));
    let recent_label = format!(
        "{DIM}(rps, success and latency over the last {:.0} s){RESET}",
        p.recent_secs.ceil()
    );
    for name in ordered_names(p.backends, p.total) {
        let total = p.total.backends.get(&name).map_or(0, |c| c.requests);
        let recent = p.recent.backends.get(&name).cloned().unwrap_or_default();
        lines.push(live_row(&name, total, &recent, p.recent_secs));
    }
    let total = p.total.total();
    lines.push(live_row(
        "all",
        total.requests,
        &p.recent.total(),
        p.recent_secs,
    ));
    lines.push(recent_label);
    if let Some(error) = p.last_error {
        let error = cut(error, LIVE_WIDTH - "last error: ".len());
        lines.push(format!("{RED}last error: {error}{RESET}"));
    }
    lines
}

fn live_row(name: &str, total: u64, recent: &Counts, secs: f64) -> String {
    let rps = if secs > 0.0 {
        recent.requests as f64 / secs
    } else {
        0.0
    };
    let success = percent(recent.success_rate());
    let colour = match recent.success_rate() {
        Some(rate) if rate < 1.0 => RED,
        _ => "",
    };
    format!(
        "{name:<10} {total:>9} {rps:>8.0} {colour}{success:>9}{reset} {:>10} {:>10}",
        latency(recent.latency.quantile(0.5)),
        latency(recent.latency.quantile(0.99)),
        reset = if colour.is_empty() { "" } else { RESET },
    )
}

/// One line for logs and pipes. Rates, success and latencies are over the
/// recent window, which the line names (`last 5 s:`); the failure count is
/// since the start.
pub fn render_plain(p: &Progress<'_>) -> String {
    let mut line = format!(
        "[{} {} {:.0}/{:.0}s]",
        p.step,
        p.title,
        p.elapsed.as_secs_f64(),
        p.planned.as_secs_f64()
    );
    let recent = p.recent.total();
    let secs = p.recent_secs.max(f64::EPSILON);
    let _ = write!(
        line,
        " last {}: {:.0} rps, {} ok",
        window(p.recent_secs),
        recent.requests as f64 / secs,
        percent(recent.success_rate())
    );
    for name in ordered_names(p.backends, p.total) {
        let counts = p.recent.backends.get(&name).cloned().unwrap_or_default();
        let _ = write!(
            line,
            " | {name} {:.0} rps p50 {} p99 {}",
            counts.requests as f64 / secs,
            latency(counts.latency.quantile(0.5)),
            latency(counts.latency.quantile(0.99)),
        );
    }
    let failures = p.total.total().failures.total();
    let _ = write!(line, " | failures so far {failures}");
    if let Some(error) = p.last_error {
        let _ = write!(line, " | last error: {error}");
    }
    line
}

/// A window's length as said in a plain line: whole seconds, or tenths while
/// the step's first seconds are shorter than the window.
fn window(secs: f64) -> String {
    if (secs - secs.round()).abs() < 0.05 {
        format!("{:.0} s", secs.round())
    } else {
        format!("{secs:.1} s")
    }
}

/// The closing summary: one row per step, then every check.
pub fn render_summary(outcome: &DemoOutcome, colour: bool) -> String {
    let (bold, red, green, reset) = if colour {
        (BOLD, RED, GREEN, RESET)
    } else {
        ("", "", "", "")
    };
    let mut names: Vec<String> = outcome.backends.clone();
    for step in &outcome.steps {
        for name in step.traffic.backends.keys() {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
    }
    let mut text = String::new();
    let _ = writeln!(text);
    let _ = writeln!(text, "{bold}summary{reset}");
    let mut header = format!(
        "{:<4} {:<34} {:>7} {:>9} {:>8}",
        "step", "what", "time", "requests", "success"
    );
    for name in &names {
        let _ = write!(header, " {name:>7}");
    }
    let _ = write!(header, " {:>9} {:>9}  result", "p50", "p99");
    let _ = writeln!(text, "{bold}{header}{reset}");
    for step in &outcome.steps {
        let _ = writeln!(text, "{}", summary_row(step, &names, red, green, reset));
    }
    let _ = writeln!(text);
    for step in &outcome.steps {
        for check in &step.checks {
            let mark = if check.passed {
                format!("{green}ok  {reset}")
            } else {
                format!("{red}FAIL{reset}")
            };
            let _ = writeln!(text, "{mark} {:<3} {}", step.label, check.text);
        }
    }
    if let Some(converged) = outcome.convergence {
        let _ = writeln!(
            text,
            "\nweb-c stopped receiving traffic {:.1} s after the controller came back",
            converged.as_secs_f64()
        );
    }
    if let Some(mtls) = &outcome.mtls {
        let _ = writeln!(
            text,
            "\ntraffic from load to web was mutual TLS: {} -> {} ({} connections, none without TLS)",
            mtls.client, mtls.server, mtls.connections
        );
    }
    if let Some(addr) = outcome.dashboard {
        let _ = writeln!(text, "\ndashboard: http://{addr}/");
    }
    let _ = writeln!(text);
    if outcome.passed {
        let _ = writeln!(text, "{bold}{green}every step held{reset}");
    } else {
        let failed: Vec<&str> = outcome
            .steps
            .iter()
            .filter(|s| !s.passed())
            .map(|s| s.label.as_str())
            .collect();
        let _ = writeln!(
            text,
            "{bold}{red}the demo FAILED at step {}{reset}",
            failed.join(", ")
        );
        for (label, lines) in &outcome.logs {
            if lines.is_empty() {
                continue;
            }
            let _ = writeln!(text, "\nlast log lines of {label}:");
            for line in lines {
                let _ = writeln!(text, "  {line}");
            }
        }
    }
    text
}

fn summary_row(step: &StepReport, names: &[String], red: &str, green: &str, reset: &str) -> String {
    let total = step.traffic.total();
    let mut row = format!(
        "{:<4} {:<34} {:>6.1}s {:>9} {:>8}",
        step.label,
        step.title,
        step.duration.as_secs_f64(),
        total.requests,
        percent(total.success_rate()),
    );
    for name in names {
        let _ = write!(row, " {:>7}", step.traffic.requests(name));
    }
    let verdict = if step.passed() {
        format!("{green}PASS{reset}")
    } else {
        format!("{red}FAIL{reset}")
    };
    let _ = write!(
        row,
        " {:>9} {:>9}  {verdict}",
        latency(total.latency.quantile(0.5)),
        latency(total.latency.quantile(0.99)),
    );
    row
}

/// `first` in order, then any other names seen, by name.
fn ordered_names(first: &[String], total: &Snapshot) -> Vec<String> {
    let mut names = first.to_vec();
    for name in total.backends.keys() {
        if !names.contains(name) {
            names.push(name.clone());
        }
    }
    names
}

/// `text` cut to `width` characters, with an ellipsis when cut.
fn cut(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(width.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

fn percent(rate: Option<f64>) -> String {
    match rate {
        Some(rate) => format!("{:.2}%", rate * 100.0),
        None => "-".to_string(),
    }
}

fn latency(d: Option<Duration>) -> String {
    match d {
        None => "-".to_string(),
        Some(d) if d < Duration::from_millis(10) => format!("{:.2} ms", d.as_secs_f64() * 1e3),
        Some(d) if d < Duration::from_secs(1) => format!("{:.1} ms", d.as_secs_f64() * 1e3),
        Some(d) => format!("{:.2} s", d.as_secs_f64()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::{LoadStats, Outcome};
    use crate::scenario::Check;

    fn snapshot() -> Snapshot {
        let t0 = Instant::now();
        let mut stats = LoadStats::new(t0);
        for _ in 0..10 {
            stats.record(
                t0,
                Some("web-a"),
                Outcome::Success,
                Some(Duration::from_micros(400)),
            );
            stats.record(
                t0,
                Some("web-b"),
                Outcome::Success,
                Some(Duration::from_millis(2)),
            );
        }
        stats.record(
            t0,
            None,
            Outcome::ProxyError(503),
            Some(Duration::from_millis(1)),
        );
        stats.snapshot()
    }

    fn names() -> Vec<String> {
        ["web-a", "web-b", "web-c"].map(String::from).to_vec()
    }

    fn progress<'a>(names: &'a [String], snap: &'a Snapshot) -> Progress<'a> {
        Progress {
            step: "b",
            title: "controller down",
            note: "the controller is gone",
            elapsed: Duration::from_secs(4),
            planned: Duration::from_secs(10),
            backends: names,
            total: snap,
            recent: snap,
            recent_secs: 5.0,
            last_error: Some(
                "boom, and then a long error text that goes on past the edge of any terminal",
            ),
        }
    }

    #[test]
    fn live_frame_has_a_row_per_backend_and_a_progress_bar() {
        let (names, snap) = (names(), snapshot());
        let frame = render_live(&progress(&names, &snap));
        let text = frame.join("\n");
        assert!(frame[0].contains("step b"), "{text}");
        assert_eq!(
            frame[0].matches('█').count(),
            8,
            "4 of 10 s of a 20-wide bar: {text}"
        );
        for line in &frame {
            let visible = strip(line);
            assert!(
                visible.chars().count() <= LIVE_WIDTH,
                "too wide: {visible:?}"
            );
        }
        for name in ["web-a", "web-b", "web-c", "(none)", "all"] {
            assert!(
                frame.iter().any(|l| l.starts_with(name)),
                "no row for {name}:\n{text}"
            );
        }
        let web_a = frame.iter().find(|l| l.starts_with("web-a")).expect("row");
        assert!(
            web_a.contains("100.00%") && web_a.contains("0.4"),
            "{web_a}"
        );
        // The (none) row holds the proxy error: its success is shown in red.
        let none = frame.iter().find(|l| l.starts_with("(none)")).expect("row");
        assert!(none.contains(RED) && none.contains("0.00%"), "{none}");
        assert!(text.contains("last error: boom"));
        assert!(text.contains('…'), "the long error is cut: {text}");
    }

    #[test]
    fn plain_line_names_every_backend() {
        let (names, snap) = (names(), snapshot());
        let line = render_plain(&progress(&names, &snap));
        assert!(!line.contains('\x1b'), "no escapes in plain output: {line}");
        assert!(line.starts_with("[b controller down 4/10s]"), "{line}");
        for name in ["web-a", "web-b", "web-c"] {
            assert!(line.contains(name), "{line}");
        }
        assert!(line.contains("failures so far 1"), "{line}");
    }

    #[test]
    fn plain_line_names_the_window_of_its_rates() {
        let (names, snap) = (names(), snapshot());
        let mut p = progress(&names, &snap);
        let line = render_plain(&p);
        assert!(
            line.starts_with("[b controller down 4/10s] last 5 s: "),
            "{line}"
        );
        // Early in a step the window is shorter than its full length.
        p.recent_secs = 1.3;
        let line = render_plain(&p);
        assert!(line.contains("] last 1.3 s: "), "{line}");
        assert!(!line.contains("last 5 s"), "{line}");
    }

    #[test]
    fn summary_says_which_step_failed() {
        let snap = snapshot();
        let step = |label: &str, passed: bool| StepReport {
            label: label.to_string(),
            title: "a step".to_string(),
            duration: Duration::from_secs(5),
            traffic: snap.clone(),
            checks: vec![Check {
                text: format!("check of {label}"),
                passed,
            }],
        };
        let mut outcome = DemoOutcome {
            steps: vec![step("a", true), step("b", false)],
            passed: false,
            convergence: None,
            backends: names(),
            logs: vec![("proxy".to_string(), vec!["a log line".to_string()])],
            dashboard: Some("127.0.0.1:8084".parse().expect("addr")),
            mtls: None,
        };
        let text = render_summary(&outcome, false);
        assert!(text.contains("FAILED at step b"), "{text}");
        assert!(text.contains("FAIL b   check of b"), "{text}");
        assert!(text.contains("a log line"), "{text}");
        assert!(!text.contains('\x1b'));
        let row_b = text.lines().find(|l| l.starts_with("b ")).expect("row b");
        assert!(row_b.ends_with("FAIL"), "{row_b}");

        outcome.steps = vec![step("a", true)];
        outcome.passed = true;
        outcome.convergence = Some(Duration::from_millis(1500));
        let text = render_summary(&outcome, false);
        assert!(text.contains("every step held"), "{text}");
        assert!(
            text.contains("\ndashboard: http://127.0.0.1:8084/\n"),
            "{text}"
        );
        assert!(text.contains("1.5 s after"), "{text}");
        assert!(!text.contains("mutual TLS"), "{text}");
        outcome.mtls = Some(crate::scenario::MutualTls {
            client: "load.demo.serviceaccount.identity.linkerd.cluster.local".to_string(),
            server: "web.demo.serviceaccount.identity.linkerd.cluster.local".to_string(),
            connections: 3,
        });
        let text = render_summary(&outcome, false);
        assert!(
            text.contains("\ntraffic from load to web was mutual TLS: load.demo.serviceaccount.identity.linkerd.cluster.local -> web.demo.serviceaccount.identity.linkerd.cluster.local (3 connections, none without TLS)\n"),
            "{text}"
        );
        assert!(!text.contains("a log line"), "logs only on failure");
    }

    /// The line without its colour escapes.
    fn strip(line: &str) -> String {
        let mut out = String::new();
        let mut escape = false;
        for c in line.chars() {
            match (escape, c) {
                (false, '\x1b') => escape = true,
                (true, 'm') => escape = false,
                (true, _) => {}
                (false, c) => out.push(c),
            }
        }
        out
    }

    #[test]
    fn long_texts_are_cut() {
        assert_eq!(cut("short", 10), "short");
        assert_eq!(cut("a longer text", 6), "a lon…");
    }

    #[test]
    fn latencies_read_well() {
        assert_eq!(latency(None), "-");
        assert_eq!(latency(Some(Duration::from_micros(412))), "0.41 ms");
        assert_eq!(latency(Some(Duration::from_millis(25))), "25.0 ms");
        assert_eq!(latency(Some(Duration::from_millis(2500))), "2.50 s");
        assert_eq!(percent(Some(1.0)), "100.00%");
        assert_eq!(percent(None), "-");
    }
}
