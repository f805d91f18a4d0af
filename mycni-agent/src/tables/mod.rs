//! The node tables: the nftables tables the agent owns alone, each with a
//! pure desired state (the script text, built from its inputs and tested
//! without root) and an apply step that hands the script to the one
//! runner, `crate::nft`.
//!
//! - [`masq`]: `ip mycni` / `ip6 mycni`, masquerade of pods leaving the
//!   cluster CIDR (with `--masquerade`), written at start.
//! - [`antispoof`]: `ip6 mycni_antispoof`, IPv6 reverse-path filtering of
//!   pods, written at start and put back on full passes; registers the
//!   `mycni_antispoof_*` collector.
//! - [`underlay_filter`]: `ip mycni_underlay` / `ip6 mycni_underlay`,
//!   VXLAN accepted from peer nodes only, synced on every pass.
//!
//! The tables are separate so that their lifecycles stay apart: replacing
//! one never opens a window in another.

pub mod antispoof;
pub mod masq;
pub mod metrics;
pub mod underlay_filter;

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use crate::metrics::Metrics;

use underlay_filter::UnderlayFilter;

/// The node tables as a room of the loop's pass (masquerade is written
/// once, at start).
pub struct TablesRoom {
    filter: UnderlayFilter,
    metrics: Arc<Metrics>,
}

impl TablesRoom {
    pub fn new(filter: UnderlayFilter, metrics: Arc<Metrics>) -> Self {
        TablesRoom { filter, metrics }
    }

    /// The pass's tables step, after the overlay's kernel writes, not
    /// before: the underlay filter's set is rewritten through `nft` (tens
    /// of ms with 5,000 peers), which would otherwise delay every route,
    /// neighbour and FDB change behind it. A new peer's VXLAN is refused
    /// by the filter for those few ms, which its first packets'
    /// retransmission covers. `hosts` and `hosts6`: the peers' host
    /// addresses; `full`: a full pass, which puts the anti-spoofing table
    /// back if it went.
    pub fn apply(
        &mut self,
        hosts: impl IntoIterator<Item = Ipv4Addr>,
        hosts6: impl IntoIterator<Item = Ipv6Addr>,
        full: bool,
    ) {
        self.filter.sync(hosts, hosts6);
        if full {
            antispoof::ensure(&self.metrics);
        }
    }
}

/// Registers the tables' collector (the anti-spoofing table's), so that its
/// series are there before the table is first written.
pub fn register_metrics(metrics: &crate::metrics::Metrics) {
    drop(metrics.collector::<antispoof::AntiSpoofMetrics>());
}
