//! The sending side's bookkeeping, sans-IO: which blocks must go out, which digests are
//! known, when a file can be sealed, and when the whole transfer is finished.
//!
//! The I/O layer feeds it manifest entries, the receiver's plans, hashed blocks, and the
//! receiver's `Nack`/`FileDone`; it answers with [`Job`]s to run and [`Message`]s to send.

use std::collections::{HashMap, HashSet};

use super::blocks;
use super::control::{FilePlan, Message, PlanAction};
use super::limits::{MAX_RESENDS, SEAL_PIECE};
use super::manifest::{Entry, EntryKind};
use super::{Digest, Violation};

/// Work for a data channel: read and hash one block, and send it unless `send` is false
/// (the receiver holds it from an earlier run; the seal must still cover it so the resumed
/// bytes are verified too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Job {
    /// File identifier.
    pub file: u32,
    /// Block index.
    pub block: u64,
    /// Byte offset of the block.
    pub offset: u64,
    /// Length of the block.
    pub len: u32,
    /// Send it (true) or only hash it (false).
    pub send: bool,
}

fn job(file: u32, size: u64, block_size: u32, block: u64, send: bool) -> Job {
    let (offset, len) = blocks::span(size, block_size, block);
    Job {
        file,
        block,
        offset,
        len,
        send,
    }
}

/// A file announced and not yet finished (committed or skipped): finished files are
/// forgotten, so what the planner holds grows with the blocks hashed of the files in flight,
/// not with the blocks of the tree. A tree of large files pulled in 4 KiB blocks and
/// skipped once held 33 bytes for every block of every file until the session ended.
#[derive(Debug)]
struct SendFile {
    size: u64,
    /// Blocks in the file.
    blocks: u64,
    /// Digests of the blocks hashed so far, by index; grown as blocks are hashed.
    digests: Vec<Option<Digest>>,
    unknown: u64,
    planned: bool,
    sealed: bool,
    /// Times each block was asked for again (only blocks that were).
    resends: HashMap<u64, u8>,
    /// Blocks the receiver held from an earlier run, counted as resumed until one is asked
    /// for again (its kept copy did not match the seal).
    held: HashSet<u64>,
}

/// Tracks every file of one sending session.
#[derive(Debug)]
pub struct SendPlanner {
    block_size: u32,
    files: HashMap<u32, SendFile>,
    /// One past the highest file id announced: a block of a file below it that is no longer
    /// tracked was hashed late, after its file finished, and is no error.
    ids_below: u32,
    manifest_complete: bool,
    skipped_bytes: u64,
    resumed_bytes: u64,
}

impl SendPlanner {
    /// A planner cutting files into blocks of `block_size` bytes.
    pub fn new(block_size: u32) -> Self {
        SendPlanner {
            block_size,
            files: HashMap::new(),
            ids_below: 0,
            manifest_complete: false,
            skipped_bytes: 0,
            resumed_bytes: 0,
        }
    }

    /// Registers the files of a manifest chunk the sender is about to send.
    pub fn announce(&mut self, entries: &[Entry], last: bool) {
        for e in entries {
            if let EntryKind::File { size } = e.kind {
                let n = blocks::count(size, self.block_size);
                self.ids_below = self.ids_below.max(e.id.saturating_add(1));
                self.files.insert(
                    e.id,
                    SendFile {
                        size,
                        blocks: n,
                        digests: Vec::new(),
                        unknown: n,
                        planned: false,
                        sealed: false,
                        resends: HashMap::new(),
                        held: HashSet::new(),
                    },
                );
            }
        }
        self.manifest_complete |= last;
    }

    fn file(&mut self, id: u32) -> Result<&mut SendFile, Violation> {
        self.files
            .get_mut(&id)
            .ok_or_else(|| Violation(format!("unknown or finished file id {id}")))
    }

    /// Forgets a file the receiver committed or skipped.
    fn finish(&mut self, id: u32) {
        self.files.remove(&id);
    }

    /// Applies the receiver's plan for one file: returns the jobs to queue and, for a file
    /// with nothing to hash (empty), the seal to send at once.
    pub fn on_plan(&mut self, plan: &FilePlan) -> Result<(Vec<Job>, Vec<Message>), Violation> {
        let bs = self.block_size;
        let f = self.file(plan.file)?;
        if f.planned {
            return Err(Violation(format!("second plan for file {}", plan.file)));
        }
        f.planned = true;
        let mut jobs = Vec::new();
        match &plan.action {
            PlanAction::Skip => {
                self.skipped_bytes += f.size;
                self.finish(plan.file);
                return Ok((jobs, Vec::new()));
            }
            PlanAction::Send { have } => {
                let n = f.blocks;
                if let Some(b) = have.iter().find(|&&b| b >= n) {
                    return Err(Violation(format!("plan names block {b} of {n}")));
                }
                f.held = have.iter().copied().collect();
                for block in 0..n {
                    jobs.push(job(plan.file, f.size, bs, block, !f.held.contains(&block)));
                }
                self.resumed_bytes += jobs
                    .iter()
                    .filter(|j| !j.send)
                    .map(|j| j.len as u64)
                    .sum::<u64>();
            }
        }
        let seal = self.try_seal(plan.file);
        Ok((jobs, seal))
    }

    /// Records the digest of a block that was read (and sent, for a [`Job`] with `send`). Returns the
    /// seal's pieces once every block of the file has a digest. A re-sent block whose digest
    /// differs from the first read means the source changed under us.
    pub fn on_hashed(
        &mut self,
        file: u32,
        block: u64,
        digest: Digest,
    ) -> Result<Vec<Message>, Violation> {
        // A job queued before its file finished (a block asked for again, whose other copy
        // arrived intact meanwhile): nothing is owed for it any more.
        let Some(f) = self.files.get_mut(&file) else {
            return match file < self.ids_below {
                true => Ok(Vec::new()),
                false => Err(Violation(format!(
                    "block hashed for unknown file id {file}"
                ))),
            };
        };
        if block >= f.blocks {
            return Err(Violation(format!("block {block} out of range")));
        }
        if f.digests.len() <= block as usize {
            f.digests.resize(block as usize + 1, None);
        }
        let slot = &mut f.digests[block as usize];
        match slot {
            Some(old) if *old != digest => {
                return Err(Violation(format!(
                    "source file {file} changed while it was being sent (block {block})"
                )))
            }
            Some(_) => return Ok(Vec::new()),
            None => {
                *slot = Some(digest);
                f.unknown -= 1;
            }
        }
        Ok(self.try_seal(file))
    }

    /// The seal of `file`, in pieces of at most [`SEAL_PIECE`] digests, once every block is
    /// hashed and the receiver's plan is in; empty otherwise.
    fn try_seal(&mut self, file: u32) -> Vec<Message> {
        let Some(f) = self.files.get_mut(&file) else {
            return Vec::new();
        };
        if f.sealed || f.unknown > 0 || !f.planned {
            return Vec::new();
        }
        f.sealed = true;
        let digests: Vec<Digest> = f.digests.iter().map(|d| d.expect("all known")).collect();
        if digests.is_empty() {
            return vec![Message::Sealed {
                file,
                digests,
                more: false,
            }];
        }
        let pieces = digests.len().div_ceil(SEAL_PIECE);
        digests
            .chunks(SEAL_PIECE)
            .enumerate()
            .map(|(i, d)| Message::Sealed {
                file,
                digests: d.to_vec(),
                more: i + 1 < pieces,
            })
            .collect()
    }

    /// The receiver wants a block again, at most [`MAX_RESENDS`] times.
    pub fn on_nack(&mut self, file: u32, block: u64) -> Result<Job, Violation> {
        let bs = self.block_size;
        let f = self.file(file)?;
        // Before its plan the receiver has asked for nothing of the file: a block sent
        // again then would count as both sent and held once the plan names it.
        if !f.planned || block >= f.blocks {
            return Err(Violation(format!("nack for block {block} of file {file}")));
        }
        let times = f.resends.entry(block).or_default();
        if *times == MAX_RESENDS {
            return Err(Violation(format!(
                "block {block} of file {file} asked for again more than {MAX_RESENDS} times \
                 (is every copy of it damaged on the way?)"
            )));
        }
        *times += 1;
        let again = job(file, f.size, bs, block, true);
        if f.held.remove(&block) {
            // Sent after all: no longer resumed.
            self.resumed_bytes -= again.len as u64;
        }
        Ok(again)
    }

    /// The receiver verified and committed a file.
    pub fn on_done(&mut self, file: u32) -> Result<(), Violation> {
        if !self.file(file)?.sealed {
            return Err(Violation(format!("unexpected completion of file {file}")));
        }
        self.finish(file);
        Ok(())
    }

    /// Files announced and neither committed nor skipped yet: what the receiver may hold
    /// open.
    pub fn unfinished(&self) -> usize {
        self.files.len()
    }

    /// True when the manifest is complete and every file is committed or skipped.
    pub fn finished(&self) -> bool {
        self.manifest_complete && self.files.is_empty()
    }

    /// Bytes of files the receiver already had in full.
    pub fn skipped_bytes(&self) -> u64 {
        self.skipped_bytes
    }

    /// Bytes of partial files the receiver held from an earlier run.
    pub fn resumed_bytes(&self) -> u64 {
        self.resumed_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: u32, size: u64) -> Entry {
        Entry::sample(id, EntryKind::File { size })
    }

    fn send(file: u32, have: Vec<u64>) -> FilePlan {
        FilePlan {
            file,
            action: PlanAction::Send { have },
        }
    }

    #[test]
    fn a_held_block_asked_for_again_is_no_longer_resumed() {
        let mut p = SendPlanner::new(4);
        p.announce(&[entry(1, 10)], true);
        p.on_plan(&send(1, vec![0, 2])).unwrap();
        assert_eq!(p.resumed_bytes(), 6);
        assert_eq!(p.on_nack(1, 2).unwrap(), job(1, 10, 4, 2, true));
        assert_eq!(
            p.resumed_bytes(),
            4,
            "the short last block is sent after all"
        );
        p.on_nack(1, 2).unwrap();
        p.on_nack(1, 1).unwrap();
        assert_eq!(
            p.resumed_bytes(),
            4,
            "counted back once, and only for held blocks"
        );
    }

    #[test]
    fn seals_after_all_blocks_and_finishes_after_done() {
        let mut p = SendPlanner::new(4);
        p.announce(&[entry(1, 10), entry(2, 0), entry(3, 5)], true);
        let (jobs, seal) = p.on_plan(&send(1, vec![1])).unwrap();
        assert_eq!(
            jobs,
            vec![
                job(1, 10, 4, 0, true),
                job(1, 10, 4, 1, false),
                job(1, 10, 4, 2, true)
            ]
        );
        assert_eq!((jobs[2].offset, jobs[2].len), (8, 2));
        assert!(seal.is_empty());
        assert_eq!(p.resumed_bytes(), 4);
        // Empty file: sealed at once.
        let (jobs, seal) = p.on_plan(&send(2, vec![])).unwrap();
        assert!(jobs.is_empty());
        assert_eq!(
            seal,
            vec![Message::Sealed {
                file: 2,
                digests: vec![],
                more: false
            }]
        );
        p.on_plan(&FilePlan {
            file: 3,
            action: PlanAction::Skip,
        })
        .unwrap();
        assert_eq!(p.skipped_bytes(), 5);
        assert!(p.on_hashed(1, 0, Digest([0; 32])).unwrap().is_empty());
        assert!(p.on_hashed(1, 2, Digest([2; 32])).unwrap().is_empty());
        let seal = p.on_hashed(1, 1, Digest([1; 32])).unwrap();
        assert!(
            matches!(&seal[..], [Message::Sealed { file: 1, digests, more: false }] if digests.len() == 3)
        );
        assert_eq!(p.on_nack(1, 2).unwrap(), job(1, 10, 4, 2, true));
        // Re-read with the same content is fine; different content is a changed source.
        assert!(p.on_hashed(1, 2, Digest([2; 32])).unwrap().is_empty());
        assert!(p.on_hashed(1, 2, Digest([9; 32])).is_err());
        assert!(!p.finished());
        p.on_done(1).unwrap();
        p.on_done(2).unwrap();
        assert!(p.finished());
    }

    /// A file of more blocks than one message can carry digests for is sealed in pieces the
    /// receiver reassembles: files of any size finish.
    #[test]
    fn a_seal_too_large_for_one_message_goes_in_pieces() {
        use crate::channels::receiver::{ReceiveTracker, Verdict};
        let blocks = 2 * SEAL_PIECE as u64 + 1;
        let mut p = SendPlanner::new(4);
        p.announce(&[entry(1, blocks * 4)], true);
        assert!(p.on_plan(&send(1, vec![])).unwrap().1.is_empty());
        let mut r = ReceiveTracker::new(4);
        r.expect(1, blocks * 4, &[]).unwrap();
        let digest = |b: u64| Digest(blake3::hash(&b.to_le_bytes()).into());
        let mut seal = Vec::new();
        for b in 0..blocks {
            let pieces = p.on_hashed(1, b, digest(b)).unwrap();
            if b + 1 < blocks {
                assert!(pieces.is_empty());
            } else {
                seal = pieces;
            }
            assert_eq!(r.on_block(1, b, digest(b)), Verdict::Pending);
        }
        assert_eq!(seal.len(), 3);
        let mut verdicts = Vec::new();
        for m in seal {
            let Message::Sealed {
                file,
                digests,
                more,
            } = m
            else {
                panic!("{m:?}")
            };
            assert!(digests.len() <= SEAL_PIECE);
            verdicts.push(r.on_sealed(file, digests, more).unwrap());
        }
        assert_eq!(verdicts[..2], [Verdict::Pending, Verdict::Pending]);
        assert!(matches!(verdicts[2], Verdict::Complete { .. }));
    }

    #[test]
    fn rejects_impossible_peer_messages() {
        let mut p = SendPlanner::new(4);
        p.announce(&[entry(1, 10)], false);
        assert!(p.on_plan(&send(9, vec![])).is_err());
        assert!(p.on_plan(&send(1, vec![3])).is_err());
        let mut p = SendPlanner::new(4);
        p.announce(&[entry(1, 10)], true);
        assert!(p.on_nack(1, 0).is_err(), "a nack before the plan");
        p.on_plan(&send(1, vec![])).unwrap();
        assert!(p.on_plan(&send(1, vec![])).is_err(), "second plan");
        assert!(p.on_done(1).is_err(), "done before sealed");
        assert!(p.on_nack(1, 3).is_err());
        assert!(!p.finished());
    }

    /// A block goes out again at most MAX_RESENDS times: a peer cannot grow the sender's
    /// queue of jobs without bound by asking for one block over and over.
    #[test]
    fn a_block_is_sent_again_a_bounded_number_of_times() {
        let mut p = SendPlanner::new(4);
        p.announce(&[entry(1, 10)], true);
        p.on_plan(&send(1, vec![])).unwrap();
        for _ in 0..MAX_RESENDS {
            assert_eq!(p.on_nack(1, 0).unwrap(), job(1, 10, 4, 0, true));
        }
        let e = p.on_nack(1, 0).unwrap_err();
        assert!(e.0.contains("more than 8 times"), "{e:?}");
        // Each block has its own count.
        assert!(p.on_nack(1, 1).is_ok());
    }

    /// What the planner holds follows the files in flight: announcing a file takes no room
    /// per block, and a file skipped or committed is forgotten.
    #[test]
    fn finished_files_are_forgotten_and_announced_ones_hold_no_blocks() {
        let mut p = SendPlanner::new(4 << 10);
        let huge = 16u64 << 40;
        let entries: Vec<Entry> = (0..1000).map(|i| entry(i, huge)).collect();
        p.announce(&entries, true);
        assert!(p.files.values().all(|f| f.digests.capacity() == 0));
        for i in 0..1000 {
            let plan = FilePlan {
                file: i,
                action: PlanAction::Skip,
            };
            p.on_plan(&plan).unwrap();
        }
        assert!(p.files.is_empty() && p.finished());
        assert_eq!(p.skipped_bytes(), 1000 * huge);
        assert!(
            p.on_plan(&send(7, vec![])).is_err(),
            "a file already skipped"
        );

        let mut p = SendPlanner::new(4);
        p.announce(&[entry(1, 10)], true);
        p.on_plan(&send(1, vec![])).unwrap();
        p.on_hashed(1, 2, Digest([2; 32])).unwrap();
        p.on_hashed(1, 0, Digest([0; 32])).unwrap();
        assert!(
            p.on_hashed(1, 3, Digest([3; 32])).is_err(),
            "past the file's blocks"
        );
        assert_eq!(
            p.on_hashed(1, 1, Digest([1; 32])).unwrap().len(),
            1,
            "sealed"
        );
        p.on_done(1).unwrap();
        assert!(p.files.is_empty() && p.finished());
        assert!(p.on_nack(1, 0).is_err() && p.on_done(1).is_err());
        let late = p.on_hashed(1, 1, Digest([1; 32])).unwrap();
        assert!(late.is_empty(), "a block hashed after its file finished");
        assert!(
            p.on_hashed(2, 0, Digest([1; 32])).is_err(),
            "never announced"
        );
    }
}
