//! Flow events: what `counters::account` tells the agent about a
//! connection, through the ring `mycni_flows` (`mycni_common::flow`).
//!
//! Bounded per connection, not per packet: `mycni_flow_seen` holds, per
//! tuple and program, the path last announced. The first packet of a
//! connection is `FLOW_NEW`; a packet on another path is `FLOW_PATH`; a
//! packet on the same path costs one lookup and nothing else. The programs
//! drop nothing themselves (they leave packets to the kernel), so
//! `FLOW_DROP` is the `kfree_skb` tracepoint's.

use aya_ebpf::{helpers::bpf_ktime_get_ns, programs::TcContext};
use mycni_common::DpPath;
use mycni_common::flow::{
    FLOW_NEW, FLOW_PATH, FLOW_STAT_EMITTED, FLOW_STAT_LOST, FLOW_STAT_SUPPRESSED, FlowSource,
};

use crate::gate::From;
use crate::maps::{FLOW_SEEN, FLOW_STATS, FLOWS, Seen};
use crate::parse::{Tuple, ingress};

/// Path changes of a connection announced as they happen: its first
/// packets may take a few (SYN to the kernel, the next one before
/// conntrack confirmed it, then fast).
const PATH_CHANGES_FREE: u32 = 3;
/// Past those, a connection whose path keeps changing (a stream whose
/// large segments go through `vxlan.1` for the MTU and small ones are
/// encapsulated in tc) has a change announced at most this often; the
/// others are counted as suppressed, and the path announced last stands.
const PATH_INTERVAL_NS: u64 = 1_000_000_000;

/// Announces the packet of `t` that took `path`, if its connection is new
/// to this program or changed path.
#[inline(always)]
pub(crate) fn observe(ctx: &TcContext, from: From, t: &mut Tuple, path: DpPath) {
    // Packets whose headers were never read (not IP, truncated, options)
    // have no connection to name.
    if t.key.family == 0 || matches!(path, DpPath::KernelTruncated | DpPath::KernelNotIpv4) {
        return;
    }
    let source = match from {
        From::Pod => FlowSource::Pod,
        From::Vxlan => FlowSource::Vxlan,
        From::Underlay | From::Direct => FlowSource::Underlay,
    };
    // The key is the tuple as parsed plus the program (its padding zeroed
    // with the tuple, as a hash key must be).
    t.key.source = source as u8;
    let path = path as u32;
    match FLOW_SEEN.get_ptr_mut(&t.key) {
        Some(seen) => {
            // SAFETY: a live map value; concurrent updates from another CPU
            // at worst announce one change twice or not at all.
            let (last_path, last_ns, changes) =
                unsafe { ((*seen).path, (*seen).last_ns, (*seen).changes) };
            // The hot path: an established connection on its path.
            if last_path == path {
                return;
            }
            // SYN, FIN and RST always go to the kernel: a known
            // connection's open or close is not a change of its path.
            if path == DpPath::KernelTcpControl as u32 {
                return;
            }
            // SAFETY: a helper call without arguments.
            let now = unsafe { bpf_ktime_get_ns() };
            if changes >= PATH_CHANGES_FREE && now.wrapping_sub(last_ns) < PATH_INTERVAL_NS {
                stat(FLOW_STAT_SUPPRESSED);
                return;
            }
            // SAFETY: as above.
            unsafe {
                (*seen).path = path;
                (*seen).last_ns = now;
                (*seen).changes = changes.saturating_add(1);
            }
            emit(ctx, t, source, FLOW_PATH, path, now);
        }
        None => {
            // SAFETY: a helper call without arguments.
            let now = unsafe { bpf_ktime_get_ns() };
            let seen = Seen {
                last_ns: now,
                path,
                changes: 0,
            };
            // BPF_NOEXIST: of two CPUs racing on a connection's first
            // packets, only the one that inserted announces it. Any other
            // failure also announces nothing, or it would every packet.
            if FLOW_SEEN
                .insert(&t.key, &seen, u64::from(BPF_NOEXIST))
                .is_ok()
            {
                emit(ctx, t, source, FLOW_NEW, path, now);
            }
        }
    }
}

const BPF_NOEXIST: u32 = aya_ebpf::bindings::BPF_NOEXIST;

/// Writes one event into the ring, in place; a full ring is counted, never
/// waited on.
#[inline(always)]
fn emit(ctx: &TcContext, t: &Tuple, source: FlowSource, kind: u8, reason: u32, now: u64) {
    let Some(mut entry) = FLOWS.reserve(0) else {
        stat(FLOW_STAT_LOST);
        return;
    };
    let e = entry.as_mut_ptr();
    // SAFETY: the reservation is this program's alone until submitted, and
    // holds a whole FlowEvent, 8-aligned. Written field by field in place:
    // a struct built on the stack would be copied, and the ring's memory is
    // not zeroed, so every byte (padding too) is written.
    unsafe {
        (*e).ts_ns = now;
        (*e).src = t.key.src;
        (*e).dst = t.key.dst;
        (*e).sport = t.key.sport;
        (*e).dport = t.key.dport;
        (*e).ifindex = ingress(ctx);
        (*e).count = 1;
        (*e).reason = reason as u16;
        (*e).proto = t.key.proto;
        (*e).family = t.key.family;
        (*e).tcp_flags = t.tcp_flags;
        (*e).source = source as u8;
        (*e).kind = kind;
        (*e)._pad = [0; 5];
    }
    // Default wakeup: the reader is woken only when it had caught up, and
    // it drains in batches, so wakeups stay few at high rates.
    entry.submit(0);
    stat(FLOW_STAT_EMITTED);
}

#[inline(always)]
fn stat(slot: u32) {
    if let Some(n) = FLOW_STATS.get_ptr_mut(slot) {
        // SAFETY: this CPU's own slot; nothing else writes it concurrently.
        unsafe { *n += 1 };
    }
}
