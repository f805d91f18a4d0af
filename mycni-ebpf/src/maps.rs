//! Every map the programs share, pinned by the agent under these names.
//!
//! Names, types and value layouts (in `mycni-common`) are a stability
//! boundary: the agent of the same release reads and writes them, and an
//! upgrade that changes one must say so (see ARCHITECTURE.md).

use aya_ebpf::{
    btf_maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, RingBuf},
    macros::btf_map,
};
use mycni_common::flow::{FLOW_STATS_LEN, FLOWS_RING_BYTES, FlowEvent};

use crate::parse::FlowKey;
use mycni_common::{
    COUNTERS_LEN, DpConfig, LOCAL_MAX, LocalEndpoint, PEERS_MAX, PathCounter, PeerNode, REMOTE_MAX,
    RemoteNode,
};

/// Packets and bytes per (family, path); written only by `counters`.
#[btf_map(name = "mycni_counters")]
pub(crate) static COUNTERS: PerCpuArray<PathCounter, { COUNTERS_LEN as usize }> =
    PerCpuArray::new();

/// Flow events for the agent (`mycni_common::flow`): written by `flow`
/// only (and the `kfree_skb` tracepoint), never waited on.
#[btf_map(name = "mycni_flows")]
pub(crate) static FLOWS: RingBuf<FlowEvent, { FLOWS_RING_BYTES as usize }> = RingBuf::new();

/// Per-CPU `u64`s by `FLOW_STAT_*`: events emitted, lost, suppressed.
#[btf_map(name = "mycni_flow_stats")]
pub(crate) static FLOW_STATS: PerCpuArray<u64, { FLOW_STATS_LEN as usize }> = PerCpuArray::new();

/// The connections the programs emitted an event for, keyed by tuple and
/// program (`FlowSource`): what bounds events to one per connection and
/// path change. Not pinned: a restarted agent's programs start afresh, so
/// it hears of every live connection once more.
#[btf_map(name = "mycni_flow_seen")]
pub(crate) static FLOW_SEEN: LruHashMap<FlowKey, Seen, FLOW_SEEN_MAX> = LruHashMap::new();

/// A connection's entry in `mycni_flow_seen`.
#[repr(C)]
pub(crate) struct Seen {
    /// When its last event was emitted (`bpf_ktime_get_ns`).
    pub(crate) last_ns: u64,
    /// The `DpPath` last announced.
    pub(crate) path: u32,
    /// Path changes announced so far (saturating).
    pub(crate) changes: u32,
}

/// Per CPU, the connections whose last packet here was on the path
/// `mycni_flow_seen` holds for them, in slots by a hash of the tuple: an
/// established connection's packet on its path is answered here, without
/// the hash map's lookup (~45 ns a packet where this costs ~5). A slot
/// lost to another connection only sends a packet to `mycni_flow_seen`.
#[btf_map(name = "mycni_flow_recent")]
pub(crate) static FLOW_RECENT: PerCpuArray<Recent, FLOW_RECENT_SLOTS> = PerCpuArray::new();

/// Slots of `mycni_flow_recent` per CPU (48 bytes each); a power of two.
pub(crate) const FLOW_RECENT_SLOTS: usize = 2_048;

/// A slot of `mycni_flow_recent`; all zero (`family` 0) matches nothing.
#[repr(C)]
pub(crate) struct Recent {
    pub(crate) key: FlowKey,
    pub(crate) path: u32,
    pub(crate) _pad: u32,
}

/// Capacity of `mycni_flow_seen`: two entries per connection (one per
/// direction) seen by one program; an evicted connection's next packet is
/// announced again as new. ~100 bytes an entry, preallocated.
pub(crate) const FLOW_SEEN_MAX: usize = 65_536;

#[btf_map(name = "mycni_config")]
pub(crate) static CONFIG: Array<DpConfig, 1> = Array::new();

/// The current NetworkPolicy epoch (`POLICY_MARK_*`), written by the
/// agent's policy room after each change it made; 0: no check.
#[btf_map(name = "mycni_policy")]
pub(crate) static POLICY: Array<u32, 1> = Array::new();

/// Bumped by the agent on every link, address, route and neighbour
/// notification of its namespace (`nexthop`); 0: no next-hop cache.
#[btf_map(name = "mycni_nexthop_gen")]
pub(crate) static NEXTHOP_GEN: Array<u32, 1> = Array::new();

/// Per CPU, peers' underlay next hops as the FIB gave them (`nexthop`), in
/// slots by a hash of the peer's host IP. Not pinned: a new program starts
/// with none.
#[btf_map(name = "mycni_nexthops")]
pub(crate) static NEXTHOPS: PerCpuArray<NextHop, NEXTHOP_SLOTS> = PerCpuArray::new();

/// Slots of `mycni_nexthops` per CPU (40 bytes each); a power of two.
pub(crate) const NEXTHOP_SLOTS: usize = 1_024;

/// A slot of `mycni_nexthops`; all zero (`generation` 0) matches nothing.
#[repr(C)]
pub(crate) struct NextHop {
    pub(crate) host_ip: u32,
    pub(crate) generation: u32,
    pub(crate) ifindex: u32,
    /// The route's MTU (`mtu_result`).
    pub(crate) mtu: u32,
    /// `bpf_jiffies64` when the lookup was made.
    pub(crate) filled: u64,
    pub(crate) dmac: [u8; 6],
    pub(crate) smac: [u8; 6],
    pub(crate) _pad: [u8; 4],
}

/// Peer podCIDRs, mirrored from the routes the agent programs on `vxlan.1`.
#[btf_map(name = "mycni_remote")]
pub(crate) static REMOTE: RemoteMap<4> = LpmTrie::new();

/// Pods on this node, mirrored from the plugin's host routes and veths.
#[btf_map(name = "mycni_local")]
pub(crate) static LOCAL: LocalMap<4> = HashMap::new();

/// Peer Nodes by host IP, mirrored from the FDB entries on `vxlan.1`: the
/// only hosts whose VXLAN the underlay program unwraps.
#[btf_map(name = "mycni_peers")]
pub(crate) static PEERS: HashMap<[u8; 4], PeerNode, { PEERS_MAX as usize }> = HashMap::new();

/// Peer IPv6 podCIDRs, mirrored from the agent's IPv6 routes on `vxlan.1`
/// (the same peers, reached over the same IPv4 underlay) and on `vxlan6.1`
/// (peers over the IPv6 underlay, flagged `REMOTE_VXLAN6`).
#[btf_map(name = "mycni_remote6")]
pub(crate) static REMOTE6: RemoteMap<16> = LpmTrie::new();

/// Pods on this node by IPv6 address, mirrored from the plugin's IPv6 host
/// routes and veths.
#[btf_map(name = "mycni_local6")]
pub(crate) static LOCAL6: LocalMap<16> = HashMap::new();

/// A family's pod map (`LOCAL`, `LOCAL6`), keyed by an `N`-byte address.
pub(crate) type LocalMap<const N: usize> = HashMap<[u8; N], LocalEndpoint, { LOCAL_MAX as usize }>;
/// A family's podCIDR trie (`REMOTE`, `REMOTE6`), keyed by an `N`-byte address.
pub(crate) type RemoteMap<const N: usize> = LpmTrie<[u8; N], RemoteNode, { REMOTE_MAX as usize }>;
