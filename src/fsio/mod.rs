//! Files on disk: walking sources into a manifest, confining paths to a server root,
//! resolving `cp`-style destinations, writing partial files with a restart journal, and the
//! saved path profiles of `hsxfer probe`.

pub mod dest;
pub mod partial;
pub mod profiles;
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
