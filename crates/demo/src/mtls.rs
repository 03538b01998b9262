//! Whether the demo's traffic was mutual TLS, read from the proxies' own
//! `/metrics`: each connection a proxy opens or accepts is counted in
//! `tcp_open_total` with Linkerd's `tls` label (`true` with the peer's
//! `server_id` or `client_id`, else why not).

use std::collections::BTreeMap;

/// The family counting connections by TLS.
const TCP_OPEN: &str = "tcp_open_total";

/// Connections of one direction and peer, by how they were secured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TlsTally {
    /// Mutual TLS, by the peer's identity.
    pub mtls: BTreeMap<String, f64>,
    /// Everything else, by `tls` (and `no_tls_reason` when given).
    pub other: BTreeMap<String, f64>,
}

impl TlsTally {
    /// Adds `direction`/`peer` connections counted on one `/metrics` page.
    /// `peer` is `dst` (connections the proxy opened: the server's identity)
    /// or `src` (connections it accepted: the client's).
    pub fn add_page(&mut self, page: &str, direction: &str, peer: &str) {
        let id_label = if peer == "dst" {
            "server_id"
        } else {
            "client_id"
        };
        for sample in samples(page, TCP_OPEN) {
            if sample.label("direction") != Some(direction) || sample.label("peer") != Some(peer) {
                continue;
            }
            if sample.value <= 0.0 {
                continue;
            }
            match sample.label("tls") {
                Some("true") => {
                    let id = sample.label(id_label).unwrap_or("").to_string();
                    *self.mtls.entry(id).or_default() += sample.value;
                }
                tls => {
                    let mut what = tls.unwrap_or("unlabelled").to_string();
                    if let Some(reason) = sample.label("no_tls_reason") {
                        what = format!("{what} ({reason})");
                    }
                    *self.other.entry(what).or_default() += sample.value;
                }
            }
        }
    }

    pub fn secured(&self) -> f64 {
        self.mtls.values().sum()
    }

    pub fn unsecured(&self) -> f64 {
        self.other.values().sum()
    }

    /// Some connections, every one mutual TLS with `identity`.
    pub fn all_mtls_with(&self, identity: &str) -> bool {
        self.unsecured() == 0.0 && self.secured() > 0.0 && self.mtls.keys().all(|id| id == identity)
    }

    /// "3 connections, all mutual TLS with ID" or what else was seen.
    pub fn describe(&self) -> String {
        let parts = |m: &BTreeMap<String, f64>| {
            m.iter()
                .map(|(k, v)| format!("{v:.0} {k}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let total = self.secured() + self.unsecured();
        match (self.mtls.is_empty(), self.other.is_empty()) {
            (true, true) => "no connection counted".to_string(),
            (false, true) => format!("{total:.0} connections, mutual TLS: {}", parts(&self.mtls)),
            (true, false) => format!(
                "{total:.0} connections, none mutual TLS: {}",
                parts(&self.other)
            ),
            (false, false) => format!(
                "{total:.0} connections, mutual TLS: {}; not: {}",
                parts(&self.mtls),
                parts(&self.other)
            ),
        }
    }
}

/// One sample of a text exposition page.
#[derive(Debug, PartialEq)]
struct Sample {
    labels: Vec<(String, String)>,
    value: f64,
}

impl Sample {
    fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The samples named `name` on a Prometheus or OpenMetrics text page;
/// lines that do not parse are skipped.
fn samples<'a>(page: &'a str, name: &'a str) -> impl Iterator<Item = Sample> + 'a {
    page.lines().filter_map(move |line| {
        let rest = line.strip_prefix(name)?;
        let (labels, rest) = match rest.strip_prefix('{') {
            Some(inner) => parse_labels(inner)?,
            None if rest.starts_with(' ') => (Vec::new(), rest),
            None => return None,
        };
        let value = rest.split_whitespace().next()?.parse().ok()?;
        Some(Sample { labels, value })
    })
}

/// `k="v",...}` to the pairs and what follows the `}`.
fn parse_labels(mut s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start_matches(',');
        if let Some(rest) = s.strip_prefix('}') {
            return Some((labels, rest));
        }
        let (key, rest) = s.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        labels.push((key.trim().to_string(), value));
        s = &rest[end + 1..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WEB: &str = "web.demo.serviceaccount.identity.linkerd.cluster.local";
    const LOAD: &str = "load.demo.serviceaccount.identity.linkerd.cluster.local";

    fn page(lines: &[&str]) -> String {
        let mut text = "# HELP tcp_open Connections opened.\n# TYPE tcp_open counter\n".to_string();
        for l in lines {
            text.push_str(l);
            text.push('\n');
        }
        text.push_str("# EOF\n");
        text
    }

    #[test]
    fn outbound_mtls_is_counted_by_server_identity() {
        let text = page(&[
            &format!(
                r#"tcp_open_total{{peer="dst",direction="outbound",authority="web.demo.svc.cluster.local:80",tls="true",server_id="{WEB}"}} 3"#
            ),
            r#"tcp_open_total{peer="src",direction="outbound",tls="no_identity",no_tls_reason="loopback"} 4"#,
            r#"tcp_open_created{peer="dst",direction="outbound",tls="true"} 1700000000"#,
        ]);
        let mut tally = TlsTally::default();
        tally.add_page(&text, "outbound", "dst");
        assert_eq!(tally.secured(), 3.0);
        assert_eq!(tally.unsecured(), 0.0);
        assert!(tally.all_mtls_with(WEB));
        assert!(!tally.all_mtls_with(LOAD));
        assert_eq!(
            tally.describe(),
            format!("3 connections, mutual TLS: 3 {WEB}")
        );
    }

    #[test]
    fn plaintext_or_no_connection_is_not_mtls() {
        // What the demo's proxy counted before it had an identity.
        let text = page(&[
            r#"tcp_open_total{peer="dst",direction="outbound",authority="web.demo.svc.cluster.local:80",tls="disabled"} 3"#,
        ]);
        let mut tally = TlsTally::default();
        tally.add_page(&text, "outbound", "dst");
        assert!(!tally.all_mtls_with(WEB));
        assert_eq!(
            tally.describe(),
            "3 connections, none mutual TLS: 3 disabled"
        );

        let mut mixed = TlsTally::default();
        mixed.add_page(
            &page(&[
                &format!(r#"tcp_open_total{{peer="dst",direction="outbound",tls="true",server_id="{WEB}"}} 2"#),
                r#"tcp_open_total{peer="dst",direction="outbound",tls="no_identity",no_tls_reason="not_provided_by_service_discovery"} 1"#,
            ]),
            "outbound",
            "dst",
        );
        assert!(!mixed.all_mtls_with(WEB));
        assert!(
            mixed
                .describe()
                .ends_with("not: 1 no_identity (not_provided_by_service_discovery)"),
            "{}",
            mixed.describe()
        );

        let empty = TlsTally::default();
        assert!(!empty.all_mtls_with(WEB));
        assert_eq!(empty.describe(), "no connection counted");
    }

    #[test]
    fn inbound_pages_add_up_by_client_identity() {
        let mut tally = TlsTally::default();
        for n in [1, 2] {
            tally.add_page(
                &page(&[&format!(
                    r#"tcp_open_total{{peer="src",direction="inbound",tls="true",client_id="{LOAD}"}} {n}"#
                )]),
                "inbound",
                "src",
            );
        }
        assert_eq!(tally.mtls.get(LOAD), Some(&3.0));
        assert!(tally.all_mtls_with(LOAD));
    }

    #[test]
    fn label_values_are_unescaped() {
        let (labels, rest) = parse_labels(r#"a="x\"y",b="p\\q\nr"} 5"#).expect("labels");
        assert_eq!(
            labels,
            [
                ("a".to_string(), "x\"y".to_string()),
                ("b".to_string(), "p\\q\nr".to_string())
            ]
        );
        assert_eq!(rest, " 5");
        assert!(parse_labels(r#"a="unterminated"#).is_none());
    }
}
