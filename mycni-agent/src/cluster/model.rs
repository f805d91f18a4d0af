//! The trimmed inputs: what the agent keeps of Pods, Namespaces and
//! NetworkPolicies, already validated and defaulted.
//!
//! Everything here is plain data so the evaluator and the compiler are pure
//! functions over it. The shapes make the API's traps explicit: "no peers"
//! and "no ports" are their own variants (`Peers::All`, `Ports::All`) instead
//! of an empty list, because an empty list that is the leftover of dropped
//! entries must never widen a rule into "everything".

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use crate::verdict::Direction;

/// Namespace and name of a namespaced object (Pod or NetworkPolicy).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub namespace: String,
    pub name: String,
}

impl Key {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Key {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

pub(crate) type Labels = BTreeMap<String, String>;

/// The label the API server puts on every namespace (immutable since 1.21);
/// the upstream suite selects namespaces through it.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// The three protocols NetworkPolicy defines. Anything else (ICMP, ARP,
/// neighbour discovery) is outside the API and never judged by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    pub const ALL: [Protocol; 3] = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];

    /// The API spelling; it is case-sensitive ("tcp" is rejected).
    pub fn parse(s: &str) -> Option<Protocol> {
        match s {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }
}

/// A container port as named-port resolution needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerPort {
    pub name: Option<String>,
    pub protocol: Protocol,
    pub port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    pub key: Key,
    pub labels: Labels,
    /// Both families, as `status.podIPs` lists them.
    pub ips: Vec<IpAddr>,
    pub ports: Vec<ContainerPort>,
    /// hostNetwork pods share the node's addresses: no selector matches them
    /// (they look like the node), only an ipBlock can.
    pub host_network: bool,
    /// Needed for "a pod and its own node may always talk".
    pub node: Option<String>,
}

impl Pod {
    /// The port number a named port has on this pod for `protocol`; the
    /// protocol is part of the match (a TCP rule naming a UDP port is void).
    pub(crate) fn named_port(&self, name: &str, protocol: Protocol) -> Option<u16> {
        self.ports
            .iter()
            .find(|p| p.protocol == protocol && p.name.as_deref() == Some(name))
            .map(|p| p.port)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    pub name: String,
    pub labels: Labels,
}

/// An IP prefix with its host bits cleared (as Go's `net.ParseCIDR` does,
/// which is what the API server validated the text with).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// None when the prefix is longer than the family allows.
    pub fn new(addr: IpAddr, prefix: u8) -> Option<Cidr> {
        let masked = match addr {
            IpAddr::V4(a) if prefix <= 32 => {
                let m = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
                IpAddr::V4((u32::from(a) & m).into())
            }
            IpAddr::V6(a) if prefix <= 128 => {
                let m = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
                IpAddr::V6((u128::from(a) & m).into())
            }
            _ => return None,
        };
        Some(Cidr {
            addr: masked,
            prefix,
        })
    }

    pub fn host(addr: IpAddr) -> Cidr {
        let prefix = if addr.is_ipv4() { 32 } else { 128 };
        Cidr { addr, prefix }
    }

    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// False across families: a v4 block never matches a v6 address.
    pub fn contains(&self, ip: IpAddr) -> bool {
        Cidr::new(ip, self.prefix).is_some_and(|c| c.addr == self.addr)
    }

    /// The two prefixes one bit longer that make up this one (None for a
    /// single address).
    pub(crate) fn halves(&self) -> Option<(Cidr, Cidr)> {
        let high = match self.addr {
            IpAddr::V4(a) if self.prefix < 32 => {
                IpAddr::V4((u32::from(a) | (1u32 << (31 - self.prefix))).into())
            }
            IpAddr::V6(a) if self.prefix < 128 => {
                IpAddr::V6((u128::from(a) | (1u128 << (127 - self.prefix))).into())
            }
            _ => return None,
        };
        let low = Cidr::new(self.addr, self.prefix + 1)?;
        Some((low, Cidr::new(high, self.prefix + 1)?))
    }

    /// `other` lies inside `self` and is smaller (what `except` must be).
    pub fn strictly_contains(&self, other: &Cidr) -> bool {
        other.prefix > self.prefix && self.contains(other.addr)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// `ipBlock`: the except list carves only out of this block, not out of
/// what other peers or policies allow.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct IpBlock {
    pub cidr: Cidr,
    pub except: Vec<Cidr>,
}

impl IpBlock {
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.cidr.contains(ip) && !self.except.iter().any(|e| e.contains(ip))
    }

    /// The block minus its excepts, as disjoint prefixes: a set of plain
    /// prefixes is what an nftables interval set holds, and carving the
    /// excepts out here keeps them from leaking into other peers' matches.
    /// At most (except prefix - cidr prefix) prefixes per except.
    pub fn prefixes(&self) -> Vec<Cidr> {
        let mut out = Vec::new();
        let mut todo = vec![self.cidr];
        while let Some(c) = todo.pop() {
            let covered = self
                .except
                .iter()
                .any(|e| e.prefix <= c.prefix && e.contains(c.addr));
            if covered {
                continue;
            }
            let carved = self.except.iter().any(|e| c.strictly_contains(e));
            match c.halves() {
                Some((low, high)) if carved => todo.extend([high, low]),
                _ => out.push(c),
            }
        }
        out.sort();
        out
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub operator: Operator,
    pub values: BTreeSet<String>,
}

impl Requirement {
    fn matches(&self, labels: &Labels) -> bool {
        let value = labels.get(&self.key);
        match self.operator {
            Operator::In => value.is_some_and(|v| self.values.contains(v)),
            // NotIn also matches objects without the key at all: the
            // upstream "ns NotIn [x]" case relies on it.
            Operator::NotIn => value.is_none_or(|v| !self.values.contains(v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
        }
    }
}

/// A label selector; the empty selector matches every object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    pub match_labels: Labels,
    pub match_expressions: Vec<Requirement>,
}

impl Selector {
    pub fn everything() -> Selector {
        Selector::default()
    }

    pub fn labels(pairs: &[(&str, &str)]) -> Selector {
        Selector {
            match_labels: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            match_expressions: Vec::new(),
        }
    }

    pub fn matches(&self, labels: &Labels) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| r.matches(labels))
    }
}

/// Which namespaces a pod peer looks in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamespaceScope {
    /// `podSelector` without `namespaceSelector`: the policy's own namespace.
    PolicyNamespace,
    /// `namespaceSelector` (`{}` = every namespace, still only pods).
    Selected(Selector),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// Pods selected by both selectors (AND); a missing `podSelector` next to
    /// a `namespaceSelector` is the empty selector (every pod there).
    Pods {
        namespaces: NamespaceScope,
        pods: Selector,
    },
    IpBlock(IpBlock),
}

/// `from`/`to` of a rule. Listed peers are ORed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peers {
    /// The field was omitted or empty: every source/destination, pods and
    /// any other address.
    All,
    /// Never empty (the converter guarantees it).
    Only(Vec<Peer>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortMatch {
    /// `port` omitted: every port of the protocol.
    Any,
    /// `port` with optional `endPort`, both inclusive.
    Range { start: u16, end: u16 },
    /// A container port name, resolved on the destination pod.
    Named(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortRule {
    pub protocol: Protocol,
    pub port: PortMatch,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ports {
    /// `ports` omitted or empty: every port of every protocol.
    All,
    /// Never empty (the converter guarantees it).
    Only(Vec<PortRule>),
}

/// One ingress or egress rule: peers AND ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub peers: Peers,
    pub ports: Ports,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub key: Key,
    pub pod_selector: Selector,
    /// After defaulting: whether this policy isolates its pods for ingress.
    pub isolates_ingress: bool,
    pub isolates_egress: bool,
    /// Rules that survived validation, with their index in the object so a
    /// verdict can name `spec.ingress[i]` even when a neighbour was dropped.
    pub ingress: Vec<(usize, Rule)>,
    pub egress: Vec<(usize, Rule)>,
}

impl Policy {
    pub fn isolates(&self, direction: Direction) -> bool {
        match direction {
            Direction::Ingress => self.isolates_ingress,
            Direction::Egress => self.isolates_egress,
        }
    }

    pub fn rules(&self, direction: Direction) -> &[(usize, Rule)] {
        match direction {
            Direction::Ingress => &self.ingress,
            Direction::Egress => &self.egress,
        }
    }
}
