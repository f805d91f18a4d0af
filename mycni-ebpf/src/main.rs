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
//!
//! This file holds the three programs and what each does with a packet;
//! the steps are modules the programs share, leaves first:
//! - `maps`: every pinned map (names and layouts are a stability boundary);
//! - `parse`: header parsing, reads only;
//! - `ct`: the conntrack gate (over c/ct_gate.c);
//! - `gate`: every check a fast-pathed packet passes (`inspect`);
//! - `forward`: into a pod here, direct routing, via `vxlan.1`/`vxlan6.1`;
//! - `encap`: VXLAN wrapped and unwrapped in tc;
//! - `counters`: where every packet is accounted, once;
//! - `flow`: the flow events `counters` emits (first packet of a
//!   connection, a change of its path) into the ring `mycni_flows`.
#![no_std]
#![no_main]
// The workspace caps functions at 5 parameters. Here the helpers are
// `#[inline(always)]` steps of one program, whose instruction count and
// stack (512 bytes) the verifier bounds and the kernel matrix measures: a
// parameter struct would change what the verifier walks, for no reader's
// gain. Bundling them is a change of its own, measured.
#![allow(clippy::too_many_arguments)]

mod counters;
mod ct;
mod encap;
mod flow;
mod forward;
mod gate;
mod kdrop;
mod maps;
mod nexthop;
mod parse;

use aya_ebpf::{bindings::TC_ACT_REDIRECT, macros::classifier, programs::TcContext};
use mycni_common::{
    CFG_FLOW_EVENTS, CFG_TC_DECAP, DpConfig, DpFamily, DpPath, REMOTE_DIRECT, REMOTE_VXLAN6,
    TCX_NEXT,
};

use crate::encap::{decap, encap, encap_plan};
use crate::forward::zero_in_place;
use crate::forward::{deliver, direct, direct_in, via_vxlan, via_vxlan6};
use crate::gate::{From, Next, inspect};
use crate::maps::CONFIG;
use crate::parse::{Tuple, family_at, ingress};

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
    // The connection's tuple, filled as the checks parse the headers.
    let mut slot = core::mem::MaybeUninit::<Tuple>::uninit();
    // SAFETY: all-zero is a valid Tuple (plain bytes and integers).
    let t = unsafe { zero_in_place(&mut slot) };
    let mut flags = 0;
    let (path, verdict) = match CONFIG.get(0) {
        Some(cfg) if cfg.vxlan_ifindex != 0 || cfg.vxlan6_ifindex != 0 => {
            flags = cfg.flags;
            run_with(ctx, from, cfg, &mut family, t)
        }
        _ => (DpPath::KernelNoConfig, TCX_NEXT),
    };
    let flow = (flags & CFG_FLOW_EVENTS != 0).then_some(t);
    counters::account(ctx, from, family, path, len, verdict, flow);
    verdict
}

/// `run` once the node's config is there.
#[inline(always)]
fn run_with(
    ctx: &TcContext,
    from: From,
    cfg: &DpConfig,
    family: &mut DpFamily,
    t: &mut Tuple,
) -> (DpPath, i32) {
    match from {
        From::Underlay => from_underlay(ctx, cfg, family, t),
        // The same checks on vxlan6.1 as on vxlan.1, counted apart by
        // the device it arrived on. (A `From` of its own would inline
        // `forward` twice into this program.)
        From::Vxlan => match forward(ctx, from, cfg, t) {
            (DpPath::FastDecap, v)
                if cfg.vxlan6_ifindex != 0 && ingress(ctx) == cfg.vxlan6_ifindex =>
            {
                (DpPath::FastVxlan6Decap, v)
            }
            r => r,
        },
        _ => forward(ctx, from, cfg, t),
    }
}

/// From a pod, or decapsulated by `vxlan.1`: into a pod here, or (from a
/// pod) on to a peer's pod by the peer's way.
#[inline(always)]
fn forward(ctx: &TcContext, from: From, cfg: &DpConfig, t: &mut Tuple) -> (DpPath, i32) {
    let (ip, next) = match inspect::<0>(ctx, from, cfg, 0, t) {
        Ok(x) => x,
        Err(path) => return (path, TCX_NEXT),
    };
    verdict(match next {
        Next::Local(ep) => deliver(ctx, from, &ip, &ep),
        Next::Remote(node) if node.flags & REMOTE_VXLAN6 != 0 => via_vxlan6(ctx, cfg, &ip, &node),
        // An IPv4 underlay cannot carry IPv6 unencapsulated; the agent marks
        // no IPv6 podCIDR direct, so this is a map the kernel does not back.
        Next::Remote(node) if node.flags & REMOTE_DIRECT != 0 && ip.v6 => {
            Err(DpPath::KernelDirectFib)
        }
        Next::Remote(node) if node.flags & REMOTE_DIRECT != 0 => direct(ctx, cfg, &ip),
        Next::Remote(node) => match encap_plan(ctx, cfg, &ip, &node) {
            Ok(route) => encap(ctx, cfg, &ip, &node, &route),
            Err(why) => via_vxlan(ctx, cfg, &ip, &node, why),
        },
    })
}

/// On the underlay: unwrap VXLAN from a known peer for a pod here, or
/// forward a direct-routed peer's packet to a pod here. `family` is the
/// outer family, replaced by the inner one when `decap` looks inside.
#[inline(always)]
fn from_underlay(
    ctx: &TcContext,
    cfg: &DpConfig,
    family: &mut DpFamily,
    t: &mut Tuple,
) -> (DpPath, i32) {
    verdict(match decap(ctx, cfg, family, t) {
        Err(DpPath::KernelUnderlayOther) if cfg.flags & CFG_TC_DECAP != 0 => direct_in(ctx, cfg, t),
        r => r,
    })
}

/// A path taken (the packet redirected) or a reason to leave it to the
/// kernel (the next program, then the stack).
#[inline(always)]
fn verdict(r: Result<DpPath, DpPath>) -> (DpPath, i32) {
    match r {
        Ok(path) => (path, TC_ACT_REDIRECT),
        Err(path) => (path, TCX_NEXT),
    }
}

/// Drops the kernel makes itself on the pod and overlay interfaces (the
/// kernel's drop reasons, `kdrop`): not a tc program, it sees what the
/// stack frees after the programs let a packet go.
#[aya_ebpf::macros::btf_tracepoint(function = "kfree_skb")]
fn mycni_kfree_skb(ctx: aya_ebpf::programs::BtfTracePointContext) -> i32 {
    kdrop::on_kfree_skb(&ctx);
    0
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
