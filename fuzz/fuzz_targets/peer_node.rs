//! The agent's view of peer Nodes: podCIDR and the `mycni.dev/vtep-mac` /
//! `mycni.dev/host-ip` annotations, which any Node writer controls.
//!
//! Input: fields separated by 0xff bytes (never part of UTF-8, so a field
//! can hold any string, newlines and spaces included), each read as lossy
//! UTF-8: the cluster CIDR, this node's podCIDR, then per peer Node its
//! podCIDR, VTEP MAC and host IP. An empty field is an absent one. A
//! podCIDR field with a `,` is `spec.podCIDRs` (dual-stack: the IPv6
//! cluster CIDR is fd00:10:244::/56, this node's IPv6 podCIDR its first
//! /64).
#![no_main]

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use libfuzzer_sys::fuzz_target;
use mycni_fuzz::peers::{
    ANNOTATION_HOST_IP, ANNOTATION_VTEP_MAC, Cidr, Cidr6, ClusterCidrs, Mac, NodeView, Peer,
    PodCidrs, parse_peer, select_peers,
};

const OWN: &str = "n0";

fn default_cluster() -> Cidr {
    match Cidr::new(Ipv4Addr::new(10, 244, 0, 0), 16) {
        Some(c) => c,
        None => unreachable!("/16 is an IPv4 prefix"),
    }
}

/// A parsed CIDR is the canonical text it came from, and round-trips.
fn check_cidr(s: &str) -> Option<Cidr> {
    let c = Cidr::parse_network(s).ok()?;
    assert!(c.prefix() <= 32);
    assert_eq!(c.network(), c.addr(), "host bits kept in {s:?}");
    assert_eq!(c.to_string(), s, "accepted a non-canonical CIDR");
    assert_eq!(Cidr::parse_network(&c.to_string()), Ok(c));
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
    assert!(cluster.v4.covers(p.pod_cidr));
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

fn rejected_set(r: &[(String, mycni_fuzz::peers::Reject)]) -> Vec<(String, String)> {
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
        v4,
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
            if let Some(m) = present(c.get(1)) {
                annotations.insert(ANNOTATION_VTEP_MAC.to_string(), m);
            }
            if let Some(ip) = present(c.get(2)) {
                annotations.insert(ANNOTATION_HOST_IP.to_string(), ip);
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
    for (n, r) in &v6_side {
        let p = peers.iter().find(|p| &p.name == n);
        assert!(p.is_some_and(|p| p.pod_cidr6.is_none()), "{n}: {r}");
        assert_eq!(v6_side.iter().filter(|(m, _)| m == n).count(), 1, "{n}");
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
            parsed.as_ref().map(|q| Peer { pod_cidr6: p.pod_cidr6, ..q.clone() }),
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
});
