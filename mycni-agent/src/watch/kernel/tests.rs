//! Notifications built by hand, classified as the kernel would send them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use netlink_packet_route::address::AddressAttribute;
use netlink_packet_route::link::{
    InfoData, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload};

use mycni_common::netlink::NexthopMessage;

use mycni_common::net::{Cidr4, Cidr6, Mac};

use super::classify::*;
use super::pins::watch_ended;
use super::watched::*;
use crate::kernel::{RTPROT_MYCNI_AGENT, RTPROT_MYCNI_PLUGIN};
use crate::topology::{OverlayState, UnderlaySelect, VxlanSpec};
use netlink_packet_route::address::AddressMessage;

fn spec() -> VxlanSpec {
    VxlanSpec {
        name: "vxlan.1".into(),
        vni: 1,
        port: 8472,
        underlay_index: 2,
        local_ip: Ipv4Addr::new(192, 168, 77, 11),
        mtu: 1450,
        mac: Mac([2, 0, 0, 0, 0, 1]),
        address: Ipv4Addr::new(10, 244, 1, 0),
        address6: Some("fd00:10:244:1::".parse().expect("ip")),
    }
}

const PEER: Ipv4Addr = Ipv4Addr::new(10, 244, 50, 0);
const PEER_MAC: Mac = Mac([2, 0, 0, 0, 0x50, 1]);
const PEER_HOST: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 150);
const PEER6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x244, 0x50, 0, 0, 0, 0);

fn peer_cidr() -> Cidr4 {
    Cidr4::new(PEER, 24).expect("cidr")
}

fn expected() -> Expected {
    let mut o = OverlayState::default();
    o.routes.insert(peer_cidr(), PEER);
    o.neighbours.insert(PEER, PEER_MAC);
    o.fdb.insert(PEER_MAC, PEER_HOST);
    o.routes6
        .insert(Cidr6::new(PEER6, 64).expect("cidr"), PEER6);
    o.neighbours6.insert(PEER6, PEER_MAC);
    Expected::new(spec(), o)
}

fn snap(expected: Option<Expected>) -> Snapshot<'static> {
    static DEFAULT: UnderlaySelect = UnderlaySelect::DefaultRoute;
    Snapshot {
        vxlan_name: "vxlan.1",
        underlay: &DEFAULT,
        vxlan_index: 7,
        vxlan6_index: 9,
        ipv6_underlay: false,
        underlay6_index: 0,
        expected: expected.map(Arc::new),
    }
}

fn wake(m: RouteNetlinkMessage, s: &Snapshot) -> Wake {
    classify(&NetlinkMessage::from(m), s)
}

fn route(proto: u8, dst: Ipv4Addr, prefix: u8, gw: Option<Ipv4Addr>, oif: u32) -> RouteMessage {
    let mut r = RouteMessage::default();
    r.header.protocol = RouteProtocol::from(proto);
    r.header.table = 254;
    r.header.destination_prefix_length = prefix;
    r.attributes
        .push(RouteAttribute::Destination(RouteAddress::Inet(dst)));
    if let Some(g) = gw {
        r.attributes
            .push(RouteAttribute::Gateway(RouteAddress::Inet(g)));
    }
    r.attributes.push(RouteAttribute::Oif(oif));
    r
}

fn link(name: &str, alias: Option<&str>) -> LinkMessage {
    let mut l = LinkMessage::default();
    l.attributes.push(LinkAttribute::IfName(name.into()));
    if let Some(a) = alias {
        l.attributes.push(LinkAttribute::IfAlias(a.into()));
    }
    l
}

fn vxlan_link(mac: Mac, mtu: u32, up: bool, local: Ipv4Addr) -> LinkMessage {
    let mut l = link("vxlan.1", None);
    l.header.index = 7;
    if up {
        l.header.flags = LinkFlags::Up;
    }
    l.attributes.push(LinkAttribute::Address(mac.0.to_vec()));
    l.attributes.push(LinkAttribute::Mtu(mtu));
    l.attributes
        .push(LinkAttribute::LinkInfo(vec![LinkInfo::Data(
            InfoData::Vxlan(vec![
                InfoVxlan::Id(1),
                InfoVxlan::Local(local),
                InfoVxlan::Link(2),
                InfoVxlan::Port(8472),
                InfoVxlan::Learning(false),
            ]),
        )]));
    l
}

fn neigh(family: AddressFamily, state: NeighbourState, ip: Ipv4Addr, mac: Mac) -> NeighbourMessage {
    let mut n = NeighbourMessage::default();
    n.header.family = family;
    n.header.state = state;
    n.header.ifindex = 7;
    n.attributes
        .push(NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)));
    n.attributes
        .push(NeighbourAttribute::LinkLayerAddress(mac.0.to_vec()));
    from_wire(&n)
}

/// `n` as the watch receives it: emitted and parsed again, so that an
/// attribute the parser reads by family (an FDB entry's destination is
/// raw bytes) looks as the kernel's would.
fn from_wire(n: &NeighbourMessage) -> NeighbourMessage {
    use rtnetlink::packet_core::{Emitable, Parseable};
    let mut buf = vec![0u8; n.buffer_len()];
    n.emit(&mut buf);
    NeighbourMessage::parse(buf.as_slice()).expect("a neighbour message")
}

fn address(index: u32, label: &str, ip: Ipv4Addr) -> AddressMessage {
    let mut a = AddressMessage::default();
    a.header.index = index;
    a.attributes.push(AddressAttribute::Label(label.into()));
    a.attributes.push(AddressAttribute::Local(IpAddr::V4(ip)));
    a
}

/// An RTM_*NEXTHOP datagram as the kernel sends it: nlmsghdr, nhmsg
/// { AF_INET, scope link, protocol, 0, flags onlink }, NHA_ID,
/// NHA_OIF 7, NHA_GATEWAY.
fn nexthop_bytes(kind: u16, protocol: u8, gw: Ipv4Addr) -> Vec<u8> {
    let mut p = vec![2u8, 253, protocol, 0, 4, 0, 0, 0];
    for (attr, value) in [
        (1u16, 0x6e00_0001u32.to_ne_bytes()),
        (5, 7u32.to_ne_bytes()),
        (6, gw.octets()),
    ] {
        p.extend_from_slice(&8u16.to_ne_bytes());
        p.extend_from_slice(&attr.to_ne_bytes());
        p.extend_from_slice(&value);
    }
    let mut b = Vec::new();
    b.extend_from_slice(&(16 + p.len() as u32).to_ne_bytes());
    b.extend_from_slice(&kind.to_ne_bytes());
    b.extend_from_slice(&[0; 10]);
    b.extend_from_slice(&p);
    b
}

fn nexthop(kind: u16, protocol: u8, gw: Ipv4Addr) -> NexthopMessage {
    let m = NetlinkMessage::<NexthopMessage>::deserialize(&nexthop_bytes(kind, protocol, gw))
        .expect("a nexthop message");
    match m.payload {
        NetlinkPayload::InnerMessage(nh) => nh,
        other => panic!("{other:?}"),
    }
}

const OVERLAY: Wake = Wake {
    pods: false,
    overlay: true,
    underlay: false,
};
const UNDERLAY: Wake = Wake {
    pods: false,
    overlay: false,
    underlay: true,
};
const NOTHING: Wake = Wake {
    pods: false,
    overlay: false,
    underlay: false,
};

#[test]
fn pod_routes_and_pod_veths_wake_the_pods_pass() {
    for s in [snap(None), snap(Some(expected()))] {
        let pod = route(
            RTPROT_MYCNI_PLUGIN,
            Ipv4Addr::new(10, 244, 1, 5),
            32,
            None,
            9,
        );
        assert_eq!(
            wake(RouteNetlinkMessage::NewRoute(pod.clone()), &s),
            Wake::PODS
        );
        assert_eq!(wake(RouteNetlinkMessage::DelRoute(pod), &s), Wake::PODS);
        let veth = || link("veth1", Some("mycni:mycni0:abc:eth0"));
        assert_eq!(wake(RouteNetlinkMessage::NewLink(veth()), &s), Wake::PODS);
        assert_eq!(wake(RouteNetlinkMessage::DelLink(veth()), &s), Wake::PODS);
        let lost = NetlinkMessage::new(Default::default(), NetlinkPayload::Overrun(vec![]));
        assert_eq!(classify(&lost, &s), Wake::ALL);
    }
}

#[test]
fn the_agents_own_writes_wake_nothing() {
    let s = snap(Some(expected()));
    let ours = route(RTPROT_MYCNI_AGENT, PEER, 24, Some(PEER), 7);
    assert_eq!(wake(RouteNetlinkMessage::NewRoute(ours), &s), NOTHING);
    // A route the loop no longer wants going away: its own deletion.
    let gone = route(
        RTPROT_MYCNI_AGENT,
        Ipv4Addr::new(10, 244, 60, 0),
        24,
        Some(Ipv4Addr::new(10, 244, 60, 0)),
        7,
    );
    assert_eq!(wake(RouteNetlinkMessage::DelRoute(gone), &s), NOTHING);
    let n = neigh(
        AddressFamily::Inet,
        NeighbourState::Permanent,
        PEER,
        PEER_MAC,
    );
    assert_eq!(wake(RouteNetlinkMessage::NewNeighbour(n), &s), NOTHING);
    let f = neigh(
        AddressFamily::Bridge,
        NeighbourState::Permanent,
        PEER_HOST,
        PEER_MAC,
    );
    assert_eq!(wake(RouteNetlinkMessage::NewNeighbour(f), &s), NOTHING);
    let vx = vxlan_link(spec().mac, 1450, true, spec().local_ip);
    assert_eq!(wake(RouteNetlinkMessage::NewLink(vx), &s), NOTHING);
    let vtep = address(7, "vxlan.1", spec().address);
    assert_eq!(wake(RouteNetlinkMessage::NewAddress(vtep), &s), NOTHING);
    let nh = nexthop(RTM_NEWNEXTHOP, RTPROT_MYCNI_AGENT, PEER);
    assert_eq!(classify_nexthop(&nh, &s), NOTHING);
    let old = nexthop(
        RTM_DELNEXTHOP,
        RTPROT_MYCNI_AGENT,
        Ipv4Addr::new(10, 244, 60, 0),
    );
    assert_eq!(classify_nexthop(&old, &s), NOTHING);
}

#[test]
fn state_that_disagrees_with_the_loop_wakes_a_drift_pass() {
    let s = snap(Some(expected()));
    let ours = route(RTPROT_MYCNI_AGENT, PEER, 24, Some(PEER), 7);
    assert_eq!(wake(RouteNetlinkMessage::DelRoute(ours), &s), OVERLAY);
    let wrong_gw = route(
        RTPROT_MYCNI_AGENT,
        PEER,
        24,
        Some(Ipv4Addr::new(10, 244, 51, 0)),
        7,
    );
    assert_eq!(wake(RouteNetlinkMessage::NewRoute(wrong_gw), &s), OVERLAY);
    let theirs = route(3, PEER, 24, Some(Ipv4Addr::new(192, 168, 77, 1)), 2);
    assert_eq!(wake(RouteNetlinkMessage::NewRoute(theirs), &s), OVERLAY);
    let wrong_dev = route(RTPROT_MYCNI_AGENT, PEER, 24, Some(PEER), 3);
    assert_eq!(wake(RouteNetlinkMessage::NewRoute(wrong_dev), &s), OVERLAY);

    let bad_mac = Mac([2, 0, 0, 0, 0x66, 6]);
    for n in [
        RouteNetlinkMessage::DelNeighbour(neigh(
            AddressFamily::Inet,
            NeighbourState::Failed,
            PEER,
            PEER_MAC,
        )),
        RouteNetlinkMessage::NewNeighbour(neigh(
            AddressFamily::Inet,
            NeighbourState::Permanent,
            PEER,
            bad_mac,
        )),
        RouteNetlinkMessage::NewNeighbour(neigh(
            AddressFamily::Inet,
            NeighbourState::Reachable,
            PEER,
            PEER_MAC,
        )),
        RouteNetlinkMessage::DelNeighbour(neigh(
            AddressFamily::Bridge,
            NeighbourState::Permanent,
            PEER_HOST,
            PEER_MAC,
        )),
        RouteNetlinkMessage::NewNeighbour(neigh(
            AddressFamily::Bridge,
            NeighbourState::Permanent,
            Ipv4Addr::new(192, 168, 77, 99),
            PEER_MAC,
        )),
    ] {
        assert_eq!(wake(n.clone(), &s), OVERLAY, "{n:?}");
    }

    let (mac, ip) = (spec().mac, spec().local_ip);
    for l in [
        vxlan_link(Mac([2, 0, 0, 0, 0, 2]), 1450, true, ip),
        vxlan_link(mac, 1400, true, ip),
        vxlan_link(mac, 1450, false, ip),
        vxlan_link(mac, 1450, true, Ipv4Addr::new(192, 168, 77, 99)),
    ] {
        assert_eq!(
            wake(RouteNetlinkMessage::NewLink(l.clone()), &s),
            OVERLAY,
            "{l:?}"
        );
    }
    let mut renamed = vxlan_link(mac, 1450, true, ip);
    renamed.attributes[0] = LinkAttribute::IfName("other".into());
    assert_eq!(wake(RouteNetlinkMessage::NewLink(renamed), &s), OVERLAY);
    assert_eq!(
        wake(RouteNetlinkMessage::DelLink(link("vxlan.1", None)), &s),
        OVERLAY
    );
    let vtep = address(7, "vxlan.1", spec().address);
    assert_eq!(wake(RouteNetlinkMessage::DelAddress(vtep), &s), OVERLAY);

    let nh = nexthop(RTM_DELNEXTHOP, RTPROT_MYCNI_AGENT, PEER);
    assert_eq!(classify_nexthop(&nh, &s), OVERLAY);
    let moved = nexthop(
        RTM_NEWNEXTHOP,
        RTPROT_MYCNI_AGENT,
        Ipv4Addr::new(10, 9, 9, 9),
    );
    assert_eq!(classify_nexthop(&moved, &s), OVERLAY);
}

#[test]
fn before_the_first_pass_deletions_of_the_agents_kind_wake_a_drift_pass() {
    let s = snap(None);
    let ours = route(RTPROT_MYCNI_AGENT, PEER, 24, Some(PEER), 7);
    assert_eq!(
        wake(RouteNetlinkMessage::DelRoute(ours.clone()), &s),
        OVERLAY
    );
    assert_eq!(wake(RouteNetlinkMessage::NewRoute(ours), &s), NOTHING);
    let mut failed = neigh(AddressFamily::Inet, NeighbourState::Failed, PEER, PEER_MAC);
    assert_eq!(
        wake(RouteNetlinkMessage::DelNeighbour(failed.clone()), &s),
        OVERLAY
    );
    failed.header.ifindex = 3;
    assert_eq!(wake(RouteNetlinkMessage::DelNeighbour(failed), &s), NOTHING);
    assert_eq!(
        wake(RouteNetlinkMessage::DelLink(link("vxlan.1", None)), &s),
        OVERLAY
    );
    let nh = nexthop(RTM_DELNEXTHOP, RTPROT_MYCNI_AGENT, PEER);
    assert_eq!(classify_nexthop(&nh, &s), OVERLAY);
}

#[test]
fn underlay_changes_wake_an_underlay_check() {
    for s in [snap(None), snap(Some(expected()))] {
        let host = address(2, "eth0", Ipv4Addr::new(192, 168, 77, 22));
        assert_eq!(
            wake(RouteNetlinkMessage::NewAddress(host.clone()), &s),
            UNDERLAY
        );
        assert_eq!(wake(RouteNetlinkMessage::DelAddress(host), &s), UNDERLAY);
        let default = route(
            3,
            Ipv4Addr::UNSPECIFIED,
            0,
            Some(Ipv4Addr::new(192, 168, 77, 1)),
            2,
        );
        assert_eq!(
            wake(RouteNetlinkMessage::NewRoute(default.clone()), &s),
            UNDERLAY
        );
        assert_eq!(wake(RouteNetlinkMessage::DelRoute(default), &s), UNDERLAY);
    }
    let s = snap(Some(expected()));
    let mut eth0 = link("eth0", None);
    eth0.header.index = 2;
    assert_eq!(wake(RouteNetlinkMessage::NewLink(eth0), &s), UNDERLAY);
    let named = UnderlaySelect::Pattern("en*".into());
    let s = Snapshot {
        underlay: &named,
        ..snap(None)
    };
    assert_eq!(
        wake(RouteNetlinkMessage::NewLink(link("ens3", None)), &s),
        UNDERLAY
    );
    assert_eq!(
        wake(RouteNetlinkMessage::NewLink(link("veth9", None)), &s),
        NOTHING
    );
}

#[test]
fn other_changes_wake_nothing() {
    let s = snap(Some(expected()));
    let mut local = route(2, spec().address, 32, None, 7);
    local.header.table = 255;
    assert_eq!(wake(RouteNetlinkMessage::NewRoute(local), &s), NOTHING);
    let other_dev = neigh(
        AddressFamily::Inet,
        NeighbourState::Reachable,
        Ipv4Addr::new(192, 168, 77, 1),
        PEER_MAC,
    );
    let mut other_dev = other_dev;
    other_dev.header.ifindex = 2;
    assert_eq!(
        wake(RouteNetlinkMessage::DelNeighbour(other_dev), &s),
        NOTHING
    );
    // An FDB entry for a MAC the loop does not want (the all-zeros default).
    let zero = neigh(
        AddressFamily::Bridge,
        NeighbourState::Permanent,
        PEER_HOST,
        Mac([0; 6]),
    );
    assert_eq!(wake(RouteNetlinkMessage::NewNeighbour(zero), &s), NOTHING);
    assert_eq!(
        wake(RouteNetlinkMessage::NewLink(link("veth9", None)), &s),
        NOTHING
    );
    let foreign = nexthop(RTM_DELNEXTHOP, 4, PEER);
    assert_eq!(classify_nexthop(&foreign, &s), NOTHING);
}

#[test]
fn a_datagram_of_several_notifications_is_walked_whole() {
    let s = snap(Some(expected()));
    // Our own route added, then the peer's nexthop deleted by someone.
    let mut own = Vec::new();
    let route = NetlinkMessage::from(RouteNetlinkMessage::NewRoute(route(
        RTPROT_MYCNI_AGENT,
        PEER,
        24,
        Some(PEER),
        7,
    )));
    let mut m = route;
    m.finalize();
    own.resize(m.buffer_len(), 0);
    m.serialize(&mut own);
    assert_eq!(classify_datagram(&own, &s), NOTHING);
    let mut both = own.clone();
    both.extend_from_slice(&nexthop_bytes(RTM_DELNEXTHOP, RTPROT_MYCNI_AGENT, PEER));
    assert_eq!(classify_datagram(&both, &s), OVERLAY);
    // Cut short: whatever it held may have mattered.
    assert_eq!(classify_datagram(&both[..both.len() - 3], &s), Wake::ALL);
}

fn route6(proto: u8, dst: Ipv6Addr, prefix: u8, gw: Option<Ipv6Addr>, oif: u32) -> RouteMessage {
    let mut r = RouteMessage::default();
    r.header.address_family = AddressFamily::Inet6;
    r.header.protocol = RouteProtocol::from(proto);
    r.header.table = 254;
    r.header.destination_prefix_length = prefix;
    r.attributes
        .push(RouteAttribute::Destination(RouteAddress::Inet6(dst)));
    if let Some(g) = gw {
        r.attributes
            .push(RouteAttribute::Gateway(RouteAddress::Inet6(g)));
    }
    r.attributes.push(RouteAttribute::Oif(oif));
    r
}

fn neigh6(state: NeighbourState, ip: Ipv6Addr, mac: Mac) -> NeighbourMessage {
    let mut n = NeighbourMessage::default();
    n.header.family = AddressFamily::Inet6;
    n.header.state = state;
    n.header.ifindex = 7;
    n.attributes
        .push(NeighbourAttribute::Destination(NeighbourAddress::Inet6(ip)));
    n.attributes
        .push(NeighbourAttribute::LinkLayerAddress(mac.0.to_vec()));
    n
}

fn address6(index: u32, ip: Ipv6Addr) -> AddressMessage {
    let mut a = AddressMessage::default();
    a.header.family = AddressFamily::Inet6;
    a.header.index = index;
    a.attributes.push(AddressAttribute::Address(IpAddr::V6(ip)));
    a
}

#[test]
fn ipv6_drift_wakes_a_drift_pass_and_the_agents_own_ipv6_writes_do_not() {
    let s = snap(Some(expected()));
    let ours = route6(RTPROT_MYCNI_AGENT, PEER6, 64, Some(PEER6), 7);
    assert_eq!(
        wake(RouteNetlinkMessage::NewRoute(ours.clone()), &s),
        NOTHING
    );
    assert_eq!(wake(RouteNetlinkMessage::DelRoute(ours), &s), OVERLAY);
    let wrong_gw = route6(RTPROT_MYCNI_AGENT, PEER6, 64, Some(Ipv6Addr::LOCALHOST), 7);
    assert_eq!(wake(RouteNetlinkMessage::NewRoute(wrong_gw), &s), OVERLAY);
    let theirs = route6(3, PEER6, 64, None, 2);
    assert_eq!(wake(RouteNetlinkMessage::NewRoute(theirs), &s), OVERLAY);
    // The loop's own deletion of a route it no longer wants.
    let old = Ipv6Addr::new(0xfd00, 0x10, 0x244, 0x60, 0, 0, 0, 0);
    let gone = route6(RTPROT_MYCNI_AGENT, old, 64, Some(old), 7);
    assert_eq!(wake(RouteNetlinkMessage::DelRoute(gone), &s), NOTHING);

    let n = neigh6(NeighbourState::Permanent, PEER6, PEER_MAC);
    assert_eq!(
        wake(RouteNetlinkMessage::NewNeighbour(n.clone()), &s),
        NOTHING
    );
    assert_eq!(wake(RouteNetlinkMessage::DelNeighbour(n), &s), OVERLAY);
    let moved = neigh6(NeighbourState::Permanent, PEER6, Mac([2, 0, 0, 0, 0x66, 6]));
    assert_eq!(wake(RouteNetlinkMessage::NewNeighbour(moved), &s), OVERLAY);

    let vtep6 = address6(7, spec().address6.expect("IPv6 VTEP"));
    assert_eq!(
        wake(RouteNetlinkMessage::NewAddress(vtep6.clone()), &s),
        NOTHING
    );
    assert_eq!(wake(RouteNetlinkMessage::DelAddress(vtep6), &s), OVERLAY);

    // An IPv6 nexthop: nhmsg { AF_INET6, .. }, NHA_ID, NHA_OIF, and a
    // 16-byte NHA_GATEWAY.
    let nh6 = |kind: u16, gw: Ipv6Addr| {
        let mut p = vec![10u8, 253, RTPROT_MYCNI_AGENT, 0, 4, 0, 0, 0];
        for (attr, value) in [
            (1u16, 0x6e00_0002u32.to_ne_bytes()),
            (5, 7u32.to_ne_bytes()),
        ] {
            p.extend_from_slice(&8u16.to_ne_bytes());
            p.extend_from_slice(&attr.to_ne_bytes());
            p.extend_from_slice(&value);
        }
        p.extend_from_slice(&20u16.to_ne_bytes());
        p.extend_from_slice(&6u16.to_ne_bytes());
        p.extend_from_slice(&gw.octets());
        let mut b = Vec::new();
        b.extend_from_slice(&(16 + p.len() as u32).to_ne_bytes());
        b.extend_from_slice(&kind.to_ne_bytes());
        b.extend_from_slice(&[0; 10]);
        b.extend_from_slice(&p);
        classify_datagram(&b, &s)
    };
    assert_eq!(
        nh6(RTM_DELNEXTHOP, PEER6),
        OVERLAY,
        "a wanted route's nexthop deleted"
    );
    assert_eq!(nh6(RTM_NEWNEXTHOP, PEER6), NOTHING, "the agent's own");
    assert_eq!(
        nh6(RTM_NEWNEXTHOP, Ipv6Addr::LOCALHOST),
        OVERLAY,
        "pointed elsewhere"
    );
}

#[test]
fn deletions_on_vxlan6_wake_a_drift_pass_and_the_agents_additions_do_not() {
    use RouteNetlinkMessage as M;
    let s = snap(Some(expected()));
    let (dst, gw): (Ipv6Addr, Ipv6Addr) = (
        "fd00:10:244:50::".parse().unwrap(),
        "fd00:10:244:50::".parse().unwrap(),
    );
    let r = || route6(RTPROT_MYCNI_AGENT, dst, 64, Some(gw), 9);
    // Not in `expected` (that is vxlan.1's), yet not stale either.
    assert_eq!(wake(M::NewRoute(r()), &s), NOTHING);
    assert_eq!(wake(M::DelRoute(r()), &s), OVERLAY);
    // Someone else's route on it: not the agent's to repair.
    assert_eq!(
        wake(M::DelRoute(route6(4, dst, 64, Some(gw), 9)), &s),
        NOTHING
    );
    let mac = Mac([2, 0, 0, 0, 6, 0x50]);
    let on6 = |mut n: NeighbourMessage| {
        n.header.ifindex = 9;
        n
    };
    let n = || on6(neigh6(NeighbourState::Permanent, gw, mac));
    assert_eq!(wake(M::NewNeighbour(n()), &s), NOTHING);
    assert_eq!(wake(M::DelNeighbour(n()), &s), OVERLAY);
    let mut fdb = on6(neigh6(NeighbourState::Permanent, gw, mac));
    fdb.header.family = AddressFamily::Bridge;
    assert_eq!(wake(M::DelNeighbour(fdb), &s), OVERLAY);
    let mut l = link("vxlan6.1", None);
    l.header.index = 9;
    assert_eq!(wake(M::DelLink(l.clone()), &s), OVERLAY);
    // Down (no IFF_UP): ensure_vxlan6 brings it up.
    assert_eq!(wake(M::NewLink(l.clone()), &s), OVERLAY);
    l.header.flags = LinkFlags::Up;
    assert_eq!(wake(M::NewLink(l), &s), NOTHING);
    // Without vxlan6.1, index 9 is just another device.
    let none = Snapshot {
        vxlan6_index: 0,
        ..snap(Some(expected()))
    };
    let other: Ipv6Addr = "fd00:10:244:51::".parse().unwrap();
    let r = route6(RTPROT_MYCNI_AGENT, other, 64, Some(other), 9);
    assert_eq!(wake(M::DelRoute(r.clone()), &s), OVERLAY);
    assert_eq!(wake(M::DelRoute(r), &none), NOTHING);
}

#[test]
fn ipv6_on_pods_and_the_host_wakes_no_overlay_or_underlay_pass() {
    for s in [snap(None), snap(Some(expected()))] {
        // Every pod veth brings a link-local address and fe80::/64.
        let ll: Ipv6Addr = "fe80::1".parse().expect("ip");
        assert_eq!(
            wake(RouteNetlinkMessage::NewAddress(address6(9, ll)), &s),
            NOTHING
        );
        assert_eq!(
            wake(RouteNetlinkMessage::DelAddress(address6(9, ll)), &s),
            NOTHING
        );
        let fe80 = route6(2, "fe80::".parse().expect("ip"), 64, None, 9);
        assert_eq!(
            wake(RouteNetlinkMessage::NewRoute(fe80.clone()), &s),
            NOTHING
        );
        assert_eq!(wake(RouteNetlinkMessage::DelRoute(fe80), &s), NOTHING);
        let default6 = route6(9, Ipv6Addr::UNSPECIFIED, 0, Some(ll), 2);
        assert_eq!(wake(RouteNetlinkMessage::NewRoute(default6), &s), NOTHING);
        // A pod's /128 is a pod.
        let pod = route6(
            RTPROT_MYCNI_PLUGIN,
            "fd00:10:244:1::5".parse().expect("ip"),
            128,
            None,
            9,
        );
        assert_eq!(wake(RouteNetlinkMessage::NewRoute(pod), &s), Wake::PODS);
    }
}

#[test]
fn on_an_ipv6_only_node_ipv6_moves_the_underlay_and_the_vtep6_is_watched() {
    use RouteNetlinkMessage as M;
    // No vxlan.1, no Expected: vxlan6.1 (index 9) is the device.
    let s = Snapshot {
        vxlan_index: 0,
        ipv6_underlay: true,
        ..snap(None)
    };
    let host6: Ipv6Addr = "fd00:77::11".parse().expect("ip");
    for m in [
        M::NewAddress(address6(2, host6)),
        M::DelAddress(address6(2, host6)),
    ] {
        assert_eq!(wake(m, &s), UNDERLAY);
    }
    let ll: Ipv6Addr = "fe80::1".parse().expect("ip");
    assert_eq!(wake(M::NewAddress(address6(12, ll)), &s), NOTHING);
    let default6 = route6(9, Ipv6Addr::UNSPECIFIED, 0, Some(ll), 2);
    assert_eq!(wake(M::NewRoute(default6.clone()), &s), UNDERLAY);
    assert_eq!(wake(M::DelRoute(default6), &s), UNDERLAY);
    let fe80 = route6(2, "fe80::".parse().expect("ip"), 64, None, 12);
    assert_eq!(wake(M::NewRoute(fe80), &s), NOTHING);
    // The VTEP address on vxlan6.1: its removal is drift.
    let vtep6: Ipv6Addr = "fd00:10:244:1::".parse().expect("ip");
    assert_eq!(wake(M::NewAddress(address6(9, vtep6)), &s), NOTHING);
    assert_eq!(wake(M::DelAddress(address6(9, vtep6)), &s), OVERLAY);
    assert_eq!(wake(M::DelAddress(address6(9, ll)), &s), NOTHING);
    // The underlay link itself.
    let s = Snapshot {
        underlay6_index: 2,
        ..s
    };
    let mut eth0 = link("eth0", None);
    eth0.header.index = 2;
    assert_eq!(wake(M::NewLink(eth0), &s), UNDERLAY);
    // A dual-stack node's IPv6 addresses still move nothing.
    let dual = snap(Some(expected()));
    assert_eq!(wake(M::NewAddress(address6(2, host6)), &dual), NOTHING);
    let default6 = route6(9, Ipv6Addr::UNSPECIFIED, 0, Some(ll), 2);
    assert_eq!(wake(M::NewRoute(default6), &dual), NOTHING);
}

#[test]
fn a_removed_pin_directory_ends_the_watch() {
    let event = |mask: u32, name: &[u8]| {
        let mut e = Vec::new();
        e.extend_from_slice(&1i32.to_ne_bytes());
        e.extend_from_slice(&mask.to_ne_bytes());
        e.extend_from_slice(&0u32.to_ne_bytes());
        e.extend_from_slice(&(name.len() as u32).to_ne_bytes());
        e.extend_from_slice(name);
        e
    };
    let pin = event(libc::IN_DELETE, b"mycni_local\0\0\0\0\0");
    assert!(!watch_ended(&pin));
    let mut dir = pin.clone();
    dir.extend(event(libc::IN_DELETE_SELF, b""));
    dir.extend(event(libc::IN_IGNORED, b""));
    assert!(watch_ended(&dir));
    assert!(!watch_ended(&dir[..20]));
}
