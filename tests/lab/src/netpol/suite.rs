//! The whole NetworkPolicy suite on a model lab, in phases: the upstream
//! cases and the time-ordered ones on the nine model pods; a default-deny
//! with node rows (a node keeps its own pods); and, with a pod `y/d` added
//! whose `serve-80-tcp` is 8080, the named-port cases. `cargo xtask lab
//! netpol` and the e2e tests run it; the tests also judge every case with
//! the agent's own evaluator before running it.

use std::time::Instant;

use anyhow::Result;

use super::cases::{named_port_elsewhere, node_to_own_pod, time_ordered, upstream};
use super::{Case, CaseReport};
use crate::model::{ContainerPort, Proto};
use crate::{Lab, Pod, PodRequest};

/// A part of the suite: the probes' sources and the pods it needs.
#[derive(Debug, Clone)]
pub struct Phase {
    pub name: String,
    /// Probe from every node too.
    pub node_rows: bool,
    /// A pod added for the phase and deleted after it.
    pub extra_pod: Option<PodRequest>,
    /// Built from the lab's pods once the phase's pod is there.
    pub cases: fn(&[Pod]) -> Vec<Case>,
}

/// The pod whose named port maps elsewhere: `y/d` on node 2, its
/// `serve-80-tcp` on 8080.
pub fn pod_with_moved_port() -> PodRequest {
    let port = |name: &str, port, proto| ContainerPort {
        name: name.into(),
        port,
        proto,
    };
    PodRequest {
        namespace: "y".into(),
        name: "d".into(),
        node: 2,
        labels: vec![("pod".into(), "d".into())],
        ports: vec![
            port("serve-80-tcp", 8080, Proto::Tcp),
            port("serve-80-udp", 80, Proto::Udp),
            port("serve-81-tcp", 81, Proto::Tcp),
            port("serve-81-udp", 81, Proto::Udp),
        ],
    }
}

pub fn phases() -> Vec<Phase> {
    vec![
        Phase {
            name: "upstream cases 1-28".into(),
            node_rows: false,
            extra_pod: None,
            cases: upstream,
        },
        Phase {
            name: "time-ordered cases".into(),
            node_rows: false,
            extra_pod: None,
            cases: |_| time_ordered(),
        },
        Phase {
            name: "node to its own pod".into(),
            node_rows: true,
            extra_pod: None,
            cases: |pods| vec![node_to_own_pod(pods)],
        },
        Phase {
            name: "a named port on another number (y/d: serve-80-tcp=8080)".into(),
            node_rows: false,
            extra_pod: Some(pod_with_moved_port()),
            cases: |_| named_port_elsewhere("y/d"),
        },
    ]
}

/// What a phase hands the caller before each case: the phase, the lab's
/// pods then and the case, to judge by other means first.
pub type BeforeCase<'a> = dyn FnMut(&Phase, &[Pod], &Case) -> Result<()> + 'a;

impl Lab {
    /// Runs one phase: its pod added, every case whose name contains one
    /// of `only` (all when empty), its pod deleted.
    pub fn run_phase(
        &self,
        phase: &Phase,
        only: &[String],
        before: &mut BeforeCase<'_>,
    ) -> Result<Vec<CaseReport>> {
        if let Some(req) = &phase.extra_pod {
            self.add_kube_pod(req)?;
        }
        let run = (|| -> Result<Vec<CaseReport>> {
            let pods = self.pods()?;
            let set = self.probe_set(phase.node_rows)?;
            let mut out = Vec::new();
            for case in (phase.cases)(&pods) {
                if !only.is_empty() && !only.iter().any(|o| case.name.contains(o.as_str())) {
                    continue;
                }
                before(phase, &pods, &case)?;
                out.push(self.run_case(&set, &case)?);
            }
            Ok(out)
        })();
        if let Some(req) = &phase.extra_pod {
            self.delete_kube_pod(&req.namespace, &req.name)?;
        }
        run
    }

    /// Every phase; prints each case's report as it finishes.
    pub fn run_netpol_suite(
        &self,
        only: &[String],
        before: &mut BeforeCase<'_>,
    ) -> Result<Vec<CaseReport>> {
        let t0 = Instant::now();
        let mut all = Vec::new();
        for phase in phases() {
            eprintln!("netpol: {}", phase.name);
            for r in self.run_phase(&phase, only, before)? {
                eprint!("{}", r.describe());
                all.push(r);
            }
        }
        eprintln!(
            "netpol: {} cases in {:.1} s, {} failed",
            all.len(),
            t0.elapsed().as_secs_f64(),
            all.iter().filter(|r| !r.passed()).count()
        );
        Ok(all)
    }
}
