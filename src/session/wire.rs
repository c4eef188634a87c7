//! Async reading and writing of the sans-IO codecs over tokio streams.

use std::io;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::idle::SESSION_IDLE;
use crate::channels::auth::SessionKey;
use crate::channels::control::{FrameSeal, Message, Way};
use crate::channels::frame::{BlockCheck, BlockHeader, DigestKey, HEADER_LEN, PIECE, TRAILER_LEN};
use crate::channels::Digest;
use crate::error::{Error, Result};
use crate::fsio::root::Scope;
use crate::transport::tls::{ReadPart, Stream, WritePart};

/// How long an end that aborted a session before any data moved waits for the peer to close
/// the control connection.
const ABORT_LINGER: Duration = Duration::from_secs(5);

/// What a control connection's writer says when its peer read nothing of it for
/// [`SESSION_IDLE`].
const CONTROL_UNREAD: &str =
    "sending on the control connection: the peer read nothing of it for 10 minutes (run the \
     same command again to resume)";

/// How long a client waits for the server's answer to a question before the data moves: as
/// long as a server waits for the client's request.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

fn closed(e: io::Error) -> Error {
    match e.kind() {
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionAborted => Error::PeerVanished,
        _ => Error::io("network")(e),
    }
}

/// The two halves of an authenticated control connection, each checking or sealing its
/// direction's frames with the session key ([`crate::channels::control::FrameSeal`]).
pub fn control_pair(
    stream: Stream,
    key: &SessionKey,
    we_are: Side,
) -> (ControlReader<ReadPart>, ControlWriter<WritePart>) {
    let (incoming, outgoing) = match we_are {
        Side::Client => (Way::ToClient, Way::ToServer),
        Side::Server => (Way::ToServer, Way::ToClient),
    };
    let (r, w) = stream.into_split();
    (
        ControlReader::new(r, key.control_seal(incoming)),
        ControlWriter::new(w, key.control_seal(outgoing)),
    )
}

/// Which end of a control connection this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The end that connected.
    Client,
    /// The end that accepted.
    Server,
}

/// Reads control messages from a stream.
pub struct ControlReader<R> {
    inner: R,
    buf: BytesMut,
    seal: FrameSeal,
}

impl<R: AsyncRead + Unpin> ControlReader<R> {
    /// Wraps a read half whose frames `seal` checks.
    pub fn new(inner: R, seal: FrameSeal) -> Self {
        ControlReader {
            inner,
            buf: BytesMut::with_capacity(64 << 10),
            seal,
        }
    }

    /// The read half.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// The next message; `Ok(None)` on a clean close between messages.
    pub async fn recv(&mut self) -> Result<Option<Message>> {
        loop {
            if let Some(m) = self.buffered()? {
                return Ok(Some(m));
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

    /// The next message if it has already been read whole, without waiting for more.
    pub fn buffered(&mut self) -> Result<Option<Message>> {
        match self.seal.open(&self.buf) {
            Ok(Some((m, used))) => {
                self.buf.advance(used);
                Ok(Some(m))
            }
            Ok(None) => Ok(None),
            Err(e) => Err(Error::Malformed(e.to_string())),
        }
    }

    /// The next message, treating a close as the peer vanishing.
    pub async fn expect(&mut self) -> Result<Message> {
        self.recv().await?.ok_or(Error::PeerVanished)
    }

    /// [`Self::expect`] within [`ANSWER_TIMEOUT`]: the answer to a question (a ping, a facts
    /// question), which a server that went silent would leave waiting for good.
    pub async fn answer(&mut self, waiting_for: &'static str) -> Result<Message> {
        tokio::time::timeout(ANSWER_TIMEOUT, self.expect())
            .await
            .map_err(|_| Error::Timeout(waiting_for))?
    }

    /// After sending an abort: waits (a few seconds at most) until the peer closes the
    /// connection, discarding what it sends. The caller keeps its data channels open
    /// meanwhile, so the peer reads the abort before it sees them close, which it would take
    /// for a vanished peer.
    pub async fn linger_until_closed(&mut self) {
        let drain = async { while let Ok(Some(_)) = self.recv().await {} };
        let _ = tokio::time::timeout(ABORT_LINGER, drain).await;
    }
}

/// Writes control messages to a stream.
pub struct ControlWriter<W> {
    inner: W,
    /// A server's root, hidden from the abort messages it sends.
    hide: Option<Scope>,
    seal: FrameSeal,
    /// Frames queued and not yet written.
    queued: Vec<u8>,
    /// When a flush last wrote everything queued.
    written_at: tokio::time::Instant,
}

impl<W: AsyncWrite + Unpin> ControlWriter<W> {
    /// Wraps a write half whose frames `seal` authenticates.
    pub fn new(inner: W, seal: FrameSeal) -> Self {
        ControlWriter {
            inner,
            hide: None,
            seal,
            queued: Vec::new(),
            written_at: tokio::time::Instant::now(),
        }
    }

    /// When everything queued was last written (or this writer was made).
    pub fn written_at(&self) -> tokio::time::Instant {
        self.written_at
    }

    /// Names paths in abort messages relative to `scope`'s root: a server tells a client
    /// what went wrong, never where its root is.
    pub fn hiding(mut self, scope: Scope) -> Self {
        self.hide = Some(scope);
        self
    }

    /// Sends one message.
    pub async fn send(&mut self, m: &Message) -> Result<()> {
        self.queue(m);
        self.flush().await
    }

    /// Queues one message until [`Self::flush`]: messages queued together leave in one
    /// write (and, inside TLS, one record). A sender of many small files has a seal and a
    /// receiver a done notice per file, and a write each was a system call per file.
    pub fn queue(&mut self, m: &Message) {
        self.queued.extend_from_slice(&self.seal.seal(m));
    }

    /// Sends what [`Self::queue`] left waiting, within [`SESSION_IDLE`]: a peer that reads
    /// nothing of its control connection would otherwise hold this end in the write for good.
    pub async fn flush(&mut self) -> Result<()> {
        let write = async {
            if !self.queued.is_empty() {
                self.inner.write_all(&self.queued).await.map_err(closed)?;
                self.queued.clear();
            }
            // Inside TLS the last record waits in the session until flushed.
            self.inner.flush().await.map_err(closed)
        };
        tokio::time::timeout(SESSION_IDLE, write)
            .await
            .map_err(|_| Error::Timeout(CONTROL_UNREAD))??;
        self.written_at = tokio::time::Instant::now();
        Ok(())
    }

    /// Sends an abort notice, ignoring failures (the peer may already be gone).
    pub async fn abort(&mut self, err: &Error) {
        let message = err.to_string();
        let message = match &self.hide {
            Some(scope) => scope.hide_root(&message),
            None => message,
        };
        let m = Message::Abort {
            message,
            transient: err.is_transient(),
        };
        let _ = tokio::time::timeout(ABORT_LINGER, self.send(&m)).await;
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

/// Below this many unhashed bytes, hashing waits for more (BLAKE3 is fastest on many
/// 1 KiB chunks at once).
const HASH_BATCH: usize = 64 << 10;

/// A received payload's verdict.
pub struct Received {
    /// The trailer matched the digest of the bytes received.
    pub intact: bool,
    /// Digest of the bytes received.
    pub digest: Digest,
}

/// Reads `len` payload bytes into `buf` (appended, no zero-filling) and the trailer, hashing
/// the bytes in batches as they arrive, while they are still in cache; `arrived` counts
/// them as they come (a timed bench that ends mid-block counts what came of it).
pub async fn read_payload<R: AsyncRead + Unpin>(
    r: &mut R,
    len: u32,
    buf: &mut BytesMut,
    key: &DigestKey,
    contended: impl Fn() -> bool,
    mut arrived: impl FnMut(u64),
) -> Result<Received> {
    let start = buf.len();
    let end = start + len as usize;
    buf.reserve(len as usize);
    let mut check = BlockCheck::new(key);
    let mut hashed = start;
    let mut pace = BlockPace::new(tokio::time::Instant::now());
    while buf.len() < end {
        let want = (end - buf.len()).min(PIECE) as u64;
        let patience = pace.patience(tokio::time::Instant::now(), contended())?;
        match within(patience, (&mut *r).take(want).read_buf(buf)).await? {
            0 => return Err(Error::PeerVanished),
            n => {
                pace.arrived(n as u64);
                arrived(n as u64)
            }
        }
        if buf.len() - hashed >= HASH_BATCH || buf.len() == end {
            check.update(&buf[hashed..]);
            hashed = buf.len();
        }
    }
    let mut trailer = [0u8; TRAILER_LEN];
    within_stall(r.read_exact(&mut trailer)).await?;
    let digest = check.finish();
    Ok(Received {
        intact: trailer == digest.0,
        digest,
    })
}

/// A block whose payload stops arriving for this long ends its session. A stopped sender
/// (a client suspended with Ctrl-Z: its kernel still answers keepalives) would otherwise hold
/// the block's buffer, taken from the server's block memory that other sessions wait for,
/// for good. As long as a sender waits for an ACK ([`crate::transport::tcp::USER_TIMEOUT`]).
pub const BLOCK_STALL: Duration = crate::transport::tcp::USER_TIMEOUT;
// The timeout's message below says "2 minutes".
const _: () = assert!(BLOCK_STALL.as_secs() == 120);

/// The least average rate, bytes/s, at which a block's payload must have come, once its
/// first [`BLOCK_STALL`] is over, while another block waits for the block memory it holds
/// ([`BlockMemory::contended`](super::block_memory::BlockMemory::contended)). A peer dribbling
/// one byte a minute kept a 64 MiB block, all of a default server's block memory, for good;
/// now it ends within 2 minutes of another block waiting, and one that keeps up this rate
/// holds a 64 MiB block at most 2 + 68 minutes (a default 4 MiB block 6 minutes). Without
/// contention a slow path (a 256 kbit/s uplink shared by 4 channels) takes its time.
pub const BLOCK_MIN_RATE: u64 = 16 << 10;

/// The error of a block that fell behind [`BLOCK_MIN_RATE`].
const TOO_SLOW: &str = "waiting for the rest of a block: it came slower than 128 kbit/s (run the \
                        same command again to resume)";

/// How long a block's payload may still take: [`BLOCK_STALL`] from its start, plus a
/// second for every [`BLOCK_MIN_RATE`] bytes that came (as Apache's `mod_reqtimeout`
/// extends a request body's timeout with `MinRate`).
#[derive(Debug, Clone, Copy)]
struct BlockPace {
    deadline: tokio::time::Instant,
}

impl BlockPace {
    fn new(now: tokio::time::Instant) -> Self {
        BlockPace {
            deadline: now + BLOCK_STALL,
        }
    }

    fn arrived(&mut self, bytes: u64) {
        self.deadline += Duration::from_secs_f64(bytes as f64 / BLOCK_MIN_RATE as f64);
    }

    /// How long the next read may wait: [`BLOCK_STALL`] at most and, while the block memory
    /// is `contended`, no later than the deadline; an error once that passed.
    fn patience(&self, now: tokio::time::Instant, contended: bool) -> Result<Duration> {
        match self.deadline.checked_duration_since(now) {
            _ if !contended => Ok(BLOCK_STALL),
            Some(left) if !left.is_zero() => Ok(left.min(BLOCK_STALL)),
            _ => Err(Error::Timeout(TOO_SLOW)),
        }
    }
}

/// One read of a block's payload, ended after [`BLOCK_STALL`].
async fn within_stall<T>(read: impl std::future::Future<Output = io::Result<T>>) -> Result<T> {
    within(BLOCK_STALL, read).await
}

/// One read of a block's payload, ended after `patience` ([`BLOCK_STALL`] at most).
async fn within<T>(
    patience: Duration,
    read: impl std::future::Future<Output = io::Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(patience, read).await {
        Ok(r) => r.map_err(closed),
        Err(_) if patience < BLOCK_STALL => Err(Error::Timeout(TOO_SLOW)),
        Err(_) => Err(Error::Timeout(
            "waiting for the rest of a block: nothing came for 2 minutes (run the same \
             command again to resume)",
        )),
    }
}

/// Deliberate damage to one block on its way out (tests of the integrity path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Damage {
    /// Send the block as it is.
    None,
    /// Flip a byte after hashing: the trailer no longer matches, caught on arrival.
    OnWire,
    /// Flip a byte and send the digest of the damaged bytes: passes the arrival check, and
    /// only the end-to-end comparison with the seal (the source's digest) catches it.
    PastCheck,
}

/// Where a block's digest comes from when it is written.
#[derive(Clone, Copy)]
pub enum Digesting<'a> {
    /// Hash the payload with this key as it goes out.
    Hash(&'a DigestKey),
    /// The payload's digest is already known: a bench sends one pattern again and again, so
    /// its sender hashes it once (the receiver still hashes every block on arrival).
    Known(Digest),
}

/// Writes a block frame: header, the payload in [`PIECE`]s (each hashed just before the
/// kernel copies it, so it is read from memory once), and the trailer. The header goes out
/// with the first piece and the trailer with the last, in one vectored write each: a small
/// block is then one write and, inside TLS, no record of its own for either (three writes
/// per 64 KiB file were most of a small-file sender's system calls). Returns the digest of
/// the payload as read from the source (before any injected damage; `damage` needs
/// [`Digesting::Hash`]).
pub async fn write_block<W: AsyncWrite + Unpin>(
    w: &mut W,
    header: &BlockHeader,
    payload: &[u8],
    digesting: Digesting<'_>,
    damage: Damage,
) -> Result<Digest> {
    let head = header.encode();
    let mut head = Some(&head[..]);
    let (mut truth, mut sent) = match digesting {
        Digesting::Hash(key) => (
            Some(BlockCheck::new(key)),
            (damage == Damage::PastCheck).then(|| BlockCheck::new(key)),
        ),
        Digesting::Known(_) => {
            debug_assert_eq!(damage, Damage::None, "damage needs the payload hashed");
            (None, None)
        }
    };
    // The last piece leaves with the trailer, so it is split off (an empty payload is one
    // empty last piece).
    let last_len = payload.len().checked_sub(1).map_or(0, |n| n % PIECE + 1);
    let (body, last) = payload.split_at(payload.len() - last_len);
    for piece in body.chunks(PIECE) {
        let out = hashed_piece(piece, head.is_some(), damage, &mut truth, &mut sent);
        write_pieces(w, [head.take(), Some(&out), None]).await?;
    }
    let out = hashed_piece(last, head.is_some(), damage, &mut truth, &mut sent);
    let digest = match digesting {
        Digesting::Known(d) => d,
        Digesting::Hash(_) => truth.expect("hashed as it went out").finish(),
    };
    let trailer = sent.map_or(digest, |s| s.finish());
    write_pieces(w, [head.take(), Some(&out), Some(&trailer.0)]).await?;
    // Inside TLS the last record waits in the session until flushed.
    w.flush().await.map_err(closed)?;
    Ok(digest)
}

/// Hashes `piece` into `truth` (unless the digest is known) and returns the bytes to send:
/// damaged (the first piece only, tests of the integrity path), and hashed into `sent` as
/// sent.
fn hashed_piece<'a>(
    piece: &'a [u8],
    first: bool,
    damage: Damage,
    truth: &mut Option<BlockCheck>,
    sent: &mut Option<BlockCheck>,
) -> std::borrow::Cow<'a, [u8]> {
    if let Some(t) = truth {
        t.update(piece);
    }
    let out = if first && damage != Damage::None && !piece.is_empty() {
        std::borrow::Cow::Owned(flipped(piece))
    } else {
        std::borrow::Cow::Borrowed(piece)
    };
    if let Some(s) = sent {
        s.update(&out);
    }
    out
}

/// Writes the parts present, in one vectored write as far as the writer takes them.
async fn write_pieces<W: AsyncWrite + Unpin>(w: &mut W, parts: [Option<&[u8]>; 3]) -> Result<()> {
    let mut slices: Vec<io::IoSlice<'_>> =
        parts.into_iter().flatten().map(io::IoSlice::new).collect();
    write_all_vectored(w, &mut slices).await.map_err(closed)
}

/// Writes every byte of `slices`, in as few writes as the writer takes.
async fn write_all_vectored<W: AsyncWrite + Unpin>(
    w: &mut W,
    mut slices: &mut [io::IoSlice<'_>],
) -> io::Result<()> {
    io::IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        let n = w.write_vectored(slices).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        io::IoSlice::advance_slices(&mut slices, n);
    }
    Ok(())
}

fn flipped(piece: &[u8]) -> Vec<u8> {
    let mut v = piece.to_vec();
    v[0] ^= 0xff;
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_server_silent_after_a_question_is_given_up_on() {
        let (_tx, rx) = tokio::io::duplex(1024);
        let mut r = ControlReader::new(rx, FrameSeal::new([3; 32]));
        let started = tokio::time::Instant::now();
        let got = r.answer("waiting for the server's facts").await;
        assert!(
            matches!(got, Err(Error::Timeout("waiting for the server's facts"))),
            "{got:?}"
        );
        assert_eq!(started.elapsed(), ANSWER_TIMEOUT);
    }

    #[tokio::test(start_paused = true)]
    async fn a_block_that_stops_arriving_ends_after_the_stall_time() {
        let (mut tx, mut rx) = tokio::io::duplex(1 << 20);
        tx.write_all(&[7u8; 1000]).await.unwrap();
        let key = DigestKey::default();
        let started = tokio::time::Instant::now();
        let mut buf = BytesMut::new();
        let read = read_payload(&mut rx, 4096, &mut buf, &key, || false, |_| {});
        let got = tokio::time::timeout(BLOCK_STALL * 2, read)
            .await
            .expect("the read never ended");
        assert!(matches!(got, Err(Error::Timeout(_))), "{:?}", got.err());
        let waited = started.elapsed();
        assert!(waited >= BLOCK_STALL && waited < BLOCK_STALL + Duration::from_secs(1));
        assert_eq!(buf.len(), 1000);
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn a_block_dribbled_slower_than_the_least_rate_ends_while_memory_is_wanted() {
        let (mut tx, mut rx) = tokio::io::duplex(1 << 20);
        let started = tokio::time::Instant::now();
        // One byte every 100 s: each read comes within the stall time, but the block as a
        // whole falls behind the least rate.
        let dribble = tokio::spawn(async move {
            loop {
                if tx.write_all(&[7u8]).await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_secs(100)).await;
            }
        });
        let key = DigestKey::default();
        let mut buf = BytesMut::new();
        let read = read_payload(&mut rx, 64 << 20, &mut buf, &key, || true, |_| {});
        let got = tokio::time::timeout(BLOCK_STALL * 10, read)
            .await
            .expect("a dribbled block was read for 20 minutes");
        let e = got.err().expect("a dribbled block is not a block");
        assert!(e.to_string().contains("slower than 128 kbit/s"), "{e}");
        let waited = started.elapsed();
        assert!(waited <= BLOCK_STALL + Duration::from_secs(1), "{waited:?}");
        dribble.abort();
    }

    #[test]
    fn a_block_coming_at_the_least_rate_may_take_its_time() {
        let t0 = tokio::time::Instant::now();
        let mut pace = BlockPace::new(t0);
        // 4 MiB at exactly the least rate: 256 s of data after 120 s of grace.
        for _ in 0..256 {
            pace.arrived(BLOCK_MIN_RATE);
        }
        let patience = |s: u64| pace.patience(t0 + Duration::from_secs(s), true);
        assert_eq!(patience(0).unwrap(), BLOCK_STALL);
        assert_eq!(patience(300).unwrap(), Duration::from_secs(76));
        assert!(patience(376).is_err());
        // Nobody waits for the memory: a slower block only has to keep coming.
        let alone = pace.patience(t0 + Duration::from_secs(1000), false);
        assert_eq!(alone.unwrap(), BLOCK_STALL);
    }
}
