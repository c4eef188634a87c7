//! Multipath TCP (`IPPROTO_MPTCP`) channels: whether a connection really runs MPTCP, and
//! with how many subflows. A server listening with MPTCP also accepts plain TCP clients, and
//! an MPTCP client falls back to TCP when the server or a middlebox does not speak it; only
//! `MPTCP_INFO` tells which happened.

use std::os::fd::{AsFd, AsRawFd};

/// `SOL_MPTCP` (linux/socket.h).
const SOL_MPTCP: libc::c_int = 284;
/// `MPTCP_INFO` (linux/mptcp.h).
const MPTCP_INFO: libc::c_int = 1;

/// The number of subflows of the MPTCP connection on `sock` (the first one included), or
/// `None` when the connection runs as plain TCP: a TCP socket, or an MPTCP socket that fell
/// back (the kernel then refuses `MPTCP_INFO`).
pub fn subflows(sock: &impl AsFd) -> Option<u16> {
    // The head of struct mptcp_info: its first byte counts the subflows beyond the first.
    let mut info = [0u8; 96];
    let mut len = info.len() as libc::socklen_t;
    // SAFETY: pointer and length of a live, writable buffer.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_fd().as_raw_fd(),
            SOL_MPTCP,
            MPTCP_INFO,
            info.as_mut_ptr() as *mut libc::c_void,
            &mut len,
        )
    };
    (rc == 0 && len > 0).then(|| 1 + info[0] as u16)
}

/// True when an `IPPROTO_MPTCP` socket can be created here (`net.mptcp.enabled`).
pub fn available() -> bool {
    socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::STREAM,
        Some(socket2::Protocol::MPTCP),
    )
    .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn tcp_has_no_subflows_and_mptcp_has_one() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        assert_eq!(subflows(&c), None);
        assert!(available(), "MPTCP is off here (sysctl net.mptcp.enabled)");
        let addr = l.local_addr().unwrap();
        drop(l);
        let l = socket2::Socket::new(
            socket2::Domain::IPV4,
            socket2::Type::STREAM,
            Some(socket2::Protocol::MPTCP),
        )
        .unwrap();
        l.bind(&addr.into()).unwrap();
        l.listen(4).unwrap();
        let m = socket2::Socket::new(
            socket2::Domain::IPV4,
            socket2::Type::STREAM,
            Some(socket2::Protocol::MPTCP),
        )
        .unwrap();
        m.connect(&addr.into()).unwrap();
        let (accepted, _) = l.accept().unwrap();
        assert_eq!(subflows(&m), Some(1));
        assert_eq!(subflows(&accepted), Some(1));
        // A plain TCP client of an MPTCP listener: the accepted socket falls back.
        let t = TcpStream::connect(addr).unwrap();
        let (fallback, _) = l.accept().unwrap();
        assert_eq!(subflows(&fallback), None);
        drop(t);
    }
}
