//! The control phase between the handshake and the data channels, as two state machines:
//! the client pings (for the path's RTT) and may ask for the server's facts, then sends one
//! request and waits for its acceptance; the server answers pings and facts, checks the
//! request ([`Request::check`]) and accepts it. Times come in as arguments, so the machines
//! read no clock.
//!
//! # Examples
//!
//! ```
//! use std::time::{Duration, Instant};
//! use hsxfer::channels::opening::{Answer, ClientOpening, ServerHeard, ServerOpening};
//!
//! let (mut client, mut server) = (ClientOpening::new(), ServerOpening::new());
//! let t0 = Instant::now();
//! let ping = client.ping(t0);
//! let ServerHeard::Reply(pong) = server.on_message(ping).unwrap() else { panic!() };
//! let Answer::Pong(rtt) = client.on_message(*pong, t0 + Duration::from_millis(30)).unwrap() else {
//!     panic!()
//! };
//! assert_eq!(rtt, Duration::from_millis(30));
//! assert_eq!(client.best_rtt(), Some(rtt));
//! ```

use std::time::{Duration, Instant};

use super::checks::{check_facts, BadRequest};
use super::control::{HostFacts, Message, Request};
use super::Violation;

/// Why the control phase ended before the data channels.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OpeningError {
    /// The peer sent its reason and closed: the server refused the request.
    #[error("{0}")]
    Refused(String),
    /// The peer sent its reason and closed, for a reason that passes (it is stopping, or a
    /// step timed out): the same request later may succeed.
    #[error("{0}")]
    Transient(String),
    /// The server's checks refused the client's request.
    #[error(transparent)]
    BadRequest(#[from] BadRequest),
    /// A message that has no place at this point of the control phase.
    #[error(transparent)]
    Violation(#[from] Violation),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum ClientState {
    Ready,
    Pinging { seq: u32, sent: Instant },
    AskingFacts,
    Requested { channels: u16 },
    Accepted,
}

/// What the client learned from a server message.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The answer to the last ping, and that exchange's round-trip time.
    Pong(Duration),
    /// The server's facts about itself.
    Facts(Box<HostFacts>),
    /// The request is accepted, with this many data channels (joined already, or to join);
    /// the server's notes on its own settings.
    Accepted {
        /// Data channels the session has.
        channels: u16,
        /// What the server chose for its side, in words.
        notes: Vec<String>,
    },
}

/// The client's side of the control phase. One message is outstanding at a time (the
/// control connection is a request/answer exchange until the acceptance).
#[derive(Debug)]
pub struct ClientOpening {
    state: ClientState,
    next_seq: u32,
    best_rtt: Option<Duration>,
}

impl Default for ClientOpening {
    fn default() -> Self {
        Self::new()
    }
}

impl ClientOpening {
    /// A control phase that has sent nothing yet.
    pub fn new() -> Self {
        ClientOpening {
            state: ClientState::Ready,
            next_seq: 0,
            best_rtt: None,
        }
    }

    fn expect_ready(&self, what: &str) {
        assert_eq!(
            self.state,
            ClientState::Ready,
            "{what} while an answer is outstanding or after the request"
        );
    }

    /// The next ping, sent at `now`.
    pub fn ping(&mut self, now: Instant) -> Message {
        self.expect_ready("a ping");
        let seq = self.next_seq;
        self.next_seq += 1;
        self.state = ClientState::Pinging { seq, sent: now };
        Message::Ping { seq }
    }

    /// The question for the server's facts.
    pub fn ask_facts(&mut self) -> Message {
        self.expect_ready("a facts question");
        self.state = ClientState::AskingFacts;
        Message::Facts
    }

    /// The request; the phase then waits for its acceptance.
    pub fn request(&mut self, req: Request) -> Message {
        self.expect_ready("the request");
        self.state = ClientState::Requested {
            channels: req.channels,
        };
        Message::Request(req)
    }

    /// The fastest ping exchange so far.
    pub fn best_rtt(&self) -> Option<Duration> {
        self.best_rtt
    }

    /// True once the server accepted the request.
    pub fn accepted(&self) -> bool {
        self.state == ClientState::Accepted
    }

    /// Takes the server's answer, received at `now`.
    pub fn on_message(&mut self, m: Message, now: Instant) -> Result<Answer, OpeningError> {
        let answer = match (self.state, m) {
            (_, Message::Abort { message, transient }) => {
                return Err(match transient {
                    true => OpeningError::Transient(message),
                    false => OpeningError::Refused(message),
                })
            }
            (ClientState::Pinging { seq, sent }, Message::Pong { seq: s }) if s == seq => {
                let rtt = now.saturating_duration_since(sent);
                self.best_rtt = Some(self.best_rtt.map_or(rtt, |b| b.min(rtt)));
                Answer::Pong(rtt)
            }
            (ClientState::AskingFacts, Message::HostFacts(f)) => {
                check_facts(&f)?;
                Answer::Facts(Box::new(f))
            }
            (ClientState::Requested { channels }, Message::Accepted { channels: n, notes }) => {
                if n != channels {
                    return Err(Violation(format!(
                        "the server accepted {n} data channels where {channels} were asked for"
                    ))
                    .into());
                }
                self.state = ClientState::Accepted;
                return Ok(Answer::Accepted { channels, notes });
            }
            (state, m) => {
                return Err(Violation(format!(
                    "{} where {} was due",
                    m.kind(),
                    match state {
                        ClientState::Pinging { .. } => "the answer to a ping",
                        ClientState::AskingFacts => "the server's facts",
                        ClientState::Requested { .. } => "the request's acceptance",
                        ClientState::Ready | ClientState::Accepted => "nothing",
                    }
                ))
                .into())
            }
        };
        self.state = ClientState::Ready;
        Ok(answer)
    }
}

/// What the server must do with a client message of the control phase.
#[derive(Debug, Clone, PartialEq)]
pub enum ServerHeard {
    /// Send this answer (a pong).
    Reply(Box<Message>),
    /// Answer with this host's facts ([`Message::HostFacts`]).
    Facts,
    /// The client's request, checked against the limits: prepare it, then answer with
    /// [`ServerOpening::accept`] or abort with the reason.
    Request(Box<Request>),
}

/// The server's side of the control phase.
#[derive(Debug, Default)]
pub struct ServerOpening {
    requested: bool,
}

impl ServerOpening {
    /// A control phase that has heard nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes a client message; anything but a ping or a facts question before the request,
    /// or anything at all after it, breaks the protocol.
    pub fn on_message(&mut self, m: Message) -> Result<ServerHeard, OpeningError> {
        if self.requested {
            return Err(Violation(format!("{} after the request", m.kind())).into());
        }
        match m {
            Message::Ping { seq } => Ok(ServerHeard::Reply(Box::new(Message::Pong { seq }))),
            Message::Facts => Ok(ServerHeard::Facts),
            Message::Request(req) => {
                self.requested = true;
                req.check()?;
                Ok(ServerHeard::Request(Box::new(req)))
            }
            other => Err(Violation(format!("{} where a request was due", other.kind())).into()),
        }
    }

    /// The acceptance of the request: the client opens `channels` data channels.
    pub fn accept(&self, channels: u16, notes: Vec<String>) -> Message {
        assert!(self.requested, "accepting before a request");
        Message::Accepted { channels, notes }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channels::control::{Operation, Tuning, PROTOCOL_VERSION};

    fn request(channels: u16) -> Request {
        Request {
            version: PROTOCOL_VERSION,
            op: Operation::Pull {
                sources: vec!["d".into()],
                recursive: true,
                unplanned_files: 0,
            },
            channels,
            block_size: 4 << 20,
            tuning: Tuning::kernel_defaults(channels),
        }
    }

    #[test]
    fn pings_facts_request_accepted() {
        let (mut c, mut s) = (ClientOpening::new(), ServerOpening::new());
        let t = Instant::now();
        for ms in [40, 30, 35] {
            let ServerHeard::Reply(pong) = s.on_message(c.ping(t)).unwrap() else {
                panic!()
            };
            c.on_message(*pong, t + Duration::from_millis(ms)).unwrap();
        }
        assert_eq!(c.best_rtt(), Some(Duration::from_millis(30)));
        assert_eq!(s.on_message(c.ask_facts()).unwrap(), ServerHeard::Facts);
        let facts = Message::HostFacts(HostFacts::default());
        assert!(matches!(c.on_message(facts, t), Ok(Answer::Facts(_))));
        let heard = s.on_message(c.request(request(4))).unwrap();
        assert!(matches!(heard, ServerHeard::Request(r) if r.channels == 4));
        let accepted = c.on_message(s.accept(4, vec!["n".into()]), t).unwrap();
        assert_eq!(
            accepted,
            Answer::Accepted {
                channels: 4,
                notes: vec!["n".into()]
            }
        );
        assert!(c.accepted());
    }

    #[test]
    fn out_of_turn_messages_break_the_protocol() {
        let t = Instant::now();
        // A pong for another ping, an acceptance before any request.
        let mut c = ClientOpening::new();
        c.ping(t);
        assert!(matches!(
            c.on_message(Message::Pong { seq: 9 }, t),
            Err(OpeningError::Violation(_))
        ));
        let mut c = ClientOpening::new();
        c.ping(t);
        let early = Message::Accepted {
            channels: 1,
            notes: vec![],
        };
        assert!(matches!(
            c.on_message(early, t),
            Err(OpeningError::Violation(_))
        ));
        // An acceptance of another channel count.
        let mut c = ClientOpening::new();
        c.request(request(4));
        let other = Message::Accepted {
            channels: 2,
            notes: vec![],
        };
        assert!(matches!(
            c.on_message(other, t),
            Err(OpeningError::Violation(_))
        ));
        // The server: a second request, or data before the request.
        let mut s = ServerOpening::new();
        s.on_message(Message::Request(request(1))).unwrap();
        assert!(s.on_message(Message::Request(request(1))).is_err());
        let mut s = ServerOpening::new();
        assert!(s.on_message(Message::FileDone { file: 0 }).is_err());
    }

    #[test]
    fn an_abort_is_the_servers_refusal_and_a_bad_request_is_checked() {
        let mut c = ClientOpening::new();
        c.request(request(4));
        let abort = Message::Abort {
            message: "no such file".into(),
            transient: false,
        };
        assert_eq!(
            c.on_message(abort, Instant::now()),
            Err(OpeningError::Refused("no such file".into()))
        );
        // One that passes (a server stopping) says so.
        let mut c = ClientOpening::new();
        c.request(request(4));
        let abort = Message::Abort {
            message: "stopping".into(),
            transient: true,
        };
        let e = c.on_message(abort, Instant::now()).unwrap_err();
        assert_eq!(e, OpeningError::Transient("stopping".into()));
        let mut s = ServerOpening::new();
        let mut bad = request(4);
        bad.channels = 0;
        assert!(matches!(
            s.on_message(Message::Request(bad)),
            Err(OpeningError::BadRequest(_))
        ));
    }
}
