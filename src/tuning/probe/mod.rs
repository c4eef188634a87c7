//! What `hsxfer probe` tries on a path, how it ranks what it measured, and what it
//! recommends; the saved result ([`PathProfile`]). Pure: the trials themselves run in
//! `session::probe`.
//!
//! The probe's first trial is a transfer tuned online: its meter gives the bottleneck rate,
//! the RTT and the queue (the RTT's inflation while the meter overfilled it). The candidates
//! follow from those facts and from both hosts' limits:
//! - a tiny queue (under a tenth of the BDP) means unpaced loss-based channels are cut by
//!   their own bursts (Antony et al. 2003; Cui 2013 ch. 4): only paced configurations;
//! - a socket buffer cap below the per-channel share of the BDP means more channels: as many
//!   as the BDP needs at that window, and twice that;
//! - random loss ([`PathFacts::lossy`]: a meter's loss that came alone, or losses that
//!   explain what the channels moved) keeps every loss-based window small (each channel
//!   gets about MSS/RTT × 1.22/√p, Mathis et al.): more channels, unpaced (the rate the
//!   meter saw is then what its channels reached, not the path's), and BBR under
//!   `--policy fast`;
//! - otherwise the transfer's default and the loss-based congestion controls this host may
//!   use, paced; cubic unpaced as the baseline a user gets elsewhere.
//!
//! The candidates then share the remaining budget by successive halving: each runs once,
//! the better half runs again, and so on while time is left; the ranking uses each
//! configuration's mean steady goodput.
//!
//! What a trial measured is read from its trace in `measure`; how long the trials run,
//! and the least budget that fits them, is [`budget`].

use serde::{Deserialize, Serialize};

pub mod budget;
pub(crate) mod measure;

use super::bdp::WIRE_OVERHEAD;
use super::online::PACE_GAIN;
use crate::channels::control::Policy;
use crate::channels::limits;

/// Most channels a candidate uses.
pub const MAX_CANDIDATE_CHANNELS: u16 = 32;

/// Loss-based congestion controls worth trying, best first, when the host may use them.
const LOSS_BASED: [&str; 5] = ["cubic", "htcp", "dmctcp", "highspeed", "reno"];

/// A configuration: what `copy`'s flags set.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Config {
    /// Congestion control of every channel.
    pub cc: String,
    /// Number of channels.
    pub channels: u16,
    /// Paced just below the measured rate (`--rate`), or unpaced (`--pace off`).
    pub paced: bool,
}

/// The path as the probe measured it, and what limits the hosts at its ends.
#[derive(Debug, Clone, PartialEq)]
pub struct PathFacts {
    /// Round-trip time without queueing, seconds.
    pub rtt: f64,
    /// Bottleneck goodput rate, bytes/s; `None` when the meter could not fill the path.
    pub rate: Option<f64>,
    /// The most goodput the first trial reached, bytes/s (a floor when the rate is unknown).
    pub reached: f64,
    /// Bottleneck queue, packets, when the meter could see it.
    pub queue_packets: Option<f64>,
    /// Whether the queue is only a floor: the meter stopped before it overflowed.
    pub queue_is_floor: bool,
    /// Share of segments the first trial retransmitted once it ran paced at the rate.
    pub loss: f64,
    /// What the first trial's channels moved over the span `loss` counts, bytes/s, and how
    /// many they were, when their congestion control backs off on loss (`None` for BBR,
    /// which random loss does not hold back).
    pub loss_based_goodput: Option<(f64, u16)>,
    /// Segments the meter's channel retransmitted from its first loss to two rounds later,
    /// if a loss ended the meter ([`lone_losses`] reads them).
    pub meter_losses: Option<u32>,
    /// Whether a host's window held the meter's channel back (the rate stayed unknown).
    pub window_limited: bool,
    /// Bytes one socket can have in flight in this direction: half the smaller of the
    /// sender's largest send buffer and the receiver's largest receive buffer (the kernel
    /// keeps the other half for its own overhead).
    pub window_max: u64,
    /// Segment size, bytes.
    pub mss: u32,
}

impl PathFacts {
    /// The bandwidth-delay product, bytes (of the rate, or of what was reached).
    pub fn bdp(&self) -> f64 {
        self.rate.unwrap_or(self.reached) * self.rtt
    }

    /// Whether the queue holds less than a tenth of the BDP (a floor cannot tell).
    pub fn tiny_queue(&self) -> bool {
        let packet = (self.mss + WIRE_OVERHEAD) as f64;
        !self.queue_is_floor
            && self
                .queue_packets
                .is_some_and(|q| q * packet < 0.1 * self.bdp())
    }

    /// Whether losses come without congestion: the meter's loss came alone ([`lone_losses`]),
    /// or, once paced, the channels lost more than [`random_loss`] allows and, for loss-based
    /// channels, often enough to explain what they moved ([`RANDOM_LOSS_SLACK`]) or to hold
    /// them well below the rate the path carried ([`HELD_BELOW_RATE`]).
    pub fn lossy(&self) -> bool {
        self.meter_losses.is_some_and(lone_losses)
            || random_loss(self.loss)
                && self.loss_based_goodput.is_none_or(|(goodput, channels)| {
                    let spread = random_loss_rate(self.loss, channels, self.mss, self.rtt);
                    goodput <= RANDOM_LOSS_SLACK * spread
                        || self.rate.is_some_and(|r| goodput < HELD_BELOW_RATE * r)
                })
    }

    /// Channels the hosts' socket buffers need for the whole BDP, with 20 % to spare; when a
    /// window held the meter back the rate is unknown, so twice the first trial's four.
    pub fn channels_for_windows(&self) -> u16 {
        if self.window_limited && self.rate.is_none() {
            return 8;
        }
        let need = (1.2 * self.bdp() / self.window_max.max(1) as f64).ceil();
        (need as u16).clamp(1, MAX_CANDIDATE_CHANNELS)
    }
}

/// Whether a share of segments lost while paced below the rate means random loss: above one
/// in ten thousand.
pub fn random_loss(loss: f64) -> bool {
    loss > 1e-4
}

/// Most segments the meter's channel may retransmit over the two rounds after its first loss
/// for that loss to count as random ([`lone_losses`]).
pub const LONE_LOSSES_MAX: u32 = 8;

/// Whether the meter's first loss, with `retransmitted` segments over the two rounds from it,
/// came alone, so it was random: a queue overflows under slow start's growth by tens to
/// hundreds of segments at once (37–471 on 1 Gbit/s × 60 ms × 64 packets, 389–403 on
/// 200 Mbit/s × 40 ms × 16 packets), while 0.1 % of random loss took 4 from a window of
/// 1,700 segments. Such a loss ends the meter early, at any rate (1.4–334 Mbit/s on a
/// 1 Gbit/s path), and channels paced at that rate then lose too little in a trial of
/// seconds to show it.
pub fn lone_losses(retransmitted: u32) -> bool {
    retransmitted <= LONE_LOSSES_MAX
}

/// What `channels` loss-based channels can move through random loss of share `loss`, bytes/s:
/// each holds the larger of Reno's window, 1.22/√p segments (Mathis et al. 1997), and cubic's
/// average, 1.054 · RTT^¾ / p^¾ (RFC 8312 §5.1, C = 0.4, β = 0.7), which is larger on long
/// paths at low loss (about 3× Reno's at 250 ms and 1e-4).
pub fn random_loss_rate(loss: f64, channels: u16, mss: u32, rtt: f64) -> f64 {
    let (p, rtt) = (loss.max(1e-12), rtt.max(1e-6));
    let reno = 1.22 / p.sqrt();
    let cubic = 1.054 * rtt.powf(0.75) / p.powf(0.75);
    channels as f64 * mss as f64 / rtt * reno.max(cubic)
}

/// How far above [`random_loss_rate`] loss-based channels may move before their losses cannot
/// be random. Losses at a queue that overflowed come many in one congestion event, or while
/// the channels are paced near the link, and cost the windows far less than the same share
/// spread out: four paced cubic channels retransmitted 0.08–0.13 % of their segments at 893
/// Mbit/s on 1 Gbit/s × 60 ms × 64 packets, 30× that rate, and 0.093 % at 161 Mbit/s on
/// 200 Mbit/s × 40 ms × 16 packets, 3.5× it; through 0.1 % of random loss four cubic channels
/// moved 28.5 Mbit/s at 60 ms, 1.0× it.
pub const RANDOM_LOSS_SLACK: f64 = 2.0;

/// Below this share of the rate the meter measured, losses held loss-based channels back
/// whatever they moved: in a trial of seconds the windows have not yet decayed to
/// [`random_loss_rate`]. Through 0.1 % of random loss a meter that reached 149 Mbit/s before
/// its first loss left four channels at 70 Mbit/s, 2.4× that rate; channels paced near the
/// link of a tiny queue moved 0.85–0.95 of the meter's rate.
pub const HELD_BELOW_RATE: f64 = 0.8;

/// Whether a congestion control backs off on loss (all but BBR).
pub fn loss_based(cc: &str) -> bool {
    !cc.starts_with("bbr")
}

/// The configurations worth trying on `path`, best guess first. `usable` says which
/// congestion controls the sending host may select; `default_cc` is its default.
pub fn candidates(
    path: &PathFacts,
    usable: &dyn Fn(&str) -> bool,
    default_cc: &str,
    policy: Policy,
) -> Vec<Config> {
    let mut ccs: Vec<String> = Vec::new();
    if loss_based(default_cc) && usable(default_cc) {
        ccs.push(default_cc.to_string());
    }
    for c in LOSS_BASED {
        if ccs.len() < 3 && usable(c) && !ccs.iter().any(|x| x == c) {
            ccs.push(c.to_string());
        }
    }
    let bbr = (policy == Policy::Fast && usable("bbr")).then(|| "bbr".to_string());
    let base = path.channels_for_windows().max(4);
    let mut out: Vec<Config> = Vec::new();
    let mut add = |cc: &str, channels: u16, paced: bool| {
        let c = Config {
            cc: cc.to_string(),
            channels: channels.min(MAX_CANDIDATE_CHANNELS),
            paced,
        };
        if !out.contains(&c) {
            out.push(c);
        }
    };
    let first = ccs.first().cloned().unwrap_or_else(|| "reno".into());
    if path.lossy() {
        // Unpaced: through random loss the meter's rate is what its channels reached, not the
        // path's. Paced at it, sixteen channels moved no more than the first trial's four
        // (57 against 53 Mbit/s on 1 Gbit/s × 60 ms at 0.1 %); each unpaced channel adds a
        // loss-limited window of its own.
        for n in [2 * base, 4 * base, 8 * base] {
            add(&first, n, false);
        }
        if let Some(b) = &bbr {
            add(b, base, false);
        }
    }
    for cc in &ccs {
        add(cc, base, path.rate.is_some());
    }
    if path.channels_for_windows() > 4 {
        add(&first, 2 * base, path.rate.is_some());
    }
    if let Some(b) = &bbr {
        add(b, base, false);
    }
    if !path.tiny_queue() || path.rate.is_none() {
        add(&first, base, false);
    }
    out
}

/// One trial's measurement.
#[derive(Debug, Clone, PartialEq)]
pub struct Trial {
    /// What ran.
    pub config: Config,
    /// Goodput over the trial's steady part, bytes/s.
    pub goodput: f64,
    /// Segments retransmitted per segment delivered over the steady part.
    pub retransmit_rate: f64,
}

/// A configuration with everything measured of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ranked {
    /// The configuration.
    #[serde(flatten)]
    pub config: Config,
    /// Mean steady goodput of its trials, bits/s.
    pub goodput_bps: f64,
    /// Mean retransmissions per delivered segment.
    pub retransmit_rate: f64,
    /// Trials it ran.
    pub trials: usize,
    /// How far its rank can be trusted, 0–1: its lead over the next (or the gap to the one
    /// above) against the spread of its own trials (a single trial counts as 5 % spread).
    pub confidence: f64,
}

/// Goodputs closer than this fraction are a tie: short trials on a shared host differ by
/// about this much from run to run.
const TIE: f64 = 0.02;

/// Ranks trials by each configuration's mean goodput; within `TIE` of each other, fewer
/// retransmissions, then the earlier in `preference` (the planner's order), then fewer
/// channels come first.
pub fn rank(trials: &[Trial], preference: &[Config]) -> Vec<Ranked> {
    let mut groups: Vec<(Config, Vec<&Trial>)> = Vec::new();
    for t in trials {
        match groups.iter_mut().find(|(c, _)| *c == t.config) {
            Some((_, v)) => v.push(t),
            None => groups.push((t.config.clone(), vec![t])),
        }
    }
    let mut ranked: Vec<(Ranked, f64)> = groups
        .into_iter()
        .map(|(config, ts)| {
            let n = ts.len() as f64;
            let mean = ts.iter().map(|t| t.goodput).sum::<f64>() / n;
            let retrans = ts.iter().map(|t| t.retransmit_rate).sum::<f64>() / n;
            let spread = if ts.len() > 1 {
                let (lo, hi) = ts.iter().fold((f64::MAX, 0.0f64), |(lo, hi), t| {
                    (lo.min(t.goodput), hi.max(t.goodput))
                });
                (hi - lo) / mean.max(1.0)
            } else {
                0.05
            };
            let r = Ranked {
                config,
                goodput_bps: mean * 8.0,
                retransmit_rate: retrans,
                trials: ts.len(),
                confidence: 0.0,
            };
            (r, spread)
        })
        .collect();
    let order = |c: &Config| preference.iter().position(|p| p == c).unwrap_or(usize::MAX);
    ranked.sort_by(|(a, _), (b, _)| {
        let close = (a.goodput_bps - b.goodput_bps).abs() <= TIE * a.goodput_bps.max(b.goodput_bps);
        if close {
            // Retransmission rates below 0.1 % are all "none" here.
            let r = |x: f64| (x * 1000.0).floor();
            r(a.retransmit_rate)
                .total_cmp(&r(b.retransmit_rate))
                .then(order(&a.config).cmp(&order(&b.config)))
                .then(a.config.channels.cmp(&b.config.channels))
        } else {
            b.goodput_bps.total_cmp(&a.goodput_bps)
        }
    });
    let goodputs: Vec<f64> = ranked.iter().map(|(r, _)| r.goodput_bps).collect();
    for (i, (r, spread)) in ranked.iter_mut().enumerate() {
        let neighbour = if i == 0 {
            goodputs.get(1).copied()
        } else {
            goodputs.get(i - 1).copied()
        };
        let gap = neighbour.map_or(1.0, |g| (r.goodput_bps - g).abs() / r.goodput_bps.max(1.0));
        // Equal goodputs measured without spread (all trials moved nothing, say) are a tie
        // with no evidence either way: 0, not 0/0.
        let evidence = gap + *spread;
        r.confidence = if evidence > 0.0 {
            (gap / evidence).clamp(0.0, 1.0)
        } else {
            0.0
        };
    }
    ranked.into_iter().map(|(r, _)| r).collect()
}

/// What the probe recommends, in the settings `copy` takes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recommendation {
    /// Congestion control.
    pub cc: String,
    /// Channels.
    pub channels: u16,
    /// Pacing cap of all channels together, bits/s; `None`: unpaced.
    pub pace_bps: Option<u64>,
    /// Socket buffers: `auto` (sized to the rate and RTT).
    pub buffer: String,
}

impl Recommendation {
    /// The recommendation for a ranked configuration on a path of goodput rate `rate`
    /// (bytes/s).
    pub fn of(config: &Config, rate: Option<f64>) -> Recommendation {
        Recommendation {
            cc: config.cc.clone(),
            channels: config.channels,
            pace_bps: rate
                .filter(|_| config.paced)
                .map(|r| (PACE_GAIN * r * 8.0) as u64),
            buffer: "auto".into(),
        }
    }

    /// The `copy` flags that give this configuration (`--rate` is the bottleneck on the wire,
    /// which the pacing follows).
    pub fn flags(&self, mss: u32) -> String {
        let mut f = format!("-n {} --cc {}", self.channels, self.cc);
        match self.pace_bps {
            Some(p) => {
                let mss = if mss == 0 { 1448 } else { mss } as f64;
                let wire = p as f64 / PACE_GAIN * (mss + WIRE_OVERHEAD as f64) / mss;
                f.push_str(&format!(" --rate {}", rate_flag(wire)));
            }
            None => f.push_str(" --pace off"),
        }
        f
    }
}

/// A rate as `copy --rate` takes it, rounded to three significant digits (`956M`, `1.2G`).
pub fn rate_flag(bps: f64) -> String {
    // Round to three significant digits first, so 999.99 M reads as 1 G.
    let scale = 10f64.powi(bps.max(1.0).log10().floor() as i32 - 2);
    let bps = (bps / scale).round() * scale;
    let (v, unit) = if bps >= 1e9 {
        (bps / 1e9, "G")
    } else if bps >= 1e6 {
        (bps / 1e6, "M")
    } else {
        (bps / 1e3, "K")
    };
    let digits = if v >= 100.0 {
        0
    } else if v >= 10.0 {
        1
    } else {
        2
    };
    let s = format!("{v:.digits$}");
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    };
    format!("{s}{unit}")
}

/// Which way data flows in a profile: from the client (`push`) or to it (`pull`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Client sends.
    Push,
    /// Server sends.
    Pull,
}

impl Direction {
    /// `push` or `pull`.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Push => "push",
            Direction::Pull => "pull",
        }
    }
}

/// What a probe (or a long enough copy) learned about a path, saved per server and
/// direction so that later copies start tuned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PathProfile {
    /// The server as given (name or address).
    pub server: String,
    /// Its port.
    pub port: u16,
    /// Which way data flows.
    pub direction: Direction,
    /// When it was measured, seconds since the Unix epoch.
    pub measured_at: u64,
    /// `probe` or `copy`.
    pub source: String,
    /// RTT without queueing, microseconds.
    pub rtt_us: u64,
    /// Bottleneck goodput rate, bits/s, when measured.
    pub rate_bps: Option<u64>,
    /// Bottleneck queue, packets, when measured.
    pub queue_packets: Option<f64>,
    /// Share of segments lost while paced below the rate.
    pub loss: f64,
    /// The settings to use.
    pub recommendation: Recommendation,
}

impl PathProfile {
    /// What makes a saved profile unusable at `now_s` (seconds since the Unix epoch), if
    /// anything: settings no transfer accepts (a file edited by hand, or written by another
    /// version), or a time of measurement more than a day ahead, which would never expire.
    pub fn problem(&self, now_s: u64) -> Option<String> {
        let r = &self.recommendation;
        let cc_ok = !r.cc.is_empty()
            && r.cc.len() <= limits::MAX_CC_NAME
            && r.cc.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if r.channels == 0 || r.channels > limits::MAX_CHANNELS {
            Some(format!("its channel count {} is out of range", r.channels))
        } else if !cc_ok {
            Some(format!("{:?} is not a congestion control name", r.cc))
        } else if r.pace_bps == Some(0) || self.rate_bps == Some(0) {
            Some("it gives a rate of 0".into())
        } else if self.measured_at > now_s.saturating_add(86_400) {
            Some("it was measured in the future".into())
        } else {
            None
        }
    }

    /// How it was measured and how long ago, for reports: "probe 2 h ago".
    pub fn age(&self, now_s: u64) -> String {
        let ago = now_s.saturating_sub(self.measured_at);
        let when = match ago {
            0..60 => format!("{ago} s"),
            60..3600 => format!("{} min", ago / 60),
            3600..172_800 => format!("{} h", ago / 3600),
            _ => format!("{} days", ago / 86_400),
        };
        format!("{} {when} ago", self.source)
    }

    /// A probe's profile of a 1 Gbit/s × 60 ms path with a 64-packet queue: 4 paced cubic
    /// channels (for tests).
    #[cfg(test)]
    pub(crate) fn example(server: &str, direction: Direction, measured_at: u64) -> PathProfile {
        PathProfile {
            server: server.into(),
            port: 7420,
            direction,
            measured_at,
            source: "probe".into(),
            rtt_us: 60_000,
            rate_bps: Some(956_000_000),
            queue_packets: Some(64.0),
            loss: 0.0,
            recommendation: Recommendation::of(
                &Config {
                    cc: "cubic".into(),
                    channels: 4,
                    paced: true,
                },
                Some(119.5e6),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(queue: f64, loss: f64, window_max: u64) -> PathFacts {
        PathFacts {
            rtt: 0.06,
            rate: Some(119.5e6),
            reached: 119.5e6,
            queue_packets: Some(queue),
            queue_is_floor: false,
            loss,
            loss_based_goodput: None,
            meter_losses: Some(200),
            window_limited: false,
            window_max,
            mss: 1448,
        }
    }

    fn all(_: &str) -> bool {
        true
    }

    #[test]
    fn a_tiny_queue_gets_only_paced_candidates() {
        let p = path(64.0, 0.0, 64 << 20);
        assert!(p.tiny_queue());
        let c = candidates(&p, &all, "cubic", Policy::Fair);
        assert!(c.iter().all(|c| c.paced), "{c:?}");
        assert_eq!(c[0].cc, "cubic");
        assert!(
            c.iter().all(|c| c.cc != "bbr"),
            "fair never tries bbr: {c:?}"
        );
        assert!(c.len() >= 3, "{c:?}");
    }

    #[test]
    fn a_queue_seen_only_as_a_floor_is_not_tiny() {
        let mut p = path(64.0, 0.0, 64 << 20);
        p.queue_is_floor = true;
        assert!(!p.tiny_queue());
        let c = candidates(&p, &all, "cubic", Policy::Fair);
        assert!(c.iter().any(|c| !c.paced), "{c:?}");
    }

    #[test]
    fn a_deep_queue_also_tries_the_unpaced_baseline_and_fast_tries_bbr() {
        let p = path(5000.0, 0.0, 64 << 20);
        assert!(!p.tiny_queue());
        let c = candidates(&p, &|c| c != "htcp" && c != "dmctcp", "bbr", Policy::Fast);
        assert!(c.contains(&Config {
            cc: "cubic".into(),
            channels: 4,
            paced: false
        }));
        assert!(c.iter().any(|c| c.cc == "bbr"));
        assert!(
            c.iter().all(|c| c.cc != "htcp"),
            "htcp is not usable: {c:?}"
        );
    }

    #[test]
    fn capped_windows_ask_for_more_channels() {
        // 7.17 MB BDP, 2 MiB per socket: 1.2 × 7.17 / 2.1 = 4.1, so 5 channels, and 10.
        let p = path(64.0, 0.0, 2 << 20);
        assert_eq!(p.channels_for_windows(), 5);
        let c = candidates(&p, &all, "cubic", Policy::Fair);
        assert_eq!(c[0].channels, 5);
        assert!(c.iter().any(|c| c.channels == 10));
    }

    #[test]
    fn random_loss_asks_for_many_channels_and_bbr_when_fast() {
        let p = path(5000.0, 1e-3, 64 << 20);
        let fair = candidates(&p, &all, "cubic", Policy::Fair);
        let first: Vec<(u16, bool)> = fair.iter().take(3).map(|c| (c.channels, c.paced)).collect();
        assert_eq!(first, vec![(8, false), (16, false), (32, false)]);
        let fast = candidates(&p, &all, "cubic", Policy::Fast);
        assert!(fast.iter().any(|c| c.cc == "bbr"));
    }

    #[test]
    fn losses_that_loss_based_channels_moved_far_more_through_are_not_random() {
        // 0.1 % spread out leaves four channels at 60 ms about 30 Mbit/s (Reno's window,
        // Mathis et al.); 0.01 % at 250 ms about 70 (cubic's, 3× Reno's).
        let mathis = random_loss_rate(1e-3, 4, 1448, 0.06);
        assert!((mathis * 8e-6 - 29.8).abs() < 0.1, "{}", mathis * 8e-6);
        let long = random_loss_rate(1e-4, 4, 1448, 0.25);
        assert!((long * 8e-6 - 69.1).abs() < 0.5, "{}", long * 8e-6);
        let mut p = path(64.0, 1e-3, 64 << 20);
        // Path (d), 1 BDP with 0.1 % random loss: four cubic channels moved 28.5 Mbit/s.
        p.loss_based_goodput = Some((28.5e6 / 8.0, 4));
        assert!(p.lossy());
        // Path (a), 64 packets and no random loss: the paced trial's own overflows cost
        // 0.08-0.13 % of the segments at 893 Mbit/s.
        p.loss_based_goodput = Some((893e6 / 8.0, 4));
        assert!(!p.lossy());
        // 200 Mbit/s × 40 ms × 16 packets: 0.093 % at 161 Mbit/s, 3.5× what random loss
        // would leave.
        p.rtt = 0.04;
        p.loss = 0.93e-3;
        p.rate = Some(190.9e6 / 8.0);
        p.loss_based_goodput = Some((161e6 / 8.0, 4));
        assert!(!p.lossy());
        // Cubic's larger windows through random loss at a long RTT still count as random.
        p.rtt = 0.25;
        p.loss = 1e-4 + 1e-9;
        p.loss_based_goodput = Some((1.8 * long, 4));
        assert!(p.lossy());
        // Path (d) again, with a meter that reached 149 Mbit/s before its first loss: four
        // channels moved 70 Mbit/s, 2.4× what random loss leaves, but under half the rate.
        p.rtt = 0.06;
        p.loss = 1.02e-3;
        p.rate = Some(149e6 / 8.0);
        p.loss_based_goodput = Some((70e6 / 8.0, 4));
        assert!(p.lossy());
        p.loss_based_goodput = Some((0.85 * 149e6 / 8.0, 4));
        assert!(!p.lossy());
        // BBR keeps its rate through random loss: the share decides alone.
        p.loss_based_goodput = None;
        assert!(p.lossy());
        p.loss = 5e-5;
        assert!(!p.lossy());
    }

    #[test]
    fn a_meter_ended_by_a_lone_loss_met_random_loss() {
        // Path (d): 0.1 % random loss ended the meter at 4.9 Mbit/s, with 4 segments
        // retransmitted, and four channels paced there lost nothing in the trial.
        let mut p = path(0.0, 0.0, 64 << 20);
        p.rate = Some(4.9e6 / 8.0);
        p.loss_based_goodput = Some((4.8e6 / 8.0, 4));
        p.meter_losses = Some(4);
        assert!(p.lossy());
        let c = candidates(&p, &all, "cubic", Policy::Fair);
        assert!(c.iter().any(|c| !c.paced && c.channels >= 16), "{c:?}");
        // A queue's overflow under slow start: 37 at once on path (a).
        p.meter_losses = Some(37);
        assert!(!p.lossy());
        // A meter that ended without a loss says nothing of it.
        p.meter_losses = None;
        assert!(!p.lossy());
    }

    #[test]
    fn ranking_uses_means_and_breaks_ties_by_retransmissions() {
        let cfg = |cc: &str, channels| Config {
            cc: cc.into(),
            channels,
            paced: true,
        };
        let t = |c: Config, g, r| Trial {
            config: c,
            goodput: g,
            retransmit_rate: r,
        };
        let trials = vec![
            t(cfg("cubic", 4), 100.0, 0.0),
            t(cfg("cubic", 4), 110.0, 0.0),
            t(cfg("reno", 4), 104.5, 0.01),
            t(cfg("htcp", 8), 90.0, 0.0),
        ];
        let r = rank(&trials, &[]);
        // cubic's mean 105 and reno's 104.5 are within 2 %: fewer retransmissions first.
        assert_eq!(r[0].config.cc, "cubic");
        // A tie without retransmissions goes to the planner's preference.
        let tie = [
            t(cfg("reno", 4), 101.0, 0.0),
            t(cfg("cubic", 4), 100.0, 0.0),
        ];
        assert_eq!(
            rank(&tie, &[cfg("cubic", 4), cfg("reno", 4)])[0].config.cc,
            "cubic"
        );
        assert_eq!(rank(&tie, &[])[0].config.cc, "reno");
        assert_eq!(r[0].trials, 2);
        assert_eq!(r[0].goodput_bps, 840.0);
        assert_eq!(r[2].config.cc, "htcp");
        assert!(r.iter().all(|x| (0.0..=1.0).contains(&x.confidence)));
        // A clear lead measured twice consistently is trusted more than a close call.
        let clear = rank(
            &[
                t(cfg("cubic", 4), 100.0, 0.0),
                t(cfg("cubic", 4), 100.0, 0.0),
                t(cfg("reno", 4), 50.0, 0.0),
            ],
            &[],
        );
        assert!(clear[0].confidence > 0.99, "{clear:?}");
        assert!(r[0].confidence < 0.5, "{r:?}");
    }

    #[test]
    fn trials_that_all_moved_nothing_have_confidence_zero_not_nan() {
        let cfg = |cc: &str| Config {
            cc: cc.into(),
            channels: 4,
            paced: false,
        };
        let zero = |c: Config| Trial {
            config: c,
            goodput: 0.0,
            retransmit_rate: 0.0,
        };
        let r = rank(
            &[
                zero(cfg("cubic")),
                zero(cfg("cubic")),
                zero(cfg("reno")),
                zero(cfg("reno")),
            ],
            &[],
        );
        assert!(r.iter().all(|x| x.confidence == 0.0), "{r:?}");
    }

    #[test]
    fn the_recommendation_gives_copy_flags() {
        let paced = Config {
            cc: "cubic".into(),
            channels: 4,
            paced: true,
        };
        let r = Recommendation::of(&paced, Some(119.5e6));
        assert_eq!(r.pace_bps, Some(927_320_000));
        assert_eq!(r.flags(1448), "-n 4 --cc cubic --rate 1G");
        let unpaced = Config {
            paced: false,
            ..paced
        };
        assert_eq!(
            Recommendation::of(&unpaced, Some(1e8)).flags(1448),
            "-n 4 --cc cubic --pace off"
        );
        assert_eq!(rate_flag(956.4e6), "956M");
        assert_eq!(rate_flag(1.25e9), "1.25G");
        assert_eq!(rate_flag(12.34e6), "12.3M");
    }

    #[test]
    fn ages_read_as_words() {
        let p = PathProfile::example("dtn1", Direction::Push, 1000);
        assert_eq!(p.age(1030), "probe 30 s ago");
        assert_eq!(p.age(1000 + 7200), "probe 2 h ago");
        assert_eq!(p.age(1000 + 3 * 86_400), "probe 3 days ago");
    }
}
