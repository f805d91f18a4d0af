//! The fast path on the running kernel, as a node of a real cluster runs it:
//! two nodes of dual-stack pods, agents holding exactly the DaemonSet's
//! capabilities, a fixed cross-node workload on both families, the
//! fast-path counters read from the pins, and one NetworkPolicy (deny, then
//! allow) on the fast path. What `cargo xtask kernels` runs inside each of
//! Debian's stock kernels (and `cargo xtask test` on this machine's): it
//! prints `MYCNI-FACT key=value` lines for the matrix's table.
//!
//! On a kernel that has the conntrack kfuncs (>= 6.0 here: every Debian
//! kernel that has them has all three) the node must run the fast path; on
//! one without (5.10) the complete kernel path with the reason named.

use crate::common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use common::lab_stack;
use k8s_openapi::api::networking::v1::NetworkPolicySpec;
use mycni_agent::datapath::read_family_counters;
use mycni_apiserver::{namespace, network_policy, pod};
use mycni_lab::{AGENT_CAPS_ENV, ECHO_PORT, IpFamily, Lab, Stack};
use mycni_testkit::in_netns;
use serde_json::json;

/// The agent container's `capabilities.add` in the DaemonSet: the list
/// after `add:` that holds `BPF` (the init containers' lists do not).
fn daemonset_caps() -> Result<Vec<String>> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/base/daemonset.yaml"
    );
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let lines: Vec<&str> = text.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        if l.trim() != "add:" {
            continue;
        }
        let caps: Vec<String> = lines[i + 1..]
            .iter()
            .map(|l| l.trim())
            .filter(|l| !l.starts_with('#'))
            .map_while(|l| l.strip_prefix("- "))
            .map(|c| c.trim_matches('"').to_owned())
            .collect();
        if caps.iter().any(|c| c == "BPF") {
            return Ok(caps);
        }
    }
    bail!("no capabilities.add list with BPF in {path}")
}

/// `(major, minor)` of the running kernel.
fn kernel_version() -> Result<(u32, u32)> {
    let r = std::fs::read_to_string("/proc/sys/kernel/osrelease")?;
    let mut it = r.trim().split(['.', '-']).map(str::parse::<u32>);
    match (it.next(), it.next()) {
        (Some(Ok(a)), Some(Ok(b))) => Ok((a, b)),
        _ => bail!("cannot read a version from {r:?}"),
    }
}

fn fact(key: &str, value: impl std::fmt::Display) {
    println!("MYCNI-FACT {key}={value}");
}

/// A connection within `within`: a dropped SYN is retransmitted after 1 s.
fn reachable(from_ns: &str, to: SocketAddr, within: Duration) -> Result<bool> {
    in_netns(from_ns, || TcpStream::connect_timeout(&to, within).is_ok())
}

/// Polls `from -> to` until it is `want`, up to `limit` (generous: under
/// QEMU's emulation every step is ~8x slower than on a host).
fn settles(from_ns: &str, to: SocketAddr, want: bool, limit: Duration) -> Result<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if reachable(from_ns, to, Duration::from_millis(500))? == want {
            return Ok(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("{from_ns} -> {to} not {want} within {limit:?}")
}

/// `rounds` 1 KB round trips on one echo connection from `from_ns` to `to`.
fn echo(from_ns: &str, to: SocketAddr, rounds: usize) -> Result<()> {
    in_netns(from_ns, || -> Result<()> {
        let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let out = [0x5au8; 1024];
        let mut back = [0u8; 1024];
        for _ in 0..rounds {
            s.write_all(&out)?;
            s.read_exact(&mut back)?;
            ensure!(back == out, "echo changed the bytes");
        }
        Ok(())
    })?
}

/// Node `i`'s fast-path packets by `family/path`, from its pinned counters.
fn pinned_counters(l: &Lab, i: usize) -> Result<BTreeMap<String, u64>> {
    let pin = l.spec.pin_dir(i);
    Ok(read_family_counters(&pin)
        .with_context(|| format!("reading the counters pinned at {}", pin.display()))?
        .into_iter()
        .map(|(f, p, c)| (format!("{}/{}", f.name(), p.name()), c.packets))
        .collect())
}

/// `e` with what node `i` enforces and its agent's warnings.
fn diagnose(l: &Lab, i: usize, e: anyhow::Error) -> anyhow::Error {
    let n = l.spec.node_name(i);
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
    )
    .unwrap_or_else(|e| format!("{e:#}"));
    let log = std::fs::read_to_string(l.spec.node_dir(i).join("agent.log")).unwrap_or_default();
    let log: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR") || l.contains("policy"))
        .collect();
    e.context(format!(
        "node {i}'s policy table:\n{table}\nits agent's warnings:\n{}",
        log.join("\n")
    ))
}

#[test]
fn the_fast_path_runs_on_this_kernel_with_the_daemonsets_capabilities() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let (major, minor) = kernel_version()?;
    let caps = daemonset_caps()?;
    fact("caps", caps.join(","));
    // SAFETY (env): set before any thread of this test binary reads it;
    // the lab's start_agent reads it for every agent it starts.
    unsafe { std::env::set_var(AGENT_CAPS_ENV, caps.join(",")) };
    let t = lab_stack(2, 2, Stack::Dual, &[]);
    unsafe { std::env::remove_var(AGENT_CAPS_ENV) };
    let t = t?;
    let l = &t.0;
    let pods = l.pods()?;
    // The lab's runtime names a node's pods lab/pod1, lab/pod2, ... on
    // every node: a is node 1's pod1 and b node 2's pod2, so their names
    // differ for the policy below.
    let find = |node, index| {
        pods.iter()
            .find(|p| p.node == node && p.index == index)
            .with_context(|| format!("no pod {index} on node {node}"))
    };
    let (a, b) = (find(1, 1)?, find(2, 2)?);

    let ready = l.readyz(1)?;
    let ebpf = ready.contains("datapath ebpf");
    let attach = ["tcx", "legacy tc"]
        .into_iter()
        .find(|m| ready.contains(&format!("{m} attach")))
        .unwrap_or("none");
    fact(
        "datapath",
        match (ebpf, ready.contains("no conntrack kfunc")) {
            (true, _) => "ebpf",
            (false, true) => "kernel(no-conntrack-kfuncs)",
            (false, false) => "kernel",
        },
    );
    fact("attach", attach.replace(' ', "-"));
    eprintln!("node 1 readiness: {ready}");
    let has_kfuncs = (major, minor) >= (6, 0);
    let lacks_kfuncs = (major, minor) < (5, 18);
    if has_kfuncs {
        ensure!(
            ebpf,
            "Linux {major}.{minor} has the conntrack kfuncs, yet: {ready}"
        );
    }
    if lacks_kfuncs {
        ensure!(
            !ebpf,
            "Linux {major}.{minor} has no conntrack kfuncs, yet: {ready}"
        );
        ensure!(
            ready.contains("no conntrack kfunc bpf_skb_ct_lookup"),
            "the kernel path's reason is not named: {ready}"
        );
    }

    // The workload: every pod reaches the other across nodes on both
    // families (ping, a TCP round trip and a 200 KB echo: the lab's matrix),
    // then 200 round trips per family on one connection each, which the
    // fast path carries once conntrack calls it established.
    let (table, failed) = l.matrix()?;
    ensure!(failed == 0, "unreachable pairs:\n{table}");
    let before: Result<Vec<_>> = (1..=2).map(|i| pinned_counters(l, i)).collect();
    for f in [IpFamily::V4, IpFamily::V6] {
        let to = b.addr(f).context("b has no address of the family")?;
        echo(&a.ns, SocketAddr::new(to, ECHO_PORT), 200)?;
    }
    if ebpf {
        let before = before?;
        let after: Vec<_> = (1..=2)
            .map(|i| pinned_counters(l, i))
            .collect::<Result<_>>()?;
        let delta = |i: usize, k: &str| {
            after[i - 1].get(k).copied().unwrap_or(0) - before[i - 1].get(k).copied().unwrap_or(0)
        };
        for fam in ["ipv4", "ipv6"] {
            // a's node encapsulates towards b, b's node unwraps in tc (IPv6
            // inside IPv4 too: before Linux 6.3 by the veth's egress).
            let encap = delta(a.node, &format!("{fam}/fast_encap"));
            let decap = delta(b.node, &format!("{fam}/fast_tc_decap"));
            fact(&format!("{fam}_fast"), format!("{encap}/{decap}"));
            ensure!(
                encap > 0 && decap > 0,
                "{fam}: fast_encap {encap}, fast_tc_decap {decap}: {:?}",
                after
            );
        }
    }

    // One NetworkPolicy on the fast path: deny b's ingress, then allow a
    // by its addresses (a podSelector for a would also find node 2's pod1,
    // which has a's name).
    let api = l.api.as_ref().context("api")?;
    api.create_namespace(namespace("lab", &[]))?;
    // Both need a Pod object: once a policy exists, a pod the room cannot
    // judge fails closed.
    for (p, app) in [(a, "a"), (b, "b")] {
        let name = format!("pod{}", p.index);
        api.create_pod(pod(
            "lab",
            &name,
            &[("app", app)],
            Some(&l.spec.node_name(p.node)),
        ))?;
    }
    let to_b = SocketAddr::new(IpAddr::V4(b.ip), ECHO_PORT);
    let limit = Duration::from_secs(5) * mycni_lab::time_scale();
    settles(&a.ns, to_b, true, limit).context("open before any policy")?;
    let deny: NetworkPolicySpec =
        serde_json::from_value(json!({"podSelector": {"matchLabels": {"app": "b"}}}))?;
    api.create_network_policy(network_policy("lab", "only-a", deny))?;
    let denied = match settles(&a.ns, to_b, false, limit) {
        Ok(d) => d,
        Err(e) => return Err(diagnose(l, b.node, e)),
    };
    let a6 = a.addr(IpFamily::V6).context("a has no IPv6 address")?;
    let allow: NetworkPolicySpec = serde_json::from_value(json!({
        "podSelector": {"matchLabels": {"app": "b"}},
        "ingress": [{"from": [
            {"ipBlock": {"cidr": format!("{}/32", a.ip)}},
            {"ipBlock": {"cidr": format!("{a6}/128")}}
        ]}]
    }))?;
    api.update_network_policy("lab", "only-a", |np| np.spec = Some(allow))?;
    let allowed = settles(&a.ns, to_b, true, limit).map_err(|e| diagnose(l, b.node, e))?;
    let before = pinned_counters(l, a.node);
    echo(&a.ns, to_b, 50)?;
    if ebpf {
        let (before, after) = (before?, pinned_counters(l, a.node)?);
        let k = "ipv4/fast_encap";
        let n = after.get(k).copied().unwrap_or(0) - before.get(k).copied().unwrap_or(0);
        fact("policy_allowed_fast_encap", n);
        ensure!(n > 0, "the allowed connection did not take the fast path");
    }
    fact(
        "policy_ms",
        format!("{}/{}", denied.as_millis(), allowed.as_millis()),
    );
    Ok(())
}
