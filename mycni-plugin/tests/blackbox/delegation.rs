//! mycni with other plugins: a delegated IPAM, and chained after it.

use anyhow::Result;
use mycni_testkit::NetNs;
use mycni_testkit::cni::with_prev;
use serde_json::json;

use crate::{K8S_ARGS, VERSIONS, call, netns_path, node, pod_ip};

#[test]
fn chained_with_portmap_bandwidth_tuning() -> Result<()> {
    let node = node()?;
    let pod = NetNs::new("pod")?;
    let path = netns_path(&pod);
    let c = call("chain1", &path, K8S_ARGS);
    let mut first = node.conf("1.0.0", "10.244.11.0/24");
    first["name"] = json!("mycni0");
    let chain = [
        (
            "portmap",
            json!({"type": "portmap", "capabilities": {"portMappings": true}, "runtimeConfig": {"portMappings": [{"hostPort": 18080, "containerPort": 80, "protocol": "tcp"}]}}),
        ),
        (
            "bandwidth",
            json!({"type": "bandwidth", "ingressRate": 100_000_000, "ingressBurst": 1_000_000, "egressRate": 100_000_000, "egressBurst": 1_000_000}),
        ),
        (
            "tuning",
            json!({"type": "tuning", "sysctl": {"net.core.somaxconn": "512"}}),
        ),
    ];
    let before = node.snapshot()?;
    // The runtime's job, done by hand: each plugin gets the previous result.
    let add = node.run("mycni", "ADD", &c, &first)?;
    assert!(add.ok, "{}", add.stdout);
    let mut prev = add.json.clone();
    for (name, conf) in &chain {
        let mut conf = conf.clone();
        conf["cniVersion"] = json!("1.0.0");
        conf["name"] = json!("mycni0");
        let r = node.run(name, "ADD", &c, &with_prev(&conf, &prev))?;
        assert!(r.ok, "{name} ADD: {}", r.stdout);
        prev = r.json;
    }
    assert_eq!(
        pod.exec("sysctl", &["-n", "net.core.somaxconn"])?.trim(),
        "512"
    );
    // CHECK the whole chain against the final result.
    assert!(
        node.run("mycni", "CHECK", &c, &with_prev(&first, &prev))?
            .ok
    );
    // Debian's portmap 1.1.1 fails its own CHECK without IPv6 ("could not
    // check ipv6 dnat"), whoever comes first in the chain; skip it there.
    for (name, conf) in chain.iter().filter(|(n, _)| *n != "portmap") {
        let mut conf = conf.clone();
        conf["cniVersion"] = json!("1.0.0");
        conf["name"] = json!("mycni0");
        let r = node.run(name, "CHECK", &c, &with_prev(&conf, &prev))?;
        assert!(r.ok, "{name} CHECK: {}", r.stdout);
    }
    for (name, conf) in chain.iter().rev() {
        let mut conf = conf.clone();
        conf["cniVersion"] = json!("1.0.0");
        conf["name"] = json!("mycni0");
        assert!(
            node.run(name, "DEL", &c, &with_prev(&conf, &prev))?.ok,
            "{name} DEL"
        );
    }
    assert!(node.run("mycni", "DEL", &c, &with_prev(&first, &prev))?.ok);
    // Ignore the ifb device bandwidth may leave behind; it removes its own on DEL.
    assert_eq!(node.snapshot()?, before);
    Ok(())
}

/// host-local as the delegated IPAM with a config of every version mycni
/// speaks, ADD, CHECK and DEL leaving nothing behind (no veth, no route, no
/// lease): Debian's host-local speaks up to 1.0.0, so a 1.1.0 config (and
/// its prevResult) is handed to it in 1.0.0, and GC, which it does not have
/// in that version, is not delegated.
#[test]
fn delegated_host_local_ipam_every_version() -> Result<()> {
    let node = node()?;
    for (i, version) in VERSIONS.iter().enumerate() {
        let subnet = format!("10.244.{}.0/24", 20 + i);
        let mut conf = node.conf(version, &subnet);
        conf["ipam"] = json!({
            "type": "host-local",
            "ranges": [[{"subnet": subnet}]],
            "dataDir": node.dir.path().join("host-local"),
        });
        let pod = NetNs::new("pod")?;
        let path = netns_path(&pod);
        let c = call("c1", &path, K8S_ARGS);
        let before = node.snapshot()?;
        let add = node.run("mycni", "ADD", &c, &conf)?;
        assert!(add.ok, "{version}: {}", add.stdout);
        assert_eq!(add.json["cniVersion"], *version);
        assert!(
            pod_ip(&add.json).starts_with(&subnet[..9]),
            "{version}: {}",
            add.stdout
        );
        let prev = with_prev(&conf, &add.json);
        if *version != "0.3.1" {
            let check = node.run("mycni", "CHECK", &c, &prev)?;
            assert!(check.ok, "{version} CHECK: {}", check.stdout);
        }
        if *version == "1.1.0" {
            let mut gc = conf.clone();
            gc["cni.dev/valid-attachments"] = json!([{"containerID": "c1", "ifname": "eth0"}]);
            let r = node.run("mycni", "GC", &c, &gc)?;
            assert!(r.ok, "GC: {}", r.stdout);
        }
        assert!(node.run("mycni", "DEL", &c, &prev)?.ok, "{version} DEL");
        assert_eq!(node.snapshot()?, before, "{version}: nothing left");
        let leases = std::fs::read_dir(node.dir.path().join("host-local/mycni0"))?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("10."))
            .count();
        assert_eq!(leases, 0, "{version}: host-local lease released");
    }
    Ok(())
}
