//! The figures `docs/benchmarks.md` publishes, as the bench's own results,
//! so the chart there is drawn by the code that draws a run's.
//!
//! `cargo test -p mycni-lab published_charts -- --ignored` writes
//! `docs/benchmarks/datapath.svg` from them (and the plugin's and the
//! agent's from theirs, in `mycni-bench`). After a new quiet run, replace
//! the figures here with its medians' runs, or copy the run's own
//! `target/lab-bench.svg` into `docs/benchmarks/`.

use crate::labbench::Results;
use crate::labbench::measure::Sample;
use crate::labbench::rulesets::Rules;
use crate::labbench::variants::Variant;

use super::chart::headline_chart;

/// A run's sample with the figures the docs publish; NaN where they
/// publish none (the chart leaves those out).
fn sample(p50_us: f64, stream_gbps: f64, udp_kpps_per_cpu: f64) -> Sample {
    Sample {
        p50_us,
        p99_us: f64::NAN,
        stream_gbps,
        udp_kpps: f64::NAN,
        udp_loss_pct: f64::NAN,
        udp_delivered_kpps: f64::NAN,
        udp_kpps_per_cpu,
        progs: Default::default(),
    }
}

/// The quiet pair of 2026-11-26: two invocations of the default bench (5
/// runs of 3 s) back to back, nothing else running, no node rules. Each
/// column's two invocation medians, low and high: the chart's bar is
/// their mean (the median of two) and its whisker the two.
pub(super) fn quiet_pair() -> Results {
    let nan = f64::NAN;
    let mut r = Results::default();
    for (v, lo, hi) in [
        (
            Variant::Direct,
            sample(6.4, nan, nan),
            sample(6.4, nan, nan),
        ),
        (
            Variant::Underlay,
            sample(8.6, 13.6, 109.0),
            sample(8.6, 14.2, 111.0),
        ),
        (
            Variant::Kernel,
            sample(13.5, 12.1, 64.0),
            sample(13.8, 12.8, 67.0),
        ),
        (
            Variant::Fast,
            sample(9.6, 13.8, 91.0),
            sample(10.0, 13.9, 93.0),
        ),
        (
            Variant::Kernel6,
            sample(nan, nan, 56.0),
            sample(nan, nan, 58.0),
        ),
        (
            Variant::Fast6,
            sample(nan, nan, 88.0),
            sample(nan, nan, 93.0),
        ),
    ] {
        r.samples.insert((v, Rules::None), vec![lo, hi]);
    }
    r
}

pub(super) fn caption() -> Vec<String> {
    vec![
        "cargo xtask bench datapath, the quiet pair of 2026-11-26: bars are the mean of two \
         invocations' medians (5 runs of 3 s each), whiskers the two; blue: eBPF fast path, \
         grey: kernel path."
            .into(),
        "Measured on this project's VM: 2 vCPUs (AMD EPYC), Linux 6.18, Debian 12; the \
         measuring processes pinned to one CPU."
            .into(),
    ]
}

#[test]
fn the_published_chart_has_the_paths_and_the_underlay() {
    let chart = headline_chart(&quiet_pair(), caption());
    let wanted = [
        "kernel path",
        "fast path (tc encap)",
        "fast path (tc encap), IPv6",
        "underlay (node->node) 8.6",
        // The fast path's p50: the mean of 9.6 and 10.0.
        "9.8",
        // The columns the pair published no figure for are left out, not
        // drawn as zero.
        "fast path via vxlan.1",
        "fast path, direct routing",
    ];
    match crate::chart::missing_texts(&chart, &wanted) {
        Ok(m) => assert_eq!(
            m,
            ["fast path via vxlan.1", "fast path, direct routing"],
            "the chart shows or lacks the wrong labels"
        ),
        Err(e) => panic!("{e:#}"),
    }
}

/// Writes the chart `docs/benchmarks.md` shows; run by hand (see the
/// module's doc).
#[test]
#[ignore = "writes docs/benchmarks/datapath.svg"]
fn published_charts_datapath() {
    let chart = headline_chart(&quiet_pair(), caption());
    if let Err(e) = crate::chart::write_published("datapath", &chart) {
        panic!("{e:#}");
    }
}
