//! Bounds checks of what a client asks a server for. A request is decoded from JSON the peer
//! wrote, so every count, size and duration in it is checked against [`super::limits`]
//! before the server allocates, schedules or converts anything from it: `interval_ms: 0` or
//! `seconds: 1e300` would otherwise panic a task in a timer or a `Duration` conversion.
//! What a server tells its client about itself and its channels is checked too
//! ([`check_telemetry`], [`check_facts`]): it is kept per channel and printed.

use super::control::BufferRequest;
use super::control::{HostFacts, Operation, Request, Tuning, PROTOCOL_VERSION};
use super::limits::*;
use super::telemetry::TelemetryBatch;
use super::Violation;

/// A request outside what this server accepts; the text says what and the allowed range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(pub String);

fn bad<T>(what: String) -> Result<T, BadRequest> {
    Err(BadRequest(what))
}

impl Request {
    /// Checks every field against [`super::limits`].
    ///
    /// # Examples
    ///
    /// ```
    /// use hsxfer::channels::control::{Operation, Request, Tuning, PROTOCOL_VERSION};
    ///
    /// let mut req = Request {
    ///     version: PROTOCOL_VERSION,
    ///     op: Operation::Pull { sources: vec!["data".into()], recursive: true, unplanned_files: 0 },
    ///     channels: 4,
    ///     block_size: 4 << 20,
    ///     tuning: Tuning::kernel_defaults(4),
    /// };
    /// assert!(req.check().is_ok());
    /// req.tuning.interval_ms = 0;
    /// assert!(req.check().is_err());
    /// ```
    pub fn check(&self) -> Result<(), BadRequest> {
        if self.version != PROTOCOL_VERSION {
            return bad(format!(
                "protocol version {} is not supported (server speaks {PROTOCOL_VERSION}): run \
                 the same hsxfer version on both ends",
                self.version
            ));
        }
        if !(1..=MAX_CHANNELS).contains(&self.channels) {
            return bad(format!(
                "channel count {} is out of range: use 1 to {MAX_CHANNELS}",
                self.channels
            ));
        }
        if !(MIN_BLOCK..=MAX_BLOCK).contains(&self.block_size) {
            return bad(format!(
                "block size {} is out of range: use {MIN_BLOCK} to {MAX_BLOCK} bytes",
                self.block_size
            ));
        }
        check_operation(&self.op)?;
        check_tuning(&self.tuning)
    }
}

fn check_operation(op: &Operation) -> Result<(), BadRequest> {
    match op {
        Operation::Push { dest, .. } => check_path(dest),
        Operation::Pull {
            sources,
            unplanned_files,
            ..
        } => {
            if sources.is_empty() || sources.len() > MAX_PULL_SOURCES {
                return bad(format!(
                    "a pull names {} sources: name 1 to {MAX_PULL_SOURCES}",
                    sources.len()
                ));
            }
            if *unplanned_files > MAX_UNPLANNED_FILES {
                return bad(format!(
                    "a pull asks for {unplanned_files} files before their plans: at most \
                     {MAX_UNPLANNED_FILES}"
                ));
            }
            sources.iter().try_for_each(|s| check_path(s))
        }
        Operation::Bench { seconds, .. } => match seconds {
            Some(s) if !(s.is_finite() && *s > 0.0 && *s <= MAX_BENCH_SECONDS) => bad(format!(
                "bench duration {s:?} s is out of range: use more than 0 and at most \
                 {MAX_BENCH_SECONDS} s"
            )),
            _ => Ok(()),
        },
    }
}

fn check_path(p: &str) -> Result<(), BadRequest> {
    if p.len() > MAX_PATH {
        return bad(format!(
            "a path of {} bytes is longer than the {MAX_PATH} allowed",
            p.len()
        ));
    }
    Ok(())
}

fn check_tuning(t: &Tuning) -> Result<(), BadRequest> {
    let per_channel = MAX_CHANNELS as usize;
    if t.cc.len() > per_channel || t.pace.len() > per_channel || t.stagger_us.len() > per_channel {
        return bad(format!(
            "more than {per_channel} per-channel settings (congestion controls, pacing caps or \
             start offsets)"
        ));
    }
    let cc_names =
        t.cc.iter()
            .chain(t.online.iter().filter_map(|o| o.meter_cc.as_ref()));
    for name in cc_names {
        if !is_cc_name(name) {
            return bad(format!(
                "congestion control name {name:?} is not a valid name"
            ));
        }
    }
    if t.pace.iter().flatten().any(|&r| r == 0) {
        return bad("a pacing cap of 0 bytes/s would stop the channel: omit it instead".into());
    }
    let max_stagger = MAX_STAGGER.as_micros() as u64;
    if let Some(us) = t.stagger_us.iter().find(|&&us| us > max_stagger) {
        return bad(format!(
            "a start offset of {us} µs is longer than the {} s allowed",
            MAX_STAGGER.as_secs()
        ));
    }
    if t.rtt_us > MAX_RTT.as_micros() as u64 {
        return bad(format!(
            "an RTT of {} µs is longer than the {} s allowed",
            t.rtt_us,
            MAX_RTT.as_secs()
        ));
    }
    if !INTERVAL_MS.contains(&t.interval_ms) {
        return bad(format!(
            "telemetry interval {} ms is out of range: use {} to {} ms",
            t.interval_ms,
            INTERVAL_MS.start(),
            INTERVAL_MS.end()
        ));
    }
    match t.buffer {
        BufferRequest::Fixed(b) | BufferRequest::Window(b) if b == 0 || b > MAX_BUFFER => {
            return bad(format!(
                "a socket buffer of {b} bytes is out of range: use 1 to {MAX_BUFFER}"
            ))
        }
        _ => {}
    }
    if let Some(o) = &t.online {
        if !(1..=MAX_CHANNELS).contains(&o.max_channels) {
            return bad(format!(
                "the tuner's channel limit {} is out of range: use 1 to {MAX_CHANNELS}",
                o.max_channels
            ));
        }
        if o.rate_bps == Some(0) {
            return bad("a known path rate of 0 bit/s: omit the rate instead".into());
        }
    }
    Ok(())
}

/// Whether `name` may name a congestion control: 1 to 15 visible ASCII characters, as the
/// kernel's names are. A peer's names are printed, so they carry no control characters.
pub fn is_cc_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_CC_NAME && name.bytes().all(|b| b.is_ascii_graphic())
}

/// Whether a peer's words (a version, a tuner's decision) may be shown as they are: no
/// control characters, which could move a terminal's cursor or rewrite what it shows.
pub fn is_printable(text: &str) -> bool {
    !text.chars().any(char::is_control)
}

/// Checks a batch of telemetry from the sending server: row indices below
/// [`MAX_TELEMETRY_ROWS`] (the client keeps a row per index), congestion control names, and
/// the tuner's words printable.
pub fn check_telemetry(b: &TelemetryBatch) -> Result<(), Violation> {
    let channels = b.setups.iter().map(|s| s.index);
    let sampled = b.latest.iter().chain(&b.trace).map(|s| s.channel);
    let lost = b.losses.iter().map(|l| l.flow);
    if let Some(i) = channels
        .chain(sampled)
        .map(usize::from)
        .chain(lost)
        .find(|&i| i >= MAX_TELEMETRY_ROWS as usize)
    {
        return Err(Violation(format!(
            "telemetry for row {i}, past the protocol's {MAX_TELEMETRY_ROWS}"
        )));
    }
    if let Some(s) = b.setups.iter().find(|s| !is_cc_name(&s.cc)) {
        return Err(Violation(format!(
            "telemetry names congestion control {:?}, not a valid name",
            s.cc
        )));
    }
    let words = b.tuner.iter().flat_map(|t| &t.decisions).map(|d| &d.what);
    if let Some(w) = words.into_iter().find(|w| !is_printable(w)) {
        return Err(Violation(format!(
            "a tuner decision with control characters: {w:?}"
        )));
    }
    Ok(())
}

/// Most congestion controls a host's facts may list.
const MAX_FACTS_CCS: usize = 64;

/// Checks a server's facts about itself: its version printable and short, and at most
/// 64 valid congestion control names in each list.
pub fn check_facts(f: &HostFacts) -> Result<(), Violation> {
    if f.version.len() > 64 || !is_printable(&f.version) {
        return Err(Violation(format!(
            "the server's version {:?} is not a version",
            f.version
        )));
    }
    let lists = [&f.cc_available, &f.cc_allowed];
    if lists.iter().any(|l| l.len() > MAX_FACTS_CCS) {
        return Err(Violation(format!(
            "the server lists more than {MAX_FACTS_CCS} congestion controls"
        )));
    }
    // An empty default: the server could not read its own.
    let default = (!f.cc_default.is_empty()).then_some(&f.cc_default);
    let names = lists.into_iter().flatten().chain(default);
    if let Some(name) = names.into_iter().find(|n| !is_cc_name(n)) {
        return Err(Violation(format!(
            "the server names congestion control {name:?}, not a valid name"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channels::control::{BenchDirection, OnlineTuning, Policy};

    fn ok() -> Request {
        Request {
            version: PROTOCOL_VERSION,
            op: Operation::Bench {
                direction: BenchDirection::Download,
                bytes: None,
                seconds: Some(3.0),
            },
            channels: 8,
            block_size: 1 << 20,
            tuning: Tuning {
                cc: vec!["cubic".into()],
                pace: vec![Some(1 << 30); 8],
                stagger_us: vec![0, 120_000],
                rtt_us: 60_000,
                online: Some(OnlineTuning {
                    max_channels: 32,
                    rate_bps: Some(1 << 30),
                    rate_saved: true,
                    pace: true,
                    meter: false,
                    meter_cc: Some("bbr".into()),
                    policy: Policy::Fair,
                }),
                ..Tuning::kernel_defaults(8)
            },
        }
    }

    /// Each hostile value is refused with a message naming it; everything sane passes.
    #[test]
    fn every_peer_sent_bound_is_checked() {
        assert_eq!(ok().check(), Ok(()));
        type Spoil = Box<dyn Fn(&mut Request)>;
        let cases: Vec<(&str, Spoil)> = vec![
            ("protocol version 2", Box::new(|r| r.version = 2)),
            ("channel count 0", Box::new(|r| r.channels = 0)),
            ("channel count 129", Box::new(|r| r.channels = 129)),
            ("block size 1 ", Box::new(|r| r.block_size = 1)),
            ("interval 0 ms", Box::new(|r| r.tuning.interval_ms = 0)),
            (
                "offset of 18446744073709551615",
                Box::new(|r| r.tuning.stagger_us[1] = u64::MAX),
            ),
            ("RTT of", Box::new(|r| r.tuning.rtt_us = u64::MAX)),
            ("pacing cap of 0", Box::new(|r| r.tuning.pace[0] = Some(0))),
            ("per-channel", Box::new(|r| r.tuning.pace = vec![None; 129])),
            (
                "\"cubic cubic cubic\"",
                Box::new(|r| r.tuning.cc = vec!["cubic cubic cubic".into()]),
            ),
            (
                "socket buffer of 0",
                Box::new(|r| r.tuning.buffer = BufferRequest::Fixed(0)),
            ),
            (
                "rate of 0",
                Box::new(|r| r.tuning.online.as_mut().unwrap().rate_bps = Some(0)),
            ),
            (
                "limit 0",
                Box::new(|r| r.tuning.online.as_mut().unwrap().max_channels = 0),
            ),
            ("1e300 s", Box::new(|r| r.op = bench(Some(1e300)))),
            ("NaN s", Box::new(|r| r.op = bench(Some(f64::NAN)))),
            ("-1.0 s", Box::new(|r| r.op = bench(Some(-1.0)))),
            ("names 0 sources", Box::new(|r| r.op = pull(vec![]))),
            (
                "names 4097 sources",
                Box::new(|r| r.op = pull(vec!["a".into(); 4097])),
            ),
            (
                "4097 bytes",
                Box::new(|r| r.op = pull(vec!["a".repeat(4097)])),
            ),
            (
                "asks for 65 files before their plans",
                Box::new(|r| {
                    r.op = Operation::Pull {
                        sources: vec!["a".into()],
                        recursive: false,
                        unplanned_files: 65,
                    }
                }),
            ),
        ];
        for (needle, spoil) in cases {
            let mut r = ok();
            spoil(&mut r);
            let e = r.check().expect_err(needle).to_string();
            assert!(e.contains(needle), "{needle:?} not in {e:?}");
        }
    }

    fn bench(seconds: Option<f64>) -> Operation {
        Operation::Bench {
            direction: BenchDirection::Upload,
            bytes: None,
            seconds,
        }
    }

    fn pull(sources: Vec<String>) -> Operation {
        Operation::Pull {
            sources,
            recursive: false,
            unplanned_files: 0,
        }
    }

    #[test]
    fn a_servers_telemetry_and_facts_name_real_channels_and_print_safely() {
        use crate::channels::telemetry::{ChannelSetup, Decision, TunerReport};
        use crate::metrics::LossEvent;
        let setup = |index, cc: &str| ChannelSetup {
            index,
            cc: cc.into(),
            ..ChannelSetup::default()
        };
        let batch = |setups, losses, what: &str| TelemetryBatch {
            setups,
            losses,
            tuner: Some(TunerReport {
                decisions: vec![Decision {
                    t: 1.0,
                    what: what.into(),
                }],
                ..TunerReport::default()
            }),
            ..TelemetryBatch::default()
        };
        let fine = batch(vec![setup(1023, "hsx_dmctcp")], vec![], "paced at 1 Gbit/s");
        assert_eq!(check_telemetry(&fine), Ok(()));
        let loss = |flow| vec![LossEvent { flow, at: 1.0 }];
        for (b, needle) in [
            (batch(vec![setup(1024, "cubic")], vec![], ""), "row 1024"),
            (batch(vec![], loss(65_535), ""), "row 65535"),
            (
                batch(vec![setup(0, "\x1b]0;x\x07")], vec![], ""),
                "not a valid name",
            ),
            (batch(vec![setup(0, "")], vec![], ""), "not a valid name"),
            (
                batch(vec![], vec![], "ok\x1b[2K\rdone"),
                "control characters",
            ),
        ] {
            let e = check_telemetry(&b).unwrap_err();
            assert!(e.0.contains(needle), "{e}");
        }

        let facts = HostFacts {
            version: "0.1.0".into(),
            cc_available: vec!["reno".into(), "cubic".into()],
            cc_allowed: vec!["reno".into()],
            cc_default: "cubic".into(),
            ..HostFacts::default()
        };
        assert_eq!(check_facts(&facts), Ok(()));
        assert_eq!(check_facts(&HostFacts::default()), Ok(()));
        let mut evil = facts.clone();
        evil.cc_default = "cubic\x1b[2K".into();
        assert!(check_facts(&evil).is_err());
        let mut evil = facts.clone();
        evil.version = "\x1b]0;owned\x07".into();
        assert!(check_facts(&evil).is_err());
        let mut evil = facts;
        evil.cc_available = vec!["reno".into(); 65];
        assert!(check_facts(&evil).is_err());
    }
}
