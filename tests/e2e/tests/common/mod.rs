//! What the lab-based tests share: the binaries and a lab torn down on drop.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Node;
use mycni_e2e::bins;
use mycni_lab::{Lab, Spec, Stack};
use mycni_testkit::{in_netns, unique};

/// A lab that is torn down when the test ends, pass or fail.
pub struct TestLab(pub Lab);

impl Drop for TestLab {
    fn drop(&mut self) {
        self.0.down();
    }
}

/// A lab with the API fixture in this process and a 1 s resync.
#[allow(
    dead_code,
    reason = "not every test binary that includes common uses it"
)]
pub fn lab(nodes: usize, pods: usize) -> Result<TestLab> {
    lab_with(nodes, pods, &[])
}

/// [`lab`], with extra arguments for every agent; a `--resync` among them
/// replaces the 1 s (the agent refuses a flag given twice).
pub fn lab_with(nodes: usize, pods: usize, agent_args: &[&str]) -> Result<TestLab> {
    lab_stack(nodes, pods, Stack::Ipv4Only, agent_args)
}

/// [`lab_with`] with the Nodes' podCIDRs of `stack`'s families (the tests
/// above keep the IPv4-only lab they were written for).
#[allow(
    dead_code,
    reason = "not every test binary that includes common uses it"
)]
pub fn lab_stack(nodes: usize, pods: usize, stack: Stack, agent_args: &[&str]) -> Result<TestLab> {
    let b = bins();
    mycni_e2e::missing(&[&b.agent, &b.plugin, &b.lab, &b.apiserver])?;
    let prefix = unique("mycni-t-lab");
    let root = std::env::temp_dir().join(&prefix);
    Ok(TestLab(Lab::up(Spec {
        prefix,
        nodes,
        pods,
        root,
        bins: b,
        agent_args: ["--resync", "1s"]
            .iter()
            .filter(|_| !agent_args.contains(&"--resync"))
            .chain(agent_args)
            .map(|a| a.to_string())
            .collect(),
        in_process_api: true,
        stack,
        model: false,
    })?))
}

/// The upstream NetworkPolicy model (3 nodes x 3 dual-stack pods in
/// namespaces x, y, z), the API fixture in this process, namespaces
/// `<tag>...-*`.
#[allow(
    dead_code,
    reason = "not every test binary that includes common uses it"
)]
pub fn model_lab(tag: &str, agent_args: &[&str]) -> Result<TestLab> {
    let b = bins();
    mycni_e2e::missing(&[&b.agent, &b.plugin, &b.lab, &b.apiserver])?;
    let prefix = unique(tag);
    let root = std::env::temp_dir().join(&prefix);
    Ok(TestLab(Lab::up(Spec {
        prefix,
        nodes: 3,
        pods: 3,
        root,
        bins: b,
        agent_args: agent_args.iter().map(|a| a.to_string()).collect(),
        in_process_api: true,
        stack: Stack::Dual,
        model: true,
    })?))
}

/// A steady echo stream from the pod netns `ns` to `addr` until `stop`:
/// any reset or stall shows up as an error or as the longest gap between
/// round trips. Returns (round trips, longest gap).
#[allow(
    dead_code,
    reason = "not every test binary that includes common streams"
)]
pub fn echo_stream(
    ns: &str,
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Result<(u64, Duration)>> {
    let ns = ns.to_string();
    std::thread::spawn(move || -> Result<(u64, Duration)> {
        in_netns(&ns, move || -> Result<(u64, Duration)> {
            let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
            c.set_read_timeout(Some(Duration::from_secs(10)))?;
            let buf = [0x5au8; 1024];
            let mut back = [0u8; 1024];
            let (mut rounds, mut longest) = (0u64, Duration::ZERO);
            let mut last = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                c.write_all(&buf)?;
                c.read_exact(&mut back)?;
                anyhow::ensure!(back == buf, "corrupted echo");
                rounds += 1;
                longest = longest.max(last.elapsed());
                last = Instant::now();
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok((rounds, longest))
        })?
    })
}

/// Runs `cmd` inside the network namespace `ns`.
#[allow(
    dead_code,
    reason = "not every test binary that includes common uses it"
)]
pub fn ns_sh(ns: &str, cmd: &str, args: &[&str]) -> Result<String> {
    let mut full = vec!["netns", "exec", ns, cmd];
    full.extend_from_slice(args);
    mycni_testkit::sh("ip", &full)
}

/// How much counter `k` moved between two readings of a node's counters.
#[allow(
    dead_code,
    reason = "not every test binary that includes common uses it"
)]
pub fn delta(
    after: &std::collections::BTreeMap<String, u64>,
    before: &std::collections::BTreeMap<String, u64>,
    k: &str,
) -> u64 {
    after.get(k).copied().unwrap_or(0) - before.get(k).copied().unwrap_or(0)
}

/// The lab's IPv4 cluster range with an IPv6 range beside it, for
/// `--cluster-cidr` of a dual-stack agent.
#[allow(
    dead_code,
    reason = "not every test binary that includes common uses it"
)]
pub const CLUSTER_DUAL: &str = "10.244.0.0/16,fd00:10:244::/56";

/// Polls `f` every 50 ms until it says yes; how long that took.
#[allow(
    dead_code,
    reason = "not every test binary that includes common uses it"
)]
pub fn wait_until(
    what: &str,
    timeout: Duration,
    f: impl FnMut() -> Result<bool>,
) -> Result<Duration> {
    wait_every(what, timeout, Duration::from_millis(50), f)
}

/// [`wait_until`], polling every `poll`; the last error `f` returned is
/// part of the failure.
#[allow(
    dead_code,
    reason = "not every test binary that includes common uses it"
)]
pub fn wait_every(
    what: &str,
    timeout: Duration,
    poll: Duration,
    mut f: impl FnMut() -> Result<bool>,
) -> Result<Duration> {
    let start = Instant::now();
    let mut last = None;
    while start.elapsed() < timeout {
        match f() {
            Ok(true) => return Ok(start.elapsed()),
            Ok(false) => {}
            Err(e) => last = Some(e),
        }
        std::thread::sleep(poll);
    }
    anyhow::bail!("{what}: not within {timeout:?} (last error: {last:?})")
}

/// `spec.podCIDRs` as given, and `spec.podCIDR` its first, as the API
/// keeps them (it resets podCIDRs to a podCIDR that is not its first).
/// The real API allows this change only from none; the fixture's direct
/// update stands for a Node deleted and made again.
#[allow(
    dead_code,
    reason = "not every test binary that includes common uses it"
)]
pub fn set_pod_cidrs(n: &mut Node, cidrs: &[&str]) {
    let spec = n.spec.get_or_insert_default();
    spec.pod_cidr = cidrs.first().map(|c| c.to_string());
    spec.pod_cidrs = Some(cidrs.iter().map(|c| c.to_string()).collect());
}

/// A peer Node with `spec.podCIDRs` as given and the VTEP MAC and host IP
/// annotations the agent reads (`ip` need not be one: the tests of
/// rejected peers give garbage).
#[allow(
    dead_code,
    reason = "not every test binary that includes common uses it"
)]
pub fn peer_node(name: &str, cidrs: &[&str], mac: &str, ip: &str) -> Node {
    let mut n = mycni_apiserver::node_with_cidrs(name, cidrs);
    let ann: BTreeMap<String, String> = [
        ("mycni.dev/vtep-mac".to_string(), mac.to_string()),
        ("mycni.dev/host-ip".to_string(), ip.to_string()),
    ]
    .into();
    n.metadata.annotations = Some(ann);
    n
}

/// `ip -n <node i> args`.
#[allow(
    dead_code,
    reason = "not every test binary that includes common uses it"
)]
pub fn node_ip(l: &Lab, i: usize, args: &[&str]) -> Result<String> {
    let ns = l.spec.node_name(i);
    let mut a = vec!["-n", ns.as_str()];
    a.extend_from_slice(args);
    mycni_testkit::sh("ip", &a)
}

/// `ip route` shows a route through a nexthop object (the agent's, where
/// the kernel has them) as `dst nhid N via …`: the tests check where
/// routes go, which reads the same without the ID.
#[allow(
    dead_code,
    reason = "not every test binary that includes common uses it"
)]
pub fn without_nhid(routes: &str) -> String {
    routes
        .lines()
        .map(|l| {
            let mut out = Vec::new();
            let mut words = l.split_whitespace();
            while let Some(w) = words.next() {
                if w == "nhid" {
                    words.next();
                } else {
                    out.push(w);
                }
            }
            out.join(" ") + "\n"
        })
        .collect()
}

/// A TCP connection from the pod netns `pod_ns` (the lab's `tcp-probe`) to
/// a listener at `listen` in the underlay's netns, outside the cluster:
/// the source address the outside saw.
#[allow(
    dead_code,
    reason = "not every test binary that includes common uses it"
)]
pub fn source_seen_outside(l: &Lab, pod_ns: &str, listen: &str) -> Result<SocketAddr> {
    let listener = in_netns(&l.spec.underlay_ns(), || {
        std::net::TcpListener::bind(listen)
    })??;
    let server = std::thread::spawn(move || -> Result<SocketAddr> {
        let (mut c, peer) = listener.accept()?;
        let mut buf = [0u8; 6];
        c.read_exact(&mut buf)?;
        c.write_all(&buf)?;
        Ok(peer)
    });
    mycni_testkit::sh(
        "ip",
        &[
            "netns",
            "exec",
            pod_ns,
            &l.spec.bins.lab.to_string_lossy(),
            "tcp-probe",
            listen,
        ],
    )?;
    server
        .join()
        .map_err(|_| anyhow::anyhow!("server panicked"))?
}

/// Stops node `i`'s agent and runs `mycni-agent uninstall` there, as the
/// documented procedure does.
#[allow(
    dead_code,
    reason = "not every test binary that includes common uses it"
)]
pub fn uninstall(l: &Lab, i: usize) -> Result<()> {
    let ns = l.spec.node_name(i);
    l.stop_agent(i);
    let dir = l.spec.node_dir(i);
    let p = |s: &str| dir.join(s).to_string_lossy().into_owned();
    mycni_testkit::sh(
        "ip",
        &[
            "netns",
            "exec",
            &ns,
            &l.spec.bins.agent.to_string_lossy(),
            "uninstall",
            "--cni-conf-dir",
            &p("net.d"),
            "--state-dir",
            &p("run"),
            "--proc-sys",
            "/proc/sys",
        ],
    )?;
    Ok(())
}

/// The value of the unlabelled metric `name` on node `i`.
#[allow(
    dead_code,
    reason = "not every test binary that includes common uses it"
)]
pub fn counter(l: &Lab, i: usize, name: &str) -> Result<u64> {
    let m = l.metrics(i)?;
    m.lines()
        .find_map(|x| x.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no {name} in the metrics"))
}

/// `promtool check metrics` on a scrape (`cargo xtask setup` installs
/// promtool).
#[allow(dead_code)]
pub fn promtool_check_metrics(scrape: &str) -> Result<()> {
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running promtool (`cargo xtask setup` installs it)")?;
    child
        .stdin
        .take()
        .context("promtool's stdin")?
        .write_all(scrape.as_bytes())?;
    let out = child.wait_with_output()?;
    anyhow::ensure!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
