//! `TCP_INFO`: the kernel's view of one connection (window, RTT, retransmissions, rates),
//! read without disturbing the socket, so it can be sampled while tokio owns the stream.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

use serde::{Deserialize, Serialize};

/// The fields of `struct tcp_info` hsxfer reports, in plain units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TcpSample {
    /// Congestion window, segments.
    pub cwnd: u32,
    /// Slow-start threshold, segments (the kernel's "infinity" is 2147483647).
    pub ssthresh: u32,
    /// Smoothed RTT, microseconds.
    pub rtt_us: u32,
    /// Lowest RTT seen, microseconds.
    pub min_rtt_us: u32,
    /// Segments currently retransmitted and not yet acknowledged.
    pub retrans: u32,
    /// Segments retransmitted over the connection's life.
    pub total_retrans: u32,
    /// Most recent delivery-rate estimate, bytes/s.
    pub delivery_rate: u64,
    /// Current pacing rate, bytes/s.
    pub pacing_rate: u64,
    /// Congestion-avoidance state: 0 Open, 1 Disorder, 2 CWR, 3 Recovery, 4 Loss.
    pub ca_state: u8,
    /// Bytes acknowledged by the peer (the kernel counts the SYN as one).
    pub bytes_acked: u64,
    /// Sender MSS, bytes.
    pub mss: u32,
}

impl TcpSample {
    /// True while the connection is recovering from a loss (Recovery or Loss state).
    pub fn recovering(&self) -> bool {
        self.ca_state == CA_RECOVERY || self.ca_state == CA_LOSS
    }
}

/// `TCP_CA_Recovery`: fast retransmit in progress.
pub const CA_RECOVERY: u8 = 3;
/// `TCP_CA_Loss`: retransmission timeout.
pub const CA_LOSS: u8 = 4;

/// Reads `TCP_INFO` from a TCP socket.
pub fn tcp_info(sock: &impl AsFd) -> io::Result<TcpSample> {
    // SAFETY: tcp_info is plain old data; all-zero is a valid value.
    let mut ti: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: pointer and length of a live, writable tcp_info.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_fd().as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            &mut ti as *mut libc::tcp_info as *mut libc::c_void,
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(TcpSample {
        cwnd: ti.tcpi_snd_cwnd,
        ssthresh: ti.tcpi_snd_ssthresh,
        rtt_us: ti.tcpi_rtt,
        min_rtt_us: ti.tcpi_min_rtt,
        retrans: ti.tcpi_retrans,
        total_retrans: ti.tcpi_total_retrans,
        delivery_rate: ti.tcpi_delivery_rate,
        pacing_rate: ti.tcpi_pacing_rate,
        ca_state: ti.tcpi_ca_state,
        bytes_acked: ti.tcpi_bytes_acked,
        mss: ti.tcpi_snd_mss,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn reads_a_live_connection() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        c.write_all(&[7u8; 100_000]).unwrap();
        let mut buf = vec![0u8; 100_000];
        s.read_exact(&mut buf).unwrap();
        // The last ACK may still be in flight (delayed ACK): poll briefly.
        let mut t = tcp_info(&c).unwrap();
        for _ in 0..100 {
            if t.bytes_acked > 100_000 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            t = tcp_info(&c).unwrap();
        }
        assert!(t.cwnd >= 1 && t.mss > 0);
        // The SYN counts as one acknowledged byte.
        assert_eq!(t.bytes_acked, 100_001);
        assert!(t.rtt_us > 0);
    }
}
