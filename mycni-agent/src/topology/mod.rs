//! What the overlay publishes and the rooms after it read: the VXLAN
//! devices' spec, the state the overlay holds for its peers (podCIDR ->
//! gateway, neighbours, FDB), the devices and state after a pass
//! ([`Output`]), and how the underlay is chosen. The overlay room writes
//! them; the datapath and the kernel watch only read them.

mod device;
mod select;
mod state;

pub(crate) use device::Vxlan6Spec;
pub use device::VxlanSpec;
pub(crate) use select::glob_match;
pub use select::{Underlay6Select, UnderlaySelect};
pub use state::{Action, OverlayState};
pub(crate) use state::{Remote, via_vxlan};

use mycni_common::net::Mac;

/// What an IPv6-only node says where an operator looks (logs, readiness,
/// `inspect`): it has no `vxlan.1`, by design.
pub(crate) const IPV6_ONLY: &str = "no IPv4 underlay: IPv6-only node";

/// What the rooms after the overlay read of it: its devices and what
/// the kernel holds on them after the pass.
#[derive(Debug, Clone, Copy)]
pub struct Output<'a> {
    /// `vxlan.1` (None on an IPv6-only node) and its ifindex (0: none).
    pub vxlan: Option<&'a VxlanSpec>,
    pub index: u32,
    pub state: &'a OverlayState,
    /// `vxlan6.1`'s ifindex, MAC and state, on a node with an IPv6
    /// underlay.
    pub vxlan6: Option<(u32, Mac, &'a OverlayState)>,
    /// A full pass, or a device was recreated: everything is re-read.
    pub full: bool,
    /// Kernel updates that failed: the state is then not what the kernel
    /// holds, and the rooms that mirror it wait for the next pass.
    pub failed: usize,
}
