//! Agent and kernel faults on a running lab with long-lived flows across
//! nodes: what each fault costs the traffic, and how long until the node is
//! whole again. Every case needs a lab with the API fixture in-process
//! (`Spec::in_process_api`) and at least 2 nodes with 1 pod each.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use super::CaseResult;
use super::flows::{FlowStats, Flows};
use crate::{Lab, Pod, Sandbox};
use mycni_apiserver::node;
use mycni_testkit::sh;

/// A node is whole when the kernel holds exactly one route, FDB entry and
/// neighbour per peer, the fast path mirrors its peers and pods, and the
/// agent reports ready. Returns what is wrong, if anything.
pub fn whole(lab: &Lab, i: usize) -> Result<Option<String>> {
    let s = &lab.spec;
    let ns = s.node_name(i);
    let peers = lab_peers(lab);
    let routes = sh("ip", &["-n", &ns, "route", "show", "proto", "110"])?;
    let n_routes = routes.lines().filter(|l| l.contains("vxlan.1")).count();
    if n_routes != peers {
        return Ok(Some(format!("{n_routes} peer routes, want {peers}")));
    }
    let fdb = sh("bridge", &["-n", &ns, "fdb", "show", "dev", "vxlan.1"])?;
    let n_fdb = fdb
        .lines()
        .filter(|l| l.contains("permanent") && !l.starts_with("00:00:00:00:00:00"))
        .count();
    if n_fdb != peers {
        return Ok(Some(format!("{n_fdb} FDB entries, want {peers}")));
    }
    let neigh = sh(
        "ip",
        &[
            "-n",
            &ns,
            "neigh",
            "show",
            "dev",
            "vxlan.1",
            "nud",
            "permanent",
        ],
    )?;
    if neigh.lines().count() != peers {
        return Ok(Some(format!(
            "{} neighbours, want {peers}",
            neigh.lines().count()
        )));
    }
    let m = match lab.metrics(i) {
        Ok(m) => m,
        Err(e) => return Ok(Some(format!("no metrics: {e}"))),
    };
    let has = |line: &str| m.lines().any(|l| l == line);
    if !has("mycni_ready 1") {
        return Ok(Some("agent not ready".into()));
    }
    if has("mycni_datapath_ebpf 1") {
        let pods = lab.pods()?.iter().filter(|p| p.node == i).count();
        for (map, want) in [("local", pods), ("remote", peers)] {
            if !has(&format!("mycni_datapath_entries{{map=\"{map}\"}} {want}")) {
                return Ok(Some(format!("fast path {map} map is not {want} entries")));
            }
            let pin = s.pin_dir(i).join(format!("mycni_{map}"));
            let dump = sh(
                "bpftool",
                &["-j", "map", "dump", "pinned", &pin.to_string_lossy()],
            );
            // A JSON array, one element per entry (each element carries the
            // key twice: raw and BTF-formatted).
            let n = dump
                .ok()
                .and_then(|d| serde_json::from_str::<serde_json::Value>(&d).ok())
                .and_then(|v| v.as_array().map(Vec::len))
                .unwrap_or(usize::MAX);
            if n != want {
                return Ok(Some(format!(
                    "pinned mycni_{map} has {n} entries, want {want}"
                )));
            }
        }
    }
    Ok(None)
}

fn lab_peers(lab: &Lab) -> usize {
    let api_nodes = lab.api.as_ref().map_or(lab.spec.nodes, |a| a.nodes().len());
    api_nodes.saturating_sub(1)
}

/// Waits until every node is whole; returns how long that took.
pub fn wait_whole(lab: &Lab, timeout: Duration) -> Result<Duration> {
    let t0 = Instant::now();
    loop {
        let mut wrong = None;
        for i in 1..=lab.spec.nodes {
            if let Some(w) = whole(lab, i)? {
                wrong = Some((i, format!("node {i}: {w}")));
                break;
            }
        }
        match wrong {
            None => return Ok(t0.elapsed()),
            Some((i, w)) if t0.elapsed() > timeout => {
                // The agent's last words say why far more often than the
                // state does.
                let log = std::fs::read_to_string(lab.spec.node_dir(i).join("agent.log"))
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                bail!(
                    "not whole after {timeout:?}: {w}; node {i}'s agent log ends:\n{}",
                    tail.join("\n")
                )
            }
            Some(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

fn two_pods(lab: &Lab) -> Result<(Pod, Pod)> {
    let pods = lab.pods()?;
    let a = pods
        .iter()
        .find(|p| p.node == 1)
        .context("a pod on node 1")?;
    let b = pods
        .iter()
        .find(|p| p.node == 2)
        .context("a pod on node 2")?;
    Ok((a.clone(), b.clone()))
}

fn finish(mut r: CaseResult, flows: Flows) -> Result<CaseResult> {
    let (tcp, udp) = flows.stop()?;
    let gap = tcp.longest_gap.max(udp.longest_gap);
    r.longest_gap = Some(gap);
    let describe = |name: &str, f: &FlowStats| match &f.error {
        Some(e) => format!("{name}: {e}"),
        None => format!("{name} {} ms", f.longest_gap.as_millis()),
    };
    r.load = format!(
        "{}; TCP stream ({} round trips) + UDP flow ({} answers) across nodes",
        r.load, tcp.rounds, udp.rounds
    );
    let flow_note = format!("{}, {}", describe("tcp", &tcp), describe("udp", &udp));
    r.notes = if r.notes.is_empty() {
        flow_note
    } else {
        format!("{}; {flow_note}", r.notes)
    };
    if let Some(e) = tcp.error.or(udp.error) {
        bail!("{}: a long-lived flow broke: {e}", r.case);
    }
    Ok(r)
}

fn max_opt(a: Option<Duration>, b: Duration) -> Option<Duration> {
    Some(a.map_or(b, |a| a.max(b)))
}

/// A peer Node that exists only in the API (no agent): enough for every
/// agent to program a route, neighbour and FDB entry for it.
fn fake_peer(lab: &Lab, k: usize) -> Result<()> {
    let api = lab
        .api
        .as_ref()
        .context("the lab's API fixture is not in-process")?;
    let mut n = node(
        &format!("soak-peer-{k}"),
        Some(&format!("10.244.{}.0/24", 100 + k % 100)),
    );
    n.metadata.annotations = Some(
        [
            (
                "mycni.dev/vtep-mac".to_string(),
                format!("02:00:00:00:{:02x}:{:02x}", k / 256 % 256, k % 256),
            ),
            (
                "mycni.dev/host-ip".to_string(),
                format!("192.168.78.{}", 1 + k % 250),
            ),
        ]
        .into_iter()
        .collect(),
    );
    api.create_node(n)?;
    Ok(())
}

/// SIGKILL agents at random moments while Node changes keep them
/// reconciling, restart them, and time until every node is whole.
pub fn agent_kills(lab: &Lab, kills: usize, seed: u64) -> Result<CaseResult> {
    let (a, b) = two_pods(lab)?;
    let flows = Flows::start(&a, &b)?;
    let api = lab
        .api
        .as_ref()
        .context("the lab's API fixture is not in-process")?;
    let mut rng = seed | 1;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut r = CaseResult {
        case: "agent SIGKILL mid-reconcile".into(),
        load: format!("{} nodes", lab.spec.nodes),
        faults: format!("{kills} SIGKILLs, each 0-30 ms after a Node change"),
        ..Default::default()
    };
    for k in 0..kills {
        let i = 1 + k % lab.spec.nodes;
        // Work for the reconcile loop: a peer appears (or goes).
        if k % 2 == 0 {
            fake_peer(lab, k)?;
        } else {
            api.delete_node(&format!("soak-peer-{}", k - 1))?;
        }
        std::thread::sleep(Duration::from_millis(next() % 31));
        lab.kill_agent(i);
        let t0 = Instant::now();
        lab.start_agent(i)?;
        wait_whole(lab, Duration::from_secs(30))?;
        r.repair = max_opt(r.repair, t0.elapsed());
    }
    for k in 0..kills {
        let _ = api.delete_node(&format!("soak-peer-{k}"));
    }
    wait_whole(lab, Duration::from_secs(30))?;
    finish(r, flows)
}

/// The agent away while pods come and go: DEL works, ADD works (the plugin
/// needs no agent; the pod is on the kernel path), STATUS says not ready;
/// back, the agent picks the new pod up.
pub fn agent_absent(lab: &Lab, absent: Duration) -> Result<CaseResult> {
    let (a, b) = two_pods(lab)?;
    let flows = Flows::start(&a, &b)?;
    let mut r = CaseResult {
        case: "agent absent while pods come and go".into(),
        load: format!("{} nodes", lab.spec.nodes),
        faults: format!(
            "agent stopped {} s; STATUS checked, 2 pods added and 1 removed meanwhile",
            absent.as_secs()
        ),
        ..Default::default()
    };
    lab.stop_agent(1);
    // If the case fails before it starts the agent again, the next cases
    // still need one.
    let mut away = AgentAway(lab, 1);
    let t0 = Instant::now();
    let status = lab.cni(1, "STATUS", Sandbox::new("-", "", "-"));
    ensure!(
        status
            .as_ref()
            .err()
            .is_some_and(|e| e.to_string().contains("\"code\":50")),
        "STATUS without the agent: {status:?}"
    );
    // A pod added and one removed while the agent is away.
    let ns = format!("{}-absent", lab.spec.node_name(1));
    sh("ip", &["netns", "add", &ns])?;
    let guard = NsGuard(ns.clone());
    let added = lab.cni(
        1,
        "ADD",
        Sandbox::new("soak-absent", &format!("/run/netns/{ns}"), "absent"),
    );
    let added = added.context("ADD without the agent")?;
    // And one that comes and goes entirely while the agent is away.
    let ns2 = format!("{}-absent2", lab.spec.node_name(1));
    sh("ip", &["netns", "add", &ns2])?;
    let guard2 = NsGuard(ns2.clone());
    let netns2 = format!("/run/netns/{ns2}");
    lab.cni(1, "ADD", Sandbox::new("soak-absent2", &netns2, "absent2"))
        .context("second ADD without the agent")?;
    lab.cni(1, "DEL", Sandbox::new("soak-absent2", &netns2, "absent2"))
        .context("DEL without the agent")?;
    drop(guard2);
    let ip: std::net::Ipv4Addr = added["ips"][0]["address"]
        .as_str()
        .and_then(|x| x.split('/').next())
        .and_then(|x| x.parse().ok())
        .context("no IP in the ADD result")?;
    let elapsed = t0.elapsed();
    if absent > elapsed {
        std::thread::sleep(absent - elapsed);
    }
    let t1 = Instant::now();
    away.back()?;
    // The new pod is reachable from the other node and gets attached.
    sh(
        "ip",
        &[
            "netns",
            "exec",
            &b.ns,
            "ping",
            "-c",
            "1",
            "-W",
            "2",
            &ip.to_string(),
        ],
    )
    .context("the pod added while the agent was away is unreachable")?;
    let mut attached = false;
    while t1.elapsed() < Duration::from_secs(30) {
        let m = lab.metrics(1).unwrap_or_default();
        let local = a_local_entries(&m);
        if local == Some(2) {
            attached = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    ensure!(
        attached,
        "the pod added while the agent was away never got the fast path"
    );
    r.repair = Some(t1.elapsed());
    lab.cni(
        1,
        "DEL",
        Sandbox::new("soak-absent", &format!("/run/netns/{ns}"), "absent"),
    )
    .context("DEL")?;
    drop(guard);
    wait_whole(lab, Duration::from_secs(30))?;
    finish(r, flows)
}

/// A lab node whose agent a case stopped: started again on drop unless
/// the case did.
struct AgentAway<'a>(&'a Lab, usize);

impl AgentAway<'_> {
    fn back(&mut self) -> Result<()> {
        let i = std::mem::take(&mut self.1);
        self.0.start_agent(i)
    }
}

impl Drop for AgentAway<'_> {
    fn drop(&mut self) {
        if self.1 != 0 {
            let _ = self.0.start_agent(self.1);
        }
    }
}

fn a_local_entries(metrics: &str) -> Option<usize> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("mycni_datapath_entries{map=\"local\"} "))
        .and_then(|v| v.parse().ok())
}

struct NsGuard(String);

impl Drop for NsGuard {
    fn drop(&mut self) {
        let _ = sh("ip", &["netns", "del", &self.0]);
    }
}

/// The API server unreachable: forwarding goes on, readiness says so, the
/// kernel state stays, and the watch comes back by itself.
pub fn api_outage(lab: &Lab, outage: Duration) -> Result<CaseResult> {
    let (a, b) = two_pods(lab)?;
    let flows = Flows::start(&a, &b)?;
    let mut r = CaseResult {
        case: "API server unreachable".into(),
        load: format!("{} nodes", lab.spec.nodes),
        faults: format!(
            "API fixture drops every connection for {} s",
            outage.as_secs()
        ),
        ..Default::default()
    };
    lab.set_api_reachable(false)?;
    let t0 = Instant::now();
    let mut reported = false;
    while t0.elapsed() < outage {
        for i in 1..=lab.spec.nodes {
            if let Some(w) = whole(lab, i)?
                && !w.contains("not ready")
            {
                bail!("node {i} lost state during the API outage: {w}");
            }
        }
        let m = lab.metrics(1).unwrap_or_default();
        reported |= m.lines().any(|l| l == "mycni_api_reachable 0");
        std::thread::sleep(Duration::from_millis(200));
    }
    ensure!(reported, "no agent reported the API unreachable");
    lab.set_api_reachable(true)?;
    let t1 = Instant::now();
    // Back: a Node change made now must reach every agent.
    fake_peer(lab, 7)?;
    wait_whole(lab, Duration::from_secs(60))?;
    r.repair = Some(t1.elapsed());
    let api = lab.api.as_ref().context("in-process API")?;
    api.delete_node("soak-peer-7")?;
    wait_whole(lab, Duration::from_secs(30))?;
    r.notes = "kernel state checked every 200 ms: unchanged; mycni_api_reachable 0 during".into();
    finish(r, flows)
}

type Fault<'a> = Box<dyn Fn() -> Result<()> + 'a>;

/// Deletes every route of the agent's (protocol 110) in netns `ns`, one
/// `ip -batch` of deletes: `ip route flush` fails with EINVAL on routes
/// through nexthop objects (iproute2 6.1 sends them back with both the
/// nexthop and its gateway).
pub fn flush_agent_routes(ns: &str) -> Result<()> {
    let routes = sh("ip", &["-n", ns, "route", "show", "proto", "110"])?;
    let batch: String = routes
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(|dst| format!("route del {dst} proto 110\n"))
        .collect();
    if batch.is_empty() {
        return Ok(());
    }
    let file = std::env::temp_dir().join(format!("{ns}-flush.batch"));
    std::fs::write(&file, batch)?;
    let r = sh(
        "ip",
        &["-n", ns, "-force", "-batch", &file.to_string_lossy()],
    );
    let _ = std::fs::remove_file(&file);
    r.map(drop)
}

/// Someone else breaks the node's kernel state; the agent repairs it.
pub fn kernel_drift(lab: &Lab) -> Result<CaseResult> {
    let (a, b) = two_pods(lab)?;
    let flows = Flows::start(&a, &b)?;
    let ns = lab.spec.node_name(1);
    let pin = lab.spec.pin_dir(1);
    let mut r = CaseResult {
        case: "kernel state removed under the agent".into(),
        load: format!("{} nodes", lab.spec.nodes),
        faults: "node 1: vxlan.1 deleted; agent routes flushed; FDB flushed; pinned maps removed"
            .into(),
        ..Default::default()
    };
    let mut notes = vec![];
    let faults: [(&str, Fault); 4] = [
        (
            "vxlan.1 deleted",
            Box::new(|| sh("ip", &["-n", &ns, "link", "del", "vxlan.1"]).map(drop)),
        ),
        ("routes flushed", Box::new(|| flush_agent_routes(&ns))),
        (
            "FDB flushed",
            Box::new(|| {
                let fdb = sh("bridge", &["-n", &ns, "fdb", "show", "dev", "vxlan.1"])?;
                for l in fdb.lines().filter(|l| l.contains("dst")) {
                    let mut args = vec!["-n", ns.as_str(), "fdb", "del"];
                    args.extend(
                        l.split_whitespace()
                            .take_while(|w| *w != "self" && *w != "permanent"),
                    );
                    args.push("self");
                    let _ = sh("bridge", &args);
                }
                Ok(())
            }),
        ),
        (
            "pinned maps removed",
            Box::new(|| {
                for m in [
                    "mycni_config",
                    "mycni_remote",
                    "mycni_local",
                    "mycni_counters",
                ] {
                    std::fs::remove_file(pin.join(m))?;
                }
                Ok(())
            }),
        ),
    ];
    for (what, fault) in faults.iter() {
        let t0 = Instant::now();
        fault()?;
        let took =
            wait_whole(lab, Duration::from_secs(30)).with_context(|| format!("after {what}"))?;
        let _ = t0;
        notes.push(format!("{what}: {} ms", took.as_millis()));
        r.repair = max_opt(r.repair, took);
        flows.wait_flowing(Duration::from_secs(10))?;
    }
    r.notes = notes.join(", ");
    finish(r, flows)
}

/// Node 2's underlay address changes (and changes back): its agent moves
/// vxlan.1 and republishes its host IP, node 1 re-points its FDB entry, and
/// the flows resume.
pub fn host_ip_change(lab: &Lab) -> Result<CaseResult> {
    let (a, b) = two_pods(lab)?;
    let flows = Flows::start(&a, &b)?;
    let ns = lab.spec.node_name(2);
    let n1 = lab.spec.node_name(1);
    let (old, new) = ("192.168.77.12", "192.168.77.22");
    let mut r = CaseResult {
        case: "node host IP changed".into(),
        load: format!("{} nodes", lab.spec.nodes),
        faults: format!("node 2's underlay address {old} -> {new}, then back"),
        ..Default::default()
    };
    // Deleting the primary address must not take the new one with it.
    sh(
        "ip",
        &[
            "netns",
            "exec",
            &ns,
            "sysctl",
            "-qw",
            "net.ipv4.conf.eth0.promote_secondaries=1",
        ],
    )?;
    let mut notes = vec![];
    for (from, to) in [(old, new), (new, old)] {
        let t0 = Instant::now();
        sh(
            "ip",
            &["-n", &ns, "addr", "add", &format!("{to}/24"), "dev", "eth0"],
        )?;
        sh(
            "ip",
            &[
                "-n",
                &ns,
                "addr",
                "del",
                &format!("{from}/24"),
                "dev",
                "eth0",
            ],
        )?;
        loop {
            let fdb = sh("bridge", &["-n", &n1, "fdb", "show", "dev", "vxlan.1"])?;
            let vx = sh("ip", &["-n", &ns, "-d", "link", "show", "vxlan.1"]).unwrap_or_default();
            if fdb.contains(&format!("dst {to} ")) && vx.contains(&format!("local {to} ")) {
                break;
            }
            if t0.elapsed() > Duration::from_secs(30) {
                let log = std::fs::read_to_string(lab.spec.node_dir(2).join("agent.log"))
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(8).collect();
                bail!(
                    "after {from} -> {to}: node 1 FDB {fdb}, node 2 vxlan {vx}, addresses {}, routes {}, agent log tail {tail:#?}",
                    sh("ip", &["-n", &ns, "-4", "addr", "show", "eth0"]).unwrap_or_default(),
                    sh("ip", &["-n", &ns, "route"]).unwrap_or_default(),
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        flows.wait_flowing(Duration::from_secs(10))?;
        let took = t0.elapsed();
        notes.push(format!("{from} -> {to}: {} ms", took.as_millis()));
        r.repair = max_opt(r.repair, took);
    }
    wait_whole(lab, Duration::from_secs(30))?;
    r.notes = notes.join(", ");
    finish(r, flows)
}

/// Node 2 deleted and re-added with a new podCIDR: node 1 drops the old
/// route and programs the new one; node 2's agent exits on the change (the
/// DaemonSet restarts it; here the case does) and comes back with the new
/// range, where a new pod gets an address reachable from node 1.
pub fn node_readded(lab: &Lab) -> Result<CaseResult> {
    let api = lab
        .api
        .as_ref()
        .context("the lab's API fixture is not in-process")?;
    let name = lab.spec.node_name(2);
    let n1 = lab.spec.node_name(1);
    let (a, _) = two_pods(lab)?;
    let new_cidr = "10.244.52.0/24";
    // Node 2's own pods lose their range by design; a flow between the
    // other nodes must not notice.
    let pods = lab.pods()?;
    let flows = match pods.iter().find(|p| p.node == 3) {
        Some(c) => Some(Flows::start(&a, c)?),
        None => None,
    };
    let mut r = CaseResult {
        case: "node deleted, re-added with a new podCIDR".into(),
        load: format!("{} nodes", lab.spec.nodes),
        faults: format!("Node {name} deleted, re-created with {new_cidr}"),
        ..Default::default()
    };
    let t0 = Instant::now();
    api.delete_node(&name)?;
    wait_for(
        Duration::from_secs(30),
        "node 1 to drop the deleted peer",
        || Ok(!sh("ip", &["-n", &n1, "route", "show", "proto", "110"])?.contains("10.244.2.0/24")),
    )?;
    let dropped = t0.elapsed();
    let t1 = Instant::now();
    api.create_node(node(&name, Some(new_cidr)))?;
    let log = lab.spec.node_dir(2).join("agent.log");
    wait_for(
        Duration::from_secs(30),
        "node 2's agent to notice its new podCIDR",
        || Ok(std::fs::read_to_string(&log)?.contains("podCIDRs changed")),
    )?;
    lab.kill_agent(2);
    lab.start_agent(2)?;
    wait_for(
        Duration::from_secs(30),
        "node 1 to route the new podCIDR",
        || Ok(sh("ip", &["-n", &n1, "route", "show", "proto", "110"])?.contains("10.244.52.0/24")),
    )?;
    // A pod started now gets an address from the new range, reachable from node 1.
    let ns = format!("{name}-readded");
    sh("ip", &["netns", "add", &ns])?;
    let guard = NsGuard(ns.clone());
    let netns = format!("/run/netns/{ns}");
    // The restarted agent publishes itself (so node 1 may route it) before
    // its first pass writes the conflist.
    let conflist = lab.spec.node_dir(2).join("net.d/00-mycni.conflist");
    wait_for(
        Duration::from_secs(30),
        "node 2's conflist to have the new range",
        || Ok(std::fs::read_to_string(&conflist)?.contains("10.244.52.0/24")),
    )?;
    let added = lab.cni(2, "ADD", Sandbox::new("soak-readded", &netns, "readded"))?;
    let ip = added["ips"][0]["address"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    ensure!(ip.starts_with("10.244.52."), "new pod got {ip}");
    let ip = ip.split('/').next().unwrap_or_default().to_string();
    let mut reached = false;
    for _ in 0..50 {
        if sh(
            "ip",
            &["netns", "exec", &a.ns, "ping", "-c", "1", "-W", "1", &ip],
        )
        .is_ok()
        {
            reached = true;
            break;
        }
    }
    ensure!(reached, "the new pod {ip} is unreachable from node 1");
    r.repair = Some(t1.elapsed());
    lab.cni(2, "DEL", Sandbox::new("soak-readded", &netns, "readded"))?;
    drop(guard);
    r.notes = format!(
        "old route gone {} ms after the delete; new range routed and a new pod reachable {} ms after the re-add",
        dropped.as_millis(),
        t1.elapsed().as_millis()
    );
    match flows {
        Some(f) => {
            r.load = format!("{}; flows node1->node3", r.load);
            finish(r, f)
        }
        None => {
            r.load = format!("{} (no flow: needs a third node)", r.load);
            Ok(r)
        }
    }
}

fn wait_for(timeout: Duration, what: &str, mut f: impl FnMut() -> Result<bool>) -> Result<()> {
    let t0 = Instant::now();
    loop {
        if f().unwrap_or(false) {
            return Ok(());
        }
        ensure!(
            t0.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An upgrade to a build whose map layout differs from the pinned maps
/// (simulated: node 1's pinned `mycni_local` is replaced by a map of
/// another value size while its agent is down). The new agent cannot reuse
/// the pins, rebuilds the maps, fills them and swaps its programs into the
/// pinned links; the old programs forward with the old maps until then.
pub fn upgrade_changed_layout(lab: &Lab) -> Result<CaseResult> {
    let (a, b) = two_pods(lab)?;
    let flows = Flows::start(&a, &b)?;
    let pin = lab.spec.pin_dir(1);
    let local = pin.join("mycni_local");
    let mut r = CaseResult {
        case: "upgrade with a changed map layout".into(),
        load: format!("{} nodes", lab.spec.nodes),
        faults: "node 1's agent replaced while its pinned mycni_local has another layout".into(),
        ..Default::default()
    };
    lab.stop_agent(1);
    std::fs::remove_file(&local)?;
    sh(
        "bpftool",
        &[
            "map",
            "create",
            &local.to_string_lossy(),
            "type",
            "hash",
            "key",
            "4",
            "value",
            "24",
            "entries",
            "64",
            "name",
            "mycni_local",
        ],
    )?;
    let t0 = Instant::now();
    lab.start_agent(1)?;
    wait_whole(lab, Duration::from_secs(30))?;
    r.repair = Some(t0.elapsed());
    let log = std::fs::read_to_string(lab.spec.node_dir(1).join("agent.log"))?;
    ensure!(
        log.contains("rebuilding them"),
        "the agent did not report rebuilding the pinned maps"
    );
    // Traffic still takes the fast path with the rebuilt maps.
    let fast = |l: &Lab| {
        l.counters(1)
            .map_or(0, |c| c.get("fast_encap").copied().unwrap_or(0))
    };
    let f0 = fast(lab);
    std::thread::sleep(Duration::from_millis(500));
    ensure!(fast(lab) > f0, "no fast path after the upgrade");
    r.notes = "maps rebuilt, programs swapped into the pinned links".into();
    finish(r, flows)
}
