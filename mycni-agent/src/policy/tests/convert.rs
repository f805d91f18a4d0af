//! The converter on garbage: every object here is one the API server would
//! have rejected; the agent must reject the rule or policy with a reason,
//! fail closed, and never panic.

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::{Value, json};

use crate::cluster::{
    Key, NAMESPACE_NAME_LABEL, Operator, Peer, Peers, PortMatch, Ports, Problem, ProblemKind,
    Protocol, namespace_from_k8s, pod_from_k8s, policy_from_k8s,
};

fn object(spec: Value) -> NetworkPolicy {
    serde_json::from_value(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"namespace": "x", "name": "p"}, "spec": spec}))
    .expect("test object parses")
}

/// Converts a policy with one ingress rule; returns what was dropped.
fn dropped_from_rule(rule: Value) -> Vec<Problem> {
    let conv = policy_from_k8s(&object(json!({"podSelector": {}, "ingress": [rule]})))
        .expect("a bad rule does not reject the policy");
    // Fail closed: the policy still isolates, the bad rule allows nothing.
    assert!(conv.value.isolates_ingress);
    assert!(conv.value.ingress.is_empty());
    conv.dropped
}

#[test]
fn bad_rules_are_dropped_with_a_reason() {
    let cases = [
        (
            json!({"from": [{"ipBlock": {"cidr": "10.0.0.0/33"}}]}),
            ProblemKind::BadCidr("10.0.0.0/33".into()),
        ),
        (
            json!({"from": [{"ipBlock": {"cidr": "not-a-cidr"}}]}),
            ProblemKind::BadCidr("not-a-cidr".into()),
        ),
        (
            json!({"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.0.0.0/8"]}}]}),
            ProblemKind::ExceptOutside {
                except: "10.0.0.0/8".into(),
                cidr: "10.0.0.0/8".into(),
            },
        ),
        (
            json!({"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["fd00::/64"]}}]}),
            ProblemKind::ExceptOutside {
                except: "fd00::/64".into(),
                cidr: "10.0.0.0/8".into(),
            },
        ),
        (json!({"from": [{}]}), ProblemKind::EmptyPeer),
        (
            json!({"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]}),
            ProblemKind::IpBlockWithSelector,
        ),
        (
            json!({"from": [{"podSelector": {"matchExpressions": [
                {"key": "a", "operator": "Equals", "values": ["b"]}]}}]}),
            ProblemKind::BadOperator("Equals".into()),
        ),
        (
            json!({"from": [{"namespaceSelector": {"matchExpressions": [
                {"key": "a", "operator": "In", "values": []}]}}]}),
            ProblemKind::MissingValues("In".into()),
        ),
        (
            json!({"from": [{"podSelector": {"matchExpressions": [
                {"key": "a", "operator": "Exists", "values": ["b"]}]}}]}),
            ProblemKind::UnexpectedValues("Exists".into()),
        ),
        (
            json!({"ports": [{"protocol": "ICMP"}]}),
            ProblemKind::BadProtocol("ICMP".into()),
        ),
        (
            json!({"ports": [{"protocol": "tcp"}]}),
            ProblemKind::BadProtocol("tcp".into()),
        ),
        (json!({"ports": [{"port": 0}]}), ProblemKind::BadPort(0)),
        (
            json!({"ports": [{"port": 70000}]}),
            ProblemKind::BadPort(70000),
        ),
        (
            json!({"ports": [{"port": 80, "endPort": 70000}]}),
            ProblemKind::BadPort(70000),
        ),
        (
            json!({"ports": [{"endPort": 80}]}),
            ProblemKind::EndPortWithoutNumericPort,
        ),
        (
            json!({"ports": [{"port": "http", "endPort": 80}]}),
            ProblemKind::EndPortWithoutNumericPort,
        ),
        (
            json!({"ports": [{"port": 81, "endPort": 80}]}),
            ProblemKind::EndPortBelowPort { port: 81, end: 80 },
        ),
        (
            json!({"ports": [{"port": "80"}]}),
            ProblemKind::BadPortName("80".into()),
        ),
        (
            json!({"ports": [{"port": "a-very-long-port-name"}]}),
            ProblemKind::BadPortName("a-very-long-port-name".into()),
        ),
        (
            json!({"ports": [{"port": "Serve"}]}),
            ProblemKind::BadPortName("Serve".into()),
        ),
    ];
    for (rule, kind) in cases {
        let dropped = dropped_from_rule(rule.clone());
        assert_eq!(dropped.len(), 1, "{rule}");
        assert_eq!(dropped[0].kind, kind, "{rule}");
        assert!(
            dropped[0].at.starts_with("spec.ingress[0]"),
            "{}",
            dropped[0]
        );
    }
}

/// One bad port among good ones drops the whole rule: dropping only the
/// bad entry would be wrong whenever it was the last one (empty = all).
#[test]
fn one_bad_entry_drops_the_whole_rule() {
    let conv = policy_from_k8s(&object(json!({"podSelector": {}, "ingress": [
        {"ports": [{"port": 80}, {"port": 0}]},
        {"from": [{"podSelector": {}}]}]})))
    .expect("converts");
    assert_eq!(conv.dropped.len(), 1);
    assert_eq!(conv.dropped[0].at, "spec.ingress[0].ports[1]");
    // The survivor keeps its own index for verdicts.
    assert_eq!(conv.value.ingress.len(), 1);
    assert_eq!(conv.value.ingress[0].0, 1);
}

#[test]
fn unreadable_policies_are_rejected() {
    let bad_selector = object(json!({"podSelector": {"matchExpressions": [
        {"key": "a", "operator": "Near"}]}}));
    let err = policy_from_k8s(&bad_selector).expect_err("selector");
    assert_eq!(err.kind, ProblemKind::BadOperator("Near".into()));
    let bad_type = object(json!({"podSelector": {}, "policyTypes": ["Ingress", "Sideways"]}));
    let err = policy_from_k8s(&bad_type).expect_err("policy type");
    assert_eq!(err.at, "spec.policyTypes[1]");
    let mut nameless = object(json!({}));
    nameless.metadata.namespace = None;
    let err = policy_from_k8s(&nameless).expect_err("metadata");
    assert_eq!(err.kind, ProblemKind::MissingMetadata);
}

#[test]
fn defaults_applied_like_the_api_server() {
    // No spec at all: podSelector {} and policyTypes [Ingress] = deny ingress.
    let conv = policy_from_k8s(&object(Value::Null)).expect("converts");
    let p = conv.value;
    assert!(p.isolates_ingress && !p.isolates_egress);
    assert!(p.pod_selector.match_labels.is_empty());
    // Egress rules without policyTypes: both directions, even if the only
    // egress rule is dropped afterwards (defaulting sees the raw object).
    let conv =
        policy_from_k8s(&object(json!({"egress": [{"ports": [{"port": -1}]}]}))).expect("converts");
    assert!(conv.value.isolates_ingress && conv.value.isolates_egress);
    assert!(conv.value.egress.is_empty());
}

#[test]
fn valid_shapes_convert_as_meant() {
    let conv = policy_from_k8s(&object(json!({"podSelector": {}, "ingress": [
        {"from": [{"namespaceSelector": {"matchExpressions": [
                    {"key": "ns", "operator": "NotIn", "values": ["x"]}]}},
                  {"ipBlock": {"cidr": "10.1.2.3/16"}}],
         "ports": [{"port": "serve-80-tcp"}, {"protocol": "SCTP"}]},
        {"from": [], "ports": []}]})))
    .expect("converts");
    assert!(conv.dropped.is_empty());
    let (_, rule) = &conv.value.ingress[0];
    let Peers::Only(peers) = &rule.peers else {
        panic!("peers listed");
    };
    let Peer::Pods { namespaces, pods } = &peers[0] else {
        panic!("selector peer");
    };
    assert!(pods.match_labels.is_empty() && pods.match_expressions.is_empty());
    let crate::cluster::NamespaceScope::Selected(sel) = namespaces else {
        panic!("namespace selector");
    };
    assert_eq!(sel.match_expressions[0].operator, Operator::NotIn);
    // Host bits are cleared, as Go's net.ParseCIDR does.
    let Peer::IpBlock(b) = &peers[1] else {
        panic!("ipBlock peer");
    };
    assert_eq!(b.cidr.to_string(), "10.1.0.0/16");
    let Ports::Only(ports) = &rule.ports else {
        panic!("ports listed");
    };
    assert_eq!(ports[0].protocol, Protocol::Tcp, "omitted protocol is TCP");
    assert_eq!(ports[0].port, PortMatch::Named("serve-80-tcp".into()));
    assert_eq!(ports[1].port, PortMatch::Any);
    // Empty lists mean "all", exactly like omitted ones.
    let (_, open) = &conv.value.ingress[1];
    assert_eq!((&open.peers, &open.ports), (&Peers::All, &Ports::All));
}

#[test]
fn pods_convert_tolerantly() {
    let pod: core::Pod = serde_json::from_value(json!({
        "metadata": {"namespace": "x", "name": "a", "labels": {"pod": "a"}},
        "spec": {"nodeName": "node-0", "containers": [{"name": "c", "ports": [
            {"name": "serve-80-tcp", "containerPort": 80},
            {"name": "serve-80-udp", "containerPort": 80, "protocol": "UDP"},
            {"containerPort": 99999},
            {"containerPort": 53, "protocol": "QUIC"}]}]},
        "status": {"podIP": "10.244.1.1",
                   "podIPs": [{"ip": "10.244.1.1"}, {"ip": "fd00::1:1"}, {"ip": "garbage"}]}}))
    .expect("test pod parses");
    let conv = pod_from_k8s(&pod).expect("converts");
    let p = conv.value;
    assert_eq!(p.key, Key::new("x", "a"));
    assert_eq!(p.ips.len(), 2);
    assert_eq!(p.named_port("serve-80-tcp", Protocol::Tcp), Some(80));
    assert_eq!(p.named_port("serve-80-udp", Protocol::Tcp), None);
    assert_eq!(p.node.as_deref(), Some("node-0"));
    assert!(!p.host_network);
    assert_eq!(conv.dropped.len(), 3, "{:?}", conv.dropped);
    // Old objects with podIP only still get their address.
    let old: core::Pod = serde_json::from_value(json!({
        "metadata": {"namespace": "x", "name": "b"},
        "status": {"podIP": "10.244.1.2"}}))
    .expect("parses");
    let conv = pod_from_k8s(&old).expect("converts");
    assert_eq!(
        conv.value.ips,
        vec!["10.244.1.2".parse::<std::net::IpAddr>().expect("ip")]
    );
    // A finished pod keeps no address: it may already be another pod's.
    let done: core::Pod = serde_json::from_value(json!({
        "metadata": {"namespace": "x", "name": "job"},
        "status": {"phase": "Succeeded", "podIPs": [{"ip": "10.244.1.3"}]}}))
    .expect("parses");
    assert!(pod_from_k8s(&done).expect("converts").value.ips.is_empty());
}

#[test]
fn namespaces_always_carry_their_name_label() {
    let ns: core::Namespace =
        serde_json::from_value(json!({"metadata": {"name": "y", "labels": {"ns": "y"}}}))
            .expect("parses");
    let ns = namespace_from_k8s(&ns).expect("converts");
    assert_eq!(
        ns.labels.get(NAMESPACE_NAME_LABEL).map(String::as_str),
        Some("y")
    );
    assert_eq!(ns.labels.get("ns").map(String::as_str), Some("y"));
    let nameless = core::Namespace::default();
    assert!(namespace_from_k8s(&nameless).is_err());
}
