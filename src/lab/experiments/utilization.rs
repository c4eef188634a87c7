//! Link utilization vs the number of channels m of one connection, for each congestion
//! control, with a tiny drop-tail queue and with a 1 BDP queue; compared with Expression 5.3
//! (1 − β/2m, the ideal of m desynchronized channels) and Table 4.2 (AIMD bounds).

use std::time::Duration;

use serde_json::json;

use super::analysis::{aimd_bounds, desynchronized_utilization, BETA};
use super::plot::{line_chart, Axes, Series};
use super::{
    choose_ccs, describe, lateness, out_file, pct, plot_links, OwnedLab, Report, RunOptions,
};
use crate::lab::flows::FlowSpec;
use crate::lab::{LabError, LabSpec, QueueSize};
use crate::metrics::jain;

/// Congestion controls compared by default (those registered on the host).
pub const DEFAULT_CCS: &[&str] = &[
    "dmctcp",
    "cubic",
    "reno",
    "bbr",
    "highspeed",
    "htcp",
    "scalable",
    "bic",
];

struct Row {
    cc: String,
    queue: &'static str,
    queue_packets: u32,
    m: u16,
    goodput_bps: f64,
    utilization: f64,
    retransmits: u64,
    jain: Option<f64>,
}

/// Runs the experiment.
pub fn run(opts: &RunOptions, log: &mut dyn FnMut(&str)) -> Result<Report, LabError> {
    let (rate, rtt_ms, tiny, channels, seconds, warmup): (u64, u64, u32, Vec<u16>, f64, f64) =
        if opts.quick {
            (200_000_000, 20, 16, vec![1, 4], 4.0, 1.5)
        } else {
            (1_000_000_000, 60, 64, (1..=8).collect(), 15.0, 5.0)
        };
    let seconds = opts.seconds.unwrap_or(seconds);
    let channels = opts.channels.clone().unwrap_or(channels);
    let defaults: &[&str] = if opts.quick {
        &["reno", "cubic"]
    } else {
        DEFAULT_CCS
    };
    let (ccs, skipped) = choose_ccs(opts, defaults)?;
    let spec = LabSpec {
        name: opts.lab_name.clone(),
        rate_bps: rate,
        rtts: vec![Duration::from_millis(rtt_ms)],
        queue: QueueSize::Packets(tiny),
        ..LabSpec::default()
    };
    let bdp = spec.bdp_packets().ceil() as u32;
    let traced_m = *channels
        .iter()
        .find(|m| **m == 4 || **m == 5)
        .unwrap_or(&channels[0]);
    let mut lab = OwnedLab::up(&spec, opts)?;
    let mut rows = Vec::new();
    let mut traces = Vec::new();
    let queues: &[(&str, u32)] = if opts.tiny_only {
        &[("tiny", tiny)]
    } else {
        &[("tiny", tiny), ("1 BDP", bdp)]
    };
    for &(queue, packets) in queues {
        lab.0.set_queue(packets)?;
        for cc in &ccs {
            for &m in &channels {
                let mut flow = FlowSpec::new(cc, m, seconds);
                if queue == "tiny" && m == traced_m {
                    flow.trace = Some(out_file(opts, &format!("utilization-trace-{cc}.csv")));
                }
                let r = lab.0.run_flow(&flow)?;
                let goodput = r.goodput_after(warmup);
                let row = Row {
                    cc: cc.clone(),
                    queue,
                    queue_packets: packets,
                    m,
                    goodput_bps: goodput,
                    utilization: goodput / spec.goodput_ceiling_bps(),
                    retransmits: r.summary.retransmits,
                    jain: jain(&r.channel_goodputs()),
                };
                let group = match &r.summary.dmctcp {
                    None => String::new(),
                    Some(g) => format!(", dmctcp group {}", serde_json::json!(g)),
                };
                log(&format!(
                    "utilization: {cc} m={m} queue={queue} ({packets} packets): {:.1} Mbit/s = {}{group}",
                    goodput / 1e6,
                    pct(row.utilization)
                ));
                if flow.trace.is_some() {
                    traces.push((cc.clone(), r.trace));
                }
                rows.push(row);
            }
        }
    }
    let (late_p99, late_max) = lateness(&lab.0);
    drop(lab);

    let mut files = Vec::new();
    let plot = out_file(opts, "utilization-vs-channels.svg");
    let mut series: Vec<Series> = Vec::new();
    for &(queue, _) in queues {
        for cc in &ccs {
            let points = rows
                .iter()
                .filter(|r| r.queue == queue && &r.cc == cc)
                .map(|r| (r.m as f64, r.utilization * 100.0))
                .collect();
            series.push(Series::measured(format!("{cc}, {queue}"), points, true));
        }
    }
    series.push(Series::reference(
        "Expr. 5.3: 1 − β/2m (β = ½)",
        channels
            .iter()
            .map(|&m| (m as f64, desynchronized_utilization(m as u32, BETA) * 100.0))
            .collect(),
    ));
    line_chart(
        &plot,
        &Axes {
            title: &format!(
                "Link utilization vs channels: {} Mbit/s, {} ms, {} vs {} packets",
                rate / 1_000_000,
                rtt_ms,
                tiny,
                bdp
            ),
            x: "channels per connection (m)",
            y: "utilization (% of goodput ceiling)",
            y_range: Some((0.0, 105.0)),
        },
        &series,
    )?;
    files.push(plot);
    for (cc, trace) in &traces {
        let path = out_file(opts, &format!("utilization-cwnd-{cc}.svg"));
        let channels_seen = trace.iter().map(|r| r.channel).max().map_or(0, |c| c + 1);
        let series: Vec<Series> = (0..channels_seen)
            .map(|ch| {
                let points = trace
                    .iter()
                    .filter(|r| r.channel == ch)
                    .step_by(5)
                    .map(|r| (r.t, r.cwnd as f64))
                    .collect();
                Series::measured(format!("channel {ch}"), points, false)
            })
            .collect();
        line_chart(
            &path,
            &Axes {
                title: &format!("cwnd per channel: {cc}, m = {traced_m}, {tiny}-packet queue"),
                x: "seconds",
                y: "cwnd (segments)",
                y_range: None,
            },
            &series,
        )?;
        files.push(path);
        files.push(out_file(opts, &format!("utilization-trace-{cc}.csv")));
    }

    let mut md = format!(
        "# Utilization vs channels\n\nPath: {}; the 1 BDP runs use {} packets. One hsxfer connection of m channels (`bench`, channels started together, no pacing), {} s per run, utilization = goodput after {} s / goodput ceiling ({:.1} Mbit/s at this MTU). Delay-element lateness p99 {} µs, max {} µs.\n\n",
        describe(&spec, tiny),
        bdp,
        seconds,
        warmup,
        spec.goodput_ceiling_bps() / 1e6,
        late_p99,
        late_max
    );
    if !skipped.is_empty() {
        md += &format!(
            "Not registered on this host, so not run: {} (`hsxfer cc load` registers the bundled ones).\n\n",
            skipped.join(", ")
        );
    }
    md += "| cc | queue |";
    for m in &channels {
        md += &format!(" m={m} |");
    }
    md += "\n|---|---|";
    for _ in &channels {
        md += "---|";
    }
    md += "\n";
    for &(queue, _) in queues {
        for cc in &ccs {
            md += &format!("| {cc} | {queue} |");
            for m in &channels {
                let cell = rows
                    .iter()
                    .find(|r| r.queue == queue && &r.cc == cc && r.m == *m)
                    .map_or("–".into(), |r| pct(r.utilization));
                md += &format!(" {cell} |");
            }
            md += "\n";
        }
    }
    md += "| Expr. 5.3 (1 − β/2m) | ideal |";
    for m in &channels {
        md += &format!(" {} |", pct(desynchronized_utilization(*m as u32, BETA)));
    }
    md += "\n| Table 4.2 lowest (all synchronized) | AIMD |";
    for m in &channels {
        md += &format!(" {} |", pct(aimd_bounds(*m as u32).0));
    }
    md += "\n\n";
    md += &plot_links(&files);

    let json = json!({
        "experiment": "utilization",
        "quick": opts.quick,
        "rate_bps": rate,
        "rtt_ms": rtt_ms,
        "queue_tiny_packets": tiny,
        "queue_bdp_packets": bdp,
        "seconds": seconds,
        "warmup_s": warmup,
        "goodput_ceiling_bps": spec.goodput_ceiling_bps(),
        "lateness_p99_us": late_p99,
        "lateness_max_us": late_max,
        "skipped_ccs": skipped,
        "runs": rows.iter().map(|r| json!({
            "cc": r.cc, "queue": r.queue, "queue_packets": r.queue_packets, "channels": r.m,
            "goodput_bps": r.goodput_bps, "utilization": r.utilization,
            "expected_desynchronized": desynchronized_utilization(r.m as u32, BETA),
            "retransmits": r.retransmits, "fairness_jain": r.jain,
        })).collect::<Vec<_>>(),
    });
    Ok(Report {
        markdown: md,
        json,
        files,
    })
}
