//! What a runtime may get wrong: malformed or impossible requests fail
//! with the spec's codes and change nothing, and DEL copes with a
//! netns or a cached result that is already gone.

use anyhow::Result;
use mycni_testkit::NetNs;
use mycni_testkit::cni::{Call, Exec};
use serde_json::{Value, json};

use crate::{K8S_ARGS, call, netns_path, node};

#[test]
fn bad_inputs_get_spec_codes_and_change_nothing() -> Result<()> {
    let node = node()?;
    let pod = NetNs::new("pod")?;
    let path = netns_path(&pod);
    let good = node.conf("1.0.0", "10.244.3.0/24");
    // Occupy an address so "exhausted" has a full range.
    let mut tiny = good.clone();
    tiny["ipam"]["rangeStart"] = json!("10.244.3.10");
    tiny["ipam"]["rangeEnd"] = json!("10.244.3.10");
    let other = NetNs::new("pod")?;
    let other_path = netns_path(&other);
    assert!(
        node.run("mycni", "ADD", &call("holder", &other_path, ""), &tiny)?
            .ok
    );

    let before = node.snapshot()?;
    let pod_before = pod.exec("ip", &["-o", "link"])?;
    let c = call("c1", &path, K8S_ARGS);
    let with = |f: &dyn Fn(&mut Value)| {
        let mut v = good.clone();
        f(&mut v);
        v.to_string().into_bytes()
    };
    let missing_ns = "/run/netns/mycni-does-not-exist".to_string();
    type Case<'a> = (&'a str, Vec<u8>, Call<'a>, Vec<(&'a str, &'a str)>, u64);
    let cases: Vec<Case> = vec![
        (
            "malformed JSON",
            b"{not json".to_vec(),
            c.clone(),
            vec![],
            6,
        ),
        (
            "unknown version",
            with(&|v| v["cniVersion"] = json!("2.0.0")),
            c.clone(),
            vec![],
            1,
        ),
        (
            "missing name",
            with(&|v| {
                v.as_object_mut().map(|o| o.remove("name"));
            }),
            c.clone(),
            vec![],
            7,
        ),
        (
            "no ipam",
            with(&|v| {
                v.as_object_mut().map(|o| o.remove("ipam"));
            }),
            c.clone(),
            vec![],
            7,
        ),
        (
            "IPv6 /128 subnet",
            with(&|v| v["ipam"]["subnet"] = json!("fd00::1/128")),
            c.clone(),
            vec![],
            7,
        ),
        (
            "bad mtu",
            with(&|v| v["mtu"] = json!(10)),
            c.clone(),
            vec![],
            7,
        ),
        (
            "missing IPAM plugin",
            with(&|v| v["ipam"]["type"] = json!("nope")),
            c.clone(),
            vec![],
            7,
        ),
        (
            "missing container ID",
            good.to_string().into_bytes(),
            Call {
                container_id: "",
                ..c.clone()
            },
            vec![],
            4,
        ),
        (
            "bad ifname",
            good.to_string().into_bytes(),
            Call {
                ifname: "a/b",
                ..c.clone()
            },
            vec![],
            4,
        ),
        (
            "long ifname",
            good.to_string().into_bytes(),
            Call {
                ifname: "eth0123456789012",
                ..c.clone()
            },
            vec![],
            4,
        ),
        (
            "missing netns",
            good.to_string().into_bytes(),
            Call {
                netns: &missing_ns,
                ..c.clone()
            },
            vec![],
            3,
        ),
        (
            "empty netns",
            good.to_string().into_bytes(),
            Call {
                netns: "",
                ..c.clone()
            },
            vec![],
            4,
        ),
        (
            "unknown CNI_ARGS",
            good.to_string().into_bytes(),
            Call {
                args: "FOO=1",
                ..c.clone()
            },
            vec![],
            2,
        ),
        (
            "malformed CNI_ARGS",
            good.to_string().into_bytes(),
            Call {
                args: "FOO",
                ..c.clone()
            },
            vec![],
            4,
        ),
        (
            "exhausted range",
            tiny.to_string().into_bytes(),
            c.clone(),
            vec![],
            102,
        ),
        (
            "ifname exists in pod",
            good.to_string().into_bytes(),
            Call {
                ifname: "lo",
                ..c.clone()
            },
            vec![],
            4,
        ),
    ];
    for (what, stdin, call, env, code) in cases {
        let r = node.run_raw(Exec::new("mycni", "ADD").env(&env), &call, &stdin)?;
        assert!(!r.ok, "{what}: succeeded");
        assert_eq!(r.code(), Some(code), "{what}: {}", r.stdout);
        assert!(
            r.json["msg"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}"
        );
        assert_eq!(r.stdout.lines().count(), 1, "{what}: one JSON object");
        assert_eq!(node.snapshot()?, before, "{what} changed the node");
        assert_eq!(
            pod.exec("ip", &["-o", "link"])?,
            pod_before,
            "{what} changed the pod"
        );
    }
    // Missing CNI_PATH / CNI_COMMAND.
    let r = node.run_raw(Exec::new("mycni", ""), &c, &good.to_string().into_bytes())?;
    assert_eq!(r.code(), Some(4));
    Ok(())
}

#[test]
fn del_is_idempotent_and_survives_a_missing_netns() -> Result<()> {
    let node = node()?;
    let conf = node.conf("1.0.0", "10.244.4.0/24");
    let before = node.snapshot()?;
    let pod = NetNs::new("pod")?;
    let path = netns_path(&pod);
    let c = call("c1", &path, K8S_ARGS);
    let add = node.run("mycni", "ADD", &c, &conf)?;
    assert!(add.ok, "{}", add.stdout);
    assert_eq!(node.lease_count(), 1);
    // The runtime removed the netns first and lost the cached result: DEL
    // must still remove the host side and free the IP.
    drop(pod);
    let gone = call("c1", "", K8S_ARGS);
    for _ in 0..3 {
        let del = node.run("mycni", "DEL", &gone, &conf)?;
        assert!(del.ok, "{}", del.stdout);
    }
    assert_eq!(node.snapshot()?, before);
    assert_eq!(node.lease_count(), 0);
    // DEL for a container that never existed.
    assert!(node.run("mycni", "DEL", &call("never", "", ""), &conf)?.ok);
    Ok(())
}

/// ADD's last changes go as one datagram per namespace: a change in the
/// middle of one that the kernel refuses (here the pod's route to the
/// gateway, which the namespace already has) fails ADD with that change
/// named, though the changes after it in the datagram went in, and ADD
/// undoes everything.
#[test]
fn a_change_refused_inside_adds_batch_fails_add_and_is_undone() -> Result<()> {
    let node = node()?;
    let conf = node.conf("1.1.0", "10.244.14.0/24");
    let before = node.snapshot()?;
    let pod = NetNs::new("pod")?;
    pod.exec("ip", &["link", "set", "lo", "up"])?;
    pod.exec("ip", &["route", "add", "169.254.1.1/32", "dev", "lo"])?;
    let routes_before = pod.exec("ip", &["route"])?;
    let links_before = pod.exec("ip", &["-o", "link"])?;
    let r = node.run(
        "mycni",
        "ADD",
        &call("c1", &netns_path(&pod), K8S_ARGS),
        &conf,
    )?;
    assert!(!r.ok, "{}", r.stdout);
    assert!(
        r.stdout.contains("adding route 169.254.1.1/32"),
        "the refused change is not the one named: {}",
        r.stdout
    );
    assert_eq!(node.snapshot()?, before);
    assert_eq!(node.lease_count(), 0);
    assert_eq!(pod.exec("ip", &["-o", "link"])?, links_before);
    assert_eq!(pod.exec("ip", &["route"])?, routes_before);
    Ok(())
}
