//! Packets, made byte by byte.

use super::*;

pub(crate) use mycni_testkit::csum;

pub(crate) fn ip_hlen(frame: &[u8]) -> usize {
    usize::from(frame[IP] & 0x0f) * 4
}

/// Sets the header checksum; a no-op on a frame too short for the header.
pub(crate) fn set_ip_csum(frame: &mut [u8]) {
    let end = IP + ip_hlen(frame).max(20);
    if frame.len() < end {
        return;
    }
    frame[CSUM..CSUM + 2].fill(0);
    let c = csum(&frame[IP..end]);
    frame[CSUM..CSUM + 2].copy_from_slice(&c.to_be_bytes());
}

pub(crate) fn ip_csum_ok(frame: &[u8]) -> bool {
    let end = IP + ip_hlen(frame).max(20);
    frame.len() >= end && csum(&frame[IP..end]) == 0
}

pub(crate) fn eth(dst: [u8; 6], src: [u8; 6], ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(14 + payload.len());
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A frame from pod A to its gateway (A's host-side veth).
pub(crate) fn from_a(ip: &[u8]) -> Vec<u8> {
    eth(HOST_A_MAC, POD_A_MAC, ETH_P_IP, ip)
}

pub(crate) fn from_b(ip: &[u8]) -> Vec<u8> {
    eth(HOST_B_MAC, POD_B_MAC, ETH_P_IP, ip)
}

/// A frame as `vxlan.1` decapsulates it: peer VTEP to this node's VTEP.
pub(crate) fn from_peer(ip: &[u8]) -> Vec<u8> {
    eth(VTEP_MAC, PEER_VTEP_MAC, ETH_P_IP, ip)
}

/// An IPv4 packet: TTL 64, DF, valid header checksum.
pub(crate) fn ipv4(proto: u8, src: Ipv4Addr, dst: Ipv4Addr, options: &[u8], l4: &[u8]) -> Vec<u8> {
    assert_eq!(options.len() % 4, 0);
    let hlen = 20 + options.len();
    let tot = u16::try_from(hlen + l4.len()).expect("packet fits");
    let mut p = vec![0x40 | (hlen / 4) as u8, 0];
    p.extend_from_slice(&tot.to_be_bytes());
    p.extend_from_slice(&[0x1c, 0x46, 0x40, 0x00, 64, proto, 0, 0]);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(options);
    let c = csum(&p);
    p[10..12].copy_from_slice(&c.to_be_bytes());
    p.extend_from_slice(l4);
    p
}

/// The L4 checksum over the IPv4 pseudo-header and `l4`.
pub(crate) fn l4_csum(proto: u8, src: Ipv4Addr, dst: Ipv4Addr, l4: &[u8]) -> u16 {
    let mut buf = Vec::with_capacity(12 + l4.len());
    buf.extend_from_slice(&src.octets());
    buf.extend_from_slice(&dst.octets());
    buf.extend_from_slice(&[0, proto]);
    buf.extend_from_slice(&u16::try_from(l4.len()).expect("fits").to_be_bytes());
    buf.extend_from_slice(l4);
    csum(&buf)
}

/// A flow's direction: source and destination address and port.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Flow {
    pub(crate) src: SocketAddrV4,
    pub(crate) dst: SocketAddrV4,
}

impl Flow {
    pub(crate) fn rev(self) -> Self {
        Self {
            src: self.dst,
            dst: self.src,
        }
    }

    pub(crate) fn to(self, dst: Ipv4Addr) -> Self {
        Self {
            dst: SocketAddrV4::new(dst, self.dst.port()),
            ..self
        }
    }
}

/// An IPv4 packet with a 20-byte TCP header and `payload`.
pub(crate) fn tcp(flow: Flow, flags: u8, payload: &[u8]) -> Vec<u8> {
    let (src, dst) = (*flow.src.ip(), *flow.dst.ip());
    let seg = tcp_segment(flow.src.port(), flow.dst.port(), flags, payload, |seg| {
        l4_csum(IPPROTO_TCP, src, dst, seg)
    });
    ipv4(IPPROTO_TCP, src, dst, &[], &seg)
}

pub(crate) fn udp(flow: Flow, payload: &[u8]) -> Vec<u8> {
    let (src, dst) = (*flow.src.ip(), *flow.dst.ip());
    let d = udp_segment(flow.src.port(), flow.dst.port(), payload, |d| {
        l4_csum(IPPROTO_UDP, src, dst, d)
    });
    ipv4(IPPROTO_UDP, src, dst, &[], &d)
}

/// A 20-byte TCP header and `payload`, for either family: `csum` is the
/// checksum over that family's pseudo-header and the segment.
pub(crate) fn tcp_segment(
    sport: u16,
    dport: u16,
    flags: u8,
    payload: &[u8],
    csum: impl Fn(&[u8]) -> u16,
) -> Vec<u8> {
    let mut seg = Vec::with_capacity(20 + payload.len());
    seg.extend_from_slice(&sport.to_be_bytes());
    seg.extend_from_slice(&dport.to_be_bytes());
    seg.extend_from_slice(&0x0102_0304u32.to_be_bytes());
    seg.extend_from_slice(&0x0a0b_0c0du32.to_be_bytes());
    seg.extend_from_slice(&[0x50, flags, 0xfa, 0xf0, 0, 0, 0, 0]);
    seg.extend_from_slice(payload);
    let c = csum(&seg);
    seg[16..18].copy_from_slice(&c.to_be_bytes());
    seg
}

/// A UDP header and `payload`, for either family, as [`tcp_segment`]. A
/// computed checksum of 0 goes out as 0xffff: 0 means none.
pub(crate) fn udp_segment(
    sport: u16,
    dport: u16,
    payload: &[u8],
    csum: impl Fn(&[u8]) -> u16,
) -> Vec<u8> {
    let len = u16::try_from(8 + payload.len()).expect("fits");
    let mut d = Vec::with_capacity(usize::from(len));
    d.extend_from_slice(&sport.to_be_bytes());
    d.extend_from_slice(&dport.to_be_bytes());
    d.extend_from_slice(&len.to_be_bytes());
    d.extend_from_slice(&[0, 0]);
    d.extend_from_slice(payload);
    let c = match csum(&d) {
        0 => 0xffff,
        c => c,
    };
    d[6..8].copy_from_slice(&c.to_be_bytes());
    d
}

pub(crate) fn icmp_echo(src: Ipv4Addr, dst: Ipv4Addr) -> Vec<u8> {
    let mut m = vec![8, 0, 0, 0, 0x12, 0x34, 0, 1];
    m.extend_from_slice(b"ping payload");
    let c = csum(&m);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    ipv4(IPPROTO_ICMP, src, dst, &[], &m)
}

/// `frame` with `edit` applied to its IP packet and the header checksum fixed.
pub(crate) fn edit_ip(frame: &[u8], edit: impl FnOnce(&mut [u8])) -> Vec<u8> {
    let mut f = frame.to_vec();
    edit(&mut f[IP..]);
    set_ip_csum(&mut f);
    f
}

pub(crate) fn with_ttl(frame: &[u8], ttl: u8) -> Vec<u8> {
    edit_ip(frame, |ip| ip[8] = ttl)
}

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

// VXLAN frames on the wire.

/// Outer header offsets in a VXLAN frame on the wire.
pub(crate) const O_IP_ID: usize = 14 + 4;
pub(crate) const O_IP_CSUM: usize = 14 + 10;
pub(crate) const O_UDP: usize = 34;
pub(crate) const INNER: usize = 64;

/// `inner` (a frame as vxlan.1 carries it) wrapped as a peer's VXLAN frame
/// to this host; `edit` may change any byte of the result.
pub(crate) fn wrapped(src: Ipv4Addr, inner: &[u8], edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut udp = vec![0u8; 16];
    udp[0..2].copy_from_slice(&40_000u16.to_be_bytes());
    udp[2..4].copy_from_slice(&VXLAN_PORT.to_be_bytes());
    let len = u16::try_from(16 + inner.len()).expect("fits");
    udp[4..6].copy_from_slice(&len.to_be_bytes());
    udp[8] = 0x08;
    udp[14] = 1; // VNI 1
    udp.extend_from_slice(inner);
    let mut ip = ipv4(IPPROTO_UDP, src, UL_HOST, &[], &udp);
    ip[6] = 0; // DF clear, as vxlan.1 sends
    let c = {
        ip[10..12].fill(0);
        csum(&ip[..20])
    };
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    // BPF_PROG_TEST_RUN builds the skb on loopback, whose MAC is all zero:
    // a frame to it is PACKET_HOST, as one to the underlay's MAC is.
    let mut f = eth([0; 6], UL_PEER_MAC, ETH_P_IP, &ip);
    edit(&mut f);
    f
}

/// Fixes the outer IPv4 checksum after an edit.
pub(crate) fn fix_outer(f: &mut [u8]) {
    set_ip_csum(f);
}
