//! `cargo xtask lab bench`: the datapath benchmarks side by side, in one run.
//!
//! Six variants, node1 -> node2:
//! - `direct veth`: two namespaces joined by one veth pair (MTU 1450, like
//!   the pods), the physical limit of this machine;
//! - `underlay (node->node)`: node1's namespace -> node2's host address
//!   (192.168.77.12) over the lab's underlay (node veth -> bridge -> node
//!   veth, MTU 1500), no overlay and no pods: the floor of any cross-node
//!   path in the lab;
//! - `overlay (node->node)`: node1's namespace -> node2's vxlan.1 address
//!   (the first address of its podCIDR, 10.244.2.0/32) through node1's agent
//!   route for that podCIDR: the underlay plus the kernel's VXLAN encap and
//!   decap, the floor of any path through vxlan.1;
//! - `kernel path`: node1's pod -> node2's pod with `--datapath kernel` (pod
//!   -> host veth -> routing and netfilter -> vxlan.1 -> underlay -> vxlan.1
//!   -> routing -> pod);
//! - `fast path via vxlan.1`: the same pods with `--datapath ebpf
//!   --tc-encap false` (established flows redirected around routing and
//!   netfilter into vxlan.1, which encapsulates; datapath v1);
//! - `fast path (tc encap)`: the same with `--tc-encap true` (the programs
//!   encapsulate and send out of the underlay themselves, and decapsulate
//!   at the underlay's ingress: vxlan.1 is skipped both ways; datapath v2).
//!
//! The two node -> node references run while the agents run the kernel
//! datapath, so no tc program sees their packets (with the fast path on,
//! vxlan.1's ingress program would look at the overlay's and leave them to
//! the kernel).
//!
//! The pod variants also run with a kube-proxy-sized iptables ruleset on
//! every node, and with a synthetic one (N filter FORWARD rules that never
//! match), because kube-proxy's rules mostly cost on a flow's first packet;
//! the direct veth, the node -> node references and the fast path via
//! vxlan.1 run without rules.
//! Runs interleave the variants so machine noise hits all of them alike; the
//! table shows medians over runs with their min-max, ratios against the
//! issue's targets, and, for the fast columns, from the programs' counters,
//! the share of pod packets fast-pathed and of those the share that still
//! crossed vxlan.1.
//!
//! The rulesets are pure functions of their size, tested without root; the
//! rest drives processes in the lab's namespaces.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::{Bins, Counters, Lab, PathShare, Spec, catch_interrupts, check_interrupted, node_ip};
use mycni_testkit::sh;

/// Namespace prefix and state directory: distinct from the CLI lab
/// (`mycni`, /run/mycni-lab), so a bench never touches a lab someone is using.
pub const PREFIX: &str = "mycnib";
pub const ROOT: &str = "/run/mycni-bench-lab";
/// The pods' cluster CIDR, which kube-proxy's masquerade rule excludes.
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";

const SOCKPERF_PORT: u16 = 11111;
const IPERF_PORT: u16 = 5201;
/// UDP payload of the small-packet measure.
const UDP_LEN: u64 = 64;
/// Seconds of the UDP test left out of its figures. Conntrack marks a UDP
/// flow assured only once it has seen both directions for 2 s, and the fast
/// path takes UDP only when assured: without this, a short test would
/// measure mostly the kernel path under the fast path's name.
const UDP_OMIT: u64 = 2;
/// The direct-veth variant's namespaces and addresses.
const VETH_A: &str = "mycnib-veth-a";
const VETH_B: &str = "mycnib-veth-b";
const VETH_A_IP: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
const VETH_B_IP: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 2);
const POD_MTU: &str = "1450";
/// The agents' VXLAN device (mycni-agent's `--vxlan-name` default).
const VXLAN_DEV: &str = "vxlan.1";

/// Runs by default: five give a median that one slow run cannot move and a
/// min-max worth reading (see `Options::runs`).
pub const DEFAULT_RUNS: usize = 5;
/// Seconds per measure by default. sockperf's p50 and p99 settle within a
/// second at these rates and iperf3's after its first; more runs buy more
/// steadiness than longer ones, at the same total.
pub const DEFAULT_SECONDS: u64 = 4;

#[derive(Debug, Clone)]
pub struct Options {
    /// Interleaved runs of every variant; the table shows medians and min-max.
    pub runs: usize,
    /// Seconds per measure (sockperf, iperf3 TCP, iperf3 UDP).
    pub seconds: u64,
    /// Services in the kube-proxy ruleset (2 endpoints each).
    pub services: usize,
    /// Non-matching filter FORWARD rules in the synthetic ruleset.
    pub synthetic_rules: usize,
    /// CPU both sockperf ends are pinned to; None leaves them to the scheduler.
    pub pin_cpu: Option<usize>,
    /// Where the markdown table goes besides stdout.
    pub out: Option<PathBuf>,
}

// ------------------------------------------------------------------ rulesets

/// A ruleset to install with `iptables-restore` in every node namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rules {
    None,
    KubeProxy,
    Synthetic,
}

impl Rules {
    fn label(self, o: &Options) -> String {
        match self {
            Rules::None => "none".into(),
            Rules::KubeProxy => format!("kube-proxy, {} svc", o.services),
            Rules::Synthetic => format!("synthetic, {} FORWARD", o.synthetic_rules),
        }
    }
}

/// A kube-proxy chain suffix: 16 characters of base32 like kube-proxy's
/// (which hashes the service port name with SHA-256); here a fixed mix of
/// the indices, so the ruleset is deterministic.
fn chain_id(kind: u64, service: usize, endpoint: usize) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut x = (kind << 56) ^ ((service as u64) << 8) ^ endpoint as u64;
    let mut out = String::with_capacity(16);
    for _ in 0..2 {
        // splitmix64
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        for k in 0..8 {
            out.push(ALPHABET[((z >> (5 * k)) & 31) as usize] as char);
        }
    }
    out
}

/// Service `k`'s ClusterIP: 10.96.0.10 upwards, never a pod address.
pub fn cluster_ip(k: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 10)) + k as u32)
}

/// What kube-proxy in iptables mode (1.28-style) writes for `services`
/// ClusterIP Services with `endpoints` ready endpoints each: nat
/// KUBE-SERVICES with one rule per ClusterIP:port jumping to a KUBE-SVC-*
/// chain, which masquerade-marks traffic from outside the cluster CIDR and
/// picks a KUBE-SEP-* chain with `statistic --mode random`; each KUBE-SEP-*
/// marks hairpin traffic and DNATs. Filter: KUBE-FORWARD (drop INVALID,
/// accept marked and established), the NEW-only service, external-service
/// and load-balancer-firewall jumps, KUBE-NODEPORTS and KUBE-FIREWALL.
pub fn kube_proxy_ruleset(services: usize, endpoints: usize) -> String {
    let mut s = String::new();
    let w = &mut s;
    // writeln! into a String cannot fail.
    let _ = writeln!(w, "*filter");
    for c in [
        "KUBE-EXTERNAL-SERVICES",
        "KUBE-FIREWALL",
        "KUBE-FORWARD",
        "KUBE-KUBELET-CANARY",
        "KUBE-NODEPORTS",
        "KUBE-PROXY-CANARY",
        "KUBE-PROXY-FIREWALL",
        "KUBE-SERVICES",
    ] {
        let _ = writeln!(w, ":{c} - [0:0]");
    }
    for r in [
        "-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL",
        "-A INPUT -m comment --comment \"kubernetes health check service ports\" -j KUBE-NODEPORTS",
        "-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES",
        "-A INPUT -j KUBE-FIREWALL",
        "-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL",
        "-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD",
        "-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
        "-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES",
        "-A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL",
        "-A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
        "-A OUTPUT -j KUBE-FIREWALL",
        "-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment \"block incoming localnet connections\" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP",
        "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP",
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x4000/0x4000 -j ACCEPT",
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
    ] {
        let _ = writeln!(w, "{r}");
    }
    let _ = writeln!(w, "COMMIT");

    let _ = writeln!(w, "*nat");
    for c in [
        "KUBE-MARK-MASQ",
        "KUBE-NODEPORTS",
        "KUBE-POSTROUTING",
        "KUBE-SERVICES",
    ] {
        let _ = writeln!(w, ":{c} - [0:0]");
    }
    for k in 0..services {
        let _ = writeln!(w, ":KUBE-SVC-{} - [0:0]", chain_id(1, k, 0));
        for e in 0..endpoints {
            let _ = writeln!(w, ":KUBE-SEP-{} - [0:0]", chain_id(2, k, e));
        }
    }
    for r in [
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
        "-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
        "-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING",
        "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000",
        "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
        "-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0",
        "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully",
    ] {
        let _ = writeln!(w, "{r}");
    }
    for k in 0..services {
        let ip = cluster_ip(k);
        let port = if k % 2 == 0 { 80 } else { 443 };
        let target = 8000 + (k % 1000);
        let name = format!("bench/svc-{k}:web");
        let svc = chain_id(1, k, 0);
        let _ = writeln!(
            w,
            "-A KUBE-SERVICES -d {ip}/32 -p tcp -m comment --comment \"{name} cluster IP\" -m tcp --dport {port} -j KUBE-SVC-{svc}"
        );
        let _ = writeln!(
            w,
            "-A KUBE-SVC-{svc} ! -s {CLUSTER_CIDR} -d {ip}/32 -p tcp -m comment --comment \"{name} cluster IP\" -m tcp --dport {port} -j KUBE-MARK-MASQ"
        );
        for e in 0..endpoints {
            // Endpoints spread over the nodes' podCIDRs, away from the
            // low addresses the lab's pods get.
            let ep = Ipv4Addr::new(10, 244, 1 + (e % 2) as u8, 100 + ((k + e) % 150) as u8);
            let sep = chain_id(2, k, e);
            let left = endpoints - e;
            if left > 1 {
                let _ = writeln!(
                    w,
                    "-A KUBE-SVC-{svc} -m comment --comment \"{name} -> {ep}:{target}\" -m statistic --mode random --probability {:.11} -j KUBE-SEP-{sep}",
                    1.0 / left as f64
                );
            } else {
                let _ = writeln!(
                    w,
                    "-A KUBE-SVC-{svc} -m comment --comment \"{name} -> {ep}:{target}\" -j KUBE-SEP-{sep}"
                );
            }
            let _ = writeln!(
                w,
                "-A KUBE-SEP-{sep} -s {ep}/32 -m comment --comment \"{name}\" -j KUBE-MARK-MASQ"
            );
            let _ = writeln!(
                w,
                "-A KUBE-SEP-{sep} -p tcp -m comment --comment \"{name}\" -m tcp -j DNAT --to-destination {ep}:{target}"
            );
        }
    }
    let _ = writeln!(
        w,
        "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"
    );
    let _ = writeln!(w, "COMMIT");
    s
}

/// Synthetic: `n` filter FORWARD rules that never match pod-to-pod
/// traffic (per-ClusterIP port filters), so every forwarded packet walks
/// all of them; the kind of per-packet cost kube-proxy's rules do not have.
pub fn synthetic_ruleset(n: usize) -> String {
    let mut s = String::from("*filter\n");
    for k in 0..n {
        let _ = writeln!(
            s,
            "-A FORWARD -d {}/32 -p tcp -m comment --comment \"mycni-bench synthetic {k}\" -m tcp --dport 80 -j DROP",
            cluster_ip(k)
        );
    }
    s.push_str("COMMIT\n");
    s
}

/// Rules (`-A` lines) in an iptables-restore file.
pub fn rule_count(ruleset: &str) -> usize {
    ruleset.lines().filter(|l| l.starts_with("-A ")).count()
}

fn ns_cmd(ns: &str, program: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, program]);
    c
}

fn nft_tables(ns: &str) -> Result<Vec<String>> {
    let out = sh("ip", &["netns", "exec", ns, "nft", "list", "tables"])?;
    Ok(out
        .lines()
        .filter_map(|l| l.strip_prefix("table "))
        .map(|t| t.trim().to_string())
        .collect())
}

/// A ruleset installed in every node namespace; removing it deletes the
/// iptables-nft tables it created (the agent's own `ip mycni` table stays).
struct Installed {
    /// (node namespace, tables this install created)
    nodes: Vec<(String, Vec<String>)>,
}

impl Installed {
    fn install(node_namespaces: &[String], ruleset: &str) -> Result<(Installed, Duration)> {
        let mut inst = Installed { nodes: vec![] };
        let start = Instant::now();
        for ns in node_namespaces {
            let before = nft_tables(ns)?;
            for t in ["ip nat", "ip filter"] {
                if before.iter().any(|b| b == t) {
                    bail!("{ns} already has table {t}: the bench only adds rules to clean nodes");
                }
            }
            // Record before installing: a half-applied restore is removed too.
            inst.nodes.push((ns.clone(), vec![]));
            let mut child = ns_cmd(ns, "iptables-restore")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .context("running iptables-restore (is iptables installed?)")?;
            if let Some(mut w) = child.stdin.take() {
                w.write_all(ruleset.as_bytes())?;
            }
            let out = child.wait_with_output()?;
            let after = nft_tables(ns)?;
            if let Some(last) = inst.nodes.last_mut() {
                last.1 = after.into_iter().filter(|t| !before.contains(t)).collect();
            }
            if !out.status.success() {
                let err = String::from_utf8_lossy(&out.stderr).into_owned();
                inst.remove();
                bail!("iptables-restore in {ns}: {err}");
            }
        }
        Ok((inst, start.elapsed()))
    }

    fn remove(&mut self) {
        for (ns, tables) in self.nodes.drain(..) {
            for t in tables {
                let mut args = vec!["netns", "exec", &ns, "nft", "delete", "table"];
                args.extend(t.split_whitespace());
                if let Err(e) = sh("ip", &args) {
                    eprintln!("bench: removing table {t} in {ns}: {e:#}");
                }
            }
        }
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        self.remove();
    }
}

// ----------------------------------------------------------------- processes

/// A process started in a namespace; killed and reaped on drop.
struct Proc {
    child: Child,
    what: String,
    log: PathBuf,
}

impl Proc {
    fn spawn(ns: &str, argv: &[String], log: &Path) -> Result<Proc> {
        let out =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .args(argv)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {} in {ns}", argv.join(" ")))?;
        Ok(Proc {
            child,
            what: format!("{} (in {ns})", argv.join(" ")),
            log: log.to_path_buf(),
        })
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the process to exit; kills it after `timeout` or on an
    /// interrupt. Returns its output; a non-zero exit is an error.
    fn finish(mut self, timeout: Duration) -> Result<String> {
        let start = Instant::now();
        loop {
            // First: Ctrl-C reaches the measuring tools too, and their
            // failure would hide why they failed.
            check_interrupted()?;
            if let Some(status) = self.child.try_wait()? {
                let out = self.output();
                if !status.success() {
                    bail!("`{}` failed ({status}): {}", self.what, tail(&out, 15));
                }
                return Ok(out);
            }
            if start.elapsed() > timeout {
                bail!(
                    "`{}` still running after {timeout:?}: {}",
                    self.what,
                    tail(&self.output(), 15)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.running() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Starts a server and waits until it listens on TCP `port`.
fn server(ns: &str, argv: &[String], port: u16, log: &Path) -> Result<Proc> {
    let mut p = Proc::spawn(ns, argv, log)?;
    let start = Instant::now();
    let filter = format!("sport = :{port}");
    loop {
        let listening = sh("ip", &["netns", "exec", ns, "ss", "-Hltn", &filter])
            .map(|o| !o.trim().is_empty())
            .unwrap_or(false);
        if listening {
            return Ok(p);
        }
        check_interrupted()?;
        if !p.running() {
            bail!("`{}` exited: {}", p.what, tail(&p.output(), 15));
        }
        if start.elapsed() > Duration::from_secs(10) {
            bail!("`{}` does not listen on {port}", p.what);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn argv(prefix: &[String], rest: &[&str]) -> Vec<String> {
    prefix
        .iter()
        .cloned()
        .chain(rest.iter().map(|s| s.to_string()))
        .collect()
}

// -------------------------------------------------------------- measurement

/// One run's figures for one variant.
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    /// One-way latency (sockperf's RTT/2), microseconds.
    p50_us: f64,
    p99_us: f64,
    stream_gbps: f64,
    /// UDP 64-byte datagrams per second the receiver got, thousands.
    udp_kpps: f64,
    udp_loss_pct: f64,
}

/// Client namespace -> server namespace and address.
struct Pair {
    client: String,
    server: String,
    ip: Ipv4Addr,
}

fn sockperf_percentile(out: &str, p: &str) -> Result<f64> {
    let key = format!("percentile {p} =");
    out.lines()
        .find_map(|l| l.split_once(&key).map(|(_, v)| v.trim().parse::<f64>()))
        .with_context(|| format!("no `{key}` in sockperf output: {}", tail(out, 20)))?
        .context("sockperf percentile")
}

fn iperf_json(out: &str) -> Result<Value> {
    let v: Value = serde_json::from_str(out)
        .with_context(|| format!("iperf3 -J output is not JSON: {}", tail(out, 10)))?;
    if let Some(e) = v.get("error").and_then(Value::as_str) {
        bail!("iperf3: {e}");
    }
    Ok(v)
}

fn measure(pair: &Pair, o: &Options, logs: &Path) -> Result<Sample> {
    let secs = o.seconds.to_string();
    let ip = pair.ip.to_string();
    let limit = Duration::from_secs(o.seconds + UDP_OMIT + 20);
    let pin: Vec<String> = match o.pin_cpu {
        Some(c) => vec!["taskset".into(), "-c".into(), c.to_string()],
        None => vec![],
    };
    let mut s = Sample::default();

    // Latency: TCP ping-pong, 64-byte messages.
    check_interrupted()?;
    let sp = SOCKPERF_PORT.to_string();
    let srv = server(
        &pair.server,
        &argv(&pin, &["sockperf", "sr", "--tcp", "-i", &ip, "-p", &sp]),
        SOCKPERF_PORT,
        &logs.join("sockperf-server.log"),
    )?;
    let out = Proc::spawn(
        &pair.client,
        &argv(
            &pin,
            &[
                "sockperf",
                "ping-pong",
                "--tcp",
                "-i",
                &ip,
                "-p",
                &sp,
                "-t",
                &secs,
                "-m",
                "64",
            ],
        ),
        &logs.join("sockperf-client.log"),
    )?
    .finish(limit)?;
    drop(srv);
    s.p50_us = sockperf_percentile(&out, "50.000")?;
    s.p99_us = sockperf_percentile(&out, "99.000")?;

    // Stream: one TCP flow, the receiver's rate.
    check_interrupted()?;
    let ip_port = IPERF_PORT.to_string();
    let iperf_server = |log: &str| {
        server(
            &pair.server,
            &argv(&[], &["iperf3", "-s", "-1", "-p", &ip_port]),
            IPERF_PORT,
            &logs.join(log),
        )
    };
    let iperf_client = |extra: &[&str], log: &str| -> Result<Value> {
        let mut a = vec![
            "iperf3",
            "-c",
            &ip,
            "-p",
            &ip_port,
            "-t",
            &secs,
            "-J",
            "--connect-timeout",
            "3000",
        ];
        a.extend_from_slice(extra);
        let out = Proc::spawn(&pair.client, &argv(&[], &a), &logs.join(log))?.finish(limit)?;
        iperf_json(&out)
    };
    let srv = iperf_server("iperf-tcp-server.log")?;
    let v = iperf_client(&[], "iperf-tcp-client.log")?;
    srv.finish(Duration::from_secs(5))?;
    s.stream_gbps = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .context("iperf3 TCP: no end.sum_received.bits_per_second")?
        / 1e9;

    // Small packets: UDP, 64-byte payload, unlimited send rate; the figure
    // is what the receiver got (sum_received counts received bytes).
    check_interrupted()?;
    let srv = iperf_server("iperf-udp-server.log")?;
    let len = UDP_LEN.to_string();
    let omit = UDP_OMIT.to_string();
    let v = iperf_client(
        &["-u", "-l", &len, "-b", "0", "-O", &omit],
        "iperf-udp-client.log",
    )?;
    srv.finish(Duration::from_secs(5))?;
    let rx = &v["end"]["sum_received"];
    let bytes = rx["bytes"]
        .as_f64()
        .context("iperf3 UDP: no end.sum_received.bytes")?;
    let seconds = rx["seconds"]
        .as_f64()
        .filter(|s| *s > 0.0)
        .context("iperf3 UDP: no end.sum_received.seconds")?;
    s.udp_kpps = bytes / UDP_LEN as f64 / seconds / 1e3;
    // From bytes, not iperf3's lost_packets: with --omit, iperf3 also
    // counts the omitted seconds' datagrams as lost.
    let sent = v["end"]["sum_sent"]["bytes"].as_f64().unwrap_or(0.0);
    s.udp_loss_pct = if sent > 0.0 {
        (100.0 * (1.0 - bytes / sent)).max(0.0)
    } else {
        0.0
    };
    Ok(s)
}

// ---------------------------------------------------------------- variants

/// What one column measures; the order is the table's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Variant {
    Direct,
    Underlay,
    Overlay,
    Kernel,
    FastVxlan,
    Fast,
}

/// The agents' datapath flags while a lab variant runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Agents {
    /// `--datapath kernel`: no tc program attached anywhere.
    Kernel,
    /// `--datapath ebpf --tc-encap <tc_encap>`.
    Fast { tc_encap: bool },
}

impl Variant {
    const ALL: [Variant; 6] = [
        Variant::Direct,
        Variant::Underlay,
        Variant::Overlay,
        Variant::Kernel,
        Variant::FastVxlan,
        Variant::Fast,
    ];

    fn label(self) -> &'static str {
        match self {
            Variant::Direct => "direct veth",
            Variant::Underlay => "underlay (node->node)",
            Variant::Overlay => "overlay (node->node)",
            Variant::Kernel => "kernel path",
            Variant::FastVxlan => "fast path via vxlan.1",
            Variant::Fast => "fast path (tc encap)",
        }
    }

    /// The agents' datapath while this variant runs; None: not the lab.
    fn agents(self) -> Option<Agents> {
        match self {
            Variant::Direct => None,
            Variant::Fast => Some(Agents::Fast { tc_encap: true }),
            Variant::FastVxlan => Some(Agents::Fast { tc_encap: false }),
            // The references with no tc program attached anywhere.
            Variant::Underlay | Variant::Overlay | Variant::Kernel => Some(Agents::Kernel),
        }
    }

    fn is_fast(self) -> bool {
        matches!(self.agents(), Some(Agents::Fast { .. }))
    }

    /// The node rulesets this variant runs with: the pod rulesets are
    /// about forwarding pod traffic, which the pod variants do; the fast
    /// path via vxlan.1 is a reference for the tc encap and runs without,
    /// which keeps a default bench near a quarter of an hour.
    fn rulesets(self) -> &'static [Rules] {
        match self {
            Variant::Kernel | Variant::Fast => &[Rules::None, Rules::KubeProxy, Rules::Synthetic],
            Variant::Direct | Variant::Underlay | Variant::Overlay | Variant::FastVxlan => {
                &[Rules::None]
            }
        }
    }
}

/// Node `i`'s VTEP address: the lab gives it podCIDR 10.244.i.0/24, and the
/// agent puts the podCIDR's network address on vxlan.1 as a /32.
fn vtep_address(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 244, i as u8, 0)
}

/// The first IPv4 address in `ip -4 -o addr show` output.
fn first_inet(out: &str) -> Option<Ipv4Addr> {
    let mut words = out.split_whitespace();
    words.find(|w| *w == "inet")?;
    words.next()?.split('/').next()?.parse().ok()
}

/// The output device in `ip route get` output.
fn route_dev(out: &str) -> Option<&str> {
    let mut words = out.split_whitespace();
    words.find(|w| *w == "dev")?;
    words.next()
}

/// Fails unless `ns` sends traffic for `ip` out of `dev`: a reference
/// measured over another path would be the floor of nothing.
fn check_route(ns: &str, ip: Ipv4Addr, dev: &str) -> Result<()> {
    let out = sh("ip", &["-n", ns, "-4", "route", "get", &ip.to_string()])?;
    if route_dev(&out) != Some(dev) {
        bail!("{ns} does not route {ip} out of {dev}: {}", out.trim());
    }
    Ok(())
}

/// The direct-veth variant's two namespaces; deleted on drop.
struct DirectVeth;

impl DirectVeth {
    fn up() -> Result<DirectVeth> {
        let d = DirectVeth;
        for ns in [VETH_A, VETH_B] {
            sh("ip", &["netns", "add", ns])?;
            sh("ip", &["-n", ns, "link", "set", "lo", "up"])?;
        }
        sh(
            "ip",
            &[
                "-n", VETH_A, "link", "add", "eth0", "mtu", POD_MTU, "type", "veth", "peer",
                "name", "eth0", "mtu", POD_MTU, "netns", VETH_B,
            ],
        )?;
        for (ns, ip) in [(VETH_A, VETH_A_IP), (VETH_B, VETH_B_IP)] {
            sh(
                "ip",
                &["-n", ns, "addr", "add", &format!("{ip}/30"), "dev", "eth0"],
            )?;
            sh("ip", &["-n", ns, "link", "set", "eth0", "up"])?;
        }
        Ok(d)
    }

    fn down() {
        for ns in [VETH_A, VETH_B] {
            if Path::new("/run/netns").join(ns).exists() {
                let _ = sh("ip", &["netns", "del", ns]);
            }
        }
    }
}

impl Drop for DirectVeth {
    fn drop(&mut self) {
        DirectVeth::down();
    }
}

/// The bench's lab; torn down on drop, whatever happened.
struct BenchLab(Lab);

impl Drop for BenchLab {
    fn drop(&mut self) {
        eprintln!("bench: tearing the lab down");
        self.0.down();
    }
}

/// Switches every agent to `agents` and waits until the fast path, if on,
/// has every pod and peer in its maps (the agent attaches new veths on a
/// pass). An agent that comes up on another datapath than asked (no eBPF
/// object, a load failure) fails the bench with its reason.
fn switch(lab: &mut Lab, agents: Agents) -> Result<()> {
    match agents {
        Agents::Kernel => {
            eprintln!("bench: agents -> --datapath kernel");
            lab.set_datapath("kernel")?;
        }
        Agents::Fast { tc_encap } => {
            eprintln!("bench: agents -> --datapath ebpf --tc-encap {tc_encap}");
            lab.set_fast_path(tc_encap)?;
            let s = lab.spec.clone();
            for i in 1..=s.nodes {
                let local = format!("mycni_datapath_entries{{map=\"local\"}} {}", s.pods);
                let remote = format!("mycni_datapath_entries{{map=\"remote\"}} {}", s.nodes - 1);
                crate::wait_for(
                    &format!("{} to fill its fast-path maps", s.node_name(i)),
                    Duration::from_secs(30),
                    || {
                        lab.metrics(i)
                            .map(|m| {
                                m.lines().any(|l| l == local) && m.lines().any(|l| l == remote)
                            })
                            .unwrap_or(false)
                    },
                )?;
            }
        }
    }
    Ok(())
}

#[derive(Default)]
struct Results {
    samples: BTreeMap<(Variant, Rules), Vec<Sample>>,
    /// What the programs saw during each fast variant's measurements,
    /// summed over nodes and runs.
    shares: BTreeMap<(Variant, Rules), PathShare>,
    /// The same per node, over all of a fast variant's measurements.
    node_shares: BTreeMap<Variant, Vec<PathShare>>,
    /// Packets the programs counted during the measurements with the agents
    /// on `--datapath kernel` (kernel path and node -> node): should stay 0.
    kernel_seen: u64,
    install_times: BTreeMap<Rules, Vec<Duration>>,
}

/// `mycni-lab bench`: brings up a 2-node x 1-pod lab and the direct veth,
/// measures everything, prints and writes the table, tears everything down.
pub fn run(bins: Bins, o: &Options) -> Result<()> {
    if o.runs == 0 || o.seconds == 0 {
        bail!("--runs and --seconds must be at least 1");
    }
    if o.services == 0 || o.services > 60_000 || o.synthetic_rules > 60_000 {
        bail!("--services must be 1..60000 and --synthetic-rules at most 60000 (10.96.0.0/16)");
    }
    catch_interrupts();
    let started = Instant::now();
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let spec = Spec {
        prefix: PREFIX.into(),
        nodes: 2,
        pods: 1,
        root: PathBuf::from(ROOT),
        bins,
        agent_args: vec!["--datapath".into(), "kernel".into()],
        in_process_api: false,
    };
    // Leftovers of an interrupted bench (its own prefix and root only).
    if spec.root.join("state").exists() {
        eprintln!("bench: removing the lab a previous bench left behind");
        Lab::attach(spec.clone()).down();
    }
    DirectVeth::down();

    eprintln!("bench: bringing up the 2-node lab ({PREFIX}-*, {ROOT})");
    let lab = BenchLab(Lab::up(spec)?);
    let veth = DirectVeth::up()?;
    let logs = PathBuf::from(ROOT).join("bench");
    std::fs::create_dir_all(&logs)?;
    let result = measure_all(lab, o, &logs);
    drop(veth);
    let results = result?;
    let load_after = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let report = render(
        &results,
        o,
        started.elapsed(),
        load_before.trim(),
        load_after.trim(),
    );
    print!("{report}");
    if let Some(out) = &o.out {
        if let Some(dir) = out.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(out, &report).with_context(|| format!("writing {}", out.display()))?;
        eprintln!("bench: wrote {}", out.display());
    }
    eprintln!(
        "bench: {} runs of {} s measures took {:.0} s in all",
        o.runs,
        o.seconds,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Takes the lab by value: it is torn down when this returns, before the
/// table is printed.
fn measure_all(mut lab: BenchLab, o: &Options, logs: &Path) -> Result<Results> {
    let pods = lab.0.pods()?;
    let dst = pods
        .iter()
        .find(|p| p.node == 2)
        .context("no pod on node 2")?;
    let src = pods
        .iter()
        .find(|p| p.node == 1)
        .context("no pod on node 1")?;
    let lab_pair = Pair {
        client: src.ns.clone(),
        server: dst.ns.clone(),
        ip: dst.ip,
    };
    let veth_pair = Pair {
        client: VETH_A.into(),
        server: VETH_B.into(),
        ip: VETH_B_IP,
    };
    let spec = lab.0.spec.clone();
    let (node1, node2) = (spec.node_name(1), spec.node_name(2));
    let underlay_pair = Pair {
        client: node1.clone(),
        server: node2.clone(),
        ip: node_ip(2),
    };
    // The server binds to node2's VTEP address: read it off vxlan.1, and
    // make sure it is the one the agent derives from node2's podCIDR.
    let out = sh(
        "ip",
        &["-n", &node2, "-4", "-o", "addr", "show", "dev", VXLAN_DEV],
    )?;
    let vtep = first_inet(&out)
        .with_context(|| format!("no IPv4 address on {VXLAN_DEV} in {node2}: {out}"))?;
    if vtep != vtep_address(2) {
        bail!(
            "{VXLAN_DEV} in {node2} has {vtep}, not {}: the podCIDR's first address",
            vtep_address(2)
        );
    }
    let overlay_pair = Pair {
        client: node1.clone(),
        server: node2.clone(),
        ip: vtep,
    };
    let nodes: Vec<String> = (1..=spec.nodes).map(|i| spec.node_name(i)).collect();
    let rulesets = [
        (Rules::KubeProxy, kube_proxy_ruleset(o.services, 2)),
        (Rules::Synthetic, synthetic_ruleset(o.synthetic_rules)),
    ];
    let mut r = Results::default();
    // The agents start with `--datapath kernel`.
    let mut current = Agents::Kernel;
    for run in 0..o.runs {
        // Alternate the lab variants' order: drift in machine load then
        // does not always favour the same one, and it saves restarts (two
        // datapath switches per run). The node -> node references sit next
        // to the kernel path, whose datapath they need.
        let order = if run % 2 == 0 {
            Variant::ALL
        } else {
            [
                Variant::Direct,
                Variant::Fast,
                Variant::FastVxlan,
                Variant::Kernel,
                Variant::Underlay,
                Variant::Overlay,
            ]
        };
        for v in order {
            let pair = match v {
                Variant::Direct => &veth_pair,
                Variant::Underlay => &underlay_pair,
                Variant::Overlay => &overlay_pair,
                Variant::Kernel | Variant::FastVxlan | Variant::Fast => &lab_pair,
            };
            if let Some(agents) = v.agents()
                && agents != current
            {
                switch(&mut lab.0, agents)?;
                current = agents;
            }
            match v {
                Variant::Underlay => check_route(&node1, underlay_pair.ip, "eth0")?,
                Variant::Overlay => check_route(&node1, overlay_pair.ip, VXLAN_DEV)?,
                _ => {}
            }
            for &rules in v.rulesets() {
                check_interrupted()?;
                if v.rulesets().len() > 1 {
                    eprintln!(
                        "bench: run {}/{}: {}, rules: {}",
                        run + 1,
                        o.runs,
                        v.label(),
                        rules.label(o)
                    );
                } else {
                    eprintln!("bench: run {}/{}: {}", run + 1, o.runs, v.label());
                }
                let installed = match rulesets.iter().find(|(k, _)| *k == rules) {
                    Some((_, text)) => {
                        let (inst, took) = Installed::install(&nodes, text)?;
                        r.install_times.entry(rules).or_default().push(took);
                        Some(inst)
                    }
                    None => None,
                };
                let lab_variant = v.agents().is_some();
                let before = if lab_variant {
                    lab.0.all_counters()
                } else {
                    vec![]
                };
                let s = measure(pair, o, logs)?;
                if lab_variant {
                    let after = lab.0.all_counters();
                    let per_node: Vec<PathShare> = before
                        .iter()
                        .zip(&after)
                        .map(|(b, a)| PathShare::between(b, a))
                        .collect();
                    if v.is_fast() {
                        let total = r.shares.entry((v, rules)).or_default();
                        for n in &per_node {
                            total.add(n);
                        }
                        let nodes = r.node_shares.entry(v).or_default();
                        nodes.resize(per_node.len(), PathShare::default());
                        for (acc, n) in nodes.iter_mut().zip(&per_node) {
                            acc.add(n);
                        }
                    } else {
                        r.kernel_seen += counted(&before, &after);
                    }
                }
                drop(installed);
                r.samples.entry((v, rules)).or_default().push(s);
            }
        }
    }
    Ok(r)
}

/// Every packet any program counted between `before` and `after`, the
/// node's own underlay traffic included.
fn counted(before: &[Counters], after: &[Counters]) -> u64 {
    before
        .iter()
        .zip(after)
        .flat_map(|(b, a)| {
            a.iter()
                .map(move |(k, n)| n.saturating_sub(b.get(k).copied().unwrap_or(0)))
        })
        .sum()
}

// -------------------------------------------------------------------- report

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Measure {
    P50,
    P99,
    Stream,
    Udp,
}

impl Measure {
    const ALL: [Measure; 4] = [Measure::P50, Measure::P99, Measure::Stream, Measure::Udp];
    fn label(self) -> &'static str {
        match self {
            Measure::P50 => "TCP latency p50 (us)",
            Measure::P99 => "TCP latency p99 (us)",
            Measure::Stream => "TCP stream (Gbit/s)",
            Measure::Udp => "UDP 64 B rx (kpps)",
        }
    }
    fn get(self, s: &Sample) -> f64 {
        match self {
            Measure::P50 => s.p50_us,
            Measure::P99 => s.p99_us,
            Measure::Stream => s.stream_gbps,
            Measure::Udp => s.udp_kpps,
        }
    }
    fn fmt(self, v: f64) -> String {
        if v.is_nan() {
            return "-".into();
        }
        match self {
            Measure::Stream => format!("{v:.2}"),
            _ => format!("{v:.1}"),
        }
    }
}

/// A ratio target of the issue.
#[derive(Clone, Copy)]
enum Target {
    AtMost(f64),
    AtLeast(f64),
}

impl Target {
    fn met(self, v: f64) -> bool {
        match self {
            Target::AtMost(t) => v <= t,
            Target::AtLeast(t) => v >= t,
        }
    }
}

impl Measure {
    /// fast/underlay: within 10% of the underlay on p50 latency, one TCP
    /// stream and the 64-byte UDP rate.
    fn underlay_target(self) -> Option<Target> {
        match self {
            Measure::P50 => Some(Target::AtMost(1.10)),
            Measure::Stream | Measure::Udp => Some(Target::AtLeast(0.90)),
            Measure::P99 => None,
        }
    }

    /// fast/kernel: the UDP rate at least 1.3x, one stream at least 1.1x
    /// the kernel path's.
    fn kernel_target(self) -> Option<Target> {
        match self {
            Measure::Udp => Some(Target::AtLeast(1.3)),
            Measure::Stream => Some(Target::AtLeast(1.1)),
            Measure::P50 | Measure::P99 => None,
        }
    }
}

fn ratio(v: f64, target: Option<Target>) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    match target {
        Some(t) => format!("{v:.2} {}", if t.met(v) { "ok" } else { "MISS" }),
        None => format!("{v:.2}"),
    }
}

/// The median with the min-max over runs, `19.5 (18.9–20.1)`; the value
/// alone for one run, `-` for none. The range is what says whether two
/// columns differ or only their noise does.
fn spread(m: Measure, v: &[f64]) -> String {
    if v.is_empty() {
        return "-".into();
    }
    let mid = m.fmt(median(v.to_vec()));
    if v.len() == 1 {
        return mid;
    }
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{mid} ({}–{})", m.fmt(lo), m.fmt(hi))
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |p| format!("{p:.1}"))
}

/// The paragraph under the table: what no datapath in this lab can go
/// below, and where the p50 figures (none, medians) put the targets.
fn floors(d: f64, u: f64, ov: f64, k: f64, fv: f64, f: f64) -> String {
    let mut s = String::from(
        "**Floors.** The two node->node columns are not datapaths but what every datapath \
         here is built on. Any cross-node path in this lab pays the underlay's hops (node1's \
         veth pair -> the underlay namespace's bridge -> node2's veth pair, where the direct \
         veth is one veth pair); a path through the kernel's VXLAN device also pays its \
         encapsulation on node1 (vxlan.1's transmit and a UDP send) and decapsulation on node2 \
         (the VXLAN socket's receive and a second pass up the stack): the overlay column. Both \
         fast paths skip routing and netfilter on both nodes and the pod-side veth hops; via \
         vxlan.1 they still pay the overlay, so the overlay is that column's floor. With tc \
         encap the programs put on and take off the outer headers themselves (from the pod's \
         veth straight out of the underlay device, from the underlay device straight into the \
         pod with bpf_redirect_peer), so that column's floor is the underlay plus the header \
         work. (The underlay's MTU is 1500, the pods' and vxlan.1's 1450.)",
    );
    if ![d, u, ov, k, fv, f]
        .iter()
        .all(|v| v.is_finite() && *v > 0.0)
    {
        s.push('\n');
        return s;
    }
    let _ = write!(
        s,
        " Here, p50 without rules, against its floor: the underlay {:+.1} us against the \
         direct veth, the overlay {:+.1} us against the underlay; the fast path with tc encap \
         {:+.1} us against the underlay, the fast path via vxlan.1 {:+.1} us against the \
         overlay, the kernel path {:+.1} us against the overlay (a negative figure is within \
         the runs' spread).",
        u - d,
        ov - u,
        f - u,
        fv - ov,
        k - ov
    );
    let need = 1.10 * u;
    let _ = writeln!(
        s,
        " fast/underlay <= 1.10 needs the tc-encap path at <= {need:.1} us ({:+.1} us over the \
         underlay){}.",
        need - u,
        if need < ov {
            format!(
                ", below the overlay ({ov:.1} us): no datapath through vxlan.1 can meet it, \
                 which is what the tc encap is for"
            )
        } else {
            String::new()
        }
    );
    s
}

fn render(r: &Results, o: &Options, took: Duration, load_before: &str, load_after: &str) -> String {
    let values = |v: Variant, rules: Rules, m: Measure| -> Vec<f64> {
        r.samples
            .get(&(v, rules))
            .map(|v| v.iter().map(|s| m.get(s)).collect())
            .unwrap_or_default()
    };
    let med = |v: Variant, rules: Rules, m: Measure| -> f64 { median(values(v, rules, m)) };
    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(w, "# mycni datapath bench (`cargo xtask lab bench`)\n");
    let _ = writeln!(
        w,
        "node1 -> node2: pod -> pod for the kernel and fast paths, namespace A -> B for the direct veth, \
         node namespace -> node namespace for the underlay (host addresses) and the overlay \
         (to node2's vxlan.1 address, agents on the kernel datapath). {} interleaved runs: \
         median of runs (min–max); {} s per measure; {:.0} s in all. Load average before: \
         {load_before}; after: {load_after}.\n",
        o.runs,
        o.seconds,
        took.as_secs_f64()
    );
    let pin = match o.pin_cpu {
        Some(c) => format!("both ends pinned to CPU {c}"),
        None => "not pinned".into(),
    };
    let _ = writeln!(
        w,
        "- latency: `sockperf ping-pong --tcp -m 64`, one-way = RTT/2 (sockperf's default, no `--full-rtt`), {pin};\n\
         - stream: `iperf3 -c` one TCP flow, receiver's Gbit/s;\n\
         - small packets: `iperf3 -u -l 64 -b 0 -O {UDP_OMIT}`, datagrams/s the receiver got (kpps), \
         without the first {UDP_OMIT} s (conntrack assures a UDP flow, which lets it onto the fast \
         path, after 2 s of two-way traffic). Per-packet cost is what the fast path removes, and \
         iperf3 reports the receiver's count (sockperf's throughput mode only the sender's); \
         loss in the per-run table is 1 - received/sent bytes;\n\
         - fast share: of the pod packets the programs on both nodes counted during that \
         column's measurements, those fast-pathed (as the programs count them: a GSO batch \
         is one packet, and a packet counts once per node whose program sees it; the nodes' \
         own underlay traffic is left out). It includes each connection's SYN and FIN and \
         the UDP test's first {UDP_OMIT} s, before conntrack assures the flow, all on the \
         kernel path by design. Via vxlan.1: of the fast-pathed ones, those that still \
         crossed vxlan.1 (handed to it, or decapsulated by it).\n"
    );
    let cols = [
        Variant::Direct,
        Variant::Underlay,
        Variant::Overlay,
        Variant::Kernel,
        Variant::FastVxlan,
        Variant::Fast,
    ];
    let ratio_cols = [
        "fast/underlay (p50 <= 1.10; stream, UDP >= 0.90)",
        "fast/kernel (stream >= 1.1, UDP >= 1.3)",
        "via vxlan.1/underlay",
        "via vxlan.1/kernel",
    ];
    let head: Vec<&str> = cols.iter().map(|v| v.label()).chain(ratio_cols).collect();
    let _ = writeln!(w, "| measure | node rules | {} |", head.join(" | "));
    let _ = writeln!(w, "|---|---|{}", "---|".repeat(head.len()));
    for rules in [Rules::None, Rules::KubeProxy, Rules::Synthetic] {
        for m in Measure::ALL {
            let u = med(Variant::Underlay, Rules::None, m);
            let k = med(Variant::Kernel, rules, m);
            let fv = med(Variant::FastVxlan, rules, m);
            let f = med(Variant::Fast, rules, m);
            let mut cells: Vec<String> = cols
                .iter()
                .map(|&v| {
                    if v.rulesets().contains(&rules) {
                        spread(m, &values(v, rules, m))
                    } else if matches!(v, Variant::Direct | Variant::Underlay) {
                        // Forwards no pod traffic: its one figure is the
                        // baseline of every rule row.
                        format!("({})", m.fmt(med(v, Rules::None, m)))
                    } else {
                        "-".into()
                    }
                })
                .collect();
            cells.extend([
                ratio(f / u, m.underlay_target()),
                ratio(f / k, m.kernel_target()),
                ratio(fv / u, None),
                ratio(fv / k, None),
            ]);
            let _ = writeln!(
                w,
                "| {} | {} | {} |",
                m.label(),
                rules.label(o),
                cells.join(" | ")
            );
        }
        for (label, get) in [
            (
                "fast share of pod packets (%)",
                PathShare::fast_pct as fn(&PathShare) -> Option<f64>,
            ),
            ("fast packets via vxlan.1 (%)", PathShare::crossed_pct),
        ] {
            let mut cells: Vec<String> = cols
                .iter()
                .map(|&v| {
                    if v.is_fast() && v.rulesets().contains(&rules) {
                        pct(r.shares.get(&(v, rules)).and_then(get))
                    } else {
                        String::new()
                    }
                })
                .collect();
            cells.extend(std::iter::repeat_n(String::new(), ratio_cols.len()));
            let _ = writeln!(
                w,
                "| {label} | {} | {} |",
                rules.label(o),
                cells.join(" | ")
            );
        }
    }
    let _ = writeln!(
        w,
        "\nThe direct veth and the underlay forward no pod traffic and run without rules: a value \
         in parentheses repeats that baseline, which fast/underlay divides by. The overlay and \
         the fast path via vxlan.1 run without rules only (-). Ratios are of medians.\n"
    );
    let p50 = |v: Variant| med(v, Rules::None, Measure::P50);
    let _ = writeln!(
        w,
        "{}",
        floors(
            p50(Variant::Direct),
            p50(Variant::Underlay),
            p50(Variant::Overlay),
            p50(Variant::Kernel),
            p50(Variant::FastVxlan),
            p50(Variant::Fast),
        )
    );

    let _ = writeln!(
        w,
        "## Rulesets (iptables-nft, installed in both node namespaces)\n"
    );
    let kp = kube_proxy_ruleset(o.services, 2);
    let syn = synthetic_ruleset(o.synthetic_rules);
    let took = |rules: Rules| -> String {
        r.install_times
            .get(&rules)
            .map(|v| {
                let ms: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1e3).collect();
                format!("{:.0} ms", median(ms))
            })
            .unwrap_or_else(|| "-".into())
    };
    let _ = writeln!(
        w,
        "- kube-proxy: {} Services x 2 endpoints, ClusterIPs 10.96.0.10 upwards: {} rules \
         (nat KUBE-SERVICES -> KUBE-SVC-* -> statistic-random KUBE-SEP-* DNAT, KUBE-MARK-MASQ, \
         KUBE-POSTROUTING; filter KUBE-FORWARD, KUBE-SERVICES, KUBE-EXTERNAL-SERVICES, \
         KUBE-NODEPORTS, KUBE-FIREWALL); install {} for both nodes. Its per-packet cost on an \
         established flow is KUBE-FORWARD's conntrack checks; the nat chains see only a flow's \
         first packet.",
        o.services,
        rule_count(&kp),
        took(Rules::KubeProxy)
    );
    let _ = writeln!(
        w,
        "- synthetic (not what kube-proxy does): {} filter FORWARD rules \
         `-d 10.96.x.y/32 -p tcp --dport 80 -j DROP` that never match pod traffic, so every \
         forwarded packet walks them all; install {} for both nodes.\n",
        rule_count(&syn),
        took(Rules::Synthetic)
    );

    let _ = writeln!(w, "## Per run\n");
    let _ = writeln!(
        w,
        "| variant | node rules | p50 us | p99 us | stream Gbit/s | UDP kpps (loss %) |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|---|");
    for ((variant, rules), v) in &r.samples {
        let col = |f: &dyn Fn(&Sample) -> String| -> String {
            v.iter().map(f).collect::<Vec<_>>().join(", ")
        };
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} |",
            variant.label(),
            rules.label(o),
            col(&|s| format!("{:.1}", s.p50_us)),
            col(&|s| format!("{:.1}", s.p99_us)),
            col(&|s| format!("{:.2}", s.stream_gbps)),
            col(&|s| format!("{:.1} ({:.0})", s.udp_kpps, s.udp_loss_pct)),
        );
    }

    let _ = writeln!(
        w,
        "\n## Fast-path counters (pod packets the tc programs saw, over each fast column's measurements)\n"
    );
    for (v, nodes) in &r.node_shares {
        for (i, share) in nodes.iter().enumerate() {
            let _ = writeln!(w, "- {}, node{}: {}", v.label(), i + 1, share.describe());
        }
    }
    let _ = writeln!(
        w,
        "- during the kernel-path and node->node measurements (agents on `--datapath kernel`) \
         the programs counted {} packets (0 = detached, as `--datapath kernel` promises).",
        r.kernel_seen
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_proxy_ruleset_has_kube_proxys_shape() {
        let r = kube_proxy_ruleset(100, 2);
        // Per service: KUBE-SERVICES jump, masquerade mark, 2 x (statistic
        // or final jump, hairpin mark, DNAT) = 8; plus 15 filter and 8 nat
        // fixed rules.
        assert_eq!(rule_count(&r), 100 * 8 + 15 + 8);
        assert_eq!(
            r.matches("--mode random --probability 0.50000000000")
                .count(),
            100
        );
        assert_eq!(r.matches("-j DNAT --to-destination 10.244.").count(), 200);
        assert!(r.contains("-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP"));
        assert_eq!(r.matches("COMMIT").count(), 2);
        // Every chain jumped to is declared.
        for l in r.lines().filter(|l| l.starts_with("-A ")) {
            if let Some(target) = l.split(" -j ").nth(1) {
                let chain = target.split_whitespace().next().expect("target");
                if chain.starts_with("KUBE-") {
                    assert!(r.contains(&format!(":{chain} - [0:0]")), "{chain}");
                }
            }
        }
    }

    #[test]
    fn chain_names_are_distinct_and_kube_proxy_like() {
        let r = kube_proxy_ruleset(2000, 2);
        let decl: Vec<&str> = r
            .lines()
            .filter(|l| l.starts_with(":KUBE-SVC-") || l.starts_with(":KUBE-SEP-"))
            .collect();
        assert_eq!(decl.len(), 2000 * 3);
        let set: std::collections::BTreeSet<&str> = decl.iter().copied().collect();
        assert_eq!(set.len(), decl.len());
        let id = chain_id(1, 7, 0);
        assert_eq!(id.len(), 16);
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_uppercase() || (b'2'..=b'7').contains(&b))
        );
        // iptables caps chain names at 28 characters.
        assert!(format!("KUBE-SEP-{id}").len() <= 28);
    }

    #[test]
    fn cluster_ips_stay_out_of_the_pod_cidr() {
        for k in [0, 1, 1999, 59_999] {
            let ip = cluster_ip(k).octets();
            assert_eq!((ip[0], ip[1]), (10, 96), "{k}");
        }
    }

    #[test]
    fn synthetic_ruleset_is_n_forward_rules() {
        let r = synthetic_ruleset(50);
        assert_eq!(rule_count(&r), 50);
        assert!(
            r.lines()
                .filter(|l| l.starts_with("-A "))
                .all(|l| l.starts_with("-A FORWARD -d 10.96."))
        );
    }

    #[test]
    fn sockperf_percentiles_parse() {
        let out = "sockperf: ---> percentile 99.000 =  413.916\nsockperf: ---> percentile 50.000 =   52.928\n";
        assert_eq!(sockperf_percentile(out, "50.000").expect("p50"), 52.928);
        assert_eq!(sockperf_percentile(out, "99.000").expect("p99"), 413.916);
        assert!(sockperf_percentile(out, "90.000").is_err());
    }

    #[test]
    fn ip_outputs_parse() {
        let addr = "7: vxlan.1    inet 10.244.2.0/32 scope global vxlan.1\\       valid_lft forever preferred_lft forever\n";
        assert_eq!(first_inet(addr), Some(vtep_address(2)));
        assert_eq!(first_inet(""), None);
        let get = "10.244.2.0 via 10.244.2.0 dev vxlan.1 src 10.244.1.0 uid 0 \n    cache \n";
        assert_eq!(route_dev(get), Some("vxlan.1"));
        let get = "192.168.77.12 dev eth0 src 192.168.77.11 uid 0 \n    cache \n";
        assert_eq!(route_dev(get), Some("eth0"));
        assert_eq!(route_dev("RTNETLINK answers: Network is unreachable"), None);
    }

    fn sample(p50_us: f64) -> Sample {
        Sample {
            p50_us,
            p99_us: 2.0 * p50_us,
            stream_gbps: 100.0 / p50_us,
            udp_kpps: 1000.0 / p50_us,
            udp_loss_pct: 0.0,
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
        assert!(header.ends_with("| via vxlan.1/underlay | via vxlan.1/kernel |"));
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
                "11.5", "15.1", "19.0", "22.7", "19.5", "16.0", "1.06 ok", "0.70", "1.29", "0.86"
            ]
        );
        // 15.1 / 16.0 of the underlay's stream and UDP rate, 22.7 / 16.0 of
        // the kernel path's.
        let stream = row(&report, "TCP stream (Gbit/s)", "none");
        assert_eq!(stream[8..10], ["0.94 ok", "1.42 ok"]);
        let udp = row(&report, "UDP 64 B rx (kpps)", "none");
        assert_eq!(udp[8..10], ["0.94 ok", "1.42 ok"]);
        // Rule rows: the direct veth and the underlay repeat their baseline,
        // the overlay and the fast path via vxlan.1 were not measured.
        let kp = row(&report, "TCP latency p50 (us)", "kube-proxy, 2000 svc");
        assert_eq!(
            kp[2..],
            [
                "(11.5)", "(15.1)", "-", "22.7", "-", "16.0", "1.06 ok", "0.70", "-", "-"
            ]
        );
        let share = row(&report, "fast share of pod packets (%)", "none");
        assert_eq!(share.len(), cells);
        assert_eq!(share[5..8], ["", "80.0", "90.0"]);
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
        assert_eq!(p50[8], "1.13 MISS");
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
        assert_eq!(p50[2..8], ["-", "-", "-", "-", "-", "19.5"]);
        assert_eq!(p50[8..], ["-", "-", "-", "-"]);
        assert!(report.contains("**Floors.**"));
        assert!(!report.contains("Here, p50"));
    }

    #[test]
    fn median_of_even_and_odd() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0]), 2.5);
        assert!(median(vec![]).is_nan());
    }
}
