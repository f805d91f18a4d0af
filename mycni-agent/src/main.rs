//! `mycni-agent`: the mycni node agent (DaemonSet).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use mycni_agent::agent::{self, Config};
use mycni_agent::datapath::Mode;
use mycni_agent::metrics::{DEFAULT_STALE_AFTER, Liveness, Metrics};
use mycni_agent::topology::{Underlay6Select, UnderlaySelect};
use mycni_common::contract::{
    DEFAULT_STATE_DIR, DEFAULT_VNI, DEFAULT_VXLAN_DEVICE, DEFAULT_VXLAN_PORT, DEFAULT_VXLAN6_DEVICE,
};
use mycni_common::net::{Cidr4, Cidr6, ClusterCidrs};

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
    /// endpoints and counters (works while the agent is down); or, with
    /// `policy`, what NetworkPolicy enforces for one pod.
    Inspect {
        #[command(subcommand)]
        what: Option<InspectWhat>,
        /// bpffs mount; the state lives under <bpffs>/mycni. Without it,
        /// the state is found from the programs attached to the VXLAN
        /// device of this network namespace (else /sys/fs/bpf/mycni).
        #[arg(long, env = "MYCNI_BPFFS")]
        bpffs: Option<PathBuf>,
        /// The VXLAN device whose programs lead to the maps.
        #[arg(long, default_value = DEFAULT_VXLAN_DEVICE)]
        vxlan_device: String,
    },
    /// The flows of this node (every connection and drop the datapath and
    /// nftables reported, with pods, policies and reasons), from the
    /// agent running here; with a kubeconfig, every node's.
    Flows(mycni_agent::flows::cli::FlowsArgs),
    /// Why <src> may or may not reach <dst> on <port>/<protocol>: the
    /// policies selecting each side, the verdict with the rules that
    /// decide it, and what this node's datapath last saw between them
    /// (with a kubeconfig: what the datapaths of both ends' nodes saw).
    /// Each end is <namespace>/<pod> or an address.
    Explain {
        src: String,
        dst: String,
        /// <port>/<protocol>, e.g. 80/tcp.
        port: String,
        /// The agent's metrics address (a wildcard one is asked on
        /// loopback).
        #[arg(long, env = "MYCNI_METRICS_ADDR", default_value = "127.0.0.1:9971")]
        agent: String,
        /// Ask the agents of both ends' nodes, found through the Node
        /// objects, instead of this node's.
        #[arg(long, env = "KUBECONFIG")]
        kubeconfig: Option<PathBuf>,
        /// The agents' metrics port, with --kubeconfig.
        #[arg(long, default_value_t = 9971)]
        agent_port: u16,
        /// Print the agent's JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Remove the conflist, ready marker, masquerade rules, the fast path and the VXLAN device.
    Uninstall(RunArgs),
    /// Check the configuration (flags, and the environment the ConfigMap
    /// fills) as `run` would, print it and what this kernel offers the fast
    /// path, and exit: a bad value fails here with the setting's name.
    CheckConfig(RunArgs),
}

#[derive(Subcommand)]
enum InspectWhat {
    /// The rules in force for a pod of this node, both directions: open or
    /// isolated and by which policies, each allow rule with its peers and
    /// ports as the agent compiled them, the policies selecting it, and
    /// the table's counters. Asks the agent running on this node.
    Policy {
        /// <namespace>/<pod>
        pod: String,
        /// The agent's metrics address (a wildcard one is asked on
        /// loopback).
        #[arg(long, env = "MYCNI_METRICS_ADDR", default_value = "127.0.0.1:9971")]
        agent: String,
        /// Print the agent's JSON report instead of text.
        #[arg(long)]
        json: bool,
    },
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
    /// The cluster's pod CIDRs (kube-controller-manager --cluster-cidr):
    /// an IPv4 one, an IPv6 one, or both after a comma
    /// (`10.244.0.0/16,fd00:10:244::/56`). Without an IPv6 one the agent
    /// ignores IPv6 podCIDRs; with an IPv6 one alone the cluster is
    /// IPv6-only: no vxlan.1, every peer over vxlan6.1.
    #[arg(long, env = "MYCNI_CLUSTER_CIDR", default_value = "10.244.0.0/16", value_parser = parse_cidr)]
    cluster_cidr: ClusterCidrs,
    /// The underlay interface: a name (`eth0`), `interface=<glob>` (the
    /// first interface whose name matches and has an IPv4 address),
    /// `can-reach=<address>` (the interface of the route to that address), or
    /// `default-route` (the default: the interface of the default route).
    /// In an IPv6-only cluster the same forms go by IPv6 routes and
    /// addresses (the IPv6 default route; an IPv6 can-reach address).
    #[arg(long, env = "MYCNI_IFACE", default_value = "default-route", value_parser = parse_underlay)]
    iface: UnderlaySelect,
    /// The overlay MTU (vxlan.1 and the pods' eth0), or `auto`: the
    /// underlay's MTU less the 50 bytes of VXLAN.
    #[arg(long, env = "MYCNI_MTU", default_value = "auto", value_parser = parse_mtu)]
    mtu: MtuSetting,
    #[arg(long, default_value = DEFAULT_VXLAN_DEVICE)]
    vxlan_name: String,
    /// The VXLAN device over the IPv6 underlay, for peers reached over
    /// IPv6 only.
    #[arg(long, default_value = DEFAULT_VXLAN6_DEVICE)]
    vxlan6_name: String,
    /// Which IPv6 address of the underlay interface the VXLAN device over
    /// IPv6 sends from: `auto` (its first global or unique-local address;
    /// without one there is no such device), `off`, or one address. Only on
    /// a node with an IPv6 podCIDR in a cluster with an IPv6 range; in an
    /// IPv6-only cluster that device is the node's only one, and `off` an
    /// error.
    #[arg(long, env = "MYCNI_UNDERLAY6", default_value = "auto", value_parser = parse_underlay6)]
    underlay6: Underlay6Select,
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
    #[arg(long, env = "MYCNI_METRICS_ADDR", default_value = "0.0.0.0:9971", value_parser = parse_metrics_addr)]
    metrics_addr: MetricsAddr,
    /// The period of the full reconcile pass (a dump of every route,
    /// neighbour and FDB entry of the overlay): the safety net for what no
    /// notification reported. Node events, pods and kernel drift (the
    /// agent's state changed under it, the underlay's address moved) are
    /// acted on at once, from the API's watch and the kernel's
    /// notifications.
    #[arg(long, env = "MYCNI_RESYNC", default_value = "5m", value_parser = parse_resync)]
    resync: Duration,
    /// /healthz fails once the reconcile loop has not come back to its
    /// wait for this long (it does after every pass, and every 10 s, or
    /// every resync period if shorter, while idle), so the liveness probe
    /// restarts a stuck agent; at least 3 of those heartbeats [default:
    /// 30s, or 3 heartbeats if longer].
    #[arg(long, env = "MYCNI_LIVENESS_STALE_AFTER", value_parser = parse_stale_after)]
    liveness_stale_after: Option<Duration>,
    /// SNAT pod traffic leaving the cluster CIDR (nftables table `ip mycni`).
    #[arg(long, env = "MYCNI_MASQUERADE", default_value_t = true, action = clap::ArgAction::Set, value_parser = parse_masquerade)]
    masquerade: bool,
    /// Enforce Kubernetes NetworkPolicy (networking.k8s.io/v1) in the
    /// nftables table `inet mycni_policy`; false removes the table.
    #[arg(long, env = "MYCNI_NETWORK_POLICY", default_value_t = true, action = clap::ArgAction::Set, value_parser = parse_network_policy)]
    network_policy: bool,
    /// Flow records the agent holds for `/flows` and `mycni-agent flows`
    /// (the oldest goes first).
    #[arg(long, env = "MYCNI_FLOW_HISTORY", default_value_t = mycni_agent::flows::store::DEFAULT_HISTORY, value_parser = parse_flow_history)]
    flow_history: usize,
    /// Local pods with series of their own in `mycni_flow_pod_drops_total`
    /// (the rest count under pod="_other"): the metric's cardinality bound.
    #[arg(long, env = "MYCNI_FLOW_POD_SERIES", default_value_t = 100, value_parser = parse_flow_pod_series)]
    flow_pod_series: usize,
    /// bpffs mount; pinned maps and links live under <bpffs>/mycni.
    #[arg(long, env = "MYCNI_BPFFS", default_value = "/sys/fs/bpf")]
    bpffs: PathBuf,
    /// `ebpf`: the tc fast path, with the kernel's routes, ARP and FDB as
    /// the fallback (used alone if the programs cannot load); `kernel`:
    /// routes, ARP and FDB only, and anything mycni attached is detached.
    #[arg(long, env = "MYCNI_DATAPATH", default_value = "ebpf", value_parser = parse_datapath)]
    datapath: Mode,
    /// Log every packet the tc programs see (aya-log, debug level; also set
    /// MYCNI_LOG=debug), with an --ebpf-object built with mycni-ebpf's
    /// `packet-log` feature. A ring-buffer write per packet: debugging only.
    #[arg(long, env = "MYCNI_EBPF_LOG")]
    ebpf_log: bool,
    /// With --datapath ebpf: encapsulate traffic to remote pods in tc and
    /// send it out of the underlay, and decapsulate VXLAN from peers at the
    /// underlay's ingress (datapath v2). `false` hands remote traffic to
    /// `vxlan.1` instead (the kernel encapsulates), as agents before v2 did.
    #[arg(long, env = "MYCNI_TC_ENCAP", default_value_t = true, action = clap::ArgAction::Set)]
    tc_encap: bool,
    /// With --datapath ebpf: the tc programs emit a flow event for the
    /// first packet of each connection and when its path changes, into the
    /// ring `mycni_flows` (a few ns per packet; never an event per packet).
    #[arg(long, env = "MYCNI_FLOW_EVENTS", default_value_t = true, action = clap::ArgAction::Set, value_parser = parse_flow_events)]
    flow_events: bool,
    /// Route peers whose host IP is on one of the underlay's own subnets
    /// (one L2 segment) straight to that host, without VXLAN: `podCIDR via
    /// <host IP>` on the underlay (flannel's DirectRouting, Calico's
    /// CrossSubnet). Peers elsewhere still go through VXLAN.
    #[arg(long, env = "MYCNI_DIRECT_ROUTING", default_value_t = false, action = clap::ArgAction::Set, value_parser = parse_direct_routing)]
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

/// `--mtu`: None is `auto`.
#[derive(Debug, Clone, Copy)]
struct MtuSetting(Option<u32>);

/// `--metrics-addr`: None is `off`.
#[derive(Debug, Clone, Copy)]
struct MetricsAddr(Option<SocketAddr>);

/// A bad value must name what the operator edits, which in a cluster is a
/// ConfigMap key, not the flag clap names: (ConfigMap key, env var).
fn setting<T>(key: &str, env: &str, r: Result<T, String>) -> Result<T, String> {
    r.map_err(|e| format!("{e} (ConfigMap mycni-config key `{key}`, env {env})"))
}

/// At most one IPv4 and one IPv6 CIDR, at least one of them,
/// comma-separated, in either order, as kube-controller-manager's
/// `--cluster-cidr` takes them.
fn parse_cidr(s: &str) -> Result<ClusterCidrs, String> {
    let (mut v4, mut v6) = (None, None);
    let mut r = Ok(());
    for part in s.split(',').map(str::trim) {
        if part.contains(':') {
            match Cidr6::parse_network(part) {
                Ok(c) if v6.is_none() => v6 = Some(c),
                Ok(_) => r = Err(format!("{s:?} has more than one IPv6 CIDR")),
                Err(_) => {
                    r = Err(format!(
                        "{part:?} is not an IPv6 CIDR like fd00:10:244::/56"
                    ))
                }
            }
        } else {
            match Cidr4::parse_network(part) {
                Ok(c) if v4.is_none() => v4 = Some(c),
                Ok(_) => r = Err(format!("{s:?} has more than one IPv4 CIDR")),
                Err(_) => r = Err(format!("{part:?} is not an IPv4 CIDR like 10.244.0.0/16")),
            }
        }
    }
    let r = r.and_then(|()| {
        ClusterCidrs::new(v4, v6).map_err(|_| format!("{s:?} has no CIDR of either family"))
    });
    setting("cluster-cidr", "MYCNI_CLUSTER_CIDR", r)
}

fn parse_underlay6(s: &str) -> Result<Underlay6Select, String> {
    setting("underlay6", "MYCNI_UNDERLAY6", s.parse())
}

fn parse_underlay(s: &str) -> Result<UnderlaySelect, String> {
    setting("underlay", "MYCNI_IFACE", s.parse())
}

/// The smallest datagram every IPv4 host must accept (RFC 791), and the
/// largest that fits an IPv4 packet with the VXLAN headers around it.
const MTU_RANGE: std::ops::RangeInclusive<u32> = 576..=65485;

fn parse_mtu(s: &str) -> Result<MtuSetting, String> {
    let v = match s.trim() {
        "" | "auto" => Ok(MtuSetting(None)),
        n => match n.parse::<u32>() {
            Ok(m) if MTU_RANGE.contains(&m) => Ok(MtuSetting(Some(m))),
            _ => Err(format!(
                "{s:?} is not an MTU: `auto` or a number from {} to {}",
                MTU_RANGE.start(),
                MTU_RANGE.end()
            )),
        },
    };
    setting("mtu", "MYCNI_MTU", v)
}

fn parse_datapath(s: &str) -> Result<Mode, String> {
    setting("datapath", "MYCNI_DATAPATH", s.trim().parse())
}

fn parse_bool(s: &str) -> Result<bool, String> {
    match s.trim() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("{s:?} is not true or false")),
    }
}

fn parse_masquerade(s: &str) -> Result<bool, String> {
    setting("masquerade", "MYCNI_MASQUERADE", parse_bool(s))
}

fn parse_network_policy(s: &str) -> Result<bool, String> {
    setting("network-policy", "MYCNI_NETWORK_POLICY", parse_bool(s))
}

fn parse_flow_events(s: &str) -> Result<bool, String> {
    setting("flow-events", "MYCNI_FLOW_EVENTS", parse_bool(s))
}

fn parse_count(s: &str) -> Result<usize, String> {
    s.trim()
        .parse::<usize>()
        .map_err(|_| format!("{s:?} is not a count (a whole number, 0 or more)"))
}

fn parse_flow_history(s: &str) -> Result<usize, String> {
    setting("flow-history", "MYCNI_FLOW_HISTORY", parse_count(s))
}

fn parse_flow_pod_series(s: &str) -> Result<usize, String> {
    setting("flow-pod-series", "MYCNI_FLOW_POD_SERIES", parse_count(s))
}

fn parse_direct_routing(s: &str) -> Result<bool, String> {
    setting("direct-routing", "MYCNI_DIRECT_ROUTING", parse_bool(s))
}

fn parse_metrics_addr(s: &str) -> Result<MetricsAddr, String> {
    let v = match s.trim() {
        "off" | "" => Ok(MetricsAddr(None)),
        a => a
            .parse::<SocketAddr>()
            .map(|a| MetricsAddr(Some(a)))
            .map_err(|_| format!("{a:?} is not `off` or an address:port like 0.0.0.0:9971")),
    };
    setting("metrics-addr", "MYCNI_METRICS_ADDR", v)
}

fn parse_resync(s: &str) -> Result<Duration, String> {
    setting("resync", "MYCNI_RESYNC", positive(parse_duration(s)))
}

fn parse_stale_after(s: &str) -> Result<Duration, String> {
    setting(
        "liveness-stale-after",
        "MYCNI_LIVENESS_STALE_AFTER",
        positive(parse_duration(s)),
    )
}

fn positive(d: Result<Duration, String>) -> Result<Duration, String> {
    d.and_then(|d| {
        if d.is_zero() {
            Err("a duration of 0 is not allowed".into())
        } else {
            Ok(d)
        }
    })
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" | "" => Ok(Duration::from_secs(n)),
        "m" => n
            .checked_mul(60)
            .map(Duration::from_secs)
            .ok_or_else(|| format!("duration {s:?} is too long")),
        _ => Err(format!("bad duration unit in {s:?} (ms, s, m)")),
    }
}

impl RunArgs {
    /// The least `--liveness-stale-after`: 3 heartbeats. Fewer would
    /// restart a healthy agent whose pass merely ran long once.
    fn min_stale_after(&self) -> Duration {
        Liveness::period(self.resync) * 3
    }

    /// How long the loop may stay away from its wait before /healthz
    /// fails: as set, else 30 s (3 heartbeats if longer). The heartbeat
    /// does not follow a long resync, so neither does this.
    fn stale_after(&self) -> Duration {
        self.liveness_stale_after
            .unwrap_or_else(|| self.min_stale_after().max(DEFAULT_STALE_AFTER))
    }

    fn config(self) -> Result<Config> {
        if let Some(set) = self.liveness_stale_after
            && set < self.min_stale_after()
        {
            anyhow::bail!(
                "--liveness-stale-after {:?} (ConfigMap mycni-config key `liveness-stale-after`, env MYCNI_LIVENESS_STALE_AFTER) must be at least 3 heartbeats of the loop ({:?}: 3 x the resync period, at most 3 x 10 s)",
                set,
                self.min_stale_after()
            );
        }
        Ok(Config {
            node_name: self.node_name,
            pod_name: self.pod_name,
            pod_namespace: self.pod_namespace,
            kubeconfig: self.kubeconfig,
            cluster_cidr: self.cluster_cidr.v4,
            cluster_cidr6: self.cluster_cidr.v6,
            iface: self.iface,
            vxlan_name: self.vxlan_name,
            vxlan6_name: self.vxlan6_name,
            underlay6: self.underlay6,
            vni: self.vni,
            vxlan_port: self.vxlan_port,
            cni_conf_dir: self.cni_conf_dir,
            state_dir: self.state_dir,
            data_dir: self.data_dir,
            proc_sys: self.proc_sys,
            metrics_addr: self.metrics_addr.0,
            resync: self.resync,
            masquerade: self.masquerade,
            network_policy: self.network_policy,
            flow_history: self.flow_history,
            flow_pod_series: self.flow_pod_series,
            ipam_data_dir: self.ipam_data_dir,
            plugin_log_file: self.plugin_log_file,
            datapath: self.datapath,
            ebpf_log: self.ebpf_log,
            tc_encap: self.tc_encap,
            flow_events: self.flow_events,
            direct_routing: self.direct_routing,
            ebpf_object: self.ebpf_object,
            pin_dir: self.bpffs.join("mycni"),
            mtu: self.mtu.0,
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
        Some(Cmd::Inspect {
            what: Some(InspectWhat::Policy { pod, agent, json }),
            ..
        }) => {
            use mycni_agent::policy::inspect;
            let report = inspect::fetch(mycni_agent::api::client::agent_address(&agent)?, &pod)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", inspect::render(&report));
            }
            Ok(())
        }
        Some(Cmd::Inspect {
            what: None,
            bpffs,
            vxlan_device,
        }) => {
            let out = match bpffs {
                Some(b) => mycni_agent::datapath::inspect::render(&b.join("mycni"))?,
                None => mycni_agent::datapath::inspect::render_attached(
                    &vxlan_device,
                    DEFAULT_VXLAN6_DEVICE,
                    Path::new("/sys/fs/bpf/mycni"),
                )?,
            };
            print!("{out}");
            Ok(())
        }
        Some(Cmd::Flows(a)) => rt.block_on(async {
            use mycni_agent::flows::cli;
            let agents = match &a.kubeconfig {
                Some(k) => cli::Agents::Cluster {
                    client: agent::kube_client(Some(k)).await?,
                    port: a.agent_port,
                },
                None => cli::Agents::One(mycni_agent::api::client::agent_address(&a.agent)?),
            };
            cli::run(agents, a.filter(), a.output).await
        }),
        Some(Cmd::Explain {
            src,
            dst,
            port,
            agent,
            kubeconfig,
            agent_port,
            json,
        }) => {
            use mycni_agent::flows::{cli, explain};
            let e = match kubeconfig {
                Some(k) => {
                    let agents = rt.block_on(async {
                        cli::node_agents(agent::kube_client(Some(&k)).await?, agent_port).await
                    })?;
                    explain::fetch_cluster(&agents, &src, &dst, &port)?
                }
                None => {
                    let agent = mycni_agent::api::client::agent_address(&agent)?;
                    explain::fetch(agent, &src, &dst, &port)?
                }
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&e)?);
            } else {
                print!("{}", explain::render(&e));
            }
            Ok(())
        }
        Some(Cmd::Uninstall(args)) => rt.block_on(agent::uninstall(&args.config()?)),
        Some(Cmd::CheckConfig(args)) => {
            let stale_after = args.stale_after();
            let cfg = args.config()?;
            println!(
                "configuration ok: cluster-cidr={} underlay={} underlay6={} mtu={} datapath={} direct-routing={} masquerade={} network-policy={} flow-events={} flow-history={} flow-pod-series={} metrics-addr={} resync={:?} liveness-stale-after={:?}",
                cfg.clusters(),
                cfg.iface,
                cfg.underlay6,
                cfg.mtu.map_or("auto".to_string(), |m| m.to_string()),
                format!("{:?}", cfg.datapath).to_lowercase(),
                cfg.direct_routing,
                cfg.masquerade,
                cfg.network_policy,
                cfg.flow_events,
                cfg.flow_history,
                cfg.flow_pod_series,
                cfg.metrics_addr
                    .map_or("off".to_string(), |a| a.to_string()),
                cfg.resync,
                stale_after,
            );
            mycni_agent::kernel_check::print(cfg.datapath, cfg.ebpf_object.as_deref())
        }
        Some(Cmd::Run(args)) => run(&rt, args),
        None => run(&rt, cli.run),
    }
}

fn run(rt: &tokio::runtime::Runtime, args: RunArgs) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    struct Parsed {
        cfg: Config,
        mtu: Option<u32>,
        stale_after: Duration,
        underlay: UnderlaySelect,
    }

    fn parse(args: &[&str]) -> Result<Parsed, String> {
        let cli = Cli::try_parse_from(["mycni-agent", "check-config"].iter().chain(args).copied())
            .map_err(|e| e.to_string())?;
        match cli.cmd {
            Some(Cmd::CheckConfig(a)) => {
                let stale_after = a.stale_after();
                let cfg = a.config().map_err(|e| e.to_string())?;
                let (mtu, underlay) = (cfg.mtu, cfg.iface.clone());
                Ok(Parsed {
                    cfg,
                    mtu,
                    stale_after,
                    underlay,
                })
            }
            _ => Err("not check-config".into()),
        }
    }

    #[test]
    fn every_setting_parses_its_documented_forms() {
        let c = parse(&[]).expect("defaults");
        assert_eq!(
            (c.mtu, &c.underlay, c.cfg.masquerade, c.cfg.direct_routing),
            (None, &UnderlaySelect::DefaultRoute, true, false)
        );
        assert_eq!(c.cfg.resync, Duration::from_secs(300));
        assert_eq!(c.stale_after, Duration::from_secs(30));
        assert_eq!(
            (c.cfg.underlay6, c.cfg.vxlan6_name.as_str()),
            (Underlay6Select::Auto, "vxlan6.1")
        );
        for (arg, want) in [
            ("--underlay6=off", Underlay6Select::Off),
            ("--underlay6=auto", Underlay6Select::Auto),
            (
                "--underlay6=fd00:77::1",
                Underlay6Select::Address("fd00:77::1".parse().expect("ip")),
            ),
        ] {
            assert_eq!(parse(&[arg]).expect(arg).cfg.underlay6, want);
        }
        for bad in ["fe80::1", "::1", "192.168.1.1", "eth0", "::ffff:10.0.0.1"] {
            let e = parse(&[&format!("--underlay6={bad}")])
                .map(|_| ())
                .expect_err(bad);
            assert!(
                e.contains("`underlay6`") && e.contains("MYCNI_UNDERLAY6"),
                "{e}"
            );
        }
        // The heartbeat, not the resync, bounds it: a long resync keeps
        // a stuck loop found within 30 s, and stays valid with it.
        let c = parse(&["--resync=60s"]).expect("long resync");
        assert_eq!(c.stale_after, Duration::from_secs(30));
        let c = parse(&["--resync=60s", "--liveness-stale-after=30s"]).expect("long resync");
        assert_eq!(c.stale_after, Duration::from_secs(30));
        // A short resync beats as often, and allows a short limit.
        let c = parse(&["--resync=1s", "--liveness-stale-after=3s"]).expect("lab settings");
        assert_eq!(c.stale_after, Duration::from_secs(3));
        let c = parse(&[
            "--cluster-cidr=10.32.0.0/12",
            "--mtu=1400",
            "--iface=interface=en*",
            "--datapath=kernel",
            "--direct-routing=true",
            "--masquerade=false",
            "--metrics-addr=off",
            "--resync=5s",
            "--liveness-stale-after=1m",
        ])
        .expect("all set");
        assert_eq!(c.cfg.clusters().to_string(), "10.32.0.0/12");
        assert_eq!(c.cfg.cluster_cidr6, None);
        for both in [
            "--cluster-cidr=10.32.0.0/12,fd00:10:244::/56",
            "--cluster-cidr=fd00:10:244::/56, 10.32.0.0/12",
        ] {
            let c = parse(&[both]).expect("dual-stack");
            assert_eq!(
                c.cfg.cluster_cidr.map(|c| c.to_string()).as_deref(),
                Some("10.32.0.0/12")
            );
            assert_eq!(
                c.cfg.cluster_cidr6.map(|c| c.to_string()).as_deref(),
                Some("fd00:10:244::/56")
            );
        }
        // IPv6-only: an IPv6 range alone.
        let c = parse(&["--cluster-cidr=fd00:10:244::/56"]).expect("IPv6-only");
        assert_eq!(c.cfg.cluster_cidr, None);
        assert!(c.cfg.clusters().ipv6_only());
        assert_eq!(c.cfg.clusters().to_string(), "fd00:10:244::/56");
        let c = parse(&[
            "--cluster-cidr=10.32.0.0/12",
            "--mtu=1400",
            "--iface=interface=en*",
            "--datapath=kernel",
            "--direct-routing=true",
            "--masquerade=false",
            "--metrics-addr=off",
            "--resync=5s",
            "--liveness-stale-after=1m",
        ])
        .expect("all set");
        assert_eq!(c.mtu, Some(1400));
        assert_eq!(c.underlay, UnderlaySelect::Pattern("en*".into()));
        assert_eq!(c.cfg.datapath, Mode::Kernel);
        assert!(c.cfg.direct_routing && !c.cfg.masquerade && c.cfg.metrics_addr.is_none());
        assert_eq!(c.stale_after, Duration::from_secs(60));
        let c = parse(&["--iface=can-reach=192.168.1.1", "--mtu=auto"]).expect("can-reach");
        assert_eq!(
            c.underlay,
            UnderlaySelect::CanReach(std::net::Ipv4Addr::new(192, 168, 1, 1).into())
        );
        assert_eq!(c.mtu, None);
    }

    #[test]
    fn a_bad_value_names_its_configmap_key() {
        for (arg, key) in [
            ("--cluster-cidr=10.244.0.1/33", "cluster-cidr"),
            ("--cluster-cidr=,", "cluster-cidr"),
            ("--cluster-cidr=fd00::/56,fd01::/56", "cluster-cidr"),
            ("--cluster-cidr=10.244.0.0/16,10.245.0.0/16", "cluster-cidr"),
            (
                "--cluster-cidr=10.244.0.0/16,fd00::/56,fd01::/56",
                "cluster-cidr",
            ),
            ("--cluster-cidr=10.244.0.0/16,fd00::1/56", "cluster-cidr"),
            ("--mtu=100", "mtu"),
            ("--mtu=1500b", "mtu"),
            ("--iface=can-reach=gateway", "underlay"),
            ("--iface=eth*", "underlay"),
            ("--datapath=xdp", "datapath"),
            ("--direct-routing=yes", "direct-routing"),
            ("--masquerade=1", "masquerade"),
            ("--network-policy=off", "network-policy"),
            ("--flow-events=yes", "flow-events"),
            ("--flow-history=-1", "flow-history"),
            ("--flow-pod-series=many", "flow-pod-series"),
            ("--metrics-addr=9971", "metrics-addr"),
            ("--resync=0s", "resync"),
            ("--liveness-stale-after=2x", "liveness-stale-after"),
            // Valid alone, but shorter than 3 heartbeats (10 s each).
            ("--liveness-stale-after=29s", "liveness-stale-after"),
        ] {
            let e = parse(&[arg])
                .err()
                .unwrap_or_else(|| panic!("{arg} accepted"));
            assert!(
                e.contains(&format!("ConfigMap mycni-config key `{key}`")),
                "{arg}: {e}"
            );
        }
    }
}
