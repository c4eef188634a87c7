//! Inter-protocol share (`lab run fairness --against CC`): one connection of each congestion
//! control under test (DMCTCP with 5 channels, the others with 1) shares the bottleneck with
//! one flow of the reference control, started together at the same RTT, on the tiny-queue
//! path of the utilization experiment (or the queue given by `--buffer`). Reported: the tested
//! connection's share of the two goodputs, their total against the path's ceiling, and the
//! tested one's share relative to a fair half ("1.33×" is a third more than half).
//!
//! By default both run their congestion control's rules alone (no pacing, no stagger, kernel
//! buffers). `--tuned` runs the tested connection as a copy with no flags would (the online
//! tuner's meter and caps, from an empty profile cache), which is what issue 13's benchmark
//! names; `--paced-reference` has the kernel pace the reference flow at its congestion
//! control's own rate, as the fq qdisc would: one unpaced flow's line-rate bursts overflow a
//! tiny queue by themselves, so without it the reference cannot take a fair share there
//! whatever the tested connection does.

use std::time::Duration;

use serde_json::json;

use super::{
    choose_ccs, describe, fairness::channels_for, lateness, pct, require_available, OwnedLab,
    Report, RunOptions,
};
use crate::channels::telemetry::TunerReport;
use crate::lab::flows::FlowSpec;
use crate::lab::{Host, LabError, LabSpec, QueueSize};
use crate::tuning::defaults;

/// A copy's defaults, which [`FlowSpec`] would otherwise turn off.
const TUNED: [&str; 6] = ["--buffer", "auto", "--stagger", "auto", "--pace", "auto"];
/// A pacing cap far above the path: the kernel then paces the flow at its congestion
/// control's rate (twice cwnd/srtt in slow start, 1.2 times after), as fq does.
const PACED: [&str; 2] = ["--pace", "10G"];

struct Row {
    cc: String,
    channels: u16,
    goodput: f64,
    goodput_reference: f64,
    utilization: f64,
    /// What the tested connection's online tuner measured and decided (with `--tuned`).
    tuner: Option<TunerReport>,
}

impl Row {
    /// The tested connection's fraction of the two goodputs.
    fn share(&self) -> f64 {
        self.goodput / (self.goodput + self.goodput_reference).max(1.0)
    }
}

/// Runs every chosen congestion control against one `reference` flow.
pub fn run(
    opts: &RunOptions,
    reference: &str,
    log: &mut dyn FnMut(&str),
) -> Result<Report, LabError> {
    let (rate, rtt_ms, tiny, seconds, warmup): (u64, u64, u32, f64, f64) = if opts.quick {
        (200_000_000, 20, 16, 6.0, 1.5)
    } else {
        (1_000_000_000, 60, 64, 60.0, 5.0)
    };
    let seconds = opts.seconds.unwrap_or(seconds);
    let defaults: &[&str] = if opts.quick {
        &["reno"]
    } else {
        &["dmctcp", "cubic", "bbr"]
    };
    let (ccs, skipped) = choose_ccs(opts, defaults)?;
    require_available(&[reference.to_string()])?;
    let rtt = Duration::from_millis(rtt_ms);
    let spec = LabSpec {
        name: opts.lab_name.clone(),
        rate_bps: rate,
        rtts: vec![rtt, rtt],
        queue: opts.buffer.unwrap_or(QueueSize::Packets(tiny)),
        senders: 2,
        ..LabSpec::default()
    };
    let queue = spec.queue_packets();
    let lab = OwnedLab::up(&spec, opts)?;
    let mut rows = Vec::new();
    let cache = lab.0.dir().join("cache");
    for cc in &ccs {
        // Tuned, a control other than DMCTCP runs as a copy with no flags: the default
        // count, which the tuner may raise. DMCTCP keeps issue 13's `-n 5`.
        let may_grow = opts.tuned && opts.channels.is_none() && channels_for(cc) == 1;
        let channels = match &opts.channels {
            Some(m) => m[0],
            None if may_grow => defaults::CHANNELS,
            None => channels_for(cc),
        };
        let mut tested = FlowSpec::new(cc, channels, seconds);
        tested.count_may_grow = may_grow;
        if opts.tuned {
            tested.extra = TUNED.iter().map(|a| a.to_string()).collect();
            // A profile saved by the run before would start this one with its rate.
            let _ = std::fs::remove_dir_all(&cache);
        }
        let mut against = FlowSpec::new(reference, 1, seconds);
        against.from = Host::Sender(2);
        if opts.paced_reference {
            against.extra = PACED.iter().map(|a| a.to_string()).collect();
        }
        let (a, b) = (lab.0.start_flow(&tested)?, lab.0.start_flow(&against)?);
        let (a, b) = (a.wait()?, b.wait()?);
        let (ga, gb) = (a.goodput_after(warmup), b.goodput_after(warmup));
        let tuner = a.summary.tuning.online.clone();
        let row = Row {
            cc: cc.clone(),
            channels: tuner.as_ref().map_or(tested.channels, |t| t.channels),
            goodput: ga,
            goodput_reference: gb,
            utilization: (ga + gb) / spec.goodput_ceiling_bps(),
            tuner,
        };
        log(&format!(
            "fairness: {cc} ×{} against one {reference} flow: {:.0} / {:.0} Mbit/s, share {}, total {}",
            row.channels,
            ga / 1e6,
            gb / 1e6,
            pct(row.share()),
            pct(row.utilization)
        ));
        rows.push(row);
    }
    let (late_p99, late_max) = lateness(&lab.0);
    drop(lab);

    let tested_how = match opts.tuned {
        true => "with a copy's defaults (the online tuner's meter and pacing caps, buffers sized by it, staggered starts; empty profile cache; DMCTCP with `-n 5`, the others from the default 4 channels, which the tuner may raise: the table gives the count at the end)",
        false => "with its rules alone (no pacing, no stagger, kernel buffers; DMCTCP with 5 channels, the others with 1)",
    };
    let reference_how = match opts.paced_reference {
        true => "paced by the kernel at its congestion control's rate (`--pace 10G`, as under fq)",
        false => "unpaced",
    };
    let mut md = format!(
        "# Share against one {reference} flow\n\nPath: {}. Connection A (sender 1) runs the congestion control in the table {tested_how}; connection B (sender 2) is one {reference} flow, {reference_how}; same RTT, started together; {seconds} s per run, goodput after {warmup} s. Share = A / (A + B); a fair share is 50 %. Delay-element lateness p99 {late_p99} µs, max {late_max} µs.\n\n",
        describe(&spec, queue)
    );
    if !skipped.is_empty() {
        md += &format!(
            "Not registered here, so not run: {}.\n\n",
            skipped.join(", ")
        );
    }
    md += &format!(
        "| A | channels | A Mbit/s | {reference} Mbit/s | A's share | × fair share | total |\n|---|---|---|---|---|---|---|\n"
    );
    for r in &rows {
        md += &format!(
            "| {} | {} | {:.0} | {:.0} | {} | {:.2}× | {} |\n",
            r.cc,
            r.channels,
            r.goodput / 1e6,
            r.goodput_reference / 1e6,
            pct(r.share()),
            2.0 * r.share(),
            pct(r.utilization)
        );
    }
    for (r, t) in rows.iter().filter_map(|r| r.tuner.as_ref().map(|t| (r, t))) {
        md += &format!(
            "\n{}'s tuner: estimate {} at the end, channels {}, random loss {}; its {} decisions are in the JSON.\n",
            r.cc,
            t.rate_bps
                .map_or("none".to_string(), |b| format!("{:.0} Mbit/s", b as f64 / 1e6)),
            t.channels,
            if t.lossy { "declared" } else { "not declared" },
            t.decisions.len()
        );
    }
    let json = json!({
        "experiment": "fairness",
        "against": reference,
        "tuned": opts.tuned,
        "reference_paced": opts.paced_reference,
        "quick": opts.quick,
        "rate_bps": rate,
        "rtt_ms": rtt_ms,
        "queue_packets": queue,
        "seconds": seconds,
        "warmup_s": warmup,
        "goodput_ceiling_bps": spec.goodput_ceiling_bps(),
        "lateness_p99_us": late_p99,
        "lateness_max_us": late_max,
        "skipped_ccs": skipped,
        "runs": rows.iter().map(|r| json!({
            "cc": r.cc, "channels": r.channels, "goodput_bps": r.goodput,
            "goodput_reference_bps": r.goodput_reference, "share": r.share(),
            "utilization": r.utilization, "tuner": r.tuner,
        })).collect::<Vec<_>>(),
    });
    Ok(Report {
        markdown: md,
        json,
        files: Vec::new(),
    })
}
