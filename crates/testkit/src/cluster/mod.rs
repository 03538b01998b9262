//! The cluster in a box: a [`Node`] (network namespaces on a bridge, kube-proxy's
//! Service rules, the API server reachable from pods over TLS) and a [`Kubelet`] that
//! runs the Pods the [`ApiServer`](crate::ApiServer) holds as processes, writing
//! their status back.
//!
//! Needs root, iproute2, iptables and util-linux (`setpriv`, `mount`). Only network
//! namespaces it makes are configured; the host's own is never touched.
//!
//! A container is `ip netns exec POD_NETNS unshare --uts /bin/sh -c SCRIPT`: `ip netns
//! exec` gives it a private mount namespace with the pod's hosts file bound over
//! `/etc/hosts`; the script sets the pod's hostname, bind-mounts its volumes at their `mountPath`s (mount points missing on the
//! host are made, and removed once no pod of this process uses them) and `exec`s the
//! argv the image table gives, as `runAsUser`/`runAsGroup` through `setpriv`.

mod api_endpoint;
pub mod controllers;
mod env;
mod images;
mod kube_proxy;
pub mod kubelet;
mod netns;
pub mod node;
mod pod;
mod probe;
mod process;
mod volumes;

pub use api_endpoint::{API_SERVER_PORT, KUBERNETES_SERVICE_IP};
pub use images::{ImageSpec, Images};
pub use kubelet::Kubelet;
pub use node::{Node, PodSandbox, ServiceEntry, ServicePort, MAX_PODS};
pub use process::LOG_LIMIT;
pub use volumes::SERVICE_ACCOUNT_PATH;
