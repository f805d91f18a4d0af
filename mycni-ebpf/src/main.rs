//! mycni tc programs: the fast path.
//!
//! Three thin entry points, named by where packets come from:
//! - `mycni_from_pod`, on ingress of every pod's host-side veth: a packet to
//!   a pod on another node is wrapped in VXLAN by the program itself, byte
//!   for byte what `vxlan.1` would send, and sent out of the underlay (next
//!   hop from `bpf_fib_lookup`); what the program cannot encapsulate safely
//!   (too big for the route's MTU, an unusual route, a GSO shape the kernel
//!   refuses) is handed to `vxlan.1` instead, counted by reason. A packet to
//!   a pod on this node goes straight into that pod with `bpf_redirect_peer`.
//! - `mycni_from_underlay`, on ingress of the underlay device: VXLAN sent to
//!   this host by a known peer, for a pod on this node, is unwrapped and
//!   handed straight to the pod. Everything else goes on to the kernel (and
//!   `vxlan.1`) untouched.
//! - `mycni_from_vxlan`, on ingress of `vxlan.1` and `vxlan6.1`: what the
//!   kernel decapsulated (peers without the fast path, whatever the
//!   underlay program left alone, and everything over the IPv6 underlay)
//!   goes straight into the pod.
//!
//! Only flows the kernel's conntrack already holds as established and not
//! NATed take the fast path (the gate in c/ct_gate.c); TCP SYN, FIN and RST
//! never do, so conntrack sees every connection open and close. Forwarded
//! packets get their TTL decremented and IP checksum fixed, like a router.
//!
//! IPv4 and IPv6 take the same paths by the same rules; IPv6 pods are keyed
//! in maps of their own (`mycni_local6`, `mycni_remote6`) and reach other
//! nodes over the same IPv4 underlay, the outer headers exactly those of an
//! IPv4 inner packet. Only the fixed IPv6 header directly followed by TCP
//! or UDP is fast-pathed: extension headers, neighbour discovery, link-local
//! and multicast traffic stay with the kernel. Direct routing carries IPv4
//! only (an IPv4 underlay cannot carry IPv6 unencapsulated).
//!
//! Peers over the IPv6 underlay (`REMOTE_VXLAN6`) are reached as the v1
//! fast path reached every peer: the frame, addressed to the peer's VTEP
//! MAC, is handed to `vxlan6.1`, whose FDB sends it in an IPv6 outer
//! header. The programs build no IPv6 outer header themselves: IPv6 makes
//! the outer UDP checksum mandatory (RFC 8200 8.1), over the whole inner
//! frame, and `bpf_skb_adjust_room` marks a GSO aggregate
//! `SKB_GSO_UDP_TUNNEL`, not `_CSUM`, so no segment would get its own.
//!
//! Every packet a program sees is counted exactly once in `mycni_counters`,
//! under the path it took or the reason it was left to the kernel, in the
//! row of its address family (`DpFamily`: on the underlay, the inner one of
//! VXLAN the program looks into). Anything
//! the program is not sure about returns `TCX_NEXT`, untouched, so the
//! kernel's routes, ARP and FDB (and other tools' programs) decide.
#![no_std]
#![no_main]

use aya_ebpf::{
    EbpfContext,
    bindings::{
        __sk_buff, BPF_F_ADJ_ROOM_DECAP_L3_IPV6, BPF_F_ADJ_ROOM_ENCAP_L2_ETH,
        BPF_F_ADJ_ROOM_ENCAP_L3_IPV4, BPF_F_ADJ_ROOM_ENCAP_L4_UDP, BPF_F_ADJ_ROOM_FIXED_GSO,
        BPF_F_RECOMPUTE_CSUM, BPF_FIB_LKUP_RET_FRAG_NEEDED, BPF_FIB_LKUP_RET_NO_NEIGH,
        BPF_FIB_LKUP_RET_SUCCESS, BPF_FIB_LOOKUP_OUTPUT, TC_ACT_REDIRECT,
        bpf_adj_room_mode::BPF_ADJ_ROOM_MAC, bpf_fib_lookup as FibParams,
    },
    btf_maps::{Array, HashMap, LpmTrie, PerCpuArray, lpm_trie::Key},
    helpers::generated::{
        bpf_check_mtu, bpf_fib_lookup, bpf_get_hash_recalc, bpf_get_prandom_u32, bpf_redirect,
        bpf_redirect_neigh, bpf_redirect_peer,
    },
    macros::{btf_map, classifier},
    programs::TcContext,
};
use aya_log_ebpf::debug;
use mycni_common::{
    CFG_TC_DECAP, CFG_TC_ENCAP, COUNTERS_LEN, DpConfig, DpFamily, DpPath, LOCAL_MAX, LocalEndpoint,
    PEERS_MAX, PathCounter, PeerNode, REMOTE_DIRECT, REMOTE_MAX, REMOTE_VXLAN6, RemoteNode,
    TCX_NEXT, VXLAN_OVERHEAD, counter_index,
};

#[btf_map(name = "mycni_counters")]
static COUNTERS: PerCpuArray<PathCounter, { COUNTERS_LEN as usize }> = PerCpuArray::new();

#[btf_map(name = "mycni_config")]
static CONFIG: Array<DpConfig, 1> = Array::new();

/// Peer podCIDRs, mirrored from the routes the agent programs on `vxlan.1`.
#[btf_map(name = "mycni_remote")]
static REMOTE: LpmTrie<[u8; 4], RemoteNode, { REMOTE_MAX as usize }> = LpmTrie::new();

/// Pods on this node, mirrored from the plugin's host routes and veths.
#[btf_map(name = "mycni_local")]
static LOCAL: HashMap<[u8; 4], LocalEndpoint, { LOCAL_MAX as usize }> = HashMap::new();

/// Peer Nodes by host IP, mirrored from the FDB entries on `vxlan.1`: the
/// only hosts whose VXLAN the underlay program unwraps.
#[btf_map(name = "mycni_peers")]
static PEERS: HashMap<[u8; 4], PeerNode, { PEERS_MAX as usize }> = HashMap::new();

/// Peer IPv6 podCIDRs, mirrored from the agent's IPv6 routes on `vxlan.1`
/// (the same peers, reached over the same IPv4 underlay) and on `vxlan6.1`
/// (peers over the IPv6 underlay, flagged `REMOTE_VXLAN6`).
#[btf_map(name = "mycni_remote6")]
static REMOTE6: LpmTrie<[u8; 16], RemoteNode, { REMOTE_MAX as usize }> = LpmTrie::new();

/// Pods on this node by IPv6 address, mirrored from the plugin's IPv6 host
/// routes and veths.
#[btf_map(name = "mycni_local6")]
static LOCAL6: HashMap<[u8; 16], LocalEndpoint, { LOCAL_MAX as usize }> = HashMap::new();

const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const IP_HLEN: usize = 20;
const IP6_HLEN: usize = 40;
const TCP_HLEN: usize = 20;
const UDP_HLEN: usize = 8;
const VXLAN_HLEN: usize = 8;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const IPPROTO_ICMPV6: u8 = 58;
/// ICMPv6 types of neighbour discovery (RFC 4861): router solicitation,
/// router and neighbour advertisement and solicitation, redirect.
const ND_ROUTER_SOLICIT: u8 = 133;
const ND_REDIRECT: u8 = 137;
const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
/// More-fragments flag and fragment offset; the DF bit is fine.
const IP_MF_OFFSET: u16 = 0x3fff;
const PACKET_HOST: u32 = 0;
/// Bytes in front of the inner IPv4 header of a VXLAN frame on the wire:
/// outer Ethernet + the overhead (outer IPv4, UDP, VXLAN, inner Ethernet).
const ENCAP: usize = ETH_HLEN + VXLAN_OVERHEAD as usize;
/// VXLAN flags byte with only I (a valid VNI) set, as `vxlan.1` sends and
/// requires without extensions.
const VXLAN_FLAG_I: u8 = 0x08;
const AF_INET: u8 = 2;

// Keep in step with c/ct_gate.c.
const CT_ESTABLISHED: i32 = 1;
const CT_NAT: i32 = 2;

unsafe extern "C" {
    /// c/ct_gate.c: the conntrack lookup (kfuncs), linked in as bitcode.
    fn mycni_ct_gate(
        skb: *mut core::ffi::c_void,
        saddr: u32,
        daddr: u32,
        ports: u32,
        l4proto: u32,
        timeout_ms: u32,
    ) -> i32;
    /// The same for IPv6: `addrs` is source then destination, 32 bytes.
    fn mycni_ct_gate6(
        skb: *mut core::ffi::c_void,
        addrs: *const u32,
        ports: u32,
        l4proto: u32,
        timeout_ms: u32,
    ) -> i32;
}

#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
enum From {
    Pod,
    /// Decapsulated by the kernel on `vxlan.1` or `vxlan6.1`.
    Vxlan,
    /// VXLAN on the underlay (inspected behind the outer headers).
    Underlay,
    /// Unencapsulated on the underlay, from a direct-routed peer.
    Direct,
}

#[inline(always)]
fn count(family: DpFamily, path: DpPath, bytes: u32) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter_index(family, path)) {
        // SAFETY: the slot is this CPU's own; no other program instance
        // touches it concurrently, so plain adds are race-free.
        unsafe {
            (*slot).packets += 1;
            (*slot).bytes += u64::from(bytes);
        }
    }
}

/// Traffic from a pod, on ingress of its host-side veth.
#[classifier]
fn mycni_from_pod(ctx: TcContext) -> i32 {
    run(&ctx, From::Pod)
}

/// Decapsulated traffic from other nodes, on ingress of `vxlan.1` and
/// `vxlan6.1`.
#[classifier]
fn mycni_from_vxlan(ctx: TcContext) -> i32 {
    run(&ctx, From::Vxlan)
}

/// Everything that reaches this node over the underlay, on its ingress.
#[classifier]
fn mycni_from_underlay(ctx: TcContext) -> i32 {
    run(&ctx, From::Underlay)
}

#[inline(always)]
fn run(ctx: &TcContext, from: From) -> i32 {
    // Counted before any rewrite, so bytes are what arrived.
    let len = ctx.len();
    // Also before any rewrite: the outer family, which `decap` replaces by
    // the inner one once it looks into a packet (see `DpFamily`).
    let mut family = family_at(ctx, 0);
    let (path, verdict) = match CONFIG.get(0) {
        Some(cfg) if cfg.vxlan_ifindex != 0 || cfg.vxlan6_ifindex != 0 => match from {
            From::Underlay => from_underlay(ctx, cfg, &mut family),
            // The same checks on vxlan6.1 as on vxlan.1, counted apart by
            // the device it arrived on. (A `From` of its own would inline
            // `forward` twice into this program.)
            From::Vxlan => match forward(ctx, from, cfg) {
                (DpPath::FastDecap, v)
                    if cfg.vxlan6_ifindex != 0 && ingress(ctx) == cfg.vxlan6_ifindex =>
                {
                    (DpPath::FastVxlan6Decap, v)
                }
                r => r,
            },
            _ => forward(ctx, from, cfg),
        },
        _ => (DpPath::KernelNoConfig, TCX_NEXT),
    };
    count(family, path, len);
    // Off unless the agent runs with --ebpf-log: AYA_LOG_LEVEL is then a
    // load-time 0 and the verifier prunes this call from the hot path.
    debug!(
        ctx,
        "from {} path {} len {} verdict {}", from as u32, path as u32, len, verdict
    );
    verdict
}

/// The family the Ethernet header at `off` and the IP version behind it
/// declare: IPv4 or IPv6 only when both agree, as `inspect` requires, so
/// `KernelNotIpv4` is always `Other`.
#[inline(always)]
fn family_at(ctx: &TcContext, off: usize) -> DpFamily {
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
fn linear(ctx: &TcContext, n: usize) -> Option<(usize, usize)> {
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
fn skb(ctx: &TcContext) -> *const __sk_buff {
    ctx.as_ptr() as *const __sk_buff
}

/// Where a packet goes when the fast path takes it.
enum Next {
    Remote(RemoteNode),
    Local(LocalEndpoint),
}

/// What the checks learnt of the (inner) IPv4 or IPv6 packet.
#[derive(Clone, Copy)]
struct Ip {
    /// IPv6 (else IPv4).
    v6: bool,
    /// IPv4 addresses (network byte order); 0 for IPv6, whose addresses
    /// only the checks need.
    saddr: u32,
    daddr: u32,
    /// TTL or hop limit.
    ttl: u8,
    /// IPv4 protocol or IPv6 next header (TCP or UDP once checked).
    l4proto: u8,
    /// IPv4 TOS or IPv6 traffic class (its low two bits are ECN either way).
    tos: u8,
    /// The IP packet's length, header included.
    tot_len: u32,
    /// IP + L4 header length: with the GSO size, one segment's length.
    hdr_len: u32,
}

/// The checks every fast-pathed packet passes, on the IPv4 or IPv6 packet
/// behind an Ethernet header at `OFF` (0 as it arrived from a pod or
/// `vxlan.1`, the VXLAN overhead for what is still wrapped on the
/// underlay). `peer` is the outer source of a wrapped packet: its inner
/// source must lie in that peer's podCIDR. Reads only: a packet that fails
/// goes on untouched.
#[inline(always)]
fn inspect<const OFF: usize>(
    ctx: &TcContext,
    from: From,
    cfg: &DpConfig,
    peer: u32,
) -> Result<(Ip, Next), DpPath> {
    let (data, _) = linear(ctx, OFF + ETH_HLEN).ok_or(DpPath::KernelTruncated)?;
    // SAFETY: `linear` checked the range against data_end, as the verifier
    // requires; the read is unaligned-safe.
    let proto = u16::from_be(unsafe { ((data + OFF + 12) as *const u16).read_unaligned() });
    match proto {
        ETH_P_IP => inspect4::<OFF>(ctx, from, cfg, peer),
        ETH_P_IPV6 => inspect6::<OFF>(ctx, from, cfg, peer),
        _ => Err(DpPath::KernelNotIpv4),
    }
}

/// [`inspect`] for IPv4.
#[inline(always)]
fn inspect4<const OFF: usize>(
    ctx: &TcContext,
    from: From,
    cfg: &DpConfig,
    peer: u32,
) -> Result<(Ip, Next), DpPath> {
    let l3 = OFF + ETH_HLEN;
    let l4 = l3 + IP_HLEN;
    let (data, _) = linear(ctx, l4).ok_or(DpPath::KernelTruncated)?;
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
    let ttl = unsafe { *((ip + 8) as *const u8) };
    let l4proto = unsafe { *((ip + 9) as *const u8) };
    let saddr = unsafe { ((ip + 12) as *const u32).read_unaligned() };
    let daddr_bytes = unsafe { ((ip + 16) as *const [u8; 4]).read_unaligned() };

    let next = next_hop(&LOCAL, &REMOTE, from, &daddr_bytes)?;
    if ttl <= 1 {
        return Err(DpPath::KernelTtl);
    }
    let (timeout_ms, l4_hlen, ports) = l4_check(ctx, cfg, l4, tot_len - IP_HLEN as u32, l4proto)?;
    check_source(ctx, &LOCAL, &REMOTE, from, peer, &saddr.to_ne_bytes())?;
    let daddr = u32::from_ne_bytes(daddr_bytes);
    // SAFETY: the gate only reads the tuple and the conntrack entry, and
    // releases the reference it takes.
    let ct = unsafe {
        mycni_ct_gate(
            ctx.as_ptr(),
            saddr,
            daddr,
            ports,
            u32::from(l4proto),
            timeout_ms,
        )
    };
    ct_verdict(ct)?;
    Ok((
        Ip {
            v6: false,
            saddr,
            daddr,
            ttl,
            l4proto,
            tos,
            tot_len,
            hdr_len: IP_HLEN as u32 + l4_hlen,
        },
        next,
    ))
}

/// A family's pod map (`LOCAL`, `LOCAL6`), keyed by an `N`-byte address.
type LocalMap<const N: usize> = HashMap<[u8; N], LocalEndpoint, { LOCAL_MAX as usize }>;
/// A family's podCIDR trie (`REMOTE`, `REMOTE6`), keyed by an `N`-byte address.
type RemoteMap<const N: usize> = LpmTrie<[u8; N], RemoteNode, { REMOTE_MAX as usize }>;

/// Where `dst` goes: a pod of this node, or (only from a pod) a pod of a
/// peer; anything else is the kernel's.
#[inline(always)]
fn next_hop<const N: usize>(
    local: &LocalMap<N>,
    remote: &RemoteMap<N>,
    from: From,
    dst: &[u8; N],
) -> Result<Next, DpPath> {
    // SAFETY: map values are only read here; the agent replaces entries
    // whole, so a torn read at worst sends one packet to a just-removed pod.
    match unsafe { local.get(dst) } {
        Some(ep) => Ok(Next::Local(*ep)),
        None if from == From::Pod => match remote.get(&Key::new((N * 8) as u32, *dst)) {
            Some(node) => Ok(Next::Remote(*node)),
            None => Err(DpPath::KernelUnknownDest),
        },
        None => Err(DpPath::KernelUnknownDest),
    }
}

/// Whether `src` may send what arrived `from` there.
#[inline(always)]
fn check_source<const N: usize>(
    ctx: &TcContext,
    local: &LocalMap<N>,
    remote: &RemoteMap<N>,
    from: From,
    peer: u32,
    src: &[u8; N],
) -> Result<(), DpPath> {
    match from {
        // A pod may only fast-path packets that carry its own address: a
        // spoofed source could otherwise ride another pod's established flow
        // past conntrack. skb_iif is the host veth the packet arrived on.
        From::Pod => {
            // SAFETY: read-only map lookup, as in `next_hop`.
            match unsafe { local.get(src) } {
                Some(ep) if ep.ifindex == ingress(ctx) => Ok(()),
                _ => Err(DpPath::KernelSourceNotPod),
            }
        }
        // A peer speaks only for its own pods (and its vxlan.1 address, the
        // first of its podCIDR).
        From::Underlay => match remote.get(&Key::new((N * 8) as u32, *src)) {
            Some(node) if node.host_ip == peer => Ok(()),
            _ => Err(DpPath::KernelDecapInnerSource),
        },
        // Unencapsulated, the sender is known only by the inner source:
        // a pod of a peer the agent routes directly.
        From::Direct => match remote.get(&Key::new((N * 8) as u32, *src)) {
            Some(node) if node.flags & REMOTE_DIRECT != 0 => Ok(()),
            _ => Err(DpPath::KernelDecapInnerSource),
        },
        From::Vxlan => Ok(()),
    }
}

/// [`inspect`] for IPv6: the fixed 40-byte header followed directly by TCP
/// or UDP. Neighbour discovery, link-local and multicast traffic and
/// anything behind an extension header are the kernel's.
#[inline(always)]
fn inspect6<const OFF: usize>(
    ctx: &TcContext,
    from: From,
    cfg: &DpConfig,
    peer: u32,
) -> Result<(Ip, Next), DpPath> {
    let l3 = OFF + ETH_HLEN;
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
    // Source and destination, as 32-bit words for the conntrack tuple (the
    // stack copy keeps them aligned, as the verifier wants of stack reads).
    let addrs: [u32; 8] = unsafe { ((ip + 8) as *const [u32; 8]).read_unaligned() };
    // SAFETY: plain bytes reinterpreted, same size.
    let src: [u8; 16] = unsafe { core::mem::transmute([addrs[0], addrs[1], addrs[2], addrs[3]]) };
    let dst: [u8; 16] = unsafe { core::mem::transmute([addrs[4], addrs[5], addrs[6], addrs[7]]) };

    // Neighbour discovery first, whatever its addresses: the kernel's
    // neighbour tables live on it.
    if nexthdr == IPPROTO_ICMPV6 {
        let (data, _) = linear(ctx, l4 + 1).ok_or(DpPath::KernelTruncated)?;
        let icmp_type = unsafe { *((data + l4) as *const u8) };
        if (ND_ROUTER_SOLICIT..=ND_REDIRECT).contains(&icmp_type) {
            return Err(DpPath::KernelIpv6Nd);
        }
    }
    if dst[0] == 0xff {
        return Err(DpPath::KernelIpv6Multicast);
    }
    let link_local = |a: &[u8; 16]| a[0] == 0xfe && a[1] & 0xc0 == 0x80;
    if link_local(&src) || link_local(&dst) {
        return Err(DpPath::KernelIpv6LinkLocal);
    }
    if is_ext_header(nexthdr) {
        return Err(DpPath::KernelIpOptionsOrFragment);
    }

    let next = next_hop(&LOCAL6, &REMOTE6, from, &dst)?;
    if hop <= 1 {
        return Err(DpPath::KernelTtl);
    }
    let (timeout_ms, l4_hlen, ports) = l4_check(ctx, cfg, l4, payload_len, nexthdr)?;
    // For a pod, also what the kernel's anti-spoofing rule (the agent's
    // nftables table) would check, which a redirect skips.
    check_source(ctx, &LOCAL6, &REMOTE6, from, peer, &src)?;
    // SAFETY: the gate reads the 32 address bytes and the conntrack entry,
    // and releases the reference it takes.
    let ct = unsafe {
        mycni_ct_gate6(
            ctx.as_ptr(),
            addrs.as_ptr(),
            ports,
            u32::from(nexthdr),
            timeout_ms,
        )
    };
    ct_verdict(ct)?;
    Ok((
        Ip {
            v6: true,
            saddr: 0,
            daddr: 0,
            ttl: hop,
            l4proto: nexthdr,
            tos,
            tot_len: IP6_HLEN as u32 + payload_len,
            hdr_len: IP6_HLEN as u32 + l4_hlen,
        },
        next,
    ))
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

/// The device a packet arrived on: a pod's host veth, or `vxlan.1` /
/// `vxlan6.1` for what the kernel decapsulated.
#[inline(always)]
fn ingress(ctx: &TcContext) -> u32 {
    // SAFETY: a plain read of the context, which the verifier allows.
    unsafe { (*skb(ctx)).ingress_ifindex }
}

/// The TCP or UDP header at `l4`, of an IP payload `l4_len` bytes long:
/// the conntrack timeout to renew, the L4 header length and the ports (as
/// the 32-bit word on the wire).
#[inline(always)]
fn l4_check(
    ctx: &TcContext,
    cfg: &DpConfig,
    l4: usize,
    l4_len: u32,
    l4proto: u8,
) -> Result<(u32, u32, u32), DpPath> {
    let (timeout_ms, l4_hlen) = match l4proto {
        IPPROTO_TCP => {
            let (data, _) = linear(ctx, l4 + TCP_HLEN).ok_or(DpPath::KernelTruncated)?;
            // SAFETY (raw reads): in range, checked by `linear`.
            // The TCP header must lie inside the IP packet, not in padding
            // after it (the kernel would trim and drop such a segment).
            let doff = unsafe { *((data + l4 + 12) as *const u8) } >> 4;
            if (l4_len as usize) < TCP_HLEN || doff < 5 {
                return Err(DpPath::KernelTruncated);
            }
            let flags = unsafe { *((data + l4 + 13) as *const u8) };
            if flags & (TCP_SYN | TCP_FIN | TCP_RST) != 0 {
                return Err(DpPath::KernelTcpControl);
            }
            (cfg.tcp_timeout_ms, u32::from(doff) * 4)
        }
        IPPROTO_UDP => {
            if (l4_len as usize) < UDP_HLEN || linear(ctx, l4 + UDP_HLEN).is_none() {
                return Err(DpPath::KernelTruncated);
            }
            (cfg.udp_timeout_ms, UDP_HLEN as u32)
        }
        _ => return Err(DpPath::KernelNotTcpUdp),
    };
    let (data, _) = linear(ctx, l4 + UDP_HLEN).ok_or(DpPath::KernelTruncated)?;
    // SAFETY: in range, checked by `linear`.
    let ports = unsafe { ((data + l4) as *const u32).read_unaligned() };
    Ok((timeout_ms, l4_hlen, ports))
}

/// The conntrack gate's answer as a path: established and not NATed, or the
/// reason the kernel must see the packet.
#[inline(always)]
fn ct_verdict(ct: i32) -> Result<(), DpPath> {
    match ct {
        CT_ESTABLISHED => Ok(()),
        CT_NAT => Err(DpPath::KernelNat),
        _ => Err(DpPath::KernelNotEstablished),
    }
}

/// Decrements the TTL or hop limit of the IP header at `l3`, like a router.
/// The IPv4 checksum covers TTL and protocol as one 16-bit word, so the
/// header's sum, and a CHECKSUM_COMPLETE skb's `csum` over it, stay as they
/// were. IPv6 has no header checksum: the hop limit's change must go into
/// `skb->csum` itself (BPF_F_RECOMPUTE_CSUM, a no-op unless the skb is
/// CHECKSUM_COMPLETE, as Cilium's ipv6_dec_hoplimit does), or the pod's
/// stack, pulling the header off a received packet, finds the transport
/// checksum wrong (a decapsulated IPv6 underlay's packets arrive so).
#[inline(always)]
fn dec_ttl(ctx: &TcContext, l3: usize, ip: &Ip) -> Result<(), DpPath> {
    if ip.v6 {
        return ctx
            .store(l3 + 7, &(ip.ttl - 1), BPF_F_RECOMPUTE_CSUM as u64)
            .map_err(|_| DpPath::KernelError);
    }
    let old = u16::from_be_bytes([ip.ttl, ip.l4proto]);
    let new = u16::from_be_bytes([ip.ttl - 1, ip.l4proto]);
    ctx.store(l3 + 8, &(ip.ttl - 1), 0)
        .and_then(|()| {
            ctx.l3_csum_replace(l3 + 10, u64::from(old.to_be()), u64::from(new.to_be()), 2)
        })
        .map_err(|_| DpPath::KernelError)
}

#[inline(always)]
fn set_macs(ctx: &TcContext, off: usize, dst: [u8; 6], src: [u8; 6]) -> Result<(), DpPath> {
    let mut macs = [0u8; 12];
    macs[..6].copy_from_slice(&dst);
    macs[6..].copy_from_slice(&src);
    ctx.store(off, &macs, 0).map_err(|_| DpPath::KernelError)
}

/// From a pod, or decapsulated by `vxlan.1`.
#[inline(always)]
fn forward(ctx: &TcContext, from: From, cfg: &DpConfig) -> (DpPath, i32) {
    let (ip, next) = match inspect::<0>(ctx, from, cfg, 0) {
        Ok(x) => x,
        Err(path) => return (path, TCX_NEXT),
    };
    let r = match next {
        Next::Local(ep) => deliver(ctx, from, &ip, &ep),
        Next::Remote(node) if node.flags & REMOTE_VXLAN6 != 0 => via_vxlan6(ctx, cfg, &ip, &node),
        // An IPv4 underlay cannot carry IPv6 unencapsulated; the agent marks
        // no IPv6 podCIDR direct, so this is a map the kernel does not back.
        Next::Remote(node) if node.flags & REMOTE_DIRECT != 0 && ip.v6 => {
            Err(DpPath::KernelDirectFib)
        }
        Next::Remote(node) if node.flags & REMOTE_DIRECT != 0 => direct(ctx, cfg, &ip),
        Next::Remote(node) => match encap_plan(ctx, cfg, &ip, &node) {
            Ok(plan) => encap(ctx, cfg, &ip, &node, &plan),
            Err(why) => via_vxlan(ctx, cfg, &ip, &node, why),
        },
    };
    match r {
        Ok(path) => (path, TC_ACT_REDIRECT),
        Err(path) => (path, TCX_NEXT),
    }
}

/// Into a pod on this node; the IP header is right behind Ethernet.
#[inline(always)]
fn deliver(ctx: &TcContext, from: From, ip: &Ip, ep: &LocalEndpoint) -> Result<DpPath, DpPath> {
    dec_ttl(ctx, ETH_HLEN, ip)?;
    set_macs(ctx, 0, ep.pod_mac, ep.host_mac)?;
    // A frame that arrived for the VTEP, the gateway or the host's MAC must
    // look addressed to the pod when it lands there.
    ctx.change_type(PACKET_HOST)
        .map_err(|_| DpPath::KernelError)?;
    // SAFETY: a helper call on a valid ifindex; it only sets the redirect.
    if unsafe { bpf_redirect_peer(ep.ifindex, 0) } != TC_ACT_REDIRECT as i64 {
        return Err(DpPath::KernelError);
    }
    Ok(match from {
        From::Pod => DpPath::FastLocal,
        From::Vxlan => DpPath::FastDecap,
        From::Underlay => DpPath::FastTcDecap,
        From::Direct => DpPath::FastDirectIn,
    })
}

/// To a remote pod through `vxlan.1`, whose FDB maps the peer's VTEP MAC to
/// its host: the kernel encapsulates. Counted under `why`.
#[inline(always)]
fn via_vxlan(
    ctx: &TcContext,
    cfg: &DpConfig,
    ip: &Ip,
    node: &RemoteNode,
    why: DpPath,
) -> Result<DpPath, DpPath> {
    // No vxlan.1 (a node with an IPv6 underlay only): then the kernel has
    // no route through it either, and the entry is one it does not back.
    if cfg.vxlan_ifindex == 0 {
        return Err(DpPath::KernelUnknownDest);
    }
    dec_ttl(ctx, ETH_HLEN, ip)?;
    set_macs(ctx, 0, node.vtep_mac, cfg.vtep_mac)?;
    // SAFETY: a helper call; it only sets the redirect target.
    if unsafe { bpf_redirect(cfg.vxlan_ifindex, 0) } != TC_ACT_REDIRECT as i64 {
        return Err(DpPath::KernelError);
    }
    Ok(why)
}

/// To a remote pod of a peer over the IPv6 underlay, through `vxlan6.1`,
/// whose FDB maps the peer's `vxlan6.1` MAC to its IPv6 host address: the
/// kernel encapsulates, in an IPv6 outer header.
#[inline(always)]
fn via_vxlan6(
    ctx: &TcContext,
    cfg: &DpConfig,
    ip: &Ip,
    node: &RemoteNode,
) -> Result<DpPath, DpPath> {
    // An entry ahead of the config (vxlan6.1 just gone): the kernel's.
    if cfg.vxlan6_ifindex == 0 {
        return Err(DpPath::KernelUnknownDest);
    }
    // The kernel's forwarding checks the packet against vxlan6.1's MTU and
    // answers "packet too big"; a redirect would skip that and hand
    // vxlan6.1 what the underlay cannot carry. Only the MTU the helper
    // reads back is used: its own verdict is on the whole skb (Ethernet
    // padding counted, any GSO aggregate passed), and BPF_MTU_CHK_SEGS
    // fails where the transport header is not set.
    let mut mtu: u32 = 0;
    // SAFETY: the helper reads the device's MTU and writes it to `mtu`.
    if unsafe { bpf_check_mtu(ctx.as_ptr(), cfg.vxlan6_ifindex, &mut mtu, 0, 0) } < 0 {
        // The device is gone (-ENODEV) under a config that names it.
        return Err(DpPath::KernelError);
    }
    // SAFETY: a plain read of the context.
    let gso_size = unsafe { (*skb(ctx)).gso_size };
    // What one packet on the wire carries, as in `encap_plan`.
    let seg = if gso_size != 0 {
        ip.hdr_len + gso_size
    } else {
        ip.tot_len
    };
    if seg > mtu {
        return Err(DpPath::KernelVxlan6Mtu);
    }
    dec_ttl(ctx, ETH_HLEN, ip)?;
    set_macs(ctx, 0, node.vtep_mac, cfg.vtep6_mac)?;
    // SAFETY: a helper call; it only sets the redirect target.
    if unsafe { bpf_redirect(cfg.vxlan6_ifindex, 0) } != TC_ACT_REDIRECT as i64 {
        return Err(DpPath::KernelError);
    }
    Ok(DpPath::FastVxlan6)
}

/// To a pod of a direct-routed peer: forwarded as the kernel would, by its
/// own route (`podCIDR via <host IP>` on the underlay) and neighbour
/// entry; anything but a plain success out of the underlay is the kernel's.
#[inline(always)]
fn direct(ctx: &TcContext, cfg: &DpConfig, ip: &Ip) -> Result<DpPath, DpPath> {
    // SAFETY: plain reads of the context.
    let (iif, gso_size) = unsafe { ((*skb(ctx)).ingress_ifindex, (*skb(ctx)).gso_size) };
    let seg = if gso_size != 0 {
        ip.hdr_len + gso_size
    } else {
        ip.tot_len
    };
    let mut slot = core::mem::MaybeUninit::<FibParams>::uninit();
    // SAFETY: all-zero is a valid bpf_fib_lookup (64 bytes, 4-aligned).
    let p = unsafe { zero_in_place(&mut slot) };
    p.family = AF_INET;
    p.l4_protocol = ip.l4proto;
    p.__bindgen_anon_1.tot_len = seg as u16;
    // From the pod's veth, as the kernel's forwarding sees the packet.
    p.ifindex = iif;
    p.__bindgen_anon_2.tos = ip.tos;
    p.__bindgen_anon_3.ipv4_src = ip.saddr;
    p.__bindgen_anon_4.ipv4_dst = ip.daddr;
    // SAFETY: the helper reads and fills `p`, of the size given.
    let rc = unsafe { bpf_fib_lookup(ctx.as_ptr(), p, core::mem::size_of::<FibParams>() as i32, 0) }
        as u32;
    if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
        || p.ifindex != cfg.underlay_ifindex
    {
        return Err(DpPath::KernelDirectFib);
    }
    dec_ttl(ctx, ETH_HLEN, ip)?;
    // SAFETY: helper calls; they only set the redirect target.
    let verdict = if rc == BPF_FIB_LKUP_RET_SUCCESS {
        // SAFETY: the helper filled the MACs on success.
        let (dmac, smac) = unsafe {
            (
                p.__bindgen_anon_6.__bindgen_anon_2.dmac,
                p.__bindgen_anon_6.__bindgen_anon_2.smac,
            )
        };
        set_macs(ctx, 0, dmac, smac)?;
        unsafe { bpf_redirect(p.ifindex, 0) }
    } else {
        unsafe { bpf_redirect_neigh(p.ifindex, core::ptr::null_mut(), 0, 0) }
    };
    if verdict != TC_ACT_REDIRECT as i64 {
        return Err(DpPath::KernelError);
    }
    Ok(DpPath::FastDirect)
}

/// How an encapsulated packet leaves: the underlay device, and the outer
/// MACs when the kernel already knows the next hop's (else the neighbour
/// subsystem resolves it).
struct Plan {
    ifindex: u32,
    macs: Option<([u8; 6], [u8; 6])>,
}

/// Whether the program may encapsulate this packet itself, and how it
/// leaves; else the reason to hand it to `vxlan.1`.
#[inline(always)]
fn encap_plan(ctx: &TcContext, cfg: &DpConfig, ip: &Ip, node: &RemoteNode) -> Result<Plan, DpPath> {
    if cfg.flags & CFG_TC_ENCAP == 0
        || cfg.underlay_ifindex == 0
        || cfg.host_ip == 0
        || node.host_ip == 0
    {
        return Err(DpPath::FastVxlanNoEncap);
    }
    // Outer IPv4 and UDP lengths are 16 bits; a GSO aggregate that would
    // overflow them is the kernel's to build (it writes 0, as for BIG TCP).
    if ip.tot_len + VXLAN_OVERHEAD > 0xffff {
        return Err(DpPath::FastVxlanGso);
    }
    // SAFETY: a plain read of the context.
    let gso_size = unsafe { (*skb(ctx)).gso_size };
    // What one packet on the wire carries: the route's MTU must take it.
    let inner = if gso_size != 0 {
        ip.hdr_len + gso_size
    } else {
        ip.tot_len
    };
    let mut slot = core::mem::MaybeUninit::<FibParams>::uninit();
    // SAFETY: all-zero is a valid bpf_fib_lookup (64 bytes, 4-aligned).
    let p = unsafe { zero_in_place(&mut slot) };
    p.family = AF_INET;
    p.l4_protocol = IPPROTO_UDP;
    p.dport = cfg.vxlan_port.to_be();
    p.__bindgen_anon_1.tot_len = (inner + VXLAN_OVERHEAD) as u16;
    p.ifindex = cfg.underlay_ifindex;
    p.__bindgen_anon_3.ipv4_src = cfg.host_ip;
    p.__bindgen_anon_4.ipv4_dst = node.host_ip;
    // From the sender's side, out of vxlan.1's `dev`: the lookup vxlan.1
    // itself makes for the outer packet.
    // SAFETY: the helper reads and fills `p`, of the size given.
    let rc = unsafe {
        bpf_fib_lookup(
            ctx.as_ptr(),
            p,
            core::mem::size_of::<FibParams>() as i32,
            BPF_FIB_LOOKUP_OUTPUT,
        )
    };
    let rc = rc as u32;
    if rc == BPF_FIB_LKUP_RET_FRAG_NEEDED {
        return Err(DpPath::FastVxlanMtu);
    }
    if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
        || p.ifindex != cfg.underlay_ifindex
    {
        return Err(DpPath::FastVxlanFib);
    }
    // SAFETY: reading the MAC member of the union; the helper filled it on
    // success (and it is plain bytes either way).
    let found = unsafe { p.__bindgen_anon_6.__bindgen_anon_2 };
    let macs = (rc == BPF_FIB_LKUP_RET_SUCCESS).then_some((found.dmac, found.smac));
    Ok(Plan {
        ifindex: p.ifindex,
        macs,
    })
}

/// `slot` zeroed with 4-byte stores, in place. A plain zero initialiser
/// (`[0u8; N]`, `mem::zeroed()`) of more than a few words compiles to a call
/// of the object's memset, a subprogram that stores one byte per loop turn
/// (64 turns for a bpf_fib_lookup, every packet); volatile stores are not
/// merged back into that call, and zeroing in place leaves no copy that
/// LLVM could turn into one.
///
/// SAFETY (caller): all-zero must be a valid `T`, whose size is a multiple
/// of 4 and alignment at least 4 (checked at compile time).
#[inline(always)]
unsafe fn zero_in_place<T>(slot: &mut core::mem::MaybeUninit<T>) -> &mut T {
    const { assert!(core::mem::size_of::<T>().is_multiple_of(4) && core::mem::align_of::<T>() >= 4) };
    let w = slot.as_mut_ptr() as *mut u32;
    let mut i = 0;
    while i < core::mem::size_of::<T>() / 4 {
        // SAFETY: in bounds of `slot`, and aligned (see above).
        unsafe { w.add(i).write_volatile(0) };
        i += 1;
    }
    // SAFETY: every byte is written; all-zero is valid by the caller.
    unsafe { slot.assume_init_mut() }
}

/// The headers `encap` puts in front of the packet, aligned for
/// [`zero_in_place`].
#[repr(C, align(8))]
struct Header([u8; ENCAP]);

/// One's complement sum of the outer IPv4 header (RFC 1071).
#[inline(always)]
fn ip_checksum(h: &[u8]) -> u16 {
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

/// Wraps the packet in outer Ethernet + IPv4 + UDP + VXLAN + inner Ethernet,
/// each field as `vxlan.1` sets it, and sends it out of the underlay.
#[inline(always)]
fn encap(
    ctx: &TcContext,
    cfg: &DpConfig,
    ip: &Ip,
    node: &RemoteNode,
    plan: &Plan,
) -> Result<DpPath, DpPath> {
    // The kernel's udp_flow_src_port(): the skb's flow hash (the sending
    // socket's, which the packet keeps through the veth, or the dissected
    // tuple's), folded and scaled into [port_min, port_max). The same
    // packet thus leaves from the same port on either path.
    // SAFETY: a helper call on the context.
    let mut hash = unsafe { bpf_get_hash_recalc(ctx.as_ptr() as *mut __sk_buff) };
    hash ^= hash << 16;
    let range = u64::from(cfg.port_max.saturating_sub(cfg.port_min));
    let sport = ((u64::from(hash) * range) >> 32) as u16 + cfg.port_min;

    // FIXED_GSO: segments keep their size (the pod MTU already leaves room
    // for the overhead) and the kernel marks aggregates as UDP-tunnelled, so
    // TSO/GSO still cut them correctly.
    let flags = u64::from(BPF_F_ADJ_ROOM_FIXED_GSO)
        | u64::from(BPF_F_ADJ_ROOM_ENCAP_L3_IPV4)
        | u64::from(BPF_F_ADJ_ROOM_ENCAP_L4_UDP)
        | u64::from(BPF_F_ADJ_ROOM_ENCAP_L2_ETH)
        | ((ETH_HLEN as u64) << 56);
    if ctx
        .adjust_room(VXLAN_OVERHEAD as i32, BPF_ADJ_ROOM_MAC, flags)
        .is_err()
    {
        // Nothing changed: the kernel may still take it through vxlan.1.
        return via_vxlan(ctx, cfg, ip, node, DpPath::FastVxlanGso);
    }
    dec_ttl(ctx, ENCAP, ip)?;

    let mut slot = core::mem::MaybeUninit::<Header>::uninit();
    // SAFETY: plain bytes, 64 of them, aligned.
    let h = &mut unsafe { zero_in_place(&mut slot) }.0;
    if let Some((dmac, smac)) = plan.macs {
        h[0..6].copy_from_slice(&dmac);
        h[6..12].copy_from_slice(&smac);
    }
    h[12..14].copy_from_slice(&ETH_P_IP.to_be_bytes());
    // Outer IPv4: TOS 0 but the inner ECN bits (CE becomes ECT(0)), as
    // ip_tunnel_ecn_encap (IPv4 TOS or IPv6 traffic class); DF clear;
    // `vxlan.1`'s TTL. The outer header is the same for either inner family.
    let ecn = ip.tos & 0x03;
    h[14] = 0x45;
    h[15] = if ecn == 0x03 { 0x02 } else { ecn };
    h[16..18].copy_from_slice(&((ip.tot_len + VXLAN_OVERHEAD) as u16).to_be_bytes());
    // SAFETY: a helper call without arguments.
    let id = unsafe { bpf_get_prandom_u32() } as u16;
    h[18..20].copy_from_slice(&id.to_be_bytes());
    h[22] = cfg.ttl;
    h[23] = IPPROTO_UDP;
    h[26..30].copy_from_slice(&cfg.host_ip.to_ne_bytes());
    h[30..34].copy_from_slice(&node.host_ip.to_ne_bytes());
    let csum = ip_checksum(&h[14..34]);
    h[24..26].copy_from_slice(&csum.to_be_bytes());
    // UDP, checksum 0 like `vxlan.1` on IPv4 (noudpcsum, set by the agent).
    h[34..36].copy_from_slice(&sport.to_be_bytes());
    h[36..38].copy_from_slice(&cfg.vxlan_port.to_be_bytes());
    let udp_len = ip.tot_len + (UDP_HLEN + VXLAN_HLEN + ETH_HLEN) as u32;
    h[38..40].copy_from_slice(&(udp_len as u16).to_be_bytes());
    // VXLAN: I flag, VNI.
    h[42] = VXLAN_FLAG_I;
    let vni = cfg.vni.to_be_bytes();
    h[46..49].copy_from_slice(&vni[1..4]);
    // Inner Ethernet: what vxlan.1 would carry, so a peer that leaves the
    // packet to its kernel finds it addressed to its own vxlan.1.
    h[50..56].copy_from_slice(&node.vtep_mac);
    h[56..62].copy_from_slice(&cfg.vtep_mac);
    let inner_proto = if ip.v6 { ETH_P_IPV6 } else { ETH_P_IP };
    h[62..64].copy_from_slice(&inner_proto.to_be_bytes());
    ctx.store(0, &*h, 0).map_err(|_| DpPath::KernelError)?;

    // SAFETY: helper calls; they only set the redirect target.
    let verdict = unsafe {
        if plan.macs.is_some() {
            bpf_redirect(plan.ifindex, 0)
        } else {
            bpf_redirect_neigh(plan.ifindex, core::ptr::null_mut(), 0, 0)
        }
    };
    if verdict != TC_ACT_REDIRECT as i64 {
        return Err(DpPath::KernelError);
    }
    Ok(DpPath::FastEncap)
}

/// On the underlay: unwrap VXLAN from a known peer for a pod here, or
/// forward a direct-routed peer's packet to a pod here. `family` is the
/// outer family, replaced by the inner one when `decap` looks inside.
#[inline(always)]
fn from_underlay(ctx: &TcContext, cfg: &DpConfig, family: &mut DpFamily) -> (DpPath, i32) {
    let r = match decap(ctx, cfg, family) {
        Err(DpPath::KernelUnderlayOther) if cfg.flags & CFG_TC_DECAP != 0 => direct_in(ctx, cfg),
        r => r,
    };
    match r {
        Ok(path) => (path, TC_ACT_REDIRECT),
        Err(path) => (path, TCX_NEXT),
    }
}

/// An unencapsulated packet on the underlay: fast only when it is for a pod
/// here and from a direct-routed peer's pod; anything else is the node's own
/// traffic, or a stranger's, and the kernel's.
#[inline(always)]
fn direct_in(ctx: &TcContext, cfg: &DpConfig) -> Result<DpPath, DpPath> {
    const L3: usize = ETH_HLEN;
    let (data, _) = linear(ctx, L3 + IP_HLEN).ok_or(DpPath::KernelUnderlayOther)?;
    // SAFETY (raw reads): in range, checked by `linear`.
    let proto = u16::from_be(unsafe { ((data + 12) as *const u16).read_unaligned() });
    let daddr = unsafe { ((data + L3 + 16) as *const [u8; 4]).read_unaligned() };
    // SAFETY: read-only map lookup.
    if proto != ETH_P_IP || unsafe { LOCAL.get(&daddr) }.is_none() {
        return Err(DpPath::KernelUnderlayOther);
    }
    let (ip, next) = inspect::<0>(ctx, From::Direct, cfg, 0)?;
    let Next::Local(ep) = next else {
        return Err(DpPath::KernelUnknownDest);
    };
    deliver(ctx, From::Direct, &ip, &ep)
}

#[inline(always)]
fn decap(ctx: &TcContext, cfg: &DpConfig, family: &mut DpFamily) -> Result<DpPath, DpPath> {
    const L3: usize = ETH_HLEN;
    const L4: usize = L3 + IP_HLEN;
    const VX: usize = L4 + UDP_HLEN;
    const INNER_ETH: usize = VX + VXLAN_HLEN;
    if cfg.flags & CFG_TC_DECAP == 0 || cfg.underlay_ifindex == 0 {
        return Err(DpPath::KernelUnderlayOther);
    }
    let (data, _) = linear(ctx, L4).ok_or(DpPath::KernelUnderlayOther)?;
    // SAFETY (raw reads): in range, checked by `linear`.
    let proto = u16::from_be(unsafe { ((data + 12) as *const u16).read_unaligned() });
    let vihl = unsafe { *((data + L3) as *const u8) };
    let l4proto = unsafe { *((data + L3 + 9) as *const u8) };
    let daddr = unsafe { ((data + L3 + 16) as *const u32).read_unaligned() };
    if proto != ETH_P_IP || vihl >> 4 != 4 || l4proto != IPPROTO_UDP || daddr != cfg.host_ip {
        return Err(DpPath::KernelUnderlayOther);
    }
    // A fragment may be part of VXLAN (a non-first one has no UDP header to
    // tell): reassembly is the kernel's.
    let frag = u16::from_be(unsafe { ((data + L3 + 6) as *const u16).read_unaligned() });
    if frag & IP_MF_OFFSET != 0 {
        return Err(DpPath::KernelDecapFragment);
    }
    if vihl & 0x0f != 5 {
        return Err(DpPath::KernelUnderlayOther);
    }
    let (data, _) = linear(ctx, VX).ok_or(DpPath::KernelUnderlayOther)?;
    let dport = u16::from_be(unsafe { ((data + L4 + 2) as *const u16).read_unaligned() });
    if dport != cfg.vxlan_port {
        return Err(DpPath::KernelUnderlayOther);
    }
    // VXLAN for this host from here on: who sent it?
    let saddr = unsafe { ((data + L3 + 12) as *const u32).read_unaligned() };
    // SAFETY: read-only map lookup.
    if unsafe { PEERS.get(&saddr.to_ne_bytes()) }.is_none() {
        return Err(DpPath::KernelDecapNotPeer);
    }
    // SAFETY: a plain read of the context.
    let (pkt_type, gso_size) = unsafe { ((*skb(ctx)).pkt_type, (*skb(ctx)).gso_size) };
    let (data, _) = linear(ctx, ENCAP).ok_or(DpPath::KernelDecapHeader)?;
    let tot_len = u32::from(u16::from_be(unsafe {
        ((data + L3 + 2) as *const u16).read_unaligned()
    }));
    let udp_len = u32::from(u16::from_be(unsafe {
        ((data + L4 + 4) as *const u16).read_unaligned()
    }));
    let udp_csum = unsafe { ((data + L4 + 6) as *const u16).read_unaligned() };
    let vxh = unsafe { ((data + VX) as *const [u8; 8]).read_unaligned() };
    let inner_dst = unsafe { ((data + INNER_ETH) as *const [u8; 6]).read_unaligned() };
    let outer = unsafe { ((data + L3) as *const [u8; IP_HLEN]).read_unaligned() };
    let vni = cfg.vni.to_be_bytes();
    // Lengths are exact on a single packet; on a GSO aggregate they are the
    // sender's and the inner header's length is what counts.
    let lengths_ok =
        gso_size != 0 || (tot_len + L3 as u32 <= ctx.len() && udp_len + IP_HLEN as u32 == tot_len);
    // A UDP checksum would need verifying, which the kernel does: ours and
    // vxlan.1 send none.
    // The kernel drops a bad outer header checksum; so must this path.
    if pkt_type != PACKET_HOST
        || ip_checksum(&outer) != 0
        || !lengths_ok
        || udp_csum != 0
        || vxh != [VXLAN_FLAG_I, 0, 0, 0, vni[1], vni[2], vni[3], 0]
        || inner_dst != cfg.vtep_mac
    {
        return Err(DpPath::KernelDecapHeader);
    }
    // From here on the packet is a peer's pod's: counted by what it carries.
    *family = family_at(ctx, VX + VXLAN_HLEN);
    let (ip, next) = inspect::<{ VX + VXLAN_HLEN }>(ctx, From::Underlay, cfg, saddr)?;
    let Next::Local(ep) = next else {
        return Err(DpPath::KernelUnknownDest);
    };
    // FIXED_GSO keeps an aggregate's segment size (Calico once passed it as
    // the mode and grew gso_size by 50: calico#11160). The kernel refuses
    // aggregates other than TCP, which then go through vxlan.1.
    // An inner IPv6 packet behind the outer IPv4 header: DECAP_L3_IPV6
    // makes skb->protocol IPv6 again, or the pod's stack would hand it to
    // IPv4 (and bpf_redirect_peer does not look at the ethertype).
    let family = if ip.v6 {
        u64::from(BPF_F_ADJ_ROOM_DECAP_L3_IPV6)
    } else {
        0
    };
    ctx.adjust_room(
        -(VXLAN_OVERHEAD as i32),
        BPF_ADJ_ROOM_MAC,
        u64::from(BPF_F_ADJ_ROOM_FIXED_GSO) | family,
    )
    .map_err(|_| DpPath::KernelDecapGso)?;
    // What is left in front of the inner packet is the outer Ethernet
    // header, whose ethertype says IPv4.
    if ip.v6 {
        ctx.store(12, &ETH_P_IPV6.to_be_bytes(), 0)
            .map_err(|_| DpPath::KernelError)?;
    }
    deliver(ctx, From::Underlay, &ip, &ep)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

// bpf_redirect_peer and the conntrack kfuncs are GPL-only.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
