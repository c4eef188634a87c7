//! TCP sockets built with socket2 so options are set before `connect()` (where the kernel
//! needs them: buffer sizes decide the window scale, the congestion control the first RTTs).

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::Arc;
use std::time::Duration;

use socket2::{Domain, Protocol, SockRef, Socket, TcpKeepalive, Type};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// Something done to a socket before its congestion control starts that this layer need not
/// understand: the DMCTCP group of a transfer (`tuning::bundled::group`) tags its channels
/// this way, so the socket layer links no BPF code.
pub trait SocketTag: fmt::Debug + Send + Sync {
    /// What the tag does, for errors ("joining the dmctcp group").
    fn what(&self) -> &'static str;
    /// Tags the socket.
    fn tag(&self, sock: BorrowedFd<'_>) -> io::Result<()>;
}

/// A shared [`SocketTag`]; two are equal when they are the same tag.
#[derive(Debug, Clone)]
pub struct Tag(pub Arc<dyn SocketTag>);

impl PartialEq for Tag {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Tag {}

/// Options applied to a data or control socket before it connects (or, on the server, right
/// after it is accepted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SocketOptions {
    /// Disable Nagle (control connections: small messages must not wait).
    pub nodelay: bool,
    /// Congestion control (`TCP_CONGESTION`); `None` keeps the host default.
    pub congestion: Option<String>,
    /// `SO_SNDBUF` request in bytes; `None` leaves the kernel's autotuning in charge.
    pub send_buffer: Option<u64>,
    /// `SO_RCVBUF` request in bytes; `None` leaves the kernel's autotuning in charge.
    pub recv_buffer: Option<u64>,
    /// Per-socket pacing cap in bytes per second (`SO_MAX_PACING_RATE`), if any.
    pub max_pacing_rate: Option<u64>,
    /// Unsent bytes above which the socket does not report itself writable
    /// (`TCP_NOTSENT_LOWAT`), if set.
    pub notsent_lowat: Option<u32>,
    /// A tag to put on the socket before its congestion control starts (its DMCTCP group).
    pub tag: Option<Tag>,
    /// Connect with Multipath TCP (`IPPROTO_MPTCP`); the connection falls back to TCP by
    /// itself when the server does not speak it, and a host without MPTCP gets a TCP socket.
    pub mptcp: bool,
    /// With `mptcp`, make the socket while the namespace selects the userspace path manager,
    /// so that its subflows are the ones asked for ([`super::mptcp_pm`]; root only).
    pub userspace_pm: bool,
}

impl SocketOptions {
    /// Applies everything but Nagle to `sock`, naming the option that failed.
    pub fn apply(&self, sock: &impl AsFd) -> io::Result<()> {
        let named = |what: &'static str| {
            move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"))
        };
        if let Some(Tag(t)) = &self.tag {
            t.tag(sock.as_fd()).map_err(named(t.what()))?;
        }
        if let Some(cc) = &self.congestion {
            super::cc::set_congestion(sock, cc).map_err(named("setting TCP_CONGESTION"))?;
        }
        if let Some(b) = self.send_buffer {
            super::buffers::set_send_buffer(sock, b).map_err(named("setting SO_SNDBUF"))?;
        }
        if let Some(b) = self.recv_buffer {
            super::buffers::set_recv_buffer(sock, b).map_err(named("setting SO_RCVBUF"))?;
        }
        if let Some(rate) = self.max_pacing_rate {
            set_max_pacing_rate(sock, rate).map_err(named("setting SO_MAX_PACING_RATE"))?;
        }
        if let Some(bytes) = self.notsent_lowat {
            set_notsent_lowat(sock, bytes).map_err(named("setting TCP_NOTSENT_LOWAT"))?;
        }
        Ok(())
    }
}

/// Opens a listening socket on `addr` with `SO_REUSEADDR`, dual-stack for `[::]`. With
/// `mptcp` it listens with Multipath TCP, which accepts plain TCP clients as well.
pub fn listen(addr: SocketAddr, mptcp: bool) -> io::Result<TcpListener> {
    bind(addr, mptcp)?.listen()
}

/// Binds a server's socket as [`listen`] does, without listening yet: what a client must find
/// in place from its first connection (a server's MPTCP announcements) is set up in between.
pub fn bind(addr: SocketAddr, mptcp: bool) -> io::Result<Bound> {
    let sock = Socket::new(
        Domain::for_address(addr),
        Type::STREAM,
        Some(protocol(mptcp)),
    )?;
    sock.set_reuse_address(true)?;
    if addr.is_ipv6() {
        sock.set_only_v6(false)?;
    }
    sock.bind(&addr.into())?;
    Ok(Bound(sock))
}

/// A server's socket bound by [`bind`], not yet accepting connections.
#[derive(Debug)]
pub struct Bound(Socket);

impl Bound {
    /// The bound address, with the port the kernel chose for port 0.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("the bound address is not an IP address"))
    }

    /// Starts listening.
    pub fn listen(self) -> io::Result<TcpListener> {
        self.0.listen(1024)?;
        self.0.set_nonblocking(true)?;
        TcpListener::from_std(self.0.into())
    }
}

/// Connects to `addr` with `opts` and [`keep_alive`] applied before the SYN.
pub async fn connect(addr: SocketAddr, opts: &SocketOptions) -> io::Result<TcpStream> {
    let domain = Domain::for_address(addr);
    let make = || Socket::new(domain, Type::STREAM, Some(protocol(opts.mptcp)));
    let made = match opts.mptcp && opts.userspace_pm {
        true => super::mptcp_pm::with_userspace_pm(make)?,
        false => make(),
    };
    let sock = match made {
        // A host with MPTCP turned off: the connection runs as TCP, as a fallback would.
        Err(_) if opts.mptcp => Socket::new(domain, Type::STREAM, Some(Protocol::TCP))?,
        s => s?,
    };
    sock.set_nonblocking(true)?;
    sock.set_nodelay(opts.nodelay)?;
    opts.apply(&sock)?;
    keep_alive(&sock)?;
    let sock = TcpSocket::from_std_stream(std::net::TcpStream::from(sock));
    sock.connect(addr).await
}

fn protocol(mptcp: bool) -> Protocol {
    match mptcp {
        true => Protocol::MPTCP,
        false => Protocol::TCP,
    }
}

/// A connection idle this long is probed (`TCP_KEEPIDLE`)...
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
/// ...every this often (`TCP_KEEPINTVL`)...
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// ...and dropped after this many probes go unanswered (`TCP_KEEPCNT`).
pub const KEEPALIVE_PROBES: u32 = 3;
/// Sent data unacknowledged this long drops the connection (`TCP_USER_TIMEOUT`): two minutes
/// without a single ACK is a dead path even at 250 ms RTT with backed-off retransmits.
pub const USER_TIMEOUT: Duration = Duration::from_secs(120);

/// Makes a vanished peer end the connection within about a minute whether the connection is
/// idle (keepalive probes) or sending (`TCP_USER_TIMEOUT`), so its session frees what it
/// holds instead of waiting forever.
pub fn keep_alive(sock: &impl AsFd) -> io::Result<()> {
    let sock = SockRef::from(sock);
    let probes = TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    sock.set_tcp_keepalive(&probes)?;
    match sock.set_tcp_user_timeout(Some(USER_TIMEOUT)) {
        // MPTCP sockets do not take it; their keepalive probes still end a vanished peer.
        Err(e) if e.raw_os_error() == Some(libc::ENOPROTOOPT) => Ok(()),
        other => other,
    }
}

/// Unsent bytes a sending data socket holds before it stops taking more: a channel that
/// already has this much queued lets another channel take the next block (work stealing
/// stays fair, and a channel added later gets work). 4 MiB lasts 33 ms at 1 Gbit/s per
/// channel and 3 ms at 10 Gbit/s, both far longer than the sender needs to write the next
/// block once woken.
pub const NOTSENT_LOWAT: u32 = 4 << 20;

/// Sets `TCP_NOTSENT_LOWAT`.
pub fn set_notsent_lowat(sock: &impl AsFd, bytes: u32) -> io::Result<()> {
    let v = bytes as libc::c_int;
    // SAFETY: passing a pointer to a live c_int and its exact size.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_fd().as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_NOTSENT_LOWAT,
            &v as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sends at once what Nagle's algorithm holds back on `sock`, and keeps the algorithm on for
/// what follows: turning `TCP_NODELAY` on pushes the socket's pending data out, and turning
/// it off again lets later writes merge as before. A data channel that has written its last
/// queued block calls it: Nagle holds a block's short last segment while an earlier short
/// one is unacknowledged, and a receiver delays the ACK that releases it (40 ms or more), so
/// a small block sent right after a join's answer, the only block of a small pull, waited
/// that long.
pub fn push_pending(sock: &TcpStream) -> io::Result<()> {
    sock.set_nodelay(true)?;
    sock.set_nodelay(false)
}

/// A `SO_MAX_PACING_RATE` that caps nothing but turns TCP's internal pacing on (any value
/// but `u64::MAX` does: `sk_setsockopt` then sets `SK_PACING_NEEDED`): packets leave spread
/// over the RTT at 2 × cwnd/srtt in slow start and 1.2 × in congestion avoidance, instead of
/// in ACK-clocked bursts.
pub const PACING_UNCAPPED: u64 = u64::MAX - 1;

/// Caps the socket's pacing rate (bytes/s) with `SO_MAX_PACING_RATE`. The value is passed as
/// a u64: a u32 would cap at about 34 Gbit/s. Works without the fq qdisc (TCP paces itself).
/// On an MPTCP socket, which refuses the option, the cap is the connection's: its subflows
/// share it ([`super::subflow_pacing`], root only).
pub fn set_max_pacing_rate(sock: &impl AsFd, bytes_per_sec: u64) -> io::Result<()> {
    if super::mptcp::is_mptcp(sock) {
        return super::subflow_pacing::set_total(sock, bytes_per_sec);
    }
    let v: u64 = bytes_per_sec;
    // SAFETY: passing a pointer to a live u64 and its exact size.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_fd().as_raw_fd(),
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
        let l = listen("127.0.0.1:0".parse().unwrap(), false).unwrap();
        let addr = l.local_addr().unwrap();
        let opts = SocketOptions {
            nodelay: true,
            max_pacing_rate: Some(50_000_000_000),
            ..Default::default()
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
                sock.as_fd().as_raw_fd(),
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
        assert!(sock.keepalive().unwrap());
        assert_eq!(sock.keepalive_time().unwrap(), KEEPALIVE_IDLE);
        assert_eq!(sock.keepalive_interval().unwrap(), KEEPALIVE_INTERVAL);
        assert_eq!(sock.keepalive_retries().unwrap(), KEEPALIVE_PROBES);
        assert_eq!(sock.tcp_user_timeout().unwrap(), Some(USER_TIMEOUT));
    }
}
