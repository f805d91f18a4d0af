//! NetworkPolicy under the agent's faults, on a model lab with policies in
//! force: probers judge allowed and denied pairs every 25 ms while agents
//! are SIGKILLed and restarted, upgraded (stopped and started), cut off
//! from the API, and fed policies the API server should have refused. Each
//! row reports the longest window of wrong allow (must be 0: the case
//! fails otherwise) and of wrong deny, and what leaked.

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::networking::v1::NetworkPolicySpec;
use mycni_apiserver::network_policy;
use mycni_testkit::{in_netns, sh};
use serde_json::json;

use super::{CaseResult, Scale};
use crate::{Lab, Pod};

/// One pair the probers try, and what the policies in force say of it.
#[derive(Debug, Clone)]
struct Pair {
    from: Pod,
    to: SocketAddr,
    allowed: bool,
    name: String,
}

/// What the probers saw over a fault.
#[derive(Debug, Default, Clone)]
struct Verdicts {
    probes: u64,
    wrong_allow: u64,
    wrong_deny: u64,
    longest_wrong_allow: Duration,
    longest_wrong_deny: Duration,
    /// The pairs that were ever wrong, for the notes.
    wrong_pairs: Vec<String>,
}

/// One prober thread per pair, from its pod's netns.
struct Probers {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Result<Verdicts>>>,
}

impl Probers {
    fn start(pairs: &[Pair]) -> Probers {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = pairs
            .iter()
            .cloned()
            .map(|p| {
                let stop = stop.clone();
                std::thread::spawn(move || in_netns(&p.from.ns, || probe_loop(&p, &stop))?)
            })
            .collect();
        Probers { stop, threads }
    }

    fn stop(self) -> Result<Verdicts> {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = Verdicts::default();
        for t in self.threads {
            let v = t
                .join()
                .map_err(|_| anyhow::anyhow!("a prober panicked"))??;
            all.probes += v.probes;
            all.wrong_allow += v.wrong_allow;
            all.wrong_deny += v.wrong_deny;
            all.longest_wrong_allow = all.longest_wrong_allow.max(v.longest_wrong_allow);
            all.longest_wrong_deny = all.longest_wrong_deny.max(v.longest_wrong_deny);
            all.wrong_pairs.extend(v.wrong_pairs);
        }
        Ok(all)
    }
}

/// A denied SYN is retried after 1 s: 150 ms tells a drop from a slow
/// answer on this lab (sub-millisecond RTT) without waiting for it.
const PROBE_TIMEOUT: Duration = Duration::from_millis(150);

fn probe_loop(p: &Pair, stop: &AtomicBool) -> Result<Verdicts> {
    let mut v = Verdicts::default();
    // Since when the verdict has been wrong, if it is.
    let mut wrong_since: Option<Instant> = None;
    while !stop.load(Ordering::Relaxed) {
        let at = Instant::now();
        let ok = TcpStream::connect_timeout(&p.to, PROBE_TIMEOUT).is_ok();
        v.probes += 1;
        if ok == p.allowed {
            if let Some(s) = wrong_since.take() {
                let w = at.duration_since(s);
                if p.allowed {
                    v.longest_wrong_deny = v.longest_wrong_deny.max(w);
                } else {
                    v.longest_wrong_allow = v.longest_wrong_allow.max(w);
                }
            }
        } else {
            if p.allowed {
                v.wrong_deny += 1;
            } else {
                v.wrong_allow += 1;
            }
            if wrong_since.is_none() {
                wrong_since = Some(at);
                v.wrong_pairs.push(p.name.clone());
            }
        }
        std::thread::sleep(Duration::from_millis(25).saturating_sub(at.elapsed()));
    }
    if let Some(s) = wrong_since {
        let w = s.elapsed();
        if p.allowed {
            v.longest_wrong_deny = v.longest_wrong_deny.max(w);
        } else {
            v.longest_wrong_allow = v.longest_wrong_allow.max(w);
        }
    }
    Ok(v)
}

fn spec(v: serde_json::Value) -> Result<NetworkPolicySpec> {
    Ok(serde_json::from_value(v)?)
}

/// The policies in force through every fault: x/b takes TCP 80 from x/a
/// only, x/c takes nothing. The pairs judge both, across nodes and on one.
fn policies_and_pairs(lab: &Lab) -> Result<Vec<Pair>> {
    let api = lab.api.as_ref().context("the soak lab's API fixture")?;
    api.create_network_policy(network_policy(
        "x",
        "b-from-a",
        spec(json!({
            "podSelector": {"matchLabels": {"pod": "b"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "a"}}}],
                         "ports": [{"port": 80, "protocol": "TCP"}]}]
        }))?,
    ))?;
    api.create_network_policy(network_policy(
        "x",
        "deny-c",
        spec(json!({"podSelector": {"matchLabels": {"pod": "c"}}}))?,
    ))?;
    let [xa, xb, xc, ya] = lab.pods_named(["x/a", "x/b", "x/c", "y/a"])?;
    let pair = |from: &Pod, to: &Pod, port: u16, allowed: bool| Pair {
        from: from.clone(),
        to: SocketAddr::from((to.ip, port)),
        allowed,
        name: format!(
            "{} -> {}:{port}",
            crate::pod_label(from),
            crate::pod_label(to)
        ),
    };
    let pairs = vec![
        pair(&xa, &xb, 80, true),
        pair(&xa, &xb, 81, false),
        pair(&ya, &xb, 80, false),
        pair(&xa, &xc, 80, false),
        pair(&xb, &xa, 80, true),
    ];
    // Enforced everywhere before any fault.
    let t0 = Instant::now();
    for p in &pairs {
        while in_netns(&p.from.ns, || {
            TcpStream::connect_timeout(&p.to, PROBE_TIMEOUT).is_ok()
        })? != p.allowed
        {
            ensure!(
                t0.elapsed() < Duration::from_secs(30),
                "{} never became {}",
                p.name,
                p.allowed
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(pairs)
}

/// The node's policy state a fault must leave as it found it: one table,
/// its set sizes, one agent answering.
fn policy_state(lab: &Lab, i: usize) -> Result<(usize, u64)> {
    let tables = sh(
        "ip",
        &[
            "netns",
            "exec",
            &lab.spec.node_name(i),
            "nft",
            "list",
            "tables",
        ],
    )?;
    let ours = tables
        .lines()
        .filter(|l| l.contains("mycni_policy"))
        .count();
    let m = lab.metrics(i)?;
    let elements = m
        .lines()
        .filter(|l| l.starts_with("mycni_policy_set_elements"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64;
    Ok((ours, elements))
}

/// Waits until node `i`'s agent answers, is ready and enforces: how long.
fn enforcing(lab: &Lab, i: usize, t0: Instant) -> Result<Duration> {
    loop {
        if let Ok(m) = lab.metrics(i)
            && m.lines().any(|l| l == "mycni_ready 1")
            && m.lines().any(|l| l == "mycni_policy_enforcing 1")
        {
            return Ok(t0.elapsed());
        }
        ensure!(
            t0.elapsed() < Duration::from_secs(60),
            "node {i}'s agent not enforcing 60 s after the fault"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What a fault under the probers came to: what they saw, the nodes whose
/// policy state changed, how long the repair took, and notes.
struct Observed {
    verdicts: Verdicts,
    leaks: usize,
    repair: Duration,
    notes: String,
}

/// A row from what the probers saw; fails on any wrong allow.
fn row(case: &str, faults: String, observed: Observed) -> Result<CaseResult> {
    let Observed {
        verdicts: v,
        leaks,
        repair,
        notes,
    } = observed;
    let mut wrong = v.wrong_pairs.clone();
    wrong.sort();
    wrong.dedup();
    let r = CaseResult {
        case: case.into(),
        load: "model lab, 2 policies, 5 pairs probed every 25 ms".into(),
        faults,
        longest_gap: Some(v.longest_wrong_deny),
        leaks,
        repair: Some(repair),
        notes: format!(
            "{} probes; wrong allow {} (longest {} ms); wrong deny {} (longest {} ms, the gap column){}{}",
            v.probes,
            v.wrong_allow,
            v.longest_wrong_allow.as_millis(),
            v.wrong_deny,
            v.longest_wrong_deny.as_millis(),
            if wrong.is_empty() {
                String::new()
            } else {
                format!("; wrong: {}", wrong.join(", "))
            },
            if notes.is_empty() {
                String::new()
            } else {
                format!("; {notes}")
            }
        ),
    };
    if v.wrong_allow > 0 {
        bail!("{case}: a denied pair was reachable: {}", r.notes);
    }
    Ok(r)
}

/// Runs `fault` under the probers and compares each node's policy state
/// before and after it.
fn under_probes(
    lab: &Lab,
    pairs: &[Pair],
    fault: impl FnOnce() -> Result<(Duration, String)>,
) -> Result<Observed> {
    let before: Vec<_> = (1..=lab.spec.nodes)
        .map(|i| policy_state(lab, i))
        .collect::<Result<_>>()?;
    let probers = Probers::start(pairs);
    let outcome = fault();
    // Time for a last wrong verdict to show.
    std::thread::sleep(Duration::from_millis(500));
    let v = probers.stop()?;
    let (repair, notes) = outcome?;
    let mut leaks = 0;
    let mut drift = Vec::new();
    for (i, b) in (1..=lab.spec.nodes).zip(&before) {
        let a = policy_state(lab, i)?;
        if a != *b {
            leaks += 1;
            drift.push(format!("node {i}: tables/elements {b:?} -> {a:?}"));
        }
    }
    let notes = [notes, drift.join(", ")]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    Ok(Observed {
        verdicts: v,
        leaks,
        repair,
        notes,
    })
}

/// The rows of the policy cases on one model lab.
pub fn policy_faults(lab: &Lab, scale: Scale) -> Vec<(String, Result<CaseResult>)> {
    let pairs = match policies_and_pairs(lab) {
        Ok(p) => p,
        Err(e) => return vec![("policy: setup".into(), Err(e))],
    };
    let kills = scale.agent_kills;
    let mut rows = vec![];
    let case = "policy: agent SIGKILL and restart";
    rows.push((
        case.to_string(),
        under_probes(lab, &pairs, || {
            let mut repair = Duration::ZERO;
            for k in 0..kills {
                let i = 1 + k % lab.spec.nodes;
                lab.kill_agent(i);
                std::thread::sleep(Duration::from_millis(200));
                let t0 = Instant::now();
                lab.start_agent(i)?;
                repair = repair.max(enforcing(lab, i, t0)?);
            }
            Ok((repair, String::new()))
        })
        .and_then(|observed| {
            row(
                case,
                format!("{kills} SIGKILLs, 200 ms away each, round the nodes"),
                observed,
            )
        }),
    ));
    let case = "policy: upgrade (agent stopped and started)";
    rows.push((
        case.to_string(),
        under_probes(lab, &pairs, || {
            let mut repair = Duration::ZERO;
            for i in 1..=lab.spec.nodes {
                lab.stop_agent(i);
                std::thread::sleep(Duration::from_secs(1));
                let t0 = Instant::now();
                lab.start_agent(i)?;
                repair = repair.max(enforcing(lab, i, t0)?);
            }
            Ok((repair, "the same binary: no second version here".into()))
        })
        .and_then(|observed| {
            row(
                case,
                "every node's agent SIGTERMed, 1 s away, started again".into(),
                observed,
            )
        }),
    ));
    let case = "policy: API server unreachable";
    let outage = scale.api_outage;
    rows.push((
        case.to_string(),
        under_probes(lab, &pairs, || {
            lab.set_api_reachable(false)?;
            let away = (|| -> Result<()> {
                std::thread::sleep(outage / 2);
                // An agent that starts without the API writes nothing and
                // keeps the tables it finds.
                lab.kill_agent(2);
                lab.start_agent(2)?;
                std::thread::sleep(outage / 2);
                Ok(())
            })();
            lab.set_api_reachable(true)?;
            away?;
            // Whole again when a policy made now reaches every agent: their
            // watches come back on kube-runtime's backoff (up to 30 s).
            let t0 = Instant::now();
            let api = lab.api.as_ref().context("the soak lab's API fixture")?;
            let want = api.network_policies(None).len() as u64 + 1;
            api.create_network_policy(network_policy(
                "z",
                "canary",
                spec(json!({"podSelector": {"matchLabels": {"pod": "nobody"}}}))?,
            ))?;
            let mut repair = Duration::ZERO;
            for i in 1..=lab.spec.nodes {
                while gauge(lab, i, "mycni_policy_policies").ok() != Some(want) {
                    ensure!(
                        t0.elapsed() < Duration::from_secs(60),
                        "node {i} saw no new policy 60 s after the API came back"
                    );
                    std::thread::sleep(Duration::from_millis(50));
                }
                repair = repair.max(enforcing(lab, i, t0)?);
            }
            api.delete_network_policy("z", "canary")?;
            Ok((
                repair,
                "repair: until a policy made after the outage is seen on every node".into(),
            ))
        })
        .and_then(|observed| {
            row(
                case,
                format!(
                    "API away {} s; node 2's agent restarted meanwhile",
                    outage.as_secs()
                ),
                observed,
            )
        }),
    ));
    let case = "policy: garbage policies";
    rows.push((
        case.to_string(),
        under_probes(lab, &pairs, || garbage(lab)).and_then(|observed| {
            row(
                case,
                "4 policies the API server would refuse, stored anyway".into(),
                observed,
            )
        }),
    ));
    rows
}

/// Policies no API server should store, each aimed at x/b, stored as an
/// older or broken one would: every agent must stay up, count and log
/// them, and open nothing (a bad rule is dropped whole; a bad selector
/// rejects the policy, and x/b stays isolated by b-from-a).
fn garbage(lab: &Lab) -> Result<(Duration, String)> {
    let api = lab.api.as_ref().context("the soak lab's API fixture")?;
    let b = json!({"matchLabels": {"pod": "b"}});
    let bad = [
        (
            "bad-cidr",
            json!({"podSelector": b, "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/33"}}]}]}),
        ),
        (
            "bad-protocol",
            json!({"podSelector": b, "ingress": [{"ports": [{"port": 81, "protocol": "ICMP"}]}]}),
        ),
        (
            "bad-port-name",
            json!({"podSelector": b, "ingress": [{"ports": [{"port": "Not_A-Name!", "protocol": "TCP"}]}]}),
        ),
        (
            "bad-selector",
            json!({"podSelector": {"matchExpressions": [{"key": "pod", "operator": "Sometimes", "values": ["b"]}]},
                   "ingress": [{}]}),
        ),
    ];
    let before: Vec<u64> = (1..=lab.spec.nodes)
        .map(|i| rejected(lab, i))
        .collect::<Result<_>>()?;
    let pids: Vec<String> = (1..=lab.spec.nodes)
        .map(|i| {
            std::fs::read_to_string(lab.spec.node_dir(i).join("agent.pid")).unwrap_or_default()
        })
        .collect();
    let t0 = Instant::now();
    for (name, spec) in &bad {
        api.create_unchecked_network_policy(json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"namespace": "x", "name": name}, "spec": spec
        }))?;
    }
    // Every agent counts them.
    let mut seen = Duration::ZERO;
    for (i, b) in (1..=lab.spec.nodes).zip(&before) {
        while rejected(lab, i)? <= *b {
            if t0.elapsed() > Duration::from_secs(10) {
                let log = std::fs::read_to_string(lab.spec.node_dir(i).join("agent.log"))
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                bail!(
                    "node {i} did not count the garbage policies; its log ends: {}",
                    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        seen = seen.max(t0.elapsed());
    }
    std::thread::sleep(Duration::from_secs(2));
    for (i, pid) in (1..=lab.spec.nodes).zip(&pids) {
        let now =
            std::fs::read_to_string(lab.spec.node_dir(i).join("agent.pid")).unwrap_or_default();
        ensure!(now == *pid, "node {i}'s agent restarted on the garbage");
        enforcing(lab, i, Instant::now())?;
    }
    let log = std::fs::read_to_string(lab.spec.node_dir(1).join("agent.log")).unwrap_or_default();
    let logged = bad.iter().filter(|(n, _)| log.contains(n)).count();
    for (name, _) in &bad {
        api.delete_network_policy("x", name)?;
    }
    Ok((
        seen,
        format!(
            "counted on every node within {} ms; {logged} of {} named in node 1's log",
            seen.as_millis(),
            bad.len()
        ),
    ))
}

/// An unlabelled gauge or counter of node `i`'s agent.
fn gauge(lab: &Lab, i: usize, name: &str) -> Result<u64> {
    lab.metrics(i)?
        .lines()
        .find_map(|l| {
            l.strip_prefix(name)?
                .strip_prefix(' ')?
                .trim()
                .parse::<f64>()
                .ok()
        })
        .map(|v| v as u64)
        .with_context(|| format!("no {name} on node {i}"))
}

/// `mycni_policy_rejected_total` over its problems, on node `i`.
fn rejected(lab: &Lab, i: usize) -> Result<u64> {
    Ok(lab
        .metrics(i)?
        .lines()
        .filter(|l| l.starts_with("mycni_policy_rejected_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}
