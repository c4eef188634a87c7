//! The receiving side's bookkeeping, sans-IO: which blocks of each file have arrived (with
//! their digests), and whether a file is complete and matches the sender's seal.

use std::collections::HashMap;

use super::blocks;
use super::frame::BlockHeader;
use super::{Digest, Violation};

/// What the receiver must do after an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing yet.
    Pending,
    /// Every block arrived and matches the seal: commit the file.
    Complete {
        /// End-to-end digest of the file (see [`super::file_digest`]).
        digest: Digest,
    },
    /// These blocks did not match the seal: they were dropped; ask for them again.
    Resend(Vec<u64>),
}

#[derive(Debug)]
struct RecvFile {
    size: u64,
    got: Vec<Option<Digest>>,
    missing: u64,
    sealed: Option<Vec<Digest>>,
    complete: bool,
}

/// Tracks every file of one receiving session.
#[derive(Debug)]
pub struct ReceiveTracker {
    block_size: u32,
    files: HashMap<u32, RecvFile>,
}

impl ReceiveTracker {
    /// A tracker for blocks of `block_size` bytes.
    pub fn new(block_size: u32) -> Self {
        ReceiveTracker {
            block_size,
            files: HashMap::new(),
        }
    }

    /// Starts tracking a file of `size` bytes of which `have` (from the restart journal) is
    /// already durable.
    pub fn expect(&mut self, file: u32, size: u64, have: &[(u64, Digest)]) {
        let n = blocks::count(size, self.block_size) as usize;
        let mut got = vec![None; n];
        let mut missing = n as u64;
        // A block recorded twice (re-sent after a failed seal) keeps its latest digest.
        for &(b, d) in have {
            if let Some(slot) = got.get_mut(b as usize) {
                missing -= slot.is_none() as u64;
                *slot = Some(d);
            }
        }
        self.files.insert(
            file,
            RecvFile {
                size,
                got,
                missing,
                sealed: None,
                complete: false,
            },
        );
    }

    /// Checks that a frame names a tracked, unfinished file and exactly one block of its grid;
    /// returns the block index. A frame that fails this came from a broken or hostile peer.
    pub fn check(&self, h: &BlockHeader) -> Result<u64, Violation> {
        let f = self
            .files
            .get(&h.file)
            .ok_or_else(|| Violation(format!("block for unknown file {}", h.file)))?;
        blocks::index_of(f.size, self.block_size, h.offset, h.len).ok_or_else(|| {
            Violation(format!(
                "block at offset {} length {} is not on the grid of file {}",
                h.offset, h.len, h.file
            ))
        })
    }

    /// True when `block` of `file` is still wanted (a duplicate is dropped, not written).
    pub fn wants(&self, file: u32, block: u64) -> bool {
        self.files
            .get(&file)
            .is_some_and(|f| !f.complete && f.got.get(block as usize) == Some(&None))
    }

    /// Records a block that arrived intact (CRC checked) with its BLAKE3 digest.
    pub fn on_block(&mut self, file: u32, block: u64, digest: Digest) -> Verdict {
        let Some(f) = self.files.get_mut(&file) else {
            return Verdict::Pending;
        };
        if let Some(slot @ None) = f.got.get_mut(block as usize) {
            *slot = Some(digest);
            f.missing -= 1;
        }
        Self::judge(f)
    }

    /// Records the sender's seal (the expected block digests).
    pub fn on_sealed(&mut self, file: u32, digests: Vec<Digest>) -> Result<Verdict, Violation> {
        let f = self
            .files
            .get_mut(&file)
            .ok_or_else(|| Violation(format!("seal for unknown file {file}")))?;
        if digests.len() != f.got.len() || f.sealed.is_some() {
            return Err(Violation(format!("bad seal for file {file}")));
        }
        f.sealed = Some(digests);
        Ok(Self::judge(f))
    }

    fn judge(f: &mut RecvFile) -> Verdict {
        let Some(sealed) = &f.sealed else {
            return Verdict::Pending;
        };
        if f.missing > 0 || f.complete {
            return Verdict::Pending;
        }
        let bad: Vec<u64> = (0..f.got.len())
            .filter(|&i| f.got[i] != Some(sealed[i]))
            .map(|i| i as u64)
            .collect();
        if bad.is_empty() {
            f.complete = true;
            Verdict::Complete {
                digest: super::file_digest(sealed),
            }
        } else {
            for &b in &bad {
                f.got[b as usize] = None;
            }
            f.missing = bad.len() as u64;
            Verdict::Resend(bad)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(x: u8) -> Digest {
        Digest([x; 32])
    }

    #[test]
    fn completes_only_when_all_blocks_match_the_seal() {
        let mut t = ReceiveTracker::new(4);
        t.expect(1, 10, &[(1, d(1))]);
        assert!(!t.wants(1, 1));
        assert!(t.wants(1, 0));
        assert_eq!(t.on_block(1, 0, d(0)), Verdict::Pending);
        assert_eq!(
            t.on_sealed(1, vec![d(0), d(1), d(2)]).unwrap(),
            Verdict::Pending
        );
        // Block 2 arrives with the wrong content (digest): it must be asked for again.
        assert_eq!(t.on_block(1, 2, d(7)), Verdict::Resend(vec![2]));
        assert!(t.wants(1, 2));
        let v = t.on_block(1, 2, d(2));
        assert_eq!(
            v,
            Verdict::Complete {
                digest: crate::channels::file_digest(&[d(0), d(1), d(2)])
            }
        );
        assert!(!t.wants(1, 0), "a complete file wants nothing");
    }

    #[test]
    fn stale_journal_digest_is_resent() {
        let mut t = ReceiveTracker::new(4);
        t.expect(1, 4, &[(0, d(5))]);
        assert_eq!(
            t.on_sealed(1, vec![d(6)]).unwrap(),
            Verdict::Resend(vec![0])
        );
    }

    #[test]
    fn empty_file_completes_on_seal_and_bad_frames_are_caught() {
        let mut t = ReceiveTracker::new(4);
        t.expect(2, 0, &[]);
        assert!(matches!(
            t.on_sealed(2, vec![]).unwrap(),
            Verdict::Complete { .. }
        ));
        t.expect(3, 9, &[]);
        let ok = BlockHeader {
            file: 3,
            offset: 8,
            len: 1,
        };
        assert_eq!(t.check(&ok), Ok(2));
        assert!(t
            .check(&BlockHeader {
                file: 3,
                offset: 4,
                len: 1
            })
            .is_err());
        assert!(t
            .check(&BlockHeader {
                file: 4,
                offset: 0,
                len: 1
            })
            .is_err());
        assert!(t.on_sealed(3, vec![d(0)]).is_err(), "wrong digest count");
    }
}
