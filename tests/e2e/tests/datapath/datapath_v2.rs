//! Datapath v2 in the lab (real agents, real kernel): nodes with and
//! without the tc encapsulation talk to each other both ways, a stream
//! survives nodes switching datapath under it, data stays intact with every
//! offload on or off, VXLAN from a host that is no peer never reaches a pod,
//! and direct routing forwards without encapsulation.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use mycni_common::net::Mac;
use mycni_lab::{ECHO_PORT, Lab, Pod};
use mycni_testkit::in_netns;

use crate::common;

use common::{delta, ns_sh};

fn pod_on(l: &Lab, node: usize) -> Result<Pod> {
    l.pods()?
        .into_iter()
        .find(|p| p.node == node)
        .with_context(|| format!("no pod on node {node}"))
}

/// Restarts node `i`'s agent with `extra` appended to the lab's agent
/// arguments (clap takes the last of a repeated flag), then restores the
/// lab's arguments for later restarts.
fn restart_with(l: &mut Lab, i: usize, extra: &[&str]) -> Result<()> {
    let saved = l.spec.agent_args.clone();
    l.spec
        .agent_args
        .extend(extra.iter().map(|a| a.to_string()));
    let r = l.restart_agent(i);
    l.spec.agent_args = saved;
    r?;
    for _ in 0..100 {
        if l.readyz(i).is_ok_and(|r| r.contains("overlay up")) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    anyhow::bail!("node {i}'s agent not ready after restart with {extra:?}")
}

/// Sends `bytes` of a known pattern over one TCP connection to the pod's
/// echo server and checks every byte that comes back.
fn bulk_echo(from: &Pod, to: SocketAddr, bytes: usize) -> Result<()> {
    in_netns(&from.ns, move || -> Result<()> {
        let mut c = TcpStream::connect_timeout(&to, Duration::from_secs(2))?;
        c.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut r = c.try_clone()?;
        let reader = std::thread::spawn(move || -> Result<()> {
            let mut buf = vec![0u8; 65536];
            let mut seen = 0usize;
            while seen < bytes {
                let n = r.read(&mut buf)?;
                ensure!(n > 0, "connection closed after {seen} bytes");
                for (k, b) in buf[..n].iter().enumerate() {
                    let want = ((seen + k) % 251) as u8;
                    ensure!(*b == want, "byte {} is {b}, sent {want}", seen + k);
                }
                seen += n;
            }
            Ok(())
        });
        let chunk: Vec<u8> = (0..65536 * 251).map(|k| (k % 251) as u8).collect();
        let mut sent = 0usize;
        while sent < bytes {
            let n = (bytes - sent).min(65536 * 250);
            // Offsets stay aligned with the pattern: chunk lengths are
            // multiples of 251.
            c.write_all(&chunk[sent % 251..sent % 251 + n])?;
            sent += n;
        }
        reader
            .join()
            .map_err(|_| anyhow::anyhow!("reader panicked"))??;
        Ok(())
    })?
}

#[test]
fn mixed_nodes_talk_both_ways_and_a_stream_survives_switching() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let mut t = common::lab(2, 1)?;
    let l = &mut t.0;
    let (a, b) = (pod_on(l, 1)?, pod_on(l, 2)?);
    let stop = Arc::new(AtomicBool::new(false));
    let stream = common::echo_stream(&a.ns, SocketAddr::from((b.ip, ECHO_PORT)), stop.clone());
    std::thread::sleep(Duration::from_millis(300));

    for (what, node2) in [
        ("node 2 on the kernel path", &["--datapath", "kernel"][..]),
        (
            "node 2 handing remote traffic to vxlan.1",
            &["--tc-encap", "false"][..],
        ),
        ("both encapsulating in tc", &[][..]),
    ] {
        restart_with(l, 2, node2)?;
        let (b1, b2) = (l.counters(1)?, l.counters(2).unwrap_or_default());
        let (table, failed) = l.matrix()?;
        ensure!(failed == 0, "{what}: unreachable pairs\n{table}");
        bulk_echo(&a, SocketAddr::from((b.ip, ECHO_PORT)), 4 << 20)
            .with_context(|| format!("{what}: 4 MB node 1 -> node 2"))?;
        bulk_echo(&b, SocketAddr::from((a.ip, ECHO_PORT)), 4 << 20)
            .with_context(|| format!("{what}: 4 MB node 2 -> node 1"))?;
        let (a1, a2) = (l.counters(1)?, l.counters(2).unwrap_or_default());
        let encap1 = delta(&a1, &b1, "fast_encap");
        let decap1 = delta(&a1, &b1, "fast_tc_decap");
        eprintln!(
            "{what}: node 1 fast_encap +{encap1}, fast_tc_decap +{decap1}; node 2 fast_encap +{}, fast_vxlan_no_encap +{}, fast_tc_decap +{}",
            delta(&a2, &b2, "fast_encap"),
            delta(&a2, &b2, "fast_vxlan_no_encap"),
            delta(&a2, &b2, "fast_tc_decap"),
        );
        // Node 1 wraps in tc whatever node 2 runs; what node 2 sends, by
        // its kernel or its program, node 1 unwraps in tc (the same bytes).
        ensure!(encap1 > 0, "{what}: node 1 did not encapsulate in tc");
        ensure!(decap1 > 0, "{what}: node 1 did not decapsulate in tc");
    }
    stop.store(true, Ordering::Relaxed);
    let (rounds, longest) = stream
        .join()
        .map_err(|_| anyhow::anyhow!("stream panicked"))??;
    eprintln!("stream across the switches: {rounds} round trips, longest gap {longest:?}");
    ensure!(
        longest < Duration::from_secs(2),
        "stream stalled {longest:?}"
    );
    Ok(())
}

/// `ethtool -K` on an interface in a namespace.
fn offload(ns: &str, dev: &str, features: &[&str], on: bool) -> Result<()> {
    let v = if on { "on" } else { "off" };
    let mut args = vec!["-K", dev];
    for f in features {
        args.extend([*f, v]);
    }
    ns_sh(ns, "ethtool", &args).map(drop)
}

fn csum_errors(ns: &str) -> Result<u64> {
    let out = ns_sh(ns, "nstat", &["-az", "TcpInCsumErrors", "UdpInCsumErrors"])?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum())
}

#[test]
fn data_stays_intact_with_every_offload_on_or_off() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let mut t = common::lab(2, 1)?;
    let l = &mut t.0;
    let (a, b) = (pod_on(l, 1)?, pod_on(l, 2)?);
    let seg = ["tso", "gso", "gro"];
    let csum = ["tx-checksumming", "rx-checksumming"];
    // The pod's eth0 and its host veth, and each node's underlay.
    let ends = |p: &Pod| -> Vec<(String, String)> {
        vec![
            (p.ns.clone(), "eth0".to_string()),
            (
                l.spec.node_name(p.node),
                host_veth(l, p).unwrap_or_default(),
            ),
            (l.spec.node_name(p.node), "eth0".to_string()),
        ]
    };
    let all: Vec<(String, String)> = ends(&a).into_iter().chain(ends(&b)).collect();
    for (what, seg_on, csum_on) in [
        ("all on", true, true),
        ("segmentation offloads off", false, true),
        ("checksum offloads off", true, false),
        ("all off", false, false),
    ] {
        for (ns, dev) in &all {
            offload(ns, dev, &seg, seg_on)?;
            offload(ns, dev, &csum, csum_on)?;
        }
        let (b1, e1a, e1b) = (l.counters(1)?, csum_errors(&a.ns)?, csum_errors(&b.ns)?);
        bulk_echo(&a, SocketAddr::from((b.ip, ECHO_PORT)), 16 << 20)
            .with_context(|| format!("{what}: 16 MB echoed"))?;
        let a1 = l.counters(1)?;
        let errs = csum_errors(&a.ns)? - e1a + csum_errors(&b.ns)? - e1b;
        eprintln!(
            "{what}: 16 MB echoed intact; node 1 fast_encap +{}, fast_tc_decap +{}; checksum errors {errs}",
            delta(&a1, &b1, "fast_encap"),
            delta(&a1, &b1, "fast_tc_decap")
        );
        ensure!(errs == 0, "{what}: {errs} checksum errors in the pods");
        ensure!(
            delta(&a1, &b1, "fast_encap") > 0 && delta(&a1, &b1, "fast_tc_decap") > 0,
            "{what}: not on the tc encap path"
        );
    }
    Ok(())
}

/// The host-side veth of pod `p`: the interface in the node's namespace whose
/// route to the pod's IP the plugin made.
fn host_veth(l: &Lab, p: &Pod) -> Result<String> {
    let out = ns_sh(
        &l.spec.node_name(p.node),
        "ip",
        &["route", "get", &p.ip.to_string()],
    )?;
    out.split_whitespace()
        .skip_while(|w| *w != "dev")
        .nth(1)
        .map(str::to_string)
        .context("no dev in ip route get")
}

/// VXLAN carrying a UDP datagram to `pod` on `port`, as a peer would send
/// it to `vtep_mac`, from whatever address the socket has.
fn vxlan_datagram(
    vtep_mac: [u8; 6],
    pod: std::net::Ipv4Addr,
    src: std::net::Ipv4Addr,
    port: u16,
) -> Vec<u8> {
    let payload = b"injected";
    let mut udp = Vec::new();
    udp.extend_from_slice(&40000u16.to_be_bytes());
    udp.extend_from_slice(&port.to_be_bytes());
    udp.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(payload);
    let tot = (20 + udp.len()) as u16;
    let mut ip = vec![0x45, 0];
    ip.extend_from_slice(&tot.to_be_bytes());
    ip.extend_from_slice(&[0, 1, 0, 0, 64, 17, 0, 0]);
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&pod.octets());
    let mut sum: u32 = ip
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    ip.extend_from_slice(&udp);
    let mut f = vec![0x08, 0, 0, 0, 0, 0, 1, 0];
    f.extend_from_slice(&vtep_mac);
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x99]);
    f.extend_from_slice(&[0x08, 0x00]);
    f.extend_from_slice(&ip);
    f
}

fn vtep_mac(l: &Lab, i: usize) -> Result<[u8; 6]> {
    let out = ns_sh(
        &l.spec.node_name(i),
        "cat",
        &["/sys/class/net/vxlan.1/address"],
    )?;
    let mac: Mac = out
        .trim()
        .parse()
        .with_context(|| format!("bad MAC {:?} on vxlan.1", out.trim()))?;
    Ok(mac.octets())
}

#[test]
fn vxlan_from_a_stranger_never_reaches_a_pod_on_the_fast_path() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let mut t = common::lab(2, 1)?;
    let l = &mut t.0;
    let a = pod_on(l, 1)?;
    let mac = vtep_mac(l, 1)?;
    let listener_ns = a.ns.clone();
    let got = std::thread::spawn(move || {
        in_netns(&listener_ns, || -> Result<usize> {
            let s = UdpSocket::bind(("0.0.0.0", 9999))?;
            s.set_read_timeout(Some(Duration::from_millis(1500)))?;
            let mut n = 0;
            let mut buf = [0u8; 64];
            while s.recv(&mut buf).is_ok() {
                n += 1;
            }
            Ok(n)
        })
    });
    std::thread::sleep(Duration::from_millis(200));
    let before = l.counters(1)?;
    let node1 = SocketAddr::from((mycni_lab::node_ip(1), 8472));
    // From the underlay's own address (no node), then claiming to be node 2's pod.
    in_netns(&l.spec.underlay_ns(), move || -> Result<()> {
        let s = UdpSocket::bind(("0.0.0.0", 0))?;
        for src in ["10.244.2.5", "10.244.1.77"] {
            for _ in 0..5 {
                s.send_to(&vxlan_datagram(mac, a.ip, src.parse()?, 9999), node1)?;
            }
        }
        Ok(())
    })??;
    let n = got
        .join()
        .map_err(|_| anyhow::anyhow!("listener panicked"))???;
    let after = l.counters(1)?;
    eprintln!(
        "10 VXLAN datagrams from a stranger: {n} delivered; node 1 kernel_decap_not_peer +{}",
        delta(&after, &before, "kernel_decap_not_peer")
    );
    ensure!(n == 0, "{n} datagrams from a non-peer reached the pod");
    ensure!(delta(&after, &before, "kernel_decap_not_peer") >= 10);
    Ok(())
}

#[test]
fn direct_routing_forwards_without_encapsulation() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let mut t = common::lab_with(2, 1, &["--direct-routing", "true"])?;
    let l = &mut t.0;
    let (a, b) = (pod_on(l, 1)?, pod_on(l, 2)?);
    let routes = ns_sh(
        &l.spec.node_name(1),
        "ip",
        &["route", "show", "proto", "110"],
    )?;
    // `nhid N` comes between the two where the route goes through a
    // nexthop object.
    let via = format!(" via {} dev eth0", mycni_lab::node_ip(2));
    ensure!(
        routes
            .lines()
            .any(|l| l.starts_with("10.244.2.0/24 ") && l.contains(&via)),
        "no direct route:\n{routes}"
    );
    let (table, failed) = l.matrix()?;
    ensure!(failed == 0, "direct routing: unreachable pairs\n{table}");
    let (b1, b2) = (l.counters(1)?, l.counters(2)?);
    bulk_echo(&a, SocketAddr::from((b.ip, ECHO_PORT)), 8 << 20)?;
    let (a1, a2) = (l.counters(1)?, l.counters(2)?);
    eprintln!(
        "direct: node 1 fast_direct +{}, fast_direct_in +{}, fast_encap +{}; node 2 fast_direct_in +{}",
        delta(&a1, &b1, "fast_direct"),
        delta(&a1, &b1, "fast_direct_in"),
        delta(&a1, &b1, "fast_encap"),
        delta(&a2, &b2, "fast_direct_in"),
    );
    ensure!(
        delta(&a1, &b1, "fast_direct") > 0,
        "node 1 sent nothing direct"
    );
    ensure!(
        delta(&a2, &b2, "fast_direct_in") > 0,
        "node 2 took nothing in directly"
    );
    ensure!(
        delta(&a1, &b1, "fast_encap") == 0,
        "encapsulated under direct routing"
    );
    // The kernel path alone routes the same way.
    l.set_datapath("kernel")?;
    let (table, failed) = l.matrix()?;
    ensure!(
        failed == 0,
        "direct routing, kernel path: unreachable pairs\n{table}"
    );
    Ok(())
}
