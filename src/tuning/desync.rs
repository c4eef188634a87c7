//! Desynchronizing the channels (seed 003 ch. 4–5, seed 004): staggered starts so slow
//! starts do not overlap, and slightly different pacing caps so channels do not move, fill
//! the queue and back off in lock step.

use std::time::Duration;

use rand::Rng;

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
    /// With a known bottleneck rate: caps spread over 1.05–1.15 × rate/N, so channels differ
    /// and the total is never capped below the rate; without one, no caps.
    Auto,
    /// The same cap on every channel, bytes/s.
    Fixed(u64),
    /// No caps.
    Off,
}

/// Pacing cap of each channel in bytes/s (`SO_MAX_PACING_RATE`), or `None` for no cap.
pub fn pacing_caps(choice: PaceChoice, channels: u16, rate_bps: Option<u64>) -> Vec<Option<u64>> {
    let n = channels.max(1) as usize;
    match (choice, rate_bps) {
        (PaceChoice::Off, _) | (PaceChoice::Auto, None) => vec![None; n],
        (PaceChoice::Fixed(c), _) => vec![Some(c); n],
        (PaceChoice::Auto, Some(rate)) => {
            let share = rate as f64 / 8.0 / n as f64;
            (0..n)
                .map(|i| {
                    let spread = if n > 1 {
                        i as f64 / (n - 1) as f64
                    } else {
                        0.0
                    };
                    Some((share * (1.05 + 0.10 * spread)).ceil() as u64)
                })
                .collect()
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
    fn auto_pacing_differs_per_channel_and_never_caps_below_the_rate() {
        let caps = pacing_caps(PaceChoice::Auto, 4, Some(1_000_000_000));
        let caps: Vec<u64> = caps.into_iter().map(Option::unwrap).collect();
        assert!(caps.windows(2).all(|w| w[0] < w[1]));
        assert!(caps.iter().sum::<u64>() >= 125_000_000);
        assert_eq!(caps[0], 32_812_500);
        assert_eq!(pacing_caps(PaceChoice::Auto, 2, None), vec![None, None]);
        assert_eq!(
            pacing_caps(PaceChoice::Fixed(5), 2, Some(1)),
            vec![Some(5), Some(5)]
        );
    }
}
