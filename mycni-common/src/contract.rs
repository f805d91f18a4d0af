//! What the plugin (`mycni`) and the agent (`mycni-agent`) agree on.
//!
//! They never talk to each other: the agent leaves state on the node (routes,
//! the host veths' aliases, the conflist, the ready marker) and the plugin
//! reads it, or the other way round. Each such convention is defined once,
//! here, and both crates import it, so changing one side without the other
//! does not compile or fails a test (`mycni-agent/tests/contract.rs`).

use std::net::IpAddr;
use std::path::PathBuf;
use std::string::String;
use std::vec::Vec;

use serde::{Deserialize, Serialize};

use crate::net::Cidr;

/// Route protocol marking the /32 pod routes the plugin makes (cf.
/// /etc/iproute2/rt_protos); the agent lists pods by it.
pub const RTPROT_MYCNI_PLUGIN: u8 = 0x6d;
/// Route protocol marking the agent's routes to peers' podCIDRs; the agent
/// only ever deletes routes carrying it.
pub const RTPROT_MYCNI_AGENT: u8 = 0x6e;

/// Prefix of the alias the plugin sets on every host-side veth it owns.
pub const VETH_ALIAS_PREFIX: &str = "mycni:";

/// The alias of a host veth: `mycni:<network>:<container id>:<ifname>`.
/// It names the container the veth belongs to, so DEL and GC only ever touch
/// the interface of the container they are asked about; the agent takes
/// every veth carrying the prefix for a pod's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VethAlias<'a> {
    pub network: &'a str,
    pub container_id: &'a str,
    pub ifname: &'a str,
}

impl<'a> VethAlias<'a> {
    /// The alias text. Network names and container IDs have no `:` (the
    /// plugin validates both), so the parts stay separable; an ifname has
    /// none either, and it comes last anyway.
    pub fn render(&self) -> String {
        std::format!(
            "{VETH_ALIAS_PREFIX}{}:{}:{}",
            self.network,
            self.container_id,
            self.ifname
        )
    }

    /// The parts of an alias the plugin wrote; None for anything else.
    pub fn parse(alias: &'a str) -> Option<Self> {
        let rest = alias.strip_prefix(VETH_ALIAS_PREFIX)?;
        let mut it = rest.splitn(3, ':');
        Some(VethAlias {
            network: it.next()?,
            container_id: it.next()?,
            ifname: it.next()?,
        })
    }

    /// Whether a link's alias marks it as a host veth of mycni's. The agent
    /// asks only this: it needs the owner, not the container.
    pub fn is_mycni(alias: &str) -> bool {
        alias.starts_with(VETH_ALIAS_PREFIX)
    }
}

/// What every host veth name the plugin makes starts with (then 10 hex
/// digits of a hash of the pod). The alias is the contract's mark of a
/// mycni veth, but nftables cannot see aliases: the agent's IPv6
/// anti-spoofing rule matches this prefix, which covers a veth from the
/// moment it exists.
pub const HOST_VETH_PREFIX: &str = "mycni";

/// Node annotation with the node's VTEP MAC (`vxlan.1`'s address).
pub const ANNOTATION_VTEP_MAC: &str = "mycni.dev/vtep-mac";
/// Node annotation with the node's underlay IP (VXLAN packets go there).
pub const ANNOTATION_HOST_IP: &str = "mycni.dev/host-ip";
/// Node annotation with the node's IPv6 underlay address, where VXLAN over
/// IPv6 (`vxlan6.1`) is sent: flannel's `public-ip-v6`. Only on a node
/// with an IPv6 underlay.
pub const ANNOTATION_HOST_IP6: &str = "mycni.dev/host-ip-v6";
/// Node annotation with the MAC of the node's VXLAN device over IPv6
/// (`vxlan6.1`): flannel's `backend-v6-data`. A MAC of its own, not
/// `vxlan.1`'s: each device's FDB maps a MAC to one host, and a peer may
/// reach the node over either.
pub const ANNOTATION_VTEP_MAC6: &str = "mycni.dev/vtep-mac-v6";
/// The VXLAN device over an IPv6 underlay, beside [`DEFAULT_VXLAN_DEVICE`]
/// over IPv4 (flannel's `flannel-v6.1` beside `flannel.1`).
pub const DEFAULT_VXLAN6_DEVICE: &str = "vxlan6.1";

/// Where the agent keeps the ready marker (`--state-dir`); the same path on
/// the host and in its container.
pub const DEFAULT_STATE_DIR: &str = "/run/mycni";
/// The ready marker's name in the state directory.
pub const READY_FILE_NAME: &str = "ready";
/// The ready marker the plugin's STATUS looks for when the conflist names none.
pub const DEFAULT_READY_FILE: &str = "/run/mycni/ready";

/// Beside the ready marker, in the state directory: one [`PodRecord`] per
/// pod interface, named after its host veth. The runtime tells the plugin
/// which Pod it is wiring (`K8S_POD_NAMESPACE`, `K8S_POD_NAME` in
/// `CNI_ARGS`), and only the plugin sees that: the agent reads it here to
/// know which local interface and addresses are which Pod before the
/// kubelet's `status.podIPs` reaches the API. Not the veth's alias: that
/// holds 256 bytes and a Pod's namespace and name may take 253 each.
pub const POD_RECORDS_DIR: &str = "pods";

/// What the plugin's ADD records for the agent (see [`POD_RECORDS_DIR`]);
/// DEL removes it with the veth.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRecord {
    pub namespace: String,
    pub name: String,
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
    #[serde(rename = "hostVeth")]
    pub host_veth: String,
    pub ips: Vec<IpAddr>,
}

/// The overlay device, its VNI and UDP port (the Linux VXLAN default port,
/// which flannel uses too).
pub const DEFAULT_VXLAN_DEVICE: &str = "vxlan.1";
pub const DEFAULT_VNI: u32 = 1;
pub const DEFAULT_VXLAN_PORT: u16 = 8472;

/// The plugin's log file when the conflist names none.
pub const DEFAULT_PLUGIN_LOG_FILE: &str = "/var/log/mycni/plugin.log";

/// The conflist's file name in the CNI config directory: `00-` so the
/// runtime, which takes the first file in lexical order, picks it.
pub const CONFLIST_NAME: &str = "00-mycni.conflist";
/// The network's name in the conflist (and so in every veth alias).
pub const NETWORK_NAME: &str = "mycni0";
/// The plugin's `type`, i.e. its binary's name in the CNI bin directory.
pub const PLUGIN_TYPE: &str = "mycni";
/// `ipam.type` of the plugin's built-in IPAM.
pub const BUILTIN_IPAM_TYPE: &str = "mycni-ipam";
/// The CNI version the conflist is written in, and every version the plugin
/// speaks (the conflist's `cniVersions`). Written in 1.0.0, not 1.1.0:
/// runtimes on libcni before 1.2 (podman 4's CNI backend, containerd 1.6
/// and 1.7) know no `cniVersions`, run the plugin in the list's
/// `cniVersion` and cannot read a 1.1.0 result (podman 4.3: `plugin
/// type="mycni" failed (add): unsupported CNI result version "1.1.0"`);
/// libcni 1.2 and later take the highest version of both fields they know,
/// 1.1.0, so STATUS and GC stay theirs.
pub const CNI_VERSION: &str = "1.0.0";
pub const CNI_VERSIONS: [&str; 4] = ["0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// The conflist the agent writes and the runtime hands, one plugin at a
/// time, to the plugin. Fields are declared in the order of their JSON
/// names, so the file is the same bytes as when it was built from a
/// `serde_json::Value` (whose keys are sorted).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conflist {
    #[serde(rename = "cniVersion")]
    pub cni_version: String,
    #[serde(rename = "cniVersions")]
    pub cni_versions: Vec<String>,
    pub name: String,
    pub plugins: Vec<PluginConf>,
}

/// The plugin's entry in the conflist: what `NetConf::parse` reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginConf {
    pub ipam: IpamConf,
    /// None: the plugin's default, `DEFAULT_PLUGIN_LOG_FILE`.
    #[serde(rename = "logFile", default, skip_serializing_if = "Option::is_none")]
    pub log_file: Option<PathBuf>,
    pub mtu: u32,
    #[serde(rename = "readyFile")]
    pub ready_file: PathBuf,
    #[serde(rename = "type")]
    pub plugin_type: String,
    #[serde(rename = "vxlanDevice")]
    pub vxlan_device: String,
}

/// The built-in IPAM's section: what `Builtin::from_conf` reads.
///
/// A single-family node has its podCIDR in `subnet`, as before dual-stack;
/// a dual-stack node has one range set per family in `ranges`, primary
/// family first, in host-local's form (`[[{"subnet": ...}], [{"subnet":
/// ...}]]`), so the section also reads as a host-local one. Build it with
/// [`IpamConf::new`], which picks the form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpamConf {
    /// None: the IPAM's default lease directory.
    #[serde(rename = "dataDir", default, skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// Dual-stack: one range set per family, primary family first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranges: Vec<Vec<IpamRange>>,
    /// Single-family: the node's podCIDR.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet: Option<Cidr<IpAddr>>,
    #[serde(rename = "type")]
    pub ipam_type: String,
}

/// One range of a range set: a podCIDR, every address of it leasable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpamRange {
    pub subnet: Cidr<IpAddr>,
}

impl IpamConf {
    /// The built-in IPAM's section for a node's podCIDRs (primary family
    /// first): `subnet` for one, `ranges` for more.
    pub fn new(data_dir: Option<PathBuf>, pod_cidrs: &[Cidr<IpAddr>]) -> Self {
        let (subnet, ranges) = match pod_cidrs {
            [one] => (Some(*one), Vec::new()),
            many => (
                None,
                many.iter()
                    .map(|c| std::vec![IpamRange { subnet: *c }])
                    .collect(),
            ),
        };
        IpamConf {
            data_dir,
            ranges,
            subnet,
            ipam_type: BUILTIN_IPAM_TYPE.into(),
        }
    }

    /// The podCIDRs the section names, primary family first.
    pub fn subnets(&self) -> Vec<Cidr<IpAddr>> {
        self.subnet
            .into_iter()
            .chain(self.ranges.iter().flatten().map(|r| r.subnet))
            .collect()
    }
}

impl Conflist {
    /// The conflist of a node: one mycni plugin with the built-in IPAM over
    /// the node's podCIDR.
    pub fn new(plugin: PluginConf) -> Self {
        Conflist {
            cni_version: CNI_VERSION.into(),
            cni_versions: CNI_VERSIONS.iter().map(|v| (*v).into()).collect(),
            name: NETWORK_NAME.into(),
            plugins: std::vec![plugin],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alias_round_trip() {
        let a = VethAlias {
            network: "mycni0",
            container_id: "abc",
            ifname: "eth0",
        };
        let s = a.render();
        assert_eq!(s, "mycni:mycni0:abc:eth0");
        assert_eq!(VethAlias::parse(&s), Some(a));
        assert!(VethAlias::is_mycni(&s));
        assert_eq!(VethAlias::parse("other"), None);
        assert_eq!(VethAlias::parse("mycni:a:b"), None);
        assert!(!VethAlias::is_mycni("other"));
    }

    #[test]
    fn defaults_agree() {
        assert_eq!(
            DEFAULT_READY_FILE,
            std::format!("{DEFAULT_STATE_DIR}/{READY_FILE_NAME}")
        );
        assert!(CNI_VERSIONS.contains(&CNI_VERSION));
    }

    #[test]
    fn conflist_wire_shape() {
        let c = Conflist::new(PluginConf {
            ipam: IpamConf::new(None, &["10.244.1.0/24".parse().unwrap()]),
            log_file: None,
            mtu: 1450,
            ready_file: DEFAULT_READY_FILE.into(),
            plugin_type: PLUGIN_TYPE.into(),
            vxlan_device: DEFAULT_VXLAN_DEVICE.into(),
        });
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "cniVersion": "1.0.0",
                "cniVersions": ["0.3.1", "0.4.0", "1.0.0", "1.1.0"],
                "name": "mycni0",
                "plugins": [{
                    "type": "mycni",
                    "mtu": 1450,
                    "readyFile": "/run/mycni/ready",
                    "vxlanDevice": "vxlan.1",
                    "ipam": { "type": "mycni-ipam", "subnet": "10.244.1.0/24" },
                }],
            })
        );
        // Struct order is key order: the same text as the sorted `Value`.
        assert_eq!(
            serde_json::to_string(&c).unwrap(),
            serde_json::to_string(&v).unwrap()
        );
        assert_eq!(serde_json::from_value::<Conflist>(v).unwrap(), c);
    }

    #[test]
    fn dual_stack_ipam_is_host_locals_ranges() {
        let v4: Cidr<IpAddr> = "10.244.1.0/24".parse().unwrap();
        let v6: Cidr<IpAddr> = "fd00:10:244:1::/64".parse().unwrap();
        let ipam = IpamConf::new(Some("/var/lib/x".into()), &[v6, v4]);
        let v = serde_json::to_value(&ipam).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "dataDir": "/var/lib/x",
                "ranges": [[{"subnet": "fd00:10:244:1::/64"}], [{"subnet": "10.244.1.0/24"}]],
                "type": "mycni-ipam",
            })
        );
        assert_eq!(
            serde_json::to_string(&ipam).unwrap(),
            serde_json::to_string(&v).unwrap()
        );
        let back: IpamConf = serde_json::from_value(v).unwrap();
        assert_eq!(back.subnets(), [v6, v4]);
        // The single-subnet form of conflists written before dual-stack
        // still reads.
        let old: IpamConf =
            serde_json::from_str(r#"{"type":"mycni-ipam","subnet":"10.244.1.0/24"}"#).unwrap();
        assert_eq!(old, IpamConf::new(None, &[v4]));
        assert_eq!(old.subnets(), [v4]);
    }
}
