/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * Shared parts of hsxfer's BPF congestion controls: the few kernel types they touch (declared
 * for CO-RE, so offsets are relocated against the running kernel's BTF at load time), the
 * kernel functions they call, the per-object statistics map and the guard against the
 * garbage-ssthresh hazard (docs/cc.md "The guard").
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
typedef __s64 s64;
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

typedef struct {
	u32 val;
} kuid_t;

struct sock {
	struct sock_common __sk_common;
	kuid_t sk_uid;
	u32 sk_pacing_status;
	unsigned long sk_pacing_rate;
	unsigned long sk_max_pacing_rate;
} __attribute__((preserve_access_index));

#define SK_PACING_NEEDED 1

struct inet_sock {
	struct sock sk;
} __attribute__((preserve_access_index));

struct inet_connection_sock {
	struct inet_sock icsk_inet;
	void *icsk_ulp_data;
	u8 icsk_ca_state : 5;
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
	u32 mss_cache;
	u32 packets_out;
	u32 sacked_out;
	u32 lost_out;
	u32 retrans_out;
	u32 prr_out;
	u32 high_seq;
	u32 undo_marker;
	u32 reordering;
	u64 tcp_mstamp;
	u8 is_cwnd_limited : 1;
	bool is_mptcp;
} __attribute__((preserve_access_index));

struct mptcp_subflow_context {
	struct sock *conn;
} __attribute__((preserve_access_index));

struct mptcp_sock {
	u32 token;
} __attribute__((preserve_access_index));

struct ack_sample {
	u32 pkts_acked;
	s32 rtt_us;
	u32 in_flight;
} __attribute__((preserve_access_index));

struct rate_sample {
	int losses;
	u32 acked_sacked;
} __attribute__((preserve_access_index));

struct tcp_congestion_ops {
	u32 (*ssthresh)(struct sock *sk);
	void (*cong_avoid)(struct sock *sk, u32 ack, u32 acked);
	void (*set_state)(struct sock *sk, u8 new_state);
	void (*cwnd_event)(struct sock *sk, int ev);
	void (*in_ack_event)(struct sock *sk, u32 flags);
	void (*pkts_acked)(struct sock *sk, const struct ack_sample *sample);
	u32 (*undo_cwnd)(struct sock *sk);
	void (*cong_control)(struct sock *sk, u32 ack, int flag, const struct rate_sample *rs);
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
 * One ssthresh repair, kept so that a garbage value seen from user space (TCP_INFO) can be
 * matched with the repair that removed it and with whether the kernel skipped our call.
 */
struct hsx_repair {
	u32 garbage;  /* the ssthresh replaced */
	u32 gap_us;   /* µs since the guard last ran on the socket */
	u32 seq;      /* the repair's number, from 1 (0: an empty slot) */
	u8 state;     /* the socket's CA state then (set_state runs before the kernel changes it) */
	u8 skipped;   /* 1: our ssthresh program provably did not run for it */
};

/* How many of the latest ssthresh repairs hsx_stats keeps (a power of two). */
#define HSX_RECENT_REPAIRS 16

/*
 * Per-object statistics, read by `hsxfer cc list`. The map is named NAME_stats after the
 * congestion control so user space can find it by name.
 */
struct hsx_stats {
	u64 sockets;           /* sockets that ran this congestion control (at their first hook) */
	u64 released;          /* sockets that stopped using it */
	u64 ssthresh_repairs;  /* garbage ssthresh values replaced */
	u64 cwnd_repairs;      /* absurd cwnd jumps clamped */
	u64 skipped_ssthresh;  /* of those, written while our ssthresh program provably did not run */
	u64 last_garbage;      /* the last garbage ssthresh replaced */
	struct hsx_repair recent[HSX_RECENT_REPAIRS]; /* repair n (from 1) at n % HSX_RECENT_REPAIRS */
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
	u32 max_cwnd;       /* the largest cwnd the guard has accepted */
	u32 last_ssthresh;  /* what this program last set ssthresh to */
	u32 ss_calls;       /* ssthresh values this program set (hsx_ssthresh_ret) */
	u32 ss_seen;        /* ss_calls when the guard last ran */
	u32 prr_delivered;  /* segments delivered since the reduction began (PRR) */
	u32 prr_high_seq;   /* high_seq of the reduction prr_delivered counts for */
	u32 counted;        /* the socket is in hsx_stats.sockets */
	u32 last_run_us;    /* tcp_mstamp (low 32 bits, µs) when the guard last ran */
};

/*
 * The largest cwnd a socket can reach between two of its hooks: slow start at most doubles
 * it per ACK (a stretch ACK acknowledges less than a window), undo restores an earlier one.
 * Only windows the guard accepted count, never kernel fields such as prior_cwnd, which the
 * kernel copies from cwnd and so would carry a garbage window into the bound.
 */
static __always_inline u32 hsx_guard_bound(const struct hsx_guard *g)
{
	return 2 * max_u32(g->max_cwnd, 16) + 128;
}

/*
 * What the program's ssthresh hook decides for a loss seen at window `cwnd`, without the
 * guard. Every program defines it; its hook returns it and the guard makes the decision again
 * for a call the kernel skipped, so that loss is judged by the program's own rule.
 */
static u32 hsx_decide_ssthresh(struct sock *sk, u32 cwnd);

/* The socket's congestion-avoidance state (TCP_CA_*). */
static __always_inline u8 hsx_ca_state(struct sock *sk)
{
	return BPF_CORE_READ_BITFIELD_PROBED((struct inet_connection_sock *)sk, icsk_ca_state);
}

/* Counts an ssthresh repair and keeps it among the recent ones. */
static __always_inline void hsx_record_repair(struct hsx_stats *st, struct sock *sk,
					      const struct hsx_guard *g, u32 garbage)
{
	u64 seq = __sync_fetch_and_add(&st->ssthresh_repairs, 1) + 1;
	struct hsx_repair *r = &st->recent[seq & (HSX_RECENT_REPAIRS - 1)];
	bool skipped = g->ss_calls == g->ss_seen;

	if (skipped)
		__sync_fetch_and_add(&st->skipped_ssthresh, 1);
	st->last_garbage = garbage;
	r->garbage = garbage;
	r->gap_us = (u32)tcp_sk(sk)->tcp_mstamp - g->last_run_us;
	r->state = hsx_ca_state(sk);
	r->skipped = skipped;
	r->seq = (u32)seq;
}

/*
 * The guard against the garbage-ssthresh hazard (docs/cc.md "The guard"). On the
 * development VM the kernel now and then runs none of our hooks for an ACK (every ACK
 * processed on top of the VM agent's threads): the per-socket count of ssthresh calls
 * (ss_calls) does not move, and the kernel stores a stale stack word as ssthresh. The
 * set_state and cong_control calls of that ACK are skipped too. The
 * kernel's own PRR (tcp_cwnd_reduction) would turn that ssthresh into cwnd = ssthresh ×
 * delivered / prior_cwnd (67 M segments measured) in the same ACK, before any hook of ours
 * could run. So every program here has a cong_control hook (HSX_CONG_CONTROL): the kernel
 * then never computes a window from ssthresh (no PRR, no cwnd = ssthresh at the end of a
 * reduction); cwnd changes only in our code, after this check, or in kernel paths that
 * lower it (timeout, idle restart), or to what undo_cwnd returns. A skipped cong_control
 * leaves cwnd unchanged. Every hook runs this check and both repairs are counted (the
 * latest ssthresh repairs are kept, to match a garbage value seen in TCP_INFO). Without
 * `decide` a garbage ssthresh is left for the next hook that repairs it (cong_control at the
 * latest, in the same ACK, before anything turns it into a window): init sees no loss, and in
 * DMCTCP's in_ack_event the decision beside the group's join overflows the BPF stack (512
 * bytes over both calls).
 */
static __always_inline void hsx_guard_with(struct sock *sk, struct hsx_guard *g, bool decide)
{
	struct tcp_sock *tp = tcp_sk(sk);
	struct hsx_stats *st = hsx_stats();
	u32 bound = hsx_guard_bound(g);
	u32 cwnd = tp->snd_cwnd;
	u32 ssthresh = tp->snd_ssthresh;

	/*
	 * A socket is counted at the first hook that runs for it, not in init alone: the kernel
	 * skips calls now and then, init included, and a socket runs many hooks.
	 */
	if (!g->counted) {
		g->counted = 1;
		if (st)
			__sync_fetch_and_add(&st->sockets, 1);
	}
	if (cwnd > bound) {
		cwnd = max_u32(g->max_cwnd, 2);
		tp->snd_cwnd = cwnd;
		if (st)
			__sync_fetch_and_add(&st->cwnd_repairs, 1);
	}
	if (decide && ssthresh != TCP_INFINITE_SSTHRESH && ssthresh != g->last_ssthresh &&
	    ssthresh > bound) {
		/*
		 * The skipped call's decision, made now on the window the loss was seen at: the
		 * kernel copied it to prior_cwnd just before the call (a timeout lowers cwnd right
		 * after), bounded like every window the guard accepts. Not the last ssthresh the
		 * hook returned: that belongs to an earlier loss, and below the window it is a cut
		 * no rule made (DMCTCP: a cut off the group's largest window, within its RTT).
		 */
		u32 fix = hsx_decide_ssthresh(sk, min_u32(max_u32(tp->prior_cwnd, cwnd), bound));

		if (fix < 2 || fix > bound)
			fix = max_u32(cwnd >> 1, 2);
		tp->snd_ssthresh = fix;
		g->last_ssthresh = fix;
		if (st)
			hsx_record_repair(st, sk, g, ssthresh);
	}
	if (cwnd > g->max_cwnd)
		g->max_cwnd = cwnd;
	g->ss_seen = g->ss_calls;
	g->last_run_us = (u32)tp->tcp_mstamp;
}

/* The guard, run first in every hook but init. */
static __always_inline void hsx_guard(struct sock *sk, struct hsx_guard *g)
{
	hsx_guard_with(sk, g, true);
}

/*
 * Starts the guard on a new socket: an ssthresh already set (from the route's metrics or
 * the kernel's cache of earlier connections) is legitimate, however large.
 */
static __always_inline void hsx_guard_init(struct sock *sk, struct hsx_guard *g)
{
	u32 ssthresh = tcp_sk(sk)->snd_ssthresh;

	if (ssthresh != TCP_INFINITE_SSTHRESH)
		g->last_ssthresh = ssthresh;
	hsx_guard_with(sk, g, false);
}

/* Records what an ssthresh hook returns (or a program sets), so the guard can restore it. */
static __always_inline u32 hsx_ssthresh_ret(struct hsx_guard *g, u32 ssthresh)
{
	g->last_ssthresh = ssthresh;
	g->ss_calls++;
	return ssthresh;
}

/* Bounds what an undo_cwnd hook returns: the kernel sets cwnd to it without another hook. */
static __always_inline u32 hsx_undo_ret(struct hsx_guard *g, u32 cwnd)
{
	u32 bound = hsx_guard_bound(g);
	struct hsx_stats *st;

	if (cwnd <= bound)
		return cwnd;
	st = hsx_stats();
	if (st)
		__sync_fetch_and_add(&st->cwnd_repairs, 1);
	return max_u32(g->max_cwnd, 2);
}

/* The kernel's tcp_packets_in_flight(). */
static __always_inline u32 hsx_in_flight(const struct tcp_sock *tp)
{
	return tp->packets_out - (tp->sacked_out + tp->lost_out) + tp->retrans_out;
}

/* The kernel's ACK flags that cong_control receives (net/ipv4/tcp_input.c). */
#define HSX_FLAG_DATA_ACKED 0x04
#define HSX_FLAG_SND_UNA_ADVANCED 0x400
/* net.ipv4.tcp_reordering's default, and tcp_pacing_ss_ratio / tcp_pacing_ca_ratio's. */
#define HSX_REORDERING 3
#define HSX_PACING_SS_RATIO 200
#ifndef HSX_PACING_CA_RATIO
#define HSX_PACING_CA_RATIO 120
#endif

/*
 * Proportional Rate Reduction (RFC 6937) as the kernel's tcp_cwnd_reduction(), but from the
 * guarded ssthresh and with our own count of delivered segments: a new reduction is known by
 * the kernel moving high_seq (tcp_init_cwnd_reduction), so a skipped set_state cannot leave
 * a stale count behind.
 */
static __always_inline void hsx_prr(struct sock *sk, struct hsx_guard *g, u32 newly_acked,
				    bool una_advanced_no_loss)
{
	struct tcp_sock *tp = tcp_sk(sk);
	u32 in_flight = hsx_in_flight(tp);
	u32 ssthresh = tp->snd_ssthresh;
	u32 prior_cwnd = tp->prior_cwnd;
	s64 sndcnt;

	if (g->prr_high_seq != tp->high_seq) {
		g->prr_high_seq = tp->high_seq;
		g->prr_delivered = 0;
	}
	if (!newly_acked || !prior_cwnd)
		return;
	g->prr_delivered += newly_acked;
	if (ssthresh < in_flight) {
		u64 dividend = (u64)ssthresh * g->prr_delivered + prior_cwnd - 1;

		sndcnt = (s64)(dividend / prior_cwnd) - tp->prr_out;
	} else {
		sndcnt = (s64)g->prr_delivered - tp->prr_out;
		if (sndcnt < newly_acked)
			sndcnt = newly_acked;
		if (una_advanced_no_loss)
			sndcnt++;
		if (sndcnt > ssthresh - in_flight)
			sndcnt = ssthresh - in_flight;
	}
	if (sndcnt < (tp->prr_out ? 0 : 1))
		sndcnt = tp->prr_out ? 0 : 1;
	tp->snd_cwnd = in_flight + (u32)sndcnt;
}

/*
 * The kernel's tcp_update_pacing_rate() (it does not run for a congestion control with
 * cong_control): 200 % of cwnd/srtt in slow start, 120 % after, never above the socket's
 * SO_MAX_PACING_RATE. Only used when pacing is on (SK_PACING_NEEDED, or an fq qdisc).
 */
static __always_inline void hsx_update_pacing_rate(struct sock *sk)
{
	struct tcp_sock *tp = tcp_sk(sk);
	u32 cwnd = tp->snd_cwnd;
	u64 rate = (u64)tp->mss_cache * ((1000000 / 100) << 3);

	rate *= cwnd < tp->snd_ssthresh / 2 ? HSX_PACING_SS_RATIO : HSX_PACING_CA_RATIO;
	rate *= max_u32(cwnd, tp->packets_out);
	if (tp->srtt_us)
		rate /= tp->srtt_us;
	if (rate > sk->sk_max_pacing_rate)
		rate = sk->sk_max_pacing_rate;
	sk->sk_pacing_rate = rate;
}

/*
 * What the kernel's tcp_end_cwnd_reduction() does, which it skips for a congestion control
 * with cong_control: leaving CWR or Recovery (not by undo) sets cwnd to the guarded ssthresh.
 */
static __always_inline void hsx_end_reduction(struct sock *sk, u8 new_state)
{
	struct tcp_sock *tp = tcp_sk(sk);
	u8 old = hsx_ca_state(sk);

	if ((old == TCP_CA_CWR || old == TCP_CA_Recovery) && new_state <= TCP_CA_Disorder &&
	    tp->snd_ssthresh < TCP_INFINITE_SSTHRESH && (old == TCP_CA_CWR || tp->undo_marker))
		tp->snd_cwnd = tp->snd_ssthresh;
}

/*
 * cong_control for a congestion control `cc` whose private state type is `ca_type` and whose
 * growth rule is `static void cc_cong_avoid(struct sock *sk, u32 ack, u32 acked)` (called after
 * the guard, so it need not run it again): what the
 * kernel's tcp_cong_control() does (PRR while reducing, growth on in-order delivery, the
 * pacing rate), with the guard first.
 */
#define HSX_CONG_CONTROL(cc, ca_type)                                                   \
	SEC("struct_ops")                                                              \
	void BPF_PROG(cc##_cong_control, struct sock *sk, u32 ack, int flag,           \
		      const struct rate_sample *rs)                                    \
	{                                                                              \
		struct hsx_guard *g = &((ca_type *)inet_csk_ca(sk))->guard;             \
		u32 acked = rs->acked_sacked;                                          \
		u8 state;                                                              \
                                                                                       \
		hsx_guard(sk, g);                                                      \
		state = hsx_ca_state(sk);                                              \
		if (state == TCP_CA_CWR || state == TCP_CA_Recovery)                   \
			hsx_prr(sk, g, acked,                                          \
				(flag & HSX_FLAG_SND_UNA_ADVANCED) && !rs->losses);    \
		else if (tcp_sk(sk)->reordering > HSX_REORDERING ?                     \
				 acked : (flag & HSX_FLAG_DATA_ACKED))                 \
			cc##_cong_avoid(sk, ack, acked);                               \
		hsx_update_pacing_rate(sk);                                            \
	}

/*
 * What every set_state does first: the guard (right after the ssthresh the kernel takes on
 * entering CWR, Recovery or Loss), then the end of a reduction.
 */
static __always_inline void hsx_set_state(struct sock *sk, struct hsx_guard *g, u8 new_state)
{
	hsx_guard(sk, g);
	hsx_end_reduction(sk, new_state);
}

/*
 * The guard's own hooks for a congestion control whose private state type is `ca_type`:
 * cwnd_event (after a timeout's ssthresh, CA_EVENT_LOSS) and, for a program without a
 * set_state of its own, set_state (hsx_set_state).
 */
#define HSX_GUARD_EVENT_HOOK(cc, ca_type)                                               \
	SEC("struct_ops")                                                              \
	void BPF_PROG(cc##_cwnd_event, struct sock *sk, int ev)                        \
	{                                                                              \
		hsx_guard(sk, &((ca_type *)inet_csk_ca(sk))->guard);                   \
	}

#define HSX_GUARD_STATE_HOOK(cc, ca_type)                                               \
	SEC("struct_ops")                                                              \
	void BPF_PROG(cc##_set_state, struct sock *sk, u8 new_state)                   \
	{                                                                              \
		hsx_set_state(sk, &((ca_type *)inet_csk_ca(sk))->guard, new_state);    \
	}

static __always_inline void hsx_count_release(void)
{
	struct hsx_stats *st = hsx_stats();

	if (st)
		__sync_fetch_and_add(&st->released, 1);
}

#endif
