//! The agent's kernel adapter: the VXLAN device, and the routes, neighbours
//! and FDB entries it owns on it. Thin on purpose; what to change is decided
//! by `reconcile`.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use futures::{StreamExt, TryStreamExt, stream};
use netlink_packet_route::AddressFamily;
use netlink_packet_route::address::AddressAttribute;
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope,
};
use rtnetlink::{Handle, LinkUnspec, LinkVxlan, RouteMessageBuilder};
use thiserror::Error;

use crate::peers::{Cidr, Mac};
use crate::reconcile::{self, Action, OverlayState};

/// The agent's routes carry its own protocol so a restarted agent finds its
/// stale routes and nobody else's; the plugin's pod routes and host veths
/// are found by the plugin's marks. All of them are the contract's.
pub use mycni_common::contract::{RTPROT_MYCNI_AGENT, RTPROT_MYCNI_PLUGIN, VethAlias};

/// Whether a link with this alias is a pod's host veth, made by the plugin.
pub fn is_pod_veth(alias: &str) -> bool {
    VethAlias::is_mycni(alias)
}

/// Requests in flight at once when applying a diff: enough to hide the
/// per-request round trip, few enough not to overrun the socket buffer.
const CONCURRENCY: usize = 64;

#[derive(Debug, Error)]
pub enum KernelError {
    #[error("netlink socket: {0}")]
    Socket(std::io::Error),
    #[error("{what}: {source}")]
    Netlink {
        what: String,
        source: rtnetlink::Error,
    },
    #[error("{0}")]
    Other(String),
}

fn nl(what: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> KernelError {
    let what = what.into();
    move |source| KernelError::Netlink { what, source }
}

fn errno(e: &rtnetlink::Error) -> i32 {
    match e {
        rtnetlink::Error::NetlinkError(m) => -m.raw_code(),
        _ => 0,
    }
}

/// What the VXLAN device must look like.
#[derive(Debug, Clone)]
pub struct VxlanSpec {
    pub name: String,
    pub vni: u32,
    pub port: u16,
    pub underlay_index: u32,
    pub local_ip: Ipv4Addr,
    pub mtu: u32,
    pub mac: Mac,
    /// The node's own VTEP address (podCIDR.0) as a /32.
    pub address: Ipv4Addr,
}

/// The underlay interface: name, index, first IPv4 address, MTU.
#[derive(Debug, Clone)]
pub struct Underlay {
    pub name: String,
    pub index: u32,
    pub ip: Ipv4Addr,
    pub mtu: u32,
    /// The directly connected IPv4 subnets of the underlay: peers whose host
    /// IP lies in one share its L2 segment (candidates for direct routing).
    pub subnets: Vec<Cidr>,
}

#[derive(Debug, Clone)]
pub struct LinkFacts {
    pub index: u32,
    pub name: String,
    pub mac: Vec<u8>,
    pub mtu: u32,
    pub up: bool,
    pub vxlan: Option<Vec<InfoVxlan>>,
}

fn facts(m: LinkMessage) -> LinkFacts {
    let mut f = LinkFacts {
        index: m.header.index,
        name: String::new(),
        mac: vec![],
        mtu: 0,
        up: m.header.flags.contains(LinkFlags::Up),
        vxlan: None,
    };
    for a in m.attributes {
        match a {
            LinkAttribute::IfName(n) => f.name = n,
            LinkAttribute::Address(a) => f.mac = a,
            LinkAttribute::Mtu(x) => f.mtu = x,
            LinkAttribute::LinkInfo(infos) => {
                let mut is_vxlan = false;
                for i in infos {
                    match i {
                        LinkInfo::Kind(InfoKind::Vxlan) => is_vxlan = true,
                        LinkInfo::Data(InfoData::Vxlan(v)) => f.vxlan = Some(v),
                        _ => {}
                    }
                }
                if !is_vxlan {
                    f.vxlan = None;
                }
            }
            _ => {}
        }
    }
    f
}

/// A pod on this node, as the fast path needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodEndpoint {
    /// The host-side veth.
    pub ifindex: u32,
    pub host_mac: Mac,
    /// The pod's eth0.
    pub pod_mac: Mac,
}

pub struct Kernel {
    handle: Handle,
}

impl Kernel {
    /// A netlink handle in the calling thread's namespace; needs a tokio runtime.
    pub fn new() -> Result<Self, KernelError> {
        let (conn, handle, _) = rtnetlink::new_connection().map_err(KernelError::Socket)?;
        tokio::spawn(conn);
        Ok(Self { handle })
    }

    pub async fn link(&self, name: &str) -> Result<Option<LinkFacts>, KernelError> {
        let mut s = self
            .handle
            .link()
            .get()
            .match_name(name.to_string())
            .execute();
        match s.try_next().await {
            Ok(m) => Ok(m.map(facts)),
            Err(e) if errno(&e) == libc::ENODEV => Ok(None),
            Err(e) => Err(nl(format!("looking up {name}"))(e)),
        }
    }

    async fn link_by_index(&self, index: u32) -> Result<Option<LinkFacts>, KernelError> {
        let mut s = self.handle.link().get().match_index(index).execute();
        match s.try_next().await {
            Ok(m) => Ok(m.map(facts)),
            Err(e) if errno(&e) == libc::ENODEV => Ok(None),
            Err(e) => Err(nl(format!("looking up link {index}"))(e)),
        }
    }

    pub async fn ipv4_addrs(&self, index: u32) -> Result<Vec<(Ipv4Addr, u8)>, KernelError> {
        let mut out = vec![];
        let mut s = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute();
        while let Some(m) = s.try_next().await.map_err(nl("listing addresses"))? {
            for a in &m.attributes {
                if let AddressAttribute::Address(IpAddr::V4(ip)) = a {
                    out.push((*ip, m.header.prefix_len));
                }
            }
        }
        Ok(out)
    }

    /// The underlay: `name` if given, else the interface of the default route.
    pub async fn underlay(&self, name: Option<&str>) -> Result<Underlay, KernelError> {
        let link = match name {
            Some(n) => self.link(n).await?.ok_or_else(|| {
                KernelError::Other(format!("underlay interface {n} does not exist"))
            })?,
            None => {
                let mut oif = None;
                let req = RouteMessageBuilder::<Ipv4Addr>::new().build();
                let mut s = self.handle.route().get(req).execute();
                while let Some(m) = s.try_next().await.map_err(nl("listing routes"))? {
                    if m.header.destination_prefix_length == 0 {
                        oif = m.attributes.iter().find_map(|a| match a {
                            RouteAttribute::Oif(i) => Some(*i),
                            _ => None,
                        });
                        if oif.is_some() {
                            break;
                        }
                    }
                }
                let oif = oif.ok_or_else(|| {
                    KernelError::Other(
                        "no default route to pick the underlay interface from; pass --iface".into(),
                    )
                })?;
                self.link_by_index(oif).await?.ok_or_else(|| {
                    KernelError::Other(format!("default route's interface {oif} vanished"))
                })?
            }
        };
        let addrs: Vec<(Ipv4Addr, u8)> = self
            .ipv4_addrs(link.index)
            .await?
            .into_iter()
            .filter(|(ip, _)| !ip.is_loopback() && !ip.is_link_local())
            .collect();
        let ip = addrs.first().map(|(ip, _)| *ip).ok_or_else(|| {
            KernelError::Other(format!("underlay {} has no IPv4 address", link.name))
        })?;
        let subnets = addrs
            .iter()
            .filter(|(_, prefix)| *prefix < 32)
            // An IPv4 address's prefix is below 32 here: none is dropped.
            .filter_map(|&(addr, prefix)| Cidr::new(addr, prefix).map(Cidr::trunc))
            .collect();
        Ok(Underlay {
            name: link.name,
            index: link.index,
            ip,
            mtu: link.mtu,
            subnets,
        })
    }

    /// Creates the VXLAN device, or adopts an existing one and corrects what
    /// differs. Attributes the kernel cannot change in place (VNI, port,
    /// local IP, underlay, learning) mean delete and recreate, with the same
    /// MAC so peers' entries stay valid. Returns the index and whether it
    /// was (re)created.
    pub async fn ensure_vxlan(&self, spec: &VxlanSpec) -> Result<(u32, bool), KernelError> {
        let existing = self.link(&spec.name).await?;
        let mut created = false;
        let index = match existing {
            Some(l) if vxlan_matches(&l, spec) => l.index,
            other => {
                if let Some(l) = other {
                    tracing::warn!(device = %spec.name, "existing device differs from the wanted VXLAN setup; recreating it");
                    self.handle
                        .link()
                        .del(l.index)
                        .execute()
                        .await
                        .map_err(nl(format!("deleting {}", spec.name)))?;
                }
                let msg = LinkVxlan::new(&spec.name, spec.vni)
                    .dev(spec.underlay_index)
                    .local(spec.local_ip)
                    .port(spec.port)
                    .learning(false)
                    // No outer UDP checksum (the IPv4 default, made explicit):
                    // the tc encapsulation sends none either, and both paths
                    // must put the same bytes on the wire.
                    .udp_csum(false)
                    .mtu(spec.mtu)
                    .address(spec.mac.0.to_vec())
                    .build();
                self.handle
                    .link()
                    .add(msg)
                    .execute()
                    .await
                    .map_err(nl(format!("creating {}", spec.name)))?;
                created = true;
                self.link(&spec.name)
                    .await?
                    .ok_or_else(|| {
                        KernelError::Other(format!("{} vanished after creation", spec.name))
                    })?
                    .index
            }
        };
        let l = self
            .link_by_index(index)
            .await?
            .ok_or_else(|| KernelError::Other(format!("{} vanished", spec.name)))?;
        if l.mac != spec.mac.0 || l.mtu != spec.mtu || !l.up {
            self.handle
                .link()
                .set(
                    LinkUnspec::new_with_index(index)
                        .address(spec.mac.0.to_vec())
                        .mtu(spec.mtu)
                        .up()
                        .build(),
                )
                .execute()
                .await
                .map_err(nl(format!("setting {} up", spec.name)))?;
        }
        let addrs = self.ipv4_addrs(index).await?;
        if !addrs.contains(&(spec.address, 32)) {
            match self
                .handle
                .address()
                .add(index, IpAddr::V4(spec.address), 32)
                .execute()
                .await
            {
                Ok(()) => {}
                Err(e) if errno(&e) == libc::EEXIST => {}
                Err(e) => {
                    return Err(nl(format!("adding {}/32 to {}", spec.address, spec.name))(
                        e,
                    ));
                }
            }
        }
        Ok((index, created))
    }

    /// The entries on `vxlan` that the agent owns: routes with its protocol,
    /// permanent IPv4 neighbours, permanent `self` FDB entries (the
    /// all-zeros default entry excluded).
    ///
    /// `underlay` is the device direct routes (gateway: a peer's host IP)
    /// leave by; 0 when direct routing is off, so any such route is stale.
    pub async fn dump(&self, vxlan: u32, underlay: u32) -> Result<OverlayState, KernelError> {
        let mut s = OverlayState::default();
        let req = RouteMessageBuilder::<Ipv4Addr>::new().build();
        let mut routes = self.handle.route().get(req).execute();
        while let Some(m) = routes.try_next().await.map_err(nl("listing routes"))? {
            if m.header.protocol != RouteProtocol::Other(RTPROT_MYCNI_AGENT) {
                continue;
            }
            let (mut dst, mut gw, mut oif) = (None, None, None);
            for a in &m.attributes {
                match a {
                    RouteAttribute::Destination(RouteAddress::Inet(d)) => dst = Some(*d),
                    RouteAttribute::Gateway(RouteAddress::Inet(g)) => gw = Some(*g),
                    RouteAttribute::Oif(i) => oif = Some(*i),
                    _ => {}
                }
            }
            // An IPv4 route's prefix is at most 32, so `Cidr::new` drops none.
            if let (Some(d), Some(g)) = (dst, gw)
                && let Some(c) = Cidr::new(d, m.header.destination_prefix_length)
            {
                let dev = if reconcile::via_vxlan(c, g) {
                    vxlan
                } else {
                    underlay
                };
                if dev != 0 && oif == Some(dev) {
                    s.routes.insert(c, g);
                } else {
                    // Ours, but on a device that is gone or replaced: stale.
                    s.routes.insert(c, Ipv4Addr::UNSPECIFIED);
                }
            }
        }
        let mut neighs = self
            .handle
            .neighbours()
            .get()
            .set_address_family(AddressFamily::Inet)
            .execute();
        while let Some(m) = neighs.try_next().await.map_err(nl("listing neighbours"))? {
            if m.header.ifindex != vxlan || !is_permanent(m.header.state) {
                continue;
            }
            if let (Some(ip), Some(mac)) = neigh_ip_mac(&m) {
                s.neighbours.insert(ip, mac);
            }
        }
        let mut fdb = self
            .handle
            .neighbours()
            .get()
            .set_address_family(AddressFamily::Bridge)
            .execute();
        while let Some(m) = fdb.try_next().await.map_err(nl("listing FDB"))? {
            if m.header.ifindex != vxlan
                || !is_permanent(m.header.state)
                || !m.header.flags.contains(NeighbourFlags::Own)
            {
                continue;
            }
            if let (Some(ip), Some(mac)) = neigh_ip_mac(&m)
                && mac != Mac::ZERO
            {
                s.fdb.insert(mac, ip);
            }
        }
        Ok(s)
    }

    /// Applies a diff. Deletes run first, then sets in dependency order,
    /// each group with bounded concurrency. Returns the number of failed
    /// actions (each logged); a failure never stops the rest.
    pub async fn apply(&self, vxlan: u32, underlay: u32, actions: &[Action]) -> usize {
        let (dels, sets): (Vec<&Action>, Vec<&Action>) =
            actions.iter().partition(|a| a.is_delete());
        let mut failed = 0;
        for group in [dels, sets] {
            // Within a group, keep FDB -> neighbour -> route order by phases.
            let mut phases: [Vec<&Action>; 3] = [vec![], vec![], vec![]];
            for a in group {
                let phase = match a {
                    Action::SetFdb(..) | Action::DelRoute(_) => 0,
                    Action::SetNeighbour(..) | Action::DelNeighbour(_) => 1,
                    Action::SetRoute(..) | Action::DelFdb(_) => 2,
                };
                phases[phase].push(a);
            }
            for phase in phases {
                let results: Vec<Result<(), KernelError>> = stream::iter(phase)
                    .map(|a| self.apply_one(vxlan, underlay, a))
                    .buffer_unordered(CONCURRENCY)
                    .collect()
                    .await;
                for r in results {
                    if let Err(e) = r {
                        tracing::warn!(error = %e, "kernel update failed");
                        failed += 1;
                    }
                }
            }
        }
        failed
    }

    async fn apply_one(&self, vxlan: u32, underlay: u32, a: &Action) -> Result<(), KernelError> {
        let gone =
            |e: &rtnetlink::Error| matches!(errno(e), libc::ENOENT | libc::ESRCH | libc::ENODEV);
        match a {
            Action::SetRoute(c, gw) => {
                let msg = if reconcile::via_vxlan(*c, *gw) {
                    route_msg(*c, Some(*gw), vxlan)
                } else {
                    direct_route_msg(*c, *gw, underlay)
                };
                self.handle
                    .route()
                    .add(msg)
                    .replace()
                    .execute()
                    .await
                    .map_err(nl(format!("route {c} via {gw}")))
            }
            Action::DelRoute(c) => {
                // The dumped route may sit on a dead device: match by
                // destination and protocol only.
                let mut msg = route_msg(*c, None, 0);
                msg.attributes
                    .retain(|a| !matches!(a, RouteAttribute::Oif(_)));
                msg.header.scope = RouteScope::NoWhere;
                match self.handle.route().del(msg).execute().await {
                    Err(e) if !gone(&e) => Err(nl(format!("deleting route {c}"))(e)),
                    _ => Ok(()),
                }
            }
            Action::SetNeighbour(ip, mac) => self
                .handle
                .neighbours()
                .add(vxlan, IpAddr::V4(*ip))
                .link_layer_address(&mac.0)
                .state(NeighbourState::Permanent)
                .replace()
                .execute()
                .await
                .map_err(nl(format!("neighbour {ip}"))),
            Action::DelNeighbour(ip) => {
                let mut m = NeighbourMessage::default();
                m.header.family = AddressFamily::Inet;
                m.header.ifindex = vxlan;
                m.attributes
                    .push(NeighbourAttribute::Destination(NeighbourAddress::Inet(*ip)));
                match self.handle.neighbours().del(m).execute().await {
                    Err(e) if !gone(&e) => Err(nl(format!("deleting neighbour {ip}"))(e)),
                    _ => Ok(()),
                }
            }
            Action::SetFdb(mac, ip) => self
                .handle
                .neighbours()
                .add_bridge(vxlan, &mac.0)
                .destination(IpAddr::V4(*ip))
                .flags(NeighbourFlags::Own)
                .state(NeighbourState::Permanent)
                .replace()
                .execute()
                .await
                .map_err(nl(format!("fdb {mac}"))),
            Action::DelFdb(mac) => {
                let mut m = NeighbourMessage::default();
                m.header.family = AddressFamily::Bridge;
                m.header.ifindex = vxlan;
                m.header.flags = NeighbourFlags::Own;
                m.attributes
                    .push(NeighbourAttribute::LinkLayerAddress(mac.0.to_vec()));
                match self.handle.neighbours().del(m).execute().await {
                    Err(e) if !gone(&e) => Err(nl(format!("deleting fdb {mac}"))(e)),
                    _ => Ok(()),
                }
            }
        }
    }

    /// The pods on this node as the kernel holds them: every /32 host route
    /// the plugin installed, through a host veth the plugin marked, with the
    /// veth's MAC and the MAC of its peer (the pod's eth0), read through the
    /// peer's netns id. Entries the kernel cannot fully back are left out.
    pub async fn pod_endpoints(&self) -> Result<BTreeMap<Ipv4Addr, PodEndpoint>, KernelError> {
        struct Veth {
            mac: Mac,
            peer: Option<(u32, i32)>,
        }
        let mut veths: BTreeMap<u32, Veth> = BTreeMap::new();
        let mut links = self.handle.link().get().execute();
        while let Some(m) = links.try_next().await.map_err(nl("listing links"))? {
            let (mut alias, mut mac, mut peer_index, mut nsid) = (false, None, None, None);
            for a in &m.attributes {
                match a {
                    LinkAttribute::IfAlias(x) => alias = is_pod_veth(x),
                    LinkAttribute::Address(a) => {
                        if let Ok(x) = Mac::try_from(a.as_slice()) {
                            mac = Some(x);
                        }
                    }
                    LinkAttribute::Link(i) => peer_index = Some(*i),
                    LinkAttribute::LinkNetNsId(n) => nsid = Some(*n),
                    _ => {}
                }
            }
            if let (true, Some(mac)) = (alias, mac) {
                veths.insert(
                    m.header.index,
                    Veth {
                        mac,
                        peer: peer_index.zip(nsid),
                    },
                );
            }
        }
        let mut out = BTreeMap::new();
        let req = RouteMessageBuilder::<Ipv4Addr>::new().build();
        let mut routes = self.handle.route().get(req).execute();
        let mut pods = vec![];
        while let Some(m) = routes.try_next().await.map_err(nl("listing routes"))? {
            if m.header.protocol != RouteProtocol::Other(RTPROT_MYCNI_PLUGIN)
                || m.header.destination_prefix_length != 32
            {
                continue;
            }
            let (mut dst, mut oif) = (None, None);
            for a in &m.attributes {
                match a {
                    RouteAttribute::Destination(RouteAddress::Inet(d)) => dst = Some(*d),
                    RouteAttribute::Oif(i) => oif = Some(*i),
                    _ => {}
                }
            }
            if let (Some(ip), Some(oif)) = (dst, oif) {
                pods.push((ip, oif));
            }
        }
        for (ip, oif) in pods {
            let Some(v) = veths.get(&oif) else { continue };
            let Some((peer, nsid)) = v.peer else { continue };
            let mut req = self.handle.link().get().match_index(peer);
            req.message_mut()
                .attributes
                .push(LinkAttribute::IfNetnsId(nsid));
            let pod_mac = match req.execute().try_next().await {
                Ok(Some(m)) => m.attributes.iter().find_map(|a| match a {
                    LinkAttribute::Address(a) => Mac::try_from(a.as_slice()).ok(),
                    _ => None,
                }),
                // The pod's netns is going away: no endpoint.
                Ok(None) => None,
                Err(e) if errno(&e) == libc::ENODEV || errno(&e) == libc::EINVAL => None,
                Err(e) => return Err(nl(format!("looking up the peer of link {oif}"))(e)),
            };
            if let Some(pod_mac) = pod_mac {
                out.insert(
                    ip,
                    PodEndpoint {
                        ifindex: oif,
                        host_mac: v.mac,
                        pod_mac,
                    },
                );
            }
        }
        Ok(out)
    }

    pub async fn del_link(&self, index: u32) -> Result<(), KernelError> {
        match self.handle.link().del(index).execute().await {
            Err(e) if errno(&e) != libc::ENODEV => Err(nl("deleting link")(e)),
            _ => Ok(()),
        }
    }
}

/// A peer's podCIDR straight to its host IP on the underlay (direct routing).
fn direct_route_msg(c: Cidr, host: Ipv4Addr, underlay: u32) -> RouteMessage {
    RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(c.addr(), c.prefix())
        .protocol(RouteProtocol::Other(RTPROT_MYCNI_AGENT))
        .output_interface(underlay)
        .gateway(host)
        .build()
}

fn route_msg(c: Cidr, gw: Option<Ipv4Addr>, oif: u32) -> RouteMessage {
    let mut b = RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(c.addr(), c.prefix())
        .protocol(RouteProtocol::Other(RTPROT_MYCNI_AGENT));
    if oif != 0 {
        b = b.output_interface(oif);
    }
    if let Some(g) = gw {
        // The gateway (the peer's podCIDR.0) is on no subnet of ours.
        b = b.gateway(g).onlink();
    }
    b.build()
}

/// NUD_PERMANENT, alone or combined: a new vxlan FDB entry reports
/// PERMANENT|NOARP, which the enum only has as `Other(0xc0)`.
fn is_permanent(state: NeighbourState) -> bool {
    const NUD_PERMANENT: u16 = 0x80;
    match state {
        NeighbourState::Permanent => true,
        NeighbourState::Other(v) => v & NUD_PERMANENT != 0,
        _ => false,
    }
}

fn neigh_ip_mac(m: &NeighbourMessage) -> (Option<Ipv4Addr>, Option<Mac>) {
    let mut ip = None;
    let mut mac = None;
    for a in &m.attributes {
        match a {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(d)) => ip = Some(*d),
            // In AF_BRIDGE (FDB) messages the parser cannot tell the
            // destination's family and leaves the raw bytes.
            NeighbourAttribute::Destination(NeighbourAddress::Other(b)) if b.len() == 4 => {
                ip = Some(Ipv4Addr::new(b[0], b[1], b[2], b[3]));
            }
            NeighbourAttribute::LinkLayerAddress(l) => {
                if let Ok(x) = Mac::try_from(l.as_slice()) {
                    mac = Some(x);
                }
            }
            _ => {}
        }
    }
    (ip, mac)
}

fn vxlan_matches(l: &LinkFacts, spec: &VxlanSpec) -> bool {
    let Some(info) = &l.vxlan else {
        return false;
    };
    let mut id = None;
    let mut local = None;
    let mut port = None;
    let mut learning = None;
    let mut link = None;
    let mut udp_csum = None;
    for i in info {
        match i {
            InfoVxlan::Id(x) => id = Some(*x),
            InfoVxlan::Local(x) => local = Some(*x),
            InfoVxlan::Port(x) => port = Some(*x),
            InfoVxlan::Learning(x) => learning = Some(*x),
            InfoVxlan::Link(x) => link = Some(*x),
            InfoVxlan::UDPCsum(x) => udp_csum = Some(*x),
            _ => {}
        }
    }
    id == Some(spec.vni)
        && local == Some(spec.local_ip)
        && port == Some(spec.port)
        && learning == Some(false)
        && link == Some(spec.underlay_index)
        && udp_csum != Some(true)
}
