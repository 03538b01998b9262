//! A container's `resources.limits.memory`, which the kubelet applies as a
//! memory cgroup (CPU is not limited in the box).

use serde_json::Value;

/// The container's memory limit in bytes, if it has one; an error names
/// a value that is not a Kubernetes quantity (the container then waits
/// with `CreateContainerConfigError`, as the kubelet refuses it).
pub(crate) fn memory_limit(container: &Value) -> Result<Option<u64>, String> {
    let Some(q) = container.pointer("/resources/limits/memory") else {
        return Ok(None);
    };
    let bytes = match q {
        Value::String(s) => quantity_bytes(s),
        Value::Number(n) => n.as_u64(),
        _ => None,
    };
    bytes
        .map(Some)
        .ok_or_else(|| format!("resources.limits.memory: {q} is not a quantity of bytes"))
}

/// `128Mi`, `1G`, `500000`, `1e9`: a quantity's whole bytes (a fraction
/// of a byte rounds up, as Kubernetes rounds memory).
fn quantity_bytes(q: &str) -> Option<u64> {
    const SUFFIXES: [(&str, f64); 13] = [
        ("Ki", 1024.0),
        ("Mi", 1048576.0),
        ("Gi", 1073741824.0),
        ("Ti", 1099511627776.0),
        ("Pi", 1125899906842624.0),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
        ("E", 1e18),
        ("m", 1e-3),
        ("", 1.0),
    ];
    let q = q.trim();
    let (number, scale) = SUFFIXES
        .iter()
        .find_map(|(s, scale)| q.strip_suffix(s).map(|n| (n, *scale)))?;
    let starts_as_number = number.starts_with(|c: char| c.is_ascii_digit() || c == '.');
    let value: f64 = number.parse().ok().filter(|_| starts_as_number)?;
    let bytes = (value * scale).ceil();
    (bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64).then_some(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn quantities_in_every_form_kubernetes_writes_them() {
        for (q, want) in [
            ("128Mi", 134217728),
            ("1Gi", 1073741824),
            ("64Ki", 65536),
            ("1G", 1000000000),
            ("500M", 500000000),
            ("12345", 12345),
            ("1e6", 1000000),
            ("1.5Mi", 1572864),
            ("2500m", 3),
        ] {
            assert_eq!(quantity_bytes(q), Some(want), "{q}");
        }
        for bad in ["", "Mi", "12Q", "-1Mi", "ten", "1.2.3Gi", "e6"] {
            assert_eq!(quantity_bytes(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_container_without_a_limit_has_none_and_a_bad_one_is_named() {
        assert_eq!(memory_limit(&json!({"name": "c"})), Ok(None));
        assert_eq!(
            memory_limit(&json!({"resources": {"requests": {"memory": "64Mi"}}})),
            Ok(None)
        );
        assert_eq!(
            memory_limit(&json!({"resources": {"limits": {"memory": "256Mi", "cpu": "1"}}})),
            Ok(Some(268435456))
        );
        assert_eq!(
            memory_limit(&json!({"resources": {"limits": {"memory": 1048576}}})),
            Ok(Some(1048576))
        );
        let bad = memory_limit(&json!({"resources": {"limits": {"memory": "lots"}}}));
        assert!(
            bad.as_ref().is_err_and(|e| e.contains("\"lots\"")),
            "{bad:?}"
        );
    }
}
