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

use super::api::watch_converted;
use super::cache::Cache;
use super::kind::Kind;

/// What each kind is kept as: the policy room's conversions (the watch
/// does not know the model; `cluster::convert::WATCHED`).
pub struct Converters<P, N, Q> {
    pub pod: fn(&core::Pod) -> P,
    pub namespace: fn(&core::Namespace) -> N,
    pub policy: fn(&NetworkPolicy) -> Q,
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
pub struct PolicySnapshot<P, N, Q> {
    pub pods: Vec<Arc<P>>,
    pub namespaces: Vec<Arc<N>>,
    pub policies: Vec<Arc<Q>>,
}

pub struct PolicyWatch<P, N, Q> {
    pods: Cache<P>,
    namespaces: Cache<N>,
    policies: Cache<Q>,
    /// Raised by every event of the three, and once each list is complete.
    pub changed: Arc<Notify>,
}

impl<P, N, Q> PolicyWatch<P, N, Q>
where
    P: Send + Sync + 'static,
    N: Send + Sync + 'static,
    Q: Send + Sync + 'static,
{
    /// Starts the three watches; returns once every initial list is
    /// complete, so that nothing is decided on a partial picture (a policy
    /// seen before the pods it allows would deny them).
    pub async fn start(
        client: kube::Client,
        metrics: &Arc<Metrics>,
        convert: Converters<P, N, Q>,
    ) -> Self {
        let changed = Arc::new(Notify::new());
        let (pods, namespaces, policies) = tokio::join!(
            watch_converted(
                Api::all(client.clone()),
                &PODS,
                convert.pod,
                metrics,
                &changed
            ),
            watch_converted(
                Api::all(client.clone()),
                &NAMESPACES,
                convert.namespace,
                metrics,
                &changed
            ),
            watch_converted(
                Api::all(client),
                &POLICIES,
                convert.policy,
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

    pub fn snapshot(&self) -> PolicySnapshot<P, N, Q> {
        PolicySnapshot {
            pods: self.pods.state(),
            namespaces: self.namespaces.state(),
            policies: self.policies.state(),
        }
    }
}
