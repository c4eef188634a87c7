//! Reference models of the window rules of the congestion controls hsxfer ships as BPF
//! `struct_ops` programs (Reno as the baseline, HighSpeed, Scalable, H-TCP, BIC and the
//! channel group of DMCTCP).
//!
//! Pure arithmetic, no I/O and no clocks: windows are in segments (`f64`), times in seconds,
//! and every input (time, RTT, throughput) is passed explicitly. The models serve two uses:
//! unit tests against published tables and formulas (RFC 3649, the seeds, the Linux sources),
//! and comparing cwnd traces of the real BPF programs with what the rules predict ("after a
//! loss at cwnd `w` the window became ≈ `on_loss(w)`", "per RTT the window grew by ≈
//! `increase_per_rtt(w)`").
//!
//! Conventions shared by all models:
//! - The kernel's cwnd is an integer; the loss rules work on `floor(w)` with the kernel's
//!   integer arithmetic (shifts, truncating divisions), so `on_loss` returns what the kernel's
//!   `ssthresh()` hook would return, never less than 2.
//! - `increase_per_rtt` is the congestion-avoidance growth over one RTT in which `w` segments
//!   are acknowledged (one ACK per segment). Slow start is not modelled by [`WindowRules`].
//! - The window after a loss is taken to be ssthresh (fast recovery ends at ssthresh).

pub mod bic;
pub mod dmctcp;
pub mod highspeed;
pub mod htcp;
pub mod reno;
pub mod scalable;

pub use bic::Bic;
pub use dmctcp::{DmcGroup, LossDecision};
pub use highspeed::HighSpeed;
pub use htcp::{Htcp, HtcpFluid};
pub use reno::Reno;
pub use scalable::Scalable;

/// Smallest ssthresh any of the modelled kernels returns (the `2U` in every `ssthresh()`).
pub const MIN_SSTHRESH: f64 = 2.0;

/// A single-flow window rule set: what one congestion control does to one connection's
/// window, per RTT and per loss.
pub trait WindowRules {
    /// Name as registered with the kernel (`"highspeed"`, `"bic"`, ...).
    fn name(&self) -> &'static str;

    /// Congestion-avoidance increase, in segments per RTT, at window `w`.
    fn increase_per_rtt(&self, w: f64) -> f64;

    /// ssthresh (the window after recovery) for a loss at window `w`. Updates the model's
    /// state where the rule keeps some (BIC's `w_max`, H-TCP's epoch and β).
    fn on_loss(&mut self, w: f64) -> f64;

    /// End of one RTT in which `w_in_flight` segments were sent. Rules that depend on time or
    /// on measurements (H-TCP) advance their clock and feed their estimators here; the others
    /// ignore it. [`simulate`] calls it once per simulated RTT.
    fn end_of_rtt(&mut self, _w_in_flight: f64) {}
}

/// The kernel's integer cwnd for a fluid window `w`: `floor(w)`, 0 for non-finite or
/// negative input.
pub(crate) fn kernel_cwnd(w: f64) -> u64 {
    if w.is_finite() && w > 0.0 {
        w.floor() as u64
    } else {
        0
    }
}

/// Deterministic fluid simulation of one flow through a bufferless bottleneck of
/// `capacity_w` segments per RTT; returns the window at the start of each of `rtts` RTTs.
///
/// Every RTT in which the window exceeds `capacity_w` has a loss: the next RTT starts at
/// `rules.on_loss(w)` (the loss RTT itself is spent in recovery, without growth). Otherwise the
/// window grows by `rules.increase_per_rtt(w)`. This shows each rule's sawtooth without any
/// randomness, which is what the shape tests (epoch length, response function) need.
pub fn simulate<R: WindowRules + ?Sized>(
    rules: &mut R,
    start_w: f64,
    rtts: usize,
    capacity_w: f64,
) -> Vec<f64> {
    let mut trace = Vec::with_capacity(rtts);
    let mut w = start_w;
    for _ in 0..rtts {
        trace.push(w);
        let next = if w > capacity_w {
            rules.on_loss(w)
        } else {
            w + rules.increase_per_rtt(w)
        };
        rules.end_of_rtt(w);
        w = next;
    }
    trace
}

/// Indices of the RTTs of a trace in which a loss was detected, i.e. the window of the next
/// RTT is smaller. Works on [`simulate`] output and on per-RTT samples of a real trace.
pub fn loss_rtts(trace: &[f64]) -> Vec<usize> {
    trace
        .windows(2)
        .enumerate()
        .filter(|(_, pair)| pair[1] < pair[0])
        .map(|(i, _)| i)
        .collect()
}

/// Lengths in RTTs of the complete loss-to-loss epochs of a trace (differences between
/// successive [`loss_rtts`]).
pub fn epoch_lengths(trace: &[f64]) -> Vec<usize> {
    loss_rtts(trace).windows(2).map(|p| p[1] - p[0]).collect()
}

#[cfg(test)]
pub(crate) mod test_util {
    /// Mean of a slice (NaN when empty).
    pub(crate) fn mean<T: Copy + Into<f64>>(xs: &[T]) -> f64 {
        xs.iter().map(|&x| x.into()).sum::<f64>() / xs.len() as f64
    }

    /// Mean of `epoch_lengths` as `f64`, skipping the first `skip` epochs (start-up).
    pub(crate) fn mean_epoch(trace: &[f64], skip: usize) -> f64 {
        let e: Vec<f64> = super::epoch_lengths(trace)
            .into_iter()
            .skip(skip)
            .map(|x| x as f64)
            .collect();
        assert!(!e.is_empty(), "no complete epoch in the trace");
        mean(&e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fixed +1 per RTT, fixed ssthresh 10: makes the simulator's bookkeeping checkable.
    struct Toy;
    impl WindowRules for Toy {
        fn name(&self) -> &'static str {
            "toy"
        }
        fn increase_per_rtt(&self, _w: f64) -> f64 {
            1.0
        }
        fn on_loss(&mut self, _w: f64) -> f64 {
            10.0
        }
    }

    #[test]
    fn simulate_grows_then_cuts_after_exceeding_capacity() {
        let t = simulate(&mut Toy, 10.0, 10, 12.0);
        // 10, 11, 12 are <= capacity and grow; 13 exceeds it and the next RTT starts at 10.
        assert_eq!(
            t,
            vec![10.0, 11.0, 12.0, 13.0, 10.0, 11.0, 12.0, 13.0, 10.0, 11.0]
        );
        assert_eq!(loss_rtts(&t), vec![3, 7]);
        assert_eq!(epoch_lengths(&t), vec![4]);
    }

    #[test]
    fn simulate_works_through_a_trait_object() {
        let mut r: Box<dyn WindowRules> = Box::new(Reno);
        let t = simulate(r.as_mut(), 2.0, 5, 1e9);
        assert_eq!(t, vec![2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(r.name(), "reno");
    }

    #[test]
    fn kernel_cwnd_floors_and_rejects_garbage() {
        assert_eq!(kernel_cwnd(10.9), 10);
        assert_eq!(kernel_cwnd(-3.0), 0);
        assert_eq!(kernel_cwnd(f64::NAN), 0);
        assert_eq!(kernel_cwnd(f64::INFINITY), 0);
    }

    #[test]
    fn names_match_the_kernel_registrations() {
        // The names the BPF programs register (and tcp_*.c use): what TCP_CONGESTION takes.
        let mut models: Vec<Box<dyn WindowRules>> = vec![
            Box::new(Reno),
            Box::new(HighSpeed),
            Box::new(Scalable),
            Box::new(HtcpFluid::new(0.1)),
            Box::new(Bic::default()),
        ];
        let names: Vec<_> = models.iter_mut().map(|m| m.name()).collect();
        assert_eq!(names, ["reno", "highspeed", "scalable", "htcp", "bic"]);
        assert_eq!(dmctcp::NAME, "dmctcp");
    }
}
