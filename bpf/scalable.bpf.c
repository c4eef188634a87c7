// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * Scalable TCP (Kelly), with the constants of Li, Leith and Shorten 2007, Table II: alpha = 0.01 per ACKed
 * segment, beta = 0.875 (cut by 1/8), standard Reno rules below Low_Window = 16 segments.
 */
#include "hsxfer_cc.h"

char _license[] SEC("license") = "Dual MIT/GPL";

#define SCALABLE_LOW_WINDOW 16
/* +1 segment per 100 ACKed segments: alpha = 0.01. */
#define SCALABLE_AI_CNT 100
/* ssthresh = cwnd - cwnd >> 3: beta = 0.875. */
#define SCALABLE_MD_SHIFT 3

HSX_STATS_MAP(scalable)

struct scalable_ca {
	struct hsx_guard guard;
};

SEC("struct_ops")
void BPF_PROG(scalable_init, struct sock *sk)
{
	struct scalable_ca *ca = inet_csk_ca(sk);

	hsx_guard_init(sk, &ca->guard);
}

SEC("struct_ops")
void BPF_PROG(scalable_release, struct sock *sk)
{
	hsx_count_release();
}

SEC("struct_ops")
void BPF_PROG(scalable_in_ack_event, struct sock *sk, u32 flags)
{
	struct scalable_ca *ca = inet_csk_ca(sk);

	hsx_guard(sk, &ca->guard);
}

/* Growth, called from cong_control (HSX_CONG_CONTROL) on in-order delivery. */
static __always_inline void scalable_cong_avoid(struct sock *sk, u32 ack, u32 acked)
{
	struct tcp_sock *tp = tcp_sk(sk);

	if (!tcp_is_cwnd_limited(sk))
		return;
	if (tcp_in_slow_start(tp)) {
		acked = tcp_slow_start(tp, acked);
		if (!acked)
			return;
	}
	if (tp->snd_cwnd < SCALABLE_LOW_WINDOW)
		tcp_cong_avoid_ai(tp, tp->snd_cwnd, acked);
	else
		tcp_cong_avoid_ai(tp, SCALABLE_AI_CNT, acked);
}

static __always_inline u32 hsx_decide_ssthresh(struct sock *sk, u32 cwnd)
{
	if (cwnd < SCALABLE_LOW_WINDOW)
		return max_u32(cwnd >> 1, 2);
	return max_u32(cwnd - (cwnd >> SCALABLE_MD_SHIFT), 2);
}

SEC("struct_ops")
u32 BPF_PROG(scalable_ssthresh, struct sock *sk)
{
	struct scalable_ca *ca = inet_csk_ca(sk);

	hsx_guard(sk, &ca->guard);
	return hsx_ssthresh_ret(&ca->guard, hsx_decide_ssthresh(sk, tcp_sk(sk)->snd_cwnd));
}

SEC("struct_ops")
u32 BPF_PROG(scalable_undo_cwnd, struct sock *sk)
{
	struct scalable_ca *ca = inet_csk_ca(sk);

	return hsx_undo_ret(&ca->guard, tcp_reno_undo_cwnd(sk));
}

HSX_GUARD_EVENT_HOOK(scalable, struct scalable_ca)
HSX_GUARD_STATE_HOOK(scalable, struct scalable_ca)

HSX_CONG_CONTROL(scalable, struct scalable_ca)

SEC(".struct_ops.link")
struct tcp_congestion_ops scalable = {
	.init = (void *)scalable_init,
	.release = (void *)scalable_release,
	.ssthresh = (void *)scalable_ssthresh,
	.cong_control = (void *)scalable_cong_control,
	.in_ack_event = (void *)scalable_in_ack_event,
	.cwnd_event = (void *)scalable_cwnd_event,
	.set_state = (void *)scalable_set_state,
	.undo_cwnd = (void *)scalable_undo_cwnd,
	.flags = TCP_CONG_NON_RESTRICTED,
	.name = "scalable",
};
