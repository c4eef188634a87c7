//! The authentication handshake over a socket (the byte layouts are in
//! [`crate::channels::auth`]), with timeouts so a silent peer cannot hold a connection.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::channels::auth::{
    self, Hello, ServerHello, SessionId, SessionKey, TokenKey, Welcome, JOIN_OK, REFUSED,
    SERVER_HELLO_LEN, WELCOME_LEN, WELCOME_TAG,
};
use crate::channels::busy::{Busy, BUSY_TAG};
use crate::error::{Error, Result};

/// How long either side waits for a handshake step.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

async fn read_exact_timed(s: &mut TcpStream, buf: &mut [u8]) -> Result<()> {
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, s.read_exact(buf)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(_)) => Err(Error::PeerVanished),
        Err(_) => Err(Error::Timeout("waiting for the peer's handshake")),
    }
}

async fn write(s: &mut TcpStream, b: &[u8]) -> Result<()> {
    s.write_all(b).await.map_err(|_| Error::PeerVanished)
}

async fn server_hello(s: &mut TcpStream, peer: &str) -> Result<ServerHello> {
    let mut b = [0u8; SERVER_HELLO_LEN];
    read_exact_timed(s, &mut b)
        .await
        .map_err(|_| Error::NotHsxfer(peer.into()))?;
    if let Some(busy) = Busy::decode(&b) {
        return Err(Error::Busy {
            peer: peer.into(),
            busy,
        });
    }
    ServerHello::decode(&b).ok_or_else(|| Error::NotHsxfer(peer.into()))
}

/// Client: authenticates a control connection; returns the session id and key.
pub async fn client_control(
    s: &mut TcpStream,
    key: &TokenKey,
    peer: &str,
) -> Result<(SessionId, SessionKey)> {
    let sh = server_hello(s, peer).await?;
    let nonce: [u8; 32] = rand::random();
    write(s, &Hello::control(key, &sh, nonce).encode()).await?;
    let mut b = [0u8; WELCOME_LEN];
    read_exact_timed(s, &mut b[..4])
        .await
        .map_err(|_| Error::AuthRefused(peer.into()))?;
    if b[..4] == BUSY_TAG {
        let mut busy = [0u8; SERVER_HELLO_LEN];
        busy[..4].copy_from_slice(&BUSY_TAG);
        read_exact_timed(s, &mut busy[4..]).await?;
        let busy = Busy::decode(&busy).expect("a busy tag");
        return Err(Error::Busy {
            peer: peer.into(),
            busy,
        });
    }
    if b[..4] == REFUSED || b[..4] != WELCOME_TAG {
        return Err(Error::AuthRefused(peer.into()));
    }
    read_exact_timed(s, &mut b[4..]).await?;
    let welcome = Welcome::decode(&b).ok_or_else(|| Error::NotHsxfer(peer.into()))?;
    let skey = auth::verify_welcome(key, &sh, &nonce, &welcome)
        .ok_or_else(|| Error::ServerNotAuthentic(peer.into()))?;
    Ok((welcome.session, skey))
}

/// Client: joins a data channel to a session.
pub async fn client_join(
    s: &mut TcpStream,
    key: &SessionKey,
    session: SessionId,
    channel: u16,
    peer: &str,
) -> Result<()> {
    let sh = server_hello(s, peer).await?;
    write(s, &Hello::join(key, &sh, session, channel).encode()).await?;
    let mut b = [0u8; 4];
    read_exact_timed(s, &mut b).await?;
    if b != JOIN_OK {
        return Err(Error::Refused(format!(
            "data channel {channel} was not admitted"
        )));
    }
    Ok(())
}

/// Server: sends a fresh hello and reads the client's answer.
pub async fn server_accept(s: &mut TcpStream) -> Result<(ServerHello, Hello)> {
    let sh = ServerHello {
        nonce: rand::random(),
    };
    write(s, &sh.encode()).await?;
    let mut tag = [0u8; 4];
    read_exact_timed(s, &mut tag).await?;
    let len = Hello::body_len(&tag).ok_or_else(|| Error::Malformed("unknown hello".into()))?;
    let mut body = vec![0u8; len];
    read_exact_timed(s, &mut body).await?;
    let hello = Hello::decode(&tag, &body).ok_or_else(|| Error::Malformed("bad hello".into()))?;
    Ok((sh, hello))
}

/// Server: turns a connection away at one of its caps and closes. The answer is one small
/// write to a fresh socket, so it never waits for the peer.
pub fn turn_away(s: TcpStream, busy: Busy) {
    let _ = s.try_write(&busy.encode());
}

/// Server: refuses and closes.
pub async fn refuse(mut s: TcpStream) {
    let _ = s.write_all(&REFUSED).await;
    let _ = s.shutdown().await;
}

/// Server: admits a data channel.
pub async fn admit(s: &mut TcpStream) -> Result<()> {
    write(s, &JOIN_OK).await
}
