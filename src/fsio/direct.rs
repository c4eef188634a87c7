//! Writes that bypass the page cache (`O_DIRECT`) for large received files.
//!
//! A buffered write copies every byte into a page-cache page, which the kernel must first
//! allocate and later write back; receiving 4 GiB on 8 channels, that copy was 60 % of the
//! server's cycles on the 2-core test VM, where `dd oflag=direct` wrote the same file to the
//! same disk in about half the time of a buffered `dd` (docs/benchmarks.md). A direct write
//! goes from our buffer to the device, and a terabyte copy does not evict the host's cache.
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

/// Files at least this large are written directly where the filesystem allows. Below it the
/// page cache costs less than a second descriptor per file and a direct write's wait for the
/// device: small files are written, synced and committed in batches (see `commit_group`).
pub const DIRECT_MIN_BYTES: u64 = 64 << 20;

/// Alignment of offsets, lengths and memory for a direct write: a page, which covers devices
/// with 512- and 4096-byte logical blocks.
pub const DIRECT_ALIGN: usize = 4096;

/// Bytes per direct write when the data must first be copied to aligned memory: the copy
/// buffer of each file thread stays this small whatever the block size.
const COPY_CHUNK: usize = 4 << 20;

thread_local! {
    /// Aligned memory for data that arrived unaligned, reused by each file thread.
    static ALIGNED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// A second descriptor of a file being received, opened with `O_DIRECT`.
pub struct DirectWriter {
    file: File,
    /// Cleared when the filesystem refuses a direct write: later writes are buffered.
    on: AtomicBool,
}

impl DirectWriter {
    /// Opens `file` again for direct writes (through `/proc/self/fd`, which also reaches an
    /// unnamed `O_TMPFILE`), or `None` where the filesystem or the host refuses.
    pub fn open(file: &File) -> Option<DirectWriter> {
        let path = format!("/proc/self/fd/{}", file.as_raw_fd());
        let direct = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .ok()?;
        Some(DirectWriter {
            file: direct,
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
        loop {
            match self.file.write_at(data, offset) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    self.on.store(false, Ordering::Relaxed);
                    return Ok(0);
                }
                Err(e) => return Err(e),
            }
        }
    }
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
    fn cached_pages(file: &File, len: usize) -> usize {
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
            cached_pages(&file, done),
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
