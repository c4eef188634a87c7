//! Tuning without flags on real emulated paths (`hsxfer lab`: namespaces, a drop-tail
//! bottleneck, the NFQUEUE delay element): `hsxfer probe` measures the path and its profile
//! makes a plain copy fast; the online tuner adds channels where hosts' windows hold them
//! back, without oscillating, and retires those that did not pay. Needs root; prints SKIPPED
//! otherwise (CI runs as root).

mod common;

use std::path::Path;
use std::process::Output;
use std::sync::Mutex;
use std::time::Duration;

use common::netns::root_or_skip;
use common::{late_text, random_file};
use hsxfer::lab::element::{faithful, Releases};
use hsxfer::lab::flows::parse_trace;
use hsxfer::lab::{Host, Lab, LabSpec, QueueSize};
use hsxfer::transport::cc::CcCatalog;
use serde_json::Value;

/// One lab at a time: they measure rates on a 2-core machine.
static SERIAL: Mutex<()> = Mutex::new(());

fn program() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_hsxfer"))
}

/// A lab name unique to this test process.
fn name(tag: &str) -> String {
    format!("u{}{tag}", std::process::id() % 10000)
}

/// Removes the lab when the test ends, passed or not.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = Lab::down(&self.0);
    }
}

/// Runs hsxfer on sender 1 toward the lab's server; `args` go before the operands.
fn on_sender(lab: &Lab, args: &[&str]) -> Output {
    let out = lab
        .hsxfer(Host::Sender(1))
        .args(args)
        .output()
        .expect("run hsxfer in the lab");
    if !out.status.success() {
        panic!(
            "hsxfer {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

/// The last JSON line of an output.
fn last_json(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().expect("some output");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

fn token(lab: &Lab) -> String {
    lab.state.token_file.to_str().unwrap().to_string()
}

/// A lab of `rate_bps` × `rtt_ms` with `queue`, removed when the [`Cleanup`] drops.
fn lab(tag: &str, rate_bps: u64, rtt_ms: u64, queue: QueueSize) -> (Lab, LabSpec, Cleanup) {
    let spec = LabSpec {
        name: name(tag),
        rate_bps,
        rtts: vec![Duration::from_millis(rtt_ms)],
        queue,
        ..LabSpec::default()
    };
    let cleanup = Cleanup(spec.name.clone());
    let lab = Lab::up(&spec, program()).unwrap();
    (lab, spec, cleanup)
}

/// A lab of `rate_bps` × 40 ms with `queue`, whose receiver's sockets autotune to at most
/// 256 KiB, about half of it window (with `--buffer kernel`: an explicit SO_RCVBUF, which
/// hsxfer sets where it beats autotuning, would be capped by net.core.rmem_max instead,
/// which is not per network namespace). Removed when the [`Cleanup`] drops.
fn lab_with_small_windows(tag: &str, rate_bps: u64, queue: QueueSize) -> (Lab, LabSpec, Cleanup) {
    let (lab, spec, cleanup) = lab(tag, rate_bps, 40, queue);
    let set = lab
        .command(Host::Receiver, "sysctl")
        .args(["-qw", "net.ipv4.tcp_rmem=4096 131072 262144"])
        .status()
        .unwrap();
    assert!(set.success());
    (lab, spec, cleanup)
}

/// How many of the online tuner's decisions say `what`.
fn decisions_saying(online: &Value, what: &str) -> usize {
    online["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["what"].as_str().unwrap().contains(what))
        .count()
}

/// Runs `f` and the share of the delay element's releases meanwhile that came more than
/// 1 ms late (to its first publication of statistics after `f` ended).
fn with_late_share<T>(lab: &Lab, f: impl FnOnce() -> T) -> (T, Option<f64>) {
    let before = lab.releases();
    let out = f();
    let late = Releases::read_next(&lab.element_stats_path())
        .zip(before)
        .and_then(|(after, before)| after.late_share_since(&before));
    (out, late)
}

#[test]
fn a_probe_measures_a_tiny_queue_path_and_its_profile_makes_a_plain_copy_fast() {
    if !root_or_skip("probe and profile") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (lab, spec, _cleanup) = lab("p", 200_000_000, 40, QueueSize::Packets(16));
    let server = lab.addr(Host::Receiver).to_string();
    let token = token(&lab);
    let ceiling = spec.goodput_ceiling_bps();

    // A probe that misses its bound on a path the delay element did not emulate faithfully
    // (it woke late on a busy host and released bursts into the 16 packets) runs again, at
    // most four times (a bound on time: a faithful run is never run again); the bound is
    // judged on the last run.
    let mut reruns: Vec<String> = Vec::new();
    let probe = loop {
        let (probe, late) = with_late_share(&lab, || {
            let out = on_sender(&lab, &["probe", "--json", "--token-file", &token, &server]);
            // Its one line, as docs/json-schema.json describes it.
            common::validated_events(&out.stdout)
                .pop()
                .expect("a probe")
        });
        eprintln!("probe: {probe}");
        assert_eq!(probe["type"], "probe");
        // No rate measured misses the bound as a wrong one does (a CI run's probe measured
        // none here; its late share was not printed).
        let rate = probe["rate_bps"].as_f64().unwrap_or(0.0);
        let met = (rate / ceiling - 1.0).abs() <= 0.10;
        if !met && !faithful(late) && reruns.len() < 4 {
            reruns.push(format!(
                "probe rate {:.1} Mbit/s, {}",
                rate / 1e6,
                late_text(late)
            ));
            continue;
        }
        assert!(
            met,
            "probe rate {:.1} Mbit/s (0: none measured), goodput ceiling {:.1}, {} (run again before: {reruns:?})",
            rate / 1e6,
            ceiling / 1e6,
            late_text(late)
        );
        break probe;
    };
    let rtt = probe["rtt_ms"].as_f64().unwrap();
    assert!((rtt / 40.0 - 1.0).abs() <= 0.05, "probe RTT {rtt} ms");
    assert!(
        probe["recommendation"]["pace_bps"].as_u64().is_some(),
        "a 16-packet queue needs pacing: {}",
        probe["recommendation"]
    );
    assert!(probe["profile"].is_string(), "the profile was saved");

    // A copy with no flags at all now starts from the profile. The reference, measured in
    // the same run and alternated with it so both see the same host: the same copy with the
    // probe's recommendation given by hand (its `flags`), as a user who knew them would type.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("data");
    random_file(&file, 200 << 20, 7);
    let flags = probe["flags"].as_str().expect("the probe's flags");
    let by_hand: Vec<&str> = flags.split_whitespace().collect();
    let mut copies = 0;
    let mut copy = |given: &[&str]| {
        copies += 1;
        let dest = format!("{server}:data{copies}");
        let mut args = vec!["copy", "--json", "--token-file", &token];
        args.extend_from_slice(given);
        args.extend_from_slice(&[file.to_str().unwrap(), &dest]);
        let (out, late) = with_late_share(&lab, || last_json(&on_sender(&lab, &args)));
        assert!(out["verified"].as_bool().unwrap());
        (out, late)
    };
    // At least two pairs; more (up to four) until a plain copy ran on a faithful path, where
    // the issue's bound, 85 % of the ceiling, is judged too.
    let (mut tuned_sum, mut hand_sum, mut pairs) = (0.0, 0.0, 0);
    let mut runs: Vec<String> = Vec::new();
    let mut tuned_faithful: Vec<f64> = Vec::new();
    while pairs < 2 || (tuned_faithful.is_empty() && pairs < 4) {
        let (plain, late) = copy(&[]);
        let origin = plain["tuning"]["origin"].to_string();
        // The first starts from the probe's profile. A copy that ran 10 s or more saves what
        // its tuner measured as the profile (`learned_profile`), so the next may start from
        // that one: 200 MiB at this path's 171 Mbit/s take about 10 s.
        let from_probe = origin.contains("profile (probe");
        let learned = pairs > 0 && origin.contains("profile (copy");
        assert!(from_probe || learned, "copy {}: {origin}", pairs + 1);
        let tuned = plain["goodput_bps"].as_f64().unwrap();
        if faithful(late) {
            tuned_faithful.push(tuned);
        }
        runs.push(format!(
            "plain {:.1} Mbit/s, {}",
            tuned / 1e6,
            late_text(late)
        ));
        let (hand, late) = copy(&by_hand);
        let given = hand["goodput_bps"].as_f64().unwrap();
        runs.push(format!(
            "{flags} {:.1} Mbit/s, {}",
            given / 1e6,
            late_text(late)
        ));
        tuned_sum += tuned;
        hand_sum += given;
        pairs += 1;
    }
    let tuned = tuned_sum / f64::from(pairs);
    eprintln!("copies: {runs:?}");
    // As fast as the tuning given by hand, whatever the host; and on a path emulated
    // faithfully (the delay element on time) near the path's ceiling too.
    assert!(
        tuned_sum >= 0.9 * hand_sum,
        "plain copies {:.1} Mbit/s against {:.1} with the probe's flags given: {runs:?}",
        tuned / 1e6,
        hand_sum / f64::from(pairs) / 1e6
    );
    for t in &tuned_faithful {
        assert!(
            *t >= 0.85 * ceiling,
            "a plain copy after the probe on a faithful path: {:.1} Mbit/s of {:.1}: {runs:?}",
            t / 1e6,
            ceiling / 1e6
        );
    }
    if tuned_faithful.is_empty() {
        eprintln!("no plain copy ran on a faithful path: 85 % of the ceiling not judged");
    }

    // Unpaced cubic, as other tools run it, in the same test.
    let plain = last_json(&on_sender(
        &lab,
        &[
            "bench",
            "--json",
            "--tune",
            "off",
            "--pace",
            "off",
            "--cc",
            "cubic",
            "-n",
            "4",
            "--time",
            "8",
            "--token-file",
            &token,
            &server,
        ],
    ));
    let unpaced = plain["goodput_bps"].as_f64().unwrap();
    eprintln!(
        "tuned copies {:.3} of the ceiling, unpaced cubic ×4 {:.3}",
        tuned / ceiling,
        unpaced / ceiling
    );
    assert!(
        unpaced <= 0.9 * tuned,
        "unpaced cubic ×4 {:.1} Mbit/s against the tuned copy's {:.1}",
        unpaced / 1e6,
        tuned / 1e6
    );
}

#[test]
fn the_online_tuner_adds_channels_a_window_holds_back_and_settles() {
    if !root_or_skip("online channel growth") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // 200 Mbit/s × 40 ms is 1 MB; with the receiver's small windows four channels carry
    // about half the path.
    let (lab, spec, _cleanup) = lab_with_small_windows("g", 200_000_000, QueueSize::Bdp(1.0));
    let server = lab.addr(Host::Receiver).to_string();
    let token = token(&lab);
    let ceiling = spec.goodput_ceiling_bps();

    let fixed = last_json(&on_sender(
        &lab,
        &[
            "bench",
            "--json",
            "--tune",
            "off",
            "-n",
            "4",
            "--buffer",
            "kernel",
            "--time",
            "6",
            "--token-file",
            &token,
            &server,
        ],
    ));
    let tuned = last_json(&on_sender(
        &lab,
        &[
            "bench",
            "--json",
            "--buffer",
            "kernel",
            "--time",
            "20",
            "--token-file",
            &token,
            &server,
        ],
    ));
    let online = &tuned["tuning"]["online"];
    eprintln!("online tuner: {online}");
    let channels = online["channels"].as_u64().unwrap();
    let additions = decisions_saying(online, "adding");
    assert!(channels > 4, "no channel was added: {online}");
    assert!(
        additions <= 3,
        "{additions} additions in 20 s: the count oscillates or creeps: {online}"
    );
    let (start, end) = (
        fixed["goodput_bps"].as_f64().unwrap(),
        tuned["goodput_bps"].as_f64().unwrap(),
    );
    eprintln!(
        "4 fixed channels {:.3} of the ceiling, tuned {:.3} with {channels}",
        start / ceiling,
        end / ceiling
    );
    assert!(
        end >= start,
        "the tuned transfer ({:.1} Mbit/s) ended slower than 4 fixed channels ({:.1})",
        end / 1e6,
        start / 1e6
    );
}

#[test]
fn the_online_tuner_retires_added_channels_that_did_not_pay() {
    if !root_or_skip("online channel retirement") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // 50 Mbit/s × 40 ms is 250 kB, with a queue of twice that. With the receiver's small
    // windows the meter's one channel carries about 30 Mbit/s, four fill the link with every
    // window held back and nothing lost, and two more can bring nothing. The tuner adds
    // them, finds they did not pay, and retires them: they carry no more blocks, and the
    // transfer ends as usual.
    let (lab, _spec, _cleanup) = lab_with_small_windows("r", 50_000_000, QueueSize::Bdp(2.0));
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.csv");
    let out = last_json(&on_sender(
        &lab,
        &[
            "bench",
            "--json",
            "--buffer",
            "kernel",
            "--time",
            "10",
            "--trace",
            trace.to_str().unwrap(),
            "--token-file",
            &token(&lab),
            &lab.addr(Host::Receiver).to_string(),
        ],
    ));
    let online = &out["tuning"]["online"];
    eprintln!("online tuner: {online}");
    let decisions = online["decisions"].as_array().unwrap();
    let retired_at = decisions
        .iter()
        .find(|d| {
            d["what"]
                .as_str()
                .unwrap()
                .contains("retiring them, back to 4")
        })
        .unwrap_or_else(|| panic!("no channel was retired: {online}"))["t"]
        .as_f64()
        .unwrap();
    assert_eq!(online["channels"], 4, "{online}");
    let additions = decisions_saying(online, "adding");
    assert_eq!(additions, 1, "the count must freeze once retired: {online}");

    // Bytes each channel had acknowledged by `t` (the trace's rows, per channel, in time).
    let rows = parse_trace(&std::fs::read_to_string(&trace).unwrap());
    let acked_by = |channel: u16, t: f64| -> u64 {
        rows.iter()
            .rev()
            .find(|r| r.channel == channel && r.t <= t)
            .map_or(0, |r| r.bytes_acked)
    };
    // A retired channel finishes the block it carries (at most a second at its share here).
    let (from, to) = (retired_at + 2.0, 9.5);
    assert!(from < to, "retired too late to check: {online}");
    for ch in 0..4 {
        let moved = acked_by(ch, to) - acked_by(ch, from);
        assert!(
            moved > 0,
            "channel {ch} idle after the retirement: {online}"
        );
    }
    for ch in 4..6 {
        assert!(
            acked_by(ch, from) > 0,
            "channel {ch} never carried data: {online}"
        );
        let moved = acked_by(ch, to) - acked_by(ch, from);
        assert_eq!(
            moved, 0,
            "retired channel {ch} still carries blocks: {online}"
        );
    }
}

/// Unregisters a bundled congestion control this test registered, when it drops.
struct Unregister(Option<&'static str>);

impl Drop for Unregister {
    fn drop(&mut self) {
        if let Some(cc) = self.0 {
            let _ = std::process::Command::new(program())
                .args(["cc", "unload", cc])
                .status();
        }
    }
}

/// The host's `tcp_allowed_congestion_control`, with one more for the test's time.
struct Allowed(String);

const ALLOWED: &str = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";

impl Allowed {
    fn with(cc: &str) -> Allowed {
        let was = CcCatalog::read().unwrap().allowed.join(" ");
        std::fs::write(ALLOWED, format!("{was} {cc}")).unwrap();
        Allowed(was)
    }
}

impl Drop for Allowed {
    fn drop(&mut self) {
        let _ = std::fs::write(ALLOWED, &self.0);
    }
}

#[test]
fn a_first_copy_of_policy_fast_runs_bic_under_its_caps_where_bic_is_registered() {
    if !root_or_skip("bic under the caps") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Registered as an administrator would (`sudo hsxfer cc load bic --pin`), and
    // unregistered at the end unless it already was, so the other tests' copies run the
    // host's own choice.
    let registered = CcCatalog::read()
        .unwrap()
        .available
        .iter()
        .any(|c| c == "bic");
    let _unregister = Unregister((!registered).then_some("bic"));
    let out = std::process::Command::new(program())
        .args(["cc", "load", "bic", "--pin"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let (lab, _, _cleanup) = lab("b", 100_000_000, 20, QueueSize::Packets(16));
    // The sender's default congestion control cubic, as on most hosts (it is per network
    // namespace): `--policy fast` then runs cubic where no caps hold the channels. Outside
    // the first namespace a default must be one the host allows everyone.
    let _allowed = Allowed::with("cubic");
    let set = lab
        .command(Host::Sender(1), "sysctl")
        .args(["-qw", "net.ipv4.tcp_congestion_control=cubic"])
        .status()
        .unwrap();
    assert!(set.success());
    let server = lab.addr(Host::Receiver).to_string();
    let token = token(&lab);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("data");
    random_file(&file, 40 << 20, 11);
    // A meter that ends without a rate (a busy host's stall) leaves no caps, and the channels
    // on the host's choice: judged too, but the copy runs again (at most twice more) until one
    // ran under caps.
    let mut copies = Vec::new();
    loop {
        let dest = format!("{server}:data{}", copies.len());
        let summary = last_json(&on_sender(
            &lab,
            &[
                "copy",
                "--json",
                "--policy",
                "fast",
                "--token-file",
                &token,
                file.to_str().unwrap(),
                &dest,
            ],
        ));
        assert!(summary["verified"].as_bool().unwrap(), "{summary}");
        let online = summary["tuning"]["online"].clone();
        let ccs: Vec<String> = summary["channels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["cc"].as_str().unwrap_or("").to_string())
            .collect();
        // Caps from the meter's rate, unless random loss removed them since: then the
        // channels switch to BBR (`policy` fast).
        let lossy = online["lossy"] == true;
        let capped = online["rate_bps"].as_u64().is_some() && !lossy;
        let expected = match (lossy, capped) {
            (true, _) => "bbr",
            (false, true) => "bic",
            (false, false) => "cubic",
        };
        eprintln!(
            "copy {}: channels {ccs:?}, under caps: {capped}, random loss: {lossy}",
            copies.len() + 1
        );
        assert!(
            ccs.iter().all(|c| c == expected),
            "channels ran {ccs:?}, expected {expected}: {online}"
        );
        assert_eq!(
            decisions_saying(&online, "running bic under the caps in place of cubic"),
            (capped || lossy) as usize,
            "{online}"
        );
        copies.push(capped);
        if capped || copies.len() == 3 {
            break;
        }
    }
    assert!(
        copies.last() == Some(&true),
        "no copy ran under caps in {} tries",
        copies.len()
    );
}
