//! `mycni-agent inspect policy <ns>/<pod>`: what the policy room enforces
//! for one pod of its node, as it compiled it, with the table's counters.
//!
//! The room keeps, after each write, a view of its node's pods (their
//! compiled rules and the policies selecting them); the agent's HTTP
//! server answers `GET /inspect/policy/<ns>/<pod>` from it with a
//! [`PodReport`] in JSON, the counters read from the table at that
//! moment; the CLI asks the agent on the node (its metrics address) and
//! prints the report. Only the agent knows which rule an element stands
//! for and what a selector resolved to, so the report comes from it, not
//! from `nft list` (whose counters it shows).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::compile::{CompiledPod, DirectionRules, PeerSet, PortSet};
use super::counters::{pod_counter, rule_counter};
use crate::cluster::model::{Key, Protocol};
use crate::verdict::Direction;

/// The room's node as of its last write: each local pod's compiled rules
/// and the policies selecting it.
#[derive(Debug, Default)]
pub(crate) struct View {
    pub pods: BTreeMap<Key, (CompiledPod, Vec<Key>)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodReport {
    pub pod: String,
    pub ips: Vec<IpAddr>,
    /// Every policy whose podSelector selects the pod (some may isolate it
    /// in one direction only).
    pub selected_by: Vec<String>,
    pub egress: DirectionReport,
    pub ingress: DirectionReport,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirectionReport {
    /// The policies isolating the pod in this direction; empty: open.
    pub isolated_by: Vec<String>,
    /// The rules admitting something, in the order the counting follows.
    pub rules: Vec<RuleReport>,
    /// What no rule admitted (isolated only).
    pub denied: Option<Count>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleReport {
    pub policy: String,
    /// Index in the policy's spec.ingress / spec.egress.
    pub index: usize,
    /// What the rule admits, each (peers, ports) as compiled: selectors
    /// resolved to pod addresses, named ports to numbers.
    pub admits: Vec<Admits>,
    /// The packets counted under this rule for this pod.
    pub count: Count,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Admits {
    pub peers: Vec<String>,
    pub ports: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Count {
    pub counter: String,
    pub packets: u64,
    pub bytes: u64,
}

impl View {
    /// The report of `pod` (`ns/name`), counters from `counters` (the
    /// table's, by name). An error names why there is none.
    pub fn report(
        &self,
        pod: &str,
        counters: &BTreeMap<String, (u64, u64)>,
    ) -> Result<PodReport, String> {
        let (ns, name) = pod
            .split_once('/')
            .ok_or_else(|| format!("{pod:?} is not <namespace>/<pod>"))?;
        let key = Key::new(ns, name);
        let (compiled, selected_by) = self.pods.get(&key).ok_or_else(|| {
            format!("no pod {key} on this node (or the policy room has not written its table yet)")
        })?;
        let count = |name: String| {
            let (packets, bytes) = counters.get(&name).copied().unwrap_or_default();
            Count {
                counter: name,
                packets,
                bytes,
            }
        };
        let direction = |d: Direction| -> DirectionReport {
            let DirectionRules::Isolated { by, allows } = compiled.rules(d) else {
                return DirectionReport {
                    isolated_by: Vec::new(),
                    rules: Vec::new(),
                    denied: None,
                };
            };
            let mut rules: BTreeMap<_, RuleReport> = BTreeMap::new();
            for a in allows {
                rules
                    .entry(a.rule.clone())
                    .or_insert_with(|| RuleReport {
                        policy: a.rule.policy.to_string(),
                        index: a.rule.index,
                        admits: Vec::new(),
                        count: count(rule_counter(&key, &a.rule)),
                    })
                    .admits
                    .push(Admits {
                        peers: peers(&a.peers),
                        ports: ports(&a.ports),
                    });
            }
            DirectionReport {
                isolated_by: by.iter().map(Key::to_string).collect(),
                rules: rules.into_values().collect(),
                denied: Some(count(pod_counter(&key, d))),
            }
        };
        Ok(PodReport {
            pod: key.to_string(),
            ips: compiled.ips.clone(),
            selected_by: selected_by.iter().map(Key::to_string).collect(),
            egress: direction(Direction::Egress),
            ingress: direction(Direction::Ingress),
        })
    }
}

fn peers(p: &PeerSet) -> Vec<String> {
    match p {
        PeerSet::All => vec!["any address".into()],
        PeerSet::Some { addrs, blocks } => {
            let mut out: Vec<String> = addrs.iter().map(IpAddr::to_string).collect();
            for b in blocks {
                let mut s = b.cidr.to_string();
                if !b.except.is_empty() {
                    let except: Vec<String> = b.except.iter().map(ToString::to_string).collect();
                    let _ = write!(s, " except {}", except.join(", "));
                }
                out.push(s);
            }
            if out.is_empty() {
                out.push("no address (its selectors match no pod now)".into());
            }
            out
        }
    }
}

fn ports(p: &PortSet) -> Vec<String> {
    match p {
        PortSet::All => vec!["any protocol and port".into()],
        PortSet::Some(ranges) => ranges
            .iter()
            .map(|r| {
                let proto = match r.protocol {
                    Protocol::Tcp => "TCP",
                    Protocol::Udp => "UDP",
                    Protocol::Sctp => "SCTP",
                };
                match (r.start, r.end) {
                    (0, u16::MAX) => format!("{proto} any port"),
                    (s, e) if s == e => format!("{proto} {s}"),
                    (s, e) => format!("{proto} {s}-{e}"),
                }
            })
            .collect(),
    }
}

/// The report as an operator reads it.
pub fn render(r: &PodReport) -> String {
    let mut s = String::new();
    let ips: Vec<String> = r.ips.iter().map(IpAddr::to_string).collect();
    let _ = writeln!(s, "pod {} ({})", r.pod, ips.join(", "));
    if r.selected_by.is_empty() {
        let _ = writeln!(s, "selected by no NetworkPolicy");
    } else {
        let _ = writeln!(s, "selected by: {}", r.selected_by.join(", "));
    }
    for (d, rep) in [
        (Direction::Ingress, &r.ingress),
        (Direction::Egress, &r.egress),
    ] {
        let d = d.label();
        if rep.isolated_by.is_empty() {
            let _ = writeln!(s, "\n{d}: open (no policy isolates it)");
            continue;
        }
        let _ = writeln!(s, "\n{d}: isolated by {}", rep.isolated_by.join(", "));
        if rep.rules.is_empty() {
            let _ = writeln!(
                s,
                "  no rule admits anything: every new connection is denied"
            );
        }
        for rule in &rep.rules {
            let _ = writeln!(
                s,
                "  {} {d}[{}]: {} packets, {} bytes",
                rule.policy, rule.index, rule.count.packets, rule.count.bytes
            );
            for a in &rule.admits {
                let _ = writeln!(
                    s,
                    "    {} {}: {}",
                    if d == "ingress" { "from" } else { "to" },
                    a.peers.join(", "),
                    a.ports.join(", ")
                );
            }
        }
        if let Some(c) = &rep.denied {
            let _ = writeln!(
                s,
                "  denied (no rule admits): {} packets, {} bytes",
                c.packets, c.bytes
            );
        }
    }
    s
}

/// Asks the agent at `agent` for `pod`'s report.
pub fn fetch(agent: SocketAddr, pod: &str) -> Result<PodReport> {
    let body = crate::api::client::text_blocking(agent, &format!("/inspect/policy/{pod}"))?;
    serde_json::from_str(&body).with_context(|| format!("the agent's answer is no report: {body}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::fixture::{model, np};
    use crate::policy::compile_node;
    use serde_json::json;

    fn view() -> View {
        let mut c = model();
        c.add_policy(np(
            "x",
            "a-from-b",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}],
                                "ports": [{"port": 81}]}]}),
        ));
        c.add_policy(np(
            "x",
            "deny-egress",
            json!({"podSelector": {}, "policyTypes": ["Egress"]}),
        ));
        for p in c.pods.values_mut() {
            std::sync::Arc::make_mut(p).node = Some("n1".into());
        }
        let compiled = compile_node(&c, "n1");
        let mut v = View::default();
        for (k, cp) in compiled {
            let pod = &c.pods[&k];
            let by = c.policies_selecting(pod).map(|p| p.key.clone()).collect();
            v.pods.insert(k, (cp, by));
        }
        v
    }

    #[test]
    fn reports_the_policies_rules_and_counters_of_one_pod() {
        let v = view();
        let a = Key::new("x", "a");
        let rule = crate::cluster::RuleRef {
            policy: Key::new("x", "a-from-b"),
            direction: Direction::Ingress,
            index: 0,
        };
        let counters = BTreeMap::from([
            (rule_counter(&a, &rule), (7, 700)),
            (pod_counter(&a, Direction::Egress), (3, 180)),
        ]);
        let r = v.report("x/a", &counters).expect("x/a is local");
        assert_eq!(r.selected_by, vec!["x/a-from-b", "x/deny-egress"]);
        assert_eq!(r.ingress.isolated_by, vec!["x/a-from-b"]);
        assert_eq!(r.ingress.rules.len(), 1);
        assert_eq!(r.ingress.rules[0].count.packets, 7);
        assert_eq!(r.ingress.rules[0].admits[0].ports, vec!["TCP 81"]);
        assert_eq!(r.egress.isolated_by, vec!["x/deny-egress"]);
        assert!(r.egress.rules.is_empty());
        assert_eq!(r.egress.denied.as_ref().map(|c| c.packets), Some(3));
        let text = render(&r);
        for want in [
            "selected by: x/a-from-b, x/deny-egress",
            "ingress: isolated by x/a-from-b",
            "  x/a-from-b ingress[0]: 7 packets, 700 bytes",
            "egress: isolated by x/deny-egress",
            "no rule admits anything",
            "denied (no rule admits): 3 packets, 180 bytes",
        ] {
            assert!(text.contains(want), "no {want:?} in\n{text}");
        }
        // Through JSON, as the CLI gets it.
        let back: PodReport =
            serde_json::from_str(&serde_json::to_string(&r).expect("json")).expect("parses");
        assert_eq!(back, r);
        let open = v.report("y/a", &counters).expect("y/a is local");
        assert!(render(&open).contains("ingress: open"));
        assert!(v.report("x/nobody", &counters).is_err());
        assert!(v.report("no-slash", &counters).is_err());
    }
}
