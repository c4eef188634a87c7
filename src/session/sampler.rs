//! The sending side's sampling thread: every [`SAMPLE_PERIOD`] it reads `TCP_INFO` of every
//! data socket (of every subflow of an MPTCP connection) into the telemetry and, when the
//! transfer is tuned online, feeds the [`PathEstimator`] and the [`OnlineTuner`] and carries
//! out what the tuner decides (pacing caps and congestion controls on the sockets, releasing
//! the channels held for the meter or retiring added ones, asking the engine for more
//! channels).
//!
//! A thread of its own, not a tokio task: a runtime worker can sit in one multi-megabyte
//! `send` for a long time (on a busy 2-core host, a task-driven sampler was measured with gaps
//! of up to 400 ms), and a tuner that decides from late samples decides late.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use tokio::sync::{mpsc, watch};

use super::report::LiveStats;
use super::subflow_rows::{per_channel, read_sockets, Rows, Watched};
use super::telemetry::SAMPLE_PERIOD;
use crate::channels::telemetry::{Sample, TunerReport};
use crate::transport::cc::{congestion, set_congestion};
use crate::transport::tcp::{set_max_pacing_rate, PACING_UNCAPPED};
use crate::tuning::estimate::PathEstimator;
use crate::tuning::online::{Action, OnlineTuner};

/// Samples between two reads of the DMCTCP group's counters (a tenth of a second).
const GROUP_READ_TICKS: u64 = 10;

/// The online tuner of a transfer and the engine's ends of what it decides.
pub struct OnlineControl {
    /// The tuner.
    pub tuner: OnlineTuner,
    /// How many channels take blocks, the first ones: one while the meter runs, all
    /// ([`u16::MAX`]) once released, fewer once the tuner retired added ones.
    pub running: Arc<watch::Sender<u16>>,
    /// Channel counts the engine must add.
    pub grow: mpsc::UnboundedSender<u16>,
}

struct Online {
    ctl: OnlineControl,
    estimator: PathEstimator,
    /// What the tuner wants on channels that may not be open yet: pacing, congestion control.
    pace: Vec<Option<Option<u64>>>,
    cc: Vec<Option<String>>,
    /// Decisions already in the telemetry's copy of the tuner's report.
    reported: usize,
}

struct Shared {
    stop: AtomicBool,
    sockets: Mutex<Vec<Option<Watched>>>,
    online: Mutex<Option<Online>>,
    live: Arc<LiveStats>,
}

/// A running sampler; stopped (and its thread joined) by [`Sampler::stop`] or on drop.
pub struct Sampler {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// The sending side's sampler, and what its online tuner (if any) controls in the engine.
pub struct SendingSide {
    /// The sampler (shared with the setup of channels that join later).
    pub sampler: Arc<Sampler>,
    /// How many channels take blocks ([`OnlineControl::running`]).
    pub gate: Option<Arc<watch::Sender<u16>>>,
    /// Channel counts the tuner asks for.
    pub requests: Option<mpsc::UnboundedReceiver<u16>>,
}

impl SendingSide {
    /// Starts sampling `channels` into `live`, tuned online by `tuner` if given.
    pub fn start(
        live: Arc<LiveStats>,
        tuner: Option<OnlineTuner>,
        channels: &[crate::transport::tls::Stream],
    ) -> crate::Result<SendingSide> {
        // The report from the start: a pulling client gets this copy, and a tuner that never
        // acts nor decides (a short pull, a pull with --pace) would otherwise leave it none.
        if let Some(t) = &tuner {
            live.telemetry.set_tuner(t.report().clone());
        }
        let gate = tuner
            .as_ref()
            .map(|t| Arc::new(watch::channel(if t.holds_channels() { 1 } else { u16::MAX }).0));
        let (grow, requests) = mpsc::unbounded_channel();
        let online = tuner
            .zip(gate.clone())
            .map(|(tuner, running)| OnlineControl {
                tuner,
                running,
                grow,
            });
        let requests = online.is_some().then_some(requests);
        let sampler = Arc::new(Sampler::start(live, online));
        for (i, c) in channels.iter().enumerate() {
            sampler.attach(i, c)?;
        }
        Ok(SendingSide {
            sampler,
            gate,
            requests,
        })
    }
}

impl Sampler {
    /// Starts sampling into `live`, tuning online when `online` is given.
    pub fn start(live: Arc<LiveStats>, online: Option<OnlineControl>) -> Sampler {
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            sockets: Mutex::new(Vec::new()),
            online: Mutex::new(online.map(|ctl| Online {
                ctl,
                estimator: PathEstimator::new(),
                pace: Vec::new(),
                cc: Vec::new(),
                reported: 0,
            })),
            live,
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("hsxfer-sampler".into())
            .spawn(move || run(&s))
            .ok();
        Sampler {
            shared,
            thread: Mutex::new(thread),
        }
    }

    /// Starts sampling channel `index`'s socket (a duplicate of its descriptor, so it stays
    /// readable after the channel closed), applying what the tuner already decided for it:
    /// for a channel that joins after the tuner switched every channel's congestion
    /// control, that one. Both locks are held throughout, in the order `carry_out` takes
    /// them, so that a decision carried out meanwhile reaches this socket too.
    pub fn attach(&self, index: usize, sock: &impl AsFd) -> crate::Result<()> {
        let w = Watched::new(
            sock.as_fd()
                .try_clone_to_owned()
                .map_err(crate::Error::io("duplicating a data socket for telemetry"))?,
        );
        let mut online = self.shared.online.lock().expect("tuner lock");
        let mut sockets = self.shared.sockets.lock().expect("sampler sockets lock");
        if let Some(o) = online.as_mut() {
            let switched = o.ctl.tuner.switched_cc().map(str::to_string);
            if o.cc.len() <= index {
                o.cc.resize(index + 1, None);
            }
            if o.cc[index].is_none() {
                o.cc[index] = switched;
            }
            if let Some(name) = &o.cc[index] {
                apply_cc(&self.shared.live, &[index], &w.fd, name);
            }
            if let Some(Some(rate)) = o.pace.get(index) {
                apply_pace(&self.shared.live, index, &w, *rate);
            }
        }
        if sockets.len() <= index {
            sockets.resize_with(index + 1, || None);
        }
        sockets[index] = Some(w);
        Ok(())
    }

    /// Stops sampling; returns what the online tuner learned and did, if there was one.
    pub fn stop(&self) -> Option<TunerReport> {
        self.halt();
        let online = self.shared.online.lock().expect("tuner lock");
        online.as_ref().map(|o| o.ctl.tuner.report().clone())
    }

    fn halt(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.lock().expect("sampler thread lock").take() {
            // Wakes it from its wait for the next period: it takes its last sample now
            // rather than up to a period later, while the caller (a runtime worker at the
            // end of a transfer) waits.
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.halt();
    }
}

fn run(s: &Shared) {
    let mut next = Instant::now();
    let mut placed = Rows::default();
    let mut ticks = 0u64;
    while !s.stop.load(Ordering::Relaxed) {
        next += SAMPLE_PERIOD;
        let now = Instant::now();
        if next > now {
            wait_until(next, &s.stop);
        } else {
            // Late (the host is busy): sample now and keep the period from here.
            next = now;
        }
        let t = s.live.elapsed();
        let (readings, channels) = {
            let sockets = s.sockets.lock().expect("sampler sockets lock");
            (read_sockets(&sockets), sockets.len())
        };
        let rows = placed.place(readings, channels, &s.live.telemetry, t);
        ticks += 1;
        if ticks % GROUP_READ_TICKS == 0 {
            // Keeps the DMCTCP group's counters: an MPTCP group goes with its last subflow.
            s.live.telemetry.dmctcp();
        }
        for (i, r) in rows.iter().enumerate() {
            if let Some(r) = r {
                s.live.telemetry.record(Sample {
                    t,
                    channel: i as u16,
                    tcp: r.tcp,
                });
            }
        }
        let mut online = s.online.lock().expect("tuner lock");
        if let Some(o) = online.as_mut() {
            // The tuner paces and counts connections: an MPTCP connection is one channel.
            let tick = o.estimator.observe(t, &per_channel(&rows, channels));
            let actions = o.ctl.tuner.on_tick(&o.estimator, &tick);
            let acted = !actions.is_empty();
            if acted {
                tracing::debug!("tuner at {t:.3} s: {actions:?}");
                carry_out(s, o, actions, &mut placed);
            }
            // A decision may come with no action (a verdict that the count stays): the
            // report a pulling client gets is this copy, so it must have every decision.
            let decisions = o.ctl.tuner.report().decisions.len();
            if acted || decisions != o.reported {
                o.reported = decisions;
                s.live.telemetry.set_tuner(o.ctl.tuner.report().clone());
            }
        }
    }
}

/// Waits until `deadline`, or until [`Sampler::stop`] has stopped the sampling and woken the
/// thread.
fn wait_until(deadline: Instant, stop: &AtomicBool) {
    loop {
        let now = Instant::now();
        if now >= deadline || stop.load(Ordering::Relaxed) {
            return;
        }
        std::thread::park_timeout(deadline - now);
    }
}

/// Carries out the tuner's decisions: on open sockets now, on the others when they attach.
fn carry_out(s: &Shared, o: &mut Online, actions: Vec<Action>, placed: &mut Rows) {
    let sockets = s.sockets.lock().expect("sampler sockets lock");
    let open = |i: usize| sockets.get(i).and_then(Option::as_ref);
    for a in actions {
        match a {
            Action::Pace { channel, rate } => {
                if o.pace.len() <= channel {
                    o.pace.resize(channel + 1, None);
                }
                o.pace[channel] = Some(rate);
                if let Some(w) = open(channel) {
                    apply_pace(&s.live, channel, w, rate);
                }
            }
            Action::SetCc { channel, name } => {
                if let Some(w) = open(channel) {
                    apply_cc(&s.live, &placed.rows_of(channel), &w.fd, &name);
                    // An MPTCP connection's subflows, read back one by one.
                    placed.record_cc(channel, &s.live.telemetry);
                }
                if o.cc.len() <= channel {
                    o.cc.resize(channel + 1, None);
                }
                o.cc[channel] = Some(name);
            }
            Action::Release => {
                o.ctl.running.send_replace(u16::MAX);
            }
            Action::Retire { keep } => {
                o.ctl.running.send_replace(keep);
            }
            Action::AddChannels(n) => {
                let _ = o.ctl.grow.send(n);
            }
        }
    }
}

/// Caps channel `channel`; an MPTCP connection's subflows share the cap, and their rows show
/// each one's share as the kernel reads it back ([`Rows`]).
fn apply_pace(live: &LiveStats, channel: usize, w: &Watched, rate: Option<u64>) {
    match set_max_pacing_rate(&w.fd, rate.unwrap_or(PACING_UNCAPPED)) {
        Ok(()) if !w.mptcp => live
            .telemetry
            .set_pace(channel, rate.map(|r| r.saturating_mul(8))),
        Ok(()) => {}
        Err(e) => tracing::warn!("pacing data channel {channel}: {e}"),
    }
}

/// Switches a channel's congestion control and records it in its `rows` (an MPTCP
/// connection's subflows all take it).
fn apply_cc(live: &LiveStats, rows: &[usize], fd: &OwnedFd, name: &str) {
    if let Err(e) = set_congestion(fd, name) {
        tracing::warn!("switching data channel {:?} to {name}: {e}", rows.first());
    }
    if let Ok(now) = congestion(fd) {
        for r in rows {
            live.telemetry.set_cc(*r, now.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stopping does not wait out the period the thread waits in. Stopped 1 ms into its first
    /// 10 ms wait, the sampler returned about 9 ms later when it slept through the wait; the
    /// fastest of three stops must take under 5 ms.
    #[test]
    fn a_stop_wakes_the_sampler_at_once() {
        let fastest = (0..3)
            .map(|_| {
                let sampler = Sampler::start(Arc::new(LiveStats::new(1)), None);
                std::thread::sleep(std::time::Duration::from_millis(1));
                let start = Instant::now();
                sampler.stop();
                start.elapsed()
            })
            .min()
            .unwrap();
        assert!(
            fastest < std::time::Duration::from_millis(5),
            "the fastest of three stops took {fastest:?}"
        );
    }
}
