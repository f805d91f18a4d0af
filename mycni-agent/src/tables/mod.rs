//! The node tables: the nftables tables the agent owns alone, each with a
//! pure desired state (the script text, built from its inputs and tested
//! without root) and an apply step that hands the script to the one
//! runner, [`nft`].
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
pub mod nft;
pub mod underlay_filter;

/// Registers the tables' collector (the anti-spoofing table's), so that its
/// series are there before the table is first written.
pub fn register_metrics(metrics: &crate::metrics::Metrics) {
    drop(metrics.collector::<antispoof::AntiSpoofMetrics>());
}
