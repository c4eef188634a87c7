//! Control-connection messages and their framing: a 4-byte little-endian length, then the
//! message as JSON. JSON keeps the control channel debuggable with a packet capture; it
//! carries metadata only (bulk data goes over data channels), so its cost is negligible.
//!
//! After the handshake every frame carries a [`TAG_LEN`]-byte MAC ([`FrameSeal`]): keyed
//! BLAKE3 under the session key derived for its direction, over the frame's sequence number
//! in that direction and the frame. An attacker on the path who relays the handshake can
//! neither change, reorder, replay, drop from the middle nor reflect a control message: the
//! peer's next frame fails its check and the session ends.

use serde::{Deserialize, Serialize};

use super::manifest::Entry;
use super::telemetry::TelemetryBatch;
use super::Digest;

/// Largest control frame accepted; larger announced lengths are treated as a protocol error.
pub const MAX_CONTROL_FRAME: u32 = 16 << 20;

/// Protocol version carried in every request; a server refuses versions it does not speak.
/// Version 6: data channels may join as soon as the session has authenticated, before its
/// request (a server of version 5 refuses such joins). Version 7: a pull may let the server
/// send its first files before their plans ([`Operation::Pull`]'s `unplanned_files`), which
/// a server of version 6 would wait for. Version 8: the receiver ends with
/// [`Message::Finished`] once its directories are made too, and the sender waits for it (a
/// receiver of version 7 never sends it).
pub const PROTOCOL_VERSION: u32 = 8;

/// Bytes of the MAC after every control frame.
pub const TAG_LEN: usize = 16;

/// Every message of the control connection, in both directions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Message {
    /// Client → server, before the request: an RTT probe the server answers at once.
    Ping {
        /// Sequence number, echoed.
        seq: u32,
    },
    /// Server → client: the answer to a [`Message::Ping`].
    Pong {
        /// The ping's sequence number.
        seq: u32,
    },
    /// Client → server, before the request: what limits the server's sockets and which
    /// congestion controls it may use (`hsxfer probe` plans from it).
    Facts,
    /// Server → client: the answer to [`Message::Facts`].
    HostFacts(HostFacts),
    /// Client → server: what this session is for.
    Request(Request),
    /// Server → client: the request is accepted, with `channels` data channels (which the
    /// client may have joined already, since the welcome).
    Accepted {
        /// Number of data channels the client must join.
        channels: u16,
        /// What the server could not do as asked (e.g. a buffer limit), with the fix.
        notes: Vec<String>,
    },
    /// Sending client → server: admit `count` more data channels (the sending side's online
    /// tuner adds channels while they pay).
    AddChannels {
        /// How many.
        count: u16,
    },
    /// Server → client: connect data channels `first..first + count` and join them now (the
    /// answer to `AddChannels`, or a sending server's own request).
    OpenChannels {
        /// Index of the first.
        first: u16,
        /// How many.
        count: u16,
    },
    /// Sending server → client: settings, samples and loss events of the data channels.
    Telemetry(TelemetryBatch),
    /// Sender → receiver: part of the manifest (sent in chunks so data can start early).
    Manifest {
        /// Files and directories announced by this chunk.
        entries: Vec<Entry>,
        /// True on the final chunk.
        last: bool,
    },
    /// Receiver → sender: what to send of the files of one manifest chunk.
    Plan {
        /// One plan per file of the chunk (directories need none).
        files: Vec<FilePlan>,
    },
    /// Sender → receiver: the BLAKE3 digest of every block of a file, in block order, in
    /// pieces of at most [`super::limits::SEAL_PIECE`] digests.
    Sealed {
        /// File identifier.
        file: u32,
        /// Per-block BLAKE3 digests, following those of the file's earlier pieces.
        digests: Vec<Digest>,
        /// More pieces follow.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        more: bool,
    },
    /// Receiver → sender: a block arrived damaged or did not match its digest: send it again.
    Nack {
        /// File identifier.
        file: u32,
        /// Block index within the file.
        block: u64,
    },
    /// Receiver → sender: the file is complete, verified and under its final name.
    FileDone {
        /// File identifier.
        file: u32,
    },
    /// Receiver → sender, last: every file is committed and every directory made, with its
    /// mode and time. The sender ends only then, so that a copy's success covers its
    /// directories too (a tree of empty directories has no file to wait for).
    Finished,
    /// Sender → receiver, in a timed bench: its time is up. Blocks not yet delivered and
    /// files not yet done are abandoned (generated data is discarded anyway), so the bench
    /// ends on time however much its sockets still hold. The receiver stops reading its data
    /// channels and answers with [`Message::Halted`]. Refused outside a bench.
    TimeUp,
    /// Receiver → sender: the answer to [`Message::TimeUp`]; the data channels are closed.
    Halted {
        /// Payload bytes the receiver read on each data channel, in channel order: what the
        /// bench moved (the sender wrote more, into sockets whose data is now dropped).
        received: Vec<u64>,
    },
    /// Either side: the session failed; the text says why. The connection closes after it.
    Abort {
        /// Human-readable reason.
        message: String,
        /// The same command run again later may succeed, and resumes: the sender of the abort
        /// is stopping or busy, or a step of the session timed out.
        #[serde(default, skip_serializing_if = "is_false")]
        transient: bool,
    },
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Message {
    /// The message's kind in words, for errors about a message out of turn.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Ping { .. } => "a ping",
            Message::Pong { .. } => "a pong",
            Message::Facts => "a question for the host's facts",
            Message::HostFacts(_) => "the host's facts",
            Message::Request(_) => "a request",
            Message::Accepted { .. } => "an acceptance",
            Message::AddChannels { .. } => "a request for channels",
            Message::OpenChannels { .. } => "an offer of channels",
            Message::Telemetry(_) => "telemetry",
            Message::Manifest { .. } => "a manifest",
            Message::Plan { .. } => "a file plan",
            Message::Sealed { .. } => "block digests",
            Message::Nack { .. } => "a block resend request",
            Message::FileDone { .. } => "a file's completion",
            Message::Finished => "the end of the receiver's work",
            Message::TimeUp => "the end of a timed bench",
            Message::Halted { .. } => "the answer to the end of a timed bench",
            Message::Abort { .. } => "an abort",
        }
    }
}

/// What a host says about itself for a path measurement.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostFacts {
    /// hsxfer version it runs.
    pub version: String,
    /// Congestion controls registered there.
    pub cc_available: Vec<String>,
    /// Those an unprivileged socket may select.
    pub cc_allowed: Vec<String>,
    /// Its default.
    pub cc_default: String,
    /// Whether hsxfer runs as root there (any registered congestion control is usable).
    pub privileged: bool,
    /// Largest send buffer a socket can get there (kernel size, bytes).
    pub send_buffer_max: u64,
    /// Largest receive buffer a socket can get there (kernel size, bytes).
    pub receive_buffer_max: u64,
}

impl HostFacts {
    /// Whether the host may select congestion control `name`.
    pub fn usable(&self, name: &str) -> bool {
        self.cc_available.iter().any(|a| a == name)
            && (self.privileged || self.cc_allowed.iter().any(|a| a == name))
    }
}

/// What a client asks of a server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// Must equal [`PROTOCOL_VERSION`].
    pub version: u32,
    /// Push, pull or bench.
    pub op: Operation,
    /// Number of data channels.
    pub channels: u16,
    /// Block size in bytes.
    pub block_size: u32,
    /// Transport settings of the data channels.
    pub tuning: Tuning,
}

/// Transport settings of a session's data channels, planned by the client and applied by
/// both ends: the sender's part (congestion control, pacing, stagger, send buffers) by
/// whichever side sends, the receive buffers by the other.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tuning {
    /// Congestion control per channel, cycled over the channels; empty keeps the sending
    /// host's default.
    pub cc: Vec<String>,
    /// Socket buffers.
    pub buffer: BufferRequest,
    /// Pacing cap of each channel, bytes/s.
    pub pace: Vec<Option<u64>>,
    /// Start offset of each channel, microseconds after the data phase begins.
    pub stagger_us: Vec<u64>,
    /// Path RTT the plan assumed, microseconds.
    pub rtt_us: u64,
    /// How often a sending server reports telemetry, milliseconds.
    pub interval_ms: u32,
    /// Whether a sending server also forwards fine-grained samples for a trace.
    pub trace: bool,
    /// Online tuning by the sending side while data moves; `None`: the settings above are
    /// final.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub online: Option<OnlineTuning>,
}

/// What the sending side's online tuner may do (`hsxfer::tuning::online`): meter the path
/// with the first channel, pace every channel just below the rate it found, add channels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OnlineTuning {
    /// Most channels it may run.
    pub max_channels: u16,
    /// Bottleneck goodput rate known in advance (a profile or `--rate`), bits/s: no meter.
    pub rate_bps: Option<u64>,
    /// Whether `rate_bps` was measured earlier and saved (a profile), not given: it may be
    /// stale or low, so the tuner probes above it early.
    #[serde(default)]
    pub rate_saved: bool,
    /// Whether it sets the pacing caps (false when the user chose the pacing).
    pub pace: bool,
    /// Whether the first channel meters the path alone before the others start (when the
    /// rate is unknown and the user fixed neither the pacing nor the start offsets).
    #[serde(default)]
    pub meter: bool,
    /// Congestion control the first channel meters the path with, when it differs from the
    /// transfer's.
    pub meter_cc: Option<String>,
    /// Which congestion controls it may switch to.
    pub policy: Policy,
}

impl Tuning {
    /// Settings that leave everything to the kernel.
    pub fn kernel_defaults(channels: u16) -> Tuning {
        Tuning {
            cc: Vec::new(),
            buffer: BufferRequest::Kernel,
            pace: vec![None; channels as usize],
            stagger_us: vec![0; channels as usize],
            rtt_us: 0,
            interval_ms: 1000,
            trace: false,
            online: None,
        }
    }

    /// Congestion control of channel `i`, if one was chosen.
    pub fn cc_of(&self, i: usize) -> Option<&str> {
        (!self.cc.is_empty()).then(|| self.cc[i % self.cc.len()].as_str())
    }
}

/// Which congestion controls the tuner may choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Only loss-based congestion controls, so a transfer stays near its fair share against
    /// competing cubic traffic.
    #[default]
    Fair,
    /// May choose BBR where it is faster (a path with random loss); BBR takes far more than
    /// its share from loss-based traffic. Runs the bundled BIC under the online tuner's
    /// pacing caps where it is registered, which takes more than cubic beside other traffic.
    Fast,
}

/// The buffer setting both ends apply, carried in the session request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BufferRequest {
    /// Kernel autotuning.
    Kernel,
    /// A fixed `SO_*BUF` request, bytes.
    Fixed(u64),
    /// Each channel needs this window, bytes; each host decides how to get it.
    Window(u64),
}

/// The operation of a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    /// Client sends files into `dest` on the server.
    Push {
        /// Destination path relative to the server root.
        dest: String,
        /// Number of top-level sources (more than one requires `dest` to be a directory).
        sources: u32,
    },
    /// Client fetches `sources` from the server.
    Pull {
        /// Source paths relative to the server root.
        sources: Vec<String>,
        /// Descend into directories.
        recursive: bool,
        /// How many of the first files the server may send before their plans, as if each
        /// were planned "send all" (at most [`super::limits::MAX_UNPLANNED_FILES`]). A client
        /// asks for it when its destination holds nothing to skip or resume, which saves
        /// the round trip of the plans before the first block.
        #[serde(default)]
        unplanned_files: u32,
    },
    /// Memory-to-memory: generated data, discarded on arrival.
    Bench {
        /// Who sends.
        direction: BenchDirection,
        /// Stop after this many bytes (if set).
        bytes: Option<u64>,
        /// Stop after this many seconds (if set).
        seconds: Option<f64>,
    },
}

/// Direction of a bench session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BenchDirection {
    /// Client sends, server discards.
    Upload,
    /// Server sends, client discards.
    Download,
}

/// The receiver's decision for one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilePlan {
    /// File identifier.
    pub file: u32,
    /// What to do.
    pub action: PlanAction,
}

/// Send everything, send what is missing, or nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanAction {
    /// The destination already holds this file (same size and mtime): skip it.
    Skip,
    /// Send every block except `have`, which the receiver's restart journal holds already.
    Send {
        /// Block indices already durable at the receiver.
        have: Vec<u64>,
    },
}

/// Why control bytes could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The announced frame length exceeds [`MAX_CONTROL_FRAME`].
    #[error("control frame of {0} bytes exceeds the limit")]
    TooLong(u32),
    /// The frame is not a valid message.
    #[error("malformed control message: {0}")]
    Malformed(#[from] serde_json::Error),
    /// The frame's MAC does not match: it was altered, replayed, reordered or forged.
    #[error("a control message failed its authentication check: something on the path altered, replayed or forged it")]
    Forged,
}

/// Which way a control frame travels; each way has its own key and sequence, so a frame
/// cannot be reflected back to its sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// Client to server.
    ToServer,
    /// Server to client.
    ToClient,
}

impl Way {
    /// The context string its key is derived with.
    pub fn context(self) -> &'static str {
        match self {
            Way::ToServer => "hsxfer v1 control frames client to server",
            Way::ToClient => "hsxfer v1 control frames server to client",
        }
    }
}

/// The MAC state of one direction of a control connection: the direction's key and the
/// sequence number of the next frame.
///
/// # Examples
///
/// ```
/// use hsxfer::channels::control::{FrameSeal, Message};
///
/// let (mut out, mut inn) = (FrameSeal::new([1; 32]), FrameSeal::new([1; 32]));
/// let frame = out.seal(&Message::Ping { seq: 7 });
/// let (m, used) = inn.open(&frame).unwrap().unwrap();
/// assert_eq!((m, used), (Message::Ping { seq: 7 }, frame.len()));
/// // The same frame again is a replay.
/// assert!(inn.open(&frame).is_err());
/// ```
#[derive(Debug, Clone)]
pub struct FrameSeal {
    key: [u8; 32],
    seq: u64,
}

impl FrameSeal {
    /// A fresh direction keyed with `key`.
    pub fn new(key: [u8; 32]) -> Self {
        FrameSeal { key, seq: 0 }
    }

    fn mac(&self, frame: &[u8]) -> [u8; TAG_LEN] {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(&self.seq.to_le_bytes());
        h.update(frame);
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&h.finalize().as_bytes()[..TAG_LEN]);
        tag
    }

    /// Encodes `msg` and appends its MAC.
    pub fn seal(&mut self, msg: &Message) -> Vec<u8> {
        let mut frame = encode(msg);
        let tag = self.mac(&frame);
        frame.extend_from_slice(&tag);
        self.seq += 1;
        frame
    }

    /// Decodes and checks the first sealed frame in `buf`: `Ok(None)` when more bytes are
    /// needed, else the message and how many bytes it used.
    pub fn open(&mut self, buf: &[u8]) -> Result<Option<(Message, usize)>, ControlError> {
        let Some(len) = frame_len(buf)? else {
            return Ok(None);
        };
        let end = 4 + len as usize;
        let total = end + TAG_LEN;
        if buf.len() < total {
            return Ok(None);
        }
        let want = self.mac(&buf[..end]);
        // Constant time: every byte is compared whatever the first difference.
        let diff = want
            .iter()
            .zip(&buf[end..total])
            .fold(0u8, |d, (a, b)| d | (a ^ b));
        if diff != 0 {
            return Err(ControlError::Forged);
        }
        self.seq += 1;
        Ok(Some((serde_json::from_slice(&buf[4..end])?, total)))
    }
}

/// Encodes a message with its length prefix.
pub fn encode(msg: &Message) -> Vec<u8> {
    let mut out = vec![0u8; 4];
    serde_json::to_writer(&mut out, msg).expect("messages always serialize");
    let len = (out.len() - 4) as u32;
    out[..4].copy_from_slice(&len.to_le_bytes());
    out
}

/// Decodes the first message in `buf`. Returns `Ok(None)` when more bytes are needed, or the
/// message and how many bytes it used.
pub fn decode(buf: &[u8]) -> Result<Option<(Message, usize)>, ControlError> {
    let Some(len) = frame_len(buf)? else {
        return Ok(None);
    };
    let end = 4 + len as usize;
    if buf.len() < end {
        return Ok(None);
    }
    Ok(Some((serde_json::from_slice(&buf[4..end])?, end)))
}

/// Reads the length prefix, validating it; `Ok(None)` when fewer than 4 bytes are present.
pub fn frame_len(buf: &[u8]) -> Result<Option<u32>, ControlError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_le_bytes(buf[..4].try_into().expect("4 bytes"));
    if len > MAX_CONTROL_FRAME {
        return Err(ControlError::TooLong(len));
    }
    Ok(Some(len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channels::manifest::EntryKind;

    fn samples() -> Vec<Message> {
        vec![
            Message::Request(Request {
                version: PROTOCOL_VERSION,
                op: Operation::Pull {
                    sources: vec!["a b/c".into()],
                    recursive: true,
                    unplanned_files: 64,
                },
                channels: 16,
                block_size: 4 << 20,
                tuning: Tuning {
                    cc: vec!["cubic".into(), "bbr".into()],
                    pace: vec![Some(1 << 40); 16],
                    ..Tuning::kernel_defaults(16)
                },
            }),
            Message::Ping { seq: 3 },
            Message::Facts,
            Message::HostFacts(HostFacts {
                version: "0.1.0".into(),
                cc_available: vec!["reno".into(), "cubic".into()],
                cc_allowed: vec!["reno".into()],
                cc_default: "cubic".into(),
                privileged: false,
                send_buffer_max: 4 << 20,
                receive_buffer_max: 6 << 20,
            }),
            Message::Pong { seq: 3 },
            Message::Accepted {
                channels: 4,
                notes: vec!["receive buffers capped".into()],
            },
            Message::Telemetry(TelemetryBatch {
                last: true,
                ..Default::default()
            }),
            Message::Manifest {
                entries: vec![Entry {
                    id: 1,
                    path: "x/é".into(),
                    mode: 0o644,
                    mtime_ns: -5,
                    kind: EntryKind::File { size: u64::MAX },
                }],
                last: true,
            },
            Message::Plan {
                files: vec![FilePlan {
                    file: 1,
                    action: PlanAction::Send { have: vec![0, 9] },
                }],
            },
            Message::Sealed {
                file: 1,
                digests: vec![Digest([7; 32])],
                more: true,
            },
            Message::Nack { file: 1, block: 3 },
            Message::AddChannels { count: 2 },
            Message::OpenChannels { first: 4, count: 2 },
            Message::FileDone { file: 1 },
            Message::Finished,
            Message::TimeUp,
            Message::Halted {
                received: vec![1, 2],
            },
            Message::Abort {
                message: "disk full".into(),
                transient: false,
            },
            Message::Abort {
                message: "stopping".into(),
                transient: true,
            },
        ]
    }

    #[test]
    fn round_trips_byte_by_byte() {
        let mut stream = Vec::new();
        for m in samples() {
            stream.extend(encode(&m));
        }
        // Feed one byte at a time: decode must wait for whole frames.
        let mut got = Vec::new();
        let mut buf = Vec::new();
        for b in stream {
            buf.push(b);
            if let Some((m, used)) = decode(&buf).unwrap() {
                buf.drain(..used);
                got.push(m);
            }
        }
        assert_eq!(got, samples());
        assert!(buf.is_empty());
    }

    #[test]
    fn a_full_seal_piece_fits_a_control_frame() {
        let piece = Message::Sealed {
            file: u32::MAX,
            digests: vec![Digest([0xff; 32]); crate::channels::limits::SEAL_PIECE],
            more: true,
        };
        let len = encode(&piece).len() - 4;
        assert!(len <= MAX_CONTROL_FRAME as usize, "{len}");
        assert!(decode(&encode(&piece)).unwrap().is_some());
    }

    #[test]
    fn rejects_huge_and_malformed_frames() {
        let mut b = (MAX_CONTROL_FRAME + 1).to_le_bytes().to_vec();
        assert!(matches!(decode(&b), Err(ControlError::TooLong(_))));
        b = 3u32.to_le_bytes().to_vec();
        b.extend_from_slice(b"{x}");
        assert!(matches!(decode(&b), Err(ControlError::Malformed(_))));
    }

    #[test]
    fn sealed_frames_resist_changes_replays_reordering_and_reflection() {
        let key = [9u8; 32];
        let mut out = FrameSeal::new(key);
        let (a, b) = (
            out.seal(&Message::Ping { seq: 1 }),
            out.seal(&Message::Ping { seq: 2 }),
        );
        // In order, in pieces: fine.
        let mut inn = FrameSeal::new(key);
        assert!(inn.open(&a[..a.len() - 1]).unwrap().is_none());
        assert_eq!(inn.open(&a).unwrap().unwrap().1, a.len());
        assert!(inn.open(&b).unwrap().is_some());
        // Reordered, or the first dropped.
        assert!(matches!(
            FrameSeal::new(key).open(&b),
            Err(ControlError::Forged)
        ));
        // A byte changed anywhere is never accepted: refused, or (a longer length) waiting
        // for bytes that will fail the check in turn.
        for i in 0..a.len() {
            let mut bad = a.clone();
            bad[i] ^= 1;
            let r = FrameSeal::new(key).open(&bad);
            assert!(matches!(r, Err(_) | Ok(None)), "byte {i}: {r:?}");
            assert!(i < 4 || r.is_err(), "byte {i}");
        }
        // Another key (the other direction's): refused.
        assert!(FrameSeal::new([8; 32]).open(&a).is_err());
    }
}
