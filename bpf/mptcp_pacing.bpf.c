/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * Pacing caps for MPTCP subflows (docs/lab.md, "MPTCP on one path").
 *
 * The kernel refuses SO_MAX_PACING_RATE on an MPTCP socket, and a subflow has no file
 * descriptor of its own, so user space cannot cap a subflow. This sock_ops program can: user
 * space stores the connection's total cap (bytes/s) in `conn_pace`, socket-local storage of
 * the MPTCP socket (the map's key is its fd), and the program sets SO_MAX_PACING_RATE on each
 * subflow to that total divided by the connection's current number of subflows.
 *
 * It acts when a subflow is established and then on its RTT samples (once per ACK that
 * carries one): a cap stored after the first subflow came up (a server accepts the
 * connection only then), a changed cap, or a subflow joining later, reaches every subflow
 * within an RTT. Sockets that are not MPTCP subflows return at once; subflows of
 * connections without a stored cap cost one map lookup per ACK.
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

#define SOL_SOCKET 1
#define SO_MAX_PACING_RATE 47

/*
 * Only the members used; CO-RE finds them by name in the running kernel's BTF. The count of
 * subflows beyond the first is `pm.extra_subflows` since Linux 6.18, `pm.subflows` before.
 */
struct mptcp_pm_data {
	__u8 extra_subflows;
} __attribute__((preserve_access_index));

struct mptcp_sock {
	struct mptcp_pm_data pm;
} __attribute__((preserve_access_index));

struct mptcp_pm_data___old {
	__u8 subflows;
} __attribute__((preserve_access_index));

struct mptcp_sock___old {
	struct mptcp_pm_data___old pm;
} __attribute__((preserve_access_index));

static __always_inline __u64 subflows_of(struct mptcp_sock *msk)
{
	if (bpf_core_field_exists(msk->pm.extra_subflows))
		return 1 + (__u64)msk->pm.extra_subflows;
	return 1 + (__u64)((struct mptcp_sock___old *)msk)->pm.subflows;
}

/* The connection's total cap in bytes/s, stored by user space on the MPTCP socket. */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, __u64);
} conn_pace SEC(".maps");

/* The cap last set on a subflow, so it is set again only when it changes. */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, __u64);
} subflow_pace SEC(".maps");

SEC("sockops")
int pace_subflows(struct bpf_sock_ops *ops)
{
	int op = (int)ops->op;
	if (op != BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB && op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB &&
	    op != BPF_SOCK_OPS_RTT_CB)
		return 1;
	struct bpf_sock *sk = ops->sk;
	if (!sk)
		return 1;
	struct mptcp_sock *msk = bpf_skc_to_mptcp_sock(sk);
	if (!msk)
		return 1;
	if (op != BPF_SOCK_OPS_RTT_CB)
		bpf_sock_ops_cb_flags_set(ops, ops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_RTT_CB_FLAG);
	__u64 *total = bpf_sk_storage_get(&conn_pace, msk, 0, 0);
	if (!total)
		return 1;
	__u64 share = *total / subflows_of(msk);
	if (share == 0)
		share = 1;
	__u64 *set = bpf_sk_storage_get(&subflow_pace, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!set || *set == share)
		return 1;
	/* The helper takes an int here (a cap up to 34 Gbit/s per subflow); ~0U means none. */
	__u32 rate = share < 0xfffffffe ? (__u32)share : 0xfffffffe;
	if (bpf_setsockopt(ops, SOL_SOCKET, SO_MAX_PACING_RATE, &rate, sizeof(rate)) == 0)
		*set = share;
	return 1;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
