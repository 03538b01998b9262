//! The cluster in a box: a [`Node`] (network namespaces on a bridge, kube-proxy's
//! Service rules, the API server reachable from pods over TLS) and a [`Kubelet`] that
//! runs the Pods the [`ApiServer`](crate::ApiServer) holds as processes, writing
//! their status back; [`controllers`] make Pods of Deployments and EndpointSlices.
//!
//! Needs root, iproute2, iptables and util-linux (`setpriv`, `unshare`, `mount`). Only
//! network namespaces it makes are configured; the host's own is never touched.
//!
//! A container is `ip netns exec POD_NETNS unshare --uts /bin/sh -c SCRIPT`: `ip netns
//! exec` gives it a private mount namespace with the pod's hosts file bound over
//! `/etc/hosts`; the script sets the pod's hostname, bind-mounts its volumes at their
//! `mountPath`s (mount points missing on the host are made, and removed once no pod of
//! this process uses them) and `exec`s the argv the image table gives, as
//! `runAsUser`/`runAsGroup` through `setpriv`. A container with
//! `resources.limits.memory` runs in a memory cgroup of that limit (joined by the script
//! before it `exec`s, so the container's every page is charged); past it the kernel
//! kills it and its status says `OOMKilled`, exit code 137, as a kubelet's does.
//!
//! ```no_run
//! # async fn example() {
//! use std::sync::Arc;
//! use ballast_testkit::cluster::{ImageSpec, Images, Kubelet, Node};
//! use ballast_testkit::ApiServer;
//!
//! let api = Arc::new(ApiServer::start().await);
//! let node = Arc::new(Node::start("node-a", api.addr()).expect("root, ip, iptables"));
//! let images = Images::new().with("python", ImageSpec::entrypoint("/usr/bin/python3"));
//! let kubelet = Kubelet::start(api.clone(), node.clone(), images).expect("a kubelet");
//! api.apply(serde_json::json!({
//!     "apiVersion": "v1", "kind": "Pod",
//!     "metadata": {"name": "web", "namespace": "default"},
//!     "spec": {"containers": [{"name": "web", "image": "python",
//!         "args": ["-m", "http.server", "8080"]}]},
//! }));
//! // ... wait on api.wait_until(..) for status.conditions Ready, read kubelet.logs(..)
//! drop(kubelet); // kills every process, removes every namespace
//! # }
//! ```

mod api_endpoint;
pub mod capture;
pub mod controllers;
mod env;
mod images;
mod kube_proxy;
pub mod kubelet;
mod netns;
pub mod node;
mod pod;
mod pod_status;
mod probe;
mod process;
mod resources;
mod volumes;

pub use api_endpoint::{API_SERVER_PORT, KUBERNETES_SERVICE_IP};
pub use images::{ImageSpec, Images};
pub use kubelet::Kubelet;
pub use netns::sweep_stale;
pub(crate) use netns::{kill_listed, left_by_dead_tests};
pub use node::{Node, PodSandbox, ServiceEntry, ServicePort, MAX_PODS};
pub use process::LOG_LIMIT;
pub use volumes::SERVICE_ACCOUNT_PATH;
