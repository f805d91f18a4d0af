//! IPv6 anti-spoofing on the kernel path: a packet a pod sends with a
//! source address that is not its own is dropped and counted on the host,
//! in an nftables table the agent owns alone (`ip6 mycni_antispoof`).
//!
//! IPv4 has this from the plugin: strict `rp_filter` on every host veth.
//! IPv6 has no reverse-path sysctl, so without this table a pod can send
//! with any source (another pod's, an outside one) and the node forwards
//! it. The fast path declines packets whose source the pod does not own
//! and leaves them to the kernel, so the kernel path is where they stop.
//!
//! The rule is the nftables form of strict reverse-path filtering: a packet
//! arriving on a mycni host veth is dropped when the route back to its
//! source does not leave through that same veth. The only such routes are
//! the pod's own `/128` (protocol 109) and the link-local `fe80::/64` every
//! IPv6 interface has, so the rule needs no per-pod state: pods come and go
//! without the agent writing anything, and a pod made while the agent is
//! down is covered as soon as its veth exists.
//!
//! A table of its own, not a chain in `ip mycni` or `ip mycni_underlay`:
//! masquerade is replaced wholesale and only with `--masquerade`, the
//! underlay filter's set changes with every peer; this table is written
//! once at start and is the same on every node. Separate tables keep the
//! lifecycles apart, and no replace of one opens a window in another.

use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;

use crate::metrics::{Metrics, gauge};
use crate::nft;

pub const TABLE: &str = "mycni_antispoof";
/// The named counter of dropped packets, read at scrape.
pub(crate) const COUNTER: &str = "spoofed";
const CHAIN: &str = "prerouting";

pub use mycni_common::contract::HOST_VETH_PREFIX;

/// The whole table, replaced in one transaction.
///
/// - Hook prerouting at priority `raw` (-300): before conntrack (-200), so a
///   spoofed packet creates no conntrack entry (a flood of them cannot fill
///   the table), and before any NAT or filter chain spends work on it.
/// - `ip6 saddr != { ::, fe80::/10 }`: the unspecified source (duplicate
///   address detection, MLD before an address exists) and link-local ones
///   (the pod's NDP to its gateway `fe80::1`, MLD, its own EUI-64 address)
///   are link-scoped and never forwarded, and they are what neighbour
///   discovery needs. On current kernels the lookup passes them too (the
///   `fe80::/64` route goes through the veth; `fib` skips ICMPv6 from `::`
///   to link-local scope): the set makes that hold for any protocol and
///   kernel, and saves the lookup.
///   Multicast sources need no rule: the kernel drops them on receipt.
/// - `fib saddr . iif oif missing`: the route to the source, looked up as
///   if leaving through the interface the packet came in on, does not
///   exist. Another pod's address has its `/128` through another veth, an
///   outside address the default route through the uplink: both missing.
///
/// `add table` + `delete table` first makes the replace work whether or not
/// the table exists; nft applies the whole file atomically, so there is no
/// moment without the rule on a restart.
pub fn ruleset() -> String {
    format!(
        "add table ip6 {TABLE}\n\
         delete table ip6 {TABLE}\n\
         table ip6 {TABLE} {{\n\
         \tcounter {COUNTER} {{\n\
         \t\tcomment \"mycni: IPv6 packets from pods with a source that is not theirs\"\n\
         \t}}\n\
         \tchain {CHAIN} {{\n\
         \t\ttype filter hook prerouting priority raw; policy accept;\n\
         \t\tiifname \"{HOST_VETH_PREFIX}*\" ip6 saddr != {{ ::, fe80::/10 }} fib saddr . iif oif missing counter name \"{COUNTER}\" drop comment \"mycni: pod IPv6 source not routed back through its veth\"\n\
         \t}}\n\
         }}\n"
    )
}

pub(crate) fn uninstall_script() -> String {
    format!("add table ip6 {TABLE}\ndelete table ip6 {TABLE}\n")
}

/// Puts the table in place (replacing any earlier one); idempotent.
pub fn install() -> Result<()> {
    nft::apply(&ruleset()).context("installing the IPv6 anti-spoofing table")
}

/// Removes the table (`mycni-agent uninstall`); success if it is gone.
pub fn uninstall() -> Result<()> {
    nft::apply(&uninstall_script())
}

/// At start: installs the table and records the outcome for `/metrics`.
/// A failure (no nftables, no `nft_fib_ipv6` in the kernel) is logged and
/// exported (`mycni_antispoof_ipv6 0`), not fatal: the overlay and IPv4's
/// filter do not depend on it, and an agent that crash-loops over it would
/// take every pod's network down with it.
pub fn start(metrics: &Metrics) {
    let ok = match install() {
        Ok(()) => {
            tracing::info!(
                table = TABLE,
                "IPv6 anti-spoofing: packets from pods with a source not their own are dropped"
            );
            true
        }
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "IPv6 anti-spoofing is off: pods can send IPv6 with any source address");
            false
        }
    };
    set_installed(metrics, ok);
}

/// Records whether the table was put in place, which is what lets a
/// scrape read its counter (see [`AntiSpoofMetrics`]).
pub fn set_installed(metrics: &Metrics, ok: bool) {
    metrics
        .collector::<AntiSpoofMetrics>()
        .installed
        .store(ok, Ordering::Relaxed);
}

/// On full passes: puts the table back if someone removed it, so a lost
/// table costs at most one resync period (`mycni_antispoof_ipv6` shows the
/// gap). A table that is there is left alone, so its counter keeps
/// counting; its contents are not compared (a flushed chain stays flushed
/// until the agent restarts).
pub fn ensure(metrics: &Metrics) {
    if nft::table_exists("ip6", TABLE) {
        set_installed(metrics, true);
        return;
    }
    tracing::warn!(
        table = TABLE,
        "the IPv6 anti-spoofing table was missing: putting it back"
    );
    start(metrics);
}

/// Packets the rule dropped since the table was installed. Runs `nft`
/// (a few ms): call it off the async workers.
pub fn dropped() -> Result<u64> {
    packets(&nft::query(&[
        "-j", "list", "counter", "ip6", TABLE, COUNTER,
    ])?)
}

/// `mycni_antispoof_ipv6` and `mycni_antispoof_dropped`, read from the
/// table at scrape.
#[derive(Debug, Default)]
pub(crate) struct AntiSpoofMetrics {
    /// The agent installed the table (`start`, `ensure`); until then a
    /// scrape does not run `nft`.
    installed: AtomicBool,
}

impl Collector for AntiSpoofMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let dropped = self
            .installed
            .load(Ordering::Relaxed)
            .then(|| dropped().ok())
            .flatten();
        // Read from the table itself: one deleted after start (a flush of
        // the ruleset) shows as 0 and no sample, not as installed.
        gauge(
            &mut e,
            "mycni_antispoof_ipv6",
            "1 while the nftables table ip6 mycni_antispoof, which drops pods' IPv6 packets with a source not their own, is in place (read at scrape).",
            u64::from(dropped.is_some()),
        )?;
        let mut m = e.encode_descriptor(
            "mycni_antispoof_dropped",
            "IPv6 packets from pods dropped because their source is not routed back through their veth (since the table was installed).",
            None,
            MetricType::Counter,
        )?;
        if let Some(n) = dropped {
            ConstCounter::new(n).encode(m.encode_family(&[("family", "ipv6")])?)?;
        }
        Ok(())
    }
}

/// The `packets` of our counter in `nft -j list counter` output.
fn packets(json: &str) -> Result<u64> {
    let v: serde_json::Value = serde_json::from_str(json).context("nft printed no JSON")?;
    v["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|o| o.get("counter"))
        .find(|c| c["table"] == TABLE && c["name"] == COUNTER)
        .and_then(|c| c["packets"].as_u64())
        .with_context(|| format!("no counter {TABLE}/{COUNTER} in nft's answer"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ruleset_replaces_the_table_in_one_script() {
        assert_eq!(
            ruleset(),
            "add table ip6 mycni_antispoof\n\
             delete table ip6 mycni_antispoof\n\
             table ip6 mycni_antispoof {\n\
             \tcounter spoofed {\n\
             \t\tcomment \"mycni: IPv6 packets from pods with a source that is not theirs\"\n\
             \t}\n\
             \tchain prerouting {\n\
             \t\ttype filter hook prerouting priority raw; policy accept;\n\
             \t\tiifname \"mycni*\" ip6 saddr != { ::, fe80::/10 } fib saddr . iif oif missing counter name \"spoofed\" drop comment \"mycni: pod IPv6 source not routed back through its veth\"\n\
             \t}\n\
             }\n"
        );
    }

    #[test]
    fn only_ipv6_and_only_our_table() {
        let r = ruleset();
        // IPv4 is the plugin's rp_filter; an `inet` table would filter it twice.
        assert!(!r.contains("table ip ") && !r.contains("inet"), "{r}");
        assert!(
            r.lines().all(|l| !l.contains("table") || l.contains(TABLE)),
            "{r}"
        );
        assert_eq!(r.matches("drop").count(), 1, "{r}");
    }

    #[test]
    fn uninstall_works_whether_or_not_the_table_exists() {
        assert_eq!(
            uninstall_script(),
            "add table ip6 mycni_antispoof\ndelete table ip6 mycni_antispoof\n"
        );
    }

    #[test]
    fn exported_off_before_the_table_is_installed() {
        use crate::metrics::Format;
        let m = Metrics::default();
        // Not installed: no nft run, the family declared without samples.
        set_installed(&m, false);
        let t = m.render(Format::Prometheus).expect("render");
        assert!(t.lines().any(|l| l == "mycni_antispoof_ipv6 0"), "{t}");
        assert!(
            t.contains("# TYPE mycni_antispoof_dropped_total counter\n"),
            "{t}"
        );
        assert!(!t.contains("mycni_antispoof_dropped_total{"), "{t}");
    }

    #[test]
    fn reads_the_packets_of_our_counter() {
        // As nftables 1.0.6 prints it.
        let json = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"counter": {"family": "ip6", "name": "spoofed", "table": "mycni_antispoof", "handle": 2, "comment": "x", "packets": 42, "bytes": 4242}}]}"#;
        assert_eq!(packets(json).ok(), Some(42));
    }

    #[test]
    fn another_counter_or_garbage_is_an_error() {
        let other = r#"{"nftables": [{"counter": {"family": "ip6", "name": "other", "table": "mycni_antispoof", "packets": 1}}]}"#;
        assert!(packets(other).is_err());
        assert!(packets(r#"{"nftables": []}"#).is_err());
        assert!(packets("Error: No such file or directory").is_err());
    }
}
