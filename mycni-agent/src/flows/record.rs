//! A flow as the agent serves it: one JSON object per line, its field
//! names those of Hubble's JSON output (`hubble observe -o jsonpb`:
//! `{"flow": {...}, "node_name": ..., "time": ...}`), so `jq` habits carry
//! over; what Hubble has no field for is added under names of mycni's own
//! (`path`, `path_reason`, `count`, `event`).

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// One line of `/flows`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Line {
    pub flow: Flow,
    pub node_name: String,
    /// RFC 3339 with nanoseconds, UTC.
    pub time: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Flow {
    pub time: String,
    /// FORWARDED or DROPPED.
    pub verdict: String,
    /// Why it was dropped: POLICY_DENIED, POLICY_NOT_JUDGED_YET,
    /// POLICY_NO_CONNECTION, UNDERLAY_NOT_PEER, or the kernel's own drop
    /// reason (IP_RPFILTER, NO_SOCKET, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop_reason_desc: Option<String>,
    #[serde(rename = "IP")]
    pub ip: Ip,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l4: Option<L4>,
    pub source: Endpoint,
    pub destination: Endpoint,
    pub node_name: String,
    /// The packet is its connection's reply (known for nftables verdicts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_reply: Option<bool>,
    /// INGRESS or EGRESS: the side of the policy that decided (policy
    /// verdicts only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_direction: Option<String>,
    /// FROM_ENDPOINT (a pod's veth), FROM_OVERLAY (`vxlan.1`),
    /// FROM_NETWORK (the underlay), FROM_STACK (nftables, the kernel).
    pub trace_observation_point: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<Interface>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress_allowed_by: Vec<PolicyRef>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress_allowed_by: Vec<PolicyRef>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress_denied_by: Vec<PolicyRef>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress_denied_by: Vec<PolicyRef>,
    #[serde(rename = "Summary")]
    pub summary: String,
    /// mycni: the fast path's way (`fast_encap`, ...) or `kernel`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// mycni: why the packet was left to the kernel (`kernel_tcp_control`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_reason: Option<String>,
    /// mycni: packets the event stands for (repeated drops folded in).
    pub count: u32,
    /// mycni: `new` (first packet of a connection a program saw), `path`
    /// (its path changed), `drop`, `verdict` (nftables decided).
    pub event: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Ip {
    pub source: String,
    pub destination: String,
    #[serde(rename = "ipVersion")]
    pub ip_version: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum L4 {
    #[serde(rename = "TCP")]
    Tcp {
        source_port: u16,
        destination_port: u16,
        flags: TcpFlags,
    },
    #[serde(rename = "UDP")]
    Udp {
        source_port: u16,
        destination_port: u16,
    },
    #[serde(rename = "SCTP")]
    Sctp {
        source_port: u16,
        destination_port: u16,
    },
    #[serde(rename = "ICMPv4")]
    Icmpv4 {},
    #[serde(rename = "ICMPv6")]
    Icmpv6 {},
}

/// Hubble's TCP flags: only the set ones appear.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "UPPERCASE")]
pub struct TcpFlags {
    #[serde(default, skip_serializing_if = "is_false")]
    pub fin: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub syn: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub rst: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub psh: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub ack: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub urg: bool,
}

fn is_false(b: &bool) -> bool {
    !b
}

impl TcpFlags {
    pub(crate) fn from_byte(b: u8) -> Self {
        TcpFlags {
            fin: b & 0x01 != 0,
            syn: b & 0x02 != 0,
            rst: b & 0x04 != 0,
            psh: b & 0x08 != 0,
            ack: b & 0x10 != 0,
            urg: b & 0x20 != 0,
        }
    }

    /// `SYN`, `SYN, ACK`, ...: Hubble's summary spelling.
    pub fn summary(&self) -> String {
        let names = [
            (self.syn, "SYN"),
            (self.fin, "FIN"),
            (self.rst, "RST"),
            (self.psh, "PSH"),
            (self.ack, "ACK"),
            (self.urg, "URG"),
        ];
        let set: Vec<&str> = names
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, n)| *n)
            .collect();
        set.join(", ")
    }
}

/// One end. A pod has a namespace and a name; anything else has only
/// `labels`, Hubble's reserved ones: `reserved:host` (this node's own
/// stack), `reserved:remote-node`, `reserved:world`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Endpoint {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod_name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    /// mycni: the node a pod runs on, or the node itself.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node_name: String,
}

impl Endpoint {
    /// `ns/pod`, the node's name, or the address.
    pub fn display(&self, ip: &str) -> String {
        if !self.pod_name.is_empty() {
            format!("{}/{}", self.namespace, self.pod_name)
        } else if !self.node_name.is_empty() {
            format!("{ip} (node {})", self.node_name)
        } else {
            ip.to_string()
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Interface {
    pub index: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyRef {
    pub name: String,
    pub namespace: String,
    pub kind: String,
    /// mycni: the rule's index in spec.ingress / spec.egress (allows only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<usize>,
}

impl Flow {
    pub fn ports(&self) -> Option<(u16, u16)> {
        match self.l4 {
            Some(L4::Tcp {
                source_port,
                destination_port,
                ..
            })
            | Some(L4::Udp {
                source_port,
                destination_port,
            })
            | Some(L4::Sctp {
                source_port,
                destination_port,
            }) => Some((source_port, destination_port)),
            _ => None,
        }
    }

    pub fn protocol(&self) -> &'static str {
        match self.l4 {
            Some(L4::Tcp { .. }) => "tcp",
            Some(L4::Udp { .. }) => "udp",
            Some(L4::Sctp { .. }) => "sctp",
            Some(L4::Icmpv4 {}) => "icmpv4",
            Some(L4::Icmpv6 {}) => "icmpv6",
            None => "",
        }
    }

    /// Every policy the flow names, allowing or denying.
    pub fn policies(&self) -> impl Iterator<Item = &PolicyRef> {
        self.egress_allowed_by
            .iter()
            .chain(&self.ingress_allowed_by)
            .chain(&self.egress_denied_by)
            .chain(&self.ingress_denied_by)
    }
}

/// `addr:port` with IPv6 in brackets, or the bare address.
pub fn socket(ip: &str, port: Option<u16>) -> String {
    match (ip.parse::<IpAddr>(), port) {
        (Ok(IpAddr::V6(_)), Some(p)) => format!("[{ip}]:{p}"),
        (_, Some(p)) => format!("{ip}:{p}"),
        (_, None) => ip.to_string(),
    }
}

impl Line {
    /// The one-line human format of `mycni-agent flows`:
    /// `time node src -> dst proto flags VERDICT why`.
    pub fn human(&self) -> String {
        let f = &self.flow;
        let (sp, dp) = match f.ports() {
            Some((s, d)) => (Some(s), Some(d)),
            None => (None, None),
        };
        let src = socket(&f.ip.source, sp);
        let dst = socket(&f.ip.destination, dp);
        let who_src = f.source.display(&f.ip.source);
        let who_dst = f.destination.display(&f.ip.destination);
        let ends = if who_src == f.ip.source && who_dst == f.ip.destination {
            format!("{src} -> {dst}")
        } else {
            format!("{who_src} ({src}) -> {who_dst} ({dst})")
        };
        let time = self.time.get(11..23).unwrap_or(&self.time);
        let mut why = Vec::new();
        if let Some(r) = &f.drop_reason_desc {
            why.push(r.clone());
        }
        if f.is_reply == Some(true) {
            why.push("reply".into());
        }
        let named = |by: &[PolicyRef], what: &str| {
            (!by.is_empty()).then(|| {
                let names: Vec<String> = by
                    .iter()
                    .map(|p| match p.rule {
                        Some(i) => format!("{}/{}#{i}", p.namespace, p.name),
                        None => format!("{}/{}", p.namespace, p.name),
                    })
                    .collect();
                format!("{what} {}", names.join(","))
            })
        };
        why.extend(named(&f.egress_denied_by, "egress isolated by"));
        why.extend(named(&f.ingress_denied_by, "ingress isolated by"));
        why.extend(named(&f.egress_allowed_by, "egress allowed by"));
        why.extend(named(&f.ingress_allowed_by, "ingress allowed by"));
        if let Some(p) = &f.path {
            match &f.path_reason {
                Some(r) => why.push(format!("{p} ({r})")),
                None => why.push(p.clone()),
            }
        }
        if f.count > 1 {
            why.push(format!("x{}", f.count));
        }
        format!(
            "{time} {node} {ends} {proto} {flags} {verdict} {why}",
            node = self.node_name,
            proto = f.protocol(),
            flags = match &f.l4 {
                Some(L4::Tcp { flags, .. }) => flags.summary().replace(", ", ","),
                _ => String::new(),
            },
            verdict = f.verdict,
            why = why.join("; ")
        )
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
    }
}
