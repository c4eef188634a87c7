//! The handshake that opens every connection, as two state machines (bytes in, bytes and
//! decisions out): [`ClientHandshake`] for a control connection or a data channel, and
//! [`ServerHandshake`] for the server's side of either. The message layouts and MACs are in
//! [`super::auth`]; the socket glue, with its timeouts, is `session::handshake`.
//!
//! A machine never asks for more bytes than its current step needs ([`ClientHandshake::wants`]),
//! so whatever follows the handshake on the connection (control frames, data frames) stays
//! unread for the next layer.
//!
//! # Examples
//!
//! Both ends in memory, with the bytes passed by hand:
//!
//! ```
//! use hsxfer::channels::auth::TokenKey;
//! use hsxfer::channels::handshake::{ClientHandshake, Outcome, ServerHandshake, Heard};
//!
//! let key = TokenKey::from_token(b"a shared token");
//! let mut server = ServerHandshake::new([1; 32]);
//! let mut client = ClientHandshake::control(key.clone(), [2; 32]);
//!
//! client.handle(&server.take_output()).unwrap();
//! server.handle(&client.take_output()).unwrap();
//! let Some(Heard::Control) = server.heard() else { panic!() };
//! let server_key = server.accept_control(&key, [9; 16]).expect("the same token");
//! server.welcome();
//! client.handle(&server.take_output()).unwrap();
//! let Some(Outcome::Session { id, .. }) = client.outcome() else { panic!() };
//! assert_eq!(id, [9; 16]);
//! # let _ = server_key;
//! ```

use super::auth::{
    self, Hello, Nonce, ServerHello, SessionId, SessionKey, TokenKey, Welcome, JOIN_OK, REFUSED,
    SERVER_HELLO_LEN, SERVER_HELLO_TAG, WELCOME_LEN, WELCOME_TAG,
};
use super::busy::{Busy, BUSY_TAG};
use super::preface::{CLEAR_REFUSED_TAG, NO_BINDING};

/// Why a handshake ended without a session or channel.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// The peer's first bytes are not an hsxfer hello of any version.
    #[error("the peer is not an hsxfer server")]
    NotHsxfer,
    /// The peer is an hsxfer server of another protocol version.
    #[error(
        "the server speaks hsxfer handshake version {theirs}, this side {ours}: run the same \
         hsxfer version on both ends"
    )]
    OtherVersion {
        /// This side's version character.
        ours: char,
        /// The server's.
        theirs: char,
    },
    /// The server turned the connection away at one of its caps.
    #[error("the server is busy: {0}")]
    Busy(Busy),
    /// The server refused the client's token.
    #[error("the server refused the token")]
    AuthRefused,
    /// The server's welcome does not prove it holds the token.
    #[error("the server failed to prove it holds the token")]
    ServerNotAuthentic,
    /// The server did not admit a data channel.
    #[error("data channel {0} was not admitted")]
    JoinRefused(u16),
    /// The client's hello is not one this server knows.
    #[error("the client's hello is not an hsxfer hello of this version")]
    UnknownHello,
    /// The client asked for clear text and the server allows only TLS.
    #[error("the server allows only encrypted connections")]
    ClearRefused,
}

/// What a finished client handshake established.
#[derive(Clone)]
pub enum Outcome {
    /// A control connection: the new session and its key.
    Session {
        /// The session's identifier.
        id: SessionId,
        /// The key its data channels prove membership with.
        key: SessionKey,
    },
    /// A data channel, admitted to its session.
    Joined,
}

enum Goal {
    Control {
        key: TokenKey,
        nonce: Nonce,
    },
    Join {
        key: SessionKey,
        session: SessionId,
        channel: u16,
    },
}

#[derive(Clone, Copy)]
enum ClientStep {
    /// The server's hello (or a busy answer in its place).
    ServerHello,
    /// The first 4 bytes of the server's answer to our hello.
    AnswerTag(ServerHello),
    /// The rest of a welcome.
    Welcome(ServerHello),
    /// The rest of a busy answer.
    Busy,
    Done,
}

/// The client's side of the handshake, for a control connection
/// ([`ClientHandshake::control`]) or a data channel ([`ClientHandshake::join`]).
pub struct ClientHandshake {
    goal: Goal,
    binding: [u8; 32],
    step: ClientStep,
    buf: Vec<u8>,
    out: Vec<u8>,
    outcome: Option<Outcome>,
}

impl ClientHandshake {
    /// Opens a control connection with the token's key and a fresh random `nonce`.
    pub fn control(key: TokenKey, nonce: Nonce) -> Self {
        Self::new(Goal::Control { key, nonce })
    }

    /// Joins this connection to `session` as data channel `channel`.
    pub fn join(key: SessionKey, session: SessionId, channel: u16) -> Self {
        Self::new(Goal::Join {
            key,
            session,
            channel,
        })
    }

    /// Binds every MAC to the connection's TLS exporter value ([`super::preface`]); without
    /// this the binding is all zeros (clear text).
    pub fn bound(mut self, binding: [u8; 32]) -> Self {
        self.binding = binding;
        self
    }

    fn new(goal: Goal) -> Self {
        ClientHandshake {
            goal,
            binding: NO_BINDING,
            step: ClientStep::ServerHello,
            buf: Vec::new(),
            out: Vec::new(),
            outcome: None,
        }
    }

    /// How many more bytes the current step needs; 0 once the handshake is over. Reading
    /// exactly this many never takes bytes that belong to the layer after the handshake.
    pub fn wants(&self) -> usize {
        let step_len = match self.step {
            ClientStep::ServerHello | ClientStep::Busy => SERVER_HELLO_LEN,
            ClientStep::AnswerTag(_) => 4,
            ClientStep::Welcome(_) => WELCOME_LEN,
            ClientStep::Done => return 0,
        };
        step_len - self.buf.len()
    }

    /// Bytes to write to the server now (empty when there are none).
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    /// True once the server's hello has arrived: a connection that ends before is not to an
    /// hsxfer server.
    pub fn greeted(&self) -> bool {
        !matches!(self.step, ClientStep::ServerHello)
    }

    /// True for a control connection, false for a data channel.
    pub fn is_control(&self) -> bool {
        matches!(self.goal, Goal::Control { .. })
    }

    /// What the handshake established, once it is over.
    pub fn outcome(&self) -> Option<Outcome> {
        self.outcome.clone()
    }

    /// Takes bytes from the server and returns how many it used (never more than
    /// [`ClientHandshake::wants`] at each step); the rest belongs to the next layer.
    pub fn handle(&mut self, input: &[u8]) -> Result<usize, HandshakeError> {
        feed(self, input)
    }
}

impl Stepped for ClientHandshake {
    fn wants(&self) -> usize {
        ClientHandshake::wants(self)
    }

    fn buf(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }

    fn step(&mut self) -> Result<(), HandshakeError> {
        let got = std::mem::take(&mut self.buf);
        self.step = match self.step {
            ClientStep::ServerHello => {
                let b: &[u8; SERVER_HELLO_LEN] = got[..].try_into().expect("a whole hello");
                if let Some(busy) = Busy::decode(b) {
                    return Err(HandshakeError::Busy(busy));
                }
                if b[..4] == CLEAR_REFUSED_TAG {
                    return Err(HandshakeError::ClearRefused);
                }
                let mut sh = server_hello(b)?;
                sh.binding = self.binding;
                let hello = match &self.goal {
                    Goal::Control { key, nonce } => Hello::control(key, &sh, *nonce),
                    Goal::Join {
                        key,
                        session,
                        channel,
                    } => Hello::join(key, &sh, *session, *channel),
                };
                self.out.extend_from_slice(&hello.encode());
                ClientStep::AnswerTag(sh)
            }
            ClientStep::AnswerTag(sh) => {
                let tag: [u8; 4] = got[..].try_into().expect("a tag");
                match (&self.goal, tag) {
                    (_, BUSY_TAG) => {
                        self.buf = got;
                        ClientStep::Busy
                    }
                    (Goal::Control { .. }, WELCOME_TAG) => {
                        self.buf = got;
                        ClientStep::Welcome(sh)
                    }
                    (Goal::Join { .. }, JOIN_OK) => {
                        self.outcome = Some(Outcome::Joined);
                        ClientStep::Done
                    }
                    (Goal::Join { channel, .. }, _) => {
                        return Err(HandshakeError::JoinRefused(*channel))
                    }
                    (Goal::Control { .. }, _) => return Err(HandshakeError::AuthRefused),
                }
            }
            ClientStep::Welcome(sh) => {
                let b: &[u8; WELCOME_LEN] = got[..].try_into().expect("a whole welcome");
                let welcome = Welcome::decode(b).ok_or(HandshakeError::NotHsxfer)?;
                let Goal::Control { key, nonce } = &self.goal else {
                    unreachable!("only a control hello is welcomed")
                };
                let skey = auth::verify_welcome(key, &sh, nonce, &welcome)
                    .ok_or(HandshakeError::ServerNotAuthentic)?;
                self.outcome = Some(Outcome::Session {
                    id: welcome.session,
                    key: skey,
                });
                ClientStep::Done
            }
            ClientStep::Busy => {
                let b: &[u8; SERVER_HELLO_LEN] = got[..].try_into().expect("a whole answer");
                return Err(HandshakeError::Busy(Busy::decode(b).expect("a busy tag")));
            }
            ClientStep::Done => ClientStep::Done,
        };
        Ok(())
    }
}

/// Decodes the server's hello, telling another version of hsxfer from something else.
fn server_hello(b: &[u8; SERVER_HELLO_LEN]) -> Result<ServerHello, HandshakeError> {
    if let Some(sh) = ServerHello::decode(b) {
        return Ok(sh);
    }
    match b[..3] == SERVER_HELLO_TAG[..3] && b[3].is_ascii_alphanumeric() {
        true => Err(HandshakeError::OtherVersion {
            ours: SERVER_HELLO_TAG[3] as char,
            theirs: b[3] as char,
        }),
        false => Err(HandshakeError::NotHsxfer),
    }
}

/// What the server heard from a client, once its hello is complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heard {
    /// A new session's control connection: answer with [`ServerHandshake::accept_control`].
    Control,
    /// A data channel for `session`: answer with [`ServerHandshake::admit_join`].
    Join {
        /// The session it names.
        session: SessionId,
        /// The channel index it claims.
        channel: u16,
    },
}

enum ServerStep {
    Tag,
    Body([u8; 4]),
    Heard(Hello),
    Answered,
}

/// The server's side of the handshake: sends its hello, reads the client's, and answers
/// with the decisions the server makes from its own state (which sessions exist, its caps).
pub struct ServerHandshake {
    hello: ServerHello,
    step: ServerStep,
    buf: Vec<u8>,
    out: Vec<u8>,
    welcome: Option<Welcome>,
}

impl ServerHandshake {
    /// Starts a connection with a fresh random `nonce`; its hello is the first output.
    pub fn new(nonce: Nonce) -> Self {
        let hello = ServerHello {
            nonce,
            binding: NO_BINDING,
        };
        ServerHandshake {
            hello,
            step: ServerStep::Tag,
            buf: Vec::new(),
            out: hello.encode().to_vec(),
            welcome: None,
        }
    }

    /// Binds every MAC to the connection's TLS exporter value, as
    /// [`ClientHandshake::bound`] does.
    pub fn bound(mut self, binding: [u8; 32]) -> Self {
        self.hello.binding = binding;
        self
    }

    /// How many more bytes of the client's hello are needed; 0 once it is complete.
    pub fn wants(&self) -> usize {
        match self.step {
            ServerStep::Tag => 4 - self.buf.len(),
            ServerStep::Body(tag) => Hello::body_len(&tag).expect("a known tag") - self.buf.len(),
            ServerStep::Heard(_) | ServerStep::Answered => 0,
        }
    }

    /// Bytes to write to the client now (empty when there are none).
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    /// Takes bytes from the client and returns how many it used.
    pub fn handle(&mut self, input: &[u8]) -> Result<usize, HandshakeError> {
        feed(self, input)
    }

    /// What the client asked for, once its hello is complete and not yet answered.
    pub fn heard(&self) -> Option<Heard> {
        match self.step {
            ServerStep::Heard(Hello::Control { .. }) => Some(Heard::Control),
            ServerStep::Heard(Hello::Join {
                session, channel, ..
            }) => Some(Heard::Join { session, channel }),
            _ => None,
        }
    }

    /// Checks a control hello against the token's key; on success the new session is
    /// `session`, and the server then answers with [`ServerHandshake::welcome`] or, past
    /// its session cap, [`ServerHandshake::turn_away`]. On failure the refusal is queued.
    pub fn accept_control(
        &mut self,
        key: &TokenKey,
        session: SessionId,
    ) -> Result<SessionKey, HandshakeError> {
        let ServerStep::Heard(hello) = self.step else {
            return Err(HandshakeError::UnknownHello);
        };
        match auth::accept_control(key, &self.hello, &hello, session) {
            Some((welcome, skey)) => {
                self.welcome = Some(welcome);
                Ok(skey)
            }
            None => {
                self.refuse();
                Err(HandshakeError::AuthRefused)
            }
        }
    }

    /// Welcomes the control connection accepted by [`ServerHandshake::accept_control`].
    pub fn welcome(&mut self) {
        if let Some(w) = self.welcome.take() {
            self.answer(&w.encode());
        }
    }

    /// Admits a data channel when its hello proves `key` (the session it names, looked up
    /// by the server) and the channel is still free; otherwise queues the refusal.
    pub fn admit_join(&mut self, key: Option<&SessionKey>, free: bool) -> bool {
        let ServerStep::Heard(hello) = self.step else {
            return false;
        };
        let ok = free && key.is_some_and(|k| auth::verify_join(k, &self.hello, &hello));
        self.answer(if ok { &JOIN_OK } else { &REFUSED });
        ok
    }

    /// Turns the connection away at one of the server's caps.
    pub fn turn_away(&mut self, busy: Busy) {
        self.answer(&busy.encode());
    }

    /// Refuses the connection; the server closes it after the refusal.
    pub fn refuse(&mut self) {
        self.answer(&REFUSED);
    }

    fn answer(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
        self.step = ServerStep::Answered;
    }
}

impl Stepped for ServerHandshake {
    fn wants(&self) -> usize {
        ServerHandshake::wants(self)
    }

    fn buf(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }

    fn step(&mut self) -> Result<(), HandshakeError> {
        let got = std::mem::take(&mut self.buf);
        self.step = match self.step {
            ServerStep::Tag => {
                let tag: [u8; 4] = got[..].try_into().expect("a tag");
                Hello::body_len(&tag).ok_or(HandshakeError::UnknownHello)?;
                ServerStep::Body(tag)
            }
            ServerStep::Body(tag) => {
                ServerStep::Heard(Hello::decode(&tag, &got).ok_or(HandshakeError::UnknownHello)?)
            }
            _ => unreachable!("wants() is 0 after the hello"),
        };
        Ok(())
    }
}

/// A machine that reads its peer in steps of known length.
trait Stepped {
    /// Bytes still missing from the current step.
    fn wants(&self) -> usize;
    /// Where the current step's bytes collect.
    fn buf(&mut self) -> &mut Vec<u8>;
    /// Acts on the complete step in the buffer.
    fn step(&mut self) -> Result<(), HandshakeError>;
}

/// Feeds `input` to `m` step by step, never taking more than a step needs; returns how many
/// bytes it used.
fn feed<M: Stepped>(m: &mut M, mut input: &[u8]) -> Result<usize, HandshakeError> {
    let mut used = 0;
    while m.wants() > 0 && !input.is_empty() {
        let n = m.wants().min(input.len());
        m.buf().extend_from_slice(&input[..n]);
        input = &input[n..];
        used += n;
        if m.wants() == 0 {
            m.step()?;
        }
    }
    Ok(used)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channels::busy::Cap;

    /// Passes bytes both ways in chunks of `chunk` until neither side has output.
    fn pump(
        c: &mut ClientHandshake,
        s: &mut ServerHandshake,
        chunk: usize,
    ) -> Result<(), HandshakeError> {
        loop {
            let (to_c, to_s) = (s.take_output(), c.take_output());
            if to_c.is_empty() && to_s.is_empty() {
                return Ok(());
            }
            for piece in to_c.chunks(chunk) {
                assert_eq!(c.handle(piece)?, piece.len());
            }
            for piece in to_s.chunks(chunk) {
                assert_eq!(s.handle(piece)?, piece.len());
            }
        }
    }

    fn control(
        client: &[u8],
        server: &[u8],
        chunk: usize,
    ) -> (ClientHandshake, ServerHandshake, Result<(), HandshakeError>) {
        let mut s = ServerHandshake::new([1; 32]);
        let mut c = ClientHandshake::control(TokenKey::from_token(client), [2; 32]);
        let r = pump(&mut c, &mut s, chunk).and_then(|()| {
            assert_eq!(s.heard(), Some(Heard::Control));
            s.accept_control(&TokenKey::from_token(server), [7; 16])?;
            s.welcome();
            pump(&mut c, &mut s, chunk)
        });
        (c, s, r)
    }

    #[test]
    fn control_handshake_in_any_chunking() {
        for chunk in [1, 3, 4, 36, 1000] {
            let (c, _, r) = control(b"t", b"t", chunk);
            r.unwrap();
            assert!(matches!(c.outcome(), Some(Outcome::Session { id, .. }) if id == [7; 16]));
            assert_eq!(c.wants(), 0);
        }
    }

    #[test]
    fn wrong_token_is_refused_on_both_sides() {
        let (c, _, r) = control(b"t", b"u", 5);
        assert_eq!(r, Err(HandshakeError::AuthRefused));
        assert!(c.outcome().is_none());
    }

    #[test]
    fn a_forged_welcome_is_not_authentic() {
        let mut s = ServerHandshake::new([1; 32]);
        let mut c = ClientHandshake::control(TokenKey::from_token(b"t"), [2; 32]);
        pump(&mut c, &mut s, 64).unwrap();
        s.accept_control(&TokenKey::from_token(b"t"), [7; 16])
            .unwrap();
        s.welcome();
        let mut w = s.take_output();
        w[10] ^= 1;
        assert_eq!(c.handle(&w), Err(HandshakeError::ServerNotAuthentic));
    }

    fn session(token: &[u8]) -> (SessionId, SessionKey) {
        let (c, _, r) = control(token, token, 64);
        r.unwrap();
        match c.outcome() {
            Some(Outcome::Session { id, key }) => (id, key),
            _ => unreachable!("a session"),
        }
    }

    #[test]
    fn join_admitted_only_with_the_session_key_and_a_free_channel() {
        let (id, key) = session(b"t");
        let (_, wrong) = session(b"x");
        for (k, free, admitted) in [
            (&key, true, true),
            (&key, false, false),
            (&wrong, true, false),
        ] {
            let mut s = ServerHandshake::new([4; 32]);
            let mut j = ClientHandshake::join(key.clone(), id, 2);
            pump(&mut j, &mut s, 7).unwrap();
            assert_eq!(
                s.heard(),
                Some(Heard::Join {
                    session: id,
                    channel: 2
                })
            );
            assert_eq!(s.admit_join(Some(k), free), admitted);
            let answer = pump(&mut j, &mut s, 7);
            match admitted {
                true => assert!(matches!(j.outcome(), Some(Outcome::Joined))),
                false => assert_eq!(answer, Err(HandshakeError::JoinRefused(2))),
            }
        }
        // A session the server does not know.
        let mut s = ServerHandshake::new([4; 32]);
        let mut j = ClientHandshake::join(key, id, 0);
        pump(&mut j, &mut s, 64).unwrap();
        assert!(!s.admit_join(None, true));
    }

    #[test]
    fn busy_in_place_of_the_hello_or_the_welcome() {
        let busy = Busy {
            cap: Cap::Sessions,
            per_address: false,
            limit: 3,
        };
        let mut c = ClientHandshake::control(TokenKey::from_token(b"t"), [2; 32]);
        assert_eq!(c.handle(&busy.encode()), Err(HandshakeError::Busy(busy)));

        let mut s = ServerHandshake::new([1; 32]);
        let mut c = ClientHandshake::control(TokenKey::from_token(b"t"), [2; 32]);
        pump(&mut c, &mut s, 64).unwrap();
        s.accept_control(&TokenKey::from_token(b"t"), [7; 16])
            .unwrap();
        s.turn_away(busy);
        assert_eq!(pump(&mut c, &mut s, 5), Err(HandshakeError::Busy(busy)));
    }

    #[test]
    fn a_handshake_relayed_between_tls_connections_is_refused() {
        let key = TokenKey::from_token(b"t");
        let mut s = ServerHandshake::new([1; 32]).bound([3; 32]);
        let mut c = ClientHandshake::control(key.clone(), [2; 32]).bound([4; 32]);
        pump(&mut c, &mut s, 64).unwrap();
        assert_eq!(
            s.accept_control(&key, [7; 16]).err(),
            Some(HandshakeError::AuthRefused)
        );

        let mut s = ServerHandshake::new([1; 32]).bound([3; 32]);
        let mut c = ClientHandshake::control(key.clone(), [2; 32]).bound([3; 32]);
        pump(&mut c, &mut s, 64).unwrap();
        assert!(
            s.accept_control(&key, [7; 16]).is_ok(),
            "the same connection"
        );
    }

    #[test]
    fn a_clear_text_refusal_is_its_own_error() {
        let mut c = ClientHandshake::control(TokenKey::from_token(b"t"), [2; 32]);
        assert_eq!(
            c.handle(&crate::channels::preface::clear_refused()),
            Err(HandshakeError::ClearRefused)
        );
    }

    #[test]
    fn another_version_is_told_from_another_protocol() {
        let mut old = ServerHello {
            nonce: [0; 32],
            binding: NO_BINDING,
        }
        .encode();
        old[3] = b'2';
        let mut c = ClientHandshake::control(TokenKey::from_token(b"t"), [2; 32]);
        assert_eq!(
            c.handle(&old),
            Err(HandshakeError::OtherVersion {
                ours: '4',
                theirs: '2'
            })
        );
        let mut c = ClientHandshake::control(TokenKey::from_token(b"t"), [2; 32]);
        assert_eq!(
            c.handle(&[b'S'; SERVER_HELLO_LEN]),
            Err(HandshakeError::NotHsxfer)
        );
    }

    #[test]
    fn bytes_after_the_handshake_are_left_for_the_next_layer() {
        let mut s = ServerHandshake::new([1; 32]);
        let mut c = ClientHandshake::control(TokenKey::from_token(b"t"), [2; 32]);
        pump(&mut c, &mut s, 64).unwrap();
        let mut hello_and_more = Vec::new();
        s.accept_control(&TokenKey::from_token(b"t"), [7; 16])
            .unwrap();
        s.welcome();
        hello_and_more.extend(s.take_output());
        hello_and_more.extend_from_slice(b"next layer");
        assert_eq!(c.handle(&hello_and_more).unwrap(), WELCOME_LEN);

        let (id, key) = session(b"t");
        let mut s = ServerHandshake::new([1; 32]);
        let mut from_client = ClientHandshake::join(key, id, 0);
        from_client.handle(&s.take_output()).unwrap();
        let mut bytes = from_client.take_output();
        let hello_len = bytes.len();
        bytes.extend_from_slice(b"data");
        assert_eq!(s.handle(&bytes).unwrap(), hello_len);
    }

    #[test]
    fn an_unknown_client_hello_is_refused_after_its_tag() {
        let mut s = ServerHandshake::new([1; 32]);
        assert_eq!(
            s.handle(b"GET / HTTP/1.1"),
            Err(HandshakeError::UnknownHello)
        );
    }
}
