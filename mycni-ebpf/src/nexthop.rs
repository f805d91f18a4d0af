//! Each peer's underlay next hop, remembered per CPU so that an
//! encapsulated packet skips the FIB lookup (~0.2 us of ~1 us a packet).
//!
//! The FIB stays the authority: an entry is only a copy of what
//! `bpf_fib_lookup` answered (device, MACs, route MTU) for the same
//! question, and it is trusted only while nothing in the kernel's routing
//! may have changed since. The agent bumps `mycni_nexthop_gen` on every
//! link, address, route and neighbour notification of its namespace; an
//! entry carries the generation read *before* its lookup, so a lookup that
//! raced a change is never trusted after the bump. Generation 0 (no agent
//! has bumped it yet) turns the cache off. An entry also ages out after
//! `TTL_JIFFIES` (1 s at HZ=250), which bounds how long a change goes
//! unnoticed while no agent runs to bump the generation.

use aya_ebpf::helpers::generated::bpf_jiffies64;

use crate::forward::Route;
use crate::maps::{NEXTHOP_GEN, NEXTHOP_SLOTS, NEXTHOPS, NextHop};

/// How long an entry is trusted without a bump: 250 jiffies (0.25 s at
/// HZ=1000, 1 s at 250, 2.5 s at 100).
const TTL_JIFFIES: u64 = 250;

/// The generation and time a lookup is made under; `generation` 0: no cache.
pub(crate) struct Stamp {
    generation: u32,
    now: u64,
}

/// This moment's generation; read before the lookup it may vouch for.
#[inline(always)]
pub(crate) fn stamp() -> Stamp {
    let generation = NEXTHOP_GEN.get(0).copied().unwrap_or(0);
    // SAFETY: a helper call without arguments. jiffies, not ktime: ~2 ns
    // against ~20, and a TTL needs no finer clock.
    let now = if generation != 0 {
        unsafe { bpf_jiffies64() }
    } else {
        0
    };
    Stamp { generation, now }
}

/// The route to `host_ip` this CPU remembers, if it is of this generation,
/// young, out of `via`, and its MTU takes a `len`-byte packet (a longer
/// one goes to the lookup, which says FRAG_NEEDED).
#[inline(always)]
pub(crate) fn hit(s: &Stamp, host_ip: u32, via: u32, len: u32) -> Option<Route> {
    if s.generation == 0 {
        return None;
    }
    let e = NEXTHOPS.get(slot(host_ip))?;
    if e.host_ip != host_ip
        || e.generation != s.generation
        || e.ifindex != via
        || s.now.wrapping_sub(e.filled) >= TTL_JIFFIES
        || len > e.mtu
    {
        return None;
    }
    Some(Route {
        ifindex: e.ifindex,
        macs: Some((e.dmac, e.smac)),
        mtu: e.mtu,
    })
}

/// Remembers what the lookup stamped `s` answered for `host_ip`: only a
/// complete answer (MACs known, an MTU).
#[inline(always)]
pub(crate) fn fill(s: &Stamp, host_ip: u32, r: &Route) {
    let (Some((dmac, smac)), true) = (r.macs, s.generation != 0 && r.mtu != 0) else {
        return;
    };
    if let Some(e) = NEXTHOPS.get_ptr_mut(slot(host_ip)) {
        // SAFETY: this CPU's own slot; programs on it do not nest.
        unsafe {
            *e = NextHop {
                host_ip,
                generation: s.generation,
                ifindex: r.ifindex,
                mtu: r.mtu,
                filled: s.now,
                dmac,
                smac,
                _pad: [0; 4],
            };
        }
    }
}

/// A peer's slot: a multiplicative hash of its host IP. Two peers sharing
/// one only take turns in it.
#[inline(always)]
fn slot(host_ip: u32) -> u32 {
    host_ip.wrapping_mul(0x9e37_79b1) >> (32 - NEXTHOP_SLOTS.trailing_zeros())
}
