//! The agent's life: find its Node, bring the overlay up, publish itself,
//! then reconcile peers from a watch on all Nodes, at start, on every
//! change, and periodically (so kernel drift and missed deletes heal).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use mycni_common::contract::{self, Conflist, IpamConf, PluginConf};
use tokio::sync::Notify;

use crate::fastpath::{FastPath, Mode};
use crate::kernel::{Kernel, VxlanSpec};
use crate::metrics::Metrics;
use crate::peers::{ANNOTATION_HOST_IP, ANNOTATION_VTEP_MAC, Cidr, Mac, NodeView, select_peers};
use crate::reconcile::{self, OverlayState};
use crate::underlay_filter::UnderlayFilter;

/// Everything `mycni-agent run` is configured with.
#[derive(Debug, Clone)]
pub struct Config {
    pub node_name: Option<String>,
    pub pod_name: Option<String>,
    pub pod_namespace: Option<String>,
    pub kubeconfig: Option<PathBuf>,
    pub cluster_cidr: Cidr,
    pub iface: Option<String>,
    pub vxlan_name: String,
    pub vni: u32,
    pub vxlan_port: u16,
    pub cni_conf_dir: PathBuf,
    pub state_dir: PathBuf,
    pub data_dir: PathBuf,
    pub proc_sys: PathBuf,
    pub metrics_addr: Option<SocketAddr>,
    pub resync: Duration,
    pub masquerade: bool,
    /// Written into the conflist for the plugin: where its built-in IPAM
    /// keeps leases, and its log file (None: the plugin's defaults).
    pub ipam_data_dir: Option<PathBuf>,
    pub plugin_log_file: Option<PathBuf>,
    pub datapath: Mode,
    /// Enable the programs' aya-log output (every packet; debugging only).
    pub ebpf_log: bool,
    /// Encapsulate and decapsulate in tc (datapath v2); else through `vxlan.1`.
    pub tc_encap: bool,
    /// Route peers on the underlay's own subnets straight to their host IP,
    /// without VXLAN (flannel's DirectRouting, Calico's CrossSubnet).
    pub direct_routing: bool,
    /// Load this eBPF object instead of the embedded one.
    pub ebpf_object: Option<PathBuf>,
    /// Where maps, programs and links are pinned (`<bpffs>/mycni`).
    pub pin_dir: PathBuf,
}

pub use mycni_common::VXLAN_OVERHEAD;
pub use mycni_common::contract::{CONFLIST_NAME, NETWORK_NAME};

fn node_view(n: &Node) -> NodeView {
    NodeView {
        name: n.metadata.name.clone().unwrap_or_default(),
        pod_cidr: n.spec.as_ref().and_then(|s| s.pod_cidr.clone()),
        annotations: n
            .metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect(),
    }
}

pub async fn kube_client(kubeconfig: Option<&Path>) -> Result<kube::Client> {
    let config = match kubeconfig {
        Some(p) => {
            let kc = kube::config::Kubeconfig::read_from(p)
                .with_context(|| format!("reading kubeconfig {}", p.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig and not in a cluster")?,
    };
    // Fail a dead connection attempt fast and retry, rather than hang 30 s.
    let mut config = config;
    config.connect_timeout = Some(Duration::from_secs(5));
    config.write_timeout = Some(Duration::from_secs(10));
    Ok(kube::Client::try_from(config)?)
}

async fn resolve_node_name(cfg: &Config, client: &kube::Client) -> Result<String> {
    if let Some(n) = cfg.node_name.clone().filter(|n| !n.is_empty()) {
        return Ok(n);
    }
    // The seed's way: our own Pod says which node it runs on.
    let (Some(pod), Some(ns)) = (&cfg.pod_name, &cfg.pod_namespace) else {
        bail!("set NODE_NAME (downward API spec.nodeName), or POD_NAME and POD_NAMESPACE");
    };
    let p = Api::<Pod>::namespaced(client.clone(), ns).get(pod).await?;
    p.spec
        .and_then(|s| s.node_name)
        .with_context(|| format!("pod {ns}/{pod} is not scheduled yet"))
}

/// The VTEP MAC: reused from the last run (data dir), else from an existing
/// device, else new. Stable across restarts and re-creation, so peers never
/// keep a stale MAC.
fn vtep_mac(data_dir: &Path, existing: Option<&[u8]>) -> Result<Mac> {
    let file = data_dir.join("vtep-mac");
    if let Ok(s) = std::fs::read_to_string(&file)
        && let Ok(m) = s.trim().parse::<Mac>()
    {
        return Ok(m);
    }
    let mac = match existing.and_then(|e| Mac::try_from(e).ok()) {
        Some(m) if m.is_unicast() => m,
        _ => {
            let mut m: [u8; 6] = rand::random();
            m[0] = (m[0] & 0xfe) | 0x02; // unicast, locally administered
            Mac(m)
        }
    };
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("creating {}", data_dir.display()))?;
    write_atomic(&file, format!("{mac}\n").as_bytes())?;
    Ok(mac)
}

/// Write to a temp file in the same directory, then rename: readers (the
/// runtime reading the conflist, the plugin reading the ready file) never
/// see a half-written file.
pub fn write_atomic(path: &Path, content: &[u8]) -> Result<()> {
    let dir = path.parent().context("path without parent")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = dir.join(format!(
        ".{}.tmp",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default()
    ));
    std::fs::write(&tmp, content).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

/// The ready marker the plugin's STATUS looks for (the conflist names it).
pub fn ready_file(cfg: &Config) -> PathBuf {
    cfg.state_dir.join(contract::READY_FILE_NAME)
}

/// The conflist for this node, in the contract's shape the plugin parses.
pub fn conflist(cfg: &Config, pod_cidr: Cidr, mtu: u32) -> Conflist {
    Conflist::new(PluginConf {
        ipam: IpamConf {
            data_dir: cfg.ipam_data_dir.clone(),
            subnet: pod_cidr.into(),
            ipam_type: contract::BUILTIN_IPAM_TYPE.into(),
        },
        log_file: cfg.plugin_log_file.clone(),
        mtu,
        ready_file: ready_file(cfg),
        plugin_type: contract::PLUGIN_TYPE.into(),
        vxlan_device: cfg.vxlan_name.clone(),
    })
}

fn set_sysctl(proc_sys: &Path, key: &str, value: &str) -> Result<()> {
    let p = proc_sys.join(key.replace('.', "/"));
    std::fs::write(&p, value).with_context(|| format!("writing {value} to {}", p.display()))
}

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
}

impl Loop {
    /// `read_pods`: the kernel said pods came or went (`kwatch`); full
    /// passes read them anyway.
    async fn pass(&mut self, nodes: &[Arc<Node>], full: bool, read_pods: bool) -> Result<()> {
        let started = Instant::now();
        let (index, recreated) = self.kernel.ensure_vxlan(&self.vx).await?;
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
            None => self.kernel.dump(index, underlay).await?,
        };
        let actions = reconcile::diff(&want, &have);
        let failed = self.kernel.apply(index, underlay, &actions).await;
        if failed == 0 {
            reconcile::apply(&mut have, &actions);
            if self.fast.active() {
                // Pods change only through the plugin: read them when the
                // kernel says so and on full passes, not on every Node event.
                let pods = if full || read_pods {
                    Some(self.kernel.pod_endpoints().await?)
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
        let micros = started.elapsed().as_micros() as u64;
        m.reconcile_micros_sum.fetch_add(micros, Ordering::Relaxed);
        m.reconcile_last_micros.store(micros, Ordering::Relaxed);
        if failed > 0 {
            bail!("{failed} of {} kernel updates failed", actions.len());
        }
        self.last_desired = Some(want);
        Ok(())
    }
}

/// Runs the agent until `shutdown` resolves. The datapath stays in place
/// when it returns; only the ready marker goes, so the plugin's STATUS
/// reports the node not ready while no agent runs.
pub async fn run(
    cfg: Config,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    if let Some(addr) = cfg.metrics_addr {
        let m = metrics.clone();
        tokio::spawn(async move {
            if let Err(e) = crate::metrics::serve(addr, m).await {
                tracing::error!(error = %e, "metrics endpoint failed");
            }
        });
    }
    tokio::pin!(shutdown);
    tokio::select! {
        r = run_inner(&cfg, metrics.clone()) => r,
        () = &mut shutdown => {
            tracing::info!("shutting down; the datapath stays in place");
            let _ = std::fs::remove_file(ready_file(&cfg));
            Ok(())
        }
    }
}

async fn run_inner(cfg: &Config, metrics: Arc<Metrics>) -> Result<()> {
    let client = kube_client(cfg.kubeconfig.as_deref()).await?;
    let node_name = retry("finding this node's name", || {
        resolve_node_name(cfg, &client)
    })
    .await;
    let nodes: Api<Node> = Api::all(client.clone());
    metrics.set_not_ready(format!("waiting for Node {node_name} to have spec.podCIDR"));

    // The podCIDR comes from kube-controller-manager; until then there is
    // nothing to do but wait and say so.
    let own_cidr = loop {
        match nodes.get_opt(&node_name).await {
            Ok(Some(n)) => match n
                .spec
                .as_ref()
                .and_then(|s| s.pod_cidr.as_deref())
                .map(|c| (c, Cidr::parse_network(c).ok()))
            {
                Some((_, Some(c))) if cfg.cluster_cidr.covers(c) => break c,
                Some((raw, _)) => {
                    tracing::error!(node = %node_name, pod_cidr = raw, cluster_cidr = %cfg.cluster_cidr, "own podCIDR is invalid or outside the cluster CIDR");
                    metrics.set_not_ready(format!(
                        "own podCIDR {raw:?} is invalid or outside {}",
                        cfg.cluster_cidr
                    ));
                }
                None => {
                    tracing::info!(node = %node_name, "waiting for spec.podCIDR (kube-controller-manager --allocate-node-cidrs)")
                }
            },
            Ok(None) => tracing::warn!(node = %node_name, "own Node object not found; retrying"),
            Err(e) => tracing::warn!(error = %e, "cannot read own Node; retrying"),
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };

    // Before vxlan.1 can exist: a fresh node accepts no VXLAN until its
    // first pass knows the peers; a restarted one keeps its peer set.
    let filter = UnderlayFilter::start(cfg.vxlan_port, metrics.clone());
    let kernel = Kernel::new()?;
    let underlay = kernel.underlay(cfg.iface.as_deref()).await?;
    let existing_mac = kernel.link(&cfg.vxlan_name).await?.map(|l| l.mac);
    let mac = vtep_mac(&cfg.data_dir, existing_mac.as_deref())?;
    let vx = VxlanSpec {
        name: cfg.vxlan_name.clone(),
        vni: cfg.vni,
        port: cfg.vxlan_port,
        underlay_index: underlay.index,
        local_ip: underlay.ip,
        mtu: underlay.mtu.saturating_sub(VXLAN_OVERHEAD),
        mac,
        address: own_cidr.network(),
    };
    tracing::info!(node = %node_name, pod_cidr = %own_cidr, underlay = %underlay.name, host_ip = %underlay.ip, vtep_mac = %mac, mtu = vx.mtu, "bringing the overlay up");
    kernel.ensure_vxlan(&vx).await?;
    let object = match &cfg.ebpf_object {
        Some(p) => Some(
            std::fs::read(p).with_context(|| format!("reading --ebpf-object {}", p.display()))?,
        ),
        None => crate::ebpf::embedded_object().map(<[u8]>::to_vec),
    };
    let fast = FastPath::start(
        cfg.datapath,
        cfg.tc_encap,
        object.as_deref(),
        cfg.ebpf_log,
        &cfg.pin_dir,
        &cfg.proc_sys,
        metrics.clone(),
    );
    set_sysctl(&cfg.proc_sys, "net.ipv4.ip_forward", "1")?;
    if cfg.masquerade {
        crate::masq::install(cfg.cluster_cidr).context("installing masquerade rules")?;
    }

    // Publish ourselves: what peers need to reach our pods.
    let patch = serde_json::json!({ "metadata": { "annotations": {
        ANNOTATION_VTEP_MAC: mac.to_string(),
        ANNOTATION_HOST_IP: underlay.ip.to_string(),
    }}});
    let (pp, merge) = (PatchParams::default(), Patch::Merge(&patch));
    retry("publishing VTEP annotations on own Node", || {
        nodes.patch(&node_name, &pp, &merge)
    })
    .await;

    let (reader, writer) = reflector::store::<Node>();
    let changed = Arc::new(Notify::new());
    let watch_changed = changed.clone();
    let watch_metrics = metrics.clone();
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
                    watch_metrics.api_reachable.store(true, Ordering::Relaxed);
                    watch_synced.notify_one();
                    watch_changed.notify_one();
                }
                Ok(_) => {
                    watch_metrics.api_reachable.store(true, Ordering::Relaxed);
                    watch_changed.notify_one();
                }
                Err(e) => {
                    // The last known state stays programmed: an unreachable
                    // API must not tear down the datapath.
                    watch_metrics.api_reachable.store(false, Ordering::Relaxed);
                    tracing::warn!(error = %e, "Node watch failed; retrying with backoff, keeping the datapath as it is");
                }
            }
        }
    });
    synced.notified().await;

    // Subscribed before the first (full) pass reads the pods, so none is
    // missed in between. Only the fast path reads pods.
    let pods_changed = Arc::new(Notify::new());
    if fast.active()
        && let Err(e) = crate::kwatch::spawn(pods_changed.clone())
    {
        tracing::warn!(error = %e, "cannot subscribe to kernel notifications; new pods reach the fast path at the next full pass");
    }
    let mut lp = Loop {
        kernel,
        vx: vx.clone(),
        own_name: node_name.clone(),
        own_cidr,
        cluster: cfg.cluster_cidr,
        metrics: metrics.clone(),
        last_desired: None,
        kernel_cache: None,
        fast,
        filter,
        direct: if cfg.direct_routing {
            underlay.subnets.clone()
        } else {
            vec![]
        },
    };
    let mut handed_over = false;
    let mut republish = false;
    let mut tick = tokio::time::interval(cfg.resync);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut full, mut read_pods) = (true, true);
    loop {
        let snapshot = reader.state();
        if let Some(n) = snapshot
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(node_name.as_str()))
        {
            let now = n.spec.as_ref().and_then(|s| s.pod_cidr.as_deref());
            if now.and_then(|c| Cidr::parse_network(c).ok()) != Some(own_cidr) {
                // Pods, the conflist and vxlan.1's address all derive from
                // the podCIDR: start over with the new one (the DaemonSet
                // restarts the agent), rather than half-adopt it.
                bail!(
                    "this Node's podCIDR changed from {own_cidr} to {}; exiting so the agent restarts with it",
                    now.unwrap_or("none")
                );
            }
        }
        if full {
            match lp.kernel.underlay(cfg.iface.as_deref()).await {
                Ok(u) => {
                    if cfg.direct_routing && u.subnets != lp.direct {
                        tracing::info!(subnets = ?u.subnets, "peers on these underlay subnets are routed directly");
                        lp.direct = u.subnets.clone();
                    }
                    if u.ip != lp.vx.local_ip || u.index != lp.vx.underlay_index {
                        tracing::warn!(old = %lp.vx.local_ip, new = %u.ip, underlay = %u.name, "the underlay address changed; moving vxlan.1 and republishing");
                        lp.vx.local_ip = u.ip;
                        lp.vx.underlay_index = u.index;
                        republish = true;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot read the underlay"),
            }
        }
        match lp.pass(&snapshot, full, read_pods).await {
            Ok(()) if !handed_over || !cfg.cni_conf_dir.join(CONFLIST_NAME).exists() => {
                // The conflist goes out only once the overlay is up and peers
                // are programmed: the runtime starts pods as soon as it sees it.
                let conf = conflist(cfg, own_cidr, vx.mtu);
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
                metrics.set_ready(format!(
                    "overlay up, {} peers; {}",
                    metrics.peers_programmed.load(Ordering::Relaxed),
                    lp.fast.describe()
                ));
            }
            Ok(()) => {
                // Drift repair recreated the ready marker's precondition.
                if !ready_file(cfg).exists() {
                    write_atomic(&ready_file(cfg), b"ready\n")?;
                }
                metrics.set_ready(format!(
                    "overlay up, {} peers; {}",
                    metrics.peers_programmed.load(Ordering::Relaxed),
                    lp.fast.describe()
                ));
            }
            Err(e) => {
                tracing::warn!(error = %e, "reconcile failed; retrying");
                metrics.reconcile_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        if republish {
            // After the pass, so vxlan.1 has moved first. Bounded: the
            // pooled API connection may still be bound to the address that
            // just vanished and would hang until TCP gives up.
            let patch = serde_json::json!({ "metadata": { "annotations": {
                ANNOTATION_HOST_IP: lp.vx.local_ip.to_string(),
            }}});
            let pp = PatchParams::default();
            let merge = Patch::Merge(&patch);
            match tokio::time::timeout(Duration::from_secs(2), nodes.patch(&node_name, &pp, &merge))
                .await
            {
                Ok(Ok(_)) => {
                    tracing::info!(host_ip = %lp.vx.local_ip, "republished the host IP");
                    republish = false;
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "cannot republish the host IP yet"),
                Err(_) => {
                    tracing::warn!(
                        "republishing the host IP: no answer within 2 s; retrying on a new connection"
                    )
                }
            }
        }
        (full, read_pods) = tokio::select! {
            () = changed.notified() => (false, false),
            () = pods_changed.notified() => (false, true),
            _ = tick.tick() => (true, true),
        };
    }
}

/// Retries an API call until it succeeds, with capped exponential backoff:
/// an API server that is briefly away at start must not crash-loop every
/// node's agent.
async fn retry<T, E, F>(what: &str, mut f: impl FnMut() -> F) -> T
where
    E: std::fmt::Display,
    F: std::future::Future<Output = std::result::Result<T, E>>,
{
    let mut delay = Duration::from_millis(200);
    loop {
        // A request that gets no answer (a half-dead pooled connection) must
        // not stall start-up: give up on it and retry on a fresh one.
        match tokio::time::timeout(Duration::from_secs(5), f()).await {
            Ok(Ok(v)) => return v,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, retry_in = ?delay, "{what} failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(10));
            }
            Err(_) => {
                tracing::warn!(retry_in = ?delay, "{what}: no answer within 5 s; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(10));
            }
        }
    }
}

/// Drops everything the agent does not read from a Node before it is cached.
pub fn strip_node(n: &mut Node) {
    n.metadata.managed_fields = None;
    n.metadata.labels = None;
    n.metadata.owner_references = None;
    n.metadata.finalizers = None;
    if let Some(a) = n.metadata.annotations.as_mut() {
        a.retain(|k, _| k.starts_with("mycni.dev/"));
    }
    n.status = None;
    if let Some(spec) = n.spec.as_mut() {
        spec.taints = None;
        spec.config_source = None;
        spec.provider_id = None;
    }
}

/// `NetworkUnavailable=False`, as a strategic merge on status: a JSON merge
/// patch would replace the whole conditions list and drop kubelet's.
pub async fn set_network_available(nodes: &Api<Node>, name: &str) -> Result<()> {
    let now = k8s_openapi::jiff::Timestamp::now();
    let patch = serde_json::json!({ "status": { "conditions": [{
        "type": "NetworkUnavailable",
        "status": "False",
        "reason": "MycniIsUp",
        "message": "mycni-agent has the overlay up on this node",
        "lastTransitionTime": now.to_string(),
        "lastHeartbeatTime": now.to_string(),
    }]}});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await?;
    Ok(())
}

/// Removes what `run` leaves on a node for good: the conflist, the ready
/// marker, the masquerade and underlay filter tables and the VXLAN device
/// (with every route, neighbour and FDB entry on it). Used by
/// `mycni-agent uninstall`.
pub async fn uninstall(cfg: &Config) -> Result<()> {
    let _ = std::fs::remove_file(cfg.cni_conf_dir.join(CONFLIST_NAME));
    let _ = std::fs::remove_file(ready_file(cfg));
    crate::masq::uninstall()?;
    crate::underlay_filter::uninstall()?;
    match crate::ebpf::detach_all(&cfg.pin_dir) {
        Ok(n) => tracing::info!(links = n, "detached the fast path"),
        Err(e) => tracing::warn!(error = %e, "cannot detach the fast path"),
    }
    let kernel = Kernel::new()?;
    if let Some(l) = kernel.link(&cfg.vxlan_name).await? {
        kernel.del_link(l.index).await?;
    }
    Ok(())
}
