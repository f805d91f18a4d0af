//! The figures of the bench's report and how each is shown: the measures
//! and their targets, ratios, medians with their spread, the programs' own
//! cost rows and the floors paragraphs.

use std::fmt::Write as _;

use crate::labbench::NODES;
use crate::labbench::measure::Sample;
use crate::labbench::progs::PROGRAMS;
use crate::labbench::variants::Variant;
use crate::stats::median;

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
    let mid = ratio(median(num) / median(den), target);
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
    let mid = fmt(median(v));
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

/// The paragraph under the table: what no datapath in this lab can go
/// below, and where the p50 figures (`p50` of a column: none, medians) put
/// the targets.
pub(super) fn floors(p50: impl Fn(Variant) -> f64) -> String {
    let (d, u, ov, k, fv, f) = (
        p50(Variant::Direct),
        p50(Variant::Underlay),
        p50(Variant::Overlay),
        p50(Variant::Kernel),
        p50(Variant::FastVxlan),
        p50(Variant::Fast),
    );
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
