//! Drops the kernel makes outside mycni's programs (reverse-path filter,
//! conntrack INVALID dropped by a rule, no route, no neighbour, ...), from
//! the kernel's own drop reasons: the `kfree_skb` tracepoint, on the pod
//! and overlay interfaces the agent lists in `mycni_drop_ifaces`.
//!
//! The kernel calls `kfree_skb` for every packet it frees with a reason,
//! on every interface of every namespace, so the order is cheapest first:
//! the reason (an argument), then the device and its namespace (three
//! loads), then one hash lookup; only a watched interface's drop reads
//! packet headers. A drop is reported at most once a second per flow and
//! reason; the repeats in between are folded into the next event's
//! `count` (and `FLOW_STAT_SUPPRESSED`), or, when no drop of the flow
//! follows, reported by the agent's ring reader from the pinned limit map
//! once the second is over.
//!
//! The `struct sk_buff` fields are read in c/skb_drop.c (CO-RE: their
//! offsets change between kernels); the headers with
//! `bpf_probe_read_kernel`, never past the skb's linear data.

use core::ffi::c_void;

use aya_ebpf::{
    btf_maps::{HashMap, LruHashMap},
    helpers::{bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::btf_map,
    programs::BtfTracePointContext,
};
use mycni_common::flow::{
    DROP_IFACES_MAX, DropIface, DropKey, DropLimit, FLOW_DROP, FLOW_STAT_EMITTED, FLOW_STAT_LOST,
    FLOW_STAT_SUPPRESSED, FlowEvent, FlowSource, KDROP_REASON_SUBSYSTEM,
};

use crate::maps::{FLOW_STATS, FLOWS};

/// The interfaces whose drops are reported, written by the agent each pass
/// (`mycni_common::flow::DROP_IFACES_MAP`).
#[btf_map(name = "mycni_drop_ifaces")]
pub(crate) static DROP_IFACES: HashMap<DropIface, u8, { DROP_IFACES_MAX as usize }> =
    HashMap::new();

/// Flows and reasons recently reported: when, and the drops since. LRU: a
/// flood of distinct flows evicts the oldest, which then report again.
/// Pinned: the agent reports what stays folded after a flow's last drop
/// (`mycni_common::flow::DROP_LIMIT_MAP`).
#[btf_map(name = "mycni_drop_limit")]
static DROP_LIMIT: LruHashMap<DropKey, DropLimit, 16384> = LruHashMap::new();

const SECOND_NS: u64 = 1_000_000_000;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const IPPROTO_SCTP: u8 = 132;

// Keep in step with c/skb_drop.c.
#[repr(C)]
struct SkbDev {
    ifindex: u32,
    netns: u32,
}

#[repr(C)]
struct SkbL3 {
    nh: u64,
    avail: u32,
    protocol: u16,
    _pad: u16,
}

unsafe extern "C" {
    fn mycni_skb_is_drop(reason: u32) -> i32;
    fn mycni_skb_reason_unspecified(reason: u32) -> i32;
    fn mycni_skb_dev(skb: *mut c_void, out: *mut SkbDev) -> i32;
    fn mycni_skb_l3(skb: *mut c_void, out: *mut SkbL3);
    fn mycni_atomic_add64(p: *mut u64, v: u64);
}

/// The tracepoint's body: `(skb, location, reason, rx_sk)`.
#[inline(always)]
pub(crate) fn on_kfree_skb(ctx: &BtfTracePointContext) {
    let reason: u32 = ctx.arg(2);
    // SAFETY: a pure function of its argument (CO-RE constants).
    if unsafe { mycni_skb_is_drop(reason) } == 0 {
        return;
    }
    let skb: *mut c_void = ctx.arg(0);
    let mut dev = SkbDev {
        ifindex: 0,
        netns: 0,
    };
    // SAFETY: `skb` is the tracepoint's BTF-typed argument; the helper
    // only reads it (fault-safe loads) and writes `dev`.
    if unsafe { mycni_skb_dev(skb, &mut dev) } == 0 {
        return;
    }
    let iface = DropIface {
        ifindex: dev.ifindex,
        netns: dev.netns,
    };
    if DROP_IFACES.get_ptr(&iface).is_none() {
        return;
    }
    let mut l3 = SkbL3 {
        nh: 0,
        avail: 0,
        protocol: 0,
        _pad: 0,
    };
    // SAFETY: as above; writes `l3` only.
    unsafe { mycni_skb_l3(skb, &mut l3) };
    let mut key = DropKey {
        src: [0; 16],
        dst: [0; 16],
        sport: 0,
        dport: 0,
        ifindex: dev.ifindex,
        netns: dev.netns,
        reason: if reason > 0xffff {
            KDROP_REASON_SUBSYSTEM
        } else {
            reason as u16
        },
        proto: 0,
        family: 0,
    };
    let tcp_flags = read_tuple(&l3, &mut key);
    // Multicast nobody on the node listens to is freed without a reason:
    // a pod's neighbour discovery and MLD at every link-up, mDNS. Not a
    // drop anyone debugs, and it would be most of what is reported.
    // SAFETY: a pure function of its argument (a CO-RE constant).
    if multicast(&key) && unsafe { mycni_skb_reason_unspecified(reason) } != 0 {
        return;
    }

    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let count = match DROP_LIMIT.get_ptr_mut(&key) {
        Some(limit) => {
            // SAFETY: the map's value, live while this program runs.
            let limit = unsafe { &mut *limit };
            if now.wrapping_sub(limit.last_ns) < SECOND_NS {
                // Atomic: other CPUs may fold drops of the same flow.
                // SAFETY: an aligned u64 of the map's value.
                unsafe { mycni_atomic_add64(&mut limit.folded, 1) };
                stat(FLOW_STAT_SUPPRESSED);
                return;
            }
            // Not atomic with the adds above: a drop folded on another CPU
            // in between is lost to the count, never reported twice.
            let folded = limit.folded;
            limit.folded = 0;
            limit.last_ns = now;
            folded + 1
        }
        None => {
            let _ = DROP_LIMIT.insert(
                &key,
                &DropLimit {
                    last_ns: now,
                    folded: 0,
                },
                0,
            );
            1
        }
    };
    emit(&key, tcp_flags, now, count);
}

/// Reads the addresses, protocol and ports (TCP flags returned) of the
/// packet into `key`; leaves them 0 where the skb holds no IP header (the
/// drop is then reported per interface and reason).
#[inline(always)]
fn read_tuple(l3: &SkbL3, key: &mut DropKey) -> u8 {
    let nh = l3.nh as *const u8;
    let (l4_off, proto) = match u16::from_be(l3.protocol) {
        ETH_P_IP if l3.avail >= 20 => {
            // SAFETY: 20 bytes of the skb's linear data (checked above).
            let Ok(h) = (unsafe { bpf_probe_read_kernel(nh as *const [u8; 20]) }) else {
                return 0;
            };
            let ihl = u32::from(h[0] & 0x0f) * 4;
            if h[0] >> 4 != 4 || ihl < 20 {
                return 0;
            }
            key.family = 4;
            key.proto = h[9];
            key.src[..4].copy_from_slice(&h[12..16]);
            key.dst[..4].copy_from_slice(&h[16..20]);
            // A fragment after the first carries no ports.
            if (u16::from(h[6] & 0x1f) << 8) | u16::from(h[7]) != 0 {
                return 0;
            }
            (ihl, h[9])
        }
        ETH_P_IPV6 if l3.avail >= 40 => {
            // SAFETY: 40 bytes of the skb's linear data.
            let Ok(h) = (unsafe { bpf_probe_read_kernel(nh as *const [u8; 40]) }) else {
                return 0;
            };
            if h[0] >> 4 != 6 {
                return 0;
            }
            key.family = 6;
            // Extension headers are not walked: their packets are reported
            // with the next header's number and without ports.
            key.proto = h[6];
            key.src.copy_from_slice(&h[8..24]);
            key.dst.copy_from_slice(&h[24..40]);
            (40, h[6])
        }
        _ => return 0,
    };
    if !matches!(proto, IPPROTO_TCP | IPPROTO_UDP | IPPROTO_SCTP) || l3.avail < l4_off + 4 {
        return 0;
    }
    // SAFETY: the first 4 bytes of the L4 header, within the linear data;
    // `l4_off` is at most 60 (IPv4) or 40.
    let l4 = unsafe { nh.add((l4_off & 0x3f) as usize) };
    if let Ok(p) = unsafe { bpf_probe_read_kernel(l4 as *const [u8; 4]) } {
        key.sport = u16::from_be_bytes([p[0], p[1]]);
        key.dport = u16::from_be_bytes([p[2], p[3]]);
    }
    if proto != IPPROTO_TCP || l3.avail < l4_off + 14 {
        return 0;
    }
    // SAFETY: byte 13 of the TCP header, within the linear data.
    unsafe { bpf_probe_read_kernel(l4.add(13)) }.unwrap_or(0)
}

/// Whether the destination is IPv4 multicast or broadcast, or IPv6
/// multicast.
#[inline(always)]
fn multicast(key: &DropKey) -> bool {
    match key.family {
        4 => key.dst[0] >> 4 == 0xe || key.dst[..4] == [0xff; 4],
        6 => key.dst[0] == 0xff,
        _ => false,
    }
}

/// Writes the drop event; a full ring is counted, never waited on.
#[inline(always)]
fn emit(key: &DropKey, tcp_flags: u8, now: u64, count: u64) {
    let Some(mut entry) = FLOWS.reserve(0) else {
        stat(FLOW_STAT_LOST);
        return;
    };
    entry.write(FlowEvent {
        ts_ns: now,
        src: key.src,
        dst: key.dst,
        sport: key.sport,
        dport: key.dport,
        ifindex: key.ifindex,
        count: count.min(u64::from(u32::MAX)) as u32,
        reason: key.reason,
        proto: key.proto,
        family: key.family,
        tcp_flags,
        source: FlowSource::KernelDrop as u8,
        kind: FLOW_DROP,
        _pad: [0; 5],
    });
    entry.submit(0);
    stat(FLOW_STAT_EMITTED);
}

#[inline(always)]
fn stat(slot: u32) {
    if let Some(v) = FLOW_STATS.get_ptr_mut(slot) {
        // SAFETY: this CPU's own slot. A plain add, as the tc programs'
        // counters: only a program nested on this CPU could lose one.
        unsafe { *v += 1 };
    }
}
