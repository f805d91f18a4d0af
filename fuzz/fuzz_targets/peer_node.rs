//! The agent's view of peer Nodes: podCIDR and the `mycni.dev/vtep-mac` /
//! `mycni.dev/host-ip` annotations, which any Node writer controls.
//!
//! Input: fields separated by 0xff bytes (never part of UTF-8, so a field
//! can hold any string, newlines and spaces included), each read as lossy
//! UTF-8: the cluster CIDR, this node's podCIDR, then per peer Node its
//! podCIDR, VTEP MAC and host IP. An empty field is an absent one. A
//! podCIDR field with a `,` is `spec.podCIDRs` (dual-stack: the IPv6
//! cluster CIDR is fd00:10:244::/56, this node's IPv6 podCIDR its first
//! /64). A VTEP MAC or host IP field with a `,` carries the IPv6
//! underlay's annotation after it (`mycni.dev/vtep-mac-v6`,
//! `mycni.dev/host-ip-v6`; `,fd00::11` is an IPv6 host IP alone, as an
//! IPv6-only peer announces), which `select_all` reads.
#![no_main]

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use libfuzzer_sys::fuzz_target;
use mycni_common::contract::{
    ANNOTATION_HOST_IP, ANNOTATION_HOST_IP6, ANNOTATION_VTEP_MAC, ANNOTATION_VTEP_MAC6,
};
use mycni_common::net::{Cidr4, Cidr6, ClusterCidrs, Mac, PodCidrs};
use mycni_common::node::{
    NodeView, Peer, Reject, Selection, parse_peer, parse_underlay6, select_all, select_peers,
};

const OWN: &str = "n0";

fn default_cluster() -> Cidr4 {
    match Cidr4::new(Ipv4Addr::new(10, 244, 0, 0), 16) {
        Some(c) => c,
        None => unreachable!("/16 is an IPv4 prefix"),
    }
}

/// A parsed CIDR is the canonical text it came from, and round-trips.
fn check_cidr(s: &str) -> Option<Cidr4> {
    let c = Cidr4::parse_network(s).ok()?;
    assert!(c.prefix() <= 32);
    assert_eq!(c.network(), c.addr(), "host bits kept in {s:?}");
    assert_eq!(c.to_string(), s, "accepted a non-canonical CIDR");
    assert_eq!(Cidr4::parse_network(&c.to_string()), Ok(c));
    assert!(c.covers(c) && c.overlaps(c) && c.contains(c.addr()));
    Some(c)
}

/// A parsed MAC is the text it came from (up to case), and round-trips.
fn check_mac(s: &str) {
    if let Ok(m) = s.parse::<Mac>() {
        assert_eq!(m.to_string(), s.to_ascii_lowercase(), "accepted {s:?}");
        assert_eq!(m.to_string().parse::<Mac>(), Ok(m));
    }
}

fn check_peer(p: &Peer, node: &NodeView, cluster: ClusterCidrs) {
    assert_eq!(p.name, node.name);
    let m = p.vtep_mac.0;
    assert!(
        m != [0; 6] && m[0] & 1 == 0,
        "VTEP MAC {m:02x?} is not unicast"
    );
    let ip = p.host_ip;
    assert!(
        !(ip.is_unspecified()
            || ip.is_loopback()
            || ip.is_multicast()
            || ip.is_broadcast()
            || ip.is_link_local()
            || ip.octets()[0] == 0),
        "host IP {ip}"
    );
    assert!((8..=30).contains(&p.pod_cidr.prefix()));
    assert!(cluster.v4.is_some_and(|c| c.covers(p.pod_cidr)));
    assert_eq!(p.gateway(), p.pod_cidr.addr());
    let texts = node.pod_cidr_texts();
    assert_eq!(texts.v4, [p.pod_cidr.to_string().as_str()]);
    if let Some(c6) = p.pod_cidr6 {
        assert!(cluster.v6.is_some_and(|c| c.covers(c6)), "{c6}");
        assert!((16..=124).contains(&c6.prefix()));
        assert_eq!(p.gateway6(), Some(c6.addr()));
        // IPv6 text has several spellings (case, zeros, `::`), which the
        // API server does not canonicalise; the same network, though.
        assert_eq!(texts.v6.len(), 1);
        assert_eq!(Cidr6::parse_network(texts.v6[0]), Ok(c6));
    }
}

/// A reason about a Node's IPv6 underlay annotations, not its podCIDR.
fn is_underlay6(r: &Reject) -> bool {
    matches!(
        r,
        Reject::IncompleteUnderlay6(_)
            | Reject::BadHostIp6(_)
            | Reject::BadMac6(_)
            | Reject::DuplicateVtepMac6(_)
    )
}

fn rejected_set(r: &[(String, Reject)]) -> Vec<(String, String)> {
    let mut v: Vec<_> = r
        .iter()
        .map(|(n, why)| (n.clone(), why.to_string()))
        .collect();
    v.sort();
    v
}

fuzz_target!(|data: &[u8]| {
    let fields: Vec<String> = data
        .split(|b| *b == 0xff)
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect();
    for f in &fields {
        check_cidr(f);
        check_mac(f);
        check_mac(f.trim());
    }
    let v4 = fields
        .first()
        .and_then(|f| check_cidr(f))
        .unwrap_or_else(default_cluster);
    let cluster = ClusterCidrs {
        v4: Some(v4),
        v6: Cidr6::parse_network("fd00:10:244::/56").ok(),
    };
    let own = PodCidrs {
        v4: fields.get(1).and_then(|f| check_cidr(f)),
        v6: Cidr6::parse_network("fd00:10:244::/64").ok(),
    };
    let present = |f: Option<&String>| f.filter(|s| !s.is_empty()).cloned();
    let nodes: Vec<NodeView> = fields
        .get(2..)
        .unwrap_or_default()
        .chunks(3)
        .enumerate()
        .map(|(i, c)| {
            let mut annotations = BTreeMap::new();
            for (field, key, key6) in [
                (c.get(1), ANNOTATION_VTEP_MAC, ANNOTATION_VTEP_MAC6),
                (c.get(2), ANNOTATION_HOST_IP, ANNOTATION_HOST_IP6),
            ] {
                let Some(f) = present(field) else { continue };
                let (v4, v6) = match f.split_once(',') {
                    Some((a, b)) => (a.to_string(), Some(b.to_string())),
                    None => (f, None),
                };
                if !v4.is_empty() {
                    annotations.insert(key.to_string(), v4);
                }
                if let Some(v6) = v6.filter(|v| !v.is_empty()) {
                    annotations.insert(key6.to_string(), v6);
                }
            }
            let pod_cidr = present(c.first());
            let pod_cidrs: Vec<String> = match &pod_cidr {
                Some(l) if l.contains(',') => l.split(',').map(String::from).collect(),
                _ => Vec::new(),
            };
            NodeView {
                name: format!("n{i}"),
                pod_cidr: pod_cidrs.first().cloned().or(pod_cidr),
                pod_cidrs,
                annotations,
            }
        })
        .collect();
    for n in &nodes {
        if let Ok(p) = parse_peer(n, cluster) {
            check_peer(&p, n, cluster);
        }
    }

    let (peers, rejected) = select_peers(&nodes, OWN, own, cluster);
    // Every other Node is either programmed or rejected as a whole, once;
    // a programmed one may have its IPv6 side rejected, once.
    let (v6_side, whole): (Vec<_>, Vec<_>) = rejected.iter().partition(|(_, r)| r.ipv6_side_only());
    assert_eq!(
        peers.len() + whole.len(),
        nodes.iter().filter(|n| n.name != OWN).count()
    );
    // An IPv6 reason leaves out what it names, the IPv6 podCIDR or the
    // IPv6 underlay, once each.
    for (n, r) in &v6_side {
        let p = peers.iter().find(|p| &p.name == n);
        if is_underlay6(r) {
            assert!(p.is_some_and(|p| p.underlay6.is_none()), "{n}: {r}");
        } else {
            assert!(p.is_some_and(|p| p.pod_cidr6.is_none()), "{n}: {r}");
        }
        let same = v6_side
            .iter()
            .filter(|(m, q)| m == n && is_underlay6(q) == is_underlay6(r))
            .count();
        assert_eq!(same, 1, "{n}");
    }
    let mut names: Vec<&str> = peers
        .iter()
        .map(|p| p.name.as_str())
        .chain(whole.iter().map(|(n, _)| n.as_str()))
        .collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), peers.len() + whole.len());
    assert!(!names.contains(&OWN));
    assert!(peers.windows(2).all(|w| w[0].name < w[1].name));
    for (i, p) in peers.iter().enumerate() {
        let node = nodes.iter().find(|n| n.name == p.name);
        let node = node.unwrap_or_else(|| panic!("peer {} is no Node", p.name));
        let parsed = parse_peer(node, cluster);
        // The IPv6 side may be dropped for overlaps, which only the whole
        // set shows.
        assert_eq!(
            parsed.as_ref().map(|q| Peer {
                pod_cidr6: p.pod_cidr6,
                ..q.clone()
            }),
            Ok(p.clone())
        );
        if let Some(own) = own.v4 {
            assert!(!own.overlaps(p.pod_cidr), "{} overlaps ours", p.pod_cidr);
        }
        if let (Some(own6), Some(c6)) = (own.v6, p.pod_cidr6) {
            assert!(!own6.overlaps(c6), "{c6} overlaps ours");
        }
        for q in &peers[i + 1..] {
            assert!(
                !p.pod_cidr.overlaps(q.pod_cidr),
                "{} / {}",
                p.pod_cidr,
                q.pod_cidr
            );
            assert_ne!(
                p.vtep_mac, q.vtep_mac,
                "{} and {} share a MAC",
                p.name, q.name
            );
            if let (Some(a), Some(b)) = (p.pod_cidr6, q.pod_cidr6) {
                assert!(!a.overlaps(b), "{a} / {b}");
            }
        }
    }
    // The outcome does not depend on the order Nodes arrive in.
    let mut reversed = nodes.clone();
    reversed.reverse();
    let (peers2, rejected2) = select_peers(&reversed, OWN, own, cluster);
    assert_eq!(peers, peers2);
    assert_eq!(rejected_set(&rejected), rejected_set(&rejected2));

    // With the IPv6 underlays: select_all.
    for n in &nodes {
        check_underlay6(n);
    }
    let sel = select_all(&nodes, OWN, own, cluster);
    check_selection(&sel, &nodes, &peers, own, cluster);
    let sel2 = select_all(&reversed, OWN, own, cluster);
    assert_eq!(sel.peers, sel2.peers);
    assert_eq!(sel.peers6, sel2.peers6);
    assert_eq!(rejected_set(&sel.rejected), rejected_set(&sel2.rejected));

    // The same Nodes seen from an IPv6-only node (a cluster CIDR without
    // IPv4 range): every peer over its IPv6 underlay, or rejected whole.
    let cluster6 = ClusterCidrs {
        v4: None,
        v6: cluster.v6,
    };
    let own6 = PodCidrs { v4: None, ..own };
    let sel = select_all(&nodes, OWN, own6, cluster6);
    check_selection_over_ipv6(&sel, &nodes, own6);
    let sel2 = select_all(&reversed, OWN, own6, cluster6);
    assert_eq!(sel.peers6, sel2.peers6);
    assert_eq!(rejected_set(&sel.rejected), rejected_set(&sel2.rejected));
});

/// select_all on an IPv6-only node: no IPv4-underlay peer; each IPv6 peer
/// valid, with its IPv6 underlay, and claiming no range or MAC another
/// party has; every other Node a peer or rejected, once.
fn check_selection_over_ipv6(sel: &Selection, nodes: &[NodeView], own: PodCidrs) {
    assert!(sel.peers.is_empty());
    assert!(sel.peers6.windows(2).all(|w| w[0].name < w[1].name));
    for (i, p) in sel.peers6.iter().enumerate() {
        let n = nodes.iter().find(|n| n.name == p.name);
        let n = n.unwrap_or_else(|| panic!("IPv6 peer {} is no Node", p.name));
        assert_ne!(p.name, OWN);
        assert_eq!(parse_underlay6(n), Ok(Some(p.underlay6)));
        assert!((16..=124).contains(&p.pod_cidr6.prefix()));
        assert!(!own.v6.is_some_and(|o| o.overlaps(p.pod_cidr6)));
        for q in &sel.peers6[i + 1..] {
            assert!(!p.pod_cidr6.overlaps(q.pod_cidr6), "{p:?} / {q:?}");
            assert_ne!(p.underlay6.vtep_mac, q.underlay6.vtep_mac);
        }
    }
    for n in nodes.iter().filter(|n| n.name != OWN) {
        let peer = sel.peers6.iter().any(|p| p.name == n.name);
        let why = sel.rejected.iter().filter(|(m, _)| *m == n.name).count();
        // A peer, or rejected with one reason: its IPv6 side is all of it.
        assert_eq!(usize::from(peer) + why, 1, "{}", n.name);
    }
}

/// What `parse_underlay6` takes is what the annotations say.
fn check_underlay6(n: &NodeView) {
    let Ok(Some(u)) = parse_underlay6(n) else {
        return;
    };
    let ip = n.annotations.get(ANNOTATION_HOST_IP6);
    let ip = ip.and_then(|s| s.trim().parse::<std::net::Ipv6Addr>().ok());
    assert_eq!(ip, Some(u.host_ip), "{}", n.name);
    let mac = n.annotations.get(ANNOTATION_VTEP_MAC6);
    let mac = mac.and_then(|s| s.trim().parse::<Mac>().ok());
    assert_eq!(mac, Some(u.vtep_mac), "{}", n.name);
    let h = u.host_ip;
    assert!(
        !(h.is_unspecified()
            || h.is_loopback()
            || h.is_multicast()
            || h.is_unicast_link_local()
            || h.to_ipv4_mapped().is_some()),
        "IPv6 host IP {h}"
    );
    assert!(
        u.vtep_mac.0 != [0; 6] && u.vtep_mac.0[0] & 1 == 0,
        "{}",
        u.vtep_mac
    );
}

/// select_all: the IPv4-underlay peers are select_peers' (an IPv6 side or
/// underlay at most left out), the IPv6-only peers are valid and claim no
/// range or MAC another party has, and every other Node is accounted for.
fn check_selection(
    sel: &Selection,
    nodes: &[NodeView],
    peers: &[Peer],
    own: PodCidrs,
    cluster: ClusterCidrs,
) {
    assert_eq!(sel.peers.len(), peers.len());
    for (a, b) in sel.peers.iter().zip(peers) {
        assert_eq!(
            Peer {
                pod_cidr6: b.pod_cidr6,
                underlay6: b.underlay6,
                ..a.clone()
            },
            *b
        );
        assert!(a.pod_cidr6.is_none() || a.pod_cidr6 == b.pod_cidr6);
        assert!(a.underlay6.is_none() || a.underlay6 == b.underlay6);
    }
    assert!(sel.peers6.windows(2).all(|w| w[0].name < w[1].name));
    for p in &sel.peers6 {
        assert_ne!(p.name, OWN);
        assert!(!sel.peers.iter().any(|q| q.name == p.name), "{}", p.name);
        let n = nodes.iter().find(|n| n.name == p.name);
        let n = n.unwrap_or_else(|| panic!("IPv6 peer {} is no Node", p.name));
        // Taken over the IPv6 underlay only for want of an IPv4 one.
        assert!(
            !n.annotations.contains_key(ANNOTATION_HOST_IP) || n.pod_cidr_texts().v4.is_empty(),
            "{}",
            p.name
        );
        assert!(cluster.v6.is_some_and(|c| c.covers(p.pod_cidr6)));
        assert!((16..=124).contains(&p.pod_cidr6.prefix()));
        assert_eq!(parse_underlay6(n), Ok(Some(p.underlay6)));
    }
    // IPv6 ranges and IPv6 VTEP MACs across both kinds of peer.
    let cidrs6: Vec<Cidr6> = sel
        .peers
        .iter()
        .filter_map(|p| p.pod_cidr6)
        .chain(sel.peers6.iter().map(|p| p.pod_cidr6))
        .collect();
    for (i, a) in cidrs6.iter().enumerate() {
        if let Some(o) = own.v6 {
            assert!(!o.overlaps(*a), "{a} overlaps ours");
        }
        for b in &cidrs6[i + 1..] {
            assert!(!a.overlaps(*b), "{a} / {b}");
        }
    }
    let mut macs6: Vec<Mac> = sel
        .peers
        .iter()
        .filter_map(|p| p.underlay6.map(|u| u.vtep_mac))
        .chain(sel.peers6.iter().map(|p| p.underlay6.vtep_mac))
        .collect();
    let n6 = macs6.len();
    macs6.sort();
    macs6.dedup();
    assert_eq!(macs6.len(), n6, "an IPv6 VTEP MAC programmed twice");
    // Every other Node is a peer of one kind, or has a reason.
    for n in nodes.iter().filter(|n| n.name != OWN) {
        let v4 = sel.peers.iter().any(|p| p.name == n.name);
        let v6 = sel.peers6.iter().any(|p| p.name == n.name);
        let why = sel.rejected.iter().any(|(m, _)| *m == n.name);
        assert!(!(v4 && v6), "{} is a peer twice", n.name);
        assert!(v4 || v6 || why, "{} vanished", n.name);
    }
}
