//! What the command prints: a live display on a terminal (a total bar and one line per
//! channel with its TCP state), NDJSON events with `--json` (schema in docs/json.md), a
//! `--trace` CSV time series, and a human summary.

use super::flags::as_flags;
use hsxfer::transport::Transport;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use hsxfer::channels::telemetry::{ChannelSetup, Sample};
use hsxfer::session::events::{Event, JSON_SCHEMA};
use hsxfer::session::telemetry::MAX_TRACE_SAMPLES;
use hsxfer::{LiveStats, TransferReport};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use tokio::sync::oneshot;

use super::units::fmt_rate;
use hsxfer::units::fmt_bytes;

/// How to report.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// NDJSON events on stdout.
    Json,
    /// Progress display (terminal only) and a human summary.
    Human,
}

/// Set while a pull writes its data to this process's stdout: reports go to stderr then.
static STDOUT_CARRIES_DATA: AtomicBool = AtomicBool::new(false);

/// Sends what would go to stdout (the summary, JSON events) to stderr from now on, when
/// `dest`, where a pull writes, is what stdout is open on (`/dev/stdout`, a pipe, or the
/// file stdout was redirected to): the report would otherwise end up inside the data.
pub fn keep_stdout_for(dest: &Path) {
    use std::os::unix::fs::MetadataExt;
    let same =
        |a: &std::fs::Metadata, b: &std::fs::Metadata| (a.dev(), a.ino()) == (b.dev(), b.ino());
    if let (Ok(d), Ok(out)) = (
        std::fs::metadata(dest),
        std::fs::metadata("/proc/self/fd/1"),
    ) {
        if same(&d, &out) {
            STDOUT_CARRIES_DATA.store(true, Ordering::Relaxed);
        }
    }
}

/// Writes one line to stdout (line-buffered: the newline sends it), or to stderr while
/// stdout carries a pull's data. A closed stdout is not an error of the command: what is
/// left to print is dropped, JSON events included.
pub fn stdout_line(args: std::fmt::Arguments<'_>) {
    let write = |out: &mut dyn Write| {
        let _ = out.write_fmt(args).and_then(|()| out.write_all(b"\n"));
    };
    if STDOUT_CARRIES_DATA.load(Ordering::Relaxed) {
        write(&mut std::io::stderr().lock());
    } else {
        write(&mut std::io::stdout().lock());
    }
}

/// Whether a line for people on stderr would land inside the JSON stream: with `--json`
/// while a pull's data takes stdout, the events go to stderr themselves.
fn json_on_stderr(mode: Mode) -> bool {
    mode == Mode::Json && STDOUT_CARRIES_DATA.load(Ordering::Relaxed)
}

fn emit(event: &Event) {
    let line = serde_json::to_string(event).expect("events serialize");
    outln!("{line}");
}

/// Prints the `start` event.
pub fn start(mode: Mode, operation: &str, host: &str, channels: u16, block_size: u32) {
    if mode == Mode::Json {
        emit(&Event::Start {
            schema: JSON_SCHEMA,
            operation: operation.into(),
            host: host.into(),
            channels,
            block_size,
        });
    }
}

/// The CSV header of a `--trace` file.
const TRACE_HEADER: &str = "t_s,channel,cwnd,ssthresh,rtt_us,min_rtt_us,ca_state,retrans,total_retrans,delivery_rate_bps,pacing_rate_bps,bytes_acked,delivered,busy_us,rwnd_limited_us,sndbuf_limited_us,notsent_bytes,snd_wnd";

/// Writes `--trace` samples as CSV (to a file, a FIFO or a device). A file that already holds
/// a trace is replaced only once the first samples come, so a copy that fails to connect leaves the last run's trace as it
/// was; a file made for this run and never written is removed.
struct TraceWriter {
    path: PathBuf,
    file: BufWriter<File>,
    /// The file did not exist before this run.
    made: bool,
    /// The header (and so the start of this run's trace) is written.
    started: bool,
}

impl TraceWriter {
    /// Opens `path` for writing without truncating it, so that an unwritable path fails at
    /// once, before any data moves.
    fn create(path: &Path) -> anyhow::Result<TraceWriter> {
        let made = std::fs::symlink_metadata(path).is_err();
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .with_context(|| format!("creating trace file {}", path.display()))?;
        Ok(TraceWriter {
            path: path.to_path_buf(),
            file: BufWriter::new(f),
            made,
            started: false,
        })
    }

    fn write(&mut self, samples: &[Sample]) -> std::io::Result<()> {
        if samples.is_empty() {
            return Ok(());
        }
        if !self.started {
            // Only a regular file holds an earlier trace; a FIFO or a device (`/dev/stderr`)
            // cannot be truncated and needs not be.
            if self.file.get_ref().metadata()?.is_file() {
                self.file.get_ref().set_len(0)?;
            }
            writeln!(self.file, "{TRACE_HEADER}")?;
            self.started = true;
        }
        for s in samples {
            let t = &s.tcp;
            writeln!(
                self.file,
                "{:.4},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
                s.t,
                s.channel,
                t.cwnd,
                t.ssthresh,
                t.rtt_us,
                t.min_rtt_us,
                t.ca_state,
                t.retrans,
                t.total_retrans,
                t.delivery_rate * 8,
                t.pacing_rate * 8,
                t.bytes_acked,
                t.delivered,
                t.busy_us,
                t.rwnd_limited_us,
                t.sndbuf_limited_us,
                t.notsent_bytes,
                t.snd_wnd
            )?;
        }
        self.file.flush()
    }
}

impl Drop for TraceWriter {
    fn drop(&mut self) {
        if self.made && !self.started {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The live display, JSON progress events and trace writer of a running transfer.
pub struct Live {
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    /// Shared with the reporting task, so that a transfer dropped midway (Ctrl-C) clears
    /// the bars at once: cleared later, by the runtime's shutdown, they erased the error
    /// printed meanwhile.
    display: Shown,
}

/// The terminal display, while it shows.
type Shown = Arc<std::sync::Mutex<Option<Display>>>;

/// Clears the bars of `shown`, if still there.
fn clear(shown: &Shown) {
    let taken = shown.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(d) = taken {
        d.clear();
    }
}

impl Live {
    /// Starts reporting on `live` every `interval`; `trace` also writes every sample to a CSV
    /// file.
    pub fn start(
        mode: Mode,
        live: Arc<LiveStats>,
        interval: Duration,
        trace: Option<&Path>,
    ) -> anyhow::Result<Live> {
        let mut writer = match trace {
            Some(p) => {
                live.telemetry.enable_trace();
                Some(TraceWriter::create(p)?)
            }
            None => None,
        };
        let (stop, mut stopped) = oneshot::channel();
        let shown: Shown = Arc::new(std::sync::Mutex::new(
            (mode == Mode::Human && std::io::stderr().is_terminal())
                .then(|| Display::new(live.channel_bytes().len())),
        ));
        let display = shown.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.tick().await;
            // The trace is written at least every second, whatever the interval: what waits
            // unwritten is bounded (MAX_TRACE_SAMPLES).
            let mut trace_tick = tokio::time::interval(interval.min(Duration::from_secs(1)));
            trace_tick.tick().await;
            let mut last = (live.elapsed(), live.channel_bytes());
            loop {
                // None: only the trace is due.
                let finished = tokio::select! {
                    _ = tick.tick() => Some(false),
                    _ = &mut stopped => Some(true),
                    _ = trace_tick.tick(), if writer.is_some() => None,
                };
                if let Some(w) = writer.as_mut() {
                    w.write(&live.telemetry.take_trace())
                        .context("writing the trace file")?;
                }
                let Some(finished) = finished else {
                    continue;
                };
                if finished {
                    clear(&display);
                    let dropped = live.telemetry.trace_dropped();
                    if writer.is_some() && dropped > 0 {
                        eprintln!(
                            "hsxfer: warning: the trace left out {dropped} samples: more than {MAX_TRACE_SAMPLES} waited to be written or sent"
                        );
                    }
                    return Ok(());
                }
                let now = (live.elapsed(), live.channel_bytes());
                let dt = (now.0 - last.0).max(1e-3);
                // Channels the tuner added since the last report start from zero.
                let rates: Vec<f64> = now
                    .1
                    .iter()
                    .enumerate()
                    .map(|(i, n)| (n - last.1.get(i).copied().unwrap_or(0)) as f64 * 8.0 / dt)
                    .collect();
                match display.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                    Some(d) => d.update(&live, &rates),
                    None if mode == Mode::Json => progress_events(&live, &now.1, &rates),
                    None => {}
                }
                last = now;
            }
        });
        Ok(Live {
            stop: Some(stop),
            task: Some(task),
            display: shown,
        })
    }

    /// Stops reporting after writing the remaining trace samples.
    pub async fn finish(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.task.take() {
            Some(task) => task.await.context("live display task")?,
            None => Ok(()),
        }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        clear(&self.display);
    }
}

/// The terminal display: a total bar and one line per channel.
struct Display {
    multi: MultiProgress,
    total: ProgressBar,
    channels: Vec<ProgressBar>,
}

impl Display {
    fn new(channels: usize) -> Display {
        let multi = MultiProgress::new();
        let total = multi.add(ProgressBar::new(0));
        total.set_style(
            ProgressStyle::with_template(
                "{bar:40.cyan/blue} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}",
            )
            .expect("valid template"),
        );
        let mut d = Display {
            multi,
            total,
            channels: Vec::new(),
        };
        d.grow(channels);
        d
    }

    /// Adds lines up to `channels` (the tuner adds channels while the transfer runs).
    fn grow(&mut self, channels: usize) {
        let line = ProgressStyle::with_template("  {msg}").expect("valid template");
        while self.channels.len() < channels {
            let b = self.multi.add(ProgressBar::new_spinner());
            b.set_style(line.clone());
            self.channels.push(b);
        }
    }

    fn update(&mut self, live: &LiveStats, rates: &[f64]) {
        self.grow(rates.len());
        self.total.set_length(live.expected());
        self.total.set_position(live.total());
        self.total
            .set_message(format!("files {}", live.files_done()));
        let setups = live.telemetry.setups();
        let latest = live.telemetry.latest();
        for (i, bar) in self.channels.iter().enumerate() {
            bar.set_message(channel_line(
                i,
                rates.get(i).copied().unwrap_or(0.0),
                setups.get(i).cloned().flatten().as_ref(),
                latest.get(i).copied().flatten().as_ref(),
            ));
        }
    }

    fn clear(self) {
        self.total.finish_and_clear();
        for b in self.channels {
            b.finish_and_clear();
        }
    }
}

fn channel_line(
    i: usize,
    rate: f64,
    setup: Option<&ChannelSetup>,
    sample: Option<&Sample>,
) -> String {
    let cc = setup.map_or("-", |s| s.cc.as_str());
    let tcp = sample.map_or(String::new(), |s| {
        format!(
            "cwnd {:>6}  rtt {:>7.2} ms  retrans {:>6}",
            s.tcp.cwnd,
            s.tcp.rtt_us as f64 / 1e3,
            s.tcp.total_retrans
        )
    });
    format!("ch {i:>3} {cc:<9} {:>14}  {tcp}", fmt_rate(rate))
}

/// Emits the `progress` event and one `channel` event per channel.
fn progress_events(live: &LiveStats, bytes: &[u64], rates: &[f64]) {
    for event in Event::progress(live, bytes, rates) {
        emit(&event);
    }
}

/// Prints the final summary (and the limits noted during set-up as warnings). The
/// summary's notes are the warnings' texts, naming flags where the library's name fields.
pub fn summary(mode: Mode, r: &TransferReport) {
    let notes = warnings(mode, &r.tuning.notes);
    match mode {
        Mode::Json => {
            let mut shown = r.clone();
            shown.tuning.notes = notes;
            emit(&Event::summary(&shown))
        }
        Mode::Human => human_summary(r),
    }
}

/// Prints `notes` as warnings (and `warning` events): the set-up's notes, before the summary
/// or, when the transfer failed, before the error. Returns their texts as printed.
pub fn warnings(mode: Mode, notes: &[String]) -> Vec<String> {
    let notes: Vec<String> = notes.iter().map(|n| as_flags(n)).collect();
    for note in &notes {
        if mode == Mode::Json {
            emit(&Event::Warning {
                message: note.clone(),
            });
        }
        if !json_on_stderr(mode) {
            eprintln!("hsxfer: warning: {}", printable(note));
        }
    }
    notes
}

fn human_summary(r: &TransferReport) {
    let check = if r.verified {
        "verified"
    } else {
        "NOT verified"
    };
    let kind = match r.transport {
        Transport::Tcp => "",
        Transport::Mptcp => "MPTCP ",
    };
    outln!(
        "{}: {} in {:.2} s = {} over {} {kind}channels, {} files ({} skipped, {} resumed), {check} (keyed BLAKE3 per block, on arrival and end to end)",
        r.operation,
        fmt_bytes(r.bytes),
        r.seconds,
        fmt_rate(r.goodput_bps),
        r.channels.len(),
        r.files,
        r.files_skipped,
        fmt_bytes(r.bytes_resumed),
    );
    match &r.cipher_suite {
        Some(suite) => outln!("  encrypted: TLS 1.3, {suite}"),
        None => outln!("  NOT encrypted: clear text (--no-encrypt)"),
    }
    let t = &r.tuning;
    outln!(
        "  path: rtt {:.3} ms, rate {} ({}), buffers {}",
        t.rtt_us as f64 / 1e3,
        t.rate_bps.map_or("unknown".into(), |b| fmt_rate(b as f64)),
        t.rate_source,
        t.buffer
    );
    for o in &t.origin {
        outln!("  tuning: {o}");
    }
    if let Some(online) = &t.online {
        for d in &online.decisions {
            outln!("  tuning at {:.2} s: {}", d.t, d.what);
        }
    }
    for c in &r.channels {
        let subflow = match (c.local, c.remote) {
            (Some(l), Some(r)) => format!("  subflow {l} > {r}"),
            _ => String::new(),
        };
        outln!(
            "  channel {:>2}: {:>12} {:>14}  cc {:<9} sndbuf {:>22}  pace {:>13}  start {:>7}  retrans {:>6}  losses {:>4}{subflow}",
            c.index,
            fmt_bytes(c.bytes),
            fmt_rate(c.goodput_bps),
            c.cc.as_deref().unwrap_or("-"),
            c.send_buffer.map_or("-".into(), |b| match c.send_buffer_requested {
                Some(r) => format!("{} (asked {})", fmt_bytes(b), fmt_bytes(r)),
                // What the kernel's autotuning started from; it grows with the window.
                None => format!("auto from {}", fmt_bytes(b)),
            }),
            c.pace_bps.map_or("-".into(), |p| fmt_rate(p as f64)),
            c.started_s.map_or("-".into(), |s| format!("{s:.3} s")),
            c.retransmits.map_or("-".into(), |n| n.to_string()),
            c.loss_events,
        );
    }
    let jain = r.fairness_jain.map_or("-".into(), |j| format!("{j:.3}"));
    let sync = r.loss_sync.as_ref().map_or("no losses seen".into(), |s| {
        format!(
            "global {:.3} over {} congestion events",
            s.global, s.congestion_events
        )
    });
    outln!(
        "  fairness (Jain) {jain}, retransmits {}, loss synchronization {sync}",
        r.retransmits
    );
    if let Some(d) = r.dmctcp {
        outln!(
            "  dmctcp group: {} channels, {} cuts of the largest window, {} losses kept, {} slow-start channels took the first cut's ssthresh",
            d.channels, d.cuts, d.losses_kept, d.slow_start_adopted
        );
    }
    if let Some(g) = r.guard {
        outln!(
            "  window guard: {} garbage ssthresh values replaced ({} from skipped kernel calls), {} windows clamped (bundled congestion controls, sending host)",
            g.ssthresh_repairs, g.skipped_ssthresh, g.cwnd_repairs
        );
    }
}

/// Prints an error: an `error` event with `--json`, and a line on stderr unless the JSON
/// stream is there (a pull to stdout), where the event says it.
pub fn error(mode: Mode, e: &anyhow::Error) {
    let message = as_flags(&one_line(e));
    if mode == Mode::Json {
        emit(&Event::Error {
            message: message.clone(),
        });
    }
    if !json_on_stderr(mode) {
        eprintln!("hsxfer: error: {}", printable(&message));
    }
}

/// The error and its causes on one line. The library's errors already name their cause
/// ("listening on ...: Address already in use"), so a cause whose text is there already is
/// not repeated.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = e.to_string();
    for cause in e.chain().skip(1) {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
    }
    line
}

/// Text a peer may have chosen (an abort message, a note, a file name), made safe for a
/// terminal: control characters are shown escaped, so a hostile server cannot move the
/// cursor, rewrite earlier lines or hide text (the scp CVE-2019-6111 class).
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            c if c.is_control() => c.escape_default().to_string(),
            c => c.to_string(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_names_each_cause_once() {
        let io = std::io::Error::from_raw_os_error(libc::EADDRINUSE);
        let e = anyhow::Error::new(hsxfer::Error::io("listening on 127.0.0.1:7420")(io));
        assert_eq!(
            one_line(&e),
            "listening on 127.0.0.1:7420: Address already in use (os error 98) (another \
             program listens there: stop it or choose another port)"
        );
        let e = anyhow::anyhow!("inner").context("outer");
        assert_eq!(one_line(&e), "outer: inner");
    }

    #[test]
    fn peer_text_cannot_drive_the_terminal() {
        assert_eq!(
            printable("ok\x1b[2K\rdone\n\u{9b}x é"),
            "ok\\u{1b}[2K\\rdone\\n\\u{9b}x é"
        );
    }
}
