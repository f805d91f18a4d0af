//! The real `mycni-agent` on IPv6-only nodes: the lab's `Stack::Ipv6Only`
//! (underlay addresses, default route and API fixture IPv6 only, Nodes
//! with one IPv6 podCIDR each, `--cluster-cidr fd00:10:244::/56`). Each
//! agent gets ready without any IPv4: no `vxlan.1`, `vxlan6.1` over the
//! IPv6 underlay with the pods' MTU (underlay − 70) and the node's IPv6
//! VTEP address, a route, permanent neighbour and FDB entry per peer on
//! it, IPv6 annotations only, the ip6 tables alone; pods reach each other
//! and the other node. An earlier dual-stack run's `vxlan.1` and IPv4
//! annotations are removed; a peer announcing an IPv4 underlay only is
//! counted as unreachable; `--underlay6 off` is refused at start; the IPv6
//! underlay address moving is followed at once.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use mycni_lab::{Lab, Stack, node_ip6, pod_cidr6};
use mycni_testkit::sh;

use crate::common;

use common::wait_until;

fn ip(l: &Lab, i: usize, args: &[&str]) -> Result<String> {
    common::node_ip(l, i, args)
}

fn nft(l: &Lab, i: usize, args: &[&str]) -> Result<String> {
    common::ns_sh(&l.spec.node_name(i), "nft", args)
}

fn fdb(l: &Lab, i: usize) -> Result<String> {
    sh(
        "bridge",
        &["-n", &l.spec.node_name(i), "fdb", "show", "dev", "vxlan6.1"],
    )
}

/// `vxlan6.1`'s MAC on node `i`.
fn vxlan6_mac(l: &Lab, i: usize) -> Result<String> {
    let t = ip(l, i, &["link", "show", "vxlan6.1"])?;
    t.split("link/ether ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .map(str::to_string)
        .context("no MAC on vxlan6.1")
}

/// Node `i`'s IPv6 VTEP address: its podCIDR's first address.
fn vtep6(i: usize) -> String {
    pod_cidr6(i).trim_end_matches("/64").to_string()
}

fn annotations(l: &Lab, i: usize) -> Result<BTreeMap<String, String>> {
    let api = l.api.as_ref().context("api")?;
    let n = api.get_node(&l.spec.node_name(i)).context("node")?;
    Ok(n.metadata.annotations.unwrap_or_default())
}

/// Node `i`'s overlay state and its agent's last words, for a failure.
fn state(l: &Lab, i: usize) -> String {
    format!(
        "links {:?}\nroutes {:?}\nneigh {:?}\nfdb {:?}\nlog {:?}",
        ip(l, i, &["-d", "link", "show", "type", "vxlan"]),
        ip(l, i, &["-6", "route", "show", "proto", "110"]),
        ip(l, i, &["-6", "neigh", "show", "dev", "vxlan6.1"]),
        fdb(l, i),
        std::fs::read_to_string(l.spec.node_dir(i).join("agent.log")).map(|s| s
            .lines()
            .rev()
            .take(15)
            .collect::<Vec<_>>()
            .join("\n")),
    )
}

#[test]
fn ipv6_only_nodes_run_over_vxlan6_alone() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let t = common::lab_stack(2, 1, Stack::Ipv6Only, &[])?;
    let l = &t.0;
    let macs = [vxlan6_mac(l, 1)?, vxlan6_mac(l, 2)?];
    ensure!(macs[0] != macs[1], "one vxlan6.1 MAC on both nodes");
    for (i, peer) in [(1usize, 2usize), (2, 1)] {
        let ns = l.spec.node_name(i);
        ensure!(
            l.spec.node_dir(i).join("run/ready").exists(),
            "node {i} not ready"
        );
        // No IPv4 anywhere on the node, and no vxlan.1.
        let v4 = ip(l, i, &["-4", "-o", "addr", "show", "scope", "global"])?;
        ensure!(v4.trim().is_empty(), "node {i} has IPv4: {v4}");
        ensure!(
            ip(l, i, &["link", "show", "vxlan.1"]).is_err(),
            "node {i} has vxlan.1: {}",
            state(l, i)
        );
        let d = ip(l, i, &["-d", "link", "show", "vxlan6.1"])?;
        for want in [
            ",UP".to_string(),
            "mtu 1430 ".into(),
            format!("vxlan id 1 local {} dev eth0", node_ip6(i)),
            "dstport 8472".into(),
            "nolearning".into(),
        ] {
            ensure!(d.contains(&want), "node {i}: no {want:?} in {d}");
        }
        let a = ip(
            l,
            i,
            &[
                "-6", "-o", "addr", "show", "dev", "vxlan6.1", "scope", "global",
            ],
        )?;
        ensure!(
            a.contains(&format!("inet6 {}/128", vtep6(i))),
            "node {i}'s VTEP address on vxlan6.1: {a}"
        );
        // The peer: route, permanent neighbour, FDB entry on vxlan6.1.
        let (them, mac) = (vtep6(peer), &macs[peer - 1]);
        let routes = ip(l, i, &["-6", "route", "show", "proto", "110"])?;
        ensure!(
            routes.contains(&format!("{} via {them} dev vxlan6.1 ", pod_cidr6(peer))),
            "node {i}: {}",
            state(l, i)
        );
        ensure!(
            ip(l, i, &["-4", "route", "show", "proto", "110"])?
                .trim()
                .is_empty()
        );
        ensure!(
            ip(l, i, &["-6", "neigh", "show", "dev", "vxlan6.1"])?
                .contains(&format!("{them} lladdr {mac} PERMANENT")),
            "node {i}: {}",
            state(l, i)
        );
        ensure!(
            fdb(l, i)?.contains(&format!("{mac} dst {} self permanent", node_ip6(peer))),
            "node {i}: {}",
            state(l, i)
        );
        ensure!(
            nft(l, i, &["list", "set", "ip6", "mycni_underlay", "peers"])?
                .contains(&node_ip6(peer).to_string())
        );
        // Announced: the IPv6 underlay only.
        let ann = annotations(l, i)?;
        ensure!(
            ann.get("mycni.dev/host-ip-v6") == Some(&node_ip6(i).to_string())
                && ann.get("mycni.dev/vtep-mac-v6") == Some(&macs[i - 1])
                && !ann.contains_key("mycni.dev/host-ip")
                && !ann.contains_key("mycni.dev/vtep-mac"),
            "node {i}'s annotations: {ann:?}"
        );
        // The plugin's conflist: the IPv6 range alone, vxlan6.1, its MTU.
        let conf = std::fs::read_to_string(l.spec.node_dir(i).join("net.d/00-mycni.conflist"))?;
        for want in [
            "\"vxlanDevice\": \"vxlan6.1\"",
            "\"mtu\": 1430",
            &format!("\"subnet\": \"{}\"", pod_cidr6(i)),
        ] {
            ensure!(conf.contains(want), "node {i}: no {want} in {conf}");
        }
        ensure!(!conf.contains("10.244."), "{conf}");
        // Masquerade in the ip6 table alone; IPv6 forwarding on.
        let tables = nft(l, i, &["list", "tables"])?;
        ensure!(
            tables.contains("table ip6 mycni\n") && !tables.contains("table ip mycni\n"),
            "{tables}"
        );
        let fwd = common::ns_sh(&ns, "cat", &["/proc/sys/net/ipv6/conf/all/forwarding"])?;
        ensure!(fwd.trim() == "1", "forwarding {fwd}");
        let ready = l.readyz(i)?;
        // Nothing is encapsulated in tc here (the programs build IPv4
        // outer headers only): the detail must not claim it.
        ensure!(
            ready.contains("no IPv4 underlay: IPv6-only node")
                && ready.contains("datapath ebpf, via vxlan6.1")
                && !ready.contains("tc encap"),
            "node {i}: {ready}"
        );
    }

    // Pod to pod and node to pod, across the IPv6 underlay.
    let pods = l.pods()?;
    let (p1, p2) = (
        pods.iter().find(|p| p.node == 1).context("pod on node 1")?,
        pods.iter().find(|p| p.node == 2).context("pod on node 2")?,
    );
    let (a1, a2) = (
        p1.ip6.context("pod 1 has no IPv6")?.to_string(),
        p2.ip6.context("pod 2 has no IPv6")?.to_string(),
    );
    sh(
        "ip",
        &[
            "netns", "exec", &p1.ns, "ping", "-6", "-c", "3", "-W", "2", &a2,
        ],
    )
    .with_context(|| state(l, 1))?;
    sh(
        "ip",
        &[
            "netns", "exec", &p2.ns, "ping", "-6", "-c", "3", "-W", "2", &a1,
        ],
    )
    .with_context(|| state(l, 2))?;
    let n1 = l.spec.node_name(1);
    sh(
        "ip",
        &[
            "netns", "exec", &n1, "ping", "-6", "-c", "2", "-W", "2", &a2,
        ],
    )
    .context("node 1 to the pod on node 2")?;

    // inspect finds the maps through vxlan6.1 and says why there is no
    // vxlan.1.
    let out = common::ns_sh(&n1, &l.spec.bins.agent.to_string_lossy(), &["inspect"])?;
    ensure!(
        out.contains("attached to vxlan6.1")
            && out.contains("vxlan: none (no IPv4 underlay: IPv6-only node)"),
        "{out}"
    );

    // uninstall takes vxlan6.1 and the tables along.
    common::uninstall(l, 1)?;
    ensure!(ip(l, 1, &["link", "show", "vxlan6.1"]).is_err());
    let tables = nft(l, 1, &["list", "tables"])?;
    ensure!(!tables.contains("mycni"), "{tables}");
    Ok(())
}

#[test]
fn an_earlier_dual_stack_runs_leftovers_go_and_an_ipv4_peer_is_unreachable() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let t = common::lab_stack(2, 0, Stack::Ipv6Only, &[])?;
    let l = &t.0;
    let api = l.api.as_ref().context("api")?;
    let n1 = l.spec.node_name(1);
    // What a dual-stack run leaves: vxlan.1 and the IPv4 annotations.
    l.stop_agent(1);
    ip(
        l,
        1,
        &[
            "link", "add", "vxlan.1", "type", "vxlan", "id", "1", "dstport", "8472",
        ],
    )?;
    api.update_node(&n1, |n| {
        let a = n.metadata.annotations.get_or_insert_default();
        a.insert("mycni.dev/host-ip".into(), "192.168.77.11".into());
        a.insert("mycni.dev/vtep-mac".into(), "02:00:00:00:00:11".into());
    })?;
    l.restart_agent(1)?;
    ensure!(
        ip(l, 1, &["link", "show", "vxlan.1"]).is_err(),
        "vxlan.1 left: {}",
        state(l, 1)
    );
    wait_until(
        "the IPv4 annotations removed",
        Duration::from_secs(5),
        || {
            let a = annotations(l, 1)?;
            Ok(!a.contains_key("mycni.dev/host-ip")
                && !a.contains_key("mycni.dev/vtep-mac")
                && a.contains_key("mycni.dev/host-ip-v6"))
        },
    )?;

    // A peer that announces an IPv4 underlay only: nothing here reaches
    // it. Counted, said once, nothing programmed; the other peer stays.
    api.create_node(common::peer_node(
        "v4-underlay",
        &["fd00:10:244:50::/64"],
        "02:00:00:00:00:50",
        "192.168.77.50",
    ))?;
    wait_until("the IPv4 peer counted", Duration::from_secs(5), || {
        Ok(l.metrics(1)?
            .contains("mycni_rejected_peers{reason=\"no_common_underlay\"} 1"))
    })
    .with_context(|| state(l, 1))?;
    let routes = ip(l, 1, &["-6", "route", "show", "proto", "110"])?;
    ensure!(
        !routes.contains("fd00:10:244:50::") && routes.contains(&pod_cidr6(2)),
        "{routes}"
    );
    // Full passes every second: the reason is logged once all the same.
    std::thread::sleep(Duration::from_secs(3));
    let log = std::fs::read_to_string(l.spec.node_dir(1).join("agent.log"))?;
    let said = log
        .lines()
        .filter(|x| x.contains("v4-underlay") && x.contains("no_common_underlay"))
        .count();
    ensure!(said == 1, "said {said} times:\n{log}");
    Ok(())
}

#[test]
fn underlay6_off_is_refused_on_an_ipv6_only_node() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let t = common::lab_stack(1, 0, Stack::Ipv6Only, &[])?;
    let l = &t.0;
    l.stop_agent(1);
    let dir = l.spec.node_dir(1);
    let p = |s: &str| dir.join(s).to_string_lossy().into_owned();
    let out = std::process::Command::new("timeout")
        .args([
            "30",
            "ip",
            "netns",
            "exec",
            &l.spec.node_name(1),
            &l.spec.bins.agent.to_string_lossy(),
            "run",
            "--node-name",
            &l.spec.node_name(1),
            "--kubeconfig",
            &l.spec.kubeconfig().to_string_lossy(),
            "--cni-conf-dir",
            &p("net.d"),
            "--state-dir",
            &p("run"),
            "--data-dir",
            &p("data"),
            "--proc-sys",
            "/proc/sys",
            "--metrics-addr",
            "off",
            "--datapath",
            "kernel",
            "--cluster-cidr",
            "fd00:10:244::/56",
            "--underlay6",
            "off",
        ])
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.code() == Some(1),
        "{:?} (124: still running): {err}",
        out.status
    );
    ensure!(
        err.contains("--underlay6 off") && err.contains("IPv6-only node"),
        "{err}"
    );
    Ok(())
}

/// The IPv6 underlay address moving (no full pass within the test: the
/// kernel's notifications wake the re-read): `vxlan6.1` follows, the new
/// host address is republished, the peer's FDB entry follows it, and pods
/// reach each other again.
#[test]
fn the_ipv6_underlay_moving_is_followed_at_once() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let t = common::lab_stack(2, 1, Stack::Ipv6Only, &["--resync", "60s"])?;
    let l = &t.0;
    let (old, new) = (node_ip6(1).to_string(), "fd00:77::21".to_string());
    let mac = vxlan6_mac(l, 1)?;
    ip(
        l,
        1,
        &["addr", "add", &format!("{new}/64"), "dev", "eth0", "nodad"],
    )?;
    // A second address (a VIP, a renumbering's new prefix) is listed first
    // by the kernel, being the newest: the host IP in use must stay while
    // it exists, or every VIP failover would move vxlan6.1.
    std::thread::sleep(Duration::from_secs(1));
    ensure!(
        annotations(l, 1)?.get("mycni.dev/host-ip-v6") == Some(&old)
            && ip(l, 1, &["-d", "link", "show", "vxlan6.1"])?
                .contains(&format!("local {old} dev eth0")),
        "an added address took over the host IP: {}",
        state(l, 1)
    );
    ip(l, 1, &["addr", "del", &format!("{old}/64"), "dev", "eth0"])?;
    let took = wait_until(
        "vxlan6.1, the annotation and the peer's FDB entry moved",
        Duration::from_secs(10),
        || {
            let d = ip(l, 1, &["-d", "link", "show", "vxlan6.1"])?;
            Ok(d.contains(&format!("local {new} dev eth0"))
                && annotations(l, 1)?.get("mycni.dev/host-ip-v6") == Some(&new)
                && fdb(l, 2)?.contains(&format!("{mac} dst {new} self permanent")))
        },
    )
    .with_context(|| state(l, 1))?;
    ensure!(
        took < Duration::from_secs(2),
        "followed after {took:?}, not at once"
    );
    let pods = l.pods()?;
    let (p1, p2) = (
        pods.iter().find(|p| p.node == 1).context("pod on node 1")?,
        pods.iter().find(|p| p.node == 2).context("pod on node 2")?,
    );
    let a2 = p2.ip6.context("pod 2 has no IPv6")?.to_string();
    sh(
        "ip",
        &[
            "netns", "exec", &p1.ns, "ping", "-6", "-c", "3", "-W", "2", &a2,
        ],
    )
    .with_context(|| state(l, 2))?;
    Ok(())
}

/// The underlay found through IPv6 by each `--iface` form that names no
/// interface outright: the route to an IPv6 address, a name pattern.
#[test]
fn the_ipv6_underlay_is_found_by_can_reach_and_by_pattern() -> Result<()> {
    let _turn = crate::turn(module_path!());
    for iface in ["can-reach=fd00:77::1", "interface=eth*"] {
        let t = common::lab_stack(1, 0, Stack::Ipv6Only, &["--iface", iface])?;
        let l = &t.0;
        let d = ip(l, 1, &["-d", "link", "show", "vxlan6.1"])?;
        ensure!(
            d.contains(&format!("local {} dev eth0", node_ip6(1))),
            "{iface}: {d}"
        );
    }
    Ok(())
}
