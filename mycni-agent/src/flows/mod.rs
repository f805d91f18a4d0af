//! The flows room: every connection and drop the node sees, with its pods,
//! policy and reason, kept in a bounded history and served live.
//!
//! Sources only observe and send; they never block the datapath or the
//! loop:
//! - the tc programs and the `kfree_skb` tracepoint write [`FlowEvent`]s
//!   into the ring `mycni_flows`, read by `ring.rs`;
//! - nftables logs its verdicts (policy allow and drop, the underlay
//!   filter) to an NFLOG group, read by `nflog.rs`.
//!
//! Each sends [`Observation`]s into one bounded channel ([`Sink`]); a full
//! channel drops the observation and counts it (`lost`), as a full ring
//! does in the kernel. The room enriches them (`enrich.rs`: addresses to
//! pods, nodes or the world; a policy verdict to the policies and rule that
//! decided it), keeps the last ones (`store.rs`) and serves them
//! (`/flows` on the metrics server; `mycni-agent flows`).

pub mod cli;
pub mod enrich;
pub mod events;
pub mod explain;
mod host;
pub mod nflog;
pub mod record;
pub mod room;
pub mod store;
#[cfg(test)]
mod tests;

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use mycni_common::flow::FlowEvent;
use tokio::sync::mpsc;

use crate::verdict::NftVerdict;

pub mod kdrop_names;

/// What a source saw, before enrichment.
#[derive(Debug, Clone)]
pub enum Observation {
    /// An event of the ring, with its kernel timestamp turned to wall time.
    Datapath { at: SystemTime, event: FlowEvent },
    /// A verdict nftables logged.
    Nft(NftLog),
}

/// The reader of the programs' ring (`mycni_flows`).
pub mod ring;

/// One packet nftables logged to the agent's NFLOG group: the rule's
/// meaning (from its prefix) and the packet's headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftLog {
    pub at: SystemTime,
    pub verdict: NftVerdict,
    pub src: IpAddr,
    pub dst: IpAddr,
    /// Host byte order; 0 without ports.
    pub sport: u16,
    pub dport: u16,
    /// IP protocol number.
    pub proto: u8,
    pub tcp_flags: u8,
    /// 0 when the hook has none.
    pub in_ifindex: u32,
    pub out_ifindex: u32,
    /// Packets this log stands for: 1 as logged, more once the reader
    /// folded a flow's repeats into it (`nflog::Fold`).
    pub count: u32,
}

/// Where sources send what they saw.
#[derive(Clone)]
pub struct Sink {
    tx: mpsc::Sender<Observation>,
    lost: Arc<AtomicU64>,
}

/// The channel's capacity: a second's worth at a high event rate, so a
/// slow pass of the room loses nothing.
pub const SINK_CAPACITY: usize = 65_536;

impl Sink {
    /// A sink and the receiving end the room reads.
    pub fn new(capacity: usize) -> (Self, mpsc::Receiver<Observation>) {
        let (tx, rx) = mpsc::channel(capacity);
        let sink = Sink {
            tx,
            lost: Arc::default(),
        };
        (sink, rx)
    }

    /// Hands `o` to the room; never waits. A full or closed channel counts
    /// it as lost.
    pub fn send(&self, o: Observation) {
        if self.tx.try_send(o).is_err() {
            self.lost.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Observations dropped because the room was behind.
    pub fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }
}

/// What the agent starts the room with.
pub struct Start {
    pub node: String,
    /// `--flow-history`, `--flow-pod-series`.
    pub history: usize,
    pub pod_series: usize,
    /// Where the programs' maps are pinned, when the fast path is loaded
    /// and `--flow-events` is on: the ring is read from there.
    pub ring_pins: Option<std::path::PathBuf>,
}

/// The other nodes' own addresses, by address: what records name
/// `reserved:remote-node` with the node's name.
pub(crate) type NodeAddrs = std::collections::HashMap<IpAddr, Arc<str>>;

/// The Node objects as the agent's watch last saw them.
pub type Nodes = Arc<Vec<Arc<k8s_openapi::api::core::v1::Node>>>;

/// The addresses a record may carry for another node's own traffic: its
/// host addresses (the annotations mycni publishes, IPv4 and IPv6) and
/// the first address of each podCIDR (`vxlan.1` / `vxlan6.1`, the source
/// of a node's own packets to pods over the overlay). Whatever does not
/// parse is left out: a name is a label here, not a decision.
pub(crate) fn node_addrs(nodes: &[Arc<k8s_openapi::api::core::v1::Node>], own: &str) -> NodeAddrs {
    use mycni_common::contract::{ANNOTATION_HOST_IP, ANNOTATION_HOST_IP6};
    use mycni_common::net::Cidr;
    let mut out = NodeAddrs::new();
    for n in nodes {
        let Some(name) = n.metadata.name.as_deref().filter(|m| *m != own) else {
            continue;
        };
        let name: Arc<str> = name.into();
        let annotations = n.metadata.annotations.iter().flatten();
        let hosts = annotations
            .filter(|(k, _)| *k == ANNOTATION_HOST_IP || *k == ANNOTATION_HOST_IP6)
            .filter_map(|(_, v)| v.parse::<IpAddr>().ok());
        let spec = n.spec.as_ref();
        let cidrs = spec
            .and_then(|s| s.pod_cidrs.clone())
            .unwrap_or_default()
            .into_iter()
            .chain(spec.and_then(|s| s.pod_cidr.clone()))
            .filter_map(|c| Cidr::<IpAddr>::parse_network(&c).ok())
            .map(|c| c.network());
        for ip in hosts.chain(cidrs) {
            out.insert(ip, name.clone());
        }
    }
    out
}

/// Starts the flows room for the agent: the store, `/flows`, its metrics,
/// Events, and the sources this node has.
pub fn start(
    s: Start,
    metrics: &Arc<crate::metrics::Metrics>,
    cluster: tokio::sync::watch::Receiver<Arc<crate::cluster::Cluster>>,
    nodes: tokio::sync::watch::Receiver<Nodes>,
    client: kube::Client,
) -> tokio::task::JoinHandle<()> {
    let node = s.node.as_str();
    let settings = room::Settings {
        node: s.node.clone(),
        history: s.history,
        pod_series: s.pod_series,
    };
    // Names by the running kernel's numbering; without its BTF, numbers.
    let reasons = kdrop_names::DropReasons::from_kernel().unwrap_or_else(|e| {
        tracing::warn!(error = %e, "cannot read the kernel's drop reasons; flows show their numbers");
        kdrop_names::DropReasons::default()
    });
    let names = Arc::new(room::KernelNames::new(reasons));
    let counts = Arc::new(events::EventCounts::default());
    let events = Some((events::spawn(client, node, counts.clone()), counts));
    let inputs = room::Inputs {
        cluster,
        nodes,
        host_ips: host::addresses(),
        names,
        events,
    };
    let (sink, _store, task) = room::spawn(settings, metrics, inputs);
    // The programs' ring exists only where they are loaded.
    if let Some(pins) = &s.ring_pins
        && let Err(e) = ring::spawn(pins, sink.clone())
    {
        tracing::warn!(error = %e, "the datapath's flow events will not reach flows");
    }
    let counts = metrics.collector::<room::FlowMetrics>().nflog_counts();
    if let Err(e) = nflog::spawn(sink, counts) {
        tracing::warn!(error = %e, "nftables verdicts will not reach flows");
    }
    task
}
