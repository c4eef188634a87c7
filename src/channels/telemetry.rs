//! What the sending side observes of its data channels, in the form it travels to the client
//! when the server sends (a pull): each channel's settings in force, periodic `TCP_INFO`
//! samples, and loss events for the synchronization metrics.

use serde::{Deserialize, Serialize};

use crate::metrics::LossEvent;
use crate::transport::tcp_info::TcpSample;

/// The settings in force on one sending channel, as read back from the kernel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChannelSetup {
    /// Channel index.
    pub index: u16,
    /// Congestion control the kernel reports for the socket.
    pub cc: String,
    /// `SO_SNDBUF` requested, bytes; `None` when autotuning was left in charge.
    pub send_buffer_requested: Option<u64>,
    /// `SO_SNDBUF` read back, bytes.
    pub send_buffer: u64,
    /// `SO_RCVBUF` read back, bytes.
    pub recv_buffer: u64,
    /// Pacing cap (`SO_MAX_PACING_RATE`), bits/s, if any.
    pub pace_bps: Option<u64>,
    /// Planned start offset, seconds after the data phase began.
    pub stagger_s: f64,
    /// When the channel sent its first block, seconds after the data phase began.
    pub started_s: Option<f64>,
}

/// One `TCP_INFO` reading of one channel.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Seconds since the sending side's data phase began.
    pub t: f64,
    /// Channel index.
    pub channel: u16,
    /// The kernel's view of the connection.
    pub tcp: TcpSample,
}

/// A batch of telemetry, sent by a sending server once per reporting interval.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct TelemetryBatch {
    /// Settings of every channel (known ones).
    pub setups: Vec<ChannelSetup>,
    /// The latest sample of every channel.
    pub latest: Vec<Sample>,
    /// Loss events since the previous batch.
    pub losses: Vec<LossEvent>,
    /// Fine-grained samples since the previous batch (only when a trace was asked for).
    pub trace: Vec<Sample>,
    /// True on the final batch of the session.
    pub last: bool,
    /// The DMCTCP group's counters so far, when the channels run dmctcp as one group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dmctcp: Option<DmcCounters>,
    /// What the window guard of the bundled congestion controls repaired on the sending host
    /// during the transfer so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guard: Option<GuardCounters>,
}

/// Repairs by the window guard of hsxfer's BPF congestion controls (see `hsxfer cc list`):
/// garbage ssthresh values replaced and absurd windows clamped, counted over every socket of
/// the bundled congestion controls the channels ran, on the sending host, while the transfer
/// ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuardCounters {
    /// Garbage ssthresh values replaced.
    pub ssthresh_repairs: u64,
    /// Windows above the guard's bound clamped.
    pub cwnd_repairs: u64,
    /// Of the ssthresh repairs, those the kernel wrote while skipping the congestion
    /// control's ssthresh program.
    #[serde(default)]
    pub skipped_ssthresh: u64,
}

/// What the DMCTCP group of a transfer did (read from the BPF program's group state).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DmcCounters {
    /// Losses that halved the group's largest window.
    pub cuts: u64,
    /// Losses that kept the window (not the largest channel, or within an RTT of a cut).
    pub losses_kept: u64,
    /// The most channels in the group at once.
    pub channels: u32,
    /// Channels still in slow start that took the first cut's ssthresh.
    pub slow_start_adopted: u64,
}
