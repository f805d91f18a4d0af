//! Why a Node, or its IPv6 side or underlay, is not programmed: the
//! metric's `reason` and the message an operator reads.

use core::fmt;
use std::string::String;

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
        !self.scope().is_empty()
    }

    /// What of the peer a reason costs, as its message starts: nothing
    /// for a Node rejected whole, its IPv6 podCIDR, or its IPv6 underlay.
    fn scope(&self) -> &'static str {
        match self {
            Reject::BadPodCidr6(_)
            | Reject::OutsideClusterCidr6(_)
            | Reject::OverlapsOwn6(_)
            | Reject::OverlapsPeer6(_) => "IPv6 side not programmed: ",
            Reject::IncompleteUnderlay6(_)
            | Reject::BadHostIp6(_)
            | Reject::BadMac6(_)
            | Reject::DuplicateVtepMac6(_) => "IPv6 underlay not used: ",
            _ => "",
        }
    }
}

/// The message is [`Reject::scope`] and what is wrong; a reason and its
/// IPv6 twin share the latter where the words are the same.
impl fmt::Display for Reject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.scope())?;
        match self {
            Reject::Incomplete(what) => write!(f, "not ready yet: {what}"),
            Reject::IncompleteUnderlay6(what) => f.write_str(what),
            Reject::BadPodCidr(s) => {
                write!(
                    f,
                    "podCIDR {s:?} is not one IPv4 network between /8 and /30"
                )
            }
            Reject::BadPodCidr6(s) => {
                write!(
                    f,
                    "podCIDR {s:?} is not one IPv6 network between /16 and /124"
                )
            }
            Reject::NoIpv4PodCidr(s) => write!(
                f,
                "podCIDRs {s} have no IPv4 range, and no valid IPv6 podCIDR and IPv6 underlay (mycni.dev/host-ip-v6, mycni.dev/vtep-mac-v6) to reach it over"
            ),
            Reject::OutsideClusterCidr(s) => write!(f, "podCIDR {s} is outside the cluster CIDR"),
            Reject::OutsideClusterCidr6(s) => {
                write!(f, "podCIDR {s} is outside the IPv6 cluster CIDR")
            }
            Reject::OverlapsOwn(s) | Reject::OverlapsOwn6(s) => {
                write!(f, "podCIDR {s} overlaps this node's")
            }
            Reject::OverlapsPeer(s) | Reject::OverlapsPeer6(s) => {
                write!(f, "podCIDR {s} overlaps another node's")
            }
            Reject::BadMac(s) | Reject::BadMac6(s) => {
                write!(f, "VTEP MAC {s:?} is not a unicast MAC")
            }
            Reject::BadHostIp(s) => write!(f, "host IP {s:?} is not a unicast IPv4 address"),
            Reject::BadHostIp6(s) => write!(
                f,
                "host IP {s:?} is not a global or unique-local unicast IPv6 address"
            ),
            Reject::DuplicateVtepMac(s) => write!(
                f,
                "VTEP MAC {s} is announced by another Node too (a cloned VM?)"
            ),
            Reject::DuplicateVtepMac6(s) => {
                write!(f, "VTEP MAC {s} is announced by another Node too")
            }
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
