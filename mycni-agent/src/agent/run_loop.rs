//! The loop, once start-up is done: watch every Node, reconcile the overlay
//! against them, apply the difference to the kernel and the eBPF maps, and
//! publish the node (conflist, ready marker, NetworkUnavailable=False, the
//! host IP when the underlay moves). A pass runs on every Node change, when
//! the kernel says pods came or went or the agent's state drifted, when the
//! underlay moved, after a failed pass (with backoff), and every resync
//! period (a full pass: the safety net for whatever no notification told).

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Result, bail};
use k8s_openapi::api::core::v1::Node;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::config::Config;
use super::publish::Publisher;
use super::startup::Started;
use crate::datapath::DatapathRoom;
use crate::metrics::{Liveness, Metrics};
use crate::overlay::{Desire, Device, Inputs, OverlayRoom, UnderlayChange, Update};
use crate::tables::TablesRoom;
use crate::topology::{IPV6_ONLY, OverlayState, VxlanSpec};
use crate::watch::kernel::{Expected, Signals, Watched};
use crate::watch::{ApiWatch, node_view};
use mycni_common::contract::{ANNOTATION_HOST_IP, ANNOTATION_HOST_IP6};
use mycni_common::net::{ClusterCidrs, PodCidrs};

/// The first retry of a failed pass or host IP publication; each failure
/// in a row doubles it, up to [`RETRY_MAX`]. Short: a failure is usually
/// a race with someone else's change that the next pass resolves.
const RETRY_MIN: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// State the reconcile loop keeps between passes: the rooms, and what
/// the pass tells the kernel watch.
struct Loop {
    /// The overlay room: devices, peers, nexthops, routes, neighbours, FDB.
    overlay: OverlayRoom,
    /// The overlay's desired state between passes: a Node event
    /// recomputes the changed Nodes only.
    desire: Desire<Node>,
    /// The datapath room: the tc programs and their maps.
    datapath: DatapathRoom,
    /// The node tables room: masquerade, anti-spoofing, underlay filter.
    tables: TablesRoom,
    own_name: String,
    own: PodCidrs,
    cluster: ClusterCidrs,
    metrics: Arc<Metrics>,
    /// What the kernel watch compares notifications with.
    watched: Arc<Watched>,
    /// What `watched` was last told, so an unchanged pass does not clone
    /// the desired state again.
    published: Option<(VxlanSpec, OverlayState)>,
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

impl Why {
    /// The pass re-reads the kernel and computes every room whole.
    fn is_full(self) -> bool {
        matches!(self, Why::Full | Why::Drift)
    }
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

/// The steps of a pass, in order, as its timings name them.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// The overlay's desired state (incremental on a Node event).
    Desire,
    /// What the kernel watch is told to expect.
    Expected,
    Devices,
    /// The overlay's diff and kernel writes: a Node event is in the
    /// kernel at the end of this one.
    Overlay,
    Tables,
    Datapath,
    Finish,
}

/// How long each step of a pass took, logged at debug level (`MYCNI_LOG=
/// mycni_agent::agent::run_loop=debug`): where a Node event's time goes.
struct Timings {
    last: std::time::Instant,
    us: [u64; 7],
}

impl Timings {
    fn start() -> Self {
        Timings {
            last: std::time::Instant::now(),
            us: [0; 7],
        }
    }

    fn lap(&mut self, p: Phase) {
        let now = std::time::Instant::now();
        self.us[p as usize] = u64::try_from((now - self.last).as_micros()).unwrap_or(u64::MAX);
        self.last = now;
    }

    fn log(&self, full: bool, incremental: bool) {
        let [desire, expected, devices, overlay, tables, datapath, finish] = self.us;
        tracing::debug!(
            full,
            incremental,
            desire,
            expected,
            devices,
            overlay,
            tables,
            datapath,
            finish,
            "pass timings (us)"
        );
    }
}

impl Loop {
    /// Tells `kwatch` what this pass is about to write, before it writes.
    /// Nothing on an IPv6-only node: `Expected` is `vxlan.1`'s, and
    /// `kwatch` judges `vxlan6.1`'s notifications without it.
    ///
    /// `touched`: an incremental pass's keys. Every pass publishes its
    /// state (or finds it published), so what was published is the state
    /// the incremental one was made from, and differs from `want` only
    /// within those keys: they alone are compared, and the state copied
    /// once, not compared whole and copied twice (three entries a peer,
    /// ~1.4 ms at 5,000 peers).
    fn publish_expected(&mut self, want: &OverlayState, touched: Option<&OverlayState>) {
        let Some(me) = self.overlay.vxlan() else {
            return;
        };
        match (self.published.as_mut(), touched) {
            (Some((vx, o)), Some(keys)) if same_vxlan(vx, me) => {
                if !o.follow_within(want, keys) {
                    return;
                }
                debug_assert!(o == want, "published state and want differ outside touched");
                self.watched.expect(Expected::new(me.clone(), o.clone()));
                return;
            }
            (Some((vx, o)), _) if same_vxlan(vx, me) && o == want => return,
            _ => {}
        }
        self.watched.expect(Expected::new(me.clone(), want.clone()));
        self.published = Some((me.clone(), want.clone()));
    }

    /// The pods' MTU: `vxlan.1`'s, or on an IPv6-only node `vxlan6.1`'s.
    fn pods_mtu(&self) -> u32 {
        match (self.overlay.vxlan(), self.overlay.vxlan6()) {
            (Some(vx), _) => vx.mtu,
            (None, Some(vx6)) => vx6.mtu,
            (None, None) => 0,
        }
    }

    /// The host IP annotation to republish when the underlay moved, with
    /// the address: the IPv4 one, or on an IPv6-only node the IPv6 one.
    fn host_ip(&self) -> Option<(&'static str, IpAddr)> {
        match (self.overlay.vxlan(), self.overlay.vxlan6()) {
            (Some(vx), _) => Some((ANNOTATION_HOST_IP, vx.local_ip.into())),
            (None, Some(vx6)) => Some((ANNOTATION_HOST_IP6, vx6.local_ip.into())),
            (None, None) => None,
        }
    }

    /// One pass: each room in turn, the overlay first (the others read
    /// what it leaves in the kernel), the node tables, the datapath, and
    /// the overlay's end of pass, as deep as `why` asks: a full pass
    /// re-reads everything; the kernel saying pods came or went reads the
    /// pods.
    async fn pass(&mut self, nodes: &[Arc<Node>], why: Why) -> Result<()> {
        let full = why.is_full();
        let read_pods = full || why == Why::Pods;
        let _timer = self.metrics.reconcile_started();
        let mut t = Timings::start();
        let Update {
            desired,
            touched,
            same_as_last,
        } = self.desire.update(
            nodes,
            (
                |n: &Node| n.metadata.name.as_deref().unwrap_or_default(),
                node_view,
            ),
            Inputs {
                own_name: self.own_name.clone(),
                own: self.own,
                cluster: self.cluster,
                direct: self.overlay.direct().to_vec(),
            },
            full,
        );
        t.lap(Phase::Desire);
        self.publish_expected(&desired.want, touched.as_ref());
        t.lap(Phase::Expected);
        let watched = &self.watched;
        let devices = self
            .overlay
            .ensure_devices(&desired, full, |d| match d {
                Device::Vxlan(i) => watched.set_vxlan_index(i),
                Device::Vxlan6(i) => watched.set_vxlan6_index(i),
                Device::Underlay6(i) => watched.set_underlay6_index(i),
            })
            .await?;
        t.lap(Phase::Devices);
        let applied = self
            .overlay
            .apply(&desired, devices, full, touched.as_ref())
            .await?;
        t.lap(Phase::Overlay);
        let out = self.overlay.output(&applied);
        self.tables
            .apply(desired.hosts(), desired.hosts6(), out.full);
        t.lap(Phase::Tables);
        self.datapath
            .apply(self.overlay.kernel(), &out, read_pods)
            .await?;
        t.lap(Phase::Datapath);
        self.overlay.finish(&desired, same_as_last, applied)?;
        // Kept only after a pass that succeeded: any failure makes the
        // next pass compute the whole state again.
        let incremental = touched.is_some();
        self.desire.keep(desired);
        t.lap(Phase::Finish);
        t.log(full, incremental);
        Ok(())
    }
}

/// Subscribes to kernel notifications; None (said why) when the kernel
/// refuses, and the loop tries again at its next heartbeat.
fn subscribe(signals: &Signals, watched: &Arc<Watched>) -> Option<JoinHandle<()>> {
    match crate::watch::kernel::spawn(signals.clone(), watched.clone()) {
        Ok(h) => Some(h),
        Err(e) => {
            tracing::warn!(error = %e, "cannot subscribe to kernel notifications; retrying, full passes meanwhile");
            None
        }
    }
}

/// Turns the programs' next-hop cache on: a first bump (what an earlier
/// agent's programs cached is stale by then) and one on every kernel
/// notification from now on. Subscribed before the socket is, so no
/// change goes unbumped. Without the map the cache stays off (generation
/// 0): the programs ask the FIB for every packet, as before.
fn nexthop_cache(pin_dir: &std::path::Path, watched: &Watched) {
    let generation = match crate::datapath::NexthopGen::open(pin_dir)
        .and_then(|g| g.bump().map(|_| g))
    {
        Ok(g) => g,
        Err(e) => {
            tracing::warn!(error = %e, "no next-hop cache: every encapsulated packet asks the FIB");
            return;
        }
    };
    let failed = std::sync::atomic::AtomicBool::new(false);
    watched.on_any_notification(Box::new(move || {
        if let Err(e) = generation.bump()
            && !failed.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            // Entries then live out their TTL (1 s at HZ=250).
            tracing::warn!(error = %e, "cannot invalidate the next-hop cache");
        }
    }));
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
    // Its own task and watch: policy events never wake the overlay's pass.
    let (cluster_tx, cluster_rx) = tokio::sync::watch::channel(Arc::default());
    // The Node objects for the flows room, handed over after each pass
    // that read them: the room names other nodes' addresses on its own
    // time, not the pass's.
    let (nodes_tx, nodes_rx) = tokio::sync::watch::channel(crate::flows::Nodes::default());
    // The policy room publishes the cluster each pass reads; without it
    // the view keeps one, so flows still name their pods.
    let _cluster = if cfg.network_policy {
        let section = crate::policy::room::Section {
            node: node_name.clone(),
            state_dir: cfg.state_dir.clone(),
            resync: cfg.resync,
        };
        crate::policy::room::spawn(
            &section,
            crate::policy::room::Deps {
                client: client.clone(),
                metrics: metrics.clone(),
                fast_epoch: Arc::new(crate::datapath::PinnedEpoch(cfg.pin_dir.clone())),
                published: cluster_tx,
            },
        )
    } else {
        crate::cluster::view::spawn(client.clone(), &metrics, cluster_tx)
    };
    let _flows = crate::flows::start(
        crate::flows::Start {
            node: node_name.clone(),
            history: cfg.flow_history,
            pod_series: cfg.flow_pod_series,
            ring_pins: (fast.active() && cfg.flow_events).then(|| cfg.pin_dir.clone()),
        },
        &metrics,
        cluster_rx,
        nodes_rx,
        client.clone(),
    );
    let api = ApiWatch::start(client, &metrics).await;

    // Subscribed before the first (full) pass reads the kernel, so no pod
    // and no drift is missed in between.
    let signals = Signals::default();
    let watched = Watched::new(cfg.vxlan_name.clone(), cfg.iface.clone());
    watched.set_ipv6_underlay(vx.is_none());
    if fast.active() {
        nexthop_cache(&cfg.pin_dir, &watched);
    }
    let mut subscription = subscribe(&signals, &watched);
    let _pins = if fast.active() {
        crate::watch::kernel::spawn_pins(&cfg.pin_dir, signals.overlay.clone())
            .map_err(|e| tracing::warn!(error = %e, pin_dir = %cfg.pin_dir.display(), "cannot watch the map pins; removed pins come back at the next full pass"))
            .ok()
    } else {
        None
    };
    // A legacy attach that waits for a pod's CNI chain wakes a pods pass.
    let fast = fast.with_pods_wake(signals.pods.clone());
    let mut lp = Loop {
        overlay: OverlayRoom::new(
            kernel,
            vx,
            vx6,
            cfg.direct_routing.then_some(underlay_subnets),
            metrics.clone(),
        ),
        desire: Desire::default(),
        datapath: fast,
        tables: TablesRoom::new(filter, metrics.clone()),
        own_name: node_name.clone(),
        own,
        cluster: cfg.clusters(),
        metrics: metrics.clone(),
        watched: watched.clone(),
        published: None,
    };
    let mut publisher = Publisher::new(nodes, node_name.clone(), metrics.clone());
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
    // Where this node's own Node was in the last snapshot, as checked.
    let mut own_node = None;
    loop {
        if let Some(f) = &freeze {
            while f.exists() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let full = why.is_full();
        let mut run_pass = !matches!(why, Why::Underlay | Why::Beat);
        // Not on drift: kwatch reports underlay changes on their own, and
        // the re-read (a dump of every IPv4 route for `default-route`)
        // would only delay the repair.
        if matches!(why, Why::Full | Why::Underlay) {
            match lp
                .overlay
                .refresh_underlay(&cfg.iface, &cfg.underlay6)
                .await
            {
                UnderlayChange::Moved => {
                    publisher.underlay_moved();
                    run_pass = true;
                }
                UnderlayChange::Subnets => run_pass = true,
                UnderlayChange::Same => {}
            }
        }
        let mut failed = false;
        if run_pass {
            let events = metrics.take_node_events();
            let snapshot = api.snapshot();
            own_node = ensure_pod_cidr_unchanged(
                &snapshot.nodes,
                &node_name,
                lp.own,
                lp.cluster,
                own_node,
            )?;
            let result = lp.pass(&snapshot.nodes, why).await;
            if full || why == Why::Nodes {
                nodes_tx.send_replace(Arc::new(snapshot.nodes));
            }
            if result.is_ok() {
                events.applied();
            }
            match result {
                Ok(()) => {
                    let handed = publisher
                        .after_pass(cfg, lp.own, lp.pods_mtu(), ready_detail(&lp))
                        .await?;
                    failed |= !handed;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reconcile failed; retrying");
                    metrics.reconcile_errors.fetch_add(1, Ordering::Relaxed);
                    failed = true;
                }
            }
        }
        // After the pass, so vxlan.1 has moved first.
        failed |= !publisher.republish(cfg, lp.host_ip()).await;
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
            () = api.changed.notified() => Why::Nodes,
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
/// a call would (tests/e2e/tests/deploy/deploy_probes.rs watches /healthz turn
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

/// Pods, the conflist and vxlan.1's addresses all derive from the
/// podCIDRs: a new one (of either family, an IPv6 one added or removed
/// included) means starting over (the DaemonSet restarts the agent),
/// rather than half-adopting it.
///
/// `checked`: where this node's Node was in an earlier snapshot, as
/// checked then (the return value of that call). The watch's cache keeps
/// an unchanged Node in its place, so the same object in the same place
/// is not read again, nor is every Node's name to find it.
fn ensure_pod_cidr_unchanged(
    snapshot: &[Arc<Node>],
    node_name: &str,
    own: PodCidrs,
    cluster: ClusterCidrs,
    checked: Option<(usize, Arc<Node>)>,
) -> Result<Option<(usize, Arc<Node>)>> {
    if let Some((i, was)) = &checked
        && snapshot.get(*i).is_some_and(|n| Arc::ptr_eq(n, was))
    {
        return Ok(checked);
    }
    let Some((i, n)) = snapshot
        .iter()
        .enumerate()
        .find(|(_, n)| n.metadata.name.as_deref() == Some(node_name))
    else {
        return Ok(None);
    };
    let view = node_view(n);
    let now = view.own_pod_cidrs(cluster);
    if now.as_ref().ok() != Some(&own) {
        bail!(
            "this Node's podCIDRs changed from {own} to {}; exiting so the agent restarts with them",
            now.map_or_else(|e| e, |c| c.to_string())
        );
    }
    Ok(Some((i, n.clone())))
}

/// What `/readyz` says once the node is handed over.
fn ready_detail(lp: &Loop) -> String {
    format!(
        "overlay up, {} peers; {}{}",
        lp.metrics
            .collector::<crate::overlay::metrics::OverlayMetrics>()
            .peers_programmed
            .load(Ordering::Relaxed),
        lp.datapath.describe(),
        if lp.overlay.vxlan().is_none() {
            format!("; {IPV6_ONLY}")
        } else {
            String::new()
        }
    )
}
