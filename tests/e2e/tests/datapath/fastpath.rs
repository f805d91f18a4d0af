//! The eBPF fast path in the lab (2 nodes x 2 pods, real agents, real
//! kernel): the same connectivity as the kernel path; an established stream
//! almost entirely fast-pathed while its SYN and FIN are not; kube-proxy-like
//! Services (DNAT plus the INVALID drop) that still work because their flows
//! stay on the kernel path; and streams that survive detaching every program
//! and restarting the agent.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use mycni_lab::{ECHO_PORT, Lab, Pod};
use mycni_testkit::sh;
use serde_json::Value;

use crate::common;

use common::{delta, ns_sh};

/// Packets of pods the programs left to the kernel (the node's own traffic
/// on the underlay, `kernel_underlay_other`, is no pod's).
fn kernel_total(after: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>) -> u64 {
    after
        .keys()
        .filter(|k| k.starts_with("kernel_") && *k != "kernel_underlay_other")
        .map(|k| delta(after, before, k))
        .sum()
}

/// Fast-pathed packets that still went through vxlan.1, either way.
fn crossed_vxlan(after: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>) -> u64 {
    after
        .keys()
        .filter(|k| k.starts_with("fast_vxlan_") || *k == "fast_decap")
        .map(|k| delta(after, before, k))
        .sum()
}

/// Runs one iperf3 test from `client` to `target` against a one-shot
/// iperf3 server on `server_port` in `server`'s netns, and returns the
/// bytes sent and the bytes the receiver reported (which can lag the
/// sender's count by the last interval).
fn iperf3(
    server: &Pod,
    server_port: u16,
    client: &Pod,
    target: SocketAddr,
    how: &[&str],
) -> Result<(u64, u64)> {
    ns_sh(
        &server.ns,
        "iperf3",
        &["-s", "-D", "-1", "-p", &server_port.to_string()],
    )?;
    std::thread::sleep(Duration::from_millis(300));
    let (ip, port) = (target.ip().to_string(), target.port().to_string());
    let mut args = vec!["-c", ip.as_str(), "-p", port.as_str(), "-J"];
    args.extend_from_slice(how);
    let out = ns_sh(&client.ns, "iperf3", &args)?;
    let v: Value = serde_json::from_str(&out).context("iperf3 -J output")?;
    ensure!(v.get("error").is_none(), "iperf3 failed: {}", v["error"]);
    let get = |k: &str| {
        v["end"][k]["bytes"]
            .as_u64()
            .with_context(|| format!("no {k} bytes in iperf3 output"))
    };
    Ok((get("sum_sent")?, get("sum_received")?))
}

/// The most a finished iperf3 test can leave uncounted at its receiver:
/// what the client's send buffer and the server's receive buffer can hold
/// (iperf3 stops reading when the client says it is done, so its
/// `sum_received` lags `sum_sent` by up to both; 32 MB receive buffers
/// made that 9 MB of 200 MB on a loaded 2-core run).
fn unread_bound(server: &Pod, client: &Pod) -> Result<u64> {
    let max = |ns: &str, which: &str| -> Result<u64> {
        let v = ns_sh(ns, "cat", &[&format!("/proc/sys/net/ipv4/tcp_{which}")])?;
        v.split_whitespace()
            .nth(2)
            .and_then(|m| m.parse().ok())
            .with_context(|| format!("tcp_{which} in {ns}: {v:?}"))
    };
    Ok(max(&client.ns, "wmem")? + max(&server.ns, "rmem")?)
}

fn pods_by_node(l: &Lab) -> Result<(Pod, Pod, Pod)> {
    let pods = l.pods()?;
    let on = |n: usize, j: usize| {
        pods.iter()
            .find(|p| p.node == n && p.index == j)
            .cloned()
            .with_context(|| format!("no pod {j} on node {n}"))
    };
    Ok((on(1, 1)?, on(1, 2)?, on(2, 1)?))
}

/// Packets kube-proxy's INVALID rule dropped on node `i`.
fn invalid_drops(l: &Lab, i: usize) -> Result<u64> {
    let out = ns_sh(
        &l.spec.node_name(i),
        "iptables",
        &["-L", "FORWARD", "-v", "-x", "-n"],
    )?;
    Ok(out
        .lines()
        .filter(|line| line.contains("ctstate INVALID"))
        .filter_map(|line| line.split_whitespace().next()?.parse::<u64>().ok())
        .sum())
}

/// kube-proxy's part on every node: `vip:port` DNATed to `backend`, and
/// INVALID dropped in FORWARD.
fn add_service(l: &Lab, vip: &str, port: u16, backend: SocketAddr) -> Result<()> {
    for i in 1..=l.spec.nodes {
        let ns = l.spec.node_name(i);
        ns_sh(
            &ns,
            "iptables",
            &[
                "-t",
                "nat",
                "-A",
                "PREROUTING",
                "-d",
                vip,
                "-p",
                "tcp",
                "--dport",
                &port.to_string(),
                "-j",
                "DNAT",
                "--to-destination",
                &backend.to_string(),
            ],
        )?;
        drop_invalid(l, i)?;
    }
    Ok(())
}

/// kube-proxy's `-m conntrack --ctstate INVALID -j DROP` in FORWARD on
/// node `i` (once).
fn drop_invalid(l: &Lab, i: usize) -> Result<()> {
    let ns = l.spec.node_name(i);
    if ns_sh(&ns, "iptables", &["-S", "FORWARD"])?.contains("INVALID") {
        return Ok(());
    }
    let rule = ["-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP"];
    let mut args = vec!["-I", "FORWARD"];
    args.extend(rule);
    ns_sh(&ns, "iptables", &args).map(drop)
}

#[test]
fn fast_path_forwards_established_flows_and_leaves_control_and_nat_to_the_kernel() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let mut t = common::lab(2, 2)?;
    let l = &mut t.0;
    let (a, a2, b) = pods_by_node(l)?;

    let (fast_table, failed) = l.matrix()?;
    assert_eq!(
        failed, 0,
        "unreachable pairs on the fast path:\n{fast_table}"
    );
    let c = l.counters(1)?;
    for k in ["fast_encap", "fast_local", "fast_tc_decap"] {
        assert!(c.get(k).copied().unwrap_or(0) > 0, "{k} never used: {c:?}");
    }

    // An established stream takes the fast path; its SYN and FIN do not.
    let (b1, b2) = (l.counters(1)?, l.counters(2)?);
    let (_, bytes) = iperf3(&b, 5201, &a, SocketAddr::from((b.ip, 5201)), &["-t", "2"])?;
    let (a1, a2c) = (l.counters(1)?, l.counters(2)?);
    let fast = delta(&a1, &b1, "fast_encap");
    let slow = kernel_total(&a1, &b1);
    let share = fast as f64 / (fast + slow).max(1) as f64;
    let crossed = crossed_vxlan(&a1, &b1) + crossed_vxlan(&a2c, &b2);
    eprintln!(
        "iperf3 {bytes} bytes; node1 from-pod: {fast} encapsulated in tc, {slow} kernel ({:.2}% fast); node2: {} fast_tc_decap, {} kernel_tcp_control; {crossed} fast packets crossed vxlan.1",
        share * 100.0,
        delta(&a2c, &b2, "fast_tc_decap"),
        delta(&a2c, &b2, "kernel_tcp_control"),
    );
    assert!(share >= 0.95, "only {:.2}% fast: {a1:?}", share * 100.0);
    // Datapath v2: neither way through vxlan.1 (nor the host's UDP stack).
    assert!(
        crossed * 100 <= fast,
        "{crossed} fast packets crossed vxlan.1: {a1:?} / {a2c:?}"
    );
    assert!(
        delta(&a2c, &b2, "fast_tc_decap") * 100 >= fast * 95,
        "node 2 did not unwrap the stream in tc: {a2c:?}"
    );
    // SYN and FIN of iperf3's control and data connections: the client's on
    // node 1, the server's SYN-ACKs and FINs on node 2.
    assert!(delta(&a1, &b1, "kernel_tcp_control") >= 4, "{a1:?}");
    assert!(delta(&a2c, &b2, "kernel_tcp_control") >= 4, "{a2c:?}");

    // Services: one backend on the other node, one on the client's node.
    let cases = [
        ("remote backend", "10.96.0.10", b.clone()),
        ("local backend", "10.96.0.11", a2.clone()),
    ];
    for (what, vip, backend) in &cases {
        add_service(l, vip, 80, SocketAddr::from((backend.ip, ECHO_PORT)))?;
        add_service(l, vip, 81, SocketAddr::from((backend.ip, 5202)))?;
        let before = l.counters(1)?;
        let addr = format!("{vip}:80");
        for _ in 0..5 {
            ns_sh(
                &a.ns,
                &l.spec.bins.lab.to_string_lossy(),
                &["tcp-probe", &addr],
            )
            .with_context(|| format!("Service connection to {addr} ({what})"))?;
        }
        let (sent, moved) = iperf3(
            backend,
            5202,
            &a,
            SocketAddr::from((vip.parse::<Ipv4Addr>()?, 81)),
            &["-n", "300M"],
        )
        .with_context(|| format!("300 MB through the Service ({what})"))?;
        let after = l.counters(1)?;
        let nat = delta(&after, &before, "kernel_nat");
        eprintln!(
            "Service {vip} ({what}): {moved} bytes; node1 kernel_nat +{nat}, kernel_unknown_dest +{}, fast +{}",
            delta(&after, &before, "kernel_unknown_dest"),
            delta(&after, &before, "fast_encap")
                + delta(&after, &before, "fast_local")
                + delta(&after, &before, "fast_decap"),
        );
        assert!(sent >= 300 << 20, "{what}: only {sent} bytes sent");
        let unread = unread_bound(backend, &a)?;
        assert!(
            moved + unread >= sent,
            "{what}: {moved} of {sent} bytes arrived (up to {unread} may be unread)"
        );
        // The backend's replies meet the client node's NATed conntrack entry
        // and are left to the kernel to un-NAT.
        // (How many replies there are depends on how many ACKs the sender's
        // GRO merged: 1,000-5,000 seen for 300 MB.)
        assert!(
            nat >= 100,
            "{what}: replies not kept on the kernel path: {after:?}"
        );
    }
    for i in 1..=2 {
        assert_eq!(invalid_drops(l, i)?, 0, "INVALID drops on node {i}");
    }

    // The operator's view of the same state: told where the pins are, and
    // not told (found from the programs attached in node 1's namespace;
    // the lab's three agents pin under three directories of one bpffs).
    let bpffs = l.spec.bpffs().join("node1");
    let agent = l.spec.bins.agent.to_string_lossy().into_owned();
    let pinned = ns_sh(
        &l.spec.node_name(1),
        &agent,
        &["inspect", "--bpffs", &bpffs.to_string_lossy()],
    )?;
    let attached = ns_sh(&l.spec.node_name(1), &agent, &["inspect"])?;
    eprintln!("mycni-agent inspect on node 1:\n{attached}");
    assert!(
        attached.contains("fast path attached to vxlan.1"),
        "{attached}"
    );
    for inspect in [&pinned, &attached] {
        for want in [
            a.ip.to_string(),
            a2.ip.to_string(),
            "10.244.2.0/24".to_string(),
            "mycni_from_vxlan".to_string(),
            "mycni_from_underlay".to_string(),
            "fast_encap".to_string(),
            "kernel_nat".to_string(),
        ] {
            assert!(inspect.contains(&want), "inspect lacks {want}:\n{inspect}");
        }
    }

    // The kernel path alone gives the same matrix.
    l.set_datapath("kernel")?;
    let (kernel_table, failed) = l.matrix()?;
    assert_eq!(
        failed, 0,
        "unreachable pairs on the kernel path:\n{kernel_table}"
    );
    assert_eq!(fast_table, kernel_table);
    Ok(())
}

#[test]
fn streams_survive_detaching_every_program_and_restarting_the_agent_and_maps_stay_kernel_backed()
-> Result<()> {
    let _turn = crate::turn(module_path!());
    let mut t = common::lab(2, 1)?;
    let l = &mut t.0;
    let pods = l.pods()?;
    let src = pods.iter().find(|p| p.node == 1).context("pod on node 1")?;
    let dst = pods.iter().find(|p| p.node == 2).context("pod on node 2")?;
    for i in 1..=2 {
        drop_invalid(l, i)?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let stream = common::echo_stream(&src.ns, SocketAddr::from((dst.ip, ECHO_PORT)), stop.clone());
    let fast_now = |l: &Lab| -> u64 {
        l.counters(1)
            .map_or(0, |c| c.get("fast_encap").copied().unwrap_or(0))
    };
    std::thread::sleep(Duration::from_millis(500));
    let f0 = fast_now(l);
    std::thread::sleep(Duration::from_millis(500));
    ensure!(fast_now(l) > f0, "the stream is not on the fast path");

    // Every program detached: the kernel path carries the stream on.
    l.set_datapath("kernel")?;
    std::thread::sleep(Duration::from_millis(500));
    // Back to the fast path: a fresh load picks the stream up again.
    l.set_datapath("ebpf")?;
    std::thread::sleep(Duration::from_millis(500));
    let f1 = fast_now(l);
    std::thread::sleep(Duration::from_millis(500));
    ensure!(
        fast_now(l) > f1,
        "the fast path did not resume after re-enabling it"
    );

    // An agent restart swaps the program in place: forwarding never stops.
    l.restart_agent(1)?;
    l.restart_agent(2)?;
    std::thread::sleep(Duration::from_millis(500));
    let f2 = fast_now(l);
    std::thread::sleep(Duration::from_millis(500));
    ensure!(
        fast_now(l) > f2,
        "the fast path did not resume after the restart"
    );

    // The restarted agent turned the next-hop cache on, and a routing
    // change in the node makes every cached next hop stale at once.
    let pin = l.spec.pin_dir(1);
    let generation = mycni_agent::datapath::NexthopGen::open(&pin)?;
    let g0 = generation.current()?;
    ensure!(g0 != 0, "the agent left the next-hop cache off");
    let ns1 = l.spec.node_name(1);
    ns_sh(&ns1, "ip", &["route", "add", "192.0.2.77/32", "dev", "lo"])?;
    let t0 = std::time::Instant::now();
    while generation.current()? == g0 {
        ensure!(
            t0.elapsed() < Duration::from_secs(1),
            "a route change left the next-hop cache's generation at {g0}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    eprintln!(
        "next-hop generation {g0} -> {} {:?} after a route change",
        generation.current()?,
        t0.elapsed()
    );
    ns_sh(&ns1, "ip", &["route", "del", "192.0.2.77/32", "dev", "lo"])?;

    // Entries the kernel does not back are removed by the next full pass.
    let map = |m: &str| pin.join(m).to_string_lossy().into_owned();
    sh(
        "bpftool",
        &[
            "map",
            "update",
            "pinned",
            &map("mycni_local"),
            "key",
            "10",
            "244",
            "1",
            "99",
            "value",
            "1",
            "0",
            "0",
            "0",
            "2",
            "0",
            "0",
            "0",
            "0",
            "1",
            "2",
            "0",
            "0",
            "0",
            "0",
            "2",
        ],
    )?;
    sh(
        "bpftool",
        &[
            "map",
            "update",
            "pinned",
            &map("mycni_remote"),
            "key",
            "24",
            "0",
            "0",
            "0",
            "10",
            "244",
            "9",
            "0",
            "value",
            "2",
            "0",
            "0",
            "0",
            "0",
            "9",
            "0",
            "0",
            "1",
            "2",
            "3",
            "4",
        ],
    )?;
    let dump = |m: &str| sh("bpftool", &["-j", "map", "dump", "pinned", &map(m)]);
    ensure!(
        dump("mycni_local")?.contains("99"),
        "bogus local entry not written"
    );
    let t0 = std::time::Instant::now();
    loop {
        let (local, remote) = (dump("mycni_local")?, dump("mycni_remote")?);
        if !local.contains("[10,244,1,99]") && !remote.contains("[10,244,9,0]") {
            break;
        }
        ensure!(
            t0.elapsed() < Duration::from_secs(5),
            "unbacked map entries survive: {local} {remote}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "unbacked map entries removed after {} ms",
        t0.elapsed().as_millis()
    );

    stop.store(true, Ordering::Relaxed);
    let (rounds, longest) = stream
        .join()
        .map_err(|_| anyhow::anyhow!("stream thread panicked"))??;
    eprintln!(
        "stream across detach, re-attach and agent restarts: {rounds} round trips, longest gap {} ms",
        longest.as_millis()
    );
    assert!(rounds > 200, "only {rounds} round trips");
    assert!(longest < Duration::from_secs(1), "gap of {longest:?}");
    for i in 1..=2 {
        assert_eq!(invalid_drops(l, i)?, 0, "INVALID drops on node {i}");
    }
    Ok(())
}

#[test]
fn a_program_the_kernel_rejects_leaves_a_working_kernel_path_and_says_why() -> Result<()> {
    let _turn = crate::turn(module_path!());
    // The real object with its license changed: the verifier refuses its
    // GPL-only helpers and kfuncs, as it would refuse any program it cannot
    // accept on some kernel.
    let object = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../target/ebpf/bpfel-unknown-none/release/mycni-ebpf"
    ))
    .context("the eBPF object (run via `cargo xtask test`)")?;
    let lic = b"Dual MIT/GPL\0";
    let at = object
        .windows(lic.len())
        .position(|w| w == lic)
        .context("no license string in the object")?;
    let mut bad = object.clone();
    bad[at..at + lic.len()].copy_from_slice(b"Proprietary!\0");
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("rejected.o");
    std::fs::write(&path, &bad)?;

    let t = common::lab_with(2, 1, &["--ebpf-object", &path.to_string_lossy()])?;
    let l = &t.0;
    let (table, failed) = l.matrix()?;
    assert_eq!(
        failed, 0,
        "kernel path incomplete after a failed load:\n{table}"
    );
    let m = l.metrics(1)?;
    assert!(m.lines().any(|x| x == "mycni_datapath_ebpf 0"), "{m}");
    assert!(
        m.lines().any(|x| x == "mycni_ebpf_load_failures_total 1"),
        "{m}"
    );
    let status = l.status()?;
    assert!(
        status.contains("datapath kernel: eBPF load failed"),
        "{status}"
    );
    let log = std::fs::read_to_string(l.spec.node_dir(1).join("agent.log"))?;
    assert!(
        log.contains("GPL"),
        "the agent's log lacks the verifier's reason:\n{log}"
    );
    eprintln!("{status}");
    Ok(())
}

#[test]
fn ipv6_streams_take_the_fast_path_between_nodes_and_within_one() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let mut t = common::lab_stack(2, 2, mycni_lab::Stack::Dual, &[])?;
    let l = &mut t.0;
    let (a, a2, b) = pods_by_node(l)?;
    let (Some(a26), Some(b6)) = (a2.ip6, b.ip6) else {
        anyhow::bail!("a dual-stack lab's pods without IPv6 addresses: {a2:?} {b:?}");
    };

    // Across nodes: encapsulated and decapsulated in tc, as for IPv4.
    let (b1, b2) = (l.counters(1)?, l.counters(2)?);
    let (fb1, fb2) = (l.family_counters(1)?, l.family_counters(2)?);
    let (_, bytes) = iperf3(&b, 5201, &a, SocketAddr::from((b6, 5201)), &["-t", "2"])?;
    let (a1, a2c) = (l.counters(1)?, l.counters(2)?);
    let (fa1, fa2) = (l.family_counters(1)?, l.family_counters(2)?);
    let fast = delta(&a1, &b1, "fast_encap");
    let slow = kernel_total(&a1, &b1);
    let share = fast as f64 / (fast + slow).max(1) as f64;
    let crossed = crossed_vxlan(&a1, &b1) + crossed_vxlan(&a2c, &b2);
    eprintln!(
        "iperf3 over IPv6, {bytes} bytes; node1 from-pod: {fast} encapsulated in tc, {slow} kernel ({:.2}% fast); node2: {} fast_tc_decap; {crossed} fast packets crossed vxlan.1",
        share * 100.0,
        delta(&a2c, &b2, "fast_tc_decap"),
    );
    assert!(share >= 0.95, "only {:.2}% fast: {a1:?}", share * 100.0);
    assert!(
        crossed * 100 <= fast,
        "{crossed} fast packets crossed vxlan.1: {a1:?} / {a2c:?}"
    );
    assert!(
        delta(&a2c, &b2, "fast_tc_decap") * 100 >= fast * 95,
        "node 2 did not unwrap the IPv6 stream in tc: {a2c:?}"
    );
    assert!(delta(&a1, &b1, "kernel_tcp_control") >= 4, "{a1:?}");
    // Counted as IPv6 at both ends, though node 2 sees it inside IPv4
    // VXLAN: the per-family share the lab reports.
    let row = |c: &mycni_lab::FamilyCounters, f: &str, p: &str| -> u64 {
        c.get(f).and_then(|r| r.get(p)).copied().unwrap_or(0)
    };
    let (v6_encap, v4_encap) = (
        row(&fa1, "ipv6", "fast_encap").saturating_sub(row(&fb1, "ipv6", "fast_encap")),
        row(&fa1, "ipv4", "fast_encap").saturating_sub(row(&fb1, "ipv4", "fast_encap")),
    );
    let v6_decap =
        row(&fa2, "ipv6", "fast_tc_decap").saturating_sub(row(&fb2, "ipv6", "fast_tc_decap"));
    let share6 = mycni_lab::PathShare::between_family(&fb1, &fa1, mycni_lab::IpFamily::V6);
    eprintln!(
        "by family: node1 ipv6 fast_encap {v6_encap}, ipv4 {v4_encap}; node2 ipv6 fast_tc_decap {v6_decap}; node1 ipv6: {}",
        share6.describe()
    );
    assert!(
        v6_encap * 100 >= fast * 95 && v4_encap * 100 <= v6_encap,
        "{fa1:?}"
    );
    assert!(v6_decap * 100 >= v6_encap * 95, "{fa2:?}");
    assert!(share6.fast_pct().is_some_and(|p| p >= 95.0), "{share6:?}");

    // Within node 1: straight into the other pod.
    let b1 = l.counters(1)?;
    let (_, bytes) = iperf3(&a2, 5203, &a, SocketAddr::from((a26, 5203)), &["-t", "1"])?;
    let a1 = l.counters(1)?;
    let fast = delta(&a1, &b1, "fast_local");
    let slow = kernel_total(&a1, &b1);
    eprintln!("iperf3 over IPv6 within node 1, {bytes} bytes: {fast} fast_local, {slow} kernel");
    assert!(
        fast as f64 >= 0.95 * (fast + slow) as f64,
        "IPv6 within a node not fast: {a1:?}"
    );
    Ok(())
}

/// [`add_service`] for IPv6 (ip6tables), on every node.
fn add_service6(l: &Lab, vip: &str, port: u16, backend: SocketAddr) -> Result<()> {
    for i in 1..=l.spec.nodes {
        let ns = l.spec.node_name(i);
        let (port, to) = (port.to_string(), backend.to_string());
        ns_sh(
            &ns,
            "ip6tables",
            &[
                "-t",
                "nat",
                "-A",
                "PREROUTING",
                "-d",
                vip,
                "-p",
                "tcp",
                "--dport",
                &port,
                "-j",
                "DNAT",
                "--to-destination",
                &to,
            ],
        )?;
        if !ns_sh(&ns, "ip6tables", &["-S", "FORWARD"])?.contains("INVALID") {
            ns_sh(
                &ns,
                "ip6tables",
                &[
                    "-I",
                    "FORWARD",
                    "-m",
                    "conntrack",
                    "--ctstate",
                    "INVALID",
                    "-j",
                    "DROP",
                ],
            )?;
        }
    }
    Ok(())
}

/// Packets the IPv6 INVALID rule dropped on node `i`.
fn invalid_drops6(l: &Lab, i: usize) -> Result<u64> {
    let out = ns_sh(
        &l.spec.node_name(i),
        "ip6tables",
        &["-L", "FORWARD", "-v", "-x", "-n"],
    )?;
    Ok(out
        .lines()
        .filter(|line| line.contains("ctstate INVALID"))
        .filter_map(|line| line.split_whitespace().next()?.parse::<u64>().ok())
        .sum())
}

#[test]
fn ipv6_services_keep_working_with_their_flows_on_the_kernel_path() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let mut t = common::lab_stack(2, 2, mycni_lab::Stack::Dual, &[])?;
    let l = &mut t.0;
    let (a, a2, b) = pods_by_node(l)?;
    let (Some(a26), Some(b6)) = (a2.ip6, b.ip6) else {
        anyhow::bail!("a dual-stack lab's pods without IPv6 addresses: {a2:?} {b:?}");
    };
    let cases = [
        ("remote backend", "fd00:96::10", b.clone(), b6),
        ("same-node backend", "fd00:96::11", a2.clone(), a26),
    ];
    for (what, vip, backend, backend6) in &cases {
        add_service6(l, vip, 81, SocketAddr::from((*backend6, 5202)))?;
        let before = l.counters(1)?;
        let (sent, moved) = iperf3(
            backend,
            5202,
            &a,
            SocketAddr::from((vip.parse::<std::net::Ipv6Addr>()?, 81)),
            &["-n", "200M"],
        )
        .with_context(|| format!("200 MB through the IPv6 Service ({what})"))?;
        let after = l.counters(1)?;
        let nat = delta(&after, &before, "kernel_nat");
        eprintln!("IPv6 Service {vip} ({what}): {moved} bytes; node1 kernel_nat +{nat}");
        assert!(sent >= 200 << 20, "{what}: only {sent} bytes sent");
        let unread = unread_bound(backend, &a)?;
        assert!(
            moved + unread >= sent,
            "{what}: {moved} of {sent} bytes arrived (up to {unread} may be unread)"
        );
        assert!(
            nat >= 100,
            "{what}: replies not kept on the kernel path: {after:?}"
        );
    }
    for i in 1..=2 {
        assert_eq!(invalid_drops6(l, i)?, 0, "IPv6 INVALID drops on node {i}");
    }
    Ok(())
}
