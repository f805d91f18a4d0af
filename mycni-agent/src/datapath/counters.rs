//! What the datapath exports to `/metrics`, read at scrape: the maps'
//! sizes as the last sync left them, the programs' per-path counters
//! from the pinned counter map and their flow-event statistics.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use mycni_common::{DpFamily, DpPath};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use super::maps::{read_family_counters, read_flow_stats};
use crate::metrics::Metrics;

/// Registers the datapath's collector, so that its series are there
/// before the programs are loaded (or found not to be).
pub fn register_metrics(metrics: &Metrics) {
    drop(metrics.collector::<DatapathMetrics>());
    drop(metrics.collector::<super::kdrop::KernelDropMetrics>());
}

/// `mycni_datapath_entries`, `mycni_datapath_packets` and
/// `mycni_datapath_bytes`: the maps' sizes as the last sync left them, and
/// the per-path counters read from the pinned counter map at scrape.
#[derive(Debug, Default)]
pub(crate) struct DatapathMetrics {
    /// Where the counters are pinned; None on the kernel path.
    pub(super) pin_dir: Mutex<Option<PathBuf>>,
    /// Entries in the local endpoint maps, both families.
    pub(super) local: AtomicU64,
    /// Entries in the podCIDR tries, both families.
    pub(super) remote: AtomicU64,
    /// Interfaces the programs should be on and could not be attached to.
    pub(super) attach_failed: AtomicU64,
    /// Pod veths whose legacy attach waits for the CNI chain to finish.
    pub(super) attach_waiting: AtomicU64,
}

impl Collector for DatapathMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut m = e.encode_descriptor(
            "mycni_datapath_entries",
            "Entries in the fast path's maps.",
            None,
            MetricType::Gauge,
        )?;
        for (map, n) in [("local", load(&self.local)), ("remote", load(&self.remote))] {
            ConstGauge::new(n).encode(m.encode_family(&[("map", map)])?)?;
        }
        let m = e.encode_descriptor(
            "mycni_datapath_attach_failures",
            "Interfaces the fast path should run on and whose programs could not be attached at the last pass, or pods another tool shapes (a qdisc of the CNI bandwidth plugin), left alone: their traffic takes the kernel path (the readiness detail names one and why).",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(load(&self.attach_failed)).encode(m)?;
        let m = e.encode_descriptor(
            "mycni_datapath_attach_waiting",
            "Pod interfaces whose legacy tc attach waits for the pod's CNI chain to finish (a clsact made before the chain's bandwidth plugin would fail its ADD); their traffic takes the kernel path until then. Always 0 over TCX.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(load(&self.attach_waiting)).encode(m)?;
        let pin = self.pin_dir.lock().ok().and_then(|p| p.clone());
        // A map that cannot be read this time leaves the family out rather
        // than failing the whole scrape; the log of the load says why.
        let counters = pin
            .as_ref()
            .and_then(|p| read_family_counters(p).ok())
            .unwrap_or_default();
        let flow_stats = pin.as_ref().and_then(|p| read_flow_stats(p).ok());
        // Declared on the kernel path too, without samples: the family is
        // part of what the agent exports whichever datapath runs.
        let mut m = e.encode_descriptor(
            "mycni_datapath_packets",
            "Packets seen by the tc programs, by the path they took or why they were left to the kernel, and by address family (ipv4, ipv6, other: not IP; on the underlay, the inner family of VXLAN the program looked into).",
            None,
            MetricType::Counter,
        )?;
        for (family, path, c) in &counters {
            ConstCounter::new(c.packets).encode(m.encode_family(&path_labels(*family, *path))?)?;
        }
        let mut m = e.encode_descriptor(
            "mycni_datapath_bytes",
            "Bytes seen by the tc programs, by path and address family.",
            None,
            MetricType::Counter,
        )?;
        for (family, path, c) in &counters {
            ConstCounter::new(c.bytes).encode(m.encode_family(&path_labels(*family, *path))?)?;
        }
        let mut m = e.encode_descriptor(
            "mycni_flow_events",
            "Flow events of the tc programs: emitted into the ring, lost (the ring was full), suppressed (changes of a connection's path past its first three and within a second of the last one announced).",
            None,
            MetricType::Counter,
        )?;
        if let Some(s) = flow_stats {
            for (outcome, n) in [
                ("emitted", s.emitted),
                ("lost", s.lost),
                ("suppressed", s.suppressed),
            ] {
                ConstCounter::new(n).encode(m.encode_family(&[("outcome", outcome)])?)?;
            }
        }
        Ok(())
    }
}

/// `family` last: readers that match on `{path="` keep working, and
/// queries that sum by path need no change (`sum by (path)` drops it).
fn path_labels(f: DpFamily, p: DpPath) -> [(&'static str, &'static str); 3] {
    [
        ("path", p.name()),
        ("fast", if p.is_fast() { "true" } else { "false" }),
        ("family", f.name()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_path_exports_empty_maps_and_declared_counters() {
        use crate::metrics::Format;
        let m = Metrics::default();
        drop(m.collector::<DatapathMetrics>());
        for format in [Format::Prometheus, Format::OpenMetrics] {
            let t = m.render(format).expect("render");
            for line in [
                "mycni_datapath_entries{map=\"local\"} 0",
                "mycni_datapath_entries{map=\"remote\"} 0",
            ] {
                assert!(
                    t.lines().any(|l| l == line),
                    "{format:?}: no {line:?} in\n{t}"
                );
            }
            assert!(t.contains("# HELP mycni_datapath_bytes"), "{t}");
            assert!(t.contains("# HELP mycni_flow_events"), "{t}");
            assert!(!t.contains("mycni_flow_events_total{"), "{t}");
            assert!(!t.contains("mycni_datapath_packets_total{"), "{t}");
        }
    }
}
