//! From a manifest file's text to Kubernetes objects: YAML documents (or
//! one JSON value), `List`s expanded, and the problems found on the way,
//! each placed by document (and List item). The one reader of manifest
//! text for the controller's manifests source, `ballast check --manifests`
//! and the identity controller's token Secrets; what an object means is
//! each caller's.
//!
//! Pure: no IO, no logging.

use serde_json::{Map, Value};
use std::fmt;

/// Longest kind, name or namespace quoted in a message (a user's file may
/// hold anything there).
pub const QUOTE_MAX: usize = 96;
/// Longest reason quoted in a message.
pub const REASON_MAX: usize = 200;

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
        let mut line = String::new();
        let mut sep = "";
        if let Some(place) = &self.place {
            line.push_str(&place.to_string());
            sep = " ";
        }
        if let Some(object) = &self.object {
            line.push_str(&format!("{sep}({object})"));
            sep = " ";
        }
        if !sep.is_empty() {
            line.push_str(": ");
        }
        if let Some(field) = &self.field {
            line.push_str(&format!("field {field}: "));
        }
        line.push_str(&self.reason);
        if line.contains(char::is_control) {
            line = line
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
        }
        f.write_str(&line)
    }
}

/// One object of a file: a mapping with a non-empty `apiVersion` and
/// `kind`, and where it was.
#[derive(Debug)]
pub struct Object {
    pub place: Place,
    pub fields: Map<String, Value>,
}

/// What a file's text holds.
#[derive(Debug, Default)]
pub struct Read {
    /// The objects, in file order (List items in their order).
    pub objects: Vec<Object>,
    /// Documents or items that are not objects, or lack a type.
    pub problems: Vec<Problem>,
    /// The text is not YAML or JSON (or over the parser's budget): nothing
    /// else was read.
    pub syntax: Option<Problem>,
}

/// Reads a manifest file's text: YAML documents separated by `---`, or one
/// JSON value (JSON is read as YAML, so both share the YAML budget:
/// `serde-saphyr`'s defaults, at most 1024 documents and 250 000 nodes per
/// file). A leading byte-order mark is skipped.
///
/// Each document is a Kubernetes object as `kubectl get -o yaml` prints it,
/// or a `List` (or a typed list such as `PodList`) whose `items` are
/// objects. Items inherit nothing from the list, except that items of a
/// typed list that lack `apiVersion` or `kind` take the list's (as the API
/// server omits them there). Empty documents and empty items are skipped.
pub fn read(text: &str) -> Read {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut read = Read::default();
    let options = serde_saphyr::options! { with_snippet: false };
    let documents: Vec<serde_saphyr::Spanned<Value>> =
        match serde_saphyr::from_multiple_with_options(text, options) {
            Ok(documents) => documents,
            Err(e) => {
                read.syntax = Some(syntax_problem(text, &e));
                return read;
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
        expand(document.value, place, &mut read);
    }
    read
}

fn syntax_problem(text: &str, e: &serde_saphyr::Error) -> Problem {
    // The parser's own budget text names its internal types
    // (`Documents { documents: 1025 }`): say it in the manifest's words.
    let reason = if matches!(e, serde_saphyr::Error::Budget { .. }) {
        "too large: a file may hold at most 1024 documents and 250000 YAML nodes; \
         split it into smaller files"
            .to_string()
    } else {
        bounded(&e.to_string(), REASON_MAX + 120)
    };
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
fn expand(value: Value, place: Place, read: &mut Read) {
    let mut map = match value {
        Value::Null => return,
        Value::Object(map) => map,
        other => {
            read.problems.push(not_an_object(&other, place, None));
            return;
        }
    };
    let list_kind = str_field(&map, "kind")
        .filter(|k| k.ends_with("List"))
        .map(str::to_string);
    let Some(list_kind) = list_kind.filter(|_| map.contains_key("items")) else {
        typed(map, place, read);
        return;
    };
    let items = match map.remove("items") {
        Some(Value::Array(items)) => items,
        Some(Value::Null) | None => Vec::new(),
        Some(_) => {
            read.problems.push(Problem {
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
                read.problems
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
        typed(item, place, read);
    }
}

/// One object, kept if it names its type.
fn typed(fields: Map<String, Value>, place: Place, read: &mut Read) {
    for field in ["apiVersion", "kind"] {
        let reason = match fields.get(field) {
            Some(Value::String(s)) if !s.is_empty() => continue,
            Some(_) => "must be a non-empty string",
            None => "required but missing (every Kubernetes object names its apiVersion and kind)",
        };
        read.problems.push(Problem {
            place: Some(place),
            object: describe(&fields),
            field: Some(field.into()),
            reason: reason.into(),
        });
        return;
    }
    read.objects.push(Object { place, fields });
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

/// `Kind namespace/name` as far as the object tells, bounded; `None` when
/// it names no kind.
pub fn describe(map: &Map<String, Value>) -> Option<String> {
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

/// A value from a file, at most [`QUOTE_MAX`] bytes and with control
/// characters replaced, so it cannot break a log line.
pub fn quote(s: &str) -> String {
    let s: String = s
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    bounded(&s, QUOTE_MAX)
}

/// `s` cut to at most `max` bytes on a character boundary, the cut marked.
pub fn bounded(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
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

    fn messages(read: &Read) -> Vec<String> {
        read.syntax
            .iter()
            .chain(&read.problems)
            .map(|p| p.to_string())
            .collect()
    }

    fn names(read: &Read) -> Vec<String> {
        read.objects
            .iter()
            .map(|o| describe(&o.fields).unwrap_or_default())
            .collect()
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
    fn objects_lists_and_typed_list_items() {
        let text = "\u{feff}apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: shop}\n---\n\n---\n\
             apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata:\n    name: s\n- null\n\
             ---\napiVersion: v1\nkind: PodList\nmetadata: {}\nitems:\n- metadata:\n    name: p2\n";
        let read = read(text);
        assert_eq!(messages(&read), Vec::<String>::new());
        assert_eq!(
            names(&read),
            ["Pod shop/web", "Service default/s", "Pod default/p2"]
        );
        let places: Vec<String> = read.objects.iter().map(|o| o.place.to_string()).collect();
        assert_eq!(
            places,
            [
                "document 1 at line 1",
                "document 3 at line 7, items[0]",
                "document 4 at line 16, items[0]"
            ]
        );
    }

    #[test]
    fn problems_name_document_item_object_and_field() {
        let cases: &[(&str, &str)] = &[
            (
                "a: 1\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: web\n",
                "document 1 at line 1: field apiVersion: required but missing",
            ),
            (
                "kind: List\napiVersion: v1\nitems:\n- {apiVersion: v1, kind: Pod, metadata: {name: a}}\n- {kind: Pod}\n",
                "document 1 at line 1, items[1] (Pod): field apiVersion: required but missing",
            ),
            (
                "kind: List\napiVersion: v1\nitems: 3\n",
                "document 1 at line 1 (List): field items: must be a list of objects",
            ),
            ("just a string\n", "document 1 at line 1: expected a Kubernetes object"),
            ("a: 1\n---\nb: [1\n", "document 2: not valid YAML or JSON: "),
            ("{\"apiVersion\": \"v1\", \"kind\": 3}", "document 1 at line 1: field kind: must be a non-empty string"),
        ];
        for (text, expect) in cases {
            let got = messages(&read(text));
            assert!(
                got.first().is_some_and(|m| m.starts_with(expect)),
                "{text:?}: got {got:?}, expected a message starting {expect:?}"
            );
        }
        // A broken stream yields nothing else.
        let broken = read("apiVersion: v1\nkind: Pod\n---\nb: [1\n");
        assert!(broken.syntax.is_some() && broken.objects.is_empty());
    }

    #[test]
    fn documents_are_counted_with_cr_line_ends_too() {
        let doc = "apiVersion: v1\rkind: Pod\rmetadata: {name: a}\r";
        for text in [format!("{doc}---\r{doc}"), format!("{doc}---\r\n{doc}")] {
            let read = read(&text);
            assert_eq!(messages(&read), Vec::<String>::new(), "{text:?}");
            assert_eq!(read.objects.len(), 2, "{text:?}");
            assert_eq!(read.objects[1].place.document, 2, "{text:?}");
            assert_eq!(read.objects[1].place.line, Some(5), "{text:?}");
        }
        let lines: Vec<&str> = yaml_lines("a\r\nb\rc\n\nd").collect();
        assert_eq!(lines, ["a", "b", "c", "", "d"]);
        assert_eq!(yaml_lines("a\n").collect::<Vec<_>>(), ["a"]);
        assert_eq!(yaml_lines("").count(), 0);
    }

    #[test]
    fn json_and_the_parser_budget() {
        let json = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"j"}}"#;
        assert_eq!(read(json).objects.len(), 1);
        assert!(read("").objects.is_empty());
        let many = "a: 1\n---\n".repeat(1100);
        let got = messages(&read(&many));
        assert!(got[0].contains("split it into smaller files"), "{got:?}");
        assert!(
            !got[0].contains("Documents {"),
            "the parser's types stay inside: {got:?}"
        );
    }

    #[test]
    fn quoted_values_are_bounded_and_one_line() {
        assert_eq!(quote("a\nb"), "a?b");
        let long = "é".repeat(100);
        let q = quote(&long);
        assert!(
            q.len() <= QUOTE_MAX + '…'.len_utf8() && q.ends_with('…'),
            "{q}"
        );
        let problem = Problem {
            place: None,
            object: None,
            field: Some("a\nb".into()),
            reason: "x\ry".into(),
        };
        assert_eq!(problem.to_string(), "field a b: x y");
    }
}
