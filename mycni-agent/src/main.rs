//! `mycni-agent`: the mycni node agent (DaemonSet).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use mycni_agent::agent::{self, Config};
use mycni_agent::fastpath::Mode;
use mycni_agent::metrics::Metrics;
use mycni_agent::peers::Cidr;
use mycni_common::contract::{
    DEFAULT_STATE_DIR, DEFAULT_VNI, DEFAULT_VXLAN_DEVICE, DEFAULT_VXLAN_PORT,
};

#[derive(Parser)]
#[command(
    name = "mycni-agent",
    version,
    about = "mycni node agent: VXLAN overlay, peer reconcile, CNI handover"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the agent (the default).
    Run(RunArgs),
    /// Copy the plugin binary into the host's CNI bin dir atomically (init container).
    InstallCni {
        #[arg(long, default_value = "/usr/local/bin/mycni")]
        src: PathBuf,
        #[arg(long, default_value = "/host/opt/cni/bin")]
        dst_dir: PathBuf,
    },
    /// Print the fast path's pinned state: attachments, peers, local
    /// endpoints and counters (works while the agent is down).
    Inspect {
        /// bpffs mount; the state lives under <bpffs>/mycni.
        #[arg(long, env = "MYCNI_BPFFS", default_value = "/sys/fs/bpf")]
        bpffs: PathBuf,
    },
    /// Remove the conflist, ready marker, masquerade rules, the fast path and the VXLAN device.
    Uninstall(RunArgs),
}

#[derive(Args, Clone)]
struct RunArgs {
    /// This node's name (downward API spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// With --pod-namespace: find the node from the agent's own Pod.
    #[arg(long, env = "POD_NAME")]
    pod_name: Option<String>,
    #[arg(long, env = "POD_NAMESPACE")]
    pod_namespace: Option<String>,
    /// kubeconfig; in-cluster config when absent.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// The cluster's pod CIDR (kube-controller-manager --cluster-cidr).
    #[arg(long, env = "MYCNI_CLUSTER_CIDR", default_value = "10.244.0.0/16", value_parser = parse_cidr)]
    cluster_cidr: Cidr,
    /// Underlay interface; default: the interface of the default route.
    #[arg(long, env = "MYCNI_IFACE")]
    iface: Option<String>,
    #[arg(long, default_value = DEFAULT_VXLAN_DEVICE)]
    vxlan_name: String,
    #[arg(long, default_value_t = DEFAULT_VNI)]
    vni: u32,
    #[arg(long, default_value_t = DEFAULT_VXLAN_PORT)]
    vxlan_port: u16,
    /// Where the conflist is written (the host's /etc/cni/net.d).
    #[arg(
        long,
        env = "MYCNI_CNI_CONF_DIR",
        default_value = "/host/etc/cni/net.d"
    )]
    cni_conf_dir: PathBuf,
    /// The ready marker for the plugin's STATUS lives here; same path on host and in the container.
    #[arg(long, env = "MYCNI_STATE_DIR", default_value = DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// Persistent state (the VTEP MAC).
    #[arg(long, env = "MYCNI_DATA_DIR", default_value = "/var/lib/mycni")]
    data_dir: PathBuf,
    /// The host's /proc/sys (a non-privileged container's own is read-only).
    #[arg(long, env = "MYCNI_PROC_SYS", default_value = "/host/proc/sys")]
    proc_sys: PathBuf,
    /// /metrics, /healthz, /readyz; "off" disables.
    #[arg(long, env = "MYCNI_METRICS_ADDR", default_value = "0.0.0.0:9971")]
    metrics_addr: String,
    /// Full reconcile period, also what bounds kernel drift repair.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    resync: Duration,
    /// SNAT pod traffic leaving the cluster CIDR (nftables table `ip mycni`).
    #[arg(long, env = "MYCNI_MASQUERADE", default_value_t = true, action = clap::ArgAction::Set)]
    masquerade: bool,
    /// bpffs mount; pinned maps and links live under <bpffs>/mycni.
    #[arg(long, env = "MYCNI_BPFFS", default_value = "/sys/fs/bpf")]
    bpffs: PathBuf,
    /// `ebpf`: the tc fast path, with the kernel's routes, ARP and FDB as
    /// the fallback (used alone if the programs cannot load); `kernel`:
    /// routes, ARP and FDB only, and anything mycni attached is detached.
    #[arg(long, env = "MYCNI_DATAPATH", default_value = "ebpf")]
    datapath: Mode,
    /// Log every packet the tc programs see (aya-log, at debug level; also
    /// set MYCNI_LOG=debug). Costs a ring-buffer write per packet: for
    /// debugging only. Off, the logging code is pruned at load time.
    #[arg(long, env = "MYCNI_EBPF_LOG")]
    ebpf_log: bool,
    /// With --datapath ebpf: encapsulate traffic to remote pods in tc and
    /// send it out of the underlay, and decapsulate VXLAN from peers at the
    /// underlay's ingress (datapath v2). `false` hands remote traffic to
    /// `vxlan.1` instead (the kernel encapsulates), as agents before v2 did.
    #[arg(long, env = "MYCNI_TC_ENCAP", default_value_t = true, action = clap::ArgAction::Set)]
    tc_encap: bool,
    /// Route peers whose host IP is on one of the underlay's own subnets
    /// (one L2 segment) straight to that host, without VXLAN: `podCIDR via
    /// <host IP>` on the underlay (flannel's DirectRouting, Calico's
    /// CrossSubnet). Peers elsewhere still go through VXLAN.
    #[arg(long, env = "MYCNI_DIRECT_ROUTING", default_value_t = false, action = clap::ArgAction::Set)]
    direct_routing: bool,
    /// Load this eBPF object instead of the one built into the agent.
    #[arg(long, env = "MYCNI_EBPF_OBJECT")]
    ebpf_object: Option<PathBuf>,
    /// Lease directory for the plugin's built-in IPAM, put into the conflist
    /// (default: the plugin's /var/lib/cni/networks).
    #[arg(long)]
    ipam_data_dir: Option<PathBuf>,
    /// The plugin's log file, put into the conflist (default: /var/log/mycni/plugin.log).
    #[arg(long)]
    plugin_log_file: Option<PathBuf>,
}

fn parse_cidr(s: &str) -> Result<Cidr, String> {
    Cidr::parse_network(s).map_err(|_| format!("{s:?} is not an IPv4 CIDR like 10.244.0.0/16"))
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" | "" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        _ => Err(format!("bad duration unit in {s:?} (ms, s, m)")),
    }
}

impl RunArgs {
    fn config(self) -> Result<Config> {
        let metrics_addr = match self.metrics_addr.as_str() {
            "off" | "" => None,
            a => Some(
                a.parse::<SocketAddr>()
                    .with_context(|| format!("--metrics-addr {a:?}"))?,
            ),
        };
        Ok(Config {
            node_name: self.node_name,
            pod_name: self.pod_name,
            pod_namespace: self.pod_namespace,
            kubeconfig: self.kubeconfig,
            cluster_cidr: self.cluster_cidr,
            iface: self.iface,
            vxlan_name: self.vxlan_name,
            vni: self.vni,
            vxlan_port: self.vxlan_port,
            cni_conf_dir: self.cni_conf_dir,
            state_dir: self.state_dir,
            data_dir: self.data_dir,
            proc_sys: self.proc_sys,
            metrics_addr,
            resync: self.resync,
            masquerade: self.masquerade,
            ipam_data_dir: self.ipam_data_dir,
            plugin_log_file: self.plugin_log_file,
            datapath: self.datapath,
            ebpf_log: self.ebpf_log,
            tc_encap: self.tc_encap,
            direct_routing: self.direct_routing,
            ebpf_object: self.ebpf_object,
            pin_dir: self.bpffs.join("mycni"),
        })
    }
}

fn install_cni(src: &std::path::Path, dst_dir: &std::path::Path) -> Result<()> {
    let dst = dst_dir.join("mycni");
    let tmp = dst_dir.join(".mycni.tmp");
    std::fs::copy(src, &tmp)
        .with_context(|| format!("copying {} to {}", src.display(), tmp.display()))?;
    // rename(2) swaps the binary atomically: a runtime exec'ing it mid-update
    // gets the old or the new one, never a torn file.
    std::fs::rename(&tmp, &dst).with_context(|| format!("installing {}", dst.display()))?;
    tracing::info!(dst = %dst.display(), "installed the CNI plugin");
    Ok(())
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("MYCNI_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    match cli.cmd {
        Some(Cmd::InstallCni { src, dst_dir }) => install_cni(&src, &dst_dir),
        Some(Cmd::Inspect { bpffs }) => {
            print!("{}", mycni_agent::inspect::render(&bpffs.join("mycni"))?);
            Ok(())
        }
        Some(Cmd::Uninstall(args)) => rt.block_on(agent::uninstall(&args.config()?)),
        Some(Cmd::Run(args)) => run(&rt, args),
        None => run(&rt, cli.run),
    }
}

fn run(rt: &tokio::runtime::Runtime, args: RunArgs) -> Result<()> {
    // Before anything else: a missing capability must fail the pod at once,
    // naming it, not later as an EPERM from netlink or bpf(2).
    let eff = mycni_agent::caps::effective().context("reading this process's capabilities")?;
    if let Err(msg) = mycni_agent::caps::check(eff, &mycni_agent::caps::required(args.datapath)) {
        tracing::error!("{msg}");
        anyhow::bail!(msg);
    }
    let cfg = args.config()?;
    let metrics = Arc::new(Metrics::default());
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
