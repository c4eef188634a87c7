// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * BIC-TCP as Linux's tcp_bic: binary search toward the window of the last loss (w_max), at
 * most S_max = 16 and at least B/sigma = 0.2 segments per RTT, with fast convergence and
 * Reno below low_window = 14. Unlike the kernel's, the increase counts ACKed segments
 * (tcp_cong_avoid_ai with `acked`), so no delayed-ACK ratio correction is applied on top.
 */
#include "hsxfer_cc.h"

char _license[] SEC("license") = "Dual MIT/GPL";

#define BIC_B 4              /* binary search divisor */
#define BIC_SMOOTH 20        /* sigma: B / sigma is the smallest increase */
#define BIC_MAX_INCREMENT 16 /* S_max, segments per RTT */
#define BIC_LOW_WINDOW 14
#define BIC_BETA 819         /* / 1024: the window after a loss */
#define BIC_BETA_SCALE 1024
#define BIC_NO_LOSS_CNT 20   /* before the first loss: at least +5 % per RTT */

HSX_STATS_MAP(bic)

struct bic_ca {
	struct hsx_guard guard;
	u32 cnt;           /* ACKed segments per +1 cwnd */
	u32 last_max_cwnd; /* w_max */
	u32 last_cwnd;     /* cwnd when cnt was last computed */
	u32 last_us;       /* and when (low 32 bits of microseconds) */
};

static __always_inline void bic_reset(struct bic_ca *ca)
{
	ca->cnt = 0;
	ca->last_max_cwnd = 0;
	ca->last_cwnd = 0;
	ca->last_us = 0;
}

/* cnt for window `cwnd`: cwnd / cnt is the increase per RTT. */
static __always_inline void bic_update(struct bic_ca *ca, u32 cwnd, u32 now)
{
	u32 wmax = ca->last_max_cwnd;

	if (ca->last_cwnd == cwnd && now - ca->last_us <= 1000000 / 32)
		return;
	ca->last_cwnd = cwnd;
	ca->last_us = now;
	if (cwnd <= BIC_LOW_WINDOW) {
		ca->cnt = cwnd;
		return;
	}
	if (cwnd < wmax) {
		u32 dist = (wmax - cwnd) / BIC_B;

		if (dist > BIC_MAX_INCREMENT)
			ca->cnt = cwnd / BIC_MAX_INCREMENT;
		else if (dist <= 1)
			ca->cnt = cwnd * BIC_SMOOTH / BIC_B;
		else
			ca->cnt = cwnd / dist;
	} else {
		if (cwnd < wmax + BIC_B)
			ca->cnt = cwnd * BIC_SMOOTH / BIC_B;
		else if (cwnd < wmax + BIC_MAX_INCREMENT * (BIC_B - 1))
			ca->cnt = cwnd * (BIC_B - 1) / (cwnd - wmax);
		else
			ca->cnt = cwnd / BIC_MAX_INCREMENT;
	}
	if (wmax == 0 && ca->cnt > BIC_NO_LOSS_CNT)
		ca->cnt = BIC_NO_LOSS_CNT;
	if (ca->cnt == 0)
		ca->cnt = 1;
}

SEC("struct_ops")
void BPF_PROG(bic_init, struct sock *sk)
{
	struct bic_ca *ca = inet_csk_ca(sk);

	bic_reset(ca);
	hsx_guard_init(sk, &ca->guard);
}

SEC("struct_ops")
void BPF_PROG(bic_release, struct sock *sk)
{
	hsx_count_release();
}

SEC("struct_ops")
void BPF_PROG(bic_in_ack_event, struct sock *sk, u32 flags)
{
	struct bic_ca *ca = inet_csk_ca(sk);

	hsx_guard(sk, &ca->guard);
}

/* Growth, called from cong_control (HSX_CONG_CONTROL) on in-order delivery. */
static __always_inline void bic_cong_avoid(struct sock *sk, u32 ack, u32 acked)
{
	struct bic_ca *ca = inet_csk_ca(sk);
	struct tcp_sock *tp = tcp_sk(sk);

	if (!tcp_is_cwnd_limited(sk))
		return;
	if (tcp_in_slow_start(tp)) {
		acked = tcp_slow_start(tp, acked);
		if (!acked)
			return;
	}
	bic_update(ca, tp->snd_cwnd, (u32)(tp->tcp_mstamp));
	tcp_cong_avoid_ai(tp, ca->cnt, acked);
}

static __always_inline u32 hsx_decide_ssthresh(struct sock *sk, u32 cwnd)
{
	struct bic_ca *ca = inet_csk_ca(sk);

	/* w_max, with fast convergence: below the last maximum, give up some of it. */
	if (cwnd < ca->last_max_cwnd)
		ca->last_max_cwnd = cwnd * (BIC_BETA_SCALE + BIC_BETA) / (2 * BIC_BETA_SCALE);
	else
		ca->last_max_cwnd = cwnd;
	if (cwnd <= BIC_LOW_WINDOW)
		return max_u32(cwnd >> 1, 2);
	return max_u32(cwnd * BIC_BETA / BIC_BETA_SCALE, 2);
}

SEC("struct_ops")
u32 BPF_PROG(bic_ssthresh, struct sock *sk)
{
	struct bic_ca *ca = inet_csk_ca(sk);

	hsx_guard(sk, &ca->guard);
	return hsx_ssthresh_ret(&ca->guard, hsx_decide_ssthresh(sk, tcp_sk(sk)->snd_cwnd));
}

SEC("struct_ops")
void BPF_PROG(bic_set_state, struct sock *sk, u8 new_state)
{
	struct bic_ca *ca = inet_csk_ca(sk);

	hsx_set_state(sk, &ca->guard, new_state);
	/* After a timeout, start the search afresh (as the kernel does). */
	if (new_state == TCP_CA_Loss)
		bic_reset(ca);
}

SEC("struct_ops")
u32 BPF_PROG(bic_undo_cwnd, struct sock *sk)
{
	struct bic_ca *ca = inet_csk_ca(sk);

	return hsx_undo_ret(&ca->guard, tcp_reno_undo_cwnd(sk));
}

HSX_GUARD_EVENT_HOOK(bic, struct bic_ca)

HSX_CONG_CONTROL(bic, struct bic_ca)

SEC(".struct_ops.link")
struct tcp_congestion_ops bic = {
	.init = (void *)bic_init,
	.release = (void *)bic_release,
	.ssthresh = (void *)bic_ssthresh,
	.cong_control = (void *)bic_cong_control,
	.in_ack_event = (void *)bic_in_ack_event,
	.cwnd_event = (void *)bic_cwnd_event,
	.set_state = (void *)bic_set_state,
	.undo_cwnd = (void *)bic_undo_cwnd,
	.flags = TCP_CONG_NON_RESTRICTED,
	.name = "bic",
};
