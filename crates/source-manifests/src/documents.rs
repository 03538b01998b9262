//! From a manifest file's text to resources: documents, Lists, and the
//! problems found on the way, each placed by document (and List item).
//!
//! Pure: no IO, no logging. The caller decides what a problem means for the
//! file (see [`super::manifests`]).

use ballast_store::resource::{truncate, Kind, ObjectKey, Resource};
use serde_json::{Map, Value};
use std::{collections::BTreeMap, fmt};

/// Longest kind, name or namespace quoted in a message (a user's file may
/// hold anything there).
const QUOTE_MAX: usize = 96;
/// Longest reason quoted in a message.
const REASON_MAX: usize = 200;

/// A kind and a key: one object, wherever it is defined.
pub type ObjectId = (Kind, ObjectKey);

/// Where in a file something is: its YAML document and, inside a List, its
/// item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    /// 1-based, counting empty documents too, as an editor would.
    pub document: usize,
    /// Line of the document's first node, when known.
    pub line: Option<u64>,
    /// 0-based index in the List's `items`.
    pub item: Option<usize>,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "document {}", self.document)?;
        if let Some(line) = self.line {
            write!(f, " at line {line}")?;
        }
        if let Some(item) = self.item {
            write!(f, ", items[{item}]")?;
        }
        Ok(())
    }
}

/// One thing wrong in a file, small and printable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// `None` when the problem is not in one document (e.g. the YAML stream
    /// itself is broken before any document could be placed).
    pub place: Option<Place>,
    /// `Service default/web`, or just `Service` when the name is missing.
    pub object: Option<String>,
    /// Dotted path of the offending field.
    pub field: Option<String>,
    pub reason: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // One line whatever the file held: a key or value quoted from it may
        // carry line breaks or other control characters.
        let line = self.unsanitised().to_string();
        if !line.contains(char::is_control) {
            return f.write_str(&line);
        }
        let line: String = line
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        f.write_str(&line)
    }
}

impl Problem {
    fn unsanitised(&self) -> impl fmt::Display + '_ {
        struct Raw<'a>(&'a Problem);
        impl fmt::Display for Raw<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.write_raw(f)
            }
        }
        Raw(self)
    }

    fn write_raw(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sep = "";
        if let Some(place) = &self.place {
            write!(f, "{place}")?;
            sep = " ";
        }
        if let Some(object) = &self.object {
            write!(f, "{sep}({object})")?;
            sep = " ";
        }
        if !sep.is_empty() {
            f.write_str(": ")?;
        }
        if let Some(field) = &self.field {
            write!(f, "field {field}: ")?;
        }
        f.write_str(&self.reason)
    }
}

/// What a file holds.
#[derive(Debug, Default)]
pub struct Parsed {
    /// The objects the index uses, by kind and key. When one file defines an
    /// object twice the first definition is kept and the second is reported
    /// in `duplicates`.
    pub objects: BTreeMap<ObjectId, Resource>,
    pub duplicates: Vec<Duplicate>,
    pub problems: Vec<Problem>,
    /// Objects of kinds the index does not use (skipped quietly).
    pub skipped: usize,
}

/// An object defined twice in one file.
#[derive(Debug)]
pub struct Duplicate {
    pub id: ObjectId,
    pub first: Place,
    pub again: Place,
}

/// Parses a manifest file's text: YAML documents separated by `---`, or one
/// JSON value (JSON is read as YAML, so both share the YAML budget:
/// `serde-saphyr`'s defaults, at most 1024 documents and 250 000 nodes per
/// file).
///
/// Each document is a Kubernetes object as `kubectl get -o yaml` prints it
/// (fields the index does not read are ignored), or a `List` (or a typed list
/// such as `PodList`) whose `items` are objects. Items inherit nothing from
/// the list, except that items of a typed list that lack `apiVersion` or
/// `kind` take the list's (as the API server omits them there). Empty
/// documents are skipped.
pub fn parse(text: &str) -> Parsed {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut parsed = Parsed::default();
    let mut first_seen: BTreeMap<ObjectId, Place> = BTreeMap::new();
    let options = serde_saphyr::options! { with_snippet: false };
    let documents: Vec<serde_saphyr::Spanned<Value>> =
        match serde_saphyr::from_multiple_with_options(text, options) {
            Ok(documents) => documents,
            Err(e) => {
                parsed.problems.push(syntax_problem(text, &e));
                return parsed;
            }
        };
    let markers = Markers::new(text);
    for document in documents {
        let line = document.referenced.line();
        let place = Place {
            document: markers.document_at(line),
            line: (line > 0).then_some(line),
            item: None,
        };
        expand(document.value, place, &mut parsed, &mut first_seen);
    }
    parsed
}

fn syntax_problem(text: &str, e: &serde_saphyr::Error) -> Problem {
    // The parser's own budget text names its internal types
    // (`Documents { documents: 1025 }`): say it in the manifest's words.
    let mut reason = if matches!(e, serde_saphyr::Error::Budget { .. }) {
        "too large: a file may hold at most 1024 documents and 250000 YAML nodes; \
         split it into smaller files"
            .to_string()
    } else {
        e.to_string()
    };
    truncate(&mut reason, REASON_MAX + 120);
    let place = e
        .location()
        .map(|l| l.line())
        .filter(|&line| line > 0)
        .map(|line| Place {
            document: Markers::new(text).document_at(line),
            line: None,
            item: None,
        });
    Problem {
        place,
        object: None,
        field: None,
        reason: format!("not valid YAML or JSON: {reason}"),
    }
}

/// One top-level document: an object, or a list of them.
fn expand(
    value: Value,
    place: Place,
    parsed: &mut Parsed,
    first_seen: &mut BTreeMap<ObjectId, Place>,
) {
    let mut map = match value {
        Value::Null => return,
        Value::Object(map) => map,
        other => {
            parsed.problems.push(not_an_object(&other, place, None));
            return;
        }
    };
    let list_kind = str_field(&map, "kind")
        .filter(|k| k.ends_with("List"))
        .map(str::to_string);
    let Some(list_kind) = list_kind.filter(|_| map.contains_key("items")) else {
        convert(map, place, parsed, first_seen);
        return;
    };
    let items = match map.remove("items") {
        Some(Value::Array(items)) => items,
        Some(Value::Null) | None => Vec::new(),
        Some(_) => {
            parsed.problems.push(Problem {
                place: Some(place),
                object: Some(quote(&list_kind)),
                field: Some("items".into()),
                reason: "must be a list of objects".into(),
            });
            return;
        }
    };
    // A typed list (PodList) names its items' type; a plain List does not.
    let item_type = match list_kind.strip_suffix("List") {
        Some(kind) if !kind.is_empty() => str_field(&map, "apiVersion")
            .map(|api_version| (api_version.to_string(), kind.to_string())),
        _ => None,
    };
    for (i, item) in items.into_iter().enumerate() {
        let place = Place {
            item: Some(i),
            ..place
        };
        let mut item = match item {
            Value::Object(item) => item,
            Value::Null => continue,
            other => {
                parsed
                    .problems
                    .push(not_an_object(&other, place, Some(&list_kind)));
                continue;
            }
        };
        if let Some((api_version, kind)) = &item_type {
            item.entry("apiVersion")
                .or_insert_with(|| Value::String(api_version.clone()));
            item.entry("kind")
                .or_insert_with(|| Value::String(kind.clone()));
        }
        convert(item, place, parsed, first_seen);
    }
}

/// One object: checked for a type, then decoded by the resource layer.
fn convert(
    map: Map<String, Value>,
    place: Place,
    parsed: &mut Parsed,
    first_seen: &mut BTreeMap<ObjectId, Place>,
) {
    let object = describe(&map);
    for field in ["apiVersion", "kind"] {
        match map.get(field) {
            Some(Value::String(s)) if !s.is_empty() => {}
            Some(_) => {
                parsed.problems.push(Problem {
                    place: Some(place),
                    object,
                    field: Some(field.into()),
                    reason: "must be a non-empty string".into(),
                });
                return;
            }
            None => {
                parsed.problems.push(Problem {
                    place: Some(place),
                    object,
                    field: Some(field.into()),
                    reason: "required but missing (every Kubernetes object names its apiVersion and kind)"
                        .into(),
                });
                return;
            }
        }
    }
    match Resource::from_value(Value::Object(map)) {
        Ok(Some(resource)) => {
            let id = (resource.kind(), resource.key().clone());
            match first_seen.get(&id) {
                Some(first) => parsed.duplicates.push(Duplicate {
                    id,
                    first: *first,
                    again: place,
                }),
                None => {
                    first_seen.insert(id.clone(), place);
                    parsed.objects.insert(id, resource);
                }
            }
        }
        Ok(None) => parsed.skipped += 1,
        Err(invalid) => {
            let mut reason = invalid.reason;
            truncate(&mut reason, REASON_MAX);
            let mut field = invalid.field;
            truncate(&mut field, QUOTE_MAX);
            parsed.problems.push(Problem {
                place: Some(place),
                object,
                field: Some(field),
                reason,
            });
        }
    }
}

fn not_an_object(value: &Value, place: Place, list: Option<&str>) -> Problem {
    let found = match value {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    };
    Problem {
        place: Some(place),
        object: list.map(quote),
        field: None,
        reason: format!(
            "expected a Kubernetes object (a mapping with apiVersion, kind and metadata), found {found}"
        ),
    }
}

fn str_field<'a>(map: &'a Map<String, Value>, field: &str) -> Option<&'a str> {
    map.get(field).and_then(Value::as_str)
}

/// `Kind namespace/name` as far as the object tells, bounded.
fn describe(map: &Map<String, Value>) -> Option<String> {
    let kind = str_field(map, "kind").filter(|k| !k.is_empty())?;
    let meta = map.get("metadata");
    let name = meta
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty());
    let namespace = meta
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .unwrap_or("default");
    Some(match name {
        Some(name) => format!("{} {}", quote(kind), quote(&format!("{namespace}/{name}"))),
        None => quote(kind),
    })
}

/// A value from the file, bounded and with control characters replaced so
/// it cannot break a log line.
fn quote(s: &str) -> String {
    let mut s: String = s
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    truncate(&mut s, QUOTE_MAX);
    s
}

/// `Kind namespace/name`.
pub(crate) fn label(id: &ObjectId) -> String {
    quote(&format!("{} {}", id.0.as_str(), id.1))
}

/// The document-start markers (`---` at column 0) of a YAML stream, to turn
/// a line into a document number that counts empty documents too.
struct Markers {
    lines: Vec<u64>,
    /// The stream starts with a marker (nothing but comments, blank lines or
    /// directives before it), so the first marker opens document 1.
    leading: bool,
}

impl Markers {
    fn new(text: &str) -> Self {
        let mut lines = Vec::new();
        let mut content_before_first = false;
        for (i, line) in yaml_lines(text).enumerate() {
            let is_marker = line
                .strip_prefix("---")
                .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t']));
            if is_marker {
                lines.push(i as u64 + 1);
            } else if lines.is_empty() {
                let t = line.trim_start();
                if !(t.is_empty() || t.starts_with('#') || line.starts_with('%')) {
                    content_before_first = true;
                }
            }
        }
        Self {
            lines,
            leading: !content_before_first,
        }
    }

    /// The 1-based document holding `line` (1-based).
    fn document_at(&self, line: u64) -> usize {
        let before = self.lines.partition_point(|&m| m <= line);
        if self.leading {
            before.max(1)
        } else {
            before + 1
        }
    }
}

/// The lines of a YAML stream, as its parser numbers them: a line ends at
/// LF, CRLF or a lone CR.
fn yaml_lines(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = Some(text);
    std::iter::from_fn(move || {
        let t = rest.filter(|t| !t.is_empty())?;
        match t.find(['\n', '\r']) {
            Some(end) => {
                let next = if t[end..].starts_with("\r\n") {
                    end + 2
                } else {
                    end + 1
                };
                rest = Some(&t[next..]);
                Some(&t[..end])
            }
            None => {
                rest = None;
                Some(t)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: shop\nstatus:\n  phase: Running\n  podIP: 10.0.0.1\n";

    fn messages(parsed: &Parsed) -> Vec<String> {
        parsed.problems.iter().map(|p| p.to_string()).collect()
    }

    #[test]
    fn document_numbers_count_empty_documents() {
        let cases: &[(&str, &[(u64, usize)])] = &[
            ("a: 1\n", &[(1, 1)]),
            ("---\na: 1\n", &[(2, 1)]),
            ("# c\n---\na: 1\n---\nb: 1\n", &[(3, 1), (5, 2)]),
            ("a: 1\n---\nb: 1\n", &[(1, 1), (3, 2)]),
            ("---\n---\n# only a comment\n---\nb: 1\n", &[(5, 3)]),
            ("--- {a: 1}\n--- {b: 1}\n", &[(1, 1), (2, 2)]),
            ("%YAML 1.2\n---\na: 1\n", &[(3, 1)]),
        ];
        for (text, expect) in cases {
            let markers = Markers::new(text);
            for &(line, doc) in *expect {
                assert_eq!(markers.document_at(line), doc, "{text:?} line {line}");
            }
        }
    }

    #[test]
    fn objects_lists_and_unknown_kinds() {
        let text = format!(
            "{POD}---\n\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n---\n\
             apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata:\n    name: s\n\
             ---\napiVersion: v1\nkind: PodList\nmetadata: {{}}\nitems:\n- metadata:\n    name: p2\n"
        );
        let parsed = parse(&text);
        assert_eq!(messages(&parsed), Vec::<String>::new());
        assert_eq!(parsed.skipped, 1);
        let ids: Vec<String> = parsed.objects.keys().map(label).collect();
        assert_eq!(ids, ["Pod default/p2", "Pod shop/web", "Service default/s"]);
    }

    #[test]
    fn problems_name_document_item_object_and_field() {
        let cases: &[(&str, &str)] = &[
            (
                "apiVersion: v1\nkind: Pod\nmetadata:\n  namespace: x\n",
                "document 1 at line 1 (Pod): field metadata.name: required but missing",
            ),
            (
                "a: 1\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  ports:\n  - port: 70000\n",
                "document 1 at line 1: field apiVersion: required but missing",
            ),
            (
                "kind: List\napiVersion: v1\nitems:\n- {apiVersion: v1, kind: Pod, metadata: {name: a}}\n- {apiVersion: v1, kind: Pod}\n",
                "document 1 at line 1, items[1] (Pod): field metadata.name: required but missing",
            ),
            ("just a string\n", "document 1 at line 1: expected a Kubernetes object"),
            ("a: 1\n---\nb: [1\n", "document 2: not valid YAML or JSON: "),
            ("{\"apiVersion\": \"v1\", \"kind\": 3}", "document 1 at line 1: field kind: must be a non-empty string"),
        ];
        for (text, expect) in cases {
            let parsed = parse(text);
            let got = messages(&parsed);
            assert!(
                got.first().is_some_and(|m| m.starts_with(expect)),
                "{text:?}: got {got:?}, expected a message starting {expect:?}"
            );
        }
    }

    #[test]
    fn invalid_service_port_names_the_field() {
        let text = format!(
            "{POD}---\napiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  ports:\n  - port: 70000\n"
        );
        let parsed = parse(&text);
        let got = messages(&parsed);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            got[0].starts_with(
                "document 2 at line 10 (Service default/web): field spec.ports[0].port"
            ),
            "{got:?}"
        );
    }

    #[test]
    fn duplicates_in_one_file_keep_the_first() {
        let text = format!("{POD}---\n{}", POD.replace("10.0.0.1", "10.0.0.2"));
        let parsed = parse(&text);
        assert_eq!(parsed.objects.len(), 1);
        assert_eq!(parsed.duplicates.len(), 1);
        assert_eq!(parsed.duplicates[0].first.document, 1);
        assert_eq!(parsed.duplicates[0].again.document, 2);
        let Some(Resource::Pod(pod)) = parsed.objects.values().next() else {
            panic!("expected the pod");
        };
        assert_eq!(pod.ips, ["10.0.0.1".parse::<std::net::IpAddr>().unwrap()]);
    }

    #[test]
    fn documents_are_counted_with_cr_line_ends_too() {
        let doc = "apiVersion: v1\rkind: Pod\rmetadata: {name: a}\r";
        for text in [format!("{doc}---\r{doc}"), format!("{doc}---\r\n{doc}")] {
            let parsed = parse(&text);
            assert_eq!(messages(&parsed), Vec::<String>::new(), "{text:?}");
            assert_eq!(parsed.duplicates.len(), 1, "{text:?}");
            assert_eq!(parsed.duplicates[0].again.document, 2, "{text:?}");
            assert_eq!(parsed.duplicates[0].again.line, Some(5), "{text:?}");
        }
        let lines: Vec<&str> = yaml_lines("a\r\nb\rc\n\nd").collect();
        assert_eq!(lines, ["a", "b", "c", "", "d"]);
        assert_eq!(yaml_lines("a\n").collect::<Vec<_>>(), ["a"]);
        assert_eq!(yaml_lines("").count(), 0);
    }

    #[test]
    fn json_object_and_budget() {
        let json = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"j"},"status":{"podIP":"10.0.0.9"}}"#;
        assert_eq!(parse(json).objects.len(), 1);
        assert!(parse("").objects.is_empty());
        let many = "a: 1\n---\n".repeat(1100);
        let got = messages(&parse(&many));
        assert!(got[0].contains("split it into smaller files"), "{got:?}");
        assert!(
            !got[0].contains("Documents {"),
            "the parser's types stay inside: {got:?}"
        );
    }

    #[test]
    fn control_characters_do_not_reach_messages() {
        let parsed = parse("apiVersion: v1\nkind: \"Pod\\nX\"\nmetadata: {name: a}\n");
        // An unknown kind: skipped quietly.
        assert_eq!(parsed.skipped, 1);
        let parsed = parse("apiVersion: v1\nkind: Service\nmetadata: {name: \"a\\nb\"}\nspec: {ports: [{port: 0}]}\n");
        let got = messages(&parsed);
        assert!(got[0].contains("(Service default/a?b)"), "{got:?}");
    }
}
