//! The receiving side's bookkeeping, sans-IO: which blocks of each file have arrived (with
//! their digests), whether a file is complete and matches the sender's seal, and when the
//! whole session is ([`Completion`]).

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};

use super::blocks;
use super::frame::BlockHeader;
use super::limits::{MAX_CHUNK_FILES, MAX_FILE_BLOCKS, MAX_UNFINISHED_FILES};
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

/// One file's bookkeeping. It grows only with what the peer actually sends (blocks and seal
/// pieces), never with the size it announces: a manifest entry of 2^63 bytes costs nothing
/// until that much data arrives.
#[derive(Debug)]
struct RecvFile {
    size: u64,
    blocks: u64,
    got: HashMap<u64, Digest>,
    /// The seal's digests received so far, in block order.
    seal: Vec<Digest>,
    /// The seal's last piece arrived.
    sealed: bool,
    complete: bool,
    /// Blocks held from an earlier run (the journal's) not yet checked against the seal.
    resumed: HashSet<u64>,
    /// Bytes of held blocks the seal refused since [`ReceiveTracker::take_unresumed`] last
    /// looked: they come again, so they were not resumed after all.
    unresumed: u64,
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
    /// already durable. An id the manifest used before is refused: taking it again would
    /// drop the file that holds it, never reported done or failed, and could commit the new
    /// one on the old one's verdict.
    pub fn expect(
        &mut self,
        file: u32,
        size: u64,
        have: &[(u64, Digest)],
    ) -> Result<(), Violation> {
        let blocks = blocks::count(size, self.block_size);
        if blocks > MAX_FILE_BLOCKS {
            return Err(Violation(format!(
                "file id {file} of {size} bytes has more than {MAX_FILE_BLOCKS} blocks (run \
                 the same hsxfer version on both ends)"
            )));
        }
        // A block recorded twice (re-sent after a failed seal) keeps its latest digest.
        let got: HashMap<u64, Digest> = have.iter().filter(|(b, _)| *b < blocks).copied().collect();
        let resumed = got.keys().copied().collect();
        self.claim(
            file,
            RecvFile {
                size,
                blocks,
                got,
                seal: Vec::new(),
                sealed: false,
                complete: false,
                resumed,
                unresumed: 0,
            },
        )
    }

    /// Records a file the plan skips, so that its id is not taken again either.
    pub fn skip(&mut self, file: u32) -> Result<(), Violation> {
        self.claim(
            file,
            RecvFile {
                size: 0,
                blocks: 0,
                got: HashMap::new(),
                seal: Vec::new(),
                sealed: true,
                complete: true,
                resumed: HashSet::new(),
                unresumed: 0,
            },
        )
    }

    fn claim(&mut self, file: u32, f: RecvFile) -> Result<(), Violation> {
        match self.files.entry(file) {
            Entry::Occupied(_) => Err(Violation(format!(
                "the manifest announced file id {file} twice"
            ))),
            Entry::Vacant(v) => {
                v.insert(f);
                Ok(())
            }
        }
    }

    /// Bytes of `file`'s held blocks that the seal refused since the last call: counted as
    /// resumed at its plan, they come again.
    pub fn take_unresumed(&mut self, file: u32) -> u64 {
        self.files
            .get_mut(&file)
            .map_or(0, |f| std::mem::take(&mut f.unresumed))
    }

    /// True once `file` is tracked (its plan made).
    pub fn tracks(&self, file: u32) -> bool {
        self.files.contains_key(&file)
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
            .is_some_and(|f| !f.complete && block < f.blocks && !f.got.contains_key(&block))
    }

    /// Records a block that arrived intact (CRC checked) with its BLAKE3 digest.
    pub fn on_block(&mut self, file: u32, block: u64, digest: Digest) -> Verdict {
        let Some(f) = self.files.get_mut(&file) else {
            return Verdict::Pending;
        };
        if !f.complete && block < f.blocks {
            f.got.entry(block).or_insert(digest);
        }
        Self::judge(f, self.block_size)
    }

    /// Records a piece of the sender's seal (the expected block digests, in order; `more`
    /// when further pieces follow).
    pub fn on_sealed(
        &mut self,
        file: u32,
        digests: Vec<Digest>,
        more: bool,
    ) -> Result<Verdict, Violation> {
        let f = self
            .files
            .get_mut(&file)
            .ok_or_else(|| Violation(format!("seal for unknown file {file}")))?;
        let total = f.seal.len() as u64 + digests.len() as u64;
        if f.sealed || total > f.blocks || (!more && total != f.blocks) {
            return Err(Violation(format!("bad seal for file {file}")));
        }
        f.seal.extend(digests);
        f.sealed = !more;
        Ok(Self::judge(f, self.block_size))
    }

    fn judge(f: &mut RecvFile, block_size: u32) -> Verdict {
        if !f.sealed || f.complete || (f.got.len() as u64) < f.blocks {
            return Verdict::Pending;
        }
        let bad: Vec<u64> = (0..f.blocks)
            .filter(|i| f.got.get(i) != Some(&f.seal[*i as usize]))
            .collect();
        if bad.is_empty() {
            f.complete = true;
            let digest = super::file_digest(&f.seal);
            // A finished file keeps only what `check` needs.
            f.got = HashMap::new();
            f.seal = Vec::new();
            Verdict::Complete { digest }
        } else {
            for b in &bad {
                f.got.remove(b);
                if f.resumed.remove(b) {
                    f.unresumed += u64::from(blocks::span(f.size, block_size, *b).1);
                }
            }
            Verdict::Resend(bad)
        }
    }
}

/// When a receiving session is done: the manifest's last piece arrived and every file it
/// announced is planned, and then committed or skipped. It also bounds how many files a
/// sender may keep unfinished, since each holds descriptors on the receiver until committed.
/// A piece may wait for its plan (for room in a server's budget of open files); its files
/// count as unfinished meanwhile.
#[derive(Debug, Default)]
pub struct Completion {
    manifest_done: bool,
    /// Files of pieces announced and not planned yet.
    unplanned: u64,
    /// Files planned to be received and not committed yet.
    unfinished: u64,
}

impl Completion {
    /// A piece of the manifest announcing `files` files (directories not counted); `last`
    /// when no piece follows. Refused, before any file is opened, when it holds more than
    /// [`MAX_CHUNK_FILES`] or would take the session past [`MAX_UNFINISHED_FILES`].
    pub fn announced(&mut self, files: u64, last: bool) -> Result<(), Violation> {
        if files > MAX_CHUNK_FILES {
            return Err(Violation(format!(
                "the sender announced {files} files in one piece of its manifest, more than \
                 {MAX_CHUNK_FILES} (run the same hsxfer version on both ends)"
            )));
        }
        if self.unplanned + self.unfinished + files > MAX_UNFINISHED_FILES {
            return Err(Violation(format!(
                "the sender announced more than {MAX_UNFINISHED_FILES} files not yet done (run \
                 the same hsxfer version on both ends)"
            )));
        }
        if self.manifest_done {
            return Err(Violation(
                "the sender announced files after its manifest's last piece".into(),
            ));
        }
        self.manifest_done = last;
        self.unplanned += files;
        Ok(())
    }

    /// A piece of `files` files got its plan: `receive` of them will be received (the
    /// others were skipped).
    pub fn planned(&mut self, files: u64, receive: u64) {
        self.unplanned = self.unplanned.saturating_sub(files);
        self.unfinished += receive;
    }

    /// A file was committed.
    pub fn committed(&mut self) {
        self.unfinished = self.unfinished.saturating_sub(1);
    }

    /// True once the whole manifest arrived and every file in it is done.
    pub fn finished(&self) -> bool {
        self.manifest_done && self.unplanned == 0 && self.unfinished == 0
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
        t.expect(1, 10, &[(1, d(1))]).unwrap();
        assert!(!t.wants(1, 1));
        assert!(t.wants(1, 0));
        assert_eq!(t.on_block(1, 0, d(0)), Verdict::Pending);
        assert_eq!(
            t.on_sealed(1, vec![d(0), d(1), d(2)], false).unwrap(),
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
    fn a_huge_announced_size_allocates_nothing_and_a_seal_may_come_in_pieces() {
        let mut t = ReceiveTracker::new(4);
        // 2^61 blocks: refused, before a seal of that many digests could be taken.
        let e = t.expect(1, 1 << 63, &[]).unwrap_err();
        assert!(e.0.contains("more than 4194304 blocks"), "{e}");
        // The most blocks a file may have: nothing is allocated for them up front.
        t.expect(1, MAX_FILE_BLOCKS * 4, &[(u64::MAX, d(1))])
            .unwrap();
        assert!(t.wants(1, MAX_FILE_BLOCKS - 1) && !t.wants(1, MAX_FILE_BLOCKS));
        assert!(
            t.on_sealed(1, vec![d(0)], false).is_err(),
            "too short a seal"
        );
        t.expect(2, 12, &[]).unwrap();
        assert_eq!(t.on_sealed(2, vec![d(0)], true).unwrap(), Verdict::Pending);
        assert!(
            t.on_sealed(2, vec![d(1), d(2), d(3)], true).is_err(),
            "a seal past the grid"
        );
        assert_eq!(
            t.on_sealed(2, vec![d(1), d(2)], false).unwrap(),
            Verdict::Pending
        );
        assert!(t.on_sealed(2, vec![], false).is_err(), "a second seal");
        assert_eq!(t.on_block(2, 0, d(0)), Verdict::Pending);
        assert_eq!(t.on_block(2, 1, d(1)), Verdict::Pending);
        assert_eq!(
            t.on_block(2, 2, d(2)),
            Verdict::Complete {
                digest: crate::channels::file_digest(&[d(0), d(1), d(2)])
            }
        );
    }

    #[test]
    fn stale_journal_digest_is_resent() {
        let mut t = ReceiveTracker::new(4);
        t.expect(1, 6, &[(0, d(5)), (1, d(7))]).unwrap();
        assert_eq!(t.take_unresumed(1), 0);
        assert_eq!(
            t.on_sealed(1, vec![d(6), d(8)], false).unwrap(),
            Verdict::Resend(vec![0, 1])
        );
        assert_eq!(t.take_unresumed(1), 6, "4 + the short last block's 2");
        assert_eq!(t.take_unresumed(1), 0, "taken once");
        // Sent again, one still damaged: nothing more is taken back, it was counted once.
        assert_eq!(t.on_block(1, 1, d(8)), Verdict::Pending);
        assert_eq!(t.on_block(1, 0, d(5)), Verdict::Resend(vec![0]));
        assert_eq!(t.take_unresumed(1), 0);
    }

    #[test]
    fn empty_file_completes_on_seal_and_bad_frames_are_caught() {
        let mut t = ReceiveTracker::new(4);
        t.expect(2, 0, &[]).unwrap();
        assert!(matches!(
            t.on_sealed(2, vec![], false).unwrap(),
            Verdict::Complete { .. }
        ));
        t.expect(3, 9, &[]).unwrap();
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
        assert!(
            t.on_sealed(3, vec![d(0)], false).is_err(),
            "wrong digest count"
        );
    }

    #[test]
    fn a_session_ends_after_the_last_manifest_piece_and_the_last_commit() {
        let mut c = Completion::default();
        assert!(!c.finished());
        c.announced(3, false).unwrap();
        c.planned(3, 2); // one skipped
        c.committed();
        assert!(!c.finished(), "more manifest to come");
        c.announced(0, true).unwrap();
        c.planned(0, 0);
        assert!(!c.finished(), "one file still unfinished");
        c.committed();
        assert!(c.finished());
        let mut waiting = Completion::default();
        waiting.announced(1, true).unwrap();
        assert!(!waiting.finished(), "a piece waits for its plan");
        waiting.planned(1, 0);
        assert!(waiting.finished());
        let mut empty = Completion::default();
        empty.announced(0, true).unwrap();
        assert!(empty.finished());
    }

    #[test]
    fn nothing_may_be_announced_after_the_manifests_last_piece() {
        let mut c = Completion::default();
        c.announced(0, true).unwrap();
        let e = c.announced(1, false).unwrap_err();
        assert!(e.0.contains("after its manifest's last piece"), "{e}");
        assert!(c.finished(), "the session still ends on what was announced");
    }

    #[test]
    fn a_file_id_announced_twice_is_refused() {
        let mut t = ReceiveTracker::new(4);
        t.expect(7, 8, &[]).unwrap();
        assert_eq!(t.on_block(7, 0, d(0)), Verdict::Pending);
        assert_eq!(t.on_block(7, 1, d(1)), Verdict::Pending);
        assert!(matches!(
            t.on_sealed(7, vec![d(0), d(1)], false).unwrap(),
            Verdict::Complete { .. }
        ));
        let e = t.expect(7, 8, &[]).unwrap_err();
        assert!(e.0.contains("file id 7 twice"), "{e}");
        assert!(!t.wants(7, 0), "the complete file stays complete");
        t.skip(8).unwrap();
        assert!(t.expect(8, 4, &[]).is_err(), "a skipped id is taken too");
        assert!(t.skip(7).is_err());
    }

    #[test]
    fn a_sender_may_not_keep_too_many_files_unfinished() {
        let mut c = Completion::default();
        let chunks = MAX_UNFINISHED_FILES / MAX_CHUNK_FILES;
        for _ in 0..chunks - 1 {
            c.announced(MAX_CHUNK_FILES, false).unwrap();
        }
        c.announced(MAX_CHUNK_FILES - 1, false).unwrap();
        // Files waiting for their plan count too.
        c.announced(1, false).unwrap();
        let e = c.announced(1, false).unwrap_err();
        assert!(e.0.contains("more than 1024 files"), "{e}");
        c.planned(MAX_UNFINISHED_FILES - 1, MAX_UNFINISHED_FILES - 1);
        c.planned(1, 1);
        assert!(c.announced(1, false).is_err());
        c.committed();
        c.announced(1, true).unwrap();
    }

    #[test]
    fn a_manifest_piece_may_not_hold_more_files_than_a_budget_takes_at_once() {
        let mut c = Completion::default();
        let e = c.announced(MAX_CHUNK_FILES + 1, false).unwrap_err();
        assert!(e.0.contains("more than 256"), "{e}");
        c.announced(MAX_CHUNK_FILES, false).unwrap();
    }
}
