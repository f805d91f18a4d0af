//! All Nodes together: which become peers, and why the others do not
//! (overlapping podCIDRs, shared VTEP MACs).

use std::collections::BTreeMap;
use std::string::{String, ToString};
use std::vec;
use std::vec::Vec;

use crate::contract::ANNOTATION_HOST_IP;
use crate::net::{Cidr6, ClusterCidrs, Family, Mac, PodCidrs};

use super::parse::parse_peer_over_ipv6;
use super::{NodeView, Peer, Peer6, Reject, Selection, parse_peer, parse_peer6, parse_underlay6};

/// Which of `cidrs` overlap another of them, in their order. Sorted by
/// start address, a range can only overlap the ones that start before it
/// ends.
fn overlapping<A: Family>(cidrs: &[crate::net::Cidr<A>]) -> Vec<bool> {
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

/// Leaves out `p`'s IPv6 underlay when another Node announces its
/// `vxlan6.1` MAC too (`macs6`: how often each is announced).
fn drop_shared_underlay6(
    p: &mut Peer,
    macs6: &BTreeMap<Mac, usize>,
    rejected: &mut Vec<(String, Reject)>,
) {
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
        drop_shared_underlay6(p, &macs6, &mut rejected);
    }
    peers.sort_by(|a, b| a.name.cmp(&b.name));
    (peers, rejected)
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
        drop_shared_underlay6(p, &macs6, &mut rejected);
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
