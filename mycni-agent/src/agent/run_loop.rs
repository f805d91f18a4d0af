//! The loop, once start-up is done: watch every Node, reconcile the overlay
//! against them, apply the difference to the kernel and the eBPF maps, and
//! publish the node (conflist, ready marker, NetworkUnavailable=False, the
//! host IP when the underlay moves). A pass runs on every Node change, when
//! the kernel says pods came or went or the agent's state drifted, when the
//! underlay moved, after a failed pass (with backoff), and every resync
//! period (a full pass: the safety net for whatever no notification told).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::startup::Started;
use super::{
    CONFLIST_NAME, Config, IPV6_ONLY, conflist, kube_client, node_view, ready_file,
    set_network_available, strip_node, write_atomic,
};
use crate::datapath::FastPath;
use crate::kernel::{Kernel, VxlanSpec};
use crate::kwatch::{Expected, Signals, Watched};
use crate::metrics::{Liveness, Metrics, NetlinkOp, netlink_timed};
use crate::peers::{
    ANNOTATION_HOST_IP, ANNOTATION_HOST_IP6, Cidr, ClusterCidrs, NodeView, PodCidrs, Reject,
};
use crate::reconcile::{self, OverlayState};
use crate::tables::underlay_filter::UnderlayFilter;

/// The first retry of a failed pass or host IP publication; each failure
/// in a row doubles it, up to [`RETRY_MAX`]. Short: a failure is usually
/// a race with someone else's change that the next pass resolves.
const RETRY_MIN: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// State the reconcile loop keeps between passes.
struct Loop {
    kernel: Kernel,
    /// `vxlan.1`; None on an IPv6-only node, whose passes do `vxlan6.1`
    /// alone.
    vx: Option<VxlanSpec>,
    /// `vxlan6.1`, on a node with an IPv6 underlay: kept as start-up made
    /// it (recreated when missing or changed, as `vxlan.1`), moved with
    /// the underlay on an IPv6-only node.
    vx6: Option<crate::kernel::Vxlan6Spec>,
    /// The peers found unreachable (`no_common_underlay`) at the last
    /// pass: each is said once, when it becomes so, not at every pass.
    unreachable: BTreeSet<String>,
    own_name: String,
    own: PodCidrs,
    cluster: ClusterCidrs,
    metrics: Arc<Metrics>,
    last_desired: Option<OverlayState>,
    /// What the kernel held after the last good pass. Event passes diff
    /// against it instead of dumping 3 entries per peer again (15-20 ms at
    /// 5,000 peers); full passes (drift, the resync) always dump.
    kernel_cache: Option<OverlayState>,
    fast: FastPath,
    /// The underlay subnets whose peers are routed directly (empty: direct
    /// routing off, every peer through vxlan.1).
    direct: Vec<Cidr>,
    filter: UnderlayFilter,
    /// What `kwatch` compares notifications with.
    watched: Arc<Watched>,
    /// What `watched` was last told, so an unchanged pass does not clone
    /// the desired state again.
    published: Option<(VxlanSpec, OverlayState)>,
}

/// What the underlay re-read found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UnderlayChange {
    Same,
    /// Direct routing's subnets changed: the desired routes may differ.
    Subnets,
    /// Another interface or address: vxlan.1 (on an IPv6-only node
    /// vxlan6.1) moves, the host IP is republished.
    Moved,
}

/// Why the loop wakes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    /// The first pass, the resync, a retry after a failure, a new kernel
    /// subscription (whatever it missed): a full pass.
    Full,
    Nodes,
    Pods,
    /// The kernel says the agent's state differs from what it wants: a
    /// full pass re-reads the kernel and repairs it.
    Drift,
    Underlay,
    /// Only the liveness heartbeat, and a pending publication's retry.
    Beat,
}

fn same_vxlan(a: &VxlanSpec, b: &VxlanSpec) -> bool {
    a.name == b.name
        && a.vni == b.vni
        && a.port == b.port
        && a.underlay_index == b.underlay_index
        && a.local_ip == b.local_ip
        && a.mtu == b.mtu
        && a.mac == b.mac
        && a.address == b.address
}

impl Loop {
    /// Tells `kwatch` what this pass is about to write, before it writes.
    /// Nothing on an IPv6-only node: `Expected` is `vxlan.1`'s, and
    /// `kwatch` judges `vxlan6.1`'s notifications without it.
    fn publish_expected(&mut self, want: &OverlayState) {
        let Some(me) = &self.vx else {
            return;
        };
        if self
            .published
            .as_ref()
            .is_some_and(|(vx, o)| same_vxlan(vx, me) && o == want)
        {
            return;
        }
        self.watched.expect(Expected::new(me.clone(), want.clone()));
        self.published = Some((me.clone(), want.clone()));
    }

    /// The pods' MTU: `vxlan.1`'s, or on an IPv6-only node `vxlan6.1`'s.
    fn pods_mtu(&self) -> u32 {
        match (&self.vx, &self.vx6) {
            (Some(vx), _) => vx.mtu,
            (None, Some(vx6)) => vx6.mtu,
            (None, None) => 0,
        }
    }

    /// The host IP annotation to republish when the underlay moved, with
    /// the address: the IPv4 one, or on an IPv6-only node the IPv6 one.
    fn host_ip(&self) -> Option<(&'static str, IpAddr)> {
        match (&self.vx, &self.vx6) {
            (Some(vx), _) => Some((ANNOTATION_HOST_IP, vx.local_ip.into())),
            (None, Some(vx6)) => Some((ANNOTATION_HOST_IP6, vx6.local_ip.into())),
            (None, None) => None,
        }
    }

    /// `read_pods`: the kernel said pods came or went (`kwatch`); full
    /// passes read them anyway.
    async fn pass(&mut self, nodes: &[Arc<Node>], full: bool, read_pods: bool) -> Result<()> {
        let _timer = self.metrics.reconcile_started();
        let views: Vec<NodeView> = nodes.iter().map(|n| node_view(n)).collect();
        let crate::peers::Selection {
            peers,
            peers6,
            rejected,
        } = crate::peers::select_all(&views, &self.own_name, self.own, self.cluster);
        let want = reconcile::desired_direct(&peers, &self.direct);
        self.publish_expected(&want);
        // No vxlan.1 (an IPv6-only node): index 0, nothing on it to dump
        // or apply; `peers` is empty there.
        let (index, recreated) = match &self.vx {
            Some(vx) => {
                let r = netlink_timed(NetlinkOp::EnsureVxlan, self.kernel.ensure_vxlan(vx)).await?;
                self.watched.set_vxlan_index(r.0);
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
            self.watched.set_vxlan6_index(i6);
            if self.vx.is_none() {
                self.watched.set_underlay6_index(vx6.underlay_index);
            }
            index6 = Some(i6);
        } else if !peers6.is_empty() {
            tracing::warn!(
                peers = peers6.len(),
                "peers reachable over an IPv6 underlay only, but this node has none (--underlay6): their pods are unreachable"
            );
        }
        if recreated || full {
            self.kernel_cache = None;
        }
        if let Some(vx) = self.vx.as_ref().filter(|_| recreated) {
            tracing::warn!(device = %vx.name, "VXLAN device was missing or wrong and has been recreated");
        }
        // A new vxlan.1 or vxlan6.1 has a new ifindex: the fast path must
        // re-attach now, not when a notification of our own delete or the
        // safety-net pass comes round.
        let full = full || recreated || recreated6;
        let mut by_reason: BTreeMap<&'static str, u64> = BTreeMap::new();
        let mut unreachable = BTreeSet::new();
        for (name, why) in &rejected {
            *by_reason.entry(why.reason()).or_default() += 1;
            if let Reject::NoCommonUnderlay(_) = why {
                if !self.unreachable.contains(name) {
                    tracing::warn!(node = %name, reason = why.reason(), "not programming node: {why}");
                }
                unreachable.insert(name.clone());
            } else if why.ipv6_side_only() && self.vx.is_some() {
                tracing::warn!(node = %name, reason = why.reason(), "programming node without its IPv6 side: {why}");
            } else if !matches!(why, crate::peers::Reject::Incomplete(_)) {
                tracing::warn!(node = %name, reason = why.reason(), "not programming node: {why}");
            } else {
                tracing::debug!(node = %name, "not programming node yet: {why}");
            }
        }
        self.unreachable = unreachable;
        if let Ok(mut r) = self.metrics.rejected.lock() {
            *r = by_reason;
        }
        let underlay = match &self.vx {
            Some(vx) if !self.direct.is_empty() => vx.underlay_index,
            _ => 0,
        };
        let mut have = match self.kernel_cache.take() {
            Some(c) => c,
            None if self.vx.is_none() => OverlayState::default(),
            None => netlink_timed(NetlinkOp::Dump, self.kernel.dump(index, underlay)).await?,
        };
        let actions = reconcile::diff(&want, &have);
        let mut failed = if self.vx.is_some() {
            self.kernel.apply(index, underlay, &actions).await
        } else {
            0
        };
        // vxlan6.1 after vxlan.1: a peer moving from it to vxlan.1 has its
        // routes replaced there first, and is then no longer here.
        let mut state6 = None;
        if let Some(i6) = index6 {
            let want6 = reconcile::desired_underlay6(&peers6);
            let mut have6 = netlink_timed(NetlinkOp::Dump, self.kernel.dump_vxlan6(i6)).await?;
            let actions6 = reconcile::diff(&want6, &have6);
            if !actions6.is_empty() {
                tracing::info!(
                    changes = actions6.len(),
                    peers = peers6.len(),
                    "reconciled the overlay over IPv6"
                );
            }
            failed += self.kernel.apply_vxlan6(i6, &actions6).await;
            // What the fast path mirrors, used only when nothing failed.
            reconcile::apply(&mut have6, &actions6);
            state6 = Some((i6, have6));
        }
        // After the kernel, not before: the set is rewritten through `nft`
        // (tens of ms with 5,000 peers), which would otherwise delay every
        // route, neighbour and FDB change behind it. A new peer's VXLAN is
        // refused by the filter for those few ms, which its first packets'
        // retransmission covers.
        self.filter.sync(
            peers.iter().map(|p| p.host_ip),
            peers
                .iter()
                .filter_map(|p| Some(p.underlay6?.host_ip))
                .chain(peers6.iter().map(|p| p.underlay6.host_ip)),
        );
        if full {
            crate::tables::antispoof::ensure(&self.metrics);
        }
        if failed == 0 {
            reconcile::apply(&mut have, &actions);
            if self.fast.active() {
                // Pods change only through the plugin: read them when the
                // kernel says so and on full passes, not on every Node event.
                let pods = if full || read_pods {
                    Some(netlink_timed(NetlinkOp::PodEndpoints, self.kernel.pod_endpoints()).await?)
                } else {
                    None
                };
                let vxlan6 = state6
                    .as_ref()
                    .zip(self.vx6.as_ref())
                    .map(|((i6, o6), vx6)| crate::datapath::Vxlan6State {
                        ifindex: *i6,
                        mac: vx6.mac,
                        overlay: o6,
                    });
                self.fast
                    .sync(index, self.vx.as_ref(), &have, pods.as_ref(), vxlan6)
                    .context("syncing the eBPF maps")?;
            }
            self.kernel_cache = Some(have);
        }
        if !actions.is_empty() {
            tracing::info!(
                changes = actions.len(),
                failed,
                peers = peers.len(),
                "reconciled overlay"
            );
        }
        let m = &self.metrics;
        m.kernel_actions
            .fetch_add(actions.len() as u64, Ordering::Relaxed);
        if full && self.last_desired.as_ref() == Some(&want) && !actions.is_empty() {
            m.drift_repaired
                .fetch_add(actions.len() as u64, Ordering::Relaxed);
            tracing::warn!(changes = actions.len(), ?actions, "repaired kernel drift");
        }
        m.peers_programmed
            .store((peers.len() + peers6.len()) as u64, Ordering::Relaxed);
        m.reconcile_runs.fetch_add(1, Ordering::Relaxed);
        if failed > 0 {
            bail!("{failed} of {} kernel updates failed", actions.len());
        }
        self.last_desired = Some(want);
        Ok(())
    }

    /// Re-reads the underlay (on full passes, and when the kernel says an
    /// address, a route or the underlay link changed): direct routing
    /// follows its subnets, and vxlan.1 follows its address (on an
    /// IPv6-only node, vxlan6.1 follows the IPv6 underlay's).
    async fn refresh_underlay(&mut self, cfg: &Config) -> UnderlayChange {
        let how = match cfg.underlay() {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the underlay");
                return UnderlayChange::Same;
            }
        };
        let mut change = UnderlayChange::Same;
        let Some(vx) = self.vx.as_mut() else {
            let Some(vx6) = self.vx6.as_mut() else {
                return change;
            };
            match self
                .kernel
                .select_underlay_ipv6(&how, &cfg.underlay6, Some(vx6.local_ip))
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
        match self.kernel.select_underlay(&how).await {
            Ok(u) => {
                if cfg.direct_routing && u.subnets != self.direct {
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

/// Subscribes to kernel notifications; None (said why) when the kernel
/// refuses, and the loop tries again at its next heartbeat.
fn subscribe(signals: &Signals, watched: &Arc<Watched>) -> Option<JoinHandle<()>> {
    match crate::kwatch::spawn(signals.clone(), watched.clone()) {
        Ok(h) => Some(h),
        Err(e) => {
            tracing::warn!(error = %e, "cannot subscribe to kernel notifications; retrying, full passes meanwhile");
            None
        }
    }
}

/// A failure's backoff: doubles from [`RETRY_MIN`] up to [`RETRY_MAX`].
fn backoff(last: Option<Duration>) -> Duration {
    last.map_or(RETRY_MIN, |d| (d * 2).min(RETRY_MAX))
}

pub(super) async fn run(cfg: &Config, metrics: Arc<Metrics>, started: Started) -> Result<()> {
    let Started {
        client,
        nodes,
        node_name,
        own,
        kernel,
        vx,
        vx6,
        underlay_subnets,
        filter,
        fast,
    } = started;
    let (reader, changed) = watch_nodes(client, metrics.clone()).await;

    // Subscribed before the first (full) pass reads the kernel, so no pod
    // and no drift is missed in between.
    let signals = Signals::default();
    let watched = Watched::new(cfg.vxlan_name.clone(), cfg.underlay()?);
    watched.set_ipv6_underlay(vx.is_none());
    let mut subscription = subscribe(&signals, &watched);
    let _pins = if fast.active() {
        crate::kwatch::spawn_pins(&cfg.pin_dir, signals.overlay.clone())
            .map_err(|e| tracing::warn!(error = %e, pin_dir = %cfg.pin_dir.display(), "cannot watch the map pins; removed pins come back at the next full pass"))
            .ok()
    } else {
        None
    };
    let mut lp = Loop {
        kernel,
        vx,
        vx6,
        unreachable: BTreeSet::new(),
        own_name: node_name.clone(),
        own,
        cluster: cfg.clusters(),
        metrics: metrics.clone(),
        last_desired: None,
        kernel_cache: None,
        fast,
        filter,
        watched: watched.clone(),
        published: None,
        direct: if cfg.direct_routing {
            underlay_subnets
        } else {
            vec![]
        },
    };
    let mut handed_over = false;
    let mut republish = false;
    // The full pass: a safety net for what no notification reported.
    let mut resync = tokio::time::interval_at(Instant::now() + cfg.resync, cfg.resync);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The heartbeat: the loop beats from its idle wait, so /healthz means
    // "the loop comes back to wait", whatever the resync.
    let period = Liveness::period(cfg.resync);
    let mut beat = tokio::time::interval_at(Instant::now() + period, period);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A failed pass or publication is retried on its own timer, not left
    // to the next resync minutes later.
    let (mut retry_at, mut retry_delay): (Option<Instant>, Option<Duration>) = (None, None);
    let freeze = test_freeze_file();
    let mut why = Why::Full;
    loop {
        if let Some(f) = &freeze {
            while f.exists() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let full = matches!(why, Why::Full | Why::Drift);
        let mut run_pass = !matches!(why, Why::Underlay | Why::Beat);
        // Not on drift: kwatch reports underlay changes on their own, and
        // the re-read (a dump of every IPv4 route for `default-route`)
        // would only delay the repair.
        if matches!(why, Why::Full | Why::Underlay) {
            match lp.refresh_underlay(cfg).await {
                UnderlayChange::Moved => {
                    republish = true;
                    run_pass = true;
                }
                UnderlayChange::Subnets => run_pass = true,
                UnderlayChange::Same => {}
            }
        }
        let mut failed = false;
        if run_pass {
            let events = metrics.take_node_events();
            let snapshot = reader.state();
            ensure_pod_cidr_unchanged(&snapshot, &node_name, lp.own, lp.cluster)?;
            let result = lp.pass(&snapshot, full, full || why == Why::Pods).await;
            if result.is_ok() {
                events.applied();
            }
            match result {
                Ok(()) if !handed_over || !cfg.cni_conf_dir.join(CONFLIST_NAME).exists() => {
                    // The conflist goes out only once the overlay is up and peers
                    // are programmed: the runtime starts pods as soon as it sees it.
                    let conf = conflist(cfg, lp.own, lp.pods_mtu());
                    write_atomic(
                        &cfg.cni_conf_dir.join(CONFLIST_NAME),
                        serde_json::to_string_pretty(&conf)?.as_bytes(),
                    )?;
                    write_atomic(&ready_file(cfg), b"ready\n")?;
                    if let Err(e) = set_network_available(&nodes, &node_name).await {
                        tracing::warn!(error = %e, "cannot set NetworkUnavailable=False yet");
                        failed = true;
                    } else {
                        handed_over = true;
                    }
                    set_ready(&metrics, &lp);
                }
                Ok(()) => {
                    // Drift repair recreated the ready marker's precondition.
                    if !ready_file(cfg).exists() {
                        write_atomic(&ready_file(cfg), b"ready\n")?;
                    }
                    set_ready(&metrics, &lp);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reconcile failed; retrying");
                    metrics.reconcile_errors.fetch_add(1, Ordering::Relaxed);
                    failed = true;
                }
            }
        }
        // After the pass, so vxlan.1 has moved first.
        if republish {
            let done = match lp.host_ip() {
                Some((key, ip)) => republish_host_ip(cfg, &node_name, key, ip).await,
                None => true,
            };
            if done {
                republish = false;
            } else {
                failed = true;
            }
        }
        if failed {
            let d = backoff(retry_delay);
            retry_delay = Some(d);
            retry_at = Some(Instant::now() + d);
        } else if run_pass {
            // A pending retry stays pending through heartbeats.
            (retry_at, retry_delay) = (None, None);
        }
        metrics.liveness.beat();
        why = tokio::select! {
            () = changed.notified() => Why::Nodes,
            () = signals.pods.notified() => Why::Pods,
            () = signals.overlay.notified() => Why::Drift,
            () = signals.underlay.notified() => Why::Underlay,
            () = async move {
                match retry_at {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            } => {
                retry_at = None;
                Why::Full
            }
            _ = resync.tick() => Why::Full,
            () = async {
                match subscription.as_mut() {
                    Some(h) => {
                        let _ = h.await;
                    }
                    None => std::future::pending().await,
                }
            } => {
                tracing::warn!("kernel notifications ended; subscribing again");
                subscription = subscribe(&signals, &watched);
                // What happened while nobody listened.
                Why::Full
            }
            _ = beat.tick() => {
                if subscription.is_none() {
                    subscription = subscribe(&signals, &watched);
                    if subscription.is_some() { Why::Full } else { Why::Beat }
                } else {
                    Why::Beat
                }
            }
        };
    }
}

/// Test hook: with `MYCNI_TEST_FAULT=freeze-loop:<file>`, the loop stops
/// before its next pass for as long as `<file>` exists, as a loop wedged in
/// a call would (tests/e2e/tests/deploy_probes.rs watches /healthz turn
/// unhealthy). Without the variable, which nothing in deploy/ sets, the loop
/// is unchanged.
fn test_freeze_file() -> Option<std::path::PathBuf> {
    let v = std::env::var("MYCNI_TEST_FAULT").ok()?;
    let path = v.strip_prefix("freeze-loop:")?;
    tracing::warn!(
        file = path,
        "test hook: the loop stops while this file exists"
    );
    Some(path.into())
}

/// Starts the watch on every Node and returns its cache, and the signal each
/// event raises, once the initial list is complete.
async fn watch_nodes(client: kube::Client, metrics: Arc<Metrics>) -> (Store<Node>, Arc<Notify>) {
    let (reader, writer) = reflector::store::<Node>();
    let changed = Arc::new(Notify::new());
    let watch_changed = changed.clone();
    let synced = Arc::new(Notify::new());
    let watch_synced = synced.clone();
    let watch_reader = reader.clone();
    tokio::spawn(async move {
        // Small pages bound the list's peak memory; stripping every Node to
        // what the overlay reads keeps the cache at ~1 KB a Node instead of
        // the ~40 KB a kubelet-maintained Node weighs (managedFields, status
        // images): 5,000 real Nodes would otherwise cost ~250 MB.
        let stream = watcher(
            Api::<Node>::all(client),
            watcher::Config::default().page_size(100),
        )
        .default_backoff()
        .modify(strip_node)
        .reflect(writer);
        tokio::pin!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(watcher::Event::InitDone) => {
                    tracing::info!(
                        nodes = watch_reader.state().len(),
                        "initial Node list complete"
                    );
                    metrics.api_reachable.store(true, Ordering::Relaxed);
                    watch_synced.notify_one();
                    watch_changed.notify_one();
                }
                Ok(_) => {
                    metrics.api_reachable.store(true, Ordering::Relaxed);
                    metrics.node_event();
                    watch_changed.notify_one();
                }
                Err(e) => {
                    // The last known state stays programmed: an unreachable
                    // API must not tear down the datapath.
                    metrics.api_reachable.store(false, Ordering::Relaxed);
                    tracing::warn!(error = %e, "Node watch failed; retrying with backoff, keeping the datapath as it is");
                }
            }
        }
    });
    synced.notified().await;
    (reader, changed)
}

/// Pods, the conflist and vxlan.1's addresses all derive from the
/// podCIDRs: a new one (of either family, an IPv6 one added or removed
/// included) means starting over (the DaemonSet restarts the agent),
/// rather than half-adopting it.
fn ensure_pod_cidr_unchanged(
    snapshot: &[Arc<Node>],
    node_name: &str,
    own: PodCidrs,
    cluster: ClusterCidrs,
) -> Result<()> {
    if let Some(n) = snapshot
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(node_name))
    {
        let view = node_view(n);
        let now = view.own_pod_cidrs(cluster);
        if now.as_ref().ok() != Some(&own) {
            bail!(
                "this Node's podCIDRs changed from {own} to {}; exiting so the agent restarts with them",
                now.map_or_else(|e| e, |c| c.to_string())
            );
        }
    }
    Ok(())
}

fn set_ready(metrics: &Metrics, lp: &Loop) {
    metrics.set_ready(format!(
        "overlay up, {} peers; {}{}",
        metrics.peers_programmed.load(Ordering::Relaxed),
        lp.fast.describe(),
        if lp.vx.is_none() {
            format!("; {IPV6_ONLY}")
        } else {
            String::new()
        }
    ));
}

/// Publishes the moved host IP as annotation `key` (through
/// `nodes/status`, as `announce` does); true once the API took it. On a client of its own: the pooled
/// connections of the loop's client may be bound to the address that just
/// vanished, and a request on one hangs until TCP gives up. Bounded all
/// the same, and retried by the loop.
async fn republish_host_ip(cfg: &Config, node_name: &str, key: &str, host_ip: IpAddr) -> bool {
    let patch = serde_json::json!({ "metadata": { "annotations": {
        key: host_ip.to_string(),
    }}});
    let publish = async {
        let nodes: Api<Node> = Api::all(kube_client(cfg.kubeconfig.as_deref()).await?);
        nodes
            .patch_status(node_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        anyhow::Ok(())
    };
    match tokio::time::timeout(Duration::from_secs(2), publish).await {
        Ok(Ok(())) => {
            tracing::info!(host_ip = %host_ip, "republished the host IP");
            true
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot republish the host IP yet");
            false
        }
        Err(_) => {
            tracing::warn!("republishing the host IP: no answer within 2 s; retrying");
            false
        }
    }
}
