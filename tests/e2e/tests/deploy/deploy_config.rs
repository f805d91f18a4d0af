//! The settings of deploy/base/config.env that only a node can judge, with
//! the real agent in a lab node: the underlay picked by name pattern and by
//! `can-reach`, an MTU override, and the named errors when a value does not
//! fit the node. And the removal deploy/cleanup renders, run on a lab node:
//! nothing of mycni's is left.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use mycni_agent::settings::{MTU, UNDERLAY};
use mycni_lab::Lab;

use crate::common;
use common::{lab, lab_with};

fn own_host_ip(l: &Lab) -> Result<String> {
    let api = l.api.as_ref().context("api")?;
    let me = api.get_node(&l.spec.node_name(1)).context("own node")?;
    me.metadata
        .annotations
        .unwrap_or_default()
        .get("mycni.dev/host-ip")
        .cloned()
        .context("no host-ip annotation")
}

fn conflist_mtu(l: &Lab) -> Result<u64> {
    let conf: serde_json::Value = serde_json::from_slice(&std::fs::read(
        l.spec.node_dir(1).join("net.d/00-mycni.conflist"),
    )?)?;
    conf["plugins"][0]["mtu"].as_u64().context("no mtu")
}

#[test]
fn underlay_by_pattern_with_an_mtu_override() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let t = lab_with(1, 0, &["--iface", "interface=e*h?", "--mtu", "1400"])?;
    let l = &t.0;
    assert_eq!(own_host_ip(l)?, "192.168.77.11");
    assert_eq!(conflist_mtu(l)?, 1400);
    let link = mycni_testkit::sh(
        "ip",
        &["-n", &l.spec.node_name(1), "-o", "link", "show", "vxlan.1"],
    )?;
    ensure!(link.contains("mtu 1400 "), "{link}");
    Ok(())
}

#[test]
fn underlay_by_the_route_that_reaches_an_address() -> Result<()> {
    let _turn = crate::turn(module_path!());
    // 192.168.77.1 is on eth0's subnet: the connected route, not only the
    // default one, leads there (the longest-prefix choice is unit-tested in
    // mycni-agent's kernel.rs).
    let t = lab_with(1, 0, &["--iface", "can-reach=192.168.77.1"])?;
    let l = &t.0;
    assert_eq!(own_host_ip(l)?, "192.168.77.11");
    assert_eq!(conflist_mtu(l)?, 1450, "auto: 1500 - 50");
    Ok(())
}

/// Runs node 1's agent command line `cmdline` with `extra` flags; it must
/// exit with an error within 30 s: its output.
fn agent_fails_with(l: &Lab, cmdline: &[String], extra: &[&str]) -> Result<String> {
    let dir = l.spec.node_dir(1);
    let (bin, args) = cmdline.split_first().context("empty agent command line")?;
    let log = dir.join("agent-config.log");
    let out = std::fs::File::create(&log)?;
    let mut child = Command::new("ip")
        .args(["netns", "exec", &l.spec.node_name(1)])
        .arg(bin)
        .args(args)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()?;
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the agent with {extra:?} still runs after 30 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = std::fs::read_to_string(&log)?;
    ensure!(
        !status.success(),
        "the agent with {extra:?} succeeded: {text}"
    );
    Ok(text)
}

#[test]
fn values_the_node_cannot_take_stop_the_agent_naming_the_key() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let t = lab(1, 0)?;
    let l = &t.0;
    let cmdline = l.agent_cmdline(1).context("node 1's agent command line")?;
    l.stop_agent(1);
    let out = agent_fails_with(l, &cmdline, &["--mtu", "1451"])?;
    ensure!(
        out.contains(&MTU.source().to_string()) && out.contains("at most 1450"),
        "{out}"
    );
    for (iface, why) in [
        (
            "interface=wlan*",
            "no interface matching wlan* has an IPv4 address",
        ),
        ("eth9", "underlay interface eth9 does not exist"),
    ] {
        let out = agent_fails_with(l, &cmdline, &["--iface", iface])?;
        ensure!(
            out.contains(&UNDERLAY.source().to_string()) && out.contains(why),
            "{out}"
        );
    }
    Ok(())
}

/// The uninstall init container's shell line, as `kubectl kustomize
/// deploy/cleanup` renders it.
fn rendered_cleanup_script() -> Result<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(root.join("deploy/cleanup"))
        .output()
        .context("running kubectl kustomize deploy/cleanup")?;
    ensure!(
        out.status.success(),
        "kubectl kustomize: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for doc in serde_norway::Deserializer::from_str(&String::from_utf8(out.stdout)?) {
        let v: serde_json::Value = k8s_openapi::serde::Deserialize::deserialize(doc)?;
        if v["kind"] != "DaemonSet" {
            continue;
        }
        for c in v["spec"]["template"]["spec"]["initContainers"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if c["name"] == "uninstall" {
                return c["command"][2]
                    .as_str()
                    .map(str::to_string)
                    .context("no shell line");
            }
        }
    }
    bail!("no uninstall init container in deploy/cleanup")
}

#[test]
fn cleanup_leaves_nothing_of_mycni_on_a_lab_node() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let t = lab(1, 0)?;
    let l = &t.0;
    let api = l.api.as_ref().context("api")?;
    // A peer, so there are routes, neighbours and FDB entries to remove.
    let mut peer = mycni_apiserver::node("peer-c", Some("10.244.60.0/24"));
    peer.metadata.annotations = Some(
        [
            (
                "mycni.dev/vtep-mac".to_string(),
                "02:00:00:00:60:01".to_string(),
            ),
            (
                "mycni.dev/host-ip".to_string(),
                "192.168.77.160".to_string(),
            ),
        ]
        .into(),
    );
    api.create_node(peer)?;
    let ns = l.spec.node_name(1);
    let routes = || mycni_testkit::sh("ip", &["-n", &ns, "route", "show", "proto", "110"]);
    let start = Instant::now();
    while !routes()?.contains("10.244.60.0/24") {
        ensure!(
            start.elapsed() < Duration::from_secs(10),
            "peer never programmed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let dir = l.spec.node_dir(1);
    let pins = l.spec.pin_dir(1);
    let pinned_before = std::fs::read_dir(&pins).map(|d| d.count()).unwrap_or(0);
    // The lab runs the fast path: there are pins and attachments to remove.
    ensure!(pinned_before > 0, "nothing pinned under {}", pins.display());
    ensure!(dir.join("data/vtep-mac").exists());

    // What the cleanup DaemonSet does on a node: the rollout stops the
    // agent, then the init container runs its line, with the container's
    // paths being the lab node's.
    l.stop_agent(1);
    let d = |s: &str| dir.join(s).to_string_lossy().into_owned();
    let bpffs = l.spec.bpffs().join("node1").to_string_lossy().into_owned();
    let script = rendered_cleanup_script()?
        .replace(
            "/usr/local/bin/mycni-agent",
            &l.spec.bins.agent.to_string_lossy(),
        )
        .replace("/host/etc/cni/net.d", &d("net.d"))
        .replace("/run/mycni", &d("run"))
        .replace("/var/lib/mycni", &d("data"))
        .replace("/sys/fs/bpf", &bpffs)
        .replace("/host/proc/sys", "/proc/sys");
    let out = mycni_testkit::sh("ip", &["netns", "exec", &ns, "/bin/sh", "-c", &script])?;
    ensure!(out.contains("mycni removed from this node"), "{out}");

    let tables = mycni_testkit::sh("ip", &["netns", "exec", &ns, "nft", "list", "tables"])?;
    ensure!(!tables.contains("mycni"), "nftables left: {tables}");
    ensure!(
        mycni_testkit::sh("ip", &["-n", &ns, "link", "show", "vxlan.1"]).is_err(),
        "vxlan.1 left"
    );
    ensure!(routes()?.trim().is_empty(), "routes left: {}", routes()?);
    let left: Vec<String> = std::fs::read_dir(&pins)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    ensure!(
        left.is_empty(),
        "pins left ({pinned_before} before): {left:?}"
    );
    for f in ["net.d/00-mycni.conflist", "run/ready", "data/vtep-mac"] {
        ensure!(!dir.join(f).exists(), "{f} left");
    }
    // No program of mycni's stays attached anywhere in the node.
    let attached = mycni_testkit::sh("ip", &["netns", "exec", &ns, "bpftool", "net", "show"])?;
    ensure!(!attached.contains("mycni"), "programs left: {attached}");
    Ok(())
}
