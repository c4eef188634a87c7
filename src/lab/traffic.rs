//! Background traffic like Cui 2013 §5.6, scaled to the bottleneck: short-lived TCP flows
//! (exponential inter-arrival times, Pareto sizes with α = 1.5) carrying about 1.65 % of the
//! rate, and a constant-rate UDP flow of 3 % (seed: 165 Mb/s + 300 Mb/s on 10 Gb/s, 4.6 %).
//! A sink on the receiver discards both. Both ends run until killed.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// TCP port of the sink.
pub const TCP_PORT: u16 = 7500;
/// UDP port of the sink.
pub const UDP_PORT: u16 = 7501;
/// Share of the bottleneck the short TCP flows carry on average.
pub const TCP_SHARE: f64 = 0.0165;
/// Share of the bottleneck the UDP flow carries.
pub const UDP_SHARE: f64 = 0.03;
/// Pareto shape of the flow sizes.
pub const PARETO_ALPHA: f64 = 1.5;
/// UDP payload bytes per datagram.
const DATAGRAM: usize = 1200;

/// Mean short-flow size, bytes: the seed's 1 MB at 10 Gbit/s, scaled with the rate, at
/// least 64 KiB.
pub fn mean_flow_bytes(rate_bps: u64) -> f64 {
    (1e6 * rate_bps as f64 / 10e9).max(65536.0)
}

/// Short flows started per second so that they carry [`TCP_SHARE`] of the rate.
pub fn flows_per_second(rate_bps: u64) -> f64 {
    TCP_SHARE * rate_bps as f64 / 8.0 / mean_flow_bytes(rate_bps)
}

/// A Pareto-distributed size with the given mean (`u` uniform in (0, 1]), capped at 100 ×
/// the mean so one draw cannot dominate a short run.
pub fn pareto_bytes(mean: f64, u: f64) -> u64 {
    let scale = mean * (PARETO_ALPHA - 1.0) / PARETO_ALPHA;
    (scale / u.powf(1.0 / PARETO_ALPHA)).min(100.0 * mean) as u64
}

/// Accepts and discards TCP connections and UDP datagrams on `addr`.
pub fn sink(addr: Ipv4Addr) -> std::io::Result<()> {
    let udp = UdpSocket::bind((addr, UDP_PORT))?;
    std::thread::spawn(move || {
        let mut buf = [0u8; 65536];
        while udp.recv(&mut buf).is_ok() {}
    });
    let listener = TcpListener::bind((addr, TCP_PORT))?;
    for conn in listener.incoming().flatten() {
        std::thread::spawn(move || {
            let mut conn = conn;
            let mut buf = vec![0u8; 1 << 16];
            while matches!(conn.read(&mut buf), Ok(n) if n > 0) {}
        });
    }
    Ok(())
}

/// Sends the background mix to the sink at `addr`, scaled to `rate_bps`.
pub fn source(addr: Ipv4Addr, rate_bps: u64, seed: u64) -> std::io::Result<()> {
    let udp = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    udp.connect((addr, UDP_PORT))?;
    let udp_bps = UDP_SHARE * rate_bps as f64;
    std::thread::spawn(move || constant_rate(&udp, udp_bps));
    let mut rng = StdRng::seed_from_u64(seed);
    let mean = mean_flow_bytes(rate_bps);
    let lambda = flows_per_second(rate_bps);
    let target = SocketAddr::from((addr, TCP_PORT));
    loop {
        let gap = -(1.0 - rng.gen::<f64>()).ln() / lambda;
        std::thread::sleep(Duration::from_secs_f64(gap));
        let size = pareto_bytes(mean, 1.0 - rng.gen::<f64>());
        std::thread::spawn(move || {
            if let Ok(mut s) = TcpStream::connect_timeout(&target, Duration::from_secs(5)) {
                let chunk = vec![0u8; 1 << 16];
                let mut left = size;
                while left > 0 {
                    let n = left.min(chunk.len() as u64) as usize;
                    if s.write_all(&chunk[..n]).is_err() {
                        break;
                    }
                    left -= n as u64;
                }
            }
        });
    }
}

/// Sends datagrams at `bps`, in 1 ms rounds.
fn constant_rate(udp: &UdpSocket, bps: f64) {
    let payload = [0u8; DATAGRAM];
    let start = Instant::now();
    let mut sent_bits = 0.0;
    loop {
        let due = start.elapsed().as_secs_f64() * bps;
        while sent_bits < due {
            let _ = udp.send(&payload);
            sent_bits += (DATAGRAM * 8) as f64;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn background_is_scaled_to_the_seed_share() {
        // 10 Gbit/s: 1 MB flows, 165 Mbit/s of them → about 20.6 flows per second.
        assert_eq!(mean_flow_bytes(10_000_000_000), 1e6);
        let fps = flows_per_second(10_000_000_000);
        assert!((fps * 8.0 * 1e6 - 165e6).abs() < 1.0);
        assert_eq!(mean_flow_bytes(100_000_000), 65536.0);
    }

    #[test]
    fn pareto_sizes_have_the_requested_mean_and_scale() {
        assert_eq!(pareto_bytes(3000.0, 1.0), 1000);
        let mut rng = StdRng::seed_from_u64(7);
        let n = 200_000;
        let mean: f64 = (0..n)
            .map(|_| pareto_bytes(1e6, 1.0 - rng.gen::<f64>()) as f64)
            .sum::<f64>()
            / n as f64;
        // The cap at 100 × the mean trims the heavy tail a little (α = 1.5: about 7 %).
        assert!((0.85e6..1.0e6).contains(&mean), "{mean}");
    }
}
