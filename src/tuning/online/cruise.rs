//! While all channels run: the order of the decisions each tick, and random loss (losses
//! while the channels send well below their caps), which removes the caps.

use super::{Action, OnlineTuner, SETTLE_S};
use crate::channels::control::Policy;
use crate::tuning::estimate::{PathEstimator, Tick};

/// Losses below the caps within [`LOSSY_SPAN_S`] that mark a path lossy (random loss).
const LOSSY_LOSSES: usize = 3;
const LOSSY_SPAN_S: f64 = 5.0;

/// Goodput below this share of the caps is "below the caps" (not self-congestion).
const BELOW_CAPS: f64 = 0.85;

/// Losses below the caps after the channels delivered at least this share of them are
/// first taken for an estimate above the path (an overfilled tiny queue cuts the windows
/// and leaves goodput below the caps too): under random loss the windows, not the caps,
/// hold the channels well below them.
const REACHED_CAPS: f64 = 0.85;

/// Span of the delivery-rate readings whose most is what the path delivered, seconds (at
/// least four rounds). Not the delivered counts between ticks: over half a second they read
/// up to 6 % above the caps on path (a), and a reading of 964 Mbit/s on its 956 lowered
/// an estimate 1 % high to itself, not under the link.
pub(super) const BEST_SPAN_S: f64 = 0.5;

impl OnlineTuner {
    /// One tick once all channels run: losses below the caps are counted first, then the
    /// estimate is kept honest ([`Self::control_rate`]), random loss removes the caps, the
    /// caps are re-shared and the channel count is judged.
    pub(super) fn cruise(&mut self, est: &PathEstimator, tick: &Tick) -> Vec<Action> {
        let t = tick.t;
        let since_start = t - self.started.unwrap_or(t);
        let round = Self::round(est);
        let mut actions = Vec::new();
        // Losses while the channels send well below their caps, once they have settled, are
        // not caused by them. What they sent is read from the kernel's samples of the last two
        // rounds (what was sent before the loss): between ticks a round's delivered count
        // reads anything from none to twice the link after a stall of the ACK stream.
        let settled = t - self.last_change >= SETTLE_S.max(20.0 * round);
        if let (Some(total), false, true) =
            (self.steady_total(), tick.new_losses.is_empty(), settled)
        {
            let sent = est.delivery_rate_since(t - 2.0 * round).unwrap_or(0.0);
            if sent < BELOW_CAPS * total {
                self.count_random_loss(t, round);
            }
        }
        if let Some(g) = est.delivery_rate_since(t - BEST_SPAN_S.max(4.0 * round)) {
            self.best_delivered = self.best_delivered.max(g);
        }
        if self.cfg.pace {
            self.control_rate(est, tick, round);
        }
        self.below_cap_losses.retain(|at| t - at <= LOSSY_SPAN_S);
        if !self.report.lossy && self.below_cap_losses.len() >= LOSSY_LOSSES {
            if let Some(why) = self.recheck(t) {
                if self.cfg.pace {
                    actions.extend(self.pace_all());
                }
                self.decide(since_start, why);
                return actions;
            }
            self.report.lossy = true;
            self.rate = None;
            // Removing the caps is a change: a channel count judged against goodput measured
            // under the caps (or during the meter) is judged against another transfer.
            self.last_change = t;
            let mut why =
                "losses while the channels sent below the path's rate: random loss, caps removed"
                    .to_string();
            if self.cfg.pace {
                actions.extend(self.pace_all());
            }
            if self.cfg.policy == Policy::Fast && self.cfg.bbr_usable {
                why.push_str(
                    "; switching to bbr (`policy` fast), which does not back off on random loss",
                );
                actions.extend(self.switch_cc(0, "bbr"));
            } else if let (Some(capped), Some(steady)) =
                (self.cfg.capped_cc.clone(), self.cfg.steady_cc.clone())
            {
                why.push_str(&format!(
                    "; {capped} only ran under the caps: back to {steady}"
                ));
                actions.extend(self.switch_cc(0, &steady));
            }
            self.decide(since_start, why);
        }
        actions.extend(self.reshare(est, t, round));
        actions.extend(self.control_count(est, t, round, since_start));
        actions
    }

    /// Once, before losses below the caps are called random: when the channels had
    /// delivered close to their caps, the estimate may be what was wrong (a meter that read
    /// a few percent high puts the caps above the path, the tiny queue overflows, and the
    /// cut windows leave goodput below the caps). The estimate falls to the most the path
    /// delivered, at most to what the caps allowed, and losses must go on below the new caps
    /// to be random. Measured at 1 Gbit/s × 60 ms × 64 packets: meters 6–13 % high, and
    /// copies whose caps were then removed moved 72–79 % of the link where the others moved
    /// 87–94 %.
    fn recheck(&mut self, t: f64) -> Option<String> {
        let (was, total) = (self.rate?, self.steady_total()?);
        // Not above the caps: the most of many half-second readings is itself high. A meter
        // that read 1,002 Mbit/s on path (a)'s 956 put the caps at 972, a reading reached
        // them, and the caps were removed (78 % of the link).
        let rate = self.best_delivered.min(total);
        if self.rechecked || rate < REACHED_CAPS * total {
            return None;
        }
        self.rechecked = true;
        self.lower_estimate(rate, t);
        // Said here, not as a cut at the caps.
        self.reported_rate = rate;
        self.report.rate_bps = Some((rate * 8.0) as u64);
        // What the full path delivered is a measurement: a profile must not keep the high one.
        self.report.measured_bps = Some((rate * 8.0) as u64);
        self.below_cap_losses.clear();
        self.last_change = t;
        Some(format!(
            "losses below the caps after the channels delivered {:.1} Mbit/s: bottleneck estimate lowered to that (was {:.1}); random loss if they go on",
            rate * 8e-6,
            was * 8e-6
        ))
    }

    /// Counts a loss at `t` that the caps did not cause, at most one a round.
    pub(super) fn count_random_loss(&mut self, t: f64, round: f64) {
        if self
            .below_cap_losses
            .last()
            .is_none_or(|at| t - at >= round)
        {
            self.below_cap_losses.push(t);
        }
    }
}
