//! `--tune auto|off|probe` for `copy` and `bench`: the library's settling
//! (`hsxfer::session::settle`), with what it did printed.

use hsxfer::probe::{Direction, Fixed};
use hsxfer::session::settle::{self, Profiled, Source};
use hsxfer::{TransferOptions, TransferReport};

use super::output::Mode;
use super::probe::{print_probe, Saved};

/// Settles `opts` (see [`settle::settle`]), printing the probe that ran first (with
/// `connection`, the options that reach the server, in its recommended command) and warnings.
pub async fn settle(
    source: Source,
    opts: &mut TransferOptions,
    fixed: Fixed,
    target: (&str, u16),
    direction: Direction,
    mode: Mode,
    connection: &[String],
) -> anyhow::Result<Profiled> {
    let (profiled, settled) = settle::settle(source, opts, fixed, target, direction).await?;
    if let Some((report, saved)) = &settled.probe {
        let saved = match saved {
            Ok(p) => Saved::At(p.clone()),
            Err(e) => {
                eprintln!("hsxfer: warning: {e}");
                Saved::Failed
            }
        };
        print_probe(mode, target.0, report, &saved, connection);
    }
    for w in &settled.warnings {
        eprintln!("hsxfer: warning: {w}");
    }
    Ok(profiled)
}

/// Saves what a finished transfer learned; a failure is a warning.
pub fn learn(profiled: &Profiled, report: &TransferReport) {
    if let Err(e) = profiled.learn(report) {
        eprintln!("hsxfer: warning: {e}");
    }
}
