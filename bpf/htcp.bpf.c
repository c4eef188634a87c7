// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * H-TCP (Leith & Shorten) as Linux's tcp_htcp: the increase grows with the time since the last
 * congestion event, alpha(D) = 1 + 10 (D - D_L) + (D - D_L)^2 / 4 beyond D_L = 1 s, scaled by
 * min RTT / 100 ms and by 2 (1 - beta); the backoff beta = min RTT / max RTT in [0.5, 0.8],
 * or 0.5 when the throughput changed by more than 20 % since the previous epoch.
 * Times are in milliseconds (the kernel's jiffies at HZ = 1000), fixed point << 7.
 */
#include "hsxfer_cc.h"

char _license[] SEC("license") = "Dual MIT/GPL";

#define ALPHA_BASE (1 << 7) /* 1.0 */
#define BETA_MIN (1 << 6)   /* 0.5 */
#define BETA_MAX 102        /* 0.8 */
#define HZ 1000             /* time unit: ms */

HSX_STATS_MAP(htcp)

struct htcp_ca {
	struct hsx_guard guard;
	u32 alpha;      /* << 7 */
	u8 beta;        /* << 7 */
	u8 modeswitch;  /* adaptive beta only after one congestion event */
	u8 ca_state;
	u8 pad;
	u32 pkts_acked;
	u32 packetcount;
	u32 min_rtt;    /* ms */
	u32 max_rtt;    /* ms */
	u32 last_cong;  /* ms */
	u32 undo_last_cong;
	u32 undo_max_rtt;
	u32 undo_old_max_b;
	u32 min_b;      /* throughput, segments per second */
	u32 max_b;
	u32 old_max_b;
	u32 bi;
	u32 lasttime;   /* ms */
};

static __always_inline u32 now_ms(struct sock *sk)
{
	return (u32)(tcp_sk(sk)->tcp_mstamp / 1000);
}

static __always_inline u32 htcp_cong_time(const struct htcp_ca *ca, u32 now)
{
	return now - ca->last_cong;
}

/* Congestion epochs elapsed, in min RTTs. */
static __always_inline u32 htcp_ccount(const struct htcp_ca *ca, u32 now)
{
	return ca->min_rtt ? htcp_cong_time(ca, now) / ca->min_rtt : 0;
}

static __always_inline void htcp_reset(struct htcp_ca *ca, u32 now)
{
	ca->undo_last_cong = ca->last_cong;
	ca->undo_max_rtt = ca->max_rtt;
	ca->undo_old_max_b = ca->old_max_b;
	ca->last_cong = now;
}

static __always_inline void htcp_beta_update(struct htcp_ca *ca, u32 min_rtt, u32 max_rtt)
{
	u32 max_b = ca->max_b;
	u32 old_max_b = ca->old_max_b;

	ca->old_max_b = ca->max_b;
	/* Throughput changed by more than 20 %: back off by half. */
	if (!(4 * old_max_b <= 5 * max_b && 5 * max_b <= 6 * old_max_b)) {
		ca->beta = BETA_MIN;
		ca->modeswitch = 0;
		return;
	}
	if (ca->modeswitch && min_rtt > 10 && max_rtt) {
		u32 beta = (min_rtt << 7) / max_rtt;

		ca->beta = beta < BETA_MIN ? BETA_MIN : beta > BETA_MAX ? BETA_MAX : beta;
	} else {
		ca->beta = BETA_MIN;
		ca->modeswitch = 1;
	}
}

static __always_inline void htcp_alpha_update(struct htcp_ca *ca, u32 now)
{
	u32 min_rtt = ca->min_rtt;
	u32 factor = 1;
	u32 diff = htcp_cong_time(ca, now);

	if (diff > HZ) {
		diff -= HZ;
		factor = 1 + (10 * diff + ((diff / 2) * (diff / 2) / HZ)) / HZ;
	}
	if (min_rtt) {
		/* RTT scaling by min RTT / 100 ms, the ratio clamped to [0.1, 2]. */
		u32 scale = (HZ << 3) / (10 * min_rtt);

		scale = min_u32(max_u32(scale, 1U << 2), 10U << 3);
		factor = (factor << 3) / scale;
		if (!factor)
			factor = 1;
	}
	ca->alpha = 2 * factor * ((1 << 7) - ca->beta);
	if (!ca->alpha)
		ca->alpha = ALPHA_BASE;
}

/*
 * min and max RTT from each ACK's RTT sample, in ms rounded up (Linux: usecs_to_jiffies of
 * sample->rtt_us at HZ = 1000). Not the smoothed RTT: srtt averages the samples (gain 1/8),
 * so its lowest value is above the lowest sample and its highest below the highest one, which
 * moves beta = min/max RTT.
 */
static __always_inline void htcp_measure_rtt(struct htcp_ca *ca, s32 rtt_us)
{
	u32 rtt = ((u32)rtt_us + 999) / 1000;

	if (!rtt)
		return;
	if (ca->min_rtt > rtt || !ca->min_rtt)
		ca->min_rtt = rtt;
	/* max RTT only in the Open state, ignoring jumps of more than 20 ms as outliers. */
	if (ca->ca_state == TCP_CA_Open) {
		if (ca->max_rtt < ca->min_rtt)
			ca->max_rtt = ca->min_rtt;
		if (ca->max_rtt < rtt && rtt <= ca->max_rtt + 20)
			ca->max_rtt = rtt;
	}
}

SEC("struct_ops")
void BPF_PROG(htcp_pkts_acked, struct sock *sk, const struct ack_sample *sample)
{
	struct htcp_ca *ca = inet_csk_ca(sk);
	struct tcp_sock *tp = tcp_sk(sk);
	u32 now = now_ms(sk);
	u32 acked = sample->pkts_acked;

	if (ca->ca_state == TCP_CA_Open)
		ca->pkts_acked = acked;
	if (sample->rtt_us > 0)
		htcp_measure_rtt(ca, sample->rtt_us);
	/* Achieved throughput, over about one window, outside loss recovery. */
	if (ca->ca_state != TCP_CA_Open && ca->ca_state != TCP_CA_Disorder) {
		ca->packetcount = 0;
		ca->lasttime = now;
		return;
	}
	ca->packetcount += acked;
	if (ca->packetcount >= tp->snd_cwnd - ((ca->alpha >> 7) ?: 1) &&
	    now - ca->lasttime >= ca->min_rtt && ca->min_rtt > 0) {
		u32 cur_bi = ca->packetcount * HZ / (now - ca->lasttime);

		if (htcp_ccount(ca, now) <= 3) {
			/* just after a backoff */
			ca->min_b = ca->max_b = ca->bi = cur_bi;
		} else {
			ca->bi = (3 * ca->bi + cur_bi) / 4;
			if (ca->bi > ca->max_b)
				ca->max_b = ca->bi;
			if (ca->min_b > ca->max_b)
				ca->min_b = ca->max_b;
		}
		ca->packetcount = 0;
		ca->lasttime = now;
	}
}

static __always_inline u32 hsx_decide_ssthresh(struct sock *sk, u32 cwnd)
{
	struct htcp_ca *ca = inet_csk_ca(sk);
	u32 min_rtt = ca->min_rtt;
	u32 max_rtt = ca->max_rtt;

	htcp_beta_update(ca, min_rtt, max_rtt);
	htcp_alpha_update(ca, now_ms(sk));
	/* A slowly fading memory of max RTT, for route changes. */
	if (min_rtt > 0 && max_rtt > min_rtt)
		ca->max_rtt = min_rtt + ((max_rtt - min_rtt) * 95) / 100;
	return max_u32((cwnd * ca->beta) >> 7, 2);
}

SEC("struct_ops")
u32 BPF_PROG(htcp_ssthresh, struct sock *sk)
{
	struct htcp_ca *ca = inet_csk_ca(sk);

	hsx_guard(sk, &ca->guard);
	return hsx_ssthresh_ret(&ca->guard, hsx_decide_ssthresh(sk, tcp_sk(sk)->snd_cwnd));
}

/* Growth, called from cong_control (HSX_CONG_CONTROL) on in-order delivery. */
static __always_inline void htcp_cong_avoid(struct sock *sk, u32 ack, u32 acked)
{
	struct htcp_ca *ca = inet_csk_ca(sk);
	struct tcp_sock *tp = tcp_sk(sk);

	if (!tcp_is_cwnd_limited(sk))
		return;
	if (tcp_in_slow_start(tp)) {
		tcp_slow_start(tp, acked);
		return;
	}
	/* cwnd += alpha / cwnd per ACKed segment */
	if ((tp->snd_cwnd_cnt * ca->alpha) >> 7 >= tp->snd_cwnd) {
		if (tp->snd_cwnd < tp->snd_cwnd_clamp)
			tp->snd_cwnd = tp->snd_cwnd + 1;
		tp->snd_cwnd_cnt = 0;
		htcp_alpha_update(ca, now_ms(sk));
	} else {
		tp->snd_cwnd_cnt += ca->pkts_acked;
	}
	ca->pkts_acked = 1;
}

SEC("struct_ops")
void BPF_PROG(htcp_set_state, struct sock *sk, u8 new_state)
{
	struct htcp_ca *ca = inet_csk_ca(sk);
	u32 now = now_ms(sk);

	hsx_set_state(sk, &ca->guard, new_state);
	switch (new_state) {
	case TCP_CA_Open:
		if (ca->undo_last_cong) {
			ca->last_cong = now;
			ca->undo_last_cong = 0;
		}
		break;
	case TCP_CA_CWR:
	case TCP_CA_Recovery:
	case TCP_CA_Loss:
		htcp_reset(ca, now);
		break;
	}
	ca->ca_state = new_state;
}

SEC("struct_ops")
u32 BPF_PROG(htcp_undo_cwnd, struct sock *sk)
{
	struct htcp_ca *ca = inet_csk_ca(sk);

	if (ca->undo_last_cong) {
		ca->last_cong = ca->undo_last_cong;
		ca->max_rtt = ca->undo_max_rtt;
		ca->old_max_b = ca->undo_old_max_b;
		ca->undo_last_cong = 0;
	}
	return hsx_undo_ret(&ca->guard, tcp_reno_undo_cwnd(sk));
}

SEC("struct_ops")
void BPF_PROG(htcp_init, struct sock *sk)
{
	struct htcp_ca *ca = inet_csk_ca(sk);

	ca->alpha = ALPHA_BASE;
	ca->beta = BETA_MIN;
	ca->pkts_acked = 1;
	ca->last_cong = now_ms(sk);
	hsx_guard_init(sk, &ca->guard);
}

SEC("struct_ops")
void BPF_PROG(htcp_release, struct sock *sk)
{
	hsx_count_release();
}

SEC("struct_ops")
void BPF_PROG(htcp_in_ack_event, struct sock *sk, u32 flags)
{
	struct htcp_ca *ca = inet_csk_ca(sk);

	hsx_guard(sk, &ca->guard);
}

HSX_GUARD_EVENT_HOOK(htcp, struct htcp_ca)

HSX_CONG_CONTROL(htcp, struct htcp_ca)

SEC(".struct_ops.link")
struct tcp_congestion_ops htcp = {
	.init = (void *)htcp_init,
	.release = (void *)htcp_release,
	.ssthresh = (void *)htcp_ssthresh,
	.cong_control = (void *)htcp_cong_control,
	.set_state = (void *)htcp_set_state,
	.pkts_acked = (void *)htcp_pkts_acked,
	.in_ack_event = (void *)htcp_in_ack_event,
	.cwnd_event = (void *)htcp_cwnd_event,
	.undo_cwnd = (void *)htcp_undo_cwnd,
	.flags = TCP_CONG_NON_RESTRICTED,
	.name = "htcp",
};
