//! Filesystem calls relative to an open directory (`openat`, `fstatat`, `renameat`,
//! `unlinkat`, `mkdirat`), each on one name inside it and never following a symlink there:
//! what a receiver does beside its target goes through the directory it opened once, not
//! through a path that a local user could redirect between two calls.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::Path;

use nix::fcntl::{openat, renameat, AtFlags, OFlag};
use nix::sys::stat::{fstatat, mkdirat, FileStat, Mode};
use nix::unistd::{unlinkat, UnlinkatFlags};

/// Opens (or creates, with `flags` holding `O_CREAT`) `name` in `dir`, never through a
/// symlink.
pub fn open(dir: &impl AsRawFd, name: &str, flags: OFlag, mode: u32) -> io::Result<File> {
    let flags = flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = openat(
        Some(dir.as_raw_fd()),
        name,
        flags,
        Mode::from_bits_truncate(mode),
    )?;
    // SAFETY: openat returned a new descriptor that nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// The status of `name` in `dir` itself (a symlink is not followed), `None` if absent.
pub fn stat(dir: &impl AsRawFd, name: &str) -> io::Result<Option<FileStat>> {
    match fstatat(Some(dir.as_raw_fd()), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(s) => Ok(Some(s)),
        Err(nix::Error::ENOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Renames `from` to `to`, both in `dir`.
pub fn rename(dir: &impl AsRawFd, from: &str, to: &str) -> io::Result<()> {
    let fd = Some(dir.as_raw_fd());
    Ok(renameat(fd, from, fd, to)?)
}

/// Removes the file `name` from `dir`.
pub fn remove(dir: &impl AsRawFd, name: &str) -> io::Result<()> {
    Ok(unlinkat(
        Some(dir.as_raw_fd()),
        name,
        UnlinkatFlags::NoRemoveDir,
    )?)
}

/// Creates directory `name` in `dir` (mode 777 less the umask; its own mode comes later).
pub fn mkdir(dir: &impl AsRawFd, name: &str) -> io::Result<()> {
    Ok(mkdirat(
        Some(dir.as_raw_fd()),
        name,
        Mode::from_bits_truncate(0o777),
    )?)
}

/// Splits `path` into the directory to open (`.` for a bare name) and the name inside it;
/// `None` when it has no name that is UTF-8.
pub fn split(path: &Path) -> Option<(&Path, &str)> {
    let name = path.file_name()?.to_str()?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    Some((parent, name))
}

/// The status of an open file or directory.
pub fn fstat(f: &impl AsRawFd) -> io::Result<FileStat> {
    Ok(nix::sys::stat::fstat(f.as_raw_fd())?)
}

/// Modification time in nanoseconds since the epoch, as manifests carry it: held to what
/// that can say (1677 to 2262), where the plain sum wrapped a time in 2300 to one in 1715.
pub fn mtime_ns(s: &FileStat) -> i64 {
    let ns = i128::from(s.st_mtime) * 1_000_000_000 + i128::from(s.st_mtime_nsec);
    ns.clamp(i64::MIN.into(), i64::MAX.into()) as i64
}

/// True when `s` is a symlink.
pub fn is_symlink(s: &FileStat) -> bool {
    s.st_mode & libc::S_IFMT == libc::S_IFLNK
}

/// True when `s` is a regular file.
pub fn is_file(s: &FileStat) -> bool {
    s.st_mode & libc::S_IFMT == libc::S_IFREG
}

/// True when `s` is a directory.
pub fn is_dir(s: &FileStat) -> bool {
    s.st_mode & libc::S_IFMT == libc::S_IFDIR
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn a_time_past_2262_is_held_to_the_latest_a_manifest_can_say() {
        let t = tempfile::tempdir().unwrap();
        let f = std::fs::File::create(t.path().join("f")).unwrap();
        // 2299-07-25: ext4 and tmpfs keep times up to 2446.
        f.set_modified(UNIX_EPOCH + Duration::from_secs(10_400_000_000))
            .unwrap();
        assert_eq!(mtime_ns(&fstat(&f).unwrap()), i64::MAX);
        // Before 1677, with nanoseconds (ext4 keeps nothing before 1901, so a made-up
        // status): held to the earliest, which the receiver sets and reads back the same.
        // SAFETY: `stat` is plain integers, for which all zeroes is a value.
        let mut st: FileStat = unsafe { std::mem::zeroed() };
        st.st_mtime = -10_000_000_000;
        st.st_mtime_nsec = 5;
        assert_eq!(mtime_ns(&st), i64::MIN);
        f.set_modified(UNIX_EPOCH + Duration::new(1_700_000_000, 5))
            .unwrap();
        assert_eq!(mtime_ns(&fstat(&f).unwrap()), 1_700_000_000_000_000_005);
    }
}
