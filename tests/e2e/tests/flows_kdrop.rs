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

const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
/// How long a test waits for the event of a packet it sent (the kernel
/// drops it within microseconds; this is slack for a loaded machine).
const WAIT: Duration = Duration::from_millis(1500);
/// How long it listens for events that must not come.
const QUIET: Duration = Duration::from_millis(400);

/// The loaded object, the tracepoint attached, watching some interfaces of
/// one namespace, and its ring.
struct Watch {
    /// Kept: dropping it detaches the tracepoint.
    dp: Datapath,
    ring: RingBuf<MapData>,
    names: DropReasons,
    /// Every event read so far, for failure messages.
    seen: Vec<FlowEvent>,
}

impl Watch {
    /// Loads the object in `node` and watches `ifindexes` there.
    fn new(node: &NetNs, bpffs: &BpfFs, ifindexes: &[u32]) -> Result<Self> {
        let object = embedded_object().ok_or_else(|| {
            anyhow::anyhow!(
                "agent built without eBPF object: run `cargo xtask build-ebpf --release` first"
            )
        })?;
        let (dp, ring) = node.run_in(|| -> Result<_> {
            let mut dp = Datapath::load(object, bpffs.path())?;
            dp.attach_kernel_drops()?;
            ensure!(dp.kernel_drops_attached());
            let netns = current_netns()?;
            let want = ifindexes
                .iter()
                .map(|&ifindex| DropIface { ifindex, netns })
                .collect();
            dp.sync_kernel_drops(&want)?;
            let ring = dp
                .take_flow_ring()
                .context("no flow ring in the object")??;
            Ok((dp, ring))
        })??;
        Ok(Self {
            dp,
            ring,
            names: DropReasons::from_kernel()?,
            seen: vec![],
        })
    }

    /// The events of the flow `f` that arrive within `wait`, returning as
    /// soon as `want` have arrived (and then listening `QUIET` longer, so
    /// an extra one is caught too).
    fn events(&mut self, f: &Flow, want: usize, wait: Duration) -> Vec<FlowEvent> {
        let start = Instant::now();
        let mut got: Vec<FlowEvent> = vec![];
        let mut until = start + wait;
        while Instant::now() < until {
            while let Some(item) = self.ring.next() {
                assert!(item.len() >= size_of::<FlowEvent>(), "short event");
                // SAFETY: the ring holds FlowEvents (checked length);
                // unaligned read of plain data.
                let e: FlowEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
                self.seen.push(e);
                if f.matches(&e) {
                    got.push(e);
                    if got.len() == want {
                        until = until.min(Instant::now() + QUIET);
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        got
    }

    /// The one event the flow's next packet gives, checked against it.
    fn one(&mut self, f: &Flow, reason: &str, count: u32) -> Result<FlowEvent> {
        let got = self.events(f, 1, WAIT);
        let [e] = got[..] else {
            bail!(
                "{} events for {f:?}, want 1 ({reason}): {}\nall events: {}",
                got.len(),
                self.show(&got),
                self.show(&self.seen.clone())
            );
        };
        let name = self.names.name(e.reason);
        ensure!(
            name == reason,
            "reason {name}, want {reason}: {}",
            self.show(&[e])
        );
        ensure!(e.count == count, "count {}, want {count}", e.count);
        ensure!(e.kind == FLOW_DROP && e.source == FlowSource::KernelDrop as u8);
        eprintln!("event: {}", self.show(&[e]));
        Ok(e)
    }

    fn none(&mut self, f: &Flow, what: &str) -> Result<()> {
        let got = self.events(f, 0, QUIET);
        ensure!(got.is_empty(), "{what}: unexpected {}", self.show(&got));
        Ok(())
    }

    fn show(&self, es: &[FlowEvent]) -> String {
        es.iter()
            .map(|e| {
                format!(
                    "[{} if{} {} -> {} proto {} flags {:#x} x{}]",
                    self.names.name(e.reason),
                    e.ifindex,
                    SocketAddr::new(event_ip(e.family, e.src), e.sport),
                    SocketAddr::new(event_ip(e.family, e.dst), e.dport),
                    e.proto,
                    e.tcp_flags,
                    e.count
                )
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The 5-tuple and interface an event must carry.
#[derive(Debug, Clone, Copy)]
struct Flow {
    ifindex: u32,
    src: SocketAddr,
    dst: SocketAddr,
    proto: u8,
}

impl Flow {
    fn matches(&self, e: &FlowEvent) -> bool {
        let family = if self.src.is_ipv4() { 4 } else { 6 };
        e.family == family
            && e.ifindex == self.ifindex
            && e.src == ip_bytes(self.src.ip())
            && e.dst == ip_bytes(self.dst.ip())
            && e.sport == self.src.port()
            && e.dport == self.dst.port()
            && e.proto == self.proto
    }
}

/// An address as `FlowEvent` holds it: IPv4 in the first 4 bytes.
fn ip_bytes(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(a) => {
            let mut b = [0; 16];
            b[..4].copy_from_slice(&a.octets());
            b
        }
        IpAddr::V6(a) => a.octets(),
    }
}

fn event_ip(family: u8, b: [u8; 16]) -> IpAddr {
    if family == 6 {
        Ipv6Addr::from(b).into()
    } else {
        Ipv4Addr::new(b[0], b[1], b[2], b[3]).into()
    }
}

fn sysctl(ns: &NetNs, key: &str, value: &str) -> Result<()> {
    ns.exec("sysctl", &["-qw", &format!("{key}={value}")])
        .map(drop)
}

/// One UDP datagram from `src` (an address the pod has) to `dst`.
fn udp(pod: &NetNs, src: SocketAddr, dst: SocketAddr) -> Result<()> {
    pod.run_in(|| -> Result<()> {
        let s = UdpSocket::bind(src).with_context(|| format!("bind {src}"))?;
        s.send_to(b"kdrop", dst)
            .with_context(|| format!("send to {dst}"))?;
        Ok(())
    })?
}

/// Strict reverse-path filtering on the node: its answer to a source
/// address must leave by the interface the packet came in on.
fn rp_filter(node: &NetNs, dev: &str) -> Result<()> {
    sysctl(node, "net.ipv4.conf.all.rp_filter", "1")?;
    sysctl(node, &format!("net.ipv4.conf.{dev}.rp_filter"), "1")
}

/// A pod that sends as an address that is not its own: the node has no
/// route back to it through the pod's veth (IPv4 anti-spoofing).
#[test]
fn reverse_path_filter_drop_is_reported_once_a_second_with_its_count() -> Result<()> {
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
    udp(&net.pod, f.src, f.dst)?;
    let first = Instant::now();
    w.one(&f, "IP_RPFILTER", 1)?;

    // Within the second: folded, no event, counted as suppressed.
    let before = w.dp.flow_stats()?[FLOW_STAT_SUPPRESSED as usize];
    udp(&net.pod, f.src, f.dst)?;
    w.none(&f, "a repeat within a second")?;
    let after = w.dp.flow_stats()?;
    ensure!(
        after[FLOW_STAT_SUPPRESSED as usize] > before,
        "suppressed {before} -> {after:?}"
    );
    ensure!(after[FLOW_STAT_EMITTED as usize] >= 1 && after[FLOW_STAT_LOST as usize] == 0);

    // After it: one event standing for both.
    std::thread::sleep(Duration::from_millis(1100).saturating_sub(first.elapsed()));
    udp(&net.pod, f.src, f.dst)?;
    w.one(&f, "IP_RPFILTER", 2)?;
    Ok(())
}

/// A pod sends to an address the node has no route to, while forwarding.
#[test]
fn no_route_drop_is_reported() -> Result<()> {
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
    other.exec(
        "ip",
        &[
            "link",
            "add",
            &veth3,
            "index",
            &watched.to_string(),
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            pod3.name(),
        ],
    )?;
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
    Ok(())
}

/// The agent's datapath attaches the tracepoint when it loads the fast
/// path, and says so in its metrics; it goes with the datapath.
#[test]
fn the_fast_path_attaches_it_and_says_so() -> Result<()> {
    use mycni_agent::datapath::{FastPath, Mode};
    use mycni_agent::metrics::{Format, Metrics};
    use std::sync::Arc;

    let object = embedded_object().context("agent built without eBPF object")?;
    let bpffs = BpfFs::new()?;
    let proc_sys = tempfile::tempdir()?;
    let metrics = Arc::new(Metrics::default());
    let fp = FastPath::start(
        Mode::Ebpf,
        true,
        Some(object),
        false,
        bpffs.path(),
        proc_sys.path(),
        metrics.clone(),
    );
    ensure!(fp.active(), "not loaded: {}", fp.describe());
    let text = metrics.render(Format::Prometheus)?;
    ensure!(
        text.lines()
            .any(|l| l == "mycni_flow_kernel_drops_attached 1"),
        "{text}"
    );
    Ok(())
}

/// The tracepoint's cost per call (the kernel's BPF run-time statistics,
/// turned on for the measurement) on three paths: drops on an interface
/// nobody watches (the filter every other drop of the machine takes),
/// repeats of one watched flow (folded), and distinct watched flows (one
/// event each). Run by hand: `-- --ignored --nocapture`.
#[test]
#[ignore = "a measurement, not a check"]
fn cost_of_the_tracepoint() -> Result<()> {
    let bpffs = BpfFs::new()?;
    let net = VethPair::new("10.235.0.1", "10.235.0.2")?;
    net.pin_neighbours("10.235.0.1", "10.235.0.2")?;
    rp_filter(&net.node, &net.host_if)?;
    net.pod
        .exec("ip", &["addr", "add", "10.77.7.9/32", "dev", "eth0"])?;
    let ifindex = net.host_ifindex()?;
    let mut w = Watch::new(&net.node, &bpffs, &[ifindex])?;
    let prev = std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled")?;
    std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "1")?;
    let r = (|| -> Result<()> {
        let dst: SocketAddr = "10.235.0.1:9".parse()?;
        let lo = |port| SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port);
        let spoofed = |port| SocketAddr::new([10, 77, 7, 9].into(), port);
        let phases: [(&str, &PacketOf<'_>); 3] = [
            // A closed port on the pod's loopback: NO_SOCKET on `lo`.
            ("unwatched (lo, NO_SOCKET)", &|_| (lo(40000), lo(9))),
            ("watched, one flow (folded)", &|_| (spoofed(40000), dst)),
            ("watched, distinct flows (an event each)", &|i| {
                (spoofed(20000 + i), dst)
            }),
        ];
        // What the rest of the machine frees with a reason meanwhile.
        let idle = Duration::from_secs(10);
        let before = prog_stats()?;
        std::thread::sleep(idle);
        let after = prog_stats()?;
        eprintln!(
            "idle: {} runs in {idle:?} (every kfree_skb of the kernel), {:.0} ns a run",
            after.0 - before.0,
            (after.1 - before.1) as f64 / (after.0 - before.0).max(1) as f64
        );
        let n: u16 = 20_000;
        for (what, flow) in &phases {
            let before = prog_stats()?;
            net.pod.run_in(|| -> Result<()> {
                for i in 0..n {
                    let (src, to) = flow(i);
                    let s = UdpSocket::bind(src)?;
                    // A closed port answers with ICMP, which the next
                    // send may report as an error: not ours to count.
                    let _ = s.send_to(b"kdrop", to);
                }
                Ok(())
            })??;
            std::thread::sleep(Duration::from_millis(200));
            let after = prog_stats()?;
            let (runs, ns) = (after.0 - before.0, after.1 - before.1);
            let events = w.events(
                &Flow {
                    ifindex: 0,
                    src: dst,
                    dst,
                    proto: 0,
                },
                usize::MAX,
                QUIET,
            );
            ensure!(events.is_empty(), "no event has ifindex 0");
            let read = w.seen.len();
            eprintln!(
                "{what}: {n} packets, {runs} runs, {:.0} ns a run, {read} events read; \
                 stats so far (emitted, lost, suppressed): {:?}; first: {}",
                ns as f64 / runs.max(1) as f64,
                w.dp.flow_stats()?,
                w.show(&w.seen[..read.min(3)])
            );
            w.seen.clear();
        }
        Ok(())
    })();
    std::fs::write("/proc/sys/kernel/bpf_stats_enabled", prev.trim())?;
    r
}

/// Packet `i`'s source and destination.
type PacketOf<'a> = dyn Fn(u16) -> (SocketAddr, SocketAddr) + Sync + 'a;

/// (run_cnt, run_time_ns) of the newest `mycni_kfree_skb` on the kernel:
/// this test's (it loads last).
fn prog_stats() -> Result<(u64, u64)> {
    let out = mycni_testkit::sh(
        "bpftool",
        &["-j", "prog", "show", "name", "mycni_kfree_skb"],
    )?;
    // One object per program, or a list: take the highest id.
    let v: serde_json::Value = serde_json::from_str(&out)?;
    let progs = match v {
        serde_json::Value::Array(a) => a,
        o => vec![o],
    };
    let p = progs
        .iter()
        .max_by_key(|p| p["id"].as_u64())
        .context("no mycni_kfree_skb loaded")?;
    Ok((
        p["run_cnt"].as_u64().unwrap_or(0),
        p["run_time_ns"].as_u64().unwrap_or(0),
    ))
}

/// A veth from `node` into `pod` (named eth0 there), addressed and up.
fn add_pod(node: &NetNs, pod: &NetNs, veth: &str, node_ip: &str, pod_ip: &str) -> Result<()> {
    node.exec(
        "ip",
        &[
            "link",
            "add",
            veth,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            pod.name(),
        ],
    )?;
    setup_pod(node, pod, veth, node_ip, pod_ip)
}

/// Addresses, links up, and permanent neighbours both ways (no ARP).
fn setup_pod(node: &NetNs, pod: &NetNs, veth: &str, node_ip: &str, pod_ip: &str) -> Result<()> {
    node.exec(
        "ip",
        &["addr", "add", &format!("{node_ip}/24"), "dev", veth],
    )?;
    node.exec("ip", &["link", "set", veth, "up"])?;
    pod.exec(
        "ip",
        &["addr", "add", &format!("{pod_ip}/24"), "dev", "eth0"],
    )?;
    pod.exec("ip", &["link", "set", "eth0", "up"])?;
    let host_mac = node.exec("cat", &[&format!("/sys/class/net/{veth}/address")])?;
    pod.exec(
        "ip",
        &[
            "neigh",
            "replace",
            node_ip,
            "lladdr",
            host_mac.trim(),
            "dev",
            "eth0",
            "nud",
            "permanent",
        ],
    )?;
    Ok(())
}

fn ifindex_of(ns: &NetNs, dev: &str) -> Result<u32> {
    ns.exec("cat", &[&format!("/sys/class/net/{dev}/ifindex")])?
        .trim()
        .parse()
        .context("parse ifindex")
}

/// Loads an nftables ruleset into `ns`.
fn nft(ns: &NetNs, ruleset: &str) -> Result<()> {
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(file.path(), ruleset)?;
    ns.exec("nft", &["-f", &file.path().to_string_lossy()])
        .map(drop)
}

/// One TCP segment with `flags` and no payload, from `src` to `dst`,
/// written whole (IP header included) on a raw socket in `pod`: no TCP
/// stack would send SYN and FIN together.
fn raw_tcp(pod: &NetNs, src: SocketAddrV4, dst: SocketAddrV4, flags: u8) -> Result<()> {
    let mut tcp = [0u8; 20];
    tcp[0..2].copy_from_slice(&src.port().to_be_bytes());
    tcp[2..4].copy_from_slice(&dst.port().to_be_bytes());
    tcp[4..8].copy_from_slice(&0x1234_5678u32.to_be_bytes());
    tcp[12] = 5 << 4;
    tcp[13] = flags;
    tcp[14..16].copy_from_slice(&64240u16.to_be_bytes());
    let mut pseudo = Vec::with_capacity(32);
    pseudo.extend_from_slice(&src.ip().octets());
    pseudo.extend_from_slice(&dst.ip().octets());
    pseudo.extend_from_slice(&[0, PROTO_TCP, 0, 20]);
    pseudo.extend_from_slice(&tcp);
    tcp[16..18].copy_from_slice(&csum(&pseudo).to_be_bytes());
    let mut ip = vec![0x45, 0, 0, 40, 0x12, 0x34, 0x40, 0, 64, PROTO_TCP, 0, 0];
    ip.extend_from_slice(&src.ip().octets());
    ip.extend_from_slice(&dst.ip().octets());
    let c = csum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    ip.extend_from_slice(&tcp);
    pod.run_in(|| -> Result<()> {
        // SAFETY: plain socket(2); the fd is owned right after.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
        ensure!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
        // SAFETY: a fresh fd nobody else owns.
        let _sock = unsafe { OwnedFd::from_raw_fd(fd) };
        let to = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(dst.ip().octets()),
            },
            sin_zero: [0; 8],
        };
        // SAFETY: `ip` and `to` are valid for the lengths given.
        let n = unsafe {
            libc::sendto(
                fd,
                ip.as_ptr().cast(),
                ip.len(),
                0,
                std::ptr::from_ref(&to).cast(),
                size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        ensure!(
            n == ip.len() as isize,
            "sendto: {}",
            std::io::Error::last_os_error()
        );
        Ok(())
    })?
}

/// Ones' complement sum, folded and inverted (RFC 1071).
fn csum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}
