//! The multi-channel session protocol, sans-IO: codecs and state machines that take bytes and
//! events and return decisions, never touching a socket or a file. The I/O glue in
//! [`crate::session`] drives them; tests and fuzzers drive them directly.
//!
//! - [`frame`]: the data-channel block header.
//! - [`control`]: control-connection messages and their framing.
//! - [`auth`]: the handshake that authenticates control connections and data channels.
//! - [`manifest`]: the file list and path rules.
//! - [`blocks`]: the fixed block grid a file is cut into.
//! - [`sender`] / [`receiver`]: what each side still owes, and when a file is verified.
//! - [`journal`]: the receiver's restart journal of durable blocks.

pub mod auth;
pub mod blocks;
pub mod control;
pub mod frame;
pub mod journal;
pub mod manifest;
pub mod receiver;
pub mod sender;

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
