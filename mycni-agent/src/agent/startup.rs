//! Start-up: what the agent does once before its loop. It finds its Node and
//! waits for the podCIDR, brings `vxlan.1` up with a stable VTEP MAC, loads
//! the programs, sets the sysctls and the masquerade rules, and announces the
//! VTEP on its Node. [`Started`] is all of it the loop goes on with.
//!
//! The overlay brings its devices up itself (`overlay::start`).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};

use super::client::{kube_client, resolve_node_name};
use super::config::Config;
use crate::datapath::DatapathRoom;
use crate::metrics::Metrics;
use crate::overlay::OverlayKernel;
use crate::tables::underlay_filter::UnderlayFilter;
use crate::topology::{Vxlan6Spec, VxlanSpec};
use mycni_common::contract::{
    ANNOTATION_HOST_IP, ANNOTATION_HOST_IP6, ANNOTATION_VTEP_MAC, ANNOTATION_VTEP_MAC6,
};
use mycni_common::net::{Cidr4, Mac, PodCidrs};

/// What start-up produced, handed to the loop as a whole.
pub(super) struct Started {
    pub(super) client: kube::Client,
    pub(super) nodes: Api<Node>,
    pub(super) node_name: String,
    /// The IPv4 podCIDR (None on an IPv6-only node) and the IPv6 one (on a
    /// node of a cluster the agent does IPv6 in).
    pub(super) own: PodCidrs,
    pub(super) kernel: OverlayKernel,
    /// `vxlan.1` as brought up; the loop moves it when the underlay moves.
    /// None on an IPv6-only node.
    pub(super) vx: Option<VxlanSpec>,
    /// `vxlan6.1` as brought up, on a node with an IPv6 underlay (always
    /// on an IPv6-only node).
    pub(super) vx6: Option<Vxlan6Spec>,
    /// The underlay's own subnets at start: the first set direct routing
    /// uses, before the loop re-reads the underlay.
    pub(super) underlay_subnets: Vec<Cidr4>,
    pub(super) filter: UnderlayFilter,
    pub(super) fast: DatapathRoom,
}

pub(super) async fn start(cfg: &Config, metrics: &Arc<Metrics>) -> Result<Started> {
    // First: pods of an earlier run may already be sending, and the table
    // needs nothing from the API or the underlay.
    crate::tables::antispoof::start(metrics);
    let client = kube_client(cfg.kubeconfig.as_deref()).await?;
    let node_name = retry("finding this node's name", || {
        resolve_node_name(cfg, &client)
    })
    .await;
    let nodes: Api<Node> = Api::all(client.clone());
    metrics.set_not_ready(format!("waiting for Node {node_name} to have spec.podCIDR"));
    let own = wait_for_pod_cidr(cfg, &nodes, &node_name, metrics).await;
    if let (Some(c6), None) = (own.v6, cfg.cluster_cidr6) {
        // Not reachable (own_pod_cidrs ignores IPv6 then); said for clarity.
        tracing::warn!(pod_cidr6 = %c6, "no IPv6 cluster CIDR: IPv6 is off");
    }

    // Before vxlan.1 can exist: a fresh node accepts no VXLAN until its
    // first pass knows the peers; a restarted one keeps its peer set.
    let filter = UnderlayFilter::start(cfg.vxlan_port, metrics.clone());
    let kernel = OverlayKernel::new()?;
    let crate::overlay::start::Devices {
        vx,
        vx6,
        underlay_subnets,
        underlay_name,
    } = crate::overlay::start::start(&overlay_section(cfg), &kernel, &node_name, own).await?;
    let fast = load_programs(cfg, metrics)?;
    crate::caps::drop_sys_admin_after_load()?;
    if own.v4.is_some() {
        set_sysctl(&cfg.proc_sys, "net.ipv4.ip_forward", "1")?;
    }
    if own.v6.is_some() {
        set_sysctl(&cfg.proc_sys, "net.ipv6.conf.all.forwarding", "1")?;
        warn_ra_ignored(&cfg.proc_sys, &underlay_name);
    }
    warn_loose_rp_filter(&cfg.proc_sys);
    if cfg.masquerade {
        crate::tables::masq::install(cfg.clusters()).context("installing masquerade rules")?;
    }
    if !cfg.network_policy {
        // An agent run with policy before would leave its last rules in force.
        crate::policy::room::uninstall(&crate::datapath::PinnedEpoch(cfg.pin_dir.clone()))
            .context("removing the NetworkPolicy table")?;
    }
    announce(
        &nodes,
        &node_name,
        vx.as_ref().map(|v| (v.mac, v.local_ip)),
        vx6.as_ref(),
    )
    .await;
    Ok(Started {
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
    })
}

/// The podCIDRs come from kube-controller-manager; until then there is
/// nothing to do but wait and say so. The IPv4 one is required in a
/// cluster with an IPv4 range, the IPv6 one in an IPv6-only cluster; the
/// IPv6 one is taken when the agent does IPv6 (an IPv6 cluster CIDR is
/// set), and when it is there but bad the node waits as for a bad IPv4
/// one: going ahead without it would leave pods without IPv6 on a node
/// the cluster takes for dual-stack.
async fn wait_for_pod_cidr(
    cfg: &Config,
    nodes: &Api<Node>,
    node_name: &str,
    metrics: &Metrics,
) -> PodCidrs {
    loop {
        match nodes.get_opt(node_name).await {
            Ok(Some(n)) => {
                let view = crate::watch::node_view(&n);
                let texts = view.pod_cidr_texts();
                if texts.v4.is_empty() && texts.v6.is_empty() {
                    tracing::info!(node = %node_name, "waiting for spec.podCIDR (kube-controller-manager --allocate-node-cidrs)");
                } else {
                    match view.own_pod_cidrs(cfg.clusters()) {
                        Ok(own) => {
                            if own.v6.is_none() && !texts.v6.is_empty() {
                                tracing::warn!(node = %node_name, pod_cidrs = ?texts.v6, "this node has an IPv6 podCIDR, but no IPv6 cluster CIDR is set (cluster-cidr): IPv6 is off");
                            }
                            if own.v4.is_none() && !texts.v4.is_empty() {
                                tracing::warn!(node = %node_name, pod_cidrs = ?texts.v4, "this node has an IPv4 podCIDR, but the cluster CIDR (cluster-cidr) is IPv6-only: IPv4 is off");
                            }
                            return own;
                        }
                        Err(why) => {
                            tracing::error!(node = %node_name, cluster_cidr = %cfg.clusters(), "own podCIDRs: {why}");
                            metrics.set_not_ready(format!("own podCIDRs: {why}"));
                        }
                    }
                }
            }
            Ok(None) => tracing::warn!(node = %node_name, "own Node object not found; retrying"),
            Err(e) => tracing::warn!(error = %e, "cannot read own Node; retrying"),
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The overlay's part of the agent's settings.
fn overlay_section(cfg: &Config) -> crate::overlay::start::Section {
    crate::overlay::start::Section {
        vxlan_name: cfg.vxlan_name.clone(),
        vxlan6_name: cfg.vxlan6_name.clone(),
        vni: cfg.vni,
        vxlan_port: cfg.vxlan_port,
        mtu: cfg.mtu,
        iface: cfg.iface.clone(),
        underlay6: cfg.underlay6,
        direct_routing: cfg.direct_routing,
        data_dir: cfg.data_dir.clone(),
        proc_sys: cfg.proc_sys.clone(),
    }
}

/// The eBPF fast path, from `--ebpf-object` or the embedded object; it
/// falls back to the kernel path by itself when the programs cannot load.
fn load_programs(cfg: &Config, metrics: &Arc<Metrics>) -> Result<DatapathRoom> {
    let object = match &cfg.ebpf_object {
        Some(p) => Some(
            std::fs::read(p).with_context(|| format!("reading --ebpf-object {}", p.display()))?,
        ),
        None => crate::datapath::embedded_object().map(<[u8]>::to_vec),
    };
    let section = crate::datapath::Section {
        mode: cfg.datapath,
        tc_encap: cfg.tc_encap,
        log: cfg.ebpf_log,
        pin_dir: cfg.pin_dir.clone(),
        proc_sys: cfg.proc_sys.clone(),
    };
    Ok(
        DatapathRoom::start(&section, object.as_deref(), metrics.clone())
            .with_flow_events(cfg.flow_events),
    )
}

/// Publish ourselves: what peers need to reach our pods. Through
/// `nodes/status`, the one write the agent's role grants on Nodes: the node
/// status strategy keeps metadata changes and resets spec ones, so the
/// annotations land and the role gives no hold on the Node's spec (flannel
/// writes its annotations the same way).
/// Without an IPv6 underlay its annotations are removed (null in a merge
/// patch), so no peer keeps sending to a device this node no longer has;
/// the same for the IPv4 ones (`v4`: `vxlan.1`'s MAC and host IP) on an
/// IPv6-only node, where an earlier dual-stack run may have left them.
async fn announce(
    nodes: &Api<Node>,
    node_name: &str,
    v4: Option<(Mac, std::net::Ipv4Addr)>,
    vx6: Option<&Vxlan6Spec>,
) {
    let patch = serde_json::json!({ "metadata": { "annotations": {
        ANNOTATION_VTEP_MAC: v4.map(|(mac, _)| mac.to_string()),
        ANNOTATION_HOST_IP: v4.map(|(_, ip)| ip.to_string()),
        ANNOTATION_VTEP_MAC6: vx6.map(|v| v.mac.to_string()),
        ANNOTATION_HOST_IP6: vx6.map(|v| v.local_ip.to_string()),
    }}});
    let (pp, merge) = (PatchParams::default(), Patch::Merge(&patch));
    retry("publishing VTEP annotations on own Node", || {
        nodes.patch_status(node_name, &pp, &merge)
    })
    .await;
}

/// The plugin makes each pod's host veth drop packets whose source is not
/// the pod's (strict reverse-path filtering), but the kernel applies the
/// larger of `all` and the device's value: with `all` at 2 (loose) a pod
/// can send from another pod's address on this node. That is the host's
/// policy to change, not the agent's; say so where an operator looks.
fn warn_loose_rp_filter(proc_sys: &Path) {
    let p = proc_sys.join("net/ipv4/conf/all/rp_filter");
    if std::fs::read_to_string(&p).is_ok_and(|v| v.trim() == "2") {
        tracing::warn!(
            "net.ipv4.conf.all.rp_filter is 2 (loose): pods can send from other pods' addresses on this node; set it to 0 or 1 so the plugin's per-veth strict filter applies"
        );
    }
}

/// With forwarding on, the kernel ignores router advertisements on an
/// interface whose `accept_ra` is 1 (the rule for routers): a node that
/// takes its own IPv6 default route from them would lose it when it
/// expires. Setting 2 is the host's call; say so.
fn warn_ra_ignored(proc_sys: &Path, underlay: &str) {
    let p = proc_sys.join(format!("net/ipv6/conf/{underlay}/accept_ra"));
    if std::fs::read_to_string(&p).is_ok_and(|v| v.trim() == "1") {
        tracing::warn!(
            underlay,
            "IPv6 forwarding is on, so {underlay} now ignores router advertisements (accept_ra 1); set net.ipv6.conf.{underlay}.accept_ra=2 if the node takes its IPv6 routes from them"
        );
    }
}

fn set_sysctl(proc_sys: &Path, key: &str, value: &str) -> Result<()> {
    let p = proc_sys.join(key.replace('.', "/"));
    std::fs::write(&p, value).with_context(|| format!("writing {value} to {}", p.display()))
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
