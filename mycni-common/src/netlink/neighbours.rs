//! Neighbour (ARP and NDP) entries and a device's own FDB entries: all
//! RTM_NEWNEIGH messages, in the AF_INET, AF_INET6 and AF_BRIDGE families.

use std::format;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::prelude::rust_2024::*;

use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::packet_core::{NLM_F_CREATE, NLM_F_REPLACE};

use super::{Netlink, Result, gone_is_ok};
use crate::net::Mac;

/// A neighbour (ARP) entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Neighbour {
    pub ip: Ipv4Addr,
    pub mac: Mac,
}

/// An IPv6 neighbour (NDP) entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Neighbour6 {
    pub ip: Ipv6Addr,
    pub mac: Mac,
}

/// A forwarding database entry of a device itself (`bridge fdb ... self`):
/// for a VXLAN device, which remote host a MAC lives behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdbEntry {
    pub mac: Mac,
    /// The remote host, on a device over an IPv4 underlay.
    pub dst: Option<Ipv4Addr>,
    /// The remote host, on a device over an IPv6 underlay. A field of its
    /// own beside `dst` rather than one `IpAddr`: every reader of an IPv4
    /// device's FDB stays as it was.
    pub dst6: Option<Ipv6Addr>,
}

impl FdbEntry {
    /// The remote host, whichever its family.
    pub fn dst_ip(&self) -> Option<IpAddr> {
        self.dst
            .map(IpAddr::V4)
            .or_else(|| self.dst6.map(IpAddr::V6))
    }
}

/// NUD_PERMANENT, alone or combined: a new VXLAN FDB entry reports
/// PERMANENT|NOARP, which the enum only has as `Other(0xc0)`.
fn is_permanent(state: NeighbourState) -> bool {
    const NUD_PERMANENT: u16 = 0x80;
    u16::from(state) & NUD_PERMANENT != 0
}

fn neighbour_ip_mac(m: &NeighbourMessage) -> (Option<Ipv4Addr>, Option<Mac>) {
    let (ip, mac) = neighbour_any_ip_mac(m);
    match ip {
        Some(IpAddr::V4(a)) => (Some(a), mac),
        _ => (None, mac),
    }
}

/// The destination of either family and the MAC of a neighbour or FDB
/// message.
fn neighbour_any_ip_mac(m: &NeighbourMessage) -> (Option<IpAddr>, Option<Mac>) {
    let mut ip = None;
    let mut mac = None;
    for a in &m.attributes {
        match a {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(d)) => ip = Some(IpAddr::V4(*d)),
            NeighbourAttribute::Destination(NeighbourAddress::Inet6(d)) => {
                ip = Some(IpAddr::V6(*d))
            }
            // In AF_BRIDGE (FDB) messages the parser cannot tell the
            // destination's family and leaves the raw bytes: 4 of them are
            // IPv4, 16 IPv6 (NDA_DST is as long as its address).
            NeighbourAttribute::Destination(NeighbourAddress::Other(b)) => {
                if let Ok(o) = <[u8; 4]>::try_from(b.as_slice()) {
                    ip = Some(IpAddr::V4(Ipv4Addr::from(o)));
                } else if let Ok(o) = <[u8; 16]>::try_from(b.as_slice()) {
                    ip = Some(IpAddr::V6(Ipv6Addr::from(o)));
                }
            }
            NeighbourAttribute::LinkLayerAddress(l) => mac = Mac::try_from(l.as_slice()).ok(),
            _ => {}
        }
    }
    (ip, mac)
}

fn fdb_entry(mac: Mac, dst: Option<IpAddr>) -> FdbEntry {
    FdbEntry {
        mac,
        dst: dst.and_then(|d| match d {
            IpAddr::V4(a) => Some(a),
            IpAddr::V6(_) => None,
        }),
        dst6: dst.and_then(|d| match d {
            IpAddr::V6(a) => Some(a),
            IpAddr::V4(_) => None,
        }),
    }
}

/// The neighbour family of an address, and the address as a neighbour
/// message's destination.
fn neighbour_address(ip: IpAddr) -> (AddressFamily, NeighbourAddress) {
    match ip {
        IpAddr::V4(a) => (AddressFamily::Inet, NeighbourAddress::Inet(a)),
        IpAddr::V6(a) => (AddressFamily::Inet6, NeighbourAddress::Inet6(a)),
    }
}

fn neighbour_message(family: AddressFamily, index: u32) -> NeighbourMessage {
    let mut m = NeighbourMessage::default();
    m.header.family = family;
    m.header.ifindex = index;
    m
}

/// The request that sets the permanent neighbour `ip` -> `mac` on link
/// `index` (sent with NLM_F_CREATE | NLM_F_REPLACE).
pub(super) fn set_neighbour_message(index: u32, ip: IpAddr, mac: Mac) -> NeighbourMessage {
    let (family, dst) = neighbour_address(ip);
    let mut m = neighbour_message(family, index);
    m.header.state = NeighbourState::Permanent;
    m.attributes.push(NeighbourAttribute::Destination(dst));
    m.attributes
        .push(NeighbourAttribute::LinkLayerAddress(mac.0.to_vec()));
    m
}

/// The request that deletes the neighbour `ip` on link `index`.
pub(super) fn delete_neighbour_message(index: u32, ip: IpAddr) -> NeighbourMessage {
    let (family, dst) = neighbour_address(ip);
    let mut m = neighbour_message(family, index);
    m.attributes.push(NeighbourAttribute::Destination(dst));
    m
}

/// The request that sets the device `index`'s own permanent FDB entry
/// `mac` -> `dst` (`bridge fdb replace ... self permanent`).
pub(super) fn set_fdb_message(index: u32, mac: Mac, dst: IpAddr) -> NeighbourMessage {
    let mut m = neighbour_message(AddressFamily::Bridge, index);
    m.header.state = NeighbourState::Permanent;
    m.header.flags = NeighbourFlags::Own;
    m.attributes
        .push(NeighbourAttribute::LinkLayerAddress(mac.0.to_vec()));
    m.attributes
        .push(NeighbourAttribute::Destination(neighbour_address(dst).1));
    m
}

/// The request that deletes the device `index`'s own FDB entry `mac`.
pub(super) fn delete_fdb_message(index: u32, mac: Mac) -> NeighbourMessage {
    let mut m = neighbour_message(AddressFamily::Bridge, index);
    m.header.flags = NeighbourFlags::Own;
    m.attributes
        .push(NeighbourAttribute::LinkLayerAddress(mac.0.to_vec()));
    m
}

impl Netlink {
    /// Sets the permanent neighbour `ip` (IPv4 or IPv6) -> `mac` on link
    /// `index`, replacing whatever entry `ip` had there.
    pub async fn replace_permanent_neighbour(
        &self,
        index: u32,
        ip: impl Into<IpAddr>,
        mac: Mac,
    ) -> Result<()> {
        let ip: IpAddr = ip.into();
        self.change(
            &format!("setting neighbour {ip} on link {index}"),
            RouteNetlinkMessage::NewNeighbour(set_neighbour_message(index, ip, mac)),
            NLM_F_CREATE | NLM_F_REPLACE,
        )
        .await
    }

    /// The MAC of the permanent neighbour `ip` (IPv4 or IPv6) on link
    /// `index`, if there is one (a learned entry is not).
    pub async fn permanent_neighbour(
        &self,
        index: u32,
        ip: impl Into<IpAddr>,
    ) -> Result<Option<Mac>> {
        let ip: IpAddr = ip.into();
        let (family, dst) = neighbour_address(ip);
        let mut req = neighbour_message(family, index);
        req.attributes.push(NeighbourAttribute::Destination(dst));
        let op = format!("looking up neighbour {ip} on link {index}");
        Ok(
            match self
                .get(&op, RouteNetlinkMessage::GetNeighbour(req))
                .await?
            {
                Some(RouteNetlinkMessage::NewNeighbour(m)) if is_permanent(m.header.state) => {
                    neighbour_ip_mac(&m).1
                }
                _ => None,
            },
        )
    }

    /// The permanent IPv4 neighbours on link `index`.
    pub async fn permanent_neighbours(&self, index: u32) -> Result<Vec<Neighbour>> {
        let msgs = self
            .permanent_neighbour_messages(AddressFamily::Inet, index)
            .await?;
        Ok(msgs
            .iter()
            .filter_map(|m| match neighbour_ip_mac(m) {
                (Some(ip), Some(mac)) => Some(Neighbour { ip, mac }),
                _ => None,
            })
            .collect())
    }

    /// The permanent IPv6 neighbours on link `index`.
    pub async fn permanent_ipv6_neighbours(&self, index: u32) -> Result<Vec<Neighbour6>> {
        let msgs = self
            .permanent_neighbour_messages(AddressFamily::Inet6, index)
            .await?;
        Ok(msgs
            .iter()
            .filter_map(|m| {
                let ip = m.attributes.iter().find_map(|a| match a {
                    NeighbourAttribute::Destination(NeighbourAddress::Inet6(d)) => Some(*d),
                    _ => None,
                })?;
                Some(Neighbour6 {
                    ip,
                    mac: neighbour_ip_mac(m).1?,
                })
            })
            .collect())
    }

    async fn permanent_neighbour_messages(
        &self,
        family: AddressFamily,
        index: u32,
    ) -> Result<Vec<NeighbourMessage>> {
        // Dumps filter by attribute, not by the header's ifindex.
        let mut req = neighbour_message(family, 0);
        req.attributes.push(NeighbourAttribute::IfIndex(index));
        let msgs = self
            .dump(
                &format!("listing the neighbours of link {index}"),
                RouteNetlinkMessage::GetNeighbour(req),
            )
            .await?;
        let mut out = Vec::new();
        for m in msgs {
            let RouteNetlinkMessage::NewNeighbour(m) = m else {
                continue;
            };
            if m.header.ifindex != index
                || m.header.family != family
                || !is_permanent(m.header.state)
            {
                continue;
            }
            out.push(m);
        }
        Ok(out)
    }

    /// Deletes the neighbour `ip` (IPv4 or IPv6) on link `index`; one
    /// already gone is success.
    pub async fn delete_neighbour(&self, index: u32, ip: impl Into<IpAddr>) -> Result<()> {
        let ip: IpAddr = ip.into();
        gone_is_ok(
            self.change(
                &format!("deleting neighbour {ip} on link {index}"),
                RouteNetlinkMessage::DelNeighbour(delete_neighbour_message(index, ip)),
                0,
            )
            .await,
        )
    }

    /// Sets the permanent FDB entry `mac` -> `dst` of the device `index`
    /// itself, replacing whatever `mac` had there. `dst` is of the
    /// device's underlay family: the kernel refuses the other one.
    pub async fn replace_fdb_entry(
        &self,
        index: u32,
        mac: Mac,
        dst: impl Into<IpAddr>,
    ) -> Result<()> {
        self.change(
            &format!("setting FDB entry {mac} on link {index}"),
            RouteNetlinkMessage::NewNeighbour(set_fdb_message(index, mac, dst.into())),
            NLM_F_CREATE | NLM_F_REPLACE,
        )
        .await
    }

    /// The permanent FDB entries of the device `index` itself. The
    /// all-zeros entry, a VXLAN device's default destination rather than
    /// a MAC's, is left out.
    pub async fn fdb_entries(&self, index: u32) -> Result<Vec<FdbEntry>> {
        let req = neighbour_message(AddressFamily::Bridge, index);
        let msgs = self
            .dump(
                &format!("listing the FDB of link {index}"),
                RouteNetlinkMessage::GetNeighbour(req),
            )
            .await?;
        let mut out = Vec::new();
        for m in msgs {
            let RouteNetlinkMessage::NewNeighbour(m) = m else {
                continue;
            };
            if m.header.ifindex != index
                || !is_permanent(m.header.state)
                || !m.header.flags.contains(NeighbourFlags::Own)
            {
                continue;
            }
            if let (dst, Some(mac)) = neighbour_any_ip_mac(&m)
                && mac != Mac::ZERO
            {
                out.push(fdb_entry(mac, dst));
            }
        }
        Ok(out)
    }

    /// The device `index`'s own FDB entry for `mac`, asked for alone
    /// (RTM_GETNEIGH with the MAC, as `bridge fdb get ... self`), not
    /// found in a dump of them all.
    pub async fn fdb_entry(&self, index: u32, mac: Mac) -> Result<Option<FdbEntry>> {
        let mut req = neighbour_message(AddressFamily::Bridge, index);
        req.header.flags = NeighbourFlags::Own;
        req.attributes
            .push(NeighbourAttribute::LinkLayerAddress(mac.0.to_vec()));
        let op = format!("looking up FDB entry {mac} on link {index}");
        Ok(
            match self
                .get(&op, RouteNetlinkMessage::GetNeighbour(req))
                .await?
            {
                Some(RouteNetlinkMessage::NewNeighbour(m)) => {
                    Some(fdb_entry(mac, neighbour_any_ip_mac(&m).0))
                }
                _ => None,
            },
        )
    }

    /// Whether the device `index` itself has an FDB entry for `mac`.
    pub async fn has_fdb_entry(&self, index: u32, mac: Mac) -> Result<bool> {
        Ok(self.fdb_entry(index, mac).await?.is_some())
    }

    /// Deletes the FDB entry `mac` of the device `index` itself; one
    /// already gone is success.
    pub async fn delete_fdb_entry(&self, index: u32, mac: Mac) -> Result<()> {
        gone_is_ok(
            self.change(
                &format!("deleting FDB entry {mac} on link {index}"),
                RouteNetlinkMessage::DelNeighbour(delete_fdb_message(index, mac)),
                0,
            )
            .await,
        )
    }
}
