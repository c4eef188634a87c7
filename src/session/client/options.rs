//! What a client is told: its options, checked before anything connects, and how much a
//! bench moves.

use std::time::{Duration, Instant};

use crate::channels::control::Policy;
use crate::channels::limits;
use crate::error::{Error, Result};
use crate::session::faults::FaultInjection;
use crate::session::mptcp_paths::MptcpPaths;
use crate::session::secure::Security;
use crate::session::source::BenchLimit;
use crate::session::{Auth, DEFAULT_PORT};
use crate::transport::subflow_pacing;
use crate::tuning::bdp::BufferChoice;
use crate::tuning::defaults;
use crate::tuning::desync::{PaceChoice, StaggerChoice};

/// What is known of the path's bottleneck rate before the transfer starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PathRate {
    /// Nothing: the online tuner measures it (or, with [`Tune::Off`], buffers are sized to
    /// the outgoing interface's speed and nothing is paced).
    #[default]
    Unknown,
    /// The user's figure for the bottleneck, bits/s on the wire (`--rate`).
    Given(u64),
    /// A goodput rate measured moments ago (a probe's first trial), bits/s of payload.
    Measured(u64),
    /// A goodput rate measured earlier and saved (a profile: a probe or an earlier copy),
    /// bits/s of payload. It may be stale or low, so the online tuner probes above it early.
    Saved(u64),
}

/// Whether the sending side tunes the transfer while data moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tune {
    /// Meter the path with the first channel when its rate is unknown, pace every channel
    /// just below the rate, and add channels while they pay, retiring added ones that bring
    /// nothing (`hsxfer::tuning::online`).
    #[default]
    Online,
    /// The settings planned at the start are final.
    Off,
}

/// Options of a transfer, shared by push, pull and bench.
#[derive(Debug, Clone)]
pub struct TransferOptions {
    /// Number of parallel data channels to open with (1..=[`limits::MAX_CHANNELS`]).
    pub channels: u16,
    /// Most channels the online tuner may run (set it to `channels` to fix the count).
    pub max_channels: u16,
    /// Block size in bytes (the unit of scheduling, checking and resuming).
    pub block_size: u32,
    /// Server port.
    pub port: u16,
    /// Authentication.
    pub auth: Auth,
    /// Congestion control of the sending sockets, cycled over the channels; empty keeps the
    /// sending host's default.
    pub cc: Vec<String>,
    /// Socket buffer sizing.
    pub buffer: BufferChoice,
    /// The path's bottleneck rate, if known: sizes buffers and automatic pacing.
    pub rate: PathRate,
    /// Whether the sending side tunes the transfer while it runs.
    pub tune: Tune,
    /// Which congestion controls the online tuner may choose.
    pub policy: Policy,
    /// Where settings came from when not from the caller (e.g. a saved profile), for the
    /// report.
    pub origin: Vec<String>,
    /// Path RTT; `None` measures it (pings on the control connection and its `TCP_INFO`).
    pub rtt: Option<Duration>,
    /// Staggered channel starts.
    pub stagger: StaggerChoice,
    /// Per-channel pacing caps of the sending side.
    pub pace: PaceChoice,
    /// How often a sending server reports telemetry.
    pub interval: Duration,
    /// Move the data over one Multipath TCP connection (`IPPROTO_MPTCP`) whose subflows are
    /// the channels: `channels` subflows when the server announces subflow ports and the
    /// path manager's limits allow them (raised for the transfer when run as root). It falls
    /// back to TCP by itself when the server does not listen with MPTCP; the report's
    /// `transport` and `subflows` say what ran. Its subflows are paced by a BPF program,
    /// which needs root ([`crate::transport::subflow_pacing`]); without root they run
    /// unpaced.
    pub mptcp: bool,
    /// With `mptcp`, which of this host's addresses the connection opens subflows from, each
    /// with `channels` subflows (at most 9 in all, the kernel path manager's limit).
    pub mptcp_paths: MptcpPaths,
    /// TLS (the default) or clear text, and which server keys are accepted.
    pub security: Security,
    /// Deliberate damage, for tests of the integrity path (`testing` feature).
    #[cfg(feature = "testing")]
    pub faults: FaultInjection,
}

impl TransferOptions {
    /// The test hooks in force: none without the `testing` feature.
    pub(crate) fn faults(&self) -> FaultInjection {
        #[cfg(feature = "testing")]
        return self.faults;
        #[cfg(not(feature = "testing"))]
        FaultInjection::default()
    }
}

impl Default for TransferOptions {
    fn default() -> Self {
        TransferOptions {
            channels: defaults::CHANNELS,
            max_channels: defaults::MAX_TUNED_CHANNELS,
            block_size: defaults::BLOCK_SIZE,
            port: DEFAULT_PORT,
            auth: Auth::NoAuth,
            cc: Vec::new(),
            buffer: BufferChoice::Auto,
            rate: PathRate::Unknown,
            tune: Tune::Online,
            policy: Policy::Fair,
            origin: Vec::new(),
            rtt: None,
            stagger: StaggerChoice::Auto,
            pace: PaceChoice::Auto,
            interval: Duration::from_secs(1),
            mptcp: false,
            mptcp_paths: MptcpPaths::Auto,
            security: Security::default(),
            #[cfg(feature = "testing")]
            faults: FaultInjection::default(),
        }
    }
}

impl TransferOptions {
    /// Checks option ranges, naming the bad value and the allowed range.
    pub fn validate(&self) -> Result<()> {
        if !(1..=limits::MAX_CHANNELS).contains(&self.channels) {
            return Err(Error::Usage(format!(
                "channel count {} is out of range: use 1 to {}",
                self.channels,
                limits::MAX_CHANNELS
            )));
        }
        if !(limits::MIN_BLOCK..=limits::MAX_BLOCK).contains(&self.block_size) {
            return Err(Error::Usage(format!(
                "block size {} is out of range: use {} to {} bytes",
                self.block_size,
                limits::MIN_BLOCK,
                limits::MAX_BLOCK
            )));
        }
        if let PathRate::Given(0) | PathRate::Measured(0) | PathRate::Saved(0) = self.rate {
            return Err(Error::Usage(
                "a `rate` of 0 is no path's: give the bottleneck's rate, or none to have it \
                 measured"
                    .into(),
            ));
        }
        if let PathRate::Given(bps) = self.rate {
            if bps < MIN_RATE_BPS {
                return Err(Error::Usage(format!(
                    "a `rate` of {bps} bit/s is no path's: rates are in bits per second (e.g. \
                     10G); give the bottleneck's, or none to have it measured"
                )));
            }
        }
        if let Some(rtt) = self.rtt {
            if rtt.is_zero() || rtt > limits::MAX_RTT {
                return Err(Error::Usage(format!(
                    "an `rtt` of {rtt:?} is out of range: give the path's round-trip time, \
                     more than 0 and at most {:?} (e.g. 60ms), or none to have it measured",
                    limits::MAX_RTT
                )));
            }
        }
        if let BufferChoice::Fixed(b) = self.buffer {
            if b == 0 || b > limits::MAX_BUFFER {
                return Err(Error::Usage(format!(
                    "a `buffer` of {b} bytes is out of range: use 1 to {} bytes, auto or kernel",
                    limits::MAX_BUFFER
                )));
            }
        }
        if self.pace == PaceChoice::Fixed(0) {
            return Err(Error::Usage(
                "a `pace` cap under 8 bits/s would stop every channel: give a higher one, or \
                 none"
                    .into(),
            ));
        }
        if self.mptcp {
            self.mptcp_paths.check()?;
        }
        if self.mptcp && matches!(self.pace, PaceChoice::Fixed(_)) && !subflow_pacing::available() {
            return Err(Error::Usage(
                "`pace` caps on MPTCP channels need root: the kernel refuses SO_MAX_PACING_RATE \
                 on MPTCP sockets, so hsxfer caps each subflow with a BPF program"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// Least `rate` a path is given: a figure below it is a unit mistaken, and its pacing
/// caps round to nothing.
const MIN_RATE_BPS: u64 = 1000;

/// How much data a bench moves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BenchAmount {
    /// This many bytes.
    Bytes(u64),
    /// For this many seconds (at most a day).
    Seconds(f64),
}

/// Turns bench limits into a [`BenchLimit`]; exactly one of them must be given.
pub fn bench_limit(bytes: Option<u64>, seconds: Option<f64>) -> Result<BenchLimit> {
    match (bytes, seconds) {
        (Some(b), None) => Ok(BenchLimit::Bytes(b)),
        (None, Some(s)) if s > 0.0 && s <= limits::MAX_BENCH_SECONDS => Ok(BenchLimit::Until(
            Instant::now() + Duration::from_secs_f64(s),
        )),
        (None, Some(s)) => Err(Error::Usage(format!(
            "a bench duration of {s} s is out of range: use more than 0 and at most {} s (a day)",
            limits::MAX_BENCH_SECONDS
        ))),
        _ => Err(Error::Usage(
            "bench needs exactly one of a size or a duration".into(),
        )),
    }
}
