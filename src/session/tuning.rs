//! Applying a session's [`Tuning`] on this host: the socket options of each data channel for
//! this end's role (sender: congestion control, send buffer, pacing; receiver: receive
//! buffer), planned against this host's limits, and what the kernel granted, read back.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use crate::channels::control::{HostFacts, Policy, Tuning};
use crate::channels::telemetry::ChannelSetup;
use crate::error::{Error, Result};
use crate::transport::buffers::granted;
use crate::transport::cc::{self, CcCatalog};
use crate::transport::tcp::{Tag, NOTSENT_LOWAT, PACING_UNCAPPED};
use crate::transport::tls::Stream;
use crate::transport::SocketOptions;
use crate::tuning::bdp::{self, Direction};
use crate::tuning::bundled::{self, group::DmcGroup, inspect::GuardBaseline};
use crate::tuning::models::dmctcp;
use crate::tuning::online::{OnlineTuner, TunerConfig};
use crate::tuning::probe::loss_based;
use crate::tuning::registry;
use crate::tuning::sysctl::BufferLimits;

/// Which end of the data flow this host is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// This host sends the data.
    Send,
    /// This host receives the data.
    Receive,
}

/// The data-socket options of this host, per channel, and what its limits prevented.
#[derive(Debug, Clone)]
pub struct LocalPlan {
    /// Options of channel i.
    pub options: Vec<SocketOptions>,
    /// Limits that keep a setting below what the path needs, with the fix.
    pub notes: Vec<String>,
    /// The DMCTCP group of this transfer's dmctcp channels (sending side, when reachable).
    pub dmc_group: Option<Arc<DmcGroup>>,
    /// The congestion controls the user listed, cycled over the channels (sending side).
    cc_list: Vec<String>,
}

impl LocalPlan {
    /// The options of channel `i`, also of one the online tuner adds: as the last planned
    /// channel's, with the user's congestion-control list continued.
    pub fn for_channel(&self, i: usize) -> SocketOptions {
        let mut o = match self.options.get(i) {
            Some(o) => return o.clone(),
            None => self.options.last().cloned().unwrap_or_default(),
        };
        if !self.cc_list.is_empty() {
            o.congestion = Some(self.cc_list[i % self.cc_list.len()].clone());
        }
        o
    }

    /// The guard counters of the bundled congestion controls the sending channels run, read
    /// now (root only; None otherwise or when they run none).
    pub fn guard_baseline(&self) -> Option<GuardBaseline> {
        GuardBaseline::read(
            self.options
                .iter()
                .filter_map(|o| o.congestion.as_deref())
                .filter(|name| bundled::BUNDLED.iter().any(|b| b.name == *name)),
        )
    }
}

/// What this host tells a client measuring the path.
pub fn host_facts() -> Result<HostFacts> {
    let cat = CcCatalog::read().map_err(Error::io("reading the available congestion controls"))?;
    let limits = BufferLimits::read().map_err(Error::io("reading socket buffer limits"))?;
    Ok(HostFacts {
        version: env!("CARGO_PKG_VERSION").to_string(),
        cc_available: cat.available,
        cc_allowed: cat.allowed,
        cc_default: cat.default,
        privileged: cc::privileged(),
        send_buffer_max: limits.send.reachable(),
        receive_buffer_max: limits.receive.reachable(),
    })
}

/// The online tuner of a transfer's sending side, when the request asks for one.
pub fn online_tuner(t: &Tuning, channels: u16) -> Option<OnlineTuner> {
    let cat = CcCatalog::read().ok();
    let usable = |name: &str| {
        cat.as_ref()
            .is_some_and(|c| c.usable(name, cc::privileged()))
    };
    let config = tuner_config(
        t,
        channels,
        usable,
        cat.as_ref().map(|c| c.default.as_str()),
    )?;
    Some(OnlineTuner::new(config))
}

/// The tuner's configuration for `t` on a host where `usable` says which congestion
/// controls may be selected and `host_default` is the default one. A congestion control the
/// request names (the user's `--cc`, or a profile's) holds throughout: the tuner neither caps
/// it with another nor switches it to BBR on random loss.
fn tuner_config(
    t: &Tuning,
    channels: u16,
    usable: impl Fn(&str) -> bool,
    host_default: Option<&str>,
) -> Option<TunerConfig> {
    let o = t.online.as_ref()?;
    let named = t.cc_of(0);
    let steady_cc = named
        .map(str::to_string)
        .or_else(|| host_default.map(|d| policy_cc(o.policy, d, &usable)));
    let capped_cc = match (&steady_cc, named) {
        (Some(steady), None) if o.pace => capped_cc(o.policy, steady, &usable),
        _ => None,
    };
    Some(TunerConfig {
        channels,
        max_channels: o.max_channels.max(channels),
        known_rate: o.rate_bps.map(|b| b as f64 / 8.0),
        probe_known_rate: o.rate_saved,
        pace: o.pace,
        meter: o.meter,
        meter_cc: o.meter_cc.clone(),
        steady_cc,
        capped_cc,
        policy: o.policy,
        bbr_usable: named.is_none() && usable("bbr"),
    })
}

/// The congestion control a tuned transfer runs when the user chose none: the host default,
/// unless `--policy fair` rules it out for not backing off on loss (BBR); then cubic, or
/// Reno, which every Linux host may use.
pub fn policy_cc(policy: Policy, host_default: &str, usable: impl Fn(&str) -> bool) -> String {
    if policy == Policy::Fast || loss_based(host_default) {
        return host_default.to_string();
    }
    ["cubic", "reno"]
        .into_iter()
        .find(|c| usable(c))
        .unwrap_or("reno")
        .to_string()
}

/// The congestion control of channels the tuner's pacing caps hold, in place of `steady`
/// (a loss-based choice), under [`Policy::Fast`]: BIC, where it is registered (`sudo hsxfer
/// cc load bic --pin`). Under the caps the rate is the tuner's, and what the congestion
/// control still decides is how fast a window a loss cut comes back to its cap. Cubic's
/// HyStart ends slow start with windows just large enough for the caps, and a cut one then
/// regrows over seconds, under its cap; BIC has no HyStart, grows 5 % a round until its
/// first loss, and cuts by a fifth. On 1 Gbit/s × 60 ms × 64 packets, first 2 GiB copies
/// moved 95.25 % of the link (median, 10 of 14 at 95 % or more) against cubic's 94.7 % (10
/// of 28). Not under [`Policy::Fair`]: beside a paced cubic flow BIC's channels took 78–83 %
/// of the two goodputs where cubic's took 68–83 % (median 80 % against 73 %), and the flow
/// moved a quarter less (docs/tuning.md).
pub fn capped_cc(policy: Policy, steady: &str, usable: impl Fn(&str) -> bool) -> Option<String> {
    (policy == Policy::Fast && loss_based(steady) && steady != CAPPED_CC && usable(CAPPED_CC))
        .then(|| CAPPED_CC.into())
}

/// See [`capped_cc`].
const CAPPED_CC: &str = "bic";

/// Plans this host's data-socket options. On the sending side, every congestion control
/// named must be selectable here (`host` names this machine in the refusal), and an online
/// `tuner` sets each channel's first congestion control and pacing.
pub fn local_plan(
    t: &Tuning,
    side: Side,
    channels: u16,
    host: &str,
    tuner: Option<&OnlineTuner>,
) -> Result<LocalPlan> {
    if side == Side::Send {
        check_congestion(t, host)?;
    }
    let limits = BufferLimits::read().map_err(Error::io("reading socket buffer limits"))?;
    let (dir, dir_limits) = match side {
        Side::Send => (Direction::Send, limits.send),
        Side::Receive => (Direction::Receive, limits.receive),
    };
    let rtt = Duration::from_micros(t.rtt_us);
    let plan = bdp::plan(t.buffer, &dir_limits, dir, channels, rtt);
    let mut notes: Vec<String> = plan
        .warning
        .iter()
        .map(|w| format!("{host}: {w}"))
        .collect();
    // One group per transfer, of the first DMCTCP build among the channels' choices: channels
    // that run the other build (a mixed --cc list) run alone.
    let dmc_cc = (0..channels as usize)
        .find_map(|i| t.cc_of(i).filter(|cc| dmctcp::grouped(cc)))
        .filter(|_| side == Side::Send);
    let grouped = |i: usize| dmc_cc.is_some() && t.cc_of(i) == dmc_cc;
    let dmc_channels = (0..channels as usize).filter(|i| grouped(*i)).count();
    let dmc_group = match dmc_cc {
        None => None,
        Some(cc) => {
            let g = DmcGroup::new(cc).map(Arc::new);
            if g.is_none() && dmc_channels > 1 {
                notes.push(format!(
                    "{host}: {cc} channels cannot be grouped here (tagging sockets needs root, \
                     or the maps `sudo hsxfer cc load {cc} --pin` shares with other users); \
                     each channel runs as a group of its own"
                ));
            }
            g
        }
    };
    // The tuner chooses the congestion control only when the user did not.
    let tuned = |i: usize| tuner.filter(|_| side == Side::Send).map(|tu| tu.initial(i));
    let tuned_cc = |i: usize| tuned(i).filter(|_| t.cc.is_empty()).map(|(cc, _)| cc);
    let options = (0..channels as usize)
        .map(|i| SocketOptions {
            nodelay: false,
            congestion: match tuned_cc(i) {
                Some(cc) => cc,
                None => (side == Side::Send)
                    .then(|| t.cc_of(i))
                    .flatten()
                    .map(str::to_string),
            },
            send_buffer: (side == Side::Send).then_some(plan.request).flatten(),
            recv_buffer: (side == Side::Receive).then_some(plan.request).flatten(),
            max_pacing_rate: match tuned(i) {
                Some((_, cap)) if tuner.is_some_and(OnlineTuner::paces) => {
                    Some(cap.unwrap_or(PACING_UNCAPPED))
                }
                _ => (side == Side::Send)
                    .then(|| t.pace.get(i).copied().flatten())
                    .flatten(),
            },
            notsent_lowat: (side == Side::Send).then_some(NOTSENT_LOWAT),
            tag: dmc_group.clone().filter(|_| grouped(i)).map(|g| Tag(g)),
            // The client's choices, set by the client: a server only accepts.
            mptcp: false,
            userspace_pm: false,
        })
        .collect();
    Ok(LocalPlan {
        options,
        notes,
        dmc_group,
        cc_list: if side == Side::Send {
            t.cc.clone()
        } else {
            Vec::new()
        },
    })
}

/// Refuses congestion controls this host cannot select, naming what is available. A bundled
/// one that is not registered is registered first, for the life of this process, if the
/// process may (root).
pub fn check_congestion(t: &Tuning, host: &str) -> Result<()> {
    let meter = t.online.as_ref().and_then(|o| o.meter_cc.clone());
    let names: Vec<String> = t.cc.iter().cloned().chain(meter).collect();
    if names.is_empty() {
        return Ok(());
    }
    if cc::privileged() {
        bundled::ensure_registered(&names)
            .map_err(|e| Error::Usage(format!("on the {host}: {e}")))?;
    }
    let cat = CcCatalog::read().map_err(Error::io("reading the available congestion controls"))?;
    for name in &names {
        registry::check_usable(&cat, name, cc::privileged(), host).map_err(Error::Usage)?;
    }
    Ok(())
}

/// Reads back the settings in force on sending channel `index`.
pub fn read_setup(
    sock: &impl AsFd,
    index: usize,
    opts: &SocketOptions,
    stagger: Duration,
) -> Result<ChannelSetup> {
    let ctx = || format!("reading the settings of data channel {index}");
    let bufs = granted(sock).map_err(Error::io(ctx()))?;
    Ok(ChannelSetup {
        index: index as u16,
        cc: cc::congestion(sock).map_err(Error::io(ctx()))?,
        send_buffer_requested: opts.send_buffer,
        send_buffer: bufs.send,
        recv_buffer: bufs.receive,
        pace_bps: opts
            .max_pacing_rate
            .filter(|b| *b != PACING_UNCAPPED)
            .map(|b| b * 8),
        stagger_s: stagger.as_secs_f64(),
        started_s: None,
        local: None,
        remote: None,
    })
}

/// Makes sending channel `index` run the congestion control planned for it, if one was: a
/// route's `congctl` replaces at connect (and accept) the one set before, so it is set again.
/// When the route locks its own (`congctl lock`), the transfer stops before any data moves,
/// with an error naming the route (`host`: this end, "client" or "server").
pub fn enforce_congestion(
    sock: &Stream,
    index: usize,
    opts: &SocketOptions,
    host: &'static str,
) -> Result<()> {
    let Some(name) = &opts.congestion else {
        return Ok(());
    };
    let ctx = || format!("checking the congestion control of data channel {index}");
    match cc::match_congestion(sock, name) {
        Ok(()) => Ok(()),
        Err(cc::MatchError::Read(e)) => Err(Error::io(ctx())(e)),
        Err(cc::MatchError::NotInForce(mismatch)) => {
            let peer = sock
                .tcp()
                .peer_addr()
                .map_err(Error::io(ctx()))?
                .ip()
                .to_canonical();
            Err(Error::CcNotInForce {
                host,
                peer,
                mismatch,
                route: crate::transport::route::show(peer),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channels::control::OnlineTuning;

    fn registered(names: &'static [&'static str]) -> impl Fn(&str) -> bool {
        move |name| names.contains(&name)
    }

    fn tuned(cc: &[&str], policy: Policy) -> Tuning {
        let mut t = Tuning::kernel_defaults(4);
        t.cc = cc.iter().map(|c| c.to_string()).collect();
        t.online = Some(OnlineTuning {
            max_channels: 8,
            rate_bps: None,
            rate_saved: false,
            pace: true,
            meter: true,
            meter_cc: None,
            policy,
        });
        t
    }

    /// Under `--policy fast` the tuner may switch to BBR on random loss, and cap with BIC,
    /// only where it chose the congestion control: `--cc htcp --policy fast` stays H-TCP.
    #[test]
    fn a_named_congestion_control_is_never_switched_to_bbr_or_capped() {
        let all = registered(&["reno", "cubic", "bbr", "bic", "htcp"]);
        let own = tuner_config(&tuned(&[], Policy::Fast), 4, &all, Some("cubic")).unwrap();
        assert!(own.bbr_usable);
        assert_eq!(own.steady_cc.as_deref(), Some("cubic"));
        assert_eq!(own.capped_cc.as_deref(), Some("bic"));
        let named = tuner_config(&tuned(&["htcp"], Policy::Fast), 4, &all, Some("cubic")).unwrap();
        assert!(!named.bbr_usable);
        assert_eq!(named.steady_cc.as_deref(), Some("htcp"));
        assert_eq!(named.capped_cc, None);
        let fair = tuner_config(&tuned(&[], Policy::Fair), 4, &all, Some("bbr")).unwrap();
        assert_eq!(fair.steady_cc.as_deref(), Some("cubic"));
        assert_eq!(fair.capped_cc, None);
    }

    #[test]
    fn bic_runs_under_the_caps_only_for_policy_fast_in_place_of_a_loss_based_choice() {
        let all = registered(&["reno", "cubic", "bbr", "bic"]);
        assert_eq!(
            capped_cc(Policy::Fast, "cubic", &all).as_deref(),
            Some("bic")
        );
        assert_eq!(
            capped_cc(Policy::Fast, "reno", &all).as_deref(),
            Some("bic")
        );
        assert_eq!(capped_cc(Policy::Fair, "cubic", &all), None);
        assert_eq!(capped_cc(Policy::Fast, "bbr", &all), None);
        assert_eq!(capped_cc(Policy::Fast, "bic", &all), None);
        assert_eq!(
            capped_cc(Policy::Fast, "cubic", registered(&["reno", "cubic"])),
            None
        );
    }
}
