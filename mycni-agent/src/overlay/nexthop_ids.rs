//! Which nexthop object each peer route goes through: the IDs the kernel
//! holds, read back at every dump and kept by the apply step between them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use mycni_common::net::{Cidr, Family};

use crate::topology::via_vxlan;

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
pub(crate) struct Hop {
    pub gateway: IpAddr,
    /// Over the underlay device rather than `vxlan.1`.
    pub direct: bool,
}

impl Hop {
    /// The hop of a route of [`OverlayState::routes`] or `routes6`.
    pub(crate) fn of_route<A: Family + Into<IpAddr>>(cidr: Cidr<A>, gateway: A) -> Self {
        Hop {
            gateway: gateway.into(),
            direct: !via_vxlan(cidr, gateway),
        }
    }
}

/// A route's destination in the nexthop table, of either family.
pub(crate) type AnyCidr = Cidr<IpAddr>;

/// What setting one peer route through its nexthop takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NexthopPlan {
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
pub(crate) struct NexthopIds {
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
    pub(crate) fn take_unused(&mut self) -> Vec<u32> {
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
