//! What the protocol accepts from a peer: every count, size and duration a peer sends is
//! checked against these bounds before anything is allocated, opened or scheduled from it.

use std::time::Duration;

/// Largest channel count accepted (a sanity bound, like iperf3's 128).
pub const MAX_CHANNELS: u16 = 128;

/// Most rows of telemetry a transfer reports: one per channel, and one per MPTCP subflow
/// that ever joined a channel (each keeps its row once closed). A client keeps what a
/// server reports per row, so it takes no more.
pub const MAX_TELEMETRY_ROWS: u16 = 1024;

/// Most trace samples one telemetry batch carries; a sender with more sends several batches.
/// At the most a sample can take in JSON they fill half a control frame, and the rest of a
/// batch (a row's setup and latest sample for each of [`MAX_TELEMETRY_ROWS`], the losses, the
/// tuner's decisions) fits the other half (`channels::telemetry`'s tests check it).
pub const TRACE_SAMPLES_PER_BATCH: usize = 16 << 10;

/// Most loss events one telemetry batch carries, likewise.
pub const LOSSES_PER_BATCH: usize = 16 << 10;

/// Most decisions of the online tuner a report keeps: the latest ones. A tuner decides
/// rarely (its hysteresis), but a transfer may run for days.
pub const MAX_TUNER_DECISIONS: usize = 512;

/// Smallest block size accepted.
pub const MIN_BLOCK: u32 = 4 << 10;

/// Largest block size accepted (the frame limit).
pub const MAX_BLOCK: u32 = super::frame::MAX_PAYLOAD;

/// Most blocks one file may have at the session's block size. A sender keeps a digest and a
/// queued job per block of a file it sends, and a receiver the seal's digests: a sparse
/// 16 TiB file pulled in 4 KiB blocks (2^32 of them) aborted the sending server on
/// allocation. At the default 4 MiB blocks this is a 16 TiB file (about 300 MB of the
/// sender's bookkeeping at most); 64 MiB blocks take 256 TiB.
pub const MAX_FILE_BLOCKS: u64 = 1 << 22;

// `SourceError::TooManyBlocks` says "4,194,304 blocks" and "256 TiB at most".
const _: () =
    assert!(MAX_FILE_BLOCKS == 4_194_304 && MAX_BLOCK as u64 * MAX_FILE_BLOCKS == 1 << 48);

/// The smallest power-of-two block size (at least [`MIN_BLOCK`]) that cuts a file of `size`
/// bytes into at most [`MAX_FILE_BLOCKS`] blocks; `None` when even [`MAX_BLOCK`] does not.
pub fn least_block_size(size: u64) -> Option<u32> {
    let least = size
        .div_ceil(MAX_FILE_BLOCKS)
        .max(MIN_BLOCK.into())
        .checked_next_power_of_two()?;
    u32::try_from(least).ok().filter(|&b| b <= MAX_BLOCK)
}

/// Most announced files a sender keeps neither committed nor skipped. A receiver refuses a
/// manifest that goes past it. A file planned for receiving is open at the receiver (a
/// part file and its journal), which takes a slot of its budget of open files
/// ([`crate::session::budget::FileBudget`]) before it plans a chunk. 1,024 files ahead keep
/// a pipeline of small files full: at 256, a 100,000 × 4 KiB pull on loopback took 10 %
/// longer.
pub const MAX_UNFINISHED_FILES: u64 = 1024;

/// Most files one manifest chunk announces: a receiver takes a chunk's slots in its budget
/// at once, so a chunk must fit the smallest budget. A receiver refuses a larger chunk.
pub const MAX_CHUNK_FILES: u64 = 256;

/// Most files a pull lets its sender send before their plans (`Operation::Pull`'s
/// `unplanned_files`). Their blocks may overtake the manifest that announces them, and a
/// data channel holding one waits until the receiver has planned the file; the receiver
/// plans them as soon as their manifest arrives, with slots of its budget, so they stay
/// well within a chunk ([`MAX_CHUNK_FILES`]). A few dozen cover a pull's start: its later
/// files are planned long before the channels reach them.
pub const MAX_UNPLANNED_FILES: u32 = 64;

/// Times a sender sends one block again. A receiver asks again only for a block that
/// arrived damaged, so more requests mean a path or peer that damages every copy, or a peer
/// filling the sender's queue of jobs with requests (each costs it a few bytes, the sender
/// a queued job and a whole block).
pub const MAX_RESENDS: u8 = 8;

/// Most block digests in one `Sealed` message: a seal of a larger file goes in pieces, so a
/// file of any size fits the control frame limit (200,000 digests are 13.4 MB of JSON).
pub const SEAL_PIECE: usize = 200_000;

/// Latest start offset a channel may be given (a stagger of a few RTTs is seconds at most).
pub const MAX_STAGGER: Duration = Duration::from_secs(60);

/// Largest path RTT a plan may assume: beyond any terrestrial or satellite path.
pub const MAX_RTT: Duration = Duration::from_secs(10);

/// Largest socket buffer a request may name: the kernel takes an `int`.
pub const MAX_BUFFER: u64 = i32::MAX as u64;

/// Bounds of the telemetry interval a client may ask a sending server for, milliseconds.
pub const INTERVAL_MS: std::ops::RangeInclusive<u32> = 10..=60_000;

/// Longest bench a client may ask for: one day.
pub const MAX_BENCH_SECONDS: f64 = 86_400.0;

/// Most sources one pull may name.
pub const MAX_PULL_SOURCES: usize = 4096;

/// Longest path a peer may send, bytes (Linux's `PATH_MAX`).
pub const MAX_PATH: usize = 4096;

/// Longest congestion control name (the kernel's `TCP_CA_NAME_MAX` less the final NUL).
pub const MAX_CC_NAME: usize = 15;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_block_size_is_a_power_of_two_within_the_frame_limit() {
        assert_eq!(least_block_size(0), Some(MIN_BLOCK));
        assert_eq!(least_block_size(MAX_FILE_BLOCKS * 4096), Some(4096));
        assert_eq!(least_block_size(MAX_FILE_BLOCKS * 4096 + 1), Some(8192));
        assert_eq!(least_block_size(20 << 40), Some(8 << 20));
        assert_eq!(least_block_size(256 << 40), Some(MAX_BLOCK));
        assert_eq!(least_block_size((256 << 40) + 1), None);
        assert_eq!(least_block_size(u64::MAX), None);
    }
}
