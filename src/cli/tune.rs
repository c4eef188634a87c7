//! `--tune auto|off|probe` for `copy` and `bench`: where a transfer's settings come from
//! when the user gives none, and saving what a long enough transfer learned.

use hsxfer::probe::{
    apply_profile, learned_profile, probe, unix_now, Direction, Fixed, ProbeOptions, ProfileError,
    ProfileStore, PROFILE_MAX_AGE_S,
};
use hsxfer::{TransferOptions, TransferReport, Tune};

use super::output::Mode;
use super::probe::{print_probe, DEFAULT_BUDGET};

/// What the user chose with `--tune`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TuneArg {
    /// Use the saved profile of this server and direction if there is one, and tune online.
    Auto,
    /// Probe the path first (saving the profile), then transfer with it.
    Probe,
    /// Neither: the settings planned at the start are final.
    Off,
}

/// Parses `--tune`.
pub fn parse_tune(s: &str) -> Result<TuneArg, String> {
    match s {
        "auto" => Ok(TuneArg::Auto),
        "probe" => Ok(TuneArg::Probe),
        "off" => Ok(TuneArg::Off),
        _ => Err("use auto, probe or off".into()),
    }
}

/// The port a profile of a host reached with `copy --ssh` is kept under.
pub const SSH_PROFILE_PORT: u16 = 0;

/// Where a transfer's profile lives, once its options are settled.
pub struct Profiled {
    store: Option<ProfileStore>,
    server: String,
    port: u16,
    direction: Direction,
}

/// Settles `opts` for a transfer to `host` in `direction`: with `auto`, fills in from the
/// saved profile what the user did not fix; with `probe`, probes first (and saves); with
/// `off`, turns online tuning off. Profiles are kept under `profile_port`: the server's
/// port, or [`SSH_PROFILE_PORT`] for the one-shot servers of `copy --ssh`, whose ports
/// change every time.
pub async fn settle(
    tune: TuneArg,
    opts: &mut TransferOptions,
    fixed: Fixed,
    (host, profile_port): (&str, u16),
    direction: Direction,
    mode: Mode,
) -> anyhow::Result<Profiled> {
    let mut p = Profiled {
        store: None,
        server: host.to_string(),
        port: profile_port,
        direction,
    };
    if tune == TuneArg::Off {
        opts.tune = Tune::Off;
        return Ok(p);
    }
    p.store = ProfileStore::for_user();
    let Some(store) = &p.store else {
        return Ok(p);
    };
    let profile = if tune == TuneArg::Probe {
        let report = probe(
            host,
            &ProbeOptions {
                port: opts.port,
                auth: opts.auth.clone(),
                budget: DEFAULT_BUDGET,
                direction,
                policy: opts.policy,
            },
            &|_| {},
        )
        .await?;
        let profile = report.profile(host, profile_port);
        let saved = store.save(&profile).map_err(anyhow::Error::from);
        print_probe(mode, host, &report, saved.as_ref().ok());
        Some(profile)
    } else {
        match store.load(host, profile_port, direction) {
            Ok(found) => {
                found.filter(|f| unix_now().saturating_sub(f.measured_at) < PROFILE_MAX_AGE_S)
            }
            Err(e @ ProfileError::Corrupt { .. }) => {
                eprintln!("hsxfer: warning: {e}");
                None
            }
            Err(e) => return Err(e.into()),
        }
    };
    if let Some(profile) = profile {
        let origin = apply_profile(&profile, opts, fixed, unix_now());
        opts.origin.push(origin);
    }
    Ok(p)
}

impl Profiled {
    /// Saves what a finished transfer learned about the path (long enough transfers whose
    /// tuner knew the rate only); a failure to save is a warning.
    pub fn learn(&self, report: &TransferReport) {
        let (Some(store), Some(profile)) = (
            &self.store,
            learned_profile(report, &self.server, self.port, self.direction),
        ) else {
            return;
        };
        if let Err(e) = store.save(&profile) {
            eprintln!("hsxfer: warning: {e}");
        }
    }
}
