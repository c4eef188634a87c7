//! This end's plan for a session, made from the path's RTT before the request: the transport
//! settings asked of the server, each channel's socket options, the stagger and the tuner.

use std::sync::Arc;
use std::time::Duration;

use super::{Client, PathRate, Tune};
use crate::channels::control::{OnlineTuning, Tuning};
use crate::error::Result;
use crate::session::mptcp_paths::PathManager;
use crate::session::report::{LiveStats, TuningReport};
use crate::session::tuning::{local_plan, online_tuner, LocalPlan, Side};
use crate::transport::subflow_pacing;
use crate::tuning::bdp::{self, BufferRequest};
use crate::tuning::desync::{
    effective_stagger, pacing_caps, stagger_offsets, PaceChoice, StaggerChoice,
};
use crate::tuning::online::{OnlineTuner, METER_CC};

impl Client {
    /// This end's plan for a path RTT: the transport settings asked of the server, each
    /// channel's socket options, the stagger, and the sending side's online tuner.
    pub(super) fn prepare(
        &self,
        rtt: Duration,
        path: PathFacts,
        pm: &PathManager,
        we_send: bool,
        live: &LiveStats,
    ) -> Result<Prepared> {
        let n = self.connections();
        let goodput = match self.opts.rate {
            PathRate::Given(wire) => Some(bdp::goodput_rate(wire, path.mss)),
            PathRate::Measured(g) | PathRate::Saved(g) => Some(g),
            PathRate::Unknown => None,
        };
        let (rate, rate_source) = match self.opts.rate {
            PathRate::Given(r) => (Some(r), "given"),
            PathRate::Measured(r) | PathRate::Saved(r) => (Some(r), "measured"),
            PathRate::Unknown => match path.link_speed {
                Some(r) => (Some(r), "interface"),
                None => (None, "unknown"),
            },
        };
        let online = self.online_request(goodput, pm);
        // The meter replaces an automatic stagger: the other channels start once the first
        // has measured the path, paced below its rate, so their slow starts cannot overshoot.
        let metered = online.as_ref().is_some_and(|o| o.pace);
        let stagger_choice = effective_stagger(self.opts.stagger, &self.opts.cc, metered);
        let stagger = stagger_offsets(stagger_choice, n, rtt, &mut rand::thread_rng());
        let mut tuning = self.tuning_request(rtt, rate, goodput, live.telemetry.tracing(), pm);
        tuning.online = online;
        tuning.stagger_us = stagger.iter().map(|d| d.as_micros() as u64).collect();
        let (side, tuner) = match we_send {
            true => (Side::Send, online_tuner(&tuning, n)),
            false => (Side::Receive, None),
        };
        let mut plan = local_plan(&tuning, side, n, "client", tuner.as_ref())?;
        plan.options.iter_mut().for_each(|o| {
            o.mptcp = self.opts.mptcp;
            o.userspace_pm = pm.userspace();
        });
        if self.opts.mptcp && self.opts.pace == PaceChoice::Auto {
            let why = match (subflow_pacing::available(), goodput, metered) {
                (false, _, _) => Some(
                    "the kernel refuses SO_MAX_PACING_RATE on MPTCP sockets, and pacing their \
                     subflows with a BPF program needs root",
                ),
                _ if pm.several() => Some(
                    "they run over several paths, whose rates differ, while a connection's \
                     cap is shared evenly by its subflows; give `pace` to cap each subflow",
                ),
                (true, None, false) => Some(
                    "the path's rate is unknown and no meter runs (`tune` off, or `stagger` \
                     given); give `rate` or `pace` to pace them",
                ),
                _ => None,
            };
            if let Some(why) = why {
                plan.notes
                    .push(format!("client: MPTCP subflows run unpaced: {why}"));
            }
        }
        let report = TuningReport {
            rtt_us: rtt.as_micros() as u64,
            rate_bps: rate,
            rate_source: rate_source.into(),
            buffer: describe_buffer(tuning.buffer),
            notes: plan.notes.clone(),
            origin: self.opts.origin.clone(),
            online: None,
        };
        Ok(Prepared {
            tuning,
            plan: Arc::new(plan),
            report,
            stagger,
            tuner,
        })
    }

    /// What the online tuner of the sending side may do, from the options; `None` with
    /// [`Tune::Off`].
    pub(super) fn online_request(
        &self,
        goodput: Option<u64>,
        pm: &PathManager,
    ) -> Option<OnlineTuning> {
        (self.opts.tune == Tune::Online).then(|| OnlineTuning {
            max_channels: match self.opts.mptcp {
                true => 1,
                false => self.opts.max_channels.max(self.opts.channels),
            },
            rate_bps: goodput,
            rate_saved: matches!(self.opts.rate, PathRate::Saved(_)),
            // An MPTCP connection is one channel to the tuner (its subflows' sum): its cap,
            // which its subflows share, is the meter's and then the tuner's.
            pace: self.pace(pm) == PaceChoice::Auto,
            meter: self.opts.stagger == StaggerChoice::Auto,
            // A congestion control the user chose meters the path itself.
            meter_cc: self.opts.cc.is_empty().then(|| METER_CC.to_string()),
            policy: self.opts.policy,
        })
    }

    /// The pacing asked for, per connection. A fixed cap is per channel, and the channels of
    /// an MPTCP connection are its subflows, which share its cap evenly. Without root, MPTCP
    /// subflows cannot be paced; over several paths, whose rates differ, only a fixed cap
    /// per subflow makes sense.
    fn pace(&self, pm: &PathManager) -> PaceChoice {
        match (self.opts.mptcp, self.opts.pace) {
            (false, p) => p,
            (true, _) if !subflow_pacing::available() => PaceChoice::Off,
            (true, PaceChoice::Fixed(c)) => PaceChoice::Fixed(c.saturating_mul(pm.subflows as u64)),
            (true, PaceChoice::Auto) if pm.several() => PaceChoice::Off,
            (true, p) => p,
        }
    }

    /// The transport settings of the request, for a path RTT and rate (buffers are sized to
    /// an estimated rate; pacing follows only a given or measured goodput rate).
    pub(super) fn tuning_request(
        &self,
        rtt: Duration,
        rate: Option<u64>,
        goodput: Option<u64>,
        trace: bool,
        pm: &PathManager,
    ) -> Tuning {
        let n = self.connections();
        Tuning {
            cc: self.opts.cc.clone(),
            buffer: bdp::request(self.opts.buffer, rate, rtt, n),
            pace: pacing_caps(self.pace(pm), n, goodput),
            stagger_us: vec![0; n as usize],
            rtt_us: rtt.as_micros() as u64,
            interval_ms: self.opts.interval.as_millis().clamp(10, u32::MAX as u128) as u32,
            trace,
            online: None,
        }
    }
}

/// What the control connection tells of the path before it authenticates.
#[derive(Clone, Copy)]
pub(super) struct PathFacts {
    /// The outgoing interface's link speed, bits/s (`open::interface_speed`).
    pub(super) link_speed: Option<u64>,
    /// The control connection's MSS, bytes (0 if unknown).
    pub(super) mss: u32,
}

/// This end's plan for the session, made before the request ([`Client::prepare`]).
pub(super) struct Prepared {
    pub(super) tuning: Tuning,
    pub(super) plan: Arc<LocalPlan>,
    pub(super) report: TuningReport,
    pub(super) stagger: Vec<Duration>,
    pub(super) tuner: Option<OnlineTuner>,
}

/// Says in words what a buffer request means.
fn describe_buffer(b: BufferRequest) -> String {
    match b {
        BufferRequest::Kernel => "kernel autotuning".into(),
        BufferRequest::Fixed(n) => format!("fixed request of {n} bytes per socket"),
        BufferRequest::Window(w) => format!(
            "sized to a window of {w} bytes per channel (BDP share x {})",
            bdp::HEADROOM
        ),
    }
}
