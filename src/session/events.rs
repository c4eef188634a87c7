//! The NDJSON events of `copy --json` and `bench --json` (docs/json.md), as one typed schema:
//! the command line writes them and the lab and the tests read them back with the same types.

use serde::{Deserialize, Serialize};

use super::report::{LiveStats, TransferReport};
use crate::channels::telemetry::TcpSample;

/// Version of the NDJSON schema; bumped on incompatible changes.
pub const JSON_SCHEMA: u32 = 2;

/// One line of `--json` output.
///
/// # Examples
///
/// ```
/// use hsxfer::session::events::Event;
///
/// let line = r#"{"type":"warning","message":"send buffer capped"}"#;
/// let event: Event = serde_json::from_str(line).unwrap();
/// assert!(matches!(event, Event::Warning { ref message } if message == "send buffer capped"));
/// assert_eq!(serde_json::to_string(&event).unwrap(), line);
/// ```
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// The first line.
    Start {
        /// [`JSON_SCHEMA`].
        schema: u32,
        /// `push`, `pull`, `bench-upload` or `bench-download`.
        operation: String,
        /// The server.
        host: String,
        /// Data channels the transfer opens with.
        channels: u16,
        /// Block size, bytes.
        block_size: u32,
    },
    /// Every `--interval`: the totals so far.
    Progress {
        /// Seconds since the start.
        seconds: f64,
        /// Payload bytes carried.
        bytes: u64,
        /// Bytes the transfer expects to carry, as far as known.
        expected_bytes: u64,
        /// Files committed or skipped.
        files_done: u64,
        /// Sum of the channels' goodputs over the last interval, bits/s.
        goodput_bps: f64,
    },
    /// Every `--interval`, after `progress`: one per channel.
    Channel(ChannelEvent),
    /// A limit that kept a setting below what the path needs.
    Warning {
        /// What and the fix.
        message: String,
    },
    /// The last line of a transfer that ended.
    Summary {
        /// [`JSON_SCHEMA`].
        schema: u32,
        /// The report.
        #[serde(flatten)]
        report: Box<TransferReport>,
    },
    /// The last line of a transfer that failed.
    Error {
        /// The one-line message.
        message: String,
    },
}

/// A channel's counters and, once sampled, its TCP state.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChannelEvent {
    /// Seconds since the start.
    pub seconds: f64,
    /// Channel index.
    pub index: usize,
    /// Payload bytes carried.
    pub bytes: u64,
    /// Goodput over the last interval, bits/s.
    pub goodput_bps: f64,
    /// Congestion control in force on the sending socket.
    pub cc: Option<String>,
    /// The last `TCP_INFO` sample of the sending socket, when this end sends.
    #[serde(flatten)]
    pub tcp: Option<TcpState>,
}

/// The `TCP_INFO` fields a channel event carries.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct TcpState {
    /// Congestion window, segments.
    pub cwnd: u32,
    /// Slow-start threshold, segments.
    pub ssthresh: u32,
    /// Smoothed RTT, microseconds.
    pub rtt_us: u32,
    /// Minimum RTT, microseconds.
    pub min_rtt_us: u32,
    /// Segments in retransmission now.
    pub retrans: u32,
    /// Segments retransmitted since the socket opened.
    pub total_retrans: u32,
    /// Delivery rate, bits/s.
    pub delivery_rate_bps: u64,
    /// Pacing rate, bits/s.
    pub pacing_rate_bps: u64,
    /// Congestion-avoidance state (0 open, 1 disorder, 2 CWR, 3 recovery, 4 loss).
    pub ca_state: u8,
    /// Bytes acknowledged.
    pub bytes_acked: u64,
}

impl From<&TcpSample> for TcpState {
    fn from(t: &TcpSample) -> Self {
        TcpState {
            cwnd: t.cwnd,
            ssthresh: t.ssthresh,
            rtt_us: t.rtt_us,
            min_rtt_us: t.min_rtt_us,
            retrans: t.retrans,
            total_retrans: t.total_retrans,
            delivery_rate_bps: t.delivery_rate * 8,
            pacing_rate_bps: t.pacing_rate * 8,
            ca_state: t.ca_state,
            bytes_acked: t.bytes_acked,
        }
    }
}

impl Event {
    /// The summary event of `report`.
    pub fn summary(report: &TransferReport) -> Event {
        Event::Summary {
            schema: JSON_SCHEMA,
            report: Box::new(report.clone()),
        }
    }

    /// The `progress` event and one `channel` event per channel, from the live counters
    /// and the channels' goodputs over the last interval.
    pub fn progress(live: &LiveStats, bytes: &[u64], rates: &[f64]) -> Vec<Event> {
        let seconds = live.elapsed();
        let mut events = vec![Event::Progress {
            seconds,
            bytes: live.total(),
            expected_bytes: live.expected(),
            files_done: live.files_done(),
            goodput_bps: rates.iter().sum(),
        }];
        let setups = live.telemetry.setups();
        let latest = live.telemetry.latest();
        for (index, (&bytes, &goodput_bps)) in bytes.iter().zip(rates).enumerate() {
            events.push(Event::Channel(ChannelEvent {
                seconds,
                index,
                bytes,
                goodput_bps,
                cc: setups.get(index).cloned().flatten().map(|s| s.cc),
                tcp: latest
                    .get(index)
                    .copied()
                    .flatten()
                    .map(|s| TcpState::from(&s.tcp)),
            }));
        }
        events
    }
}
