//! The agent's metrics registry, its probes' state and the rooms' collectors
//! (the HTTP API that serves them is `crate::api`).
//!
//! A sink: this module imports no subsystem. The loop's own gauges and
//! counters stay plain atomics that the agent's modules bump without
//! knowing about Prometheus; what a subsystem exports beyond them it
//! exports through its own collector, registered with
//! [`Metrics::collector`] (the datapath's per-path counters, the
//! anti-spoofing table's drops), which reads its own state at scrape. A
//! scrape snapshots the atomics into a `prometheus-client` registry
//! together with those collectors and the histograms, which only exist
//! here. `/metrics` answers in OpenMetrics when the scraper offers it
//! (Prometheus does) and in the 0.0.4 text format otherwise (curl, the lab,
//! `promtool check metrics`, which only parses the latter).

use std::any::{Any, TypeId};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::stream::BoxStream;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, prometheus_text, text};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

mod format;
mod liveness;
mod netlink_ops;

pub use format::Format;
pub use liveness::{DEFAULT_STALE_AFTER, Liveness};

use netlink_ops::NETLINK_OPS;
pub(crate) use netlink_ops::{NetlinkOp, netlink_timed, observe_netlink};

/// Reconcile passes: ~100 µs for an event pass on a small cluster, seconds
/// for a full pass over thousands of peers on a loaded node.
pub(crate) const RECONCILE_BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// One netlink request: tens of µs when the kernel answers at once, up to a
/// second when RTNL is contended or a dump is large.
pub(crate) const NETLINK_BUCKETS: [f64; 16] = [
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0,
];

/// Node event to kernel: a pass plus the wait for the loop to pick the event
/// up; tens of seconds mean passes keep failing and the event waits for one
/// that succeeds.
pub(crate) const EVENT_TO_KERNEL_BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

pub struct Metrics {
    pub reconcile_runs: AtomicU64,
    pub reconcile_errors: AtomicU64,
    pub ready: AtomicBool,
    pub ready_detail: Mutex<String>,
    pub api_reachable: AtomicBool,
    /// The fast path is loaded and maintained.
    pub datapath_ebpf: AtomicBool,
    pub ebpf_load_failures: AtomicU64,
    reconcile_duration: Histogram,
    event_to_kernel: Histogram,
    /// When the oldest Node event that no finished pass has applied yet
    /// arrived. One stamp, not one per event: a pass applies all of them at
    /// once, and the oldest is the latency that matters.
    pending_event: Arc<Mutex<Option<Instant>>>,
    /// What `/healthz` answers from.
    pub liveness: Liveness,
    /// The subsystems' collectors, in the order they were first asked for.
    collectors: Mutex<Vec<Registered>>,
    /// What `/inspect/<room>/<what>` asks, by room.
    inspectors: Mutex<BTreeMap<&'static str, Inspector>>,
    /// What `/flows` reads, once the flows room runs.
    feed: Mutex<Option<Arc<dyn Feed>>>,
}

/// A room's newline-delimited JSON at `/flows` (and what the page there
/// draws).
pub trait Feed: Send + Sync {
    /// The lines held that match `query` (a URL query: the room's
    /// filters), and if it asks to follow, the stream of new ones; or why
    /// the query is wrong.
    fn open(&self, query: &str) -> Result<(String, Option<BoxStream<'static, String>>), String>;
    /// The page drawing the feed (`/flows/map`): HTML that reads `/flows`.
    fn page(&self) -> &'static str;
}

/// A room's answer to `/inspect/<room>/<what>`: JSON, or why there is
/// none (not found). It may block (run `nft`): the server calls it off
/// the async workers.
pub(crate) type Inspector = Arc<dyn Fn(&str) -> Result<String, String> + Send + Sync>;

/// A subsystem's collector: typed for the subsystem that owns it (which
/// finds it again by its type), untyped for the scrape.
#[derive(Debug)]
struct Registered {
    id: TypeId,
    typed: Arc<dyn Any + Send + Sync>,
    collector: Arc<dyn Collector>,
}

/// A registered collector lent to one scrape's registry (which wants to own
/// its collectors).
#[derive(Debug)]
struct Lent(Arc<dyn Collector>);

impl Collector for Lent {
    fn encode(&self, e: DescriptorEncoder) -> std::fmt::Result {
        self.0.encode(e)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            reconcile_runs: AtomicU64::default(),
            reconcile_errors: AtomicU64::default(),
            ready: AtomicBool::default(),
            ready_detail: Mutex::default(),
            api_reachable: AtomicBool::default(),
            datapath_ebpf: AtomicBool::default(),
            ebpf_load_failures: AtomicU64::default(),
            reconcile_duration: Histogram::new(RECONCILE_BUCKETS),
            event_to_kernel: Histogram::new(EVENT_TO_KERNEL_BUCKETS),
            pending_event: Arc::default(),
            liveness: Liveness::default(),
            collectors: Mutex::default(),
            inspectors: Mutex::default(),
            feed: Mutex::default(),
        }
    }
}

/// Times one reconcile pass into `mycni_reconcile_duration_seconds` when
/// dropped, so a pass that returns early through `?` is timed too.
#[derive(Debug)]
#[must_use = "the pass is timed until this is dropped; bind it with `let _timer`"]
pub(crate) struct ReconcileTimer {
    started: Instant,
    histogram: Histogram,
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        self.histogram.observe(self.started.elapsed().as_secs_f64());
    }
}

/// The Node events a pass is about to apply (see
/// [`Metrics::take_node_events`]). Dropped without [`NodeEvents::applied`]
/// (the pass failed), the events go back to wait for the next pass, so
/// their latency counts until one succeeds.
#[derive(Debug)]
#[must_use = "call .applied() once the pass succeeded"]
pub(crate) struct NodeEvents {
    oldest: Option<Instant>,
    pending: Arc<Mutex<Option<Instant>>>,
    histogram: Histogram,
}

impl NodeEvents {
    /// The pass that read these events finished and the kernel holds them.
    pub fn applied(mut self) {
        if let Some(t) = self.oldest.take() {
            self.histogram.observe(t.elapsed().as_secs_f64());
        }
    }
}

impl Drop for NodeEvents {
    fn drop(&mut self) {
        if let Some(t) = self.oldest.take()
            && let Ok(mut p) = self.pending.lock()
        {
            *p = Some(p.map_or(t, |q| q.min(t)));
        }
    }
}

impl Metrics {
    pub(crate) fn set_not_ready(&self, why: impl Into<String>) {
        self.ready.store(false, Ordering::Relaxed);
        if let Ok(mut d) = self.ready_detail.lock() {
            *d = why.into();
        }
    }

    pub(crate) fn set_ready(&self, detail: impl Into<String>) {
        self.ready.store(true, Ordering::Relaxed);
        if let Ok(mut d) = self.ready_detail.lock() {
            *d = detail.into();
        }
    }

    pub fn detail(&self) -> String {
        self.ready_detail
            .lock()
            .map(|d| d.clone())
            .unwrap_or_default()
    }

    /// Starts timing a reconcile pass; the time is recorded when the
    /// returned timer is dropped.
    pub(crate) fn reconcile_started(&self) -> ReconcileTimer {
        ReconcileTimer {
            started: Instant::now(),
            histogram: self.reconcile_duration.clone(),
        }
    }

    /// A Node event arrived from the watch (after the reflector stored it).
    pub(crate) fn node_event(&self) {
        if let Ok(mut p) = self.pending_event.lock() {
            p.get_or_insert_with(Instant::now);
        }
    }

    /// Takes the events that arrived so far. Call it before reading the Node
    /// cache for a pass: every event stamped by then is in what the pass
    /// reads, and none stamped later is claimed by it.
    pub(crate) fn take_node_events(&self) -> NodeEvents {
        NodeEvents {
            oldest: self.pending_event.lock().ok().and_then(|mut p| p.take()),
            pending: self.pending_event.clone(),
            histogram: self.event_to_kernel.clone(),
        }
    }

    /// The collector of type `T`, registered (made with `T::default()`) the
    /// first time any caller asks for it: a subsystem asks at start and
    /// again wherever it updates what the collector reads, and they share
    /// one. Its series come after the loop's own, in the order of first
    /// registration, at every scrape from then on.
    pub(crate) fn collector<T: Collector + Default>(&self) -> Arc<T> {
        let id = TypeId::of::<T>();
        let mut registered = self
            .collectors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(c) = registered
            .iter()
            .find(|r| r.id == id)
            .and_then(|r| r.typed.clone().downcast::<T>().ok())
        {
            return c;
        }
        let c = Arc::new(T::default());
        registered.push(Registered {
            id,
            typed: c.clone(),
            collector: c.clone(),
        });
        c
    }

    /// Serves `/inspect/<room>/<what>` with `f` from now on.
    pub(crate) fn register_inspector(&self, room: &'static str, f: Inspector) {
        if let Ok(mut i) = self.inspectors.lock() {
            i.insert(room, f);
        }
    }

    /// Serves `/flows` from `feed` from now on.
    pub fn register_feed(&self, feed: Arc<dyn Feed>) {
        if let Ok(mut f) = self.feed.lock() {
            *f = Some(feed);
        }
    }

    pub fn feed(&self) -> Option<Arc<dyn Feed>> {
        self.feed.lock().ok()?.clone()
    }

    /// `room`'s answer about `what`; None when no such room answers.
    pub fn inspect(&self, room: &str, what: &str) -> Option<Result<String, String>> {
        let f = self.inspectors.lock().ok()?.get(room).cloned()?;
        Some(f(what))
    }

    /// The exposition in `format`, for one scrape.
    pub fn render(&self, format: Format) -> Result<String, std::fmt::Error> {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self.snapshot()));
        let lent: Vec<Arc<dyn Collector>> = self
            .collectors
            .lock()
            .map(|r| r.iter().map(|r| r.collector.clone()).collect())
            .unwrap_or_default();
        for c in lent {
            registry.register_collector(Box::new(Lent(c)));
        }
        registry.register_with_unit(
            "mycni_reconcile_duration",
            "Time spent in reconcile passes, failed ones included",
            Unit::Seconds,
            self.reconcile_duration.clone(),
        );
        registry.register_with_unit(
            "mycni_node_event_to_kernel",
            "From a Node watch event arriving to the end of the first reconcile pass that applied it to the kernel and the eBPF maps",
            Unit::Seconds,
            self.event_to_kernel.clone(),
        );
        registry.register_with_unit(
            "mycni_netlink_op_duration",
            "Netlink requests the reconcile loop makes, by operation",
            Unit::Seconds,
            NETLINK_OPS.clone(),
        );
        let mut out = String::new();
        match format {
            Format::OpenMetrics => text::encode(&mut out, &registry)?,
            Format::Prometheus => prometheus_text::encode(&mut out, &registry)?,
        }
        Ok(out)
    }

    fn snapshot(&self) -> Snapshot {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Snapshot {
            reconcile_runs: load(&self.reconcile_runs),
            reconcile_errors: load(&self.reconcile_errors),
            ready: self.ready.load(Ordering::Relaxed),
            api_reachable: self.api_reachable.load(Ordering::Relaxed),
            datapath_ebpf: self.datapath_ebpf.load(Ordering::Relaxed),
            ebpf_load_failures: load(&self.ebpf_load_failures),
        }
    }
}

/// What one scrape reads of the atomics, encoded in a fixed order (a
/// `Family` would order its series by hash, differently on every agent).
#[derive(Debug)]
struct Snapshot {
    reconcile_runs: u64,
    reconcile_errors: u64,
    ready: bool,
    api_reachable: bool,
    datapath_ebpf: bool,
    ebpf_load_failures: u64,
}

/// One gauge sample without labels; for collectors.
pub fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    ConstGauge::new(v).encode(e.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

/// One counter sample without labels; for collectors. `name` without
/// `_total`: the encoders add it.
pub fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    ConstCounter::new(v).encode(e.encode_descriptor(name, help, None, MetricType::Counter)?)
}

impl Collector for Snapshot {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let e = &mut e;
        counter(
            e,
            "mycni_reconcile_runs",
            "Reconcile passes run.",
            self.reconcile_runs,
        )?;
        counter(
            e,
            "mycni_reconcile_errors",
            "Reconcile passes with at least one failed kernel update or read.",
            self.reconcile_errors,
        )?;
        gauge(
            e,
            "mycni_ready",
            "1 when the overlay is up and the CNI config written.",
            u64::from(self.ready),
        )?;
        gauge(
            e,
            "mycni_api_reachable",
            "1 while the Kubernetes API watch is healthy.",
            u64::from(self.api_reachable),
        )?;
        gauge(
            e,
            "mycni_datapath_ebpf",
            "1 while the eBPF fast path runs; 0 on the kernel path (see /readyz for why).",
            u64::from(self.datapath_ebpf),
        )?;
        counter(
            e,
            "mycni_ebpf_load_failures",
            "Failed loads of the eBPF programs (the node then runs the kernel path).",
            self.ebpf_load_failures,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn existing_series_keep_their_names_and_lines() {
        let m = Metrics::default();
        m.reconcile_runs.store(7, Ordering::Relaxed);
        m.ebpf_load_failures.store(1, Ordering::Relaxed);
        m.set_ready("up");
        for format in [Format::Prometheus, Format::OpenMetrics] {
            let t = m.render(format).expect("render");
            for line in [
                "mycni_reconcile_runs_total 7",
                "mycni_reconcile_errors_total 0",
                "mycni_ready 1",
                "mycni_api_reachable 0",
                "mycni_datapath_ebpf 0",
                "mycni_ebpf_load_failures_total 1",
                "mycni_reconcile_duration_seconds_count 0",
            ] {
                assert!(
                    t.lines().any(|l| l == line),
                    "{format:?}: no {line:?} in\n{t}"
                );
            }
        }
    }

    #[test]
    fn formats_differ_where_the_specs_do() {
        let m = Metrics::default();
        let om = m.render(Format::OpenMetrics).expect("render");
        assert!(om.ends_with("# EOF\n"), "{om}");
        assert!(om.contains("# TYPE mycni_reconcile_runs counter\n"), "{om}");
        assert!(om.contains("# UNIT mycni_reconcile_duration_seconds seconds\n"));
        let p = m.render(Format::Prometheus).expect("render");
        assert!(!p.contains("# EOF"), "{p}");
        assert!(
            p.contains("# TYPE mycni_reconcile_runs_total counter\n"),
            "{p}"
        );
        assert!(p.contains("# TYPE mycni_reconcile_duration_seconds histogram\n"));
    }

    #[test]
    fn reconcile_timer_observes_on_drop() {
        let m = Metrics::default();
        {
            let _timer = m.reconcile_started();
        }
        let t = m.render(Format::Prometheus).expect("render");
        assert_eq!(
            sample(&t, "mycni_reconcile_duration_seconds_count"),
            Some(1.0)
        );
        assert_eq!(
            sample(&t, "mycni_reconcile_duration_seconds_bucket{le=\"+Inf\"}"),
            Some(1.0),
            "{t}"
        );
    }

    #[test]
    fn events_wait_for_a_pass_that_succeeds() {
        let m = Metrics::default();
        let count = |m: &Metrics| {
            sample(
                &m.render(Format::Prometheus).expect("render"),
                "mycni_node_event_to_kernel_seconds_count",
            )
        };
        // A pass with nothing pending records nothing.
        m.take_node_events().applied();
        assert_eq!(count(&m), Some(0.0));

        m.node_event();
        let first = m.pending_event.lock().map(|p| *p).expect("lock");
        m.node_event();
        // The failed pass puts the oldest stamp back.
        drop(m.take_node_events());
        assert_eq!(m.pending_event.lock().map(|p| *p).expect("lock"), first);
        assert_eq!(count(&m), Some(0.0));

        let events = m.take_node_events();
        // An event during the pass waits for the next one.
        m.node_event();
        events.applied();
        assert_eq!(count(&m), Some(1.0));
        m.take_node_events().applied();
        assert_eq!(count(&m), Some(2.0));
    }

    #[test]
    fn every_netlink_op_is_exported_before_its_first_request() {
        let t = Metrics::default()
            .render(Format::Prometheus)
            .expect("render");
        for op in NetlinkOp::ALL {
            let series = format!(
                "mycni_netlink_op_duration_seconds_count{{op=\"{}\"}}",
                op.name()
            );
            assert!(sample(&t, &series).is_some(), "no {series} in\n{t}");
        }
    }

    #[derive(Debug, Default)]
    struct Probe(AtomicU64);

    impl Collector for Probe {
        fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
            gauge(
                &mut e,
                "probe",
                "A test collector.",
                self.0.load(Ordering::Relaxed),
            )
        }
    }

    #[test]
    fn a_collector_is_registered_once_and_read_at_every_scrape() {
        let m = Metrics::default();
        let a = m.collector::<Probe>();
        let b = m.collector::<Probe>();
        assert!(Arc::ptr_eq(&a, &b));
        a.0.store(5, Ordering::Relaxed);
        let t = m.render(Format::Prometheus).expect("render");
        assert_eq!(t.matches("# TYPE probe gauge").count(), 1, "{t}");
        assert_eq!(sample(&t, "probe"), Some(5.0), "{t}");
        // After the loop's own series.
        assert!(t.find("probe 5") > t.find("mycni_ebpf_load_failures_total"));
    }
}
