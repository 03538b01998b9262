//! JSON values as block YAML by serde-saphyr (the YAML writer `inject`
//! uses too), deterministically: keys in Kubernetes' usual order
//! (`apiVersion`, `kind`, `metadata`, `name`, `namespace` first, then
//! alphabetical), sequences under a key indented as kubectl writes them,
//! long strings on one line, multi-line strings such as PEM bundles as
//! literal blocks. Strings that YAML 1.1 readers (kubectl's) would take for
//! another type (`on`, `yes`, `0755`, `1_000`) are quoted by the writer.

use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::{Map, Value};

/// Keys written first, in this order; the rest follow alphabetically.
const LEADING_KEYS: &[&str] = &["apiVersion", "kind", "metadata", "name", "namespace"];

/// One document, without the `---` separator, ending in a newline.
pub fn to_yaml(value: &Value) -> String {
    let mut options = serde_saphyr::SerializerOptions::default();
    options.compact_list_indent = false;
    // Long one-line strings (a container's arguments) stay on one line.
    options.folded_wrap_chars = 1 << 20;
    // A JSON value always has a YAML form; were the writer ever to refuse
    // one, JSON is YAML too and every reader of these files reads it.
    let mut text = serde_saphyr::to_string_with_options(&Ordered(value), options)
        .unwrap_or_else(|_| serde_json::to_string_pretty(value).unwrap_or_default());
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text
}

/// A value whose maps serialize in [`LEADING_KEYS`] order.
struct Ordered<'a>(&'a Value);

impl Serialize for Ordered<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Object(map) => {
                let mut out = serializer.serialize_map(Some(map.len()))?;
                for key in ordered_keys(map) {
                    out.serialize_entry(key, &Ordered(&map[key]))?;
                }
                out.end()
            }
            Value::Array(items) => {
                let mut out = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    out.serialize_element(&Ordered(item))?;
                }
                out.end()
            }
            scalar => scalar.serialize(serializer),
        }
    }
}

fn ordered_keys(map: &Map<String, Value>) -> Vec<&String> {
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort_by_key(|k| {
        (
            LEADING_KEYS
                .iter()
                .position(|l| l == k)
                .unwrap_or(LEADING_KEYS.len()),
            k.as_str(),
        )
    });
    keys
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn round_trip(v: &Value) {
        let text = to_yaml(v);
        let back: Value = serde_saphyr::from_str(&text)
            .unwrap_or_else(|e| panic!("does not parse ({e}):\n{text}"));
        assert_eq!(&back, v, "read back differs:\n{text}");
    }

    #[test]
    fn values_read_back_as_written() {
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        round_trip(&json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "x", "labels": {"app.kubernetes.io/name": "a", "linkerd.io/inject": "enabled"}},
            "data": {"ca-bundle.crt": pem, "two": format!("{pem}{pem}"), "no-newline": "a\nb", "trailing": "a\n\n"},
            "list": [1, -2, 3.5, true, null, "yes", "no", "on", "Off", "NULL", "~", "", " lead", "trail ", "0x10", "1e3", "08", "-", "--", "---", "-1", "100m", "64Mi", "1:20", "a:", "a:b", "--addr=0.0.0.0:8443", "1_000", "12h", "0b1", "0o7", "a: b", "a #b", "#c", "*x", "&y", "!t", "%p", "@at", "`b", "'q", "\"d", "[x]", "{y}", "x,y", "é", "tab\there", "nul\u{0}"],
            "nested": [[1, 2], [], {}, {"a": []}, [{"b": {"c": [{"d": 1}]}}]],
            "empty": {},
            "args": ["--addr=0.0.0.0:8443", "inject", "--tls-cert=/var/run/x/tls.crt"],
            "weird keys": {"a/b": 1, "": 2, "true": 3, "-x": 4, "k: v": 5},
        }));
        for scalar in [json!(null), json!(1), json!("x"), json!([]), json!({})] {
            round_trip(&scalar);
        }
    }

    #[test]
    fn kubernetes_order_and_blocks() {
        let text = to_yaml(&json!({
            "spec": {"b": 1, "a": 2},
            "metadata": {"namespace": "ns", "name": "x", "labels": {"k": "v"}},
            "kind": "Secret",
            "apiVersion": "v1",
            "data": {"pem": "line1\nline2\n"},
            "items": [{"name": "a", "value": "b"}],
        }));
        assert_eq!(
            text,
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: x\n  namespace: ns\n  labels:\n    k: v\n\
             data:\n  pem: |\n    line1\n    line2\nitems:\n  - name: a\n    value: b\nspec:\n  a: 2\n  b: 1\n"
        );
    }
}
