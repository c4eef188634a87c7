//! The handshake over a socket: opens each connection in TLS or clear text
//! ([`crate::channels::preface`]), then moves bytes between the [`Stream`] and the state
//! machines of [`crate::channels::handshake`], with timeouts so a silent peer cannot hold a
//! connection.

use std::io::ErrorKind;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::channels::auth::{SessionId, SessionKey, TokenKey, SERVER_HELLO_TAG};
use crate::channels::busy::Busy;
use crate::channels::handshake::{ClientHandshake, HandshakeError, Outcome, ServerHandshake};
use crate::channels::preface::{self, Opening, CLEAR_PREFACE};
use crate::channels::ProtocolError;
use crate::error::{Error, Result};
use crate::transport::tls::{ClientTls, ConnectError, ServerTls, Stream};

/// How long either side waits for a handshake step.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A read of the peer's handshake, within [`HANDSHAKE_TIMEOUT`].
async fn timed<T>(
    read: impl std::future::Future<Output = std::io::Result<T>>,
) -> Result<std::io::Result<T>> {
    tokio::time::timeout(HANDSHAKE_TIMEOUT, read)
        .await
        .map_err(|_| Error::Timeout("waiting for the peer's handshake"))
}

async fn read_exact_timed(s: &mut Stream, buf: &mut [u8]) -> Result<()> {
    timed(s.read_exact(buf))
        .await?
        .map(drop)
        .map_err(|_| Error::PeerVanished)
}

/// Writes and flushes: inside TLS, bytes written stay in the session until flushed.
async fn write(s: &mut Stream, b: &[u8]) -> Result<()> {
    s.write_all(b).await.map_err(|_| Error::PeerVanished)?;
    s.flush().await.map_err(|_| Error::PeerVanished)
}

/// How a client opens its connections to one server: in TLS, accepting the keys its
/// [`ClientTls`] accepts, or in clear text (`--no-encrypt`).
#[derive(Clone, Debug)]
pub enum Opener {
    /// TLS 1.3.
    Tls(ClientTls),
    /// Clear text, the server permitting.
    Clear,
}

impl Opener {
    /// Opens a TCP connection to `peer` for the handshake: the TLS handshake, or the
    /// clear-text preface. A server that answers a TLS client in clear text (busy, an older
    /// hsxfer) is reported as such; a key other than the accepted one is
    /// [`OpenError::WrongKey`], for the caller to explain.
    pub async fn open(&self, mut tcp: TcpStream, peer: &str) -> Result<Stream, OpenError> {
        let tls = match self {
            Opener::Clear => {
                tcp.write_all(&CLEAR_PREFACE)
                    .await
                    .map_err(|_| Error::PeerVanished)?;
                return Ok(Stream::clear(tcp));
            }
            Opener::Tls(tls) => tls,
        };
        let ip = tcp
            .peer_addr()
            .map_err(Error::io("the server's address"))?
            .ip();
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.connect(tcp, ip)).await {
            Err(_) => Err(Error::Timeout("waiting for the server's TLS handshake").into()),
            Ok(Ok(s)) => Ok(s),
            Ok(Err(ConnectError::WrongKey { seen })) => Err(OpenError::WrongKey(seen)),
            Ok(Err(ConnectError::Clear(first))) => Err(clear_answer(&first, peer).into()),
            Ok(Err(ConnectError::Io(source))) => Err(Error::Tls {
                peer: peer.to_string(),
                source,
            }
            .into()),
        }
    }
}

/// Why a connection could not be opened.
#[derive(Debug)]
pub enum OpenError {
    /// The server presented this key, which the opener does not accept.
    WrongKey(crate::transport::tls::Fingerprint),
    /// Anything else.
    Other(Error),
}

impl From<Error> for OpenError {
    fn from(e: Error) -> Self {
        OpenError::Other(e)
    }
}

/// What a server's clear-text answer to a TLS client means: a busy answer, an older hsxfer's
/// hello, or not hsxfer at all.
fn clear_answer(first: &[u8], peer: &str) -> Error {
    let mut m = ClientHandshake::control(TokenKey::from_token(b""), [0; 32]);
    let len = first.len().min(m.wants());
    match m.handle(&first[..len]) {
        Err(e @ (HandshakeError::Busy(_) | HandshakeError::OtherVersion { .. })) => {
            client_error(e, peer)
        }
        // Our own version's hello in clear text would be a server that does not do TLS.
        _ => Error::NotHsxfer(peer.into()),
    }
}

/// The library's error for a client handshake that failed, naming the server.
fn client_error(e: HandshakeError, peer: &str) -> Error {
    let peer = peer.to_string();
    match e {
        HandshakeError::NotHsxfer | HandshakeError::UnknownHello => Error::NotHsxfer(peer),
        HandshakeError::OtherVersion { ours, theirs } => {
            let tag = |c: char| format!("{}{c}", String::from_utf8_lossy(&SERVER_HELLO_TAG[..3]));
            Error::Protocol(ProtocolError::OtherVersion {
                peer,
                ours: tag(ours),
                theirs: tag(theirs),
            })
        }
        HandshakeError::Busy(busy) => Error::Busy { peer, busy },
        HandshakeError::AuthRefused => Error::AuthRefused(peer),
        HandshakeError::ServerNotAuthentic => Error::ServerNotAuthentic(peer),
        HandshakeError::JoinRefused(ch) => {
            Error::Refused(format!("data channel {ch} was not admitted"))
        }
        HandshakeError::ClearRefused => Error::ClearRefused(peer),
    }
}

/// Runs a client machine to its end. A connection that closes or stays silent before the
/// server's hello is not an hsxfer server; one that closes after our control hello refused
/// the token.
async fn drive(s: &mut Stream, m: ClientHandshake, peer: &str) -> Result<Outcome> {
    let mut m = m.bound(s.binding());
    let mut buf = Vec::new();
    loop {
        let out = m.take_output();
        if !out.is_empty() {
            write(s, &out).await?;
        }
        if let Some(o) = m.outcome() {
            return Ok(o);
        }
        buf.resize(m.wants(), 0);
        if let Err(e) = read_exact_timed(s, &mut buf).await {
            return Err(match (m.greeted(), m.is_control()) {
                (false, _) => Error::NotHsxfer(peer.into()),
                (true, true) => Error::AuthRefused(peer.into()),
                (true, false) => e,
            });
        }
        m.handle(&buf).map_err(|e| client_error(e, peer))?;
    }
}

/// Client: authenticates a control connection; returns the session id and key.
pub async fn client_control(
    s: &mut Stream,
    key: &TokenKey,
    peer: &str,
) -> Result<(SessionId, SessionKey)> {
    match drive(
        s,
        ClientHandshake::control(key.clone(), rand::random()),
        peer,
    )
    .await?
    {
        Outcome::Session { id, key } => Ok((id, key)),
        Outcome::Joined => unreachable!("a control handshake ends in a session"),
    }
}

/// Client: joins a data channel to a session.
pub async fn client_join(
    s: &mut Stream,
    key: &SessionKey,
    session: SessionId,
    channel: u16,
    peer: &str,
) -> Result<()> {
    drive(
        s,
        ClientHandshake::join(key.clone(), session, channel),
        peer,
    )
    .await?;
    Ok(())
}

/// Server: opens an accepted connection by its first byte, the TLS handshake or clear text
/// after its preface if `tls` allows it (else the refusal, and an error), and sends a fresh
/// hello: in TLS with the handshake's last flight. Returns the connection and the machine,
/// ready for [`server_accept`]. `None` when the peer closed the connection without a word: a
/// client that connected a data channel early and gave up when its request was refused, or a
/// port check.
pub async fn server_open(
    tcp: TcpStream,
    tls: &ServerTls,
) -> Result<Option<(Stream, ServerHandshake)>> {
    let mut first = [0u8; 1];
    // Peeking tells a peer that closes (or resets) before its first byte from one that
    // speaks, and leaves a ClientHello whole for TLS.
    match timed(tcp.peek(&mut first)).await? {
        Ok(0) => return Ok(None),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(None),
        Err(_) => return Err(Error::PeerVanished),
    }
    let mut m = ServerHandshake::new(rand::random());
    let hello = m.take_output();
    match preface::classify(first[0]) {
        Opening::Tls => match timed(tls.accept(tcp, &hello)).await? {
            Ok(s) => {
                let m = m.bound(s.binding());
                Ok(Some((s, m)))
            }
            // A client drops the data channels it was dialing when their session is refused.
            Err(e) if left(&e) => Err(Error::PeerVanished),
            Err(e) => Err(Error::Malformed(format!("TLS handshake: {e}"))),
        },
        Opening::Clear => {
            let mut s = Stream::clear(tcp);
            let mut got = [0u8; CLEAR_PREFACE.len()];
            read_exact_timed(&mut s, &mut got).await?;
            if got != CLEAR_PREFACE {
                return Err(Error::Malformed("not an hsxfer client".into()));
            }
            if !tls.allow_clear {
                let _ = write(&mut s, &preface::clear_refused()).await;
                let _ = s.shutdown().await;
                return Err(Error::Refused(
                    "a client asked for clear text; this server allows only TLS \
                     (`ServerBuilder::allow_clear` allows both)"
                        .into(),
                ));
            }
            write(&mut s, &hello).await?;
            Ok(Some((s, m)))
        }
        Opening::Unknown => Err(Error::Malformed("not an hsxfer client".into())),
    }
}

/// Whether a read failed because the client closed or reset the connection: dropped, a
/// client's TLS connection ends without its close_notify, an unexpected EOF to rustls.
fn left(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset
    )
}

/// Server: reads the client's hello, leaving the machine of [`server_open`] ready for the
/// server's answer. `None` when the client closes the connection before the hello's first
/// byte: a data channel dialed while its control connection authenticated, unused because
/// the session did not open (a refused token or request).
pub async fn server_accept(
    s: &mut Stream,
    mut m: ServerHandshake,
) -> Result<Option<ServerHandshake>> {
    let mut buf = vec![0; m.wants()];
    match timed(s.read(&mut buf)).await? {
        Ok(0) => return Ok(None),
        Ok(n) => read_exact_timed(s, &mut buf[n..]).await?,
        Err(e) if left(&e) => return Ok(None),
        Err(_) => return Err(Error::PeerVanished),
    }
    loop {
        m.handle(&buf)
            .map_err(|e| Error::Malformed(e.to_string()))?;
        if m.wants() == 0 {
            return Ok(Some(m));
        }
        buf.resize(m.wants(), 0);
        read_exact_timed(s, &mut buf).await?;
    }
}

/// Server: writes the machine's answer (a welcome or an admission).
pub async fn answer(s: &mut Stream, m: &mut ServerHandshake) -> Result<()> {
    write(s, &m.take_output()).await
}

/// Server: writes the machine's last answer (a refusal, or busy at the session cap) and
/// closes.
pub async fn close_with(mut s: Stream, m: &mut ServerHandshake) {
    let _ = write(&mut s, &m.take_output()).await;
    let _ = s.shutdown().await;
}

/// Server: turns a connection away at one of its caps and closes. The answer is one small
/// clear-text write to a fresh socket, so it never waits for the peer; a TLS client reads it
/// in place of the server's TLS handshake ([`Opener::open`]).
pub fn turn_away(s: TcpStream, busy: Busy) {
    let _ = s.try_write(&busy.encode());
}
