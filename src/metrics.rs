//! Metrics of the research, computed from observations (sans-IO): Jain's fairness index, and
//! the loss-synchronization rates of Cui 2013 (§4.3, Expressions 4.1 and 4.2) from the
//! channels' loss events.

use serde::{Deserialize, Serialize};

/// Jain's fairness index `(Σx)² / (n·Σx²)`: 1 when all shares are equal, 1/n when one takes
/// all. `None` for no shares or all zero.
pub fn jain(shares: &[f64]) -> Option<f64> {
    let sum: f64 = shares.iter().sum();
    let squares: f64 = shares.iter().map(|x| x * x).sum();
    (!shares.is_empty() && squares > 0.0).then(|| sum * sum / (shares.len() as f64 * squares))
}

/// A flow (channel) entering loss recovery at a time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LossEvent {
    /// Flow index.
    pub flow: usize,
    /// Seconds since the start of the measurement.
    pub at: f64,
}

/// Loss synchronization over a measurement (Cui 2013 §4.3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SyncReport {
    /// T: congestion events (losses grouped within one window Δt ≈ one RTT).
    pub congestion_events: usize,
    /// N_i: congestion events in which flow i lost.
    pub losses: Vec<usize>,
    /// SR_i of Expression 4.1: Σ_k l_ik · weight_k / T, with weight_k = (flows losing in
    /// event k) / n.
    pub per_flow: Vec<f64>,
    /// Expression 4.2: the harmonic mean of the SR_i (0 if a flow never lost).
    pub global: f64,
    /// `distribution[j]`: congestion events in which exactly j + 1 flows lost (Tables 4.1, 4.3).
    pub distribution: Vec<usize>,
}

/// Groups loss events into congestion events and computes the synchronization rates of
/// `flows` flows. A congestion event opens at a loss and takes every loss within `window`
/// seconds of that first loss (Cui 2013: Δt is about one RTT; events whose Δt do not
/// overlap are separate); a flow losing twice within one event counts once. `None` when
/// there were no losses.
pub fn loss_sync(events: &[LossEvent], flows: usize, window: f64) -> Option<SyncReport> {
    let mut sorted: Vec<LossEvent> = events.iter().copied().filter(|e| e.flow < flows).collect();
    sorted.sort_by(|a, b| a.at.total_cmp(&b.at));
    let mut groups: Vec<Vec<bool>> = Vec::new();
    let mut opened = f64::NEG_INFINITY;
    for e in &sorted {
        if groups.is_empty() || e.at - opened > window {
            groups.push(vec![false; flows]);
            opened = e.at;
        }
        groups.last_mut().expect("a group is open")[e.flow] = true;
    }
    if groups.is_empty() {
        return None;
    }
    let t = groups.len() as f64;
    let mut losses = vec![0usize; flows];
    let mut weighted = vec![0f64; flows];
    let mut distribution = vec![0usize; flows];
    for g in &groups {
        let losing = g.iter().filter(|l| **l).count();
        distribution[losing - 1] += 1;
        let weight = losing as f64 / flows as f64;
        for (i, lost) in g.iter().enumerate() {
            if *lost {
                losses[i] += 1;
                weighted[i] += weight;
            }
        }
    }
    let per_flow: Vec<f64> = weighted.iter().map(|w| w / t).collect();
    let global = if per_flow.contains(&0.0) {
        0.0
    } else {
        flows as f64 / per_flow.iter().map(|r| 1.0 / r).sum::<f64>()
    };
    Some(SyncReport {
        congestion_events: groups.len(),
        losses,
        per_flow,
        global,
        distribution,
    })
}

/// Detects a flow's entries into loss recovery from periodic `TCP_INFO` samples: an entry is
/// a switch into the Recovery or Loss state, or retransmissions that grew while the flow was
/// not recovering (a recovery episode shorter than the sampling period).
#[derive(Debug, Clone, Default)]
pub struct LossDetector {
    previous: Option<(bool, u32)>,
}

impl LossDetector {
    /// Feeds one sample; true when it shows a new loss event.
    pub fn on_sample(&mut self, recovering: bool, total_retrans: u32) -> bool {
        let event = match self.previous {
            None => recovering,
            Some((was_recovering, retrans)) => {
                !was_recovering && (recovering || total_retrans > retrans)
            }
        };
        self.previous = Some((recovering, total_retrans));
        event
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(flow: usize, at: f64) -> LossEvent {
        LossEvent { flow, at }
    }

    /// Seed 003, Fig. 4.3: 3 flows, T = 9 congestion events; events 1, 6 and 8 involve two
    /// flows, event 3 all three, the others one; N_i = 4, N_j = 6, N_k = 4. The figure's
    /// exact flow assignment is one consistent with those counts.
    #[test]
    fn worked_example_of_fig_4_3() {
        let (i, j, k) = (0, 1, 2);
        let members: [&[usize]; 9] = [
            &[i, j],
            &[k],
            &[i, j, k],
            &[j],
            &[i],
            &[j, k],
            &[k],
            &[i, j],
            &[j],
        ];
        let mut events = Vec::new();
        for (n, flows) in members.iter().enumerate() {
            for (m, f) in flows.iter().enumerate() {
                // Losses of one event within 30 ms; events 1 s apart; window 60 ms.
                events.push(ev(*f, n as f64 + m as f64 * 0.015));
            }
        }
        let r = loss_sync(&events, 3, 0.06).unwrap();
        assert_eq!(r.congestion_events, 9);
        assert_eq!(r.losses, vec![4, 6, 4]);
        assert_eq!(r.distribution, vec![5, 3, 1]);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        // SR_i = (2/3 + 1 + 1/3 + 2/3) / 9 = 8/27; SR_j = 11/27; SR_k = 7/27.
        assert!(close(r.per_flow[0], 8.0 / 27.0), "{:?}", r.per_flow);
        assert!(close(r.per_flow[1], 11.0 / 27.0));
        assert!(close(r.per_flow[2], 7.0 / 27.0));
        let harmonic = 3.0 / (27.0 / 8.0 + 27.0 / 11.0 + 27.0 / 7.0);
        assert!(close(r.global, harmonic), "{}", r.global);
    }

    #[test]
    fn extremes_of_fig_4_1() {
        // Complete synchronization: every event hits both flows: SR = 1.
        let sync: Vec<_> = (0..5)
            .flat_map(|n| [ev(0, n as f64), ev(1, n as f64 + 0.001)])
            .collect();
        let r = loss_sync(&sync, 2, 0.05).unwrap();
        assert_eq!((r.congestion_events, r.global), (5, 1.0));
        // Complete desynchronization, alternating: SR_i = (1/2 · T/2) / T = 1/4.
        let desync: Vec<_> = (0..6).map(|n| ev(n % 2, n as f64)).collect();
        let r = loss_sync(&desync, 2, 0.05).unwrap();
        assert_eq!(r.per_flow, vec![0.25, 0.25]);
        assert_eq!(r.distribution, vec![6, 0]);
        // A flow that never lost makes the global rate 0; no losses at all gives nothing.
        assert_eq!(loss_sync(&[ev(0, 0.0)], 2, 0.05).unwrap().global, 0.0);
        assert_eq!(loss_sync(&[], 2, 0.05), None);
    }

    #[test]
    fn a_flow_losing_twice_in_one_window_counts_once_and_windows_do_not_chain() {
        let r = loss_sync(
            &[ev(0, 0.0), ev(0, 0.01), ev(1, 0.04), ev(1, 0.07)],
            2,
            0.05,
        )
        .unwrap();
        assert_eq!(r.congestion_events, 2);
        assert_eq!(r.losses, vec![1, 2]);
    }

    #[test]
    fn jain_index() {
        assert_eq!(jain(&[5.0, 5.0, 5.0]), Some(1.0));
        assert_eq!(jain(&[1.0, 0.0, 0.0, 0.0]), Some(0.25));
        assert!((jain(&[1.0, 2.0]).unwrap() - 0.9).abs() < 1e-12);
        assert_eq!(jain(&[]), None);
        assert_eq!(jain(&[0.0, 0.0]), None);
    }

    #[test]
    fn detector_counts_entries_not_samples() {
        let mut d = LossDetector::default();
        let samples = [
            (false, 0),
            (true, 1),
            (true, 3),
            (false, 3),
            (false, 5),
            (false, 5),
            (true, 6),
        ];
        let hits: Vec<bool> = samples.iter().map(|(r, t)| d.on_sample(*r, *t)).collect();
        assert_eq!(hits, vec![false, true, false, false, true, false, true]);
    }
}
