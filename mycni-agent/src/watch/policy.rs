//! Pods, Namespaces and NetworkPolicies: what the policy room reads, each
//! cached as the model the semantics read, converted once as it arrives
//! (`cache`). Their events raise a signal
//! of their own, so a pod churning never wakes the overlay's pass.

use std::sync::Arc;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::Api;
use tokio::sync::Notify;

use crate::metrics::Metrics;
use crate::policy::{
    Converted, Namespace, Pod, Policy, Problem, namespace_from_k8s, pod_from_k8s, policy_from_k8s,
};

use super::api::watch_converted;
use super::cache::Cache;
use super::kind::Kind;

/// What the room reads of one object: its model, converted once when it
/// arrived, with the parts that could not be read; or why none of it
/// could.
pub type Read<T> = Result<Converted<Arc<T>>, Rejected>;

/// An object the model cannot hold, and its name for the report.
pub struct Rejected {
    pub name: Option<String>,
    pub problem: Problem,
}

fn read<K: kube::Resource, T>(o: &K, c: Result<Converted<T>, Problem>) -> Read<T> {
    match c {
        Ok(c) => Ok(Converted {
            value: Arc::new(c.value),
            dropped: c.dropped,
        }),
        Err(problem) => Err(Rejected {
            name: o.meta().name.clone(),
            problem,
        }),
    }
}

// The typed objects are dropped once converted: trimming them first
// would only copy what the conversion reads anyway.
static PODS: Kind<core::Pod> = Kind {
    name: "Pod",
    trim: |_| {},
    listed: |pods| tracing::info!(pods, "initial Pod list complete"),
    event: |_| {},
    reachability: false,
};

static NAMESPACES: Kind<core::Namespace> = Kind {
    name: "Namespace",
    trim: |_| {},
    listed: |namespaces| tracing::info!(namespaces, "initial Namespace list complete"),
    event: |_| {},
    reachability: false,
};

static POLICIES: Kind<NetworkPolicy> = Kind {
    name: "NetworkPolicy",
    trim: |_| {},
    listed: |policies| tracing::info!(policies, "initial NetworkPolicy list complete"),
    event: |_| {},
    reachability: false,
};

/// What a pass of the policy room reads.
pub struct PolicySnapshot {
    pub pods: Vec<Arc<Read<Pod>>>,
    pub namespaces: Vec<Arc<Read<Namespace>>>,
    pub policies: Vec<Arc<Read<Policy>>>,
}

pub struct PolicyWatch {
    pods: Cache<Read<Pod>>,
    namespaces: Cache<Read<Namespace>>,
    policies: Cache<Read<Policy>>,
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
            watch_converted(
                Api::all(client.clone()),
                &PODS,
                |p| read(p, pod_from_k8s(p)),
                metrics,
                &changed
            ),
            watch_converted(
                Api::all(client.clone()),
                &NAMESPACES,
                |n| read(
                    n,
                    namespace_from_k8s(n).map(|value| Converted {
                        value,
                        dropped: Vec::new()
                    })
                ),
                metrics,
                &changed
            ),
            watch_converted(
                Api::all(client),
                &POLICIES,
                |p| read(p, policy_from_k8s(p)),
                metrics,
                &changed
            ),
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
