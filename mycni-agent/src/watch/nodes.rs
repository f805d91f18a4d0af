//! Nodes: how they are watched, and the part of one the agent reads.

use k8s_openapi::api::core::v1::Node;
use mycni_common::node::NodeView;

use super::kind::Kind;

pub(super) static NODES: Kind<Node> = Kind {
    name: "Node",
    trim: strip_node,
    listed: |nodes| tracing::info!(nodes, "initial Node list complete"),
    event: crate::metrics::Metrics::node_event,
    reachability: true,
};

/// What Node validation (`mycni_common::node`) reads of a Node.
pub(crate) fn node_view(n: &Node) -> NodeView {
    NodeView {
        name: n.metadata.name.clone().unwrap_or_default(),
        pod_cidr: n.spec.as_ref().and_then(|s| s.pod_cidr.clone()),
        pod_cidrs: n
            .spec
            .as_ref()
            .and_then(|s| s.pod_cidrs.clone())
            .unwrap_or_default(),
        annotations: n
            .metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect(),
    }
}

/// Drops everything the agent does not read from a Node before it is cached.
pub(crate) fn strip_node(n: &mut Node) {
    n.metadata.managed_fields = None;
    n.metadata.labels = None;
    n.metadata.owner_references = None;
    n.metadata.finalizers = None;
    if let Some(a) = n.metadata.annotations.as_mut() {
        a.retain(|k, _| k.starts_with("mycni.dev/"));
    }
    n.status = None;
    if let Some(spec) = n.spec.as_mut() {
        spec.taints = None;
        spec.config_source = None;
        spec.provider_id = None;
    }
}
