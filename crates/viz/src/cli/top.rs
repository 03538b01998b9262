//! `ballast top`: tapped requests counted by source, destination, method
//! and path, with the best, worst and last latency and the success rate,
//! busiest first. Pure: events in, table out.

use std::collections::HashMap;

use ballast_vizcore::api::TapEvent;
use serde::Serialize;

use super::render::{latency, percent, Table};

/// Distinct (source, destination, method, path) rows kept; requests of
/// others are counted as not shown.
pub const MAX_KEYS: usize = 10_000;
/// Longest text kept of a source, destination or path.
const MAX_FIELD_CHARS: usize = 200;

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Key {
    source: String,
    destination: String,
    method: String,
    path: String,
}

#[derive(Clone, Debug, Default)]
struct Row {
    count: u64,
    successes: u64,
    best_ms: Option<f64>,
    worst_ms: Option<f64>,
    last_ms: Option<f64>,
}

/// How the table is shown.
#[derive(Clone, Copy, Debug)]
pub struct TopView {
    pub hide_sources: bool,
    /// Rows shown at most (the busiest).
    pub max_rows: usize,
}

#[derive(Debug)]
pub struct Top {
    rows: HashMap<Key, Row>,
    max_keys: usize,
    /// Requests not counted because `max_keys` rows were kept.
    uncounted: u64,
}

impl Top {
    pub fn new(max_keys: usize) -> Self {
        Self {
            rows: HashMap::new(),
            max_keys,
            uncounted: 0,
        }
    }

    /// Counts one request.
    pub fn add(&mut self, e: &TapEvent) {
        let peer = |workload: &Option<String>, addr: &str| {
            cut(workload
                .as_deref()
                .filter(|w| !w.is_empty())
                .unwrap_or(addr))
        };
        let key = Key {
            source: peer(&e.source_workload, &e.source),
            destination: peer(&e.destination_workload, &e.destination),
            method: cut(&e.method),
            path: cut(&e.path),
        };
        if !self.rows.contains_key(&key) && self.rows.len() >= self.max_keys {
            self.uncounted += 1;
            return;
        }
        let row = self.rows.entry(key).or_default();
        row.count += 1;
        if is_success(e) {
            row.successes += 1;
        }
        if let Some(ms) = e.latency_ms.or(e.duration_ms).filter(|v| v.is_finite()) {
            row.best_ms = Some(row.best_ms.map_or(ms, |b| b.min(ms)));
            row.worst_ms = Some(row.worst_ms.map_or(ms, |w| w.max(ms)));
            row.last_ms = Some(ms);
        }
    }

    /// Requests counted so far.
    pub fn total(&self) -> u64 {
        self.rows.values().map(|r| r.count).sum()
    }

    pub fn render(&self, view: TopView) -> String {
        let mut columns = Vec::new();
        if !view.hide_sources {
            columns.push(("SOURCE", false));
        }
        columns.extend([
            ("DESTINATION", false),
            ("METHOD", false),
            ("PATH", false),
            ("COUNT", true),
            ("BEST", true),
            ("WORST", true),
            ("LAST", true),
            ("SUCCESS_RATE", true),
        ]);
        let (rows, hidden) = self.shown(view);
        let mut table = Table::new(&columns);
        for (key, row) in &rows {
            let mut cells = Vec::new();
            if !view.hide_sources {
                cells.push(key.source.clone());
            }
            cells.extend([
                key.destination.clone(),
                key.method.clone(),
                key.path.clone(),
                row.count.to_string(),
                latency(row.best_ms),
                latency(row.worst_ms),
                latency(row.last_ms),
                percent(Some(row.successes as f64 / row.count.max(1) as f64)),
            ]);
            table.push(cells);
        }
        let mut out = table.render();
        if hidden > 0 {
            out.push_str(&format!("({hidden} more rows not shown)\n"));
        }
        if self.uncounted > 0 {
            out.push_str(&format!(
                "({} requests not counted: at most {} rows are kept)\n",
                self.uncounted, self.max_keys
            ));
        }
        out
    }
}

/// The table as one JSON document (`-o json`): the same rows, busiest
/// first, with figures in milliseconds.
#[derive(Debug, Serialize, PartialEq)]
pub struct TopJson {
    /// Requests counted.
    pub requests: u64,
    /// Requests not counted because the bound on rows was reached.
    pub not_counted: u64,
    /// Rows beyond `--max-rows`, left out.
    pub rows_not_shown: usize,
    pub rows: Vec<TopJsonRow>,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct TopJsonRow {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    pub destination: String,
    pub method: String,
    pub path: String,
    pub count: u64,
    pub success_rate: f64,
    pub best_ms: Option<f64>,
    pub worst_ms: Option<f64>,
    pub last_ms: Option<f64>,
}

impl Top {
    /// The rows `render` shows, busiest first.
    fn shown(&self, view: TopView) -> (Vec<(&Key, &Row)>, usize) {
        let mut rows: Vec<(&Key, &Row)> = self.rows.iter().collect();
        rows.sort_by(|(ka, a), (kb, b)| b.count.cmp(&a.count).then_with(|| ka.cmp(kb)));
        let hidden = rows.len().saturating_sub(view.max_rows);
        rows.truncate(view.max_rows);
        (rows, hidden)
    }

    pub fn json(&self, view: TopView) -> TopJson {
        let (rows, hidden) = self.shown(view);
        TopJson {
            requests: self.total(),
            not_counted: self.uncounted,
            rows_not_shown: hidden,
            rows: rows
                .into_iter()
                .map(|(key, row)| TopJsonRow {
                    source: (!view.hide_sources).then(|| key.source.clone()),
                    destination: key.destination.clone(),
                    method: key.method.clone(),
                    path: key.path.clone(),
                    count: row.count,
                    success_rate: row.successes as f64 / row.count.max(1) as f64,
                    best_ms: row.best_ms,
                    worst_ms: row.worst_ms,
                    last_ms: row.last_ms,
                })
                .collect(),
        }
    }
}

/// Linkerd's classification: a response under 500, a gRPC status of OK
/// when there is one, and no error.
fn is_success(e: &TapEvent) -> bool {
    e.error.is_none() && e.status.is_some_and(|s| s < 500) && e.grpc_status.is_none_or(|g| g == 0)
}

fn cut(s: &str) -> String {
    if s.chars().count() <= MAX_FIELD_CHARS {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(MAX_FIELD_CHARS).collect();
        t.push('…');
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(src: &str, path: &str, status: Option<u16>, latency: f64) -> TapEvent {
        TapEvent {
            source: "127.0.0.1:1".into(),
            source_workload: Some(src.into()),
            destination: "127.0.0.2:80".into(),
            destination_workload: Some("deployment/web".into()),
            method: "GET".into(),
            path: path.into(),
            status,
            latency_ms: Some(latency),
            ..TapEvent::default()
        }
    }

    const VIEW: TopView = TopView {
        hide_sources: false,
        max_rows: 10,
    };

    #[test]
    fn requests_are_counted_by_source_destination_method_path() {
        let mut top = Top::new(100);
        top.add(&event("deployment/load", "/", Some(200), 2.0));
        top.add(&event("deployment/load", "/", Some(500), 30.0));
        top.add(&event("deployment/load", "/", Some(200), 1.0));
        top.add(&event("deployment/load", "/a", Some(200), 5.0));
        let mut no_workload = event("x", "/a", None, 7.0);
        no_workload.source_workload = None;
        no_workload.error = Some("incomplete".into());
        top.add(&no_workload);
        assert_eq!(top.total(), 5);
        assert_eq!(
            top.render(VIEW),
            "SOURCE            DESTINATION      METHOD   PATH   COUNT    BEST   WORST    LAST   SUCCESS_RATE\n\
             deployment/load   deployment/web   GET      /          3   1.0ms    30ms   1.0ms         66.67%\n\
             127.0.0.1:1       deployment/web   GET      /a         1   7.0ms   7.0ms   7.0ms          0.00%\n\
             deployment/load   deployment/web   GET      /a         1   5.0ms   5.0ms   5.0ms        100.00%\n"
        );
        let hidden = top.render(TopView {
            hide_sources: true,
            max_rows: 1,
        });
        assert!(hidden.starts_with("DESTINATION "), "{hidden}");
        assert!(hidden.ends_with("(2 more rows not shown)\n"), "{hidden}");

        // The same rows as JSON.
        let json = serde_json::to_value(top.json(TopView {
            hide_sources: false,
            max_rows: 2,
        }))
        .expect("serializes");
        assert_eq!(json["requests"], 5);
        assert_eq!(json["rows_not_shown"], 1);
        assert_eq!(json["rows"][0]["source"], "deployment/load");
        assert_eq!(json["rows"][0]["path"], "/");
        assert_eq!(json["rows"][0]["count"], 3);
        assert_eq!(json["rows"][0]["best_ms"], 1.0);
        assert_eq!(json["rows"][0]["worst_ms"], 30.0);
        let rate = json["rows"][0]["success_rate"].as_f64().expect("a rate");
        assert!((rate - 2.0 / 3.0).abs() < 1e-9, "{rate}");
        assert_eq!(json["rows"][1]["source"], "127.0.0.1:1");
        let hidden = top.json(TopView {
            hide_sources: true,
            max_rows: 10,
        });
        assert!(hidden.rows.iter().all(|r| r.source.is_none()));
    }

    #[test]
    fn rows_are_bounded() {
        let mut top = Top::new(2);
        for i in 0..5 {
            top.add(&event("deployment/load", &format!("/{i}"), Some(200), 1.0));
        }
        top.add(&event("deployment/load", "/0", Some(200), 1.0));
        assert_eq!(top.total(), 3);
        let text = top.render(VIEW);
        assert!(
            text.ends_with("(3 requests not counted: at most 2 rows are kept)\n"),
            "{text}"
        );
        let mut long = event("deployment/load", &"/x".repeat(500), Some(200), 1.0);
        long.method = "GET".into();
        let mut top = Top::new(2);
        top.add(&long);
        assert!(top.render(VIEW).lines().nth(1).expect("row").contains('…'));
    }

    #[test]
    fn grpc_failures_are_not_successes() {
        let mut e = event("deployment/load", "/svc/Method", Some(200), 1.0);
        assert!(is_success(&e));
        e.grpc_status = Some(14);
        assert!(!is_success(&e));
        e.grpc_status = Some(0);
        e.status = Some(503);
        assert!(!is_success(&e));
    }
}
