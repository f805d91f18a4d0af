//! The local multi-node lab: an underlay bridge in its own namespace, N node
//! namespaces each running the real `mycni-agent` against the Kubernetes
//! API fixture, and P pods per node made by the real plugin binary from the
//! conflist the agent wrote. Used by `cargo xtask lab` and the lab tests.
//!
//! Its parts: `setup` (bringing the lab up and down, the agents), `pods`
//! (the plugin as the runtime runs it, and the pods' echo server),
//! `matrix` (the connectivity matrix), `datapath` (the agents' datapath,
//! their counters and the fast share), `daemon` (processes in namespaces).

use std::net::Ipv4Addr;
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
    Counters, NodeDatapath, PathShare, PeerRoutes, VXLAN_DEV, describe_node, parse_counters,
};
pub use matrix::MatrixRun;
pub use pods::{PROBE_BULK_FAILED, ProbeError, echo_server, http_get, tcp_probe};
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
}

/// A pod's short name in tables: `n<node>p<index>`.
pub fn pod_label(p: &Pod) -> String {
    format!("n{}p{}", p.node, p.index)
}

pub struct Lab {
    pub spec: Spec,
    pub api: Option<ApiServer>,
}
