//! The library's error type: each variant says what went wrong and, where the user can act,
//! what to do.

use std::io;
use std::net::IpAddr;

use crate::channels::busy::{Busy, Cap};
use crate::channels::opening::OpeningError;
use crate::channels::{ProtocolError, Violation};
use crate::fsio::dest::DestError;
use crate::fsio::profiles::ProfileError;
use crate::fsio::root::RootError;
use crate::fsio::source::SourceError;
use crate::os_hint;
use crate::transport::cc::NotInForce;
use crate::transport::route;

/// Everything that can end a transfer or a server session. New kinds may be added, so a
/// `match` needs a catch-all arm.
///
/// # Examples
///
/// Telling what the caller can act on from what it can only report:
///
/// ```no_run
/// # async fn demo(client: hsxfer::Client, live: std::sync::Arc<hsxfer::LiveStats>) {
/// use hsxfer::Error;
///
/// match client.push(&["dataset".into()], true, "incoming", &live).await {
///     Ok(report) => println!("{} bytes, verified", report.bytes),
///     Err(Error::AuthRefused(server)) => eprintln!("{server} wants another token"),
///     Err(e) if e.is_transient() => eprintln!("try again later: it resumes ({e})"),
///     Err(e) => eprintln!("{e}"),
/// }
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The host name did not resolve.
    #[error("cannot resolve host '{host}': {source}{}", port_hint(.host))]
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
    /// The peer answered but is not an hsxfer server.
    #[error("{0} is not an hsxfer server")]
    NotHsxfer(String),
    /// The client asked for clear text and the server allows only TLS.
    #[error("server {0} accepts only encrypted connections: drop `Security::Clear`, or let that server allow clear text (`ServerBuilder::allow_clear`)")]
    ClearRefused(String),
    /// The server presented another key than the one this client knows for it.
    #[error("server {server} presents the key {seen}, but {expected}: if its key was replaced on purpose, {fix}; otherwise someone may be intercepting the connection")]
    ServerKeyChanged {
        /// The server.
        server: String,
        /// The key it presented.
        seen: crate::transport::tls::Fingerprint,
        /// Where the expected key comes from, and which it is.
        expected: String,
        /// How to accept the new key.
        fix: String,
    },
    /// The server's key file cannot be used.
    #[error(transparent)]
    Identity(#[from] crate::transport::tls::IdentityError),
    /// The TLS handshake failed.
    #[error(
        "TLS handshake with {peer} failed: {source} (is it an hsxfer server of this version?)"
    )]
    Tls {
        /// The server.
        peer: String,
        /// What failed.
        source: io::Error,
    },
    /// The server does not answer a path measurement: it runs an older hsxfer.
    #[error("the server at {0} runs an older hsxfer that cannot measure the path (it does not answer the probe's request for its facts): upgrade hsxfer there, or transfer with `tune` off")]
    TooOld(String),
    /// The server refused our token.
    #[error("authentication refused by {0}: wrong token (give the server's token with `token_file`, or `no_auth` if the server runs without authentication)")]
    AuthRefused(String),
    /// The server could not prove it holds the token.
    #[error("server {0} failed to prove it holds the token: refusing to talk to it")]
    ServerNotAuthentic(String),
    /// The server refused the request.
    #[error("server refused: {0}")]
    Refused(String),
    /// The server turned the connection away: it is at one of its caps.
    #[error("server {peer} is busy: {busy}; retry later{}", busy_hint(.busy))]
    Busy {
        /// The server.
        peer: String,
        /// Which cap.
        busy: Busy,
    },
    /// The peer aborted the session and said why.
    #[error("peer aborted the transfer: {message}")]
    PeerAborted {
        /// What the peer said.
        message: String,
        /// The peer says that the same command run again later may succeed (it was stopping
        /// or busy, or a step timed out), as [`Error::is_transient`] does of its own errors.
        transient: bool,
    },
    /// The server is stopping ([`crate::session::server::Stopper`]: a signal, or its
    /// embedder); what it says to each session's client.
    #[error("the server is stopping ({0}): run the same command again once it is back, and the copy resumes where it stopped")]
    Stopping(String),
    /// The connection closed in the middle of the session.
    #[error("the peer vanished in the middle of the transfer (connection closed); run the same command again to resume")]
    PeerVanished,
    /// The peer broke the protocol, or speaks another version of it.
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
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
    /// A sending data channel runs another congestion control than the one asked for, even
    /// after it was set again once connected: a route's `congctl lock` forces its own.
    #[error("{}", cc_not_in_force(.host, .peer, .mismatch, .route))]
    CcNotInForce {
        /// The end that sends: "client" or "server".
        host: &'static str,
        /// The channel's peer address.
        peer: IpAddr,
        /// What was asked, what is in force, and the kernel's refusal.
        mismatch: NotInForce,
        /// The route toward the peer as `ip route get` shows it, or why it could not be had.
        route: io::Result<String>,
    },
    /// A saved path profile could not be read or written.
    #[error(transparent)]
    Profile(#[from] ProfileError),
    /// A server could not be started over SSH.
    #[error("{0}")]
    Ssh(String),
    /// A task of hsxfer's own failed or panicked: a bug, not the peer's doing.
    #[error("{what} failed inside hsxfer: {source} (a bug: please report it)")]
    Task {
        /// What the task did.
        what: &'static str,
        /// Why it ended.
        source: tokio::task::JoinError,
    },
    /// A job of hsxfer's own on a file thread panicked: a bug, not the peer's doing.
    #[error("{0} failed inside hsxfer: it panicked (a bug: please report it)")]
    Panicked(&'static str),
    /// A step took too long.
    #[error("timed out {0}")]
    Timeout(&'static str),
    /// An invalid option value.
    #[error("{0}")]
    Usage(String),
    /// Another I/O error, with what was being done.
    #[error("{context}: {source}{}", os_hint::for_io(.source))]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: io::Error,
    },
}

impl From<OpeningError> for Error {
    fn from(e: OpeningError) -> Self {
        match e {
            OpeningError::Refused(message) => Error::Refused(message),
            OpeningError::Transient(message) => Error::PeerAborted {
                message,
                transient: true,
            },
            OpeningError::BadRequest(bad) => Error::Usage(bad.0),
            OpeningError::Violation(v) => v.into(),
        }
    }
}

impl From<Violation> for Error {
    fn from(v: Violation) -> Self {
        Error::Protocol(ProtocolError::Violation(v))
    }
}

impl Error {
    /// Wraps an I/O error with context.
    pub fn io(context: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
        let context = context.into();
        move |source| Error::Io { context, source }
    }

    /// Wraps a failed task's join error, naming what the task did.
    pub fn task(what: &'static str) -> impl FnOnce(tokio::task::JoinError) -> Error {
        move |source| Error::Task { what, source }
    }

    /// Whether the same call made again later may succeed, and then resume where this one
    /// stopped: the server was busy or stopping (or said so in its abort), the connection
    /// dropped, or a step timed out.
    /// A retry loop's test; other errors need someone to change something first.
    ///
    /// # Examples
    ///
    /// ```
    /// use hsxfer::Error;
    ///
    /// assert!(Error::PeerVanished.is_transient());
    /// assert!(!Error::AuthRefused("dtn1:7000".into()).is_transient());
    /// ```
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Busy { .. }
                | Error::Stopping(_)
                | Error::PeerVanished
                | Error::Timeout(_)
                | Error::PeerAborted {
                    transient: true,
                    ..
                }
        )
    }
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the server's operator can change when its session caps turn clients away.
fn busy_hint(b: &Busy) -> &'static str {
    match (b.cap, b.per_address) {
        (Cap::Sessions, true) => {
            " (the server's `ServerLimits::sessions_per_address` raises the limit)"
        }
        (Cap::Sessions, false) => " (the server's `ServerLimits::sessions` raises the limit)",
        (Cap::Channels, true) => {
            " (with fewer channels; the server's `ServerLimits::channels_per_address` raises \
             the limit)"
        }
        (Cap::Channels, false) => {
            " (with fewer channels; the server's `ServerLimits::channels` raises the limit)"
        }
        (Cap::Handshakes | Cap::Other(_), _) => "",
    }
}

/// The message of [`Error::CcNotInForce`]: the route's `congctl lock` when `ip route get`
/// shows one; otherwise what the kernel said, and what the route shows or why it is not known.
fn cc_not_in_force(
    host: &str,
    peer: &IpAddr,
    m: &NotInForce,
    shown: &io::Result<String>,
) -> String {
    let asked = format!("congestion control {} was asked for but", m.asked);
    let congctl = shown.as_ref().ok().and_then(|r| route::congctl(r));
    match (congctl, shown) {
        (Some(c), _) if c.starts_with("congctl lock ") => format!(
            "{asked} the {host}'s route to {peer} forces {} (ip route get {peer} shows \"{c}\"): \
             remove the lock or run without `cc`",
            m.in_force
        ),
        (_, Ok(_)) => format!(
            "{asked} on the {host}'s data channel to {peer} {m}, and ip route get {peer} shows no \
             \"congctl lock\": run without `cc`"
        ),
        (_, Err(e)) => format!(
            "{asked} on the {host}'s data channel to {peer} {m}; a route with \"congctl lock {}\" \
             does this (`ip route get {peer}` failed: {e}): remove the lock or run without `cc`",
            m.in_force
        ),
    }
}

/// What to do when a host that did not resolve looks like `NAME:PORT`: the port is an option
/// of its own.
fn port_hint(host: &str) -> &'static str {
    match host.split_once(':') {
        Some((name, port))
            if !name.is_empty() && !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) =>
        {
            " (give the port with `port`, not after the host)"
        }
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn locked(route: io::Result<String>) -> String {
        Error::CcNotInForce {
            host: "server",
            peer: [10, 0, 0, 2].into(),
            mismatch: NotInForce {
                asked: "reno".into(),
                in_force: "cubic".into(),
                refused: Some(io::Error::from_raw_os_error(libc::EPERM)),
            },
            route,
        }
        .to_string()
    }

    #[test]
    fn running_out_of_descriptors_says_which_limit_to_raise() {
        let err = |code| Error::io("creating d/f")(io::Error::from_raw_os_error(code)).to_string();
        assert_eq!(
            err(libc::EMFILE),
            "creating d/f: Too many open files (os error 24) (the open-files limit of the \
             process that hit it: raise `ulimit -n`)"
        );
        assert!(err(libc::ENFILE).ends_with("raise `fs.file-max`)"));
        assert!(err(libc::EADDRINUSE).ends_with("choose another port)"));
        assert_eq!(
            err(libc::ENOENT),
            "creating d/f: No such file or directory (os error 2)"
        );
    }

    #[test]
    fn a_forced_congestion_control_names_the_route_or_says_why_it_cannot() {
        let shown = "10.0.0.2 dev eth0 src 10.0.0.1 uid 0 cache congctl lock cubic";
        assert_eq!(
            locked(Ok(shown.into())),
            "congestion control reno was asked for but the server's route to 10.0.0.2 forces \
             cubic (ip route get 10.0.0.2 shows \"congctl lock cubic\"): remove the lock or run \
             without `cc`"
        );
        let missing = locked(Err(io::Error::from_raw_os_error(libc::ENOENT)));
        assert!(
            missing.starts_with(
                "congestion control reno was asked for but on the server's data channel to \
                 10.0.0.2 cubic stays in force (setting reno again: Operation not permitted"
            ) && missing.ends_with(
                "; a route with \"congctl lock cubic\" does this (`ip route get 10.0.0.2` failed: \
                 No such file or directory (os error 2)): remove the lock or run without `cc`"
            ),
            "{missing}"
        );
        let unlocked = locked(Ok("10.0.0.2 dev eth0 cache congctl cubic".into()));
        assert!(
            unlocked.ends_with(
                "(setting reno again: Operation not permitted (os error 1)), and ip route get \
                 10.0.0.2 shows no \"congctl lock\": run without `cc`"
            ),
            "{unlocked}"
        );
        assert!(!missing.contains('\n') && !unlocked.contains('\n'));
    }

    #[test]
    fn a_host_that_names_a_port_is_told_where_the_port_goes() {
        let e = |host: &str| {
            Error::Resolve {
                host: host.into(),
                source: std::io::Error::other("Name or service not known"),
            }
            .to_string()
        };
        assert!(e("dtn1:7621").ends_with("(give the port with `port`, not after the host)"));
        assert!(!e("dtn1").contains("give the port"));
        assert!(!e("fe80::1").contains("give the port"));
    }

    #[test]
    fn a_servers_abort_is_transient_when_it_says_so_before_or_after_the_data_moves() {
        assert!(Error::from(OpeningError::Transient("stopping".into())).is_transient());
        assert!(!Error::from(OpeningError::Refused("no such file".into())).is_transient());
        let aborted = |transient| Error::PeerAborted {
            message: "x".into(),
            transient,
        };
        assert!(aborted(true).is_transient() && !aborted(false).is_transient());
    }
}
