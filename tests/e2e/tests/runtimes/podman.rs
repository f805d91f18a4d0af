//! A pod's network through a second real runtime: podman 4.3 (Debian
//! bookworm's) on its CNI backend, which calls the plugin through libcni
//! itself, runs a container on a lab node with that node's agent-written
//! conflist, unchanged: mycni with its built-in IPAM over the node's
//! podCIDR, sharing the lease directory with the lab's own pod there. The
//! container reaches a pod on the other node, and `podman rm -f` leaves
//! the node as it was before the container; so does a container that fails
//! to start after podman set its network up.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use mycni_common::contract::{CONFLIST_NAME, NETWORK_NAME, VethAlias};
use mycni_common::net::Cidr;
use mycni_e2e::leftovers::files_named;
use mycni_e2e::podman::Podman;
use mycni_lab::{ECHO_PORT, Lab, MATRIX_BULK_BYTES, NodeState, node_state};
use mycni_testkit::sh;

use crate::common;

/// The node podman runs on, and the one whose pod it must reach.
const NODE: usize = 1;
const PEER: usize = 2;
/// How long the agent may take to mirror a pod in its maps (it reacts to
/// the kernel's notifications within milliseconds; its full pass runs
/// every second in the test lab).
const MAP_TIMEOUT: Duration = Duration::from_secs(10);

#[test]
fn podman_runs_a_container_on_the_agents_conflist() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let started = Instant::now();
    let t = common::lab(2, 1)?;
    let l = &t.0;
    let lab_up = started.elapsed();
    let pod_cidr = node_pod_cidr(l, NODE)?;
    let peer = l
        .pods()?
        .into_iter()
        .find(|p| p.node == PEER)
        .context("no lab pod on the peer node")?;
    let conf_dir = l.spec.node_dir(NODE).join("net.d");
    let conflist: serde_json::Value =
        serde_json::from_slice(&std::fs::read(conf_dir.join(CONFLIST_NAME))?)?;
    eprintln!("the agent's conflist, as podman gets it: {conflist}");

    // The lab's own pod on this node is in every reading, so a reading that
    // saw nothing cannot pass for a clean node.
    let before = node_state(l, NODE, NETWORK_NAME)?;
    ensure!(
        before.leases.len() == 1 && before.veths.len() == 1 && before.routes.len() == 1,
        "the node should hold exactly the lab's pod: {before:?}"
    );

    let t0 = Instant::now();
    let podman = Podman::start(&l.spec.node_name(NODE), &conf_dir, &l.spec.bins.plugin)?;
    let podman_up = t0.elapsed();
    // podman loads a conflist only after libcni validated it (the plugin
    // found, and speaking the list's cniVersion); otherwise it only warns.
    let networks = podman.output(&["network", "ls", "--format", "{{.Name}}"])?;
    ensure!(
        String::from_utf8_lossy(&networks.stdout)
            .lines()
            .any(|n| n == NETWORK_NAME),
        "podman did not load the conflist as network {NETWORK_NAME}: {}",
        String::from_utf8_lossy(&networks.stderr)
    );
    let t0 = Instant::now();
    let id = podman
        .run_detached("web", NETWORK_NAME)
        .with_context(|| plugin_log_tail(l))?;
    let run_took = t0.elapsed();

    // The address: podman's view (the CNI result it parsed) and the
    // container's own.
    let ip: Ipv4Addr = podman
        .inspect(
            &id,
            &format!("{{{{(index .NetworkSettings.Networks \"{NETWORK_NAME}\").IPAddress}}}}"),
        )?
        .parse()
        .context("podman inspect: the container's IP")?;
    ensure!(
        pod_cidr.contains(ip),
        "container IP {ip} is not in node {NODE}'s podCIDR {pod_cidr}"
    );
    let addrs = podman.exec(&id, &["ip", "-4", "-o", "addr", "show", "dev", "eth0"])?;
    ensure!(
        addrs.contains(&format!("inet {ip}/32")),
        "the container's eth0 lacks {ip}/32: {addrs}"
    );

    // A pod on the other node, from inside the container: ping, a TCP round
    // trip through its echo server, and (from the container's netns, with
    // the lab's probe) full-size segments over the overlay.
    let peer_ip = peer.ip.to_string();
    podman
        .exec(&id, &["ping", "-c", "1", "-W", "2", &peer_ip])
        .context("ping from the container to the pod on the other node")?;
    let echo = podman.exec(
        &id,
        &[
            "sh",
            "-c",
            &format!("echo mycni | nc -w 2 {peer_ip} {ECHO_PORT}"),
        ],
    )?;
    ensure!(
        echo.trim() == "mycni",
        "TCP echo from the container to {peer_ip}:{ECHO_PORT} returned {echo:?}"
    );
    let sandbox = PathBuf::from(podman.inspect(&id, "{{.NetworkSettings.SandboxKey}}")?);
    let netns = podman.host_path(&sandbox)?;
    sh(
        "nsenter",
        &[
            &format!("--net={}", netns.display()),
            "--",
            &l.spec.bins.lab.to_string_lossy(),
            "tcp-probe",
            &format!("{peer_ip}:{ECHO_PORT}"),
            "--bulk",
            &MATRIX_BULK_BYTES.to_string(),
        ],
    )
    .context("bulk echo from the container's netns to the pod on the other node")?;

    // What the container holds on the node while it runs.
    let during = node_state(l, NODE, NETWORK_NAME)?;
    ensure!(
        during.leases.get(&ip) == Some(&format!("{id}/eth0")),
        "lease of {ip}: {:?}",
        during.leases.get(&ip)
    );
    let alias = VethAlias {
        network: NETWORK_NAME,
        container_id: &id,
        ifname: "eth0",
    }
    .render();
    let veth = during
        .veths
        .iter()
        .find(|(_, (_, a))| a.as_deref() == Some(alias.as_str()))
        .map(|(name, _)| name.clone())
        .with_context(|| format!("no host veth with alias {alias}: {:?}", during.veths))?;
    ensure!(
        during.routes.get(&ip.to_string()) == Some(&veth),
        "no host route {ip} dev {veth}: {:?}",
        during.routes
    );
    // The fast path takes the container like any pod, where the node runs it.
    if !before.map.is_empty() {
        wait_until("the container in mycni_local", || {
            Ok(node_state(l, NODE, NETWORK_NAME)?.map.contains_key(&ip))
        })?;
    }
    ensure!(
        podman.mounts_under(&sandbox)?.len() == 1,
        "the container's netns {} is not mounted in podman's mount namespace",
        sandbox.display()
    );
    // podman's way of calling the plugin, as libcni cached it for DEL: the
    // container's name as K8S_POD_NAME and no pod namespace.
    let cache_file = podman
        .cni_cache_dir()
        .join("results")
        .join(format!("{NETWORK_NAME}-{id}-eth0"));
    let cache = std::fs::read_to_string(&cache_file)
        .with_context(|| format!("libcni cache {}", cache_file.display()))?;
    ensure!(
        cache.contains(r#"["K8S_POD_NAME","web"]"#) && !cache.contains("K8S_POD_NAMESPACE"),
        "CNI_ARGS in libcni's cache: {cache}"
    );

    let t0 = Instant::now();
    podman.remove(&id).with_context(|| plugin_log_tail(l))?;
    let rm_took = t0.elapsed();

    let after = node_state(l, NODE, NETWORK_NAME)?;
    let left = kernel_leftovers(&before, &after, Some((ip, &veth)));
    ensure!(left.is_empty(), "podman rm left on the node: {left:?}");
    wait_until("the agent's maps and links as before the container", || {
        let now = node_state(l, NODE, NETWORK_NAME)?;
        Ok(now.map == before.map && now.links == before.links)
    })?;
    ensure!(
        !podman.host_path(&sandbox)?.exists() && podman.mounts_under(&sandbox)?.is_empty(),
        "netns {} left in podman's mount namespace",
        sandbox.display()
    );
    let netns_files: Vec<_> = std::fs::read_dir(podman.netns_dir())?
        .flatten()
        .map(|e| e.file_name())
        .collect();
    ensure!(netns_files.is_empty(), "netns files left: {netns_files:?}");
    let cached = files_named(&podman.cni_cache_dir(), &id);
    ensure!(cached.is_empty(), "libcni cache left: {cached:?}");
    let runc_state = files_named(&podman.runc_dir(), &id);
    ensure!(runc_state.is_empty(), "runc state left: {runc_state:?}");

    // A container that fails to start after podman set its network up (runc
    // finds no such program): podman tears the network down at once, with
    // libcni's cached result, and the node is as before again.
    let failed = podman.try_run_detached("broken", NETWORK_NAME, &["/no-such-program"])?;
    ensure!(
        !failed.status.success(),
        "a container running a missing program started: {failed:?}"
    );
    let broken = podman.inspect("broken", "{{.Id}}")?;
    let log = plugin_log_tail(l);
    ensure!(
        log.contains(&format!("Add {broken} eth0 ok"))
            && log.contains(&format!("Del {broken} eth0 ok")),
        "podman did not ADD and DEL the container that failed to start: {log}"
    );
    let left = kernel_leftovers(&before, &node_state(l, NODE, NETWORK_NAME)?, None);
    ensure!(
        left.is_empty(),
        "a container that failed to start left on the node: {left:?}"
    );
    let cached = files_named(&podman.cni_cache_dir(), &broken);
    ensure!(cached.is_empty(), "libcni cache left: {cached:?}");
    podman.remove("broken")?;
    ensure!(
        std::fs::read_dir(podman.netns_dir())?.next().is_none(),
        "a netns file left after the container that failed to start"
    );
    let containers = podman.ok(&["ps", "-a", "-q"])?;
    ensure!(
        containers.trim().is_empty(),
        "podman still lists {containers}"
    );

    drop(podman);
    eprintln!(
        "lab up in {:.2} s, podman ready in {:.2} s, run {:.2} s, rm {:.2} s, whole test {:.2} s",
        lab_up.as_secs_f64(),
        podman_up.as_secs_f64(),
        run_took.as_secs_f64(),
        rm_took.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The podCIDR the API fixture gave lab node `i`.
fn node_pod_cidr(l: &Lab, i: usize) -> Result<Cidr<Ipv4Addr>> {
    let name = l.spec.node_name(i);
    let cidr = l
        .api
        .as_ref()
        .and_then(|api| api.get_node(&name))
        .and_then(|n| n.spec)
        .and_then(|s| s.pod_cidr)
        .with_context(|| format!("node {name} has no podCIDR"))?;
    Cidr::parse_network(&cidr).with_context(|| format!("podCIDR {cidr:?}"))
}

/// What differs from `before` in the leases, host veths and routes of the
/// node, and the neighbours that still name `container`'s IP or host veth.
fn kernel_leftovers(
    before: &NodeState,
    after: &NodeState,
    container: Option<(Ipv4Addr, &str)>,
) -> Vec<String> {
    let mut left = Vec::new();
    let mut differs = |what: &str, b: String, a: String| {
        if a != b {
            left.push(format!("{what}: {a}, before the container {b}"));
        }
    };
    differs(
        "leases",
        format!("{:?}", before.leases),
        format!("{:?}", after.leases),
    );
    differs(
        "stray files in the lease dir",
        format!("{:?}", before.stray_files),
        format!("{:?}", after.stray_files),
    );
    differs(
        "host veths",
        format!("{:?}", before.veths),
        format!("{:?}", after.veths),
    );
    differs(
        "host routes",
        format!("{:?}", before.routes),
        format!("{:?}", after.routes),
    );
    // Neighbour states of the lab's pod come and go; only the container's
    // entries would be a leftover.
    let neighbours: BTreeMap<_, _> = after
        .neighbours
        .iter()
        .filter(|(dst, dev, _)| container.is_some_and(|(ip, veth)| *dst == ip || dev == veth))
        .map(|(dst, dev, state)| (format!("{dst} dev {dev}"), state.clone()))
        .collect();
    if !neighbours.is_empty() {
        left.push(format!("neighbours: {neighbours:?}"));
    }
    left
}

/// Polls `f` every 50 ms until it holds or [`MAP_TIMEOUT`] passes.
fn wait_until(what: &str, mut f: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + MAP_TIMEOUT;
    loop {
        if f()? {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "timed out after {MAP_TIMEOUT:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The end of the plugin's log on the node (the conflist's `logFile`), for
/// a failure message.
fn plugin_log_tail(l: &Lab) -> String {
    let log = std::fs::read_to_string(l.spec.node_dir(NODE).join("plugin.log")).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    format!(
        "plugin log on node {NODE}:\n{}",
        lines[lines.len().saturating_sub(15)..].join("\n")
    )
}
