//! IPv4 routes of the main table (listed from every table).

use std::format;
use std::net::Ipv4Addr;
use std::prelude::rust_2024::*;

use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteMessage, RouteProtocol, RouteScope,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::RouteMessageBuilder;

use super::{Error, Netlink, Result, gone_is_ok};
use crate::net::Cidr;

/// An IPv4 route, as listed and as added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// The destination (0.0.0.0/0 for a default route).
    pub dst: Cidr<Ipv4Addr>,
    pub gateway: Option<Ipv4Addr>,
    /// The output device; a listed route without one (multipath,
    /// unreachable) has none.
    pub oif: Option<u32>,
    /// `rtm_protocol`: who installed it (mycni's own are in `contract`).
    pub protocol: u8,
    /// RTNH_F_ONLINK: the gateway is taken as on the link even though no
    /// subnet of the device covers it.
    pub onlink: bool,
}

fn route_from(m: &RouteMessage) -> Option<Route> {
    let mut dst = Ipv4Addr::UNSPECIFIED;
    let mut gateway = None;
    let mut oif = None;
    for a in &m.attributes {
        match a {
            RouteAttribute::Destination(RouteAddress::Inet(d)) => dst = *d,
            RouteAttribute::Gateway(RouteAddress::Inet(g)) => gateway = Some(*g),
            RouteAttribute::Oif(i) => oif = Some(*i),
            _ => {}
        }
    }
    Some(Route {
        // An IPv4 route's prefix is at most 32: none is dropped here.
        dst: Cidr::new(dst, m.header.destination_prefix_length)?,
        gateway,
        oif,
        protocol: m.header.protocol.into(),
        onlink: m.header.flags.contains(RouteFlags::Onlink),
    })
}

/// A route to add or replace: `dst [via gateway [onlink]] dev oif proto
/// protocol`, scope link when there is no gateway.
fn route_message(r: &Route) -> RouteMessage {
    let mut b = RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(r.dst.addr(), r.dst.prefix())
        .protocol(RouteProtocol::from(r.protocol));
    if let Some(i) = r.oif {
        b = b.output_interface(i);
    }
    b = match r.gateway {
        Some(g) if r.onlink => b.gateway(g).onlink(),
        Some(g) => b.gateway(g),
        None => b.scope(RouteScope::Link),
    };
    b.build()
}

impl Netlink {
    async fn routes(&self, op: &str, protocol: u8) -> Result<Vec<Route>> {
        let mut req = RouteMessage::default();
        req.header.address_family = AddressFamily::Inet;
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

    /// Adds a route to the main table; one already there is an error that
    /// [`Error::is_exists`].
    pub async fn add_route(&self, route: Route) -> Result<()> {
        self.handle
            .route()
            .add(route_message(&route))
            .execute()
            .await
            .map_err(|e| Error::rtnl(format!("adding route {}", route.dst), e))
    }

    /// Adds a route to the main table, or replaces the one to the same
    /// destination.
    pub async fn replace_route(&self, route: Route) -> Result<()> {
        self.handle
            .route()
            .add(route_message(&route))
            .replace()
            .execute()
            .await
            .map_err(|e| Error::rtnl(format!("replacing route {}", route.dst), e))
    }

    /// Deletes the main table's route to `dst` installed with `protocol`,
    /// whatever its device (which may be gone); one already gone is
    /// success.
    pub async fn delete_route(&self, dst: Cidr<Ipv4Addr>, protocol: u8) -> Result<()> {
        let mut msg = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(dst.addr(), dst.prefix())
            .protocol(RouteProtocol::from(protocol))
            .build();
        // RT_SCOPE_NOWHERE matches a route of any scope.
        msg.header.scope = RouteScope::NoWhere;
        gone_is_ok(
            self.handle
                .route()
                .del(msg)
                .execute()
                .await
                .map_err(|e| Error::rtnl(format!("deleting route {dst}"), e)),
        )
    }
}
