//! The real `mycni-agent` keeps the fast path's IPv6 maps a mirror of the
//! kernel (issue 14): a peer Node's IPv6 podCIDR is in `mycni_remote6`
//! once the agent has programmed it on vxlan.1 (with the peer's VTEP MAC
//! and IPv4 host, never direct) and leaves with it; a pod's IPv6 /128 host
//! route (protocol 109, through a mycni host veth) puts the pod in
//! `mycni_local6` and gets the from-pod program attached to its veth, and
//! the route's removal takes it out again.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use mycni_agent::datapath::{LOCAL6, Prog, REMOTE6, pinned_links};
use mycni_apiserver::node;
use mycni_common::net::Mac;
use mycni_common::{LocalEndpoint, RemoteNode};
use mycni_testkit::{NetNs, sh};

use crate::common;

use common::{CLUSTER_DUAL as CLUSTER, set_pod_cidrs};

fn wait_until(what: &str, f: impl FnMut() -> Result<bool>) -> Result<()> {
    common::wait_every(what, Duration::from_secs(5), Duration::from_millis(20), f).map(drop)
}

fn remote6(pin: &Path) -> Result<BTreeMap<(Ipv6Addr, u8), RemoteNode>> {
    Ok(REMOTE6.read(pin)?)
}

#[test]
fn the_ipv6_maps_mirror_the_kernels_peers_and_pods() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let t = common::lab_with(1, 0, &["--cluster-cidr", CLUSTER])?;
    let l = &t.0;
    ensure!(
        l.metrics(1)?.lines().any(|x| x == "mycni_datapath_ebpf 1"),
        "node 1 runs the kernel path: {}",
        l.readyz(1)?
    );
    let pin = l.spec.pin_dir(1);
    let api = l.api.as_ref().context("api")?;

    // A dual-stack peer.
    let mac: Mac = "02:00:00:00:20:01".parse()?;
    let host = Ipv4Addr::new(192, 168, 77, 120);
    let mut peer = node("peer-a", None);
    set_pod_cidrs(&mut peer, &["10.244.20.0/24", "fd00:10:244:20::/64"]);
    peer.metadata.annotations = Some(BTreeMap::from([
        ("mycni.dev/vtep-mac".to_string(), mac.to_string()),
        ("mycni.dev/host-ip".to_string(), host.to_string()),
    ]));
    api.create_node(peer)?;
    let want = BTreeMap::from([(
        ("fd00:10:244:20::".parse::<Ipv6Addr>()?, 64),
        RemoteNode {
            vtep_mac: mac.0,
            flags: 0,
            _pad: 0,
            host_ip: u32::from_ne_bytes(host.octets()),
        },
    )]);
    wait_until("the peer's IPv6 podCIDR in mycni_remote6", || {
        Ok(remote6(&pin)? == want)
    })?;
    let node_ns = l.spec.node_name(1);
    let inspect = || -> Result<String> {
        let bpffs = l.spec.bpffs().join("node1");
        common::ns_sh(
            &node_ns,
            &l.spec.bins.agent.to_string_lossy(),
            &["inspect", "--bpffs", &bpffs.to_string_lossy()],
        )
    };
    let shown = inspect()?;
    ensure!(
        shown.contains(&format!("fd00:10:244:20::/64 -> VTEP {mac}  host {host}"))
            && shown.contains("1 IPv6"),
        "inspect lacks the IPv6 peer:\n{shown}"
    );
    // Its IPv6 side goes, the map entry with it.
    api.update_node("peer-a", |n| set_pod_cidrs(n, &["10.244.20.0/24"]))?;
    wait_until("mycni_remote6 emptied", || Ok(remote6(&pin)?.is_empty()))?;

    // A pod as the plugin makes an IPv6 one, on node 1.
    let pod = NetNs::new("p6")?;
    let veth = "mycnitest6a";
    sh(
        "ip",
        &[
            "link",
            "add",
            veth,
            "netns",
            &node_ns,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            pod.name(),
        ],
    )?;
    let pod_ip: Ipv6Addr = "fd00:10:244:1::77".parse()?;
    for args in [
        vec!["link", "set", veth, "alias", "mycni:test:c6:eth0"],
        vec!["link", "set", veth, "up"],
    ] {
        let mut a = vec!["-n", node_ns.as_str()];
        a.extend(args);
        sh("ip", &a)?;
    }
    pod.exec("ip", &["link", "set", "eth0", "up"])?;
    let read = |ns: &str, dev: &str, attr: &str| -> Result<String> {
        Ok(sh(
            "ip",
            &[
                "netns",
                "exec",
                ns,
                "cat",
                &format!("/sys/class/net/{dev}/{attr}"),
            ],
        )?
        .trim()
        .to_owned())
    };
    let ifindex: u32 = read(&node_ns, veth, "ifindex")?.parse()?;
    let host_mac: Mac = read(&node_ns, veth, "address")?.parse()?;
    let pod_mac: Mac = read(pod.name(), "eth0", "address")?.parse()?;
    let route = format!("{pod_ip}/128");
    sh(
        "ip",
        &[
            "-n", &node_ns, "-6", "route", "add", &route, "dev", veth, "proto", "109",
        ],
    )?;
    let ep = LocalEndpoint {
        ifindex,
        pod_mac: pod_mac.0,
        host_mac: host_mac.0,
    };
    wait_until("the pod in mycni_local6", || {
        Ok(LOCAL6.read(&pin)?.get(&pod_ip) == Some(&ep))
    })?;
    wait_until("the from-pod program on its veth", || {
        Ok(pinned_links(&pin)?.contains(&(Prog::FromPod, ifindex)))
    })?;
    let shown = inspect()?;
    ensure!(
        shown.contains(&format!("{pod_ip}")) && shown.contains(&format!("pod MAC {pod_mac}")),
        "inspect lacks the IPv6 pod:\n{shown}"
    );
    sh(
        "ip",
        &["-n", &node_ns, "-6", "route", "del", &route, "dev", veth],
    )?;
    wait_until("the pod out of mycni_local6", || {
        Ok(!LOCAL6.read(&pin)?.contains_key(&pod_ip))
    })?;
    Ok(())
}
