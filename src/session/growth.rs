//! Data channels that join a session while it runs: the sending side's online tuner asks for
//! more, the client connects them, the server admits them, and the engines put them to work
//! next to the others (they take blocks from the same queue, so nothing else changes).
//!
//! The exchange on the control connection (`channels::control`):
//! - a sending client asks with `AddChannels { count }`; the server reserves that many join
//!   slots and answers `OpenChannels { first, count }`;
//! - a sending server reserves the slots itself and sends `OpenChannels`;
//! - the client then connects channels `first..first + count` and joins them to the session
//!   as it joined the first ones.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::handshake::{self, Opener};
use super::tuning::LocalPlan;
use crate::channels::auth::{SessionId, SessionKey};
use crate::channels::control::Message;
use crate::channels::growth::ChannelsToOpen;
use crate::channels::Violation;
use crate::error::{Error, Result};
use crate::transport::tls::Stream;
use crate::transport::{self, SocketOptions};

/// A data channel that joined: its index and its stream.
pub type Joined = (u16, Stream);

/// Reserves join slots on the server for `count` more channels; returns the first index, or
/// `None` when the session may not have more.
pub type Reserve = Arc<dyn Fn(u16) -> Option<u16> + Send + Sync>;

/// Prepares a channel that joined during the session before it carries data: its socket
/// options and telemetry.
pub type Setup = Box<dyn Fn(usize, &Stream) -> Result<()> + Send + Sync>;

/// How this end gets more channels.
pub enum Joiner {
    /// The client: it connects and joins the channels the server says to open, in turn and
    /// up to the most its request allows.
    Connect(Connector, Mutex<ChannelsToOpen>),
    /// The server: it admits the client's joins into reserved slots.
    Admit(Reserve),
}

/// How a client dials its session's data channels: connect with each channel's socket
/// options, then open TLS (or clear text). It needs nothing of the session, so the dialing
/// overlaps the control connection's own handshake.
#[derive(Clone)]
pub struct Dialer {
    /// The server's address.
    pub addr: SocketAddr,
    /// The server, as messages name it.
    pub peer: String,
    /// This end's plan: the options of each channel's socket.
    pub plan: Arc<LocalPlan>,
    /// How each channel's connection opens (TLS with the control connection's key, or
    /// clear text).
    pub opener: Opener,
}

impl Dialer {
    /// Connects channel `index` with its socket options and opens it (TLS or clear text),
    /// ready for [`Connector::join_opened`]. The socket sends at once (`TCP_NODELAY`) until
    /// it joined: TLS's compatibility record and then the Finished and the join are small
    /// writes, and Nagle would hold the second until the first is acknowledged, a round trip
    /// plus the server's delayed ACK (100 ms on a 60 ms path).
    pub async fn open(&self, index: u16) -> Result<Stream> {
        let tcp = connect_channel(self.addr, &self.plan, index).await?;
        open_channel(&self.opener, tcp, &self.peer).await
    }
}

/// Opens a data channel's connection (TLS or clear text) the way `opener` says, naming a
/// key or security mismatch as a data channel's.
pub(crate) async fn open_channel(opener: &Opener, tcp: TcpStream, peer: &str) -> Result<Stream> {
    opener
        .open(tcp, peer)
        .await
        .map_err(super::secure::data_channel_error)
}

/// Connects data channel `index` to `addr` with the plan's socket options, sending at once
/// (`TCP_NODELAY`) until it has joined ([`Dialer::open`] says why).
pub(crate) async fn connect_channel(
    addr: SocketAddr,
    plan: &LocalPlan,
    index: u16,
) -> Result<TcpStream> {
    let mut opts = plan.for_channel(index as usize);
    opts.nodelay = true;
    timed_connect(addr, &opts).await
}

/// What a client needs to connect more channels to its session.
#[derive(Clone)]
pub struct Connector {
    /// How the channels are dialed.
    pub dialer: Dialer,
    /// The session the channels join.
    pub session: SessionId,
    /// Its key.
    pub key: SessionKey,
}

impl Connector {
    /// Joins channel `index`, opened by [`Dialer::open`], to the session, and gives its
    /// socket back the plan's `TCP_NODELAY`.
    pub async fn join_opened(&self, s: &mut Stream, index: u16) -> Result<()> {
        handshake::client_join(s, &self.key, self.session, index, &self.dialer.peer).await?;
        let nodelay = self.dialer.plan.for_channel(index as usize).nodelay;
        s.tcp()
            .set_nodelay(nodelay)
            .map_err(Error::io("setting TCP_NODELAY on a data channel"))
    }

    /// Connects channel `index` and joins it to the session.
    pub async fn join(&self, index: u16) -> Result<Stream> {
        let mut s = self.dialer.open(index).await?;
        self.join_opened(&mut s, index).await?;
        Ok(s)
    }
}

/// Everything an engine needs to take channels that join while it runs.
pub struct Growth {
    /// How this end gets them.
    pub joiner: Joiner,
    /// Where a connector delivers them (the sending end of [`Arrivals::joined`]).
    pub deliver: mpsc::UnboundedSender<Joined>,
    /// Prepares each before it carries data.
    pub setup: Setup,
    /// What arrives; the engine takes it for its event loop.
    pub arrivals: Option<Arrivals>,
}

/// What an engine waits for besides its own events: channels that joined, and how many more
/// the online tuner wants.
#[derive(Default)]
pub struct Arrivals {
    /// Channels that joined.
    pub joined: Option<mpsc::UnboundedReceiver<Joined>>,
    /// Counts the online tuner asks for (sending side).
    pub requests: Option<mpsc::UnboundedReceiver<u16>>,
}

impl Arrivals {
    /// Takes the arrivals out of an engine's growth (none without growth).
    pub fn take(g: &mut Option<Growth>) -> Arrivals {
        g.as_mut()
            .and_then(|g| g.arrivals.take())
            .unwrap_or_default()
    }
}

/// The next message of an optional receiver; pending forever without one (for `select!`).
pub async fn recv_or_pending<T>(r: &mut Option<mpsc::UnboundedReceiver<T>>) -> Option<T> {
    match r.as_mut() {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

impl Growth {
    /// The client connects channels `first..first + count`, the server's `OpenChannels`, in
    /// the background; each arrives with the others once admitted. A channel that cannot
    /// join is logged and left out: the session goes on with the others. Channels out of
    /// turn or past the most the session may have break the protocol.
    pub fn connect(&self, first: u16, count: u16) -> Result<()> {
        let Joiner::Connect(c, to_open) = &self.joiner else {
            return Err(Violation("OpenChannels sent to the server".into()).into());
        };
        let indices = to_open
            .lock()
            .expect("channels to open")
            .on_open(first, count)?;
        tracing::debug!("connecting data channels {indices:?}");
        for index in indices {
            let (c, tx) = (c.clone(), self.deliver.clone());
            tokio::spawn(async move {
                match c.join(index).await {
                    Ok(s) => {
                        tracing::debug!("data channel {index} joined");
                        let _ = tx.send((index, s));
                    }
                    Err(e) => tracing::debug!("data channel {index} did not join: {e}"),
                }
            });
        }
        Ok(())
    }
}

/// What a sending end says to get `count` more channels: a client asks the server
/// (`AddChannels`); a server reserves the slots and tells the client to connect
/// (`OpenChannels`). `None` when it may not have more.
pub fn ask_for_channels(g: Option<&Growth>, count: u16) -> Option<Message> {
    match &g?.joiner {
        Joiner::Connect(..) => Some(Message::AddChannels { count }),
        Joiner::Admit(reserve) => {
            reserve(count).map(|first| Message::OpenChannels { first, count })
        }
    }
}

/// A receiving server's answer to `AddChannels`: the slots it reserved, or `None`.
pub fn admit_channels(g: Option<&Growth>, count: u16) -> Option<Message> {
    match &g?.joiner {
        Joiner::Admit(reserve) => {
            reserve(count).map(|first| Message::OpenChannels { first, count })
        }
        Joiner::Connect(..) => None,
    }
}

/// How long a TCP connect may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects with [`CONNECT_TIMEOUT`], naming the address in the error.
pub(crate) async fn timed_connect(addr: SocketAddr, opts: &SocketOptions) -> Result<TcpStream> {
    let err = |source| Error::Connect {
        addr: addr.to_string(),
        source,
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, transport::connect(addr, opts)).await {
        Ok(r) => r.map_err(err),
        Err(_) => Err(err(std::io::ErrorKind::TimedOut.into())),
    }
}
