//! Convergence (Cui 2013 Fig. 5.8): a second connection starts T seconds after the first
//! through the same bottleneck; the convergence time is how long until the second's
//! aggregate congestion window (1 s moving average) reaches 80 % of the first's.

use std::time::Duration;

use serde_json::json;

use super::analysis::{aggregate_cwnd, convergence_time, moving_average};
use super::fairness::channels_for;
use super::plot::{line_chart, Axes, Series};
use super::{choose_ccs, describe, lateness, out_file, plot_links, OwnedLab, Report, RunOptions};
use crate::lab::flows::FlowSpec;
use crate::lab::{Host, LabError, LabSpec, QueueSize};

/// Share of the first connection's window the second must reach.
pub const RATIO: f64 = 0.8;
/// Grid step of the aggregated windows, seconds.
const STEP: f64 = 0.1;

struct Row {
    cc: String,
    seconds_to_converge: Option<f64>,
    goodput_first: f64,
    goodput_second: f64,
}

/// Runs the experiment.
pub fn run(opts: &RunOptions, log: &mut dyn FnMut(&str)) -> Result<Report, LabError> {
    let (rate, rtt_ms, queue, start, seconds): (u64, u64, u32, f64, f64) = if opts.quick {
        (200_000_000, 20, 32, 2.0, 8.0)
    } else {
        (100_000_000, 100, 128, 20.0, 100.0)
    };
    let seconds = opts.seconds.unwrap_or(seconds).max(start + 2.0);
    let defaults: &[&str] = if opts.quick {
        &["reno", "cubic"]
    } else {
        &["reno", "cubic", "bbr", "dmctcp"]
    };
    let (ccs, skipped) = choose_ccs(opts, defaults)?;
    let spec = LabSpec {
        name: opts.lab_name.clone(),
        rate_bps: rate,
        rtts: vec![Duration::from_millis(rtt_ms)],
        queue: QueueSize::Packets(queue),
        senders: 2,
        ..LabSpec::default()
    };
    let lab = OwnedLab::up(&spec, opts)?;
    let mut rows = Vec::new();
    let mut files = Vec::new();
    for cc in &ccs {
        let mut a = FlowSpec::new(cc, channels_for(cc), seconds);
        a.trace = Some(out_file(opts, &format!("convergence-trace-{cc}-1.csv")));
        let mut b = FlowSpec::new(cc, channels_for(cc), seconds - start);
        b.from = Host::Sender(2);
        b.trace = Some(out_file(opts, &format!("convergence-trace-{cc}-2.csv")));
        let first = lab.0.start_flow(&a)?;
        std::thread::sleep(Duration::from_secs_f64(start));
        let second = lab.0.start_flow(&b)?;
        let offset = second.started.duration_since(first.started).as_secs_f64();
        let (ra, rb) = (first.wait()?, second.wait()?);
        let wa = moving_average(&aggregate_cwnd(&ra.trace, 0.0, STEP), 1.0);
        let wb = moving_average(&aggregate_cwnd(&rb.trace, offset, STEP), 1.0);
        let t = convergence_time(&wa, &wb, offset, RATIO);
        let row = Row {
            cc: cc.clone(),
            seconds_to_converge: t,
            goodput_first: ra.summary.goodput_bps,
            goodput_second: rb.summary.goodput_bps,
        };
        log(&format!(
            "convergence: {cc}: {}",
            t.map_or(format!("not within {:.0} s", seconds - start), |t| format!(
                "{t:.1} s"
            ))
        ));
        let path = out_file(opts, &format!("convergence-{cc}.svg"));
        line_chart(
            &path,
            &Axes {
                title: &format!(
                    "{cc}: aggregate cwnd (1 s average), second connection from {offset:.1} s"
                ),
                x: "seconds",
                y: "cwnd (segments)",
                y_range: None,
            },
            &[
                Series::measured("first connection", wa, false),
                Series::measured("second connection", wb, false),
            ],
        )?;
        files.push(path);
        for f in [&a.trace, &b.trace].into_iter().flatten() {
            let _ = std::fs::remove_file(f);
        }
        rows.push(row);
    }
    let (late_p99, late_max) = lateness(&lab.0);
    drop(lab);

    let mut md = format!(
        "# Convergence\n\nPath: {}. The second connection starts {start} s after the first; each ends at {seconds} s. Convergence time: from the second's start until its aggregate cwnd (1 s moving average) first reaches {:.0} % of the first's (Cui 2013 Fig. 5.8). DMCTCP connections have 5 channels, the others 1. Delay-element lateness p99 {late_p99} µs, max {late_max} µs.\n\n",
        describe(&spec, queue),
        RATIO * 100.0
    );
    if !skipped.is_empty() {
        md += &format!(
            "Not registered here, so not run: {}.\n\n",
            skipped.join(", ")
        );
    }
    md += "| cc | convergence time | first Mbit/s (whole run) | second Mbit/s (its run) |\n|---|---|---|---|\n";
    for r in &rows {
        md += &format!(
            "| {} | {} | {:.1} | {:.1} |\n",
            r.cc,
            r.seconds_to_converge
                .map_or(format!("> {:.0} s", seconds - start), |t| format!(
                    "{t:.1} s"
                )),
            r.goodput_first / 1e6,
            r.goodput_second / 1e6
        );
    }
    md += "\n";
    md += &plot_links(&files);
    let json = json!({
        "experiment": "convergence",
        "quick": opts.quick,
        "rate_bps": rate,
        "rtt_ms": rtt_ms,
        "queue_packets": queue,
        "second_start_s": start,
        "seconds": seconds,
        "ratio": RATIO,
        "lateness_p99_us": late_p99,
        "lateness_max_us": late_max,
        "skipped_ccs": skipped,
        "runs": rows.iter().map(|r| json!({
            "cc": r.cc, "convergence_s": r.seconds_to_converge,
            "goodput_first_bps": r.goodput_first, "goodput_second_bps": r.goodput_second,
        })).collect::<Vec<_>>(),
    });
    Ok(Report {
        markdown: md,
        json,
        files,
    })
}
