//! PATCH bodies applied to a stored object (pure): JSON merge patch (RFC 7386),
//! JSON Patch (RFC 6902) and server-side apply, which here merges the given fields
//! into the object as a merge patch does (no field ownership is tracked).

use serde_json::Value;

/// The patch types the API server accepts, by `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchType {
    Merge,
    Json,
    /// Server-side apply (`application/apply-patch+yaml`, JSON being YAML).
    Apply,
}

impl PatchType {
    /// The patch type of a `Content-Type` header value; `None` is a 415.
    pub fn from_content_type(ct: &str) -> Option<PatchType> {
        let essence = ct.split(';').next().unwrap_or("").trim();
        match essence {
            "application/merge-patch+json" => Some(PatchType::Merge),
            // Strategic merge patch merges lists by key; a merge patch is close enough
            // for what tests send (kubectl's default).
            "application/strategic-merge-patch+json" => Some(PatchType::Merge),
            "application/json-patch+json" => Some(PatchType::Json),
            "application/apply-patch+yaml" | "application/apply-patch+json" => {
                Some(PatchType::Apply)
            }
            _ => None,
        }
    }
}

/// A patch body as JSON: JSON itself, or YAML for apply patches. The error is the
/// message of a 400 answer.
pub(crate) fn parse_body(kind: PatchType, body: &[u8]) -> Result<Value, String> {
    match serde_json::from_slice(body) {
        Ok(v) => Ok(v),
        Err(_) if kind == PatchType::Apply => {
            let text = std::str::from_utf8(body).map_err(|e| format!("not UTF-8: {e}"))?;
            serde_saphyr::from_str::<Value>(text)
                .map_err(|e| format!("error decoding YAML: {}", first_line(&e.to_string())))
        }
        Err(e) => Err(format!("error decoding patch: {e}")),
    }
}

fn first_line(s: &str) -> String {
    super::selector::bounded(s.lines().next().unwrap_or(""))
}

/// Applies a parsed patch to `target`; the error is the message of a 422 answer
/// (a JSON Patch whose operation cannot be applied) or 400 (a malformed one).
pub(crate) fn apply(
    kind: PatchType,
    target: &mut Value,
    patch: &Value,
) -> Result<(), (u16, String)> {
    match kind {
        PatchType::Merge | PatchType::Apply => {
            if !patch.is_object() {
                return Err((400, "a merge patch must be a JSON object".to_string()));
            }
            json_patch::merge(target, patch);
            Ok(())
        }
        PatchType::Json => {
            let ops: json_patch::Patch = serde_json::from_value(patch.clone())
                .map_err(|e| (400, format!("invalid JSON Patch: {e}")))?;
            json_patch::patch(target, &ops)
                .map_err(|e| (422, format!("the JSON Patch cannot be applied: {e}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn patches_by_table() {
        let base =
            json!({"metadata": {"name": "a", "labels": {"x": "1", "y": "2"}}, "spec": {"n": 1}});
        let cases: &[(PatchType, Value, Result<Value, u16>)] = &[
            (
                PatchType::Merge,
                json!({"metadata": {"labels": {"x": null, "z": "3"}}}),
                Ok(
                    json!({"metadata": {"name": "a", "labels": {"y": "2", "z": "3"}}, "spec": {"n": 1}}),
                ),
            ),
            (
                PatchType::Json,
                json!([{"op": "replace", "path": "/spec/n", "value": 2}]),
                Ok(
                    json!({"metadata": {"name": "a", "labels": {"x": "1", "y": "2"}}, "spec": {"n": 2}}),
                ),
            ),
            (
                PatchType::Json,
                json!([{"op": "remove", "path": "/nope"}]),
                Err(422),
            ),
            (PatchType::Json, json!({"op": "add"}), Err(400)),
            (PatchType::Merge, json!([1]), Err(400)),
        ];
        for (kind, patch, want) in cases {
            let mut doc = base.clone();
            let got = apply(*kind, &mut doc, patch).map(|()| doc).map_err(|e| e.0);
            assert_eq!(&got, want, "{kind:?} {patch}");
        }
    }

    #[test]
    fn apply_bodies_may_be_yaml() {
        let v = parse_body(
            PatchType::Apply,
            b"apiVersion: v1\nkind: ConfigMap\ndata:\n  a: b\n",
        )
        .expect("yaml");
        assert_eq!(v["data"]["a"], "b");
        assert!(parse_body(PatchType::Merge, b"a: b").is_err());
        assert_eq!(
            PatchType::from_content_type("application/merge-patch+json; charset=utf-8"),
            Some(PatchType::Merge)
        );
        assert_eq!(PatchType::from_content_type("text/plain"), None);
    }
}
