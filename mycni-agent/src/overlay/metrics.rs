//! The overlay's series: its peers, its kernel updates, what it repaired
//! and whom it refused.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::metrics::{counter, gauge};

/// Registered by the overlay room ([`crate::metrics::Metrics::collector`]);
/// read at each scrape.
#[derive(Debug, Default)]
pub(crate) struct OverlayMetrics {
    pub peers_programmed: AtomicU64,
    /// Kernel entries re-created or removed although the desired state had
    /// not changed since the last good reconcile: someone else touched them.
    pub drift_repaired: AtomicU64,
    pub kernel_actions: AtomicU64,
    /// Nodes not programmed, by reason.
    pub rejected: Mutex<BTreeMap<&'static str, u64>>,
}

impl Collector for OverlayMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let e = &mut e;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        gauge(
            e,
            "mycni_peers_programmed",
            "Peer nodes whose route, neighbour and FDB entry are programmed.",
            load(&self.peers_programmed),
        )?;
        counter(
            e,
            "mycni_kernel_drift_repaired",
            "Kernel entries repaired that changed without a Node change.",
            load(&self.drift_repaired),
        )?;
        counter(
            e,
            "mycni_kernel_updates",
            "Route, neighbour and FDB updates applied.",
            load(&self.kernel_actions),
        )?;
        let rejected = self.rejected.lock().map(|r| r.clone()).unwrap_or_default();
        let mut m = e.encode_descriptor(
            "mycni_rejected_peers",
            "Nodes not programmed because their data is malformed or hostile, by reason.",
            None,
            MetricType::Gauge,
        )?;
        for (reason, n) in &rejected {
            ConstGauge::new(*n).encode(m.encode_family(&[("reason", *reason)])?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{Format, Metrics};

    #[test]
    fn the_overlays_series_keep_their_names_and_lines() {
        let m = Metrics::default();
        let o = m.collector::<OverlayMetrics>();
        o.peers_programmed.store(3, Ordering::Relaxed);
        if let Ok(mut r) = o.rejected.lock() {
            r.insert("bad_mac", 2);
        }
        for format in [Format::Prometheus, Format::OpenMetrics] {
            let t = m.render(format).expect("render");
            for line in [
                "mycni_peers_programmed 3",
                "mycni_kernel_drift_repaired_total 0",
                "mycni_kernel_updates_total 0",
                "mycni_rejected_peers{reason=\"bad_mac\"} 2",
            ] {
                assert!(
                    t.lines().any(|l| l == line),
                    "{format:?}: no {line:?} in\n{t}"
                );
            }
        }
    }
}
