//! The multi-channel session protocol, sans-IO: codecs and state machines that take bytes and
//! events and return decisions, never touching a socket or a file. The I/O glue in
//! [`crate::session`] drives them; tests and fuzzers drive them directly.
//!
//! - [`frame`]: the data-channel block header.
//! - [`control`]: control-connection messages and their framing.
//! - [`busy`]: the server's answer to a connection past one of its caps.
//! - [`checks`]: bounds checks of a client's request.
//! - [`opening`]: the control phase (pings, facts, request, acceptance) as state machines.
//! - [`preface`]: how a connection opens (TLS or clear text) and the channel binding.
//! - [`auth`]: the messages and MACs that authenticate control connections and data channels.
//! - [`handshake`]: the client's and the server's handshake as state machines.
//! - [`manifest`]: the file list and path rules.
//! - [`blocks`]: the fixed block grid a file is cut into.
//! - [`sender`] / [`receiver`]: what each side still owes, and when a file is verified.
//! - [`journal`]: the receiver's restart journal of durable blocks.
//! - [`oneshot`]: the line a one-shot server started over SSH announces itself with.
//! - [`limits`]: the bounds every peer-sent count, size and duration is checked against.

pub mod auth;
pub mod blocks;
pub mod busy;
pub mod checks;
pub mod control;
pub mod frame;
pub mod growth;
pub mod handshake;
pub mod journal;
pub mod limits;
pub mod manifest;
pub mod oneshot;
pub mod opening;
pub mod preface;
pub mod receiver;
pub mod sender;
pub mod telemetry;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A BLAKE3 digest of one block; serialized as 64 hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest(pub [u8; 32]);

impl std::fmt::Debug for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(self.0))
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        let mut out = [0u8; 32];
        hex::decode_to_slice(s.as_bytes(), &mut out).map_err(serde::de::Error::custom)?;
        Ok(Digest(out))
    }
}

/// The end-to-end digest of a file: BLAKE3 over its block digests in order. Both sides
/// compute it independently from the bytes they hold; it is what the summary reports.
pub fn file_digest(blocks: &[Digest]) -> Digest {
    let mut h = blake3::Hasher::new();
    for d in blocks {
        h.update(&d.0);
    }
    Digest(*h.finalize().as_bytes())
}

/// The peer broke the protocol (a message or frame that is well-formed but impossible in
/// the session's state). The session is aborted; other sessions are unaffected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("protocol violation: {0}")]
pub struct Violation(pub String);

/// The peer cannot be talked to: it broke the protocol, or it speaks another version of it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// A message or frame impossible in the session's state.
    #[error(transparent)]
    Violation(#[from] Violation),
    /// The peer runs an hsxfer whose protocol differs from this side's.
    #[error(
        "{peer} speaks another version of the hsxfer protocol ({theirs}, this side {ours}): \
         run the same hsxfer version on both ends"
    )]
    OtherVersion {
        /// The peer's address.
        peer: String,
        /// This side's version, as the wire shows it.
        ours: String,
        /// The peer's.
        theirs: String,
    },
}

/// Feeds arbitrary bytes to every decoder of peer input and checks their invariants: no
/// panic, and whatever decodes re-encodes to something that decodes to the same value. The
/// `cargo fuzz` target (`fuzz/`, through the `testing` feature) and the unit tests both call
/// it.
#[cfg(any(test, feature = "testing"))]
pub fn check_decoders(data: &[u8]) {
    if let Some(h) = data.get(..frame::HEADER_LEN) {
        if let Ok(h) = frame::BlockHeader::decode(h.try_into().expect("header length")) {
            assert_eq!(frame::BlockHeader::decode(&h.encode()), Ok(h));
        }
    }
    if let Ok(Some((m, used))) = control::decode(data) {
        assert!(used <= data.len());
        if let control::Message::Request(r) = &m {
            // Any bounds outcome, never a panic.
            let _ = r.check();
        }
        let again = control::decode(&control::encode(&m)).expect("re-encoded message decodes");
        assert_eq!(again.map(|x| x.0), Some(m));
    }
    // A sealed frame is checked before it is decoded; whatever the bytes, no panic.
    let _ = control::FrameSeal::new([0; 32]).open(data);
    if let Ok(Ok(Some(a))) = std::str::from_utf8(data).map(oneshot::Announcement::parse) {
        assert_eq!(oneshot::Announcement::parse(&a.to_string()), Ok(Some(a)));
    }
    if let Some((tag, body)) = data.split_first_chunk::<4>() {
        if let Some(len) = auth::Hello::body_len(tag) {
            if let Some(h) = body.get(..len).and_then(|b| auth::Hello::decode(tag, b)) {
                let enc = h.encode();
                let (t, b) = enc.split_first_chunk::<4>().expect("tag");
                assert_eq!(auth::Hello::decode(t, b), Some(h));
            }
        }
    }
    if let Some(b) = data.first_chunk::<{ auth::SERVER_HELLO_LEN }>() {
        if let Some(busy) = busy::Busy::decode(b) {
            assert_eq!(busy::Busy::decode(&busy.encode()), Some(busy));
        }
    }
    if let Some((hdr, recs)) = journal::parse(data) {
        assert!(recs.len() <= (data.len() - journal::HEADER_LEN) / journal::RECORD_LEN);
        assert_eq!(journal::parse(&hdr.encode()).map(|x| x.0), Some(hdr));
    }
    check_handshakes(data);
    check_opening(data);
}

/// The handshake machines of both sides take any bytes without a panic and never use more
/// than their step asked for.
#[cfg(any(test, feature = "testing"))]
fn check_handshakes(data: &[u8]) {
    let key = auth::TokenKey::from_token(b"fuzz");
    let mut client = handshake::ClientHandshake::control(key.clone(), [1; 32]);
    if let Ok(used) = client.handle(data) {
        assert!(used <= data.len());
    }
    let mut server = handshake::ServerHandshake::new([2; 32]);
    if let Ok(used) = server.handle(data) {
        assert!(used <= data.len());
        if server.heard() == Some(handshake::Heard::Control) {
            let _ = server.accept_control(&key, [3; 16]);
        }
    }
}

/// The control-phase machines take any decodable message in any state without a panic.
#[cfg(any(test, feature = "testing"))]
fn check_opening(data: &[u8]) {
    let Ok(Some((m, _))) = control::decode(data) else {
        return;
    };
    let now = std::time::Instant::now();
    let _ = opening::ServerOpening::new().on_message(m.clone());
    let mut client = opening::ClientOpening::new();
    let _ = client.on_message(m.clone(), now);
    let mut pinging = opening::ClientOpening::new();
    pinging.ping(now);
    let _ = pinging.on_message(m, now);
}

#[cfg(test)]
mod fuzz_lite {
    use rand::{Rng, SeedableRng};

    /// Random bytes, and valid encodings with random bytes flipped, through every decoder.
    #[test]
    fn decoders_survive_random_and_mutated_input() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let msg = super::control::Message::Nack { file: 1, block: 2 };
        let seeds: Vec<Vec<u8>> = vec![
            super::control::encode(&msg),
            super::frame::BlockHeader {
                file: 1,
                offset: 2,
                len: 3,
            }
            .encode()
            .to_vec(),
            super::journal::JournalHeader {
                block_size: 4,
                size: 5,
                mtime_ns: 6,
            }
            .encode()
            .to_vec(),
        ];
        for i in 0..20_000 {
            let data: Vec<u8> = if i % 2 == 0 {
                (0..rng.gen_range(0..200)).map(|_| rng.gen()).collect()
            } else {
                let mut d = seeds[i % seeds.len()].clone();
                let k = rng.gen_range(0..d.len());
                d[k] ^= 1 << rng.gen_range(0..8);
                d
            };
            super::check_decoders(&data);
        }
    }
}
