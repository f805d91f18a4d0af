//! The upstream cases (`test/e2e/network/netpol/network_policy.go`),
//! numbered as `shared/notes/networkpolicy.md` lists them, as lab cases:
//! the policies as the upstream YAML writes them, and the tables expected
//! on every column (TCP and UDP, 80 and 81, each family, by pod IP and by
//! Service). Policies are in namespace x unless said.

use serde_json::{Value, json};

use super::{Action, Case, Expect, On, Reach};
use crate::model::Proto;
use crate::{IpFamily, Pod, pod_label};

fn pod_sel(name: &str) -> Value {
    json!({"matchLabels": {"pod": name}})
}

fn on(proto: Option<Proto>, port: Option<u16>) -> On {
    On {
        proto,
        port,
        family: None,
    }
}

fn with(all: Reach, overrides: Vec<(On, Reach)>) -> Expect {
    Expect { all, on: overrides }
}

/// `/32` or `/128` blocks of one pod's addresses, one peer each.
fn host_blocks(pods: &[Pod], who: &str) -> Vec<Value> {
    pods.iter()
        .filter(|p| pod_label(p) == who)
        .flat_map(|p| {
            [IpFamily::V4, IpFamily::V6]
                .into_iter()
                .filter_map(|f| p.addr(f))
        })
        .map(|a| {
            let len = if a.is_ipv4() { 32 } else { 128 };
            json!({"ipBlock": {"cidr": format!("{a}/{len}")}})
        })
        .collect()
}

/// The cluster ranges the lab's pods are in, each without `who`.
fn wide_blocks_except(pods: &[Pod], who: &str) -> Vec<Value> {
    host_blocks(pods, who)
        .into_iter()
        .map(|b| {
            let host = b["ipBlock"]["cidr"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let wide = if host.contains(':') {
                crate::CLUSTER_CIDR6
            } else {
                crate::CLUSTER_CIDR
            };
            json!({"ipBlock": {"cidr": wide, "except": [host]}})
        })
        .collect()
}

/// Cases 1 to 28, with the ipBlocks of 23 to 25 made of `pods`' addresses.
pub fn upstream(pods: &[Pod]) -> Vec<Case> {
    let apply = Action::apply;
    let x_a_closed = || Reach::all(true).expect("*", "x/a", false);
    let x_closed = || Reach::all(true).expect("*", "x/*", false);
    let mut cases = vec![
        Case::one(
            "1 default-deny-ingress",
            vec![apply("x", "deny-ingress", json!({"podSelector": {}}))],
            x_closed(),
        ),
        Case::one(
            "2 default-deny-all",
            vec![apply(
                "x",
                "deny-all",
                json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
            )],
            x_closed().expect("x/*", "*", false),
        ),
        Case::one(
            "3 deny-ingress plus allow-all for x/a (union)",
            vec![
                apply("x", "deny-ingress", json!({"podSelector": {}})),
                apply(
                    "x",
                    "allow-a",
                    json!({"podSelector": pod_sel("a"), "ingress": [{}]}),
                ),
            ],
            x_closed().expect("*", "x/a", true),
        ),
        Case::one(
            "4 x/a from pod=b",
            vec![apply(
                "x",
                "x-a-from-b",
                json!({"podSelector": pod_sel("a"),
                       "ingress": [{"from": [{"podSelector": pod_sel("b")}]}]}),
            )],
            x_a_closed().expect("x/b", "x/a", true),
        ),
        Case::one(
            "5 x/a from ns=y",
            vec![apply(
                "x",
                "x-a-from-y",
                json!({"podSelector": pod_sel("a"),
                       "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]}),
            )],
            x_a_closed().expect("y/*", "x/a", true),
        ),
        Case::one(
            "6 x/a from [ns NotIn x] or [pod=b]",
            vec![apply(
                "x",
                "or",
                json!({"podSelector": pod_sel("a"),
                       "ingress": [{"from": [
                           {"namespaceSelector": {"matchExpressions": [
                               {"key": "ns", "operator": "NotIn", "values": ["x"]}]}},
                           {"podSelector": pod_sel("b")}]}]}),
            )],
            Reach::all(true).expect("x/c", "x/a", false),
        ),
        Case::one(
            "7 x/a from [ns NotIn x and pod=b]",
            vec![apply(
                "x",
                "and",
                json!({"podSelector": pod_sel("a"),
                       "ingress": [{"from": [{
                           "namespaceSelector": {"matchExpressions": [
                               {"key": "ns", "operator": "NotIn", "values": ["x"]}]},
                           "podSelector": pod_sel("b")}]}]}),
            )],
            x_a_closed()
                .expect("y/b", "x/a", true)
                .expect("z/b", "x/a", true),
        ),
        Case::one(
            "8 x/a from namespaceSelector {}",
            vec![apply(
                "x",
                "all-ns",
                json!({"podSelector": pod_sel("a"),
                       "ingress": [{"from": [{"namespaceSelector": {}}]}]}),
            )],
            Reach::all(true),
        ),
        Case::one(
            "9 x from podSelector {}",
            vec![apply(
                "x",
                "same-ns",
                json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]}),
            )],
            x_closed().expect("x/*", "x/*", true),
        ),
    ];
    for (op, expr, allowed) in [
        (
            "In",
            json!({"key": "pod", "operator": "In", "values": ["b"]}),
            "x/b",
        ),
        (
            "NotIn",
            json!({"key": "pod", "operator": "NotIn", "values": ["b"]}),
            "x/c",
        ),
        ("Exists", json!({"key": "pod", "operator": "Exists"}), "x/*"),
        (
            "DoesNotExist",
            json!({"key": "pod", "operator": "DoesNotExist"}),
            "",
        ),
    ] {
        let mut want = x_a_closed();
        if !allowed.is_empty() {
            want = want.expect(allowed, "x/a", true);
        }
        cases.push(Case::one(
            &format!("10 x/a from pods matching {op}"),
            vec![apply(
                "x",
                "expr",
                json!({"podSelector": pod_sel("a"),
                       "ingress": [{"from": [{"podSelector": {"matchExpressions": [expr]}}]}]}),
            )],
            want,
        ));
    }
    cases.extend([
        Case::one(
            "11 x/a from ns=y on TCP 81 only",
            vec![apply(
                "x",
                "y-81",
                json!({"podSelector": pod_sel("a"),
                       "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}],
                                    "ports": [{"port": 81, "protocol": "TCP"}]}]}),
            )],
            with(
                x_a_closed(),
                vec![(
                    on(Some(Proto::Tcp), Some(81)),
                    x_a_closed().expect("y/*", "x/a", true),
                )],
            ),
        ),
        Case::one(
            "12 x ingress on named port serve-81-tcp",
            vec![apply(
                "x",
                "named",
                json!({"podSelector": {}, "ingress": [{"ports": [{"port": "serve-81-tcp"}]}]}),
            )],
            with(
                x_closed(),
                vec![(on(Some(Proto::Tcp), Some(81)), Reach::all(true))],
            ),
        ),
        Case::one(
            "13 x egress to named port serve-80-tcp",
            vec![apply(
                "x",
                "named-egress",
                json!({"podSelector": {}, "policyTypes": ["Egress"],
                       "egress": [{"ports": [{"port": "serve-80-tcp", "protocol": "TCP"}]}]}),
            )],
            with(
                Reach::all(true).expect("x/*", "*", false),
                vec![(on(Some(Proto::Tcp), Some(80)), Reach::all(true))],
            ),
        ),
        Case::one(
            "14 TCP rule naming serve-81-udp matches nothing",
            vec![apply(
                "x",
                "mismatch",
                json!({"podSelector": {},
                       "ingress": [{"ports": [{"port": "serve-81-udp", "protocol": "TCP"}]}]}),
            )],
            x_closed(),
        ),
    ]);
    for (end, opens) in [(80, vec![80]), (84, vec![80, 81])] {
        cases.push(Case::one(
            &format!("15 TCP port 53 endPort {end}"),
            vec![apply(
                "x",
                "range",
                json!({"podSelector": {}, "ingress": [{"ports": [
                    {"port": 53, "endPort": end, "protocol": "TCP"}]}]}),
            )],
            with(
                x_closed(),
                opens
                    .into_iter()
                    .map(|p| (on(Some(Proto::Tcp), Some(p)), Reach::all(true)))
                    .collect(),
            ),
        ));
    }
    cases.extend([
        Case::one(
            "16 ports [{protocol: TCP}] is every TCP port",
            vec![apply(
                "x",
                "tcp",
                json!({"podSelector": {}, "ingress": [{"ports": [{"protocol": "TCP"}]}]}),
            )],
            with(
                x_closed(),
                vec![(on(Some(Proto::Tcp), None), Reach::all(true))],
            ),
        ),
        Case::one(
            "17 SCTP-only allow never opens TCP (or UDP)",
            vec![apply(
                "x",
                "sctp-only",
                json!({"podSelector": pod_sel("a"),
                       "ingress": [{"ports": [{"port": 81, "protocol": "SCTP"}]}]}),
            )],
            x_a_closed(),
        ),
        Case::one(
            "18 UDP-only allow never opens TCP",
            vec![apply(
                "x",
                "udp-only",
                json!({"podSelector": pod_sel("a"),
                       "ingress": [{"ports": [{"port": 81, "protocol": "UDP"}]}]}),
            )],
            with(
                x_a_closed(),
                vec![(on(Some(Proto::Udp), Some(81)), Reach::all(true))],
            ),
        ),
        Case::one(
            "19 two policies, one port each (union)",
            [80, 81]
                .into_iter()
                .map(|port| {
                    apply(
                        "x",
                        &format!("allow-{port}"),
                        json!({"podSelector": pod_sel("a"),
                               "ingress": [{"ports": [{"port": port}]}]}),
                    )
                })
                .collect(),
            with(
                x_a_closed(),
                vec![(on(Some(Proto::Tcp), None), Reach::all(true))],
            ),
        ),
        Case::new("20 a port allow, then ingress [{}] added")
            .step(
                vec![apply(
                    "x",
                    "p",
                    json!({"podSelector": pod_sel("a"), "ingress": [{"ports": [{"port": 80}]}]}),
                )],
                with(
                    x_a_closed(),
                    vec![(on(Some(Proto::Tcp), Some(80)), Reach::all(true))],
                ),
            )
            .step(
                vec![apply(
                    "x",
                    "p",
                    json!({"podSelector": pod_sel("a"),
                           "ingress": [{"ports": [{"port": 80}]}, {}]}),
                )],
                Reach::all(true),
            ),
        Case::one(
            "21 x/a egress deny-all (others still reach x/a)",
            vec![apply(
                "x",
                "no-egress",
                json!({"podSelector": pod_sel("a"), "policyTypes": ["Egress"]}),
            )],
            Reach::all(true).expect("x/a", "*", false),
        ),
        Case::one(
            "22 x/a egress only to y/a while y/a and y/b admit x/a",
            vec![
                apply(
                    "x",
                    "to-ya",
                    json!({"podSelector": pod_sel("a"), "policyTypes": ["Egress"],
                           "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"ns": "y"}},
                                               "podSelector": pod_sel("a")}]}]}),
                ),
                apply(
                    "y",
                    "from-xa",
                    json!({"podSelector": {"matchExpressions": [
                               {"key": "pod", "operator": "In", "values": ["a", "b"]}]},
                           "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "x"}},
                                                  "podSelector": pod_sel("a")}]}]}),
                ),
            ],
            Reach::all(true)
                .expect("x/a", "*", false)
                .expect("*", "y/a", false)
                .expect("*", "y/b", false)
                .expect("x/a", "y/a", true),
        ),
        Case::one(
            "23 x/a egress to ipBlock <y/b>/32 and /128",
            vec![apply(
                "x",
                "to-yb",
                json!({"podSelector": pod_sel("a"), "policyTypes": ["Egress"],
                       "egress": [{"to": host_blocks(pods, "y/b")}]}),
            )],
            Reach::all(true)
                .expect("x/a", "*", false)
                .expect("x/a", "y/b", true),
        ),
        Case::new("24, 25 ipBlock cluster range except x/b, then x/b allowed by another policy")
            .step(
                vec![apply(
                    "x",
                    "except",
                    json!({"podSelector": pod_sel("a"), "policyTypes": ["Egress"],
                           "egress": [{"to": wide_blocks_except(pods, "x/b")}]}),
                )],
                Reach::all(true).expect("x/a", "x/b", false),
            )
            .step(
                vec![apply(
                    "x",
                    "allow-xb",
                    json!({"podSelector": pod_sel("a"), "policyTypes": ["Egress"],
                           "egress": [{"to": host_blocks(pods, "x/b")}]}),
                )],
                Reach::all(true),
            ),
        Case::one(
            "26 x/a egress allow-all plus ingress deny",
            vec![apply(
                "x",
                "mixed",
                json!({"podSelector": pod_sel("a"),
                       "policyTypes": ["Ingress", "Egress"], "egress": [{}]}),
            )],
            x_a_closed(),
        ),
        Case::one(
            "27 egress rules, policyTypes omitted (ingress isolated too)",
            vec![apply(
                "x",
                "egress-only",
                json!({"podSelector": pod_sel("a"),
                       "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]}),
            )],
            x_a_closed()
                .expect("x/a", "*", false)
                .expect("x/a", "y/*", true),
        ),
        Case::one(
            "28 x/a from ns=y on port 80 (the IPv6 case; every case runs on each family)",
            vec![apply(
                "x",
                "x-a-from-y",
                json!({"podSelector": pod_sel("a"),
                       "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}],
                                    "ports": [{"port": 80}]}]}),
            )],
            with(
                x_a_closed(),
                vec![(
                    on(Some(Proto::Tcp), Some(80)),
                    x_a_closed().expect("y/*", "x/a", true),
                )],
            ),
        ),
    ]);
    cases
}

/// The time-ordered cases: a pod and a namespace relabelled in and out, a
/// policy updated from allow-all to deny-all and deleted.
pub fn time_ordered() -> Vec<Case> {
    let label_pod = |value: &str| Action::LabelPod {
        ns: "z".into(),
        name: "c".into(),
        key: "pod".into(),
        value: Some(value.into()),
    };
    let team = |value: Option<&str>| Action::LabelNamespace {
        ns: "y".into(),
        key: "team".into(),
        value: value.map(String::from),
    };
    let from_b = Reach::all(true)
        .expect("*", "x/a", false)
        .expect("x/b", "x/a", true)
        .expect("y/b", "x/a", true)
        .expect("z/b", "x/a", true);
    let closed = Reach::all(true).expect("*", "x/a", false);
    vec![
        Case::new("pod z/c relabelled pod=b (in), then back (out)")
            .step(
                vec![Action::apply(
                    "x",
                    "x-a-from-b",
                    json!({"podSelector": pod_sel("a"),
                           "ingress": [{"from": [{"namespaceSelector": {},
                                                  "podSelector": pod_sel("b")}]}]}),
                )],
                from_b.clone(),
            )
            .step(
                vec![label_pod("b")],
                from_b.clone().expect("z/c", "x/a", true),
            )
            .step(vec![label_pod("c")], from_b),
        Case::new("namespace y labelled team=blue (in), then unlabelled (out)")
            .step(
                vec![Action::apply(
                    "x",
                    "from-team",
                    json!({"podSelector": pod_sel("a"),
                           "ingress": [{"from": [{"namespaceSelector":
                                                  {"matchLabels": {"team": "blue"}}}]}]}),
                )],
                closed.clone(),
            )
            .step(
                vec![team(Some("blue"))],
                closed.clone().expect("y/*", "x/a", true),
            )
            .step(vec![team(None)], closed),
        Case::new("policy updated allow-all -> deny-all, then deleted")
            .step(
                vec![Action::apply(
                    "x",
                    "p",
                    json!({"podSelector": {}, "ingress": [{}]}),
                )],
                Reach::all(true),
            )
            .step(
                vec![Action::apply("x", "p", json!({"podSelector": {}}))],
                Reach::all(true).expect("*", "x/*", false),
            )
            .step(
                vec![Action::Delete {
                    ns: "x".into(),
                    name: "p".into(),
                }],
                Reach::all(true),
            ),
    ]
}

/// Default-deny-all on x, with node rows: a node still reaches its own
/// x pod (kubelet probes), and no other.
pub fn node_to_own_pod(pods: &[Pod]) -> Case {
    let mut want = Reach::all(true)
        .expect("*", "x/*", false)
        .expect("x/*", "*", false);
    for p in pods {
        if let Some(k) = &p.kube
            && k.namespace == "x"
        {
            want = want.expect(&format!("node{}", p.node), &k.label(), true);
        }
    }
    Case::one(
        "node to its own pod under default-deny-all",
        vec![Action::apply(
            "x",
            "deny-all",
            json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
        )],
        want,
    )
}

/// With a pod `y/d` whose `serve-80-tcp` is another number than its
/// neighbours' 80: a named port follows it, a numeric 80 does not.
pub fn named_port_elsewhere(dest: &str) -> Vec<Case> {
    let tcp80 = on(Some(Proto::Tcp), Some(80));
    vec![
        Case::one(
            &format!("13 egress to serve-80-tcp reaches {dest} on its own number"),
            vec![Action::apply(
                "x",
                "named-egress",
                json!({"podSelector": {}, "policyTypes": ["Egress"],
                       "egress": [{"ports": [{"port": "serve-80-tcp", "protocol": "TCP"}]}]}),
            )],
            with(
                Reach::all(true).expect("x/*", "*", false),
                vec![(tcp80, Reach::all(true))],
            ),
        ),
        Case::one(
            &format!("egress to TCP 80 by number does not reach {dest}"),
            vec![Action::apply(
                "x",
                "numeric-egress",
                json!({"podSelector": {}, "policyTypes": ["Egress"],
                       "egress": [{"ports": [{"port": 80, "protocol": "TCP"}]}]}),
            )],
            with(
                Reach::all(true).expect("x/*", "*", false),
                vec![(tcp80, Reach::all(true).expect("x/*", dest, false))],
            ),
        ),
        Case::one(
            &format!("ingress on serve-80-tcp opens {dest}'s own number"),
            vec![Action::apply(
                "y",
                "named-ingress",
                json!({"podSelector": {}, "ingress": [{"ports": [{"port": "serve-80-tcp"}]}]}),
            )],
            with(
                Reach::all(true).expect("*", "y/*", false),
                vec![(tcp80, Reach::all(true))],
            ),
        ),
    ]
}

/// The sample `cargo xtask lab` shows: default-deny ingress in x, and one
/// allow (x/a from namespace y on TCP 80).
pub fn sample() -> Case {
    Case::one(
        "sample: default-deny ingress in x, x/a allowed from namespace y on TCP 80",
        vec![
            Action::apply("x", "default-deny-ingress", json!({"podSelector": {}})),
            Action::apply(
                "x",
                "allow-x-a-from-y-tcp-80",
                json!({"podSelector": pod_sel("a"),
                       "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}],
                                    "ports": [{"port": 80, "protocol": "TCP"}]}]}),
            ),
        ],
        with(
            Reach::all(true).expect("*", "x/*", false),
            vec![(
                on(Some(Proto::Tcp), Some(80)),
                Reach::all(true)
                    .expect("*", "x/*", false)
                    .expect("y/*", "x/a", true),
            )],
        ),
    )
}
