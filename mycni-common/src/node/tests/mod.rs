//! Node validation, IPv4 side; `ipv6` has the IPv6 side and underlay.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::string::{String, ToString};
use std::vec::Vec;
use std::{format, vec};

use super::*;
use crate::contract::{
    ANNOTATION_HOST_IP, ANNOTATION_HOST_IP6, ANNOTATION_VTEP_MAC, ANNOTATION_VTEP_MAC6,
};

mod ipv6;

fn cluster() -> Cidr4 {
    Cidr4::parse_network("10.244.0.0/16").unwrap()
}

#[test]
fn pod_cidrs_read_as_an_operator_writes_them() {
    let v4 = Cidr4::parse_network("10.244.2.0/24").unwrap();
    let v6 = Cidr6::parse_network("fd00:10:244:2::/64").unwrap();
    let both = PodCidrs {
        v4: Some(v4),
        v6: Some(v6),
    };
    assert_eq!(both.to_string(), "10.244.2.0/24, fd00:10:244:2::/64");
    assert_eq!(PodCidrs::from(v4).to_string(), "10.244.2.0/24");
    assert_eq!(PodCidrs { v4: None, v6: None }.to_string(), "none");
}

fn view(name: &str, cidr: Option<&str>, mac: Option<&str>, ip: Option<&str>) -> NodeView {
    let mut annotations = BTreeMap::new();
    if let Some(m) = mac {
        annotations.insert(ANNOTATION_VTEP_MAC.to_string(), m.to_string());
    }
    if let Some(i) = ip {
        annotations.insert(ANNOTATION_HOST_IP.to_string(), i.to_string());
    }
    NodeView {
        name: name.into(),
        pod_cidr: cidr.map(Into::into),
        pod_cidrs: vec![],
        annotations,
    }
}

#[test]
fn cidr_parsing() {
    assert!(Cidr4::parse_network("10.244.1.0/24").is_ok());
    for bad in [
        "10.244.1.1/24",
        "10.244.1.0/33",
        "10.244.1.0",
        "x/24",
        "10.244.1.0/+24",
        "10.244.1.0/024",
        "",
    ] {
        assert!(Cidr4::parse_network(bad).is_err(), "{bad}");
    }
}

// The MAC parser's cases (the peer_node fuzz target's "+1" among
// them) are tested where it lives: mycni-common's `net::tests::macs`.

#[test]
fn hostile_nodes_are_rejected_with_reasons() {
    let cases = [
        (
            view("a", None, Some("02:00:00:00:00:01"), Some("192.168.0.2")),
            "incomplete",
        ),
        (
            view("a", Some("10.244.1.0/24"), None, Some("192.168.0.2")),
            "incomplete",
        ),
        (
            view("a", Some("10.244.1.0/24"), Some("02:00:00:00:00:01"), None),
            "incomplete",
        ),
        (
            view(
                "a",
                Some("garbage"),
                Some("02:00:00:00:00:01"),
                Some("192.168.0.2"),
            ),
            "bad_pod_cidr",
        ),
        (
            view(
                "a",
                Some("10.244.0.0/31"),
                Some("02:00:00:00:00:01"),
                Some("192.168.0.2"),
            ),
            "bad_pod_cidr",
        ),
        (
            view(
                "a",
                Some("10.245.1.0/24"),
                Some("02:00:00:00:00:01"),
                Some("192.168.0.2"),
            ),
            "outside_cluster_cidr",
        ),
        (
            view(
                "a",
                Some("10.0.0.0/8"),
                Some("02:00:00:00:00:01"),
                Some("192.168.0.2"),
            ),
            "outside_cluster_cidr",
        ),
        (
            view(
                "a",
                Some("10.244.1.0/24"),
                Some("01:00:5e:00:00:01"),
                Some("192.168.0.2"),
            ),
            "bad_mac",
        ),
        (
            view(
                "a",
                Some("10.244.1.0/24"),
                Some("00:00:00:00:00:00"),
                Some("192.168.0.2"),
            ),
            "bad_mac",
        ),
        (
            view(
                "a",
                Some("10.244.1.0/24"),
                Some("ff:ff:ff:ff:ff:ff"),
                Some("192.168.0.2"),
            ),
            "bad_mac",
        ),
        (
            view(
                "a",
                Some("10.244.1.0/24"),
                Some("02:00:00:00:00"),
                Some("192.168.0.2"),
            ),
            "bad_mac",
        ),
        (
            view(
                "a",
                Some("10.244.1.0/24"),
                Some("02:00:00:00:00:01"),
                Some("224.0.0.1"),
            ),
            "bad_host_ip",
        ),
        (
            view(
                "a",
                Some("10.244.1.0/24"),
                Some("02:00:00:00:00:01"),
                Some("127.0.0.1"),
            ),
            "bad_host_ip",
        ),
        (
            view(
                "a",
                Some("10.244.1.0/24"),
                Some("02:00:00:00:00:01"),
                Some("0.0.0.0"),
            ),
            "bad_host_ip",
        ),
        (
            view(
                "a",
                Some("10.244.1.0/24"),
                Some("02:00:00:00:00:01"),
                Some("255.255.255.255"),
            ),
            "bad_host_ip",
        ),
        (
            view(
                "a",
                Some("10.244.1.0/24"),
                Some("02:00:00:00:00:01"),
                Some("240.0.0.1"),
            ),
            "bad_host_ip",
        ),
        (
            view(
                "a",
                Some("10.244.1.0/24"),
                Some("02:00:00:00:00:01"),
                Some("fe80::1"),
            ),
            "bad_host_ip",
        ),
    ];
    for (n, reason) in cases {
        let got = parse_peer(&n, cluster()).unwrap_err();
        assert_eq!(got.reason(), reason, "{n:?}: {got}");
    }
    let ok = parse_peer(
        &view(
            "a",
            Some("10.244.1.0/24"),
            Some("02:AB:00:00:00:01"),
            Some(" 192.168.0.2 "),
        ),
        cluster(),
    )
    .unwrap();
    assert_eq!(ok.gateway(), Ipv4Addr::new(10, 244, 1, 0));
    assert_eq!(ok.vtep_mac, Mac([2, 0xab, 0, 0, 0, 1]));
}

#[test]
fn overlaps_reject_every_party() {
    let nodes = vec![
        view(
            "me",
            Some("10.244.0.0/24"),
            Some("02:00:00:00:00:00"),
            Some("192.168.0.1"),
        ),
        view(
            "a",
            Some("10.244.1.0/24"),
            Some("02:00:00:00:00:01"),
            Some("192.168.0.2"),
        ),
        view(
            "b",
            Some("10.244.2.0/24"),
            Some("02:00:00:00:00:02"),
            Some("192.168.0.3"),
        ),
        view(
            "c",
            Some("10.244.2.0/23"),
            Some("02:00:00:00:00:03"),
            Some("192.168.0.4"),
        ),
        view(
            "d",
            Some("10.244.0.0/25"),
            Some("02:00:00:00:00:04"),
            Some("192.168.0.5"),
        ),
        view(
            "e",
            Some("10.244.4.0/24"),
            Some("02:00:00:00:00:05"),
            Some("192.168.0.6"),
        ),
        view(
            "f",
            Some("10.244.3.0/24"),
            Some("02:00:00:00:00:06"),
            Some("192.168.0.7"),
        ),
    ];
    let own = Cidr4::parse_network("10.244.0.0/24").ok();
    let (peers, rejected) = select_peers(&nodes, "me", own, cluster());
    let names: Vec<&str> = peers.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["a", "e"]);
    let mut rej: Vec<(&str, &str)> = rejected
        .iter()
        .map(|(n, r)| (n.as_str(), r.reason()))
        .collect();
    rej.sort();
    assert_eq!(
        rej,
        [
            ("b", "overlaps_peer"),
            ("c", "overlaps_peer"),
            ("d", "overlaps_own"),
            ("f", "overlaps_peer")
        ]
    );
}

fn cluster2() -> ClusterCidrs {
    ClusterCidrs {
        v4: Some(cluster()),
        v6: Cidr6::parse_network("fd00:10:244::/56").ok(),
    }
}

/// An IPv6-only cluster's range.
fn cluster6() -> ClusterCidrs {
    ClusterCidrs {
        v4: None,
        v6: Cidr6::parse_network("fd00:10:244::/56").ok(),
    }
}

/// A peer with `spec.podCIDRs` (in the order given) and good annotations.
fn dual(name: &str, cidrs: &[&str], mac: u8) -> NodeView {
    let mut n = view(
        name,
        None,
        Some(&format!("02:00:00:00:00:{mac:02x}")),
        Some(&format!("192.168.0.{mac}")),
    );
    n.pod_cidrs = cidrs.iter().map(|c| c.to_string()).collect();
    n
}

#[test]
fn pod_cidrs_of_both_families_in_either_order() {
    let v6 = Cidr6::parse_network("fd00:10:244:1::/64").ok();
    for cidrs in [
        ["10.244.1.0/24", "fd00:10:244:1::/64"],
        ["fd00:10:244:1::/64", "10.244.1.0/24"],
    ] {
        let p = parse_peer(&dual("a", &cidrs, 1), cluster2()).unwrap();
        assert_eq!(p.pod_cidr, Cidr4::parse_network("10.244.1.0/24").unwrap());
        assert_eq!(p.pod_cidr6, v6);
        assert_eq!(p.gateway6(), Some("fd00:10:244:1::".parse().unwrap()));
    }
    // podCIDRs wins over podCIDR; podCIDR alone still works.
    let mut n = dual("a", &["10.244.2.0/24"], 1);
    n.pod_cidr = Some("10.244.9.0/24".into());
    assert_eq!(
        parse_peer(&n, cluster2()).unwrap().pod_cidr.to_string(),
        "10.244.2.0/24"
    );
    n.pod_cidrs.clear();
    assert_eq!(
        parse_peer(&n, cluster2()).unwrap().pod_cidr.to_string(),
        "10.244.9.0/24"
    );
    // Without an IPv6 cluster CIDR the agent does no IPv6: ignored.
    let p = parse_peer(
        &dual("a", &["10.244.1.0/24", "fd00:10:244:1::/64"], 1),
        cluster(),
    );
    assert_eq!(p.unwrap().pod_cidr6, None);
    let (peers, rejected) = select_peers(
        &[dual("a", &["10.244.1.0/24", "fd00:10:244:1::/64"], 1)],
        "me",
        None,
        cluster(),
    );
    assert_eq!((peers.len(), rejected.len()), (1, 0));
}
