//! Keeping the estimate honest while the channels run at their caps: the caps creep up to it,
//! repeated losses at them lower it, and probes above it keep what the path delivered.

use super::{queued, OnlineTuner, Probe, PACE_GAIN, PACE_GAIN_MAX, SETTLE_S, TICK_S};
use crate::tuning::estimate::{PathEstimator, Tick};

/// The caps creep up by this fraction of the estimate every [`CREEP_ROUNDS`] rounds without
/// a loss.
const CREEP_STEP: f64 = 0.005;
const CREEP_ROUNDS: f64 = 8.0;

/// A channel delivering this share of its cap or more sends at it (a probe may start).
const CHANNEL_AT_CAP: f64 = 0.8;

/// A probe raises the caps' total by this factor at first, more after each probe that
/// paid, up to [`PROBE_GAIN_MAX`]. After a larger probe that did not pay, probes stay at this
/// gain until one of them does not pay either.
pub(super) const PROBE_GAIN: f64 = 1.05;
pub(super) const PROBE_GAIN_MAX: f64 = 1.25;

/// Rounds of a probe whose delivery-rate samples still measure what was sent before it, and
/// rounds measured after them.
const PROBE_LAG_ROUNDS: f64 = 2.0;
const PROBE_ROUNDS: f64 = 2.0;

/// A probe lasts four rounds, or longer when the caps send fewer segments than this in that
/// time: a few percent must stand out of the count's noise. At 12.4 Mbit/s × 60 ms, two
/// rounds' deliveries varied by 3 %, about what a 5 % probe must show, and probes above a
/// rate saved far too low failed on the lab path with 0.01 % loss.
const PROBE_SEGMENTS: f64 = 1000.0;

/// The shortest a probe runs, seconds, however many segments it sends: a tenth of a second
/// of samples at the least. Caps over the path overfill a tiny queue every round they last:
/// on path (a) a probe of half a second 4 % over the link (a meter 1.8 % high) cut every
/// channel's window two or three times, and the copy moved 74 % of the link.
const PROBE_SPAN_MIN_S: f64 = 0.25;

/// The longest a probe runs, seconds (below 1.2 Mbit/s the segments take longer).
const PROBE_SPAN_MAX_S: f64 = 10.0;

/// Seconds to wait after a probe that did not pay, doubled after each one, up to
/// [`PROBE_INTERVAL_MAX_S`].
pub(super) const PROBE_INTERVAL_S: f64 = 30.0;
const PROBE_INTERVAL_MAX_S: f64 = 240.0;

/// Seconds from the start to the first probe above a saved rate. On a tiny queue a probe
/// above a right rate costs a loss whose windows take seconds to grow back: a transfer must
/// run long enough to gain that back if the rate was low (probed at 8 rounds, plain copies
/// of 10 s from a right profile on 200 Mbit/s × 40 ms × 16 packets moved 5 % less).
pub(super) const SAVED_RATE_PROBE_S: f64 = 10.0;

/// Seconds from a lowered estimate to the next probe (competing traffic may leave).
const PROBE_AFTER_CUT_S: f64 = 10.0;

/// A loss while the channels send at this share of their caps or more is their own doing:
/// the rate estimate is lowered by [`CUT`].
const AT_CAPS: f64 = 0.9;
const CUT: f64 = 0.98;

/// Two losses at the caps within this many rounds lower the estimate (at most four times in
/// that span).
pub(super) const CUT_SPAN_ROUNDS: f64 = 20.0;

/// Seconds after a probe paid during which losses at caps below what it took are random
/// loss: the path carried more than the caps without them.
const PAID_PROOF_S: f64 = 10.0;

impl OnlineTuner {
    /// Keeps the estimated rate honest while the channels run at their caps: repeated losses
    /// at the caps lower it by 2 % (it was high, or other traffic arrived); 10 s after such a
    /// cut, soon after the meter, or 10 s after a saved rate's first use, a probe raises the
    /// caps by 5 % (more after each that paid) for four rounds, [`PROBE_SPAN_MIN_S`] or
    /// [`PROBE_SEGMENTS`], whichever is longest, and keeps what the path delivered if more
    /// than the estimate. Probes that do not pay come less and less often.
    pub(super) fn control_rate(&mut self, est: &PathEstimator, tick: &Tick, round: f64) {
        let (Some(rate), Some(total)) = (self.rate, self.total()) else {
            return;
        };
        let t = tick.t;
        let delivered = est.goodput(round.max(2.0 * TICK_S)).unwrap_or(0.0);
        // Probes compare two rounds of deliveries: one round is too noisy for a few percent.
        let delivered2 = est.goodput(2.0 * round.max(2.0 * TICK_S)).unwrap_or(0.0);
        let lost = !tick.new_losses.is_empty();
        if let Some(p) = self.probe {
            if t - p.since >= p.span {
                // What the probe's caps delivered, by the kernel's delivery-rate samples: each
                // measures what was sent one to two rounds before it, so only those from the
                // probe's third round on. The delivered counts between ticks vary too much for
                // a few percent: on path (a) a probe whose channels delivered 937-941 Mbit/s
                // read 913-920 that way, under the 935 estimate, and the caps stayed 2 %
                // under the link. Never more than the probe's caps allowed.
                self.probe = None;
                self.probe_ended = t;
                if let Some((srtt, min)) = self.queue_standing(est, round) {
                    // Above the path a deep queue absorbs the excess without a loss, and the
                    // kernel's delivery-rate samples, summed over the channels, read above the
                    // link: such probes raised the estimate to 968-1003 Mbit/s on 1 Gbit/s ×
                    // 60 ms with a 1-BDP queue (ceiling 956), where caps over the link kept the
                    // queue full and one cubic flow beside the copy moved 57 Mbit/s.
                    self.probe_gain_max = PROBE_GAIN;
                    self.probe_later(t);
                    self.reshare_soon();
                    let since_start = t - self.started.unwrap_or(t);
                    self.decide(
                        since_start,
                        format!(
                            "a probe above {:.1} Mbit/s filled a queue on the path (smoothed RTT {:.1} ms, least {:.1} ms): the path is full, the estimate stays",
                            p.before * 8e-6,
                            srtt as f64 / 1e3,
                            min as f64 / 1e3
                        ),
                    );
                    return;
                }
                let during = est
                    .delivery_rate_since(p.since + PROBE_LAG_ROUNDS * round)
                    .unwrap_or(0.0)
                    .min(p.before * p.gain);
                // What the path delivered above the estimate is the new estimate, whether
                // or not the probe paid (a meter 3 % low stayed low when only probes that paid
                // counted). Not that over the pacing gain: a probe that filled the path
                // delivered the path's rate, and 3 % above it the caps met at the bottleneck
                // (probes above a meter's rate on 200 Mbit/s × 40 ms × 16 packets then raised
                // 189 to 197-199 Mbit/s, over the 191 the path carries). A loss during the
                // probe does not undo what was delivered; through random loss most probes
                // see one (a loss vetoed them, and a rate saved 10x low on a path with 0.01 %
                // loss stayed there).
                if during > rate {
                    self.rate = Some(during);
                    self.report.measured_bps = Some((during * 8.0) as u64);
                    self.lift_ceiling();
                }
                self.next_probe = Some(t + 4.0 * round);
                if during >= p.before * (1.0 + 0.75 * (p.gain - 1.0)) {
                    // It paid: a higher probe follows soon.
                    self.paid = Some((t, during));
                    self.probe_gain = (self.probe_gain * 2.0 - 1.0).min(self.probe_gain_max);
                    self.probe_retried = false;
                } else if p.gain > PROBE_GAIN {
                    // It overshot: the path may still carry more than the estimate, in
                    // smaller steps. On path (a) a probe 20 % above caps at 859 Mbit/s took
                    // less than the estimate, and the copy stayed there (85.8 % of the link).
                    self.probe_gain = PROBE_GAIN;
                    self.probe_gain_max = PROBE_GAIN;
                } else if during > rate && !self.probe_retried {
                    // It took more than the estimate but too little to pay: a few percent
                    // over half a second on a busy host is within the readings' noise (on
                    // path (a), 887 of the 900 Mbit/s offered, and the copy stayed at 887
                    // where others ran at 946). Once more.
                    self.probe_retried = true;
                } else {
                    // It took no more than the estimate, or twice too little: the next
                    // comes later, from the least gain.
                    self.probe_gain_max = PROBE_GAIN_MAX;
                    self.probe_later(t);
                }
                self.reshare_soon();
            }
        } else if lost
            && t - self.probe_ended >= PROBE_LAG_ROUNDS * round
            && delivered >= AT_CAPS * total
        {
            // Not within two rounds of a probe's end: a loss is seen a round or more after
            // what overfilled the queue was sent. Taken for the caps' own, the losses of a probe
            // that overshot stopped them creeping above 97 % of an estimate 0.8 % under the
            // link on path (a), for the rest of the copy.
            let proven = self
                .paid
                .is_some_and(|(at, took)| t - at < PAID_PROOF_S && total < took);
            if proven {
                // Below what a probe just took, losses at the caps are not theirs: they count
                // as random loss. Cut instead, on 1 Gbit/s × 60 ms × 1 BDP with 0.1 % loss,
                // caps from a meter that met an early loss (14.5 Mbit/s) went up with probes
                // that paid and down with random losses for 4 minutes (1.8-1.9 % of the link).
                self.count_random_loss(t, round);
                return;
            }
            if self.pace_gain > PACE_GAIN {
                // Crept up over the path: back to the start, and never this high again with
                // this estimate. Except soon after such a loss at a higher gain: a cut window
                // regrowing overfills a tiny queue more easily for a while, so the ceiling only
                // steps down from where it was. On 1 Gbit/s × 60 ms × 64 packets, a second loss
                // at 97.5-98 % came 0.6-1.3 s after one at 100 % in 3 of 6 first copies, and set
                // the ceiling to 97-97.5 % for the rest (93.0-93.8 % of the link, against
                // 94.7-95.2 % where it stayed at 98.5-99.5 %).
                let aftermath = self
                    .creep_loss
                    .is_some_and(|(at, gain)| t - at < SETTLE_S && self.pace_gain < gain);
                self.gain_ceiling = if aftermath {
                    (self.gain_ceiling - CREEP_STEP).max(PACE_GAIN)
                } else {
                    self.pace_gain - CREEP_STEP
                };
                self.creep_loss = Some((t, self.pace_gain));
                let since = t - self.started.unwrap_or(t);
                self.decide(
                    since,
                    format!(
                        "a loss with the caps at {:.1} % of the bottleneck estimate: back to {:.0} %, then up to {:.1} %",
                        self.pace_gain * 100.0,
                        PACE_GAIN * 100.0,
                        self.gain_ceiling * 100.0
                    ),
                );
                self.set_pace_gain(PACE_GAIN, t);
                return;
            }
            // One loss may be a stall of a busy host; repeated losses at the caps are not.
            self.losses_at_caps
                .retain(|at| t - at <= CUT_SPAN_ROUNDS * round);
            self.losses_at_caps.push(t);
            if self.losses_at_caps.len() < 2 || t - self.last_cut < CUT_SPAN_ROUNDS * round / 4.0 {
                return;
            }
            self.lower_estimate(rate * CUT, t);
        } else if !lost
            && self.next_probe.is_some_and(|n| t >= n)
            && delivered2 >= 0.95 * total
            && est.last_loss_at().is_none_or(|at| t - at >= 4.0 * round)
            && self.channels_at_caps(est, round)
        {
            // Judged against what the caps allowed, not a reading that the ACK stream's noise
            // may have put above them: a probe must take more than the caps, not more than a
            // lucky reading.
            let mss = est.latest(0).map_or(1448.0, |s| s.mss.max(1) as f64);
            self.probe = Some(Probe {
                since: t,
                span: ((PROBE_LAG_ROUNDS + PROBE_ROUNDS) * round)
                    .max(PROBE_SPAN_MIN_S)
                    .max((PROBE_SEGMENTS * mss / total).min(PROBE_SPAN_MAX_S)),
                before: total,
                gain: self.probe_gain,
            });
            self.reshare_soon();
        } else if !lost
            && self.pace_gain < self.gain_ceiling
            && t - self.last_creep >= CREEP_ROUNDS * round
            && delivered2 >= 0.95 * total
            && est
                .last_loss_at()
                .is_none_or(|at| t - at >= CREEP_ROUNDS * round)
        {
            let gain = (self.pace_gain + CREEP_STEP).min(self.gain_ceiling);
            self.set_pace_gain(gain, t);
        }
        if let Some(r) = self.rate {
            self.report.rate_bps = Some((r * 8.0) as u64);
            if (r - self.reported_rate).abs() > 0.05 * self.reported_rate {
                let was = self.reported_rate;
                self.reported_rate = r;
                let since = t - self.started.unwrap_or(t);
                self.decide(
                    since,
                    format!(
                        "bottleneck estimate {:.1} Mbit/s (was {:.1}): {}",
                        r * 8e-6,
                        was * 8e-6,
                        if r > was {
                            "a probe above it was delivered"
                        } else {
                            "losses at the caps"
                        }
                    ),
                );
            }
        }
    }

    /// Lowers the estimate to `rate` at `t`: the caps are re-shared at the next tick, and a
    /// probe comes [`PROBE_AFTER_CUT_S`] later (competing traffic may leave).
    pub(super) fn lower_estimate(&mut self, rate: f64, t: f64) {
        self.rate = Some(rate);
        self.last_cut = t;
        self.lift_ceiling();
        let after_cut = t + PROBE_AFTER_CUT_S;
        self.next_probe = Some(self.next_probe.map_or(after_cut, |n| n.min(after_cut)));
        self.reshare_soon();
    }

    /// A new estimate: the caps may creep up to all of it again, and losses at caps crept up
    /// over the old one say nothing about it.
    fn lift_ceiling(&mut self) {
        self.gain_ceiling = PACE_GAIN_MAX;
        self.creep_loss = None;
    }

    /// After a probe that did not pay at `t`: the next starts from the least gain, after
    /// [`PROBE_INTERVAL_S`], twice that after the next such probe, up to
    /// [`PROBE_INTERVAL_MAX_S`].
    fn probe_later(&mut self, t: f64) {
        self.probe_gain = PROBE_GAIN;
        self.probe_retried = false;
        self.next_probe = Some(t + self.probe_interval);
        self.probe_interval = (self.probe_interval * 2.0).min(PROBE_INTERVAL_MAX_S);
    }

    /// Sets the caps' share of the estimate at `t`; they are re-shared at the next tick.
    fn set_pace_gain(&mut self, gain: f64, t: f64) {
        self.pace_gain = gain;
        self.last_creep = t;
        self.reshare_soon();
    }

    /// The smoothed and least RTT (µs) of a channel still sending whose smoothed RTT is
    /// [`QUEUE_RTT_GROWTH`](super::QUEUE_RTT_GROWTH) times its least or more: a queue stands
    /// on the path. A tiny bottleneck queue never shows (64 packets at 1 Gbit/s hold 0.8 ms),
    /// but an end host's may: on the lab's path (a), whose hosts share one core, the smoothed
    /// RTT reached 69-83 ms over a least of 60 at the end of most probes.
    fn queue_standing(&self, est: &PathEstimator, round: f64) -> Option<(u32, u32)> {
        (0..self.channels as usize)
            .filter(|&i| !est.idle(i, 2.0 * round))
            .filter_map(|i| est.latest(i))
            .filter(|s| queued(s))
            .map(|s| (s.rtt_us, s.min_rtt_us))
            .max_by_key(|&(srtt, min)| u64::from(srtt) * 1000 / u64::from(min))
    }

    /// Whether every channel still sending delivers close to its cap (the kernel's latest
    /// delivery-rate sample). A probe that starts while channels are still ramping up measures
    /// their windows, not the path: at 1 Gbit/s × 240 ms slow start takes seconds, the first
    /// probe came while four of five channels delivered a quarter of their caps, took no more
    /// than the estimate, and the next came 30 s later (DMCTCP ×5 at half the link).
    fn channels_at_caps(&self, est: &PathEstimator, round: f64) -> bool {
        self.caps.iter().enumerate().all(|(i, cap)| {
            !cap.is_finite()
                || est.idle(i, 2.0 * round)
                || est
                    .latest(i)
                    .is_some_and(|s| s.delivery_rate as f64 >= CHANNEL_AT_CAP * cap)
        })
    }
}
