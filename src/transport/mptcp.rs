//! Multipath TCP (`IPPROTO_MPTCP`): whether a connection really runs MPTCP and with how many
//! subflows, and the kernel path manager's settings that give a connection more subflows.
//! A server listening with MPTCP also accepts plain TCP clients, and an MPTCP client falls
//! back to TCP when the server or a middlebox does not speak it; only `MPTCP_INFO` tells
//! which happened. The path manager is set with iproute2's `ip mptcp`, as root: its limits,
//! a server's announced ports and a client's addresses on several paths.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd};

use super::ip_mptcp::ip;
pub use super::mptcp_limits::{Limits, LimitsSet};
use super::tcp_info::sample_of;
use crate::channels::telemetry::TcpSample;

/// `SOL_MPTCP` (linux/socket.h).
const SOL_MPTCP: libc::c_int = 284;
/// `MPTCP_INFO` (linux/mptcp.h).
const MPTCP_INFO: libc::c_int = 1;
/// `MPTCP_TCPINFO`: a `struct tcp_info` per subflow.
const MPTCP_TCPINFO: libc::c_int = 2;
/// `MPTCP_SUBFLOW_ADDRS`: a `struct mptcp_subflow_addrs` per subflow.
const MPTCP_SUBFLOW_ADDRS: libc::c_int = 3;
/// Most subflows read: the userspace path manager's 32 extra ones and the first, with room.
const MAX_SUBFLOWS_READ: usize = 64;
/// `TCP_ESTABLISHED` (`tcpi_state`).
const TCP_ESTABLISHED: u8 = 1;
/// `TCP_SYN_SENT`, `TCP_SYN_RECV` (`tcpi_state`): a subflow being opened.
const TCP_SYN_SENT: u8 = 2;
const TCP_SYN_RECV: u8 = 3;
/// `TCP_SYN_SENT`, `TCP_SYN_RECV`, `TCP_CLOSE`: a subflow that carries nothing yet or any more.
const OPENING_OR_CLOSED: [u8; 3] = [TCP_SYN_SENT, TCP_SYN_RECV, 7];
/// `SO_MAX_PACING_RATE` at or above this caps nothing: `~0` from user space, and the
/// largest value [`super::subflow_pacing`] sets (its helper takes 32 bits).
const UNCAPPED_FROM: u64 = 0xffff_fffe;

/// The number of established subflows of the MPTCP connection on `sock` (the first one
/// included), or `None` when the connection runs as plain TCP: a TCP socket, or an MPTCP
/// socket that fell back (the kernel then refuses `MPTCP_INFO`).
pub fn subflows(sock: &impl AsFd) -> Option<u16> {
    subflow_counts(sock).map(|c| c.established)
}

/// An MPTCP connection's subflows, established and still being opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SubflowCounts {
    /// Established, the first one included.
    pub established: u16,
    /// Still being opened: their SYN or SYN-ACK not answered yet.
    pub opening: u16,
}

/// The subflows of the MPTCP connection on `sock`, or `None` when it runs as plain TCP (as
/// for [`subflows`]). The path manager's own count (`MPTCP_INFO`) also counts subflows still
/// being opened, and with the userspace manager ones the peer then refused; it is the answer
/// (all established) only where the subflows cannot be read.
pub fn subflow_counts(sock: &impl AsFd) -> Option<SubflowCounts> {
    // The head of struct mptcp_info: its first byte counts the subflows beyond the first.
    let counted = mptcp_info(sock).map(|info| 1 + info[0] as u16)?;
    let counts = subflow_array::<libc::tcp_info>(sock, MPTCP_TCPINFO).map_or(
        SubflowCounts {
            established: counted,
            opening: 0,
        },
        |infos| {
            let in_state = |states: &[u8]| {
                infos
                    .iter()
                    .filter(|t| states.contains(&t.tcpi_state))
                    .count()
            };
            SubflowCounts {
                established: in_state(&[TCP_ESTABLISHED]) as u16,
                opening: in_state(&[TCP_SYN_SENT, TCP_SYN_RECV]) as u16,
            }
        },
    );
    Some(counts)
}

/// The token of the MPTCP connection on `sock` (what the kernel and the peer name it by),
/// or `None` when it runs as plain TCP.
pub fn token(sock: &impl AsFd) -> Option<u32> {
    // struct mptcp_info: six u8 counters, then u32 flags at 8 and u32 token at 12.
    mptcp_info(sock).map(|info| u32::from_ne_bytes([info[12], info[13], info[14], info[15]]))
}

/// The head of `struct mptcp_info`, or `None` for TCP and fallen-back sockets.
fn mptcp_info(sock: &impl AsFd) -> Option<[u8; 96]> {
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
    (rc == 0 && len >= 16).then_some(info)
}

/// Whether `sock` is an MPTCP socket (`SO_PROTOCOL` is `IPPROTO_MPTCP`), fallen back or not.
/// Such a socket refuses `SO_MAX_PACING_RATE`: [`super::subflow_pacing`] caps its subflows.
pub fn is_mptcp(sock: &impl AsFd) -> bool {
    socket2::SockRef::from(sock).protocol().ok().flatten() == Some(socket2::Protocol::MPTCP)
}

/// One subflow of an MPTCP connection, as the kernel sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Subflow {
    /// This end's address and port.
    pub local: SocketAddr,
    /// The peer's address and port.
    pub remote: SocketAddr,
    /// Its `TCP_INFO`.
    pub tcp: TcpSample,
    /// Its pacing cap (`SO_MAX_PACING_RATE`), bytes/s; `None` when uncapped.
    pub max_pacing_rate: Option<u64>,
    /// Whether it is connected: not still opening (or refused by the peer) or closed.
    pub connected: bool,
}

/// The subflows of the MPTCP connection on `sock`, in the kernel's order (the first
/// subflow first, the others as they joined); an error on a TCP socket and, on kernels that
/// refuse it, on a connection that fell back to TCP.
pub fn subflow_info(sock: &impl AsFd) -> io::Result<Vec<Subflow>> {
    let infos: Vec<libc::tcp_info> = subflow_array(sock, MPTCP_TCPINFO)?;
    let addrs: Vec<[u8; 256]> = subflow_array(sock, MPTCP_SUBFLOW_ADDRS)?;
    // A subflow that joined or closed between the two reads: the caller reads again later.
    if infos.len() != addrs.len() {
        return Err(io::Error::new(
            io::ErrorKind::Interrupted,
            "the subflows changed while they were read",
        ));
    }
    infos
        .iter()
        .zip(&addrs)
        .map(|(ti, a)| {
            let bad = || io::Error::other("a subflow address of an unknown family");
            Ok(Subflow {
                local: sockaddr(&a[..128]).ok_or_else(bad)?,
                remote: sockaddr(&a[128..]).ok_or_else(bad)?,
                tcp: sample_of(ti),
                max_pacing_rate: Some(ti.tcpi_max_pacing_rate).filter(|r| *r < UNCAPPED_FROM),
                connected: !OPENING_OR_CLOSED.contains(&ti.tcpi_state),
            })
        })
        .collect()
}

/// Reads one of the per-subflow arrays of `SOL_MPTCP`: a `struct mptcp_subflow_data` header
/// (what size of element user space wants, how many subflows there are), then the elements.
/// `T` must be plain old data, valid for any bytes (the kernel copies at most its own size of
/// each and leaves the rest zero).
fn subflow_array<T: Copy>(sock: &impl AsFd, optname: libc::c_int) -> io::Result<Vec<T>> {
    const HEADER: usize = 16;
    let elem = std::mem::size_of::<T>();
    // u64 words: the header is 8-byte aligned.
    let mut buf = vec![0u64; (HEADER + MAX_SUBFLOWS_READ * elem).div_ceil(8)];
    let words: [u32; 4] = [HEADER as u32, 0, 0, elem as u32];
    // SAFETY: the buffer holds at least 16 bytes; u32s written at 4-byte offsets of u64s.
    unsafe { std::ptr::copy_nonoverlapping(words.as_ptr(), buf.as_mut_ptr() as *mut u32, 4) };
    let mut len = (buf.len() * 8) as libc::socklen_t;
    // SAFETY: pointer and length of a live, writable buffer.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_fd().as_raw_fd(),
            SOL_MPTCP,
            optname,
            buf.as_mut_ptr() as *mut libc::c_void,
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let bytes = buf.as_ptr() as *const u8;
    // SAFETY: the header's second word, within the buffer.
    let num = unsafe { std::ptr::read_unaligned(bytes.add(4) as *const u32) } as usize;
    let fits = (len as usize).saturating_sub(HEADER) / elem.max(1);
    Ok((0..num.min(fits).min(MAX_SUBFLOWS_READ))
        // SAFETY: element k lies within the `len` bytes the kernel filled, and T is plain
        // old data.
        .map(|k| unsafe { std::ptr::read_unaligned(bytes.add(HEADER + k * elem) as *const T) })
        .collect())
}

/// A `struct sockaddr_in` or `sockaddr_in6` in its first bytes.
fn sockaddr(b: &[u8]) -> Option<SocketAddr> {
    let family = u16::from_ne_bytes([b[0], b[1]]) as libc::c_int;
    let port = u16::from_be_bytes([b[2], b[3]]);
    match family {
        libc::AF_INET => {
            let ip = Ipv4Addr::new(b[4], b[5], b[6], b[7]);
            Some(SocketAddr::new(IpAddr::V4(ip), port))
        }
        libc::AF_INET6 => {
            let ip: [u8; 16] = b[8..24].try_into().ok()?;
            let scope = u32::from_ne_bytes(b[24..28].try_into().ok()?);
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(ip),
                port,
                0,
                scope,
            )))
        }
        _ => None,
    }
}

/// The most extra subflows the in-kernel path manager gives one connection.
pub const MAX_EXTRA_SUBFLOWS: u16 = 8;

/// `signal` endpoints on the ports after a server's own: the in-kernel path manager
/// announces them to every MPTCP client, listens on them, and each client that accepts
/// announcements opens a subflow to each. Removed, and the limits put back, when dropped.
#[derive(Debug)]
pub struct SignalEndpoints {
    _added: Added,
    _limits: LimitsSet,
}

impl SignalEndpoints {
    /// Adds `count` endpoints on `addr`, ports `port + 1 ..= port + count` (root only).
    pub fn add(addr: IpAddr, port: u16, count: u16) -> io::Result<SignalEndpoints> {
        super::mptcp_pm::forget_killed_selections()?;
        let limits = LimitsSet::to(Limits {
            subflows: count as u32,
            add_addr_accepted: 0,
        })?;
        let mut added = Added(Vec::new());
        let a = addr.to_string();
        for p in (1..=count).map(|k| port as u32 + k as u32) {
            if p > u16::MAX as u32 {
                return Err(io::Error::other(format!("no port {p} after {port}")));
            }
            let p = p.to_string();
            // One left by a server that was killed is taken over.
            if endpoint_id(&a, Some(&p))?.is_none() {
                ip(&["endpoint", "add", &a, "port", &p, "signal"])?;
            }
            let id = endpoint_id(&a, Some(&p))?
                .ok_or_else(|| io::Error::other(format!("endpoint {a} port {p} not listed")))?;
            added.0.push(id);
        }
        Ok(SignalEndpoints {
            _added: added,
            _limits: limits,
        })
    }
}

/// `subflow fullmesh` endpoints on a client's addresses, one per path (the first path's
/// address included): the in-kernel path manager then opens a subflow from each address to
/// the server, and one from each to every port the server announces, so each path carries
/// the connection's subflows. Endpoints belong to the network namespace, so other MPTCP
/// connections of this host use them meanwhile. Those this added are removed when dropped;
/// one that was there before is used as it is and kept.
#[derive(Debug)]
pub struct PathEndpoints {
    _added: Added,
}

impl PathEndpoints {
    /// Adds an endpoint for each `(address, interface)` that has none (root only).
    pub fn add(paths: &[(IpAddr, &str)]) -> io::Result<PathEndpoints> {
        let mut added = Added(Vec::new());
        for (addr, dev) in paths {
            let a = addr.to_string();
            if endpoint_id(&a, None)?.is_some() {
                continue;
            }
            ip(&["endpoint", "add", &a, "dev", dev, "subflow", "fullmesh"])?;
            let id = endpoint_id(&a, None)?
                .ok_or_else(|| io::Error::other(format!("endpoint {a} not listed")))?;
            added.0.push(id);
        }
        Ok(PathEndpoints { _added: added })
    }
}

/// The ids of endpoints this process added, deleted when dropped.
#[derive(Debug)]
struct Added(Vec<String>);

impl Drop for Added {
    fn drop(&mut self) {
        for id in &self.0 {
            let _ = ip(&["endpoint", "delete", "id", id]);
        }
    }
}

/// The id of the endpoint on `addr` and `port` (none: an endpoint without a port), if there
/// is one (`ip mptcp endpoint show` lists "ADDR port P id N signal" and "ADDR id N subflow").
fn endpoint_id(addr: &str, port: Option<&str>) -> io::Result<Option<String>> {
    let shown = ip(&["endpoint", "show"])?;
    Ok(endpoint_id_in(&shown, addr, port))
}

/// [`endpoint_id`] in the text `ip mptcp endpoint show` printed.
fn endpoint_id_in(shown: &str, addr: &str, port: Option<&str>) -> Option<String> {
    shown.lines().find_map(|line| {
        let w: Vec<&str> = line.split_whitespace().collect();
        let on_port = match port {
            Some(p) => w.get(1) == Some(&"port") && w.get(2) == Some(&p),
            None => w.get(1) != Some(&"port"),
        };
        let at = w.iter().position(|x| *x == "id")?;
        (w.first() == Some(&addr) && on_port)
            .then(|| w.get(at + 1).map(|id| id.to_string()))
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    /// An `IPPROTO_MPTCP` socket; an error when MPTCP is off here (`net.mptcp.enabled`).
    fn mptcp_socket() -> io::Result<socket2::Socket> {
        socket2::Socket::new(
            socket2::Domain::IPV4,
            socket2::Type::STREAM,
            Some(socket2::Protocol::MPTCP),
        )
    }

    #[test]
    fn tcp_has_no_subflows_and_mptcp_has_one() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        assert_eq!(subflows(&c), None);
        assert!(!is_mptcp(&c));
        let addr = l.local_addr().unwrap();
        drop(l);
        let l = mptcp_socket().expect("MPTCP is off here (sysctl net.mptcp.enabled)");
        l.bind(&addr.into()).unwrap();
        l.listen(4).unwrap();
        let m = mptcp_socket().unwrap();
        m.connect(&addr.into()).unwrap();
        let (accepted, _) = l.accept().unwrap();
        assert_eq!(subflows(&m), Some(1));
        assert_eq!(subflows(&accepted), Some(1));
        assert!(is_mptcp(&m) && is_mptcp(&accepted));
        let sf = subflow_info(&m).unwrap();
        assert_eq!(sf.len(), 1, "{sf:?}");
        assert_eq!(sf[0].local, m.local_addr().unwrap().as_socket().unwrap());
        assert_eq!(sf[0].remote, addr);
        assert!(
            sf[0].tcp.mss > 0 && sf[0].max_pacing_rate.is_none(),
            "{sf:?}"
        );
        assert!(subflow_info(&c).is_err());
        // The subflow has no descriptor; sock_diag finds it by its addresses, and it runs
        // the congestion control set on the connection's socket.
        super::super::cc::set_congestion(&m, "reno").unwrap();
        let mut diag = super::super::sock_diag::Diag::open().unwrap();
        let cc = diag.congestion(sf[0].local, sf[0].remote).unwrap();
        assert_eq!(cc.as_deref(), Some("reno"));
        // Each end names the connection by a token of its own (from its own key).
        assert!(token(&m).is_some_and(|t| t != 0) && token(&accepted).is_some_and(|t| t != 0));
        assert_eq!(token(&c), None);
        // A plain TCP client of an MPTCP listener: the accepted socket falls back.
        let t = TcpStream::connect(addr).unwrap();
        let (fallback, _) = l.accept().unwrap();
        assert_eq!(subflows(&fallback), None);
        drop(t);
    }

    #[test]
    fn finds_an_endpoint_by_address_and_port() {
        let shown = "10.9.2.2 port 7701 id 1 signal \n10.9.3.1 id 2 subflow fullmesh dev sb \n";
        assert_eq!(
            endpoint_id_in(shown, "10.9.2.2", Some("7701")).as_deref(),
            Some("1")
        );
        assert_eq!(endpoint_id_in(shown, "10.9.2.2", Some("7702")), None);
        assert_eq!(endpoint_id_in(shown, "10.9.2.2", None), None);
        assert_eq!(
            endpoint_id_in(shown, "10.9.3.1", None).as_deref(),
            Some("2")
        );
        assert_eq!(endpoint_id_in(shown, "10.9.3.1", Some("7701")), None);
    }
}
