//! `mycni-agent run` (the default): its flags, grouped by room (each
//! group in its subject's file, this one the general flags), the
//! [`Config`] they make, and the run itself.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use mycni_agent::agent::{self, Config};
use mycni_agent::metrics::Metrics;
use mycni_agent::settings::RESYNC;
use mycni_common::contract::DEFAULT_STATE_DIR;

use super::datapath::DatapathArgs;
use super::flows::FlowSettings;
use super::http::HttpArgs;
use super::order::Order;
use super::overlay::OverlayArgs;
use super::policy::PolicyArgs;
use super::values::parse_positive_duration;

#[derive(Args, Clone)]
pub(super) struct RunArgs {
    #[command(flatten)]
    pub general: GeneralArgs,
    #[command(flatten)]
    pub overlay: OverlayArgs,
    #[command(flatten)]
    pub datapath: DatapathArgs,
    #[command(flatten)]
    pub policy: PolicyArgs,
    #[command(flatten)]
    pub flows: FlowSettings,
    #[command(flatten)]
    pub http: HttpArgs,
}

// The node and the API, the host's paths, the plugin's conflist, the
// loop's period.
#[derive(Args, Clone)]
pub(super) struct GeneralArgs {
    /// This node's name (downward API spec.nodeName).
    #[arg(long, env = "NODE_NAME", display_order = Order::NodeName as usize)]
    pub node_name: Option<String>,
    /// With --pod-namespace: find the node from the agent's own Pod.
    #[arg(long, env = "POD_NAME", display_order = Order::PodName as usize)]
    pub pod_name: Option<String>,
    #[arg(long, env = "POD_NAMESPACE", display_order = Order::PodNamespace as usize)]
    pub pod_namespace: Option<String>,
    /// kubeconfig; in-cluster config when absent.
    #[arg(long, env = "KUBECONFIG", display_order = Order::Kubeconfig as usize)]
    pub kubeconfig: Option<PathBuf>,
    /// Where the conflist is written (the host's /etc/cni/net.d).
    #[arg(
        long,
        env = "MYCNI_CNI_CONF_DIR",
        default_value = "/host/etc/cni/net.d",
        display_order = Order::CniConfDir as usize
    )]
    pub cni_conf_dir: PathBuf,
    /// The ready marker for the plugin's STATUS lives here; same path on host and in the container.
    #[arg(long, env = "MYCNI_STATE_DIR", default_value = DEFAULT_STATE_DIR, display_order = Order::StateDir as usize)]
    pub state_dir: PathBuf,
    /// Persistent state (the VTEP MAC).
    #[arg(long, env = "MYCNI_DATA_DIR", default_value = "/var/lib/mycni", display_order = Order::DataDir as usize)]
    pub data_dir: PathBuf,
    /// The host's /proc/sys (a non-privileged container's own is read-only).
    #[arg(long, env = "MYCNI_PROC_SYS", default_value = "/host/proc/sys", display_order = Order::ProcSys as usize)]
    pub proc_sys: PathBuf,
    /// The period of the full reconcile pass (a dump of every route,
    /// neighbour and FDB entry of the overlay): the safety net for what no
    /// notification reported. Node events, pods and kernel drift (the
    /// agent's state changed under it, the underlay's address moved) are
    /// acted on at once, from the API's watch and the kernel's
    /// notifications.
    #[arg(long = RESYNC.flag, env = RESYNC.env, default_value = "5m", value_parser = parse_resync, display_order = Order::Resync as usize)]
    pub resync: Duration,
    /// Lease directory for the plugin's built-in IPAM, put into the conflist
    /// (default: the plugin's /var/lib/cni/networks).
    #[arg(long, display_order = Order::IpamDataDir as usize)]
    pub ipam_data_dir: Option<PathBuf>,
    /// The plugin's log file, put into the conflist (default: /var/log/mycni/plugin.log).
    #[arg(long, display_order = Order::PluginLogFile as usize)]
    pub plugin_log_file: Option<PathBuf>,
}

fn parse_resync(s: &str) -> Result<Duration, String> {
    RESYNC.check(parse_positive_duration(s))
}

impl RunArgs {
    /// How long the loop may stay away from its wait before /healthz fails.
    pub fn stale_after(&self) -> Duration {
        self.http.stale_after(self.general.resync)
    }

    /// The agent's configuration; a value valid alone but not with the
    /// others is refused here, naming its setting.
    pub fn config(self) -> Result<Config> {
        self.http.check(self.general.resync)?;
        let RunArgs {
            general: g,
            overlay: o,
            datapath: d,
            policy: p,
            flows: f,
            http: h,
        } = self;
        Ok(Config {
            node_name: g.node_name,
            pod_name: g.pod_name,
            pod_namespace: g.pod_namespace,
            kubeconfig: g.kubeconfig,
            cluster_cidr: o.cluster_cidr.v4,
            cluster_cidr6: o.cluster_cidr.v6,
            iface: o.iface,
            vxlan_name: o.vxlan_name,
            vxlan6_name: o.vxlan6_name,
            underlay6: o.underlay6,
            vni: o.vni,
            vxlan_port: o.vxlan_port,
            cni_conf_dir: g.cni_conf_dir,
            state_dir: g.state_dir,
            data_dir: g.data_dir,
            proc_sys: g.proc_sys,
            metrics_addr: h.metrics_addr.0,
            resync: g.resync,
            masquerade: o.masquerade,
            network_policy: p.network_policy,
            flow_history: f.flow_history,
            flow_pod_series: f.flow_pod_series,
            ipam_data_dir: g.ipam_data_dir,
            plugin_log_file: g.plugin_log_file,
            datapath: d.datapath,
            ebpf_log: d.ebpf_log,
            tc_encap: d.tc_encap,
            flow_events: f.flow_events,
            direct_routing: o.direct_routing,
            ebpf_object: d.ebpf_object,
            pin_dir: d.bpffs.join("mycni"),
            mtu: o.mtu.0,
        })
    }
}

/// Runs the agent until SIGTERM or SIGINT.
pub(super) fn run(rt: &tokio::runtime::Runtime, args: RunArgs) -> Result<()> {
    // A bad setting first: it is what the operator just changed.
    let stale_after = args.stale_after();
    let cfg = args.config()?;
    // Then a missing capability must fail the pod at once, naming it, not
    // later as an EPERM from netlink or bpf(2).
    let eff = mycni_agent::caps::effective().context("reading this process's capabilities")?;
    if let Err(msg) = mycni_agent::caps::check(eff, &cfg.datapath.required_caps()) {
        tracing::error!("{msg}");
        anyhow::bail!(msg);
    }
    let metrics = Arc::new(Metrics::default());
    // The subsystems' series from the first scrape on, not from their start.
    mycni_agent::tables::register_metrics(&metrics);
    mycni_agent::datapath::register_metrics(&metrics);
    metrics.liveness.set_stale_after(stale_after);
    rt.block_on(agent::run(cfg, metrics, async {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }))
}

/// `mycni-agent uninstall`: removes what `run` set up, found through the
/// same settings.
pub(super) fn uninstall(rt: &tokio::runtime::Runtime, args: RunArgs) -> Result<()> {
    rt.block_on(agent::uninstall(&args.config()?))
}
