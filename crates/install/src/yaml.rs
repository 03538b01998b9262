//! JSON values as block YAML, deterministically: keys in Kubernetes' usual
//! order (`apiVersion`, `kind`, `metadata`, `name`, `namespace` first, then
//! alphabetical), strings plain when YAML reads them back as the same string,
//! double-quoted (JSON escapes, which YAML shares) otherwise, and multi-line
//! strings such as PEM bundles as literal blocks.

use serde_json::{Map, Value};

/// Keys written first, in this order; the rest follow alphabetically.
const LEADING_KEYS: &[&str] = &["apiVersion", "kind", "metadata", "name", "namespace"];

/// One document, without the `---` separator, ending in a newline.
pub fn to_yaml(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Object(map) if !map.is_empty() => write_map(&mut out, map, 0),
        Value::Array(items) if !items.is_empty() => write_seq(&mut out, items, 0),
        scalar => {
            out.push_str(&scalar_text(scalar, 0));
            out.push('\n');
        }
    }
    out
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

fn indent(out: &mut String, level: usize) {
    out.extend(std::iter::repeat_n(' ', level));
}

fn write_map(out: &mut String, map: &Map<String, Value>, level: usize) {
    for (i, key) in ordered_keys(map).into_iter().enumerate() {
        // The first key of a map inside a sequence item follows its `- `.
        if i > 0 || !out.ends_with("- ") {
            indent(out, level);
        }
        out.push_str(&string_scalar(key));
        out.push(':');
        write_value_after_key(out, &map[key], level);
    }
}

fn write_value_after_key(out: &mut String, value: &Value, level: usize) {
    match value {
        Value::Object(m) if !m.is_empty() => {
            out.push('\n');
            write_map(out, m, level + 2);
        }
        // Sequences under a key are indented by two, as kubectl writes them.
        Value::Array(items) if !items.is_empty() => {
            out.push('\n');
            write_seq(out, items, level + 2);
        }
        scalar => {
            out.push(' ');
            out.push_str(&scalar_text(scalar, level + 2));
            out.push('\n');
        }
    }
}

fn write_seq(out: &mut String, items: &[Value], level: usize) {
    for item in items {
        indent(out, level);
        out.push_str("- ");
        match item {
            Value::Object(m) if !m.is_empty() => write_map(out, m, level + 2),
            Value::Array(inner) if !inner.is_empty() => {
                out.push('\n');
                write_seq(out, inner, level + 2);
            }
            scalar => {
                out.push_str(&scalar_text(scalar, level + 2));
                out.push('\n');
            }
        }
    }
}

/// A scalar (or an empty collection) in flow form; multi-line strings as a
/// literal block indented to `level`.
fn scalar_text(value: &Value, level: usize) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => match literal_block(s, level) {
            Some(block) => block,
            None => string_scalar(s),
        },
        Value::Array(_) => "[]".into(),
        Value::Object(_) => "{}".into(),
    }
}

/// `|` and the lines, when the string is lines of printable text ending in
/// exactly one newline (what a PEM bundle is); otherwise none.
fn literal_block(s: &str, level: usize) -> Option<String> {
    let body = s.strip_suffix('\n')?;
    if body.is_empty()
        || body.ends_with('\n')
        || body.starts_with(' ')
        || body
            .chars()
            .any(|c| (c.is_control() && c != '\n') || c == '\u{feff}')
        || body.lines().any(|l| l.is_empty() || l.ends_with(' '))
    {
        return None;
    }
    let mut out = String::from("|");
    for line in body.lines() {
        out.push('\n');
        indent(&mut out, level);
        out.push_str(line);
    }
    Some(out)
}

/// The string plain when that reads back as this string, else JSON-quoted.
fn string_scalar(s: &str) -> String {
    if is_plain_safe(s) {
        s.to_string()
    } else {
        serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
    }
}

/// Conservative: only strings of characters that never start or end a YAML
/// construct (`:` only inside, `-` first only before another character),
/// that do not read as another type (numbers, booleans, null in YAML 1.1 or
/// 1.2 spelling), and that start with a letter, `/`, `_`, `-` or, with a
/// letter that makes them no number (`100m`, `64Mi`), a digit.
fn is_plain_safe(s: &str) -> bool {
    let Some(first) = s.chars().next() else {
        return false;
    };
    let starts_well = first.is_ascii_alphabetic()
        || first == '/'
        || first == '_'
        || (first == '-'
            && !s.starts_with("---")
            && s.trim_start_matches('-')
                .starts_with(|c: char| c.is_ascii_alphabetic()))
        || (first.is_ascii_digit()
            && s.chars()
                .any(|c| c.is_ascii_alphabetic() && !"eExXoObB".contains(c)));
    if !starts_well || s.ends_with(':') {
        return false;
    }
    if !s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_./=+@():".contains(c))
    {
        return false;
    }
    const AMBIGUOUS: &[&str] = &[
        "true", "false", "yes", "no", "on", "off", "y", "n", "null", "nan", "inf",
    ];
    !AMBIGUOUS.contains(&s.to_ascii_lowercase().as_str())
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
