//! Live counters during a transfer and the final report.

use crate::transport::Transport;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::telemetry::{Telemetry, SAMPLE_PERIOD};
use crate::channels::telemetry::{DmcCounters, GuardCounters, Sample, TunerReport};
use crate::metrics::{jain, loss_sync, SyncReport};

/// Counters updated by the data channels while a transfer runs; a caller may poll them
/// (e.g. for a progress display) from another task. Channels the online tuner adds during
/// the transfer get counters as they open.
///
/// # Examples
///
/// A progress line from another task while a transfer runs:
///
/// ```
/// use std::sync::Arc;
/// use hsxfer::LiveStats;
///
/// let live = Arc::new(LiveStats::default());
/// let watcher = live.clone();
/// // ... hand `live` to Client::push, and poll `watcher` elsewhere:
/// live.expect_more(4096);
/// live.add(0, 1024);
/// println!(
///     "{} of {} bytes, {} files done, {:.1} s",
///     watcher.total(),
///     watcher.expected(),
///     watcher.files_done(),
///     watcher.elapsed()
/// );
/// assert_eq!(watcher.channel_bytes(), vec![1024]);
/// ```
#[derive(Debug)]
pub struct LiveStats {
    channels: RwLock<Vec<AtomicU64>>,
    expected: AtomicU64,
    files_done: AtomicU64,
    started: Instant,
    notes: Mutex<Vec<String>>,
    /// `TCP_INFO` samples, settings in force and loss events of the sending channels.
    pub telemetry: Telemetry,
}

impl Default for LiveStats {
    /// Counters that grow as channels open.
    fn default() -> Self {
        LiveStats::new(0)
    }
}

impl LiveStats {
    /// Counters for `channels` data channels.
    pub fn new(channels: usize) -> Self {
        LiveStats {
            channels: RwLock::new((0..channels).map(|_| AtomicU64::new(0)).collect()),
            expected: AtomicU64::new(0),
            files_done: AtomicU64::new(0),
            started: Instant::now(),
            notes: Mutex::new(Vec::new()),
            telemetry: Telemetry::new(channels),
        }
    }

    /// The set-up's notes so far (limits met, a server key recorded, files passed over): the
    /// report's `tuning.notes` when the transfer ends, and what a caller can still show when
    /// it fails.
    ///
    /// # Examples
    ///
    /// ```
    /// use hsxfer::LiveStats;
    ///
    /// let live = LiveStats::default();
    /// live.set_notes(&["client: send buffer capped".to_string()]);
    /// live.add_notes(&["server: receive buffer capped".to_string()]);
    /// assert_eq!(live.notes().len(), 2);
    /// ```
    pub fn notes(&self) -> Vec<String> {
        self.notes.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the notes with `notes`, the set-up's as they stand.
    pub fn set_notes(&self, notes: &[String]) {
        *self.notes.lock().unwrap_or_else(|e| e.into_inner()) = notes.to_vec();
    }

    /// Adds `notes` to those held.
    pub fn add_notes(&self, notes: &[String]) {
        let mut held = self.notes.lock().unwrap_or_else(|e| e.into_inner());
        held.extend_from_slice(notes);
    }

    /// Makes room for channels `0..n` (channels opened during the transfer).
    pub fn ensure_channels(&self, n: usize) {
        let mut c = self.channels.write().expect("live counters lock");
        while c.len() < n {
            c.push(AtomicU64::new(0));
        }
        drop(c);
        self.telemetry.ensure_channels(n);
    }

    /// Adds payload bytes carried by channel `i`.
    pub fn add(&self, i: usize, bytes: u64) {
        if let Some(c) = self.channels.read().expect("live counters lock").get(i) {
            c.fetch_add(bytes, Ordering::Relaxed);
            return;
        }
        self.ensure_channels(i + 1);
        self.add(i, bytes);
    }

    /// Sets each channel's count to what the receiver read on it (`received`, in channel
    /// order; a channel it does not name read nothing): a timed bench that ended at its time
    /// dropped what its sockets still held. A sender counts a block once all of it is
    /// written, so the receiver may have read up to one more `block` than that, never more.
    pub fn settle(&self, received: &[u64], block: u64) {
        for (i, c) in self
            .channels
            .read()
            .expect("live counters lock")
            .iter()
            .enumerate()
        {
            let got = received.get(i).copied().unwrap_or(0);
            let most = c.load(Ordering::Relaxed) + block;
            c.store(got.min(most), Ordering::Relaxed);
        }
    }

    /// Channels counted so far (those opened during the transfer included).
    pub fn channel_count(&self) -> usize {
        self.channels.read().expect("live counters lock").len()
    }

    /// Payload bytes per channel so far.
    pub fn channel_bytes(&self) -> Vec<u64> {
        self.channels
            .read()
            .expect("live counters lock")
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

    /// Takes back expected bytes the receiver turned out to have already (a skipped file,
    /// the blocks of a resumed one).
    pub(crate) fn expect_less(&self, bytes: u64) {
        let _ = self
            .expected
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |e| {
                Some(e.saturating_sub(bytes))
            });
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
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChannelReport {
    /// Channel index.
    pub index: usize,
    /// Payload bytes carried.
    pub bytes: u64,
    /// Payload bits per second over the transfer's duration.
    pub goodput_bps: f64,
    /// Congestion control in force on the sending socket (read back from the kernel).
    pub cc: Option<String>,
    /// Sending socket's `SO_SNDBUF` request, bytes (`None`: kernel autotuning).
    pub send_buffer_requested: Option<u64>,
    /// Sending socket's `SO_SNDBUF` read back, bytes (the kernel doubles a request and
    /// clamps it; under autotuning, its value when the channel opened).
    pub send_buffer: Option<u64>,
    /// Pacing cap on the sending socket, bits/s.
    pub pace_bps: Option<u64>,
    /// Planned start offset, seconds.
    pub stagger_s: Option<f64>,
    /// When the channel sent its first block, seconds after the data phase began.
    pub started_s: Option<f64>,
    /// Segments retransmitted (last `TCP_INFO` sample).
    pub retransmits: Option<u32>,
    /// Entries into loss recovery seen by the sampler.
    pub loss_events: usize,
    /// Congestion window at the last sample, segments.
    pub cwnd: Option<u32>,
    /// Smoothed RTT at the last sample, microseconds.
    pub rtt_us: Option<u32>,
    /// With MPTCP, the row is a subflow: this end's address and port (`None` for TCP).
    pub local: Option<SocketAddr>,
    /// With MPTCP, the peer's address and port of the subflow.
    pub remote: Option<SocketAddr>,
}

/// The path and transport settings a transfer ran with.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TuningReport {
    /// RTT the plan used, microseconds (measured, or given with `--rtt`).
    pub rtt_us: u64,
    /// Bottleneck rate the plan used, bits/s, if known.
    pub rate_bps: Option<u64>,
    /// Where the rate came from: `given`, `interface` (an upper bound) or `unknown`.
    pub rate_source: String,
    /// The buffer setting both ends applied.
    pub buffer: String,
    /// Limits that kept a setting below what the path needs, with the fix (both ends).
    pub notes: Vec<String>,
    /// Where settings came from when the user did not give them (e.g. a saved profile).
    pub origin: Vec<String>,
    /// What the sending side's online tuner learned and did; `None` when it did not run.
    pub online: Option<TunerReport>,
}

/// The result of a transfer, as printed in the `summary` JSON event.
///
/// # Examples
///
/// It is serde data: a pipeline can store it as the command prints it, and read it back.
///
/// ```
/// use hsxfer::TransferReport;
///
/// let r = TransferReport { bytes: 1 << 30, seconds: 2.0, verified: true, ..Default::default() };
/// let json = serde_json::to_string(&r).unwrap();
/// let back: TransferReport = serde_json::from_str(&json).unwrap();
/// assert_eq!(back.bytes, 1 << 30);
/// assert!(back.verified);
/// ```
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
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
    /// What the data channels ran as: `tcp`, or `mptcp` when every one of them was a
    /// Multipath TCP connection.
    pub transport: Transport,
    /// With MPTCP, the subflows of the data connection once they had joined: one per
    /// channel asked for, when both ends' path managers allowed them.
    pub subflows: Option<u16>,
    /// True when the session's connections ran TLS 1.3; false in clear text
    /// (`--no-encrypt`).
    #[serde(default)]
    pub encrypted: bool,
    /// The TLS cipher suite, such as `TLS13_AES_128_GCM_SHA256`; none in clear text.
    #[serde(default)]
    pub cipher_suite: Option<String>,
    /// Path and transport settings.
    pub tuning: TuningReport,
    /// Segments retransmitted over all channels.
    pub retransmits: u64,
    /// Jain's fairness index over the channels' goodputs.
    pub fairness_jain: Option<f64>,
    /// Loss synchronization of the channels (Cui 2013, Expr. 4.1 and 4.2), if any losses.
    pub loss_sync: Option<SyncReport>,
    /// Per-channel bytes, goodput and transport state.
    pub channels: Vec<ChannelReport>,
    /// What the DMCTCP group did (cuts, losses kept, channels), when the channels ran
    /// dmctcp as one group.
    pub dmctcp: Option<DmcCounters>,
    /// Repairs by the bundled congestion controls' window guard on the sending host while
    /// the transfer ran; None when no channel ran one whose counters could be read.
    pub guard: Option<GuardCounters>,
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
        tuning: TuningReport,
    ) -> Self {
        let seconds = took.as_secs_f64().max(1e-9);
        let per = live.channel_bytes();
        let bytes: u64 = per.iter().sum();
        let setups = live.telemetry.setups();
        let latest = live.telemetry.latest();
        let losses = live.telemetry.losses();
        // With MPTCP the engine counts the connection's payload on its one channel, and the
        // rows are the connection's subflows.
        // Rows no subflow took (fewer joined than were asked for) are left out.
        let per = match setups.iter().flatten().any(|s| s.local.is_some()) {
            true => {
                let used = setups
                    .iter()
                    .rposition(Option::is_some)
                    .map_or(1, |i| i + 1);
                share_by_acked(bytes, &latest[..used.min(latest.len())])
            }
            false => per,
        };
        let goodputs: Vec<f64> = per.iter().map(|b| *b as f64 * 8.0 / seconds).collect();
        // Losses of one congestion event are seen up to a sampling period apart, and the
        // event lasts about one RTT (queueing included: the largest smoothed RTT).
        let srtt_max = latest
            .iter()
            .flatten()
            .map(|s| s.tcp.rtt_us)
            .max()
            .unwrap_or(0) as f64
            / 1e6;
        let window = srtt_max
            .max(tuning.rtt_us as f64 / 1e6)
            .max(2.0 * SAMPLE_PERIOD.as_secs_f64());
        let mut tuning = tuning;
        tuning.online = live.telemetry.tuner();
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
            transport: Transport::Tcp,
            subflows: None,
            encrypted: false,
            cipher_suite: None,
            tuning,
            retransmits: latest
                .iter()
                .flatten()
                .map(|s| s.tcp.total_retrans as u64)
                .sum(),
            fairness_jain: jain(&goodputs),
            dmctcp: live.telemetry.dmctcp(),
            guard: live.telemetry.guard(),
            loss_sync: loss_sync(&losses, per.len(), window),
            channels: per
                .into_iter()
                .enumerate()
                .map(|(index, b)| {
                    let setup = setups.get(index).cloned().flatten();
                    let last = latest.get(index).copied().flatten();
                    ChannelReport {
                        index,
                        bytes: b,
                        goodput_bps: goodputs[index],
                        cc: setup.as_ref().map(|s| s.cc.clone()),
                        send_buffer_requested: setup.as_ref().and_then(|s| s.send_buffer_requested),
                        send_buffer: setup.as_ref().map(|s| s.send_buffer),
                        pace_bps: setup.as_ref().and_then(|s| s.pace_bps),
                        stagger_s: setup.as_ref().map(|s| s.stagger_s),
                        started_s: setup.as_ref().and_then(|s| s.started_s),
                        retransmits: last.map(|s| s.tcp.total_retrans),
                        loss_events: losses.iter().filter(|l| l.flow == index).count(),
                        cwnd: last.map(|s| s.tcp.cwnd),
                        rtt_us: last.map(|s| s.tcp.rtt_us),
                        local: setup.as_ref().and_then(|s| s.local),
                        remote: setup.as_ref().and_then(|s| s.remote),
                    }
                })
                .collect(),
        }
    }
}

/// Splits `total` payload bytes over rows in proportion to the bytes each row's TCP
/// acknowledged (the subflows of an MPTCP connection); the rounding goes to the first row.
fn share_by_acked(total: u64, latest: &[Option<Sample>]) -> Vec<u64> {
    let acked: Vec<u128> = latest
        .iter()
        .map(|s| s.map_or(0, |s| s.tcp.bytes_acked as u128))
        .collect();
    let sum: u128 = acked.iter().sum();
    if sum == 0 {
        let mut rows = vec![0; latest.len().max(1)];
        rows[0] = total;
        return rows;
    }
    let mut rows: Vec<u64> = acked
        .iter()
        .map(|a| (total as u128 * a / sum) as u64)
        .collect();
    rows[0] += total - rows.iter().sum::<u64>();
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channels::telemetry::TcpSample;

    fn acked(bytes_acked: u64) -> Option<Sample> {
        Some(Sample {
            t: 1.0,
            channel: 0,
            tcp: TcpSample {
                bytes_acked,
                ..Default::default()
            },
        })
    }

    #[test]
    fn a_connections_payload_is_shared_over_its_subflows_as_they_carried_it() {
        let rows = share_by_acked(1000, &[acked(300), acked(600), None, acked(100)]);
        assert_eq!(rows, vec![300, 600, 0, 100]);
        assert_eq!(
            share_by_acked(10, &[acked(1), acked(1), acked(1)]),
            vec![4, 3, 3]
        );
        assert_eq!(share_by_acked(7, &[None, None]), vec![7, 0]);
    }

    #[test]
    fn a_bench_cut_at_its_time_counts_what_the_receiver_read() {
        // Three channels wrote 8, 8 and 4 MiB of whole 4 MiB blocks; the receiver read 5 MiB,
        // 10 MiB (the block being written when the bench ended: 2 MiB of it), and claims
        // 20 MiB on the third, more than a block past what was written.
        let live = LiveStats::new(3);
        for (i, mib) in [8u64, 8, 4].into_iter().enumerate() {
            live.add(i, mib << 20);
        }
        live.settle(&[5 << 20, 10 << 20, 20 << 20], 4 << 20);
        assert_eq!(live.channel_bytes(), vec![5 << 20, 10 << 20, 8 << 20]);
        live.settle(&[1], 4 << 20);
        assert_eq!(
            live.channel_bytes(),
            vec![1, 0, 0],
            "a channel not named read nothing"
        );
    }
}
