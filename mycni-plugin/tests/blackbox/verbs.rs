//! Every CNI verb, in every supported version, on the good path.

use anyhow::Result;
use mycni_testkit::NetNs;
use mycni_testkit::cni::{Exec, with_prev};
use serde_json::json;

use crate::{K8S_ARGS, VERSIONS, call, netns_path, node, pod_ip};

#[test]
fn add_check_del_every_version() -> Result<()> {
    let node = node()?;
    let before = node.snapshot()?;
    for v in VERSIONS {
        let pod = NetNs::new("pod")?;
        let path = netns_path(&pod);
        let c = call("c1", &path, K8S_ARGS);
        let conf = node.conf(v, "10.244.1.0/24");
        let add = node.run("mycni", "ADD", &c, &conf)?;
        assert!(add.ok, "{v} ADD: {}", add.stdout);
        let r = &add.json;
        assert_eq!(r["cniVersion"], v);
        assert_eq!(r["interfaces"][1]["name"], "eth0");
        assert_eq!(r["interfaces"][1]["sandbox"], path.as_str());
        assert_eq!(r["interfaces"][0]["name"].as_str().map(str::len), Some(15));
        assert_eq!(r["ips"][0]["interface"], 1);
        assert_eq!(r["ips"][0]["gateway"], "169.254.1.1");
        assert!(
            r["ips"][0]["address"]
                .as_str()
                .is_some_and(|a| a.ends_with("/32"))
        );
        assert_eq!(
            r["ips"][0].get("version").is_some(),
            v < "1.0.0",
            "{v}: {r}"
        );
        assert_eq!(
            r["interfaces"][1].get("mtu").is_some(),
            v == "1.1.0",
            "{v}: {r}"
        );
        assert_eq!(r["routes"][0]["dst"], "0.0.0.0/0");

        // What ADD made, as seen from inside the pod.
        let addr = pod.exec("ip", &["-o", "-4", "addr", "show", "eth0"])?;
        assert!(addr.contains(&format!("{}/32", pod_ip(r))), "{addr}");
        let link = pod.exec("ip", &["link", "show", "eth0"])?;
        assert!(link.contains("mtu 1450"), "{link}");
        let neigh = pod.exec("ip", &["neigh", "show", "169.254.1.1"])?;
        assert!(neigh.contains("PERMANENT"), "{neigh}");

        let conf_prev = with_prev(&conf, r);
        if v != "0.3.1" {
            let check = node.run("mycni", "CHECK", &c, &conf_prev)?;
            assert!(check.ok, "{v} CHECK: {}", check.stdout);
            assert!(check.stdout.is_empty());
        } else {
            let check = node.run("mycni", "CHECK", &c, &conf_prev)?;
            assert_eq!(check.code(), Some(1), "CHECK is not in 0.3.1");
        }
        let del = node.run("mycni", "DEL", &c, &conf_prev)?;
        assert!(del.ok, "{v} DEL: {}", del.stdout);
        assert_eq!(node.snapshot()?, before, "{v}: DEL left something");
    }
    Ok(())
}

#[test]
fn version_command() -> Result<()> {
    let node = node()?;
    let r = node.run_raw(Exec::new("mycni", "VERSION"), &call("", "", ""), b"")?;
    assert!(r.ok);
    assert_eq!(r.json["supportedVersions"], json!(VERSIONS));
    Ok(())
}

#[test]
fn status_follows_the_agent() -> Result<()> {
    let node = node()?;
    let conf = node.conf("1.1.0", "10.244.1.0/24");
    let c = call("", "", "");
    let r = node.run("mycni", "STATUS", &c, &conf)?;
    assert_eq!(r.code(), Some(50), "no ready file: {}", r.stdout);
    std::fs::write(node.ready_file(), "")?;
    let r = node.run("mycni", "STATUS", &c, &conf)?;
    assert_eq!(r.code(), Some(50), "no vxlan.1: {}", r.stdout);
    node.ns.exec(
        "ip",
        &[
            "link", "add", "vxlan.1", "type", "vxlan", "id", "1", "dstport", "8472",
        ],
    )?;
    let r = node.run("mycni", "STATUS", &c, &conf)?;
    assert!(r.ok, "{}", r.stdout);
    let old = node.conf("1.0.0", "10.244.1.0/24");
    assert_eq!(node.run("mycni", "STATUS", &c, &old)?.code(), Some(1));
    Ok(())
}

#[test]
fn gc_frees_exactly_the_stale() -> Result<()> {
    let node = node()?;
    let conf = node.conf("1.1.0", "10.244.2.0/24");
    let pods: Vec<NetNs> = (0..3).map(|_| NetNs::new("pod")).collect::<Result<_>>()?;
    let paths: Vec<String> = pods.iter().map(netns_path).collect();
    let ids = ["gc-a", "gc-b", "gc-c"];
    for (id, p) in ids.iter().zip(&paths) {
        let r = node.run("mycni", "ADD", &call(id, p, ""), &conf)?;
        assert!(r.ok, "{}", r.stdout);
    }
    assert_eq!(node.lease_count(), 3);
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([
        {"containerID": "gc-a", "ifname": "eth0"},
        {"containerID": "gc-b", "ifname": "eth0"},
    ]);
    let r = node.run("mycni", "GC", &call("", "", ""), &gc)?;
    assert!(r.ok, "{}", r.stdout);
    assert_eq!(node.lease_count(), 2);
    assert!(
        pods[2].exec("ip", &["link", "show", "eth0"]).is_err(),
        "gc-c's veth survived GC"
    );
    for p in &pods[..2] {
        p.exec("ip", &["link", "show", "eth0"])?;
    }
    Ok(())
}

/// ADD tells the agent which Pod the veth is (from CNI_ARGS), before the
/// veth is up; DEL takes the record with the veth, and leaves a newer
/// sandbox's record of the same pod alone.
#[test]
fn add_records_the_pod_for_the_agent() -> Result<()> {
    let node = node()?;
    assert!(
        node.records_dir()
            .ends_with(mycni_common::contract::POD_RECORDS_DIR)
    );
    let before = node.snapshot()?;
    let pod = NetNs::new("pod")?;
    let path = netns_path(&pod);
    let c = call("c1", &path, K8S_ARGS);
    let conf = node.conf("1.1.0", "10.244.1.0/24");
    let add = node.run("mycni", "ADD", &c, &conf)?;
    assert!(add.ok, "ADD: {}", add.stdout);
    let veth = add.json["interfaces"][0]["name"]
        .as_str()
        .unwrap_or_default();
    let body = std::fs::read(node.records_dir().join(veth))?;
    let record: mycni_common::contract::PodRecord = serde_json::from_slice(&body)?;
    assert_eq!(record.namespace, "default");
    assert_eq!(record.name, "web-0");
    assert_eq!(record.container_id, "c1");
    assert_eq!(record.ifname, "eth0");
    assert_eq!(record.host_veth, veth);
    assert_eq!(
        record.ips,
        vec![pod_ip(&add.json).parse::<std::net::IpAddr>()?]
    );

    // A DEL of an older sandbox of the same pod (same veth name) must not
    // take the live sandbox's record.
    let old = call("c0", &path, K8S_ARGS);
    let del_old = node.run("mycni", "DEL", &old, &conf)?;
    assert!(del_old.ok, "DEL c0: {}", del_old.stdout);
    assert!(
        node.records_dir().join(veth).exists(),
        "c0's DEL took c1's record"
    );

    let del = node.run("mycni", "DEL", &c, &with_prev(&conf, &add.json))?;
    assert!(del.ok, "DEL: {}", del.stdout);
    assert_eq!(node.snapshot()?, before, "DEL left something");

    // Without the pod's name there is nothing to record.
    let anon = call("c2", &path, "");
    let add = node.run("mycni", "ADD", &anon, &conf)?;
    assert!(add.ok, "ADD: {}", add.stdout);
    assert_eq!(std::fs::read_dir(node.records_dir())?.count(), 0);
    let del = node.run("mycni", "DEL", &anon, &with_prev(&conf, &add.json))?;
    assert!(del.ok);
    Ok(())
}
