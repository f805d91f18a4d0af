//! Forwarding: where a packet that passed the gate leaves, rewritten as a
//! router would (TTL or hop limit, MACs): into a pod here, to a
//! direct-routed peer by the kernel's route, or to `vxlan.1` / `vxlan6.1`
//! for the kernel to encapsulate. Each returns the path it took, or the
//! reason the kernel must take the packet instead.

use aya_ebpf::{
    EbpfContext,
    bindings::{
        BPF_F_RECOMPUTE_CSUM, BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS, TC_ACT_REDIRECT,
        bpf_fib_lookup as FibParams,
    },
    helpers::generated::{
        bpf_check_mtu, bpf_fib_lookup, bpf_redirect, bpf_redirect_neigh, bpf_redirect_peer,
    },
    programs::TcContext,
};
use mycni_common::{DpConfig, DpPath, LocalEndpoint, RemoteNode};

use crate::gate::{From, Next, inspect};
use crate::maps::LOCAL;
use crate::parse::{ETH_HLEN, ETH_P_IP, IP_HLEN, Ip, PACKET_HOST, Tuple, ingress, linear, skb};

const AF_INET: u8 = 2;

/// How a packet enters a pod here.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handoff {
    /// `bpf_redirect_peer`: straight into the pod's namespace, the skb as
    /// it is (its `protocol` too).
    Peer,
    /// `bpf_redirect` out of the host's end of the veth: the pod's end runs
    /// `eth_type_trans`, so the skb's `protocol` follows the ethertype. For
    /// IPv6 unwrapped from IPv4 before Linux 6.3, whose skb says IPv4 and
    /// which no program can otherwise change; one pass through the veth's
    /// queue more than `Peer`.
    Xmit,
}

/// Into a pod on this node; the IP header is right behind Ethernet.
#[inline(always)]
pub(crate) fn deliver(
    ctx: &TcContext,
    from: From,
    ip: &Ip,
    ep: &LocalEndpoint,
) -> Result<DpPath, DpPath> {
    deliver_by(ctx, from, ip, ep, Handoff::Peer)
}

/// [`deliver`], by `how`.
#[inline(always)]
pub(crate) fn deliver_by(
    ctx: &TcContext,
    from: From,
    ip: &Ip,
    ep: &LocalEndpoint,
    how: Handoff,
) -> Result<DpPath, DpPath> {
    dec_ttl(ctx, ETH_HLEN, ip)?;
    set_macs(ctx, 0, ep.pod_mac, ep.host_mac)?;
    // A frame that arrived for the VTEP, the gateway or the host's MAC must
    // look addressed to the pod when it lands there. Most already are
    // PACKET_HOST (decap admits nothing else): no helper call for those.
    // SAFETY: a plain read of the context.
    if unsafe { (*skb(ctx)).pkt_type } != PACKET_HOST {
        ctx.change_type(PACKET_HOST)
            .map_err(|_| DpPath::KernelError)?;
    }
    // SAFETY: helper calls on a valid ifindex; they only set the redirect.
    redirected(unsafe {
        match how {
            Handoff::Peer => bpf_redirect_peer(ep.ifindex, 0),
            Handoff::Xmit => bpf_redirect(ep.ifindex, 0),
        }
    })?;
    Ok(match from {
        From::Pod => DpPath::FastLocal,
        From::Vxlan => DpPath::FastDecap,
        From::Underlay => DpPath::FastTcDecap,
        From::Direct => DpPath::FastDirectIn,
    })
}

/// An unencapsulated packet on the underlay: fast only when it is for a pod
/// here and from a direct-routed peer's pod; anything else is the node's own
/// traffic, or a stranger's, and the kernel's. `t` gets the tuple of what
/// is for a pod here.
#[inline(always)]
pub(crate) fn direct_in(ctx: &TcContext, cfg: &DpConfig, t: &mut Tuple) -> Result<DpPath, DpPath> {
    const L3: usize = ETH_HLEN;
    let (data, _) = linear(ctx, L3 + IP_HLEN).ok_or(DpPath::KernelUnderlayOther)?;
    // SAFETY (raw reads): in range, checked by `linear`.
    let proto = u16::from_be(unsafe { ((data + 12) as *const u16).read_unaligned() });
    let daddr = unsafe { ((data + L3 + 16) as *const [u8; 4]).read_unaligned() };
    // SAFETY: read-only map lookup.
    if proto != ETH_P_IP || unsafe { LOCAL.get(&daddr) }.is_none() {
        return Err(DpPath::KernelUnderlayOther);
    }
    let (ip, next) = inspect::<0>(ctx, From::Direct, cfg, 0, t)?;
    let Next::Local(ep) = next else {
        return Err(DpPath::KernelUnknownDest);
    };
    deliver(ctx, From::Direct, &ip, &ep)
}

/// To a remote pod through `vxlan.1`, whose FDB maps the peer's VTEP MAC to
/// its host: the kernel encapsulates. Counted under `why`.
#[inline(always)]
pub(crate) fn via_vxlan(
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
    to_vtep(ctx, ip, node.vtep_mac, cfg.vtep_mac, cfg.vxlan_ifindex)?;
    Ok(why)
}

/// To a remote pod of a peer over the IPv6 underlay, through `vxlan6.1`,
/// whose FDB maps the peer's `vxlan6.1` MAC to its IPv6 host address: the
/// kernel encapsulates, in an IPv6 outer header.
#[inline(always)]
pub(crate) fn via_vxlan6(
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
    if ip.wire_len(ctx) > mtu {
        return Err(DpPath::KernelVxlan6Mtu);
    }
    to_vtep(ctx, ip, node.vtep_mac, cfg.vtep6_mac, cfg.vxlan6_ifindex)?;
    Ok(DpPath::FastVxlan6)
}

/// The frame as a VXLAN device takes it from the stack (TTL spent, from our
/// VTEP MAC `src` to the peer's `dst`), redirected into that device.
#[inline(always)]
fn to_vtep(
    ctx: &TcContext,
    ip: &Ip,
    dst: [u8; 6],
    src: [u8; 6],
    ifindex: u32,
) -> Result<(), DpPath> {
    dec_ttl(ctx, ETH_HLEN, ip)?;
    set_macs(ctx, 0, dst, src)?;
    // SAFETY: a helper call; it only sets the redirect target.
    redirected(unsafe { bpf_redirect(ifindex, 0) })
}

/// To a pod of a direct-routed peer: forwarded as the kernel would, by its
/// own route (`podCIDR via <host IP>` on the underlay) and neighbour
/// entry; anything but a plain success out of the underlay is the kernel's.
#[inline(always)]
pub(crate) fn direct(ctx: &TcContext, cfg: &DpConfig, ip: &Ip) -> Result<DpPath, DpPath> {
    let route = fib_lookup4(ctx, 0, cfg.underlay_ifindex, |p| {
        p.l4_protocol = ip.l4proto;
        p.__bindgen_anon_1.tot_len = ip.wire_len(ctx) as u16;
        // From the pod's veth, as the kernel's forwarding sees the packet.
        p.ifindex = ingress(ctx);
        p.__bindgen_anon_2.tos = ip.tos;
        p.__bindgen_anon_3.ipv4_src = ip.saddr;
        p.__bindgen_anon_4.ipv4_dst = ip.daddr;
    })
    .map_err(|_| DpPath::KernelDirectFib)?;
    dec_ttl(ctx, ETH_HLEN, ip)?;
    if let Some((dmac, smac)) = route.macs {
        set_macs(ctx, 0, dmac, smac)?;
    }
    route.redirect()?;
    Ok(DpPath::FastDirect)
}

/// A route out of the underlay the kernel's FIB gave: the device, and the
/// next hop's and our MAC when the kernel already knows them (else the
/// neighbour subsystem resolves them on the way out).
pub(crate) struct Route {
    pub(crate) ifindex: u32,
    pub(crate) macs: Option<([u8; 6], [u8; 6])>,
    /// The route's MTU when the lookup checked one (0: not known).
    pub(crate) mtu: u32,
}

impl Route {
    /// Sends the packet (its MACs set when known) out of the route's device.
    #[inline(always)]
    pub(crate) fn redirect(&self) -> Result<(), DpPath> {
        // SAFETY: helper calls; they only set the redirect target.
        redirected(unsafe {
            if self.macs.is_some() {
                bpf_redirect(self.ifindex, 0)
            } else {
                bpf_redirect_neigh(self.ifindex, core::ptr::null_mut(), 0, 0)
            }
        })
    }
}

/// The kernel's IPv4 route (`bpf_fib_lookup` with `flags`) for the query
/// `fill` writes into a zeroed parameter block: a [`Route`] when it leaves
/// out of `via`, else the helper's code (a success out of another device
/// included).
#[inline(always)]
pub(crate) fn fib_lookup4(
    ctx: &TcContext,
    flags: u32,
    via: u32,
    fill: impl FnOnce(&mut FibParams),
) -> Result<Route, u32> {
    let mut slot = core::mem::MaybeUninit::<FibParams>::uninit();
    // SAFETY: all-zero is a valid bpf_fib_lookup (64 bytes, 4-aligned).
    let p = unsafe { zero_in_place(&mut slot) };
    p.family = AF_INET;
    fill(p);
    // SAFETY: a plain u16 of the union, just written (or zero).
    let checks_mtu = unsafe { p.__bindgen_anon_1.tot_len } != 0;
    // SAFETY: the helper reads and fills `p`, of the size given.
    let rc = unsafe {
        bpf_fib_lookup(
            ctx.as_ptr(),
            p,
            core::mem::size_of::<FibParams>() as i32,
            flags,
        )
    } as u32;
    if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH) || p.ifindex != via {
        return Err(rc);
    }
    // SAFETY: reading the MAC member of the union; the helper filled it on
    // success (and it is plain bytes either way).
    let found = unsafe { p.__bindgen_anon_6.__bindgen_anon_2 };
    // On success the helper wrote the route's MTU over `tot_len` when it
    // was asked to check one.
    let mtu = if checks_mtu {
        // SAFETY: a plain u16 of the union.
        u32::from(unsafe { p.__bindgen_anon_1.mtu_result })
    } else {
        0
    };
    Ok(Route {
        ifindex: p.ifindex,
        macs: (rc == BPF_FIB_LKUP_RET_SUCCESS).then_some((found.dmac, found.smac)),
        mtu,
    })
}

/// A redirect helper's verdict: anything but a redirect is an error.
#[inline(always)]
pub(crate) fn redirected(verdict: i64) -> Result<(), DpPath> {
    if verdict != TC_ACT_REDIRECT as i64 {
        return Err(DpPath::KernelError);
    }
    Ok(())
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
pub(crate) fn dec_ttl(ctx: &TcContext, l3: usize, ip: &Ip) -> Result<(), DpPath> {
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
pub(crate) unsafe fn zero_in_place<T>(slot: &mut core::mem::MaybeUninit<T>) -> &mut T {
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
