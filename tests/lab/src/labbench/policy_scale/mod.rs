//! `cargo xtask bench policy-scale`: how long a NetworkPolicy takes from
//! its create to being enforced on every node, seen by probes, in the lab
//! alone and with the API holding a cluster's worth of pods and policies;
//! and what each cluster pod costs an agent in memory.
//!
//! A 2-node lab (`mycnips-*`, [`ROOT`]) on the kernel datapath (new
//! connections are judged by the nftables table on either datapath) with
//! the API fixture in this process, so that [`cluster`]'s pods are stored
//! through its own create path, validated and versioned as a POST would
//! be, without a hundred thousand HTTP round trips; the agents still list
//! and watch them over the wire. Four lab pods with Pod objects in the
//! namespace `probe`: a client and a server on each node. `isolate-servers`
//! isolates both servers, so the probes (client on node1 -> server on
//! node2, client on node2 -> server on node1: each direction judged by
//! the other node) are dropped; creating `allow-probes` opens both, and
//! deleting it closes them again, as kubernetes/perf-tests' policy
//! enforcement latency test does (a deny in place, then an allow).
//!
//! Time zero is the API's answer to the create (or delete); a direction's
//! time is when its probes show the new verdict for good
//! ([`prober::flipped_at`]); enforced on every node is the later of the
//! two. Phases: the lab alone; then, agents stopped, the fixture loaded
//! with `--pods` cluster pods and `--policies` policies, the agents
//! started (they list it all) and the same measure; then the cluster grown
//! to `--rss-pods` for the memory figure. The agents' VmRSS and VmHWM are
//! read from /proc after each start has settled: the baseline with no
//! cluster pods, and at each size.

mod cluster;
mod prober;
mod report;

use std::net::SocketAddrV4;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::variants::wait_agents_idle;
use crate::model::{ContainerPort, NAMESPACE_NAME_LABEL, Proto, namespace_object};
use crate::{
    Bins, Lab, PodRequest, Spec, Stack, catch_interrupts, check_interrupted, strip_ansi, wait_for,
};
use cluster::{ALLOW, CLIENT, PROBE_NS, PROBE_PORT, ROLE, SERVER};
use prober::{Pair, Prober, Verdict};

/// Namespace prefix and state directory: apart from the CLI lab and every
/// other bench's and soak's.
pub const PREFIX: &str = "mycnips";
pub const ROOT: &str = "/run/mycni-policy-scale-lab";

pub const DEFAULT_CYCLES: usize = 30;
pub const DEFAULT_PODS: usize = 10_000;
pub const DEFAULT_POLICIES: usize = 1_000;
pub const DEFAULT_RSS_PODS: usize = 100_000;
pub const DEFAULT_INTERVAL_MS: u64 = 2;
pub const DEFAULT_TIMEOUT_MS: u64 = 200;

/// A change not seen on every node by then is counted as not enforced.
const ENFORCE_DEADLINE: Duration = Duration::from_secs(10);
/// How long, and with how many probes each, every direction must show the
/// new verdict before the next change.
const SETTLE_SPAN: Duration = Duration::from_millis(100);
const SETTLE_MIN: usize = 20;
/// How long agents get to list and program a loaded cluster.
const LIST_DEADLINE: Duration = Duration::from_secs(600);

#[derive(Debug, Clone)]
pub struct Options {
    /// Creates measured per phase, each followed by a delete.
    pub cycles: usize,
    /// Cluster pods of the scale phase.
    pub pods: usize,
    /// Cluster policies of the scale phase (and after).
    pub policies: usize,
    /// Cluster pods of the memory figure (0: skip that phase).
    pub rss_pods: usize,
    /// Creates measured at `rss_pods` too (0: none).
    pub rss_cycles: usize,
    /// One probe per direction this often.
    pub interval: Duration,
    /// A probe unanswered this long was dropped.
    pub timeout: Duration,
    /// Run the agents under heaptrack, their profiles written here: where
    /// the memory goes (the memory figures then include heaptrack's own).
    pub heaptrack: Option<PathBuf>,
    pub out: Option<PathBuf>,
}

/// One change's figures.
#[derive(Debug, Clone)]
struct Change {
    create: bool,
    /// Per direction, from the API's answer to its probes showing the new
    /// verdict for good; None: not within [`ENFORCE_DEADLINE`].
    per_pair: Vec<Option<Duration>>,
    /// From the request sent to the API's answer.
    api: Duration,
}

impl Change {
    /// Enforced on every node: the later direction.
    fn every_node(&self) -> Option<Duration> {
        self.per_pair
            .iter()
            .try_fold(Duration::ZERO, |m, d| d.map(|d| m.max(d)))
    }
}

/// One phase's measure.
#[derive(Debug, Clone, Default)]
struct Latency {
    /// The directions probed, as [`Change::per_pair`] orders them.
    labels: Vec<String>,
    changes: Vec<Change>,
    /// Probes neither open nor dropped.
    anomalies: usize,
    probes: usize,
    /// The agents' own `mycni_policy_event_to_enforced` over the phase:
    /// sum of seconds and count, per node.
    reported: Vec<(f64, f64)>,
}

/// An agent's memory, KiB.
#[derive(Debug, Clone, Copy, Default)]
struct Memory {
    rss: u64,
    hwm: u64,
}

/// The cluster in the API during a phase, and what the agents did with it.
#[derive(Debug, Clone, Default)]
struct Phase {
    pods: usize,
    policies: usize,
    /// Seconds the fixture took to store what this phase added.
    load_s: f64,
    /// Seconds from the agents' start to both reporting the cluster.
    list_s: f64,
    memory: Vec<Memory>,
    /// What each agent's policy room reports once settled:
    /// `mycni_policy_set_elements`, `mycni_policy_last_pass_seconds`.
    elements: Vec<f64>,
    pass_s: Vec<f64>,
    latency: Option<Latency>,
}

/// `cargo xtask bench policy-scale`.
pub fn run(mut bins: Bins, o: &Options) -> Result<()> {
    if o.cycles == 0 || o.pods == 0 || o.policies == 0 {
        bail!("--cycles, --pods and --policies must be at least 1");
    }
    if o.rss_pods != 0 && o.rss_pods < o.pods {
        bail!("--rss-pods must be 0 or at least --pods");
    }
    if o.rss_pods > 100 * cluster::FAKE_NODES || o.pods > 100 * cluster::FAKE_NODES {
        bail!("at most {} cluster pods", 100 * cluster::FAKE_NODES);
    }
    if let Some(dir) = &o.heaptrack {
        bins.agent = heaptrack_wrapper(dir, &bins.agent)?;
    }
    catch_interrupts();
    let started = Instant::now();
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let spec = Spec {
        prefix: PREFIX.into(),
        nodes: 2,
        pods: 0,
        root: PathBuf::from(ROOT),
        bins,
        // The cluster pods' fake nodes' podCIDRs are inside 10.0.0.0/8.
        agent_args: vec![
            "--datapath".into(),
            "kernel".into(),
            "--cluster-cidr".into(),
            "10.0.0.0/8".into(),
        ],
        in_process_api: true,
        stack: Stack::Ipv4Only,
        model: false,
    };
    if spec.root.join("state").exists() {
        eprintln!("policy-scale: removing the lab a previous run left behind");
        Lab::attach(spec.clone()).down();
    }
    eprintln!("policy-scale: bringing up the 2-node lab ({PREFIX}-*, {ROOT})");
    let lab = ScaleLab(Lab::up(spec)?);
    let phases = phases(&lab.0, o);
    drop(lab);
    let phases = phases?;
    let load_after = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let text = report::render(
        &phases,
        o,
        started.elapsed(),
        load_before.trim(),
        load_after.trim(),
    );
    print!("{text}");
    if let Some(out) = &o.out {
        if let Some(dir) = out.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(out, &text).with_context(|| format!("writing {}", out.display()))?;
        eprintln!("policy-scale: wrote {}", out.display());
    }
    Ok(())
}

fn phases(lab: &Lab, o: &Options) -> Result<Vec<Phase>> {
    let pairs = make_probe_pods(lab)?;
    lab.kube_apply("networkpolicies", &cluster::isolate_servers())?;
    let mut out = Vec::new();

    eprintln!("policy-scale: the lab alone");
    let mut phase = settle_phase(lab, "lab alone", 0, 0, 0.0)?;
    phase.latency = Some(measure(lab, &pairs, o, o.cycles)?);
    out.push(phase);

    let load_s = load(lab, 0, o.pods, 0, o.policies)?;
    let mut phase = settle_phase(lab, "scale", o.pods, o.policies, load_s)?;
    phase.latency = Some(measure(lab, &pairs, o, o.cycles)?);
    out.push(phase);

    if o.rss_pods > o.pods {
        let load_s = load(lab, o.pods, o.rss_pods, o.policies, o.policies)?;
        let mut phase = settle_phase(lab, "memory", o.rss_pods, o.policies, load_s)?;
        if o.rss_cycles > 0 {
            phase.latency = Some(measure(lab, &pairs, o, o.rss_cycles)?);
        }
        out.push(phase);
    }
    Ok(out)
}

/// The probe namespace and its four pods, as a kubelet makes them; the
/// two directions probed.
fn make_probe_pods(lab: &Lab) -> Result<Vec<Pair>> {
    lab.kube_apply(
        "namespaces",
        &namespace_object(
            PROBE_NS,
            &[(NAMESPACE_NAME_LABEL.to_string(), PROBE_NS.to_string())],
        ),
    )?;
    let request = |role: &str, node: usize| PodRequest {
        namespace: PROBE_NS.into(),
        name: format!("{role}-{node}"),
        node,
        labels: vec![(ROLE.into(), role.into())],
        ports: vec![ContainerPort {
            name: "http".into(),
            port: PROBE_PORT,
            proto: Proto::Tcp,
        }],
    };
    let c1 = lab.add_kube_pod(&request(CLIENT, 1))?;
    let s1 = lab.add_kube_pod(&request(SERVER, 1))?;
    let c2 = lab.add_kube_pod(&request(CLIENT, 2))?;
    let s2 = lab.add_kube_pod(&request(SERVER, 2))?;
    Ok(vec![
        Pair {
            label: "node1 -> node2 (node2 enforces)".into(),
            client_ns: c1.ns,
            server: SocketAddrV4::new(s2.ip, PROBE_PORT),
        },
        Pair {
            label: "node2 -> node1 (node1 enforces)".into(),
            client_ns: c2.ns,
            server: SocketAddrV4::new(s1.ip, PROBE_PORT),
        },
    ])
}

/// Stores cluster pods `from..to` and policies `have..want` in the
/// fixture (their namespaces first), with the agents stopped so they list
/// the result as an agent starting in such a cluster does; seconds taken.
fn load(lab: &Lab, from: usize, to: usize, have: usize, want: usize) -> Result<f64> {
    let api = lab.api.as_ref().context("the in-process API fixture")?;
    stop_agents(lab);
    eprintln!(
        "policy-scale: storing cluster pods {from}..{to} and policies {have}..{want} in the fixture"
    );
    let t = Instant::now();
    let namespaces = cluster::namespaces_for(to).max(cluster::namespaces_for_policies(want));
    for k in 0..namespaces {
        if api.get_namespace(&cluster::namespace_name(k)).is_none() {
            api.create_namespace(serde_json::from_value(cluster::namespace(k))?)?;
        }
    }
    for i in from..to {
        if i % 10_000 == 0 {
            check_interrupted()?;
        }
        api.create_pod(serde_json::from_value(cluster::pod(i))?)
            .with_context(|| format!("storing cluster pod {i}"))?;
    }
    for k in have..want {
        api.create_network_policy(serde_json::from_value(cluster::policy(k))?)
            .with_context(|| format!("storing cluster policy {k}"))?;
    }
    let took = t.elapsed().as_secs_f64();
    eprintln!("policy-scale: stored in {took:.1} s");
    Ok(took)
}

/// Restarts both agents, waits until each has listed `pods` cluster pods
/// (besides the lab's four) and enforces `policies` cluster policies and
/// the lab's, then until they are quiet; their memory and policy figures.
fn settle_phase(lab: &Lab, name: &str, pods: usize, policies: usize, load_s: f64) -> Result<Phase> {
    let t = Instant::now();
    stop_agents(lab);
    for i in 1..=lab.spec.nodes {
        lab.start_agent(i)?;
    }
    let want_pods = pods + 4;
    let want_policies = (policies + 1) as f64;
    wait_for(
        &format!("both agents to list {want_pods} pods and enforce {want_policies} policies"),
        LIST_DEADLINE,
        || {
            (1..=lab.spec.nodes).all(|i| {
                listed_pods(lab, i) == Some(want_pods)
                    && lab.metrics(i).is_ok_and(|m| {
                        metric(&m, "mycni_policy_enforcing") == Some(1.0)
                            && metric(&m, "mycni_policy_policies") == Some(want_policies)
                            && metric(&m, "mycni_policy_isolated_pods") == Some(1.0)
                    })
            })
        },
    )?;
    let list_s = t.elapsed().as_secs_f64();
    eprintln!("policy-scale: {name}: both agents enforce the cluster after {list_s:.1} s");
    wait_agents_idle(lab);
    // A last look after the agents went quiet: what the allocator kept.
    std::thread::sleep(Duration::from_secs(3));
    let mut phase = Phase {
        pods,
        policies,
        load_s,
        list_s,
        ..Phase::default()
    };
    for i in 1..=lab.spec.nodes {
        phase.memory.push(memory(lab, i)?);
        let m = lab.metrics(i)?;
        phase
            .elements
            .push(metric(&m, "mycni_policy_set_elements").unwrap_or(f64::NAN));
        phase
            .pass_s
            .push(metric(&m, "mycni_policy_last_pass_seconds").unwrap_or(f64::NAN));
    }
    Ok(phase)
}

/// `cycles` creates of `allow-probes`, each followed by its delete, under
/// continuous probes.
fn measure(lab: &Lab, pairs: &[Pair], o: &Options, cycles: usize) -> Result<Latency> {
    let before = reported(lab)?;
    let prober = Prober::start(pairs, o.interval, o.timeout)?;
    eprintln!(
        "policy-scale: probing {} directions every {:?}; {cycles} creates and deletes",
        pairs.len(),
        o.interval
    );
    let t = Instant::now();
    wait_for(
        "the probes to be dropped before the first create",
        Duration::from_secs(30),
        || prober.settled(Duration::ZERO, Verdict::Dropped, SETTLE_SPAN, SETTLE_MIN),
    )
    .with_context(|| format!("after {:.1} s", t.elapsed().as_secs_f64()))?;
    // (sent, answered, create) of every change.
    let mut marks: Vec<(Duration, Duration, bool)> = Vec::new();
    for c in 0..cycles {
        for create in [true, false] {
            check_interrupted()?;
            if prober.failed() {
                break;
            }
            let sent = prober.now();
            if create {
                lab.kube_apply("networkpolicies", &cluster::allow_probes())?;
            } else {
                lab.kube_delete("networkpolicies", Some(PROBE_NS), ALLOW)?;
            }
            let answered = prober.now();
            let want = if create {
                Verdict::Open
            } else {
                Verdict::Dropped
            };
            while !prober.settled(sent, want, SETTLE_SPAN, SETTLE_MIN)
                && prober.now() < answered + ENFORCE_DEADLINE + o.timeout
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            marks.push((sent, answered, create));
            // 100-300 ms more, varied, so the changes do not beat with
            // any timer of the agents'.
            std::thread::sleep(Duration::from_millis(100 + (c as u64 * 37 + 11) % 200));
        }
        if (c + 1) % 10 == 0 {
            eprintln!("policy-scale: {}/{cycles} cycles", c + 1);
        }
    }
    std::thread::sleep(o.timeout + Duration::from_millis(50));
    let end = prober.now().saturating_sub(o.timeout);
    let probes: Vec<_> = (0..pairs.len()).map(|k| prober.probes(k)).collect();
    let failed = prober.failed();
    prober.stop()?;
    if failed {
        bail!("a probe thread ended early");
    }
    let mut out = Latency {
        labels: pairs.iter().map(|p| p.label.clone()).collect(),
        ..Latency::default()
    };
    for (k, (sent, answered, create)) in marks.iter().enumerate() {
        let until = marks.get(k + 1).map_or(end, |m| m.0);
        let want = if *create {
            Verdict::Open
        } else {
            Verdict::Dropped
        };
        let per_pair = probes
            .iter()
            .map(|p| {
                prober::flipped_at(p, *sent, until, want)
                    .map(|f| f.saturating_sub(*answered))
                    .filter(|d| *d <= ENFORCE_DEADLINE)
            })
            .collect();
        out.changes.push(Change {
            create: *create,
            per_pair,
            api: answered.saturating_sub(*sent),
        });
    }
    let first = marks.first().map_or(Duration::ZERO, |m| m.0);
    for p in &probes {
        out.anomalies += prober::anomalies(p, first, end);
        out.probes += p.iter().filter(|q| q.at >= first && q.at < end).count();
    }
    let after = reported(lab)?;
    out.reported = after
        .iter()
        .zip(&before)
        .map(|(a, b)| (a.0 - b.0, a.1 - b.1))
        .collect();
    Ok(out)
}

/// Each agent's `mycni_policy_event_to_enforced` sum and count.
fn reported(lab: &Lab) -> Result<Vec<(f64, f64)>> {
    (1..=lab.spec.nodes)
        .map(|i| {
            let m = lab.metrics(i)?;
            Ok((
                metric(&m, "mycni_policy_event_to_enforced_seconds_sum").unwrap_or(0.0),
                metric(&m, "mycni_policy_event_to_enforced_seconds_count").unwrap_or(0.0),
            ))
        })
        .collect()
}

/// The value of an unlabelled series in a metrics text.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let (n, v) = l.split_once(' ')?;
        (n == name).then(|| v.trim().parse().ok())?
    })
}

/// The pods node `i`'s agent said its initial list held (its log since it
/// last started).
fn listed_pods(lab: &Lab, i: usize) -> Option<usize> {
    let log = std::fs::read_to_string(lab.spec.node_dir(i).join("agent.log")).ok()?;
    log.lines()
        .rev()
        .find(|l| l.contains("initial Pod list complete"))
        .and_then(|l| field(&strip_ansi(l), "pods"))
}

fn field(line: &str, name: &str) -> Option<usize> {
    let pat = format!("{name}=");
    let start = line.find(&pat)? + pat.len();
    line[start..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Node `i`'s agent's VmRSS and VmHWM, KiB.
fn memory(lab: &Lab, i: usize) -> Result<Memory> {
    let pid = agent_pid(lab, i).with_context(|| format!("node {i}'s agent is not running"))?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = |key: &str| -> Result<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .with_context(|| format!("no {key} in the agent's /proc status"))
    };
    Ok(Memory {
        rss: kib("VmRSS:")?,
        hwm: kib("VmHWM:")?,
    })
}

/// Tears the lab down however the bench ends, the agents first (under
/// heaptrack, the pid file names the wrapper, which would leave them).
struct ScaleLab(Lab);

impl Drop for ScaleLab {
    fn drop(&mut self) {
        eprintln!("policy-scale: tearing the lab down");
        stop_agents(&self.0);
        self.0.down();
    }
}

/// Node `i`'s agent process: the pid file's, or under `--heaptrack` the
/// `mycni-agent` among its descendants.
fn agent_pid(lab: &Lab, i: usize) -> Option<i32> {
    let top: i32 = std::fs::read_to_string(lab.spec.node_dir(i).join("agent.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    // (pid, parent, command) of every process.
    let procs: Vec<(i32, i32, String)> = std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let (head, rest) = stat.rsplit_once(')')?;
            let comm = head.split_once('(')?.1.to_string();
            let ppid = rest.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, ppid, comm))
        })
        .collect();
    let mut queue = vec![top];
    while let Some(p) = queue.pop() {
        if procs.iter().any(|(q, _, c)| *q == p && c == "mycni-agent") {
            return Some(p);
        }
        queue.extend(
            procs
                .iter()
                .filter(|(_, pp, _)| *pp == p)
                .map(|(q, _, _)| q),
        );
    }
    None
}

/// Stops every agent: SIGTERM to the agent itself, so that under
/// heaptrack its profile is finished, then the pid file's process.
fn stop_agents(lab: &Lab) {
    for i in 1..=lab.spec.nodes {
        if let Some(pid) = agent_pid(lab, i) {
            // SAFETY: kill(2) on the agent this lab started.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(60) {
                // Started by this process, it stays a zombie until reaped
                // here (ECHILD under heaptrack, whose shell reaps it).
                // SAFETY: WNOHANG waitpid, then signal 0, which only asks
                // whether the pid exists.
                let gone = unsafe {
                    libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) == pid
                        || libc::kill(pid, 0) != 0
                };
                if gone {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        lab.stop_agent(i);
    }
}

/// A script that runs the agent under heaptrack, one profile per node
/// and start (`heaptrack.<node>.<pid>.zst` in `dir`).
fn heaptrack_wrapper(dir: &Path, agent: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    let dir = dir.canonicalize()?;
    let agent = agent.canonicalize()?;
    let script = dir.join("mycni-agent-heaptrack.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n\
             # mycni-bench policy-scale --heaptrack: the agent under heaptrack.\n\
             node=agent; prev=\n\
             for a in \"$@\"; do [ \"$prev\" = --node-name ] && node=$a; prev=$a; done\n\
             exec heaptrack -o \"{}/heaptrack.$node.$$\" \"{}\" \"$@\"\n",
            dir.display(),
            agent.display()
        ),
    )?;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    Ok(script)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_fields_and_metrics_read() {
        let l = "\u{1b}[2m2026-12-04T10:00:00Z\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m initial Pod list complete \u{1b}[3mpods\u{1b}[0m\u{1b}[2m=\u{1b}[0m10004";
        assert_eq!(field(&strip_ansi(l), "pods"), Some(10_004));
        let m = "# HELP x\nmycni_policy_policies 1001\nmycni_policy_policies_total 3\n";
        assert_eq!(metric(m, "mycni_policy_policies"), Some(1001.0));
        let c = Change {
            create: true,
            per_pair: vec![
                Some(Duration::from_millis(3)),
                Some(Duration::from_millis(9)),
            ],
            api: Duration::ZERO,
        };
        assert_eq!(c.every_node(), Some(Duration::from_millis(9)));
        let c = Change {
            per_pair: vec![Some(Duration::from_millis(3)), None],
            ..c
        };
        assert_eq!(c.every_node(), None);
    }
}
