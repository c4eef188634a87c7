//! The meter: the first channel alone, paced at [`METER_GAIN`] × what it delivered over the last
//! round, until the path is full (a loss, a queue, a plateau) or a host holds it back; then every
//! channel is capped at [`PACE_GAIN`](super::PACE_GAIN) of the rate it read and the others start.

use super::rate::PROBE_GAIN;
use super::{queued, Action, OnlineTuner, Phase, TICK_S};
use crate::channels::telemetry::MeterEnd;
use crate::tuning::estimate::{PathEstimator, Tick};

/// Longest a meter runs from its first delivered byte: seconds, or rounds when that is
/// longer. A long path needs about 11 rounds to fill 1 Gbit/s and 15 to fill 10, and two
/// more to measure. At 1 Gbit/s × 240 ms the meter's first byte was delivered 1.5 s after
/// the tuner's start (six round trips of setup), and 4 s from that start timed it out at
/// 422 Mbit/s: no caps, and cubic moved 78 % of the link.
const METER_MAX_S: f64 = 4.0;
const METER_MAX_ROUNDS: f64 = 20.0;

/// The meter's cap is this many times what it delivered over the last round: BBR's startup
/// gain 2/ln 2 (Cardwell et al. 2016), which doubles the rate each round although what a
/// round delivers was sent a round earlier.
const METER_GAIN: f64 = 2.89;

/// A round that delivers less than this share of what was offered a round before shows the
/// bottleneck full.
const FULL_SHARE: f64 = 0.75;

/// The meter's reading after its loss is the highest of its samples; after a gap in its ACK
/// stream from a round before the loss on, at most this many times their mean since the
/// loss. A host that reads ACKs late and then together (a busy core) inflates the samples that
/// span the gap, and the highest alone read 1.5-34 % over the link in 17 of 47 first copies
/// on 1 Gbit/s × 60 ms × 64 packets (those copies moved 78.7-93.5 % of the link, the others
/// 93.8-95.9 %); 16 of the 17 had such a gap. Their traces replayed through the tuner with this
/// bound: 3 of the 17 read over, by 0.9-3.8 %, and 4 of the other 30 read 1.2-3.6 % lower
/// (a low reading costs less: probes raise it). Where the highest sample was right, the mean
/// of the samples over the two rounds the meter waits after its loss was 0.93-0.98 of the
/// link.
const SAMPLE_SPREAD: f64 = 1.04;

/// Rounds (RTTs, at least [`MIN_ROUND_S`](super::MIN_ROUND_S) each) without 25 % growth
/// that end a meter.
const PLATEAU_ROUNDS: usize = 3;

/// Shortest RTT, seconds, at which a meter that stopped growing without filling the path
/// leaves caps at its rate: there, a loss of uncapped channels on a tiny queue costs seconds
/// of window growth (one channel's host limit stopped the meter at 778–881 Mbit/s on 1
/// Gbit/s × 60 ms × 64 packets, and the uncapped copies moved 76–87 % of the link, against
/// 86–92 % for those capped from a full meter). On a shorter path windows regrow in
/// milliseconds, and caps at one channel's rate would hold the others back until probes
/// raised them.
const LONG_PATH_RTT_S: f64 = 0.01;

/// Rounds from the meter's end to the first probe, once the other channels have ramped up.
const FIRST_PROBE_ROUNDS: f64 = 8.0;

impl OnlineTuner {
    pub(super) fn meter(&mut self, est: &PathEstimator, tick: &Tick, started: f64) -> Vec<Action> {
        let t = tick.t;
        let round = Self::round(est);
        let meter_max = METER_MAX_S.max(METER_MAX_ROUNDS * round);
        if tick.new_losses.contains(&0) && self.meter_loss_at.is_none() {
            self.meter_loss_at = Some(t);
        }
        let delivered = est.goodput(round.max(2.0 * TICK_S)).unwrap_or(0.0);
        if delivered > 0.0 && self.meter_data_at.is_none() {
            self.meter_data_at = Some(t);
        }
        // What the last round delivered was sent a round before: the least the cap allowed
        // over that earlier round.
        let offered = self.offered_between(t - 2.0 * round, t - round);
        // Only a cap that held the channel back for a whole round proves anything: before
        // that, slow start's window limits it.
        let binding = match (self.meter_cap, est.latest(0)) {
            (Some(cap), Some(s)) if s.rtt_us > 0 => {
                s.cwnd as f64 * s.mss as f64 / (s.rtt_us as f64 / 1e6) >= cap
            }
            _ => false,
        };
        if !binding {
            self.binding_since = None;
        } else if self.binding_since.is_none() {
            self.binding_since = Some(t);
        }
        // A queue builds at the bottleneck: the smoothed RTT is well above the minimum. A
        // round that delivers less than was offered proves nothing without it, since a stall
        // of the ACK stream (a busy host, a late sampler tick) looks the same for a round.
        let queue_building = est.latest(0).is_some_and(queued);
        let capped = offered.is_some_and(|o| delivered < FULL_SHARE * o)
            && self.binding_since.is_some_and(|since| t - since >= round)
            && queue_building;
        // After the first loss the ACKs of one more round still come back at the bottleneck's
        // rate (they are for what was sent while it overflowed): measure over two rounds, so
        // that a stall of the ACK stream does not hide it.
        if let Some(at) = self.meter_loss_at {
            if t - at < 2.0 * round {
                return self.hold_meter(est, at - round / 2.0);
            }
        }
        let (end, rate) = if let Some(at) = self.meter_loss_at {
            let most = est.channel_rate_since(0, at - round / 2.0);
            let mean = est.channel_mean_rate_since(0, at);
            let rate = if mean > 0.0 && est.last_gap_at(0).is_some_and(|g| g >= at - round) {
                most.min(SAMPLE_SPREAD * mean)
            } else {
                most
            };
            (MeterEnd::Full, Some(rate))
        } else if est.window_limited(0, round) > 0.5 && t - started > 4.0 * round {
            (MeterEnd::WindowLimited, None)
        } else if capped {
            // Far less delivered than offered for a round: the bottleneck is full (a deep
            // queue absorbs the excess without a loss).
            (MeterEnd::Full, Some(est.channel_rate_since(0, t - round)))
        } else if self.plateaued(est, t, round) {
            if queue_building {
                // Growth stopped while the queue grows: the bottleneck is full, and the
                // kernel's delivery-rate samples of the last round are its rate.
                (MeterEnd::Full, Some(est.channel_rate_since(0, t - round)))
            } else {
                // Growth stopped below the cap with no queue: a limit of a host (CPU, disk,
                // application).
                (MeterEnd::Plateau, None)
            }
        } else if t - self.meter_data_at.unwrap_or(started) > meter_max {
            (MeterEnd::Timeout, None)
        } else {
            return self.ramp_meter(t, delivered);
        };
        let rate = rate.filter(|r| *r > 0.0);
        self.report.meter = Some(end);
        self.phase = Phase::Cruise;
        self.last_change = t;
        // The most the meter reached, as the kernel measured it: the sampler's own rate over
        // a round is inflated by the burst of ACKs that follows a stall.
        let reached = est.channel_rate_since(0, started);
        let mut actions = Vec::new();
        let why = match (end, rate) {
            (MeterEnd::Full, Some(reached)) => {
                // One channel may not fill the path by itself (a core's worth of encryption,
                // a stalled ACK stream): a probe checks the reading once all channels run.
                self.cap_at_meter(reached, t, round);
                self.report.measured_bps = Some((reached * 8.0) as u64);
                // In steps of [`PROBE_GAIN`] only: on 1 Gbit/s × 60 ms × 64 packets a
                // meter 3.5 % low was raised to the link by a first probe that paid, and the
                // second, at twice its gain, offered 6 % over the link, and within 50 ms
                // channels lost three quarters of their windows (cubic needs seconds to
                // regrow them: the copies moved 80-88 % of the link).
                self.probe_gain_max = PROBE_GAIN;
                format!(
                    "the meter filled the path: bottleneck {:.1} Mbit/s; {}{}",
                    reached * 8e-6,
                    self.caps_said(),
                    self.capped_cc_note()
                )
            }
            (MeterEnd::Full, None) => format!(
                "the meter filled the path but saw too few samples to measure it ({:.1} Mbit/s): no pacing cap",
                reached * 8e-6
            ),
            (MeterEnd::WindowLimited, _) => format!(
                "a host's window held the meter at {:.1} Mbit/s: the path's rate is unknown, no pacing cap",
                reached * 8e-6
            ),
            (MeterEnd::Plateau, _) if est.rtt_or_default() >= LONG_PATH_RTT_S && reached > 0.0 => {
                // The path carried this without a loss: a floor for the estimate, which
                // probes raise once all channels run.
                self.cap_at_meter(reached, t, round);
                format!(
                    "the meter's rate stopped growing at {:.1} Mbit/s without filling the path (a limit of one channel's host): {}, probing above{}",
                    reached * 8e-6,
                    self.caps_said(),
                    self.capped_cc_note()
                )
            }
            (MeterEnd::Plateau, _) => format!(
                "the meter's rate stopped growing at {:.1} Mbit/s without filling the path: no pacing cap",
                reached * 8e-6
            ),
            (MeterEnd::Timeout, _) => format!(
                "the meter did not fill the path in {meter_max:.1} s ({:.1} Mbit/s): no pacing cap",
                reached * 8e-6
            ),
        };
        if self.cfg.pace {
            actions.extend(self.pace_all());
        }
        if let (Some(m), Some(s)) = (&self.cfg.meter_cc, self.cc_now()) {
            if *m != s {
                actions.push(Action::SetCc {
                    channel: 0,
                    name: s,
                });
            }
        }
        if let (None, Some(_), Some(steady)) =
            (self.rate, &self.cfg.capped_cc, self.cfg.steady_cc.clone())
        {
            // The others opened with the caps' congestion control: no caps now.
            actions.extend(self.switch_cc(1, &steady));
        }
        actions.push(Action::Release);
        self.decide(t - started, why);
        actions
    }

    /// Caps every channel from the meter's `rate`, with a first probe above it
    /// [`FIRST_PROBE_ROUNDS`] rounds after `t`.
    fn cap_at_meter(&mut self, rate: f64, t: f64, round: f64) {
        self.rate = Some(rate);
        self.reported_rate = rate;
        self.report.rate_bps = Some((rate * 8.0) as u64);
        self.next_probe = Some(t + FIRST_PROBE_ROUNDS * round);
    }

    /// The caps just set, in words: "pacing 4 channels at 231.9 Mbit/s each".
    fn caps_said(&self) -> String {
        format!(
            "pacing {} channels at {:.1} Mbit/s each",
            self.channels,
            self.cap().unwrap_or(0) as f64 * 8e-6
        )
    }

    /// The lowest total cap the meter had between `from` and `to`; `None` unless a cap was
    /// in force at `from` already.
    fn offered_between(&self, from: f64, to: f64) -> Option<f64> {
        let at_from = self.offered.iter().rev().find(|(at, _)| *at <= from)?.1;
        let later = self
            .offered
            .iter()
            .filter(|(at, _)| *at > from && *at <= to)
            .map(|(_, c)| *c);
        Some(later.fold(at_from, f64::min))
    }

    /// After the meter's first loss: stops raising the caps and brings them down to the most
    /// the path delivered, so the channels stop overfilling it while the round is measured.
    fn hold_meter(&mut self, est: &PathEstimator, since: f64) -> Vec<Action> {
        let most = est.channel_rate_since(0, since);
        if !self.cfg.pace || most <= 0.0 || self.meter_cap.is_some_and(|c| c <= most) {
            return Vec::new();
        }
        self.meter_cap = Some(most);
        vec![Action::Pace {
            channel: 0,
            rate: Some(most.ceil() as u64),
        }]
    }

    /// Raises the channels' caps to [`METER_GAIN`] × what they delivered over the last round,
    /// shared equally.
    fn ramp_meter(&mut self, t: f64, delivered: f64) -> Vec<Action> {
        if !self.cfg.pace || delivered <= 0.0 {
            return Vec::new();
        }
        let want = METER_GAIN * delivered;
        if self.meter_cap.is_some_and(|c| want < 1.05 * c) {
            return Vec::new();
        }
        self.meter_cap = Some(want);
        self.offered.push((t, want));
        vec![Action::Pace {
            channel: 0,
            rate: Some(want.ceil() as u64),
        }]
    }

    /// True when the meter's goodput, taken once per round, grew less than 25 % over the
    /// last [`PLATEAU_ROUNDS`] rounds (BBR's full-pipe test).
    fn plateaued(&mut self, est: &PathEstimator, t: f64, round: f64) -> bool {
        if self.rounds.last().is_some_and(|(at, _)| t - at < round) {
            return false;
        }
        let Some(g) = est.goodput(round) else {
            return false;
        };
        self.rounds.push((t, g));
        let n = self.rounds.len();
        // Slow start's first rounds deliver little and unevenly: judge only from the fifth.
        n > PLATEAU_ROUNDS + 4 && g > 0.0 && g < 1.25 * self.rounds[n - 1 - PLATEAU_ROUNDS].1
    }
}
