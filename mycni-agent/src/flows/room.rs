//! The room's task: observations in, records kept, `/flows` served, and
//! its own metrics (drops per local pod, bounded; what the room lost).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::stream::BoxStream;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::enrich::{Directory, Names, Record, What};
use super::events::{EventCounts, Limiter, event_for};
use super::kdrop_names::DropReasons;
use super::nflog::NflogCounts;
use super::store::{Filter, Store, json_line};
use super::{NftVerdict, SINK_CAPACITY, Sink};
use crate::cluster::Cluster;
use crate::metrics::{Feed, Metrics, counter, gauge};
use crate::verdict::Direction;

/// How the room is set up.
#[derive(Debug, Clone)]
pub struct Settings {
    pub node: String,
    /// Records held for `/flows` (the oldest goes first).
    pub history: usize,
    /// Local pods with a series of their own in `mycni_flow_pod_drops_total`;
    /// drops of further pods count under `pod="_other"`.
    pub pod_series: usize,
}

/// Where admitted policy-drop Events go (the publishing task).
pub(crate) type EventSender = tokio::sync::mpsc::Sender<(
    kube::runtime::events::Event,
    k8s_openapi::api::core::v1::ObjectReference,
)>;

/// (namespace, pod, direction, reason): one series of
/// `mycni_flow_pod_drops_total`.
type PodDrop = (String, String, &'static str, String);

/// What the room's metrics read.
#[derive(Default)]
pub(crate) struct FlowMetrics {
    records: AtomicU64,
    lost: Mutex<Option<Sink>>,
    held: Mutex<Option<Arc<Store>>>,
    /// (namespace, pod, direction, reason) -> packets.
    pod_drops: Mutex<BTreeMap<PodDrop, u64>>,
    pods_with_series: Mutex<HashSet<(String, String)>>,
    pod_series: AtomicU64,
    events: Mutex<Option<Arc<EventCounts>>>,
    nflog: Arc<NflogCounts>,
}

impl std::fmt::Debug for FlowMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FlowMetrics")
    }
}

impl FlowMetrics {
    /// What the NFLOG reader counts, exported here.
    pub(crate) fn nflog_counts(&self) -> Arc<NflogCounts> {
        self.nflog.clone()
    }

    /// Counts a drop against the local pod it concerns, within the bound
    /// on series.
    fn count_drop(&self, node: &str, r: &Record, line_reason: &str, direction: &'static str) {
        let local = |w: &super::enrich::Who| {
            w.pod()
                .filter(|p| p.node.as_deref() == Some(node))
                .map(|p| (p.key.namespace.clone(), p.key.name.clone()))
        };
        // The isolated side for policy drops; else whichever end is ours.
        let who = match r.isolated() {
            Some((isolated, other, ..)) => local(isolated).or_else(|| local(other)),
            None => local(&r.to).or_else(|| local(&r.from)),
        };
        let Some(mut who) = who else { return };
        let max = self.pod_series.load(Ordering::Relaxed) as usize;
        if let Ok(mut seen) = self.pods_with_series.lock()
            && !seen.contains(&who)
        {
            if seen.len() < max {
                seen.insert(who.clone());
            } else {
                who = ("_other".into(), "_other".into());
            }
        }
        if let Ok(mut d) = self.pod_drops.lock() {
            *d.entry((who.0, who.1, direction, line_reason.to_string()))
                .or_default() += u64::from(r.count.max(1));
        }
    }
}

impl Collector for FlowMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        counter(
            &mut e,
            "mycni_flow_records",
            "Flow records the flows room kept (datapath events and nftables verdicts).",
            self.records.load(Ordering::Relaxed),
        )?;
        let lost = self
            .lost
            .lock()
            .ok()
            .and_then(|s| s.as_ref().map(Sink::lost))
            .unwrap_or(0);
        counter(
            &mut e,
            "mycni_flow_observations_lost",
            "Observations the flows room dropped because it was behind (its channel was full).",
            lost,
        )?;
        let held = self
            .held
            .lock()
            .ok()
            .and_then(|s| s.as_ref().map(|s| s.held()))
            .unwrap_or(0);
        gauge(
            &mut e,
            "mycni_flow_history_records",
            "Flow records held for /flows.",
            held as u64,
        )?;
        if let Some(c) = self.events.lock().ok().and_then(|e| e.clone()) {
            let mut enc = e.encode_descriptor(
                "mycni_flow_kube_events",
                "Policy drops reported as Kubernetes Events: published, rate_limited (one per pair every 2 minutes, one a second per node), failed.",
                None,
                MetricType::Counter,
            )?;
            for (outcome, n) in [
                ("published", &c.published),
                ("rate_limited", &c.rate_limited),
                ("failed", &c.failed),
            ] {
                ConstCounter::new(n.load(Ordering::Relaxed))
                    .encode(enc.encode_family(&[("outcome", outcome)])?)?;
            }
        }
        counter(
            &mut e,
            "mycni_flow_nflog_unreadable",
            "NFLOG messages from the agent's tables that could not be read.",
            self.nflog.unreadable.load(Ordering::Relaxed),
        )?;
        counter(
            &mut e,
            "mycni_flow_nflog_overflows",
            "Times the NFLOG socket's buffer overflowed (the kernel dropped verdict logs).",
            self.nflog.overflows.load(Ordering::Relaxed),
        )?;
        let drops = self.pod_drops.lock().map(|d| d.clone()).unwrap_or_default();
        let mut enc = e.encode_descriptor(
            "mycni_flow_pod_drops",
            "Packets dropped to or from a pod of this node, by direction and reason (policy drops: the isolated pod); pods beyond the configured bound count under pod=\"_other\".",
            None,
            MetricType::Counter,
        )?;
        for ((ns, pod, dir, reason), n) in drops {
            let labels = [
                ("namespace", ns),
                ("pod", pod),
                ("direction", dir.to_string()),
                ("reason", reason),
            ];
            ConstCounter::new(n).encode(enc.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// `/flows` over the store.
pub struct Served(pub Arc<Store>);

impl Feed for Served {
    fn open(&self, query: &str) -> Result<(String, Option<BoxStream<'static, String>>), String> {
        let f = Filter::from_query(query)?;
        let held: String = self.0.matching(&f).iter().map(json_line).collect();
        let live = f.follow.then(|| self.0.follow(f));
        Ok((held, live))
    }

    fn page(&self) -> &'static str {
        include_str!("map.html")
    }
}

/// Starts the room: returns where sources send, and the store.
/// How often, at most, the other nodes' addresses are read again.
const NODES_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// What the room reads from the rest of the agent and the node.
pub struct Inputs {
    /// The cluster the policy room (or the cluster view) published.
    pub cluster: watch::Receiver<Arc<Cluster>>,
    /// The Node objects, after each overlay pass that read them.
    pub nodes: watch::Receiver<super::Nodes>,
    /// This host's own addresses.
    pub host_ips: HashSet<IpAddr>,
    pub names: Arc<dyn Names + Send + Sync>,
    /// Where policy drops become Kubernetes Events, and their counts.
    pub events: Option<(EventSender, Arc<EventCounts>)>,
}

pub fn spawn(
    settings: Settings,
    metrics: &Arc<Metrics>,
    inputs: Inputs,
) -> (Sink, Arc<Store>, JoinHandle<()>) {
    let Inputs {
        mut cluster,
        mut nodes,
        host_ips,
        names,
        events,
    } = inputs;
    let (sink, mut rx) = Sink::new(SINK_CAPACITY);
    let store = Arc::new(Store::new(
        settings.node.clone(),
        settings.history,
        names.clone(),
    ));
    let m = metrics.collector::<FlowMetrics>();
    m.pod_series
        .store(settings.pod_series as u64, Ordering::Relaxed);
    if let Ok(mut l) = m.lost.lock() {
        *l = Some(sink.clone());
    }
    if let Ok(mut h) = m.held.lock() {
        *h = Some(store.clone());
    }
    if let (Some((_, c)), Ok(mut e)) = (&events, m.events.lock()) {
        *e = Some(c.clone());
    }
    metrics.register_feed(Arc::new(Served(store.clone())));
    let (view, held) = (cluster.clone(), store.clone());
    metrics.register_inspector(
        "explain",
        Arc::new(move |what: &str| {
            let (src, dst, port, protocol) = super::explain::parse(what)?;
            let c = view.borrow().clone();
            let e = super::explain::explain(&c, Some(&held), &src, &dst, (port, protocol))?;
            serde_json::to_string(&e).map_err(|e| e.to_string())
        }),
    );
    let kept = store.clone();
    let task = tokio::spawn(async move {
        let mut addrs = Arc::new(super::node_addrs(
            &nodes.borrow_and_update(),
            &settings.node,
        ));
        let directory = |cluster: &mut watch::Receiver<Arc<Cluster>>, addrs: &Arc<_>| {
            Directory::new(cluster.borrow_and_update().clone(), host_ips.clone())
                .with_nodes(Arc::clone(addrs))
        };
        let mut dir = directory(&mut cluster, &addrs);
        let (mut policy_gone, mut nodes_gone, mut nodes_dirty) = (false, false, false);
        // Node objects change far more often than their addresses (status
        // updates): their addresses are read again at most once a second,
        // in this task, off the overlay's pass.
        let mut nodes_tick = tokio::time::interval(NODES_EVERY);
        nodes_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut batch = Vec::with_capacity(256);
        let mut limiter = Limiter::default();
        loop {
            tokio::select! {
                n = rx.recv_many(&mut batch, 256) => {
                    if n == 0 {
                        return;
                    }
                    for o in batch.drain(..) {
                        let r = dir.record(o);
                        observe(&m, &settings.node, &r, names.as_ref());
                        if let Some((tx, counts)) = &events {
                            report(&mut limiter, tx, counts, &r);
                        }
                        kept.push(r);
                    }
                }
                changed = cluster.changed(), if !policy_gone => {
                    // No policy room (enforcement off): the cluster stays
                    // as it is, and records go on.
                    policy_gone = changed.is_err();
                    dir = directory(&mut cluster, &addrs);
                }
                changed = nodes.changed(), if !nodes_gone => {
                    nodes_gone = changed.is_err();
                    nodes_dirty = !nodes_gone;
                }
                _ = nodes_tick.tick(), if nodes_dirty => {
                    nodes_dirty = false;
                    let now = super::node_addrs(&nodes.borrow_and_update(), &settings.node);
                    if now != *addrs {
                        addrs = Arc::new(now);
                        dir.set_nodes(Arc::clone(&addrs));
                    }
                }
            }
        }
    });
    (sink, store, task)
}

/// A policy drop becomes an Event if the limiter admits it.
fn report(limiter: &mut Limiter, tx: &EventSender, counts: &EventCounts, r: &Record) {
    let Some(ev) = event_for(r) else { return };
    if !limiter.admit(r.src, r.dst, std::time::Instant::now()) || tx.try_send(ev).is_err() {
        counts.rate_limited.fetch_add(1, Ordering::Relaxed);
    }
}

fn observe(m: &FlowMetrics, node: &str, r: &Record, names: &dyn Names) {
    m.records.fetch_add(1, Ordering::Relaxed);
    if !r.is_drop() {
        return;
    }
    let (reason, direction) = match &r.what {
        What::Nft {
            verdict: NftVerdict::PolicyDrop { direction, reason },
            ..
        } => (
            super::enrich::policy_reason(*reason).to_string(),
            match direction {
                Direction::Egress => "egress",
                Direction::Ingress => "ingress",
            },
        ),
        What::Nft { .. } => ("UNDERLAY_NOT_PEER".to_string(), "ingress"),
        What::Datapath { reason, .. } => (names.drop_reason(*reason), "ingress"),
    };
    m.count_drop(node, r, &reason, direction);
}

/// Names from the running kernel: drop reasons from its BTF (read once),
/// interface names asked once per ifindex.
#[derive(Default)]
pub struct KernelNames {
    pub reasons: DropReasons,
    ifnames: Mutex<HashMap<u32, String>>,
}

impl KernelNames {
    pub fn new(reasons: DropReasons) -> Self {
        KernelNames {
            reasons,
            ifnames: Mutex::default(),
        }
    }
}

impl Names for KernelNames {
    fn drop_reason(&self, n: u16) -> String {
        self.reasons.name(n)
    }

    fn interface(&self, ifindex: u32) -> String {
        if let Ok(c) = self.ifnames.lock()
            && let Some(n) = c.get(&ifindex)
        {
            return n.clone();
        }
        let mut buf = [0u8; libc::IF_NAMESIZE];
        // SAFETY: buf holds IF_NAMESIZE bytes, as if_indextoname requires.
        let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr().cast()) };
        if p.is_null() {
            return String::new();
        }
        let len = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
        let name = String::from_utf8_lossy(&buf[..len]).into_owned();
        if let Ok(mut c) = self.ifnames.lock() {
            c.insert(ifindex, name.clone());
        }
        name
    }
}
