//! Header parsing: reading what a packet carries, never changing it.
//!
//! Every read is checked against `data_end` (through [`linear`]) as the
//! verifier requires; a packet too short or of a shape these functions do
//! not know gets a `Kernel*` path and goes on untouched.

use aya_ebpf::{EbpfContext, bindings::__sk_buff, programs::TcContext};
use mycni_common::{CFG_FLOW_EVENTS, DpConfig, DpFamily, DpPath, VXLAN_OVERHEAD};

pub(crate) const ETH_HLEN: usize = 14;
pub(crate) const ETH_P_IP: u16 = 0x0800;
pub(crate) const ETH_P_IPV6: u16 = 0x86dd;
pub(crate) const IP_HLEN: usize = 20;
pub(crate) const IP6_HLEN: usize = 40;
pub(crate) const TCP_HLEN: usize = 20;
/// The TCP header up to and including its flags byte.
const TCP_FLAGS_END: usize = 14;
pub(crate) const UDP_HLEN: usize = 8;
pub(crate) const VXLAN_HLEN: usize = 8;
pub(crate) const IPPROTO_TCP: u8 = 6;
pub(crate) const IPPROTO_UDP: u8 = 17;
const IPPROTO_ICMPV6: u8 = 58;
/// ICMPv6 types of neighbour discovery (RFC 4861): router solicitation,
/// router and neighbour advertisement and solicitation, redirect.
const ND_ROUTER_SOLICIT: u8 = 133;
const ND_REDIRECT: u8 = 137;
const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
/// More-fragments flag and fragment offset; the DF bit is fine.
pub(crate) const IP_MF_OFFSET: u16 = 0x3fff;
pub(crate) const PACKET_HOST: u32 = 0;
/// Bytes in front of the inner IPv4 header of a VXLAN frame on the wire:
/// outer Ethernet + the overhead (outer IPv4, UDP, VXLAN, inner Ethernet).
pub(crate) const ENCAP: usize = ETH_HLEN + VXLAN_OVERHEAD as usize;
/// VXLAN flags byte with only I (a valid VNI) set, as `vxlan.1` sends and
/// requires without extensions.
pub(crate) const VXLAN_FLAG_I: u8 = 0x08;

/// The family the Ethernet header at `off` and the IP version behind it
/// declare: IPv4 or IPv6 only when both agree, as `inspect` requires, so
/// `KernelNotIpv4` is always `Other`.
#[inline(always)]
pub(crate) fn family_at(ctx: &TcContext, off: usize) -> DpFamily {
    let (data, end) = (ctx.data(), ctx.data_end());
    // The Ethernet header and the IP version byte behind it.
    let h: [u8; 3] = if data + off + ETH_HLEN < end {
        // SAFETY: in range, checked against data_end as the verifier requires.
        unsafe { ((data + off + 12) as *const [u8; 3]).read_unaligned() }
    } else {
        // Not in the linear area (or not there at all): a copy, which
        // unlike `linear` leaves the skb as it is.
        match ctx.load::<[u8; 3]>(off + 12) {
            Ok(h) => h,
            Err(_) => return DpFamily::Other,
        }
    };
    match (u16::from_be_bytes([h[0], h[1]]), h[2] >> 4) {
        (ETH_P_IP, 4) => DpFamily::Ipv4,
        (ETH_P_IPV6, 6) => DpFamily::Ipv6,
        _ => DpFamily::Other,
    }
}

/// Makes the first `n` bytes directly readable, pulling them into the linear
/// area if the skb has them elsewhere (decapsulated or GRO packets).
#[inline(always)]
pub(crate) fn linear(ctx: &TcContext, n: usize) -> Option<(usize, usize)> {
    if ctx.data() + n <= ctx.data_end() {
        return Some((ctx.data(), ctx.data_end()));
    }
    if (ctx.len() as usize) < n || ctx.pull_data(n as u32).is_err() {
        return None;
    }
    let (data, end) = (ctx.data(), ctx.data_end());
    (data + n <= end).then_some((data, end))
}

#[inline(always)]
pub(crate) fn skb(ctx: &TcContext) -> *const __sk_buff {
    ctx.as_ptr() as *const __sk_buff
}

/// The device a packet arrived on: a pod's host veth, or `vxlan.1` /
/// `vxlan6.1` for what the kernel decapsulated.
#[inline(always)]
pub(crate) fn ingress(ctx: &TcContext) -> u32 {
    // SAFETY: a plain read of the context, which the verifier allows.
    unsafe { (*skb(ctx)).ingress_ifindex }
}

/// What the checks learnt of the (inner) IPv4 or IPv6 packet.
#[derive(Clone, Copy)]
pub(crate) struct Ip {
    /// IPv6 (else IPv4).
    pub(crate) v6: bool,
    /// IPv4 addresses (network byte order); 0 for IPv6, whose addresses
    /// only the checks need.
    pub(crate) saddr: u32,
    pub(crate) daddr: u32,
    /// TTL or hop limit.
    pub(crate) ttl: u8,
    /// IPv4 protocol or IPv6 next header (TCP or UDP once checked).
    pub(crate) l4proto: u8,
    /// IPv4 TOS or IPv6 traffic class (its low two bits are ECN either way).
    pub(crate) tos: u8,
    /// The IP packet's length, header included.
    pub(crate) tot_len: u32,
    /// IP + L4 header length: with the GSO size, one segment's length.
    pub(crate) hdr_len: u32,
}

impl Ip {
    /// What one packet on the wire carries: the whole packet, or one
    /// segment of a GSO aggregate. Routes' and devices' MTUs must take it.
    #[inline(always)]
    pub(crate) fn wire_len(&self, ctx: &TcContext) -> u32 {
        // SAFETY: a plain read of the context.
        let gso_size = unsafe { (*skb(ctx)).gso_size };
        if gso_size != 0 {
            self.hdr_len + gso_size
        } else {
            self.tot_len
        }
    }
}

/// The connection a packet belongs to, as far as the checks parsed it:
/// what a flow event names and `mycni_flow_seen` is keyed by (with the
/// program's `FlowSource`). Zeroed before the checks; `family` stays 0 for
/// a packet whose IP header was never read (not IP, truncated, options),
/// which then gets no event. 8-aligned: hashed and compared as words.
#[repr(C, align(8))]
pub(crate) struct FlowKey {
    /// Network byte order; IPv4 in the first 4 bytes, the rest 0.
    pub(crate) src: [u8; 16],
    pub(crate) dst: [u8; 16],
    /// Host byte order; 0 without ports.
    pub(crate) sport: u16,
    pub(crate) dport: u16,
    pub(crate) proto: u8,
    /// 4 or 6; 0: not parsed.
    pub(crate) family: u8,
    /// `FlowSource`, set when the event is considered.
    pub(crate) source: u8,
    pub(crate) _pad: u8,
}

/// [`FlowKey`] and what belongs to the packet rather than the connection.
#[repr(C)]
pub(crate) struct Tuple {
    pub(crate) key: FlowKey,
    /// The TCP flags byte; 0 otherwise.
    pub(crate) tcp_flags: u8,
    pub(crate) _pad: [u8; 7],
}

impl Tuple {
    /// Records an IP header's addresses and protocol (`N` = 4: IPv4).
    #[inline(always)]
    pub(crate) fn set_l3<const N: usize>(&mut self, h: &L3<N>) {
        // Through fixed-size arrays: the verifier wants constant offsets.
        if N == 4 {
            self.key.src[..4].copy_from_slice(&h.addrs.src[..4]);
            self.key.dst[..4].copy_from_slice(&h.addrs.dst[..4]);
            self.key.family = 4;
        } else {
            self.key.src[..N].copy_from_slice(&h.addrs.src);
            self.key.dst[..N].copy_from_slice(&h.addrs.dst);
            self.key.family = 6;
        }
        self.key.proto = h.l4proto;
    }

    /// Records the ports, as the word on the wire.
    #[inline(always)]
    fn set_ports(&mut self, ports: u32) {
        let b = ports.to_ne_bytes();
        self.key.sport = u16::from_be_bytes([b[0], b[1]]);
        self.key.dport = u16::from_be_bytes([b[2], b[3]]);
    }

    /// For a packet refused before [`l4`] read its header (`why`): the
    /// ports and TCP flags behind the IP header at `l4`, read only with
    /// flow events on (a copy, which leaves the skb as it is). A header
    /// shorter than that makes the packet an unparsed one.
    #[inline(always)]
    pub(crate) fn peek_l4(
        &mut self,
        ctx: &TcContext,
        cfg: &DpConfig,
        l4: usize,
        why: DpPath,
    ) -> DpPath {
        if cfg.flags & CFG_FLOW_EVENTS == 0 {
            return why;
        }
        // Read in place when the headers are in the linear area, as they
        // almost always are: a copy by helper costs tens of ns, on what may
        // be every packet of a Service's connections. Copied when not.
        let (data, end) = (ctx.data(), ctx.data_end());
        // SAFETY (raw reads): in range, checked against data_end as the
        // verifier requires; reads are unaligned-safe.
        let read = match self.key.proto {
            IPPROTO_TCP if data + l4 + TCP_FLAGS_END <= end => Some(unsafe {
                (
                    ((data + l4) as *const u32).read_unaligned(),
                    *((data + l4 + 13) as *const u8),
                )
            }),
            IPPROTO_TCP => ctx
                .load::<[u8; TCP_FLAGS_END]>(l4)
                .ok()
                .map(|h| (u32::from_ne_bytes([h[0], h[1], h[2], h[3]]), h[13])),
            IPPROTO_UDP if data + l4 + 4 <= end => {
                Some((unsafe { ((data + l4) as *const u32).read_unaligned() }, 0))
            }
            IPPROTO_UDP => ctx.load::<u32>(l4).ok().map(|p| (p, 0)),
            _ => return why,
        };
        match read {
            Some((ports, flags)) => {
                self.set_ports(ports);
                self.tcp_flags = flags;
            }
            // Shorter than its ports: a truncated packet, named by none.
            None => self.key.family = 0,
        }
        why
    }
}

/// An IP header's addresses, source then destination, `N` bytes each, in
/// network byte order. Aligned for the conntrack gate, which reads them as
/// 32-bit words (the verifier wants aligned stack reads).
#[derive(Clone, Copy)]
#[repr(C, align(4))]
pub(crate) struct Addrs<const N: usize> {
    pub(crate) src: [u8; N],
    pub(crate) dst: [u8; N],
}

/// The IPv4 or IPv6 header at `l3`, read and found plain: no options,
/// fragments or extension headers, lengths within the skb.
pub(crate) struct L3<const N: usize> {
    pub(crate) addrs: Addrs<N>,
    /// TTL or hop limit.
    pub(crate) ttl: u8,
    /// Protocol or next header (not yet checked to be TCP or UDP).
    pub(crate) l4proto: u8,
    /// TOS or traffic class.
    pub(crate) tos: u8,
    /// The IP packet's length, header included.
    pub(crate) tot_len: u32,
}

/// [`L3`] for IPv4 at `l3` (IPv4 said by the ethertype).
#[inline(always)]
pub(crate) fn ipv4(ctx: &TcContext, l3: usize) -> Result<L3<4>, DpPath> {
    let (data, _) = linear(ctx, l3 + IP_HLEN).ok_or(DpPath::KernelTruncated)?;
    let ip = data + l3;
    // SAFETY (all raw reads below): `linear` checked the range against
    // data_end, as the verifier requires; reads are unaligned-safe.
    let vihl = unsafe { *(ip as *const u8) };
    if vihl >> 4 != 4 {
        return Err(DpPath::KernelNotIpv4);
    }
    if vihl & 0x0f != 5 {
        // ihl < 5 is malformed, > 5 carries options: both the kernel's.
        return Err(if vihl & 0x0f < 5 {
            DpPath::KernelTruncated
        } else {
            DpPath::KernelIpOptionsOrFragment
        });
    }
    let tos = unsafe { *((ip + 1) as *const u8) };
    let tot_len = u16::from_be(unsafe { ((ip + 2) as *const u16).read_unaligned() }) as u32;
    // tot_len 0 is IPv4 BIG TCP; a length past the skb is a lie. Both: doubt.
    if (tot_len as usize) < IP_HLEN || tot_len + l3 as u32 > ctx.len() {
        return Err(DpPath::KernelTruncated);
    }
    let frag = u16::from_be(unsafe { ((ip + 6) as *const u16).read_unaligned() });
    if frag & IP_MF_OFFSET != 0 {
        return Err(DpPath::KernelIpOptionsOrFragment);
    }
    Ok(L3 {
        ttl: unsafe { *((ip + 8) as *const u8) },
        l4proto: unsafe { *((ip + 9) as *const u8) },
        tos,
        tot_len,
        addrs: Addrs {
            src: unsafe { ((ip + 12) as *const [u8; 4]).read_unaligned() },
            dst: unsafe { ((ip + 16) as *const [u8; 4]).read_unaligned() },
        },
    })
}

/// [`L3`] for IPv6 at `l3`: the fixed 40-byte header followed directly by
/// TCP or UDP. Neighbour discovery, link-local and multicast traffic and
/// anything behind an extension header are the kernel's.
#[inline(always)]
pub(crate) fn ipv6(ctx: &TcContext, l3: usize) -> Result<L3<16>, DpPath> {
    let l4 = l3 + IP6_HLEN;
    let (data, _) = linear(ctx, l4).ok_or(DpPath::KernelTruncated)?;
    let ip = data + l3;
    // SAFETY (all raw reads below): `linear` checked the range against
    // data_end, as the verifier requires; reads are unaligned-safe.
    let vtc = unsafe { ((ip) as *const [u8; 2]).read_unaligned() };
    if vtc[0] >> 4 != 6 {
        return Err(DpPath::KernelNotIpv4);
    }
    let tos = (vtc[0] << 4) | (vtc[1] >> 4);
    let payload_len = u16::from_be(unsafe { ((ip + 4) as *const u16).read_unaligned() }) as u32;
    // Payload length 0 is a jumbogram or IPv6 BIG TCP; a length past the
    // skb is a lie. Both: doubt.
    if payload_len == 0 || payload_len + (l4 as u32) > ctx.len() {
        return Err(DpPath::KernelTruncated);
    }
    let nexthdr = unsafe { *((ip + 6) as *const u8) };
    let hop = unsafe { *((ip + 7) as *const u8) };
    // Read as 32-bit words, which keeps the stack copy aligned.
    let words: [u32; 8] = unsafe { ((ip + 8) as *const [u32; 8]).read_unaligned() };
    // SAFETY: plain bytes reinterpreted, same size (`Addrs` is repr(C)).
    let addrs: Addrs<16> = unsafe { core::mem::transmute(words) };

    // Neighbour discovery first, whatever its addresses: the kernel's
    // neighbour tables live on it.
    if nexthdr == IPPROTO_ICMPV6 {
        let (data, _) = linear(ctx, l4 + 1).ok_or(DpPath::KernelTruncated)?;
        let icmp_type = unsafe { *((data + l4) as *const u8) };
        if (ND_ROUTER_SOLICIT..=ND_REDIRECT).contains(&icmp_type) {
            return Err(DpPath::KernelIpv6Nd);
        }
    }
    if addrs.dst[0] == 0xff {
        return Err(DpPath::KernelIpv6Multicast);
    }
    let link_local = |a: &[u8; 16]| a[0] == 0xfe && a[1] & 0xc0 == 0x80;
    if link_local(&addrs.src) || link_local(&addrs.dst) {
        return Err(DpPath::KernelIpv6LinkLocal);
    }
    if is_ext_header(nexthdr) {
        return Err(DpPath::KernelIpOptionsOrFragment);
    }
    Ok(L3 {
        addrs,
        ttl: hop,
        l4proto: nexthdr,
        tos,
        tot_len: IP6_HLEN as u32 + payload_len,
    })
}

/// IPv6 next-header values that are extension headers (RFC 8200 and the
/// IANA registry), not an upper layer.
#[inline(always)]
fn is_ext_header(nexthdr: u8) -> bool {
    matches!(
        nexthdr,
        0 | 43 | 44 | 50 | 51 | 60 | 135 | 139 | 140 | 253 | 254
    )
}

/// What [`l4`] read of a TCP or UDP header.
pub(crate) struct L4 {
    /// The conntrack timeout to renew for this protocol.
    pub(crate) timeout_ms: u32,
    /// The L4 header's length.
    pub(crate) hlen: u32,
    /// Source and destination port, as the 32-bit word on the wire.
    pub(crate) ports: u32,
}

/// The TCP or UDP header at `l4`, of an IP payload `l4_len` bytes long,
/// its ports and TCP flags also recorded in `t`. TCP SYN, FIN and RST are
/// the kernel's, so conntrack sees every connection open and close.
#[inline(always)]
pub(crate) fn l4(
    ctx: &TcContext,
    cfg: &DpConfig,
    l4: usize,
    l4_len: u32,
    l4proto: u8,
    t: &mut Tuple,
) -> Result<L4, DpPath> {
    let (timeout_ms, hlen, ports) = match l4proto {
        IPPROTO_TCP => {
            let (data, _) = linear(ctx, l4 + TCP_HLEN).ok_or(DpPath::KernelTruncated)?;
            // SAFETY (raw reads): in range, checked by `linear`.
            // The TCP header must lie inside the IP packet, not in padding
            // after it (the kernel would trim and drop such a segment).
            let doff = unsafe { *((data + l4 + 12) as *const u8) } >> 4;
            if (l4_len as usize) < TCP_HLEN || doff < 5 {
                return Err(DpPath::KernelTruncated);
            }
            let ports = unsafe { ((data + l4) as *const u32).read_unaligned() };
            let flags = unsafe { *((data + l4 + 13) as *const u8) };
            // Recorded before the control check: a SYN's event is the
            // connection's first.
            t.set_ports(ports);
            t.tcp_flags = flags;
            if flags & (TCP_SYN | TCP_FIN | TCP_RST) != 0 {
                return Err(DpPath::KernelTcpControl);
            }
            (cfg.tcp_timeout_ms, u32::from(doff) * 4, ports)
        }
        IPPROTO_UDP => {
            if (l4_len as usize) < UDP_HLEN {
                return Err(DpPath::KernelTruncated);
            }
            let (data, _) = linear(ctx, l4 + UDP_HLEN).ok_or(DpPath::KernelTruncated)?;
            // SAFETY: in range, checked by `linear`.
            let ports = unsafe { ((data + l4) as *const u32).read_unaligned() };
            t.set_ports(ports);
            (cfg.udp_timeout_ms, UDP_HLEN as u32, ports)
        }
        _ => return Err(DpPath::KernelNotTcpUdp),
    };
    Ok(L4 {
        timeout_ms,
        hlen,
        ports,
    })
}

/// One's complement sum of an IPv4 header (RFC 1071): 0 over a header
/// whose checksum is right, the checksum over one whose field is 0.
#[inline(always)]
pub(crate) fn ip_checksum(h: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut i = 0;
    while i + 1 < h.len() {
        sum += u32::from(u16::from_be_bytes([h[i], h[i + 1]]));
        i += 2;
    }
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}
