//! TCP sockets built with socket2 so options are set before `connect()` (where the kernel
//! needs them: buffer sizes decide the window scale, the congestion control the first RTTs).

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// Options applied to a data or control socket before it connects.
#[derive(Debug, Clone, Default)]
pub struct SocketOptions {
    /// Disable Nagle (control connections: small messages must not wait).
    pub nodelay: bool,
    /// Per-socket pacing cap in bytes per second (`SO_MAX_PACING_RATE`), if any.
    pub max_pacing_rate: Option<u64>,
}

/// Opens a listening socket on `addr` with `SO_REUSEADDR`, dual-stack for `[::]`.
pub fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    sock.set_reuse_address(true)?;
    if addr.is_ipv6() {
        sock.set_only_v6(false)?;
    }
    sock.bind(&addr.into())?;
    sock.listen(1024)?;
    sock.set_nonblocking(true)?;
    TcpListener::from_std(sock.into())
}

/// Connects to `addr` with `opts` applied before the SYN.
pub async fn connect(addr: SocketAddr, opts: &SocketOptions) -> io::Result<TcpStream> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    sock.set_nonblocking(true)?;
    sock.set_nodelay(opts.nodelay)?;
    if let Some(rate) = opts.max_pacing_rate {
        set_max_pacing_rate(&sock, rate)?;
    }
    let sock = TcpSocket::from_std_stream(std::net::TcpStream::from(sock));
    sock.connect(addr).await
}

/// Caps the socket's pacing rate (bytes/s) with `SO_MAX_PACING_RATE`. The value is passed as
/// a u64: a u32 would cap at about 34 Gbit/s. Works without the fq qdisc (TCP paces itself).
pub fn set_max_pacing_rate(sock: &impl AsRawFd, bytes_per_sec: u64) -> io::Result<()> {
    let v: u64 = bytes_per_sec;
    // SAFETY: passing a pointer to a live u64 and its exact size.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MAX_PACING_RATE,
            &v as *const u64 as *const libc::c_void,
            std::mem::size_of::<u64>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn connects_with_options_on_loopback() {
        let l = listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let opts = SocketOptions {
            nodelay: true,
            max_pacing_rate: Some(50_000_000_000),
        };
        let (c, s) = tokio::join!(connect(addr, &opts), l.accept());
        let c = c.unwrap();
        s.unwrap();
        assert!(c.nodelay().unwrap());
        let sock = socket2::SockRef::from(&c);
        let mut v: u64 = 0;
        let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
        // SAFETY: reading into a live u64 of the given size.
        let rc = unsafe {
            libc::getsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_MAX_PACING_RATE,
                &mut v as *mut u64 as *mut libc::c_void,
                &mut len,
            )
        };
        assert_eq!(rc, 0);
        assert_eq!(
            v, 50_000_000_000,
            "the 64-bit pacing cap is kept, not truncated"
        );
    }
}
