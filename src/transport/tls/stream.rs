//! One connection of a session, in TLS or in clear text: what everything above the transport
//! reads and writes. It still gives the TCP socket ([`Stream::tcp`], [`AsFd`]) for socket
//! options and `TCP_INFO`.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, BufReader, ReadBuf, ReadHalf, WriteHalf};
use tokio::net::TcpStream;

use crate::channels::auth::SERVER_HELLO_LEN;
use crate::channels::preface::{EXPORTER_LABEL, NO_BINDING};

/// A TCP stream that keeps a copy of the first bytes it reads: when a TLS handshake fails
/// because the server answered in clear text (a busy answer, an older hsxfer), the client can
/// still say what the server said.
pub(super) struct Tap {
    inner: TcpStream,
    first: Vec<u8>,
}

impl Tap {
    pub(super) fn new(inner: TcpStream) -> Self {
        Tap {
            inner,
            first: Vec::new(),
        }
    }

    /// Up to a server hello's length of the first bytes read.
    pub(super) fn first_bytes(&self) -> &[u8] {
        &self.first
    }
}

impl AsyncRead for Tap {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if self.first.len() < SERVER_HELLO_LEN {
            let room = SERVER_HELLO_LEN - self.first.len();
            let new = &buf.filled()[before..];
            let keep = &new[..new.len().min(room)];
            self.first.extend_from_slice(keep);
        }
        r
    }
}

/// Implements `AsyncWrite` for a type by passing every call to its `inner` field.
macro_rules! write_through_inner {
    ($t:ty) => {
        impl AsyncWrite for $t {
            fn poll_write(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                Pin::new(&mut self.inner).poll_write(cx, buf)
            }

            fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                Pin::new(&mut self.inner).poll_flush(cx)
            }

            fn poll_shutdown(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<io::Result<()>> {
                Pin::new(&mut self.inner).poll_shutdown(cx)
            }
        }
    };
}

write_through_inner!(Tap);

/// How many bytes a TLS connection reads from its socket at once. rustls alone reads at
/// most one record (16 KiB, often 4 KiB) per call, so a socket read under it costs a system
/// call per few KiB. Reading through a buffer of 64 KiB took encrypted loopback benches from
/// 0.54 to 0.58 of clear text (docs/benchmarks.md); 256 KiB did no better, and with 50
/// clients at once raised the server's peak memory from 44 to 129 MiB.
pub(super) const READ_AHEAD: usize = 64 << 10;

/// The TCP stream under a client's TLS: read through a [`READ_AHEAD`] buffer, tapped.
pub(super) type ClientIo = BufReader<Tap>;
/// The TCP stream under a server's TLS: read through a [`READ_AHEAD`] buffer.
pub(super) type ServerIo = BufReader<TcpStream>;

/// A connection of a session: clear text ([`Stream::clear`]), or TLS from
/// [`super::ClientTls::connect`] or [`super::ServerTls::accept`].
pub struct Stream(Inner);

enum Inner {
    Clear(TcpStream),
    Client(Box<tokio_rustls::client::TlsStream<ClientIo>>),
    Server(Box<tokio_rustls::server::TlsStream<ServerIo>>),
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("socket", self.tcp())
            .field("cipher_suite", &self.cipher_suite())
            .finish()
    }
}

impl Stream {
    /// A clear-text connection (`--no-encrypt`).
    pub fn clear(tcp: TcpStream) -> Self {
        Stream(Inner::Clear(tcp))
    }

    pub(super) fn client(s: tokio_rustls::client::TlsStream<ClientIo>) -> Self {
        Stream(Inner::Client(Box::new(s)))
    }

    pub(super) fn server(s: tokio_rustls::server::TlsStream<ServerIo>) -> Self {
        Stream(Inner::Server(Box::new(s)))
    }

    /// The TCP socket under it.
    pub fn tcp(&self) -> &TcpStream {
        match &self.0 {
            Inner::Clear(s) => s,
            Inner::Client(t) => &t.get_ref().0.get_ref().inner,
            Inner::Server(t) => t.get_ref().0.get_ref(),
        }
    }

    /// The negotiated TLS cipher suite (`TLS13_AES_128_GCM_SHA256`, say); `None` in clear
    /// text.
    pub fn cipher_suite(&self) -> Option<String> {
        let suite = match &self.0 {
            Inner::Clear(_) => None,
            Inner::Client(t) => t.get_ref().1.negotiated_cipher_suite(),
            Inner::Server(t) => t.get_ref().1.negotiated_cipher_suite(),
        };
        suite.map(|s| format!("{:?}", s.suite()))
    }

    /// The connection's TLS exporter value, which the handshake's MACs cover
    /// ([`crate::channels::preface`]); all zeros in clear text.
    pub fn binding(&self) -> [u8; 32] {
        let out = [0u8; 32];
        let exported = match &self.0 {
            Inner::Clear(_) => return NO_BINDING,
            Inner::Client(t) => t
                .get_ref()
                .1
                .export_keying_material(out, EXPORTER_LABEL, None),
            Inner::Server(t) => t
                .get_ref()
                .1
                .export_keying_material(out, EXPORTER_LABEL, None),
        };
        exported.expect("a finished TLS 1.3 handshake has an exporter")
    }

    /// Splits into a read and a write half, each still showing the socket.
    pub fn into_split(self) -> (ReadPart, WritePart) {
        let fd = self.as_fd().as_raw_fd();
        let (r, w) = tokio::io::split(self);
        (ReadPart { inner: r, fd }, WritePart { inner: w, fd })
    }
}

impl AsFd for Stream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.tcp().as_fd()
    }
}

macro_rules! each {
    ($s:expr, $v:ident => $e:expr) => {
        match &mut $s.get_mut().0 {
            Inner::Clear($v) => {
                let $v = Pin::new($v);
                $e
            }
            Inner::Client($v) => {
                let $v = Pin::new($v.as_mut());
                $e
            }
            Inner::Server($v) => {
                let $v = Pin::new($v.as_mut());
                $e
            }
        }
    };
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        each!(self, s => s.poll_read(cx, buf))
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        each!(self, s => s.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        each!(self, s => s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match &self.0 {
            Inner::Clear(s) => s.is_write_vectored(),
            Inner::Client(t) => t.is_write_vectored(),
            Inner::Server(t) => t.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, s => s.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, s => s.poll_shutdown(cx))
    }
}

/// The read half of a [`Stream`].
pub struct ReadPart {
    inner: ReadHalf<Stream>,
    /// The socket's descriptor, open as long as either half lives.
    fd: RawFd,
}

/// The write half of a [`Stream`].
pub struct WritePart {
    inner: WriteHalf<Stream>,
    /// The socket's descriptor, open as long as either half lives.
    fd: RawFd,
}

impl AsFd for ReadPart {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the stream this half shares owns the descriptor and lives as long as `self`.
        unsafe { BorrowedFd::borrow_raw(self.fd) }
    }
}

impl AsFd for WritePart {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: as for ReadPart.
        unsafe { BorrowedFd::borrow_raw(self.fd) }
    }
}

impl AsyncRead for ReadPart {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

write_through_inner!(WritePart);
