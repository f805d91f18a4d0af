//! ADDs that fail or are killed half-way: whatever step they reached,
//! nothing is left behind, and only mycni's own leftovers are reclaimed.

use anyhow::Result;
use mycni_testkit::NetNs;
use mycni_testkit::cni::Exec;
use serde_json::json;

use crate::{K8S_ARGS, add_fails_cleanly_at_every_step, call, netns_path, node, pod_ip};

#[test]
fn add_rolls_back_at_every_step() -> Result<()> {
    let node = node()?;
    let conf = node.conf("1.0.0", "10.244.5.0/24");
    let pod = NetNs::new("pod")?;
    let path = netns_path(&pod);
    add_fails_cleanly_at_every_step(&node, &conf, &pod)?;
    // A real kernel failure at the last step: the host route already exists.
    let r = node.run("mycni", "ADD", &call("c1", &path, K8S_ARGS), &conf)?;
    assert!(r.ok);
    let ip = pod_ip(&r.json);
    assert!(
        node.run("mycni", "DEL", &call("c1", &path, K8S_ARGS), &conf)?
            .ok
    );
    // No dummy driver on every kernel: a veth serves as any device.
    node.ns.exec(
        "ip",
        &[
            "link",
            "add",
            "blocker",
            "type",
            "veth",
            "peer",
            "name",
            "blocker-p",
        ],
    )?;
    node.ns.exec("ip", &["link", "set", "blocker", "up"])?;
    node.ns.exec("ip", &["link", "set", "blocker-p", "up"])?;
    node.ns.exec(
        "ip",
        &["route", "add", &format!("{ip}/32"), "dev", "blocker"],
    )?;
    let before = node.snapshot()?;
    // A one-address range forces the clash on the last step of ADD.
    let mut one = conf.clone();
    one["ipam"]["rangeStart"] = json!(ip);
    one["ipam"]["rangeEnd"] = json!(ip);
    let r = node.run("mycni", "ADD", &call("c3", &path, K8S_ARGS), &one)?;
    assert_eq!(r.code(), Some(100), "{}", r.stdout);
    assert_eq!(node.snapshot()?, before);
    Ok(())
}

/// A runtime calls DEL after an ADD that did not finish, e.g. one SIGKILLed
/// on a timeout; whichever step the kill came after, DEL leaves nothing.
/// Found by the churn case: a kill between creating the veth and marking
/// it left a host veth without alias that DEL did not recognise.
#[test]
fn del_after_add_killed_at_every_step_leaves_nothing() -> Result<()> {
    let node = node()?;
    let conf = node.conf("1.0.0", "10.244.14.0/24");
    let pod = NetNs::new("pod")?;
    let path = netns_path(&pod);
    let before = node.snapshot()?;
    let pod_before = pod.exec("ip", &["-o", "link"])?;
    for step in ["ipam", "veth", "host", "pod", "host-route"] {
        let c = call("k1", &path, K8S_ARGS);
        let r = node.run_env(
            Exec::new("mycni", "ADD").env(&[("MYCNI_TEST_FAULT", &format!("kill:{step}"))]),
            &c,
            &conf,
        )?;
        assert!(!r.ok && r.stdout.is_empty(), "{step}: {}", r.stdout);
        assert_ne!(node.snapshot()?, before, "the kill at {step} left nothing");
        let r = node.run("mycni", "DEL", &c, &conf)?;
        assert!(r.ok, "{step}: {}", r.stdout);
        assert_eq!(node.snapshot()?, before, "DEL after a kill at {step}");
        assert_eq!(
            pod.exec("ip", &["-o", "link"])?,
            pod_before,
            "DEL after a kill at {step}"
        );
    }

    // The unmarked veth of a killed ADD is the same pod's name, but a late
    // DEL for another sandbox of that pod (another netns) leaves it alone.
    let r = node.run_env(
        Exec::new("mycni", "ADD").env(&[("MYCNI_TEST_FAULT", "kill:veth")]),
        &call("k2", &path, K8S_ARGS),
        &conf,
    )?;
    assert!(!r.ok);
    let other = NetNs::new("pod")?;
    let r = node.run(
        "mycni",
        "DEL",
        &call("k0", &netns_path(&other), K8S_ARGS),
        &conf,
    )?;
    assert!(r.ok, "{}", r.stdout);
    pod.exec("ip", &["link", "show", "eth0"])?;
    let r = node.run("mycni", "DEL", &call("k2", &path, K8S_ARGS), &conf)?;
    assert!(r.ok, "{}", r.stdout);
    assert_eq!(node.snapshot()?, before);
    Ok(())
}

#[test]
fn leftover_of_a_killed_add_is_replaced_but_foreign_interfaces_are_not() -> Result<()> {
    let node = node()?;
    let conf = node.conf("1.0.0", "10.244.12.0/24");
    let pod = NetNs::new("pod")?;
    let path = netns_path(&pod);
    let c = call("c1", &path, K8S_ARGS);
    let add = node.run("mycni", "ADD", &c, &conf)?;
    assert!(add.ok, "{}", add.stdout);
    let name = add.json["interfaces"][0]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(node.run("mycni", "DEL", &c, &conf)?.ok);

    // An ADD SIGKILLed right after creating the veth leaves it unmarked.
    node.ns.exec(
        "ip",
        &[
            "link",
            "add",
            &name,
            "type",
            "veth",
            "peer",
            "name",
            "leftover-p",
        ],
    )?;
    let add = node.run("mycni", "ADD", &c, &conf)?;
    assert!(add.ok, "unmarked leftover blocked ADD: {}", add.stdout);
    assert!(
        node.ns.exec("ip", &["link", "show", "leftover-p"]).is_err(),
        "leftover not removed"
    );
    assert!(node.run("mycni", "DEL", &c, &conf)?.ok);

    // Somebody else's interface under that name is never touched.
    node.ns.exec(
        "ip",
        &[
            "link",
            "add",
            &name,
            "type",
            "veth",
            "peer",
            "name",
            "foreign-p",
        ],
    )?;
    node.ns.exec(
        "ip",
        &["link", "set", &name, "alias", "owned by someone else"],
    )?;
    let before = node.snapshot()?;
    let add = node.run("mycni", "ADD", &c, &conf)?;
    assert_eq!(add.code(), Some(100), "{}", add.stdout);
    assert_eq!(node.snapshot()?, before);
    Ok(())
}
