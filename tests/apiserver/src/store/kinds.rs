//! Each kind's write rules, the registry strategies of the real server in
//! small: what a body becomes before it is stored (decoding, defaulting,
//! the labels the server sets), what it must satisfy (validation), and
//! what the main resource and the status subresource may each change.

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Map, Value, json};

use super::decode::{decode, encode};
use super::error::ApiError;
use super::object::Target;
use super::resource::Kind;
use super::validation::{self, Causes};
use super::{netpol, node};

/// The label kube-apiserver puts on every Namespace (immutable: the server
/// writes it back on every update), which policies select namespaces by.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

fn meta_checks(causes: &mut Causes, kind: Kind, meta: &ObjectMeta) {
    let name = meta.name.as_deref().unwrap_or_default();
    validation::name(causes, name, kind == Kind::Namespace);
    if let Some(l) = &meta.labels {
        validation::labels(causes, "metadata.labels", l);
    }
}

/// Decodes, defaults and validates a body of `kind`, and returns what the
/// server stores. `old` is the stored version on updates: the Node rules
/// that forbid changes compare against it. A fixture's own update of a
/// Node (`Target::Direct`) skips validation so tests can simulate what the
/// API refuses (a re-created node with another podCIDR).
pub(super) fn admit(
    kind: Kind,
    value: Value,
    old: Option<&Value>,
    target: Target,
) -> Result<Value, ApiError> {
    let mut causes = Causes::default();
    let (name, stored) = match kind {
        Kind::Node => {
            let mut n: Node = decode(kind, value)?;
            node::convert(&mut n);
            if !(target.direct() && old.is_some()) {
                meta_checks(&mut causes, kind, &n.metadata);
                let old: Option<Node> = match old {
                    Some(o) if !target.direct() => Some(decode(kind, o.clone())?),
                    _ => None,
                };
                node::validate(&mut causes, &n, old.as_ref());
            }
            (n.metadata.name.clone(), encode(&n)?)
        }
        Kind::Namespace => {
            let mut ns: Namespace = decode(kind, value)?;
            let name = ns.metadata.name.clone().unwrap_or_default();
            ns.metadata
                .labels
                .get_or_insert_default()
                .insert(NAMESPACE_NAME_LABEL.to_string(), name);
            meta_checks(&mut causes, kind, &ns.metadata);
            (ns.metadata.name.clone(), encode(&ns)?)
        }
        Kind::Pod => {
            let pod: Pod = decode(kind, value)?;
            meta_checks(&mut causes, kind, &pod.metadata);
            let containers = pod.spec.as_ref().map_or(&[][..], |s| &s.containers[..]);
            if containers.is_empty() {
                causes.required("spec.containers", "");
            }
            for (i, c) in containers.iter().enumerate() {
                if c.name.is_empty() {
                    causes.required(&format!("spec.containers[{i}].name"), "");
                }
            }
            (pod.metadata.name.clone(), encode(&pod)?)
        }
        Kind::NetworkPolicy => {
            let mut np: NetworkPolicy = decode(kind, value)?;
            netpol::default(&mut np);
            meta_checks(&mut causes, kind, &np.metadata);
            if target != Target::Unchecked {
                netpol::validate(&mut causes, &np);
            }
            (np.metadata.name.clone(), encode(&np)?)
        }
        Kind::Event => {
            let ev: Event = decode(kind, value)?;
            meta_checks(&mut causes, kind, &ev.metadata);
            if ev.event_time.is_none() {
                causes.required("eventTime", "");
            }
            (ev.metadata.name.clone(), encode(&ev)?)
        }
    };
    causes.into_result(kind, name.as_deref().unwrap_or_default())?;
    Ok(stored)
}

/// `PodQOSClass` as `GetPodQOS` computes it from requests and limits.
fn qos_class(spec: Option<&Value>) -> &'static str {
    let containers: Vec<&Value> = ["containers", "initContainers"]
        .iter()
        .filter_map(|k| spec.and_then(|s| s.get(*k)).and_then(Value::as_array))
        .flatten()
        .collect();
    let res = |c: &Value, which: &str| {
        c.pointer(&format!("/resources/{which}"))
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default()
    };
    if containers
        .iter()
        .all(|c| res(c, "requests").is_empty() && res(c, "limits").is_empty())
    {
        return "BestEffort";
    }
    let guaranteed = containers.iter().all(|c| {
        let (req, lim) = (res(c, "requests"), res(c, "limits"));
        ["cpu", "memory"].iter().all(|r| lim.contains_key(*r))
            && req.iter().all(|(k, v)| lim.get(k) == Some(v))
    });
    if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// What the server sets on a new object besides its metadata: a Pod
/// starts `Pending` with its QoS class (a fixture-made Pod keeps the
/// status it was given, as a kubelet would have written it), a Namespace
/// `Active`. Nodes keep their status, as `nodeStrategy` does.
pub(super) fn on_create(kind: Kind, obj: &mut Map<String, Value>, target: Target) {
    match kind {
        Kind::Pod if !target.direct() || !obj.contains_key("status") => {
            let qos = qos_class(obj.get("spec"));
            obj.insert(
                "status".into(),
                json!({"phase": "Pending", "qosClass": qos}),
            );
        }
        Kind::Namespace => {
            obj.insert("status".into(), json!({"phase": "Active"}));
        }
        _ => {}
    }
}

/// The strategies' `PrepareForUpdate`: a write to the main resource keeps
/// the stored status; a write to `/status` keeps the stored spec (metadata
/// passes, as the real node, pod and namespace status strategies let
/// labels and annotations through), and for Pods the owner references.
pub(super) fn on_update(kind: Kind, obj: &mut Map<String, Value>, old: &Value, target: Target) {
    let keep = |key: &str, obj: &mut Map<String, Value>| match old.get(key) {
        Some(v) => obj.insert(key.into(), v.clone()),
        None => obj.remove(key),
    };
    match target {
        Target::Main if kind.res().status => {
            keep("status", obj);
        }
        Target::Status => {
            keep("spec", obj);
            if kind == Kind::Pod {
                let refs = old.pointer("/metadata/ownerReferences").cloned();
                let meta = super::decode::meta_mut(obj);
                match refs {
                    Some(r) => meta.insert("ownerReferences".into(), r),
                    None => meta.remove("ownerReferences"),
                };
            }
        }
        Target::Main | Target::Direct | Target::Unchecked => {}
    }
}
