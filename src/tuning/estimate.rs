//! What the sending sockets' `TCP_INFO` says about the path while data moves: the base RTT,
//! the rate each channel and all of them deliver, losses, and whether the channels are held
//! back by a window (the peer's receive window or their own send buffer) rather than by the
//! path. Pure: fed timestamped readings, it owns no clock and no socket, so the online tuner
//! and the probe that use it are tested on simulated paths.
//!
//! Two rate measures, for two jobs:
//! - **Per-channel delivery rate**, the kernel's own per-ACK estimate (`tcpi_delivery_rate`,
//!   net/ipv4/tcp_rate.c): each sample spans about one RTT and takes the longer of the send
//!   and ACK intervals, so ACK compression does not inflate it. Its maximum over the rounds
//!   after a channel overfilled the bottleneck is the bottleneck rate (the bandwidth filter
//!   of BBR, Cardwell et al. 2016, works the same way). The sampler's own timing does not
//!   enter it, which matters on a busy host: a tick can come tens of milliseconds late.
//! - **Aggregate goodput over a window** from `tcpi_delivered` (segments delivered, SACKed
//!   ones included, so it does not jump when a retransmission fills a hole, as
//!   `bytes_acked` does): what all channels together moved, for comparing configurations.

use std::collections::VecDeque;

use crate::channels::telemetry::TcpSample;
use crate::metrics::LossDetector;

/// How far back the aggregate history reaches, seconds.
const HISTORY_S: f64 = 30.0;

/// A reading that shows no delivery this long after the last one that did is a gap in the
/// channel's ACK stream: half of the sampler's 10 ms tick. A tick that came late is followed
/// at once by the next, which shows nothing new and is no gap.
const GAP_S: f64 = 0.005;

/// One channel as the estimator follows it.
#[derive(Debug, Clone, Default)]
struct Track {
    last: Option<(f64, TcpSample)>,
    detector: LossDetector,
    last_loss_at: Option<f64>,
    /// Bytes delivered since the channel was first seen.
    delivered_bytes: u64,
    /// `(t, delivery rate)` of every reading with progress, for maxima over a span.
    rate_history: VecDeque<(f64, u64)>,
    /// When the last reading with progress came, whether a reading since showed a gap
    /// ([`GAP_S`]), and when progress last resumed after one.
    last_progress_at: Option<f64>,
    gap_open: bool,
    last_gap_at: Option<f64>,
    /// `(t, busy_us, window_limited_us)` readings, for the window-limited fraction.
    limits: VecDeque<(f64, u64, u64)>,
}

impl Track {
    /// The mean of the delivery-rate samples since `since`, bytes/s; `None` with none.
    fn mean_rate_since(&self, since: f64) -> Option<f64> {
        // Called every tick over up to 30 s of history: walk back over the span asked for.
        let (sum, n) = self
            .rate_history
            .iter()
            .rev()
            .take_while(|(t, _)| *t >= since)
            .fold((0u64, 0u64), |(sum, n), (_, r)| (sum + r, n + 1));
        (n > 0).then(|| sum as f64 / n as f64)
    }
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
                tr.last_loss_at = Some(t);
                tick.new_losses.push(i);
            }
            let moved = match &tr.last {
                Some((_, prev)) => s.delivered.saturating_sub(prev.delivered),
                None => s.delivered.saturating_sub(1),
            };
            if moved == 0 && tr.last_progress_at.is_some_and(|p| t - p >= GAP_S) {
                tr.gap_open = true;
            }
            if moved > 0 {
                if std::mem::take(&mut tr.gap_open) {
                    tr.last_gap_at = Some(t);
                }
                tr.last_progress_at = Some(t);
                tr.delivered_bytes += moved as u64 * s.mss.max(1) as u64;
                tr.rate_history.push_back((t, s.delivery_rate));
                while tr
                    .rate_history
                    .front()
                    .is_some_and(|(t0, _)| t - t0 > HISTORY_S)
                {
                    tr.rate_history.pop_front();
                }
            }
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

    /// The lowest RTT any channel saw, seconds.
    fn min_rtt(&self) -> Option<f64> {
        self.min_rtt_us.map(|us| us as f64 / 1e6)
    }

    /// The largest smoothed RTT among the channels' latest readings, seconds.
    fn srtt(&self) -> Option<f64> {
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

    /// When channel i's deliveries last resumed after a reading that showed none, taken half
    /// a sampler tick (5 ms) or more after the last that did (a gap in its ACK stream, or an
    /// idle spell): the ACKs held up by a busy host are then read together, and the kernel's
    /// samples that span the gap read high.
    pub fn last_gap_at(&self, i: usize) -> Option<f64> {
        self.tracks.get(i)?.last_gap_at
    }

    /// The mean of channel i's delivery-rate samples since `since` (one per tick that
    /// delivered), bytes/s; 0 with none. Unlike the highest, one sample inflated by ACKs that
    /// a busy host read late and then together moves it little.
    pub fn channel_mean_rate_since(&self, i: usize, since: f64) -> f64 {
        self.tracks
            .get(i)
            .and_then(|tr| tr.mean_rate_since(since))
            .unwrap_or(0.0)
    }

    /// What all channels delivered since `since` by the kernel's own measure, bytes/s: the
    /// sum over channels of the mean of each one's delivery-rate samples since then (0 for a
    /// channel with none); `None` when no channel has one. Over half a second it varies
    /// half as much as [`Self::goodput`], whose ticks the ACK stream's stalls make uneven:
    /// on 1 Gbit/s × 60 ms × 64 packets, windows of 0.44 s read 933 ± 6.7 Mbit/s this way
    /// (never above the caps' 935) and 933 ± 14.5 (up to 989) from the delivered counts.
    pub fn delivery_rate_since(&self, since: f64) -> Option<f64> {
        let mut total = None;
        for mean in self
            .tracks
            .iter()
            .filter_map(|tr| tr.mean_rate_since(since))
        {
            *total.get_or_insert(0.0) += mean;
        }
        total
    }

    /// Whether channel i has run out of data: it delivered before, nothing over the last
    /// `window` seconds, and its socket holds nothing unsent (a channel the network stalls
    /// still has data waiting).
    pub fn idle(&self, i: usize, window: f64) -> bool {
        self.tracks.get(i).is_some_and(|tr| {
            let quiet = tr
                .rate_history
                .back()
                .is_some_and(|(t, _)| self.last_t - t >= window);
            quiet && tr.last.as_ref().is_some_and(|(_, s)| s.notsent_bytes == 0)
        })
    }

    /// Channel i's latest reading.
    pub fn latest(&self, i: usize) -> Option<&TcpSample> {
        self.tracks.get(i)?.last.as_ref().map(|(_, s)| s)
    }

    /// When any channel last lost, seconds.
    pub fn last_loss_at(&self) -> Option<f64> {
        self.tracks
            .iter()
            .filter_map(|tr| tr.last_loss_at)
            .max_by(f64::total_cmp)
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
    fn delivery_rate_adds_the_channels_mean_samples_and_ignores_ticks_out_of_step() {
        let mut e = PathEstimator::new();
        // Two channels whose kernels measure 6 and 4 MB/s; the first one's ACKs arrive in
        // bursts (nothing for two ticks, then three ticks' worth), which the delivered counts
        // show and the kernel's samples do not. The second stops for good at 0.8 s.
        let (mut d0, mut d1) = (1u32, 1u32);
        for k in 0..=100u32 {
            let t = k as f64 * 0.01;
            if k % 3 == 0 {
                d0 += 180;
            }
            if t < 0.8 {
                d1 += 40;
            }
            e.observe(
                t,
                &[Some(reading(d0, 6_000_000)), Some(reading(d1, 4_000_000))],
            );
        }
        let rate = e.delivery_rate_since(0.5).unwrap();
        assert!((rate - 10e6).abs() < 1.0, "{rate}");
        // From 0.9 s only the first channel delivered.
        let rate = e.delivery_rate_since(0.9).unwrap();
        assert!((rate - 6e6).abs() < 1.0, "{rate}");
        assert!(e.delivery_rate_since(1.5).is_none());
    }

    #[test]
    fn a_gap_is_a_span_of_ticks_without_deliveries_not_a_reading_taken_at_once() {
        let mut e = PathEstimator::new();
        let mut d = 1u32;
        let mut feed = |e: &mut PathEstimator, t: f64, moved: u32| {
            d += moved;
            e.observe(t, &[Some(reading(d, 1_000_000)), None]);
        };
        // The first delivery is no gap, nor a reading without one taken 0.1 ms after the last
        // (a late tick's successor).
        feed(&mut e, 0.00, 10);
        feed(&mut e, 0.01, 10);
        feed(&mut e, 0.0101, 0);
        feed(&mut e, 0.02, 10);
        assert_eq!(e.last_gap_at(0), None);
        // A tick without a delivery, then ACKs read together.
        feed(&mut e, 0.03, 0);
        feed(&mut e, 0.04, 20);
        assert_eq!(e.last_gap_at(0), Some(0.04));
        assert_eq!(e.last_gap_at(1), None, "a channel with no socket");
        assert_eq!(e.last_gap_at(2), None, "no such channel");
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
        assert_eq!(e.min_rtt(), Some(0.04));
        assert_eq!(e.srtt(), Some(0.05));
        assert!(e.goodput(2.0).is_none(), "the history spans only 1 s");
    }

    #[test]
    fn rate_maxima_are_taken_over_a_span() {
        let mut e = PathEstimator::new();
        let rates = [5, 6, 7, 50, 7, 8, 8, 8, 3];
        for (k, r) in rates.iter().enumerate() {
            e.observe(k as f64 * 0.01, &[Some(reading(2 + k as u32, *r))]);
        }
        assert_eq!(e.channel_rate_since(0, 0.0), 50.0);
        assert_eq!(e.channel_rate_since(0, 0.04), 8.0);
        assert_eq!(e.channel_mean_rate_since(0, 0.04), 34.0 / 5.0);
        assert_eq!(e.channel_mean_rate_since(0, 0.09), 0.0);
        assert_eq!(e.channel_mean_rate_since(1, 0.0), 0.0, "no such channel");
    }

    #[test]
    fn losses_are_counted_once_per_recovery() {
        let mut e = PathEstimator::new();
        let mut s = reading(10, 1);
        e.observe(0.0, &[Some(s)]);
        s.ca_state = crate::channels::telemetry::CA_RECOVERY;
        s.total_retrans = 3;
        s.delivered = 20;
        assert_eq!(e.observe(0.01, &[Some(s)]).new_losses, vec![0]);
        s.total_retrans = 5;
        assert!(e.observe(0.02, &[Some(s)]).new_losses.is_empty());
        assert_eq!(e.last_loss_at(), Some(0.01));
    }

    #[test]
    fn a_channel_is_idle_when_it_stopped_delivering_with_nothing_unsent() {
        let mut e = PathEstimator::new();
        // Channel 0 delivers for 10 ticks, then nothing; channel 1 stops too, but has data
        // waiting in its socket (the network stalls it); channel 2 has not delivered yet.
        for k in 0..30u32 {
            let done = reading(2 + k.min(10), 1);
            let stalled = TcpSample {
                notsent_bytes: 65536,
                ..done
            };
            e.observe(
                k as f64 * 0.01,
                &[Some(done), Some(stalled), Some(reading(1, 0))],
            );
            let idle = e.idle(0, 0.1);
            assert_eq!(idle, k >= 20, "tick {k}");
        }
        assert!(!e.idle(1, 0.1));
        assert!(!e.idle(2, 0.1));
        assert!(!e.idle(7, 0.1));
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
