//! Reading the overlay state back from the kernel: what the agent owns on
//! `vxlan.1` and `vxlan6.1`, and the nexthop IDs its routes go through.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::Ordering;

use mycni_common::net::Cidr;
use mycni_common::netlink::{Nexthop, Route, RouteFamily};

use crate::kernel::{KernelError, RTPROT_MYCNI_AGENT};

use super::kernel::{OverlayKernel, PeerRoutes};
use super::nexthop_ids::{AnyCidr, Hop, NexthopIds};
use crate::topology::OverlayState;
use crate::topology::via_vxlan;

impl OverlayKernel {
    /// What the agent owns on `vxlan6.1` (index `vxlan6`): its IPv6 routes
    /// with the agent's protocol (each `via` a gateway `onlink`, never
    /// through a nexthop object: the nexthop table is `vxlan.1`'s), its
    /// permanent IPv6 neighbours and its FDB entries.
    pub(crate) async fn dump_vxlan6(&self, vxlan6: u32) -> Result<OverlayState, KernelError> {
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
    pub(super) async fn dump_nexthop_routes(
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
) -> BTreeMap<Cidr<A>, A> {
    let mut out = BTreeMap::new();
    for r in routes {
        // The agent makes no default route (and no route without a
        // gateway): such a route with its protocol is not one of its.
        let Some(g) = r.gateway.filter(|_| r.dst.prefix() != 0) else {
            continue;
        };
        let dev = if via_vxlan(r.dst, g) { vxlan } else { underlay };
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
) -> BTreeMap<Cidr<A>, A>
where
    AnyCidr: From<Cidr<A>>,
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
