//! The agent bench's headline figures and their chart: converging N peers
//! against `ip -batch` writing the same entries, and one event's latency.

use mycni_lab::chart::{Bar, Chart, Kind, Panel, Reference};

/// What the chart shows of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    pub nodes: usize,
    /// The initial Node list complete -> every route, neighbour and FDB
    /// entry in the kernel.
    pub list_to_programmed_s: f64,
    /// `ip -batch` writing the same entries through a nexthop per peer, as
    /// the agent does.
    pub ip_batch_s: f64,
    /// The same with routes `via … onlink`.
    pub ip_batch_onlink_s: f64,
    /// Medians, one event at a time.
    pub update_ms: f64,
    pub host_ip_ms: f64,
    pub delete_ms: f64,
    pub rss_mb: f64,
}

impl Figures {
    pub fn chart(&self, caption: Vec<String>) -> Chart {
        let bar = |label: &str, value: f64, kind| Bar {
            label: label.into(),
            value,
            range: None,
            kind,
        };
        Chart {
            title: format!(
                "mycni-agent with {} peer Nodes against ip -batch",
                self.nodes
            ),
            caption,
            panels: vec![
                Panel {
                    title: "list complete -> all peers programmed (s): lower is better".into(),
                    bars: vec![
                        bar("mycni-agent", self.list_to_programmed_s, Kind::Mycni),
                        bar("ip -batch, nexthops", self.ip_batch_s, Kind::Baseline),
                        bar(
                            "ip -batch, routes via onlink",
                            self.ip_batch_onlink_s,
                            Kind::Baseline,
                        ),
                    ],
                    reference: Some(Reference {
                        label: "ip -batch, nexthops".into(),
                        value: self.ip_batch_s,
                    }),
                },
                Panel {
                    title: "one Node event -> kernel, median (ms): lower is better".into(),
                    bars: vec![
                        bar("VTEP MAC change", self.update_ms, Kind::Mycni),
                        bar("host-IP change", self.host_ip_ms, Kind::Mycni),
                        bar("Node deleted", self.delete_ms, Kind::Mycni),
                    ],
                    reference: None,
                },
                Panel {
                    title: "peak RSS of the agent (MB): lower is better".into(),
                    bars: vec![bar("mycni-agent", self.rss_mb, Kind::Mycni)],
                    reference: None,
                },
            ],
        }
    }
}

/// What the chart of a bench run says about itself.
pub fn caption(full: bool) -> Vec<String> {
    vec![
        format!(
            "cargo xtask bench agent{}: one agent, a 1-node lab, the in-process API fixture; \
             blue: mycni-agent, grey: the same entries written by ip -batch.",
            if full { " --full-nodes" } else { "" }
        ),
        format!(
            "Measured {} on {}.",
            mycni_lab::chart::today(),
            mycni_lab::chart::machine()
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The README's agent bench (2026-11-21, 5,000 minimal Nodes): 0.88 s
    /// against `ip -batch`'s 0.73 s, an update 16 ms, a delete 11 ms,
    /// 33 MB; the onlink reference and the host-IP change were not
    /// published with it (NaN: left out).
    fn published() -> Figures {
        Figures {
            nodes: 5000,
            list_to_programmed_s: 0.88,
            ip_batch_s: 0.73,
            ip_batch_onlink_s: f64::NAN,
            update_ms: 16.0,
            host_ip_ms: f64::NAN,
            delete_ms: 11.0,
            rss_mb: 33.0,
        }
    }

    fn caption() -> Vec<String> {
        vec![
            "cargo xtask bench agent, 2026-11-21: 5,000 minimal Nodes, one agent, the in-process \
             API fixture; blue: mycni-agent, grey: the same entries written by ip -batch."
                .into(),
            "Measured on this project's VM: 2 vCPUs (AMD EPYC), Linux 6.18, Debian 12.".into(),
        ]
    }

    #[test]
    fn the_chart_has_the_agent_the_reference_and_the_events() {
        let chart = published().chart(caption());
        let wanted = [
            "mycni-agent with 5000 peer Nodes against ip -batch",
            "mycni-agent",
            "ip -batch, nexthops 0.73",
            "VTEP MAC change",
            "16.0",
        ];
        match mycni_lab::chart::missing_texts(&chart, &wanted) {
            Ok(m) => assert!(m.is_empty(), "not in the chart: {m:?}"),
            Err(e) => panic!("{e:#}"),
        }
        // Not published: left out, not drawn as zero.
        match mycni_lab::chart::missing_texts(&chart, &["host-IP change"]) {
            Ok(m) => assert_eq!(m, ["host-IP change"]),
            Err(e) => panic!("{e:#}"),
        }
    }

    /// Writes the chart `docs/benchmarks.md` shows (see
    /// `labbench/report/published.rs` for the command).
    #[test]
    #[ignore = "writes docs/benchmarks/agent.svg"]
    fn published_charts_agent() {
        if let Err(e) = mycni_lab::chart::write_published("agent", &published().chart(caption())) {
            panic!("{e:#}");
        }
    }
}
