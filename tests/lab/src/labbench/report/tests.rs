//! The report rendered from made-up results: its columns, rows, spreads,
//! ratios, floors and the programs' own cost.

use std::time::Duration;

use super::figures::{Measure, ratio_runs, spread};
use super::render;
use crate::PathShare;
use crate::labbench::measure::Sample;
use crate::labbench::rulesets::Rules;
use crate::labbench::variants::Variant;
use crate::labbench::{Options, Results};

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
        "| fast direct/underlay (p50 <= 1.10; stream, UDP >= 0.90) | fast direct/kernel direct (stream >= 1.1, UDP >= 1.3) | IPv6 fast/kernel (stream >= 1.1, UDP >= 1.3) | IPv6/IPv4 fast (tc encap) | fast, flow events on/off (stream, UDP >= 0.98) |"
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
            "11.5", "15.1", "19.0", "22.7", "19.5", "16.0", "18.0", "15.5", "24.0", "16.8", "-",
            "1.06 ok", "0.70", "1.29", "0.86", "1.03 ok", "0.86", "0.70", "-", "-"
        ]
    );
    // 15.1 / 16.0 of the underlay's stream and UDP rate, 22.7 / 16.0 of
    // the kernel path's.
    let stream = row(&report, "TCP stream (Gbit/s)", "none");
    assert_eq!(stream[13..15], ["0.94 ok", "1.42 ok"]);
    let udp = row(&report, "UDP 64 B rx (kpps)", "none");
    assert_eq!(udp[13..15], ["0.94 ok", "1.42 ok"]);
    for label in ["UDP 64 B delivered (kpps)", "UDP 64 B per CPU-s (kpps)"] {
        let r = row(&report, label, "none");
        assert_eq!(r.len(), cells);
        assert_eq!(r[13..15], ["0.94 ok", "1.42 ok"]);
        // IPv6: 24.0 / 16.8 of the IPv6 kernel path's, 16.0 / 16.8 of
        // the IPv4 fast path's.
        assert_eq!(r[19..21], ["1.43 ok", "0.95"]);
    }
    // Direct routing: 15.1 / 15.5 of the underlay's, 18.0 / 15.5 of the
    // kernel path's with direct routing.
    assert_eq!(stream[17..19], ["0.97 ok", "1.16 ok"]);
    assert_eq!(stream[10..12], ["4.17", "5.95"]);
    assert_eq!(stream[19..21], ["1.43 ok", "0.95"]);
    // Rule rows: the direct veth and the underlay repeat their baseline,
    // the overlay and the fast path via vxlan.1 were not measured.
    let kp = row(&report, "TCP latency p50 (us)", "kube-proxy, 2000 svc");
    assert_eq!(
        kp[2..],
        [
            "(11.5)", "(15.1)", "-", "22.7", "-", "16.0", "18.0", "15.5", "-", "-", "-", "1.06 ok",
            "0.70", "-", "-", "1.03 ok", "0.86", "-", "-", "-"
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
    assert_eq!(p50[13], "1.13 MISS");
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
        p50[2..13],
        ["-", "-", "-", "-", "-", "19.5", "-", "-", "-", "-", "-"]
    );
    assert_eq!(p50[13..], ["-", "-", "-", "-", "-", "-", "-", "-", "-"]);
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
    assert_eq!(p50[13], "1.10 ok (1.00–1.10)");
    // The kernel path has one run: no pairs, the ratio alone.
    assert_eq!(p50[14], "0.73");
    assert_eq!(ratio_runs(&[1.0, 2.0], &[0.0, 1.0], None), "3.00");
    assert_eq!(ratio_runs(&[], &[1.0], None), "-");
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
        pod[2..13],
        [
            "",
            "",
            "",
            "",
            "-",
            "880 (850–900)",
            "",
            "700",
            "",
            "-",
            "-"
        ]
    );
    assert!(pod[13..].iter().all(String::is_empty));
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
        report.contains("| fast path (tc encap) | none | from_pod (node2) | -, -, - | 0, 0, 0 |")
    );
}
