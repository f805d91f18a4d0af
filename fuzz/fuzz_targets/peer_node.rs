//! The agent's view of peer Nodes: podCIDR and the `mycni.dev/vtep-mac` /
//! `mycni.dev/host-ip` annotations, which any Node writer controls.
//!
//! Input: fields separated by 0xff bytes (never part of UTF-8, so a field
//! can hold any string, newlines and spaces included), each read as lossy
//! UTF-8: the cluster CIDR, this node's podCIDR, then per peer Node its
//! podCIDR, VTEP MAC and host IP. An empty field is an absent one.
#![no_main]

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use libfuzzer_sys::fuzz_target;
use mycni_fuzz::peers::{
    ANNOTATION_HOST_IP, ANNOTATION_VTEP_MAC, Cidr, Mac, NodeView, Peer, parse_peer, select_peers,
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

fn check_peer(p: &Peer, node: &NodeView, cluster: Cidr) {
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
    assert!(cluster.covers(p.pod_cidr));
    assert_eq!(p.gateway(), p.pod_cidr.addr());
    assert_eq!(
        node.pod_cidr.as_deref(),
        Some(p.pod_cidr.to_string().as_str())
    );
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
    let cluster = fields
        .first()
        .and_then(|f| check_cidr(f))
        .unwrap_or_else(default_cluster);
    let own = fields.get(1).and_then(|f| check_cidr(f));
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
            NodeView {
                name: format!("n{i}"),
                pod_cidr: present(c.first()),
                pod_cidrs: Vec::new(),
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
    // Every other Node is either programmed or rejected, once.
    assert_eq!(
        peers.len() + rejected.len(),
        nodes.iter().filter(|n| n.name != OWN).count()
    );
    let mut names: Vec<&str> = peers
        .iter()
        .map(|p| p.name.as_str())
        .chain(rejected.iter().map(|(n, _)| n.as_str()))
        .collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), peers.len() + rejected.len());
    assert!(!names.contains(&OWN));
    assert!(peers.windows(2).all(|w| w[0].name < w[1].name));
    for (i, p) in peers.iter().enumerate() {
        let node = nodes.iter().find(|n| n.name == p.name);
        let node = node.unwrap_or_else(|| panic!("peer {} is no Node", p.name));
        assert_eq!(parse_peer(node, cluster).as_ref(), Ok(p));
        if let Some(own) = own {
            assert!(!own.overlaps(p.pod_cidr), "{} overlaps ours", p.pod_cidr);
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
        }
    }
    // The outcome does not depend on the order Nodes arrive in.
    let mut reversed = nodes.clone();
    reversed.reverse();
    let (peers2, rejected2) = select_peers(&reversed, OWN, own, cluster);
    assert_eq!(peers, peers2);
    assert_eq!(rejected_set(&rejected), rejected_set(&rejected2));
});
