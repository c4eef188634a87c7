//! Files on disk: walking sources into a manifest, confining paths to a server root,
//! resolving `cp`-style destinations, checking there is room, writing partial files with a
//! restart journal (large ones past the page cache), and the saved path profiles of
//! `hsxfer probe`; and telling remote operands (`HOST:PATH`) from local paths.

pub mod at;
mod descriptor;
pub mod dest;
pub mod direct;
pub mod operands;
pub mod partial;
pub mod profiles;
pub mod room;
pub mod root;
pub mod source;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Converts a modification time to nanoseconds since the epoch (negative before 1970).
pub fn system_time_to_ns(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i64,
        Err(e) => -(e.duration().as_nanos() as i64),
    }
}

/// Converts nanoseconds since the epoch back to a [`SystemTime`].
pub fn ns_to_system_time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

/// The permission bits a received file or directory gets: the sender's, without setuid,
/// setgid or sticky bits, and with this process's umask applied (as `cp` does), so a peer
/// can never plant a setuid program or a world-writable file.
pub fn masked_mode(mode: u32) -> u32 {
    mode & 0o777 & !umask()
}

/// This process's umask, read from `/proc/self/status` (reading it with `umask(2)` would set
/// it for a moment for every thread); 022 if the kernel does not say.
fn umask() -> u32 {
    static UMASK: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *UMASK.get_or_init(|| {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                let line = s.lines().find_map(|l| l.strip_prefix("Umask:"))?;
                u32::from_str_radix(line.trim(), 8).ok()
            })
            .unwrap_or(0o022)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn received_modes_lose_special_bits_and_follow_the_umask() {
        let u = umask();
        assert_eq!(masked_mode(0o4755), 0o755 & !u);
        assert_eq!(masked_mode(0o2777), 0o777 & !u);
        assert_eq!(masked_mode(0o1600), 0o600 & !u);
    }
}
