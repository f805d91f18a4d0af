//! Traffic through what ADD built: pod to pod, pod to node, no spoofing,
//! and many pods at once.

use std::collections::HashSet;

use anyhow::Result;
use mycni_testkit::NetNs;
use serde_json::Value;

use crate::{call, netns_path, node, pod_ip};

#[test]
fn pods_reach_each_other_and_the_node() -> Result<()> {
    let node = node()?;
    node.ns
        .exec("ip", &["addr", "add", "10.99.0.1/32", "dev", "lo"])?;
    let conf = node.conf("1.1.0", "10.244.8.0/24");
    let a = NetNs::new("pod")?;
    let b = NetNs::new("pod")?;
    let ra = node.run("mycni", "ADD", &call("a", &netns_path(&a), ""), &conf)?;
    let rb = node.run("mycni", "ADD", &call("b", &netns_path(&b), ""), &conf)?;
    assert!(ra.ok && rb.ok);
    let (ipa, ipb) = (pod_ip(&ra.json), pod_ip(&rb.json));
    a.exec("ping", &["-c", "2", "-i", "0.1", "-W", "1", &ipb])?;
    b.exec("ping", &["-c", "2", "-i", "0.1", "-W", "1", &ipa])?;
    a.exec("ping", &["-c", "2", "-i", "0.1", "-W", "1", "10.99.0.1"])?;
    node.ns
        .exec("ping", &["-c", "2", "-i", "0.1", "-W", "1", &ipa])?;
    Ok(())
}

/// The fallback behind the static neighbour: with it gone, the pod ARPs
/// for 169.254.1.1 and its host veth answers by proxy ARP at once.
#[test]
fn the_host_veth_answers_arp_for_the_gateway_at_once() -> Result<()> {
    let node = node()?;
    let conf = node.conf("1.1.0", "10.244.13.0/24");
    let pod = NetNs::new("pod")?;
    let add = node.run("mycni", "ADD", &call("p", &netns_path(&pod), ""), &conf)?;
    assert!(add.ok, "{}", add.stdout);
    let host = add.json["interfaces"][0]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    for (key, want) in [
        (format!("net.ipv4.conf.{host}.proxy_arp"), "1"),
        (format!("net.ipv4.conf.{host}.rp_filter"), "1"),
        (format!("net.ipv4.neigh.{host}.proxy_delay"), "0"),
    ] {
        assert_eq!(node.ns.exec("sysctl", &["-n", &key])?.trim(), want, "{key}");
    }
    // Proxy ARP answers only for an address the node routes through
    // another interface, as a node's default route does.
    for args in [
        &[
            "link",
            "add",
            "uplink",
            "type",
            "veth",
            "peer",
            "name",
            "uplink-end",
        ][..],
        &["link", "set", "uplink-end", "up"],
        &["link", "set", "uplink", "up"],
        &["route", "add", "default", "dev", "uplink"],
        &["addr", "add", "10.99.0.2/32", "dev", "lo"],
    ] {
        node.ns.exec("ip", args)?;
    }
    // A proxy_delay left at its default would hold the answer up to 0.8 s,
    // mostly past ping's 0.3 s deadline.
    pod.exec("ip", &["neigh", "flush", "dev", "eth0", "nud", "permanent"])?;
    pod.exec("ping", &["-c", "1", "-W", "0.3", "10.99.0.2"])?;
    let neigh = pod.exec("ip", &["neigh", "show", "169.254.1.1", "dev", "eth0"])?;
    assert!(
        neigh.contains("lladdr"),
        "gateway not learned by ARP: {neigh}"
    );
    Ok(())
}

/// The plugin alone, as a runtime or a test harness runs it with only its
/// conflist: it turns forwarding on itself, as the reference `ptp` does,
/// instead of relying on the agent.
#[test]
fn pods_reach_each_other_with_only_the_plugin_and_forwarding_off() -> Result<()> {
    let node = node()?;
    node.ns.exec("sysctl", &["-qw", "net.ipv4.ip_forward=0"])?;
    let conf = node.conf("1.1.0", "10.244.12.0/24");
    let a = NetNs::new("pod")?;
    let b = NetNs::new("pod")?;
    let ra = node.run("mycni", "ADD", &call("a", &netns_path(&a), ""), &conf)?;
    let rb = node.run("mycni", "ADD", &call("b", &netns_path(&b), ""), &conf)?;
    assert!(ra.ok && rb.ok, "{} {}", ra.stdout, rb.stdout);
    let fwd = node.ns.exec("sysctl", &["-n", "net.ipv4.ip_forward"])?;
    assert_eq!(fwd.trim(), "1", "ADD turned forwarding on");
    let (ipa, ipb) = (pod_ip(&ra.json), pod_ip(&rb.json));
    a.exec("ping", &["-c", "2", "-i", "0.1", "-W", "1", &ipb])?;
    b.exec("ping", &["-c", "2", "-i", "0.1", "-W", "1", &ipa])?;
    Ok(())
}

/// A kernel counter of the namespace (absolute, not nstat's delta).
fn nstat(ns: &NetNs, name: &str) -> Result<u64> {
    let out = ns.exec("nstat", &["-asz", "-j", name])?;
    let v: Value = serde_json::from_str(&out)?;
    Ok(v["kernel"][name].as_u64().unwrap_or_default())
}

/// Anti-spoofing on the kernel path: a pod may send only from its own
/// address. Neither another pod's address on the node nor an outside one
/// (with a default route on the node, so loose reverse-path filtering
/// would let it through) gets past the host veth, and the kernel counts
/// each drop; the pod's real address still works.
#[test]
fn a_pod_cannot_send_from_an_address_that_is_not_its_own() -> Result<()> {
    let node = node()?;
    node.ns
        .exec("ip", &["addr", "add", "10.99.0.1/32", "dev", "lo"])?;
    // An "uplink" for the default route (this kernel has no dummy device).
    node.ns.exec(
        "ip",
        &[
            "link", "add", "up0", "up", "type", "veth", "peer", "name", "up1",
        ],
    )?;
    node.ns.exec("ip", &["link", "set", "up1", "up"])?;
    node.ns
        .exec("ip", &["route", "add", "default", "dev", "up0"])?;
    let conf = node.conf("1.1.0", "10.244.13.0/24");
    let a = NetNs::new("pod")?;
    let b = NetNs::new("pod")?;
    let ra = node.run("mycni", "ADD", &call("a", &netns_path(&a), ""), &conf)?;
    let rb = node.run("mycni", "ADD", &call("b", &netns_path(&b), ""), &conf)?;
    assert!(ra.ok && rb.ok, "{} {}", ra.stdout, rb.stdout);
    let (ipa, ipb) = (pod_ip(&ra.json), pod_ip(&rb.json));
    a.exec("ping", &["-c", "1", "-W", "1", "-I", &ipa, "10.99.0.1"])?;
    for spoofed in [ipb.as_str(), "8.8.8.8"] {
        a.exec(
            "ip",
            &["addr", "add", &format!("{spoofed}/32"), "dev", "eth0"],
        )?;
        let drops = nstat(&node.ns, "TcpExtIPReversePathFilter")?;
        let echos = nstat(&node.ns, "IcmpInEchos")?;
        // The answer goes to the address's owner, so only the node's
        // counters tell whether the request got in.
        let _ = a.exec(
            "ping",
            &[
                "-c",
                "2",
                "-i",
                "0.2",
                "-W",
                "1",
                "-I",
                spoofed,
                "10.99.0.1",
            ],
        );
        let delivered = nstat(&node.ns, "IcmpInEchos")? - echos;
        let dropped = nstat(&node.ns, "TcpExtIPReversePathFilter")? - drops;
        assert_eq!(delivered, 0, "pings from {spoofed} reached the node");
        assert!(
            dropped >= 2,
            "{dropped} drops counted for 2 pings from {spoofed}"
        );
        a.exec(
            "ip",
            &["addr", "del", &format!("{spoofed}/32"), "dev", "eth0"],
        )?;
    }
    a.exec("ping", &["-c", "1", "-W", "1", "-I", &ipa, "10.99.0.1"])?;
    Ok(())
}

#[test]
fn hundred_parallel_adds_and_dels() -> Result<()> {
    let node = node()?;
    let conf = node.conf("1.1.0", "10.244.9.0/24");
    let before = node.snapshot()?;
    let pods: Vec<NetNs> = (0..100).map(|_| NetNs::new("p")).collect::<Result<_>>()?;
    let paths: Vec<String> = pods.iter().map(netns_path).collect();
    let ids: Vec<String> = (0..100).map(|i| format!("par{i}")).collect();
    let run_all = |cmd: &'static str| -> Result<Vec<Value>> {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..100)
                .map(|i| {
                    let (id, p, node, conf) = (&ids[i], &paths[i], &node, &conf);
                    s.spawn(move || -> Result<Value> {
                        let r = node.run("mycni", cmd, &call(id, p, ""), conf)?;
                        anyhow::ensure!(r.ok, "{cmd} {id}: {}", r.stdout);
                        Ok(r.json)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().map_err(|_| anyhow::anyhow!("panic"))?)
                .collect()
        })
    };
    let results = run_all("ADD")?;
    let ips: HashSet<String> = results.iter().map(pod_ip).collect();
    assert_eq!(ips.len(), 100, "IPs are unique");
    assert_eq!(node.lease_count(), 100);
    run_all("DEL")?;
    assert_eq!(node.lease_count(), 0);
    assert_eq!(node.snapshot()?, before, "no veth or route left");
    Ok(())
}
