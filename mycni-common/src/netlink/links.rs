//! Links: veth pairs and VXLAN devices, their state and attributes.

use std::format;
use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::prelude::rust_2024::*;

use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use rtnetlink::{LinkMessageBuilder, LinkUnspec, LinkVeth, LinkVxlan};

use super::{Cause, Error, Netlink, Result, gone_is_ok};
use crate::net::Mac;

/// Facts about one link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    /// The hardware address as the kernel gives it: six bytes for
    /// Ethernet-like links, another length or none for others (tunnels,
    /// loopback has six zeros). [`Link::ethernet_mac`] for a [`Mac`].
    pub mac: Vec<u8>,
    pub mtu: u32,
    pub alias: Option<String>,
    /// Administratively up (IFF_UP).
    pub up: bool,
    /// IFLA_LINK: for a veth, the peer's ifindex (in the peer's namespace).
    pub peer_index: Option<u32>,
    /// IFLA_LINK_NETNSID: for a veth whose peer lives in another
    /// namespace, that namespace's id as this one knows it.
    pub peer_netns_id: Option<i32>,
    /// The VXLAN attributes, when the link is a VXLAN device.
    pub vxlan: Option<VxlanInfo>,
}

impl Link {
    /// The hardware address, if it is an Ethernet one.
    pub fn ethernet_mac(&self) -> Option<Mac> {
        Mac::try_from(self.mac.as_slice()).ok()
    }
}

/// What a VXLAN device reports about itself; `None` for what it leaves out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VxlanInfo {
    pub vni: Option<u32>,
    pub local: Option<Ipv4Addr>,
    /// The local address of a device over an IPv6 underlay.
    pub local6: Option<Ipv6Addr>,
    pub port: Option<u16>,
    pub learning: Option<bool>,
    /// The underlay device's ifindex.
    pub dev: Option<u32>,
    pub udp_csum: Option<bool>,
}

/// A VXLAN device to create.
#[derive(Debug, Clone)]
pub struct VxlanConfig<'a> {
    pub name: &'a str,
    pub vni: u32,
    /// The underlay device's ifindex.
    pub dev: u32,
    /// The local underlay address; its family is the one family of the
    /// device's socket (a device outside metadata mode sends and receives
    /// over that family only).
    pub local: IpAddr,
    /// UDP destination port.
    pub port: u16,
    pub learning: bool,
    /// Whether to send an outer UDP checksum.
    pub udp_csum: bool,
    pub mtu: u32,
    pub mac: Mac,
}

fn link_from(msg: LinkMessage) -> Link {
    let mut l = Link {
        index: msg.header.index,
        name: String::new(),
        mac: Vec::new(),
        mtu: 0,
        alias: None,
        up: msg.header.flags.contains(LinkFlags::Up),
        peer_index: None,
        peer_netns_id: None,
        vxlan: None,
    };
    for a in msg.attributes {
        match a {
            LinkAttribute::IfName(n) => l.name = n,
            LinkAttribute::Address(m) => l.mac = m,
            LinkAttribute::Mtu(m) => l.mtu = m,
            LinkAttribute::IfAlias(s) => l.alias = Some(s),
            LinkAttribute::Link(i) => l.peer_index = Some(i),
            LinkAttribute::LinkNetNsId(n) => l.peer_netns_id = Some(n),
            LinkAttribute::LinkInfo(infos) => l.vxlan = vxlan_from(infos),
            _ => {}
        }
    }
    l
}

fn vxlan_from(infos: Vec<LinkInfo>) -> Option<VxlanInfo> {
    let mut is_vxlan = false;
    let mut v = VxlanInfo::default();
    for i in infos {
        match i {
            LinkInfo::Kind(InfoKind::Vxlan) => is_vxlan = true,
            LinkInfo::Data(InfoData::Vxlan(attrs)) => {
                for a in attrs {
                    match a {
                        InfoVxlan::Id(x) => v.vni = Some(x),
                        InfoVxlan::Local(x) => v.local = Some(x),
                        InfoVxlan::Local6(x) => v.local6 = Some(x),
                        InfoVxlan::Port(x) => v.port = Some(x),
                        InfoVxlan::Learning(x) => v.learning = Some(x),
                        InfoVxlan::Link(x) => v.dev = Some(x),
                        InfoVxlan::UDPCsum(x) => v.udp_csum = Some(x),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    is_vxlan.then_some(v)
}

impl Netlink {
    async fn get_link(&self, op: &str, msg: LinkMessage) -> Result<Option<Link>> {
        Ok(
            match self.get(op, RouteNetlinkMessage::GetLink(msg)).await? {
                Some(RouteNetlinkMessage::NewLink(m)) => Some(link_from(m)),
                _ => None,
            },
        )
    }

    /// The link called `name`, if there is one.
    pub async fn link_by_name(&self, name: &str) -> Result<Option<Link>> {
        let mut m = LinkMessage::default();
        m.attributes.push(LinkAttribute::IfName(name.to_string()));
        self.get_link(&format!("looking up link {name}"), m).await
    }

    /// The link with ifindex `index`, if there is one.
    pub async fn link_by_index(&self, index: u32) -> Result<Option<Link>> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        self.get_link(&format!("looking up link {index}"), m).await
    }

    /// The link `index` of the namespace this one knows as `netns_id` (a
    /// veth's [`Link::peer_netns_id`]). None also when the id no longer
    /// names a namespace (EINVAL): the namespace is going away.
    pub async fn link_in_peer_netns(&self, netns_id: i32, index: u32) -> Result<Option<Link>> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        m.attributes.push(LinkAttribute::IfNetnsId(netns_id));
        match self
            .get_link(&format!("looking up link {index} of netns {netns_id}"), m)
            .await
        {
            Err(e) if e.errno() == Some(libc::EINVAL) => Ok(None),
            other => other,
        }
    }

    /// Every link of the namespace.
    pub async fn links(&self) -> Result<Vec<Link>> {
        let msgs = self
            .dump(
                "listing links",
                RouteNetlinkMessage::GetLink(LinkMessage::default()),
            )
            .await?;
        Ok(msgs
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(link_from(l)),
                _ => None,
            })
            .collect())
    }

    /// Creates the veth pair `host` (here) <-> `peer` with the peer made
    /// directly inside the namespace `peer_netns`, so no interface ever
    /// appears half-placed. Returns the host end, left down and without an
    /// alias (the kernel ignores IFLA_IFALIAS on RTM_NEWLINK).
    ///
    /// One TX and one RX queue per end, asked for: a veth made without them
    /// gets one per possible CPU, then is cut down to one in use right
    /// after registration (`veth_init_queues`), and each cut waits for an
    /// expedited RCU grace period under the RTNL lock. That was two waits
    /// per pod, 0.6 ms of the plugin's ADD on a 2-CPU VM (median of 50,
    /// `perf sched`: `synchronize_rcu_expedited` from
    /// `netif_set_real_num_tx_queues`). The queues in use are the same
    /// one either way; only `ethtool -L` could have raised them later.
    pub async fn create_veth_in(
        &self,
        host: &str,
        peer: &str,
        peer_netns: &File,
        mtu: u32,
    ) -> Result<Link> {
        let op = || format!("creating veth {host} <-> {peer}");
        let peer_msg = LinkMessageBuilder::<LinkUnspec>::new()
            .name(peer.to_string())
            .mtu(mtu)
            .setns_by_fd(peer_netns.as_raw_fd())
            .append_extra_attribute(LinkAttribute::NumTxQueues(1))
            .append_extra_attribute(LinkAttribute::NumRxQueues(1))
            .build();
        let msg = LinkVeth::new(host, peer)
            .mtu(mtu)
            .append_extra_attribute(LinkAttribute::NumTxQueues(1))
            .append_extra_attribute(LinkAttribute::NumRxQueues(1))
            .set_info_data(InfoData::Veth(InfoVeth::Peer(peer_msg)))
            .build();
        self.handle
            .link()
            .add(msg)
            .execute()
            .await
            .map_err(|e| Error::rtnl(op(), e))?;
        self.link_by_name(host).await?.ok_or_else(|| {
            Error::new(
                op(),
                Cause::Other(format!("{host} vanished after creation")),
            )
        })
    }

    /// Creates a VXLAN device.
    pub async fn create_vxlan(&self, c: &VxlanConfig<'_>) -> Result<()> {
        let b = LinkVxlan::new(c.name, c.vni).dev(c.dev);
        let b = match c.local {
            IpAddr::V4(a) => b.local(a),
            IpAddr::V6(a) => b.local6(a),
        };
        let msg = b
            .port(c.port)
            .learning(c.learning)
            .udp_csum(c.udp_csum)
            .mtu(c.mtu)
            .address(c.mac.0.to_vec())
            .build();
        self.handle
            .link()
            .add(msg)
            .execute()
            .await
            .map_err(|e| Error::rtnl(format!("creating VXLAN device {}", c.name), e))
    }

    async fn set_link(&self, op: impl FnOnce() -> String, msg: LinkMessage) -> Result<()> {
        self.handle
            .link()
            .set(msg)
            .execute()
            .await
            .map_err(|e| Error::rtnl(op(), e))
    }

    /// Brings the link up.
    pub async fn set_up(&self, index: u32) -> Result<()> {
        let msg = up_message(index, None);
        self.set_link(|| format!("setting link {index} up"), msg)
            .await
    }

    /// Sets the alias and brings the link up, in one request: nothing ever
    /// sees the link up without its alias.
    pub async fn set_alias_and_up(&self, index: u32, alias: &str) -> Result<()> {
        let msg = up_message(index, Some(alias));
        self.set_link(
            || format!("setting the alias of link {index} and it up"),
            msg,
        )
        .await
    }

    /// Sets the MAC address and the MTU and brings the link up, in one
    /// request.
    pub async fn set_mac_mtu_and_up(&self, index: u32, mac: Mac, mtu: u32) -> Result<()> {
        let msg = LinkUnspec::new_with_index(index)
            .address(mac.0.to_vec())
            .mtu(mtu)
            .up()
            .build();
        self.set_link(
            || format!("setting the MAC, MTU of link {index} and it up"),
            msg,
        )
        .await
    }

    /// Deletes a link (a veth with its peer); one already gone is success.
    pub async fn delete_link(&self, index: u32) -> Result<()> {
        gone_is_ok(
            self.handle
                .link()
                .del(index)
                .execute()
                .await
                .map_err(|e| Error::rtnl(format!("deleting link {index}"), e)),
        )
    }
}

/// The RTM_SETLINK request that brings link `index` up, setting its alias
/// in the same request when given. One message for the single operations
/// and [`super::Batch`].
pub(super) fn up_message(index: u32, alias: Option<&str>) -> LinkMessage {
    let b = LinkUnspec::new_with_index(index);
    match alias {
        Some(a) => b.alias(a),
        None => b,
    }
    .up()
    .build()
}
