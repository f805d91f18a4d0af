//! IPv4 and IPv6 routes of the main table (listed from every table).
//!
//! One [`Route`] type generic over the family, IPv4 by default, rather than
//! an IPv6 twin of every type and function: the parsing, building and
//! deletion rules are the same for both families, so one copy keeps them
//! from drifting apart, and IPv4 callers name `Route` as before.

use std::format;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::prelude::rust_2024::*;

use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteMessage, RouteProtocol, RouteScope,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::RouteMessageBuilder;
use rtnetlink::packet_core::{NLM_F_CREATE, NLM_F_REPLACE};

use super::{Error, Netlink, Result, gone_is_ok};
use crate::net::{Cidr, Family};

/// The address family of a [`Route`]: `Ipv4Addr` or `Ipv6Addr`.
pub trait RouteFamily: Family + Into<IpAddr> {
    /// The all-zeros address, a default route's destination.
    const UNSPECIFIED: Self;
    #[doc(hidden)]
    fn address_family() -> AddressFamily;
    #[doc(hidden)]
    fn from_route_address(a: &RouteAddress) -> Option<Self>;
    /// A builder with the destination, and the gateway if any, set (the
    /// builders' setters differ per family).
    #[doc(hidden)]
    fn builder(dst: Cidr<Self>, gateway: Option<Self>) -> RouteMessageBuilder<Self>;
}

impl RouteFamily for Ipv4Addr {
    const UNSPECIFIED: Self = Ipv4Addr::UNSPECIFIED;
    fn address_family() -> AddressFamily {
        AddressFamily::Inet
    }
    fn from_route_address(a: &RouteAddress) -> Option<Self> {
        match a {
            RouteAddress::Inet(a) => Some(*a),
            _ => None,
        }
    }
    fn builder(dst: Cidr<Self>, gateway: Option<Self>) -> RouteMessageBuilder<Self> {
        let b = RouteMessageBuilder::<Ipv4Addr>::new().destination_prefix(dst.addr(), dst.prefix());
        match gateway {
            Some(g) => b.gateway(g),
            None => b,
        }
    }
}

impl RouteFamily for Ipv6Addr {
    const UNSPECIFIED: Self = Ipv6Addr::UNSPECIFIED;
    fn address_family() -> AddressFamily {
        AddressFamily::Inet6
    }
    fn from_route_address(a: &RouteAddress) -> Option<Self> {
        match a {
            RouteAddress::Inet6(a) => Some(*a),
            _ => None,
        }
    }
    fn builder(dst: Cidr<Self>, gateway: Option<Self>) -> RouteMessageBuilder<Self> {
        let b = RouteMessageBuilder::<Ipv6Addr>::new().destination_prefix(dst.addr(), dst.prefix());
        match gateway {
            Some(g) => b.gateway(g),
            None => b,
        }
    }
}

/// A route, as listed and as added; IPv4 unless said otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route<A: RouteFamily = Ipv4Addr> {
    /// The destination (0.0.0.0/0 or ::/0 for a default route).
    pub dst: Cidr<A>,
    pub gateway: Option<A>,
    /// The output device; a listed route without one (multipath,
    /// unreachable) has none.
    pub oif: Option<u32>,
    /// `rtm_protocol`: who installed it (mycni's own are in `contract`).
    pub protocol: u8,
    /// RTNH_F_ONLINK: the gateway is taken as on the link even though no
    /// subnet of the device covers it.
    pub onlink: bool,
}

fn route_from<A: RouteFamily>(m: &RouteMessage) -> Option<Route<A>> {
    if m.header.address_family != A::address_family() {
        return None;
    }
    let mut dst = A::UNSPECIFIED;
    let mut gateway = None;
    let mut oif = None;
    for a in &m.attributes {
        match a {
            RouteAttribute::Destination(d) => dst = A::from_route_address(d)?,
            RouteAttribute::Gateway(g) => gateway = Some(A::from_route_address(g)?),
            RouteAttribute::Oif(i) => oif = Some(*i),
            _ => {}
        }
    }
    Some(Route {
        // The kernel's prefix is within the family's bound: none is
        // dropped here.
        dst: Cidr::new(dst, m.header.destination_prefix_length)?,
        gateway,
        oif,
        protocol: m.header.protocol.into(),
        onlink: m.header.flags.contains(RouteFlags::Onlink),
    })
}

/// A route to add or replace: `dst [via gateway [onlink]] dev oif proto
/// protocol`, scope link when there is no gateway.
pub(super) fn route_message<A: RouteFamily>(r: &Route<A>) -> RouteMessage {
    let mut b = A::builder(r.dst, r.gateway).protocol(RouteProtocol::from(r.protocol));
    if let Some(i) = r.oif {
        b = b.output_interface(i);
    }
    b = match r.gateway {
        Some(_) if r.onlink => b.onlink(),
        Some(_) => b,
        None => b.scope(RouteScope::Link),
    };
    b.build()
}

impl Netlink {
    async fn routes<A: RouteFamily>(&self, op: &str, protocol: u8) -> Result<Vec<Route<A>>> {
        let mut req = RouteMessage::default();
        req.header.address_family = A::address_family();
        req.header.protocol = RouteProtocol::from(protocol);
        let msgs = self.dump(op, RouteNetlinkMessage::GetRoute(req)).await?;
        Ok(msgs
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewRoute(r) => route_from(r),
                _ => None,
            })
            .filter(|r| protocol == 0 || r.protocol == protocol)
            .collect())
    }

    /// Every IPv4 route, of every table.
    pub async fn ipv4_routes(&self) -> Result<Vec<Route>> {
        self.routes("listing routes", 0).await
    }

    /// The IPv4 routes (of every table) installed with `protocol`.
    pub async fn routes_by_protocol(&self, protocol: u8) -> Result<Vec<Route>> {
        self.routes(&format!("listing routes of protocol {protocol}"), protocol)
            .await
    }

    /// Every IPv6 route, of every table.
    pub async fn ipv6_routes(&self) -> Result<Vec<Route<Ipv6Addr>>> {
        self.routes("listing IPv6 routes", 0).await
    }

    /// The IPv6 routes (of every table) installed with `protocol`.
    pub async fn ipv6_routes_by_protocol(&self, protocol: u8) -> Result<Vec<Route<Ipv6Addr>>> {
        self.routes(
            &format!("listing IPv6 routes of protocol {protocol}"),
            protocol,
        )
        .await
    }

    /// Adds a route to the main table; one already there is an error that
    /// [`Error::is_exists`].
    pub async fn add_route<A: RouteFamily>(&self, route: Route<A>) -> Result<()> {
        self.handle
            .route()
            .add(route_message(&route))
            .execute()
            .await
            .map_err(|e| Error::rtnl(format!("adding route {}", route.dst), e))
    }

    /// Adds a route to the main table, or replaces the one to the same
    /// destination.
    pub async fn replace_route<A: RouteFamily>(&self, route: Route<A>) -> Result<()> {
        self.change(
            &format!("replacing route {}", route.dst),
            RouteNetlinkMessage::NewRoute(route_message(&route)),
            NLM_F_CREATE | NLM_F_REPLACE,
        )
        .await
    }

    /// Deletes the main table's route to `dst` installed with `protocol`,
    /// whatever its device (which may be gone); one already gone is
    /// success.
    pub async fn delete_route<A: RouteFamily>(&self, dst: Cidr<A>, protocol: u8) -> Result<()> {
        gone_is_ok(
            self.change(
                &format!("deleting route {dst}"),
                RouteNetlinkMessage::DelRoute(delete_route_message(dst, protocol)),
                0,
            )
            .await,
        )
    }
}

/// The request that deletes the main table's route to `dst` installed
/// with `protocol`, whatever its device and scope.
pub(super) fn delete_route_message<A: RouteFamily>(dst: Cidr<A>, protocol: u8) -> RouteMessage {
    let mut msg = A::builder(dst, None)
        .protocol(RouteProtocol::from(protocol))
        .build();
    // RT_SCOPE_NOWHERE matches a route of any scope.
    msg.header.scope = RouteScope::NoWhere;
    msg
}

/// A route through a nexthop object: `dst nhid N proto P`. Its gateway and
/// device are the nexthop's ([`Netlink::replace_nexthop`]), so changing
/// them is one nexthop replaced, for every route through it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NexthopRoute<A: RouteFamily = Ipv4Addr> {
    pub dst: Cidr<A>,
    pub nhid: u32,
    pub protocol: u8,
}

fn nhid_of(m: &RouteMessage) -> Option<u32> {
    m.attributes.iter().find_map(|a| match a {
        RouteAttribute::NhId(id) => Some(*id),
        _ => None,
    })
}

impl Netlink {
    /// The IPv4 routes (of every table) installed with `protocol`, each
    /// with the ID of the nexthop object it goes through (None: the route
    /// holds its gateway itself). A listed route through a nexthop also
    /// shows the nexthop's gateway, device and onlink flag only while
    /// `net.ipv4.nexthop_compat_mode` is on (the default).
    pub async fn routes_with_nexthops_by_protocol(
        &self,
        protocol: u8,
    ) -> Result<Vec<(Route, Option<u32>)>> {
        self.routes_with_nexthops(protocol).await
    }

    /// [`Netlink::routes_with_nexthops_by_protocol`] for IPv6 routes.
    pub async fn ipv6_routes_with_nexthops_by_protocol(
        &self,
        protocol: u8,
    ) -> Result<Vec<(Route<Ipv6Addr>, Option<u32>)>> {
        self.routes_with_nexthops(protocol).await
    }

    async fn routes_with_nexthops<A: RouteFamily>(
        &self,
        protocol: u8,
    ) -> Result<Vec<(Route<A>, Option<u32>)>> {
        let mut req = RouteMessage::default();
        req.header.address_family = A::address_family();
        req.header.protocol = RouteProtocol::from(protocol);
        let op = format!("listing routes of protocol {protocol}");
        let msgs = self.dump(&op, RouteNetlinkMessage::GetRoute(req)).await?;
        Ok(msgs
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewRoute(r) => Some((route_from::<A>(r)?, nhid_of(r))),
                _ => None,
            })
            .filter(|(r, _)| r.protocol == protocol)
            .collect())
    }

    /// Adds a route through nexthop `nhid` to the main table, or replaces
    /// the one to the same destination, whether that one held its gateway
    /// itself or went through another nexthop.
    pub async fn replace_nexthop_route<A: RouteFamily>(&self, r: NexthopRoute<A>) -> Result<()> {
        self.change(
            &format!("replacing route {} nhid {}", r.dst, r.nhid),
            RouteNetlinkMessage::NewRoute(nexthop_route_message(&r)),
            NLM_F_CREATE | NLM_F_REPLACE,
        )
        .await
    }
}

/// The request that adds (or replaces) the route through a nexthop `r`.
pub(super) fn nexthop_route_message<A: RouteFamily>(r: &NexthopRoute<A>) -> RouteMessage {
    // Gateway, device and scope are the nexthop's: the kernel refuses a
    // route that names both.
    let mut msg = A::builder(r.dst, None)
        .protocol(RouteProtocol::from(r.protocol))
        .build();
    msg.attributes.push(RouteAttribute::NhId(r.nhid));
    msg
}
