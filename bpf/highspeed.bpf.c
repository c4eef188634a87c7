// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * HighSpeed TCP (RFC 3649) as Linux's tcp_highspeed: the Appendix B table gives, per window
 * range, the increase a(w) in segments per RTT and the decrease b(w) = md/256. As in Linux,
 * the row (ai) follows the window only in congestion avoidance, so the loss that ends the
 * first slow start halves the window (row 0), and a loss in a later slow start (after a
 * timeout) cuts by the row congestion avoidance last reached.
 */
#include "hsxfer_cc.h"

char _license[] SEC("license") = "Dual MIT/GPL";

HSX_STATS_MAP(highspeed)

#define HSTCP_ROWS 72

/* Upper cwnd of each row and its md (b(w) * 256); a(w) is the row index + 1. */
static const struct hstcp_row {
	u32 cwnd;
	u32 md;
} hstcp_table[HSTCP_ROWS] = {
	{ 38, 128 }, { 118, 112 }, { 221, 104 }, { 347, 98 }, { 495, 93 }, { 663, 89 },
	{ 851, 86 }, { 1058, 83 }, { 1284, 81 }, { 1529, 78 }, { 1793, 76 }, { 2076, 74 },
	{ 2378, 72 }, { 2699, 71 }, { 3039, 69 }, { 3399, 68 }, { 3778, 66 }, { 4177, 65 },
	{ 4596, 64 }, { 5036, 62 }, { 5497, 61 }, { 5979, 60 }, { 6483, 59 }, { 7009, 58 },
	{ 7558, 57 }, { 8130, 56 }, { 8726, 55 }, { 9346, 54 }, { 9991, 53 }, { 10661, 52 },
	{ 11358, 52 }, { 12082, 51 }, { 12834, 50 }, { 13614, 49 }, { 14424, 48 }, { 15265, 48 },
	{ 16137, 47 }, { 17042, 46 }, { 17981, 45 }, { 18955, 45 }, { 19965, 44 }, { 21013, 43 },
	{ 22101, 43 }, { 23230, 42 }, { 24402, 41 }, { 25618, 41 }, { 26881, 40 }, { 28193, 39 },
	{ 29557, 39 }, { 30975, 38 }, { 32450, 38 }, { 33986, 37 }, { 35586, 36 }, { 37253, 36 },
	{ 38992, 35 }, { 40808, 35 }, { 42707, 34 }, { 44694, 33 }, { 46776, 33 }, { 48961, 32 },
	{ 51258, 32 }, { 53677, 31 }, { 56230, 30 }, { 58932, 30 }, { 61799, 29 }, { 64851, 28 },
	{ 68113, 28 }, { 71617, 27 }, { 75401, 26 }, { 79517, 26 }, { 84035, 25 }, { 89053, 24 },
};

struct hstcp_ca {
	struct hsx_guard guard;
	u32 ai; /* the table row, updated in congestion avoidance only */
};

/* The table row of window `cwnd`: row i holds windows up to its cwnd, the last row all above. */
static __always_inline u32 hstcp_row(u32 cwnd)
{
	for (u32 i = 0; i < HSTCP_ROWS - 1; i++) {
		if (cwnd <= hstcp_table[i].cwnd)
			return i;
	}
	return HSTCP_ROWS - 1;
}

SEC("struct_ops")
void BPF_PROG(highspeed_init, struct sock *sk)
{
	struct hstcp_ca *ca = inet_csk_ca(sk);

	hsx_guard_init(sk, &ca->guard);
}

SEC("struct_ops")
void BPF_PROG(highspeed_release, struct sock *sk)
{
	hsx_count_release();
}

SEC("struct_ops")
void BPF_PROG(highspeed_in_ack_event, struct sock *sk, u32 flags)
{
	struct hstcp_ca *ca = inet_csk_ca(sk);

	hsx_guard(sk, &ca->guard);
}

/* Growth, called from cong_control (HSX_CONG_CONTROL) on in-order delivery. */
static __always_inline void highspeed_cong_avoid(struct sock *sk, u32 ack, u32 acked)
{
	struct hstcp_ca *ca = inet_csk_ca(sk);
	struct tcp_sock *tp = tcp_sk(sk);

	if (!tcp_is_cwnd_limited(sk))
		return;
	if (tcp_in_slow_start(tp)) {
		acked = tcp_slow_start(tp, acked);
		if (!acked)
			return;
	}
	ca->ai = hstcp_row(tp->snd_cwnd);
	/* cwnd += a(w) / cwnd per ACKed segment: a(w) = row + 1 segments per RTT. */
	if (tp->snd_cwnd < tp->snd_cwnd_clamp)
		tcp_cong_avoid_ai(tp, tp->snd_cwnd, acked * (ca->ai + 1));
}

/* cwnd - b(w) * cwnd, b(w) from the table row the window has reached. */
static __always_inline u32 hsx_decide_ssthresh(struct sock *sk, u32 cwnd)
{
	struct hstcp_ca *ca = inet_csk_ca(sk);
	u32 md = hstcp_table[ca->ai < HSTCP_ROWS ? ca->ai : HSTCP_ROWS - 1].md;

	return max_u32(cwnd - ((cwnd * md) >> 8), 2);
}

SEC("struct_ops")
u32 BPF_PROG(highspeed_ssthresh, struct sock *sk)
{
	struct hstcp_ca *ca = inet_csk_ca(sk);

	hsx_guard(sk, &ca->guard);
	return hsx_ssthresh_ret(&ca->guard, hsx_decide_ssthresh(sk, tcp_sk(sk)->snd_cwnd));
}

SEC("struct_ops")
u32 BPF_PROG(highspeed_undo_cwnd, struct sock *sk)
{
	struct hstcp_ca *ca = inet_csk_ca(sk);

	return hsx_undo_ret(&ca->guard, tcp_reno_undo_cwnd(sk));
}

HSX_GUARD_EVENT_HOOK(highspeed, struct hstcp_ca)
HSX_GUARD_STATE_HOOK(highspeed, struct hstcp_ca)

HSX_CONG_CONTROL(highspeed, struct hstcp_ca)

SEC(".struct_ops.link")
struct tcp_congestion_ops highspeed = {
	.init = (void *)highspeed_init,
	.release = (void *)highspeed_release,
	.ssthresh = (void *)highspeed_ssthresh,
	.cong_control = (void *)highspeed_cong_control,
	.in_ack_event = (void *)highspeed_in_ack_event,
	.cwnd_event = (void *)highspeed_cwnd_event,
	.set_state = (void *)highspeed_set_state,
	.undo_cwnd = (void *)highspeed_undo_cwnd,
	.flags = TCP_CONG_NON_RESTRICTED,
	.name = "highspeed",
};
