//! Per-channel telemetry of a running transfer: the sending side samples `TCP_INFO` of its
//! data sockets every [`SAMPLE_PERIOD`] ([`super::sampler`]), detects loss events, and keeps
//! the latest sample,
//! the settings in force and (when asked) a fine-grained trace. A sending server forwards it
//! to the client in [`TelemetryBatch`]es; the client absorbs them into the same state, so
//! displays and reports read one place whichever side sends.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::channels::limits::{LOSSES_PER_BATCH, TRACE_SAMPLES_PER_BATCH};
use crate::channels::telemetry::{
    ChannelSetup, DmcCounters, GuardCounters, Sample, TelemetryBatch, TunerReport,
};
use crate::metrics::{LossDetector, LossEvent};
use crate::tuning::bundled::group::DmcGroup;
use crate::tuning::bundled::inspect::GuardBaseline;

/// How often the sender reads `TCP_INFO`: fine enough to see each entry into loss recovery
/// (a recovery lasts at least one RTT) and to draw cwnd traces.
pub const SAMPLE_PERIOD: Duration = Duration::from_millis(10);

/// Loss events kept for the report's loss synchronization (16 MiB of them): a day of 128
/// channels each losing every 10 s is a million, and a hostile server could otherwise send
/// them without end. Those past it are left out of the report.
pub const MAX_LOSS_EVENTS: usize = 1 << 20;

/// Trace samples kept until they are taken or forwarded (about 30 MiB): 20 s of 128 channels.
/// A reader that falls further behind (a client that stops reading its control connection,
/// a pipeline that turned the trace on and never takes it) loses the samples past it, and
/// [`Telemetry::trace_dropped`] counts them.
pub const MAX_TRACE_SAMPLES: usize = 1 << 18;

#[derive(Default)]
struct State {
    setups: Vec<Option<ChannelSetup>>,
    latest: Vec<Option<Sample>>,
    detectors: Vec<LossDetector>,
    losses: Vec<LossEvent>,
    forwarded_losses: usize,
    trace: Option<VecDeque<Sample>>,
    /// Trace samples this side left out ([`MAX_TRACE_SAMPLES`]).
    trace_dropped: u64,
    /// Trace samples the sending server says it left out.
    trace_dropped_by_sender: u64,
    /// The final batch was asked for: samples taken after it would never be forwarded.
    closing: bool,
    group: Option<Arc<DmcGroup>>,
    dmctcp: Option<DmcCounters>,
    guard_baseline: Option<GuardBaseline>,
    guard: Option<GuardCounters>,
    tuner: Option<TunerReport>,
}

/// Telemetry of one transfer; lives in [`super::report::LiveStats`].
#[derive(Default)]
pub struct Telemetry {
    state: Mutex<State>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Telemetry")
    }
}

impl Telemetry {
    /// Empty telemetry for `channels` channels.
    pub fn new(channels: usize) -> Self {
        Telemetry {
            state: Mutex::new(State {
                setups: vec![None; channels],
                latest: vec![None; channels],
                detectors: vec![LossDetector::default(); channels],
                ..Default::default()
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("telemetry lock")
    }

    /// Makes room for channels `0..n` (channels opened during the transfer).
    pub fn ensure_channels(&self, n: usize) {
        let mut s = self.lock();
        if s.latest.len() < n {
            s.setups.resize(n, None);
            s.latest.resize(n, None);
            s.detectors.resize(n, LossDetector::default());
        }
    }

    /// Records that channel `channel` now runs congestion control `cc` (read back after the
    /// online tuner switched it).
    pub fn set_cc(&self, channel: usize, cc: String) {
        if let Some(Some(setup)) = self.lock().setups.get_mut(channel) {
            setup.cc = cc;
        }
    }

    /// Records the pacing cap now in force on channel `channel`, bits/s.
    pub fn set_pace(&self, channel: usize, pace_bps: Option<u64>) {
        if let Some(Some(setup)) = self.lock().setups.get_mut(channel) {
            setup.pace_bps = pace_bps;
        }
    }

    /// Records what the online tuner learned and did so far.
    pub fn set_tuner(&self, report: TunerReport) {
        self.lock().tuner = Some(report);
    }

    /// What the online tuner learned and did (on a pull, as the sending server last
    /// forwarded it).
    pub fn tuner(&self) -> Option<TunerReport> {
        self.lock().tuner.clone()
    }

    /// Keeps every sample from now on, for [`Telemetry::take_trace`].
    pub fn enable_trace(&self) {
        self.lock().trace.get_or_insert_with(VecDeque::new);
    }

    /// Whether a trace is being kept.
    pub fn tracing(&self) -> bool {
        self.lock().trace.is_some()
    }

    /// Records the settings in force on a channel.
    pub fn set_setup(&self, setup: ChannelSetup) {
        let i = setup.index as usize;
        self.ensure_channels(i + 1);
        self.lock().setups[i] = Some(setup);
    }

    /// On the sending side: the DMCTCP group the channels joined, read for its counters.
    pub fn set_group(&self, group: Arc<DmcGroup>) {
        self.lock().group = Some(group);
    }

    /// On the sending side: the bundled congestion controls' guard counters as the channels
    /// opened, so [`Telemetry::guard`] reports what the transfer added.
    pub fn set_guard_baseline(&self, baseline: GuardBaseline) {
        self.lock().guard_baseline = Some(baseline);
    }

    /// Repairs by the window guard during the transfer: read from the kernel on the sending
    /// side, as last forwarded on the receiving side; None when no channel ran a bundled
    /// congestion control whose counters this host could read.
    pub fn guard(&self) -> Option<GuardCounters> {
        let mut s = self.lock();
        if let Some(c) = s.guard_baseline.as_ref().map(GuardBaseline::since) {
            s.guard = Some(c);
        }
        s.guard
    }

    /// The DMCTCP group's counters: read from the kernel on the sending side, as last
    /// forwarded on the receiving side; None when the channels did not run as a group.
    pub fn dmctcp(&self) -> Option<DmcCounters> {
        let mut s = self.lock();
        if let Some(c) = s.group.as_ref().and_then(|g| g.counters()) {
            s.dmctcp = Some(c);
        }
        s.dmctcp
    }

    /// Records when a channel sent its first block.
    pub fn mark_started(&self, channel: usize, t: f64) {
        if let Some(Some(setup)) = self.lock().setups.get_mut(channel) {
            setup.started_s.get_or_insert(t);
        }
    }

    /// Records one sample, detecting a loss event.
    pub fn record(&self, sample: Sample) {
        let i = sample.channel as usize;
        self.ensure_channels(i + 1);
        let mut s = self.lock();
        let lost = s.detectors[i].on_sample(sample.tcp.recovering(), sample.tcp.total_retrans);
        if lost && s.losses.len() < MAX_LOSS_EVENTS {
            s.losses.push(LossEvent {
                flow: i,
                at: sample.t,
            });
        }
        s.latest[i] = Some(sample);
        if !s.closing {
            s.keep_traced([sample]);
        }
    }

    /// Takes what a sending server forwards: all setups, the latest samples, and the losses
    /// and trace samples since the previous batch, as many as one control frame holds
    /// ([`TRACE_SAMPLES_PER_BATCH`], [`LOSSES_PER_BATCH`]): while
    /// [`Telemetry::more_to_forward`], send another. `last` asks for the session's final
    /// batch: samples recorded from then on are not kept, and the batch says it is the last
    /// only once nothing is left to forward.
    pub fn take_batch(&self, last: bool) -> TelemetryBatch {
        let dmctcp = self.dmctcp();
        let guard = self.guard();
        let mut s = self.lock();
        s.closing |= last;
        let from = s.forwarded_losses;
        let to = s.losses.len().min(from + LOSSES_PER_BATCH);
        let losses = s.losses[from..to].to_vec();
        s.forwarded_losses = to;
        let trace = match s.trace.as_mut() {
            Some(t) => t.drain(..t.len().min(TRACE_SAMPLES_PER_BATCH)).collect(),
            None => Vec::new(),
        };
        let more = s.more_to_forward();
        TelemetryBatch {
            setups: s.setups.iter().flatten().cloned().collect(),
            latest: s.latest.iter().flatten().copied().collect(),
            losses,
            trace,
            last: last && !more,
            dmctcp,
            guard,
            tuner: s.tuner.clone(),
            trace_dropped: s.trace_dropped,
        }
    }

    /// Whether losses or trace samples wait that the last batch could not carry.
    pub fn more_to_forward(&self) -> bool {
        self.lock().more_to_forward()
    }

    /// Batches [`Telemetry::take_batch`] would take to forward what waits now (at least one).
    pub fn batches_waiting(&self) -> usize {
        let s = self.lock();
        let losses = s.losses.len() - s.forwarded_losses;
        let trace = s.trace.as_ref().map_or(0, VecDeque::len);
        losses
            .div_ceil(LOSSES_PER_BATCH)
            .max(trace.div_ceil(TRACE_SAMPLES_PER_BATCH))
            .max(1)
    }

    /// Trace samples left out because more than [`MAX_TRACE_SAMPLES`] waited: on this side,
    /// and on the sending server as it last said.
    pub fn trace_dropped(&self) -> u64 {
        let s = self.lock();
        s.trace_dropped.saturating_add(s.trace_dropped_by_sender)
    }

    /// Absorbs a batch forwarded by the sending server.
    pub fn absorb(&self, batch: TelemetryBatch) {
        for setup in batch.setups {
            self.set_setup(setup);
        }
        if let Some(max) = batch.latest.iter().map(|s| s.channel as usize + 1).max() {
            self.ensure_channels(max);
        }
        let mut s = self.lock();
        for sample in batch.latest {
            s.latest[sample.channel as usize] = Some(sample);
        }
        if batch.tuner.is_some() {
            s.tuner = batch.tuner;
        }
        let room = MAX_LOSS_EVENTS - s.losses.len();
        s.losses.extend(batch.losses.into_iter().take(room));
        if batch.dmctcp.is_some() {
            s.dmctcp = batch.dmctcp;
        }
        if batch.guard.is_some() {
            s.guard = batch.guard;
        }
        s.trace_dropped_by_sender = s.trace_dropped_by_sender.max(batch.trace_dropped);
        s.keep_traced(batch.trace);
    }

    /// Settings of each channel, where known.
    pub fn setups(&self) -> Vec<Option<ChannelSetup>> {
        self.lock().setups.clone()
    }

    /// Latest sample of each channel, where known.
    pub fn latest(&self) -> Vec<Option<Sample>> {
        self.lock().latest.clone()
    }

    /// Every loss event so far.
    pub fn losses(&self) -> Vec<LossEvent> {
        self.lock().losses.clone()
    }

    /// Takes the trace samples kept since the previous call.
    pub fn take_trace(&self) -> Vec<Sample> {
        self.lock()
            .trace
            .as_mut()
            .map(|t| t.drain(..).collect())
            .unwrap_or_default()
    }
}

impl State {
    /// Adds `samples` to the trace, if one is kept, up to [`MAX_TRACE_SAMPLES`] waiting.
    fn keep_traced(&mut self, samples: impl IntoIterator<Item = Sample>) {
        let Some(t) = self.trace.as_mut() else {
            return;
        };
        for sample in samples {
            if t.len() < MAX_TRACE_SAMPLES {
                t.push_back(sample);
            } else {
                self.trace_dropped += 1;
            }
        }
    }

    fn more_to_forward(&self) -> bool {
        self.forwarded_losses < self.losses.len()
            || self.trace.as_ref().is_some_and(|t| !t.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channels::telemetry::{TcpSample, CA_RECOVERY};

    fn sample(t: f64, channel: u16, ca_state: u8, total_retrans: u32) -> Sample {
        Sample {
            t,
            channel,
            tcp: TcpSample {
                ca_state,
                total_retrans,
                ..Default::default()
            },
        }
    }

    #[test]
    fn batches_forward_each_loss_once_and_absorb_rebuilds_the_state() {
        let sender = Telemetry::new(2);
        sender.enable_trace();
        sender.record(sample(0.01, 0, 0, 0));
        sender.record(sample(0.02, 0, CA_RECOVERY, 1));
        let b1 = sender.take_batch(false);
        sender.record(sample(0.03, 1, CA_RECOVERY, 2));
        let b2 = sender.take_batch(true);
        assert_eq!(b1.losses, vec![LossEvent { flow: 0, at: 0.02 }]);
        assert_eq!(b2.losses, vec![LossEvent { flow: 1, at: 0.03 }]);
        assert_eq!((b1.trace.len(), b2.trace.len()), (2, 1));
        let client = Telemetry::new(2);
        client.absorb(b1);
        client.absorb(b2);
        assert_eq!(client.losses(), sender.losses());
        assert_eq!(client.latest(), sender.latest());
        assert!(
            client.take_trace().is_empty(),
            "no trace kept unless enabled"
        );
    }

    #[test]
    fn a_long_trace_goes_in_batches_that_fit_a_frame_and_the_last_says_so_at_its_end() {
        let sender = Telemetry::new(1);
        sender.enable_trace();
        let n = 2 * TRACE_SAMPLES_PER_BATCH + 5;
        for k in 0..n {
            sender.record(sample(k as f64, 0, 0, 0));
        }
        let first = sender.take_batch(true);
        assert_eq!(first.trace.len(), TRACE_SAMPLES_PER_BATCH);
        assert!(!first.last && sender.more_to_forward());
        // Samples after the final batch was asked for are not kept: the loop ends.
        sender.record(sample(1e9, 0, 0, 0));
        let second = sender.take_batch(true);
        assert!(!second.last);
        let third = sender.take_batch(true);
        assert_eq!(third.trace.len(), 5);
        assert!(third.last && !sender.more_to_forward());
        assert_eq!(third.trace.last().map(|s| s.t), Some((n - 1) as f64));
    }

    #[test]
    fn a_trace_nobody_reads_stops_growing_and_counts_what_it_left_out() {
        let sender = Telemetry::new(1);
        sender.enable_trace();
        for k in 0..MAX_TRACE_SAMPLES + 7 {
            sender.record(sample(k as f64, 0, 0, 0));
        }
        assert_eq!(sender.trace_dropped(), 7);
        let batch = sender.take_batch(false);
        assert_eq!(batch.trace_dropped, 7);
        // A client adds the sender's count to its own; a server's batches cannot grow its
        // trace past the bound either.
        let client = Telemetry::new(1);
        client.enable_trace();
        client.absorb(batch);
        while sender.more_to_forward() {
            client.absorb(sender.take_batch(false));
        }
        client.absorb(TelemetryBatch {
            trace: vec![sample(0.0, 0, 0, 0); 3],
            trace_dropped: 7,
            ..TelemetryBatch::default()
        });
        assert_eq!(client.take_trace().len(), MAX_TRACE_SAMPLES);
        assert_eq!(client.trace_dropped(), 3 + 7);
    }

    #[test]
    fn at_most_a_million_loss_events_are_kept() {
        let client = Telemetry::new(1);
        let flood = |n| TelemetryBatch {
            losses: (0..n)
                .map(|k| LossEvent {
                    flow: 0,
                    at: k as f64,
                })
                .collect(),
            ..TelemetryBatch::default()
        };
        client.absorb(flood(MAX_LOSS_EVENTS - 1));
        client.absorb(flood(700_000));
        assert_eq!(client.losses().len(), MAX_LOSS_EVENTS);
        let last = client.losses().last().copied();
        assert_eq!(last, Some(LossEvent { flow: 0, at: 0.0 }));
    }
}
