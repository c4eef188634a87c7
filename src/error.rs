//! The library's error type: each variant says what went wrong and, where the user can act,
//! what to do.

use std::io;

use crate::channels::Violation;
use crate::fsio::dest::DestError;
use crate::fsio::root::RootError;
use crate::fsio::source::SourceError;

/// Everything that can end a transfer or a server session.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The host name did not resolve.
    #[error("cannot resolve host '{host}': {source}")]
    Resolve {
        /// The name.
        host: String,
        /// Resolver error.
        source: io::Error,
    },
    /// TCP connect failed (refused, unreachable, timed out).
    #[error("cannot connect to {addr}: {source} (is `hsxfer serve` running there, on that port?)")]
    Connect {
        /// The address tried.
        addr: String,
        /// Socket error.
        source: io::Error,
    },
    /// The peer answered but is not an hsxfer server of this protocol version.
    #[error("{0} is not an hsxfer server (or speaks another protocol version)")]
    NotHsxfer(String),
    /// The server refused our token.
    #[error("authentication refused by {0}: wrong token (give the server's token with --token-file, or --no-auth if the server runs with --no-auth)")]
    AuthRefused(String),
    /// The server could not prove it holds the token.
    #[error("server {0} failed to prove it holds the token: refusing to talk to it")]
    ServerNotAuthentic(String),
    /// The server refused the request.
    #[error("server refused: {0}")]
    Refused(String),
    /// The peer aborted the session and said why.
    #[error("peer aborted the transfer: {0}")]
    PeerAborted(String),
    /// The connection closed in the middle of the session.
    #[error("the peer vanished in the middle of the transfer (connection closed); run the same command again to resume")]
    PeerVanished,
    /// The peer broke the protocol.
    #[error(transparent)]
    Protocol(#[from] Violation),
    /// A frame or control message could not be decoded.
    #[error("malformed data from peer: {0}")]
    Malformed(String),
    /// A source could not be listed or read.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// A destination could not be used.
    #[error(transparent)]
    Dest(#[from] DestError),
    /// A path was refused by the server's confinement.
    #[error(transparent)]
    Root(#[from] RootError),
    /// A step took too long.
    #[error("timed out {0}")]
    Timeout(&'static str),
    /// An invalid option value.
    #[error("{0}")]
    Usage(String),
    /// Another I/O error, with what was being done.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: io::Error,
    },
}

impl Error {
    /// Wraps an I/O error with context.
    pub fn io(context: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
        let context = context.into();
        move |source| Error::Io { context, source }
    }
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
