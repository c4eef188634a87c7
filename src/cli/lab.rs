//! `hsxfer lab`: the emulated long-fat-network testbed ([`hsxfer::lab`]) from the command
//! line: up, down, status, exec, addr, run, and the hidden processes the lab starts in its
//! namespaces (the delay element and the background-traffic endpoints).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use hsxfer::lab::counters;
use hsxfer::lab::element::{self, ElementConfig};
use hsxfer::lab::experiments::{self, Experiment, RunOptions};
use hsxfer::lab::selfcheck::{self, SelfCheck};
use hsxfer::lab::traffic;
use hsxfer::lab::{Host, Lab, LabSpec, QueueSize};

use super::units;

/// Default lab name.
const DEFAULT_NAME: &str = "hsxlab";

/// `hsxfer lab …`
#[derive(Args)]
pub struct LabArgs {
    #[command(subcommand)]
    command: LabCommand,
}

#[derive(Subcommand)]
enum LabCommand {
    /// Build a dumbbell (senders → router → receiver) with a bottleneck, a delay and a queue of
    /// exactly N packets, then check it.
    Up(UpArgs),
    /// Remove a lab: its processes, namespaces and state.
    Down(NameArg),
    /// Show a lab's configuration and live counters.
    Status(StatusArgs),
    /// Run a command in a lab host: `hsxfer lab exec sender1 -- ping 10.77.0.2`.
    Exec(ExecArgs),
    /// Print a lab host's address.
    Addr(AddrArgs),
    /// Run an experiment (utilization, sync, fairness, convergence) on labs of its own.
    Run(RunArgs),
    /// The delay element (started by `lab up` in the router; not for direct use).
    #[command(hide = true)]
    Element(ElementArgs),
    /// Background-traffic endpoints (started by experiments; not for direct use).
    #[command(hide = true)]
    Traffic(TrafficArgs),
}

#[derive(Args)]
struct NameArg {
    /// Lab name (several labs may exist side by side).
    #[arg(long, default_value = DEFAULT_NAME)]
    name: String,
}

#[derive(Args)]
struct UpArgs {
    /// Bottleneck rate (e.g. 1G, 200M).
    #[arg(long, value_parser = units::parse_rate)]
    rate: u64,
    /// Round-trip time, or one per sender (e.g. 60ms, or 120ms,40ms).
    #[arg(long, value_name = "DURATION[,DURATION...]", value_delimiter = ',', value_parser = units::parse_duration, required = true)]
    rtt: Vec<Duration>,
    /// Bottleneck drop-tail queue: packets (e.g. 64) or a BDP multiple (1bdp, 0.05bdp, 5%bdp).
    #[arg(long, value_name = "N|Xbdp")]
    buffer: QueueSize,
    /// Random loss on the data direction (e.g. 0.01%).
    #[arg(long, value_name = "P%", value_parser = parse_percent)]
    loss: Option<f64>,
    /// MTU of every link.
    #[arg(long, default_value_t = 1500)]
    mtu: u32,
    /// Number of sender hosts.
    #[arg(long, default_value_t = 1)]
    senders: u16,
    /// Shape the reverse direction (receiver → router) too.
    #[arg(long, value_parser = units::parse_rate)]
    reverse_rate: Option<u64>,
    /// Turn generic receive offload off on the veths (on by default, like real NICs).
    #[arg(long)]
    no_gro: bool,
    /// Skip the self-check (RTT, single-flow rate, drops only at the bottleneck).
    #[arg(long)]
    no_check: bool,
    /// Print the lab and the self-check as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    name: NameArg,
}

#[derive(Args)]
struct StatusArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    name: NameArg,
}

#[derive(Args)]
struct ExecArgs {
    /// sender1, sender2, …, router or receiver.
    #[arg(value_parser = parse_host)]
    host: Host,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true)]
    command: Vec<String>,
    #[command(flatten)]
    name: NameArg,
}

#[derive(Args)]
struct AddrArgs {
    /// sender1, sender2, …, router or receiver.
    #[arg(value_parser = parse_host)]
    host: Host,
    #[command(flatten)]
    name: NameArg,
}

#[derive(Args)]
struct RunArgs {
    /// utilization, sync, fairness, convergence or probe.
    experiment: Experiment,
    /// A short form (small rate and RTT, few seconds per run) for smoke tests.
    #[arg(long)]
    quick: bool,
    /// Where to write the table, JSON and plots.
    #[arg(long, default_value = "lab-results")]
    out: PathBuf,
    /// Congestion controls to compare (default: the experiment's list, those available).
    #[arg(long, value_delimiter = ',')]
    cc: Option<Vec<String>>,
    /// Seconds per run (default: the experiment's).
    #[arg(long)]
    seconds: Option<f64>,
    /// Name of the labs the experiment builds (it must not exist).
    #[arg(long, default_value = "hsxexp")]
    name: String,
    /// Channel counts m to run (utilization: default 1 to 8; probe: 1, 2, 4, 8, 16;
    /// fairness --against: the tested connection's, first value).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u16).range(1..=32))]
    channels: Option<Vec<u16>>,
    /// Only the tiny queue, without the 1 BDP comparison (utilization).
    #[arg(long)]
    tiny_only: bool,
    /// Paths to run, by letter (probe: default a,b,c,d,e).
    #[arg(long, value_delimiter = ',')]
    paths: Option<Vec<String>>,
    /// fairness: run each --cc against one flow of this congestion control instead (its
    /// share of the path, e.g. `--against cubic`).
    #[arg(long, value_name = "CC")]
    against: Option<String>,
    /// fairness --against: the bottleneck's drop-tail queue instead of the tiny 64 packets:
    /// packets or a BDP multiple (e.g. 1bdp), to see the share where queue overflow from
    /// bursts does not decide it.
    #[arg(long, value_name = "N|Xbdp", requires = "against")]
    buffer: Option<QueueSize>,
    /// fairness --against: the tested connection runs as a copy with no flags would (the
    /// online tuner's meter and pacing caps, from an empty profile cache) instead of its
    /// congestion control's rules alone; its channels are --channels' first value if given.
    #[arg(long, requires = "against")]
    tuned: bool,
    /// fairness --against: the kernel paces the reference flow at its congestion control's
    /// own rate, as the fq qdisc would, instead of letting it send line-rate bursts.
    #[arg(long, requires = "against")]
    paced_reference: bool,
}

#[derive(Args)]
struct ElementArgs {
    /// QUEUE:DELAY, e.g. 1:60000us (repeat per queue).
    #[arg(long = "queue", required = true, value_parser = parse_queue)]
    queues: Vec<(u16, Duration)>,
    /// Statistics file.
    #[arg(long)]
    stats: PathBuf,
    /// CPU to pin to.
    #[arg(long)]
    cpu: Option<usize>,
    /// SCHED_FIFO priority.
    #[arg(long)]
    realtime: Option<i32>,
    /// Random loss probability (fraction) on the --loss-dev interfaces.
    #[arg(long, requires = "loss_dev")]
    loss: Option<f64>,
    /// Interfaces whose incoming packets the loss applies to.
    #[arg(long)]
    loss_dev: Vec<String>,
}

#[derive(Args)]
struct TrafficArgs {
    #[command(subcommand)]
    role: TrafficRole,
}

#[derive(Subcommand)]
enum TrafficRole {
    /// Accept and discard background TCP and UDP traffic on ADDR.
    Sink {
        /// Address to listen on.
        addr: std::net::Ipv4Addr,
    },
    /// Send short TCP flows and a constant-rate UDP flow to ADDR, scaled to RATE.
    Source {
        /// The sink's address.
        addr: std::net::Ipv4Addr,
        /// The bottleneck rate the traffic is scaled to.
        #[arg(long, value_parser = units::parse_rate)]
        rate: u64,
        /// Seed of the random sizes and gaps.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

fn parse_host(s: &str) -> Result<Host, String> {
    s.parse()
}

/// `0.01%` or a plain fraction `0.0001`.
fn parse_percent(s: &str) -> Result<f64, String> {
    let bad = || format!("invalid loss '{s}' (examples: 0.01%, 1%)");
    let v = match s.trim().strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map_err(|_| bad())? / 100.0,
        None => s.trim().parse::<f64>().map_err(|_| bad())?,
    };
    if !(0.0..0.5).contains(&v) {
        return Err(format!("loss '{s}' must be below 50%"));
    }
    Ok(v)
}

fn parse_queue(s: &str) -> Result<(u16, Duration), String> {
    let (q, d) = s.split_once(':').ok_or("expected QUEUE:DELAY")?;
    Ok((
        q.parse()
            .map_err(|_| format!("bad queue number in '{s}'"))?,
        units::parse_duration(d)?,
    ))
}

/// Runs a `lab` subcommand; `Ok(false)` means it ran but a check failed.
pub fn lab(a: LabArgs) -> anyhow::Result<bool> {
    match a.command {
        LabCommand::Up(u) => up(u),
        LabCommand::Down(n) => {
            Lab::down(&n.name)?;
            outln!("lab '{}' removed", n.name);
            Ok(true)
        }
        LabCommand::Status(s) => status(s),
        LabCommand::Exec(e) => exec(e),
        LabCommand::Addr(a) => {
            let lab = Lab::open(&a.name.name)?;
            lab.check_host(a.host)?;
            outln!("{}", lab.addr(a.host));
            Ok(true)
        }
        LabCommand::Run(r) => run(r),
        LabCommand::Element(e) => {
            element::run(&ElementConfig {
                queues: e.queues,
                stats_path: e.stats,
                cpu: e.cpu,
                realtime_priority: e.realtime,
                loss: e.loss.map(|p| (p, e.loss_dev)),
            })
            .context("delay element")?;
            Ok(true)
        }
        LabCommand::Traffic(t) => {
            match t.role {
                TrafficRole::Sink { addr } => traffic::sink(addr)?,
                TrafficRole::Source { addr, rate, seed } => traffic::source(addr, rate, seed)?,
            }
            Ok(true)
        }
    }
}

fn up(u: UpArgs) -> anyhow::Result<bool> {
    let spec = LabSpec {
        name: u.name.name,
        rate_bps: u.rate,
        rtts: u.rtt,
        queue: u.buffer,
        loss: u.loss,
        mtu: u.mtu,
        senders: u.senders,
        reverse_rate_bps: u.reverse_rate,
        gro: !u.no_gro,
    };
    let program = std::env::current_exe().context("finding the hsxfer program")?;
    // Until the self-check is done, a signal removes the lab: a `lab up` interrupted leaves
    // nothing behind.
    let mut lab = Lab::up(&spec, &program)?;
    if !u.json {
        print_lab(&lab);
    }
    let check = if u.no_check {
        None
    } else {
        if !u.json {
            eprintln!("self-check: ping, one BBR flow with a BDP queue, drop counters …");
        }
        Some(selfcheck::run_checks(&mut lab)?)
    };
    lab.release();
    if u.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "type": "lab", "state": lab.state, "bdp_packets": spec.bdp_packets(),
            }))?
        );
    } else if let Some(c) = &check {
        print_check(c, &spec);
    }
    // The lab stays up either way; a wrong RTT or stray drops make it unfit for measurements.
    Ok(check.is_none_or(|c| c.rtt_ok && c.queue_ok))
}

fn print_lab(lab: &Lab) {
    let s = lab.spec();
    let rtts: Vec<String> = (1..=s.senders)
        .map(|i| format!("{:?}", s.rtt_of(i)))
        .collect();
    outln!(
        "lab '{}' up: {} sender(s) → router → receiver, bottleneck {}, RTT {}, queue {} packets ({:.3} BDP), MTU {}, GRO {}{}",
        s.name,
        s.senders,
        units::fmt_rate(s.rate_bps as f64),
        rtts.join(","),
        lab.state.queue_packets,
        lab.state.queue_packets as f64 / s.bdp_packets(),
        s.mtu,
        if s.gro { "on" } else { "off" },
        s.loss.map(|p| format!(", random loss {}%", p * 100.0)).unwrap_or_default()
    );
    let hosts: Vec<String> = lab
        .hosts()
        .iter()
        .map(|h| format!("{h} {}", h.addr()))
        .collect();
    outln!("hosts: {}", hosts.join(" · "));
    outln!(
        "an hsxfer server runs on the receiver: hsxfer lab exec sender1 -- hsxfer bench {} --token-file {} --cc cubic",
        Host::Receiver.addr(),
        lab.state.token_file.display()
    );
}

fn mark(ok: bool) -> &'static str {
    if ok {
        "ok  "
    } else {
        "FAIL"
    }
}

fn print_check(c: &SelfCheck, spec: &LabSpec) {
    outln!(
        "{} RTT: ping {:.2} ms for {:.2} ms set ({:+.1} %)",
        mark(c.rtt_ok),
        c.rtt_measured_ms,
        c.rtt_set_ms,
        (c.rtt_measured_ms / c.rtt_set_ms - 1.0) * 100.0
    );
    outln!(
        "{} rate: one BBR flow, BDP queue: {} = {:.1} % of the {} goodput ceiling",
        if c.rate_ok { "ok  " } else { "WARN" },
        units::fmt_rate(c.single_flow_bps),
        c.single_flow_utilization * 100.0,
        units::fmt_rate(spec.goodput_ceiling_bps())
    );
    outln!(
        "{} queue: limit {} packets read back; {} drops at the bottleneck, {} elsewhere; delay release lateness p99 {} µs",
        mark(c.queue_ok),
        c.queue_limit.map_or("?".into(), |l| l.to_string()),
        c.bottleneck_drops,
        c.drops_elsewhere,
        c.lateness_p99_us
    );
    for n in &c.notes {
        outln!("note: {n}");
    }
}

fn status(s: StatusArgs) -> anyhow::Result<bool> {
    let lab = Lab::open(&s.name.name)?;
    let c = counters::read(&lab, Duration::from_millis(250))?;
    if s.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "type": "lab_status", "state": lab.state, "counters": c,
            }))?
        );
        return Ok(true);
    }
    print_lab(&lab);
    if let Some(b) = c.bottleneck() {
        outln!(
            "bottleneck: {} packets sent, {} dropped, backlog {} packets ({} bytes) of {}",
            b.packets,
            b.drops,
            b.qlen,
            b.backlog_bytes,
            b.limit.map_or("?".into(), |l| l.to_string())
        );
    }
    match &c.element {
        Some(e) => {
            outln!(
                "delay element: pid {}, {}, {}, up {:.0} s",
                e.pid,
                if e.realtime {
                    "real-time"
                } else {
                    "normal priority"
                },
                e.cpu.map_or("not pinned".into(), |c| format!("CPU {c}")),
                e.uptime_s
            );
            outln!(
                "  latest wake-up after its deadline: {} µs; longest wake-to-verdict: {} µs",
                e.wake_late_max_us,
                e.busy_max_us
            );
            for q in &e.queues {
                outln!(
                    "  queue {}: delay {:.3} ms, holding {} (max {}), {} released, lateness p50 {} µs p99 {} µs max {} µs, {} over 1 ms, {} overflowed",
                    q.queue,
                    q.delay_us as f64 / 1e3,
                    q.held,
                    q.held_max,
                    q.released,
                    q.lateness_p50_us,
                    q.lateness_p99_us,
                    q.lateness_max_us,
                    q.late_over_1ms,
                    q.overflowed
                );
            }
        }
        None => {
            outln!("delay element: NOT RUNNING (no statistics); `hsxfer lab down` and up again")
        }
    }
    outln!("drops outside the bottleneck: {}", c.drops_elsewhere());
    let cpus: Vec<String> = c
        .cpu_busy
        .iter()
        .enumerate()
        .map(|(i, b)| format!("cpu{i} {:.0} %", b * 100.0))
        .collect();
    outln!("CPU busy: {}", cpus.join(", "));
    if let Some(check) = &lab.state.check {
        outln!("self-check at up:");
        print_check(check, lab.spec());
    }
    Ok(true)
}

fn exec(e: ExecArgs) -> anyhow::Result<bool> {
    let lab = Lab::open(&e.name.name)?;
    lab.check_host(e.host)?;
    let status = lab
        .command(e.host, &e.command[0])
        .args(&e.command[1..])
        .status()
        .with_context(|| format!("running {}", e.command[0]))?;
    match status.code() {
        Some(0) => Ok(true),
        Some(code) => std::process::exit(code),
        None => bail!("{} was killed by a signal", e.command[0]),
    }
}

fn run(r: RunArgs) -> anyhow::Result<bool> {
    if r.against.is_some() && r.experiment != Experiment::Fairness {
        anyhow::bail!(
            "--against applies to the fairness experiment only: hsxfer lab run fairness --against cubic"
        );
    }
    let opts = RunOptions {
        quick: r.quick,
        out: r.out,
        program: std::env::current_exe().context("finding the hsxfer program")?,
        ccs: r.cc,
        seconds: r.seconds,
        lab_name: r.name,
        channels: r.channels,
        tiny_only: r.tiny_only,
        paths: r.paths,
        against: r.against,
        buffer: r.buffer,
        tuned: r.tuned,
        paced_reference: r.paced_reference,
    };
    let report = experiments::run(r.experiment, &opts, &mut |line| eprintln!("{line}"))?;
    outln!("{}", report.markdown);
    for f in &report.files {
        outln!("wrote {}", f.display());
    }
    Ok(true)
}
