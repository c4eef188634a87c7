//! Reads and writes that bypass the page cache (`O_DIRECT`) for large files.
//!
//! A buffered write copies every byte into a page-cache page, which the kernel must first
//! allocate and later write back; receiving 4 GiB on 8 channels, that copy was 60 % of the
//! server's cycles on the 2-core test VM, where `dd oflag=direct` wrote the same file to the
//! same disk in about half the time of a buffered `dd` (docs/benchmarks.md). A direct write
//! goes from our buffer to the device, and a terabyte copy does not evict the host's cache.
//! The sender reads a large file directly too, but only the blocks of which no page is
//! cached: a file just written or read is served from memory as before.
//!
//! `O_DIRECT` wants offsets, lengths and memory aligned to the device's block: blocks start
//! at multiples of the block size, so only a file's last block can be unaligned, and it goes
//! through the page cache like everything else does where a filesystem refuses direct I/O.
//! Durability is unchanged: `fdatasync` still makes the file's allocation durable.

use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::atomic::{AtomicBool, Ordering};

/// Files at least this large are written (and read) directly where the filesystem allows.
/// Below it the page cache costs less than a second descriptor per file and a direct
/// write's wait for the device: small files are written, synced and committed in batches
/// (see `commit_group`).
pub const DIRECT_MIN_BYTES: u64 = 64 << 20;

/// Alignment of offsets, lengths and memory for a direct write: a page, which covers devices
/// with 512- and 4096-byte logical blocks.
pub const DIRECT_ALIGN: usize = 4096;

/// Bytes per direct write or read when the data must go through aligned memory: the copy
/// buffer of each file thread stays this small whatever the block size.
const COPY_CHUNK: usize = 4 << 20;

thread_local! {
    /// Aligned memory for data in unaligned buffers, reused by each file thread.
    static ALIGNED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// A second descriptor of a file being received, opened with `O_DIRECT`.
pub struct DirectWriter {
    file: File,
    /// Cleared when the filesystem refuses a direct write: later writes are buffered.
    on: AtomicBool,
}

impl DirectWriter {
    /// Opens `file` again for direct writes, or `None` where that is refused.
    pub fn open(file: &File) -> Option<DirectWriter> {
        Some(DirectWriter {
            file: reopen_direct(file, true)?,
            on: AtomicBool::new(true),
        })
    }

    /// Whether writes still go direct (false once the filesystem refused one).
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Writes `data` at `offset` directly and returns how many leading bytes it wrote: all
    /// of them, or fewer where the rest is unaligned (the tail of a file) or the filesystem
    /// refused; the caller writes the rest through the page cache.
    pub fn write(&self, offset: u64, data: &[u8]) -> io::Result<usize> {
        if offset % DIRECT_ALIGN as u64 != 0 {
            return Ok(0);
        }
        let aligned_len = data.len() - data.len() % DIRECT_ALIGN;
        let mut done = 0;
        while done < aligned_len && self.is_on() {
            let n = if data[done..].as_ptr().align_offset(DIRECT_ALIGN) == 0 {
                self.write_once(offset + done as u64, &data[done..aligned_len])?
            } else {
                let len = (aligned_len - done).min(COPY_CHUNK);
                ALIGNED.with_borrow_mut(|buf| {
                    let copy = aligned_slice(buf, len);
                    copy.copy_from_slice(&data[done..done + len]);
                    self.write_once(offset + done as u64, copy)
                })?
            };
            // A short write can leave an unaligned remainder: the page cache takes it.
            if n == 0 || n % DIRECT_ALIGN != 0 {
                return Ok(done + n);
            }
            done += n;
        }
        Ok(done)
    }

    /// One `pwrite`: its count, or 0 after the filesystem refused direct I/O (`EINVAL`),
    /// which turns direct writes off for this file.
    fn write_once(&self, offset: u64, data: &[u8]) -> io::Result<usize> {
        let written = direct_io(|| self.file.write_at(data, offset))?;
        if written.is_none() {
            self.on.store(false, Ordering::Relaxed);
        }
        Ok(written.unwrap_or(0))
    }
}

/// `file` opened again with `O_DIRECT`, for writing or for reading, through
/// `/proc/self/fd` (which also reaches an unnamed `O_TMPFILE`), or `None` where the
/// filesystem or the host refuses.
fn reopen_direct(file: &File, write: bool) -> Option<File> {
    OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(libc::O_DIRECT)
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .ok()
}

/// One direct `pread` or `pwrite`, again when interrupted: its count, or `None` where the
/// filesystem refused direct I/O (`EINVAL`).
fn direct_io(mut op: impl FnMut() -> io::Result<usize>) -> io::Result<Option<usize>> {
    loop {
        match op() {
            Ok(n) => return Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(None),
            Err(e) => return Err(e),
        }
    }
}

/// Reads the leading aligned part of `buf.len()` bytes at `offset` of `file` directly if
/// none of its pages is in the page cache, and returns how many bytes it read: 0 when any
/// page is cached (or the kernel cannot say, or refuses direct reads), fewer than asked for
/// the unaligned tail or at the end of the file. The caller reads the rest as before.
pub fn read_uncached(file: &File, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
    let aligned_len = buf.len() - buf.len() % DIRECT_ALIGN;
    if offset % DIRECT_ALIGN as u64 != 0
        || aligned_len == 0
        || cached_pages(file, offset, aligned_len as u64) != Some(0)
    {
        return Ok(0);
    }
    let Some(direct) = reopen_direct(file, false) else {
        return Ok(0);
    };
    let mut done = 0;
    while done < aligned_len {
        let len = (aligned_len - done).min(COPY_CHUNK);
        let n = ALIGNED.with_borrow_mut(|scratch| {
            let aligned = aligned_slice(scratch, len);
            let n = direct_io(|| direct.read_at(aligned, offset + done as u64))?.unwrap_or(0);
            buf[done..done + n].copy_from_slice(&aligned[..n]);
            io::Result::Ok(n)
        })?;
        done += n;
        // The end of the file, or a remainder the page cache takes.
        if n < len {
            break;
        }
    }
    Ok(done)
}

/// `cachestat(2)` (Linux 6.5): its number is the same on every architecture.
const SYS_CACHESTAT: libc::c_long = 451;

/// Pages of `len` bytes at `offset` of `file` in the page cache, or `None` where the kernel
/// cannot say (`cachestat` is newer than the kernel).
fn cached_pages(file: &File, offset: u64, len: u64) -> Option<u64> {
    /// `struct cachestat_range`.
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    /// `struct cachestat`.
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    let range = Range { off: offset, len };
    let mut stat = Stat::default();
    // SAFETY: cachestat reads `range` and writes `stat`, both live and of the kernel's
    // layout for the call; `file` owns the descriptor.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const Range,
            &mut stat as *mut Stat,
            0u32,
        )
    };
    (r == 0).then_some(stat.nr_cache)
}

/// `len` bytes of `buf` starting at an address aligned to [`DIRECT_ALIGN`], growing `buf`
/// as needed.
fn aligned_slice(buf: &mut Vec<u8>, len: usize) -> &mut [u8] {
    if buf.len() < len + DIRECT_ALIGN {
        buf.resize(len + DIRECT_ALIGN, 0);
    }
    let start = buf.as_ptr().align_offset(DIRECT_ALIGN);
    &mut buf[start..start + len]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// Pages of `file` in the page cache (`mincore` over a mapping of it).
    fn resident_pages(file: &File, len: usize) -> usize {
        let mut pages = vec![0u8; len.div_ceil(4096)];
        // SAFETY: a fresh shared read-only mapping of a file we hold, unmapped before
        // returning; its memory is never read, only its residency asked.
        unsafe {
            let addr = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            );
            assert_ne!(addr, libc::MAP_FAILED);
            assert_eq!(libc::mincore(addr, len, pages.as_mut_ptr()), 0);
            libc::munmap(addr, len);
        }
        pages.iter().filter(|&&v| v & 1 == 1).count()
    }

    /// Unaligned memory, an aligned block and an unaligned tail: the bytes read back are
    /// the ones written, and the aligned part bypassed the page cache (on a filesystem with
    /// direct I/O, which `/var/tmp` on a disk has; CI runs there).
    #[test]
    fn aligned_blocks_go_direct_and_the_rest_is_left_to_the_caller() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let path = dir.path().join("f");
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let direct = DirectWriter::open(&file).expect("O_DIRECT on /var/tmp");
        let data: Vec<u8> = (0..3 * DIRECT_ALIGN + 100 + 1)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        // From an odd address: copied to aligned memory first.
        let unaligned = &data[1..];
        assert_ne!(unaligned.as_ptr().align_offset(DIRECT_ALIGN), 0);
        let done = direct.write(0, unaligned).unwrap();
        assert_eq!(done, 3 * DIRECT_ALIGN, "the aligned part");
        assert!(direct.is_on());
        assert_eq!(
            resident_pages(&file, done),
            0,
            "direct writes left pages cached"
        );
        file.write_all_at(&unaligned[done..], done as u64).unwrap();
        // An unaligned offset is left to the page cache entirely.
        assert_eq!(direct.write(100, &data[..DIRECT_ALIGN]).unwrap(), 0);
        let mut back = Vec::new();
        File::open(&path).unwrap().read_to_end(&mut back).unwrap();
        assert_eq!(back, unaligned);
    }

    /// A block of which no page is cached is read directly, and leaves none cached; once
    /// the file is in the page cache, the caller reads it from there.
    #[test]
    fn only_uncached_blocks_are_read_directly() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..4 * DIRECT_ALIGN + 10)
            .map(|i| (i % 253) as u8)
            .collect();
        std::fs::write(&path, &data).unwrap();
        let file = File::open(&path).unwrap();
        file.sync_all().unwrap();
        // SAFETY: advice on a descriptor `file` owns; no memory is passed.
        let evicted =
            unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(evicted, 0);
        assert_eq!(cached_pages(&file, 0, data.len() as u64), Some(0));
        let mut buf = vec![0u8; data.len()];
        let done = read_uncached(&file, 0, &mut buf).unwrap();
        assert_eq!(done, 4 * DIRECT_ALIGN, "the aligned part, directly");
        assert_eq!(&buf[..done], &data[..done]);
        assert_eq!(resident_pages(&file, done), 0, "a direct read cached pages");
        // Cached now: left to the page cache.
        let mut whole = Vec::new();
        File::open(&path).unwrap().read_to_end(&mut whole).unwrap();
        assert_eq!(read_uncached(&file, 0, &mut buf).unwrap(), 0);
    }

    #[test]
    fn an_aligned_slice_is_aligned_and_as_long_as_asked() {
        let mut buf = Vec::new();
        for len in [1, DIRECT_ALIGN, COPY_CHUNK] {
            let s = aligned_slice(&mut buf, len);
            assert_eq!(s.len(), len);
            assert_eq!(s.as_ptr().align_offset(DIRECT_ALIGN), 0);
        }
    }
}
