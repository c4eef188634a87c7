//! Paths that name one of this process's open descriptors (`/dev/stdout`, `/dev/fd/N`,
//! `/proc/self/fd/N`): a destination there is written through that descriptor.

use std::fs;
use std::os::fd::RawFd;
use std::path::Path;

/// The number of this process's descriptor that `p` leads to through symbolic links
/// (`/dev/stdout`: 1), if it does.
pub(crate) fn named(p: &Path) -> Option<RawFd> {
    let own = Path::new("/proc")
        .join(std::process::id().to_string())
        .join("fd");
    let mut p = p.to_path_buf();
    // The kernel follows at most 40 links in a path.
    for _ in 0..40 {
        for dir in [Path::new("/proc/self/fd"), Path::new("/dev/fd"), &own] {
            if let Ok(rest) = p.strip_prefix(dir) {
                return rest.to_str()?.parse().ok();
            }
        }
        let next = fs::read_link(&p).ok()?;
        p = p.parent().map_or(next.clone(), |dir| dir.join(next));
    }
    None
}
