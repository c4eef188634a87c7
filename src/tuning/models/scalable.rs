//! Scalable TCP (Kelly), in the seeds' form (Li, Leith and Shorten 2007 §V.A and Table II, Mohammed 2006 L208–222):
//! MIMD above Low_Window, +0.01 per acknowledged segment and ×0.875 on loss, so the time to
//! recover from a loss does not depend on the window; standard TCP below Low_Window.
//!
//! This is the rule the hsxfer BPF program implements. Linux `tcp_scalable.c` differs: it has
//! no Low_Window and grows by `max(1, cwnd/100)` per RTT (`TCP_SCALABLE_AI_CNT` 100), and cuts
//! by 1/8 at every window.

use super::reno::reno_ssthresh;
use super::{kernel_cwnd, WindowRules, MIN_SSTHRESH};

/// Increase per acknowledged segment above Low_Window (Li, Leith and Shorten 2007 Table II α = 0.01).
pub const AI_PER_SEGMENT: f64 = 0.01;
/// Window kept after a loss above Low_Window (Li, Leith and Shorten 2007 Table II β = 0.875).
pub const BETA: f64 = 0.875;
/// The cut as a shift, as the kernel writes it: `cwnd − (cwnd >> 3)` = cwnd·7/8.
pub const MD_SHIFT: u32 = 3;
/// Below this window the standard TCP rules apply (Li, Leith and Shorten 2007 Table II Low_Window = 16).
pub const LOW_WINDOW: u64 = 16;

/// Scalable TCP (stateless).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scalable;

impl WindowRules for Scalable {
    fn name(&self) -> &'static str {
        "scalable"
    }

    /// +1 below Low_Window, else `AI_PER_SEGMENT · w` (≈ +1 % per RTT).
    fn increase_per_rtt(&self, w: f64) -> f64 {
        if kernel_cwnd(w) < LOW_WINDOW {
            1.0
        } else {
            AI_PER_SEGMENT * w
        }
    }

    /// `max(cwnd − (cwnd >> 3), 2)` at or above Low_Window, Reno's half below it.
    fn on_loss(&mut self, w: f64) -> f64 {
        let cwnd = kernel_cwnd(w);
        if cwnd < LOW_WINDOW {
            reno_ssthresh(w)
        } else {
            ((cwnd - (cwnd >> MD_SHIFT)) as f64).max(MIN_SSTHRESH)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::simulate;
    use super::super::test_util::mean_epoch;
    use super::*;

    #[test]
    fn constants_are_seed_001_table_ii() {
        assert_eq!(AI_PER_SEGMENT, 0.01);
        assert_eq!(BETA, 0.875);
        assert_eq!(LOW_WINDOW, 16);
        // The kernel's shift is the same β: 1 − 2⁻³.
        assert_eq!(1.0 - 1.0 / f64::from(1u32 << MD_SHIFT), BETA);
    }

    #[test]
    fn increase_switches_at_low_window() {
        let s = Scalable;
        assert_eq!(s.increase_per_rtt(15.0), 1.0);
        assert_eq!(s.increase_per_rtt(15.9), 1.0);
        assert!((s.increase_per_rtt(16.0) - 0.16).abs() < 1e-12);
        assert!((s.increase_per_rtt(1000.0) - 10.0).abs() < 1e-12);
    }

    #[test]
    fn loss_cuts_an_eighth_with_integer_arithmetic() {
        let mut s = Scalable;
        assert_eq!(s.on_loss(1000.0), 875.0);
        assert_eq!(s.on_loss(1001.0), 876.0); // 1001 − 125
        assert_eq!(s.on_loss(16.0), 14.0);
        assert_eq!(s.on_loss(15.0), 7.0); // Reno below Low_Window
        assert_eq!(s.on_loss(3.0), 2.0);
    }

    #[test]
    fn epoch_length_does_not_depend_on_the_window() {
        // Seed 001 L145: recovery time "independent of window size". Growth per RTT is ×1.01
        // and the cut ×0.875, so the growth part of an epoch is ln(1/0.875)/ln(1.01) ≈ 13.42
        // RTTs. In the simulator an epoch also holds the recovery RTT, and the overshoot above
        // C (up to 1 %) shortens the next climb by up to one RTT: expected mean ≈ 13.42 + 1 −
        // 0.5 + the rounding up to whole RTTs (+0.5) ≈ 14.4. Bounds: 13.9–14.9, and the
        // means at C = 1000, 10⁴ and 10⁵ within 0.3 of each other.
        let expected = (1.0 / BETA).ln() / (1.0 + AI_PER_SEGMENT).ln();
        assert!((expected - 13.42).abs() < 0.01);
        let means: Vec<f64> = [1000.0, 10_000.0, 100_000.0]
            .iter()
            .map(|&cap| mean_epoch(&simulate(&mut Scalable, cap, 20_000, cap), 2))
            .collect();
        for m in &means {
            assert!((expected + 0.5..expected + 1.5).contains(m), "{means:?}");
        }
        let spread = means.iter().cloned().fold(f64::MIN, f64::max)
            - means.iter().cloned().fold(f64::MAX, f64::min);
        assert!(spread < 0.3, "{means:?}");
    }
}
