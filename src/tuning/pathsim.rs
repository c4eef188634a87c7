//! A fluid model of TCP channels through one bottleneck, to test the online tuner end to end
//! without sockets or clocks: Reno-like windows (slow start, halving on loss, one segment per
//! RTT), a drop-tail queue in bytes, random loss, a receive-window cap and a host's rate
//! limit per channel, a receiver's read rate for all of them, and the tuner's pacing caps.
//! It produces the `TCP_INFO` readings the estimator takes and carries out the tuner's
//! actions. Coarse (10 ms steps, no ACK clock), but it has the three things the tuner must
//! get right: a queue that overflows, windows that take RTTs to grow back, and limits that
//! more channels can or cannot beat.

use crate::channels::telemetry::{TcpSample, CA_RECOVERY};

use super::online::Action;

/// The path.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Path {
    /// Bottleneck goodput rate, bytes/s.
    pub rate: f64,
    /// Round-trip time without queueing, seconds.
    pub rtt: f64,
    /// Bottleneck queue, bytes.
    pub buffer: f64,
    /// Random loss per segment.
    pub loss: f64,
    /// Most bytes in flight per channel (the receiver's window).
    pub window_cap: f64,
    /// Most one channel's host sends, bytes/s (a core's worth of encryption and hashing).
    pub host_cap: f64,
    /// Most the receiver reads of all channels together, bytes/s (its cores): above it the
    /// receive windows close, so every channel is held back by its window and nothing is
    /// lost, however many channels send.
    pub reader_cap: f64,
}

const MSS: f64 = 1448.0;

#[derive(Debug, Clone, Default)]
struct Flow {
    sending: bool,
    /// Retired by the tuner: sends no more.
    retired: bool,
    cwnd: f64,
    ssthresh: f64,
    recovery_until: f64,
    delivered: f64,
    retrans: f64,
    cap: Option<f64>,
    rate: f64,
    busy: f64,
    rwnd_limited: f64,
}

/// The simulated transfer.
#[derive(Debug, Clone)]
pub(crate) struct Sim {
    path: Path,
    flows: Vec<Flow>,
    queue: f64,
    /// Seconds simulated.
    pub t: f64,
    seed: u64,
}

impl Sim {
    /// `channels` channels on `path`; the first sends at once, the others when `held` is
    /// false or the tuner releases them.
    pub(crate) fn new(path: Path, channels: usize, held: bool) -> Sim {
        let mut s = Sim {
            path,
            flows: Vec::new(),
            queue: 0.0,
            t: 0.0,
            seed: 0x9E37_79B9_7F4A_7C15,
        };
        for i in 0..channels {
            s.add_flow(i == 0 || !held);
        }
        s
    }

    fn add_flow(&mut self, sending: bool) {
        self.flows.push(Flow {
            sending,
            cwnd: 10.0,
            ssthresh: f64::INFINITY,
            delivered: 1.0,
            ..Default::default()
        });
    }

    fn random(&mut self) -> f64 {
        // xorshift64*: deterministic runs.
        self.seed ^= self.seed >> 12;
        self.seed ^= self.seed << 25;
        self.seed ^= self.seed >> 27;
        (self.seed.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Carries out the tuner's decisions.
    pub(crate) fn apply(&mut self, actions: &[Action]) {
        for a in actions {
            match a {
                Action::Pace { channel, rate } => {
                    while self.flows.len() <= *channel {
                        self.add_flow(true);
                    }
                    self.flows[*channel].cap = rate.map(|r| r as f64);
                }
                Action::Release => self.flows.iter_mut().for_each(|f| f.sending = true),
                Action::AddChannels(n) => (0..*n).for_each(|_| self.add_flow(true)),
                Action::Retire { keep } => {
                    for f in self.flows.iter_mut().skip(*keep as usize) {
                        f.retired = true;
                    }
                }
                Action::SetCc { .. } => {}
            }
        }
    }

    /// Goodput of all channels now, bytes/s.
    pub(crate) fn goodput(&self) -> f64 {
        self.flows.iter().map(|f| f.rate).sum()
    }

    /// Channels now (not retired).
    pub(crate) fn channels(&self) -> usize {
        self.flows.iter().filter(|f| !f.retired).count()
    }

    /// Advances `dt` seconds.
    pub(crate) fn step(&mut self, dt: f64) {
        let p = self.path;
        let rtt = p.rtt + self.queue / p.rate;
        let offered: Vec<f64> = self
            .flows
            .iter()
            .map(|f| {
                if !f.sending || f.retired {
                    return 0.0;
                }
                let window = (f.cwnd * MSS).min(p.window_cap) / rtt;
                f.cap.map_or(window, |c| window.min(c)).min(p.host_cap)
            })
            .collect();
        let mut offered = offered;
        let mut total: f64 = offered.iter().sum();
        let read_limited = total > p.reader_cap;
        if read_limited {
            offered.iter_mut().for_each(|o| *o *= p.reader_cap / total);
            total = p.reader_cap;
        }
        // The bottleneck serves at most its rate: what arrives and what was queued.
        let served = p.rate.min(total + self.queue / dt);
        self.queue += (total - served) * dt;
        let overflow = (self.queue - p.buffer).max(0.0);
        self.queue = self.queue.clamp(0.0, p.buffer);
        let t = self.t;
        for (i, o) in offered.iter().enumerate() {
            let share = if total > 0.0 { o / total } else { 0.0 };
            let delivered = served * share * dt / MSS;
            let sent = o * dt / MSS;
            let dropped = overflow * share / MSS;
            let random = 1.0 - (1.0 - p.loss).powf(sent);
            let lost_random = self.random() < random;
            let f = &mut self.flows[i];
            f.rate = delivered * MSS / dt;
            f.delivered += delivered;
            if *o > 0.0 {
                f.busy += dt;
                let window_capped = f.cwnd * MSS > p.window_cap;
                if read_limited || window_capped && f.cap.is_none_or(|c| p.window_cap / rtt < c) {
                    f.rwnd_limited += dt;
                }
            }
            if (dropped >= 1.0 || lost_random) && t >= f.recovery_until {
                f.retrans += dropped.max(1.0);
                f.cwnd = (f.cwnd / 2.0).max(2.0);
                f.ssthresh = f.cwnd;
                f.recovery_until = t + rtt;
            } else if t >= f.recovery_until {
                // Grow only when the window, not a cap, limits what is sent.
                let window_rate = f.cwnd * MSS / rtt;
                let limited_by_window = f.cap.is_none_or(|c| window_rate < c)
                    && window_rate < p.host_cap
                    && f.cwnd * MSS < p.window_cap
                    && !read_limited;
                if limited_by_window {
                    if f.cwnd < f.ssthresh {
                        f.cwnd += delivered;
                    } else {
                        f.cwnd += delivered / f.cwnd;
                    }
                }
            }
        }
        self.t += dt;
    }

    /// The channels' `TCP_INFO` now.
    pub(crate) fn readings(&self) -> Vec<Option<TcpSample>> {
        let rtt = self.path.rtt + self.queue / self.path.rate;
        self.flows
            .iter()
            .map(|f| {
                Some(TcpSample {
                    cwnd: f.cwnd as u32,
                    ssthresh: if f.ssthresh.is_finite() {
                        f.ssthresh as u32
                    } else {
                        i32::MAX as u32
                    },
                    rtt_us: (rtt * 1e6) as u32,
                    min_rtt_us: (self.path.rtt * 1e6) as u32,
                    total_retrans: f.retrans as u32,
                    delivery_rate: f.rate as u64,
                    pacing_rate: f.cap.unwrap_or(f64::MAX) as u64,
                    ca_state: if self.t < f.recovery_until {
                        CA_RECOVERY
                    } else {
                        0
                    },
                    mss: MSS as u32,
                    delivered: f.delivered as u32,
                    busy_us: (f.busy * 1e6) as u64,
                    rwnd_limited_us: (f.rwnd_limited * 1e6) as u64,
                    ..Default::default()
                })
            })
            .collect()
    }
}
