//! Socket buffer sizes: `SO_SNDBUF`/`SO_RCVBUF` set and read back. The kernel doubles a
//! request (half of the space is bookkeeping) and clamps it at twice `net.core.[rw]mem_max`;
//! setting a size also turns off the kernel's autotuning for that direction.

use std::io;
use std::os::fd::AsFd;

use socket2::SockRef;

/// Send and receive buffer sizes as the kernel reports them (after doubling and clamping).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct GrantedBuffers {
    /// `SO_SNDBUF` read back, bytes.
    pub send: u64,
    /// `SO_RCVBUF` read back, bytes.
    pub receive: u64,
}

/// Requests a send buffer of `bytes` (the value passed to `SO_SNDBUF`).
pub fn set_send_buffer(sock: &impl AsFd, bytes: u64) -> io::Result<()> {
    SockRef::from(sock).set_send_buffer_size(clamp_request(bytes))
}

/// Requests a receive buffer of `bytes` (the value passed to `SO_RCVBUF`).
pub fn set_recv_buffer(sock: &impl AsFd, bytes: u64) -> io::Result<()> {
    SockRef::from(sock).set_recv_buffer_size(clamp_request(bytes))
}

/// Reads both buffer sizes back.
pub fn granted(sock: &impl AsFd) -> io::Result<GrantedBuffers> {
    let s = SockRef::from(sock);
    Ok(GrantedBuffers {
        send: s.send_buffer_size()? as u64,
        receive: s.recv_buffer_size()? as u64,
    })
}

/// The socket option is an int: larger requests are clamped by the kernel anyway.
fn clamp_request(bytes: u64) -> usize {
    bytes.min(i32::MAX as u64 / 2) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_doubles_a_small_request() {
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        set_send_buffer(&sock, 100_000).unwrap();
        set_recv_buffer(&sock, 200_000).unwrap();
        let g = granted(&sock).unwrap();
        assert_eq!(g.send, 200_000);
        assert_eq!(g.receive, 400_000);
    }
}
