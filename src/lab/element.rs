//! The delay element: a process in the router's namespace that owns the netfilter queues of
//! the ACK direction, holds each queued packet id for its queue's delay and releases due
//! packets with batch verdicts. It sleeps in `ppoll` with a nanosecond timeout (timer slack
//! 1 ns), runs at real-time priority pinned to one CPU when allowed, and publishes its
//! counters to a JSON file twice a second.

use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::delay::{DelayLine, LineStats};
use super::nfqueue::{self, Event, NfqSocket, Requests, NF_ACCEPT, NF_DROP};

/// Packets the element holds at most (8 bytes each): far above a 10 Gbit/s × 500 ms path's
/// ACKs, small in memory.
pub const CAPACITY: usize = 1 << 21;

/// How often the element publishes its statistics.
pub const PUBLISH_PERIOD: Duration = Duration::from_millis(500);

/// What to run: queue numbers and their delays, and where to publish statistics.
#[derive(Debug, Clone)]
pub struct ElementConfig {
    /// `(queue number, delay)` pairs.
    pub queues: Vec<(u16, Duration)>,
    /// The statistics file (JSON, rewritten twice a second).
    pub stats_path: PathBuf,
    /// CPU to pin to, if any.
    pub cpu: Option<usize>,
    /// Ask for `SCHED_FIFO` at this priority, if any.
    pub realtime_priority: Option<i32>,
    /// Random loss probability and the interfaces whose incoming packets it applies to.
    pub loss: Option<(f64, Vec<String>)>,
}

/// The statistics file's content.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ElementStats {
    /// Process id of the element.
    pub pid: u32,
    /// Whether real-time scheduling was granted.
    pub realtime: bool,
    /// The CPU it is pinned to, if pinned.
    pub cpu: Option<usize>,
    /// Seconds it has run.
    pub uptime_s: f64,
    /// Per-queue counters.
    pub queues: Vec<LineStats>,
    /// Largest delay between a timed wake-up's deadline and the element running again, µs
    /// (scheduling: the CPU or the hypervisor was busy elsewhere).
    pub wake_late_max_us: u64,
    /// Longest time from waking to having sent the verdicts, µs (work done in the element's
    /// context, including forwarding the released packets).
    pub busy_max_us: u64,
}

/// The most releases later than [`LATE_US`](super::delay::LATE_US) a faithfully emulated
/// stretch may have: a p99 lateness within 1 ms, as the self-check's clean runs had
/// (0.15–0.64 ms, DESIGN.md §5).
pub const FAITHFUL_LATE_SHARE: f64 = 0.01;

/// Whether a stretch with `late_share` of its releases late ran on the path that was built.
/// Unknown counts as faithful, so that a bound is never excused for want of statistics.
pub fn faithful(late_share: Option<f64>) -> bool {
    late_share.is_none_or(|s| s <= FAITHFUL_LATE_SHARE)
}

/// The delay element's release counts at one moment, to judge a stretch of time by: a busy
/// host can wake the element late, and the packets it then releases together overflow a
/// small bottleneck queue that the path as built would not have overflowed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Releases {
    /// Packets released so far, all queues.
    pub released: u64,
    /// Of them, released more than [`LATE_US`](super::delay::LATE_US) late.
    pub late: u64,
}

impl Releases {
    /// The counts in a statistics file's content.
    pub fn of(stats: &ElementStats) -> Releases {
        stats
            .queues
            .iter()
            .fold(Releases::default(), |r, q| Releases {
                released: r.released + q.released,
                late: r.late + q.late_over_1ms,
            })
    }

    /// The counts in the statistics file at `path`, if an element published one.
    pub fn read(path: &Path) -> Option<Releases> {
        read_stats(path).map(|s| Releases::of(&s))
    }

    /// The counts the element publishes next at `path` (within [`PUBLISH_PERIOD`]): all of
    /// a stretch that just ended. The last publication before its end missed up to 0.5 s of
    /// it, and with it the late releases of its last half second: a flow was judged to run on
    /// a faithful path without them. `None` if the element publishes nothing new.
    pub fn read_next(path: &Path) -> Option<Releases> {
        let seen = read_stats(path)?.uptime_s;
        let deadline = Instant::now() + 3 * PUBLISH_PERIOD;
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            if let Some(s) = read_stats(path).filter(|s| s.uptime_s > seen) {
                return Some(Releases::of(&s));
            }
        }
        None
    }

    /// The share of the releases since `before` that came late; `None` if none were released.
    pub fn late_share_since(&self, before: &Releases) -> Option<f64> {
        let released = self.released.checked_sub(before.released)?;
        let late = self.late.saturating_sub(before.late);
        (released > 0).then(|| late as f64 / released as f64)
    }
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Runs until SIGTERM or SIGINT; then releases every held packet and unbinds the queues.
pub fn run(config: &ElementConfig) -> io::Result<()> {
    install_stop_handler();
    // Started before the loop's thread is pinned and made real-time: the writer runs
    // anywhere, at normal priority.
    let publisher = Publisher::start(config.stats_path.clone())?;
    let realtime = tune_scheduling(config);
    let _loss_links = match &config.loss {
        Some((p, devices)) => super::loss::attach(*p, devices)?,
        None => Vec::new(),
    };
    let socket = NfqSocket::open(32 << 20)?;
    let mut requests = Requests::default();
    let mut seqs = Vec::new();
    for (k, &(queue, _)) in config.queues.iter().enumerate() {
        let seq = 2 * k as u32 + 1;
        requests.bind(queue, seq);
        requests.configure(queue, CAPACITY as u32, seq + 1);
        seqs.extend([seq, seq + 1]);
    }
    socket.request(&requests, &seqs).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("binding the netfilter queues failed ({e}); is another delay element running in this namespace?"),
        )
    })?;
    let queues: Vec<(u16, u64)> = config
        .queues
        .iter()
        .map(|&(q, d)| (q, d.as_nanos() as u64))
        .collect();
    let mut line = DelayLine::new(&queues, CAPACITY);
    let start = Instant::now();
    let now = || start.elapsed().as_nanos() as u64;
    let mut buf = vec![0u8; 256 << 10];
    let mut events = Vec::with_capacity(1024);
    let mut next_publish = 0u64;
    let (mut wake_late_max, mut busy_max) = (0u64, 0u64);
    let stats = |line: &DelayLine, t: u64, wake_late_max_us: u64, busy_max_us: u64| ElementStats {
        pid: std::process::id(),
        realtime,
        cpu: config.cpu,
        uptime_s: t as f64 / 1e9,
        queues: line.stats(),
        wake_late_max_us,
        busy_max_us,
    };
    while !STOP.load(Ordering::SeqCst) {
        let wake = line
            .next_due()
            .map_or(next_publish, |due| due.min(next_publish));
        wait_readable(&socket, wake.saturating_sub(now()))?;
        let woke = now();
        wake_late_max = wake_late_max.max(woke.saturating_sub(wake) / 1000);
        // Take everything waiting, then release what is due, in one batch per queue.
        while let Some(datagram) = socket.recv(&mut buf)? {
            let arrived = now();
            events.clear();
            nfqueue::parse(datagram, &mut events);
            for e in &events {
                if let Event::Packet { queue, id } = *e {
                    if line.arrive(queue, id, arrived).is_err() {
                        requests.clear();
                        requests.verdict(queue, id, NF_DROP);
                        socket.send(&requests)?;
                    }
                }
            }
        }
        requests.clear();
        let t = now();
        line.release(t, |queue, id| requests.verdict_batch(queue, id, NF_ACCEPT));
        socket.send(&requests)?;
        busy_max = busy_max.max(now().saturating_sub(woke) / 1000);
        if t >= next_publish {
            publisher.offer(stats(&line, t, wake_late_max, busy_max));
            next_publish = t + PUBLISH_PERIOD.as_nanos() as u64;
        }
    }
    requests.clear();
    line.flush(|queue, id| requests.verdict_batch(queue, id, NF_ACCEPT));
    socket.send(&requests)?;
    publisher.finish(stats(&line, now(), wake_late_max, busy_max));
    requests.clear();
    for (k, &(queue, _)) in config.queues.iter().enumerate() {
        requests.unbind(queue, 1000 + k as u32);
    }
    socket.send(&requests)
}

fn install_stop_handler() {
    // SAFETY: the handler only stores to an atomic; no SA_RESTART so ppoll returns EINTR.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_signal as *const () as usize;
        libc::sigemptyset(&mut action.sa_mask);
        for sig in [libc::SIGTERM, libc::SIGINT] {
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
}

/// Pins, raises priority and shrinks timer slack; returns whether real-time was granted.
fn tune_scheduling(config: &ElementConfig) -> bool {
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
    if let Some(cpu) = config.cpu {
        // SAFETY: cpu_set_t is plain data; CPU_SET stays within it for cpu < CPU_SETSIZE.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                tracing::warn!("could not pin the delay element to CPU {cpu}");
            }
        }
    }
    let Some(priority) = config.realtime_priority else {
        return false;
    };
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: `param` is a valid sched_param for this call.
    let ok = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } == 0;
    if !ok {
        tracing::warn!("real-time priority refused: release lateness may grow under load");
    }
    ok
}

/// Sleeps until the socket is readable, `timeout_ns` passes, or a signal arrives.
fn wait_readable(socket: &NfqSocket, timeout_ns: u64) -> io::Result<()> {
    let mut fd = libc::pollfd {
        fd: socket.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ts = libc::timespec {
        tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: one valid pollfd and a live timespec.
    let rc = unsafe { libc::ppoll(&mut fd, 1, &ts, std::ptr::null()) };
    if rc < 0 {
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
    Ok(())
}

/// Writes the statistics on a thread of its own: the packet loop hands it a snapshot and
/// goes on. Written from the loop, a slow filesystem held the releases up: the lab's
/// directory is on the VM's disk here, where a small write and rename took up to 69 ms
/// (p99 45 ms) while another process wrote, and every flow through the element stops for as
/// long as it waits.
struct Publisher {
    tx: Option<SyncSender<ElementStats>>,
    writer: Option<std::thread::JoinHandle<()>>,
}

impl Publisher {
    fn start(path: PathBuf) -> io::Result<Publisher> {
        let (tx, rx) = sync_channel::<ElementStats>(1);
        let writer = std::thread::Builder::new()
            .name("hsx-stats".into())
            .spawn(move || {
                for stats in rx {
                    publish(&path, &stats);
                }
            })?;
        Ok(Publisher {
            tx: Some(tx),
            writer: Some(writer),
        })
    }

    /// Hands `stats` to the writer; dropped if it is still busy with earlier ones (the next
    /// come a period later).
    fn offer(&self, stats: ElementStats) {
        if let Some(tx) = &self.tx {
            let _ = tx.try_send(stats);
        }
    }

    /// Writes `stats` as the last and waits until they are written.
    fn finish(mut self, stats: ElementStats) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(stats);
        }
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

/// Writes the statistics atomically (temporary file, then rename); failures are ignored,
/// the element's job is to forward packets.
fn publish(path: &Path, stats: &ElementStats) {
    let tmp = path.with_extension("tmp");
    if let Ok(text) = serde_json::to_vec(stats) {
        if std::fs::write(&tmp, text).is_ok() {
            let _ = std::fs::rename(&tmp, path);
        }
    }
}

/// Reads the statistics an element published.
pub fn read_stats(path: &Path) -> Option<ElementStats> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stretchs_late_share_counts_only_its_own_releases_over_all_queues() {
        let line = |released, late_over_1ms| LineStats {
            released,
            late_over_1ms,
            ..LineStats::default()
        };
        let at = |lines: Vec<LineStats>| {
            Releases::of(&ElementStats {
                queues: lines,
                ..ElementStats::default()
            })
        };
        let before = at(vec![line(1000, 500), line(0, 0)]);
        let after = at(vec![line(1900, 510), line(100, 0)]);
        assert_eq!(after.late_share_since(&before), Some(0.01));
        assert_eq!(before.late_share_since(&before), None, "nothing released");
        assert_eq!(before.late_share_since(&after), None, "a restarted element");
    }
}
