//! The overlay's state, as the kernel holds it or as the peers want it,
//! and the actions that turn one into the other.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use mycni_common::net::{Cidr, Cidr4, Cidr6, Family, Mac};

/// What the agent owns on `vxlan.1` for its peers. Routes are keyed by
/// destination, neighbours by IP, FDB entries by MAC: one value each, so a
/// changed MAC, host IP or podCIDR shows up as a replace or delete+add.
///
/// IPv6 has maps of its own rather than IPv4's holding `IpAddr`s: a route
/// and its gateway are always of one family, which the types then keep,
/// and IPv4 readers (the fast path's maps) need no family checks. Both
/// families share the FDB: the underlay is IPv4, one VTEP MAC per peer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OverlayState {
    /// podCIDR -> gateway: podCIDR.0 `onlink` via vxlan.1, or, for a peer
    /// on a directly connected underlay subnet under direct routing, the
    /// peer's host IP via the underlay device (no encapsulation).
    pub routes: BTreeMap<Cidr4, Ipv4Addr>,
    /// gateway -> VTEP MAC, permanent.
    pub neighbours: BTreeMap<Ipv4Addr, Mac>,
    /// VTEP MAC -> host IP, permanent `self` FDB entry.
    pub fdb: BTreeMap<Mac, Ipv4Addr>,
    /// IPv6 podCIDR -> the peer's IPv6 VTEP address (its podCIDR's first
    /// address), `onlink` via vxlan.1, always: direct routing would need
    /// the peer's IPv6 address on the underlay, which an IPv4 underlay
    /// does not have.
    pub routes6: BTreeMap<Cidr6, Ipv6Addr>,
    /// IPv6 VTEP address -> VTEP MAC, permanent (the peer's one MAC).
    pub neighbours6: BTreeMap<Ipv6Addr, Mac>,
    /// VTEP MAC -> IPv6 host address: the FDB of `vxlan6.1`, the device
    /// over the IPv6 underlay, whose state is an `OverlayState` of its own
    /// (routes6, neighbours6 and this; `vxlan.1`'s never has any).
    pub fdb6: BTreeMap<Mac, Ipv6Addr>,
}

/// A peer podCIDR as the kernel backs it, for the fast path's maps: a
/// route through `vxlan.1` whose gateway has a neighbour whose MAC has an
/// FDB entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Remote<A: Family> {
    pub pod_cidr: Cidr<A>,
    pub vtep_mac: Mac,
    /// Where VXLAN to it goes (IPv4 underlay).
    pub host_ip: Ipv4Addr,
}

impl OverlayState {
    /// Makes the entries of `self` whose keys `keys` has (its values are
    /// not read) what `want` holds for them, present or absent; whether
    /// any changed. When `self` and `want` differ only within `keys` (an
    /// incremental pass's `touched`), `self` equals `want` after, at the
    /// cost of those keys alone.
    pub(crate) fn follow_within(&mut self, want: &OverlayState, keys: &OverlayState) -> bool {
        fn follow<K: Ord + Clone, V: PartialEq + Clone, W>(
            have: &mut BTreeMap<K, V>,
            want: &BTreeMap<K, V>,
            keys: &BTreeMap<K, W>,
        ) -> bool {
            let mut changed = false;
            for k in keys.keys() {
                match want.get(k) {
                    Some(v) if have.get(k) != Some(v) => {
                        have.insert(k.clone(), v.clone());
                        changed = true;
                    }
                    Some(_) => {}
                    None => changed |= have.remove(k).is_some(),
                }
            }
            changed
        }
        // Each map in turn (no short circuit): all of them follow.
        let r = follow(&mut self.routes, &want.routes, &keys.routes);
        let n = follow(&mut self.neighbours, &want.neighbours, &keys.neighbours);
        let f = follow(&mut self.fdb, &want.fdb, &keys.fdb);
        let r6 = follow(&mut self.routes6, &want.routes6, &keys.routes6);
        let n6 = follow(&mut self.neighbours6, &want.neighbours6, &keys.neighbours6);
        let f6 = follow(&mut self.fdb6, &want.fdb6, &keys.fdb6);
        r | n | f | r6 | n6 | f6
    }

    /// The IPv6 podCIDRs of peers as the kernel backs them (route, then
    /// neighbour, then FDB entry): what the fast path may forward IPv6 to
    /// itself, as it does for `routes` through vxlan.1.
    pub(crate) fn remotes6(&self) -> Vec<Remote<Ipv6Addr>> {
        self.routes6
            .iter()
            .filter_map(|(c, gw)| {
                let mac = *self.neighbours6.get(gw)?;
                let host = *self.fdb.get(&mac)?;
                Some(Remote {
                    pod_cidr: *c,
                    vtep_mac: mac,
                    host_ip: host,
                })
            })
            .collect()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Action {
    // Deletes sort first: a podCIDR moving between nodes must free the old
    // entries before the new ones claim them.
    DelRoute(Cidr4),
    DelRoute6(Cidr6),
    DelNeighbour(Ipv4Addr),
    DelNeighbour6(Ipv6Addr),
    DelFdb(Mac),
    /// Add or replace (NLM_F_REPLACE semantics). The host address is of
    /// the device's underlay family.
    SetFdb(Mac, IpAddr),
    SetNeighbour(Ipv4Addr, Mac),
    SetNeighbour6(Ipv6Addr, Mac),
    SetRoute(Cidr4, Ipv4Addr),
    SetRoute6(Cidr6, Ipv6Addr),
}

impl Action {
    pub fn is_delete(&self) -> bool {
        matches!(
            self,
            Action::DelRoute(_)
                | Action::DelRoute6(_)
                | Action::DelNeighbour(_)
                | Action::DelNeighbour6(_)
                | Action::DelFdb(_)
        )
    }
}

/// Whether a route of [`OverlayState::routes`] (or `routes6`) goes
/// through `vxlan.1` (gateway podCIDR.0) rather than straight over the
/// underlay.
pub(crate) fn via_vxlan<A: Family>(cidr: Cidr<A>, gw: A) -> bool {
    gw == cidr.network()
}
