//! The tc programs of `mycni-ebpf`, verdict by verdict: the real kernel runs
//! the real verified object (`BPF_PROG_TEST_RUN`) on packets made here, and
//! every case checks the verdict, the packet the program hands back and that
//! exactly one counter moved, by one packet and the packet's length, in
//! the row of the packet's address family.
//!
//! Each test gets its own network namespace and bpffs. `BPF_PROG_TEST_RUN`
//! builds the skb in the calling thread's namespace, so the program's
//! conntrack lookup sees that namespace's table; the "established" flows are
//! therefore real connections opened there over loopback (conntrack made
//! active by an nftables rule), and the packets under test carry their exact
//! tuples.
//!
//! Topology the maps describe: this node holds pods A (10.244.1.5) and B
//! (10.244.1.9); a peer node holds 10.244.2.0/24, with pod R (10.244.2.7).
//! All three addresses live on the namespace's loopback so real flows
//! between them exist. The same for IPv6 (`ipv6`): A fd00:10:244:1::5,
//! B fd00:10:244:1::9, the peer's fd00:10:244:2::/64 with R
//! fd00:10:244:2::7, carried over the same IPv4 underlay.
//!
//! The topology and the maps are here; the node and its programs in
//! `node`, the packets in `frames`, the real flows in `flows`, and the cases
//! in `fast_path` (the kernel's fast path and what it leaves alone),
//! `encap` (datapath v2: encapsulation and decapsulation in tc), `ipv6`
//! and `vxlan6` (the peer's IPv6 pods over an IPv6 underlay, through
//! `vxlan6.1`), and `flow_events` (the events the programs write into
//! `mycni_flows`) with `flow_cost` (what they cost).

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path as FsPath;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use mycni_agent::datapath::{
    Datapath, LOCAL, Prog, REMOTE, embedded_object, read_counters, read_family_counters,
    write_config, write_policy_epoch,
};
use mycni_agent::datapath::{LOCAL6, PEERS, REMOTE6};
use mycni_common::{
    CFG_TC_DECAP, CFG_TC_ENCAP, DpConfig, DpFamily, DpPath, LocalEndpoint, POLICY_EPOCH_MAX,
    PathCounter, PeerNode, RemoteNode, TCX_NEXT,
};
use mycni_testkit::testrun::{Outcome, run_skb_from};
use mycni_testkit::{BpfFs, NetNs};

mod encap;
mod fast_path;
mod flow_cost;
mod flow_events;
mod flows;
mod frames;
mod ipv6;
mod node;
mod vxlan6;

use flows::*;
use frames::*;
use node::*;

const TC_ACT_REDIRECT: i32 = 7;

const POD_A: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 5);
const POD_B: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 9);
const POD_R: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 7);
const POD_A6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x244, 1, 0, 0, 0, 5);
const POD_B6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x244, 1, 0, 0, 0, 9);
const POD_R6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x244, 2, 0, 0, 0, 7);
/// In no map: neither a pod here nor in a peer's podCIDR.
const UNKNOWN: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
/// Service IPs, DNATed (in the namespace's OUTPUT hook) to pods R and B.
const SVC_TO_R: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const SVC_TO_B: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 11);
const SERVER_PORT: u16 = 7777;

const VXLAN_IFINDEX: u32 = 1000;
const VXLAN_PORT: u16 = 8472;
/// The underlay: this node's host IP, the peer's (as in [`remote_map`]) and
/// a host on the same segment that is no peer.
const UL_HOST: Ipv4Addr = Ipv4Addr::new(192, 168, 0, 1);
const UL_PEER: Ipv4Addr = Ipv4Addr::new(192, 168, 0, 2);
const UL_STRANGER: Ipv4Addr = Ipv4Addr::new(192, 168, 0, 3);
const UL_PEER_MAC: [u8; 6] = [0x02, 0x55, 0x00, 0x00, 0x00, 0x02];
const VTEP_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x01, 0x01];
const PEER_VTEP_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x02, 0x01];
/// The IPv6 underlay (see [`Node::with_underlay6`]): this node's IPv6 host
/// address, the peer's, both `vxlan6.1` MACs and that device's MTU (a
/// 1500-byte underlay less the 70 bytes of VXLAN over IPv6).
const UL6_HOST: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x77, 0, 0, 0, 0, 0, 1);
const UL6_PEER: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x77, 0, 0, 0, 0, 0, 2);
const VTEP6_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x61, 0x01];
const PEER_VTEP6_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x62, 0x01];
const VXLAN6_MTU: u32 = 1430;
const POD_A_MAC: [u8; 6] = [0x02, 0xaa, 0x00, 0x00, 0x00, 0x05];
const HOST_A_MAC: [u8; 6] = [0x02, 0xee, 0x00, 0x00, 0x00, 0x05];
const POD_B_MAC: [u8; 6] = [0x02, 0xaa, 0x00, 0x00, 0x00, 0x09];
const HOST_B_MAC: [u8; 6] = [0x02, 0xee, 0x00, 0x00, 0x00, 0x09];

const ETH_P_IP: u16 = 0x0800;
const ETH_P_ARP: u16 = 0x0806;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const IPPROTO_ICMP: u8 = 1;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const FIN: u8 = 0x01;
const SYN: u8 = 0x02;
const RST: u8 = 0x04;
const PSH: u8 = 0x08;
const ACK: u8 = 0x10;
/// Offsets in an Ethernet frame carrying IPv4.
const IP: usize = 14;
const TTL: usize = IP + 8;
const CSUM: usize = IP + 10;

/// The host veth a frame arrives on, as the kernel sets it at tc ingress:
/// for from_pod, the veth of the pod whose address is the frame's IPv4
/// source (A: 101, B: 102; anything else: 0, which no pod owns); for
/// from_vxlan, irrelevant (0).
fn ingress_of(prog: Prog, pkt: &[u8]) -> u32 {
    if prog != Prog::FromPod {
        return 0;
    }
    if pkt.len() >= 38 && pkt[12..14] == ETH_P_IPV6.to_be_bytes() {
        let mut src = [0u8; 16];
        src.copy_from_slice(&pkt[22..38]);
        return match Ipv6Addr::from(src) {
            ip if ip == POD_A6 => 101,
            ip if ip == POD_B6 => 102,
            _ => 0,
        };
    }
    if pkt.len() < 30 || pkt[12..14] != ETH_P_IP.to_be_bytes() {
        return 0;
    }
    match Ipv4Addr::new(pkt[26], pkt[27], pkt[28], pkt[29]) {
        ip if ip == POD_A => 101,
        ip if ip == POD_B => 102,
        _ => 0,
    }
}

fn config() -> DpConfig {
    DpConfig {
        vxlan_ifindex: VXLAN_IFINDEX,
        tcp_timeout_ms: 432_000_000,
        udp_timeout_ms: 120_000,
        vtep_mac: VTEP_MAC,
        _pad: [0; 2],
        underlay_ifindex: 0,
        host_ip: 0,
        vni: 1,
        vxlan_port: VXLAN_PORT,
        port_min: 32768,
        port_max: 60999,
        ttl: 64,
        flags: 0,
        vxlan6_ifindex: 0,
        vtep6_mac: [0; 6],
        _pad6: [0; 2],
    }
}

/// [`config`] with encapsulation and decapsulation in tc, out of and into
/// `ul0` (see [`Node::with_underlay`]).
fn encap_config() -> Result<DpConfig> {
    let ul0 = ifindex("ul0")?;
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")?;
    let mut it = range.split_whitespace().map(str::parse::<u16>);
    let (Some(Ok(port_min)), Some(Ok(port_max))) = (it.next(), it.next()) else {
        bail!("cannot parse ip_local_port_range {range:?}");
    };
    Ok(DpConfig {
        underlay_ifindex: ul0,
        host_ip: u32::from_ne_bytes(UL_HOST.octets()),
        port_min,
        port_max,
        flags: CFG_TC_ENCAP | CFG_TC_DECAP,
        ..config()
    })
}

fn ifindex(name: &str) -> Result<u32> {
    let c = std::ffi::CString::new(name)?;
    // SAFETY: a NUL-terminated name; the call only reads it.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    ensure!(i != 0, "no interface {name}");
    Ok(i)
}

fn remote_map() -> BTreeMap<(Ipv4Addr, u8), RemoteNode> {
    let peer = RemoteNode {
        vtep_mac: PEER_VTEP_MAC,
        flags: 0,
        _pad: 0,
        host_ip: u32::from_ne_bytes(UL_PEER.octets()),
    };
    BTreeMap::from([((Ipv4Addr::new(10, 244, 2, 0), 24), peer)])
}

fn remote6_map() -> BTreeMap<(Ipv6Addr, u8), RemoteNode> {
    let peer = remote_map().into_values().next().unwrap_or_default();
    BTreeMap::from([(
        (Ipv6Addr::new(0xfd00, 0x10, 0x244, 2, 0, 0, 0, 0), 64),
        peer,
    )])
}

/// The pods of [`local_map`], by their IPv6 addresses.
fn local6_map() -> BTreeMap<Ipv6Addr, LocalEndpoint> {
    let v4 = local_map();
    BTreeMap::from([(POD_A6, v4[&POD_A]), (POD_B6, v4[&POD_B])])
}

fn local_map() -> BTreeMap<Ipv4Addr, LocalEndpoint> {
    BTreeMap::from([
        (
            POD_A,
            LocalEndpoint {
                ifindex: 101,
                pod_mac: POD_A_MAC,
                host_mac: HOST_A_MAC,
            },
        ),
        (
            POD_B,
            LocalEndpoint {
                ifindex: 102,
                pod_mac: POD_B_MAC,
                host_mac: HOST_B_MAC,
            },
        ),
    ])
}

/// Shorthands of the cases: the MACs a forwarded frame gets, the programs.
const TO_PEER: ([u8; 6], [u8; 6]) = (PEER_VTEP_MAC, VTEP_MAC);
const TO_A: ([u8; 6], [u8; 6]) = (POD_A_MAC, HOST_A_MAC);
const TO_B: ([u8; 6], [u8; 6]) = (POD_B_MAC, HOST_B_MAC);
const POD: Prog = Prog::FromPod;
const VX: Prog = Prog::FromVxlan;
const UL: Prog = Prog::FromUnderlay;

type FastCase = (&'static str, Prog, Vec<u8>, DpPath, ([u8; 6], [u8; 6]));
type KernelCase = (&'static str, Prog, Vec<u8>, DpPath);
