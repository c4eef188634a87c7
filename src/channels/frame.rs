//! Data-channel framing: a fixed 28-byte header in front of each block payload.
//!
//! ```text
//! 0      2     3      4         8          16       20          24          28
//! | "HX" | kind | flags | file u32 | offset u64 | len u32 | payload crc | header crc |
//! ```
//! All integers are little-endian. `payload crc` is CRC-32C of the payload, checked on
//! arrival so a damaged block is re-sent at once; `header crc` is CRC-32C of bytes 0..24,
//! so a damaged length can never make the reader swallow the next frame.

/// Size in bytes of an encoded [`BlockHeader`].
pub const HEADER_LEN: usize = 28;

/// Largest payload a frame may announce; bigger values are treated as corruption.
pub const MAX_PAYLOAD: u32 = 64 << 20;

const MAGIC: [u8; 2] = *b"HX";
const KIND_BLOCK: u8 = 1;

/// Why a frame header was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The first two bytes were not `HX`: the peer is not speaking our data protocol.
    #[error("bad frame magic")]
    BadMagic,
    /// The header checksum did not match: the header itself was damaged in transit.
    #[error("frame header checksum mismatch")]
    HeaderChecksum,
    /// A frame kind this version does not know.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// The announced payload length exceeds [`MAX_PAYLOAD`].
    #[error("frame payload of {0} bytes exceeds the {MAX_PAYLOAD}-byte limit")]
    TooLong(u32),
}

/// The header of one block frame: which bytes of which file follow, and their CRC-32C.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockHeader {
    /// Session-local file identifier from the manifest.
    pub file: u32,
    /// Byte offset of the payload within the file.
    pub offset: u64,
    /// Payload length in bytes.
    pub len: u32,
    /// CRC-32C of the payload as the sender read it.
    pub payload_crc: u32,
}

impl BlockHeader {
    /// Builds the header for `payload`, computing its CRC-32C.
    pub fn for_payload(file: u32, offset: u64, payload: &[u8]) -> Self {
        BlockHeader {
            file,
            offset,
            len: payload.len() as u32,
            payload_crc: crc32c::crc32c(payload),
        }
    }

    /// Encodes the header into its 28-byte wire form.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..2].copy_from_slice(&MAGIC);
        b[2] = KIND_BLOCK;
        b[4..8].copy_from_slice(&self.file.to_le_bytes());
        b[8..16].copy_from_slice(&self.offset.to_le_bytes());
        b[16..20].copy_from_slice(&self.len.to_le_bytes());
        b[20..24].copy_from_slice(&self.payload_crc.to_le_bytes());
        let hcrc = crc32c::crc32c(&b[0..24]);
        b[24..28].copy_from_slice(&hcrc.to_le_bytes());
        b
    }

    /// Decodes and validates a 28-byte header.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Self, FrameError> {
        if b[0..2] != MAGIC {
            return Err(FrameError::BadMagic);
        }
        if crc32c::crc32c(&b[0..24]) != u32::from_le_bytes(le4(&b[24..28])) {
            return Err(FrameError::HeaderChecksum);
        }
        if b[2] != KIND_BLOCK {
            return Err(FrameError::UnknownKind(b[2]));
        }
        let len = u32::from_le_bytes(le4(&b[16..20]));
        if len > MAX_PAYLOAD {
            return Err(FrameError::TooLong(len));
        }
        Ok(BlockHeader {
            file: u32::from_le_bytes(le4(&b[4..8])),
            offset: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            len,
            payload_crc: u32::from_le_bytes(le4(&b[20..24])),
        })
    }

    /// True when `payload` matches the CRC-32C carried in this header.
    pub fn payload_intact(&self, payload: &[u8]) -> bool {
        payload.len() == self.len as usize && crc32c::crc32c(payload) == self.payload_crc
    }
}

fn le4(s: &[u8]) -> [u8; 4] {
    s.try_into().expect("4 bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let payload = b"hello blocks";
        let h = BlockHeader::for_payload(7, 1 << 40, payload);
        let back = BlockHeader::decode(&h.encode()).unwrap();
        assert_eq!(back, h);
        assert!(back.payload_intact(payload));
        assert!(!back.payload_intact(b"hello blockz"));
    }

    #[test]
    fn rejects_every_single_bit_flip_in_the_header() {
        let enc = BlockHeader::for_payload(3, 4096, &[1, 2, 3]).encode();
        for bit in 0..HEADER_LEN * 8 {
            let mut b = enc;
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(BlockHeader::decode(&b).is_err(), "bit {bit} flip accepted");
        }
    }

    #[test]
    fn rejects_oversized_and_unknown() {
        let mut h = BlockHeader::for_payload(0, 0, &[]);
        h.len = MAX_PAYLOAD + 1;
        assert_eq!(
            BlockHeader::decode(&h.encode()),
            Err(FrameError::TooLong(MAX_PAYLOAD + 1))
        );
        let mut b = BlockHeader::for_payload(0, 0, &[]).encode();
        b[2] = 9;
        let c = crc32c::crc32c(&b[0..24]);
        b[24..28].copy_from_slice(&c.to_le_bytes());
        assert_eq!(BlockHeader::decode(&b), Err(FrameError::UnknownKind(9)));
        b[0] = b'X';
        assert_eq!(BlockHeader::decode(&b), Err(FrameError::BadMagic));
    }
}
