//! Injection of manifest text: multi-document YAML, or JSON (one value or
//! several). Documents without a workload that changes pass through
//! byte-for-byte, comments included; a changed document is written back
//! with its keys in their original order (keys injection adds follow
//! Kubernetes' usual order), keeping the comment lines at its start and end.

use crate::{
    pod::{inject_pod_owned, uninject_pod, Mode, Outcome, Owner},
    Config, InjectError,
};
use serde::{de, ser::SerializeMap, ser::SerializeSeq, Deserialize, Serialize};
use serde_json::{Map, Value};
use std::fmt;

/// Add the sidecar, or take it out.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Inject,
    Uninject,
}

/// The syntax of the input, and so of the output.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Json,
}

/// The rewritten text and what happened to each workload in it.
#[derive(Clone, Debug, PartialEq)]
pub struct Rewritten {
    pub text: String,
    pub format: Format,
    pub report: Report,
}

/// One line per workload (or Pod) found, in input order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    pub objects: Vec<ObjectReport>,
}

impl Report {
    /// Whether any object was changed.
    pub fn changed(&self) -> bool {
        self.objects.iter().any(|o| o.outcome.changed())
    }
}

/// What happened to one workload.
#[derive(Clone, Debug, PartialEq)]
pub struct ObjectReport {
    /// 1-based, among the documents of the input.
    pub document: usize,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
    pub outcome: Outcome,
}

impl fmt::Display for ObjectReport {
    /// As Linkerd prints it: `deployment "web" injected`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {:?}", self.kind.to_ascii_lowercase(), self.name)?;
        if let Some(ns) = &self.namespace {
            write!(f, " in namespace {ns:?}")?;
        }
        write!(f, " {}", self.outcome)
    }
}

/// Injects (or uninjects) every workload in `text`: Pods, Deployments,
/// StatefulSets, DaemonSets, ReplicaSets, ReplicationControllers, Jobs,
/// CronJobs, and these inside `List`s. `source_name` names the input in
/// errors. JSON input (text starting with `{` or `[`) gives JSON output.
/// On an error nothing is returned: the input is refused whole.
pub fn inject_documents(
    text: &str,
    source_name: &str,
    mode: Mode,
    config: &Config,
    action: Action,
) -> Result<Rewritten, InjectError> {
    let body = text.trim_start_matches('\u{feff}').trim_start();
    let mut job = Job {
        source_name,
        mode,
        config,
        action,
        report: Report::default(),
    };
    if body.starts_with(['{', '[']) {
        if let Some(text) = job.json(text)? {
            return Ok(Rewritten {
                text,
                format: Format::Json,
                report: job.report,
            });
        }
        job.report = Report::default();
    }
    let text = job.yaml(text)?;
    Ok(Rewritten {
        text,
        format: Format::Yaml,
        report: job.report,
    })
}

/// `text` (YAML or JSON manifests, as [`inject_documents`] reads them)
/// written in `format`: every document rewritten, comments dropped. JSON
/// output is one pretty value per document, YAML output is documents
/// separated by `---`. Text already in `format` is returned unchanged.
pub fn convert(text: &str, source_name: &str, format: Format) -> Result<String, InjectError> {
    let job = Job {
        source_name,
        mode: Mode::Manual,
        config: &Config::default(),
        action: Action::Inject,
        report: Report::default(),
    };
    let body = text.trim_start_matches('\u{feff}').trim_start();
    let mut nodes = Vec::new();
    let mut is_json = false;
    if body.starts_with(['{', '[']) {
        let stream = serde_json::Deserializer::from_str(text).into_iter::<Node>();
        if let Ok(json) = stream.collect::<Result<Vec<Node>, _>>() {
            nodes = json;
            is_json = true;
        }
    }
    if !is_json {
        for chunk in split_yaml(text) {
            let chunk_nodes: Vec<Node> =
                serde_saphyr::from_multiple_with_options(chunk.text, yaml_read_options())
                    .map_err(|e| job.malformed(nodes.len() + 1, e.to_string()))?;
            nodes.extend(chunk_nodes);
        }
    }
    if is_json == (format == Format::Json) {
        return Ok(text.to_string());
    }
    let mut out = String::new();
    for (i, node) in nodes.iter().enumerate() {
        match format {
            Format::Json => {
                let json = serde_json::to_string_pretty(node)
                    .map_err(|e| job.malformed(i + 1, e.to_string()))?;
                out.push_str(&json);
                out.push('\n');
            }
            Format::Yaml => {
                if i > 0 {
                    out.push_str("---\n");
                }
                let yaml = serde_saphyr::to_string_with_options(node, yaml_options())
                    .map_err(|e| job.malformed(i + 1, e.to_string()))?;
                out.push_str(&yaml);
            }
        }
    }
    Ok(out)
}

struct Job<'a> {
    source_name: &'a str,
    mode: Mode,
    config: &'a Config,
    action: Action,
    report: Report,
}

impl Job<'_> {
    /// `None` if the text is not JSON after all (then it is read as YAML).
    fn json(&mut self, text: &str) -> Result<Option<String>, InjectError> {
        let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Node>();
        let mut out = String::with_capacity(text.len());
        let mut done = 0;
        let mut document = 0;
        while let Some(next) = stream.next() {
            let node = match next {
                Ok(node) => node,
                // A first value that is not JSON may be YAML's flow style.
                Err(_) if document == 0 => return Ok(None),
                Err(e) => return Err(self.malformed(document + 1, e.to_string())),
            };
            document += 1;
            let end = stream.byte_offset();
            let original = &text[done..end];
            match self.document(document, &node)? {
                None => out.push_str(original),
                Some(changed) => {
                    // The whitespace before the value is kept.
                    let value_start = original.len() - original.trim_start().len();
                    out.push_str(&original[..value_start]);
                    let json = serde_json::to_string_pretty(&changed)
                        .map_err(|e| self.malformed(document, e.to_string()))?;
                    out.push_str(&json);
                }
            }
            done = end;
        }
        out.push_str(&text[done..]);
        Ok(Some(out))
    }

    fn yaml(&mut self, text: &str) -> Result<String, InjectError> {
        let mut out = String::with_capacity(text.len() + 4096);
        let mut document = 0;
        let chunks = split_yaml(text);
        if chunks.len() > MAX_DOCUMENTS {
            return Err(self.malformed(
                MAX_DOCUMENTS + 1,
                format!("more than {MAX_DOCUMENTS} documents in one input; split it"),
            ));
        }
        for chunk in chunks {
            let nodes: Vec<Node> =
                match serde_saphyr::from_multiple_with_options(chunk.text, yaml_read_options()) {
                    Ok(nodes) => nodes,
                    Err(_) => {
                        // Parsed again with the lines before it, so that the
                        // parser's line numbers are the file's.
                        let padded = "\n".repeat(chunk.first_line - 1) + chunk.text;
                        let message = match serde_saphyr::from_multiple_with_options::<Node>(
                            &padded,
                            yaml_read_options(),
                        ) {
                            Err(e) => e.to_string(),
                            Ok(_) => "cannot be parsed".to_string(),
                        };
                        return Err(self.malformed(document + 1, message));
                    }
                };
            let mut changed = Vec::with_capacity(nodes.len());
            for node in &nodes {
                document += 1;
                changed.push(self.document(document, node)?);
            }
            if changed.iter().all(Option::is_none) {
                out.push_str(chunk.text);
                continue;
            }
            let (head, tail) = chunk.comments();
            out.push_str(head);
            if chunk.starts_with_marker() && !head.starts_with("---") {
                out.push_str("---\n");
            }
            for (i, (node, changed)) in nodes.iter().zip(&changed).enumerate() {
                if i > 0 {
                    out.push_str("---\n");
                }
                let node = changed.as_ref().unwrap_or(node);
                let yaml = serde_saphyr::to_string_with_options(node, yaml_options())
                    .map_err(|e| self.malformed(document, e.to_string()))?;
                out.push_str(&yaml);
                if !yaml.ends_with('\n') {
                    out.push('\n');
                }
            }
            out.push_str(tail);
        }
        Ok(out)
    }

    /// The document rewritten, or `None` when it is unchanged.
    fn document(&mut self, document: usize, node: &Node) -> Result<Option<Node>, InjectError> {
        let mut value = node.to_value();
        if !self.object(document, &mut value)? {
            return Ok(None);
        }
        Ok(Some(Node::merge(&value, Some(node))))
    }

    /// Whether `value` (an object or a List of them) changed.
    fn object(&mut self, document: usize, value: &mut Value) -> Result<bool, InjectError> {
        let kind = value["kind"].as_str().unwrap_or_default().to_string();
        if kind.ends_with("List") && value["items"].is_array() {
            let mut changed = false;
            for item in value["items"].as_array_mut().into_iter().flatten() {
                changed |= self.object(document, item)?;
            }
            return Ok(changed);
        }
        let group = value["apiVersion"]
            .as_str()
            .map(|v| v.rsplit_once('/').map_or("", |(group, _)| group))
            .unwrap_or("-");
        let name = value["metadata"]["name"]
            .as_str()
            .or_else(|| value["metadata"]["generateName"].as_str())
            .unwrap_or_default()
            .to_string();
        let namespace = value["metadata"]["namespace"].as_str().map(str::to_string);
        let (pointer, owner) = match (group, kind.as_str()) {
            ("", "Pod") => ("", Owner::of_pod(value)),
            ("", "ReplicationController") => ("/spec/template", None),
            ("apps" | "extensions", "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet")
            | ("batch", "Job") => ("/spec/template", Owner::of_workload(&kind, &name)),
            ("batch", "CronJob") => ("/spec/jobTemplate/spec/template", None),
            _ => return Ok(false),
        };
        let in_object = |error| InjectError::InObject {
            source_name: self.source_name.to_string(),
            document,
            object: format!("{} {name:?}", kind.to_ascii_lowercase()),
            error: Box::new(error),
        };
        let Some(pod) = value.pointer_mut(pointer).filter(|p| p.is_object()) else {
            return Err(in_object(InjectError::NotAPod(format!(
                "it has no {}",
                pointer.trim_start_matches('/').replace('/', ".")
            ))));
        };
        let outcome = match self.action {
            Action::Inject => inject_pod_owned(pod, owner.as_ref(), None, self.mode, self.config),
            Action::Uninject => uninject_pod(pod),
        }
        .map_err(in_object)?;
        let changed = outcome.changed();
        self.report.objects.push(ObjectReport {
            document,
            kind,
            namespace,
            name,
            outcome,
        });
        Ok(changed)
    }

    fn malformed(&self, document: usize, message: String) -> InjectError {
        // The parser's first line says it all; the rest is a source excerpt.
        let message = message.lines().next().unwrap_or_default();
        let message = message.strip_prefix("error: ").unwrap_or(message);
        InjectError::Malformed {
            source_name: self.source_name.to_string(),
            document,
            message: message.to_string(),
        }
    }
}

/// Documents read from one input at most: each is parsed into a tree
/// several times its text's size, so an input's memory follows its count.
pub const MAX_DOCUMENTS: usize = 10_000;

/// YAML read as Kubernetes reads it (YAML 1.1's `0755` is octal: a
/// volume's `defaultMode: 0755` is 493).
fn yaml_read_options() -> serde_saphyr::Options {
    let mut options = serde_saphyr::Options::default();
    options.legacy_octal_numbers = true;
    options
}

fn yaml_options() -> serde_saphyr::SerializerOptions {
    let mut options = serde_saphyr::SerializerOptions::default();
    // Long one-line strings stay on one line (no folding).
    options.folded_wrap_chars = 1 << 20;
    options
}

/// One document's text (at most a few, when a `...` ends one without a
/// `---` starting the next): from a `---` line (or the start) to the next.
struct Chunk<'a> {
    text: &'a str,
    /// 1-based line of the file where it starts.
    first_line: usize,
}

/// A `---` document marker line (maybe followed by content or a comment).
fn is_marker(line: &str) -> bool {
    let line = line.trim_end_matches(['\n', '\r']);
    line == "---" || line.starts_with("--- ") || line.starts_with("---\t")
}

/// Lines kept around a rewritten document: comments at the first column,
/// `...` and directives.
fn is_comment_line(line: &str) -> bool {
    let line = line.trim_end_matches(['\n', '\r']);
    line.starts_with('#') || line == "..." || line.starts_with('%')
}

fn split_yaml(text: &str) -> Vec<Chunk<'_>> {
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut first_line = 1;
    let mut offset = 0;
    for (line_no, line) in (1..).zip(text.split_inclusive('\n')) {
        if is_marker(line) && offset > start {
            chunks.push(Chunk {
                text: &text[start..offset],
                first_line,
            });
            start = offset;
            first_line = line_no;
        }
        offset += line.len();
    }
    if offset > start {
        chunks.push(Chunk {
            text: &text[start..],
            first_line,
        });
    }
    chunks
}

impl<'a> Chunk<'a> {
    fn starts_with_marker(&self) -> bool {
        is_marker(self.text.split_inclusive('\n').next().unwrap_or_default())
    }

    /// The lines before the document (a `---` marker with no content or
    /// just a comment, blank lines and comments) and the comment lines after it, kept when it is rewritten.
    fn comments(&self) -> (&'a str, &'a str) {
        let mut head = 0;
        for (i, line) in self.text.split_inclusive('\n').enumerate() {
            let rest = line.trim_end().strip_prefix("---").map(str::trim_start);
            let bare_marker = i == 0
                && is_marker(line)
                && rest.is_some_and(|r| r.is_empty() || r.starts_with('#'));
            if bare_marker || line.trim().is_empty() || line.starts_with('#') {
                head += line.len();
            } else {
                break;
            }
        }
        // Blank lines straight after the document belong to it (a `|+`
        // block scalar keeps them); the comment lines after those are kept.
        let mut tail_start = self.text.len();
        let mut kept_start = None;
        for line in self.text[head..].split_inclusive('\n').rev() {
            if line.trim().is_empty() {
                tail_start -= line.len();
            } else if is_comment_line(line) {
                tail_start -= line.len();
                kept_start = Some(tail_start);
            } else {
                break;
            }
        }
        let kept = kept_start.map_or("", |start| &self.text[start..]);
        (&self.text[..head], kept)
    }
}

/// A YAML or JSON value that keeps its maps' key order.
#[derive(Clone, Debug, PartialEq)]
enum Node {
    /// Null, a boolean, a number or a string.
    Scalar(Value),
    Seq(Vec<Node>),
    Map(Vec<(String, Node)>),
}

/// The order of keys injection adds, where the input has none: Kubernetes'
/// usual one; other keys follow alphabetically.
const KEY_ORDER: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "name",
    "namespace",
    "labels",
    "annotations",
    "image",
    "imagePullPolicy",
    "command",
    "args",
    "env",
    "value",
    "valueFrom",
    "fieldRef",
    "fieldPath",
    "ports",
    "containerPort",
    "livenessProbe",
    "readinessProbe",
    "httpGet",
    "path",
    "port",
    "periodSeconds",
    "resources",
    "requests",
    "limits",
    "securityContext",
    "volumeMounts",
    "mountPath",
    "readOnly",
    "spec",
    "initContainers",
    "containers",
    "volumes",
];

impl Node {
    fn to_value(&self) -> Value {
        match self {
            Node::Scalar(v) => v.clone(),
            Node::Seq(items) => Value::Array(items.iter().map(Node::to_value).collect()),
            Node::Map(entries) => Value::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_value()))
                    .collect::<Map<_, _>>(),
            ),
        }
    }

    /// `value` as a node, its keys in `hint`'s order where `hint` has them.
    fn merge(value: &Value, hint: Option<&Node>) -> Node {
        match value {
            Value::Array(items) => {
                let hints = match hint {
                    Some(Node::Seq(hints)) => hints.as_slice(),
                    _ => &[],
                };
                let named = |n: &Node| match n {
                    Node::Map(entries) => {
                        entries
                            .iter()
                            .find(|(k, _)| k == "name")
                            .and_then(|(_, v)| match v {
                                Node::Scalar(Value::String(s)) => Some(s.clone()),
                                _ => None,
                            })
                    }
                    _ => None,
                };
                let by_position = hints.len() == items.len();
                Node::Seq(
                    items
                        .iter()
                        .enumerate()
                        .map(|(i, item)| {
                            let hint = match item["name"].as_str() {
                                Some(name) => {
                                    hints.iter().find(|h| named(h).as_deref() == Some(name))
                                }
                                None => by_position.then(|| &hints[i]),
                            };
                            Node::merge(item, hint)
                        })
                        .collect(),
                )
            }
            Value::Object(map) => {
                let hints: &[(String, Node)] = match hint {
                    Some(Node::Map(entries)) => entries,
                    _ => &[],
                };
                let mut entries: Vec<(String, Node)> = hints
                    .iter()
                    .filter_map(|(k, h)| Some((k.clone(), Node::merge(map.get(k)?, Some(h)))))
                    .collect();
                let mut added: Vec<(&String, &Value)> = map
                    .iter()
                    .filter(|(k, _)| !hints.iter().any(|(h, _)| h == *k))
                    .collect();
                let rank = |k: &str| KEY_ORDER.iter().position(|o| *o == k).unwrap_or(usize::MAX);
                added.sort_by(|(a, _), (b, _)| rank(a).cmp(&rank(b)).then(a.cmp(b)));
                entries.extend(
                    added
                        .into_iter()
                        .map(|(k, v)| (k.clone(), Node::merge(v, None))),
                );
                Node::Map(entries)
            }
            scalar => Node::Scalar(scalar.clone()),
        }
    }
}

impl Serialize for Node {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Node::Scalar(v) => v.serialize(serializer),
            Node::Seq(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Node::Map(entries) => {
                let mut map = serializer.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> de::Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a YAML or JSON value")
    }

    fn visit_unit<E>(self) -> Result<Node, E> {
        Ok(Node::Scalar(Value::Null))
    }
    fn visit_none<E>(self) -> Result<Node, E> {
        Ok(Node::Scalar(Value::Null))
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Node, E> {
        Ok(Node::Scalar(v.into()))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
        Ok(Node::Scalar(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Node, E> {
        Ok(Node::Scalar(v.into()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Node, E> {
        serde_json::Number::from_f64(v)
            .map(|n| Node::Scalar(Value::Number(n)))
            .ok_or_else(|| E::custom(format!("{v} is not a number JSON can hold")))
    }
    fn visit_str<E>(self, v: &str) -> Result<Node, E> {
        Ok(Node::Scalar(v.into()))
    }
    fn visit_string<E>(self, v: String) -> Result<Node, E> {
        Ok(Node::Scalar(v.into()))
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }
    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries: Vec<(String, Node)> = Vec::new();
        while let Some((Key(key), value)) = map.next_entry::<Key, Node>()? {
            // A repeated key: the last one wins, as Kubernetes reads it.
            entries.retain(|(k, _)| *k != key);
            entries.push((key, value));
        }
        Ok(Node::Map(entries))
    }
}

/// A map key as written (`y`, `80`), not as the value it would be.
struct Key(String);

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(KeyVisitor)
    }
}

struct KeyVisitor;

impl de::Visitor<'_> for KeyVisitor {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map key")
    }
    fn visit_str<E>(self, v: &str) -> Result<Key, E> {
        Ok(Key(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Key, E> {
        Ok(Key(v))
    }
    fn visit_bool<E>(self, v: bool) -> Result<Key, E> {
        Ok(Key(v.to_string()))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Key, E> {
        Ok(Key(v.to_string()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Key, E> {
        Ok(Key(v.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::{INIT_CONTAINER, PROXY_CONTAINER};

    const CONFIG_MAP: &str = concat!(
        "# The app's settings: this comment stays.\n",
        "apiVersion: v1\n",
        "kind: ConfigMap\n",
        "metadata:\n",
        "  name: settings   # and this one\n",
        "data:\n",
        "  y: n\n",
        "  script: |\n",
        "    echo hi\n",
    );

    fn pod_spec(indent: usize) -> String {
        [
            "containers:",
            "  - name: app",
            "    image: app:1   # a comment inside a workload is lost",
            "    ports:",
            "      - containerPort: 8080",
        ]
        .iter()
        .map(|line| format!("{}{line}\n", " ".repeat(indent)))
        .collect()
    }

    fn workload(kind: &str, api: &str, name: &str) -> String {
        let head = format!("apiVersion: {api}\nkind: {kind}\nmetadata:\n  name: {name}\n");
        match kind {
            "Pod" => format!("{head}spec:\n{}", pod_spec(2)),
            "CronJob" => format!(
                "{head}spec:\n  schedule: '* * * * *'\n  jobTemplate:\n    spec:\n      template:\n        spec:\n{}",
                pod_spec(10)
            ),
            _ => format!(
                "{head}  namespace: shop\nspec:\n  replicas: 2\n  template:\n    metadata:\n      labels:\n        app: {name}\n    spec:\n{}",
                pod_spec(6)
            ),
        }
    }

    fn all_kinds() -> Vec<(String, String)> {
        [
            ("Deployment", "apps/v1"),
            ("StatefulSet", "apps/v1"),
            ("DaemonSet", "apps/v1"),
            ("ReplicaSet", "apps/v1"),
            ("ReplicationController", "v1"),
            ("Job", "batch/v1"),
            ("CronJob", "batch/v1"),
            ("Pod", "v1"),
        ]
        .iter()
        .map(|(kind, api)| (kind.to_string(), workload(kind, api, &kind.to_lowercase())))
        .collect()
    }

    fn run(text: &str, action: Action) -> Rewritten {
        inject_documents(
            text,
            "in.yaml",
            Mode::Manual,
            &crate::config::test_config(),
            action,
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn yaml_docs(text: &str) -> Vec<Value> {
        serde_saphyr::from_multiple(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    fn pod_of(doc: &Value) -> &Value {
        match doc["kind"].as_str().unwrap() {
            "Pod" => doc,
            "CronJob" => &doc["spec"]["jobTemplate"]["spec"]["template"],
            _ => &doc["spec"]["template"],
        }
    }

    #[test]
    fn every_workload_kind_is_injected_and_the_rest_passes_through() {
        for (kind, doc) in all_kinds() {
            let text = format!("{CONFIG_MAP}---\n{doc}");
            let out = run(&text, Action::Inject);
            assert_eq!(out.format, Format::Yaml);
            assert!(out.text.starts_with(CONFIG_MAP), "{kind}:\n{}", out.text);
            let docs = yaml_docs(&out.text);
            assert_eq!(docs.len(), 2, "{kind}:\n{}", out.text);
            let pod = pod_of(&docs[1]);
            assert_eq!(
                pod["spec"]["containers"][0]["name"], PROXY_CONTAINER,
                "{kind}:\n{}",
                out.text
            );
            assert_eq!(pod["spec"]["initContainers"][0]["name"], INIT_CONTAINER);
            assert_eq!(out.report.objects.len(), 1, "{kind}");
            assert_eq!(out.report.objects[0].outcome, Outcome::Injected);
            assert_eq!(out.report.objects[0].kind, kind);
            assert_eq!(out.report.objects[0].document, 2);
        }
    }

    #[test]
    fn owners_are_set_for_the_workloads_the_proxy_names() {
        let out = run(&workload("Deployment", "apps/v1", "web"), Action::Inject);
        let docs = yaml_docs(&out.text);
        let env = &docs[0]["spec"]["template"]["spec"]["containers"][0]["env"];
        assert!(
            env.as_array()
                .unwrap()
                .iter()
                .any(|e| e["name"] == "BALLAST_PROXY_POD_OWNER" && e["value"] == "deployment/web"),
            "{env}"
        );
        let out = run(&workload("CronJob", "batch/v1", "nightly"), Action::Inject);
        assert!(
            !out.text.contains("BALLAST_PROXY_POD_OWNER"),
            "{}",
            out.text
        );
    }

    #[test]
    fn injection_is_idempotent_and_uninjection_restores_the_objects() {
        let mut text = String::from(CONFIG_MAP);
        for (_, doc) in all_kinds() {
            text.push_str("---\n");
            text.push_str(&doc);
        }
        let once = run(&text, Action::Inject);
        let twice = run(&once.text, Action::Inject);
        assert_eq!(twice.text, once.text, "inject twice == inject once");
        assert!(!twice.report.changed());
        assert!(twice
            .report
            .objects
            .iter()
            .all(|o| o.outcome == Outcome::AlreadyInjected));
        let back = run(&once.text, Action::Uninject);
        assert!(back
            .report
            .objects
            .iter()
            .all(|o| o.outcome == Outcome::Uninjected));
        assert_eq!(yaml_docs(&back.text), yaml_docs(&text));
        assert!(back.text.starts_with(CONFIG_MAP), "{}", back.text);
        // Uninjecting what is not injected changes no byte.
        let again = run(&text, Action::Uninject);
        assert_eq!(again.text, text);
        assert!(again
            .report
            .objects
            .iter()
            .all(|o| o.outcome == Outcome::NotInjected));
    }

    #[test]
    fn key_order_and_the_comments_around_a_changed_document_are_kept() {
        let text = format!(
            "# Leading comment\n{}---\n# About the web deployment\n{}# trailing comment\n...\n",
            CONFIG_MAP,
            workload("Deployment", "apps/v1", "web"),
        );
        let out = run(&text, Action::Inject);
        assert!(out.text.starts_with(&format!("# Leading comment\n{CONFIG_MAP}---\n# About the web deployment\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n  namespace: shop\nspec:\n  replicas: 2\n")), "{}", out.text);
        assert!(
            out.text.ends_with("# trailing comment\n...\n"),
            "{}",
            out.text
        );
        // The app container keeps its keys' order; the proxy's start with its name.
        assert!(out.text.contains("- name: app\n"), "{}", out.text);
        assert!(out.text.contains("- name: linkerd-proxy\n"), "{}", out.text);
    }

    #[test]
    fn lists_hosts_and_other_groups() {
        let list = format!(
            "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata: {{name: web}}\n- {}",
            workload("Deployment", "apps/v1", "web").replace('\n', "\n  ").trim_end()
        );
        let out = run(&list, Action::Inject);
        let docs = yaml_docs(&out.text);
        assert_eq!(docs[0]["items"][0]["kind"], "Service");
        assert_eq!(
            docs[0]["items"][1]["spec"]["template"]["spec"]["containers"][0]["name"],
            PROXY_CONTAINER
        );
        // A Deployment of another API group is not Kubernetes' own.
        let other = workload("Deployment", "example.com/v1", "web");
        let out = run(&other, Action::Inject);
        assert_eq!(out.text, other);
        assert!(out.report.objects.is_empty());
        let host = workload("DaemonSet", "apps/v1", "agent")
            .replace("    spec:\n", "    spec:\n      hostNetwork: true\n");
        let out = run(&host, Action::Inject);
        assert_eq!(out.text, host);
        assert_eq!(
            out.report.objects[0].to_string(),
            "daemonset \"agent\" in namespace \"shop\" skipped: it uses the host's network (hostNetwork: true)"
        );
    }

    #[test]
    fn numbers_keep_the_meaning_kubernetes_gives_them() {
        let pod = workload("Pod", "v1", "p").replace(
            "spec:\n",
            "spec:\n  volumes:\n  - name: s\n    secret: {secretName: s, defaultMode: 0755}\n  - name: t\n    secret: {secretName: t, defaultMode: 0o644, optional: yes}\n",
        );
        let out = run(&pod, Action::Inject);
        let docs = yaml_docs(&out.text);
        assert_eq!(
            docs[0]["spec"]["volumes"][0]["secret"]["defaultMode"], 0o755,
            "{}",
            out.text
        );
        assert_eq!(
            docs[0]["spec"]["volumes"][1]["secret"]["defaultMode"],
            0o644
        );
        assert_eq!(docs[0]["spec"]["volumes"][1]["secret"]["optional"], true);
    }

    #[test]
    fn conversion_between_yaml_and_json_keeps_every_document() {
        let yaml = format!(
            "{CONFIG_MAP}---\n{}",
            workload("Deployment", "apps/v1", "web")
        );
        let json = convert(&yaml, "in.yaml", Format::Json).unwrap();
        let values: Vec<Value> = serde_json::Deserializer::from_str(&json)
            .into_iter()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(values, yaml_docs(&yaml));
        assert!(
            json.starts_with("{\n  \"apiVersion\": \"v1\",\n  \"kind\": \"ConfigMap\""),
            "{json}"
        );
        let back = convert(&json, "in.json", Format::Yaml).unwrap();
        assert_eq!(yaml_docs(&back), yaml_docs(&yaml));
        assert_eq!(convert(&yaml, "in.yaml", Format::Yaml).unwrap(), yaml);
        let e = convert("a: [\n", "in.yaml", Format::Json).unwrap_err();
        assert!(e.to_string().starts_with("in.yaml: document 1: "), "{e}");
    }

    #[test]
    fn json_in_json_out() {
        let deployment: Value =
            serde_saphyr::from_str(&workload("Deployment", "apps/v1", "web")).unwrap();
        let service =
            "{\"apiVersion\": \"v1\", \"kind\": \"Service\", \"metadata\": {\"name\": \"web\"}}";
        let text = format!(
            "{service}\n{}\n",
            serde_json::to_string(&deployment).unwrap()
        );
        let out = run(&text, Action::Inject);
        assert_eq!(out.format, Format::Json);
        assert!(
            out.text.starts_with(&format!(
                "{service}\n{{\n  \"apiVersion\": \"apps/v1\",\n  \"kind\": \"Deployment\""
            )),
            "{}",
            out.text
        );
        let values: Vec<Value> = serde_json::Deserializer::from_str(&out.text)
            .into_iter()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            values[1]["spec"]["template"]["spec"]["containers"][0]["name"],
            PROXY_CONTAINER
        );
        let back = run(&out.text, Action::Uninject);
        let restored: Vec<Value> = serde_json::Deserializer::from_str(&back.text)
            .into_iter()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(restored[1], deployment);
    }

    #[test]
    fn malformed_documents_name_the_source_document_and_line() {
        let text = format!("{CONFIG_MAP}---\nkind: Pod\nspec: [\n");
        let e = inject_documents(
            &text,
            "in.yaml",
            Mode::Manual,
            &crate::config::test_config(),
            Action::Inject,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("in.yaml: document 2: line 12 column 7"),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1, "{e}");
        let e = inject_documents(
            "{\"a\": 1} {",
            "x.json",
            Mode::Manual,
            &crate::config::test_config(),
            Action::Inject,
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("x.json: document 2: "), "{e}");
        let bad = workload("Deployment", "apps/v1", "web").replace(
            "    metadata:\n      labels:\n",
            "    metadata:\n      annotations:\n        config.linkerd.io/proxy-cpu-limit: lots\n      labels:\n",
        );
        let e = inject_documents(
            &bad,
            "in.yaml",
            Mode::Manual,
            &crate::config::test_config(),
            Action::Inject,
        );
        let e = e.unwrap_err().to_string();
        assert!(e.contains("document 1: deployment \"web\": annotation config.linkerd.io/proxy-cpu-limit: \"lots\""), "{e}");
    }

    #[test]
    fn documents_without_objects_and_odd_separators_pass_through() {
        for text in [
            "",
            "# just a comment\n",
            "---\n---\n",
            "--- # a marker with a comment\nkind: Service\n",
            "a: 1\n...\n---\nb: 2\r\n",
            "plain scalar\n",
            "- a\n- b\n",
        ] {
            let out = inject_documents(
                text,
                "in.yaml",
                Mode::Manual,
                &crate::config::test_config(),
                Action::Inject,
            )
            .unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert_eq!(out.text, text);
        }
        // A marker with content on its line keeps a marker when rewritten.
        let doc = workload("Pod", "v1", "p");
        let out = run(&format!("kind: Service\n--- !!map\n{doc}"), Action::Inject);
        assert!(
            out.text.starts_with("kind: Service\n---\napiVersion: v1\n"),
            "{}",
            out.text
        );
        // A comment on the marker line stays.
        let out = run(
            &format!("kind: Service\n--- # the pod\n{doc}"),
            Action::Inject,
        );
        assert!(
            out.text
                .starts_with("kind: Service\n--- # the pod\napiVersion: v1\n"),
            "{}",
            out.text
        );
    }

    #[test]
    fn an_input_past_the_document_budget_is_refused_before_it_is_parsed() {
        let many = "kind: ConfigMap\nmetadata: {name: c}\n---\n".repeat(MAX_DOCUMENTS + 1);
        let e = inject_documents(
            &many,
            "big.yaml",
            Mode::Manual,
            &crate::config::test_config(),
            Action::Inject,
        )
        .unwrap_err();
        assert!(e.to_string().contains("more than 10000 documents"), "{e}");
        let fits = "kind: ConfigMap\nmetadata: {name: c}\n---\n".repeat(100);
        assert!(inject_documents(
            &fits,
            "ok.yaml",
            Mode::Manual,
            &crate::config::test_config(),
            Action::Inject
        )
        .is_ok());
    }
}
