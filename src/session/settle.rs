//! Where a transfer's settings come from when the caller gives none: the saved profile of the
//! server and direction, a probe run first, or nothing; and saving what a long enough transfer
//! learned. `hsxfer copy --tune auto|probe|off` and the Python package's `tune=` both use it.

use std::path::PathBuf;

use super::client::{TransferOptions, Tune};
use super::probe::{
    apply_profile, learned_profile, probe, unix_now, Fixed, ProbeOptions, ProbeReport,
    PROFILE_MAX_AGE_S,
};
use super::report::TransferReport;
use crate::error::Result;
use crate::fsio::profiles::{ProfileError, ProfileStore};
use crate::tuning::probe::Direction;

/// The port a profile of a host reached through SSH is kept under: its one-shot servers'
/// ports change every time.
pub const SSH_PROFILE_PORT: u16 = 0;

/// Where a transfer's settings come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Source {
    /// The saved profile of this server and direction, if there is a fresh one; the transfer
    /// tunes itself online either way.
    #[default]
    Profile,
    /// Probe the path first (saving the profile), then transfer with it.
    Probe,
    /// Neither: the settings planned at the start are final.
    Off,
}

impl std::str::FromStr for Source {
    type Err = String;

    /// `auto` ([`Source::Profile`]), `probe` or `off`, as `hsxfer copy --tune` takes them.
    fn from_str(s: &str) -> std::result::Result<Source, String> {
        match s {
            "auto" => Ok(Source::Profile),
            "probe" => Ok(Source::Probe),
            "off" => Ok(Source::Off),
            _ => Err("use auto, probe or off".into()),
        }
    }
}

/// Where a settled transfer's profile lives, so what it learns can be saved.
#[derive(Debug)]
pub struct Profiled {
    store: Option<ProfileStore>,
    server: String,
    port: u16,
    direction: Direction,
}

/// What settling did besides changing the options.
#[derive(Debug, Default)]
pub struct Settled {
    /// The probe that ran first, and where its profile was saved (or why it was not).
    pub probe: Option<(ProbeReport, std::result::Result<PathBuf, ProfileError>)>,
    /// Problems worth a warning (an unreadable profile, which is then ignored).
    pub warnings: Vec<String>,
}

/// Settles `opts` for a transfer to `host` in `direction`: fills in from the saved profile
/// (or a probe's) what `fixed` says the caller did not set, or turns online tuning off.
/// Profiles are kept under `profile_port`: the server's port, or [`SSH_PROFILE_PORT`].
pub async fn settle(
    source: Source,
    opts: &mut TransferOptions,
    fixed: Fixed,
    (host, profile_port): (&str, u16),
    direction: Direction,
) -> Result<(Profiled, Settled)> {
    let mut p = Profiled {
        store: None,
        server: host.to_string(),
        port: profile_port,
        direction,
    };
    let mut settled = Settled::default();
    if source == Source::Off {
        opts.tune = Tune::Off;
        return Ok((p, settled));
    }
    p.store = ProfileStore::for_user();
    let Some(store) = &p.store else {
        return Ok((p, settled));
    };
    let profile = if source == Source::Probe {
        let report = probe(
            host,
            &ProbeOptions {
                port: opts.port,
                auth: opts.auth.clone(),
                security: opts.security.clone(),
                budget: None,
                direction,
                policy: opts.policy,
                mptcp: opts.mptcp,
            },
            &|_| {},
        )
        .await?;
        let profile = report.profile(host, profile_port);
        settled.probe = Some((report, store.save(&profile)));
        Some(profile)
    } else {
        match store.load(host, profile_port, direction) {
            Ok(found) => {
                found.filter(|f| unix_now().saturating_sub(f.measured_at) < PROFILE_MAX_AGE_S)
            }
            Err(e @ ProfileError::Corrupt { .. }) => {
                settled.warnings.push(e.to_string());
                None
            }
            Err(e) => return Err(e.into()),
        }
    };
    if let Some(profile) = profile {
        let origin = apply_profile(&profile, opts, fixed, unix_now());
        opts.origin.push(origin);
    }
    Ok((p, settled))
}

impl Profiled {
    /// Saves what a finished transfer learned about the path (long enough transfers whose
    /// tuner knew the rate only). Returns the error of a failed save, for a warning.
    pub fn learn(&self, report: &TransferReport) -> std::result::Result<(), ProfileError> {
        let (Some(store), Some(profile)) = (
            &self.store,
            learned_profile(report, &self.server, self.port, self.direction),
        ) else {
            return Ok(());
        };
        store.save(&profile).map(drop)
    }
}
