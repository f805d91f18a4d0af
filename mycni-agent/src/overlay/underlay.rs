//! The underlay: how `--iface` and `--underlay6` select it, and finding it
//! in the kernel (the interface, its host address of each family, its MTU
//! and subnets).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use mycni_common::net::Cidr4;
use mycni_common::netlink::{Link, Route, RouteFamily};

use crate::kernel::{KernelError, is_pod_veth};

use super::kernel::OverlayKernel;
use crate::topology::{Underlay6Select, UnderlaySelect, glob_match};

/// The IPv6 underlay: the underlay interface's IPv6 host address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Underlay6 {
    pub name: String,
    pub index: u32,
    pub ip: Ipv6Addr,
    pub mtu: u32,
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
    pub subnets: Vec<Cidr4>,
}

/// The route `ip route get` would most likely pick for `to` without policy
/// rules: the longest prefix that covers it among routes with a device.
pub(crate) fn longest_match<A: RouteFamily>(routes: &[Route<A>], to: A) -> Option<&Route<A>> {
    routes
        .iter()
        .filter(|r| r.oif.is_some() && r.dst.contains(to))
        .max_by_key(|r| r.dst.prefix())
}

impl OverlayKernel {
    /// The underlay interface named `n`, which must exist.
    async fn named_underlay(&self, n: &str) -> Result<Link, KernelError> {
        self.link(n)
            .await?
            .ok_or_else(|| KernelError::Other(format!("underlay interface {n} does not exist")))
    }

    /// The interface of the first default route among `routes` (one
    /// family's; `what` names it in the error).
    async fn default_route_link<A: RouteFamily>(
        &self,
        routes: Vec<Route<A>>,
        what: &str,
    ) -> Result<Link, KernelError> {
        let oif = routes
            .into_iter()
            .find(|r| r.dst.prefix() == 0 && r.oif.is_some())
            .and_then(|r| r.oif)
            .ok_or_else(|| {
                KernelError::Other(format!(
                    "no {what} route to pick the underlay interface from; pass --iface"
                ))
            })?;
        self.nl
            .link_by_index(oif)
            .await?
            .ok_or_else(|| KernelError::Other(format!("default route's interface {oif} vanished")))
    }

    /// The underlay: `name` if given, else the interface of the default route.
    pub async fn underlay(&self, name: Option<&str>) -> Result<Underlay, KernelError> {
        let link = match name {
            Some(n) => self.named_underlay(n).await?,
            None => {
                self.default_route_link(self.nl.ipv4_routes().await?, "default")
                    .await?
            }
        };
        let addrs: Vec<Cidr4> = self
            .nl
            .ipv4_addresses(link.index)
            .await?
            .into_iter()
            .filter(|c| !c.addr().is_loopback() && !c.addr().is_link_local())
            .collect();
        let ip = addrs.first().map(|c| c.addr()).ok_or_else(|| {
            KernelError::Other(format!("underlay {} has no IPv4 address", link.name))
        })?;
        let subnets = addrs
            .iter()
            .filter(|c| c.prefix() < 32)
            .map(|c| c.trunc())
            .collect();
        Ok(Underlay {
            name: link.name,
            index: link.index,
            ip,
            mtu: link.mtu,
            subnets,
        })
    }

    /// The underlay as `how` selects it.
    pub(crate) async fn select_underlay(
        &self,
        how: &UnderlaySelect,
    ) -> Result<Underlay, KernelError> {
        match how {
            UnderlaySelect::DefaultRoute => self.underlay(None).await,
            UnderlaySelect::Name(n) => self.underlay(Some(n)).await,
            UnderlaySelect::Pattern(p) => {
                for l in self.pattern_candidates(p).await? {
                    match self.underlay(Some(&l.name)).await {
                        Ok(u) => return Ok(u),
                        // No IPv4 address (yet): not a candidate.
                        Err(KernelError::Other(_)) => continue,
                        Err(e) => return Err(e),
                    }
                }
                Err(KernelError::Other(format!(
                    "no interface matching {p} has an IPv4 address"
                )))
            }
            UnderlaySelect::CanReach(to) => {
                let link = self.link_reaching(*to).await?;
                self.underlay(Some(&link.name)).await
            }
        }
    }

    /// The interfaces whose name matches the glob `p`, lowest ifindex
    /// first: the candidates of `interface=<glob>` in either family. Our
    /// own devices and the pods' veths are never the underlay, whatever a
    /// broad pattern says.
    async fn pattern_candidates(&self, p: &str) -> Result<Vec<Link>, KernelError> {
        let mut links = self.nl.links().await?;
        links.retain(|l| {
            l.vxlan.is_none()
                && !l.alias.as_deref().is_some_and(is_pod_veth)
                && glob_match(p, &l.name)
        });
        links.sort_by_key(|l| l.index);
        Ok(links)
    }

    /// The interface of the most specific route to `to`, of its family.
    async fn link_reaching(&self, to: IpAddr) -> Result<Link, KernelError> {
        let oif = match to {
            IpAddr::V4(a) => longest_match(&self.nl.ipv4_routes().await?, a).and_then(|r| r.oif),
            IpAddr::V6(a) => longest_match(&self.nl.ipv6_routes().await?, a).and_then(|r| r.oif),
        }
        .ok_or_else(|| KernelError::Other(format!("no route reaches {to}")))?;
        self.nl.link_by_index(oif).await?.ok_or_else(|| {
            KernelError::Other(format!("the interface {oif} of the route to {to} vanished"))
        })
    }

    /// The underlay of a node without IPv4 (an IPv6-only cluster): the
    /// interface `how` selects, found through IPv6 routes and addresses
    /// (the IPv6 default route's, a name, the first matching one with a
    /// global or unique-local IPv6 address, or the one of the route to an
    /// IPv6 address), and its IPv6 host address as `how6` picks it (the
    /// caller refuses `off`). An error when there is none: `vxlan6.1` is
    /// all such a node has.
    pub(crate) async fn select_underlay_ipv6(
        &self,
        how: &UnderlaySelect,
        how6: &Underlay6Select,
        keep: Option<Ipv6Addr>,
    ) -> Result<Underlay6, KernelError> {
        let link = match how {
            UnderlaySelect::DefaultRoute => {
                self.default_route_link(self.nl.ipv6_routes().await?, "IPv6 default")
                    .await?
            }
            UnderlaySelect::Name(n) => self.named_underlay(n).await?,
            UnderlaySelect::Pattern(p) => {
                for l in self.pattern_candidates(p).await? {
                    match self.ipv6_host((&l.name, l.index, l.mtu), how6, keep).await {
                        Ok(Some(u)) => return Ok(u),
                        // No such IPv6 address (yet): not a candidate.
                        Ok(None) | Err(KernelError::Other(_)) => continue,
                        Err(e) => return Err(e),
                    }
                }
                return Err(KernelError::Other(format!(
                    "no interface matching {p} has a global or unique-local IPv6 address"
                )));
            }
            UnderlaySelect::CanReach(IpAddr::V6(to)) => self.link_reaching(IpAddr::V6(*to)).await?,
            UnderlaySelect::CanReach(IpAddr::V4(to)) => {
                return Err(KernelError::Other(format!(
                    "can-reach={to} is an IPv4 address, and this node has no IPv4 underlay (IPv6-only cluster): name an IPv6 one"
                )));
            }
        };
        self.ipv6_host((&link.name, link.index, link.mtu), how6, keep)
            .await?
            .ok_or_else(|| {
                KernelError::Other(format!(
                    "underlay {} has no global or unique-local IPv6 address",
                    link.name
                ))
            })
    }

    /// The IPv6 underlay on the underlay interface `underlay`, as `how`
    /// selects it; None when off or when the interface has no global
    /// (or unique-local) IPv6 address. An address still in duplicate
    /// address detection is taken only when there is no other: the kernel
    /// will not send from it until DAD is done.
    pub async fn underlay6(
        &self,
        underlay: &Underlay,
        how: &Underlay6Select,
    ) -> Result<Option<Underlay6>, KernelError> {
        self.ipv6_host((&underlay.name, underlay.index, underlay.mtu), how, None)
            .await
    }

    /// [`OverlayKernel::underlay6`] on the interface `(name, index, mtu)`;
    /// `keep`, the address in use, wins while it is still there and usable.
    async fn ipv6_host(
        &self,
        (name, index, mtu): (&str, u32, u32),
        how: &Underlay6Select,
        keep: Option<Ipv6Addr>,
    ) -> Result<Option<Underlay6>, KernelError> {
        if *how == Underlay6Select::Off {
            return Ok(None);
        }
        let mut have: Vec<_> = self
            .nl
            .ipv6_addresses(index)
            .await?
            .into_iter()
            .filter(|a| {
                let ip = a.cidr.addr();
                !ip.is_loopback() && !ip.is_unicast_link_local() && !ip.is_multicast()
            })
            .collect();
        // The kernel lists the newest address first: a VIP (kube-vip,
        // keepalived) or a renumbering would otherwise become the host IP
        // on the next re-read. The one in use stays while it is usable;
        // privacy, deprecated and DAD-failed addresses are never picked.
        have.sort_by_key(|a| (a.unstable, a.tentative, Some(a.cidr.addr()) != keep));
        let ip = match how {
            Underlay6Select::Address(want) => {
                if !have.iter().any(|a| a.cidr.addr() == *want) {
                    return Err(KernelError::Other(format!(
                        "--underlay6 {want}: not an address of the underlay {name}"
                    )));
                }
                *want
            }
            _ => match have.first().filter(|a| !a.unstable) {
                Some(a) => a.cidr.addr(),
                None => return Ok(None),
            },
        };
        Ok(Some(Underlay6 {
            name: name.to_string(),
            index,
            ip,
            mtu,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn can_reach_takes_the_longest_prefix_with_a_device() {
        let r = |dst: &str, oif: Option<u32>| Route {
            dst: dst.parse().expect("cidr"),
            gateway: None,
            oif,
            protocol: 0,
            onlink: false,
        };
        let routes = [
            r("0.0.0.0/0", Some(2)),
            r("192.168.0.0/16", Some(3)),
            r("192.168.7.0/24", None),
            r("192.168.1.0/24", Some(4)),
        ];
        let via = |a: [u8; 4]| longest_match(&routes, Ipv4Addr::from(a)).and_then(|r| r.oif);
        assert_eq!(via([192, 168, 1, 9]), Some(4));
        assert_eq!(
            via([192, 168, 7, 9]),
            Some(3),
            "a route without a device is skipped"
        );
        assert_eq!(via([8, 8, 8, 8]), Some(2));
        assert_eq!(longest_match(&routes[1..], Ipv4Addr::new(8, 8, 8, 8)), None);
    }
}
