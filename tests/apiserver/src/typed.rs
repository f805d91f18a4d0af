//! The fixture's own typed access to every kind, for tests and the lab:
//! create, change (get, modify, put), delete, get and list on k8s_openapi
//! types, and small constructors. The writes go through the same store
//! code as the API's, so they bump the resourceVersion, send watch events
//! and are defaulted and validated as the API would (a refusal comes back
//! as an error naming the server's `Status`).

use std::collections::BTreeMap;

use anyhow::{Result, anyhow};
use k8s_openapi::api::core::v1::{Container, Namespace, Pod, PodIP, PodSpec, PodStatus};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicySpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::ApiServer;
use crate::store::{ApiError, Key, Kind, Target, WriteMode};

fn decoded<T: DeserializeOwned>(s: &crate::store::Stored) -> Result<T> {
    s.typed()
        .ok_or_else(|| anyhow!("stored {} does not decode", s.kind.res().kind))
}

fn to_value<T: Serialize>(obj: &T) -> Result<serde_json::Value, ApiError> {
    serde_json::to_value(obj).map_err(|e| ApiError::internal(&e.to_string()))
}

impl ApiServer {
    /// Creates as `POST` would; the namespace is the object's own.
    pub(crate) fn create_as<T: Serialize + DeserializeOwned>(
        &self,
        kind: Kind,
        obj: &T,
    ) -> Result<T> {
        let value = serde_json::to_value(obj)?;
        let stored = self
            .shared
            .with_state(|st| st.create(kind, None, value, WriteMode::stored(Target::Direct)))?;
        decoded(&stored)
    }

    /// Get, modify, put; a change that changes nothing sends no event.
    pub(crate) fn update_as<T: Serialize + DeserializeOwned>(
        &self,
        key: &Key,
        f: impl FnOnce(&mut T),
    ) -> Result<T> {
        self.write_as(key, Target::Direct, f)
    }

    fn write_as<T: Serialize + DeserializeOwned>(
        &self,
        key: &Key,
        target: Target,
        f: impl FnOnce(&mut T),
    ) -> Result<T> {
        let stored = self.shared.with_state(|st| {
            let mut obj: T = st
                .get(key)?
                .typed()
                .ok_or_else(|| ApiError::internal("stored object does not decode"))?;
            f(&mut obj);
            st.update(key, to_value(&obj)?, WriteMode::stored(target))
        })?;
        decoded(&stored)
    }

    pub(crate) fn delete_key(&self, key: &Key) -> Result<()> {
        self.shared
            .with_state(|st| st.delete(key, None, None, false))?;
        Ok(())
    }

    pub(crate) fn get_as<T: DeserializeOwned>(&self, key: &Key) -> Option<T> {
        self.shared
            .with_state(|st| st.get(key).ok())
            .and_then(|s| s.typed())
    }

    /// A kind's objects in one namespace or all, by namespace and name.
    pub(crate) fn list_as<T: DeserializeOwned>(&self, kind: Kind, ns: Option<&str>) -> Vec<T> {
        let objects = self.shared.with_state(|st| st.objects.clone());
        crate::store::objects_of(&objects, kind, ns)
            .filter_map(|s| s.typed())
            .collect()
    }

    /// Creates a Namespace; the server adds the label
    /// `kubernetes.io/metadata.name=<name>` and `status.phase: Active`.
    pub fn create_namespace(&self, ns: Namespace) -> Result<Namespace> {
        self.create_as(Kind::Namespace, &ns)
    }

    /// Changes a Namespace (get, modify, put; the name label stays).
    pub fn update_namespace(
        &self,
        name: &str,
        f: impl FnOnce(&mut Namespace),
    ) -> Result<Namespace> {
        self.update_as(&Key::new(Kind::Namespace, "", name), f)
    }

    /// Deletes a Namespace and, first, its Pods and NetworkPolicies.
    pub fn delete_namespace(&self, name: &str) -> Result<()> {
        self.delete_key(&Key::new(Kind::Namespace, "", name))
    }

    pub fn get_namespace(&self, name: &str) -> Option<Namespace> {
        self.get_as(&Key::new(Kind::Namespace, "", name))
    }

    /// Every Namespace, by name (the [`crate::DEFAULT_NAMESPACES`] included).
    pub fn namespaces(&self) -> Vec<Namespace> {
        self.list_as(Kind::Namespace, None)
    }

    /// Creates a Pod in `metadata.namespace`, which must exist. A Pod
    /// given with a status keeps it (as if its kubelet had written it); one
    /// without starts `Pending`.
    pub fn create_pod(&self, pod: Pod) -> Result<Pod> {
        self.create_as(Kind::Pod, &pod)
    }

    /// Changes a Pod, spec, metadata and status alike.
    pub fn update_pod(&self, ns: &str, name: &str, f: impl FnOnce(&mut Pod)) -> Result<Pod> {
        self.update_as(&Key::new(Kind::Pod, ns, name), f)
    }

    /// Writes a Pod's status as a kubelet does, through `pods/status`:
    /// only the status changes.
    pub fn set_pod_status(&self, ns: &str, name: &str, status: PodStatus) -> Result<Pod> {
        self.write_as(
            &Key::new(Kind::Pod, ns, name),
            Target::Status,
            |p: &mut Pod| p.status = Some(status),
        )
    }

    pub fn delete_pod(&self, ns: &str, name: &str) -> Result<()> {
        self.delete_key(&Key::new(Kind::Pod, ns, name))
    }

    pub fn get_pod(&self, ns: &str, name: &str) -> Option<Pod> {
        self.get_as(&Key::new(Kind::Pod, ns, name))
    }

    /// The Pods of one namespace, or of all (`None`), by namespace and name.
    pub fn pods(&self, ns: Option<&str>) -> Vec<Pod> {
        self.list_as(Kind::Pod, ns)
    }

    /// Creates a NetworkPolicy in `metadata.namespace`, defaulted and
    /// validated as the API server does (an invalid one is refused).
    pub fn create_network_policy(&self, np: NetworkPolicy) -> Result<NetworkPolicy> {
        self.create_as(Kind::NetworkPolicy, &np)
    }

    /// Stores a NetworkPolicy defaulted but not validated, as an older or
    /// broken API server would: how garbage (a bad CIDR, protocol, port
    /// name or selector) reaches an agent. Its JSON may hold what the real
    /// server refuses, as long as it decodes.
    pub fn create_unchecked_network_policy(&self, np: serde_json::Value) -> Result<NetworkPolicy> {
        let stored = self.shared.with_state(|st| {
            st.create(
                Kind::NetworkPolicy,
                None,
                np,
                WriteMode::stored(Target::Unchecked),
            )
        })?;
        decoded(&stored)
    }

    /// Changes a NetworkPolicy; the result is defaulted and validated again.
    pub fn update_network_policy(
        &self,
        ns: &str,
        name: &str,
        f: impl FnOnce(&mut NetworkPolicy),
    ) -> Result<NetworkPolicy> {
        self.update_as(&Key::new(Kind::NetworkPolicy, ns, name), f)
    }

    pub fn delete_network_policy(&self, ns: &str, name: &str) -> Result<()> {
        self.delete_key(&Key::new(Kind::NetworkPolicy, ns, name))
    }

    pub fn get_network_policy(&self, ns: &str, name: &str) -> Option<NetworkPolicy> {
        self.get_as(&Key::new(Kind::NetworkPolicy, ns, name))
    }

    /// The NetworkPolicies of one namespace, or of all (`None`).
    pub fn network_policies(&self, ns: Option<&str>) -> Vec<NetworkPolicy> {
        self.list_as(Kind::NetworkPolicy, ns)
    }
}

fn labels(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
    (!pairs.is_empty()).then(|| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    })
}

/// A Namespace with a name and labels.
pub fn namespace(name: &str, label_pairs: &[(&str, &str)]) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: labels(label_pairs),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    }
}

/// A Pod with labels, one container `c` (image `pause`) and, if given,
/// `spec.nodeName`.
pub fn pod(ns: &str, name: &str, label_pairs: &[(&str, &str)], node_name: Option<&str>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            namespace: Some(ns.to_string()),
            name: Some(name.to_string()),
            labels: labels(label_pairs),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                image: Some("pause".into()),
                ..Container::default()
            }],
            node_name: node_name.map(str::to_string),
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// A running Pod's status as its kubelet writes it: `podIP` the first of
/// `ips` (one per family), `podIPs` all of them.
pub fn pod_status(ips: &[&str], host_ip: Option<&str>) -> PodStatus {
    PodStatus {
        phase: Some("Running".into()),
        pod_ip: ips.first().map(|s| s.to_string()),
        pod_ips: Some(ips.iter().map(|ip| PodIP { ip: ip.to_string() }).collect()),
        host_ip: host_ip.map(str::to_string),
        ..PodStatus::default()
    }
}

/// A NetworkPolicy with a spec (defaulted by the server on create).
pub fn network_policy(ns: &str, name: &str, spec: NetworkPolicySpec) -> NetworkPolicy {
    NetworkPolicy {
        metadata: ObjectMeta {
            namespace: Some(ns.to_string()),
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
    }
}
