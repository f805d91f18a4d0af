//! IPv6 pods through the fast path in the real kernel, two nodes, no agent
//! (issue 14). Each node is a network namespace with the IPv4 underlay
//! (`ul0`, a veth between the two), `vxlan.1` as the agent creates it, the
//! IPv6 peer state the agent programs (`podCIDRv6 via <peer VTEP v6> dev
//! vxlan.1 onlink`, a permanent neighbour to the peer's VTEP MAC, the FDB
//! entry) and pods as the plugin makes them (an IPv6 /128 on eth0, `default
//! via fe80::1` with a permanent neighbour, a /128 host route with protocol
//! 109). The programs are loaded, their maps filled and attached as the
//! agent's fast path does. Then real TCP streams between pods must arrive
//! intact, their established packets counted on the fast path (encapsulated
//! and decapsulated in tc, or delivered within a node) and their SYN and FIN
//! on the kernel's.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV6, TcpListener, TcpStream};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use mycni_agent::datapath::{
    Datapath, LOCAL6, PEERS, Prog, REMOTE6, embedded_object, read_counters, write_config,
};
use mycni_common::net::Mac;
use mycni_common::{
    CFG_TC_DECAP, CFG_TC_ENCAP, DpConfig, DpPath, LocalEndpoint, PeerNode, RemoteNode,
};
use mycni_testkit::{BpfFs, NetNs, sh};

const PORT: u16 = 7777;

struct Pod {
    // Dropped first: the pod's namespace, and its veth with it.
    ns: NetNs,
    ip: Ipv6Addr,
    host_ifindex: u32,
    host_mac: Mac,
    mac: Mac,
}

struct Node {
    pods: Vec<Pod>,
    ns: NetNs,
    bpffs: BpfFs,
    /// 1 or 2: the underlay address 192.168.77.<n> and podCIDR
    /// fd00:10:244:<n>::/64.
    n: u16,
    vtep: Mac,
}

fn host_ip(n: u16) -> Ipv4Addr {
    Ipv4Addr::new(192, 168, 77, n as u8)
}

fn pod_cidr(n: u16) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x10, 0x244, n, 0, 0, 0, 0)
}

fn vtep_mac(n: u16) -> Mac {
    Mac([0x02, 0x00, 0x00, 0x00, n as u8, 0x01])
}

/// `ip` with `args` split on whitespace, in `ns`.
fn ip(ns: &NetNs, args: &str) -> Result<String> {
    let args: Vec<&str> = args.split_whitespace().collect();
    ns.exec("ip", &args)
}

fn sysfs(ns: &NetNs, dev: &str, attr: &str) -> Result<String> {
    Ok(ns
        .exec("cat", &[&format!("/sys/class/net/{dev}/{attr}")])?
        .trim()
        .to_owned())
}

impl Node {
    fn new(n: u16) -> Result<Self> {
        let node = Self {
            pods: vec![],
            ns: NetNs::new(&format!("n6{n}"))?,
            bpffs: BpfFs::new()?,
            n,
            vtep: vtep_mac(n),
        };
        for key in [
            "net.ipv4.ip_forward=1",
            "net.ipv6.conf.all.forwarding=1",
            // What the agent sets for the fast path (fastpath.rs).
            "net.netfilter.nf_conntrack_tcp_be_liberal=1",
        ] {
            node.ns.exec("sysctl", &["-qw", key])?;
        }
        // Any rule on ct state makes conntrack track both families here.
        node.ns.exec(
            "nft",
            &["add table inet mycni_t; \
               add chain inet mycni_t pass { type filter hook forward priority 0; }; \
               add rule inet mycni_t pass ct state established counter accept"],
        )?;
        Ok(node)
    }

    /// The underlay end is up (the veth made by [`underlay`]); `vxlan.1` as
    /// the agent makes it, with its IPv6 VTEP address.
    fn vxlan(&self) -> Result<()> {
        let n = self.n;
        for args in [
            format!("addr add {}/24 dev ul0", host_ip(n)),
            "link set ul0 up".to_owned(),
            format!(
                "link add vxlan.1 address {} type vxlan id 1 dev ul0 local {} dstport 8472 \
                 nolearning noudpcsum",
                self.vtep,
                host_ip(n)
            ),
            "link set vxlan.1 up".to_owned(),
            format!("-6 addr add {}/128 dev vxlan.1 nodad", pod_cidr(n)),
        ] {
            ip(&self.ns, &args)?;
        }
        Ok(())
    }

    /// The agent's state for an IPv6 peer: route, neighbour, FDB entry.
    fn peer(&self, p: u16) -> Result<()> {
        let (gw, mac) = (pod_cidr(p), vtep_mac(p));
        ip(
            &self.ns,
            &format!("-6 route add {gw}/64 via {gw} dev vxlan.1 onlink proto 110"),
        )?;
        ip(
            &self.ns,
            &format!("-6 neigh replace {gw} lladdr {mac} dev vxlan.1 nud permanent"),
        )?;
        self.ns.exec(
            "bridge",
            &[
                "fdb",
                "append",
                &mac.to_string(),
                "dev",
                "vxlan.1",
                "dst",
                &host_ip(p).to_string(),
                "self",
                "permanent",
            ],
        )?;
        Ok(())
    }

    /// A pod as the plugin makes an IPv6 one: fd00:10:244:<n>::<k>.
    fn add_pod(&mut self, k: u16) -> Result<()> {
        let pod_ns = NetNs::new(&format!("p6{}{k}", self.n))?;
        let host = format!("h6{k}");
        sh(
            "ip",
            &[
                "link",
                "add",
                &host,
                "netns",
                self.ns.name(),
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                pod_ns.name(),
            ],
        )?;
        let pod_ip = Ipv6Addr::new(0xfd00, 0x10, 0x244, self.n, 0, 0, 0, k);
        let host_mac: Mac = sysfs(&self.ns, &host, "address")?.parse()?;
        let mac: Mac = sysfs(&pod_ns, "eth0", "address")?.parse()?;
        for args in [
            // The plugin's MTU: the underlay's less the VXLAN overhead.
            "link set eth0 mtu 1450 up".to_owned(),
            format!("-6 addr add {pod_ip}/128 dev eth0 nodad"),
            format!("-6 neigh replace fe80::1 lladdr {host_mac} dev eth0 nud permanent"),
            "-6 route add default via fe80::1 dev eth0".to_owned(),
        ] {
            ip(&pod_ns, &args)?;
        }
        for args in [
            format!("link set {host} mtu 1450 up"),
            format!("-6 route add {pod_ip}/128 dev {host} proto 109"),
            // The node's side of the pod's link, known up front rather than
            // solicited (the host veth's link-local would still be in DAD).
            format!("-6 neigh replace {pod_ip} lladdr {mac} dev {host} nud permanent"),
        ] {
            ip(&self.ns, &args)?;
        }
        let host_ifindex = sysfs(&self.ns, &host, "ifindex")?.parse()?;
        self.pods.push(Pod {
            ns: pod_ns,
            ip: pod_ip,
            host_ifindex,
            host_mac,
            mac,
        });
        Ok(())
    }

    /// Loads the programs, fills their maps as the agent's fast path does
    /// for an IPv6 peer `p`, and attaches them (the links stay pinned).
    fn fast_path(&self, p: u16) -> Result<()> {
        let object = embedded_object().context(
            "agent built without eBPF object: run `cargo xtask build-ebpf --release` first",
        )?;
        let pin = self.bpffs.path();
        let vxlan: u32 = sysfs(&self.ns, "vxlan.1", "ifindex")?.parse()?;
        let ul0: u32 = sysfs(&self.ns, "ul0", "ifindex")?.parse()?;
        let range = self
            .ns
            .exec("cat", &["/proc/sys/net/ipv4/ip_local_port_range"])?;
        let mut it = range.split_whitespace().map(str::parse::<u16>);
        let (Some(Ok(port_min)), Some(Ok(port_max))) = (it.next(), it.next()) else {
            anyhow::bail!("cannot parse ip_local_port_range {range:?}");
        };
        let cfg = DpConfig {
            vxlan_ifindex: vxlan,
            tcp_timeout_ms: 0,
            udp_timeout_ms: 0,
            vtep_mac: self.vtep.0,
            _pad: [0; 2],
            underlay_ifindex: ul0,
            host_ip: u32::from_ne_bytes(host_ip(self.n).octets()),
            vni: 1,
            vxlan_port: 8472,
            port_min,
            port_max,
            ttl: 64,
            flags: CFG_TC_ENCAP | CFG_TC_DECAP,
            vxlan6_ifindex: 0,
            vtep6_mac: [0; 6],
            _pad6: [0; 2],
        };
        let local: BTreeMap<Ipv6Addr, LocalEndpoint> = self
            .pods
            .iter()
            .map(|p| {
                (
                    p.ip,
                    LocalEndpoint {
                        ifindex: p.host_ifindex,
                        pod_mac: p.mac.0,
                        host_mac: p.host_mac.0,
                    },
                )
            })
            .collect();
        let peer = RemoteNode {
            vtep_mac: vtep_mac(p).0,
            flags: 0,
            _pad: 0,
            host_ip: u32::from_ne_bytes(host_ip(p).octets()),
        };
        let pods: Vec<u32> = self.pods.iter().map(|p| p.host_ifindex).collect();
        self.ns.run_in(|| -> Result<()> {
            let mut dp = Datapath::load(object, pin)?;
            write_config(pin, &cfg)?;
            LOCAL6.sync(pin, &local)?;
            REMOTE6.sync(pin, &BTreeMap::from([((pod_cidr(p), 64), peer)]))?;
            let peer_node = PeerNode {
                vtep_mac: vtep_mac(p).0,
                _pad: [0; 2],
            };
            PEERS.sync(pin, &BTreeMap::from([(host_ip(p), peer_node)]))?;
            dp.attach(Prog::FromVxlan, vxlan)?;
            dp.attach(Prog::FromUnderlay, ul0)?;
            for i in &pods {
                dp.attach(Prog::FromPod, *i)?;
            }
            Ok(())
        })??;
        Ok(())
    }

    /// Packets per path, indexed by `DpPath as usize`.
    fn counters(&self) -> Result<Vec<u64>> {
        Ok(read_counters(self.bpffs.path())?
            .into_iter()
            .map(|(_, c)| c.packets)
            .collect())
    }
}

/// Two nodes, two IPv6 pods each, the underlay between them, the fast
/// path on both.
fn two_nodes() -> Result<(Node, Node)> {
    let (mut n1, mut n2) = (Node::new(1)?, Node::new(2)?);
    sh(
        "ip",
        &[
            "link",
            "add",
            "ul0",
            "netns",
            n1.ns.name(),
            "type",
            "veth",
            "peer",
            "name",
            "ul0",
            "netns",
            n2.ns.name(),
        ],
    )?;
    for (node, peer) in [(&mut n1, 2), (&mut n2, 1)] {
        node.vxlan()?;
        node.peer(peer)?;
        node.add_pod(5)?;
        node.add_pod(9)?;
        node.fast_path(peer)?;
    }
    Ok((n1, n2))
}

/// Sends `bytes` from `from` to `to` over TCP and reads them echoed back;
/// both must be intact.
fn echo(from: &Pod, to: &Pod, bytes: usize) -> Result<()> {
    echo_via(from, to, SocketAddrV6::new(to.ip, PORT, 0, 0), bytes)
}

/// [`echo`] to `dst`, which leads to `to` (a Service address, say).
fn echo_via(from: &Pod, to: &Pod, dst: SocketAddrV6, bytes: usize) -> Result<()> {
    let listener = to
        .ns
        .run_in(|| TcpListener::bind(SocketAddrV6::new(to.ip, PORT, 0, 0)))??;
    let server = std::thread::spawn(move || -> Result<()> {
        let (mut s, _) = listener.accept()?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut buf = vec![0u8; 65536];
        loop {
            let n = s.read(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            s.write_all(&buf[..n])?;
        }
    });
    let mut c = from
        .ns
        .run_in(|| TcpStream::connect_timeout(&dst.into(), Duration::from_secs(5)))??;
    c.set_read_timeout(Some(Duration::from_secs(10)))?;
    let data: Vec<u8> = (0..bytes).map(|i| (i * 7 + i / 251) as u8).collect();
    let mut back = vec![0u8; bytes];
    std::thread::scope(|s| -> Result<()> {
        let mut w = c.try_clone()?;
        let writer = s.spawn(move || w.write_all(&data).map(|()| data));
        c.read_exact(&mut back)?;
        let data = writer
            .join()
            .map_err(|_| anyhow::anyhow!("writer panicked"))??;
        ensure!(back == data, "{bytes} bytes came back changed");
        Ok(())
    })?;
    c.shutdown(std::net::Shutdown::Write)?;
    server
        .join()
        .map_err(|_| anyhow::anyhow!("server panicked"))??;
    Ok(())
}

fn delta(after: &[u64], before: &[u64], p: DpPath) -> u64 {
    after[p as usize] - before[p as usize]
}

#[test]
fn ipv6_pods_talk_through_the_fast_path_across_nodes_and_within_one() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let (n1, n2) = two_nodes()?;
    let (b1, b2) = (n1.counters()?, n2.counters()?);
    echo(&n1.pods[0], &n2.pods[0], 4 << 20).context("pod 1a -> pod 2a")?;
    let (a1, a2) = (n1.counters()?, n2.counters()?);
    for (name, after, before) in [("node 1", &a1, &b1), ("node 2", &a2, &b2)] {
        let moved: Vec<String> = DpPath::ALL
            .iter()
            .filter(|p| delta(after, before, **p) > 0)
            .map(|p| format!("{} {}", p.name(), delta(after, before, *p)))
            .collect();
        eprintln!("{name}: {}", moved.join(", "));
        // Both ways: the stream one way, its echo the other.
        ensure!(
            delta(after, before, DpPath::FastEncap) > 0,
            "{name}: nothing encapsulated in tc"
        );
        ensure!(
            delta(after, before, DpPath::FastTcDecap) > 0,
            "{name}: nothing decapsulated in tc"
        );
        // Sized for the pod MTU, nothing needs vxlan.1's fragmentation.
        ensure!(
            delta(after, before, DpPath::FastVxlanMtu) == 0
                && delta(after, before, DpPath::KernelDecapFragment) == 0,
            "{name}: packets over the underlay MTU"
        );
        // The handshake and the close went through conntrack.
        ensure!(
            delta(after, before, DpPath::KernelTcpControl) >= 2,
            "{name}: SYN and FIN not left to the kernel"
        );
    }

    let b1 = n1.counters()?;
    echo(&n1.pods[0], &n1.pods[1], 1 << 20).context("pod 1a -> pod 1b")?;
    let a1 = n1.counters()?;
    ensure!(
        delta(&a1, &b1, DpPath::FastLocal) > 0,
        "node 1: nothing delivered pod to pod by the fast path"
    );
    ensure!(
        delta(&a1, &b1, DpPath::KernelSourceNotPod) == 0,
        "node 1: a pod's own address taken as foreign"
    );
    Ok(())
}

/// kube-proxy's part for an IPv6 Service on `node`: `vip` port 80 DNATed
/// to `backend`:PORT, and INVALID dropped in FORWARD (once).
fn add_service(node: &Node, vip: Ipv6Addr, backend: Ipv6Addr) -> Result<()> {
    let (vip, to) = (vip.to_string(), format!("[{backend}]:{PORT}"));
    node.ns.exec(
        "ip6tables",
        &[
            "-t",
            "nat",
            "-A",
            "PREROUTING",
            "-d",
            &vip,
            "-p",
            "tcp",
            "--dport",
            "80",
            "-j",
            "DNAT",
            "--to-destination",
            &to,
        ],
    )?;
    if !node
        .ns
        .exec("ip6tables", &["-S", "FORWARD"])?
        .contains("INVALID")
    {
        node.ns.exec(
            "ip6tables",
            &[
                "-I",
                "FORWARD",
                "-m",
                "conntrack",
                "--ctstate",
                "INVALID",
                "-j",
                "DROP",
            ],
        )?;
    }
    Ok(())
}

/// Packets the INVALID rule dropped on `node`.
fn invalid_drops(node: &Node) -> Result<u64> {
    Ok(node
        .ns
        .exec("ip6tables", &["-L", "FORWARD", "-v", "-x", "-n"])?
        .lines()
        .filter(|line| line.contains("ctstate INVALID"))
        .filter_map(|line| line.split_whitespace().next()?.parse::<u64>().ok())
        .sum())
}

#[test]
fn ipv6_services_work_with_their_flows_on_the_kernel_path() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let (n1, n2) = two_nodes()?;
    let remote_vip = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x10);
    let local_vip = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x11);
    for node in [&n1, &n2] {
        add_service(node, remote_vip, n2.pods[0].ip)?;
        add_service(node, local_vip, n1.pods[1].ip)?;
    }
    for (what, vip, backend) in [
        ("remote backend", remote_vip, &n2.pods[0]),
        ("same-node backend", local_vip, &n1.pods[1]),
    ] {
        let before = n1.counters()?;
        echo_via(
            &n1.pods[0],
            backend,
            SocketAddrV6::new(vip, 80, 0, 0),
            4 << 20,
        )
        .with_context(|| format!("through the Service ({what})"))?;
        let after = n1.counters()?;
        let nat = delta(&after, &before, DpPath::KernelNat);
        eprintln!(
            "Service {vip} ({what}): node 1 kernel_nat +{nat}, kernel_unknown_dest +{}",
            delta(&after, &before, DpPath::KernelUnknownDest)
        );
        // The backend's replies meet the client node's NATed entry and are
        // left to the kernel to un-NAT; the client's packets, to the
        // Service address, are in no map.
        ensure!(nat > 0, "{what}: replies not left to the kernel");
        ensure!(
            delta(&after, &before, DpPath::KernelUnknownDest) > 0,
            "{what}: packets to the Service address not left to the kernel"
        );
    }
    for (name, node) in [("node 1", &n1), ("node 2", &n2)] {
        ensure!(invalid_drops(node)? == 0, "INVALID drops on {name}");
    }
    Ok(())
}
