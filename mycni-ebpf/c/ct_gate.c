// SPDX-License-Identifier: MIT OR GPL-2.0
//
// The conntrack gate of the mycni fast path, in C because rustc emits no BTF
// for extern functions and a kfunc call needs it. Compiled to LLVM bitcode by
// build.rs and linked into the Rust program by bpf-linker (which inlines it).
//
// Only the fields read here are declared; preserve_access_index makes them
// CO-RE relocations, resolved by the loader against the running kernel's BTF.

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef int __s32;

// A complete type: aya checks kfunc signatures against the kernel's BTF,
// and a forward declaration does not match the kernel's struct.
struct __sk_buff {
	__u32 len;
};

struct ip_ct_tcp {
	__u8 state;
} __attribute__((preserve_access_index));

union nf_conntrack_proto {
	struct ip_ct_tcp tcp;
} __attribute__((preserve_access_index));

struct nf_conn {
	unsigned long status;
	__u32 mark;
	union nf_conntrack_proto proto;
} __attribute__((preserve_access_index));

// struct bpf_sock_tuple: the kfunc tells the family by the size passed,
// sizeof(ipv4) or sizeof(ipv6).
struct mycni_ct_tuple {
	union {
		struct {
			__u32 saddr;
			__u32 daddr;
			__u16 sport;
			__u16 dport;
		} ipv4;
		struct {
			__u32 saddr[4];
			__u32 daddr[4];
			__u16 sport;
			__u16 dport;
		} ipv6;
	};
};

// The 12-byte layout every kernel with these kfuncs accepts
// (NF_BPF_CT_OPTS_OLD_SZ); the later 16-byte one only adds zone fields.
struct mycni_ct_opts {
	__s32 netns_id;
	__s32 error;
	__u8 l4proto;
	__u8 dir;
	__u8 reserved[2];
};

extern struct nf_conn *bpf_skb_ct_lookup(struct __sk_buff *skb, struct mycni_ct_tuple *tuple,
					 __u32 tuple__sz, struct mycni_ct_opts *opts,
					 __u32 opts__sz) __attribute__((section(".ksyms")));
extern void bpf_ct_release(struct nf_conn *ct) __attribute__((section(".ksyms")));
// Returns int since Linux 6.x (void before): this object needs a kernel
// whose kfunc signatures match these, or it does not load (the agent then
// runs the kernel path and says so).
extern int bpf_ct_change_timeout(struct nf_conn *ct, __u32 timeout) __attribute__((section(".ksyms")));

#define BPF_F_CURRENT_NETNS (-1)
#define IPPROTO_TCP 6
#define IPS_ASSURED (1UL << 2)
#define IPS_SRC_NAT (1UL << 4)
#define IPS_DST_NAT (1UL << 5)
#define TCP_CONNTRACK_ESTABLISHED 3

// Keep in step with src/ct.rs.
#define MYCNI_CT_NOT_FOUND 0
#define MYCNI_CT_ESTABLISHED 1
#define MYCNI_CT_NAT 2
#define MYCNI_CT_NOT_ESTABLISHED 3
#define MYCNI_CT_POLICY_STALE 4

// mycni-common's POLICY_MARK_MASK: the mark's bits the policy table stamps.
#define MYCNI_POLICY_MARK_MASK 0x0fff0000

// Looks the flow up in the conntrack table of the skb's network namespace
// (either direction matches). A flow qualifies for the fast path when it is
// established (TCP state ESTABLISHED, UDP assured) and not NATed; its entry's
// timeout is then renewed to `timeout_ms`, as the kernel would renew it for
// a packet it saw, so a fast-pathed flow never expires under its users.
//
// With `policy_mark` set, the entry must also carry it in its mark's policy
// bits: nftables stamps a connection it admitted under the current policy,
// and one admitted under an older policy goes back to be judged again.
static __attribute__((always_inline)) int ct_gate(struct __sk_buff *skb, struct mycni_ct_tuple *tuple,
						  __u32 tuple_sz, __u32 l4proto, __u32 timeout_ms,
						  __u32 policy_mark)
{
	struct mycni_ct_opts opts = {
		.netns_id = BPF_F_CURRENT_NETNS,
		.l4proto = (__u8)l4proto,
	};
	struct nf_conn *ct = bpf_skb_ct_lookup(skb, tuple, tuple_sz, &opts, sizeof(opts));
	int verdict;

	if (!ct)
		return MYCNI_CT_NOT_FOUND;
	unsigned long status = ct->status;
	if (status & (IPS_SRC_NAT | IPS_DST_NAT))
		verdict = MYCNI_CT_NAT;
	else if (l4proto == IPPROTO_TCP ? ct->proto.tcp.state != TCP_CONNTRACK_ESTABLISHED
					: !(status & IPS_ASSURED))
		verdict = MYCNI_CT_NOT_ESTABLISHED;
	else if (policy_mark && (ct->mark & MYCNI_POLICY_MARK_MASK) != policy_mark)
		verdict = MYCNI_CT_POLICY_STALE;
	else {
		if (timeout_ms)
			bpf_ct_change_timeout(ct, timeout_ms);
		verdict = MYCNI_CT_ESTABLISHED;
	}
	bpf_ct_release(ct);
	return verdict;
}

// IPv4: addresses and ports in network byte order, the ports as the 32-bit
// word they form on the wire (source first).
__attribute__((always_inline)) int mycni_ct_gate(struct __sk_buff *skb, __u32 saddr, __u32 daddr,
						 __u32 ports, __u32 l4proto, __u32 timeout_ms,
						 __u32 policy_mark)
{
	// Member by member, not an initialiser: zeroing the whole union first
	// compiled to a call of the object's byte-at-a-time memset (24 bytes,
	// every packet). The lookup reads sizeof(tuple.ipv4) bytes, all set.
	struct mycni_ct_tuple tuple;
	tuple.ipv4.saddr = saddr;
	tuple.ipv4.daddr = daddr;
	tuple.ipv4.sport = (__u16)(ports & 0xffff);
	tuple.ipv4.dport = (__u16)(ports >> 16);
	return ct_gate(skb, &tuple, sizeof(tuple.ipv4), l4proto, timeout_ms, policy_mark);
}

// IPv6: `addrs` holds the source then the destination address, 32 bytes in
// network byte order; ports as for IPv4.
__attribute__((always_inline)) int mycni_ct_gate6(struct __sk_buff *skb, const __u32 *addrs,
						  __u32 ports, __u32 l4proto, __u32 timeout_ms,
						  __u32 policy_mark)
{
	struct mycni_ct_tuple tuple = {
		.ipv6 = {
			.saddr = { addrs[0], addrs[1], addrs[2], addrs[3] },
			.daddr = { addrs[4], addrs[5], addrs[6], addrs[7] },
			.sport = (__u16)(ports & 0xffff),
			.dport = (__u16)(ports >> 16),
		},
	};
	return ct_gate(skb, &tuple, sizeof(tuple.ipv6), l4proto, timeout_ms, policy_mark);
}
