//! k8s-openapi objects -> the trimmed model, defaulting and validating the
//! way the API server does.
//!
//! Every problem reported here is one the API server's validation rejects,
//! so it only shows up with objects that skipped it (a fixture, an old
//! stored object, a hand-written test). The agent must still never panic
//! on them and must fail *closed*:
//! - a broken rule is dropped whole, so it allows nothing (dropping only its
//!   bad peer or port could leave an empty list, which means "everything");
//! - a policy whose podSelector or policyTypes cannot be read is rejected,
//!   since which pods it isolates is unknown. That one fails open for the
//!   pods it meant to isolate: the caller logs it loudly.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::networking::v1 as net;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use thiserror::Error;

use crate::watch::Converters;

use super::model::{
    Cidr, ContainerPort, IpBlock, Key, Labels, NAMESPACE_NAME_LABEL, Namespace, NamespaceScope,
    Operator, Peer, Peers, Pod, Policy, PortMatch, PortRule, Ports, Protocol, Requirement, Rule,
    Selector,
};

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProblemKind {
    #[error("metadata.name or metadata.namespace missing")]
    MissingMetadata,
    #[error("unknown selector operator {0:?}")]
    BadOperator(String),
    #[error("operator {0:?} needs values")]
    MissingValues(String),
    #[error("operator {0:?} takes no values")]
    UnexpectedValues(String),
    #[error("unknown policy type {0:?}")]
    BadPolicyType(String),
    #[error("peer sets none of podSelector, namespaceSelector, ipBlock")]
    EmptyPeer,
    #[error("peer sets ipBlock together with a selector")]
    IpBlockWithSelector,
    #[error("invalid CIDR {0:?}")]
    BadCidr(String),
    #[error("except {except} is not strictly inside {cidr}")]
    ExceptOutside { except: String, cidr: String },
    #[error("unknown protocol {0:?} (TCP, UDP, SCTP)")]
    BadProtocol(String),
    #[error("port {0} outside 1-65535")]
    BadPort(i64),
    #[error("invalid port name {0:?}")]
    BadPortName(String),
    #[error("endPort without a numeric port")]
    EndPortWithoutNumericPort,
    #[error("endPort {end} below port {port}")]
    EndPortBelowPort { port: i32, end: i32 },
    #[error("invalid IP {0:?}")]
    BadIp(String),
}

/// What was wrong and where (a JSON-ish path into the object).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{at}: {kind}")]
pub struct Problem {
    pub at: String,
    pub kind: ProblemKind,
}

fn problem(at: impl Into<String>, kind: ProblemKind) -> Problem {
    Problem {
        at: at.into(),
        kind,
    }
}

/// A converted object plus what was dropped from it on the way.
#[derive(Debug, Clone, PartialEq)]
pub struct Converted<T> {
    pub value: T,
    pub dropped: Vec<Problem>,
}

/// What the policy room reads of one object: its model, converted once
/// when the object arrived, with the parts that could not be read; or why
/// none of it could.
pub type Read<T> = Result<Converted<Arc<T>>, Rejected>;

/// An object the model cannot hold, and its name for the report.
pub struct Rejected {
    pub name: Option<String>,
    pub problem: Problem,
}

/// How the policy watch keeps each kind: converted as it arrives, the
/// typed object dropped (`watch::cache`).
pub(crate) const WATCHED: Converters<Read<Pod>, Read<Namespace>, Read<Policy>> = Converters {
    pod: |p| read(p, pod_from_k8s(p)),
    namespace: |n| {
        let c = namespace_from_k8s(n).map(|value| Converted {
            value,
            dropped: Vec::new(),
        });
        read(n, c)
    },
    policy: |p| read(p, policy_from_k8s(p)),
};

fn read<K: kube::Resource, T>(o: &K, c: Result<Converted<T>, Problem>) -> Read<T> {
    match c {
        Ok(c) => Ok(Converted {
            value: Arc::new(c.value),
            dropped: c.dropped,
        }),
        Err(problem) => Err(Rejected {
            name: o.meta().name.clone(),
            problem,
        }),
    }
}

fn key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Result<Key, Problem> {
    match (&meta.namespace, &meta.name) {
        (Some(ns), Some(name)) if !ns.is_empty() && !name.is_empty() => Ok(Key::new(ns, name)),
        _ => Err(problem("metadata", ProblemKind::MissingMetadata)),
    }
}

pub fn namespace_from_k8s(ns: &core::Namespace) -> Result<Namespace, Problem> {
    let name = ns
        .metadata
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| problem("metadata.name", ProblemKind::MissingMetadata))?;
    let mut labels: Labels = ns.metadata.labels.clone().unwrap_or_default();
    // The API server sets this label on every namespace; an object that
    // skipped it must still be selectable by name like the real thing.
    labels
        .entry(NAMESPACE_NAME_LABEL.to_string())
        .or_insert_with(|| name.clone());
    Ok(Namespace { name, labels })
}

pub fn pod_from_k8s(pod: &core::Pod) -> Result<Converted<Pod>, Problem> {
    let key = key(&pod.metadata)?;
    let mut dropped = Vec::new();
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref();
    // podIPs holds both families; old objects may only have podIP.
    let texts: Vec<&str> = match status.and_then(|s| s.pod_ips.as_ref()) {
        Some(ips) if !ips.is_empty() => ips.iter().map(|i| i.ip.as_str()).collect(),
        _ => status
            .and_then(|s| s.pod_ip.as_deref())
            .into_iter()
            .collect(),
    };
    // A pod that has finished gave its addresses back: the runtime may
    // already have handed them to a new pod while the API still lists the
    // old one, whose labels must not speak for the newcomer.
    let finished = matches!(
        status.and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    );
    let texts = if finished { Vec::new() } else { texts };
    let mut ips = Vec::new();
    for (i, text) in texts.into_iter().enumerate() {
        match text.parse::<IpAddr>() {
            Ok(ip) if !ips.contains(&ip) => ips.push(ip),
            Ok(_) => {}
            Err(_) => dropped.push(problem(
                format!("status.podIPs[{i}]"),
                ProblemKind::BadIp(text.to_string()),
            )),
        }
    }
    let mut ports = Vec::new();
    for (c, container) in spec
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        for (i, p) in container.ports.iter().flatten().enumerate() {
            let at = format!("spec.containers[{c}].ports[{i}]");
            match container_port(p) {
                Ok(cp) => ports.push(cp),
                Err(kind) => dropped.push(problem(at, kind)),
            }
        }
    }
    Ok(Converted {
        value: Pod {
            key,
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            ips,
            ports,
            host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
            node: spec.and_then(|s| s.node_name.clone()),
        },
        dropped,
    })
}

fn container_port(p: &core::ContainerPort) -> Result<ContainerPort, ProblemKind> {
    Ok(ContainerPort {
        name: p.name.clone().filter(|n| !n.is_empty()),
        protocol: protocol(p.protocol.as_deref())?,
        port: port_number(p.container_port)?,
    })
}

fn protocol(p: Option<&str>) -> Result<Protocol, ProblemKind> {
    match p {
        None => Ok(Protocol::Tcp),
        Some(s) => Protocol::parse(s).ok_or_else(|| ProblemKind::BadProtocol(s.to_string())),
    }
}

fn port_number(n: i32) -> Result<u16, ProblemKind> {
    u16::try_from(n)
        .ok()
        .filter(|p| *p != 0)
        .ok_or(ProblemKind::BadPort(i64::from(n)))
}

pub fn policy_from_k8s(np: &net::NetworkPolicy) -> Result<Converted<Policy>, Problem> {
    let key = key(&np.metadata)?;
    let empty = net::NetworkPolicySpec::default();
    let spec = np.spec.as_ref().unwrap_or(&empty);
    let pod_selector = match &spec.pod_selector {
        Some(s) => selector(s, "spec.podSelector")?,
        None => Selector::everything(),
    };
    // Defaulting as the API server does it, on the raw lists: a policy
    // whose only egress rule we drop below still isolates egress.
    let raw_egress = spec.egress.as_deref().unwrap_or_default();
    let (isolates_ingress, isolates_egress) = match spec.policy_types.as_deref() {
        None | Some([]) => (true, !raw_egress.is_empty()),
        Some(types) => {
            let (mut ingress, mut egress) = (false, false);
            for (i, t) in types.iter().enumerate() {
                match t.as_str() {
                    "Ingress" => ingress = true,
                    "Egress" => egress = true,
                    _ => {
                        return Err(problem(
                            format!("spec.policyTypes[{i}]"),
                            ProblemKind::BadPolicyType(t.clone()),
                        ));
                    }
                }
            }
            (ingress, egress)
        }
    };
    let mut dropped = Vec::new();
    let mut ingress = Vec::new();
    let mut egress = Vec::new();
    // Rules of a direction the policy does not isolate are ignored by the
    // API; not keeping them means no consumer can apply them by mistake.
    if isolates_ingress {
        for (i, r) in spec.ingress.iter().flatten().enumerate() {
            let at = format!("spec.ingress[{i}]");
            match rule(r.from.as_deref(), r.ports.as_deref(), &at, "from") {
                Ok(rule) => ingress.push((i, rule)),
                Err(p) => dropped.push(p),
            }
        }
    }
    if isolates_egress {
        for (i, r) in raw_egress.iter().enumerate() {
            let at = format!("spec.egress[{i}]");
            match rule(r.to.as_deref(), r.ports.as_deref(), &at, "to") {
                Ok(rule) => egress.push((i, rule)),
                Err(p) => dropped.push(p),
            }
        }
    }
    Ok(Converted {
        value: Policy {
            key,
            pod_selector,
            isolates_ingress,
            isolates_egress,
            ingress,
            egress,
        },
        dropped,
    })
}

fn rule(
    peers: Option<&[net::NetworkPolicyPeer]>,
    ports: Option<&[net::NetworkPolicyPort]>,
    at: &str,
    peers_field: &str,
) -> Result<Rule, Problem> {
    let peers = match peers {
        None | Some([]) => Peers::All,
        Some(list) => Peers::Only(
            list.iter()
                .enumerate()
                .map(|(i, p)| peer(p, &format!("{at}.{peers_field}[{i}]")))
                .collect::<Result<_, _>>()?,
        ),
    };
    let ports = match ports {
        None | Some([]) => Ports::All,
        Some(list) => Ports::Only(
            list.iter()
                .enumerate()
                .map(|(i, p)| port_rule(p).map_err(|k| problem(format!("{at}.ports[{i}]"), k)))
                .collect::<Result<_, _>>()?,
        ),
    };
    Ok(Rule { peers, ports })
}

fn peer(p: &net::NetworkPolicyPeer, at: &str) -> Result<Peer, Problem> {
    match (&p.ip_block, &p.namespace_selector, &p.pod_selector) {
        (Some(b), None, None) => ip_block(b, &format!("{at}.ipBlock")).map(Peer::IpBlock),
        (Some(_), _, _) => Err(problem(at, ProblemKind::IpBlockWithSelector)),
        (None, None, None) => Err(problem(at, ProblemKind::EmptyPeer)),
        (None, ns, pods) => Ok(Peer::Pods {
            namespaces: match ns {
                Some(s) => {
                    NamespaceScope::Selected(selector(s, &format!("{at}.namespaceSelector"))?)
                }
                None => NamespaceScope::PolicyNamespace,
            },
            pods: match pods {
                Some(s) => selector(s, &format!("{at}.podSelector"))?,
                None => Selector::everything(),
            },
        }),
    }
}

/// The workspace's one CIDR syntax (`mycni_common::net`), host bits then
/// cleared as Go's `net.ParseCIDR` does.
fn parse_cidr(text: &str) -> Option<Cidr> {
    let c: mycni_common::net::Cidr<IpAddr> = text.parse().ok()?;
    Cidr::new(c.addr(), c.prefix())
}

fn ip_block(b: &net::IPBlock, at: &str) -> Result<IpBlock, Problem> {
    let cidr = parse_cidr(&b.cidr)
        .ok_or_else(|| problem(format!("{at}.cidr"), ProblemKind::BadCidr(b.cidr.clone())))?;
    let mut except = Vec::new();
    for (i, e) in b.except.iter().flatten().enumerate() {
        let at = format!("{at}.except[{i}]");
        let c = parse_cidr(e).ok_or_else(|| problem(&at, ProblemKind::BadCidr(e.clone())))?;
        if !cidr.strictly_contains(&c) {
            let kind = ProblemKind::ExceptOutside {
                except: e.clone(),
                cidr: b.cidr.clone(),
            };
            return Err(problem(at, kind));
        }
        except.push(c);
    }
    Ok(IpBlock { cidr, except })
}

fn port_rule(p: &net::NetworkPolicyPort) -> Result<PortRule, ProblemKind> {
    let protocol = protocol(p.protocol.as_deref())?;
    let port = match (&p.port, p.end_port) {
        (None, None) => PortMatch::Any,
        (Some(IntOrString::Int(n)), end) => {
            let start = port_number(*n)?;
            let end = match end {
                None => start,
                Some(e) if e < *n => {
                    return Err(ProblemKind::EndPortBelowPort { port: *n, end: e });
                }
                Some(e) => port_number(e)?,
            };
            PortMatch::Range { start, end }
        }
        (Some(IntOrString::String(name)), None) if valid_port_name(name) => {
            PortMatch::Named(name.clone())
        }
        (Some(IntOrString::String(name)), None) => {
            return Err(ProblemKind::BadPortName(name.clone()));
        }
        (_, Some(_)) => return Err(ProblemKind::EndPortWithoutNumericPort),
    };
    Ok(PortRule { protocol, port })
}

/// IANA_SVC_NAME, as the API server checks a port name: 1-15 of [a-z0-9-],
/// at least one letter, no hyphen at either end or next to another. A
/// digits-only string ("80") is therefore not a name.
fn valid_port_name(s: &str) -> bool {
    (1..=15).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && s.bytes().any(|b| b.is_ascii_lowercase())
        && !s.starts_with('-')
        && !s.ends_with('-')
        && !s.contains("--")
}

fn selector(s: &LabelSelector, at: &str) -> Result<Selector, Problem> {
    let mut match_expressions = Vec::new();
    for (i, r) in s.match_expressions.iter().flatten().enumerate() {
        let at = format!("{at}.matchExpressions[{i}]");
        let values: BTreeSet<String> = r.values.iter().flatten().cloned().collect();
        let operator = match r.operator.as_str() {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            other => return Err(problem(at, ProblemKind::BadOperator(other.to_string()))),
        };
        let wants_values = matches!(operator, Operator::In | Operator::NotIn);
        if wants_values && values.is_empty() {
            return Err(problem(at, ProblemKind::MissingValues(r.operator.clone())));
        }
        if !wants_values && !values.is_empty() {
            return Err(problem(
                at,
                ProblemKind::UnexpectedValues(r.operator.clone()),
            ));
        }
        match_expressions.push(Requirement {
            key: r.key.clone(),
            operator,
            values,
        });
    }
    Ok(Selector {
        match_labels: s.match_labels.clone().unwrap_or_default(),
        match_expressions,
    })
}
