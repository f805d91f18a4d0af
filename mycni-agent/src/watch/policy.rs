//! Pods, Namespaces and NetworkPolicies: what the policy room reads, each
//! cached trimmed to what the semantics use. Their events raise a signal
//! of their own, so a pod churning never wakes the overlay's pass.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::Api;
use kube::runtime::reflector::Store;
use tokio::sync::Notify;

use crate::metrics::Metrics;

use super::api::watch;
use super::kind::Kind;

static PODS: Kind<Pod> = Kind {
    name: "Pod",
    trim: trim_pod,
    listed: |pods| tracing::info!(pods, "initial Pod list complete"),
    event: |_| {},
    reachability: false,
};

static NAMESPACES: Kind<Namespace> = Kind {
    name: "Namespace",
    trim: |ns| {
        ns.metadata.managed_fields = None;
        ns.metadata.annotations = None;
        ns.spec = None;
        ns.status = None;
    },
    listed: |namespaces| tracing::info!(namespaces, "initial Namespace list complete"),
    event: |_| {},
    reachability: false,
};

static POLICIES: Kind<NetworkPolicy> = Kind {
    name: "NetworkPolicy",
    // kubectl's last-applied annotation repeats the spec: drop it.
    trim: |np| {
        np.metadata.managed_fields = None;
        np.metadata.annotations = None;
    },
    listed: |policies| tracing::info!(policies, "initial NetworkPolicy list complete"),
    event: |_| {},
    reachability: false,
};

/// What a pass of the policy room reads.
pub struct PolicySnapshot {
    pub pods: Vec<Arc<Pod>>,
    pub namespaces: Vec<Arc<Namespace>>,
    pub policies: Vec<Arc<NetworkPolicy>>,
}

pub struct PolicyWatch {
    pods: Store<Pod>,
    namespaces: Store<Namespace>,
    policies: Store<NetworkPolicy>,
    /// Raised by every event of the three, and once each list is complete.
    pub changed: Arc<Notify>,
}

impl PolicyWatch {
    /// Starts the three watches; returns once every initial list is
    /// complete, so that nothing is decided on a partial picture (a policy
    /// seen before the pods it allows would deny them).
    pub async fn start(client: kube::Client, metrics: &Arc<Metrics>) -> Self {
        let changed = Arc::new(Notify::new());
        let (pods, namespaces, policies) = tokio::join!(
            watch(Api::all(client.clone()), &PODS, metrics, &changed),
            watch(Api::all(client.clone()), &NAMESPACES, metrics, &changed),
            watch(Api::all(client), &POLICIES, metrics, &changed),
        );
        PolicyWatch {
            pods,
            namespaces,
            policies,
            changed,
        }
    }

    pub fn snapshot(&self) -> PolicySnapshot {
        PolicySnapshot {
            pods: self.pods.state(),
            namespaces: self.namespaces.state(),
            policies: self.policies.state(),
        }
    }
}

/// Keeps what `policy::convert::pod_from_k8s` reads: name, namespace,
/// labels, node, hostNetwork, the containers' ports, phase and IPs. A
/// kubelet-maintained Pod weighs ~10-20 KB with its managed fields, env,
/// volumes and conditions; this keeps well under 1 KB of it.
fn trim_pod(p: &mut Pod) {
    p.metadata.managed_fields = None;
    p.metadata.annotations = None;
    p.metadata.owner_references = None;
    p.metadata.finalizers = None;
    if let Some(spec) = p.spec.as_mut() {
        spec.volumes = None;
        spec.init_containers = None;
        spec.ephemeral_containers = None;
        spec.affinity = None;
        spec.tolerations = None;
        spec.topology_spread_constraints = None;
        for c in &mut spec.containers {
            let ports = c.ports.take();
            *c = k8s_openapi::api::core::v1::Container {
                name: std::mem::take(&mut c.name),
                ports,
                ..Default::default()
            };
        }
    }
    if let Some(status) = p.status.as_mut() {
        *status = k8s_openapi::api::core::v1::PodStatus {
            phase: status.phase.take(),
            pod_ip: status.pod_ip.take(),
            pod_ips: status.pod_ips.take(),
            ..Default::default()
        };
    }
}
