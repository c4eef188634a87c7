//! The delay line of the lab's delay element, without I/O: packets arrive with an id on a
//! queue, each queue holds them for its own constant delay, and a release says, per queue,
//! the highest id that is due (a constant delay keeps a queue in FIFO order, so one batch
//! verdict releases them all). Memory is bounded: past `capacity` held packets an arrival is
//! refused and the caller drops it. Lateness of every release is recorded.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// Releases later than this, µs, were not the delay the lab was built with: 10 % of a 10 ms
/// round trip, and packets held back that long leave together as a burst.
pub const LATE_US: u64 = 1000;
/// Log2 buckets of release lateness in microseconds: bucket k counts lateness in [2^(k-1), 2^k) µs.
const LATENESS_BUCKETS: usize = 24;

/// One queue's held packets and counters.
struct Line {
    queue: u16,
    delay_ns: u64,
    held: VecDeque<(u32, u64)>,
    stats: LineStats,
    lateness: [u64; LATENESS_BUCKETS],
}

/// Counters of one queue, as published in the element's statistics file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LineStats {
    /// Netfilter queue number.
    pub queue: u16,
    /// Delay applied, µs.
    pub delay_us: u64,
    /// Packets held now.
    pub held: u64,
    /// Most packets ever held at once.
    pub held_max: u64,
    /// Packets that arrived.
    pub arrived: u64,
    /// Packets released after their delay.
    pub released: u64,
    /// Packets dropped because the line was full.
    pub overflowed: u64,
    /// Median release lateness, µs (upper bound of its log2 bucket).
    pub lateness_p50_us: u64,
    /// 99th percentile release lateness, µs (bucket upper bound).
    pub lateness_p99_us: u64,
    /// Largest release lateness, µs.
    pub lateness_max_us: u64,
    /// Releases later than 1 ms.
    pub late_over_1ms: u64,
}

/// Why an arrival was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The delay line holds `capacity` packets already.
    Full,
    /// No line serves this queue number.
    UnknownQueue,
}

/// Constant-delay FIFOs, one per netfilter queue.
pub struct DelayLine {
    lines: Vec<Line>,
    capacity: usize,
    held_total: usize,
}

impl DelayLine {
    /// A delay line with `(queue, delay_ns)` per queue holding at most `capacity` packets.
    pub fn new(queues: &[(u16, u64)], capacity: usize) -> DelayLine {
        let lines = queues
            .iter()
            .map(|&(queue, delay_ns)| Line {
                queue,
                delay_ns,
                held: VecDeque::new(),
                stats: LineStats {
                    queue,
                    delay_us: delay_ns / 1000,
                    ..Default::default()
                },
                lateness: [0; LATENESS_BUCKETS],
            })
            .collect();
        DelayLine {
            lines,
            capacity,
            held_total: 0,
        }
    }

    /// Takes packet `id` of `queue`, arrived at `now_ns`.
    pub fn arrive(&mut self, queue: u16, id: u32, now_ns: u64) -> Result<(), Refused> {
        let full = self.held_total >= self.capacity;
        let line = self
            .lines
            .iter_mut()
            .find(|l| l.queue == queue)
            .ok_or(Refused::UnknownQueue)?;
        line.stats.arrived += 1;
        if full {
            line.stats.overflowed += 1;
            return Err(Refused::Full);
        }
        line.held.push_back((id, now_ns + line.delay_ns));
        line.stats.held_max = line.stats.held_max.max(line.held.len() as u64);
        self.held_total += 1;
        Ok(())
    }

    /// When the next held packet is due, if any.
    pub fn next_due(&self) -> Option<u64> {
        self.lines
            .iter()
            .filter_map(|l| l.held.front().map(|&(_, due)| due))
            .min()
    }

    /// Releases every packet due by `now_ns`, calling `release(queue, highest_id)` once per
    /// queue that had any.
    pub fn release(&mut self, now_ns: u64, mut release: impl FnMut(u16, u32)) {
        for line in &mut self.lines {
            let mut last = None;
            while let Some(&(id, due)) = line.held.front() {
                if due > now_ns {
                    break;
                }
                line.held.pop_front();
                last = Some(id);
                line.stats.released += 1;
                let late_us = (now_ns - due) / 1000;
                line.lateness[bucket(late_us)] += 1;
                line.stats.lateness_max_us = line.stats.lateness_max_us.max(late_us);
                if late_us > LATE_US {
                    line.stats.late_over_1ms += 1;
                }
                self.held_total -= 1;
            }
            if let Some(id) = last {
                release(line.queue, id);
            }
        }
    }

    /// Releases everything still held at once (on shutdown), one call per queue.
    pub fn flush(&mut self, mut release: impl FnMut(u16, u32)) {
        for line in &mut self.lines {
            if let Some(&(id, _)) = line.held.back() {
                release(line.queue, id);
            }
            self.held_total -= line.held.len();
            line.held.clear();
        }
    }

    /// The counters of every queue.
    pub fn stats(&self) -> Vec<LineStats> {
        self.lines
            .iter()
            .map(|l| {
                let mut s = l.stats.clone();
                s.held = l.held.len() as u64;
                s.lateness_p50_us = percentile(&l.lateness, 0.50);
                s.lateness_p99_us = percentile(&l.lateness, 0.99);
                s
            })
            .collect()
    }
}

fn bucket(us: u64) -> usize {
    ((64 - us.leading_zeros()) as usize).min(LATENESS_BUCKETS - 1)
}

/// Upper bound (µs) of the bucket holding the `q` quantile.
fn percentile(hist: &[u64; LATENESS_BUCKETS], q: f64) -> u64 {
    let total: u64 = hist.iter().sum();
    if total == 0 {
        return 0;
    }
    let target = (q * total as f64).ceil() as u64;
    let mut seen = 0;
    for (k, n) in hist.iter().enumerate() {
        seen += n;
        if seen >= target {
            return if k == 0 { 0 } else { 1 << k };
        }
    }
    1 << (LATENESS_BUCKETS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn holds_each_queue_for_its_own_delay_and_releases_in_batches() {
        let mut d = DelayLine::new(&[(1, 60 * MS), (2, 10 * MS)], 100);
        d.arrive(1, 100, 0).unwrap();
        d.arrive(1, 101, MS).unwrap();
        d.arrive(2, 7, MS).unwrap();
        assert_eq!(d.next_due(), Some(11 * MS));
        let mut out = Vec::new();
        d.release(5 * MS, |q, id| out.push((q, id)));
        assert!(out.is_empty(), "nothing is due yet");
        d.release(11 * MS, |q, id| out.push((q, id)));
        assert_eq!(out, vec![(2, 7)]);
        out.clear();
        d.release(61 * MS + 500_000, |q, id| out.push((q, id)));
        assert_eq!(out, vec![(1, 101)], "one batch releases both due packets");
        assert_eq!(d.next_due(), None);
        let s = d.stats();
        assert_eq!((s[0].arrived, s[0].released, s[0].held_max), (2, 2, 2));
        assert_eq!(s[0].lateness_max_us, 1500);
        assert_eq!(s[1].lateness_max_us, 0);
    }

    #[test]
    fn refuses_past_capacity_and_unknown_queues() {
        let mut d = DelayLine::new(&[(1, MS)], 2);
        d.arrive(1, 1, 0).unwrap();
        d.arrive(1, 2, 0).unwrap();
        assert_eq!(d.arrive(1, 3, 0), Err(Refused::Full));
        assert_eq!(d.arrive(9, 3, 0), Err(Refused::UnknownQueue));
        assert_eq!(d.stats()[0].overflowed, 1);
        d.release(MS, |_, _| {});
        d.arrive(1, 4, MS).unwrap();
    }

    #[test]
    fn flush_releases_everything_and_empties_the_line() {
        let mut d = DelayLine::new(&[(1, MS), (2, MS)], 10);
        d.arrive(1, 5, 0).unwrap();
        d.arrive(1, 6, 0).unwrap();
        let mut out = Vec::new();
        d.flush(|q, id| out.push((q, id)));
        assert_eq!(out, vec![(1, 6)]);
        assert_eq!(d.stats()[0].held, 0);
        d.arrive(1, 7, 0).unwrap();
    }

    #[test]
    fn lateness_percentiles_come_from_log_buckets() {
        let mut d = DelayLine::new(&[(1, 0)], 1000);
        for i in 0..100 {
            d.arrive(1, i, 0).unwrap();
        }
        // 99 packets released 3 µs late, then one 5 ms late.
        let mut released = 0;
        d.release(3_000, |_, id| released = id);
        let s = d.stats();
        assert_eq!(s[0].lateness_p50_us, 4);
        assert_eq!(released, 99);
        d.arrive(1, 100, 0).unwrap();
        d.release(5 * MS, |_, _| {});
        let s = d.stats();
        assert_eq!(s[0].late_over_1ms, 1);
        assert_eq!(s[0].lateness_p99_us, 4);
        assert_eq!(s[0].lateness_max_us, 5000);
    }
}
