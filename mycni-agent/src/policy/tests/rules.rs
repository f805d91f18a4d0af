//! One test per rule of "the rules implementations get wrong"
//! (`shared/notes/networkpolicy.md`) that the upstream tables do not pin
//! down on their own: non-pod addresses, nodes, hostNetwork pods, the
//! verdict's explanation.

use std::net::IpAddr;

use serde_json::json;

use super::fixture::{Reach, check_tcp, labels, model, np, pod_ip, serve_ports};
use crate::cluster::{Cluster, Endpoint, Judgement, Key, Pod, Protocol, RuleRef, allowed};
use crate::policy::{DirectionRules, PeerSet, PortRange, PortSet, compile_node, compile_pod};

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

fn pod(ns: &str, name: &str) -> Endpoint {
    Endpoint::Pod {
        pod: Key::new(ns, name),
        ip: pod_ip(ns, name, false),
    }
}

fn tcp80(c: &Cluster, src: &Endpoint, dst: &Endpoint) -> bool {
    allowed(c, src, dst, Protocol::Tcp, 80).is_allowed()
}

/// Rule 2: `namespaceSelector: {}` is every pod, not every address;
/// a rule without `from` is every address.
#[test]
fn empty_namespace_selector_is_not_every_ip() {
    let outside = Endpoint::External(ip("192.0.2.7"));
    let mut c = model();
    c.add_policy(np(
        "x",
        "all-pods",
        json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {}}]}]}),
    ));
    assert!(tcp80(&c, &pod("z", "c"), &pod("x", "a")));
    assert!(!tcp80(&c, &outside, &pod("x", "a")));
    c.add_policy(np(
        "x",
        "all-pods",
        json!({"podSelector": {}, "ingress": [{}]}),
    ));
    assert!(tcp80(&c, &outside, &pod("x", "a")));
}

/// `NotIn` also matches objects that do not carry the key at all (the
/// upstream tables only use it on a key every namespace has).
#[test]
fn not_in_matches_missing_key() {
    let mut c = model();
    c.add_policy(np(
        "x",
        "p",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [
            {"podSelector": {"matchExpressions": [
                {"key": "tier", "operator": "NotIn", "values": ["db"]}]}}]}]}),
    ));
    let tiered = std::sync::Arc::make_mut(c.pods.get_mut(&Key::new("x", "c")).expect("x/c"));
    tiered.labels.insert("tier".into(), "db".into());
    let want = Reach::all(true)
        .expect("*", "x/a", false)
        .expect("x/b", "x/a", true);
    check_tcp(&c, &want);
}

/// Rule 3: `egress: []` with policyTypes omitted isolates ingress only.
#[test]
fn empty_egress_list_adds_no_egress_isolation() {
    let mut c = model();
    c.add_policy(np("x", "p", json!({"podSelector": {}, "egress": []})));
    check_tcp(&c, &Reach::all(true).expect("*", "x/*", false));
}

/// Rule 3: rules of a direction missing from explicit policyTypes are
/// ignored, even when another policy isolates that direction.
#[test]
fn rules_outside_policy_types_are_ignored() {
    let mut c = model();
    c.add_policy(np("x", "deny", json!({"podSelector": {}})));
    c.add_policy(np(
        "x",
        "egress-typed",
        json!({"podSelector": {}, "policyTypes": ["Egress"], "ingress": [{}], "egress": [{}]}),
    ));
    check_tcp(&c, &Reach::all(true).expect("*", "x/*", false));
}

/// Rule 6: `except` carves only out of its own peer; another peer of the
/// same rule allowing the pod wins.
#[test]
fn except_carves_only_its_own_peer() {
    let mut c = model();
    c.add_policy(np(
        "x",
        "p",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [
            {"ipBlock": {"cidr": "10.244.0.0/16", "except": ["10.244.1.0/24"]}},
            {"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
    ));
    let want = Reach::all(true)
        .expect("x/*", "x/a", false)
        .expect("x/b", "x/a", true);
    check_tcp(&c, &want);
}

fn host_network_pod(ns: &str, name: &str, node: &str, addr: &str) -> Pod {
    Pod {
        key: Key::new(ns, name),
        labels: labels(&[("pod", "a")]),
        ips: vec![ip(addr)],
        ports: serve_ports(),
        host_network: true,
        node: Some(node.to_string()),
    }
}

/// Rule 11: a hostNetwork pod is selected by no selector (neither as the
/// policy's target nor as a peer), but an ipBlock matches its address.
#[test]
fn host_network_pods_only_match_ip_blocks() {
    let mut c = model();
    c.add_pod(host_network_pod("x", "h", "node-2", "172.18.0.3"));
    let h = Endpoint::Pod {
        pod: Key::new("x", "h"),
        ip: ip("172.18.0.3"),
    };
    c.add_policy(np(
        "x",
        "from-pod-a",
        json!({"podSelector": {},
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "a"}}}]}]}),
    ));
    // Selected by `podSelector: {}` yet not isolated: it is the node.
    assert!(tcp80(&c, &pod("y", "b"), &h));
    // Labelled pod=a, yet not a peer of the selector (x/a is on node-0).
    assert!(!tcp80(&c, &h, &pod("x", "a")));
    c.add_policy(np(
        "x",
        "from-node-range",
        json!({"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "172.18.0.0/16"}}]}]}),
    ));
    assert!(tcp80(&c, &h, &pod("x", "a")));
    assert!(compile_node(&c, "node-2").keys().all(|k| k.name != "h"));
    let h_pod = &c.pods[&Key::new("x", "h")];
    assert_eq!(c.policies_selecting(h_pod).count(), 0);
}

/// Rule 11: a pod and its own node always talk, both ways, under
/// default-deny-all; another node is just an address.
#[test]
fn own_node_always_allowed() {
    let mut c = model();
    c.add_policy(np(
        "x",
        "deny-all",
        json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
    ));
    let node0 = Endpoint::Node {
        node: "node-0".into(),
        ip: ip("172.18.0.2"),
    };
    let v = allowed(&c, &node0, &pod("x", "a"), Protocol::Tcp, 80);
    assert_eq!(v.ingress, Judgement::OwnNode);
    assert_eq!(v.egress, Judgement::NotJudged);
    assert!(tcp80(&c, &pod("x", "a"), &node0));
    assert!(!tcp80(&c, &node0, &pod("x", "b")), "x/b lives on node-1");
    // A hostNetwork pod on the same node is the node too.
    c.add_pod(host_network_pod(
        "kube-system",
        "agent",
        "node-0",
        "172.18.0.2",
    ));
    let agent = Endpoint::Pod {
        pod: Key::new("kube-system", "agent"),
        ip: ip("172.18.0.2"),
    };
    assert!(tcp80(&c, &agent, &pod("x", "a")));
}

/// Rule 12: a pod reaching its own address is never denied.
#[test]
fn same_pod_allowed() {
    let mut c = model();
    c.add_policy(np(
        "x",
        "deny-all",
        json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
    ));
    let v = allowed(&c, &pod("x", "a"), &pod("x", "a"), Protocol::Tcp, 80);
    assert_eq!(v.ingress, Judgement::SamePod);
    assert!(v.is_allowed());
}

/// Rule 3 and 5: the verdict names every allowing rule (the union), with
/// the object's own rule index, and every isolating policy when denied.
#[test]
fn verdict_explains_itself() {
    let mut c = model();
    c.add_policy(np(
        "x",
        "one",
        json!({"podSelector": {}, "ingress": [
            {"ports": [{"port": 81}]},
            {"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
    ));
    c.add_policy(np(
        "x",
        "two",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}}),
    ));
    let v = allowed(&c, &pod("x", "b"), &pod("x", "a"), Protocol::Tcp, 81);
    let rule = |name: &str, index| RuleRef {
        policy: Key::new("x", name),
        direction: crate::verdict::Direction::Ingress,
        index,
    };
    assert_eq!(
        v.ingress,
        Judgement::Allowed(vec![rule("one", 0), rule("one", 1)])
    );
    assert_eq!(v.egress, Judgement::NotIsolated);
    let v = allowed(&c, &pod("x", "c"), &pod("x", "a"), Protocol::Tcp, 80);
    assert_eq!(
        v.ingress,
        Judgement::Denied {
            isolated_by: vec![Key::new("x", "one"), Key::new("x", "two")]
        }
    );
}

/// A namespace the cache has not seen still answers to its name label
/// (the API server sets it), so the name selector does not flap.
#[test]
fn unknown_namespace_keeps_its_name_label() {
    let mut c = model();
    c.namespaces.remove("y");
    c.add_policy(np(
        "x",
        "from-y",
        json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {
            "matchLabels": {"kubernetes.io/metadata.name": "y"}}}]}]}),
    ));
    assert!(tcp80(&c, &pod("y", "a"), &pod("x", "b")));
    assert!(!tcp80(&c, &pod("z", "a"), &pod("x", "b")));
}

/// An ipBlock becomes plain prefixes for the set: each except costs at
/// most (except length - block length) prefixes.
#[test]
fn ip_block_prefixes_carve_out_excepts() {
    let block = |cidr: &str, except: &[&str]| {
        let parse = |s: &str| {
            let c: mycni_common::net::Cidr<std::net::IpAddr> = s.parse().expect("cidr");
            crate::cluster::Cidr::new(c.addr(), c.prefix()).expect("cidr")
        };
        crate::cluster::IpBlock {
            cidr: parse(cidr),
            except: except.iter().map(|e| parse(e)).collect(),
        }
    };
    let texts = |b: crate::cluster::IpBlock| -> Vec<String> {
        b.prefixes().iter().map(|c| c.to_string()).collect()
    };
    assert_eq!(
        texts(block("10.0.0.0/24", &["10.0.0.0/30"])),
        [
            "10.0.0.4/30",
            "10.0.0.8/29",
            "10.0.0.16/28",
            "10.0.0.32/27",
            "10.0.0.64/26",
            "10.0.0.128/25"
        ]
    );
    assert_eq!(texts(block("fd00::/64", &[])), ["fd00::/64"]);
    assert_eq!(
        texts(block("fd00::/126", &["fd00::1/128", "fd00::2/127"])),
        ["fd00::/128"]
    );
}

/// The compiled form's shape: what the nftables writer will read.
#[test]
fn compiled_form_resolves_selectors_and_named_ports() {
    let mut c = model();
    c.add_policy(np(
        "x",
        "p",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{
            "from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}},
                     {"ipBlock": {"cidr": "192.0.2.0/24", "except": ["192.0.2.128/25"]}}],
            "ports": [{"port": "serve-81-udp", "protocol": "UDP"}, {"port": 9000, "endPort": 9100}]}]}),
    ));
    let xa = compile_pod(&c, &c.pods[&Key::new("x", "a")]);
    assert_eq!(xa.egress, DirectionRules::Open);
    let DirectionRules::Isolated { by, allows } = &xa.ingress else {
        panic!("x/a must be isolated for ingress");
    };
    assert_eq!(by, &vec![Key::new("x", "p")]);
    assert_eq!(allows.len(), 1);
    let PeerSet::Some { addrs, blocks } = &allows[0].peers else {
        panic!("peers must be resolved");
    };
    let want: Vec<IpAddr> = ["a", "b", "c"]
        .iter()
        .flat_map(|p| [pod_ip("y", p, false), pod_ip("y", p, true)])
        .collect();
    assert_eq!(addrs.len(), 6);
    assert!(want.iter().all(|a| addrs.contains(a)));
    assert_eq!(blocks.len(), 1);
    let range = |protocol, start, end| PortRange {
        protocol,
        start,
        end,
    };
    assert_eq!(
        allows[0].ports,
        PortSet::Some(
            [
                range(Protocol::Udp, 81, 81),
                range(Protocol::Tcp, 9000, 9100)
            ]
            .into()
        )
    );
    let node0 = compile_node(&c, "node-0");
    assert_eq!(node0.len(), 3, "x/a, y/a, z/a live on node-0");
}
