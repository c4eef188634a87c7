//! Flows across a lab: `hsxfer bench` runs from a sender host to the lab's server on the
//! receiver, with `--json` events and an optional `--trace`, parsed into what the experiments
//! need (goodput over time, the summary, per-channel cwnd samples).

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::Instant;

use super::config::Host;
use super::element::{faithful, Releases};
use super::topology::{Lab, SERVER_PORT};
use super::LabError;
use crate::session::events::Event;
use crate::TransferReport;

/// One bench connection to run.
#[derive(Debug, Clone)]
pub struct FlowSpec {
    /// The sender host it starts from.
    pub from: Host,
    /// Parallel channels (TCP connections) of this one hsxfer connection.
    pub channels: u16,
    /// Whether the online tuner may add channels to `channels` (then `-n` is not passed, as
    /// in a copy with no flags, and `channels` must be the default count).
    pub count_may_grow: bool,
    /// Congestion control of every channel (always explicit: the host default is bbr here).
    pub cc: String,
    /// How long it runs, seconds.
    pub seconds: f64,
    /// Keep the per-channel 10 ms trace here (otherwise it goes to a temporary file in the
    /// lab's directory, removed once read).
    pub trace: Option<PathBuf>,
    /// Further `bench` options (e.g. `--stagger 300ms`). By default channels start together
    /// and are not paced: plain parallel streams, as in the seed experiments.
    pub extra: Vec<String>,
}

impl FlowSpec {
    /// A flow of `channels` × `cc` from sender 1 for `seconds`.
    pub fn new(cc: &str, channels: u16, seconds: f64) -> FlowSpec {
        FlowSpec {
            from: Host::Sender(1),
            channels,
            count_may_grow: false,
            cc: cc.into(),
            seconds,
            trace: None,
            extra: Vec::new(),
        }
    }
}

/// A flow that is running.
pub struct RunningFlow {
    child: Child,
    /// Its standard output and error, read as they come (see [`drain`]).
    output: [std::thread::JoinHandle<Vec<u8>>; 2],
    spec: FlowSpec,
    trace: PathBuf,
    /// The delay element's statistics file, and its counts when the flow started.
    element_stats: PathBuf,
    releases: Option<Releases>,
    /// When it was started.
    pub started: Instant,
}

/// One 10 ms trace sample of one channel.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TraceRow {
    /// Seconds since the flow's sampler started.
    pub t: f64,
    /// Channel index.
    pub channel: u16,
    /// Congestion window, segments.
    pub cwnd: u64,
    /// Slow-start threshold, segments.
    pub ssthresh: u64,
    /// Smoothed RTT, µs.
    pub rtt_us: u64,
    /// Congestion-avoidance state (3 Recovery, 4 Loss).
    pub ca_state: u8,
    /// Segments retransmitted over the connection's life.
    pub total_retrans: u32,
    /// Bytes acknowledged so far.
    pub bytes_acked: u64,
}

/// What a finished flow reported.
#[derive(Debug, Clone)]
pub struct FlowResult {
    /// The spec it ran with.
    pub spec: FlowSpec,
    /// The `summary` event's report.
    pub summary: TransferReport,
    /// The 10 ms `TCP_INFO` trace of every channel (goodput is measured from it: what the
    /// receiver acknowledged, timed when sampled).
    pub trace: Vec<TraceRow>,
    /// The share of the delay element's releases while it ran that came more than 1 ms late
    /// (from a publication of its statistics before the flow started, within 500 ms, to the
    /// first after it ended; `None` without its statistics).
    pub late_share: Option<f64>,
}

impl Lab {
    /// Starts `bench` from `spec.from` to the lab's server.
    pub fn start_flow(&self, spec: &FlowSpec) -> Result<RunningFlow, LabError> {
        self.check_host(spec.from)?;
        let releases = self.releases();
        let mut c = self.hsxfer(spec.from);
        c.arg("bench")
            .arg(Host::Receiver.addr().to_string())
            .args(["--port", &SERVER_PORT.to_string()])
            .arg("--token-file")
            .arg(&self.state.token_file)
            .args(["--cc", &spec.cc])
            .args(["--time", &spec.seconds.to_string()])
            .args(["--interval", "500ms", "--json"]);
        if !spec.count_may_grow {
            c.args(["-n", &spec.channels.to_string()]);
        }
        if !spec.extra.iter().any(|a| a == "--buffer") {
            c.args(["--buffer", "kernel"]);
        }
        if !spec.extra.iter().any(|a| a == "--stagger") {
            c.args(["--stagger", "off"]);
        }
        if !spec.extra.iter().any(|a| a == "--pace") {
            c.args(["--pace", "off"]);
        }
        // A copy's blocks, not a timed bench's 64 KiB: the flows stand for copies, and the
        // results stay comparable with the runs before timed benches changed.
        if !spec.extra.iter().any(|a| a == "--block-size") {
            c.args(["--block-size", "4M"]);
        }
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let trace = spec.trace.clone().unwrap_or_else(|| {
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.dir()
                .join(format!("flow-{}-{n}.csv", std::process::id()))
        });
        c.arg("--trace").arg(&trace);
        c.args(&spec.extra);
        let mut child = c
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(LabError::io("starting hsxfer bench"))?;
        let output = [drain(child.stdout.take()), drain(child.stderr.take())];
        Ok(RunningFlow {
            child,
            output,
            spec: spec.clone(),
            trace,
            element_stats: self.element_stats_path(),
            releases,
            started: Instant::now(),
        })
    }

    /// Runs one flow to the end.
    pub fn run_flow(&self, spec: &FlowSpec) -> Result<FlowResult, LabError> {
        self.start_flow(spec)?.wait()
    }
}

/// Reads `pipe` to its end on a thread of its own. A flow's output must be read while it
/// runs: `bench --json` writes a line per channel every interval, and a flow whose pipe is
/// full blocks on it and stops sending. Experiments that run two flows at once waited for
/// the first while the second's pipe filled, which throttled the second to about 11 Mbit/s
/// at 100 Mbit/s (the convergence and fairness results before this fix).
fn drain(pipe: Option<impl std::io::Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut out = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut out);
        }
        out
    })
}

impl RunningFlow {
    /// Waits for the flow and parses what it printed.
    pub fn wait(mut self) -> Result<FlowResult, LabError> {
        self.child
            .wait()
            .map_err(LabError::io("waiting for hsxfer bench"))?;
        let [stdout, stderr] = self.output.map(|h| h.join().unwrap_or_default());
        let stdout = String::from_utf8_lossy(&stdout);
        let events: Vec<Event> = stdout
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let summary = events.iter().find_map(|e| match e {
            Event::Summary { report, .. } => Some(report.as_ref().clone()),
            _ => None,
        });
        let Some(summary) = summary else {
            let why = events
                .iter()
                .find_map(|e| match e {
                    Event::Error { message } => Some(message.clone()),
                    _ => None,
                })
                .unwrap_or_else(|| String::from_utf8_lossy(&stderr).trim().to_string());
            return Err(LabError::Command {
                command: format!("hsxfer bench ({} × {})", self.spec.channels, self.spec.cc),
                stderr: why,
            });
        };
        let csv = std::fs::read_to_string(&self.trace).map_err(LabError::io("reading a trace"));
        if self.spec.trace.is_none() {
            let _ = std::fs::remove_file(&self.trace);
        }
        let late_share = Releases::read_next(&self.element_stats)
            .zip(self.releases)
            .and_then(|(after, before)| after.late_share_since(&before));
        Ok(FlowResult {
            spec: self.spec,
            summary,
            trace: parse_trace(&csv?),
            late_share,
        })
    }
}

impl FlowResult {
    /// Whether the path it ran on was the one built (see [`faithful`]).
    pub fn path_faithful(&self) -> bool {
        faithful(self.late_share)
    }

    /// When the flow first ran in congestion avoidance with a window of at least `window`
    /// segments: the earliest sample of any channel in the Open state, out of slow start
    /// (cwnd ≥ ssthresh) with cwnd ≥ `window`. A loss-based flow reaches the steady state its
    /// queue allows only from there; slow start's overshoot and a timeout after it can hold
    /// a Reno flow below the BDP for many seconds at one segment per RTT, which is the
    /// congestion control's ramp, not a property of the path.
    pub fn ramped_up_at(&self, window: u64) -> Option<f64> {
        self.trace
            .iter()
            .find(|r| r.ca_state == 0 && r.ssthresh > 0 && r.cwnd >= r.ssthresh && r.cwnd >= window)
            .map(|r| r.t)
    }

    /// Delivered goodput after `warmup` seconds of the trace, bits/s: per channel, the bytes
    /// acknowledged between its first sample at or after `warmup` and its last, over the
    /// longest such span (the summary's goodput when the trace is too short). Sample times
    /// come from the sampler, so a busy reporting loop cannot skew them.
    pub fn goodput_after(&self, warmup: f64) -> f64 {
        let channels = self
            .trace
            .iter()
            .map(|r| r.channel)
            .max()
            .map_or(0, |c| c + 1);
        let mut bytes = 0u64;
        let mut span = 0f64;
        for ch in 0..channels {
            let mut late = self
                .trace
                .iter()
                .filter(|r| r.channel == ch && r.t >= warmup);
            if let Some(first) = late.next() {
                let last = late.next_back().unwrap_or(first);
                bytes += last.bytes_acked - first.bytes_acked;
                span = span.max(last.t - first.t);
            }
        }
        if span < 0.5 {
            return self.summary.goodput_bps;
        }
        bytes as f64 * 8.0 / span
    }

    /// Per-channel goodput from the summary, bits/s.
    pub fn channel_goodputs(&self) -> Vec<f64> {
        self.summary
            .channels
            .iter()
            .map(|c| c.goodput_bps)
            .collect()
    }

    /// The congestion controls the channels ran with, as the kernel reported them.
    pub fn channel_ccs(&self) -> Vec<String> {
        self.summary
            .channels
            .iter()
            .map(|c| c.cc.clone().unwrap_or_else(|| "?".into()))
            .collect()
    }
}

/// Background traffic running across a lab (Cui 2013 §5.6, see [`super::traffic`]): a sink
/// on the receiver and a source on one sender host. Stopped when dropped.
pub struct Background {
    children: Vec<Child>,
}

impl Lab {
    /// Starts background traffic from `from` to the receiver, scaled to the lab's rate.
    pub fn start_background(&self, from: Host) -> Result<Background, LabError> {
        self.check_host(from)?;
        let receiver = Host::Receiver.addr().to_string();
        let spawn = |host: Host, args: &[&str]| {
            self.hsxfer(host)
                .args(["lab", "traffic"])
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(LabError::io("starting background traffic"))
        };
        let mut bg = Background {
            children: vec![spawn(Host::Receiver, &["sink", &receiver])?],
        };
        std::thread::sleep(std::time::Duration::from_millis(200));
        let rate = self.spec().rate_bps.to_string();
        bg.children
            .push(spawn(from, &["source", &receiver, "--rate", &rate])?);
        Ok(bg)
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Parses a `--trace` CSV (header `t_s,channel,cwnd,ssthresh,rtt_us,min_rtt_us,ca_state,…,bytes_acked`).
pub fn parse_trace(csv: &str) -> Vec<TraceRow> {
    csv.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            if f.len() < 12 {
                return None;
            }
            Some(TraceRow {
                t: f[0].parse().ok()?,
                channel: f[1].parse().ok()?,
                cwnd: f[2].parse().ok()?,
                ssthresh: f[3].parse().ok()?,
                rtt_us: f[4].parse().ok()?,
                ca_state: f[6].parse().ok()?,
                total_retrans: f[8].parse().ok()?,
                bytes_acked: f[11].parse().ok()?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_rows_parse_and_bad_lines_are_skipped() {
        let csv = "t_s,channel,cwnd,ssthresh,rtt_us,min_rtt_us,ca_state,retrans,total_retrans,delivery_rate_bps,pacing_rate_bps,bytes_acked\n\
                   0.010,0,10,2147483647,60500,60100,0,0,0,0,0,1\n\
                   garbage\n\
                   0.020,1,14,7,60600,60100,3,1,2,5,6,14481\n";
        let rows = parse_trace(csv);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1].channel, 1);
        assert_eq!(rows[1].ca_state, 3);
        assert_eq!(rows[1].bytes_acked, 14481);
    }

    #[test]
    fn ramp_up_is_the_first_open_sample_past_slow_start_with_the_window() {
        let row = |t: f64, cwnd: u64, ssthresh: u64, ca_state: u8| TraceRow {
            t,
            channel: 0,
            cwnd,
            ssthresh,
            rtt_us: 0,
            ca_state,
            total_retrans: 0,
            bytes_acked: 0,
        };
        let r = FlowResult {
            spec: FlowSpec::new("reno", 1, 4.0),
            summary: TransferReport::default(),
            trace: vec![
                // Slow start past the window, recovery, then congestion avoidance below it.
                row(0.1, 600, u32::MAX as u64, 0),
                row(0.2, 700, 350, 3),
                row(0.3, 300, 150, 0),
                row(0.4, 499, 150, 0),
                row(0.5, 500, 150, 0),
                row(0.6, 520, 150, 0),
            ],
            late_share: None,
        };
        assert_eq!(r.ramped_up_at(500), Some(0.5));
        assert_eq!(r.ramped_up_at(600), None);
    }

    #[test]
    fn goodput_after_warmup_is_acknowledged_bytes_over_the_sampled_span() {
        let row = |t: f64, channel: u16, bytes_acked: u64| TraceRow {
            t,
            channel,
            cwnd: 10,
            ssthresh: 0,
            rtt_us: 0,
            ca_state: 0,
            total_retrans: 0,
            bytes_acked,
        };
        let r = FlowResult {
            spec: FlowSpec::new("reno", 2, 4.0),
            summary: TransferReport {
                goodput_bps: 5.0,
                ..TransferReport::default()
            },
            trace: vec![
                row(0.5, 0, 100),
                row(0.5, 1, 50),
                row(1.0, 0, 1000),
                row(1.0, 1, 500),
                row(2.0, 0, 2000),
                row(2.0, 1, 1000),
            ],
            late_share: None,
        };
        assert_eq!(r.goodput_after(1.0), 1500.0 * 8.0);
        assert_eq!(
            r.goodput_after(1.8),
            5.0,
            "too short a span is not a measurement"
        );
    }
}
