//! `hsxfer probe HOST`: measures the path to a server, ranks configurations on it, prints
//! them with the `copy` flags it recommends, and saves the result as the profile later
//! copies and benches to that server use.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use hsxfer::channels::control::Policy;
use hsxfer::probe::{
    probe, Direction, ProbeOptions, ProbeReport, ProbeStep, ProfileError, ProfileStore,
};
use hsxfer::session::ssh::shell_quote;
use hsxfer::DEFAULT_PORT;
use serde_json::json;

use super::output::Mode;
use super::units::{self, fmt_rate};
use super::AuthArgs;
use hsxfer::units::fmt_bytes;

/// Options of `hsxfer probe`.
#[derive(Args)]
pub struct ProbeArgs {
    /// How long the probe may take in all (e.g. 10s, 30s; at most 1h). The candidates share
    /// it by successive halving: a longer budget measures the leading ones again before the
    /// pick (trials keep their length, and the pick ends the probe early). Default: 10s, or
    /// the least the path's RTT needs for a first trial and two more where that is more
    /// (about 19s at 240 ms).
    #[arg(long, value_name = "DURATION", value_parser = units::parse_duration)]
    budget: Option<Duration>,
    /// Which way the copies to tune move data: push (client sends) or pull (server sends).
    #[arg(long, value_name = "push|pull", default_value = "push", value_parser = parse_direction)]
    direction: Direction,
    /// Which congestion controls may be recommended: fair (loss-based only) or fast (may be
    /// BBR).
    #[arg(long, value_name = "fair|fast", default_value = "fair", value_parser = super::parse_policy)]
    policy: Policy,
    /// Server port.
    #[arg(long, default_value_t = DEFAULT_PORT)]
    port: u16,
    /// Try the configurations over one Multipath TCP connection whose subflows are the
    /// channels (as `copy --mptcp`; at most 9 subflows), and recommend `--mptcp`.
    #[arg(long)]
    mptcp: bool,
    /// Print one JSON object (schema: docs/json.md) instead of human output.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    auth: AuthArgs,
    #[command(flatten)]
    security: super::SecurityArgs,
    /// The server (name, IPv4 address or [IPv6]).
    host: String,
}

impl ProbeArgs {
    /// How to report, errors included.
    pub fn mode(&self) -> Mode {
        if self.json {
            Mode::Json
        } else {
            Mode::Human
        }
    }
}

fn parse_direction(s: &str) -> Result<Direction, String> {
    match s {
        "push" => Ok(Direction::Push),
        "pull" => Ok(Direction::Pull),
        _ => Err("use push or pull".into()),
    }
}

/// Runs `hsxfer probe`.
pub async fn run(a: ProbeArgs) -> anyhow::Result<bool> {
    let host = a.host.trim_start_matches('[').trim_end_matches(']');
    let mode = a.mode();
    let show = |step: &ProbeStep| {
        if mode == Mode::Human {
            match step {
                ProbeStep::Facts { rtt, budget } => {
                    eprintln!(
                        "probe: rtt {:.2} ms, measuring the path (within {:.1} s) …",
                        rtt.as_secs_f64() * 1e3,
                        budget.as_secs_f64()
                    )
                }
                ProbeStep::Path {
                    rate_bps,
                    random_loss,
                    plateau,
                } => eprintln!(
                    "probe: bottleneck {}, trying configurations …",
                    bottleneck(*rate_bps, *random_loss, *plateau)
                ),
                ProbeStep::Trial {
                    config,
                    goodput_bps,
                } => eprintln!(
                    "probe:   {} × {} {}: {}",
                    config.channels,
                    config.cc,
                    if config.paced { "paced" } else { "unpaced" },
                    fmt_rate(*goodput_bps)
                ),
            }
        }
    };
    let report = probe(
        host,
        &ProbeOptions {
            port: a.port,
            auth: a.auth.auth()?,
            security: a.security.security()?,
            budget: a.budget,
            direction: a.direction,
            policy: a.policy,
            mptcp: a.mptcp,
        },
        &show,
    )
    .await?;
    // The profile this one replaces, if it is unreadable, is said so (as a copy would).
    if let Some(store) = ProfileStore::for_user() {
        if let Err(e @ ProfileError::Corrupt { .. }) = store.load(host, a.port, a.direction) {
            eprintln!("hsxfer: warning: {e}");
        }
    }
    let saved = match report.save_profile(host, a.port) {
        Some(Ok(p)) => Saved::At(p),
        Some(Err(e)) => {
            eprintln!("hsxfer: warning: {e}");
            Saved::Failed
        }
        None => Saved::NoCache,
    };
    let connection = super::connection_flags(a.port, &a.auth, &a.security);
    print_probe(mode, host, &report, &saved, &connection);
    Ok(true)
}

/// Where a probe's profile went.
pub enum Saved {
    /// Saved in this file.
    At(PathBuf),
    /// Not saved: no cache directory (neither `XDG_CACHE_HOME` nor `HOME`).
    NoCache,
    /// Not saved: writing it failed (a warning said why).
    Failed,
}

/// Prints a probe's result: a table for people, or the `probe` JSON object. `connection`
/// holds the options that reached the server, for the recommended command.
pub fn print_probe(mode: Mode, host: &str, r: &ProbeReport, saved: &Saved, connection: &[String]) {
    match mode {
        Mode::Json => {
            let mut v = serde_json::to_value(r).expect("probe report serializes");
            v["type"] = json!("probe");
            v["profile"] = json!(match saved {
                Saved::At(p) => Some(p.display().to_string()),
                Saved::NoCache | Saved::Failed => None,
            });
            outln!("{v}");
        }
        Mode::Human => human(host, r, saved, connection),
    }
}

/// The `copy` command a probe recommends: its flags, the options that reached the server,
/// and the server as a copy's `HOST:DST` names it (an IPv6 address in brackets).
fn recommended(host: &str, flags: &str, connection: &[String]) -> String {
    let host = match host.contains(':') {
        true => format!("[{host}]"),
        false => host.to_string(),
    };
    let connection: Vec<String> = connection.iter().map(|w| shell_quote(w)).collect();
    let mut words = vec!["hsxfer copy".to_string(), flags.to_string()];
    words.extend(connection);
    words.push(format!("SRC... {host}:DST"));
    words.retain(|w| !w.is_empty());
    words.join(" ")
}

/// The bottleneck rate as measured. Through random loss the first trial's channels were held
/// below the path's rate, and a meter that stopped growing without a loss found only what
/// the path carried: in both, what they reached is only a floor.
fn bottleneck(rate_bps: Option<u64>, random_loss: bool, plateau: bool) -> String {
    match rate_bps {
        None => "not reached".into(),
        Some(b) if random_loss => format!(
            "at least {} (random loss held the channels back)",
            fmt_rate(b as f64)
        ),
        Some(b) if plateau => format!(
            "at least {} (the channels stopped growing there without a loss)",
            fmt_rate(b as f64)
        ),
        Some(b) => fmt_rate(b as f64),
    }
}

/// The bottleneck's queue, as far as the meter filled it.
fn queue(packets: Option<f64>, floor: bool) -> String {
    match packets {
        None => "unknown".into(),
        Some(q) if floor => format!("at least ~{q:.0} packets"),
        Some(q) => format!("~{q:.0} packets"),
    }
}

/// The first trial's losses, and whether they look random or came from the queue.
fn loss(share: f64, random: bool) -> String {
    let pct = share * 100.0;
    match (share > 0.0, random) {
        (false, true) => "a random loss ended the meter (it came alone)".into(),
        (false, false) => "no loss".into(),
        (true, true) => format!("random loss {pct:.3} %"),
        (true, false) => format!("loss {pct:.3} % (at the queue, not random)"),
    }
}

fn human(host: &str, r: &ProbeReport, saved: &Saved, connection: &[String]) {
    outln!(
        "path to {host} ({}): rtt {:.2} ms, bottleneck {}, queue {}, {}, up to {} in flight per socket",
        r.direction.as_str(),
        r.rtt_ms,
        bottleneck(r.rate_bps, r.loss_is_random, r.rate_is_floor),
        queue(r.queue_packets, r.queue_is_floor),
        loss(r.loss, r.loss_is_random),
        fmt_bytes(r.window_max),
    );
    outln!(
        "  {:>4}  {:<10} {:>8}  {:<8} {:>14} {:>9} {:>10} {:>6}",
        "rank",
        "cc",
        "channels",
        "pacing",
        "goodput",
        "retrans",
        "confidence",
        "trials"
    );
    for (i, c) in r.candidates.iter().enumerate() {
        outln!(
            "  {:>4}  {:<10} {:>8}  {:<8} {:>14} {:>8.3}% {:>10.2} {:>6}",
            i + 1,
            c.config.cc,
            c.config.channels,
            if c.config.paced { "paced" } else { "unpaced" },
            fmt_rate(c.goodput_bps),
            c.retransmit_rate * 100.0,
            c.confidence,
            c.trials
        );
    }
    outln!("recommended: {}", recommended(host, &r.flags, connection));
    match saved {
        Saved::At(p) => outln!(
            "saved as the profile of {host} ({}) in {}: copies and benches there use it unless told otherwise (--tune off)",
            r.direction.as_str(),
            shown(p)
        ),
        Saved::NoCache => outln!("not saved: no cache directory (set HOME or XDG_CACHE_HOME)"),
        Saved::Failed => outln!("not saved: the profile could not be written (the warning above says why)"),
    }
    outln!("probe took {:.1} s", r.seconds);
}

fn shown(p: &Path) -> String {
    p.display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_the_meter_did_not_fill_reads_as_a_floor() {
        assert_eq!(queue(None, false), "unknown");
        assert_eq!(queue(Some(70.4), false), "~70 packets");
        assert_eq!(queue(Some(320.0), true), "at least ~320 packets");
    }

    #[test]
    fn losses_say_whether_they_look_random() {
        assert_eq!(loss(0.0, false), "no loss");
        assert!(loss(0.0, true).contains("random loss ended the meter"));
        assert_eq!(loss(0.001, true), "random loss 0.100 %");
        assert_eq!(
            loss(0.00076, false),
            "loss 0.076 % (at the queue, not random)"
        );
    }

    #[test]
    fn the_recommended_copy_reaches_the_server_the_probe_did() {
        let conn = vec![
            "--port".to_string(),
            "7621".to_string(),
            "--token-file".to_string(),
            "/etc/my token".to_string(),
        ];
        assert_eq!(
            recommended("::1", "-n 8 --cc cubic", &conn),
            "hsxfer copy -n 8 --cc cubic --port 7621 --token-file '/etc/my token' SRC... [::1]:DST"
        );
        assert_eq!(
            recommended("dtn1", "-n 4", &[]),
            "hsxfer copy -n 4 SRC... dtn1:DST"
        );
    }

    #[test]
    fn a_rate_the_path_only_carried_reads_as_a_floor() {
        assert_eq!(bottleneck(None, false, false), "not reached");
        let measured = bottleneck(Some(956_000_000), false, false);
        assert!(!measured.contains("at least"), "{measured}");
        let plateau = bottleneck(Some(948_000_000), false, true);
        assert!(
            plateau.starts_with("at least") && plateau.contains("without a loss"),
            "{plateau}"
        );
        let lossy = bottleneck(Some(948_000_000), true, true);
        assert!(lossy.contains("random loss"), "{lossy}");
    }
}
