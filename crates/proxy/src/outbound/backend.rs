//! Which backend of a rule a request goes to: the first of a
//! `FirstAvailable` list, or one drawn from a `RandomAvailable` list in
//! proportion to the weights (a backend of weight 0 is never drawn).

use super::policy::{Distribution, RouteBackend};
use rand::Rng;

/// The backend for one request, or `None` when the rule has none (or only
/// backends of weight 0).
pub fn choose<'a>(d: &'a Distribution, rng: &mut impl Rng) -> Option<&'a RouteBackend> {
    match d {
        Distribution::Empty => None,
        Distribution::FirstAvailable(backends) => backends.first(),
        Distribution::RandomAvailable(backends) => {
            let total: u64 = backends.iter().map(|(_, w)| u64::from(*w)).sum();
            if total == 0 {
                return None;
            }
            at_point(backends, rng.random_range(0..total))
        }
    }
}

/// The backend whose share of `0..total weight` holds `point`.
fn at_point(backends: &[(RouteBackend, u32)], mut point: u64) -> Option<&RouteBackend> {
    for (b, w) in backends {
        let w = u64::from(*w);
        if point < w {
            return Some(b);
        }
        point -= w;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        discovery::Endpoint,
        metrics::route::ResourceMeta,
        outbound::policy::{Backend, BackendTarget},
    };
    use std::sync::Arc;

    fn backend(name: &str) -> RouteBackend {
        RouteBackend {
            backend: Arc::new(Backend {
                meta: Arc::new(ResourceMeta::default_named(name)),
                target: BackendTarget::Forward(Endpoint::bare(
                    "10.0.0.1:80".parse().expect("addr"),
                )),
            }),
            filters: vec![],
            bound: Default::default(),
        }
    }

    fn name(b: &RouteBackend) -> &str {
        &b.backend.meta.name
    }

    #[test]
    fn each_point_of_the_total_weight_belongs_to_exactly_one_backend_in_proportion() {
        let backends = vec![(backend("a"), 90), (backend("zero"), 0), (backend("b"), 10)];
        let mut counts = std::collections::HashMap::new();
        for point in 0..100 {
            let b = at_point(&backends, point).expect("within the total");
            *counts.entry(name(b).to_string()).or_insert(0) += 1;
        }
        assert_eq!(counts.get("a"), Some(&90));
        assert_eq!(counts.get("b"), Some(&10));
        assert_eq!(counts.get("zero"), None, "weight 0 is never chosen");
        assert!(at_point(&backends, 100).is_none());
    }

    #[test]
    fn random_draws_never_take_a_zero_weight_and_all_zero_is_none() {
        let d = Distribution::RandomAvailable(vec![(backend("off"), 0), (backend("on"), 1)]);
        let mut rng = rand::rng();
        for _ in 0..1000 {
            assert_eq!(choose(&d, &mut rng).map(name), Some("on"));
        }
        let none = Distribution::RandomAvailable(vec![(backend("off"), 0)]);
        assert!(choose(&none, &mut rng).is_none());
        assert!(choose(&Distribution::Empty, &mut rng).is_none());
        let first = Distribution::FirstAvailable(vec![backend("x"), backend("y")]);
        assert_eq!(choose(&first, &mut rng).map(name), Some("x"));
    }
}
