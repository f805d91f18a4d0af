//! The cluster as the agent's caches hold it, and NetworkPolicy's meaning
//! over it: what the policy room enforces and the flows room explains.
//! Pure functions, no kernel, no watch (the agent feeds a `Cluster` from
//! its caches):
//! - `model`: the trimmed, validated inputs (Pod, Namespace, Policy).
//! - `convert`: k8s-openapi objects -> model; garbage becomes a rejected
//!   rule or policy with a reason, never a panic.
//! - `eval`: the reference evaluator, `allowed(cluster, src, dst, proto,
//!   port)`, written for clarity; it is the oracle of the tests.
//! - `view`: the watched Pods and Namespaces (and NetworkPolicies, when
//!   they are enforced) published as one `Cluster` to whoever reads it.

pub mod convert;
pub mod eval;
pub mod model;
pub mod view;

#[cfg(test)]
pub(crate) mod fixture;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

#[cfg(test)]
pub(crate) use convert::{Problem, ProblemKind};
pub use convert::{namespace_from_k8s, pod_from_k8s, policy_from_k8s};
pub use eval::{Endpoint, Verdict, allowed};
pub(crate) use eval::{Judgement, RuleRef, allowed_with};
pub use model::*;

use crate::verdict::Direction;

/// Everything the semantics depend on: the agent's three caches. The
/// objects are shared with the caches (a pass builds a `Cluster` from
/// them without copying one), so a change is `Arc::make_mut`.
#[derive(Debug, Clone, Default)]
pub struct Cluster {
    pub pods: BTreeMap<Key, Arc<Pod>>,
    pub namespaces: BTreeMap<String, Arc<Namespace>>,
    pub policies: BTreeMap<Key, Arc<Policy>>,
}

impl Cluster {
    pub fn add_pod(&mut self, pod: impl Into<Arc<Pod>>) {
        let pod = pod.into();
        self.pods.insert(pod.key.clone(), pod);
    }

    pub fn add_namespace(&mut self, ns: impl Into<Arc<Namespace>>) {
        let ns = ns.into();
        self.namespaces.insert(ns.name.clone(), ns);
    }

    pub fn add_policy(&mut self, policy: impl Into<Arc<Policy>>) {
        let policy = policy.into();
        self.policies.insert(policy.key.clone(), policy);
    }

    /// Labels of a namespace. One the cache has not seen yet still carries
    /// the name label, which the API server sets on every namespace: a
    /// selector on it must not flap while the namespace watch catches up.
    pub fn namespace_labels(&self, name: &str) -> Cow<'_, Labels> {
        match self.namespaces.get(name) {
            Some(ns) => Cow::Borrowed(&ns.labels),
            None => Cow::Owned(Labels::from([(
                NAMESPACE_NAME_LABEL.to_string(),
                name.to_string(),
            )])),
        }
    }

    /// The pod-network pod owning `ip` (hostNetwork pods share the node's
    /// address, so they own nothing here).
    pub(crate) fn pod_by_ip(&self, ip: IpAddr) -> Option<&Pod> {
        self.pods
            .values()
            .map(|p| &**p)
            .find(|p| !p.host_network && p.ips.contains(&ip))
    }

    /// The policies isolating `pod` in `direction`; their rules' union is
    /// what it allows (none: the direction is open).
    pub(crate) fn policies_isolating<'a>(
        &'a self,
        pod: &'a Pod,
        direction: Direction,
    ) -> Vec<&'a Policy> {
        self.policies_selecting(pod)
            .filter(|p| p.isolates(direction))
            .collect()
    }

    /// Every rule of `policies` for `direction`, named as verdicts name it.
    pub(crate) fn rules_of<'a>(
        policies: &'a [&'a Policy],
        direction: Direction,
    ) -> impl Iterator<Item = (RuleRef, &'a Policy, &'a Rule)> + 'a {
        policies.iter().flat_map(move |policy| {
            policy.rules(direction).iter().map(move |(index, rule)| {
                let at = RuleRef {
                    policy: policy.key.clone(),
                    direction,
                    index: *index,
                };
                (at, *policy, rule)
            })
        })
    }

    /// [`Self::policies_isolating`], shared: for a caller that keeps them.
    pub(crate) fn policies_isolating_shared(
        &self,
        pod: &Pod,
        direction: Direction,
    ) -> Vec<Arc<Policy>> {
        self.selecting(pod)
            .filter(|p| p.isolates(direction))
            .cloned()
            .collect()
    }

    /// Policies of `pod`'s namespace whose podSelector selects it, in key
    /// order. hostNetwork pods are never selected.
    pub(crate) fn policies_selecting<'a>(
        &'a self,
        pod: &'a Pod,
    ) -> impl Iterator<Item = &'a Policy> + 'a {
        self.selecting(pod).map(|p| &**p)
    }

    fn selecting<'a>(&'a self, pod: &'a Pod) -> impl Iterator<Item = &'a Arc<Policy>> + 'a {
        // Keys order by namespace first: its policies are one range.
        let namespace = &pod.key.namespace;
        self.policies
            .range(Key::new(namespace.as_str(), "")..)
            .map(|(_, p)| p)
            .take_while(move |p| p.key.namespace == *namespace)
            .filter(move |p| !pod.host_network && p.pod_selector.matches(&pod.labels))
    }
}
