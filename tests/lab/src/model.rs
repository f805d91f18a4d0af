//! The lab's contract with NetworkPolicy tests: the upstream `Netpol`
//! model (`test/e2e/network/netpol`) and the Kubernetes objects that
//! describe it.
//!
//! A model lab (`Spec::model`: 3 nodes x 3 pods, what `cargo xtask lab`
//! brings up) has namespaces `x`, `y`, `z` (labels `ns=<name>` and
//! `kubernetes.io/metadata.name=<name>`), each with pods `a`, `b`, `c`
//! (label `pod=<name>`). Namespace `k` (x=0) holds pod `p` (a=0) on node
//! `(k + p) % 3 + 1`, so every node has one pod of each namespace and both
//! same-node and cross-node pairs exist; node `i`'s `mycni-node<i>-pod<j>`
//! is the pod of the `j`-th namespace. Every pod serves TCP (an echo) and
//! UDP (an echo) on 80 and 81 over both families, its container ports named
//! `serve-<port>-<proto>`, and has a Service whose ClusterIP
//! ([`SERVICE_CIDR`], [`SERVICE_CIDR6`]) the nodes DNAT to it as kube-proxy
//! does. Pod objects carry `spec.nodeName` and, after the plugin's ADD,
//! `status.podIPs` as a kubelet writes them; the plugin gets
//! `K8S_POD_NAMESPACE=<ns>;K8S_POD_NAME=<name>`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::{Result, bail};
use serde_json::{Value, json};

use crate::Pod;

pub const NAMESPACES: [&str; 3] = ["x", "y", "z"];
pub const POD_NAMES: [&str; 3] = ["a", "b", "c"];
/// The label every namespace carries (set by the API server, immutable).
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";
/// The ports every model pod serves, on TCP and UDP.
pub const SERVE_PORTS: [u16; 2] = [80, 81];

/// The Services' ranges, outside the cluster CIDR as a real cluster's
/// service range is (10.96.0.0/12 is kubeadm's default; the lab takes a
/// /16 of it), so only the nodes' DNAT rules give them meaning.
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
pub const SERVICE_CIDR6: &str = "fd00:10:96::/112";

/// A transport protocol of a container port or a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proto {
    Tcp,
    Udp,
    Sctp,
}

impl Proto {
    /// As the API spells it.
    pub fn api(self) -> &'static str {
        match self {
            Proto::Tcp => "TCP",
            Proto::Udp => "UDP",
            Proto::Sctp => "SCTP",
        }
    }

    /// As port names and nftables spell it.
    pub fn lower(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
            Proto::Sctp => "sctp",
        }
    }

    pub fn parse(s: &str) -> Option<Proto> {
        match s.to_ascii_lowercase().as_str() {
            "tcp" => Some(Proto::Tcp),
            "udp" => Some(Proto::Udp),
            "sctp" => Some(Proto::Sctp),
            _ => None,
        }
    }
}

/// A container port: a name, a number, a protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerPort {
    pub name: String,
    pub port: u16,
    pub proto: Proto,
}

impl ContainerPort {
    /// `serve-80-tcp=8080/TCP` (the pod-add command's `--port`), or
    /// `NAME=PORT` (TCP).
    pub fn parse(s: &str) -> Result<ContainerPort> {
        let Some((name, rest)) = s.split_once('=') else {
            bail!("{s:?}: want NAME=PORT[/PROTOCOL]");
        };
        let (port, proto) = rest.split_once('/').unwrap_or((rest, "TCP"));
        let Some(proto) = Proto::parse(proto) else {
            bail!("{s:?}: protocol {proto:?} is not TCP, UDP or SCTP");
        };
        Ok(ContainerPort {
            name: name.to_string(),
            port: port.parse().map_err(|e| anyhow::anyhow!("{s:?}: {e}"))?,
            proto,
        })
    }

    pub fn to_json(&self) -> Value {
        json!({"name": self.name, "containerPort": self.port, "protocol": self.proto.api()})
    }
}

/// The name of the port serving `port`/`proto` in the model.
pub fn serve_port_name(port: u16, proto: Proto) -> String {
    format!("serve-{port}-{}", proto.lower())
}

/// A model pod's container ports: 80 and 81 on TCP and UDP.
pub fn serve_ports() -> Vec<ContainerPort> {
    let mut out = Vec::new();
    for port in SERVE_PORTS {
        for proto in [Proto::Tcp, Proto::Udp] {
            out.push(ContainerPort {
                name: serve_port_name(port, proto),
                port,
                proto,
            });
        }
    }
    out
}

/// A pod's Kubernetes side: who it is, its labels and ports, its Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubePod {
    pub namespace: String,
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub ports: Vec<ContainerPort>,
    /// Its Service's ClusterIPs (none in an IPv6-only lab for IPv4, and
    /// the other way round).
    pub cluster_ip: Option<Ipv4Addr>,
    pub cluster_ip6: Option<Ipv6Addr>,
}

impl KubePod {
    /// `x/a`.
    pub fn label(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The number the container port named `name` with `proto` has.
    pub fn resolve(&self, name: &str, proto: Proto) -> Option<u16> {
        self.ports
            .iter()
            .find(|p| p.name == name && p.proto == proto)
            .map(|p| p.port)
    }

    /// The ClusterIP of family of `like`.
    pub fn cluster_ip_like(&self, like: IpAddr) -> Option<IpAddr> {
        match like {
            IpAddr::V4(_) => self.cluster_ip.map(IpAddr::V4),
            IpAddr::V6(_) => self.cluster_ip6.map(IpAddr::V6),
        }
    }
}

/// The node (1-based) model pod `name` of namespace `ns` runs on.
pub fn model_node(ns_index: usize, pod_index: usize) -> usize {
    (ns_index + pod_index) % 3 + 1
}

/// Which model pod node `i`'s `j`-th pod (both 1-based) is:
/// (namespace index, pod index).
pub fn model_slot(i: usize, j: usize) -> (usize, usize) {
    let k = j - 1;
    // model_node(k, p) == i  <=>  p == (i - 1 - k) mod 3
    (k, (i + 2 * 3 - 1 - k) % 3)
}

/// The Service ordinal `n` (0-based over the lab's pods)'s ClusterIPs.
pub fn cluster_ips(n: usize) -> (Ipv4Addr, Ipv6Addr) {
    let host = 10 + n as u16;
    (
        Ipv4Addr::new(10, 96, (host >> 8) as u8, host as u8),
        Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, host),
    )
}

/// Node `i`'s `j`-th pod of a model lab.
pub fn model_pod(i: usize, j: usize) -> KubePod {
    let (k, p) = model_slot(i, j);
    let (v4, v6) = cluster_ips(k * 3 + p);
    KubePod {
        namespace: NAMESPACES[k].to_string(),
        name: POD_NAMES[p].to_string(),
        labels: vec![("pod".to_string(), POD_NAMES[p].to_string())],
        ports: serve_ports(),
        cluster_ip: Some(v4),
        cluster_ip6: Some(v6),
    }
}

/// A model namespace's object.
pub fn namespace_object(name: &str, labels: &[(String, String)]) -> Value {
    let labels: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    json!({"apiVersion": "v1", "kind": "Namespace",
           "metadata": {"name": name, "labels": labels}})
}

/// A model namespace's labels.
pub fn namespace_labels(name: &str) -> Vec<(String, String)> {
    vec![
        ("ns".to_string(), name.to_string()),
        (NAMESPACE_NAME_LABEL.to_string(), name.to_string()),
    ]
}

/// The Pod object a kubelet's pod has before its sandbox runs: what the
/// scheduler wrote (`spec.nodeName`), the containers' named ports.
pub fn pod_object(k: &KubePod, node_name: &str) -> Value {
    let labels: serde_json::Map<String, Value> = k
        .labels
        .iter()
        .map(|(a, b)| (a.clone(), Value::String(b.clone())))
        .collect();
    let ports: Vec<Value> = k.ports.iter().map(ContainerPort::to_json).collect();
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"namespace": k.namespace, "name": k.name, "labels": labels},
           "spec": {"nodeName": node_name,
                    "containers": [{"name": "serve", "image": "mycni-lab", "ports": ports}]}})
}

/// The status a kubelet writes once the sandbox has its addresses.
pub fn pod_status(pod: &Pod) -> Value {
    let ips: Vec<Value> = pod
        .addresses()
        .split_whitespace()
        .map(|ip| json!({"ip": ip}))
        .collect();
    let first = ips.first().map(|v| v["ip"].clone()).unwrap_or(Value::Null);
    // Ready, as a kubelet reports a started container that has no
    // readiness probe (kubectl's READY column reads containerStatuses).
    json!({"status": {"phase": "Running", "podIP": first, "podIPs": ips,
                      "conditions": [{"type": "Ready", "status": "True"},
                                     {"type": "ContainersReady", "status": "True"}],
                      "containerStatuses": [{"name": "serve", "ready": true, "started": true,
                                             "restartCount": 0, "image": "mycni-lab",
                                             "imageID": "", "state": {"running": {}}}]}})
}

/// The Service object in front of a pod (only created where the fixture
/// serves Services): every named port of the pod's, by name, as a
/// Deployment's Service usually targets them.
pub fn service_object(k: &KubePod) -> Value {
    let ports: Vec<Value> = k
        .ports
        .iter()
        .map(|p| {
            json!({"name": p.name, "port": nominal_port(&p.name).unwrap_or(p.port),
                        "protocol": p.proto.api(), "targetPort": p.name})
        })
        .collect();
    let ips: Vec<String> = k
        .cluster_ip
        .map(|a| a.to_string())
        .into_iter()
        .chain(k.cluster_ip6.map(|a| a.to_string()))
        .collect();
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"namespace": k.namespace, "name": k.name},
           "spec": {"selector": {"pod": k.name}, "clusterIP": ips.first(), "clusterIPs": ips,
                    "ports": ports}})
}

/// The port a `serve-<port>-<proto>` name stands for (its Service port).
pub fn nominal_port(name: &str) -> Option<u16> {
    name.strip_prefix("serve-")?.split('-').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_node_has_one_pod_of_each_namespace() {
        let mut seen = std::collections::BTreeSet::new();
        for i in 1..=3 {
            let mut nss = Vec::new();
            for j in 1..=3 {
                let (k, p) = model_slot(i, j);
                assert_eq!(model_node(k, p), i, "node {i} pod {j}");
                nss.push(NAMESPACES[k]);
                seen.insert((k, p));
            }
            assert_eq!(nss, ["x", "y", "z"]);
        }
        assert_eq!(seen.len(), 9);
        assert_eq!(model_pod(1, 1).label(), "x/a");
        assert_eq!(model_pod(2, 1).label(), "x/b");
        assert_eq!(model_pod(1, 2).label(), "y/c");
    }

    #[test]
    fn ports_and_services() {
        let p = ContainerPort::parse("serve-80-tcp=8080/TCP").ok();
        assert_eq!(p.map(|p| (p.port, p.proto)), Some((8080, Proto::Tcp)));
        assert!(ContainerPort::parse("x=1/ICMP").is_err());
        assert!(ContainerPort::parse("x").is_err());
        assert_eq!(
            ContainerPort::parse("dns=53/udp").map(|p| p.proto).ok(),
            Some(Proto::Udp)
        );
        assert_eq!(nominal_port("serve-81-udp"), Some(81));
        let (v4, v6) = cluster_ips(0);
        assert_eq!(v4.to_string(), "10.96.0.10");
        assert_eq!(v6.to_string(), "fd00:10:96::a");
        assert_eq!(cluster_ips(300).0.to_string(), "10.96.1.54");
        let s = service_object(&model_pod(1, 1));
        assert_eq!(s["spec"]["ports"][0]["targetPort"], "serve-80-tcp");
        assert_eq!(s["spec"]["clusterIPs"][1], "fd00:10:96::a");
    }
}
