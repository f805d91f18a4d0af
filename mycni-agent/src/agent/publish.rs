//! What the agent tells the node and the cluster once its overlay is up:
//! the conflist and the ready marker the plugin reads, the Node's
//! `NetworkUnavailable=False`, readiness, and the host IP again when the
//! underlay moves. The loop only wakes and runs the passes; after each,
//! the [`Publisher`] says what that pass made true.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use mycni_common::contract::{self, Conflist, IpamConf, PluginConf};
use mycni_common::net::PodCidrs;

use super::Config;
use super::client::kube_client;
use crate::metrics::Metrics;
use mycni_common::contract::CONFLIST_NAME;

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

/// What the node has been told so far, across passes.
pub struct Publisher {
    nodes: Api<Node>,
    node_name: String,
    metrics: Arc<Metrics>,
    /// The conflist, ready marker and NetworkUnavailable=False went out.
    handed_over: bool,
    /// The underlay moved: its host IP is to be announced again.
    republish: bool,
}

impl Publisher {
    pub fn new(nodes: Api<Node>, node_name: String, metrics: Arc<Metrics>) -> Self {
        Publisher {
            nodes,
            node_name,
            metrics,
            handed_over: false,
            republish: false,
        }
    }

    pub fn underlay_moved(&mut self) {
        self.republish = true;
    }

    /// After a pass that succeeded: the node handed over to the runtime
    /// once (again if its conflist went), the ready marker kept, readiness
    /// said with `detail`. False: something is to be retried.
    pub async fn after_pass(
        &mut self,
        cfg: &Config,
        own: PodCidrs,
        pods_mtu: u32,
        detail: String,
    ) -> Result<bool> {
        let mut done = true;
        if !self.handed_over || !cfg.cni_conf_dir.join(CONFLIST_NAME).exists() {
            // The conflist goes out only once the overlay is up and peers
            // are programmed: the runtime starts pods as soon as it sees it.
            let conf = conflist(cfg, own, pods_mtu);
            write_atomic(
                &cfg.cni_conf_dir.join(CONFLIST_NAME),
                serde_json::to_string_pretty(&conf)?.as_bytes(),
            )?;
            write_atomic(&ready_file(cfg), b"ready\n")?;
            if let Err(e) = set_network_available(&self.nodes, &self.node_name).await {
                tracing::warn!(error = %e, "cannot set NetworkUnavailable=False yet");
                done = false;
            } else {
                self.handed_over = true;
            }
        } else if !ready_file(cfg).exists() {
            // Drift repair recreated the ready marker's precondition.
            write_atomic(&ready_file(cfg), b"ready\n")?;
        }
        self.metrics.set_ready(detail);
        Ok(done)
    }

    /// After the pass (so vxlan.1 has moved first): the host IP the
    /// underlay moved to, `host_ip` (its annotation and address), if it is
    /// still to be announced. False: to be retried.
    pub async fn republish(&mut self, cfg: &Config, host_ip: Option<(&str, IpAddr)>) -> bool {
        if !self.republish {
            return true;
        }
        let done = match host_ip {
            Some((key, ip)) => republish_host_ip(cfg, &self.node_name, key, ip).await,
            None => true,
        };
        if done {
            self.republish = false;
        }
        done
    }
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
