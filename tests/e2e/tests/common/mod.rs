//! What the lab-based tests share: the binaries and a lab torn down on drop.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Result;
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
