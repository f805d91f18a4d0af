//! The real `mycni-agent` on lab nodes whose underlay has IPv6 host
//! addresses: `vxlan6.1` comes up over the IPv6 underlay (VNI 1, port 8472
//! beside `vxlan.1`, MTU less 70, a stable MAC of its own), both are
//! announced on the Node, the peer's IPv6 host address is the one the
//! `ip6 mycni_underlay` filter lets in (a stranger's VXLAN over IPv6 is
//! dropped), two nodes' `vxlan6.1` reach each other over the IPv6
//! underlay, a deleted `vxlan6.1` comes back with its MAC, and `uninstall`
//! removes it.
//!
//! Peer routes through `vxlan6.1`: every lab node has an IPv4 underlay
//! too, and a peer reached over both goes over IPv4 (see `kernel.rs`), so
//! the tests make peers announce no IPv4 host address, as IPv6-only nodes
//! do; between two such real nodes the fast path takes their pods' TCP
//! through `vxlan6.1` both ways.

use std::io::{Read, Write};
use std::net::{Ipv6Addr, SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use mycni_lab::{ECHO_PORT, Lab, Stack};
use mycni_testkit::{in_netns, sh};

use crate::common;

use common::{delta, wait_until};

/// Node `i`'s IPv6 host address (the underlay bridge has `fd00:77::1`).
fn host6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x77, 0, 0, 0, 0, 0, 0x10 + i as u16)
}

fn ip(l: &Lab, i: usize, args: &[&str]) -> Result<String> {
    common::node_ip(l, i, args)
}

fn nft(l: &Lab, i: usize, args: &[&str]) -> Result<String> {
    common::ns_sh(&l.spec.node_name(i), "nft", args)
}

/// A dual-stack lab of one node whose agent (with `args`) started after
/// the node got its IPv6 host address.
fn one_node_with_host6(args: &[&str]) -> Result<common::TestLab> {
    let t = common::lab_stack(1, 0, Stack::Dual, args)?;
    let l = &t.0;
    ip(
        l,
        1,
        &[
            "addr",
            "add",
            &format!("{}/64", host6(1)),
            "dev",
            "eth0",
            "nodad",
        ],
    )?;
    l.restart_agent(1)?;
    Ok(t)
}

/// Waits until Node `name`'s annotations show its IPv6 underlay as `ok`
/// wants it.
fn announced(
    api: &mycni_apiserver::ApiServer,
    name: &str,
    ok: impl Fn(&std::collections::BTreeMap<String, String>) -> bool,
) -> Result<()> {
    wait_until(
        "the IPv6 underlay announced",
        Duration::from_secs(5),
        || {
            let n = api.get_node(name).context("node")?;
            Ok(ok(&n.metadata.annotations.unwrap_or_default()))
        },
    )?;
    Ok(())
}

/// `vxlan6.1`'s MAC on node `i`, if it exists.
fn vxlan6_mac(l: &Lab, i: usize) -> Result<String> {
    let t = ip(l, i, &["link", "show", "vxlan6.1"])?;
    t.split("link/ether ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .map(str::to_string)
        .context("no MAC on vxlan6.1")
}

/// Packets the IPv6 underlay filter dropped on node `i`.
fn dropped6(l: &Lab, i: usize) -> Result<u64> {
    let t = nft(l, i, &["list", "chain", "ip6", "mycni_underlay", "input"])?;
    t.split("counter packets ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("no counter in {t}"))
}

/// A VXLAN header (VNI 1) and an inner frame that is nobody's: what a
/// stranger on the IPv6 underlay could try to inject.
fn stranger_datagram() -> Vec<u8> {
    let mut d = vec![0x08, 0, 0, 0, 0, 0, 1, 0];
    d.extend_from_slice(&[0xff; 6]);
    d.extend_from_slice(&[0x02, 0, 0, 0, 0x66, 0x66, 0x08, 0x00]);
    d.extend_from_slice(&[0u8; 46]);
    d
}

#[test]
fn vxlan6_comes_up_over_an_ipv6_underlay_is_filtered_repaired_and_uninstalled() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let t = common::lab_stack(2, 0, Stack::Dual, &[])?;
    let l = &t.0;
    let api = l.api.as_ref().context("api")?;
    let u = l.spec.underlay_ns();
    sh(
        "ip",
        &[
            "-n",
            &u,
            "addr",
            "add",
            "fd00:77::1/64",
            "dev",
            "br0",
            "nodad",
        ],
    )?;
    // The lab's nodes have an IPv4 underlay only: give each an IPv6 host
    // address and restart its agent, which finds it at start.
    for i in 1..=2 {
        let a = format!("{}/64", host6(i));
        ip(l, i, &["addr", "add", &a, "dev", "eth0", "nodad"])?;
        l.restart_agent(i)?;
    }
    for i in 1..=2 {
        wait_until("vxlan6.1 up", Duration::from_secs(10), || {
            Ok(ip(l, i, &["link", "show", "vxlan6.1"])?.contains(",UP"))
        })?;
        let d = ip(l, i, &["-d", "link", "show", "vxlan6.1"])?;
        for want in [
            "mtu 1430 ".to_string(),
            format!("vxlan id 1 local {} dev eth0", host6(i)),
            "dstport 8472".into(),
            "nolearning".into(),
        ] {
            ensure!(d.contains(&want), "node {i}: no {want:?} in {d}");
        }
        // vxlan.1 keeps its IPv4 underlay, on the same port; its MTU (the
        // pods') is vxlan6.1's, since a pod's packet may leave by either.
        let d4 = ip(l, i, &["-d", "link", "show", "vxlan.1"])?;
        ensure!(
            d4.contains("dstport 8472") && d4.contains("local 192.168.77."),
            "{d4}"
        );
        ensure!(d4.contains("mtu 1430 "), "vxlan.1's MTU: {d4}");
    }
    // Announced: the host address and vxlan6.1's own MAC.
    let (mac1, mac2) = (vxlan6_mac(l, 1)?, vxlan6_mac(l, 2)?);
    ensure!(mac1 != mac2);
    for (i, mac) in [(1, &mac1), (2, &mac2)] {
        announced(api, &l.spec.node_name(i), |a| {
            a.get("mycni.dev/host-ip-v6") == Some(&host6(i).to_string())
                && a.get("mycni.dev/vtep-mac-v6") == Some(mac)
        })?;
    }
    // Node 1 lets node 2's IPv6 host address in, nobody else's.
    wait_until("the peer in the ip6 set", Duration::from_secs(5), || {
        Ok(
            nft(l, 1, &["list", "set", "ip6", "mycni_underlay", "peers"])?
                .contains(&host6(2).to_string()),
        )
    })?;
    let before = dropped6(l, 1)?;
    in_netns(&u, || -> Result<()> {
        let s = UdpSocket::bind("[fd00:77::1]:0")?;
        for _ in 0..3 {
            s.send_to(&stranger_datagram(), SocketAddr::from((host6(1), 8472)))?;
        }
        Ok(())
    })??;
    wait_until(
        "the stranger's datagrams dropped",
        Duration::from_secs(2),
        || Ok(dropped6(l, 1)? - before == 3),
    )?;

    // The two vxlan6.1 talk over the IPv6 underlay: an address each, and
    // the FDB entry and neighbour the agent makes for a peer reached over
    // IPv6 (by hand here); the peer's datagrams pass the filter.
    for (i, peer, peer_mac) in [(1, 2, &mac2), (2, 1, &mac1)] {
        let me = format!("fd00:99::{i}/64");
        let them = format!("fd00:99::{peer}");
        let dst = host6(peer).to_string();
        ip(l, i, &["addr", "add", &me, "dev", "vxlan6.1", "nodad"])?;
        ip(
            l,
            i,
            &[
                "neigh",
                "replace",
                &them,
                "lladdr",
                peer_mac,
                "dev",
                "vxlan6.1",
                "nud",
                "permanent",
            ],
        )?;
        sh(
            "bridge",
            &[
                "-n",
                &l.spec.node_name(i),
                "fdb",
                "replace",
                peer_mac,
                "dev",
                "vxlan6.1",
                "dst",
                &dst,
                "self",
                "permanent",
            ],
        )?;
    }
    let ns1 = l.spec.node_name(1);
    sh(
        "ip",
        &[
            "netns",
            "exec",
            &ns1,
            "ping",
            "-6",
            "-c",
            "2",
            "-W",
            "2",
            "fd00:99::2",
        ],
    )
    .context("vxlan6.1 to vxlan6.1 over the IPv6 underlay")?;
    ensure!(
        dropped6(l, 1)? - before == 3,
        "the peer's datagrams were dropped"
    );

    // Drift: a deleted vxlan6.1 comes back, with its MAC, at the next pass.
    ip(l, 1, &["link", "del", "vxlan6.1"])?;
    wait_until("vxlan6.1 back", Duration::from_secs(10), || {
        Ok(ip(l, 1, &["link", "show", "vxlan6.1"]).is_ok_and(|t| t.contains(",UP")))
    })?;
    ensure!(
        vxlan6_mac(l, 1)? == mac1,
        "vxlan6.1 came back with another MAC"
    );

    // uninstall removes it and the ip6 table with the rest.
    common::uninstall(l, 1)?;
    ensure!(
        ip(l, 1, &["link", "show", "vxlan6.1"]).is_err(),
        "vxlan6.1 left"
    );
    ensure!(
        ip(l, 1, &["link", "show", "vxlan.1"]).is_err(),
        "vxlan.1 left"
    );
    let tables = nft(l, 1, &["list", "tables"])?;
    ensure!(!tables.contains("mycni"), "{tables}");
    Ok(())
}

#[test]
fn underlay6_off_makes_no_vxlan6_and_announces_none() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let t = one_node_with_host6(&["--underlay6", "off"])?;
    let l = &t.0;
    let api = l.api.as_ref().context("api")?;
    ensure!(
        ip(l, 1, &["link", "show", "vxlan6.1"]).is_err(),
        "vxlan6.1 with --underlay6 off"
    );
    let n = api.get_node(&l.spec.node_name(1)).context("node")?;
    let a = n.metadata.annotations.unwrap_or_default();
    ensure!(
        !a.contains_key("mycni.dev/host-ip-v6") && !a.contains_key("mycni.dev/vtep-mac-v6"),
        "{a:?}"
    );
    Ok(())
}

/// Node 1's vxlan6.1 state and its agent's last words, for a failure.
fn state(l: &Lab) -> String {
    format!(
        "routes {:?}\nneigh {:?}\nfdb {:?}\nset {:?}\nlog {:?}",
        ip(l, 1, &["-6", "route", "show", "proto", "110"]),
        ip(l, 1, &["-6", "neigh", "show", "dev", "vxlan6.1"]),
        sh(
            "bridge",
            &["-n", &l.spec.node_name(1), "fdb", "show", "dev", "vxlan6.1"]
        ),
        nft(l, 1, &["list", "set", "ip6", "mycni_underlay", "peers"]),
        std::fs::read_to_string(l.spec.node_dir(1).join("agent.log")).map(|s| s
            .lines()
            .rev()
            .take(12)
            .collect::<Vec<_>>()
            .join("\n")),
    )
}

/// An IPv6-only Node (IPv6 podCIDR, IPv6 underlay, nothing IPv4) as node 1
/// sees it: its IPv6 podCIDR through `vxlan6.1` (route, permanent
/// neighbour, FDB entry to its IPv6 host address), its host address in
/// the ip6 filter set, nothing of it on `vxlan.1`; `vxlan.1`'s passes leave
/// `vxlan6.1`'s route alone, drift is repaired, and a deleted Node takes
/// it all along.
#[test]
fn an_ipv6_only_peer_is_routed_through_vxlan6() -> Result<()> {
    let _turn = crate::turn(module_path!());
    ipv6_only_peer(&[], true)
}

/// The same with no periodic pass within the test: the kernel's
/// notifications of the deletions on vxlan6.1 are what wakes the repair.
#[test]
fn vxlan6_drift_is_repaired_from_notifications() -> Result<()> {
    let _turn = crate::turn(module_path!());
    ipv6_only_peer(&["--resync", "5m"], false)
}

/// `check_flapping`: whether the agent's full passes (one a second by
/// default in the lab) leave the route alone.
fn ipv6_only_peer(args: &[&str], check_flapping: bool) -> Result<()> {
    let t = one_node_with_host6(args)?;
    let l = &t.0;
    let api = l.api.as_ref().context("api")?;
    let (cidr, vtep, mac, host) = (
        "fd00:10:244:50::/64",
        "fd00:10:244:50::",
        "02:00:00:00:06:50",
        "fd00:77::50",
    );
    let mut n = mycni_apiserver::node_with_cidrs("v6-only", &[cidr]);
    n.metadata.annotations = Some(
        [
            ("mycni.dev/host-ip-v6".to_string(), host.to_string()),
            ("mycni.dev/vtep-mac-v6".to_string(), mac.to_string()),
        ]
        .into(),
    );
    api.create_node(n)?;
    let route = format!("{cidr} via {vtep} dev vxlan6.1 ");
    let programmed = || -> Result<bool> {
        let fdb = sh(
            "bridge",
            &["-n", &l.spec.node_name(1), "fdb", "show", "dev", "vxlan6.1"],
        )?;
        Ok(
            ip(l, 1, &["-6", "route", "show", "proto", "110"])?.contains(&route)
                && ip(l, 1, &["-6", "neigh", "show", "dev", "vxlan6.1"])?
                    .contains(&format!("{vtep} lladdr {mac} PERMANENT"))
                && fdb.contains(&format!("{mac} dst {host} self permanent"))
                && nft(l, 1, &["list", "set", "ip6", "mycni_underlay", "peers"])?.contains(host),
        )
    };
    wait_until(
        "the IPv6-only peer programmed",
        Duration::from_secs(5),
        programmed,
    )
    .with_context(|| state(l))?;
    ensure!(
        !ip(l, 1, &["-6", "neigh", "show", "dev", "vxlan.1"])?.contains(vtep),
        "the IPv6-only peer on vxlan.1"
    );
    let m = l.metrics(1)?;
    ensure!(
        !m.contains("reason=\"no_ipv4_pod_cidr\""),
        "counted as rejected: {m}"
    );
    if check_flapping {
        // Full passes every second: vxlan.1's leave vxlan6.1's route alone.
        std::thread::sleep(Duration::from_secs(3));
        ensure!(programmed()?, "the route flapped");
        let m = l.metrics(1)?;
        ensure!(m.contains("mycni_kernel_drift_repaired_total 0"), "{m}");
    }
    // Drift: the route, neighbour and FDB entry deleted by hand come back.
    ip(l, 1, &["-6", "route", "del", cidr])?;
    ip(l, 1, &["-6", "neigh", "del", vtep, "dev", "vxlan6.1"])?;
    sh(
        "bridge",
        &[
            "-n",
            &l.spec.node_name(1),
            "fdb",
            "del",
            mac,
            "dev",
            "vxlan6.1",
            "self",
        ],
    )?;
    wait_until("the drift repaired", Duration::from_secs(5), programmed)?;
    api.delete_node("v6-only")?;
    wait_until("the peer's state removed", Duration::from_secs(5), || {
        let fdb = sh(
            "bridge",
            &["-n", &l.spec.node_name(1), "fdb", "show", "dev", "vxlan6.1"],
        )?;
        Ok(
            !ip(l, 1, &["-6", "route", "show", "proto", "110"])?.contains(cidr)
                && !ip(l, 1, &["-6", "neigh", "show", "dev", "vxlan6.1"])?.contains(vtep)
                && !fdb.contains(mac)
                && !nft(l, 1, &["list", "set", "ip6", "mycni_underlay", "peers"])?.contains(host),
        )
    })?;
    Ok(())
}

/// Packets `dev` on node `i` has sent (`tx`) or received.
fn packets(l: &Lab, i: usize, dev: &str, tx: bool) -> Result<u64> {
    let t = ip(l, i, &["-s", "link", "show", dev])?;
    let key = if tx { "TX:" } else { "RX:" };
    t.split(key)
        .nth(1)
        .and_then(|r| r.lines().nth(1))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("no {key} packets in {t}"))
}

/// Node `i`'s IPv6 VTEP address (on vxlan.1).
fn vtep6(l: &Lab, i: usize) -> Result<String> {
    let t = ip(
        l,
        i,
        &[
            "-6", "-o", "addr", "show", "dev", "vxlan.1", "scope", "global",
        ],
    )?;
    t.split("inet6 ")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .map(str::to_string)
        .with_context(|| format!("no IPv6 VTEP in {t}"))
}

/// Sends `bytes` of a known pattern over one TCP connection from the pod
/// netns `ns` to the echo server at `to` and checks every byte that comes
/// back.
fn echo_intact(ns: &str, to: SocketAddr, bytes: usize) -> Result<()> {
    in_netns(ns, move || -> Result<()> {
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
        // Chunks a multiple of 251 long, so each starts the pattern anew.
        let chunk: Vec<u8> = (0..251 * 256).map(|k| (k % 251) as u8).collect();
        let mut sent = 0;
        while sent < bytes {
            let n = (bytes - sent).min(chunk.len());
            c.write_all(&chunk[..n])?;
            sent += n;
        }
        reader
            .join()
            .map_err(|_| anyhow::anyhow!("reader panicked"))?
    })?
}

/// Two real nodes announcing no IPv4 host address (as IPv6-only nodes
/// would; their agents still have an IPv4 underlay, which the lab cannot
/// do without yet): each sends to the other's IPv6 side through
/// `vxlan6.1` over the IPv6 underlay, and takes the other's in through its
/// own past its ip6 filter; the fast path hands their pods' TCP to
/// `vxlan6.1` and takes it from there into the pod, data intact. Their
/// IPv4 sides are gone: IPv4 pods are not carried over an IPv6 underlay.
#[test]
fn nodes_without_ipv4_host_address_reach_each_other_over_vxlan6() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let t = common::lab_stack(2, 1, Stack::Dual, &[])?;
    let l = &t.0;
    let api = l.api.as_ref().context("api")?;
    for i in 1..=2 {
        ip(
            l,
            i,
            &[
                "addr",
                "add",
                &format!("{}/64", host6(i)),
                "dev",
                "eth0",
                "nodad",
            ],
        )?;
        l.restart_agent(i)?;
    }
    for i in 1..=2 {
        let name = l.spec.node_name(i);
        announced(api, &name, |a| a.contains_key("mycni.dev/host-ip-v6"))?;
        api.update_node(&name, |n| {
            if let Some(a) = n.metadata.annotations.as_mut() {
                a.remove("mycni.dev/host-ip");
            }
        })?;
    }
    let vteps = [vtep6(l, 1)?, vtep6(l, 2)?];
    for (i, peer) in [(1, 2), (2, 1)] {
        let them = &vteps[peer - 1];
        wait_until(
            "the peer's IPv6 side through vxlan6.1",
            Duration::from_secs(5),
            || {
                let r6 = ip(l, i, &["-6", "route", "show", "proto", "110"])?;
                let r4 = ip(l, i, &["route", "show", "proto", "110"])?;
                Ok(r6.contains(&format!("via {them} dev vxlan6.1 ")) && r4.trim().is_empty())
            },
        )
        .with_context(|| state(l))?;
    }
    let before: Vec<(u64, u64)> = (1..=2)
        .map(|i| {
            Ok((
                packets(l, i, "vxlan6.1", true)?,
                packets(l, i, "vxlan6.1", false)?,
            ))
        })
        .collect::<Result<_>>()?;
    let ns1 = l.spec.node_name(1);
    sh(
        "ip",
        &[
            "netns", "exec", &ns1, "ping", "-6", "-c", "3", "-W", "2", "-I", &vteps[0], &vteps[1],
        ],
    )
    .with_context(|| state(l))?;
    // And pod to pod: ICMPv6 is the kernel's, through vxlan6.1.
    let pods = l.pods()?;
    let (p1, p2) = (
        pods.iter().find(|p| p.node == 1).context("pod on node 1")?,
        pods.iter().find(|p| p.node == 2).context("pod on node 2")?,
    );
    let dst = p2.ip6.context("pod 2 has no IPv6")?.to_string();
    sh(
        "ip",
        &[
            "netns", "exec", &p1.ns, "ping", "-6", "-c", "3", "-W", "2", &dst,
        ],
    )
    .with_context(|| state(l))?;
    eprintln!(
        "node 1: {}",
        l.metrics(1)?
            .lines()
            .filter(|l| l.starts_with("mycni_datapath_ebpf"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    for i in 1..=2 {
        let (tx, rx) = (
            packets(l, i, "vxlan6.1", true)? - before[i - 1].0,
            packets(l, i, "vxlan6.1", false)? - before[i - 1].1,
        );
        ensure!(
            tx >= 6 && rx >= 6,
            "node {i}'s vxlan6.1: {tx} sent, {rx} received"
        );
    }

    // TCP, with the fast path: mycni_remote6 mirrors vxlan6.1's peers, so
    // the programs hand established segments to vxlan6.1 themselves
    // (fast_vxlan6) and deliver what it decapsulates (fast_vxlan6_decap),
    // both ways of the echo. The pods were made before vxlan6.1 existed,
    // with the IPv4 overlay's MTU: their first full segments are over
    // vxlan6.1's and go to the kernel (kernel_vxlan6_mtu), whose "packet
    // too big" lowers the path MTU.
    for i in 1..=2 {
        ensure!(
            l.readyz(i)?.contains("datapath ebpf"),
            "node {i} runs no fast path: {}",
            l.readyz(i)?
        );
    }
    let (b1, b2) = (l.counters(1)?, l.counters(2)?);
    let to = SocketAddr::from((p2.ip6.context("pod 2 has no IPv6")?, ECHO_PORT));
    echo_intact(&p1.ns, to, 4 << 20)
        .context("4 MB echoed over vxlan6.1")
        .with_context(|| state(l))?;
    let (a1, a2) = (l.counters(1)?, l.counters(2)?);
    eprintln!(
        "node 1: fast_vxlan6 +{}, fast_vxlan6_decap +{}, kernel_vxlan6_mtu +{}, kernel_unknown_dest +{}; node 2: fast_vxlan6 +{}, fast_vxlan6_decap +{}, kernel_vxlan6_mtu +{}",
        delta(&a1, &b1, "fast_vxlan6"),
        delta(&a1, &b1, "fast_vxlan6_decap"),
        delta(&a1, &b1, "kernel_vxlan6_mtu"),
        delta(&a1, &b1, "kernel_unknown_dest"),
        delta(&a2, &b2, "fast_vxlan6"),
        delta(&a2, &b2, "fast_vxlan6_decap"),
        delta(&a2, &b2, "kernel_vxlan6_mtu"),
    );
    for (i, a, b) in [(1, &a1, &b1), (2, &a2, &b2)] {
        // 4 MB each way, in GSO aggregates of up to 64 KB: at least 64
        // packets each way, all but the first few fast (111 and 138 seen).
        ensure!(
            delta(a, b, "fast_vxlan6") >= 40 && delta(a, b, "fast_vxlan6_decap") >= 40,
            "node {i}: not through vxlan6.1 on the fast path: {a:?}"
        );
        ensure!(
            delta(a, b, "kernel_unknown_dest") < 10,
            "node {i}: remote pods unknown to the fast path: {a:?}"
        );
    }
    Ok(())
}
