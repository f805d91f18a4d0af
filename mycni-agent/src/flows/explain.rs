//! `mycni-agent explain <src> <dst> <port>/<proto>`: which policies select
//! each side, the verdict with the rules that decide it (the semantics
//! module's, over the cluster the policy room last read), and what this
//! node's datapath last saw between the two.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::record::Line;
use super::store::{Filter, Store};
use crate::cluster::{Cluster, Endpoint as PolicyEnd, Judgement, Key, Protocol, RuleRef, allowed};
use crate::verdict::Direction;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Explanation {
    pub source: Side,
    pub destination: Side,
    pub port: u16,
    pub protocol: String,
    /// `allowed` or `denied`: both the source's egress and the
    /// destination's ingress must allow.
    pub verdict: String,
    pub egress: Decision,
    pub ingress: Decision,
    /// The last flows recorded between the two, either way: by the agent
    /// asked, or with a kubeconfig by the agents of both ends' nodes (each
    /// line names its node).
    pub last_seen: Vec<Line>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Side {
    /// `ns/pod`, or the address when it is no pod.
    pub name: String,
    /// The address the verdict was computed for.
    pub ip: IpAddr,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node: String,
    /// Policies whose podSelector selects it.
    pub selected_by: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// allowed, denied, open (no policy isolates it), own node, same pod,
    /// not a pod.
    pub judgement: String,
    /// The rules that allow it: `ns/policy ingress[i]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<String>,
    /// The policies isolating the side in this direction.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub isolated_by: Vec<String>,
}

/// One end as asked: a pod, or an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Asked {
    Pod(Key),
    Ip(IpAddr),
}

/// Parses `<src>/<dst>/<port>/<proto>` where each end is `ns/pod` or an
/// address (what the CLI puts in the path).
pub fn parse(what: &str) -> Result<(Asked, Asked, u16, Protocol), String> {
    let parts: Vec<&str> = what.split('/').filter(|s| !s.is_empty()).collect();
    let usage = || format!("{what:?} is not <ns>/<pod> <ns>/<pod> <port>/<protocol>");
    let mut i = 0;
    let mut end = || -> Result<Asked, String> {
        let first = parts.get(i).ok_or_else(usage)?;
        if let Ok(ip) = first.parse::<IpAddr>() {
            i += 1;
            return Ok(Asked::Ip(ip));
        }
        let name = parts.get(i + 1).ok_or_else(usage)?;
        i += 2;
        Ok(Asked::Pod(Key::new(*first, *name)))
    };
    let (src, dst) = (end()?, end()?);
    let [port, proto] = parts.get(i..).unwrap_or_default() else {
        return Err(usage());
    };
    let port: u16 = port
        .parse()
        .map_err(|_| format!("port {port:?} is not a number from 1 to 65535"))?;
    let protocol = match proto.to_ascii_lowercase().as_str() {
        "tcp" => Protocol::Tcp,
        "udp" => Protocol::Udp,
        "sctp" => Protocol::Sctp,
        p => return Err(format!("protocol {p:?} is not tcp, udp or sctp")),
    };
    Ok((src, dst, port, protocol))
}

fn policy_name(k: &Key) -> String {
    format!("{}/{}", k.namespace, k.name)
}

fn rule_name(r: &RuleRef) -> String {
    let d = match r.direction {
        Direction::Ingress => "ingress",
        Direction::Egress => "egress",
    };
    format!("{} {d}[{}]", policy_name(&r.policy), r.index)
}

/// Explains `src -> dst` on `port`/`protocol` over `cluster`, with what
/// `store` holds for the pair.
pub fn explain(
    cluster: &Cluster,
    store: Option<&Arc<Store>>,
    src: &Asked,
    dst: &Asked,
    (port, protocol): (u16, Protocol),
) -> Result<Explanation, String> {
    let want_v6 = {
        // One family for both ends: IPv4 unless one end has only IPv6.
        let v4 = |a: &Asked| match a {
            Asked::Ip(ip) => ip.is_ipv4(),
            Asked::Pod(k) => cluster
                .pods
                .get(k)
                .is_some_and(|p| p.ips.iter().any(IpAddr::is_ipv4)),
        };
        !(v4(src) && v4(dst))
    };
    let side = |a: &Asked| -> Result<(Side, PolicyEnd), String> {
        match a {
            Asked::Ip(ip) => Ok((
                Side {
                    name: ip.to_string(),
                    ip: *ip,
                    node: String::new(),
                    selected_by: Vec::new(),
                },
                cluster
                    .pod_by_ip(*ip)
                    .map_or(PolicyEnd::External(*ip), |p| PolicyEnd::Pod {
                        pod: p.key.clone(),
                        ip: *ip,
                    }),
            )),
            Asked::Pod(k) => {
                let pod = cluster
                    .pods
                    .get(k)
                    .ok_or_else(|| format!("no pod {} in the agent's cache", policy_name(k)))?;
                let ip = pod
                    .ips
                    .iter()
                    .find(|ip| ip.is_ipv6() == want_v6)
                    .or(pod.ips.first())
                    .copied()
                    .ok_or_else(|| format!("pod {} has no address yet", policy_name(k)))?;
                Ok((
                    Side {
                        name: policy_name(k),
                        ip,
                        node: pod.node.clone().unwrap_or_default(),
                        selected_by: cluster
                            .policies_selecting(pod)
                            .map(|p| policy_name(&p.key))
                            .collect(),
                    },
                    PolicyEnd::Pod { pod: k.clone(), ip },
                ))
            }
        }
    };
    let (s, s_end) = side(src)?;
    let (d, d_end) = side(dst)?;
    let v = allowed(cluster, &s_end, &d_end, protocol, port);
    let last_seen = store
        .map(|st| {
            let mut lines = st.matching(&Filter::default());
            lines.retain(|l| {
                let (a, b) = (&l.flow.ip.source, &l.flow.ip.destination);
                let (x, y) = (s.ip.to_string(), d.ip.to_string());
                (*a == x && *b == y) || (*a == y && *b == x)
            });
            let skip = lines.len().saturating_sub(5);
            lines.split_off(skip)
        })
        .unwrap_or_default();
    Ok(Explanation {
        verdict: if v.is_allowed() { "allowed" } else { "denied" }.into(),
        egress: decision(&v.egress),
        ingress: decision(&v.ingress),
        source: s,
        destination: d,
        port,
        protocol: format!("{protocol:?}").to_uppercase(),
        last_seen,
    })
}

fn decision(j: &Judgement) -> Decision {
    let (judgement, rules, isolated_by) = match j {
        Judgement::NotJudged => ("not a pod", vec![], vec![]),
        Judgement::SamePod => ("same pod", vec![], vec![]),
        Judgement::OwnNode => ("own node", vec![], vec![]),
        Judgement::NotIsolated => ("open", vec![], vec![]),
        Judgement::Allowed(rules) => ("allowed", rules.iter().map(rule_name).collect(), vec![]),
        Judgement::Denied { isolated_by } => (
            "denied",
            vec![],
            isolated_by.iter().map(policy_name).collect(),
        ),
    };
    Decision {
        judgement: judgement.into(),
        rules,
        isolated_by,
    }
}

/// The text `mycni-agent explain` prints.
pub fn render(e: &Explanation) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} ({}) -> {} ({}) {}/{}: {}",
        e.source.name,
        e.source.ip,
        e.destination.name,
        e.destination.ip,
        e.port,
        e.protocol.to_lowercase(),
        e.verdict.to_uppercase()
    );
    for (what, side, dec) in [
        ("egress of", &e.source, &e.egress),
        ("ingress of", &e.destination, &e.ingress),
    ] {
        let sel = if side.selected_by.is_empty() {
            "selected by no policy".to_string()
        } else {
            format!("selected by {}", side.selected_by.join(", "))
        };
        let _ = write!(s, "  {what} {} ({sel}): {}", side.name, dec.judgement);
        if !dec.rules.is_empty() {
            let _ = write!(s, " by {}", dec.rules.join(", "));
        }
        if !dec.isolated_by.is_empty() {
            let _ = write!(
                s,
                ": isolated by {} and no rule of theirs admits it",
                dec.isolated_by.join(", ")
            );
        }
        s.push('\n');
    }
    let mut nodes: Vec<&str> = e.last_seen.iter().map(|l| l.node_name.as_str()).collect();
    nodes.dedup();
    if e.last_seen.is_empty() {
        let _ = writeln!(s, "  the datapath asked saw nothing between them lately");
    } else {
        let _ = writeln!(s, "  last seen by {}:", nodes.join(", "));
        for l in &e.last_seen {
            let _ = writeln!(s, "    {}", l.human());
        }
    }
    s
}

/// Lines kept from every node asked.
const LAST_SEEN: usize = 10;

/// Asks the agents in `agents` (Node name, address): the first that
/// answers explains (every agent judges against the same cluster), then
/// the agents of the nodes of both ends, if others, add what their
/// datapaths saw: a connection's egress is seen on the source's node,
/// its ingress on the destination's.
pub fn fetch_cluster(
    agents: &[(String, std::net::SocketAddr)],
    src: &str,
    dst: &str,
    port: &str,
) -> Result<Explanation> {
    let mut failures = Vec::new();
    let mut first = None;
    for (node, a) in agents {
        match fetch(*a, src, dst, port) {
            Ok(e) => {
                first = Some((node.clone(), e));
                break;
            }
            Err(e) => failures.push(format!("{node} ({a}): {e:#}")),
        }
    }
    let Some((asked, mut e)) = first else {
        anyhow::bail!("no agent answered: {}", failures.join("; "));
    };
    let mut more = Vec::new();
    for node in ends_nodes(&e, &asked) {
        let Some((_, a)) = agents.iter().find(|(n, _)| *n == node) else {
            continue;
        };
        match fetch(*a, src, dst, port) {
            Ok(other) => more.push(other.last_seen),
            Err(err) => eprintln!("mycni-agent explain: node {node} ({a}): {err:#}"),
        }
    }
    merge_last_seen(&mut e, more);
    Ok(e)
}

/// The nodes of the two ends other than `asked`, each once.
pub(crate) fn ends_nodes(e: &Explanation, asked: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for n in [&e.source.node, &e.destination.node] {
        if !n.is_empty() && n != asked && !out.contains(n) {
            out.push(n.clone());
        }
    }
    out
}

/// Adds other nodes' lines to `e`'s, in time order (RFC 3339 times of
/// one format sort as text), the last [`LAST_SEEN`] kept.
pub(crate) fn merge_last_seen(e: &mut Explanation, more: Vec<Vec<Line>>) {
    e.last_seen.extend(more.into_iter().flatten());
    e.last_seen.sort_by(|a, b| a.time.cmp(&b.time));
    let skip = e.last_seen.len().saturating_sub(LAST_SEEN);
    e.last_seen.drain(..skip);
}

/// Asks the agent at `agent` (the CLI's side).
pub fn fetch(agent: std::net::SocketAddr, src: &str, dst: &str, port: &str) -> Result<Explanation> {
    let body =
        crate::api::client::text_blocking(agent, &format!("/inspect/explain/{src}/{dst}/{port}"))?;
    serde_json::from_str(&body)
        .with_context(|| format!("the agent's answer is no explanation: {body}"))
}
