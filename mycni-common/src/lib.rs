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

/// Names (and pin names) of the forwarding maps.
pub const CONFIG_MAP: &str = "mycni_config";
pub const REMOTE_MAP: &str = "mycni_remote";
pub const LOCAL_MAP: &str = "mycni_local";

/// Capacity of the remote-podCIDR trie: one entry per peer Node.
pub const REMOTE_MAX: u32 = 16_384;
/// Capacity of the local-endpoint map: one entry per pod on this node.
pub const LOCAL_MAX: u32 = 4_096;

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
    /// Left to the kernel: conntrack has no entry, or one not yet established.
    KernelNotEstablished = 6,
    /// Forwarded by the fast path to a pod on another node through `vxlan.1`.
    FastRemote = 7,
    /// Forwarded by the fast path from a pod to a pod on this node.
    FastLocal = 8,
    /// Left to the kernel: conntrack holds the flow as NATed (a Service), so
    /// only the kernel can translate it.
    KernelNat = 9,
    /// Left to the kernel: neither TCP nor UDP (ICMP, SCTP, ...).
    KernelNotTcpUdp = 10,
    /// Left to the kernel: the agent has not written the datapath config yet.
    KernelNoConfig = 11,
    /// Left to the kernel: a redirect or header rewrite failed.
    KernelError = 12,
    /// Forwarded by the fast path from `vxlan.1` (decapsulated) to a pod on this node.
    FastDecap = 13,
    /// Left to the kernel: the source address is not the sending pod's own
    /// (spoofed, or a pod the agent has not mirrored yet).
    KernelSourceNotPod = 14,
}

impl Path {
    /// Number of counter slots; the counter map has exactly this many entries.
    pub const COUNT: u32 = 15;

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
        Path::KernelNat,
        Path::KernelNotTcpUdp,
        Path::KernelNoConfig,
        Path::KernelError,
        Path::FastDecap,
        Path::KernelSourceNotPod,
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
            Path::KernelNat => "kernel_nat",
            Path::KernelNotTcpUdp => "kernel_not_tcp_udp",
            Path::KernelNoConfig => "kernel_no_config",
            Path::KernelError => "kernel_error",
            Path::FastDecap => "fast_decap",
            Path::KernelSourceNotPod => "kernel_source_not_pod",
        }
    }

    /// Whether packets counted here skipped the kernel's forwarding path.
    pub const fn is_fast(self) -> bool {
        matches!(self, Path::FastRemote | Path::FastLocal | Path::FastDecap)
    }
}

/// One counter slot: per CPU in the map, summed by userspace.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PathCounter {
    pub packets: u64,
    pub bytes: u64,
}

/// The node's own datapath settings: the single entry (key 0) of `mycni_config`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DpConfig {
    /// ifindex of `vxlan.1`; 0 means "not configured": everything goes to the kernel.
    pub vxlan_ifindex: u32,
    /// Conntrack timeout (ms) the fast path renews on an established TCP
    /// flow, as the kernel would on every packet it sees
    /// (`nf_conntrack_tcp_timeout_established`). 0: no renewal.
    pub tcp_timeout_ms: u32,
    /// The same for an assured UDP flow (`nf_conntrack_udp_timeout_stream`).
    pub udp_timeout_ms: u32,
    /// MAC address of `vxlan.1`, the source of every frame sent into it.
    pub vtep_mac: [u8; 6],
    pub _pad: [u8; 2],
}

/// A peer Node's podCIDR in `mycni_remote` (an LPM trie keyed by the CIDR).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoteNode {
    /// The peer's VTEP MAC: the destination of frames sent into `vxlan.1`,
    /// which the kernel's FDB maps to the peer's host IP.
    pub vtep_mac: [u8; 6],
    pub _pad: [u8; 2],
    /// The peer's host IP (network byte order), for `inspect`; the program
    /// leaves the choice of the underlay address to the FDB.
    pub host_ip: u32,
}

/// A pod on this node in `mycni_local`, keyed by its IPv4 address (network
/// byte order).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LocalEndpoint {
    /// ifindex of the pod's host-side veth (`bpf_redirect_peer` target).
    pub ifindex: u32,
    /// MAC of the pod's eth0: the destination of frames delivered to it.
    pub pod_mac: [u8; 6],
    /// MAC of the host-side veth: their source (the pod's gateway).
    pub host_mac: [u8; 6],
}

// SAFETY (all four): plain old data, repr(C), explicit padding, every bit
// pattern valid.
#[cfg(feature = "user")]
unsafe impl aya::Pod for PathCounter {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for DpConfig {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for RemoteNode {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for LocalEndpoint {}

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
    fn map_values_have_no_implicit_padding() {
        assert_eq!(core::mem::size_of::<PathCounter>(), 16);
        assert_eq!(core::mem::size_of::<DpConfig>(), 20);
        assert_eq!(core::mem::size_of::<RemoteNode>(), 12);
        assert_eq!(core::mem::size_of::<LocalEndpoint>(), 16);
    }
}
