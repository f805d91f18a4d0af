//! VXLAN in tc: wrapping a pod's packet for a peer byte for byte as
//! `vxlan.1` would, and unwrapping a known peer's VXLAN for a pod here.
//! The outer header is always IPv4 (see main.rs on the IPv6 underlay).

use aya_ebpf::{
    EbpfContext,
    bindings::{
        __sk_buff, BPF_F_ADJ_ROOM_DECAP_L3_IPV6, BPF_F_ADJ_ROOM_ENCAP_L2_ETH,
        BPF_F_ADJ_ROOM_ENCAP_L3_IPV4, BPF_F_ADJ_ROOM_ENCAP_L4_UDP, BPF_F_ADJ_ROOM_FIXED_GSO,
        BPF_FIB_LKUP_RET_FRAG_NEEDED, BPF_FIB_LOOKUP_OUTPUT, bpf_adj_room_mode::BPF_ADJ_ROOM_MAC,
    },
    helpers::generated::{bpf_get_hash_recalc, bpf_get_prandom_u32},
    programs::TcContext,
};
use mycni_common::{
    CFG_TC_DECAP, CFG_TC_ENCAP, DpConfig, DpFamily, DpPath, RemoteNode, VXLAN_OVERHEAD,
};

use crate::forward::{Handoff, Route, dec_ttl, deliver_by, fib_lookup4, via_vxlan, zero_in_place};
use crate::gate::{From, Next, inspect};
use crate::maps::PEERS;
use crate::nexthop;
use crate::parse::{
    ENCAP, ETH_HLEN, ETH_P_IP, ETH_P_IPV6, IP_HLEN, IP_MF_OFFSET, IPPROTO_UDP, Ip, PACKET_HOST,
    Tuple, UDP_HLEN, VXLAN_FLAG_I, VXLAN_HLEN, family_at, ip_checksum, linear, skb,
};

/// Whether the program may encapsulate this packet itself, and the route
/// out of the underlay; else the reason to hand it to `vxlan.1`.
#[inline(always)]
pub(crate) fn encap_plan(
    ctx: &TcContext,
    cfg: &DpConfig,
    ip: &Ip,
    node: &RemoteNode,
) -> Result<Route, DpPath> {
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
    // What one packet on the wire carries: the route's MTU must take it.
    let outer = ip.wire_len(ctx) + VXLAN_OVERHEAD;
    // The question below depends on the peer alone (and the packet's
    // length, checked against the route's MTU): its answer can be reused.
    let stamp = nexthop::stamp();
    if let Some(route) = nexthop::hit(&stamp, node.host_ip, cfg.underlay_ifindex, outer) {
        return Ok(route);
    }
    // From the sender's side, out of vxlan.1's `dev`: the lookup vxlan.1
    // itself makes for the outer packet.
    fib_lookup4(ctx, BPF_FIB_LOOKUP_OUTPUT, cfg.underlay_ifindex, |p| {
        p.l4_protocol = IPPROTO_UDP;
        p.dport = cfg.vxlan_port.to_be();
        p.__bindgen_anon_1.tot_len = outer as u16;
        p.ifindex = cfg.underlay_ifindex;
        p.__bindgen_anon_3.ipv4_src = cfg.host_ip;
        p.__bindgen_anon_4.ipv4_dst = node.host_ip;
    })
    .inspect(|route| nexthop::fill(&stamp, node.host_ip, route))
    .map_err(|rc| {
        if rc == BPF_FIB_LKUP_RET_FRAG_NEEDED {
            DpPath::FastVxlanMtu
        } else {
            DpPath::FastVxlanFib
        }
    })
}

/// The headers `encap` puts in front of the packet, aligned for
/// [`zero_in_place`].
#[repr(C, align(8))]
struct Header([u8; ENCAP]);

/// Wraps the packet in outer Ethernet + IPv4 + UDP + VXLAN + inner Ethernet,
/// each field as `vxlan.1` sets it, and sends it out of the underlay.
#[inline(always)]
pub(crate) fn encap(
    ctx: &TcContext,
    cfg: &DpConfig,
    ip: &Ip,
    node: &RemoteNode,
    route: &Route,
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
    if let Some((dmac, smac)) = route.macs {
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
    route.redirect()?;
    Ok(DpPath::FastEncap)
}

/// VXLAN on the underlay: unwrapped and delivered when a known peer sent
/// it, to this host, for a pod here, and every header is as `vxlan.1`
/// would accept it. `family` is the outer family, replaced by the inner one
/// once the packet is known to be VXLAN from a peer; `t` gets the inner
/// packet's tuple.
#[inline(always)]
pub(crate) fn decap(
    ctx: &TcContext,
    cfg: &DpConfig,
    family: &mut DpFamily,
    t: &mut Tuple,
) -> Result<DpPath, DpPath> {
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
    *family = family_at(ctx, INNER_ETH);
    let (ip, next) = inspect::<INNER_ETH>(ctx, From::Underlay, cfg, saddr, t)?;
    let Next::Local(ep) = next else {
        return Err(DpPath::KernelUnknownDest);
    };
    // FIXED_GSO keeps an aggregate's segment size (Calico once passed it as
    // the mode and grew gso_size by 50: calico#11160). The kernel refuses
    // aggregates other than TCP, which then go through vxlan.1.
    let unwrap = |flags: u32| {
        ctx.adjust_room(
            -(VXLAN_OVERHEAD as i32),
            BPF_ADJ_ROOM_MAC,
            u64::from(BPF_F_ADJ_ROOM_FIXED_GSO | flags),
        )
    };
    let how = if !ip.v6 {
        unwrap(0).map_err(|_| DpPath::KernelDecapGso)?;
        Handoff::Peer
    } else {
        // An inner IPv6 packet behind the outer IPv4 header: DECAP_L3_IPV6
        // (Linux 6.3) makes skb->protocol IPv6 again, or the pod's stack
        // would hand it to IPv4 (bpf_redirect_peer does not look at the
        // ethertype). A kernel without the flag refuses the call whole and
        // changes nothing: unwrap as for IPv4, and let the veth read the
        // ethertype (`Handoff::Xmit`).
        if unwrap(BPF_F_ADJ_ROOM_DECAP_L3_IPV6).is_ok() {
            Handoff::Peer
        } else {
            unwrap(0).map_err(|_| DpPath::KernelDecapGso)?;
            Handoff::Xmit
        }
    };
    // What is left in front of the inner packet is the outer Ethernet
    // header, whose ethertype says IPv4.
    if ip.v6 {
        ctx.store(12, &ETH_P_IPV6.to_be_bytes(), 0)
            .map_err(|_| DpPath::KernelError)?;
    }
    deliver_by(ctx, From::Underlay, &ip, &ep, how)
}
