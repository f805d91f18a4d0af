//! The policy bench's report: per datapath, every column's figures (median
//! of runs, min-max) and their ratios to no policy, the first packet's
//! added latency, the programs' own cost with and without the generation
//! check; the shapes and what they became in the kernel; a chart of the
//! ratios.

use std::fmt::Write as _;
use std::time::Duration;

use super::shape::{Shape, State};
use super::{Datapath, Options, Results};
use crate::chart::{Bar, Chart, Kind, Panel, Reference};
use crate::labbench::thousands;
use crate::stats::median;

/// One row of a table: a figure of a column's runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fig {
    P50,
    P99,
    Stream,
    UdpPerCpu,
    ConnPerSec,
    ConnectP50,
    ConnectP99,
    /// node1's `mycni_from_pod`, ns per run (encapsulates each datagram).
    FromPod,
    /// node2's `mycni_from_underlay`, ns per run (decapsulates it and
    /// checks its flow's stamp).
    FromUnderlay,
    /// Every program's run time per datagram delivered, ns.
    ProgsPerDatagram,
}

impl Fig {
    const ALL: [Fig; 10] = [
        Fig::P50,
        Fig::P99,
        Fig::Stream,
        Fig::UdpPerCpu,
        Fig::ConnPerSec,
        Fig::ConnectP50,
        Fig::ConnectP99,
        Fig::FromPod,
        Fig::FromUnderlay,
        Fig::ProgsPerDatagram,
    ];

    fn label(self) -> &'static str {
        match self {
            Fig::P50 => "TCP p50, one-way (us)",
            Fig::P99 => "TCP p99, one-way (us)",
            Fig::Stream => "one TCP stream (Gbit/s)",
            Fig::UdpPerCpu => "64-byte UDP per CPU-s (kpps)",
            Fig::ConnPerSec => "new connections/s (connect, echo, close)",
            Fig::ConnectP50 => "connect() p50 (us)",
            Fig::ConnectP99 => "connect() p99 (us)",
            Fig::FromPod => "from_pod ns/run (node1)",
            Fig::FromUnderlay => "from_underlay ns/run (node2)",
            Fig::ProgsPerDatagram => "all programs, ns per datagram",
        }
    }

    fn programs(self) -> bool {
        matches!(
            self,
            Fig::FromPod | Fig::FromUnderlay | Fig::ProgsPerDatagram
        )
    }

    fn connect(self) -> bool {
        matches!(self, Fig::ConnPerSec | Fig::ConnectP50 | Fig::ConnectP99)
    }

    /// The figure of every run of a column, in run order; NaN where a run
    /// has none (a program that did not run).
    pub(super) fn runs(self, r: &Results, dp: Datapath, st: State) -> Vec<f64> {
        if self.connect() {
            let crr = r.crr.get(&(dp, st)).map(Vec::as_slice).unwrap_or_default();
            return crr
                .iter()
                .map(|c| match self {
                    Fig::ConnPerSec => c.per_sec,
                    Fig::ConnectP50 => c.connect_p50_us,
                    _ => c.connect_p99_us,
                })
                .collect();
        }
        let samples = r
            .samples
            .get(&(dp, st))
            .map(Vec::as_slice)
            .unwrap_or_default();
        samples
            .iter()
            .map(|s| {
                let prog = |node, name| {
                    s.progs
                        .runs
                        .get(&(node, name))
                        .and_then(|p| p.ns_per_run())
                        .unwrap_or(f64::NAN)
                };
                match self {
                    Fig::P50 => s.p50_us,
                    Fig::P99 => s.p99_us,
                    Fig::Stream => s.stream_gbps,
                    Fig::UdpPerCpu => s.udp_kpps_per_cpu,
                    Fig::FromPod => prog(1, "mycni_from_pod"),
                    Fig::FromUnderlay => prog(2, "mycni_from_underlay"),
                    Fig::ProgsPerDatagram => s.progs.ns_per_datagram().unwrap_or(f64::NAN),
                    Fig::ConnPerSec | Fig::ConnectP50 | Fig::ConnectP99 => f64::NAN,
                }
            })
            .collect()
    }

    fn fmt(self, v: f64) -> String {
        if !v.is_finite() {
            return "-".into();
        }
        match self {
            Fig::Stream => format!("{v:.2}"),
            Fig::P50 | Fig::P99 | Fig::UdpPerCpu | Fig::ConnectP50 | Fig::ConnectP99 => {
                format!("{v:.1}")
            }
            _ => format!("{v:.0}"),
        }
    }

    /// Issue 26's target for this figure's ratio in `st`, as text.
    fn target(self, st: State) -> Option<&'static str> {
        match (self, st) {
            (Fig::P50, State::Many) => Some("<= 1.01"),
            (Fig::Stream | Fig::UdpPerCpu, State::Many) => Some(">= 0.99"),
            (Fig::ConnPerSec, State::Ten) => Some(">= 0.95"),
            (Fig::ConnPerSec, State::Many | State::IpBlock) => Some(">= 0.90"),
            _ => None,
        }
    }
}

/// Finite values only.
fn finite(v: &[f64]) -> Vec<f64> {
    v.iter().copied().filter(|x| x.is_finite()).collect()
}

/// `median (min–max)` of a column's runs.
pub(super) fn spread(f: Fig, runs: &[f64]) -> String {
    let v = finite(runs);
    if v.is_empty() {
        return "-".into();
    }
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    // One run, or runs that agree to the figure's precision: one number.
    if f.fmt(lo) == f.fmt(hi) {
        f.fmt(median(&v))
    } else {
        format!("{} ({}–{})", f.fmt(median(&v)), f.fmt(lo), f.fmt(hi))
    }
}

/// The ratio of medians `with / base`, and the min-max of the same ratio
/// run by run (runs pair up by index: both columns ran in every run).
pub(super) fn ratio(with: &[f64], base: &[f64]) -> Option<(f64, f64, f64)> {
    let (w, b) = (finite(with), finite(base));
    if w.is_empty() || b.is_empty() || median(&b) == 0.0 {
        return None;
    }
    let per_run: Vec<f64> = with
        .iter()
        .zip(base)
        .filter(|(w, b)| w.is_finite() && b.is_finite() && **b != 0.0)
        .map(|(w, b)| w / b)
        .collect();
    let lo = per_run.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = per_run.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some((median(&w) / median(&b), lo, hi))
}

fn ratio_text(r: Option<(f64, f64, f64)>, target: Option<&str>) -> String {
    let Some((m, lo, hi)) = r else {
        return "-".into();
    };
    let spread = if lo.is_finite() && hi.is_finite() && hi > lo {
        format!(" ({lo:.3}–{hi:.3})")
    } else {
        String::new()
    };
    let target = target.map(|t| format!(" [{t}]")).unwrap_or_default();
    format!("{m:.3}{spread}{target}")
}

/// `with - base` of medians, in the figure's unit: the first packet's
/// added latency.
fn added(with: &[f64], base: &[f64]) -> String {
    let (w, b) = (finite(with), finite(base));
    if w.is_empty() || b.is_empty() {
        return "-".into();
    }
    format!("{:+.1}", median(&w) - median(&b))
}

/// How the run went on this machine: how long it took, and the load
/// average before and after it.
pub(super) struct RunConditions<'a> {
    pub(super) took: Duration,
    pub(super) load_before: &'a str,
    pub(super) load_after: &'a str,
}

pub(super) fn render(r: &Results, o: &Options, shape: &Shape, run: &RunConditions) -> String {
    let &RunConditions {
        took,
        load_before,
        load_after,
    } = run;
    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(
        w,
        "# mycni NetworkPolicy datapath bench (`cargo xtask bench policy`)\n"
    );
    let _ = writeln!(
        w,
        "node1's pod `bench/client` -> node2's pod `bench/server` (a 2-node IPv4 lab, Pod \
         objects with labels), on the eBPF datapath (tc encap) and on `--datapath kernel`. \
         {} interleaved runs (odd runs in the other order): median of runs (min–max); {} s \
         per measure; {:.0} s in all. Load average before: {load_before}; after: \
         {load_after}. Pinning: {}.\n",
        o.runs,
        o.seconds,
        took.as_secs_f64(),
        match o.pin_cpu {
            Some(c) => format!("both ends of every tool on CPU {c}"),
            None => "none".into(),
        }
    );
    let _ = writeln!(w, "## The columns\n");
    for st in State::ALL {
        let what = match st {
            State::Off => "the reference every ratio divides by: no NetworkPolicy in the \
                 cluster and the agents' `--network-policy=false` (no `inet mycni_policy` \
                 table; the fast path's epoch 0, so it checks no stamp)"
                .to_string(),
            State::Open => "enforcement on, no policy: the table is there and every pod \
                 unisolated; the fast path checks each flow's stamp"
                .to_string(),
            State::Pair => "`allow-pair` alone: selects both pods (`role in (client, \
                 server)`), isolates both ways, allows client -> server on the measures' \
                 ports (TCP 11111, 5201, 7777; UDP 5201) and nothing else"
                .to_string(),
            State::Ten => "`allow-pair` and 9 decoys (connect loop only)".to_string(),
            State::Many => format!(
                "`allow-pair` and {} decoys: one in eight selects the server and allows one \
                 more outside /32 on one more port into it, one in eight selects the client \
                 and allows it one more /32 and port out (both grow the pair's own sets \
                 without matching it), six in eight select `app: decoy-<i>`, which no pod \
                 carries",
                thousands(shape.policies - 1)
            ),
            State::IpBlock => format!(
                "`allow-pair` and one policy selecting the server whose ingress lists {} \
                 ipBlocks on TCP 7777: {} non-adjacent /32s of 100.64.0.0/10 and the \
                 client node's podCIDR {} (connect loop only)",
                thousands(shape.prefixes),
                thousands(shape.prefixes - 1),
                shape.client_cidr
            ),
        };
        let elements: Vec<String> = Datapath::ALL
            .iter()
            .filter_map(|dp| {
                let e = r.elements.get(&(*dp, st))?;
                Some(format!(
                    "{}: {}",
                    dp.short(),
                    e.iter()
                        .map(|n| thousands(*n as usize))
                        .collect::<Vec<_>>()
                        .join(" / ")
                ))
            })
            .collect();
        let settled = r
            .settled
            .get(&st)
            .map(|v| {
                let ms: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1e3).collect();
                format!(
                    "; written through the API and reported by both agents in {:.0} ms \
                     (median; the agents' metrics, not probes)",
                    median(&ms)
                )
            })
            .unwrap_or_default();
        let _ = writeln!(
            w,
            "- **{}**: {what}. Policy set elements node1 / node2: {}{settled}.",
            st.label(shape),
            if elements.is_empty() {
                "-".into()
            } else {
                elements.join(", ")
            }
        );
    }
    let _ = writeln!(
        w,
        "\nBefore each column the bench waits until both agents report the column's policies \
         (`mycni_policy_policies`) and their bench pod isolated (`mycni_policy_isolated_pods` \
         1), the client connects to the server's echo port, and a port no policy opens \
         (TCP 80, served) is refused; then for quiet agents.\n"
    );
    let _ = writeln!(
        w,
        "Measures: the datapath bench's (`sockperf ping-pong --tcp -m 64` p50 and p99 \
         one-way; `iperf3 -c` one stream; `iperf3 -u -l 64 -b 0`, datagrams delivered per \
         CPU-second of the measure's own tasks, without its first 2 s), in the columns an \
         established flow is about; and `mycni-lab tcp-crr` in every column: connect, one \
         byte echoed, close, again, for the measure's seconds (new connections per second), \
         with each connect()'s time, which is the first packet's round trip (a SYN is always \
         judged by nftables; the fast path never carries it). On the fast path, the programs' \
         own run time (bpf_stats, run_time_ns / run_cnt) over the UDP window: `from_underlay` \
         on node2 is where an established flow's stamp is checked against the epoch.\n"
    );
    for dp in Datapath::ALL {
        let states: Vec<State> = State::ALL
            .into_iter()
            .filter(|st| r.crr.contains_key(&(dp, *st)))
            .collect();
        if states.is_empty() {
            continue;
        }
        let _ = writeln!(w, "## {}\n", dp.label());
        let head: Vec<String> = states.iter().map(|st| st.label(shape)).collect();
        let _ = writeln!(w, "| measure | {} |", head.join(" | "));
        let _ = writeln!(w, "|---|{}", "---|".repeat(head.len()));
        for f in Fig::ALL {
            if f.programs() && dp == Datapath::Kernel {
                continue;
            }
            let cells: Vec<String> = states
                .iter()
                .map(|st| spread(f, &f.runs(r, dp, *st)))
                .collect();
            let _ = writeln!(w, "| {} | {} |", f.label(), cells.join(" | "));
        }
        let _ = writeln!(
            w,
            "\nRatios to no policy (ratio of medians, run-by-run min–max in parentheses, \
             issue 26's target in brackets; for latency and program time lower is better):\n"
        );
        let others: Vec<State> = states
            .iter()
            .copied()
            .filter(|s| *s != State::Off)
            .collect();
        let head: Vec<String> = others.iter().map(|st| st.label(shape)).collect();
        let _ = writeln!(w, "| measure | {} |", head.join(" | "));
        let _ = writeln!(w, "|---|{}", "---|".repeat(head.len()));
        for f in Fig::ALL {
            if f.programs() && dp == Datapath::Kernel {
                continue;
            }
            let base = f.runs(r, dp, State::Off);
            let cells: Vec<String> = others
                .iter()
                .map(|st| ratio_text(ratio(&f.runs(r, dp, *st), &base), f.target(*st)))
                .collect();
            let _ = writeln!(w, "| {} | {} |", f.label(), cells.join(" | "));
        }
        for (f, what) in [
            (Fig::ConnectP50, "p50"),
            (Fig::ConnectP99, "p99 [target <= 20 us]"),
        ] {
            let base = f.runs(r, dp, State::Off);
            let cells: Vec<String> = others
                .iter()
                .map(|st| added(&f.runs(r, dp, *st), &base))
                .collect();
            let _ = writeln!(
                w,
                "| first packet's added latency, {what} (us) | {} |",
                cells.join(" | ")
            );
        }
        if dp == Datapath::Ebpf {
            let base = Fig::ProgsPerDatagram.runs(r, dp, State::Off);
            let cells: Vec<String> = others
                .iter()
                .map(|st| added(&Fig::ProgsPerDatagram.runs(r, dp, *st), &base))
                .collect();
            let _ = writeln!(
                w,
                "| the generation check and policy, programs' ns per datagram added | {} |",
                cells.join(" | ")
            );
        }
        let _ = writeln!(w);
    }
    let _ = writeln!(w, "## Per run\n");
    let _ = writeln!(w, "| datapath | column | measure | runs |");
    let _ = writeln!(w, "|---|---|---|---|");
    for dp in Datapath::ALL {
        for st in State::ALL {
            for f in Fig::ALL {
                let v = f.runs(r, dp, st);
                if finite(&v).is_empty() {
                    continue;
                }
                let runs: Vec<String> = v.iter().map(|x| f.fmt(*x)).collect();
                let _ = writeln!(
                    w,
                    "| {} | {} | {} | {} |",
                    dp.short(),
                    st.label(shape),
                    f.label(),
                    runs.join(", ")
                );
            }
        }
    }
    s
}

/// The headline ratios as a chart: a panel per measure, a bar per
/// datapath and column, the reference at 1.
pub(super) fn chart(r: &Results, o: &Options, shape: &Shape) -> Chart {
    let panels = [
        (Fig::P50, "TCP p50 / no policy: lower is better"),
        (Fig::Stream, "one TCP stream / no policy: higher is better"),
        (
            Fig::UdpPerCpu,
            "64-byte UDP per CPU-s / no policy: higher is better",
        ),
        (
            Fig::ConnPerSec,
            "new connections/s / no policy: higher is better",
        ),
    ]
    .into_iter()
    .map(|(f, title)| {
        let bars = Datapath::ALL
            .iter()
            .flat_map(|&dp| {
                State::ALL
                    .into_iter()
                    .filter(|st| *st != State::Off)
                    .filter_map(move |st| {
                        let (m, lo, hi) = ratio(&f.runs(r, dp, st), &f.runs(r, dp, State::Off))?;
                        Some(Bar {
                            label: format!("{}, {}", dp.short(), st.label(shape)),
                            value: m,
                            range: (lo.is_finite() && hi.is_finite()).then_some((lo, hi)),
                            kind: match dp {
                                Datapath::Ebpf => Kind::Mycni,
                                Datapath::Kernel => Kind::Baseline,
                            },
                        })
                    })
            })
            .collect();
        Panel {
            title: title.into(),
            bars,
            reference: Some(Reference {
                label: "no policy".into(),
                value: 1.0,
            }),
        }
    })
    .collect();
    Chart {
        title: "mycni NetworkPolicy: node1 pod -> node2 pod, ratio to no policy".into(),
        caption: vec![
            format!(
                "cargo xtask bench policy: bars are ratios of medians of {} interleaved runs \
                 of {} s, whiskers the run-by-run min-max; blue: eBPF fast path, grey: kernel \
                 path.",
                o.runs, o.seconds
            ),
            format!(
                "Measured {} on {}.",
                crate::chart::today(),
                crate::chart::machine()
            ),
        ],
        panels,
    }
}

#[cfg(test)]
mod tests {
    use super::super::crr::Crr;
    use super::*;

    #[test]
    fn ratios_of_medians_with_the_run_by_run_spread() {
        let (m, lo, hi) = ratio(&[9.0, 10.0, 12.0], &[10.0, 10.0, 10.0]).expect("a ratio");
        assert!((m - 1.0).abs() < 1e-9);
        assert!((lo - 0.9).abs() < 1e-9 && (hi - 1.2).abs() < 1e-9);
        assert_eq!(ratio(&[], &[1.0]), None);
        assert_eq!(ratio(&[1.0], &[0.0]), None);
        // A run without a figure pairs with nothing.
        let (m, lo, hi) = ratio(&[f64::NAN, 4.0], &[2.0, 2.0]).expect("a ratio");
        assert_eq!((m, lo, hi), (2.0, 2.0, 2.0));
        assert_eq!(
            ratio_text(Some((0.98765, 0.9, 1.0)), Some(">= 0.99")),
            "0.988 (0.900–1.000) [>= 0.99]"
        );
        assert_eq!(ratio_text(Some((1.0, 1.0, 1.0)), None), "1.000");
        assert_eq!(ratio_text(None, None), "-");
        assert_eq!(added(&[61.0, 63.0], &[50.0]), "+12.0");
        assert_eq!(spread(Fig::Stream, &[1.0, 3.0, 2.0]), "2.00 (1.00–3.00)");
        assert_eq!(spread(Fig::Stream, &[f64::NAN]), "-");
    }

    #[test]
    fn the_report_shows_every_column_against_no_policy() {
        let shape = Shape {
            policies: 1000,
            prefixes: 10_000,
            client_cidr: "10.244.1.0/24".into(),
        };
        let o = Options {
            runs: 2,
            seconds: 1,
            policies: 1000,
            prefixes: 10_000,
            pin_cpu: Some(1),
            out: None,
        };
        let mut r = Results::default();
        for dp in Datapath::ALL {
            for st in State::ALL {
                let k = if st == State::Off { 100.0 } else { 95.0 };
                let c = Crr {
                    connections: 10,
                    per_sec: k * 10.0,
                    connect_p50_us: 1000.0 / k,
                    connect_p99_us: 2000.0 / k,
                };
                r.crr.insert((dp, st), vec![c, c]);
                r.elements.insert((dp, st), vec![3, 4]);
            }
        }
        let run = RunConditions {
            took: Duration::from_secs(60),
            load_before: "0.1",
            load_after: "0.2",
        };
        let text = render(&r, &o, &shape, &run);
        assert!(text.contains("## eBPF fast path (tc encap)"));
        assert!(text.contains("## kernel path"));
        assert!(text.contains("| new connections/s (connect, echo, close) | 1000 | 950 |"));
        assert!(text.contains("0.950 [>= 0.95]"), "{text}");
        assert!(text.contains("0.950 [>= 0.90]"));
        assert!(text.contains("1,000 policies"));
        assert!(text.contains("10,000-prefix ipBlock"));
        assert!(text.contains("first packet's added latency, p50 (us) | +0.5"));
        let chart = chart(&r, &o, &shape);
        assert_eq!(chart.panels.len(), 4);
        // No established-flow figure in this test: only the connect panel
        // has bars, five columns a datapath.
        assert_eq!(chart.panels[3].bars.len(), 10);
        assert!(chart.panels[0].bars.is_empty());
        assert!(crate::chart::svg(&chart).is_ok());
    }
}
