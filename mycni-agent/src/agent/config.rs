//! What `mycni-agent run` is configured with, parsed once by `main.rs`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use mycni_common::net::{Cidr4, Cidr6, ClusterCidrs};

use crate::datapath::Mode;
use crate::topology::{Underlay6Select, UnderlaySelect};

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
    pub cluster_cidr: Option<Cidr4>,
    /// The cluster's IPv6 pod CIDR; None: the agent does no IPv6 (every
    /// IPv6 podCIDR, its own and its peers', is ignored).
    pub cluster_cidr6: Option<Cidr6>,
    /// How the underlay interface is found (`--iface`). Re-applied
    /// whenever the kernel reports an address, route or link change that
    /// may move it, and on every full pass.
    pub iface: UnderlaySelect,
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
    /// Run the policy room (NetworkPolicy in `inet mycni_policy`).
    pub network_policy: bool,
    /// Flow records held for `/flows`.
    pub flow_history: usize,
    /// Local pods with drop series of their own.
    pub flow_pod_series: usize,
    /// Written into the conflist for the plugin: where its built-in IPAM
    /// keeps leases, and its log file (None: the plugin's defaults).
    pub ipam_data_dir: Option<PathBuf>,
    pub plugin_log_file: Option<PathBuf>,
    pub datapath: Mode,
    /// Enable the programs' aya-log output (every packet; debugging only).
    pub ebpf_log: bool,
    /// Encapsulate and decapsulate in tc (datapath v2); else through `vxlan.1`.
    pub tc_encap: bool,
    /// The tc programs emit flow events into `mycni_flows`.
    pub flow_events: bool,
    /// Route peers on the underlay's own subnets straight to their host IP,
    /// without VXLAN (flannel's DirectRouting, Calico's CrossSubnet).
    pub direct_routing: bool,
    /// Load this eBPF object instead of the embedded one.
    pub ebpf_object: Option<PathBuf>,
    /// Where maps, programs and links are pinned (`<bpffs>/mycni`).
    pub pin_dir: PathBuf,
    /// The overlay MTU (vxlan.1, the pods' eth0); None: the underlay's less
    /// the VXLAN overhead.
    pub mtu: Option<u32>,
}

impl Config {
    /// The cluster CIDRs of both families.
    pub fn clusters(&self) -> ClusterCidrs {
        ClusterCidrs {
            v4: self.cluster_cidr,
            v6: self.cluster_cidr6,
        }
    }
}
