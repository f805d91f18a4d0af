//! Node validation: peer Nodes, as far as the overlay cares: their
//! podCIDRs, VTEP MAC and host IP. Node objects are untrusted input:
//! anything malformed or hostile is rejected with a reason (logged and
//! counted), never programmed. The annotations read here are what the
//! agents of a cluster tell each other, so the rules live beside the
//! annotation keys ([`crate::contract`]), not in one agent's code.
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
//! Pure: std and this crate only, so the `peer_node` fuzz target (fuzz/)
//! depends on it without the agent's kube, aya and tokio.
//!
//! - `parse`: one Node on its own (its IPv4 side, IPv6 side, IPv6 underlay);
//! - `select`: all Nodes together (overlaps, shared VTEP MACs);
//! - `reject`: why a Node, or its IPv6 side, is not programmed.

use std::collections::BTreeMap;
use std::format;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::string::String;
use std::vec::Vec;

use crate::net::{Cidr4, Cidr6, ClusterCidrs, Mac, PodCidrs};

mod parse;
mod reject;
mod select;
#[cfg(test)]
mod tests;

pub use parse::{parse_peer, parse_peer6, parse_underlay6};
pub use reject::Reject;
pub use select::{select_all, select_over_ipv6, select_peers};

/// The prefix lengths a peer's IPv4 podCIDR may have.
const PREFIX_V4: std::ops::RangeInclusive<u8> = 8..=30;
/// The prefix lengths a peer's IPv6 podCIDR may have: a /124 leaves 15
/// pod addresses beside the VTEP's, and no node gets less than a /16.
const PREFIX_V6: std::ops::RangeInclusive<u8> = 16..=124;

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
                Cidr4::parse_network(one)
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

/// A peer the agent will program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub name: String,
    pub pod_cidr: Cidr4,
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
