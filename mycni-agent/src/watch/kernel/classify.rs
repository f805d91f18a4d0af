//! What a notification means for the loop: nothing, a pods pass, a drift
//! pass or an underlay re-read. Pure: messages in, a [`Wake`] out.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_route::address::AddressAttribute;
use netlink_packet_route::link::{
    InfoData, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::packet_core::{NetlinkBuffer, NetlinkMessage, NetlinkPayload};

use mycni_common::netlink::NexthopMessage;

use mycni_common::net::{Cidr4, Cidr6, Mac};

use super::watched::{Snapshot, Wake};
use crate::kernel::{RTPROT_MYCNI_AGENT, RTPROT_MYCNI_PLUGIN, is_pod_veth};
use crate::topology::{UnderlaySelect, glob_match, via_vxlan};

// Nexthop notifications, which netlink-packet-route cannot parse: the
// shared netlink layer's `NexthopMessage` does.
pub(super) const RTM_NEWNEXTHOP: u16 = 104;
pub(super) const RTM_DELNEXTHOP: u16 = 105;
/// The main routing table, where the agent's and the default route live.
pub(super) const RT_TABLE_MAIN: u32 = 254;

/// Which passes a notification calls for.
pub fn classify(msg: &NetlinkMessage<RouteNetlinkMessage>, s: &Snapshot) -> Wake {
    match &msg.payload {
        NetlinkPayload::InnerMessage(m) => classify_inner(m, s),
        // Notifications were lost: any of them may have mattered.
        NetlinkPayload::Overrun(_) => Wake::ALL,
        _ => Wake::default(),
    }
}

pub(super) fn classify_inner(m: &RouteNetlinkMessage, s: &Snapshot) -> Wake {
    use RouteNetlinkMessage as M;
    match m {
        M::NewRoute(r) | M::DelRoute(r) => route(r, matches!(m, M::DelRoute(_)), s),
        M::NewLink(l) | M::DelLink(l) => link(l, matches!(m, M::DelLink(_)), s),
        // A qdisc may shape a pod, which the fast path then leaves alone
        // (datapath/shaping.rs). Qdiscs change rarely, so any but the
        // `clsact` the agent's own legacy attach makes re-reads the pods.
        M::NewQueueDiscipline(q) | M::DelQueueDiscipline(q) => {
            let clsact = q.attributes.iter().any(
                |a| matches!(a, netlink_packet_route::tc::TcAttribute::Kind(k) if k == "clsact"),
            );
            if clsact { Wake::default() } else { Wake::PODS }
        }
        M::NewNeighbour(n) | M::DelNeighbour(n) => {
            Wake::overlay(neighbour(n, matches!(m, M::DelNeighbour(_)), s))
        }
        M::NewAddress(a) | M::DelAddress(a) if a.header.family == AddressFamily::Inet6 => {
            // IFA_ADDRESS: IPv6 notifications carry no IFA_LOCAL.
            let addr = a.attributes.iter().find_map(|x| match x {
                AddressAttribute::Address(IpAddr::V6(ip)) => Some(*ip),
                _ => None,
            });
            let global = addr.is_some_and(|a| !a.is_unicast_link_local());
            if s.vxlan6_index != 0 && a.header.index == s.vxlan6_index {
                // An IPv6-only node's VTEP address removed (the one global
                // address vxlan6.1 has): ensure_vxlan6 adds it.
                return Wake::overlay(matches!(m, M::DelAddress(_)) && global);
            }
            let on_vxlan = s.vxlan_index != 0 && a.header.index == s.vxlan_index;
            if s.ipv6_underlay && !on_vxlan {
                return Wake::underlay(global);
            }
            // The IPv6 VTEP address removed: ensure_vxlan adds it.
            let vtep = s.expected.as_ref().map(|e| e.vxlan.address6);
            Wake::overlay(
                on_vxlan
                    && matches!(m, M::DelAddress(_))
                    && match vtep {
                        None => true,
                        Some(v) => v.is_some() && addr == v,
                    },
            )
        }
        M::NewAddress(a) | M::DelAddress(a) => {
            let mut label = None;
            let mut local = None;
            for x in &a.attributes {
                match x {
                    AddressAttribute::Label(l) => label = Some(l.as_str()),
                    AddressAttribute::Local(IpAddr::V4(ip)) => local = Some(*ip),
                    _ => {}
                }
            }
            if s.is_vxlan(a.header.index, label) {
                // The VTEP address (podCIDR.0) removed: ensure_vxlan adds it.
                let vtep = s.expected.as_ref().map(|e| e.vxlan.address);
                Wake::overlay(matches!(m, M::DelAddress(_)) && (vtep.is_none() || local == vtep))
            } else {
                Wake::underlay(true)
            }
        }
        _ => Wake::default(),
    }
}

pub(super) fn route(r: &RouteMessage, deleted: bool, s: &Snapshot) -> Wake {
    let proto = r.header.protocol;
    if proto == RouteProtocol::Other(RTPROT_MYCNI_PLUGIN) {
        return Wake::PODS;
    }
    let v6 = r.header.address_family == AddressFamily::Inet6;
    let mut dst: IpAddr = if v6 {
        Ipv6Addr::UNSPECIFIED.into()
    } else {
        Ipv4Addr::UNSPECIFIED.into()
    };
    let (mut gateway, mut oif, mut table) = (None, None, u32::from(r.header.table));
    for a in &r.attributes {
        match a {
            RouteAttribute::Destination(RouteAddress::Inet(d)) => dst = IpAddr::V4(*d),
            RouteAttribute::Destination(RouteAddress::Inet6(d)) => dst = IpAddr::V6(*d),
            RouteAttribute::Gateway(RouteAddress::Inet(g)) => gateway = Some(IpAddr::V4(*g)),
            RouteAttribute::Gateway(RouteAddress::Inet6(g)) => gateway = Some(IpAddr::V6(*g)),
            RouteAttribute::Oif(o) => oif = Some(*o),
            RouteAttribute::Table(t) => table = *t,
            _ => {}
        }
    }
    if table != RT_TABLE_MAIN {
        return Wake::default();
    }
    let ours = proto == RouteProtocol::Other(RTPROT_MYCNI_AGENT);
    if s.vxlan6_index != 0 && oif == Some(s.vxlan6_index) {
        return Wake::overlay(ours && deleted);
    }
    let prefix = r.header.destination_prefix_length;
    let on_vxlan = s.vxlan_index != 0 && oif == Some(s.vxlan_index);
    // Which routes may move the underlay: IPv4 ones, or on an IPv6-only
    // node IPv6 ones that are not link-local (every pod veth's fe80::/64).
    let underlay_family = match dst {
        IpAddr::V4(_) => true,
        IpAddr::V6(d) => s.ipv6_underlay && !d.is_unicast_link_local(),
    };
    let Some(e) = &s.expected else {
        return Wake {
            overlay: ours && deleted,
            // Not ours, not on vxlan.1: the default route or the route
            // `can-reach` follows may have changed (of the underlay's
            // family).
            underlay: !ours && !on_vxlan && underlay_family,
            pods: false,
        };
    };
    // (gateway, whether through vxlan.1) of the route the loop wants.
    let want = match dst {
        IpAddr::V4(d) => Cidr4::new(d, prefix).and_then(|k| {
            e.overlay
                .routes
                .get(&k)
                .map(|gw| (IpAddr::V4(*gw), via_vxlan(k, *gw)))
        }),
        IpAddr::V6(d) => Cidr6::new(d, prefix).and_then(|k| {
            e.overlay
                .routes6
                .get(&k)
                .map(|gw| (IpAddr::V6(*gw), via_vxlan(k, *gw)))
        }),
    };
    match want {
        // A route the loop wants: deleted, or replaced by one that is not
        // the agent's, goes elsewhere or leaves by another device.
        Some((gw, through_vxlan)) => {
            let dev = if through_vxlan {
                s.vxlan_index
            } else {
                e.vxlan.underlay_index
            };
            let drift = if deleted {
                ours
            } else {
                !ours
                    || gateway.is_some_and(|g| g != gw)
                    || (dev != 0 && oif.is_some_and(|o| o != dev))
            };
            Wake::overlay(drift)
        }
        // Ours but not wanted: the loop's own deletion (or a stale route
        // the next full pass removes).
        None if ours => Wake::default(),
        None => Wake::underlay(!on_vxlan && underlay_family),
    }
}

/// What a link notification says about a VXLAN device.
pub(super) struct LinkView<'a> {
    name: Option<&'a str>,
    alias: Option<&'a str>,
    mac: Option<&'a [u8]>,
    mtu: Option<u32>,
    local: Option<Ipv4Addr>,
    dev: Option<u32>,
    vni: Option<u32>,
    port: Option<u16>,
    learning: Option<bool>,
}

pub(super) fn link_view(l: &LinkMessage) -> LinkView<'_> {
    let mut v = LinkView {
        name: None,
        alias: None,
        mac: None,
        mtu: None,
        local: None,
        dev: None,
        vni: None,
        port: None,
        learning: None,
    };
    for a in &l.attributes {
        match a {
            LinkAttribute::IfName(n) => v.name = Some(n),
            LinkAttribute::IfAlias(x) => v.alias = Some(x),
            LinkAttribute::Address(m) => v.mac = Some(m),
            LinkAttribute::Mtu(m) => v.mtu = Some(*m),
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    if let LinkInfo::Data(InfoData::Vxlan(attrs)) = i {
                        for x in attrs {
                            match x {
                                InfoVxlan::Local(ip) => v.local = Some(*ip),
                                InfoVxlan::Link(d) => v.dev = Some(*d),
                                InfoVxlan::Id(n) => v.vni = Some(*n),
                                InfoVxlan::Port(p) => v.port = Some(*p),
                                InfoVxlan::Learning(b) => v.learning = Some(*b),
                                _ => {}
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
    v
}

pub(super) fn link(l: &LinkMessage, deleted: bool, s: &Snapshot) -> Wake {
    let v = link_view(l);
    if v.alias.is_some_and(is_pod_veth) {
        return Wake::PODS;
    }
    let index = l.header.index;
    if s.vxlan6_index != 0 && index == s.vxlan6_index {
        return Wake::overlay(deleted || !l.header.flags.contains(LinkFlags::Up));
    }
    if s.is_vxlan(index, v.name) {
        if deleted {
            return Wake::overlay(true);
        }
        let Some(e) = &s.expected else {
            return Wake::default();
        };
        let x = &e.vxlan;
        // Each attribute the kernel reported must be what ensure_vxlan
        // makes; one not reported is not a disagreement.
        let differs = v.name != Some(x.name.as_str())
            || !l.header.flags.contains(LinkFlags::Up)
            || v.mac.is_some_and(|m| m != x.mac.0.as_slice())
            || v.mtu.is_some_and(|m| m != x.mtu)
            || v.local.is_some_and(|ip| ip != x.local_ip)
            || v.dev.is_some_and(|d| d != x.underlay_index)
            || v.vni.is_some_and(|n| n != x.vni)
            || v.port.is_some_and(|p| p != x.port)
            || v.learning == Some(true);
        return Wake::overlay(differs);
    }
    let underlay = s.underlay_index();
    let named = match (s.underlay, v.name) {
        (UnderlaySelect::Name(n), Some(name)) => n == name,
        (UnderlaySelect::Pattern(p), Some(name)) => glob_match(p, name),
        _ => false,
    };
    Wake::underlay((underlay != 0 && index == underlay) || named)
}

pub(super) fn neighbour(n: &NeighbourMessage, deleted: bool, s: &Snapshot) -> bool {
    if s.vxlan6_index != 0 && n.header.ifindex == s.vxlan6_index {
        return deleted;
    }
    let on_vxlan = s.vxlan_index != 0 && n.header.ifindex == s.vxlan_index;
    let permanent = n.header.state == NeighbourState::Permanent;
    let Some(e) = &s.expected else {
        // `ip neigh del` fails the entry before removing it, so its
        // notification no longer says PERMANENT; FDB removals still do.
        return deleted && (permanent || on_vxlan);
    };
    if !on_vxlan && s.vxlan_index != 0 {
        return false;
    }
    let (mut dst, mut dst6, mut lladdr) = (None, None, None);
    for a in &n.attributes {
        match a {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) => dst = Some(*ip),
            NeighbourAttribute::Destination(NeighbourAddress::Inet6(ip)) => dst6 = Some(*ip),
            // An FDB entry's (AF_BRIDGE) destination: netlink-packet-route
            // leaves it as raw bytes. Unread, every FDB entry the agent
            // wrote looked like drift and woke a full pass.
            NeighbourAttribute::Destination(NeighbourAddress::Other(b)) => match b.len() {
                4 => dst = <[u8; 4]>::try_from(b.as_slice()).ok().map(Ipv4Addr::from),
                16 => dst6 = <[u8; 16]>::try_from(b.as_slice()).ok().map(Ipv6Addr::from),
                _ => {}
            },
            NeighbourAttribute::LinkLayerAddress(m) => lladdr = Mac::try_from(m.as_slice()).ok(),
            _ => {}
        }
    }
    if n.header.family == AddressFamily::Bridge {
        // An FDB entry: VTEP MAC -> host IP.
        let Some(want) = lladdr.and_then(|m| e.overlay.fdb.get(&m)) else {
            return false;
        };
        deleted || !permanent || dst != Some(*want)
    } else if n.header.family == AddressFamily::Inet6 {
        // An IPv6 neighbour: IPv6 VTEP address -> VTEP MAC.
        let Some(want) = dst6.and_then(|ip| e.overlay.neighbours6.get(&ip)) else {
            return false;
        };
        deleted || !permanent || lladdr != Some(*want)
    } else {
        // A neighbour: gateway -> VTEP MAC.
        let Some(want) = dst.and_then(|ip| e.overlay.neighbours.get(&ip)) else {
            return false;
        };
        deleted || !permanent || lladdr != Some(*want)
    }
}

/// Whether a nexthop notification is drift: one of the agent's nexthops
/// (its protocol) that a wanted route points at deleted, or one made or
/// changed to point at a gateway no wanted route has.
pub(crate) fn classify_nexthop(m: &NexthopMessage, s: &Snapshot) -> Wake {
    let Some(nh) = m.nexthop() else {
        return Wake::default();
    };
    if nh.protocol != RTPROT_MYCNI_AGENT {
        return Wake::default();
    }
    let Some(e) = &s.expected else {
        return Wake::overlay(m.is_delete());
    };
    let wanted = nh.gateway.is_some_and(|g| e.gateways.contains(&g));
    Wake::overlay(if m.is_delete() { wanted } else { !wanted })
}

/// One datagram's worth of notifications, classified.
pub(super) fn classify_datagram(buf: &[u8], s: &Snapshot) -> Wake {
    let mut wake = Wake::default();
    let mut off = 0;
    while off < buf.len() {
        let Ok(b) = NetlinkBuffer::new_checked(&buf[off..]) else {
            // A datagram we cannot walk: treat it as lost.
            return Wake::ALL;
        };
        let len = b.length() as usize;
        let kind = b.message_type();
        let Some(bytes) = buf.get(off..off + len) else {
            return Wake::ALL;
        };
        let w = if matches!(kind, RTM_NEWNEXTHOP | RTM_DELNEXTHOP) {
            match NetlinkMessage::<NexthopMessage>::deserialize(bytes) {
                Ok(m) => match &m.payload {
                    NetlinkPayload::InnerMessage(nh) => classify_nexthop(nh, s),
                    _ => Wake::default(),
                },
                // Malformed: it may have been one of ours.
                Err(_) => Wake::overlay(true),
            }
        } else {
            match NetlinkMessage::<RouteNetlinkMessage>::deserialize(bytes) {
                Ok(m) => classify(&m, s),
                // A kind of message this crate cannot parse is none of
                // the ones that matter here.
                Err(_) => Wake::default(),
            }
        };
        wake = wake.or(w);
        off += len.next_multiple_of(4).max(4);
    }
    wake
}
