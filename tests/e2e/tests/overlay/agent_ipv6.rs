//! The real `mycni-agent` binary, told the cluster's IPv6 range, in a lab
//! node namespace against the API fixture: a peer Node's IPv6 podCIDR
//! (from `spec.podCIDRs`) becomes a route and a permanent neighbour on
//! vxlan.1 and goes again with it, a bad one rejects the peer's IPv6 side
//! only and is counted, and IPv6 drift is repaired from the kernel's
//! notifications, long before the periodic pass.

use std::time::Duration;

use anyhow::{Context, Result};
use mycni_lab::Lab;

use crate::common;

use common::{CLUSTER_DUAL as CLUSTER, peer_node, set_pod_cidrs, without_nhid};

/// [`common::wait_every`] at the 20 ms these tests were timed with.
fn wait_until(what: &str, timeout: Duration, f: impl FnMut() -> Result<bool>) -> Result<Duration> {
    common::wait_every(what, timeout, Duration::from_millis(20), f)
}

/// `ip` on lab node 1.
fn ip(l: &Lab, args: &[&str]) -> Result<String> {
    common::node_ip(l, 1, args)
}

/// The agent's IPv6 routes on lab node 1, without nexthop IDs.
fn routes6(l: &Lab) -> Result<String> {
    Ok(without_nhid(&ip(
        l,
        &["-6", "route", "show", "proto", "110"],
    )?))
}

fn neighbours6(l: &Lab) -> Result<String> {
    ip(l, &["-6", "neigh", "show", "dev", "vxlan.1"])
}

/// The IPv6 side of a peer as the agent programs it: route and neighbour.
fn ipv6_side(l: &Lab, cidr: &str, vtep: &str, mac: &str) -> Result<bool> {
    Ok(
        routes6(l)?.contains(&format!("{cidr} via {vtep} dev vxlan.1"))
            && neighbours6(l)?.contains(&format!("{vtep} lladdr {mac} PERMANENT")),
    )
}

#[test]
fn a_nodes_ipv6_podcidr_comes_and_goes_with_its_route_and_neighbour() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let t = common::lab_with(1, 0, &["--cluster-cidr", CLUSTER])?;
    let l = &t.0;
    let api = l.api.as_ref().context("api")?;
    let mac = "02:00:00:00:20:01";
    api.create_node(peer_node(
        "peer-a",
        &["10.244.20.0/24"],
        mac,
        "192.168.77.120",
    ))?;
    let v4 = || -> Result<bool> {
        Ok(ip(l, &["route", "show", "proto", "110"])?.contains("10.244.20.0/24"))
    };
    wait_until("the IPv4 side programmed", Duration::from_secs(5), v4)?;
    assert!(routes6(l)?.trim().is_empty(), "{}", routes6(l)?);
    // The Node gains an IPv6 podCIDR (IPv6 first: either order is valid).
    api.update_node("peer-a", |n| {
        set_pod_cidrs(n, &["fd00:10:244:20::/64", "10.244.20.0/24"])
    })?;
    wait_until("the IPv6 side programmed", Duration::from_secs(5), || {
        ipv6_side(l, "fd00:10:244:20::/64", "fd00:10:244:20::", mac)
    })?;
    // One FDB entry serves both families.
    let fdb = mycni_testkit::sh(
        "bridge",
        &["-n", &l.spec.node_name(1), "fdb", "show", "dev", "vxlan.1"],
    )?;
    assert_eq!(fdb.matches(mac).count(), 1, "{fdb}");
    // ... and loses it: route and neighbour go, the IPv4 side stays.
    api.update_node("peer-a", |n| set_pod_cidrs(n, &["10.244.20.0/24"]))?;
    wait_until("the IPv6 side removed", Duration::from_secs(5), || {
        Ok(routes6(l)?.trim().is_empty() && !neighbours6(l)?.contains("fd00:10:244:20::"))
    })?;
    assert!(v4()?, "the IPv4 side went too");
    // Back, then the Node deleted: everything goes.
    api.update_node("peer-a", |n| {
        set_pod_cidrs(n, &["10.244.20.0/24", "fd00:10:244:20::/64"])
    })?;
    wait_until("the IPv6 side back", Duration::from_secs(5), || {
        ipv6_side(l, "fd00:10:244:20::/64", "fd00:10:244:20::", mac)
    })?;
    api.delete_node("peer-a")?;
    wait_until(
        "the deleted Node's state removed",
        Duration::from_secs(5),
        || Ok(routes6(l)?.trim().is_empty() && !neighbours6(l)?.contains("PERMANENT") && !v4()?),
    )?;
    Ok(())
}

#[test]
fn a_bad_ipv6_podcidr_rejects_the_peers_ipv6_side_and_is_counted() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let t = common::lab_with(1, 0, &["--cluster-cidr", CLUSTER])?;
    let l = &t.0;
    let api = l.api.as_ref().context("api")?;
    // What the API lets through: its validation takes any CIDR (host
    // bits too) and one per family, but knows no cluster range, sizes or
    // other Nodes.
    for (name, cidr6, n) in [
        ("host-bits", "fd00:10:244:31::1/64", 31),
        ("outside", "fd00:99:0:32::/64", 32),
        ("tiny", "fd00:10:244:33::/126", 33),
        ("good", "fd00:10:244:34::/64", 34),
    ] {
        api.create_node(peer_node(
            name,
            &[&format!("10.244.{n}.0/24"), cidr6],
            &format!("02:00:00:00:{n}:01"),
            &format!("192.168.77.{}", 100 + n),
        ))
        .with_context(|| name.to_string())?;
    }
    wait_until(
        "the good IPv6 side programmed",
        Duration::from_secs(5),
        || {
            ipv6_side(
                l,
                "fd00:10:244:34::/64",
                "fd00:10:244:34::",
                "02:00:00:00:34:01",
            )
        },
    )?;
    // Every IPv4 side is programmed; no other IPv6 side is.
    let v4 = ip(l, &["route", "show", "proto", "110"])?;
    for n in 31..=34 {
        assert!(v4.contains(&format!("10.244.{n}.0/24")), "{v4}");
    }
    let r6 = routes6(l)?;
    assert_eq!(r6.lines().count(), 1, "{r6}");
    let n6 = neighbours6(l)?;
    assert_eq!(n6.matches("PERMANENT").count(), 1, "{n6}");
    // The gauges are set when the pass that wrote the routes ends, a
    // moment after the kernel has them.
    let want = [
        "mycni_rejected_peers{reason=\"bad_pod_cidr_v6\"} 2",
        "mycni_rejected_peers{reason=\"outside_cluster_cidr_v6\"} 1",
        "mycni_peers_programmed 4",
    ];
    let counted = wait_until("the rejections counted", Duration::from_secs(5), || {
        let m = l.metrics(1)?;
        Ok(want.iter().all(|w| m.contains(w)))
    });
    if counted.is_err() {
        let m = l.metrics(1)?;
        let missing: Vec<&str> = want.iter().copied().filter(|w| !m.contains(w)).collect();
        anyhow::bail!("missing {missing:?} in {m}");
    }
    // The agent told the IPv6 range masquerades IPv6 leaving it.
    let nat6 = common::ns_sh(
        &l.spec.node_name(1),
        "nft",
        &["list", "table", "ip6", "mycni"],
    )?;
    assert!(
        nat6.contains("ip6 saddr fd00:10:244::/56 ip6 daddr != fd00:10:244::/56 masquerade"),
        "{nat6}"
    );
    Ok(())
}

/// With the periodic pass a minute away, an IPv6 route or neighbour
/// deleted or changed under the agent is back within seconds: the kernel's
/// notification disagrees with what the agent last wrote (`kwatch`).
#[test]
fn ipv6_drift_is_repaired_from_notifications() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let t = common::lab_with(1, 0, &["--cluster-cidr", CLUSTER, "--resync", "60s"])?;
    let l = &t.0;
    let api = l.api.as_ref().context("api")?;
    let mac = "02:00:00:00:50:01";
    api.create_node(peer_node(
        "peer-d",
        &["10.244.50.0/24", "fd00:10:244:50::/64"],
        mac,
        "192.168.77.150",
    ))?;
    let whole = || ipv6_side(l, "fd00:10:244:50::/64", "fd00:10:244:50::", mac);
    wait_until("programmed", Duration::from_secs(5), whole)?;
    let ns = l.spec.node_name(1);
    let uses_nexthops = !ip(l, &["-6", "nexthop", "show", "dev", "vxlan.1"])
        .unwrap_or_default()
        .trim()
        .is_empty();
    let words = |s: &str| -> Vec<String> { s.split_whitespace().map(String::from).collect() };
    let mut faults: Vec<(&str, Vec<String>)> = vec![
        (
            "IPv6 route deleted",
            words("-6 route del fd00:10:244:50::/64 proto 110"),
        ),
        (
            "IPv6 route replaced with another gateway",
            words(
                "-6 route replace fd00:10:244:50::/64 via fd00:10:244:51:: dev vxlan.1 onlink proto 110",
            ),
        ),
        (
            "IPv6 neighbour deleted",
            words("-6 neigh del fd00:10:244:50:: dev vxlan.1"),
        ),
        (
            "IPv6 neighbour replaced with another MAC",
            words(
                "-6 neigh replace fd00:10:244:50:: lladdr 02:00:00:00:66:66 dev vxlan.1 nud permanent",
            ),
        ),
    ];
    if uses_nexthops {
        // Deleting a nexthop takes its routes along, with no route
        // notification: kwatch hears of it from the nexthop group.
        let nh = ip(l, &["-6", "nexthop", "show", "dev", "vxlan.1"])?;
        let id = nh.split_whitespace().nth(1).context("no IPv6 nexthop id")?;
        faults.push((
            "IPv6 nexthop deleted (and its route with it)",
            words(&format!("nexthop del id {id}")),
        ));
    }
    let repaired = || common::counter(l, 1, "mycni_kernel_drift_repaired_total");
    for (what, args) in &faults {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let before = repaired()?;
        ip(l, &args).with_context(|| what.to_string())?;
        // The agent's repair is faster than a look: its counter says it
        // found something to repair.
        let took = wait_until(what, Duration::from_secs(10), || {
            Ok(repaired()? > before && whole()?)
        })?;
        eprintln!("{what}: repaired in {took:?} ({ns})");
        // Far from the 60 s resync: the notification did it.
        assert!(took < Duration::from_secs(10), "{what}: {took:?}");
    }
    // The repairs' own IPv6 writes notify too, and must wake nothing.
    let runs = || common::counter(l, 1, "mycni_reconcile_runs_total");
    std::thread::sleep(Duration::from_millis(500));
    let before = runs()?;
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(runs()?, before, "passes kept running with nothing to do");
    Ok(())
}

/// Two lab nodes made dual-stack (their agents restarted, as the DaemonSet
/// does when a Node's podCIDRs change): each one's conflist gives the
/// plugin both ranges, vxlan.1 carries the IPv6 VTEP address, forwarding
/// is on, and IPv6 crosses the overlay (over the IPv4 underlay) from one
/// node's VTEP to the other's.
#[test]
fn dual_stack_nodes_reach_each_other_over_ipv6() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let t = common::lab_with(2, 0, &["--cluster-cidr", CLUSTER])?;
    let l = &t.0;
    let api = l.api.as_ref().context("api")?;
    for i in 1..=2 {
        let (v4, v6) = (format!("10.244.{i}.0/24"), format!("fd00:10:244:{i}::/64"));
        api.update_node(&l.spec.node_name(i), |n| set_pod_cidrs(n, &[&v4, &v6]))?;
    }
    for i in 1..=2 {
        l.restart_agent(i)?;
    }
    // The agents that saw their podCIDRs change exited, leaving their
    // ready marker: the new conflist is what says the restart is through.
    let want =
        serde_json::json!([[{"subnet": "10.244.1.0/24"}], [{"subnet": "fd00:10:244:1::/64"}]]);
    let conflist = l.spec.node_dir(1).join("net.d/00-mycni.conflist");
    wait_until("the dual-stack conflist", Duration::from_secs(30), || {
        let conf: serde_json::Value = serde_json::from_slice(&std::fs::read(&conflist)?)?;
        Ok(conf["plugins"][0]["ipam"]["ranges"] == want)
    })?;
    let addr = ip(l, &["-6", "addr", "show", "dev", "vxlan.1"])?;
    assert!(addr.contains("fd00:10:244:1::/128"), "{addr}");
    let ns = l.spec.node_name(1);
    let fwd = mycni_testkit::sh(
        "ip",
        &[
            "netns",
            "exec",
            &ns,
            "sysctl",
            "-n",
            "net.ipv6.conf.all.forwarding",
        ],
    )?;
    assert_eq!(fwd.trim(), "1");
    wait_until(
        "node 2's IPv6 side on node 1",
        Duration::from_secs(10),
        || Ok(routes6(l)?.contains("fd00:10:244:2::/64 via fd00:10:244:2:: dev vxlan.1")),
    )?;
    // And the way back: node 1's IPv6 side on node 2.
    let ns2 = l.spec.node_name(2);
    wait_until(
        "node 1's IPv6 side on node 2",
        Duration::from_secs(10),
        || {
            Ok(
                mycni_testkit::sh("ip", &["-n", &ns2, "-6", "route", "show", "proto", "110"])?
                    .contains("fd00:10:244:1::/64"),
            )
        },
    )?;
    eprintln!(
        "node 1: {}\nnode 2: {}",
        mycni_testkit::sh("ip", &["-n", &ns, "-6", "route"])?,
        mycni_testkit::sh("ip", &["-n", &ns2, "-6", "route"])?
    );
    // The first datagram over a fresh overlay may wait on the underlay's
    // ARP for the peer and be dropped: reachable first, then no loss.
    wait_until(
        "a first IPv6 echo reply from node 2's VTEP address",
        Duration::from_secs(5),
        || {
            Ok(mycni_testkit::sh(
                "ip",
                &[
                    "netns",
                    "exec",
                    &ns,
                    "ping",
                    "-6",
                    "-c",
                    "1",
                    "-W",
                    "1",
                    "fd00:10:244:2::",
                ],
            )
            .is_ok_and(|out| out.contains(" 0% packet loss")))
        },
    )?;
    let ping = mycni_testkit::sh(
        "ip",
        &[
            "netns",
            "exec",
            &ns,
            "ping",
            "-6",
            "-c",
            "3",
            "-i",
            "0.2",
            "-W",
            "2",
            "fd00:10:244:2::",
        ],
    )?;
    assert!(ping.contains(" 0% packet loss"), "{ping}");
    Ok(())
}

/// A dual-stack pod's IPv6 connection to an address outside the cluster
/// leaves as the node's IPv6 address (`ip6 mycni`), as IPv4 leaves as its
/// IPv4 one: the outside does not route the pods' ULA range back.
#[test]
fn ipv6_pod_traffic_leaving_the_cluster_is_masqueraded() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let t = common::lab_stack(1, 1, mycni_lab::Stack::Dual, &[])?;
    let l = &t.0;
    let pod = l.pods()?.into_iter().next().context("a pod")?;
    let pod6 = pod.ip6.context("the pod has no IPv6 address")?;
    // IPv6 on the underlay, outside the cluster: the bridge and node 1's
    // uplink, node 1's IPv6 default route through the bridge.
    let (u, ns) = (l.spec.underlay_ns(), l.spec.node_name(1));
    for (netns, args) in [
        (
            &u,
            &[
                "-6",
                "addr",
                "add",
                "2001:db8:77::1/64",
                "dev",
                "br0",
                "nodad",
            ][..],
        ),
        (
            &ns,
            &[
                "-6",
                "addr",
                "add",
                "2001:db8:77::11/64",
                "dev",
                "eth0",
                "nodad",
            ],
        ),
        (
            &ns,
            &[
                "-6",
                "route",
                "add",
                "default",
                "via",
                "2001:db8:77::1",
                "dev",
                "eth0",
            ],
        ),
    ] {
        let mut a = vec!["-n", netns.as_str()];
        a.extend_from_slice(args);
        mycni_testkit::sh("ip", &a)?;
    }
    let peer = common::source_seen_outside(l, &pod.ns, "[2001:db8:77::1]:7001")?;
    assert_eq!(
        peer.ip().to_string(),
        "2001:db8:77::11",
        "pod {pod6} was not masqueraded"
    );
    Ok(())
}
