/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * Shared parts of hsxfer's BPF congestion controls: the few kernel types they touch (declared
 * for CO-RE, so offsets are relocated against the running kernel's BTF at load time), the
 * kernel functions they call, the per-object statistics map and the guard against the
 * garbage-ssthresh hazard (DESIGN.md §3).
 */
#ifndef HSXFER_CC_H
#define HSXFER_CC_H

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

typedef __u8 u8;
typedef __u16 u16;
typedef __u32 u32;
typedef __s32 s32;
typedef __u64 u64;
typedef _Bool bool;
#define true 1
#define false 0

#define TCP_CONG_NON_RESTRICTED 0x1
#define TCP_INFINITE_SSTHRESH 0x7fffffffU

enum {
	TCP_CA_Open = 0,
	TCP_CA_Disorder = 1,
	TCP_CA_CWR = 2,
	TCP_CA_Recovery = 3,
	TCP_CA_Loss = 4,
};

/* Kernel types, only the members used; CO-RE finds them by name. */
struct sock_common {
	unsigned short skc_family;
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
	u32 sk_pacing_status;
} __attribute__((preserve_access_index));

#define SK_PACING_NEEDED 1

struct inet_sock {
	struct sock sk;
} __attribute__((preserve_access_index));

struct inet_connection_sock {
	struct inet_sock icsk_inet;
	void *icsk_ulp_data;
	u64 icsk_ca_priv[13];
} __attribute__((preserve_access_index));

struct tcp_sock {
	struct inet_connection_sock inet_conn;
	u32 snd_cwnd;
	u32 snd_ssthresh;
	u32 snd_cwnd_cnt;
	u32 snd_cwnd_clamp;
	u32 srtt_us;
	u32 prior_cwnd;
	u32 max_packets_out;
	u64 tcp_mstamp;
	u8 is_cwnd_limited : 1;
	bool is_mptcp;
} __attribute__((preserve_access_index));

struct mptcp_subflow_context {
	struct sock *conn;
} __attribute__((preserve_access_index));

struct ack_sample {
	u32 pkts_acked;
	s32 rtt_us;
	u32 in_flight;
} __attribute__((preserve_access_index));

struct rate_sample;

struct tcp_congestion_ops {
	u32 (*ssthresh)(struct sock *sk);
	void (*cong_avoid)(struct sock *sk, u32 ack, u32 acked);
	void (*set_state)(struct sock *sk, u8 new_state);
	void (*cwnd_event)(struct sock *sk, int ev);
	void (*in_ack_event)(struct sock *sk, u32 flags);
	void (*pkts_acked)(struct sock *sk, const struct ack_sample *sample);
	u32 (*undo_cwnd)(struct sock *sk);
	char name[16];
	u32 flags;
	void (*init)(struct sock *sk);
	void (*release)(struct sock *sk);
};

/* Kernel functions a BPF congestion control may call. */
extern u32 tcp_slow_start(struct tcp_sock *tp, u32 acked) __ksym;
extern void tcp_cong_avoid_ai(struct tcp_sock *tp, u32 w, u32 acked) __ksym;
extern u32 tcp_reno_undo_cwnd(struct sock *sk) __ksym;

static __always_inline struct tcp_sock *tcp_sk(const struct sock *sk)
{
	return (struct tcp_sock *)sk;
}

static __always_inline void *inet_csk_ca(const struct sock *sk)
{
	return (void *)((struct inet_connection_sock *)sk)->icsk_ca_priv;
}

static __always_inline bool tcp_in_slow_start(const struct tcp_sock *tp)
{
	return tp->snd_cwnd < tp->snd_ssthresh;
}

/* As the kernel's tcp_is_cwnd_limited(): growth only while the window is what limits sending. */
static __always_inline bool tcp_is_cwnd_limited(const struct sock *sk)
{
	const struct tcp_sock *tp = tcp_sk(sk);

	if (tcp_in_slow_start(tp))
		return tp->snd_cwnd < 2 * tp->max_packets_out;
	return BPF_CORE_READ_BITFIELD(tp, is_cwnd_limited);
}

/* Defined by HSX_STATS_MAP in each program. */
static __always_inline struct hsx_stats *hsx_stats(void);

static __always_inline u32 max_u32(u32 a, u32 b)
{
	return a > b ? a : b;
}

static __always_inline u32 min_u32(u32 a, u32 b)
{
	return a < b ? a : b;
}

/*
 * Per-object statistics, read by `hsxfer cc list`. The map is named NAME_stats after the
 * congestion control so user space can find it by name.
 */
struct hsx_stats {
	u64 sockets;           /* sockets that started using this congestion control */
	u64 released;          /* sockets that stopped using it */
	u64 ssthresh_repairs;  /* garbage ssthresh values replaced */
	u64 cwnd_repairs;      /* absurd cwnd jumps clamped */
};

#define HSX_STATS_MAP(cc)                                                              \
	struct {                                                                       \
		__uint(type, BPF_MAP_TYPE_ARRAY);                                      \
		__uint(max_entries, 1);                                                \
		__type(key, u32);                                                      \
		__type(value, struct hsx_stats);                                       \
	} cc##_stats SEC(".maps");                                                     \
	static __always_inline struct hsx_stats *hsx_stats(void)                       \
	{                                                                              \
		u32 zero = 0;                                                          \
		return bpf_map_lookup_elem(&cc##_stats, &zero);                        \
	}

/*
 * What the guard remembers per socket; every congestion control's private state starts with
 * it (icsk_ca_priv is zeroed by the kernel before init).
 */
struct hsx_guard {
	u32 max_cwnd;       /* the largest sane cwnd this socket has had */
	u32 last_ssthresh;  /* what our ssthresh hook last returned */
};

/*
 * The guard, run on every ACK before the kernel's loss recovery looks at ssthresh. On this
 * kernel a BPF congestion control occasionally finds snd_ssthresh set to a garbage value
 * (0x822034e5) on entering recovery; the kernel would then set cwnd near 10^8 when recovery
 * ends. Replace an ssthresh no window of this socket could have produced, clamp a cwnd that
 * more than doubled since the last ACK beyond anything seen, and count both.
 */
static __always_inline void hsx_guard_ack(struct sock *sk, struct hsx_guard *g,
					  struct hsx_stats *st)
{
	struct tcp_sock *tp = tcp_sk(sk);
	u32 cwnd = tp->snd_cwnd;
	u32 ssthresh = tp->snd_ssthresh;
	u32 sane = max_u32(max_u32(g->max_cwnd, tp->prior_cwnd), 16);

	if (ssthresh != TCP_INFINITE_SSTHRESH && ssthresh > 2 * sane + 16) {
		u32 fix = g->last_ssthresh;

		if (fix < 2 || fix > 2 * sane)
			fix = max_u32(cwnd >> 1, 2);
		tp->snd_ssthresh = fix;
		if (st)
			__sync_fetch_and_add(&st->ssthresh_repairs, 1);
	}
	if (cwnd > 2 * sane + 128) {
		cwnd = max_u32(g->max_cwnd, 2);
		tp->snd_cwnd = cwnd;
		if (st)
			__sync_fetch_and_add(&st->cwnd_repairs, 1);
	}
	if (cwnd > g->max_cwnd)
		g->max_cwnd = cwnd;
}

/* Records what an ssthresh hook returns, so the guard can restore it. */
static __always_inline u32 hsx_ssthresh_ret(struct hsx_guard *g, u32 ssthresh)
{
	g->last_ssthresh = ssthresh;
	return ssthresh;
}

static __always_inline void hsx_count_init(void)
{
	struct hsx_stats *st = hsx_stats();

	if (st)
		__sync_fetch_and_add(&st->sockets, 1);
}

static __always_inline void hsx_count_release(void)
{
	struct hsx_stats *st = hsx_stats();

	if (st)
		__sync_fetch_and_add(&st->released, 1);
}

#endif
