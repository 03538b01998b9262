//! Kubernetes names in queries: a namespace is a DNS-1123 label, an object
//! name a DNS-1123 subdomain. Every API path checks them the same way, so
//! nothing odd (paths, markup, 300 characters) reaches a lookup, a label
//! match or an answer.

/// Why `value` (the query's `what`) is not a namespace, if it is not one
/// (`ballast_flags::dns_label`'s rule, as the CLI's `--namespace`).
pub fn check_namespace(value: &str, what: &str) -> Result<(), String> {
    ballast_flags::dns_label(value).map(drop).map_err(|_| {
        format!(
            "{what}: {:?} is not a namespace (at most 63 lowercase letters, digits and '-', starting and ending alphanumeric)",
            shown(value)
        )
    })
}

/// Why `value` (the query's `what`) is not a Kubernetes object name, if it
/// is not one (`ballast_flags::dns_name`'s rule).
pub fn check_name(value: &str, what: &str) -> Result<(), String> {
    ballast_flags::dns_name(value).map(drop).map_err(|_| {
        format!(
            "{what}: {:?} is not a Kubernetes name (lowercase letters, digits, '-' and '.')",
            shown(value)
        )
    })
}

/// A refused value as a message shows it: at most 64 characters, anything
/// but letters, digits, '.', '-' and '_' as '?' (no markup or path reaches a
/// page that prints the message).
fn shown(value: &str) -> String {
    value
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '?'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_are_labels_and_names_subdomains() {
        for ok in ["demo", "a", "team-1", &"a".repeat(63)] {
            assert!(check_namespace(ok, "namespace").is_ok(), "{ok}");
        }
        for bad in [
            "",
            "../../etc/passwd",
            "<script>",
            "Demo",
            "-a",
            "a-",
            "a.b",
            &"a".repeat(64),
            &"a".repeat(300),
        ] {
            let e = check_namespace(bad, "namespace").unwrap_err();
            assert!(e.starts_with("namespace: "), "{e}");
            assert!(e.len() < 200, "a refused value is not echoed whole: {e}");
            assert!(!e.contains('<') && !e.contains('/'), "{e}");
        }
        for ok in ["web", "web-1.v2", "a.b.c"] {
            assert!(check_name(ok, "name").is_ok(), "{ok}");
        }
        for bad in ["", "a..b", ".a", "a/b", "<b>", "Web", &"a".repeat(254)] {
            assert!(check_name(bad, "name").is_err(), "{bad}");
        }
    }
}
