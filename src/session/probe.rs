//! `hsxfer probe`: measures a path with short memory-to-memory transfers through a server and
//! ranks configurations on it within a time budget (what to try and how to rank:
//! [`crate::tuning::probe`]).
//!
//! 1. The server's facts (buffer limits, congestion controls) and the RTT, on a control
//!    connection of their own.
//! 2. A transfer tuned online: its meter gives the bottleneck rate; its samples the RTT
//!    without queueing, the queue (the RTT's inflation while the meter overfilled it) and
//!    random loss (a loss that ended the meter alone, or retransmissions while paced below
//!    the rate).
//! 3. The candidates share the rest of the budget by successive halving.
//!
//! Every trial is a `bench` session, so it measures exactly what a copy would do (framing,
//! integrity checks and all); goodput is taken from the sending sockets' `TCP_INFO` over the
//! second half of each trial, after the ramp-up. A trial ends at its time: what its sockets
//! still hold is dropped (`Message::TimeUp`), not delivered first.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::boxed::boxed;
use super::client::{BenchAmount, Client, PathRate, TransferOptions, Tune};
use super::report::{LiveStats, TransferReport};
use super::secure::Security;
use super::tuning::host_facts;
use super::Auth;
use crate::channels::control::{BenchDirection, HostFacts, Policy};
use crate::channels::telemetry::{MeterEnd, TunerReport};
use crate::error::{Error, Result};
use crate::fsio::profiles::{ProfileError, ProfileStore};
use crate::transport::mptcp::MAX_EXTRA_SUBFLOWS;
use crate::transport::Transport;
use crate::tuning::bdp::WIRE_OVERHEAD;
use crate::tuning::defaults;
use crate::tuning::desync::{PaceChoice, StaggerChoice};
use crate::tuning::probe::budget::{first_trial_time, trial_times};
pub use crate::tuning::probe::budget::{min_budget, DEFAULT_BUDGET};
use crate::tuning::probe::measure::{
    loaded_srtt, meter_losses, path_rate, peak, steady, Loaded, Steady,
};
use crate::tuning::probe::{
    candidates, loss_based, rank, Config, Direction, PathFacts, PathProfile, Ranked,
    Recommendation, Trial,
};

/// Channels of the first trial (the meter runs on the first of them).
const FIRST_TRIAL_CHANNELS: u16 = 4;

/// How a probe runs.
#[derive(Debug, Clone)]
pub struct ProbeOptions {
    /// Server port.
    pub port: u16,
    /// Authentication.
    pub auth: Auth,
    /// TLS or clear text, and which server keys are accepted.
    pub security: Security,
    /// How long the whole probe may take; `None` for [`DEFAULT_BUDGET`], or the least the
    /// path's RTT needs ([`min_budget`]) where that is more.
    pub budget: Option<Duration>,
    /// Which way data flows in the copies to tune.
    pub direction: Direction,
    /// Which congestion controls may be recommended.
    pub policy: Policy,
    /// Run the trials over one MPTCP connection whose subflows are the channels (see
    /// [`TransferOptions::mptcp`]); channel counts above what the kernel's path manager
    /// gives one connection are not tried.
    pub mptcp: bool,
}

/// A step of a running probe, for progress displays.
#[derive(Debug, Clone)]
pub enum ProbeStep {
    /// The server answered; the RTT is measured.
    Facts {
        /// Round-trip time.
        rtt: Duration,
        /// How long the whole probe may take.
        budget: Duration,
    },
    /// The first trial measured the path.
    Path {
        /// Bottleneck goodput rate, bits/s, when measured.
        rate_bps: Option<u64>,
        /// Whether the first trial lost segments while paced below that rate: the rate is
        /// then what its channels reached, and the path's may be higher.
        random_loss: bool,
        /// Whether the first trial's meter stopped growing there without a loss: the rate is
        /// what the path carried, and it may carry more.
        plateau: bool,
    },
    /// A trial finished.
    Trial {
        /// What ran.
        config: Config,
        /// Its steady goodput, bits/s.
        goodput_bps: f64,
    },
}

/// What a probe found.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeReport {
    /// Which way data flowed.
    pub direction: Direction,
    /// Round-trip time without queueing, ms.
    pub rtt_ms: f64,
    /// Bottleneck goodput rate, bits/s; `None` when no trial could fill the path.
    pub rate_bps: Option<u64>,
    /// Whether `rate_bps` is only what the path carried, and it may carry more: the first
    /// trial's meter stopped growing without a loss, or random loss held its channels back.
    pub rate_is_floor: bool,
    /// Bottleneck queue, packets: the RTT's inflation while the first trial's meter
    /// overfilled the queue (`loaded_srtt`) times the rate (a busy end host adds its own
    /// delay to it); `None` when the meter measured no rate, or a random loss ended it.
    pub queue_packets: Option<f64>,
    /// Whether `queue_packets` is only a floor: no loss showed the queue full before the
    /// meter stopped (a meter that stopped growing, or a deep queue).
    pub queue_is_floor: bool,
    /// Share of segments the first trial retransmitted once it ran paced at the rate.
    pub loss: f64,
    /// Whether the losses look random (spread out, not a queue's overflow): the loss that
    /// ended the meter came alone, or those above were more than one in ten thousand and,
    /// for loss-based channels, enough to explain what they moved ([`PathFacts::lossy`]).
    pub loss_is_random: bool,
    /// Bytes one socket can keep in flight in this direction, as the hosts' limits allow.
    pub window_max: u64,
    /// The server's facts.
    pub server: HostFacts,
    /// What to use.
    pub recommendation: Recommendation,
    /// The `copy` flags that give it.
    pub flags: String,
    /// Every configuration tried, best first.
    pub candidates: Vec<Ranked>,
    /// How long the probe took, seconds.
    pub seconds: f64,
}

impl ProbeReport {
    /// Saves the profile for `server:port` in the user's store ([`ProfileStore::for_user`]);
    /// `None` when the user has no store (no home directory).
    pub fn save_profile(
        &self,
        server: &str,
        port: u16,
    ) -> Option<std::result::Result<PathBuf, ProfileError>> {
        ProfileStore::for_user().map(|store| store.save(&self.profile(server, port)))
    }

    /// The profile to save for `server:port`.
    pub fn profile(&self, server: &str, port: u16) -> PathProfile {
        PathProfile {
            server: server.to_string(),
            port,
            direction: self.direction,
            measured_at: unix_now(),
            source: "probe".into(),
            rtt_us: (self.rtt_ms * 1e3) as u64,
            rate_bps: self.rate_bps,
            queue_packets: self.queue_packets,
            loss: self.loss,
            recommendation: self.recommendation.clone(),
        }
    }
}

/// Profiles older than this are not used: paths change.
pub const PROFILE_MAX_AGE_S: u64 = 7 * 86_400;

/// Settings the caller gave explicitly: a profile leaves them alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fixed {
    /// The channel count (`-n`).
    pub channels: bool,
    /// The congestion control (`--cc`).
    pub cc: bool,
    /// The pacing (`--pace`).
    pub pace: bool,
    /// The bottleneck rate (`--rate`).
    pub rate: bool,
}

/// Fills in from a saved profile what the caller did not fix: channel count, congestion
/// control, and pacing at the measured rate (or none, when the profile found unpaced
/// channels faster). Returns what it did, for the report. A profile keeps no policy (a
/// `--policy fast` probe or copy may have saved BBR): under [`Policy::Fair`] a congestion
/// control that does not back off on loss is left out, and the transfer's own choice holds.
pub fn apply_profile(
    p: &PathProfile,
    opts: &mut TransferOptions,
    fixed: Fixed,
    now_s: u64,
) -> String {
    let r = &p.recommendation;
    let mut took = Vec::new();
    if !fixed.channels {
        opts.channels = r.channels;
        opts.max_channels = opts.max_channels.max(r.channels);
        took.push(format!("{} channels", r.channels));
    }
    if !fixed.cc {
        if opts.policy == Policy::Fair && !loss_based(&r.cc) {
            took.push(format!("not {} (policy fair)", r.cc));
        } else {
            opts.cc = vec![r.cc.clone()];
            took.push(r.cc.clone());
        }
    }
    if !fixed.pace && !fixed.rate {
        match (r.pace_bps, p.rate_bps) {
            (Some(pace), Some(rate)) => {
                opts.rate = PathRate::Saved(rate);
                took.push(format!("paced at {:.1} Mbit/s in total", pace as f64 / 1e6));
            }
            _ => {
                opts.pace = PaceChoice::Off;
                took.push("unpaced".into());
            }
        }
    }
    format!(
        "profile ({}): {}",
        p.age(now_s),
        if took.is_empty() {
            "nothing (every setting was given)".into()
        } else {
            took.join(", ")
        }
    )
}

/// What a finished transfer teaches about its path, to save as a profile: only when it ran
/// long enough (10 s) to be worth keeping and its tuner measured the rate itself (a profile's
/// rate lowered by losses on a busy host is not a measurement).
pub fn learned_profile(
    report: &TransferReport,
    server: &str,
    port: u16,
    direction: Direction,
) -> Option<PathProfile> {
    let tuner = report.tuning.online.as_ref()?;
    let rate = tuner.measured_bps?;
    if report.seconds < 10.0 {
        return None;
    }
    let cc = report.channels.iter().find_map(|c| c.cc.clone())?;
    let paced = report.channels.iter().any(|c| c.pace_bps.is_some());
    let config = Config {
        cc,
        // The tuner counts an MPTCP connection as one channel; its subflows carried the data.
        channels: match report.transport {
            Transport::Mptcp => report.subflows.unwrap_or(1).max(1),
            Transport::Tcp => tuner.channels,
        },
        paced,
    };
    Some(PathProfile {
        server: server.to_string(),
        port,
        direction,
        measured_at: unix_now(),
        source: "copy".into(),
        rtt_us: report.tuning.rtt_us,
        rate_bps: Some(rate),
        queue_packets: None,
        loss: 0.0,
        recommendation: Recommendation::of(&config, Some(rate as f64 / 8.0)),
    })
}

pub use crate::fsio::profiles::unix_now;

/// The budget of a probe on a path of round-trip time `rtt`: the one given, unless it is
/// shorter than [`min_budget`]; else [`DEFAULT_BUDGET`], or the least the path needs where
/// that is more (a fixed 10 s refused every path over about 127 ms). [`check_budget`] has
/// refused, before connecting, what no path makes right.
fn budget_for(given: Option<Duration>, rtt: Duration) -> Result<Duration> {
    let need = min_budget(rtt);
    match given {
        Some(given) if given < need => Err(Error::Usage(format!(
            "a probe budget of {:.1} s is too short for a path of {:.1} ms RTT: give a `budget` of {}s or more",
            given.as_secs_f64(),
            rtt.as_secs_f64() * 1e3,
            need.as_secs_f64().ceil()
        ))),
        Some(given) => Ok(given),
        None => Ok(DEFAULT_BUDGET.max(need)),
    }
}

/// The longest budget a probe takes (a day): its trials keep their length, and the pick
/// ends it long before.
pub const MAX_BUDGET: Duration = Duration::from_secs(86_400);

/// Refuses a budget that no path could make right: more than [`MAX_BUDGET`], or less than
/// the least a probe takes on a path of no delay. Checked before connecting, so that a
/// probe that cannot run records nothing (a first contact would record the server's key).
fn check_budget(given: Option<Duration>) -> Result<()> {
    let least = min_budget(Duration::ZERO);
    match given {
        Some(g) if g > MAX_BUDGET => Err(Error::Usage(format!(
            "a probe budget of {:.0} s is more than a probe may take: give a `budget` of at most {} s",
            g.as_secs_f64(),
            MAX_BUDGET.as_secs()
        ))),
        Some(g) if g < least => Err(Error::Usage(format!(
            "a probe budget of {:.1} s is too short for any path: give a `budget` of {}s or more",
            g.as_secs_f64(),
            least.as_secs_f64().ceil()
        ))),
        _ => Ok(()),
    }
}

/// Measures the path to `host` and ranks configurations on it.
pub fn probe<'a>(
    host: &'a str,
    opts: &'a ProbeOptions,
    progress: &'a (dyn Fn(&ProbeStep) + Send + Sync),
) -> impl Future<Output = Result<ProbeReport>> + Send + 'a {
    boxed(measure_and_rank(host, opts, progress))
}

async fn measure_and_rank(
    host: &str,
    opts: &ProbeOptions,
    progress: &(dyn Fn(&ProbeStep) + Send + Sync),
) -> Result<ProbeReport> {
    let start = Instant::now();
    check_budget(opts.budget)?;
    let base = TransferOptions {
        port: opts.port,
        auth: opts.auth.clone(),
        security: opts.security.clone(),
        policy: opts.policy,
        mptcp: opts.mptcp,
        ..Default::default()
    };
    let (server, rtt) = Client::new(host, base.clone()).server_facts().await?;
    let budget = budget_for(opts.budget, rtt)?;
    progress(&ProbeStep::Facts { rtt, budget });
    let local = host_facts()?;
    let (sender, receiver) = match opts.direction {
        Direction::Push => (&local, &server),
        Direction::Pull => (&server, &local),
    };
    let window_max = sender.send_buffer_max.min(receiver.receive_buffer_max) / 2;
    let deadline = start + budget;
    let runner = Runner {
        host: host.to_string(),
        base: TransferOptions {
            rtt: Some(rtt),
            block_size: defaults::TIMED_BENCH_BLOCK,
            ..base
        },
        direction: opts.direction,
    };

    // The first trial: tuned online, it measures the path.
    let first_secs = first_trial_time(rtt.as_secs_f64());
    let first = runner
        .run(
            &TransferOptions {
                channels: FIRST_TRIAL_CHANNELS,
                max_channels: FIRST_TRIAL_CHANNELS,
                ..runner.base.clone()
            },
            first_secs,
        )
        .await?;
    let tuner = first.tuner.clone().unwrap_or_default();
    let (rate, plateau) = match path_rate(&tuner) {
        Some((r, floor)) => (Some(r), floor),
        None => (None, false),
    };
    let mss = first.mss;
    let window_limited = tuner.meter == Some(MeterEnd::WindowLimited);
    let mut path = PathFacts {
        window_limited,
        rtt: first.min_rtt.unwrap_or(rtt.as_secs_f64()),
        rate,
        reached: first.steady.goodput.max(first.peak),
        // A meter that stopped before the queue overflowed saw part of it: a floor.
        queue_packets: rate.map(|r| {
            (first.loaded.rtt - first.min_rtt.unwrap_or(0.0)).max(0.0) * r
                / (mss + WIRE_OVERHEAD) as f64
        }),
        queue_is_floor: !first.loaded.overflowed,
        loss: if rate.is_some() {
            first.steady.retransmit_rate
        } else {
            0.0
        },
        loss_based_goodput: first
            .cc
            .as_deref()
            .filter(|cc| loss_based(cc))
            .map(|_| (first.steady.goodput, FIRST_TRIAL_CHANNELS)),
        meter_losses: first.meter_losses,
        window_max,
        mss,
    };
    let random_loss = path.lossy();
    if random_loss {
        // A random loss ended the meter before the queue filled (on 1 Gbit/s × 60 ms with a
        // 4,954-packet queue and 0.1 % loss it read 3-5 packets).
        path.queue_packets = None;
    }
    progress(&ProbeStep::Path {
        rate_bps: rate.map(|r| (r * 8.0) as u64),
        random_loss,
        plateau,
    });
    let usable = |cc: &str| sender.usable(cc);
    let mut pool = candidates(&path, &usable, &sender.cc_default, opts.policy);
    if opts.mptcp {
        pool.retain(|c| c.channels <= MAX_EXTRA_SUBFLOWS + 1);
    }
    let preference = pool.clone();
    let mut trials: Vec<Trial> = Vec::new();
    // The first trial counts for its configuration: paced when the meter found the rate;
    // otherwise its channels ran without caps.
    if let Some(cc) = first.cc.clone() {
        let config = Config {
            cc,
            channels: FIRST_TRIAL_CHANNELS,
            paced: rate.is_some(),
        };
        trials.push(Trial {
            config,
            goodput: first.steady.goodput,
            retransmit_rate: first.steady.retransmit_rate,
        });
    }

    // Successive halving over the rest of the budget. A trial is taken to cost the least a
    // session can, until one has been timed, then the most any took: its set-up and end
    // grow with the RTT.
    let (secs, setup) = trial_times(path.rtt);
    let mut cost = Duration::from_secs_f64(secs + setup);
    let mut first_round = true;
    'rounds: while !pool.is_empty() {
        for config in pool.clone() {
            // The first round runs what has not run yet: the first trial already counts for
            // its configuration, and a short budget is better spent on another.
            if first_round && trials.iter().any(|t| t.config == config) {
                continue;
            }
            if Instant::now() + cost > deadline {
                break 'rounds;
            }
            let began = Instant::now();
            let t = runner.trial(&config, rate, secs).await?;
            cost = cost.max(began.elapsed());
            progress(&ProbeStep::Trial {
                config: config.clone(),
                goodput_bps: t.goodput * 8.0,
            });
            trials.push(t);
        }
        first_round = false;
        let ranked = rank(&trials, &preference);
        let keep = pool.len().div_ceil(2);
        pool = ranked
            .iter()
            .map(|r| r.config.clone())
            .filter(|c| pool.contains(c))
            .take(keep)
            .collect();
        if pool.len() == 1 && trials.iter().filter(|t| t.config == pool[0]).count() >= 2 {
            break;
        }
    }
    let ranked = rank(&trials, &preference);
    let best = ranked.first().ok_or_else(|| {
        Error::Usage("the probe's budget ran out before any configuration could be tried".into())
    })?;
    let recommendation = Recommendation::of(&best.config, rate);
    Ok(ProbeReport {
        direction: opts.direction,
        rtt_ms: path.rtt * 1e3,
        rate_bps: rate.map(|r| (r * 8.0) as u64),
        rate_is_floor: rate.is_some() && (plateau || random_loss),
        queue_packets: path.queue_packets,
        queue_is_floor: path.queue_packets.is_some() && path.queue_is_floor,
        loss: path.loss,
        loss_is_random: random_loss,
        window_max,
        server,
        flags: match opts.mptcp {
            true => format!("--mptcp {}", recommendation.flags(mss)),
            false => recommendation.flags(mss),
        },
        recommendation,
        candidates: ranked,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Runs trials: bench sessions toward one server in one direction.
struct Runner {
    host: String,
    base: TransferOptions,
    direction: Direction,
}

/// What one trial measured.
#[derive(Debug, Clone, Default)]
struct Measured {
    steady: Steady,
    peak: f64,
    min_rtt: Option<f64>,
    /// The RTT under load ([`loaded_srtt`]).
    loaded: Loaded,
    /// The meter's first loss and what came with it ([`meter_losses`]).
    meter_losses: Option<u32>,
    mss: u32,
    cc: Option<String>,
    tuner: Option<TunerReport>,
}

impl Runner {
    /// One candidate for `secs` seconds.
    async fn trial(&self, config: &Config, rate: Option<f64>, secs: f64) -> Result<Trial> {
        let opts = TransferOptions {
            channels: config.channels,
            max_channels: config.channels,
            cc: vec![config.cc.clone()],
            rate: match rate {
                Some(r) if config.paced => PathRate::Measured((r * 8.0) as u64),
                _ => PathRate::Unknown,
            },
            pace: if config.paced {
                PaceChoice::Auto
            } else {
                PaceChoice::Off
            },
            tune: if config.paced {
                Tune::Online
            } else {
                Tune::Off
            },
            // Channels start together: staggered 2 RTTs apart, 8 channels at 120 ms took 1.6 s
            // of a 2.4 s trial to start, ran out of the data announced for the trial, and
            // measured 14 Mbit/s against 945 for the same configuration over 10 s. A copy's
            // stagger costs it those seconds once; the trial measures what comes after.
            stagger: StaggerChoice::Off,
            ..self.base.clone()
        };
        let m = self.run(&opts, secs).await?;
        Ok(Trial {
            config: config.clone(),
            goodput: m.steady.goodput,
            retransmit_rate: m.steady.retransmit_rate,
        })
    }

    /// A timed bench with a trace of the sending sockets.
    async fn run(&self, opts: &TransferOptions, secs: f64) -> Result<Measured> {
        let live = Arc::new(LiveStats::new(opts.channels as usize));
        live.telemetry.enable_trace();
        let direction = match self.direction {
            Direction::Push => BenchDirection::Upload,
            Direction::Pull => BenchDirection::Download,
        };
        let report = Client::new(&self.host, opts.clone())
            .bench(direction, BenchAmount::Seconds(secs), &live)
            .await?;
        let samples = live.telemetry.take_trace();
        let min_rtt = samples
            .iter()
            .map(|s| s.tcp.min_rtt_us)
            .filter(|us| *us > 0)
            .min()
            .map(|us| us as f64 / 1e6);
        let base = min_rtt.unwrap_or(0.0);
        Ok(Measured {
            steady: steady(&samples),
            peak: peak(&samples),
            min_rtt,
            loaded: loaded_srtt(&samples, base),
            meter_losses: meter_losses(&samples, base),
            mss: samples.iter().map(|s| s.tcp.mss).max().unwrap_or(0),
            cc: report.channels.first().and_then(|c| c.cc.clone()),
            tuner: report.tuning.online,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn a_long_mptcp_copy_teaches_its_subflow_count_not_one_channel() {
        let mut report = TransferReport {
            seconds: 12.0,
            transport: Transport::Mptcp,
            subflows: Some(4),
            ..Default::default()
        };
        report.tuning.online = Some(TunerReport {
            channels: 1,
            measured_bps: Some(900_000_000),
            ..Default::default()
        });
        report.channels = vec![serde_json::from_value(serde_json::json!({
            "index": 0, "bytes": 1, "goodput_bps": 1.0, "cc": "cubic",
            "send_buffer_requested": null, "send_buffer": 1, "pace_bps": 200_000_000,
            "stagger_s": 0.0, "started_s": 0.0, "retransmits": 0, "loss_events": 0,
            "cwnd": 10, "rtt_us": 1, "local": null, "remote": null
        }))
        .unwrap()];
        let p = learned_profile(&report, "h", 1, Direction::Push).unwrap();
        assert_eq!(p.recommendation.channels, 4);
        report.transport = Transport::Tcp;
        let p = learned_profile(&report, "h", 1, Direction::Push).unwrap();
        assert_eq!(p.recommendation.channels, 1);
    }

    /// A profile that a `--policy fast` probe or copy saved with BBR does not put a copy
    /// under the default fair policy on BBR; its channel count and rate still apply.
    #[test]
    fn a_fair_copy_takes_no_bbr_from_a_profile() {
        let mut p = PathProfile::example("h", Direction::Push, 100);
        p.recommendation.cc = "bbr".into();
        let mut fair = TransferOptions::default();
        let origin = apply_profile(&p, &mut fair, Fixed::default(), 160);
        assert!(fair.cc.is_empty(), "{:?}", fair.cc);
        assert_eq!(fair.channels, p.recommendation.channels);
        assert!(origin.contains("not bbr (policy fair)"), "{origin}");
        let mut fast = TransferOptions {
            policy: Policy::Fast,
            ..Default::default()
        };
        apply_profile(&p, &mut fast, Fixed::default(), 160);
        assert_eq!(fast.cc, ["bbr"]);
    }

    #[test]
    fn an_untold_budget_grows_to_what_a_long_path_needs_and_a_told_one_is_checked() {
        let ms = Duration::from_millis;
        assert_eq!(budget_for(None, ms(60)).unwrap(), DEFAULT_BUDGET);
        let long = budget_for(None, ms(250)).unwrap().as_secs_f64();
        assert!((long - 19.15).abs() < 0.01, "{long}");
        assert_eq!(budget_for(Some(ms(30_000)), ms(250)).unwrap(), ms(30_000));
        let e = budget_for(Some(ms(10_000)), ms(250))
            .unwrap_err()
            .to_string();
        assert!(e.contains("give a `budget` of 20s or more"), "{e}");
        let e = check_budget(Some(Duration::from_secs(u64::MAX / 2)))
            .unwrap_err()
            .to_string();
        assert!(e.contains("at most 86400 s"), "{e}");
        let e = check_budget(Some(ms(1_000))).unwrap_err().to_string();
        assert!(
            e.contains("too short for any path: give a `budget` of 5s or more"),
            "{e}"
        );
        assert!(check_budget(Some(ms(5_000))).is_ok() && check_budget(None).is_ok());
    }
}
