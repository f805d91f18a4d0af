//! The upstream model (`test/e2e/network/netpol`): namespaces x, y, z
//! (labels `ns=<n>` and the name label), pods a, b, c (label `pod=<p>`)
//! spread over three nodes, each serving TCP, UDP and SCTP on 80 and 81 with
//! ports named `serve-<port>-<proto>`; plus expected reachability tables
//! (the expected reachability tables are the policy room's tests').

use std::net::IpAddr;

use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::{Value, json};

use super::{
    Cluster, ContainerPort, Key, Labels, NAMESPACE_NAME_LABEL, Namespace, Pod, Policy, Protocol,
    policy_from_k8s,
};

pub const NAMESPACES: [&str; 3] = ["x", "y", "z"];
pub(crate) const PODS: [&str; 3] = ["a", "b", "c"];

pub fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// x/a is 10.244.1.1 and fd00::1:1, z/c is 10.244.3.3 and fd00::3:3.
pub fn pod_ip(ns: &str, pod: &str, v6: bool) -> IpAddr {
    let n = NAMESPACES
        .iter()
        .position(|x| *x == ns)
        .map_or(9, |i| i + 1);
    let p = PODS.iter().position(|x| *x == pod).map_or(9, |i| i + 1);
    let text = if v6 {
        format!("fd00::{n}:{p}")
    } else {
        format!("10.244.{n}.{p}")
    };
    text.parse().expect("fixture address")
}

pub fn serve_ports() -> Vec<ContainerPort> {
    let mut ports = Vec::new();
    for port in [80u16, 81] {
        for (protocol, name) in [
            (Protocol::Tcp, "tcp"),
            (Protocol::Udp, "udp"),
            (Protocol::Sctp, "sctp"),
        ] {
            ports.push(ContainerPort {
                name: Some(format!("serve-{port}-{name}")),
                protocol,
                port,
            });
        }
    }
    ports
}

pub fn model() -> Cluster {
    let mut c = Cluster::default();
    for ns in NAMESPACES {
        c.add_namespace(Namespace {
            name: ns.to_string(),
            labels: labels(&[("ns", ns), (NAMESPACE_NAME_LABEL, ns)]),
        });
        for (i, pod) in PODS.iter().enumerate() {
            c.add_pod(Pod {
                key: Key::new(ns, *pod),
                labels: labels(&[("pod", pod)]),
                ips: vec![pod_ip(ns, pod, false), pod_ip(ns, pod, true)],
                ports: serve_ports(),
                host_network: false,
                node: Some(format!("node-{i}")),
            });
        }
    }
    c
}

/// A policy written as the YAML of the upstream test, through the real
/// converter, which must not drop anything from these valid objects.
pub fn np(ns: &str, name: &str, spec: Value) -> Policy {
    let obj: NetworkPolicy = serde_json::from_value(json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"namespace": ns, "name": name},
        "spec": spec,
    }))
    .expect("fixture policy parses");
    let conv = policy_from_k8s(&obj).expect("fixture policy converts");
    assert!(conv.dropped.is_empty(), "{:?}", conv.dropped);
    conv.value
}

/// The policy bench's cluster: its two pods, `allow-pair` and
/// `policies - 1` decoys, or one policy of `prefixes` ipBlocks.
pub(crate) fn bench_cluster(policies: usize, prefixes: usize) -> Cluster {
    let mut c = Cluster::default();
    for (name, role, ip, node) in [
        ("client", "client", "10.244.1.5", "node1"),
        ("server", "server", "10.244.2.5", "node2"),
    ] {
        c.add_pod(Pod {
            key: Key::new("bench", name),
            labels: labels(&[("role", role)]),
            ips: vec![ip.parse().expect("address")],
            ports: vec![],
            host_network: false,
            node: Some(node.into()),
        });
    }
    let ports = json!([{"port": 5001, "protocol": "TCP"}, {"port": 11111, "protocol": "UDP"}]);
    c.add_policy(np(
        "bench",
        "allow-pair",
        json!({
            "podSelector": {"matchExpressions": [
                {"key": "role", "operator": "In", "values": ["client", "server"]}]},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}], "ports": ports}],
            "egress": [{"to": [{"podSelector": {"matchLabels": {"role": "server"}}}], "ports": ports}],
        }),
    ));
    for i in 1..policies {
        let host = |net: u8| format!("172.{net}.{}.{}/32", (i >> 8) & 0xff, i & 0xff);
        let port = 20_000 + (i % 40_000);
        let spec = match i % 8 {
            0 => json!({
                "podSelector": {"matchLabels": {"role": "server"}},
                "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"ipBlock": {"cidr": host(16)}}], "ports": [{"port": port}]}],
            }),
            4 => json!({
                "podSelector": {"matchLabels": {"role": "client"}},
                "policyTypes": ["Egress"],
                "egress": [{"to": [{"ipBlock": {"cidr": host(17)}}], "ports": [{"port": port}]}],
            }),
            _ => json!({
                "podSelector": {"matchLabels": {"app": format!("decoy-{i}")}},
                "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": format!("t{i}")}}}],
                             "ports": [{"port": port}]}],
            }),
        };
        c.add_policy(np("bench", &format!("decoy-{i:05}"), spec));
    }
    if prefixes > 0 {
        let base = u32::from(std::net::Ipv4Addr::new(100, 64, 0, 0));
        let mut from: Vec<_> = (0..prefixes as u32 - 1)
            .map(|k| json!({"ipBlock": {"cidr": format!("{}/32", std::net::Ipv4Addr::from(base + 2 * k))}}))
            .collect();
        from.push(json!({"ipBlock": {"cidr": "10.244.1.0/24"}}));
        c.add_policy(np(
            "bench",
            "ip-block",
            json!({
                "podSelector": {"matchLabels": {"role": "server"}},
                "policyTypes": ["Ingress"],
                "ingress": [{"from": from, "ports": [{"port": 5001}]}],
            }),
        ));
    }
    c
}
