//! Session authentication, sans-IO: the byte layouts and MACs of the handshake that opens
//! every connection to a server port.
//!
//! One port carries both the control connection and all data channels of every session, so
//! each connection first proves what it is:
//!
//! 1. server → client: [`ServerHello`] with a fresh 32-byte nonce (a new one per connection).
//! 2. client → server: either [`Hello::Control`] with the client's nonce and
//!    `MAC(token_key, "control" ‖ server_nonce ‖ binding ‖ client_nonce)`, or [`Hello::Join`]
//!    naming a session and channel with
//!    `MAC(session_key, "join" ‖ server_nonce ‖ binding ‖ session ‖ channel)`.
//! 3. server → client: [`Welcome`] (session id plus a MAC proving the server knows the token
//!    too) or [`JOIN_OK`], or [`REFUSED`] and close.
//!
//! MACs are keyed BLAKE3. Because the server's nonce is new on every connection, a recorded
//! join or control hello cannot be replayed; a join for a session needs that session's key,
//! which only a holder of the token who saw the control handshake can derive. `--no-auth`
//! is the same protocol with an empty token: channels still prove which session they belong to.
//! `binding` is the connection's TLS exporter value ([`super::preface`]), all zeros in clear
//! text. The handshake itself authenticates; secrecy comes from the TLS around it.

/// Wire tag and version of the server's opening message.
pub const SERVER_HELLO_TAG: [u8; 4] = *b"HXS4";
/// Tag of a client hello that opens a control connection.
pub const CONTROL_TAG: [u8; 4] = *b"HXCC";
/// Tag of a client hello that joins a data channel to a session.
pub const JOIN_TAG: [u8; 4] = *b"HXCJ";
/// Tag of the server's acceptance of a control hello.
pub const WELCOME_TAG: [u8; 4] = *b"HXW1";
/// The server's acceptance of a data-channel join.
pub const JOIN_OK: [u8; 4] = *b"HXJ1";
/// The server's refusal; it closes the connection right after.
pub const REFUSED: [u8; 4] = *b"HXNO";

/// Length of [`ServerHello`] on the wire.
pub const SERVER_HELLO_LEN: usize = 36;
/// Length of a control hello after its 4-byte tag.
pub const CONTROL_BODY_LEN: usize = 64;
/// Length of a join hello after its 4-byte tag.
pub const JOIN_BODY_LEN: usize = 50;
/// Length of [`Welcome`] on the wire.
pub const WELCOME_LEN: usize = 52;

/// A 32-byte random nonce.
pub type Nonce = [u8; 32];
/// A 16-byte session identifier.
pub type SessionId = [u8; 16];

/// The long-term key derived from the shared token (empty for `--no-auth`).
#[derive(Clone)]
pub struct TokenKey([u8; 32]);

impl TokenKey {
    /// Derives the key from the token's bytes (surrounding whitespace is ignored, so a token
    /// file may end with a newline).
    pub fn from_token(token: &[u8]) -> Self {
        let trimmed = token.trim_ascii();
        TokenKey(blake3::derive_key("hsxfer v1 session token", trimmed))
    }
}

impl TokenKey {
    /// The key of block digests ([`crate::channels::frame::BlockCheck`]).
    pub fn digest_key(&self) -> [u8; 32] {
        blake3::derive_key("hsxfer v1 block digest", &self.0)
    }
}

/// The per-session key that data channels use to prove membership.
#[derive(Clone)]
pub struct SessionKey([u8; 32]);

impl SessionKey {
    /// The MAC state of the control frames travelling `way` in this session.
    pub fn control_seal(&self, way: super::control::Way) -> super::control::FrameSeal {
        super::control::FrameSeal::new(blake3::derive_key(way.context(), &self.0))
    }
}

fn mac(key: &[u8; 32], parts: &[&[u8]]) -> blake3::Hash {
    let mut h = blake3::Hasher::new_keyed(key);
    for p in parts {
        h.update(p);
    }
    h.finalize()
}

/// The server's first message on every connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerHello {
    /// Fresh per connection; binds the client's answer to this connection.
    pub nonce: Nonce,
    /// The connection's TLS exporter value, which every MAC also covers (channel binding,
    /// [`super::preface`]); all zeros in clear text. Each end supplies its own: it is not
    /// sent.
    pub binding: [u8; 32],
}

impl ServerHello {
    /// Encodes to [`SERVER_HELLO_LEN`] bytes.
    pub fn encode(&self) -> [u8; SERVER_HELLO_LEN] {
        let mut b = [0u8; SERVER_HELLO_LEN];
        b[..4].copy_from_slice(&SERVER_HELLO_TAG);
        b[4..].copy_from_slice(&self.nonce);
        b
    }

    /// Decodes; `None` when the peer is not an hsxfer server of this version.
    pub fn decode(b: &[u8; SERVER_HELLO_LEN]) -> Option<Self> {
        (b[..4] == SERVER_HELLO_TAG).then(|| ServerHello {
            nonce: b[4..].try_into().expect("32 bytes"),
            binding: super::preface::NO_BINDING,
        })
    }
}

/// What a client says after the server's hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hello {
    /// Open a new session's control connection.
    Control {
        /// The client's fresh nonce.
        client_nonce: Nonce,
        /// Proof of the token over both nonces.
        mac: [u8; 32],
    },
    /// Attach this connection as data channel `channel` of `session`.
    Join {
        /// The session to join.
        session: SessionId,
        /// The channel index, `0..channels`.
        channel: u16,
        /// Proof of the session key over the server nonce, session and channel.
        mac: [u8; 32],
    },
}

impl Hello {
    /// The client hello opening a control connection.
    pub fn control(key: &TokenKey, server: &ServerHello, client_nonce: Nonce) -> Self {
        let m = mac(
            &key.0,
            &[b"control", &server.nonce, &server.binding, &client_nonce],
        );
        Hello::Control {
            client_nonce,
            mac: *m.as_bytes(),
        }
    }

    /// The client hello joining channel `channel` to `session`.
    pub fn join(key: &SessionKey, server: &ServerHello, session: SessionId, channel: u16) -> Self {
        let m = join_mac(key, server, &session, channel);
        Hello::Join {
            session,
            channel,
            mac: *m.as_bytes(),
        }
    }

    /// Encodes tag and body.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(4 + CONTROL_BODY_LEN);
        match self {
            Hello::Control { client_nonce, mac } => {
                b.extend_from_slice(&CONTROL_TAG);
                b.extend_from_slice(client_nonce);
                b.extend_from_slice(mac);
            }
            Hello::Join {
                session,
                channel,
                mac,
            } => {
                b.extend_from_slice(&JOIN_TAG);
                b.extend_from_slice(session);
                b.extend_from_slice(&channel.to_le_bytes());
                b.extend_from_slice(mac);
            }
        }
        b
    }

    /// How many body bytes follow a given 4-byte tag, or `None` for an unknown tag.
    pub fn body_len(tag: &[u8; 4]) -> Option<usize> {
        match *tag {
            CONTROL_TAG => Some(CONTROL_BODY_LEN),
            JOIN_TAG => Some(JOIN_BODY_LEN),
            _ => None,
        }
    }

    /// Decodes a hello from its tag and exactly [`Hello::body_len`] body bytes.
    pub fn decode(tag: &[u8; 4], body: &[u8]) -> Option<Self> {
        if Some(body.len()) != Hello::body_len(tag) {
            return None;
        }
        Some(match *tag {
            CONTROL_TAG => Hello::Control {
                client_nonce: body[..32].try_into().ok()?,
                mac: body[32..64].try_into().ok()?,
            },
            _ => Hello::Join {
                session: body[..16].try_into().ok()?,
                channel: u16::from_le_bytes(body[16..18].try_into().ok()?),
                mac: body[18..50].try_into().ok()?,
            },
        })
    }
}

fn join_mac(key: &SessionKey, server: &ServerHello, session: &SessionId, ch: u16) -> blake3::Hash {
    mac(
        &key.0,
        &[
            b"join",
            &server.nonce,
            &server.binding,
            session,
            &ch.to_le_bytes(),
        ],
    )
}

/// The server's acceptance of a control hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Welcome {
    /// The new session's identifier, used by data channels to join.
    pub session: SessionId,
    /// Proof that the server holds the token as well (mutual authentication).
    pub mac: [u8; 32],
}

impl Welcome {
    /// Encodes to [`WELCOME_LEN`] bytes.
    pub fn encode(&self) -> [u8; WELCOME_LEN] {
        let mut b = [0u8; WELCOME_LEN];
        b[..4].copy_from_slice(&WELCOME_TAG);
        b[4..20].copy_from_slice(&self.session);
        b[20..].copy_from_slice(&self.mac);
        b
    }

    /// Decodes; `None` for a refusal or garbage.
    pub fn decode(b: &[u8; WELCOME_LEN]) -> Option<Self> {
        (b[..4] == WELCOME_TAG).then(|| Welcome {
            session: b[4..20].try_into().expect("16 bytes"),
            mac: b[20..].try_into().expect("32 bytes"),
        })
    }
}

/// Server side: checks a control hello and, if valid, returns the welcome and the session key.
pub fn accept_control(
    key: &TokenKey,
    server: &ServerHello,
    hello: &Hello,
    session: SessionId,
) -> Option<(Welcome, SessionKey)> {
    let Hello::Control {
        client_nonce,
        mac: got,
    } = hello
    else {
        return None;
    };
    let want = mac(
        &key.0,
        &[b"control", &server.nonce, &server.binding, client_nonce],
    );
    if want != blake3::Hash::from(*got) {
        return None;
    }
    let proof = mac(
        &key.0,
        &[
            b"server",
            &server.nonce,
            &server.binding,
            client_nonce,
            &session,
        ],
    );
    Some((
        Welcome {
            session,
            mac: *proof.as_bytes(),
        },
        session_key(key, server, client_nonce, &session),
    ))
}

/// Client side: checks the server's welcome and derives the session key.
pub fn verify_welcome(
    key: &TokenKey,
    server: &ServerHello,
    client_nonce: &Nonce,
    welcome: &Welcome,
) -> Option<SessionKey> {
    let want = mac(
        &key.0,
        &[
            b"server",
            &server.nonce,
            &server.binding,
            client_nonce,
            &welcome.session,
        ],
    );
    (want == blake3::Hash::from(welcome.mac))
        .then(|| session_key(key, server, client_nonce, &welcome.session))
}

fn session_key(
    key: &TokenKey,
    server: &ServerHello,
    cn: &Nonce,
    session: &SessionId,
) -> SessionKey {
    SessionKey(
        *mac(
            &key.0,
            &[b"session", &server.nonce, &server.binding, cn, session],
        )
        .as_bytes(),
    )
}

/// Server side: true when a join hello carries a valid MAC for this connection's nonce.
pub fn verify_join(key: &SessionKey, server: &ServerHello, hello: &Hello) -> bool {
    match hello {
        Hello::Join {
            session,
            channel,
            mac: got,
        } => join_mac(key, server, session, *channel) == blake3::Hash::from(*got),
        Hello::Control { .. } => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handshake(client_token: &[u8], server_token: &[u8]) -> Option<(SessionKey, SessionKey)> {
        let (ck, sk) = (
            TokenKey::from_token(client_token),
            TokenKey::from_token(server_token),
        );
        let sh = ServerHello {
            nonce: [1; 32],
            binding: [0; 32],
        };
        let hello = Hello::control(&ck, &sh, [2; 32]);
        let wire = hello.encode();
        let back = Hello::decode(wire[..4].try_into().unwrap(), &wire[4..]).unwrap();
        assert_eq!(back, hello);
        let (welcome, server_key) = accept_control(&sk, &sh, &back, [9; 16])?;
        let welcome = Welcome::decode(&welcome.encode()).unwrap();
        let client_key = verify_welcome(&ck, &sh, &[2; 32], &welcome)?;
        Some((client_key, server_key))
    }

    #[test]
    fn a_clear_text_refusal_takes_the_place_of_a_hello() {
        use crate::channels::preface::{CLEAR_REFUSED_LEN, CLEAR_REFUSED_TAG};
        assert_eq!(CLEAR_REFUSED_LEN, SERVER_HELLO_LEN);
        assert_ne!(CLEAR_REFUSED_TAG, SERVER_HELLO_TAG);
        assert_ne!(CLEAR_REFUSED_TAG, crate::channels::busy::BUSY_TAG);
    }

    #[test]
    fn matching_tokens_agree_on_a_session_key() {
        let (c, s) = handshake(b"secret\n", b"secret").expect("accepted");
        assert_eq!(c.0, s.0);
    }

    #[test]
    fn wrong_token_is_refused() {
        assert!(handshake(b"secret", b"other").is_none());
    }

    #[test]
    fn join_is_bound_to_the_connection_nonce_and_channel() {
        let (c, s) = handshake(b"t", b"t").unwrap();
        let sh = ServerHello {
            nonce: [5; 32],
            binding: [0; 32],
        };
        let join = Hello::join(&c, &sh, [9; 16], 3);
        assert!(verify_join(&s, &sh, &join));
        // Replayed on a new connection (new nonce): refused.
        let other = ServerHello {
            nonce: [6; 32],
            ..sh
        };
        assert!(!verify_join(&s, &other, &join));
        let relayed = ServerHello {
            binding: [1; 32],
            ..sh
        };
        assert!(
            !verify_join(&s, &relayed, &join),
            "bound to the TLS connection"
        );
        // Channel number altered: refused.
        let Hello::Join { session, mac, .. } = join else {
            unreachable!()
        };
        let forged = Hello::Join {
            session,
            channel: 4,
            mac,
        };
        assert!(!verify_join(&s, &sh, &forged));
        // A key from another session: refused.
        let (other, _) = handshake(b"u", b"u").unwrap();
        assert!(!verify_join(&s, &sh, &Hello::join(&other, &sh, [9; 16], 3)));
    }

    #[test]
    fn unknown_tags_and_lengths_are_rejected() {
        assert_eq!(Hello::body_len(b"GET "), None);
        assert!(Hello::decode(&JOIN_TAG, &[0; 10]).is_none());
        assert!(ServerHello::decode(&[0; SERVER_HELLO_LEN]).is_none());
    }
}
