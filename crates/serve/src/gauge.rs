//! A gauge counted up while something lives.

use prometheus_client::metrics::gauge::Gauge;

/// Increments a gauge when made and decrements it when dropped, so that
/// in-flight and open counts stay right whatever way a task ends (finished,
/// failed or aborted).
#[derive(Debug)]
pub struct GaugeGuard(Gauge);

impl GaugeGuard {
    /// Counts one more in `gauge` until the guard is dropped.
    pub fn new(gauge: &Gauge) -> Self {
        gauge.inc();
        Self(gauge.clone())
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_while_alive() {
        let gauge = Gauge::default();
        let (a, b) = (GaugeGuard::new(&gauge), GaugeGuard::new(&gauge));
        assert_eq!(gauge.get(), 2);
        drop(a);
        assert_eq!(gauge.get(), 1);
        drop(b);
        assert_eq!(gauge.get(), 0);
    }
}
