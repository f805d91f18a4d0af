//! `cargo xtask lab bench`: the datapath benchmarks side by side, in one run.
//!
//! Ten variants, node1 -> node2:
//! - `direct veth`: two namespaces joined by one veth pair (MTU 1450, like
//!   the pods), the physical limit of this machine;
//! - `underlay (node->node)`: node1's namespace -> node2's host address
//!   (192.168.77.12) over the lab's underlay (node veth -> bridge -> node
//!   veth, MTU 1500), no overlay and no pods: the floor of any cross-node
//!   path in the lab;
//! - `overlay (node->node)`: node1's namespace -> node2's vxlan.1 address
//!   (the first address of its podCIDR, 10.244.2.0/32) through node1's agent
//!   route for that podCIDR: the underlay plus the kernel's VXLAN encap and
//!   decap, the floor of any path through vxlan.1;
//! - `kernel path`: node1's pod -> node2's pod with `--datapath kernel` (pod
//!   -> host veth -> routing and netfilter -> vxlan.1 -> underlay -> vxlan.1
//!   -> routing -> pod);
//! - `fast path via vxlan.1`: the same pods with `--datapath ebpf
//!   --tc-encap false` (established flows redirected around routing and
//!   netfilter into vxlan.1, which encapsulates; datapath v1);
//! - `fast path (tc encap)`: the same with `--tc-encap true` (the programs
//!   encapsulate and send out of the underlay themselves, and decapsulate
//!   at the underlay's ingress: vxlan.1 is skipped both ways; datapath v2);
//! - `kernel path, IPv6` and `fast path (tc encap), IPv6`: the kernel and
//!   tc-encap fast paths between the same pods over their IPv6 addresses
//!   (the lab is dual-stack; IPv6 inside VXLAN over the IPv4 underlay),
//!   without rules; their latency is `mycni-lab tcp-rr`'s, because
//!   sockperf 3.7 (Debian 12's) takes no IPv6 address;
//! - `kernel path, direct routing` and `fast path, direct routing`: the
//!   kernel and tc-encap fast paths with `--direct-routing true`: the nodes
//!   share one underlay subnet, so each routes the other's podCIDR straight
//!   to its host address and no packet is encapsulated. Before measuring,
//!   the bench checks both nodes' routes, and after, that vxlan.1 carried
//!   nothing meanwhile.
//!
//! The two node -> node references run while the agents run the kernel
//! datapath, so no tc program sees their packets (with the fast path on,
//! vxlan.1's ingress program would look at the overlay's and leave them to
//! the kernel).
//!
//! The pod variants also run with a kube-proxy-sized iptables ruleset on
//! every node, and with a synthetic one (N filter FORWARD rules that never
//! match), because kube-proxy's rules mostly cost on a flow's first packet;
//! the direct veth, the node -> node references and the fast path via
//! vxlan.1 run without rules.
//! Runs interleave the variants so machine noise hits all of them alike; the
//! table shows medians over runs with their min-max, ratios against the
//! issue's targets, and, for the fast columns, from the programs' counters,
//! the share of pod packets fast-pathed and of those the share that still
//! crossed vxlan.1, and the programs' own run time per run (bpf_stats,
//! over the UDP measure's window).
//!
//! Parts: `variants` (the columns, the agents' flags for each, the checks
//! that a column takes its path), `rulesets` (pure functions of their size,
//! tested without root, and their installation), `measure` (sockperf and
//! iperf3 in the namespaces), `progs` (the programs' own run time over a
//! measure), `report` (the table; its figures in `report/figures.rs`, the
//! SVG chart written beside it in `report/chart.rs`).
//!
//! `policy` is `cargo xtask bench policy`: the same measures in a lab of
//! its own, with NetworkPolicies in force against none. `policy_scale` is
//! `cargo xtask bench policy-scale`: a policy's create -> enforced seen by
//! probes, and the agents' memory per cluster pod.

mod measure;
pub mod policy;
pub mod policy_scale;
mod progs;
mod report;
mod rulesets;
mod variants;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use mycni_testkit::sh;

use crate::{
    Bins, Counters, IpFamily, Lab, PathShare, Spec, Stack, VXLAN_DEV, catch_interrupts,
    check_interrupted, node_ip,
};
use measure::{Pair, Sample, measure};
use progs::watch_programs;
use report::{chart_caption, headline_chart, render};
use rulesets::Installed;
pub use rulesets::{Rules, cluster_ip, kube_proxy_ruleset, rule_count, synthetic_ruleset};
use variants::{Agents, DirectVeth, Variant, check_route, first_inet, switch, vtep_address};

/// Namespace prefix and state directory: distinct from the CLI lab
/// (`mycni`, /run/mycni-lab), so a bench never touches a lab someone is using.
pub const PREFIX: &str = "mycnib";
pub const ROOT: &str = "/run/mycni-bench-lab";
/// Nodes of the bench's lab: node1's pod is the client, node2's the server.
pub(super) const NODES: usize = 2;
/// The pods' cluster CIDR, which kube-proxy's masquerade rule excludes.
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";

const SOCKPERF_PORT: u16 = 11111;
const IPERF_PORT: u16 = 5201;
/// UDP payload of the small-packet measure.
const UDP_LEN: u64 = 64;
/// Seconds of the UDP test left out of its figures. Conntrack marks a UDP
/// flow assured only once it has seen both directions for 2 s, and the fast
/// path takes UDP only when assured: without this, a short test would
/// measure mostly the kernel path under the fast path's name.
const UDP_OMIT: u64 = 2;
/// The direct-veth variant's namespaces and addresses.
const VETH_A: &str = "mycnib-veth-a";
const VETH_B: &str = "mycnib-veth-b";
const VETH_A_IP: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
const VETH_B_IP: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 2);
const POD_MTU: &str = "1450";

/// Runs by default: five give a median that one slow run cannot move and a
/// min-max worth reading (see `Options::runs`).
pub const DEFAULT_RUNS: usize = 5;
/// Seconds per measure by default. sockperf's p50 and p99 settle within a
/// second at these rates and iperf3's after its first; more runs buy more
/// steadiness than longer ones, at the same total. Three (four before the
/// direct-routing columns) keeps the default bench near 20 minutes.
pub const DEFAULT_SECONDS: u64 = 3;
/// Packets vxlan.1 may carry on both nodes during a direct-routing
/// column's measure: none of the pods' traffic, whose measure alone is
/// hundreds of thousands, but room for the odd neighbour or router
/// solicitation of the device itself.
const DIRECT_VXLAN_SLACK: u64 = 50;

#[derive(Debug, Clone)]
pub struct Options {
    /// Interleaved runs of every variant; the table shows medians and min-max.
    pub runs: usize,
    /// Seconds per measure (sockperf, iperf3 TCP, iperf3 UDP).
    pub seconds: u64,
    /// Services in the kube-proxy ruleset (2 endpoints each).
    pub services: usize,
    /// Non-matching filter FORWARD rules in the synthetic ruleset.
    pub synthetic_rules: usize,
    /// CPU both ends of every measure (sockperf, iperf3) are pinned to;
    /// None leaves them to the scheduler.
    pub pin_cpu: Option<usize>,
    /// Where the markdown table goes besides stdout.
    pub out: Option<PathBuf>,
}

/// The bench's lab; torn down on drop, whatever happened.
struct BenchLab(Lab);

impl Drop for BenchLab {
    fn drop(&mut self) {
        eprintln!("bench: tearing the lab down");
        self.0.down();
    }
}

#[derive(Default)]
struct Results {
    samples: BTreeMap<(Variant, Rules), Vec<Sample>>,
    /// What the programs saw during each fast variant's measurements,
    /// summed over nodes and runs.
    shares: BTreeMap<(Variant, Rules), PathShare>,
    /// The same per node, over all of a fast variant's measurements.
    node_shares: BTreeMap<Variant, Vec<PathShare>>,
    /// Packets the programs counted during the measurements with the agents
    /// on `--datapath kernel` (kernel path and node -> node): should stay 0.
    kernel_seen: u64,
    /// Packets vxlan.1 carried (both nodes, both directions) during each
    /// lab variant's measurements, summed over runs.
    vxlan_packets: BTreeMap<Variant, u64>,
    install_times: BTreeMap<Rules, Vec<Duration>>,
}

/// `mycni-lab bench`: brings up a 2-node x 1-pod lab and the direct veth,
/// measures everything, prints and writes the table, tears everything down.
pub fn run(bins: Bins, o: &Options) -> Result<()> {
    if o.runs == 0 || o.seconds == 0 {
        bail!("--runs and --seconds must be at least 1");
    }
    if o.services == 0 || o.services > 60_000 || o.synthetic_rules > 60_000 {
        bail!("--services must be 1..60000 and --synthetic-rules at most 60000 (10.96.0.0/16)");
    }
    catch_interrupts();
    let started = Instant::now();
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let spec = Spec {
        prefix: PREFIX.into(),
        nodes: NODES,
        pods: 1,
        root: PathBuf::from(ROOT),
        bins,
        agent_args: vec!["--datapath".into(), "kernel".into()],
        in_process_api: false,
        // Dual-stack for the IPv6 columns.
        stack: Stack::Dual,
        model: false,
    };
    // Leftovers of an interrupted bench (its own prefix and root only).
    if spec.root.join("state").exists() {
        eprintln!("bench: removing the lab a previous bench left behind");
        Lab::attach(spec.clone()).down();
    }
    DirectVeth::down();

    eprintln!("bench: bringing up the 2-node lab ({PREFIX}-*, {ROOT})");
    let lab = BenchLab(Lab::up(spec)?);
    let veth = DirectVeth::up()?;
    let logs = PathBuf::from(ROOT).join("bench");
    std::fs::create_dir_all(&logs)?;
    let result = measure_all(lab, o, &logs);
    drop(veth);
    let results = result?;
    let load_after = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let report = render(
        &results,
        o,
        started.elapsed(),
        load_before.trim(),
        load_after.trim(),
    );
    print!("{report}");
    if let Some(out) = &o.out {
        if let Some(dir) = out.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(out, &report).with_context(|| format!("writing {}", out.display()))?;
        eprintln!("bench: wrote {}", out.display());
        let chart = headline_chart(&results, chart_caption(o.runs, o.seconds));
        crate::chart::write_beside(out, &chart)?;
    }
    eprintln!(
        "bench: {} runs of {} s measures took {:.0} s in all",
        o.runs,
        o.seconds,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Takes the lab by value: it is torn down when this returns, before the
/// table is printed.
fn measure_all(mut lab: BenchLab, o: &Options, logs: &Path) -> Result<Results> {
    let pods = lab.0.pods()?;
    let dst = pods
        .iter()
        .find(|p| p.node == 2)
        .context("no pod on node 2")?;
    let src = pods
        .iter()
        .find(|p| p.node == 1)
        .context("no pod on node 1")?;
    let lab_pair = Pair {
        client: src.ns.clone(),
        server: dst.ns.clone(),
        ip: dst.ip.into(),
    };
    let lab_pair6 = Pair {
        client: src.ns.clone(),
        server: dst.ns.clone(),
        ip: dst
            .addr(IpFamily::V6)
            .context("the pod on node 2 has no IPv6 address: the bench's lab is dual-stack")?,
    };
    let veth_pair = Pair {
        client: VETH_A.into(),
        server: VETH_B.into(),
        ip: VETH_B_IP.into(),
    };
    let spec = lab.0.spec.clone();
    let (node1, node2) = (spec.node_name(1), spec.node_name(2));
    let underlay_pair = Pair {
        client: node1.clone(),
        server: node2.clone(),
        ip: node_ip(2).into(),
    };
    // The server binds to node2's VTEP address: read it off vxlan.1, and
    // make sure it is the one the agent derives from node2's podCIDR.
    let out = sh(
        "ip",
        &["-n", &node2, "-4", "-o", "addr", "show", "dev", VXLAN_DEV],
    )?;
    let vtep = first_inet(&out)
        .with_context(|| format!("no IPv4 address on {VXLAN_DEV} in {node2}: {out}"))?;
    if vtep != vtep_address(2) {
        bail!(
            "{VXLAN_DEV} in {node2} has {vtep}, not {}: the podCIDR's first address",
            vtep_address(2)
        );
    }
    let overlay_pair = Pair {
        client: node1.clone(),
        server: node2.clone(),
        ip: vtep.into(),
    };
    let nodes: Vec<String> = (1..=spec.nodes).map(|i| spec.node_name(i)).collect();
    let rulesets = [
        (Rules::KubeProxy, kube_proxy_ruleset(o.services, 2)),
        (Rules::Synthetic, synthetic_ruleset(o.synthetic_rules)),
    ];
    let mut r = Results::default();
    // The agents start with `--datapath kernel` and no direct routing.
    let mut current = Agents::Kernel { direct: false };
    // One untimed second on each path first: the tools' pages, the nodes'
    // neighbour entries and the first run's column would otherwise carry
    // costs no later run pays.
    eprintln!("bench: warming up");
    for pair in [
        &veth_pair,
        &underlay_pair,
        &overlay_pair,
        &lab_pair,
        &lab_pair6,
    ] {
        measure::warm_up(pair, o, logs)?;
    }
    for run in 0..o.runs {
        for v in Variant::run_order(run) {
            let pair = match v {
                Variant::Direct => &veth_pair,
                Variant::Underlay => &underlay_pair,
                Variant::Overlay => &overlay_pair,
                _ if v.family() == IpFamily::V6 => &lab_pair6,
                _ => &lab_pair,
            };
            if let Some(agents) = v.agents()
                && agents != current
            {
                switch(&mut lab.0, agents)?;
                current = agents;
            }
            match v {
                Variant::Underlay => check_route(&node1, underlay_pair.ip, "eth0")?,
                Variant::Overlay => check_route(&node1, overlay_pair.ip, VXLAN_DEV)?,
                // Both ways: the replies take node2's route.
                _ if v.pod_to_pod() => {
                    let dev = if v.is_direct() { "eth0" } else { VXLAN_DEV };
                    let (f, missing) = (v.family(), || format!("no {} address", v.family()));
                    check_route(&node1, dst.addr(f).with_context(missing)?, dev)?;
                    check_route(&node2, src.addr(f).with_context(missing)?, dev)?;
                }
                _ => {}
            }
            for &rules in v.rulesets() {
                check_interrupted()?;
                if v.rulesets().len() > 1 {
                    eprintln!(
                        "bench: run {}/{}: {}, rules: {}",
                        run + 1,
                        o.runs,
                        v.label(),
                        rules.label(o)
                    );
                } else {
                    eprintln!("bench: run {}/{}: {}", run + 1, o.runs, v.label());
                }
                let installed = match rulesets.iter().find(|(k, _)| *k == rules) {
                    Some((_, text)) => {
                        let (inst, took) = Installed::install(&nodes, text)?;
                        r.install_times.entry(rules).or_default().push(took);
                        Some(inst)
                    }
                    None => None,
                };
                let lab_variant = v.agents().is_some();
                let (before, vx_before) = if lab_variant {
                    (lab.0.all_counters(), vxlan_packets(&nodes)?)
                } else {
                    (vec![], 0)
                };
                // Found again for every measure: a switch restarts the
                // agents, which load their programs afresh.
                let progs = if v.is_fast() {
                    let pins: Vec<(usize, PathBuf)> =
                        (1..=spec.nodes).map(|i| (i, spec.pin_dir(i))).collect();
                    watch_programs(&pins)?
                } else {
                    vec![]
                };
                let s = measure(pair, o, logs, &progs)?;
                if lab_variant {
                    let after = lab.0.all_counters();
                    let vx = vxlan_packets(&nodes)?.saturating_sub(vx_before);
                    *r.vxlan_packets.entry(v).or_default() += vx;
                    if v.is_direct() && vx > DIRECT_VXLAN_SLACK {
                        bail!(
                            "{}: {VXLAN_DEV} carried {vx} packets during the measure; \
                             direct routing should leave it idle",
                            v.label()
                        );
                    }
                    let per_node: Vec<PathShare> = before
                        .iter()
                        .zip(&after)
                        .map(|(b, a)| PathShare::between(b, a))
                        .collect();
                    if v.is_fast() {
                        let total = r.shares.entry((v, rules)).or_default();
                        for n in &per_node {
                            total.add(n);
                        }
                        let nodes = r.node_shares.entry(v).or_default();
                        nodes.resize(per_node.len(), PathShare::default());
                        for (acc, n) in nodes.iter_mut().zip(&per_node) {
                            acc.add(n);
                        }
                    } else {
                        r.kernel_seen += counted(&before, &after);
                    }
                }
                drop(installed);
                r.samples.entry((v, rules)).or_default().push(s);
            }
        }
    }
    Ok(r)
}

/// Packets vxlan.1 received and sent, summed over the node namespaces.
fn vxlan_packets(nodes: &[String]) -> Result<u64> {
    let mut sum = 0;
    for ns in nodes {
        let out = sh(
            "ip",
            &["-n", ns, "-s", "-j", "link", "show", "dev", VXLAN_DEV],
        )?;
        sum += link_packets(&out)
            .with_context(|| format!("no packet counts for {VXLAN_DEV} in {ns}: {out}"))?;
    }
    Ok(sum)
}

/// rx + tx packets from `ip -s -j link show` output.
fn link_packets(json: &str) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    let stats = v.get(0)?.get("stats64")?;
    Some(stats["rx"]["packets"].as_u64()? + stats["tx"]["packets"].as_u64()?)
}

/// Every packet any program counted between `before` and `after`, the
/// node's own underlay traffic included.
fn counted(before: &[Counters], after: &[Counters]) -> u64 {
    before
        .iter()
        .zip(after)
        .flat_map(|(b, a)| {
            a.iter()
                .map(move |(k, n)| n.saturating_sub(b.get(k).copied().unwrap_or(0)))
        })
        .sum()
}

/// `1000` -> `1,000`: the benches' reports count policies, prefixes and
/// pods this way.
fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (k, c) in s.chars().enumerate() {
        if k > 0 && (s.len() - k).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_packets_sum_both_directions() {
        let j = r#"[{"ifname":"vxlan.1","stats64":{"rx":{"bytes":10,"packets":3},"tx":{"bytes":20,"packets":4}}}]"#;
        assert_eq!(link_packets(j), Some(7));
        assert_eq!(link_packets("[]"), None);
        assert_eq!(link_packets("Device does not exist"), None);
    }
}
