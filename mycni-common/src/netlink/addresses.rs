//! IPv4 addresses of links.

use std::format;
use std::net::{IpAddr, Ipv4Addr};
use std::prelude::rust_2024::*;

use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::{Error, Netlink, Result};
use crate::net::Cidr;

impl Netlink {
    /// The IPv4 addresses of link `index`, with their prefix length.
    pub async fn ipv4_addresses(&self, index: u32) -> Result<Vec<Cidr<Ipv4Addr>>> {
        let mut req = AddressMessage::default();
        req.header.family = AddressFamily::Inet;
        req.header.index = index;
        let msgs = self
            .dump(
                &format!("listing the addresses of link {index}"),
                RouteNetlinkMessage::GetAddress(req),
            )
            .await?;
        let mut out = Vec::new();
        for m in msgs {
            let RouteNetlinkMessage::NewAddress(m) = m else {
                continue;
            };
            if m.header.index != index {
                continue;
            }
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

    /// Adds an IPv4 address; one already there is an error that
    /// [`Error::is_exists`].
    pub async fn add_address(&self, index: u32, address: Cidr<Ipv4Addr>) -> Result<()> {
        self.handle
            .address()
            .add(index, IpAddr::V4(address.addr()), address.prefix())
            .execute()
            .await
            .map_err(|e| Error::rtnl(format!("adding {address} to link {index}"), e))
    }
}
