//! Types shared by the eBPF programs (`mycni-ebpf`) and userspace (`mycni-agent`).
//!
//! Every type here is `#[repr(C)]` with explicit padding, because the kernel
//! and both sides read the same bytes, and BTF describes them to `bpftool`.
#![no_std]

/// bpffs directory under which the agent pins maps, programs and links.
pub const PIN_DIR: &str = "/sys/fs/bpf/mycni";

/// Name of the per-CPU counter map (also its pin name).
pub const COUNTERS_MAP: &str = "mycni_counters";

/// TCX verdict "no opinion": the next program on the hook (or the kernel) decides.
/// Unlike `TC_ACT_OK`, it does not end the chain, so other tools' programs still run.
pub const TCX_NEXT: i32 = -1;

/// Every packet a mycni program sees is counted exactly once, under the path it
/// took or the reason it was left to the kernel (cf. Cilium's drop reasons).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// Left to the kernel: not an IPv4 packet (ARP, IPv6, ...).
    KernelNotIpv4 = 0,
    /// Left to the kernel: the headers are shorter than they claim.
    KernelTruncated = 1,
    /// Left to the kernel: no map entry for the destination.
    KernelUnknownDest = 2,
    /// Left to the kernel: TTL would expire here.
    KernelTtl = 3,
    /// Left to the kernel: IP options or a fragment.
    KernelIpOptionsOrFragment = 4,
    /// Left to the kernel: TCP SYN, FIN or RST, so conntrack sees every open and close.
    KernelTcpControl = 5,
    /// Left to the kernel: conntrack does not hold the flow as established without NAT.
    KernelNotEstablished = 6,
    /// Forwarded by the fast path to a pod on another node through `vxlan.1`.
    FastRemote = 7,
    /// Forwarded by the fast path to a pod on this node.
    FastLocal = 8,
}

impl Path {
    /// Number of counter slots; the counter map has exactly this many entries.
    pub const COUNT: u32 = 9;

    pub const ALL: [Path; Self::COUNT as usize] = [
        Path::KernelNotIpv4,
        Path::KernelTruncated,
        Path::KernelUnknownDest,
        Path::KernelTtl,
        Path::KernelIpOptionsOrFragment,
        Path::KernelTcpControl,
        Path::KernelNotEstablished,
        Path::FastRemote,
        Path::FastLocal,
    ];

    /// Stable label used in metrics and `inspect` output.
    pub const fn name(self) -> &'static str {
        match self {
            Path::KernelNotIpv4 => "kernel_not_ipv4",
            Path::KernelTruncated => "kernel_truncated",
            Path::KernelUnknownDest => "kernel_unknown_dest",
            Path::KernelTtl => "kernel_ttl",
            Path::KernelIpOptionsOrFragment => "kernel_ip_options_or_fragment",
            Path::KernelTcpControl => "kernel_tcp_control",
            Path::KernelNotEstablished => "kernel_not_established",
            Path::FastRemote => "fast_remote",
            Path::FastLocal => "fast_local",
        }
    }
}

/// One counter slot: per CPU in the map, summed by userspace.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PathCounter {
    pub packets: u64,
    pub bytes: u64,
}

#[cfg(feature = "user")]
// SAFETY: plain old data, repr(C), no padding, every bit pattern valid.
unsafe impl aya::Pod for PathCounter {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_indices_are_dense_and_named_uniquely() {
        for (i, p) in Path::ALL.iter().enumerate() {
            assert_eq!(*p as u32, i as u32);
        }
        for a in Path::ALL {
            for b in Path::ALL {
                if a != b {
                    assert_ne!(a.name(), b.name());
                }
            }
        }
    }

    #[test]
    fn counter_has_no_padding() {
        assert_eq!(core::mem::size_of::<PathCounter>(), 16);
    }
}
