//! Socket buffers sized to the path: from the bottleneck rate and the RTT, the window each
//! channel needs, and how to get it from this host's limits (explicit `SO_*BUF` or the
//! kernel's autotuning), with an exact fix when a limit caps the window below it.

use std::time::Duration;

use serde::Serialize;

use super::sysctl::DirectionLimits;

/// Window per channel, as a multiple of the channel's share of the BDP. A loss-based
/// congestion control fills the router queue too, so its window grows past the BDP; 2 covers
/// a queue of up to one BDP.
pub const HEADROOM: f64 = 2.0;

/// Bytes on the wire per segment besides its payload: IPv4 and TCP headers with the
/// timestamp option (52) and the Ethernet header (14) that a bottleneck link counts.
pub const WIRE_OVERHEAD: u32 = 66;

/// The payload rate, bits/s, that a bottleneck of `wire_bps` carries in segments of `mss`
/// bytes (1448 assumed when unknown): 956 Mbit/s of a 1 Gbit/s Ethernet link at MTU 1500.
pub fn goodput_rate(wire_bps: u64, mss: u32) -> u64 {
    let mss = if mss == 0 { 1448 } else { mss } as u64;
    wire_bps * mss / (mss + WIRE_OVERHEAD as u64)
}

/// What the user chose with `--buffer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufferChoice {
    /// Size from the path (rate and RTT); the default.
    Auto,
    /// Pass this many bytes to `SO_SNDBUF`/`SO_RCVBUF` (the kernel doubles it).
    Fixed(u64),
    /// Leave the kernel's autotuning in charge.
    Kernel,
}

pub use crate::channels::control::BufferRequest;

/// The window one channel needs on a path: its share of the bandwidth-delay product, with
/// [`HEADROOM`].
pub fn channel_window(rate_bps: u64, rtt: Duration, channels: u16) -> u64 {
    let bdp = rate_bps as f64 / 8.0 * rtt.as_secs_f64();
    (bdp / channels.max(1) as f64 * HEADROOM).ceil() as u64
}

/// Turns the user's choice into the request both ends apply; `Auto` needs a known rate.
pub fn request(
    choice: BufferChoice,
    rate_bps: Option<u64>,
    rtt: Duration,
    channels: u16,
) -> BufferRequest {
    match (choice, rate_bps) {
        (BufferChoice::Fixed(b), _) => BufferRequest::Fixed(b),
        (BufferChoice::Auto, Some(rate)) => {
            BufferRequest::Window(channel_window(rate, rtt, channels))
        }
        (BufferChoice::Auto, None) | (BufferChoice::Kernel, _) => BufferRequest::Kernel,
    }
}

/// Which direction of a socket a plan is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// `SO_SNDBUF`, limited by `wmem_max` and `tcp_wmem`.
    Send,
    /// `SO_RCVBUF`, limited by `rmem_max` and `tcp_rmem`.
    Receive,
}

impl Direction {
    /// The sysctls that limit this direction: the explicit-request cap (`net.core.*mem_max`)
    /// and the autotuning triple (`net.ipv4.tcp_*mem`).
    pub fn sysctls(self) -> (&'static str, &'static str) {
        match self {
            Direction::Send => ("net.core.wmem_max", "net.ipv4.tcp_wmem"),
            Direction::Receive => ("net.core.rmem_max", "net.ipv4.tcp_rmem"),
        }
    }

    /// `send` or `receive`, for messages.
    pub fn noun(self) -> &'static str {
        match self {
            Direction::Send => "send",
            Direction::Receive => "receive",
        }
    }
}

/// How one host gets one direction's buffers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BufferPlan {
    /// Value to pass to `SO_*BUF`; `None` leaves autotuning in charge.
    pub request: Option<u64>,
    /// Kernel buffer size the plan leads to (after doubling and clamping, or autotuning's
    /// maximum), bytes.
    pub expected: u64,
    /// When a host limit keeps the window below the channel's share of the BDP (so the
    /// channels cannot reach the path's rate): what, by how much, and the `sysctl -w` lines
    /// that fix it, headroom included.
    pub warning: Option<String>,
}

/// Plans one direction's buffers on this host for `req`, given its limits. Never plans
/// below what autotuning reaches on its own: an explicit size is only set when it is larger.
pub fn plan(
    req: BufferRequest,
    limits: &DirectionLimits,
    dir: Direction,
    channels: u16,
    rtt: Duration,
) -> BufferPlan {
    let autotune = BufferPlan {
        request: None,
        expected: limits.autotune.max,
        warning: None,
    };
    match req {
        BufferRequest::Kernel => autotune,
        BufferRequest::Fixed(b) => {
            let expected = 2 * b.min(limits.request_max);
            let warning = (b > limits.request_max).then(|| {
                let (max_name, _) = dir.sysctls();
                format!(
                    "{} buffer request {b} is clamped to {} by {max_name}; fix: sysctl -w {max_name}={b}",
                    dir.noun(),
                    limits.request_max,
                )
            });
            BufferPlan {
                request: Some(b),
                expected,
                warning,
            }
        }
        BufferRequest::Window(w) => {
            let needed = 2 * w;
            if needed <= limits.autotune.max {
                return autotune;
            }
            let explicit = 2 * w.min(limits.request_max);
            let mut p = if explicit > limits.autotune.max {
                BufferPlan {
                    request: Some(w),
                    expected: explicit,
                    warning: None,
                }
            } else {
                autotune
            };
            // Only a cap under the channel's share of the BDP itself holds it below the
            // path's rate; the headroom above it is asked for, not warned about. A copy
            // without a measured rate plans for the interface's speed, a bound: on a 10 Gbit/s
            // interface at 60 ms, 64 MiB buffers carry 17.8 Gbit/s with 4 channels, and every
            // such first copy warned that they were too small.
            if p.expected < share_buffer(needed) {
                p.warning = Some(cap_warning(dir, limits, p.expected, needed, channels, rtt));
            }
            p
        }
    }
}

/// The kernel buffer that carries one channel's share of the BDP, of the `needed` one that
/// carries its window with [`HEADROOM`].
fn share_buffer(needed: u64) -> u64 {
    (needed as f64 / HEADROOM).ceil() as u64
}

/// The throughput, bits/s, that `channels` channels reach when each socket's kernel buffer
/// is `kernel_bytes` at `rtt`: half of a kernel buffer carries data (the kernel doubles
/// requests to leave room for its own overhead), and each channel sends one window per RTT.
pub fn buffer_rate(kernel_bytes: u64, channels: u16, rtt: Duration) -> f64 {
    channels as f64 * (kernel_bytes / 2) as f64 * 8.0 / rtt.as_secs_f64().max(1e-6)
}

/// The largest buffer limit the sysctls take, a whole number of MiB: they are C `int`s, and
/// a larger value is refused (`sysctl -w net.core.rmem_max=2500853760` fails).
pub const MAX_SYSCTL_BUFFER: u64 = 2047 << 20;

/// The channels that keep each socket's kernel buffer within [`MAX_SYSCTL_BUFFER`] where
/// `channels` need `needed` bytes each; `None` when they fit already.
pub fn channels_within_sysctls(needed: u64, channels: u16) -> Option<u64> {
    (needed > MAX_SYSCTL_BUFFER).then(|| {
        let total = needed as u128 * channels.max(1) as u128;
        total
            .div_ceil(MAX_SYSCTL_BUFFER as u128)
            .min(u64::MAX as u128) as u64
    })
}

/// The `sysctl -w` commands that let `dir`'s buffers reach `needed` bytes (kernel size):
/// raise both the explicit-request cap and autotuning's maximum, keeping its minimum and
/// default. Rounded up to a whole MiB, and at most [`MAX_SYSCTL_BUFFER`] (beyond it, more
/// channels are the fix: [`channels_within_sysctls`]).
pub fn fix_commands(dir: Direction, limits: &DirectionLimits, needed: u64) -> Vec<String> {
    let (max_name, tcp_name) = dir.sysctls();
    let fix = needed.min(MAX_SYSCTL_BUFFER).next_multiple_of(1 << 20);
    vec![
        format!("sysctl -w {max_name}={fix}"),
        format!(
            "sysctl -w {tcp_name}=\"{} {} {fix}\"",
            limits.autotune.min, limits.autotune.default
        ),
    ]
}

fn cap_warning(
    dir: Direction,
    limits: &DirectionLimits,
    got: u64,
    needed: u64,
    channels: u16,
    rtt: Duration,
) -> String {
    let (max_name, tcp_name) = dir.sysctls();
    let more = channels_within_sysctls(needed, channels)
        .map(|n| format!(", and {n} channels or more (a buffer cannot exceed 2 GiB)"))
        .unwrap_or_default();
    format!(
        "{} buffers are capped at {got} bytes per channel ({max_name} = {}, {tcp_name} max = {}): \
         with {channels} channels at {:.1} ms that allows about {:.0} Mbit/s, under the {:.0} \
         Mbit/s planned; fix: {}{more}",
        dir.noun(),
        limits.request_max,
        limits.autotune.max,
        rtt.as_secs_f64() * 1e3,
        buffer_rate(got, channels, rtt) / 1e6,
        buffer_rate(share_buffer(needed), channels, rtt) / 1e6,
        fix_commands(dir, limits, needed).join("; "),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tuning::sysctl::Triple;

    const MIB: u64 = 1 << 20;

    fn limits(request_max: u64, autotune_max: u64) -> DirectionLimits {
        DirectionLimits {
            request_max,
            autotune: Triple {
                min: 4096,
                default: 131072,
                max: autotune_max,
            },
        }
    }

    #[test]
    fn goodput_is_the_wire_rate_net_of_headers() {
        assert_eq!(goodput_rate(1_000_000_000, 1448), 956_406_869);
        assert_eq!(goodput_rate(1_000_000_000, 0), 956_406_869);
        assert_eq!(goodput_rate(10_000_000_000, 8948), 9_926_780_563);
    }

    #[test]
    fn window_is_the_bdp_share_with_headroom() {
        // 1 Gbit/s × 60 ms = 7.5 MB; 4 channels: 1.875 MB each, × 2.
        assert_eq!(
            channel_window(1_000_000_000, Duration::from_millis(60), 4),
            3_750_000
        );
        assert_eq!(
            request(BufferChoice::Auto, None, Duration::from_millis(60), 4),
            BufferRequest::Kernel
        );
    }

    #[test]
    fn small_windows_stay_with_autotuning() {
        let p = plan(
            BufferRequest::Window(MIB),
            &limits(4 * MIB, 32 * MIB),
            Direction::Receive,
            4,
            Duration::from_millis(10),
        );
        assert_eq!(
            p,
            BufferPlan {
                request: None,
                expected: 32 * MIB,
                warning: None
            }
        );
    }

    #[test]
    fn large_windows_are_requested_explicitly() {
        let p = plan(
            BufferRequest::Window(40 * MIB),
            &limits(64 * MIB, 32 * MIB),
            Direction::Receive,
            4,
            Duration::from_millis(100),
        );
        assert_eq!(
            p,
            BufferPlan {
                request: Some(40 * MIB),
                expected: 80 * MIB,
                warning: None
            }
        );
    }

    #[test]
    fn a_cap_below_the_window_warns_with_the_fix() {
        // rmem_max 4 MiB (explicit: 8 MiB) is below autotuning's 32 MiB: autotuning wins,
        // but 32 MiB is below the 2 × 40 MiB needed.
        let p = plan(
            BufferRequest::Window(40 * MIB),
            &limits(4 * MIB, 32 * MIB),
            Direction::Receive,
            4,
            Duration::from_millis(100),
        );
        assert_eq!(p.request, None);
        assert_eq!(p.expected, 32 * MIB);
        let w = p.warning.unwrap();
        assert!(w.contains("sysctl -w net.core.rmem_max=83886080"), "{w}");
        assert!(
            w.contains("sysctl -w net.ipv4.tcp_rmem=\"4096 131072 83886080\""),
            "{w}"
        );
        // 4 channels × 16 MiB usable × 8 / 0.1 s = 5369 Mbit/s, where 4 shares of 20 MiB
        // carry 6711.
        assert!(
            w.contains("about 5369 Mbit/s, under the 6711 Mbit/s planned"),
            "{w}"
        );
    }

    #[test]
    fn a_cap_that_leaves_only_the_headroom_short_is_not_warned_about() {
        // The lab's first copy: a plan for the 10 Gbit/s interface at 60.3 ms over 4
        // channels asks for windows of 37.7 MB (twice the BDP share), kernel buffers of 75.4
        // MB. Autotuning's 64 MiB carries 32 MiB windows, 1.7 shares: 17.8 Gbit/s.
        let window = channel_window(10_000_000_000, Duration::from_micros(60_300), 4);
        let p = plan(
            BufferRequest::Window(window),
            &limits(4 * MIB, 64 * MIB),
            Direction::Send,
            4,
            Duration::from_micros(60_300),
        );
        assert_eq!(
            p,
            BufferPlan {
                request: None,
                expected: 64 * MIB,
                warning: None
            }
        );
        // Under one share it warns: 32 MiB kernel buffers carry 8.9 Gbit/s.
        let p = plan(
            BufferRequest::Window(window),
            &limits(4 * MIB, 32 * MIB),
            Direction::Send,
            4,
            Duration::from_micros(60_300),
        );
        assert!(p
            .warning
            .is_some_and(|w| w.contains("under the 10000 Mbit/s planned")));
    }

    #[test]
    fn a_fixed_request_reports_its_clamp() {
        let p = plan(
            BufferRequest::Fixed(16 * MIB),
            &limits(4 * MIB, 32 * MIB),
            Direction::Send,
            4,
            Duration::from_millis(1),
        );
        assert_eq!(p.request, Some(16 * MIB));
        assert_eq!(p.expected, 8 * MIB);
        assert!(p
            .warning
            .unwrap()
            .contains("sysctl -w net.core.wmem_max=16777216"));
    }
}
