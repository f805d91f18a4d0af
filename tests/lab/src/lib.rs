//! The local multi-node lab: an underlay bridge in its own namespace, N node
//! namespaces each running the real `mycni-agent` against the Kubernetes
//! API fixture, and P pods per node made by the real plugin binary from the
//! conflist the agent wrote. Used by `cargo xtask lab` and the lab tests.
//!
//! Its parts: `setup` (bringing the lab up and down, the agents), `pods`
//! (the plugin as the runtime runs it, and the pods' echo server),
//! `matrix` (the connectivity matrix), `datapath` (the agents' datapath,
//! their counters and the fast share), `daemon` (processes in namespaces),
//! `stats` (the one percentile every bench and the soak report), `chart`
//! (the benches' figures drawn as SVG).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Result, bail};

use mycni_apiserver::ApiServer;

pub mod chart;
mod daemon;
mod datapath;
mod forward;
mod kubeapi;
mod kubelet;
pub mod labbench;
mod matrix;
pub mod model;
pub mod netpol;
mod pods;
pub mod probe;
mod prometheus;
mod services;
mod setup;
pub mod soak;
pub mod stats;

pub(crate) use daemon::wait_for;
pub use daemon::{AGENT_CAPS_ENV, spawn_daemon, strip_ansi, time_scale};
pub use datapath::{
    Counters, FamilyCounters, NodeDatapath, PathShare, PeerRoutes, VXLAN_DEV, VXLAN6_DEV,
    describe_ipv6_overlay, describe_node, describe_node_routes, family_label, parse_counters,
    parse_family_counters,
};
pub use forward::{HOST_KUBECONFIG_HINT, forward_command};
pub use kubeapi::{Method, ObjectRef, collection};
pub use kubelet::PodRequest;
pub use matrix::{FamilyRun, MatrixRun};
pub use model::KubePod;
pub use pods::{
    PROBE_BULK_FAILED, ProbeError, Sandbox, echo_server, format_tcp_rr, http_get, parse_tcp_rr,
    tcp_probe, tcp_rr,
};
pub use prometheus::PROMETHEUS_PORT;
pub use services::SERVICE_TABLE;
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

impl Bins {
    /// The binaries as the workspace builds them into one directory; each
    /// missing one is an error that ends with `hint` (how to build it).
    pub fn in_dir(dir: &std::path::Path, hint: &str) -> anyhow::Result<Bins> {
        let bins = Bins {
            agent: dir.join("mycni-agent"),
            plugin: dir.join("mycni"),
            apiserver: dir.join("mycni-apiserver"),
            lab: dir.join("mycni-lab"),
        };
        for b in [&bins.agent, &bins.plugin, &bins.apiserver, &bins.lab] {
            anyhow::ensure!(b.exists(), "{} is missing: {hint}", b.display());
        }
        Ok(bins)
    }
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
    /// The upstream NetworkPolicy model (see [`model`]): namespaces x, y,
    /// z with pods a, b, c as Pod objects, servers on 80 and 81, a Service
    /// each. Needs 3 nodes x 3 pods; other labs have anonymous pods.
    pub model: bool,
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
    /// IPv6 only, underlay included: the bridge and the nodes have IPv6
    /// addresses alone ([`API_ADDR6`], [`node_ip6`]), the Nodes an IPv6
    /// podCIDR, the agents an IPv6 `--cluster-cidr`, and the pods cross the
    /// underlay through `vxlan6.1`.
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

    /// The family of the underlay's addresses (the bridge's, the nodes',
    /// the API fixture's, the agents' metrics): IPv6 in an IPv6-only lab,
    /// else IPv4 (a dual-stack lab's IPv6 crosses the IPv4 underlay inside
    /// VXLAN).
    pub fn underlay_family(self) -> IpFamily {
        match self {
            Stack::Ipv6Only => IpFamily::V6,
            Stack::Dual | Stack::Ipv4Only => IpFamily::V4,
        }
    }

    /// How `mycni-lab` spells it (its flags), and how the lab's state
    /// records it for `test`, `status` and `down`.
    pub fn name(self) -> &'static str {
        match self {
            Stack::Dual => "dual-stack",
            Stack::Ipv4Only => "ipv4-only",
            Stack::Ipv6Only => "ipv6-only",
        }
    }

    /// The inverse of [`Stack::name`].
    pub fn from_name(s: &str) -> Option<Stack> {
        [Stack::Dual, Stack::Ipv4Only, Stack::Ipv6Only]
            .into_iter()
            .find(|k| k.name() == s.trim())
    }

    /// The agents' `--cluster-cidr`.
    pub fn cluster_cidr(self) -> String {
        match self {
            Stack::Ipv4Only => CLUSTER_CIDR.to_string(),
            Stack::Ipv6Only => CLUSTER_CIDR6.to_string(),
            Stack::Dual => format!("{CLUSTER_CIDR},{CLUSTER_CIDR6}"),
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

/// The underlay bridge's address: the API fixture and Prometheus listen
/// there, and it is every node's default gateway.
pub const API_ADDR: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 1);
/// [`API_ADDR`] of an IPv6-only lab, in the ULA underlay `fd00:77::/64`
/// (the prefix the agent tests give nodes an IPv6 host address in).
pub const API_ADDR6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x77, 0, 0, 0, 0, 0, 1);
/// The prefix lengths of the underlay's subnets.
pub const UNDERLAY_PREFIX_LEN: u8 = 24;
pub const UNDERLAY6_PREFIX_LEN: u8 = 64;
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

/// Node `i`'s underlay address in an IPv6-only lab: `fd00:77::11` for
/// node 1, as `192.168.77.11` is in the others.
pub fn node_ip6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x77, 0, 0, 0, 0, 0, 0x10 + i as u16)
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
    /// Where `up` records the lab's [`Stack`], so a lab attached later
    /// (`test`, `status`, `down`) finds its addresses without the flags
    /// it was brought up with.
    pub(crate) fn stack_file(&self) -> PathBuf {
        self.root.join("stack")
    }

    /// The underlay bridge's address (see [`API_ADDR`]), of the
    /// underlay's family.
    pub fn api_addr(&self) -> IpAddr {
        match self.stack.underlay_family() {
            IpFamily::V4 => API_ADDR.into(),
            IpFamily::V6 => API_ADDR6.into(),
        }
    }

    /// Node `i`'s underlay address: its agent's host IP and metrics address.
    pub fn node_addr(&self, i: usize) -> IpAddr {
        match self.stack.underlay_family() {
            IpFamily::V4 => node_ip(i).into(),
            IpFamily::V6 => node_ip6(i).into(),
        }
    }

    /// The API fixture's listening address.
    pub fn api_socket(&self) -> SocketAddr {
        SocketAddr::from((self.api_addr(), API_PORT))
    }

    /// Node `i`'s agent's `--metrics-addr` (`[fd00:77::11]:9971` on IPv6).
    pub fn metrics_socket(&self, i: usize) -> SocketAddr {
        SocketAddr::from((self.node_addr(i), METRICS_PORT))
    }

    fn underlay_prefix_len(&self) -> u8 {
        match self.stack.underlay_family() {
            IpFamily::V4 => UNDERLAY_PREFIX_LEN,
            IpFamily::V6 => UNDERLAY6_PREFIX_LEN,
        }
    }

    /// `ip` arguments (in the underlay namespace) that address the bridge.
    /// IPv6 addresses skip duplicate address detection: the lab assigns
    /// every address on the segment itself, and a tentative address could
    /// not be bound (the API fixture, an agent's metrics) for a second or two.
    pub(crate) fn bridge_addr_args(&self) -> Vec<String> {
        self.addr_args(self.api_addr(), "br0")
    }

    /// The two `ip` commands (in node `i`'s namespace) that give `eth0`
    /// its underlay address (before it goes up) and the node its default
    /// route via the bridge (after).
    pub(crate) fn node_underlay_cmds(&self, i: usize) -> [Vec<String>; 2] {
        let mut route: Vec<String> = Vec::new();
        if self.stack.underlay_family() == IpFamily::V6 {
            route.push("-6".into());
        }
        route.extend(["route", "add", "default", "via"].map(String::from));
        route.push(self.api_addr().to_string());
        [self.addr_args(self.node_addr(i), "eth0"), route]
    }

    fn addr_args(&self, addr: IpAddr, dev: &str) -> Vec<String> {
        let mut a: Vec<String> = [
            "addr".to_string(),
            "add".to_string(),
            format!("{addr}/{}", self.underlay_prefix_len()),
            "dev".to_string(),
            dev.to_string(),
        ]
        .into();
        if addr.is_ipv6() {
            a.push("nodad".into());
        }
        a
    }
}

/// One pod of the lab.
#[derive(Debug, Clone)]
pub struct Pod {
    pub node: usize,
    pub index: usize,
    pub ns: String,
    /// Its IPv4 address; unspecified (`0.0.0.0`) in an IPv6-only lab,
    /// whose pods have none: [`Pod::addr`] tells. (Not an `Option`: the
    /// tests of every IPv4 lab read it as it is.)
    pub ip: Ipv4Addr,
    /// Its IPv6 address, in a dual-stack or IPv6-only lab.
    pub ip6: Option<Ipv6Addr>,
    /// Its Kubernetes side, in a model lab and for pods added as a kubelet
    /// would (`Lab::add_kube_pod`); None for the anonymous pods of other
    /// labs.
    pub kube: Option<KubePod>,
}

impl Pod {
    /// The pod's address of family `f`, if it has one.
    pub fn addr(&self, f: IpFamily) -> Option<IpAddr> {
        match f {
            IpFamily::V4 => (!self.ip.is_unspecified()).then_some(IpAddr::V4(self.ip)),
            IpFamily::V6 => self.ip6.map(IpAddr::V6),
        }
    }

    /// Its addresses, IPv4 first, space-separated.
    pub fn addresses(&self) -> String {
        [IpFamily::V4, IpFamily::V6]
            .into_iter()
            .filter_map(|f| self.addr(f))
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// A pod's short name in tables: its Kubernetes name (`x/a`), else
/// `n<node>p<index>`.
pub fn pod_label(p: &Pod) -> String {
    match &p.kube {
        Some(k) => k.label(),
        None => format!("n{}p{}", p.node, p.index),
    }
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
        // IPv6-only: no IPv4 range anywhere, for the Nodes or the agents.
        assert_eq!(Stack::Ipv6Only.pod_cidrs(3), ["fd00:10:244:3::/64"]);
        assert_eq!(Stack::Ipv6Only.cluster_cidr(), "fd00:10:244::/56");
        for s in [Stack::Dual, Stack::Ipv4Only, Stack::Ipv6Only] {
            assert_eq!(Stack::from_name(s.name()), Some(s));
        }
        assert_eq!(Stack::from_name("ipv6"), None);
        let pod = Pod {
            node: 1,
            index: 1,
            ns: "x".into(),
            ip: Ipv4Addr::new(10, 244, 1, 1),
            ip6: None,
            kube: None,
        };
        assert_eq!(pod.addr(IpFamily::V6), None);
        assert_eq!(pod.addr(IpFamily::V4), Some(IpAddr::from([10, 244, 1, 1])));
        assert_eq!(pod.addresses(), "10.244.1.1");
        let pod6 = Pod {
            ip: Ipv4Addr::UNSPECIFIED,
            ip6: "fd00:10:244:1::2".parse().ok(),
            ..pod
        };
        assert_eq!(pod6.addr(IpFamily::V4), None);
        assert_eq!(pod6.addresses(), "fd00:10:244:1::2");
    }

    fn spec(stack: Stack) -> Spec {
        let bin = PathBuf::from("/nonexistent");
        Spec {
            prefix: "t".into(),
            nodes: 3,
            pods: 2,
            root: bin.clone(),
            bins: Bins {
                agent: bin.clone(),
                plugin: bin.clone(),
                apiserver: bin.clone(),
                lab: bin,
            },
            agent_args: vec![],
            in_process_api: false,
            stack,
            model: false,
        }
    }

    fn words(v: &[&str]) -> Vec<String> {
        v.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn the_underlay_of_an_ipv6_only_lab_has_ipv6_addresses_only() {
        let s = spec(Stack::Ipv6Only);
        assert_eq!(s.api_addr().to_string(), "fd00:77::1");
        assert_eq!(s.api_socket().to_string(), "[fd00:77::1]:6443");
        assert_eq!(s.node_addr(2).to_string(), "fd00:77::12");
        assert_eq!(s.metrics_socket(3).to_string(), "[fd00:77::13]:9971");
        assert_eq!(
            s.bridge_addr_args(),
            words(&["addr", "add", "fd00:77::1/64", "dev", "br0", "nodad"])
        );
        assert_eq!(
            s.node_underlay_cmds(1),
            [
                words(&["addr", "add", "fd00:77::11/64", "dev", "eth0", "nodad"]),
                words(&["-6", "route", "add", "default", "via", "fd00:77::1"]),
            ]
        );
        // Node 10 and beyond stay inside the /64 and apart from the bridge.
        assert_eq!(node_ip6(10).to_string(), "fd00:77::1a");
        // Nothing IPv4 on the underlay.
        for i in 1..=s.nodes {
            let cmds = s.node_underlay_cmds(i).concat().join(" ");
            assert!(
                !cmds.contains("192.168.") && !cmds.contains("/24"),
                "{cmds}"
            );
        }
    }

    #[test]
    fn dual_stack_and_ipv4_only_labs_keep_their_ipv4_underlay() {
        for stack in [Stack::Dual, Stack::Ipv4Only] {
            let s = spec(stack);
            assert_eq!(s.api_socket().to_string(), "192.168.77.1:6443");
            assert_eq!(s.metrics_socket(2).to_string(), "192.168.77.12:9971");
            assert_eq!(
                s.bridge_addr_args(),
                words(&["addr", "add", "192.168.77.1/24", "dev", "br0"])
            );
            assert_eq!(
                s.node_underlay_cmds(3),
                [
                    words(&["addr", "add", "192.168.77.13/24", "dev", "eth0"]),
                    words(&["route", "add", "default", "via", "192.168.77.1"]),
                ]
            );
        }
    }
}
