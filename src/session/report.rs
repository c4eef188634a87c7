//! Live counters during a transfer and the final report.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde::Serialize;

/// Counters updated by the data channels while a transfer runs; a caller may poll them
/// (e.g. for a progress display) from another task.
#[derive(Debug)]
pub struct LiveStats {
    channels: Vec<AtomicU64>,
    expected: AtomicU64,
    files_done: AtomicU64,
    started: Instant,
}

impl LiveStats {
    /// Counters for `channels` data channels.
    pub fn new(channels: usize) -> Self {
        LiveStats {
            channels: (0..channels).map(|_| AtomicU64::new(0)).collect(),
            expected: AtomicU64::new(0),
            files_done: AtomicU64::new(0),
            started: Instant::now(),
        }
    }

    /// Adds payload bytes carried by channel `i`.
    pub fn add(&self, i: usize, bytes: u64) {
        self.channels[i].fetch_add(bytes, Ordering::Relaxed);
    }

    /// Payload bytes per channel so far.
    pub fn channel_bytes(&self) -> Vec<u64> {
        self.channels
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }

    /// Payload bytes over all channels so far.
    pub fn total(&self) -> u64 {
        self.channel_bytes().iter().sum()
    }

    /// Adds to the number of bytes this run expects to carry (grows as the manifest arrives).
    pub fn expect_more(&self, bytes: u64) {
        self.expected.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Bytes this run expects to carry, as far as known.
    pub fn expected(&self) -> u64 {
        self.expected.load(Ordering::Relaxed)
    }

    /// Counts a committed (or skipped) file.
    pub fn file_done(&self) {
        self.files_done.fetch_add(1, Ordering::Relaxed);
    }

    /// Files committed or skipped so far.
    pub fn files_done(&self) -> u64 {
        self.files_done.load(Ordering::Relaxed)
    }

    /// Seconds since the counters were created.
    pub fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
}

/// What one side of a session observed, returned by its engine.
#[derive(Debug, Clone, Default)]
pub struct SideOutcome {
    /// Files in the manifest.
    pub files: u64,
    /// Files the receiver already had (same size and mtime).
    pub files_skipped: u64,
    /// Bytes of skipped files.
    pub bytes_skipped: u64,
    /// Bytes of partial files resumed from a restart journal.
    pub bytes_resumed: u64,
    /// Blocks sent or requested again (damaged on the wire or failing the seal).
    pub blocks_resent: u64,
    /// True when every file was verified end to end (or skipped as identical).
    pub verified: bool,
}

/// Per-channel part of a [`TransferReport`].
#[derive(Debug, Clone, Serialize)]
pub struct ChannelReport {
    /// Channel index.
    pub index: usize,
    /// Payload bytes carried.
    pub bytes: u64,
    /// Payload bits per second over the transfer's duration.
    pub goodput_bps: f64,
}

/// The result of a transfer, as printed in the `summary` JSON event.
#[derive(Debug, Clone, Serialize)]
pub struct TransferReport {
    /// `push`, `pull`, `bench-upload` or `bench-download`.
    pub operation: String,
    /// Payload bytes carried over the data channels in this run.
    pub bytes: u64,
    /// Seconds from the first data channel opening to the last file verified.
    pub seconds: f64,
    /// `bytes` × 8 / `seconds`.
    pub goodput_bps: f64,
    /// True when every file was verified end to end (skipped files: identical size and mtime).
    pub verified: bool,
    /// Files in the transfer.
    pub files: u64,
    /// Files skipped because the destination already had them.
    pub files_skipped: u64,
    /// Bytes of skipped files.
    pub bytes_skipped: u64,
    /// Bytes not re-sent thanks to the restart journal.
    pub bytes_resumed: u64,
    /// Blocks re-sent after a failed check.
    pub blocks_resent: u64,
    /// Block size in bytes.
    pub block_size: u32,
    /// Per-channel bytes and goodput.
    pub channels: Vec<ChannelReport>,
}

impl TransferReport {
    /// Builds the report from live counters, the engine's outcome and the data phase's
    /// duration.
    pub fn new(
        operation: &str,
        live: &LiveStats,
        out: SideOutcome,
        block_size: u32,
        took: std::time::Duration,
    ) -> Self {
        let seconds = took.as_secs_f64().max(1e-9);
        let per = live.channel_bytes();
        let bytes: u64 = per.iter().sum();
        TransferReport {
            operation: operation.to_string(),
            bytes,
            seconds,
            goodput_bps: bytes as f64 * 8.0 / seconds,
            verified: out.verified,
            files: out.files,
            files_skipped: out.files_skipped,
            bytes_skipped: out.bytes_skipped,
            bytes_resumed: out.bytes_resumed,
            blocks_resent: out.blocks_resent,
            block_size,
            channels: per
                .into_iter()
                .enumerate()
                .map(|(index, b)| ChannelReport {
                    index,
                    bytes: b,
                    goodput_bps: b as f64 * 8.0 / seconds,
                })
                .collect(),
        }
    }
}
