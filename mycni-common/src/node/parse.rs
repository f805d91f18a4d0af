//! One Node on its own: its IPv4 side, its IPv6 side and its IPv6 underlay.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::string::{String, ToString};

use crate::contract::{
    ANNOTATION_HOST_IP, ANNOTATION_HOST_IP6, ANNOTATION_VTEP_MAC, ANNOTATION_VTEP_MAC6,
};
use crate::net::{Cidr6, ClusterCidrs, Family, Mac};

use super::{NodeView, PREFIX_V4, PREFIX_V6, Peer, Peer6, Reject, Underlay6};

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
    cluster: crate::net::Cidr<A>,
    bad: fn(String) -> Reject,
    outside: fn(String) -> Reject,
) -> Result<crate::net::Cidr<A>, Reject> {
    let c = crate::net::Cidr::<A>::parse_network(s)
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

/// A peer as a node without `vxlan.1` sees it: its IPv6 podCIDR and its
/// IPv6 underlay, both required; whatever IPv4 it has is not reachable
/// from here.
pub(super) fn parse_peer_over_ipv6(
    node: &NodeView,
    cluster6: Option<Cidr6>,
) -> Result<Peer6, Reject> {
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
