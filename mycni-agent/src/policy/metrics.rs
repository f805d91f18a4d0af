//! The policy room's series, `mycni_policy_*`: what it enforces, what it
//! refused to read, and how its writes go.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::metrics::{counter, gauge};

#[derive(Debug, Default)]
pub struct PolicyMetrics {
    /// The first write after the lists synced is done.
    pub(super) enforcing: AtomicBool,
    pub(super) policies: AtomicU64,
    pub(super) isolated_pods: AtomicU64,
    pub(super) set_elements: AtomicU64,
    pub(super) passes: AtomicU64,
    pub(super) full_writes: AtomicU64,
    pub(super) apply_errors: AtomicU64,
    /// Objects or rules the converter refused, by kind of problem (a
    /// policy it cannot read selects no pod; a rule it cannot read allows
    /// nothing).
    pub(super) rejected: Mutex<BTreeMap<String, u64>>,
    /// The last pass's time from wake-up to the table written, in µs.
    pub(super) last_apply_us: AtomicU64,
}

impl PolicyMetrics {
    pub(super) fn reject(&self, what: &str) {
        if let Ok(mut r) = self.rejected.lock() {
            *r.entry(what.to_string()).or_default() += 1;
        }
    }
}

impl Collector for PolicyMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        gauge(
            &mut e,
            "mycni_policy_enforcing",
            "1 once the policy room wrote its table after the Pod, Namespace and NetworkPolicy lists synced.",
            u64::from(self.enforcing.load(Ordering::Relaxed)),
        )?;
        gauge(
            &mut e,
            "mycni_policy_policies",
            "NetworkPolicies the agent read (cluster-wide).",
            load(&self.policies),
        )?;
        gauge(
            &mut e,
            "mycni_policy_isolated_pods",
            "Pods of this node some NetworkPolicy isolates (either direction).",
            load(&self.isolated_pods),
        )?;
        gauge(
            &mut e,
            "mycni_policy_set_elements",
            "Elements in the nftables sets of inet mycni_policy.",
            load(&self.set_elements),
        )?;
        counter(
            &mut e,
            "mycni_policy_passes",
            "Passes of the policy room.",
            load(&self.passes),
        )?;
        counter(
            &mut e,
            "mycni_policy_full_writes",
            "Times the policy table was written whole (start, repair, a failed incremental write).",
            load(&self.full_writes),
        )?;
        counter(
            &mut e,
            "mycni_policy_apply_errors",
            "Failed writes of the policy table (retried).",
            load(&self.apply_errors),
        )?;
        ConstGauge::new(load(&self.last_apply_us) as f64 / 1e6).encode(e.encode_descriptor(
            "mycni_policy_last_pass_seconds",
            "The last policy pass, from its wake-up to the table written.",
            None,
            MetricType::Gauge,
        )?)?;
        let mut m = e.encode_descriptor(
            "mycni_policy_rejected",
            "Objects, rules or fields the agent refused to read, by problem (a policy that cannot be read selects nothing; a rule, allows nothing).",
            None,
            MetricType::Counter,
        )?;
        if let Ok(r) = self.rejected.lock() {
            for (what, n) in r.iter() {
                ConstCounter::new(*n).encode(m.encode_family(&[("problem", what.as_str())])?)?;
            }
        }
        Ok(())
    }
}
