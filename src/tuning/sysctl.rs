//! Reading the host's network sysctls (`/proc/sys/...`) that limit a transfer.

use std::io;

/// Reads a sysctl by its dotted name (`net.core.rmem_max`), trimmed.
pub fn read(name: &str) -> io::Result<String> {
    let path = format!("/proc/sys/{}", name.replace('.', "/"));
    std::fs::read_to_string(&path)
        .map(|s| s.trim().to_string())
        .map_err(|e| io::Error::new(e.kind(), format!("reading {name}: {e}")))
}

/// Reads a sysctl holding one number.
pub fn read_u64(name: &str) -> io::Result<u64> {
    let s = read(name)?;
    s.parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{name}: not a number: {s}"),
        )
    })
}

/// A `min default max` triple such as `net.ipv4.tcp_rmem`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Triple {
    /// Smallest buffer under memory pressure.
    pub min: u64,
    /// Initial buffer of a new socket.
    pub default: u64,
    /// Largest buffer autotuning grows to.
    pub max: u64,
}

impl Triple {
    /// Reads a triple sysctl.
    pub fn read(name: &str) -> io::Result<Triple> {
        let s = read(name)?;
        let v: Vec<u64> = s
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        match v[..] {
            [min, default, max] => Ok(Triple { min, default, max }),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{name}: expected three numbers, got {s}"),
            )),
        }
    }
}

/// The limits on socket buffers, for one direction of data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct DirectionLimits {
    /// `net.core.[rw]mem_max`: the largest request `SO_[RCV|SND]BUF` accepts (the kernel
    /// doubles it).
    pub request_max: u64,
    /// `net.ipv4.tcp_[rw]mem`: what autotuning starts from and grows to.
    pub autotune: Triple,
}

impl DirectionLimits {
    /// The largest buffer (kernel size, after doubling) this direction can get, either by an
    /// explicit request or by autotuning.
    pub fn reachable(&self) -> u64 {
        (self.request_max * 2).max(self.autotune.max)
    }
}

/// Socket buffer limits for sending and receiving.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct BufferLimits {
    /// Limits on send buffers (`wmem_max`, `tcp_wmem`).
    pub send: DirectionLimits,
    /// Limits on receive buffers (`rmem_max`, `tcp_rmem`).
    pub receive: DirectionLimits,
}

impl BufferLimits {
    /// Reads the limits of the current network namespace.
    pub fn read() -> io::Result<BufferLimits> {
        Ok(BufferLimits {
            send: DirectionLimits {
                request_max: read_u64("net.core.wmem_max")?,
                autotune: Triple::read("net.ipv4.tcp_wmem")?,
            },
            receive: DirectionLimits {
                request_max: read_u64("net.core.rmem_max")?,
                autotune: Triple::read("net.ipv4.tcp_rmem")?,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_host() {
        let l = BufferLimits::read().unwrap();
        assert!(l.receive.request_max > 0 && l.receive.autotune.max >= l.receive.autotune.default);
        assert!(
            read_u64("net.ipv4.tcp_rmem").is_err(),
            "a triple is not one number"
        );
    }
}
