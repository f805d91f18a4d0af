//! What the VXLAN devices must look like: the overlay makes them, the
//! datapath encapsulates for them, the kernel watch tells their events.

use std::net::{Ipv4Addr, Ipv6Addr};

use mycni_common::net::Mac;

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
