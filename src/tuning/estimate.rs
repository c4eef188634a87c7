//! What the sending sockets' `TCP_INFO` says about the path while data moves: the base RTT,
//! the rate each channel and all of them deliver, losses, and whether the channels are held
//! back by a window (the peer's receive window or their own send buffer) rather than by the
//! path. Pure: fed timestamped readings, it owns no clock and no socket, so the online tuner
//! and the probe that use it are tested on simulated paths.
//!
//! Two rate measures, for two jobs:
//! - **Per-channel delivery rate**, the kernel's own per-ACK estimate (`tcpi_delivery_rate`,
//!   net/ipv4/tcp_rate.c): each sample spans about one RTT and takes the longer of the send
//!   and ACK intervals, so ACK compression does not inflate it. A robust maximum of it over a
//!   channel that has just overfilled the bottleneck is the bottleneck rate (the bandwidth
//!   filter of BBR, Cardwell et al. 2016, works the same way).
//! - **Aggregate goodput over a window** from `tcpi_delivered` (segments delivered, SACKed
//!   ones included, so it does not jump when a retransmission fills a hole, as
//!   `bytes_acked` does): what all channels together moved, for comparing configurations.

use std::collections::VecDeque;

use crate::channels::telemetry::TcpSample;
use crate::metrics::LossDetector;

/// How far back the aggregate history reaches, seconds.
const HISTORY_S: f64 = 30.0;

/// Readings a robust maximum needs in a row: a rate counts only when it held for this many
/// consecutive samples, so one outlying sample cannot set the bottleneck rate.
const PLATEAU_SAMPLES: usize = 3;

/// One channel as the estimator follows it.
#[derive(Debug, Clone, Default)]
struct Track {
    last: Option<(f64, TcpSample)>,
    detector: LossDetector,
    losses: u32,
    last_loss_at: Option<f64>,
    /// Bytes delivered since the channel was first seen.
    delivered_bytes: u64,
    /// The last few delivery-rate samples, for the robust maximum.
    recent_rates: VecDeque<u64>,
    /// `(t, delivery rate)` of every reading with progress, for maxima over a span.
    rate_history: VecDeque<(f64, u64)>,
    plateau_max: u64,
    max_cwnd: u32,
    max_srtt_us: u32,
    /// When the channel last delivered anything.
    last_progress_at: Option<f64>,
    /// `(t, busy_us, window_limited_us)` readings, for the window-limited fraction.
    limits: VecDeque<(f64, u64, u64)>,
}

/// Everything one sampling tick taught, for the tuner's decisions.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tick {
    /// Seconds of this tick.
    pub t: f64,
    /// Channels that entered loss recovery (or retransmitted) since the previous tick.
    pub new_losses: Vec<usize>,
}

/// Follows a transfer's sending channels from their `TCP_INFO` readings.
#[derive(Debug, Clone, Default)]
pub struct PathEstimator {
    tracks: Vec<Track>,
    /// `(t, Σ delivered bytes)` of every tick, oldest first.
    history: VecDeque<(f64, u64)>,
    /// The aggregate rate of the last few ticks, and the most any of them held.
    tick_rates: VecDeque<f64>,
    tick_rate_max: f64,
    min_rtt_us: Option<u32>,
    last_t: f64,
}

impl PathEstimator {
    /// An estimator with no readings yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one sampling tick: `readings[i]` is channel i's `TCP_INFO` at time `t` (seconds
    /// on any monotonic clock), or `None` when the channel has no socket (yet, or any more).
    pub fn observe(&mut self, t: f64, readings: &[Option<TcpSample>]) -> Tick {
        if self.tracks.len() < readings.len() {
            self.tracks.resize_with(readings.len(), Track::default);
        }
        let mut tick = Tick {
            t,
            new_losses: Vec::new(),
        };
        for (i, r) in readings.iter().enumerate() {
            let Some(s) = r else { continue };
            let tr = &mut self.tracks[i];
            if tr.detector.on_sample(s.recovering(), s.total_retrans) {
                tr.losses += 1;
                tr.last_loss_at = Some(t);
                tick.new_losses.push(i);
            }
            let moved = match &tr.last {
                Some((_, prev)) => s.delivered.saturating_sub(prev.delivered),
                None => s.delivered.saturating_sub(1),
            };
            if moved > 0 {
                tr.delivered_bytes += moved as u64 * s.mss.max(1) as u64;
                tr.last_progress_at = Some(t);
                tr.recent_rates.push_back(s.delivery_rate);
                if tr.recent_rates.len() > PLATEAU_SAMPLES {
                    tr.recent_rates.pop_front();
                }
                if tr.recent_rates.len() == PLATEAU_SAMPLES {
                    let held = tr.recent_rates.iter().copied().min().unwrap_or(0);
                    tr.plateau_max = tr.plateau_max.max(held);
                }
                tr.rate_history.push_back((t, s.delivery_rate));
                while tr
                    .rate_history
                    .front()
                    .is_some_and(|(t0, _)| t - t0 > HISTORY_S)
                {
                    tr.rate_history.pop_front();
                }
            }
            tr.max_cwnd = tr.max_cwnd.max(s.cwnd);
            tr.max_srtt_us = tr.max_srtt_us.max(s.rtt_us);
            if s.min_rtt_us > 0 {
                self.min_rtt_us = Some(
                    self.min_rtt_us
                        .map_or(s.min_rtt_us, |m| m.min(s.min_rtt_us)),
                );
            }
            tr.limits
                .push_back((t, s.busy_us, s.rwnd_limited_us + s.sndbuf_limited_us));
            while tr
                .limits
                .front()
                .is_some_and(|(t0, _, _)| t - t0 > HISTORY_S)
            {
                tr.limits.pop_front();
            }
            tr.last = Some((t, *s));
        }
        let total = self.tracks.iter().map(|tr| tr.delivered_bytes).sum();
        if let Some((t0, b0)) = self.history.back().copied().filter(|(t0, _)| t > *t0) {
            self.tick_rates.push_back((total - b0) as f64 / (t - t0));
            if self.tick_rates.len() > PLATEAU_SAMPLES {
                self.tick_rates.pop_front();
            }
            if self.tick_rates.len() == PLATEAU_SAMPLES {
                let mut r: Vec<f64> = self.tick_rates.iter().copied().collect();
                r.sort_by(f64::total_cmp);
                self.tick_rate_max = self.tick_rate_max.max(r[PLATEAU_SAMPLES / 2]);
            }
        }
        self.history.push_back((t, total));
        while self
            .history
            .front()
            .is_some_and(|(t0, _)| t - t0 > HISTORY_S)
        {
            self.history.pop_front();
        }
        self.last_t = t;
        tick
    }

    /// Time of the latest tick.
    pub fn now(&self) -> f64 {
        self.last_t
    }

    /// The lowest RTT any channel saw, seconds.
    pub fn min_rtt(&self) -> Option<f64> {
        self.min_rtt_us.map(|us| us as f64 / 1e6)
    }

    /// The largest smoothed RTT among the channels' latest readings, seconds.
    pub fn srtt(&self) -> Option<f64> {
        self.tracks
            .iter()
            .filter_map(|tr| tr.last.map(|(_, s)| s.rtt_us))
            .max()
            .filter(|us| *us > 0)
            .map(|us| us as f64 / 1e6)
    }

    /// The RTT to time decisions by: the smoothed one, else the minimum, else 100 ms.
    pub fn rtt_or_default(&self) -> f64 {
        self.srtt().or(self.min_rtt()).unwrap_or(0.1)
    }

    /// Channel i's robust maximum delivery rate so far, bytes/s: the highest rate it held for
    /// [`PLATEAU_SAMPLES`] readings in a row.
    pub fn channel_max_rate(&self, i: usize) -> f64 {
        self.tracks.get(i).map_or(0.0, |tr| tr.plateau_max as f64)
    }

    /// The most all channels together delivered per tick, as the median of three ticks in a
    /// row (so one tick that caught a burst of ACKs cannot set it), bytes/s. While the
    /// bottleneck is full, ACKs return at its rate, so this is the bottleneck rate, even
    /// when the full stretch lasts only a few ticks.
    pub fn tick_rate_max(&self) -> f64 {
        self.tick_rate_max
    }

    /// The median of the aggregate per-tick rates since `since`, bytes/s; `None` with fewer
    /// than three ticks. Over a round in which the bottleneck was full, ACKs return at its
    /// rate, and the median shrugs off ticks that caught a burst of ACKs or none.
    pub fn median_tick_rate(&self, since: f64) -> Option<f64> {
        let h: Vec<(f64, u64)> = self
            .history
            .iter()
            .copied()
            .skip_while(|(t, _)| *t < since)
            .collect();
        let mut r: Vec<f64> = h
            .windows(2)
            .filter(|w| w[1].0 > w[0].0)
            .map(|w| (w[1].1 - w[0].1) as f64 / (w[1].0 - w[0].0))
            .collect();
        if r.len() < PLATEAU_SAMPLES {
            return None;
        }
        r.sort_by(f64::total_cmp);
        let m = r.len() / 2;
        Some(if r.len() % 2 == 1 {
            r[m]
        } else {
            (r[m - 1] + r[m]) / 2.0
        })
    }

    /// The highest of channel i's delivery-rate samples since `since`, bytes/s. The kernel
    /// measures each over about one RTT of its own timestamps, so the sampler's timing does
    /// not enter it: over a round in which the channel alone kept the bottleneck full, this is
    /// the bottleneck rate.
    pub fn channel_rate_since(&self, i: usize, since: f64) -> f64 {
        self.tracks.get(i).map_or(0.0, |tr| {
            tr.rate_history
                .iter()
                .filter(|(t, _)| *t >= since)
                .map(|(_, r)| *r)
                .max()
                .unwrap_or(0) as f64
        })
    }

    /// The longest stretch since `since`, seconds, in which channel i delivered nothing (the
    /// ACK stream stalled, or the channel had nothing to send).
    pub fn longest_stall(&self, i: usize, since: f64) -> f64 {
        let Some(tr) = self.tracks.get(i) else {
            return 0.0;
        };
        let mut last = since;
        let mut longest: f64 = 0.0;
        for (t, _) in tr.rate_history.iter().filter(|(t, _)| *t >= since) {
            longest = longest.max(t - last);
            last = *t;
        }
        longest.max(self.last_t - last)
    }

    /// Channel i's largest congestion window so far, segments.
    pub fn channel_max_cwnd(&self, i: usize) -> u32 {
        self.tracks.get(i).map_or(0, |tr| tr.max_cwnd)
    }

    /// Channel i's largest smoothed RTT so far, seconds.
    pub fn channel_max_srtt(&self, i: usize) -> f64 {
        self.tracks
            .get(i)
            .map_or(0.0, |tr| tr.max_srtt_us as f64 / 1e6)
    }

    /// Channel i's latest reading.
    pub fn latest(&self, i: usize) -> Option<&TcpSample> {
        self.tracks.get(i)?.last.as_ref().map(|(_, s)| s)
    }

    /// Loss events of channel i so far.
    pub fn channel_losses(&self, i: usize) -> u32 {
        self.tracks.get(i).map_or(0, |tr| tr.losses)
    }

    /// Loss events of all channels so far.
    pub fn losses(&self) -> u32 {
        self.tracks.iter().map(|tr| tr.losses).sum()
    }

    /// When any channel last lost, seconds.
    pub fn last_loss_at(&self) -> Option<f64> {
        self.tracks
            .iter()
            .filter_map(|tr| tr.last_loss_at)
            .max_by(f64::total_cmp)
    }

    /// Bytes all channels delivered so far.
    pub fn delivered_bytes(&self) -> u64 {
        self.history.back().map_or(0, |(_, b)| *b)
    }

    /// What all channels delivered over the last `window` seconds (at least the span of two
    /// ticks), bytes/s; `None` until the history spans `window`.
    pub fn goodput(&self, window: f64) -> Option<f64> {
        let (t1, b1) = *self.history.back()?;
        let (t0, b0) = self
            .history
            .iter()
            .rev()
            .find(|(t0, _)| t1 - t0 >= window)
            .copied()?;
        (t1 > t0).then(|| (b1 - b0) as f64 / (t1 - t0))
    }

    /// The largest [`PathEstimator::goodput`] over spans of at least `window` seconds that
    /// lie wholly after `since`, bytes/s.
    pub fn max_goodput(&self, window: f64, since: f64) -> Option<f64> {
        let h: Vec<(f64, u64)> = self
            .history
            .iter()
            .copied()
            .filter(|(t, _)| *t >= since)
            .collect();
        let mut best: Option<f64> = None;
        let mut start = 0;
        for end in 0..h.len() {
            // The latest start that still leaves a span of `window`.
            while start + 1 < end && h[end].0 - h[start + 1].0 >= window {
                start += 1;
            }
            let span = h[end].0 - h[start].0;
            if span >= window {
                let r = (h[end].1 - h[start].1) as f64 / span;
                best = Some(best.map_or(r, |b| b.max(r)));
            }
        }
        best
    }

    /// Fraction of channel i's busy time over the last `window` seconds that the peer's
    /// receive window or its own send buffer held it back (0 when unknown).
    pub fn window_limited(&self, i: usize, window: f64) -> f64 {
        let Some(tr) = self.tracks.get(i) else {
            return 0.0;
        };
        let (Some(last), Some(first)) = (
            tr.limits.back(),
            tr.limits
                .iter()
                .rev()
                .find(|(t, _, _)| last_t(tr) - t >= window),
        ) else {
            return 0.0;
        };
        let busy = last.1.saturating_sub(first.1);
        let limited = last.2.saturating_sub(first.2);
        if busy == 0 {
            0.0
        } else {
            (limited as f64 / busy as f64).min(1.0)
        }
    }

    /// Whether channel i delivered anything in the last `window` seconds.
    pub fn progressing(&self, i: usize, window: f64) -> bool {
        self.tracks
            .get(i)
            .and_then(|tr| tr.last_progress_at)
            .is_some_and(|at| self.last_t - at <= window)
    }
}

fn last_t(tr: &Track) -> f64 {
    tr.limits.back().map_or(0.0, |(t, _, _)| *t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(delivered: u32, rate: u64) -> TcpSample {
        TcpSample {
            cwnd: 10,
            rtt_us: 50_000,
            min_rtt_us: 40_000,
            mss: 1000,
            delivered,
            delivery_rate: rate,
            ..Default::default()
        }
    }

    #[test]
    fn goodput_counts_delivered_segments_over_the_window() {
        let mut e = PathEstimator::new();
        // 100 segments of 1000 bytes every 10 ms on each of two channels: 20 MB/s.
        for k in 0..=100u32 {
            let t = k as f64 * 0.01;
            let r = reading(1 + 100 * k, 10_000_000);
            e.observe(t, &[Some(r), Some(r)]);
        }
        let g = e.goodput(0.5).unwrap();
        assert!((g - 20e6).abs() < 1.0, "{g}");
        assert_eq!(e.max_goodput(0.5, 0.0).map(|g| g.round()), Some(20e6));
        assert_eq!(e.min_rtt(), Some(0.04));
        assert_eq!(e.srtt(), Some(0.05));
        assert!(e.goodput(2.0).is_none(), "the history spans only 1 s");
    }

    #[test]
    fn the_robust_maximum_ignores_a_single_outlier() {
        let mut e = PathEstimator::new();
        let rates = [5, 6, 7, 50, 7, 8, 8, 8, 3];
        for (k, r) in rates.iter().enumerate() {
            e.observe(k as f64 * 0.01, &[Some(reading(2 + k as u32, *r))]);
        }
        assert_eq!(e.channel_max_rate(0), 8.0);
        assert_eq!(e.channel_rate_since(0, 0.0), 50.0);
        assert_eq!(e.channel_rate_since(0, 0.04), 8.0);
        // Every tick delivered something: no stall longer than a tick.
        assert!((e.longest_stall(0, 0.0) - 0.01).abs() < 1e-9);
    }

    #[test]
    fn the_tick_rate_maximum_is_a_median_of_three() {
        let mut e = PathEstimator::new();
        // Segments of 1000 bytes delivered per 10 ms tick: a lone burst of 90 is ignored,
        // three ticks of 40, 50, 45 give 45 (4.5 MB/s).
        let per_tick = [10, 10, 90, 10, 40, 50, 45, 10];
        let mut delivered = 1;
        e.observe(0.0, &[Some(reading(delivered, 0))]);
        for (k, n) in per_tick.iter().enumerate() {
            delivered += n;
            e.observe((k + 1) as f64 * 0.01, &[Some(reading(delivered, 0))]);
        }
        assert!(
            (e.tick_rate_max() - 4.5e6).abs() < 1.0,
            "{}",
            e.tick_rate_max()
        );
    }

    #[test]
    fn the_median_tick_rate_ignores_bursts_and_gaps() {
        let mut e = PathEstimator::new();
        let per_tick = [10, 30, 0, 31, 29, 90, 30];
        let mut delivered = 1;
        e.observe(0.0, &[Some(reading(delivered, 0))]);
        for (k, n) in per_tick.iter().enumerate() {
            delivered += n;
            e.observe((k + 1) as f64 * 0.01, &[Some(reading(delivered, 0))]);
        }
        // From t = 0.01: 30, 0, 31, 29, 90, 30 segments per tick: median 30 (3 MB/s).
        let m = e.median_tick_rate(0.01).unwrap();
        assert!((m - 3.0e6).abs() < 1.0, "{m}");
        assert!(e.median_tick_rate(0.06).is_none(), "two ticks are too few");
    }

    #[test]
    fn losses_are_counted_once_per_recovery_and_stalls_are_seen() {
        let mut e = PathEstimator::new();
        let mut s = reading(10, 1);
        e.observe(0.0, &[Some(s)]);
        s.ca_state = crate::channels::telemetry::CA_RECOVERY;
        s.total_retrans = 3;
        s.delivered = 20;
        assert_eq!(e.observe(0.01, &[Some(s)]).new_losses, vec![0]);
        s.total_retrans = 5;
        assert!(e.observe(0.02, &[Some(s)]).new_losses.is_empty());
        assert_eq!(e.losses(), 1);
        assert_eq!(e.last_loss_at(), Some(0.01));
        assert!(e.progressing(0, 0.015));
        assert!(
            !e.progressing(0, 0.005),
            "nothing delivered in the last tick"
        );
        e.observe(0.03, &[Some(s)]);
        assert!((e.longest_stall(0, 0.0) - 0.02).abs() < 1e-9);
    }

    #[test]
    fn window_limited_is_the_share_of_busy_time() {
        let mut e = PathEstimator::new();
        for k in 0..=10u64 {
            let s = TcpSample {
                busy_us: 10_000 * k,
                rwnd_limited_us: 6_000 * k,
                sndbuf_limited_us: 1_000 * k,
                ..reading(1 + k as u32, 1)
            };
            e.observe(k as f64 * 0.01, &[Some(s)]);
        }
        assert!((e.window_limited(0, 0.05) - 0.7).abs() < 1e-9);
        assert_eq!(e.window_limited(3, 0.05), 0.0);
    }
}
