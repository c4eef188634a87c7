//! The per-channel caps: a total shared max-min fair over what each window allows, so that a
//! channel its window holds back leaves the rest to the others.

use super::{Action, OnlineTuner};
use crate::tuning::estimate::PathEstimator;

/// A channel held back by its window is capped this much above what the window allows: room
/// to grow, which the other channels' caps give up. At 1.1, two channels whose windows carried
/// 211 Mbit/s after a loss (cubic regrowing for 10 s and more) were capped at 232 on path (a),
/// and the four channels moved 95 % of their caps for the rest of the copy. More than
/// [`RESHARE_STEP`] above 1, or a growing window would meet its cap before the cap moves.
const WINDOW_HEADROOM: f64 = 1.05;

/// Caps are re-shared only when one moves by more than this fraction, or after the total
/// changed on purpose; then all of them.
const RESHARE_STEP: f64 = 0.02;

impl OnlineTuner {
    /// Every channel at an equal share of the total now, or at TCP's own pacing with no cap
    /// when the rate is unknown.
    pub(super) fn pace_all(&mut self) -> Vec<Action> {
        let rate = self.cap();
        self.caps = vec![rate.map_or(f64::INFINITY, |r| r as f64); self.channels as usize];
        (0..self.channels as usize)
            .map(|channel| Action::Pace { channel, rate })
            .collect()
    }

    /// Re-shares the caps once a round: a channel its window holds below an equal share (a
    /// loss cut it, or it is still growing) leaves the rest to the others, so together they
    /// still send at the pacing gain × rate.
    pub(super) fn reshare(&mut self, est: &PathEstimator, t: f64, round: f64) -> Vec<Action> {
        let Some(total) = self.total().filter(|_| self.cfg.pace) else {
            return Vec::new();
        };
        if t - self.last_share < round {
            return Vec::new();
        }
        self.last_share = t;
        let step = if std::mem::take(&mut self.total_changed) {
            0.0
        } else {
            RESHARE_STEP
        };
        // What each window allows over the next round: a channel in slow start doubles it.
        let allowed: Vec<f64> = (0..self.channels as usize)
            .map(|i| match est.latest(i) {
                Some(s) if s.rtt_us > 0 => {
                    let growth = if s.cwnd < s.ssthresh { 2.0 } else { 1.0 };
                    growth * s.cwnd as f64 * s.mss as f64 / (s.rtt_us as f64 / 1e6)
                }
                _ => f64::INFINITY,
            })
            .collect();
        // A channel out of data (the last blocks of a transfer went to the others) leaves its
        // share to those still sending, and keeps its cap should it get data again (the next
        // round shares the total anew). Held at their equal shares, the last channels of a
        // 200 MiB copy on 200 Mbit/s x 40 ms moved half the rate for the last 0.6 s.
        let sending: Vec<usize> = (0..allowed.len())
            .filter(|&i| !est.idle(i, 2.0 * round))
            .collect();
        let shared = share_caps(
            total,
            &sending.iter().map(|&i| allowed[i]).collect::<Vec<_>>(),
        );
        self.caps.resize(allowed.len(), f64::INFINITY);
        // All caps move together, when one of them moves by more than the step: the caps in
        // force are always one sharing of the total. Each on its own, one channel's cap rose
        // while another's smaller fall waited, and together they went over the link.
        let moved = sending.iter().zip(&shared).any(|(&channel, &cap)| {
            let old = self.caps[channel];
            (cap - old).abs() > step * old.min(cap)
        });
        if !moved {
            return Vec::new();
        }
        let mut actions = Vec::new();
        for (channel, cap) in sending.into_iter().zip(shared) {
            let old = self.caps[channel];
            if cap != old {
                self.caps[channel] = cap;
                actions.push(Action::Pace {
                    channel,
                    rate: Some(cap.ceil() as u64),
                });
            }
        }
        actions
    }

    /// Has the caps re-shared at the next tick, after the total changed.
    pub(super) fn reshare_soon(&mut self) {
        self.last_share = f64::NEG_INFINITY;
        self.total_changed = true;
    }
}

/// Shares a `total` rate among channels whose windows allow `allowed[i]` (bytes/s) the
/// max-min fair way: a channel whose window allows less than an equal share of what is left
/// gets what it allows and `WINDOW_HEADROOM` more (room to grow; its window holds it
/// back anyway), and the others share the rest equally.
pub fn share_caps(total: f64, allowed: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..allowed.len()).collect();
    order.sort_by(|a, b| allowed[*a].total_cmp(&allowed[*b]));
    let mut caps = vec![0.0; allowed.len()];
    let mut left = total;
    for (k, &i) in order.iter().enumerate() {
        let equal = left / (order.len() - k) as f64;
        let want = allowed[i] * WINDOW_HEADROOM;
        if want < equal {
            caps[i] = want;
            left -= want;
        } else {
            for &j in &order[k..] {
                caps[j] = equal;
            }
            break;
        }
    }
    caps
}
