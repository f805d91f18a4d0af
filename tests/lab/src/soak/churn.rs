//! "Churn and leaks": pod ADD/DEL cycles with random concurrency on one lab
//! node, some plugin processes SIGKILLed mid-ADD and mid-DEL, then a count
//! of everything left behind that no live pod explains: leases, host veths,
//! host routes, neighbours, `mycni_local` entries and pinned TCX links.
//! GC with `cni.dev/valid-attachments` must then free exactly the pods it
//! does not list, and DEL of the rest must leave the node empty.
//!
//! The runtime's side is played as containerd plays it: a fresh netns per
//! sandbox, DEL (without `prevResult`) after an ADD that did not succeed,
//! DEL retried until it succeeds, the netns deleted after DEL, and a pod
//! that must run retried as a new sandbox (new container ID, new netns,
//! same pod name, so the same host veth name).

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::os::unix::process::ExitStatusExt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

pub mod leaks;

use super::CaseResult;
use crate::stats::percentile_duration;
use crate::{Lab, Sandbox};
use leaks::{await_datapath, ip_json, kernel_problems, node_state};
use mycni_testkit::sh;

/// Most plugin processes running at once.
const MAX_CONCURRENCY: u64 = 8;
/// Pods left running at the end of the churn (then GCed and deleted).
const LIVE_PODS: usize = 10;
/// Chance, in percent, that an ADD (or a pod's first DEL) is SIGKILLed.
const KILL_PERCENT: u64 = 5;
/// A kill lands at a random fraction, 0..this (in percent), of how long
/// that command has recently taken, so kills spread over every step of the
/// plugin however loaded the machine is (ADD takes several times longer
/// with 8 running than alone), and some land after it exited.
const MAX_KILL_PERCENT_OF_RUN: u64 = 110;
/// The first estimate of a plugin run, before any was timed.
const FIRST_RUN_ESTIMATE: Duration = Duration::from_millis(10);
/// How long the agent may take to mirror the pods in its maps (it learns
/// of pods from the kernel's notifications within milliseconds; its full
/// pass, the safety net, is minutes away in the soak).
const MAP_TIMEOUT: Duration = Duration::from_secs(10);
/// DEL must succeed within this many attempts after being killed.
const DEL_ATTEMPTS: usize = 5;
/// Sandboxes planted before GC: ADD killed after this step, DEL never sent,
/// netns kept (or deleted, as the runtime's own cleanup would). A kill
/// after `veth` with the netns kept is not among them: that veth carries
/// no owner yet, so GC cannot tell it from an ADD in flight, and it goes
/// with the netns.
const ORPHANS: [(&str, bool); 5] = [
    ("ipam", false),
    ("veth", false),
    ("host", true),
    ("pod", true),
    ("host-route", false),
];

/// splitmix64: small, deterministic, good enough to pick faults.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0), bias irrelevant here.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }

    /// Where in a plugin run to kill it, as per mille of its duration.
    fn kill_point(&mut self) -> u64 {
        self.below(MAX_KILL_PERCENT_OF_RUN * 10)
    }
}

/// What cycle `k` will do, fixed by the seed before anything runs.
#[derive(Debug, Clone)]
struct Plan {
    /// Kill the first ADD at this per mille of a typical ADD's duration.
    kill_add: Option<u64>,
    /// Kill the first DEL likewise (never for a pod kept alive).
    kill_del: Option<u64>,
    /// The pod keeps running after the churn.
    keep: bool,
}

fn plans(cycles: usize, rng: &mut Rng) -> Vec<Plan> {
    let live = LIVE_PODS.min(cycles);
    let every = cycles.checked_div(live).unwrap_or(0);
    (0..cycles)
        .map(|k| {
            let keep = every > 0 && k % every == every / 2 && k / every < live;
            let kill_add = rng.percent(KILL_PERCENT).then(|| rng.kill_point());
            let kill_del = (!keep && rng.percent(KILL_PERCENT)).then(|| rng.kill_point());
            Plan {
                kill_add,
                kill_del,
                keep,
            }
        })
        .collect()
}

/// A pod's network namespace, deleted on drop (also when the case fails).
struct PodNs {
    name: String,
}

impl PodNs {
    fn new(name: String) -> Result<Self> {
        sh("ip", &["netns", "add", &name])?;
        Ok(Self { name })
    }

    fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }

    /// Interfaces other than `lo` in the namespace.
    fn interfaces(&self) -> Result<Vec<String>> {
        let out = sh("ip", &["-n", &self.name, "-o", "link", "show"])?;
        Ok(out
            .lines()
            .filter_map(|l| l.split(':').nth(1))
            .map(|n| n.trim().split('@').next().unwrap_or_default().to_string())
            .filter(|n| n != "lo")
            .collect())
    }
}

impl Drop for PodNs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// One sandbox of a churned pod: its container id, its network namespace
/// and the pod's name.
#[derive(Clone, Copy)]
struct PodSandbox<'a> {
    cid: &'a str,
    ns: &'a PodNs,
    pod: &'a str,
}

/// A pod running after the churn.
struct Live {
    pod: String,
    cid: String,
    ip: Ipv4Addr,
    veth: String,
    result: Value,
    ns: PodNs,
}

/// One plugin run.
struct Run {
    killed: bool,
    ok: bool,
    stdout: String,
    stderr: String,
    took: Duration,
}

#[derive(Default)]
struct Stats {
    add_kills_planned: AtomicUsize,
    add_killed: AtomicUsize,
    del_kills_planned: AtomicUsize,
    del_killed: AtomicUsize,
    /// Kept pods whose ADD was killed and that ran again as a new sandbox.
    resandboxed: AtomicUsize,
    del_retries: AtomicUsize,
    adds: AtomicUsize,
    dels: AtomicUsize,
}

struct Ctx<'a> {
    lab: &'a Lab,
    node: usize,
    seed: u64,
    conf: Value,
    stats: Stats,
    /// IPs of pods ADD gave an address and DEL has not started on: an ADD
    /// handing out one of these is a double allocation.
    in_use: Mutex<HashMap<Ipv4Addr, String>>,
    /// Things that went wrong and are not leaks (unexpected plugin errors).
    failures: Mutex<Vec<String>>,
    /// Leaks seen during the churn itself (interfaces a successful DEL left).
    leaks: Mutex<Vec<String>>,
    add_times: Mutex<Vec<Duration>>,
    /// Recent run time per command (EWMA), where kills are aimed.
    typical: Mutex<HashMap<String, Duration>>,
    /// How far each killed plugin had got: "ADD: <what it left>" -> count.
    stages: Mutex<BTreeMap<String, usize>>,
    network: String,
    live: Mutex<Vec<Live>>,
}

impl Ctx<'_> {
    fn fail(&self, what: String) {
        if let Ok(mut f) = self.failures.lock() {
            f.push(what);
        }
    }

    fn leak(&self, what: String) {
        if let Ok(mut l) = self.leaks.lock() {
            l.push(what);
        }
    }

    fn pod_ns_name(&self, k: usize, attempt: usize) -> String {
        format!("{}-n{}-c{k}-{attempt}", self.lab.spec.prefix, self.node)
    }

    fn cid(&self, k: usize, attempt: usize) -> String {
        format!("churn-{:x}-{k}-{attempt}", self.seed)
    }

    fn typical(&self, command: &str) -> Duration {
        self.typical
            .lock()
            .ok()
            .and_then(|t| t.get(command).copied())
            .unwrap_or(FIRST_RUN_ESTIMATE)
    }

    fn observe(&self, command: &str, took: Duration) {
        if let Ok(mut t) = self.typical.lock() {
            let e = t.entry(command.to_string()).or_insert(took);
            *e = (*e * 7 + took) / 8;
        }
    }

    fn stage(&self, what: String) {
        if let Ok(mut s) = self.stages.lock() {
            *s.entry(what).or_default() += 1;
        }
    }

    /// What a killed ADD or DEL of `cid` left on the node and in the pod.
    fn left_behind(&self, cid: &str, ns: &PodNs) -> Result<String> {
        let dir = self
            .lab
            .spec
            .node_dir(self.node)
            .join("ipam")
            .join(&self.network);
        let owner = format!("{cid}\r\n");
        // No directory yet: the first ADD was killed before the store made it.
        let lease = std::fs::read_dir(&dir).is_ok_and(|d| {
            d.flatten()
                .any(|e| std::fs::read_to_string(e.path()).is_ok_and(|c| c.starts_with(&owner)))
        });
        let pod_if = !ns.interfaces()?.is_empty();
        let alias = format!("mycni:{}:{cid}:eth0", self.network);
        let veth = ip_json(self.lab, self.node, &["link", "show"])?
            .into_iter()
            .find(|l| l["ifalias"].as_str() == Some(alias.as_str()))
            .and_then(|l| l["ifname"].as_str().map(str::to_string));
        let route = match &veth {
            Some(v) => ip_json(self.lab, self.node, &["route", "show", "proto", "109"])?
                .iter()
                .any(|r| r["dev"].as_str() == Some(v.as_str())),
            None => false,
        };
        let mut parts = Vec::new();
        if lease {
            parts.push("lease");
        }
        match (pod_if, veth.is_some()) {
            (true, true) => parts.push("marked veth"),
            (true, false) => parts.push("unmarked veth"),
            (false, true) => parts.push("host veth without pod end"),
            (false, false) => {}
        }
        if route {
            parts.push("route");
        }
        Ok(if parts.is_empty() {
            "nothing".to_string()
        } else {
            parts.join("+")
        })
    }

    /// Runs the plugin; with `kill_at` (per mille of a typical run of this
    /// command), SIGKILLs it then unless it has exited by then.
    fn plugin(
        &self,
        command: &str,
        sandbox: Sandbox<'_>,
        conf: &Value,
        kill_at: Option<u64>,
    ) -> Result<Run> {
        let kill_after = kill_at.map(|pm| self.typical(command).mul_f64(pm as f64 / 1000.0));
        let t0 = Instant::now();
        let mut child = self
            .lab
            .cni_command(self.node, command, sandbox)?
            .spawn()
            .context("starting the plugin")?;
        if let Some(mut w) = child.stdin.take() {
            w.write_all(conf.to_string().as_bytes())?;
        }
        if let Some(d) = kill_after {
            std::thread::sleep(d.saturating_sub(t0.elapsed()));
            // Unreaped, the child's pid is still ours even if it exited.
            let _ = child.kill();
        }
        let out = child.wait_with_output()?;
        let run = Run {
            killed: out.status.signal() == Some(libc::SIGKILL),
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            took: t0.elapsed(),
        };
        if run.ok {
            self.observe(command, run.took);
        }
        Ok(run)
    }

    /// An ADD the plugin dies in (`MYCNI_TEST_FAULT=kill:<step>`) and whose
    /// sandbox the runtime then forgets: no DEL ever comes, so only GC can
    /// free what it left. Returns the netns if `keep_ns` (the veth stays),
    /// else deletes it (and the veth with it).
    fn orphan(&self, n: usize, step: &str, keep_ns: bool) -> Result<Option<PodNs>> {
        let ns = PodNs::new(format!("{}-n{}-orphan{n}", self.lab.spec.prefix, self.node))?;
        let cid = format!("orphan-{:x}-{n}", self.seed);
        let mut cmd = self.lab.cni_command(
            self.node,
            "ADD",
            Sandbox::new(&cid, &ns.path(), &format!("orphan-{n}")),
        )?;
        let mut child = cmd
            .env("MYCNI_TEST_FAULT", format!("kill:{step}"))
            .spawn()?;
        if let Some(mut w) = child.stdin.take() {
            w.write_all(self.conf.to_string().as_bytes())?;
        }
        let out = child.wait_with_output()?;
        if out.status.signal() != Some(libc::SIGKILL) {
            bail!(
                "the orphan ADD was not killed at {step} ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stdout)
            );
        }
        let left = self.left_behind(&cid, &ns)?;
        self.stage(format!("orphan ADD killed after {step} left {left}"));
        Ok(keep_ns.then_some(ns))
    }

    /// DEL as the runtime does it: retried until it succeeds. The first
    /// attempt may be killed.
    fn del(&self, sandbox: PodSandbox<'_>, prev: Option<&Value>, kill: Option<u64>) -> Result<()> {
        let PodSandbox { cid, ns, pod } = sandbox;
        let mut conf = self.conf.clone();
        if let Some(prev) = prev {
            conf["prevResult"] = prev.clone();
        }
        for attempt in 0..DEL_ATTEMPTS {
            let kill = if attempt == 0 { kill } else { None };
            if kill.is_some() {
                self.stats.del_kills_planned.fetch_add(1, Ordering::Relaxed);
            }
            let r = self.plugin("DEL", Sandbox::new(cid, &ns.path(), pod), &conf, kill)?;
            self.stats.dels.fetch_add(1, Ordering::Relaxed);
            if r.killed {
                self.stats.del_killed.fetch_add(1, Ordering::Relaxed);
                self.stage(format!("DEL left {}", self.left_behind(cid, ns)?));
                self.stats.del_retries.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if r.ok {
                // ADD made nothing DEL may leave: the netns going away next
                // must not be what cleans up.
                let left = ns.interfaces()?;
                if !left.is_empty() {
                    self.leak(format!(
                        "{cid}: {left:?} still in the pod netns after a successful DEL"
                    ));
                }
                return Ok(());
            }
            self.fail(format!(
                "DEL {cid} failed: {} {}",
                r.stdout.trim(),
                r.stderr.trim()
            ));
            self.stats.del_retries.fetch_add(1, Ordering::Relaxed);
        }
        bail!("DEL {cid} did not succeed in {DEL_ATTEMPTS} attempts")
    }

    fn cycle(&self, k: usize, plan: &Plan) -> Result<()> {
        let pod = format!("churn-{k}");
        let mut attempt = 0;
        loop {
            let ns = PodNs::new(self.pod_ns_name(k, attempt))?;
            let cid = self.cid(k, attempt);
            let kill = if attempt == 0 { plan.kill_add } else { None };
            if kill.is_some() {
                self.stats.add_kills_planned.fetch_add(1, Ordering::Relaxed);
            }
            let r = self.plugin(
                "ADD",
                Sandbox::new(&cid, &ns.path(), &pod),
                &self.conf,
                kill,
            )?;
            self.stats.adds.fetch_add(1, Ordering::Relaxed);
            if r.ok {
                if let Ok(mut t) = self.add_times.lock() {
                    t.push(r.took);
                }
                let result: Value = serde_json::from_str(&r.stdout)
                    .with_context(|| format!("ADD {cid} result {:?}", r.stdout))?;
                let ip: Ipv4Addr = result["ips"][0]["address"]
                    .as_str()
                    .and_then(|a| a.split('/').next())
                    .and_then(|a| a.parse().ok())
                    .with_context(|| format!("no IP in ADD result {result}"))?;
                let veth = result["interfaces"][0]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                {
                    let mut in_use = self
                        .in_use
                        .lock()
                        .map_err(|_| anyhow::anyhow!("poisoned"))?;
                    if let Some(other) = in_use.insert(ip, cid.clone()) {
                        self.fail(format!("{ip} given to {cid} while {other} holds it"));
                    }
                }
                if plan.keep {
                    let live = Live {
                        pod,
                        cid,
                        ip,
                        veth,
                        result,
                        ns,
                    };
                    self.live
                        .lock()
                        .map_err(|_| anyhow::anyhow!("poisoned"))?
                        .push(live);
                    return Ok(());
                }
                if let Ok(mut in_use) = self.in_use.lock() {
                    in_use.remove(&ip);
                }
                let sandbox = PodSandbox {
                    cid: &cid,
                    ns: &ns,
                    pod: &pod,
                };
                return self.del(sandbox, Some(&result), plan.kill_del);
            }
            if r.killed {
                self.stats.add_killed.fetch_add(1, Ordering::Relaxed);
                self.stage(format!("ADD left {}", self.left_behind(&cid, &ns)?));
            } else {
                self.fail(format!(
                    "ADD {cid} failed: {} {}",
                    r.stdout.trim(),
                    r.stderr.trim()
                ));
            }
            // The runtime tears a failed sandbox down: DEL, then the netns.
            let sandbox = PodSandbox {
                cid: &cid,
                ns: &ns,
                pod: &pod,
            };
            self.del(sandbox, None, None)?;
            drop(ns);
            if !plan.keep || attempt >= 2 {
                return Ok(());
            }
            self.stats.resandboxed.fetch_add(1, Ordering::Relaxed);
            attempt += 1;
        }
    }
}

/// Runs `cycles` pod ADD/DEL cycles on lab node `node` (which must have no
/// pods of its own), faults chosen by `seed`, then checks for leaks, GCs
/// and deletes the pods it kept. Unexpected plugin failures (not caused by
/// a kill) fail the case.
pub fn churn(lab: &Lab, node: usize, cycles: usize, seed: u64) -> Result<CaseResult> {
    let conf = lab.plugin_conf(node)?;
    let network = conf["name"].as_str().context("network name")?.to_string();
    let mut rng = Rng(seed);
    let plan = plans(cycles, &mut rng);
    let before = node_state(lab, node, &network)?;
    let baseline = kernel_problems(&before, &[], &network);
    if !baseline.is_empty() || !before.map.is_empty() {
        bail!("node {node} is not empty before the churn: {baseline:?}");
    }

    let ctx = Ctx {
        lab,
        node,
        seed,
        conf,
        stats: Stats::default(),
        in_use: Mutex::new(HashMap::new()),
        failures: Mutex::new(Vec::new()),
        leaks: Mutex::new(Vec::new()),
        add_times: Mutex::new(Vec::new()),
        typical: Mutex::new(HashMap::new()),
        stages: Mutex::new(BTreeMap::new()),
        network: network.clone(),
        live: Mutex::new(Vec::new()),
    };
    let t_churn = Instant::now();
    let mut k = 0;
    let mut max_wave = 0;
    while k < cycles {
        let wave = (1 + rng.below(MAX_CONCURRENCY) as usize).min(cycles - k);
        max_wave = max_wave.max(wave);
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = (k..k + wave)
                .map(|j| {
                    let (ctx, p) = (&ctx, &plan[j]);
                    s.spawn(move || ctx.cycle(j, p))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("cycle panicked")))
                })
                .collect()
        });
        for r in results {
            r?;
        }
        k += wave;
    }
    let churn_took = t_churn.elapsed();

    let mut live = std::mem::take(&mut *ctx.live.lock().map_err(|_| anyhow::anyhow!("poisoned"))?);
    live.sort_by_key(|l| l.pod.clone());
    let mut notes: Vec<String> = Vec::new();
    let mut leaks: Vec<String> = ctx
        .leaks
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();

    // 1. After the churn: exactly the live pods.
    let all: Vec<&Live> = live.iter().collect();
    let st = node_state(lab, node, &network)?;
    leaks.extend(
        kernel_problems(&st, &all, &network)
            .into_iter()
            .map(|p| format!("after churn: {p}")),
    );
    let (repair_churn, p) = await_datapath(lab, node, &network, &all)?;
    leaks.extend(p.into_iter().map(|p| format!("after churn: {p}")));

    // 2. GC listing some of the live pods frees exactly the others, and
    // what ADDs killed at each step left when their DEL never came.
    let (listed, stale) = all.split_at(all.len().div_ceil(2).min(all.len()));
    let mut orphans = Vec::new();
    for (n, (step, keep_ns)) in ORPHANS.iter().enumerate() {
        if let Some(ns) = ctx.orphan(n, step, *keep_ns)? {
            orphans.push(ns);
        }
    }
    let mut gc = ctx.conf.clone();
    gc["cni.dev/valid-attachments"] = Value::Array(
        listed
            .iter()
            .map(|l| json!({"containerID": l.cid, "ifname": "eth0"}))
            .collect(),
    );
    let r = ctx.plugin("GC", Sandbox::new("", "", ""), &gc, None)?;
    if !r.ok {
        ctx.fail(format!(
            "GC failed: {} {}",
            r.stdout.trim(),
            r.stderr.trim()
        ));
    }
    let st = node_state(lab, node, &network)?;
    leaks.extend(
        kernel_problems(&st, listed, &network)
            .into_iter()
            .map(|p| format!("after GC: {p}")),
    );
    for l in stale {
        let left = l.ns.interfaces()?;
        if !left.is_empty() {
            leaks.push(format!("after GC: {left:?} left in {}'s netns", l.cid));
        }
    }
    for ns in &orphans {
        let left = ns.interfaces()?;
        if !left.is_empty() {
            leaks.push(format!("after GC: {left:?} left in {}", ns.name));
        }
    }
    let (repair_gc, p) = await_datapath(lab, node, &network, listed)?;
    leaks.extend(p.into_iter().map(|p| format!("after GC: {p}")));

    // 3. DEL of every pod (the GCed ones too: DEL is idempotent) empties the node.
    let seen = ctx
        .leaks
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .len();
    for l in &live {
        let sandbox = PodSandbox {
            cid: &l.cid,
            ns: &l.ns,
            pod: &l.pod,
        };
        ctx.del(sandbox, Some(&l.result), None)?;
    }
    leaks.extend(
        ctx.leaks
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .iter()
            .skip(seen)
            .map(|l| format!("final DEL: {l}")),
    );
    let st = node_state(lab, node, &network)?;
    leaks.extend(
        kernel_problems(&st, &[], &network)
            .into_iter()
            .map(|p| format!("at the end: {p}")),
    );
    let (repair_end, p) = await_datapath(lab, node, &network, &[])?;
    leaks.extend(p.into_iter().map(|p| format!("at the end: {p}")));

    let failures = ctx
        .failures
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    let s = &ctx.stats;
    let n = |a: &AtomicUsize| a.load(Ordering::Relaxed);
    let add_times = ctx
        .add_times
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    let add_ms = |p| {
        percentile_duration(&add_times, p)
            .unwrap_or_default()
            .as_millis()
    };
    notes.push(format!(
        "{} ADDs, {} DELs in {:.1} s; ADD p50 {} ms, p99 {} ms",
        n(&s.adds),
        n(&s.dels),
        churn_took.as_secs_f64(),
        add_ms(50),
        add_ms(99)
    ));
    notes.push(format!(
        "kills planned {} ADD / {} DEL, the rest exited first; {} kept pods re-sandboxed after a killed ADD; \
         GC kept {} of {} live pods; map mirrored the pods {} / {} / {} ms after churn / GC / last DEL",
        n(&s.add_kills_planned),
        n(&s.del_kills_planned),
        n(&s.resandboxed),
        listed.len(),
        listed.len() + stale.len(),
        repair_churn.as_millis(),
        repair_gc.as_millis(),
        repair_end.as_millis()
    ));
    let stages = ctx
        .stages
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .iter()
        .map(|(s, n)| format!("{n} {s}"))
        .collect::<Vec<_>>()
        .join(", ");
    notes.push(format!("killed plugins: {stages}"));
    if !leaks.is_empty() {
        notes.push(format!("LEAKS: {}", leaks.join("; ")));
    }
    let result = CaseResult {
        case: "churn and leaks".into(),
        load: format!(
            "{cycles} ADD/DEL cycles, 1-{max_wave} concurrent, {} pods kept live",
            listed.len() + stale.len()
        ),
        faults: format!(
            "{} plugins SIGKILLed ({} mid-ADD, {} mid-DEL), seed {seed:#x}; \
             before GC, {} ADDs killed at fixed steps and never DELed",
            n(&s.add_killed) + n(&s.del_killed),
            n(&s.add_killed),
            n(&s.del_killed),
            ORPHANS.len()
        ),
        longest_gap: None,
        leaks: leaks.len(),
        repair: Some(repair_churn.max(repair_gc).max(repair_end)),
        notes: notes.join("; "),
    };
    if !failures.is_empty() {
        bail!(
            "{} unexpected plugin failures: {}\n{}",
            failures.len(),
            failures.join("\n"),
            super::table(std::slice::from_ref(&result))
        );
    }
    Ok(result)
}
