//! The I/O layer of a session: it drives the sans-IO [`crate::channels`] state machines over
//! tokio sockets and files. [`client`] and [`server`] open sessions; [`sender`] and
//! [`receiver`] run the data plane of either role, so push, pull and bench share one code path.

pub mod admission;
pub mod block_memory;
mod boxed;
pub mod budget;
pub mod builder;
pub mod client;
pub mod engine;
pub mod events;
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
mod faults;
pub mod fswork;
pub mod growth;
pub mod handshake;
pub mod idle;
mod jobs;
pub mod mptcp_paths;
pub mod probe;
pub mod receiver;
pub mod report;
pub mod sampler;
pub mod secure;
pub mod sender;
pub mod server;
pub mod settle;
pub mod source;
pub mod ssh;
pub mod stream_order;
mod subflow_rows;
pub mod telemetry;
pub mod token;
pub mod tuning;
pub mod wire;

#[cfg(feature = "testing")]
pub use faults::FaultInjection;

use crate::channels::auth::TokenKey;

/// How sessions are authenticated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Auth {
    /// A shared secret (the contents of a token file).
    Token(Vec<u8>),
    /// No secret: allowed only on loopback. Channels still prove their session.
    NoAuth,
}

impl Auth {
    /// Reads a token file (see [`token::read`] for what it refuses).
    pub fn from_token_file(path: &std::path::Path) -> crate::Result<Self> {
        token::read(path).map(Auth::Token)
    }

    /// The token in `path`, or no authentication (loopback only) without one.
    pub fn from_optional_token_file(path: Option<&std::path::Path>) -> crate::Result<Self> {
        path.map_or(Ok(Auth::NoAuth), Auth::from_token_file)
    }

    pub(crate) fn key(&self) -> TokenKey {
        match self {
            Auth::Token(t) => TokenKey::from_token(t),
            Auth::NoAuth => TokenKey::from_token(b""),
        }
    }
}

/// Default TCP port of `hsxfer serve`.
pub const DEFAULT_PORT: u16 = 7420;
