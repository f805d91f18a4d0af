//! What the fast path's maps and attachments should hold: a pure function
//! of what the kernel holds on the VXLAN devices after a pass and of the
//! pods the plugin set up. [`super::DatapathRoom::sync`] writes it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, Ipv6Addr};

use mycni_common::{LocalEndpoint, PeerNode, REMOTE_DIRECT, REMOTE_VXLAN6, RemoteNode};

use super::Prog;
use crate::kernel::{PodEndpoint, PodEndpoints};
use crate::topology::{OverlayState, Remote};

/// The forwarding maps' contents after a pass.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct RemoteMaps {
    /// `mycni_remote`: IPv4 podCIDR -> peer.
    pub remote: BTreeMap<(Ipv4Addr, u8), RemoteNode>,
    /// `mycni_peers`: the hosts VXLAN may come from.
    pub peers: BTreeMap<Ipv4Addr, PeerNode>,
    /// `mycni_remote6`: IPv6 podCIDR -> peer, over either underlay.
    pub remote6: BTreeMap<(Ipv6Addr, u8), RemoteNode>,
}

/// The forwarding maps from what the kernel holds on `vxlan.1` (`overlay`)
/// and on `vxlan6.1` (`overlay6`, on a node with an IPv6 underlay).
pub(crate) fn remote_maps(overlay: &OverlayState, overlay6: Option<&OverlayState>) -> RemoteMaps {
    // Only what the kernel backs: a route through vxlan.1 whose gateway
    // has a neighbour whose MAC has an FDB entry, or a direct route to a
    // peer's host.
    let remote = overlay
        .routes
        .iter()
        .filter_map(|(cidr, gw)| {
            let node = if crate::topology::via_vxlan(*cidr, *gw) {
                let mac = overlay.neighbours.get(gw)?;
                let host = overlay.fdb.get(mac)?;
                RemoteNode {
                    vtep_mac: mac.0,
                    flags: 0,
                    _pad: 0,
                    host_ip: u32::from_ne_bytes(host.octets()),
                }
            } else {
                // The VTEP MAC of the peer whose host this is, if known
                // (for `inspect`; a direct packet carries none).
                let mac = overlay
                    .fdb
                    .iter()
                    .find_map(|(m, h)| (h == gw).then_some(*m))
                    .unwrap_or_default();
                RemoteNode {
                    vtep_mac: mac.0,
                    flags: REMOTE_DIRECT,
                    _pad: 0,
                    host_ip: u32::from_ne_bytes(gw.octets()),
                }
            };
            Some(((cidr.addr(), cidr.prefix()), node))
        })
        .collect();
    // The hosts VXLAN may come from: those the FDB sends to.
    let peers = overlay
        .fdb
        .iter()
        .map(|(mac, host)| {
            (
                *host,
                PeerNode {
                    vtep_mac: mac.0,
                    _pad: [0; 2],
                },
            )
        })
        .collect();
    let mut remote6 = remote6_map(overlay.remotes6());
    if let Some(o6) = overlay6 {
        // A podCIDR on both devices is a pass caught between them (a
        // peer moving from one underlay to the other): vxlan.1's wins,
        // as run_loop programs it first.
        for (k, v) in vxlan6_remote_map(o6) {
            remote6.entry(k).or_insert(v);
        }
    }
    RemoteMaps {
        remote,
        peers,
        remote6,
    }
}

/// Where the programs should be attached: `vxlan.1` (its ifindex and its
/// underlay's, None on an IPv6-only node) and the underlay with tc
/// encapsulation, `vxlan6.1`, and every pod veth.
pub fn attachments(
    vxlan: Option<(u32, u32)>,
    tc_encap: bool,
    vxlan6: Option<u32>,
    pods: &PodEndpoints,
) -> BTreeSet<(Prog, u32)> {
    let underlay = vxlan
        .filter(|_| tc_encap)
        .map(|(_, underlay)| (Prog::FromUnderlay, underlay));
    vxlan
        .map(|(vx, _)| (Prog::FromVxlan, vx))
        .into_iter()
        // What vxlan6.1 decapsulates, as what vxlan.1 does.
        .chain(vxlan6.map(|i| (Prog::FromVxlan, i)))
        .chain(underlay)
        // Every pod veth, whatever families its pod has.
        .chain(pods.v4.values().map(|p| (Prog::FromPod, p.ifindex)))
        .chain(pods.v6.values().map(|p| (Prog::FromPod, p.ifindex)))
        .collect()
}

/// The local endpoint map of one family from the kernel's pods.
pub fn local_map<A: Ord + Copy>(pods: &BTreeMap<A, PodEndpoint>) -> BTreeMap<A, LocalEndpoint> {
    pods.iter()
        .map(|(ip, p)| {
            (
                *ip,
                LocalEndpoint {
                    ifindex: p.ifindex,
                    pod_mac: p.pod_mac.0,
                    host_mac: p.host_mac.0,
                },
            )
        })
        .collect()
}

/// `mycni_remote6` from the IPv6 podCIDRs the kernel backs on `vxlan.1`
/// (route, neighbour, FDB entry: `OverlayState::remotes6`). Never direct:
/// an IPv4 underlay carries IPv6 only encapsulated.
pub fn remote6_map(remotes: Vec<Remote<Ipv6Addr>>) -> BTreeMap<(Ipv6Addr, u8), RemoteNode> {
    remotes
        .into_iter()
        .map(|r| {
            (
                (r.pod_cidr.addr(), r.pod_cidr.prefix()),
                RemoteNode {
                    vtep_mac: r.vtep_mac.0,
                    flags: 0,
                    _pad: 0,
                    host_ip: u32::from_ne_bytes(r.host_ip.octets()),
                },
            )
        })
        .collect()
}

/// `mycni_remote6`'s entries for the peers over the IPv6 underlay: the
/// IPv6 podCIDRs the kernel backs on `vxlan6.1` (a route whose gateway has
/// a permanent neighbour whose MAC has an FDB entry), flagged
/// `REMOTE_VXLAN6`, without host IP (an IPv6 one, which only the FDB needs).
pub(crate) fn vxlan6_remote_map(overlay6: &OverlayState) -> BTreeMap<(Ipv6Addr, u8), RemoteNode> {
    overlay6
        .routes6
        .iter()
        .filter_map(|(cidr, gw)| {
            let mac = overlay6.neighbours6.get(gw)?;
            overlay6.fdb6.get(mac)?;
            let node = RemoteNode {
                vtep_mac: mac.0,
                flags: REMOTE_VXLAN6,
                _pad: 0,
                host_ip: 0,
            };
            Some(((cidr.addr(), cidr.prefix()), node))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use mycni_common::net::{Cidr4 as Cidr, Mac};

    fn mac(b: u8) -> Mac {
        Mac([2, 0, 0, 0, 6, b])
    }

    #[test]
    fn remote_entries_only_where_the_kernel_backs_them() {
        let mut o = OverlayState::default();
        let via: Cidr = "10.244.1.0/24".parse().unwrap();
        let gw = via.network();
        o.routes.insert(via, gw);
        o.neighbours.insert(gw, mac(1));
        o.fdb.insert(mac(1), Ipv4Addr::new(192, 168, 0, 11));
        // No neighbour: not backed, not in the map.
        let half: Cidr = "10.244.2.0/24".parse().unwrap();
        o.routes.insert(half, half.network());
        // Direct routing: the peer's host as the gateway.
        let direct: Cidr = "10.244.3.0/24".parse().unwrap();
        o.routes.insert(direct, Ipv4Addr::new(192, 168, 0, 13));
        let m = remote_maps(&o, None);
        assert_eq!(m.remote.len(), 2, "{m:?}");
        let v = m.remote[&(via.addr(), 24)];
        assert_eq!((v.flags, v.vtep_mac), (0, mac(1).0));
        assert_eq!(v.host_ip, u32::from_ne_bytes([192, 168, 0, 11]));
        let d = m.remote[&(direct.addr(), 24)];
        assert_eq!(d.flags, REMOTE_DIRECT);
        assert_eq!(d.host_ip, u32::from_ne_bytes([192, 168, 0, 13]));
        assert_eq!(
            m.peers.keys().copied().collect::<Vec<_>>(),
            vec![Ipv4Addr::new(192, 168, 0, 11)]
        );
        assert!(m.remote6.is_empty());
    }

    #[test]
    fn programs_on_vxlan_devices_the_underlay_with_tc_encap_and_every_veth() {
        let ep = |i| PodEndpoint {
            ifindex: i,
            host_mac: mac(0),
            pod_mac: mac(1),
        };
        let mut pods = PodEndpoints::default();
        pods.v4.insert(Ipv4Addr::new(10, 244, 0, 5), ep(20));
        pods.v6.insert("fd00:10:244::5".parse().unwrap(), ep(20));
        pods.v6.insert("fd00:10:244::6".parse().unwrap(), ep(21));
        let all = attachments(Some((3, 2)), true, Some(4), &pods);
        assert_eq!(
            all.into_iter().collect::<Vec<_>>(),
            vec![
                (Prog::FromPod, 20),
                (Prog::FromPod, 21),
                (Prog::FromVxlan, 3),
                (Prog::FromVxlan, 4),
                (Prog::FromUnderlay, 2),
            ]
        );
        let no_encap = attachments(Some((3, 2)), false, None, &pods);
        assert!(!no_encap.iter().any(|(p, _)| *p == Prog::FromUnderlay));
        // IPv6-only: no vxlan.1, nothing on an IPv4 underlay.
        let only6 = attachments(None, true, Some(4), &pods);
        assert!(only6.contains(&(Prog::FromVxlan, 4)) && only6.len() == 3);
    }

    #[test]
    fn remote6_holds_both_devices_and_vxlan1_wins_a_podcidr_on_both() {
        let six = |n: u16| -> mycni_common::net::Cidr6 {
            format!("fd00:10:244:{n:x}::/64").parse().unwrap()
        };
        // vxlan.1 carries 0x60 (IPv6 over the IPv4 underlay).
        let mut o = OverlayState::default();
        o.routes6.insert(six(0x60), six(0x60).network());
        o.neighbours6.insert(six(0x60).network(), mac(1));
        o.fdb.insert(mac(1), Ipv4Addr::new(192, 168, 0, 11));
        // vxlan6.1 holds 0x60 too (a peer caught moving) and 0x61.
        let mut o6 = OverlayState::default();
        for (n, m) in [(0x60, 2), (0x61, 3)] {
            o6.routes6.insert(six(n), six(n).network());
            o6.neighbours6.insert(six(n).network(), mac(m));
            o6.fdb6.insert(mac(m), "fd00:77::2".parse().unwrap());
        }
        let r6 = remote_maps(&o, Some(&o6)).remote6;
        assert_eq!(r6.len(), 2, "{r6:?}");
        let both = r6[&(six(0x60).addr(), 64)];
        assert_eq!((both.flags, both.vtep_mac), (0, mac(1).0));
        let only6 = r6[&(six(0x61).addr(), 64)];
        assert_eq!((only6.flags, only6.vtep_mac), (REMOTE_VXLAN6, mac(3).0));
    }

    #[test]
    fn vxlan6_entries_only_where_route_neighbour_and_fdb_entry_all_are() {
        let mut o = OverlayState::default();
        for (i, (neigh, fdb)) in [(true, true), (true, false), (false, true)]
            .into_iter()
            .enumerate()
        {
            let n = 0x50 + i as u16;
            let cidr: mycni_common::net::Cidr6 = format!("fd00:10:244:{n:x}::/64").parse().unwrap();
            let gw = cidr.network();
            o.routes6.insert(cidr, gw);
            if neigh {
                o.neighbours6.insert(gw, mac(i as u8));
            }
            if fdb {
                o.fdb6
                    .insert(mac(i as u8), format!("fd00:77::{n:x}").parse().unwrap());
            }
        }
        let m = vxlan6_remote_map(&o);
        let want = RemoteNode {
            vtep_mac: mac(0).0,
            flags: REMOTE_VXLAN6,
            _pad: 0,
            host_ip: 0,
        };
        assert_eq!(
            m.into_iter().collect::<Vec<_>>(),
            vec![(("fd00:10:244:50::".parse().unwrap(), 64), want)]
        );
    }
}
