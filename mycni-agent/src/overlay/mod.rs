//! The overlay: the VXLAN devices, and the routes, nexthops, neighbours
//! and FDB entries the agent owns on them for its peers.
//!
//! Pure (tested without root): `state` (what the overlay holds),
//! `desired` (what the peers want, and the diff: the only place that
//! decides what to add, replace or delete), `nexthop_ids`. The kernel
//! adapter ([`OverlayKernel`]) is thin on purpose: `underlay` finds the
//! underlay, `device` makes the VXLAN devices, `dump` reads the state back,
//! `apply` writes a diff.
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
//! [`NexthopIds`].
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
//! MTU is the underlay's less 70 (`start::VXLAN6_OVERHEAD`); peers
//! announce it with their own annotations (host IPv6 address, that
//! device's VTEP MAC), as flannel's `public-ip-v6` / `backend-v6-data`.
//! Only peers without an IPv4 underlay go through it (`peers::select_all`),
//! with onlink routes of the agent's protocol (never nexthop objects, whose
//! table is `vxlan.1`'s): `vxlan.1`'s dumps leave routes on it alone. On
//! an IPv6-only node (an IPv6-only cluster) there is no `vxlan.1`, every
//! peer goes through `vxlan6.1`, which then holds the node's IPv6 VTEP
//! address too, and the underlay is found through IPv6
//! ([`OverlayKernel::select_underlay_ipv6`]).

mod apply;
mod desired;
mod device;
mod dump;
mod incremental;
mod kernel;
pub mod metrics;
mod nexthop_ids;
mod room;
pub mod start;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_incremental;
mod underlay;

pub use desired::{apply, desired, desired_direct, diff};
pub(crate) use incremental::{Desire, Inputs, Update};
pub use kernel::{OverlayKernel, PeerRoutes};
pub use nexthop_ids::NEXTHOP_ID_BASE;
pub(crate) use room::{Device, OverlayRoom, UnderlayChange};
pub use underlay::{Underlay, Underlay6};
