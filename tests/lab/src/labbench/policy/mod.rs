//! `cargo xtask bench policy`: what NetworkPolicy costs the datapath, as
//! ratios to no policy from one run.
//!
//! A 2-node lab (`mycnipb-*`, [`ROOT`]) with two pods that have Pod objects
//! (namespace `bench`, `role=client` on node1, `role=server` on node2), on
//! the eBPF datapath (tc encap) and on `--datapath kernel`, in the states of
//! [`shape::State`]: no policy with enforcement off (the reference: no
//! table, the fast path's epoch 0, so no stamp check), enforcement on with
//! no policy, then 1, 10 and N policies and a K-prefix ipBlock, every one
//! of them selecting both pods and allowing the pair (checked before each
//! column: both agents read the policies and isolate their bench pod, the
//! pair connects, and a port no policy opens does not).
//!
//! Measures: the datapath bench's own (`super::measure`: sockperf p50, one
//! iperf3 stream, 64-byte UDP per CPU-second, and on the fast path the
//! programs' bpf_stats run time over the UDP window) in the states an
//! established flow is about, and a connect loop (`mycni-lab tcp-crr`:
//! connections per second and connect() time, the first packet's round
//! trip) in all of them. Runs interleave datapaths and states (odd runs in
//! the other order) so a drift in the machine's load does not favour one.
//! `report` turns them into ratios against the reference, and a chart.

mod crr;
mod report;
mod shape;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use mycni_testkit::sh;

pub use crr::{Crr, format_crr, parse_crr, tcp_crr};

use super::measure::{Pair, Proc, Sample, argv, measure, pin_prefix, warm_up};
use super::progs::watch_programs;
use super::variants::wait_agents_idle;
use super::{BenchLab, UDP_OMIT};
use crate::model::{ContainerPort, NAMESPACE_NAME_LABEL, Proto, namespace_object};
use crate::{Bins, Lab, PodRequest, Spec, Stack, catch_interrupts, check_interrupted, wait_for};
use shape::{CLIENT, DENIED_PORT, ECHO_PORT, NAMESPACE, ROLE, SERVER, Shape, State};

/// Namespace prefix and state directory: apart from the CLI lab, the
/// datapath bench's and the soak's, so this bench never touches theirs.
pub const PREFIX: &str = "mycnipb";
pub const ROOT: &str = "/run/mycni-policy-bench-lab";

pub const DEFAULT_RUNS: usize = 5;
pub const DEFAULT_SECONDS: u64 = 3;
pub const DEFAULT_POLICIES: usize = 1000;
pub const DEFAULT_PREFIXES: usize = 10_000;

#[derive(Debug, Clone)]
pub struct Options {
    /// Interleaved runs of every column.
    pub runs: usize,
    /// Seconds per measure (latency, stream, UDP, connect loop).
    pub seconds: u64,
    /// Policies in the many-policies state (`allow-pair` and decoys).
    pub policies: usize,
    /// Prefixes of the ipBlock state's policy.
    pub prefixes: usize,
    /// CPU both ends of every measure run on; None: the scheduler's choice.
    pub pin_cpu: Option<usize>,
    /// Where the markdown report goes besides stdout (its chart beside it).
    pub out: Option<PathBuf>,
}

/// The agents' datapath in a column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Datapath {
    Ebpf,
    Kernel,
}

impl Datapath {
    const ALL: [Datapath; 2] = [Datapath::Ebpf, Datapath::Kernel];

    fn label(self) -> &'static str {
        match self {
            Datapath::Ebpf => "eBPF fast path (tc encap)",
            Datapath::Kernel => "kernel path",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Datapath::Ebpf => "eBPF",
            Datapath::Kernel => "kernel",
        }
    }

    fn flag(self) -> &'static str {
        match self {
            Datapath::Ebpf => "ebpf",
            Datapath::Kernel => "kernel",
        }
    }
}

/// Everything one bench measured.
#[derive(Debug, Default)]
struct Results {
    /// The established-flow measures, one per run, in run order.
    samples: BTreeMap<(Datapath, State), Vec<Sample>>,
    /// The connect loop, one per run, in run order.
    crr: BTreeMap<(Datapath, State), Vec<Crr>>,
    /// `mycni_policy_set_elements` of node1 and node2 when the column was
    /// last measured: what the policies became in the kernel.
    elements: BTreeMap<(Datapath, State), Vec<u64>>,
    /// From the first policy object written to both agents reporting the
    /// column's policies (their metrics, not probes), for every change of
    /// state that wrote any without restarting the agents.
    settled: BTreeMap<State, Vec<Duration>>,
}

/// `cargo xtask bench policy`: brings up its lab, measures every column,
/// prints and writes the report, tears the lab down, whatever happened.
pub fn run(bins: Bins, o: &Options) -> Result<()> {
    if o.runs == 0 || o.seconds == 0 {
        bail!("--runs and --seconds must be at least 1");
    }
    if o.policies < 10 || o.prefixes < 1 || o.prefixes > shape::MAX_PREFIXES {
        bail!(
            "--policies must be at least 10 (the 10-policy column is a subset) and --prefixes \
             1..={}",
            shape::MAX_PREFIXES
        );
    }
    catch_interrupts();
    let started = Instant::now();
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let spec = Spec {
        prefix: PREFIX.into(),
        nodes: 2,
        // The bench's pods come after, with Pod objects and labels.
        pods: 0,
        root: PathBuf::from(ROOT),
        bins,
        // The kernel datapath to start: with no pod yet, the fast path's
        // "every pod attached" wait has nothing to count.
        agent_args: vec!["--datapath".into(), "kernel".into()],
        in_process_api: false,
        stack: Stack::Ipv4Only,
        model: false,
    };
    // Leftovers of an interrupted run of this bench (its prefix, its root).
    if spec.root.join("state").exists() {
        eprintln!("policy bench: removing the lab a previous run left behind");
        Lab::attach(spec.clone()).down();
    }
    eprintln!("policy bench: bringing up the 2-node lab ({PREFIX}-*, {ROOT})");
    let lab = BenchLab(Lab::up(spec)?);
    let logs = PathBuf::from(ROOT).join("bench");
    std::fs::create_dir_all(&logs)?;
    let shape = Shape {
        policies: o.policies,
        prefixes: o.prefixes,
        client_cidr: crate::pod_cidr(1),
    };
    // The lab goes down inside, before the report is printed.
    let results = measure_all(lab, o, &shape, &logs)?;
    let load_after = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let run = report::RunConditions {
        took: started.elapsed(),
        load_before: load_before.trim(),
        load_after: load_after.trim(),
    };
    let text = report::render(&results, o, &shape, &run);
    print!("{text}");
    if let Some(out) = &o.out {
        if let Some(dir) = out.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(out, &text).with_context(|| format!("writing {}", out.display()))?;
        eprintln!("policy bench: wrote {}", out.display());
        crate::chart::write_beside(out, &report::chart(&results, o, &shape))?;
    }
    Ok(())
}

/// The bench pods and what the measures need of them.
struct Pods {
    pair: Pair,
    lab_bin: PathBuf,
}

fn measure_all(mut lab: BenchLab, o: &Options, shape: &Shape, logs: &Path) -> Result<Results> {
    let lab = &mut lab.0;
    let pods = make_pods(lab)?;
    let mo = super::Options {
        runs: o.runs,
        seconds: o.seconds,
        services: 0,
        synthetic_rules: 0,
        pin_cpu: o.pin_cpu,
        out: None,
    };
    let pins: Vec<(usize, PathBuf)> = (1..=lab.spec.nodes)
        .map(|i| (i, lab.spec.pin_dir(i)))
        .collect();
    let mut r = Results::default();
    let mut have: Vec<String> = Vec::new();
    let mut agents: Option<(Datapath, bool)> = None;
    eprintln!("policy bench: warming up");
    warm_up(&pods.pair, &mo, logs)?;
    for run in 0..o.runs {
        let (mut dps, mut states) = (Datapath::ALL, State::ALL);
        if !run.is_multiple_of(2) {
            // Odd runs go the other way and start where the last ended.
            dps.reverse();
            states.reverse();
        }
        for dp in dps {
            for st in states {
                check_interrupted()?;
                eprintln!(
                    "policy bench: run {}/{}: {}, {}",
                    run + 1,
                    o.runs,
                    dp.label(),
                    st.label(shape)
                );
                let want = st.policies(shape);
                let t0 = Instant::now();
                let wrote = apply_policies(lab, &mut have, &want)?;
                let restart = agents != Some((dp, st.enforcing()));
                if restart && wrote && agents.is_some_and(|(_, enforcing)| enforcing) {
                    // Restarted in the middle of writing a large change,
                    // an agent left its successor unready for over 30 s
                    // (after the 10,000-prefix column): restart from a
                    // table the agents have finished writing.
                    wait_reported(lab, want.len())?;
                }
                if restart {
                    switch(lab, dp, st.enforcing())?;
                    agents = Some((dp, st.enforcing()));
                }
                let settled = settle(lab, &pods, st, shape)?;
                if wrote && !restart && st.enforcing() {
                    let took = settled.reported.saturating_duration_since(t0);
                    r.settled.entry(st).or_default().push(took);
                }
                r.elements.insert((dp, st), settled.elements);
                if st.established() {
                    let progs = match dp {
                        Datapath::Ebpf => watch_programs(&pins)?,
                        Datapath::Kernel => vec![],
                    };
                    let s = measure(&pods.pair, &mo, logs, &progs)?;
                    r.samples.entry((dp, st)).or_default().push(s);
                }
                let c = connect_loop(&pods, &mo, logs)?;
                r.crr.entry((dp, st)).or_default().push(c);
            }
        }
    }
    Ok(r)
}

/// The namespace and the two bench pods, as a kubelet makes them; the
/// client's netns may reuse ports in TIME_WAIT, which the connect loop
/// leaves by the thousand.
fn make_pods(lab: &Lab) -> Result<Pods> {
    lab.kube_apply(
        "namespaces",
        &namespace_object(
            NAMESPACE,
            &[(NAMESPACE_NAME_LABEL.to_string(), NAMESPACE.to_string())],
        ),
    )?;
    let request = |name: &str, node: usize| PodRequest {
        namespace: NAMESPACE.into(),
        name: name.into(),
        node,
        labels: vec![(ROLE.into(), name.into())],
        // A server the policies never open, to prove them in force.
        ports: vec![ContainerPort {
            name: format!("serve-{DENIED_PORT}-tcp"),
            port: DENIED_PORT,
            proto: Proto::Tcp,
        }],
    };
    let client = lab.add_kube_pod(&request(CLIENT, 1))?;
    let server = lab.add_kube_pod(&request(SERVER, 2))?;
    for kv in [
        "net.ipv4.tcp_tw_reuse=1",
        "net.ipv4.ip_local_port_range=1024 65000",
    ] {
        sh("ip", &["netns", "exec", &client.ns, "sysctl", "-qw", kv])?;
    }
    Ok(Pods {
        pair: Pair {
            client: client.ns,
            server: server.ns,
            ip: server.ip.into(),
        },
        lab_bin: lab.spec.bins.lab.clone(),
    })
}

/// Deletes and creates policies until the API holds `want`; whether it
/// wrote anything.
fn apply_policies(
    lab: &Lab,
    have: &mut Vec<String>,
    want: &[(String, serde_json::Value)],
) -> Result<bool> {
    let (delete, create) = shape::diff(have, want);
    let wrote = !delete.is_empty() || !create.is_empty();
    for name in &delete {
        lab.kube_delete("networkpolicies", Some(NAMESPACE), name)?;
    }
    for (_, obj) in &create {
        lab.kube_apply("networkpolicies", obj)?;
    }
    *have = want.iter().map(|(n, _)| n.clone()).collect();
    Ok(wrote)
}

/// Restarts both agents on `dp` with enforcement on or off, and waits for
/// the fast path's maps (one pod and one peer a node) and quiet agents.
fn switch(lab: &mut Lab, dp: Datapath, enforcing: bool) -> Result<()> {
    let np = if enforcing { "true" } else { "false" };
    eprintln!(
        "policy bench: agents -> --datapath {} --network-policy {np}",
        dp.flag()
    );
    lab.set_agent_flags(&[
        ("--datapath", dp.flag()),
        ("--tc-encap", "true"),
        ("--network-policy", np),
    ])?;
    if dp == Datapath::Ebpf {
        for i in 1..=lab.spec.nodes {
            wait_for(
                &format!("{} to fill its fast-path maps", lab.spec.node_name(i)),
                Duration::from_secs(30),
                || {
                    lab.metrics(i).is_ok_and(|m| {
                        m.lines()
                            .any(|l| l == "mycni_datapath_entries{map=\"local\"} 1")
                            && m.lines()
                                .any(|l| l == "mycni_datapath_entries{map=\"remote\"} 1")
                    })
                },
            )?;
        }
    }
    Ok(())
}

/// The value of an unlabelled series in a metrics text.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let (n, v) = l.split_once(' ')?;
        (n == name).then(|| v.trim().parse().ok())?
    })
}

/// Waits until both agents enforce `policies` policies with their bench pod
/// isolated (when there are any), the pair connects, and, with policies in
/// force, a port none opens is refused; then for quiet agents.
fn settle(lab: &Lab, pods: &Pods, st: State, shape: &Shape) -> Result<Settled> {
    let policies = st.policies(shape).len();
    let nodes = 1..=lab.spec.nodes;
    if st.enforcing() {
        wait_reported(lab, policies)?;
    }
    let reported = Instant::now();
    let probe = |port: u16| {
        let target = SocketAddr::from((pods.pair.ip, port)).to_string();
        sh(
            "ip",
            &[
                "netns",
                "exec",
                &pods.pair.client,
                &pods.lab_bin.to_string_lossy(),
                "tcp-probe",
                &target,
            ],
        )
    };
    wait_for(
        "the client to reach the server's echo port",
        Duration::from_secs(10),
        || probe(ECHO_PORT).is_ok(),
    )?;
    if policies > 0 && probe(DENIED_PORT).is_ok() {
        bail!(
            "{}: the client reached the server's port {DENIED_PORT}, which no policy opens: \
             the policies are not in force",
            st.label(shape)
        );
    }
    wait_agents_idle(lab);
    let elements = nodes
        .map(|i| {
            lab.metrics(i)
                .ok()
                .and_then(|m| metric(&m, "mycni_policy_set_elements"))
                .map_or(0, |v| v as u64)
        })
        .collect();
    Ok(Settled { elements, reported })
}

/// Waits until both agents enforce `policies` policies, with their bench
/// pod isolated when there are any.
fn wait_reported(lab: &Lab, policies: usize) -> Result<()> {
    let isolated = u64::from(policies > 0) as f64;
    wait_for(
        &format!("both agents to read {policies} policies and isolate their bench pod"),
        Duration::from_secs(120),
        || {
            (1..=lab.spec.nodes).all(|i| {
                lab.metrics(i).is_ok_and(|m| {
                    metric(&m, "mycni_policy_enforcing") == Some(1.0)
                        && metric(&m, "mycni_policy_policies") == Some(policies as f64)
                        && metric(&m, "mycni_policy_isolated_pods") == Some(isolated)
                })
            })
        },
    )
}

/// What [`settle`] saw.
struct Settled {
    /// Each node's policy set elements.
    elements: Vec<u64>,
    /// When both agents reported the column's policies.
    reported: Instant,
}

/// `mycni-lab tcp-crr` from the client to the server's echo port, pinned
/// as the other measures are.
fn connect_loop(pods: &Pods, o: &super::Options, logs: &Path) -> Result<Crr> {
    check_interrupted()?;
    let target = SocketAddr::from((pods.pair.ip, ECHO_PORT)).to_string();
    let secs = o.seconds.to_string();
    let bin = pods.lab_bin.to_string_lossy();
    let out = Proc::spawn(
        &pods.pair.client,
        &argv(
            &pin_prefix(o),
            &[&bin, "tcp-crr", &target, "--seconds", &secs],
        ),
        &logs.join("tcp-crr.log"),
    )?
    .finish(Duration::from_secs(o.seconds + UDP_OMIT + 20))?;
    parse_crr(&out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_read_by_name_alone() {
        let m = "# HELP mycni_policy_policies x\nmycni_policy_policies 1000\n\
                 mycni_policy_policies_total 3\nmycni_policy_isolated_pods 1\n";
        assert_eq!(metric(m, "mycni_policy_policies"), Some(1000.0));
        assert_eq!(metric(m, "mycni_policy_isolated_pods"), Some(1.0));
        assert_eq!(metric(m, "mycni_policy_set_elements"), None);
    }
}
