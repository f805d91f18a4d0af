//! IPv6 anti-spoofing on the kernel path: in a "node" namespace holding
//! the agent's `ip6 mycni_antispoof` table (installed by the agent's own
//! code), pods made by the real `mycni` plugin (dual-stack, built-in IPAM)
//! send UDP to each other. From its own IPv6 address a pod reaches another
//! pod; from a third pod's address or an outside one it does not, and the
//! table's counter counts each such datagram. Neighbour discovery (entries
//! deleted on both sides, so pods and node solicit again), a link-local
//! ping to the gateway and pod-to-pod pings keep working with nothing
//! counted, and so does duplicate address detection (from `::`). Before the table exists and after `uninstall` removes it the
//! spoofed datagrams are delivered: the hole the table closes, and proof
//! that this test sees it.
//!
//! Everything lives in namespaces the test creates; dropping them (also on
//! failure) removes the pods, their veths and the table with them.

use std::net::{Ipv6Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use mycni_agent::metrics::Format;
use mycni_agent::tables::antispoof;
use mycni_testkit::cni::{Call, Node};
use mycni_testkit::{NetNs, in_netns};
use serde_json::{Value, json};

use crate::common;

/// Where pod 2 listens.
const PORT: u16 = 9999;
/// A source no pod owns, outside the cluster.
const FOREIGN: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
/// An address pod 1 adds with duplicate address detection on.
const DAD_ADDR: &str = "fd00:10:244:61::99/128";
/// Datagrams sent per spoofed case: the counter must move by exactly this.
const BURST: u64 = 3;
/// How long a datagram that is not delivered is waited for: veths deliver
/// in the sender's softirq, so a delivered one arrives in microseconds.
const QUIET: Duration = Duration::from_millis(300);

struct Pod {
    ns: NetNs,
    ip6: Ipv6Addr,
    host_veth: String,
}

/// A dual-stack network with one range set per family (IPv4 primary).
fn conf(node: &Node) -> Value {
    let mut c = node.conf("1.0.0", "10.244.61.0/24");
    c["ipam"] = json!({
        "type": "mycni-ipam",
        "ranges": [[{ "subnet": "10.244.61.0/24" }], [{ "subnet": "fd00:10:244:61::/64" }]],
        "dataDir": node.lease_dir(),
    });
    c
}

fn add_pod(node: &Node, conf: &Value, i: usize) -> Result<Pod> {
    let ns = NetNs::new("pod")?;
    let path = ns.path().to_string_lossy().into_owned();
    let cid = format!("c{i}");
    let args = format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-{i};K8S_POD_INFRA_CONTAINER_ID={cid}"
    );
    let call = Call {
        container_id: &cid,
        netns: &path,
        ifname: "eth0",
        args: &args,
    };
    let add = node.run("mycni", "ADD", &call, conf)?;
    ensure!(add.ok, "ADD of pod {i}: {}", add.stdout);
    let ip6 = add.json["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip["address"].as_str()?.split('/').next())
        .find_map(|a| a.parse::<Ipv6Addr>().ok())
        .with_context(|| format!("no IPv6 address for pod {i}: {}", add.json))?;
    let host_veth = add.json["interfaces"][0]["name"]
        .as_str()
        .with_context(|| format!("no host interface for pod {i}: {}", add.json))?
        .to_string();
    Ok(Pod { ns, ip6, host_veth })
}

/// An address of someone else's on a pod's eth0, so its sockets can send
/// from it; removed on drop.
struct Borrowed<'a> {
    pod: &'a Pod,
    addr: String,
}

impl<'a> Borrowed<'a> {
    fn new(pod: &'a Pod, ip: Ipv6Addr) -> Result<Self> {
        let addr = format!("{ip}/128");
        pod.ns
            .exec("ip", &["-6", "addr", "add", &addr, "dev", "eth0", "nodad"])?;
        Ok(Borrowed { pod, addr })
    }
}

impl Drop for Borrowed<'_> {
    fn drop(&mut self) {
        let _ = self
            .pod
            .ns
            .exec("ip", &["-6", "addr", "del", &self.addr, "dev", "eth0"]);
    }
}

fn send(from: &Pod, src: Ipv6Addr, dst: Ipv6Addr, tag: &str, n: u64) -> Result<()> {
    in_netns(from.ns.name(), || -> std::io::Result<()> {
        let s = UdpSocket::bind(SocketAddr::from((src, 0)))?;
        for _ in 0..n {
            s.send_to(tag.as_bytes(), SocketAddr::from((dst, PORT)))?;
        }
        Ok(())
    })?
    .with_context(|| format!("sending from {src} to {dst}"))
}

/// Whether a datagram `tag` from `src` arrives on `rx` within `within`;
/// others (late ones of an earlier case) are skipped.
fn arrives(rx: &UdpSocket, tag: &str, src: Ipv6Addr, within: Duration) -> Result<bool> {
    let end = Instant::now() + within;
    let mut buf = [0u8; 128];
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        rx.set_read_timeout(Some(left))?;
        match rx.recv_from(&mut buf) {
            Ok((n, from)) if &buf[..n] == tag.as_bytes() && from.ip() == src => return Ok(true),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(false);
            }
            Err(e) => bail!("receiving: {e}"),
        }
    }
}

/// Pod `from` sends `tag` to `to` from `src` (borrowed if not its own);
/// whether `to` got it.
fn delivered(from: &Pod, to: &Pod, rx: &UdpSocket, src: Ipv6Addr, tag: &str) -> Result<bool> {
    let _borrowed = if src == from.ip6 {
        None
    } else {
        Some(Borrowed::new(from, src)?)
    };
    send(from, src, to.ip6, tag, BURST)?;
    let wait = if src == from.ip6 {
        Duration::from_secs(2)
    } else {
        QUIET
    };
    arrives(rx, tag, src, wait)
}

/// The table's counter, read as `/metrics` reads it.
fn dropped(node: &Node) -> Result<u64> {
    in_netns(node.ns.name(), antispoof::dropped)?
}

fn table_exists(node: &Node) -> Result<bool> {
    let tables = node.ns.exec("nft", &["list", "tables"])?;
    Ok(tables.contains(antispoof::TABLE))
}

#[test]
fn spoofed_ipv6_sources_from_pods_are_dropped_and_counted() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let plugin = mycni_e2e::bin("mycni");
    mycni_e2e::missing(&[&plugin])?;
    let node = Node::new(&plugin)?;
    let conf = conf(&node);
    let pods = (1..=3)
        .map(|i| add_pod(&node, &conf, i))
        .collect::<Result<Vec<_>>>()?;
    let (p1, p2, p3) = (&pods[0], &pods[1], &pods[2]);
    for p in &pods {
        ensure!(
            p.host_veth.starts_with(antispoof::HOST_VETH_PREFIX),
            "host veth {} is not matched by the rule's wildcard",
            p.host_veth
        );
    }
    let rx = in_netns(p2.ns.name(), || {
        UdpSocket::bind(SocketAddr::from((Ipv6Addr::UNSPECIFIED, PORT)))
    })??;

    // Without the table: IPv6 has no rp_filter, so spoofed sources pass.
    ensure!(!table_exists(&node)?, "table present before install");
    ensure!(
        delivered(p1, p2, &rx, p1.ip6, "own-before")?,
        "pod 1 cannot reach pod 2 over IPv6 at all"
    );
    ensure!(
        delivered(p1, p2, &rx, p3.ip6, "as-pod3-before")?,
        "without the table, pod 1 sending as pod 3 was not delivered: the test no longer sees the hole it checks"
    );
    ensure!(
        delivered(p1, p2, &rx, FOREIGN, "foreign-before")?,
        "without the table, pod 1 sending as {FOREIGN} was not delivered"
    );

    // Twice: the replace is idempotent and leaves one rule.
    for _ in 0..2 {
        in_netns(node.ns.name(), antispoof::install)??;
    }
    let chain = node.ns.exec(
        "nft",
        &["list", "chain", "ip6", antispoof::TABLE, "prerouting"],
    )?;
    ensure!(chain.matches(" drop ").count() == 1, "{chain}");
    ensure!(dropped(&node)? == 0, "counter not 0 after install");

    ensure!(
        delivered(p1, p2, &rx, p1.ip6, "own")?,
        "pod 1's own IPv6 source dropped by the table"
    );
    ensure!(
        !delivered(p1, p2, &rx, p3.ip6, "as-pod3")?,
        "pod 1 sending as pod 3 ({}) was delivered",
        p3.ip6
    );
    ensure!(
        !delivered(p1, p2, &rx, FOREIGN, "foreign")?,
        "pod 1 sending as {FOREIGN} was delivered"
    );
    let n = dropped(&node)?;
    ensure!(
        n == 2 * BURST,
        "counter {n}, not the {} spoofed datagrams",
        2 * BURST
    );

    // What /metrics exports, rendered in the node as a scrape does.
    let metrics = mycni_agent::metrics::Metrics::default();
    antispoof::set_installed(&metrics, true);
    let text = in_netns(node.ns.name(), || metrics.render(Format::Prometheus))??;
    let line = format!(
        "mycni_antispoof_dropped_total{{family=\"ipv6\"}} {}",
        2 * BURST
    );
    ensure!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
    ensure!(
        text.lines().any(|l| l == "mycni_antispoof_ipv6 1"),
        "{text}"
    );

    // Neighbour discovery through the rule: both ends solicit again.
    p1.ns
        .exec("ip", &["-6", "neigh", "del", "fe80::1", "dev", "eth0"])?;
    for p in [p1, p2] {
        node.ns
            .exec("ip", &["-6", "neigh", "flush", "dev", &p.host_veth])?;
    }
    p1.ns
        .exec("ping", &["-6", "-c", "2", "-W", "2", &p2.ip6.to_string()])
        .context("pod 1 -> pod 2 after its gateway's neighbour entry was deleted")?;
    let neigh = p1
        .ns
        .exec("ip", &["-6", "neigh", "show", "fe80::1", "dev", "eth0"])?;
    ensure!(
        neigh.contains("lladdr") && !neigh.contains("PERMANENT"),
        "pod 1 did not learn its gateway by NDP: {neigh:?}"
    );
    // From the pod's own link-local address, the source NDP and MLD use.
    p1.ns
        .exec("ping", &["-6", "-c", "1", "-W", "2", "fe80::1%eth0"])
        .context("pod 1 -> fe80::1 from its link-local address")?;
    p2.ns
        .exec("ping", &["-6", "-c", "2", "-W", "2", &p1.ip6.to_string()])
        .context("pod 2 -> pod 1 after the node's neighbour entries were flushed")?;
    // Duplicate address detection: a solicitation from `::`, with no
    // route back (the kernel's fib lookup also lets ICMPv6 from `::` to
    // link-local scope pass, since Linux 4.x; the rule says it itself).
    p1.ns
        .exec("sysctl", &["-qw", "net.ipv6.conf.eth0.accept_dad=1"])?;
    p1.ns
        .exec("ip", &["-6", "addr", "add", DAD_ADDR, "dev", "eth0"])?;
    let tentative = || -> Result<bool> {
        let a = p1
            .ns
            .exec("ip", &["-6", "addr", "show", "dev", "eth0", "tentative"])?;
        Ok(!a.trim().is_empty())
    };
    ensure!(
        tentative()?,
        "no DAD for {DAD_ADDR}: the check would be vacuous"
    );
    let end = Instant::now() + Duration::from_secs(5);
    while tentative()? {
        ensure!(Instant::now() < end, "DAD of {DAD_ADDR} did not finish");
        std::thread::sleep(Duration::from_millis(100));
    }
    p1.ns
        .exec("ip", &["-6", "addr", "del", DAD_ADDR, "dev", "eth0"])?;
    p1.ns
        .exec("sysctl", &["-qw", "net.ipv6.conf.eth0.accept_dad=0"])?;
    ensure!(
        delivered(p1, p2, &rx, p1.ip6, "own-after-ndp")?,
        "pod 1's own source dropped after NDP"
    );
    let n = dropped(&node)?;
    ensure!(
        n == 2 * BURST,
        "legitimate traffic was counted as spoofed: counter {n}"
    );

    // Uninstall removes the table, and is idempotent.
    for _ in 0..2 {
        in_netns(node.ns.name(), antispoof::uninstall)??;
    }
    ensure!(!table_exists(&node)?, "table left after uninstall");
    ensure!(
        delivered(p1, p2, &rx, FOREIGN, "foreign-after-uninstall")?,
        "spoofed source still dropped after uninstall"
    );
    Ok(())
}

/// The agent's start-up puts the table in place (before anything else, so
/// pods of an earlier run are covered while it waits for the API) and
/// `/metrics` says so; `uninstall` removing it is checked with the other
/// tables in `agent.rs`.
#[test]
fn the_agent_installs_the_table_at_start_and_exports_it() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let t = common::lab(1, 1)?;
    let l = &t.0;
    let table = common::ns_sh(
        &l.spec.node_name(1),
        "nft",
        &["list", "table", "ip6", antispoof::TABLE],
    )?;
    ensure!(
        table.contains("fib saddr . iif oif missing counter name \"spoofed\" drop"),
        "{table}"
    );
    let m = l.metrics(1)?;
    ensure!(m.lines().any(|l| l == "mycni_antispoof_ipv6 1"), "{m}");
    ensure!(
        m.lines()
            .any(|l| l.starts_with("mycni_antispoof_dropped_total{family=\"ipv6\"} ")),
        "{m}"
    );
    // The gauge follows the table, not what start-up did.
    common::ns_sh(
        &l.spec.node_name(1),
        "nft",
        &["delete", "table", "ip6", antispoof::TABLE],
    )?;
    let m = l.metrics(1)?;
    ensure!(m.lines().any(|l| l == "mycni_antispoof_ipv6 0"), "{m}");
    ensure!(!m.contains("mycni_antispoof_dropped_total{"), "{m}");
    Ok(())
}
