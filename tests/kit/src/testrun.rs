//! `BPF_PROG_TEST_RUN`: the kernel runs a loaded (verified) program once on a
//! packet the test made, and hands back its verdict and the packet as the
//! program left it. aya 0.16 has no wrapper, so this is the raw syscall.
//!
//! For a tc (`SCHED_CLS`) program the kernel builds the skb in the calling
//! thread's network namespace, on that namespace's loopback device; kfuncs
//! such as the conntrack lookup therefore see that namespace's tables. A
//! redirect is only recorded, never carried out: the verdict says
//! `TC_ACT_REDIRECT` and the packet comes back as rewritten.

use std::os::fd::{AsRawFd, BorrowedFd};

use anyhow::{Result, bail};

/// `BPF_PROG_TEST_RUN` in `enum bpf_cmd`.
const BPF_PROG_TEST_RUN: libc::c_long = 10;

/// Room for a program that grows the packet; ours never do.
const HEADROOM_OUT: usize = 256;

/// The `test` member of the kernel's `union bpf_attr`
/// (include/uapi/linux/bpf.h), field for field; the tail padding keeps the
/// size a multiple of its `__aligned_u64` members, and the kernel requires
/// it zeroed.
#[repr(C)]
#[derive(Default)]
struct TestAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

const _: () = assert!(std::mem::size_of::<TestAttr>() == 80);

/// What one run gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The program's return value (e.g. 7 = `TC_ACT_REDIRECT`, -1 = `TCX_NEXT`).
    pub retval: i32,
    /// The packet, from the Ethernet header on, as the program left it.
    pub data: Vec<u8>,
}

/// Runs the tc program `prog` once on `packet`, an Ethernet frame. The
/// kernel refuses (`EINVAL`, nothing runs) frames shorter than an Ethernet
/// header and, on Linux 6.18, IPv4 or IPv6 frames without a whole fixed L3
/// header.
pub fn run_skb(prog: BorrowedFd<'_>, packet: &[u8]) -> Result<Outcome> {
    run_skb_from(prog, packet, 0)
}

/// [`run_skb`] with the skb's `ingress_ifindex` (the interface a packet
/// arrived on; 0 for none) set through the `__sk_buff` context, which
/// `BPF_PROG_TEST_RUN` accepts for this field.
pub fn run_skb_from(prog: BorrowedFd<'_>, packet: &[u8], ingress_ifindex: u32) -> Result<Outcome> {
    run_skb_repeat(prog, packet, ingress_ifindex, 1).map(|(o, _)| o)
}

/// [`run_skb_from`] `repeat` times in the kernel (the same packet each
/// time): the last run's outcome and the kernel's mean time per run, ns.
pub fn run_skb_repeat(
    prog: BorrowedFd<'_>,
    packet: &[u8],
    ingress_ifindex: u32,
    repeat: u32,
) -> Result<(Outcome, u32)> {
    // `struct __sk_buff` up to and including `ingress_ifindex` (offset 36);
    // the kernel zero-fills the rest and requires len and pkt_type zero.
    let mut ctx = [0u8; 40];
    ctx[36..40].copy_from_slice(&ingress_ifindex.to_ne_bytes());
    let mut out = vec![0u8; packet.len() + HEADROOM_OUT];
    let mut attr = TestAttr {
        prog_fd: u32::try_from(prog.as_raw_fd())?,
        data_size_in: u32::try_from(packet.len())?,
        data_size_out: u32::try_from(out.len())?,
        data_in: packet.as_ptr() as u64,
        data_out: out.as_mut_ptr() as u64,
        repeat,
        ctx_size_in: u32::try_from(ctx.len())?,
        ctx_in: ctx.as_ptr() as u64,
        ..Default::default()
    };
    // SAFETY: `attr` matches the kernel's layout and outlives the call; the
    // kernel reads `data_size_in` bytes from `packet` and writes at most
    // `data_size_out` bytes into `out`, both of which are that long.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_TEST_RUN,
            &mut attr as *mut TestAttr,
            std::mem::size_of::<TestAttr>(),
        )
    };
    if rc != 0 {
        bail!(
            "BPF_PROG_TEST_RUN on {} bytes: {}",
            packet.len(),
            std::io::Error::last_os_error()
        );
    }
    out.truncate(attr.data_size_out as usize);
    let outcome = Outcome {
        retval: attr.retval as i32,
        data: out,
    };
    Ok((outcome, attr.duration))
}
