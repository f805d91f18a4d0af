//! Flow events: what the programs tell the agent about connections and
//! drops, through one BPF ring buffer (`mycni_flows`).
//!
//! Bounded by design: a program emits an event for the first packet of a
//! connection it sees, when the path of a connection changes, and for a
//! drop at most once a second per flow and reason (`count` says how many
//! packets it stands for); never one per packet. A full ring is counted
//! (`FLOW_STAT_LOST`), never waited on.

/// Name (and pin name) of the flow-event ring buffer.
pub const FLOWS_MAP: &str = "mycni_flows";
/// The ring's default size in bytes: a power of two and a multiple of the
/// page size; ~16,000 events, a third of a second at 50,000 events a second.
pub const FLOWS_RING_BYTES: u32 = 1 << 20;

/// Name (and pin name) of the per-CPU event statistics (`u64` per slot).
pub const FLOW_STATS_MAP: &str = "mycni_flow_stats";
/// `mycni_flow_stats` slots: events written to the ring,
pub const FLOW_STAT_EMITTED: u32 = 0;
/// events the ring had no room for,
pub const FLOW_STAT_LOST: u32 = 1;
/// packets folded into a later event by the once-a-second limit.
pub const FLOW_STAT_SUPPRESSED: u32 = 2;
pub const FLOW_STATS_LEN: u32 = 3;

/// `FlowEvent::kind`: the first packet of a connection this program saw.
pub const FLOW_NEW: u8 = 0;
/// A connection this program saw before took another path (for example,
/// left to the kernel while conntrack confirmed it, then fast).
pub const FLOW_PATH: u8 = 1;
/// A drop (`reason` is then a kernel drop reason when `source` is
/// `FlowSource::KernelDrop`).
pub const FLOW_DROP: u8 = 2;

/// `FlowEvent::source`: who saw the packet.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlowSource {
    /// `mycni_from_pod`, on a pod's host veth.
    Pod = 0,
    /// `mycni_from_vxlan`, on `vxlan.1` / `vxlan6.1`.
    Vxlan = 1,
    /// `mycni_from_underlay`, on the underlay device (the inner packet).
    Underlay = 2,
    /// The kernel freed the packet (`kfree_skb`) on a pod or overlay device.
    KernelDrop = 3,
}

impl FlowSource {
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Self::Pod,
            1 => Self::Vxlan,
            2 => Self::Underlay,
            3 => Self::KernelDrop,
            _ => return None,
        })
    }
}

/// One event, 64 bytes, as the ring holds it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowEvent {
    /// `bpf_ktime_get_ns`: CLOCK_MONOTONIC, nanoseconds.
    pub ts_ns: u64,
    /// Network byte order; an IPv4 address in the first 4 bytes, the rest 0.
    pub src: [u8; 16],
    pub dst: [u8; 16],
    /// Host byte order; 0 for protocols without ports.
    pub sport: u16,
    pub dport: u16,
    /// The device the packet arrived on (for a kernel drop, the skb's device).
    pub ifindex: u32,
    /// Packets this event stands for (1, or a drop's repeats folded in).
    pub count: u32,
    /// `DpPath` for the tc programs; the kernel's `skb_drop_reason` for
    /// `FlowSource::KernelDrop`.
    pub reason: u16,
    /// IP protocol number (6 TCP, 17 UDP, 132 SCTP, 1/58 ICMP).
    pub proto: u8,
    /// 4 or 6.
    pub family: u8,
    /// The TCP flags byte (FIN 0x01 ... CWR 0x80); 0 otherwise.
    pub tcp_flags: u8,
    /// `FlowSource`.
    pub source: u8,
    /// `FLOW_NEW`, `FLOW_PATH` or `FLOW_DROP`.
    pub kind: u8,
    pub _pad: [u8; 5],
}

#[cfg(feature = "user")]
// SAFETY: plain old data, every bit pattern valid.
unsafe impl aya::Pod for FlowEvent {}

const _: () = assert!(core::mem::size_of::<FlowEvent>() == 64);

/// Name of the hash of interfaces whose kernel drops the `kfree_skb`
/// tracepoint reports (`DropIface` -> `u8`, the value unused): the pod
/// host veths and `vxlan.1` / `vxlan6.1` of the agent's node, never the
/// underlay. Not pinned: it lives as long as the agent that fills it.
pub const DROP_IFACES_MAP: &str = "mycni_drop_ifaces";
/// Interfaces a node watches at most (a node's pods plus its two VXLAN
/// devices, with room to spare).
pub const DROP_IFACES_MAX: u32 = 4096;

/// A watched interface: ifindexes are per network namespace, and the
/// tracepoint sees every namespace of the kernel (a lab runs several
/// nodes on one), so the key names both.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DropIface {
    pub ifindex: u32,
    /// The inode number of the namespace (`stat -L /proc/self/ns/net`),
    /// the kernel's `net->ns.inum`.
    pub netns: u32,
}

#[cfg(feature = "user")]
// SAFETY: plain old data, every bit pattern valid.
unsafe impl aya::Pod for DropIface {}

/// Name of the `kfree_skb` tracepoint's rate limit (`DropKey` ->
/// `DropLimit`, LRU): when each flow and reason was last reported and the
/// drops folded since. Pinned, so that the agent's ring reader can report
/// what was folded after a flow's last event (nothing else would: the
/// program reports a fold only with the next drop).
pub const DROP_LIMIT_MAP: &str = "mycni_drop_limit";

/// A dropped packet's flow and reason, as the rate limit keys it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DropKey {
    /// Network byte order, as `FlowEvent`'s.
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub sport: u16,
    pub dport: u16,
    pub ifindex: u32,
    pub netns: u32,
    pub reason: u16,
    pub proto: u8,
    pub family: u8,
}

#[cfg(feature = "user")]
// SAFETY: plain old data without padding, every bit pattern valid.
unsafe impl aya::Pod for DropKey {}

const _: () = assert!(core::mem::size_of::<DropKey>() == 48);

/// When a flow and reason was last reported, and the drops since.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DropLimit {
    /// `bpf_ktime_get_ns` of the last event.
    pub last_ns: u64,
    /// Drops since, not reported yet.
    pub folded: u64,
}

#[cfg(feature = "user")]
// SAFETY: plain old data, every bit pattern valid.
unsafe impl aya::Pod for DropLimit {}

/// `FlowEvent::reason` of a kernel drop whose reason belongs to a
/// subsystem (the kernel's upper 16 bits: mac80211, openvswitch), which
/// the 16-bit field cannot hold.
pub const KDROP_REASON_SUBSYSTEM: u16 = u16::MAX;
