//! The loop, once start-up is done: watch every Node, reconcile the overlay
//! against them, apply the difference to the kernel and the eBPF maps, and
//! publish the node (conflist, ready marker, NetworkUnavailable=False, the
//! host IP when the underlay moves). A pass runs on every Node change, when
//! the kernel says pods came or went, and every resync period (full passes,
//! so kernel drift and missed deletes heal).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::Notify;

use super::startup::Started;
use super::{
    CONFLIST_NAME, Config, conflist, node_view, ready_file, set_network_available, strip_node,
    write_atomic,
};
use crate::fastpath::FastPath;
use crate::kernel::{Kernel, VxlanSpec};
use crate::metrics::{Metrics, NetlinkOp, netlink_timed};
use crate::peers::{ANNOTATION_HOST_IP, Cidr, NodeView, select_peers};
use crate::reconcile::{self, OverlayState};
use crate::underlay_filter::UnderlayFilter;

/// State the reconcile loop keeps between passes.
struct Loop {
    kernel: Kernel,
    vx: VxlanSpec,
    own_name: String,
    own_cidr: Cidr,
    cluster: Cidr,
    metrics: Arc<Metrics>,
    last_desired: Option<OverlayState>,
    /// What the kernel held after the last good pass. Event passes diff
    /// against it instead of dumping 3 entries per peer again (15-20 ms at
    /// 5,000 peers); the periodic pass always dumps, so drift is still
    /// found within one resync period.
    kernel_cache: Option<OverlayState>,
    fast: FastPath,
    /// The underlay subnets whose peers are routed directly (empty: direct
    /// routing off, every peer through vxlan.1).
    direct: Vec<Cidr>,
    filter: UnderlayFilter,
    /// The VXLAN device's ifindex as of the last pass, for `kwatch` to tell
    /// its neighbours' deletions from other devices'.
    vxlan_index: Arc<AtomicU32>,
}

impl Loop {
    /// `read_pods`: the kernel said pods came or went (`kwatch`); full
    /// passes read them anyway.
    async fn pass(&mut self, nodes: &[Arc<Node>], full: bool, read_pods: bool) -> Result<()> {
        let _timer = self.metrics.reconcile_started();
        let (index, recreated) =
            netlink_timed(NetlinkOp::EnsureVxlan, self.kernel.ensure_vxlan(&self.vx)).await?;
        self.vxlan_index.store(index, Ordering::Relaxed);
        if recreated || full {
            self.kernel_cache = None;
        }
        if recreated {
            tracing::warn!(device = %self.vx.name, "VXLAN device was missing or wrong and has been recreated");
        }
        // A new vxlan.1 has a new ifindex: the fast path must re-attach now.
        let full = full || recreated;
        let views: Vec<NodeView> = nodes.iter().map(|n| node_view(n)).collect();
        let (peers, rejected) =
            select_peers(&views, &self.own_name, Some(self.own_cidr), self.cluster);
        let mut by_reason: BTreeMap<&'static str, u64> = BTreeMap::new();
        for (name, why) in &rejected {
            *by_reason.entry(why.reason()).or_default() += 1;
            if !matches!(why, crate::peers::Reject::Incomplete(_)) {
                tracing::warn!(node = %name, reason = why.reason(), "not programming node: {why}");
            } else {
                tracing::debug!(node = %name, "not programming node yet: {why}");
            }
        }
        if let Ok(mut r) = self.metrics.rejected.lock() {
            *r = by_reason;
        }
        self.filter.sync(peers.iter().map(|p| p.host_ip));
        let want = reconcile::desired_direct(&peers, &self.direct);
        let underlay = if self.direct.is_empty() {
            0
        } else {
            self.vx.underlay_index
        };
        let mut have = match self.kernel_cache.take() {
            Some(c) => c,
            None => netlink_timed(NetlinkOp::Dump, self.kernel.dump(index, underlay)).await?,
        };
        let actions = reconcile::diff(&want, &have);
        let failed = self.kernel.apply(index, underlay, &actions).await;
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
                self.fast
                    .sync(index, &self.vx, &have, pods.as_ref())
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
            .store(peers.len() as u64, Ordering::Relaxed);
        m.reconcile_runs.fetch_add(1, Ordering::Relaxed);
        if failed > 0 {
            bail!("{failed} of {} kernel updates failed", actions.len());
        }
        self.last_desired = Some(want);
        Ok(())
    }

    /// Re-reads the underlay (full passes only): direct routing follows its
    /// subnets, and vxlan.1 follows its address. True when the host IP moved
    /// and must be republished.
    async fn refresh_underlay(&mut self, cfg: &Config) -> bool {
        let how = match cfg.underlay() {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the underlay");
                return false;
            }
        };
        match self.kernel.select_underlay(&how).await {
            Ok(u) => {
                if cfg.direct_routing && u.subnets != self.direct {
                    tracing::info!(subnets = ?u.subnets, "peers on these underlay subnets are routed directly");
                    self.direct = u.subnets.clone();
                }
                if u.ip != self.vx.local_ip || u.index != self.vx.underlay_index {
                    tracing::warn!(old = %self.vx.local_ip, new = %u.ip, underlay = %u.name, "the underlay address changed; moving vxlan.1 and republishing");
                    self.vx.local_ip = u.ip;
                    self.vx.underlay_index = u.index;
                    return true;
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot read the underlay"),
        }
        false
    }
}

pub(super) async fn run(cfg: &Config, metrics: Arc<Metrics>, started: Started) -> Result<()> {
    let Started {
        client,
        nodes,
        node_name,
        own_cidr,
        kernel,
        vx,
        underlay_subnets,
        filter,
        fast,
    } = started;
    let (reader, changed) = watch_nodes(client, metrics.clone()).await;

    // Subscribed before the first (full) pass reads the kernel, so no pod
    // and no drift is missed in between. Only the fast path reads pods.
    let pods_changed = Arc::new(Notify::new());
    let drifted = Arc::new(Notify::new());
    let vxlan_index = Arc::new(AtomicU32::new(0));
    if let Err(e) = crate::kwatch::spawn(
        pods_changed.clone(),
        drifted.clone(),
        vx.name.clone(),
        vxlan_index.clone(),
    ) {
        tracing::warn!(error = %e, "cannot subscribe to kernel notifications; new pods and drift are caught at the next full pass");
    }
    let mut lp = Loop {
        kernel,
        vx,
        own_name: node_name.clone(),
        own_cidr,
        cluster: cfg.cluster_cidr,
        metrics: metrics.clone(),
        last_desired: None,
        kernel_cache: None,
        fast,
        filter,
        vxlan_index,
        direct: if cfg.direct_routing {
            underlay_subnets
        } else {
            vec![]
        },
    };
    let mut handed_over = false;
    let mut republish = false;
    let mut tick = tokio::time::interval(cfg.resync);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut full, mut read_pods) = (true, true);
    let freeze = test_freeze_file();
    loop {
        if let Some(f) = &freeze {
            while f.exists() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let events = metrics.take_node_events();
        let snapshot = reader.state();
        ensure_pod_cidr_unchanged(&snapshot, &node_name, own_cidr)?;
        if full && lp.refresh_underlay(cfg).await {
            republish = true;
        }
        let result = lp.pass(&snapshot, full, read_pods).await;
        if result.is_ok() {
            events.applied();
        }
        match result {
            Ok(()) if !handed_over || !cfg.cni_conf_dir.join(CONFLIST_NAME).exists() => {
                // The conflist goes out only once the overlay is up and peers
                // are programmed: the runtime starts pods as soon as it sees it.
                let conf = conflist(cfg, own_cidr, lp.vx.mtu);
                write_atomic(
                    &cfg.cni_conf_dir.join(CONFLIST_NAME),
                    serde_json::to_string_pretty(&conf)?.as_bytes(),
                )?;
                write_atomic(&ready_file(cfg), b"ready\n")?;
                if let Err(e) = set_network_available(&nodes, &node_name).await {
                    tracing::warn!(error = %e, "cannot set NetworkUnavailable=False yet");
                } else {
                    handed_over = true;
                }
                set_ready(&metrics, &lp.fast);
            }
            Ok(()) => {
                // Drift repair recreated the ready marker's precondition.
                if !ready_file(cfg).exists() {
                    write_atomic(&ready_file(cfg), b"ready\n")?;
                }
                set_ready(&metrics, &lp.fast);
            }
            Err(e) => {
                tracing::warn!(error = %e, "reconcile failed; retrying");
                metrics.reconcile_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        // After the pass, so vxlan.1 has moved first.
        if republish && republish_host_ip(&nodes, &node_name, lp.vx.local_ip).await {
            republish = false;
        }
        metrics.liveness.beat();
        (full, read_pods) = tokio::select! {
            () = changed.notified() => (false, false),
            () = pods_changed.notified() => (false, true),
            // A full pass re-reads the kernel and repairs what was removed.
            () = drifted.notified() => (true, true),
            _ = tick.tick() => (true, true),
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

/// Pods, the conflist and vxlan.1's address all derive from the podCIDR:
/// a new one means starting over (the DaemonSet restarts the agent), rather
/// than half-adopting it.
fn ensure_pod_cidr_unchanged(snapshot: &[Arc<Node>], node_name: &str, own: Cidr) -> Result<()> {
    if let Some(n) = snapshot
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(node_name))
    {
        let now = n.spec.as_ref().and_then(|s| s.pod_cidr.as_deref());
        if now.and_then(|c| Cidr::parse_network(c).ok()) != Some(own) {
            bail!(
                "this Node's podCIDR changed from {own} to {}; exiting so the agent restarts with it",
                now.unwrap_or("none")
            );
        }
    }
    Ok(())
}

fn set_ready(metrics: &Metrics, fast: &FastPath) {
    metrics.set_ready(format!(
        "overlay up, {} peers; {}",
        metrics.peers_programmed.load(Ordering::Relaxed),
        fast.describe()
    ));
}

/// Publishes the moved host IP (through `nodes/status`, as `announce`
/// does); true once the API took it. Bounded: the
/// pooled API connection may still be bound to the address that just
/// vanished and would hang until TCP gives up.
async fn republish_host_ip(nodes: &Api<Node>, node_name: &str, host_ip: Ipv4Addr) -> bool {
    let patch = serde_json::json!({ "metadata": { "annotations": {
        ANNOTATION_HOST_IP: host_ip.to_string(),
    }}});
    let pp = PatchParams::default();
    let merge = Patch::Merge(&patch);
    let patch = nodes.patch_status(node_name, &pp, &merge);
    match tokio::time::timeout(Duration::from_secs(2), patch).await {
        Ok(Ok(_)) => {
            tracing::info!(host_ip = %host_ip, "republished the host IP");
            true
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot republish the host IP yet");
            false
        }
        Err(_) => {
            tracing::warn!(
                "republishing the host IP: no answer within 2 s; retrying on a new connection"
            );
            false
        }
    }
}
