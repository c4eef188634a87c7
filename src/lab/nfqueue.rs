//! The netfilter queue (NFQUEUE) netlink protocol, as far as the delay element needs it:
//! binding queues in metadata-only copy mode, reading the id of each queued packet, and
//! releasing every packet up to an id with one batch verdict.
//!
//! Encoding and parsing are pure functions over byte buffers (tested and fuzzed without a
//! socket); [`NfqSocket`] is the thin I/O part. Written here rather than taken from a crate
//! because the delay element needs batch verdicts and must hold only packet ids (8 bytes
//! each), not received message buffers.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `NFNL_SUBSYS_QUEUE`: the queue subsystem's netlink message type prefix.
const SUBSYS_QUEUE: u16 = 3;
const MSG_PACKET: u16 = 0;
const MSG_VERDICT: u16 = 1;
const MSG_CONFIG: u16 = 2;
const MSG_VERDICT_BATCH: u16 = 3;

const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLMSG_HDRLEN: usize = 16;
const NFGENMSG_LEN: usize = 4;

const NFQA_PACKET_HDR: u16 = 1;
const NFQA_VERDICT_HDR: u16 = 2;
const NFQA_CFG_CMD: u16 = 1;
const NFQA_CFG_PARAMS: u16 = 2;
const NFQA_CFG_QUEUE_MAXLEN: u16 = 3;
const NFQA_CFG_MASK: u16 = 4;
const NFQA_CFG_FLAGS: u16 = 5;
const NFQNL_CFG_CMD_BIND: u8 = 1;
const NFQNL_CFG_CMD_UNBIND: u8 = 2;
const NFQNL_COPY_META: u8 = 1;
/// Deliver GSO packets whole instead of segmenting them for user space.
const NFQA_CFG_F_GSO: u32 = 4;
/// Attribute type bits that are flags, not part of the type.
const NLA_TYPE_MASK: u16 = 0x3fff;

/// `NF_ACCEPT`: let the packet continue.
pub const NF_ACCEPT: u32 = 1;
/// `NF_DROP`: discard the packet.
pub const NF_DROP: u32 = 0;

/// What one received netlink message says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A packet was queued.
    Packet {
        /// The queue it is in.
        queue: u16,
        /// Its id (ids rise by one per queued packet).
        id: u32,
    },
    /// The kernel acknowledged a request (`errno` 0) or refused it.
    Ack {
        /// The request's sequence number.
        seq: u32,
        /// 0, or why the kernel refused it.
        errno: i32,
    },
}

/// Builds netlink requests into one buffer, so several go out in one `send`.
#[derive(Default)]
pub struct Requests {
    buf: Vec<u8>,
}

impl Requests {
    /// The encoded bytes of every request added so far.
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Forgets the requests (after they were sent).
    pub fn clear(&mut self) {
        self.buf.clear();
    }

    /// True when nothing was added.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Binds `queue` to this socket (acknowledged with `seq`).
    pub fn bind(&mut self, queue: u16, seq: u32) {
        self.config(queue, seq, |r| {
            r.attr(NFQA_CFG_CMD, &[NFQNL_CFG_CMD_BIND, 0, 0, 0])
        });
    }

    /// Unbinds `queue`: the kernel drops what is still held (acknowledged with `seq`).
    pub fn unbind(&mut self, queue: u16, seq: u32) {
        self.config(queue, seq, |r| {
            r.attr(NFQA_CFG_CMD, &[NFQNL_CFG_CMD_UNBIND, 0, 0, 0])
        });
    }

    /// Metadata-only copies (no payload crosses into user space), at most `max_len` packets
    /// held by the kernel, GSO packets delivered whole.
    pub fn configure(&mut self, queue: u16, max_len: u32, seq: u32) {
        self.config(queue, seq, |r| {
            let mut params = [0u8; 5];
            params[4] = NFQNL_COPY_META;
            r.attr(NFQA_CFG_PARAMS, &params);
            r.attr(NFQA_CFG_QUEUE_MAXLEN, &max_len.to_be_bytes());
            r.attr(NFQA_CFG_MASK, &NFQA_CFG_F_GSO.to_be_bytes());
            r.attr(NFQA_CFG_FLAGS, &NFQA_CFG_F_GSO.to_be_bytes());
        });
    }

    /// Gives `verdict` to every packet of `queue` with an id up to and including `id`.
    pub fn verdict_batch(&mut self, queue: u16, id: u32, verdict: u32) {
        self.verdict_message(MSG_VERDICT_BATCH, queue, id, verdict);
    }

    /// Gives `verdict` to packet `id` of `queue` alone.
    pub fn verdict(&mut self, queue: u16, id: u32, verdict: u32) {
        self.verdict_message(MSG_VERDICT, queue, id, verdict);
    }

    fn verdict_message(&mut self, msg: u16, queue: u16, id: u32, verdict: u32) {
        let start = self.header(msg, NLM_F_REQUEST, 0, queue);
        let mut hdr = [0u8; 8];
        hdr[..4].copy_from_slice(&verdict.to_be_bytes());
        hdr[4..].copy_from_slice(&id.to_be_bytes());
        self.attr(NFQA_VERDICT_HDR, &hdr);
        self.finish(start);
    }

    fn config(&mut self, queue: u16, seq: u32, body: impl FnOnce(&mut Self)) {
        let start = self.header(MSG_CONFIG, NLM_F_REQUEST | NLM_F_ACK, seq, queue);
        body(self);
        self.finish(start);
    }

    fn header(&mut self, msg: u16, flags: u16, seq: u32, queue: u16) -> usize {
        let start = self.buf.len();
        self.buf.extend_from_slice(&0u32.to_ne_bytes()); // length, set by finish
        self.buf
            .extend_from_slice(&((SUBSYS_QUEUE << 8) | msg).to_ne_bytes());
        self.buf.extend_from_slice(&flags.to_ne_bytes());
        self.buf.extend_from_slice(&seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel
        self.buf.extend_from_slice(&[libc::AF_UNSPEC as u8, 0]); // family, NFNETLINK_V0
        self.buf.extend_from_slice(&queue.to_be_bytes());
        start
    }

    fn attr(&mut self, kind: u16, payload: &[u8]) {
        let len = (4 + payload.len()) as u16;
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(payload);
        self.pad();
    }

    fn pad(&mut self) {
        while self.buf.len() % 4 != 0 {
            self.buf.push(0);
        }
    }

    fn finish(&mut self, start: usize) {
        let len = (self.buf.len() - start) as u32;
        self.buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
    }
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn u16_ne(b: &[u8]) -> u16 {
    u16::from_ne_bytes([b[0], b[1]])
}

fn u32_ne(b: &[u8]) -> u32 {
    u32::from_ne_bytes([b[0], b[1], b[2], b[3]])
}

/// Parses one received datagram (possibly several netlink messages) into events, skipping
/// anything else and stopping at the first malformed length.
pub fn parse(datagram: &[u8], out: &mut Vec<Event>) {
    let mut rest = datagram;
    while rest.len() >= NLMSG_HDRLEN {
        let len = u32_ne(&rest[0..4]) as usize;
        if len < NLMSG_HDRLEN || len > rest.len() {
            return;
        }
        let kind = u16_ne(&rest[4..6]);
        let seq = u32_ne(&rest[8..12]);
        let body = &rest[NLMSG_HDRLEN..len];
        if kind == NLMSG_ERROR && body.len() >= 4 {
            let errno = -(u32_ne(&body[0..4]) as i32);
            out.push(Event::Ack { seq, errno });
        } else if kind == (SUBSYS_QUEUE << 8) | MSG_PACKET && body.len() >= NFGENMSG_LEN {
            let queue = u16::from_be_bytes([body[2], body[3]]);
            if let Some(id) = packet_id(&body[NFGENMSG_LEN..]) {
                out.push(Event::Packet { queue, id });
            }
        }
        rest = &rest[align4(len).min(rest.len())..];
    }
}

/// The packet id in a packet message's attributes (`NFQA_PACKET_HDR`).
fn packet_id(mut attrs: &[u8]) -> Option<u32> {
    while attrs.len() >= 4 {
        let len = u16_ne(&attrs[0..2]) as usize;
        if len < 4 || len > attrs.len() {
            return None;
        }
        if u16_ne(&attrs[2..4]) & NLA_TYPE_MASK == NFQA_PACKET_HDR && len >= 8 {
            return Some(u32::from_be_bytes([attrs[4], attrs[5], attrs[6], attrs[7]]));
        }
        attrs = &attrs[align4(len).min(attrs.len())..];
    }
    None
}

/// A netfilter netlink socket: sends [`Requests`] and receives datagrams without blocking.
pub struct NfqSocket {
    fd: OwnedFd,
}

impl NfqSocket {
    /// Opens the socket with a large receive buffer, so bursts of queued packets are not lost
    /// while the element sleeps until the next release.
    pub fn open(receive_buffer: usize) -> io::Result<NfqSocket> {
        // SAFETY: plain socket(2); the result is checked and owned immediately.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                libc::NETLINK_NETFILTER,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh, valid descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let sock = NfqSocket { fd };
        let size = receive_buffer as libc::c_int;
        sock.setsockopt(libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, size)?;
        sock.setsockopt(libc::SOL_NETLINK, libc::NETLINK_NO_ENOBUFS, 1)?;
        // SAFETY: an all-zero sockaddr_nl with the family set binds to a kernel-chosen port.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        // SAFETY: `addr` is a valid sockaddr_nl of the size passed.
        let rc = unsafe {
            libc::bind(
                sock.fd.as_raw_fd(),
                &addr as *const libc::sockaddr_nl as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(sock)
    }

    fn setsockopt(
        &self,
        level: libc::c_int,
        name: libc::c_int,
        value: libc::c_int,
    ) -> io::Result<()> {
        // SAFETY: `value` is a live c_int and its size is passed.
        let rc = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                level,
                name,
                &value as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Sends the requests in one datagram.
    pub fn send(&self, requests: &Requests) -> io::Result<()> {
        if requests.is_empty() {
            return Ok(());
        }
        let bytes = requests.bytes();
        // SAFETY: `bytes` is a live buffer of the length passed.
        let rc = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                bytes.as_ptr() as *const libc::c_void,
                bytes.len(),
                0,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Receives one datagram into `buf`; `Ok(None)` when nothing is waiting.
    pub fn recv<'b>(&self, buf: &'b mut [u8]) -> io::Result<Option<&'b [u8]>> {
        // SAFETY: `buf` is a live, writable buffer of the length passed.
        let rc = unsafe {
            libc::recv(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if rc < 0 {
            let err = io::Error::last_os_error();
            return match err.kind() {
                io::ErrorKind::WouldBlock => Ok(None),
                _ => Err(err),
            };
        }
        Ok(Some(&buf[..rc as usize]))
    }

    /// Sends configuration requests and waits for the kernel to acknowledge every one.
    pub fn request(&self, requests: &Requests, seqs: &[u32]) -> io::Result<()> {
        self.send(requests)?;
        let mut pending: Vec<u32> = seqs.to_vec();
        let mut buf = vec![0u8; 8192];
        let mut events = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while !pending.is_empty() {
            if std::time::Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the kernel did not acknowledge the NFQUEUE configuration",
                ));
            }
            match self.recv(&mut buf)? {
                None => std::thread::sleep(std::time::Duration::from_millis(1)),
                Some(datagram) => {
                    events.clear();
                    parse(datagram, &mut events);
                    for e in &events {
                        if let Event::Ack { seq, errno } = *e {
                            if errno != 0 {
                                return Err(io::Error::from_raw_os_error(errno));
                            }
                            pending.retain(|s| *s != seq);
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

impl AsRawFd for NfqSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A packet message as the kernel builds it: header, nfgenmsg, a mark attribute, then
    /// the packet header attribute.
    fn packet_message(queue: u16, id: u32) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(&((SUBSYS_QUEUE << 8) | MSG_PACKET).to_ne_bytes());
        m.extend_from_slice(&0u16.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(&[2, 0]);
        m.extend_from_slice(&queue.to_be_bytes());
        m.extend_from_slice(&8u16.to_ne_bytes()); // NFQA_MARK
        m.extend_from_slice(&3u16.to_ne_bytes());
        m.extend_from_slice(&7u32.to_be_bytes());
        m.extend_from_slice(&11u16.to_ne_bytes()); // 7-byte packet header, padded
        m.extend_from_slice(&(NFQA_PACKET_HDR | 0x8000).to_ne_bytes());
        m.extend_from_slice(&id.to_be_bytes());
        m.extend_from_slice(&[0x08, 0x00, 3, 0]);
        let len = m.len() as u32;
        m[0..4].copy_from_slice(&len.to_ne_bytes());
        m
    }

    #[test]
    fn parses_several_packets_in_one_datagram() {
        let mut d = packet_message(1, 41);
        d.extend(packet_message(2, 42));
        let mut out = Vec::new();
        parse(&d, &mut out);
        assert_eq!(
            out,
            vec![
                Event::Packet { queue: 1, id: 41 },
                Event::Packet { queue: 2, id: 42 }
            ]
        );
    }

    #[test]
    fn parses_acks_and_refusals() {
        let mut d = Vec::new();
        for (seq, errno) in [(5u32, 0i32), (6, -libc::EPERM)] {
            d.extend_from_slice(&36u32.to_ne_bytes());
            d.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
            d.extend_from_slice(&0u16.to_ne_bytes());
            d.extend_from_slice(&seq.to_ne_bytes());
            d.extend_from_slice(&0u32.to_ne_bytes());
            d.extend_from_slice(&errno.to_ne_bytes());
            d.extend_from_slice(&[0u8; 16]);
        }
        let mut out = Vec::new();
        parse(&d, &mut out);
        assert_eq!(
            out,
            vec![
                Event::Ack { seq: 5, errno: 0 },
                Event::Ack {
                    seq: 6,
                    errno: libc::EPERM
                }
            ]
        );
    }

    #[test]
    fn truncated_or_garbage_input_yields_nothing_and_never_panics() {
        let d = packet_message(1, 9);
        for cut in 0..d.len() {
            let mut out = Vec::new();
            parse(&d[..cut], &mut out);
            assert!(out.is_empty(), "cut at {cut}: {out:?}");
        }
        let mut out = Vec::new();
        parse(&[0xff; 64], &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn verdict_batch_encodes_queue_verdict_and_id() {
        let mut r = Requests::default();
        r.verdict_batch(3, 0x01020304, NF_ACCEPT);
        let b = r.bytes();
        assert_eq!(u32_ne(&b[0..4]) as usize, b.len());
        assert_eq!(b.len(), 16 + 4 + 4 + 8);
        assert_eq!(u16_ne(&b[4..6]), (3 << 8) | 3);
        assert_eq!(&b[18..20], &3u16.to_be_bytes());
        assert_eq!(&b[24..28], &1u32.to_be_bytes());
        assert_eq!(&b[28..32], &[1, 2, 3, 4]);
    }

    #[test]
    fn config_messages_ask_for_an_ack_and_are_padded() {
        let mut r = Requests::default();
        r.bind(1, 10);
        r.configure(1, 4096, 11);
        let b = r.bytes();
        assert_eq!(b.len() % 4, 0);
        let first = u32_ne(&b[0..4]) as usize;
        assert_eq!(u16_ne(&b[6..8]), NLM_F_REQUEST | NLM_F_ACK);
        assert_eq!(u32_ne(&b[first + 8..first + 12]), 11);
    }
}
