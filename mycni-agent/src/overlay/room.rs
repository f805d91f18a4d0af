//! The overlay as one room of the loop's pass: what the Nodes ask of it
//! ([`desire`], pure), its devices ([`OverlayRoom::ensure_devices`]), the
//! kernel brought to the desired state ([`OverlayRoom::apply`]), and the
//! pass's end ([`OverlayRoom::finish`]: cache, logs, metrics). What other rooms
//! need of it (the peers' host addresses, the state and ifindexes the
//! kernel holds) they read from [`Desired`] and [`Applied`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::{Result, bail};
use mycni_common::net::{Cidr4, ClusterCidrs, PodCidrs};
use mycni_common::node::{NodeView, Peer, Peer6, Reject, Selection, select_all};

use super::metrics::OverlayMetrics;
use crate::metrics::{Metrics, NetlinkOp, netlink_timed};

use super::desired::{apply, desired_direct, desired_underlay6, diff, diff_within};
use super::kernel::OverlayKernel;
use crate::topology::{Action, OverlayState};
use crate::topology::{Output, Underlay6Select, UnderlaySelect, Vxlan6Spec, VxlanSpec};

/// What the Nodes ask of the overlay.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    /// Peers over the IPv4 underlay (`vxlan.1`), their IPv6 side included.
    pub peers: Vec<Peer>,
    /// Peers over the IPv6 underlay only (`vxlan6.1`).
    pub peers6: Vec<Peer6>,
    pub rejected: Vec<(String, Reject)>,
    /// `vxlan.1`'s routes, neighbours and FDB entries.
    pub want: OverlayState,
    /// `vxlan6.1`'s.
    pub want6: OverlayState,
}

impl Desired {
    /// The peers' IPv4 host addresses: where VXLAN may come from.
    pub fn hosts(&self) -> impl Iterator<Item = Ipv4Addr> + '_ {
        self.peers.iter().map(|p| p.host_ip)
    }

    /// The peers' IPv6 host addresses, of both kinds of peer.
    pub(crate) fn hosts6(&self) -> impl Iterator<Item = Ipv6Addr> + '_ {
        self.peers
            .iter()
            .filter_map(|p| Some(p.underlay6?.host_ip))
            .chain(self.peers6.iter().map(|p| p.underlay6.host_ip))
    }
}

/// What the Nodes ask of this node's overlay (`own_name`, with its
/// podCIDRs `own`): the peers, the rejected Nodes, and the state of both
/// devices. Peers on the `direct` subnets are routed over the underlay.
pub(crate) fn desire(
    nodes: &[NodeView],
    own_name: &str,
    own: PodCidrs,
    cluster: ClusterCidrs,
    direct: &[Cidr4],
) -> Desired {
    let Selection {
        peers,
        peers6,
        mut rejected,
    } = select_all(nodes, own_name, own, cluster);
    // By Node, each Node's reasons in the order found: the order an
    // incremental pass keeps (`incremental.rs`), whatever the Nodes' order.
    rejected.sort_by(|a, b| a.0.cmp(&b.0));
    let want = desired_direct(&peers, direct);
    let want6 = desired_underlay6(&peers6);
    Desired {
        peers,
        peers6,
        rejected,
        want,
        want6,
    }
}

/// A device the pass found or made, for the kernel watch to judge its
/// notifications by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Vxlan(u32),
    Vxlan6(u32),
    /// The IPv6 underlay interface, on a node without `vxlan.1`.
    Underlay6(u32),
}

/// The devices as this pass found or made them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Devices {
    /// `vxlan.1`'s ifindex; 0 on an IPv6-only node.
    pub index: u32,
    pub index6: Option<u32>,
    /// A device was (re)created: its ifindex is new.
    pub recreated: bool,
}

/// What the kernel holds after the pass, for the rooms after this one.
#[derive(Debug)]
pub(crate) struct Applied {
    /// `vxlan.1`'s ifindex (0: none) and its state: the kernel's, with
    /// this pass's actions applied when none failed.
    pub index: u32,
    pub state: OverlayState,
    /// `vxlan6.1`'s ifindex and state, on a node with an IPv6 underlay.
    pub state6: Option<(u32, OverlayState)>,
    /// Kernel updates that failed: the rooms after this one sync only
    /// when there are none.
    pub failed: usize,
    /// A full pass, or a device was recreated: everything is re-read.
    pub full: bool,
    actions: Vec<Action>,
    devices: Devices,
}

/// What the underlay re-read found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UnderlayChange {
    Same,
    /// Direct routing's subnets changed: the desired routes may differ.
    Subnets,
    /// Another interface or address: vxlan.1 (on an IPv6-only node
    /// vxlan6.1) moves, the host IP is republished.
    Moved,
}

/// The overlay's state between passes.
pub struct OverlayRoom {
    kernel: OverlayKernel,
    /// `vxlan.1`; None on an IPv6-only node, whose passes do `vxlan6.1`
    /// alone.
    vx: Option<VxlanSpec>,
    /// `vxlan6.1`, on a node with an IPv6 underlay: kept as start-up made
    /// it (recreated when missing or changed, as `vxlan.1`), moved with
    /// the underlay on an IPv6-only node.
    vx6: Option<Vxlan6Spec>,
    /// The underlay subnets whose peers are routed directly (empty: direct
    /// routing off, every peer through vxlan.1).
    direct: Vec<Cidr4>,
    direct_routing: bool,
    /// The peers found unreachable (`no_common_underlay`) at the last
    /// pass: each is said once, when it becomes so, not at every pass.
    unreachable: BTreeSet<String>,
    /// What the kernel held after the last good pass. Event passes diff
    /// against it instead of dumping 3 entries per peer again (15-20 ms at
    /// 5,000 peers); full passes (drift, the resync) always dump.
    kernel_cache: Option<OverlayState>,
    /// The devices as the last good pass found them, under the same
    /// terms as `kernel_cache`: an event pass takes them as they were
    /// instead of asking the kernel again (a link, its addresses: four
    /// round trips, 0.3-20 ms on a loaded node), since the kernel watch
    /// wakes a full pass for any change to them. Taken by every pass,
    /// put back only by one that succeeded; dropped when the underlay
    /// moves.
    devices: Option<Devices>,
    metrics: Arc<Metrics>,
    /// The room's own series, registered at start.
    own: Arc<OverlayMetrics>,
}

impl OverlayRoom {
    /// The overlay as start-up brought it up; `direct` is the underlay's
    /// subnets when direct routing is on.
    pub fn new(
        kernel: OverlayKernel,
        vx: Option<VxlanSpec>,
        vx6: Option<Vxlan6Spec>,
        direct: Option<Vec<Cidr4>>,
        metrics: Arc<Metrics>,
    ) -> Self {
        OverlayRoom {
            kernel,
            vx,
            vx6,
            direct_routing: direct.is_some(),
            direct: direct.unwrap_or_default(),
            unreachable: BTreeSet::new(),
            kernel_cache: None,
            devices: None,
            own: metrics.collector::<OverlayMetrics>(),
            metrics,
        }
    }

    pub fn kernel(&self) -> &OverlayKernel {
        &self.kernel
    }

    pub fn vxlan(&self) -> Option<&VxlanSpec> {
        self.vx.as_ref()
    }

    pub fn vxlan6(&self) -> Option<&Vxlan6Spec> {
        self.vx6.as_ref()
    }

    /// The subnets whose peers are routed directly.
    pub fn direct(&self) -> &[Cidr4] {
        &self.direct
    }

    /// What the rooms after this one read of `applied`.
    pub fn output<'a>(&'a self, applied: &'a Applied) -> Output<'a> {
        Output {
            vxlan: self.vx.as_ref(),
            index: applied.index,
            state: &applied.state,
            vxlan6: applied
                .state6
                .as_ref()
                .zip(self.vx6.as_ref())
                .map(|((i6, o6), vx6)| (*i6, vx6.mac, o6)),
            full: applied.full,
            failed: applied.failed,
        }
    }

    /// Creates or corrects the devices, telling `seen` each one's index as
    /// soon as it is known. `full`: a full pass, which always asks the
    /// kernel; an event pass takes the last good pass's devices when it
    /// left them (`seen` has been told their indexes already).
    pub(crate) async fn ensure_devices(
        &mut self,
        desired: &Desired,
        full: bool,
        seen: impl FnMut(Device),
    ) -> Result<Devices> {
        match self.devices.take() {
            Some(d) if !full => Ok(d),
            _ => self.find_devices(desired, seen).await,
        }
    }

    /// [`OverlayRoom::ensure_devices`] from the kernel.
    async fn find_devices(
        &self,
        desired: &Desired,
        mut seen: impl FnMut(Device),
    ) -> Result<Devices> {
        // No vxlan.1 (an IPv6-only node): index 0, nothing on it to dump
        // or apply; `peers` is empty there.
        let (index, recreated) = match &self.vx {
            Some(vx) => {
                let r = netlink_timed(NetlinkOp::EnsureVxlan, self.kernel.ensure_vxlan(vx)).await?;
                seen(Device::Vxlan(r.0));
                r
            }
            None => (0, false),
        };
        let mut index6 = None;
        let mut recreated6 = false;
        if let Some(vx6) = &self.vx6 {
            let i6;
            (i6, recreated6) =
                netlink_timed(NetlinkOp::EnsureVxlan, self.kernel.ensure_vxlan6(vx6)).await?;
            if recreated6 {
                tracing::warn!(device = %vx6.name, "VXLAN device over IPv6 was missing or wrong and has been recreated");
            }
            seen(Device::Vxlan6(i6));
            if self.vx.is_none() {
                seen(Device::Underlay6(vx6.underlay_index));
            }
            index6 = Some(i6);
        } else if !desired.peers6.is_empty() {
            tracing::warn!(
                peers = desired.peers6.len(),
                "peers reachable over an IPv6 underlay only, but this node has none (--underlay6): their pods are unreachable"
            );
        }
        if let Some(vx) = self.vx.as_ref().filter(|_| recreated) {
            tracing::warn!(device = %vx.name, "VXLAN device was missing or wrong and has been recreated");
        }
        Ok(Devices {
            index,
            index6,
            recreated: recreated || recreated6,
        })
    }

    /// Says why Nodes are not programmed (each unreachable one once) and
    /// counts them by reason.
    fn report_rejected(&mut self, rejected: &[(String, Reject)]) {
        let mut by_reason: BTreeMap<&'static str, u64> = BTreeMap::new();
        let mut unreachable = BTreeSet::new();
        for (name, why) in rejected {
            *by_reason.entry(why.reason()).or_default() += 1;
            if let Reject::NoCommonUnderlay(_) = why {
                if !self.unreachable.contains(name) {
                    tracing::warn!(node = %name, reason = why.reason(), "not programming node: {why}");
                }
                unreachable.insert(name.clone());
            } else if why.ipv6_side_only() && self.vx.is_some() {
                tracing::warn!(node = %name, reason = why.reason(), "programming node without its IPv6 side: {why}");
            } else if !matches!(why, Reject::Incomplete(_)) {
                tracing::warn!(node = %name, reason = why.reason(), "not programming node: {why}");
            } else {
                tracing::debug!(node = %name, "not programming node yet: {why}");
            }
        }
        self.unreachable = unreachable;
        if let Ok(mut r) = self.own.rejected.lock() {
            *r = by_reason;
        }
    }

    /// Brings both devices' routes, neighbours and FDB entries to
    /// `desired`: dumps what the kernel holds (or takes the last good
    /// pass's, on an event pass), applies the difference. `touched`: the
    /// only entries of `vxlan.1`'s that may differ from the last good
    /// pass's (an incremental pass), so the only ones compared with what
    /// that pass left in the kernel.
    pub async fn apply(
        &mut self,
        desired: &Desired,
        devices: Devices,
        full: bool,
        touched: Option<&OverlayState>,
    ) -> Result<Applied> {
        if devices.recreated || full {
            self.kernel_cache = None;
        }
        self.report_rejected(&desired.rejected);
        let index = devices.index;
        let underlay = match &self.vx {
            Some(vx) if !self.direct.is_empty() => vx.underlay_index,
            _ => 0,
        };
        let cached = self.kernel_cache.take();
        let from_cache = cached.is_some();
        let mut have = match cached {
            Some(c) => c,
            None if self.vx.is_none() => OverlayState::default(),
            None => netlink_timed(NetlinkOp::Dump, self.kernel.dump(index, underlay)).await?,
        };
        let actions = match touched {
            // The cache is the last good pass's result, which held all of
            // its desired state: only the touched entries can differ.
            Some(keys) if from_cache => {
                let actions = diff_within(&desired.want, &have, keys);
                debug_assert_eq!(actions, diff(&desired.want, &have));
                actions
            }
            _ => diff(&desired.want, &have),
        };
        let mut failed = if self.vx.is_some() {
            self.kernel.apply(index, underlay, &actions).await
        } else {
            0
        };
        // vxlan6.1 after vxlan.1: a peer moving from it to vxlan.1 has its
        // routes replaced there first, and is then no longer here.
        let mut state6 = None;
        if let Some(i6) = devices.index6 {
            let mut have6 = netlink_timed(NetlinkOp::Dump, self.kernel.dump_vxlan6(i6)).await?;
            let actions6 = diff(&desired.want6, &have6);
            if !actions6.is_empty() {
                tracing::info!(
                    changes = actions6.len(),
                    peers = desired.peers6.len(),
                    "reconciled the overlay over IPv6"
                );
            }
            failed += self.kernel.apply_vxlan6(i6, &actions6).await;
            // What the fast path mirrors, used only when nothing failed.
            apply(&mut have6, &actions6);
            state6 = Some((i6, have6));
        }
        if failed == 0 {
            apply(&mut have, &actions);
        }
        Ok(Applied {
            index,
            state: have,
            state6,
            failed,
            // A new vxlan.1 or vxlan6.1 has a new ifindex: the fast path
            // must re-attach now, not when a notification of our own
            // delete or the safety-net pass comes round.
            full: full || devices.recreated,
            actions,
            devices,
        })
    }

    /// The pass's end, once every room has run: keeps what the kernel
    /// holds for the next event pass, logs and counts what changed, and
    /// fails when a kernel update did. `same_as_last`: the desired state
    /// is the last good pass's, so a full pass's changes are drift.
    pub fn finish(
        &mut self,
        desired: &Desired,
        same_as_last: bool,
        applied: Applied,
    ) -> Result<()> {
        let Applied {
            state,
            failed,
            full,
            actions,
            devices,
            ..
        } = applied;
        if failed == 0 {
            self.kernel_cache = Some(state);
            self.devices = Some(Devices {
                recreated: false,
                ..devices
            });
        }
        if !actions.is_empty() {
            tracing::info!(
                changes = actions.len(),
                failed,
                peers = desired.peers.len(),
                "reconciled overlay"
            );
        }
        let m = &self.own;
        m.kernel_actions
            .fetch_add(actions.len() as u64, Ordering::Relaxed);
        if full && same_as_last && !actions.is_empty() {
            m.drift_repaired
                .fetch_add(actions.len() as u64, Ordering::Relaxed);
            tracing::warn!(changes = actions.len(), ?actions, "repaired kernel drift");
        }
        m.peers_programmed.store(
            (desired.peers.len() + desired.peers6.len()) as u64,
            Ordering::Relaxed,
        );
        self.metrics.reconcile_runs.fetch_add(1, Ordering::Relaxed);
        if failed > 0 {
            bail!("{failed} of {} kernel updates failed", actions.len());
        }
        Ok(())
    }

    /// Re-reads the underlay (on full passes, and when the kernel says an
    /// address, a route or the underlay link changed): direct routing
    /// follows its subnets, and vxlan.1 follows its address (on an
    /// IPv6-only node, vxlan6.1 follows the IPv6 underlay's).
    pub(crate) async fn refresh_underlay(
        &mut self,
        how: &UnderlaySelect,
        how6: &Underlay6Select,
    ) -> UnderlayChange {
        let change = self.underlay_change(how, how6).await;
        if change != UnderlayChange::Same {
            // vxlan.1 (or vxlan6.1) is to move: the next pass asks the
            // kernel for its devices.
            self.devices = None;
        }
        change
    }

    /// [`OverlayRoom::refresh_underlay`]'s reading.
    async fn underlay_change(
        &mut self,
        how: &UnderlaySelect,
        how6: &Underlay6Select,
    ) -> UnderlayChange {
        let mut change = UnderlayChange::Same;
        let Some(vx) = self.vx.as_mut() else {
            let Some(vx6) = self.vx6.as_mut() else {
                return change;
            };
            match self
                .kernel
                .select_underlay_ipv6(how, how6, Some(vx6.local_ip))
                .await
            {
                Ok(u) if u.ip != vx6.local_ip || u.index != vx6.underlay_index => {
                    tracing::warn!(old = %vx6.local_ip, new = %u.ip, underlay = %u.name, "the IPv6 underlay address changed; moving {} and republishing", vx6.name);
                    vx6.local_ip = u.ip;
                    vx6.underlay_index = u.index;
                    change = UnderlayChange::Moved;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "cannot read the IPv6 underlay"),
            }
            return change;
        };
        match self.kernel.select_underlay(how).await {
            Ok(u) => {
                if self.direct_routing && u.subnets != self.direct {
                    tracing::info!(subnets = ?u.subnets, "peers on these underlay subnets are routed directly");
                    self.direct = u.subnets.clone();
                    change = UnderlayChange::Subnets;
                }
                if u.ip != vx.local_ip || u.index != vx.underlay_index {
                    tracing::warn!(old = %vx.local_ip, new = %u.ip, underlay = %u.name, "the underlay address changed; moving vxlan.1 and republishing");
                    vx.local_ip = u.ip;
                    vx.underlay_index = u.index;
                    change = UnderlayChange::Moved;
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot read the underlay"),
        }
        change
    }
}
