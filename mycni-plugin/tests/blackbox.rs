//! Black-box tests of the built `mycni` binary, run as a runtime runs it,
//! inside network namespaces these tests create (a "node" standing in for
//! the host, and one namespace per pod).

// A test crate root finds modules beside it, not in a directory of its
// name: the paths keep the themes under blackbox/.
#[path = "blackbox/bad_inputs.rs"]
mod bad_inputs;
#[path = "blackbox/check.rs"]
mod check;
#[path = "blackbox/connectivity.rs"]
mod connectivity;
#[path = "blackbox/delegation.rs"]
mod delegation;
#[path = "blackbox/dual_stack.rs"]
mod dual_stack;
#[path = "blackbox/interrupted.rs"]
mod interrupted;
#[path = "blackbox/verbs.rs"]
mod verbs;

use std::path::Path;

use anyhow::Result;
use mycni_testkit::NetNs;
use mycni_testkit::cni::{Call, Exec, Node};
use serde_json::Value;

const VERSIONS: [&str; 4] = ["0.3.1", "0.4.0", "1.0.0", "1.1.0"];
const K8S_ARGS: &str =
    "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=c1";

/// The binary under test: the one cargo built for these tests, or the
/// one `MYCNI_TEST_PLUGIN` names (e.g. the shipped build, target/plugin/
/// <triple>/release/mycni from `cargo xtask build-plugin`).
fn node() -> Result<Node> {
    match std::env::var_os("MYCNI_TEST_PLUGIN") {
        Some(bin) => Node::new(Path::new(&bin)),
        None => Node::new(Path::new(env!("CARGO_BIN_EXE_mycni"))),
    }
}

fn netns_path(ns: &NetNs) -> String {
    ns.path().to_string_lossy().into_owned()
}

fn call<'a>(cid: &'a str, netns: &'a str, args: &'a str) -> Call<'a> {
    Call {
        container_id: cid,
        netns,
        ifname: "eth0",
        args,
    }
}

fn pod_ip(result: &Value) -> String {
    let addr = result["ips"][0]["address"].as_str().unwrap_or_default();
    addr.split('/').next().unwrap_or_default().to_string()
}

/// ADD with a fault injected after each of its steps: each fails naming
/// the step and leaves the node (links, routes, addresses, leases) and the
/// pod's namespace as they were.
fn add_fails_cleanly_at_every_step(node: &Node, conf: &Value, pod: &NetNs) -> Result<()> {
    let path = netns_path(pod);
    let before = node.snapshot()?;
    let pod_before = pod.exec("ip", &["-o", "link"])?;
    for step in ["ipam", "veth", "host", "pod", "host-route"] {
        let r = node.run_env(
            Exec::new("mycni", "ADD").env(&[("MYCNI_TEST_FAULT", step)]),
            &call("c1", &path, K8S_ARGS),
            conf,
        )?;
        assert!(!r.ok, "{step}");
        assert!(r.stdout.contains(step), "{step}: {}", r.stdout);
        assert_eq!(node.snapshot()?, before, "after a fault at {step}");
        assert_eq!(node.lease_count(), 0, "after a fault at {step}");
        assert_eq!(
            pod.exec("ip", &["-o", "link"])?,
            pod_before,
            "after a fault at {step}"
        );
    }
    Ok(())
}
