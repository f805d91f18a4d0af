//! mycni tc programs.
//!
//! Entry points are thin and named by direction; the work is in `try_*`
//! functions. Every packet a program sees is counted exactly once in
//! `mycni_counters`, under the path it took or the reason it was left to the
//! kernel. Anything the program is not sure about returns `TCX_NEXT`, so the
//! kernel's routes, ARP and FDB (and other tools' programs) decide.
#![no_std]
#![no_main]

use aya_ebpf::{
    btf_maps::PerCpuArray,
    macros::{btf_map, classifier},
    programs::TcContext,
};
use mycni_common::{Path, PathCounter, TCX_NEXT};

#[btf_map(name = "mycni_counters")]
static COUNTERS: PerCpuArray<PathCounter, { Path::COUNT as usize }> = PerCpuArray::new();

const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const IPV4_MIN_HLEN: usize = 20;

#[inline(always)]
fn count(path: Path, bytes: u32) {
    if let Some(slot) = COUNTERS.get_ptr_mut(path as u32) {
        // SAFETY: the slot is this CPU's own; no other program instance
        // touches it concurrently, so plain adds are race-free.
        unsafe {
            (*slot).packets += 1;
            (*slot).bytes += u64::from(bytes);
        }
    }
}

/// Traffic from a pod, on ingress of its host-side veth.
#[classifier]
fn mycni_from_pod(ctx: TcContext) -> i32 {
    let (path, verdict) = classify(&ctx);
    count(path, ctx.len());
    verdict
}

#[inline(always)]
fn classify(ctx: &TcContext) -> (Path, i32) {
    let data = ctx.data();
    let end = ctx.data_end();
    if data + ETH_HLEN > end {
        return (Path::KernelTruncated, TCX_NEXT);
    }
    // SAFETY: bounds checked above against data_end, as the verifier requires.
    let proto = unsafe { u16::from_be(*((data + 12) as *const u16)) };
    if proto != ETH_P_IP {
        return (Path::KernelNotIpv4, TCX_NEXT);
    }
    if data + ETH_HLEN + IPV4_MIN_HLEN > end {
        return (Path::KernelTruncated, TCX_NEXT);
    }
    // No forwarding maps yet: every IPv4 destination is unknown to the fast
    // path and goes on to the kernel.
    (Path::KernelUnknownDest, TCX_NEXT)
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
