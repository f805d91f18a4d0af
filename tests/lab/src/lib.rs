//! The local multi-node lab: an underlay bridge in its own namespace, N node
//! namespaces each running the real `mycni-agent` against the Kubernetes
//! API fixture, and P pods per node made by the real plugin binary from the
//! conflist the agent wrote. Used by `cargo xtask lab` and the lab tests.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use mycni_apiserver::{ApiServer, node};
use mycni_testkit::{in_netns, sh};

pub mod labbench;
pub mod soak;

/// The binaries a lab runs.
#[derive(Debug, Clone)]
pub struct Bins {
    pub agent: PathBuf,
    pub plugin: PathBuf,
    pub apiserver: PathBuf,
    /// `mycni-lab` itself: pods run its echo server.
    pub lab: PathBuf,
}

#[derive(Debug, Clone)]
pub struct Spec {
    /// Namespace names start with this: `mycni` for the CLI lab, unique in tests.
    pub prefix: String,
    pub nodes: usize,
    pub pods: usize,
    /// Lab state: kubeconfig, per-node dirs, logs, pids.
    pub root: PathBuf,
    pub bins: Bins,
    /// Extra arguments for every agent (e.g. `--datapath kernel`).
    pub agent_args: Vec<String>,
    /// Run the API fixture inside this process (tests, which then change
    /// Nodes and inject faults through `Lab::api`), else as a daemon.
    pub in_process_api: bool,
}

pub const API_ADDR: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 1);
pub const API_PORT: u16 = 6443;
pub const ECHO_PORT: u16 = 7777;
pub const METRICS_PORT: u16 = 9971;
/// Bytes each matrix cell echoes over its TCP connection once established.
/// Pings and every connection's SYN and FIN take the kernel path by design,
/// so without a transfer the matrix would say nothing about the fast path;
/// 200 KB is ~140 full-size segments each way, a few ms per cell, and full
/// segments also catch an MTU or encapsulation mistake small probes miss.
pub const MATRIX_BULK_BYTES: usize = 200 * 1024;

pub fn node_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(192, 168, 77, 10 + i as u8)
}

// ---------------------------------------------------------------- interrupts

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// SIGINT, SIGTERM and SIGHUP set a flag instead of killing the process, so
/// `lab up`, the bench and the soak stop at their next check and still tear
/// down what they made. Children get the default dispositions back at exec.
pub fn catch_interrupts() {
    let handler = on_signal as extern "C" fn(libc::c_int);
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        unsafe { libc::signal(sig, handler as *const () as libc::sighandler_t) };
    }
}

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

pub fn check_interrupted() -> Result<()> {
    if interrupted() {
        bail!("interrupted");
    }
    Ok(())
}

// ----------------------------------------------------------------- datapath

/// Packets per path name (`mycni_common::DpPath::name`), as a node's agent
/// exports them.
pub type Counters = BTreeMap<String, u64>;

/// `mycni_datapath_packets_total{path="...",fast="..."} N` lines of a
/// metrics page.
pub fn parse_counters(metrics: &str) -> Counters {
    let mut out = Counters::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("mycni_datapath_packets_total{path=\"") else {
            continue;
        };
        let name = rest.split('"').next().unwrap_or_default().to_string();
        let n = rest
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        out.insert(name, n);
    }
    out
}

/// The value of the last `flag value` or `flag=value` in `args`.
fn flag_value(args: &[String], flag: &str) -> Option<String> {
    let mut found = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == flag {
            found = it.next().cloned();
        } else if let Some(v) = a.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            found = Some(v.to_string());
        }
    }
    found
}

/// What the agent's readiness detail says of its datapath (mycni-agent's
/// `FastPath::describe`): the kernel path's reason follows the first.
const KERNEL_DETAIL: &str = "datapath kernel: ";
const EBPF_TC_ENCAP_DETAIL: &str = "datapath ebpf, tc encap";
const EBPF_VXLAN_DETAIL: &str = "datapath ebpf, via vxlan.1";

/// The reason in a `/readyz` answer for running the kernel datapath, or the
/// whole answer when it gives none.
fn kernel_reason(readyz: &str) -> String {
    match readyz.find(KERNEL_DETAIL) {
        Some(k) => readyz[k + KERNEL_DETAIL.len()..].trim().to_string(),
        None => format!("the agent gives no reason ({})", readyz.trim()),
    }
}

/// The datapath a node's agent runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeDatapath {
    /// The tc programs, encapsulating to remote pods themselves (datapath v2).
    EbpfTcEncap,
    /// The tc programs, handing remote traffic to `vxlan.1` (`--tc-encap false`).
    EbpfVxlan,
    /// Routes, ARP and FDB only, for the reason the agent gives.
    Kernel(String),
}

impl NodeDatapath {
    /// Its `--datapath` value.
    pub fn mode(&self) -> &'static str {
        match self {
            NodeDatapath::EbpfTcEncap | NodeDatapath::EbpfVxlan => "ebpf",
            NodeDatapath::Kernel(_) => "kernel",
        }
    }
}

impl std::fmt::Display for NodeDatapath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeDatapath::EbpfTcEncap => f.write_str("ebpf with tc encap"),
            NodeDatapath::EbpfVxlan => f.write_str("ebpf via vxlan.1"),
            NodeDatapath::Kernel(why) => write!(f, "kernel ({why})"),
        }
    }
}

fn path_named(name: &str) -> Option<mycni_common::DpPath> {
    mycni_common::DpPath::ALL
        .into_iter()
        .find(|p| p.name() == name)
}

/// What a node's programs saw over an interval, summed the ways a fast
/// share needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathShare {
    /// Pod traffic (`DpPath::is_pod_traffic`): what a fast share is out of.
    /// The underlay program also sees the node's own traffic (the API, the
    /// metrics scrapes), which says nothing about pods.
    pub pod: u64,
    /// Of `pod`, the packets the programs forwarded (`DpPath::is_fast`).
    pub fast: u64,
    /// Of `fast`, those that still crossed `vxlan.1` (`DpPath::crossed_vxlan`).
    pub crossed_vxlan: u64,
    /// Pod packets left to the kernel, by path name.
    pub kernel: Counters,
}

impl PathShare {
    /// From counters read before and after the interval. A path name this
    /// build does not know counts as pod traffic left to the kernel, so the
    /// share can only come out too low, never too high.
    pub fn between(before: &Counters, after: &Counters) -> PathShare {
        let mut s = PathShare::default();
        for (name, n) in after {
            let d = n.saturating_sub(before.get(name).copied().unwrap_or(0));
            if d == 0 {
                continue;
            }
            let path = path_named(name);
            if path.is_some_and(|p| !p.is_pod_traffic()) {
                continue;
            }
            s.pod += d;
            match path {
                Some(p) if p.is_fast() => {
                    s.fast += d;
                    if p.crossed_vxlan() {
                        s.crossed_vxlan += d;
                    }
                }
                _ => *s.kernel.entry(name.clone()).or_default() += d,
            }
        }
        s
    }

    pub fn add(&mut self, o: &PathShare) {
        self.pod += o.pod;
        self.fast += o.fast;
        self.crossed_vxlan += o.crossed_vxlan;
        for (k, v) in &o.kernel {
            *self.kernel.entry(k.clone()).or_default() += v;
        }
    }

    /// Fast packets per pod packet, in percent; None when no pod packet was seen.
    pub fn fast_pct(&self) -> Option<f64> {
        (self.pod > 0).then(|| 100.0 * self.fast as f64 / self.pod as f64)
    }

    /// Fast packets that crossed `vxlan.1`, in percent of the fast ones.
    pub fn crossed_pct(&self) -> Option<f64> {
        (self.fast > 0).then(|| 100.0 * self.crossed_vxlan as f64 / self.fast as f64)
    }

    /// `87.3% fast of 2345 pod packets, 0.0% of those through vxlan.1;
    /// kernel: kernel_tcp_control 300, ...`
    pub fn describe(&self) -> String {
        let Some(fast) = self.fast_pct() else {
            return "the programs saw no pod packets".into();
        };
        let mut s = format!("{fast:.1}% fast of {} pod packets", self.pod);
        if let Some(c) = self.crossed_pct() {
            let _ = write!(s, ", {c:.1}% of those through vxlan.1");
        }
        let mut kernel: Vec<(&String, &u64)> = self.kernel.iter().collect();
        kernel.sort_by(|a, b| b.1.cmp(a.1));
        if !kernel.is_empty() {
            let top: Vec<String> = kernel
                .iter()
                .take(4)
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            let _ = write!(s, "; kernel: {}", top.join(", "));
        }
        s
    }
}

impl Spec {
    pub fn underlay_ns(&self) -> String {
        format!("{}-underlay", self.prefix)
    }
    pub fn node_name(&self, i: usize) -> String {
        format!("{}-node{i}", self.prefix)
    }
    pub fn pod_ns(&self, i: usize, j: usize) -> String {
        format!("{}-node{i}-pod{j}", self.prefix)
    }
    pub fn node_dir(&self, i: usize) -> PathBuf {
        self.root.join(format!("node{i}"))
    }
    pub fn kubeconfig(&self) -> PathBuf {
        self.root.join("kubeconfig")
    }
    /// The lab's own bpffs: each node pins under `<bpffs>/node<i>/mycni`.
    /// Not /sys/fs/bpf: `ip netns exec` remounts /sys, hiding it.
    pub fn bpffs(&self) -> PathBuf {
        self.root.join("bpffs")
    }
    pub fn pin_dir(&self, i: usize) -> PathBuf {
        self.bpffs().join(format!("node{i}/mycni"))
    }
    fn pods_file(&self) -> PathBuf {
        self.root.join("pods.json")
    }
}

fn ns_exec(ns: &str, program: &str, args: &[&str]) -> Result<String> {
    let mut full = vec!["netns", "exec", ns, program];
    full.extend_from_slice(args);
    sh("ip", &full)
}

/// Starts `program` inside `ns` as a daemon in its own session (so it
/// outlives `lab up`), logging to `log`; records its pid in `pidfile`.
pub fn spawn_daemon(
    ns: &str,
    program: &Path,
    args: &[String],
    log: &Path,
    pidfile: &Path,
) -> Result<u32> {
    let out = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone()?;
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns])
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    // SAFETY: setsid, sigemptyset, sigprocmask and signal are
    // async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            // A daemon must die on SIGTERM whatever mask or disposition the
            // spawning thread had (a test harness thread, a runtime worker).
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
            libc::signal(libc::SIGTERM, libc::SIG_DFL);
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {}", program.display()))?;
    let pid = child.id();
    std::fs::write(pidfile, pid.to_string())?;
    Ok(pid)
}

fn stop_pidfile(pidfile: &Path) {
    let Ok(s) = std::fs::read_to_string(pidfile) else {
        return;
    };
    let Ok(pid) = s.trim().parse::<i32>() else {
        return;
    };
    // SAFETY: plain kill(2) on a pid we started.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    for _ in 0..500 {
        // When this process started the daemon (tests), it is our child and
        // stays a zombie until reaped: kill(pid, 0) alone would see it alive.
        // SAFETY: WNOHANG waitpid on a pid; ECHILD when it is not our child.
        let reaped = unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) } == pid;
        // SAFETY: signal 0 only probes for existence.
        if reaped || unsafe { libc::kill(pid, 0) } != 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let _ = std::fs::remove_file(pidfile);
}

/// Polls `f` every 100 ms until it holds, Ctrl-C or `timeout`.
pub(crate) fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        check_interrupted()?;
        if f() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("timed out after {timeout:?} waiting for {what}")
}

/// One pod of the lab.
#[derive(Debug, Clone)]
pub struct Pod {
    pub node: usize,
    pub index: usize,
    pub ns: String,
    pub ip: Ipv4Addr,
}

/// A matrix's table, its failed cells and, when counted, every node's
/// counters before it, after its pod rows and after its node rows.
#[derive(Debug, Default)]
pub struct MatrixRun {
    pub table: String,
    pub failed: usize,
    pub counters: Vec<Vec<Counters>>,
}

/// A pod's short name in tables: `n<node>p<index>`.
pub fn pod_label(p: &Pod) -> String {
    format!("n{}p{}", p.node, p.index)
}

pub struct Lab {
    pub spec: Spec,
    pub api: Option<ApiServer>,
}

impl Lab {
    /// Builds the whole lab. On failure, whatever was made is torn down.
    pub fn up(spec: Spec) -> Result<Lab> {
        if spec.root.join("state").exists() {
            bail!(
                "a lab is already up at {} (run `cargo xtask lab down`)",
                spec.root.display()
            );
        }
        std::fs::create_dir_all(&spec.root)?;
        std::fs::write(spec.root.join("state"), "up\n")?;
        let mut lab = Lab { spec, api: None };
        if let Err(e) = lab.build() {
            let logs = lab.agent_log_tails();
            lab.down();
            return Err(e.context(logs));
        }
        Ok(lab)
    }

    /// Attaches to a lab already up (for `lab test/status/down`).
    pub fn attach(spec: Spec) -> Lab {
        Lab { spec, api: None }
    }

    fn build(&mut self) -> Result<()> {
        let bpffs = self.spec.bpffs();
        std::fs::create_dir_all(&bpffs)?;
        sh("mount", &["-t", "bpf", "bpf", &bpffs.to_string_lossy()])?;
        let u = self.spec.underlay_ns();
        sh("ip", &["netns", "add", &u])?;
        ns_exec(&u, "ip", &["link", "set", "lo", "up"])?;
        // A fixed address: a bridge without one takes its lowest port's MAC,
        // which changes as nodes are added, and a node that resolved the old
        // one loses the API server until its neighbour entry expires.
        ns_exec(
            &u,
            "ip",
            &[
                "link",
                "add",
                "br0",
                "address",
                "02:00:c0:a8:4d:01",
                "type",
                "bridge",
            ],
        )?;
        ns_exec(
            &u,
            "ip",
            &["addr", "add", &format!("{API_ADDR}/24"), "dev", "br0"],
        )?;
        ns_exec(&u, "ip", &["link", "set", "br0", "up"])?;
        if self.spec.in_process_api {
            let api = in_netns(&u, || {
                ApiServer::start(SocketAddr::from((API_ADDR, API_PORT)))
            })??;
            for i in 1..=self.spec.nodes {
                api.create_node(node(
                    &self.spec.node_name(i),
                    Some(&format!("10.244.{i}.0/24")),
                ))?;
            }
            api.write_kubeconfig(&self.spec.kubeconfig())?;
            self.api = Some(api);
        } else {
            self.spawn_api()?;
        }
        let s = &self.spec;
        for i in 1..=s.nodes {
            check_interrupted()?;
            self.add_node(i)?;
        }
        for i in 1..=s.nodes {
            let conflist = s.node_dir(i).join("net.d/00-mycni.conflist");
            wait_for(
                &format!("{} to write its conflist", s.node_name(i)),
                Duration::from_secs(30),
                || conflist.exists(),
            )?;
        }
        // Up means converged: every node routes to every other node's pods
        // before any pod exists, so the first packet of a test never races
        // an agent that has not seen a late peer yet.
        for i in 1..=s.nodes {
            let ns = s.node_name(i);
            wait_for(
                &format!("{ns} to program its {} peers", s.nodes - 1),
                Duration::from_secs(30),
                || {
                    sh("ip", &["-n", &ns, "route", "show", "proto", "110"])
                        .map(|r| r.lines().count() == s.nodes - 1)
                        .unwrap_or(false)
                },
            )?;
        }
        let mut pods = Vec::new();
        for i in 1..=s.nodes {
            for j in 1..=s.pods {
                check_interrupted()?;
                pods.push(self.add_pod(i, j)?);
            }
        }
        // With the fast path on, up also means every pod's veth is attached
        // (the agent picks new pods up on its next full pass).
        for i in 1..=s.nodes {
            let want = format!("mycni_datapath_entries{{map=\"local\"}} {}", s.pods);
            wait_for(
                &format!("{} to attach its pods", s.node_name(i)),
                Duration::from_secs(30),
                || {
                    self.metrics(i)
                        .map(|m| {
                            m.lines().any(|l| l == "mycni_datapath_ebpf 0")
                                || m.lines().any(|l| l == want)
                        })
                        .unwrap_or(false)
                },
            )?;
        }
        let listing: Vec<Value> = pods
            .iter()
            .map(|p| json!({"node": p.node, "index": p.index, "ns": p.ns, "ip": p.ip.to_string()}))
            .collect();
        std::fs::write(s.pods_file(), serde_json::to_vec_pretty(&listing)?)?;
        Ok(())
    }

    fn spawn_api(&self) -> Result<()> {
        let s = &self.spec;
        let u = s.underlay_ns();
        let mut api_args = vec![
            "--listen".to_string(),
            format!("{API_ADDR}:{API_PORT}"),
            "--kubeconfig".to_string(),
            s.kubeconfig().to_string_lossy().into_owned(),
        ];
        for i in 1..=s.nodes {
            api_args.push("--node".into());
            api_args.push(format!("{}=10.244.{i}.0/24", s.node_name(i)));
        }
        spawn_daemon(
            &u,
            &s.bins.apiserver,
            &api_args,
            &s.root.join("apiserver.log"),
            &s.root.join("apiserver.pid"),
        )?;
        wait_for(
            "the API fixture's kubeconfig",
            Duration::from_secs(10),
            || s.kubeconfig().exists(),
        )
    }

    /// Fault injection on the in-process fixture; the listener is reopened
    /// inside the underlay namespace, where the agents can reach it.
    pub fn set_api_reachable(&self, up: bool) -> Result<()> {
        let api = self
            .api
            .as_ref()
            .context("the lab's API fixture is not in-process")?;
        in_netns(&self.spec.underlay_ns(), || api.set_reachable(up))
    }

    /// Reads a node's Prometheus metrics (from the underlay, where its
    /// metrics address is reachable).
    pub fn metrics(&self, i: usize) -> Result<String> {
        let addr = format!("{}:{METRICS_PORT}", node_ip(i));
        in_netns(&self.spec.underlay_ns(), || http_get(&addr, "/metrics"))?
    }

    /// A node's `/readyz` answer: status line and the agent's readiness
    /// detail (which says why a node runs the kernel datapath).
    pub fn readyz(&self, i: usize) -> Result<String> {
        let addr = format!("{}:{METRICS_PORT}", node_ip(i));
        in_netns(&self.spec.underlay_ns(), || http_get(&addr, "/readyz"))?
    }

    /// A node's fast-path counters (packets per path name, e.g.
    /// `fast_encap`), read from its metrics endpoint. Empty while the node
    /// runs the kernel datapath.
    pub fn counters(&self, i: usize) -> Result<Counters> {
        Ok(parse_counters(&self.metrics(i)?))
    }

    /// Every node's counters, in node order; a node that does not answer
    /// counts as empty, so a delta over it is zero rather than an error.
    pub fn all_counters(&self) -> Vec<Counters> {
        (1..=self.spec.nodes)
            .map(|i| self.counters(i).unwrap_or_default())
            .collect()
    }

    /// The command line of node `i`'s agent. `ip netns exec` execs the
    /// agent in place, so the pid file's process is the agent itself; this
    /// is what tells a lab attached later which flags it was started with.
    fn agent_cmdline(&self, i: usize) -> Option<Vec<String>> {
        let pid = std::fs::read_to_string(self.spec.node_dir(i).join("agent.pid")).ok()?;
        let raw = std::fs::read(format!("/proc/{}/cmdline", pid.trim())).ok()?;
        Some(
            raw.split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect(),
        )
    }

    /// The value of `flag` on node `i`'s agent command line (the last one,
    /// as clap takes it), else in the lab's agent arguments.
    pub fn agent_flag(&self, i: usize, flag: &str) -> Option<String> {
        let args = self
            .agent_cmdline(i)
            .unwrap_or_else(|| self.spec.agent_args.clone());
        flag_value(&args, flag)
    }

    /// Which datapath node `i`'s agent runs: ebpf or kernel from its
    /// metrics; the kernel path's reason, and whether the fast path
    /// encapsulates in tc, from its readiness detail (`datapath ebpf, tc
    /// encap (...)`), else from its `--tc-encap` flag.
    pub fn datapath(&self, i: usize) -> Result<NodeDatapath> {
        let m = self.metrics(i)?;
        let ready = self.readyz(i).unwrap_or_else(|e| format!("/readyz: {e:#}"));
        if !m.lines().any(|l| l == "mycni_datapath_ebpf 1") {
            return Ok(NodeDatapath::Kernel(kernel_reason(&ready)));
        }
        let tc_encap = if ready.contains(EBPF_VXLAN_DETAIL) {
            false
        } else if ready.contains(EBPF_TC_ENCAP_DETAIL) {
            true
        } else {
            // An agent whose detail names neither; the flag's default is true.
            self.agent_flag(i, "--tc-encap").as_deref() != Some("false")
        };
        Ok(if tc_encap {
            NodeDatapath::EbpfTcEncap
        } else {
            NodeDatapath::EbpfVxlan
        })
    }

    /// Fails unless every agent runs the `want` datapath (`ebpf` or
    /// `kernel`), naming each node that does not and the reason its agent
    /// gives: an agent built without the eBPF object, or whose programs do
    /// not load, falls back to the kernel path, and a lab must not pass that
    /// off as the fast path.
    pub fn check_datapath(&self, want: &str) -> Result<()> {
        // Nodes grouped by what they run, so one cause reads once.
        let mut wrong: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for i in 1..=self.spec.nodes {
            let d = self.datapath(i)?;
            if d.mode() != want {
                wrong
                    .entry(d.to_string())
                    .or_default()
                    .push(self.spec.node_name(i));
            }
        }
        if !wrong.is_empty() {
            let what: Vec<String> = wrong
                .iter()
                .map(|(d, nodes)| {
                    format!(
                        "{} run{} {d}",
                        nodes.join(", "),
                        if nodes.len() == 1 { "s" } else { "" }
                    )
                })
                .collect();
            bail!("asked for the {want} datapath, but {}", what.join("; "));
        }
        Ok(())
    }

    /// Restarts every agent with `--datapath mode` (`ebpf` or `kernel`) and
    /// waits until each is ready again and reports that datapath.
    pub fn set_datapath(&mut self, mode: &str) -> Result<()> {
        self.set_agent_flags(&[("--datapath", mode)])
    }

    /// Restarts every agent on the fast path, encapsulating in tc or handing
    /// remote traffic to `vxlan.1`, and waits until each runs it.
    pub fn set_fast_path(&mut self, tc_encap: bool) -> Result<()> {
        let encap = if tc_encap { "true" } else { "false" };
        self.set_agent_flags(&[("--datapath", "ebpf"), ("--tc-encap", encap)])
    }

    /// Replaces `flags` in the agents' arguments, restarts every agent and
    /// waits until each is ready and runs the datapath `--datapath` asks for;
    /// an agent that came up on the other one fails this at once, with its
    /// reason, rather than after a timeout.
    fn set_agent_flags(&mut self, flags: &[(&str, &str)]) -> Result<()> {
        for (flag, value) in flags {
            let args = &mut self.spec.agent_args;
            while let Some(k) = args.iter().position(|a| a == flag) {
                args.drain(k..(k + 2).min(args.len()));
            }
            args.extend([flag.to_string(), value.to_string()]);
        }
        let mode = flag_value(&self.spec.agent_args, "--datapath").unwrap_or_else(|| "ebpf".into());
        for i in 1..=self.spec.nodes {
            self.restart_agent(i)?;
        }
        for i in 1..=self.spec.nodes {
            wait_for(
                &format!("node {i} to run the {mode} datapath"),
                Duration::from_secs(30),
                || match self.datapath(i) {
                    Ok(d) if d.mode() == mode => true,
                    // The agent says it settled on the kernel path: no
                    // point waiting for the fast path any longer.
                    Ok(NodeDatapath::Kernel(_)) => {
                        self.readyz(i).is_ok_and(|r| r.contains(KERNEL_DETAIL))
                    }
                    _ => false,
                },
            )?;
        }
        self.check_datapath(&mode)
    }

    fn add_node(&self, i: usize) -> Result<()> {
        let s = &self.spec;
        let ns = s.node_name(i);
        let dir = s.node_dir(i);
        for sub in ["net.d", "run", "data", "ipam"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        sh("ip", &["netns", "add", &ns])?;
        let port = format!("n{i}");
        ns_exec(&ns, "ip", &["link", "set", "lo", "up"])?;
        sh(
            "ip",
            &[
                "-n",
                &ns,
                "link",
                "add",
                "eth0",
                "type",
                "veth",
                "peer",
                "name",
                &port,
                "netns",
                &s.underlay_ns(),
            ],
        )?;
        ns_exec(
            &s.underlay_ns(),
            "ip",
            &["link", "set", &port, "master", "br0", "up"],
        )?;
        ns_exec(
            &ns,
            "ip",
            &["addr", "add", &format!("{}/24", node_ip(i)), "dev", "eth0"],
        )?;
        ns_exec(&ns, "ip", &["link", "set", "eth0", "up"])?;
        ns_exec(
            &ns,
            "ip",
            &["route", "add", "default", "via", &API_ADDR.to_string()],
        )?;
        self.start_agent(i)
    }

    pub fn start_agent(&self, i: usize) -> Result<()> {
        let s = &self.spec;
        let dir = s.node_dir(i);
        let p = |sub: &str| dir.join(sub).to_string_lossy().into_owned();
        let mut args: Vec<String> = vec![
            "run".into(),
            "--node-name".into(),
            s.node_name(i),
            "--kubeconfig".into(),
            s.kubeconfig().to_string_lossy().into_owned(),
            "--cni-conf-dir".into(),
            p("net.d"),
            "--state-dir".into(),
            p("run"),
            "--data-dir".into(),
            p("data"),
            "--ipam-data-dir".into(),
            p("ipam"),
            "--plugin-log-file".into(),
            p("plugin.log"),
            "--proc-sys".into(),
            "/proc/sys".into(),
            "--metrics-addr".into(),
            format!("{}:{METRICS_PORT}", node_ip(i)),
            "--bpffs".into(),
            s.bpffs()
                .join(format!("node{i}"))
                .to_string_lossy()
                .into_owned(),
        ];
        args.extend(s.agent_args.iter().cloned());
        spawn_daemon(
            &s.node_name(i),
            &s.bins.agent,
            &args,
            &dir.join("agent.log"),
            &dir.join("agent.pid"),
        )?;
        Ok(())
    }

    /// SIGTERM, wait, SIGKILL: the agent's datapath must stay in place.
    pub fn stop_agent(&self, i: usize) {
        stop_pidfile(&self.spec.node_dir(i).join("agent.pid"));
    }

    /// SIGKILL, no warning: what an OOM kill or a node hiccup does.
    pub fn kill_agent(&self, i: usize) {
        let pidfile = self.spec.node_dir(i).join("agent.pid");
        let Some(pid) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        else {
            return;
        };
        // SAFETY: kill(2) and waitpid(2) on a pid this lab started; waitpid
        // reaps it when it is our child (ECHILD otherwise, harmless).
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        let _ = std::fs::remove_file(pidfile);
    }

    pub fn restart_agent(&self, i: usize) -> Result<()> {
        self.stop_agent(i);
        self.start_agent(i)?;
        let ready = self.spec.node_dir(i).join("run/ready");
        wait_for(
            "the restarted agent to be ready",
            Duration::from_secs(30),
            || ready.exists(),
        )
        .map_err(|e| e.context(self.agent_log_tails()))
    }

    /// The runtime's part: plugin ADD with the network from the agent's conflist.
    fn add_pod(&self, i: usize, j: usize) -> Result<Pod> {
        let s = &self.spec;
        let ns = s.pod_ns(i, j);
        sh("ip", &["netns", "add", &ns])?;
        ns_exec(&ns, "ip", &["link", "set", "lo", "up"])?;
        let result = self.cni(
            i,
            "ADD",
            &format!("lab-{i}-{j}"),
            &format!("/run/netns/{ns}"),
            &format!("pod{j}"),
        )?;
        let ip: Ipv4Addr = result["ips"][0]["address"]
            .as_str()
            .and_then(|a| a.split('/').next())
            .and_then(|a| a.parse().ok())
            .with_context(|| format!("no IP in ADD result {result}"))?;
        let pod_dir = s.node_dir(i).join(format!("pod{j}"));
        std::fs::create_dir_all(&pod_dir)?;
        spawn_daemon(
            &ns,
            &s.bins.lab,
            &["echo-server".into(), ECHO_PORT.to_string()],
            &pod_dir.join("echo.log"),
            &pod_dir.join("echo.pid"),
        )?;
        Ok(Pod {
            node: i,
            index: j,
            ns,
            ip,
        })
    }

    /// The config the runtime passes the plugin on node `i`: the conflist's
    /// single plugin config, with the list's `cniVersion` and `name`.
    pub fn plugin_conf(&self, i: usize) -> Result<Value> {
        let conflist: Value = serde_json::from_slice(&std::fs::read(
            self.spec.node_dir(i).join("net.d/00-mycni.conflist"),
        )?)?;
        let mut conf = conflist["plugins"][0].clone();
        conf["cniVersion"] = conflist["cniVersion"].clone();
        conf["name"] = conflist["name"].clone();
        Ok(conf)
    }

    /// The plugin on node `i` as the runtime starts it for pod `pod`
    /// (interface `eth0`), stdin, stdout and stderr piped: the caller
    /// writes the config to stdin, and may kill the child.
    pub fn cni_command(
        &self,
        i: usize,
        command: &str,
        cid: &str,
        netns: &str,
        pod: &str,
    ) -> Result<Command> {
        let s = &self.spec;
        let bin_dir = s.bins.plugin.parent().context("plugin path")?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &s.node_name(i)])
            .arg(&s.bins.plugin)
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", cid)
            .env("CNI_NETNS", netns)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", bin_dir)
            .env(
                "CNI_ARGS",
                format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=lab;K8S_POD_NAME={pod}"),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        Ok(cmd)
    }

    /// Runs the plugin on node `i` as the runtime would, with the conflist's
    /// single plugin config.
    pub fn cni(&self, i: usize, command: &str, cid: &str, netns: &str, pod: &str) -> Result<Value> {
        let conf = self.plugin_conf(i)?;
        let mut child = self.cni_command(i, command, cid, netns, pod)?.spawn()?;
        if let Some(mut w) = child.stdin.take() {
            w.write_all(conf.to_string().as_bytes())?;
        }
        let out = child.wait_with_output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!("plugin {command} on node {i} failed: {stdout}");
        }
        Ok(if stdout.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&stdout)?
        })
    }

    pub fn pods(&self) -> Result<Vec<Pod>> {
        let v: Vec<Value> =
            serde_json::from_slice(&std::fs::read(self.spec.pods_file()).context("no lab is up")?)?;
        v.iter()
            .map(|p| {
                Ok(Pod {
                    node: p["node"].as_u64().context("node")? as usize,
                    index: p["index"].as_u64().context("index")? as usize,
                    ns: p["ns"].as_str().context("ns")?.to_string(),
                    ip: p["ip"].as_str().context("ip")?.parse()?,
                })
            })
            .collect()
    }

    /// Connectivity matrix: every pod and node to every pod, by ping, a TCP
    /// round trip and a bulk echo over the same connection. Returns the
    /// printable table and the number of failed cells.
    pub fn matrix(&self) -> Result<(String, usize)> {
        let run = self.run_matrix(false)?;
        Ok((run.table, run.failed))
    }

    /// [`Lab::matrix`], with every node's counters read before it, after
    /// the pod rows and after the node rows, so the pod-to-pod cells get a
    /// fast share of their own (see [`Lab::datapath_report`]).
    pub fn matrix_counted(&self) -> Result<MatrixRun> {
        self.run_matrix(true)
    }

    fn run_matrix(&self, counted: bool) -> Result<MatrixRun> {
        const CELL: usize = 16;
        let pods = self.pods()?;
        let pod_rows: Vec<(String, String)> =
            pods.iter().map(|p| (pod_label(p), p.ns.clone())).collect();
        let node_rows: Vec<(String, String)> = (1..=self.spec.nodes)
            .map(|i| (format!("node{i}"), self.spec.node_name(i)))
            .collect();
        let mut run = MatrixRun::default();
        let _ = write!(run.table, "{:<8}", "from\\to");
        for p in &pods {
            let _ = write!(run.table, "{:>CELL$}", pod_label(p));
        }
        run.table.push('\n');
        let lab = self.spec.bins.lab.to_string_lossy();
        let bulk = MATRIX_BULK_BYTES.to_string();
        if counted {
            run.counters.push(self.all_counters());
        }
        for rows in [&pod_rows, &node_rows] {
            for (label, ns) in rows {
                check_interrupted()?;
                let _ = write!(run.table, "{label:<8}");
                for p in &pods {
                    if *ns == p.ns {
                        let _ = write!(run.table, "{:>CELL$}", "-");
                        continue;
                    }
                    let ping =
                        ns_exec(ns, "ping", &["-c", "1", "-W", "1", &p.ip.to_string()]).is_ok();
                    let target = format!("{}:{ECHO_PORT}", p.ip);
                    let probe = Command::new("ip")
                        .args(["netns", "exec", ns, &lab, "tcp-probe", &target])
                        .args(["--bulk", &bulk])
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .status()
                        .with_context(|| format!("running {lab} tcp-probe in {ns}"))?;
                    let (tcp, transfer) = match probe.code() {
                        Some(0) => ("tcp", "bulk"),
                        Some(PROBE_BULK_FAILED) => ("tcp", "BULK!"),
                        // The round trip failed: no transfer was tried.
                        _ => ("TCP!", "-"),
                    };
                    if !ping || probe.code() != Some(0) {
                        run.failed += 1;
                    }
                    let cell = format!("{}/{tcp}/{transfer}", if ping { "ping" } else { "PING!" });
                    let _ = write!(run.table, "{cell:>CELL$}");
                }
                run.table.push('\n');
            }
            if counted {
                run.counters.push(self.all_counters());
            }
        }
        Ok(run)
    }

    /// Per node, after [`Lab::matrix_counted`]: the datapath its agent runs
    /// and the share of the pod packets its programs saw that the fast path
    /// forwarded, for the pod-to-pod cells and for all cells.
    pub fn datapath_report(&self, run: &MatrixRun) -> String {
        let mut out = format!(
            "datapath per node, and the fast share: of the pod packets the node's programs saw \
             during the matrix (as the programs count them: a GSO batch of segments is one \
             packet, and a packet counts on each node whose program sees it; the node's own \
             underlay traffic is left out), those the fast path forwarded, and of those the \
             ones that still crossed vxlan.1. Pings and each connection's SYN and FIN take the \
             kernel path by design; each cell's {} KB echo is what the fast path can take. \
             Node rows add the nodes' own addresses, which are no pod's and stay on the kernel \
             path.\n",
            MATRIX_BULK_BYTES / 1024
        );
        let empty = Counters::new();
        let snap = |k: usize, i: usize| run.counters.get(k).and_then(|c| c.get(i - 1));
        for i in 1..=self.spec.nodes {
            let d = match self.datapath(i) {
                Ok(d @ NodeDatapath::Kernel(_)) => {
                    let _ = writeln!(
                        out,
                        "  {}: {d}: no tc program attached, every packet takes the kernel path",
                        self.spec.node_name(i)
                    );
                    continue;
                }
                Ok(d) => d.to_string(),
                Err(e) => format!("unknown ({e:#})"),
            };
            let share = |from: usize, to: usize| {
                PathShare::between(
                    snap(from, i).unwrap_or(&empty),
                    snap(to, i).unwrap_or(&empty),
                )
            };
            let pods = share(0, 1);
            let all = share(0, 2);
            let _ = writeln!(
                out,
                "  {}: {d}\n    pod rows: {}\n    all rows: {}",
                self.spec.node_name(i),
                pods.describe(),
                all.describe()
            );
        }
        out
    }

    /// Agent readiness and metrics address per node.
    pub fn status(&self) -> Result<String> {
        let s = &self.spec;
        let mut out = format!(
            "API fixture: http://{API_ADDR}:{API_PORT} (kubeconfig {})\n",
            s.kubeconfig().display()
        );
        for i in 1..=s.nodes {
            let url = format!("{}:{METRICS_PORT}", node_ip(i));
            let ready = ns_exec(
                &s.underlay_ns(),
                &s.bins.lab.to_string_lossy(),
                &["http-get", &url, "/readyz"],
            )
            .unwrap_or_else(|e| format!("unreachable: {e}"));
            out.push_str(&format!(
                "{}  underlay {}  metrics http://{url}/metrics  {}\n",
                s.node_name(i),
                node_ip(i),
                ready.trim()
            ));
        }
        for p in self.pods().unwrap_or_default() {
            out.push_str(&format!(
                "  pod {} on {}: {}\n",
                p.ns,
                s.node_name(p.node),
                p.ip
            ));
        }
        Ok(out)
    }

    fn agent_log_tails(&self) -> String {
        let mut out = String::from("agent logs:\n");
        for i in 1..=self.spec.nodes {
            if let Ok(log) = std::fs::read_to_string(self.spec.node_dir(i).join("agent.log")) {
                let tail: Vec<&str> = log.lines().rev().take(8).collect();
                out.push_str(&format!(
                    "--- node{i}\n{}\n",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                ));
            }
        }
        out
    }

    /// Removes every namespace, process and file of the lab; never fails.
    pub fn down(&mut self) {
        let s = &self.spec;
        for i in 1..=s.nodes {
            for j in 1..=s.pods {
                stop_pidfile(&s.node_dir(i).join(format!("pod{j}/echo.pid")));
                let _ = sh("ip", &["netns", "del", &s.pod_ns(i, j)]);
            }
            stop_pidfile(&s.node_dir(i).join("agent.pid"));
            let _ = sh("ip", &["netns", "del", &s.node_name(i)]);
        }
        // Dropping the in-process fixture stops it before its netns goes.
        self.api = None;
        stop_pidfile(&s.root.join("apiserver.pid"));
        let _ = sh("ip", &["netns", "del", &s.underlay_ns()]);
        // Pins go with the mount; programs and maps with their last user.
        let _ = Command::new("umount").arg(s.bpffs()).output();
        let _ = std::fs::remove_dir_all(&s.root);
    }
}

/// `mycni-lab echo-server PORT`: echoes every connection, forever.
pub fn echo_server(port: u16) -> Result<()> {
    let l = std::net::TcpListener::bind(("0.0.0.0", port))?;
    for conn in l.incoming() {
        let Ok(mut c) = conn else { continue };
        std::thread::spawn(move || {
            let mut buf = [0u8; 65536];
            while let Ok(n) = c.read(&mut buf) {
                if n == 0 || c.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        });
    }
    Ok(())
}

/// `mycni-lab tcp-probe`'s exit status when the round trip worked but the
/// bulk echo after it did not (an MTU or encapsulation problem, typically).
pub const PROBE_BULK_FAILED: i32 = 3;

/// Why a `tcp-probe` failed.
#[derive(Debug)]
pub enum ProbeError {
    /// No connection, or no round trip through it.
    RoundTrip(anyhow::Error),
    /// The round trip worked, the bulk echo after it did not.
    Bulk(anyhow::Error),
}

/// `mycni-lab tcp-probe IP:PORT [--bulk N]`: one round trip through the
/// echo server, then, with `bulk` > 0, `bulk` bytes echoed over the same
/// (by then established) connection.
pub fn tcp_probe(addr: &str, bulk: usize) -> std::result::Result<(), ProbeError> {
    let round_trip = || -> Result<TcpStream> {
        let addr: SocketAddr = addr.parse()?;
        let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        c.set_read_timeout(Some(Duration::from_secs(2)))?;
        c.write_all(b"mycni\n")?;
        let mut buf = [0u8; 6];
        c.read_exact(&mut buf)?;
        if &buf != b"mycni\n" {
            bail!("echo mismatch");
        }
        Ok(c)
    };
    let c = round_trip().map_err(ProbeError::RoundTrip)?;
    if bulk > 0 {
        echo_bulk(c, bulk).map_err(ProbeError::Bulk)?;
    }
    Ok(())
}

/// Byte `i` of a bulk echo: a pattern that is not periodic in any power of
/// two, so a reordered or repeated segment shows as a mismatch.
fn bulk_byte(i: usize) -> u8 {
    (i % 251) as u8
}

/// Sends `n` bytes and reads them back at the same time: written first and
/// read after, the echo server's writes would stall once every buffer on
/// the way is full, and both ends would wait on each other.
fn echo_bulk(mut c: TcpStream, n: usize) -> Result<()> {
    let mut w = c.try_clone()?;
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        let mut buf = vec![0u8; 64 * 1024];
        let mut sent = 0;
        while sent < n {
            let k = (n - sent).min(buf.len());
            for (j, b) in buf[..k].iter_mut().enumerate() {
                *b = bulk_byte(sent + j);
            }
            w.write_all(&buf[..k])?;
            sent += k;
        }
        Ok(())
    });
    let mut got = 0;
    let mut buf = vec![0u8; 64 * 1024];
    while got < n {
        let k = c
            .read(&mut buf)
            .with_context(|| format!("bulk echo: read after {got} of {n} bytes"))?;
        if k == 0 {
            bail!("bulk echo: connection closed after {got} of {n} bytes");
        }
        if let Some(j) = (0..k).find(|j| buf[*j] != bulk_byte(got + j)) {
            bail!("bulk echo: byte {} differs", got + j);
        }
        got += k;
    }
    writer
        .join()
        .map_err(|_| anyhow::anyhow!("bulk echo: writer thread panicked"))?
        .context("bulk echo: write")?;
    Ok(())
}

/// `mycni-lab http-get HOST:PORT PATH`: prints status line and body.
pub fn http_get(addr: &str, path: &str) -> Result<String> {
    let addr: SocketAddr = addr.parse()?;
    let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    c.set_read_timeout(Some(Duration::from_secs(2)))?;
    c.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )?;
    let mut s = String::new();
    c.read_to_string(&mut s)?;
    let status = s.lines().next().unwrap_or_default().to_string();
    let body = s.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
    Ok(format!("{status} {body}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_parse_from_the_metrics_page() {
        let m = "# TYPE mycni_datapath_packets_total counter\n\
                 mycni_datapath_packets_total{path=\"fast_encap\",fast=\"true\"} 120\n\
                 mycni_datapath_packets_total{path=\"kernel_tcp_control\",fast=\"false\"} 7\n\
                 mycni_datapath_bytes_total{path=\"fast_encap\",fast=\"true\"} 99999\n";
        let c = parse_counters(m);
        assert_eq!(c.len(), 2);
        assert_eq!(c["fast_encap"], 120);
        assert_eq!(c["kernel_tcp_control"], 7);
    }

    #[test]
    fn agent_flags_take_the_last_value_in_either_form() {
        let args: Vec<String> = [
            "run",
            "--tc-encap",
            "true",
            "--resync=1s",
            "--tc-encap=false",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        assert_eq!(flag_value(&args, "--tc-encap").as_deref(), Some("false"));
        assert_eq!(flag_value(&args, "--resync").as_deref(), Some("1s"));
        assert_eq!(flag_value(&args, "--datapath"), None);
    }

    #[test]
    fn the_kernel_paths_reason_comes_from_readyz() {
        let r = "HTTP/1.1 200 OK ready: overlay up, 2 peers; datapath kernel: this agent was built without the eBPF object (cargo xtask build-ebpf --release)\n";
        assert_eq!(
            kernel_reason(r),
            "this agent was built without the eBPF object (cargo xtask build-ebpf --release)"
        );
        assert!(kernel_reason("HTTP/1.1 503 x").contains("no reason"));
    }

    #[test]
    fn the_fast_share_counts_pod_traffic_only() {
        let c = |v: &[(&str, u64)]| -> Counters {
            v.iter().map(|(k, n)| (k.to_string(), *n)).collect()
        };
        let before = c(&[("fast_encap", 100), ("kernel_underlay_other", 5)]);
        let after = c(&[
            ("fast_encap", 190),
            ("fast_tc_decap", 0),
            ("fast_vxlan_mtu", 10),
            ("kernel_tcp_control", 20),
            ("kernel_underlay_other", 500),
            ("some_future_path", 10),
        ]);
        let s = PathShare::between(&before, &after);
        // 90 + 10 fast, 20 + 10 kernel; the underlay's own traffic left out.
        assert_eq!((s.pod, s.fast, s.crossed_vxlan), (130, 100, 10));
        assert_eq!(s.kernel.len(), 2);
        assert_eq!(s.fast_pct().map(|p| (p * 10.0).round()), Some(769.0));
        assert_eq!(s.crossed_pct(), Some(10.0));
        let d = s.describe();
        assert!(d.starts_with("76.9% fast of 130 pod packets, 10.0% of those through vxlan.1; kernel: kernel_tcp_control 20"), "{d}");
        assert_eq!(
            PathShare::default().describe(),
            "the programs saw no pod packets"
        );
        assert_eq!(
            NodeDatapath::Kernel("--datapath kernel".into()).to_string(),
            "kernel (--datapath kernel)"
        );
    }
}
