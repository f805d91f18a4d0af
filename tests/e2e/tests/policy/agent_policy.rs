//! The policy room in a running agent, against the API fixture: a policy
//! takes effect and goes away within the promised 2 s, before the pods'
//! status.podIPs reach the API (the plugin's records speak for them), and
//! the room's series say what it enforces. The truth tables of the
//! upstream cases run in the lab tests (netpol.rs).

use crate::common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use common::{counter, lab_with};
use k8s_openapi::api::networking::v1::NetworkPolicySpec;
use mycni_apiserver::{namespace, network_policy, pod, pod_status};
use mycni_lab::ECHO_PORT;
use mycni_testkit::in_netns;
use serde_json::json;

/// A connection within 250 ms: a dropped SYN is retransmitted after 1 s,
/// so a short timeout keeps the settle time measured, not the probe's.
fn reachable(from_ns: &str, to: SocketAddr) -> Result<bool> {
    in_netns(from_ns, || {
        TcpStream::connect_timeout(&to, Duration::from_millis(250)).is_ok()
    })
}

/// One 4-byte round trip on the echo stream.
fn round_trip(s: &mut TcpStream) -> bool {
    let mut back = [0u8; 4];
    s.write_all(b"ping").is_ok() && s.read_exact(&mut back).is_ok() && &back == b"ping"
}

/// Node `i`'s IPv4 packets counted under datapath path `path`.
fn path_count(l: &mycni_lab::Lab, i: usize, path: &str) -> Result<u64> {
    let m = l.metrics(i)?;
    Ok(m.lines()
        .filter(|x| x.contains(&format!("path=\"{path}\"")) && x.contains("family=\"ipv4\""))
        .filter(|x| x.starts_with("mycni_datapath_packets_total"))
        .filter_map(|x| x.rsplit(' ').next()?.parse::<u64>().ok())
        .sum())
}

/// How long until `from -> to` is `want`, polled every 50 ms, up to 2 s.
fn settles(from_ns: &str, to: SocketAddr, want: bool) -> Result<Duration> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        if reachable(from_ns, to)? == want {
            return Ok(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("{from_ns} -> {to} not {want} within 2 s")
}

#[test]
fn a_policy_applies_and_lifts_within_two_seconds() -> Result<()> {
    let _turn = crate::turn(module_path!());
    applies_and_lifts(true)
}

#[test]
fn a_policy_applies_and_lifts_within_two_seconds_on_the_kernel_datapath() -> Result<()> {
    let _turn = crate::turn(module_path!());
    applies_and_lifts(false)
}

/// `fast`: the eBPF datapath (its live stream rides the fast path until
/// the deny), else `--datapath kernel`.
fn applies_and_lifts(fast: bool) -> Result<()> {
    let t = lab_with(1, 2, if fast { &[] } else { &["--datapath", "kernel"] })?;
    let l = &t.0;
    let api = l.api.as_ref().context("api")?;
    let mut pods = l.pods()?;
    pods.sort_by_key(|p| p.index);
    // The lab's runtime names its pods lab/pod<j> in CNI_ARGS. No
    // status.podIPs yet: only the plugin's records give their addresses.
    api.create_namespace(namespace("lab", &[]))?;
    for p in &pods {
        let name = format!("pod{}", p.index);
        let node = l.spec.node_name(p.node);
        api.create_pod(pod("lab", &name, &[("app", &name)], Some(&node)))?;
    }
    let server = SocketAddr::from((pods[1].ip, ECHO_PORT));
    settles(&pods[0].ns, server, true).context("open before any policy")?;
    // A live echo stream client -> target, on the fast path by now.
    let mut stream = in_netns(&pods[0].ns, || {
        TcpStream::connect_timeout(&server, Duration::from_secs(1))
    })??;
    stream.set_read_timeout(Some(Duration::from_millis(500)))?;
    let fast_before = path_count(l, pods[1].node, "fast_local")?;
    for _ in 0..20 {
        anyhow::ensure!(
            round_trip(&mut stream),
            "the stream stalled before any policy"
        );
    }
    anyhow::ensure!(
        !fast || path_count(l, pods[1].node, "fast_local")? > fast_before,
        "the stream did not take the fast path"
    );

    // The lab numbers pods from 1.
    let (client, target) = (&pods[0], &pods[1]);
    let target_name = format!("pod{}", target.index);
    let spec: NetworkPolicySpec =
        serde_json::from_value(json!({"podSelector": {"matchLabels": {"app": target_name}}}))?;
    api.create_network_policy(network_policy("lab", "deny-target", spec))?;
    let denied = settles(&pods[0].ns, server, false).map_err(|e| {
        let n = l.spec.node_name(pods[1].node);
        let table = mycni_testkit::sh(
            "ip",
            &[
                "netns",
                "exec",
                &n,
                "nft",
                "list",
                "table",
                "inet",
                "mycni_policy",
            ],
        );
        let log = std::fs::read_to_string(l.spec.node_dir(pods[1].node).join("agent.log"));
        e.context(format!("{table:?}\n{log:?}"))
    })?;
    assert!(
        reachable(&pods[1].ns, SocketAddr::from((pods[0].ip, ECHO_PORT)))?,
        "the target's egress is not isolated"
    );
    // The live stream is cut too, though the fast path carried it: its
    // next packet met an entry stamped under the old policy and went back
    // to nftables.
    let cut = Instant::now();
    while round_trip(&mut stream) {
        anyhow::ensure!(
            cut.elapsed() < Duration::from_secs(1),
            "the live stream still flows 1 s after the deny"
        );
    }
    if fast {
        let stale = path_count(l, target.node, "kernel_policy_stale")?;
        anyhow::ensure!(stale > 0, "no packet was sent back as stale");
    }
    assert_eq!(counter(l, pods[1].node, "mycni_policy_enforcing")?, 1);
    assert_eq!(counter(l, pods[1].node, "mycni_policy_isolated_pods")?, 1);

    // Until the kubelet's status, only the plugin's record gives the
    // target's address, and it is read as soon as it is written, not at
    // the next API event. Taken away, the target is a pod the room cannot
    // judge, so it fails closed even under a policy that allows the
    // client; put back, the allow works.
    let records = l.spec.node_dir(target.node).join("run/pods");
    let record = std::fs::read_dir(&records)?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            std::fs::read_to_string(p).is_ok_and(|t| t.contains(&format!("\"{target_name}\"")))
        })
        .context("no pod record for the target")?;
    let aside = l.spec.node_dir(target.node).join("record.aside");
    std::fs::rename(&record, &aside)?;
    let allow: NetworkPolicySpec = serde_json::from_value(json!({
        "podSelector": {"matchLabels": {"app": target_name}},
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": format!("pod{}", client.index)}}}]}]
    }))?;
    api.update_network_policy("lab", "deny-target", |np| np.spec = Some(allow))?;
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !reachable(&client.ns, server)?,
        "a pod the room could not judge was reachable (fail open)"
    );
    std::fs::rename(&aside, &record)?;
    let by_record = settles(&client.ns, server, true)?;
    let deny: NetworkPolicySpec =
        serde_json::from_value(json!({"podSelector": {"matchLabels": {"app": target_name}}}))?;
    api.update_network_policy("lab", "deny-target", |np| np.spec = Some(deny))?;
    settles(&client.ns, server, false)?;

    // The kubelet's status arrives: nothing changes.
    api.set_pod_status(
        "lab",
        &target_name,
        pod_status(&[&target.ip.to_string()], None),
    )?;
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !reachable(&client.ns, server)?,
        "status.podIPs reopened the target"
    );

    // No window of allow while the agent is gone, while it starts again
    // (it writes nothing before its lists synced), or while the API is away.
    let stays_denied = |what: &str, for_ms: u64| -> Result<()> {
        let until = Instant::now() + Duration::from_millis(for_ms);
        while Instant::now() < until {
            anyhow::ensure!(!reachable(&client.ns, server)?, "reachable {what}");
        }
        Ok(())
    };
    l.kill_agent(target.node);
    stays_denied("with the agent killed", 500)?;
    l.set_api_reachable(false)?;
    l.start_agent(target.node)?;
    stays_denied("while the restarted agent waits for the API", 1500)?;
    l.set_api_reachable(true)?;
    stays_denied("after the restarted agent synced", 1000)?;

    api.delete_network_policy("lab", "deny-target")?;
    let lifted = settles(&client.ns, server, true)?;
    eprintln!("settle: deny {denied:?}, by record {by_record:?}, lift {lifted:?}");
    Ok(())
}
