//! What a policy version's requests use again and again, resolved by the
//! first request under the version and kept in it: a route's metric
//! series, and each backend's series and balancer. After that first
//! request, a request on the route path takes no lock and hashes no label
//! set; the next version of the policy starts afresh.

use crate::{
    http::HttpBalancer,
    metrics::route::{BackendHandles, ResourceMeta, RouteFamilies, RouteHandles, RouteLabels},
};
use std::sync::{Arc, OnceLock, Weak};

/// A route's series, for the hostname its first request named (clients of
/// a target name it one way); requests naming another host get theirs from
/// the families, as before.
#[derive(Debug, Default)]
pub struct RouteSlot(OnceLock<Arc<RouteHandles>>);

impl RouteSlot {
    pub fn handles(
        &self,
        families: &RouteFamilies,
        parent: &Arc<ResourceMeta>,
        route: &Arc<ResourceMeta>,
        host: Option<&str>,
    ) -> Arc<RouteHandles> {
        if let Some(kept) = self.0.get() {
            if same_hostname(&kept.labels().hostname, host) {
                return kept.clone();
            }
        }
        let labels = RouteLabels {
            parent: parent.clone(),
            route: route.clone(),
            hostname: hostname_label(host),
        };
        let handles = Arc::new(RouteHandles::new(families, labels));
        // Only the first hostname is kept.
        let _ = self.0.set(handles.clone());
        handles
    }
}

/// A backend's series and its balancer. The balancer is held weakly: the
/// outbound side's cache (and the newest policy version, through
/// `hold_backends`) decides how long it lives, as before.
#[derive(Debug)]
pub struct BoundBackend {
    pub metrics: BackendHandles,
    pub balancer: Weak<HttpBalancer>,
}

#[derive(Debug, Default)]
pub struct BackendSlot(OnceLock<BoundBackend>);

impl BackendSlot {
    pub fn get_or_init(&self, bind: impl FnOnce() -> BoundBackend) -> &BoundBackend {
        self.0.get_or_init(bind)
    }
}

/// Whether `host` gives the `hostname` label `label`, without making it.
fn same_hostname(label: &str, host: Option<&str>) -> bool {
    if label.is_empty() {
        return dns_hostname(host).is_none();
    }
    // A kept label is a DNS name in lower case: a host equal to it but for
    // case and a trailing dot is one too, and needs no reading.
    host.is_some_and(|h| h.trim_end_matches('.').eq_ignore_ascii_case(label))
}

/// The request's host when it is a DNS name (as Linkerd labels it),
/// without its trailing dot. Bounded: a client's `Host` may be long.
fn dns_hostname(host: Option<&str>) -> Option<&str> {
    let host = host?.trim_end_matches('.');
    let dns = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
        && host.parse::<std::net::Ipv4Addr>().is_err();
    dns.then_some(host)
}

/// The `hostname` label: the request's host when it is a DNS name, in
/// lower case, else empty.
pub fn hostname_label(host: Option<&str>) -> Arc<str> {
    match dns_hostname(host) {
        Some(h) => Arc::from(h.to_ascii_lowercase()),
        None => crate::metrics::empty_label(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::series::{SeriesDrops, SeriesLimits};
    use std::time::Duration;

    fn families() -> RouteFamilies {
        RouteFamilies::new(
            SeriesLimits {
                retention: Duration::from_secs(600),
                max_series: 100,
            },
            &SeriesDrops::default(),
        )
    }

    #[test]
    fn only_dns_names_label_the_hostname() {
        assert_eq!(
            &*hostname_label(Some("Web.Shop.svc.cluster.local.")),
            "web.shop.svc.cluster.local"
        );
        for bad in ["10.0.0.1", "[::1]", "a..b", "x\"y", &"a".repeat(300)] {
            assert_eq!(&*hostname_label(Some(bad)), "", "{bad}");
        }
        assert_eq!(&*hostname_label(None), "");
    }

    #[test]
    fn the_first_hostname_is_kept_and_others_get_their_own_series() {
        let f = families();
        let parent = Arc::new(ResourceMeta::default_named("parent"));
        let route = Arc::new(ResourceMeta::default_named("route"));
        let slot = RouteSlot::default();
        let first = slot.handles(&f, &parent, &route, Some("web.shop"));
        // The same host, however written: the kept handles.
        for same in ["web.shop", "WEB.shop.", "web.Shop"] {
            let again = slot.handles(&f, &parent, &route, Some(same));
            assert!(Arc::ptr_eq(&first, &again), "{same}");
        }
        // Another host, or none: its own labels, and the kept ones stay.
        let other = slot.handles(&f, &parent, &route, Some("api.shop"));
        assert_eq!(&*other.labels().hostname, "api.shop");
        let none = slot.handles(&f, &parent, &route, Some("10.0.0.1"));
        assert_eq!(&*none.labels().hostname, "");
        assert!(Arc::ptr_eq(
            &first,
            &slot.handles(&f, &parent, &route, Some("web.shop"))
        ));
        // Each label set is one series, whichever way it was reached.
        assert_eq!(f.request_duration.len(), 3);

        // A slot whose first request named no DNS name keeps the empty label.
        let slot = RouteSlot::default();
        let empty = slot.handles(&f, &parent, &route, None);
        assert!(Arc::ptr_eq(
            &empty,
            &slot.handles(&f, &parent, &route, Some("10.0.0.2"))
        ));
        assert!(!Arc::ptr_eq(
            &empty,
            &slot.handles(&f, &parent, &route, Some("web.shop"))
        ));
    }
}
