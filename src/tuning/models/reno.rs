//! Reno (standard TCP AIMD): +1 segment per RTT, halve on loss. The baseline every other
//! model is compared with, and the rule the others fall back to at small windows.

use super::{kernel_cwnd, WindowRules, MIN_SSTHRESH};

/// Standard TCP congestion avoidance (α = 1, β = 0.5; Li, Leith and Shorten 2007 L247, Mohammed 2006 L130–136).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reno;

/// Reno's ssthresh for a loss at window `w`: `max(cwnd >> 1, 2)` on the integer cwnd, as
/// `tcp_reno_ssthresh()`. Shared by the models that act like Reno at small windows.
pub fn reno_ssthresh(w: f64) -> f64 {
    ((kernel_cwnd(w) >> 1) as f64).max(MIN_SSTHRESH)
}

impl WindowRules for Reno {
    fn name(&self) -> &'static str {
        "reno"
    }

    fn increase_per_rtt(&self, _w: f64) -> f64 {
        1.0
    }

    fn on_loss(&mut self, w: f64) -> f64 {
        reno_ssthresh(w)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{mean, mean_epoch};
    use super::super::{loss_rtts, simulate};
    use super::*;

    #[test]
    fn halves_on_the_integer_window_never_below_two() {
        let mut r = Reno;
        assert_eq!(r.on_loss(100.0), 50.0);
        assert_eq!(r.on_loss(101.0), 50.0); // 101 >> 1
        assert_eq!(r.on_loss(101.9), 50.0); // cwnd is floor(w)
        assert_eq!(r.on_loss(5.0), 2.0);
        assert_eq!(r.on_loss(3.0), 2.0);
        assert_eq!(r.on_loss(1.0), 2.0);
        assert_eq!(r.increase_per_rtt(7.0), 1.0);
        assert_eq!(r.increase_per_rtt(70_000.0), 1.0);
    }

    #[test]
    fn epoch_is_about_half_the_peak_window() {
        // After a loss just above C the window restarts at ~C/2 and climbs 1 per RTT: C/2
        // RTTs of growth plus the recovery RTT plus the RTT that overshoots.
        for cap in [100.0, 1000.0] {
            let t = simulate(&mut Reno, cap / 2.0, 20 * cap as usize, cap);
            let e = mean_epoch(&t, 1);
            assert!((e - (cap / 2.0 + 2.0)).abs() <= 1.0, "C={cap}: epoch {e}");
        }
    }

    #[test]
    fn average_window_is_three_quarters_of_the_peak() {
        // Seed 003 L986 / Table 5.1 (m = 1): in a bufferless bottleneck a Reno flow averages
        // "roughly 75% of its largest congestion window".
        let cap = 1000.0;
        let t = simulate(&mut Reno, cap / 2.0, 20_000, cap);
        let losses = loss_rtts(&t);
        let (first, last) = (losses[0] + 1, *losses.last().unwrap());
        let avg = mean(&t[first..=last]) / cap; // whole epochs only

        assert!((avg - 0.75).abs() < 0.01, "average/peak = {avg}");
    }
}
