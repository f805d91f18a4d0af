//! The policy room's series, `mycni_policy_*`: what it enforces, what it
//! refused to read, how its writes go, how long an API event takes to be
//! enforced, and what the table's counters counted (read at scrape).
//!
//! Per-policy series (selected pods, rule and denial counters) exist only
//! for policies selecting a pod of this node, and for at most
//! `MAX_POLICIES` of them (by namespace and name): the cardinality is
//! bounded by what one node enforces, never by the cluster.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Unit;

use super::counters::{Series, Tally, parse_counters};
use super::nft::{FAMILY, TABLE};
use crate::cluster::model::Key;
use crate::metrics::{EVENT_TO_KERNEL_BUCKETS, counter, gauge};
use crate::nft;

/// The most policies with series of their own on one node.
pub(crate) const MAX_POLICIES: usize = 500;

#[derive(Debug)]
pub(crate) struct PolicyMetrics {
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
    /// Problems the last pass found, by kind of object.
    pub(super) problems: Mutex<BTreeMap<&'static str, u64>>,
    /// Local pods each policy selects (policies selecting none left out).
    pub(super) selected: Mutex<BTreeMap<Key, u64>>,
    /// The table's counters, summed per rule, policy and drop reason.
    pub(super) tally: Mutex<Tally>,
    /// From a watch event's arrival to the end of the nft write that
    /// enforced it.
    pub(super) event_to_enforced: Histogram,
}

impl Default for PolicyMetrics {
    fn default() -> Self {
        PolicyMetrics {
            enforcing: AtomicBool::default(),
            policies: AtomicU64::default(),
            isolated_pods: AtomicU64::default(),
            set_elements: AtomicU64::default(),
            passes: AtomicU64::default(),
            full_writes: AtomicU64::default(),
            apply_errors: AtomicU64::default(),
            rejected: Mutex::default(),
            last_apply_us: AtomicU64::default(),
            problems: Mutex::default(),
            selected: Mutex::default(),
            tally: Mutex::default(),
            event_to_enforced: Histogram::new(EVENT_TO_KERNEL_BUCKETS),
        }
    }
}

/// The table's counters now, by name; none when there is no table.
pub fn read_counters() -> Option<BTreeMap<String, (u64, u64)>> {
    let json = nft::query(&["-j", "list", "counters", "table", FAMILY, TABLE]).ok()?;
    parse_counters(&json)
        .map_err(|e| tracing::debug!(error = %e, "cannot read the policy table's counters"))
        .ok()
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
        let mut m = e.encode_descriptor(
            "mycni_policy_problems",
            "Problems the last pass found in objects it could not read whole, by kind of object (Pod, Namespace, NetworkPolicy): a rejected policy or rule stays counted here while it exists.",
            None,
            MetricType::Gauge,
        )?;
        if let Ok(p) = self.problems.lock() {
            for (kind, n) in p.iter() {
                ConstGauge::new(*n).encode(m.encode_family(&[("kind", *kind)])?)?;
            }
        }
        self.event_to_enforced.encode(e.encode_descriptor(
            "mycni_policy_event_to_enforced",
            "From a Pod, Namespace or NetworkPolicy watch event arriving to the end of the nft write that enforced it on this node (events that changed nothing here are not observed).",
            Some(&Unit::Seconds),
            MetricType::Histogram,
        )?)?;
        let selected = self.selected.lock().map(|s| s.clone()).unwrap_or_default();
        let shown: BTreeSet<&Key> = selected.keys().take(MAX_POLICIES).collect();
        let mut m = e.encode_descriptor(
            "mycni_policy_selected_pods",
            "Pods of this node each NetworkPolicy selects (policies selecting none have no series).",
            None,
            MetricType::Gauge,
        )?;
        for (policy, n) in selected.iter().take(MAX_POLICIES) {
            ConstGauge::new(*n).encode(m.encode_family(&[
                ("namespace", policy.namespace.as_str()),
                ("policy", policy.name.as_str()),
            ])?)?;
        }
        // The counters are read only while the table is ours to read: a
        // scrape before the first write runs no nft.
        let totals = match self.tally.lock() {
            Ok(mut t) => {
                if self.enforcing.load(Ordering::Relaxed)
                    && let Some(now) = read_counters()
                {
                    t.read(&now);
                }
                t.totals().clone()
            }
            Err(_) => BTreeMap::new(),
        };
        encode_totals(&mut e, &totals, &shown)
    }
}

/// The rule, denial and drop series of `totals`, per-policy ones only for
/// the `shown` policies.
fn encode_totals(
    e: &mut DescriptorEncoder,
    totals: &BTreeMap<Series, (u64, u64)>,
    shown: &BTreeSet<&Key>,
) -> std::fmt::Result {
    for (name, help, bytes) in [
        (
            "mycni_policy_rule_packets",
            "Packets of connections each NetworkPolicy rule admitted on this node, each packet under the first rule (by namespace, policy name, index) admitting it.",
            false,
        ),
        (
            "mycni_policy_rule_bytes",
            "Bytes of the packets of mycni_policy_rule_packets_total.",
            true,
        ),
    ] {
        let mut m = e.encode_descriptor(name, help, None, MetricType::Counter)?;
        for (s, (p, b)) in totals {
            if let Series::Rule {
                policy,
                direction,
                index,
            } = s
                && shown.contains(policy)
            {
                let index = index.to_string();
                ConstCounter::new(if bytes { *b } else { *p }).encode(m.encode_family(&[
                    ("namespace", policy.namespace.as_str()),
                    ("policy", policy.name.as_str()),
                    ("direction", direction.label()),
                    ("rule", index.as_str()),
                ])?)?;
            }
        }
    }
    let mut m = e.encode_descriptor(
        "mycni_policy_denied_packets",
        "Packets of pods each NetworkPolicy isolates that no rule admitted (charged to every policy isolating the pod in that direction).",
        None,
        MetricType::Counter,
    )?;
    for (s, (p, _)) in totals {
        if let Series::Denied { policy, direction } = s
            && shown.contains(policy)
        {
            ConstCounter::new(*p).encode(m.encode_family(&[
                ("namespace", policy.namespace.as_str()),
                ("policy", policy.name.as_str()),
                ("direction", direction.label()),
            ])?)?;
        }
    }
    let mut m = e.encode_descriptor(
        "mycni_policy_drops",
        "Packets the policy table dropped, by direction (egress: from a local pod; ingress: to one) and reason (denied: no rule admits; not_judged: a pod the agent has not judged yet; invalid: no connection).",
        None,
        MetricType::Counter,
    )?;
    for (s, (p, _)) in totals {
        if let Series::Drop { direction, reason } = s {
            ConstCounter::new(*p).encode(m.encode_family(&[
                ("direction", direction.label()),
                ("reason", reason.label()),
            ])?)?;
        }
    }
    let unlogged = totals.get(&Series::Unlogged).map_or(0, |(p, _)| *p);
    let m = e.encode_descriptor(
        "mycni_policy_drops_unlogged",
        "Repeated policy drops over the table's logging rate: in mycni_policy_drops, missing from the drop counts flows reports.",
        None,
        MetricType::Counter,
    )?;
    ConstCounter::new(unlogged).encode(m)?;
    Ok(())
}
