//! Types shared by the eBPF programs (`mycni-ebpf`) and userspace (`mycni-agent`).
//!
//! Every type at the top level is `#[repr(C)]` with explicit padding, because
//! the kernel and both sides read the same bytes, and BTF describes them to
//! `bpftool`.
//!
//! With the `std` feature (userspace only: the plugin and the agent), also
//! [`contract`], everything the plugin and the agent must agree on, and
//! [`net`], the one CIDR and MAC type both parse with, and [`node`], the
//! validation of the Node annotations agents announce to each other. The
//! eBPF object is built without it and stays `no_std`.
#![no_std]

#[cfg(feature = "std")]
extern crate std;

#[cfg(feature = "std")]
pub mod contract;
pub mod flow;
#[cfg(feature = "std")]
pub mod fs;
#[cfg(feature = "std")]
pub mod net;
#[cfg(feature = "netlink")]
pub mod netlink;
#[cfg(feature = "std")]
pub mod node;

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
pub const PEERS_MAP: &str = "mycni_peers";
/// The IPv6 twins of `mycni_remote` and `mycni_local`, keyed by 16-byte
/// addresses (network byte order); same value types, same capacities.
pub const REMOTE6_MAP: &str = "mycni_remote6";
pub const LOCAL6_MAP: &str = "mycni_local6";
/// The NetworkPolicy epoch (one `u32`, see `POLICY_MARK_SHIFT`).
pub const POLICY_MAP: &str = "mycni_policy";
/// The generation of the programs' next-hop cache (one `u32`; 0: no
/// cache), bumped by the agent on every routing notification.
pub const NEXTHOP_GEN_MAP: &str = "mycni_nexthop_gen";

/// Capacity of the remote-podCIDR trie: one entry per peer Node.
pub const REMOTE_MAX: u32 = 16_384;
/// Capacity of the local-endpoint map: one entry per pod on this node.
pub const LOCAL_MAX: u32 = 4_096;
/// Capacity of the peer map: one entry per peer Node's host IP.
pub const PEERS_MAX: u32 = 16_384;

/// Bytes `vxlan.1` (and the tc encapsulation) puts in front of an inner IPv4
/// packet on an IPv4 underlay: outer IPv4 (20) + UDP (8) + VXLAN (8) + inner
/// Ethernet (14).
pub const VXLAN_OVERHEAD: u32 = 50;

/// `DpConfig::flags`: encapsulate to remote pods in tc (else hand them to `vxlan.1`).
pub const CFG_TC_ENCAP: u8 = 1;
/// `DpConfig::flags`: decapsulate VXLAN from known peers at the underlay's tc ingress.
pub const CFG_TC_DECAP: u8 = 2;
/// `DpConfig::flags`: emit flow events into `mycni_flows` (see [`flow`]).
pub const CFG_FLOW_EVENTS: u8 = 4;

/// Every packet a mycni program sees is counted exactly once, under the path it
/// took or the reason it was left to the kernel (cf. Cilium's drop reasons).
/// `Dp` for datapath: userspace files also use `std::path::Path`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DpPath {
    /// Left to the kernel: neither IPv4 nor IPv6 (ARP, VLAN-tagged, ...), or
    /// an IP version that does not match the ethertype. (The label keeps
    /// its IPv4-only name so dashboards do not break.)
    KernelNotIpv4 = 0,
    /// Left to the kernel: the headers are shorter than they claim.
    KernelTruncated = 1,
    /// Left to the kernel: no map entry for the destination.
    KernelUnknownDest = 2,
    /// Left to the kernel: TTL (IPv6: hop limit) would expire here.
    KernelTtl = 3,
    /// Left to the kernel: IP options or a fragment; for IPv6, any
    /// extension header (hop-by-hop, routing, fragment, destination
    /// options, AH, ESP, ...) in front of the upper-layer header.
    KernelIpOptionsOrFragment = 4,
    /// Left to the kernel: TCP SYN, FIN or RST, so conntrack sees every open and close.
    KernelTcpControl = 5,
    /// Left to the kernel: conntrack has no entry, or one not yet established.
    KernelNotEstablished = 6,
    /// To a remote pod through `vxlan.1`: encapsulation in tc is off (the
    /// agent's `--tc-encap false`, or no underlay configured yet).
    FastVxlanNoEncap = 7,
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
    /// Forwarded by the fast path to a pod on another node, encapsulated in
    /// VXLAN by the program and sent out of the underlay (`vxlan.1` skipped).
    FastEncap = 15,
    /// To a remote pod through `vxlan.1`: the packet, once encapsulated,
    /// would not fit the route's MTU to the peer (the kernel then answers
    /// with "fragmentation needed" or fragments, which a program cannot).
    FastVxlanMtu = 16,
    /// To a remote pod through `vxlan.1`: the route lookup for the peer's
    /// host IP was not a plain unicast success out of the underlay device.
    FastVxlanFib = 17,
    /// To a remote pod through `vxlan.1`: the kernel refused to grow the
    /// packet (a GSO shape `bpf_skb_adjust_room` cannot take, or too long).
    FastVxlanGso = 18,
    /// Decapsulated by the program at the underlay's ingress and handed
    /// straight to a pod on this node (`vxlan.1` and the host's UDP stack skipped).
    FastTcDecap = 19,
    /// Left to the kernel, on the underlay: not VXLAN for this host (any
    /// other traffic of the node: not IPv4 or UDP, another port or address).
    KernelUnderlayOther = 20,
    /// Left to the kernel, on the underlay: VXLAN from a host that is not a
    /// peer Node (the agent's nftables set drops it there).
    KernelDecapNotPeer = 21,
    /// Left to the kernel, on the underlay: VXLAN the program does not fully
    /// understand (flags, VNI, outer options, a UDP checksum, inner MAC not
    /// this VTEP's, not IPv4 inside).
    KernelDecapHeader = 22,
    /// Left to the kernel, on the underlay: an outer IP fragment.
    KernelDecapFragment = 23,
    /// Left to the kernel, on the underlay: the inner source is not in the
    /// podCIDR of the peer that sent it.
    KernelDecapInnerSource = 24,
    /// Left to the kernel, on the underlay: the kernel refused to shrink the
    /// packet (a GSO shape `bpf_skb_adjust_room` cannot take).
    KernelDecapGso = 25,
    /// Forwarded by the fast path to a pod of a peer on the same L2 segment,
    /// unencapsulated (direct routing), out of the underlay.
    FastDirect = 26,
    /// Forwarded by the fast path from the underlay to a pod on this node:
    /// an unencapsulated packet from a direct-routed peer's pod.
    FastDirectIn = 27,
    /// Left to the kernel: the route lookup for a direct-routed peer's pod
    /// was not a plain success out of the underlay (or the packet is over
    /// the route's MTU); or IPv6 to a peer marked direct, which the IPv4
    /// underlay cannot carry unencapsulated (the agent never marks one).
    KernelDirectFib = 28,
    /// Left to the kernel: IPv6 from or to a link-local address (fe80::/10),
    /// e.g. the pod's gateway fe80::1: on-link traffic, never forwarded.
    KernelIpv6LinkLocal = 29,
    /// Left to the kernel: IPv6 to a multicast address (ff00::/8).
    KernelIpv6Multicast = 30,
    /// Left to the kernel: IPv6 neighbour discovery (ICMPv6 router and
    /// neighbour solicitations and advertisements, redirects), whatever the
    /// addresses.
    KernelIpv6Nd = 31,
    /// To a remote pod through `vxlan6.1` (a peer over the IPv6 underlay):
    /// the kernel encapsulates in an IPv6 outer header.
    FastVxlan6 = 32,
    /// Forwarded by the fast path from `vxlan6.1` (decapsulated by the
    /// kernel from an IPv6 outer header) to a pod on this node. Apart from
    /// `fast_decap`: no tc decapsulation exists for this underlay, so it
    /// is not a datapath v2 fallback (`crossed_vxlan`).
    FastVxlan6Decap = 33,
    /// Left to the kernel: to a peer over `vxlan6.1`, a packet (or one GSO
    /// segment of it) larger than `vxlan6.1`'s MTU (a pod made before the
    /// device, with the IPv4 overlay's larger MTU): the kernel answers
    /// with "packet too big", which a program cannot.
    KernelVxlan6Mtu = 34,
    /// Left to the kernel: an established flow whose conntrack entry was
    /// last admitted by the NetworkPolicy table under an older policy
    /// (`POLICY_MARK_*`): nftables judges it again and stamps it, and its
    /// next packets go fast, or it drops it.
    KernelPolicyStale = 35,
}

impl DpPath {
    /// Number of counter slots; the counter map has exactly this many entries.
    pub const COUNT: u32 = 36;

    pub const ALL: [DpPath; Self::COUNT as usize] = [
        DpPath::KernelNotIpv4,
        DpPath::KernelTruncated,
        DpPath::KernelUnknownDest,
        DpPath::KernelTtl,
        DpPath::KernelIpOptionsOrFragment,
        DpPath::KernelTcpControl,
        DpPath::KernelNotEstablished,
        DpPath::FastVxlanNoEncap,
        DpPath::FastLocal,
        DpPath::KernelNat,
        DpPath::KernelNotTcpUdp,
        DpPath::KernelNoConfig,
        DpPath::KernelError,
        DpPath::FastDecap,
        DpPath::KernelSourceNotPod,
        DpPath::FastEncap,
        DpPath::FastVxlanMtu,
        DpPath::FastVxlanFib,
        DpPath::FastVxlanGso,
        DpPath::FastTcDecap,
        DpPath::KernelUnderlayOther,
        DpPath::KernelDecapNotPeer,
        DpPath::KernelDecapHeader,
        DpPath::KernelDecapFragment,
        DpPath::KernelDecapInnerSource,
        DpPath::KernelDecapGso,
        DpPath::FastDirect,
        DpPath::FastDirectIn,
        DpPath::KernelDirectFib,
        DpPath::KernelIpv6LinkLocal,
        DpPath::KernelIpv6Multicast,
        DpPath::KernelIpv6Nd,
        DpPath::FastVxlan6,
        DpPath::FastVxlan6Decap,
        DpPath::KernelVxlan6Mtu,
        DpPath::KernelPolicyStale,
    ];

    /// Stable label used in metrics and `inspect` output.
    pub const fn name(self) -> &'static str {
        match self {
            DpPath::KernelNotIpv4 => "kernel_not_ipv4",
            DpPath::KernelTruncated => "kernel_truncated",
            DpPath::KernelUnknownDest => "kernel_unknown_dest",
            DpPath::KernelTtl => "kernel_ttl",
            DpPath::KernelIpOptionsOrFragment => "kernel_ip_options_or_fragment",
            DpPath::KernelTcpControl => "kernel_tcp_control",
            DpPath::KernelNotEstablished => "kernel_not_established",
            DpPath::FastVxlanNoEncap => "fast_vxlan_no_encap",
            DpPath::FastLocal => "fast_local",
            DpPath::KernelNat => "kernel_nat",
            DpPath::KernelNotTcpUdp => "kernel_not_tcp_udp",
            DpPath::KernelNoConfig => "kernel_no_config",
            DpPath::KernelError => "kernel_error",
            DpPath::FastDecap => "fast_decap",
            DpPath::KernelSourceNotPod => "kernel_source_not_pod",
            DpPath::FastEncap => "fast_encap",
            DpPath::FastVxlanMtu => "fast_vxlan_mtu",
            DpPath::FastVxlanFib => "fast_vxlan_fib",
            DpPath::FastVxlanGso => "fast_vxlan_gso",
            DpPath::FastTcDecap => "fast_tc_decap",
            DpPath::KernelUnderlayOther => "kernel_underlay_other",
            DpPath::KernelDecapNotPeer => "kernel_decap_not_peer",
            DpPath::KernelDecapHeader => "kernel_decap_header",
            DpPath::KernelDecapFragment => "kernel_decap_fragment",
            DpPath::KernelDecapInnerSource => "kernel_decap_inner_source",
            DpPath::KernelDecapGso => "kernel_decap_gso",
            DpPath::FastDirect => "fast_direct",
            DpPath::FastDirectIn => "fast_direct_in",
            DpPath::KernelDirectFib => "kernel_direct_fib",
            DpPath::KernelIpv6LinkLocal => "kernel_ipv6_link_local",
            DpPath::KernelIpv6Multicast => "kernel_ipv6_multicast",
            DpPath::KernelIpv6Nd => "kernel_ipv6_nd",
            DpPath::FastVxlan6 => "fast_vxlan6",
            DpPath::FastVxlan6Decap => "fast_vxlan6_decap",
            DpPath::KernelVxlan6Mtu => "kernel_vxlan6_mtu",
            DpPath::KernelPolicyStale => "kernel_policy_stale",
        }
    }

    /// Whether packets counted here skipped the kernel's forwarding path.
    pub const fn is_fast(self) -> bool {
        matches!(
            self,
            DpPath::FastVxlanNoEncap
                | DpPath::FastLocal
                | DpPath::FastDecap
                | DpPath::FastEncap
                | DpPath::FastVxlanMtu
                | DpPath::FastVxlanFib
                | DpPath::FastVxlanGso
                | DpPath::FastTcDecap
                | DpPath::FastDirect
                | DpPath::FastDirectIn
                | DpPath::FastVxlan6
                | DpPath::FastVxlan6Decap
        )
    }

    /// Fast-pathed packets that still crossed `vxlan.1` (handed to it on the
    /// way out, or decapsulated by it on the way in): what datapath v2 exists
    /// to make rare. Not `vxlan6.1`'s (`FastVxlan6`, `FastVxlan6Decap`):
    /// the programs do not encapsulate over an IPv6 underlay at all, so
    /// that device is the only way there, not a fallback.
    pub const fn crossed_vxlan(self) -> bool {
        matches!(
            self,
            DpPath::FastVxlanNoEncap
                | DpPath::FastVxlanMtu
                | DpPath::FastVxlanFib
                | DpPath::FastVxlanGso
                | DpPath::FastDecap
        )
    }

    /// Whether the packet is pod traffic the fast path could have taken,
    /// i.e. counts in a "fast share". The underlay program sees all of the
    /// node's own traffic too (API, ARP, SSH), which says nothing about pods.
    pub const fn is_pod_traffic(self) -> bool {
        !matches!(self, DpPath::KernelUnderlayOther)
    }
}

/// The address family a packet is counted under: the counter map holds
/// one row of [`DpPath::COUNT`] slots per family ([`counter_index`]).
///
/// A packet's family is what its headers declare: the ethertype and the IP
/// version field agreeing (IPv4 `0x0800` + 4, IPv6 `0x86DD` + 6), else
/// [`DpFamily::Other`] (ARP, VLAN-tagged, other ethertypes, a version that
/// contradicts the ethertype, a frame too short to tell). On the underlay,
/// VXLAN the program unwraps or looks into (it passed the outer checks:
/// for this host, from a peer, a header it understands) counts under the
/// *inner* family, so a fast share per family covers both ends of a flow;
/// whatever is left before that (the node's own traffic, VXLAN from a
/// stranger, an outer fragment or a header it does not understand) counts
/// under the outer family.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DpFamily {
    /// Not IP, or not telling: see [`DpFamily`].
    Other = 0,
    Ipv4 = 1,
    Ipv6 = 2,
}

impl DpFamily {
    /// Number of families; the counter map has this many rows.
    pub const COUNT: u32 = 3;

    pub const ALL: [DpFamily; Self::COUNT as usize] =
        [DpFamily::Other, DpFamily::Ipv4, DpFamily::Ipv6];

    /// Stable label used in metrics (`family`) and `inspect` output.
    pub const fn name(self) -> &'static str {
        match self {
            DpFamily::Other => "other",
            DpFamily::Ipv4 => "ipv4",
            DpFamily::Ipv6 => "ipv6",
        }
    }
}

/// Entries of `mycni_counters`: a row of [`DpPath::COUNT`] slots per
/// [`DpFamily`]. A map pinned with another size (the 32-entry layout before
/// families, the 96-entry one before the `vxlan6.1` paths) is rebuilt by
/// the agent at load, like any changed map.
pub const COUNTERS_LEN: u32 = DpFamily::COUNT * DpPath::COUNT;

/// The slot of `mycni_counters` a packet of `family` that took `path` is
/// counted in: `family * DpPath::COUNT + path`.
#[inline(always)]
pub const fn counter_index(family: DpFamily, path: DpPath) -> u32 {
    family as u32 * DpPath::COUNT + path as u32
}

/// Every slot of `mycni_counters` in index order, with its family and path
/// (what userspace iterates to read the map).
pub fn counter_slots() -> impl Iterator<Item = (u32, DpFamily, DpPath)> {
    DpFamily::ALL.into_iter().flat_map(|f| {
        DpPath::ALL
            .into_iter()
            .map(move |p| (counter_index(f, p), f, p))
    })
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
    /// ifindex of `vxlan.1`; 0: none (a node with an IPv6 underlay only).
    /// With `vxlan6_ifindex` 0 too, "not configured": everything goes to
    /// the kernel.
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
    /// ifindex of the underlay device (`vxlan.1`'s `dev`): where encapsulated
    /// packets leave and arrive. 0: no tc encapsulation or decapsulation.
    pub underlay_ifindex: u32,
    /// This node's host IP (network byte order): `vxlan.1`'s `local`.
    pub host_ip: u32,
    /// The VNI (host byte order).
    pub vni: u32,
    /// VXLAN UDP destination port (host byte order), 8472.
    pub vxlan_port: u16,
    /// The UDP source port range `vxlan.1` picks from, [min, max) (host
    /// byte order): the node's `ip_local_port_range` when the device sets none.
    pub port_min: u16,
    pub port_max: u16,
    /// Outer TTL: `vxlan.1`'s `ttl`, or the node's `ip_default_ttl` when the
    /// device inherits it from the route (the default).
    pub ttl: u8,
    /// `CFG_TC_ENCAP` | `CFG_TC_DECAP`.
    pub flags: u8,
    /// ifindex of `vxlan6.1`, the VXLAN device over the IPv6 underlay,
    /// where packets to `REMOTE_VXLAN6` peers are handed; 0: none.
    pub vxlan6_ifindex: u32,
    /// MAC address of `vxlan6.1`, the source of every frame sent into it.
    pub vtep6_mac: [u8; 6],
    pub _pad6: [u8; 2],
}

/// The bits of a conntrack entry's mark the NetworkPolicy table stamps with
/// the policy epoch under which it last admitted the connection (bits
/// 16-27; the others stay their owners'). The fast path forwards an
/// established flow only while its stamp is the current epoch (map
/// `mycni_policy`), so a policy change sends every live flow back to
/// nftables once, to be judged again. Epochs run 1..=`POLICY_EPOCH_MAX`
/// and wrap; 0 in the map: no policy, no check.
pub const POLICY_MARK_SHIFT: u32 = 16;
pub const POLICY_MARK_MASK: u32 = 0x0fff_0000;
pub const POLICY_EPOCH_MAX: u32 = POLICY_MARK_MASK >> POLICY_MARK_SHIFT;

/// `RemoteNode::flags`: the peer is routed directly (same L2 segment, no
/// encapsulation): the kernel's route is `podCIDR via <host IP>` on the underlay.
pub const REMOTE_DIRECT: u8 = 1;
/// `RemoteNode::flags`: the peer is reached over the IPv6 underlay, through
/// `vxlan6.1` (route, permanent neighbour and FDB entry on that device):
/// `vtep_mac` is its `vxlan6.1` MAC and `host_ip` is 0 (its host address
/// is IPv6, which the kernel's FDB holds; the programs never need it).
pub const REMOTE_VXLAN6: u8 = 2;

/// A peer Node's podCIDR in `mycni_remote` (an LPM trie keyed by the CIDR),
/// or its IPv6 podCIDR in `mycni_remote6` (the same peer, the same IPv4
/// underlay: only the key differs; or, flagged `REMOTE_VXLAN6`, a peer
/// over the IPv6 underlay).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoteNode {
    /// The peer's VTEP MAC: the destination of frames sent into `vxlan.1`
    /// (`vxlan6.1` for `REMOTE_VXLAN6`), which the kernel's FDB maps to the
    /// peer's host IP.
    pub vtep_mac: [u8; 6],
    /// `REMOTE_DIRECT`, `REMOTE_VXLAN6` or 0.
    pub flags: u8,
    pub _pad: u8,
    /// The peer's host IP (network byte order): the outer destination of
    /// what the program encapsulates, and the only outer source allowed to
    /// send traffic from this podCIDR.
    pub host_ip: u32,
}

/// A peer Node in `mycni_peers`, keyed by its host IP (network byte order):
/// the hosts VXLAN may come from.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerNode {
    /// The peer's VTEP MAC (the inner source of what it sends).
    pub vtep_mac: [u8; 6],
    pub _pad: [u8; 2],
}

/// A pod on this node in `mycni_local`, keyed by its IPv4 address, or in
/// `mycni_local6`, keyed by its IPv6 address (network byte order).
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

// SAFETY (all five): plain old data, repr(C), explicit padding, every bit
// pattern valid.
#[cfg(feature = "user")]
unsafe impl aya::Pod for PathCounter {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for DpConfig {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for RemoteNode {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for LocalEndpoint {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for PeerNode {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_indices_are_dense_and_named_uniquely() {
        for (i, p) in DpPath::ALL.iter().enumerate() {
            assert_eq!(*p as u32, i as u32);
        }
        for a in DpPath::ALL {
            for b in DpPath::ALL {
                if a != b {
                    assert_ne!(a.name(), b.name());
                }
            }
        }
    }

    #[test]
    fn counter_slots_cover_the_map_once_family_by_family() {
        for (i, f) in DpFamily::ALL.iter().enumerate() {
            assert_eq!(*f as u32, i as u32);
        }
        let mut seen = [false; COUNTERS_LEN as usize];
        for (n, (i, f, p)) in counter_slots().enumerate() {
            // In index order, so a reader can zip the map with it.
            assert_eq!(i as usize, n);
            assert_eq!(i, counter_index(f, p));
            assert!(!seen[i as usize]);
            seen[i as usize] = true;
        }
        assert!(seen.iter().all(|s| *s));
        // Row 0 is "other": what was slot `p` before families stays slot `p`
        // for non-IP traffic.
        assert_eq!(counter_index(DpFamily::Other, DpPath::KernelNotIpv4), 0);
        assert_eq!(
            counter_index(DpFamily::Ipv6, DpPath::FastLocal),
            2 * DpPath::COUNT + 8
        );
        assert_eq!(
            counter_index(DpFamily::Ipv6, DpPath::KernelPolicyStale),
            COUNTERS_LEN - 1
        );
        assert_eq!(DpFamily::Ipv6.name(), "ipv6");
    }

    #[test]
    fn map_values_have_no_implicit_padding() {
        assert_eq!(core::mem::size_of::<PathCounter>(), 16);
        assert_eq!(core::mem::size_of::<DpConfig>(), 52);
        assert_eq!(core::mem::size_of::<PeerNode>(), 8);
        assert_eq!(core::mem::size_of::<RemoteNode>(), 12);
        assert_eq!(core::mem::size_of::<LocalEndpoint>(), 16);
    }
}
