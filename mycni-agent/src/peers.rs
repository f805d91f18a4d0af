//! Peer Nodes, as far as the overlay cares: their podCIDR, VTEP MAC and
//! host IP. Node objects are untrusted input: anything malformed or hostile
//! is rejected with a reason (logged and counted), never programmed.
//!
//! This module uses std and `mycni_common` only: the `peer_node` fuzz target
//! (fuzz/) compiles this file on its own, without the agent's dependencies.

use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv4Addr;

pub use mycni_common::contract::{ANNOTATION_HOST_IP, ANNOTATION_VTEP_MAC};
pub use mycni_common::net::Mac;

/// The agent is IPv4-only: every CIDR it handles is an IPv4 one, parsed by
/// the one parser (`Cidr::parse_network` for networks, which rejects host
/// bits).
pub type Cidr = mycni_common::net::Cidr<Ipv4Addr>;

/// A peer the agent will program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub name: String,
    pub pod_cidr: Cidr,
    pub vtep_mac: Mac,
    pub host_ip: Ipv4Addr,
}

impl Peer {
    /// The peer's VTEP address: its podCIDR's first address, the gateway of
    /// the route to its pods.
    pub fn gateway(&self) -> Ipv4Addr {
        self.pod_cidr.network()
    }
}

/// Why a Node was not programmed. The label is the metric's `reason`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reject {
    /// Not yet annotated or no podCIDR: normal while a node starts.
    Incomplete(&'static str),
    BadPodCidr(String),
    OutsideClusterCidr(String),
    OverlapsOwn(String),
    OverlapsPeer(String),
    BadMac(String),
    BadHostIp(String),
    /// Another Node announces the same VTEP MAC: the FDB maps a MAC to one
    /// host, so one of them would receive the other's pod traffic.
    DuplicateVtepMac(String),
}

impl Reject {
    pub fn reason(&self) -> &'static str {
        match self {
            Reject::Incomplete(_) => "incomplete",
            Reject::BadPodCidr(_) => "bad_pod_cidr",
            Reject::OutsideClusterCidr(_) => "outside_cluster_cidr",
            Reject::OverlapsOwn(_) => "overlaps_own",
            Reject::OverlapsPeer(_) => "overlaps_peer",
            Reject::BadMac(_) => "bad_mac",
            Reject::BadHostIp(_) => "bad_host_ip",
            Reject::DuplicateVtepMac(_) => "duplicate_vtep_mac",
        }
    }
}

impl fmt::Display for Reject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reject::Incomplete(what) => write!(f, "not ready yet: {what}"),
            Reject::BadPodCidr(s) => {
                write!(f, "podCIDR {s:?} is not an IPv4 network between /8 and /30")
            }
            Reject::OutsideClusterCidr(s) => write!(f, "podCIDR {s} is outside the cluster CIDR"),
            Reject::OverlapsOwn(s) => write!(f, "podCIDR {s} overlaps this node's"),
            Reject::OverlapsPeer(s) => write!(f, "podCIDR {s} overlaps another node's"),
            Reject::BadMac(s) => write!(f, "VTEP MAC {s:?} is not a unicast MAC"),
            Reject::BadHostIp(s) => write!(f, "host IP {s:?} is not a unicast IPv4 address"),
            Reject::DuplicateVtepMac(s) => write!(
                f,
                "VTEP MAC {s} is announced by another Node too (a cloned VM?)"
            ),
        }
    }
}

/// The parts of a Node the agent reads, so the logic does not depend on k8s types.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    pub pod_cidr: Option<String>,
    pub annotations: BTreeMap<String, String>,
}

/// A host IP other nodes can send VXLAN to. 240.0.0.0/4 is reserved
/// (RFC 1112 class E): Linux routes it only with special sysctls, so a node
/// that announced one would be a peer nobody can reach.
fn valid_host_ip(ip: Ipv4Addr) -> bool {
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || ip.is_broadcast()
        || ip.is_link_local()
        || ip.octets()[0] == 0
        || ip.octets()[0] >= 240)
}

/// Validates one node on its own.
pub fn parse_peer(node: &NodeView, cluster: Cidr) -> Result<Peer, Reject> {
    let cidr_s = node
        .pod_cidr
        .as_deref()
        .ok_or(Reject::Incomplete("no spec.podCIDR"))?;
    let pod_cidr = Cidr::parse_network(cidr_s)
        .ok()
        .filter(|c| (8..=30).contains(&c.prefix()))
        .ok_or_else(|| Reject::BadPodCidr(cidr_s.to_string()))?;
    if !cluster.covers(pod_cidr) {
        return Err(Reject::OutsideClusterCidr(cidr_s.to_string()));
    }
    let mac_s = node
        .annotations
        .get(ANNOTATION_VTEP_MAC)
        .ok_or(Reject::Incomplete("no VTEP MAC annotation"))?;
    let vtep_mac = mac_s
        .trim()
        .parse::<Mac>()
        .ok()
        .filter(|m| m.is_unicast())
        .ok_or_else(|| Reject::BadMac(mac_s.clone()))?;
    let ip_s = node
        .annotations
        .get(ANNOTATION_HOST_IP)
        .ok_or(Reject::Incomplete("no host IP annotation"))?;
    let host_ip: Ipv4Addr = ip_s
        .trim()
        .parse()
        .ok()
        .filter(|ip| valid_host_ip(*ip))
        .ok_or_else(|| Reject::BadHostIp(ip_s.clone()))?;
    Ok(Peer {
        name: node.name.clone(),
        pod_cidr,
        vtep_mac,
        host_ip,
    })
}

/// All peers to program, and the rejected nodes with reasons. `own_name`
/// is skipped; nodes whose podCIDRs overlap ours or each other are all
/// rejected, since none of them can be trusted to own the range.
pub fn select_peers(
    nodes: &[NodeView],
    own_name: &str,
    own_cidr: Option<Cidr>,
    cluster: Cidr,
) -> (Vec<Peer>, Vec<(String, Reject)>) {
    let mut ok = Vec::new();
    let mut rejected = Vec::new();
    for n in nodes.iter().filter(|n| n.name != own_name) {
        match parse_peer(n, cluster) {
            Ok(p) => match own_cidr {
                Some(own) if own.overlaps(p.pod_cidr) => {
                    rejected.push((p.name.clone(), Reject::OverlapsOwn(p.pod_cidr.to_string())))
                }
                _ => ok.push(p),
            },
            Err(r) => rejected.push((n.name.clone(), r)),
        }
    }
    // Overlaps between peers: sorted by start address, a range can only
    // overlap the ones that start before it ends.
    ok.sort_by(|a, b| a.pod_cidr.cmp(&b.pod_cidr).then(a.name.cmp(&b.name)));
    let end = |c: Cidr| u32::from(c.last());
    let mut bad = vec![false; ok.len()];
    for i in 0..ok.len() {
        for j in i + 1..ok.len() {
            if u32::from(ok[j].pod_cidr.addr()) > end(ok[i].pod_cidr) {
                break;
            }
            bad[i] = true;
            bad[j] = true;
        }
    }
    // Two Nodes with one VTEP MAC: neither can be told apart in the FDB.
    let mut macs: BTreeMap<Mac, usize> = BTreeMap::new();
    for p in &ok {
        *macs.entry(p.vtep_mac).or_default() += 1;
    }
    let mut peers = Vec::with_capacity(ok.len());
    for (p, b) in ok.into_iter().zip(bad) {
        if b {
            rejected.push((p.name.clone(), Reject::OverlapsPeer(p.pod_cidr.to_string())));
        } else if macs.get(&p.vtep_mac).copied().unwrap_or(0) > 1 {
            rejected.push((
                p.name.clone(),
                Reject::DuplicateVtepMac(p.vtep_mac.to_string()),
            ));
        } else {
            peers.push(p);
        }
    }
    peers.sort_by(|a, b| a.name.cmp(&b.name));
    (peers, rejected)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> Cidr {
        Cidr::parse_network("10.244.0.0/16").unwrap()
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
            annotations,
        }
    }

    #[test]
    fn cidr_parsing() {
        assert!(Cidr::parse_network("10.244.1.0/24").is_ok());
        for bad in [
            "10.244.1.1/24",
            "10.244.1.0/33",
            "10.244.1.0",
            "x/24",
            "10.244.1.0/+24",
            "10.244.1.0/024",
            "",
        ] {
            assert!(Cidr::parse_network(bad).is_err(), "{bad}");
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
        let own = Cidr::parse_network("10.244.0.0/24").ok();
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
}
