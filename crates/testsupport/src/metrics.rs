//! A `/metrics` page's values by name and labels, read by the viz
//! collector's fuzzed parser ([`ballast_vizcore::expo::samples`]): one
//! reader of the text format for every test. (Whether a page conforms to
//! OpenMetrics is [`crate::openmetrics`]'s question.)

use ballast_vizcore::expo::{self, Limits};
use std::collections::BTreeMap;

/// One sample of a Prometheus / OpenMetrics text exposition.
#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed /metrics page.
#[derive(Debug, Clone)]
pub struct Metrics {
    /// Every sample line, in page order; none when the page is not one.
    pub samples: Vec<Sample>,
    /// The page as served, for failure messages.
    pub text: String,
}

impl Metrics {
    /// Reads `text`; a page the parser refuses (no sample line, only
    /// garbage) has no samples, so every value reads as missing.
    pub fn parse(text: &str) -> Metrics {
        let samples = expo::samples(text.as_bytes(), &Limits::default())
            .unwrap_or_default()
            .into_iter()
            .map(Sample::from)
            .collect();
        Metrics {
            samples,
            text: text.to_string(),
        }
    }

    /// Samples named `name` that carry every one of `labels`.
    pub fn find<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }

    /// The sum of the samples named `name` that carry every one of `labels`
    /// (0 when there are none).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.find(name, labels).map(|s| s.value).sum()
    }

    /// The value of the one series `series` names as a page writes it,
    /// e.g. `destination_subscriptions{method="Get"}`: its name and exactly
    /// its labels (none for a bare name); `None` when the page has no such
    /// sample.
    pub fn value(&self, series: &str) -> Option<f64> {
        let wanted = selector(series);
        self.samples
            .iter()
            .find(|s| s.name == wanted.name && s.labels == wanted.labels)
            .map(|s| s.value)
    }

    /// The names of all metric samples, for failure messages.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.samples.iter().map(|s| s.name.clone()).collect();
        names.sort();
        names.dedup();
        names
    }
}

impl From<expo::TextSample> for Sample {
    fn from(s: expo::TextSample) -> Sample {
        Sample {
            name: s.name,
            labels: s.labels.into_iter().collect(),
            value: s.value,
        }
    }
}

/// A series as a page writes it (`name{label="value",...}`), read by the
/// same parser as the page.
fn selector(series: &str) -> Sample {
    let line = format!("{series} 0\n");
    match expo::samples(line.as_bytes(), &Limits::default()) {
        Ok(mut one) if one.len() == 1 => Sample::from(one.remove(0)),
        _ => panic!("not a series as a page writes it: {series:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "# TYPE request counter\n\
        request_total{dst_service=\"web\",status_code=\"200\"} 3\n\
        request_total{dst_service=\"web\",status_code=\"503\"} 2\n\
        request_total{dst_service=\"db\",status_code=\"200\"} 7\n\
        destination_streams{method=\"Get\"} 1\n\
        destination_streams{method=\"Get\",extra=\"x\"} 5\n\
        process_memory_allocated_bytes 1.5e6\n\
        # EOF\n";

    #[test]
    fn sums_values_by_name_and_labels() {
        let m = Metrics::parse(PAGE);
        assert_eq!(m.sum("request_total", &[("dst_service", "web")]), 5.0);
        assert_eq!(m.sum("request_total", &[]), 12.0);
        assert_eq!(m.sum("request_total", &[("dst_service", "nope")]), 0.0);
        assert_eq!(
            m.find("request_total", &[("status_code", "200")]).count(),
            2
        );
        assert_eq!(
            m.names(),
            [
                "destination_streams",
                "process_memory_allocated_bytes",
                "request_total"
            ]
        );
    }

    #[test]
    fn a_series_is_its_name_and_exactly_its_labels() {
        let m = Metrics::parse(PAGE);
        assert_eq!(m.value("destination_streams{method=\"Get\"}"), Some(1.0));
        assert_eq!(m.value("destination_streams{method=\"Put\"}"), None);
        assert_eq!(m.value("destination_streams"), None);
        assert_eq!(m.value("process_memory_allocated_bytes"), Some(1.5e6));
    }

    #[test]
    fn a_page_that_is_not_one_has_no_values() {
        let m = Metrics::parse("<html>502 Bad Gateway</html>\n");
        assert!(m.samples.is_empty());
        assert_eq!(m.sum("request_total", &[]), 0.0);
    }
}
