//! `hsxfer doctor`: runs the host checks of [`hsxfer::tuning::doctor`] and prints them for
//! people, or as one JSON document with `--json` (schema in docs/json.md).

use super::flags::as_flags;
use std::net::{IpAddr, ToSocketAddrs};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use hsxfer::tuning::doctor::{DoctorOptions, Finding, Status};
use serde_json::json;

use super::output::Mode;
use super::units;

/// Version of the `doctor` JSON document, kept apart from the transfer events' schema so that
/// neither changes the other's; bumped on incompatible changes.
const DOCTOR_SCHEMA: u32 = 1;

/// Options of `hsxfer doctor`.
#[derive(Args)]
pub struct DoctorArgs {
    /// Bottleneck rate of the path to check the socket buffers against, bits/s (e.g. 1G).
    #[arg(long, value_name = "RATE", value_parser = units::parse_rate, requires = "rtt")]
    rate: Option<u64>,
    /// Round-trip time of that path (e.g. 100ms).
    #[arg(long, value_name = "DURATION", value_parser = units::parse_duration, requires = "rate")]
    rtt: Option<Duration>,
    /// Number of parallel data channels the transfer would use.
    #[arg(short = 'n', long = "channels", default_value_t = hsxfer::tuning::defaults::CHANNELS,
          value_parser = clap::value_parser!(u16).range(1..))]
    channels: u16,
    /// Print one JSON document (schema: docs/json.md) instead of human output.
    #[arg(long)]
    json: bool,
    /// The peer (name, IPv4 or IPv6 address): check the interface traffic to it leaves by
    /// (default: the default route's). Nothing is sent to it.
    host: Option<String>,
}

impl DoctorArgs {
    /// How to report, errors included.
    pub fn mode(&self) -> Mode {
        if self.json {
            Mode::Json
        } else {
            Mode::Human
        }
    }
}

/// Runs the checks and prints the findings; `Ok(false)` (exit code 1) when any check failed.
pub fn doctor(a: DoctorArgs) -> anyhow::Result<bool> {
    let host = a.host.as_deref().map(resolve).transpose()?;
    let findings = hsxfer::tuning::doctor::run(&DoctorOptions {
        rate_bps: a.rate,
        rtt: a.rtt,
        channels: a.channels,
        host,
    });
    match a.mode() {
        Mode::Json => {
            // Flags, as the text output names them, not the library's fields.
            let shown: Vec<Finding> = findings
                .iter()
                .map(|f| Finding {
                    summary: as_flags(&f.summary),
                    detail: f.detail.as_deref().map(as_flags),
                    ..f.clone()
                })
                .collect();
            outln!(
                "{}",
                json!({"type": "doctor", "schema": DOCTOR_SCHEMA, "findings": shown})
            )
        }
        Mode::Human => print_human(&findings),
    }
    Ok(!findings.iter().any(|f| f.status == Status::Fail))
}

/// The address of `host`: an IP address as given (IPv6 optionally in brackets), or the first
/// address the system resolver returns for a name.
fn resolve(host: &str) -> anyhow::Result<IpAddr> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse() {
        return Ok(ip);
    }
    (bare, 0)
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve host '{host}'"))?
        .next()
        .map(|a| a.ip())
        .with_context(|| format!("cannot resolve host '{host}': no addresses"))
}

fn tag(s: Status) -> &'static str {
    match s {
        Status::Ok => "OK",
        Status::Warn => "WARN",
        Status::Fail => "FAIL",
        Status::Info => "INFO",
    }
}

/// Indentation of a finding's detail and fix lines, under its summary.
const INDENT: &str = "     ";
/// Width details are wrapped to; fix lines are never wrapped, so they paste whole.
const WIDTH: usize = 100;

fn print_human(findings: &[Finding]) {
    for f in findings {
        outln!("{:<4} {}: {}", tag(f.status), f.check, as_flags(&f.summary));
        if let Some(d) = &f.detail {
            print_wrapped(&as_flags(d));
        }
        for fix in &f.fix {
            outln!("{INDENT}fix: {fix}");
        }
    }
    let count = |s: Status| findings.iter().filter(|f| f.status == s).count();
    outln!(
        "{} checks: {} ok, {} warn, {} fail, {} info",
        findings.len(),
        count(Status::Ok),
        count(Status::Warn),
        count(Status::Fail),
        count(Status::Info),
    );
}

/// Prints `text` indented, wrapped at word boundaries to [`WIDTH`] columns.
fn print_wrapped(text: &str) {
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && INDENT.len() + line.len() + 1 + word.len() > WIDTH {
            outln!("{INDENT}{line}");
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        outln!("{INDENT}{line}");
    }
}
