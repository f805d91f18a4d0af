//! The agent with no more than deploy/base/rbac.yaml grants it: the API
//! fixture refuses every write to `nodes` itself (403, as RBAC would) and
//! applies the real node status strategy to `nodes/status`, the only thing
//! the agent may patch. A restarted agent must still publish its
//! annotations and its NetworkUnavailable condition and hand the node over.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::common;
use common::lab;

#[test]
fn agent_publishes_and_restarts_with_patch_on_nodes_status_alone() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let t = lab(1, 0)?;
    let l = &t.0;
    let api = l.api.as_ref().context("api")?;
    let name = l.spec.node_name(1);
    api.forbid_node_writes(true);
    // Forget what the agent published at start (the fixture's own writes
    // are not subject to RBAC), then restart it under the forbidding role.
    l.stop_agent(1);
    api.update_node(&name, |n| {
        if let Some(a) = n.metadata.annotations.as_mut() {
            a.retain(|k, _| !k.starts_with("mycni.dev/"));
        }
        if let Some(c) = n.status.as_mut().and_then(|s| s.conditions.as_mut()) {
            c.retain(|c| c.type_ != "NetworkUnavailable");
        }
    })?;
    l.start_agent(1)?;
    let start = Instant::now();
    loop {
        let me = api.get_node(&name).context("own node")?;
        let ann = me.metadata.annotations.clone().unwrap_or_default();
        let cond = me
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "NetworkUnavailable");
        if ann.get("mycni.dev/host-ip").map(String::as_str) == Some("192.168.77.11")
            && ann.contains_key("mycni.dev/vtep-mac")
            && cond.is_some_and(|c| c.status == "False")
            && l.spec.node_dir(1).join("run/ready").exists()
        {
            break;
        }
        if start.elapsed() > Duration::from_secs(20) {
            let log =
                std::fs::read_to_string(l.spec.node_dir(1).join("agent.log")).unwrap_or_default();
            bail!("not published through nodes/status within 20 s: {ann:?}\n{log}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // The spec is as kube-controller-manager left it.
    let me = api.get_node(&name).context("own node")?;
    assert_eq!(
        me.spec.and_then(|s| s.pod_cidr).as_deref(),
        Some("10.244.1.0/24")
    );
    let log = std::fs::read_to_string(l.spec.node_dir(1).join("agent.log"))?;
    assert!(!log.contains("forbidden"), "the agent hit a 403:\n{log}");
    Ok(())
}
