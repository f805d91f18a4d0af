//! The kernel's own drops, reported by the `kfree_skb` tracepoint of the
//! agent's eBPF object: each drop reason a test makes the kernel take on
//! a watched host veth gives exactly one event, with the kernel's reason
//! name and the packet's 5-tuple, read from the object's ring; repeats
//! within a second fold into the next event's count; drops on interfaces
//! the agent does not watch give nothing.
//!
//! Every test has its own node and pod namespaces (removed on drop, also
//! on failure), its own bpffs and its own loaded object (so its own ring
//! and watch list); the tracepoint sees every namespace of the kernel, and
//! the watch list keys interfaces by namespace, so tests running side by
//! side (and whatever else the machine runs) do not see each other's drops.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::{FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use aya::maps::{MapData, RingBuf};
use mycni_agent::datapath::kdrop::current_netns;
use mycni_agent::datapath::{Datapath, embedded_object};
use mycni_agent::flows::kdrop_names::DropReasons;
use mycni_common::flow::{
    DropIface, FLOW_DROP, FLOW_STAT_EMITTED, FLOW_STAT_LOST, FLOW_STAT_SUPPRESSED, FlowEvent,
    FlowSource,
};
use mycni_testkit::{BpfFs, NetNs, VethPair, unique};

mod cost;
mod net;
mod watch;

use net::*;
use watch::*;

const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
/// A pod that sends as an address that is not its own: the node has no
/// route back to it through the pod's veth (IPv4 anti-spoofing).
#[test]
fn reverse_path_filter_drop_is_reported_once_a_second_with_its_count() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let bpffs = BpfFs::new()?;
    let net = VethPair::new("10.231.0.1", "10.231.0.2")?;
    net.pin_neighbours("10.231.0.1", "10.231.0.2")?;
    rp_filter(&net.node, &net.host_if)?;
    net.pod
        .exec("ip", &["addr", "add", "10.77.7.7/32", "dev", "eth0"])?;
    let ifindex = net.host_ifindex()?;
    let mut w = Watch::new(&net.node, &bpffs, &[ifindex])?;

    let f = Flow {
        ifindex,
        src: "10.77.7.7:40001".parse()?,
        dst: "10.231.0.1:9".parse()?,
        proto: PROTO_UDP,
    };
    // Two packets back to back: the second within the first's second,
    // folded (counted as suppressed), so exactly one event.
    let first = Instant::now();
    udp_n(&net.pod, f.src, f.dst, 2)?;
    w.one(&f, "IP_RPFILTER", 1)?;
    let stats = w.dp.flow_stats()?;
    ensure!(
        stats[FLOW_STAT_SUPPRESSED as usize] >= 1
            && stats[FLOW_STAT_EMITTED as usize] >= 1
            && stats[FLOW_STAT_LOST as usize] == 0,
        "stats (emitted, lost, suppressed): {stats:?}"
    );

    // Well after that second: one event standing for the folded one too.
    std::thread::sleep(Duration::from_millis(1500).saturating_sub(first.elapsed()));
    udp(&net.pod, f.src, f.dst)?;
    w.one(&f, "IP_RPFILTER", 2)?;
    Ok(())
}

/// A burst that stops: the program reports its first drop and folds the
/// rest, which no later drop of the flow will carry; once the flow's
/// second is over the agent's reader takes them from the pinned limit
/// (`flows::ring::take_folded`) as one event with their count, and the
/// flow's next drop is reported at once, on its own.
#[test]
fn drops_folded_after_a_flows_last_event_are_reported_after_its_second() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let bpffs = BpfFs::new()?;
    let net = VethPair::new("10.236.0.1", "10.236.0.2")?;
    net.pin_neighbours("10.236.0.1", "10.236.0.2")?;
    rp_filter(&net.node, &net.host_if)?;
    net.pod
        .exec("ip", &["addr", "add", "10.77.8.8/32", "dev", "eth0"])?;
    let ifindex = net.host_ifindex()?;
    let mut w = Watch::new(&net.node, &bpffs, &[ifindex])?;
    let mut limit = mycni_agent::flows::ring::open_drop_limit(bpffs.path())?;

    let f = Flow {
        ifindex,
        src: "10.77.8.8:40003".parse()?,
        dst: "10.236.0.1:9".parse()?,
        proto: PROTO_UDP,
    };
    let first = Instant::now();
    udp_n(&net.pod, f.src, f.dst, 5)?;
    w.one(&f, "IP_RPFILTER", 1)?;
    let early = mycni_agent::flows::ring::take_folded(&mut limit);
    ensure!(
        first.elapsed() >= Duration::from_secs(1) || !early.iter().any(|e| f.matches(e)),
        "the fold was taken before the flow's second was over: {early:?}"
    );
    std::thread::sleep(Duration::from_millis(1100).saturating_sub(first.elapsed()));
    let taken: Vec<FlowEvent> = mycni_agent::flows::ring::take_folded(&mut limit)
        .into_iter()
        .filter(|e| f.matches(e))
        .collect();
    ensure!(
        taken.len() == 1 && taken[0].count == 4 && taken[0].kind == FLOW_DROP,
        "want one event for the 4 folded drops, got {taken:?}"
    );
    ensure!(
        w.show(&taken).contains("[IP_RPFILTER "),
        "reason: {}",
        w.show(&taken)
    );
    ensure!(
        !mycni_agent::flows::ring::take_folded(&mut limit)
            .iter()
            .any(|e| f.matches(e)),
        "the fold was reported twice"
    );
    // The flow's next drop is reported on its own, not folded.
    udp(&net.pod, f.src, f.dst)?;
    w.one(&f, "IP_RPFILTER", 1)?;
    Ok(())
}

/// A pod sends to an address the node has no route to, while forwarding.
#[test]
fn no_route_drop_is_reported() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let bpffs = BpfFs::new()?;
    let net = VethPair::new("10.232.0.1", "10.232.0.2")?;
    net.pin_neighbours("10.232.0.1", "10.232.0.2")?;
    sysctl(&net.node, "net.ipv4.ip_forward", "1")?;
    net.pod
        .exec("ip", &["route", "add", "default", "via", "10.232.0.1"])?;
    let ifindex = net.host_ifindex()?;
    let mut w = Watch::new(&net.node, &bpffs, &[ifindex])?;

    let f = Flow {
        ifindex,
        src: "10.232.0.2:40002".parse()?,
        dst: "198.51.100.7:53".parse()?,
        proto: PROTO_UDP,
    };
    udp(&net.pod, f.src, f.dst)?;
    // With forwarding on, ip_error names a missing route IP_INNOROUTES
    // (ENETUNREACH); IP_OUTNOROUTES is the same for locally sent packets.
    w.one(&f, "IP_INNOROUTES", 1)?;
    Ok(())
}

/// The same over IPv6: the tuple is read from the IPv6 header.
#[test]
fn ipv6_no_route_drop_is_reported() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let bpffs = BpfFs::new()?;
    let net = VethPair::new("10.237.0.1", "10.237.0.2")?;
    sysctl(&net.node, "net.ipv6.conf.all.forwarding", "1")?;
    net.node.exec(
        "ip",
        &[
            "-6",
            "addr",
            "add",
            "fd00:237::1/64",
            "dev",
            &net.host_if,
            "nodad",
        ],
    )?;
    net.pod.exec(
        "ip",
        &[
            "-6",
            "addr",
            "add",
            "fd00:237::2/64",
            "dev",
            "eth0",
            "nodad",
        ],
    )?;
    let host_mac = net
        .node
        .exec("cat", &[&format!("/sys/class/net/{}/address", net.host_if)])?;
    net.pod.exec(
        "ip",
        &[
            "-6",
            "neigh",
            "replace",
            "fd00:237::1",
            "lladdr",
            host_mac.trim(),
            "dev",
            "eth0",
            "nud",
            "permanent",
        ],
    )?;
    net.pod.exec(
        "ip",
        &["-6", "route", "add", "default", "via", "fd00:237::1"],
    )?;
    let ifindex = net.host_ifindex()?;
    let mut w = Watch::new(&net.node, &bpffs, &[ifindex])?;

    let f = Flow {
        ifindex,
        src: "[fd00:237::2]:40005".parse()?,
        dst: "[2001:db8:99::7]:53".parse()?,
        proto: PROTO_UDP,
    };
    udp(&net.pod, f.src, f.dst)?;
    w.one(&f, "IP_INNOROUTES", 1)?;
    Ok(())
}

/// A route through the watched veth to an address nobody answers ARP for:
/// the packets queued for the neighbour are dropped when it fails.
#[test]
fn neighbour_failure_is_reported() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let bpffs = BpfFs::new()?;
    let net = VethPair::new("10.238.0.1", "10.238.0.2")?;
    net.pin_neighbours("10.238.0.1", "10.238.0.2")?;
    sysctl(&net.node, "net.ipv4.ip_forward", "1")?;
    // One solicitation, 100 ms: the neighbour fails fast.
    for (k, v) in [
        ("mcast_solicit", "1"),
        ("ucast_solicit", "0"),
        ("app_solicit", "0"),
        ("retrans_time_ms", "100"),
    ] {
        sysctl(&net.node, &format!("net.ipv4.neigh.{}.{k}", net.host_if), v)?;
    }
    net.node.exec(
        "ip",
        &["route", "add", "10.238.9.0/24", "dev", &net.host_if],
    )?;
    net.pod
        .exec("ip", &["route", "add", "default", "via", "10.238.0.1"])?;
    let ifindex = net.host_ifindex()?;
    let mut w = Watch::new(&net.node, &bpffs, &[ifindex])?;

    let f = Flow {
        ifindex,
        src: "10.238.0.2:40006".parse()?,
        dst: "10.238.9.9:53".parse()?,
        proto: PROTO_UDP,
    };
    udp(&net.pod, f.src, f.dst)?;
    w.one(&f, "NEIGH_FAILED", 1)?;
    Ok(())
}

/// Multicast nobody on the node listens to (what the kernel frees as
/// NOT_SPECIFIED): a pod's mDNS, its IPv6 neighbour discovery and MLD at
/// link-up. Not reported; the watch is live meanwhile (a spoofed unicast
/// packet is).
#[test]
fn multicast_without_listeners_is_not_reported() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let bpffs = BpfFs::new()?;
    let net = VethPair::new("10.239.0.1", "10.239.0.2")?;
    net.pin_neighbours("10.239.0.1", "10.239.0.2")?;
    rp_filter(&net.node, &net.host_if)?;
    let ifindex = net.host_ifindex()?;
    let mut w = Watch::new(&net.node, &bpffs, &[ifindex])?;
    net.pod
        .exec("ip", &["route", "add", "224.0.0.0/4", "dev", "eth0"])?;
    let mdns = Flow {
        ifindex,
        src: "10.239.0.2:5353".parse()?,
        dst: "224.0.0.251:5353".parse()?,
        proto: PROTO_UDP,
    };
    udp(&net.pod, mdns.src, mdns.dst)?;
    // The pod's IPv6 link-up: DAD, MLD reports, router solicitations.
    net.pod.exec("ip", &["link", "set", "eth0", "down"])?;
    net.pod.exec("ip", &["link", "set", "eth0", "up"])?;
    std::thread::sleep(Duration::from_millis(2500));
    w.none(&mdns, "mDNS")?;
    ensure!(w.seen.is_empty(), "reported: {}", w.show(&w.seen.clone()));

    // Link down flushed the pod's neighbours: pinned again, as the node
    // answers no ARP from a spoofed source.
    net.pin_neighbours("10.239.0.1", "10.239.0.2")?;
    net.pod
        .exec("ip", &["addr", "add", "10.77.7.10/32", "dev", "eth0"])?;
    let spoofed = Flow {
        ifindex,
        src: "10.77.7.10:5353".parse()?,
        dst: "10.239.0.1:5353".parse()?,
        proto: PROTO_UDP,
    };
    udp(&net.pod, spoofed.src, spoofed.dst)?;
    w.one(&spoofed, "IP_RPFILTER", 1)?;
    Ok(())
}

/// A TCP packet conntrack calls INVALID (SYN and FIN together), dropped by
/// a rule in FORWARD as kube-proxy drops INVALID.
#[test]
fn conntrack_invalid_dropped_by_a_rule_is_reported() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let bpffs = BpfFs::new()?;
    let net = VethPair::new("10.233.0.1", "10.233.0.2")?;
    net.pin_neighbours("10.233.0.1", "10.233.0.2")?;
    sysctl(&net.node, "net.ipv4.ip_forward", "1")?;
    // A way out for 203.0.113.0/24 (a veth: no dummy module everywhere).
    net.node.exec(
        "ip",
        &["link", "add", "kd0", "type", "veth", "peer", "name", "kd1"],
    )?;
    net.node.exec("ip", &["link", "set", "kd0", "up"])?;
    net.node.exec("ip", &["link", "set", "kd1", "up"])?;
    net.node
        .exec("ip", &["route", "add", "203.0.113.0/24", "dev", "kd0"])?;
    nft(
        &net.node,
        "table inet mycni_kdrop_test {
            chain forward {
                type filter hook forward priority filter; policy accept;
                ct state invalid drop
            }
        }",
    )?;
    net.pod
        .exec("ip", &["route", "add", "default", "via", "10.233.0.1"])?;
    let ifindex = net.host_ifindex()?;
    let mut w = Watch::new(&net.node, &bpffs, &[ifindex])?;

    let f = Flow {
        ifindex,
        src: "10.233.0.2:40003".parse()?,
        dst: "203.0.113.5:80".parse()?,
        proto: PROTO_TCP,
    };
    const SYN_FIN: u8 = 0x03;
    let (SocketAddr::V4(src), SocketAddr::V4(dst)) = (f.src, f.dst) else {
        bail!("IPv4 only");
    };
    raw_tcp(&net.pod, src, dst, SYN_FIN)?;
    let e = w.one(&f, "NETFILTER_DROP", 1)?;
    ensure!(e.tcp_flags == SYN_FIN, "tcp flags {:#x}", e.tcp_flags);
    Ok(())
}

/// The same drop on an interface the agent does not watch, in the watched
/// namespace and in another namespace on an interface with the watched
/// one's ifindex: nothing. The watched one, as a control: one event.
#[test]
fn drops_on_unwatched_interfaces_are_not_reported() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let bpffs = BpfFs::new()?;
    let net = VethPair::new("10.234.0.1", "10.234.0.2")?;
    net.pin_neighbours("10.234.0.1", "10.234.0.2")?;
    rp_filter(&net.node, &net.host_if)?;
    let watched = net.host_ifindex()?;

    // A second pod on the same node, not watched.
    let pod2 = NetNs::new("pod")?;
    let veth2 = unique("vh");
    add_pod(&net.node, &pod2, &veth2, "10.234.1.1", "10.234.1.2")?;
    rp_filter(&net.node, &veth2)?;

    // Another node whose pod veth has the watched ifindex.
    let other = NetNs::new("node")?;
    let pod3 = NetNs::new("pod")?;
    let veth3 = unique("vh");
    other.add_veth(&veth3, &pod3, Some(watched))?;
    setup_pod(&other, &pod3, &veth3, "10.234.2.1", "10.234.2.2")?;
    rp_filter(&other, &veth3)?;

    let mut w = Watch::new(&net.node, &bpffs, &[watched])?;
    let spoofed = "10.77.7.8:40004".parse()?;
    for (pod, node_ip, ifindex, what) in [
        (
            &pod2,
            "10.234.1.1",
            ifindex_of(&net.node, &veth2)?,
            "another interface",
        ),
        (
            &pod3,
            "10.234.2.1",
            watched,
            "another namespace, same ifindex",
        ),
    ] {
        pod.exec("ip", &["addr", "add", "10.77.7.8/32", "dev", "eth0"])?;
        let f = Flow {
            ifindex,
            src: spoofed,
            dst: SocketAddr::new(node_ip.parse()?, 9),
            proto: PROTO_UDP,
        };
        udp(pod, f.src, f.dst)?;
        w.none(&f, what)?;
    }
    net.pod
        .exec("ip", &["addr", "add", "10.77.7.8/32", "dev", "eth0"])?;
    let f = Flow {
        ifindex: watched,
        src: spoofed,
        dst: "10.234.0.1:9".parse()?,
        proto: PROTO_UDP,
    };
    udp(&net.pod, f.src, f.dst)?;
    w.one(&f, "IP_RPFILTER", 1)?;
    // Nothing at all from the other two, whatever the tuple: no other
    // ifindex, and nothing to the other namespace's node.
    ensure!(
        w.seen
            .iter()
            .all(|e| e.ifindex == watched && e.dst[..3] != [10, 234, 2]),
        "events from unwatched interfaces: {}",
        w.show(&w.seen.clone())
    );

    // The agent's next pass no longer wants it (the pod went): the entry
    // is removed, and the same drop is no longer reported.
    let (added, removed) = w.dp.sync_kernel_drops(&Default::default())?;
    ensure!((added, removed) == (0, 1), "sync: +{added} -{removed}");
    let again = Flow {
        src: SocketAddr::new(spoofed.ip(), spoofed.port() + 1),
        ..f
    };
    udp(&net.pod, again.src, again.dst)?;
    w.none(&again, "an interface no longer watched")?;
    Ok(())
}

/// The agent's datapath attaches the tracepoint when it loads the fast
/// path, and says so in its metrics; it goes with the datapath.
#[test]
fn the_fast_path_attaches_it_and_says_so() -> Result<()> {
    let _turn = crate::turn(module_path!());
    use mycni_agent::datapath::{DatapathRoom, Mode};
    use mycni_agent::metrics::{Format, Metrics};
    use std::sync::Arc;

    let object = embedded_object().context("agent built without eBPF object")?;
    let bpffs = BpfFs::new()?;
    let proc_sys = tempfile::tempdir()?;
    let metrics = Arc::new(Metrics::default());
    let section = mycni_agent::datapath::Section {
        mode: Mode::Ebpf,
        tc_encap: true,
        log: false,
        pin_dir: bpffs.path().to_path_buf(),
        proc_sys: proc_sys.path().to_path_buf(),
    };
    let fp = DatapathRoom::start(&section, Some(object), metrics.clone());
    ensure!(fp.active(), "not loaded: {}", fp.describe());
    let text = metrics.render(Format::Prometheus)?;
    ensure!(
        text.lines()
            .any(|l| l == "mycni_flow_kernel_drops_attached 1"),
        "{text}"
    );
    Ok(())
}
