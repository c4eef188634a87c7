//! The research experiments (`hsxfer lab run NAME`): each builds labs of its own, runs hsxfer
//! bench flows across them with per-channel telemetry, and writes a markdown table, a JSON
//! file and SVG plots to the output directory.
//!
//! - [`utilization`]: link utilization vs channels, tiny queue vs 1 BDP (Cui 2013 Expr. 5.3,
//!   Table 4.2).
//! - [`sync`]: loss synchronization of n flows (Tables 4.1/4.3, Expr. 4.1/4.2).
//! - [`fairness`]: intra-protocol and RTT fairness, with and without background traffic
//!   (Cui 2013 §5.7); with `--against CC`, [`against`]: each control's share against one
//!   flow of CC.
//! - [`convergence`]: time for a second connection to reach 80 % of the first's window
//!   (Cui 2013 Fig. 5.8).
//! - [`probe`]: `hsxfer probe`'s pick and copies with no flags against an exhaustive sweep
//!   of congestion control × channels × pacing on five paths.

pub mod against;
pub mod analysis;
pub mod convergence;
pub mod fairness;
pub mod plot;
pub mod probe;
pub mod sync;
pub mod utilization;

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde_json::Value;

use super::{Lab, LabError, LabSpec, QueueSize};
use crate::transport::cc::CcCatalog;

/// Which experiment to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Experiment {
    /// Utilization vs channels.
    Utilization,
    /// Loss synchronization.
    Sync,
    /// Intra-protocol and RTT fairness.
    Fairness,
    /// Convergence of a late second connection.
    Convergence,
    /// The probe and tuning benchmark.
    Probe,
}

impl Experiment {
    /// Every experiment, in the order of the issue.
    pub const ALL: [Experiment; 5] = [
        Experiment::Utilization,
        Experiment::Sync,
        Experiment::Fairness,
        Experiment::Convergence,
        Experiment::Probe,
    ];
}

impl fmt::Display for Experiment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Experiment::Utilization => "utilization",
            Experiment::Sync => "sync",
            Experiment::Fairness => "fairness",
            Experiment::Convergence => "convergence",
            Experiment::Probe => "probe",
        })
    }
}

impl FromStr for Experiment {
    type Err = String;

    fn from_str(s: &str) -> Result<Experiment, String> {
        Experiment::ALL
            .into_iter()
            .find(|e| e.to_string() == s)
            .ok_or_else(|| {
                format!(
                    "unknown experiment '{s}': choose utilization, sync, fairness, convergence or probe"
                )
            })
    }
}

/// How to run an experiment.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The short form: small rate and RTT, few seconds per run.
    pub quick: bool,
    /// Output directory.
    pub out: PathBuf,
    /// The hsxfer program the labs run.
    pub program: PathBuf,
    /// Congestion controls to compare instead of the experiment's list.
    pub ccs: Option<Vec<String>>,
    /// Seconds per run instead of the experiment's.
    pub seconds: Option<f64>,
    /// Name of the labs the experiment builds.
    pub lab_name: String,
    /// Channel counts to run instead of the experiment's (utilization).
    pub channels: Option<Vec<u16>>,
    /// Only the tiny drop-tail queue, not the 1 BDP comparison (utilization).
    pub tiny_only: bool,
    /// Paths to run, by letter, instead of all (probe).
    pub paths: Option<Vec<String>>,
    /// The congestion control of the one flow each tested connection shares the path with
    /// (fairness: the inter-protocol form, [`against`]).
    pub against: Option<String>,
    /// The bottleneck's drop-tail queue instead of the experiment's (fairness `--against`).
    pub buffer: Option<QueueSize>,
    /// The tested connection runs as a copy with no flags would (fairness `--against`): the
    /// online tuner's meter and caps, buffers and stagger, from an empty profile cache,
    /// instead of its congestion control's rules alone.
    pub tuned: bool,
    /// The reference flow is paced by the kernel at its congestion control's own rate, as
    /// under the fq qdisc, instead of sending its windows at line rate (fairness `--against`).
    pub paced_reference: bool,
}

/// What an experiment produced.
#[derive(Debug, Clone)]
pub struct Report {
    /// The result table(s) in markdown, with the setup and the seed's numbers.
    pub markdown: String,
    /// The same results as JSON.
    pub json: Value,
    /// Files written (markdown, JSON, plots).
    pub files: Vec<PathBuf>,
}

/// Runs `experiment`, reporting progress lines through `log`, and writes its outputs.
pub fn run(
    experiment: Experiment,
    opts: &RunOptions,
    log: &mut dyn FnMut(&str),
) -> Result<Report, LabError> {
    std::fs::create_dir_all(&opts.out)
        .map_err(LabError::io(format!("creating {}", opts.out.display())))?;
    let mut report = match experiment {
        Experiment::Utilization => utilization::run(opts, log)?,
        Experiment::Sync => sync::run(opts, log)?,
        Experiment::Fairness => match &opts.against {
            Some(reference) => against::run(opts, reference, log)?,
            None => fairness::run(opts, log)?,
        },
        Experiment::Convergence => convergence::run(opts, log)?,
        Experiment::Probe => probe::run(opts, log)?,
    };
    let stem = match &opts.against {
        Some(reference) => format!("{experiment}-against-{reference}"),
        None => experiment.to_string(),
    };
    let md = opts.out.join(format!("{stem}.md"));
    let json = opts.out.join(format!("{stem}.json"));
    std::fs::write(&md, &report.markdown).map_err(LabError::io("writing the table"))?;
    std::fs::write(
        &json,
        serde_json::to_vec_pretty(&report.json).expect("results serialize"),
    )
    .map_err(LabError::io("writing the JSON"))?;
    report.files.insert(0, json);
    report.files.insert(0, md);
    Ok(report)
}

/// The congestion controls to compare: the user's list, or `defaults` filtered to those
/// this host has; the second list names defaults skipped because they are not registered.
pub fn choose_ccs(
    opts: &RunOptions,
    defaults: &[&str],
) -> Result<(Vec<String>, Vec<String>), LabError> {
    let catalog = read_catalog()?;
    if let Some(list) = &opts.ccs {
        check_available(&catalog, list)?;
        return Ok((list.clone(), Vec::new()));
    }
    let (have, skipped): (Vec<&str>, Vec<&str>) = defaults
        .iter()
        .partition(|c| catalog.available.iter().any(|a| a == *c));
    Ok((
        have.into_iter().map(str::to_string).collect(),
        skipped.into_iter().map(str::to_string).collect(),
    ))
}

/// Refuses a congestion control this host has not registered, saying how to register it.
pub fn require_available(ccs: &[String]) -> Result<(), LabError> {
    check_available(&read_catalog()?, ccs)
}

fn read_catalog() -> Result<CcCatalog, LabError> {
    CcCatalog::read().map_err(LabError::io("reading the congestion controls"))
}

fn check_available(catalog: &CcCatalog, ccs: &[String]) -> Result<(), LabError> {
    let Some(missing) = ccs.iter().find(|c| !catalog.available.contains(c)) else {
        return Ok(());
    };
    let fix = if crate::tuning::bundled::find(missing).is_some() {
        format!(
            " (hsxfer bundles it: register it first with `sudo hsxfer cc load {missing} --pin`)"
        )
    } else {
        String::new()
    };
    Err(LabError::Invalid(format!(
        "congestion control '{missing}' is not available; available: {}{fix}",
        catalog.available.join(" ")
    )))
}

/// A lab that an experiment owns: removed when dropped, whatever happened, or by
/// [`Lab::remove_claimed`] when a signal stops the process.
pub struct OwnedLab(pub Lab);

impl OwnedLab {
    /// Builds the lab for an experiment (no self-check: experiments report their own
    /// numbers, and the emulator's lateness is in every result).
    pub fn up(spec: &LabSpec, opts: &RunOptions) -> Result<OwnedLab, LabError> {
        Ok(OwnedLab(Lab::up(spec, &opts.program)?))
    }
}

impl Drop for OwnedLab {
    fn drop(&mut self) {
        let _ = self.0.teardown();
    }
}

/// Delay-element release lateness of a lab so far (p99 and max, µs).
pub fn lateness(lab: &Lab) -> (u64, u64) {
    crate::lab::element::read_stats(&lab.element_stats_path())
        .map(|e| {
            (
                e.queues
                    .iter()
                    .map(|q| q.lateness_p99_us)
                    .max()
                    .unwrap_or(0),
                e.queues
                    .iter()
                    .map(|q| q.lateness_max_us)
                    .max()
                    .unwrap_or(0),
            )
        })
        .unwrap_or((0, 0))
}

/// `out/NAME` as a path for a plot or trace.
pub fn out_file(opts: &RunOptions, name: &str) -> PathBuf {
    opts.out.join(name)
}

/// A markdown line describing a lab's path.
pub fn describe(spec: &LabSpec, queue_packets: u32) -> String {
    format!(
        "{} Mbit/s bottleneck, RTT {} ms, drop-tail queue {} packets ({:.3} BDP), MTU {}",
        spec.rate_bps / 1_000_000,
        spec.rtt_of(1).as_millis(),
        queue_packets,
        queue_packets as f64 / spec.bdp_packets(),
        spec.mtu
    )
}

/// Percent with one decimal.
pub fn pct(x: f64) -> String {
    format!("{:.1} %", x * 100.0)
}

/// Relative path of a written file for links in the markdown.
pub fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The markdown line linking the plots (`.svg`) among `files`: "Plots: [a.svg](a.svg), …".
pub fn plot_links(files: &[PathBuf]) -> String {
    let links: Vec<String> = files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "svg"))
        .map(|f| format!("[{0}]({0})", file_name(f)))
        .collect();
    format!("Plots: {}\n", links.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plot_links_name_only_the_plots() {
        let files = [
            PathBuf::from("/out/sync-distribution-2.svg"),
            PathBuf::from("/out/utilization-trace-cubic.csv"),
            PathBuf::from("/out/utilization-cubic.svg"),
        ];
        assert_eq!(
            plot_links(&files),
            "Plots: [sync-distribution-2.svg](sync-distribution-2.svg), \
             [utilization-cubic.svg](utilization-cubic.svg)\n"
        );
    }
}
