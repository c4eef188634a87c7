//! Loss synchronization of n concurrent flows (Cui 2013 §4.3–4.5): n channels of one bench
//! connection share a bottleneck with a 5 % BDP drop-tail queue (the seed's setting) at the
//! seed's 60 ms. The rate is 100 Mbit/s, not 1 Gbit/s: a Reno congestion epoch grows with the
//! window (about 150 s for 2 flows at 1 Gbit/s × 60 ms), so a run of tens of seconds at
//! 1 Gbit/s sees one or two congestion events, where the seed averaged 3000 s; loss
//! events from the 10 ms cwnd traces after a warm-up are grouped into congestion events,
//! giving the distribution of how many flows lose per event (Tables 4.1/4.3) and the
//! per-flow and global synchronization rates (Expressions 4.1, 4.2).

use std::time::Duration;

use serde_json::json;

use super::analysis::{grouping_window, loss_events, seed_distribution};
use super::plot::{line_chart, Axes, Series};
use super::{
    choose_ccs, describe, lateness, out_file, pct, plot_links, OwnedLab, Report, RunOptions,
};
use crate::lab::flows::FlowSpec;
use crate::lab::{LabError, LabSpec, QueueSize};
use crate::metrics::{loss_sync, SyncReport};

struct Row {
    cc: String,
    n: u16,
    utilization: f64,
    sync: Option<SyncReport>,
}

/// Runs the experiment.
pub fn run(opts: &RunOptions, log: &mut dyn FnMut(&str)) -> Result<Report, LabError> {
    let (rate, rtt_ms, flows, seconds, warmup): (u64, u64, Vec<u16>, f64, f64) = if opts.quick {
        (200_000_000, 20, vec![2, 3], 5.0, 1.5)
    } else {
        (100_000_000, 60, vec![2, 3, 6, 12], 40.0, 5.0)
    };
    let seconds = opts.seconds.unwrap_or(seconds);
    let (ccs, skipped) = choose_ccs(opts, &["reno", "cubic", "dmctcp"])?;
    let spec = LabSpec {
        name: opts.lab_name.clone(),
        rate_bps: rate,
        rtts: vec![Duration::from_millis(rtt_ms)],
        queue: QueueSize::Bdp(0.05),
        ..LabSpec::default()
    };
    let lab = OwnedLab::up(&spec, opts)?;
    let queue = lab.0.state.queue_packets;
    let mut rows = Vec::new();
    for cc in &ccs {
        for &n in &flows {
            let mut flow = FlowSpec::new(cc, n, seconds);
            flow.trace = Some(out_file(opts, &format!("sync-trace-{cc}-{n}.csv")));
            let r = lab.0.run_flow(&flow)?;
            let events = loss_events(&r.trace, n as usize, warmup);
            let window = grouping_window(&r.trace, rtt_ms as f64 / 1e3);
            let sync = loss_sync(&events, n as usize, window);
            let utilization = r.goodput_after(warmup) / spec.goodput_ceiling_bps();
            log(&format!(
                "sync: {cc} n={n}: {} congestion events, global rate {}, utilization {}",
                sync.as_ref().map_or(0, |s| s.congestion_events),
                sync.as_ref().map_or("–".into(), |s| pct(s.global)),
                pct(utilization)
            ));
            let _ = std::fs::remove_file(flow.trace.as_ref().expect("traced"));
            rows.push(Row {
                cc: cc.clone(),
                n,
                utilization,
                sync,
            });
        }
    }
    let (late_p99, late_max) = lateness(&lab.0);
    drop(lab);

    let share = |s: &SyncReport, j: usize| {
        let total: usize = s.distribution.iter().sum();
        if total == 0 {
            0.0
        } else {
            s.distribution.get(j).copied().unwrap_or(0) as f64 / total as f64
        }
    };
    let mut files = Vec::new();
    for &n in &flows {
        let path = out_file(opts, &format!("sync-distribution-{n}.svg"));
        let mut series = Vec::new();
        for r in rows.iter().filter(|r| r.n == n) {
            if let Some(s) = &r.sync {
                let points = (0..n as usize)
                    .map(|j| ((j + 1) as f64, share(s, j) * 100.0))
                    .collect();
                series.push(Series::measured(r.cc.clone(), points, true));
            }
        }
        for cc in &ccs {
            if let Some(d) = seed_distribution(cc, n as usize) {
                let points = d
                    .iter()
                    .enumerate()
                    .map(|(j, p)| ((j + 1) as f64, p * 100.0))
                    .collect();
                series.push(Series::reference(format!("Cui 2013, {cc}"), points));
            }
        }
        if series.is_empty() {
            continue;
        }
        line_chart(
            &path,
            &Axes {
                title: &format!("Flows losing per congestion event, n = {n}"),
                x: "flows losing in the event",
                y: "% of congestion events",
                y_range: Some((0.0, 100.0)),
            },
            &series,
        )?;
        files.push(path);
    }

    let max_n = *flows.iter().max().expect("flows") as usize;
    let mut md = format!(
        "# Loss synchronization\n\nPath: {}. n flows = n channels of one bench connection started together, {} s per run, losses after {} s of warm-up, grouped into congestion events within max(largest srtt, RTT, 20 ms). Delay-element lateness p99 {} µs, max {} µs.\n\n",
        describe(&spec, queue),
        seconds,
        warmup,
        late_p99,
        late_max
    );
    if !skipped.is_empty() {
        md += &format!(
            "Not registered here, so not run: {}.\n\n",
            skipped.join(", ")
        );
    }
    md += "| cc | n | events T | global rate (Expr. 4.2) | utilization |";
    for j in 1..=max_n {
        md += &format!(" sync{j} |");
    }
    md += "\n|---|---|---|---|---|";
    for _ in 1..=max_n {
        md += "---|";
    }
    md += "\n";
    for r in &rows {
        let (t, global) = r.sync.as_ref().map_or(("0".into(), "–".into()), |s| {
            (s.congestion_events.to_string(), pct(s.global))
        });
        md += &format!(
            "| {} | {} | {t} | {global} | {} |",
            r.cc,
            r.n,
            pct(r.utilization)
        );
        for j in 0..max_n {
            let cell = match &r.sync {
                Some(s) if j < r.n as usize => format!("{:.0} %", share(s, j) * 100.0),
                _ => "".into(),
            };
            md += &format!(" {cell} |");
        }
        md += "\n";
        if let Some(d) = seed_distribution(&r.cc, r.n as usize) {
            md += &format!("| {} (Cui 2013) | {} | | | |", r.cc, r.n);
            for j in 0..max_n {
                md += &d
                    .get(j)
                    .map_or(" |".into(), |p| format!(" {:.0} % |", p * 100.0));
            }
            md += "\n";
        }
    }
    md += "\n";
    md += &plot_links(&files);
    let json = json!({
        "experiment": "sync",
        "quick": opts.quick,
        "rate_bps": rate,
        "rtt_ms": rtt_ms,
        "queue_packets": queue,
        "seconds": seconds,
        "warmup_s": warmup,
        "lateness_p99_us": late_p99,
        "lateness_max_us": late_max,
        "skipped_ccs": skipped,
        "runs": rows.iter().map(|r| json!({
            "cc": r.cc, "flows": r.n, "utilization": r.utilization, "loss_sync": r.sync,
            "seed_distribution": seed_distribution(&r.cc, r.n as usize),
        })).collect::<Vec<_>>(),
    });
    Ok(Report {
        markdown: md,
        json,
        files,
    })
}
