//! The agents' datapath as the lab sees it: which one each agent runs, its
//! counters, the fast share of pod traffic (`share`), and restarting the
//! agents on another datapath.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Result, bail};

use mycni_testkit::{in_netns, sh};

use crate::{IpFamily, Lab, http_get, wait_for};

mod share;
#[cfg(test)]
mod tests;

pub use share::PathShare;

/// Packets per path name (`mycni_common::DpPath::name`), as a node's agent
/// exports them (all address families together).
pub type Counters = BTreeMap<String, u64>;

/// [`Counters`] per address family label (`mycni_common::DpFamily::name`:
/// `ipv4`, `ipv6`, `other`; `""` from an agent too old to label them).
pub type FamilyCounters = BTreeMap<String, Counters>;

/// The `family` label the agent gives packets of `f`.
pub fn family_label(f: IpFamily) -> &'static str {
    match f {
        IpFamily::V4 => mycni_common::DpFamily::Ipv4.name(),
        IpFamily::V6 => mycni_common::DpFamily::Ipv6.name(),
    }
}

/// `mycni_datapath_packets_total{path="...",fast="...",family="..."} N`
/// lines of a metrics page, by family.
pub fn parse_family_counters(metrics: &str) -> FamilyCounters {
    let mut out = FamilyCounters::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("mycni_datapath_packets_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        // Label values are DpPath and DpFamily names: no quotes or commas.
        let label = |key: &str| {
            labels.split(',').find_map(|kv| {
                let v = kv.strip_prefix(key)?.strip_prefix("=\"")?;
                v.strip_suffix('"')
            })
        };
        let Some(path) = label("path") else {
            continue;
        };
        let n = value.trim().parse().unwrap_or(0);
        *out.entry(label("family").unwrap_or_default().to_string())
            .or_default()
            .entry(path.to_string())
            .or_default() += n;
    }
    out
}

/// The packets of every family, per path, of a metrics page.
pub fn parse_counters(metrics: &str) -> Counters {
    let mut out = Counters::new();
    for c in parse_family_counters(metrics).into_values() {
        for (path, n) in c {
            *out.entry(path).or_default() += n;
        }
    }
    out
}

/// The value of the last `flag value` or `flag=value` in `args`.
fn flag_value(args: &[String], flag: &str) -> Option<String> {
    let mut found = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == flag {
            found = it.next().cloned();
        } else if let Some(v) = a.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            found = Some(v.to_string());
        }
    }
    found
}

/// What the agent's readiness detail says of its datapath (mycni-agent's
/// `DatapathRoom::describe`): the kernel path's reason follows the first.
const KERNEL_DETAIL: &str = "datapath kernel: ";
const EBPF_TC_ENCAP_DETAIL: &str = "datapath ebpf, tc encap";
const EBPF_VXLAN_DETAIL: &str = "datapath ebpf, via vxlan.1";
/// The agents' VXLAN device (mycni-agent's `--vxlan-name` default).
pub const VXLAN_DEV: &str = "vxlan.1";
/// The agents' VXLAN device over the IPv6 underlay (`--vxlan6-name`).
pub const VXLAN6_DEV: &str = mycni_common::contract::DEFAULT_VXLAN6_DEVICE;

/// The reason in a `/readyz` answer for running the kernel datapath, or the
/// whole answer when it gives none.
fn kernel_reason(readyz: &str) -> String {
    match readyz.find(KERNEL_DETAIL) {
        Some(k) => readyz[k + KERNEL_DETAIL.len()..].trim().to_string(),
        None => format!("the agent gives no reason ({})", readyz.trim()),
    }
}

/// The datapath a node's agent runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeDatapath {
    /// The tc programs, encapsulating to remote pods themselves (datapath v2).
    EbpfTcEncap,
    /// The tc programs, handing remote traffic to `vxlan.1` (`--tc-encap false`).
    EbpfVxlan,
    /// Routes, ARP and FDB only, for the reason the agent gives.
    Kernel(String),
}

impl NodeDatapath {
    /// Its `--datapath` value.
    pub fn mode(&self) -> &'static str {
        match self {
            NodeDatapath::EbpfTcEncap | NodeDatapath::EbpfVxlan => "ebpf",
            NodeDatapath::Kernel(_) => "kernel",
        }
    }
}

impl std::fmt::Display for NodeDatapath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeDatapath::EbpfTcEncap => f.write_str("ebpf with tc encap"),
            NodeDatapath::EbpfVxlan => f.write_str("ebpf via vxlan.1"),
            NodeDatapath::Kernel(why) => write!(f, "kernel ({why})"),
        }
    }
}

/// How a node's agent routes its peers' podCIDRs (its routes of protocol
/// 110): through `vxlan.1` (gateway podCIDR.0, onlink), through `vxlan6.1`
/// (a peer reached over the IPv6 underlay only) or straight to the
/// peer's host over the underlay (`--direct-routing`). The agent's own
/// readiness detail says whether it encapsulates in tc, not whether it
/// encapsulates at all, so the routes are what tell direct routing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerRoutes {
    /// Peers routed over the underlay, without VXLAN.
    pub direct: usize,
    /// Peers routed through `vxlan.1`.
    pub vxlan: usize,
    /// Peers routed through `vxlan6.1`.
    pub vxlan6: usize,
}

impl PeerRoutes {
    /// From `ip route show proto 110`: one line per peer podCIDR.
    pub fn parse(routes: &str) -> PeerRoutes {
        let mut r = PeerRoutes::default();
        for line in routes.lines().filter(|l| !l.trim().is_empty()) {
            let mut words = line.split_whitespace();
            let dev = if words.any(|w| w == "dev") {
                words.next()
            } else {
                None
            };
            match dev {
                Some(VXLAN_DEV) => r.vxlan += 1,
                Some(VXLAN6_DEV) => r.vxlan6 += 1,
                _ => r.direct += 1,
            }
        }
        r
    }
}

/// What node's datapath and routes add up to, for the lab's summaries:
/// `ebpf with tc encap`, `ebpf, direct routing to 2 peers (no VXLAN)`,
/// `kernel (--datapath kernel), direct routing to 1 peer, vxlan.1 to 1`.
pub fn describe_node(d: &NodeDatapath, r: &PeerRoutes) -> String {
    let peers = |n: usize| format!("{n} peer{}", if n == 1 { "" } else { "s" });
    if r.direct == 0 {
        return d.to_string();
    }
    let overlay = match d {
        // With no peer left on the overlay, how it would encapsulate
        // says nothing about this node's traffic.
        _ if r.vxlan == 0 => " (no VXLAN)".to_string(),
        NodeDatapath::EbpfTcEncap => format!(", tc encap to {}", r.vxlan),
        NodeDatapath::EbpfVxlan | NodeDatapath::Kernel(_) => {
            format!(", via vxlan.1 to {}", r.vxlan)
        }
    };
    let base = match d {
        NodeDatapath::EbpfTcEncap | NodeDatapath::EbpfVxlan => "ebpf".to_string(),
        NodeDatapath::Kernel(_) => d.to_string(),
    };
    format!("{base}, direct routing to {}{overlay}", peers(r.direct))
}

/// A node's datapath and its peer routes of both families, for the lab's
/// summaries: [`describe_node`] and [`describe_ipv6_overlay`], or, on a
/// node that reaches every peer over the IPv6 underlay (an IPv6-only lab),
/// `ebpf, 2 peers through vxlan6.1 over the IPv6 underlay`: whether the
/// programs encapsulate in tc says nothing there (their outer header is
/// IPv4); what they forward is in the share's fast paths.
pub fn describe_node_routes(d: &NodeDatapath, r: &PeerRoutes, r6: &PeerRoutes) -> String {
    let peers = |n: usize| format!("{n} peer{}", if n == 1 { "" } else { "s" });
    let over6 = format!("through {VXLAN6_DEV} over the IPv6 underlay");
    if *r == PeerRoutes::default() && r6.vxlan6 > 0 && r6.vxlan == 0 && r6.direct == 0 {
        let base = match d {
            NodeDatapath::EbpfTcEncap | NodeDatapath::EbpfVxlan => "ebpf".to_string(),
            NodeDatapath::Kernel(_) => d.to_string(),
        };
        return format!("{base}, {} {over6}", peers(r6.vxlan6));
    }
    let mut s = describe_node(d, r) + &describe_ipv6_overlay(d, r, r6);
    if r6.vxlan6 > 0 {
        let _ = write!(s, "; IPv6 to {} {over6}", peers(r6.vxlan6));
    }
    s
}

/// What [`describe_node`] leaves out when direct routing takes IPv4 peers
/// off the overlay: the IPv6 podCIDRs, which the IPv4 underlay cannot carry
/// unencapsulated, stay on it (`r6`: the node's IPv6 peer routes).
/// Empty when there is nothing to add.
pub fn describe_ipv6_overlay(d: &NodeDatapath, r: &PeerRoutes, r6: &PeerRoutes) -> String {
    if r.direct == 0 || r6.vxlan == 0 {
        return String::new();
    }
    let how = match d {
        NodeDatapath::EbpfTcEncap => "tc encap",
        NodeDatapath::EbpfVxlan | NodeDatapath::Kernel(_) => "via vxlan.1",
    };
    format!("; IPv6 to {} over the overlay ({how})", r6.vxlan)
}

impl Lab {
    /// Reads a node's Prometheus metrics (from the underlay, where its
    /// metrics address is reachable).
    pub fn metrics(&self, i: usize) -> Result<String> {
        self.get_from_node(i, "/metrics")
    }

    /// A node's `/readyz` answer: status line and the agent's readiness
    /// detail (which says why a node runs the kernel datapath).
    pub fn readyz(&self, i: usize) -> Result<String> {
        self.get_from_node(i, "/readyz")
    }

    /// `path` of node `i`'s metrics address, asked from the underlay: the
    /// status line, a space, then the body.
    pub fn get_from_node(&self, i: usize, path: &str) -> Result<String> {
        let addr = self.spec.metrics_socket(i).to_string();
        in_netns(&self.spec.underlay_ns(), || http_get(&addr, path))?
    }

    /// A node's fast-path counters (packets per path name, e.g.
    /// `fast_encap`), read from its metrics endpoint. Empty while the node
    /// runs the kernel datapath.
    pub fn counters(&self, i: usize) -> Result<Counters> {
        Ok(parse_counters(&self.metrics(i)?))
    }

    /// Every node's counters, in node order; a node that does not answer
    /// counts as empty, so a delta over it is zero rather than an error.
    pub fn all_counters(&self) -> Vec<Counters> {
        self.of_every_node(|i| self.counters(i))
    }

    /// `read` of every node in node order, empty for a node that cannot be
    /// read.
    fn of_every_node<T: Default>(&self, read: impl Fn(usize) -> Result<T>) -> Vec<T> {
        (1..=self.spec.nodes)
            .map(|i| read(i).unwrap_or_default())
            .collect()
    }

    /// [`Self::counters`] by address family: feed two reads to
    /// [`PathShare::between_family`] for one family's fast share.
    pub fn family_counters(&self, i: usize) -> Result<FamilyCounters> {
        Ok(parse_family_counters(&self.metrics(i)?))
    }

    /// [`Self::family_counters`] of every node (empty for one that cannot
    /// be read), node 1 first.
    pub fn all_family_counters(&self) -> Vec<FamilyCounters> {
        self.of_every_node(|i| self.family_counters(i))
    }

    /// The command line of node `i`'s agent. `ip netns exec` execs the
    /// agent in place, so the pid file's process is the agent itself; this
    /// is what tells a lab attached later which flags it was started with.
    pub fn agent_cmdline(&self, i: usize) -> Option<Vec<String>> {
        let pid = std::fs::read_to_string(self.spec.node_dir(i).join("agent.pid")).ok()?;
        let raw = std::fs::read(format!("/proc/{}/cmdline", pid.trim())).ok()?;
        Some(
            raw.split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect(),
        )
    }

    /// The value of `flag` on node `i`'s agent command line (the last one,
    /// as clap takes it), else in the lab's agent arguments.
    pub fn agent_flag(&self, i: usize, flag: &str) -> Option<String> {
        let args = self
            .agent_cmdline(i)
            .unwrap_or_else(|| self.spec.agent_args.clone());
        flag_value(&args, flag)
    }

    /// Which datapath node `i`'s agent runs: ebpf or kernel from its
    /// metrics; the kernel path's reason, and whether the fast path
    /// encapsulates in tc, from its readiness detail (`datapath ebpf, tc
    /// encap (...)`), else from its `--tc-encap` flag.
    pub fn datapath(&self, i: usize) -> Result<NodeDatapath> {
        let m = self.metrics(i)?;
        let ready = self.readyz(i).unwrap_or_else(|e| format!("/readyz: {e:#}"));
        if !m.lines().any(|l| l == "mycni_datapath_ebpf 1") {
            return Ok(NodeDatapath::Kernel(kernel_reason(&ready)));
        }
        let tc_encap = if ready.contains(EBPF_VXLAN_DETAIL) {
            false
        } else if ready.contains(EBPF_TC_ENCAP_DETAIL) {
            true
        } else {
            // An agent whose detail names neither; the flag's default is true.
            self.agent_flag(i, "--tc-encap").as_deref() != Some("false")
        };
        Ok(if tc_encap {
            NodeDatapath::EbpfTcEncap
        } else {
            NodeDatapath::EbpfVxlan
        })
    }

    /// Fails unless every agent runs the `want` datapath (`ebpf` or
    /// `kernel`), naming each node that does not and the reason its agent
    /// gives: an agent built without the eBPF object, or whose programs do
    /// not load, falls back to the kernel path, and a lab must not pass that
    /// off as the fast path.
    pub fn check_datapath(&self, want: &str) -> Result<()> {
        // Nodes grouped by what they run, so one cause reads once.
        let mut wrong: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for i in 1..=self.spec.nodes {
            let d = self.datapath(i)?;
            if d.mode() != want {
                wrong
                    .entry(d.to_string())
                    .or_default()
                    .push(self.spec.node_name(i));
            }
        }
        if !wrong.is_empty() {
            let what: Vec<String> = wrong
                .iter()
                .map(|(d, nodes)| {
                    format!(
                        "{} run{} {d}",
                        nodes.join(", "),
                        if nodes.len() == 1 { "s" } else { "" }
                    )
                })
                .collect();
            bail!("asked for the {want} datapath, but {}", what.join("; "));
        }
        Ok(())
    }

    /// How node `i`'s agent routes its peers' IPv4 podCIDRs, from its routes.
    pub fn peer_routes(&self, i: usize) -> Result<PeerRoutes> {
        self.peer_routes_of("-4", i)
    }

    /// The same for the peers' IPv6 podCIDRs.
    pub fn peer_routes6(&self, i: usize) -> Result<PeerRoutes> {
        self.peer_routes_of("-6", i)
    }

    fn peer_routes_of(&self, family: &str, i: usize) -> Result<PeerRoutes> {
        let ns = self.spec.node_name(i);
        let out = sh("ip", &[family, "-n", &ns, "route", "show", "proto", "110"])?;
        Ok(PeerRoutes::parse(&out))
    }

    /// Fails unless every node routes all its peers directly (`direct`) or
    /// all through `vxlan.1`: every lab node is on the one underlay subnet,
    /// so `--direct-routing` leaves no peer on the overlay, and a bench
    /// column named after either must not measure the other.
    pub fn check_routing(&self, direct: bool) -> Result<()> {
        let peers = self.spec.nodes - 1;
        for i in 1..=self.spec.nodes {
            let r = self.peer_routes(i)?;
            let ok = if direct {
                r.direct == peers && r.vxlan == 0
            } else {
                r.vxlan == peers && r.direct == 0
            };
            if !ok {
                bail!(
                    "{} routes {} of its {peers} peers directly and {} through {VXLAN_DEV}, \
                     expected {}",
                    self.spec.node_name(i),
                    r.direct,
                    r.vxlan,
                    if direct {
                        "all directly"
                    } else {
                        "all through vxlan.1"
                    }
                );
            }
        }
        Ok(())
    }

    /// Node `i`'s datapath and routes in a few words, e.g. `ebpf, direct
    /// routing to 1 peer (no VXLAN)` (see [`describe_node_routes`]).
    pub fn describe_datapath(&self, i: usize) -> Result<String> {
        let d = self.datapath(i)?;
        let r = self.peer_routes(i)?;
        let r6 = self.peer_routes6(i).unwrap_or_default();
        Ok(describe_node_routes(&d, &r, &r6))
    }

    /// Fails unless every node of an IPv6-only lab is one: no IPv4 address
    /// on its underlay, no `vxlan.1`, a `vxlan6.1`, and every peer's
    /// podCIDR routed through it. An agent that made an IPv4 overlay
    /// anyway, or routed a peer elsewhere, would pass the matrix on a
    /// path the lab does not claim to test.
    pub fn check_ipv6_only_underlay(&self) -> Result<()> {
        let peers = self.spec.nodes - 1;
        let mut wrong = Vec::new();
        for i in 1..=self.spec.nodes {
            let ns = self.spec.node_name(i);
            let v4 = sh(
                "ip",
                &["-4", "-n", &ns, "-o", "addr", "show", "dev", "eth0"],
            )?;
            if !v4.trim().is_empty() {
                wrong.push(format!("{ns} has IPv4 on its underlay: {}", v4.trim()));
            }
            if sh("ip", &["-n", &ns, "link", "show", VXLAN_DEV]).is_ok() {
                wrong.push(format!("{ns} has {VXLAN_DEV}"));
            }
            if let Err(e) = sh("ip", &["-n", &ns, "link", "show", VXLAN6_DEV]) {
                wrong.push(format!("{ns} has no {VXLAN6_DEV} ({e:#})"));
            }
            let r6 = self.peer_routes6(i)?;
            if r6.vxlan6 != peers || r6.vxlan + r6.direct > 0 {
                wrong.push(format!(
                    "{ns} routes {} of its {peers} peers' IPv6 podCIDRs through {VXLAN6_DEV}, \
                     {} through {VXLAN_DEV}, {} directly",
                    r6.vxlan6, r6.vxlan, r6.direct
                ));
            }
        }
        if !wrong.is_empty() {
            bail!("not an IPv6-only lab: {}", wrong.join("; "));
        }
        Ok(())
    }

    /// Restarts every agent with `--datapath mode` (`ebpf` or `kernel`) and
    /// waits until each is ready again and reports that datapath.
    pub fn set_datapath(&mut self, mode: &str) -> Result<()> {
        self.set_agent_flags(&[("--datapath", mode)])
    }

    /// Restarts every agent on the fast path, encapsulating in tc or handing
    /// remote traffic to `vxlan.1`, and waits until each runs it.
    pub fn set_fast_path(&mut self, tc_encap: bool) -> Result<()> {
        let encap = if tc_encap { "true" } else { "false" };
        self.set_agent_flags(&[("--datapath", "ebpf"), ("--tc-encap", encap)])
    }

    /// Replaces `flags` in the agents' arguments, restarts every agent and
    /// waits until each is ready and runs the datapath `--datapath` asks for;
    /// an agent that came up on the other one fails this at once, with its
    /// reason, rather than after a timeout. Every flag takes a value
    /// (`--direct-routing true`, not a bare `--direct-routing`).
    pub fn set_agent_flags(&mut self, flags: &[(&str, &str)]) -> Result<()> {
        for (flag, value) in flags {
            let args = &mut self.spec.agent_args;
            while let Some(k) = args.iter().position(|a| a == flag) {
                args.drain(k..(k + 2).min(args.len()));
            }
            args.extend([flag.to_string(), value.to_string()]);
        }
        let mode = flag_value(&self.spec.agent_args, "--datapath").unwrap_or_else(|| "ebpf".into());
        for i in 1..=self.spec.nodes {
            self.restart_agent(i)?;
        }
        for i in 1..=self.spec.nodes {
            wait_for(
                &format!("node {i} to run the {mode} datapath"),
                Duration::from_secs(30),
                || match self.datapath(i) {
                    // A legacy tc attach of a pod veth with nothing on it
                    // waits for the CNI chain a moment (LEGACY_SETTLE).
                    Ok(d) if d.mode() == mode => self.metrics(i).is_ok_and(|m| {
                        !m.lines()
                            .any(|l| l.starts_with("mycni_datapath_attach_waiting "))
                            || m.lines().any(|l| l == "mycni_datapath_attach_waiting 0")
                    }),
                    // The agent says it settled on the kernel path: no
                    // point waiting for the fast path any longer.
                    Ok(NodeDatapath::Kernel(_)) => {
                        self.readyz(i).is_ok_and(|r| r.contains(KERNEL_DETAIL))
                    }
                    _ => false,
                },
            )?;
        }
        self.check_datapath(&mode)
    }
}
