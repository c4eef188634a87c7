//! A TCP socket's congestion control read through `sock_diag` (`INET_DIAG_CONG`), the
//! interface `ss -ti` uses. It names a socket by its addresses, so it reaches what has no
//! file descriptor: the subflows of an MPTCP connection, whose congestion control
//! `TCP_CONGESTION` on the connection's socket does not report one by one.

use std::io;
use std::net::{IpAddr, SocketAddr};

use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_REQUEST};
use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6, IPPROTO_TCP};
use netlink_packet_sock_diag::inet::nlas::Nla;
use netlink_packet_sock_diag::inet::{ExtensionFlags, InetRequest, SocketId, StateFlags};
use netlink_packet_sock_diag::SockDiagMessage;
use netlink_sys::protocols::NETLINK_SOCK_DIAG;
use netlink_sys::{Socket, SocketAddr as NetlinkAddr};

/// `INET_DIAG_NOCOOKIE`: the socket is found by its addresses alone.
const NO_COOKIE: [u8; 8] = [0xff; 8];

/// A `sock_diag` netlink socket of this network namespace, for one lookup after another.
pub struct Diag {
    socket: Socket,
    buf: Vec<u8>,
}

impl Diag {
    /// Opens the netlink socket.
    pub fn open() -> io::Result<Diag> {
        let mut socket = Socket::new(NETLINK_SOCK_DIAG)?;
        socket.bind_auto()?;
        socket.connect(&NetlinkAddr::new(0, 0))?;
        Ok(Diag {
            socket,
            buf: vec![0; 16 * 1024],
        })
    }

    /// The congestion control of the TCP socket from `local` to `remote` in this namespace;
    /// `None` when there is none (it closed) or the kernel names none.
    pub fn congestion(
        &mut self,
        local: SocketAddr,
        remote: SocketAddr,
    ) -> io::Result<Option<String>> {
        let family = match local.ip() {
            IpAddr::V4(_) => AF_INET,
            IpAddr::V6(_) => AF_INET6,
        };
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST;
        let mut request = NetlinkMessage::new(
            header,
            SockDiagMessage::InetRequest(InetRequest {
                family,
                protocol: IPPROTO_TCP,
                extensions: ExtensionFlags::CONG,
                states: StateFlags::all(),
                socket_id: SocketId {
                    source_port: local.port(),
                    destination_port: remote.port(),
                    source_address: local.ip(),
                    destination_address: remote.ip(),
                    interface_id: 0,
                    cookie: NO_COOKIE,
                },
            })
            .into(),
        );
        request.finalize();
        let mut out = vec![0; request.buffer_len()];
        request.serialize(&mut out);
        self.socket.send(&out, 0)?;
        let n = self.socket.recv(&mut &mut self.buf[..], 0)?;
        let answer = <NetlinkMessage<SockDiagMessage>>::deserialize(&self.buf[..n])
            .map_err(|e| io::Error::other(format!("sock_diag answer: {e}")))?;
        match answer.payload {
            NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => {
                Ok(r.nlas.into_iter().find_map(|nla| match nla {
                    Nla::Congestion(name) => Some(name),
                    _ => None,
                }))
            }
            NetlinkPayload::Error(e) => match e.code {
                Some(code) if -code.get() == libc::ENOENT => Ok(None),
                Some(code) => Err(io::Error::from_raw_os_error(-code.get())),
                None => Ok(None),
            },
            _ => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn reads_the_congestion_control_of_a_socket_by_its_addresses() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_accepted, _) = l.accept().unwrap();
        super::super::cc::set_congestion(&c, "reno").unwrap();
        let mut diag = Diag::open().unwrap();
        let (local, remote) = (c.local_addr().unwrap(), c.peer_addr().unwrap());
        assert_eq!(
            diag.congestion(local, remote).unwrap().as_deref(),
            Some("reno")
        );
        super::super::cc::set_congestion(&c, "cubic").unwrap();
        assert_eq!(
            diag.congestion(local, remote).unwrap().as_deref(),
            Some("cubic")
        );
        // The reverse direction is the accepted socket, which kept the default.
        assert!(diag.congestion(remote, local).unwrap().is_some());
        drop(c);
        let gone: SocketAddr = "127.0.0.1:9".parse().unwrap();
        assert_eq!(diag.congestion(gone, remote).unwrap(), None);
    }
}
