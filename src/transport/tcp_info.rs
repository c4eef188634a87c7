//! `TCP_INFO`: the kernel's view of one connection (window, RTT, retransmissions, rates, and
//! what limited the sender), read without disturbing the socket, so it can be sampled while
//! tokio owns the stream. The reading's type, [`TcpSample`], is a wire type of
//! [`crate::channels::telemetry`]: a sending server forwards it.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

use crate::channels::telemetry::TcpSample;

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
    Ok(sample_of(&ti))
}

/// The fields hsxfer reports of one `struct tcp_info`.
pub(crate) fn sample_of(ti: &libc::tcp_info) -> TcpSample {
    TcpSample {
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
        delivered: ti.tcpi_delivered,
        busy_us: ti.tcpi_busy_time,
        rwnd_limited_us: ti.tcpi_rwnd_limited,
        sndbuf_limited_us: ti.tcpi_sndbuf_limited,
        notsent_bytes: ti.tcpi_notsent_bytes,
        snd_wnd: ti.tcpi_snd_wnd,
    }
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
        // The SYN counts as one delivered segment; the data made at least one more (loopback's
        // MSS is large), and the peer advertised a window.
        assert!(t.delivered >= 2, "{t:?}");
        assert!(t.snd_wnd > 0, "{t:?}");
    }
}
