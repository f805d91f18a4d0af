//! The upstream time-ordered cases, as far as a pure module can show them:
//! after each cache change, the evaluator and a fresh compile both give the
//! new table. (How fast the datapath follows is the lab's to measure.)

use serde_json::json;

use super::fixture::{Reach, check_tcp, labels, model, np, pod_ip, serve_ports};
use crate::cluster::{Cluster, Key, Pod};
use crate::policy::{DirectionRules, compile_pod};

fn allow_from_pod_b(c: &mut Cluster) {
    c.add_policy(np(
        "x",
        "x-a-from-b",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
               "ingress": [{"from": [{"namespaceSelector": {},
                                      "podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
    ));
}

/// "should enforce policy to allow ingress traffic from pods in all
/// namespaces" after a relabel: z/c gets `pod=b` (in), then loses it (out).
#[test]
fn pod_relabelled_in_then_out() {
    let mut c = model();
    allow_from_pod_b(&mut c);
    let base = Reach::all(true)
        .expect("*", "x/a", false)
        .expect("x/b", "x/a", true)
        .expect("y/b", "x/a", true)
        .expect("z/b", "x/a", true);
    check_tcp(&c, &base);
    let zc = Key::new("z", "c");
    std::sync::Arc::make_mut(c.pods.get_mut(&zc).expect("z/c")).labels = labels(&[("pod", "b")]);
    check_tcp(&c, &base.clone().expect("z/c", "x/a", true));
    std::sync::Arc::make_mut(c.pods.get_mut(&zc).expect("z/c")).labels = labels(&[("pod", "c")]);
    check_tcp(&c, &base);
}

/// "should enforce policy based on NamespaceSelector with MatchExpressions
/// using default ns label" after a namespace relabel in, then out.
#[test]
fn namespace_relabelled_in_then_out() {
    let mut c = model();
    c.add_policy(np(
        "x",
        "from-team",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
               "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "blue"}}}]}]}),
    ));
    let closed = Reach::all(true).expect("*", "x/a", false);
    check_tcp(&c, &closed);
    let set_team = |c: &mut Cluster, v: Option<&str>| {
        let ns = std::sync::Arc::make_mut(c.namespaces.get_mut("y").expect("y"));
        match v {
            Some(v) => ns.labels.insert("team".into(), v.into()),
            None => ns.labels.remove("team"),
        };
    };
    set_team(&mut c, Some("blue"));
    check_tcp(&c, &closed.clone().expect("y/*", "x/a", true));
    set_team(&mut c, None);
    check_tcp(&c, &closed);
}

/// "should allow ingress access from updated pod" / "should enforce
/// updated policy": allow-all replaced by deny-all under the same name,
/// then deleted (connectivity back).
#[test]
fn policy_updated_then_deleted() {
    let mut c = model();
    c.add_policy(np("x", "p", json!({"podSelector": {}, "ingress": [{}]})));
    check_tcp(&c, &Reach::all(true));
    c.add_policy(np("x", "p", json!({"podSelector": {}})));
    check_tcp(&c, &Reach::all(true).expect("*", "x/*", false));
    c.policies.remove(&Key::new("x", "p"));
    check_tcp(&c, &Reach::all(true));
}

/// A pod created after the policy is isolated from its first compile,
/// before anything allows it (rule 14: isolation must not lag).
#[test]
fn pod_created_after_policy_is_isolated_at_once() {
    let mut c = model();
    c.add_policy(np("x", "deny", json!({"podSelector": {}})));
    let late = Pod {
        key: Key::new("x", "d"),
        labels: labels(&[("pod", "d")]),
        ips: vec![pod_ip("x", "d", false)],
        ports: serve_ports(),
        host_network: false,
        node: Some("node-0".into()),
    };
    c.add_pod(late.clone());
    let compiled = compile_pod(&c, &late);
    assert!(matches!(
        compiled.ingress,
        DirectionRules::Isolated { ref allows, .. } if allows.is_empty()
    ));
    assert_eq!(compiled.egress, DirectionRules::Open);
}
