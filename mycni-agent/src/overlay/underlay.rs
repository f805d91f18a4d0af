//! The underlay: how `--iface` and `--underlay6` select it, and finding it
//! in the kernel (the interface, its host address of each family, its MTU
//! and subnets).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use mycni_common::net::Cidr4;
use mycni_common::netlink::{Link, Route, RouteFamily};

use crate::kernel::{KernelError, is_pod_veth};

use super::kernel::OverlayKernel;

/// The IPv6 underlay: the underlay interface's IPv6 host address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Underlay6 {
    pub name: String,
    pub index: u32,
    pub ip: Ipv6Addr,
    pub mtu: u32,
}

/// Which IPv6 address of the underlay interface `vxlan6.1` sends from
/// (`--underlay6`, ConfigMap key `underlay6`): `auto` (its first global
/// or unique-local one, if it has any), `off`, or one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Underlay6Select {
    #[default]
    Auto,
    Off,
    Address(Ipv6Addr),
}

impl std::str::FromStr for Underlay6Select {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "" | "auto" => Ok(Self::Auto),
            "off" => Ok(Self::Off),
            a => match a.parse::<Ipv6Addr>() {
                Ok(ip)
                    if !ip.is_unspecified()
                        && !ip.is_loopback()
                        && !ip.is_multicast()
                        && !ip.is_unicast_link_local()
                        && ip.to_ipv4_mapped().is_none() =>
                {
                    Ok(Self::Address(ip))
                }
                _ => Err(format!(
                    "{a:?}: not auto, off or a global or unique-local IPv6 address"
                )),
            },
        }
    }
}

impl std::fmt::Display for Underlay6Select {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Off => f.write_str("off"),
            Self::Address(a) => write!(f, "{a}"),
        }
    }
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

/// How the underlay interface is chosen (`--iface`, ConfigMap key
/// `underlay`). The forms follow Calico's IP autodetection methods, the ones
/// operators already know: an exact name, a name pattern, or the interface
/// the node would use to reach an address.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum UnderlaySelect {
    /// The interface of the default route.
    #[default]
    DefaultRoute,
    /// Exactly this interface.
    Name(String),
    /// The first interface (lowest ifindex) whose name matches this glob
    /// (`*`, `?`) and has an IPv4 address (on an IPv6-only node: a global
    /// or unique-local IPv6 one): `interface=eth*`.
    Pattern(String),
    /// The interface of the most specific route to this address:
    /// `can-reach=192.168.1.1`, `can-reach=fd00:77::1`.
    CanReach(IpAddr),
}

/// Linux's IFNAMSIZ less the terminating NUL.
const MAX_IFNAME: usize = 15;

impl std::str::FromStr for UnderlaySelect {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let valid_name_chars = |n: &str| {
            !n.is_empty()
                && n.len() <= MAX_IFNAME
                && !n.contains(['/', ':', '='])
                && !n.chars().any(char::is_whitespace)
        };
        if let Some(glob) = s.strip_prefix("interface=") {
            if !valid_name_chars(glob) {
                return Err(format!(
                    "interface={glob:?}: the pattern must be 1 to {MAX_IFNAME} characters of an interface name, with * and ? as wildcards"
                ));
            }
            return Ok(Self::Pattern(glob.to_string()));
        }
        if let Some(addr) = s.strip_prefix("can-reach=") {
            return addr
                .parse::<IpAddr>()
                .map(Self::CanReach)
                .map_err(|_| format!("can-reach={addr:?}: not an IPv4 or IPv6 address"));
        }
        if s.is_empty() || s == "default-route" {
            return Ok(Self::DefaultRoute);
        }
        if !valid_name_chars(s) || s.contains(['*', '?']) {
            return Err(format!(
                "{s:?} is not an interface name; use a name (eth0), interface=<pattern> (interface=en*), can-reach=<address> or default-route"
            ));
        }
        Ok(Self::Name(s.to_string()))
    }
}

impl std::fmt::Display for UnderlaySelect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::DefaultRoute => f.write_str("default-route"),
            Self::Name(n) => f.write_str(n),
            Self::Pattern(p) => write!(f, "interface={p}"),
            Self::CanReach(a) => write!(f, "can-reach={a}"),
        }
    }
}

/// Shell-style matching of `*` (any run) and `?` (one character), enough
/// for interface names; no character classes.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni) = (0, 0);
    // The last `*` seen and the name position it was tried at: on a
    // mismatch, let that star swallow one more character.
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ni));
                pi += 1;
            }
            Some(c) if *c == '?' || *c == n[ni] => {
                pi += 1;
                ni += 1;
            }
            _ => match star {
                Some((sp, sn)) => {
                    pi = sp + 1;
                    ni = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// The route `ip route get` would most likely pick for `to` without policy
/// rules: the longest prefix that covers it among routes with a device.
pub fn longest_match<A: RouteFamily>(routes: &[Route<A>], to: A) -> Option<&Route<A>> {
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
    pub async fn select_underlay(&self, how: &UnderlaySelect) -> Result<Underlay, KernelError> {
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
    pub async fn select_underlay_ipv6(
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
                    match self.ipv6_host(&l.name, l.index, l.mtu, how6, keep).await {
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
        self.ipv6_host(&link.name, link.index, link.mtu, how6, keep)
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
        self.ipv6_host(&underlay.name, underlay.index, underlay.mtu, how, None)
            .await
    }

    /// [`OverlayKernel::underlay6`] on the interface `name` (`index`, `mtu`);
    /// `keep`, the address in use, wins while it is still there and usable.
    async fn ipv6_host(
        &self,
        name: &str,
        index: u32,
        mtu: u32,
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
    fn underlay_selection_parses_each_form() {
        let parse = |s: &str| s.parse::<UnderlaySelect>();
        assert_eq!(parse("eth0"), Ok(UnderlaySelect::Name("eth0".into())));
        assert_eq!(parse(""), Ok(UnderlaySelect::DefaultRoute));
        assert_eq!(parse("default-route"), Ok(UnderlaySelect::DefaultRoute));
        assert_eq!(
            parse("interface=en*"),
            Ok(UnderlaySelect::Pattern("en*".into()))
        );
        assert_eq!(
            parse("can-reach=192.168.1.1"),
            Ok(UnderlaySelect::CanReach(
                Ipv4Addr::new(192, 168, 1, 1).into()
            ))
        );
        assert_eq!(
            parse("can-reach=fd00:77::1"),
            Ok(UnderlaySelect::CanReach(
                "fd00:77::1".parse::<IpAddr>().expect("ip")
            ))
        );
        for bad in [
            "can-reach=example.com",
            "can-reach=10.0.0.0/8",
            "interface=",
            "eth*",
            "a-name-longer-than-15",
            "eth 0",
            "first-found=1",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
        for s in [
            "eth0",
            "interface=en*",
            "can-reach=10.0.0.1",
            "can-reach=fd00:77::1",
            "default-route",
        ] {
            assert_eq!(parse(s).map(|u| u.to_string()).as_deref(), Ok(s));
        }
    }

    #[test]
    fn glob_matches_like_a_shell() {
        for (p, n, want) in [
            ("eth*", "eth0", true),
            ("eth*", "eth", true),
            ("eth*", "ens3", false),
            ("en*", "enp0s3", true),
            ("e?h0", "eth0", true),
            ("*0", "bond0", true),
            ("*0", "bond1", false),
            ("*", "anything", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
            ("eth0", "eth0", true),
            ("eth0", "eth01", false),
        ] {
            assert_eq!(glob_match(p, n), want, "{p} vs {n}");
        }
    }

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
