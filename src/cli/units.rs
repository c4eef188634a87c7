//! Parsing sizes (`4M`, `2GiB`) and rates (`500M`, `10Gbit`) from the command line.

/// Parses a size in bytes: a number with an optional binary suffix K, M, G, T (also written
/// KiB, MB, …; all mean powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let (num, mult) = split_suffix(s, 1024)?;
    scale(num, mult).ok_or_else(|| format!("invalid size '{s}' (examples: 4096, 64K, 4M, 2G)"))
}

/// Parses a rate in bits per second: a number with an optional decimal suffix K, M, G, T
/// (powers of 1000), optionally followed by `bit`, `b` or `bps`, and `/s` (as printed).
/// Bytes (`1GB`, `100MiB`) are refused, not read as bits: a copy paced at an eighth of what
/// was meant would still succeed, only slowly.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix("/s").unwrap_or(t);
    if t.ends_with('B') || t.ends_with("Bps") {
        return Err(format!(
            "'{s}' is in bytes: rates are in bits per second (1 GB/s is 8G, 100 MB/s is 800M)"
        ));
    }
    let t = t
        .trim_end_matches("bps")
        .trim_end_matches("bit")
        .trim_end_matches('b');
    if t.ends_with('i') {
        return Err(format!(
            "invalid rate '{s}': rates take decimal units (K, M, G, T: powers of 1000)"
        ));
    }
    let (num, mult) = split_suffix(t, 1000)?;
    scale(num, mult).ok_or_else(|| format!("invalid rate '{s}' (examples: 500M, 10G, 2.5Gbit)"))
}

/// Parses a duration: a number with a unit `us`, `ms`, `s` (the default) or `m`, e.g.
/// `300ms`, `1.5s`, `2`.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let secs_per = match unit {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        "us" | "µs" => 1e-6,
        "m" | "min" => 60.0,
        _ => {
            return Err(format!(
                "invalid duration '{s}' (examples: 250ms, 1.5s, 2m)"
            ))
        }
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration '{s}' (examples: 250ms, 1.5s, 2m)"))?;
    std::time::Duration::try_from_secs_f64(v * secs_per)
        .map_err(|_| format!("invalid duration '{s}'"))
}

fn split_suffix(s: &str, base: u64) -> Result<(&str, u64), String> {
    let s = s.trim();
    let t = s
        .trim_end_matches('B')
        .trim_end_matches('i')
        .trim_end_matches(['k', 'K', 'm', 'M', 'g', 'G', 't', 'T']);
    let suffix = &s[t.len()..];
    let mult = match suffix.chars().next().map(|c| c.to_ascii_uppercase()) {
        None | Some('B') => 1,
        Some('K') => base,
        Some('M') => base.pow(2),
        Some('G') => base.pow(3),
        Some('T') => base.pow(4),
        _ => return Err(format!("unknown unit in '{s}'")),
    };
    Ok((t, mult))
}

fn scale(num: &str, mult: u64) -> Option<u64> {
    let num = num.trim();
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(mult);
    }
    let f: f64 = num.parse().ok()?;
    let v = f * mult as f64;
    (f.is_finite() && f >= 0.0 && v < u64::MAX as f64).then_some(v as u64)
}

/// Formats bits per second with a decimal unit, e.g. `9.41 Gbit/s`.
pub fn fmt_rate(bps: f64) -> String {
    const U: [&str; 5] = ["bit/s", "kbit/s", "Mbit/s", "Gbit/s", "Tbit/s"];
    let mut v = bps;
    let mut i = 0;
    while v >= 1000.0 && i < U.len() - 1 {
        v /= 1000.0;
        i += 1;
    }
    format!("{v:.2} {}", U[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_rates() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4M"), Ok(4 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1.5K"), Ok(1536));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("").is_err());
        assert_eq!(parse_rate("500M"), Ok(500_000_000));
        assert_eq!(parse_rate("2.5Gbit"), Ok(2_500_000_000));
        assert_eq!(parse_rate("100Mbps"), Ok(100_000_000));
        assert_eq!(parse_rate("9.41 Gbit/s"), Ok(9_410_000_000));
        for bytes in ["1GB", "100MiB", "1GB/s", "10MBps"] {
            let e = parse_rate(bytes).unwrap_err();
            assert!(e.contains("in bytes") && e.contains("8G"), "{bytes}: {e}");
        }
        assert!(parse_rate("100Mibit").is_err());
        assert_eq!(fmt_rate(9.41e9), "9.41 Gbit/s");
    }

    #[test]
    fn durations() {
        use std::time::Duration;
        assert_eq!(parse_duration("300ms"), Ok(Duration::from_millis(300)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("ms").is_err());
    }
}
