//! The checks every fast-pathed packet passes, in the order that decides
//! under which path a refused packet is counted: a plain IPv4 or IPv6
//! header, a destination the maps know, TTL left, TCP or UDP (no SYN, FIN
//! or RST), a source allowed to send from where it came, and a flow
//! conntrack holds as established and not NATed. Reads only: a packet that
//! fails goes on untouched.

use aya_ebpf::{btf_maps::lpm_trie::Key, programs::TcContext};
use mycni_common::{DpConfig, DpPath, LocalEndpoint, REMOTE_DIRECT, RemoteNode};

use crate::ct;
use crate::maps::{LOCAL, LOCAL6, LocalMap, REMOTE, REMOTE6, RemoteMap};
use crate::parse::{self, ETH_HLEN, ETH_P_IP, ETH_P_IPV6, Ip, L3, Tuple, ingress, linear};

/// Where a packet was picked up; it decides which sources are allowed and
/// which destinations are fast.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum From {
    Pod,
    /// Decapsulated by the kernel on `vxlan.1` or `vxlan6.1`.
    Vxlan,
    /// VXLAN on the underlay (inspected behind the outer headers).
    Underlay,
    /// Unencapsulated on the underlay, from a direct-routed peer.
    Direct,
}

/// Where a packet goes when the fast path takes it.
pub(crate) enum Next {
    Remote(RemoteNode),
    Local(LocalEndpoint),
}

/// The checks on the IPv4 or IPv6 packet behind an Ethernet header at
/// `OFF` (0 as it arrived from a pod or `vxlan.1`, the VXLAN overhead for
/// what is still wrapped on the underlay). `peer` is the outer source of a
/// wrapped packet: its inner source must lie in that peer's podCIDR. `t`
/// gets the connection's tuple as far as the checks read it.
#[inline(always)]
pub(crate) fn inspect<const OFF: usize>(
    ctx: &TcContext,
    from: From,
    cfg: &DpConfig,
    peer: u32,
    t: &mut Tuple,
) -> Result<(Ip, Next), DpPath> {
    let l3 = OFF + ETH_HLEN;
    let (data, _) = linear(ctx, l3).ok_or(DpPath::KernelTruncated)?;
    // SAFETY: `linear` checked the range against data_end, as the verifier
    // requires; the read is unaligned-safe.
    let proto = u16::from_be(unsafe { ((data + OFF + 12) as *const u16).read_unaligned() });
    match proto {
        ETH_P_IP => {
            let maps = Family {
                local: &LOCAL,
                remote: &REMOTE,
            };
            admit(ctx, from, cfg, peer, &maps, l3, parse::ipv4(ctx, l3)?, t)
        }
        ETH_P_IPV6 => {
            let maps = Family {
                local: &LOCAL6,
                remote: &REMOTE6,
            };
            admit(ctx, from, cfg, peer, &maps, l3, parse::ipv6(ctx, l3)?, t)
        }
        _ => Err(DpPath::KernelNotIpv4),
    }
}

/// A family's maps: its pods here and its peers' podCIDRs, keyed by
/// `N`-byte addresses.
struct Family<'a, const N: usize> {
    local: &'a LocalMap<N>,
    remote: &'a RemoteMap<N>,
}

/// The checks past the IP header at `l3`, the same for both families
/// (`N`-byte addresses, looked up in that family's maps).
#[inline(always)]
// Every input of the checks and the tuple they fill; bundled in a struct
// they would only be unpacked again here.
fn admit<const N: usize>(
    ctx: &TcContext,
    from: From,
    cfg: &DpConfig,
    peer: u32,
    maps: &Family<'_, N>,
    l3: usize,
    h: L3<N>,
    t: &mut Tuple,
) -> Result<(Ip, Next), DpPath> {
    let (local, remote) = (maps.local, maps.remote);
    let ip_hlen = if N == 4 {
        parse::IP_HLEN
    } else {
        parse::IP6_HLEN
    };
    t.set_l3(&h);
    // Refused before the L4 header is read: its ports only for the event.
    let l4_at = l3 + ip_hlen;
    let next =
        next_hop(local, remote, from, &h.addrs.dst).map_err(|p| t.peek_l4(ctx, cfg, l4_at, p))?;
    if h.ttl <= 1 {
        return Err(t.peek_l4(ctx, cfg, l4_at, DpPath::KernelTtl));
    }
    let l4 = parse::l4(ctx, cfg, l4_at, h.tot_len - ip_hlen as u32, h.l4proto, t)?;
    // For a pod, also what the kernel's anti-spoofing rule (the agent's
    // nftables table) would check, which a redirect skips.
    check_source(ctx, local, remote, from, peer, &h.addrs.src)?;
    ct::gate(ctx, &h.addrs, &l4, h.l4proto)?;
    // IPv4 addresses for the direct path's route lookup; IPv6 needs none.
    let [saddr, daddr] = if N == 4 {
        // SAFETY: two 4-byte addresses, repr(C) and 4-aligned.
        unsafe { *(&h.addrs as *const parse::Addrs<N> as *const [u32; 2]) }
    } else {
        [0, 0]
    };
    Ok((
        Ip {
            v6: N != 4,
            saddr,
            daddr,
            ttl: h.ttl,
            l4proto: h.l4proto,
            tos: h.tos,
            tot_len: h.tot_len,
            hdr_len: ip_hlen as u32 + l4.hlen,
        },
        next,
    ))
}

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
