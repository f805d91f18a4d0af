//! `mycni-bench agent`.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail, ensure};
use mycni_common::contract::RTPROT_MYCNI_AGENT;
use mycni_common::net::Mac;
use mycni_lab::stats::percentile_duration;
use mycni_lab::{Bins, Lab, Spec, Stack};
use mycni_testkit::unique;

use crate::overlay::Overlay;

/// The agent's route protocol.
const PROTO: u8 = RTPROT_MYCNI_AGENT;
const VXLAN: &str = "vxlan.1";
const POLL: Duration = Duration::from_millis(20);
const UPDATES: usize = 20;
/// The targets for 5,000 nodes (issue 15).
const TARGET_CONVERGE_S: f64 = 0.3;
const TARGET_HOST_IP_MS: f64 = 20.0;
const TARGET_RSS_MB: f64 = 40.0;
/// How long the idle agent's CPU is measured.
const IDLE: Duration = Duration::from_secs(60);
/// Nexthop IDs of the `ip -batch` reference: the agent's first ones.
const NHID_BASE: u32 = (PROTO as u32) << 24;

#[path = "agent/peers.rs"]
mod peers;
#[path = "agent/probe.rs"]
mod probe;
#[path = "agent/reference.rs"]
mod reference;
#[path = "agent/report.rs"]
mod report;

use peers::{Peer, peer, peer_node};
use probe::{LogLine, agent_log, cpu, field, metrics, ms, proc_status, secs_between, strip_ansi};
use reference::{References, ip_batch_reference, median, refs_fmt};
use report::Figures;

/// Tears the lab down however the bench ends.
struct Guard(Lab);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.down();
    }
}

/// `(routes, neighbours, fdb)` of the overlay; None if a dump raced.
fn counts(s: &Overlay, vx: u32) -> Result<Option<(usize, usize, usize)>> {
    let r = s.count_routes(PROTO)?;
    let n = s.count_neighbours(vx)?;
    let f = s.count_fdb(vx)?;
    Ok(match (r, n, f) {
        (Some(r), Some(n), Some(f)) => Some((r, n, f)),
        _ => None,
    })
}

pub fn bench(bin_dir: &Path, n: usize, full: bool, out: Option<&Path>) -> Result<()> {
    ensure!(
        (1..=38_000).contains(&n),
        "nodes must be 1..=38000 (podCIDRs stay below 10.244.0.0/16, host IPs in 192.168.100-251)"
    );
    let bins = Bins::in_dir(bin_dir, "run through `cargo xtask bench agent`")?;

    eprintln!(
        "mycni-bench: ip -batch references, 3 runs each of {} entries (routes via … onlink) and {} (a nexthop per peer)",
        3 * n,
        4 * n
    );
    let mut refs = References::default();
    for _ in 0..3 {
        refs.onlink.push(ip_batch_reference(n, false)?);
        refs.nexthop.push(ip_batch_reference(n, true)?);
    }
    // `mycnib`: bench labs' own prefix, apart from `mycni-*` test labs
    // that may run on the same machine and be cleaned up by name.
    let prefix = unique("mycnib");
    let root = std::env::temp_dir().join(&prefix);
    eprintln!("mycni-bench: 1-node lab {prefix} under {}", root.display());
    let lab = Guard(Lab::up(Spec {
        prefix,
        nodes: 1,
        pods: 0,
        root,
        bins,
        // Direct routing for the one peer on the lab's underlay subnet
        // (the host-IP change through a nexthop); the N peers are not.
        agent_args: vec![
            "--cluster-cidr".into(),
            "10.0.0.0/8".into(),
            "--direct-routing".into(),
            "true".into(),
        ],
        in_process_api: true,
        stack: Stack::Ipv4Only,
        model: false,
    })?);
    let r = run(&lab.0, n, full, &refs);
    if let Ok((text, figures)) = &r {
        print!("{text}");
        if let Some(out) = out {
            std::fs::write(out, text).with_context(|| format!("writing {}", out.display()))?;
            eprintln!("bench: wrote {}", out.display());
            mycni_lab::chart::write_beside(out, &figures.chart(report::caption(full)))?;
        }
    }
    if r.is_err() {
        let log = lab.0.spec.node_dir(1).join("agent.log");
        if let Ok(s) = std::fs::read_to_string(&log) {
            let tail: Vec<&str> = s.lines().rev().take(15).collect();
            eprintln!(
                "agent log tail:\n{}",
                strip_ansi(&tail.into_iter().rev().collect::<Vec<_>>().join("\n"))
            );
        }
    }
    r.map(|_| ())
}

/// Changes `name`'s host-IP annotation.
fn set_host_ip(lab: &Lab, name: &str, ip: Ipv4Addr) -> Result<()> {
    let api = lab.api.as_ref().context("in-process API fixture")?;
    api.update_node(name, |node| {
        node.metadata
            .annotations
            .get_or_insert_default()
            .insert("mycni.dev/host-ip".into(), ip.to_string());
    })?;
    Ok(())
}

/// Polls `done` until true; the time it took.
fn until(what: &str, mut done: impl FnMut() -> Result<bool>) -> Result<Duration> {
    let t = Instant::now();
    while !done()? {
        ensure!(
            t.elapsed() < Duration::from_secs(30),
            "{what}: not applied within 30 s"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(t.elapsed())
}

/// A directly routed peer's host-IP changes: one nexthop replaced, the
/// route left alone. Latencies, and whether its nexthop ID stayed.
fn direct_host_ip_changes(lab: &Lab, sock: &Overlay, full: bool) -> Result<(Vec<Duration>, bool)> {
    let api = lab.api.as_ref().context("in-process API fixture")?;
    let eth0 = sock.ifindex("eth0")?;
    // Host IPs on the lab's underlay subnet that no lab node has.
    let host = |j: u8| Ipv4Addr::new(192, 168, 77, 200 + j);
    let p = Peer {
        name: "peer-direct".into(),
        cidr: "10.250.0.0/24".into(),
        gw: Ipv4Addr::new(10, 250, 0, 0),
        mac: Mac([0x02, 0, 0xff, 0, 0, 1]),
        host_ip: host(0),
    };
    api.create_node(peer_node(&p, full)?)?;
    let gateway_is = |ip: Ipv4Addr| -> Result<Option<u32>> {
        Ok(sock
            .nexthops_of_link(eth0)?
            .into_iter()
            .find(|nh| nh.protocol == PROTO && nh.gateway == Some(std::net::IpAddr::V4(ip)))
            .map(|nh| nh.id))
    };
    until("the direct peer", || Ok(gateway_is(host(0))?.is_some()))?;
    let id = gateway_is(host(0))?;
    let mut took = Vec::new();
    let mut same_id = true;
    for u in 0..UPDATES / 2 {
        let ip = host(1 + (u % 2) as u8);
        set_host_ip(lab, &p.name, ip)?;
        took.push(until("host-IP change of the direct peer", || {
            Ok(gateway_is(ip)?.is_some())
        })?);
        same_id &= gateway_is(ip)? == id;
        std::thread::sleep(Duration::from_millis(250));
    }
    Ok((took, same_id))
}

fn run(lab: &Lab, n: usize, full: bool, refs: &References) -> Result<(String, Figures)> {
    let ref_nh = median(&refs.nexthop)?;
    let ref_onlink = median(&refs.onlink)?;
    let reference = ref_nh.took;
    let api = lab.api.as_ref().context("in-process API fixture")?;
    let ns = lab.spec.node_name(1);
    let dir = lab.spec.node_dir(1);
    lab.stop_agent(1);

    let t = Instant::now();
    let mut peers: Vec<Peer> = (0..n).map(peer).collect();
    for p in &peers {
        api.create_node(peer_node(p, full)?)?;
    }
    eprintln!(
        "mycni-bench: created {n} peer Nodes in {:.2} s",
        t.elapsed().as_secs_f64()
    );

    let sock = Overlay::open(&ns)?;
    let vx = sock.ifindex(VXLAN)?;
    ensure!(
        counts(&sock, vx)? == Some((0, 0, 0)),
        "the overlay is not empty before the agent starts"
    );

    // (a) Convergence from a cold start with N peers.
    let started_wall = SystemTime::now();
    let started = Instant::now();
    lab.start_agent(1)?;
    let pid: u32 = std::fs::read_to_string(dir.join("agent.pid"))?
        .trim()
        .parse()?;
    let mut polls = 0u32;
    let (converged_wall, converged) = loop {
        if started.elapsed() > Duration::from_secs(300) {
            bail!("not converged within 300 s: {:?}", counts(&sock, vx)?);
        }
        polls += 1;
        // Routes are the agent's last phase: count them alone until complete.
        if sock.count_routes(PROTO)? == Some(n) && counts(&sock, vx)? == Some((n, n, n)) {
            break (SystemTime::now(), started.elapsed());
        }
        std::thread::sleep(POLL);
    };
    let (cpu_user, cpu_sys) = cpu(pid)?;
    let hwm_converged = proc_status(pid, "VmHWM:")?;
    let rss_converged = proc_status(pid, "VmRSS:")?;
    let nexthops = sock.count_nexthops(PROTO)?.unwrap_or(0);

    // The agent's own view: when the list completed, and its passes.
    let mut lines = Vec::new();
    for _ in 0..100 {
        lines = agent_log(&dir.join("agent.log"))?;
        if lines.iter().any(|l| l.text.contains("reconciled overlay")) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let listed = lines
        .iter()
        .find(|l| l.text.contains("initial Node list complete"))
        .context("no \"initial Node list complete\" line in the agent log")?;
    let listed_nodes = field(&listed.text, "nodes").unwrap_or("?").to_string();
    let list_to_programmed = secs_between(listed.at, converged_wall);
    let passes: Vec<&LogLine> = lines
        .iter()
        .filter(|l| l.text.contains("reconciled overlay"))
        .collect();
    let route_kind = lines
        .iter()
        .find(|l| l.text.contains("nexthop objects"))
        .map(|l| {
            if l.text.contains("has no nexthop objects") {
                "via … onlink (the kernel has no nexthop objects)"
            } else {
                "through a nexthop per peer"
            }
        })
        .unwrap_or("(not logged)");

    // Idle cost at N peers: whatever the agent does with nothing to do.
    std::thread::sleep(Duration::from_secs(2));
    let m0 = metrics(lab)?;
    let c0 = cpu(pid)?;
    std::thread::sleep(IDLE);
    let m1 = metrics(lab)?;
    let c1 = cpu(pid)?;
    let runs = m1.get("mycni_reconcile_runs_total").copied().unwrap_or(0.0)
        - m0.get("mycni_reconcile_runs_total").copied().unwrap_or(0.0);
    let pass_secs = m1
        .get("mycni_reconcile_duration_seconds_sum")
        .copied()
        .unwrap_or(0.0)
        - m0.get("mycni_reconcile_duration_seconds_sum")
            .copied()
            .unwrap_or(0.0);
    let idle_cpu = (c1.0 + c1.1 - c0.0 - c0.1) / IDLE.as_secs_f64();

    // (b) One Node update at a time: a new VTEP MAC, until the
    // neighbour carries it.
    let mut updates = Vec::new();
    for u in 0..UPDATES {
        let k = (u * 997 + 13) % n;
        let new = Mac([
            0x02,
            0x01,
            u as u8,
            (k >> 16) as u8,
            (k >> 8) as u8,
            k as u8,
        ]);
        let t = Instant::now();
        api.update_node(&peers[k].name, |node| {
            node.metadata
                .annotations
                .get_or_insert_default()
                .insert("mycni.dev/vtep-mac".into(), new.to_string());
        })?;
        loop {
            if sock.neighbour(vx, peers[k].gw)? == Some(new) {
                break;
            }
            if t.elapsed() > Duration::from_secs(30) {
                bail!("update of {} not applied within 30 s", peers[k].name);
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        updates.push(t.elapsed());
        let old = peers[k].mac;
        peers[k].mac = new;
        // Let the pass finish (old FDB entry out, new in) before the next.
        let t2 = Instant::now();
        while sock.has_fdb(vx, old)? || !sock.has_fdb(vx, new)? {
            ensure!(
                t2.elapsed() < Duration::from_secs(30),
                "FDB of {} not updated",
                peers[k].name
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(250));
    }

    // (c) One host-IP change at a time, of a peer behind vxlan.1: until
    // its FDB entry sends to the new host (polled by asking for that one
    // entry: a dump of all N competed with the agent for the CPU).
    let mut host_ip_changes = Vec::new();
    for u in 0..UPDATES {
        let k = (u * 1009 + 29) % n;
        let new = Ipv4Addr::new(192, 168, 120 + (u / 250) as u8, 1 + (u % 250) as u8);
        set_host_ip(lab, &peers[k].name, new)?;
        let mac = peers[k].mac;
        host_ip_changes.push(until("host-IP change", || {
            Ok(sock.fdb_dst(vx, mac)? == Some(new))
        })?);
        peers[k].host_ip = new;
        std::thread::sleep(Duration::from_millis(250));
    }

    // One Node delete: until its neighbour and FDB entry are gone
    // (the route goes first, in the same pass).
    let k = n / 2;
    let t = Instant::now();
    api.delete_node(&peers[k].name)?;
    loop {
        if sock.neighbour(vx, peers[k].gw)?.is_none() && !sock.has_fdb(vx, peers[k].mac)? {
            break;
        }
        ensure!(
            t.elapsed() < Duration::from_secs(30),
            "delete of {} not applied within 30 s",
            peers[k].name
        );
        std::thread::sleep(Duration::from_micros(500));
    }
    let delete = t.elapsed();
    std::thread::sleep(Duration::from_millis(200));
    let after = counts(&sock, vx)?;
    ensure!(
        after == Some((n - 1, n - 1, n - 1)),
        "after the delete the overlay holds {after:?}"
    );

    // (d) A directly routed peer's host IP: its nexthop alone changes.
    let direct = if nexthops > 0 {
        Some(direct_host_ip_changes(lab, &sock, full)?)
    } else {
        None
    };
    let hwm_end = proc_status(pid, "VmHWM:")?;
    let rss_end = proc_status(pid, "VmRSS:")?;

    // Keep the log for a closer look.
    let kept = std::env::temp_dir().join(format!("mycni-bench-agent-{n}.log"));
    let _ = std::fs::copy(dir.join("agent.log"), &kept);

    let at = |v: &[Duration], p| percentile_duration(v, p).unwrap_or_default();
    let upd_med = at(&updates, 50);
    let upd_p90 = at(&updates, 90);
    let hip_med = at(&host_ip_changes, 50);
    let hip_p90 = at(&host_ip_changes, 90);
    let rss_peak = hwm_converged.max(hwm_end);
    let scale = n as f64 / 5000.0;
    let conv_target = TARGET_CONVERGE_S * scale;

    let mut text = String::new();
    let w = &mut text;
    let _ = writeln!(w);
    let node_bytes = serde_json::to_vec(&api.get_node(&peers[0].name))?.len();
    let _ = writeln!(
        w,
        "mycni-agent convergence, {n} peer Nodes ({}, {node_bytes} B of JSON each), 1-node lab, in-process API fixture, {} CPUs; peer routes {route_kind} ({nexthops} nexthops of protocol {PROTO})",
        if full {
            "kubelet-like: status, labels, managedFields"
        } else {
            "minimal: podCIDR and mycni annotations"
        },
        std::thread::available_parallelism().map_or(0, |p| p.get())
    );
    let _ = writeln!(
        w,
        "| measure | mycni-agent | target | agent/target | ip -batch, nexthops | agent/ip -batch |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|---|");
    let _ = writeln!(w, "| nodes | {n} | | | | |");
    let _ = writeln!(
        w,
        "| list-complete -> programmed (s) | {list_to_programmed:.3} | {conv_target:.2} | {:.2} | {:.3} | {:.2} |",
        list_to_programmed / conv_target,
        reference.as_secs_f64(),
        list_to_programmed / reference.as_secs_f64()
    );
    let _ = writeln!(
        w,
        "| start -> programmed (s) | {:.3} | | | {:.3} | {:.2} |",
        converged.as_secs_f64(),
        reference.as_secs_f64(),
        converged.as_secs_f64() / reference.as_secs_f64()
    );
    let _ = writeln!(
        w,
        "| ip -batch, routes via … onlink (s) | | | | {:.3} | {:.2} (nexthops/onlink) |",
        ref_onlink.took.as_secs_f64(),
        reference.as_secs_f64() / ref_onlink.took.as_secs_f64()
    );
    let _ = writeln!(
        w,
        "| host-IP change, vxlan.1 peer (FDB entry), median / p90 (ms, {UPDATES} runs) | {:.1} / {:.1} | {TARGET_HOST_IP_MS:.0} | {:.2} | | |",
        ms(hip_med),
        ms(hip_p90),
        ms(hip_med) / TARGET_HOST_IP_MS
    );
    if let Some((d, _)) = &direct {
        let (med, p90) = (at(d, 50), at(d, 90));
        let _ = writeln!(
            w,
            "| host-IP change, direct peer (its nexthop), median / p90 (ms, {} runs) | {:.1} / {:.1} | {TARGET_HOST_IP_MS:.0} | {:.2} | | |",
            d.len(),
            ms(med),
            ms(p90),
            ms(med) / TARGET_HOST_IP_MS
        );
    }
    let _ = writeln!(
        w,
        "| VTEP MAC change median / p90 (ms, {UPDATES} runs) | {:.1} / {:.1} | | | | |",
        ms(upd_med),
        ms(upd_p90)
    );
    let _ = writeln!(w, "| delete latency (ms) | {:.1} | | | | |", ms(delete));
    let _ = writeln!(
        w,
        "| idle CPU over {} s (%) | {:.2} | | | | |",
        IDLE.as_secs(),
        idle_cpu * 100.0
    );
    let _ = writeln!(
        w,
        "| peak RSS, VmHWM (MB) | {rss_peak:.1} | {TARGET_RSS_MB:.0} | {:.2} | | |",
        rss_peak / TARGET_RSS_MB
    );
    let _ = writeln!(w);
    let _ = writeln!(w, "details:");
    let _ = writeln!(
        w,
        "  convergence polled every {} ms ({polls} polls); the agent logged its list complete with nodes={listed_nodes}, {:.3} s after start",
        POLL.as_millis(),
        secs_between(started_wall, listed.at)
    );
    for p in passes.iter().take(8) {
        let text = p.text.split("reconciled overlay").nth(1).unwrap_or("");
        let _ = writeln!(
            w,
            "  pass logged at list+{:.3} s:{text}",
            secs_between(listed.at, p.at)
        );
    }
    let _ = writeln!(
        w,
        "  agent CPU until converged: {cpu_user:.2} s user + {cpu_sys:.2} s system (wall {:.2} s)",
        converged.as_secs_f64()
    );
    let _ = writeln!(
        w,
        "  RSS: VmHWM {hwm_converged:.1} MB / VmRSS {rss_converged:.1} MB at convergence; VmHWM {hwm_end:.1} MB / VmRSS {rss_end:.1} MB after updates and delete"
    );
    let _ = writeln!(
        w,
        "  idle at {n} peers: {runs:.0} reconcile passes in {} s, {:.1} ms each on average, agent CPU {:.2} %",
        IDLE.as_secs(),
        if runs > 0.0 {
            pass_secs * 1e3 / runs
        } else {
            0.0
        },
        idle_cpu * 100.0
    );
    let sorted = |v: &[Duration]| {
        let mut s = v.to_vec();
        s.sort();
        s.iter()
            .map(|d| format!("{:.1}", ms(*d)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let _ = writeln!(w, "  VTEP MAC change latencies (ms): {}", sorted(&updates));
    let _ = writeln!(
        w,
        "  host-IP change latencies, vxlan.1 peers (ms): {}",
        sorted(&host_ip_changes)
    );
    let _ = match &direct {
        Some((d, same_id)) => writeln!(
            w,
            "  host-IP change latencies, direct peer (ms): {}; its nexthop kept its ID throughout: {same_id}",
            sorted(d)
        ),
        None => writeln!(
            w,
            "  no direct-peer host-IP changes: the agent made no nexthops"
        ),
    };
    for (what, v, mid) in [
        ("nexthops", &refs.nexthop, ref_nh),
        ("routes via … onlink", &refs.onlink, ref_onlink),
    ] {
        let _ = writeln!(
            w,
            "  ip -batch reference, {what}, runs (s): {}; median run by file: {}",
            refs_fmt(v),
            mid.phases
                .iter()
                .map(|(f, d)| format!("{f} {:.3}", d.as_secs_f64()))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let _ = writeln!(w, "  agent log kept at {}", kept.display());
    let figures = Figures {
        nodes: n,
        list_to_programmed_s: list_to_programmed,
        ip_batch_s: reference.as_secs_f64(),
        ip_batch_onlink_s: ref_onlink.took.as_secs_f64(),
        update_ms: ms(upd_med),
        host_ip_ms: ms(hip_med),
        delete_ms: ms(delete),
        rss_mb: rss_peak,
    };
    Ok((text, figures))
}
