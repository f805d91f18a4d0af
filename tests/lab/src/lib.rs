//! The local multi-node lab: an underlay bridge in its own namespace, N node
//! namespaces each running the real `mycni-agent` against the Kubernetes
//! API fixture, and P pods per node made by the real plugin binary from the
//! conflist the agent wrote. Used by `cargo xtask lab` and the lab tests.
//!
//! Its parts: `setup` (bringing the lab up and down, the agents), `pods`
//! (the plugin as the runtime runs it, and the pods' echo server),
//! `matrix` (the connectivity matrix), `datapath` (the agents' datapath,
//! their counters and the fast share), `daemon` (processes in namespaces).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Result, bail};

use mycni_apiserver::ApiServer;

mod daemon;
mod datapath;
pub mod labbench;
mod matrix;
mod pods;
mod prometheus;
mod setup;
pub mod soak;

pub use daemon::spawn_daemon;
pub(crate) use daemon::wait_for;
pub use datapath::{
    Counters, FamilyCounters, NodeDatapath, PathShare, PeerRoutes, VXLAN_DEV,
    describe_ipv6_overlay, describe_node, family_label, parse_counters, parse_family_counters,
};
pub use matrix::{FamilyRun, MatrixRun};
pub use pods::{
    PROBE_BULK_FAILED, ProbeError, echo_server, format_tcp_rr, http_get, parse_tcp_rr, tcp_probe,
    tcp_rr,
};
pub use prometheus::PROMETHEUS_PORT;
pub use soak::churn::leaks::{NodeState, node_state};

/// The binaries a lab runs.
#[derive(Debug, Clone)]
pub struct Bins {
    pub agent: PathBuf,
    pub plugin: PathBuf,
    pub apiserver: PathBuf,
    /// `mycni-lab` itself: pods run its echo server.
    pub lab: PathBuf,
}

#[derive(Debug, Clone)]
pub struct Spec {
    /// Namespace names start with this: `mycni` for the CLI lab, unique in tests.
    pub prefix: String,
    pub nodes: usize,
    pub pods: usize,
    /// Lab state: kubeconfig, per-node dirs, logs, pids.
    pub root: PathBuf,
    pub bins: Bins,
    /// Extra arguments for every agent (e.g. `--datapath kernel`).
    pub agent_args: Vec<String>,
    /// Run the API fixture inside this process (tests, which then change
    /// Nodes and inject faults through `Lab::api`), else as a daemon.
    pub in_process_api: bool,
    /// The address families of the Nodes' podCIDRs, and so of the pods.
    pub stack: Stack,
}

/// An address family of the pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    pub fn label(self) -> &'static str {
        match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        }
    }
}

impl std::fmt::Display for IpFamily {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// Which families a lab's Nodes get podCIDRs of (`spec.podCIDRs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Stack {
    /// An IPv4 and an IPv6 podCIDR per Node: pods get one address of each.
    #[default]
    Dual,
    Ipv4Only,
    /// Refused by [`Lab::up`]: see [`Stack::unsupported`].
    Ipv6Only,
}

impl Stack {
    pub fn families(self) -> Vec<IpFamily> {
        match self {
            Stack::Dual => vec![IpFamily::V4, IpFamily::V6],
            Stack::Ipv4Only => vec![IpFamily::V4],
            Stack::Ipv6Only => vec![IpFamily::V6],
        }
    }

    pub fn has(self, f: IpFamily) -> bool {
        self.families().contains(&f)
    }

    /// Why the agent cannot run this stack, if it cannot. An IPv6-only
    /// lab needs the agent to run on a Node with only an IPv6 podCIDR: it
    /// takes such Nodes as peers (over `vxlan6.1`, given an IPv6 underlay),
    /// but refuses one as its own (`own_pod_cidrs`: "IPv6-only nodes are
    /// not supported") and refuses a `--cluster-cidr` without an IPv4
    /// range. Faking it with IPv4 podCIDRs and pods given only their IPv6
    /// range would not be an IPv6-only node.
    pub fn unsupported(self) -> Option<&'static str> {
        match self {
            Stack::Ipv6Only => Some(
                "an IPv6-only lab is not supported yet: mycni-agent does not run on a Node \
                 whose spec.podCIDRs have no IPv4 range (\"IPv6-only nodes are not \
                 supported\": it takes them as peers only) and refuses a --cluster-cidr \
                 without an IPv4 range; use the default dual-stack lab or --ipv4-only",
            ),
            Stack::Dual | Stack::Ipv4Only => None,
        }
    }

    /// The agents' `--cluster-cidr`.
    pub fn cluster_cidr(self) -> String {
        match self {
            Stack::Ipv4Only => CLUSTER_CIDR.to_string(),
            Stack::Dual | Stack::Ipv6Only => format!("{CLUSTER_CIDR},{CLUSTER_CIDR6}"),
        }
    }

    /// Node `i`'s `spec.podCIDRs`, IPv4 first (its `spec.podCIDR`).
    pub fn pod_cidrs(self, i: usize) -> Vec<String> {
        self.families()
            .into_iter()
            .map(|f| match f {
                IpFamily::V4 => pod_cidr(i),
                IpFamily::V6 => pod_cidr6(i),
            })
            .collect()
    }
}

pub const API_ADDR: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 1);
pub const API_PORT: u16 = 6443;
pub const ECHO_PORT: u16 = 7777;
pub const METRICS_PORT: u16 = 9971;
/// Bytes each matrix cell echoes over its TCP connection once established.
/// Pings and every connection's SYN and FIN take the kernel path by design,
/// so without a transfer the matrix would say nothing about the fast path;
/// 200 KB is ~140 full-size segments each way, a few ms per cell, and full
/// segments also catch an MTU or encapsulation mistake small probes miss.
pub const MATRIX_BULK_BYTES: usize = 200 * 1024;

/// The cluster's pod ranges (the agents' `--cluster-cidr`): node `i` gets
/// `10.244.<i>.0/24` and `fd00:10:244:<i>::/64` (`i` in hex) from them.
/// fd00::/8 is the ULA range (RFC 4193), so lab addresses never leave the lab.
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
pub const CLUSTER_CIDR6: &str = "fd00:10:244::/56";

/// Node `i`'s IPv4 podCIDR.
pub fn pod_cidr(i: usize) -> String {
    format!("10.244.{i}.0/24")
}

/// Node `i`'s IPv6 podCIDR: the `i`-th /64 of [`CLUSTER_CIDR6`].
pub fn pod_cidr6(i: usize) -> String {
    format!("fd00:10:244:{i:x}::/64")
}

pub fn node_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(192, 168, 77, 10 + i as u8)
}

// ---------------------------------------------------------------- interrupts

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// SIGINT, SIGTERM and SIGHUP set a flag instead of killing the process, so
/// `lab up`, the bench and the soak stop at their next check and still tear
/// down what they made. Children get the default dispositions back at exec.
pub fn catch_interrupts() {
    let handler = on_signal as extern "C" fn(libc::c_int);
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        unsafe { libc::signal(sig, handler as *const () as libc::sighandler_t) };
    }
}

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

pub fn check_interrupted() -> Result<()> {
    if interrupted() {
        bail!("interrupted");
    }
    Ok(())
}

impl Spec {
    pub fn underlay_ns(&self) -> String {
        format!("{}-underlay", self.prefix)
    }
    pub fn node_name(&self, i: usize) -> String {
        format!("{}-node{i}", self.prefix)
    }
    pub fn pod_ns(&self, i: usize, j: usize) -> String {
        format!("{}-node{i}-pod{j}", self.prefix)
    }
    pub fn node_dir(&self, i: usize) -> PathBuf {
        self.root.join(format!("node{i}"))
    }
    pub fn kubeconfig(&self) -> PathBuf {
        self.root.join("kubeconfig")
    }
    /// The lab's own bpffs: each node pins under `<bpffs>/node<i>/mycni`.
    /// Not /sys/fs/bpf: `ip netns exec` remounts /sys, hiding it.
    pub fn bpffs(&self) -> PathBuf {
        self.root.join("bpffs")
    }
    pub fn pin_dir(&self, i: usize) -> PathBuf {
        self.bpffs().join(format!("node{i}/mycni"))
    }
    pub(crate) fn pods_file(&self) -> PathBuf {
        self.root.join("pods.json")
    }
}

/// One pod of the lab.
#[derive(Debug, Clone)]
pub struct Pod {
    pub node: usize,
    pub index: usize,
    pub ns: String,
    pub ip: Ipv4Addr,
    /// Its IPv6 address, in a dual-stack lab.
    pub ip6: Option<Ipv6Addr>,
}

impl Pod {
    /// The pod's address of family `f`, if it has one.
    pub fn addr(&self, f: IpFamily) -> Option<IpAddr> {
        match f {
            IpFamily::V4 => Some(IpAddr::V4(self.ip)),
            IpFamily::V6 => self.ip6.map(IpAddr::V6),
        }
    }
}

/// A pod's short name in tables: `n<node>p<index>`.
pub fn pod_label(p: &Pod) -> String {
    format!("n{}p{}", p.node, p.index)
}

pub struct Lab {
    pub spec: Spec,
    pub api: Option<ApiServer>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacks_give_nodes_their_podcidrs_and_the_agents_their_ranges() {
        assert_eq!(
            Stack::default().pod_cidrs(2),
            ["10.244.2.0/24", "fd00:10:244:2::/64"]
        );
        // Hex: node 10 gets the tenth /64, inside the /56.
        assert_eq!(pod_cidr6(10), "fd00:10:244:a::/64");
        assert_eq!(Stack::Ipv4Only.pod_cidrs(1), ["10.244.1.0/24"]);
        assert_eq!(Stack::Dual.cluster_cidr(), "10.244.0.0/16,fd00:10:244::/56");
        assert_eq!(Stack::Ipv4Only.cluster_cidr(), "10.244.0.0/16");
        assert!(Stack::Dual.unsupported().is_none() && Stack::Ipv4Only.unsupported().is_none());
        let why = Stack::Ipv6Only.unsupported().unwrap_or_default();
        assert!(why.contains("no IPv4 range"), "{why}");
        let pod = Pod {
            node: 1,
            index: 1,
            ns: "x".into(),
            ip: Ipv4Addr::new(10, 244, 1, 1),
            ip6: None,
        };
        assert_eq!(pod.addr(IpFamily::V6), None);
        assert_eq!(pod.addr(IpFamily::V4), Some(IpAddr::from([10, 244, 1, 1])));
    }
}
