//! Room for a file on the receiving filesystem, checked before its first byte is written: a
//! file that cannot fit is refused at once, with the numbers, instead of after filling the
//! disk with what fits.

use std::io;
use std::os::fd::AsFd;

use nix::sys::statfs::{fstatfs, FsType, BTRFS_SUPER_MAGIC};

use crate::units::fmt_bytes;

/// `statfs` magic of ZFS, which nix does not name.
const ZFS_SUPER_MAGIC: FsType = FsType(0x2fc1_2fc1);

/// Refuses to write `needed` more bytes into the filesystem of `dir` when it has fewer free
/// (for this process: root may use the blocks reserved for it).
///
/// Filesystems that may store a file in fewer bytes than its size (ZFS and btrfs, which
/// compress) and those that report no size are not checked: there a full disk shows as
/// the write's own error.
pub fn ensure_room(dir: &impl AsFd, needed: u64) -> io::Result<()> {
    let fs = fstatfs(dir)?;
    if compresses(fs.filesystem_type()) || fs.blocks() == 0 {
        return Ok(());
    }
    let free_blocks = if nix::unistd::geteuid().is_root() {
        fs.blocks_free()
    } else {
        fs.blocks_available()
    };
    let free = (free_blocks as u64).saturating_mul(fs.block_size() as u64);
    if needed <= free {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::StorageFull,
        format!(
            "it needs {} and its filesystem has {} free: free space there or choose another \
             destination",
            fmt_bytes(needed),
            fmt_bytes(free)
        ),
    ))
}

fn compresses(t: FsType) -> bool {
    t == BTRFS_SUPER_MAGIC || t == ZFS_SUPER_MAGIC
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_larger_than_the_free_space_is_refused_with_the_numbers() {
        let dir = std::fs::File::open(std::env::temp_dir()).unwrap();
        ensure_room(&dir, 0).unwrap();
        let e = ensure_room(&dir, u64::MAX).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::StorageFull);
        let msg = e.to_string();
        assert!(
            msg.starts_with("it needs 16777216.00 TiB and its filesystem has "),
            "{msg}"
        );
        assert!(
            msg.ends_with("free: free space there or choose another destination"),
            "{msg}"
        );
    }
}
