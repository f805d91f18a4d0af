//! The agent's kernel adapter: the VXLAN device, and the routes, nexthops,
//! neighbours and FDB entries it owns on it. Thin on purpose; what to
//! change is decided by `reconcile`.
//!
//! A peer route goes through a nexthop object of its own (`ip nexthop`:
//! `via <podCIDR.0> dev vxlan.1 onlink`, or `via <host IP> dev <underlay>`
//! under direct routing) where the kernel has them: the kernel inserts
//! such routes several times faster than `via … onlink` ones, whose
//! insertion slows with every route on the device, and a changed gateway
//! is one nexthop replaced. A kernel without nexthop objects (before 5.3)
//! gets `via … onlink` routes, as before; which one is decided once, at
//! the first dump, and logged. Either way the overlay state is podCIDR ->
//! gateway: the nexthops are this adapter's business, their IDs kept in
//! `reconcile::NexthopIds`.
//!
//! Dual-stack: IPv6 pods cross the same `vxlan.1` over the same IPv4
//! underlay (`podCIDRv6 via <its first address> onlink`, a permanent IPv6
//! neighbour to the peer's one VTEP MAC, whose one FDB entry serves both
//! families), as flannel's IPv6-over-IPv4 does. An IPv6 *underlay* has a
//! VXLAN device of its own, `vxlan6.1` (flannel's `flannel-v6.1` next to
//! `flannel.1`), not `vxlan.1` over whichever family the host has: a
//! VXLAN device outside metadata mode opens a socket of one family (that
//! of its `local`/`group`; drivers/net/vxlan/vxlan_core.c,
//! `vxlan_sock_add`) and the kernel refuses FDB destinations of the
//! other, so one device cannot reach peers of both underlay families. The
//! IPv6 socket is IPv6-only, so both devices bind port 8472 (tested in
//! mycni-common/tests/netlink.rs). It also leaves `vxlan.1`, its FDB and
//! the fast path's IPv4 encapsulation unchanged on every IPv4 node. Its
//! MTU is the underlay's less 70 (`startup::VXLAN6_OVERHEAD`); peers
//! announce it with their own annotations (host IPv6 address, that
//! device's VTEP MAC), as flannel's `public-ip-v6` / `backend-v6-data`.
//! Only peers without an IPv4 underlay go through it (`peers::select_all`),
//! with onlink routes of the agent's protocol (never nexthop objects, whose
//! table is `vxlan.1`'s): `vxlan.1`'s dumps leave routes on it alone. On
//! an IPv6-only node (an IPv6-only cluster) there is no `vxlan.1`, every
//! peer goes through `vxlan6.1`, which then holds the node's IPv6 VTEP
//! address too, and the underlay is found through IPv6
//! ([`Kernel::select_underlay_ipv6`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use futures::{StreamExt, stream};
use mycni_common::netlink::{
    self, Link, Netlink, Nexthop, NexthopRoute, Route, RouteFamily, VxlanConfig,
};
use thiserror::Error;

use crate::peers::{Cidr, Mac};
use crate::reconcile::{self, Action, AnyCidr, Hop, NexthopIds, NexthopPlan, OverlayState};

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
    #[error(transparent)]
    Netlink(#[from] netlink::Error),
    #[error("{0}")]
    Other(String),
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
    /// The node's own IPv6 VTEP address (IPv6 podCIDR's first address) as
    /// a /128 without DAD, if the node has an IPv6 podCIDR.
    pub address6: Option<Ipv6Addr>,
}

/// What the VXLAN device over the IPv6 underlay (`vxlan6.1`) must look
/// like: `vxlan.1`'s VNI and port (its socket is an IPv6 one, so both bind
/// the port), its own MAC, and the MTU of an IPv6 underlay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vxlan6Spec {
    pub name: String,
    pub vni: u32,
    pub port: u16,
    pub underlay_index: u32,
    pub local_ip: Ipv6Addr,
    pub mtu: u32,
    pub mac: Mac,
    /// The node's own IPv6 VTEP address (its IPv6 podCIDR's first
    /// address) as a /128 without DAD, on a node without `vxlan.1` (an
    /// IPv6-only cluster): what the host sends to remote pods from, so
    /// their replies come back through the overlay. Elsewhere `vxlan.1`
    /// holds it, and this is None.
    pub address6: Option<Ipv6Addr>,
}

/// A VXLAN device as both families share it.
struct DeviceSpec<'a> {
    name: &'a str,
    vni: u32,
    port: u16,
    underlay_index: u32,
    local: IpAddr,
    mtu: u32,
    mac: Mac,
}

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
    pub subnets: Vec<Cidr>,
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

/// The pods on this node by address, per family (a dual-stack pod is in
/// both, with the same endpoint).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodEndpoints {
    pub v4: BTreeMap<Ipv4Addr, PodEndpoint>,
    pub v6: BTreeMap<std::net::Ipv6Addr, PodEndpoint>,
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

/// How peer routes hold their gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerRoutes {
    /// Through a nexthop object per peer (`dst nhid N`).
    Nexthops,
    /// Each route its own (`dst via gw dev vxlan.1 onlink`): the kernel
    /// has no nexthop objects.
    Onlink,
}

pub struct Kernel {
    nl: Netlink,
    /// Decided at the first dump or apply, for the agent's life.
    peer_routes: OnceLock<PeerRoutes>,
    /// The peer routes' nexthop IDs: rebuilt from the kernel at every
    /// dump, kept up to date by `apply` between dumps.
    nexthop_ids: Mutex<NexthopIds>,
    /// Whether `nexthop_ids` has been read from the kernel yet: until
    /// then it knows no other program's IDs, and must not hand any out.
    nexthop_ids_read: AtomicBool,
    /// `vxlan6.1`'s ifindex (0: none): its routes carry the agent's
    /// protocol too, and `vxlan.1`'s dumps must leave them to its own.
    vxlan6_index: AtomicU32,
}

impl Kernel {
    /// A netlink handle in the calling thread's namespace; needs a tokio runtime.
    pub fn new() -> Result<Self, KernelError> {
        Ok(Self {
            nl: Netlink::current()?,
            peer_routes: OnceLock::new(),
            nexthop_ids: Mutex::new(NexthopIds::default()),
            nexthop_ids_read: AtomicBool::new(false),
            vxlan6_index: AtomicU32::new(0),
        })
    }

    /// [`Kernel::new`], with `via … onlink` peer routes even where the
    /// kernel has nexthop objects: the fallback, for tests to run on any
    /// kernel.
    pub fn with_onlink_routes() -> Result<Self, KernelError> {
        let k = Self::new()?;
        let _ = k.peer_routes.set(PeerRoutes::Onlink);
        Ok(k)
    }

    /// How peer routes are made, asking the kernel the first time.
    pub async fn peer_routes(&self) -> Result<PeerRoutes, KernelError> {
        if let Some(m) = self.peer_routes.get() {
            return Ok(*m);
        }
        let m = if self.nl.nexthops_supported().await? {
            tracing::info!(
                "peer routes through nexthop objects, one per peer (ip nexthop list protocol {RTPROT_MYCNI_AGENT})"
            );
            PeerRoutes::Nexthops
        } else {
            tracing::warn!(
                "this kernel has no nexthop objects (Linux 5.3+): peer routes carry their gateway themselves (via … onlink), which the kernel inserts more slowly at thousands of peers"
            );
            PeerRoutes::Onlink
        };
        Ok(*self.peer_routes.get_or_init(|| m))
    }

    fn ids(&self) -> std::sync::MutexGuard<'_, NexthopIds> {
        // The table is plain data, consistent after every statement: a
        // panic elsewhere while it was held leaves nothing half-done.
        self.nexthop_ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub async fn link(&self, name: &str) -> Result<Option<Link>, KernelError> {
        Ok(self.nl.link_by_name(name).await?)
    }

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
        let addrs: Vec<Cidr> = self
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
                let mut links = self.nl.links().await?;
                links.sort_by_key(|l| l.index);
                for l in links {
                    // Our own devices and the pods' veths are never the
                    // underlay, whatever a broad pattern says.
                    if l.vxlan.is_some()
                        || l.alias.as_deref().is_some_and(is_pod_veth)
                        || !glob_match(p, &l.name)
                    {
                        continue;
                    }
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
                let mut links = self.nl.links().await?;
                links.sort_by_key(|l| l.index);
                for l in links {
                    if l.vxlan.is_some()
                        || l.alias.as_deref().is_some_and(is_pod_veth)
                        || !glob_match(p, &l.name)
                    {
                        continue;
                    }
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

    /// Creates the VXLAN device, or adopts an existing one and corrects what
    /// differs. Attributes the kernel cannot change in place (VNI, port,
    /// local IP, underlay, learning) mean delete and recreate, with the same
    /// MAC so peers' entries stay valid. Returns the index and whether it
    /// was (re)created.
    pub async fn ensure_vxlan(&self, spec: &VxlanSpec) -> Result<(u32, bool), KernelError> {
        let (index, created) = self
            .ensure_vxlan_device(&DeviceSpec {
                name: &spec.name,
                vni: spec.vni,
                port: spec.port,
                underlay_index: spec.underlay_index,
                local: spec.local_ip.into(),
                mtu: spec.mtu,
                mac: spec.mac,
            })
            .await?;
        let address = Cidr::new(spec.address, 32)
            .ok_or_else(|| KernelError::Other(format!("{}/32 is not a CIDR", spec.address)))?;
        if !self.nl.ipv4_addresses(index).await?.contains(&address) {
            match self.nl.add_address(index, address).await {
                Err(e) if !e.is_exists() => return Err(e.into()),
                _ => {}
            }
        }
        if let Some(a6) = spec.address6 {
            self.ensure_vtep6(index, &spec.name, a6).await?;
        }
        Ok((index, created))
    }

    /// The IPv6 VTEP address `a6` as the one global address of the VXLAN
    /// device `index`.
    async fn ensure_vtep6(&self, index: u32, name: &str, a6: Ipv6Addr) -> Result<(), KernelError> {
        // No DAD: the address is this node's alone on a link that has
        // no other member to ask, and DAD would hold it tentative (not
        // usable as a source) for a second or more.
        let address6 = mycni_common::net::Cidr::<Ipv6Addr>::new(a6, 128)
            .ok_or_else(|| KernelError::Other(format!("{a6}/128 is not a CIDR")))?;
        let have = self.nl.ipv6_addresses(index).await?;
        if !have.iter().any(|a| a.cidr == address6) {
            match self.nl.add_ipv6_address_nodad(index, address6).await {
                Err(e) if !e.is_exists() => return Err(e.into()),
                _ => {}
            }
        }
        // An IPv6 VTEP address of an earlier podCIDR: left, it would
        // make that range's new owner's VTEP a local address here, and
        // the kernel refuses a route through a local gateway.
        for a in have {
            if a.cidr != address6 && !a.cidr.addr().is_unicast_link_local() {
                tracing::info!(device = %name, address = %a.cidr, "removing a stale IPv6 VTEP address");
                self.nl.delete_address(index, a.cidr).await?;
            }
        }
        Ok(())
    }

    /// The device part of [`Kernel::ensure_vxlan`] and
    /// [`Kernel::ensure_vxlan6`]: created, or adopted and corrected.
    async fn ensure_vxlan_device(&self, spec: &DeviceSpec<'_>) -> Result<(u32, bool), KernelError> {
        let existing = self.link(spec.name).await?;
        let mut created = false;
        let index = match existing {
            Some(l) if device_matches(&l, spec) => l.index,
            other => {
                if let Some(l) = other {
                    tracing::warn!(device = %spec.name, "existing device differs from the wanted VXLAN setup; recreating it");
                    self.nl.delete_link(l.index).await?;
                }
                self.nl
                    .create_vxlan(&VxlanConfig {
                        name: spec.name,
                        vni: spec.vni,
                        dev: spec.underlay_index,
                        local: spec.local,
                        port: spec.port,
                        learning: false,
                        // No outer UDP checksum over IPv4 (the IPv4 default,
                        // made explicit): the tc encapsulation sends none
                        // either, and both paths must put the same bytes on
                        // the wire. Over IPv6 the attribute means nothing:
                        // the kernel sends the checksum IPv6 requires
                        // (RFC 8200 8.1) unless udp6zerocsumtx is set.
                        udp_csum: false,
                        mtu: spec.mtu,
                        mac: spec.mac,
                    })
                    .await?;
                created = true;
                self.link(spec.name)
                    .await?
                    .ok_or_else(|| {
                        KernelError::Other(format!("{} vanished after creation", spec.name))
                    })?
                    .index
            }
        };
        let l = self
            .nl
            .link_by_index(index)
            .await?
            .ok_or_else(|| KernelError::Other(format!("{} vanished", spec.name)))?;
        if l.mac != spec.mac.0 || l.mtu != spec.mtu || !l.up {
            self.nl
                .set_mac_mtu_and_up(index, spec.mac, spec.mtu)
                .await?;
        }
        Ok((index, created))
    }

    /// Creates `vxlan6.1`, the VXLAN device over the IPv6 underlay, or
    /// adopts an existing one and corrects what differs, as
    /// [`Kernel::ensure_vxlan`] does for `vxlan.1`. Routes through it name
    /// their gateway `onlink`; it carries the node's IPv6 VTEP address
    /// only where there is no `vxlan.1` to hold it (`address6`).
    pub async fn ensure_vxlan6(&self, spec: &Vxlan6Spec) -> Result<(u32, bool), KernelError> {
        let r = self
            .ensure_vxlan_device(&DeviceSpec {
                name: &spec.name,
                vni: spec.vni,
                port: spec.port,
                underlay_index: spec.underlay_index,
                local: spec.local_ip.into(),
                mtu: spec.mtu,
                mac: spec.mac,
            })
            .await?;
        self.vxlan6_index.store(r.0, Ordering::Relaxed);
        if let Some(a6) = spec.address6 {
            self.ensure_vtep6(r.0, &spec.name, a6).await?;
        }
        Ok(r)
    }

    /// What the agent owns on `vxlan6.1` (index `vxlan6`): its IPv6 routes
    /// with the agent's protocol (each `via` a gateway `onlink`, never
    /// through a nexthop object: the nexthop table is `vxlan.1`'s), its
    /// permanent IPv6 neighbours and its FDB entries.
    pub async fn dump_vxlan6(&self, vxlan6: u32) -> Result<OverlayState, KernelError> {
        let routes6 = self
            .nl
            .ipv6_routes_by_protocol(RTPROT_MYCNI_AGENT)
            .await?
            .into_iter()
            .filter(|r| r.oif == Some(vxlan6))
            .collect();
        let mut s = OverlayState {
            routes6: onlink_routes(routes6, vxlan6, 0),
            ..OverlayState::default()
        };
        for n in self.nl.permanent_ipv6_neighbours(vxlan6).await? {
            s.neighbours6.insert(n.ip, n.mac);
        }
        for e in self.nl.fdb_entries(vxlan6).await? {
            if let Some(ip) = e.dst6 {
                s.fdb6.insert(e.mac, ip);
            }
        }
        Ok(s)
    }

    /// Applies a diff of [`Kernel::dump_vxlan6`]'s state to `vxlan6.1`,
    /// as [`Kernel::apply`] does without nexthop objects. Returns the
    /// number of failed actions.
    pub async fn apply_vxlan6(&self, vxlan6: u32, actions: &[Action]) -> usize {
        let plans = BTreeMap::new();
        let (dels, sets): (Vec<&Action>, Vec<&Action>) =
            actions.iter().partition(|a| a.is_delete());
        let mut failed = 0;
        // One at a time: a few peers, and the FDB -> neighbour -> route
        // order kept by the diff's sort within each group.
        for a in dels.into_iter().chain(sets) {
            if let Err(e) = self
                .apply_one(PeerRoutes::Onlink, &plans, vxlan6, 0, a)
                .await
            {
                tracing::warn!(error = %e, device = "vxlan6", "kernel update failed");
                failed += 1;
            }
        }
        failed
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

    /// [`Kernel::underlay6`] on the interface `name` (`index`, `mtu`);
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

    /// The entries on `vxlan` that the agent owns: routes with its protocol,
    /// permanent IPv4 and IPv6 neighbours, permanent `self` FDB entries
    /// (the all-zeros default entry excluded).
    ///
    /// `underlay` is the device direct routes (gateway: a peer's host IP)
    /// leave by; 0 when direct routing is off, so any such route is stale.
    pub async fn dump(&self, vxlan: u32, underlay: u32) -> Result<OverlayState, KernelError> {
        let mut s = if self.peer_routes().await? == PeerRoutes::Nexthops {
            self.dump_nexthop_routes(vxlan, underlay).await?
        } else {
            self.dump_onlink_routes(vxlan, underlay).await?
        };
        for n in self.nl.permanent_neighbours(vxlan).await? {
            s.neighbours.insert(n.ip, n.mac);
        }
        for n in self.nl.permanent_ipv6_neighbours(vxlan).await? {
            s.neighbours6.insert(n.ip, n.mac);
        }
        for e in self.nl.fdb_entries(vxlan).await? {
            if let Some(ip) = e.dst {
                s.fdb.insert(e.mac, ip);
            }
            if let Some(ip) = e.dst6 {
                s.fdb6.insert(e.mac, ip);
            }
        }
        Ok(s)
    }

    /// `routes` without `vxlan6.1`'s.
    fn not_vxlan6<A: RouteFamily>(&self, routes: Vec<Route<A>>) -> Vec<Route<A>> {
        let v6dev = self.vxlan6_index.load(Ordering::Relaxed);
        routes
            .into_iter()
            .filter(|r| v6dev == 0 || r.oif != Some(v6dev))
            .collect()
    }

    /// The peer routes holding their gateway themselves.
    async fn dump_onlink_routes(
        &self,
        vxlan: u32,
        underlay: u32,
    ) -> Result<OverlayState, KernelError> {
        Ok(OverlayState {
            routes: onlink_routes(
                self.nl.routes_by_protocol(RTPROT_MYCNI_AGENT).await?,
                vxlan,
                underlay,
            ),
            routes6: onlink_routes(
                self.not_vxlan6(self.nl.ipv6_routes_by_protocol(RTPROT_MYCNI_AGENT).await?),
                vxlan,
                underlay,
            ),
            ..OverlayState::default()
        })
    }

    /// The peer routes through nexthops, each with its nexthop's gateway;
    /// rebuilds the ID table. Nexthops are listed before routes: one
    /// deleted in between takes its routes along, and is then simply not
    /// there, rather than a route through a nexthop never seen.
    async fn dump_nexthop_routes(
        &self,
        vxlan: u32,
        underlay: u32,
    ) -> Result<OverlayState, KernelError> {
        let (own, foreign): (Vec<Nexthop>, Vec<Nexthop>) = self
            .nl
            .nexthops()
            .await?
            .into_iter()
            .partition(|n| n.protocol == RTPROT_MYCNI_AGENT);
        let routes = self
            .nl
            .routes_with_nexthops_by_protocol(RTPROT_MYCNI_AGENT)
            .await?;
        let v6dev = self.vxlan6_index.load(Ordering::Relaxed);
        let routes6: Vec<_> = self
            .nl
            .ipv6_routes_with_nexthops_by_protocol(RTPROT_MYCNI_AGENT)
            .await?
            .into_iter()
            .filter(|(r, _)| v6dev == 0 || r.oif != Some(v6dev))
            .collect();
        let ids = NexthopIds::new(
            own.iter().map(|n| (n.id, hop_of(n, vxlan, underlay))),
            foreign.iter().map(|n| n.id),
            routes
                .iter()
                .filter_map(|(r, id)| Some((AnyCidr::from(r.dst), (*id)?)))
                .chain(
                    routes6
                        .iter()
                        .filter_map(|(r, id)| Some((AnyCidr::from(r.dst), (*id)?))),
                ),
        );
        let s = OverlayState {
            routes: nexthop_routes(&ids, &routes, |ip| match ip {
                IpAddr::V4(a) => Some(a),
                IpAddr::V6(_) => None,
            }),
            routes6: nexthop_routes(&ids, &routes6, |ip| match ip {
                IpAddr::V6(a) => Some(a),
                IpAddr::V4(_) => None,
            }),
            ..OverlayState::default()
        };
        *self.ids() = ids;
        self.nexthop_ids_read.store(true, Ordering::Relaxed);
        Ok(s)
    }

    /// Applies a diff. Deletes run first, then sets in dependency order,
    /// each group with bounded concurrency; last, nexthops of the agent's
    /// no route goes through any more are deleted. Returns the number of
    /// failed actions (each logged); a failure never stops the rest.
    pub async fn apply(&self, vxlan: u32, underlay: u32, actions: &[Action]) -> usize {
        let mode = match self.peer_routes().await {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "cannot tell whether the kernel has nexthop objects");
                return actions.len().max(1);
            }
        };
        if mode == PeerRoutes::Nexthops && !self.nexthop_ids_read.load(Ordering::Relaxed) {
            // An apply without a dump before it (the loop always dumps
            // first): read the IDs the kernel holds before handing any out.
            if let Err(e) = self.dump_nexthop_routes(vxlan, underlay).await {
                tracing::warn!(error = %e, "cannot read the nexthops");
                return actions.len().max(1);
            }
        }
        let (dels, sets): (Vec<&Action>, Vec<&Action>) =
            actions.iter().partition(|a| a.is_delete());
        let mut failed = 0;
        for group in [dels, sets] {
            // Within a group, keep FDB -> neighbour -> route order by phases.
            let mut phases: [Vec<&Action>; 3] = [vec![], vec![], vec![]];
            for a in group {
                let phase = match a {
                    Action::SetFdb(..) | Action::DelRoute(_) | Action::DelRoute6(_) => 0,
                    Action::SetNeighbour(..)
                    | Action::DelNeighbour(_)
                    | Action::SetNeighbour6(..)
                    | Action::DelNeighbour6(_) => 1,
                    Action::SetRoute(..) | Action::SetRoute6(..) | Action::DelFdb(_) => 2,
                };
                phases[phase].push(a);
            }
            for phase in phases {
                // Nexthop IDs are handed out in the diff's (podCIDR) order,
                // not in whatever order concurrent requests start: the same
                // peers get the same IDs in every run.
                let mut plans: BTreeMap<AnyCidr, (Hop, NexthopPlan)> = if mode
                    == PeerRoutes::Nexthops
                {
                    let mut ids = self.ids();
                    phase
                        .iter()
                        .filter_map(|a| {
                            let (c, hop) = match a {
                                Action::SetRoute(c, gw) => ((*c).into(), Hop::of_route(*c, *gw)),
                                Action::SetRoute6(c, gw) => ((*c).into(), Hop::of_route(*c, *gw)),
                                _ => return None,
                            };
                            Some((c, (hop, ids.plan(c, hop))))
                        })
                        .collect()
                } else {
                    BTreeMap::new()
                };
                // The nexthops first, in a few batches; a route whose
                // nexthop failed is not tried.
                let bad = self.set_nexthops(vxlan, underlay, &mut plans).await;
                failed += bad.len();
                let phase: Vec<&Action> = phase
                    .into_iter()
                    .filter(|a| match a {
                        Action::SetRoute(c, _) => !bad.contains(&(*c).into()),
                        Action::SetRoute6(c, _) => !bad.contains(&(*c).into()),
                        _ => true,
                    })
                    .collect();
                let results: Vec<Result<(), KernelError>> = stream::iter(phase)
                    .map(|a| {
                        crate::metrics::netlink_timed(
                            netlink_op(a),
                            self.apply_one(mode, &plans, vxlan, underlay, a),
                        )
                    })
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
        if mode == PeerRoutes::Nexthops {
            let unused = self.ids().take_unused();
            if !unused.is_empty() {
                tracing::info!(
                    nexthops = unused.len(),
                    "deleting nexthops no peer route goes through"
                );
            }
            for id in unused {
                if let Err(e) = self.nl.delete_nexthop(id).await {
                    tracing::warn!(error = %e, "kernel update failed");
                    failed += 1;
                }
            }
        }
        failed
    }

    /// One action; deleting what is already gone is success.
    async fn apply_one(
        &self,
        mode: PeerRoutes,
        plans: &BTreeMap<AnyCidr, (Hop, NexthopPlan)>,
        vxlan: u32,
        underlay: u32,
        a: &Action,
    ) -> Result<(), KernelError> {
        let nl = &self.nl;
        let r = match a {
            Action::SetRoute(c, gw) if mode == PeerRoutes::Nexthops => {
                let (hop, plan) = self.plan_of(plans, *c, *gw);
                return self.set_nexthop_route(vxlan, underlay, hop, plan, *c).await;
            }
            Action::SetRoute6(c, gw) if mode == PeerRoutes::Nexthops => {
                let (hop, plan) = self.plan_of(plans, *c, *gw);
                return self.set_nexthop_route(vxlan, underlay, hop, plan, *c).await;
            }
            Action::DelRoute(c) if mode == PeerRoutes::Nexthops => {
                return self.delete_nexthop_route(*c).await;
            }
            Action::DelRoute6(c) if mode == PeerRoutes::Nexthops => {
                return self.delete_nexthop_route(*c).await;
            }
            Action::SetRoute(c, gw) => {
                let route = if reconcile::via_vxlan(*c, *gw) {
                    // The gateway (the peer's podCIDR.0) is on no subnet of ours.
                    Route {
                        dst: *c,
                        gateway: Some(*gw),
                        oif: Some(vxlan).filter(|i| *i != 0),
                        protocol: RTPROT_MYCNI_AGENT,
                        onlink: true,
                    }
                } else {
                    // A peer's podCIDR straight to its host IP on the
                    // underlay (direct routing).
                    Route {
                        dst: *c,
                        gateway: Some(*gw),
                        oif: Some(underlay),
                        protocol: RTPROT_MYCNI_AGENT,
                        onlink: false,
                    }
                };
                nl.replace_route(route).await
            }
            Action::SetRoute6(c, gw) => {
                // Always through vxlan.1: see `OverlayState::routes6`.
                nl.replace_route(Route {
                    dst: *c,
                    gateway: Some(*gw),
                    oif: Some(vxlan).filter(|i| *i != 0),
                    protocol: RTPROT_MYCNI_AGENT,
                    onlink: true,
                })
                .await
            }
            // The dumped route may sit on a dead device: match by
            // destination and protocol only.
            Action::DelRoute(c) => nl.delete_route(*c, RTPROT_MYCNI_AGENT).await,
            Action::DelRoute6(c) => nl.delete_route(*c, RTPROT_MYCNI_AGENT).await,
            Action::SetNeighbour(ip, mac) => nl.replace_permanent_neighbour(vxlan, *ip, *mac).await,
            Action::SetNeighbour6(ip, mac) => {
                nl.replace_permanent_neighbour(vxlan, *ip, *mac).await
            }
            Action::DelNeighbour(ip) => nl.delete_neighbour(vxlan, *ip).await,
            Action::DelNeighbour6(ip) => nl.delete_neighbour(vxlan, *ip).await,
            Action::SetFdb(mac, ip) => nl.replace_fdb_entry(vxlan, *mac, *ip).await,
            Action::DelFdb(mac) => nl.delete_fdb_entry(vxlan, *mac).await,
        };
        Ok(r?)
    }

    /// The route to `c` through its own nexthop, holding `hop`, as `plan`
    /// says: the nexthop set first (a route cannot name a nexthop that does
    /// not exist yet), then the route, each only if the kernel does not
    /// hold it already. A host-IP change of a directly routed peer is the
    /// nexthop alone.
    async fn set_nexthop_route<A: RouteFamily>(
        &self,
        vxlan: u32,
        underlay: u32,
        hop: Hop,
        plan: NexthopPlan,
        c: mycni_common::net::Cidr<A>,
    ) -> Result<(), KernelError> {
        if plan.set_nexthop {
            self.nl
                .replace_nexthop(&nexthop(hop, plan.id, vxlan, underlay))
                .await?;
        }
        if plan.set_route {
            self.nl
                .replace_nexthop_route(NexthopRoute {
                    dst: c,
                    nhid: plan.id,
                    protocol: RTPROT_MYCNI_AGENT,
                })
                .await?;
        }
        Ok(())
    }

    /// The hop and plan of the route to `c` via `gw`: the one made for the
    /// whole phase, else one made now.
    fn plan_of<A: RouteFamily>(
        &self,
        plans: &BTreeMap<AnyCidr, (Hop, NexthopPlan)>,
        c: mycni_common::net::Cidr<A>,
        gw: A,
    ) -> (Hop, NexthopPlan)
    where
        AnyCidr: From<mycni_common::net::Cidr<A>>,
    {
        let any: AnyCidr = c.into();
        match plans.get(&any) {
            Some(p) => *p,
            None => {
                let hop = Hop::of_route(c, gw);
                (hop, self.ids().plan(any, hop))
            }
        }
    }

    /// Deletes the route to `c` and then its nexthop, which no other route
    /// goes through.
    async fn delete_nexthop_route<A: RouteFamily>(
        &self,
        c: mycni_common::net::Cidr<A>,
    ) -> Result<(), KernelError>
    where
        AnyCidr: From<mycni_common::net::Cidr<A>>,
    {
        self.nl.delete_route(c, RTPROT_MYCNI_AGENT).await?;
        let id = self.ids().release(c);
        if let Some(id) = id {
            self.nl.delete_nexthop(id).await?;
        }
        Ok(())
    }

    /// Sets the nexthops `plans` says are missing or wrong, a datagram of
    /// them at a time (5,000 peers at start-up), and marks them done.
    /// Returns the podCIDRs whose nexthop failed, each logged.
    async fn set_nexthops(
        &self,
        vxlan: u32,
        underlay: u32,
        plans: &mut BTreeMap<AnyCidr, (Hop, NexthopPlan)>,
    ) -> BTreeSet<AnyCidr> {
        let wanted: Vec<Nexthop> = plans
            .values()
            .filter(|(_, p)| p.set_nexthop)
            .map(|(hop, p)| nexthop(*hop, p.id, vxlan, underlay))
            .collect();
        if wanted.is_empty() {
            return BTreeSet::new();
        }
        let failed: BTreeSet<u32> = match self.nl.replace_nexthops(&wanted).await {
            Ok(failed) => failed
                .into_iter()
                .map(|(id, e)| {
                    tracing::warn!(error = %e, "kernel update failed");
                    id
                })
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "kernel update failed");
                wanted.iter().map(|n| n.id).collect()
            }
        };
        // 0: a failure whose echo did not say which: none can be trusted.
        let all_bad = failed.contains(&0);
        let mut bad = BTreeSet::new();
        for (c, (_, p)) in plans.iter_mut().filter(|(_, (_, p))| p.set_nexthop) {
            if all_bad || failed.contains(&p.id) {
                bad.insert(*c);
            } else {
                p.set_nexthop = false;
            }
        }
        bad
    }

    /// Deletes every nexthop of the agent's (and with them the routes
    /// through them), for `uninstall`: deleting `vxlan.1` takes only those
    /// on it along, not a directly routed peer's on the underlay.
    pub async fn delete_nexthops(&self) -> Result<(), KernelError> {
        if !self.nl.nexthops_supported().await? {
            return Ok(());
        }
        for n in self.nl.nexthops_by_protocol(RTPROT_MYCNI_AGENT).await? {
            self.nl.delete_nexthop(n.id).await?;
        }
        Ok(())
    }

    /// The pods on this node as the kernel holds them: every /32 and /128
    /// host route the plugin installed, through a host veth the plugin
    /// marked, with the veth's MAC and the MAC of its peer (the pod's eth0),
    /// read through the peer's netns id. Entries the kernel cannot fully
    /// back are left out.
    pub async fn pod_endpoints(&self) -> Result<PodEndpoints, KernelError> {
        struct Veth {
            mac: Mac,
            peer: Option<(u32, i32)>,
        }
        let mut veths: BTreeMap<u32, Veth> = BTreeMap::new();
        for l in self.nl.links().await? {
            if !l.alias.as_deref().is_some_and(is_pod_veth) {
                continue;
            }
            if let Some(mac) = l.ethernet_mac() {
                veths.insert(
                    l.index,
                    Veth {
                        mac,
                        peer: l.peer_index.zip(l.peer_netns_id),
                    },
                );
            }
        }
        let pods4: Vec<(Ipv4Addr, u32)> = self
            .nl
            .routes_by_protocol(RTPROT_MYCNI_PLUGIN)
            .await?
            .into_iter()
            .filter(|r| r.dst.prefix() == 32)
            .filter_map(|r| Some((r.dst.addr(), r.oif?)))
            .collect();
        let pods6: Vec<(std::net::Ipv6Addr, u32)> = self
            .nl
            .ipv6_routes_by_protocol(RTPROT_MYCNI_PLUGIN)
            .await?
            .into_iter()
            .filter(|r| r.dst.prefix() == 128)
            .filter_map(|r| Some((r.dst.addr(), r.oif?)))
            .collect();
        // One look into the pod's netns per veth, whatever its families.
        let mut endpoints: BTreeMap<u32, Option<PodEndpoint>> = BTreeMap::new();
        for oif in pods4.iter().map(|p| p.1).chain(pods6.iter().map(|p| p.1)) {
            if endpoints.contains_key(&oif) {
                continue;
            }
            let Some(v) = veths.get(&oif) else { continue };
            let Some((peer, nsid)) = v.peer else { continue };
            // None: the pod's netns is going away, and so is the endpoint.
            let pod_mac = self
                .nl
                .link_in_peer_netns(nsid, peer)
                .await?
                .and_then(|l| l.ethernet_mac());
            endpoints.insert(
                oif,
                pod_mac.map(|pod_mac| PodEndpoint {
                    ifindex: oif,
                    host_mac: v.mac,
                    pod_mac,
                }),
            );
        }
        let of = |oif: &u32| endpoints.get(oif).copied().flatten();
        Ok(PodEndpoints {
            v4: pods4
                .iter()
                .filter_map(|(ip, oif)| Some((*ip, of(oif)?)))
                .collect(),
            v6: pods6
                .iter()
                .filter_map(|(ip, oif)| Some((*ip, of(oif)?)))
                .collect(),
        })
    }

    pub async fn del_link(&self, index: u32) -> Result<(), KernelError> {
        Ok(self.nl.delete_link(index).await?)
    }
}

/// The nexthop holding `hop`, as the agent makes it.
fn nexthop(hop: Hop, id: u32, vxlan: u32, underlay: u32) -> Nexthop {
    let oif = if hop.direct { underlay } else { vxlan };
    Nexthop {
        id,
        gateway: Some(hop.gateway),
        oif: Some(oif).filter(|i| *i != 0),
        protocol: RTPROT_MYCNI_AGENT,
        // The gateway (the peer's podCIDR.0) is on no subnet of vxlan.1; a
        // direct peer's host IP is on the underlay's.
        onlink: !hop.direct,
    }
}

/// What one of the agent's nexthops holds, if it is one the agent would
/// make on today's devices: onlink through `vxlan`, or over `underlay` (0:
/// direct routing off).
fn hop_of(n: &Nexthop, vxlan: u32, underlay: u32) -> Option<Hop> {
    let gateway = n.gateway?;
    let direct = match n.oif? {
        i if i == vxlan && i != 0 && n.onlink => false,
        i if i == underlay && i != 0 && !n.onlink => true,
        _ => return None,
    };
    Some(Hop { gateway, direct })
}

/// The peer routes of one family holding their gateway themselves, as the
/// overlay state has them: a route on a device that is gone or replaced
/// has the unspecified gateway (stale: the diff sets it again).
fn onlink_routes<A: RouteFamily>(
    routes: Vec<Route<A>>,
    vxlan: u32,
    underlay: u32,
) -> BTreeMap<mycni_common::net::Cidr<A>, A> {
    let mut out = BTreeMap::new();
    for r in routes {
        // The agent makes no default route (and no route without a
        // gateway): such a route with its protocol is not one of its.
        let Some(g) = r.gateway.filter(|_| r.dst.prefix() != 0) else {
            continue;
        };
        let dev = if reconcile::via_vxlan(r.dst, g) {
            vxlan
        } else {
            underlay
        };
        if dev != 0 && r.oif == Some(dev) {
            out.insert(r.dst, g);
        } else {
            out.insert(r.dst, A::UNSPECIFIED);
        }
    }
    out
}

/// The peer routes of one family through nexthops, each with its
/// nexthop's gateway (`family` picks it out of an `IpAddr`), as the
/// overlay state has them.
fn nexthop_routes<A: RouteFamily>(
    ids: &NexthopIds,
    routes: &[(Route<A>, Option<u32>)],
    family: impl Fn(IpAddr) -> Option<A>,
) -> BTreeMap<mycni_common::net::Cidr<A>, A>
where
    AnyCidr: From<mycni_common::net::Cidr<A>>,
{
    let mut out = BTreeMap::new();
    for (r, nhid) in routes {
        // The agent makes no default route: one with its protocol is
        // not one of its.
        if r.dst.prefix() == 0 {
            continue;
        }
        let gw = match ids.route(r.dst) {
            Some((_, Some(hop)))
                if family(hop.gateway).is_some_and(|g| hop == Hop::of_route(r.dst, g)) =>
            {
                family(hop.gateway).unwrap_or(A::UNSPECIFIED)
            }
            // Through a nexthop of the agent's holding what it would
            // not make, through another program's (or one another
            // route claimed), or holding its gateway itself (made
            // before nexthops, or by an agent that fell back): set
            // again, through a nexthop of its own.
            Some(_) => A::UNSPECIFIED,
            None if nhid.is_some() || r.gateway.is_some() => A::UNSPECIFIED,
            // Without gateway or nexthop: not one of the agent's.
            None => continue,
        };
        out.insert(r.dst, gw);
    }
    out
}

fn device_matches(l: &Link, spec: &DeviceSpec<'_>) -> bool {
    let Some(v) = &l.vxlan else {
        return false;
    };
    let local = match spec.local {
        IpAddr::V4(a) => v.local == Some(a) && v.local6.is_none(),
        IpAddr::V6(a) => v.local6 == Some(a) && v.local.is_none(),
    };
    v.vni == Some(spec.vni)
        && local
        && v.port == Some(spec.port)
        && v.learning == Some(false)
        && v.dev == Some(spec.underlay_index)
        && v.udp_csum != Some(true)
}

/// The `mycni_netlink_op_duration_seconds` series the request applying
/// `a` is timed into: one per kind of request, for both families.
fn netlink_op(a: &Action) -> crate::metrics::NetlinkOp {
    use crate::metrics::NetlinkOp;
    match a {
        Action::SetRoute(..) | Action::SetRoute6(..) => NetlinkOp::RouteSet,
        Action::DelRoute(_) | Action::DelRoute6(_) => NetlinkOp::RouteDel,
        Action::SetNeighbour(..) | Action::SetNeighbour6(..) => NetlinkOp::NeighbourSet,
        Action::DelNeighbour(_) | Action::DelNeighbour6(_) => NetlinkOp::NeighbourDel,
        Action::SetFdb(..) => NetlinkOp::FdbSet,
        Action::DelFdb(_) => NetlinkOp::FdbDel,
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
        let r = |dst: &str, oif: Option<u32>| netlink::Route {
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
