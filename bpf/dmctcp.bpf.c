// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * DMCTCP, Desynchronized Multi-Channel TCP (Cui 2013, chapter 5), as a BPF congestion control.
 *
 * The m channels of one connection form a group. On a loss on channel i, w_i is halved only if
 * it is the largest window in the group and more than one RTT has passed since the group's
 * last cut; otherwise the window is kept and the loss only retransmitted. On each ACK the
 * smallest channel grows by 1/w_i per segment, every other channel by 1/(w_total - w_min),
 * or faster while the group's growth curve (dmc_curve_w, hsxfer's addition) is above its total.
 * After the group's first cut, channels still in slow start take that cut's ssthresh.
 *
 * Groups: MPTCP subflows join the group of their parent connection; plain TCP channels join
 * the group named by a tag (u64 in the dmctcp_tags socket-storage map) that the sending
 * process sets before the congestion control starts. An untagged socket is a group of one.
 * A tagged group belongs to the user whose socket made it: another user's socket with the
 * same tag runs alone, so a tag read from the (world-readable) groups map cannot be used to
 * join it.
 * Channels are paced by TCP's internal pacing (see init); a channel idle for two RTTs is left
 * out of the comparisons (dmc_publish).
 */
/*
 * Internal pacing in congestion avoidance at 105 % of cwnd/srtt, not the kernel's 120 %: the
 * channels' caps then add up to about the path's rate when the group's window fills it, so a
 * stall of the ACK clock is not followed by a burst into a tiny queue (docs/cc.md: 72 % of a
 * 1 Gbit/s × 60 ms path with a 64-packet queue at 120 %, 84 % at 105 %).
 */
#define HSX_PACING_CA_RATIO 105
#include "hsxfer_cc.h"

/*
 * Two builds of this file: dmctcp (hsxfer's, above) and, with DMC_CLASSIC (dmctcp_classic.bpf.c),
 * dmctcp_classic (the kernel takes only letters, digits, "_" and "." in a name): Cui 2013's
 * rules alone, for research comparisons. It grows each channel by
 * the ACKs it gets (as the 2013 implementation counted), not by the segments they cover; it
 * has no group curve; and it leaves pacing to the socket (none unless a cap is set). The cut
 * rule, the slow-start adoption, the idle rule and the guard are the same. Names of its
 * programs and maps begin with dmcc_ (map names are cut at 15 characters in the kernel).
 */
#ifdef DMC_CLASSIC
#define DMC(x) dmcc_##x
#define DMC_OPS dmcc
#define DMC_CC_NAME "dmctcp_classic"
#else
#define DMC(x) dmctcp_##x
#define DMC_OPS dmctcp
#define DMC_CC_NAME "dmctcp"
#endif
/* One level more, so DMC_OPS is expanded before the macros paste it. */
#define DMC_PROG(name, args...) BPF_PROG(name, ##args)
#define DMC_STATS_MAP(cc) HSX_STATS_MAP(cc)
#define DMC_GUARD_HOOKS(cc, ca_type)                                                   \
	HSX_GUARD_EVENT_HOOK(cc, ca_type)                                              \
	HSX_GUARD_STATE_HOOK(cc, ca_type)                                              \
	HSX_CONG_CONTROL(cc, ca_type)

char _license[] SEC("license") = "Dual MIT/GPL";

#define DMC_MAX_CHANNELS 32
/* A channel that has not published its window for this many RTTs is idle: not compared. */
#define DMC_IDLE_RTTS 2
/* C of the group's growth curve, in segments/s^3 (CUBIC's form; Linux uses 0.4 per flow). */
#define DMC_C_NUM 3
#define DMC_C_DEN 10

DMC_STATS_MAP(DMC_OPS)

/*
 * A group: its channels' windows and counters. User space reads a tagged group by its tag, an
 * MPTCP group by its connection's token; the group goes with its last channel.
 */
struct dmc_group {
	struct bpf_spin_lock lock;
	u32 used;           /* bit i set: slot i holds a channel */
	u32 channels;       /* channels in the group now */
	u32 channels_peak;  /* most channels at once */
	u32 first_ssthresh; /* ssthresh of the group's first cut (0 before it) */
	u32 pad;
	u64 last_cut_us;    /* time of the group's last cut */
	u64 cuts;           /* losses that halved the largest window */
	u64 losses_kept;    /* losses that kept the window */
	u64 ss_adopted;     /* slow-start channels that took the first cut's ssthresh */
	u32 cwnd[DMC_MAX_CHANNELS];
	/* Added after the first layout (user space reads only the fields above). */
	u64 seen_us[DMC_MAX_CHANNELS]; /* when each slot last published its window */
	u64 epoch_us;       /* start of the group's growth curve: its last cut */
	u32 w_max;          /* the group's total window just before that cut */
	u32 k_ms;           /* how long the curve takes to climb back to w_max */
	/* Added later: the MPTCP connection's token (MPTCP_INFO tells user space), 0 for a tag. */
	u32 mptcp_token;
	u32 uid;            /* the owner of the socket that made the group */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u64);
	__type(value, struct dmc_group);
} DMC(groups) SEC(".maps");

/* The group tag of a TCP socket, set by the sending process (key: the socket's fd). */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, u64);
} DMC(tags) SEC(".maps");

/* Per-socket state in icsk_ca_priv. */
struct dmc_ca {
	struct hsx_guard guard;
	u64 key;      /* group key: a tag, or the MPTCP parent's address; 0: alone */
	u64 last_cut_us; /* an ungrouped channel's last cut */
	u32 slot;     /* 1 + slot in the group; 0: not in a group */
	u32 joined;   /* a join was attempted and settled */
};

static __always_inline u64 now_us(void)
{
	return bpf_ktime_get_ns() / 1000;
}

/* The group key of this socket, or 0 if it has none (yet). */
static __always_inline u64 dmc_group_key(struct sock *sk)
{
	struct tcp_sock *tp = tcp_sk(sk);
	u64 *tag;

	if (tp->is_mptcp) {
		struct mptcp_subflow_context *ctx =
			((struct inet_connection_sock *)sk)->icsk_ulp_data;
		struct sock *conn = BPF_CORE_READ(ctx, conn);

		return (u64)conn;
	}
	tag = bpf_sk_storage_get(&DMC(tags), sk, 0, 0);
	return tag ? *tag : 0;
}

/* Takes a free slot in the group of `key`, creating the group if needed. */
static __always_inline void dmc_join(struct sock *sk, struct dmc_ca *ca)
{
	struct dmc_group zero = {};
	struct dmc_group *g;
	u64 key, now = now_us();
	u32 slot = 0, uid;

	/* The first ACK (the SYN-ACK's) can come before init: join once. */
	if (ca->joined)
		return;
	key = dmc_group_key(sk);
	if (!key)
		return;
	ca->joined = 1;
	uid = BPF_CORE_READ(sk, sk_uid.val);
	g = bpf_map_lookup_elem(&DMC(groups), &key);
	if (!g) {
		if (key >> 63)
			zero.mptcp_token = BPF_CORE_READ((struct mptcp_sock *)key, token);
		zero.uid = uid;
		bpf_map_update_elem(&DMC(groups), &key, &zero, BPF_NOEXIST);
		g = bpf_map_lookup_elem(&DMC(groups), &key);
		if (!g)
			return;
	}
	/* MPTCP keys are kernel addresses no user can choose; tags are checked. */
	if (!(key >> 63) && g->uid != uid)
		return;
	bpf_spin_lock(&g->lock);
	for (u32 i = 0; i < DMC_MAX_CHANNELS; i++) {
		if (!(g->used & (1U << i))) {
			g->used |= 1U << i;
			g->cwnd[i] = tcp_sk(sk)->snd_cwnd;
			g->seen_us[i] = now;
			g->channels++;
			if (g->channels > g->channels_peak)
				g->channels_peak = g->channels;
			slot = i + 1;
			break;
		}
	}
	bpf_spin_unlock(&g->lock);
	if (slot) {
		ca->key = key;
		ca->slot = slot;
	}
}

static __always_inline struct dmc_group *dmc_group(struct dmc_ca *ca)
{
	u64 key = ca->key;

	if (!ca->slot)
		return 0;
	return bpf_map_lookup_elem(&DMC(groups), &key);
}

/* The group's windows, with this channel's current one. */
struct dmc_view {
	u32 total;
	u32 min;
	u32 max_others;
	u32 w_max;
	u32 k_ms;
	u64 epoch_us;
};

/*
 * Publishes this channel's window and reads the others'. The loop does not compare slots
 * with this channel's (the verifier would follow every slot as a separate path): the
 * channel is left out through the `others` mask. Windows are published on ACKs, so an idle
 * channel's (a disk-bound one, or one at the end of its work) is as old as its last ACK:
 * one not published for DMC_IDLE_RTTS RTTs is left out, so its stale window can neither
 * be "the largest" that keeps every loss of the busy channels nor inflate their sum.
 */
static __always_inline struct dmc_view dmc_publish(struct sock *sk, struct dmc_group *g,
						    u32 slot)
{
	struct tcp_sock *tp = tcp_sk(sk);
	u32 cwnd = tp->snd_cwnd;
	u64 now = now_us();
	u64 idle_us = (u64)DMC_IDLE_RTTS * max_u32(tp->srtt_us >> 3, 1000);
	struct dmc_view v = { .total = cwnd, .min = cwnd, .max_others = 0 };
	u32 me = (slot - 1) & (DMC_MAX_CHANNELS - 1);
	u32 others;

	bpf_spin_lock(&g->lock);
	g->cwnd[me] = cwnd;
	g->seen_us[me] = now;
	v.w_max = g->w_max;
	v.k_ms = g->k_ms;
	v.epoch_us = g->epoch_us;
	others = g->used & ~(1U << me);
	for (u32 i = 0; i < DMC_MAX_CHANNELS; i++) {
		u32 w = g->cwnd[i];

		/* Signed: another CPU may have published after `now` was read. */
		if (!(others & (1U << i)) || (s64)(now - g->seen_us[i]) > (s64)idle_us)
			continue;
		v.total += w;
		v.min = min_u32(v.min, w);
		v.max_others = max_u32(v.max_others, w);
	}
	bpf_spin_unlock(&g->lock);
	return v;
}

SEC("struct_ops")
void DMC_PROG(DMC(init), struct sock *sk)
{
	struct dmc_ca *ca = inet_csk_ca(sk);

	hsx_guard_init(sk, &ca->guard);
	dmc_join(sk, ca);
	/*
	 * TCP's internal pacing (cwnd/srtt x 1.2 in congestion avoidance, no fq needed): the
	 * seed's model assumes ACK-clocked, smooth channels; unpaced, a channel's line-rate bursts
	 * overflow a tiny drop-tail buffer long before the aggregate fills the path.
	 */
#ifndef DMC_CLASSIC
	sk->sk_pacing_status = SK_PACING_NEEDED;
#endif
}

SEC("struct_ops")
void DMC_PROG(DMC(release), struct sock *sk)
{
	struct dmc_ca *ca = inet_csk_ca(sk);
	struct dmc_group *g = dmc_group(ca);
	u32 me = (ca->slot - 1) & (DMC_MAX_CHANNELS - 1);
	u32 left = 1;

	hsx_count_release();
	if (!g)
		return;
	bpf_spin_lock(&g->lock);
	if (g->used & (1U << me)) {
		g->used &= ~(1U << me);
		g->cwnd[me] = 0;
		g->channels--;
	}
	left = g->channels;
	bpf_spin_unlock(&g->lock);
	ca->slot = 0;
	/*
	 * The group goes with its last channel, so groups made by users who may not delete them
	 * (an unprivileged sender) cannot fill the map; user space keeps the counters it last read.
	 */
	if (!left) {
		u64 key = ca->key;

		bpf_map_delete_elem(&DMC(groups), &key);
	}
}

SEC("struct_ops")
void DMC_PROG(DMC(in_ack_event), struct sock *sk, u32 flags)
{
	struct dmc_ca *ca = inet_csk_ca(sk);
	struct dmc_group *g;

	/* A skipped ssthresh call is decided in this ACK's later hooks (see hsx_guard_with). */
	hsx_guard_with(sk, &ca->guard, false);
	if (!ca->joined)
		dmc_join(sk, ca);
	g = dmc_group(ca);
	if (g)
		dmc_publish(sk, g, ca->slot);
}

/*
 * Cube root of x < 2^60, to within one (Newton's iteration from above: only arithmetic, no
 * branch on the data, so the verifier walks it once). x^(1/3) < 2^20, the starting point.
 */
static __always_inline u64 dmc_cbrt(u64 x)
{
	u64 r = 1ULL << 20;

	if (!x)
		return 0;
	for (int i = 0; i < 24; i++)
		r = (2 * r + x / (r * r)) / 3;
	return r;
}

/* K of the group's curve, ms, after a cut that takes `drop` segments off its total. */
static __always_inline u32 dmc_k_ms(u32 drop)
{
	/* K = cbrt(drop / C) s = cbrt(drop * 10^9 / C) ms. */
	return (u32)dmc_cbrt((u64)min_u32(drop, 100000000) * 1000000000ULL * DMC_C_DEN / DMC_C_NUM);
}

/*
 * The group's curve W(t) = C (t - K)^3 + w_max from its last cut, one RTT ahead (as CUBIC):
 * concave back to the total before the cut, then convex past it. Returns tcp_cong_avoid_ai's
 * w that makes each channel grow by cwnd_i (W - total) / total per RTT (at most half its
 * window), or ~0 when the curve is at or below the total, or before the group's first cut.
 */
static __always_inline u32 dmc_curve_w(const struct dmc_view *v, u32 srtt_us)
{
	u64 now = now_us(), t_ms, d, off, target;

	if (!v->epoch_us || !v->total)
		return ~0U;
	/* The cut may have been made on another CPU after `now` was read. */
	t_ms = (now > v->epoch_us ? now - v->epoch_us : 0) / 1000 + srtt_us / 1000;
	d = t_ms > v->k_ms ? t_ms - v->k_ms : v->k_ms - t_ms;
	if (d > 1000000)
		d = 1000000;
	off = d * d * d / 1000000000ULL * DMC_C_NUM / DMC_C_DEN;
	if (t_ms > v->k_ms)
		target = v->w_max + off;
	else
		target = off < v->w_max ? v->w_max - off : 0;
	if (target <= v->total)
		return ~0U;
	d = v->total / (target - v->total);
	return d < 2 ? 2 : (u32)d;
}

/*
 * Cut (halve) only the largest window, at most once per RTT per group; otherwise keep it.
 * `cwnd` is the window the loss was seen at. A function of its own (not inlined): inlined
 * into the guard of every hook, its view of the group overflowed the 512-byte BPF stack.
 */
static __noinline u32 hsx_decide_ssthresh(struct sock *sk, u32 cwnd)
{
	struct dmc_ca *ca = inet_csk_ca(sk);
	struct tcp_sock *tp = tcp_sk(sk);
	u32 cut = max_u32(cwnd >> 1, 2), k_ms;
	u64 now = now_us();
	u64 rtt = tp->srtt_us >> 3;
	struct dmc_group *g = dmc_group(ca);
	struct dmc_view v;
	bool halve = false;

	if (!g) {
		halve = now - ca->last_cut_us > rtt;
		if (halve)
			ca->last_cut_us = now;
		return halve ? cut : max_u32(cwnd, 2);
	}
	v = dmc_publish(sk, g, ca->slot);
	k_ms = dmc_k_ms(cwnd - cut);
	bpf_spin_lock(&g->lock);
	if (cwnd >= v.max_others && now - g->last_cut_us > rtt) {
		halve = true;
		g->last_cut_us = now;
		g->cuts++;
		g->epoch_us = now;
		g->w_max = v.total;
		g->k_ms = k_ms;
		if (!g->first_ssthresh)
			g->first_ssthresh = cut;
	} else {
		g->losses_kept++;
	}
	bpf_spin_unlock(&g->lock);
	return halve ? cut : max_u32(cwnd, 2);
}

SEC("struct_ops")
u32 DMC_PROG(DMC(ssthresh), struct sock *sk)
{
	struct dmc_ca *ca = inet_csk_ca(sk);

	hsx_guard(sk, &ca->guard);
	return hsx_ssthresh_ret(&ca->guard, hsx_decide_ssthresh(sk, tcp_sk(sk)->snd_cwnd));
}

/* Growth, called from cong_control (HSX_CONG_CONTROL) on in-order delivery. */
static __always_inline void DMC(cong_avoid)(struct sock *sk, u32 ack, u32 acked)
{
	struct dmc_ca *ca = inet_csk_ca(sk);
	struct tcp_sock *tp = tcp_sk(sk);
	struct dmc_group *g = dmc_group(ca);
	struct dmc_view v;
	u32 w;

	if (!tcp_is_cwnd_limited(sk))
		return;
	if (g && tp->snd_ssthresh == TCP_INFINITE_SSTHRESH) {
		u32 first = g->first_ssthresh;

		if (first) {
			tp->snd_ssthresh = hsx_ssthresh_ret(&ca->guard, first);
			__sync_fetch_and_add(&g->ss_adopted, 1);
		}
	}
	if (tcp_in_slow_start(tp)) {
		acked = tcp_slow_start(tp, acked);
		if (!acked)
			goto publish;
	}
	w = tp->snd_cwnd;
	if (g) {
		v = dmc_publish(sk, g, ca->slot);
		if (tp->snd_cwnd > v.min && v.total > v.min)
			w = v.total - v.min;
#ifndef DMC_CLASSIC
		w = min_u32(w, dmc_curve_w(&v, tp->srtt_us >> 3));
#endif
	}
#ifdef DMC_CLASSIC
	acked = 1;
#endif
	tcp_cong_avoid_ai(tp, max_u32(w, 1), acked);
publish:
	if (g)
		dmc_publish(sk, g, ca->slot);
}

SEC("struct_ops")
u32 DMC_PROG(DMC(undo_cwnd), struct sock *sk)
{
	struct dmc_ca *ca = inet_csk_ca(sk);

	return hsx_undo_ret(&ca->guard, tcp_reno_undo_cwnd(sk));
}

DMC_GUARD_HOOKS(DMC_OPS, struct dmc_ca)

SEC(".struct_ops.link")
struct tcp_congestion_ops DMC_OPS = {
	.init = (void *)DMC(init),
	.release = (void *)DMC(release),
	.ssthresh = (void *)DMC(ssthresh),
	.cong_control = (void *)DMC(cong_control),
	.in_ack_event = (void *)DMC(in_ack_event),
	.cwnd_event = (void *)DMC(cwnd_event),
	.set_state = (void *)DMC(set_state),
	.undo_cwnd = (void *)DMC(undo_cwnd),
	.flags = TCP_CONG_NON_RESTRICTED,
	.name = DMC_CC_NAME,
};
