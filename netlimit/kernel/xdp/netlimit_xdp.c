// SPDX-License-Identifier: GPL-2.0
/*
 * netlimit's XDP drop path (issue 34): the cheapest place a Linux host can drop a
 * packet, before the driver builds an skb, before conntrack and routing.
 *
 * Order, per packet arriving on an attached interface:
 *   1. exempt4/exempt6 (LPM tries)  -> XDP_PASS, never limited, never banned
 *   2. bans4/bans6     (LPM tries)  -> XDP_DROP (value: expiry, enforced by netlimitd)
 *   3. deny4/deny6     (LPM tries)  -> XDP_DROP (the static deny list)
 *   4. rules (array, MAX_RULES)     -> every enabled rule whose family, protocol and
 *      destination port range match charges the bucket of the masked source (LRU
 *      hash `buckets`); over the limit -> XDP_DROP
 *   5. XDP_PASS
 * Per-CPU counters: one slot per rule (passed, dropped) and four totals.
 *
 * The bucket is a token bucket kept as a single timestamp (GCRA, the "virtual
 * scheduling" form): `tat` is the time the bucket would be full again. A packet
 * is admitted when tat - now <= (burst - 1) * interval, and then tat advances by
 * one interval (period / limit). Same admissions as a bucket of `burst` tokens
 * refilled at limit/period — 100/s burst 10 over 5 s admits 510 — with one
 * 8-byte word of state, updated with compare-and-swap (no lock, no torn update
 * between CPUs).
 *
 * Built by `python -m netlimit.kernel.xdp.build`:
 *   clang -O2 -g -target bpf -mcpu=v3 -c netlimit_xdp.c -o netlimit_xdp.o
 * Layout of the structs below is mirrored in netlimit/kernel/xdp/maps.py.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>
#include <linux/tcp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define MAX_RULES 32
#define STAT_BANNED (MAX_RULES + 0)
#define STAT_DENIED (MAX_RULES + 1)
#define STAT_EXEMPT (MAX_RULES + 2)
#define STAT_PASSED (MAX_RULES + 3)
#define NCOUNTERS (MAX_RULES + 4)

struct lpm4 {
	__u32 prefixlen;
	__u8 addr[4];
};

struct lpm6 {
	__u32 prefixlen;
	__u8 addr[16];
};

/* A rule as the daemon writes it (little-endian fields, 40 bytes). */
struct rule {
	__u32 enabled;     /* 0 ends the table: rules are packed from index 0 */
	__u8 family;       /* 0 both, 4, 6 */
	__u8 proto;        /* 0 any, else IPPROTO_* (6 tcp, 17 udp, 1/58 icmp) */
	__u8 prefix4;      /* source prefix the bucket is keyed by: 32 per address, 24, 0 = one bucket */
	__u8 prefix6;      /* 128, 64, ... */
	__u16 dport_lo;    /* destination port range, host order; 0..65535 = any */
	__u16 dport_hi;
	__u32 _pad;
	__u64 interval_ns; /* period / limit */
	__u64 tolerance_ns; /* (burst - 1) * interval */
	__u64 _reserved;
};

struct bucket_key {
	__u32 rule;
	__u32 family;
	__u8 addr[16];
};

struct counter {
	__u64 passed;
	__u64 dropped;
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1024);
	__type(key, struct lpm4);
	__type(value, __u64);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} exempt4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1024);
	__type(key, struct lpm6);
	__type(value, __u64);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} exempt6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 262144);
	__type(key, struct lpm4);
	__type(value, __u64);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} bans4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 262144);
	__type(key, struct lpm6);
	__type(value, __u64);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} bans6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 16384);
	__type(key, struct lpm4);
	__type(value, __u64);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} deny4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 16384);
	__type(key, struct lpm6);
	__type(value, __u64);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} deny6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_RULES);
	__type(key, __u32);
	__type(value, struct rule);
} rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 131072);
	__type(key, struct bucket_key);
	__type(value, __u64);
} buckets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, NCOUNTERS);
	__type(key, __u32);
	__type(value, struct counter);
} counters SEC(".maps");

static __always_inline void count(__u32 slot, int dropped)
{
	struct counter *c = bpf_map_lookup_elem(&counters, &slot);

	if (c) {
		if (dropped)
			c->dropped++;
		else
			c->passed++;
	}
}

static __always_inline void mask_addr(__u8 *dst, const __u8 *src, __u32 len, __u32 prefix)
{
	/* len is 4 or 16; bytes past the prefix are zero, the partial byte masked */
#pragma unroll
	for (__u32 i = 0; i < 16; i++) {
		if (i >= len)
			break;
		if (prefix >= (i + 1) * 8)
			dst[i] = src[i];
		else if (prefix > i * 8)
			dst[i] = src[i] & (__u8)(0xff << (8 - (prefix - i * 8)));
		else
			dst[i] = 0;
	}
}

/* 1 when the packet is over the rule's limit, 0 when admitted */
static __always_inline int charge(__u32 idx, const struct rule *r, __u32 family, const __u8 *saddr)
{
	struct bucket_key key = {};
	__u64 now = bpf_ktime_get_ns();
	__u64 *tat;

	key.rule = idx;
	key.family = family;
	if (family == 4)
		mask_addr(key.addr, saddr, 4, r->prefix4);
	else
		mask_addr(key.addr, saddr, 16, r->prefix6);

	tat = bpf_map_lookup_elem(&buckets, &key);
	if (!tat) {
		__u64 next = now + r->interval_ns;

		/* BPF_NOEXIST: a CPU that lost the race charges the winner's bucket below */
		if (bpf_map_update_elem(&buckets, &key, &next, BPF_NOEXIST) == 0)
			return 0;
		tat = bpf_map_lookup_elem(&buckets, &key);
		if (!tat)
			return 0;
	}
#pragma unroll
	for (int tries = 0; tries < 4; tries++) {
		__u64 old = *(volatile __u64 *)tat;
		__u64 base = old > now ? old : now;

		if (base - now > r->tolerance_ns)
			return 1;
		if (__sync_val_compare_and_swap(tat, old, base + r->interval_ns) == old)
			return 0;
	}
	return 0; /* contention beyond 4 rounds: admit rather than drop a packet we did not charge */
}

struct rule_walk {
	__u32 family;
	__u8 proto;
	__u8 have_port;
	__u16 dport;
	__u8 saddr[16];
	__u32 drop;
};

/* one rule per call; 1 stops the walk (end of the table, or a drop) */
static long walk_rule(__u32 i, void *arg)
{
	struct rule_walk *w = arg;
	__u32 idx = i;
	struct rule *r = bpf_map_lookup_elem(&rules, &idx);

	if (!r || !r->enabled)
		return 1;
	if (r->family && r->family != w->family)
		return 0;
	if (r->proto && r->proto != w->proto)
		return 0;
	if (r->dport_lo || r->dport_hi != 0xffff) {
		if (!w->have_port || w->dport < r->dport_lo || w->dport > r->dport_hi)
			return 0;
	}
	if (charge(idx, r, w->family, w->saddr)) {
		count(idx, 1);
		w->drop = 1;
		return 1;
	}
	count(idx, 0);
	return 0;
}

SEC("xdp")
int netlimit_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	__u16 h_proto;
	__u32 off = sizeof(*eth);
	__u32 family;
	__u8 proto;
	__u8 saddr[16] = {};
	__u16 dport = 0;
	int have_port = 0;
	void *l4;

	if ((void *)(eth + 1) > data_end)
		return XDP_PASS;
	h_proto = eth->h_proto;
	/* up to two VLAN tags (802.1Q / 802.1ad) */
#pragma unroll
	for (int i = 0; i < 2; i++) {
		if (h_proto == bpf_htons(ETH_P_8021Q) || h_proto == bpf_htons(0x88A8)) {
			__u16 *vh = data + off;

			if ((void *)(vh + 2) > data_end)
				return XDP_PASS;
			h_proto = vh[1];
			off += 4;
		}
	}

	if (h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = data + off;
		struct lpm4 k4 = {.prefixlen = 32};

		if ((void *)(ip + 1) > data_end)
			return XDP_PASS;
		family = 4;
		proto = ip->protocol;
		__builtin_memcpy(saddr, &ip->saddr, 4);
		__builtin_memcpy(k4.addr, &ip->saddr, 4);
		if (bpf_map_lookup_elem(&exempt4, &k4)) {
			count(STAT_EXEMPT, 0);
			return XDP_PASS;
		}
		if (bpf_map_lookup_elem(&bans4, &k4)) {
			count(STAT_BANNED, 1);
			return XDP_DROP;
		}
		if (bpf_map_lookup_elem(&deny4, &k4)) {
			count(STAT_DENIED, 1);
			return XDP_DROP;
		}
		/* ports only in the first fragment */
		if (!(ip->frag_off & bpf_htons(0x1fff))) {
			l4 = (void *)ip + (ip->ihl & 0xf) * 4;
			have_port = 1;
		} else {
			l4 = 0;
		}
	} else if (h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = data + off;
		struct lpm6 k6 = {.prefixlen = 128};

		if ((void *)(ip6 + 1) > data_end)
			return XDP_PASS;
		family = 6;
		proto = ip6->nexthdr;
		__builtin_memcpy(saddr, &ip6->saddr, 16);
		__builtin_memcpy(k6.addr, &ip6->saddr, 16);
		if (bpf_map_lookup_elem(&exempt6, &k6)) {
			count(STAT_EXEMPT, 0);
			return XDP_PASS;
		}
		if (bpf_map_lookup_elem(&bans6, &k6)) {
			count(STAT_BANNED, 1);
			return XDP_DROP;
		}
		if (bpf_map_lookup_elem(&deny6, &k6)) {
			count(STAT_DENIED, 1);
			return XDP_DROP;
		}
		l4 = (void *)(ip6 + 1); /* extension headers: proto is the first next header */
		have_port = 1;
	} else {
		return XDP_PASS;
	}

	if (have_port && (proto == IPPROTO_TCP || proto == IPPROTO_UDP)) {
		/* dport sits at offset 2 in both TCP and UDP */
		__u16 *ports = l4;

		if ((void *)(ports + 2) <= data_end)
			dport = bpf_ntohs(ports[1]);
		else
			have_port = 0;
	} else {
		have_port = 0;
	}

	struct rule_walk w = {.family = family, .proto = proto, .have_port = have_port, .dport = dport};

	__builtin_memcpy(w.saddr, saddr, 16);
	/* bpf_loop: the callback is verified once, not once per rule (a plain
	 * 32-iteration loop took the verifier ~2 s per load) */
	bpf_loop(MAX_RULES, walk_rule, &w, 0);
	if (w.drop)
		return XDP_DROP;
	count(STAT_PASSED, 0);
	return XDP_PASS;
}

char _license[] SEC("license") = "GPL";
