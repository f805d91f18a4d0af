//! Truth tables of the upstream `Netpol` cases
//! (`test/e2e/network/netpol/network_policy.go`), numbered as in
//! `shared/notes/networkpolicy.md`. Each test builds the policy as the
//! upstream YAML, then checks every pod pair against the expected table,
//! through both the evaluator and the compiled form.

use serde_json::json;

use super::fixture::{Reach, check, check_tcp, model, np, pod_ip};
use crate::cluster::Protocol;

/// 1: "should support a 'default-deny-ingress' policy".
#[test]
fn default_deny_ingress() {
    let mut c = model();
    c.add_policy(np("x", "deny-ingress", json!({"podSelector": {}})));
    let want = Reach::all(true).expect("*", "x/*", false);
    check_tcp(&c, &want);
    check(&c, Protocol::Udp, 80, false, &want);
}

/// 2: "should support a 'default-deny-all' policy".
#[test]
fn default_deny_all() {
    let mut c = model();
    c.add_policy(np(
        "x",
        "deny-all",
        json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
    ));
    let want = Reach::all(true)
        .expect("*", "x/*", false)
        .expect("x/*", "*", false);
    check_tcp(&c, &want);
}

/// 3: deny-all ingress plus an allow-all for x/a: the union opens x/a.
#[test]
fn deny_all_plus_allow_all_for_one_pod() {
    let mut c = model();
    c.add_policy(np("x", "deny-ingress", json!({"podSelector": {}})));
    c.add_policy(np(
        "x",
        "allow-a",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{}]}),
    ));
    let want = Reach::all(true)
        .expect("*", "x/*", false)
        .expect("*", "x/a", true);
    check_tcp(&c, &want);
}

/// 4: "should enforce policy to allow traffic from pods within server
/// namespace based on PodSelector".
#[test]
fn allow_from_pod_in_own_namespace() {
    let mut c = model();
    c.add_policy(np(
        "x",
        "x-a-from-b",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
    ));
    let want = Reach::all(true)
        .expect("*", "x/a", false)
        .expect("x/b", "x/a", true);
    check_tcp(&c, &want);
}

/// 5: "should enforce policy to allow traffic only from a different
/// namespace, based on NamespaceSelector".
#[test]
fn allow_from_namespace() {
    let mut c = model();
    c.add_policy(np(
        "x",
        "x-a-from-y",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
               "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]}),
    ));
    let want = Reach::all(true)
        .expect("*", "x/a", false)
        .expect("y/*", "x/a", true);
    check_tcp(&c, &want);
}

/// 6: two peers are ORed: "should enforce policy based on PodSelector or
/// NamespaceSelector".
#[test]
fn pod_or_namespace_selector() {
    let mut c = model();
    c.add_policy(np(
        "x",
        "or",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
               "ingress": [{"from": [
                   {"namespaceSelector": {"matchExpressions": [
                       {"key": "ns", "operator": "NotIn", "values": ["x"]}]}},
                   {"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
    ));
    let want = Reach::all(true).expect("x/c", "x/a", false);
    check_tcp(&c, &want);
}

/// 7: one peer with both selectors is an AND: "should enforce policy based
/// on PodSelector and NamespaceSelector".
#[test]
fn pod_and_namespace_selector() {
    let mut c = model();
    c.add_policy(np(
        "x",
        "and",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
               "ingress": [{"from": [{
                   "namespaceSelector": {"matchExpressions": [
                       {"key": "ns", "operator": "NotIn", "values": ["x"]}]},
                   "podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
    ));
    let want = Reach::all(true)
        .expect("*", "x/a", false)
        .expect("y/b", "x/a", true)
        .expect("z/b", "x/a", true);
    check_tcp(&c, &want);
}

/// 8: `namespaceSelector: {}` is every pod of every namespace.
#[test]
fn empty_namespace_selector_is_every_pod() {
    let mut c = model();
    c.add_policy(np(
        "x",
        "all-ns",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
               "ingress": [{"from": [{"namespaceSelector": {}}]}]}),
    ));
    check_tcp(&c, &Reach::all(true));
}

/// 9: `podSelector: {}` in a peer is every pod of the policy's namespace.
#[test]
fn empty_pod_selector_is_own_namespace() {
    let mut c = model();
    c.add_policy(np(
        "x",
        "same-ns",
        json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]}),
    ));
    let want = Reach::all(true)
        .expect("*", "x/*", false)
        .expect("x/*", "x/*", true);
    check_tcp(&c, &want);
}

/// 10: matchExpressions on pods: In, NotIn, Exists, DoesNotExist.
#[test]
fn match_expressions_every_operator() {
    let cases = [
        (
            json!({"key": "pod", "operator": "In", "values": ["b"]}),
            "x/b",
        ),
        (
            json!({"key": "pod", "operator": "NotIn", "values": ["b"]}),
            "x/c",
        ),
        (json!({"key": "pod", "operator": "Exists"}), "x/*"),
        (json!({"key": "pod", "operator": "DoesNotExist"}), "none"),
    ];
    for (expr, allowed) in cases {
        let mut c = model();
        c.add_policy(np(
            "x",
            "expr",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
                   "ingress": [{"from": [{"podSelector": {"matchExpressions": [expr]}}]}]}),
        ));
        let want = Reach::all(true)
            .expect("*", "x/a", false)
            .expect(allowed, "x/a", true);
        check_tcp(&c, &want);
    }
}

/// 11: "should enforce policy based on Ports": from y on TCP 81 only.
#[test]
fn from_namespace_on_one_port() {
    let mut c = model();
    c.add_policy(np(
        "x",
        "y-81",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
               "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}],
                            "ports": [{"port": 81, "protocol": "TCP"}]}]}),
    ));
    let closed = Reach::all(true).expect("*", "x/a", false);
    check(&c, Protocol::Tcp, 80, false, &closed);
    check(&c, Protocol::Udp, 81, false, &closed);
    let open = closed.clone().expect("y/*", "x/a", true);
    check(&c, Protocol::Tcp, 81, false, &open);
}

/// 12: "should allow ingress access on one named port".
#[test]
fn ingress_named_port() {
    let mut c = model();
    c.add_policy(np(
        "x",
        "named",
        json!({"podSelector": {}, "ingress": [{"ports": [{"port": "serve-81-tcp"}]}]}),
    ));
    let closed = Reach::all(true).expect("*", "x/*", false);
    check(&c, Protocol::Tcp, 80, false, &closed);
    check(&c, Protocol::Udp, 81, false, &closed);
    check(&c, Protocol::Tcp, 81, false, &Reach::all(true));
}

/// 13: "should allow egress access on one named port": resolved on the
/// destination, here moved to 8080 on y/b.
#[test]
fn egress_named_port_resolves_on_destination() {
    let mut c = model();
    if let Some(yb) = c.pods.get_mut(&crate::cluster::Key::new("y", "b")) {
        for p in std::sync::Arc::make_mut(yb).ports.iter_mut() {
            if p.name.as_deref() == Some("serve-80-tcp") {
                p.port = 8080;
            }
        }
    }
    c.add_policy(np(
        "x",
        "named-egress",
        json!({"podSelector": {}, "policyTypes": ["Egress"],
               "egress": [{"ports": [{"port": "serve-80-tcp", "protocol": "TCP"}]}]}),
    ));
    let on_80 = Reach::all(true).expect("x/*", "y/b", false);
    check(&c, Protocol::Tcp, 80, false, &on_80);
    check(
        &c,
        Protocol::Tcp,
        81,
        false,
        &Reach::all(true).expect("x/*", "*", false),
    );
    let on_8080 = Reach::all(true)
        .expect("x/*", "*", false)
        .expect("x/*", "y/b", true);
    check(&c, Protocol::Tcp, 8080, false, &on_8080);
}

/// 14: a TCP rule naming a UDP port matches nothing.
#[test]
fn named_port_protocol_mismatch_matches_nothing() {
    let mut c = model();
    c.add_policy(np(
        "x",
        "mismatch",
        json!({"podSelector": {}, "ingress": [{"ports": [{"port": "serve-81-udp", "protocol": "TCP"}]}]}),
    ));
    let closed = Reach::all(true).expect("*", "x/*", false);
    check_tcp(&c, &closed);
    check(&c, Protocol::Udp, 81, false, &closed);
}

/// 15: endPort is inclusive: 53-80 opens 80 not 81; 53-84 opens 81.
#[test]
fn end_port_inclusive() {
    for (end, opens_81) in [(80, false), (84, true)] {
        let mut c = model();
        c.add_policy(np(
            "x",
            "range",
            json!({"podSelector": {}, "ingress": [{"ports": [
                {"port": 53, "endPort": end, "protocol": "TCP"}]}]}),
        ));
        let closed = Reach::all(true).expect("*", "x/*", false);
        check(&c, Protocol::Tcp, 80, false, &Reach::all(true));
        let want_81 = if opens_81 {
            Reach::all(true)
        } else {
            closed.clone()
        };
        check(&c, Protocol::Tcp, 81, false, &want_81);
        check(&c, Protocol::Udp, 80, false, &closed);
    }
}

/// 16: `ports: [{protocol: TCP}]` is every TCP port, no UDP.
#[test]
fn protocol_without_port_is_every_port() {
    let mut c = model();
    c.add_policy(np(
        "x",
        "tcp",
        json!({"podSelector": {}, "ingress": [{"ports": [{"protocol": "TCP"}]}]}),
    ));
    check_tcp(&c, &Reach::all(true));
    check(&c, Protocol::Tcp, 65535, false, &Reach::all(true));
    check(
        &c,
        Protocol::Udp,
        80,
        false,
        &Reach::all(true).expect("*", "x/*", false),
    );
}

/// 17, 18: "should not allow access by TCP when a policy specifies only
/// SCTP / UDP" (upstream calls a failure here a security hole).
#[test]
fn sctp_or_udp_only_never_opens_tcp() {
    for proto in ["SCTP", "UDP"] {
        let mut c = model();
        c.add_policy(np(
            "x",
            "only",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
                   "ingress": [{"ports": [{"port": 81, "protocol": proto}]}]}),
        ));
        check_tcp(&c, &Reach::all(true).expect("*", "x/a", false));
        let other = if proto == "UDP" {
            Protocol::Udp
        } else {
            Protocol::Sctp
        };
        check(&c, other, 81, false, &Reach::all(true));
    }
}

/// 19: two policies, one per port: both ports open (union).
#[test]
fn two_policies_one_port_each() {
    let mut c = model();
    for port in [80, 81] {
        c.add_policy(np(
            "x",
            &format!("allow-{port}"),
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
                   "ingress": [{"ports": [{"port": port}]}]}),
        ));
    }
    check_tcp(&c, &Reach::all(true));
    check(
        &c,
        Protocol::Tcp,
        82,
        false,
        &Reach::all(true).expect("*", "x/a", false),
    );
}

/// 20: a port allow, then `ingress: [{}]` added: everything open.
#[test]
fn port_allow_then_allow_all() {
    let mut c = model();
    c.add_policy(np(
        "x",
        "p",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
               "ingress": [{"ports": [{"port": 80}]}]}),
    ));
    check(
        &c,
        Protocol::Tcp,
        81,
        false,
        &Reach::all(true).expect("*", "x/a", false),
    );
    c.add_policy(np(
        "x",
        "p",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
               "ingress": [{"ports": [{"port": 80}]}, {}]}),
    ));
    check_tcp(&c, &Reach::all(true));
}

/// 21: "should deny egress from pods based on PodSelector": x/a cannot
/// open connections, yet everyone still reaches x/a (its replies are the
/// connection's, not new egress).
#[test]
fn egress_deny_keeps_replies() {
    let mut c = model();
    c.add_policy(np(
        "x",
        "no-egress",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"]}),
    ));
    check_tcp(&c, &Reach::all(true).expect("x/a", "*", false));
}

/// 22: both ends must allow: x/a egress only to y/a, while y/a and y/b
/// both admit x/a: x/a -> y/b stays denied.
#[test]
fn egress_deny_beats_ingress_allow() {
    let mut c = model();
    c.add_policy(np(
        "x",
        "to-ya",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"],
               "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"ns": "y"}},
                                   "podSelector": {"matchLabels": {"pod": "a"}}}]}]}),
    ));
    c.add_policy(np(
        "y",
        "from-xa",
        json!({"podSelector": {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["a", "b"]}]},
               "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "x"}},
                                      "podSelector": {"matchLabels": {"pod": "a"}}}]}]}),
    ));
    let want = Reach::all(true)
        .expect("x/a", "*", false)
        .expect("*", "y/a", false)
        .expect("*", "y/b", false)
        .expect("x/a", "y/a", true);
    check_tcp(&c, &want);
}

/// 23: "should allow egress access to server in CIDR block" (a pod IP).
#[test]
fn egress_to_pod_ip_block() {
    for v6 in [false, true] {
        let yb = pod_ip("y", "b", v6);
        let prefix = if v6 { 128 } else { 32 };
        let mut c = model();
        c.add_policy(np(
            "x",
            "to-yb",
            json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"],
                   "egress": [{"to": [{"ipBlock": {"cidr": format!("{yb}/{prefix}")}}]}]}),
        ));
        let want = Reach::all(true)
            .expect("x/a", "*", false)
            .expect("x/a", "y/b", true);
        check(&c, Protocol::Tcp, 80, v6, &want);
    }
}

/// 24, 25: "should enforce except clause while egress access to server in
/// CIDR block", then a second policy allowing the excepted pod wins.
#[test]
fn ip_block_except_then_other_policy_allows() {
    for v6 in [false, true] {
        let (wide, xb) = if v6 {
            (
                "fd00::/64".to_string(),
                format!("{}/128", pod_ip("x", "b", true)),
            )
        } else {
            (
                "10.244.0.0/16".to_string(),
                format!("{}/32", pod_ip("x", "b", false)),
            )
        };
        let mut c = model();
        c.add_policy(np(
            "x",
            "except",
            json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"],
                   "egress": [{"to": [{"ipBlock": {"cidr": wide, "except": [xb]}}]}]}),
        ));
        check(
            &c,
            Protocol::Tcp,
            80,
            v6,
            &Reach::all(true).expect("x/a", "x/b", false),
        );
        c.add_policy(np(
            "x",
            "allow-xb",
            json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"],
                   "egress": [{"to": [{"ipBlock": {"cidr": xb}}]}]}),
        ));
        check(&c, Protocol::Tcp, 80, v6, &Reach::all(true));
    }
}

/// 26: egress allow-all plus ingress deny on the same pod.
#[test]
fn egress_allow_all_with_ingress_deny() {
    let mut c = model();
    c.add_policy(np(
        "x",
        "mixed",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
               "policyTypes": ["Ingress", "Egress"], "egress": [{}]}),
    ));
    check_tcp(&c, &Reach::all(true).expect("*", "x/a", false));
}

/// 27: egress rules with policyTypes omitted: defaulting adds Ingress too,
/// so x/a's ingress is denied while its egress to y is allowed.
#[test]
fn policy_types_defaulting_isolates_ingress_too() {
    let mut c = model();
    c.add_policy(np(
        "x",
        "egress-only",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
               "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]}),
    ));
    let want = Reach::all(true)
        .expect("*", "x/a", false)
        .expect("x/a", "*", false)
        .expect("x/a", "y/*", true);
    check_tcp(&c, &want);
}

/// 28: the same tables hold on IPv6 (selectors see pods, not families).
#[test]
fn ipv6_same_tables() {
    let mut c = model();
    c.add_policy(np(
        "x",
        "x-a-from-y",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
               "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}],
                            "ports": [{"port": 80}]}]}),
    ));
    let closed = Reach::all(true).expect("*", "x/a", false);
    check(
        &c,
        Protocol::Tcp,
        80,
        true,
        &closed.clone().expect("y/*", "x/a", true),
    );
    check(&c, Protocol::Tcp, 81, true, &closed);
}
