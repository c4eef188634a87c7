//! The experiments' arithmetic, without I/O: the research's expected utilizations, loss
//! events recovered from cwnd traces, aggregated windows over time, and convergence time.

use crate::lab::flows::TraceRow;
use crate::metrics::{LossDetector, LossEvent};

/// Multiplicative decrease of Reno-like flows (Cui 2013's β).
pub const BETA: f64 = 0.5;

/// Seed 003 Table 4.1: share of congestion events in which 1, 2, … flows lost, for 2, 3 and
/// 6 Reno (AIMD) flows.
pub const SEED_TABLE_4_1: &[(usize, &[f64])] = &[
    (2, &[0.40, 0.60]),
    (3, &[0.36, 0.33, 0.31]),
    (6, &[0.29, 0.29, 0.24, 0.10, 0.04, 0.04]),
];

/// Seed 003 Table 4.3: the same for CUBIC flows.
pub const SEED_TABLE_4_3: &[(usize, &[f64])] = &[
    (2, &[0.27, 0.73]),
    (3, &[0.18, 0.28, 0.54]),
    (6, &[0.07, 0.12, 0.16, 0.24, 0.24, 0.17]),
];

/// Expression 5.3: utilization of m fully desynchronized channels, `1 − β/(2m)`.
pub fn desynchronized_utilization(m: u32, beta: f64) -> f64 {
    1.0 - beta / (2.0 * m as f64)
}

/// Table 4.2 / Expression 4.4: lowest (all flows synchronized) and highest (fully
/// desynchronized) utilization of n AIMD flows.
pub fn aimd_bounds(n: u32) -> (f64, f64) {
    (
        desynchronized_utilization(1, BETA),
        desynchronized_utilization(n, BETA),
    )
}

/// The seed's distribution for `cc` and `n` flows, if it gave one.
pub fn seed_distribution(cc: &str, n: usize) -> Option<&'static [f64]> {
    let table = match cc {
        "reno" => SEED_TABLE_4_1,
        "cubic" => SEED_TABLE_4_3,
        _ => return None,
    };
    table.iter().find(|(k, _)| *k == n).map(|(_, d)| *d)
}

/// Loss events (entries into recovery, or retransmissions that grew between samples) of each
/// channel in a trace, after `warmup` seconds, with times relative to the warmup's end.
pub fn loss_events(rows: &[TraceRow], channels: usize, warmup: f64) -> Vec<LossEvent> {
    let mut detectors = vec![LossDetector::default(); channels];
    let mut events = Vec::new();
    for r in rows {
        let ch = r.channel as usize;
        if ch >= channels {
            continue;
        }
        let recovering = r.ca_state >= 3;
        if detectors[ch].on_sample(recovering, r.total_retrans) && r.t >= warmup {
            events.push(LossEvent {
                flow: ch,
                at: r.t - warmup,
            });
        }
    }
    events
}

/// The window that groups losses into one congestion event: the larger of the largest
/// smoothed RTT in the trace, the path RTT, and two sampling periods (as the transfer
/// summary does).
pub fn grouping_window(rows: &[TraceRow], path_rtt: f64) -> f64 {
    let srtt = rows.iter().map(|r| r.rtt_us).max().unwrap_or(0) as f64 / 1e6;
    srtt.max(path_rtt).max(0.02)
}

/// Sum of the channels' cwnd on a grid of `step` seconds from 0 to the trace's end, each
/// channel holding its latest sample; times shifted by `offset`.
pub fn aggregate_cwnd(rows: &[TraceRow], offset: f64, step: f64) -> Vec<(f64, f64)> {
    let Some(end) = rows.iter().map(|r| r.t).reduce(f64::max) else {
        return Vec::new();
    };
    let mut sorted: Vec<&TraceRow> = rows.iter().collect();
    sorted.sort_by(|a, b| a.t.total_cmp(&b.t));
    let mut latest: Vec<u64> = Vec::new();
    let mut out = Vec::new();
    let mut next = 0;
    let mut t = 0.0;
    while t <= end + 1e-9 {
        while next < sorted.len() && sorted[next].t <= t + 1e-9 {
            let r = sorted[next];
            let ch = r.channel as usize;
            if latest.len() <= ch {
                latest.resize(ch + 1, 0);
            }
            latest[ch] = r.cwnd;
            next += 1;
        }
        out.push((t + offset, latest.iter().sum::<u64>() as f64));
        t += step;
    }
    out
}

/// Centered moving average over `window` seconds of an evenly spaced series.
pub fn moving_average(series: &[(f64, f64)], window: f64) -> Vec<(f64, f64)> {
    series
        .iter()
        .map(|&(t, _)| {
            let inside: Vec<f64> = series
                .iter()
                .filter(|(u, _)| (u - t).abs() <= window / 2.0)
                .map(|&(_, v)| v)
                .collect();
            (t, inside.iter().sum::<f64>() / inside.len() as f64)
        })
        .collect()
}

/// Seconds after `start` until `second` first reaches `ratio` × `first` (Cui 2013 Fig. 5.8:
/// the second connection's window reaches about 80 % of the first's). Both series are on
/// the same time base; values of `first` are taken at the nearest earlier time. `None` if it
/// never does while `first` runs (after its last sample there is nothing to compare with).
pub fn convergence_time(
    first: &[(f64, f64)],
    second: &[(f64, f64)],
    start: f64,
    ratio: f64,
) -> Option<f64> {
    let first_end = first.last().map_or(f64::NEG_INFINITY, |&(t, _)| t);
    second
        .iter()
        .filter(|(t, _)| *t >= start && *t <= first_end)
        .find(|&&(t, v)| {
            let reference = first
                .iter()
                .take_while(|(u, _)| *u <= t + 1e-9)
                .last()
                .map(|&(_, w)| w);
            reference.is_some_and(|w| w > 0.0 && v >= ratio * w)
        })
        .map(|&(t, _)| t - start)
}

/// A window reduction seen in a trace: a channel entered loss recovery (or a timeout), and
/// the ssthresh it then had is what its congestion control decided for that loss.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reduction {
    /// The channel.
    pub channel: usize,
    /// When recovery was first seen (trace time, s).
    pub at: f64,
    /// cwnd in the last sample before recovery (segments).
    pub cwnd_before: u64,
    /// ssthresh in the first sample in recovery (segments).
    pub ssthresh: u64,
    /// ssthresh in the last sample before recovery: the kernel's "infinity" (2^31 − 1) when
    /// this loss ended the channel's first slow start.
    pub ssthresh_before: u64,
}

impl Reduction {
    /// ssthresh / cwnd before: 0.5 for Reno, 0.7 for CUBIC, about 1 for a loss DMCTCP kept.
    pub fn ratio(&self) -> f64 {
        self.ssthresh as f64 / self.cwnd_before.max(1) as f64
    }

    /// Whether the window was really cut (the ratio is below `keep_above`), as opposed to a
    /// loss that only retransmitted.
    pub fn is_cut(&self, keep_above: f64) -> bool {
        self.ratio() < keep_above
    }
}

/// Every entry into recovery of each channel in a trace (10 ms samples), with the cwnd just
/// before and the ssthresh chosen.
pub fn reductions(rows: &[TraceRow], channels: usize) -> Vec<Reduction> {
    let mut prev: Vec<Option<&TraceRow>> = vec![None; channels];
    let mut out = Vec::new();
    for r in rows {
        let ch = r.channel as usize;
        if ch >= channels {
            continue;
        }
        if let Some(p) = prev[ch] {
            if p.ca_state < 3 && r.ca_state >= 3 {
                out.push(Reduction {
                    channel: ch,
                    at: r.t,
                    cwnd_before: p.cwnd,
                    ssthresh: r.ssthresh,
                    ssthresh_before: p.ssthresh,
                });
            }
        }
        prev[ch] = Some(r);
    }
    out
}

/// Cuts (reductions below `keep_above`) as loss events, for the synchronization rate of
/// Expr. 4.2 computed on the decisions of the congestion control rather than on losses.
pub fn cut_events(reductions: &[Reduction], keep_above: f64) -> Vec<LossEvent> {
    reductions
        .iter()
        .filter(|r| r.is_cut(keep_above))
        .map(|r| LossEvent {
            flow: r.channel,
            at: r.at,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reductions_pair_the_cwnd_before_with_the_ssthresh_chosen() {
        let mut rows = vec![
            row(0.00, 0, 100, 0, 0),
            row(0.00, 1, 80, 0, 0),
            row(0.01, 0, 90, 3, 1),
            row(0.01, 1, 81, 3, 1),
            row(0.02, 0, 60, 3, 2),
            row(0.03, 0, 50, 0, 2),
            row(0.04, 0, 52, 4, 3),
        ];
        rows[2].ssthresh = 50;
        rows[3].ssthresh = 81;
        rows[6].ssthresh = 26;
        let r = reductions(&rows, 2);
        assert_eq!(r.len(), 3);
        assert_eq!(
            (r[0].channel, r[0].cwnd_before, r[0].ssthresh),
            (0, 100, 50)
        );
        assert_eq!(r[0].ratio(), 0.5);
        assert!(r[0].is_cut(0.9) && !r[1].is_cut(0.9));
        assert_eq!((r[2].at, r[2].cwnd_before), (0.04, 50));
        let cuts = cut_events(&r, 0.9);
        assert_eq!(cuts.len(), 2);
        assert!(cuts.iter().all(|e| e.flow == 0));
    }

    fn row(t: f64, channel: u16, cwnd: u64, ca_state: u8, total_retrans: u32) -> TraceRow {
        TraceRow {
            t,
            channel,
            cwnd,
            ssthresh: 0,
            rtt_us: 60_000,
            ca_state,
            total_retrans,
            bytes_acked: 0,
        }
    }

    #[test]
    fn expected_utilizations_match_tables_4_2_and_5_1() {
        assert_eq!(desynchronized_utilization(1, BETA), 0.75);
        assert_eq!(desynchronized_utilization(2, BETA), 0.875);
        assert!((desynchronized_utilization(5, BETA) - 0.95).abs() < 1e-12);
        let (l, h) = aimd_bounds(6);
        assert_eq!(l, 0.75);
        assert!((h - 0.958).abs() < 1e-3, "Table 4.2: n = 6 → 95.8 %");
        assert!((aimd_bounds(24).1 - 0.989).abs() < 1e-3);
    }

    #[test]
    fn seed_tables_sum_to_one() {
        for table in [SEED_TABLE_4_1, SEED_TABLE_4_3] {
            for (n, d) in table {
                assert_eq!(d.len(), *n);
                assert!((d.iter().sum::<f64>() - 1.0).abs() < 0.011, "{n}: {d:?}");
            }
        }
        assert_eq!(seed_distribution("cubic", 3), Some(&[0.18, 0.28, 0.54][..]));
        assert_eq!(seed_distribution("bbr", 3), None);
    }

    #[test]
    fn loss_events_come_from_recovery_entries_after_warmup() {
        let rows = vec![
            row(0.5, 0, 10, 3, 1), // during warmup: not counted
            row(0.6, 0, 10, 0, 1),
            row(1.2, 0, 20, 3, 2), // entry into Recovery
            row(1.21, 1, 20, 0, 0),
            row(1.3, 0, 10, 3, 3), // still recovering: same event
            row(1.4, 1, 20, 0, 2), // retransmits grew without a Recovery sample
        ];
        let e = loss_events(&rows, 2, 1.0);
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].flow, 0);
        assert!((e[0].at - 0.2).abs() < 1e-9);
        assert_eq!(e[1].flow, 1);
        assert!((grouping_window(&rows, 0.02) - 0.06).abs() < 1e-12);
    }

    #[test]
    fn aggregate_cwnd_holds_each_channels_latest_sample() {
        let rows = vec![
            row(0.0, 0, 10, 0, 0),
            row(0.05, 1, 4, 0, 0),
            row(0.25, 0, 20, 0, 0),
        ];
        let agg = aggregate_cwnd(&rows, 1.0, 0.1);
        assert_eq!(agg, vec![(1.0, 10.0), (1.1, 14.0), (1.2, 14.0)]);
        assert!(aggregate_cwnd(&[], 0.0, 0.1).is_empty());
    }

    #[test]
    fn convergence_is_when_the_second_reaches_80_percent_of_the_first() {
        let first: Vec<(f64, f64)> = (0..100)
            .map(|i| (i as f64, 100.0 - i as f64 / 2.0))
            .collect();
        let second: Vec<(f64, f64)> = (30..100).map(|i| (i as f64, (i - 30) as f64)).collect();
        // At t = 30 + x: second = x, first = 100 − (30 + x)/2 → x ≥ 0.8(85 − x/2) → x ≥ 48.57.
        assert_eq!(convergence_time(&first, &second, 30.0, 0.8), Some(49.0));
        let never: Vec<(f64, f64)> = (30..100).map(|i| (i as f64, 1.0)).collect();
        assert_eq!(convergence_time(&first, &never, 30.0, 0.8), None);
        // Reaching the first's last window after the first has ended is not converging.
        let late: Vec<(f64, f64)> = (30..150)
            .map(|i| (i as f64, (i / 100) as f64 * 90.0))
            .collect();
        assert_eq!(convergence_time(&first, &late, 30.0, 0.8), None);
        let smooth = moving_average(&[(0.0, 0.0), (1.0, 3.0), (2.0, 6.0)], 2.0);
        assert_eq!(smooth, vec![(0.0, 1.5), (1.0, 3.0), (2.0, 4.5)]);
    }
}
