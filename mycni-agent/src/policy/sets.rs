//! The policy room's desired state: the members of the nftables sets that
//! decide this node's pods' connections, computed from the compiled pods
//! and nothing else (tested without root).
//!
//! The ruleset itself never changes (`nft.rs`): a pod, label, namespace or
//! policy event only changes these members. Per family:
//!
//! - `eg_iso` / `in_iso`: local pod addresses isolated for egress /
//!   ingress (some policy selecting the pod has that direction);
//! - `eg_allow` / `in_allow`: (remote prefix, local address, protocol,
//!   port range) of the other end's port: for egress the server's, for
//!   ingress the local pod's own, after DNAT; maps, each element to the
//!   counter of the first rule admitting it (`counters.rs`);
//! - `eg_any` / `in_any`: (remote prefix, local address) admitted on every
//!   protocol and port (a rule without `ports`: ICMP echo too); maps to
//!   counters likewise.
//!
//!   The remote prefix comes first because the kernel's concatenated
//!   interval sets (pipapo) match field by field and then walk every
//!   element the field matched: a local pod's address matches all of its
//!   elements (10,000 for a 10,000-prefix ipBlock: ~90 us a lookup, a
//!   connect() 274 us instead of 86), the remote prefix one or a few;
//! - `eg_deny` / `in_deny`: each isolated local address to its pod's
//!   counter of what no rule admits;
//! - `self`: (address, address) of every local pod, its own connections
//!   through its Service (the hairpin) pass as connections to its own IP do;
//! - `known`: the local pod addresses the room knows the Pod of. Once any
//!   NetworkPolicy exists, a pod interface's traffic from or to an address
//!   outside it is dropped (fail closed: a pod the agent has not judged yet
//!   may be one a policy isolates); with no policy at all, it holds both
//!   default routes.
//!
//! Interval sets of concatenations must not hold overlapping elements (the
//! kernel refuses an insert that overlaps another), while rules overlap
//! freely (a /32 inside an allowed /16, port 80 inside 53-90, the same
//! peer allowed by two policies): elements are made disjoint in `split`,
//! by giving each address region the union of the ports of every prefix
//! covering it, cut where the first rule admitting them changes.

mod split;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::compile::{Allow, CompiledPod, DirectionRules, PeerSet, PortSet};
use super::counters::{Series, comment, pod_counter, rule_counter, rule_name};
use crate::cluster::eval::RuleRef;
use crate::cluster::model::{Cidr, IpBlock, Key, Protocol};
use crate::verdict::Direction;

/// One set of the table, as its name in nftables reads (`eg_allow4`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SetName {
    pub kind: SetKind,
    pub v6: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SetKind {
    EgIso,
    InIso,
    EgAllow,
    InAllow,
    EgAny,
    InAny,
    SelfPair,
    Known,
    EgDeny,
    InDeny,
}

impl SetKind {
    pub const ALL: [SetKind; 10] = [
        SetKind::EgIso,
        SetKind::InIso,
        SetKind::EgAllow,
        SetKind::InAllow,
        SetKind::EgAny,
        SetKind::InAny,
        SetKind::SelfPair,
        SetKind::Known,
        SetKind::EgDeny,
        SetKind::InDeny,
    ];

    /// Its members map to a named counter (`key : "name"`).
    pub fn counts(self) -> bool {
        matches!(
            self,
            SetKind::EgAllow
                | SetKind::InAllow
                | SetKind::EgAny
                | SetKind::InAny
                | SetKind::EgDeny
                | SetKind::InDeny
        )
    }

    fn stem(self) -> &'static str {
        match self {
            SetKind::EgIso => "eg_iso",
            SetKind::InIso => "in_iso",
            SetKind::EgAllow => "eg_allow",
            SetKind::InAllow => "in_allow",
            SetKind::EgAny => "eg_any",
            SetKind::InAny => "in_any",
            SetKind::SelfPair => "self",
            SetKind::Known => "known",
            SetKind::EgDeny => "eg_deny",
            SetKind::InDeny => "in_deny",
        }
    }

    fn deny(d: Direction) -> SetKind {
        match d {
            Direction::Egress => SetKind::EgDeny,
            Direction::Ingress => SetKind::InDeny,
        }
    }

    fn iso(d: Direction) -> SetKind {
        match d {
            Direction::Egress => SetKind::EgIso,
            Direction::Ingress => SetKind::InIso,
        }
    }

    fn allow(d: Direction) -> SetKind {
        match d {
            Direction::Egress => SetKind::EgAllow,
            Direction::Ingress => SetKind::InAllow,
        }
    }

    fn any(d: Direction) -> SetKind {
        match d {
            Direction::Egress => SetKind::EgAny,
            Direction::Ingress => SetKind::InAny,
        }
    }
}

impl std::fmt::Display for SetName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", self.kind.stem(), if self.v6 { 6 } else { 4 })
    }
}

/// Every set's members, as nftables element text (`10.244.1.5 .
/// 10.244.0.0/16 . tcp . 80-81 : "r…"`): canonical, so two desired states
/// compare and diff as plain string sets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    pub sets: BTreeMap<SetName, BTreeSet<String>>,
    /// Local pods isolated in some direction, for the metrics and the log.
    pub isolated: BTreeSet<Key>,
    /// The named counters the maps' members point at, by name.
    pub counters: BTreeMap<String, Counter>,
}

/// A named counter of the table (`counters.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counter {
    /// Its nft comment: whose and what, readable in `nft list`.
    pub comment: String,
    /// What its packets count for in the metrics.
    pub series: Vec<Series>,
}

impl Desired {
    pub fn members(&self, name: SetName) -> impl Iterator<Item = &String> {
        self.sets.get(&name).into_iter().flatten()
    }

    pub fn len(&self) -> usize {
        self.sets.values().map(BTreeSet::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn add(&mut self, kind: SetKind, v6: bool, element: String) {
        self.sets
            .entry(SetName { kind, v6 })
            .or_default()
            .insert(element);
    }

    /// Counters of `self` not in `other`.
    pub(crate) fn counters_minus<'a>(&'a self, other: &Desired) -> Vec<(&'a String, &'a Counter)> {
        self.counters
            .iter()
            .filter(|(name, _)| !other.counters.contains_key(*name))
            .collect()
    }

    /// Members of `self` not in `other`, per set.
    pub(crate) fn minus<'a>(&'a self, other: &'a Desired) -> BTreeMap<SetName, Vec<&'a String>> {
        let mut out = BTreeMap::new();
        for (name, mine) in &self.sets {
            let theirs = other.sets.get(name);
            let gone: Vec<&String> = mine
                .iter()
                .filter(|e| !theirs.is_some_and(|t| t.contains(*e)))
                .collect();
            if !gone.is_empty() {
                out.insert(*name, gone);
            }
        }
        out
    }
}

fn proto_name(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
    }
}

fn default_route(v6: bool) -> Cidr {
    let any: IpAddr = if v6 {
        std::net::Ipv6Addr::UNSPECIFIED.into()
    } else {
        std::net::Ipv4Addr::UNSPECIFIED.into()
    };
    Cidr::new(any, 0).unwrap_or_else(|| Cidr::host(any))
}

/// The set members for the pods of this node. `fail_closed`: some
/// NetworkPolicy exists, so pods the room does not know are cut off.
pub fn desired(compiled: &BTreeMap<Key, CompiledPod>, fail_closed: bool) -> Desired {
    let mut out = Desired::default();
    if !fail_closed {
        for v6 in [false, true] {
            out.add(SetKind::Known, v6, default_route(v6).to_string());
        }
    }
    for pod in compiled.values() {
        for ip in &pod.ips {
            let v6 = ip.is_ipv6();
            out.add(SetKind::SelfPair, v6, format!("{ip} . {ip}"));
            if fail_closed {
                out.add(SetKind::Known, v6, Cidr::host(*ip).to_string());
            }
            for d in [Direction::Egress, Direction::Ingress] {
                if let DirectionRules::Isolated { by, allows } = pod.rules(d) {
                    out.isolated.insert(pod.pod.clone());
                    out.add(SetKind::iso(d), v6, ip.to_string());
                    let denied = out.pod_counter(&pod.pod, d, by);
                    out.add(SetKind::deny(d), v6, format!("{ip} : \"{denied}\""));
                    direction(&mut out, d, &pod.pod, *ip, allows);
                }
            }
        }
    }
    out
}

impl Desired {
    /// The counter of what `rule` admits for `pod`, made on first use.
    fn rule_counter(&mut self, pod: &Key, rule: &RuleRef) -> String {
        let name = rule_counter(pod, rule);
        self.counters
            .entry(name.clone())
            .or_insert_with(|| Counter {
                comment: comment(&format!("{pod}: {}", rule_name(rule))),
                series: vec![Series::Rule {
                    policy: rule.policy.clone(),
                    direction: rule.direction,
                    index: rule.index,
                }],
            });
        name
    }

    /// The counter of what no rule of `by` admits for `pod` in `d`.
    fn pod_counter(&mut self, pod: &Key, d: Direction, by: &[Key]) -> String {
        let name = pod_counter(pod, d);
        self.counters
            .entry(name.clone())
            .or_insert_with(|| Counter {
                comment: comment(&format!("{pod}: {} denied", d.label())),
                series: by
                    .iter()
                    .map(|policy| Series::Denied {
                        policy: policy.clone(),
                        direction: d,
                    })
                    .collect(),
            });
        name
    }
}

fn direction(out: &mut Desired, d: Direction, pod: &Key, local: IpAddr, allows: &[Allow]) {
    let v6 = local.is_ipv6();
    let mut any: Vec<(Cidr, &RuleRef)> = Vec::new();
    let mut ported: Vec<split::Ported> = Vec::new();
    for allow in allows {
        let prefixes: Vec<Cidr> = match &allow.peers {
            PeerSet::All => vec![default_route(v6)],
            PeerSet::Some { addrs, blocks } => addrs
                .iter()
                .map(|a| Cidr::host(*a))
                .chain(blocks.iter().flat_map(IpBlock::prefixes))
                .filter(|c| c.addr().is_ipv6() == v6)
                .collect(),
        };
        match &allow.ports {
            PortSet::All => any.extend(prefixes.iter().map(|p| (*p, &allow.rule))),
            PortSet::Some(ranges) => {
                for r in ranges {
                    ported.extend(
                        prefixes
                            .iter()
                            .map(|p| (*p, r.protocol, r.start, r.end, &allow.rule)),
                    );
                }
            }
        }
    }
    let elements = split::split(&any, &ported);
    for (prefix, rule) in elements.any {
        let c = out.rule_counter(pod, rule);
        out.add(SetKind::any(d), v6, format!("{prefix} . {local} : \"{c}\""));
    }
    for (prefix, proto, start, end, rule) in elements.ported {
        let c = out.rule_counter(pod, rule);
        out.add(
            SetKind::allow(d),
            v6,
            format!(
                "{prefix} . {local} . {} . {start}-{end} : \"{c}\"",
                proto_name(proto)
            ),
        );
    }
}

#[cfg(test)]
mod tests;
