//! The bench's report: the table of medians with their spread, the ratios
//! against the targets, the floors, the rulesets, every run's
//! figures and the counters.

use std::fmt::Write as _;
use std::time::Duration;

use super::measure::Sample;
use super::progs::PROGRAMS;
use super::rulesets::{Rules, kube_proxy_ruleset, rule_count, synthetic_ruleset};
use super::variants::Variant;
use super::{NODES, Options, Results, UDP_OMIT};
use crate::PathShare;

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Measure {
    P50,
    P99,
    Stream,
    Udp,
    UdpDelivered,
    UdpPerCpu,
}

impl Measure {
    pub(super) const ALL: [Measure; 6] = [
        Measure::P50,
        Measure::P99,
        Measure::Stream,
        Measure::Udp,
        Measure::UdpDelivered,
        Measure::UdpPerCpu,
    ];
    pub(super) fn label(self) -> &'static str {
        match self {
            Measure::P50 => "TCP latency p50 (us)",
            Measure::P99 => "TCP latency p99 (us)",
            Measure::Stream => "TCP stream (Gbit/s)",
            Measure::Udp => "UDP 64 B rx (kpps)",
            Measure::UdpDelivered => "UDP 64 B delivered (kpps)",
            Measure::UdpPerCpu => "UDP 64 B per CPU-s (kpps)",
        }
    }
    pub(super) fn latency(self) -> bool {
        matches!(self, Measure::P50 | Measure::P99)
    }
    pub(super) fn get(self, s: &Sample) -> f64 {
        match self {
            Measure::P50 => s.p50_us,
            Measure::P99 => s.p99_us,
            Measure::Stream => s.stream_gbps,
            Measure::Udp => s.udp_kpps,
            Measure::UdpDelivered => s.udp_delivered_kpps,
            Measure::UdpPerCpu => s.udp_kpps_per_cpu,
        }
    }
    pub(super) fn fmt(self, v: f64) -> String {
        if v.is_nan() {
            return "-".into();
        }
        match self {
            Measure::Stream => format!("{v:.2}"),
            _ => format!("{v:.1}"),
        }
    }
}

/// A ratio target of the issue.
#[derive(Clone, Copy)]
pub(super) enum Target {
    AtMost(f64),
    AtLeast(f64),
}

impl Target {
    pub(super) fn met(self, v: f64) -> bool {
        match self {
            Target::AtMost(t) => v <= t,
            Target::AtLeast(t) => v >= t,
        }
    }
}

impl Measure {
    /// fast/underlay: within 10% of the underlay on p50 latency, one TCP
    /// stream and the 64-byte UDP rate.
    pub(super) fn underlay_target(self) -> Option<Target> {
        match self {
            Measure::P50 => Some(Target::AtMost(1.10)),
            Measure::Stream | Measure::Udp | Measure::UdpDelivered | Measure::UdpPerCpu => {
                Some(Target::AtLeast(0.90))
            }
            Measure::P99 => None,
        }
    }

    /// fast/kernel: the UDP rate at least 1.3x, one stream at least 1.1x
    /// the kernel path's.
    pub(super) fn kernel_target(self) -> Option<Target> {
        match self {
            Measure::Udp | Measure::UdpDelivered | Measure::UdpPerCpu => Some(Target::AtLeast(1.3)),
            Measure::Stream => Some(Target::AtLeast(1.1)),
            Measure::P50 | Measure::P99 => None,
        }
    }
}

pub(super) fn ratio(v: f64, target: Option<Target>) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    match target {
        Some(t) => format!("{v:.2} {}", if t.met(v) { "ok" } else { "MISS" }),
        None => format!("{v:.2}"),
    }
}

/// [`ratio`] with the min-max of the run-by-run ratios, `0.96 ok
/// (0.91–1.02)`, when both columns have a figure for every run: run `i` of
/// each was measured minutes apart at most, so the per-run ratio shows how
/// far the headline ratio itself moves with the machine's mood, which the
/// two columns' own ranges overstate.
pub(super) fn ratio_runs(num: &[f64], den: &[f64], target: Option<Target>) -> String {
    let mid = ratio(median(num.to_vec()) / median(den.to_vec()), target);
    if num.len() < 2 || num.len() != den.len() || mid == "-" {
        return mid;
    }
    let per_run: Vec<f64> = num.iter().zip(den).map(|(n, d)| n / d).collect();
    if !per_run.iter().all(|r| r.is_finite()) {
        return mid;
    }
    let lo = per_run.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = per_run.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{mid} ({lo:.2}–{hi:.2})")
}

/// The median with the min-max over runs, `19.5 (18.9–20.1)`; the value
/// alone for one run, `-` for none. The range is what says whether two
/// columns differ or only their noise does.
pub(super) fn spread(m: Measure, v: &[f64]) -> String {
    spread_by(v, |x| m.fmt(x))
}

/// [`spread`] with its own number format.
pub(super) fn spread_by(v: &[f64], fmt: impl Fn(f64) -> String) -> String {
    if v.is_empty() {
        return "-".into();
    }
    let mid = fmt(median(v.to_vec()));
    if v.len() == 1 {
        return mid;
    }
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{mid} ({}–{})", fmt(lo), fmt(hi))
}

/// The report's name of a program: without the `mycni_` every one has.
pub(super) fn short(program: &str) -> &str {
    program.strip_prefix("mycni_").unwrap_or(program)
}

/// One row's figure from one run's sample.
pub(super) type ProgFigure = Box<dyn Fn(&Sample) -> Option<f64>>;

/// The rows of the programs' own cost, each with its figure from one
/// run's sample (None: that program did not run in the window): run time
/// per run of each program on each node, then all of them per datagram.
pub(super) fn prog_rows() -> Vec<(String, ProgFigure)> {
    let mut rows: Vec<(String, ProgFigure)> = vec![];
    for node in 1..=NODES {
        for program in PROGRAMS {
            rows.push((
                format!("{} ns/run (node{node})", short(program)),
                Box::new(move |s: &Sample| {
                    s.progs
                        .runs
                        .get(&(node, program))
                        .and_then(|r| r.ns_per_run())
                }),
            ));
        }
    }
    rows.push((
        "programs ns per datagram (both nodes)".into(),
        Box::new(|s: &Sample| s.progs.ns_per_datagram()),
    ));
    rows
}

pub(super) fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |p| format!("{p:.1}"))
}

/// The paragraph under the table: what no datapath in this lab can go
/// below, and where the p50 figures (none, medians) put the targets.
/// The floors paragraph's sequel for the direct-routing columns: nothing
/// is encapsulated, so their floor is the underlay itself.
pub(super) fn direct_floor(u: f64, kd: f64, fd: f64) -> Option<String> {
    if ![u, kd, fd].iter().all(|v| v.is_finite() && *v > 0.0) {
        return None;
    }
    Some(format!(
        "**Direct routing.** Both nodes sit on one underlay subnet, so with \
         `--direct-routing true` each routes the other's podCIDR to its host address and \
         nothing is encapsulated (the bench checks both nodes' routes before, and that \
         vxlan.1 stayed idle during, each such measure): the underlay is both direct \
         columns' floor. Here, p50 without rules: the fast path with direct routing {:+.1} us \
         against the underlay, the kernel path with direct routing {:+.1} us.\n",
        fd - u,
        kd - u
    ))
}

pub(super) fn floors(d: f64, u: f64, ov: f64, k: f64, fv: f64, f: f64) -> String {
    let mut s = String::from(
        "**Floors.** The two node->node columns are not datapaths but what every datapath \
         here is built on. Any cross-node path in this lab pays the underlay's hops (node1's \
         veth pair -> the underlay namespace's bridge -> node2's veth pair, where the direct \
         veth is one veth pair); a path through the kernel's VXLAN device also pays its \
         encapsulation on node1 (vxlan.1's transmit and a UDP send) and decapsulation on node2 \
         (the VXLAN socket's receive and a second pass up the stack): the overlay column. Both \
         fast paths skip routing and netfilter on both nodes and the pod-side veth hops; via \
         vxlan.1 they still pay the overlay, so the overlay is that column's floor. With tc \
         encap the programs put on and take off the outer headers themselves (from the pod's \
         veth straight out of the underlay device, from the underlay device straight into the \
         pod with bpf_redirect_peer), so that column's floor is the underlay plus the header \
         work. (The underlay's MTU is 1500, the pods' and vxlan.1's 1450.)",
    );
    if ![d, u, ov, k, fv, f]
        .iter()
        .all(|v| v.is_finite() && *v > 0.0)
    {
        s.push('\n');
        return s;
    }
    let _ = write!(
        s,
        " Here, p50 without rules, against its floor: the underlay {:+.1} us against the \
         direct veth, the overlay {:+.1} us against the underlay; the fast path with tc encap \
         {:+.1} us against the underlay, the fast path via vxlan.1 {:+.1} us against the \
         overlay, the kernel path {:+.1} us against the overlay (a negative figure is within \
         the runs' spread).",
        u - d,
        ov - u,
        f - u,
        fv - ov,
        k - ov
    );
    let need = 1.10 * u;
    let _ = writeln!(
        s,
        " fast/underlay <= 1.10 needs the tc-encap path at <= {need:.1} us ({:+.1} us over the \
         underlay){}.",
        need - u,
        if need < ov {
            format!(
                ", below the overlay ({ov:.1} us): no datapath through vxlan.1 can meet it, \
                 which is what the tc encap is for"
            )
        } else {
            String::new()
        }
    );
    s
}

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
    let med = |v: Variant, rules: Rules, m: Measure| -> f64 { median(values(v, rules, m)) };
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
    let _ = writeln!(
        w,
        "{}",
        floors(
            p50(Variant::Direct),
            p50(Variant::Underlay),
            p50(Variant::Overlay),
            p50(Variant::Kernel),
            p50(Variant::FastVxlan),
            p50(Variant::Fast),
        )
    );
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
                format!("{:.0} ms", median(ms))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labbench::measure::Sample;

    fn sample(p50_us: f64) -> Sample {
        Sample {
            p50_us,
            p99_us: 2.0 * p50_us,
            stream_gbps: 100.0 / p50_us,
            udp_kpps: 1000.0 / p50_us,
            udp_loss_pct: 0.0,
            udp_delivered_kpps: 1100.0 / p50_us,
            udp_kpps_per_cpu: 1200.0 / p50_us,
            progs: Default::default(),
        }
    }

    fn options() -> Options {
        Options {
            runs: 1,
            seconds: 5,
            services: 2000,
            synthetic_rules: 2000,
            pin_cpu: Some(1),
            out: None,
        }
    }

    /// The row of `measure` under `rules`, split into cells.
    fn row(report: &str, measure: &str, rules: &str) -> Vec<String> {
        let line = report
            .lines()
            .find(|l| l.starts_with(&format!("| {measure} | {rules} |")))
            .unwrap_or_else(|| panic!("no row {measure} / {rules} in\n{report}"));
        line.trim_matches('|')
            .split('|')
            .map(|c| c.trim().to_string())
            .collect()
    }

    fn lab_results() -> Results {
        let mut r = Results::default();
        for (v, p50) in [
            (Variant::Direct, 11.5),
            (Variant::Underlay, 15.1),
            (Variant::Overlay, 19.0),
            (Variant::Kernel, 22.7),
            (Variant::FastVxlan, 19.5),
            (Variant::Fast, 16.0),
            (Variant::KernelDirect, 18.0),
            (Variant::FastDirect, 15.5),
            (Variant::Kernel6, 24.0),
            (Variant::Fast6, 16.8),
        ] {
            for &rules in v.rulesets() {
                r.samples.insert((v, rules), vec![sample(p50)]);
            }
        }
        r
    }

    #[test]
    fn render_shows_the_columns_the_floors_and_the_targets() {
        let o = options();
        let mut r = lab_results();
        r.shares.insert(
            (Variant::Fast, Rules::None),
            PathShare {
                pod: 1000,
                fast: 900,
                ..Default::default()
            },
        );
        r.shares.insert(
            (Variant::Fast6, Rules::None),
            PathShare {
                pod: 1000,
                fast: 750,
                ..Default::default()
            },
        );
        r.shares.insert(
            (Variant::FastVxlan, Rules::None),
            PathShare {
                pod: 1000,
                fast: 800,
                crossed_vxlan: 800,
                ..Default::default()
            },
        );
        let report = render(&r, &o, Duration::from_secs(1), "", "");
        let header = report
            .lines()
            .find(|l| l.starts_with("| measure |"))
            .expect("header");
        assert!(header.contains(
            "| direct veth | underlay (node->node) | overlay (node->node) | kernel path | fast path via vxlan.1 | fast path (tc encap) |"
        ));
        assert!(header.contains(
            "| fast path (tc encap) | kernel path, direct routing | fast path, direct routing |"
        ));
        assert!(header.contains("| via vxlan.1/underlay | via vxlan.1/kernel |"));
        assert!(header.contains(
            "| fast path, direct routing | kernel path, IPv6 | fast path (tc encap), IPv6 |"
        ));
        assert!(header.ends_with(
            "| fast direct/underlay (p50 <= 1.10; stream, UDP >= 0.90) | fast direct/kernel direct (stream >= 1.1, UDP >= 1.3) | IPv6 fast/kernel (stream >= 1.1, UDP >= 1.3) | IPv6/IPv4 fast (tc encap) |"
        ));
        let cells = header.matches('|').count() - 1;
        let sep = report
            .lines()
            .find(|l| l.starts_with("|---|"))
            .expect("separator");
        assert_eq!(sep.matches("---").count(), cells);

        let p50 = row(&report, "TCP latency p50 (us)", "none");
        assert_eq!(p50.len(), cells);
        assert_eq!(
            p50[2..],
            [
                "11.5", "15.1", "19.0", "22.7", "19.5", "16.0", "18.0", "15.5", "24.0", "16.8",
                "1.06 ok", "0.70", "1.29", "0.86", "1.03 ok", "0.86", "0.70", "-"
            ]
        );
        // 15.1 / 16.0 of the underlay's stream and UDP rate, 22.7 / 16.0 of
        // the kernel path's.
        let stream = row(&report, "TCP stream (Gbit/s)", "none");
        assert_eq!(stream[12..14], ["0.94 ok", "1.42 ok"]);
        let udp = row(&report, "UDP 64 B rx (kpps)", "none");
        assert_eq!(udp[12..14], ["0.94 ok", "1.42 ok"]);
        for label in ["UDP 64 B delivered (kpps)", "UDP 64 B per CPU-s (kpps)"] {
            let r = row(&report, label, "none");
            assert_eq!(r.len(), cells);
            assert_eq!(r[12..14], ["0.94 ok", "1.42 ok"]);
            // IPv6: 24.0 / 16.8 of the IPv6 kernel path's, 16.0 / 16.8 of
            // the IPv4 fast path's.
            assert_eq!(r[18..], ["1.43 ok", "0.95"]);
        }
        // Direct routing: 15.1 / 15.5 of the underlay's, 18.0 / 15.5 of the
        // kernel path's with direct routing.
        assert_eq!(stream[16..18], ["0.97 ok", "1.16 ok"]);
        assert_eq!(stream[10..12], ["4.17", "5.95"]);
        assert_eq!(stream[18..], ["1.43 ok", "0.95"]);
        // Rule rows: the direct veth and the underlay repeat their baseline,
        // the overlay and the fast path via vxlan.1 were not measured.
        let kp = row(&report, "TCP latency p50 (us)", "kube-proxy, 2000 svc");
        assert_eq!(
            kp[2..],
            [
                "(11.5)", "(15.1)", "-", "22.7", "-", "16.0", "18.0", "15.5", "-", "-", "1.06 ok",
                "0.70", "-", "-", "1.03 ok", "0.86", "-", "-"
            ]
        );
        let share = row(&report, "fast share of pod packets (%)", "none");
        assert_eq!(share.len(), cells);
        assert_eq!(share[5..8], ["", "80.0", "90.0"]);
        assert_eq!(share[8..12], ["", "-", "", "75.0"]);
        let share = row(
            &report,
            "fast share of pod packets (%)",
            "kube-proxy, 2000 svc",
        );
        assert_eq!(share[10..12], ["", ""]);
        let crossed = row(&report, "fast packets via vxlan.1 (%)", "none");
        assert_eq!(crossed[5..8], ["", "100.0", "0.0"]);
        let crossed = row(
            &report,
            "fast packets via vxlan.1 (%)",
            "kube-proxy, 2000 svc",
        );
        assert_eq!(crossed[5..8], ["", "", "-"]);

        assert!(report.contains("**Floors.**"));
        // 1.10 x 15.1 = 16.6 us, below the overlay's 19.0.
        assert!(report.contains("at <= 16.6 us (+1.5 us over the underlay), below the overlay"));
        assert!(report.contains("the fast path with tc encap +0.9 us against the underlay"));
        assert!(report.contains("| underlay (node->node) | none | 15.1 |"));
        assert!(report.contains("| fast path via vxlan.1 | none | 19.5 |"));
        assert!(report.contains("| fast path (tc encap), IPv6 | none | 16.8 |"));
        assert!(report.contains("`mycni-lab tcp-rr`"));
        assert!(report.contains("**Direct routing.**"));
        assert!(report.contains(
            "the fast path with direct routing +0.4 us against the underlay, the kernel path \
             with direct routing +2.9 us"
        ));
    }

    #[test]
    fn render_shows_medians_with_their_spread() {
        let mut r = lab_results();
        r.samples.insert(
            (Variant::Fast, Rules::None),
            vec![sample(17.0), sample(16.0), sample(18.0)],
        );
        let report = render(&r, &options(), Duration::from_secs(1), "", "");
        let p50 = row(&report, "TCP latency p50 (us)", "none");
        assert_eq!(p50[7], "17.0 (16.0–18.0)");
        // Ratios are of medians: 17.0 / 15.1.
        assert_eq!(p50[12], "1.13 MISS");
        assert_eq!(spread(Measure::Stream, &[]), "-");
        assert_eq!(spread(Measure::Stream, &[1.234]), "1.23");
    }

    #[test]
    fn render_without_references_still_renders() {
        let mut r = Results::default();
        r.samples
            .insert((Variant::Fast, Rules::None), vec![sample(19.5)]);
        let report = render(&r, &options(), Duration::from_secs(1), "", "");
        let p50 = row(&report, "TCP latency p50 (us)", "none");
        assert_eq!(
            p50[2..12],
            ["-", "-", "-", "-", "-", "19.5", "-", "-", "-", "-"]
        );
        assert_eq!(p50[12..], ["-", "-", "-", "-", "-", "-", "-", "-"]);
        assert!(report.contains("**Floors.**"));
        assert!(!report.contains("Here, p50"));
        assert!(!report.contains("**Direct routing.**"));
    }

    #[test]
    fn ratios_show_their_run_by_run_spread() {
        let mut r = lab_results();
        r.samples.insert(
            (Variant::Underlay, Rules::None),
            vec![sample(15.0), sample(16.0), sample(15.0)],
        );
        r.samples.insert(
            (Variant::Fast, Rules::None),
            vec![sample(15.0), sample(17.6), sample(16.5)],
        );
        let report = render(&r, &options(), Duration::from_secs(1), "", "");
        let p50 = row(&report, "TCP latency p50 (us)", "none");
        // Medians 16.5 / 15.0; run by run 1.00, 1.10, 1.10.
        assert_eq!(p50[12], "1.10 ok (1.00–1.10)");
        // The kernel path has one run: no pairs, the ratio alone.
        assert_eq!(p50[13], "0.73");
        assert_eq!(ratio_runs(&[1.0, 2.0], &[0.0, 1.0], None), "3.00");
        assert_eq!(ratio_runs(&[], &[1.0], None), "-");
    }

    #[test]
    fn median_of_even_and_odd() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0]), 2.5);
        assert!(median(vec![]).is_nan());
    }

    #[test]
    fn render_shows_the_programs_own_cost() {
        use crate::labbench::progs::{ProgRun, ProgWindow};
        let mut r = lab_results();
        let with = |p50: f64, pod_ns: u64, under_ns: u64| {
            let run = |ns_per_run: u64| ProgRun {
                run_time_ns: ns_per_run * 1000,
                run_cnt: 1000,
            };
            let mut s = sample(p50);
            s.progs = ProgWindow {
                runs: [
                    ((1, "mycni_from_pod"), run(pod_ns)),
                    ((2, "mycni_from_underlay"), run(under_ns)),
                    // Ran no time in the window.
                    ((2, "mycni_from_pod"), ProgRun::default()),
                ]
                .into(),
                datagrams: 1000,
            };
            s
        };
        r.samples.insert(
            (Variant::Fast, Rules::None),
            vec![
                with(16.0, 900, 550),
                with(16.0, 850, 560),
                with(16.0, 880, 600),
            ],
        );
        r.samples.insert(
            (Variant::FastDirect, Rules::None),
            vec![with(15.5, 700, 400)],
        );
        let report = render(&r, &options(), Duration::from_secs(1), "", "");
        let header = report
            .lines()
            .find(|l| l.starts_with("| measure |"))
            .expect("header");
        let cells = header.matches('|').count() - 1;
        let pod = row(&report, "from_pod ns/run (node1)", "none");
        assert_eq!(pod.len(), cells);
        // Fast columns only: via vxlan.1 ran without program figures.
        assert_eq!(
            pod[2..12],
            ["", "", "", "", "-", "880 (850–900)", "", "700", "", "-"]
        );
        assert!(pod[12..].iter().all(String::is_empty));
        let under = row(&report, "from_underlay ns/run (node2)", "none");
        assert_eq!(under[7], "560 (550–600)");
        assert_eq!(row(&report, "from_pod ns/run (node2)", "none")[7], "-");
        assert_eq!(row(&report, "from_vxlan ns/run (node1)", "none")[7], "-");
        // Per datagram, both nodes' programs: 900 + 550, 850 + 560, 880 + 600.
        let per = row(&report, "programs ns per datagram (both nodes)", "none");
        assert_eq!(per[7], "1450 (1410–1480)");
        assert_eq!(per[9], "1100");
        // Fast columns under rules measured nothing here.
        let kp = row(&report, "from_pod ns/run (node1)", "kube-proxy, 2000 svc");
        assert_eq!(kp[7], "-");
        assert_eq!(kp[4], "");
        assert!(report.contains("the programs' own cost (fast columns)"));
        assert!(report.contains(
            "| fast path (tc encap) | none | from_pod (node1) | 900, 850, 880 | 1000, 1000, 1000 |"
        ));
        assert!(
            report
                .contains("| fast path (tc encap) | none | from_pod (node2) | -, -, - | 0, 0, 0 |")
        );
    }
}
