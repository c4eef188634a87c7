//! Desynchronizing the channels (Cui 2013 ch. 4–5, Antony et al. 2003): staggered starts so
//! slow starts do not overlap, and pacing caps that keep the channels together just below
//! the bottleneck rate, so they never fill its queue in lock step.

use std::time::Duration;

use rand::Rng;

pub use super::online::PACE_GAIN;

/// Longest an automatic stagger spreads the channel starts over.
pub const MAX_AUTO_STAGGER: Duration = Duration::from_secs(3);

/// What the user chose with `--stagger`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StaggerChoice {
    /// Two RTTs apart with up to a quarter step of random jitter, spread over at most
    /// [`MAX_AUTO_STAGGER`].
    Auto,
    /// Exactly this far apart.
    Fixed(Duration),
    /// All channels start at once.
    Off,
}

/// The stagger a transfer runs with. An automatic stagger is off when the online tuner's
/// meter starts the channels (they start paced below the measured rate) and for DMCTCP: its
/// group rules are what desynchronize the channels (Cui 2013 ch. 5), and a channel that
/// starts RTTs after the others leaves slow start at the group's first ssthresh, far from
/// its share. An explicit `--stagger` is kept.
///
/// # Examples
///
/// ```
/// use hsxfer::tuning::desync::{effective_stagger, StaggerChoice};
///
/// let dmctcp = vec!["dmctcp".to_string()];
/// assert_eq!(effective_stagger(StaggerChoice::Auto, &dmctcp, false), StaggerChoice::Off);
/// assert_eq!(effective_stagger(StaggerChoice::Auto, &[], false), StaggerChoice::Auto);
/// ```
pub fn effective_stagger(choice: StaggerChoice, cc: &[String], metered: bool) -> StaggerChoice {
    let grouped = cc.iter().any(|c| crate::tuning::models::dmctcp::grouped(c));
    match choice {
        StaggerChoice::Auto if metered || grouped => StaggerChoice::Off,
        other => other,
    }
}

/// Start offset of each channel from the start of the data phase.
pub fn stagger_offsets(
    choice: StaggerChoice,
    channels: u16,
    rtt: Duration,
    rng: &mut impl Rng,
) -> Vec<Duration> {
    let n = channels as u32;
    match choice {
        StaggerChoice::Off => vec![Duration::ZERO; n as usize],
        StaggerChoice::Fixed(step) => (0..n).map(|i| step * i).collect(),
        StaggerChoice::Auto => {
            let spread_cap = MAX_AUTO_STAGGER / n.saturating_sub(1).max(1);
            let step = (rtt * 2).max(Duration::from_millis(1)).min(spread_cap);
            (0..n)
                .map(|i| {
                    if i == 0 {
                        return Duration::ZERO;
                    }
                    let jitter = step.mul_f64(rng.gen_range(0.0..0.25));
                    step * i + jitter
                })
                .collect()
        }
    }
}

/// What the user chose with `--pace`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaceChoice {
    /// With a known bottleneck rate: each channel capped at [`PACE_GAIN`] × rate/N, so that
    /// together they send just below the rate; without one, the online tuner measures it.
    Auto,
    /// The same cap on every channel, bytes/s.
    Fixed(u64),
    /// No caps.
    Off,
}

/// Pacing cap of each channel in bytes/s (`SO_MAX_PACING_RATE`), or `None` for no cap, for
/// a bottleneck of `goodput_bps` bits/s of payload (TCP paces payload bytes).
///
/// Caps that add up to more than the rate (this module first spread them over 1.05–1.15 ×
/// rate/N, "never below the rate") keep the queue filling: measured at 1 Gbit/s × 60 ms with
/// a 64-packet queue, four cubic channels so capped moved 720 Mbit/s; capped at 0.97 × the
/// goodput rate in total they move 928 Mbit/s with no retransmission at all.
pub fn pacing_caps(
    choice: PaceChoice,
    channels: u16,
    goodput_bps: Option<u64>,
) -> Vec<Option<u64>> {
    let n = channels.max(1) as usize;
    match (choice, goodput_bps) {
        (PaceChoice::Off, _) | (PaceChoice::Auto, None) => vec![None; n],
        (PaceChoice::Fixed(c), _) => vec![Some(c); n],
        (PaceChoice::Auto, Some(rate)) => {
            vec![Some((PACE_GAIN * rate as f64 / 8.0 / n as f64).ceil() as u64); n]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn fixed_stagger_is_exact_and_auto_is_jittered_around_two_rtts() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let ms = Duration::from_millis;
        assert_eq!(
            stagger_offsets(StaggerChoice::Fixed(ms(300)), 3, ms(50), &mut rng),
            vec![ms(0), ms(300), ms(600)]
        );
        assert_eq!(
            stagger_offsets(StaggerChoice::Off, 2, ms(50), &mut rng),
            vec![ms(0), ms(0)]
        );
        let a = stagger_offsets(StaggerChoice::Auto, 4, ms(50), &mut rng);
        for (i, o) in a.iter().enumerate().skip(1) {
            let base = ms(100) * i as u32;
            assert!(*o >= base && *o < base + ms(25), "channel {i}: {o:?}");
        }
        // A long RTT with many channels stays within the cap.
        let b = stagger_offsets(StaggerChoice::Auto, 32, ms(250), &mut rng);
        assert!(*b.last().unwrap() <= MAX_AUTO_STAGGER + MAX_AUTO_STAGGER / 31 / 4 + ms(1));
    }

    #[test]
    fn dmctcp_and_the_meter_turn_only_an_automatic_stagger_off() {
        let ms = Duration::from_millis;
        let dmctcp = ["cubic".to_string(), "dmctcp".to_string()];
        let cubic = ["cubic".to_string()];
        assert_eq!(
            effective_stagger(StaggerChoice::Auto, &dmctcp, false),
            StaggerChoice::Off
        );
        assert_eq!(
            effective_stagger(StaggerChoice::Auto, &cubic, true),
            StaggerChoice::Off
        );
        assert_eq!(
            effective_stagger(StaggerChoice::Auto, &cubic, false),
            StaggerChoice::Auto
        );
        // What the user asked for is kept.
        assert_eq!(
            effective_stagger(StaggerChoice::Fixed(ms(120)), &dmctcp, true),
            StaggerChoice::Fixed(ms(120))
        );
    }

    #[test]
    fn auto_pacing_keeps_the_channels_together_just_below_the_rate() {
        let caps = pacing_caps(PaceChoice::Auto, 4, Some(956_000_000));
        let caps: Vec<u64> = caps.into_iter().map(Option::unwrap).collect();
        // 0.97 × 956 Mbit/s / 8 / 4 = 28.98 MB/s each.
        assert_eq!(caps, vec![28_978_750; 4]);
        let total = caps.iter().sum::<u64>() as f64 * 8.0;
        assert!(total < 956e6 && total > 0.96 * 956e6, "{total}");
        assert_eq!(pacing_caps(PaceChoice::Auto, 2, None), vec![None, None]);
        assert_eq!(
            pacing_caps(PaceChoice::Fixed(5), 2, Some(1)),
            vec![Some(5), Some(5)]
        );
    }
}
