//! The scheduler: every Pod without `spec.nodeName` goes to the one node.

use serde_json::json;

use super::{name, namespace, terminating, text};
use crate::ApiServer;

pub(super) async fn reconcile(api: &ApiServer, node: &str) {
    for pod in api.list("pods") {
        if !text(&pod, "/spec/nodeName").is_empty() || terminating(&pod) {
            continue;
        }
        let patch = json!({"spec": {"nodeName": node}});
        if let Err(e) = api
            .patch_merge("pods", namespace(&pod), name(&pod), patch)
            .await
        {
            tracing::debug!(pod = name(&pod), error = %e, "scheduler: cannot bind");
        }
    }
}
