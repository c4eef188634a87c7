//! hsxfer's bundled BPF congestion controls on the real kernel: registration lifecycle
//! (`hsxfer cc`), real transfers through an emulated bottleneck with each of them, their
//! window decisions against the pure-Rust reference models, and DMCTCP's group rules and
//! desynchronization. Needs root; prints SKIPPED otherwise (CI runs as root).

mod common;

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::late_text;
use common::netns::root_or_skip;
use hsxfer::lab::experiments::analysis::{cut_events, reductions, Reduction};
use hsxfer::lab::flows::{FlowResult, FlowSpec, TraceRow};
use hsxfer::lab::{Lab, LabSpec, QueueSize};
use hsxfer::metrics::loss_sync;
use hsxfer::transport::cc::{congestion, set_congestion, CcCatalog};
use hsxfer::tuning::bundled::BUNDLED;
use hsxfer::tuning::models::{htcp, Bic, HighSpeed, Scalable, WindowRules};
use serde_json::Value;

/// One test at a time: they register kernel-wide congestion controls and measure rates.
static SERIAL: Mutex<()> = Mutex::new(());

fn program() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_hsxfer"))
}

fn hsxfer(args: &[&str]) -> std::process::Output {
    Command::new(program()).args(args).output().unwrap()
}

fn available(name: &str) -> bool {
    CcCatalog::read()
        .unwrap()
        .available
        .iter()
        .any(|a| a == name)
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `cc list --json` entry of `name`.
fn listed(name: &str) -> Value {
    let out = hsxfer(&["cc", "list", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let all: Value = serde_json::from_slice(&out.stdout).unwrap();
    all.as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("{name} not listed"))
}

/// A loopback connection whose client side runs `cc`, with `bytes` pushed through it.
fn loopback_pair(cc: &str, bytes: usize) -> (TcpStream, TcpStream) {
    use std::io::{Read, Write};
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    set_congestion(&sock, cc).unwrap();
    sock.connect(&l.local_addr().unwrap().into()).unwrap();
    let mut client: TcpStream = sock.into();
    let (mut server, _) = l.accept().unwrap();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        let mut got = 0;
        while got < bytes {
            got += server.read(&mut buf).unwrap();
        }
        server
    });
    client.write_all(&vec![7u8; bytes]).unwrap();
    (client, reader.join().unwrap())
}

/// Kills a `cc load` holder if the test fails before it does.
struct Holder(Child);

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn load_use_kill_pin_unload() {
    if !root_or_skip("cc lifecycle") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cc = "bic";
    assert!(hsxfer(&["cc", "unload", cc]).status.success());
    assert!(!available(cc), "bic is still registered after unload");
    let out = hsxfer(&["cc", "load", "vegas"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bundled: dmctcp"));

    // Registered while the command runs.
    let mut holder = Holder(
        Command::new(program())
            .args(["cc", "load", cc])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for("bic to appear in tcp_available_congestion_control", || {
        available(cc)
    });
    let entry = listed(cc);
    assert_eq!(entry["origin"], "bpf", "{entry}");
    assert_eq!(entry["allowed"], true, "TCP_CONG_NON_RESTRICTED: {entry}");
    let sockets_before = entry["stats"]["sockets"].as_u64().unwrap();

    // A transfer uses it: the kernel says so through TCP_CONGESTION and `ss`.
    let (client, _server) = loopback_pair(cc, 8 << 20);
    assert_eq!(congestion(&client).unwrap(), cc);
    let port = client.local_addr().unwrap().port().to_string();
    let ss = Command::new("ss")
        .args(["-tin", "sport", "=", &format!(":{port}")])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&ss.stdout).contains(" bic "),
        "ss does not show bic: {}",
        String::from_utf8_lossy(&ss.stdout)
    );
    assert!(listed(cc)["stats"]["sockets"].as_u64().unwrap() > sockets_before);

    // SIGKILL of the holder unregisters it; the socket keeps its ops and still sends.
    holder.0.kill().unwrap();
    holder.0.wait().unwrap();
    wait_for("bic to disappear after SIGKILL of its holder", || {
        !available(cc)
    });
    let (c2, s2) = (client, _server);
    {
        use std::io::{Read, Write};
        let mut c2 = &c2;
        let mut s2 = &s2;
        c2.write_all(b"still here").unwrap();
        let mut buf = [0u8; 10];
        s2.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"still here");
    }
    assert_eq!(congestion(&c2).unwrap(), cc);
    let probe = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    assert_eq!(
        set_congestion(&probe, cc).unwrap_err().raw_os_error(),
        Some(libc::ENOENT)
    );

    // Pinned, it outlives the command, until unloaded.
    let out = hsxfer(&["cc", "load", cc, "--pin"]);
    assert!(out.status.success(), "{out:?}");
    assert!(available(cc));
    assert_eq!(listed(cc)["origin"], "bpf_pinned");
    let out = hsxfer(&["cc", "load", cc, "--pin"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("already registered"));
    // Not as another user: it said "unregistered" and left it registered.
    let nobody = {
        use std::os::unix::process::CommandExt;
        Command::new(program())
            .args(["cc", "unload", cc])
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap()
    };
    let err = String::from_utf8_lossy(&nobody.stderr);
    assert!(!nobody.status.success(), "{nobody:?}");
    assert!(err.contains("needs root"), "{err}");
    assert!(available(cc));
    let out = hsxfer(&["cc", "unload", cc]);
    assert!(out.status.success(), "{out:?}");
    assert!(!available(cc));
    assert_eq!(listed(cc)["origin"], "absent");
    // The kernel's own are not ours to unload.
    let out = hsxfer(&["cc", "unload", "all"]);
    assert!(out.status.success());
    assert!(available("reno"));
}

/// `tcpi_snd_ssthresh` before the first loss (TCP_INFINITE_SSTHRESH).
const INFINITE_SSTHRESH: u64 = 0x7fff_ffff;

/// The bottleneck the per-CC runs share: 100 Mbit/s, 10 ms, a drop-tail queue of half a BDP.
fn bottleneck(name: &str, rtt_ms: u64, queue: QueueSize) -> (Lab, Cleanup) {
    let spec = LabSpec {
        name: format!("c{}{name}", std::process::id() % 10000),
        rate_bps: 100_000_000,
        rtts: vec![Duration::from_millis(rtt_ms)],
        queue,
        ..LabSpec::default()
    };
    let cleanup = Cleanup(spec.name.clone());
    (Lab::up(&spec, program()).unwrap(), cleanup)
}

/// Removes the lab when the test ends, passed or not.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = Lab::down(&self.0);
    }
}

fn run(lab: &Lab, cc: &str, channels: u16, seconds: f64) -> FlowResult {
    lab.run_flow(&FlowSpec::new(cc, channels, seconds)).unwrap()
}

/// What each congestion control's reference model says ssthresh / cwnd is after the loss of
/// `red`, with a tolerance for 10 ms sampling (the cwnd seen can be a sample old).
/// DMCTCP's is a decision: 1/2 (cut) or 1 (kept); the nearer one is returned.
fn expected_ratio(cc: &str, red: &Reduction) -> Option<(f64, f64)> {
    let tol = 0.06;
    let (w, seen) = (red.cwnd_before as f64, red.ratio());
    let first_slow_start = red.ssthresh_before >= INFINITE_SSTHRESH;
    Some(match cc {
        "dmctcp" | "dmctcp_classic" => (if seen < 0.75 { 0.5 } else { seen.max(1.0) }, tol),
        "highspeed" if first_slow_start => (HighSpeed.on_first_slow_start_loss(w) / w, tol),
        "highspeed" => (HighSpeed.on_loss(w) / w, tol),
        "scalable" => (Scalable.on_loss(w) / w, tol),
        // A loss below the last maximum also moves w_max, not the ratio.
        "bic" => (Bic::default().on_loss(w) / w, tol),
        // H-TCP's backoff is adaptive: 0.5 (after a throughput change) up to 102/128.
        "htcp" => {
            let (lo, hi) = (
                htcp::BETA_MIN as f64 / htcp::FIXED_ONE as f64,
                htcp::BETA_MAX as f64 / htcp::FIXED_ONE as f64,
            );
            ((lo + hi) / 2.0, (hi - lo) / 2.0 + tol)
        }
        _ => return None,
    })
}

/// The samples of a channel from 30 ms before to 30 ms after the first sample `hit` matches
/// (t, CA state, cwnd, ssthresh, retransmissions), for a failure message.
fn around(trace: &[TraceRow], hit: impl Fn(&TraceRow) -> bool) -> String {
    let Some(h) = trace.iter().find(|r| hit(r)) else {
        return "none".into();
    };
    trace
        .iter()
        .filter(|r| r.channel == h.channel && (r.t - h.t).abs() <= 0.03)
        .map(|r| {
            format!(
                "[{:.3} s ch{} state {} cwnd {} ssthresh {} retrans {}]",
                r.t, r.channel, r.ca_state, r.cwnd, r.ssthresh, r.total_retrans
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A flow's course, for a failure message: the goodput of each 100 ms (Mbit/s, from the
/// acknowledged bytes of all channels) and when a channel entered the Loss state (a timeout).
fn course(trace: &[TraceRow]) -> String {
    let mut bins: Vec<u64> = Vec::new();
    let mut last: std::collections::HashMap<u16, (u64, u8)> = Default::default();
    let mut timeouts = Vec::new();
    for r in trace {
        let bin = (r.t / 0.1) as usize;
        if bins.len() <= bin {
            bins.resize(bin + 1, 0);
        }
        let (acked, state) = last.get(&r.channel).copied().unwrap_or((0, 0));
        bins[bin] += r.bytes_acked.saturating_sub(acked);
        if r.ca_state == 4 && state != 4 {
            timeouts.push(format!("{:.2} s ch{}", r.t, r.channel));
        }
        last.insert(r.channel, (r.bytes_acked, r.ca_state));
    }
    let rates: Vec<String> = bins
        .iter()
        .map(|b| format!("{:.0}", *b as f64 * 8.0 / 0.1 / 1e6))
        .collect();
    format!(
        "Mbit/s per 100 ms: [{}]; timeouts: [{}]",
        rates.join(" "),
        timeouts.join(", ")
    )
}

#[test]
fn each_bundled_cc_fills_a_bottleneck_ten_times_and_cuts_as_its_model() {
    if !root_or_skip("bundled CCs through a bottleneck") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Pinned for the whole test, so the guard's counters add up over the 50 runs.
    let out = hsxfer(&["cc", "load", "all", "--pin"]);
    assert!(out.status.success(), "{out:?}");
    let (lab, _cleanup) = bottleneck("b", 10, QueueSize::Bdp(0.5));
    let rate = 100e6;
    let bdp_packets = rate * 0.010 / (1514.0 * 8.0);
    // HSXFER_CC_RUNS=200 makes this the stress test of the guard (about 35 minutes);
    // HSXFER_CC_CHANNELS=8 provokes the kernel's skipped calls about six times as often.
    let env = |name: &str, default: usize| -> usize {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (runs, channels) = (
        env("HSXFER_CC_RUNS", 10),
        env("HSXFER_CC_CHANNELS", 2) as u16,
    );
    let mut report = Vec::new();
    // Runs below the bound on a path the delay element did not emulate faithfully (it woke
    // late on a busy host and released bursts), run again: at most this many in the test, a
    // bound on its time (about 3 s each), not on what it proves: a run on a faithful path is
    // never run again. 9 of 10 were used in one run on this host (9-26 % of releases late).
    // Every run's guard checks count, re-run or not.
    const MAX_RERUNS: usize = 30;
    let mut reruns = Vec::new();
    for cc in BUNDLED.iter().map(|b| b.name) {
        let mut goodputs = Vec::new();
        // Garbage ssthresh values seen in samples (each matched with a skipped call).
        let mut sightings = 0;
        let mut ratios: Vec<(f64, f64, f64)> = Vec::new();
        let mut run_no = 0;
        while run_no < runs {
            // 2.5 s: the goodput bound is over the whole flow, slow start and first cut
            // included. Flows of 2 s with 1 MiB blocks used to run on at the full rate while
            // they delivered the generated data they had announced: 2.34-2.51 s in all (cubic,
            // 3 runs). Now a flow ends at its time.
            let spec = FlowSpec::new(cc, channels, 2.5);
            let r = lab.run_flow(&spec).unwrap();
            assert_eq!(
                r.channel_ccs(),
                vec![cc.to_string(); channels as usize],
                "run {run_no}"
            );
            let max_cwnd = r.trace.iter().map(|t| t.cwnd).max().unwrap_or(0);
            assert!(
                (max_cwnd as f64) < 20.0 * bdp_packets,
                "{cc} run {run_no}: cwnd exploded to {max_cwnd} (BDP {bdp_packets:.0} packets); guard {}",
                listed(cc)["stats"]
            );
            // A garbage ssthresh may be seen only where the kernel wrote it without running
            // our programs: on this VM it runs no hook of ours for an ACK processed on top of
            // some processes (docs/cc.md, "The guard"), so nothing can repair the value before
            // the next ACK it does hand to them. Each garbage value seen must then be one the
            // guard repaired as such a skipped call: a value one of our hooks set, or one the
            // guard left in place, fails here.
            let stats = listed(cc)["stats"].clone();
            let skipped_repairs: Vec<u64> = stats["recent_repairs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|r| r["skipped"] == true)
                .filter_map(|r| r["garbage"].as_u64())
                .collect();
            let mut seen: Vec<u64> = r
                .trace
                .iter()
                .map(|t| t.ssthresh)
                .filter(|&s| s < INFINITE_SSTHRESH && (s as f64) >= 20.0 * bdp_packets)
                .collect();
            seen.sort_unstable();
            seen.dedup();
            sightings += seen.len();
            for garbage in seen {
                assert!(
                    skipped_repairs.contains(&garbage),
                    "{cc} run {run_no}: ssthresh {garbage} seen (BDP {bdp_packets:.0} packets), not among the guard's repairs of skipped calls; guard {stats}; that channel around it: {}",
                    around(&r.trace, |row| row.ssthresh == garbage)
                );
            }
            let goodput = r.summary.goodput_bps;
            let late = late_text(r.late_share);
            if goodput < 0.80 * rate && !r.path_faithful() && reruns.len() < MAX_RERUNS {
                let why = format!("{cc} run {run_no}: {:.1} Mbit/s with {late}", goodput / 1e6);
                eprintln!("{why}: not the path built, run again");
                reruns.push(why);
                continue;
            }
            assert!(
                goodput >= 0.80 * rate,
                "{cc} run {run_no}: {:.1} Mbit/s in {:.2} s < 80 % of the bottleneck ({late}; run again before: {reruns:?}); {}",
                goodput / 1e6,
                r.summary.seconds,
                course(&r.trace)
            );
            goodputs.push(goodput);
            for red in reductions(&r.trace, channels as usize) {
                if let Some((want, tol)) = expected_ratio(cc, &red) {
                    ratios.push((red.ratio(), want, tol));
                }
            }
            run_no += 1;
        }
        // Model against the real program: the median error of ssthresh / cwnd after a loss.
        if !ratios.is_empty() {
            let mut err: Vec<f64> = ratios.iter().map(|(g, w, _)| (g - w).abs()).collect();
            err.sort_by(f64::total_cmp);
            let median = err[err.len() / 2];
            assert!(
                ratios.len() >= 5,
                "{cc}: only {} reductions seen",
                ratios.len()
            );
            let tol = ratios[0].2;
            assert!(
                median <= tol,
                "{cc}: ssthresh/cwnd after a loss is off its model by {median:.3} (median over {}): {ratios:?}",
                ratios.len()
            );
        } else {
            panic!("{cc}: no reductions seen");
        }
        let stats = listed(cc)["stats"].clone();
        let count = |k: &str| stats[k].as_u64().unwrap_or(u64::MAX);
        // Every socket of the runs used the program: counted at the first of its hooks that
        // ran, or when it stopped (`release`). The kernel skips calls into BPF congestion
        // controls now and then (docs/cc.md, "The guard"), `init` and `release` included:
        // counted in `init` alone, 18 inits and 18 releases were once seen for 20 sockets.
        let served = count("sockets").max(count("released"));
        assert!(
            served >= channels as u64 * runs as u64,
            "{cc}: the pinned program served {stats}"
        );
        // A window above the guard's bound on any socket, even one clamped before a sample
        // could see it, means the kernel turned a garbage value into a window: the leak
        // cong_control exists to close (docs/cc.md, "The guard"). Garbage ssthresh values
        // themselves may be repaired (the kernel's skipped calls), and are counted.
        assert_eq!(count("cwnd_repairs"), 0, "{cc}: a window leaked: {stats}");
        assert!(
            count("skipped_ssthresh") <= count("ssthresh_repairs"),
            "{cc}: {stats}"
        );
        goodputs.sort_by(f64::total_cmp);
        report.push(format!(
            "{cc}: goodput min {:.1}, median {:.1} Mbit/s over {runs} runs, {} reductions checked, {sightings} garbage ssthresh values seen (skipped calls), guard {stats}",
            goodputs[0] / 1e6,
            goodputs[goodputs.len() / 2] / 1e6,
            ratios.len()
        ));
    }
    eprintln!("{}", report.join("\n"));
    eprintln!(
        "run again ({} of at most {MAX_RERUNS}): {reruns:?}",
        reruns.len()
    );
    assert!(hsxfer(&["cc", "unload", "all"]).status.success());
}

#[test]
fn dmctcp_cuts_only_the_largest_once_per_rtt_and_desynchronizes() {
    if !root_or_skip("dmctcp rules") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Not registered: the bench registers it on demand for its own lifetime.
    assert!(hsxfer(&["cc", "unload", "dmctcp"]).status.success());
    let rtt = 0.040;
    let (lab, _cleanup) = bottleneck("d", 40, QueueSize::Bdp(0.1));
    let m = 4;
    let seconds = 20.0;
    let warmup = 2.0;

    let d = run(&lab, "dmctcp", m, seconds);
    let group = d.summary.dmctcp.expect("the summary has the dmctcp group");
    assert_eq!(group.channels, u32::from(m), "{group:?}");
    let (cuts, kept) = (group.cuts, group.losses_kept);
    assert!(
        cuts >= 5 && kept >= cuts,
        "a 10 % BDP queue must cause cuts and kept losses: {group:?}"
    );
    assert!(
        (cuts as f64) <= d.summary.seconds / rtt + 1.0,
        "at most one cut per RTT: {group:?}"
    );

    cuts_once_per_rtt_on_the_largest(&d, m as usize, rtt, 1.0);

    // The subflows of one MPTCP connection form the group by themselves (no tag), and the
    // same rules hold over them (the lab's server listens with MPTCP too).
    let sub = lab
        .run_flow(&FlowSpec {
            extra: vec!["--mptcp".into()],
            ..FlowSpec::new("dmctcp", m, 12.0)
        })
        .unwrap();
    assert_eq!(sub.summary.subflows, Some(m), "{:?}", sub.summary);
    let group = sub
        .summary
        .dmctcp
        .expect("the summary has the subflows' group");
    assert_eq!(group.channels, u32::from(m), "{group:?}");
    // Over subflows at least four cuts in five: one CI run saw a cut on a subflow of 77
    // segments while another showed 112 (the cause is not established; 79 cuts over five
    // more flows by hand were all on the largest).
    cuts_once_per_rtt_on_the_largest(&sub, m as usize, rtt, 0.8);

    // Expr. 4.2 on the congestion controls' cuts: DMCTCP's are less synchronized.
    let sync_of = |r: &FlowResult| {
        let reds: Vec<Reduction> = reductions(&r.trace, m as usize)
            .into_iter()
            .filter(|x| x.at >= warmup)
            .collect();
        loss_sync(&cut_events(&reds, 0.75), m as usize, rtt)
            .map(|s| s.global)
            .unwrap_or(0.0)
    };
    let dmc = sync_of(&d);
    let reno = sync_of(&run(&lab, "reno", m, seconds));
    let cubic = sync_of(&run(&lab, "cubic", m, seconds));
    eprintln!("global synchronization of cuts: dmctcp {dmc:.3}, reno {reno:.3}, cubic {cubic:.3}; group {group:?}");
    assert!(
        dmc < reno && dmc < cubic,
        "dmctcp {dmc:.3} must be below reno {reno:.3} and cubic {cubic:.3}"
    );
}

/// From the 10 ms `TCP_INFO` trace of `r`'s `m` channels (or subflows): at least 3 cuts,
/// each at least one RTT (less one sampling period) after the previous one, and at least
/// `on_largest` of them on the channel with the largest window among the active ones.
fn cuts_once_per_rtt_on_the_largest(r: &FlowResult, m: usize, rtt: f64, on_largest: f64) {
    let reds = reductions(&r.trace, m);
    let cut: Vec<&Reduction> = reds.iter().filter(|x| x.is_cut(0.75)).collect();
    assert!(cut.len() >= 3, "cuts seen in the trace: {reds:?}");
    for pair in cut.windows(2) {
        assert!(
            pair[1].at - pair[0].at >= rtt - 0.011,
            "two cuts within one RTT: {pair:?}"
        );
    }
    let elsewhere: Vec<String> = cut
        .iter()
        .filter_map(|c| {
            let others_max = latest_before(r, c.at - 0.011, c.channel, 2.0 * rtt + 0.011);
            let on_it = c.cwnd_before as f64 >= 0.9 * others_max - 2.0;
            (!on_it).then(|| {
                // The samples around it, for the next look at why (the cause of this rare
                // failure is not established: docs/cc.md, "Tests").
                let around: Vec<String> = r
                    .trace
                    .iter()
                    .filter(|row| (c.at - 0.15..=c.at + 0.001).contains(&row.t))
                    .map(|row| {
                        format!(
                            "{:.3} ch{} cwnd {} ssthresh {} state {} acked {} rtt {}",
                            row.t,
                            row.channel,
                            row.cwnd,
                            row.ssthresh,
                            row.ca_state,
                            row.bytes_acked,
                            row.rtt_us
                        )
                    })
                    .collect();
                format!(
                    "cut on channel {} at {:.2} s with cwnd {} while another had {others_max}; samples: {around:?}",
                    c.channel, c.at, c.cwnd_before
                )
            })
        })
        .collect();
    let largest = cut.len() - elsewhere.len();
    assert!(
        largest as f64 >= on_largest * cut.len() as f64,
        "{largest} of {} cuts on the largest window: {elsewhere:?}",
        cut.len()
    );
}

/// The largest cwnd of the channels other than `channel` in their last samples before `t`,
/// among those still active then: DMCTCP leaves out a channel that has not published its
/// window (on an ACK) for two RTTs, as an MPTCP connection's scheduler can leave a subflow;
/// a channel counts as active when what it had acknowledged grew within the last `idle`
/// seconds. (The bulk TCP channels here never idle.)
fn latest_before(r: &FlowResult, t: f64, channel: usize, idle: f64) -> f64 {
    let mut last = std::collections::HashMap::new();
    let mut acked_then = std::collections::HashMap::new();
    for row in r.trace.iter().filter(|row| row.t <= t) {
        last.insert(row.channel as usize, (row.cwnd, row.bytes_acked));
        if row.t <= t - idle {
            acked_then.insert(row.channel as usize, row.bytes_acked);
        }
    }
    last.iter()
        .filter(|(c, _)| **c != channel)
        .filter(|(c, (_, acked))| acked_then.get(*c).is_none_or(|then| acked > then))
        .map(|(_, (w, _))| *w as f64)
        .fold(0.0, f64::max)
}

/// Removes `hsxfer cc load dmctcp --pin`'s registration and pins when the test ends.
struct Unpin;

/// Registers dmctcp afresh with `hsxfer cc load dmctcp --pin`, until the guard is dropped.
fn pin_dmctcp() -> Unpin {
    let _ = hsxfer(&["cc", "unload", "dmctcp"]);
    let out = hsxfer(&["cc", "load", "dmctcp", "--pin"]);
    assert!(out.status.success(), "{out:?}");
    Unpin
}

impl Drop for Unpin {
    fn drop(&mut self) {
        let _ = hsxfer(&["cc", "unload", "dmctcp"]);
    }
}

/// The user the unprivileged checks run as.
const NOBODY: u32 = 65534;

#[test]
fn dmctcp_groups_channels_of_a_user_without_root_once_pinned() {
    if !root_or_skip("dmctcp groups without root") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let _unpin = pin_dmctcp();
    // The maps a user without root needs, with the modes that let them tag only their own
    // sockets and read the counters.
    use std::os::unix::fs::PermissionsExt;
    let mode = |name: &str| {
        std::fs::metadata(Path::new(hsxfer::tuning::bundled::PIN_DIR).join(name))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode("dmctcp_tags"), 0o666);
    assert_eq!(mode("dmctcp_groups"), 0o644);
    assert_eq!(mode("dmctcp_stats"), 0o644);
    assert_eq!(mode("dmctcp"), 0o600);

    let (lab, _cleanup) = bottleneck("u", 40, QueueSize::Bdp(0.1));
    // The program, the token and a home where that user can reach them. `nsenter` enters
    // only the network namespace: `ip netns exec` mounts a sysfs of its own, which hides the
    // BPF file system and its pins.
    let home = tempfile::tempdir().unwrap();
    let own = |p: &Path, mode: u32| {
        std::os::unix::fs::chown(p, Some(NOBODY), Some(NOBODY)).unwrap();
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    own(home.path(), 0o755);
    let program_copy = home.path().join("hsxfer");
    std::fs::copy(program(), &program_copy).unwrap();
    let token = home.path().join("token");
    std::fs::copy(lab.dir().join("token"), &token).unwrap();
    own(&token, 0o600);
    let ns = format!(
        "/run/netns/{}",
        lab.spec().namespace(hsxfer::lab::Host::Sender(1))
    );
    let out = Command::new("nsenter")
        .arg(format!("--net={ns}"))
        .args([
            "setpriv",
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
        ])
        .args(["--inh-caps=-all", "--"])
        .arg(&program_copy)
        .arg("bench")
        .arg(hsxfer::lab::Host::Receiver.addr().to_string())
        .args(["--port", &hsxfer::lab::topology::SERVER_PORT.to_string()])
        .arg("--token-file")
        .arg(&token)
        .args(["-n", "4", "--cc", "dmctcp", "--time", "4", "--json"])
        .env("HOME", home.path())
        .env("XDG_CACHE_HOME", home.path().join("cache"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["type"] == "summary")
        .expect("a summary event");
    assert_eq!(
        report["dmctcp"]["channels"], 4,
        "the four channels of a user without root form one group: {report}"
    );
    assert!(
        report["guard"].is_object(),
        "the guard's counters are readable too: {report}"
    );
}

/// Connects a loopback socket running dmctcp in `group`, created with file-system uid `uid`
/// (what the kernel records as the socket's owner), and pushes some data through it.
fn grouped_socket(
    l: &TcpListener,
    group: &hsxfer::tuning::bundled::group::DmcGroup,
    uid: u32,
) -> (TcpStream, TcpStream) {
    use std::io::Write;
    let sock = std::thread::scope(|s| {
        s.spawn(|| {
            // setfsuid is per thread; the thread ends with it.
            unsafe { libc::setfsuid(uid) };
            let sock =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            unsafe { libc::setfsuid(0) };
            sock
        })
        .join()
        .unwrap()
    });
    group.join(&sock).unwrap();
    set_congestion(&sock, "dmctcp").unwrap();
    sock.connect(&l.local_addr().unwrap().into()).unwrap();
    let mut client: TcpStream = sock.into();
    let (server, _) = l.accept().unwrap();
    client.write_all(&[7u8; 1 << 16]).unwrap();
    (client, server)
}

#[test]
fn a_dmctcp_group_takes_only_its_owners_sockets_and_goes_with_its_last() {
    if !root_or_skip("dmctcp group owner") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let _unpin = pin_dmctcp();
    let group = hsxfer::tuning::bundled::group::DmcGroup::new("dmctcp").expect("the dmctcp maps");
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let channels = || group.counters().map(|c| c.channels);

    let first = grouped_socket(&l, &group, 0);
    wait_for("the first socket joins", || channels() == Some(1));
    // Another user's socket with the same tag runs dmctcp alone.
    let other = grouped_socket(&l, &group, NOBODY);
    assert_eq!(congestion(&other.0).unwrap(), "dmctcp");
    let second = grouped_socket(&l, &group, 0);
    wait_for("the owner's second socket joins", || channels() == Some(2));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        channels(),
        Some(2),
        "another user's socket joined the group"
    );

    drop((first, second, other));
    wait_for("the group goes with its last channel", || {
        group.counters().is_none()
    });
}
