//! Policy: routes and authorization, held next to the endpoint index.
//!
//! [`PolicyObjects`] keeps every policy object with the reverse maps a change
//! needs (routes by parent and by backend Service), and judges what only
//! other objects can tell: a route whose parent or backend Service does not
//! exist is *invalid*, left out of every answer and reported once through
//! [`crate::Changes::route_problems`]. The answers themselves are computed in
//! `outbound.rs` and `inbound.rs`.

mod inbound;
mod outbound;
#[cfg(test)]
mod tests;

pub use inbound::{Authn, Authz, AuthzRef, InboundProtocol, InboundRoute, InboundView, ServerRef};
pub use outbound::{OutboundView, ServiceOutbound};

use crate::{
    resource::{
        AuthorizationPolicy, Kind, MeshTlsAuthentication, Namespace, NetworkAuthentication,
        ObjectKey, ParentKind, Resource, Route, Server, ServiceProfile,
    },
    Changes,
};
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fmt,
    sync::Arc,
};

/// Most routes served for one parent (Service or Server); the oldest win.
/// Linkerd sets no such limit; one is needed so a flood of route objects
/// cannot make every answer for a service unbounded.
pub const MAX_ROUTES_PER_PARENT: usize = 100;

/// A route object: its kind (the API it came from) and key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RouteId {
    pub kind: Kind,
    pub key: ObjectKey,
}

impl fmt::Display for RouteId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind.as_str(), self.key)
    }
}

/// Why a route object is left out of every answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteProblem {
    pub route: RouteId,
    /// Short and stable, for a metric label: `parent_not_found` or
    /// `backend_not_found`. (Routes beyond [`MAX_ROUTES_PER_PARENT`] are
    /// not problems of one route: the newest are left out of the answer.)
    pub reason: &'static str,
    /// One line naming the objects involved.
    pub detail: String,
}

#[derive(Default)]
pub struct PolicyObjects {
    pub(crate) namespaces: HashMap<Arc<str>, Arc<Namespace>>,
    pub(crate) routes: HashMap<RouteId, Arc<Route>>,
    /// (parent kind, parent key) -> routes naming it.
    pub(crate) routes_by_parent: HashMap<(ParentKind, ObjectKey), BTreeSet<RouteId>>,
    /// Backend Service -> routes naming it.
    routes_by_backend: HashMap<ObjectKey, BTreeSet<RouteId>>,
    pub(crate) servers: HashMap<ObjectKey, Arc<Server>>,
    pub(crate) servers_by_namespace: HashMap<Arc<str>, BTreeSet<Arc<str>>>,
    pub(crate) authorizations: HashMap<ObjectKey, Arc<AuthorizationPolicy>>,
    pub(crate) authz_by_namespace: HashMap<Arc<str>, BTreeSet<Arc<str>>>,
    pub(crate) mesh_tls: HashMap<ObjectKey, Arc<MeshTlsAuthentication>>,
    pub(crate) networks: HashMap<ObjectKey, Arc<NetworkAuthentication>>,
    pub(crate) profiles: HashMap<ObjectKey, Arc<ServiceProfile>>,
    /// Routes currently left out, and why.
    problems: BTreeMap<RouteId, RouteProblem>,
}

impl PolicyObjects {
    pub fn len(&self, kind: Kind) -> usize {
        match kind {
            Kind::Namespace => self.namespaces.len(),
            Kind::HttpRoute | Kind::GrpcRoute | Kind::LinkerdHttpRoute => {
                self.routes.keys().filter(|id| id.kind == kind).count()
            }
            Kind::Server => self.servers.len(),
            Kind::AuthorizationPolicy => self.authorizations.len(),
            Kind::MeshTlsAuthentication => self.mesh_tls.len(),
            Kind::NetworkAuthentication => self.networks.len(),
            Kind::ServiceProfile => self.profiles.len(),
            Kind::Pod | Kind::Service | Kind::EndpointSlice => 0,
        }
    }

    pub fn keys(&self, kind: Kind) -> Vec<ObjectKey> {
        match kind {
            Kind::Namespace => self.namespaces.values().map(|n| n.key.clone()).collect(),
            Kind::HttpRoute | Kind::GrpcRoute | Kind::LinkerdHttpRoute => self
                .routes
                .keys()
                .filter(|id| id.kind == kind)
                .map(|id| id.key.clone())
                .collect(),
            Kind::Server => self.servers.keys().cloned().collect(),
            Kind::AuthorizationPolicy => self.authorizations.keys().cloned().collect(),
            Kind::MeshTlsAuthentication => self.mesh_tls.keys().cloned().collect(),
            Kind::NetworkAuthentication => self.networks.keys().cloned().collect(),
            Kind::ServiceProfile => self.profiles.keys().cloned().collect(),
            Kind::Pod | Kind::Service | Kind::EndpointSlice => Vec::new(),
        }
    }

    /// Routes left out of answers right now.
    pub fn problems(&self) -> impl Iterator<Item = &RouteProblem> {
        self.problems.values()
    }

    pub fn route(&self, id: &RouteId) -> Option<&Arc<Route>> {
        self.routes.get(id)
    }

    pub(crate) fn apply(&mut self, resource: Resource, ch: &mut Changes) {
        match resource {
            Resource::Namespace(ns) => {
                if self.namespaces.get(&ns.key.name) == Some(&ns) {
                    return;
                }
                ch.policy_namespaces.insert(ns.key.name.clone());
                self.namespaces.insert(ns.key.name.clone(), ns);
            }
            Resource::Route(route) => {
                let id = RouteId {
                    kind: Resource::Route(route.clone()).kind(),
                    key: route.key.clone(),
                };
                if self.routes.get(&id) == Some(&route) {
                    return;
                }
                self.delete_route(&id, ch);
                for p in &route.parents {
                    self.routes_by_parent
                        .entry((p.kind.clone(), p.key.clone()))
                        .or_default()
                        .insert(id.clone());
                }
                for b in route.rules.iter().flat_map(|r| &r.backends) {
                    self.routes_by_backend
                        .entry(b.service.clone())
                        .or_default()
                        .insert(id.clone());
                }
                touch_route(&route, ch);
                self.routes.insert(id, route);
            }
            Resource::Server(s) => {
                if self.servers.get(&s.key) == Some(&s) {
                    return;
                }
                ch.policy_namespaces.insert(s.key.namespace.clone());
                self.servers_by_namespace
                    .entry(s.key.namespace.clone())
                    .or_default()
                    .insert(s.key.name.clone());
                self.servers.insert(s.key.clone(), s);
            }
            Resource::AuthorizationPolicy(a) => {
                if self.authorizations.get(&a.key) == Some(&a) {
                    return;
                }
                ch.policy_namespaces.insert(a.key.namespace.clone());
                self.authz_by_namespace
                    .entry(a.key.namespace.clone())
                    .or_default()
                    .insert(a.key.name.clone());
                self.authorizations.insert(a.key.clone(), a);
            }
            Resource::MeshTlsAuthentication(m) => {
                if self.mesh_tls.get(&m.key) == Some(&m) {
                    return;
                }
                // Referenced across namespaces: any inbound answer may use it.
                ch.inbound_all = true;
                self.mesh_tls.insert(m.key.clone(), m);
            }
            Resource::NetworkAuthentication(n) => {
                if self.networks.get(&n.key) == Some(&n) {
                    return;
                }
                ch.inbound_all = true;
                self.networks.insert(n.key.clone(), n);
            }
            Resource::ServiceProfile(p) => {
                // The caller marks the profile's service as changed.
                self.profiles.insert(p.key.clone(), p);
            }
            Resource::Pod(_) | Resource::Service(_) | Resource::EndpointSlice(_) => {}
        }
    }

    pub(crate) fn delete(&mut self, kind: Kind, key: &ObjectKey, ch: &mut Changes) {
        match kind {
            Kind::Namespace => {
                if self.namespaces.remove(&key.name).is_some() {
                    ch.policy_namespaces.insert(key.name.clone());
                }
            }
            Kind::HttpRoute | Kind::GrpcRoute | Kind::LinkerdHttpRoute => {
                self.delete_route(
                    &RouteId {
                        kind,
                        key: key.clone(),
                    },
                    ch,
                );
            }
            Kind::Server => {
                if self.servers.remove(key).is_some() {
                    ch.policy_namespaces.insert(key.namespace.clone());
                    remove_name(&mut self.servers_by_namespace, key);
                }
            }
            Kind::AuthorizationPolicy => {
                if self.authorizations.remove(key).is_some() {
                    ch.policy_namespaces.insert(key.namespace.clone());
                    remove_name(&mut self.authz_by_namespace, key);
                }
            }
            Kind::MeshTlsAuthentication => {
                if self.mesh_tls.remove(key).is_some() {
                    ch.inbound_all = true;
                }
            }
            Kind::NetworkAuthentication => {
                if self.networks.remove(key).is_some() {
                    ch.inbound_all = true;
                }
            }
            Kind::ServiceProfile => {
                self.profiles.remove(key);
            }
            Kind::Pod | Kind::Service | Kind::EndpointSlice => {}
        }
    }

    fn delete_route(&mut self, id: &RouteId, ch: &mut Changes) {
        let Some(old) = self.routes.remove(id) else {
            return;
        };
        for p in &old.parents {
            let k = (p.kind.clone(), p.key.clone());
            if let Some(ids) = self.routes_by_parent.get_mut(&k) {
                ids.remove(id);
                if ids.is_empty() {
                    self.routes_by_parent.remove(&k);
                }
            }
        }
        for b in old.rules.iter().flat_map(|r| &r.backends) {
            if let Some(ids) = self.routes_by_backend.get_mut(&b.service) {
                ids.remove(id);
                if ids.is_empty() {
                    self.routes_by_backend.remove(&b.service);
                }
            }
        }
        self.problems.remove(id);
        touch_route(&old, ch);
    }

    /// A Service appeared, changed or went: the routes naming it as parent
    /// or backend may change validity, and their parents' answers with them.
    pub(crate) fn service_changed(&self, key: &ObjectKey, ch: &mut Changes) {
        let ids = self.routes_by_backend.get(key).into_iter().flatten().chain(
            self.routes_by_parent
                .get(&(ParentKind::Service, key.clone()))
                .into_iter()
                .flatten(),
        );
        for id in ids {
            if let Some(route) = self.routes.get(id) {
                touch_route(route, ch);
            }
        }
    }

    /// Re-judges the routes a change touched; returns problems that are new.
    pub(crate) fn recheck(
        &mut self,
        ch: &Changes,
        service_exists: impl Fn(&ObjectKey) -> bool,
    ) -> Vec<RouteProblem> {
        let mut ids: BTreeSet<RouteId> = BTreeSet::new();
        if ch.all {
            ids.extend(self.routes.keys().cloned());
        } else {
            for svc in ch.services.iter().chain(&ch.outbound_services) {
                ids.extend(
                    self.routes_by_backend
                        .get(svc)
                        .into_iter()
                        .flatten()
                        .cloned(),
                );
                ids.extend(
                    self.routes_by_parent
                        .get(&(ParentKind::Service, svc.clone()))
                        .into_iter()
                        .flatten()
                        .cloned(),
                );
            }
        }
        let mut new = Vec::new();
        for id in ids {
            let Some(route) = self.routes.get(&id) else {
                continue;
            };
            match judge(&id, route, &service_exists) {
                Some(p) => {
                    if self.problems.get(&id) != Some(&p) {
                        new.push(p.clone());
                    }
                    self.problems.insert(id, p);
                }
                None => {
                    self.problems.remove(&id);
                }
            }
        }
        new
    }

    pub(crate) fn is_valid(&self, id: &RouteId) -> bool {
        !self.problems.contains_key(id)
    }
}

fn remove_name(map: &mut HashMap<Arc<str>, BTreeSet<Arc<str>>>, key: &ObjectKey) {
    if let Some(names) = map.get_mut(&key.namespace) {
        names.remove(&key.name);
        if names.is_empty() {
            map.remove(&key.namespace);
        }
    }
}

/// Everything whose answer a route's presence can change.
fn touch_route(route: &Route, ch: &mut Changes) {
    for p in &route.parents {
        match p.kind {
            ParentKind::Service => {
                ch.outbound_services.insert(p.key.clone());
            }
            ParentKind::Server => {
                ch.policy_namespaces.insert(p.key.namespace.clone());
            }
        }
    }
}

/// The relational checks: outbound routes need their Services.
fn judge(
    id: &RouteId,
    route: &Route,
    service_exists: &impl Fn(&ObjectKey) -> bool,
) -> Option<RouteProblem> {
    let service_parents: Vec<_> = route
        .parents
        .iter()
        .filter(|p| p.kind == ParentKind::Service)
        .collect();
    if service_parents.is_empty() {
        return None;
    }
    if let Some(p) = service_parents.iter().find(|p| !service_exists(&p.key)) {
        return Some(RouteProblem {
            route: id.clone(),
            reason: "parent_not_found",
            detail: format!("parent Service {} does not exist", p.key),
        });
    }
    if let Some(b) = route
        .rules
        .iter()
        .flat_map(|r| &r.backends)
        .find(|b| !service_exists(&b.service))
    {
        return Some(RouteProblem {
            route: id.clone(),
            reason: "backend_not_found",
            detail: format!("backend Service {} does not exist", b.service),
        });
    }
    None
}

/// Gateway API's order among routes: oldest first, then by name.
pub(crate) fn route_order(a: &Route, b: &Route) -> std::cmp::Ordering {
    match (&a.creation_timestamp, &b.creation_timestamp) {
        (Some(x), Some(y)) => x.cmp(y).then_with(|| a.key.cmp(&b.key)),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => a.key.cmp(&b.key),
    }
}
