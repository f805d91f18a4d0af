//! The conntrack gate: only flows the kernel's conntrack holds as
//! established and not NATed take the fast path. The lookup itself is
//! c/ct_gate.c (kfunc calls need BTF that rustc does not emit), linked in
//! as bitcode and inlined.

use aya_ebpf::{EbpfContext, programs::TcContext};
use mycni_common::{DpPath, POLICY_MARK_SHIFT};

use crate::maps::POLICY;
use crate::parse::{Addrs, L4};

// Keep in step with c/ct_gate.c.
const CT_ESTABLISHED: i32 = 1;
const CT_NAT: i32 = 2;
const CT_POLICY_STALE: i32 = 4;

unsafe extern "C" {
    /// c/ct_gate.c: the conntrack lookup (kfuncs), linked in as bitcode.
    fn mycni_ct_gate(
        skb: *mut core::ffi::c_void,
        saddr: u32,
        daddr: u32,
        ports: u32,
        l4proto: u32,
        timeout_ms: u32,
        policy_mark: u32,
    ) -> i32;
    /// The same for IPv6: `addrs` is source then destination, 32 bytes.
    fn mycni_ct_gate6(
        skb: *mut core::ffi::c_void,
        addrs: *const u32,
        ports: u32,
        l4proto: u32,
        timeout_ms: u32,
        policy_mark: u32,
    ) -> i32;
}

/// Whether the flow of `addrs` and `l4` (IPv4 for `N` = 4, else IPv6) is
/// established and not NATed; the gate then renews its conntrack entry's
/// timeout. Else the reason the kernel must see the packet.
#[inline(always)]
pub(crate) fn gate<const N: usize>(
    ctx: &TcContext,
    addrs: &Addrs<N>,
    l4: &L4,
    l4proto: u8,
) -> Result<(), DpPath> {
    let (ports, proto, timeout_ms) = (l4.ports, u32::from(l4proto), l4.timeout_ms);
    // The stamp an entry must carry to go fast: the current epoch's, in
    // the mark's policy bits; 0 (no policy on this node) checks nothing.
    let policy_mark = POLICY.get(0).map_or(0, |e| *e << POLICY_MARK_SHIFT);
    // SAFETY: the gate only reads the tuple (for IPv6 the 32 address bytes,
    // 4-aligned in `Addrs`) and the conntrack entry, and releases the
    // reference it takes.
    let ct = unsafe {
        if N == 4 {
            // Two 4-byte addresses: the words at offsets 0 and 4 (repr(C)).
            let [saddr, daddr] = *(addrs as *const Addrs<N> as *const [u32; 2]);
            mycni_ct_gate(
                ctx.as_ptr(),
                saddr,
                daddr,
                ports,
                proto,
                timeout_ms,
                policy_mark,
            )
        } else {
            let words = addrs as *const Addrs<N> as *const u32;
            mycni_ct_gate6(ctx.as_ptr(), words, ports, proto, timeout_ms, policy_mark)
        }
    };
    match ct {
        CT_ESTABLISHED => Ok(()),
        CT_NAT => Err(DpPath::KernelNat),
        CT_POLICY_STALE => Err(DpPath::KernelPolicyStale),
        _ => Err(DpPath::KernelNotEstablished),
    }
}
