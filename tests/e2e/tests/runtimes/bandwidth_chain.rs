//! The reference `bandwidth` plugin chained after mycni (issue 39), in both
//! attach modes: over TCX, and as legacy `clsact` + `cls_bpf` filters
//! (`MYCNI_TC_ATTACH=legacy`, as on Debian 12's 6.1).
//!
//! `bandwidth` shapes a pod's ingress with a TBF root qdisc on the host
//! veth, and its egress with an `ingress` qdisc there whose u32 filter
//! (priority 1, protocol all) redirects to an ifb device with a TBF. Both
//! collide with the fast path: a legacy attach's `clsact` takes the slot
//! `bandwidth`'s `ingress` qdisc needs (its ADD fails with EEXIST), a
//! program on the veth's ingress runs before the u32 filter and redirects
//! past the ifb, and `bpf_redirect_peer` towards the pod skips the host
//! veth's TBF. So the agent leaves a shaped pod to the kernel path: not
//! attached, not in `mycni_local`, named in `/readyz`.
//!
//! Each pod here is made as the runtime makes it: mycni's ADD, then at once
//! `bandwidth`'s with mycni's result (the race the agent must not win); one
//! more gets `bandwidth` only after the agent has seen it (a slow chain).
//! Then a TCP transfer of a few MB into and out of the shaped pod, from a
//! pod on the same node (the fast path's `bpf_redirect_peer`) and from one
//! on the other node (tc decapsulation and encapsulation), must run at the
//! shaped rate, and no packet of it may take a fast path. The agents run
//! with the production resync (5 min), so what they do is what the
//! kernel's notifications make them do.

use crate::common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use aya::programs::{SchedClassifier, TcAttachType};
use common::TestLab;
use mycni_agent::datapath::LOCAL;
use mycni_agent::datapath::attach::filter_program_ids;
use mycni_e2e::bins;
use mycni_lab::{Counters, Lab, Spec, Stack};
use mycni_testkit::{in_netns, sh, unique};
use serde_json::{Value, json};

const MODE_ENV: &str = "MYCNI_TC_ATTACH";
/// Where Debian installs the reference plugins.
const REFERENCE_PLUGINS: &str = "/usr/lib/cni";
/// The shaped rate, both ways, in bits per second.
const RATE: u64 = 10_000_000;
/// TBF's bucket: 100 KB, a few % of a transfer.
const BURST_BITS: u64 = 800_000;
/// Bytes per transfer: ~2.4 s at [`RATE`].
const TRANSFER: usize = 3_000_000;
/// How far a measured rate may be from [`RATE`].
const TOLERANCE: f64 = 0.3;
const SINK_PORT: u16 = 7788;

/// A pod made by mycni's ADD and chained `bandwidth`.
struct ShapedPod {
    ns: String,
    ip: Ipv4Addr,
    veth: String,
    /// `bandwidth`'s ADD: its stdout when it failed.
    bandwidth: std::result::Result<(), String>,
}

/// The lab, and the namespaces of the pods this test adds (which the lab
/// does not know of), removed first.
struct Fixture {
    pods: Vec<String>,
    lab: TestLab,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        for ns in &self.pods {
            let _ = sh("ip", &["netns", "del", ns]);
        }
    }
}

fn lab() -> Result<TestLab> {
    let b = bins();
    mycni_e2e::missing(&[&b.agent, &b.plugin, &b.lab, &b.apiserver])?;
    // Not the `mycni-*` of other labs on this machine.
    let prefix = unique("bwc");
    let root = std::env::temp_dir().join(&prefix);
    Ok(TestLab(Lab::up(Spec {
        prefix,
        nodes: 2,
        pods: 1,
        root,
        bins: b,
        // The production default: only notifications make passes between.
        agent_args: vec!["--resync".into(), "5m".into()],
        in_process_api: true,
        stack: Stack::Ipv4Only,
        model: false,
    })?))
}

impl Fixture {
    fn l(&self) -> &Lab {
        &self.lab.0
    }

    /// Pod `j` on node `node`: mycni's ADD, then `bandwidth`'s after `gap`
    /// (none: at once, as a runtime runs a chain).
    fn add_shaped(&mut self, node: usize, j: usize, gap: Option<Duration>) -> Result<ShapedPod> {
        let l = &self.lab.0;
        let ns = l.spec.pod_ns(node, j);
        sh("ip", &["netns", "add", &ns])?;
        self.pods.push(ns.clone());
        sh(
            "ip",
            &["netns", "exec", &ns, "ip", "link", "set", "lo", "up"],
        )?;
        let netns = format!("/run/netns/{ns}");
        let cid = format!("bw-{node}-{j}");
        let pod = format!("bw{j}");
        // Debian's bandwidth speaks up to 1.0.0, as the list's version.
        let mut conf = l.plugin_conf(node)?;
        conf["cniVersion"] = json!("1.0.0");
        let mut add = l
            .cni_command(node, "ADD", mycni_lab::Sandbox::new(&cid, &netns, &pod))?
            .spawn()?;
        add.stdin
            .take()
            .context("plugin stdin")?
            .write_all(conf.to_string().as_bytes())?;
        let out = add.wait_with_output()?;
        ensure!(
            out.status.success(),
            "mycni ADD: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let result: Value = serde_json::from_slice(&out.stdout)?;
        let ip: Ipv4Addr = result["ips"][0]["address"]
            .as_str()
            .and_then(|a| a.split('/').next())
            .context("no address in mycni's result")?
            .parse()?;
        let veth = result["interfaces"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|i| i.get("sandbox").is_none())
            .and_then(|i| i["name"].as_str())
            .context("no host interface in mycni's result")?
            .to_owned();
        if let Some(gap) = gap {
            std::thread::sleep(gap);
        }
        let bw = json!({
            "cniVersion": "1.0.0",
            "name": conf["name"],
            "type": "bandwidth",
            "ingressRate": RATE,
            "ingressBurst": BURST_BITS,
            "egressRate": RATE,
            "egressBurst": BURST_BITS,
            "prevResult": result,
        });
        let mut child = Command::new("ip")
            .args(["netns", "exec", &l.spec.node_name(node)])
            .arg(format!("{REFERENCE_PLUGINS}/bandwidth"))
            .env("CNI_COMMAND", "ADD")
            .env("CNI_CONTAINERID", &cid)
            .env("CNI_NETNS", &netns)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", REFERENCE_PLUGINS)
            .env(
                "CNI_ARGS",
                format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=lab;K8S_POD_NAME={pod}"),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        child
            .stdin
            .take()
            .context("bandwidth stdin")?
            .write_all(bw.to_string().as_bytes())?;
        let out = child.wait_with_output()?;
        let bandwidth = if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        };
        Ok(ShapedPod {
            ns,
            ip,
            veth,
            bandwidth,
        })
    }

    fn tc(&self, node: usize, args: &[&str]) -> String {
        let mut a = vec!["netns", "exec"];
        let name = self.l().spec.node_name(node);
        a.push(&name);
        a.push("tc");
        a.extend_from_slice(args);
        sh("ip", &a).unwrap_or_else(|e| format!("({e})"))
    }

    /// The mycni programs on `veth`'s ingress (TCX or tc filters).
    fn programs_on(&self, node: usize, veth: &str) -> Result<Vec<String>> {
        let veth = veth.to_owned();
        in_netns(&self.l().spec.node_name(node), move || -> Result<_> {
            let c = std::ffi::CString::new(veth.as_str())?;
            // SAFETY: a NUL-terminated name; the call only reads it.
            let ifindex = unsafe { libc::if_nametoindex(c.as_ptr()) };
            ensure!(ifindex != 0, "no {veth}");
            let mut names: Vec<String> = SchedClassifier::query_tcx(ifindex, TcAttachType::Ingress)
                .map(|(_, progs)| progs)
                .unwrap_or_default()
                .iter()
                .filter_map(|p| p.name_as_str().map(|n| format!("tcx:{n}")))
                .collect();
            let ids = filter_program_ids(ifindex)?;
            names.extend(
                aya::programs::loaded_programs()
                    .filter_map(Result::ok)
                    .filter(|p| ids.contains(&p.id()))
                    .filter_map(|p| p.name_as_str().map(|n| format!("tc:{n}"))),
            );
            Ok(names)
        })?
    }
}

/// Sends [`TRANSFER`] bytes from `from_ns` to `to`:[`SINK_PORT`] in
/// `to_ns`; the rate the receiver saw, in bit/s, from its first byte to the
/// sender's end.
fn transfer(from_ns: &str, to_ns: &str, to: Ipv4Addr) -> Result<f64> {
    let listener = in_netns(to_ns, || {
        TcpListener::bind((Ipv4Addr::UNSPECIFIED, SINK_PORT))
    })??;
    let sink = std::thread::spawn(move || -> Result<(usize, Duration)> {
        let (mut c, _) = listener.accept()?;
        c.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut buf = vec![0u8; 64 * 1024];
        let (mut n, mut first) = (0, None);
        loop {
            let k = c.read(&mut buf)?;
            if k == 0 {
                break;
            }
            first.get_or_insert_with(Instant::now);
            n += k;
        }
        Ok((n, first.map_or(Duration::ZERO, |t| t.elapsed())))
    });
    let addr = SocketAddr::from((to, SINK_PORT));
    let mut c = in_netns(from_ns, || {
        TcpStream::connect_timeout(&addr, Duration::from_secs(5))
    })??;
    let chunk = vec![0x5au8; 64 * 1024];
    let mut left = TRANSFER;
    while left > 0 {
        let k = left.min(chunk.len());
        c.write_all(&chunk[..k])?;
        left -= k;
    }
    c.shutdown(Shutdown::Write)?;
    let (n, took) = sink
        .join()
        .map_err(|_| anyhow::anyhow!("the sink panicked"))??;
    ensure!(n == TRANSFER, "the sink got {n} of {TRANSFER} bytes");
    ensure!(!took.is_zero(), "no time measured");
    Ok(n as f64 * 8.0 / took.as_secs_f64())
}

fn fast_packets(c: &Counters) -> u64 {
    c.iter()
        .filter(|(p, _)| p.starts_with("fast_"))
        .map(|(_, n)| n)
        .sum()
}

fn delta(after: &Counters, before: &Counters, f: impl Fn(&Counters) -> u64) -> u64 {
    f(after).saturating_sub(f(before))
}

fn unknown_dest(c: &Counters) -> u64 {
    c.get("kernel_unknown_dest").copied().unwrap_or(0)
}

/// What one mode showed, and what was wrong with it.
#[derive(Default)]
struct Findings {
    problems: Vec<String>,
}

impl Findings {
    fn check(&mut self, ok: bool, what: String) {
        if !ok {
            eprintln!("PROBLEM: {what}");
            self.problems.push(what);
        }
    }
}

/// The shaped pod `p` on node 1 keeps its shaping and the fast path leaves
/// it alone: `bandwidth`'s ADD worked, its qdiscs are there, no mycni
/// program is on its veth, it is not in `mycni_local`, `/readyz` names it,
/// and transfers into it (from node 1's and node 2's lab pods) and out of
/// it run at the shaped rate, on the kernel path of node 1 (the programs
/// there find no local endpoint for it: `kernel_unknown_dest`).
fn check_shaped(
    fx: &Fixture,
    p: &ShapedPod,
    mode: &str,
    what: &str,
    f: &mut Findings,
) -> Result<()> {
    let l = fx.l();
    eprintln!("== {mode}, {what}: pod {} {} veth {}", p.ns, p.ip, p.veth);
    eprintln!("bandwidth ADD: {:?}", p.bandwidth);
    f.check(
        p.bandwidth.is_ok(),
        format!("{mode} {what}: bandwidth ADD failed: {:?}", p.bandwidth),
    );
    let qdiscs = fx.tc(1, &["qdisc", "show", "dev", &p.veth]);
    eprintln!("tc qdisc show dev {}:\n{qdiscs}", p.veth);
    eprintln!(
        "tc filter show dev {} ingress:\n{}",
        p.veth,
        fx.tc(1, &["filter", "show", "dev", &p.veth, "ingress"])
    );
    let progs = fx.programs_on(1, &p.veth)?;
    eprintln!("mycni programs on {}: {progs:?}", p.veth);
    f.check(
        progs.is_empty(),
        format!("{mode} {what}: mycni programs on the shaped veth: {progs:?}"),
    );
    let local = LOCAL.read(l.spec.pin_dir(1).as_path())?;
    f.check(
        !local.contains_key(&p.ip),
        format!("{mode} {what}: {} in mycni_local", p.ip),
    );
    let ready = l.readyz(1)?;
    eprintln!("readyz node 1: {}", ready.trim());
    // It names one interface on the kernel path; `inspect` lists them all.
    f.check(
        ready.contains(" is shaped ("),
        format!("{mode} {what}: /readyz names no shaped pod: {ready}"),
    );
    let metrics = l.metrics(1)?;
    let failures = metrics
        .lines()
        .find(|m| m.starts_with("mycni_datapath_attach_failures "))
        .unwrap_or("(none)");
    eprintln!("{failures}");
    f.check(
        failures
            .rsplit(' ')
            .next()
            .and_then(|n| n.parse::<u64>().ok())
            .is_some_and(|n| n >= 1),
        format!("{mode} {what}: {failures}"),
    );
    let inspect = sh(
        "ip",
        &[
            "netns",
            "exec",
            &l.spec.node_name(1),
            &l.spec.bins.agent.to_string_lossy(),
            "inspect",
        ],
    )?;
    let line = inspect
        .lines()
        .find(|x| x.contains(&format!("{} is shaped", p.veth)));
    eprintln!("inspect: {}", line.unwrap_or("(nothing on it)"));
    f.check(
        line.is_some(),
        format!(
            "{mode} {what}: inspect does not list {}:\n{inspect}",
            p.veth
        ),
    );

    let pods = l.pods()?;
    let near = pods
        .iter()
        .find(|q| q.node == 1)
        .context("no pod on node 1")?;
    let far = pods
        .iter()
        .find(|q| q.node == 2)
        .context("no pod on node 2")?;
    let cases = [
        ("into it from node 1", &near.ns, &p.ns, p.ip),
        ("into it from node 2", &far.ns, &p.ns, p.ip),
        ("out of it to node 2", &p.ns, &far.ns, far.ip),
    ];
    for (dir, from, to, ip) in cases {
        let before = [l.counters(1)?, l.counters(2)?];
        let rate = transfer(from, to, ip)?;
        let after = [l.counters(1)?, l.counters(2)?];
        // Node 1 is where the shaping is: none of its packets may take a
        // fast path there. Node 2 may fast-path its end (encapsulating
        // towards the pod, unwrapping from it): it has no qdisc to skip.
        let fast = delta(&after[0], &before[0], fast_packets);
        let unknown = delta(&after[0], &before[0], unknown_dest);
        let far_fast = delta(&after[1], &before[1], fast_packets);
        eprintln!(
            "{mode} {what} {dir}: {:.2} Mbit/s (shaped at {:.0}); node 1: fast-path packets {fast}, kernel_unknown_dest {unknown}; node 2: fast-path packets {far_fast}",
            rate / 1e6,
            RATE as f64 / 1e6
        );
        let off = (rate - RATE as f64).abs() / RATE as f64;
        f.check(
            off <= TOLERANCE,
            format!(
                "{mode} {what} {dir}: {:.2} Mbit/s, not within {:.0}% of {:.0}",
                rate / 1e6,
                TOLERANCE * 100.0,
                RATE as f64 / 1e6
            ),
        );
        f.check(
            fast == 0 && unknown > 0,
            format!(
                "{mode} {what} {dir}: node 1 fast-pathed {fast} packets, left {unknown} to the kernel as unknown destinations"
            ),
        );
    }
    Ok(())
}

/// One attach mode: a pod shaped at once, one shaped after the agent saw
/// it, then the agent restarted over both. Returns their veths.
fn run_mode(fx: &mut Fixture, mode: &str, first_j: usize, f: &mut Findings) -> Result<Vec<String>> {
    let ready = fx.l().readyz(1)?;
    let name = if mode == "legacy" {
        "legacy tc attach"
    } else {
        "tcx attach"
    };
    ensure!(
        ready.contains(name),
        "node 1 is not in {mode} mode: {ready}"
    );
    let at_once = fx.add_shaped(1, first_j, None)?;
    // A chain slower than the agent: its first pass is ~5 ms after the
    // plugin's route appears.
    let late = fx.add_shaped(1, first_j + 1, Some(Duration::from_millis(1500)))?;
    // The passes after the qdiscs' notifications, and after any settling.
    std::thread::sleep(Duration::from_secs(4));
    check_shaped(fx, &at_once, mode, "shaped at ADD", f)?;
    check_shaped(fx, &late, mode, "shaped 1.5 s after mycni's ADD", f)?;
    // An upgrade or restart: the new agent finds them shaped as well.
    fx.l().restart_agent(1)?;
    std::thread::sleep(Duration::from_secs(2));
    for p in [&at_once, &late] {
        let progs = fx.programs_on(1, &p.veth)?;
        f.check(
            progs.is_empty(),
            format!(
                "{mode} after a restart: mycni programs on {}: {progs:?}",
                p.veth
            ),
        );
        let q = fx.tc(1, &["qdisc", "show", "dev", &p.veth]);
        f.check(
            p.bandwidth.is_err() || (q.contains("tbf") && q.contains("ingress")),
            format!("{mode} after a restart: {} lost its qdiscs: {q}", p.veth),
        );
    }
    let rate = transfer(&fx.l().pods()?[0].ns, &at_once.ns, at_once.ip)?;
    eprintln!(
        "{mode} after a restart, into the pod shaped at ADD: {:.2} Mbit/s",
        rate / 1e6
    );
    f.check(
        (rate - RATE as f64).abs() / RATE as f64 <= TOLERANCE,
        format!("{mode} after a restart: {:.2} Mbit/s", rate / 1e6),
    );
    // The unshaped lab pods still take the fast path.
    let pods = fx.l().pods()?;
    let before = fx.l().counters(1)?;
    let (a, b) = (&pods[0], &pods[1]);
    transfer(&a.ns, &b.ns, b.ip)?;
    let after = fx.l().counters(1)?;
    let fast = delta(&after, &before, fast_packets);
    eprintln!("{mode}: unshaped pod to pod: {fast} fast-path packets on node 1");
    f.check(
        fast > 0,
        format!("{mode}: the unshaped pods took no fast path"),
    );
    Ok(vec![at_once.veth, late.veth])
}

#[test]
fn bandwidth_shaped_pods_keep_their_shaping_in_both_attach_modes() -> Result<()> {
    let _turn = crate::turn(module_path!());
    if !std::path::Path::new(REFERENCE_PLUGINS)
        .join("bandwidth")
        .exists()
    {
        bail!("{REFERENCE_PLUGINS}/bandwidth is missing (Debian's containernetworking-plugins)");
    }
    // SAFETY (env): set before the lab starts its agents, which inherit it;
    // this binary's one test.
    unsafe { std::env::set_var(MODE_ENV, "legacy") };
    let mut fx = Fixture {
        pods: vec![],
        lab: lab()?,
    };
    let mut f = Findings::default();
    let legacy = run_mode(&mut fx, "legacy", 10, &mut f)?;
    // SAFETY (env): as above, between the agents' starts.
    unsafe { std::env::set_var(MODE_ENV, "tcx") };
    fx.lab.0.set_fast_path(true)?;
    // The legacy phase's pods, now under a TCX agent (a kernel upgrade).
    std::thread::sleep(Duration::from_secs(2));
    for veth in &legacy {
        let progs = fx.programs_on(1, veth)?;
        eprintln!("after legacy -> tcx: mycni programs on {veth}: {progs:?}");
        f.check(
            progs.is_empty(),
            format!("after legacy -> tcx: mycni programs on {veth}: {progs:?}"),
        );
    }
    run_mode(&mut fx, "tcx", 20, &mut f)?;
    unsafe { std::env::remove_var(MODE_ENV) };
    ensure!(
        f.problems.is_empty(),
        "{} problems:\n{}",
        f.problems.len(),
        f.problems.join("\n")
    );
    Ok(())
}
