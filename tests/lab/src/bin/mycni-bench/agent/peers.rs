//! The peer Nodes the bench creates: a podCIDR, VTEP MAC and host IP each,
//! and, with `--full-nodes`, every field a kubelet sets.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use anyhow::Result;
use k8s_openapi::api::core::v1::Node;
use mycni_apiserver::node;
use mycni_common::net::Mac;
use serde_json::{Value, json};

/// Peer `i` (0-based): podCIDR outside 10.244.0.0/16 (the lab's own
/// nodes), unique locally administered MAC, an unused host IP.
pub(super) struct Peer {
    pub(super) name: String,
    pub(super) cidr: String,
    pub(super) gw: Ipv4Addr,
    pub(super) mac: Mac,
    pub(super) host_ip: Ipv4Addr,
}

pub(super) fn peer(i: usize) -> Peer {
    let gw = Ipv4Addr::new(10, 1 + (i / 256) as u8, (i % 256) as u8, 0);
    let k = i + 1;
    Peer {
        name: format!("peer-{:05}", i + 1),
        cidr: format!("{gw}/24"),
        gw,
        mac: Mac([0x02, 0, 0, (k >> 16) as u8, (k >> 8) as u8, k as u8]),
        host_ip: Ipv4Addr::new(192, 168, 100 + (i / 250) as u8, 1 + (i % 250) as u8),
    }
}

pub(super) fn peer_node(p: &Peer, full: bool) -> Result<Node> {
    let mut n = node(&p.name, Some(&p.cidr));
    n.metadata.annotations = Some(BTreeMap::from([
        ("mycni.dev/vtep-mac".to_string(), p.mac.to_string()),
        ("mycni.dev/host-ip".to_string(), p.host_ip.to_string()),
    ]));
    if full {
        kubelet_fields(&mut n, p)?;
    }
    Ok(n)
}

/// What a kubelet-managed Node carries besides mycni's fields (about
/// 10 KB of JSON): labels, status with 25 images, conditions and
/// nodeInfo, and managedFields, so the agent's memory is measured
/// against Nodes as a real cluster has them.
fn kubelet_fields(n: &mut Node, p: &Peer) -> Result<()> {
    let name = &p.name;
    n.metadata.labels = Some(serde_json::from_value(json!({
        "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": "m5.xlarge",
        "topology.kubernetes.io/region": "eu-west-1", "topology.kubernetes.io/zone": "eu-west-1a",
    }))?);
    let ann = n.metadata.annotations.get_or_insert_default();
    ann.insert("node.alpha.kubernetes.io/ttl".into(), "0".into());
    ann.insert(
        "volumes.kubernetes.io/controller-managed-attach-detach".into(),
        "true".into(),
    );
    let images: Vec<Value> = (0..25)
        .map(|j| {
            json!({"names": [
                format!("registry.k8s.io/project/image-{j}@sha256:{:064x}", j * 7919 + 1),
                format!("registry.k8s.io/project/image-{j}:v1.{j}.0"),
            ], "sizeBytes": 12_345_678 + j})
        })
        .collect();
    let cond = |t: &str, st: &str, r: &str, m: &str| {
        json!({"type": t, "status": st, "reason": r, "message": m,
            "lastHeartbeatTime": "2026-08-01T10:00:00Z",
            "lastTransitionTime": "2026-08-01T10:00:00Z"})
    };
    n.status = Some(serde_json::from_value(json!({
        "capacity": {"cpu": "4", "ephemeral-storage": "81106868Ki", "hugepages-2Mi": "0",
            "memory": "16069436Ki", "pods": "110"},
        "allocatable": {"cpu": "4", "ephemeral-storage": "74748089130", "hugepages-2Mi": "0",
            "memory": "15967036Ki", "pods": "110"},
        "conditions": [
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            cond("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
            cond("NetworkUnavailable", "False", "MycniIsUp", "mycni-agent has the overlay up on this node"),
        ],
        "addresses": [{"type": "InternalIP", "address": p.host_ip.to_string()},
            {"type": "Hostname", "address": name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {"machineID": "ec2a3b4c5d6e7f8091a2b3c4d5e6f708",
            "systemUUID": "ec2a3b4c-5d6e-7f80-91a2-b3c4d5e6f708",
            "bootID": "4f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b",
            "kernelVersion": "6.1.0-18-cloud-amd64", "osImage": "Debian GNU/Linux 12 (bookworm)",
            "containerRuntimeVersion": "containerd://1.7.13", "kubeletVersion": "v1.33.1",
            "kubeProxyVersion": "v1.33.1", "operatingSystem": "linux", "architecture": "amd64"},
        "images": images,
    }))?);
    let fields = json!({
        "f:metadata": {"f:annotations": {".": {}, "f:node.alpha.kubernetes.io/ttl": {},
            "f:volumes.kubernetes.io/controller-managed-attach-detach": {}},
            "f:labels": {".": {}, "f:beta.kubernetes.io/arch": {}, "f:beta.kubernetes.io/os": {},
                "f:kubernetes.io/arch": {}, "f:kubernetes.io/hostname": {}, "f:kubernetes.io/os": {}}},
        "f:status": {"f:conditions": {
            "k:{\"type\":\"DiskPressure\"}": {"f:lastHeartbeatTime": {}},
            "k:{\"type\":\"MemoryPressure\"}": {"f:lastHeartbeatTime": {}},
            "k:{\"type\":\"PIDPressure\"}": {"f:lastHeartbeatTime": {}},
            "k:{\"type\":\"Ready\"}": {"f:lastHeartbeatTime": {}, "f:message": {},
                "f:reason": {}, "f:status": {}}},
            "f:images": {}, "f:nodeInfo": {"f:bootID": {}}},
    });
    let managed: Vec<Value> = [
        "kubelet",
        "kube-controller-manager",
        "mycni-agent",
        "kubectl",
    ]
    .iter()
    .map(|m| {
        json!({"manager": m, "operation": "Update", "apiVersion": "v1",
                "time": "2026-08-01T10:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": fields})
    })
    .collect();
    n.metadata.managed_fields = Some(serde_json::from_value(Value::Array(managed))?);
    Ok(())
}
