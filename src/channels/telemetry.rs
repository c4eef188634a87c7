//! What the sending side observes of its data channels, in the form it travels to the client
//! when the server sends (a pull): each channel's settings in force, periodic `TCP_INFO`
//! samples, and loss events for the synchronization metrics.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::metrics::LossEvent;

/// The settings in force on one sending channel, as read back from the kernel.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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
    /// When the channel sent its first block, seconds after the data phase began (an MPTCP
    /// subflow: when the sampler first saw it).
    pub started_s: Option<f64>,
    /// With MPTCP, the row is a subflow of the connection: this end's address and port.
    #[serde(default)]
    pub local: Option<SocketAddr>,
    /// With MPTCP, the peer's address and port of the subflow.
    #[serde(default)]
    pub remote: Option<SocketAddr>,
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
    /// What the sending side's online tuner learned and did so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tuner: Option<TunerReport>,
    /// Trace samples the sending side left out so far: more were waiting to be sent than it
    /// keeps (its peer read too slowly).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub trace_dropped: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
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

/// The fields of `struct tcp_info` hsxfer reports, in plain units. Fields a kernel does not
/// report (older than 4.10 for the limits, 4.19 for the byte counters) read as 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TcpSample {
    /// Congestion window, segments.
    pub cwnd: u32,
    /// Slow-start threshold, segments (the kernel's "infinity" is 2147483647).
    pub ssthresh: u32,
    /// Smoothed RTT, microseconds.
    pub rtt_us: u32,
    /// Lowest RTT seen, microseconds.
    pub min_rtt_us: u32,
    /// Segments currently retransmitted and not yet acknowledged.
    pub retrans: u32,
    /// Segments retransmitted over the connection's life.
    pub total_retrans: u32,
    /// Most recent delivery-rate estimate, bytes/s.
    pub delivery_rate: u64,
    /// Current pacing rate, bytes/s.
    pub pacing_rate: u64,
    /// Congestion-avoidance state: 0 Open, 1 Disorder, 2 CWR, 3 Recovery, 4 Loss.
    pub ca_state: u8,
    /// Bytes acknowledged by the peer (the kernel counts the SYN as one).
    pub bytes_acked: u64,
    /// Sender MSS, bytes.
    pub mss: u32,
    /// Segments delivered to the peer, selectively acknowledged ones included: unlike
    /// `bytes_acked`, it does not jump when a retransmission fills a hole.
    #[serde(default)]
    pub delivered: u32,
    /// Microseconds the connection had data in flight.
    #[serde(default)]
    pub busy_us: u64,
    /// Of those, microseconds it was stopped by the peer's receive window.
    #[serde(default)]
    pub rwnd_limited_us: u64,
    /// Of those, microseconds it was stopped by its own send buffer.
    #[serde(default)]
    pub sndbuf_limited_us: u64,
    /// Bytes written by the application and not yet sent.
    #[serde(default)]
    pub notsent_bytes: u32,
    /// The peer's advertised receive window, bytes.
    #[serde(default)]
    pub snd_wnd: u32,
}

impl TcpSample {
    /// True while the connection is recovering from a loss (Recovery or Loss state).
    pub fn recovering(&self) -> bool {
        self.ca_state == CA_RECOVERY || self.ca_state == CA_LOSS
    }
}

/// `TCP_CA_Recovery`: fast retransmit in progress.
pub const CA_RECOVERY: u8 = 3;
/// `TCP_CA_Loss`: retransmission timeout.
pub const CA_LOSS: u8 = 4;

/// How the meter ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MeterEnd {
    /// A loss after the bottleneck was full: the rate is measured.
    Full,
    /// A host's window held the channel back: the rate is at least what it reached.
    WindowLimited,
    /// The rate stopped growing without a loss (a short path, or a host's CPU).
    Plateau,
    /// It ran out of time.
    Timeout,
}

/// One decision, for the report: when, what and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// Seconds since the data phase began.
    pub t: f64,
    /// What was done and why, in words.
    pub what: String,
}

/// What the tuner learned and did, for the summary and for saving a profile.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TunerReport {
    /// The bottleneck's goodput rate the caps were set from last, bits/s (lowered when the
    /// channels lost at their caps).
    pub rate_bps: Option<u64>,
    /// The rate last measured directly (by the meter, a probe above the caps that the path
    /// delivered, or the most it delivered when losses showed the meter's reading high),
    /// bits/s: what a saved profile keeps.
    #[serde(default)]
    pub measured_bps: Option<u64>,
    /// How the meter ended, if one ran.
    pub meter: Option<MeterEnd>,
    /// Channels at the end.
    pub channels: u16,
    /// True when losses came while the channels sent below the path's rate (random loss).
    pub lossy: bool,
    /// The decisions, in order: the latest [`super::limits::MAX_TUNER_DECISIONS`].
    pub decisions: Vec<Decision>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channels::control::{encode, Message, MAX_CONTROL_FRAME};
    use crate::channels::limits::{
        LOSSES_PER_BATCH, MAX_TELEMETRY_ROWS, MAX_TUNER_DECISIONS, TRACE_SAMPLES_PER_BATCH,
    };
    use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};

    /// A sample whose every number takes the most characters JSON gives it.
    fn widest_sample() -> Sample {
        let (u32_, u64_) = (u32::MAX, u64::MAX);
        Sample {
            t: -f64::MIN_POSITIVE,
            channel: MAX_TELEMETRY_ROWS - 1,
            tcp: TcpSample {
                cwnd: u32_,
                ssthresh: u32_,
                rtt_us: u32_,
                min_rtt_us: u32_,
                retrans: u32_,
                total_retrans: u32_,
                delivery_rate: u64_,
                pacing_rate: u64_,
                ca_state: u8::MAX,
                bytes_acked: u64_,
                mss: u32_,
                delivered: u32_,
                busy_us: u64_,
                rwnd_limited_us: u64_,
                sndbuf_limited_us: u64_,
                notsent_bytes: u32_,
                snd_wnd: u32_,
            },
        }
    }

    fn len(batch: TelemetryBatch) -> usize {
        encode(&Message::Telemetry(batch)).len()
    }

    #[test]
    fn the_widest_batch_a_sender_makes_fits_a_control_frame() {
        let trace = vec![widest_sample(); TRACE_SAMPLES_PER_BATCH];
        let trace_len = len(TelemetryBatch {
            trace,
            ..Default::default()
        });
        assert!(trace_len <= MAX_CONTROL_FRAME as usize / 2, "{trace_len}");
        let v6 = SocketAddr::V6(SocketAddrV6::new(
            Ipv6Addr::from(u128::MAX),
            65535,
            0,
            u32::MAX,
        ));
        let setup = ChannelSetup {
            index: MAX_TELEMETRY_ROWS - 1,
            // A kernel name is at most 15 characters; a quote doubles in JSON.
            cc: "\"".repeat(15),
            send_buffer_requested: Some(u64::MAX),
            send_buffer: u64::MAX,
            recv_buffer: u64::MAX,
            pace_bps: Some(u64::MAX),
            stagger_s: -f64::MIN_POSITIVE,
            started_s: Some(-f64::MIN_POSITIVE),
            local: Some(v6),
            remote: Some(v6),
        };
        let rows = MAX_TELEMETRY_ROWS as usize;
        let decision = Decision {
            t: -f64::MIN_POSITIVE,
            // The tuner's sentences are under 200 characters.
            what: "\"".repeat(200),
        };
        let counters = u64::MAX;
        let rest = len(TelemetryBatch {
            setups: vec![setup; rows],
            latest: vec![widest_sample(); rows],
            losses: vec![
                crate::metrics::LossEvent {
                    flow: rows - 1,
                    at: -f64::MIN_POSITIVE,
                };
                LOSSES_PER_BATCH
            ],
            trace: Vec::new(),
            last: true,
            dmctcp: Some(DmcCounters {
                cuts: counters,
                losses_kept: counters,
                channels: u32::MAX,
                slow_start_adopted: counters,
            }),
            guard: Some(GuardCounters {
                ssthresh_repairs: counters,
                cwnd_repairs: counters,
                skipped_ssthresh: counters,
            }),
            tuner: Some(TunerReport {
                rate_bps: Some(u64::MAX),
                measured_bps: Some(u64::MAX),
                meter: Some(MeterEnd::Timeout),
                channels: u16::MAX,
                lossy: true,
                decisions: vec![decision; MAX_TUNER_DECISIONS],
            }),
            trace_dropped: u64::MAX,
        });
        assert!(
            trace_len + rest <= MAX_CONTROL_FRAME as usize,
            "trace {trace_len} + the rest {rest} bytes"
        );
    }
}
