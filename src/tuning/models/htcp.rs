//! H-TCP as Linux `tcp_htcp.c` (Li, Leith and Shorten 2007 §V.C): the increase grows with the time Δ since
//! the last congestion event (standard TCP for the first Δ_L = 1 s, then quadratic), scaled
//! by the path's minimum RTT; the decrease β adapts to min_rtt/max_rtt (an estimate of the
//! queue's share of the RTT) unless the throughput moved by more than 20 %.
//!
//! [`Htcp`] is the per-flow state with explicit inputs (time, RTT samples, throughput
//! samples, congestion events), no clock. [`HtcpFluid`] wraps it with a constant RTT and its
//! own clock so it can run as a [`WindowRules`] in [`super::simulate`].
//!
//! Arithmetic: β is computed in the kernel's 1/128 fixed point (it is a ratio, so this is
//! exact). The increase factor is continuous; the kernel truncates it to an integer twice
//! (after the quadratic and after RTT scaling), so a real flow's α can be up to
//! 2(1 − β)·1 segments/RTT below [`Htcp::alpha`].

use super::{kernel_cwnd, WindowRules, MIN_SSTHRESH};

/// Δ_L: for this long after a congestion event H-TCP is standard TCP (Li, Leith and Shorten 2007 Table II).
pub const DELTA_L: f64 = 1.0;
/// Reference RTT of the RTT scaling: α is scaled by min_rtt / 0.1 s.
pub const RTT_REF: f64 = 0.1;
/// Clamp of the RTT-scaling ratio min_rtt / [`RTT_REF`] (kernel: 0.1/min_rtt in [0.5, 10]).
pub const RTT_SCALE_RANGE: (f64, f64) = (0.1, 2.0);
/// Fixed-point scale of β and α (`<< 7`).
pub const FIXED_ONE: u32 = 1 << 7;
/// Smallest β, 0.5 (`BETA_MIN`, 64/128).
pub const BETA_MIN: u32 = 1 << 6;
/// Largest β, `BETA_MAX` 102/128 ≈ 0.797 (Li, Leith and Shorten 2007 writes 0.8).
pub const BETA_MAX: u32 = 102;
/// Adaptive β needs min_rtt above this (`msecs_to_jiffies(10)`).
pub const MIN_RTT_FOR_ADAPTIVE_BETA: f64 = 0.010;
/// A max-RTT sample more than this above the current max_rtt is ignored (a spike).
pub const MAX_RTT_JUMP: f64 = 0.020;
/// Fading of max_rtt at each congestion event: max = min + 0.95·(max − min).
pub const MAX_RTT_FADE: f64 = 0.95;

/// The unscaled increase factor at Δ seconds since the last congestion event:
/// 1 for Δ ≤ Δ_L, else 1 + 10(Δ − Δ_L) + 0.25(Δ − Δ_L)² (Li, Leith and Shorten 2007 L176).
pub fn delta_factor(delta: f64) -> f64 {
    if delta <= DELTA_L {
        1.0
    } else {
        let d = delta - DELTA_L;
        1.0 + 10.0 * d + 0.25 * d * d
    }
}

/// The state one H-TCP flow keeps, as `struct htcp`, driven by explicit inputs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Htcp {
    /// Time of the last congestion event (the kernel restarts Δ when recovery ends).
    pub last_congestion: f64,
    /// Smallest RTT seen, seconds; 0 until the first sample.
    pub min_rtt: f64,
    /// Largest credible RTT seen, seconds (faded at every congestion event).
    pub max_rtt: f64,
    /// Smoothed throughput of this epoch (`Bi`), segments per second.
    pub bi: f64,
    /// Largest smoothed throughput of this epoch (`maxB`).
    pub max_b: f64,
    /// `maxB` of the previous epoch (`old_maxB`).
    pub old_max_b: f64,
    /// Current β in 1/128 (64..=102).
    pub beta: u32,
    /// Set once a congestion event passed with steady throughput; adaptive β needs it.
    pub modeswitch: bool,
    /// Scale α by min_rtt (`use_rtt_scaling`, on by default).
    pub use_rtt_scaling: bool,
    /// Fall back to β = 0.5 when the throughput moved > 20 % (`use_bandwidth_switch`, on).
    pub use_bandwidth_switch: bool,
}

impl Htcp {
    /// A new flow at time `now` (`htcp_init`: β = 0.5, Δ counted from `now`).
    pub fn new(now: f64) -> Self {
        Self {
            last_congestion: now,
            min_rtt: 0.0,
            max_rtt: 0.0,
            bi: 0.0,
            max_b: 0.0,
            old_max_b: 0.0,
            beta: BETA_MIN,
            modeswitch: false,
            use_rtt_scaling: true,
            use_bandwidth_switch: true,
        }
    }

    /// β as a fraction.
    pub fn beta_fraction(&self) -> f64 {
        f64::from(self.beta) / f64::from(FIXED_ONE)
    }

    /// An RTT sample (seconds) while the connection is in the Open state (`measure_rtt`):
    /// tracks min_rtt, and max_rtt unless the sample jumps more than 20 ms above it.
    pub fn on_rtt_sample(&mut self, rtt: f64) {
        if self.min_rtt == 0.0 || rtt < self.min_rtt {
            self.min_rtt = rtt;
        }
        if self.max_rtt < self.min_rtt {
            self.max_rtt = self.min_rtt;
        }
        if self.max_rtt < rtt && rtt <= self.max_rtt + MAX_RTT_JUMP {
            self.max_rtt = rtt;
        }
    }

    /// A throughput sample at `now`, segments per second over at least one min RTT (the
    /// kernel's `cur_Bi`, `measure_achieved_throughput`). Within 3 min RTTs of a congestion
    /// event it restarts the epoch's estimate; later it is smoothed (3/4 old + 1/4 new) and
    /// raises `max_b`. Ignored until an RTT sample arrived.
    pub fn on_throughput_sample(&mut self, now: f64, rate: f64) {
        if self.min_rtt <= 0.0 {
            return;
        }
        let rtts_since = ((now - self.last_congestion) / self.min_rtt).floor();
        if rtts_since <= 3.0 {
            self.bi = rate;
            self.max_b = rate;
        } else {
            self.bi = (3.0 * self.bi + rate) / 4.0;
            self.max_b = self.max_b.max(self.bi);
        }
    }

    /// The increase factor at `now`: [`delta_factor`] scaled by min_rtt / 0.1 s (ratio
    /// clamped to [0.1, 2]), at least 1.
    pub fn factor(&self, now: f64) -> f64 {
        let mut f = delta_factor(now - self.last_congestion);
        if self.use_rtt_scaling && self.min_rtt > 0.0 {
            let (lo, hi) = RTT_SCALE_RANGE;
            f *= (self.min_rtt / RTT_REF).clamp(lo, hi);
        }
        f.max(1.0)
    }

    /// α at `now`: the congestion-avoidance increase, segments per RTT,
    /// 2·factor·(1 − β) (`htcp_alpha_update`).
    pub fn alpha(&self, now: f64) -> f64 {
        2.0 * self.factor(now) * (1.0 - self.beta_fraction())
    }

    /// A congestion event at `now` with window `w`: updates β (`htcp_beta_update`), fades
    /// max_rtt, restarts Δ, and returns ssthresh = `max((cwnd·β) >> 7, 2)`.
    pub fn on_congestion(&mut self, now: f64, w: f64) -> f64 {
        self.update_beta();
        if self.min_rtt > 0.0 && self.max_rtt > self.min_rtt {
            self.max_rtt = self.min_rtt + (self.max_rtt - self.min_rtt) * MAX_RTT_FADE;
        }
        self.last_congestion = now;
        (((kernel_cwnd(w) * u64::from(self.beta)) >> 7) as f64).max(MIN_SSTHRESH)
    }

    fn update_beta(&mut self) {
        if self.use_bandwidth_switch {
            let (max_b, old) = (self.max_b, self.old_max_b);
            self.old_max_b = max_b;
            // between(5·maxB, 4·old_maxB, 6·old_maxB): throughput within −20 %..+20 %.
            if !(4.0 * old <= 5.0 * max_b && 5.0 * max_b <= 6.0 * old) {
                self.beta = BETA_MIN;
                self.modeswitch = false;
                return;
            }
        }
        if self.modeswitch && self.min_rtt > MIN_RTT_FOR_ADAPTIVE_BETA && self.max_rtt > 0.0 {
            let ratio = (self.min_rtt / self.max_rtt * f64::from(FIXED_ONE)).floor() as u32;
            self.beta = ratio.clamp(BETA_MIN, BETA_MAX);
        } else {
            self.beta = BETA_MIN;
            self.modeswitch = true;
        }
    }
}

/// [`Htcp`] on a path with a constant RTT, with its own clock, as a [`WindowRules`]: each
/// simulated RTT advances the clock by `rtt` and feeds one RTT sample and one throughput
/// sample (`w/rtt`). With a constant RTT min = max, so the adaptive β, once on, is
/// [`BETA_MAX`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HtcpFluid {
    /// The flow's state.
    pub htcp: Htcp,
    /// The path's RTT, seconds.
    pub rtt: f64,
    /// The model clock, seconds.
    pub now: f64,
}

impl HtcpFluid {
    /// A flow starting at time 0 on a path of constant `rtt` seconds.
    pub fn new(rtt: f64) -> Self {
        let mut htcp = Htcp::new(0.0);
        htcp.on_rtt_sample(rtt);
        Self {
            htcp,
            rtt,
            now: 0.0,
        }
    }
}

impl WindowRules for HtcpFluid {
    fn name(&self) -> &'static str {
        "htcp"
    }

    /// α at the model clock (the window does not enter H-TCP's increase).
    fn increase_per_rtt(&self, _w: f64) -> f64 {
        self.htcp.alpha(self.now)
    }

    fn on_loss(&mut self, w: f64) -> f64 {
        self.htcp.on_congestion(self.now, w)
    }

    fn end_of_rtt(&mut self, w_in_flight: f64) {
        self.now += self.rtt;
        self.htcp.on_rtt_sample(self.rtt);
        self.htcp
            .on_throughput_sample(self.now, w_in_flight / self.rtt);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{loss_rtts, simulate};
    use super::*;

    /// `htcp_alpha_update`'s unscaled factor with HZ = 1000 and Δ in ms, integer as C.
    fn kernel_factor(delta_ms: u32) -> u32 {
        const HZ: u32 = 1000;
        let mut factor = 1;
        let mut diff = delta_ms;
        if diff > HZ {
            diff -= HZ;
            factor = 1 + (10 * diff + ((diff / 2) * (diff / 2) / HZ)) / HZ;
        }
        factor
    }

    #[test]
    fn constants_are_the_kernels() {
        assert_eq!(DELTA_L, 1.0); // Li, Leith and Shorten 2007 Table II Δ^L = 1 s
        assert_eq!((FIXED_ONE, BETA_MIN, BETA_MAX), (128, 64, 102));
        assert!((f64::from(BETA_MAX) / 128.0 - 0.8).abs() < 0.004); // Li, Leith and Shorten 2007's 0.8
    }

    #[test]
    fn delta_factor_is_seed_001s_quadratic() {
        assert_eq!(delta_factor(0.0), 1.0);
        assert_eq!(delta_factor(1.0), 1.0);
        assert!((delta_factor(2.0) - 11.25).abs() < 1e-12); // 1 + 10 + 0.25
        assert!((delta_factor(5.0) - 45.0).abs() < 1e-12); // 1 + 40 + 4
    }

    #[test]
    fn delta_factor_matches_the_kernels_integer_version() {
        // The kernel truncates the sum: model − kernel in [0, 1), plus < 0.01 for its inner
        // truncations ((diff/2)² on odd diffs, then / HZ), every ms from 0 to 10 s. A wrong
        // coefficient fails this.
        for ms in 0..=10_000u32 {
            let d = delta_factor(f64::from(ms) / 1000.0) - f64::from(kernel_factor(ms));
            assert!((0.0..1.01).contains(&d), "Δ={ms} ms: diff {d}");
        }
    }

    #[test]
    fn alpha_is_standard_tcp_in_the_first_second() {
        // 2(1 − β)·1 = 1 with β = 0.5 (Li, Leith and Shorten 2007 L168: the 2(1−β) factor keeps it Reno-like).
        let mut h = Htcp::new(10.0);
        h.on_rtt_sample(0.1);
        assert_eq!(h.alpha(10.0), 1.0);
        assert_eq!(h.alpha(11.0), 1.0);
        assert!((h.alpha(12.0) - 11.25).abs() < 1e-12);
        // With β at 102/128 the same factor gives 2·(26/128) ≈ 0.41 per RTT.
        h.beta = BETA_MAX;
        assert!((h.alpha(10.5) - 2.0 * 26.0 / 128.0).abs() < 1e-12);
    }

    #[test]
    fn rtt_scaling_is_min_rtt_over_100ms_clamped() {
        let at = |min_rtt: f64| {
            let mut h = Htcp::new(0.0);
            h.on_rtt_sample(min_rtt);
            h.factor(2.0) // unscaled 11.25
        };
        assert!((at(0.1) - 11.25).abs() < 1e-12);
        assert!((at(0.05) - 5.625).abs() < 1e-12);
        assert!((at(0.2) - 22.5).abs() < 1e-12);
        assert!((at(0.5) - 22.5).abs() < 1e-12); // ratio clamped to 2
        assert!((at(0.005) - 1.125).abs() < 1e-12); // ratio clamped to 0.1
        let mut h = Htcp::new(0.0);
        h.on_rtt_sample(0.001);
        assert_eq!(h.factor(0.5), 1.0); // never below 1
        h.use_rtt_scaling = false;
        assert!((h.factor(2.0) - 11.25).abs() < 1e-12);
    }

    #[test]
    fn rtt_tracking_ignores_spikes() {
        let mut h = Htcp::new(0.0);
        h.on_rtt_sample(0.100);
        h.on_rtt_sample(0.115);
        assert_eq!((h.min_rtt, h.max_rtt), (0.100, 0.115));
        h.on_rtt_sample(0.200); // > max + 20 ms: a spike, ignored
        assert_eq!(h.max_rtt, 0.115);
        h.on_rtt_sample(0.130);
        h.on_rtt_sample(0.080);
        assert_eq!((h.min_rtt, h.max_rtt), (0.080, 0.130));
    }

    /// RTT samples climbing from `min` to `max` in 10 ms steps (larger jumps are spikes).
    fn ramp(h: &mut Htcp, min: f64, max: f64) {
        let mut rtt = min;
        while rtt < max {
            h.on_rtt_sample(rtt);
            rtt += 0.010;
        }
        h.on_rtt_sample(max);
    }

    /// A flow on a path whose RTT ramps from `min` to `max` every epoch, one congestion event
    /// every 10 s, epoch throughput `rates[k]`; returns β after each event.
    fn betas(min: f64, max: f64, rates: &[f64]) -> Vec<u32> {
        let mut h = Htcp::new(0.0);
        let mut out = vec![];
        let mut last = 0.0;
        for &rate in rates {
            ramp(&mut h, min, max);
            h.on_throughput_sample(last + min, rate); // restarts the epoch's estimate
            h.on_throughput_sample(last + 9.0, rate); // smoothed, same rate
            last += 10.0;
            h.on_congestion(last, 1000.0);
            out.push(h.beta);
        }
        out
    }

    #[test]
    fn adaptive_beta_is_min_over_max_after_the_mode_switch() {
        // Kernel order: the first event sees old_maxB = 0 (a "change"), β 0.5 and no mode
        // switch; the second (steady) sets modeswitch; the third uses min/max.
        assert_eq!(betas(0.070, 0.100, &[1e4; 4]), vec![64, 64, 89, 89]); // 0.7·128 = 89.6
        assert_eq!(betas(0.080, 0.100, &[1e4; 3])[2], BETA_MAX); // 102.4 → clamp 102
        assert_eq!(betas(0.040, 0.100, &[1e4; 3])[2], BETA_MIN); // 51.2 → clamp 64

        // min_rtt ≤ 10 ms: always 0.5.
        assert_eq!(betas(0.008, 0.009, &[1e4; 3])[2], BETA_MIN);
    }

    #[test]
    fn a_throughput_change_over_20_percent_resets_beta() {
        // 1e4 → 1.25e4 (+25 %) at the third event: β 0.5 and the mode switch drops.
        assert_eq!(
            betas(0.070, 0.100, &[1e4, 1e4, 1.25e4, 1.25e4]),
            vec![64, 64, 64, 64]
        );
        // +19 % and −19 % stay adaptive.
        assert_eq!(betas(0.070, 0.100, &[1e4, 1e4, 1.19e4])[2], 89);
        assert_eq!(betas(0.070, 0.100, &[1e4, 1e4, 0.81e4])[2], 89);
        // Without the switch the first steady event already enables it.
        let mut h = Htcp::new(0.0);
        h.use_bandwidth_switch = false;
        ramp(&mut h, 0.07, 0.1);
        h.on_congestion(1.0, 100.0);
        assert_eq!(h.beta, BETA_MIN);
        ramp(&mut h, 0.07, 0.1);
        h.on_congestion(2.0, 100.0);
        assert_eq!(h.beta, 89);
    }

    #[test]
    fn congestion_event_fades_max_rtt_and_cuts_with_fixed_point_beta() {
        let mut h = Htcp::new(0.0);
        h.on_rtt_sample(0.050);
        h.on_rtt_sample(0.060);
        h.on_rtt_sample(0.070);
        assert_eq!(h.on_congestion(3.0, 1000.9), 500.0); // β = 0.5, cwnd 1000
        assert!((h.max_rtt - (0.050 + 0.95 * 0.020)).abs() < 1e-12);
        assert_eq!(h.last_congestion, 3.0);
        // The first event set the mode switch; the second uses the faded max:
        // 0.05/0.069·128 = 92.75 → β 92, (1000·92) >> 7 = 718.
        assert_eq!(h.on_congestion(4.0, 1000.0), 718.0);
        assert_eq!(h.beta, 92);
        assert_eq!(h.on_congestion(5.0, 2.0), 2.0); // never below 2
    }

    #[test]
    fn throughput_estimate_restarts_after_congestion() {
        let mut h = Htcp::new(0.0);
        h.on_throughput_sample(1.0, 5.0); // no RTT yet: ignored
        assert_eq!(h.max_b, 0.0);
        h.on_rtt_sample(0.1);
        h.on_throughput_sample(0.3, 100.0); // within 3 RTTs of the start: restart
        assert_eq!((h.bi, h.max_b), (100.0, 100.0));
        h.on_throughput_sample(1.0, 200.0); // smoothed: (300 + 200)/4
        assert_eq!((h.bi, h.max_b), (125.0, 125.0));
        h.on_throughput_sample(1.1, 25.0); // (375 + 25)/4 = 100, max stays
        assert_eq!((h.bi, h.max_b), (100.0, 125.0));
    }

    #[test]
    fn fluid_sawtooth_first_cuts_halve_then_beta_max() {
        // Constant RTT 100 ms, C = 1000: events 1 and 2 cut to 0.5 (bandwidth switch, then
        // mode switch), later ones to 102/128 of the window.
        let cap = 1000.0;
        let t = simulate(&mut HtcpFluid::new(0.1), 500.0, 3000, cap);
        let l = loss_rtts(&t);
        assert!(l.len() > 5);
        let ratio = |i: usize| t[l[i] + 1] / t[l[i]].floor();
        assert!((ratio(0) - 0.5).abs() < 0.002);
        assert!((ratio(1) - 0.5).abs() < 0.002);
        for i in 2..l.len() {
            assert!(
                (ratio(i) - 102.0 / 128.0).abs() < 0.002,
                "cut {i}: {}",
                ratio(i)
            );
        }
    }

    #[test]
    fn fluid_epoch_matches_the_integral_of_alpha() {
        // After a cut at C with β = 102/128 the window must climb C·26/128; the k-th RTT
        // after the recovery RTT adds α(Δ = 0.1·k s) = 2·(26/128)·delta_factor(0.1·k). The
        // epoch is the recovery RTT plus the RTTs until the sum passes C (±1 for the clock's
        // rounding at the threshold).
        let cap = 10_000.0;
        let t = simulate(&mut HtcpFluid::new(0.1), 5000.0, 5000, cap);
        let l = loss_rtts(&t);
        let epoch = (l[5] - l[4]) as f64;
        let gap = t[l[4]] - t[l[4] + 1];
        let mut climbed = 0.0;
        let mut rtts = 0.0;
        while t[l[4] + 1] + climbed <= cap {
            climbed += 2.0 * 26.0 / 128.0 * delta_factor(0.1 * (rtts + 1.0));
            rtts += 1.0;
        }
        assert!(gap > 2000.0);
        assert!(
            (epoch - (rtts + 1.0)).abs() <= 1.0,
            "epoch {epoch}, integral {rtts}"
        );
        // And much shorter than Reno's gap/1 RTTs: H-TCP's point.
        assert!(epoch < gap / 10.0);
    }
}
