//! Transport settings checked with real transfers through a namespace bottleneck (TBF +
//! drop-tail `pfifo`): congestion control per channel (also over a route's `congctl`, and
//! refused under `congctl lock`), buffer sizes against the plan and its clamp warning, pacing
//! caps, staggered starts, loss events. Needs root; prints SKIPPED otherwise (CI runs as
//! root).

mod common;

use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use common::netns::{root_or_skip, Dumbbell, ServerProc, RECEIVER, SENDER, SENDER2};
use serde_json::Value;

/// One bottleneck test at a time: they measure rates on a 2-core machine.
static SERIAL: Mutex<()> = Mutex::new(());

const PORT: u16 = 7433;

struct Path {
    net: Dumbbell,
    /// The server; `None` only while [`Path::serve_again`] replaces it.
    server: Option<ServerProc>,
    token: PathBuf,
    _dir: tempfile::TempDir,
}

fn path(rate_mbit: u32, queue: u32) -> Path {
    path_with(rate_mbit, queue, &[])
}

/// A path whose server runs `hsxfer serve ... SERVE_ARGS`.
fn path_with(rate_mbit: u32, queue: u32, serve_args: &[&str]) -> Path {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    hsxfer::session::token::new(&token).unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let net = Dumbbell::up(rate_mbit, queue);
    let server = net.serve_with(&root, &token, PORT, serve_args);
    Path {
        net,
        server: Some(server),
        token,
        _dir: dir,
    }
}

impl Path {
    fn bench_args(&self, extra: &[&str]) -> Vec<String> {
        let mut a: Vec<String> = ["bench", "--json", "--port", &PORT.to_string()]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.extend(["--token-file".into(), self.token.to_str().unwrap().into()]);
        a.extend(extra.iter().map(|s| s.to_string()));
        a.push(RECEIVER.into());
        a
    }

    /// Runs a bench from the sender host; returns its validated NDJSON events.
    fn bench(&self, extra: &[&str]) -> Vec<Value> {
        let args = self.bench_args(extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        events(self.net.client(&args))
    }

    /// Stops the server as an operator would (so that it puts back what it set) and starts
    /// another with `serve_args`, on the same root, token and port.
    fn serve_again(&mut self, serve_args: &[&str]) {
        if let Some(s) = self.server.take() {
            s.terminate();
        }
        let root = self._dir.path().join("root");
        self.server = Some(self.net.serve_with(&root, &self.token, PORT, serve_args));
    }

    /// Asserts that the sender's MPTCP path manager has no endpoints and the limits it had
    /// before hsxfer raised them (its namespace starts with none accepted).
    fn sender_path_manager_is_as_before(&self) {
        let ip = |args: &[&str]| {
            let out = self
                .net
                .command("s", "ip")
                .arg("mptcp")
                .args(args)
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        assert!(ip(&["endpoint", "show"]).trim().is_empty());
        assert!(ip(&["limits", "show"]).contains("add_addr_accepted 0"));
    }

    /// Runs a bench, and `ss` in `host`'s namespace `after` it started; returns both.
    fn bench_with_ss(
        &self,
        extra: &[&str],
        host: &str,
        ss: &[&str],
        after: Duration,
    ) -> (Vec<Value>, String) {
        let child = self
            .net
            .command("s", env!("CARGO_BIN_EXE_hsxfer"))
            .args(self.bench_args(extra))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(after);
        let ss_out = self.net.command(host, "ss").args(ss).output().unwrap();
        let out = child.wait_with_output().unwrap();
        (
            events(out),
            String::from_utf8_lossy(&ss_out.stdout).into_owned(),
        )
    }
}

fn events(out: Output) -> Vec<Value> {
    assert!(
        out.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    common::validated_events(&out.stdout)
}

fn summary(events: &[Value]) -> &Value {
    let s = events.last().unwrap();
    assert_eq!(s["type"], "summary");
    assert_eq!(s["verified"], true);
    s
}

fn channel_field<'a>(s: &'a Value, field: &str) -> Vec<&'a Value> {
    s["channels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c[field])
        .collect()
}

/// Congestion-control names `ss -ti` shows on the data sockets (the connection line is
/// followed by an info line starting with the algorithm).
fn ss_algorithms(ss: &str) -> Vec<String> {
    ss.lines()
        .filter(|l| l.starts_with(char::is_whitespace))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

fn count(v: &[String], name: &str) -> usize {
    v.iter().filter(|x| *x == name).count()
}

/// Runs `bench extra` (a 2 s bench, `-R` for a pull) and checks the congestion controls
/// twice: the channels' own report must be `reported`, and the kernel's list of `host`'s
/// sockets to or from the server (`ss`, 1.2 s in) must hold each of `seen` (name, count)
/// that many times.
fn check_ccs(p: &Path, extra: &[&str], host: &str, reported: &[&str], seen: [(&str, usize); 2]) {
    let pull = extra.contains(&"-R");
    let filter = format!("{} {RECEIVER}:{PORT}", if pull { "src" } else { "dst" });
    let mut args = extra.to_vec();
    args.extend_from_slice(&["--time", "2"]);
    let (ev, ss) = p.bench_with_ss(
        &args,
        host,
        &["-tinH", &filter],
        Duration::from_millis(1200),
    );
    assert_eq!(channel_field(summary(&ev), "cc"), reported);
    let algs = ss_algorithms(&ss);
    let counts = seen.map(|(name, _)| count(&algs, name));
    assert_eq!(counts, seen.map(|(_, n)| n), "{seen:?} in: {ss}");
}

fn lock() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn each_channel_runs_the_congestion_control_asked_for_in_both_directions() {
    if !root_or_skip("cc per channel") {
        return;
    }
    let _g = lock();
    let p = path(200, 100);
    // Independently of hsxfer, the kernel's socket list too (the control connection keeps
    // the host default, which is neither here).
    check_ccs(
        &p,
        &["-n", "4", "--cc", "cubic,reno"],
        "s",
        &["cubic", "reno", "cubic", "reno"],
        [("cubic", 2), ("reno", 2)],
    );
    // Pull direction: the server sets them on its sockets.
    check_ccs(
        &p,
        &["-R", "-n", "2", "--cc", "reno,cubic"],
        "d",
        &["reno", "cubic"],
        [("cubic", 1), ("reno", 1)],
    );

    // An algorithm that is not registered (and not bundled, which root would register on
    // demand) is refused on the side that sends, naming the choices.
    for (dir, side) in [("", "client"), ("-R", "server")] {
        let mut args = p.bench_args(&["--cc", "vegas", "--time", "1"]);
        if !dir.is_empty() {
            args.insert(1, dir.into());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = p.net.client(&args);
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!(
                "congestion control 'vegas' is not available on the {side}; available: "
            )) && !err.contains("cc load"),
            "{err}"
        );
    }
}

#[test]
fn a_route_congctl_gives_way_to_the_congestion_control_asked_for_in_both_directions() {
    if !root_or_skip("route congctl") {
        return;
    }
    let _g = lock();
    let p = path(200, 100);
    // Push: the sender's route names cubic, which the kernel applies at connect over the reno
    // set before it; the client sets reno again. The control connection keeps the route's.
    p.net.congctl_route("s", &["cubic"]);
    let reno = ["-n", "2", "--cc", "reno"];
    let seen = [("reno", 2), ("cubic", 1)];
    check_ccs(&p, &reno, "s", &["reno", "reno"], seen);

    // Pull: the server's accepted sockets get its route's cubic; it sets reno again.
    p.net.congctl_route("d", &["cubic"]);
    check_ccs(
        &p,
        &[&["-R"][..], &reno].concat(),
        "d",
        &["reno", "reno"],
        seen,
    );
}

/// Bytes sent so far by `host`'s interfaces other than loopback (`/proc/net/dev`).
fn tx_bytes(net: &Dumbbell, host: &str) -> u64 {
    let out = net
        .command(host, "cat")
        .arg("/proc/net/dev")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(2)
        .filter_map(|l| l.split_once(':'))
        .filter(|(dev, _)| dev.trim() != "lo")
        .map(|(_, v)| v.split_whitespace().nth(8).unwrap().parse::<u64>().unwrap())
        .sum()
}

#[test]
fn a_locked_route_congctl_stops_the_transfer_before_data_moves_in_both_directions() {
    if !root_or_skip("route congctl lock") {
        return;
    }
    let _g = lock();
    let p = path(200, 100);
    for (dir, host, side, peer) in [
        (None, "s", "client", RECEIVER),
        (Some("-R"), "d", "server", SENDER),
    ] {
        p.net.congctl_route(host, &["lock", "cubic"]);
        let sent = tx_bytes(&p.net, host);
        let mut args = p.bench_args(&["-n", "2", "--cc", "reno", "--time", "2"]);
        args.splice(1..1, dir.map(String::from));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = p.net.client(&args);
        let moved = tx_bytes(&p.net, host) - sent;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{dir:?}: {err}");
        // One line of error; before it, at most the note that the server's key was
        // recorded on this first contact (a failed transfer shows its notes).
        let others = err
            .lines()
            .filter(|l| !l.starts_with("hsxfer: warning: client: first contact with "));
        assert_eq!(others.count(), 1, "{dir:?}: {err}");
        assert!(
            err.contains(&format!(
                "congestion control reno was asked for but the {side}'s route to {peer} forces \
                 cubic (ip route get {peer} shows \"congctl lock cubic\"): remove the lock or \
                 run without --cc"
            )),
            "{dir:?}: {err}"
        );
        // Handshakes, pings and the abort only: one block is 4 MiB.
        assert!(moved < 64 << 10, "{dir:?}: the {side} sent {moved} bytes");

        // The server serves on, and the algorithm the route locks may be asked for (setting
        // even that one fails under the lock, so it must not be set again).
        let mut args = vec!["-n", "2", "--cc", "cubic", "--time", "1"];
        args.extend(dir);
        let ev = p.bench(&args);
        assert_eq!(channel_field(summary(&ev), "cc"), ["cubic", "cubic"]);
    }
}

fn sysctl(name: &str) -> u64 {
    hsxfer::tuning::sysctl::read_u64(name).unwrap()
}

#[test]
fn buffers_follow_rate_and_rtt_and_a_clamp_warns_with_the_fix() {
    if !root_or_skip("buffers") {
        return;
    }
    let _g = lock();
    let p = path(200, 100);
    // Autotuning limits are per namespace: fix them so the plan is known.
    let set = |host: &str, kv: &str| {
        let ok = p
            .net
            .command(host, "sysctl")
            .args(["-qw", kv])
            .status()
            .unwrap();
        assert!(ok.success());
    };
    set("s", "net.ipv4.tcp_wmem=4096 16384 4194304");
    set("d", "net.ipv4.tcp_rmem=4096 131072 6291456");
    let (wmem_max, rmem_max) = (sysctl("net.core.wmem_max"), sysctl("net.core.rmem_max"));
    // 1 Gbit/s × 100 ms over 2 channels: a window of 12.5 MB each (BDP share × 2), which
    // needs kernel buffers of 25 MB; requests are capped at [rw]mem_max, doubled.
    let window: u64 = 12_500_000;
    let (want_snd, want_rcv) = (2 * window.min(wmem_max), 2 * window.min(rmem_max));
    assert!(
        want_snd > 4194304 && want_rcv > 6291456,
        "explicit sizes beat autotuning here"
    );
    let src = format!("src {RECEIVER}:{PORT}");
    let (ev, ss) = p.bench_with_ss(
        &["-n", "2", "--rate", "1G", "--rtt", "100ms", "--time", "1.5"],
        "d",
        &["-tmH", &src],
        Duration::from_millis(800),
    );
    let s = summary(&ev);
    assert_eq!(channel_field(s, "send_buffer"), [want_snd, want_snd]);
    assert_eq!(channel_field(s, "send_buffer_requested"), [window, window]);
    let rb = format!("rb{want_rcv},");
    assert_eq!(ss.matches(&rb).count(), 2, "server receive buffers: {ss}");
    let warnings: Vec<&str> = ev
        .iter()
        .filter(|e| e["type"] == "warning")
        .map(|e| e["message"].as_str().unwrap())
        .collect();
    // A cap is warned about when it holds the kernel buffer under one window, so that the
    // channels cannot reach the rate; the fix covers the headroom too.
    let fix =
        "sysctl -w net.core.wmem_max=25165824; sysctl -w net.ipv4.tcp_wmem=\"4096 16384 25165824\"";
    assert_eq!(
        warnings
            .iter()
            .any(|w| w.starts_with("client: send buffers are capped") && w.contains(fix)),
        want_snd < window,
        "{warnings:#?}"
    );
    assert_eq!(
        warnings
            .iter()
            .any(|w| w.starts_with("server: receive buffers are capped")
                && w.contains("sysctl -w net.core.rmem_max=25165824")),
        want_rcv < window,
        "{warnings:#?}"
    );
    // A fixed request is granted doubled, with no warning when within the limits.
    let ev = p.bench(&["-n", "2", "--buffer", "1M", "--time", "0.5"]);
    assert_eq!(
        channel_field(summary(&ev), "send_buffer"),
        [2 << 20, 2 << 20]
    );
    assert!(ev.iter().all(|e| e["type"] != "warning"));
}

#[test]
fn a_paced_channel_stays_within_ten_percent_of_its_cap() {
    if !root_or_skip("pacing") {
        return;
    }
    let _g = lock();
    let p = path(500, 200);
    for dir in [&[][..], &["-R"][..]] {
        let mut args = vec![
            "-n",
            "2",
            "--pace",
            "100M",
            "--stagger",
            "off",
            "--time",
            "4",
        ];
        args.extend_from_slice(dir);
        let s = summary(&p.bench(&args)).clone();
        assert_eq!(channel_field(&s, "pace_bps"), [100_000_000, 100_000_000]);
        for g in channel_field(&s, "goodput_bps") {
            let g = g.as_f64().unwrap();
            eprintln!(
                "pacing {dir:?}: goodput {:.1} Mbit/s under a 100 Mbit/s cap",
                g / 1e6
            );
            assert!(
                (g - 100e6).abs() < 10e6,
                "{dir:?}: goodput {g} vs cap 100 Mbit/s"
            );
        }
    }
}

#[test]
fn staggered_channels_start_as_far_apart_as_configured() {
    if !root_or_skip("stagger") {
        return;
    }
    let _g = lock();
    let p = path(100, 100);
    for dir in [&[][..], &["-R"][..]] {
        let mut args = vec!["-n", "4", "--stagger", "300ms", "--time", "2"];
        args.extend_from_slice(dir);
        let s = summary(&p.bench(&args)).clone();
        let starts: Vec<f64> = channel_field(&s, "started_s")
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        eprintln!("stagger {dir:?}: started at {starts:?}");
        for w in starts.windows(2) {
            let gap = w[1] - w[0];
            // Timers on a loaded 2-core host fire up to a few tens of ms late.
            assert!((gap - 0.3).abs() < 0.1, "{dir:?}: starts {starts:?}");
        }
        let planned: Vec<f64> = channel_field(&s, "stagger_s")
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(planned, [0.0, 0.3, 0.6, 0.9]);
    }
}

#[test]
fn losses_at_a_small_queue_are_seen_and_measured() {
    if !root_or_skip("loss events") {
        return;
    }
    let _g = lock();
    let p = path(100, 16);
    let ev = p.bench(&["-n", "4", "--cc", "reno", "--stagger", "off", "--time", "4"]);
    let s = summary(&ev);
    let drops: u64 = p
        .net
        .bottleneck_stats()
        .split("dropped ")
        .nth(1)
        .and_then(|t| t.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(drops > 0, "the bottleneck dropped nothing");
    assert!(s["retransmits"].as_u64().unwrap() > 0, "{s}");
    let events: u64 = channel_field(s, "loss_events")
        .iter()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert!(events > 0, "{s}");
    let sync = &s["loss_sync"];
    eprintln!(
        "losses: {drops} drops, {events} loss events, {} retransmits, sync {sync}",
        s["retransmits"]
    );
    let t = sync["congestion_events"].as_u64().unwrap();
    assert!(t > 0 && t <= events, "{s}");
    let g = sync["global"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&g));
    let jain = s["fairness_jain"].as_f64().unwrap();
    assert!(jain > 0.25 && jain <= 1.0 + 1e-9);
}

/// MPTCP on one path, both ends root: the server announces its subflow ports, and
/// `bench --mptcp -n 4 --pace 20M` runs one MPTCP connection whose 4 subflows each carry
/// data (`ss` on the sender counts the TCP sockets that moved over a megabyte), each capped
/// at 20 Mbit/s by the BPF pacer (`ss` shows the cap), so that together they stay under
/// 80 Mbit/s on a 200 Mbit/s path; the summary says so, with one row per subflow. With
/// `--cc dmctcp` the subflows form one DMCTCP group; with no flags the meter paces them;
/// `probe --mptcp` tries its configurations over subflows.
#[test]
fn mptcp_subflows_are_paced_reported_and_grouped() {
    if !root_or_skip("mptcp_subflows_are_paced_reported_and_grouped") {
        return;
    }
    let _g = lock();
    let p = path_with(200, 100, &["--mptcp"]);
    let (events, ss) = p.bench_with_ss(
        &[
            "--mptcp", "-n", "4", "--time", "4", "--pace", "20M", "--tune", "off",
        ],
        "s",
        &["-tniH", "dst", RECEIVER],
        Duration::from_secs(3),
    );
    let s = summary(&events);
    assert_eq!(s["transport"], "mptcp", "{s}");
    assert_eq!(s["subflows"], 4, "{s}");
    let field = |prefix: &'static str| {
        ss.lines()
            .filter_map(move |l| l.split_whitespace().find_map(|w| w.strip_prefix(prefix)))
            .collect::<Vec<_>>()
    };
    let busy = field("bytes_acked:")
        .into_iter()
        .filter_map(|n| n.parse::<u64>().ok())
        .filter(|&n| n > 1 << 20)
        .count();
    assert_eq!(busy, 4, "subflows that carried data:\n{ss}");
    // `ss` shows "pacing_rate NOWbps/CAPbps" on a capped socket; the control connection,
    // which is not MPTCP, has no cap.
    let capped = ss
        .lines()
        .filter(|l| l.contains("bytes_acked:") && l.contains("/20000000bps"))
        .count();
    assert_eq!(capped, 4, "subflows capped at 20 Mbit/s:\n{ss}");
    let goodput = s["goodput_bps"].as_f64().unwrap();
    assert!(
        (40e6..=80e6 * 1.02).contains(&goodput),
        "4 subflows capped at 20 Mbit/s moved {goodput} bit/s"
    );
    // The summary's rows are the subflows, each with its addresses, its cap read back from
    // the kernel, and its share of the bytes.
    let rows = s["channels"].as_array().unwrap();
    assert_eq!(rows.len(), 4, "{s}");
    let mut remotes: Vec<&str> = rows.iter().filter_map(|c| c["remote"].as_str()).collect();
    remotes.sort();
    remotes.dedup();
    assert_eq!(remotes.len(), 4, "one remote port per subflow: {s}");
    for c in rows {
        assert!(c["local"].as_str().is_some(), "{c}");
        assert_eq!(c["pace_bps"], 20_000_000, "{c}");
        assert!(c["bytes"].as_u64().unwrap() > 1 << 20, "{c}");
        // Each subflow held its cap within 10 %.
        let g = c["goodput_bps"].as_f64().unwrap();
        assert!(
            g <= 20e6 * 1.1,
            "a subflow capped at 20 Mbit/s moved {g} bit/s: {c}"
        );
    }
    // A file over 4 subflows arrives identical, each subflow carrying part of it.
    let src = p._dir.path().join("src.bin");
    common::random_file(&src, 24 << 20, 7);
    let args = p.bench_args(&["--mptcp", "-n", "4", src.to_str().unwrap()]);
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    args[0] = "copy";
    let dest = format!("{RECEIVER}:copied.bin");
    *args.last_mut().unwrap() = &dest;
    let copied = self::events(p.net.client(&args));
    let s = summary(&copied);
    assert_eq!(s["transport"], "mptcp", "{s}");
    assert_eq!(s["subflows"], 4, "{s}");
    for c in s["channels"].as_array().unwrap() {
        assert!(c["bytes"].as_u64().unwrap() > 0, "{c}");
    }
    assert_eq!(
        common::sha256(&src),
        common::sha256(&p._dir.path().join("root").join("copied.bin"))
    );
    // DMCTCP over the subflows, unpaced so that the queue overflows: they form one group in
    // the kernel by themselves (no tag), which cuts, and the summary reads its counters back
    // by the connection's token.
    let events = p.bench(&[
        "--mptcp", "-n", "4", "--time", "3", "--cc", "dmctcp", "--pace", "off",
    ]);
    let s = summary(&events);
    assert!(s["dmctcp"]["cuts"].as_u64().unwrap() >= 1, "{s}");
    // Every subflow is in the group. (On this path without delay the server's 8 port
    // announcements arrive together, and the path manager has once let a fifth subflow in.)
    assert!(s["subflows"].as_u64().unwrap() >= 4, "{s}");
    assert_eq!(s["dmctcp"]["channels"], s["subflows"], "{s}");
    for c in s["channels"].as_array().unwrap() {
        assert_eq!(c["cc"], "dmctcp", "{c}");
    }
    // No flags: the online tuner's meter measures the path over the connection (its
    // subflows together) and caps the connection, which its subflows share. How close the
    // meter gets, and the caps that follow, are measured on a long path (docs/lab.md): this
    // one has no delay, so a round is shorter than the sampler's tick, and the caps may go
    // again as random loss.
    let events = p.bench(&["--mptcp", "-n", "4", "--time", "3"]);
    let s = summary(&events);
    let online = &s["tuning"]["online"];
    assert_eq!(online["meter"], "full", "{s}");
    let paced = online["decisions"].as_array().unwrap().iter().any(|d| {
        d["what"].as_str().is_some_and(|w| {
            w.contains("the meter filled the path") && w.contains("pacing 1 channels")
        })
    });
    assert!(paced, "{online}");
    // The meter ran reno; the switch to the steady congestion control reached every subflow.
    let rows = s["channels"].as_array().unwrap();
    assert!(
        rows.iter()
            .all(|c| c["cc"] == rows[0]["cc"] && c["cc"] != "reno"),
        "{s}"
    );
    // `probe --mptcp` tries its configurations over subflows (at most 9 of them) and
    // recommends `--mptcp`.
    let mut args = p.bench_args(&["--mptcp", "--budget", "5"]);
    args[0] = "probe".into();
    // Its profile goes to a cache of its own, so the other tests here do not start from it.
    let cache = tempfile::tempdir().unwrap();
    let out = p
        .net
        .command("s", env!("CARGO_BIN_EXE_hsxfer"))
        .env("XDG_CACHE_HOME", cache.path())
        .args(&args)
        .output()
        .unwrap();
    let probe: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
    });
    assert_eq!(probe["type"], "probe", "{probe}");
    assert!(
        probe["flags"].as_str().unwrap().starts_with("--mptcp "),
        "{probe}"
    );
    let tried = probe["candidates"].as_array().unwrap();
    assert!(
        tried.iter().all(|c| c["channels"].as_u64().unwrap() <= 9),
        "{probe}"
    );
    // The sender's path-manager limits are back as they were, and it announced nothing.
    p.sender_path_manager_is_as_before();
}

#[test]
fn mptcp_subflows_take_a_second_path_when_the_host_has_one() {
    if !root_or_skip("mptcp_subflows_take_a_second_path_when_the_host_has_one") {
        return;
    }
    let _g = lock();
    let p = path_with(100, 100, &["--mptcp"]);
    p.net.second_path(60, 100);
    let sent = || (p.net.bottleneck_sent("r"), p.net.bottleneck_sent("q"));
    // A second local address routed out through another interface is found by itself; each
    // path gets -n subflows (the second one to each port the server announced).
    let before = sent();
    let events = p.bench(&["--mptcp", "-n", "2", "--time", "4"]);
    let after = sent();
    let s = summary(&events);
    assert_eq!(s["transport"], "mptcp", "{s}");
    let notes = s["tuning"]["notes"].to_string();
    assert!(notes.contains("over 2 paths"), "{notes}");
    assert!(notes.contains("unpaced"), "{notes}");
    let rows = s["channels"].as_array().unwrap();
    for from in [SENDER, SENDER2] {
        let bytes: u64 = rows
            .iter()
            .filter(|c| {
                c["local"]
                    .as_str()
                    .unwrap()
                    .starts_with(&format!("{from}:"))
            })
            .map(|c| c["bytes"].as_u64().unwrap())
            .sum();
        assert!(
            bytes > 4 << 20,
            "subflows from {from} moved {bytes} bytes: {s}"
        );
    }
    // Both bottlenecks carried data, and together more than the faster one can alone.
    let (one, two) = (after.0 - before.0, after.1 - before.1);
    assert!(two > one / 5, "path 1 sent {one} bytes, path 2 {two}");
    let goodput = s["goodput_bps"].as_f64().unwrap();
    assert!(
        goodput > 100e6,
        "two paths of 100 and 60 Mbit/s moved {goodput} bit/s"
    );
    // The endpoints hsxfer added are gone, and the limits back as they were.
    p.sender_path_manager_is_as_before();
    // Off: the kernel's choice only.
    let events = p.bench(&["--mptcp", "-n", "2", "--time", "2", "--mptcp-paths", "off"]);
    let s = summary(&events);
    for c in s["channels"].as_array().unwrap() {
        assert!(
            c["local"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{SENDER}:")),
            "{c}"
        );
    }
    // An address this host does not have: a one-line error before anything is set.
    let args = p.bench_args(&["--mptcp", "--time", "1", "--mptcp-paths", "10.9.3.9"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = p.net.client(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("10.9.3.9 is not an address of this host"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    p.sender_path_manager_is_as_before();
}

#[test]
fn more_than_nine_mptcp_subflows_with_the_userspace_path_manager() {
    if !root_or_skip("more_than_nine_mptcp_subflows_with_the_userspace_path_manager") {
        return;
    }
    let _g = lock();
    // A server with the kernel's path manager takes 9 subflows: the client says so, and
    // its rows are the 9 that joined.
    let mut p = path_with(200, 100, &["--mptcp"]);
    let pm_type = |p: &Path, host: &str| {
        let out = p
            .net
            .command(host, "cat")
            .arg("/proc/sys/net/mptcp/pm_type")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let sixteen = [
        "--mptcp", "-n", "16", "--time", "3", "--tune", "off", "--pace", "off",
    ];
    let events = p.bench(&sixteen);
    let s = summary(&events);
    assert_eq!(s["subflows"], 9, "{s}");
    assert_eq!(s["channels"].as_array().unwrap().len(), 9, "{s}");
    assert!(
        s["tuning"]["notes"]
            .to_string()
            .contains("9 of 16 MPTCP subflows"),
        "{s}"
    );
    // With the userspace one on both ends, the client opens 16 from one address to the
    // server's port, and each carries data.
    p.serve_again(&["--mptcp", "--mptcp-pm", "userspace"]);
    assert_eq!(pm_type(&p, "d"), "1");
    let events = p.bench(&sixteen);
    let s = summary(&events);
    assert_eq!(s["transport"], "mptcp", "{s}");
    // The kernel's MPTCP counters of each end say where joins were lost, should some be.
    let counters = |host: &str| {
        let out = p.net.command(host, "nstat").arg("-asz").output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("MPTcp") && l.split_whitespace().nth(1) != Some("0"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    assert_eq!(
        s["subflows"],
        16,
        "{s}\nclient's counters: {}\nserver's counters: {}",
        counters("s"),
        counters("d")
    );
    let rows = s["channels"].as_array().unwrap();
    assert_eq!(rows.len(), 16, "{s}");
    for c in rows {
        assert_eq!(c["remote"], format!("{RECEIVER}:{PORT}"), "{c}");
        assert!(c["bytes"].as_u64().unwrap() > 0, "{c}");
    }
    // Each end's namespace selects the in-kernel path manager again afterwards.
    assert_eq!(pm_type(&p, "s"), "0");
    p.server.take().unwrap().terminate();
    assert_eq!(pm_type(&p, "d"), "0");
}

/// A join whose SYN is lost is sent again by the kernel after its first 1 s timeout: the
/// client waits for it rather than starting with fewer subflows than asked for. The server's
/// host drops the first SYN of 3 of the 15 joins (every fifth MPTCP SYN, once per port).
#[test]
fn mptcp_joins_whose_syn_was_lost_are_waited_for() {
    if !root_or_skip("mptcp_joins_whose_syn_was_lost_are_waited_for") {
        return;
    }
    let _g = lock();
    let p = path_with(200, 100, &["--mptcp", "--mptcp-pm", "userspace"]);
    let drop_rule = [
        "INPUT",
        "-p",
        "tcp",
        "--syn",
        "-m",
        "tcp",
        "--tcp-option",
        "30",
        "-m",
        "statistic",
        "--mode",
        "nth",
        "--every",
        "5",
        "--packet",
        "4",
        "-m",
        "hashlimit",
        "--hashlimit-upto",
        "1/hour",
        "--hashlimit-burst",
        "1",
        "--hashlimit-mode",
        "srcip,srcport",
        "--hashlimit-name",
        "joins",
        "-j",
        "DROP",
    ];
    let added = p
        .net
        .command("d", "iptables")
        .arg("-A")
        .args(drop_rule)
        .status();
    assert!(added.unwrap().success(), "iptables refused the rule");
    let events = p.bench(&[
        "--mptcp", "-n", "16", "--time", "3", "--tune", "off", "--pace", "off",
    ]);
    let s = summary(&events);
    let listed = p
        .net
        .command("d", "iptables")
        .args(["-nvxL", "INPUT"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    let dropped: u64 = listed
        .lines()
        .find(|l| l.contains("DROP"))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    assert!(dropped >= 3, "the rule dropped {dropped} SYNs: {listed}");
    assert_eq!(s["subflows"], 16, "{s}");
    for c in s["channels"].as_array().unwrap() {
        assert!(c["bytes"].as_u64().unwrap() > 0, "{c}");
    }
}
