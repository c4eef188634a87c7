//! What the command prints: a live progress display on a terminal, NDJSON events with
//! `--json` (schema in docs/json.md), and a human summary otherwise.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::Duration;

use hsxfer::{LiveStats, TransferReport};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use super::units::{fmt_bytes, fmt_rate};

/// Version of the NDJSON schema; bumped on incompatible changes.
pub const JSON_SCHEMA: u32 = 1;

/// How to report.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// NDJSON events on stdout.
    Json,
    /// Progress bar (terminal only) and a human summary.
    Human,
}

fn emit(v: serde_json::Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

/// Prints the `start` event.
pub fn start(mode: Mode, operation: &str, host: &str, channels: u16, block_size: u32) {
    if mode == Mode::Json {
        emit(
            json!({"type": "start", "schema": JSON_SCHEMA, "operation": operation,
            "host": host, "channels": channels, "block_size": block_size}),
        );
    }
}

/// Runs the live display until the returned handle is stopped.
pub fn spawn_live(mode: Mode, live: Arc<LiveStats>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let bar = (mode == Mode::Human && std::io::stderr().is_terminal()).then(|| {
            let b = ProgressBar::new(0);
            b.set_style(
                ProgressStyle::with_template(
                    "{bar:40.cyan/blue} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}",
                )
                .expect("valid template"),
            );
            b
        });
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        let mut last = live.channel_bytes();
        loop {
            tick.tick().await;
            let now = live.channel_bytes();
            let rates: Vec<f64> = now
                .iter()
                .zip(&last)
                .map(|(n, l)| (n - l) as f64 * 8.0)
                .collect();
            match &bar {
                Some(b) => {
                    b.set_length(live.expected());
                    b.set_position(live.total());
                    let per: Vec<String> = rates.iter().map(|r| fmt_rate(*r)).collect();
                    b.set_message(format!("files {} | {}", live.files_done(), per.join(" ")));
                }
                None if mode == Mode::Json => emit(json!({
                    "type": "progress",
                    "seconds": live.elapsed(),
                    "bytes": live.total(),
                    "expected_bytes": live.expected(),
                    "files_done": live.files_done(),
                    "goodput_bps": rates.iter().sum::<f64>(),
                    "channels": now.iter().zip(&rates).enumerate().map(|(i, (b, r))|
                        json!({"index": i, "bytes": b, "goodput_bps": r})).collect::<Vec<_>>(),
                })),
                None => {}
            }
            last = now;
        }
    })
}

/// Prints the final summary.
pub fn summary(mode: Mode, r: &TransferReport) {
    match mode {
        Mode::Json => {
            let mut v = serde_json::to_value(r).expect("report serializes");
            v["type"] = json!("summary");
            v["schema"] = json!(JSON_SCHEMA);
            emit(v);
        }
        Mode::Human => {
            let check = if r.verified {
                "verified"
            } else {
                "NOT verified"
            };
            println!(
                "{}: {} in {:.2} s = {} over {} channels, {} files ({} skipped, {} resumed), {check} (keyed BLAKE3 per block, on arrival and end to end)",
                r.operation,
                fmt_bytes(r.bytes),
                r.seconds,
                fmt_rate(r.goodput_bps),
                r.channels.len(),
                r.files,
                r.files_skipped,
                fmt_bytes(r.bytes_resumed),
            );
            for c in &r.channels {
                println!(
                    "  channel {:>2}: {:>12}  {:>14}",
                    c.index,
                    fmt_bytes(c.bytes),
                    fmt_rate(c.goodput_bps)
                );
            }
        }
    }
}

/// Prints an error: an `error` event with `--json`, and always a line on stderr.
pub fn error(mode: Mode, e: &anyhow::Error) {
    if mode == Mode::Json {
        emit(json!({"type": "error", "message": format!("{e:#}")}));
    }
    eprintln!("hsxfer: error: {e:#}");
}
