//! IPv6 (issue 14): the same programs and the same rules as IPv4, keyed by
//! 16-byte addresses (`mycni_local6`, `mycni_remote6`), carried over the
//! same IPv4 underlay. Real IPv6 flows on the namespace's loopback give
//! conntrack the entries the gate looks up.

use std::net::SocketAddrV6;

use super::encap::{is_vxlan, packet_recv, packet_send, packet_socket};
use super::fast_path::Rng;
use super::*;

const IPPROTO_ICMPV6: u8 = 58;
/// The hop limit in an Ethernet frame carrying IPv6.
const HOP: usize = IP + 7;
const PEER6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x244, 2, 0, 0, 0, 0);
const UNKNOWN6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
const GATEWAY6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);

/// A flow's direction over IPv6.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Flow6 {
    pub(crate) src: SocketAddrV6,
    pub(crate) dst: SocketAddrV6,
}

impl Flow6 {
    pub(crate) fn rev(self) -> Self {
        Self {
            src: self.dst,
            dst: self.src,
        }
    }

    pub(crate) fn with_sport(self, port: u16) -> Self {
        let mut f = self;
        f.src.set_port(port);
        f
    }
}

/// An IPv6 packet: hop limit 64, traffic class 0, no extension header.
fn ipv6(nexthdr: u8, src: Ipv6Addr, dst: Ipv6Addr, payload: &[u8]) -> Vec<u8> {
    let len = u16::try_from(payload.len()).expect("fits");
    let mut p = vec![0x60, 0, 0, 0];
    p.extend_from_slice(&len.to_be_bytes());
    p.extend_from_slice(&[nexthdr, 64]);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(payload);
    p
}

/// The upper-layer checksum over the IPv6 pseudo-header (RFC 8200 8.1).
fn csum6(nexthdr: u8, src: Ipv6Addr, dst: Ipv6Addr, l4: &[u8]) -> u16 {
    let mut buf = Vec::with_capacity(40 + l4.len());
    buf.extend_from_slice(&src.octets());
    buf.extend_from_slice(&dst.octets());
    buf.extend_from_slice(&u32::try_from(l4.len()).expect("fits").to_be_bytes());
    buf.extend_from_slice(&[0, 0, 0, nexthdr]);
    buf.extend_from_slice(l4);
    csum(&buf)
}

pub(crate) fn tcp6(flow: Flow6, flags: u8, payload: &[u8]) -> Vec<u8> {
    let (src, dst) = (*flow.src.ip(), *flow.dst.ip());
    let seg = tcp_segment(flow.src.port(), flow.dst.port(), flags, payload, |seg| {
        csum6(IPPROTO_TCP, src, dst, seg)
    });
    ipv6(IPPROTO_TCP, src, dst, &seg)
}

fn udp6(flow: Flow6, payload: &[u8]) -> Vec<u8> {
    let (src, dst) = (*flow.src.ip(), *flow.dst.ip());
    let d = udp_segment(flow.src.port(), flow.dst.port(), payload, |d| {
        csum6(IPPROTO_UDP, src, dst, d)
    });
    ipv6(IPPROTO_UDP, src, dst, &d)
}

/// An ICMPv6 message of `ty`pe with `body` behind the 4-byte header.
fn icmp6(src: Ipv6Addr, dst: Ipv6Addr, ty: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![ty, 0, 0, 0];
    m.extend_from_slice(body);
    let c = csum6(IPPROTO_ICMPV6, src, dst, &m);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    let mut p = ipv6(IPPROTO_ICMPV6, src, dst, &m);
    // Neighbour discovery is sent with hop limit 255 (RFC 4861 7.1.1).
    p[7] = 255;
    p
}

/// A neighbour solicitation for `target`.
fn ns(src: Ipv6Addr, dst: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
    let mut body = vec![0u8; 4];
    body.extend_from_slice(&target.octets());
    icmp6(src, dst, 135, &body)
}

/// `payload` behind an 8-byte extension header of type `ext` whose next
/// header is TCP: what an IPv6 packet with options or a fragment header
/// looks like.
fn with_ext(ext: u8, flow: Flow6) -> Vec<u8> {
    let tcp = tcp6(flow, ACK, b"ext");
    let mut payload = vec![IPPROTO_TCP, 0, 0, 0, 0, 0, 0, 0];
    payload.extend_from_slice(&tcp[40..]);
    ipv6(ext, *flow.src.ip(), *flow.dst.ip(), &payload)
}

pub(crate) fn from_a6(ip: &[u8]) -> Vec<u8> {
    eth(HOST_A_MAC, POD_A_MAC, ETH_P_IPV6, ip)
}

pub(crate) fn from_b6(ip: &[u8]) -> Vec<u8> {
    eth(HOST_B_MAC, POD_B_MAC, ETH_P_IPV6, ip)
}

/// As `vxlan.1` carries (and decapsulates) it: peer VTEP to this VTEP.
fn from_peer6(ip: &[u8]) -> Vec<u8> {
    eth(VTEP_MAC, PEER_VTEP_MAC, ETH_P_IPV6, ip)
}

pub(crate) fn with_hop(frame: &[u8], hop: u8) -> Vec<u8> {
    let mut f = frame.to_vec();
    f[HOP] = hop;
    f
}

/// `frame` as a router forwards it: new MACs (dst, src), hop limit one
/// less; IPv6 has no header checksum and the hop limit is in no
/// pseudo-header, so nothing else changes.
pub(crate) fn routed6(frame: &[u8], macs: ([u8; 6], [u8; 6])) -> Vec<u8> {
    let mut f = frame.to_vec();
    f[..6].copy_from_slice(&macs.0);
    f[6..12].copy_from_slice(&macs.1);
    f[HOP] -= 1;
    f
}

fn sockaddr6(a: SocketAddrV6) -> libc::sockaddr_in6 {
    libc::sockaddr_in6 {
        sin6_family: libc::AF_INET6 as libc::sa_family_t,
        sin6_port: a.port().to_be(),
        sin6_flowinfo: 0,
        sin6_addr: libc::in6_addr {
            s6_addr: a.ip().octets(),
        },
        sin6_scope_id: 0,
    }
}

/// `connect` from a chosen IPv6 source address.
fn tcp_connect_from6(src: Ipv6Addr, dst: SocketAddrV6) -> Result<TcpStream> {
    let local = sockaddr6(SocketAddrV6::new(src, 0, 0, 0));
    connect_from(libc::AF_INET6, &local, &sockaddr6(dst), src, dst)
}

fn v6(a: std::net::SocketAddr) -> Result<SocketAddrV6> {
    match a {
        std::net::SocketAddr::V6(a) => Ok(a),
        std::net::SocketAddr::V4(_) => bail!("not IPv6: {a}"),
    }
}

/// An open IPv6 TCP connection (ESTABLISHED in conntrack while open).
pub(crate) struct TcpConn6 {
    _client: TcpStream,
    _server: TcpStream,
    /// Client to server as the client sent it (before any DNAT).
    pub(crate) flow: Flow6,
    /// Server to client as the server sent it (after DNAT, its reply tuple).
    pub(crate) reply: Flow6,
}

pub(crate) fn tcp_conn6(src: Ipv6Addr, dst: Ipv6Addr, listener: &TcpListener) -> Result<TcpConn6> {
    tcp_conn6_to(src, SocketAddrV6::new(dst, SERVER_PORT, 0, 0), listener)
}

fn tcp_conn6_to(src: Ipv6Addr, dst: SocketAddrV6, listener: &TcpListener) -> Result<TcpConn6> {
    let client = tcp_connect_from6(src, dst)?;
    let (server, _) = listener.accept()?;
    let flow = Flow6 {
        src: v6(client.local_addr()?)?,
        dst,
    };
    let reply = Flow6 {
        src: v6(server.local_addr()?)?,
        dst: v6(server.peer_addr()?)?,
    };
    Ok(TcpConn6 {
        _client: client,
        _server: server,
        flow,
        reply,
    })
}

pub(crate) fn listen6(ip: Ipv6Addr) -> Result<TcpListener> {
    Ok(TcpListener::bind(SocketAddrV6::new(ip, SERVER_PORT, 0, 0))?)
}

/// An address as /proc/net/nf_conntrack prints it (`%pI6`: all eight
/// groups, four digits each).
fn ct_addr(a: &Ipv6Addr) -> String {
    a.segments()
        .iter()
        .map(|s| format!("{s:04x}"))
        .collect::<Vec<_>>()
        .join(":")
}

pub(crate) fn ensure_ct6(flow: Flow6, mark: &str) -> Result<()> {
    let table = std::fs::read_to_string("/proc/thread-self/net/nf_conntrack")?;
    let key = format!(
        "src={} dst={} sport={} dport={} ",
        ct_addr(flow.src.ip()),
        ct_addr(flow.dst.ip()),
        flow.src.port(),
        flow.dst.port()
    );
    let line = table
        .lines()
        .find(|l| l.contains(&key))
        .with_context(|| format!("no conntrack entry for {flow:?} in:\n{table}"))?;
    ensure!(line.contains(mark), "conntrack entry lacks {mark}: {line}");
    Ok(())
}

/// [`Dp::fast`] for IPv6: forwarded under `want`, as a router would.
pub(crate) fn fast6(dp: &Dp, input: Input, want: DpPath, macs: ([u8; 6], [u8; 6])) -> Result<()> {
    let pkt = input.pkt;
    dp.forwarded(input, want, DpFamily::Ipv6, || routed6(pkt, macs))
}

#[test]
fn ipv6_established_takes_the_fast_path_and_the_rest_stays_with_the_kernel() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let node = Node::new("ipv6")?;
    node.run(|dp| {
        dp.configure(&config())?;
        let (at_a, at_b, at_r) = (listen6(POD_A6)?, listen6(POD_B6)?, listen6(POD_R6)?);
        let a_b = tcp_conn6(POD_A6, POD_B6, &at_b)?;
        let a_r = tcp_conn6(POD_A6, POD_R6, &at_r)?;
        let b_a = tcp_conn6(POD_B6, POD_A6, &at_a)?;
        for c in [&a_b, &a_r, &b_a] {
            ensure_ct6(c.flow, "ESTABLISHED")?;
        }
        let ab = from_a6(&tcp6(a_b.flow, ACK | PSH, b"hello"));
        let ar = from_a6(&tcp6(a_r.flow, ACK, b"GET /"));
        let ra = from_peer6(&tcp6(a_r.flow.rev(), ACK, b"200 OK"));

        #[rustfmt::skip]
        let cases: Vec<FastCase> = vec![
            ("tcp6 A->B (local)", POD, ab.clone(), DpPath::FastLocal, TO_B),
            ("tcp6 B->A (local, reply)", POD, from_b6(&tcp6(a_b.flow.rev(), ACK, b"world")), DpPath::FastLocal, TO_A),
            ("tcp6 A->B hop limit 2", POD, with_hop(&ab, 2), DpPath::FastLocal, TO_B),
            ("tcp6 A->B hop limit 255", POD, with_hop(&ab, 255), DpPath::FastLocal, TO_B),
            ("tcp6 A->B traffic class, flow label", POD, { let mut f = ab.clone(); f[IP..IP + 4].copy_from_slice(&[0x6b, 0x81, 0x23, 0x45]); f }, DpPath::FastLocal, TO_B),
            ("tcp6 A->R (remote, vxlan.1)", POD, ar.clone(), DpPath::FastVxlanNoEncap, TO_PEER),
            ("tcp6 R->A (decap, reply)", VX, ra.clone(), DpPath::FastDecap, TO_A),
        ];
        for (what, prog, pkt, want, macs) in cases {
            fast6(dp, input(what, prog, &pkt), want, macs)?;
        }

        let stranger = a_r.flow.with_sport(a_r.flow.src.port() ^ 0x0101);
        let to_unknown = Flow6 {
            dst: SocketAddrV6::new(UNKNOWN6, 80, 0, 0),
            ..a_r.flow
        };
        let mut payload_past = ab.clone();
        payload_past[IP + 4..IP + 6].copy_from_slice(&(ab.len() as u16 - 14 - 40 + 1).to_be_bytes());
        let mut payload_zero = ab.clone();
        payload_zero[IP + 4..IP + 6].fill(0);
        let solicited = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, 0xff00, 9);
        let link_local_a = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 5);
        let mcast = Flow6 {
            dst: SocketAddrV6::new(Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1), 9, 0, 0),
            ..a_b.flow
        };
        let to_gw = Flow6 {
            dst: SocketAddrV6::new(GATEWAY6, 9, 0, 0),
            ..a_b.flow
        };
        let from_ll = Flow6 {
            src: SocketAddrV6::new(link_local_a, 9, 0, 0),
            ..a_b.flow
        };
        #[rustfmt::skip]
        let cases: Vec<KernelCase> = vec![
            // The hop limit would expire here.
            ("tcp6 A->B hop limit 1", POD, with_hop(&ab, 1), DpPath::KernelTtl),
            ("tcp6 A->R hop limit 0", POD, with_hop(&ar, 0), DpPath::KernelTtl),
            ("vxlan: tcp6 R->A hop limit 1", VX, with_hop(&ra, 1), DpPath::KernelTtl),
            // Neighbour discovery, whatever its addresses.
            ("NS A -> solicited-node multicast", POD, from_a6(&ns(POD_A6, solicited, POD_B6)), DpPath::KernelIpv6Nd),
            ("NS A -> B (unicast)", POD, from_a6(&ns(POD_A6, POD_B6, POD_B6)), DpPath::KernelIpv6Nd),
            ("NA fe80::5 -> fe80::1", POD, from_a6(&icmp6(link_local_a, GATEWAY6, 136, &[0x60, 0, 0, 0])), DpPath::KernelIpv6Nd),
            ("RS -> ff02::2", POD, from_a6(&icmp6(link_local_a, Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 2), 133, &[0; 4])), DpPath::KernelIpv6Nd),
            ("vxlan: NS R -> A", VX, from_peer6(&ns(POD_R6, POD_A6, POD_A6)), DpPath::KernelIpv6Nd),
            // Other ICMPv6: neither TCP nor UDP.
            ("icmp6 echo A->B", POD, from_a6(&icmp6(POD_A6, POD_B6, 128, &[0, 1, 0, 1])), DpPath::KernelNotTcpUdp),
            ("icmp6 echo A->R", POD, from_a6(&icmp6(POD_A6, POD_R6, 128, &[0, 1, 0, 1])), DpPath::KernelNotTcpUdp),
            // Multicast and link-local.
            ("udp6 A -> ff02::1", POD, from_a6(&udp6(mcast, b"x")), DpPath::KernelIpv6Multicast),
            ("udp6 A -> fe80::1 (the gateway)", POD, from_a6(&udp6(to_gw, b"x")), DpPath::KernelIpv6LinkLocal),
            ("tcp6 fe80::5 -> B", POD, from_a6(&tcp6(from_ll, ACK, b"")), DpPath::KernelIpv6LinkLocal),
            // Extension headers.
            ("hop-by-hop options", POD, from_a6(&with_ext(0, a_b.flow)), DpPath::KernelIpOptionsOrFragment),
            ("fragment header", POD, from_a6(&with_ext(44, a_b.flow)), DpPath::KernelIpOptionsOrFragment),
            ("destination options", POD, from_a6(&with_ext(60, a_r.flow)), DpPath::KernelIpOptionsOrFragment),
            ("routing header", VX, from_peer6(&with_ext(43, a_r.flow.rev())), DpPath::KernelIpOptionsOrFragment),
            // No conntrack entry, or no map entry.
            ("tcp6 A->R ACK, no ct", POD, from_a6(&tcp6(stranger, ACK, b"")), DpPath::KernelNotEstablished),
            ("udp6 on a TCP flow's tuple", POD, from_a6(&udp6(a_b.flow, b"x")), DpPath::KernelNotEstablished),
            ("vxlan: tcp6 R->A, no ct", VX, from_peer6(&tcp6(stranger.rev(), ACK, b"")), DpPath::KernelNotEstablished),
            ("tcp6 A->unknown", POD, from_a6(&tcp6(to_unknown, ACK, b"")), DpPath::KernelUnknownDest),
            ("vxlan: tcp6 A->R (remote pod)", VX, ar.clone(), DpPath::KernelUnknownDest),
            // Opens and closes go through conntrack.
            ("tcp6 A->B SYN", POD, from_a6(&tcp6(a_b.flow, SYN, b"")), DpPath::KernelTcpControl),
            ("tcp6 A->R FIN", POD, from_a6(&tcp6(a_r.flow, FIN | ACK, b"")), DpPath::KernelTcpControl),
            ("tcp6 A->R RST", POD, from_a6(&tcp6(a_r.flow, RST, b"")), DpPath::KernelTcpControl),
            // Lengths that lie.
            ("payload length 1 past the frame", POD, payload_past, DpPath::KernelTruncated),
            ("payload length 0 (jumbogram, BIG TCP)", POD, payload_zero, DpPath::KernelTruncated),
            ("ethertype IPv6, version 4", POD, { let mut f = ab.clone(); f[IP] = 0x40; f }, DpPath::KernelNotIpv4),
        ];
        for (what, prog, pkt, want) in cases {
            dp.kernel(what, prog, &pkt, want)?;
        }

        // A pod may only send as itself: B's address (on B's established
        // flow to A) or an address no pod has, from A's veth.
        let as_b = from_a6(&tcp6(b_a.flow, ACK, b""));
        dp.kernel_on(input("tcp6 as B from A's veth", POD, &as_b), 101, DpPath::KernelSourceNotPod)?;
        let foreign = Flow6 {
            src: SocketAddrV6::new(Ipv6Addr::new(0xfd00, 0x10, 0x244, 1, 0, 0, 0, 0x99), 1, 0, 0),
            ..a_b.flow
        };
        dp.kernel_on(input("tcp6 from an address no pod has", POD, &from_a6(&tcp6(foreign, ACK, b""))), 101, DpPath::KernelSourceNotPod)?;
        // The same frame from B's own veth is B's.
        dp.iif.set(Some(102));
        let r = fast6(dp, input("tcp6 B->A from B's veth", POD, &as_b), DpPath::FastLocal, TO_A);
        dp.iif.set(None);
        r?;

        // An IPv6 podCIDR marked direct (the agent marks none: the IPv4
        // underlay cannot carry IPv6 unencapsulated) is left to the kernel.
        let direct: BTreeMap<(Ipv6Addr, u8), RemoteNode> = remote6_map()
            .into_iter()
            .map(|(k, v)| {
                (
                    k,
                    RemoteNode {
                        flags: mycni_common::REMOTE_DIRECT,
                        ..v
                    },
                )
            })
            .collect();
        REMOTE6.sync(dp.pin, &direct)?;
        dp.kernel("tcp6 A->R, peer marked direct", POD, &ar, DpPath::KernelDirectFib)?;
        REMOTE6.sync(dp.pin, &remote6_map())?;
        Ok(())
    })
}

#[test]
fn ipv6_encap_sends_what_vxlan1_sends() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let node = Node::new("encap6")?.with_underlay()?;
    node.run(|dp| {
        dp.configure(&encap_config()?)?;
        let at_r = listen6(POD_R6)?;
        let a_r = tcp_conn6(POD_A6, POD_R6, &at_r)?;
        ensure_ct6(a_r.flow, "ESTABLISHED")?;
        let cap = packet_socket("ul0p", Duration::from_secs(2))?;
        let into_vxlan = packet_socket("vxlan.1", Duration::from_secs(2))?;
        for (what, payload, tc) in [
            ("tcp6 A->R", &b"GET / HTTP/1.1"[..], 0u8),
            ("tcp6 A->R, 1390 B", &[0x5a; 1390][..], 0),
            ("tcp6 A->R, ECT(0)", &b"ecn"[..], 0x02),
            ("tcp6 A->R, CE, DSCP 46", &b"ce"[..], 0xbb),
        ] {
            let mut pkt = from_a6(&tcp6(a_r.flow, ACK | PSH, payload));
            pkt[IP] = 0x60 | (tc >> 4);
            pkt[IP + 1] = tc << 4;
            let (path, out) = dp.run(POD, &pkt).with_context(|| what.to_string())?;
            ensure!(
                path == DpPath::FastEncap && out.retval == TC_ACT_REDIRECT,
                "{what}: {} with verdict {}",
                path.name(),
                out.retval
            );
            let inner = routed6(&pkt, TO_PEER);
            packet_send(&into_vxlan, &inner)?;
            let wire = packet_recv(&cap, is_vxlan)?;
            ensure!(
                ip_csum_ok(&out.data),
                "{what}: bad outer checksum {}",
                hex(&out.data)
            );
            ensure!(
                out.data.len() == wire.len() && out.data.len() == pkt.len() + 50,
                "{what}: {} bytes, vxlan.1 sent {}, inner frame {}",
                out.data.len(),
                wire.len(),
                pkt.len()
            );
            ensure!(
                out.data[INNER - 14..] == inner[..],
                "{what}: inner frame differs\n  want: {}\n  got:  {}",
                hex(&inner),
                hex(&out.data[INNER - 14..])
            );
            let differ: Vec<usize> = (0..wire.len())
                .filter(|&i| out.data[i] != wire[i])
                .filter(|&i| !(O_IP_ID..O_IP_ID + 2).contains(&i))
                .filter(|&i| !(O_IP_CSUM..O_IP_CSUM + 2).contains(&i))
                .collect();
            ensure!(
                differ.is_empty(),
                "{what}: bytes {differ:?} differ\n  tc:      {}\n  vxlan.1: {}",
                hex(&out.data[..INNER]),
                hex(&wire[..INNER])
            );
            eprintln!("ok  {what}: byte for byte as vxlan.1 but the IP ID");
        }
        // Outer headers as for an IPv4 inner packet of the same length:
        // only the outer IP ID, its checksum and the UDP source port (the
        // flow hash) may differ.
        let at_r4 = TcpListener::bind(SocketAddrV4::new(POD_R, SERVER_PORT))?;
        let a_r4 = tcp_conn(POD_A, SocketAddrV4::new(POD_R, SERVER_PORT), &at_r4)?;
        let p6 = from_a6(&tcp6(a_r.flow, ACK, &[7; 40]));
        let p4 = from_a(&tcp(a_r4.flow, ACK, &[7; 60]));
        ensure!(p6.len() == p4.len());
        let (_, o6) = dp.run(POD, &p6)?;
        let (_, o4) = dp.run(POD, &p4)?;
        let differ: Vec<usize> = (0..INNER - 2)
            .filter(|&i| o6.data[i] != o4.data[i])
            .filter(|&i| !(O_IP_ID..O_IP_ID + 2).contains(&i))
            .filter(|&i| !(O_IP_CSUM..O_IP_CSUM + 2).contains(&i))
            .filter(|&i| !(O_UDP..O_UDP + 2).contains(&i))
            .collect();
        ensure!(
            differ.is_empty() && o6.data[INNER - 2..INNER] == ETH_P_IPV6.to_be_bytes(),
            "outer headers of IPv6 and IPv4 inner differ at {differ:?}\n  v6: {}\n  v4: {}",
            hex(&o6.data[..INNER]),
            hex(&o4.data[..INNER])
        );
        // 1451 B of IPv6: 1501 on the underlay, over its 1500 MTU.
        let big = from_a6(&tcp6(a_r.flow, ACK, &[1; 1451 - 60]));
        fast6(
            dp,
            input("tcp6 over the underlay MTU", POD, &big),
            DpPath::FastVxlanMtu,
            TO_PEER,
        )?;
        let fits = from_a6(&tcp6(a_r.flow, ACK, &[1; 1450 - 60]));
        let (path, _) = dp.run(POD, &fits)?;
        ensure!(path == DpPath::FastEncap, "1450 B: {}", path.name());
        Ok(())
    })
}

#[test]
fn ipv6_decap_only_from_peers_for_local_pods() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let node = Node::new("decap6")?.with_underlay()?;
    node.run(|dp| {
        dp.configure(&encap_config()?)?;
        let (at_a, at_r) = (listen6(POD_A6)?, listen6(POD_R6)?);
        let a_r = tcp_conn6(POD_A6, POD_R6, &at_r)?;
        let b_a = tcp_conn6(POD_B6, POD_A6, &at_a)?;
        ensure_ct6(a_r.flow, "ESTABLISHED")?;
        let ra = from_peer6(&tcp6(a_r.flow.rev(), ACK, b"200 OK"));
        let ok = wrapped(UL_PEER, &ra, |_| {});
        let (path, out) = dp.run(UL, &ok)?;
        // Before Linux 6.3 (no BPF_F_ADJ_ROOM_DECAP_L3_IPV6) the same bytes
        // leave by the veth's egress instead of the peer redirect.
        ensure!(
            path == DpPath::FastTcDecap && out.retval == TC_ACT_REDIRECT,
            "peer's VXLAN: {} verdict {}",
            path.name(),
            out.retval
        );
        // The outer packet is IPv4: what the program unwraps counts as
        // what it carries.
        ensure!(
            dp.family() == Some(DpFamily::Ipv6),
            "IPv6 unwrapped counted as {:?}",
            dp.family()
        );
        let want = routed6(&ra, TO_A);
        ensure!(
            out.data == want,
            "decap6\n  want: {}\n  got:  {}",
            hex(&want),
            hex(&out.data)
        );
        eprintln!("ok  {:<16} {:<48} -> fast_tc_decap", UL.name(), "peer's VXLAN, IPv6 inside");

        let stranger = a_r.flow.rev().with_sport(1);
        // Left before the program looks inside: the outer family (IPv4).
        // Once it does: the inner one.
        let (v4, v6) = (DpFamily::Ipv4, DpFamily::Ipv6);
        #[rustfmt::skip]
        let cases = [
            ("IPv6 inside, from a host that is no peer", UL, wrapped(UL_STRANGER, &ra, |_| {}), DpPath::KernelDecapNotPeer, v4),
            ("IPv6 inside, VNI 2", UL, wrapped(UL_PEER, &ra, |f| f[O_UDP + 14] = 2), DpPath::KernelDecapHeader, v4),
            ("IPv6 inside, outer fragment", UL, wrapped(UL_PEER, &ra, |f| { f[20] = 0x20; fix_outer(f) }), DpPath::KernelDecapFragment, v4),
            ("inner IPv6 source not the peer's pod", UL, wrapped(UL_PEER, &from_peer6(&tcp6(b_a.flow, ACK, b"")), |_| {}), DpPath::KernelDecapInnerSource, v6),
            ("inner IPv6 hop limit 1", UL, wrapped(UL_PEER, &with_hop(&ra, 1), |_| {}), DpPath::KernelTtl, v6),
            ("inner IPv6 SYN", UL, wrapped(UL_PEER, &from_peer6(&tcp6(a_r.flow.rev(), SYN, b"")), |_| {}), DpPath::KernelTcpControl, v6),
            ("inner IPv6 flow unknown to conntrack", UL, wrapped(UL_PEER, &from_peer6(&tcp6(stranger, ACK, b"")), |_| {}), DpPath::KernelNotEstablished, v6),
            ("inner IPv6 NS", UL, wrapped(UL_PEER, &from_peer6(&ns(POD_R6, POD_A6, POD_A6)), |_| {}), DpPath::KernelIpv6Nd, v6),
            ("inner IPv6 to the peer's own podCIDR", UL, wrapped(UL_PEER, &from_peer6(&udp6(Flow6 { src: SocketAddrV6::new(POD_R6, 1, 0, 0), dst: SocketAddrV6::new(PEER6, 2, 0, 0) }, b"")), |_| {}), DpPath::KernelUnknownDest, v6),
        ];
        for (what, prog, pkt, want, family) in cases {
            dp.kernel_as(input(what, prog, &pkt), want, family)?;
        }
        Ok(())
    })
}

/// Service IPs, DNATed (in the namespace's OUTPUT hook, as kube-proxy's
/// ip6tables rules would) to pods R and B.
const SVC6_TO_R: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x10);
const SVC6_TO_B: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x11);

#[test]
fn ipv6_services_and_unassured_udp_stay_with_the_kernel() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let node = Node::new("svc6")?;
    node.ns
        .exec("ip", &["-6", "route", "add", "fd00:96::/64", "dev", "lo"])?;
    node.ns.exec(
        "nft",
        &[&format!(
            "add table ip6 mycni_nat6; \
             add chain ip6 mycni_nat6 out {{ type nat hook output priority -100; }}; \
             add rule ip6 mycni_nat6 out ip6 daddr {SVC6_TO_R} tcp dport 80 dnat to [{POD_R6}]:{SERVER_PORT}; \
             add rule ip6 mycni_nat6 out ip6 daddr {SVC6_TO_B} tcp dport 80 dnat to [{POD_B6}]:{SERVER_PORT}"
        )],
    )?;
    node.run(|dp| {
        dp.configure(&config())?;
        ensure!(
            mycni_agent::datapath::LOCAL6.read(dp.pin)? == local6_map()
                && mycni_agent::datapath::REMOTE6.read(dp.pin)? == remote6_map(),
            "the IPv6 maps do not read back as written"
        );
        let (at_b, at_r) = (listen6(POD_B6)?, listen6(POD_R6)?);
        let svc_r = tcp_conn6_to(POD_A6, SocketAddrV6::new(SVC6_TO_R, 80, 0, 0), &at_r)?;
        let svc_b = tcp_conn6_to(POD_A6, SocketAddrV6::new(SVC6_TO_B, 80, 0, 0), &at_b)?;
        ensure_ct6(svc_r.flow, "ESTABLISHED")?;
        ensure_ct6(svc_b.flow, "ESTABLISHED")?;
        ensure!(*svc_r.reply.src.ip() == POD_R6 && *svc_b.reply.src.ip() == POD_B6);

        // UDP: fast once conntrack holds the flow as assured, not before.
        let a = std::net::UdpSocket::bind(SocketAddrV6::new(POD_A6, 0, 0, 0))?;
        let b = std::net::UdpSocket::bind(SocketAddrV6::new(POD_B6, 0, 0, 0))?;
        a.connect(b.local_addr()?)?;
        b.connect(a.local_addr()?)?;
        for s in [&a, &b] {
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
        }
        let udp_flow = Flow6 {
            src: v6(a.local_addr()?)?,
            dst: v6(b.local_addr()?)?,
        };
        let exchange = || -> Result<()> {
            let mut buf = [0u8; 16];
            a.send(b"ping")?;
            b.recv(&mut buf)?;
            b.send(b"pong")?;
            a.recv(&mut buf)?;
            Ok(())
        };
        let started = Instant::now();
        exchange()?;
        let udp = from_a6(&udp6(udp_flow, b"data"));

        #[rustfmt::skip]
        let cases: Vec<KernelCase> = vec![
            ("vxlan: tcp6 R->A, DNATed flow", VX, from_peer6(&tcp6(svc_r.reply, ACK, b"200 OK")), DpPath::KernelNat),
            ("tcp6 B->A, DNATed flow", POD, from_b6(&tcp6(svc_b.reply, ACK, b"200 OK")), DpPath::KernelNat),
            // Before DNAT the destination is a Service IP, in no map.
            ("tcp6 A->Service IP", POD, from_a6(&tcp6(svc_r.flow, ACK, b"")), DpPath::KernelUnknownDest),
            ("udp6 A->B replied, not assured", POD, udp.clone(), DpPath::KernelNotEstablished),
        ];
        for (what, prog, pkt, want) in cases {
            dp.kernel(what, prog, &pkt, want)?;
        }
        std::thread::sleep(Duration::from_millis(2100).saturating_sub(started.elapsed()));
        exchange()?;
        ensure_ct6(udp_flow, "[ASSURED]")?;
        fast6(dp, input("udp6 A->B, assured", POD, &udp), DpPath::FastLocal, TO_B)?;
        fast6(dp, input("udp6 B->A, assured", POD, &from_b6(&udp6(udp_flow.rev(), b"re"))), DpPath::FastLocal, TO_A)
    })
}

/// IPv6 next-header values that are extension headers (as the program
/// lists them).
fn is_ext(nh: u8) -> bool {
    matches!(nh, 0 | 43 | 44 | 50 | 51 | 60 | 135 | 139 | 140 | 253 | 254)
}

#[test]
fn ipv6_hostile_packets_are_each_counted_once() -> Result<()> {
    let _turn = crate::turn(module_path!());
    let node = Node::new("hostile6")?.with_underlay()?;
    node.run(|dp| {
        dp.configure(&encap_config()?)?;
        let at_r = listen6(POD_R6)?;
        let a_r = tcp_conn6(POD_A6, POD_R6, &at_r)?;
        ensure_ct6(a_r.flow, "ESTABLISHED")?;
        let ar = from_a6(&tcp6(a_r.flow, ACK, b"abcdefgh"));
        let ra = from_peer6(&tcp6(a_r.flow.rev(), ACK, b"abcdefgh"));
        let ul = wrapped(UL_PEER, &ra, |_| {});
        // (program, frame, where its IPv6 header starts, the path it takes)
        let bases = [
            (POD, &ar, IP, DpPath::FastEncap),
            (VX, &ra, IP, DpPath::FastDecap),
            (UL, &ul, INNER, DpPath::FastTcDecap),
        ];
        let mut runs = 0;
        // Every next header on an otherwise fast packet.
        for (prog, base, ip, fast) in bases {
            for nh in 0..=255u8 {
                let mut pkt = base.clone();
                pkt[ip + 6] = nh;
                let icmp_type = pkt[ip + 40];
                let want = match nh {
                    6 => fast,
                    // UDP on the TCP flow's tuple: no such flow.
                    17 => DpPath::KernelNotEstablished,
                    58 if (133..=137).contains(&icmp_type) => DpPath::KernelIpv6Nd,
                    nh if is_ext(nh) => DpPath::KernelIpOptionsOrFragment,
                    _ => DpPath::KernelNotTcpUdp,
                };
                let (got, _) = dp.run(prog, &pkt)?;
                runs += 1;
                ensure!(
                    got == want,
                    "{}: next header {nh}: {} not {}",
                    prog.name(),
                    got.name(),
                    want.name()
                );
            }
        }
        // Every version and traffic-class nibble.
        for (prog, base, ip, fast) in bases {
            for b in 0..=255u8 {
                let mut pkt = base.clone();
                pkt[ip] = b;
                let want = if b >> 4 == 6 {
                    fast
                } else {
                    DpPath::KernelNotIpv4
                };
                let (got, _) = dp.run(prog, &pkt)?;
                runs += 1;
                ensure!(
                    got == want,
                    "{}: first byte {b:#04x}: {} not {}",
                    prog.name(),
                    got.name(),
                    want.name()
                );
            }
        }
        // Random changes and cuts: each counted once (`Dp::try_run`
        // checks), a packet left to the kernel untouched, a redirected one
        // rewritten only as a router would.
        let mut rng = Rng(0x6970_7636_2121);
        for (prog, base, ..) in bases {
            for _ in 0..400 {
                let mut pkt = base.clone();
                for _ in 0..1 + rng.below(3) {
                    let i = 12 + rng.below(pkt.len() - 12);
                    pkt[i] = rng.next() as u8;
                }
                if rng.below(2) == 0 {
                    pkt.truncate(14 + rng.below(pkt.len() - 13));
                }
                if dp.try_run(prog, &pkt)?.is_some() {
                    runs += 1;
                }
            }
        }
        eprintln!("{runs} IPv6 runs, each counted once");
        Ok(())
    })
}
