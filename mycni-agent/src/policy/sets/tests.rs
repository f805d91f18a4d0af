use std::collections::BTreeMap;

use serde_json::json;

use super::*;
use crate::cluster::fixture::{model, np, pod_ip};
use crate::policy::compile_node;

fn rule(policy: &str, direction: Direction, index: usize) -> RuleRef {
    RuleRef {
        policy: Key::new("x", policy),
        direction,
        index,
    }
}

fn on_node(policies: &[(&str, &str, serde_json::Value)], node: &str) -> Desired {
    let mut c = model();
    for (ns, name, spec) in policies {
        c.add_policy(np(ns, name, spec.clone()));
    }
    // The fixture's pods have no node: put them all on `node`.
    for p in c.pods.values_mut() {
        std::sync::Arc::make_mut(p).node = Some(node.to_string());
    }
    desired(&compile_node(&c, node), !policies.is_empty())
}

fn set(d: &Desired, kind: SetKind, v6: bool) -> Vec<String> {
    d.members(SetName { kind, v6 }).cloned().collect()
}

#[test]
fn no_policy_isolates_nothing() {
    let d = on_node(&[], "n1");
    assert!(d.isolated.is_empty());
    for kind in [
        SetKind::EgIso,
        SetKind::InIso,
        SetKind::EgAllow,
        SetKind::InAllow,
    ] {
        assert!(set(&d, kind, false).is_empty());
    }
    // Every pod still has its hairpin pair, on both families.
    assert_eq!(set(&d, SetKind::SelfPair, false).len(), 9);
    assert_eq!(set(&d, SetKind::SelfPair, true).len(), 9);
}

#[test]
fn an_allow_from_one_pod_on_one_port() {
    let d = on_node(
        &[(
            "x",
            "a-from-b-81",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}],
                                "ports": [{"port": 81}]}]}),
        )],
        "n1",
    );
    let (xa, xb) = (pod_ip("x", "a", false), pod_ip("x", "b", false));
    let a = Key::new("x", "a");
    let c = rule_counter(&a, &rule("a-from-b-81", Direction::Ingress, 0));
    assert_eq!(set(&d, SetKind::InIso, false), vec![xa.to_string()]);
    assert_eq!(
        set(&d, SetKind::InAllow, false),
        vec![format!("{xb}/32 . {xa} . tcp . 81-81 : \"{c}\"")]
    );
    assert!(set(&d, SetKind::InAny, false).is_empty());
    assert!(set(&d, SetKind::EgIso, false).is_empty());
    let (xa6, xb6) = (pod_ip("x", "a", true), pod_ip("x", "b", true));
    assert_eq!(
        set(&d, SetKind::InAllow, true),
        vec![format!("{xb6}/128 . {xa6} . tcp . 81-81 : \"{c}\"")]
    );
    // What no rule admits counts under x/a's own counter, charged to the
    // policy isolating it.
    let denied = pod_counter(&a, Direction::Ingress);
    assert_eq!(
        set(&d, SetKind::InDeny, false),
        vec![format!("{xa} : \"{denied}\"")]
    );
    assert_eq!(
        d.counters[&denied].series,
        vec![Series::Denied {
            policy: Key::new("x", "a-from-b-81"),
            direction: Direction::Ingress
        }]
    );
    assert_eq!(d.counters[&c].comment, "x/a: x/a-from-b-81 ingress[0]");
    assert_eq!(d.counters.len(), 2);
}

#[test]
fn deny_all_isolates_both_directions_with_nothing_allowed() {
    let d = on_node(
        &[(
            "x",
            "deny",
            json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
        )],
        "n1",
    );
    assert_eq!(set(&d, SetKind::InIso, false).len(), 3);
    assert_eq!(set(&d, SetKind::EgIso, false).len(), 3);
    assert_eq!(set(&d, SetKind::InIso, true).len(), 3);
    assert!(
        set(&d, SetKind::InAllow, false).is_empty() && set(&d, SetKind::EgAny, false).is_empty()
    );
}

#[test]
fn allow_all_ingress_is_the_default_route_of_each_family() {
    let d = on_node(
        &[("x", "all", json!({"podSelector": {}, "ingress": [{}]}))],
        "n1",
    );
    let xa = pod_ip("x", "a", false);
    let c = rule_counter(&Key::new("x", "a"), &rule("all", Direction::Ingress, 0));
    assert!(set(&d, SetKind::InAny, false).contains(&format!("0.0.0.0/0 . {xa} : \"{c}\"")));
    let xa6 = pod_ip("x", "a", true);
    assert!(set(&d, SetKind::InAny, true).contains(&format!("::/0 . {xa6} : \"{c}\"")));
}

#[test]
fn overlapping_rules_become_disjoint_members() {
    let xb = pod_ip("x", "b", false);
    let d = on_node(
        &[
            (
                "x",
                "wide",
                json!({"podSelector": {"matchLabels": {"pod": "a"}},
                       "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}],
                                    "ports": [{"port": 80}]}]}),
            ),
            (
                "x",
                "narrow",
                json!({"podSelector": {"matchLabels": {"pod": "a"}},
                       "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}],
                                    "ports": [{"port": 81}, {"port": 80}]}]}),
            ),
        ],
        "n1",
    );
    let members = set(&d, SetKind::InAllow, false);
    // x/b's address gets 80-81 once, counted under x/narrow (before
    // x/wide); the rest of 10/8 gets 80 alone, under x/wide.
    let xa = pod_ip("x", "a", false);
    let a = Key::new("x", "a");
    let narrow = rule_counter(&a, &rule("narrow", Direction::Ingress, 0));
    let wide = rule_counter(&a, &rule("wide", Direction::Ingress, 0));
    assert!(
        members.contains(&format!("{xb}/32 . {xa} . tcp . 80-81 : \"{narrow}\"")),
        "{members:?}"
    );
    assert!(
        members
            .iter()
            .any(|m| m.ends_with(&format!("tcp . 80-80 : \"{wide}\""))),
        "{members:?}"
    );
    assert!(
        !members.iter().any(|m| m.contains("10.0.0.0/8")),
        "{members:?}"
    );
    let mut by_remote: BTreeMap<String, usize> = BTreeMap::new();
    for m in &members {
        *by_remote
            .entry(m.split(" . ").next().unwrap_or_default().to_string())
            .or_default() += 1;
    }
    assert!(by_remote.values().all(|n| *n == 1), "{members:?}");
}

#[test]
fn pods_of_other_nodes_get_no_members() {
    let mut c = model();
    c.add_policy(np("x", "deny", json!({"podSelector": {}})));
    assert!(desired(&compile_node(&c, "elsewhere"), true).is_empty());
}

#[test]
fn minus_is_per_set() {
    let a = on_node(&[("x", "deny", json!({"podSelector": {}}))], "n1");
    let b = on_node(&[], "n1");
    let gone = a.minus(&b);
    // in_iso, in_deny and known of both families.
    assert_eq!(gone.len(), 6, "{gone:?}");
    // The denial counters of x's three pods.
    assert_eq!(a.counters_minus(&b).len(), 3);
    assert!(b.counters_minus(&a).is_empty());
    // known: the default routes of the open node.
    assert_eq!(b.minus(&a).len(), 2);
}

/// With no policy at all nothing fails closed (every address is known);
/// once one exists, only the pods the room compiled are.
#[test]
fn known_is_everything_until_a_policy_exists() {
    let open = on_node(&[], "n1");
    assert_eq!(
        set(&open, SetKind::Known, false),
        vec!["0.0.0.0/0".to_string()]
    );
    assert_eq!(set(&open, SetKind::Known, true), vec!["::/0".to_string()]);
    let some = on_node(
        &[(
            "z",
            "unrelated",
            json!({"podSelector": {"matchLabels": {"pod": "none"}}}),
        )],
        "n1",
    );
    let known = set(&some, SetKind::Known, false);
    assert_eq!(known.len(), 9);
    assert!(known.contains(&format!("{}/32", pod_ip("x", "a", false))));
    assert_eq!(set(&some, SetKind::Known, true).len(), 9);
}
