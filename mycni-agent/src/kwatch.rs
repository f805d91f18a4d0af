//! Kernel notifications, so the agent acts within milliseconds instead of
//! at the next full pass: pods that came or went (the fast path learns
//! them), the agent's own overlay state changed under it (drift, repaired
//! at once), and the underlay changed (a new host IP to move `vxlan.1` to
//! and publish).
//!
//! Pods: the plugin's ADD ends with the pod's /32 host route (protocol
//! 109), and a pod's host veth carries the plugin's alias; DEL removes the
//! veth, and the kernel flushes its routes without a notification, so both
//! routes and links are watched.
//!
//! Drift: a notification is compared with what the loop last asked of the
//! kernel ([`Expected`], set at the start of every pass). One that agrees is
//! the agent's own write (or harmless) and wakes nothing, so the agent's
//! writes never feed back into passes; one that disagrees (a route of a
//! peer deleted or replaced with another gateway, a neighbour or FDB entry
//! deleted or given another MAC or host, `vxlan.1` deleted, renamed,
//! brought down or given another MAC, MTU or address) wakes a full pass.
//! Deleting a nexthop removes its routes without a route notification,
//! so nexthops are watched too. A notification about state the loop no
//! longer wants (its own deletions) wakes nothing. A race (a notification
//! of the previous pass's write read after the next pass changed its mind)
//! costs at most one pass that finds nothing to do and writes nothing.
//!
//! IPv6: the agent's IPv6 routes, neighbours and `vxlan.1`'s IPv6 VTEP
//! address are watched as their IPv4 twins are. Other IPv6 addresses and
//! routes wake nothing: the underlay is IPv4, and every pod veth brings a
//! link-local address and an `fe80::/64` route that must not cost a pass.
//! On an IPv6-only node (no `vxlan.1`) the underlay is IPv6: an IPv6
//! address or main-table route that is not link-local and not the
//! agent's wakes the underlay re-read as IPv4 ones do elsewhere, and
//! `vxlan6.1`'s IPv6 VTEP address removed wakes a full pass.
//!
//! Underlay: an IPv4 address added or removed anywhere but `vxlan.1`, a
//! route of the main table that is neither the agent's nor the plugin's
//! (the default route, the route `can-reach` follows), or a change to the
//! underlay link (or one `--iface` names or matches) may change which
//! interface and address the underlay is. That wakes a re-read of the
//! underlay only, which costs three small dumps and writes nothing unless
//! it moved.
//!
//! A burst of events (each veth change notifies; 100 pods starting at
//! once; a flush of 5,000 routes) wakes the loop once per debounce window,
//! and a pass still running when more come is followed by exactly one more
//! (a `Notify` holds at most one permit).

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
use rtnetlink::sys::{AsyncSocket, AsyncSocketExt, TokioSocket, protocols::NETLINK_ROUTE};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use mycni_common::netlink::{NexthopMessage, RTNLGRP_NEXTHOP};

use crate::kernel::{
    RTPROT_MYCNI_AGENT, RTPROT_MYCNI_PLUGIN, UnderlaySelect, VxlanSpec, glob_match, is_pod_veth,
};
use crate::peers::{Cidr, Cidr6, Mac};
use crate::reconcile::{OverlayState, via_vxlan};

/// How long events are collected after the first before waking the loop:
/// long enough to fold one plugin ADD's few notifications and a burst of
/// parallel ADDs into one pass, short next to the pass itself.
pub const DEBOUNCE: Duration = Duration::from_millis(5);

/// Above the 208 KB default: the kernel drops notifications (and says so
/// with ENOBUFS) when the socket buffer fills, e.g. while a flush of
/// thousands of routes notifies. A loss wakes every kind of pass, which
/// re-reads everything, so nothing is missed, but it costs a full pass.
const RCVBUF: usize = 4 << 20;

// rtnetlink multicast groups (linux/rtnetlink.h).
const RTNLGRP_LINK: u32 = 1;
const RTNLGRP_NEIGH: u32 = 3;
const RTNLGRP_IPV4_IFADDR: u32 = 5;
const RTNLGRP_IPV4_ROUTE: u32 = 7;
const RTNLGRP_IPV6_IFADDR: u32 = 9;
const RTNLGRP_IPV6_ROUTE: u32 = 11;
// Nexthop notifications, which netlink-packet-route cannot parse: the
// shared netlink layer's `NexthopMessage` does.
const RTM_NEWNEXTHOP: u16 = 104;
const RTM_DELNEXTHOP: u16 = 105;
/// The main routing table, where the agent's and the default route live.
const RT_TABLE_MAIN: u32 = 254;

/// What a notification may concern.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Wake {
    /// What `Kernel::pod_endpoints` returns.
    pub pods: bool,
    /// The agent's routes, nexthops, neighbours, FDB entries or VXLAN device.
    pub overlay: bool,
    /// Which interface and address the underlay is.
    pub underlay: bool,
}

impl Wake {
    const ALL: Wake = Wake {
        pods: true,
        overlay: true,
        underlay: true,
    };
    const PODS: Wake = Wake {
        pods: true,
        overlay: false,
        underlay: false,
    };

    fn overlay(b: bool) -> Wake {
        Wake {
            overlay: b,
            ..Wake::default()
        }
    }

    fn underlay(b: bool) -> Wake {
        Wake {
            underlay: b,
            ..Wake::default()
        }
    }

    fn any(self) -> bool {
        self.pods || self.overlay || self.underlay
    }

    fn or(self, o: Wake) -> Wake {
        Wake {
            pods: self.pods || o.pods,
            overlay: self.overlay || o.overlay,
            underlay: self.underlay || o.underlay,
        }
    }
}

/// What the loop last asked of the kernel: the device and the entries.
#[derive(Debug, Clone)]
pub struct Expected {
    pub vxlan: VxlanSpec,
    pub overlay: OverlayState,
    /// The gateways of `overlay`'s routes (both families): the agent's
    /// nexthops point at these and nothing else.
    gateways: BTreeSet<IpAddr>,
}

impl Expected {
    pub fn new(vxlan: VxlanSpec, overlay: OverlayState) -> Self {
        let gateways = overlay
            .routes
            .values()
            .map(|g| IpAddr::V4(*g))
            .chain(overlay.routes6.values().map(|g| IpAddr::V6(*g)))
            .collect();
        Expected {
            vxlan,
            overlay,
            gateways,
        }
    }
}

/// What the watcher compares notifications with, shared with the loop.
#[derive(Debug)]
pub struct Watched {
    vxlan_name: String,
    underlay: UnderlaySelect,
    /// `vxlan.1`'s ifindex as of the last pass (0 before the first).
    vxlan_index: AtomicU32,
    /// `vxlan6.1`'s, on a node with an IPv6 underlay (0: none).
    vxlan6_index: AtomicU32,
    /// Whether the underlay is IPv6 (an IPv6-only node).
    ipv6_underlay: AtomicBool,
    /// The IPv6 underlay's ifindex on an IPv6-only node, which has no
    /// `Expected` to read it from (0: none).
    underlay6_index: AtomicU32,
    /// None before the first pass: then only deletions of the agent's
    /// kind of state wake a pass (the first pass runs anyway).
    expected: Mutex<Option<Arc<Expected>>>,
}

impl Watched {
    pub fn new(vxlan_name: String, underlay: UnderlaySelect) -> Arc<Self> {
        Arc::new(Watched {
            vxlan_name,
            underlay,
            vxlan_index: AtomicU32::new(0),
            vxlan6_index: AtomicU32::new(0),
            ipv6_underlay: AtomicBool::new(false),
            underlay6_index: AtomicU32::new(0),
            expected: Mutex::new(None),
        })
    }

    /// Set before a pass writes, so the notifications of its own writes
    /// agree with it.
    pub fn expect(&self, e: Expected) {
        if let Ok(mut x) = self.expected.lock() {
            *x = Some(Arc::new(e));
        }
    }

    pub fn set_vxlan_index(&self, index: u32) {
        self.vxlan_index.store(index, Ordering::Relaxed);
    }

    pub fn set_vxlan6_index(&self, index: u32) {
        self.vxlan6_index.store(index, Ordering::Relaxed);
    }

    /// The underlay is IPv6 (an IPv6-only node): IPv6 addresses and routes
    /// may move it.
    pub fn set_ipv6_underlay(&self, on: bool) {
        self.ipv6_underlay.store(on, Ordering::Relaxed);
    }

    /// The IPv6 underlay's ifindex, on an IPv6-only node: its link
    /// changing may move the underlay.
    pub fn set_underlay6_index(&self, index: u32) {
        self.underlay6_index.store(index, Ordering::Relaxed);
    }

    fn snapshot(&self) -> Snapshot<'_> {
        Snapshot {
            vxlan_name: &self.vxlan_name,
            underlay: &self.underlay,
            vxlan_index: self.vxlan_index.load(Ordering::Relaxed),
            vxlan6_index: self.vxlan6_index.load(Ordering::Relaxed),
            ipv6_underlay: self.ipv6_underlay.load(Ordering::Relaxed),
            underlay6_index: self.underlay6_index.load(Ordering::Relaxed),
            expected: self.expected.lock().ok().and_then(|x| x.clone()),
        }
    }
}

/// [`Watched`] as of one batch of notifications.
#[derive(Debug, Clone)]
pub struct Snapshot<'a> {
    pub vxlan_name: &'a str,
    pub underlay: &'a UnderlaySelect,
    pub vxlan_index: u32,
    /// `vxlan6.1`'s ifindex (0: none). Its state is not in `expected`:
    /// a deletion of the agent's route, neighbour or FDB entry on it, or
    /// the device itself deleted or down, wakes a full pass (the agent's
    /// own deletions too: rare, and a full pass then changes nothing);
    /// other changes wait for the resync.
    pub vxlan6_index: u32,
    /// The underlay is IPv6 (an IPv6-only node, no `vxlan.1`).
    pub ipv6_underlay: bool,
    /// Its ifindex there (0: none, or not an IPv6-only node).
    pub underlay6_index: u32,
    pub expected: Option<Arc<Expected>>,
}

impl Snapshot<'_> {
    fn is_vxlan(&self, index: u32, name: Option<&str>) -> bool {
        (self.vxlan_index != 0 && index == self.vxlan_index) || name == Some(self.vxlan_name)
    }

    fn underlay_index(&self) -> u32 {
        self.expected
            .as_ref()
            .map_or(self.underlay6_index, |e| e.vxlan.underlay_index)
    }
}

/// The loop's wake-up signals, one per kind of pass.
#[derive(Debug, Clone, Default)]
pub struct Signals {
    pub pods: Arc<Notify>,
    pub overlay: Arc<Notify>,
    pub underlay: Arc<Notify>,
}

impl Signals {
    fn raise(&self, w: Wake) {
        if w.pods {
            self.pods.notify_one();
        }
        if w.overlay {
            self.overlay.notify_one();
        }
        if w.underlay {
            self.underlay.notify_one();
        }
    }
}

/// Which passes a notification calls for.
pub fn classify(msg: &NetlinkMessage<RouteNetlinkMessage>, s: &Snapshot) -> Wake {
    match &msg.payload {
        NetlinkPayload::InnerMessage(m) => classify_inner(m, s),
        // Notifications were lost: any of them may have mattered.
        NetlinkPayload::Overrun(_) => Wake::ALL,
        _ => Wake::default(),
    }
}

fn classify_inner(m: &RouteNetlinkMessage, s: &Snapshot) -> Wake {
    use RouteNetlinkMessage as M;
    match m {
        M::NewRoute(r) | M::DelRoute(r) => route(r, matches!(m, M::DelRoute(_)), s),
        M::NewLink(l) | M::DelLink(l) => link(l, matches!(m, M::DelLink(_)), s),
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

fn route(r: &RouteMessage, deleted: bool, s: &Snapshot) -> Wake {
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
        IpAddr::V4(d) => Cidr::new(d, prefix).and_then(|k| {
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
struct LinkView<'a> {
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

fn link_view(l: &LinkMessage) -> LinkView<'_> {
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

fn link(l: &LinkMessage, deleted: bool, s: &Snapshot) -> Wake {
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

fn neighbour(n: &NeighbourMessage, deleted: bool, s: &Snapshot) -> bool {
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
pub fn classify_nexthop(m: &NexthopMessage, s: &Snapshot) -> Wake {
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
fn classify_datagram(buf: &[u8], s: &Snapshot) -> Wake {
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

/// Subscribes to link, IPv4 and IPv6 address and route, neighbour (incl. FDB) and
/// nexthop notifications in the calling thread's network namespace and
/// raises `signals` (debounced) whenever one may concern them. Needs a
/// tokio runtime. The task ends (and says so) only if the socket fails;
/// the loop then subscribes again.
pub fn spawn(signals: Signals, watched: Arc<Watched>) -> std::io::Result<JoinHandle<()>> {
    let mut sock = TokioSocket::new(NETLINK_ROUTE)?;
    let s = sock.socket_mut();
    s.bind_auto()?;
    for g in [
        RTNLGRP_LINK,
        RTNLGRP_NEIGH,
        RTNLGRP_IPV4_IFADDR,
        RTNLGRP_IPV4_ROUTE,
    ] {
        s.add_membership(g)?;
    }
    for g in [RTNLGRP_IPV6_IFADDR, RTNLGRP_IPV6_ROUTE] {
        if let Err(e) = s.add_membership(g) {
            // A kernel without IPv6 has no IPv6 state to drift.
            tracing::debug!(error = %e, group = g, "no IPv6 notifications");
        }
    }
    if let Err(e) = s.add_membership(RTNLGRP_NEXTHOP) {
        // Kernels before 5.3 have no nexthop objects, so no routes use them.
        tracing::debug!(error = %e, "no nexthop notifications");
    }
    if let Err(e) = s.set_rx_buf_sz(RCVBUF) {
        tracing::debug!(error = %e, "cannot enlarge the netlink notification buffer");
    }
    Ok(tokio::spawn(async move {
        loop {
            let mut wake = match recv(&sock, &watched).await {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(error = %e, "kernel notifications failed");
                    return;
                }
            };
            if !wake.any() {
                continue;
            }
            let until = tokio::time::Instant::now() + DEBOUNCE;
            while let Ok(r) = tokio::time::timeout_at(until, recv(&sock, &watched)).await {
                match r {
                    Ok(w) => wake = wake.or(w),
                    Err(e) => {
                        signals.raise(wake);
                        tracing::warn!(error = %e, "kernel notifications failed");
                        return;
                    }
                }
            }
            signals.raise(wake);
        }
    }))
}

/// One datagram, classified; an overrun (ENOBUFS) is every kind of wake.
async fn recv(sock: &TokioSocket, watched: &Watched) -> std::io::Result<Wake> {
    match sock.recv_from_full().await {
        Ok((buf, _)) => Ok(classify_datagram(&buf, &watched.snapshot())),
        Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
            tracing::debug!("kernel notifications overran the socket buffer");
            Ok(Wake::ALL)
        }
        Err(e) => Err(e),
    }
}

/// Watches the pin directory of the fast path's maps: a pin removed (by
/// hand, or a bpffs cleanup) wakes a full pass, whose sync pins the maps
/// again. The programs keep their maps meanwhile, so forwarding does not
/// notice; a restarted agent or `inspect` would, finding no pins. The
/// agent itself removes map pins only at start-up, before this runs, so
/// its own changes wake nothing. The directory itself removed, the watch
/// is armed again once the pass has made it anew.
pub fn spawn_pins(
    pin_dir: &std::path::Path,
    overlay: Arc<Notify>,
) -> std::io::Result<JoinHandle<()>> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    use tokio::io::unix::AsyncFd;

    let path = std::ffi::CString::new(pin_dir.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: inotify_init1 takes flags only and returns a new descriptor
    // or -1.
    let raw = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor we just opened and own alone.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let arm = move |fd: &OwnedFd| {
        // SAFETY: a valid descriptor and a NUL-terminated path.
        let wd = unsafe {
            libc::inotify_add_watch(
                fd.as_raw_fd(),
                path.as_ptr(),
                libc::IN_DELETE | libc::IN_MOVED_FROM | libc::IN_DELETE_SELF,
            )
        };
        if wd < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    arm(&fd)?;
    // SAFETY: an OwnedFd returns the descriptor it owns, open until the
    // AsyncFd (which owns it) drops it.
    let fd = unsafe { AsyncFd::register(fd) }.map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        loop {
            let n = match fd.readable().await {
                Ok(mut guard) => match guard.try_io(|f| {
                    // SAFETY: reads into a buffer of the length given.
                    let n =
                        unsafe { libc::read(f.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                    if n < 0 {
                        Err(std::io::Error::last_os_error())
                    } else {
                        Ok(n.unsigned_abs())
                    }
                }) {
                    Ok(Ok(n)) => n,
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "watching the map pins failed");
                        return;
                    }
                    Err(_would_block) => continue,
                },
                Err(e) => {
                    tracing::warn!(error = %e, "watching the map pins failed");
                    return;
                }
            };
            if n == 0 {
                continue;
            }
            // Every event here is a removal from the pin directory (or of
            // it): each calls for the same pass.
            tracing::debug!("a map pin was removed");
            overlay.notify_one();
            if watch_ended(&buf[..n]) {
                // The pass that was just woken makes the directory again.
                while arm(fd.get_ref()).is_err() {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }))
}

/// Whether a read of `struct inotify_event`s says the watch is gone
/// (IN_IGNORED: its directory was removed).
fn watch_ended(events: &[u8]) -> bool {
    const HEADER: usize = 16; // wd, mask, cookie, len
    let mut rest = events;
    while let Some(h) = rest.get(..HEADER) {
        let mask = u32::from_ne_bytes([h[4], h[5], h[6], h[7]]);
        if mask & libc::IN_IGNORED != 0 {
            return true;
        }
        let len = u32::from_ne_bytes([h[12], h[13], h[14], h[15]]) as usize;
        rest = rest.get(HEADER + len..).unwrap_or_default();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
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

    fn peer_cidr() -> Cidr {
        Cidr::new(PEER, 24).expect("cidr")
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

    fn neigh(
        family: AddressFamily,
        state: NeighbourState,
        ip: Ipv4Addr,
        mac: Mac,
    ) -> NeighbourMessage {
        let mut n = NeighbourMessage::default();
        n.header.family = family;
        n.header.state = state;
        n.header.ifindex = 7;
        n.attributes
            .push(NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)));
        n.attributes
            .push(NeighbourAttribute::LinkLayerAddress(mac.0.to_vec()));
        n
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

    fn route6(
        proto: u8,
        dst: Ipv6Addr,
        prefix: u8,
        gw: Option<Ipv6Addr>,
        oif: u32,
    ) -> RouteMessage {
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
}
