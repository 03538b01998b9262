//! From a manifest file's text to the index's resources: the objects
//! `ballast_manifests::documents` reads, decoded, with the problems found
//! on the way, each placed by document (and List item).
//!
//! Pure: no IO, no logging. The caller decides what a problem means for the
//! file (see [`super::manifests`]).

use ballast_manifests::documents::{bounded, describe, quote, Object, QUOTE_MAX, REASON_MAX};
pub use ballast_manifests::documents::{Place, Problem};
use ballast_store::resource::{Kind, ObjectKey, Resource};
use std::collections::BTreeMap;

/// A kind and a key: one object, wherever it is defined.
pub type ObjectId = (Kind, ObjectKey);

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

/// Parses a manifest file's text by the one manifest reader
/// ([`ballast_manifests::documents::read`]: documents, Lists, types) and
/// decodes each object the index uses (fields it does not read are
/// ignored).
pub fn parse(text: &str) -> Parsed {
    let read = ballast_manifests::documents::read(text);
    let mut parsed = Parsed {
        problems: read.syntax.into_iter().chain(read.problems).collect(),
        ..Parsed::default()
    };
    let mut first_seen: BTreeMap<ObjectId, Place> = BTreeMap::new();
    for object in read.objects {
        convert(object, &mut parsed, &mut first_seen);
    }
    parsed
}

/// One object, decoded by the resource layer.
fn convert(object: Object, parsed: &mut Parsed, first_seen: &mut BTreeMap<ObjectId, Place>) {
    let Object { place, fields } = object;
    let described = describe(&fields);
    match Resource::from_value(serde_json::Value::Object(fields)) {
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
            parsed.problems.push(Problem {
                place: Some(place),
                object: described,
                field: Some(bounded(&invalid.field, QUOTE_MAX)),
                reason: bounded(&invalid.reason, REASON_MAX),
            });
        }
    }
}

/// `Kind namespace/name`.
pub(crate) fn label(id: &ObjectId) -> String {
    quote(&format!("{} {}", id.0.as_str(), id.1))
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: shop\nstatus:\n  phase: Running\n  podIP: 10.0.0.1\n";

    fn messages(parsed: &Parsed) -> Vec<String> {
        parsed.problems.iter().map(|p| p.to_string()).collect()
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
