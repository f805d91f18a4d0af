//! Flow events: what `counters::account` tells the agent about a
//! connection, through the ring `mycni_flows` (`mycni_common::flow`).
//!
//! Bounded per connection, not per packet: `mycni_flow_seen` holds, per
//! tuple and program, the path last announced. The first packet of a
//! connection is `FLOW_NEW`; a packet on another path is `FLOW_PATH`; a
//! packet on the same path is answered by this CPU's slot for it in
//! `mycni_flow_recent` (a hash of the tuple and a compare, no map lookup
//! by key) and writes nothing. The programs
//! drop nothing themselves (they leave packets to the kernel), so
//! `FLOW_DROP` is the `kfree_skb` tracepoint's.

use aya_ebpf::{helpers::bpf_ktime_get_ns, programs::TcContext};
use mycni_common::DpPath;
use mycni_common::flow::{
    FLOW_NEW, FLOW_PATH, FLOW_STAT_EMITTED, FLOW_STAT_LOST, FLOW_STAT_SUPPRESSED, FlowEvent,
    FlowSource,
};

use crate::gate::From;
use crate::maps::{FLOW_RECENT, FLOW_RECENT_SLOTS, FLOW_SEEN, FLOW_STATS, FLOWS, Seen};
use crate::parse::{FlowKey, Tuple, ingress};

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
    let recent = FLOW_RECENT.get_ptr_mut(slot(&t.key));
    if let Some(r) = recent {
        // SAFETY: this CPU's own slot; nothing else touches it meanwhile.
        if unsafe { (*r).path == path && same(&(*r).key, &t.key) } {
            return;
        }
    }
    // Whether `mycni_flow_seen` now holds this packet's path for it.
    let settled = match FLOW_SEEN.get_ptr_mut(&t.key) {
        Some(seen) => {
            // SAFETY: a live map value; concurrent updates from another CPU
            // at worst announce one change twice or not at all.
            let (last_path, last_ns, changes) =
                unsafe { ((*seen).path, (*seen).last_ns, (*seen).changes) };
            // An established connection on its path, new to this CPU's
            // slots.
            if last_path == path {
                true
            // SYN, FIN and RST always go to the kernel: a known
            // connection's open or close is not a change of its path.
            } else if path == DpPath::KernelTcpControl as u32 {
                false
            } else {
                announce_change(ctx, t, source, seen, path, last_ns, changes)
            }
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
            let inserted = FLOW_SEEN
                .insert(&t.key, &seen, u64::from(BPF_NOEXIST))
                .is_ok();
            if inserted {
                emit(ctx, t, source, FLOW_NEW, path, now);
            }
            inserted
        }
    };
    if let (true, Some(r)) = (settled, recent) {
        // SAFETY: this CPU's own slot, as above.
        unsafe {
            let dst = &raw mut (*r).key as *mut u64;
            for (i, w) in words64(&t.key).iter().enumerate() {
                // Volatile: a plain copy loop may become a call of the
                // object's byte-by-byte memcpy (see `zero_in_place`).
                dst.add(i).write_volatile(*w);
            }
            (*r).path = path;
        }
    }
}

/// A known connection on another path than the one announced last:
/// announced, unless its changes are past the free ones and the last was
/// less than a second ago. Whether it was.
#[inline(always)]
fn announce_change(
    ctx: &TcContext,
    t: &Tuple,
    source: FlowSource,
    seen: *mut Seen,
    path: u32,
    last_ns: u64,
    changes: u32,
) -> bool {
    // SAFETY: a helper call without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    if changes >= PATH_CHANGES_FREE && now.wrapping_sub(last_ns) < PATH_INTERVAL_NS {
        stat(FLOW_STAT_SUPPRESSED);
        return false;
    }
    // SAFETY: a live map value; racing CPUs at worst announce one change
    // twice or not at all.
    unsafe {
        (*seen).path = path;
        (*seen).last_ns = now;
        (*seen).changes = changes.saturating_add(1);
    }
    emit(ctx, t, source, FLOW_PATH, path, now);
    true
}

/// The 32-bit words of a key (40 bytes, 8-aligned, no implicit padding).
#[inline(always)]
fn words(k: &FlowKey) -> &[u32; 10] {
    const { assert!(core::mem::size_of::<FlowKey>() == 40) };
    // SAFETY: same size, FlowKey is repr(C, align(8)) with explicit padding.
    unsafe { &*(k as *const FlowKey as *const [u32; 10]) }
}

/// The same as 64-bit words, for hashing and comparing in fewer steps.
#[inline(always)]
fn words64(k: &FlowKey) -> &[u64; 5] {
    const { assert!(core::mem::align_of::<FlowKey>() == 8) };
    // SAFETY: as `words`; the key is 8-aligned.
    unsafe { &*(k as *const FlowKey as *const [u64; 5]) }
}

/// The `mycni_flow_recent` slot of a key: its words folded in order (so a
/// connection's two directions land apart), then spread (Fibonacci).
#[inline(always)]
fn slot(k: &FlowKey) -> u32 {
    let mut h: u64 = 0;
    for w in words64(k) {
        h = h.rotate_left(17) ^ w;
    }
    (h.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - FLOW_RECENT_SLOTS.trailing_zeros())) as u32
}

#[inline(always)]
fn same(a: &FlowKey, b: &FlowKey) -> bool {
    let (a, b) = (words64(a), words64(b));
    let mut diff = 0;
    for i in 0..5 {
        diff |= a[i] ^ b[i];
    }
    diff == 0
}

const BPF_NOEXIST: u32 = aya_ebpf::bindings::BPF_NOEXIST;

// The word layout `emit` writes (little-endian, as the bpfel target is).
const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<FlowEvent>() == 64);
    assert!(offset_of!(FlowEvent, src) == 8 && offset_of!(FlowEvent, dst) == 24);
    assert!(offset_of!(FlowEvent, sport) == 40 && offset_of!(FlowEvent, dport) == 42);
    assert!(offset_of!(FlowKey, sport) == 32 && offset_of!(FlowKey, dport) == 34);
    assert!(offset_of!(FlowEvent, ifindex) == 44 && offset_of!(FlowEvent, count) == 48);
    assert!(offset_of!(FlowEvent, reason) == 52 && offset_of!(FlowEvent, proto) == 54);
    assert!(offset_of!(FlowEvent, family) == 55 && offset_of!(FlowEvent, tcp_flags) == 56);
    assert!(offset_of!(FlowEvent, source) == 57 && offset_of!(FlowEvent, kind) == 58);
};

/// Writes one event into the ring, in place; a full ring is counted, never
/// waited on.
#[inline(always)]
fn emit(ctx: &TcContext, t: &Tuple, source: FlowSource, kind: u8, reason: u32, now: u64) {
    let Some(mut entry) = FLOWS.reserve(0) else {
        stat(FLOW_STAT_LOST);
        return;
    };
    let e = entry.as_mut_ptr() as *mut u32;
    let k = words(&t.key);
    // FlowEvent as its 16 words, each written once (the ring's memory is not
    // zeroed, so padding too): field by field, the arrays and padding would
    // become calls of the object's byte-by-byte memmove and memset.
    let word = |lo: u8, b1: u8, b2: u8, b3: u8| u32::from_le_bytes([lo, b1, b2, b3]);
    let fields: [u32; 14] = [
        k[0],
        k[1],
        k[2],
        k[3],
        k[4],
        k[5],
        k[6],
        k[7],
        // sport and dport, as the key holds them.
        k[8],
        ingress(ctx),
        1,
        (reason & 0xffff) | (u32::from(t.key.proto) << 16) | (u32::from(t.key.family) << 24),
        word(t.tcp_flags, source as u8, kind, 0),
        0,
    ];
    // SAFETY: the reservation is this program's alone until submitted, 8
    // bytes aligned and 64 long; the layout is checked at compile time
    // (the const block above).
    unsafe {
        (e as *mut u64).write_volatile(now);
        for (i, w) in fields.iter().enumerate() {
            e.add(2 + i).write_volatile(*w);
        }
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
