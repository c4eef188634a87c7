//! How long a probe runs: its trials' lengths on a path of a given RTT, and the least budget
//! that fits them.

use std::time::Duration;

/// What a probe takes when not told: enough for a first trial and a few candidates on paths
/// up to about 130 ms; longer paths get what their RTT needs ([`min_budget`]).
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(10);

/// How long a trial on a path of round-trip time `rtt` runs, and what a session costs to set
/// up around it (connect, handshake, request, joins: about four round trips). The set-up is
/// the least it can cost, for the shortest budget; the schedule uses what the trials took.
pub(crate) fn trial_times(rtt: f64) -> (f64, f64) {
    ((20.0 * rtt).max(1.0), 4.0 * rtt + 0.05)
}

/// How long the first trial runs: the meter needs about 15 round trips to fill a path at
/// 1 Gbit/s, then the tuned transfer runs ten more.
pub(crate) fn first_trial_time(rtt: f64) -> f64 {
    (25.0 * rtt).clamp(2.0, 6.0)
}

/// The shortest budget that fits the first trial and two more.
pub fn min_budget(rtt: Duration) -> Duration {
    let rtt = rtt.as_secs_f64();
    let (trial, setup) = trial_times(rtt);
    Duration::from_secs_f64(first_trial_time(rtt) + 3.0 * setup + 2.0 * trial)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_must_fit_three_trials() {
        // 60 ms: 2.4 s + 3 × 0.29 s of set-up + 2 × 1 s.
        let b = min_budget(Duration::from_millis(60)).as_secs_f64();
        assert!((b - 5.27).abs() < 0.01, "{b}");
        // 120 ms: 3 s + 3 × 0.53 s + 2 × 2.4 s.
        let b = min_budget(Duration::from_millis(120)).as_secs_f64();
        assert!((b - 9.39).abs() < 0.01, "{b}");
        assert!(min_budget(Duration::from_millis(250)).as_secs_f64() > 10.0);
    }
}
