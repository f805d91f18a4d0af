//! The report's headline as a chart: latency, one stream and small packets
//! per path without node rules, the underlay as the line to read each
//! path against (the targets are ratios to it).

use crate::chart::{Bar, Chart, Kind, Panel, Reference};
use crate::labbench::Results;
use crate::labbench::rulesets::Rules;
use crate::labbench::variants::Variant;
use crate::stats::median;

use super::figures::Measure;

/// The pod-to-pod columns, in the table's order. The floors (direct veth,
/// overlay) stay in the table: the underlay line is the one the targets
/// are set against.
const PATHS: [Variant; 7] = [
    Variant::Kernel,
    Variant::FastVxlan,
    Variant::Fast,
    Variant::KernelDirect,
    Variant::FastDirect,
    Variant::Kernel6,
    Variant::Fast6,
];

const MEASURES: [(Measure, &str); 3] = [
    (
        Measure::P50,
        "TCP latency p50, one-way (us), IPv4: lower is better",
    ),
    (Measure::Stream, "one TCP stream (Gbit/s): higher is better"),
    (
        Measure::UdpPerCpu,
        "64-byte UDP per CPU-second (kpps): higher is better",
    ),
];

/// The chart of `r`'s columns without node rules: a bar per path with its
/// median and min-max over runs; a column the run has no figure for is
/// left out. `caption` says which run it is (date, machine, runs).
pub(in crate::labbench) fn headline_chart(r: &Results, caption: Vec<String>) -> Chart {
    let values = |v: Variant, m: Measure| -> Vec<f64> {
        r.samples
            .get(&(v, Rules::None))
            .map(|ss| {
                ss.iter()
                    .map(|s| m.get(s))
                    .filter(|x| x.is_finite())
                    .collect()
            })
            .unwrap_or_default()
    };
    let panels = MEASURES
        .iter()
        .map(|&(m, title)| {
            let bars = PATHS
                .iter()
                // The IPv6 latency is another tool's (tcp-rr, not sockperf):
                // on one axis with the IPv4 bars it would read as a difference
                // of paths.
                .filter(|v| !(m.latency() && matches!(v, Variant::Kernel6 | Variant::Fast6)))
                .filter_map(|&v| {
                    let runs = values(v, m);
                    if runs.is_empty() {
                        return None;
                    }
                    let lo = runs.iter().copied().fold(f64::INFINITY, f64::min);
                    let hi = runs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    Some(Bar {
                        label: v.label().into(),
                        value: median(&runs),
                        range: Some((lo, hi)),
                        kind: if v.is_fast() {
                            Kind::Mycni
                        } else {
                            Kind::Baseline
                        },
                    })
                })
                .collect();
            let under = values(Variant::Underlay, m);
            Panel {
                title: title.into(),
                bars,
                reference: (!under.is_empty()).then(|| Reference {
                    label: "underlay (node->node)".into(),
                    value: median(&under),
                }),
            }
        })
        .collect();
    Chart {
        title: "mycni datapath: node1 pod -> node2 pod, no node rules".into(),
        caption,
        panels,
    }
}

/// What the chart of a bench run says about itself.
pub(in crate::labbench) fn chart_caption(runs: usize, seconds: u64) -> Vec<String> {
    vec![
        format!(
            "cargo xtask bench datapath: bars are medians of {runs} interleaved runs of {seconds} s, \
             whiskers their min-max; blue: eBPF fast path, grey: kernel path."
        ),
        format!(
            "Measured {} on {}.",
            crate::chart::today(),
            crate::chart::machine()
        ),
    ]
}
