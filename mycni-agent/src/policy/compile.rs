//! The compiled per-pod form: what the nftables writer will turn into sets
//! and verdict maps, with selectors and named ports already resolved.
//!
//! For each local pod and direction: open (no policy isolates it) or
//! isolated, with a list of allows, each (peer addresses and prefixes) x
//! (protocol, port range). A packet's remote end is an address, so this
//! form needs no labels any more; a label or pod change only changes its
//! member sets. Two exemptions are *not* here, because the datapath knows
//! them without a lookup: a pod talking to itself never reaches the node's
//! hooks, and the node's own traffic is told apart by hook (input/output).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::cluster::Cluster;
use crate::cluster::eval::{RuleRef, peer_matches, peers_match};
use crate::cluster::model::{
    Cidr, IpBlock, Key, Peer, Peers, Pod, Policy, PortMatch, Ports, Protocol, Rule,
};
use crate::verdict::Direction;

/// The remote ends an allow admits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerSet {
    /// Any address at all (`from`/`to` omitted).
    All,
    /// Pod addresses resolved from selectors, plus ipBlocks (each with its
    /// own excepts, which must not be merged across blocks).
    Some {
        addrs: BTreeSet<IpAddr>,
        blocks: BTreeSet<IpBlock>,
    },
}

impl PeerSet {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match self {
            PeerSet::All => true,
            PeerSet::Some { addrs, blocks } => {
                addrs.contains(&ip) || blocks.iter().any(|b| b.contains(ip))
            }
        }
    }
}

/// An inclusive port range of one protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct PortRange {
    pub protocol: Protocol,
    pub start: u16,
    pub end: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortSet {
    /// Every port of every protocol (`ports` omitted).
    All,
    /// Never empty: an allow whose ports all failed to resolve is dropped.
    Some(BTreeSet<PortRange>),
}

impl PortSet {
    pub fn contains(&self, protocol: Protocol, port: u16) -> bool {
        match self {
            PortSet::All => true,
            PortSet::Some(ranges) => ranges
                .iter()
                .any(|r| r.protocol == protocol && (r.start..=r.end).contains(&port)),
        }
    }
}

/// Traffic with a remote end in `peers` on `ports` is allowed, because of
/// `rule` (kept for counters and flow logs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allow {
    pub rule: RuleRef,
    pub peers: PeerSet,
    pub ports: PortSet,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirectionRules {
    /// No policy isolates the pod in this direction: everything passes.
    Open,
    /// Only what some allow admits passes (union over policies).
    Isolated { by: Vec<Key>, allows: Vec<Allow> },
}

impl DirectionRules {
    /// Whether a new connection with the remote end at `remote` on
    /// (`protocol`, `port`) of the server passes this direction.
    pub fn admits(&self, remote: IpAddr, protocol: Protocol, port: u16) -> bool {
        match self {
            DirectionRules::Open => true,
            DirectionRules::Isolated { allows, .. } => allows
                .iter()
                .any(|a| a.peers.contains(remote) && a.ports.contains(protocol, port)),
        }
    }
}

impl DirectionRules {
    /// The allows flattened to (remote prefix, port range) pairs, the shape
    /// of an nftables concatenated interval set: selectors become host
    /// prefixes, ipBlocks their prefixes minus excepts, "all" the two
    /// default routes and 0-65535 of each protocol. None when open. A
    /// remote end is admitted iff some element covers (its address,
    /// protocol, port). Elements may overlap (two allows naming the same
    /// address): the writer decides whether its set type merges them.
    pub fn elements(&self) -> Option<BTreeSet<(Cidr, PortRange)>> {
        let DirectionRules::Isolated { allows, .. } = self else {
            return None;
        };
        let mut out = BTreeSet::new();
        for allow in allows {
            let prefixes: Vec<Cidr> = match &allow.peers {
                PeerSet::All => ["0.0.0.0", "::"]
                    .iter()
                    .filter_map(|a| Cidr::new(a.parse().ok()?, 0))
                    .collect(),
                PeerSet::Some { addrs, blocks } => addrs
                    .iter()
                    .map(|a| Cidr::host(*a))
                    .chain(blocks.iter().flat_map(IpBlock::prefixes))
                    .collect(),
            };
            let ranges: Vec<PortRange> = match &allow.ports {
                PortSet::All => Protocol::ALL
                    .iter()
                    .map(|p| PortRange {
                        protocol: *p,
                        start: 0,
                        end: u16::MAX,
                    })
                    .collect(),
                PortSet::Some(r) => r.iter().copied().collect(),
            };
            for p in &prefixes {
                out.extend(ranges.iter().map(|r| (*p, *r)));
            }
        }
        Some(out)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledPod {
    pub pod: Key,
    /// The addresses the datapath keys this pod's rules on.
    pub ips: Vec<IpAddr>,
    pub ingress: DirectionRules,
    pub egress: DirectionRules,
}

impl CompiledPod {
    pub fn rules(&self, direction: Direction) -> &DirectionRules {
        match direction {
            Direction::Ingress => &self.ingress,
            Direction::Egress => &self.egress,
        }
    }
}

/// Every pod-network pod on `node`, compiled.
pub fn compile_node(cluster: &Cluster, node: &str) -> BTreeMap<Key, CompiledPod> {
    let mut peers = PeerCache::new();
    cluster
        .pods
        .values()
        .filter(|p| !p.host_network && p.node.as_deref() == Some(node))
        .map(|p| (p.key.clone(), compile(cluster, p, &mut peers)))
        .collect()
}

pub fn compile_pod(cluster: &Cluster, pod: &Pod) -> CompiledPod {
    compile(cluster, pod, &mut PeerCache::new())
}

/// A rule's peers, resolved once per compilation: they depend on the
/// cluster and the rule, not on the local pod, and resolving them walks
/// every pod of the cluster. A node's pods selected by one policy share
/// its rules.
type PeerCache = BTreeMap<RuleRef, PeerSet>;

fn compile(cluster: &Cluster, pod: &Pod, peers: &mut PeerCache) -> CompiledPod {
    CompiledPod {
        pod: pod.key.clone(),
        ips: pod.ips.clone(),
        ingress: direction(cluster, pod, Direction::Ingress, peers),
        egress: direction(cluster, pod, Direction::Egress, peers),
    }
}

fn direction(
    cluster: &Cluster,
    pod: &Pod,
    direction: Direction,
    peers: &mut PeerCache,
) -> DirectionRules {
    let isolating = cluster.policies_isolating(pod, direction);
    if isolating.is_empty() {
        return DirectionRules::Open;
    }
    let mut allows = Vec::new();
    for (at, policy, rule) in Cluster::rules_of(&isolating, direction) {
        let resolved = peers
            .entry(at.clone())
            .or_insert_with(|| peer_set(cluster, &policy.key.namespace, &rule.peers))
            .clone();
        compile_rule(cluster, policy, rule, resolved, pod, at, &mut allows);
    }
    DirectionRules::Isolated {
        by: isolating.iter().map(|p| p.key.clone()).collect(),
        allows,
    }
}

fn compile_rule(
    cluster: &Cluster,
    policy: &Policy,
    rule: &Rule,
    peers: PeerSet,
    local: &Pod,
    at: RuleRef,
    out: &mut Vec<Allow>,
) {
    let list = match &rule.ports {
        Ports::All => {
            out.push(Allow {
                rule: at,
                peers,
                ports: PortSet::All,
            });
            return;
        }
        Ports::Only(list) => list,
    };
    let mut fixed = BTreeSet::new();
    // Egress named ports resolve per destination pod, so each resolved
    // number gets its own allow, limited to the pods that have it.
    let mut per_port: BTreeMap<PortRange, BTreeSet<IpAddr>> = BTreeMap::new();
    for p in list {
        let range = |start, end| PortRange {
            protocol: p.protocol,
            start,
            end,
        };
        match (&p.port, at.direction) {
            (PortMatch::Any, _) => {
                fixed.insert(range(0, u16::MAX));
            }
            (PortMatch::Range { start, end }, _) => {
                fixed.insert(range(*start, *end));
            }
            // Ingress: the local pod is the destination.
            (PortMatch::Named(name), Direction::Ingress) => {
                if let Some(n) = local.named_port(name, p.protocol) {
                    fixed.insert(range(n, n));
                }
            }
            (PortMatch::Named(name), Direction::Egress) => {
                for dst in cluster.pods.values().filter(|d| !d.host_network) {
                    let Some(n) = dst.named_port(name, p.protocol) else {
                        continue;
                    };
                    for ip in &dst.ips {
                        if peers_match(cluster, &policy.key.namespace, &rule.peers, Some(dst), *ip)
                        {
                            per_port.entry(range(n, n)).or_default().insert(*ip);
                        }
                    }
                }
            }
        }
    }
    if !fixed.is_empty() {
        out.push(Allow {
            rule: at.clone(),
            peers,
            ports: PortSet::Some(fixed),
        });
    }
    for (range, addrs) in per_port {
        out.push(Allow {
            rule: at.clone(),
            peers: PeerSet::Some {
                addrs,
                blocks: BTreeSet::new(),
            },
            ports: PortSet::Some(BTreeSet::from([range])),
        });
    }
}

/// Selectors resolved to the current pod addresses; ipBlocks kept whole.
fn peer_set(cluster: &Cluster, policy_ns: &str, peers: &Peers) -> PeerSet {
    let Peers::Only(list) = peers else {
        return PeerSet::All;
    };
    let mut addrs = BTreeSet::new();
    let mut blocks = BTreeSet::new();
    for peer in list {
        match peer {
            Peer::IpBlock(b) => {
                blocks.insert(b.clone());
            }
            Peer::Pods { .. } => {
                for pod in cluster.pods.values().filter(|p| !p.host_network) {
                    for ip in &pod.ips {
                        if peer_matches(cluster, policy_ns, peer, Some(pod), *ip) {
                            addrs.insert(*ip);
                        }
                    }
                }
            }
        }
    }
    PeerSet::Some { addrs, blocks }
}
