//! What a trial measured, read from its sending sockets' trace (the sampler's `TCP_INFO`
//! readings) and from its online tuner's report: the steady goodput, the peak, the RTT while
//! the meter overfilled the path, the meter's losses and the rate it found.

use std::collections::HashMap;

use crate::channels::telemetry::{MeterEnd, Sample, TunerReport};

/// The bottleneck rate, bytes/s, that the first trial's meter measured (raised by any probe
/// above it that the path delivered); `None` unless the meter filled the path. Not the
/// estimate that losses at the caps lowered since: on a busy host such losses come from
/// late ACKs as often as from the path, the trials and copies that follow lower it again
/// if they must, and a copy saves the measured rate in its profile too
/// (`session::probe::learned_profile`).
///
/// A meter that stopped growing without a loss on a long path left caps at its rate (the
/// path carried it): that rate, or what a probe above it delivered, is a floor the trials
/// pace at. Without it the probe tried only unpaced configurations, and on 1 Gbit/s × 60
/// ms × 64 packets, where one channel of this host plateaus near the link's rate, it
/// recommended `--pace off` (about 10 % of the link) in 2 of 7 runs.
///
/// Returns the rate and whether it is only such a floor.
pub(crate) fn path_rate(tuner: &TunerReport) -> Option<(f64, bool)> {
    let (bps, floor) = match tuner.meter {
        Some(MeterEnd::Full) => (tuner.measured_bps, false),
        Some(MeterEnd::Plateau) => (tuner.measured_bps.or(tuner.rate_bps), true),
        _ => (None, false),
    };
    bps.map(|b| (b as f64 / 8.0, floor))
}

/// Segments a channel delivers before its smoothed RTT counts: by then it has forgotten the
/// handshake's RTT, which includes the server's accept (the srtt keeps 7/8 per ACK).
const SRTT_SETTLED_SEGMENTS: u32 = 100;

/// Rounds (of the minimum RTT) after the meter's end whose readings still count for the
/// queue: the meter offered up to 2.89× what the path delivered until it stopped, and that
/// excess reaches the queue, and its ACKs come back, within about two rounds.
const QUEUE_ROUNDS_AFTER_METER: f64 = 3.0;

/// The smoothed RTT under load (`base` is the minimum RTT, seconds): the highest any channel
/// held over two fresh readings while the path was offered more than it carries, that is
/// while the first channel metered alone (its meter ends at a loss, or once the queue grew
/// the RTT by 15 %) and for [`QUEUE_ROUNDS_AFTER_METER`] rounds after another channel first
/// delivered.
///
/// Later readings do not count: the channels then run paced below the rate, so the
/// bottleneck's queue can only drain, and an RTT that still grows is the end hosts'. On
/// 1 Gbit/s × 60 ms × 64 packets (0.8 ms of queue) the channels' RTT rose by up to 12 ms
/// while paced at 97–98.5 % of the rate, and the 95th percentile over the whole trial,
/// counted before, read a queue of 92–878 packets.
///
/// Only readings that carry a fresh RTT count: those of a channel that delivered since its
/// previous reading, and more than [`SRTT_SETTLED_SEGMENTS`] in all. A waiting channel (for
/// the meter, or after its last block) repeats the srtt of its last ACK, its handshake's at
/// first; counted, such readings made a 16-packet queue look like 80. Held over two: one
/// reading's spike (a late release of the delay element, a late tick) made a 16-packet queue
/// read 75 one probe in nine.
///
/// A loss in that span shows the queue overflowed, so the reading is its size; without one
/// the meter stopped before it filled (a plateau, or a deep queue that grew the RTT by 15 %
/// first), and the reading is only a floor.
pub(crate) fn loaded_srtt(samples: &[Sample], base: f64) -> Loaded {
    let until =
        meter_end(samples).map_or(f64::INFINITY, |end| end + QUEUE_ROUNDS_AFTER_METER * base);
    let mut delivered: HashMap<u16, u32> = HashMap::new();
    let mut previous: HashMap<u16, u32> = HashMap::new();
    let (mut loaded, mut overflowed) = (0, false);
    for s in samples.iter().take_while(|s| s.t <= until) {
        overflowed |= s.tcp.total_retrans > 0;
        let Some(before) = delivered.insert(s.channel, s.tcp.delivered) else {
            continue;
        };
        if s.tcp.delivered <= before {
            continue;
        }
        if s.tcp.delivered > SRTT_SETTLED_SEGMENTS {
            if let Some(p) = previous.insert(s.channel, s.tcp.rtt_us) {
                loaded = loaded.max(s.tcp.rtt_us.min(p));
            }
        }
    }
    Loaded {
        rtt: loaded as f64 / 1e6,
        overflowed,
    }
}

/// Rounds after the meter's first loss whose retransmissions count with it: slow start's
/// overflow of a queue shows within a round, and its retransmissions within the next.
const METER_LOSS_ROUNDS: f64 = 2.0;

/// Segments the meter's channel (0) retransmitted from its first loss to
/// [`METER_LOSS_ROUNDS`] rounds (of the minimum RTT `base`) later, if that loss came while it
/// metered alone, before another channel delivered; `None` for a meter that ended without a
/// loss ([`lone_losses`](super::lone_losses) reads them).
pub(crate) fn meter_losses(samples: &[Sample], base: f64) -> Option<u32> {
    let end = meter_end(samples).unwrap_or(f64::INFINITY);
    let mut meter = samples.iter().filter(|s| s.channel == 0);
    let first = meter
        .find(|s| s.tcp.total_retrans > 0)
        .filter(|s| s.t <= end)?;
    let until = first.t + METER_LOSS_ROUNDS * base;
    let later = meter.take_while(|s| s.t <= until).last();
    Some(later.unwrap_or(first).tcp.total_retrans)
}

/// When the first trial's meter ended: the first reading in which a channel other than the
/// meter's (0) had delivered since its previous one (the others wait for the meter); `None`
/// if none did.
fn meter_end(samples: &[Sample]) -> Option<f64> {
    let mut delivered: HashMap<u16, u32> = HashMap::new();
    samples.iter().find_map(|s| {
        let before = delivered.insert(s.channel, s.tcp.delivered)?;
        (s.channel != 0 && s.tcp.delivered > before).then_some(s.t)
    })
}

/// The RTT while the first trial overfilled the path ([`loaded_srtt`]).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Loaded {
    /// Seconds.
    pub(crate) rtt: f64,
    /// Whether a segment was lost meanwhile: the queue overflowed, and the reading is its
    /// size rather than a floor.
    pub(crate) overflowed: bool,
}

/// A trial's goodput and retransmissions over the second half of its samples ([`steady`]).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Steady {
    /// Bytes/s delivered, all channels.
    pub(crate) goodput: f64,
    /// Segments retransmitted per segment delivered.
    pub(crate) retransmit_rate: f64,
}

/// Goodput and retransmissions of all channels over the second half of the samples' span.
pub(crate) fn steady(samples: &[Sample]) -> Steady {
    let (Some(t0), Some(t1)) = (
        samples.iter().map(|s| s.t).reduce(f64::min),
        samples.iter().map(|s| s.t).reduce(f64::max),
    ) else {
        return Steady::default();
    };
    let from = t0 + (t1 - t0) / 2.0;
    let channels = samples.iter().map(|s| s.channel).max().unwrap_or(0) as usize + 1;
    let (mut bytes, mut segments, mut retrans) = (0u64, 0u64, 0u64);
    for ch in 0..channels {
        let mine: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.channel as usize == ch)
            .collect();
        let (Some(a), Some(b)) = (mine.iter().find(|s| s.t >= from), mine.last()) else {
            continue;
        };
        let d = b.tcp.delivered.saturating_sub(a.tcp.delivered) as u64;
        segments += d;
        bytes += d * b.tcp.mss as u64;
        retrans += b.tcp.total_retrans.saturating_sub(a.tcp.total_retrans) as u64;
    }
    Steady {
        goodput: bytes as f64 / (t1 - from).max(1e-3),
        retransmit_rate: retrans as f64 / segments.max(1) as f64,
    }
}

/// The most all channels delivered over any 100 ms of the trace, bytes/s.
pub(crate) fn peak(samples: &[Sample]) -> f64 {
    // Σ delivered bytes at each sampling tick (all channels are read at the same t).
    let mut sorted: Vec<&Sample> = samples.iter().collect();
    sorted.sort_by(|a, b| a.t.total_cmp(&b.t));
    let mut last: Vec<u64> = Vec::new();
    let mut ticks: Vec<(f64, u64)> = Vec::new();
    for (k, s) in sorted.iter().enumerate() {
        let i = s.channel as usize;
        if last.len() <= i {
            last.resize(i + 1, 0);
        }
        last[i] = s.tcp.delivered as u64 * s.tcp.mss as u64;
        if sorted.get(k + 1).is_none_or(|n| n.t > s.t) {
            ticks.push((s.t, last.iter().sum()));
        }
    }
    let mut best: f64 = 0.0;
    let mut j = 0;
    for i in 0..ticks.len() {
        while j < i && ticks[i].0 - ticks[j + 1].0 >= 0.1 {
            j += 1;
        }
        let span = ticks[i].0 - ticks[j].0;
        if span >= 0.1 {
            best = best.max((ticks[i].1 - ticks[j].1) as f64 / span);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channels::telemetry::TcpSample;

    fn sample(t: f64, channel: u16, delivered: u32, total_retrans: u32) -> Sample {
        Sample {
            t,
            channel,
            tcp: TcpSample {
                delivered,
                total_retrans,
                mss: 1000,
                ..Default::default()
            },
        }
    }

    #[test]
    fn steady_goodput_is_the_second_half() {
        // Two channels; the first half delivers little, the second 100 segments per 10 ms
        // on each channel: 20 MB/s, and 1 retransmission per 1000 segments.
        let mut s = Vec::new();
        for k in 0..=200u32 {
            let t = k as f64 * 0.01;
            let d = if k <= 100 { k } else { 100 + (k - 100) * 100 };
            for ch in 0..2 {
                s.push(sample(t, ch, d, d / 1000));
            }
        }
        let st = steady(&s);
        assert!((st.goodput - 20e6).abs() < 1e3, "{st:?}");
        assert!((st.retransmit_rate - 0.001).abs() < 2e-4, "{st:?}");
        assert!((peak(&s) - 20e6).abs() < 1e3);
        assert_eq!(steady(&[]).goodput, 0.0);
    }

    #[test]
    fn the_path_rate_is_the_measured_one_not_the_estimate_losses_lowered() {
        let mut tuner = TunerReport {
            rate_bps: Some(177_000_000),
            measured_bps: Some(189_000_000),
            meter: Some(MeterEnd::Full),
            ..Default::default()
        };
        assert_eq!(path_rate(&tuner), Some((189e6 / 8.0, false)));
        tuner.meter = Some(MeterEnd::WindowLimited);
        assert_eq!(path_rate(&tuner), None);
        tuner.meter = Some(MeterEnd::Timeout);
        assert_eq!(path_rate(&tuner), None);
    }

    #[test]
    fn a_meter_that_plateaued_on_a_long_path_gives_the_trials_a_floor() {
        // The tuner left caps at the plateau's 948 Mbit/s; a probe above it paid.
        let mut tuner = TunerReport {
            rate_bps: Some(948_000_000),
            meter: Some(MeterEnd::Plateau),
            ..Default::default()
        };
        assert_eq!(path_rate(&tuner), Some((948e6 / 8.0, true)));
        tuner.measured_bps = Some(990_000_000);
        assert_eq!(path_rate(&tuner), Some((990e6 / 8.0, true)));
        // On a short path a plateau leaves no caps and no rate.
        tuner.rate_bps = None;
        tuner.measured_bps = None;
        assert_eq!(path_rate(&tuner), None);
    }

    #[test]
    fn the_loaded_rtt_counts_fresh_readings_while_the_path_was_overfilled() {
        // Channel 0 meters alone for 50 ticks at 40.5 ms, 41 ms at its end and a one-reading
        // spike of 60 ms; channel 1 waits meanwhile, repeating its handshake's 45 ms, then
        // both deliver at 40.5 ms (from t = 0.51 s). The minimum RTT is 40 ms.
        let mut s = Vec::new();
        for k in 0..200u32 {
            let mut a = sample(k as f64 * 0.01, 0, 200 + 10 * k, 0);
            a.tcp.rtt_us = match k {
                48 | 49 => 41_000,
                20 => 60_000,
                _ => 40_500,
            };
            let mut b = sample(k as f64 * 0.01, 1, 200 + 10 * k.saturating_sub(50), 0);
            b.tcp.rtt_us = if k <= 50 { 45_000 } else { 40_500 };
            s.push(a);
            s.push(b);
        }
        let loaded = |s: &[Sample]| loaded_srtt(s, 0.04).rtt * 1e3;
        assert!((loaded(&s) - 41.0).abs() < 1e-6, "{}", loaded(&s));
        // The meter's excess still queued in the rounds after it: 42 ms held by channel 1
        // within three rounds (0.12 s) of its first delivery counts.
        for k in [55, 56] {
            s[2 * k + 1].tcp.rtt_us = 42_000;
        }
        assert!((loaded(&s) - 42.0).abs() < 1e-6, "{}", loaded(&s));
        // Later, with the channels paced below the rate, the queue cannot grow: 50 ms held
        // by both channels for a second is the end hosts' delay, not the bottleneck's.
        for x in &mut s[2 * 80..2 * 180] {
            x.tcp.rtt_us = 50_000;
        }
        assert!((loaded(&s) - 42.0).abs() < 1e-6, "{}", loaded(&s));
        assert_eq!(loaded_srtt(&[], 0.0).rtt, 0.0);

        // No loss while the path was overfilled: the queue did not overflow, and the
        // reading is a floor. A loss after those rounds does not change that; one within
        // them does.
        assert!(!loaded_srtt(&s, 0.04).overflowed);
        for x in &mut s[2 * 100..] {
            x.tcp.total_retrans = 3;
        }
        assert!(!loaded_srtt(&s, 0.04).overflowed);
        for x in &mut s[2 * 49..] {
            x.tcp.total_retrans = 3;
        }
        assert!(loaded_srtt(&s, 0.04).overflowed);
    }

    #[test]
    fn the_meters_losses_count_from_its_first_over_two_rounds() {
        // Channel 0 meters alone until t = 0.5 s, channel 1 delivers from then; 60 ms RTT.
        let trial = |retrans: &dyn Fn(u32) -> u32| -> Vec<Sample> {
            (0..150u32)
                .flat_map(|k| {
                    let t = k as f64 * 0.01;
                    [
                        sample(t, 0, 10 + 20 * k, retrans(k)),
                        sample(t, 1, 5 + 20 * k.saturating_sub(50), 0),
                    ]
                })
                .collect()
        };
        // A queue's overflow: 37 at once at 0.3 s, 60 more a round later, none after.
        let overflow = trial(&|k| match k {
            0..30 => 0,
            30..36 => 37,
            _ => 97,
        });
        assert_eq!(meter_losses(&overflow, 0.06), Some(97));
        // Random loss: one at 0.3 s, one a round later, and later ones that do not count.
        let random = trial(&|k| (k >= 30) as u32 + (k >= 36) as u32 + (k >= 45) as u32);
        assert_eq!(meter_losses(&random, 0.06), Some(2));
        // A loss only once the other channels run did not end the meter.
        let late = trial(&|k| (k >= 60) as u32);
        assert_eq!(meter_losses(&late, 0.06), None);
        assert_eq!(meter_losses(&trial(&|_| 0), 0.06), None);
    }
}
