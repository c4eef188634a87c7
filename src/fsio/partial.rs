//! Receiving one file: blocks are written at their offsets into a temporary file beside the
//! target (`.NAME.hsxfer-part`), a restart journal (`.NAME.hsxfer-journal`) records which
//! blocks are durable, and the file takes its final name only once complete and verified.
//!
//! Durability order: the data file is `fdatasync`ed before the journal records for its blocks
//! are written, at most every [`SYNC_EVERY_BYTES`] or [`SYNC_EVERY`], so a journal never names
//! a block whose bytes could be lost. Single-block files keep no journal: resending them is
//! cheaper than journaling them.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{ns_to_system_time, system_time_to_ns};
use crate::channels::journal::{self, JournalHeader};
use crate::channels::{blocks, Digest};

/// Journal records are flushed after this many bytes of blocks...
pub const SYNC_EVERY_BYTES: u64 = 64 << 20;
/// ...or this much time, whichever comes first.
pub const SYNC_EVERY: Duration = Duration::from_secs(1);

/// Bytes per `pwrite`: copying a whole 4 MiB block into the page cache in one system call
/// keeps the CPU from the network's soft interrupts for milliseconds, long enough to overflow
/// a small queue on the same host; pieces of 256 KiB leave a point between them where they
/// run.
pub const WRITE_PIECE: usize = 256 << 10;

/// What to do with an announced file.
pub enum Prepared {
    /// The target already has this size and mtime: nothing to send.
    Skip,
    /// Write into this partial file; `have` lists blocks already durable from a previous run.
    Write {
        /// The partial file.
        file: Box<PartialFile>,
        /// Durable blocks with their digests.
        have: Vec<(u64, Digest)>,
    },
}

/// Where a file's metadata comes from.
#[derive(Debug, Clone, Copy)]
pub struct FileMeta {
    /// Size in bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Modification time (ns since epoch).
    pub mtime_ns: i64,
}

struct Journal {
    file: File,
    pending: Vec<u8>,
    pending_bytes: u64,
    last_flush: Instant,
}

/// A file being received under a temporary name.
pub struct PartialFile {
    file: File,
    part: PathBuf,
    journal_path: Option<PathBuf>,
    journal: Option<Mutex<Journal>>,
    target: PathBuf,
    meta: FileMeta,
    block_size: u32,
    committed: AtomicBool,
}

fn sibling(target: &Path, suffix: &str) -> PathBuf {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    target.with_file_name(format!(".{name}.{suffix}"))
}

/// Decides whether `target` needs this file and opens (or resumes) its partial file.
pub fn prepare(target: &Path, meta: FileMeta, block_size: u32) -> io::Result<Prepared> {
    match fs::symlink_metadata(target) {
        Ok(m) if m.is_dir() => {
            return Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                format!("cannot overwrite directory {}", target.display()),
            ))
        }
        Ok(m)
            if m.is_file()
                && m.len() == meta.size
                && system_time_to_ns(m.modified()?) == meta.mtime_ns =>
        {
            return Ok(Prepared::Skip)
        }
        _ => {}
    }
    let part = sibling(target, "hsxfer-part");
    let journaled = blocks::count(meta.size, block_size) >= 2;
    let header = JournalHeader {
        block_size,
        size: meta.size,
        mtime_ns: meta.mtime_ns,
    };
    let jpath = journaled.then(|| sibling(target, "hsxfer-journal"));
    let mut have = Vec::new();
    let mut intact_len = 0;
    if let Some(jp) = &jpath {
        if let Ok(bytes) = fs::read(jp) {
            let part_len = fs::symlink_metadata(&part).map(|m| m.len()).ok();
            if let Some((h, recs)) = journal::parse(&bytes) {
                if h == header && part_len == Some(meta.size) {
                    intact_len = journal::HEADER_LEN + recs.len() * journal::RECORD_LEN;
                    // Later records win (a block re-sent after a failed seal is recorded again).
                    let n = blocks::count(meta.size, block_size);
                    let latest: BTreeMap<u64, Digest> =
                        recs.into_iter().filter(|r| r.0 < n).collect();
                    have = latest.into_iter().collect();
                }
            }
        }
    }
    let resuming = !have.is_empty();
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(!resuming)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&part)?;
    file.set_len(meta.size)?;
    let journal = match &jpath {
        Some(jp) => {
            let mut jf = OpenOptions::new()
                .append(true)
                .create(true)
                .truncate(false)
                .custom_flags(libc::O_NOFOLLOW)
                .open(jp)?;
            if !resuming {
                jf.set_len(0)?;
                jf.write_all(&header.encode())?;
            } else {
                // Drop a torn tail so new records follow intact ones.
                jf.set_len(intact_len as u64)?;
            }
            Some(Mutex::new(Journal {
                file: jf,
                pending: Vec::new(),
                pending_bytes: 0,
                last_flush: Instant::now(),
            }))
        }
        None => None,
    };
    Ok(Prepared::Write {
        file: Box::new(PartialFile {
            file,
            part,
            journal_path: jpath,
            journal,
            target: target.to_path_buf(),
            meta,
            block_size,
            committed: AtomicBool::new(false),
        }),
        have,
    })
}

impl PartialFile {
    /// Writes a block's bytes at `offset`, in [`WRITE_PIECE`] pieces.
    pub fn write_block(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        for (i, piece) in data.chunks(WRITE_PIECE).enumerate() {
            self.file
                .write_all_at(piece, offset + (i * WRITE_PIECE) as u64)?;
        }
        Ok(())
    }

    /// Notes that block `index` was written with `digest`; flushes the journal when due.
    pub fn record(&self, index: u64, digest: &Digest) -> io::Result<()> {
        let Some(j) = &self.journal else {
            return Ok(());
        };
        let mut j = j.lock().expect("journal lock");
        j.pending
            .extend_from_slice(&journal::encode_record(index, digest));
        j.pending_bytes += self.block_size as u64;
        if j.pending_bytes >= SYNC_EVERY_BYTES || j.last_flush.elapsed() >= SYNC_EVERY {
            self.file.sync_data()?;
            let pending = std::mem::take(&mut j.pending);
            j.file.write_all(&pending)?;
            j.pending_bytes = 0;
            j.last_flush = Instant::now();
        }
        Ok(())
    }

    /// Makes the file durable (if journaled), applies mode and mtime, renames it to its final
    /// name and removes the journal.
    pub fn commit(&self) -> io::Result<()> {
        if self.journal.is_some() {
            self.file.sync_data()?;
        }
        self.file
            .set_permissions(Permissions::from_mode(self.meta.mode))?;
        self.file
            .set_modified(ns_to_system_time(self.meta.mtime_ns))?;
        fs::rename(&self.part, &self.target)?;
        self.committed.store(true, Ordering::SeqCst);
        if let Some(jp) = &self.journal_path {
            let _ = fs::remove_file(jp);
        }
        Ok(())
    }

    /// The final path.
    pub fn target(&self) -> &Path {
        &self.target
    }
}

impl Drop for PartialFile {
    fn drop(&mut self) {
        if self.committed.load(Ordering::SeqCst) {
            return;
        }
        match &self.journal {
            // Keep what is durable for a resume: flush pending records after a data sync.
            Some(j) => {
                if let Ok(mut j) = j.lock() {
                    if !j.pending.is_empty() && self.file.sync_data().is_ok() {
                        let pending = std::mem::take(&mut j.pending);
                        let _ = j.file.write_all(&pending);
                    }
                }
            }
            None => {
                let _ = fs::remove_file(&self.part);
            }
        }
    }
}

/// A device or FIFO target. Seekable ones (`/dev/null`, block devices) take positioned
/// writes in any order; others (FIFOs, terminals) get the bytes in file order, with blocks
/// that arrive early held (copied) until their turn.
pub struct StreamSink {
    file: File,
    seekable: bool,
    next: u64,
    held: BTreeMap<u64, Vec<u8>>,
}

impl StreamSink {
    /// Opens `path` for writing.
    pub fn open(path: &Path) -> io::Result<Self> {
        let mut file = OpenOptions::new().write(true).open(path)?;
        let seekable = io::Seek::stream_position(&mut file).is_ok();
        Ok(StreamSink {
            file,
            seekable,
            next: 0,
            held: BTreeMap::new(),
        })
    }

    /// Accepts the block at `offset`, writing everything that can be written now.
    pub fn write_block(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        if self.seekable {
            return self.file.write_all_at(data, offset);
        }
        if offset != self.next {
            self.held.insert(offset, data.to_vec());
            return Ok(());
        }
        self.file.write_all(data)?;
        self.next += data.len() as u64;
        while let Some(data) = self.held.remove(&self.next) {
            self.file.write_all(&data)?;
            self.next += data.len() as u64;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(size: u64) -> FileMeta {
        FileMeta {
            size,
            mode: 0o640,
            mtime_ns: 1_600_000_000_123_456_789,
        }
    }

    #[test]
    fn commit_resume_and_skip() {
        let t = tempfile::tempdir().unwrap();
        let target = t.path().join("f");
        let Prepared::Write { file, have } = prepare(&target, meta(10), 4).unwrap() else {
            panic!("fresh file must be written")
        };
        assert!(have.is_empty());
        file.write_block(0, b"abcd").unwrap();
        file.record(0, &Digest([1; 32])).unwrap();
        drop(file); // interrupted: the journal keeps block 0
        assert!(!target.exists());
        let Prepared::Write { file, have } = prepare(&target, meta(10), 4).unwrap() else {
            panic!()
        };
        assert_eq!(have, vec![(0, Digest([1; 32]))]);
        file.write_block(4, b"efgh").unwrap();
        file.write_block(8, b"ij").unwrap();
        file.commit().unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"abcdefghij");
        let m = fs::metadata(&target).unwrap();
        assert_eq!(m.permissions().mode() & 0o7777, 0o640);
        assert_eq!(system_time_to_ns(m.modified().unwrap()), meta(10).mtime_ns);
        assert!(!sibling(&target, "hsxfer-journal").exists());
        assert!(matches!(
            prepare(&target, meta(10), 4).unwrap(),
            Prepared::Skip
        ));
        // A different source version (size) is written anew.
        assert!(matches!(
            prepare(&target, meta(11), 4).unwrap(),
            Prepared::Write { .. }
        ));
    }

    #[test]
    fn stream_sinks_put_blocks_in_place_seekable_or_not() {
        let t = tempfile::tempdir().unwrap();
        let fifo = t.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let f2 = fifo.clone();
        let reader = std::thread::spawn(move || fs::read(f2).unwrap());
        let file = t.path().join("file");
        fs::write(&file, b"").unwrap();
        for p in [&file, &fifo] {
            let mut s = StreamSink::open(p).unwrap();
            assert_eq!(s.seekable, p == &file);
            s.write_block(3, b"def").unwrap();
            s.write_block(0, b"abc").unwrap();
            s.write_block(6, b"g").unwrap();
        }
        assert_eq!(fs::read(&file).unwrap(), b"abcdefg");
        assert_eq!(reader.join().unwrap(), b"abcdefg");
    }
}
