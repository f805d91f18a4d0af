//! Only peers may tunnel in, on the kernel path: a VXLAN datagram crafted
//! by a host of the underlay that is not a peer Node (the underlay bridge,
//! 192.168.77.1) never reaches the pod it names, while the very same
//! datagram from a peer node does, and so does ordinary pod traffic; the
//! agent's nftables set follows the peers (a Node added with that host's IP
//! lets it in, deleting it shuts it out again, no peers drops everything).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use mycni_apiserver::node;
use mycni_common::net::Mac;
use mycni_lab::{Lab, Pod, node_ip};
use mycni_testkit::{in_netns, sh};

use crate::common;

const VNI: u32 = 1;
const VXLAN_PORT: u16 = 8472;
/// Where the pod on node 1 listens for the test's datagrams.
const POD_PORT: u16 = 9999;
/// The inner source: a pod address on node 2, as a peer's traffic has.
const INNER_SRC: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 200);

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> Result<bool>) -> Result<()> {
    let start = Instant::now();
    let mut last = None;
    while start.elapsed() < timeout {
        match f() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("{what}: not within {timeout:?} (last error: {last:?})")
}

/// RFC 1071 checksum of an IPv4 header.
fn ip_checksum(h: &[u8]) -> u16 {
    let mut sum: u32 = h
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A VXLAN payload (what goes after the outer UDP header): VNI 1, an
/// Ethernet frame to `vtep_mac`, IPv4 + UDP from `INNER_SRC` to `dst`.
fn vxlan_payload(vtep_mac: [u8; 6], dst: Ipv4Addr, body: &[u8]) -> Vec<u8> {
    let mut p = vec![0x08, 0, 0, 0];
    p.extend_from_slice(&(VNI << 8).to_be_bytes());
    p.extend_from_slice(&vtep_mac);
    p.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x99]);
    p.extend_from_slice(&[0x08, 0x00]);
    let udp_len = 8 + body.len() as u16;
    let mut ip = vec![0x45, 0];
    ip.extend_from_slice(&(20 + udp_len).to_be_bytes());
    ip.extend_from_slice(&[0x12, 0x34, 0x40, 0, 64, 17, 0, 0]);
    ip.extend_from_slice(&INNER_SRC.octets());
    ip.extend_from_slice(&dst.octets());
    let c = ip_checksum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    p.extend_from_slice(&ip);
    // UDP checksum 0: none, which IPv4 allows.
    p.extend_from_slice(&40000u16.to_be_bytes());
    p.extend_from_slice(&POD_PORT.to_be_bytes());
    p.extend_from_slice(&udp_len.to_be_bytes());
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(body);
    p
}

/// Sends `payload` from namespace `ns`, source address `src`, to node 1's
/// VXLAN port, `n` times.
fn send_vxlan(ns: &str, src: Ipv4Addr, payload: &[u8], n: usize) -> Result<()> {
    in_netns(ns, || -> Result<()> {
        let s = UdpSocket::bind((src, 0))?;
        for _ in 0..n {
            s.send_to(payload, (node_ip(1), VXLAN_PORT))?;
        }
        Ok(())
    })?
}

/// Every datagram the socket receives within `window`, as text.
fn received(sock: &UdpSocket, window: Duration) -> Result<Vec<String>> {
    let end = Instant::now() + window;
    let mut out = vec![];
    let mut buf = [0u8; 2048];
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        sock.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
        match sock.recv(&mut buf) {
            Ok(n) => out.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(out)
}

fn vtep_mac(l: &Lab, i: usize) -> Result<[u8; 6]> {
    let link = sh(
        "ip",
        &["-n", &l.spec.node_name(i), "-o", "link", "show", "vxlan.1"],
    )?;
    let text = link
        .split("link/ether ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .context("no MAC on vxlan.1")?;
    let mac: Mac = text.parse().with_context(|| format!("bad MAC {text}"))?;
    Ok(mac.octets())
}

/// The host IPs node 1 accepts VXLAN from, as nft lists them.
fn peer_set(l: &Lab) -> Result<BTreeSet<Ipv4Addr>> {
    let t = sh(
        "ip",
        &[
            "netns",
            "exec",
            &l.spec.node_name(1),
            "nft",
            "list",
            "set",
            "ip",
            "mycni_underlay",
            "peers",
        ],
    )?;
    let Some(rest) = t.split("elements = {").nth(1) else {
        return Ok(BTreeSet::new());
    };
    rest.split('}')
        .next()
        .unwrap_or_default()
        .split(',')
        .map(|e| e.trim().parse().with_context(|| format!("element {e:?}")))
        .collect()
}

/// Packets the underlay filter's rule dropped on node 1.
fn dropped(l: &Lab) -> Result<u64> {
    let t = sh(
        "ip",
        &[
            "netns",
            "exec",
            &l.spec.node_name(1),
            "nft",
            "list",
            "chain",
            "ip",
            "mycni_underlay",
            "input",
        ],
    )?;
    t.split("counter packets ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("no counter in {t}"))
}

fn peer_node(name: &str, cidr: &str, mac: &str, ip: &str) -> k8s_openapi::api::core::v1::Node {
    let mut n = node(name, Some(cidr));
    n.metadata.annotations = Some(BTreeMap::from([
        ("mycni.dev/vtep-mac".to_string(), mac.to_string()),
        ("mycni.dev/host-ip".to_string(), ip.to_string()),
    ]));
    n
}

#[test]
fn vxlan_from_a_host_that_is_not_a_peer_never_reaches_a_pod() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let t = common::lab_with(2, 1, &["--datapath", "kernel"])?;
    let l = &t.0;
    let api = l.api.as_ref().context("api")?;
    let pods = l.pods()?;
    let on = |n: usize| -> Result<Pod> {
        pods.iter()
            .find(|p| p.node == n)
            .cloned()
            .with_context(|| format!("no pod on node {n}"))
    };
    let (target, peer_pod) = (on(1)?, on(2)?);
    let m = l.metrics(1)?;
    ensure!(m.contains("mycni_datapath_ebpf 0"), "not the kernel path");
    let sock = in_netns(&target.ns, || UdpSocket::bind(("0.0.0.0", POD_PORT)))??;
    let mac = vtep_mac(l, 1)?;
    let underlay = l.spec.underlay_ns();
    let outsider = Ipv4Addr::new(192, 168, 77, 1);
    let spoof = vxlan_payload(mac, target.ip, b"spoofed");
    let from_peer = vxlan_payload(mac, target.ip, b"from-peer");

    let set = peer_set(l)?;
    ensure!(set == BTreeSet::from([node_ip(2)]), "{set:?}");
    ensure!(m.contains("mycni_underlay_filter_peers 1"), "{m}");
    let dropped_before = dropped(l)?;

    // The outsider's datagrams are dropped; the same bytes from the peer
    // node arrive, so the datagram itself is one vxlan.1 would deliver.
    send_vxlan(&underlay, outsider, &spoof, 3)?;
    let got = received(&sock, Duration::from_millis(500))?;
    ensure!(
        got.is_empty(),
        "a non-peer's VXLAN reached the pod: {got:?}"
    );
    let dropped_now = dropped(l)? - dropped_before;
    ensure!(dropped_now == 3, "{dropped_now} datagrams dropped, not 3");
    send_vxlan(&l.spec.node_name(2), node_ip(2), &from_peer, 3)?;
    let got = received(&sock, Duration::from_millis(500))?;
    ensure!(
        got.len() == 3 && got.iter().all(|g| g == "from-peer"),
        "the peer's datagrams: {got:?}"
    );

    // Ordinary traffic from a pod on the peer node, encapsulated by its kernel.
    in_netns(&peer_pod.ns, || -> Result<()> {
        let s = UdpSocket::bind(("0.0.0.0", 0))?;
        s.send_to(b"pod-to-pod", (target.ip, POD_PORT))?;
        Ok(())
    })??;
    let got = received(&sock, Duration::from_millis(500))?;
    ensure!(got == ["pod-to-pod"], "pod traffic from the peer: {got:?}");

    // The set follows the peers: a Node with the outsider's address lets
    // it in, deleting that Node shuts it out again.
    api.create_node(peer_node(
        "outsider",
        "10.244.9.0/24",
        "02:00:00:00:09:01",
        &outsider.to_string(),
    ))?;
    wait_until("the outsider in the set", Duration::from_secs(5), || {
        Ok(peer_set(l)?.contains(&outsider))
    })?;
    send_vxlan(&underlay, outsider, &spoof, 1)?;
    let got = received(&sock, Duration::from_millis(500))?;
    ensure!(got == ["spoofed"], "a peer's own datagram: {got:?}");
    api.delete_node("outsider")?;
    wait_until(
        "the outsider out of the set",
        Duration::from_secs(5),
        || Ok(!peer_set(l)?.contains(&outsider)),
    )?;
    send_vxlan(&underlay, outsider, &spoof, 1)?;
    let got = received(&sock, Duration::from_millis(500))?;
    ensure!(
        got.is_empty(),
        "a removed peer's VXLAN still arrives: {got:?}"
    );

    // No peers at all: no VXLAN at all.
    api.delete_node(&l.spec.node_name(2))?;
    wait_until("an empty set", Duration::from_secs(5), || {
        Ok(peer_set(l)?.is_empty())
    })?;
    send_vxlan(&l.spec.node_name(2), node_ip(2), &from_peer, 1)?;
    let got = received(&sock, Duration::from_millis(500))?;
    ensure!(got.is_empty(), "VXLAN arrives with no peers: {got:?}");
    let m = l.metrics(1)?;
    ensure!(m.contains("mycni_underlay_filter_peers 0"), "{m}");
    ensure!(m.contains("mycni_underlay_filter_errors_total 0"), "{m}");
    eprintln!(
        "underlay filter on node 1: {} non-peer datagrams dropped",
        dropped(l)? - dropped_before
    );
    Ok(())
}

#[test]
fn the_underlay_filter_is_back_within_a_pass_after_someone_deletes_it() -> Result<()> {
    let _turn = crate::turn(module_path!());
    // Either datapath: the table is the agent's in both.
    let t = common::lab(2, 0)?;
    let l = &t.0;
    let api = l.api.as_ref().context("api")?;
    let ns = l.spec.node_name(1);
    sh(
        "ip",
        &[
            "netns",
            "exec",
            &ns,
            "nft",
            "delete",
            "table",
            "ip",
            "mycni_underlay",
        ],
    )?;
    // The next set change writes it whole again.
    api.create_node(peer_node(
        "p",
        "10.244.9.0/24",
        "02:00:00:00:09:01",
        "192.168.77.99",
    ))?;
    wait_until("the table back", Duration::from_secs(5), || {
        Ok(peer_set(l)? == BTreeSet::from([node_ip(2), Ipv4Addr::new(192, 168, 77, 99)]))
    })?;
    let m = l.metrics(1)?;
    ensure!(
        m.contains("mycni_underlay_filter_errors_total 1"),
        "the failed update is not counted: {m}"
    );
    Ok(())
}
