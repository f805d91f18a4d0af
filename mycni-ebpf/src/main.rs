//! mycni tc programs: the fast path.
//!
//! Two thin entry points, named by direction:
//! - `mycni_from_pod`, on ingress of every pod's host-side veth: a packet to a
//!   pod on another node gets its Ethernet header rewritten (this node's VTEP
//!   MAC -> the peer's VTEP MAC) and is redirected into `vxlan.1`, whose FDB
//!   still picks the remote host; a packet to a pod on this node goes
//!   straight into that pod with `bpf_redirect_peer`.
//! - `mycni_from_vxlan`, on ingress of `vxlan.1`: decapsulated traffic to a
//!   pod on this node goes straight into it.
//!
//! Only flows the kernel's conntrack already holds as established and not
//! NATed take the fast path (the gate in c/ct_gate.c); TCP SYN, FIN and RST
//! never do, so conntrack sees every connection open and close. Forwarded
//! packets get their TTL decremented and IP checksum fixed, like a router.
//!
//! Every packet a program sees is counted exactly once in `mycni_counters`,
//! under the path it took or the reason it was left to the kernel. Anything
//! the program is not sure about returns `TCX_NEXT`, untouched, so the
//! kernel's routes, ARP and FDB (and other tools' programs) decide.
#![no_std]
#![no_main]

use aya_ebpf::{
    EbpfContext,
    bindings::{__sk_buff, TC_ACT_REDIRECT},
    btf_maps::{Array, HashMap, LpmTrie, PerCpuArray, lpm_trie::Key},
    helpers::generated::{bpf_redirect, bpf_redirect_peer},
    macros::{btf_map, classifier},
    programs::TcContext,
};
use aya_log_ebpf::debug;
use mycni_common::{
    DpConfig, LOCAL_MAX, LocalEndpoint, Path, PathCounter, REMOTE_MAX, RemoteNode, TCX_NEXT,
};

#[btf_map(name = "mycni_counters")]
static COUNTERS: PerCpuArray<PathCounter, { Path::COUNT as usize }> = PerCpuArray::new();

#[btf_map(name = "mycni_config")]
static CONFIG: Array<DpConfig, 1> = Array::new();

/// Peer podCIDRs, mirrored from the routes the agent programs on `vxlan.1`.
#[btf_map(name = "mycni_remote")]
static REMOTE: LpmTrie<[u8; 4], RemoteNode, { REMOTE_MAX as usize }> = LpmTrie::new();

/// Pods on this node, mirrored from the plugin's host routes and veths.
#[btf_map(name = "mycni_local")]
static LOCAL: HashMap<[u8; 4], LocalEndpoint, { LOCAL_MAX as usize }> = HashMap::new();

const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const IP_HLEN: usize = 20;
const L4: usize = ETH_HLEN + IP_HLEN;
const TCP_HLEN: usize = 20;
const UDP_HLEN: usize = 8;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
/// More-fragments flag and fragment offset; the DF bit is fine.
const IP_MF_OFFSET: u16 = 0x3fff;
const IP_CSUM_OFF: usize = ETH_HLEN + 10;
const IP_TTL_OFF: usize = ETH_HLEN + 8;
const PACKET_HOST: u32 = 0;

// Keep in step with c/ct_gate.c.
const CT_ESTABLISHED: i32 = 1;
const CT_NAT: i32 = 2;

unsafe extern "C" {
    /// c/ct_gate.c: the conntrack lookup (kfuncs), linked in as bitcode.
    fn mycni_ct_gate(
        skb: *mut core::ffi::c_void,
        saddr: u32,
        daddr: u32,
        ports: u32,
        l4proto: u32,
        timeout_ms: u32,
    ) -> i32;
}

#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
enum From {
    Pod,
    Vxlan,
}

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
    run(&ctx, From::Pod)
}

/// Decapsulated traffic from other nodes, on ingress of `vxlan.1`.
#[classifier]
fn mycni_from_vxlan(ctx: TcContext) -> i32 {
    run(&ctx, From::Vxlan)
}

#[inline(always)]
fn run(ctx: &TcContext, from: From) -> i32 {
    // Counted before any rewrite, so bytes are what arrived.
    let len = ctx.len();
    let (path, verdict) = forward(ctx, from);
    count(path, len);
    // Off unless the agent runs with --ebpf-log: AYA_LOG_LEVEL is then a
    // load-time 0 and the verifier prunes this call from the hot path.
    debug!(
        ctx,
        "from {} path {} len {} verdict {}", from as u32, path as u32, len, verdict
    );
    verdict
}

/// Makes the first `n` bytes directly readable, pulling them into the linear
/// area if the skb has them elsewhere (decapsulated or GRO packets).
#[inline(always)]
fn linear(ctx: &TcContext, n: usize) -> Option<(usize, usize)> {
    if ctx.data() + n <= ctx.data_end() {
        return Some((ctx.data(), ctx.data_end()));
    }
    if (ctx.len() as usize) < n || ctx.pull_data(n as u32).is_err() {
        return None;
    }
    let (data, end) = (ctx.data(), ctx.data_end());
    (data + n <= end).then_some((data, end))
}

/// Where a packet goes when the fast path takes it.
enum Next {
    Remote(RemoteNode),
    Local(LocalEndpoint),
}

#[inline(always)]
fn forward(ctx: &TcContext, from: From) -> (Path, i32) {
    let Some((data, _)) = linear(ctx, ETH_HLEN) else {
        return (Path::KernelTruncated, TCX_NEXT);
    };
    // SAFETY (all raw reads below): `linear` checked the range against
    // data_end, as the verifier requires; reads are unaligned-safe.
    let proto = u16::from_be(unsafe { ((data + 12) as *const u16).read_unaligned() });
    if proto != ETH_P_IP {
        return (Path::KernelNotIpv4, TCX_NEXT);
    }
    let Some((data, _)) = linear(ctx, L4) else {
        return (Path::KernelTruncated, TCX_NEXT);
    };
    let ip = data + ETH_HLEN;
    let vihl = unsafe { *(ip as *const u8) };
    if vihl >> 4 != 4 {
        return (Path::KernelNotIpv4, TCX_NEXT);
    }
    if vihl & 0x0f != 5 {
        // ihl < 5 is malformed, > 5 carries options: both the kernel's.
        let path = if vihl & 0x0f < 5 {
            Path::KernelTruncated
        } else {
            Path::KernelIpOptionsOrFragment
        };
        return (path, TCX_NEXT);
    }
    let tot_len = u16::from_be(unsafe { ((ip + 2) as *const u16).read_unaligned() }) as u32;
    // tot_len 0 is IPv4 BIG TCP; a length past the skb is a lie. Both: doubt.
    if (tot_len as usize) < IP_HLEN || tot_len + ETH_HLEN as u32 > ctx.len() {
        return (Path::KernelTruncated, TCX_NEXT);
    }
    let frag = u16::from_be(unsafe { ((ip + 6) as *const u16).read_unaligned() });
    if frag & IP_MF_OFFSET != 0 {
        return (Path::KernelIpOptionsOrFragment, TCX_NEXT);
    }
    let ttl = unsafe { *((ip + 8) as *const u8) };
    let l4proto = unsafe { *((ip + 9) as *const u8) };
    let saddr = unsafe { ((ip + 12) as *const u32).read_unaligned() };
    let daddr_bytes = unsafe { ((ip + 16) as *const [u8; 4]).read_unaligned() };

    let Some(cfg) = CONFIG.get(0) else {
        return (Path::KernelNoConfig, TCX_NEXT);
    };
    if cfg.vxlan_ifindex == 0 {
        return (Path::KernelNoConfig, TCX_NEXT);
    }
    let (cfg_vxlan, vtep_mac) = (cfg.vxlan_ifindex, cfg.vtep_mac);

    // SAFETY: map values are only read here; the agent replaces entries
    // whole, so a torn read at worst sends one packet to a just-removed pod.
    let next = match unsafe { LOCAL.get(&daddr_bytes) } {
        Some(ep) => Next::Local(*ep),
        None if from == From::Pod => {
            let key = Key::new(32, daddr_bytes);
            match REMOTE.get(&key) {
                Some(node) => Next::Remote(*node),
                None => return (Path::KernelUnknownDest, TCX_NEXT),
            }
        }
        None => return (Path::KernelUnknownDest, TCX_NEXT),
    };
    if ttl <= 1 {
        return (Path::KernelTtl, TCX_NEXT);
    }

    let timeout_ms = match l4proto {
        IPPROTO_TCP => {
            let Some((data, _)) = linear(ctx, L4 + TCP_HLEN) else {
                return (Path::KernelTruncated, TCX_NEXT);
            };
            // The TCP header must lie inside the IP packet, not in padding
            // after it (the kernel would trim and drop such a segment).
            let doff = unsafe { *((data + L4 + 12) as *const u8) } >> 4;
            if (tot_len as usize) < IP_HLEN + TCP_HLEN || doff < 5 {
                return (Path::KernelTruncated, TCX_NEXT);
            }
            let flags = unsafe { *((data + L4 + 13) as *const u8) };
            if flags & (TCP_SYN | TCP_FIN | TCP_RST) != 0 {
                return (Path::KernelTcpControl, TCX_NEXT);
            }
            cfg.tcp_timeout_ms
        }
        IPPROTO_UDP => {
            if (tot_len as usize) < IP_HLEN + UDP_HLEN || linear(ctx, L4 + UDP_HLEN).is_none() {
                return (Path::KernelTruncated, TCX_NEXT);
            }
            cfg.udp_timeout_ms
        }
        _ => return (Path::KernelNotTcpUdp, TCX_NEXT),
    };
    let Some((data, _)) = linear(ctx, L4 + UDP_HLEN) else {
        return (Path::KernelTruncated, TCX_NEXT);
    };
    let ports = unsafe { ((data + L4) as *const u32).read_unaligned() };
    // A pod may only fast-path packets that carry its own address: a spoofed
    // source could otherwise ride another pod's established flow past
    // conntrack. skb_iif is the host veth the packet arrived on.
    if from == From::Pod {
        // SAFETY: a plain read of the context, which the verifier allows.
        let iif = unsafe { (*(ctx.as_ptr() as *const __sk_buff)).ingress_ifindex };
        let src = saddr.to_ne_bytes();
        // SAFETY: read-only map lookup, as above.
        match unsafe { LOCAL.get(&src) } {
            Some(ep) if ep.ifindex == iif => {}
            _ => return (Path::KernelSourceNotPod, TCX_NEXT),
        }
    }
    let daddr = u32::from_ne_bytes(daddr_bytes);
    // SAFETY: the gate only reads the tuple and the conntrack entry, and
    // releases the reference it takes.
    let ct = unsafe {
        mycni_ct_gate(
            ctx.as_ptr(),
            saddr,
            daddr,
            ports,
            u32::from(l4proto),
            timeout_ms,
        )
    };
    if ct == CT_NAT {
        return (Path::KernelNat, TCX_NEXT);
    }
    if ct != CT_ESTABLISHED {
        return (Path::KernelNotEstablished, TCX_NEXT);
    }

    // Decrement TTL like a router. The checksum covers TTL and protocol as
    // one 16-bit word.
    let old = u16::from_be_bytes([ttl, l4proto]);
    let new = u16::from_be_bytes([ttl - 1, l4proto]);
    if ctx.store(IP_TTL_OFF, &(ttl - 1), 0).is_err()
        || ctx
            .l3_csum_replace(
                IP_CSUM_OFF,
                u64::from(old.to_be()),
                u64::from(new.to_be()),
                2,
            )
            .is_err()
    {
        return (Path::KernelError, TCX_NEXT);
    }

    let (dst, src) = match &next {
        Next::Remote(node) => (node.vtep_mac, vtep_mac),
        Next::Local(ep) => (ep.pod_mac, ep.host_mac),
    };
    let mut macs = [0u8; 12];
    macs[..6].copy_from_slice(&dst);
    macs[6..].copy_from_slice(&src);
    if ctx.store(0, &macs, 0).is_err() {
        return (Path::KernelError, TCX_NEXT);
    }

    let (path, verdict) = match next {
        // The vxlan device encapsulates it; its FDB maps the peer's VTEP MAC
        // to the peer's host, so the kernel still owns the underlay choice.
        Next::Remote(_) => (Path::FastRemote, unsafe { bpf_redirect(cfg_vxlan, 0) }),
        Next::Local(ep) => {
            // A frame that arrived for the VTEP or the gateway MAC must look
            // addressed to the pod when it lands there.
            if ctx.change_type(PACKET_HOST).is_err() {
                return (Path::KernelError, TCX_NEXT);
            }
            let path = if from == From::Pod {
                Path::FastLocal
            } else {
                Path::FastDecap
            };
            (path, unsafe { bpf_redirect_peer(ep.ifindex, 0) })
        }
    };
    if verdict != TC_ACT_REDIRECT as i64 {
        return (Path::KernelError, TCX_NEXT);
    }
    (path, TC_ACT_REDIRECT)
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
