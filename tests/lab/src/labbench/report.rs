//! The bench's report: the table of medians with their spread, the ratios
//! against the targets, the floors, the rulesets, every run's
//! figures and the counters. The figures and their formats are in
//! `figures`, the headline as an SVG chart in `chart`, the tests in `tests`
//! (and in `published`, the charts `docs/benchmarks.md` shows).

use std::fmt::Write as _;
use std::time::Duration;

use super::measure::Sample;
use super::rulesets::{Rules, kube_proxy_ruleset, rule_count, synthetic_ruleset};
use super::variants::Variant;
use super::{Options, Results, UDP_OMIT};
use crate::PathShare;
use crate::stats::median;

mod chart;
mod figures;
#[cfg(test)]
mod published;
#[cfg(test)]
mod tests;

pub(super) use chart::{chart_caption, headline_chart};

use figures::{
    Measure, direct_floor, floors, pct, prog_rows, ratio_runs, short, spread, spread_by,
};

pub(super) fn render(
    r: &Results,
    o: &Options,
    took: Duration,
    load_before: &str,
    load_after: &str,
) -> String {
    let values = |v: Variant, rules: Rules, m: Measure| -> Vec<f64> {
        r.samples
            .get(&(v, rules))
            .map(|v| v.iter().map(|s| m.get(s)).collect())
            .unwrap_or_default()
    };
    let med = |v: Variant, rules: Rules, m: Measure| -> f64 { median(&values(v, rules, m)) };
    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(w, "# mycni datapath bench (`cargo xtask lab bench`)\n");
    let _ = writeln!(
        w,
        "node1 -> node2: pod -> pod for the kernel and fast paths, namespace A -> B for the direct veth, \
         node namespace -> node namespace for the underlay (host addresses) and the overlay \
         (to node2's vxlan.1 address, agents on the kernel datapath). {} interleaved runs: \
         median of runs (min–max); {} s per measure, after one untimed second per path; the \
         agents quiet before each column after a restart; {:.0} s in all. Load average before: \
         {load_before}; after: {load_after}.\n",
        o.runs,
        o.seconds,
        took.as_secs_f64()
    );
    let pin = match o.pin_cpu {
        Some(c) => format!("both ends of every tool (sockperf, iperf3) pinned to CPU {c}"),
        None => "not pinned".into(),
    };
    let _ = writeln!(w, "Pinning: {pin}.\n");
    let _ = writeln!(
        w,
        "- latency: `sockperf ping-pong --tcp -m 64`, one-way = RTT/2 (sockperf's default, no `--full-rtt`); \
         the IPv6 columns' with `mycni-lab tcp-rr` against `mycni-lab echo-server` (the same \
         shape: one connection, 64-byte messages, one in flight, TCP_NODELAY, RTT/2), because \
         sockperf 3.7 takes no IPv6 address, so their latency compares with each other, not \
         with the IPv4 columns';\n\
         - stream: `iperf3 -c` one TCP flow, receiver's Gbit/s;\n\
         - small packets: `iperf3 -u -l 64 -b 0 -O {UDP_OMIT}`, without the first {UDP_OMIT} s \
         (conntrack assures a UDP flow, which lets it onto the fast path, after 2 s of two-way \
         traffic), in three figures: *rx*, datagrams/s the receiving program got (iperf3's \
         figure; loss in the per-run table is 1 - received/sent bytes); *delivered*, datagrams/s \
         that reached the receiver's UDP layer (its netns's InDatagrams + RcvbufErrors: read, or \
         dropped on a full socket after the path did its work), over a window inside the measured \
         seconds; *per CPU-s*, those datagrams per second of CPU the measure's own tasks ran \
         (both iperf3 ends and ksoftirqd, from the scheduler's run time): the path's per-packet \
         cost, which neither the scheduler's split of the CPU between sender and receiver nor \
         other load on the CPU moves. The per-CPU figure is the headline: per-packet cost is \
         what the fast path removes;\n\
         - fast share: of the pod packets the programs on both nodes counted during that \
         column's measurements, those fast-pathed (as the programs count them: a GSO batch \
         is one packet, and a packet counts once per node whose program sees it; the nodes' \
         own underlay traffic is left out). It includes each connection's SYN and FIN and \
         the UDP test's first {UDP_OMIT} s, before conntrack assures the flow, all on the \
         kernel path by design. Via vxlan.1: of the fast-pathed ones, those that still \
         crossed vxlan.1 (handed to it, or decapsulated by it);\n\
         - the programs' own cost (fast columns): each mycni program's run time per run on \
         each node, from the kernel's BPF run-time stats (run_time_ns / run_cnt) over the \
         same window as the per-CPU figure, and all programs' run time per datagram \
         delivered. On the UDP test node1's from_pod encapsulates (or redirects) every \
         datagram and node2's from_underlay (or from_vxlan, via vxlan.1) hands it to the pod: \
         against the per-packet CPU time (10^6 / per CPU-s kpps, in ns) the last row is the \
         programs' share of it. The stats are on only during that window, and themselves \
         cost two clock reads per program run, there only.\n"
    );
    let cols = Variant::ALL;
    let ratio_cols = [
        "fast/underlay (p50 <= 1.10; stream, UDP >= 0.90)",
        "fast/kernel (stream >= 1.1, UDP >= 1.3)",
        "via vxlan.1/underlay",
        "via vxlan.1/kernel",
        "fast direct/underlay (p50 <= 1.10; stream, UDP >= 0.90)",
        "fast direct/kernel direct (stream >= 1.1, UDP >= 1.3)",
        "IPv6 fast/kernel (stream >= 1.1, UDP >= 1.3)",
        "IPv6/IPv4 fast (tc encap)",
        "fast, flow events on/off (stream, UDP >= 0.98)",
    ];
    let head: Vec<&str> = cols.iter().map(|v| v.label()).chain(ratio_cols).collect();
    let _ = writeln!(w, "| measure | node rules | {} |", head.join(" | "));
    let _ = writeln!(w, "|---|---|{}", "---|".repeat(head.len()));
    for rules in [Rules::None, Rules::KubeProxy, Rules::Synthetic] {
        for m in Measure::ALL {
            let mut cells: Vec<String> = cols
                .iter()
                .map(|&v| {
                    if v.rulesets().contains(&rules) {
                        spread(m, &values(v, rules, m))
                    } else if matches!(v, Variant::Direct | Variant::Underlay) {
                        // Forwards no pod traffic: its one figure is the
                        // baseline of every rule row.
                        format!("({})", m.fmt(med(v, Rules::None, m)))
                    } else {
                        "-".into()
                    }
                })
                .collect();
            let runs = |v: Variant, rules: Rules| values(v, rules, m);
            let under = runs(Variant::Underlay, Rules::None);
            cells.extend([
                ratio_runs(&runs(Variant::Fast, rules), &under, m.underlay_target()),
                ratio_runs(
                    &runs(Variant::Fast, rules),
                    &runs(Variant::Kernel, rules),
                    m.kernel_target(),
                ),
                ratio_runs(&runs(Variant::FastVxlan, rules), &under, None),
                ratio_runs(
                    &runs(Variant::FastVxlan, rules),
                    &runs(Variant::Kernel, rules),
                    None,
                ),
                ratio_runs(
                    &runs(Variant::FastDirect, rules),
                    &under,
                    m.underlay_target(),
                ),
                ratio_runs(
                    &runs(Variant::FastDirect, rules),
                    &runs(Variant::KernelDirect, rules),
                    m.kernel_target(),
                ),
                ratio_runs(
                    &runs(Variant::Fast6, rules),
                    &runs(Variant::Kernel6, rules),
                    m.kernel_target(),
                ),
                // The IPv6 latency comes from another tool (tcp-rr, not
                // sockperf): a ratio across families would mix the two.
                if m.latency() {
                    "-".into()
                } else {
                    ratio_runs(
                        &runs(Variant::Fast6, rules),
                        &runs(Variant::Fast, rules),
                        None,
                    )
                },
                ratio_runs(
                    &runs(Variant::Fast, rules),
                    &runs(Variant::FastQuiet, rules),
                    None,
                ),
            ]);
            let _ = writeln!(
                w,
                "| {} | {} | {} |",
                m.label(),
                rules.label(o),
                cells.join(" | ")
            );
        }
        // A row with a cell for each fast column of this ruleset, and
        // none under the ratios.
        let fast_row = |w: &mut String, label: &str, cell: &dyn Fn(Variant) -> String| {
            let mut cells: Vec<String> = cols
                .iter()
                .map(|&v| {
                    if v.is_fast() && v.rulesets().contains(&rules) {
                        cell(v)
                    } else {
                        String::new()
                    }
                })
                .collect();
            cells.extend(std::iter::repeat_n(String::new(), ratio_cols.len()));
            let _ = writeln!(
                w,
                "| {label} | {} | {} |",
                rules.label(o),
                cells.join(" | ")
            );
        };
        for (label, get) in [
            (
                "fast share of pod packets (%)",
                PathShare::fast_pct as fn(&PathShare) -> Option<f64>,
            ),
            ("fast packets via vxlan.1 (%)", PathShare::crossed_pct),
        ] {
            fast_row(w, label, &|v| pct(r.shares.get(&(v, rules)).and_then(get)));
        }
        for (label, get) in prog_rows() {
            fast_row(w, &label, &|v| {
                let runs: Vec<f64> = r
                    .samples
                    .get(&(v, rules))
                    .map(|ss| ss.iter().filter_map(&get).collect())
                    .unwrap_or_default();
                spread_by(&runs, |x| format!("{x:.0}"))
            });
        }
    }
    let _ = writeln!(
        w,
        "\nThe IPv6 columns measure the same two pods over their IPv6 addresses (IPv6 inside \
         VXLAN over the IPv4 underlay: the kernel's vxlan.1, or the programs' tc encap), \
         without rules (the rulesets are IPv4 iptables, which IPv6 never walks); their UDP \
         *delivered* figure reads the server's UDP6 counters (snmp6). IPv6/IPv4 fast divides \
         the IPv6 fast column by the IPv4 one: the cost of the family alone (40-byte header, \
         70 bytes of overhead inside the same 1450-byte MTU).\n"
    );
    let _ = writeln!(
        w,
        "The direct veth and the underlay forward no pod traffic and run without rules: a value \
         in parentheses repeats that baseline, which fast/underlay divides by. The overlay and \
         the fast path via vxlan.1 run without rules only (-). Ratios are of medians; in \
         parentheses, the min–max of the same ratio run by run (each run measures both \
         columns within minutes), which is how far the headline ratio moves between runs.\n"
    );
    let p50 = |v: Variant| med(v, Rules::None, Measure::P50);
    let _ = writeln!(w, "{}", floors(p50));
    if let Some(d) = direct_floor(
        p50(Variant::Underlay),
        p50(Variant::KernelDirect),
        p50(Variant::FastDirect),
    ) {
        let _ = writeln!(w, "{d}");
    }

    let _ = writeln!(
        w,
        "## Rulesets (iptables-nft, installed in both node namespaces)\n"
    );
    let kp = kube_proxy_ruleset(o.services, 2);
    let syn = synthetic_ruleset(o.synthetic_rules);
    let took = |rules: Rules| -> String {
        r.install_times
            .get(&rules)
            .map(|v| {
                let ms: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1e3).collect();
                format!("{:.0} ms", median(&ms))
            })
            .unwrap_or_else(|| "-".into())
    };
    let _ = writeln!(
        w,
        "- kube-proxy: {} Services x 2 endpoints, ClusterIPs 10.96.0.10 upwards: {} rules \
         (nat KUBE-SERVICES -> KUBE-SVC-* -> statistic-random KUBE-SEP-* DNAT, KUBE-MARK-MASQ, \
         KUBE-POSTROUTING; filter KUBE-FORWARD, KUBE-SERVICES, KUBE-EXTERNAL-SERVICES, \
         KUBE-NODEPORTS, KUBE-FIREWALL); install {} for both nodes. Its per-packet cost on an \
         established flow is KUBE-FORWARD's conntrack checks; the nat chains see only a flow's \
         first packet.",
        o.services,
        rule_count(&kp),
        took(Rules::KubeProxy)
    );
    let _ = writeln!(
        w,
        "- synthetic (not what kube-proxy does): {} filter FORWARD rules \
         `-d 10.96.x.y/32 -p tcp --dport 80 -j DROP` that never match pod traffic, so every \
         forwarded packet walks them all; install {} for both nodes.\n",
        rule_count(&syn),
        took(Rules::Synthetic)
    );

    let _ = writeln!(w, "## Per run\n");
    let _ = writeln!(
        w,
        "| variant | node rules | p50 us | p99 us | stream Gbit/s | UDP rx kpps (loss %) | UDP delivered kpps | UDP kpps per CPU-s |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|---|---|---|");
    for ((variant, rules), v) in &r.samples {
        let col = |f: &dyn Fn(&Sample) -> String| -> String {
            v.iter().map(f).collect::<Vec<_>>().join(", ")
        };
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            variant.label(),
            rules.label(o),
            col(&|s| format!("{:.1}", s.p50_us)),
            col(&|s| format!("{:.1}", s.p99_us)),
            col(&|s| format!("{:.2}", s.stream_gbps)),
            col(&|s| format!("{:.1} ({:.0})", s.udp_kpps, s.udp_loss_pct)),
            col(&|s| format!("{:.1}", s.udp_delivered_kpps)),
            col(&|s| format!("{:.1}", s.udp_kpps_per_cpu)),
        );
    }

    let watched: Vec<_> = r
        .samples
        .iter()
        .filter(|(_, v)| v.iter().any(|s| !s.progs.runs.is_empty()))
        .collect();
    if !watched.is_empty() {
        let _ = writeln!(
            w,
            "\n## The programs' own cost per run (UDP window: ns/run over runs)\n"
        );
        let _ = writeln!(w, "| variant | node rules | program | ns/run | runs |");
        let _ = writeln!(w, "|---|---|---|---|---|");
        for ((variant, rules), v) in watched {
            let keys: std::collections::BTreeSet<(usize, &str)> = v
                .iter()
                .flat_map(|s| s.progs.runs.keys().copied())
                .collect();
            for (node, program) in keys {
                let col = |f: &dyn Fn(super::progs::ProgRun) -> String| -> String {
                    v.iter()
                        .map(|s| {
                            s.progs
                                .runs
                                .get(&(node, program))
                                .map_or("-".into(), |r| f(*r))
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                let _ = writeln!(
                    w,
                    "| {} | {} | {} (node{node}) | {} | {} |",
                    variant.label(),
                    rules.label(o),
                    short(program),
                    col(&|r| r.ns_per_run().map_or("-".into(), |n| format!("{n:.0}"))),
                    col(&|r| r.run_cnt.to_string()),
                );
            }
        }
    }

    let _ = writeln!(
        w,
        "\n## Fast-path counters (pod packets the tc programs saw, over each fast column's measurements)\n"
    );
    for (v, nodes) in &r.node_shares {
        for (i, share) in nodes.iter().enumerate() {
            let _ = writeln!(w, "- {}, node{}: {}", v.label(), i + 1, share.describe());
        }
    }
    let _ = writeln!(
        w,
        "- during the kernel-path and node->node measurements (agents on `--datapath kernel`) \
         the programs counted {} packets (0 = detached, as `--datapath kernel` promises).",
        r.kernel_seen
    );
    for (v, n) in &r.vxlan_packets {
        let _ = writeln!(
            w,
            "- {}: vxlan.1 carried {n} packets on both nodes during its measurements{}.",
            v.label(),
            if v.is_direct() {
                " (direct routing: the pods' traffic bypasses it)"
            } else {
                ""
            }
        );
    }
    s
}
