//! What the checks found, and how it is printed: one line per check for
//! people, or a stable JSON document for programs.
//!
//! JSON schema (`ballast check -o json`), stable:
//!
//! ```text
//! {
//!   "source": "cluster" | "manifests",
//!   "checks": [
//!     {
//!       "name": "no two live pods share an IP",
//!       "category": "data-plane",
//!       "status": "ok" | "warn" | "fail" | "skipped",
//!       "detail": "why it was skipped, or what was looked at" | null,
//!       "findings": [
//!         {
//!           "severity": "warn" | "fail",
//!           "message": "pod shop/web-1 and pod shop/web-2 share IP 10.0.0.7",
//!           "objects": [{"kind": "Pod", "namespace": "shop", "name": "web-1"}]
//!         }
//!       ]
//!     }
//!   ],
//!   "summary": {"ok": 10, "warn": 1, "fail": 1, "skipped": 1}
//! }
//! ```
//!
//! `namespace` is `null` for cluster-scoped objects. A check's status is its
//! worst finding's severity (`ok` with none), or `skipped` when it could not
//! be run on this source.

use serde::Serialize;
use std::fmt::{self, Write as _};

/// How bad one finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Warn,
    Fail,
}

/// A check's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
    Skipped,
}

impl Status {
    fn glyph(self) -> &'static str {
        match self {
            Status::Ok => "√",
            Status::Warn => "‼",
            Status::Fail => "×",
            Status::Skipped => "-",
        }
    }
}

/// One object a finding is about.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct ObjectRef {
    /// `Pod`, `Service`, `ClusterRole`...
    pub kind: String,
    /// `None` for cluster-scoped objects.
    pub namespace: Option<String>,
    pub name: String,
}

impl ObjectRef {
    pub fn new(kind: &str, namespace: Option<&str>, name: &str) -> ObjectRef {
        ObjectRef {
            kind: kind.to_string(),
            namespace: namespace.filter(|ns| !ns.is_empty()).map(str::to_string),
            name: name.to_string(),
        }
    }
}

/// `pod shop/web-1`, `clusterrole ballast-destination`.
impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = self.kind.to_ascii_lowercase();
        match &self.namespace {
            Some(ns) => write!(f, "{kind} {ns}/{}", self.name),
            None => write!(f, "{kind} {}", self.name),
        }
    }
}

/// One problem, naming the objects involved.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub severity: Severity,
    pub message: String,
    pub objects: Vec<ObjectRef>,
}

impl Finding {
    pub fn fail(message: impl Into<String>, objects: Vec<ObjectRef>) -> Finding {
        Finding {
            severity: Severity::Fail,
            message: message.into(),
            objects,
        }
    }

    pub fn warn(message: impl Into<String>, objects: Vec<ObjectRef>) -> Finding {
        Finding {
            severity: Severity::Warn,
            message: message.into(),
            objects,
        }
    }
}

/// One named check and what it found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CheckResult {
    pub name: String,
    pub category: &'static str,
    pub status: Status,
    pub detail: Option<String>,
    pub findings: Vec<Finding>,
}

impl CheckResult {
    /// A check that ran: its status is its worst finding's.
    pub fn ran(category: &'static str, name: impl Into<String>, findings: Vec<Finding>) -> Self {
        let status = match findings.iter().map(|f| f.severity).max() {
            None => Status::Ok,
            Some(Severity::Warn) => Status::Warn,
            Some(Severity::Fail) => Status::Fail,
        };
        CheckResult {
            name: name.into(),
            category,
            status,
            detail: None,
            findings,
        }
    }

    /// A check that does not apply to this source.
    pub fn skipped(
        category: &'static str,
        name: impl Into<String>,
        why: impl Into<String>,
    ) -> Self {
        CheckResult {
            name: name.into(),
            category,
            status: Status::Skipped,
            detail: Some(why.into()),
            findings: Vec::new(),
        }
    }

    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }
}

/// How many checks ended in each status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub ok: usize,
    pub warn: usize,
    pub fail: usize,
    pub skipped: usize,
}

/// Where the objects came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Cluster,
    Manifests,
}

/// Every check's result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Report {
    pub source: Source,
    pub checks: Vec<CheckResult>,
    pub summary: Summary,
}

impl Report {
    pub fn new(source: Source, checks: Vec<CheckResult>) -> Report {
        let mut summary = Summary::default();
        for c in &checks {
            match c.status {
                Status::Ok => summary.ok += 1,
                Status::Warn => summary.warn += 1,
                Status::Fail => summary.fail += 1,
                Status::Skipped => summary.skipped += 1,
            }
        }
        Report {
            source,
            checks,
            summary,
        }
    }

    /// Did any check fail (warnings do not count)?
    pub fn failed(&self) -> bool {
        self.summary.fail > 0
    }

    /// The JSON document described in the module documentation.
    pub fn to_json(&self) -> String {
        // Plain data with string keys: serializing it cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Checks grouped by category, one line each with its findings
    /// indented below, then the summary line. No colour codes.
    pub fn to_human(&self) -> String {
        let mut out = String::new();
        let mut category = "";
        for c in &self.checks {
            if c.category != category {
                if !category.is_empty() {
                    out.push('\n');
                }
                category = c.category;
                let _ = writeln!(out, "{category}\n{}", "-".repeat(category.len()));
            }
            let _ = writeln!(out, "{} {}", c.status.glyph(), c.name);
            if let Some(detail) = &c.detail {
                for line in detail.lines() {
                    let _ = writeln!(out, "    {line}");
                }
            }
            for f in &c.findings {
                let _ = writeln!(out, "    {}", f.message);
            }
        }
        let _ = writeln!(out, "\n{}", self.summary_line());
        out
    }

    /// `13 checks: 10 ok, 1 warning, 1 failure, 1 skipped`.
    pub fn summary_line(&self) -> String {
        let s = self.summary;
        let plural =
            |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        let mut line = format!(
            "{}: {} ok, {}, {}",
            plural(self.checks.len(), "check", "checks"),
            s.ok,
            plural(s.warn, "warning", "warnings"),
            plural(s.fail, "failure", "failures"),
        );
        if s.skipped > 0 {
            let _ = write!(line, ", {} skipped", s.skipped);
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        Report::new(
            Source::Cluster,
            vec![
                CheckResult::ran("control-plane", "a", vec![]),
                CheckResult::ran(
                    "data-plane",
                    "b",
                    vec![
                        Finding::warn("w", vec![]),
                        Finding::fail(
                            "pod shop/x is bad",
                            vec![ObjectRef::new("Pod", Some("shop"), "x")],
                        ),
                    ],
                ),
                CheckResult::ran("data-plane", "c", vec![Finding::warn("soon", vec![])]),
                CheckResult::skipped("kubernetes", "d", "not on manifests"),
            ],
        )
    }

    #[test]
    fn status_is_the_worst_finding_and_the_summary_counts_checks() {
        let r = report();
        let statuses: Vec<Status> = r.checks.iter().map(|c| c.status).collect();
        assert_eq!(
            statuses,
            [Status::Ok, Status::Fail, Status::Warn, Status::Skipped]
        );
        assert_eq!(
            r.summary,
            Summary {
                ok: 1,
                warn: 1,
                fail: 1,
                skipped: 1
            }
        );
        assert!(r.failed());
        assert_eq!(
            r.summary_line(),
            "4 checks: 1 ok, 1 warning, 1 failure, 1 skipped"
        );
    }

    #[test]
    fn human_output_indents_findings_under_their_check() {
        let text = report().to_human();
        assert!(
            text.contains("× b\n    w\n    pod shop/x is bad\n"),
            "{text}"
        );
        assert!(text.contains("- d\n    not on manifests\n"), "{text}");
        assert!(
            text.starts_with("control-plane\n-------------\n√ a\n"),
            "{text}"
        );
        assert!(!text.contains('\u{1b}'), "no escape codes");
    }

    #[test]
    fn json_follows_the_documented_schema() {
        let v: serde_json::Value = serde_json::from_str(&report().to_json()).expect("valid JSON");
        assert_eq!(v["source"], "cluster");
        assert_eq!(v["summary"]["fail"], 1);
        let b = &v["checks"][1];
        assert_eq!(b["status"], "fail");
        assert_eq!(b["category"], "data-plane");
        assert_eq!(b["findings"][1]["severity"], "fail");
        assert_eq!(
            b["findings"][1]["objects"][0],
            serde_json::json!({"kind": "Pod", "namespace": "shop", "name": "x"})
        );
        assert!(v["checks"][0]["detail"].is_null());
        assert_eq!(
            ObjectRef::new("ClusterRole", None, "r").to_string(),
            "clusterrole r"
        );
    }
}
