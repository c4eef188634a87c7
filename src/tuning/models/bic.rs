//! BIC-TCP as Linux `tcp_bic.c`: binary search towards the window of the last loss
//! (`w_max`), linear steps of at most S_max when far from it, slow probing around it, Reno
//! below Low_Window, and fast convergence (a loss below `w_max` lowers `w_max` further).
//!
//! Seed 001 Table II gives S_max = 32 (the authors' patch); the kernel's `max_increment` is
//! 16, hence a field. Seed 001 prints the third case of f_α as `w_1/(B−1)`; the kernel (and
//! this model) use `(cwnd − w_max)/(B−1)`.

use super::reno::reno_ssthresh;
use super::{kernel_cwnd, WindowRules, MIN_SSTHRESH};

/// Binary-search divisor B (`BICTCP_B`): each RTT goes a 1/B of the way to `w_max`.
pub const BICTCP_B: u32 = 4;
/// Fixed-point scale of `beta` (`BICTCP_BETA_SCALE`).
pub const BETA_SCALE: u32 = 1024;

/// BIC parameters (the kernel's module parameters) and the state it keeps across losses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bic {
    /// S_max, the largest increase per RTT (`max_increment`; kernel 16, Li, Leith and Shorten 2007 32).
    pub max_increment: u32,
    /// At or below this window BIC is Reno (`low_window`, 14).
    pub low_window: u32,
    /// Window kept after a loss, in 1/1024 (`beta`, 819 ≈ 0.8).
    pub beta: u32,
    /// σ: near `w_max` the increase is B/σ per RTT (`smooth_part`, 20 → 0.2).
    pub smooth_part: u32,
    /// Lower `w_max` to `w·(1+β)/2` after a loss below the previous `w_max`.
    pub fast_convergence: bool,
    /// State: the window the search aims at (`last_max_cwnd`); 0 before the first loss.
    pub w_max: u32,
}

impl Default for Bic {
    /// The kernel's defaults, before any loss.
    fn default() -> Self {
        Self {
            max_increment: 16,
            low_window: 14,
            beta: 819,
            smooth_part: 20,
            fast_convergence: true,
            w_max: 0,
        }
    }
}

impl Bic {
    /// The parameters of Li, Leith and Shorten 2007 Table II (S_max = 32; B, σ, β, Low_Window as the kernel).
    pub fn seed_001() -> Self {
        Self {
            max_increment: 32,
            ..Self::default()
        }
    }

    /// S_min = B/σ, the increase per RTT next to `w_max`.
    pub fn s_min(&self) -> f64 {
        f64::from(BICTCP_B) / f64::from(self.smooth_part)
    }

    /// β as a fraction, `beta / 1024`.
    pub fn beta_fraction(&self) -> f64 {
        f64::from(self.beta) / f64::from(BETA_SCALE)
    }
}

impl WindowRules for Bic {
    fn name(&self) -> &'static str {
        "bic"
    }

    /// `bictcp_update()` as an increase per RTT, on the integer cwnd (the kernel's `dist` is
    /// an integer division). Ignores the kernel's delayed-ACK correction of `cnt`.
    fn increase_per_rtt(&self, w: f64) -> f64 {
        let cwnd = kernel_cwnd(w);
        if cwnd <= u64::from(self.low_window) {
            return 1.0;
        }
        let (b, s_max, w_max) = (
            u64::from(BICTCP_B),
            f64::from(self.max_increment),
            u64::from(self.w_max),
        );
        let inc = if cwnd < w_max {
            let dist = (w_max - cwnd) / b;
            if dist as f64 > s_max {
                s_max
            } else if dist <= 1 {
                self.s_min()
            } else {
                dist as f64
            }
        } else if cwnd < w_max + b {
            self.s_min()
        } else if (cwnd as f64) < w_max as f64 + s_max * (b - 1) as f64 {
            (cwnd - w_max) as f64 / (b - 1) as f64
        } else {
            s_max
        };
        if self.w_max == 0 {
            // "if in slow start or link utilization is very low": cnt ≤ 20, +5 % per RTT.
            inc.max(cwnd as f64 / 20.0)
        } else {
            inc
        }
    }

    /// `bictcp_recalc_ssthresh()`: sets `w_max` (with fast convergence), returns
    /// `max(cwnd·β/1024, 2)`, or Reno's half at or below Low_Window.
    fn on_loss(&mut self, w: f64) -> f64 {
        let cwnd = kernel_cwnd(w);
        let scale = u64::from(BETA_SCALE);
        let beta = u64::from(self.beta);
        let w_max = if cwnd < u64::from(self.w_max) && self.fast_convergence {
            cwnd * (scale + beta) / (2 * scale)
        } else {
            cwnd
        };
        self.w_max = u32::try_from(w_max).unwrap_or(u32::MAX);
        if cwnd <= u64::from(self.low_window) {
            reno_ssthresh(w)
        } else {
            ((cwnd * beta / scale) as f64).max(MIN_SSTHRESH)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{loss_rtts, simulate};
    use super::*;

    fn with_w_max(w_max: u32) -> Bic {
        Bic {
            w_max,
            ..Bic::default()
        }
    }

    #[test]
    fn constants_are_the_kernels_and_seed_001s() {
        let k = Bic::default();
        assert_eq!((BICTCP_B, k.max_increment, k.low_window), (4, 16, 14));
        assert_eq!((k.beta, k.smooth_part, k.fast_convergence), (819, 20, true));
        // B/σ = 4/20.
        assert!((k.s_min() - 0.2).abs() < 1e-12);
        // Seed 001 Table II: S_max = 32, B = 4, σ = 20, β = 0.8, Low_Window = 14.
        let s = Bic::seed_001();
        assert_eq!(s.max_increment, 32);
        assert!((s.beta_fraction() - 0.8).abs() < 0.001);
        assert_eq!(s.low_window, 14);
    }

    #[test]
    fn increase_below_w_max_is_a_binary_search() {
        let b = with_w_max(1000);
        assert_eq!(b.increase_per_rtt(900.0), 16.0); // dist 25 > S_max
        assert_eq!(b.increase_per_rtt(960.0), 10.0); // dist 10
        assert_eq!(b.increase_per_rtt(991.0), 2.0); // dist 9/4 → 2
        assert!((b.increase_per_rtt(993.0) - 0.2).abs() < 1e-12); // dist 7/4 → 1
        assert!((b.increase_per_rtt(999.0) - 0.2).abs() < 1e-12);
        // Seed 001's S_max = 32 lets the linear phase take bigger steps.
        let s = Bic {
            w_max: 1000,
            ..Bic::seed_001()
        };
        assert_eq!(s.increase_per_rtt(800.0), 32.0);
        assert_eq!(s.increase_per_rtt(900.0), 25.0);
    }

    #[test]
    fn increase_above_w_max_is_max_probing() {
        let b = with_w_max(1000);
        assert!((b.increase_per_rtt(1000.0) - 0.2).abs() < 1e-12);
        assert!((b.increase_per_rtt(1003.0) - 0.2).abs() < 1e-12);
        assert!((b.increase_per_rtt(1004.0) - 4.0 / 3.0).abs() < 1e-12);
        assert!((b.increase_per_rtt(1030.0) - 10.0).abs() < 1e-12);
        assert_eq!(b.increase_per_rtt(1047.0), 47.0 / 3.0);
        assert_eq!(b.increase_per_rtt(1048.0), 16.0); // w_max + S_max·(B−1)
        assert_eq!(b.increase_per_rtt(5000.0), 16.0);
    }

    #[test]
    fn reno_at_or_below_low_window_and_five_percent_before_any_loss() {
        let b = Bic::default();
        assert_eq!(b.increase_per_rtt(14.0), 1.0);
        assert_eq!(b.increase_per_rtt(10.0), 1.0);
        // w_max = 0: the max-probing branch, floored at cwnd/20 (kernel: cnt ≤ 20).
        assert_eq!(b.increase_per_rtt(30.0), 10.0); // (30 − 0)/3 > 30/20
        assert_eq!(b.increase_per_rtt(100.0), 16.0); // S_max > 5
        assert_eq!(b.increase_per_rtt(1000.0), 50.0); // 5 % > S_max
    }

    #[test]
    fn loss_sets_w_max_with_fast_convergence() {
        let mut b = with_w_max(1200);
        // Below the old w_max: w_max = 1000·(1024+819)/2048 = 899 (the seed's (1+β)/2 ≈ 0.9).
        assert_eq!(b.on_loss(1000.0), 799.0); // 1000·819/1024 = 799.8 → 799
        assert_eq!(b.w_max, 899);
        // At or above w_max: w_max = cwnd.
        assert_eq!(b.on_loss(950.0), 759.0);
        assert_eq!(b.w_max, 950);
        // Fast convergence off: w_max is the loss window.
        let mut nf = Bic {
            fast_convergence: false,
            ..with_w_max(1200)
        };
        nf.on_loss(1000.0);
        assert_eq!(nf.w_max, 1000);
        // At or below Low_Window: Reno's half.
        let mut small = Bic::default();
        assert_eq!(small.on_loss(14.0), 7.0);
        assert_eq!(small.on_loss(15.0), 11.0); // 15·819/1024 = 11.99 → 11
        assert_eq!(small.on_loss(3.0), 2.0);
    }

    #[test]
    fn smooth_part_is_the_rtts_from_w_max_minus_b_to_w_max() {
        // tcp_bic.c documents smooth_part as "# of RTT from Wmax-B to Wmax".
        let mut b = with_w_max(1000);
        let start = 1000.0 - f64::from(BICTCP_B);
        let t = simulate(&mut b, start, 200, 1e9);
        let reached = t.iter().position(|&w| w >= 1000.0 - 1e-9).unwrap();
        assert_eq!(reached, 20);
    }

    #[test]
    fn sawtooth_plateaus_at_the_capacity() {
        // Fixed capacity C = 1000 from 500. Fast convergence first makes w_max alternate
        // (1039, 901, 1015, 902: a loss below the old w_max lowers it to 0.9·cwnd, and the
        // next climb overshoots with S_max steps); from the 4th loss on w_max = C and the
        // epoch repeats: cut to 1000·819/1024 = 799, 9 steps of 16, a few binary-search
        // steps, then B/σ = 0.2 per RTT from 993 to C. Most RTTs sit within 1 % of C.
        let cap = 1000.0;
        let mut bic = Bic::default();
        let t = simulate(&mut bic, 500.0, 3_000, cap);
        let l = loss_rtts(&t);
        assert!(l.len() > 20);
        for &i in &l[4..] {
            assert_eq!(t[i + 1], 799.0, "cut at RTT {i} from {}", t[i]);
        }
        assert_eq!(bic.w_max, 1000);
        let epochs: Vec<usize> = l[4..].windows(2).map(|p| p[1] - p[0]).collect();
        let (lo, hi) = (epochs.iter().min().unwrap(), epochs.iter().max().unwrap());
        assert!(hi - lo <= 1, "{epochs:?}");
        let steady = &t[l[4] + 1..=*l.last().unwrap()];
        let near = steady.iter().filter(|&&w| w >= 0.99 * cap).count();
        let frac = near as f64 / steady.len() as f64;
        assert!(frac > 0.6, "fraction within 1 % of C: {frac}");
    }
}
