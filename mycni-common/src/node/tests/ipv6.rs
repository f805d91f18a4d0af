//! Node validation: the IPv6 side, the IPv6 underlay and IPv6-only nodes.

use super::*;

#[test]
fn a_bad_ipv6_side_is_rejected_alone_and_counted() {
    let nodes = [
        dual("bad6", &["10.244.1.0/24", "fd00:10:244:1::1/64"], 1),
        dual("short", &["10.244.2.0/24", "fd00:10:244:2::/126"], 2),
        dual("outside", &["10.244.3.0/24", "fd00:99::/64"], 3),
        dual(
            "two6",
            &["10.244.4.0/24", "fd00:10:244:4::/64", "fd00:10:244:5::/64"],
            4,
        ),
        dual("garbage6", &["10.244.5.0/24", "::💥/64"], 5),
        dual("own6", &["10.244.6.0/24", "fd00:10:244::/64"], 6),
        dual("x", &["10.244.7.0/24", "fd00:10:244:6::/63"], 7),
        dual("y", &["10.244.8.0/24", "fd00:10:244:7::/64"], 8),
        dual("good", &["10.244.9.0/24", "fd00:10:244:9::/64"], 9),
        // Whole-peer rejections.
        dual("v6only", &["fd00:10:244:a::/64"], 10),
        dual("two4", &["10.244.11.0/24", "10.244.12.0/24"], 11),
    ];
    let own = PodCidrs {
        v4: Cidr4::parse_network("10.244.0.0/24").ok(),
        v6: Cidr6::parse_network("fd00:10:244::/64").ok(),
    };
    let (peers, rejected) = select_peers(&nodes, "me", own, cluster2());
    let programmed: Vec<(&str, bool)> = peers
        .iter()
        .map(|p| (p.name.as_str(), p.pod_cidr6.is_some()))
        .collect();
    assert_eq!(
        programmed,
        [
            ("bad6", false),
            ("garbage6", false),
            ("good", true),
            ("outside", false),
            ("own6", false),
            ("short", false),
            ("two6", false),
            ("x", false),
            ("y", false),
        ]
    );
    let mut rej: Vec<(&str, &str, bool)> = rejected
        .iter()
        .map(|(n, r)| (n.as_str(), r.reason(), r.ipv6_side_only()))
        .collect();
    rej.sort();
    assert_eq!(
        rej,
        [
            ("bad6", "bad_pod_cidr_v6", true),
            ("garbage6", "bad_pod_cidr_v6", true),
            ("outside", "outside_cluster_cidr_v6", true),
            ("own6", "overlaps_own_v6", true),
            ("short", "bad_pod_cidr_v6", true),
            ("two4", "bad_pod_cidr", false),
            ("two6", "bad_pod_cidr_v6", true),
            ("v6only", "no_ipv4_pod_cidr", false),
            ("x", "overlaps_peer_v6", true),
            ("y", "overlaps_peer_v6", true),
        ]
    );
    for (_, r) in &rejected {
        assert!(!r.to_string().is_empty());
    }
    // The outcome does not depend on the order Nodes arrive in.
    let mut rev = nodes.to_vec();
    rev.reverse();
    let (peers2, mut rejected2) = select_peers(&rev, "me", own, cluster2());
    assert_eq!(peers, peers2);
    let mut rejected = rejected;
    rejected.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.reason().cmp(b.1.reason())));
    rejected2.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.reason().cmp(b.1.reason())));
    assert_eq!(rejected, rejected2);
}

fn with_underlay6(mut n: NodeView, ip: Option<&str>, mac: Option<&str>) -> NodeView {
    if let Some(i) = ip {
        n.annotations
            .insert(ANNOTATION_HOST_IP6.to_string(), i.to_string());
    }
    if let Some(m) = mac {
        n.annotations
            .insert(ANNOTATION_VTEP_MAC6.to_string(), m.to_string());
    }
    n
}

#[test]
fn an_ipv6_underlay_is_parsed_and_a_bad_one_rejected_alone_and_counted() {
    let good = with_underlay6(
        dual("a", &["10.244.1.0/24", "fd00:10:244:1::/64"], 1),
        Some(" fd00:77::2 "),
        Some("02:00:00:00:06:01"),
    );
    let p = parse_peer(&good, cluster2()).unwrap();
    assert_eq!(
        p.underlay6,
        Some(Underlay6 {
            host_ip: "fd00:77::2".parse().unwrap(),
            vtep_mac: Mac([2, 0, 0, 0, 6, 1]),
        })
    );
    assert_eq!(
        parse_peer(&dual("a", &["10.244.1.0/24"], 1), cluster2())
            .unwrap()
            .underlay6,
        None
    );
    let cases = [
        (Some("fe80::1"), Some("02:00:00:00:06:01"), "bad_host_ip_v6"),
        (Some("::1"), Some("02:00:00:00:06:01"), "bad_host_ip_v6"),
        (Some("::"), Some("02:00:00:00:06:01"), "bad_host_ip_v6"),
        (Some("ff02::1"), Some("02:00:00:00:06:01"), "bad_host_ip_v6"),
        (
            Some("::ffff:192.168.0.2"),
            Some("02:00:00:00:06:01"),
            "bad_host_ip_v6",
        ),
        (
            Some("192.168.0.2"),
            Some("02:00:00:00:06:01"),
            "bad_host_ip_v6",
        ),
        (
            Some("fd00:77::2%eth0"),
            Some("02:00:00:00:06:01"),
            "bad_host_ip_v6",
        ),
        (
            Some("\u{0}garbage"),
            Some("02:00:00:00:06:01"),
            "bad_host_ip_v6",
        ),
        (Some("fd00:77::2"), Some("01:00:5e:00:00:01"), "bad_mac_v6"),
        (Some("fd00:77::2"), Some("00:00:00:00:00:00"), "bad_mac_v6"),
        (Some("fd00:77::2"), Some("+1"), "bad_mac_v6"),
        (Some("fd00:77::2"), None, "incomplete_underlay_v6"),
        (None, Some("02:00:00:00:06:01"), "incomplete_underlay_v6"),
    ];
    for (ip, mac, reason) in cases {
        let n = with_underlay6(dual("b", &["10.244.2.0/24"], 2), ip, mac);
        // The rest of the peer is programmed, without its IPv6 underlay.
        let (peers, rejected) = select_peers(&[n], "me", None, cluster2());
        assert_eq!(peers.len(), 1, "{ip:?} {mac:?}");
        assert_eq!(peers[0].underlay6, None, "{ip:?} {mac:?}");
        assert_eq!(rejected.len(), 1, "{ip:?} {mac:?}: {rejected:?}");
        assert_eq!(rejected[0].1.reason(), reason, "{ip:?} {mac:?}");
        assert!(rejected[0].1.ipv6_side_only());
    }
    // A bad IPv6 podCIDR and a bad IPv6 underlay: both said.
    let n = with_underlay6(
        dual("b", &["10.244.2.0/24", "fd00:99::/64"], 2),
        Some("fe80::1"),
        Some("02:00:00:00:06:01"),
    );
    let (peers, rejected) = select_peers(&[n], "me", None, cluster2());
    assert_eq!(peers.len(), 1);
    let reasons: Vec<_> = rejected.iter().map(|(_, r)| r.reason()).collect();
    assert_eq!(reasons, ["outside_cluster_cidr_v6", "bad_host_ip_v6"]);
    // Two Nodes with one vxlan6.1 MAC lose their IPv6 underlay, both.
    let same = |name, mac, ip: &str| {
        with_underlay6(
            dual(name, &[ip], mac),
            Some("fd00:77::9"),
            Some("02:00:00:00:06:09"),
        )
    };
    let (peers, rejected) = select_peers(
        &[
            same("b", 2, "10.244.2.0/24"),
            same("c", 3, "10.244.3.0/24"),
            good,
        ],
        "me",
        None,
        cluster2(),
    );
    assert_eq!(peers.len(), 3);
    assert_eq!(
        peers
            .iter()
            .map(|p| p.underlay6.is_some())
            .collect::<Vec<_>>(),
        [true, false, false]
    );
    assert_eq!(
        rejected
            .iter()
            .map(|(n, r)| (n.as_str(), r.reason()))
            .collect::<Vec<_>>(),
        [
            ("b", "duplicate_vtep_mac_v6"),
            ("c", "duplicate_vtep_mac_v6")
        ]
    );
}

/// An IPv6-only Node: an IPv6 podCIDR and an IPv6 underlay, no IPv4.
fn v6_only(name: &str, cidr6: &str, n: u8) -> NodeView {
    let mut v = with_underlay6(
        view(name, None, None, None),
        Some(&format!("fd00:77::{n:x}")),
        Some(&format!("02:00:00:00:06:{n:02x}")),
    );
    v.pod_cidrs = vec![cidr6.to_string()];
    v
}

#[test]
fn an_ipv6_only_node_is_a_peer_over_the_ipv6_underlay() {
    let own = PodCidrs {
        v4: Cidr4::parse_network("10.244.0.0/24").ok(),
        v6: Cidr6::parse_network("fd00:10:244::/64").ok(),
    };
    let dual_peer = with_underlay6(
        dual("d", &["10.244.1.0/24", "fd00:10:244:1::/64"], 1),
        Some("fd00:77::1"),
        Some("02:00:00:00:06:01"),
    );
    let s = select_all(
        &[
            v6_only("a", "fd00:10:244:a::/64", 0xa),
            dual_peer.clone(),
            // Overlaps this node's IPv6 range, another IPv6-only
            // node's and the dual peer's.
            v6_only("own", "fd00:10:244::/64", 0xb),
            v6_only("x", "fd00:10:244:a::/64", 0xc),
            v6_only("y", "fd00:10:244:1::/64", 0xd),
            // No IPv6 underlay, or a bad one: rejected as before.
            view("z", Some("fd00:10:244:f::/64"), None, None),
            with_underlay6(
                v6_only("w", "fd00:10:244:e::/64", 0xe),
                Some("fe80::1"),
                None,
            ),
            // Outside the IPv6 cluster range.
            v6_only("o", "fd00:99::/64", 0xf),
        ],
        "me",
        own,
        cluster2(),
    );
    assert_eq!(s.peers.len(), 1);
    // The dual peer keeps its IPv4 side and its IPv6 underlay, not its
    // IPv6 podCIDR, which an IPv6-only node claims too.
    assert_eq!(
        (s.peers[0].pod_cidr6, s.peers[0].underlay6.is_some()),
        (None, true)
    );
    assert!(s.peers6.is_empty(), "{:?}", s.peers6);
    let mut reasons: Vec<_> = s
        .rejected
        .iter()
        .map(|(n, r)| (n.as_str(), r.reason()))
        .collect();
    reasons.sort();
    assert_eq!(
        reasons,
        [
            ("a", "overlaps_peer_v6"),
            ("d", "overlaps_peer_v6"),
            ("o", "no_ipv4_pod_cidr"),
            ("own", "overlaps_own_v6"),
            ("w", "no_ipv4_pod_cidr"),
            ("x", "overlaps_peer_v6"),
            ("y", "overlaps_peer_v6"),
            ("z", "no_ipv4_pod_cidr"),
        ]
    );
    // Alone, each good one is a peer.
    let s = select_all(
        &[v6_only("a", "fd00:10:244:a::/64", 0xa), dual_peer],
        "me",
        own,
        cluster2(),
    );
    assert!(s.rejected.is_empty(), "{:?}", s.rejected);
    assert_eq!(s.peers.len(), 1);
    assert_eq!(
        s.peers[0].pod_cidr6,
        Cidr6::parse_network("fd00:10:244:1::/64").ok()
    );
    assert_eq!(
        s.peers6,
        [Peer6 {
            name: "a".into(),
            pod_cidr6: Cidr6::parse_network("fd00:10:244:a::/64").unwrap(),
            underlay6: Underlay6 {
                host_ip: "fd00:77::a".parse().unwrap(),
                vtep_mac: Mac([2, 0, 0, 0, 6, 0xa]),
            },
        }]
    );
    // A dual-stack Node without IPv4 host address is one too.
    let mut no_v4_host = with_underlay6(
        dual("b", &["10.244.2.0/24", "fd00:10:244:2::/64"], 2),
        Some("fd00:77::2"),
        Some("02:00:00:00:06:02"),
    );
    no_v4_host.annotations.remove(ANNOTATION_HOST_IP);
    let s = select_all(&[no_v4_host.clone()], "me", own, cluster2());
    assert_eq!((s.peers.len(), s.peers6.len()), (0, 1));
    // Two IPv6-only Nodes with one vxlan6.1 MAC: neither.
    let mut twin = v6_only("c", "fd00:10:244:c::/64", 0xc);
    twin.annotations
        .insert(ANNOTATION_VTEP_MAC6.into(), "02:00:00:00:06:02".into());
    let s = select_all(&[no_v4_host, twin], "me", own, cluster2());
    assert!(s.peers6.is_empty());
    assert_eq!(s.rejected.len(), 2, "{:?}", s.rejected);
    assert!(
        s.rejected
            .iter()
            .all(|(_, r)| r.reason() == "duplicate_vtep_mac_v6")
    );
}

#[test]
fn a_node_rejected_whole_has_one_reason() {
    // Found by the peer_node fuzz target: a bad IPv6 side was reported
    // for a Node then rejected as a whole (here: a shared VTEP MAC).
    let nodes = [
        dual("a", &["10.244.1.0/24", "fd00:10:244:1::1/64"], 1),
        dual("b", &["10.244.2.0/24"], 1),
    ];
    let (peers, rejected) = select_peers(&nodes, "me", None, cluster2());
    assert!(peers.is_empty());
    let reasons: Vec<&str> = rejected.iter().map(|(_, r)| r.reason()).collect();
    assert_eq!(reasons, ["duplicate_vtep_mac", "duplicate_vtep_mac"]);
}

#[test]
fn own_pod_cidrs() {
    let own = |cidrs: &[&str]| dual("me", cidrs, 1).own_pod_cidrs(cluster2());
    let v4 = Cidr4::parse_network("10.244.1.0/24").ok();
    let v6 = Cidr6::parse_network("fd00:10:244:1::/64").ok();
    assert_eq!(
        own(&["fd00:10:244:1::/64", "10.244.1.0/24"]),
        Ok(PodCidrs { v4, v6 })
    );
    assert_eq!(own(&["10.244.1.0/24"]), Ok(PodCidrs { v4, v6: None }));
    // No IPv6 cluster CIDR: the IPv6 range is ignored.
    assert_eq!(
        dual("me", &["10.244.1.0/24", "fd00:10:244:1::/64"], 1).own_pod_cidrs(cluster().into()),
        Ok(PodCidrs { v4, v6: None })
    );
    for bad in [
        &[][..],
        &["fd00:10:244:1::/64"],
        &["10.244.1.0/24", "10.244.2.0/24"],
        &["10.244.1.0/24", "fd00:99::/64"],
        &["10.244.1.0/24", "fd00:10:244:1::/64", "fd00:10:244:2::/64"],
        &["10.245.1.0/24"],
    ] {
        assert!(own(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn cluster_cidrs_need_one_family_at_least() {
    assert!(ClusterCidrs::new(None, None).is_err());
    let c6 = ClusterCidrs::new(None, Cidr6::parse_network("fd00:10:244::/56").ok());
    assert_eq!(c6, Ok(cluster6()));
    assert!(cluster6().ipv6_only() && !cluster2().ipv6_only());
    assert!(!ClusterCidrs::from(cluster()).ipv6_only());
    assert_eq!(cluster6().to_string(), "fd00:10:244::/56");
    assert_eq!(cluster2().to_string(), "10.244.0.0/16,fd00:10:244::/56");
    assert_eq!(ClusterCidrs::from(cluster()).to_string(), "10.244.0.0/16");
}

#[test]
fn own_pod_cidrs_of_an_ipv6_only_node() {
    let own = |cidrs: &[&str]| dual("me", cidrs, 1).own_pod_cidrs(cluster6());
    let v6 = Cidr6::parse_network("fd00:10:244:1::/64").ok();
    assert_eq!(own(&["fd00:10:244:1::/64"]), Ok(PodCidrs { v4: None, v6 }));
    // An IPv6-only cluster routes no IPv4: a node's IPv4 range is
    // ignored, as an IPv6 one is in an IPv4-only cluster.
    assert_eq!(
        own(&["10.244.1.0/24", "fd00:10:244:1::/64"]),
        Ok(PodCidrs { v4: None, v6 })
    );
    let e = own(&["10.244.1.0/24"]).expect_err("IPv4 only");
    assert!(e.contains("no IPv6 range"), "{e}");
    for bad in [
        &[][..],
        &["fd00:99::/64"],
        &["fd00:10:244:1::1/64"],
        &["fd00:10:244:1::/126"],
        &["fd00:10:244:1::/64", "fd00:10:244:2::/64"],
        &["garbage"],
    ] {
        assert!(own(bad).is_err(), "{bad:?}");
    }
    // A dual-stack cluster keeps requiring the IPv4 range, and says
    // where an IPv6-only node belongs.
    let e = dual("me", &["fd00:10:244:1::/64"], 1)
        .own_pod_cidrs(cluster2())
        .expect_err("IPv6 only in a dual-stack cluster");
    assert!(
        e.contains("no IPv4 range") && e.contains("IPv6-only cluster"),
        "{e}"
    );
}

#[test]
fn a_node_without_vxlan1_reaches_every_peer_over_its_ipv6_underlay() {
    let own = PodCidrs {
        v4: None,
        v6: Cidr6::parse_network("fd00:10:244::/64").ok(),
    };
    // A dual-stack peer that announces both underlays.
    let both = with_underlay6(
        dual("both", &["10.244.1.0/24", "fd00:10:244:1::/64"], 1),
        Some("fd00:77::1"),
        Some("02:00:00:00:06:01"),
    );
    let mut dup_a = v6_only("dup-a", "fd00:10:244:30::/64", 0x30);
    let mut dup_b = v6_only("dup-b", "fd00:10:244:31::/64", 0x31);
    for n in [&mut dup_a, &mut dup_b] {
        n.annotations
            .insert(ANNOTATION_VTEP_MAC6.into(), "02:00:00:00:06:99".into());
    }
    let nodes = [
        v6_only("me", "fd00:10:244::/64", 0xee),
        v6_only("a", "fd00:10:244:a::/64", 0xa),
        both,
        // Only an IPv4 underlay: nothing here can reach it.
        dual("v4-underlay", &["10.244.2.0/24", "fd00:10:244:2::/64"], 2),
        // Only an IPv4 podCIDR: no range this cluster routes.
        with_underlay6(
            dual("v4-cidr", &["10.244.3.0/24"], 3),
            Some("fd00:77::3"),
            Some("02:00:00:00:06:03"),
        ),
        // Starting: a podCIDR, no annotations yet.
        view("starting", Some("fd00:10:244:4::/64"), None, None),
        v6_only("own", "fd00:10:244::/64", 0xb),
        v6_only("x", "fd00:10:244:20::/63", 0xc),
        v6_only("y", "fd00:10:244:21::/64", 0xd),
        v6_only("o", "fd00:99::/64", 0xf),
        with_underlay6(
            v6_only("bad-host", "fd00:10:244:5::/64", 0x5),
            Some("fe80::1"),
            None,
        ),
        dup_a,
        dup_b,
    ];
    let s = select_all(&nodes, "me", own, cluster6());
    assert!(s.peers.is_empty(), "{:?}", s.peers);
    let reached: Vec<(&str, String, String)> = s
        .peers6
        .iter()
        .map(|p| {
            (
                p.name.as_str(),
                p.pod_cidr6.to_string(),
                p.underlay6.host_ip.to_string(),
            )
        })
        .collect();
    assert_eq!(
        reached,
        [
            ("a", "fd00:10:244:a::/64".into(), "fd00:77::a".into()),
            ("both", "fd00:10:244:1::/64".into(), "fd00:77::1".into()),
        ]
    );
    let mut reasons: Vec<(&str, &str)> = s
        .rejected
        .iter()
        .map(|(n, r)| (n.as_str(), r.reason()))
        .collect();
    reasons.sort();
    assert_eq!(
        reasons,
        [
            ("bad-host", "bad_host_ip_v6"),
            ("dup-a", "duplicate_vtep_mac_v6"),
            ("dup-b", "duplicate_vtep_mac_v6"),
            ("o", "outside_cluster_cidr_v6"),
            ("own", "overlaps_own_v6"),
            ("starting", "incomplete"),
            ("v4-cidr", "no_ipv6_pod_cidr"),
            ("v4-underlay", "no_common_underlay"),
            ("x", "overlaps_peer_v6"),
            ("y", "overlaps_peer_v6"),
        ]
    );
    let why = s
        .rejected
        .iter()
        .find(|(n, _)| n == "v4-underlay")
        .map(|(_, r)| r.to_string())
        .unwrap_or_default();
    assert!(
        why.contains("192.168.0.2") && why.contains("no IPv4 underlay"),
        "{why}"
    );
    // The same outcome whatever order the Nodes arrive in.
    let mut rev = nodes.to_vec();
    rev.reverse();
    let s2 = select_all(&rev, "me", own, cluster6());
    assert_eq!(s.peers6, s2.peers6);
    let mut r1 = s.rejected.clone();
    let mut r2 = s2.rejected;
    r1.sort_by(|a, b| a.0.cmp(&b.0));
    r2.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(r1, r2);
    // A node with vxlan.1 (a dual-stack cluster) still reaches the
    // dual-stack peer over IPv4, and the IPv6-only one over vxlan6.1.
    let s = select_all(
        &nodes[1..3],
        "me",
        PodCidrs {
            v4: Cidr4::parse_network("10.244.0.0/24").ok(),
            v6: own.v6,
        },
        cluster2(),
    );
    assert_eq!((s.peers.len(), s.peers6.len()), (1, 1), "{:?}", s.rejected);
    assert_eq!(s.peers[0].host_ip, Ipv4Addr::new(192, 168, 0, 1));
}
