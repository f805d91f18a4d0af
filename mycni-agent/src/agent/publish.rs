//! What the agent tells the node and the cluster once its overlay is up:
//! the conflist and the ready marker the plugin reads, and the Node's
//! `NetworkUnavailable=False`.

use std::path::{Path, PathBuf};

use anyhow::Result;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use mycni_common::contract::{self, Conflist, IpamConf, PluginConf};
use mycni_common::net::PodCidrs;

use super::Config;

/// [`mycni_common::fs::write_atomic`], with anyhow's error.
pub fn write_atomic(path: &Path, content: &[u8]) -> Result<()> {
    Ok(mycni_common::fs::write_atomic(path, content)?)
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

/// `NetworkUnavailable=False`, as a strategic merge on status: a JSON merge
/// patch would replace the whole conditions list and drop kubelet's.
pub(crate) async fn set_network_available(nodes: &Api<Node>, name: &str) -> Result<()> {
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
