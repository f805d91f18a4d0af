//! The server-side Table `kubectl get` prints, with the real server's
//! columns for Nodes.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};

use crate::store::{Stored, now_secs};

/// `kubectl`'s age format.
fn human_age(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..120 => format!("{s}s"),
        120..600 => format!("{}m{}s", s / 60, s % 60),
        600..10_800 => format!("{}m", s / 60),
        10_800..28_800 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        28_800..172_800 => format!("{}h", s / 3600),
        172_800..691_200 => format!("{}d{}h", s / 86_400, (s % 86_400) / 3600),
        691_200..63_072_000 => format!("{}d", s / 86_400),
        _ => format!("{}y{}d", s / 31_536_000, (s % 31_536_000) / 86_400),
    }
}

fn node_row(node: &Node, obj: &Stored, include: Option<&str>) -> Value {
    let status = node.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
    let mut state = match ready.map(|c| c.status.as_str()) {
        Some("True") => "Ready".to_string(),
        Some("False") => "NotReady".to_string(),
        _ => "Unknown".to_string(),
    };
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        state.push_str(",SchedulingDisabled");
    }
    let mut roles: Vec<String> = obj
        .labels
        .iter()
        .filter_map(|(k, v)| {
            if let Some(r) = k.strip_prefix("node-role.kubernetes.io/") {
                (!r.is_empty()).then(|| r.to_string())
            } else if k == "kubernetes.io/role" && !v.is_empty() {
                Some(v.clone())
            } else {
                None
            }
        })
        .collect();
    roles.sort();
    roles.dedup();
    let roles = if roles.is_empty() {
        "<none>".to_string()
    } else {
        roles.join(",")
    };
    let age = node
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or("<unknown>".to_string(), |t| {
            human_age(now_secs() - t.0.as_second())
        });
    let info = status.and_then(|s| s.node_info.as_ref());
    let address = |kind: &str| {
        status
            .and_then(|s| s.addresses.as_ref())
            .and_then(|a| a.iter().find(|a| a.type_ == kind))
            .map_or("<none>".to_string(), |a| a.address.clone())
    };
    let or_unknown = |s: Option<&String>| {
        s.filter(|s| !s.is_empty())
            .cloned()
            .unwrap_or_else(|| "<unknown>".to_string())
    };
    let object = match include {
        Some("None") => Value::Null,
        Some("Object") => obj.value.clone(),
        _ => json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.value.get("metadata").cloned().unwrap_or(json!({}))
        }),
    };
    json!({
        "cells": [
            obj.name,
            state,
            roles,
            age,
            info.map(|i| i.kubelet_version.clone()).unwrap_or_default(),
            address("InternalIP"),
            address("ExternalIP"),
            or_unknown(info.map(|i| &i.os_image)),
            or_unknown(info.map(|i| &i.kernel_version)),
            or_unknown(info.map(|i| &i.container_runtime_version)),
        ],
        "object": object
    })
}

/// The `meta.k8s.io/v1` Table the real server renders for Nodes.
pub(super) fn table_of(
    items: &[Arc<Stored>],
    rv: Option<u64>,
    cont: Option<&str>,
    include: Option<&str>,
) -> Value {
    let col = |name: &str, format: &str, priority: u8, description: &str| {
        json!({"name": name, "type": "string", "format": format,
               "description": description, "priority": priority})
    };
    let rows: Vec<Value> = items
        .iter()
        .filter_map(|o| o.node().map(|n| node_row(&n, o, include)))
        .collect();
    let mut meta = json!({});
    if let Value::Object(m) = &mut meta {
        if let Some(rv) = rv {
            m.insert("resourceVersion".into(), json!(rv.to_string()));
        }
        if let Some(c) = cont {
            m.insert("continue".into(), json!(c));
        }
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": [
            col("Name", "name", 0, "Name must be unique within a namespace."),
            col("Status", "", 0, "The status of the node"),
            col("Roles", "", 0, "The roles of the node"),
            col("Age", "", 0, "CreationTimestamp is a timestamp representing the server time when this object was created."),
            col("Version", "", 0, "Kubelet Version reported by the node."),
            col("Internal-IP", "", 1, "List of addresses reachable to the node. Queried from cloud provider, if available."),
            col("External-IP", "", 1, "List of addresses reachable to the node. Queried from cloud provider, if available."),
            col("OS-Image", "", 1, "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy))."),
            col("Kernel-Version", "", 1, "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64)."),
            col("Container-Runtime", "", 1, "ContainerRuntime Version reported by the node through runtime remote API (e.g. containerd://1.4.2)."),
        ],
        "rows": rows
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages() {
        assert_eq!(human_age(5), "5s");
        assert_eq!(human_age(150), "2m30s");
        assert_eq!(human_age(3600), "60m");
        assert_eq!(human_age(5 * 3600 + 60), "5h1m");
        assert_eq!(human_age(3 * 86_400), "3d0h");
    }
}
