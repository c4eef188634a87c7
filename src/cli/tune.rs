//! `--tune auto|off|probe` for `copy` and `bench`: the library's settling
//! (`hsxfer::session::settle`), with what it did printed.

use hsxfer::probe::{Direction, Fixed};
use hsxfer::session::settle::{self, Profiled, Source};
use hsxfer::{TransferOptions, TransferReport};

use super::output::Mode;
use super::probe::{print_probe, Saved};

/// Settles `opts` (see [`settle::settle`]), printing the probe that ran first (with
/// `connection`, the options that reach the server, in its recommended command). Returns
/// the warnings (an unreadable profile, a probe's profile that could not be saved) as notes
/// of the transfer: they are shown with its other notes (`warning` events with `--json`)
/// and listed in its summary.
pub async fn settle(
    source: Source,
    opts: &mut TransferOptions,
    fixed: Fixed,
    target: (&str, u16),
    direction: Direction,
    mode: Mode,
    connection: &[String],
) -> anyhow::Result<(Profiled, Vec<String>)> {
    let (profiled, settled) = settle::settle(source, opts, fixed, target, direction).await?;
    let mut notes = Vec::new();
    if let Some((report, saved)) = &settled.probe {
        let saved = match saved {
            Ok(p) => Saved::At(p.clone()),
            Err(e) => {
                notes.push(client_note(e));
                Saved::Failed
            }
        };
        print_probe(mode, target.0, report, &saved, connection);
    }
    notes.extend(settled.warnings.iter().map(client_note));
    Ok((profiled, notes))
}

/// Saves what a finished transfer learned; a failure is a note of `report`.
pub fn learn(profiled: &Profiled, report: &mut TransferReport) {
    if let Err(e) = profiled.learn(report) {
        report.tuning.notes.push(client_note(e));
    }
}

/// A note of this host, worded as the transfer's own notes are.
fn client_note(what: impl std::fmt::Display) -> String {
    format!("client: {what}")
}
