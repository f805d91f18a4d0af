//! Who is behind an address, and which policies decided: what turns an
//! observation into a record worth reading.
//!
//! Cheap on the way in, rich on the way out: a datapath event costs two
//! map lookups here (its ends, resolved now because a pod may be gone when
//! the record is read); the JSON is built only when someone reads it. A
//! policy verdict (far rarer: new connections of isolated pods, and drops
//! at most once a second per flow) is attributed at once, against the
//! policies in force when it was logged.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use mycni_common::DpPath;
use mycni_common::flow::{FLOW_DROP, FLOW_NEW, FlowEvent, FlowSource};

use super::record::{Endpoint, Flow, Interface, Ip, L4, Line, PolicyRef, TcpFlags};
use super::{NftLog, NftVerdict, NodeAddrs, Observation};
use crate::cluster::{Cluster, Endpoint as PolicyEnd, Judgement, Key, Pod, Policy, Protocol};
use crate::verdict::Direction;
use crate::verdict::Reason;

/// One end of a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Who {
    /// The policy room's own copy, shared: naming a pod costs a pointer,
    /// and a record keeps the pod as it was.
    Pod(Arc<Pod>),
    /// This node's own stack.
    Host,
    /// Another node's own stack: its host address, or its `vxlan.1` one
    /// (the first address of its podCIDR), which its traffic to pods
    /// comes from.
    Node(Arc<str>),
    World,
}

impl Who {
    pub fn pod(&self) -> Option<&Pod> {
        match self {
            Who::Pod(p) => Some(p),
            _ => None,
        }
    }

    fn endpoint(&self, node: &str) -> Endpoint {
        match self {
            Who::Pod(p) => Endpoint {
                namespace: p.key.namespace.clone(),
                pod_name: p.key.name.clone(),
                // Hubble's spelling.
                labels: p
                    .labels
                    .iter()
                    .map(|(k, v)| format!("k8s:{k}={v}"))
                    .collect(),
                node_name: p.node.clone().unwrap_or_default(),
            },
            Who::Host => Endpoint {
                labels: vec!["reserved:host".into()],
                node_name: node.to_string(),
                ..Endpoint::default()
            },
            Who::Node(name) => Endpoint {
                labels: vec!["reserved:remote-node".into()],
                node_name: name.to_string(),
                ..Endpoint::default()
            },
            Who::World => Endpoint {
                labels: vec!["reserved:world".into()],
                ..Endpoint::default()
            },
        }
    }
}

/// The cluster as the policy room last saw it, indexed for lookups by
/// address.
#[derive(Default)]
pub struct Directory {
    pub cluster: Arc<Cluster>,
    by_ip: HashMap<IpAddr, Arc<Pod>>,
    /// This node's own addresses.
    pub host_ips: HashSet<IpAddr>,
    /// The other nodes' own addresses.
    nodes: Arc<NodeAddrs>,
    /// The policies named for a verdict, per connection shape: a verdict
    /// is attributed by evaluating every policy in force (200 us at 1,000
    /// policies, 66 us with a 10,000-prefix ipBlock: measured in
    /// `policy::nft::scale`), and a node logs one per new connection of an
    /// isolated pod, mostly between the same pairs on the same ports. The
    /// answer depends only on the cluster, which this directory is built
    /// from and dies with.
    attributed: Mutex<HashMap<Shape, Attribution>>,
    /// The policies isolating each pod, per direction, as attributions
    /// found them: a connection shape seen for the first time (a port
    /// scan, a new client) then costs its rules, not a match of every
    /// policy of the namespace against both ends' labels (187 us at 1,000
    /// policies).
    isolated: Mutex<HashMap<Key, Isolated>>,
}

/// A pod's isolating policies, ingress and egress, once asked for.
type Isolated = [Option<Vec<Arc<Policy>>>; 2];

/// What a verdict's attribution depends on besides the cluster: the ends
/// (their addresses name them in this directory), protocol, destination
/// port (named ports resolve on the destination pod), direction, and
/// whether it is an allow or a drop.
type Shape = (IpAddr, IpAddr, u8, u16, Direction, bool);

/// The policies that decided, and for a drop whether the packet was its
/// connection's reply (the isolated pod is the packet's other end).
type Attribution = (Arc<[PolicyRef]>, bool);

/// Shapes kept per directory: past it the cache starts over, so a scan
/// across many pairs costs what it did without one and no more memory.
const ATTRIBUTED_MAX: usize = 4096;

impl Directory {
    pub fn new(cluster: Arc<Cluster>, host_ips: HashSet<IpAddr>) -> Self {
        let mut by_ip = HashMap::new();
        for pod in cluster.pods.values().filter(|p| !p.host_network) {
            for ip in &pod.ips {
                by_ip.insert(*ip, pod.clone());
            }
        }
        Directory {
            cluster,
            by_ip,
            host_ips,
            nodes: Arc::default(),
            attributed: Mutex::default(),
            isolated: Mutex::default(),
        }
    }

    /// The directory, naming the other nodes' addresses too.
    pub(crate) fn with_nodes(mut self, nodes: Arc<NodeAddrs>) -> Self {
        self.set_nodes(nodes);
        self
    }

    /// Names the other nodes' addresses from now on (the attributions
    /// kept do not depend on them).
    pub(crate) fn set_nodes(&mut self, nodes: Arc<NodeAddrs>) {
        self.nodes = nodes;
    }

    pub fn who(&self, ip: IpAddr) -> Who {
        match self.by_ip.get(&ip) {
            Some(p) => Who::Pod(p.clone()),
            None if self.host_ips.contains(&ip) => Who::Host,
            None => match self.nodes.get(&ip) {
                Some(name) => Who::Node(name.clone()),
                None => Who::World,
            },
        }
    }

    /// Turns what a source saw into a record.
    pub fn record(&self, o: Observation) -> Record {
        match o {
            Observation::Datapath { at, event } => self.datapath(at, event),
            Observation::Nft(log) => self.nft(log),
        }
    }

    fn datapath(&self, at: SystemTime, e: FlowEvent) -> Record {
        let (src, dst) = addrs(&e);
        Record {
            at,
            src,
            dst,
            sport: e.sport,
            dport: e.dport,
            proto: e.proto,
            tcp_flags: e.tcp_flags,
            ifindex: e.ifindex,
            count: e.count,
            from: self.who(src),
            to: self.who(dst),
            what: What::Datapath {
                kind: e.kind,
                source: FlowSource::from_u8(e.source),
                reason: e.reason,
            },
        }
    }

    fn nft(&self, log: NftLog) -> Record {
        let (from, to) = (self.who(log.src), self.who(log.dst));
        let none: Arc<[PolicyRef]> = Arc::new([]);
        let (mut allowed_by, mut denied_by, mut reply) = (none.clone(), none, false);
        match log.verdict {
            NftVerdict::PolicyAllow { direction } => {
                (allowed_by, _) = self.attributed(&log, direction, true, || {
                    (self.allowed_by(&log, &from, &to, direction), false)
                });
            }
            NftVerdict::PolicyDrop { direction, .. } => {
                (denied_by, reply) = self.attributed(&log, direction, false, || {
                    self.isolating(&from, &to, direction)
                });
            }
            NftVerdict::UnderlayDrop => {}
        }
        Record {
            at: log.at,
            src: log.src,
            dst: log.dst,
            sport: log.sport,
            dport: log.dport,
            proto: log.proto,
            tcp_flags: log.tcp_flags,
            ifindex: if log.in_ifindex != 0 {
                log.in_ifindex
            } else {
                log.out_ifindex
            },
            count: log.count.max(1),
            from,
            to,
            what: What::Nft {
                verdict: log.verdict,
                allowed_by,
                denied_by,
                reply,
            },
        }
    }

    /// `attribute`'s answer for `log`'s shape, from the cache when this
    /// directory has already given it.
    fn attributed(
        &self,
        log: &NftLog,
        d: Direction,
        allow: bool,
        attribute: impl FnOnce() -> (Vec<PolicyRef>, bool),
    ) -> Attribution {
        let shape = (log.src, log.dst, log.proto, log.dport, d, allow);
        let mut cache = self.attributed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(a) = cache.get(&shape) {
            return a.clone();
        }
        let (by, reply) = attribute();
        let a: Attribution = (by.into(), reply);
        if cache.len() >= ATTRIBUTED_MAX {
            cache.clear();
        }
        cache.insert(shape, a.clone());
        a
    }

    /// The policies isolating `pod` in `d`, kept for this directory's life
    /// (they depend on the cluster alone); started over past
    /// `ATTRIBUTED_MAX` pods, as the attributions are.
    fn isolating_policies(&self, pod: &Pod, d: Direction) -> Vec<Arc<Policy>> {
        let slot = match d {
            Direction::Ingress => 0,
            Direction::Egress => 1,
        };
        let mut memo = self.isolated.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(Some(p)) = memo.get(&pod.key).map(|e| &e[slot]) {
            return p.clone();
        }
        let found = self.cluster.policies_isolating_shared(pod, d);
        if memo.len() >= ATTRIBUTED_MAX {
            memo.clear();
        }
        memo.entry(pod.key.clone()).or_default()[slot] = Some(found.clone());
        found
    }

    /// The rules that admitted a new connection in `direction`, as the
    /// semantics name them (the table's verdict is the fact; this says
    /// which rules of the policies in force grant it).
    fn allowed_by(&self, log: &NftLog, from: &Who, to: &Who, d: Direction) -> Vec<PolicyRef> {
        let Some(protocol) = protocol(log.proto) else {
            return Vec::new();
        };
        let end = |who: &Who, ip: IpAddr| match who {
            Who::Pod(p) => PolicyEnd::Pod {
                pod: p.key.clone(),
                ip,
            },
            _ => PolicyEnd::External(ip),
        };
        let v = crate::cluster::allowed_with(
            &self.cluster,
            &end(from, log.src),
            &end(to, log.dst),
            (protocol, log.dport),
            &|pod, d| self.isolating_policies(pod, d),
        );
        let judged = match d {
            Direction::Egress => v.egress,
            Direction::Ingress => v.ingress,
        };
        match judged {
            Judgement::Allowed(rules) => rules
                .into_iter()
                .map(|r| policy_ref(&r.policy, Some(r.index)))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The policies isolating the pod whose isolation in `d` dropped the
    /// packet: the sender for egress, the receiver for ingress; or the
    /// other end, for a reply the table cut (the table judges a reply as
    /// its connection), and then true.
    fn isolating(&self, from: &Who, to: &Who, d: Direction) -> (Vec<PolicyRef>, bool) {
        let (first, second) = match d {
            Direction::Egress => (from, to),
            Direction::Ingress => (to, from),
        };
        for (who, reply) in [(first, false), (second, true)] {
            let Some(meta) = who.pod() else { continue };
            let Some(pod) = self.cluster.pods.get(&meta.key) else {
                continue;
            };
            let by: Vec<PolicyRef> = self
                .isolating_policies(pod, d)
                .iter()
                .map(|p| policy_ref(&p.key, None))
                .collect();
            if !by.is_empty() {
                return (by, reply);
            }
        }
        (Vec::new(), false)
    }
}

fn policy_ref(key: &Key, rule: Option<usize>) -> PolicyRef {
    PolicyRef {
        name: key.name.clone(),
        namespace: key.namespace.clone(),
        kind: "NetworkPolicy".into(),
        rule,
    }
}

fn protocol(p: u8) -> Option<Protocol> {
    match p {
        6 => Some(Protocol::Tcp),
        17 => Some(Protocol::Udp),
        132 => Some(Protocol::Sctp),
        _ => None,
    }
}

fn addrs(e: &FlowEvent) -> (IpAddr, IpAddr) {
    if e.family == 6 {
        (IpAddr::from(e.src), IpAddr::from(e.dst))
    } else {
        let four = |a: &[u8; 16]| IpAddr::from([a[0], a[1], a[2], a[3]]);
        (four(&e.src), four(&e.dst))
    }
}

/// What the store keeps of one observation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub at: SystemTime,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    pub tcp_flags: u8,
    pub ifindex: u32,
    pub count: u32,
    pub from: Who,
    pub to: Who,
    pub what: What,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum What {
    Datapath {
        kind: u8,
        source: Option<FlowSource>,
        reason: u16,
    },
    Nft {
        verdict: NftVerdict,
        allowed_by: Arc<[PolicyRef]>,
        denied_by: Arc<[PolicyRef]>,
        /// The packet is its connection's reply: the isolated pod is the
        /// packet's other end (a live connection a policy change cut).
        reply: bool,
    },
}

/// Names a record needs that the record does not hold.
pub trait Names {
    /// The kernel's name of a drop reason number (`IP_RPFILTER`).
    fn drop_reason(&self, n: u16) -> String;
    /// An interface's name, if known.
    fn interface(&self, ifindex: u32) -> String;
}

impl Record {
    pub(crate) fn is_drop(&self) -> bool {
        match &self.what {
            What::Datapath { kind, .. } => *kind == FLOW_DROP,
            What::Nft { verdict, .. } => !matches!(verdict, NftVerdict::PolicyAllow { .. }),
        }
    }

    /// For a policy drop: the pod end whose isolation dropped it, the
    /// other end, the other end's address and the connection's port.
    pub fn isolated(&self) -> Option<(&Who, &Who, IpAddr, u16)> {
        let What::Nft {
            verdict: NftVerdict::PolicyDrop { direction, .. },
            reply,
            ..
        } = &self.what
        else {
            return None;
        };
        let (client, server) = (
            (&self.from, self.src, self.sport),
            (&self.to, self.dst, self.dport),
        );
        // A reply runs server -> client: swap back to the connection's way.
        let (client, server) = if *reply {
            (server, client)
        } else {
            (client, server)
        };
        let port = server.2;
        Some(match direction {
            Direction::Egress => (client.0, server.0, server.1, port),
            Direction::Ingress => (server.0, client.0, client.1, port),
        })
    }

    /// The record as served.
    pub fn line(&self, node: &str, names: &dyn Names) -> Line {
        let time = rfc3339(self.at);
        let v6 = self.src.is_ipv6();
        let mut f = Flow {
            time: time.clone(),
            verdict: if self.is_drop() {
                "DROPPED"
            } else {
                "FORWARDED"
            }
            .into(),
            ip: Ip {
                source: self.src.to_string(),
                destination: self.dst.to_string(),
                ip_version: if v6 { "IPv6" } else { "IPv4" }.into(),
            },
            l4: match self.proto {
                6 => Some(L4::Tcp {
                    source_port: self.sport,
                    destination_port: self.dport,
                    flags: TcpFlags::from_byte(self.tcp_flags),
                }),
                17 => Some(L4::Udp {
                    source_port: self.sport,
                    destination_port: self.dport,
                }),
                132 => Some(L4::Sctp {
                    source_port: self.sport,
                    destination_port: self.dport,
                }),
                1 => Some(L4::Icmpv4 {}),
                58 => Some(L4::Icmpv6 {}),
                _ => None,
            },
            source: self.from.endpoint(node),
            destination: self.to.endpoint(node),
            node_name: node.to_string(),
            interface: (self.ifindex != 0).then(|| Interface {
                index: self.ifindex,
                name: names.interface(self.ifindex),
            }),
            count: self.count,
            ..Flow::default()
        };
        match &self.what {
            What::Datapath {
                kind,
                source,
                reason,
            } => {
                f.trace_observation_point = match source {
                    Some(FlowSource::Pod) => "FROM_ENDPOINT",
                    Some(FlowSource::Vxlan) => "FROM_OVERLAY",
                    Some(FlowSource::Underlay) => "FROM_NETWORK",
                    Some(FlowSource::KernelDrop) | None => "FROM_STACK",
                }
                .into();
                f.event = match *kind {
                    FLOW_NEW => "new",
                    FLOW_DROP => "drop",
                    _ => "path",
                }
                .into();
                if *kind == FLOW_DROP {
                    f.drop_reason_desc = Some(names.drop_reason(*reason));
                } else if let Some(p) = DpPath::ALL.get(usize::from(*reason)) {
                    if p.is_fast() {
                        f.path = Some(p.name().into());
                    } else {
                        f.path = Some("kernel".into());
                        f.path_reason = Some(p.name().into());
                    }
                }
            }
            What::Nft {
                verdict,
                allowed_by,
                denied_by,
                reply,
            } => {
                f.is_reply = Some(*reply);
                f.trace_observation_point = "FROM_STACK".into();
                f.event = "verdict".into();
                match *verdict {
                    NftVerdict::PolicyAllow { direction } => {
                        f.traffic_direction = Some(direction_name(direction).into());
                        match direction {
                            Direction::Egress => f.egress_allowed_by = allowed_by.to_vec(),
                            Direction::Ingress => f.ingress_allowed_by = allowed_by.to_vec(),
                        }
                    }
                    NftVerdict::PolicyDrop { direction, reason } => {
                        f.traffic_direction = Some(direction_name(direction).into());
                        f.drop_reason_desc = Some(policy_reason(reason).into());
                        match direction {
                            Direction::Egress => f.egress_denied_by = denied_by.to_vec(),
                            Direction::Ingress => f.ingress_denied_by = denied_by.to_vec(),
                        }
                    }
                    NftVerdict::UnderlayDrop => {
                        f.drop_reason_desc = Some("UNDERLAY_NOT_PEER".into());
                    }
                }
            }
        }
        f.summary = summary(&f);
        Line {
            flow: f,
            node_name: node.to_string(),
            time,
        }
    }
}

fn direction_name(d: Direction) -> &'static str {
    match d {
        Direction::Egress => "EGRESS",
        Direction::Ingress => "INGRESS",
    }
}

/// Hubble's name for a policy drop is POLICY_DENIED; the two fail-closed
/// cases get names of their own so they are not mistaken for a rule.
pub(crate) fn policy_reason(r: Reason) -> &'static str {
    match r {
        Reason::Denied => "POLICY_DENIED",
        Reason::NotJudged => "POLICY_NOT_JUDGED_YET",
        Reason::Invalid => "POLICY_NO_CONNECTION",
    }
}

fn summary(f: &Flow) -> String {
    match &f.l4 {
        Some(L4::Tcp { flags, .. }) => format!("TCP Flags: {}", flags.summary()),
        Some(L4::Udp { .. }) => "UDP".into(),
        Some(L4::Sctp { .. }) => "SCTP".into(),
        Some(L4::Icmpv4 {}) => "ICMPv4".into(),
        Some(L4::Icmpv6 {}) => "ICMPv6".into(),
        None => String::new(),
    }
}

/// RFC 3339, UTC, nanoseconds: Hubble's `time`.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    match k8s_openapi::jiff::Timestamp::try_from(t) {
        Ok(ts) => format!("{ts:.9}"),
        Err(_) => "1970-01-01T00:00:00.000000000Z".into(),
    }
}
