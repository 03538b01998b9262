//! Label and field selectors, as the API server applies them to lists and watches (pure).
//!
//! Label selectors: `k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a,b)`.
//! Field selectors: `=`, `==`, `!=` on `metadata.name`, `metadata.namespace` and the
//! fields the real API server allows for the type; any other field is refused, as the
//! real server does ("field label not supported").

use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
enum LabelOp {
    Eq(String),
    NotEq(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    NotExists,
}

#[derive(Debug, Clone, PartialEq)]
struct LabelReq {
    key: String,
    op: LabelOp,
}

#[derive(Debug, Clone, PartialEq)]
struct FieldReq {
    path: String,
    value: String,
    equal: bool,
}

/// Which objects of one type a request selects.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Filter {
    labels: Vec<LabelReq>,
    fields: Vec<FieldReq>,
}

impl Filter {
    /// Parses the `labelSelector` and `fieldSelector` parameters; the error is the
    /// message of a 400 answer.
    pub fn parse(
        labels: Option<&str>,
        fields: Option<&str>,
        field_labels: &[&str],
    ) -> Result<Filter, String> {
        let labels = match labels {
            Some(s) => parse_labels(s)?,
            None => Vec::new(),
        };
        let fields = match fields {
            Some(s) => parse_fields(s, field_labels)?,
            None => Vec::new(),
        };
        Ok(Filter { labels, fields })
    }

    /// A filter that selects one object name (a watch on a single object's path).
    pub fn with_name(mut self, name: &str) -> Filter {
        self.fields.push(FieldReq {
            path: "metadata.name".into(),
            value: name.into(),
            equal: true,
        });
        self
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        let labels_ok = self.labels.iter().all(|r| match &r.op {
            LabelOp::Eq(v) => label(&r.key) == Some(v.as_str()),
            LabelOp::NotEq(v) => label(&r.key) != Some(v.as_str()),
            LabelOp::In(vs) => label(&r.key).is_some_and(|l| vs.iter().any(|v| v == l)),
            LabelOp::NotIn(vs) => !label(&r.key).is_some_and(|l| vs.iter().any(|v| v == l)),
            LabelOp::Exists => label(&r.key).is_some(),
            LabelOp::NotExists => label(&r.key).is_none(),
        });
        labels_ok
            && self
                .fields
                .iter()
                .all(|f| (field_value(obj, &f.path) == f.value) == f.equal)
    }
}

/// Does a `LabelSelector` object (`matchLabels`, `matchExpressions` with `In`,
/// `NotIn`, `Exists`, `DoesNotExist`) select these labels (an object of strings)? A
/// missing or empty selector selects everything. The error names what is malformed.
pub(crate) fn label_selector_matches(selector: &Value, labels: &Value) -> Result<bool, String> {
    if selector.is_null() {
        return Ok(true);
    }
    let label = |k: &str| labels.get(k).and_then(Value::as_str);
    if let Some(m) = selector.get("matchLabels") {
        let Some(m) = m.as_object() else {
            return Err("matchLabels: not an object".to_string());
        };
        for (k, v) in m {
            let Some(v) = v.as_str() else {
                return Err(format!("matchLabels.{}: not a string", bounded(k)));
            };
            if label(k) != Some(v) {
                return Ok(false);
            }
        }
    }
    let exprs = match selector.get("matchExpressions") {
        None | Some(Value::Null) => return Ok(true),
        Some(Value::Array(a)) => a,
        Some(_) => return Err("matchExpressions: not a list".to_string()),
    };
    for e in exprs {
        let key = e.get("key").and_then(Value::as_str).unwrap_or("");
        let values: Vec<&str> = e
            .get("values")
            .and_then(Value::as_array)
            .map(|vs| vs.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let has = label(key);
        let ok = match e.get("operator").and_then(Value::as_str).unwrap_or("") {
            "In" => has.is_some_and(|l| values.contains(&l)),
            "NotIn" => !has.is_some_and(|l| values.contains(&l)),
            "Exists" => has.is_some(),
            "DoesNotExist" => has.is_none(),
            other => {
                return Err(format!(
                    "matchExpressions: {:?} is not a valid label selector operator",
                    bounded(other)
                ))
            }
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

/// A field as the API server's field sets render it: strings as-is, booleans and
/// numbers as text, missing as empty.
fn field_value(obj: &Value, path: &str) -> String {
    let pointer = format!("/{}", path.replace('.', "/"));
    match obj.pointer(&pointer) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    }
}

fn parse_fields(s: &str, field_labels: &[&str]) -> Result<Vec<FieldReq>, String> {
    let mut out = Vec::new();
    for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let (path, value, equal) = if let Some((k, v)) = term.split_once("!=") {
            (k, v, false)
        } else if let Some((k, v)) = term.split_once("==") {
            (k, v, true)
        } else if let Some((k, v)) = term.split_once('=') {
            (k, v, true)
        } else {
            return Err(format!(
                "invalid selector: '{}'; can't understand '{}'",
                bounded(s),
                bounded(term)
            ));
        };
        let path = path.trim();
        if path != "metadata.name" && path != "metadata.namespace" && !field_labels.contains(&path)
        {
            return Err(format!("field label not supported: {}", bounded(path)));
        }
        out.push(FieldReq {
            path: path.to_string(),
            value: value.trim().to_string(),
            equal,
        });
    }
    Ok(out)
}

fn parse_labels(s: &str) -> Result<Vec<LabelReq>, String> {
    let mut out = Vec::new();
    for term in split_outside_parens(s) {
        let term = term.trim();
        if term.is_empty() {
            continue;
        }
        let bad = || {
            format!(
                "unable to parse requirement: '{}' in label selector '{}'",
                bounded(term),
                bounded(s)
            )
        };
        let req = if let Some(key) = term.strip_prefix('!') {
            LabelReq {
                key: key.trim().to_string(),
                op: LabelOp::NotExists,
            }
        } else if let Some(open) = term.find('(') {
            let (head, set) = term.split_at(open);
            let mut words = head.split_whitespace();
            let (Some(key), Some(op), None) = (words.next(), words.next(), words.next()) else {
                return Err(bad());
            };
            let Some(inner) = set.strip_prefix('(').and_then(|x| x.strip_suffix(')')) else {
                return Err(bad());
            };
            let values: Vec<String> = inner
                .split(',')
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .collect();
            let op = match op {
                "in" => LabelOp::In(values),
                "notin" => LabelOp::NotIn(values),
                _ => return Err(bad()),
            };
            LabelReq {
                key: key.to_string(),
                op,
            }
        } else if let Some((k, v)) = term.split_once("!=") {
            LabelReq {
                key: k.trim().to_string(),
                op: LabelOp::NotEq(v.trim().to_string()),
            }
        } else if let Some((k, v)) = term.split_once("==") {
            LabelReq {
                key: k.trim().to_string(),
                op: LabelOp::Eq(v.trim().to_string()),
            }
        } else if let Some((k, v)) = term.split_once('=') {
            LabelReq {
                key: k.trim().to_string(),
                op: LabelOp::Eq(v.trim().to_string()),
            }
        } else {
            LabelReq {
                key: term.to_string(),
                op: LabelOp::Exists,
            }
        };
        let key_ok = !req.key.is_empty()
            && req
                .key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
        if !key_ok {
            return Err(bad());
        }
        out.push(req);
    }
    Ok(out)
}

fn split_outside_parens(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// At most 64 characters of something a client sent, for an error message.
pub(crate) fn bounded(s: &str) -> String {
    if s.chars().count() <= 64 {
        s.to_string()
    } else {
        let head: String = s.chars().take(64).collect();
        format!("{head}...")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn selects_by_table() {
        let pod = json!({
            "metadata": {"name": "p1", "namespace": "ns1", "labels": {"app": "web", "tier": "fe"}},
            "spec": {"nodeName": "n1", "hostNetwork": true},
            "status": {"phase": "Running"}
        });
        let fl = &["spec.nodeName", "spec.hostNetwork", "status.phase"];
        let cases: &[(Option<&str>, Option<&str>, bool)] = &[
            (None, None, true),
            (Some("app=web"), None, true),
            (Some("app==web,tier=fe"), None, true),
            (Some("app!=web"), None, false),
            (Some("app in (web, api)"), None, true),
            (Some("app notin (web)"), None, false),
            (Some("app in (a,b),tier"), None, false),
            (Some("tier,!missing"), None, true),
            (Some("missing"), None, false),
            (None, Some("metadata.name=p1"), true),
            (None, Some("metadata.namespace!=ns1"), false),
            (None, Some("spec.nodeName=n1,status.phase=Running"), true),
            (None, Some("spec.hostNetwork=true"), true),
            (Some("app=web"), Some("metadata.name=p2"), false),
        ];
        for (labels, fields, want) in cases {
            let f = Filter::parse(*labels, *fields, fl);
            assert_eq!(
                f.as_ref().map(|f| f.matches(&pod)),
                Ok(*want),
                "{labels:?} {fields:?}"
            );
        }
    }

    #[test]
    fn label_selector_objects_by_table() {
        let labels = json!({"app": "web", "tier": "fe"});
        let cases: &[(Value, Result<bool, ()>)] = &[
            (Value::Null, Ok(true)),
            (json!({}), Ok(true)),
            (json!({"matchLabels": {"app": "web"}}), Ok(true)),
            (json!({"matchLabels": {"app": "db"}}), Ok(false)),
            (
                json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]}),
                Ok(true),
            ),
            (
                json!({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["web"]}]}),
                Ok(false),
            ),
            (
                json!({"matchExpressions": [{"key": "x", "operator": "DoesNotExist"}]}),
                Ok(true),
            ),
            (
                json!({"matchExpressions": [{"key": "x", "operator": "Exists"}]}),
                Ok(false),
            ),
            (
                json!({"matchExpressions": [{"key": "x", "operator": "Near"}]}),
                Err(()),
            ),
            (json!({"matchLabels": []}), Err(())),
        ];
        for (sel, want) in cases {
            assert_eq!(
                &label_selector_matches(sel, &labels).map_err(|_| ()),
                want,
                "{sel}"
            );
        }
    }

    #[test]
    fn refuses_what_the_api_refuses() {
        for (labels, fields) in [
            (Some("app in web"), None),
            (Some("=x"), None),
            (Some("a b"), None),
            (None, Some("spec.containers=x")),
            (None, Some("metadata.name")),
        ] {
            assert!(
                Filter::parse(labels, fields, &[]).is_err(),
                "{labels:?} {fields:?}"
            );
        }
    }
}
