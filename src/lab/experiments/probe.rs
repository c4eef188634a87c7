//! The tuning benchmark (`hsxfer lab run probe`): on five emulated paths, an exhaustive sweep
//! of congestion control × channels × pacing, then what `hsxfer probe` picks and how long it
//! takes, the pick measured as the sweep measures, a first 2 GiB copy with no flags and no
//! profile, the same copy with the flags of the sweep's best run, and a copy with no flags
//! after the probe. On the tiny-queue path, GridFTP's
//! `globus-url-copy -fast -p 8` pushes the same file when it is installed.
//!
//! The paths: (a) 1 Gbit/s × 60 ms × 64 packets, (b) 1 Gbit/s × 20 ms × 1 BDP, (c) 500 Mbit/s
//! × 120 ms × 0.25 BDP, (d) 1 Gbit/s × 60 ms × 1 BDP with 0.1 % random loss, (e) 1 Gbit/s ×
//! 120 ms × 1 BDP with the receiver's `tcp_rmem` maximum at 4 MiB.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{choose_ccs, describe, lateness, pct, OwnedLab, Report, RunOptions};
use crate::lab::flows::FlowSpec;
use crate::lab::topology::{on_path, SERVER_PORT};
use crate::lab::{Host, Lab, LabError, LabSpec, QueueSize};
use crate::tuning::probe::loss_based;

/// Congestion controls of the sweep (those registered on the host).
const SWEEP_CCS: &[&str] = &["cubic", "reno", "dmctcp", "htcp", "bbr"];

/// Default congestion controls of the sending host GridFTP is run with.
const GRIDFTP_DEFAULTS: [&str; 2] = ["cubic", "bbr"];

/// Size of the copies.
const COPY_BYTES: u64 = 2 << 30;

/// One emulated path of the benchmark.
struct Case {
    tag: &'static str,
    spec: LabSpec,
    /// The receiver's `net.ipv4.tcp_rmem` maximum, when capped.
    rmem_max: Option<u64>,
}

fn cases(opts: &RunOptions) -> Vec<Case> {
    let spec = |tag: &str, rate: u64, rtt_ms: u64, queue: QueueSize, loss: Option<f64>| LabSpec {
        name: format!("{}{tag}", opts.lab_name),
        rate_bps: rate,
        rtts: vec![Duration::from_millis(rtt_ms)],
        queue,
        loss,
        ..LabSpec::default()
    };
    if opts.quick {
        return vec![
            Case {
                tag: "a",
                spec: spec("a", 200_000_000, 40, QueueSize::Packets(16), None),
                rmem_max: None,
            },
            Case {
                tag: "e",
                spec: spec("e", 200_000_000, 40, QueueSize::Bdp(1.0), None),
                rmem_max: Some(256 << 10),
            },
        ];
    }
    let g = 1_000_000_000;
    vec![
        Case {
            tag: "a",
            spec: spec("a", g, 60, QueueSize::Packets(64), None),
            rmem_max: None,
        },
        Case {
            tag: "b",
            spec: spec("b", g, 20, QueueSize::Bdp(1.0), None),
            rmem_max: None,
        },
        Case {
            tag: "c",
            spec: spec("c", 500_000_000, 120, QueueSize::Bdp(0.25), None),
            rmem_max: None,
        },
        Case {
            tag: "d",
            spec: spec("d", g, 60, QueueSize::Bdp(1.0), Some(0.001)),
            rmem_max: None,
        },
        Case {
            tag: "e",
            spec: spec("e", g, 120, QueueSize::Bdp(1.0), None),
            rmem_max: Some(4 << 20),
        },
    ]
}

/// One sweep run.
struct Row {
    cc: String,
    channels: u16,
    paced: bool,
    goodput_bps: f64,
    retransmits: u64,
}

/// The sweep's best loss-based configuration run as a copy.
struct BestCopy {
    flags: Vec<String>,
    report: Option<Value>,
}

/// What one path gave.
struct Outcome {
    tag: &'static str,
    description: String,
    ceiling_bps: f64,
    rows: Vec<Row>,
    probe: Option<Value>,
    probe_error: Option<String>,
    pick_bps: Option<f64>,
    /// The copies' `--json` reports: with no profile, and after the probe.
    first_copy: Option<Value>,
    profiled_copy: Option<Value>,
    /// The same copy with the flags of the sweep's best loss-based run: the reference a first
    /// copy is held to, since it pays the same start-up, file reads and writes as the copy.
    best_copy: Option<BestCopy>,
    /// `globus-url-copy -fast -p 8` with the sending host's default congestion control set to
    /// each of these, in that order.
    gridftp_bps: Vec<(String, Result<f64, String>)>,
    lateness: (u64, u64),
}

/// Runs the benchmark.
pub fn run(opts: &RunOptions, log: &mut dyn FnMut(&str)) -> Result<Report, LabError> {
    check_base_name(&opts.lab_name)?;
    let (channels, seconds, warmup): (Vec<u16>, f64, f64) = if opts.quick {
        (vec![1, 4], 5.0, 2.0)
    } else {
        (vec![1, 2, 4, 8, 16], 10.0, 3.0)
    };
    let seconds = opts.seconds.unwrap_or(seconds);
    let channels = opts.channels.clone().unwrap_or(channels);
    let (ccs, skipped) = choose_ccs(opts, SWEEP_CCS)?;
    let mut cases = cases(opts);
    if let Some(paths) = &opts.paths {
        if let Some(unknown) = paths
            .iter()
            .find(|p| !cases.iter().any(|c| c.tag == p.as_str()))
        {
            let known: Vec<&str> = cases.iter().map(|c| c.tag).collect();
            return Err(LabError::Invalid(format!(
                "--paths: no path '{unknown}' (use {})",
                known.join(", ")
            )));
        }
        cases.retain(|c| paths.iter().any(|p| p == c.tag));
    }
    let file = opts.out.join("probe-copy.bin");
    write_file(&file, if opts.quick { 256 << 20 } else { COPY_BYTES })?;
    let mut outcomes = Vec::new();
    for case in cases {
        outcomes.push(run_case(
            &case, opts, &ccs, &channels, seconds, warmup, &file, log,
        )?);
    }
    let _ = std::fs::remove_file(&file);
    Ok(report(
        opts, &outcomes, &ccs, &skipped, &channels, seconds, warmup,
    ))
}

/// Refuses a `--name` that leaves no room for the path's letter, which each path's lab name
/// adds to it, before anything is built.
fn check_base_name(name: &str) -> Result<(), LabError> {
    let fits = !name.is_empty() && crate::lab::config::check_name(&format!("{name}a")).is_ok();
    if fits {
        Ok(())
    } else {
        Err(LabError::Invalid(format!(
            "lab name '{name}' must be 1–7 letters, digits or '_' here: `lab run probe` adds \
             the path's letter to it"
        )))
    }
}

#[allow(clippy::too_many_arguments)]
fn run_case(
    case: &Case,
    opts: &RunOptions,
    ccs: &[String],
    channels: &[u16],
    seconds: f64,
    warmup: f64,
    file: &Path,
    log: &mut dyn FnMut(&str),
) -> Result<Outcome, LabError> {
    let lab = OwnedLab::up(&case.spec, opts)?;
    if let Some(max) = case.rmem_max {
        crate::lab::topology::run(
            lab.0
                .command(Host::Receiver, "sysctl")
                .args(["-qw", &format!("net.ipv4.tcp_rmem=4096 131072 {max}")]),
        )?;
    }
    let spec = &case.spec;
    let ceiling = spec.goodput_ceiling_bps();
    let wire_rate = format!("{}", spec.rate_bps);
    let mut rows = Vec::new();
    for cc in ccs {
        for &n in channels {
            for paced in [false, true] {
                let mut flow = FlowSpec::new(cc, n, seconds);
                flow.extra = sweep_flags(paced, &wire_rate);
                let r = match lab.0.run_flow(&flow) {
                    Ok(r) => r,
                    Err(e) => {
                        log(&format!("probe ({}): {cc} ×{n} failed: {e}", case.tag));
                        continue;
                    }
                };
                let goodput = r.goodput_after(warmup);
                log(&format!(
                    "probe ({}): {cc} ×{n} {}: {:.1} Mbit/s = {}",
                    case.tag,
                    if paced { "paced" } else { "unpaced" },
                    goodput / 1e6,
                    pct(goodput / ceiling)
                ));
                rows.push(Row {
                    cc: cc.clone(),
                    channels: n,
                    paced,
                    goodput_bps: goodput,
                    retransmits: r.summary.retransmits,
                });
            }
        }
    }
    let server = Host::Receiver.addr().to_string();
    let token = lab.0.state.token_file.to_string_lossy().into_owned();
    let cache = lab.0.dir().join("cache");
    let _ = std::fs::remove_dir_all(&cache);
    let first_copy = copy(&lab.0, file, &server, &token, &[]).ok();
    log(&format!(
        "probe ({}): first copy, no flags, no profile: {}",
        case.tag,
        mbit(goodput(&first_copy))
    ));
    let best_copy = sweep_best(&rows, true).map(|best| {
        let mut flags = sweep_flags(best.paced, &wire_rate);
        flags.extend([
            "--cc".into(),
            best.cc.clone(),
            "-n".into(),
            best.channels.to_string(),
        ]);
        let args: Vec<&str> = flags.iter().map(String::as_str).collect();
        let report = copy(&lab.0, file, &server, &token, &args).ok();
        log(&format!(
            "probe ({}): the sweep's best as a copy ({}): {}",
            case.tag,
            flags.join(" "),
            mbit(goodput(&report))
        ));
        BestCopy { flags, report }
    });
    let _ = std::fs::remove_dir_all(&cache);
    let (probe, probe_error) = match hsxfer_json(
        &lab.0,
        &["probe", "--json", "--token-file", &token, &server],
    ) {
        Ok(v) => (Some(v), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let mut pick_bps = None;
    let mut profiled_copy = None;
    if let Some(p) = &probe {
        let rec = &p["recommendation"];
        log(&format!(
            "probe ({}): picked {} in {:.1} s",
            case.tag,
            p["flags"],
            p["seconds"].as_f64().unwrap_or(0.0)
        ));
        let mut flow = FlowSpec::new(
            rec["cc"].as_str().unwrap_or("cubic"),
            rec["channels"].as_u64().unwrap_or(4) as u16,
            seconds,
        );
        flow.extra = sweep_flags(rec["pace_bps"].is_u64(), &wire_rate);
        pick_bps = lab.0.run_flow(&flow).ok().map(|r| r.goodput_after(warmup));
        profiled_copy = copy(&lab.0, file, &server, &token, &[]).ok();
        log(&format!(
            "probe ({}): pick measured {}, copy after the probe {}",
            case.tag,
            mbit(pick_bps),
            mbit(goodput(&profiled_copy))
        ));
    }
    let mut gridftp_bps = Vec::new();
    if case.tag == "a" {
        for cc in GRIDFTP_DEFAULTS {
            let g = gridftp(&lab.0, file, cc).map_err(|e| e.to_string());
            log(&format!(
                "probe ({}): globus-url-copy -fast -p 8, host default {cc}: {g:?}",
                case.tag
            ));
            gridftp_bps.push((cc.to_string(), g));
        }
    }
    Ok(Outcome {
        tag: case.tag,
        description: describe(spec, lab.0.state.queue_packets)
            + &spec
                .loss
                .map_or(String::new(), |l| format!(", {} % random loss", l * 100.0))
            + &case.rmem_max.map_or(String::new(), |m| {
                format!(", receiver tcp_rmem max {} KiB", m >> 10)
            }),
        ceiling_bps: ceiling,
        rows,
        probe,
        probe_error,
        pick_bps,
        first_copy,
        profiled_copy,
        best_copy,
        gridftp_bps,
        lateness: lateness(&lab.0),
    })
}

/// The flags every sweep run takes besides its congestion control and channel count: buffers
/// as a copy sizes them, so that the sweep and the copies compare; paced runs are capped from
/// the bottleneck's rate.
fn sweep_flags(paced: bool, wire_rate: &str) -> Vec<String> {
    let mut flags = ["--tune", "off", "--buffer", "auto"]
        .map(String::from)
        .to_vec();
    if paced {
        flags.extend(["--pace", "auto", "--rate", wire_rate].map(String::from));
    } else {
        flags.extend(["--pace", "off"].map(String::from));
    }
    flags
}

/// The sweep's best run: under `--policy fair` (`fair`: loss-based congestion controls only)
/// or of all.
fn sweep_best(rows: &[Row], fair: bool) -> Option<&Row> {
    rows.iter()
        .filter(|r| !fair || loss_based(&r.cc))
        .max_by(|a, b| a.goodput_bps.total_cmp(&b.goodput_bps))
}

fn mbit(b: Option<f64>) -> String {
    b.map_or("failed".into(), |b| format!("{:.1} Mbit/s", b / 1e6))
}

/// Writes `bytes` of incompressible data to `path` (once per benchmark).
fn write_file(path: &Path, bytes: u64) -> Result<(), LabError> {
    if std::fs::metadata(path).is_ok_and(|m| m.len() == bytes) {
        return Ok(());
    }
    let out = Command::new("head")
        .args(["-c", &bytes.to_string(), "/dev/urandom"])
        .stdout(
            std::fs::File::create(path)
                .map_err(LabError::io(format!("creating {}", path.display())))?,
        )
        .status()
        .map_err(LabError::io("writing the copy's file"))?;
    if out.success() {
        Ok(())
    } else {
        Err(LabError::Invalid("could not write the copy's file".into()))
    }
}

/// Runs hsxfer on sender 1 and returns its last JSON line.
fn hsxfer_json(lab: &Lab, args: &[&str]) -> Result<Value, LabError> {
    let out = lab
        .hsxfer(Host::Sender(1))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(LabError::io("running hsxfer"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().unwrap_or_default();
    match serde_json::from_str::<Value>(last) {
        Ok(v) if out.status.success() => Ok(v),
        _ => Err(LabError::Command {
            command: format!("hsxfer {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        }),
    }
}

/// A copy with `flags` (with none, a profile is used if the lab's cache holds one); its
/// `--json` report, kept whole so that a slow copy can be explained after the run (the
/// tuner's decisions, each channel's retransmits).
fn copy(
    lab: &Lab,
    file: &Path,
    server: &str,
    token: &str,
    flags: &[&str],
) -> Result<Value, LabError> {
    let source = file.to_string_lossy();
    let dest = format!("{server}:probe-copy.bin");
    let mut args = vec!["copy", "--json", "--token-file", token];
    args.extend_from_slice(flags);
    args.extend([source.as_ref(), dest.as_str()]);
    let v = hsxfer_json(lab, &args)?;
    let _ = std::fs::remove_file(lab.dir().join("data").join("probe-copy.bin"));
    Ok(v)
}

/// A copy's goodput, from its report.
fn goodput(report: &Option<Value>) -> Option<f64> {
    report
        .as_ref()
        .map(|v| v["goodput_bps"].as_f64().unwrap_or(0.0))
}

/// Pushes `file` with `globus-url-copy -fast -p 8` to a GridFTP server on the receiver, with
/// the sending host's default congestion control set to `default_cc` (GridFTP does not
/// choose one); the rate over the whole command, as its users see it.
fn gridftp(lab: &Lab, file: &Path, default_cc: &str) -> Result<f64, LabError> {
    if !on_path("globus-gridftp-server") || !on_path("globus-url-copy") {
        return Err(LabError::Missing {
            program: "globus-url-copy".into(),
            hint: "apt-get install globus-gridftp-server-progs globus-gass-copy-progs".into(),
        });
    }
    let ns = lab.spec().namespace(Host::Receiver);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_err(LabError::io("reading the host name"))?;
    let server_ip = Host::Receiver.addr().to_string();
    // GridFTP resolves its own host name: inside the namespace it must name the receiver.
    let etc = PathBuf::from("/etc/netns").join(&ns);
    std::fs::create_dir_all(&etc).map_err(LabError::io("creating /etc/netns"))?;
    std::fs::write(
        etc.join("hosts"),
        format!("127.0.0.1 localhost\n{server_ip} {}\n", host.trim()),
    )
    .map_err(LabError::io("writing the namespace's hosts"))?;
    // The server writes as its anonymous user, which cannot enter the lab's directory.
    let dir = std::env::temp_dir().join(format!("hsxfer-gridftp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(LabError::io("creating the GridFTP directory"))?;
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))
        .map_err(LabError::io("opening the GridFTP directory"))?;
    let port = (SERVER_PORT + 11).to_string();
    let mut server = lab
        .command(Host::Receiver, "globus-gridftp-server")
        .args([
            "-c",
            "/dev/null",
            "-aa",
            "-anonymous-user",
            "nobody",
            "-p",
            &port,
        ])
        .args([
            "-control-interface",
            &server_ip,
            "-data-interface",
            &server_ip,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(LabError::io("starting globus-gridftp-server"))?;
    std::thread::sleep(Duration::from_secs(1));
    let url = format!("ftp://{server_ip}:{port}{}/probe-copy.bin", dir.display());
    let started = Instant::now();
    let out = with_default_cc(lab, default_cc, || {
        lab.command(Host::Sender(1), "globus-url-copy")
            .args(["-fast", "-p", "8"])
            .arg(format!("file://{}", file.display()))
            .arg(&url)
            .output()
            .map_err(LabError::io("running globus-url-copy"))
    });
    let took = started.elapsed().as_secs_f64();
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&etc);
    let out = out?;
    if !out.status.success() {
        return Err(LabError::Command {
            command: format!("globus-url-copy -fast -p 8 … {url}"),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    let bytes = std::fs::metadata(file).map_or(0, |m| m.len());
    Ok(bytes as f64 * 8.0 / took)
}

/// Runs `f` with `cc` as sender 1's default congestion control, then restores the default.
/// Outside the initial network namespace the kernel accepts only a default from
/// `net.ipv4.tcp_allowed_congestion_control` (a host-wide list), so `cc` joins that list
/// for the while if it is not on it.
fn with_default_cc<T>(
    lab: &Lab,
    cc: &str,
    f: impl FnOnce() -> Result<T, LabError>,
) -> Result<T, LabError> {
    const ALLOWED: &str = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";
    let sysctl = "net.ipv4.tcp_congestion_control";
    let sysctl_w = |value: &str| {
        crate::lab::topology::run(
            lab.command(Host::Sender(1), "sysctl")
                .args(["-qw", &format!("{sysctl}={value}")]),
        )
    };
    let allowed =
        std::fs::read_to_string(ALLOWED).map_err(LabError::io(format!("reading {ALLOWED}")))?;
    let allowed = allowed.trim();
    let widen = !allowed.split_whitespace().any(|a| a == cc);
    if widen {
        std::fs::write(ALLOWED, format!("{allowed} {cc}"))
            .map_err(LabError::io(format!("allowing {cc} in {ALLOWED}")))?;
    }
    let was =
        crate::lab::topology::run(lab.command(Host::Sender(1), "sysctl").args(["-n", sysctl]));
    let out = match was {
        Ok(was) => {
            let out = sysctl_w(cc).and_then(|_| f());
            let _ = sysctl_w(was.trim());
            out
        }
        Err(e) => Err(e),
    };
    if widen {
        let _ = std::fs::write(ALLOWED, allowed);
    }
    out
}

fn report(
    opts: &RunOptions,
    outcomes: &[Outcome],
    ccs: &[String],
    skipped: &[String],
    channels: &[u16],
    seconds: f64,
    warmup: f64,
) -> Report {
    let mut md = format!(
        "# Tuning: probe and first copies against an exhaustive sweep\n\nEach sweep run is a {seconds} s `bench` with the flags shown, `--tune off` and `--buffer auto` (as copies size buffers; paced: `--pace auto --rate` the bottleneck, caps adding up to 0.97 × its goodput rate; unpaced: `--pace off`), measured after {warmup} s. The pick is what `hsxfer probe --json` (default budget: 10 s, or what the RTT needs where more; `--policy fair`) recommends, measured the same way. Copies push a {} file with no flags: the first with no profile (online tuning only), the second after the probe (its profile). A third copy takes the flags of the sweep's best loss-based run: it pays what the first copy pays (connecting, ramping up, reading and writing the file), which a sweep run measured after its warm-up does not. Utilization = goodput / goodput ceiling.\n\n",
        if opts.quick { "256 MiB" } else { "2 GiB" }
    );
    if !skipped.is_empty() {
        md += &format!(
            "Not registered on this host, so not swept: {} (`hsxfer cc load` registers the bundled ones).\n\n",
            skipped.join(", ")
        );
    }
    let mut paths = Vec::new();
    for o in outcomes {
        let u = |b: f64| pct(b / o.ceiling_bps);
        md += &format!(
            "## ({}) {}\n\nGoodput ceiling {:.1} Mbit/s; delay-element lateness p99 {} µs, max {} µs.\n\n| cc | pacing |",
            o.tag,
            o.description,
            o.ceiling_bps / 1e6,
            o.lateness.0,
            o.lateness.1
        );
        for n in channels {
            md += &format!(" ×{n} |");
        }
        md += "\n|---|---|";
        for _ in channels {
            md += "---|";
        }
        md += "\n";
        for cc in ccs {
            for paced in [false, true] {
                md += &format!("| {cc} | {} |", if paced { "auto" } else { "off" });
                for n in channels {
                    let cell = o
                        .rows
                        .iter()
                        .find(|r| &r.cc == cc && r.paced == paced && r.channels == *n)
                        .map_or("–".into(), |r| u(r.goodput_bps));
                    md += &format!(" {cell} |");
                }
                md += "\n";
            }
        }
        let line = |r: Option<&Row>| {
            r.map_or("–".into(), |r| {
                format!(
                    "{} ×{} {} = {}",
                    r.cc,
                    r.channels,
                    if r.paced { "paced" } else { "unpaced" },
                    u(r.goodput_bps)
                )
            })
        };
        md += &format!(
            "\nBest of the sweep: {} (fair: loss-based only); {} (any).\n\n",
            line(sweep_best(&o.rows, true)),
            line(sweep_best(&o.rows, false))
        );
        let best_bps = sweep_best(&o.rows, true).map(|r| r.goodput_bps);
        let share = |x: Option<f64>, of: Option<f64>| match (x, of) {
            (Some(x), Some(b)) if b > 0.0 => Some(x / b),
            _ => None,
        };
        let ratio = |x: Option<f64>| {
            share(x, best_bps).map_or("–".into(), |r| format!("{r:.2} of the best"))
        };
        match &o.probe {
            Some(p) => {
                md += &format!(
                    "- **Probe**: `{}` in {:.1} s (rate {} , RTT {:.2} ms, queue {}); measured {} = {}, {}.\n",
                    p["flags"].as_str().unwrap_or(""),
                    p["seconds"].as_f64().unwrap_or(0.0),
                    p["rate_bps"].as_f64().map_or("not reached".into(), |r| format!("{:.1} Mbit/s", r / 1e6)),
                    p["rtt_ms"].as_f64().unwrap_or(0.0),
                    p["queue_packets"].as_f64().map_or("unknown".into(), |q| {
                        let floor = if p["queue_is_floor"] == true { "at least " } else { "" };
                        format!("{floor}~{q:.0} packets")
                    }),
                    mbit(o.pick_bps),
                    o.pick_bps.map_or("–".into(), u),
                    ratio(o.pick_bps)
                );
            }
            None => {
                md += &format!(
                    "- **Probe** failed: {}\n",
                    o.probe_error.as_deref().unwrap_or("?")
                )
            }
        }
        let (first, profiled) = (goodput(&o.first_copy), goodput(&o.profiled_copy));
        let best_copy = o.best_copy.as_ref().and_then(|b| goodput(&b.report));
        md += &format!(
            "- **First copy, no flags, no profile**: {} = {}, {}; {} of the best as a copy.\n- **Copy after the probe, no flags**: {} = {}.\n",
            mbit(first),
            first.map_or("–".into(), u),
            ratio(first),
            share(first, best_copy).map_or("–".into(), |r| format!("{r:.2}")),
            mbit(profiled),
            profiled.map_or("–".into(), u),
        );
        if let Some(b) = &o.best_copy {
            md += &format!(
                "- **The sweep's best as a copy** (`{}`): {} = {}.\n",
                b.flags.join(" "),
                mbit(best_copy),
                best_copy.map_or("–".into(), u),
            );
        }
        for (cc, g) in &o.gridftp_bps {
            md += &match g {
                Ok(b) => format!(
                    "- **GridFTP** `globus-url-copy -fast -p 8`, same file, sending host's default {cc}: {:.1} Mbit/s = {}; the copy after the probe is {}× that.\n",
                    b / 1e6,
                    u(*b),
                    profiled
                        .map_or("–".into(), |c| format!("{:.2}", c / b))
                ),
                Err(e) => format!("- **GridFTP** (default {cc}) not run: {e}\n"),
            };
        }
        md += "\n";
        paths.push(json!({
            "path": o.tag,
            "description": o.description,
            "goodput_ceiling_bps": o.ceiling_bps,
            "lateness_p99_us": o.lateness.0,
            "lateness_max_us": o.lateness.1,
            "sweep": o.rows.iter().map(|r| json!({
                "cc": r.cc, "channels": r.channels, "paced": r.paced,
                "goodput_bps": r.goodput_bps, "retransmits": r.retransmits,
            })).collect::<Vec<_>>(),
            "probe": o.probe,
            "probe_error": o.probe_error,
            "pick_goodput_bps": o.pick_bps,
            "first_copy_goodput_bps": goodput(&o.first_copy),
            "profiled_copy_goodput_bps": goodput(&o.profiled_copy),
            "best_copy_goodput_bps": best_copy,
            "best_copy_flags": o.best_copy.as_ref().map(|b| &b.flags),
            "first_copy": o.first_copy,
            "profiled_copy": o.profiled_copy,
            "best_copy": o.best_copy.as_ref().map(|b| &b.report),
            "gridftp_bps": o.gridftp_bps.iter().map(|(cc, g)| json!({
                "host_default_cc": cc, "goodput_bps": g.as_ref().ok(), "error": g.as_ref().err(),
            })).collect::<Vec<_>>(),
        }));
    }
    let json = json!({
        "experiment": "probe",
        "quick": opts.quick,
        "seconds": seconds,
        "warmup_s": warmup,
        "skipped_ccs": skipped,
        "paths": paths,
    });
    Report {
        markdown: md,
        json,
        files: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_needs_room_for_the_paths_letter() {
        assert!(check_base_name("hsxlab").is_ok());
        assert!(check_base_name("abcdefg").is_ok());
        let e = check_base_name("abcdefgh").unwrap_err().to_string();
        assert!(e.contains("1–7") && e.contains("abcdefgh"), "{e}");
        assert!(check_base_name("").is_err());
        assert!(check_base_name("..").is_err());
    }
}
