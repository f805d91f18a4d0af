//! Peer Nodes, as far as the overlay cares: their podCIDRs, VTEP MAC and
//! host IP. Node objects are untrusted input: anything malformed or hostile
//! is rejected with a reason (logged and counted), never programmed.
//!
//! Dual-stack: a Node's `spec.podCIDRs` holds at most one range per family
//! (`spec.podCIDR`, the first of them, is read when `podCIDRs` is absent).
//! In a cluster with an IPv4 range the IPv4 podCIDR is required: `vxlan.1`
//! runs over an IPv4 underlay and the VTEP is addressed from it. In an
//! IPv6-only cluster (no IPv4 range) no node has `vxlan.1`, and every peer
//! is reached over its IPv6 underlay ([`select_over_ipv6`]). A node with
//! an IPv6 underlay announces it besides (`vxlan6.1`'s MAC and its IPv6
//! host address, [`Underlay6`]);
//! a bad announcement costs the peer that underlay only. The IPv6 range is optional, and a bad
//! one rejects the peer's IPv6 side only (its `*_v6` reasons): the IPv4
//! side is not wrong, and withdrawing it would cut a node's working IPv4
//! pods off for a fault in a family they may not even use.
//!
//! This module uses std and `mycni_common` only: the `peer_node` fuzz target
//! (fuzz/) compiles this file on its own, without the agent's dependencies.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

pub use mycni_common::contract::{
    ANNOTATION_HOST_IP, ANNOTATION_HOST_IP6, ANNOTATION_VTEP_MAC, ANNOTATION_VTEP_MAC6,
};
use mycni_common::net::Family;
pub use mycni_common::net::Mac;

/// An IPv4 CIDR, parsed by the one parser (`Cidr::parse_network` for
/// networks, which rejects host bits). The IPv4 side is the one every node
/// has, so it keeps the short name.
pub type Cidr = mycni_common::net::Cidr<Ipv4Addr>;
/// An IPv6 CIDR, by the same parser.
pub type Cidr6 = mycni_common::net::Cidr<Ipv6Addr>;

/// The prefix lengths a peer's IPv4 podCIDR may have.
const PREFIX_V4: std::ops::RangeInclusive<u8> = 8..=30;
/// The prefix lengths a peer's IPv6 podCIDR may have: a /124 leaves 15
/// pod addresses beside the VTEP's, and no node gets less than a /16.
const PREFIX_V6: std::ops::RangeInclusive<u8> = 16..=124;

/// The cluster's pod ranges (kube-controller-manager `--cluster-cidr`,
/// one per family, at least one). No IPv6 range: the agent does not do
/// IPv6, and ignores every IPv6 podCIDR. No IPv4 range: an IPv6-only
/// cluster, whose nodes have no `vxlan.1` (see [`select_all`]); every
/// IPv4 podCIDR is ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterCidrs {
    pub v4: Option<Cidr>,
    pub v6: Option<Cidr6>,
}

impl From<Cidr> for ClusterCidrs {
    fn from(v4: Cidr) -> Self {
        ClusterCidrs {
            v4: Some(v4),
            v6: None,
        }
    }
}

impl ClusterCidrs {
    /// Both families' ranges, at least one of them.
    pub fn new(v4: Option<Cidr>, v6: Option<Cidr6>) -> Result<Self, String> {
        if v4.is_none() && v6.is_none() {
            return Err("no cluster CIDR of either family".into());
        }
        Ok(ClusterCidrs { v4, v6 })
    }

    /// An IPv6-only cluster: its nodes have no IPv4 podCIDR, hence no
    /// `vxlan.1`, and reach each other over `vxlan6.1` alone.
    pub fn ipv6_only(&self) -> bool {
        self.v4.is_none() && self.v6.is_some()
    }
}

/// As `--cluster-cidr` takes them: `10.244.0.0/16,fd00:10:244::/56`.
impl fmt::Display for ClusterCidrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.v4, &self.v6) {
            (Some(v4), Some(v6)) => write!(f, "{v4},{v6}"),
            (Some(v4), None) => write!(f, "{v4}"),
            (None, Some(v6)) => write!(f, "{v6}"),
            (None, None) => f.write_str("none"),
        }
    }
}

/// A node's own podCIDRs, as far as they are known and valid.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodCidrs {
    pub v4: Option<Cidr>,
    pub v6: Option<Cidr6>,
}

/// As an operator reads them in a log: `10.244.2.0/24, fd00:10:244:2::/64`.
impl std::fmt::Display for PodCidrs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.v4, &self.v6) {
            (Some(v4), Some(v6)) => write!(f, "{v4}, {v6}"),
            (Some(v4), None) => write!(f, "{v4}"),
            (None, Some(v6)) => write!(f, "{v6}"),
            (None, None) => f.write_str("none"),
        }
    }
}

impl From<Option<Cidr>> for PodCidrs {
    fn from(v4: Option<Cidr>) -> Self {
        PodCidrs { v4, v6: None }
    }
}

impl From<Cidr> for PodCidrs {
    fn from(v4: Cidr) -> Self {
        PodCidrs {
            v4: Some(v4),
            v6: None,
        }
    }
}

/// A peer the agent will program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub name: String,
    pub pod_cidr: Cidr,
    /// The peer's IPv6 podCIDR, if it has a valid one and the agent does
    /// IPv6 (an IPv6 cluster CIDR is set).
    pub pod_cidr6: Option<Cidr6>,
    pub vtep_mac: Mac,
    pub host_ip: Ipv4Addr,
    /// The peer's IPv6 underlay, if it announces a valid one: how it is
    /// reached over `vxlan6.1`.
    pub underlay6: Option<Underlay6>,
}

/// A peer's IPv6 underlay: its VXLAN-over-IPv6 device's MAC and the IPv6
/// host address that device's packets go to (flannel's `public-ip-v6` and
/// `backend-v6-data`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Underlay6 {
    pub host_ip: Ipv6Addr,
    pub vtep_mac: Mac,
}

impl Peer {
    /// The peer's VTEP address: its podCIDR's first address, the gateway of
    /// the route to its pods.
    pub fn gateway(&self) -> Ipv4Addr {
        self.pod_cidr.network()
    }

    /// The peer's IPv6 VTEP address, the twin of [`Peer::gateway`]: its
    /// IPv6 podCIDR's first address.
    pub fn gateway6(&self) -> Option<Ipv6Addr> {
        self.pod_cidr6.map(|c| c.network())
    }
}

/// Why a Node (or, for the `*6` variants, its IPv6 side) was not
/// programmed. The label is the metric's `reason`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reject {
    /// Not yet annotated or no podCIDR: normal while a node starts.
    Incomplete(&'static str),
    BadPodCidr(String),
    /// Only an IPv6 podCIDR, and no valid IPv6 podCIDR and IPv6 underlay
    /// to reach it over: `vxlan.1` needs an IPv4 podCIDR for the peer's
    /// VTEP, so such a peer goes through `vxlan6.1` or nowhere.
    NoIpv4PodCidr(String),
    OutsideClusterCidr(String),
    OverlapsOwn(String),
    OverlapsPeer(String),
    BadMac(String),
    BadHostIp(String),
    /// Another Node announces the same VTEP MAC: the FDB maps a MAC to one
    /// host, so one of them would receive the other's pod traffic.
    DuplicateVtepMac(String),
    /// The IPv6 side only (the peer's IPv4 side is programmed): not an
    /// IPv6 network of an allowed size, or two of them.
    BadPodCidr6(String),
    OutsideClusterCidr6(String),
    OverlapsOwn6(String),
    OverlapsPeer6(String),
    /// The IPv6 underlay only (the peer is programmed without it): one of
    /// its two annotations without the other, which the agent writes in
    /// one patch.
    IncompleteUnderlay6(&'static str),
    BadHostIp6(String),
    BadMac6(String),
    /// Another Node announces the same `vxlan6.1` MAC.
    DuplicateVtepMac6(String),
    /// On a node without `vxlan.1` (an IPv6-only cluster): the peer has
    /// no IPv6 podCIDR, only IPv4 ones, which this cluster does not route.
    NoIpv6PodCidr(String),
    /// On a node without `vxlan.1`: the peer announces an IPv4 underlay
    /// only (its host IP), which this node has no device to reach.
    NoCommonUnderlay(String),
}

impl Reject {
    pub fn reason(&self) -> &'static str {
        match self {
            Reject::Incomplete(_) => "incomplete",
            Reject::BadPodCidr(_) => "bad_pod_cidr",
            Reject::NoIpv4PodCidr(_) => "no_ipv4_pod_cidr",
            Reject::OutsideClusterCidr(_) => "outside_cluster_cidr",
            Reject::OverlapsOwn(_) => "overlaps_own",
            Reject::OverlapsPeer(_) => "overlaps_peer",
            Reject::BadMac(_) => "bad_mac",
            Reject::BadHostIp(_) => "bad_host_ip",
            Reject::DuplicateVtepMac(_) => "duplicate_vtep_mac",
            Reject::BadPodCidr6(_) => "bad_pod_cidr_v6",
            Reject::OutsideClusterCidr6(_) => "outside_cluster_cidr_v6",
            Reject::OverlapsOwn6(_) => "overlaps_own_v6",
            Reject::OverlapsPeer6(_) => "overlaps_peer_v6",
            Reject::IncompleteUnderlay6(_) => "incomplete_underlay_v6",
            Reject::BadHostIp6(_) => "bad_host_ip_v6",
            Reject::BadMac6(_) => "bad_mac_v6",
            Reject::DuplicateVtepMac6(_) => "duplicate_vtep_mac_v6",
            Reject::NoIpv6PodCidr(_) => "no_ipv6_pod_cidr",
            Reject::NoCommonUnderlay(_) => "no_common_underlay",
        }
    }

    /// Whether only the peer's IPv6 side (its IPv6 podCIDR or its IPv6
    /// underlay) is rejected: the rest of it is programmed.
    pub fn ipv6_side_only(&self) -> bool {
        matches!(
            self,
            Reject::BadPodCidr6(_)
                | Reject::OutsideClusterCidr6(_)
                | Reject::OverlapsOwn6(_)
                | Reject::OverlapsPeer6(_)
                | Reject::IncompleteUnderlay6(_)
                | Reject::BadHostIp6(_)
                | Reject::BadMac6(_)
                | Reject::DuplicateVtepMac6(_)
        )
    }
}

impl fmt::Display for Reject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reject::Incomplete(what) => write!(f, "not ready yet: {what}"),
            Reject::BadPodCidr(s) => {
                write!(
                    f,
                    "podCIDR {s:?} is not one IPv4 network between /8 and /30"
                )
            }
            Reject::NoIpv4PodCidr(s) => write!(
                f,
                "podCIDRs {s} have no IPv4 range, and no valid IPv6 podCIDR and IPv6 underlay (mycni.dev/host-ip-v6, mycni.dev/vtep-mac-v6) to reach it over"
            ),
            Reject::OutsideClusterCidr(s) => write!(f, "podCIDR {s} is outside the cluster CIDR"),
            Reject::OverlapsOwn(s) => write!(f, "podCIDR {s} overlaps this node's"),
            Reject::OverlapsPeer(s) => write!(f, "podCIDR {s} overlaps another node's"),
            Reject::BadMac(s) => write!(f, "VTEP MAC {s:?} is not a unicast MAC"),
            Reject::BadHostIp(s) => write!(f, "host IP {s:?} is not a unicast IPv4 address"),
            Reject::DuplicateVtepMac(s) => write!(
                f,
                "VTEP MAC {s} is announced by another Node too (a cloned VM?)"
            ),
            Reject::BadPodCidr6(s) => write!(
                f,
                "IPv6 side not programmed: podCIDR {s:?} is not one IPv6 network between /16 and /124"
            ),
            Reject::OutsideClusterCidr6(s) => write!(
                f,
                "IPv6 side not programmed: podCIDR {s} is outside the IPv6 cluster CIDR"
            ),
            Reject::OverlapsOwn6(s) => write!(
                f,
                "IPv6 side not programmed: podCIDR {s} overlaps this node's"
            ),
            Reject::OverlapsPeer6(s) => write!(
                f,
                "IPv6 side not programmed: podCIDR {s} overlaps another node's"
            ),
            Reject::IncompleteUnderlay6(what) => {
                write!(f, "IPv6 underlay not used: {what}")
            }
            Reject::BadHostIp6(s) => write!(
                f,
                "IPv6 underlay not used: host IP {s:?} is not a global or unique-local unicast IPv6 address"
            ),
            Reject::BadMac6(s) => write!(
                f,
                "IPv6 underlay not used: VTEP MAC {s:?} is not a unicast MAC"
            ),
            Reject::DuplicateVtepMac6(s) => write!(
                f,
                "IPv6 underlay not used: VTEP MAC {s} is announced by another Node too"
            ),
            Reject::NoIpv6PodCidr(s) => write!(
                f,
                "podCIDRs {s} have no IPv6 range, and the cluster CIDR has no IPv4 one"
            ),
            Reject::NoCommonUnderlay(s) => write!(
                f,
                "unreachable from here: it announces an IPv4 underlay only (host IP {s}), and this node has no IPv4 underlay (IPv6-only node)"
            ),
        }
    }
}

/// The parts of a Node the agent reads, so the logic does not depend on k8s types.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    /// `spec.podCIDR`: read only when `pod_cidrs` is empty.
    pub pod_cidr: Option<String>,
    /// `spec.podCIDRs`: at most one per family, in either order.
    pub pod_cidrs: Vec<String>,
    pub annotations: BTreeMap<String, String>,
}

/// A node's podCIDR texts, split by family: what looks like IPv6 (has a
/// `:`) is IPv6, anything else is IPv4, so garbage is judged as IPv4 and
/// rejects the node, as it always did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodCidrTexts<'a> {
    pub v4: Vec<&'a str>,
    pub v6: Vec<&'a str>,
}

impl NodeView {
    /// `spec.podCIDRs` if set, else `spec.podCIDR`, split by family.
    pub fn pod_cidr_texts(&self) -> PodCidrTexts<'_> {
        let all: Vec<&str> = if self.pod_cidrs.is_empty() {
            self.pod_cidr.as_deref().into_iter().collect()
        } else {
            self.pod_cidrs.iter().map(String::as_str).collect()
        };
        let (v6, v4) = all.into_iter().partition(|s| s.contains(':'));
        PodCidrTexts { v4, v6 }
    }

    /// This node's own podCIDRs, for the agent running on it: each family's
    /// single valid range inside the cluster's, or an error saying which
    /// is wrong. A range of a family the cluster has no range of is
    /// ignored. A cluster with an IPv4 range needs it on every node (its
    /// `vxlan.1` is addressed from it): a node with an IPv6 podCIDR alone
    /// runs only in an IPv6-only cluster, where the IPv6 one is required.
    pub fn own_pod_cidrs(&self, cluster: ClusterCidrs) -> Result<PodCidrs, String> {
        let t = self.pod_cidr_texts();
        if t.v4.is_empty() && t.v6.is_empty() {
            return Err("no spec.podCIDR".into());
        }
        let v4 = match (cluster.v4, t.v4.as_slice()) {
            (None, _) => None,
            (Some(c4), []) => {
                return Err(format!(
                    "podCIDRs {:?} have no IPv4 range, which the cluster CIDR {c4} asks of every node (IPv6-only nodes run in an IPv6-only cluster: a --cluster-cidr with an IPv6 range alone)",
                    t.v6
                ));
            }
            (Some(c4), [one]) => Some(
                Cidr::parse_network(one)
                    .ok()
                    .filter(|c| c4.covers(*c))
                    .ok_or_else(|| format!("podCIDR {one:?} is invalid or outside {c4}"))?,
            ),
            (Some(_), many) => return Err(format!("podCIDRs {many:?}: more than one IPv4 range")),
        };
        let v6 = match (cluster.v6, t.v6.as_slice()) {
            (None, _) => None,
            (Some(c6), []) if v4.is_none() => {
                return Err(format!(
                    "podCIDRs {:?} have no IPv6 range, which the IPv6-only cluster CIDR {c6} asks of every node",
                    t.v4
                ));
            }
            (Some(_), []) => None,
            (Some(c6), [one]) => Some(
                Cidr6::parse_network(one)
                    .ok()
                    .filter(|c| c6.covers(*c) && PREFIX_V6.contains(&c.prefix()))
                    .ok_or_else(|| format!("IPv6 podCIDR {one:?} is invalid or outside {c6}"))?,
            ),
            (Some(_), many) => return Err(format!("podCIDRs {many:?}: more than one IPv6 range")),
        };
        if v4.is_none() && v6.is_none() {
            return Err("no cluster CIDR of either family".into());
        }
        Ok(PodCidrs { v4, v6 })
    }
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

/// An IPv6 host address other nodes can send VXLAN to: unicast, and not
/// link-local (a link-local address means nothing without the interface it
/// is on, which a peer cannot know), nor an IPv4-mapped one (that is IPv4,
/// for `vxlan.1`).
fn valid_host_ip6(ip: Ipv6Addr) -> bool {
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || ip.is_unicast_link_local()
        || ip.to_ipv4_mapped().is_some())
}

/// An announced host IP of either family, `bad` with the text unless it
/// parses and is `valid`.
fn parse_host_ip<T: std::str::FromStr + Copy>(
    s: &str,
    valid: fn(T) -> bool,
    bad: fn(String) -> Reject,
) -> Result<T, Reject> {
    s.trim()
        .parse()
        .ok()
        .filter(|ip: &T| valid(*ip))
        .ok_or_else(|| bad(s.to_string()))
}

/// An announced VTEP MAC, `bad` with the text unless it is a unicast MAC.
fn parse_vtep_mac(s: &str, bad: fn(String) -> Reject) -> Result<Mac, Reject> {
    s.trim()
        .parse::<Mac>()
        .ok()
        .filter(|m| m.is_unicast())
        .ok_or_else(|| bad(s.to_string()))
}

/// A peer's podCIDR of either family: `bad` unless it is one network with
/// a prefix in `prefixes`, `outside` unless `cluster` covers it.
fn parse_pod_cidr<A: Family>(
    s: &str,
    prefixes: std::ops::RangeInclusive<u8>,
    cluster: mycni_common::net::Cidr<A>,
    bad: fn(String) -> Reject,
    outside: fn(String) -> Reject,
) -> Result<mycni_common::net::Cidr<A>, Reject> {
    let c = mycni_common::net::Cidr::<A>::parse_network(s)
        .ok()
        .filter(|c| prefixes.contains(&c.prefix()))
        .ok_or_else(|| bad(s.to_string()))?;
    if !cluster.covers(c) {
        return Err(outside(s.to_string()));
    }
    Ok(c)
}

/// A node's IPv6 underlay from its annotations: None when it announces
/// none, an error when what it announces cannot be used.
pub fn parse_underlay6(node: &NodeView) -> Result<Option<Underlay6>, Reject> {
    let a = &node.annotations;
    let (ip_s, mac_s) = match (a.get(ANNOTATION_HOST_IP6), a.get(ANNOTATION_VTEP_MAC6)) {
        (None, None) => return Ok(None),
        (Some(_), None) => return Err(Reject::IncompleteUnderlay6("no IPv6 VTEP MAC annotation")),
        (None, Some(_)) => return Err(Reject::IncompleteUnderlay6("no IPv6 host IP annotation")),
        (Some(i), Some(m)) => (i, m),
    };
    let host_ip = parse_host_ip(ip_s, valid_host_ip6, Reject::BadHostIp6)?;
    let vtep_mac = parse_vtep_mac(mac_s, Reject::BadMac6)?;
    Ok(Some(Underlay6 { host_ip, vtep_mac }))
}

/// The IPv6 side of a node: None when it has none or the agent does no
/// IPv6, an error when what it has cannot be programmed.
pub fn parse_peer6(node: &NodeView, cluster6: Option<Cidr6>) -> Result<Option<Cidr6>, Reject> {
    let Some(cluster6) = cluster6 else {
        return Ok(None);
    };
    let t = node.pod_cidr_texts();
    let s = match t.v6.as_slice() {
        [] => return Ok(None),
        [one] => *one,
        many => return Err(Reject::BadPodCidr6(many.join(","))),
    };
    parse_pod_cidr(
        s,
        PREFIX_V6,
        cluster6,
        Reject::BadPodCidr6,
        Reject::OutsideClusterCidr6,
    )
    .map(Some)
}

/// Validates one node on its own: the peer with its IPv6 side if that is
/// valid too. [`select_peers`] reports an invalid IPv6 side; here it is
/// only left out.
pub fn parse_peer(node: &NodeView, cluster: impl Into<ClusterCidrs>) -> Result<Peer, Reject> {
    let cluster = cluster.into();
    let texts = node.pod_cidr_texts();
    let Some(cluster4) = cluster.v4 else {
        // An IPv6-only cluster routes no IPv4 podCIDR: a peer there is its
        // IPv6 side alone, a `Peer6` (`select_all`).
        return Err(match (texts.v4.is_empty(), texts.v6.is_empty()) {
            (true, true) => Reject::Incomplete("no spec.podCIDR"),
            (false, true) => Reject::NoIpv6PodCidr(texts.v4.join(",")),
            _ => Reject::NoIpv4PodCidr(texts.v6.join(",")),
        });
    };
    let cidr_s = match texts.v4.as_slice() {
        [] if texts.v6.is_empty() => return Err(Reject::Incomplete("no spec.podCIDR")),
        [] => return Err(Reject::NoIpv4PodCidr(texts.v6.join(","))),
        [one] => *one,
        many => return Err(Reject::BadPodCidr(many.join(","))),
    };
    let pod_cidr = parse_pod_cidr(
        cidr_s,
        PREFIX_V4,
        cluster4,
        Reject::BadPodCidr,
        Reject::OutsideClusterCidr,
    )?;
    let mac_s = node
        .annotations
        .get(ANNOTATION_VTEP_MAC)
        .ok_or(Reject::Incomplete("no VTEP MAC annotation"))?;
    let vtep_mac = parse_vtep_mac(mac_s, Reject::BadMac)?;
    let ip_s = node
        .annotations
        .get(ANNOTATION_HOST_IP)
        .ok_or(Reject::Incomplete("no host IP annotation"))?;
    let host_ip = parse_host_ip(ip_s, valid_host_ip, Reject::BadHostIp)?;
    Ok(Peer {
        name: node.name.clone(),
        pod_cidr,
        pod_cidr6: parse_peer6(node, cluster.v6).ok().flatten(),
        vtep_mac,
        host_ip,
        underlay6: parse_underlay6(node).ok().flatten(),
    })
}

/// Which of `cidrs` overlap another of them, in their order. Sorted by
/// start address, a range can only overlap the ones that start before it
/// ends.
fn overlapping<A: Family>(cidrs: &[mycni_common::net::Cidr<A>]) -> Vec<bool> {
    let mut order: Vec<usize> = (0..cidrs.len()).collect();
    order.sort_by_key(|&i| cidrs[i]);
    let mut bad = vec![false; cidrs.len()];
    for (k, &i) in order.iter().enumerate() {
        let end = cidrs[i].last().bits();
        for &j in &order[k + 1..] {
            if cidrs[j].network().bits() > end {
                break;
            }
            bad[i] = true;
            bad[j] = true;
        }
    }
    bad
}

/// How many times each VTEP MAC is announced: more than once, neither
/// announcer can be told apart in the FDB.
fn mac_counts(macs: impl Iterator<Item = Mac>) -> BTreeMap<Mac, usize> {
    let mut n: BTreeMap<Mac, usize> = BTreeMap::new();
    for m in macs {
        *n.entry(m).or_default() += 1;
    }
    n
}

/// All peers to program, and the rejected nodes with reasons. `own_name`
/// is skipped; nodes whose podCIDRs overlap ours or each other are all
/// rejected, since none of them can be trusted to own the range. The same
/// goes for IPv6 podCIDRs, but only for the peer's IPv6 side: such a peer
/// is programmed without it and also listed, with a `*6` reason.
pub fn select_peers(
    nodes: &[NodeView],
    own_name: &str,
    own: impl Into<PodCidrs>,
    cluster: impl Into<ClusterCidrs>,
) -> (Vec<Peer>, Vec<(String, Reject)>) {
    let (own, cluster) = (own.into(), cluster.into());
    // Each with why its IPv6 side is left out, reported only if the peer
    // is programmed: a Node rejected as a whole has one reason.
    let mut ok: Vec<(Peer, Vec<Reject>)> = Vec::new();
    let mut rejected = Vec::new();
    for n in nodes.iter().filter(|n| n.name != own_name) {
        match parse_peer(n, cluster) {
            Ok(mut p) => match own.v4 {
                Some(own) if own.overlaps(p.pod_cidr) => {
                    rejected.push((p.name.clone(), Reject::OverlapsOwn(p.pod_cidr.to_string())))
                }
                _ => {
                    let why_u6 = parse_underlay6(n).err();
                    let mut why6 = parse_peer6(n, cluster.v6).err();
                    if let (Some(own6), Some(c6)) = (own.v6, p.pod_cidr6)
                        && own6.overlaps(c6)
                    {
                        p.pod_cidr6 = None;
                        why6 = Some(Reject::OverlapsOwn6(c6.to_string()));
                    }
                    ok.push((p, why6.into_iter().chain(why_u6).collect()))
                }
            },
            Err(r) => rejected.push((n.name.clone(), r)),
        }
    }
    let bad = overlapping(&ok.iter().map(|(p, _)| p.pod_cidr).collect::<Vec<_>>());
    // Two Nodes with one VTEP MAC: neither can be told apart in the FDB.
    let macs = mac_counts(ok.iter().map(|(p, _)| p.vtep_mac));
    let mut peers = Vec::with_capacity(ok.len());
    for ((p, why6), b) in ok.into_iter().zip(bad) {
        if b {
            rejected.push((p.name.clone(), Reject::OverlapsPeer(p.pod_cidr.to_string())));
        } else if macs.get(&p.vtep_mac).copied().unwrap_or(0) > 1 {
            rejected.push((
                p.name.clone(),
                Reject::DuplicateVtepMac(p.vtep_mac.to_string()),
            ));
        } else {
            rejected.extend(why6.into_iter().map(|r| (p.name.clone(), r)));
            peers.push(p);
        }
    }
    // IPv6 overlaps among the peers that are programmed: a peer rejected
    // as a whole claims nothing.
    let v6: Vec<(usize, Cidr6)> = peers
        .iter()
        .enumerate()
        .filter_map(|(i, p)| Some((i, p.pod_cidr6?)))
        .collect();
    let bad6 = overlapping(&v6.iter().map(|(_, c)| *c).collect::<Vec<_>>());
    for ((i, c), b) in v6.into_iter().zip(bad6) {
        if b {
            peers[i].pod_cidr6 = None;
            rejected.push((peers[i].name.clone(), Reject::OverlapsPeer6(c.to_string())));
        }
    }
    // Two Nodes with one `vxlan6.1` MAC: the same as for `vxlan.1`, for
    // their IPv6 underlay only.
    let macs6 = mac_counts(peers.iter().filter_map(|p| p.underlay6).map(|u| u.vtep_mac));
    for p in &mut peers {
        if let Some(u) = p.underlay6
            && macs6.get(&u.vtep_mac).copied().unwrap_or(0) > 1
        {
            p.underlay6 = None;
            rejected.push((
                p.name.clone(),
                Reject::DuplicateVtepMac6(u.vtep_mac.to_string()),
            ));
        }
    }
    peers.sort_by(|a, b| a.name.cmp(&b.name));
    (peers, rejected)
}

/// A peer reached over the IPv6 underlay only: a Node that announces an
/// IPv6 underlay and an IPv6 podCIDR but no IPv4 host address (or no IPv4
/// podCIDR), an IPv6-only node. Its IPv6 pods are routed through
/// `vxlan6.1`; it has no IPv4 side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer6 {
    pub name: String,
    pub pod_cidr6: Cidr6,
    pub underlay6: Underlay6,
}

/// Every peer to program: those with an IPv4 underlay (their IPv6 side
/// included, over `vxlan.1`), those reached over the IPv6 underlay only,
/// and the rejected Nodes with reasons.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    pub peers: Vec<Peer>,
    pub peers6: Vec<Peer6>,
    pub rejected: Vec<(String, Reject)>,
}

/// [`select_peers`], and the Nodes it rejects for want of an IPv4 host
/// address or IPv4 podCIDR taken as [`Peer6`] when their IPv6 side and
/// IPv6 underlay are valid. A peer with an IPv4 underlay is reached over
/// it even when it has an IPv6 one too: a node of a cluster with an IPv4
/// range has an IPv4 underlay (start-up requires one), so IPv4 works for
/// such a peer, and it keeps that peer on `vxlan.1`, its one FDB entry and
/// the fast path's IPv4 encapsulation. IPv6 podCIDR overlaps and
/// `vxlan6.1` MAC duplicates are judged across both kinds: the IPv6 side
/// of every party is left out.
///
/// In an IPv6-only cluster (no IPv4 range) this node has no `vxlan.1`,
/// and every peer is a [`Peer6`] or rejected whole: see
/// [`select_over_ipv6`].
pub fn select_all(
    nodes: &[NodeView],
    own_name: &str,
    own: impl Into<PodCidrs>,
    cluster: impl Into<ClusterCidrs>,
) -> Selection {
    let (own, cluster) = (own.into(), cluster.into());
    if cluster.v4.is_none() {
        return select_over_ipv6(nodes, own_name, own.v6, cluster.v6);
    }
    let (mut peers, mut rejected) = select_peers(nodes, own_name, own, cluster);
    let mut peers6 = Vec::new();
    let by_name: BTreeMap<&str, &NodeView> = nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    rejected.retain(|(name, _)| {
        let Some(n) = by_name.get(name.as_str()) else {
            return true;
        };
        let ipv6_only =
            !n.annotations.contains_key(ANNOTATION_HOST_IP) || n.pod_cidr_texts().v4.is_empty();
        if !ipv6_only {
            return true;
        }
        match (parse_peer6(n, cluster.v6), parse_underlay6(n)) {
            (Ok(Some(pod_cidr6)), Ok(Some(underlay6))) => {
                peers6.push(Peer6 {
                    name: name.clone(),
                    pod_cidr6,
                    underlay6,
                });
                false
            }
            _ => true,
        }
    });
    // IPv6 podCIDRs across both kinds, this node's first.
    let mut keep6 = vec![true; peers6.len()];
    for (i, p) in peers6.iter().enumerate() {
        if own.v6.is_some_and(|o| o.overlaps(p.pod_cidr6)) {
            keep6[i] = false;
            rejected.push((
                p.name.clone(),
                Reject::OverlapsOwn6(p.pod_cidr6.to_string()),
            ));
        }
    }
    let cidrs: Vec<Cidr6> = peers
        .iter()
        .filter_map(|p| p.pod_cidr6)
        .chain(peers6.iter().map(|p| p.pod_cidr6))
        .collect();
    let bad = overlapping(&cidrs);
    let macs6 = mac_counts(
        peers
            .iter()
            .filter_map(|p| p.underlay6)
            .chain(peers6.iter().map(|p| p.underlay6))
            .map(|u| u.vtep_mac),
    );
    let mut k = 0;
    for p in &mut peers {
        if let Some(c6) = p.pod_cidr6 {
            // Overlaps among `peers` alone were settled by select_peers:
            // what is left is one with an IPv6-only peer.
            if bad[k] {
                p.pod_cidr6 = None;
                rejected.push((p.name.clone(), Reject::OverlapsPeer6(c6.to_string())));
            }
            k += 1;
        }
        if let Some(u) = p.underlay6
            && macs6.get(&u.vtep_mac).copied().unwrap_or(0) > 1
        {
            p.underlay6 = None;
            rejected.push((
                p.name.clone(),
                Reject::DuplicateVtepMac6(u.vtep_mac.to_string()),
            ));
        }
    }
    for (i, p) in peers6.iter().enumerate() {
        if !keep6[i] {
            continue;
        }
        if bad[k + i] {
            keep6[i] = false;
            rejected.push((
                p.name.clone(),
                Reject::OverlapsPeer6(p.pod_cidr6.to_string()),
            ));
        } else if macs6.get(&p.underlay6.vtep_mac).copied().unwrap_or(0) > 1 {
            keep6[i] = false;
            rejected.push((
                p.name.clone(),
                Reject::DuplicateVtepMac6(p.underlay6.vtep_mac.to_string()),
            ));
        }
    }
    let mut peers6: Vec<Peer6> = peers6
        .into_iter()
        .zip(keep6)
        .filter_map(|(p, keep)| keep.then_some(p))
        .collect();
    peers6.sort_by(|a, b| a.name.cmp(&b.name));
    Selection {
        peers,
        peers6,
        rejected,
    }
}

/// A peer as a node without `vxlan.1` sees it: its IPv6 podCIDR and its
/// IPv6 underlay, both required; whatever IPv4 it has is not reachable
/// from here.
fn parse_peer_over_ipv6(node: &NodeView, cluster6: Option<Cidr6>) -> Result<Peer6, Reject> {
    let texts = node.pod_cidr_texts();
    let pod_cidr6 = match parse_peer6(node, cluster6)? {
        Some(c) => c,
        None if texts.v4.is_empty() => return Err(Reject::Incomplete("no spec.podCIDR")),
        None => return Err(Reject::NoIpv6PodCidr(texts.v4.join(","))),
    };
    let underlay6 = match parse_underlay6(node)? {
        Some(u) => u,
        None => {
            return Err(match node.annotations.get(ANNOTATION_HOST_IP) {
                Some(ip) => Reject::NoCommonUnderlay(ip.trim().to_string()),
                None => Reject::Incomplete("no IPv6 underlay annotations"),
            });
        }
    };
    Ok(Peer6 {
        name: node.name.clone(),
        pod_cidr6,
        underlay6,
    })
}

/// [`select_all`] on a node without `vxlan.1` (an IPv6-only cluster): a
/// `vxlan6.1` opens an IPv6 socket only, so every peer is reached over
/// its IPv6 underlay, a dual-stack peer that announces both underlays
/// too; one that announces an IPv4 underlay alone cannot be reached from
/// here (`no_common_underlay`). What would cost a peer only its IPv6 side
/// elsewhere (a bad IPv6 podCIDR or underlay, overlaps, a shared
/// `vxlan6.1` MAC) rejects it whole here: its IPv6 side is all there is.
pub fn select_over_ipv6(
    nodes: &[NodeView],
    own_name: &str,
    own6: Option<Cidr6>,
    cluster6: Option<Cidr6>,
) -> Selection {
    let mut ok: Vec<Peer6> = Vec::new();
    let mut rejected = Vec::new();
    for n in nodes.iter().filter(|n| n.name != own_name) {
        match parse_peer_over_ipv6(n, cluster6) {
            Ok(p) if own6.is_some_and(|o| o.overlaps(p.pod_cidr6)) => {
                rejected.push((p.name, Reject::OverlapsOwn6(p.pod_cidr6.to_string())));
            }
            Ok(p) => ok.push(p),
            Err(r) => rejected.push((n.name.clone(), r)),
        }
    }
    let bad = overlapping(&ok.iter().map(|p| p.pod_cidr6).collect::<Vec<_>>());
    let macs6 = mac_counts(ok.iter().map(|p| p.underlay6.vtep_mac));
    let mut peers6 = Vec::with_capacity(ok.len());
    for (p, b) in ok.into_iter().zip(bad) {
        if b {
            rejected.push((p.name, Reject::OverlapsPeer6(p.pod_cidr6.to_string())));
        } else if macs6.get(&p.underlay6.vtep_mac).copied().unwrap_or(0) > 1 {
            let mac = p.underlay6.vtep_mac.to_string();
            rejected.push((p.name, Reject::DuplicateVtepMac6(mac)));
        } else {
            peers6.push(p);
        }
    }
    peers6.sort_by(|a, b| a.name.cmp(&b.name));
    Selection {
        peers: Vec::new(),
        peers6,
        rejected,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> Cidr {
        Cidr::parse_network("10.244.0.0/16").unwrap()
    }

    #[test]
    fn pod_cidrs_read_as_an_operator_writes_them() {
        let v4 = Cidr::parse_network("10.244.2.0/24").unwrap();
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
            assert_eq!(p.pod_cidr, Cidr::parse_network("10.244.1.0/24").unwrap());
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
            v4: Cidr::parse_network("10.244.0.0/24").ok(),
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
            v4: Cidr::parse_network("10.244.0.0/24").ok(),
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
        let v4 = Cidr::parse_network("10.244.1.0/24").ok();
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
                v4: Cidr::parse_network("10.244.0.0/24").ok(),
                v6: own.v6,
            },
            cluster2(),
        );
        assert_eq!((s.peers.len(), s.peers6.len()), (1, 1), "{:?}", s.rejected);
        assert_eq!(s.peers[0].host_ip, Ipv4Addr::new(192, 168, 0, 1));
    }
}
