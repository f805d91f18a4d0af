//! Writing a diff to the kernel: deletes, then sets in dependency order
//! (FDB, neighbour, route), peer routes through nexthop objects of their
//! own where the kernel has them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::atomic::Ordering;
use std::time::Instant;

use mycni_common::net::{Cidr, Cidr4, Cidr6};
use mycni_common::netlink::{Batch, Nexthop, NexthopRoute, Route, RouteFamily};

use crate::kernel::{KernelError, RTPROT_MYCNI_AGENT};
use crate::metrics::NetlinkOp;

use super::kernel::{OverlayKernel, PeerRoutes};
use super::nexthop_ids::{AnyCidr, Hop, NexthopPlan};
use crate::topology::Action;
use crate::topology::via_vxlan;

/// What every write of one phase is made against: how peer routes are
/// made, the phase's nexthop plans, the devices' ifindexes.
#[derive(Clone, Copy)]
struct Pass<'a> {
    mode: PeerRoutes,
    plans: &'a BTreeMap<AnyCidr, (Hop, NexthopPlan)>,
    vxlan: u32,
    underlay: u32,
}

impl OverlayKernel {
    /// Applies a diff of [`OverlayKernel::dump_vxlan6`]'s state to `vxlan6.1`,
    /// as [`OverlayKernel::apply`] does without nexthop objects. Returns the
    /// number of failed actions.
    pub(crate) async fn apply_vxlan6(&self, vxlan6: u32, actions: &[Action]) -> usize {
        let plans = BTreeMap::new();
        let (dels, sets): (Vec<&Action>, Vec<&Action>) =
            actions.iter().partition(|a| a.is_delete());
        let mut failed = 0;
        // One at a time: a few peers, and the FDB -> neighbour -> route
        // order kept by the diff's sort within each group.
        for a in dels.into_iter().chain(sets) {
            if let Err(e) = self
                .apply_one(
                    &Pass {
                        mode: PeerRoutes::Onlink,
                        plans: &plans,
                        vxlan: vxlan6,
                        underlay: 0,
                    },
                    a,
                )
                .await
            {
                tracing::warn!(error = %e, device = "vxlan6", "kernel update failed");
                failed += 1;
            }
        }
        failed
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
        // Within a group, FDB -> neighbour -> route order by phases.
        let steps: Vec<Vec<&Action>> = if actions.iter().any(is_route) {
            [dels, sets].into_iter().flat_map(phases).collect()
        } else {
            // No route, so no nexthop to set or release between phases:
            // every phase in one batch, in the same order. The kernel
            // takes a datagram's requests one after another, each with its
            // own result, as it takes the phases' batches: the same writes
            // in the same order, in one round trip instead of up to six
            // (a VTEP MAC change: three).
            vec![
                [dels, sets]
                    .into_iter()
                    .flat_map(phases)
                    .flatten()
                    .collect(),
            ]
        };
        let mut failed = 0;
        for phase in steps {
            // Nexthop IDs are handed out in the diff's (podCIDR) order,
            // not in whatever order concurrent requests start: the same
            // peers get the same IDs in every run.
            let mut plans: BTreeMap<AnyCidr, (Hop, NexthopPlan)> = if mode == PeerRoutes::Nexthops {
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
            let pass = Pass {
                mode,
                plans: &plans,
                vxlan,
                underlay,
            };
            failed += self.apply_phase(&pass, phase).await;
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

    /// One phase's actions (none depending on another), in batches of
    /// requests rather than one round trip each: routes, neighbours and
    /// FDB entries together, each with its own result. The few an entry
    /// of a batch cannot carry (a route whose nexthop is still to be set)
    /// go one at a time first. Returns the number that failed, each
    /// logged.
    async fn apply_phase(&self, pass: &Pass<'_>, phase: Vec<&Action>) -> usize {
        let mut failed = 0;
        let mut batch = Batch::new();
        // Per batch entry: its action, and for a route through a nexthop
        // that goes, the podCIDR whose nexthop goes after it.
        let mut entries: Vec<(&Action, Option<AnyCidr>)> = Vec::with_capacity(phase.len());
        for a in phase {
            match batch_entry(pass, a, &mut batch) {
                Entry::Batched(then) => entries.push((a, then)),
                Entry::Nothing => {}
                Entry::Single => {
                    let r =
                        crate::metrics::netlink_timed(netlink_op(a), self.apply_one(pass, a)).await;
                    if let Err(e) = r {
                        tracing::warn!(error = %e, "kernel update failed");
                        failed += 1;
                    }
                }
            }
        }
        if batch.is_empty() {
            return failed;
        }
        let started = Instant::now();
        let results = self.nl.apply_batch(batch).await;
        // Each request's share of the batch: what it cost, not the round
        // trip of the whole batch counted once per request.
        let each = started.elapsed() / u32::try_from(results.len()).unwrap_or(u32::MAX).max(1);
        for ((a, then), r) in entries.into_iter().zip(results) {
            crate::metrics::observe_netlink(netlink_op(a), each);
            let r = match (r, then) {
                (Ok(()), Some(c)) => self.release_nexthop(c).await,
                (r, _) => r.map_err(KernelError::from),
            };
            if let Err(e) = r {
                tracing::warn!(error = %e, "kernel update failed");
                failed += 1;
            }
        }
        failed
    }

    /// One action; deleting what is already gone is success.
    async fn apply_one(&self, pass: &Pass<'_>, a: &Action) -> Result<(), KernelError> {
        let Pass {
            mode,
            plans,
            vxlan,
            underlay,
        } = *pass;
        let nl = &self.nl;
        let r = match a {
            Action::SetRoute(c, gw) if mode == PeerRoutes::Nexthops => {
                let (hop, plan) = self.plan_of(plans, *c, *gw);
                return self
                    .set_nexthop_route((vxlan, underlay), hop, plan, *c)
                    .await;
            }
            Action::SetRoute6(c, gw) if mode == PeerRoutes::Nexthops => {
                let (hop, plan) = self.plan_of(plans, *c, *gw);
                return self
                    .set_nexthop_route((vxlan, underlay), hop, plan, *c)
                    .await;
            }
            Action::DelRoute(c) if mode == PeerRoutes::Nexthops => {
                return self.delete_nexthop_route(*c).await;
            }
            Action::DelRoute6(c) if mode == PeerRoutes::Nexthops => {
                return self.delete_nexthop_route(*c).await;
            }
            Action::SetRoute(c, gw) => {
                nl.replace_route(onlink_route(*c, *gw, vxlan, underlay))
                    .await
            }
            Action::SetRoute6(c, gw) => nl.replace_route(route6(*c, *gw, vxlan)).await,
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
        (vxlan, underlay): (u32, u32),
        hop: Hop,
        plan: NexthopPlan,
        c: Cidr<A>,
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
        c: Cidr<A>,
        gw: A,
    ) -> (Hop, NexthopPlan)
    where
        AnyCidr: From<Cidr<A>>,
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
    async fn delete_nexthop_route<A: RouteFamily>(&self, c: Cidr<A>) -> Result<(), KernelError>
    where
        AnyCidr: From<Cidr<A>>,
    {
        self.nl.delete_route(c, RTPROT_MYCNI_AGENT).await?;
        self.release_nexthop(c.into()).await
    }

    /// Deletes the nexthop of the route to `c`, which is gone.
    async fn release_nexthop(&self, c: AnyCidr) -> Result<(), KernelError> {
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
    pub(crate) async fn delete_nexthops(&self) -> Result<(), KernelError> {
        if !self.nl.nexthops_supported().await? {
            return Ok(());
        }
        for n in self.nl.nexthops_by_protocol(RTPROT_MYCNI_AGENT).await? {
            self.nl.delete_nexthop(n.id).await?;
        }
        Ok(())
    }
}

/// A group's actions (deletes or sets) by phase, keeping FDB ->
/// neighbour -> route order: what a phase needs is in the kernel before
/// it is written.
fn phases(group: Vec<&Action>) -> [Vec<&Action>; 3] {
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
    phases
}

/// Whether `a` writes or deletes a route (and so may set or release a
/// nexthop).
fn is_route(a: &Action) -> bool {
    matches!(
        a,
        Action::SetRoute(..) | Action::SetRoute6(..) | Action::DelRoute(_) | Action::DelRoute6(_)
    )
}

/// What became of an action in a phase's batch.
enum Entry {
    /// In the batch; for a route through a nexthop that goes, the podCIDR
    /// whose nexthop is deleted once the route is.
    Batched(Option<AnyCidr>),
    /// One request on its own ([`OverlayKernel::apply_one`]).
    Single,
    /// The kernel holds it already (a route whose nexthop alone changed).
    Nothing,
}

/// Puts `a` into `batch` as the request [`OverlayKernel::apply_one`]
/// would send alone.
fn batch_entry(pass: &Pass<'_>, a: &Action, batch: &mut Batch) -> Entry {
    let Pass {
        mode,
        plans,
        vxlan,
        underlay,
    } = *pass;
    match a {
        Action::SetRoute(c, _) if mode == PeerRoutes::Nexthops => nexthop_route(plans, *c, batch),
        Action::SetRoute6(c, _) if mode == PeerRoutes::Nexthops => nexthop_route(plans, *c, batch),
        Action::DelRoute(c) if mode == PeerRoutes::Nexthops => {
            batch.delete_route(*c, RTPROT_MYCNI_AGENT);
            Entry::Batched(Some((*c).into()))
        }
        Action::DelRoute6(c) if mode == PeerRoutes::Nexthops => {
            batch.delete_route(*c, RTPROT_MYCNI_AGENT);
            Entry::Batched(Some((*c).into()))
        }
        Action::SetRoute(c, gw) => {
            batch.replace_route(onlink_route(*c, *gw, vxlan, underlay));
            Entry::Batched(None)
        }
        Action::SetRoute6(c, gw) => {
            batch.replace_route(route6(*c, *gw, vxlan));
            Entry::Batched(None)
        }
        Action::DelRoute(c) => {
            batch.delete_route(*c, RTPROT_MYCNI_AGENT);
            Entry::Batched(None)
        }
        Action::DelRoute6(c) => {
            batch.delete_route(*c, RTPROT_MYCNI_AGENT);
            Entry::Batched(None)
        }
        Action::SetNeighbour(ip, mac) => {
            batch.replace_permanent_neighbour(vxlan, *ip, *mac);
            Entry::Batched(None)
        }
        Action::SetNeighbour6(ip, mac) => {
            batch.replace_permanent_neighbour(vxlan, *ip, *mac);
            Entry::Batched(None)
        }
        Action::DelNeighbour(ip) => {
            batch.delete_neighbour(vxlan, *ip);
            Entry::Batched(None)
        }
        Action::DelNeighbour6(ip) => {
            batch.delete_neighbour(vxlan, *ip);
            Entry::Batched(None)
        }
        Action::SetFdb(mac, ip) => {
            batch.replace_fdb_entry(vxlan, *mac, *ip);
            Entry::Batched(None)
        }
        Action::DelFdb(mac) => {
            batch.delete_fdb_entry(vxlan, *mac);
            Entry::Batched(None)
        }
    }
}

/// The route to `c` through the nexthop its plan holds, once that
/// nexthop is in place (set by the phase's nexthop batch, or unchanged).
fn nexthop_route<A: RouteFamily>(
    plans: &BTreeMap<AnyCidr, (Hop, NexthopPlan)>,
    c: Cidr<A>,
    batch: &mut Batch,
) -> Entry
where
    AnyCidr: From<Cidr<A>>,
{
    match plans.get(&c.into()) {
        Some((_, p)) if !p.set_nexthop && !p.set_route => Entry::Nothing,
        Some((_, p)) if !p.set_nexthop => {
            batch.replace_nexthop_route(NexthopRoute {
                dst: c,
                nhid: p.id,
                protocol: RTPROT_MYCNI_AGENT,
            });
            Entry::Batched(None)
        }
        // No plan, or its nexthop still to be set: as `apply_one` does.
        _ => Entry::Single,
    }
}

/// A peer route holding its gateway itself: podCIDR.0 `onlink` through
/// `vxlan.1`, or under direct routing the peer's host IP on the underlay.
fn onlink_route(c: Cidr4, gw: Ipv4Addr, vxlan: u32, underlay: u32) -> Route {
    if via_vxlan(c, gw) {
        // The gateway (the peer's podCIDR.0) is on no subnet of ours.
        Route {
            dst: c,
            gateway: Some(gw),
            oif: Some(vxlan).filter(|i| *i != 0),
            protocol: RTPROT_MYCNI_AGENT,
            onlink: true,
        }
    } else {
        // A peer's podCIDR straight to its host IP on the underlay
        // (direct routing).
        Route {
            dst: c,
            gateway: Some(gw),
            oif: Some(underlay),
            protocol: RTPROT_MYCNI_AGENT,
            onlink: false,
        }
    }
}

/// An IPv6 peer route: always through vxlan.1 (see `OverlayState::routes6`).
fn route6(c: Cidr6, gw: Ipv6Addr, vxlan: u32) -> Route<Ipv6Addr> {
    Route {
        dst: c,
        gateway: Some(gw),
        oif: Some(vxlan).filter(|i| *i != 0),
        protocol: RTPROT_MYCNI_AGENT,
        onlink: true,
    }
}

/// The histogram an action's request is timed in: one per kind of
/// request, for both families.
fn netlink_op(a: &Action) -> NetlinkOp {
    match a {
        Action::SetRoute(..) | Action::SetRoute6(..) => NetlinkOp::RouteSet,
        Action::DelRoute(_) | Action::DelRoute6(_) => NetlinkOp::RouteDel,
        Action::SetNeighbour(..) | Action::SetNeighbour6(..) => NetlinkOp::NeighbourSet,
        Action::DelNeighbour(_) | Action::DelNeighbour6(_) => NetlinkOp::NeighbourDel,
        Action::SetFdb(..) => NetlinkOp::FdbSet,
        Action::DelFdb(_) => NetlinkOp::FdbDel,
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
