//! The policy table's named counters: what they are called, what each
//! counts for, and the running totals the metrics export.
//!
//! The table counts in the kernel, with no rule per policy: the maps that
//! decide (`eg_allow4`, `in_any6`, ...) map each element to a named
//! counter, so the one lookup that admits a packet also names the counter
//! it adds to (`counter name <key> map @eg_allow4`). An element's counter
//! is that of the first rule, in (policy namespace, policy name, rule
//! index) order, that admits its (remote, protocol, port) for that local
//! pod (`sets.rs` splits elements where the first rule changes), so every
//! admitted packet is counted exactly once, under one rule. A packet no
//! rule admits is counted under its pod's denial counter (`eg_deny4`: the
//! local address to the pod's counter) and under its direction's
//! `denied_*` counter; the table's other drops under fixed counters of
//! their own. Counters count every packet the rule judges, both ways of
//! the connection.
//!
//! Counters are per (local pod, rule) and per (local pod, direction), so
//! `inspect policy` shows one pod's hits; the metrics add them up per
//! rule and per policy here. The kernel's counters come and go with the
//! pods and rules (and all restart when the table is written whole), so
//! the totals are kept as sums of what each read added since the last,
//! a counter found lower than last read having restarted.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use anyhow::{Context, Result};

use crate::cluster::eval::RuleRef;
use crate::cluster::model::Key;
use crate::verdict::{Direction, Reason};

/// A named counter of the table: what it counts for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Series {
    /// Packets rule `index` of `policy` admitted in `direction`.
    Rule {
        policy: Key,
        direction: Direction,
        index: usize,
    },
    /// Packets of pods `policy` isolates in `direction` that no rule
    /// admitted (every policy isolating the pod is charged with them).
    Denied { policy: Key, direction: Direction },
    /// Drops of the table, by direction and reason.
    Drop {
        direction: Direction,
        reason: Reason,
    },
    /// Repeated drops over the table's logging rate
    /// ([`crate::verdict::NFLOG_REPEATS_PER_SECOND`]):
    /// counted under their `Drop` series, missing from the flows' counts.
    Unlogged,
}

/// The fixed counter of [`Series::Unlogged`].
pub(crate) const UNLOGGED: &str = "repeats_unlogged";

/// The fixed counter of the table's drops for `direction` and `reason`.
pub fn drop_counter(direction: Direction, reason: Reason) -> String {
    format!("{}_{}", reason.label(), direction.label())
}

/// Every fixed counter, with what it counts.
pub(crate) fn drop_counters() -> Vec<(String, Series)> {
    let mut out = vec![(UNLOGGED.to_string(), Series::Unlogged)];
    for direction in [Direction::Egress, Direction::Ingress] {
        for reason in Reason::ALL {
            out.push((
                drop_counter(direction, reason),
                Series::Drop { direction, reason },
            ));
        }
    }
    out
}

/// FNV-1a: names must be the same in every agent build and run (a
/// restarted agent finds the counters of the one before), which std's
/// hasher does not promise.
fn fnv(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain([0]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// The counter of the packets `rule` admits for local pod `pod`. Short
/// and hashed: a namespace and a policy name alone may be longer than an
/// nft object name; the comment carries the readable form.
pub(crate) fn rule_counter(pod: &Key, rule: &RuleRef) -> String {
    let index = rule.index.to_string();
    format!(
        "r{:016x}",
        fnv(&[
            &pod.namespace,
            &pod.name,
            &rule.policy.namespace,
            &rule.policy.name,
            rule.direction.label(),
            &index,
        ])
    )
}

/// The counter of `pod`'s packets no rule admits in `direction`.
pub(crate) fn pod_counter(pod: &Key, direction: Direction) -> String {
    format!(
        "p{:016x}",
        fnv(&[&pod.namespace, &pod.name, direction.label()])
    )
}

/// `ns/name egress[0]`, as a rule is named in the comment and the output.
pub(crate) fn rule_name(rule: &RuleRef) -> String {
    format!("{} {}[{}]", rule.policy, rule.direction.label(), rule.index)
}

/// An nft comment: at most 128 bytes, and no quote (Kubernetes names have
/// none, but the text goes into a script).
pub fn comment(text: &str) -> String {
    let mut out: String = text.chars().filter(|c| *c != '"').collect();
    while out.len() > 127 {
        out.pop();
    }
    out
}

/// (packets, bytes) of every counter of the table, from `nft -j list
/// counters table inet mycni_policy`.
pub fn parse_counters(json: &str) -> Result<BTreeMap<String, (u64, u64)>> {
    let v: serde_json::Value = serde_json::from_str(json).context("nft printed no JSON")?;
    let list = v["nftables"]
        .as_array()
        .context("no \"nftables\" list in nft's answer")?;
    let mut out = BTreeMap::new();
    for item in list {
        let c = &item["counter"];
        if let Some(name) = c["name"].as_str() {
            let n = |k: &str| c[k].as_u64().unwrap_or(0);
            out.insert(name.to_string(), (n("packets"), n("bytes")));
        }
    }
    Ok(out)
}

/// Running totals per series, fed by reads of the kernel's counters.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    /// What each counter counts for, as of the last write of the table.
    targets: HashMap<String, Vec<Series>>,
    /// Each counter's value at the last read.
    last: HashMap<String, (u64, u64)>,
    totals: BTreeMap<Series, (u64, u64)>,
}

impl Tally {
    /// What the table's counters count for from now on. Series of
    /// policies no counter speaks for any more are dropped (bounded by
    /// what this node enforces, not by every policy it ever saw).
    pub(crate) fn set_targets(&mut self, targets: HashMap<String, Vec<Series>>) {
        self.last.retain(|name, _| targets.contains_key(name));
        let live: BTreeSet<&Series> = targets.values().flatten().collect();
        self.totals
            .retain(|s, _| matches!(s, Series::Drop { .. } | Series::Unlogged) || live.contains(s));
        for s in live {
            self.totals.entry(s.clone()).or_default();
        }
        self.targets = targets;
    }

    /// Adds what each counter counted since the last read; one found
    /// lower restarted (its pod or rule came back, or the table was
    /// written whole) and adds its whole value.
    pub fn read(&mut self, now: &BTreeMap<String, (u64, u64)>) {
        for (name, (p, b)) in now {
            let Some(series) = self.targets.get(name) else {
                continue;
            };
            let (lp, lb) = self.last.get(name).copied().unwrap_or((0, 0));
            let (dp, db) = if *p < lp || *b < lb {
                (*p, *b)
            } else {
                (p - lp, b - lb)
            };
            self.last.insert(name.clone(), (*p, *b));
            for s in series {
                let t = self.totals.entry(s.clone()).or_default();
                t.0 = t.0.saturating_add(dp);
                t.1 = t.1.saturating_add(db);
            }
        }
    }

    pub(crate) fn totals(&self) -> &BTreeMap<Series, (u64, u64)> {
        &self.totals
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(policy: &str, index: usize) -> RuleRef {
        RuleRef {
            policy: Key::new("x", policy),
            direction: Direction::Ingress,
            index,
        }
    }

    #[test]
    fn names_are_stable_short_and_distinct() {
        let a = Key::new("x", "a");
        // Pinned: a restarted agent must find the counters it wrote.
        assert_eq!(rule_counter(&a, &rule("p", 0)), "rfb6e24460530f5c9");
        assert_ne!(
            rule_counter(&a, &rule("p", 0)),
            rule_counter(&a, &rule("p", 1))
        );
        assert_ne!(
            pod_counter(&a, Direction::Egress),
            pod_counter(&a, Direction::Ingress)
        );
        // "x/ab" + "c" must not be "x/a" + "bc".
        assert_ne!(
            pod_counter(&Key::new("x", "ab"), Direction::Egress),
            pod_counter(&Key::new("xa", "b"), Direction::Egress)
        );
        assert_eq!(rule_counter(&a, &rule(&"n".repeat(253), 9)).len(), 17);
        assert_eq!(comment(&"n".repeat(300)).len(), 127);
    }

    #[test]
    fn parses_nft_json() {
        let json = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}}, {"counter": {"family": "inet", "name": "denied_egress", "table": "mycni_policy", "handle": 3, "packets": 4, "bytes": 336}}, {"counter": {"family": "inet", "name": "r1", "table": "mycni_policy", "handle": 4, "comment": "x/p ingress[0]", "packets": 0, "bytes": 0}}]}"#;
        let c = parse_counters(json).expect("parses");
        assert_eq!(c.get("denied_egress"), Some(&(4, 336)));
        assert_eq!(c.get("r1"), Some(&(0, 0)));
        assert!(parse_counters("garbage").is_err());
    }

    #[test]
    fn totals_survive_counters_that_restart_or_go() {
        let mut t = Tally::default();
        let r = Series::Rule {
            policy: Key::new("x", "p"),
            direction: Direction::Ingress,
            index: 0,
        };
        let d1 = Series::Denied {
            policy: Key::new("x", "p"),
            direction: Direction::Ingress,
        };
        let d2 = Series::Denied {
            policy: Key::new("x", "q"),
            direction: Direction::Ingress,
        };
        t.set_targets(HashMap::from([
            ("c1".to_string(), vec![r.clone()]),
            ("c2".to_string(), vec![r.clone()]),
            ("d".to_string(), vec![d1.clone(), d2.clone()]),
        ]));
        let read = |pairs: &[(&str, u64)]| -> BTreeMap<String, (u64, u64)> {
            pairs
                .iter()
                .map(|(n, p)| (n.to_string(), (*p, p * 100)))
                .collect()
        };
        t.read(&read(&[("c1", 5), ("c2", 1), ("d", 2)]));
        assert_eq!(t.totals()[&r], (6, 600));
        assert_eq!((t.totals()[&d1].0, t.totals()[&d2].0), (2, 2));
        // c1 restarted (the table was written whole), c2 went on.
        t.read(&read(&[("c1", 3), ("c2", 4), ("d", 2)]));
        assert_eq!(t.totals()[&r].0, 6 + 3 + 3);
        // c2's pod went; the rule's total stays, q no longer isolates.
        t.set_targets(HashMap::from([
            ("c1".to_string(), vec![r.clone()]),
            ("d".to_string(), vec![d1.clone()]),
        ]));
        t.read(&read(&[("c1", 4), ("d", 3)]));
        assert_eq!(t.totals()[&r].0, 13);
        assert_eq!(t.totals()[&d1].0, 3);
        assert!(!t.totals().contains_key(&d2));
        // A counter nobody maps is not counted.
        t.read(&read(&[("stranger", 50)]));
        assert_eq!(t.totals().values().map(|v| v.0).sum::<u64>(), 16);
    }
}
