//! Default channel count and block size, and why.

/// Default number of data channels: 4.
///
/// One TCP stream recovers slowly from a loss on a long fat path (the window halves and grows
/// back one segment per RTT); with m streams only the stream that lost backs off, so the
/// aggregate keeps about 1 − β/(2m) of the link (Cui 2013, Expr. 5.3: 87.5 % at 2, 94 % at 4).
/// Beyond 4 the gain is small while the unfairness toward other traffic and the CPU cost per
/// byte grow; it is also the default of GridFTP tools, bbcp and FDT, so results compare.
/// `hsxfer probe` picks a measured value for a given path.
pub const CHANNELS: u16 = 4;

/// Most channels the online tuner grows a transfer to unless told otherwise: enough for a
/// 10 Gbit/s × 250 ms path whose hosts cap each socket at a 4 MiB window (about 26 of them),
/// few enough that a transfer cannot open a flood of connections on its own.
pub const MAX_TUNED_CHANNELS: u16 = 32;

/// Default block size: 4 MiB.
///
/// The block is the unit of scheduling, checking, re-sending and resuming. 4 MiB amortizes
/// per-block costs (a 24-byte header and a 32-byte trailer, a few system calls, a hash
/// finalization) to well under 1 % while a 1 GiB file still splits into 256 blocks, enough
/// for work stealing to balance 16 channels; a damaged block costs 4 MiB to re-send, and
/// memory in flight stays at a few blocks per channel.
pub const BLOCK_SIZE: u32 = 4 << 20;

/// Block size of a timed bench's generated data (and of the probe's trials): 64 KiB.
///
/// A timed bench stops announcing data at its deadline and completes what it announced, at
/// least four files of at least one block per channel. With 4 MiB blocks, a 20 s bench of
/// 32 channels through 0.1 % random loss ran 36.9 s, and the probe's 2 s first trial 18.8 s.
/// 64 KiB blocks bound that tail to 1 MiB per four channels. They cost nothing measurable
/// here: 4 GiB over loopback with 8 channels, 6.6–7.4 Gbit/s and 4.7–5.5 CPU-s with 4 MiB,
/// 7.0–7.7 Gbit/s and 5.0 CPU-s with 64 KiB.
pub const TIMED_BENCH_BLOCK: u32 = 64 << 10;
