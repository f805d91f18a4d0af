// SPDX-License-Identifier: MIT OR GPL-2.0
//
// What the kfree_skb tracepoint needs from a `struct sk_buff`, in C because
// the layout of kernel structs changes between kernels and only clang emits
// CO-RE relocations (preserve_access_index): the loader resolves each field
// against the running kernel's BTF. Compiled to LLVM bitcode by build.rs and
// linked into the Rust program by bpf-linker (which inlines it).
//
// The tracepoint's arguments are BTF-typed (tp_btf), so these are plain
// loads the verifier turns into fault-safe ones: no helper call per field.
// Only the fields read here are declared, by their kernel names; anonymous
// unions and structs around them in the kernel are matched through.

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;

struct ns_common {
	unsigned int inum;
} __attribute__((preserve_access_index));

struct net {
	struct ns_common ns;
} __attribute__((preserve_access_index));

typedef struct {
	struct net *net;
} possible_net_t;

struct net_device {
	int ifindex;
	possible_net_t nd_net;
} __attribute__((preserve_access_index));

struct sk_buff {
	struct net_device *dev;
	unsigned char *head;
	// sk_buff_data_t: an offset from head on 64-bit kernels, which are the
	// only ones this object targets (x86_64).
	unsigned int tail;
	__u16 network_header;
	__u16 protocol;
} __attribute__((preserve_access_index));

// The values of this kernel are taken from its BTF (enum value
// relocations): SKB_CONSUMED only exists since Linux 6.4, and before it
// the value 1 meant SKB_DROP_REASON_NOT_SPECIFIED, a real drop.
enum skb_drop_reason {
	SKB_NOT_DROPPED_YET = 0,
	SKB_CONSUMED = 1,
	SKB_DROP_REASON_NOT_SPECIFIED = 2,
};

// Keep in step with src/kdrop.rs.
struct mycni_skb_dev {
	__u32 ifindex;
	__u32 netns;
};

struct mycni_skb_l3 {
	__u64 nh;    // address of the network header in kernel memory
	__u32 avail; // bytes of linear data from there on (0: none)
	__u16 protocol; // skb->protocol, network byte order
	__u16 _pad;
};

// Whether `reason` (the tracepoint's third argument) is a drop: neither
// "not dropped yet" nor, where the kernel has it, "consumed".
__attribute__((always_inline)) int mycni_skb_is_drop(__u32 reason)
{
	if (reason == __builtin_preserve_enum_value(*(enum skb_drop_reason *)SKB_NOT_DROPPED_YET, 1))
		return 0;
	if (__builtin_preserve_enum_value(*(enum skb_drop_reason *)SKB_CONSUMED, 0) &&
	    reason == __builtin_preserve_enum_value(*(enum skb_drop_reason *)SKB_CONSUMED, 1))
		return 0;
	return 1;
}

// Whether `reason` is SKB_DROP_REASON_NOT_SPECIFIED, what the kernel
// says when nobody on the node listens to a multicast group a pod sends
// to (its IPv6 neighbour discovery and MLD at every link-up, mDNS, ...).
__attribute__((always_inline)) int mycni_skb_reason_unspecified(__u32 reason)
{
	return reason == __builtin_preserve_enum_value(
				 *(enum skb_drop_reason *)SKB_DROP_REASON_NOT_SPECIFIED, 1);
}

// The device the skb was on when freed and its namespace; 0 without a
// device (a packet freed before it had one, or after it left).
__attribute__((always_inline)) int mycni_skb_dev(struct sk_buff *skb, struct mycni_skb_dev *out)
{
	struct net_device *dev = skb->dev;
	if (!dev)
		return 0;
	struct net *net = dev->nd_net.net;
	out->ifindex = (__u32)dev->ifindex;
	out->netns = net ? net->ns.inum : 0;
	return 1;
}

// Where the network header is and how much of the packet is linear from
// there: the headers are read with bpf_probe_read_kernel, never past what
// the skb holds.
__attribute__((always_inline)) void mycni_skb_l3(struct sk_buff *skb, struct mycni_skb_l3 *out)
{
	unsigned char *head = skb->head;
	__u32 nh = skb->network_header;
	__u32 tail = skb->tail;
	out->protocol = skb->protocol;
	out->nh = (__u64)(head + nh);
	out->avail = (head && tail > nh) ? tail - nh : 0;
}

// An atomic add whose result is unused, which clang emits as the BPF atomic
// add every kernel with BTF has (the Rust BPF target offers no atomics).
__attribute__((always_inline)) void mycni_atomic_add64(__u64 *p, __u64 v)
{
	__sync_fetch_and_add(p, v);
}
