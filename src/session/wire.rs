//! Async reading and writing of the sans-IO codecs over tokio streams.

use std::io;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::channels::control::{self, Message};
use crate::channels::frame::{BlockHeader, HEADER_LEN};
use crate::error::{Error, Result};

fn closed(e: io::Error) -> Error {
    match e.kind() {
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionAborted => Error::PeerVanished,
        _ => Error::io("network")(e),
    }
}

/// Reads control messages from a stream.
pub struct ControlReader<R> {
    inner: R,
    buf: BytesMut,
}

impl<R: AsyncRead + Unpin> ControlReader<R> {
    /// Wraps a read half.
    pub fn new(inner: R) -> Self {
        ControlReader {
            inner,
            buf: BytesMut::with_capacity(64 << 10),
        }
    }

    /// The next message; `Ok(None)` on a clean close between messages.
    pub async fn recv(&mut self) -> Result<Option<Message>> {
        loop {
            match control::decode(&self.buf) {
                Ok(Some((m, used))) => {
                    self.buf.advance(used);
                    return Ok(Some(m));
                }
                Ok(None) => {}
                Err(e) => return Err(Error::Malformed(e.to_string())),
            }
            if self.inner.read_buf(&mut self.buf).await.map_err(closed)? == 0 {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(Error::PeerVanished)
                };
            }
        }
    }

    /// The next message, treating a close as the peer vanishing.
    pub async fn expect(&mut self) -> Result<Message> {
        self.recv().await?.ok_or(Error::PeerVanished)
    }
}

/// Writes control messages to a stream.
pub struct ControlWriter<W> {
    inner: W,
}

impl<W: AsyncWrite + Unpin> ControlWriter<W> {
    /// Wraps a write half.
    pub fn new(inner: W) -> Self {
        ControlWriter { inner }
    }

    /// Sends one message.
    pub async fn send(&mut self, m: &Message) -> Result<()> {
        self.inner
            .write_all(&control::encode(m))
            .await
            .map_err(closed)
    }

    /// Sends an abort notice, ignoring failures (the peer may already be gone).
    pub async fn abort(&mut self, err: &Error) {
        let m = Message::Abort {
            message: err.to_string(),
        };
        let _ = self.send(&m).await;
    }
}

/// Reads the next block header; `Ok(None)` when the sender closed the channel cleanly.
pub async fn read_header<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<BlockHeader>> {
    let mut b = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        let n = r.read(&mut b[got..]).await.map_err(closed)?;
        if n == 0 {
            return if got == 0 {
                Ok(None)
            } else {
                Err(Error::PeerVanished)
            };
        }
        got += n;
    }
    BlockHeader::decode(&b)
        .map(Some)
        .map_err(|e| Error::Malformed(e.to_string()))
}

/// Reads exactly `len` payload bytes (without zero-filling the buffer first).
pub async fn read_payload<R: AsyncRead + Unpin>(r: &mut R, len: u32) -> Result<BytesMut> {
    let len = len as usize;
    let mut buf = BytesMut::with_capacity(len);
    while buf.len() < len {
        let mut limited = (&mut *r).take((len - buf.len()) as u64);
        if limited.read_buf(&mut buf).await.map_err(closed)? == 0 {
            return Err(Error::PeerVanished);
        }
    }
    Ok(buf)
}

/// Writes a block frame (header and payload in one vectored write where possible).
pub async fn write_block<W: AsyncWrite + Unpin>(
    w: &mut W,
    header: &BlockHeader,
    payload: &[u8],
) -> Result<()> {
    let h = header.encode();
    let mut chain = Buf::chain(&h[..], payload);
    w.write_all_buf(&mut chain).await.map_err(closed)
}
