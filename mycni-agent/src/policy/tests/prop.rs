//! Property test: random clusters and random (valid) policies, every probe
//! judged three ways that must agree: the naive evaluator on the raw JSON,
//! the reference evaluator on the converted model, and the compiled form.
//! The pools are small on purpose so that selectors, named ports, excepts
//! and overlapping policies actually collide.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1 as core;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::fixture::np;
use super::naive::{End, RawLabels, RawPod, World};
use crate::cluster::{
    Cidr, Cluster, Endpoint, IpBlock, Judgement, Key, Protocol, allowed, namespace_from_k8s,
    pod_from_k8s,
};
use crate::policy::{CompiledPod, compile_pod};
use crate::verdict::Direction;

const KEYS: [&str; 2] = ["app", "tier"];
const VALUES: [&str; 2] = ["a", "b"];
const PORTS: [u16; 3] = [80, 81, 8080];

fn labels() -> impl Strategy<Value = RawLabels> {
    prop::collection::btree_map(
        prop::sample::select(KEYS.to_vec()),
        prop::sample::select(VALUES.to_vec()),
        0..=2,
    )
    .prop_map(|m| {
        m.into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    })
}

fn requirement() -> impl Strategy<Value = Value> {
    (
        prop::sample::select(KEYS.to_vec()),
        prop::sample::select(vec!["In", "NotIn", "Exists", "DoesNotExist"]),
        prop::sample::subsequence(VALUES.to_vec(), 1..=2),
    )
        .prop_map(|(key, op, values)| match op {
            "In" | "NotIn" => json!({"key": key, "operator": op, "values": values}),
            _ => json!({"key": key, "operator": op}),
        })
}

fn selector() -> impl Strategy<Value = Value> {
    (labels(), prop::collection::vec(requirement(), 0..=1))
        .prop_map(|(l, e)| json!({"matchLabels": l, "matchExpressions": e}))
}

fn peer() -> impl Strategy<Value = Value> {
    let blocks = vec![
        json!({"cidr": "10.0.0.0/24", "except": ["10.0.0.0/30"]}),
        json!({"cidr": "10.0.0.2/32"}),
        json!({"cidr": "fd00::/64", "except": ["fd00::/126"]}),
        json!({"cidr": "0.0.0.0/0"}),
        json!({"cidr": "192.168.0.0/24"}),
    ];
    prop_oneof![
        selector().prop_map(|s| json!({"podSelector": s})),
        selector().prop_map(|s| json!({"namespaceSelector": s})),
        (selector(), selector())
            .prop_map(|(n, p)| json!({"namespaceSelector": n, "podSelector": p})),
        prop::sample::select(blocks).prop_map(|b| json!({"ipBlock": b})),
    ]
}

fn port() -> impl Strategy<Value = Value> {
    let proto = prop::sample::select(vec!["TCP", "UDP"]);
    prop_oneof![
        Just(json!({})),
        proto.clone().prop_map(|p| json!({"protocol": p})),
        (proto.clone(), prop::sample::select(PORTS.to_vec()))
            .prop_map(|(p, n)| json!({"protocol": p, "port": n})),
        (
            prop::sample::select(PORTS.to_vec()),
            prop::sample::select(vec![0u16, 1, 8000])
        )
            .prop_map(|(n, d)| json!({"port": n, "endPort": n + d})),
        (proto, prop::sample::select(vec!["web", "dns"]))
            .prop_map(|(p, name)| json!({"protocol": p, "port": name})),
    ]
}

fn rule(peers_field: &'static str) -> impl Strategy<Value = Value> {
    (
        prop::option::of(prop::collection::vec(peer(), 0..=2)),
        prop::option::of(prop::collection::vec(port(), 0..=2)),
    )
        .prop_map(move |(peers, ports)| {
            let mut r = serde_json::Map::new();
            if let Some(p) = peers {
                r.insert(peers_field.to_string(), json!(p));
            }
            if let Some(p) = ports {
                r.insert("ports".to_string(), json!(p));
            }
            Value::Object(r)
        })
}

fn policy() -> impl Strategy<Value = (String, Value)> {
    let types = prop::sample::select(vec![
        json!(null),
        json!(["Ingress"]),
        json!(["Egress"]),
        json!(["Ingress", "Egress"]),
    ]);
    (
        prop::sample::select(vec!["x", "y"]),
        selector(),
        types,
        prop::option::of(prop::collection::vec(rule("from"), 0..=2)),
        prop::option::of(prop::collection::vec(rule("to"), 0..=2)),
    )
        .prop_map(|(ns, sel, types, ingress, egress)| {
            let mut spec = json!({"podSelector": sel, "policyTypes": types});
            if let Some(i) = ingress {
                spec["ingress"] = json!(i);
            }
            if let Some(e) = egress {
                spec["egress"] = json!(e);
            }
            (ns.to_string(), spec)
        })
}

fn named(name: &str) -> impl Strategy<Value = Option<(String, String, u16)>> {
    let name = name.to_string();
    prop::option::of((
        prop::sample::select(vec!["TCP", "UDP"]),
        prop::sample::select(PORTS.to_vec()),
    ))
    .prop_map(move |o| o.map(|(p, n)| (name.clone(), p.to_string(), n)))
}

fn world() -> impl Strategy<Value = World> {
    let pod = (
        prop::sample::select(vec!["x", "y", "z"]),
        labels(),
        prop::bool::weighted(0.15),
        0..3usize,
        named("web"),
        named("dns"),
    );
    (
        labels(),
        labels(),
        prop::collection::vec(pod, 2..=6),
        prop::collection::vec(policy(), 0..=4),
    )
        .prop_map(|(lx, ly, pods, policies)| {
            let mut namespaces = BTreeMap::new();
            // z is left out of the cache on purpose (not yet seen).
            for (ns, mut l) in [("x", lx), ("y", ly)] {
                l.insert("kubernetes.io/metadata.name".into(), ns.into());
                namespaces.insert(ns.to_string(), l);
            }
            let pods = pods
                .into_iter()
                .enumerate()
                .map(|(i, (ns, labels, host, node, web, dns))| RawPod {
                    ns: ns.to_string(),
                    name: format!("p{i}"),
                    labels,
                    // A hostNetwork pod has its node's addresses.
                    ips: if host {
                        vec![
                            addr(&format!("192.168.0.{}", node + 1)),
                            addr(&format!("fd01::{}", node + 1)),
                        ]
                    } else {
                        vec![
                            addr(&format!("10.0.0.{}", i + 1)),
                            addr(&format!("fd00::{}", i + 1)),
                        ]
                    },
                    ports: web.into_iter().chain(dns).collect(),
                    host_network: host,
                    node: format!("node-{node}"),
                })
                .collect();
            World {
                namespaces,
                pods,
                policies,
            }
        })
}

fn addr(s: &str) -> IpAddr {
    s.parse().expect("generated address")
}

/// The same world through the real converters, from k8s-openapi objects.
fn cluster(w: &World) -> Cluster {
    let mut c = Cluster::default();
    for (name, l) in &w.namespaces {
        let obj: core::Namespace =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": l}})).expect("ns");
        c.add_namespace(namespace_from_k8s(&obj).expect("ns converts"));
    }
    for p in &w.pods {
        let ports: Vec<Value> = p
            .ports
            .iter()
            .map(|(n, pr, num)| json!({"name": n, "protocol": pr, "containerPort": num}))
            .collect();
        let ips: Vec<Value> = p
            .ips
            .iter()
            .map(|ip| json!({"ip": ip.to_string()}))
            .collect();
        let obj: core::Pod = serde_json::from_value(json!({
            "metadata": {"namespace": p.ns, "name": p.name, "labels": p.labels},
            "spec": {"nodeName": p.node, "hostNetwork": p.host_network,
                     "containers": [{"name": "c", "ports": ports}]},
            "status": {"podIPs": ips}}))
        .expect("pod");
        let conv = pod_from_k8s(&obj).expect("pod converts");
        assert!(conv.dropped.is_empty());
        c.add_pod(conv.value);
    }
    for (i, (ns, spec)) in w.policies.iter().enumerate() {
        c.add_policy(np(ns, &format!("np{i}"), spec.clone()));
    }
    c
}

fn judged(j: &Judgement) -> bool {
    matches!(
        j,
        Judgement::NotIsolated | Judgement::Allowed(_) | Judgement::Denied { .. }
    )
}

fn check_world(w: &World) -> Result<(), TestCaseError> {
    let c = cluster(w);
    let compiled: BTreeMap<Key, CompiledPod> = c
        .pods
        .values()
        .map(|p| (p.key.clone(), compile_pod(&c, p)))
        .collect();
    for v6 in [false, true] {
        let mut ends: Vec<(End, Endpoint)> = w
            .pods
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let ip = p.ips[usize::from(v6)];
                let ep = Endpoint::Pod {
                    pod: Key::new(&p.ns, &p.name),
                    ip,
                };
                (End { pod: Some(i), ip }, ep)
            })
            .collect();
        for ext in if v6 {
            ["fd00::ff", "2001:db8::1"]
        } else {
            ["10.0.0.200", "203.0.113.1"]
        } {
            let ip = addr(ext);
            ends.push((End { pod: None, ip }, Endpoint::External(ip)));
        }
        for (s_end, s) in &ends {
            for (d_end, d) in &ends {
                for (proto_name, proto) in [("TCP", Protocol::Tcp), ("UDP", Protocol::Udp)] {
                    for port in PORTS {
                        let naive = w.allowed(*s_end, *d_end, proto_name, port);
                        let v = allowed(&c, s, d, proto, port);
                        prop_assert_eq!(
                            v.is_allowed(),
                            naive,
                            "{:?} -> {:?} {}/{}: {:?}",
                            s,
                            d,
                            proto_name,
                            port,
                            v
                        );
                        // Each end's compiled direction, where the policy
                        // (not an exemption) decides, says what the evaluator says.
                        let sides = [
                            (s, &v.egress, d_end.ip, Direction::Egress),
                            (d, &v.ingress, s_end.ip, Direction::Ingress),
                        ];
                        for (end, judgement, remote, dir) in sides {
                            let Endpoint::Pod { pod, .. } = end else {
                                continue;
                            };
                            if !judged(judgement) {
                                continue;
                            }
                            let rules = compiled[pod].rules(dir);
                            let admits = rules.admits(remote, proto, port);
                            // The flattened set the nftables writer loads agrees.
                            let by_elements = rules.elements().is_none_or(|els| {
                                els.iter().any(|(c, r)| {
                                    c.contains(remote)
                                        && r.protocol == proto
                                        && (r.start..=r.end).contains(&port)
                                })
                            });
                            prop_assert_eq!(by_elements, admits, "elements {:?} of {}", dir, pod);
                            prop_assert_eq!(
                                admits,
                                judgement.allows(),
                                "compiled {:?} of {}",
                                dir,
                                pod
                            );
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// An ipBlock's prefixes (excepts carved out) cover exactly its addresses.
fn block_and_probe() -> impl Strategy<Value = (IpBlock, Vec<IpAddr>)> {
    (
        any::<u32>(),
        0u8..=28,
        prop::collection::vec((any::<u32>(), 1u8..=8), 0..=3),
        prop::collection::vec(any::<u32>(), 1..=40),
    )
        .prop_map(|(base, len, excepts, probes)| {
            let cidr = Cidr::new(IpAddr::V4(base.into()), len).expect("v4 prefix");
            let net = match cidr.addr() {
                IpAddr::V4(a) => u32::from(a),
                IpAddr::V6(_) => 0,
            };
            let span = u32::MAX.checked_shr(u32::from(len)).unwrap_or(0);
            // Excepts inside the block, probes mostly inside it too.
            let except = excepts
                .into_iter()
                .filter_map(|(off, extra)| {
                    Cidr::new(IpAddr::V4((net | (off & span)).into()), len + extra)
                })
                .collect();
            let probes = probes
                .into_iter()
                .map(|p| IpAddr::V4((net | (p & span)).into()))
                .chain([IpAddr::V4((!net).into())])
                .collect();
            (IpBlock { cidr, except }, probes)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(600))]

    #[test]
    fn block_prefixes_cover_exactly_the_block((block, probes) in block_and_probe()) {
        let prefixes = block.prefixes();
        for ip in probes {
            let by_prefixes = prefixes.iter().any(|c| c.contains(ip));
            prop_assert_eq!(by_prefixes, block.contains(ip), "{} in {:?} -> {:?}", ip, block, prefixes);
        }
    }

    #[test]
    fn evaluator_compiled_form_and_naive_agree(w in world()) {
        check_world(&w)?;
    }
}
