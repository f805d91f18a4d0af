//! The kernel operations of the plugin, over rtnetlink.
//!
//! A `Nl` is bound to one network namespace for its whole life: the socket
//! for the pod namespace is opened on a short-lived OS thread that entered it,
//! so no thread of ours ever changes namespace while async work runs.

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};

use futures::TryStreamExt;
use netlink_packet_route::address::AddressAttribute;
use netlink_packet_route::link::{InfoData, InfoVeth, LinkAttribute, LinkFlags, LinkMessage};
use netlink_packet_route::neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourState};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope,
};
use rtnetlink::{Handle, LinkMessageBuilder, LinkUnspec, LinkVeth, RouteMessageBuilder};

use crate::error::{CniError, Code, Result, kernel};

pub use mycni_common::contract::RTPROT_MYCNI_PLUGIN;
/// The pod's gateway, answered by proxy ARP / a static neighbour on the host veth.
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);

pub struct Nl {
    handle: Handle,
}

/// Facts about one link.
#[derive(Debug, Clone)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mac: Vec<u8>,
    pub mtu: u32,
    pub alias: Option<String>,
    pub up: bool,
    /// IFLA_LINK: for a veth, the peer's ifindex (in the peer's namespace).
    pub peer: Option<u32>,
}

fn link_from(msg: LinkMessage) -> Link {
    let mut l = Link {
        index: msg.header.index,
        name: String::new(),
        mac: Vec::new(),
        mtu: 0,
        alias: None,
        up: msg.header.flags.contains(LinkFlags::Up),
        peer: None,
    };
    for a in msg.attributes {
        match a {
            LinkAttribute::IfName(n) => l.name = n,
            LinkAttribute::Address(m) => l.mac = m,
            LinkAttribute::Mtu(m) => l.mtu = m,
            LinkAttribute::IfAlias(s) => l.alias = Some(s),
            LinkAttribute::Link(i) => l.peer = Some(i),
            _ => {}
        }
    }
    l
}

fn is_not_found(e: &rtnetlink::Error) -> bool {
    matches!(e, rtnetlink::Error::NetlinkError(m) if m.raw_code() == -libc::ENODEV || m.raw_code() == -libc::ENOENT || m.raw_code() == -libc::ESRCH)
}

/// Opens a NETLINK_ROUTE socket inside the namespace at `netns` from a
/// throwaway thread, so the caller's thread never leaves its namespace.
fn socket_in(netns: &File) -> Result<OwnedFd> {
    let ns_fd = netns.as_raw_fd();
    std::thread::scope(|s| {
        s.spawn(|| -> Result<OwnedFd> {
            // SAFETY: setns affects only this short-lived thread.
            if unsafe { libc::setns(ns_fd, libc::CLONE_NEWNET) } != 0 {
                return Err(kernel(
                    "entering the pod netns",
                    std::io::Error::last_os_error(),
                ));
            }
            // SAFETY: plain socket(2); the fd is owned right away.
            let fd = unsafe {
                libc::socket(
                    libc::AF_NETLINK,
                    libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                    libc::NETLINK_ROUTE,
                )
            };
            if fd < 0 {
                return Err(kernel(
                    "netlink socket in the pod netns",
                    std::io::Error::last_os_error(),
                ));
            }
            // SAFETY: fd was just returned by socket(2) and is not owned elsewhere.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        })
        .join()
        .map_err(|_| CniError::new(Code::Kernel, "netns thread panicked"))?
    })
}

impl Nl {
    /// A handle in the calling thread's namespace (the host side). Must be
    /// called inside a tokio runtime.
    pub fn current() -> Result<Self> {
        let (conn, handle, _) =
            rtnetlink::new_connection().map_err(|e| kernel("netlink socket", e))?;
        tokio::spawn(conn);
        Ok(Self { handle })
    }

    /// A handle whose socket lives in the namespace `netns`.
    pub fn in_netns(netns: &File) -> Result<Self> {
        let fd = socket_in(netns)?;
        // SAFETY: we own fd; TokioSocket takes it over.
        let sock = unsafe { rtnetlink::sys::TokioSocket::from_raw_fd(fd.into_raw_fd()) };
        let (conn, handle, _) = rtnetlink::from_socket(sock);
        tokio::spawn(conn);
        Ok(Self { handle })
    }

    pub async fn link_by_name(&self, name: &str) -> Result<Option<Link>> {
        let mut s = self
            .handle
            .link()
            .get()
            .match_name(name.to_string())
            .execute();
        match s.try_next().await {
            Ok(Some(m)) => Ok(Some(link_from(m))),
            Ok(None) => Ok(None),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(kernel(&format!("looking up link {name}"), e)),
        }
    }

    pub async fn links(&self) -> Result<Vec<Link>> {
        let mut out = Vec::new();
        let mut s = self.handle.link().get().execute();
        while let Some(m) = s.try_next().await.map_err(|e| kernel("listing links", e))? {
            out.push(link_from(m));
        }
        Ok(out)
    }

    /// Creates the veth pair with the peer made directly inside the pod
    /// namespace, so no interface ever appears half-placed on the host.
    /// Returns the host end; it is left down and without its alias (the
    /// kernel ignores IFLA_IFALIAS on RTM_NEWLINK): `mark_up` sets both.
    pub async fn add_veth(
        &self,
        host: &str,
        peer: &str,
        pod_netns: &File,
        mtu: u32,
    ) -> Result<Link> {
        let peer_msg = LinkMessageBuilder::<LinkUnspec>::new()
            .name(peer.to_string())
            .mtu(mtu)
            .setns_by_fd(pod_netns.as_raw_fd())
            .build();
        let msg = LinkVeth::new(host, peer)
            .mtu(mtu)
            .set_info_data(InfoData::Veth(InfoVeth::Peer(peer_msg)))
            .build();
        self.handle
            .link()
            .add(msg)
            .execute()
            .await
            .map_err(|e| kernel(&format!("creating veth {host} <-> {peer}"), e))?;
        self.link_by_name(host).await?.ok_or_else(|| {
            CniError::new(Code::Kernel, format!("veth {host} vanished after creation"))
        })
    }

    /// Sets the owner alias and brings the link up in one request.
    pub async fn mark_up(&self, index: u32, alias: &str) -> Result<()> {
        self.handle
            .link()
            .set(LinkUnspec::new_with_index(index).alias(alias).up().build())
            .execute()
            .await
            .map_err(|e| kernel(&format!("marking link {index} and setting it up"), e))
    }

    pub async fn set_up(&self, index: u32) -> Result<()> {
        self.handle
            .link()
            .set(LinkUnspec::new_with_index(index).up().build())
            .execute()
            .await
            .map_err(|e| kernel(&format!("setting link {index} up"), e))
    }

    /// Deletes a link; a link that is already gone is success.
    pub async fn del_link(&self, index: u32) -> Result<()> {
        match self.handle.link().del(index).execute().await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(kernel(&format!("deleting link {index}"), e)),
        }
    }

    pub async fn add_addr32(&self, index: u32, ip: Ipv4Addr) -> Result<()> {
        self.handle
            .address()
            .add(index, IpAddr::V4(ip), 32)
            .execute()
            .await
            .map_err(|e| kernel(&format!("adding {ip}/32"), e))
    }

    pub async fn addrs_v4(&self, index: u32) -> Result<Vec<(Ipv4Addr, u8)>> {
        let mut out = Vec::new();
        let mut s = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute();
        while let Some(m) = s
            .try_next()
            .await
            .map_err(|e| kernel("listing addresses", e))?
        {
            for a in &m.attributes {
                if let AddressAttribute::Address(IpAddr::V4(ip)) = a {
                    out.push((*ip, m.header.prefix_len));
                }
            }
        }
        Ok(out)
    }

    /// `dst/prefix [via gw] dev index`, scope link when there is no gateway,
    /// `onlink` with one (the gateway is not on any subnet of the pod).
    pub async fn add_route(
        &self,
        dst: Ipv4Addr,
        prefix: u8,
        gw: Option<Ipv4Addr>,
        index: u32,
    ) -> Result<()> {
        let mut b = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(dst, prefix)
            .output_interface(index)
            .protocol(RouteProtocol::Other(RTPROT_MYCNI_PLUGIN));
        b = match gw {
            Some(g) => b.gateway(g).onlink(),
            None => b.scope(RouteScope::Link),
        };
        self.handle
            .route()
            .add(b.build())
            .execute()
            .await
            .map_err(|e| kernel(&format!("adding route {dst}/{prefix}"), e))
    }

    /// IPv4 routes in the main table as (dst, prefix, gw, oif).
    pub async fn routes_v4(&self) -> Result<Vec<(Ipv4Addr, u8, Option<Ipv4Addr>, Option<u32>)>> {
        let mut out = Vec::new();
        let req: RouteMessage = RouteMessageBuilder::<Ipv4Addr>::new().build();
        let mut s = self.handle.route().get(req).execute();
        while let Some(m) = s
            .try_next()
            .await
            .map_err(|e| kernel("listing routes", e))?
        {
            let mut dst = Ipv4Addr::UNSPECIFIED;
            let mut gw = None;
            let mut oif = None;
            for a in &m.attributes {
                match a {
                    RouteAttribute::Destination(RouteAddress::Inet(d)) => dst = *d,
                    RouteAttribute::Gateway(RouteAddress::Inet(g)) => gw = Some(*g),
                    RouteAttribute::Oif(i) => oif = Some(*i),
                    _ => {}
                }
            }
            out.push((dst, m.header.destination_prefix_length, gw, oif));
        }
        Ok(out)
    }

    pub async fn add_permanent_neigh(&self, index: u32, ip: Ipv4Addr, mac: &[u8]) -> Result<()> {
        self.handle
            .neighbours()
            .add(index, IpAddr::V4(ip))
            .link_layer_address(mac)
            .state(NeighbourState::Permanent)
            .replace()
            .execute()
            .await
            .map_err(|e| kernel(&format!("adding neighbour {ip}"), e))
    }

    /// The permanent neighbour entry for `ip` on `index`, as its MAC.
    pub async fn permanent_neigh(&self, index: u32, ip: Ipv4Addr) -> Result<Option<Vec<u8>>> {
        let mut s = self.handle.neighbours().get().execute();
        while let Some(m) = s
            .try_next()
            .await
            .map_err(|e| kernel("listing neighbours", e))?
        {
            if m.header.ifindex != index || m.header.state != NeighbourState::Permanent {
                continue;
            }
            let mut dst = None;
            let mut lla = None;
            for a in m.attributes {
                match a {
                    NeighbourAttribute::Destination(NeighbourAddress::Inet(d)) => dst = Some(d),
                    NeighbourAttribute::LinkLayerAddress(l) => lla = Some(l),
                    _ => {}
                }
            }
            if dst == Some(ip) {
                return Ok(lla);
            }
        }
        Ok(None)
    }
}

/// Reads a sysctl of the calling thread's namespace.
pub fn read_sysctl(path: &str) -> Result<String> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|e| CniError::new(Code::Io, format!("reading {path}: {e}")))
}

pub fn write_sysctl(path: &str, value: &str) -> Result<()> {
    std::fs::write(path, value)
        .map_err(|e| CniError::new(Code::Kernel, format!("writing {value} to {path}: {e}")))
}
