// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * dmctcp_classic: DMCTCP with Cui 2013's rules only (chapter 5), for research comparisons with
 * hsxfer's dmctcp. The differences are listed in dmctcp.bpf.c, which this builds again.
 */
#define DMC_CLASSIC
#include "dmctcp.bpf.c"
