//! Online tuning: what the sending side of a running transfer changes as it learns the path,
//! so that the first copy over a path is fast too, without flags or a saved profile.
//!
//! Why pacing, and at what rate. On a long path with a tiny bottleneck queue, every
//! loss-based congestion control is cut by its own bursts long before the pipe is full
//! (Antony et al. 2003; Cui 2013 ch. 4): measured here at 1 Gbit/s × 60 ms with 64 packets,
//! four unpaced cubic channels move 123 Mbit/s. Channels paced so that together they send
//! just below the bottleneck rate never fill the queue, see no loss, and move 928 Mbit/s
//! (97 % of the goodput ceiling) with the same cubic. The whole problem is knowing that rate
//! before slow start overshoots: a slow start that overfills a tiny queue leaves every
//! channel's window cut below its share, and cubic then needs many seconds to grow back.
//!
//! So a transfer whose rate is unknown begins with a **meter**: the first channel runs
//! alone (the others wait) with a pacing cap of `METER_GAIN` × what it delivered over the
//! last round, BBR's startup (Cardwell et al. 2016) run from user space over any congestion
//! control. It sends continuously at its cap instead of in slow start's ACK-clocked bursts,
//! which overflow a tiny queue at half the path's window, and its rate doubles each round.
//! Once the cap passes the bottleneck rate the queue overflows; the kernel's delivery-rate
//! samples (each measured over about one RTT from the kernel's own timestamps, so the
//! sampler's timing does not enter them) of the two rounds after that first loss are the
//! bottleneck rate. The meter uses Reno ([`METER_CC`]) unless the user chose a congestion
//! control: cubic's HyStart leaves slow start on a paced flow's long ACK trains and would
//! stall the ramp. Its window after the cut is still more than its share of N channels.
//! Then every channel is capped at [`PACE_GAIN`] × rate / N and the others start: paced
//! below the rate, their slow starts cannot overshoot, and they reach their share in about
//! log₂(share / 10) RTTs without a loss. Measured at 1 Gbit/s × 60 ms × 64 packets: the
//! meter ends about 0.8 s after the first byte within a few percent of the bottleneck, and
//! four cubic channels then move 917–944 Mbit/s without a loss.
//!
//! While the channels run:
//! - **Re-sharing.** Once a round the caps are shared max-min fair over what each window
//!   allows (twice that in slow start): a channel held back by its window (a loss cut it,
//!   or it is still growing) leaves its share to the others, so together they still send at
//!   the total. So does a channel out of data, at a transfer's end.
//! - **Caps at the path.** Every `CREEP_ROUNDS` rounds without a loss the caps creep up
//!   by `CREEP_STEP` of the estimate, up to `PACE_GAIN_MAX`: a loss at caps so raised
//!   sends them back to [`PACE_GAIN`], and they creep back up to one step under where they
//!   lost.
//! - **Keeping the estimate honest.** Repeated losses at the caps lower the estimate by 2 %;
//!   10 s after such a cut, soon after the meter, or 10 s after the start with a saved rate
//!   (a profile may be stale or low), a probe raises the caps for at least half a second
//!   and keeps what the path delivered. The meter's reading is probed because one channel
//!   may not fill the path by itself (measured at 1 Gbit/s × 60 ms × 64 packets: meters
//!   2–22 % low on a busy 2-core host), although on a tiny queue a probe above a right
//!   estimate costs a loss. A probe that ends with a queue standing at the bottleneck (the
//!   smoothed RTT `QUEUE_RTT_GROWTH` times the least) found the path full: the estimate
//!   stays, and the next probe waits as after one that did not pay.
//! - **Random loss.** Losses while the channels send well below their caps are not theirs:
//!   the caps go (and under `--policy fast` the channels switch to BBR). Once, when the
//!   channels had delivered close to their caps, such losses first lower the estimate to the
//!   most the path delivered, at most to the caps: caps above a tiny queue's link overflow
//!   it, and the cut windows send below the caps too. Losses at caps below what a probe
//!   took in the last 10 s count as random loss as well: the path carried more without them.
//! - **More channels.** While channels are held back by windows (a host's buffer limit) or
//!   by random loss, and the goodput is short of the rate, the count grows by half. An
//!   addition that does not bring at least half an average channel's goodput freezes the
//!   count; one that brought nothing is retired (its channels take no more blocks). The
//!   count never goes below the starting one.
//!
//! When the meter ends without proof that the path was full (a host's window held the
//! channel back, the rate stopped growing below the cap, or it ran out of time), the rate
//! stays unknown: the channels run with TCP's pacing but no cap, and may be added. Except
//! where one channel's host stopped growing on a path of `LONG_PATH_RTT_S` or more: the
//! path carried that rate without a loss, so the caps start there and probes raise them.
//!
//! Pure: decisions come from [`PathEstimator`] readings and the time in them. One file per
//! job: `meter.rs` (the meter), `cruise.rs` (each tick once all channels run, and random
//! loss), `rate.rs` (creep, cuts and probes of the estimate), `share.rs` (the per-channel
//! caps) and `channels.rs` (the channel count); `tests.rs` runs the tuner against the fluid
//! path model.

use super::estimate::{PathEstimator, Tick};
use crate::channels::control::Policy;
use crate::channels::limits::MAX_TUNER_DECISIONS;
use crate::channels::telemetry::{Decision, TcpSample, TunerReport};

mod channels;
mod cruise;
mod meter;
mod rate;
mod share;

use rate::{PROBE_GAIN, PROBE_GAIN_MAX, PROBE_INTERVAL_S, SAVED_RATE_PROBE_S};
pub use share::share_caps;

/// Fraction of the bottleneck rate the channels' pacing caps add up to at first: low enough
/// that an estimate a few percent high still leaves the queue empty.
pub const PACE_GAIN: f64 = 0.97;

/// The most the caps creep up to, as a fraction of the estimate, while no loss shows them
/// above the path: 3 % under the link costs 3 % of every copy. Measured at 1 Gbit/s × 60 ms
/// × 64 packets: caps 0.1 % under the link moved 94.4–96.6 % of it, caps 3 % under 93.8 %,
/// and caps 1.9 % over it 90–91 %.
const PACE_GAIN_MAX: f64 = 1.0;

/// Congestion control the meter uses when the user chose none: it has no HyStart, so it
/// leaves slow start only at a loss (cubic's HyStart often leaves at half the path's window).
pub const METER_CC: &str = "reno";

/// The smoothed RTT over the minimum that shows a queue building at the bottleneck while the
/// meter offers more than it delivers (a deep queue, which absorbs the excess without a
/// loss). A tiny queue cannot grow the RTT this much: there a loss ends the meter.
const QUEUE_RTT_GROWTH: f64 = 1.15;

/// The sampler's period, seconds: the shortest span a rate is measured over.
const TICK_S: f64 = 0.01;

/// Shortest round for timing decisions on very short paths (the sampling tick is 10 ms).
const MIN_ROUND_S: f64 = 0.02;

/// Seconds after a change (the meter's end, added channels) before a loss below the caps
/// can count as random: channels still ramping up send below their caps.
const SETTLE_S: f64 = 2.0;

/// What the tuner may change, fixed when the transfer starts.
#[derive(Debug, Clone, PartialEq)]
pub struct TunerConfig {
    /// Channels the transfer opens with.
    pub channels: u16,
    /// Most channels the tuner may run (equal to `channels` when the user fixed the count).
    pub max_channels: u16,
    /// Bottleneck goodput rate known in advance (a profile or `--rate`), bytes/s: no meter.
    pub known_rate: Option<f64>,
    /// Whether to probe above `known_rate` soon after the start: a rate saved earlier may be
    /// stale, or low (a meter whose first loss was a random one), and a copy held at it
    /// would save it again.
    pub probe_known_rate: bool,
    /// Whether the tuner sets pacing caps (false when the user gave `--pace`).
    pub pace: bool,
    /// Whether the first channel meters an unknown rate before the others start.
    pub meter: bool,
    /// Congestion control of the meter, when it differs from the transfer's.
    pub meter_cc: Option<String>,
    /// Congestion control of the transfer (what the meter switches to afterwards).
    pub steady_cc: Option<String>,
    /// Congestion control of the channels while the tuner's pacing caps hold them, when it
    /// differs from `steady_cc`; the channels go back to `steady_cc` if the meter finds no
    /// rate to cap at, or once random loss removes the caps (unless [`Policy::Fast`]
    /// switches them to BBR then).
    pub capped_cc: Option<String>,
    /// Which congestion controls the tuner may switch to.
    pub policy: Policy,
    /// Whether the tuner may switch to BBR ([`Policy::Fast`] on a lossy path): the host has
    /// it and the transfer named no congestion control of its own.
    pub bbr_usable: bool,
}

/// Something the sending side must do now.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Pace channel `channel`: at most `rate` bytes/s, or with TCP's own pacing and no cap
    /// (`None`).
    Pace {
        /// Channel index (it may not be open yet: apply when it is).
        channel: usize,
        /// Cap in bytes/s.
        rate: Option<u64>,
    },
    /// Switch channel `channel` to congestion control `name`.
    SetCc {
        /// Channel index.
        channel: usize,
        /// Congestion control.
        name: String,
    },
    /// The channels held while the meter ran may start.
    Release,
    /// Open this many more channels.
    AddChannels(u16),
    /// Only the first `keep` channels take blocks from now on: the others finish the one they
    /// carry and stay idle, open, until the transfer ends. Never below the starting count.
    Retire {
        /// Channels that go on.
        keep: u16,
    },
}

/// Where the tuner stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The first channel measures the path's rate; the others wait.
    Meter,
    /// All channels run; the tuner watches and may add channels (or retire added ones).
    Cruise,
}

/// A probe above the estimated rate.
#[derive(Debug, Clone, Copy)]
struct Probe {
    since: f64,
    /// How long it runs, seconds.
    span: f64,
    /// What the caps allowed before it, bytes/s.
    before: f64,
    gain: f64,
}

#[derive(Debug, Clone, Copy)]
struct Growth {
    before: f64,
    channels_before: u16,
    added: u16,
}

/// The online tuner of one transfer's sending side.
#[derive(Debug, Clone)]
pub struct OnlineTuner {
    cfg: TunerConfig,
    phase: Phase,
    started: Option<f64>,
    meter_loss_at: Option<f64>,
    /// When the meter's channel first delivered data.
    meter_data_at: Option<f64>,
    /// The meter's total pacing cap, bytes/s, and every one it had: `(since, bytes/s)`.
    meter_cap: Option<f64>,
    offered: Vec<(f64, f64)>,
    /// Since when the meter's caps have held the channels back (their windows allow more).
    binding_since: Option<f64>,
    /// The meter's goodput, once per round: `(t, bytes/s)`.
    rounds: Vec<(f64, f64)>,
    rate: Option<f64>,
    /// The per-channel caps in force, bytes/s, and when they were last re-shared.
    caps: Vec<f64>,
    last_share: f64,
    /// Whether the total changed on purpose since: the next re-share applies every change,
    /// however small (a 0.5 % creep, a 2 % cut).
    total_changed: bool,
    probe: Option<Probe>,
    /// When the last probe ended: the losses of the next rounds are its own.
    probe_ended: f64,
    probe_gain: f64,
    /// The most the next probes may raise the caps by: [`PROBE_GAIN`] after a larger probe
    /// overshot the path, so that the estimate closes in on it in small steps, and after a
    /// meter that filled the path, whose reading is within a few percent of it.
    probe_gain_max: f64,
    /// Whether the probe now ending is already the second try of one that took more than
    /// the estimate but too little to pay.
    probe_retried: bool,
    probe_interval: f64,
    /// When the next probe may start: after the meter, after a saved rate's first seconds, and
    /// after the estimate was lowered.
    next_probe: Option<f64>,
    last_cut: f64,
    /// The caps' share of the estimate now, from [`PACE_GAIN`] up to `gain_ceiling`, and
    /// when it last moved.
    pace_gain: f64,
    last_creep: f64,
    /// The most `pace_gain` may creep up to with this estimate: one step under a gain whose
    /// caps lost at the caps (one step under the last ceiling, for a loss that follows one at
    /// a higher gain within [`SETTLE_S`]).
    gain_ceiling: f64,
    /// When the caps last lost after creeping up, and at what gain, with this estimate.
    creep_loss: Option<(f64, f64)>,
    /// When a probe last paid, and what it took, bytes/s.
    paid: Option<(f64, f64)>,
    /// Losses at the caps within the last [`CUT_SPAN_ROUNDS`](rate::CUT_SPAN_ROUNDS).
    losses_at_caps: Vec<f64>,
    /// The rate last written into the decisions.
    reported_rate: f64,
    channels: u16,
    below_cap_losses: Vec<f64>,
    /// The most all channels delivered over [`BEST_SPAN_S`](cruise::BEST_SPAN_S) since the
    /// meter ended, bytes/s.
    best_delivered: f64,
    /// Whether losses below the caps already lowered the estimate once (the next ones are
    /// random loss).
    rechecked: bool,
    last_change: f64,
    growth: Option<Growth>,
    frozen: bool,
    /// The congestion control the tuner switched every channel to, once it did: channels
    /// added later run it too.
    switched: Option<String>,
    report: TunerReport,
}

impl OnlineTuner {
    /// A tuner for a transfer about to start. The first channel meters the path when the
    /// rate is unknown and the configuration allows a meter; otherwise it starts in
    /// [`Phase::Cruise`].
    pub fn new(cfg: TunerConfig) -> OnlineTuner {
        let phase = if cfg.meter && cfg.pace && cfg.known_rate.is_none() {
            Phase::Meter
        } else {
            Phase::Cruise
        };
        OnlineTuner {
            phase,
            started: None,
            meter_loss_at: None,
            meter_data_at: None,
            meter_cap: None,
            offered: Vec::new(),
            binding_since: None,
            rounds: Vec::new(),
            rate: cfg.known_rate,
            caps: Vec::new(),
            last_share: 0.0,
            total_changed: false,
            probe: None,
            probe_ended: f64::NEG_INFINITY,
            probe_gain: PROBE_GAIN,
            probe_gain_max: PROBE_GAIN_MAX,
            probe_retried: false,
            probe_interval: PROBE_INTERVAL_S,
            next_probe: None,
            last_cut: f64::NEG_INFINITY,
            pace_gain: PACE_GAIN,
            last_creep: f64::NEG_INFINITY,
            gain_ceiling: PACE_GAIN_MAX,
            creep_loss: None,
            paid: None,
            losses_at_caps: Vec::new(),
            reported_rate: cfg.known_rate.unwrap_or(0.0),
            channels: cfg.channels,
            below_cap_losses: Vec::new(),
            best_delivered: 0.0,
            rechecked: false,
            last_change: 0.0,
            growth: None,
            frozen: false,
            switched: None,
            report: TunerReport {
                rate_bps: cfg.known_rate.map(|r| (r * 8.0) as u64),
                measured_bps: None,
                channels: cfg.channels,
                ..Default::default()
            },
            cfg,
        }
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Whether channels after the first must wait before sending (the meter runs).
    pub fn holds_channels(&self) -> bool {
        self.phase == Phase::Meter
    }

    /// What channel `i` must be set to before it opens: congestion control and pacing cap
    /// (`None`: TCP's own pacing, no cap).
    pub fn initial(&self, i: usize) -> (Option<String>, Option<u64>) {
        let cc = match (self.phase, i) {
            (Phase::Meter, 0) => self.cfg.meter_cc.clone().or(self.cc_now()),
            _ => self.cc_now(),
        };
        (cc, self.cap())
    }

    /// The congestion control the channels run now: the one the tuner switched them all to,
    /// once it did; else `capped_cc` while caps hold them (or will, once the meter ends),
    /// `steady_cc` otherwise.
    fn cc_now(&self) -> Option<String> {
        if let Some(switched) = &self.switched {
            return Some(switched.clone());
        }
        let capped = self.cfg.pace && (self.phase == Phase::Meter || self.rate.is_some());
        match &self.cfg.capped_cc {
            Some(cc) if capped => Some(cc.clone()),
            _ => self.cfg.steady_cc.clone(),
        }
    }

    /// Says which congestion control runs under the caps, when it is `capped_cc` (what runs
    /// once the caps go is said then).
    fn capped_cc_note(&self) -> String {
        match (&self.cfg.capped_cc, &self.cfg.steady_cc) {
            (Some(capped), Some(steady)) if self.cfg.pace => format!(
                ", running {capped} under the caps in place of {steady}: a window a loss cut comes back to its cap in about a second"
            ),
            _ => String::new(),
        }
    }

    /// Channels from `from` on to congestion control `name`.
    fn switch_cc(&mut self, from: usize, name: &str) -> Vec<Action> {
        self.switched = Some(name.to_string());
        (from..self.channels as usize)
            .map(|channel| Action::SetCc {
                channel,
                name: name.to_string(),
            })
            .collect()
    }

    /// The congestion control the tuner switched every channel to, if it did: a channel
    /// that joins later must be switched too (it opened with what was planned at the start).
    pub fn switched_cc(&self) -> Option<&str> {
        self.switched.as_deref()
    }

    /// Whether the tuner paces the channels (otherwise the user's `--pace` does).
    pub fn paces(&self) -> bool {
        self.cfg.pace
    }

    /// The per-channel pacing cap now, bytes/s (`None`: TCP's own pacing, no cap).
    pub fn cap(&self) -> Option<u64> {
        self.total()
            .map(|total| (total / self.channels.max(1) as f64).ceil() as u64)
    }

    /// What all channels together may send now, bytes/s: the pacing gain × the rate, more
    /// during a probe.
    fn total(&self) -> Option<f64> {
        let gain = self.probe.map_or(1.0, |p| p.gain);
        self.steady_total().map(|total| total * gain)
    }

    /// What all channels together may send outside a probe, bytes/s: what goodput and
    /// losses are judged against (a probe offers more than the path may carry).
    fn steady_total(&self) -> Option<f64> {
        self.rate.map(|r| self.pace_gain * r)
    }

    /// What the tuner learned and did so far.
    pub fn report(&self) -> &TunerReport {
        &self.report
    }

    /// Decides what to change after one sampling tick.
    pub fn on_tick(&mut self, est: &PathEstimator, tick: &Tick) -> Vec<Action> {
        let t = tick.t;
        if self.started.is_none() && self.cfg.probe_known_rate && self.rate.is_some() {
            // A saved rate may be stale or low, and a copy held at it would save it again.
            self.next_probe = Some(t + SAVED_RATE_PROBE_S);
        }
        if self.started.is_none() && self.phase == Phase::Cruise && self.rate.is_some() {
            let note = self.capped_cc_note();
            if !note.is_empty() {
                self.decide(0.0, format!("paced from the start{note}"));
            }
        }
        if self.started.is_none() {
            // The transfer's clock ran through its set-up: the channels start now, and the
            // settling spans count from here, not from the clock's zero.
            self.last_change = t;
        }
        let started = *self.started.get_or_insert(t);
        match self.phase {
            Phase::Meter => self.meter(est, tick, started),
            Phase::Cruise => self.cruise(est, tick),
        }
    }

    fn round(est: &PathEstimator) -> f64 {
        est.rtt_or_default().max(MIN_ROUND_S)
    }

    /// Records a decision, keeping the latest [`MAX_TUNER_DECISIONS`].
    fn decide(&mut self, t: f64, what: String) {
        let d = &mut self.report.decisions;
        if d.len() == MAX_TUNER_DECISIONS {
            d.remove(0);
        }
        d.push(Decision { t, what });
    }
}

/// Whether a channel's reading shows a queue on the path (at the bottleneck, or at an end
/// host short of CPU): its smoothed RTT is
/// [`QUEUE_RTT_GROWTH`] times its least or more.
fn queued(s: &TcpSample) -> bool {
    s.min_rtt_us > 0 && s.rtt_us as f64 >= QUEUE_RTT_GROWTH * s.min_rtt_us as f64
}

#[cfg(test)]
mod tests;
