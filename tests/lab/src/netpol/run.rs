//! The truth tables on a running lab: one `mycni-lab probe` per source
//! (a pod's or a node's namespace), all sources at once; a case's actions
//! through the API fixture; settling (re-probing until the tables match or
//! [`SETTLE`] has passed).

use std::io::Write as _;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::table::{Comparison, Observed};
use super::{Action, Case, Column, Expect, Reach, Via, policy_object};
use crate::model::{Proto, SERVE_PORTS, serve_port_name};
use crate::probe::{Target, parse_outcomes};
use crate::{Lab, ObjectRef, check_interrupted, pod_label};

/// How long a change may take to show in every table (the bound).
pub const SETTLE: Duration = Duration::from_secs(2);
/// A probe's timeout: a denied connection (dropped) costs this much, so a
/// round of probes takes about this long when anything is denied.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// One source's probes: its namespace, its name in the tables, and per
/// target the probe, its column and the destination's name.
#[derive(Debug, Clone)]
struct Source {
    netns: String,
    label: String,
    probes: Vec<(Target, Column, String)>,
}

/// What one round probes.
#[derive(Debug, Clone)]
pub struct ProbeSet {
    sources: Vec<Source>,
}

impl ProbeSet {
    pub fn len(&self) -> usize {
        self.sources.iter().map(|s| s.probes.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// UDP probes' source ports: a window of [`UDP_PORTS`] from here. Every
/// round takes the next ports after the last round's, whichever process
/// ran it (the cursor lives in the lab's state), so a 5-tuple comes back
/// only after the whole window: minutes, past the 120 s an answered UDP
/// flow's conntrack entry lives (see [`Target::sport`]). Sources share
/// the window: their addresses differ.
const UDP_PORT_BASE: usize = 1100;
const UDP_PORTS: usize = 63_000;

/// A step's outcome on the lab.
#[derive(Debug, Clone)]
pub struct StepReport {
    pub what: String,
    /// When the round whose tables matched started, after the actions;
    /// None: no round matched within [`SETTLE`].
    pub settled: Option<Duration>,
    pub rounds: usize,
    /// Each round's start and its false allows and denies, for a step
    /// that took more than one: how the tables converged.
    pub history: Vec<(Duration, usize, usize)>,
    pub observed: Observed,
    pub comparison: Comparison,
    pub expect: Expect,
}

impl StepReport {
    pub fn line(&self) -> String {
        let rounds = if self.history.len() > 1 {
            let r: Vec<String> = self
                .history
                .iter()
                .map(|(t, fa, fd)| format!("{:.2} s: {fa}/{fd}", t.as_secs_f64()))
                .collect();
            format!(
                "{} rounds, false allows/denies at each start: {}",
                self.rounds,
                r.join(", ")
            )
        } else {
            format!("{} round", self.rounds)
        };
        match self.settled {
            Some(t) => format!(
                "{}: settled by {:.2} s ({rounds}), {}",
                self.what,
                t.as_secs_f64(),
                self.comparison.summary()
            ),
            None => format!(
                "{}: NOT settled in {:.0} s ({rounds}), {}",
                self.what,
                SETTLE.as_secs_f64(),
                self.comparison.summary()
            ),
        }
    }

    /// The line, and the tables when they did not match.
    pub fn describe(&self) -> String {
        if self.comparison.matches() {
            format!("{}\n", self.line())
        } else {
            format!(
                "{}\n{}",
                self.line(),
                self.observed.report(Some(&self.expect))
            )
        }
    }
}

/// A case's outcome: its steps, then the return to all-open once its
/// policies are deleted.
#[derive(Debug, Clone)]
pub struct CaseReport {
    pub name: String,
    pub steps: Vec<StepReport>,
    pub took: Duration,
}

impl CaseReport {
    pub fn passed(&self) -> bool {
        self.steps.iter().all(|s| s.comparison.matches())
    }

    pub fn describe(&self) -> String {
        let mut out = format!(
            "case {} ({:.1} s): {}\n",
            self.name,
            self.took.as_secs_f64(),
            if self.passed() { "ok" } else { "FAILED" }
        );
        for s in &self.steps {
            for l in s.describe().lines() {
                out.push_str(&format!("  {l}\n"));
            }
        }
        out
    }
}

impl Lab {
    /// Every model pod (and every node, with `node_rows`) to every other
    /// model pod: TCP and UDP on the ports named `serve-80-*` and
    /// `serve-81-*` (resolved on the destination, as a Service's
    /// `targetPort` is), by pod IP and ClusterIP, per family.
    pub fn probe_set(&self, node_rows: bool) -> Result<ProbeSet> {
        let pods = self.pods()?;
        let kube: Vec<_> = pods.iter().filter(|p| p.kube.is_some()).collect();
        let mut sources: Vec<Source> = kube
            .iter()
            .map(|p| Source {
                netns: p.ns.clone(),
                label: pod_label(p),
                probes: Vec::new(),
            })
            .collect();
        if node_rows {
            for i in 1..=self.spec.nodes {
                sources.push(Source {
                    netns: self.spec.node_name(i),
                    label: format!("node{i}"),
                    probes: Vec::new(),
                });
            }
        }
        let mut id = 0;
        for src in &mut sources {
            for dst in &kube {
                let Some(k) = &dst.kube else { continue };
                let to = k.label();
                if to == src.label {
                    continue;
                }
                for family in self.spec.stack.families() {
                    let Some(ip) = dst.addr(family) else { continue };
                    for proto in [Proto::Tcp, Proto::Udp] {
                        for port in SERVE_PORTS {
                            let name = serve_port_name(port, proto);
                            for via in [Via::PodIp, Via::Service] {
                                let addr = match via {
                                    // A pod without the named port gets
                                    // probed on the nominal one: nothing
                                    // listens, and the cell shows it.
                                    Via::PodIp => {
                                        SocketAddr::new(ip, k.resolve(&name, proto).unwrap_or(port))
                                    }
                                    Via::Service => match k.cluster_ip_like(ip) {
                                        Some(vip) => SocketAddr::new(vip, port),
                                        None => continue,
                                    },
                                };
                                id += 1;
                                src.probes.push((
                                    Target {
                                        id,
                                        addr,
                                        proto,
                                        sport: 0,
                                    },
                                    Column {
                                        proto,
                                        port,
                                        family,
                                        via,
                                    },
                                    to.clone(),
                                ));
                            }
                        }
                    }
                }
            }
        }
        Ok(ProbeSet { sources })
    }

    /// The next `n` UDP source ports' first (as an offset in the window),
    /// moving the lab's cursor past them.
    fn take_udp_ports(&self, n: usize) -> Result<usize> {
        let file = self.spec.root.join("udp-port-cursor");
        let at = std::fs::read_to_string(&file)
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(0)
            % UDP_PORTS;
        std::fs::write(&file, ((at + n) % UDP_PORTS).to_string())?;
        Ok(at)
    }

    /// One round: every source probes all its targets at once.
    pub fn probe(&self, set: &ProbeSet) -> Result<Observed> {
        let lab = self.spec.bins.lab.to_string_lossy().into_owned();
        let timeout = PROBE_TIMEOUT.as_millis().to_string();
        let mut children = Vec::new();
        let udp_per_source = set
            .sources
            .iter()
            .map(|s| {
                s.probes
                    .iter()
                    .filter(|(t, _, _)| t.proto == Proto::Udp)
                    .count()
            })
            .max()
            .unwrap_or(0);
        let first_port = self.take_udp_ports(udp_per_source)?;
        for src in &set.sources {
            let mut child = Command::new("ip")
                .args(["netns", "exec", &src.netns, &lab, "probe"])
                .args(["--timeout-ms", &timeout])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .with_context(|| format!("probe in {}", src.netns))?;
            let mut next = first_port;
            let input: Vec<Value> = src
                .probes
                .iter()
                .map(|(t, _, _)| {
                    let mut t = t.clone();
                    if t.proto == Proto::Udp {
                        t.sport = (UDP_PORT_BASE + next % UDP_PORTS) as u16;
                        next += 1;
                    }
                    t.to_json()
                })
                .collect();
            child
                .stdin
                .take()
                .context("probe stdin")?
                .write_all(Value::Array(input).to_string().as_bytes())?;
            children.push((src, child));
        }
        let mut observed = Observed::default();
        for (src, child) in children {
            let out = child.wait_with_output()?;
            if !out.status.success() {
                bail!(
                    "probe in {}: {}",
                    src.netns,
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            let outcomes = parse_outcomes(&String::from_utf8_lossy(&out.stdout))?;
            for o in outcomes {
                let Some((_, col, to)) = src.probes.iter().find(|(t, _, _)| t.id == o.id) else {
                    continue;
                };
                observed
                    .0
                    .insert((*col, src.label.clone(), to.clone()), o.ok);
            }
        }
        Ok(observed)
    }

    /// Makes one change through the API, as kubectl would.
    pub fn apply_action(&self, a: &Action) -> Result<()> {
        match a {
            Action::Apply { ns, name, spec } => self
                .kube_apply("networkpolicies", &policy_object(ns, name, spec))
                .map(|_| ()),
            Action::Delete { ns, name } => self.kube_delete("networkpolicies", Some(ns), name),
            Action::LabelPod {
                ns,
                name,
                key,
                value,
            } => {
                let pod = ObjectRef {
                    resource: "pods",
                    ns: Some(ns),
                    name,
                };
                self.kube_label(pod, key, value.as_deref())
            }
            Action::LabelNamespace { ns, key, value } => {
                let namespace = ObjectRef {
                    resource: "namespaces",
                    ns: None,
                    name: ns,
                };
                self.kube_label(namespace, key, value.as_deref())
            }
        }
    }

    /// Probes until the tables match `expect` or [`SETTLE`] has passed
    /// since `since`.
    pub fn settle(
        &self,
        set: &ProbeSet,
        expect: &Expect,
        since: Instant,
        what: &str,
    ) -> Result<StepReport> {
        let mut rounds = 0;
        let mut history = Vec::new();
        loop {
            check_interrupted()?;
            let started = since.elapsed();
            let observed = self.probe(set)?;
            rounds += 1;
            let comparison = observed.compare(expect);
            history.push((
                started,
                comparison.false_allows.len(),
                comparison.false_denies.len(),
            ));
            let matched = comparison.matches();
            if matched || since.elapsed() >= SETTLE {
                return Ok(StepReport {
                    what: what.to_string(),
                    settled: matched.then_some(started),
                    rounds,
                    history,
                    observed,
                    comparison,
                    expect: expect.clone(),
                });
            }
        }
    }

    /// A case on the lab: each step's actions, then its tables settled;
    /// then its policies deleted and everything open again.
    pub fn run_case(&self, set: &ProbeSet, case: &Case) -> Result<CaseReport> {
        let t0 = Instant::now();
        let mut steps = Vec::new();
        let run = (|| -> Result<()> {
            for (n, step) in case.steps.iter().enumerate() {
                let since = Instant::now();
                for a in &step.actions {
                    self.apply_action(a)?;
                }
                let what = format!(
                    "step {}: {}",
                    n + 1,
                    step.actions
                        .iter()
                        .map(Action::describe)
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                steps.push(self.settle(set, &step.expect, since, &what)?);
            }
            Ok(())
        })();
        // Whatever happened, the next case starts from no policy.
        let since = Instant::now();
        let mut cleanup = Ok(());
        for (ns, name) in case.policies() {
            if let Err(e) = self.kube_delete("networkpolicies", Some(&ns), &name) {
                cleanup = Err(e);
            }
        }
        run?;
        cleanup?;
        steps.push(self.settle(
            set,
            &Reach::all(true).into(),
            since,
            "policies deleted, all open",
        )?);
        Ok(CaseReport {
            name: case.name.clone(),
            steps,
            took: t0.elapsed(),
        })
    }
}
