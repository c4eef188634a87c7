//! Byte counts written for people, in messages from the library and the command line alike.

/// Formats bytes with a binary unit.
///
/// # Examples
///
/// ```
/// assert_eq!(hsxfer::units::fmt_bytes(1536), "1.50 KiB");
/// assert_eq!(hsxfer::units::fmt_bytes(512), "512 B");
/// ```
pub fn fmt_bytes(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", U[i])
    }
}
