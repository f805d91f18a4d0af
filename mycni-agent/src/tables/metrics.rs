//! The underlay filter's series (the anti-spoofing table exports its own
//! drops from `antispoof`).

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use crate::metrics::{counter, gauge};

/// Registered when the filter starts; read at each scrape.
#[derive(Debug, Default)]
pub(crate) struct UnderlayFilterMetrics {
    /// Host IPs the underlay filter accepts VXLAN from (the peers').
    pub peers: AtomicU64,
    /// Failed writes of the underlay filter (nft); each is retried.
    pub errors: AtomicU64,
}

impl Collector for UnderlayFilterMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let e = &mut e;
        gauge(
            e,
            "mycni_underlay_filter_peers",
            "Host IPs VXLAN is accepted from (nftables set mycni_underlay/peers).",
            self.peers.load(Ordering::Relaxed),
        )?;
        counter(
            e,
            "mycni_underlay_filter_errors",
            "Failed writes of the VXLAN underlay filter (nft); retried on the next pass.",
            self.errors.load(Ordering::Relaxed),
        )
    }
}
