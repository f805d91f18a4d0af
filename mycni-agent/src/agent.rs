//! The agent's life, in two phases: start-up (`startup`: find its Node,
//! bring the overlay up, load the programs, publish itself), then the loop
//! (`run_loop`: reconcile peers from a watch on all Nodes, at start, on
//! every change, and periodically, so kernel drift and missed deletes heal).
//! What both phases and the `mycni-agent` subcommands share is here.

mod run_loop;
mod startup;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams};
use mycni_common::contract::{self, Conflist, IpamConf, PluginConf};

use crate::datapath::Mode;
use crate::kernel::{Kernel, Underlay6Select, UnderlaySelect};
use crate::metrics::Metrics;
use crate::peers::{Cidr, Cidr6, ClusterCidrs, NodeView, PodCidrs};

/// Everything `mycni-agent run` is configured with.
#[derive(Debug, Clone)]
pub struct Config {
    pub node_name: Option<String>,
    pub pod_name: Option<String>,
    pub pod_namespace: Option<String>,
    pub kubeconfig: Option<PathBuf>,
    /// The cluster's IPv4 pod CIDR; None: an IPv6-only cluster (no
    /// `vxlan.1`, every IPv4 podCIDR ignored). At least one of the two is
    /// set ([`ClusterCidrs::new`] at parse).
    pub cluster_cidr: Option<Cidr>,
    /// The cluster's IPv6 pod CIDR; None: the agent does no IPv6 (every
    /// IPv6 podCIDR, its own and its peers', is ignored).
    pub cluster_cidr6: Option<Cidr6>,
    /// How the underlay interface is found, in `--iface`'s syntax (see
    /// [`UnderlaySelect`]); None: the interface of the default route.
    /// Re-applied whenever the kernel reports an address, route or link
    /// change that may move it, and on every full pass.
    pub iface: Option<String>,
    pub vxlan_name: String,
    /// The VXLAN device over the IPv6 underlay, and which IPv6 address
    /// it sends from (`off`: none).
    pub vxlan6_name: String,
    pub underlay6: Underlay6Select,
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

impl Config {
    /// The cluster CIDRs of both families.
    pub fn clusters(&self) -> ClusterCidrs {
        ClusterCidrs {
            v4: self.cluster_cidr,
            v6: self.cluster_cidr6,
        }
    }

    /// `iface`, parsed (the flag's parser has checked it already).
    pub fn underlay(&self) -> Result<UnderlaySelect> {
        self.iface
            .as_deref()
            .unwrap_or_default()
            .parse()
            .map_err(|e: String| anyhow::anyhow!("--iface: {e}"))
    }
}

/// Settings of `run` beyond [`Config`].
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions {
    /// The overlay MTU (vxlan.1, the pods' eth0); None: the underlay's less
    /// the VXLAN overhead.
    pub mtu: Option<u32>,
}

pub use mycni_common::VXLAN_OVERHEAD;

/// What an IPv6-only node says where an operator looks (logs, readiness,
/// `inspect`): it has no `vxlan.1`, by design.
pub const IPV6_ONLY: &str = "no IPv4 underlay: IPv6-only node";
pub use mycni_common::contract::{CONFLIST_NAME, NETWORK_NAME};

fn node_view(n: &Node) -> NodeView {
    NodeView {
        name: n.metadata.name.clone().unwrap_or_default(),
        pod_cidr: n.spec.as_ref().and_then(|s| s.pod_cidr.clone()),
        pod_cidrs: n
            .spec
            .as_ref()
            .and_then(|s| s.pod_cidrs.clone())
            .unwrap_or_default(),
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

/// The conflist for this node, in the contract's shape the plugin parses:
/// its IPAM gets the IPv4 podCIDR (the primary family, as the overlay's)
/// and, on a dual-stack node, the IPv6 one. A single-family node's is the
/// same bytes as before dual-stack. An IPv6-only node's (no IPv4
/// podCIDR) names `vxlan6.1`, its one VXLAN device, for the plugin's
/// STATUS to look for.
pub fn conflist(cfg: &Config, pod_cidrs: impl Into<PodCidrs>, mtu: u32) -> Conflist {
    let pod_cidrs = pod_cidrs.into();
    let ranges: Vec<mycni_common::net::Cidr> = pod_cidrs
        .v4
        .map(Into::into)
        .into_iter()
        .chain(pod_cidrs.v6.map(Into::into))
        .collect();
    Conflist::new(PluginConf {
        ipam: IpamConf::new(cfg.ipam_data_dir.clone(), &ranges),
        log_file: cfg.plugin_log_file.clone(),
        mtu,
        ready_file: ready_file(cfg),
        plugin_type: contract::PLUGIN_TYPE.into(),
        vxlan_device: if pod_cidrs.v4.is_none() && pod_cidrs.v6.is_some() {
            cfg.vxlan6_name.clone()
        } else {
            cfg.vxlan_name.clone()
        },
    })
}

/// Runs the agent until `shutdown` resolves. The datapath stays in place
/// when it returns; only the ready marker goes, so the plugin's STATUS
/// reports the node not ready while no agent runs.
pub async fn run(
    cfg: Config,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    run_with(cfg, RunOptions::default(), metrics, shutdown).await
}

/// [`run`], with `opts`.
pub async fn run_with(
    cfg: Config,
    opts: RunOptions,
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
        r = start_then_loop(&cfg, opts, metrics.clone()) => r,
        () = &mut shutdown => {
            tracing::info!("shutting down; the datapath stays in place");
            let _ = std::fs::remove_file(ready_file(&cfg));
            Ok(())
        }
    }
}

/// Start-up once, then the loop. Returns only with an error: the loop has
/// no end of its own, `run` ends it at shutdown.
async fn start_then_loop(cfg: &Config, opts: RunOptions, metrics: Arc<Metrics>) -> Result<()> {
    let started = startup::start(cfg, opts, &metrics).await?;
    run_loop::run(cfg, metrics, started).await
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
/// marker, the masquerade, underlay filter and anti-spoofing tables and
/// the VXLAN devices (with every route, neighbour and FDB entry on them). Used
/// by `mycni-agent uninstall`.
pub async fn uninstall(cfg: &Config) -> Result<()> {
    let _ = std::fs::remove_file(cfg.cni_conf_dir.join(CONFLIST_NAME));
    let _ = std::fs::remove_file(ready_file(cfg));
    crate::tables::masq::uninstall()?;
    crate::tables::underlay_filter::uninstall()?;
    crate::tables::antispoof::uninstall()?;
    match crate::datapath::detach_all(&cfg.pin_dir) {
        Ok(n) => tracing::info!(links = n, "detached the fast path"),
        Err(e) => tracing::warn!(error = %e, "cannot detach the fast path"),
    }
    let kernel = Kernel::new()?;
    for name in [&cfg.vxlan_name, &cfg.vxlan6_name] {
        if let Some(l) = kernel.link(name).await? {
            kernel.del_link(l.index).await?;
        }
    }
    // vxlan.1's nexthops (and their routes) went with it; direct-routing
    // peers' nexthops sit on the underlay, and deleting them deletes the
    // routes through them.
    kernel.delete_nexthops().await?;
    Ok(())
}
