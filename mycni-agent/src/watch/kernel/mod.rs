//! Kernel notifications, so the agent acts within milliseconds instead of
//! at the next full pass: pods that came or went (the fast path learns
//! them), the agent's own overlay state changed under it (drift, repaired
//! at once), and the underlay changed (a new host IP to move `vxlan.1` to
//! and publish).
//!
//! Pods: the plugin's ADD ends with the pod's /32 host route (protocol
//! 109), and a pod's host veth carries the plugin's alias; DEL removes the
//! veth, and the kernel flushes its routes without a notification, so both
//! routes and links are watched.
//!
//! Drift: a notification is compared with what the loop last asked of the
//! kernel ([`Expected`], set at the start of every pass). One that agrees is
//! the agent's own write (or harmless) and wakes nothing, so the agent's
//! writes never feed back into passes; one that disagrees (a route of a
//! peer deleted or replaced with another gateway, a neighbour or FDB entry
//! deleted or given another MAC or host, `vxlan.1` deleted, renamed,
//! brought down or given another MAC, MTU or address) wakes a full pass.
//! Deleting a nexthop removes its routes without a route notification,
//! so nexthops are watched too. A notification about state the loop no
//! longer wants (its own deletions) wakes nothing. A race (a notification
//! of the previous pass's write read after the next pass changed its mind)
//! costs at most one pass that finds nothing to do and writes nothing.
//!
//! IPv6: the agent's IPv6 routes, neighbours and `vxlan.1`'s IPv6 VTEP
//! address are watched as their IPv4 twins are. Other IPv6 addresses and
//! routes wake nothing: the underlay is IPv4, and every pod veth brings a
//! link-local address and an `fe80::/64` route that must not cost a pass.
//! On an IPv6-only node (no `vxlan.1`) the underlay is IPv6: an IPv6
//! address or main-table route that is not link-local and not the
//! agent's wakes the underlay re-read as IPv4 ones do elsewhere, and
//! `vxlan6.1`'s IPv6 VTEP address removed wakes a full pass.
//!
//! Underlay: an IPv4 address added or removed anywhere but `vxlan.1`, a
//! route of the main table that is neither the agent's nor the plugin's
//! (the default route, the route `can-reach` follows), or a change to the
//! underlay link (or one `--iface` names or matches) may change which
//! interface and address the underlay is. That wakes a re-read of the
//! underlay only, which costs three small dumps and writes nothing unless
//! it moved.
//!
//! A burst of events (each veth change notifies; 100 pods starting at
//! once; a flush of 5,000 routes) wakes the loop once per debounce window,
//! and a pass still running when more come is followed by exactly one more
//! (a `Notify` holds at most one permit).
//!
//! - `classify`: what a notification means (pure, tested with built
//!   messages);
//! - `watched`: what it is judged against ([`Watched`], [`Expected`]) and
//!   the loop's wake-ups ([`Signals`]);
//! - `socket`: the rtnetlink socket and its task; `pins`: the watch on the
//!   fast path's pin directory.

use std::time::Duration;

mod classify;
mod pins;
mod socket;
#[cfg(test)]
mod tests;
mod watched;

pub(crate) use pins::spawn_pins;
pub use socket::spawn;
pub(crate) use watched::Signals;
pub use watched::{Expected, Watched};

/// How long events are collected after the first before waking the loop:
/// long enough to fold one plugin ADD's few notifications and a burst of
/// parallel ADDs into one pass, short next to the pass itself.
pub(crate) const DEBOUNCE: Duration = Duration::from_millis(5);
