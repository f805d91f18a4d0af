//! IPv4 and IPv6 addresses of links.

use std::format;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::prelude::rust_2024::*;

use netlink_packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::AddressMessageBuilder;
use rtnetlink::packet_core::{NLM_F_CREATE, NLM_F_EXCL};

use super::{Error, Netlink, Result, gone_is_ok};
use crate::net::{Cidr, Family};

/// An IPv6 address of a link with the flags the plugin sets or checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Address {
    pub cidr: Cidr<Ipv6Addr>,
    /// IFA_F_NODAD: added without duplicate address detection.
    pub nodad: bool,
    /// IFA_F_TENTATIVE: DAD still running, so not yet usable as a source.
    pub tentative: bool,
    /// IFA_F_TEMPORARY (privacy, RFC 8981), IFA_F_DEPRECATED (preferred
    /// lifetime over) or IFA_F_DADFAILED: an address the kernel would not
    /// pick as a stable source, nor should a host IP others tunnel to.
    pub unstable: bool,
}

/// The full IFA_F_* word: the header holds only the low byte, the
/// IFA_FLAGS attribute (when present) all of them.
fn address_flags(m: &AddressMessage) -> AddressFlags {
    m.attributes
        .iter()
        .find_map(|a| match a {
            AddressAttribute::Flags(f) => Some(*f),
            _ => None,
        })
        .unwrap_or_else(|| AddressFlags::from_bits_retain(u32::from(m.header.flags.bits())))
}

impl Netlink {
    async fn address_messages(
        &self,
        index: u32,
        family: AddressFamily,
    ) -> Result<Vec<AddressMessage>> {
        let mut req = AddressMessage::default();
        req.header.family = family;
        req.header.index = index;
        let msgs = self
            .dump(
                &format!("listing the addresses of link {index}"),
                RouteNetlinkMessage::GetAddress(req),
            )
            .await?;
        Ok(msgs
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewAddress(m)
                    if m.header.index == index && m.header.family == family =>
                {
                    Some(m)
                }
                _ => None,
            })
            .collect())
    }

    /// The IPv4 addresses of link `index`, with their prefix length.
    pub async fn ipv4_addresses(&self, index: u32) -> Result<Vec<Cidr<Ipv4Addr>>> {
        let mut out = Vec::new();
        for m in self.address_messages(index, AddressFamily::Inet).await? {
            for a in &m.attributes {
                if let AddressAttribute::Address(IpAddr::V4(ip)) = a
                    && let Some(c) = Cidr::new(*ip, m.header.prefix_len)
                {
                    out.push(c);
                }
            }
        }
        Ok(out)
    }

    /// The IPv6 addresses of link `index` (link-local ones included),
    /// with their prefix length and DAD flags.
    pub async fn ipv6_addresses(&self, index: u32) -> Result<Vec<Ipv6Address>> {
        let mut out = Vec::new();
        for m in self.address_messages(index, AddressFamily::Inet6).await? {
            let flags = address_flags(&m);
            for a in &m.attributes {
                if let AddressAttribute::Address(IpAddr::V6(ip)) = a
                    && let Some(cidr) = Cidr::new(*ip, m.header.prefix_len)
                {
                    out.push(Ipv6Address {
                        cidr,
                        nodad: flags.contains(AddressFlags::Nodad),
                        tentative: flags.contains(AddressFlags::Tentative),
                        // IFA_F_TEMPORARY is IFA_F_SECONDARY's bit.
                        unstable: flags.intersects(
                            AddressFlags::Secondary
                                | AddressFlags::Deprecated
                                | AddressFlags::Dadfailed,
                        ),
                    });
                }
            }
        }
        Ok(out)
    }

    /// Adds an address of either family; one already there is an error
    /// that [`Error::is_exists`].
    pub async fn add_address<A: Family + Into<IpAddr>>(
        &self,
        index: u32,
        address: Cidr<A>,
    ) -> Result<()> {
        let ip: IpAddr = address.addr().into();
        self.change(
            &format!("adding {address} to link {index}"),
            RouteNetlinkMessage::NewAddress(add_address_message(
                index,
                ip,
                address.prefix(),
                false,
            )),
            NLM_F_CREATE | NLM_F_EXCL,
        )
        .await
    }

    /// Deletes an address of either family from link `index`; one
    /// already gone (EADDRNOTAVAIL, or with its link) is success.
    pub async fn delete_address<A: Family + Into<IpAddr>>(
        &self,
        index: u32,
        address: Cidr<A>,
    ) -> Result<()> {
        let ip: IpAddr = address.addr().into();
        let mut m = AddressMessage::default();
        m.header.family = match ip {
            IpAddr::V4(_) => AddressFamily::Inet,
            IpAddr::V6(_) => AddressFamily::Inet6,
        };
        m.header.prefix_len = address.prefix();
        m.header.index = index;
        m.attributes.push(AddressAttribute::Address(ip));
        if ip.is_ipv4() {
            // IPv4 matches an address by IFA_LOCAL.
            m.attributes.push(AddressAttribute::Local(ip));
        }
        match self.handle.address().del(m).execute().await {
            Err(rtnetlink::Error::NetlinkError(e))
                if e.code.map(|c| -c.get()) == Some(libc::EADDRNOTAVAIL) =>
            {
                Ok(())
            }
            r => gone_is_ok(
                r.map_err(|e| Error::rtnl(format!("deleting {address} from link {index}"), e)),
            ),
        }
    }

    /// Adds an IPv6 address without duplicate address detection
    /// (`nodad`): usable at once instead of after a second or more of
    /// DAD, for an address only this host can hold on the link. One
    /// already there is an error that [`Error::is_exists`].
    pub async fn add_ipv6_address_nodad(&self, index: u32, address: Cidr<Ipv6Addr>) -> Result<()> {
        self.change(
            &format!("adding {address} (nodad) to link {index}"),
            RouteNetlinkMessage::NewAddress(add_address_message(
                index,
                address.addr().into(),
                address.prefix(),
                true,
            )),
            NLM_F_CREATE | NLM_F_EXCL,
        )
        .await
    }
}

/// The request that adds `ip`/`prefix` to link `index` (sent with
/// NLM_F_CREATE | NLM_F_EXCL), as rtnetlink builds it; `nodad` (IPv6)
/// skips duplicate address detection. One message for the single
/// operations and [`super::Batch`].
pub(super) fn add_address_message(
    index: u32,
    ip: IpAddr,
    prefix: u8,
    nodad: bool,
) -> AddressMessage {
    let mut m = match ip {
        IpAddr::V4(a) => AddressMessageBuilder::<Ipv4Addr>::new()
            .index(index)
            .address(a, prefix)
            .build(),
        IpAddr::V6(a) => AddressMessageBuilder::<Ipv6Addr>::new()
            .index(index)
            .address(a, prefix)
            .build(),
    };
    if nodad {
        m.header.flags = AddressHeaderFlags::Nodad;
        m.attributes
            .push(AddressAttribute::Flags(AddressFlags::Nodad));
    }
    m
}
