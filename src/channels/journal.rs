//! The restart journal, sans-IO: the receiver appends a record for every block that is
//! durable in the partial file, so an interrupted transfer resumes without re-sending them.
//!
//! Layout: a 28-byte header (`HXJ1`, block size, source size, source mtime, header CRC),
//! then 44-byte records (block index, BLAKE3 digest, CRC-32C of the two). A crash can tear
//! the last record; parsing stops at the first record that does not check out. The header
//! identifies the source version: a journal whose header differs from the file being sent is
//! discarded and the file starts over.

use super::Digest;

const MAGIC: [u8; 4] = *b"HXJ1";
/// Length of the header.
pub const HEADER_LEN: usize = 28;
/// Length of one record.
pub const RECORD_LEN: usize = 44;

/// Identifies the transfer a journal belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalHeader {
    /// Block size the records refer to.
    pub block_size: u32,
    /// Source file size.
    pub size: u64,
    /// Source file mtime (ns).
    pub mtime_ns: i64,
}

impl JournalHeader {
    /// Encodes the header.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4..8].copy_from_slice(&self.block_size.to_le_bytes());
        b[8..16].copy_from_slice(&self.size.to_le_bytes());
        b[16..24].copy_from_slice(&self.mtime_ns.to_le_bytes());
        let c = crc32c::crc32c(&b[..24]);
        b[24..].copy_from_slice(&c.to_le_bytes());
        b
    }
}

/// Encodes one record: block `index` is durable with digest `digest`.
pub fn encode_record(index: u64, digest: &Digest) -> [u8; RECORD_LEN] {
    let mut b = [0u8; RECORD_LEN];
    b[..8].copy_from_slice(&index.to_le_bytes());
    b[8..40].copy_from_slice(&digest.0);
    let c = crc32c::crc32c(&b[..40]);
    b[40..].copy_from_slice(&c.to_le_bytes());
    b
}

/// Parses a journal. `None` when the header is missing or damaged; otherwise the header and
/// every intact record up to the first damaged one.
pub fn parse(bytes: &[u8]) -> Option<(JournalHeader, Vec<(u64, Digest)>)> {
    let h = bytes.get(..HEADER_LEN)?;
    if h[..4] != MAGIC || crc32c::crc32c(&h[..24]).to_le_bytes() != h[24..28] {
        return None;
    }
    let header = JournalHeader {
        block_size: u32::from_le_bytes(h[4..8].try_into().ok()?),
        size: u64::from_le_bytes(h[8..16].try_into().ok()?),
        mtime_ns: i64::from_le_bytes(h[16..24].try_into().ok()?),
    };
    let mut records = Vec::new();
    for r in bytes[HEADER_LEN..].chunks_exact(RECORD_LEN) {
        if crc32c::crc32c(&r[..40]).to_le_bytes() != r[40..44] {
            break;
        }
        let idx = u64::from_le_bytes(r[..8].try_into().ok()?);
        records.push((idx, Digest(r[8..40].try_into().ok()?)));
    }
    Some((header, records))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_torn_tail() {
        let h = JournalHeader {
            block_size: 4096,
            size: 10_000,
            mtime_ns: 42,
        };
        let mut bytes = h.encode().to_vec();
        bytes.extend(encode_record(0, &Digest([1; 32])));
        bytes.extend(encode_record(2, &Digest([2; 32])));
        let (hh, recs) = parse(&bytes).unwrap();
        assert_eq!(hh, h);
        assert_eq!(recs, vec![(0, Digest([1; 32])), (2, Digest([2; 32]))]);
        // Torn third record and a damaged second record.
        bytes.extend(&encode_record(1, &Digest([3; 32]))[..20]);
        assert_eq!(parse(&bytes).unwrap().1.len(), 2);
        bytes[HEADER_LEN + RECORD_LEN + 9] ^= 1;
        assert_eq!(parse(&bytes).unwrap().1.len(), 1);
        bytes[5] ^= 1;
        assert!(parse(&bytes).is_none());
    }
}
