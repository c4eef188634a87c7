//! Intra-protocol and RTT fairness (Cui 2013 §5.7.2–5.7.3): two connections of the same
//! congestion control share the bottleneck, one at a fixed RTT and the other at a varied RTT
//! (equal RTTs give intra-protocol fairness), with and without background traffic; Jain's
//! index of their goodputs.

use std::time::Duration;

use serde_json::json;

use super::plot::{line_chart, Axes, Series};
use super::{
    choose_ccs, describe, file_name, lateness, out_file, pct, OwnedLab, Report, RunOptions,
};
use crate::lab::flows::FlowSpec;
use crate::lab::{Host, LabError, LabSpec, QueueSize};
use crate::metrics::jain;

/// Channels per connection: DMCTCP is a multi-channel connection (m = 5, Cui 2013's choice);
/// the others are single TCP flows.
pub fn channels_for(cc: &str) -> u16 {
    if crate::tuning::models::dmctcp::grouped(cc) {
        5
    } else {
        1
    }
}

struct Row {
    cc: String,
    background: bool,
    rtt_fixed_ms: u64,
    rtt_other_ms: u64,
    goodput_fixed: f64,
    goodput_other: f64,
    jain: f64,
    utilization: f64,
}

/// Runs the experiment.
pub fn run(opts: &RunOptions, log: &mut dyn FnMut(&str)) -> Result<Report, LabError> {
    let (rate, fixed_ms, others, queue, seconds, warmup): (u64, u64, Vec<u64>, u32, f64, f64) =
        if opts.quick {
            (200_000_000, 20, vec![20, 40], 32, 5.0, 1.5)
        } else {
            (1_000_000_000, 120, vec![20, 60, 120, 240], 64, 20.0, 5.0)
        };
    let seconds = opts.seconds.unwrap_or(seconds);
    let defaults: &[&str] = if opts.quick {
        &["reno", "cubic"]
    } else {
        &["reno", "cubic", "bbr", "dmctcp"]
    };
    let (ccs, skipped) = choose_ccs(opts, defaults)?;
    let mut rows = Vec::new();
    let mut lateness_max = (0, 0);
    let mut first_spec = None;
    for &other in &others {
        // Sender 1: fixed RTT; sender 2: varied; sender 3: background traffic.
        let spec = LabSpec {
            name: opts.lab_name.clone(),
            rate_bps: rate,
            rtts: vec![
                Duration::from_millis(fixed_ms),
                Duration::from_millis(other),
                Duration::from_millis(fixed_ms),
            ],
            queue: QueueSize::Packets(queue),
            senders: 3,
            ..LabSpec::default()
        };
        let lab = OwnedLab::up(&spec, opts)?;
        for cc in &ccs {
            for background in [false, true] {
                let _bg = if background {
                    Some(lab.0.start_background(Host::Sender(3))?)
                } else {
                    None
                };
                let mut a = FlowSpec::new(cc, channels_for(cc), seconds);
                a.from = Host::Sender(1);
                let mut b = a.clone();
                b.from = Host::Sender(2);
                let ra = lab.0.start_flow(&a)?;
                let rb = lab.0.start_flow(&b)?;
                let (ra, rb) = (ra.wait()?, rb.wait()?);
                let (ga, gb) = (ra.goodput_after(warmup), rb.goodput_after(warmup));
                let row = Row {
                    cc: cc.clone(),
                    background,
                    rtt_fixed_ms: fixed_ms,
                    rtt_other_ms: other,
                    goodput_fixed: ga,
                    goodput_other: gb,
                    jain: jain(&[ga, gb]).unwrap_or(0.0),
                    utilization: (ga + gb) / spec.goodput_ceiling_bps(),
                };
                log(&format!(
                    "fairness: {cc} {fixed_ms} ms vs {other} ms{}: {:.0} / {:.0} Mbit/s, Jain {:.3}",
                    if background { " + background" } else { "" },
                    ga / 1e6,
                    gb / 1e6,
                    row.jain
                ));
                rows.push(row);
            }
        }
        let l = lateness(&lab.0);
        lateness_max = (lateness_max.0.max(l.0), lateness_max.1.max(l.1));
        first_spec.get_or_insert(spec);
    }
    let spec = first_spec.expect("at least one RTT");

    let path = out_file(opts, "fairness-rtt.svg");
    let mut series = Vec::new();
    for cc in &ccs {
        for background in [false, true] {
            let points = rows
                .iter()
                .filter(|r| &r.cc == cc && r.background == background)
                .map(|r| (r.rtt_other_ms as f64, r.jain))
                .collect();
            let label = format!("{cc}{}", if background { " + background" } else { "" });
            series.push(Series::measured(label, points, true));
        }
    }
    line_chart(
        &path,
        &Axes {
            title: &format!(
                "Jain's index of two connections, one at {fixed_ms} ms, the other at x ms"
            ),
            x: "RTT of the second connection (ms)",
            y: "Jain's fairness index",
            y_range: Some((0.5, 1.02)),
        },
        &series,
    )?;

    let mut md = format!(
        "# Intra-protocol and RTT fairness\n\nPath: {}; connection A at {fixed_ms} ms (sender 1), connection B at the RTT in the table (sender 2); {} s per run, goodput after {} s. DMCTCP connections have 5 channels, the others 1. Background: short TCP flows (exponential gaps, Pareto α = 1.5 sizes) at 1.65 % and a UDP flow at 3 % of the rate from sender 3 (Cui 2013 §5.6). Equal RTTs are the intra-protocol case. Delay-element lateness p99 {} µs, max {} µs.\n\n",
        describe(&spec, queue),
        seconds,
        warmup,
        lateness_max.0,
        lateness_max.1
    );
    if !skipped.is_empty() {
        md += &format!(
            "Not registered here, so not run: {}.\n\n",
            skipped.join(", ")
        );
    }
    md += "| cc | background | RTT A | RTT B | A Mbit/s | B Mbit/s | Jain | utilization |\n|---|---|---|---|---|---|---|---|\n";
    for r in &rows {
        md += &format!(
            "| {} | {} | {} ms | {} ms | {:.0} | {:.0} | {:.3} | {} |\n",
            r.cc,
            if r.background { "yes" } else { "no" },
            r.rtt_fixed_ms,
            r.rtt_other_ms,
            r.goodput_fixed / 1e6,
            r.goodput_other / 1e6,
            r.jain,
            pct(r.utilization)
        );
    }
    md += &format!("\nPlot: [{0}]({0})\n", file_name(&path));
    let json = json!({
        "experiment": "fairness",
        "quick": opts.quick,
        "rate_bps": rate,
        "queue_packets": queue,
        "seconds": seconds,
        "warmup_s": warmup,
        "lateness_p99_us": lateness_max.0,
        "lateness_max_us": lateness_max.1,
        "skipped_ccs": skipped,
        "runs": rows.iter().map(|r| json!({
            "cc": r.cc, "background": r.background, "rtt_a_ms": r.rtt_fixed_ms,
            "rtt_b_ms": r.rtt_other_ms, "goodput_a_bps": r.goodput_fixed,
            "goodput_b_bps": r.goodput_other, "fairness_jain": r.jain,
            "utilization": r.utilization,
        })).collect::<Vec<_>>(),
    });
    Ok(Report {
        markdown: md,
        json,
        files: vec![path],
    })
}
