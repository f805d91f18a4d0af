//! The reference evaluator: is a new connection from `src` to `dst` on
//! (protocol, port) allowed, and by what.
//!
//! It judges a *connection*, as the API does: its replies are allowed with
//! it, so a pod whose egress is denied still answers connections others open
//! to it. It is written to be obviously right rather than fast (it scans
//! every policy); the compiled form is what the datapath uses, and the tests
//! hold the two to the same answers.

use std::net::IpAddr;
use std::sync::Arc;

use super::Cluster;
use super::model::{Key, NamespaceScope, Peer, Peers, Pod, Policy, PortMatch, Ports, Protocol};
use crate::verdict::Direction;

/// One end of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A pod, seen at one of its addresses (the family matters for ipBlock).
    /// A hostNetwork pod is its node's stack; an unknown pod is an address.
    Pod { pod: Key, ip: IpAddr },
    /// A node's own stack (kubelet, hostNetwork pods) at one of its addresses.
    Node { node: String, ip: IpAddr },
    /// Anything else: another cluster's pod, the internet, a remote node
    /// the caller does not name.
    External(IpAddr),
}

/// Which rule of which policy allowed the connection.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct RuleRef {
    pub policy: Key,
    pub direction: Direction,
    /// Index in the object's `spec.ingress` / `spec.egress`.
    pub index: usize,
}

/// One end's say on the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judgement {
    /// This end is not a pod-network pod: NetworkPolicy has nothing to say.
    NotJudged,
    /// A pod talking to itself never leaves its network namespace.
    SamePod,
    /// A pod and its own node always talk (kubelet probes; the API docs).
    OwnNode,
    /// No policy selecting this pod isolates it in this direction.
    NotIsolated,
    /// Isolated, and these rules (the union over policies) allow it.
    Allowed(Vec<RuleRef>),
    /// Isolated by these policies and no rule of theirs allows it.
    Denied { isolated_by: Vec<Key> },
}

impl Judgement {
    pub fn allows(&self) -> bool {
        !matches!(self, Judgement::Denied { .. })
    }
}

/// Both ends must allow: the source's egress AND the destination's ingress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub egress: Judgement,
    pub ingress: Judgement,
}

impl Verdict {
    pub fn is_allowed(&self) -> bool {
        self.egress.allows() && self.ingress.allows()
    }
}

/// An endpoint resolved against the cluster.
#[derive(Debug, Clone, Copy)]
struct Side<'a> {
    /// Only pod-network pods: selectors never see hostNetwork pods.
    pod: Option<&'a Pod>,
    node: Option<&'a str>,
    ip: IpAddr,
}

fn side<'a>(cluster: &'a Cluster, ep: &'a Endpoint) -> Side<'a> {
    match ep {
        Endpoint::Pod { pod, ip } => match cluster.pods.get(pod) {
            Some(p) if p.host_network => Side {
                pod: None,
                node: p.node.as_deref(),
                ip: *ip,
            },
            Some(p) => Side {
                pod: Some(p),
                node: p.node.as_deref(),
                ip: *ip,
            },
            None => Side {
                pod: None,
                node: None,
                ip: *ip,
            },
        },
        Endpoint::Node { node, ip } => Side {
            pod: None,
            node: Some(node),
            ip: *ip,
        },
        Endpoint::External(ip) => Side {
            pod: None,
            node: None,
            ip: *ip,
        },
    }
}

/// Whether a new connection `src -> dst` on `protocol`/`port` is allowed.
pub fn allowed(
    cluster: &Cluster,
    src: &Endpoint,
    dst: &Endpoint,
    protocol: Protocol,
    port: u16,
) -> Verdict {
    allowed_with(cluster, src, dst, (protocol, port), &|pod, direction| {
        cluster.policies_isolating_shared(pod, direction)
    })
}

/// [`allowed`], asking `isolating` which policies isolate a pod: a caller
/// judging many connections of the same pods keeps the answers (finding
/// them matches every policy of the pod's namespace against its labels).
pub(crate) fn allowed_with(
    cluster: &Cluster,
    src: &Endpoint,
    dst: &Endpoint,
    (protocol, port): (Protocol, u16),
    isolating: Isolating,
) -> Verdict {
    let (s, d) = (side(cluster, src), side(cluster, dst));
    if let (Some(a), Some(b)) = (s.pod, d.pod)
        && a.key == b.key
    {
        return Verdict {
            egress: Judgement::SamePod,
            ingress: Judgement::SamePod,
        };
    }
    let ask = Ask {
        cluster,
        isolating,
        conn: Conn {
            dst: d.pod,
            protocol,
            port,
        },
    };
    Verdict {
        egress: judge(&ask, Direction::Egress, s, d),
        ingress: judge(&ask, Direction::Ingress, d, s),
    }
}

/// The policies isolating a pod in a direction (`Cluster::policies_isolating_shared`,
/// or a caller's copy of its answers).
pub(crate) type Isolating<'a> = &'a dyn Fn(&Pod, Direction) -> Vec<Arc<Policy>>;

/// One connection judged in both directions.
struct Ask<'a> {
    cluster: &'a Cluster,
    isolating: Isolating<'a>,
    conn: Conn<'a>,
}

/// What a port rule is checked against; named ports resolve on `dst`.
struct Conn<'a> {
    dst: Option<&'a Pod>,
    protocol: Protocol,
    port: u16,
}

fn judge(ask: &Ask, direction: Direction, local: Side, remote: Side) -> Judgement {
    let Some(pod) = local.pod else {
        return Judgement::NotJudged;
    };
    if remote.pod.is_none() && remote.node.is_some() && remote.node == pod.node.as_deref() {
        return Judgement::OwnNode;
    }
    let held = (ask.isolating)(pod, direction);
    if held.is_empty() {
        return Judgement::NotIsolated;
    }
    let isolating: Vec<&Policy> = held.iter().map(|p| &**p).collect();
    let by: Vec<RuleRef> = Cluster::rules_of(&isolating, direction)
        .filter(|(_, policy, rule)| {
            peers_match(
                ask.cluster,
                &policy.key.namespace,
                &rule.peers,
                remote.pod,
                remote.ip,
            ) && ports_match(&rule.ports, &ask.conn)
        })
        .map(|(at, _, _)| at)
        .collect();
    if by.is_empty() {
        Judgement::Denied {
            isolated_by: isolating.iter().map(|p| p.key.clone()).collect(),
        }
    } else {
        Judgement::Allowed(by)
    }
}

fn ports_match(ports: &Ports, conn: &Conn) -> bool {
    match ports {
        Ports::All => true,
        Ports::Only(list) => list.iter().any(|p| {
            p.protocol == conn.protocol
                && match &p.port {
                    PortMatch::Any => true,
                    PortMatch::Range { start, end } => (*start..=*end).contains(&conn.port),
                    PortMatch::Named(name) => {
                        conn.dst.and_then(|d| d.named_port(name, conn.protocol)) == Some(conn.port)
                    }
                }
        }),
    }
}

/// Whether the remote end (a pod-network pod or not, at `ip`) is one of
/// `peers` for a policy living in `policy_ns`.
pub(crate) fn peers_match(
    cluster: &Cluster,
    policy_ns: &str,
    peers: &Peers,
    remote: Option<&Pod>,
    ip: IpAddr,
) -> bool {
    match peers {
        Peers::All => true,
        Peers::Only(list) => list
            .iter()
            .any(|peer| peer_matches(cluster, policy_ns, peer, remote, ip)),
    }
}

pub(crate) fn peer_matches(
    cluster: &Cluster,
    policy_ns: &str,
    peer: &Peer,
    remote: Option<&Pod>,
    ip: IpAddr,
) -> bool {
    match peer {
        // ipBlock looks at the address only, so it matches pods, nodes and
        // hostNetwork pods alike.
        Peer::IpBlock(block) => block.contains(ip),
        Peer::Pods { namespaces, pods } => remote.is_some_and(|p| {
            let ns_ok = match namespaces {
                NamespaceScope::PolicyNamespace => p.key.namespace == policy_ns,
                NamespaceScope::Selected(sel) => {
                    sel.matches(&cluster.namespace_labels(&p.key.namespace))
                }
            };
            ns_ok && pods.matches(&p.labels)
        }),
    }
}
