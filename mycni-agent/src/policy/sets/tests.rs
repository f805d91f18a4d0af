use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use serde_json::json;

use super::*;
use crate::policy::compile_node;
use crate::policy::tests::fixture::{model, np, pod_ip};

fn cidr(s: &str) -> Cidr {
    let (a, p) = s.split_once('/').unwrap_or((s, "32"));
    Cidr::new(
        a.parse().unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        p.parse().unwrap_or(32),
    )
    .unwrap_or_else(|| Cidr::host(IpAddr::V4(Ipv4Addr::UNSPECIFIED)))
}

fn covers(rects: &[(Cidr, u16, u16)], ip: IpAddr, port: u16) -> usize {
    rects
        .iter()
        .filter(|(c, s, e)| c.contains(ip) && (*s..=*e).contains(&port))
        .count()
}

/// A tiny deterministic generator: the property needs variety, not
/// cryptographic randomness.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// The disjoint form covers exactly the (address, port) pairs of the
/// overlapping input, and no pair twice (which the kernel would refuse).
#[test]
fn disjoint_rectangles_cover_the_same_pairs_once() {
    let mut rng = Lcg(7);
    for _ in 0..300 {
        let n = 1 + rng.next(6) as usize;
        let rects: Vec<(Cidr, u16, u16)> = (0..n)
            .map(|_| {
                let len = [8u8, 16, 24, 28, 30, 32][rng.next(6) as usize];
                let a = Ipv4Addr::new(10, rng.next(2) as u8, rng.next(4) as u8, rng.next(16) as u8);
                let c = Cidr::new(a.into(), len).unwrap_or_else(|| Cidr::host(a.into()));
                let s = rng.next(100) as u16;
                (c, s, s + rng.next(20) as u16)
            })
            .collect();
        let out = disjoint(&rects);
        for _ in 0..400 {
            let ip: IpAddr =
                Ipv4Addr::new(10, rng.next(2) as u8, rng.next(4) as u8, rng.next(16) as u8).into();
            let port = rng.next(130) as u16;
            let want = covers(&rects, ip, port) > 0;
            let got = covers(&out, ip, port);
            assert!(
                got <= 1,
                "{ip}:{port} covered {got} times by {out:?} from {rects:?}"
            );
            assert_eq!(got == 1, want, "{ip}:{port}: {out:?} from {rects:?}");
        }
    }
}

#[test]
fn ports_merge_where_they_touch_or_overlap() {
    assert_eq!(
        merge(vec![(81, 81), (80, 80), (90, 95), (94, 99)]),
        vec![(80, 81), (90, 99)]
    );
    assert_eq!(merge(vec![(0, 65535), (80, 80)]), vec![(0, 65535)]);
}

#[test]
fn outermost_keeps_the_covering_prefixes() {
    let got = outermost(&[
        cidr("10.0.0.0/8"),
        cidr("10.1.0.0/16"),
        cidr("192.168.1.1/32"),
        cidr("10.0.0.0/8"),
    ]);
    assert_eq!(
        got,
        BTreeSet::from([cidr("10.0.0.0/8"), cidr("192.168.1.1/32")])
    );
}

fn on_node(policies: &[(&str, &str, serde_json::Value)], node: &str) -> Desired {
    let mut c = model();
    for (ns, name, spec) in policies {
        c.add_policy(np(ns, name, spec.clone()));
    }
    // The fixture's pods have no node: put them all on `node`.
    for p in c.pods.values_mut() {
        p.node = Some(node.to_string());
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
    assert_eq!(set(&d, SetKind::InIso, false), vec![xa.to_string()]);
    assert_eq!(
        set(&d, SetKind::InAllow, false),
        vec![format!("{xa} . {xb}/32 . tcp . 81-81")]
    );
    assert!(set(&d, SetKind::InAny, false).is_empty());
    assert!(set(&d, SetKind::EgIso, false).is_empty());
    let (xa6, xb6) = (pod_ip("x", "a", true), pod_ip("x", "b", true));
    assert_eq!(
        set(&d, SetKind::InAllow, true),
        vec![format!("{xa6} . {xb6}/128 . tcp . 81-81")]
    );
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
    assert!(set(&d, SetKind::InAny, false).contains(&format!("{xa} . 0.0.0.0/0")));
    let xa6 = pod_ip("x", "a", true);
    assert!(set(&d, SetKind::InAny, true).contains(&format!("{xa6} . ::/0")));
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
    // x/b's address gets 80-81 once; the rest of 10/8 gets 80 alone.
    let xa = pod_ip("x", "a", false);
    assert!(
        members.contains(&format!("{xa} . {xb}/32 . tcp . 80-81")),
        "{members:?}"
    );
    assert!(
        !members.iter().any(|m| m.contains("10.0.0.0/8")),
        "{members:?}"
    );
    let mut by_remote: BTreeMap<String, usize> = BTreeMap::new();
    for m in &members {
        *by_remote
            .entry(m.split(" . ").nth(1).unwrap_or_default().to_string())
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
    // in_iso and known of both families.
    assert_eq!(gone.len(), 4, "{gone:?}");
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
