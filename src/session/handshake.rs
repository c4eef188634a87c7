//! The handshake over a socket: moves bytes between a [`TcpStream`] and the state machines of
//! [`crate::channels::handshake`], with timeouts so a silent peer cannot hold a connection.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::channels::auth::{SessionId, SessionKey, TokenKey, SERVER_HELLO_TAG};
use crate::channels::busy::Busy;
use crate::channels::handshake::{ClientHandshake, HandshakeError, Outcome, ServerHandshake};
use crate::channels::ProtocolError;
use crate::error::{Error, Result};

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

async fn read_exact_timed(s: &mut TcpStream, buf: &mut [u8]) -> Result<()> {
    timed(s.read_exact(buf))
        .await?
        .map(drop)
        .map_err(|_| Error::PeerVanished)
}

async fn write(s: &mut TcpStream, b: &[u8]) -> Result<()> {
    s.write_all(b).await.map_err(|_| Error::PeerVanished)
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
    }
}

/// Runs a client machine to its end. A connection that closes or stays silent before the
/// server's hello is not an hsxfer server; one that closes after our control hello refused
/// the token.
async fn drive(s: &mut TcpStream, mut m: ClientHandshake, peer: &str) -> Result<Outcome> {
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
    s: &mut TcpStream,
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
    s: &mut TcpStream,
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

/// Server: sends a fresh hello and reads the client's, leaving the machine ready for the
/// server's answer. `None` when the peer closed the connection without a word: a client that
/// connected a data channel early and gave up when its request was refused, or a port check.
pub async fn server_accept(s: &mut TcpStream) -> Result<Option<ServerHandshake>> {
    let mut m = ServerHandshake::new(rand::random());
    write(s, &m.take_output()).await?;
    let mut buf = vec![0; m.wants()];
    // The first read tells a peer that closes (or resets, our unread hello in its buffer)
    // before its first byte from one that speaks.
    let first = match timed(s.read(&mut buf)).await? {
        Ok(0) => return Ok(None),
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(None),
        Err(_) => return Err(Error::PeerVanished),
    };
    read_exact_timed(s, &mut buf[first..]).await?;
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
pub async fn answer(s: &mut TcpStream, m: &mut ServerHandshake) -> Result<()> {
    write(s, &m.take_output()).await
}

/// Server: writes the machine's last answer (a refusal, or busy at the session cap) and
/// closes.
pub async fn close_with(mut s: TcpStream, m: &mut ServerHandshake) {
    let _ = s.write_all(&m.take_output()).await;
    let _ = s.shutdown().await;
}

/// Server: turns a connection away at one of its caps and closes. The answer is one small
/// write to a fresh socket, so it never waits for the peer.
pub fn turn_away(s: TcpStream, busy: Busy) {
    let _ = s.try_write(&busy.encode());
}
