//! The real `mycni-agent` binary in a lab node namespace against the
//! Kubernetes API fixture (in-process here, so the tests change Nodes and
//! inject faults directly): peers follow Node events, hostile Nodes are
//! rejected and counted, kernel drift is repaired, a restarted agent
//! removes what it owned for Nodes deleted while it was down.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use mycni_apiserver::node;
use mycni_lab::Lab;

mod common;
use common::lab;

fn wait_until(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> Result<bool>,
) -> Result<Duration> {
    let start = Instant::now();
    let mut last = None;
    while start.elapsed() < timeout {
        match f() {
            Ok(true) => return Ok(start.elapsed()),
            Ok(false) => {}
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("{what}: not within {timeout:?} (last error: {last:?})")
}

fn peer_node(name: &str, cidr: &str, mac: &str, ip: &str) -> k8s_openapi::api::core::v1::Node {
    let mut n = node(name, Some(cidr));
    let ann: BTreeMap<String, String> = [
        ("mycni.dev/vtep-mac".to_string(), mac.to_string()),
        ("mycni.dev/host-ip".to_string(), ip.to_string()),
    ]
    .into();
    n.metadata.annotations = Some(ann);
    n
}

/// Route, neighbour and FDB state of vxlan.1 on lab node 1, as text.
fn overlay(l: &Lab) -> Result<String> {
    let ns = l.spec.node_name(1);
    let ip = |args: &[&str]| -> Result<String> {
        let mut a = vec!["-n", ns.as_str()];
        a.extend_from_slice(args);
        mycni_testkit::sh("ip", &a)
    };
    let routes = ip(&["route", "show", "proto", "110"])?;
    let neigh = ip(&["neigh", "show", "dev", "vxlan.1"])?;
    let fdb = mycni_testkit::sh("bridge", &["-n", &ns, "fdb", "show", "dev", "vxlan.1"])?;
    Ok(format!("{routes}{neigh}{fdb}"))
}

#[test]
fn peers_follow_node_add_update_delete() -> Result<()> {
    let t = lab(1, 0)?;
    let l = &t.0;
    let api = l.api.as_ref().context("api")?;
    api.create_node(peer_node(
        "peer-a",
        "10.244.20.0/24",
        "02:00:00:00:20:01",
        "192.168.77.120",
    ))?;
    wait_until("peer-a programmed", Duration::from_secs(5), || {
        let o = overlay(l)?;
        Ok(o.contains("10.244.20.0/24 via 10.244.20.0 dev vxlan.1")
            && o.contains("10.244.20.0 lladdr 02:00:00:00:20:01 PERMANENT")
            && o.contains("02:00:00:00:20:01 dst 192.168.77.120 self permanent"))
    })?;
    // MAC changes: neighbour follows, the old FDB entry goes.
    api.update_node("peer-a", |n| {
        n.metadata
            .annotations
            .get_or_insert_default()
            .insert("mycni.dev/vtep-mac".into(), "02:00:00:00:20:02".into());
    })?;
    wait_until("MAC change applied", Duration::from_secs(5), || {
        let o = overlay(l)?;
        Ok(o.contains("10.244.20.0 lladdr 02:00:00:00:20:02 PERMANENT")
            && o.contains("02:00:00:00:20:02 dst 192.168.77.120")
            && !o.contains("02:00:00:00:20:01"))
    })?;
    // Host IP changes: the FDB entry points at the new host.
    api.update_node("peer-a", |n| {
        n.metadata
            .annotations
            .get_or_insert_default()
            .insert("mycni.dev/host-ip".into(), "192.168.77.121".into());
    })?;
    wait_until("host IP change applied", Duration::from_secs(5), || {
        let o = overlay(l)?;
        Ok(o.contains("02:00:00:00:20:02 dst 192.168.77.121") && !o.contains("192.168.77.120"))
    })?;
    // podCIDR changes: route and neighbour move.
    api.update_node("peer-a", |n| {
        let spec = n.spec.get_or_insert_default();
        spec.pod_cidr = Some("10.244.21.0/24".into());
        spec.pod_cidrs = Some(vec!["10.244.21.0/24".into()]);
    })?;
    wait_until("podCIDR change applied", Duration::from_secs(5), || {
        let o = overlay(l)?;
        Ok(o.contains("10.244.21.0/24 via 10.244.21.0") && !o.contains("10.244.20.0"))
    })?;
    api.delete_node("peer-a")?;
    wait_until("deleted node removed", Duration::from_secs(5), || {
        Ok(overlay(l)?.trim().is_empty())
    })?;
    Ok(())
}

#[test]
fn hostile_nodes_are_rejected_and_counted() -> Result<()> {
    let t = lab(1, 0)?;
    let l = &t.0;
    let api = l.api.as_ref().context("api")?;
    for (name, n) in [
        (
            "bad-mac",
            peer_node(
                "bad-mac",
                "10.244.30.0/24",
                "01:00:5e:00:00:01",
                "192.168.77.130",
            ),
        ),
        (
            "bad-ip",
            peer_node("bad-ip", "10.244.31.0/24", "02:00:00:00:31:01", "224.0.0.5"),
        ),
        (
            "outside",
            peer_node(
                "outside",
                "10.99.0.0/24",
                "02:00:00:00:32:01",
                "192.168.77.132",
            ),
        ),
        (
            "overlap",
            peer_node(
                "overlap",
                "10.244.1.0/25",
                "02:00:00:00:33:01",
                "192.168.77.133",
            ),
        ),
        (
            "garbage",
            peer_node("garbage", "10.244.34.0/24", "\u{0}\u{1}💥", "not an ip"),
        ),
    ] {
        api.create_node(n).with_context(|| name.to_string())?;
    }
    api.create_node(peer_node(
        "good",
        "10.244.40.0/24",
        "02:00:00:00:40:01",
        "192.168.77.140",
    ))?;
    wait_until("the good peer programmed", Duration::from_secs(5), || {
        Ok(overlay(l)?.contains("10.244.40.0/24 via 10.244.40.0"))
    })?;
    let o = overlay(l)?;
    for bad in [
        "10.244.30.",
        "10.244.31.",
        "10.99.0.",
        "10.244.1.0",
        "10.244.34.",
    ] {
        assert!(!o.contains(bad), "{bad} programmed: {o}");
    }
    let m = l.metrics(1)?;
    for reason in [
        "bad_mac",
        "bad_host_ip",
        "outside_cluster_cidr",
        "overlaps_own",
    ] {
        assert!(
            m.contains(&format!("mycni_rejected_peers{{reason=\"{reason}\"}}")),
            "no {reason} in {m}"
        );
    }
    assert!(
        m.contains("mycni_rejected_peers{reason=\"bad_mac\"} 2"),
        "{m}"
    );
    assert!(m.contains("mycni_peers_programmed 1"), "{m}");
    Ok(())
}

#[test]
fn own_node_published_and_handed_over() -> Result<()> {
    let t = lab(1, 0)?;
    let l = &t.0;
    let api = l.api.as_ref().context("api")?;
    let me = api.get_node(&l.spec.node_name(1)).context("own node")?;
    let ann = me.metadata.annotations.clone().unwrap_or_default();
    let link = mycni_testkit::sh(
        "ip",
        &["-n", &l.spec.node_name(1), "-o", "link", "show", "vxlan.1"],
    )?;
    let mac = ann.get("mycni.dev/vtep-mac").context("no MAC annotation")?;
    assert!(
        link.contains(&format!("link/ether {mac}")),
        "{link} vs {mac}"
    );
    assert_eq!(
        ann.get("mycni.dev/host-ip").map(String::as_str),
        Some("192.168.77.11")
    );
    let cond = me
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "NetworkUnavailable")
        .context("no NetworkUnavailable condition")?;
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_deref()),
        ("False", Some("MycniIsUp"))
    );
    let conf: serde_json::Value = serde_json::from_slice(&std::fs::read(
        l.spec.node_dir(1).join("net.d/00-mycni.conflist"),
    )?)?;
    assert_eq!(conf["name"], "mycni0");
    assert_eq!(conf["cniVersion"], "1.1.0");
    assert_eq!(conf["plugins"][0]["mtu"], 1450, "underlay 1500 - 50");
    assert_eq!(conf["plugins"][0]["ipam"]["subnet"], "10.244.1.0/24");
    assert!(l.spec.node_dir(1).join("run/ready").exists());
    assert!(
        mycni_testkit::sh(
            "ip",
            &["-n", &l.spec.node_name(1), "-o", "addr", "show", "vxlan.1"]
        )?
        .contains("10.244.1.0/32")
    );
    assert!(l.metrics(1)?.contains("mycni_ready 1"));
    Ok(())
}

/// With the periodic full pass a minute away, every kind of drift is
/// repaired at once: the kernel's notification of the deletion wakes a
/// full pass (`kwatch`).
#[test]
fn kernel_drift_is_repaired_at_once_without_waiting_for_the_periodic_pass() -> Result<()> {
    let t = common::lab_with(1, 0, &["--resync", "60s", "--liveness-stale-after", "180s"])?;
    let l = &t.0;
    let api = l.api.as_ref().context("api")?;
    api.create_node(peer_node(
        "peer-d",
        "10.244.50.0/24",
        "02:00:00:00:50:01",
        "192.168.77.150",
    ))?;
    let whole = |o: &str| {
        o.contains("10.244.50.0/24 via 10.244.50.0 dev vxlan.1")
            && o.contains("10.244.50.0 lladdr 02:00:00:00:50:01 PERMANENT")
            && o.contains("02:00:00:00:50:01 dst 192.168.77.150 self permanent")
    };
    wait_until("programmed", Duration::from_secs(5), || {
        Ok(whole(&overlay(l)?))
    })?;
    let ns = l.spec.node_name(1);
    let faults: [(&str, Vec<&str>); 4] = [
        (
            "routes flushed",
            vec!["ip", "-n", &ns, "route", "flush", "proto", "110"],
        ),
        (
            "neighbour deleted",
            vec![
                "ip",
                "-n",
                &ns,
                "neigh",
                "del",
                "10.244.50.0",
                "dev",
                "vxlan.1",
            ],
        ),
        (
            "FDB flushed",
            vec![
                "bridge",
                "-n",
                &ns,
                "fdb",
                "del",
                "02:00:00:00:50:01",
                "dev",
                "vxlan.1",
                "self",
            ],
        ),
        (
            "vxlan.1 deleted",
            vec!["ip", "-n", &ns, "link", "del", "vxlan.1"],
        ),
    ];
    let mut report = Vec::new();
    for (what, cmd) in &faults {
        mycni_testkit::sh(cmd[0], &cmd[1..])?;
        let took = wait_until(
            &format!("repair after {what}"),
            Duration::from_secs(5),
            || Ok(whole(&overlay(l)?)),
        )?;
        report.push(format!("{what}: {} ms", took.as_millis()));
        // Well under the 60 s resync; ~10-80 ms here (50 ms polling), with
        // room for a loaded 2-core machine.
        assert!(
            took < Duration::from_millis(500),
            "{what} repaired after {took:?}: not event-driven"
        );
    }
    eprintln!("drift repair: {}", report.join(", "));
    assert!(
        l.metrics(1)?
            .lines()
            .any(|x| x.starts_with("mycni_kernel_drift_repaired_total ") && !x.ends_with(" 0"))
    );
    Ok(())
}

#[test]
fn restart_removes_nodes_deleted_while_down_and_keeps_the_mac() -> Result<()> {
    let t = lab(1, 0)?;
    let l = &t.0;
    let api = l.api.as_ref().context("api")?;
    api.create_node(peer_node(
        "gone",
        "10.244.60.0/24",
        "02:00:00:00:60:01",
        "192.168.77.160",
    ))?;
    api.create_node(peer_node(
        "stays",
        "10.244.61.0/24",
        "02:00:00:00:61:01",
        "192.168.77.161",
    ))?;
    wait_until("both programmed", Duration::from_secs(5), || {
        let o = overlay(l)?;
        Ok(o.contains("10.244.60.0/24") && o.contains("10.244.61.0/24"))
    })?;
    let mac_before = mycni_testkit::sh(
        "ip",
        &["-n", &l.spec.node_name(1), "-o", "link", "show", "vxlan.1"],
    )?;
    l.stop_agent(1);
    // Gone while nobody watches; the datapath stays meanwhile.
    api.delete_node("gone")?;
    assert!(
        overlay(l)?.contains("10.244.60.0/24"),
        "agent exit must leave the datapath"
    );
    // Recreating the device too: the MAC must come back the same.
    mycni_testkit::sh(
        "ip",
        &["-n", &l.spec.node_name(1), "link", "del", "vxlan.1"],
    )?;
    l.start_agent(1)?;
    wait_until(
        "stale entries removed after restart",
        Duration::from_secs(10),
        || {
            let o = overlay(l)?;
            Ok(!o.contains("10.244.60.0")
                && !o.contains("02:00:00:00:60:01")
                && o.contains("10.244.61.0/24"))
        },
    )?;
    let mac_after = mycni_testkit::sh(
        "ip",
        &["-n", &l.spec.node_name(1), "-o", "link", "show", "vxlan.1"],
    )?;
    let mac = |s: &str| {
        s.split("link/ether ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .map(str::to_string)
    };
    assert_eq!(mac(&mac_before), mac(&mac_after));
    Ok(())
}

#[test]
fn api_outage_keeps_the_datapath_and_recovers() -> Result<()> {
    let t = lab(1, 0)?;
    let l = &t.0;
    let api = l.api.as_ref().context("api")?;
    api.create_node(peer_node(
        "p",
        "10.244.70.0/24",
        "02:00:00:00:70:01",
        "192.168.77.170",
    ))?;
    wait_until("programmed", Duration::from_secs(5), || {
        Ok(overlay(l)?.contains("10.244.70.0/24"))
    })?;
    l.set_api_reachable(false)?;
    wait_until("agent notices the outage", Duration::from_secs(10), || {
        Ok(l.metrics(1)?.contains("mycni_api_reachable 0"))
    })?;
    std::thread::sleep(Duration::from_secs(2));
    assert!(overlay(l)?.contains("10.244.70.0/24"), "outage wiped state");
    api.create_node(peer_node(
        "q",
        "10.244.71.0/24",
        "02:00:00:00:71:01",
        "192.168.77.171",
    ))?;
    l.set_api_reachable(true)?;
    let took = wait_until("new peer after reconnect", Duration::from_secs(30), || {
        Ok(overlay(l)?.contains("10.244.71.0/24"))
    })?;
    eprintln!(
        "reconnected and converged {} ms after the API came back",
        took.as_millis()
    );
    Ok(())
}

#[test]
fn pod_traffic_leaving_the_cluster_is_masqueraded_and_uninstall_cleans_up() -> Result<()> {
    use std::io::{Read, Write};
    let t = lab(1, 1)?;
    let l = &t.0;
    let pod = l.pods()?.into_iter().next().context("a pod")?;
    // A server outside the cluster CIDR: the underlay bridge address.
    let listener = mycni_testkit::in_netns(&l.spec.underlay_ns(), || {
        std::net::TcpListener::bind("192.168.77.1:7001")
    })??;
    let server = std::thread::spawn(move || -> Result<std::net::SocketAddr> {
        let (mut c, peer) = listener.accept()?;
        let mut buf = [0u8; 6];
        c.read_exact(&mut buf)?;
        c.write_all(&buf)?;
        Ok(peer)
    });
    mycni_testkit::sh(
        "ip",
        &[
            "netns",
            "exec",
            &pod.ns,
            &l.spec.bins.lab.to_string_lossy(),
            "tcp-probe",
            "192.168.77.1:7001",
        ],
    )?;
    let peer = server
        .join()
        .map_err(|_| anyhow::anyhow!("server panicked"))??;
    assert_eq!(
        peer.ip().to_string(),
        "192.168.77.11",
        "pod {} was not masqueraded",
        pod.ip
    );

    // uninstall removes what run installed (the agent is stopped first, as
    // the documented procedure does).
    let ns = l.spec.node_name(1);
    l.stop_agent(1);
    let dir = l.spec.node_dir(1);
    let p = |s: &str| dir.join(s).to_string_lossy().into_owned();
    mycni_testkit::sh(
        "ip",
        &[
            "netns",
            "exec",
            &ns,
            &l.spec.bins.agent.to_string_lossy(),
            "uninstall",
            "--cni-conf-dir",
            &p("net.d"),
            "--state-dir",
            &p("run"),
            "--proc-sys",
            "/proc/sys",
        ],
    )?;
    let tables = mycni_testkit::sh("ip", &["netns", "exec", &ns, "nft", "list", "tables"])?;
    assert!(!tables.contains("mycni"), "{tables}");
    assert!(mycni_testkit::sh("ip", &["-n", &ns, "link", "show", "vxlan.1"]).is_err());
    assert!(!dir.join("net.d/00-mycni.conflist").exists());
    Ok(())
}
