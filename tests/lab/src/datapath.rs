//! The agents' datapath as the lab sees it: which one each agent runs, its
//! counters, the fast share of pod traffic, and restarting the agents on
//! another datapath.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Result, bail};

use mycni_testkit::{in_netns, sh};

use crate::{IpFamily, Lab, http_get, wait_for};

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
/// `FastPath::describe`): the kernel path's reason follows the first.
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

fn path_named(name: &str) -> Option<mycni_common::DpPath> {
    mycni_common::DpPath::ALL
        .into_iter()
        .find(|p| p.name() == name)
}

/// What a node's programs saw over an interval, summed the ways a fast
/// share needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathShare {
    /// Pod traffic (`DpPath::is_pod_traffic`): what a fast share is out of.
    /// The underlay program also sees the node's own traffic (the API, the
    /// metrics scrapes), which says nothing about pods.
    pub pod: u64,
    /// Of `pod`, the packets the programs forwarded (`DpPath::is_fast`).
    pub fast: u64,
    /// Of `fast`, those that still crossed `vxlan.1` (`DpPath::crossed_vxlan`).
    pub crossed_vxlan: u64,
    /// Pod packets left to the kernel, by path name.
    pub kernel: Counters,
    /// Of `fast`, by path name (`fast_local`, `fast_encap`, ...).
    pub fast_paths: Counters,
}

impl PathShare {
    /// From counters read before and after the interval. A path name this
    /// build does not know counts as pod traffic left to the kernel, so the
    /// share can only come out too low, never too high.
    pub fn between(before: &Counters, after: &Counters) -> PathShare {
        let mut s = PathShare::default();
        for (name, n) in after {
            let d = n.saturating_sub(before.get(name).copied().unwrap_or(0));
            if d == 0 {
                continue;
            }
            let path = path_named(name);
            if path.is_some_and(|p| !p.is_pod_traffic()) {
                continue;
            }
            s.pod += d;
            match path {
                Some(p) if p.is_fast() => {
                    s.fast += d;
                    *s.fast_paths.entry(name.clone()).or_default() += d;
                    if p.crossed_vxlan() {
                        s.crossed_vxlan += d;
                    }
                }
                _ => *s.kernel.entry(name.clone()).or_default() += d,
            }
        }
        s
    }

    /// [`Self::between`] for the packets of family `f` alone (what the
    /// programs counted under its `family` label: on the underlay, VXLAN
    /// counts under the family it carries).
    pub fn between_family(
        before: &FamilyCounters,
        after: &FamilyCounters,
        f: IpFamily,
    ) -> PathShare {
        let of = |c: &FamilyCounters| c.get(family_label(f)).cloned().unwrap_or_default();
        PathShare::between(&of(before), &of(after))
    }

    pub fn add(&mut self, o: &PathShare) {
        self.pod += o.pod;
        self.fast += o.fast;
        self.crossed_vxlan += o.crossed_vxlan;
        for (k, v) in &o.kernel {
            *self.kernel.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &o.fast_paths {
            *self.fast_paths.entry(k.clone()).or_default() += v;
        }
    }

    /// Fast packets per pod packet, in percent; None when no pod packet was seen.
    pub fn fast_pct(&self) -> Option<f64> {
        (self.pod > 0).then(|| 100.0 * self.fast as f64 / self.pod as f64)
    }

    /// Fast packets that crossed `vxlan.1`, in percent of the fast ones.
    pub fn crossed_pct(&self) -> Option<f64> {
        (self.fast > 0).then(|| 100.0 * self.crossed_vxlan as f64 / self.fast as f64)
    }

    /// `87.3% fast of 2345 pod packets, 0.0% of those through vxlan.1;
    /// kernel: kernel_tcp_control 300, ...`
    pub fn describe(&self) -> String {
        self.describe_as(false)
    }

    /// [`Self::describe`] with the fast packets by path, for a node without
    /// `vxlan.1` (an IPv6-only lab), where crossing it cannot happen and
    /// the paths say what matters: `40.0% fast of 1000 pod packets
    /// (fast_local 300, fast_vxlan6 100); kernel: ...`. A packet that
    /// crossed `vxlan.1` all the same is still named.
    pub fn describe_by_path(&self) -> String {
        self.describe_as(true)
    }

    fn describe_as(&self, by_path: bool) -> String {
        let Some(fast) = self.fast_pct() else {
            return "the programs saw no pod packets".into();
        };
        let mut s = format!("{fast:.1}% fast of {} pod packets", self.pod);
        if by_path && !self.fast_paths.is_empty() {
            let mut paths: Vec<(&String, &u64)> = self.fast_paths.iter().collect();
            paths.sort_by(|a, b| b.1.cmp(a.1));
            let paths: Vec<String> = paths.iter().map(|(k, v)| format!("{k} {v}")).collect();
            let _ = write!(s, " ({})", paths.join(", "));
        }
        match self.crossed_pct() {
            Some(c) if !by_path || self.crossed_vxlan > 0 => {
                let _ = write!(s, ", {c:.1}% of those through {VXLAN_DEV}");
            }
            _ => {}
        }
        let mut kernel: Vec<(&String, &u64)> = self.kernel.iter().collect();
        kernel.sort_by(|a, b| b.1.cmp(a.1));
        if !kernel.is_empty() {
            let top: Vec<String> = kernel
                .iter()
                .take(4)
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            let _ = write!(s, "; kernel: {}", top.join(", "));
        }
        s
    }
}

impl Lab {
    /// Reads a node's Prometheus metrics (from the underlay, where its
    /// metrics address is reachable).
    pub fn metrics(&self, i: usize) -> Result<String> {
        let addr = self.spec.metrics_socket(i).to_string();
        in_netns(&self.spec.underlay_ns(), || http_get(&addr, "/metrics"))?
    }

    /// A node's `/readyz` answer: status line and the agent's readiness
    /// detail (which says why a node runs the kernel datapath).
    pub fn readyz(&self, i: usize) -> Result<String> {
        let addr = self.spec.metrics_socket(i).to_string();
        in_netns(&self.spec.underlay_ns(), || http_get(&addr, "/readyz"))?
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
        (1..=self.spec.nodes)
            .map(|i| self.counters(i).unwrap_or_default())
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
        (1..=self.spec.nodes)
            .map(|i| self.family_counters(i).unwrap_or_default())
            .collect()
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
                    Ok(d) if d.mode() == mode => true,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_parse_from_the_metrics_page() {
        let m = "# TYPE mycni_datapath_packets_total counter\n\
                 mycni_datapath_packets_total{path=\"fast_encap\",fast=\"true\"} 120\n\
                 mycni_datapath_packets_total{path=\"kernel_tcp_control\",fast=\"false\"} 7\n\
                 mycni_datapath_bytes_total{path=\"fast_encap\",fast=\"true\"} 99999\n";
        let c = parse_counters(m);
        assert_eq!(c.len(), 2);
        assert_eq!(c["fast_encap"], 120);
        assert_eq!(c["kernel_tcp_control"], 7);
        // An agent of this build: one series per path and family.
        let m = "mycni_datapath_packets_total{path=\"fast_encap\",fast=\"true\",family=\"other\"} 0\n\
                 mycni_datapath_packets_total{path=\"fast_encap\",fast=\"true\",family=\"ipv4\"} 120\n\
                 mycni_datapath_packets_total{path=\"fast_encap\",fast=\"true\",family=\"ipv6\"} 30\n\
                 mycni_datapath_packets_total{path=\"kernel_not_ipv4\",fast=\"false\",family=\"other\"} 5\n\
                 mycni_datapath_bytes_total{path=\"fast_encap\",fast=\"true\",family=\"ipv6\"} 99999\n";
        let c = parse_counters(m);
        assert_eq!(
            (c.len(), c["fast_encap"], c["kernel_not_ipv4"]),
            (2, 150, 5)
        );
        let f = parse_family_counters(m);
        assert_eq!(f.len(), 3);
        assert_eq!(f[family_label(IpFamily::V6)]["fast_encap"], 30);
        assert_eq!(f["ipv4"]["fast_encap"], 120);
        assert_eq!(f["other"]["kernel_not_ipv4"], 5);
    }

    #[test]
    fn a_fast_share_of_one_family_counts_that_family_alone() {
        let page = |v4: u64, v6_fast: u64, v6_kernel: u64| {
            parse_family_counters(&format!(
                "mycni_datapath_packets_total{{path=\"fast_encap\",fast=\"true\",family=\"ipv4\"}} {v4}\n\
                 mycni_datapath_packets_total{{path=\"fast_encap\",fast=\"true\",family=\"ipv6\"}} {v6_fast}\n\
                 mycni_datapath_packets_total{{path=\"kernel_unknown_dest\",fast=\"false\",family=\"ipv6\"}} {v6_kernel}\n\
                 mycni_datapath_packets_total{{path=\"kernel_not_ipv4\",fast=\"false\",family=\"other\"}} {v4}\n"
            ))
        };
        let (before, after) = (page(0, 0, 0), page(1000, 30, 70));
        let v6 = PathShare::between_family(&before, &after, IpFamily::V6);
        assert_eq!((v6.pod, v6.fast), (100, 30));
        assert_eq!(v6.kernel["kernel_unknown_dest"], 70);
        let v4 = PathShare::between_family(&before, &after, IpFamily::V4);
        assert_eq!((v4.pod, v4.fast), (1000, 1000));
        // No IPv6 counted at all (an IPv4-only lab, or an older agent).
        let none = PathShare::between_family(&before, &FamilyCounters::new(), IpFamily::V6);
        assert_eq!(none.fast_pct(), None);
    }

    #[test]
    fn agent_flags_take_the_last_value_in_either_form() {
        let args: Vec<String> = [
            "run",
            "--tc-encap",
            "true",
            "--resync=1s",
            "--tc-encap=false",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        assert_eq!(flag_value(&args, "--tc-encap").as_deref(), Some("false"));
        assert_eq!(flag_value(&args, "--resync").as_deref(), Some("1s"));
        assert_eq!(flag_value(&args, "--datapath"), None);
    }

    #[test]
    fn the_kernel_paths_reason_comes_from_readyz() {
        let r = "HTTP/1.1 200 OK ready: overlay up, 2 peers; datapath kernel: this agent was built without the eBPF object (cargo xtask build-ebpf --release)\n";
        assert_eq!(
            kernel_reason(r),
            "this agent was built without the eBPF object (cargo xtask build-ebpf --release)"
        );
        assert!(kernel_reason("HTTP/1.1 503 x").contains("no reason"));
    }

    #[test]
    fn the_fast_share_counts_pod_traffic_only() {
        let c = |v: &[(&str, u64)]| -> Counters {
            v.iter().map(|(k, n)| (k.to_string(), *n)).collect()
        };
        let before = c(&[("fast_encap", 100), ("kernel_underlay_other", 5)]);
        let after = c(&[
            ("fast_encap", 190),
            ("fast_tc_decap", 0),
            ("fast_vxlan_mtu", 10),
            ("kernel_tcp_control", 20),
            ("kernel_underlay_other", 500),
            ("some_future_path", 10),
        ]);
        let s = PathShare::between(&before, &after);
        // 90 + 10 fast, 20 + 10 kernel; the underlay's own traffic left out.
        assert_eq!((s.pod, s.fast, s.crossed_vxlan), (130, 100, 10));
        assert_eq!(s.kernel.len(), 2);
        assert_eq!(s.fast_pct().map(|p| (p * 10.0).round()), Some(769.0));
        assert_eq!(s.crossed_pct(), Some(10.0));
        let d = s.describe();
        assert!(d.starts_with("76.9% fast of 130 pod packets, 10.0% of those through vxlan.1; kernel: kernel_tcp_control 20"), "{d}");
        assert_eq!(
            PathShare::default().describe(),
            "the programs saw no pod packets"
        );
        assert_eq!(
            NodeDatapath::Kernel("--datapath kernel".into()).to_string(),
            "kernel (--datapath kernel)"
        );
    }

    #[test]
    fn peer_routes_tell_direct_from_vxlan() {
        let routes = "10.244.2.0/24 via 10.244.2.0 dev vxlan.1 onlink \n\
                      10.244.3.0/24 via 192.168.77.13 dev eth0 \n";
        let r = PeerRoutes::parse(routes);
        assert_eq!(
            r,
            PeerRoutes {
                direct: 1,
                vxlan: 1,
                vxlan6: 0,
            }
        );
        assert_eq!(PeerRoutes::parse(""), PeerRoutes::default());
        let all_direct = PeerRoutes {
            direct: 2,
            vxlan: 0,
            vxlan6: 0,
        };
        assert_eq!(
            describe_node(&NodeDatapath::EbpfTcEncap, &all_direct),
            "ebpf, direct routing to 2 peers (no VXLAN)"
        );
        assert_eq!(
            describe_node(&NodeDatapath::EbpfTcEncap, &r),
            "ebpf, direct routing to 1 peer, tc encap to 1"
        );
        assert_eq!(
            describe_node(&NodeDatapath::Kernel("--datapath kernel".into()), &r),
            "kernel (--datapath kernel), direct routing to 1 peer, via vxlan.1 to 1"
        );
        let overlay = PeerRoutes {
            direct: 0,
            vxlan: 2,
            vxlan6: 0,
        };
        assert_eq!(
            describe_node(&NodeDatapath::EbpfTcEncap, &overlay),
            "ebpf with tc encap"
        );
        // Direct routing leaves the IPv6 podCIDRs on the overlay.
        let v6 = PeerRoutes {
            direct: 0,
            vxlan: 2,
            vxlan6: 0,
        };
        assert_eq!(
            describe_ipv6_overlay(&NodeDatapath::EbpfTcEncap, &all_direct, &v6),
            "; IPv6 to 2 over the overlay (tc encap)"
        );
        assert_eq!(
            describe_ipv6_overlay(&NodeDatapath::EbpfTcEncap, &overlay, &v6),
            ""
        );
        assert_eq!(
            describe_ipv6_overlay(
                &NodeDatapath::EbpfTcEncap,
                &all_direct,
                &PeerRoutes::default()
            ),
            ""
        );
    }

    #[test]
    fn an_ipv6_only_node_reaches_its_peers_through_vxlan6() {
        let routes6 = "fd00:10:244:2::/64 via fd00:77::12 dev vxlan6.1 proto 110 onlink \n\
                       fd00:10:244:3::/64 nhid 12 via fd00:77::13 dev vxlan6.1 proto 110 onlink \n";
        let r6 = PeerRoutes::parse(routes6);
        assert_eq!(
            r6,
            PeerRoutes {
                direct: 0,
                vxlan: 0,
                vxlan6: 2
            }
        );
        let none = PeerRoutes::default();
        assert_eq!(
            describe_node_routes(&NodeDatapath::EbpfTcEncap, &none, &r6),
            "ebpf, 2 peers through vxlan6.1 over the IPv6 underlay"
        );
        assert_eq!(
            describe_node_routes(&NodeDatapath::EbpfVxlan, &none, &r6),
            "ebpf, 2 peers through vxlan6.1 over the IPv6 underlay"
        );
        assert_eq!(
            describe_node_routes(
                &NodeDatapath::Kernel("--datapath kernel".into()),
                &none,
                &PeerRoutes::parse(routes6.lines().next().unwrap_or_default())
            ),
            "kernel (--datapath kernel), 1 peer through vxlan6.1 over the IPv6 underlay"
        );
        // A dual-stack node keeps its summary, and names a peer it reaches
        // over the IPv6 underlay alone.
        let dual = PeerRoutes {
            direct: 0,
            vxlan: 2,
            vxlan6: 0,
        };
        assert_eq!(
            describe_node_routes(&NodeDatapath::EbpfTcEncap, &dual, &dual),
            "ebpf with tc encap"
        );
        let one6 = PeerRoutes {
            direct: 0,
            vxlan: 1,
            vxlan6: 1,
        };
        assert_eq!(
            describe_node_routes(&NodeDatapath::EbpfTcEncap, &dual, &one6),
            "ebpf with tc encap; IPv6 to 1 peer through vxlan6.1 over the IPv6 underlay"
        );
    }

    #[test]
    fn an_ipv6_only_share_names_its_fast_paths() {
        let c = |v: &[(&str, u64)]| -> Counters {
            v.iter().map(|(k, n)| (k.to_string(), *n)).collect()
        };
        let after = c(&[("fast_local", 300), ("kernel_unknown_dest", 700)]);
        let s = PathShare::between(&Counters::new(), &after);
        assert_eq!(
            s.describe_by_path(),
            "30.0% fast of 1000 pod packets (fast_local 300); kernel: kernel_unknown_dest 700"
        );
        // The line of a node with vxlan.1 is as it was.
        assert_eq!(
            s.describe(),
            "30.0% fast of 1000 pod packets, 0.0% of those through vxlan.1; kernel: \
             kernel_unknown_dest 700"
        );
        // What did cross vxlan.1 is named all the same.
        let crossed = PathShare::between(
            &Counters::new(),
            &c(&[("fast_local", 300), ("fast_decap", 100)]),
        );
        assert_eq!(
            crossed.describe_by_path(),
            "100.0% fast of 400 pod packets (fast_local 300, fast_decap 100), 25.0% of those \
             through vxlan.1"
        );
        let mut sum = s.clone();
        sum.add(&crossed);
        assert_eq!(
            (sum.fast_paths["fast_local"], sum.fast_paths["fast_decap"]),
            (600, 100)
        );
    }
}
