//! The kinds the fixture serves, each described once: where it lives in the
//! API, whether it is namespaced, whether it has a status subresource and
//! which field labels its `fieldSelector` accepts. Routing, discovery,
//! OpenAPI, lists and errors all read this table, so a kind is added here
//! and in `kinds.rs` (its write rules), nowhere else.

use serde_json::Value;

/// A kind the fixture serves. The order is the store's key order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Kind {
    Namespace,
    Node,
    Pod,
    NetworkPolicy,
    Event,
}

/// Where a kind lives in the API and what it supports.
#[derive(Debug)]
pub(crate) struct Resource {
    pub(crate) group: &'static str,
    pub(crate) version: &'static str,
    pub(crate) plural: &'static str,
    pub(crate) singular: &'static str,
    pub(crate) kind: &'static str,
    pub(crate) namespaced: bool,
    /// Has a `/status` subresource: the main resource then ignores status
    /// and the subresource ignores spec.
    pub(crate) status: bool,
    pub(crate) short_names: &'static [&'static str],
    pub(crate) storage_hash: &'static str,
    /// Field labels `fieldSelector` takes besides `metadata.name` (and
    /// `metadata.namespace` for namespaced kinds), with the value a missing
    /// field has, as the real server's `*ToSelectableFields` functions.
    pub(crate) fields: &'static [(&'static str, &'static str)],
}

const NAMESPACE: Resource = Resource {
    group: "",
    version: "v1",
    plural: "namespaces",
    singular: "namespace",
    kind: "Namespace",
    namespaced: false,
    status: true,
    short_names: &["ns"],
    storage_hash: "Q3oi5N2YM8M=",
    fields: &[("status.phase", "")],
};

const NODE: Resource = Resource {
    group: "",
    version: "v1",
    plural: "nodes",
    singular: "node",
    kind: "Node",
    namespaced: false,
    status: true,
    short_names: &["no"],
    storage_hash: "XwShjMxG9Fs=",
    fields: &[("spec.unschedulable", "false")],
};

const POD: Resource = Resource {
    group: "",
    version: "v1",
    plural: "pods",
    singular: "pod",
    kind: "Pod",
    namespaced: true,
    status: true,
    short_names: &["po"],
    storage_hash: "xPOwRZ+Yhw8=",
    fields: &[
        ("spec.nodeName", ""),
        ("spec.restartPolicy", ""),
        ("spec.schedulerName", ""),
        ("spec.serviceAccountName", ""),
        ("spec.hostNetwork", "false"),
        ("status.phase", ""),
        ("status.podIP", ""),
        ("status.nominatedNodeName", ""),
    ],
};

const NETWORK_POLICY: Resource = Resource {
    group: "networking.k8s.io",
    version: "v1",
    plural: "networkpolicies",
    singular: "networkpolicy",
    kind: "NetworkPolicy",
    namespaced: true,
    status: false,
    short_names: &["netpol"],
    storage_hash: "YpfwF18m1G8=",
    fields: &[],
};

/// What agents report (mycni's policy drops); stored, listed, watched,
/// never acted on.
const EVENT: Resource = Resource {
    group: "events.k8s.io",
    version: "v1",
    plural: "events",
    singular: "event",
    kind: "Event",
    namespaced: true,
    status: false,
    short_names: &["ev"],
    storage_hash: "r2yiGXH7wu8=",
    fields: &[],
};

impl Kind {
    pub(crate) const ALL: [Kind; 5] = [
        Kind::Namespace,
        Kind::Node,
        Kind::Pod,
        Kind::NetworkPolicy,
        Kind::Event,
    ];

    pub(crate) fn res(self) -> &'static Resource {
        match self {
            Kind::Namespace => &NAMESPACE,
            Kind::Node => &NODE,
            Kind::Pod => &POD,
            Kind::NetworkPolicy => &NETWORK_POLICY,
            Kind::Event => &EVENT,
        }
    }

    /// `v1` or `group/v1`, as `apiVersion` spells it.
    pub(crate) fn api_version(self) -> String {
        let r = self.res();
        if r.group.is_empty() {
            r.version.to_string()
        } else {
            format!("{}/{}", r.group, r.version)
        }
    }

    /// The kind served at `plural` in a group version.
    pub(crate) fn find(group: &str, version: &str, plural: &str) -> Option<Kind> {
        Self::ALL.into_iter().find(|k| {
            let r = k.res();
            r.group == group && r.version == version && r.plural == plural
        })
    }

    /// The kinds of one group version, in discovery order.
    pub(crate) fn of_group(group: &str, version: &str) -> impl Iterator<Item = Kind> {
        let (group, version) = (group.to_string(), version.to_string());
        Self::ALL
            .into_iter()
            .filter(move |k| k.res().group == group && k.res().version == version)
    }

    /// `pods`, `networkpolicies.networking.k8s.io`: the resource as the
    /// server names it in messages.
    pub(crate) fn qualified_resource(self) -> String {
        let r = self.res();
        if r.group.is_empty() {
            r.plural.to_string()
        } else {
            format!("{}.{}", r.plural, r.group)
        }
    }

    /// `Pod`, `NetworkPolicy.networking.k8s.io`: the kind as `Invalid`
    /// messages name it.
    pub(crate) fn qualified_kind(self) -> String {
        let r = self.res();
        if r.group.is_empty() {
            r.kind.to_string()
        } else {
            format!("{}.{}", r.kind, r.group)
        }
    }

    /// The field labels of a stored object, for `fieldSelector`.
    pub(crate) fn field_values(self, value: &Value) -> Vec<(&'static str, String)> {
        let res = self.res();
        let mut out = Vec::with_capacity(res.fields.len() + 2);
        let text = |pointer: &str, default: &str| match value.pointer(pointer) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Bool(b)) => b.to_string(),
            Some(Value::Number(n)) => n.to_string(),
            _ => default.to_string(),
        };
        out.push(("metadata.name", text("/metadata/name", "")));
        if res.namespaced {
            out.push(("metadata.namespace", text("/metadata/namespace", "")));
        }
        for (label, default) in res.fields {
            let pointer = format!("/{}", label.replace('.', "/"));
            out.push((label, text(&pointer, default)));
        }
        out
    }
}
