//! How much unsent data a sending socket holds (`TCP_NOTSENT_LOWAT`), from the rate its
//! channel delivers.
//!
//! Data queued in a socket is committed to that channel: it leaves at the channel's rate,
//! however fast the others are, and a timed bench waits for it at its end. A fixed 4 MiB
//! suits channels of 1 Gbit/s and more, but through random loss (32 cubic channels at
//! 0.1 %, about 8 Mbit/s each) the channels held 31 MB between them at a 5 s bench's
//! deadline, and the bench ran 10.2 s. Holding [`QUEUE_SECONDS`] of each channel's delivery
//! rate keeps every channel busy between two writes and leaves the rest to whichever channel
//! is ready.

use crate::transport::tcp::NOTSENT_LOWAT;

/// Seconds of its delivery rate a channel's socket holds unsent: long enough to ride out a
/// writer that a busy 2-core host wakes late (tokio tasks there were seen up to 400 ms late).
/// 50 ms was tried first: the lab tests' 50 Mbit/s channels then fell just short of their
/// bounds in two fresh-clone CI runs.
pub const QUEUE_SECONDS: f64 = 0.5;
/// The least unsent data a socket holds: 1 ms at 1 Gbit/s, 140 ms at 7.5 Mbit/s, and the
/// whole queue below 2 Mbit/s.
pub const MIN_NOTSENT: u32 = 128 << 10;

/// The unsent bytes a socket delivering `delivery_rate` bytes/s should hold, between
/// [`MIN_NOTSENT`] and [`NOTSENT_LOWAT`].
///
/// # Examples
///
/// ```
/// use hsxfer::tuning::notsent::{notsent_lowat, MIN_NOTSENT};
/// // 100 kB/s: the floor; 1 MB/s (8 Mbit/s): 500 kB.
/// assert_eq!(notsent_lowat(100_000), MIN_NOTSENT);
/// assert_eq!(notsent_lowat(1_000_000), 500_000);
/// ```
pub fn notsent_lowat(delivery_rate: u64) -> u32 {
    let want = (delivery_rate as f64 * QUEUE_SECONDS) as u64;
    want.clamp(MIN_NOTSENT as u64, NOTSENT_LOWAT as u64) as u32
}

/// Whether a socket holding `current` should be set to `target`: only for a change of at
/// least half or double, so that a noisy rate does not cost a system call every sample.
pub fn worth_changing(current: u32, target: u32) -> bool {
    target >= current.saturating_mul(2) || target.saturating_mul(2) <= current
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_follows_the_rate_within_bounds_and_moves_only_by_factors_of_two() {
        assert_eq!(notsent_lowat(0), MIN_NOTSENT);
        assert_eq!(notsent_lowat(10_000_000_000), NOTSENT_LOWAT);
        assert!(worth_changing(NOTSENT_LOWAT, MIN_NOTSENT));
        assert!(!worth_changing(1 << 20, (1 << 20) + (400 << 10)));
        assert!(!worth_changing(1 << 20, 600 << 10));
        assert!(worth_changing(1 << 20, 512 << 10));
        assert!(worth_changing(1 << 20, 2 << 20));
    }
}
