//! DMCTCP (Cui 2013 ch. 5.5): one connection of m channels through one path whose channels
//! coordinate so that at most the largest one cuts per congestion event. Losses on smaller
//! channels (or within one RTT of the group's last cut) are repaired without a cut, which
//! desynchronizes the sawtooths and raises the link utilization (eq. 5.3, Table 5.1).
//!
//! Rules (Cui 2013 L1024–1029, with `time_c` the time of the group's last cut):
//! - loss on channel i at `time_i`: w_i ← w_i/2 if w_i = w_max and `time_i − time_c > rtt`
//!   (then `time_c ← time_i`); otherwise no change;
//! - per ACKed segment on channel i: w_i += 1/w_i if w_i = w_min, else 1/(w_total − w_min);
//! - slave channels still in slow start share the ssthresh of the first cut (L1037);
//! - 2 ≤ m ≤ 32 (L1022, L1039).
//!
//! Ties: a channel equal to the largest window counts as the largest, one equal to the
//! smallest as the smallest. The halving uses the kernel's integer form, `max(cwnd >> 1, 2)`.
//!
//! [`DmcGroup`] is Cui 2013's rules as published. hsxfer's BPF program (`bpf/dmctcp.bpf.c`)
//! keeps its cut rule and adds two things (docs/cc.md):
//! - growth: each channel grows by the larger of the rule above and its share of the group's
//!   [`GroupCurve`], so that after a cut the group's total climbs back the way one CUBIC flow
//!   would (the rule above alone adds about 2 segments per RTT to the whole group: 14 s to win
//!   back a cut at 1 Gbit/s × 60 ms, over a minute at 240 ms);
//! - idle channels: a channel that has not acknowledged anything for two RTTs is left out of
//!   the comparisons, so its stale window cannot keep every loss of the busy ones.

use super::reno::reno_ssthresh;

/// Name the DMCTCP BPF program registers.
pub const NAME: &str = "dmctcp";

/// The name of the build with Cui 2013's rules only (growth counted per ACK, no group curve,
/// no pacing of its own), kept for research comparisons.
pub const CLASSIC: &str = "dmctcp_classic";

/// Whether congestion control `cc` runs its channels as a DMCTCP group.
///
/// # Examples
///
/// ```
/// use hsxfer::tuning::models::dmctcp::grouped;
/// assert!(grouped("dmctcp") && grouped("dmctcp_classic") && !grouped("cubic"));
/// ```
pub fn grouped(cc: &str) -> bool {
    cc == NAME || cc == CLASSIC
}
/// Fewest channels a group can have (two must be able to coordinate; Cui 2013 L1022).
pub const MIN_CHANNELS: usize = 2;
/// Most channels (the MPTCP subflow limit the seed's implementation inherited; L1039).
pub const MAX_CHANNELS: usize = 32;

/// Ideal average link utilization of a desynchronized m-channel connection in a bufferless
/// bottleneck, Cui 2013 eq. (5.3): 1 − β/(2m), with β the decrease (1/2 for DMCTCP).
pub fn ideal_utilization(m: usize, beta: f64) -> f64 {
    1.0 - beta / (2.0 * m as f64)
}

/// One channel of a group.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DmcChannel {
    /// Congestion window, segments.
    pub cwnd: f64,
    /// Slow-start threshold, segments (`f64::INFINITY` for "not set yet").
    pub ssthresh: f64,
}

impl DmcChannel {
    /// Whether the channel is in slow start (cwnd < ssthresh, as the kernel's test).
    pub fn in_slow_start(&self) -> bool {
        self.cwnd < self.ssthresh
    }
}

/// What a loss on one channel does under the group rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LossDecision {
    /// The channel was the largest and the last cut is over one RTT old: it halves.
    Cut {
        /// The channel's new ssthresh (and window after recovery).
        new_ssthresh: f64,
    },
    /// Repair the loss, keep the window (a smaller channel, or a cut within the last RTT).
    Keep,
}

/// The state of one DMCTCP connection: its channels and the group's cut history.
#[derive(Debug, Clone, PartialEq)]
pub struct DmcGroup {
    /// The channels, in channel order.
    pub channels: Vec<DmcChannel>,
    /// Time of the group's last cut (`time_c`), `None` before the first.
    pub last_cut: Option<f64>,
    /// Losses that cut a window.
    pub cuts: u64,
    /// Losses repaired without a cut.
    pub losses_kept: u64,
}

impl DmcGroup {
    /// A group with these windows, all with ssthresh `initial_ssthresh` (`f64::INFINITY`:
    /// every channel in slow start; 0: every channel in congestion avoidance).
    ///
    /// # Panics
    /// If the number of windows is outside 2..=32.
    pub fn new(windows: &[f64], initial_ssthresh: f64) -> Self {
        assert!(
            (MIN_CHANNELS..=MAX_CHANNELS).contains(&windows.len()),
            "DMCTCP needs 2..=32 channels, got {}",
            windows.len()
        );
        Self {
            channels: windows
                .iter()
                .map(|&cwnd| DmcChannel {
                    cwnd,
                    ssthresh: initial_ssthresh,
                })
                .collect(),
            last_cut: None,
            cuts: 0,
            losses_kept: 0,
        }
    }

    /// The channels' windows.
    pub fn windows(&self) -> Vec<f64> {
        self.channels.iter().map(|c| c.cwnd).collect()
    }

    /// w_total, the sum of the windows.
    pub fn total(&self) -> f64 {
        self.channels.iter().map(|c| c.cwnd).sum()
    }

    /// w_min, the smallest window.
    pub fn min(&self) -> f64 {
        self.channels
            .iter()
            .map(|c| c.cwnd)
            .fold(f64::INFINITY, f64::min)
    }

    /// w_max, the largest window.
    pub fn max(&self) -> f64 {
        self.channels
            .iter()
            .map(|c| c.cwnd)
            .fold(f64::NEG_INFINITY, f64::max)
    }

    /// A loss detected on channel `i` at time `now` (seconds), the path's RTT `rtt`: cut the
    /// channel (and record the cut) or keep it, and count the outcome. On the group's first
    /// cut, channels still in slow start take the cut's ssthresh.
    pub fn on_loss(&mut self, i: usize, now: f64, rtt: f64) -> LossDecision {
        let largest = self.channels[i].cwnd >= self.max();
        let cut_over = self.last_cut.is_none_or(|t| now - t > rtt);
        if !(largest && cut_over) {
            self.losses_kept += 1;
            return LossDecision::Keep;
        }
        let new_ssthresh = reno_ssthresh(self.channels[i].cwnd);
        if self.last_cut.is_none() {
            for c in self.channels.iter_mut().filter(|c| c.in_slow_start()) {
                c.ssthresh = new_ssthresh;
            }
        }
        let c = &mut self.channels[i];
        c.cwnd = new_ssthresh;
        c.ssthresh = new_ssthresh;
        self.last_cut = Some(now);
        self.cuts += 1;
        LossDecision::Cut { new_ssthresh }
    }

    /// Growth of channel `i` per acknowledged segment: 1 in slow start; in congestion
    /// avoidance 1/w_i for the smallest channel, 1/(w_total − w_min) for the others.
    pub fn increase_per_acked_segment(&self, i: usize) -> f64 {
        let c = &self.channels[i];
        if c.in_slow_start() {
            return 1.0;
        }
        let w_min = self.min();
        if c.cwnd <= w_min {
            1.0 / c.cwnd
        } else {
            1.0 / (self.total() - w_min)
        }
    }

    /// `acked` segments acknowledged on channel `i`: grow its window by the per-segment rule
    /// (evaluated once, so keep `acked` small next to the windows).
    pub fn on_ack(&mut self, i: usize, acked: f64) {
        let inc = acked * self.increase_per_acked_segment(i);
        self.channels[i].cwnd += inc;
    }

    /// Growth of the whole group over one RTT at the current windows (channel i acknowledges
    /// w_i segments). In congestion avoidance with one smallest channel this is 2: 1 for the
    /// smallest, and the others share (w_total − w_min)/(w_total − w_min) = 1 (Cui 2013 L1031,
    /// "roughly α = 2"). With k channels tied for smallest it is k + (w_total − k·w_min) /
    /// (w_total − w_min), so m when all windows are equal.
    pub fn increase_per_rtt_total(&self) -> f64 {
        (0..self.channels.len())
            .map(|i| self.channels[i].cwnd * self.increase_per_acked_segment(i))
            .sum()
    }

    /// Fluid simulation of the group through a bufferless bottleneck of `capacity_w`
    /// segments per RTT; returns w_total at the start of each of `rtts` RTTs. Each RTT every
    /// channel grows by its per-RTT share; when w_total exceeds the capacity every channel
    /// sees a loss in that RTT (complete loss synchronization, the case DMCTCP is built
    /// for), handled in channel order at the same time.
    pub fn simulate(&mut self, rtts: usize, capacity_w: f64, rtt: f64) -> Vec<f64> {
        let mut trace = Vec::with_capacity(rtts);
        for k in 0..rtts {
            let total = self.total();
            trace.push(total);
            if total > capacity_w {
                let now = k as f64 * rtt;
                for i in 0..self.channels.len() {
                    self.on_loss(i, now, rtt);
                }
            } else {
                let inc: Vec<f64> = (0..self.channels.len())
                    .map(|i| self.channels[i].cwnd * self.increase_per_acked_segment(i))
                    .collect();
                for (c, d) in self.channels.iter_mut().zip(inc) {
                    c.cwnd += d;
                }
            }
        }
        trace
    }
}

/// The growth curve of a DMCTCP group after a cut, CUBIC's form (RFC 9438) applied to the
/// group's total window: W(t) = C (t − K)³ + w_max, with w_max the total just before the cut
/// and K = ∛(drop / C) the time it takes to climb back (t in seconds since the cut).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupCurve {
    /// The group's total window just before the cut, segments.
    pub w_max: f64,
    /// Seconds the curve takes to return to `w_max`.
    pub k: f64,
}

impl GroupCurve {
    /// C, segments/s³: below CUBIC's 0.4 per flow, since the group's cuts are smaller
    /// (half the largest of m windows, about 1/(2m) of the total, against CUBIC's 30 %).
    pub const C: f64 = 0.3;

    /// The curve after a cut that took `drop` segments off a total of `w_max`.
    pub fn after_cut(w_max: f64, drop: f64) -> Self {
        Self {
            w_max,
            k: (drop.max(0.0) / Self::C).cbrt(),
        }
    }

    /// The curve's total window `t` seconds after the cut.
    pub fn target(&self, t: f64) -> f64 {
        (Self::C * (t - self.k).powi(3) + self.w_max).max(0.0)
    }

    /// Growth per acknowledged segment, for any channel of a group whose total is `total`,
    /// `t` seconds after the cut (the program looks one RTT ahead, as CUBIC does): each
    /// channel grows by w_i (W − total)/total per RTT, so the group by W − total, but no
    /// channel by more than half its window. `None` while the curve is at or below the total.
    pub fn increase_per_acked_segment(&self, total: f64, t: f64) -> Option<f64> {
        let target = self.target(t);
        (target > total && total > 0.0).then(|| ((target - total) / total).min(0.5))
    }
}

#[cfg(test)]
mod tests {
    use super::super::loss_rtts;
    use super::super::test_util::mean;
    use super::*;

    const RTT: f64 = 0.1;

    fn ca(windows: &[f64]) -> DmcGroup {
        DmcGroup::new(windows, 0.0)
    }

    #[test]
    #[should_panic(expected = "2..=32")]
    fn one_channel_is_not_a_group() {
        DmcGroup::new(&[10.0], 0.0);
    }

    #[test]
    #[should_panic(expected = "2..=32")]
    fn thirty_three_channels_are_too_many() {
        DmcGroup::new(&[10.0; 33], 0.0);
    }

    #[test]
    fn only_the_largest_cuts() {
        let mut g = ca(&[10.0, 40.0, 20.0]);
        assert_eq!(g.on_loss(0, 1.0, RTT), LossDecision::Keep);
        assert_eq!(g.on_loss(2, 1.0, RTT), LossDecision::Keep);
        assert_eq!(g.windows(), vec![10.0, 40.0, 20.0]);
        assert_eq!(
            g.on_loss(1, 1.0, RTT),
            LossDecision::Cut { new_ssthresh: 20.0 }
        );
        assert_eq!(g.windows(), vec![10.0, 20.0, 20.0]);
        assert_eq!((g.cuts, g.losses_kept, g.last_cut), (1, 2, Some(1.0)));
    }

    #[test]
    fn a_second_loss_within_one_rtt_is_kept() {
        // RTT 0.25 s so the times below are exact in binary floating point.
        let rtt = 0.25;
        let mut g = ca(&[30.0, 40.0, 20.0]);
        assert!(matches!(g.on_loss(1, 1.0, rtt), LossDecision::Cut { .. }));
        // Channel 0 is now the largest, but the last cut is only 0.125 s (< 1 RTT) old.
        assert_eq!(g.on_loss(0, 1.125, rtt), LossDecision::Keep);
        // Exactly one RTT is not "more than one RTT".
        assert_eq!(g.on_loss(0, 1.25, rtt), LossDecision::Keep);
        // After more than one RTT the new largest cuts.
        assert_eq!(
            g.on_loss(0, 1.375, rtt),
            LossDecision::Cut { new_ssthresh: 15.0 }
        );
        assert_eq!(g.windows(), vec![15.0, 20.0, 20.0]);
        assert_eq!((g.cuts, g.losses_kept), (2, 2));
    }

    #[test]
    fn ties_for_largest_cut_once_per_rtt() {
        let mut g = ca(&[16.0, 16.0, 16.0]);
        assert!(matches!(g.on_loss(2, 0.0, RTT), LossDecision::Cut { .. }));
        assert_eq!(g.on_loss(0, 0.0, RTT), LossDecision::Keep);
        assert_eq!(g.windows(), vec![16.0, 16.0, 8.0]);
        // Halving uses cwnd >> 1, never below 2.
        let mut s = ca(&[3.0, 2.0]);
        assert_eq!(
            s.on_loss(0, 0.0, RTT),
            LossDecision::Cut { new_ssthresh: 2.0 }
        );
    }

    #[test]
    fn increase_rule_per_segment() {
        let g = ca(&[10.0, 20.0, 30.0, 40.0]);
        assert_eq!(g.increase_per_acked_segment(0), 1.0 / 10.0); // the smallest: 1/w_i
        for i in 1..4 {
            assert_eq!(g.increase_per_acked_segment(i), 1.0 / 90.0); // 1/(100 − 10)
        }
    }

    #[test]
    fn group_grows_two_segments_per_rtt() {
        // Seed 003 L1031: the increase rule "simulates a parallel TCP with roughly α = 2":
        // the smallest channel +1 per RTT, the others share one more segment per RTT.
        for w in [
            vec![10.0, 20.0],
            vec![10.0, 20.0, 30.0, 40.0],
            vec![5.0, 100.0, 7.0, 60.0, 33.0],
        ] {
            let g = ca(&w);
            assert!((g.increase_per_rtt_total() - 2.0).abs() < 1e-12, "{w:?}");
        }
        // With k channels tied for smallest each of those grows 1/RTT: all equal → m.
        assert!((ca(&[20.0; 5]).increase_per_rtt_total() - 5.0).abs() < 1e-12);
    }

    #[test]
    fn slow_start_channels_adopt_the_first_cuts_ssthresh() {
        // L1037: "set all slave channels to share the initial slow-start threshold after the
        // master channel gets cut at the first time".
        let mut g = DmcGroup::new(&[64.0, 8.0, 4.0], f64::INFINITY);
        assert_eq!(g.increase_per_acked_segment(1), 1.0); // slow start: +1 per segment
        assert_eq!(
            g.on_loss(0, 1.0, RTT),
            LossDecision::Cut { new_ssthresh: 32.0 }
        );
        assert!(g.channels.iter().all(|c| c.ssthresh == 32.0));
        assert!(g.channels[1].in_slow_start());
        // A later cut does not touch the others' ssthresh.
        g.channels[1].cwnd = 100.0;
        g.channels[2].ssthresh = f64::INFINITY;
        assert!(matches!(g.on_loss(1, 5.0, RTT), LossDecision::Cut { .. }));
        assert_eq!(g.channels[2].ssthresh, f64::INFINITY);
    }

    #[test]
    fn on_ack_applies_the_rule() {
        let mut g = ca(&[10.0, 30.0]);
        g.on_ack(0, 1.0);
        assert!((g.channels[0].cwnd - 10.1).abs() < 1e-12);
        g.on_ack(1, 2.0);
        assert!((g.channels[1].cwnd - (30.0 + 2.0 / 30.0)).abs() < 1e-12);
    }

    #[test]
    fn table_5_1_ideal_utilization() {
        // Seed 003 eq. (5.3) with β = 1/2 against Table 5.1 (L1069–1082), printed to 0.1 %.
        for (m, printed) in [
            (1, 75.0),
            (2, 87.5),
            (3, 91.7),
            (4, 93.8),
            (5, 95.0),
            (6, 95.8),
            (7, 96.4),
            (8, 96.9),
            (25, 99.0),
        ] {
            let u = 100.0 * ideal_utilization(m, 0.5);
            assert!((u - printed).abs() <= 0.05 + 1e-9, "m={m}: {u}");
        }
    }

    /// Mean w_total / C over whole epochs of a group simulation.
    fn simulated_utilization(m: usize, cap: f64) -> f64 {
        let start: Vec<f64> = (0..m)
            .map(|i| cap / m as f64 * (0.5 + 0.5 * i as f64 / m as f64))
            .collect();
        let t = DmcGroup::new(&start, 0.0).simulate(200_000, cap, RTT);
        let l = loss_rtts(&t);
        let (from, to) = (l[l.len() / 4] + 1, *l.last().unwrap());
        mean(&t[from..=to]) / cap
    }

    #[test]
    fn two_channels_settle_on_the_derived_sawtooth() {
        // m = 2 under synchronized losses: the cut channel is at x·C, drops to C(1 − x/2),
        // then both grow 1/RTT, so the other reaches the next peak at (1 − x) + x/4; in
        // steady state that equals x, so x = 4/7, the valley 5/7·C and the mean 6/7 ≈ 85.7 %
        // (below the 87.5 % of eq. 5.3, which assumes evenly spread equal sawtooths).
        let u = simulated_utilization(2, 10_000.0);
        assert!((u - 6.0 / 7.0).abs() < 0.003, "{u}");
    }

    #[test]
    fn simulated_utilization_tracks_equation_5_3() {
        // Within 2 points below the ideal for m = 2..25 (observed gap 0.5–1.7 points: the
        // cut channel is a bit larger than the average share, see the m = 2 derivation).
        for m in [2, 3, 4, 5, 8, 25] {
            let u = simulated_utilization(m, 10_000.0);
            let ideal = ideal_utilization(m, 0.5);
            assert!(
                u <= ideal + 0.003 && u > ideal - 0.02,
                "m={m}: {u} vs {ideal}"
            );
        }
        // More channels, higher utilization (Table 5.1's trend; L1084).
        let us: Vec<f64> = [2, 3, 5, 8]
            .iter()
            .map(|&m| simulated_utilization(m, 10_000.0))
            .collect();
        assert!(us.windows(2).all(|p| p[1] > p[0]), "{us:?}");
    }

    #[test]
    fn each_congestion_event_cuts_exactly_one_channel() {
        let mut g = ca(&[100.0, 200.0, 300.0, 400.0, 500.0]);
        let t = g.simulate(10_000, 2000.0, RTT);
        let events = loss_rtts(&t).len() as u64;
        assert!(events > 10);
        // Each overflow RTT cuts one channel; the other four losses are kept.
        assert!(g.cuts.abs_diff(events) <= 1);
        assert!(g.losses_kept.abs_diff(4 * events) <= 5);
    }

    #[test]
    fn the_group_curve_climbs_back_to_w_max_in_k_then_probes() {
        // A cut of the largest of 5 windows of 1,000: 500 segments off a total of 5,000.
        let c = GroupCurve::after_cut(5000.0, 500.0);
        assert!((c.k - (500.0f64 / 0.3).cbrt()).abs() < 1e-9);
        assert!((c.k - 11.86).abs() < 0.01, "{}", c.k);
        assert!((c.target(0.0) - 4500.0).abs() < 1e-6);
        assert!((c.target(c.k) - 5000.0).abs() < 1e-6);
        // Concave: half the drop is won back in an eighth of K (1 − (7/8)³ ≈ 0.33 of it), ...
        assert!(c.target(c.k / 8.0) > 4500.0 + 0.3 * 500.0);
        // ... and it probes past w_max only slowly at first.
        assert!(c.target(c.k + 2.0) - 5000.0 < 3.0);
        // Each channel grows in proportion to its window; none by more than half per RTT.
        let per_segment = c.increase_per_acked_segment(4500.0, 1.0).unwrap();
        let target = c.target(1.0);
        assert!((per_segment - (target - 4500.0) / 4500.0).abs() < 1e-12);
        assert_eq!(c.increase_per_acked_segment(5000.0, 1.0), None);
        assert_eq!(c.increase_per_acked_segment(10.0, 60.0), Some(0.5));
    }

    #[test]
    fn the_curve_wins_back_a_cut_faster_than_the_published_rule() {
        // 5 channels at 1 Gbit/s × 60 ms (about 4,950 segments in flight), the largest cut.
        let rtt = 0.06;
        let mut g = DmcGroup::new(&[990.0; 5], 0.0);
        let before = g.total();
        let LossDecision::Cut { .. } = g.on_loss(0, 1.0, rtt) else {
            panic!("the largest channel must cut");
        };
        let curve = GroupCurve::after_cut(before, before - g.total());
        let (mut classic, mut total) = (g.total(), g.total());
        let mut t = 0.0;
        let mut at_half_k = None;
        while total < before - 1.0 {
            classic += g.increase_per_rtt_total();
            total += curve
                .increase_per_acked_segment(total, t + rtt)
                .map_or(0.0, |d| d * total)
                .max(g.increase_per_rtt_total());
            t += rtt;
            if at_half_k.is_none() && t >= curve.k / 2.0 {
                at_half_k = Some(total);
            }
        }
        // Concave: by K/2 the group has won back 7/8 of the cut (1 − (1/2)³) ...
        let half = at_half_k.expect("K/2 passed");
        assert!(half >= before - 495.0 / 8.0 - 1.0, "{half}");
        // ... and all of it within K = ∛(495 / 0.3) ≈ 11.8 s (sooner: near w_max the
        // published rule's 2 segments per RTT outgrow the flat top of the curve) ...
        assert!(t <= curve.k + rtt, "{t} vs K {}", curve.k);
        // ... where Cui 2013's rule alone has won back under 80 % of it.
        assert!(classic - (before - 495.0) < 0.8 * 495.0, "{classic}");
    }
}
