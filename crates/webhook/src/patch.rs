//! JSON Patch (RFC 6902) between two documents: [`diff`] gives the `add`,
//! `remove` and `replace` operations that turn one into the other, with
//! paths as RFC 6901 pointers (`~` as `~0`, `/` as `~1`); [`apply`] applies
//! those operations (the API server's side, for tests and checks).
//!
//! Arrays are diffed around their common prefix and suffix, so a container
//! appended or an init container prepended is one `add`, not a rewrite of
//! every element after it.

use serde_json::{json, Map, Value};

/// One operation.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Add { path: String, value: Value },
    Remove { path: String },
    Replace { path: String, value: Value },
}

impl Op {
    pub fn to_json(&self) -> Value {
        match self {
            Op::Add { path, value } => json!({"op": "add", "path": path, "value": value}),
            Op::Remove { path } => json!({"op": "remove", "path": path}),
            Op::Replace { path, value } => json!({"op": "replace", "path": path, "value": value}),
        }
    }
}

/// The operations list as the JSON array a JSONPatch response carries.
pub fn to_json(ops: &[Op]) -> Value {
    Value::Array(ops.iter().map(Op::to_json).collect())
}

/// A key as one RFC 6901 reference token.
pub fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// The operations that turn `from` into `to`, applied in order.
pub fn diff(from: &Value, to: &Value) -> Vec<Op> {
    let mut ops = Vec::new();
    diff_at(&mut String::new(), from, to, &mut ops);
    ops
}

fn diff_at(path: &mut String, from: &Value, to: &Value, ops: &mut Vec<Op>) {
    match (from, to) {
        (Value::Object(a), Value::Object(b)) => diff_maps(path, a, b, ops),
        (Value::Array(a), Value::Array(b)) => diff_arrays(path, a, b, ops),
        _ if from == to => {}
        _ => ops.push(Op::Replace {
            path: path.clone(),
            value: to.clone(),
        }),
    }
}

fn with_token<R>(path: &mut String, token: &str, f: impl FnOnce(&mut String) -> R) -> R {
    let len = path.len();
    path.push('/');
    path.push_str(token);
    let r = f(path);
    path.truncate(len);
    r
}

fn diff_maps(path: &mut String, a: &Map<String, Value>, b: &Map<String, Value>, ops: &mut Vec<Op>) {
    for (key, old) in a {
        with_token(path, &escape(key), |path| match b.get(key) {
            Some(new) => diff_at(path, old, new, ops),
            None => ops.push(Op::Remove { path: path.clone() }),
        });
    }
    for (key, new) in b.iter().filter(|(k, _)| !a.contains_key(*k)) {
        with_token(path, &escape(key), |path| {
            ops.push(Op::Add {
                path: path.clone(),
                value: new.clone(),
            })
        });
    }
}

fn diff_arrays(path: &mut String, a: &[Value], b: &[Value], ops: &mut Vec<Op>) {
    let prefix = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let room = a.len().min(b.len()) - prefix;
    let suffix = a
        .iter()
        .rev()
        .zip(b.iter().rev())
        .take(room)
        .take_while(|(x, y)| x == y)
        .count();
    let old = &a[prefix..a.len() - suffix];
    let new = &b[prefix..b.len() - suffix];
    let paired = old.len().min(new.len());
    for i in 0..paired {
        with_token(path, &(prefix + i).to_string(), |path| {
            diff_at(path, &old[i], &new[i], ops)
        });
    }
    // Inserted before the common suffix, in order.
    for (j, value) in new[paired..].iter().enumerate() {
        with_token(path, &(prefix + paired + j).to_string(), |path| {
            ops.push(Op::Add {
                path: path.clone(),
                value: value.clone(),
            })
        });
    }
    // Removed: each removal shifts the rest down onto the same index.
    for _ in paired..old.len() {
        with_token(path, &(prefix + paired).to_string(), |path| {
            ops.push(Op::Remove { path: path.clone() })
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Applies operations by their JSON form with an independent RFC 6902
    /// implementation (the `json-patch` crate), as the API server would.
    pub(crate) fn apply(doc: &mut Value, ops: &[Op]) -> Result<(), String> {
        let patch: json_patch::Patch =
            serde_json::from_value(to_json(ops)).map_err(|e| e.to_string())?;
        json_patch::patch(doc, &patch).map_err(|e| e.to_string())
    }

    fn check(from: Value, to: Value) -> Vec<Op> {
        let ops = diff(&from, &to);
        let mut patched = from.clone();
        apply(&mut patched, &ops).unwrap_or_else(|e| panic!("{e}: {ops:?}"));
        assert_eq!(patched, to, "ops {ops:?}");
        ops
    }

    #[test]
    fn patches_turn_one_document_into_the_other() {
        assert!(check(json!({"a": 1}), json!({"a": 1})).is_empty());
        check(json!({"a": 1}), json!({"a": 2, "b": [1]}));
        check(json!({"a": {"b": 1, "c": 2}}), json!({"a": {"c": 3}}));
        check(json!([1, 2, 3]), json!([]));
        check(json!([]), json!([1, 2, 3]));
        check(json!([1, 2, 3]), json!([1, 3]));
        check(json!([1, 2, 3]), json!([0, 1, 2, 3]));
        check(json!([1, 2, 3]), json!([3, 2, 1]));
        check(json!([1, 1, 1]), json!([1, 1]));
        check(json!([1, 2, 1]), json!([1, 2, 1, 2, 1]));
        check(
            json!({"x": [1, {"y": [2]}]}),
            json!({"x": [1, {"y": [2, 3]}, 4]}),
        );
        check(json!({"a": null}), json!({"a": {}}));
        check(json!(1), json!("one"));
    }

    #[test]
    fn keys_are_escaped_as_pointer_tokens() {
        let ops = check(
            json!({"metadata": {"annotations": {}}}),
            json!({"metadata": {"annotations": {"linkerd.io/inject": "enabled", "a~b": "c"}}}),
        );
        let paths: Vec<&str> = ops
            .iter()
            .map(|o| match o {
                Op::Add { path, .. } => path.as_str(),
                _ => "",
            })
            .collect();
        assert!(
            paths.contains(&"/metadata/annotations/linkerd.io~1inject"),
            "{paths:?}"
        );
        assert!(paths.contains(&"/metadata/annotations/a~0b"), "{paths:?}");
        check(json!({"~1": 1, "/": 2}), json!({"~1": 3, "/": 4, "~0/": 5}));
    }

    #[test]
    fn a_sidecar_appended_and_an_init_container_prepended_are_single_adds() {
        let from = json!({"spec": {"containers": [{"name": "app"}], "initContainers": [{"name": "setup"}]}});
        let to = json!({"spec": {
            "containers": [{"name": "app"}, {"name": "ballast-proxy"}],
            "initContainers": [{"name": "ballast-init"}, {"name": "setup"}],
        }});
        let ops = check(from, to);
        assert_eq!(
            ops,
            vec![
                Op::Add {
                    path: "/spec/containers/1".into(),
                    value: json!({"name": "ballast-proxy"})
                },
                Op::Add {
                    path: "/spec/initContainers/0".into(),
                    value: json!({"name": "ballast-init"})
                },
            ]
        );
    }

    #[test]
    fn random_documents_round_trip() {
        // A small deterministic generator: nested maps and arrays of few
        // distinct values, so that prefixes, suffixes and repeats occur.
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        fn gen(next: &mut dyn FnMut(u64) -> u64, depth: u32) -> Value {
            match if depth == 0 { next(3) } else { next(5) } {
                0 => json!(next(3)),
                1 => json!(["a", "b/c", "~"][next(3) as usize]),
                2 => Value::Null,
                3 => Value::Array((0..next(5)).map(|_| gen(next, depth - 1)).collect()),
                _ => Value::Object(
                    (0..next(4))
                        .map(|_| {
                            (
                                ["k", "a/b", "m~n", "z"][next(4) as usize].to_string(),
                                gen(next, depth - 1),
                            )
                        })
                        .collect(),
                ),
            }
        }
        for _ in 0..2000 {
            let a = gen(&mut next, 4);
            let b = gen(&mut next, 4);
            check(a, b);
        }
    }
}
