//! Desired overlay state from the peers, and the diff against what the
//! kernel holds, as pure functions: the only place that decides what to
//! add, replace or delete.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use mycni_common::net::Family;

use crate::peers::{Cidr, Cidr6, Mac, Peer, Peer6};

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
    pub routes: BTreeMap<Cidr, Ipv4Addr>,
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
    pub pod_cidr: mycni_common::net::Cidr<A>,
    pub vtep_mac: Mac,
    /// Where VXLAN to it goes (IPv4 underlay).
    pub host_ip: Ipv4Addr,
}

impl OverlayState {
    /// The IPv6 podCIDRs of peers as the kernel backs them (route, then
    /// neighbour, then FDB entry): what the fast path may forward IPv6 to
    /// itself, as it does for `routes` through vxlan.1.
    pub fn remotes6(&self) -> Vec<Remote<Ipv6Addr>> {
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
    DelRoute(Cidr),
    DelRoute6(Cidr6),
    DelNeighbour(Ipv4Addr),
    DelNeighbour6(Ipv6Addr),
    DelFdb(Mac),
    /// Add or replace (NLM_F_REPLACE semantics). The host address is of
    /// the device's underlay family.
    SetFdb(Mac, IpAddr),
    SetNeighbour(Ipv4Addr, Mac),
    SetNeighbour6(Ipv6Addr, Mac),
    SetRoute(Cidr, Ipv4Addr),
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

pub fn desired(peers: &[Peer]) -> OverlayState {
    desired_direct(peers, &[])
}

/// [`desired`] under direct routing (flannel's DirectRouting, Calico's
/// CrossSubnet): a peer whose host IP lies in one of `direct` (the
/// underlay's own subnets) is routed straight to its host IP. Its FDB entry
/// stays, so VXLAN it still sends (a peer not in direct mode) is accepted.
pub fn desired_direct(peers: &[Peer], direct: &[Cidr]) -> OverlayState {
    let mut s = OverlayState::default();
    for p in peers {
        if direct.iter().any(|d| d.contains(p.host_ip)) {
            s.routes.insert(p.pod_cidr, p.host_ip);
        } else {
            s.routes.insert(p.pod_cidr, p.gateway());
            s.neighbours.insert(p.gateway(), p.vtep_mac);
        }
        if let Some(c6) = p.pod_cidr6 {
            s.routes6.insert(c6, c6.network());
            s.neighbours6.insert(c6.network(), p.vtep_mac);
        }
        s.fdb.insert(p.vtep_mac, p.host_ip);
    }
    s
}

/// What the agent owns on `vxlan6.1` for the peers reached over the IPv6
/// underlay: per peer, its IPv6 podCIDR `via` its first address `onlink`,
/// a permanent neighbour for that address to its `vxlan6.1` MAC, and the
/// FDB entry sending that MAC to its IPv6 host address: `vxlan.1`'s IPv6
/// side, over the other device.
pub fn desired_underlay6(peers: &[Peer6]) -> OverlayState {
    let mut s = OverlayState::default();
    for p in peers {
        let gw = p.pod_cidr6.network();
        s.routes6.insert(p.pod_cidr6, gw);
        s.neighbours6.insert(gw, p.underlay6.vtep_mac);
        s.fdb6.insert(p.underlay6.vtep_mac, p.underlay6.host_ip);
    }
    s
}

/// Whether a route of [`OverlayState::routes`] (or `routes6`) goes
/// through `vxlan.1` (gateway podCIDR.0) rather than straight over the
/// underlay.
pub fn via_vxlan<A: Family>(cidr: mycni_common::net::Cidr<A>, gw: A) -> bool {
    gw == cidr.network()
}

fn diff_map<K: Ord + Clone, V: PartialEq + Clone>(
    want: &BTreeMap<K, V>,
    have: &BTreeMap<K, V>,
    del: impl Fn(K) -> Action,
    set: impl Fn(K, V) -> Action,
    out: &mut Vec<Action>,
) {
    for k in have.keys() {
        if !want.contains_key(k) {
            out.push(del(k.clone()));
        }
    }
    for (k, v) in want {
        if have.get(k) != Some(v) {
            out.push(set(k.clone(), v.clone()));
        }
    }
}

/// The actions that turn `have` into `want`, deletes first, FDB before
/// neighbours before routes on the way in (the route's gateway resolves
/// through the neighbour, whose MAC resolves through the FDB).
pub fn diff(want: &OverlayState, have: &OverlayState) -> Vec<Action> {
    let mut out = Vec::new();
    diff_map(
        &want.routes,
        &have.routes,
        Action::DelRoute,
        Action::SetRoute,
        &mut out,
    );
    diff_map(
        &want.neighbours,
        &have.neighbours,
        Action::DelNeighbour,
        Action::SetNeighbour,
        &mut out,
    );
    diff_map(
        &want.fdb,
        &have.fdb,
        Action::DelFdb,
        |m, ip| Action::SetFdb(m, ip.into()),
        &mut out,
    );
    diff_map(
        &want.fdb6,
        &have.fdb6,
        Action::DelFdb,
        |m, ip| Action::SetFdb(m, ip.into()),
        &mut out,
    );
    diff_map(
        &want.routes6,
        &have.routes6,
        Action::DelRoute6,
        Action::SetRoute6,
        &mut out,
    );
    diff_map(
        &want.neighbours6,
        &have.neighbours6,
        Action::DelNeighbour6,
        Action::SetNeighbour6,
        &mut out,
    );
    out.sort();
    out
}

/// Applies actions to a state, as the kernel would: used by tests to check
/// that a diff converges.
pub fn apply(state: &mut OverlayState, actions: &[Action]) {
    for a in actions {
        match a {
            Action::DelRoute(c) => {
                state.routes.remove(c);
            }
            Action::DelNeighbour(ip) => {
                state.neighbours.remove(ip);
            }
            Action::DelFdb(m) => {
                state.fdb.remove(m);
                state.fdb6.remove(m);
            }
            Action::SetFdb(m, IpAddr::V4(ip)) => {
                state.fdb.insert(*m, *ip);
            }
            Action::SetFdb(m, IpAddr::V6(ip)) => {
                state.fdb6.insert(*m, *ip);
            }
            Action::SetNeighbour(ip, m) => {
                state.neighbours.insert(*ip, *m);
            }
            Action::SetRoute(c, gw) => {
                state.routes.insert(*c, *gw);
            }
            Action::DelRoute6(c) => {
                state.routes6.remove(c);
            }
            Action::DelNeighbour6(ip) => {
                state.neighbours6.remove(ip);
            }
            Action::SetNeighbour6(ip, m) => {
                state.neighbours6.insert(*ip, *m);
            }
            Action::SetRoute6(c, gw) => {
                state.routes6.insert(*c, *gw);
            }
        }
    }
}

/// Where the agent's nexthop IDs start: its route protocol (110) in the
/// top byte, far above the small IDs people and systemd-networkd pick by
/// hand. Only a preference: an ID another program's nexthop holds is
/// never taken, whatever its value.
pub const NEXTHOP_ID_BASE: u32 = (mycni_common::contract::RTPROT_MYCNI_AGENT as u32) << 24;

/// What a peer's nexthop holds: its gateway, through `vxlan.1` `onlink`
/// (podCIDR.0) or straight over the underlay (the peer's host IP). The
/// gateway is of the route's family: an IPv6 route's nexthop is an IPv6
/// one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Hop {
    pub gateway: IpAddr,
    /// Over the underlay device rather than `vxlan.1`.
    pub direct: bool,
}

impl Hop {
    /// The hop of a route of [`OverlayState::routes`] or `routes6`.
    pub fn of_route<A: Family + Into<IpAddr>>(
        cidr: mycni_common::net::Cidr<A>,
        gateway: A,
    ) -> Self {
        Hop {
            gateway: gateway.into(),
            direct: !via_vxlan(cidr, gateway),
        }
    }
}

/// A route's destination in the nexthop table, of either family.
pub type AnyCidr = mycni_common::net::Cidr<IpAddr>;

/// What setting one peer route through its nexthop takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NexthopPlan {
    pub id: u32,
    /// The nexthop is missing or holds something else: add or replace it.
    pub set_nexthop: bool,
    /// The route does not go through it yet: add or replace the route.
    pub set_route: bool,
}

/// The nexthop IDs of the agent's peer routes, one nexthop per peer, as
/// the kernel holds them.
///
/// IDs are derived from the kernel, not from the peer: a route keeps the
/// ID of the agent's nexthop it goes through, so a restarted agent reads
/// back exactly what it left and changes nothing; a route without one
/// adopts an unused nexthop of the agent's holding the same hop (its
/// route was deleted under it), else gets the lowest ID from
/// [`NEXTHOP_ID_BASE`] up that no nexthop holds. A function of the peer
/// (a hash of its podCIDR) would need collision handling against other
/// programs' IDs and among peers, and whichever peer lost a collision
/// would change ID when the other left; taking what the kernel holds has
/// no collisions to resolve, and the kernel is the authority anyway.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NexthopIds {
    /// podCIDR -> the ID of the agent's nexthop its route goes through.
    routes: BTreeMap<AnyCidr, u32>,
    /// The agent's nexthops: ID -> what it holds (None: something the
    /// agent would not make, e.g. on a device since replaced).
    own: BTreeMap<u32, Option<Hop>>,
    /// Other programs' nexthop IDs: never taken, never touched.
    foreign: BTreeSet<u32>,
    /// The agent's nexthops no route goes through, by what they hold.
    unused: BTreeSet<(Option<Hop>, u32)>,
    /// No free ID lies between the base and this one.
    next: u32,
}

impl NexthopIds {
    /// The table of what the kernel holds: the agent's nexthops, other
    /// programs' nexthop IDs, and the agent's routes that go through a
    /// nexthop (podCIDR, ID), in any order. A route through a nexthop that
    /// is not the agent's, or through one an earlier route claimed, gets
    /// no entry: setting it gives it a nexthop of its own.
    pub fn new<C: Into<AnyCidr>>(
        own: impl IntoIterator<Item = (u32, Option<Hop>)>,
        foreign: impl IntoIterator<Item = u32>,
        routes: impl IntoIterator<Item = (C, u32)>,
    ) -> Self {
        let own: BTreeMap<u32, Option<Hop>> = own.into_iter().collect();
        let mut t = NexthopIds {
            foreign: foreign
                .into_iter()
                .filter(|id| !own.contains_key(id))
                .collect(),
            own,
            next: NEXTHOP_ID_BASE,
            ..NexthopIds::default()
        };
        let mut claimed = BTreeSet::new();
        for (cidr, id) in routes {
            if t.own.contains_key(&id) && claimed.insert(id) {
                t.routes.insert(cidr.into(), id);
            }
        }
        t.unused = t
            .own
            .iter()
            .filter(|(id, _)| !claimed.contains(*id))
            .map(|(id, hop)| (*hop, *id))
            .collect();
        t
    }

    /// What the route to `cidr` goes through, if it goes through one of
    /// the agent's nexthops: its ID and what it holds.
    pub fn route(&self, cidr: impl Into<AnyCidr>) -> Option<(u32, Option<Hop>)> {
        let id = *self.routes.get(&cidr.into())?;
        Some((id, self.own.get(&id).copied().flatten()))
    }

    /// The ID for the route to `cidr` through `hop`, and what it takes;
    /// the table then holds it as done (a failed pass dumps again).
    pub fn plan(&mut self, cidr: impl Into<AnyCidr>, hop: Hop) -> NexthopPlan {
        let cidr = cidr.into();
        let (id, set_route) = match self.routes.get(&cidr) {
            Some(id) => (*id, false),
            None => {
                let adopt = self
                    .unused
                    .range((Some(hop), 0)..=(Some(hop), u32::MAX))
                    .next()
                    .copied();
                let id = match adopt {
                    Some(k) => {
                        self.unused.remove(&k);
                        k.1
                    }
                    None => self.fresh(),
                };
                self.routes.insert(cidr, id);
                (id, true)
            }
        };
        let set_nexthop = self.own.insert(id, Some(hop)) != Some(Some(hop));
        NexthopPlan {
            id,
            set_nexthop,
            set_route,
        }
    }

    /// Forgets the route to `cidr`; the ID of its nexthop, to delete, if
    /// it had one.
    pub fn release(&mut self, cidr: impl Into<AnyCidr>) -> Option<u32> {
        let id = self.routes.remove(&cidr.into())?;
        self.own.remove(&id);
        self.next = self.next.min(id);
        Some(id)
    }

    /// The agent's nexthops no route goes through, to delete, forgotten.
    pub fn take_unused(&mut self) -> Vec<u32> {
        let ids: Vec<u32> = std::mem::take(&mut self.unused)
            .into_iter()
            .map(|(_, id)| id)
            .collect();
        for id in &ids {
            self.own.remove(id);
            self.next = self.next.min(*id);
        }
        ids
    }

    /// The lowest free ID from the base up (wrapping below it only when
    /// all above are taken, which 2^32 - base nexthops never are).
    fn fresh(&mut self) -> u32 {
        let mut id = self.next.max(NEXTHOP_ID_BASE);
        while id == 0 || self.own.contains_key(&id) || self.foreign.contains(&id) {
            id = id.wrapping_add(1);
        }
        self.next = id.wrapping_add(1);
        self.own.insert(id, None);
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(name: &str, cidr: &str, mac: u8, ip: u8) -> Peer {
        Peer {
            name: name.into(),
            pod_cidr: Cidr::parse_network(cidr).unwrap(),
            pod_cidr6: None,
            vtep_mac: Mac([2, 0, 0, 0, 0, mac]),
            host_ip: Ipv4Addr::new(192, 168, 0, ip),
            underlay6: None,
        }
    }

    #[test]
    fn fresh_node_adds_everything_in_dependency_order() {
        let want = desired(&[peer("a", "10.244.1.0/24", 1, 2)]);
        let acts = diff(&want, &OverlayState::default());
        assert_eq!(
            acts,
            vec![
                Action::SetFdb(
                    Mac([2, 0, 0, 0, 0, 1]),
                    Ipv4Addr::new(192, 168, 0, 2).into()
                ),
                Action::SetNeighbour(Ipv4Addr::new(10, 244, 1, 0), Mac([2, 0, 0, 0, 0, 1])),
                Action::SetRoute(
                    Cidr::parse_network("10.244.1.0/24").unwrap(),
                    Ipv4Addr::new(10, 244, 1, 0)
                ),
            ]
        );
    }

    #[test]
    fn direct_peers_are_routed_to_their_host_without_a_neighbour() {
        let lan = Cidr::parse_network("192.168.0.0/24").unwrap();
        let a = peer("a", "10.244.1.0/24", 1, 2);
        let mut far = peer("b", "10.244.2.0/24", 2, 3);
        far.host_ip = Ipv4Addr::new(172, 16, 0, 3);
        let want = desired_direct(&[a.clone(), far.clone()], &[lan]);
        assert_eq!(want.routes[&a.pod_cidr], a.host_ip);
        assert!(!via_vxlan(a.pod_cidr, a.host_ip));
        assert_eq!(want.routes[&far.pod_cidr], far.gateway());
        assert!(via_vxlan(far.pod_cidr, far.gateway()));
        assert_eq!(want.neighbours.len(), 1);
        assert_eq!(want.fdb.len(), 2);
        // Turning direct routing on replaces the route and drops the
        // neighbour; off again restores both.
        let vxlan = desired(std::slice::from_ref(&a));
        let direct = desired_direct(std::slice::from_ref(&a), &[lan]);
        let mut s = vxlan.clone();
        apply(&mut s, &diff(&direct, &vxlan));
        assert_eq!(s, direct);
        apply(&mut s, &diff(&vxlan, &direct));
        assert_eq!(s, vxlan);
    }

    #[test]
    fn in_sync_means_no_actions() {
        let want = desired(&[
            peer("a", "10.244.1.0/24", 1, 2),
            peer("b", "10.244.2.0/24", 2, 3),
        ]);
        assert!(diff(&want, &want.clone()).is_empty());
    }

    #[test]
    fn changes_of_mac_host_ip_and_cidr() {
        let old = desired(&[peer("a", "10.244.1.0/24", 1, 2)]);
        // Host IP changed: only the FDB entry is replaced.
        let new_ip = desired(&[peer("a", "10.244.1.0/24", 1, 9)]);
        assert_eq!(
            diff(&new_ip, &old),
            vec![Action::SetFdb(
                Mac([2, 0, 0, 0, 0, 1]),
                Ipv4Addr::new(192, 168, 0, 9).into()
            )]
        );
        // MAC changed: old FDB entry deleted, neighbour replaced, new FDB.
        let new_mac = desired(&[peer("a", "10.244.1.0/24", 7, 2)]);
        let acts = diff(&new_mac, &old);
        assert!(acts.contains(&Action::DelFdb(Mac([2, 0, 0, 0, 0, 1]))));
        assert!(acts.contains(&Action::SetNeighbour(
            Ipv4Addr::new(10, 244, 1, 0),
            Mac([2, 0, 0, 0, 0, 7])
        )));
        // podCIDR changed: old route and neighbour go, new ones come.
        let new_cidr = desired(&[peer("a", "10.244.5.0/24", 1, 2)]);
        let acts = diff(&new_cidr, &old);
        assert!(acts.contains(&Action::DelRoute(
            Cidr::parse_network("10.244.1.0/24").unwrap()
        )));
        assert!(acts.contains(&Action::DelNeighbour(Ipv4Addr::new(10, 244, 1, 0))));
        assert!(acts[0].is_delete());
        let mut s = old.clone();
        apply(&mut s, &acts);
        assert_eq!(s, new_cidr);
    }

    #[test]
    fn deleted_nodes_lose_everything() {
        let old = desired(&[
            peer("a", "10.244.1.0/24", 1, 2),
            peer("b", "10.244.2.0/24", 2, 3),
        ]);
        let want = desired(&[peer("a", "10.244.1.0/24", 1, 2)]);
        let acts = diff(&want, &old);
        assert_eq!(acts.len(), 3);
        assert!(acts.iter().all(Action::is_delete));
    }

    #[test]
    fn any_start_state_converges_in_one_pass() {
        // A small exhaustive-ish property: from every subset of a universe
        // of entries, one diff+apply reaches the desired state.
        let peers = [
            peer("a", "10.244.1.0/24", 1, 2),
            peer("b", "10.244.2.0/24", 2, 3),
        ];
        let want = desired(&peers[..1]);
        let universe = desired(&[
            peers[0].clone(),
            peers[1].clone(),
            peer("a", "10.244.1.0/24", 9, 9),
        ]);
        let routes: Vec<_> = universe.routes.iter().collect();
        let neighs: Vec<_> = universe.neighbours.iter().collect();
        let fdbs: Vec<_> = universe.fdb.iter().collect();
        for mask in 0u32..(1 << (routes.len() + neighs.len() + fdbs.len())) {
            let mut have = OverlayState::default();
            let mut bit = 0;
            for (k, v) in &routes {
                if mask & (1 << bit) != 0 {
                    have.routes.insert(**k, **v);
                }
                bit += 1;
            }
            for (k, v) in &neighs {
                if mask & (1 << bit) != 0 {
                    have.neighbours.insert(**k, **v);
                }
                bit += 1;
            }
            for (k, v) in &fdbs {
                if mask & (1 << bit) != 0 {
                    have.fdb.insert(**k, **v);
                }
                bit += 1;
            }
            let acts = diff(&want, &have);
            apply(&mut have, &acts);
            assert_eq!(have, want, "mask {mask:b}");
        }
    }

    fn cidr(s: &str) -> Cidr {
        Cidr::parse_network(s).unwrap()
    }

    fn vx(c: &str) -> Hop {
        let c = cidr(c);
        Hop::of_route(c, c.network())
    }

    #[test]
    fn a_restarted_agent_keeps_every_nexthop_id() {
        let (a, b) = (cidr("10.244.1.0/24"), cidr("10.244.2.0/24"));
        let direct = Hop::of_route(b, Ipv4Addr::new(192, 168, 0, 3));
        assert!(direct.direct && !vx("10.244.1.0/24").direct);
        let mut t = NexthopIds::new(
            [(7, Some(vx("10.244.1.0/24"))), (9, Some(direct))],
            [],
            [(a, 7), (b, 9)],
        );
        let none = |id| NexthopPlan {
            id,
            set_nexthop: false,
            set_route: false,
        };
        assert_eq!(t.plan(a, vx("10.244.1.0/24")), none(7));
        assert_eq!(t.plan(b, direct), none(9));
        assert!(t.take_unused().is_empty());
        // The peer's host IP changed: its nexthop alone, same ID.
        let moved = Hop::of_route(b, Ipv4Addr::new(192, 168, 0, 9));
        assert_eq!(
            t.plan(b, moved),
            NexthopPlan {
                id: 9,
                set_nexthop: true,
                set_route: false
            }
        );
    }

    #[test]
    fn new_routes_get_the_lowest_ids_nobody_holds() {
        let base = NEXTHOP_ID_BASE;
        let mut t = NexthopIds::new::<Cidr>([(base + 1, Some(vx("10.244.9.0/24")))], [base], []);
        let c = |i: u8| cidr(&format!("10.244.{i}.0/24"));
        let hop = |i: u8| vx(&format!("10.244.{i}.0/24"));
        // base is another program's, base + 1 the agent's (unused, other hop).
        let p = t.plan(c(1), hop(1));
        assert_eq!((p.id, p.set_nexthop, p.set_route), (base + 2, true, true));
        assert_eq!(t.plan(c(2), hop(2)).id, base + 3);
        // Released IDs are handed out again, lowest first.
        assert_eq!(t.release(c(1)), Some(base + 2));
        assert_eq!(t.release(c(1)), None);
        assert_eq!(t.take_unused(), vec![base + 1]);
        assert_eq!(t.plan(c(3), hop(3)).id, base + 1);
        assert_eq!(t.plan(c(4), hop(4)).id, base + 2);
        assert_eq!(t.plan(c(5), hop(5)).id, base + 4);
    }

    #[test]
    fn routes_through_what_is_not_theirs_get_a_nexthop_of_their_own() {
        let (a, b, c) = (
            cidr("10.244.1.0/24"),
            cidr("10.244.2.0/24"),
            cidr("10.244.3.0/24"),
        );
        let mut t = NexthopIds::new(
            [(5, Some(vx("10.244.1.0/24"))), (6, None)],
            [3],
            // b through another program's nexthop; c through a's.
            [(a, 5), (b, 3), (c, 5)],
        );
        assert_eq!(t.route(a), Some((5, Some(vx("10.244.1.0/24")))));
        assert_eq!(t.route(b), None);
        assert_eq!(t.route(c), None);
        let p = t.plan(b, vx("10.244.2.0/24"));
        assert!(p.set_nexthop && p.set_route && ![3, 5, 6].contains(&p.id));
        let q = t.plan(c, vx("10.244.3.0/24"));
        assert!(q.set_nexthop && q.set_route && q.id != p.id);
        // 6 holds something the agent would not make and nobody uses it.
        assert_eq!(t.take_unused(), vec![6]);
    }

    #[test]
    fn a_route_deleted_under_its_nexthop_is_set_through_it_again() {
        let a = cidr("10.244.1.0/24");
        let mut t = NexthopIds::new::<Cidr>(
            [
                (5, Some(vx("10.244.1.0/24"))),
                (8, Some(vx("10.244.7.0/24"))),
            ],
            [],
            [],
        );
        assert_eq!(
            t.plan(a, vx("10.244.1.0/24")),
            NexthopPlan {
                id: 5,
                set_nexthop: false,
                set_route: true
            }
        );
        assert_eq!(t.take_unused(), vec![8]);
        assert!(t.take_unused().is_empty());
    }

    fn peer6(name: &str, cidr: &str, cidr6: &str, mac: u8, ip: u8) -> Peer {
        Peer {
            pod_cidr6: Some(Cidr6::parse_network(cidr6).unwrap()),
            ..peer(name, cidr, mac, ip)
        }
    }

    fn c6(s: &str) -> Cidr6 {
        Cidr6::parse_network(s).unwrap()
    }

    fn ip6(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    #[test]
    fn ipv6_side_is_a_route_and_neighbour_over_the_same_fdb_entry() {
        let lan = Cidr::parse_network("192.168.0.0/24").unwrap();
        let p = peer6("a", "10.244.1.0/24", "fd00:10:244:1::/64", 1, 2);
        let mac = Mac([2, 0, 0, 0, 0, 1]);
        // Direct routing does not apply to IPv6: no IPv6 on the underlay.
        for want in [
            desired(std::slice::from_ref(&p)),
            desired_direct(std::slice::from_ref(&p), &[lan]),
        ] {
            assert_eq!(want.routes6.len(), 1);
            assert_eq!(
                want.routes6[&c6("fd00:10:244:1::/64")],
                ip6("fd00:10:244:1::")
            );
            assert!(via_vxlan(c6("fd00:10:244:1::/64"), ip6("fd00:10:244:1::")));
            assert_eq!(want.neighbours6[&ip6("fd00:10:244:1::")], mac);
            assert_eq!(want.fdb.len(), 1, "one FDB entry for both families");
        }
        let acts = diff(&desired(std::slice::from_ref(&p)), &OverlayState::default());
        assert_eq!(
            acts,
            vec![
                Action::SetFdb(mac, Ipv4Addr::new(192, 168, 0, 2).into()),
                Action::SetNeighbour(Ipv4Addr::new(10, 244, 1, 0), mac),
                Action::SetNeighbour6(ip6("fd00:10:244:1::"), mac),
                Action::SetRoute(cidr("10.244.1.0/24"), Ipv4Addr::new(10, 244, 1, 0)),
                Action::SetRoute6(c6("fd00:10:244:1::/64"), ip6("fd00:10:244:1::")),
            ]
        );
        // What the fast path mirrors: only what the kernel backs whole.
        let mut have = desired(std::slice::from_ref(&p));
        assert_eq!(
            have.remotes6(),
            vec![Remote {
                pod_cidr: c6("fd00:10:244:1::/64"),
                vtep_mac: mac,
                host_ip: Ipv4Addr::new(192, 168, 0, 2),
            }]
        );
        have.neighbours6.clear();
        assert!(have.remotes6().is_empty());
    }

    #[test]
    fn a_node_gaining_and_losing_its_ipv6_podcidr() {
        let v4 = desired(&[peer("a", "10.244.1.0/24", 1, 2)]);
        let dual = desired(&[peer6("a", "10.244.1.0/24", "fd00:10:244:1::/64", 1, 2)]);
        let gain = diff(&dual, &v4);
        assert_eq!(
            gain,
            vec![
                Action::SetNeighbour6(ip6("fd00:10:244:1::"), Mac([2, 0, 0, 0, 0, 1])),
                Action::SetRoute6(c6("fd00:10:244:1::/64"), ip6("fd00:10:244:1::")),
            ]
        );
        let lose = diff(&v4, &dual);
        assert_eq!(
            lose,
            vec![
                Action::DelRoute6(c6("fd00:10:244:1::/64")),
                Action::DelNeighbour6(ip6("fd00:10:244:1::")),
            ]
        );
        // A moved IPv6 podCIDR: old route and neighbour go first.
        let moved = desired(&[peer6("a", "10.244.1.0/24", "fd00:10:244:9::/64", 1, 2)]);
        let acts = diff(&moved, &dual);
        assert!(acts[0].is_delete() && acts[1].is_delete());
        let mut s = dual.clone();
        apply(&mut s, &acts);
        assert_eq!(s, moved);
        // The deleted node takes both families along.
        let gone = diff(&OverlayState::default(), &dual);
        assert_eq!(gone.len(), 5);
        assert!(gone.iter().all(Action::is_delete));
    }

    #[test]
    fn ipv6_routes_share_the_nexthop_table() {
        let a = c6("fd00:10:244:1::/64");
        let hop = Hop::of_route(a, ip6("fd00:10:244:1::"));
        assert!(!hop.direct);
        assert_eq!(hop.gateway, IpAddr::V6(ip6("fd00:10:244:1::")));
        let v4 = cidr("10.244.1.0/24");
        let mut t = NexthopIds::new::<AnyCidr>([], [], []);
        let p4 = t.plan(v4, vx("10.244.1.0/24"));
        let p6 = t.plan(a, hop);
        assert_ne!(p4.id, p6.id, "one nexthop per route, whatever its family");
        assert!(p6.set_nexthop && p6.set_route);
        assert_eq!(t.route(a), Some((p6.id, Some(hop))));
        assert_eq!(t.release(a), Some(p6.id));
        // A restarted agent reads the IPv6 route's nexthop back.
        let t = NexthopIds::new([(p6.id, Some(hop))], [], [(AnyCidr::from(a), p6.id)]);
        assert_eq!(t.route(a), Some((p6.id, Some(hop))));
    }

    #[test]
    fn ipv6_underlay_peers_are_a_route_neighbour_and_fdb_entry_on_vxlan6() {
        use crate::peers::{Peer6, Underlay6};
        let p = |n: u8| Peer6 {
            name: format!("p{n}"),
            pod_cidr6: Cidr6::parse_network(&format!("fd00:10:244:{n}::/64")).unwrap(),
            underlay6: Underlay6 {
                host_ip: format!("fd00:77::{n}").parse().unwrap(),
                vtep_mac: Mac([2, 0, 0, 0, 6, n]),
            },
        };
        let want = desired_underlay6(&[p(1), p(2)]);
        let gw: Ipv6Addr = "fd00:10:244:1::".parse().unwrap();
        assert_eq!(want.routes6[&p(1).pod_cidr6], gw);
        assert_eq!(want.neighbours6[&gw], Mac([2, 0, 0, 0, 6, 1]));
        assert_eq!(
            want.fdb6[&Mac([2, 0, 0, 0, 6, 1])],
            "fd00:77::1".parse::<Ipv6Addr>().unwrap()
        );
        // Nothing of vxlan.1's IPv4 side.
        assert!(want.routes.is_empty() && want.neighbours.is_empty() && want.fdb.is_empty());
        let acts = diff(&want, &OverlayState::default());
        assert!(acts.contains(&Action::SetFdb(
            Mac([2, 0, 0, 0, 6, 2]),
            "fd00:77::2".parse::<Ipv6Addr>().unwrap().into()
        )));
        // FDB before neighbour before route, as on vxlan.1.
        let pos = |f: fn(&Action) -> bool| acts.iter().position(f).unwrap();
        assert!(
            pos(|a| matches!(a, Action::SetFdb(..)))
                < pos(|a| matches!(a, Action::SetNeighbour6(..)))
        );
        assert!(
            pos(|a| matches!(a, Action::SetNeighbour6(..)))
                < pos(|a| matches!(a, Action::SetRoute6(..)))
        );
        let mut have = OverlayState::default();
        apply(&mut have, &acts);
        assert_eq!(have, want);
        // A moved host address is one FDB replace; a peer gone, three deletes.
        let mut moved = p(2);
        moved.underlay6.host_ip = "fd00:77::99".parse().unwrap();
        let acts = diff(&desired_underlay6(&[p(1), moved]), &have);
        assert_eq!(
            acts,
            [Action::SetFdb(
                Mac([2, 0, 0, 0, 6, 2]),
                "fd00:77::99".parse::<Ipv6Addr>().unwrap().into()
            )]
        );
        let acts = diff(&desired_underlay6(&[p(1)]), &have);
        assert_eq!(acts.len(), 3, "{acts:?}");
        assert!(acts.iter().all(Action::is_delete));
        apply(&mut have, &acts);
        assert_eq!(have, desired_underlay6(&[p(1)]));
    }
}
