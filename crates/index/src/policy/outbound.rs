//! What `OutboundPolicies` answers for one target.

use super::{route_order, RouteId, MAX_ROUTES_PER_PARENT};
use crate::{
    resource::{FailureAccrual, InvalidObject, ObjectKey, ParentKind, Route, RouteApi},
    Endpoint, Index, Target,
};
use std::{net::SocketAddr, sync::Arc};

#[derive(Clone, Debug, PartialEq)]
pub enum OutboundView {
    /// A Service port: its routes, balanced over its endpoints.
    Service(ServiceOutbound),
    /// An address no Service owns: forwarded to as is, with what is known
    /// of the pod behind it (its mesh identity).
    Forward {
        addr: SocketAddr,
        endpoint: Option<Endpoint>,
        opaque: bool,
    },
    /// A Service name the index does not know.
    UnknownService,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ServiceOutbound {
    pub service: ObjectKey,
    pub port: u16,
    pub opaque: bool,
    /// Valid HTTP routes attached to this port, in Gateway API order.
    pub http_routes: Vec<Arc<Route>>,
    /// Valid gRPC routes attached to this port, in Gateway API order.
    pub grpc_routes: Vec<Arc<Route>>,
    /// The Service's failure accrual; `Err`: its annotations cannot be
    /// read (accrual is off).
    pub failure_accrual: Result<Option<FailureAccrual>, InvalidObject>,
}

impl Index {
    /// What `OutboundPolicies.Watch` answers for `target`.
    pub fn outbound_policy(&self, target: &Target) -> OutboundView {
        let (service, port) = match target {
            Target::Service { service, port } => (service.clone(), *port),
            Target::Addr(addr) => match self.service_for_ip(addr.ip()) {
                Some(svc) => (svc.clone(), addr.port()),
                None => {
                    return match self.pod_for_addr(*addr) {
                        Some(pod) => {
                            let endpoint = self.pod_endpoint(pod, *addr);
                            OutboundView::Forward {
                                addr: *addr,
                                opaque: endpoint.opaque,
                                endpoint: Some(endpoint),
                            }
                        }
                        None => OutboundView::Forward {
                            addr: *addr,
                            endpoint: None,
                            opaque: self
                                .config
                                .default_opaque_ports
                                .contains(addr.port(), |_| None),
                        },
                    }
                }
            },
        };
        let Some(svc) = self.service(&service) else {
            return OutboundView::UnknownService;
        };
        let opaque = self.service_port_is_opaque(svc, port);
        let failure_accrual = svc.failure_accrual();
        let mut http_routes = Vec::new();
        let mut grpc_routes = Vec::new();
        let ids = self
            .policy
            .routes_by_parent
            .get(&(ParentKind::Service, service.clone()))
            .into_iter()
            .flatten();
        for id in ids {
            let Some(route) = self.policy.route(id) else {
                continue;
            };
            if !self.policy.is_valid(id) || !attaches(route, &service, port) {
                continue;
            }
            match route.api {
                RouteApi::GatewayGrpc => grpc_routes.push(route.clone()),
                RouteApi::GatewayHttp | RouteApi::LinkerdHttp => http_routes.push(route.clone()),
            }
        }
        for routes in [&mut http_routes, &mut grpc_routes] {
            routes.sort_by(|a, b| route_order(a, b));
            routes.truncate(MAX_ROUTES_PER_PARENT);
        }
        OutboundView::Service(ServiceOutbound {
            service,
            port,
            opaque,
            http_routes,
            grpc_routes,
            failure_accrual,
        })
    }

    /// The routes attached to a Service, valid or not (for diagnostics).
    pub fn routes_of_service(&self, service: &ObjectKey) -> Vec<RouteId> {
        self.policy
            .routes_by_parent
            .get(&(ParentKind::Service, service.clone()))
            .into_iter()
            .flatten()
            .cloned()
            .collect()
    }
}

fn attaches(route: &Route, service: &ObjectKey, port: u16) -> bool {
    route.parents.iter().any(|p| {
        p.kind == ParentKind::Service && p.key == *service && p.port.is_none_or(|p| p == port)
    })
}
